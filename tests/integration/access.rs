//! Operator access on day one: on the gate's machine `oncegate admin` works
//! against a gate with no principal configured (the admin socket in its data directory, mode 0600,
//! whose holder is the operator); over the network the rules stay as they are, and a refused
//! admin call names what to configure; adding an operator never locks agents out.

use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};

use oncegate_grpc::auth::hash_key;
use oncegate_proto as pb;
use tempfile::TempDir;
use tonic::Code;

use crate::support::{
    LoggedGate, authed, connect, expect_error, oncegate_command, token_request, write_file,
};

/// `oncegate admin <args>` with `--data-dir` (and whatever connection flags `args` add): exit
/// code, standard output, standard error.
fn admin(data_dir: &std::path::Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = oncegate_command()
        .arg("admin")
        .args(args)
        .args(["--data-dir", data_dir.to_str().unwrap()])
        .env_remove("ONCEGATE_SERVER")
        .env_remove("ONCEGATE_ADMIN_TARGET")
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn admin_on_the_gates_machine_needs_no_principal() {
    let dir = TempDir::new().unwrap();
    let gate = LoggedGate::start(&dir, &["--listen", "127.0.0.1:0"]);
    let data = dir.path().join("data");
    let socket = data.join("admin.sock");
    // Bound right after the gate's listener. Looked at as soon as it appears: it is never at its
    // path with any other mode, not even for the moment after it was bound.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !socket.exists() && std::time::Instant::now() < deadline {
        std::thread::yield_now();
    }
    let meta = std::fs::metadata(&socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o600,
        "only the gate's user"
    );

    // An agent leaves an action unresolved (a one-second lease, never completed).
    let mut client = connect(&gate.addr).await;
    let mut req = token_request("billing", "run-1", "payments.transfer", r#"{"amount":5}"#);
    req.lease_ttl = Some(prost_types::Duration {
        seconds: 1,
        nanos: 0,
    });
    client.request_token(req).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;

    // On this machine, with no flag but the data directory: the local operator, over the socket.
    let (code, out, err) = admin(&data, &["list-unresolved", "--json"]);
    assert_eq!(code, Some(0), "{err}");
    let listed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed["actions"].as_array().unwrap().len(), 1, "{out}");

    // Over the network, the same call is refused, and the refusal says what to configure.
    let server = format!("http://{}", gate.addr);
    let (code, _, err) = admin(&data, &["list-unresolved", "--server", &server]);
    assert_eq!(code, Some(1), "{err}");
    for needle in [
        "FORBIDDEN_SCOPE",
        "admin.sock",
        "[[principals]]",
        "role = \"operator\"",
        "--api-key",
    ] {
        assert!(err.contains(needle), "{needle} missing from: {err}");
    }
    // The socket's caller is audited as the local operator.
    let log = gate.wait_for_log("local-operator", 1);
    assert!(
        log.contains("list_unresolved") || log.contains("ListUnresolved"),
        "{log}"
    );
}

