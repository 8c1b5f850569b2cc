//! Concurrency: many real clients racing for the same actions, across several gate processes
//! sharing one Redis deployment (standalone, Cluster, Sentinel), and many distinct actions at once.
//! Outcomes are counted, not timed.

use std::collections::HashSet;

use oncegate_proto as pb;
use tonic::Code;

use crate::support::{
    GateProcess, Kind, TestGate, backend, connect, on_stores, reason, token_request,
};

const RACERS: usize = 120;

/// `racers` clients per key race for `keys` actions across `gates` gate processes sharing one
/// Redis deployment: exactly one grant per key; after its Complete, every racer gets the receipt.
async fn racers_across_gate_processes(kind: Kind, gates: usize, keys: usize, racers: usize) {
    let backend = backend(kind).await;
    let args = backend.gate_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let gates: Vec<GateProcess> = (0..gates).map(|_| GateProcess::spawn(&args)).collect();
    let request = |key: usize| {
        token_request(
            "agent",
            "run",
            "payments.transfer",
            &format!(r#"{{"amount":10,"to":"x","invoice":{key}}}"#),
        )
    };

    let mut tasks = Vec::new();
    for key in 0..keys {
        for i in 0..racers {
            // Each racer has its own connection, the racers of one key spread over every gate.
            let addr = gates[(key + i) % gates.len()].addr.clone();
            let req = request(key);
            tasks.push(tokio::spawn(async move {
                let mut client = connect(&addr).await;
                (key, client.request_token(req).await)
            }));
        }
    }
    let mut grants: Vec<Vec<pb::RequestTokenResponse>> = vec![Vec::new(); keys];
    for task in tasks {
        match task.await.unwrap() {
            (key, Ok(resp)) => grants[key].push(resp.into_inner()),
            (_, Err(status)) => {
                assert_eq!(status.code(), Code::Aborted, "{status:?}");
                assert_eq!(reason(&status), "IDEMPOTENCY_IN_PROGRESS");
            }
        }
    }
    let mut client = connect(&gates[0].addr).await;
    for (key, granted) in grants.iter().enumerate() {
        assert_eq!(granted.len(), 1, "key {key}: exactly one racer is granted");
        let granted = &granted[0];
        assert_eq!(granted.decision(), pb::Decision::Granted);
        client
            .complete(pb::CompleteRequest {
                action: granted.action.clone(),
                token: granted.grant.as_ref().unwrap().token.clone(),
                receipt: format!("receipt-{key}").into_bytes(),
            })
            .await
            .unwrap();
    }

    let mut tasks = Vec::new();
    for key in 0..keys {
        for i in 0..racers {
            let addr = gates[(key + i) % gates.len()].addr.clone();
            let req = request(key);
            tasks.push(tokio::spawn(async move {
                (key, connect(&addr).await.request_token(req).await)
            }));
        }
    }
    for task in tasks {
        let (key, resp) = task.await.unwrap();
        let resp = resp.unwrap().into_inner();
        assert_eq!(resp.decision(), pb::Decision::AlreadyCompleted);
        assert_eq!(
            resp.completion.unwrap().receipt,
            format!("receipt-{key}").into_bytes()
        );
    }
}

/// Racers across gate processes on every Redis topology; on a Cluster, twelve keys (spread over
/// the masters' slots) through three gates.
async fn racers_across_gate_processes_get_one_grant_per_key(kind: Kind) {
    let (gates, keys, racers) = match kind {
        Kind::Cluster => (3, 12, 30),
        _ => (2, 1, RACERS),
    };
    racers_across_gate_processes(kind, gates, keys, racers).await;
}
on_stores!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    racers_across_gate_processes_get_one_grant_per_key: redis, cluster, sentinel
);

/// 500 distinct actions requested at once: every one granted, each with its own token.
async fn five_hundred_distinct_actions_get_distinct_tokens(kind: Kind) {
    let actions = 500;
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
on_stores!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    five_hundred_distinct_actions_get_distinct_tokens: embedded, redis, cluster, sentinel
);

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
