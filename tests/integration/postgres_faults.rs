//! Faults under the PostgreSQL store, each on a server of the test's own: down (killed), slow
//! (frozen with SIGSTOP), a pool with no free connection, a deadlock the database broke (retried
//! inside the store, since nothing committed), a COMMIT whose answer never comes (reported as
//! unknown, never as a grant), and a row that cannot be decoded (Corrupt for its action alone).
//! Every one fails closed: UNAVAILABLE, nothing granted.

use std::time::{Duration, Instant};

use oncegate_domain::{ActionKey, ledger::TokenOutcome};
use oncegate_gate::policy::Policies;
use oncegate_proto as pb;
use oncegate_store::{
    Store, StoreError,
    postgres::{PostgresOptions, PostgresStore, action_lock},
};
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::support::{
    PgServer, TestGate, complete, expect_error, grant, postgres_backend, postgres_options,
    store_request, token_request, wait_for_health,
};

/// A server of the test's own (started off the runtime).
async fn own_server(extra: &'static [&'static str]) -> PgServer {
    tokio::task::spawn_blocking(move || PgServer::start_with(extra))
        .await
        .unwrap()
}

async fn store_on(server: &PgServer, options: PostgresOptions) -> PostgresStore {
    PostgresStore::connect(&server.url(), options).await.unwrap()
}

