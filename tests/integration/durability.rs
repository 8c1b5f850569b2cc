//! Durability levels (Redis `WAIT`): a grant is handed out, and a Complete acknowledged, only once
//! enough replicas confirmed it; otherwise the gate fails closed. On standalone (master + replica),
//! on a Cluster with replicas (WAIT reaches the node that owns the action's slot) and through a
//! per-action policy.

use std::time::Duration;

use oncegate_domain::ActionKey;
use oncegate_gate::policy::Policies;
use oncegate_proto::{self as pb};
use oncegate_store::redis::keys;
use tonic::Code;

use crate::support::{
    Backend, Kind, RedisServer, TestGate, backend_with, expect_error, test_options, token_request,
    topology::{RedisCluster, info, query, wait_until},
};

fn level(replicas: u32) -> oncegate_store::redis::RedisOptions {
    oncegate_store::redis::RedisOptions {
        durability_replicas: replicas,
        durability_timeout: Duration::from_millis(300),
        ..test_options()
    }
}

/// The master counts `replicas` replicas, every one of them online (done with its first sync)
/// and acknowledging script writes: for a second or so after the first sync, Redis 7.0 answers
/// `WAIT` after an `EVAL` with 0 now and then although the replica is online (plain writes are
/// counted). The gate fails closed then, as it must; the tests wait until scripts are counted.
fn in_sync(master: u16, replicas: usize) -> bool {
    let info = info(master, "replication");
    let online = info.contains(&format!("connected_slaves:{replicas}"))
        && info.matches("state=online").count() == replicas;
    if !online || replicas == 0 {
        return online;
    }
    let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{master}")) else {
        return false;
    };
    let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_secs(2)) else {
        return false;
    };
    let probe = redis::pipe()
        .cmd("EVAL")
        .arg("redis.call('SET', KEYS[1], '1') return 1")
        .arg(1)
        .arg("og-test:probe")
        .ignore()
        .cmd("WAIT")
        .arg(replicas)
        .arg(200)
        .query::<(i64,)>(&mut conn);
    matches!(probe, Ok((acked,)) if acked as usize >= replicas)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn level_1_fails_closed_without_a_replica_and_never_grants_twice() {
    let backend = backend_with(Kind::Redis, level(1)).await;
    let master = backend.redis.as_ref().unwrap().port;
    let mut replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &master.to_string()]);
    wait_until("the replica is in sync", Duration::from_secs(10), || {
        in_sync(master, 1)
    });
    let gate = TestGate::serve(backend, Policies::default()).await;
    let mut client = gate.client().await;

    // With a replica: granted, and the grant says one replica confirmed it.
    let resp = client
        .request_token(token_request("a", "r", "pay", r#"{"n":1}"#))
        .await
        .unwrap()
        .into_inner();
    let grant = resp.grant.unwrap();
    assert_eq!(grant.replicas_acknowledged, 1);
    let done = pb::CompleteRequest {
        action: resp.action.clone(),
        token: grant.token.clone(),
        receipt: b"paid".to_vec(),
    };

    // Without one: the grant is not handed out...
    replica.stop();
    wait_until(
        "the master sees the replica gone",
        Duration::from_secs(10),
        || in_sync(master, 0),
    );
    let mut req = token_request("a", "r", "pay", r#"{"n":2}"#);
    req.holder = "worker-1".into();
    let status = client.request_token(req.clone()).await.unwrap_err();
    expect_error(&status, Code::Unavailable, "STORE_UNAVAILABLE");
    // ...the action shows as in progress to anyone else, never granted a second time...
    let mut other = req.clone();
    other.holder = "worker-2".into();
    let status = client.request_token(other).await.unwrap_err();
    expect_error(&status, Code::Aborted, "IDEMPOTENCY_IN_PROGRESS");
    // ...and the same holder's retry is not handed the token either while no replica confirms
    // (the re-delivery is made to wait too).
    let status = client.request_token(req.clone()).await.unwrap_err();
    expect_error(&status, Code::Unavailable, "STORE_UNAVAILABLE");
    // A Complete that cannot be confirmed returns UNAVAILABLE, so the worker retries it.
    let status = client.complete(done.clone()).await.unwrap_err();
    expect_error(&status, Code::Unavailable, "STORE_UNAVAILABLE");

    // The replica comes back: the retried calls succeed, with the same token.
    replica.restart();
    wait_until(
        "the replica is back in sync",
        Duration::from_secs(10),
        || in_sync(master, 1),
    );
    let resp = client.request_token(req).await.unwrap().into_inner();
    assert!(
        resp.redelivered,
        "the same holder gets the token it was refused"
    );
    assert_eq!(resp.grant.unwrap().replicas_acknowledged, 1);
    let completion = client.complete(done).await.unwrap().into_inner();
    assert_eq!(completion.completion.unwrap().receipt, b"paid");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_raises_the_level_for_its_action_only() {
    let backend = backend_with(Kind::Redis, level(0)).await;
    let policies = crate::support::policies("[actions.\"payments.*\"]\ndurability_replicas = 1\n");
    let gate = TestGate::serve(backend, policies).await;
    let mut client = gate.client().await;
    // No replica at all: the payment fails closed, the e-mail (level 0) is granted.
    let status = client
        .request_token(token_request("a", "r", "payments.transfer", r#"{"n":1}"#))
        .await
        .unwrap_err();
    expect_error(&status, Code::Unavailable, "STORE_UNAVAILABLE");
    let resp = client
        .request_token(token_request("a", "r", "email.send", r#"{"n":1}"#))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.grant.unwrap().replicas_acknowledged, 0);
}

/// `(first slot, last slot, master port, replica ports)` of every slot range.
fn slot_map(port: u16) -> Vec<(i64, i64, u16, Vec<u16>)> {
    let slots: Vec<redis::Value> = query(port, redis::cmd("CLUSTER").arg("SLOTS")).unwrap();
    let int = |v: &redis::Value| match v {
        redis::Value::Int(n) => *n,
        other => panic!("{other:?}"),
    };
    let node_port = |v: &redis::Value| match v {
        redis::Value::Array(fields) => int(&fields[1]) as u16,
        other => panic!("{other:?}"),
    };
    slots
        .iter()
        .map(|range| match range {
            redis::Value::Array(f) => (
                int(&f[0]),
                int(&f[1]),
                node_port(&f[2]),
                f[3..].iter().map(node_port).collect(),
            ),
            other => panic!("{other:?}"),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_wait_reaches_the_node_that_owns_the_action() {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 1))
        .await
        .unwrap();
    let seed = cluster.nodes[0].port;
    wait_until(
        "every slot range lists its replica",
        Duration::from_secs(20),
        || slot_map(seed).iter().all(|r| r.3.len() == 1),
    );
    let map = slot_map(seed);
    let topology = oncegate_store::redis::Topology::Cluster {
        nodes: cluster.addrs(),
    };
    let store = oncegate_store::redis::RedisStore::connect_to(&topology, level(1))
        .await
        .unwrap();
    let mut cluster = cluster;
    // Stop the replica of the master that owns slot 0: only its actions lose their confirmation.
    let (_, _, weak_master, weak_replicas) = map.iter().find(|r| r.0 == 0).unwrap().clone();
    let replica = weak_replicas[0];
    cluster
        .nodes
        .iter_mut()
        .find(|n| n.port == replica)
        .unwrap()
        .stop();
    wait_until(
        "the master sees its replica gone",
        Duration::from_secs(10),
        || in_sync(weak_master, 0),
    );
    let backend = Backend {
        store: oncegate_store::Store::Redis(store),
        redis: None,
        cluster: Some(cluster),
        sentinel: None,
        postgres: None,
        pg_server: None,
        _dir: None,
    };
    let gate = TestGate::serve(backend, Policies::default()).await;
    let mut client = gate.client().await;
    let (mut refused, mut granted) = (0, 0);
    for i in 0..30 {
        // The hash tag is the agent: one agent per action spreads the actions over the slots.
        let agent = format!("agent-{i}");
        let mut req = token_request(&agent, "run", "orders.create", &format!(r#"{{"o":{i}}}"#));
        req.idempotency_key = format!("order-{i}");
        let result = client.request_token(req).await;
        let redis_key = keys::record(&ActionKey::new(agent, "run", format!("order-{i}")));
        let slot: i64 = query(seed, redis::cmd("CLUSTER").arg("KEYSLOT").arg(&redis_key)).unwrap();
        let owner = map.iter().find(|r| r.0 <= slot && slot <= r.1).unwrap().2;
        match result {
            Ok(resp) => {
                assert_ne!(
                    owner, weak_master,
                    "granted through the master without a replica"
                );
                assert_eq!(resp.into_inner().grant.unwrap().replicas_acknowledged, 1);
                granted += 1;
            }
            Err(status) => {
                expect_error(&status, Code::Unavailable, "STORE_UNAVAILABLE");
                assert_eq!(
                    owner, weak_master,
                    "refused on a master that has its replica"
                );
                refused += 1;
            }
        }
    }
    assert!(
        refused > 0 && granted > 0,
        "{refused} refused, {granted} granted"
    );
}
