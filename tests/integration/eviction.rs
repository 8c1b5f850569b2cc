//! A Redis that may evict keys forgets completions (issue 11, item 4): refused at start-up on
//! every topology, failing closed when the policy changes later, allowed only when the operator
//! says so (and then warned about in the log); and Redis errors a retry can cure (OOM) are STORE_UNAVAILABLE, so guards retry.

use tempfile::TempDir;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::support::{
    Backend, Kind, LoggedGate, RedisServer, TestGate, backend, expect_error, on_stores,
    serve_to_exit, token_request, wait_for_health,
};

/// Every data node of a Redis backend, by port.
fn data_ports(backend: &Backend) -> Vec<u16> {
    if let Some(redis) = &backend.redis {
        vec![redis.port]
    } else if let Some(cluster) = &backend.cluster {
        cluster.nodes.iter().map(|n| n.port).collect()
    } else if let Some(sentinel) = &backend.sentinel {
        sentinel.servers.iter().map(|s| s.port).collect()
    } else {
        Vec::new()
    }
}

fn set_policy(backend: &Backend, policy: &str) {
    for port in data_ports(backend) {
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

/// Out of memory under noeviction refuses writes: a retry can succeed once memory is freed, so
/// it is STORE_UNAVAILABLE (retryable), not INTERNAL.
#[tokio::test]
async fn out_of_memory_is_store_unavailable() {
    let server = RedisServer::start();
    let port = server.port;
    let fill = redis::cmd("SET")
        .arg("ballast")
        .arg(vec![b'x'; 4 << 20])
        .clone();
    let _: () = crate::support::topology::query(port, &fill).unwrap();
    let _: () = crate::support::topology::query(
        port,
        redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg("1mb"),
    )
    .unwrap();
    let backend = crate::support::backend_with_server(server).await;
    let gate = TestGate::serve(backend, oncegate_gate::policy::Policies::default()).await;
    let client = &mut gate.client().await;
    let status = client
        .request_token(token_request("a", "r", "x", r#"{"n":1}"#))
        .await
        .unwrap_err();
    expect_error(&status, Code::Unavailable, "STORE_UNAVAILABLE");
    // Memory freed (here: the limit lifted): the same call succeeds.
    let _: () = crate::support::topology::query(
        port,
        redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg("0"),
    )
    .unwrap();
    client
        .request_token(token_request("a", "r", "x", r#"{"n":1}"#))
        .await
        .unwrap();
}

/// Out of memory, what only reads still answers (a function registered `no-writes`): GetAction
/// of an action granted before; what may write fails closed, a replay's RequestToken included.
#[tokio::test]
async fn out_of_memory_still_answers_reads() {
    let server = RedisServer::start();
    let port = server.port;
    let backend = crate::support::backend_with_server(server).await;
    let gate = TestGate::serve(backend, oncegate_gate::policy::Policies::default()).await;
    let client = &mut gate.client().await;
    let granted = client
        .request_token(token_request("a", "r", "x", r#"{"n":1}"#))
        .await
        .unwrap()
        .into_inner();
    let fill = redis::cmd("SET")
        .arg("ballast")
        .arg(vec![b'x'; 4 << 20])
        .clone();
    let _: () = crate::support::topology::query(port, &fill).unwrap();
    let _: () = crate::support::topology::query(
        port,
        redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg("1mb"),
    )
    .unwrap();
    let view = client
        .get_action(oncegate_proto::GetActionRequest {
            action: granted.action.clone(),
        })
        .await
        .expect("a read answers out of memory")
        .into_inner();
    assert_eq!(view.state(), oncegate_proto::ActionState::Authorized);
    let status = client
        .request_token(token_request("a", "r", "x", r#"{"n":2}"#))
        .await
        .unwrap_err();
    expect_error(&status, Code::Unavailable, "STORE_UNAVAILABLE");
}