#[tokio::test]
async fn adding_an_operator_does_not_lock_agents_out() {
    let dir = TempDir::new().unwrap();
    let config = write_file(
        dir.path(),
        "oncegate.toml",
        &format!(
            "[[principals]]\nname = \"ops\"\nrole = \"operator\"\napi_key_sha256 = \"{}\"\n",
            hash_key("ops-key")
        ),
    );
    let gate = LoggedGate::start(
        &dir,
        &[
            "--listen",
            "127.0.0.1:0",
            "--config",
            config.to_str().unwrap(),
        ],
    );
    let mut client = connect(&gate.addr).await;
    // No agent principal yet: agents call without a credential, as before.
    let granted = client
        .request_token(token_request("billing", "run-1", "pay", r#"{"amount":1}"#))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(granted.decision(), pb::Decision::Granted);
    // The operator's key works; the anonymous caller is no operator.
    let server = format!("http://{}", gate.addr);
    let data = dir.path().join("elsewhere");
    let (code, _, err) = admin(
        &data,
        &[
            "list-unresolved",
            "--server",
            &server,
            "--api-key",
            "ops-key",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    let refused = client
        .get_action(authed(
            pb::GetActionRequest {
                action: granted.action.clone(),
            },
            Some("not-a-key"),
        ))
        .await
        .unwrap_err();
    expect_error(&refused, Code::Unauthenticated, "UNAUTHENTICATED");

    // Once an agent principal exists, agents need their key.
    drop(gate);
    let config = write_file(
        dir.path(),
        "oncegate.toml",
        &format!(
            "[[principals]]\nname = \"ops\"\nrole = \"operator\"\napi_key_sha256 = \"{}\"\n\
             [[principals]]\nname = \"billing\"\nrole = \"agent\"\nagents = [\"billing\"]\n\
             api_key_sha256 = \"{}\"\n",
            hash_key("ops-key"),
            hash_key("billing-key")
        ),
    );
    let gate = LoggedGate::start(
        &dir,
        &[
            "--listen",
            "127.0.0.1:0",
            "--config",
            config.to_str().unwrap(),
        ],
    );
    let mut client = connect(&gate.addr).await;
    let refused = client
        .request_token(token_request("billing", "run-1", "pay", r#"{"amount":2}"#))
        .await
        .unwrap_err();
    expect_error(&refused, Code::Unauthenticated, "UNAUTHENTICATED");
    client
        .request_token(authed(
            token_request("billing", "run-1", "pay", r#"{"amount":2}"#),
            Some("billing-key"),
        ))
        .await
        .unwrap();
}

#[tokio::test]
async fn an_approver_decides_and_nothing_else() {
    let dir = TempDir::new().unwrap();
    let config = write_file(
        dir.path(),
        "oncegate.toml",
        &format!(
            "[[principals]]\nname = \"finance-lead\"\nrole = \"approver\"\napi_key_sha256 = \"{}\"\n",
            hash_key("lead-key")
        ),
    );
    let gate = LoggedGate::start(
        &dir,
        &[
            "--listen",
            "127.0.0.1:0",
            "--config",
            config.to_str().unwrap(),
        ],
    );
    let server = format!("http://{}", gate.addr);
    let data = dir.path().join("elsewhere");
    let (code, _, err) = admin(
        &data,
        &[
            "list-approvals",
            "--agent",
            "billing",
            "--server",
            &server,
            "--api-key",
            "lead-key",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    let (code, _, err) = admin(
        &data,
        &[
            "list-unresolved",
            "--server",
            &server,
            "--api-key",
            "lead-key",
        ],
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("its role is approver") && err.contains("needs the operator role"),
        "{err}"
    );
}

/// Gates pointed at one admin socket: a live one is left to the gate that serves it, a stale one
/// (its gate killed) is replaced, the socket is 0600 whenever it is there, and no name it was
/// bound under is left beside it.
#[tokio::test]
async fn a_live_admin_socket_is_left_to_its_gate_and_a_stale_one_is_replaced() {
    let shared = TempDir::new().unwrap();
    let socket = shared.path().join("ops.sock");
    let url = format!("unix:{}", socket.display());
    let flags = [
        "--listen",
        "127.0.0.1:0",
        "--admin-socket",
        socket.to_str().unwrap(),
    ];
    let list = |data: &std::path::Path| {
        let (code, _, err) = admin(data, &["list-unresolved", "--server", &url]);
        assert_eq!(code, Some(0), "{err}");
    };
    let mode = || std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;

    let (dir_a, dir_b, dir_c) = (
        TempDir::new().unwrap(),
        TempDir::new().unwrap(),
        TempDir::new().unwrap(),
    );
    let a = LoggedGate::start(&dir_a, &flags);
    a.wait_for_log("admin socket:", 1);
    assert_eq!(mode(), 0o600);
    let b = LoggedGate::start(&dir_b, &flags);
    b.wait_for_log("another gate serves this admin socket", 1);
    list(dir_a.path());
    a.wait_for_log("local-operator", 1);
    assert!(
        !b.log().contains("local-operator"),
        "the socket is still a's"
    );

    // Killed, a leaves its socket behind; the next gate replaces it.
    drop(a);
    drop(b);
    assert!(socket.exists());
    let c = LoggedGate::start(&dir_c, &flags);
    c.wait_for_log("admin socket:", 1);
    assert_eq!(mode(), 0o600);
    list(dir_c.path());
    c.wait_for_log("local-operator", 1);
    let names: Vec<_> = std::fs::read_dir(shared.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["ops.sock"]);
}
