//! Sentinel failover with a gate in front: a stream of grants and completes while the master is
//! killed (SIGKILL), and a switch announced while the old master still runs. Outcomes are counted
//! per action key on the new master.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use oncegate_domain::ActionKey;
use oncegate_gate::policy::Policies;
use oncegate_proto::{self as pb, action_gate_service_client::ActionGateServiceClient};
use oncegate_store::{
    Store,
    redis::{RedisOptions, RedisStore, Topology, keys},
};
use tonic::{Code, transport::Channel};

use crate::support::{
    Backend, TestGate, reason, test_options, token_request,
    topology::{MASTER_NAME, SentinelSet, query, wait_until},
};

type Client = ActionGateServiceClient<Channel>;

/// What the workers saw, per action key.
#[derive(Default)]
struct Seen {
    /// Tokens handed out per key (a re-delivery hands out the same token again).
    grants: HashMap<String, HashSet<String>>,
    /// Receipts of acknowledged Completes.
    completes: HashMap<String, Vec<u8>>,
    /// Calls that failed closed (STORE_UNAVAILABLE) and were retried.
    unavailable: usize,
    /// Completes refused because the grant was gone (TOKEN_UNKNOWN): a lost grant.
    grant_gone: usize,
    /// Acknowledged operations (grants and completes) and when the last one before/first one after
    /// the kill happened.
    acked_at: Vec<Instant>,
}

/// A gate over a Sentinel deployment (master + 2 replicas + 3 sentinels) at durability `level`.
async fn sentinel_gate(level: u32) -> (TestGate, Arc<Mutex<SentinelSet>>) {
    let set = tokio::task::spawn_blocking(|| SentinelSet::start(2, true))
        .await
        .unwrap();
    let topology = Topology::Sentinel {
        sentinels: set.addrs(),
        master: MASTER_NAME.into(),
    };
    let options = RedisOptions {
        durability_replicas: level,
        durability_timeout: Duration::from_millis(500),
        ..test_options()
    };
    let store = RedisStore::connect_to(&topology, options).await.unwrap();
    let set = Arc::new(Mutex::new(set));
    let backend = Backend {
        store: Store::Redis(store),
        redis: None,
        cluster: None,
        sentinel: None,
        postgres: None,
        pg_server: None,
        _dir: None,
    };
    (TestGate::serve(backend, Policies::default()).await, set)
}

