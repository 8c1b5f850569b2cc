//! PostgreSQL failover with two `oncegate` processes in front: a primary and a synchronous standby
//! started here (`initdb`, `pg_basebackup -R`, `synchronous_standby_names = '*'`,
//! `synchronous_commit = on`), both gates on the multi-host URL with
//! `target_session_attrs=read-write` at durability level 1. Many workers grant and complete (some
//! abandon their lease, some release and ask again) while the primary's processes are SIGKILLed
//! and the standby is promoted (`pg_ctl promote`); the gates are not restarted. Then every key is
//! audited through the gates: acknowledged Completes replay their receipt, nothing is granted
//! twice, every grant left unsettled is listed by ListUnresolved (and settles), and fencing only
//! grows. Outcomes are counted; nothing is timed.
//!
//! Does not own: the servers (`support::postgres`), the store's own fault tests.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use oncegate_proto::{
    self as pb, action_gate_service_client::ActionGateServiceClient,
    gate_admin_service_client::GateAdminServiceClient,
};
use tempfile::TempDir;
use tonic::{Code, transport::Channel};

use crate::support::{
    GateProcess, OPS_KEY, WORKER_KEY, authed, connect,
    postgres::{PgServer, SUPERUSER, program, server_dir},
    principals_toml, reason, token_request, write_file,
};

type Client = ActionGateServiceClient<Channel>;

const AGENT: &str = "billing-failover";
const WORKERS: usize = 8;
/// What a primary needs to feed a synchronous standby; the standby's base backup copies it, so a
/// promoted standby asks for a synchronous standby of its own too.
const REPLICATION: [&str; 5] = [
    "wal_level = replica",
    "max_wal_senders = 10",
    "hot_standby = on",
    "synchronous_standby_names = '*'",
    "wal_log_hints = on",
];

