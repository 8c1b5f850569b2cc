//! A Redis that may evict keys forgets completions: refused at start-up on
//! every topology, failing closed when the policy changes later, allowed only when the operator
//! says so (and then warned about in the log); and Redis errors a retry can cure (OOM) are STORE_UNAVAILABLE, so guards retry.

use tempfile::TempDir;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::support::{
    Backend, Kind, LoggedGate, RedisServer, TestGate, backend, expect_error, on_stores,
    serve_to_exit, token_request, wait_for_health,
};

fn set_policy(backend: &Backend, policy: &str) {
    for port in backend.data_ports() {
        let _: () = crate::support::topology::query(
            port,
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("maxmemory-policy")
                .arg(policy),
        )
        .unwrap();
    }
}

async fn an_evicting_redis_is_refused_at_start(kind: Kind) {
    let backend = backend(kind).await;
    set_policy(&backend, "allkeys-lru");
    let args = backend.gate_args();
    let (code, stderr) = tokio::task::spawn_blocking(move || serve_to_exit(&args))
        .await
        .unwrap();
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains("maxmemory-policy") && stderr.contains("allkeys-lru"),
        "{stderr}"
    );
    // The operator may accept the risk explicitly; it is said loudly, as a warning naming the
    // policy and the flag.
    let dir = TempDir::new().unwrap();
    let mut args = backend.gate_args();
    args.extend(["--allow-redis-eviction", "--listen", "127.0.0.1:0"].map(String::from));
    let (gate, _dir) = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        (LoggedGate::serve(&dir, &args), dir)
    })
    .await
    .unwrap();
    assert!(gate.addr.starts_with("127.0.0.1:"));
    let log = gate.log();
    let warning = log
        .lines()
        .find(|line| line.contains("UNSAFE"))
        .unwrap_or_else(|| panic!("no UNSAFE line: {log}"));
    assert!(warning.contains("WARN"), "{warning}");
    assert!(
        warning.contains("maxmemory-policy")
            && warning.contains("allkeys-lru")
            && warning.contains("--allow-redis-eviction"),
        "{warning}"
    );
}
on_stores!(an_evicting_redis_is_refused_at_start: redis, cluster, sentinel);

async fn an_eviction_policy_set_later_fails_closed(kind: Kind) {
    let gate = TestGate::start(kind).await;
    let addr = gate.addr.to_string();
    let client = &mut gate.client().await;
    client
        .request_token(token_request("a", "r", "x", r#"{"n":1}"#))
        .await
        .unwrap();
    set_policy(&gate.backend, "volatile-lru");
    wait_for_health(&addr, ServingStatus::NotServing).await;
    let status = client
        .request_token(token_request("a", "r", "x", r#"{"n":2}"#))
        .await
        .unwrap_err();
    expect_error(&status, Code::Unavailable, "STORE_UNAVAILABLE");
    set_policy(&gate.backend, "noeviction");
    wait_for_health(&addr, ServingStatus::Serving).await;
    client
        .request_token(token_request("a", "r", "x", r#"{"n":2}"#))
        .await
        .unwrap();
}
on_stores!(an_eviction_policy_set_later_fails_closed: redis, cluster, sentinel);

fn set_maxmemory(port: u16, limit: &str) {
    let _: () = crate::support::topology::query(
        port,
        redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(limit),
    )
    .unwrap();
}

/// Puts the server at `port` out of memory: 4 MiB of ballast under a 1 MB limit (noeviction).
fn out_of_memory(port: u16) {
    let fill = redis::cmd("SET")
        .arg("ballast")
        .arg(vec![b'x'; 4 << 20])
        .clone();
    let _: () = crate::support::topology::query(port, &fill).unwrap();
    set_maxmemory(port, "1mb");
}

/// Out of memory under noeviction refuses writes: a retry can succeed once memory is freed, so
/// it is STORE_UNAVAILABLE (retryable), not INTERNAL.
#[tokio::test]
async fn out_of_memory_is_store_unavailable() {
    let server = RedisServer::start();
    let port = server.port;
    out_of_memory(port);
    let backend = crate::support::backend_with_server(server).await;
    let gate = TestGate::serve(backend, oncegate_gate::policy::Policies::default()).await;
    let client = &mut gate.client().await;
    let status = client
        .request_token(token_request("a", "r", "x", r#"{"n":1}"#))
        .await
        .unwrap_err();
    expect_error(&status, Code::Unavailable, "STORE_UNAVAILABLE");
    // Memory freed (here: the limit lifted): the same call succeeds.
    set_maxmemory(port, "0");
    client
        .request_token(token_request("a", "r", "x", r#"{"n":1}"#))
        .await
        .unwrap();
}

/// Out of memory, what only reads still answers (a function registered `no-writes`): GetAction
/// of actions recorded before; what may write fails closed, a replay's RequestToken, a redelivery
/// and a repeated Complete included, although none of them would write.
#[tokio::test]
async fn out_of_memory_still_answers_reads() {
    let server = RedisServer::start();
    let port = server.port;
    let backend = crate::support::backend_with_server(server).await;
    let gate = TestGate::serve(backend, oncegate_gate::policy::Policies::default()).await;
    let client = &mut gate.client().await;
    let done = client
        .request_token(token_request("a", "r", "x", r#"{"n":1}"#))
        .await
        .unwrap()
        .into_inner();
    let complete = oncegate_proto::CompleteRequest {
        action: done.action.clone(),
        token: done.grant.unwrap().token,
        receipt: b"sent".to_vec(),
    };
    client.complete(complete.clone()).await.unwrap();
    let granted = client
        .request_token(token_request("a", "r", "x", r#"{"n":2}"#))
        .await
        .unwrap()
        .into_inner();
    out_of_memory(port);
    for (action, state) in [
        (&granted.action, oncegate_proto::ActionState::Authorized),
        (&done.action, oncegate_proto::ActionState::Completed),
    ] {
        let view = client
            .get_action(oncegate_proto::GetActionRequest {
                action: action.clone(),
            })
            .await
            .expect("a read answers out of memory")
            .into_inner();
        assert_eq!(view.state(), state);
    }
    // A new action, the completed one asked again (a replay) and the granted one asked again:
    // Redis refuses a function that may write while it is out of memory, so all fail closed.
    for n in [3, 1, 2] {
        let status = client
            .request_token(token_request("a", "r", "x", &format!(r#"{{"n":{n}}}"#)))
            .await
            .unwrap_err();
        expect_error(&status, Code::Unavailable, "STORE_UNAVAILABLE");
    }
    let status = client.complete(complete).await.unwrap_err();
    expect_error(&status, Code::Unavailable, "STORE_UNAVAILABLE");
}
