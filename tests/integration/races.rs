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

/// `racers` clients per key race for `keys` actions across `gates` gate processes (started with
/// `extra` arguments too) sharing one store: exactly one grant per key; after its Complete, every
/// racer gets the receipt.
async fn racers_across_gate_processes(
    kind: Kind,
    gates: usize,
    keys: usize,
    racers: usize,
    extra: &[&str],
) {
    // The embedded store is one process's: its gates are one, on a data directory of its own.
    let dir = tempfile::TempDir::new().unwrap();
    let (args, _backend) = match kind {
        Kind::Embedded => (
            vec!["--data-dir".into(), dir.path().to_str().unwrap().to_owned()],
            None,
        ),
        _ => {
            let backend = backend(kind).await;
            (backend.gate_args(), Some(backend))
        }
    };
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    args.extend_from_slice(extra);
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

/// Racers across gate processes on every Redis topology and on PostgreSQL; on a Cluster, twelve
/// keys (spread over the masters' slots) through three gates; on PostgreSQL, four keys through
/// three gates.
async fn racers_across_gate_processes_get_one_grant_per_key(kind: Kind) {
    let (gates, keys, racers) = match kind {
        Kind::Cluster => (3, 12, 30),
        // Three gates on one database, four keys: the keys' locks never meet.
        Kind::Postgres => (3, 4, 40),
        _ => (2, 1, RACERS),
    };
    racers_across_gate_processes(kind, gates, keys, racers, &[]).await;
}
on_stores!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    racers_across_gate_processes_get_one_grant_per_key: redis, cluster, sentinel, postgres
);

/// One gate serving on three threads: the racers' connections are dealt over them (each thread
/// with its own runtime and, on a standalone Redis, its own connection), and still exactly one
/// racer per key is granted.
async fn racers_on_serving_threads_get_one_grant_per_key(kind: Kind) {
    racers_across_gate_processes(kind, 1, 3, 40, &["--serving-threads", "3"]).await;
}
on_stores!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    racers_on_serving_threads_get_one_grant_per_key: embedded, redis, cluster, sentinel, postgres
);

/// On a standalone Redis, each serving thread past the first opens one connection of its own, on
/// its first call, and keeps it: `CLIENT LIST` grows by exactly two for `--serving-threads 3`,
/// however many client connections are dealt to them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_serving_thread_opens_one_redis_connection_of_its_own() {
    let backend = backend(Kind::Redis).await;
    let args = backend.gate_args();
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    args.extend_from_slice(&["--serving-threads", "3"]);
    let gate = GateProcess::spawn(&args);
    let port = backend.redis.as_ref().unwrap().port;
    let mut redis = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .unwrap()
        .get_connection()
        .unwrap();
    let mut connected = || -> usize {
        let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut redis).unwrap();
        list.lines().count()
    };
    let before = connected();
    for round in 0..2 {
        // Twelve connections, four dealt to each thread; a call on each.
        let mut tasks = Vec::new();
        for i in 0..12 {
            let addr = gate.addr.clone();
            tasks.push(tokio::spawn(async move {
                let req = token_request(
                    "agent",
                    "run",
                    "orders.create",
                    &format!(r#"{{"round":{round},"order":{i}}}"#),
                );
                connect(&addr)
                    .await
                    .request_token(req)
                    .await
                    .unwrap()
                    .into_inner()
            }));
        }
        for task in tasks {
            assert_eq!(task.await.unwrap().decision(), pb::Decision::Granted);
        }
        assert_eq!(
            connected(),
            before + 2,
            "round {round}: one connection per thread past the first"
        );
    }
}

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
    five_hundred_distinct_actions_get_distinct_tokens: embedded, redis, cluster, sentinel, postgres
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
