//! Never twice, never forgotten: the sequences of ordinary calls that used to let an
//! action run a second time, each through real gRPC on every store. Eviction and authorization,
//! which concern the deployment, are in `eviction.rs` and `holders.rs`.

use oncegate_proto::{self as pb, gate_admin_service_client::GateAdminServiceClient};
use tonic::Code;

use crate::support::{
    Kind, OPS_KEY, TestGate, WORKER_KEY, authed, complete, config, expect_error, grant, millis_of,
    on_stores, principals_toml, release, state, token_request, ttl_ms,
};

const PAY: &str = r#"{"amount":100,"currency":"EUR","to":"DE89"}"#;

/// A timestamp `ms` after `at`.
fn after(at: prost_types::Timestamp, ms: i64) -> prost_types::Timestamp {
    let at = millis_of(at) + ms;
    prost_types::Timestamp {
        seconds: at.div_euclid(1000),
        nanos: (at.rem_euclid(1000) * 1_000_000) as i32,
    }
}

/// A crash nobody reconciles: a worker crashes after the bank charged; nobody reconciles. Long past lease end
/// plus retention the action is still EXPIRED, still refused, still listed, and a late Complete
/// is still accepted; only then does retention start, and a grant after it gets a higher fencing
/// number than every earlier one.
async fn an_unresolved_lease_outlives_its_retention(kind: Kind) {
    let file = config(&format!(
        "[limits]\nmin_lease_ttl_seconds = 0.05\n{}\n[actions.\"payments.transfer\"]\nretention_seconds = 0.3\n",
        principals_toml("")
    ));
    let gate = TestGate::start_with_test_clock(kind, file).await;
    let mut worker = gate.client().await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", gate.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut admin = GateAdminServiceClient::new(channel);
    let mut req = token_request("billing-1", "run-1", "payments.transfer", PAY);
    req.lease_ttl = ttl_ms(100);
    let resp = worker
        .request_token(authed(req.clone(), Some(WORKER_KEY)))
        .await
        .unwrap()
        .into_inner();
    let (action, g) = (resp.action.unwrap(), resp.grant.unwrap());

    // Lease end + retention + more: the record would have expired before; it must not.
    gate.time
        .pass_beyond(after(g.lease_expires_at.unwrap(), 700))
        .await;
    let view = worker
        .get_action(authed(
            pb::GetActionRequest {
                action: Some(action.clone()),
            },
            Some(WORKER_KEY),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(view.state(), pb::ActionState::Expired);
    assert_eq!(view.fencing, g.fencing);
    let status = worker
        .request_token(authed(req.clone(), Some(WORKER_KEY)))
        .await
        .unwrap_err();
    let meta = expect_error(
        &status,
        Code::FailedPrecondition,
        "LEASE_EXPIRED_UNRESOLVED",
    );
    assert_eq!(meta["token"], g.token);
    let listed = admin
        .list_unresolved(authed(
            pb::ListUnresolvedRequest {
                agent_id: "billing-1".into(),
                ..Default::default()
            },
            Some(OPS_KEY),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.actions.len(), 1, "{listed:?}");
    assert_eq!(listed.actions[0].action.as_ref(), Some(&action));

    // The bank did charge: the late Complete is recorded, and retention starts now.
    let done = worker
        .complete(authed(
            pb::CompleteRequest {
                action: Some(action.clone()),
                token: g.token.clone(),
                receipt: b"tx-1".to_vec(),
            },
            Some(WORKER_KEY),
        ))
        .await
        .unwrap()
        .into_inner()
        .completion
        .unwrap();
    assert_eq!(done.fencing, g.fencing);
    // Past that retention the action is forgotten, as a settled one may be; a new grant never
    // reuses a fencing number.
    gate.time
        .pass_beyond(after(done.completed_at.unwrap(), 350))
        .await;
    let resp = worker
        .request_token(authed(req, Some(WORKER_KEY)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.decision(), pb::Decision::Granted);
    assert!(resp.grant.unwrap().fencing > g.fencing);
}
on_stores!(an_unresolved_lease_outlives_its_retention: embedded, redis, cluster, sentinel, postgres);

fn regrant_policies(extra_limits: &str) -> oncegate_gate::policy::Policies {
    crate::support::policies(&format!(
        "[limits]\nmin_lease_ttl_seconds = 0.05\n{extra_limits}\n[actions.\"pay\"]\non_expiry = \"regrant\"\n"
    ))
}

/// A superseded grant's late success: T1 expires while its worker waits on the bank; T2 is granted and fails definitely
/// (Release); T1's payment succeeds. Its Complete is recorded and every later request replays it.
async fn a_superseded_grant_survives_the_newer_release(kind: Kind) {
    let gate = TestGate::start_with_test_clock(kind, regrant_policies("")).await;
    let client = &mut gate.client().await;
    let mut req = token_request("agent", "run", "pay", PAY);
    req.idempotency_key = "invoice-9".into();
    req.lease_ttl = ttl_ms(100);
    let (action, t1) = grant(client, req.clone()).await;
    gate.time.pass_beyond(t1.lease_expires_at.unwrap()).await;
    let (_, t2) = grant(client, req.clone()).await;
    assert_eq!(t2.fencing, t1.fencing + 1);
    release(client, &action, &t2.token).await.unwrap();
    // T1's outcome is still unknown: the action is unresolved, not absent.
    let view = state(client, &action).await;
    assert_eq!(view.state(), pb::ActionState::Expired);
    assert_eq!(view.fencing, t1.fencing);
    let done = complete(client, &action, &t1.token, b"tx-T1")
        .await
        .unwrap();
    assert_eq!(done.fencing, t1.fencing);
    let resp = client.request_token(req).await.unwrap().into_inner();
    assert_eq!(resp.decision(), pb::Decision::AlreadyCompleted);
    let replay = resp.completion.unwrap();
    assert_eq!(
        (replay.receipt, replay.fencing),
        (b"tx-T1".to_vec(), t1.fencing)
    );
}
on_stores!(a_superseded_grant_survives_the_newer_release: embedded, redis, cluster, sentinel, postgres);

/// Superseded grants are bounded: a lease below the minimum is refused, and superseded grants stop at the limit with
/// LEASE_EXPIRED_UNRESOLVED instead of a grant (none dropped).
async fn superseded_grants_are_bounded(kind: Kind) {
    let gate =
        TestGate::start_with_test_clock(kind, regrant_policies("max_superseded_grants = 2")).await;
    let client = &mut gate.client().await;
    let mut req = token_request("agent", "run", "pay", PAY);
    req.lease_ttl = ttl_ms(1);
    let status = client.request_token(req.clone()).await.unwrap_err();
    expect_error(&status, Code::InvalidArgument, "INVALID_REQUEST");
    req.lease_ttl = ttl_ms(100);
    let (action, oldest) = grant(client, req.clone()).await;
    let mut last = oldest.clone();
    for _ in 0..2 {
        gate.time.pass_beyond(last.lease_expires_at.unwrap()).await;
        last = grant(client, req.clone()).await.1;
    }
    gate.time.pass_beyond(last.lease_expires_at.unwrap()).await;
    let status = client.request_token(req.clone()).await.unwrap_err();
    let meta = expect_error(
        &status,
        Code::FailedPrecondition,
        "LEASE_EXPIRED_UNRESOLVED",
    );
    assert_eq!(meta["token"], last.token);
    assert_eq!(
        state(client, &action).await.state(),
        pb::ActionState::Expired
    );
    // None was dropped at the cap: the oldest superseded holder can still report, and its
    // outcome is what every later request replays.
    let done = complete(client, &action, &oldest.token, b"tx-oldest")
        .await
        .unwrap();
    assert_eq!(done.fencing, oldest.fencing);
    let resp = client.request_token(req).await.unwrap().into_inner();
    assert_eq!(resp.decision(), pb::Decision::AlreadyCompleted);
    assert_eq!(resp.completion.unwrap().receipt, b"tx-oldest".to_vec());
}
on_stores!(superseded_grants_are_bounded: embedded, redis, cluster, sentinel, postgres);

/// Amounts: two different amounts never share a fingerprint; a literal a double cannot hold is
/// refused, naming the field (beyond 2^53 too, where a double would round), and creates nothing.
async fn amounts_a_double_cannot_hold_are_refused(kind: Kind) {
    let gate = TestGate::start(kind).await;
    let client = &mut gate.client().await;
    for amount in [
        "0.100000000000000001",
        "1e-400",
        "100.00000000000002",
        "9007199254740993",
        "-9007199254740993",
        "1e400",
    ] {
        let mut req = token_request("agent", "run", "pay", &format!(r#"{{"amount":{amount}}}"#));
        req.idempotency_key = format!("transfer-{amount}");
        let status = client.request_token(req.clone()).await.unwrap_err();
        expect_error(&status, Code::InvalidArgument, "INVALID_REQUEST");
        assert!(status.message().contains("/amount"), "{}", status.message());
        let action = pb::ActionRef {
            scope: req.scope.clone(),
            key: req.idempotency_key.clone(),
        };
        assert_eq!(
            state(client, &action).await.state(),
            pb::ActionState::Absent
        );
    }
    for amount in ["0.1", "1.0", "1e2", "-0", "100.00000000000001"] {
        grant(
            client,
            token_request("agent", "run", "pay", &format!(r#"{{"amount":{amount}}}"#)),
        )
        .await;
    }
}
on_stores!(amounts_a_double_cannot_hold_are_refused: embedded, redis, cluster, sentinel, postgres);
