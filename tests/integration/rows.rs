//! The rows of docs/CONTRACT.md's worker transitions and error table, through real gRPC, on every
//! store (embedded; Redis standalone, Cluster and Sentinel).

use std::time::Duration;

use oncegate::{
    gate::policy::Policies,
    pb::{self, action_gate_service_client::ActionGateServiceClient},
};
use tonic::{Code, transport::Channel};
use tonic_types::StatusExt;

use crate::support::{Kind, TestGate, expect_error, on_stores, token_request};

type Client = ActionGateServiceClient<Channel>;

const PAY: &str = r#"{"amount":100,"currency":"EUR","to":"DE89","memo":"rent"}"#;

fn policies() -> Policies {
    crate::support::policies(
        r#"
        [actions."payments.transfer"]
        key_fields = ["/amount", "/currency", "/to"]
        [actions."payments.regrant"]
        on_expiry = "regrant"
        [actions."strict.*"]
        "#,
    )
}

fn ms(d: u64) -> Option<prost_types::Duration> {
    Some(prost_types::Duration {
        seconds: (d / 1000) as i64,
        nanos: ((d % 1000) * 1_000_000) as i32,
    })
}

async fn grant(client: &mut Client, req: pb::RequestTokenRequest) -> (pb::ActionRef, pb::Grant) {
    let resp = client.request_token(req).await.unwrap().into_inner();
    assert_eq!(resp.decision(), pb::Decision::Granted, "{resp:?}");
    (resp.action.unwrap(), resp.grant.unwrap())
}

async fn complete(
    client: &mut Client,
    action: &pb::ActionRef,
    token: &str,
    receipt: &[u8],
) -> Result<pb::Completion, tonic::Status> {
    client
        .complete(pb::CompleteRequest {
            action: Some(action.clone()),
            token: token.into(),
            receipt: receipt.to_vec(),
        })
        .await
        .map(|r| r.into_inner().completion.unwrap())
}

async fn release(
    client: &mut Client,
    action: &pb::ActionRef,
    token: &str,
) -> Result<u64, tonic::Status> {
    client
        .release(pb::ReleaseRequest {
            action: Some(action.clone()),
            token: token.into(),
            reason: pb::ReleaseReason::DefiniteFailure as i32,
        })
        .await
        .map(|r| r.into_inner().fencing)
}

async fn state(client: &mut Client, action: &pb::ActionRef) -> pb::GetActionResponse {
    client
        .get_action(pb::GetActionRequest {
            action: Some(action.clone()),
        })
        .await
        .unwrap()
        .into_inner()
}

async fn absent_grants_then_complete_replays(kind: Kind) {
    let gate = TestGate::start_with(kind, policies()).await;
    let client = &mut gate.client().await;
    let req = token_request("agent", "run-1", "payments.transfer", PAY);
    let (action, g) = grant(client, req.clone()).await;
    assert_eq!(g.fencing, 1);
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
    assert_eq!(replay.fencing, 1);
    assert!(replay.completed_at.is_some());
    let view = state(client, &action).await;
    assert_eq!(view.state(), pb::ActionState::Completed);
    assert_eq!(view.completion.unwrap().receipt, b"paid #1");
}
on_stores!(absent_grants_then_complete_replays: embedded, redis, cluster, sentinel);

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
    live_lease_same_holder_gets_same_token_others_in_progress: embedded, redis, cluster, sentinel
);

async fn expired_lease_reconcile_then_late_complete(kind: Kind) {
    let gate = TestGate::start_with(kind, policies()).await;
    let client = &mut gate.client().await;
    let mut req = token_request("agent", "run-3", "payments.transfer", PAY);
    req.lease_ttl = ms(150);
    let (action, g) = grant(client, req.clone()).await;
    tokio::time::sleep(Duration::from_millis(250)).await;
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
    assert_eq!(meta["fencing"], "1");
    assert!(meta.contains_key("lease_expired_at"));
    // The effect happened after all: a late Complete with that token is accepted.
    let done = complete(client, &action, &g.token, b"late").await.unwrap();
    assert_eq!(done.receipt, b"late");
}
on_stores!(expired_lease_reconcile_then_late_complete: embedded, redis, cluster, sentinel);

