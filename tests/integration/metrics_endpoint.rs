//! The `/metrics` endpoint and the binary's metrics flags: only `GET /metrics` is served, the
//! process serves its configured labels and build info, a bad `--metrics-other-action-label` is bad
//! configuration, and `--help` documents the flags.

use std::net::SocketAddr;

use oncegate_gate::policy::Policies;

use crate::support::{
    GateProcess, Kind, Scrape, TestGate, connect, free_port, http_get, token_request, write_file,
};

#[tokio::test]
async fn metrics_endpoint_serves_only_get_metrics() {
    let (_gate, addr) = TestGate::start_with_metrics(Kind::Embedded, Policies::default()).await;
    let (status, body) = http_get(addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        body.contains("# TYPE oncegate_attempts_total counter"),
        "{body}"
    );
    assert_eq!(http_get(addr, "/").await.0, 404);
}

fn spawn_with_metrics(dir: &std::path::Path, extra: &[&str]) -> (GateProcess, SocketAddr) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let data = dir.join("data");
    let mut args = vec![
        "--data-dir",
        data.to_str().unwrap(),
        "--metrics-listen",
        &listen,
    ];
    args.extend(extra);
    (GateProcess::spawn(&args), listen.parse().unwrap())
}

#[tokio::test]
async fn the_binary_serves_metrics_with_its_configured_labels() {
    let dir = tempfile::TempDir::new().unwrap();
    let config = write_file(dir.path(), "p.toml", "[actions.\"pay\"]\n");
    let (gate, metrics) = spawn_with_metrics(
        dir.path(),
        &[
            "--config",
            config.to_str().unwrap(),
            "--metrics-other-action-label",
            "unnamed",
        ],
    );
    let mut client = connect(&gate.addr).await;
    for action in ["pay", "x", "y"] {
        client
            .request_token(token_request("a", "r", action, "{}"))
            .await
            .unwrap();
    }
    let scrape = Scrape::fetch(metrics).await;
    let granted = |action| {
        scrape.sum(
            "oncegate_attempts_total",
            &[("action", action), ("decision", "granted")],
        )
    };
    assert_eq!((granted("pay"), granted("unnamed")), (1.0, 2.0));
    let build = scrape.series("oncegate_build_info").next().unwrap().0;
    assert_eq!(build["version"], env!("CARGO_PKG_VERSION"));
}

#[test]
fn an_other_label_equal_to_a_policy_name_is_bad_configuration() {
    let dir = tempfile::TempDir::new().unwrap();
    let config = write_file(dir.path(), "p.toml", "[actions.\"other\"]\n");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_oncegate"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("metrics-other-action-label"), "{stderr}");
}

#[test]
fn help_documents_the_metrics_flags() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_oncegate"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "--metrics-listen",
        "ONCEGATE_METRICS_LISTEN",
        "--metrics-other-action-label",
        "ONCEGATE_METRICS_OTHER_ACTION_LABEL",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help");
    }
}

/// `oncegate_unresolved_actions` rises when a lease ends unresolved and stays up (the alert on it
/// keeps firing) until the action is settled, here by the worker's Release.
#[tokio::test]
async fn the_unresolved_actions_gauge_stays_up_until_settled() {
    let policies = crate::support::policies("[limits]\nmin_lease_ttl_seconds = 0.05\n");
    let (gate, addr) = TestGate::start_with_metrics(Kind::Embedded, policies).await;
    let gauge = || async {
        Scrape::fetch(addr)
            .await
            .sum("oncegate_unresolved_actions", &[])
    };
    let wait_for = |want: f64| async move {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while gauge().await != want {
            assert!(
                std::time::Instant::now() < deadline,
                "gauge never reached {want}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    };
    let client = &mut gate.client().await;
    let mut req = token_request("a", "r", "pay", r#"{"n":1}"#);
    req.lease_ttl = crate::support::ttl_ms(100);
    let (action, g) = crate::support::grant(client, req).await;
    wait_for(1.0).await;
    // Still there a second later: it does not go away on its own.
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert_eq!(gauge().await, 1.0);
    crate::support::release(client, &action, &g.token)
        .await
        .unwrap();
    wait_for(0.0).await;
}
