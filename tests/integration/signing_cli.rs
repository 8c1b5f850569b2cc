//! Signing from the command line, against real `oncegate serve` processes: `oncegate keys
//! generate` and `keys export`, the signing flags of `serve` (`--signing-key`,
//! `--retired-signing-keys`, `--signing-issuer`, `--unsigned`) as the JWKS endpoint and the
//! statements show them, `oncegate verify` accepting a live grant and refusing it for changed
//! params, another audience or a key it was not given, a rotation that keeps the old key's
//! statements valid, `oncegate admin audit` over a chain that spans it, and a signing thread the
//! system refuses to start.

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Output,
};

use base64::Engine;
use oncegate_proto as pb;
use serde_json::Value;
use tempfile::TempDir;

use crate::support::{
    LoggedGate, OPS_KEY, WORKER_KEY, complete_as, connect, grant_as, http_get, oncegate_command,
    principals_toml, serve_on_redis_without_threads, token_request, ttl_ms, write_file,
};

const POLICY: &str = r#"
[actions."payments.transfer"]
key_fields = ["/amount", "/to"]
audience = "fake-bank"
"#;
const FIELDS: &str = "/amount,/to";
const AGENT: &str = "billing-1";
const PARAMS: &str = r#"{"amount":100,"to":"DE89","memo":"invoice 1"}"#;

