//! Failure tests: Redis stopped under a running gate fails closed and recovers by itself; the
//! embedded store keeps every acknowledged Complete, and its receipt chain entry, across `kill -9`,
//! idle or under load; a call its store holds past the caller's deadline ends `DEADLINE_EXCEEDED`
//! and is counted, as is one its caller cancels.

use std::{
    collections::HashSet,
    time::{Duration, Instant},
};

use oncegate_config::keys;
use oncegate_domain::statement::{
    PublicKeys,
    receipt::{receipt_digest, verify_chain},
};
use oncegate_gate::policy::Policies;
use oncegate_proto::{self as pb};
use oncegate_store::embedded::{EmbeddedStore, system_clock};
use tempfile::TempDir;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::support::{
    GateProcess, Kind, LoggedGate, Scrape, TestGate, connect, expect_error, health, token_request,
    wait_for_health,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_fails_closed_and_recovers_without_restart() {
    let mut gate = TestGate::start(Kind::Redis).await;
    let addr = gate.addr.to_string();
    let mut client = gate.client().await;
    client
        .request_token(token_request("a", "r", "x", r#"{"n":1}"#))
        .await
        .unwrap();
    wait_for_health(&addr, ServingStatus::Serving).await;

    gate.backend.redis.as_mut().unwrap().stop();
    let status = client
        .request_token(token_request("a", "r", "x", r#"{"n":2}"#))
        .await
        .unwrap_err();
    expect_error(&status, Code::Unavailable, "STORE_UNAVAILABLE");
    // Readiness follows the store; liveness (the overall entry) does not.
    wait_for_health(&addr, ServingStatus::NotServing).await;
    assert_eq!(health(&addr, "").await, ServingStatus::Serving);

    // Redis comes back (empty: it kept nothing on disk): the gate serves again by itself.
    gate.backend.redis.as_mut().unwrap().restart();
    let deadline = Instant::now() + Duration::from_secs(15);
    let resp = loop {
        match client
            .request_token(token_request("a", "r", "x", r#"{"n":2}"#))
            .await
        {
            Ok(resp) => break resp.into_inner(),
            Err(status) => {
                expect_error(&status, Code::Unavailable, "STORE_UNAVAILABLE");
                assert!(Instant::now() < deadline, "the gate did not recover");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert_eq!(resp.decision(), pb::Decision::Granted);
    wait_for_health(&addr, ServingStatus::Serving).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_the_callers_deadline_ends_deadline_exceeded_and_is_counted() {
    // tonic's own timer would answer CANCELLED ("Timeout expired") and leave the call unobserved.
    let (gate, metrics) = TestGate::start_with_metrics(Kind::Redis, Policies::default()).await;
    let mut client = gate.client().await;
    let redis = redis::Client::open(gate.backend.redis.as_ref().unwrap().url()).unwrap();
    let mut redis = redis.get_multiplexed_async_connection().await.unwrap();
    let count = |scrape: &Scrape, code: &str| {
        let rpc = "oncegate.v1.ActionGateService/RequestToken";
        scrape.sum(
            "oncegate_rpc_duration_seconds_count",
            &[("rpc", rpc), ("code", code)],
        )
    };

    // Redis holds every command for 1.5 s: below the store's deadline (2 s), past the caller's.
    let pause = || {
        redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(1500)
            .arg("ALL")
            .to_owned()
    };
    let () = pause().query_async(&mut redis).await.unwrap();
    let late = token_request("a", "r", "x", r#"{"n":1}"#);
    let (code, message) = request_token_by_hand(gate.addr, &late, "300m").await;
    // Not the grant Redis gives after the pause: the call ended at its deadline.
    assert_eq!(code, "4", "DEADLINE_EXCEEDED: {message}");
    assert!(message.contains("deadline%20passed"), "{message}");
    let scrape = Scrape::fetch(metrics).await;
    assert_eq!(count(&scrape, "DEADLINE_EXCEEDED"), 1.0);
    assert_eq!(count(&scrape, "CANCELLED"), 0.0);

    // A caller that gives up without a deadline resets the stream: counted CANCELLED.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let () = pause().query_async(&mut redis).await.unwrap();
    let mut abandoning = client.clone();
    let abandoned = tokio::spawn(async move {
        abandoning
            .request_token(token_request("a", "r", "y", r#"{"n":2}"#))
            .await
    });
    // Halfway through the pause: the call has reached the gate, and Redis holds it there.
    tokio::time::sleep(Duration::from_millis(700)).await;
    abandoned.abort();
    let deadline = Instant::now() + Duration::from_secs(10);
    while count(&Scrape::fetch(metrics).await, "CANCELLED") != 1.0 {
        assert!(
            Instant::now() < deadline,
            "the cancelled call was not counted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // What the late call began, the store finished: the same request says which.
    let again = client
        .request_token(token_request("a", "r", "x", r#"{"n":1}"#))
        .await;
    match again {
        Ok(answer) => assert_eq!(answer.into_inner().decision(), pb::Decision::Granted),
        Err(status) => {
            expect_error(&status, Code::Aborted, "IDEMPOTENCY_IN_PROGRESS");
        }
    }
}

/// RequestToken over plain HTTP/2 with `grpc-timeout: timeout`, from a caller that keeps no timer
/// of its own (tonic's channel ends the call itself at that deadline, `CANCELLED`): the gate's
/// answer, as its `grpc-status` and (percent-encoded) `grpc-message`.
async fn request_token_by_hand(
    addr: std::net::SocketAddr,
    request: &pb::RequestTokenRequest,
    timeout: &str,
) -> (String, String) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let head = http::Request::post(format!(
        "http://{addr}/oncegate.v1.ActionGateService/RequestToken"
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .header("grpc-timeout", timeout)
    .body(())
    .unwrap();
    let (answer, mut body) = client
        .ready()
        .await
        .unwrap()
        .send_request(head, false)
        .unwrap();
    let message = prost::Message::encode_to_vec(request);
    let mut frame = vec![0];
    frame.extend(u32::try_from(message.len()).unwrap().to_be_bytes());
    frame.extend(message);
    body.send_data(frame.into(), true).unwrap();
    let (head, mut body) = answer.await.unwrap().into_parts();
    // An error is a trailers-only answer: its status is in the head.
    let trailers = if head.headers.contains_key("grpc-status") {
        head.headers
    } else {
        while body.data().await.is_some() {}
        body.trailers().await.unwrap().unwrap()
    };
    let field = |name| {
        trailers
            .get(name)
            .map_or("", |v| v.to_str().unwrap())
            .to_owned()
    };
    (field("grpc-status"), field("grpc-message"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_complete_survives_kill_9() {
    let dir = TempDir::new().unwrap();
    let data = dir.path().to_str().unwrap();
    let req = token_request("agent", "run", "payments.transfer", r#"{"amount":5}"#);
    let mut gate = GateProcess::spawn(&["--data-dir", data]);
    let mut client = connect(&gate.addr).await;
    let resp = client
        .request_token(req.clone())
        .await
        .unwrap()
        .into_inner();
    let grant = resp.grant.unwrap();
    client
        .complete(pb::CompleteRequest {
            action: resp.action.clone(),
            token: grant.token.clone(),
            receipt: b"durable receipt".to_vec(),
        })
        .await
        .unwrap();
    // A second action left authorized: its lease must survive too.
    let pending = client
        .request_token(token_request("agent", "run", "x", r#"{"k":1}"#))
        .await
        .unwrap()
        .into_inner();
    gate.kill9();

    let gate = GateProcess::spawn(&["--data-dir", data]);
    let mut client = connect(&gate.addr).await;
    let replay = client.request_token(req).await.unwrap().into_inner();
    assert_eq!(replay.decision(), pb::Decision::AlreadyCompleted);
    assert_eq!(replay.completion.unwrap().receipt, b"durable receipt");
    let view = client
        .get_action(pb::GetActionRequest {
            action: pending.action,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(view.state(), pb::ActionState::Authorized);
}

#[tokio::test]
async fn sigterm_drains_and_exits_cleanly() {
    let dir = TempDir::new().unwrap();
    let mut gate = GateProcess::spawn(&["--data-dir", dir.path().to_str().unwrap()]);
    connect(&gate.addr)
        .await
        .request_token(token_request("a", "r", "x", "{}"))
        .await
        .unwrap();
    let status = gate.terminate();
    assert!(status.success(), "{status:?}");
}

/// SIGTERM drains every serving thread: with connections open on each of three threads, the gate
/// exits 0 without waiting out the drain deadline (a thread left serving would keep its
/// connections open until then). The clients' connections run on other threads than the one
/// waiting for the gate to exit, so that they close when the gate says it goes away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_every_serving_thread() {
    let dir = TempDir::new().unwrap();
    let mut gate = LoggedGate::start(
        &dir,
        &[
            "--listen",
            "127.0.0.1:0",
            "--serving-threads",
            "3",
            "--drain-seconds",
            "30",
        ],
    );
    let mut clients = Vec::new();
    for i in 0..6 {
        let mut client = connect(&gate.addr).await;
        let req = token_request("a", "r", "x", &format!(r#"{{"i":{i}}}"#));
        client.request_token(req).await.unwrap();
        clients.push(client);
    }
    let status = gate.terminate();
    assert!(status.success(), "{status:?}: {}", gate.log());
    let log = gate.log();
    assert!(!log.contains("drain deadline passed"), "{log}");
    assert!(log.contains("serving_threads=3"), "{log}");
}

/// Group commit through the write-ahead log under load: 16 workers grant and complete as fast as
/// they can, the process is killed (SIGKILL) in the middle, at a moment no batch boundary or
/// checkpoint chose, and after a restart every Complete that was acknowledged replays its receipt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_acknowledged_writes_survive_kill_9_under_load() {
    let dir = TempDir::new().unwrap();
    let data = dir.path().to_str().unwrap().to_owned();
    let mut gate = GateProcess::spawn(&["--data-dir", &data]);
    let addr = gate.addr.clone();
    let acknowledged = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..16 {
        let (addr, acknowledged, stop) = (addr.clone(), acknowledged.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            let mut client = connect(&addr).await;
            for i in 0.. {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let req = token_request("agent", "run", "pay", &format!(r#"{{"w":{w},"i":{i}}}"#));
                let Ok(resp) = client.request_token(req.clone()).await else {
                    break;
                };
                let resp = resp.into_inner();
                let receipt = format!("receipt {w}/{i}").into_bytes();
                let done = client
                    .complete(pb::CompleteRequest {
                        action: resp.action.clone(),
                        token: resp.grant.unwrap().token,
                        receipt: receipt.clone(),
                    })
                    .await;
                if done.is_err() {
                    break;
                }
                acknowledged.lock().unwrap().push((req, receipt));
            }
        }));
    }
    // Long enough for several checkpoints (one a second) and many logged batches after the last.
    tokio::time::sleep(Duration::from_millis(2300)).await;
    gate.kill9();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for worker in workers {
        worker.await.unwrap();
    }
    let acknowledged = std::mem::take(&mut *acknowledged.lock().unwrap());
    assert!(
        acknowledged.len() > 100,
        "the load ran: {}",
        acknowledged.len()
    );

    let gate = GateProcess::spawn(&["--data-dir", &data]);
    let mut client = connect(&gate.addr).await;
    let mut receipts = Vec::with_capacity(acknowledged.len());
    for (req, receipt) in acknowledged {
        let replay = client.request_token(req).await.unwrap().into_inner();
        assert_eq!(replay.decision(), pb::Decision::AlreadyCompleted);
        assert_eq!(replay.completion.unwrap().receipt, receipt);
        receipts.push(receipt);
    }

    // The log carries the receipt chain too: every acknowledged completion has its entry, and the
    // chain is gapless and verifies with the key the gate generated at first start.
    drop(gate);
    let store = loop {
        match EmbeddedStore::open(dir.path(), system_clock(), Duration::from_secs(5)) {
            Ok(store) => break store,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    let chain = store.receipts("agent", 0, usize::MAX).await.unwrap();
    let key = keys::read_private(&dir.path().join(keys::GENERATED_KEY_FILE)).unwrap();
    let report = verify_chain(&PublicKeys::new([key.public()]), "agent", &chain);
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert_eq!(report.verified, chain.len());
    let chained: HashSet<&str> = chain
        .iter()
        .map(|e| e.core.receipt_digest.as_str())
        .collect();
    for receipt in &receipts {
        assert!(chained.contains(receipt_digest(receipt).as_str()));
    }
}