fn request(worker: usize, i: usize) -> pb::RequestTokenRequest {
    let mut req = token_request(
        "agent",
        "run",
        "pay",
        &format!(r#"{{"w":{worker},"i":{i}}}"#),
    );
    req.idempotency_key = format!("w{worker}-{i}");
    req.holder = format!("worker-{worker}");
    req
}

/// One worker: grant, then complete, key after key, retrying calls that fail closed.
async fn worker(mut client: Client, w: usize, stop: Arc<AtomicBool>, seen: Arc<Mutex<Seen>>) {
    let retry = Duration::from_millis(50);
    for i in 0.. {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let key = format!("w{w}-{i}");
        let mut granted = None;
        for _ in 0..400 {
            match client.request_token(request(w, i)).await {
                Ok(resp) => {
                    let resp = resp.into_inner();
                    if let Some(grant) = resp.grant {
                        let mut seen = seen.lock().unwrap();
                        seen.grants
                            .entry(key.clone())
                            .or_default()
                            .insert(grant.token.clone());
                        seen.acked_at.push(Instant::now());
                        granted = Some((resp.action.unwrap(), grant.token));
                    }
                    break;
                }
                Err(status) if status.code() == Code::Unavailable => {
                    seen.lock().unwrap().unavailable += 1;
                    tokio::time::sleep(retry).await;
                }
                Err(status) => panic!("{key}: unexpected {status:?}"),
            }
        }
        let Some((action, token)) = granted else {
            continue;
        };
        let receipt = format!("receipt-{key}").into_bytes();
        for _ in 0..400 {
            let done = pb::CompleteRequest {
                action: Some(action.clone()),
                token: token.clone(),
                receipt: receipt.clone(),
            };
            match client.complete(done).await {
                Ok(_) => {
                    let mut seen = seen.lock().unwrap();
                    seen.completes.insert(key.clone(), receipt.clone());
                    seen.acked_at.push(Instant::now());
                    break;
                }
                Err(status) if status.code() == Code::Unavailable => {
                    seen.lock().unwrap().unavailable += 1;
                    tokio::time::sleep(retry).await;
                }
                Err(status) if reason(&status) == "TOKEN_UNKNOWN" => {
                    seen.lock().unwrap().grant_gone += 1;
                    break;
                }
                Err(status) => panic!("{key}: unexpected {status:?}"),
            }
        }
    }
}

/// The counts a failover run ends with.
#[derive(Debug)]
struct Report {
    grants: usize,
    completes: usize,
    unavailable: usize,
    /// Keys that got two different tokens from the workers' own retries.
    regranted_to_workers: usize,
    /// Keys granted before that an auditor could be granted again on the new master.
    granted_again: usize,
    /// Keys granted (token handed out) that the new master does not know.
    grants_lost: usize,
    /// Acknowledged Completes the new master does not have.
    completes_lost: usize,
    grant_gone: usize,
    /// Longest gap between two acknowledged operations (the unavailability window).
    longest_gap: Duration,
    failover_took: Duration,
    /// Bytes of the replication stream the best replica had not acknowledged just before the kill.
    /// An upper bound of the window: replicas acknowledge once a second unless a WAIT asks, so at
    /// level 0 most of it had already arrived.
    lag_at_kill: i64,
}

/// Streams grants and completes, SIGKILLs the master mid-stream, waits for Sentinel to promote a
/// replica and for the stream to resume there, then audits every key on the new master.
async fn failover_under_load(level: u32) -> Report {
    let (gate, set) = sentinel_gate(level).await;
    let old_master = set.lock().unwrap().master_port().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut workers = Vec::new();
    for w in 0..6 {
        let client = gate.client().await;
        workers.push(tokio::spawn(worker(client, w, stop.clone(), seen.clone())));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let lag_at_kill = replication_lag(old_master);
    let killed_at = Instant::now();
    set.lock().unwrap().server(old_master).stop();
    let promoted = promotion(set.clone(), old_master).await;
    let failover_took = killed_at.elapsed();
    // The stream must resume on the new master.
    let acked = || seen.lock().unwrap().acked_at.len();
    let before = acked();
    let deadline = Instant::now() + Duration::from_secs(20);
    while acked() < before + 60 {
        assert!(
            Instant::now() < deadline,
            "the stream did not resume after the failover"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }

    let seen = Arc::try_unwrap(seen).ok().unwrap().into_inner().unwrap();
    let client = gate.client().await;
    let mut report = Report {
        grants: seen.grants.len(),
        completes: seen.completes.len(),
        unavailable: seen.unavailable,
        regranted_to_workers: seen.grants.values().filter(|t| t.len() > 1).count(),
        granted_again: 0,
        grants_lost: 0,
        completes_lost: 0,
        grant_gone: seen.grant_gone,
        longest_gap: longest_gap(&seen.acked_at, killed_at),
        failover_took,
        lag_at_kill,
    };
    let mut present = None;
    for key in seen.grants.keys() {
        let (w, i) = parse_key(key);
        // Right after the switch a call may still fail closed while the gate re-resolves the
        // master: the audit retries those (and only those).
        let action = pb::GetActionRequest {
            action: Some(pb::ActionRef {
                scope: Some(pb::Scope {
                    agent_id: "agent".into(),
                    run_id: "run".into(),
                }),
                key: key.clone(),
            }),
        };
        let view = retry_unavailable(|| {
            let mut client = client.clone();
            let action = action.clone();
            async move { client.get_action(action).await }
        })
        .await
        .unwrap()
        .into_inner();
        if view.state() == pb::ActionState::Absent {
            report.grants_lost += 1;
        } else {
            present = Some(key.clone());
        }
        if let Some(receipt) = seen.completes.get(key)
            && view.completion.as_ref().map(|c| &c.receipt) != Some(receipt)
        {
            report.completes_lost += 1;
        }
        let mut auditor = request(w, i);
        auditor.holder = "auditor".into();
        let asked = retry_unavailable(|| {
            let mut client = client.clone();
            let auditor = auditor.clone();
            async move { client.request_token(auditor).await }
        })
        .await;
        match asked {
            Ok(resp) if resp.get_ref().grant.is_some() => report.granted_again += 1,
            Ok(_) => {}
            Err(status) => assert!(
                matches!(
                    reason(&status).as_str(),
                    "IDEMPOTENCY_IN_PROGRESS" | "LEASE_EXPIRED_UNRESOLVED"
                ),
                "{status:?}"
            ),
        }
    }
    // The audit ran on the promoted master: the records are really there.
    let some_key = present.expect("some record survived");
    let redis_key = keys::record(&ActionKey::new("agent", "run", some_key));
    // The master the sentinels name now (normally `promoted`; under load Sentinel may have moved
    // it once more while the stream ran).
    let master = set.lock().unwrap().master_port().unwrap_or(promoted);
    let exists: i64 = query(master, redis::cmd("EXISTS").arg(&redis_key)).unwrap();
    assert_eq!(exists, 1, "the audited records live on the current master");
    drop(gate);
    drop(set);
    report
}

impl Report {
    /// One line for the test output (`--nocapture`).
    fn line(&self, level: u32) -> String {
        format!(
            "durability level {level}, master SIGKILLed mid-stream: {} grants and {} completes acknowledged, \
             {} calls failed closed and were retried, failover took {:?} (Sentinel), longest gap \
             without an acknowledgement {:?}; after it: {} keys re-granted to a worker, {} granted again \
             to an auditor, {} acknowledged grants and {} acknowledged completes missing, {} completes \
             found their grant gone; unacknowledged replication stream at the kill {} bytes (upper bound)",
            self.grants,
            self.completes,
            self.unavailable,
            self.failover_took,
            self.longest_gap,
            self.regranted_to_workers,
            self.granted_again,
            self.grants_lost,
            self.completes_lost,
            self.grant_gone,
            self.lag_at_kill
        )
    }
}

/// `master_repl_offset` minus the best replica's acknowledged offset, from `INFO replication`.
fn replication_lag(master: u16) -> i64 {
    let info = crate::support::topology::info(master, "replication");
    let field = |line: &str, name: &str| {
        line.split([',', ':'])
            .find_map(|kv| kv.strip_prefix(name)?.parse::<i64>().ok())
    };
    let master_offset = info
        .lines()
        .find_map(|l| l.strip_prefix("master_repl_offset:")?.trim().parse().ok())
        .unwrap_or(0);
    let best = info
        .lines()
        .filter(|l| l.starts_with("slave"))
        .filter_map(|l| field(l, "offset="))
        .max()
        .unwrap_or(0);
    master_offset - best
}

fn parse_key(key: &str) -> (usize, usize) {
    let (w, i) = key.trim_start_matches('w').split_once('-').unwrap();
    (w.parse().unwrap(), i.parse().unwrap())
}

fn longest_gap(acked: &[Instant], since: Instant) -> Duration {
    let mut times: Vec<Instant> = acked.to_vec();
    times.push(since);
    times.sort();
    times
        .windows(2)
        .filter(|w| w[1] >= since)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn level_1_failover_under_load_never_grants_twice_nor_loses_an_acknowledged_complete() {
    let report = failover_under_load(1).await;
    eprintln!("{}", report.line(1));
    assert_eq!(report.regranted_to_workers, 0, "{report:#?}");
    assert_eq!(report.granted_again, 0, "{report:#?}");
    assert_eq!(report.completes_lost, 0, "{report:#?}");
    assert!(
        report.completes > 0 && report.unavailable > 0,
        "{report:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn level_0_failover_under_load_shows_the_window() {
    // No assertion on losses: with asynchronous replication they are possible, and this test only
    // measures them (see the report in the test output, `--nocapture`).
    let report = failover_under_load(0).await;
    eprintln!("{}", report.line(0));
    assert!(report.completes > 0, "{report:#?}");
}

/// A switch announced while the old master still runs: the gate writes to the new master at once,
/// although the old one still answers as a master until Sentinel converts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_is_followed_before_the_old_master_is_demoted() {
    let (gate, set) = sentinel_gate(0).await;
    let mut client = gate.client().await;
    client.request_token(request(0, 0)).await.unwrap();
    let (old_master, sentinel) = {
        let set = set.lock().unwrap();
        (set.master_port().unwrap(), set.sentinel_ports[0])
    };
    let _: String = query(
        sentinel,
        redis::cmd("SENTINEL").arg("FAILOVER").arg(MASTER_NAME),
    )
    .unwrap();
    let new_master = promotion(set.clone(), old_master).await;
    // Right after the switch: the gate fails closed or writes to the new master, never the old.
    let deadline = Instant::now() + Duration::from_secs(15);
    let resp = loop {
        match client.request_token(request(0, 1)).await {
            Ok(resp) => break resp.into_inner(),
            Err(status) if status.code() == Code::Unavailable => {
                assert!(
                    Instant::now() < deadline,
                    "the gate never used the new master"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(status) => panic!("{status:?}"),
        }
    };
    let old_role: Vec<redis::Value> = query(old_master, &redis::cmd("ROLE")).unwrap_or_default();
    let old_still_master =
        matches!(old_role.first(), Some(redis::Value::BulkString(r)) if r == b"master");
    eprintln!(
        "the old master still answered as a master when the gate granted: {old_still_master}"
    );
    let redis_key = keys::record(&ActionKey::new("agent", "run", resp.action.unwrap().key));
    let on_new: i64 = query(new_master, redis::cmd("EXISTS").arg(&redis_key)).unwrap();
    assert_eq!(on_new, 1, "the grant went to the new master");
}

/// Repeats `call` while it fails closed with UNAVAILABLE, for at most 10 s.
async fn retry_unavailable<T, F, Fut>(mut call: F) -> Result<T, tonic::Status>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match call().await {
            Err(status)
                if status.code() == tonic::Code::Unavailable && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => return other,
        }
    }
}

/// Waits (up to 30 s) until the sentinels name a master other than `old_master`; returns its port.
async fn promotion(set: Arc<Mutex<SentinelSet>>, old_master: u16) -> u16 {
    tokio::task::spawn_blocking(move || {
        let mut promoted = None;
        wait_until(
            "Sentinel promotes a replica",
            Duration::from_secs(30),
            || {
                promoted = set
                    .lock()
                    .unwrap()
                    .master_port()
                    .filter(|p| *p != old_master);
                promoted.is_some()
            },
        );
        promoted.unwrap()
    })
    .await
    .unwrap()
}
