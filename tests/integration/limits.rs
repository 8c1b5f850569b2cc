//! Limits that protect the gate: a principal's rate limit (RESOURCE_EXHAUSTED with RetryInfo, each
//! principal its own budget), the message size bound (refused before the service), and the
//! embedded store's call deadline (a stuck writer answers STORE_UNAVAILABLE in time).

use std::time::Duration;

use oncegate_config::defaults;
use oncegate_domain::ActionKey;
use oncegate_gate::policy::Policies;
use oncegate_grpc::server::ServerOptions;
use oncegate_proto::{self as pb};
use tonic::Code;
use tonic_types::StatusExt;

use crate::support::{
    Kind, OPS_KEY, TestGate, WORKER_KEY, authed, backend, config, expect_error, principals_toml,
    store_request, token_request,
};

#[tokio::test]
async fn rate_limit_answers_resource_exhausted_with_retry_info() {
    let policies = config(&principals_toml("rate_limit_per_second = 1\nburst = 2"));
    let gate = TestGate::start_with(Kind::Embedded, policies).await;
    let mut client = gate.client().await;
    let get = || {
        authed(
            pb::GetActionRequest {
                action: Some(pb::ActionRef {
                    scope: Some(pb::Scope {
                        agent_id: "billing-1".into(),
                        run_id: "r".into(),
                    }),
                    key: "k".into(),
                }),
            },
            Some(WORKER_KEY),
        )
    };
    client.get_action(get()).await.unwrap();
    client.get_action(get()).await.unwrap();
    let status = client.get_action(get()).await.unwrap_err();
    let meta = expect_error(&status, Code::ResourceExhausted, "RATE_LIMITED");
    assert!(meta["retry_after_ms"].parse::<u64>().unwrap() <= 1000);
    let delay = status
        .get_error_details()
        .retry_info()
        .unwrap()
        .retry_delay
        .unwrap();
    assert!(delay > Duration::ZERO && delay <= Duration::from_secs(1));
    // Another principal has its own budget (the operator has none).
    for _ in 0..5 {
        client
            .get_action(authed(get().into_inner(), Some(OPS_KEY)))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn oversized_messages_are_refused_before_the_service() {
    let options = ServerOptions {
        max_message_bytes: 4096,
        ..defaults::server()
    };
    let gate =
        TestGate::serve_with_options(backend(Kind::Embedded).await, Policies::default(), options)
            .await;
    let mut client = gate.client().await;
    let big = format!(r#"{{"a":"{}"}}"#, "x".repeat(8192));
    let status = client
        .request_token(token_request("a", "r", "x", &big))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    // A request within the bound is served.
    client
        .request_token(token_request("a", "r", "x", r#"{"a":1}"#))
        .await
        .unwrap();
}

#[tokio::test]
async fn embedded_store_calls_have_a_deadline() {
    let dir = tempfile::TempDir::new().unwrap();
    // A clock that takes half a second: the writer is as slow as a stuck disk.
    let slow: oncegate_store::embedded::Clock = std::sync::Arc::new(|| {
        std::thread::sleep(Duration::from_millis(500));
        1_700_000_000_000
    });
    let store =
        oncegate_store::embedded::EmbeddedStore::open(dir.path(), slow, Duration::from_millis(50))
            .unwrap();
    let started = std::time::Instant::now();
    let result = store.get(&ActionKey::new("a", "r", "k")).await;
    assert!(
        matches!(result, Err(oncegate_store::StoreError::Unavailable { .. })),
        "{result:?}"
    );
    assert!(started.elapsed() < Duration::from_millis(400));
}

/// The embedded store has no replicas: a step asked for at a durability level above 0 fails closed
/// (`Unavailable`, naming why) before anything is written; start-up refuses such a configuration,
/// and this is the store's own last line.
#[tokio::test]
async fn the_embedded_store_refuses_a_durability_level_before_writing_anything() {
    use oncegate_domain::ledger::State;
    use oncegate_store::StoreError;

    let backend = backend(Kind::Embedded).await;
    let store = &backend.store;
    let key = ActionKey::new("a", "r", "k");
    let req = store_request("v1-k", "t1");
    let needs_replicas = |result: &Result<_, StoreError>, level: u32| {
        matches!(result, Err(StoreError::Unavailable { what, .. })
            if what.contains(&format!("durability level {level} needs Redis replicas")))
    };

    let refused = store.request_token(&key, &req, 1).await.map(|_| ());
    assert!(needs_replicas(&refused, 1), "{refused:?}");
    let view = store.get(&key).await.unwrap().result.unwrap();
    assert_eq!(view.state, State::Absent, "nothing was written: {view:?}");

    store.request_token(&key, &req, 0).await.unwrap();
    let refused = store.complete(&key, "t1", b"ok", 2, None).await.map(|_| ());
    assert!(needs_replicas(&refused, 2), "{refused:?}");
    let view = store.get(&key).await.unwrap().result.unwrap();
    assert_eq!(view.state, State::Authorized, "the grant was not completed");
}