/// A standby of `primary`: a base backup that follows it (`-R`), started on a port of its own.
fn standby_of(primary: &PgServer) -> PgServer {
    let dir = server_dir();
    let out = program("pg_basebackup")
        .args(["-h", "127.0.0.1", "-p", &primary.port.to_string()])
        .args(["-U", SUPERUSER, "-R", "-X", "stream", "-c", "fast", "-D"])
        .arg(dir.path().join("data"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pg_basebackup: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PgServer::from_data_dir(dir, &[])
}

/// Waits (a failure bound of 60 s) until `primary` has a synchronous standby streaming.
fn wait_synchronous(primary: &PgServer) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let query = "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' \
                 AND sync_state = 'sync'";
    while primary.try_psql("postgres", query).as_deref() != Ok("1") {
        assert!(Instant::now() < deadline, "no synchronous standby");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn promote(standby: &PgServer) {
    let out = program("pg_ctl")
        .args(["promote", "-w", "-t", "60", "-D"])
        .arg(standby.data_dir())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pg_ctl promote: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One grant a worker was handed, in the order it was handed out.
struct Granted {
    token: String,
    fencing: u64,
}

/// What the workers saw, per action key.
#[derive(Default)]
struct Seen {
    grants: HashMap<String, Vec<Granted>>,
    /// Acknowledged Releases per key (each allows one more token).
    releases: HashMap<String, usize>,
    /// Receipts of acknowledged Completes.
    completes: HashMap<String, Vec<u8>>,
    /// Keys whose last grant was left to expire (the worker walked away), or whose Complete never
    /// had an answer.
    unsettled: HashSet<String>,
    /// Calls that failed closed (UNAVAILABLE) and were retried.
    unavailable: usize,
    /// Answers the contract does not allow here (`TOKEN_UNKNOWN` after a grant among them).
    unexpected: Vec<String>,
    acked: usize,
}

fn request(w: usize, i: usize) -> pb::RequestTokenRequest {
    let mut req = token_request(AGENT, "run", "pay", &format!(r#"{{"w":{w},"i":{i}}}"#));
    req.idempotency_key = format!("w{w}-{i}");
    req.holder = format!("worker-{w}");
    req
}

fn action_ref(key: &str) -> pb::ActionRef {
    pb::ActionRef {
        scope: Some(pb::Scope {
            agent_id: AGENT.into(),
            run_id: "run".into(),
        }),
        key: key.into(),
    }
}

/// Repeats `call` while it fails closed with UNAVAILABLE (each one counted), for at most 60 s.
async fn retried<T, F, Fut>(seen: &Mutex<Seen>, mut call: F) -> Result<T, tonic::Status>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match call().await {
            Err(status) if status.code() == Code::Unavailable && Instant::now() < deadline => {
                seen.lock().unwrap().unavailable += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => return other,
        }
    }
}

/// Grants `key` (retrying what fails closed); the action and token, recorded.
async fn grant(
    client: &Client,
    seen: &Mutex<Seen>,
    w: usize,
    i: usize,
) -> Option<(pb::ActionRef, String)> {
    let key = format!("w{w}-{i}");
    let asked = retried(seen, || {
        let mut client = client.clone();
        async move {
            client
                .request_token(authed(request(w, i), Some(WORKER_KEY)))
                .await
        }
    })
    .await;
    let mut seen = seen.lock().unwrap();
    match asked.map(|r| r.into_inner()) {
        Ok(pb::RequestTokenResponse {
            grant: Some(grant),
            action: Some(action),
            ..
        }) => {
            seen.acked += 1;
            let grants = seen.grants.entry(key).or_default();
            grants.push(Granted {
                token: grant.token.clone(),
                fencing: grant.fencing,
            });
            Some((action, grant.token))
        }
        Ok(other) => {
            seen.unexpected
                .push(format!("{key}: granted nothing: {other:?}"));
            None
        }
        // The grant committed but its answer was lost, and the retries failed closed until its
        // lease ended: an unresolved action, which the listing at the end must name.
        Err(status) if reason(&status) == "LEASE_EXPIRED_UNRESOLVED" => {
            seen.unsettled.insert(key);
            None
        }
        Err(status) => {
            seen.unexpected
                .push(format!("{key}: RequestToken {status:?}"));
            None
        }
    }
}

/// One worker on one gate: key after key, grant then complete; every tenth key abandoned (its
/// lease left to end), every tenth released and asked again before it completes.
async fn worker(client: Client, w: usize, stop: Arc<AtomicBool>, seen: Arc<Mutex<Seen>>) {
    for i in 0.. {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let key = format!("w{w}-{i}");
        let Some((action, mut token)) = grant(&client, &seen, w, i).await else {
            continue;
        };
        match (w + i) % 10 {
            0 => {
                seen.lock().unwrap().unsettled.insert(key);
                continue;
            }
            1 => {
                let released = retried(&seen, || {
                    let mut client = client.clone();
                    let release = pb::ReleaseRequest {
                        action: Some(action.clone()),
                        token: token.clone(),
                        reason: pb::ReleaseReason::DefiniteFailure as i32,
                    };
                    async move { client.release(authed(release, Some(WORKER_KEY))).await }
                })
                .await;
                match released {
                    Ok(_) => {
                        *seen
                            .lock()
                            .unwrap()
                            .releases
                            .entry(key.clone())
                            .or_default() += 1
                    }
                    Err(status) => {
                        let mut seen = seen.lock().unwrap();
                        seen.unexpected.push(format!("{key}: Release {status:?}"));
                        seen.unsettled.insert(key);
                        continue;
                    }
                }
                match grant(&client, &seen, w, i).await {
                    Some((_, again)) => token = again,
                    None => continue,
                }
            }
            _ => {}
        }
        let receipt = format!("receipt-{key}").into_bytes();
        let done = retried(&seen, || {
            let mut client = client.clone();
            let complete = pb::CompleteRequest {
                action: Some(action.clone()),
                token: token.clone(),
                receipt: receipt.clone(),
            };
            async move { client.complete(authed(complete, Some(WORKER_KEY))).await }
        })
        .await;
        let mut seen = seen.lock().unwrap();
        match done {
            Ok(_) => {
                seen.acked += 1;
                seen.completes.insert(key, receipt);
            }
            Err(status) if status.code() == Code::Unavailable => {
                seen.unsettled.insert(key);
            }
            Err(status) => {
                seen.unexpected.push(format!("{key}: Complete {status:?}"));
                seen.unsettled.insert(key);
            }
        }
    }
}

/// What the audit after the failover found.
#[derive(Debug, Default)]
struct Report {
    grants: usize,
    completes: usize,
    unsettled: usize,
    unavailable: usize,
    /// Acknowledged Completes whose receipt does not come back (GetAction, or a replay).
    completes_lost: usize,
    /// Keys handed more tokens than their acknowledged Releases allow.
    granted_twice: usize,
    /// Keys an auditor's RequestToken was granted (an unsettled or completed action).
    granted_again: usize,
    /// Grants whose fencing is not above the key's previous one.
    fencing_not_growing: usize,
    /// Unsettled keys neither completed nor listed by ListUnresolved.
    forgotten: usize,
    /// Listed keys that ResolveExpired would not settle.
    not_settled: usize,
    settled: usize,
}

/// Every unresolved action of [`AGENT`], all pages, through `admin` (failing closed is retried).
async fn unresolved(admin: &GateAdminServiceClient<Channel>, seen: &Mutex<Seen>) -> Vec<String> {
    let mut keys = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = retried(seen, || {
            let mut admin = admin.clone();
            let req = pb::ListUnresolvedRequest {
                agent_id: AGENT.into(),
                page_size: 1000,
                page_token: page_token.clone(),
            };
            async move { admin.list_unresolved(authed(req, Some(OPS_KEY))).await }
        })
        .await
        .unwrap()
        .into_inner();
        keys.extend(page.actions.into_iter().map(|a| a.action.unwrap().key));
        if page.next_page_token.is_empty() {
            return keys;
        }
        page_token = page.next_page_token;
    }
}

/// Audits every key the workers were granted, through `client` and `admin`.
async fn audit(
    client: &Client,
    admin: &GateAdminServiceClient<Channel>,
    seen: &Mutex<Seen>,
    report: &mut Report,
) {
    let (grants, completes, unsettled, releases) = {
        let s = seen.lock().unwrap();
        let grants: Vec<(String, Vec<(String, u64)>)> = s
            .grants
            .iter()
            .map(|(k, g)| {
                (
                    k.clone(),
                    g.iter().map(|g| (g.token.clone(), g.fencing)).collect(),
                )
            })
            .collect();
        (
            grants,
            s.completes.clone(),
            s.unsettled.clone(),
            s.releases.clone(),
        )
    };
    for (key, tokens) in &grants {
        let distinct: HashSet<&String> = tokens.iter().map(|(t, _)| t).collect();
        if distinct.len() > 1 + releases.get(key).copied().unwrap_or(0) {
            report.granted_twice += 1;
        }
        let mut last: Option<&(String, u64)> = None;
        for g in tokens {
            match last {
                Some(prev) if prev.0 == g.0 && prev.1 != g.1 => report.fencing_not_growing += 1,
                Some(prev) if prev.0 != g.0 && g.1 <= prev.1 => report.fencing_not_growing += 1,
                _ => {}
            }
            last = Some(g);
        }
        // An auditor asking the same request: a replay, a refusal, never a grant.
        let (w, i) = key.trim_start_matches('w').split_once('-').unwrap();
        let mut auditor = request(w.parse().unwrap(), i.parse().unwrap());
        auditor.holder = "auditor".into();
        let asked = retried(seen, || {
            let mut client = client.clone();
            let auditor = auditor.clone();
            async move {
                client
                    .request_token(authed(auditor, Some(WORKER_KEY)))
                    .await
            }
        })
        .await;
        match asked.map(|r| r.into_inner()) {
            Ok(resp) if resp.grant.is_some() => report.granted_again += 1,
            Ok(resp) => {
                let replayed = resp.completion.map(|c| c.receipt);
                if let Some(receipt) = completes.get(key)
                    && replayed.as_ref() != Some(receipt)
                {
                    report.completes_lost += 1;
                }
            }
            Err(status) => {
                if completes.contains_key(key) {
                    report.completes_lost += 1;
                }
                assert!(
                    matches!(
                        reason(&status).as_str(),
                        "IDEMPOTENCY_IN_PROGRESS" | "LEASE_EXPIRED_UNRESOLVED"
                    ),
                    "{key}: {status:?}"
                );
            }
        }
    }
    // Unsettled grants: listed once their leases ended (or completed by a Complete whose answer
    // was lost), and each listed one settles.
    let listed: HashSet<String> = unresolved(admin, seen).await.into_iter().collect();
    report.completes_lost += listed.iter().filter(|k| completes.contains_key(*k)).count();
    for key in unsettled.iter().filter(|k| !completes.contains_key(*k)) {
        if listed.contains(key) {
            continue;
        }
        let view = retried(seen, || {
            let mut client = client.clone();
            let get = pb::GetActionRequest {
                action: Some(action_ref(key)),
            };
            async move { client.get_action(authed(get, Some(WORKER_KEY))).await }
        })
        .await
        .unwrap()
        .into_inner();
        if view.state() != pb::ActionState::Completed {
            report.forgotten += 1;
        }
    }
    for key in &listed {
        let settled = retried(seen, || {
            let mut admin = admin.clone();
            let resolve = pb::ResolveExpiredRequest {
                action: Some(action_ref(key)),
                resolution: pb::Resolution::Failed as i32,
                note: "failover audit".into(),
                ..Default::default()
            };
            async move { admin.resolve_expired(authed(resolve, Some(OPS_KEY))).await }
        })
        .await;
        match settled {
            Ok(_) => report.settled += 1,
            Err(_) => report.not_settled += 1,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn primary_killed_and_standby_promoted_under_load_loses_nothing_acknowledged() {
    let primary = tokio::task::spawn_blocking(|| PgServer::start_with(&REPLICATION))
        .await
        .unwrap();
    let mut primary = Some(primary);
    let standby = {
        let p = primary.as_ref().unwrap();
        let standby = standby_of(p);
        wait_synchronous(p);
        standby
    };
    let url = format!(
        "postgresql://{SUPERUSER}@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
        primary.as_ref().unwrap().port,
        standby.port
    );
    let dir = TempDir::new().unwrap();
    let config = write_file(
        dir.path(),
        "oncegate.toml",
        &format!("[defaults]\nlease_ttl_seconds = 2\n{}", principals_toml("")),
    );
    let args = [
        "--postgres-url",
        &url,
        "--durability-replicas",
        "1",
        "--config",
        config.to_str().unwrap(),
    ];
    let gates = [GateProcess::spawn(&args), GateProcess::spawn(&args)];

    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let client = connect(&gates[w % 2].addr).await;
        workers.push(tokio::spawn(worker(client, w, stop.clone(), seen.clone())));
    }
    let acked = || seen.lock().unwrap().acked;
    wait_for_acks(&acked, 200, "the load never started").await;

    // The primary's processes die at once; the standby is promoted; the gates go on.
    primary.take().unwrap().kill();
    let standby = tokio::task::spawn_blocking(move || {
        promote(&standby);
        standby
    })
    .await
    .unwrap();
    // The promoted server asks for a synchronous standby of its own (the setting came with its
    // base backup): commits wait until one streams from it.
    let (standby, _next) = tokio::task::spawn_blocking(move || {
        let next = standby_of(&standby);
        wait_synchronous(&standby);
        (standby, next)
    })
    .await
    .unwrap();
    let resumed_from = acked();
    wait_for_acks(
        &acked,
        resumed_from + 200,
        "the stream did not resume on the promoted server",
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    // Every abandoned lease ends (2 s) before the listing.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let client = connect(&gates[1].addr).await;
    let admin = GateAdminServiceClient::connect(format!("http://{}", gates[0].addr))
        .await
        .unwrap();
    let mut report = {
        let s = seen.lock().unwrap();
        Report {
            grants: s.grants.len(),
            completes: s.completes.len(),
            unsettled: s.unsettled.len(),
            ..Report::default()
        }
    };
    audit(&client, &admin, &seen, &mut report).await;
    report.unavailable = seen.lock().unwrap().unavailable;
    let unexpected = std::mem::take(&mut seen.lock().unwrap().unexpected);
    eprintln!(
        "PostgreSQL failover under load: {} keys granted, {} Completes acknowledged, {} grants \
         left unsettled, {} calls failed closed and were retried; after it: {} acknowledged \
         Completes missing, {} keys granted twice, {} granted again to an auditor, {} fencing \
         numbers not growing, {} unsettled grants forgotten, {} listed and settled, {} not settled",
        report.grants,
        report.completes,
        report.unsettled,
        report.unavailable,
        report.completes_lost,
        report.granted_twice,
        report.granted_again,
        report.fencing_not_growing,
        report.forgotten,
        report.settled,
        report.not_settled
    );
    assert!(unexpected.is_empty(), "{unexpected:#?}");
    assert_eq!(report.completes_lost, 0, "{report:#?}");
    assert_eq!(report.granted_twice, 0, "{report:#?}");
    assert_eq!(report.granted_again, 0, "{report:#?}");
    assert_eq!(report.fencing_not_growing, 0, "{report:#?}");
    assert_eq!(report.forgotten, 0, "{report:#?}");
    assert_eq!(report.not_settled, 0, "{report:#?}");
    // The failover happened under the load: calls failed closed, and work went on after it.
    assert!(
        report.unavailable > 0 && report.completes > 0,
        "{report:#?}"
    );
    // The audit ran on the promoted server.
    assert_eq!(standby.psql("postgres", "SELECT pg_is_in_recovery()"), "f");
}

/// Waits until `acked()` reaches `count`; fails the test after 120 s (a failure bound, not a
/// timing assertion).
async fn wait_for_acks(acked: &impl Fn() -> usize, count: usize, failure: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while acked() < count {
        assert!(Instant::now() < deadline, "{failure}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
