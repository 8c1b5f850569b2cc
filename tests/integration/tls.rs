//! TLS and exposure: a client certificate from an untrusted CA never gets through the handshake,
//! a wrong API key is refused even beside a good certificate, health stays open; and the gate
//! refuses to listen off loopback without principals unless told `--insecure` (and then says so
//! in its log).

use oncegate_config::defaults;
use oncegate_grpc::{server::ServerOptions, tls};
use oncegate_proto::{
    self as pb, action_gate_service_client::ActionGateServiceClient,
    gate_admin_service_client::GateAdminServiceClient,
};
use tempfile::TempDir;
use tonic::Code;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use crate::support::{
    Ca, Kind, LoggedGate, Pki, TestGate, authed, backend, config, expect_error, oncegate_command,
    principals_toml, tls_channel, write_file,
};

/// The server's certificate, asking clients for one from the test CA.
fn mutual_tls(pki: &Pki) -> tls::TlsSettings {
    tls::settings(
        pki.server.cert.as_bytes(),
        pki.server.key.as_bytes(),
        Some(pki.ca.pem.as_bytes()),
        false,
    )
    .unwrap()
}

#[tokio::test]
async fn mtls_refuses_untrusted_certificates_and_a_wrong_key_beats_a_good_certificate() {
    let pki = Pki::new();
    let rogue = Ca::new("rogue CA").client("ops.example");
    let settings = mutual_tls(&pki);
    let options = ServerOptions {
        tls: Some(settings),
        ..defaults::server()
    };
    let policies = config(&principals_toml(""));
    let gate = TestGate::serve_with_options(backend(Kind::Embedded).await, policies, options).await;
    let addr = gate.addr.to_string();
    // A certificate from another CA, even with an operator's name, does not get through TLS.
    let rogue_result = match tls_channel(&addr, &pki.ca.pem, Some(&rogue)).await {
        Err(e) => Err(e),
        Ok(channel) => ActionGateServiceClient::new(channel)
            .get_action(pb::GetActionRequest {
                action: Some(pb::ActionRef {
                    scope: Some(pb::Scope {
                        agent_id: "a".into(),
                        run_id: "r".into(),
                    }),
                    key: "k".into(),
                }),
            })
            .await
            .map(drop)
            .map_err(|s| format!("{s:?}")),
    };
    assert!(
        rogue_result.is_err(),
        "an untrusted certificate was accepted"
    );

    // A good operator certificate with a wrong API key: the key is judged, and refused.
    let channel = tls_channel(&addr, &pki.ca.pem, Some(&pki.ops))
        .await
        .unwrap();
    let status = GateAdminServiceClient::new(channel.clone())
        .list_unresolved(authed(pb::ListUnresolvedRequest::default(), Some("wrong")))
        .await
        .unwrap_err();
    expect_error(&status, Code::Unauthenticated, "UNAUTHENTICATED");
    // Health needs no credential (Kubernetes probes it).
    let health = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap();
    assert_eq!(health.into_inner().status, 1);
}

/// Three serving threads behind one TLS listener: three connections, one dealt to each thread,
/// each completes the handshake, gets health without a credential and has a wrong API key refused.
#[tokio::test]
async fn tls_and_credentials_hold_on_every_serving_thread() {
    let pki = Pki::new();
    let settings = mutual_tls(&pki);
    let options = ServerOptions {
        tls: Some(settings),
        serving_threads: 3,
        ..defaults::server()
    };
    let policies = config(&principals_toml(""));
    let gate = TestGate::serve_with_options(backend(Kind::Embedded).await, policies, options).await;
    let addr = gate.addr.to_string();
    for connection in 0..3 {
        let channel = tls_channel(&addr, &pki.ca.pem, Some(&pki.ops))
            .await
            .unwrap();
        let health = HealthClient::new(channel.clone())
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap();
        assert_eq!(health.into_inner().status, 1, "connection {connection}");
        let status = GateAdminServiceClient::new(channel)
            .list_unresolved(authed(pb::ListUnresolvedRequest::default(), Some("wrong")))
            .await
            .unwrap_err();
        expect_error(&status, Code::Unauthenticated, "UNAUTHENTICATED");
    }
}

#[test]
fn an_open_non_loopback_listener_is_refused_unless_insecure() {
    let dir = TempDir::new().unwrap();
    let out = oncegate_command()
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

    let open = LoggedGate::start(&dir, &["--listen", "0.0.0.0:0", "--insecure"]);
    assert!(open.addr.starts_with("0.0.0.0:"));
    assert!(open.log().contains("INSECURE"), "{}", open.log());
    drop(open);

    let config = write_file(dir.path(), "p.toml", &principals_toml(""));
    let guarded = LoggedGate::start(
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
