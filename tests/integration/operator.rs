//! The operator API end to end, on both stores: a completion done by hand reaching the worker as
//! COMPLETED_BY_OTHER, expired leases listed, resolved and granted again with a higher fencing
//! number, pagination. Leases end on the store's time: the embedded store's test clock moves past
//! them at once, Redis is waited out. The `oncegate admin` command is in `admin_cli.rs`.

use std::collections::BTreeSet;

use oncegate_config::ConfigFile;
use oncegate_proto::{
    self as pb, action_gate_service_client::ActionGateServiceClient,
    gate_admin_service_client::GateAdminServiceClient,
};
use tonic::{Code, transport::Channel};

use crate::support::{
    Kind, OPS_KEY, TestGate, WORKER_KEY, authed, config, expect_error, on_stores, principals_toml,
    token_request, ttl_ms,
};

fn policies() -> ConfigFile {
    config(&format!(
        "[limits]\nmin_lease_ttl_seconds = 0.05\n{}\n[actions.\"payments.transfer\"]\nkey_fields = [\"/amount\", \"/to\"]\n",
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
                receipt_format: pb::ReceiptFormat::Text as i32,
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
        (g.fencing, "ops")
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
    assert_eq!(meta["fencing"], g.fencing.to_string());
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
        receipt_format: pb::ReceiptFormat::Text as i32,
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
on_stores!(hand_done_completion_reaches_the_worker_as_completed_by_other: embedded, redis, postgres);

async fn expired_lease_listed_resolved_failed_and_granted_again(kind: Kind) {
    let gate = TestGate::start_with_test_clock(kind, policies()).await;
    let mut c = clients(&gate).await;
    let mut req = token_request(
        "billing-2",
        "run-1",
        "payments.transfer",
        r#"{"amount":1,"to":"A"}"#,
    );
    req.lease_ttl = ttl_ms(150);
    let (action, g) = grant(&mut c, req.clone()).await;
    let mut live = token_request("billing-2", "run-1", "email.send", r#"{"to":"a@b"}"#);
    live.lease_ttl = ttl_ms(60_000);
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

    gate.time.pass_beyond(g.lease_expires_at.unwrap()).await;
    let page = list(&mut c, "billing-2", 0, "").await;
    assert_eq!(page.actions.len(), 1, "only the expired lease: {page:?}");
    let listed = &page.actions[0];
    assert_eq!(listed.action.as_ref().unwrap(), &action);
    assert_eq!(listed.fencing, g.fencing);
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
    assert_eq!(resolved.fencing, g.fencing);
    assert!(resolved.completion.is_none());
    assert!(list(&mut c, "billing-2", 0, "").await.actions.is_empty());
    assert!(list(&mut c, "", 0, "").await.actions.is_empty());
    // Granted again, with a higher fencing number; the old holder cannot complete.
    req.lease_ttl = None;
    let (_, again) = grant(&mut c, req).await;
    assert_eq!(again.fencing, g.fencing + 1);
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
on_stores!(expired_lease_listed_resolved_failed_and_granted_again: embedded, redis, postgres);

async fn expired_lease_resolved_completed(kind: Kind) {
    let gate = TestGate::start_with_test_clock(kind, policies()).await;
    let mut c = clients(&gate).await;
    let mut req = token_request(
        "billing-3",
        "run-1",
        "payments.transfer",
        r#"{"amount":2,"to":"B"}"#,
    );
    req.lease_ttl = ttl_ms(100);
    let (action, g) = grant(&mut c, req.clone()).await;
    gate.time.pass_beyond(g.lease_expires_at.unwrap()).await;
    let resolved = c
        .admin
        .resolve_expired(authed(
            pb::ResolveExpiredRequest {
                receipt_format: pb::ReceiptFormat::Text as i32,
                action: Some(action.clone()),
                resolution: pb::Resolution::Completed as i32,
                receipt: b"tx_42".to_vec(),
                note: "provider confirms tx_42".into(),
                expected_fencing: 0,
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
on_stores!(expired_lease_resolved_completed: embedded, redis, postgres);

async fn listing_pages_across_agents(kind: Kind) {
    let gate = TestGate::start_with_test_clock(kind, policies()).await;
    let mut c = clients(&gate).await;
    let mut expected = BTreeSet::new();
    for (i, agent) in ["billing-a", "billing-bb", "billing-c"].iter().enumerate() {
        for n in 0..=i {
            let mut req = token_request(agent, "run", "x", &format!(r#"{{"n":{n}}}"#));
            req.lease_ttl = ttl_ms(100);
            let (action, _) = grant(&mut c, req).await;
            expected.insert((agent.to_string(), action.key));
        }
    }
    // One of them completes: it must not be listed.
    let mut req = token_request("billing-a", "run", "x", r#"{"n":"done"}"#);
    req.lease_ttl = ttl_ms(100);
    let (done_action, done) = grant(&mut c, req).await;
    // Granted last, its lease ends last.
    let last_lease_end = done.lease_expires_at.unwrap();
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
    gate.time.pass_beyond(last_lease_end).await;

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
on_stores!(listing_pages_across_agents: embedded, redis, postgres);
