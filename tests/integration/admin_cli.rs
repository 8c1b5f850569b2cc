//! The operator's command line against a real `oncegate serve` process: `oncegate admin` over
//! mutual TLS and with API keys (text and JSON output, refusals), `oncegate hash-key`, the security
//! flags in `--help`, `oncegate admin` run away from the gate's directory (where it looked, how to
//! point it) and why `admin get` over the network leaves the token out, and what the gate's log
//! says about it all: audit events naming the principals, never a key, a token or params.

use std::{io::Write, process::Stdio};

use oncegate_grpc::auth::hash_key;
use oncegate_proto::{self as pb, action_gate_service_client::ActionGateServiceClient};
use tempfile::TempDir;
use tonic::Code;

use crate::support::{
    Ca, LoggedGate, OPS_KEY, PkiFiles, StoreTime, WORKER_KEY, authed, expect_error,
    oncegate_command, principals_toml, tls_channel, token_request, ttl_ms, write_file,
};

#[test]
fn hash_key_prints_the_sha256_of_stdin() {
    let mut child = oncegate_command()
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
    let out = oncegate_command()
        .args(["serve", "--help"])
        .output()
        .unwrap();
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
    let out = oncegate_command()
        .args(["admin", "--help"])
        .output()
        .unwrap();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_cli_over_mutual_tls_and_logs_without_secrets() {
    let dir = TempDir::new().unwrap();
    let ca = Ca::new("cli CA");
    let server = ca.server();
    let ops = ca.client("ops.example");
    let files = PkiFiles::write(&ca, &server, &[("ops", &ops)]);
    let config = write_file(
        dir.path(),
        "p.toml",
        &format!(
            "[limits]\nmin_lease_ttl_seconds = 0.05\n{}",
            principals_toml("")
        ),
    );
    let served = LoggedGate::start(
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
    // Params as an agent wrote them: a space and `12.50` (not `12.5`), so "exactly as sent"
    // can be told from "parsed and written again".
    let params = format!(r#"{{"iban":"{MARKER}", "amount": 12.50}}"#);
    let mut req = token_request("billing-9", "run-1", "payments.transfer", &params);
    req.lease_ttl = ttl_ms(100);
    let resp = gate
        .request_token(authed(req, Some(WORKER_KEY)))
        .await
        .unwrap()
        .into_inner();
    let action = resp.action.unwrap();
    let grant = resp.grant.unwrap();
    let token = grant.token.clone();
    // A real process on the system clock: wait until its lease has ended.
    StoreTime::System
        .pass_beyond(grant.lease_expires_at.unwrap())
        .await;

    let admin = |args: &[&str], api_key: Option<&str>| {
        let mut cmd = oncegate_command();
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
    // The operator's client certificate is its credential. The listing names what settling each
    // action needs: its reference, token, fencing, provider key and since when (`--json` is
    // accepted after the subcommand too).
    let (code, stdout, stderr) =
        admin(&["list-unresolved", "--agent", "billing-9", "--json"], None);
    assert_eq!(code, Some(0), "{stderr}");
    let listed: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let entry = &listed["actions"][0];
    assert_eq!(entry["key"], action.key.as_str());
    assert_eq!(entry["fencing"], grant.fencing);
    assert_eq!(entry["token"], token.as_str());
    assert_eq!(entry["provider_key"], grant.provider_key.as_str());
    assert_eq!(
        entry["lease_expired_at"],
        grant.lease_expires_at.unwrap().to_string()
    );
    // Which provider to ask, for what amount, to whom: the action type and the params as sent.
    assert_eq!(entry["action_name"], "payments.transfer");
    assert_eq!(entry["params_json"], params.as_str());
    let (code, stdout, _) = admin(&["list-unresolved"], None);
    assert_eq!(code, Some(0));
    for line in [
        format!(
            "billing-9 / run-1 / {}  unresolved since {}",
            action.key,
            grant.lease_expires_at.unwrap()
        ),
        format!("  token         {token}"),
        format!("  fencing       {}", grant.fencing),
        format!("  provider_key  {}", grant.provider_key),
        "  action_name   payments.transfer".to_owned(),
        format!("  params_json   {params}"),
    ] {
        assert!(stdout.lines().any(|l| l == line), "{line:?} in\n{stdout}");
    }
    let (code, stdout, _) = admin(
        &[
            "get",
            "--agent",
            "billing-9",
            "--run",
            "run-1",
            "--key",
            &action.key,
            "--json",
        ],
        None,
    );
    assert_eq!(code, Some(0));
    let view: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(view["state"], "ACTION_STATE_EXPIRED");
    assert_eq!(view["token"], token.as_str(), "operators see the token");
    assert_eq!(view["provider_key"], grant.provider_key.as_str());
    assert_eq!(view["action_name"], "payments.transfer");
    assert_eq!(view["params_json"], params.as_str());
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
    for (name, value) in [
        ("action_name", "payments.transfer"),
        ("params_json", params.as_str()),
    ] {
        assert!(
            stdout.lines().any(|l| l.starts_with(name)
                && l[name.len()..].starts_with("  ")
                && l[name.len()..].trim_start() == value),
            "{name} {value} in\n{stdout}"
        );
    }

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
    // Not JSON, and no --receipt-format: the operator's receipt is text, and says so.
    assert_eq!(resolved["completion"]["receipt_format"], "text");
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

/// `oncegate admin <args>` from `cwd`, with no address in the environment.
fn admin_in(cwd: &std::path::Path, args: &[&str]) -> std::process::Output {
    let mut command = oncegate_command();
    command.arg("admin").args(args).current_dir(cwd);
    for name in [
        "ONCEGATE_TARGET",
        "ONCEGATE_ADMIN_TARGET",
        "ONCEGATE_SERVER",
        "ONCEGATE_API_KEY",
        "ONCEGATE_DATA_DIR",
        "ONCEGATE_ADMIN_SOCKET",
    ] {
        command.env_remove(name);
    }
    command.output().unwrap()
}

/// Run from another directory, `oncegate admin` finds no socket: it says where it looked (the
/// socket's absolute path, then the TCP address) and how to point it; `--data-dir` and
/// `--admin-socket` then reach the gate. Over TCP without an operator's key, `admin get` says why
/// the token is left out; over the socket it shows it.
#[test]
fn admin_elsewhere_says_where_it_looked_and_why_a_token_is_left_out() {
    let dir = TempDir::new().unwrap();
    let gate = LoggedGate::start(&dir, &["--listen", "127.0.0.1:0"]);
    let data = dir.path().join("data");
    let elsewhere = TempDir::new().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();

    let out = admin_in(elsewhere.path(), &["list-unresolved"]);
    assert_eq!(out.status.code(), Some(69), "{}", text(&out.stdout));
    let stderr = text(&out.stderr);
    let looked = elsewhere.path().join("oncegate-data").join("admin.sock");
    assert!(
        stderr.starts_with(&format!(
            "oncegate admin: no admin socket at {} and cannot reach http://127.0.0.1:50051: ",
            looked.display()
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "On the gate's machine give --data-dir (the gate's data directory) or \
             --admin-socket; from elsewhere --server (or ONCEGATE_ADMIN_TARGET) with an \
             operator's --api-key"
        ),
        "{stderr}"
    );
    let socket = data.join("admin.sock");
    for args in [
        ["list-unresolved", "--data-dir", data.to_str().unwrap()],
        [
            "list-unresolved",
            "--admin-socket",
            socket.to_str().unwrap(),
        ],
    ] {
        let out = admin_in(elsewhere.path(), &args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }

    // An action in flight: its token is the operator's to see.
    let granted = oncegate_command()
        .args([
            "call",
            "request-token",
            "--agent",
            "a",
            "--run",
            "r",
            "--action",
            "x",
        ])
        .args(["--params", "{}", "--idempotency-key", "k", "--json"])
        .args(["--server", &gate.addr])
        .env_remove("ONCEGATE_API_KEY")
        .output()
        .unwrap();
    assert_eq!(granted.status.code(), Some(0), "{}", text(&granted.stderr));
    let get = ["get", "--agent", "a", "--run", "r", "--key", "k", "--json"];
    let view = |extra: &[&str]| {
        let mut args = get.to_vec();
        args.extend_from_slice(extra);
        let out = admin_in(elsewhere.path(), &args);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let over_tcp = view(&["--server", &gate.addr]);
    assert_eq!(over_tcp["token"], "");
    assert_eq!(
        over_tcp["token_withheld"],
        "the gate shows an unsettled action's token to operators only, and this call carried no \
         API key: give an operator's --api-key, or run on the gate's machine (its admin socket: \
         --data-dir or --admin-socket)"
    );
    let local = view(&["--data-dir", data.to_str().unwrap()]);
    assert_eq!(local["token"].as_str().unwrap().len(), 32, "{local}");
    assert!(local.get("token_withheld").is_none(), "{local}");
}

/// A gate on Redis keeps its admin socket in --data-dir too: `serve --help` says so, the directory
/// is created, the start-up line names the socket by its absolute path, and `oncegate admin
/// --data-dir` reaches it.
#[test]
fn a_gate_on_redis_serves_its_admin_socket_in_its_data_dir() {
    let redis = crate::support::RedisServer::start();
    let dir = TempDir::new().unwrap();
    let data = dir.path().join("not-yet").join("data");
    let gate = LoggedGate::serve(
        &dir,
        &[
            "--redis-url",
            &redis.url(),
            "--data-dir",
            data.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ],
    );
    let socket = data.join("admin.sock");
    let log = gate.wait_for_log("oncegate serving", 1);
    assert!(
        log.contains(&format!("admin_socket={}", socket.display())),
        "{log}"
    );
    let elsewhere = TempDir::new().unwrap();
    let out = admin_in(
        elsewhere.path(),
        &["list-unresolved", "--data-dir", data.to_str().unwrap()],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let help = oncegate_command()
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        help.contains("With --redis-url (or Sentinel, Cluster) it holds only the admin socket, <data-dir>/admin.sock"),
        "{help}"
    );
}