fn unavailable(result: Result<impl std::fmt::Debug, StoreError>) -> String {
    match result {
        Err(e @ StoreError::Unavailable { .. }) => e.to_string(),
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

/// Down, then back: calls fail closed while the server is gone, and the gate serves again by
/// itself once it is back (the pool drops the dead connections).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_down_fails_closed_and_the_gate_recovers_without_restart() {
    let server = own_server(&[]).await;
    let backend = postgres_backend(server.url(), Some(server)).await;
    let gate = TestGate::serve(backend, Policies::default()).await;
    let addr = gate.addr.to_string();
    let mut client = gate.client().await;
    grant(&mut client, token_request("a", "r", "x", r#"{"n":1}"#)).await;
    wait_for_health(&addr, ServingStatus::Serving).await;

    let mut gate = gate;
    gate.backend.pg_server.as_mut().unwrap().kill();
    let status = client
        .request_token(token_request("a", "r", "x", r#"{"n":2}"#))
        .await
        .unwrap_err();
    expect_error(&status, Code::Unavailable, "STORE_UNAVAILABLE");
    wait_for_health(&addr, ServingStatus::NotServing).await;

    let server = gate.backend.pg_server.as_mut().unwrap();
    tokio::task::block_in_place(|| server.restart());
    let deadline = Instant::now() + Duration::from_secs(20);
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
    // What was granted before the crash is still there: the first action is in progress.
    let status = client
        .request_token(token_request("a", "r", "x", r#"{"n":1}"#))
        .await
        .unwrap_err();
    expect_error(&status, Code::Aborted, "IDEMPOTENCY_IN_PROGRESS");
}

/// A frozen server (SIGSTOP): the call ends at its deadline, UNAVAILABLE, with nothing granted;
/// once the server runs again, exactly one grant is handed out for the action.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_server_fails_the_call_at_its_deadline_and_grants_once_after() {
    let server = own_server(&[]).await;
    let store = store_on(
        &server,
        PostgresOptions {
            call_timeout: Duration::from_millis(800),
            ..postgres_options()
        },
    )
    .await;
    let key = ActionKey::new("a", "r", "slow");
    store.ping().await.unwrap();
    server.pause();
    let why = unavailable(
        store
            .request_token(&key, &store_request("fp", "t1"), 0)
            .await,
    );
    server.resume();
    assert!(why.contains("call timeout"), "{why}");
    // The frozen attempt never committed (its connection was closed, not pooled): a new request
    // is granted, and a third is in progress, not granted again.
    let deadline = Instant::now() + Duration::from_secs(10);
    let first = loop {
        match store.request_token(&key, &store_request("fp", "t2"), 0).await {
            Ok(reply) => break reply,
            Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => panic!("{e}"),
        }
    };
    let granted = match first.result.unwrap() {
        TokenOutcome::Granted(grant, _) => grant.token,
        other => panic!("{other:?}"),
    };
    assert!(granted == "t2" || granted == "t1", "{granted}");
    let again = store
        .request_token(&key, &store_request("fp", "t3"), 0)
        .await
        .unwrap();
    assert!(
        !matches!(again.result, Ok(TokenOutcome::Granted(..))),
        "{again:?}"
    );
}

/// A pool of one connection held by a call that waits on a lock: the next call waits for a
/// connection, then fails closed saying the pool had none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_pool_fails_closed_saying_so() {
    let server = own_server(&[]).await;
    let store = store_on(
        &server,
        PostgresOptions {
            pool_size: 1,
            call_timeout: Duration::from_millis(1500),
            ..postgres_options()
        },
    )
    .await;
    let held = ActionKey::new("a", "r", "held");
    let (class, id) = action_lock(&held);
    // Another session holds the action's lock for 5 s.
    let mut holder = crate::support::postgres::program("psql")
        .args(["-X", "-q", "-h", "127.0.0.1", "-p", &server.port.to_string()])
        .args(["-U", "postgres", "-d", "postgres", "-c"])
        .arg(format!(
            "SELECT pg_advisory_lock({class}, {id}); SELECT pg_sleep(5)"
        ))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.psql("postgres", "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'") == "0" {
        assert!(Instant::now() < deadline, "the lock was never taken");
        std::thread::sleep(Duration::from_millis(20));
    }
    let waiting = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .request_token(&held, &store_request("fp", "t1"), 0)
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let other = ActionKey::new("a", "r", "other");
    let why = unavailable(store.request_token(&other, &store_request("fp", "t2"), 0).await);
    assert!(why.contains("no pooled connection"), "{why}");
    unavailable(waiting.await.unwrap());
    let _ = holder.kill();
    let _ = holder.wait();
    // Free again: the other action is granted.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match store.request_token(&other, &store_request("fp", "t3"), 0).await {
            Ok(reply) => {
                assert!(matches!(reply.result, Ok(TokenOutcome::Granted(..))), "{reply:?}");
                break;
            }
            Err(e) => {
                assert!(Instant::now() < deadline, "{e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// A deadlock the database breaks by rolling the gate's step back (SQLSTATE 40P01): nothing
/// committed, so the store runs the step again, and the call succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadlocked_step_is_rolled_back_and_retried_inside_the_store() {
    let server = own_server(&["deadlock_timeout = '200ms'"]).await;
    let store = store_on(&server, postgres_options()).await;
    let key = ActionKey::new("a", "r", "deadlock");
    store
        .request_token(&key, &store_request("fp", "t1"), 0)
        .await
        .unwrap();
    let (class, id) = action_lock(&key);
    // The other session locks the record's row, waits until the gate's step holds the action's
    // lock and waits for that row, then asks for the action's lock: a cycle. Its own deadlock
    // timeout is long, so the gate's step (200 ms) is the one the database rolls back.
    let mut other = crate::support::postgres::program("psql")
        .args(["-X", "-q", "-h", "127.0.0.1", "-p", &server.port.to_string()])
        .args(["-U", "postgres", "-d", "postgres", "-v", "ON_ERROR_STOP=1"])
        .args(["-c", "SET deadlock_timeout = '10s'"])
        .arg("-c")
        .arg(format!(
            "BEGIN; SELECT 1 FROM oncegate_records FOR UPDATE; \
             SELECT pg_sleep(1); SELECT pg_advisory_xact_lock({class}, {id}); \
             SELECT pg_sleep(0.2); COMMIT;"
        ))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.psql(
        "postgres",
        "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation \
         WHERE c.relname = 'oncegate_records' AND l.mode = 'RowShareLock'",
    ) == "0"
    {
        assert!(Instant::now() < deadline, "the other session never locked the row");
        std::thread::sleep(Duration::from_millis(20));
    }
    let reply = store
        .request_token(&key, &store_request("fp", "t2"), 0)
        .await
        .unwrap();
    assert!(other.wait().unwrap().success());
    assert!(
        !matches!(reply.result, Ok(TokenOutcome::Granted(..))),
        "the action is in progress: {reply:?}"
    );
    assert!(
        server.log().contains("deadlock detected"),
        "the database broke a deadlock: {}",
        server.log()
    );
}

/// A COMMIT that never answers (it waits for a synchronous standby that does not exist): the call
/// ends UNAVAILABLE saying the outcome is unknown, never a grant. The step had been applied: once
/// the server stops waiting, the action is in progress, and the same holder's retry gets the same
/// grant back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_without_an_answer_is_reported_unknown_never_granted() {
    let mut server = own_server(&["synchronous_standby_names = 'nobody'"]).await;
    let store = store_on(
        &server,
        PostgresOptions {
            call_timeout: Duration::from_millis(1000),
            ..postgres_options()
        },
    )
    .await;
    let key = ActionKey::new("a", "r", "unknown");
    let mut request = store_request("fp", "t1");
    request.holder = "worker-1".into();
    let why = unavailable(store.request_token(&key, &request, 0).await);
    assert!(why.contains("unknown"), "{why}");
    tokio::task::block_in_place(|| server.reconfigure(&["synchronous_standby_names = ''"]));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let view = store.get(&key).await.unwrap();
        if view.result.as_ref().is_ok_and(|v| v.state != oncegate_domain::ledger::State::Absent) {
            break;
        }
        assert!(Instant::now() < deadline, "the step never became visible: {view:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut retry = store_request("fp", "t2");
    retry.holder = "worker-1".into();
    let reply = store.request_token(&key, &retry, 0).await.unwrap();
    match reply.result {
        Ok(TokenOutcome::Granted(grant, _)) => assert_eq!(grant.token, "t1", "the same grant"),
        other => panic!("{other:?}"),
    }
}

/// A record whose bytes cannot be decoded: its action's calls answer INTERNAL and write nothing;
/// every other action is served, and the listing skips it.
#[tokio::test]
async fn an_undecodable_row_fails_its_action_alone() {
    let backend = crate::support::backend(crate::support::Kind::Postgres).await;
    let url = backend.postgres.clone().unwrap();
    let gate = TestGate::serve(backend, Policies::default()).await;
    let mut client = gate.client().await;
    let broken_request = token_request("billing", "r1", "pay", r#"{"amount":1}"#);
    let (broken, broken_grant) = grant(&mut client, broken_request.clone()).await;
    let (fine, fine_grant) = grant(
        &mut client,
        token_request("billing", "r1", "pay", r#"{"amount":2}"#),
    )
    .await;
    let scope = broken.scope.clone().unwrap();
    let key = ActionKey::new(&scope.agent_id, &scope.run_id, &broken.key).encode();
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    let db = url.rsplit('/').next().unwrap();
    crate::support::postgres::shared().psql(
        db,
        &format!("UPDATE oncegate_records SET record = '\\xc1'::bytea WHERE key = '\\x{hex}'::bytea"),
    );
    let status = client.request_token(broken_request).await.unwrap_err();
    expect_error(&status, Code::Internal, "INTERNAL");
    let status = complete(&mut client, &broken, &broken_grant.token, b"r")
        .await
        .unwrap_err();
    expect_error(&status, Code::Internal, "INTERNAL");
    let done = complete(&mut client, &fine, &fine_grant.token, b"paid")
        .await
        .unwrap();
    assert_eq!(done.receipt, b"paid");
    let Store::Postgres(_) = &gate.backend.store else {
        unreachable!()
    };
    let listed = gate.backend.store.list_unresolved(None, None, 10).await;
    assert!(listed.is_ok(), "{:?}", listed.err());
}
