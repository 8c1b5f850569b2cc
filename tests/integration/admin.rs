//! The operator API end to end, on both stores: a completion done by hand reaching the worker as
//! COMPLETED_BY_OTHER, expired leases listed, resolved and granted again with a higher fencing
//! number, pagination; then the `oncegate admin` and `hash-key` commands, the start-up refusal of
//! an open non-loopback listener, and what the logs never contain.

use std::{
    collections::BTreeSet,
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
    time::Duration,
};

use oncegate::{
    config::ConfigFile,
    grpc::auth::hash_key,
    pb::{
        self, action_gate_service_client::ActionGateServiceClient,
        gate_admin_service_client::GateAdminServiceClient,
    },
};
use tempfile::TempDir;
use tonic::{Code, transport::Channel};

use crate::support::{
    Ca, Kind, OPS_KEY, PkiFiles, TestGate, WORKER_KEY, authed, expect_error, on_stores,
    principals_toml, tls_channel, token_request, write_file,
};

fn policies() -> ConfigFile {
    crate::support::config(&format!(
        "{}\n[actions.\"payments.transfer\"]\nkey_fields = [\"/amount\", \"/to\"]\n",
        principals_toml("")
    ))
}

struct Clients {
    gate: ActionGateServiceClient<Channel>,
    admin: GateAdminServiceClient<Channel>,
}

async fn clients(gate: &TestGate) -> Clients {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", gate.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    Clients {
        gate: ActionGateServiceClient::new(channel.clone()),
        admin: GateAdminServiceClient::new(channel),
    }
}

fn ms(ms: u64) -> Option<prost_types::Duration> {
    Some(prost_types::Duration {
        seconds: (ms / 1000) as i64,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    })
}