/// `oncegate <args>`, without any signing setting from the environment.
fn oncegate(args: &[&str]) -> Output {
    oncegate_command()
        .args(args)
        .env_remove("ONCEGATE_SIGNING_KEY")
        .env_remove("ONCEGATE_RETIRED_SIGNING_KEYS")
        .env_remove("ONCEGATE_DATA_DIR")
        .env_remove("ONCEGATE_API_KEY")
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn path_str(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// `oncegate keys generate --out <dir>/<name>`: the key file and the kid printed.
fn generate_key(dir: &Path, name: &str) -> (PathBuf, String) {
    let path = dir.join(name);
    let out = oncegate(&["keys", "generate", "--out", path_str(&path)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let kid = text(&out.stdout).trim().to_owned();
    assert!(!kid.is_empty());
    (path, kid)
}

/// `oncegate keys export <args>`, which must succeed: the JWKS document.
fn export(args: &[&str]) -> Value {
    let mut all = vec!["keys", "export"];
    all.extend(args);
    let out = oncegate(&all);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The key ids of a JWKS document.
fn kids(jwks: &Value) -> BTreeSet<String> {
    jwks["keys"]
        .as_array()
        .unwrap_or_else(|| panic!("not a JWKS: {jwks}"))
        .iter()
        .map(|k| k["kid"].as_str().unwrap().to_owned())
        .collect()
}

/// The `kid` of a statement's JOSE header, and its claims, read without verifying.
fn header_kid_and_claims(statement: &str) -> (String, Value) {
    let mut parts = statement.split('.');
    let mut decode = || -> Value {
        let part = parts.next().unwrap();
        serde_json::from_slice(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(part)
                .unwrap(),
        )
        .unwrap()
    };
    let header = decode();
    let claims = decode();
    (header["kid"].as_str().unwrap().to_owned(), claims)
}

/// The metrics listener's address, from the start-up log of a gate given `--metrics-listen`.
fn metrics_addr(gate: &LoggedGate) -> SocketAddr {
    let log = gate.wait_for_log("metrics at http://", 1);
    let (_, rest) = log.split_once("metrics at http://").unwrap();
    rest.split('/').next().unwrap().parse().unwrap()
}

/// `GET /.well-known/jwks.json` on the metrics listener: the status and the body.
async fn served_jwks(gate: &LoggedGate) -> (u16, String) {
    http_get(metrics_addr(gate), "/.well-known/jwks.json").await
}

/// A gate on the embedded store in `dir/data`, with the policy and principals (the audit is an
/// operator's RPC), metrics on a free port and the signing `flags`.
fn start_gate(dir: &TempDir, flags: &[&str]) -> LoggedGate {
    let config = write_file(
        dir.path(),
        "policy.toml",
        &format!("{POLICY}\n{}", principals_toml("")),
    );
    let mut args = vec![
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
        "--config",
        path_str(&config),
    ];
    args.extend(flags);
    LoggedGate::start(dir, &args)
}

/// A transfer granted by the gate at `addr` (a lease of ten minutes, so that its statement
/// outlives the test): the action and the grant.
async fn transfer(addr: &str, key: &str) -> (pb::ActionRef, pb::Grant) {
    let mut req = token_request(AGENT, "run-1", "payments.transfer", PARAMS);
    req.idempotency_key = key.into();
    req.lease_ttl = ttl_ms(600_000);
    grant_as(&mut connect(addr).await, req, Some(WORKER_KEY)).await
}

/// The worker's Complete of `action`, which must succeed: the completion.
async fn complete(
    addr: &str,
    action: &pb::ActionRef,
    token: &str,
    receipt: &[u8],
) -> pb::Completion {
    let mut client = connect(addr).await;
    complete_as(&mut client, action, token, receipt, Some(WORKER_KEY))
        .await
        .unwrap()
}

/// `oncegate verify` with the keys in `jwks`: exit code, stdout, stderr.
fn verify(jwks: &Path, statement: &str, params: &str, audience: &str) -> (i32, String, String) {
    let out = oncegate(&[
        "verify",
        "--keys",
        path_str(jwks),
        "--statement",
        statement,
        "--params",
        params,
        "--key-fields",
        FIELDS,
        "--audience",
        audience,
    ]);
    (
        out.status.code().unwrap(),
        text(&out.stdout),
        text(&out.stderr),
    )
}

/// `oncegate admin audit --agent billing-1 --json <extra>` against `addr`, as the operator: exit
/// code and verdict.
fn audit(addr: &str, extra: &[&str]) -> (i32, Value) {
    let server = format!("http://{addr}");
    let mut args = vec![
        "admin",
        "--server",
        &server,
        "--api-key",
        OPS_KEY,
        "audit",
        "--agent",
        AGENT,
        "--json",
    ];
    args.extend(extra);
    let out = oncegate(&args);
    let verdict = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", text(&out.stdout), text(&out.stderr)));
    (out.status.code().unwrap(), verdict)
}

#[test]
fn keys_generate_writes_a_private_key_file_once_and_export_publishes_its_kid() {
    let dir = TempDir::new().unwrap();
    let (a, kid_a) = generate_key(dir.path(), "keys/a.pem");
    let pem = std::fs::read_to_string(&a).unwrap();
    assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----"), "{pem}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&a).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "a private key is its owner's only");
    }

    // An existing file is never overwritten.
    let out = oncegate(&["keys", "generate", "--out", path_str(&a)]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains(&format!("cannot create {}", a.display())),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&a).unwrap(), pem);

    // The JWKS names the key by the kid `generate` printed, and carries the public key only.
    let jwks = export(&["--signing-key", path_str(&a)]);
    assert_eq!(kids(&jwks), BTreeSet::from([kid_a.clone()]));
    let key = &jwks["keys"][0];
    assert_eq!(
        (key["kty"].as_str(), key["crv"].as_str()),
        (Some("OKP"), Some("Ed25519"))
    );
    assert!(key.get("d").is_none(), "no private part in a JWKS: {key}");

    // A second key, retired: both published.
    let (b, kid_b) = generate_key(dir.path(), "keys/b.pem");
    assert_ne!(kid_a, kid_b);
    let jwks = export(&[
        "--signing-key",
        path_str(&a),
        "--retired-signing-keys",
        path_str(&b),
    ]);
    assert_eq!(kids(&jwks), BTreeSet::from([kid_a, kid_b]));

    // A key file that is not a key: a usage error naming the file.
    let bad = write_file(dir.path(), "bad.pem", "not a key\n");
    let out = oncegate(&["keys", "export", "--signing-key", path_str(&bad)]);
    assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("bad.pem"),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_with_a_retired_key_publishes_both_signs_with_the_current_and_verify_checks_its_grants()
 {
    let dir = TempDir::new().unwrap();
    let (a, kid_a) = generate_key(dir.path(), "a.pem");
    let (b, kid_b) = generate_key(dir.path(), "b.pem");
    let gate = start_gate(
        &dir,
        &[
            "--signing-key",
            path_str(&a),
            "--retired-signing-keys",
            path_str(&b),
            "--signing-issuer",
            "gate.example.test",
        ],
    );

    // The metrics listener publishes both keys, the same document `keys export` prints.
    let (status, body) = served_jwks(&gate).await;
    assert_eq!(status, 200, "{body}");
    let served: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        kids(&served),
        BTreeSet::from([kid_a.clone(), kid_b.clone()])
    );
    assert_eq!(
        served,
        export(&[
            "--signing-key",
            path_str(&a),
            "--retired-signing-keys",
            path_str(&b),
        ])
    );
    let jwks = write_file(dir.path(), "jwks.json", &body);

    // The grant's statement is signed with the current key and names the configured issuer.
    let (_, granted) = transfer(&gate.addr, "inv-1").await;
    let (kid, claims) = header_kid_and_claims(&granted.statement);
    assert_eq!(kid, kid_a, "signed with --signing-key, not the retired key");
    assert_eq!(claims["iss"], "gate.example.test");
    assert_eq!(claims["aud"], "fake-bank");

    // `oncegate verify` accepts it for the granted params (a non-key field may differ, and the
    // key fields may be written differently) and prints the claims, fencing among them.
    for params in [PARAMS, r#"{"to":"DE89","amount":100.0,"memo":"rewritten"}"#] {
        let (code, stdout, stderr) = verify(&jwks, &granted.statement, params, "fake-bank");
        assert_eq!(code, 0, "{stderr}");
        let verified: Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(verified["fencing"], granted.fencing);
        assert_eq!(verified["provider_key"], granted.provider_key.as_str());
        assert_eq!(verified["iss"], "gate.example.test");
    }

    // A worker in a shell takes the statement from `oncegate call request-token --json` and its
    // executor checks it with `oncegate verify`.
    let server = format!("http://{}", gate.addr);
    let out = oncegate(&[
        "call",
        "request-token",
        "--json",
        "--server",
        &server,
        "--api-key",
        WORKER_KEY,
        "--agent",
        AGENT,
        "--run",
        "run-1",
        "--action",
        "payments.transfer",
        "--params",
        PARAMS,
        "--idempotency-key",
        "inv-shell",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    let statement = answer["grant"]["statement"].as_str().unwrap();
    let (code, stdout, stderr) = verify(&jwks, statement, PARAMS, "fake-bank");
    assert_eq!(code, 0, "{stderr}");
    let verified: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(verified["fencing"], answer["grant"]["fencing"]);

    // Refused, exit 1, with the reason: changed params, another audience, a key set without the
    // key that signed, a tampered statement.
    let (code, stdout, stderr) = verify(
        &jwks,
        &granted.statement,
        r#"{"amount":900,"to":"DE89"}"#,
        "fake-bank",
    );
    assert_eq!((code, stdout.as_str()), (1, ""));
    assert!(
        stderr.starts_with("refused: fingerprint_mismatch: params do not match"),
        "{stderr}"
    );
    let (code, _, stderr) = verify(&jwks, &granted.statement, PARAMS, "other-bank");
    assert_eq!(code, 1);
    assert!(
        stderr.starts_with(r#"refused: wrong_audience: audience is "fake-bank", not "other-bank""#),
        "{stderr}"
    );
    let only_b = serde_json::to_string(&export(&["--signing-key", path_str(&b)])).unwrap();
    let only_b = write_file(dir.path(), "only-b.json", &only_b);
    let (code, _, stderr) = verify(&only_b, &granted.statement, PARAMS, "fake-bank");
    assert_eq!(code, 1);
    assert!(
        stderr.starts_with(&format!("refused: unknown_key: unknown key id {kid_a:?}")),
        "{stderr}"
    );
    let mut tampered = granted.statement.clone();
    tampered.insert(tampered.len() / 2, 'A');
    let (code, _, stderr) = verify(&jwks, &tampered, PARAMS, "fake-bank");
    assert_eq!(code, 1);
    assert!(stderr.starts_with("refused: "), "{stderr}");
    // Keys that cannot be read are a usage error, not a refusal.
    let missing = dir.path().join("missing.json");
    let (code, _, stderr) = verify(&missing, &granted.statement, PARAMS, "fake-bank");
    assert_eq!(code, 64);
    assert!(stderr.contains("missing.json"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_rotation_the_old_keys_statements_still_verify_and_the_audit_spans_both_keys() {
    let dir = TempDir::new().unwrap();
    let (a, kid_a) = generate_key(dir.path(), "a.pem");
    let (b, kid_b) = generate_key(dir.path(), "b.pem");

    // Before: B signs. One transfer completed, one granted and still open.
    let gate = start_gate(&dir, &["--signing-key", path_str(&b)]);
    let (status, body) = served_jwks(&gate).await;
    assert_eq!(status, 200, "{body}");
    let served: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(kids(&served), BTreeSet::from([kid_b.clone()]));
    let (done, granted) = transfer(&gate.addr, "inv-1").await;
    let first = complete(&gate.addr, &done, &granted.token, b"tx_1").await;
    // The reply carries no receipt statement: the chain's head (this entry) is signed in the
    // store, with B (the audit below with only A's key names it).
    assert_eq!(first.statement, "");
    let (_, open) = transfer(&gate.addr, "inv-2").await;
    assert_eq!(header_kid_and_claims(&open.statement).0, kid_b);
    drop(gate);

    // After: the same store, A current and B retired.
    let gate = start_gate(
        &dir,
        &[
            "--signing-key",
            path_str(&a),
            "--retired-signing-keys",
            path_str(&b),
        ],
    );
    let (status, body) = served_jwks(&gate).await;
    assert_eq!(status, 200, "{body}");
    let jwks = write_file(dir.path(), "jwks.json", &body);
    assert_eq!(
        kids(&serde_json::from_str(&body).unwrap()),
        BTreeSet::from([kid_a.clone(), kid_b.clone()])
    );
    // The grant B signed before the restart still verifies with what the gate publishes now.
    let (code, stdout, stderr) = verify(&jwks, &open.statement, PARAMS, "fake-bank");
    assert_eq!(code, 0, "{stderr}");
    let verified: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(verified["fencing"], open.fencing);
    // Once B is removed from the keys, it is refused.
    let only_a = serde_json::to_string(&export(&["--signing-key", path_str(&a)])).unwrap();
    let only_a = write_file(dir.path(), "only-a.json", &only_a);
    let (code, _, stderr) = verify(&only_a, &open.statement, PARAMS, "fake-bank");
    assert_eq!(code, 1);
    assert!(stderr.starts_with("refused: unknown_key"), "{stderr}");

    // A completion after the rotation is signed with A and chains to the one B signed.
    let (done, granted) = transfer(&gate.addr, "inv-3").await;
    assert_eq!(header_kid_and_claims(&granted.statement).0, kid_a);
    let second = complete(&gate.addr, &done, &granted.token, b"tx_3").await;
    assert_eq!(second.statement, "");
    assert_eq!(second.seq, first.seq + 1);

    // The audit, with the keys the gate serves: both entries verified, the chain intact.
    let (code, verdict) = audit(&gate.addr, &[]);
    assert_eq!(code, 0, "{verdict:#}");
    assert_eq!(verdict["intact"], true, "{verdict:#}");
    assert_eq!(verdict["entries"], 2);
    assert_eq!(verdict["verified"], 2);
    assert_eq!(
        verdict["unsigned_yet"],
        serde_json::json!([]),
        "every entry is covered by a signed head"
    );
    assert_eq!(verdict["head"]["seq"], second.seq);
    assert_eq!(verdict["keys"], "served by the gate");
    // The same as text, for a person.
    let server = format!("http://{}", gate.addr);
    let out = oncegate(&[
        "admin",
        "--server",
        &server,
        "--api-key",
        OPS_KEY,
        "audit",
        "--agent",
        AGENT,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report = text(&out.stdout);
    assert!(
        report.starts_with(
            "agent billing-1: 2 entries, 2 verified, 0 unsigned yet; keys served by the gate\n"
        ) && report.ends_with("intact: no completion removed or rewritten\n"),
        "{report}"
    );
    // With an archived key set that lacks B, the entry B signed does not verify: exit 1, named.
    let (code, verdict) = audit(&gate.addr, &["--keys", path_str(&only_a)]);
    assert_eq!(code, 1, "{verdict:#}");
    assert_eq!(verdict["intact"], false);
    let problems = verdict["problems"].as_array().unwrap();
    assert!(
        problems
            .iter()
            .any(|p| p["seq"] == first.seq && p["key"] == "inv-1"),
        "{verdict:#}"
    );
    assert!(
        problems.iter().all(|p| p["seq"] != second.seq),
        "the entry A signed still verifies: {verdict:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_key_the_embedded_gate_generates_one_that_keys_export_reads() {
    let dir = TempDir::new().unwrap();
    let gate = start_gate(&dir, &[]);
    let data = dir.path().join("data");
    let generated = data.join("signing-key.pem");
    assert!(
        generated.exists(),
        "no key generated into the data directory"
    );
    let (status, body) = served_jwks(&gate).await;
    assert_eq!(status, 200, "{body}");
    let exported = export(&["--data-dir", path_str(&data)]);
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap(), exported);
    let (_, granted) = transfer(&gate.addr, "inv-1").await;
    let (kid, claims) = header_kid_and_claims(&granted.statement);
    assert_eq!(kids(&exported), BTreeSet::from([kid]));
    assert_eq!(claims["iss"], "oncegate", "the default issuer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsigned_gate_grants_and_completes_without_statements_and_verify_fails_closed() {
    let dir = TempDir::new().unwrap();
    let gate = start_gate(&dir, &["--unsigned"]);
    assert!(
        !dir.path().join("data/signing-key.pem").exists(),
        "--unsigned generates no key"
    );
    // No keys to publish.
    let (status, _) = served_jwks(&gate).await;
    assert_eq!(status, 404);

    let (action, granted) = transfer(&gate.addr, "inv-1").await;
    assert_eq!(
        granted.statement, "",
        "an unsigned grant carries no statement"
    );
    let done = complete(&gate.addr, &action, &granted.token, b"tx_1").await;
    assert_eq!(done.statement, "");

    // An executor given an empty statement refuses it, whatever keys it holds.
    let keys_dir = TempDir::new().unwrap();
    let (key, _) = generate_key(keys_dir.path(), "k.pem");
    let jwks = serde_json::to_string(&export(&["--signing-key", path_str(&key)])).unwrap();
    let jwks = write_file(keys_dir.path(), "jwks.json", &jwks);
    let (code, _, stderr) = verify(&jwks, &granted.statement, PARAMS, "fake-bank");
    assert_eq!(code, 1);
    assert!(stderr.starts_with("refused: malformed"), "{stderr}");

    // --unsigned and --signing-key contradict each other: a usage error at start.
    let out = oncegate(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        path_str(&dir.path().join("other")),
        "--unsigned",
        "--signing-key",
        path_str(&key),
    ]);
    assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
}

/// A signing gate whose signing thread the system refuses: it exits 69 and says why, and it never
/// says it is serving. A gate on Redis with one worker thread starts no other thread before that
/// one.
#[test]
fn a_signing_thread_the_system_refuses_exits_69_saying_why() {
    let dir = TempDir::new().unwrap();
    let (key, _) = generate_key(dir.path(), "signing.key");
    let (code, stderr) =
        serve_on_redis_without_threads(&[dir.path(), &key], &["--signing-key", path_str(&key)]);
    assert_eq!(code, Some(69), "{stderr}");
    assert!(
        stderr.contains("cannot start the signing thread"),
        "the reason is not logged: {stderr}"
    );
    assert!(
        !stderr.contains("oncegate serving"),
        "a gate that did not start said it serves: {stderr}"
    );
}
