//! The rows of docs/CONTRACT.md's worker transitions and error table, through real gRPC, on every
//! store (embedded; Redis standalone, Cluster and Sentinel). Refused input is in `validation.rs`.
//! Leases end on the store's time: the embedded store's test clock moves past them at once, Redis
//! is waited out.

use std::time::Duration;

use oncegate_gate::policy::Policies;
use oncegate_proto::{self as pb};
use tonic::Code;
use tonic_types::StatusExt;

use crate::support::{
    Kind, TestGate, complete, expect_error, grant, on_stores, release, state, token_request, ttl_ms,
};

const PAY: &str = r#"{"amount":100,"currency":"EUR","to":"DE89","memo":"rent"}"#;

fn policies() -> Policies {
    crate::support::policies(
        r#"
        [limits]
        min_lease_ttl_seconds = 0.05
        [actions."payments.transfer"]
        key_fields = ["/amount", "/currency", "/to"]
        [actions."payments.regrant"]
        on_expiry = "regrant"
        [actions."strict.*"]
        "#,
    )
}

async fn absent_grants_then_complete_replays(kind: Kind) {
    let gate = TestGate::start_with(kind, policies()).await;
    let client = &mut gate.client().await;
    let req = token_request("agent", "run-1", "payments.transfer", PAY);
    let (action, g) = grant(client, req.clone()).await;
    assert!(
        g.fencing > 1_000_000_000_000_000,
        "the store clock in µs: {}",
        g.fencing
    );
    assert!(
        g.token.len() >= 32,
        "token carries at least 122 random bits"
    );
    assert!(g.provider_key.starts_with("og-"));
    assert!(g.lease_expires_at.is_some());
    assert!(
        action.key.starts_with("v1-"),
        "keyed by fingerprint without an idempotency key"
    );
    assert_eq!(
        state(client, &action).await.state(),
        pb::ActionState::Authorized
    );

    let done = complete(client, &action, &g.token, b"paid #1")
        .await
        .unwrap();
    assert_eq!(done.receipt, b"paid #1");
    // Repeating Complete is a no-op returning the stored receipt.
    let again = complete(client, &action, &g.token, b"something else")
        .await
        .unwrap();
    assert_eq!(again, done);

    // Same action again, even with keys reordered, whitespace and 100.0: the original receipt.
    let retry = token_request(
        "agent",
        "run-1",
        "payments.transfer",
        r#"{ "to": "DE89", "currency": "EUR", "amount": 100.0, "memo": "rewritten by the model" }"#,
    );
    let resp = client.request_token(retry).await.unwrap().into_inner();
    assert_eq!(resp.decision(), pb::Decision::AlreadyCompleted);
    assert_eq!(resp.action.unwrap(), action);
    let replay = resp.completion.unwrap();
    assert_eq!(replay.receipt, b"paid #1");
    assert_eq!(replay.token, g.token);
    assert_eq!(replay.fencing, g.fencing);
    assert!(replay.completed_at.is_some());
    let view = state(client, &action).await;
    assert_eq!(view.state(), pb::ActionState::Completed);
    assert_eq!(view.completion.unwrap().receipt, b"paid #1");
}
on_stores!(absent_grants_then_complete_replays: embedded, redis, cluster, sentinel, postgres);