async fn grant(c: &mut Clients, req: pb::RequestTokenRequest) -> (pb::ActionRef, pb::Grant) {
    let resp = c
        .gate
        .request_token(authed(req, Some(WORKER_KEY)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.decision(), pb::Decision::Granted, "{resp:?}");
    (resp.action.unwrap(), resp.grant.unwrap())
}

async fn list(
    c: &mut Clients,
    agent: &str,
    page_size: u32,
    token: &str,
) -> pb::ListUnresolvedResponse {
    c.admin
        .list_unresolved(authed(
            pb::ListUnresolvedRequest {
                agent_id: agent.into(),
                page_size,
                page_token: token.into(),
            },
            Some(OPS_KEY),
        ))
        .await
        .unwrap()
        .into_inner()
}

async fn hand_done_completion_reaches_the_worker_as_completed_by_other(kind: Kind) {
    let gate = TestGate::start_with(kind, policies()).await;
    let mut c = clients(&gate).await;
    const PAY: &str = r#"{"amount":100,"to":"DE89","memo":"rent"}"#;
    let mut req = token_request("billing-1", "run-1", "payments.transfer", PAY);
    req.idempotency_key = "invoice-7".into();
    let (action, g) = grant(&mut c, req.clone()).await;

    // The customer was paid by phone while the worker was stuck: the operator records it.
    let done = c
        .admin
        .record_external_completion(authed(
            pb::RecordExternalCompletionRequest {
                action: Some(action.clone()),
                receipt: b"wire 991".to_vec(),
                note: "paid by phone, ticket OPS-12".into(),
                ..Default::default()
            },
            Some(OPS_KEY),
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(done.recorded);
    let completion = done.completion.unwrap();
    assert_eq!(completion.source(), pb::CompletionSource::Operator);
    assert_eq!(
        (completion.fencing, completion.operator.as_str()),
        (1, "ops")
    );

    // The worker finishes too: it is told the action was completed by someone else.
    let status = c
        .gate
        .complete(authed(
            pb::CompleteRequest {
                action: Some(action.clone()),
                token: g.token.clone(),
                receipt: b"worker".to_vec(),
            },
            Some(WORKER_KEY),
        ))
        .await
        .unwrap_err();
    let meta = expect_error(&status, Code::FailedPrecondition, "COMPLETED_BY_OTHER");
    assert_eq!(meta["fencing"], "1");
    // Every retry of the agent replays the operator's receipt; nothing runs twice more.
    let replay = c
        .gate
        .request_token(authed(req, Some(WORKER_KEY)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(replay.decision(), pb::Decision::AlreadyCompleted);
    let replayed = replay.completion.unwrap();
    assert_eq!(replayed.receipt, b"wire 991");
    assert_eq!(replayed.note, "paid by phone, ticket OPS-12");

    // An action that never reached the gate: without the request it cannot be recorded...
    let other = pb::ActionRef {
        key: "invoice-8".into(),
        ..action.clone()
    };
    let external = |params: &str| pb::RecordExternalCompletionRequest {
        action: Some(other.clone()),
        receipt: b"manual".to_vec(),
        note: "done in the admin panel".into(),
        action_name: if params.is_empty() {
            ""
        } else {
            "payments.transfer"
        }
        .into(),
        params_json: params.into(),
        intent_id: String::new(),
    };
    let status = c
        .admin
        .record_external_completion(authed(external(""), Some(OPS_KEY)))
        .await
        .unwrap_err();
    let meta = expect_error(&status, Code::InvalidArgument, "INVALID_REQUEST");
    assert_eq!(meta["field"], "params_json");
    // ...with it, the agent's later request is answered with the operator's receipt.
    c.admin
        .record_external_completion(authed(
            external(r#"{"amount":5,"to":"X","memo":"a"}"#),
            Some(OPS_KEY),
        ))
        .await
        .unwrap();
    let mut later = token_request(
        "billing-1",
        "run-1",
        "payments.transfer",
        r#"{"to":"X","amount":5.0,"memo":"b"}"#,
    );
    later.idempotency_key = "invoice-8".into();
    let resp = c
        .gate
        .request_token(authed(later.clone(), Some(WORKER_KEY)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.decision(), pb::Decision::AlreadyCompleted);
    assert_eq!(resp.completion.unwrap().receipt, b"manual");
    later.params_json = r#"{"to":"X","amount":6}"#.into();
    let status = c
        .gate
        .request_token(authed(later, Some(WORKER_KEY)))
        .await
        .unwrap_err();
    let meta = expect_error(&status, Code::FailedPrecondition, "IDEMPOTENCY_KEY_REUSED");
    assert_eq!(meta["differing_fields"], "/amount");
}
on_stores!(hand_done_completion_reaches_the_worker_as_completed_by_other: embedded, redis);

async fn expired_lease_listed_resolved_failed_and_granted_again(kind: Kind) {
    let gate = TestGate::start_with(kind, policies()).await;
    let mut c = clients(&gate).await;
    let mut req = token_request(
        "billing-2",
        "run-1",
        "payments.transfer",
        r#"{"amount":1,"to":"A"}"#,
    );
    req.lease_ttl = ms(150);
    let (action, g) = grant(&mut c, req.clone()).await;
    let mut live = token_request("billing-2", "run-1", "email.send", r#"{"to":"a@b"}"#);
    live.lease_ttl = ms(60_000);
    grant(&mut c, live).await;

    assert!(
        list(&mut c, "billing-2", 0, "").await.actions.is_empty(),
        "nothing expired yet"
    );
    let status = c
        .admin
        .resolve_expired(authed(
            pb::ResolveExpiredRequest {
                action: Some(action.clone()),
                resolution: pb::Resolution::Failed as i32,
                ..Default::default()
            },
            Some(OPS_KEY),
        ))
        .await
        .unwrap_err();
    let meta = expect_error(&status, Code::FailedPrecondition, "LEASE_NOT_EXPIRED");
    assert_eq!(meta["state"], "AUTHORIZED");

    tokio::time::sleep(Duration::from_millis(250)).await;
    let page = list(&mut c, "billing-2", 0, "").await;
    assert_eq!(page.actions.len(), 1, "only the expired lease: {page:?}");
    let listed = &page.actions[0];
    assert_eq!(listed.action.as_ref().unwrap(), &action);
    assert_eq!(listed.fencing, 1);
    assert!(listed.lease_expired_at.is_some());
    assert!(page.next_page_token.is_empty());
    // The agent is refused until someone reconciles.
    let status = c
        .gate
        .request_token(authed(req.clone(), Some(WORKER_KEY)))
        .await
        .unwrap_err();
    expect_error(
        &status,
        Code::FailedPrecondition,
        "LEASE_EXPIRED_UNRESOLVED",
    );

    // The provider says it never happened: resolve as failed.
    let resolved = c
        .admin
        .resolve_expired(authed(
            pb::ResolveExpiredRequest {
                action: Some(action.clone()),
                resolution: pb::Resolution::Failed as i32,
                note: "provider has no such transfer".into(),
                ..Default::default()
            },
            Some(OPS_KEY),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resolved.fencing, 1);
    assert!(resolved.completion.is_none());
    assert!(list(&mut c, "billing-2", 0, "").await.actions.is_empty());
    assert!(list(&mut c, "", 0, "").await.actions.is_empty());
    // Granted again, with a higher fencing number; the old holder cannot complete.
    req.lease_ttl = None;
    let (_, again) = grant(&mut c, req).await;
    assert_eq!(again.fencing, 2);
    let status = c
        .gate
        .complete(authed(
            pb::CompleteRequest {
                action: Some(action),
                token: g.token,
                receipt: vec![],
            },
            Some(WORKER_KEY),
        ))
        .await
        .unwrap_err();
    expect_error(&status, Code::FailedPrecondition, "TOKEN_MISMATCH");
}
on_stores!(expired_lease_listed_resolved_failed_and_granted_again: embedded, redis);

async fn expired_lease_resolved_completed(kind: Kind) {
    let gate = TestGate::start_with(kind, policies()).await;
    let mut c = clients(&gate).await;
    let mut req = token_request(
        "billing-3",
        "run-1",
        "payments.transfer",
        r#"{"amount":2,"to":"B"}"#,
    );
    req.lease_ttl = ms(100);
    let (action, g) = grant(&mut c, req.clone()).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let resolved = c
        .admin
        .resolve_expired(authed(
            pb::ResolveExpiredRequest {
                action: Some(action.clone()),
                resolution: pb::Resolution::Completed as i32,
                receipt: b"tx_42".to_vec(),
                note: "provider confirms tx_42".into(),
            },
            Some(OPS_KEY),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resolved.completion.unwrap().receipt, b"tx_42");
    let status = c
        .gate
        .complete(authed(
            pb::CompleteRequest {
                action: Some(action.clone()),
                token: g.token,
                receipt: b"late".to_vec(),
            },
            Some(WORKER_KEY),
        ))
        .await
        .unwrap_err();
    expect_error(&status, Code::FailedPrecondition, "COMPLETED_BY_OTHER");
    let resp = c
        .gate
        .request_token(authed(req, Some(WORKER_KEY)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.completion.unwrap().receipt, b"tx_42");
}
on_stores!(expired_lease_resolved_completed: embedded, redis);

async fn listing_pages_across_agents(kind: Kind) {
    let gate = TestGate::start_with(kind, policies()).await;
    let mut c = clients(&gate).await;
    let mut expected = BTreeSet::new();
    for (i, agent) in ["billing-a", "billing-bb", "billing-c"].iter().enumerate() {
        for n in 0..=i {
            let mut req = token_request(agent, "run", "x", &format!(r#"{{"n":{n}}}"#));
            req.lease_ttl = ms(100);
            let (action, _) = grant(&mut c, req).await;
            expected.insert((agent.to_string(), action.key));
        }
    }
    // One of them completes: it must not be listed.
    let mut req = token_request("billing-a", "run", "x", r#"{"n":"done"}"#);
    req.lease_ttl = ms(100);
    let (done_action, done) = grant(&mut c, req).await;
    c.gate
        .complete(authed(
            pb::CompleteRequest {
                action: Some(done_action),
                token: done.token,
                receipt: vec![],
            },
            Some(WORKER_KEY),
        ))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;

    let mut seen = BTreeSet::new();
    let mut token = String::new();
    for _ in 0..10 {
        let page = list(&mut c, "", 2, &token).await;
        assert!(page.actions.len() <= 2);
        for a in page.actions {
            let scope = a.action.as_ref().unwrap().scope.clone().unwrap();
            assert!(
                seen.insert((scope.agent_id, a.action.unwrap().key)),
                "listed twice"
            );
        }
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    assert!(token.is_empty(), "the listing did not end");
    assert_eq!(seen, expected);
    let one = list(&mut c, "billing-c", 0, "").await;
    assert_eq!(one.actions.len(), 3);
    // A page token of another listing is refused.
    let status = c
        .admin
        .list_unresolved(authed(
            pb::ListUnresolvedRequest {
                agent_id: "billing-c".into(),
                page_size: 1,
                page_token: "garbage!".into(),
            },
            Some(OPS_KEY),
        ))
        .await
        .unwrap_err();
    expect_error(&status, Code::InvalidArgument, "INVALID_REQUEST");
}
on_stores!(listing_pages_across_agents: embedded, redis);

fn oncegate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_oncegate"))
}

#[test]
fn hash_key_prints_the_sha256_of_stdin() {
    let mut child = oncegate()
        .arg("hash-key")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"abc\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    // FIPS 180-2's SHA-256("abc"): the trailing newline is not part of the key.
    let expected = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    assert_eq!(String::from_utf8(out.stdout).unwrap().trim(), expected);
    assert_eq!(hash_key("abc"), expected);
}

#[test]
fn help_documents_the_security_flags_with_their_environment_variables() {
    let out = oncegate().args(["serve", "--help"]).output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "--tls-cert",
        "ONCEGATE_TLS_CERT",
        "--tls-key",
        "ONCEGATE_TLS_KEY",
        "--tls-client-ca",
        "ONCEGATE_TLS_CLIENT_CA",
        "--insecure",
        "--max-message-bytes",
        "ONCEGATE_MAX_MESSAGE_BYTES",
    ] {
        assert!(help.contains(flag), "{flag} missing from serve --help");
    }
    let out = oncegate().args(["admin", "--help"]).output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for word in [
        "--server",
        "--api-key",
        "ONCEGATE_API_KEY",
        "--ca",
        "--cert",
        "--json",
        "list-unresolved",
        "resolve",
    ] {
        assert!(help.contains(word), "{word} missing from admin --help");
    }
}

/// A real `oncegate serve` process with its stderr (the log) kept in a file.
struct Served {
    child: std::process::Child,
    addr: String,
    log: std::path::PathBuf,
}

impl Served {
    fn start(dir: &TempDir, args: &[&str]) -> Self {
        let log = dir.path().join("gate.log");
        let mut child = oncegate()
            .args(["serve", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| {
                panic!(
                    "unexpected first line {line:?}: {}",
                    std::fs::read_to_string(&log).unwrap()
                )
            })
            .to_owned();
        Self { child, addr, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn an_open_non_loopback_listener_is_refused_unless_insecure() {
    let dir = TempDir::new().unwrap();
    let out = oncegate()
        .args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no principals configured"), "{stderr}");
    assert!(
        !dir.path().join("data").exists(),
        "refused before opening the store"
    );

    let open = Served::start(&dir, &["--listen", "0.0.0.0:0", "--insecure"]);
    assert!(open.addr.starts_with("0.0.0.0:"));
    assert!(open.log().contains("INSECURE"), "{}", open.log());
    drop(open);

    let config = write_file(dir.path(), "p.toml", &principals_toml(""));
    let guarded = Served::start(
        &dir,
        &[
            "--listen",
            "0.0.0.0:0",
            "--config",
            config.to_str().unwrap(),
        ],
    );
    assert!(!guarded.log().contains("INSECURE"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_cli_over_mutual_tls_and_logs_without_secrets() {
    let dir = TempDir::new().unwrap();
    let ca = Ca::new("cli CA");
    let server = ca.server();
    let ops = ca.client("ops.example");
    let files = PkiFiles::write(&ca, &server, &[("ops", &ops)]);
    let config = write_file(dir.path(), "p.toml", &principals_toml(""));
    let served = Served::start(
        &dir,
        &[
            "--listen",
            "127.0.0.1:0",
            "--config",
            config.to_str().unwrap(),
            "--tls-cert",
            &files.path("server.pem"),
            "--tls-key",
            &files.path("server.key"),
            "--tls-client-ca",
            &files.path("ca.pem"),
        ],
    );
    let port = served.addr.rsplit(':').next().unwrap().to_owned();
    let server_url = format!("https://localhost:{port}");

    // A worker takes a lease that then expires (over TLS, with its API key).
    let channel = tls_channel(&served.addr, &ca.pem, None).await.unwrap();
    let mut gate = ActionGateServiceClient::new(channel);
    const MARKER: &str = "params-marker-IBAN-DE89";
    let mut req = token_request(
        "billing-9",
        "run-1",
        "payments.transfer",
        &format!(r#"{{"iban":"{MARKER}"}}"#),
    );
    req.lease_ttl = ms(100);
    let resp = gate
        .request_token(authed(req, Some(WORKER_KEY)))
        .await
        .unwrap()
        .into_inner();
    let action = resp.action.unwrap();
    let token = resp.grant.unwrap().token;
    tokio::time::sleep(Duration::from_millis(200)).await;

    let admin = |args: &[&str], api_key: Option<&str>| {
        let mut cmd = oncegate();
        cmd.args([
            "admin",
            "--server",
            &server_url,
            "--ca",
            &files.path("ca.pem"),
        ]);
        match api_key {
            Some(key) => {
                cmd.env("ONCEGATE_API_KEY", key);
            }
            None => {
                cmd.args([
                    "--cert",
                    &files.path("ops.pem"),
                    "--key",
                    &files.path("ops.key"),
                ]);
            }
        }
        let out = cmd.args(args).output().unwrap();
        (
            out.status.code(),
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    // The operator's client certificate is its credential.
    let (code, stdout, stderr) =
        admin(&["--json", "list-unresolved", "--agent", "billing-9"], None);
    assert_eq!(code, Some(0), "{stderr}");
    let listed: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(listed["actions"][0]["key"], action.key.as_str());
    assert_eq!(listed["actions"][0]["fencing"], 1);
    let (code, stdout, _) = admin(&["list-unresolved"], None);
    assert_eq!(code, Some(0));
    assert!(
        stdout.contains("billing-9 / run-1 /") && stdout.contains("fencing 1"),
        "{stdout}"
    );

    let (code, stdout, stderr) = admin(
        &[
            "--json",
            "resolve",
            "--agent",
            "billing-9",
            "--run",
            "run-1",
            "--key",
            &action.key,
            "--outcome",
            "completed",
            "--receipt",
            "tx_77",
            "--note",
            "confirmed by provider",
        ],
        None,
    );
    assert_eq!(code, Some(0), "{stderr}");
    let resolved: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(resolved["completion"]["receipt_text"], "tx_77");
    assert_eq!(
        resolved["completion"]["source"],
        "COMPLETION_SOURCE_OPERATOR"
    );

    let (code, stdout, _) = admin(
        &[
            "get",
            "--agent",
            "billing-9",
            "--run",
            "run-1",
            "--key",
            &action.key,
        ],
        None,
    );
    assert_eq!(code, Some(0));
    assert!(stdout.contains("ACTION_STATE_COMPLETED"), "{stdout}");
    // An agent's key is refused for operator commands; a wrong one is unauthenticated.
    let (code, _, stderr) = admin(&["list-unresolved"], Some(WORKER_KEY));
    assert_eq!(code, Some(1));
    assert!(stderr.contains("FORBIDDEN_SCOPE"), "{stderr}");
    let (code, stdout, _) = admin(&["--json", "list-unresolved"], Some("wrong"));
    assert_eq!(code, Some(1));
    assert!(stdout.contains("UNAUTHENTICATED"));
    let (code, stdout, _) = admin(
        &[
            "--json",
            "complete",
            "--agent",
            "billing-9",
            "--run",
            "run-2",
            "--key",
            "k-1",
            "--receipt",
            "manual",
            "--action-name",
            "payments.transfer",
            "--params",
            "{\"n\":1}",
        ],
        Some(OPS_KEY),
    );
    assert_eq!(code, Some(0), "{stdout}");
    assert!(stdout.contains("\"recorded\": true"));

    // The late worker hears COMPLETED_BY_OTHER.
    let status = gate
        .complete(authed(
            pb::CompleteRequest {
                action: Some(action),
                token: token.clone(),
                receipt: b"late".to_vec(),
            },
            Some(WORKER_KEY),
        ))
        .await
        .unwrap_err();
    expect_error(&status, Code::FailedPrecondition, "COMPLETED_BY_OTHER");

    // The log has audit events naming the principals, and never a key, a token or params.
    let log = served.log();
    for secret in [WORKER_KEY, OPS_KEY, token.as_str(), MARKER] {
        assert!(
            !log.contains(secret),
            "{secret:?} leaked into the log:\n{log}"
        );
    }
    assert!(log.contains("oncegate::audit"), "{log}");
    assert!(log.contains("principal=billing-worker"), "{log}");
    assert!(
        log.contains("principal=ops") && log.contains("resolved_completed"),
        "{log}"
    );
    assert!(log.contains("double execution"), "{log}");
}
