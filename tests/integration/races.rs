//! Concurrency: many real clients racing for the same action, across two gate processes sharing
//! one Redis, and many distinct actions at once. Outcomes are counted, not timed.

use std::collections::HashSet;

use oncegate::pb;
use tonic::Code;

use crate::support::{GateProcess, Kind, RedisServer, TestGate, connect, reason, token_request};

const RACERS: usize = 120;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racers_across_two_gate_processes_get_exactly_one_grant() {
    let redis = RedisServer::start();
    let url = redis.url();
    let gates = [
        GateProcess::spawn(&["--redis-url", &url]),
        GateProcess::spawn(&["--redis-url", &url]),
    ];
    let req = token_request(
        "agent",
        "run",
        "payments.transfer",
        r#"{"amount":10,"to":"x"}"#,
    );

    let mut tasks = Vec::new();
    for i in 0..RACERS {
        // Each racer has its own connection, alternating between the two gates.
        let addr = gates[i % 2].addr.clone();
        let req = req.clone();
        tasks.push(tokio::spawn(async move {
            let mut client = connect(&addr).await;
            client.request_token(req).await
        }));
    }
    let mut grants = Vec::new();
    for task in tasks {
        match task.await.unwrap() {
            Ok(resp) => grants.push(resp.into_inner()),
            Err(status) => {
                assert_eq!(status.code(), Code::Aborted, "{status:?}");
                assert_eq!(reason(&status), "IDEMPOTENCY_IN_PROGRESS");
            }
        }
    }
    assert_eq!(grants.len(), 1, "exactly one racer is granted");
    let granted = &grants[0];
    assert_eq!(granted.decision(), pb::Decision::Granted);
    let action = granted.action.clone().unwrap();
    let token = granted.grant.as_ref().unwrap().token.clone();

    let mut client = connect(&gates[0].addr).await;
    client
        .complete(pb::CompleteRequest {
            action: Some(action),
            token,
            receipt: b"receipt-1".to_vec(),
        })
        .await
        .unwrap();

    let mut tasks = Vec::new();
    for i in 0..RACERS {
        let addr = gates[i % 2].addr.clone();
        let req = req.clone();
        tasks.push(tokio::spawn(async move {
            connect(&addr).await.request_token(req).await
        }));
    }
    for task in tasks {
        let resp = task.await.unwrap().unwrap().into_inner();
        assert_eq!(resp.decision(), pb::Decision::AlreadyCompleted);
        assert_eq!(resp.completion.unwrap().receipt, b"receipt-1");
    }
}

async fn distinct_actions_all_granted(kind: Kind, actions: usize) {
    let gate = TestGate::start(kind).await;
    let mut tasks = Vec::new();
    for i in 0..actions {
        let mut client = gate.client().await;
        tasks.push(tokio::spawn(async move {
            let req = token_request(
                "agent",
                "run",
                "orders.create",
                &format!(r#"{{"order":{i}}}"#),
            );
            client.request_token(req).await.unwrap().into_inner()
        }));
    }
    let mut tokens = HashSet::new();
    for task in tasks {
        let resp = task.await.unwrap();
        assert_eq!(resp.decision(), pb::Decision::Granted);
        tokens.insert(resp.grant.unwrap().token);
    }
    assert_eq!(tokens.len(), actions, "every action got its own token");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_500_distinct_actions_get_500_distinct_tokens() {
    distinct_actions_all_granted(Kind::Redis, 500).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn embedded_500_distinct_actions_get_500_distinct_tokens() {
    distinct_actions_all_granted(Kind::Embedded, 500).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn embedded_racers_get_exactly_one_grant() {
    let gate = TestGate::start(Kind::Embedded).await;
    let req = token_request("agent", "run", "x", r#"{"k":1}"#);
    let mut tasks = Vec::new();
    for _ in 0..RACERS {
        let mut client = gate.client().await;
        let req = req.clone();
        tasks.push(tokio::spawn(async move { client.request_token(req).await }));
    }
    let mut granted = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(_) => granted += 1,
            Err(status) => assert_eq!(reason(&status), "IDEMPOTENCY_IN_PROGRESS"),
        }
    }
    assert_eq!(granted, 1);
}