async fn expired_lease_regrant_and_double_execution(kind: Kind) {
    let gate = TestGate::start_with(kind, policies()).await;
    let client = &mut gate.client().await;
    let mut req = token_request("agent", "run-4", "payments.regrant", r#"{"n":1}"#);
    req.lease_ttl = ms(150);
    let (action, old) = grant(client, req.clone()).await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    req.lease_ttl = None;
    let (_, new) = grant(client, req).await;
    assert_eq!(new.fencing, 2);
    assert_ne!(new.token, old.token);
    // The superseded holder completes late: recorded (the effect happened)...
    let done = complete(client, &action, &old.token, b"old holder")
        .await
        .unwrap();
    assert_eq!(done.fencing, 1);
    // ...and the newer holder is told someone else completed it.
    let status = complete(client, &action, &new.token, b"new holder")
        .await
        .unwrap_err();
    let meta = expect_error(&status, Code::FailedPrecondition, "COMPLETED_BY_OTHER");
    assert_eq!(meta["fencing"], "1");
}
on_stores!(expired_lease_regrant_and_double_execution: embedded, redis, cluster, sentinel);

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
    changed_key_fields_under_one_idempotency_key_are_refused: embedded, redis, cluster, sentinel
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
on_stores!(token_errors: embedded, redis, cluster, sentinel);

async fn release_keeps_fencing_and_completed_cannot_be_released(kind: Kind) {
    let gate = TestGate::start_with(kind, policies()).await;
    let client = &mut gate.client().await;
    let req = token_request("agent", "run-7", "x", r#"{"a":2}"#);
    let (action, g1) = grant(client, req.clone()).await;
    assert_eq!(release(client, &action, &g1.token).await.unwrap(), 1);
    assert_eq!(
        state(client, &action).await.state(),
        pb::ActionState::Absent
    );
    let (_, g2) = grant(client, req).await;
    assert_eq!(g2.fencing, 2, "the next grant gets a higher fencing number");
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
    release_keeps_fencing_and_completed_cannot_be_released: embedded, redis, cluster, sentinel
);

async fn extend_lease_for_the_holder_only(kind: Kind) {
    let gate = TestGate::start_with(kind, policies()).await;
    let client = &mut gate.client().await;
    let mut req = token_request("agent", "run-8", "x", r#"{"a":3}"#);
    req.lease_ttl = ms(200);
    let (action, g) = grant(client, req.clone()).await;
    let extended = client
        .extend_lease(pb::ExtendLeaseRequest {
            action: Some(action.clone()),
            token: g.token.clone(),
            ttl: ms(60_000),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(extended.lease_expires_at.unwrap().seconds > g.lease_expires_at.unwrap().seconds + 30);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Still live thanks to the heartbeat.
    let status = client.request_token(req).await.unwrap_err();
    expect_error(&status, Code::Aborted, "IDEMPOTENCY_IN_PROGRESS");
    let status = client
        .extend_lease(pb::ExtendLeaseRequest {
            action: Some(action.clone()),
            token: "someone-else".into(),
            ttl: ms(1000),
        })
        .await
        .unwrap_err();
    expect_error(&status, Code::FailedPrecondition, "TOKEN_MISMATCH");
}
on_stores!(extend_lease_for_the_holder_only: embedded, redis, cluster, sentinel);

async fn scopes_are_unambiguous(kind: Kind) {
    let gate = TestGate::start_with(kind, policies()).await;
    let client = &mut gate.client().await;
    let (a, _) = grant(client, token_request("a::b", "c", "x", r#"{"k":1}"#)).await;
    let (b, _) = grant(client, token_request("a", "b::c", "x", r#"{"k":1}"#)).await;
    assert_eq!(a.key, b.key, "same fingerprint");
    assert_ne!(a.scope, b.scope);
}
on_stores!(scopes_are_unambiguous: embedded, redis, cluster, sentinel);

async fn bad_input_is_refused_and_creates_nothing(kind: Kind) {
    let gate = TestGate::start_with(kind, policies()).await;
    let client = &mut gate.client().await;
    let long = "x".repeat(257);
    let deep = format!(
        "{}1{}",
        r#"{"a":"#.to_owned() + &"[".repeat(32),
        "]".repeat(32) + "}"
    );
    let big = format!(r#"{{"a":"{}"}}"#, "x".repeat(64 * 1024));
    type Mutation = Box<dyn Fn(&mut pb::RequestTokenRequest)>;
    let cases: Vec<(&str, Mutation)> = vec![
        (
            "scope.agent_id",
            Box::new(|r| r.scope.as_mut().unwrap().agent_id.clear()),
        ),
        (
            "scope.run_id",
            Box::new(move |r| r.scope.as_mut().unwrap().run_id = "y".repeat(257)),
        ),
        ("action", Box::new(|r| r.action.clear())),
        ("action", Box::new(move |r| r.action = long.clone())),
        (
            "params_json",
            Box::new(|r| r.params_json = "not json".into()),
        ),
        ("params_json", Box::new(|r| r.params_json = "[1,2]".into())),
        (
            "params_json",
            Box::new(|r| r.params_json = r#"{"a":1,"a":2}"#.into()),
        ),
        (
            "params_json",
            Box::new(|r| r.params_json = r#"{"amount":9007199254740993}"#.into()),
        ),
        (
            "params_json",
            Box::new(move |r| r.params_json = deep.clone()),
        ),
        (
            "params_json",
            Box::new(move |r| r.params_json = big.clone()),
        ),
        (
            "lease_ttl",
            Box::new(|r| {
                r.lease_ttl = Some(prost_types::Duration {
                    seconds: 0,
                    nanos: 0,
                })
            }),
        ),
        (
            "lease_ttl",
            Box::new(|r| {
                r.lease_ttl = Some(prost_types::Duration {
                    seconds: -5,
                    nanos: 0,
                })
            }),
        ),
        (
            "lease_ttl",
            Box::new(|r| {
                r.lease_ttl = Some(prost_types::Duration {
                    seconds: 90_000,
                    nanos: 0,
                })
            }),
        ),
        ("scope", Box::new(|r| r.scope = None)),
    ];
    for (field, mutate) in cases {
        let mut req = token_request("agent", "run-bad", "x", r#"{"a":1}"#);
        mutate(&mut req);
        let status = client.request_token(req).await.unwrap_err();
        let meta = expect_error(&status, Code::InvalidArgument, "INVALID_REQUEST");
        assert_eq!(meta["field"], field, "{status:?}");
        let violations = status
            .get_error_details()
            .bad_request()
            .unwrap()
            .field_violations
            .clone();
        assert_eq!(violations.len(), 1);
        assert_eq!(violations[0].field, field);
    }
    // Exactly at the limits is fine; nothing of the refused requests was created.
    let ok = token_request("agent", "run-bad", "x", r#"{"a":1}"#);
    let (action, g) = grant(client, ok).await;
    assert_eq!(g.fencing, 1);
    let status = complete(client, &action, &g.token, &vec![0u8; 64 * 1024 + 1])
        .await
        .unwrap_err();
    let meta = expect_error(&status, Code::InvalidArgument, "INVALID_REQUEST");
    assert_eq!(meta["field"], "receipt");
    assert_eq!(
        state(client, &action).await.state(),
        pb::ActionState::Authorized
    );
}
on_stores!(bad_input_is_refused_and_creates_nothing: embedded, redis, cluster, sentinel);

async fn strict_mode_refuses_actions_without_policy(kind: Kind) {
    let strict = crate::support::policies("strict = true\n[actions.\"known\"]\n");
    let gate = TestGate::start_with(kind, strict).await;
    let mut client = gate.client().await;
    let status = client
        .request_token(token_request("a", "r", "unknown", "{}"))
        .await
        .unwrap_err();
    let meta = expect_error(&status, Code::InvalidArgument, "INVALID_REQUEST");
    assert_eq!(meta["field"], "action");
    grant(&mut client, token_request("a", "r", "known", "{}")).await;
}
on_stores!(strict_mode_refuses_actions_without_policy: embedded, redis);