async fn live_lease_same_holder_gets_same_token_others_in_progress(kind: Kind) {
    let gate = TestGate::start_with(kind, policies()).await;
    let client = &mut gate.client().await;
    let mut req = token_request("agent", "run-2", "email.send", r#"{"to":"a@b.c"}"#);
    req.holder = "worker-1".into();
    let (_, first) = grant(client, req.clone()).await;
    let resp = client
        .request_token(req.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.decision(), pb::Decision::Granted);
    assert!(resp.redelivered);
    assert_eq!(resp.grant.unwrap().token, first.token);

    for holder in ["worker-2", ""] {
        let mut other = req.clone();
        other.holder = holder.into();
        let status = client.request_token(other).await.unwrap_err();
        let meta = expect_error(&status, Code::Aborted, "IDEMPOTENCY_IN_PROGRESS");
        let retry = status
            .get_error_details()
            .retry_info()
            .unwrap()
            .retry_delay
            .unwrap();
        assert!(retry > Duration::ZERO && retry <= Duration::from_secs(300));
        assert!(meta["retry_after_ms"].parse::<u64>().unwrap() > 0);
    }
}
on_stores!(
    live_lease_same_holder_gets_same_token_others_in_progress: embedded, redis, cluster, sentinel, postgres
);

async fn expired_lease_reconcile_then_late_complete(kind: Kind) {
    let gate = TestGate::start_with_test_clock(kind, policies()).await;
    let client = &mut gate.client().await;
    let mut req = token_request("agent", "run-3", "payments.transfer", PAY);
    req.lease_ttl = ttl_ms(150);
    let (action, g) = grant(client, req.clone()).await;
    gate.time.pass_beyond(g.lease_expires_at.unwrap()).await;
    assert_eq!(
        state(client, &action).await.state(),
        pb::ActionState::Expired
    );
    let status = client.request_token(req).await.unwrap_err();
    let meta = expect_error(
        &status,
        Code::FailedPrecondition,
        "LEASE_EXPIRED_UNRESOLVED",
    );
    assert_eq!(meta["token"], g.token);
    assert_eq!(meta["fencing"], g.fencing.to_string());
    assert!(meta.contains_key("lease_expired_at"));
    // ...and the action it names, with the key to ask the provider with.
    assert_eq!(
        (&meta["agent_id"], &meta["run_id"], &meta["key"]),
        (&"agent".to_owned(), &"run-3".to_owned(), &action.key)
    );
    assert_eq!(meta["provider_key"], g.provider_key);
    assert!(status.message().contains(&g.provider_key), "{status:?}");
    // GetAction shows the provider key to the agent, never the token (operators only).
    let view = state(client, &action).await;
    assert_eq!(view.provider_key, g.provider_key);
    assert!(view.token.is_empty());
    // The effect happened after all: a late Complete with that token is accepted.
    let done = complete(client, &action, &g.token, b"late").await.unwrap();
    assert_eq!(done.receipt, b"late");
}
on_stores!(expired_lease_reconcile_then_late_complete: embedded, redis, cluster, sentinel, postgres);

async fn expired_lease_regrant_and_double_execution(kind: Kind) {
    let gate = TestGate::start_with_test_clock(kind, policies()).await;
    let client = &mut gate.client().await;
    let mut req = token_request("agent", "run-4", "payments.regrant", r#"{"n":1}"#);
    req.lease_ttl = ttl_ms(150);
    let (action, old) = grant(client, req.clone()).await;
    gate.time.pass_beyond(old.lease_expires_at.unwrap()).await;
    req.lease_ttl = None;
    let (_, new) = grant(client, req).await;
    assert_eq!(new.fencing, old.fencing + 1);
    assert_ne!(new.token, old.token);
    // The superseded holder completes late: recorded (the effect happened)...
    let done = complete(client, &action, &old.token, b"old holder")
        .await
        .unwrap();
    assert_eq!(done.fencing, old.fencing);
    // ...and the newer holder is told someone else completed it.
    let status = complete(client, &action, &new.token, b"new holder")
        .await
        .unwrap_err();
    let meta = expect_error(&status, Code::FailedPrecondition, "COMPLETED_BY_OTHER");
    assert_eq!(meta["fencing"], old.fencing.to_string());
}
on_stores!(expired_lease_regrant_and_double_execution: embedded, redis, cluster, sentinel, postgres);

async fn changed_key_fields_under_one_idempotency_key_are_refused(kind: Kind) {
    let gate = TestGate::start_with(kind, policies()).await;
    let client = &mut gate.client().await;
    let mut req = token_request("agent", "run-5", "payments.transfer", PAY);
    req.idempotency_key = "order-42".into();
    let (action, g) = grant(client, req.clone()).await;
    assert_eq!(action.key, "order-42");
    let mut changed = req.clone();
    changed.params_json = r#"{"amount":900,"currency":"EUR","to":"DE89","memo":"rent"}"#.into();
    // Refused while authorized, and after completion: never a grant, never the old receipt.
    for round in 0..2 {
        let status = client.request_token(changed.clone()).await.unwrap_err();
        let meta = expect_error(&status, Code::FailedPrecondition, "IDEMPOTENCY_KEY_REUSED");
        assert_eq!(meta["differing_fields"], "/amount", "round {round}");
        assert!(
            !status.message().contains("900") && !format!("{meta:?}").contains("900"),
            "values never leak"
        );
        if round == 0 {
            complete(client, &action, &g.token, b"ok").await.unwrap();
        }
    }
    // A memo change is not a key field: replay.
    let mut memo = req.clone();
    memo.params_json = r#"{"amount":100,"currency":"EUR","to":"DE89","memo":"other"}"#.into();
    let resp = client.request_token(memo).await.unwrap().into_inner();
    assert_eq!(resp.decision(), pb::Decision::AlreadyCompleted);
}
on_stores!(
    changed_key_fields_under_one_idempotency_key_are_refused: embedded, redis, cluster, sentinel, postgres
);

async fn token_errors(kind: Kind) {
    let gate = TestGate::start_with(kind, policies()).await;
    let client = &mut gate.client().await;
    let req = token_request("agent", "run-6", "x", r#"{"a":1}"#);
    let (action, g) = grant(client, req).await;
    let status = complete(client, &action, "not-a-token", b"")
        .await
        .unwrap_err();
    expect_error(&status, Code::FailedPrecondition, "TOKEN_MISMATCH");
    let status = release(client, &action, "not-a-token").await.unwrap_err();
    expect_error(&status, Code::FailedPrecondition, "TOKEN_MISMATCH");
    let mut nowhere = action.clone();
    nowhere.key = "no-such-action".into();
    let status = complete(client, &nowhere, &g.token, b"").await.unwrap_err();
    expect_error(&status, Code::FailedPrecondition, "TOKEN_UNKNOWN");
    assert_eq!(
        state(client, &nowhere).await.state(),
        pb::ActionState::Absent
    );
}
on_stores!(token_errors: embedded, redis, cluster, sentinel, postgres);

async fn release_keeps_fencing_and_completed_cannot_be_released(kind: Kind) {
    let gate = TestGate::start_with(kind, policies()).await;
    let client = &mut gate.client().await;
    let req = token_request("agent", "run-7", "x", r#"{"a":2}"#);
    let (action, g1) = grant(client, req.clone()).await;
    assert_eq!(
        release(client, &action, &g1.token).await.unwrap(),
        g1.fencing
    );
    assert_eq!(
        state(client, &action).await.state(),
        pb::ActionState::Absent
    );
    let (_, g2) = grant(client, req).await;
    assert_eq!(
        g2.fencing,
        g1.fencing + 1,
        "the next grant gets a higher fencing number"
    );
    complete(client, &action, &g2.token, b"done").await.unwrap();
    let status = release(client, &action, &g2.token).await.unwrap_err();
    expect_error(&status, Code::FailedPrecondition, "ALREADY_COMPLETED");
    let status = client
        .release(pb::ReleaseRequest {
            action: Some(action.clone()),
            token: g2.token.clone(),
            reason: pb::ReleaseReason::Unspecified as i32,
        })
        .await
        .unwrap_err();
    expect_error(&status, Code::InvalidArgument, "INVALID_REQUEST");
}
on_stores!(
    release_keeps_fencing_and_completed_cannot_be_released: embedded, redis, cluster, sentinel, postgres
);

async fn extend_lease_for_the_holder_only(kind: Kind) {
    let gate = TestGate::start_with_test_clock(kind, policies()).await;
    let client = &mut gate.client().await;
    let mut req = token_request("agent", "run-8", "x", r#"{"a":3}"#);
    req.lease_ttl = ttl_ms(200);
    let (action, g) = grant(client, req.clone()).await;
    let extended = client
        .extend_lease(pb::ExtendLeaseRequest {
            action: Some(action.clone()),
            token: g.token.clone(),
            ttl: ttl_ms(60_000),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(extended.lease_expires_at.unwrap().seconds > g.lease_expires_at.unwrap().seconds + 30);
    // Past the original lease: still live thanks to the heartbeat.
    gate.time.pass_beyond(g.lease_expires_at.unwrap()).await;
    let status = client.request_token(req).await.unwrap_err();
    expect_error(&status, Code::Aborted, "IDEMPOTENCY_IN_PROGRESS");
    let status = client
        .extend_lease(pb::ExtendLeaseRequest {
            action: Some(action.clone()),
            token: "someone-else".into(),
            ttl: ttl_ms(1000),
        })
        .await
        .unwrap_err();
    expect_error(&status, Code::FailedPrecondition, "TOKEN_MISMATCH");
}
on_stores!(extend_lease_for_the_holder_only: embedded, redis, cluster, sentinel, postgres);

async fn scopes_are_unambiguous(kind: Kind) {
    let gate = TestGate::start_with(kind, policies()).await;
    let client = &mut gate.client().await;
    let (a, _) = grant(client, token_request("a::b", "c", "x", r#"{"k":1}"#)).await;
    let (b, _) = grant(client, token_request("a", "b::c", "x", r#"{"k":1}"#)).await;
    assert_eq!(a.key, b.key, "same fingerprint");
    assert_ne!(a.scope, b.scope);
}
on_stores!(scopes_are_unambiguous: embedded, redis, cluster, sentinel, postgres);
