//! Operator calls go through the gate like a worker's: timed and counted by store
//! operation, refused ones included, failures counted as store errors of their own operation.

use std::collections::HashMap;

use oncegate_proto as pb;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::support::{
    Kind, OPS_KEY, Scrape, TestGate, WORKER_KEY, authed, expect_error, grant_as, principals_toml,
    token_request, ttl_ms, wait_for_health,
};

/// The operations an operator's calls reach, as the store metrics label them.
const OPERATOR_OPERATIONS: [&str; 5] = [
    "get_action",
    "list_unresolved",
    "resolve_expired",
    "record_external",
    "export_receipts",
];

fn operator_ref(key: &str) -> pb::ActionRef {
    pb::ActionRef {
        scope: Some(pb::Scope {
            agent_id: "billing-agent".into(),
            run_id: "run-1".into(),
        }),
        key: key.into(),
    }
}

/// Operator calls go through the gate like a worker's: each GetAction, ListUnresolved,
/// ResolveExpired, RecordExternalCompletion and ExportReceipts is one timed store call under its
/// own operation, a refused one included, an invalid one (no store call) not; and with Redis
/// gone each is counted as a store error of that operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_calls_are_timed_and_counted_by_operation() {
    let config = crate::support::config(&format!(
        "[limits]\nmin_lease_ttl_seconds = 0.05\n{}\n[actions.\"payments.transfer\"]\n",
        principals_toml("")
    ));
    let (mut gate, metrics_addr) =
        TestGate::start_with_config_and_metrics(Kind::Redis, config).await;
    wait_for_health(&gate.addr.to_string(), ServingStatus::Serving).await;
    let mut client = gate.client().await;
    let mut admin = gate.admin().await;
    let count = |scrape: &Scrape, operation: &str| {
        scrape.sum(
            "oncegate_store_duration_seconds_count",
            &[("operation", operation)],
        )
    };
    let mut want: HashMap<&str, f64> = OPERATOR_OPERATIONS.iter().map(|op| (*op, 0.0)).collect();

    // Two leases left to expire, unsettled; the worker's calls are request_token's.
    let mut expired = Vec::new();
    let mut last_end = None;
    for key in ["invoice-1", "invoice-2"] {
        let mut req = token_request(
            "billing-agent",
            "run-1",
            "payments.transfer",
            r#"{"amount":1}"#,
        );
        req.idempotency_key = key.into();
        req.lease_ttl = ttl_ms(300);
        let (action, grant) = grant_as(&mut client, req, Some(WORKER_KEY)).await;
        last_end = grant.lease_expires_at;
        expired.push(action);
    }
    gate.time.pass_beyond(last_end.unwrap()).await;
    let before = Scrape::fetch(metrics_addr).await;
    for op in OPERATOR_OPERATIONS {
        assert_eq!(count(&before, op), 0.0, "{op} before any operator call");
    }
    assert_eq!(count(&before, "request_token"), 2.0);

    let list = |agent: &str, page_size: u32| {
        authed(
            pb::ListUnresolvedRequest {
                agent_id: agent.into(),
                page_size,
                page_token: String::new(),
            },
            Some(OPS_KEY),
        )
    };
    for agent in ["billing-agent", ""] {
        let page = admin.list_unresolved(list(agent, 0)).await.unwrap();
        assert_eq!(page.into_inner().actions.len(), 2, "agent {agent:?}");
        *want.get_mut("list_unresolved").unwrap() += 1.0;
    }
    // Refused before the store is asked: no store call.
    let status = admin.list_unresolved(list("", 5000)).await.unwrap_err();
    expect_error(&status, Code::InvalidArgument, "INVALID_REQUEST");

    let get = |action: &pb::ActionRef| {
        authed(
            pb::GetActionRequest {
                action: Some(action.clone()),
            },
            Some(OPS_KEY),
        )
    };
    let view = client.get_action(get(&expired[0])).await.unwrap();
    assert_eq!(view.into_inner().state(), pb::ActionState::Expired);
    *want.get_mut("get_action").unwrap() += 1.0;

    let resolve = |action: &pb::ActionRef, resolution: pb::Resolution, receipt: &[u8]| {
        authed(
            pb::ResolveExpiredRequest {
                receipt_format: pb::ReceiptFormat::Text as i32,
                action: Some(action.clone()),
                resolution: resolution as i32,
                receipt: receipt.to_vec(),
                note: "reconciled with the bank".into(),
                expected_fencing: 0,
            },
            Some(OPS_KEY),
        )
    };
    admin
        .resolve_expired(resolve(&expired[0], pb::Resolution::Failed, b""))
        .await
        .unwrap();
    admin
        .resolve_expired(resolve(&expired[1], pb::Resolution::Completed, b"tx-2"))
        .await
        .unwrap();
    // Refused by the store's ledger: still a store call.
    let status = admin
        .resolve_expired(resolve(&expired[1], pb::Resolution::Failed, b""))
        .await
        .unwrap_err();
    expect_error(&status, Code::FailedPrecondition, "ALREADY_COMPLETED");
    *want.get_mut("resolve_expired").unwrap() += 3.0;

    admin
        .record_external_completion(authed(
            pb::RecordExternalCompletionRequest {
                receipt_format: pb::ReceiptFormat::Text as i32,
                action: Some(operator_ref("invoice-3")),
                receipt: b"tx-3".to_vec(),
                note: "paid by hand".into(),
                action_name: "payments.transfer".into(),
                params_json: r#"{"amount":3}"#.into(),
                intent_id: String::new(),
            },
            Some(OPS_KEY),
        ))
        .await
        .unwrap();
    *want.get_mut("record_external").unwrap() += 1.0;
    let view = client.get_action(get(&operator_ref("invoice-3"))).await;
    assert_eq!(
        view.unwrap().into_inner().state(),
        pb::ActionState::Completed
    );
    *want.get_mut("get_action").unwrap() += 1.0;

    admin
        .export_receipts(authed(
            pb::ExportReceiptsRequest {
                agent_id: "billing-agent".into(),
                after_seq: 0,
                page_size: 0,
            },
            Some(OPS_KEY),
        ))
        .await
        .unwrap();
    *want.get_mut("export_receipts").unwrap() += 1.0;
    let page = admin.list_unresolved(list("", 0)).await.unwrap();
    assert!(page.into_inner().actions.is_empty());
    *want.get_mut("list_unresolved").unwrap() += 1.0;

    let scrape = Scrape::fetch(metrics_addr).await;
    for (op, calls) in &want {
        assert_eq!(count(&scrape, op), *calls, "store calls {op}");
    }
    assert_eq!(count(&scrape, "request_token"), 2.0);
    assert_eq!(scrape.sum("oncegate_store_errors_total", &[]), 0.0);
    let rpc = |method: &str, code: &str| {
        let rpc = format!("oncegate.v1.GateAdminService/{method}");
        scrape.sum(
            "oncegate_rpc_duration_seconds_count",
            &[("rpc", &rpc), ("code", code)],
        )
    };
    assert_eq!(rpc("ListUnresolved", "OK"), 3.0);
    assert_eq!(rpc("ListUnresolved", "INVALID_ARGUMENT"), 1.0);
    assert_eq!(rpc("ResolveExpired", "OK"), 2.0);
    assert_eq!(rpc("ResolveExpired", "FAILED_PRECONDITION"), 1.0);

    // Redis gone: each operator call fails closed, counted under its own operation.
    gate.backend.redis.as_mut().unwrap().stop();
    let status = admin.list_unresolved(list("", 0)).await.unwrap_err();
    expect_error(&status, Code::Unavailable, "STORE_UNAVAILABLE");
    let status = client.get_action(get(&expired[0])).await.unwrap_err();
    expect_error(&status, Code::Unavailable, "STORE_UNAVAILABLE");
    let status = admin
        .resolve_expired(resolve(&expired[0], pb::Resolution::Failed, b""))
        .await
        .unwrap_err();
    expect_error(&status, Code::Unavailable, "STORE_UNAVAILABLE");
    let down = Scrape::fetch(metrics_addr).await;
    for op in ["list_unresolved", "get_action", "resolve_expired"] {
        let errors = &[("operation", op), ("error", "unavailable")];
        assert_eq!(down.sum("oncegate_store_errors_total", errors), 1.0, "{op}");
        assert_eq!(count(&down, op), want[op] + 1.0, "store calls {op}");
    }
    assert_eq!(down.sum("oncegate_store_errors_total", &[]), 3.0);
}
