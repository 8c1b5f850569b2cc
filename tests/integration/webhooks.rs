//! Webhooks (docs/CONTRACT.md §7) end to end, against a real receiver on `127.0.0.1:0`
//! ([`Receiver`]): every event type delivered as a CloudEvent signed by every configured secret
//! (rotation), a receiver down then up (retried, the same `webhook-id`), one that never answers
//! 2xx (undeliverable, counted in `/metrics`, listed by `oncegate admin webhooks`), a real `oncegate
//! serve` killed with SIGKILL during a delivery (delivered after the restart, the same id), budget
//! refusals aggregated into one event, Slack bodies, the outbox's contract on each store, and a
//! RequestToken that costs one store round trip.

use std::time::Duration;

use oncegate_proto::{
    self as pb, action_gate_service_client::ActionGateServiceClient,
    gate_admin_service_client::GateAdminServiceClient,
};
use oncegate_store::{NewEntry, OutboxState, Settlement};
use serde_json::{Value, json};
use tempfile::TempDir;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::support::{
    Answer, Delivery, GateProcess, Kind, OPS_KEY, Receiver, RedisServer, Scrape, StoreTime,
    TestGate, WORKER_KEY, authed, backend, complete_as, config, connect, grant_as, on_stores,
    oncegate_command, principals_toml, token_request, ttl_ms, wait_for_health, with_rules,
    write_file,
};

/// The Standard Webhooks specification's example secret, and a second one (rotation).
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const NEXT_SECRET: &str = "whsec_CQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQk=";

const RULES: &str = r#"
@id("all") permit(principal, action, resource);
@id("deletes") @hold("deletes need approval")
permit(principal, action == Action::"files.delete", resource);
"#;

/// Fast settings for tests: the outbox read often, short budget windows and scans.
const NOTIFICATIONS: &str = "
[notifications]
poll_interval_seconds = 0.05
scan_interval_seconds = 0.2
budget_window_seconds = 0.5
";

/// A `[[webhooks]]` entry named `ops` to `url`, quick to retry, with `extra` settings.
fn webhook(url: &str, events: &str, extra: &str) -> String {
    format!(
        "[[webhooks]]\nname = \"ops\"\nurl = \"{url}\"\nevents = {events}\nretry_initial_seconds = 0.05\nretry_max_seconds = 0.2\n{extra}\n"
    )
}

/// The configuration of a gate with the hold rule, principals, a velocity cap on `send.*`, a
/// regranting `pay.*` and `hook`.
fn gate_config(dir: &TempDir, hook: &str) -> String {
    format!(
        "{}\n[[budgets]]\nname = \"sends\"\nactions = [\"send.*\"]\nwindow_seconds = 60\nlimit = 1\n\n[actions.\"pay.*\"]\non_expiry = \"regrant\"\n{NOTIFICATIONS}\n{hook}\n{}",
        with_rules(dir.path(), RULES, "approval_ttl_seconds = 60\n"),
        principals_toml("")
    )
}

async fn ask(
    client: &mut ActionGateServiceClient<Channel>,
    req: pb::RequestTokenRequest,
) -> Result<pb::RequestTokenResponse, tonic::Status> {
    client
        .request_token(authed(req, Some(WORKER_KEY)))
        .await
        .map(|r| r.into_inner())
}

fn delete(path: &str) -> pb::RequestTokenRequest {
    token_request(
        "billing-files",
        "run-1",
        "files.delete",
        &format!(r#"{{"path":"{path}"}}"#),
    )
}

/// Holds a delete for approval; returns the action and the approval.
async fn hold(
    client: &mut ActionGateServiceClient<Channel>,
    path: &str,
) -> (pb::ActionRef, String) {
    let resp = ask(client, delete(path)).await.unwrap();
    assert_eq!(resp.decision(), pb::Decision::PendingApproval, "{resp:?}");
    (resp.action.unwrap(), resp.approval.unwrap().id)
}

/// Checks what every CloudEvents delivery must be, and returns its body.
fn cloudevent(d: &Delivery, event: &str) -> Value {
    let body = d.json();
    assert_eq!(body["specversion"], "1.0", "{body}");
    assert_eq!(body["type"], format!("dev.oncegate.{event}"));
    assert_eq!(body["id"], d.id.as_str(), "webhook-id is the event id");
    assert!(d.id.starts_with("evt_"));
    assert_eq!(body["source"], "oncegate");
    assert_eq!(body["datacontenttype"], "application/json");
    assert!(body["time"].as_str().unwrap().ends_with('Z'), "{body}");
    assert!(body["subject"].is_string());
    assert!(d.content_type.starts_with("application/cloudevents+json"));
    assert!(d.timestamp.parse::<i64>().unwrap() > 1_600_000_000);
    body
}

async fn every_event_type_is_delivered_signed_by_every_secret(kind: Kind) {
    let receiver = Receiver::start(Answer::Ok).await;
    let dir = TempDir::new().unwrap();
    let hook = webhook(
        &receiver.url(),
        "\"*\"",
        &format!("secrets = [\"{SECRET}\", \"{NEXT_SECRET}\"]"),
    );
    let (gate, _) =
        TestGate::serve_with_webhooks(backend(kind).await, config(&gate_config(&dir, &hook))).await;
    let mut client = gate.client().await;
    let mut admin = gate.admin().await;

    // approval.requested, then approval.decided.
    let (held, approval_id) = hold(&mut client, "/tmp/a").await;
    admin
        .decide_approval(authed(
            pb::DecideApprovalRequest {
                action: Some(held.clone()),
                approval_id: approval_id.clone(),
                approve: true,
                note: "ticket-9".into(),
            },
            Some(OPS_KEY),
        ))
        .await
        .unwrap();
    // action.unresolved (a reconciling action's lease ends) and execution.doubled (a regranting
    // one's expired token completes after the regrant).
    let mut lapsing = token_request("billing-a", "run-1", "export.csv", r#"{"n":1}"#);
    lapsing.lease_ttl = ttl_ms(1000);
    let (lapsed, lapsed_grant) = grant_as(&mut client, lapsing.clone(), Some(WORKER_KEY)).await;
    let mut paying = token_request("billing-a", "run-1", "pay.out", r#"{"n":2}"#);
    paying.lease_ttl = ttl_ms(1000);
    let (paid, first) = grant_as(&mut client, paying.clone(), Some(WORKER_KEY)).await;
    for lease in [first.lease_expires_at, lapsed_grant.lease_expires_at] {
        StoreTime::System.pass_beyond(lease.unwrap()).await;
    }
    let regrant = ask(&mut client, paying).await.unwrap().grant.unwrap();
    assert_ne!(regrant.token, first.token);
    complete_as(&mut client, &paid, &first.token, b"done", Some(WORKER_KEY))
        .await
        .unwrap();
    // budget.exceeded: one grant within the cap, three refusals, one event.
    for n in 0..4 {
        let req = token_request(
            "billing-a",
            "run-1",
            "send.mail",
            &format!(r#"{{"n":{n}}}"#),
        );
        let answer = ask(&mut client, req).await;
        assert_eq!(answer.is_ok(), n == 0, "{answer:?}");
    }

    let secrets = |d: &Delivery| {
        assert!(d.signed_by(SECRET) && d.signed_by(NEXT_SECRET), "{d:?}");
        assert_eq!(d.signature.as_ref().unwrap().split(' ').count(), 2);
    };
    let requested = receiver.wait_for_type("approval.requested").await;
    let body = cloudevent(&requested[0], "approval.requested");
    secrets(&requested[0]);
    assert_eq!(body["subject"], "billing-files");
    assert_eq!(body["data"]["approval_id"], approval_id.as_str());
    assert_eq!(body["data"]["action"], "files.delete");
    assert_eq!(body["data"]["params"], json!({"path": "/tmp/a"}));
    assert_eq!(body["data"]["policy_id"], "deletes");
    assert_eq!(body["data"]["reason"], "deletes need approval");

    let decided = receiver.wait_for_type("approval.decided").await;
    let body = cloudevent(&decided[0], "approval.decided");
    secrets(&decided[0]);
    assert_eq!(body["data"]["decision"], "approved");
    assert_eq!(body["data"]["operator"], "ops");
    assert_eq!(body["data"]["note"], "ticket-9");

    let key_of = |d: &Delivery| d.json()["data"]["key"].as_str().unwrap().to_owned();
    let unresolved = receiver
        .wait_until("action.unresolved of the lapsed action", |got| {
            got.iter().any(|d| {
                d.json()["type"] == "dev.oncegate.action.unresolved" && key_of(d) == lapsed.key
            })
        })
        .await;
    let d = unresolved
        .iter()
        .find(|d| d.json()["type"] == "dev.oncegate.action.unresolved" && key_of(d) == lapsed.key)
        .unwrap();
    let body = cloudevent(d, "action.unresolved");
    secrets(d);
    assert_eq!(body["data"]["fencing"], lapsed_grant.fencing);
    assert_eq!(body["data"]["run_id"], "run-1");
    assert!(
        body["data"]["provider_key"]
            .as_str()
            .unwrap()
            .starts_with("og-")
    );

    let doubled = receiver.wait_for_type("execution.doubled").await;
    let body = cloudevent(&doubled[0], "execution.doubled");
    secrets(&doubled[0]);
    assert_eq!(body["data"]["kind"], "superseded_completion");
    assert_eq!(body["data"]["key"], paid.key.as_str());
    assert_eq!(body["data"]["fencing"], first.fencing);

    let budget = receiver.wait_for_type("budget.exceeded").await;
    let body = cloudevent(&budget[0], "budget.exceeded");
    secrets(&budget[0]);
    assert_eq!(body["data"]["budget"], "sends");
    assert_eq!(body["data"]["agent_id"], "billing-a");
    assert_eq!(body["data"]["refusals"], 3, "three refusals, one event");
    assert_eq!(body["data"]["actions"], json!(["send.mail"]));
    assert!(budget.iter().all(|d| d.id == budget[0].id));

    for d in receiver.deliveries() {
        for token in [&first.token, &regrant.token, &lapsed_grant.token] {
            assert!(!d.body.contains(token.as_str()), "a token in {}", d.body);
        }
    }

    // store.unavailable: the store goes away and comes back (Redis: the test's own server).
    if kind == Kind::Redis {
        let addr = gate.addr.to_string();
        let mut gate = gate;
        let redis = gate.backend.redis.as_mut().unwrap();
        redis.stop();
        wait_for_health(&addr, ServingStatus::NotServing).await;
        redis.restart();
        wait_for_health(&addr, ServingStatus::Serving).await;
        let down = receiver.wait_for_type("store.unavailable").await;
        let body = cloudevent(&down[0], "store.unavailable");
        secrets(&down[0]);
        assert_eq!(body["subject"], "redis");
        assert_eq!(body["data"]["store"], "redis");
        assert!(
            body["data"]["since"].as_str() < body["data"]["until"].as_str(),
            "{body}"
        );
    }
}
on_stores!(every_event_type_is_delivered_signed_by_every_secret: embedded, redis, postgres);

/// The webhook deliveries counted for `ops` and approval.requested with `outcome`.
async fn delivered(metrics: std::net::SocketAddr, outcome: &str) -> f64 {
    Scrape::fetch(metrics).await.sum(
        "oncegate_webhook_deliveries_total",
        &[
            ("webhook", "ops"),
            ("event", "approval.requested"),
            ("outcome", outcome),
        ],
    )
}

/// Waits (up to 20 s) until `metric` of `/metrics` at `addr` (summed) is `want`.
async fn wait_for_metric(
    addr: std::net::SocketAddr,
    metric: &str,
    labels: &[(&str, &str)],
    want: f64,
) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let value = Scrape::fetch(addr).await.sum(metric, labels);
        if value == want {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{metric} {labels:?} is {value}, not {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn a_receiver_down_then_up_gets_the_event_again_with_the_same_id(kind: Kind) {
    let receiver = Receiver::start(Answer::StatusThenOk(503, 2)).await;
    let dir = TempDir::new().unwrap();
    let hook = webhook(
        &receiver.url(),
        "[\"approval.requested\"]",
        &format!("secrets = [\"{SECRET}\"]"),
    );
    let (gate, metrics) =
        TestGate::serve_with_webhooks(backend(kind).await, config(&gate_config(&dir, &hook))).await;
    let mut client = gate.client().await;
    hold(&mut client, "/tmp/b").await;
    let got = receiver
        .wait_until("three attempts", |got| got.len() >= 3)
        .await;
    assert!(
        got.iter().all(|d| d.id == got[0].id),
        "one webhook-id: {got:#?}"
    );
    assert!(
        got.iter()
            .all(|d| d.body == got[0].body && d.signed_by(SECRET))
    );
    wait_for_metric(
        metrics,
        "oncegate_webhook_deliveries_total",
        &[("webhook", "ops"), ("outcome", "delivered")],
        1.0,
    )
    .await;
    assert_eq!(delivered(metrics, "failed").await, 2.0);
    assert_eq!(delivered(metrics, "undeliverable").await, 0.0);
    // Asking again (the held worker polls) writes the same event: nothing is delivered twice.
    hold(&mut client, "/tmp/b").await;
    hold(&mut client, "/tmp/c").await;
    let got = receiver
        .wait_until("the second approval", |got| {
            got.iter().any(|d| d.id != got[0].id)
        })
        .await;
    assert_eq!(
        got.iter().filter(|d| d.id == got[0].id).count(),
        3,
        "{got:#?}"
    );
}
on_stores!(a_receiver_down_then_up_gets_the_event_again_with_the_same_id: embedded, redis, postgres);

async fn a_receiver_that_never_accepts_makes_the_event_undeliverable(kind: Kind) {
    let receiver = Receiver::start(Answer::Status(500)).await;
    let dir = TempDir::new().unwrap();
    let hook = webhook(
        &receiver.url(),
        "[\"approval.requested\"]",
        &format!("secrets = [\"{SECRET}\"]\nmax_attempts = 3"),
    );
    let (gate, metrics) =
        TestGate::serve_with_webhooks(backend(kind).await, config(&gate_config(&dir, &hook))).await;
    let mut client = gate.client().await;
    hold(&mut client, "/tmp/d").await;
    wait_for_metric(metrics, "oncegate_webhook_undeliverable", &[], 1.0).await;
    assert_eq!(
        receiver.deliveries().len(),
        3,
        "three attempts, then it gave up"
    );
    assert_eq!(delivered(metrics, "failed").await, 2.0);
    assert_eq!(delivered(metrics, "undeliverable").await, 1.0);
    assert_eq!(
        Scrape::fetch(metrics)
            .await
            .sum("oncegate_webhook_outbox_pending", &[]),
        0.0
    );

    let server = format!("http://{}", gate.addr);
    let run = |json: bool| {
        let server = server.clone();
        tokio::task::spawn_blocking(move || {
            let mut cmd = oncegate_command();
            cmd.args(["admin", "--server", &server, "webhooks"]);
            if json {
                cmd.arg("--json");
            }
            let out = cmd.env("ONCEGATE_API_KEY", OPS_KEY).output().unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout).unwrap()
        })
    };
    let listed: Value = serde_json::from_str(&run(true).await.unwrap()).unwrap();
    assert_eq!(listed["undeliverable"], 1, "{listed}");
    assert_eq!(listed["pending"], 0);
    let event = &listed["events"][0];
    assert_eq!(event["id"], receiver.deliveries()[0].id.as_str());
    assert_eq!(event["webhook"], "ops");
    assert_eq!(event["event_type"], "approval.requested");
    assert_eq!(event["attempts"], 3);
    assert!(
        event["last_error"].as_str().unwrap().contains("500"),
        "{event}"
    );
    assert_eq!(event["body"], receiver.deliveries()[0].body.as_str());
    let text = run(false).await.unwrap();
    assert!(
        text.contains("1 undeliverable") && text.contains("HTTP 500"),
        "{text}"
    );

    // The listing is the operator's: an agent is refused.
    let mut admin = GateAdminServiceClient::connect(server).await.unwrap();
    let refused = admin
        .list_undeliverable_events(authed(
            pb::ListUndeliverableEventsRequest::default(),
            Some(WORKER_KEY),
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied);
}
on_stores!(a_receiver_that_never_accepts_makes_the_event_undeliverable: embedded, redis, postgres);

async fn a_gate_killed_during_a_delivery_delivers_it_after_restart_with_the_same_id(kind: Kind) {
    let receiver = Receiver::start(Answer::Stall).await;
    let dir = TempDir::new().unwrap();
    let hook = webhook(
        &receiver.url(),
        "[\"approval.requested\"]",
        &format!("secrets = [\"{SECRET}\"]\ntimeout_seconds = 2"),
    );
    let text = format!(
        "{}{NOTIFICATIONS}\n{hook}",
        with_rules(dir.path(), RULES, "")
    );
    let path = write_file(dir.path(), "oncegate.toml", &text);
    let redis = (kind == Kind::Redis).then(RedisServer::start);
    let data = dir.path().join("data");
    let mut args = vec!["--config".to_owned(), path.display().to_string()];
    match &redis {
        Some(redis) => args.extend(["--redis-url".to_owned(), redis.url()]),
        None => args.extend(["--data-dir".to_owned(), data.display().to_string()]),
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut gate = GateProcess::spawn(&args);
    let mut client = connect(&gate.addr).await;
    let resp = client
        .request_token(delete("/tmp/e"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.decision(), pb::Decision::PendingApproval);
    let first = receiver
        .wait_until("the first attempt", |got| !got.is_empty())
        .await[0]
        .clone();
    // The receiver holds the attempt; the gate dies in the middle of it.
    gate.kill9();
    receiver.answer(Answer::Ok);
    let _restarted = GateProcess::spawn(&args);
    let got = receiver
        .wait_until("the delivery after the restart", |got| got.len() >= 2)
        .await;
    assert_eq!(got[1].id, first.id, "the same webhook-id after the restart");
    assert_eq!(got[1].body, first.body);
    assert!(got[1].signed_by(SECRET));
    assert_eq!(
        cloudevent(&got[1], "approval.requested")["data"]["approval_id"],
        resp.approval.unwrap().id.as_str()
    );
}
on_stores!(a_gate_killed_during_a_delivery_delivers_it_after_restart_with_the_same_id: embedded, redis, postgres);

async fn a_slack_webhook_gets_a_message(kind: Kind) {
    let receiver = Receiver::start(Answer::Ok).await;
    let dir = TempDir::new().unwrap();
    let hook = webhook(
        &receiver.url(),
        "[\"approval.requested\"]",
        "format = \"slack\"",
    );
    let (gate, _) =
        TestGate::serve_with_webhooks(backend(kind).await, config(&gate_config(&dir, &hook))).await;
    let mut client = gate.client().await;
    let (_, approval_id) = hold(&mut client, "/tmp/f").await;
    let got = receiver
        .wait_until("a message", |got| !got.is_empty())
        .await;
    let body = got[0].json();
    let text = body["text"].as_str().unwrap();
    assert!(
        text.contains("approval requested") && text.contains("files.delete"),
        "{text}"
    );
    assert!(text.contains(&approval_id), "{text}");
    assert_eq!(
        body.as_object().unwrap().len(),
        1,
        "a Slack body is its text: {body}"
    );
    assert_eq!(got[0].content_type, "application/json");
    assert_eq!(got[0].signature, None, "no secret, no signature");
    assert!(got[0].id.starts_with("evt_"));
}
on_stores!(a_slack_webhook_gets_a_message: embedded);

async fn the_outbox_keeps_each_event_once_and_one_claim_at_a_time(kind: Kind) {
    let backend = backend(kind).await;
    let store = &backend.store;
    let entry = |id: &str| NewEntry {
        webhook: "ops".into(),
        id: id.into(),
        event_type: "approval.requested".into(),
        body: format!(r#"{{"id":"{id}","é":1}}"#),
    };
    let append = |ids: &[&str]| {
        let entries: Vec<NewEntry> = ids.iter().map(|id| entry(id)).collect();
        async move { store.outbox_append(&entries).await.unwrap().result.unwrap() }
    };
    assert_eq!(append(&["e1", "e2"]).await, 2);
    assert_eq!(
        append(&["e1"]).await,
        0,
        "a second write of an event changes nothing"
    );

    let claimed = store.outbox_claim(10, 60_000, "c1").await.unwrap();
    let now = claimed.now;
    let claimed = claimed.result.unwrap();
    assert_eq!(
        (
            claimed.entries.len(),
            claimed.pending,
            claimed.undeliverable
        ),
        (2, 2, 0)
    );
    let e1 = claimed.entries.iter().find(|e| e.id == "e1").unwrap();
    assert_eq!(
        (e1.attempts, e1.claim.as_str(), e1.state),
        (1, "c1", OutboxState::Pending)
    );
    assert_eq!(e1.body, r#"{"id":"e1","é":1}"#);
    assert_eq!(e1.due_at, now + 60_000);
    let again = store
        .outbox_claim(10, 60_000, "c2")
        .await
        .unwrap()
        .result
        .unwrap();
    assert!(
        again.entries.is_empty(),
        "claimed entries wait for their lease"
    );

    let settle = |id: &'static str, claim: &'static str, s: Settlement, keep: i64| async move {
        store
            .outbox_settle("ops", id, claim, &s, keep)
            .await
            .unwrap()
            .result
            .unwrap()
    };
    assert!(
        !settle("e1", "c2", Settlement::Delivered, 60_000).await,
        "not c2's claim"
    );
    assert!(settle("e1", "c1", Settlement::Delivered, 60_000).await);
    assert!(
        !settle("e1", "c1", Settlement::Delivered, 60_000).await,
        "settled once"
    );
    assert_eq!(
        append(&["e1"]).await,
        0,
        "a delivered event is not written again"
    );

    let retry = Settlement::Retry {
        due_at: now,
        error: "HTTP 503".into(),
    };
    assert!(settle("e2", "c1", retry, 0).await);
    let retried = store
        .outbox_claim(10, 60_000, "c3")
        .await
        .unwrap()
        .result
        .unwrap();
    assert_eq!(retried.entries.len(), 1);
    assert_eq!(
        (
            retried.entries[0].attempts,
            retried.entries[0].last_error.as_str()
        ),
        (2, "HTTP 503")
    );
    let given_up = Settlement::Undeliverable {
        error: "HTTP 500".into(),
    };
    assert!(settle("e2", "c3", given_up, 60_000).await);
    let page = store
        .outbox_undeliverable(None, 10)
        .await
        .unwrap()
        .result
        .unwrap();
    assert_eq!(
        (page.pending, page.undeliverable, page.items.len()),
        (0, 1, 1)
    );
    assert_eq!(page.items[0].id, "e2");
    assert_eq!(page.items[0].state, OutboxState::Undeliverable);
    assert_eq!(page.items[0].last_error, "HTTP 500");
    assert!(page.next.is_none());

    // A worker that died: its claim's lease ends and another worker takes the entry over.
    assert_eq!(append(&["e3"]).await, 1);
    let dying = store
        .outbox_claim(10, 1, "c4")
        .await
        .unwrap()
        .result
        .unwrap();
    assert_eq!(dying.entries.len(), 1);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let taken = store
        .outbox_claim(10, 60_000, "c5")
        .await
        .unwrap()
        .result
        .unwrap();
    assert_eq!(
        (taken.entries[0].id.as_str(), taken.entries[0].attempts),
        ("e3", 2)
    );
    assert!(
        !settle("e3", "c4", Settlement::Delivered, 60_000).await,
        "the old claim is void"
    );

    // Settled entries are forgotten after their retention (purged by a later claim).
    assert!(settle("e3", "c5", Settlement::Delivered, 1).await);
    tokio::time::sleep(Duration::from_millis(20)).await;
    store.outbox_claim(10, 60_000, "c6").await.unwrap();
    assert_eq!(append(&["e3"]).await, 1, "forgotten after the retention");
}
on_stores!(the_outbox_keeps_each_event_once_and_one_claim_at_a_time: embedded, redis, cluster, postgres);

/// Function and script calls (FCALL, EVALSHA, EVAL) Redis has answered so far.
async fn scripts_run(redis: &RedisServer) -> u64 {
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    info.lines()
        .filter(|l| {
            ["cmdstat_fcall:", "cmdstat_evalsha:", "cmdstat_eval:"]
                .iter()
                .any(|stat| l.starts_with(stat))
        })
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

#[tokio::test]
async fn a_request_token_is_one_store_round_trip_with_or_without_webhooks() {
    const N: u64 = 50;
    for with_webhooks in [false, true] {
        let receiver = Receiver::start(Answer::Stall).await;
        let text = match with_webhooks {
            // Events no grant emits; the worker polls once an hour (woken only by writes).
            true => format!(
                "[notifications]\npoll_interval_seconds = 3600\n{}",
                webhook(
                    &receiver.url(),
                    "[\"approval.requested\", \"execution.doubled\"]",
                    &format!("secrets = [\"{SECRET}\"]")
                )
            ),
            false => String::new(),
        };
        let (gate, _) =
            TestGate::serve_with_webhooks(backend(Kind::Redis).await, config(&text)).await;
        let mut client = gate.client().await;
        let warm = token_request("agent", "run", "warm", "{}");
        client.request_token(warm).await.unwrap();
        let redis = gate.backend.redis.as_ref().unwrap();
        let before = scripts_run(redis).await;
        for n in 0..N {
            let req = token_request("agent", "run", "act", &format!(r#"{{"n":{n}}}"#));
            client.request_token(req).await.unwrap();
        }
        let calls = scripts_run(redis).await - before;
        // Without webhooks exactly one script per RequestToken; with them, at most the worker's
        // first claim besides (it may fall within the window).
        match with_webhooks {
            false => assert_eq!(calls, N),
            true => assert!(
                (N..=N + 1).contains(&calls),
                "{calls} scripts for {N} RequestTokens"
            ),
        }
        assert!(receiver.deliveries().is_empty());
    }
}

#[test]
fn a_webhook_whose_secret_variable_is_unset_is_a_bad_configuration() {
    let dir = TempDir::new().unwrap();
    let hook = "[[webhooks]]\nname = \"ops\"\nurl = \"https://hooks.example.com/\"\nevents = \"*\"\nsecret_env = \"ONCEGATE_TEST_NO_SUCH_SECRET\"\n";
    let path = write_file(dir.path(), "oncegate.toml", hook);
    let data = dir.path().join("data");
    let (code, stderr) = crate::support::serve_to_exit(&[
        "--config",
        path.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains("webhooks.ops.secret_env: the environment variable ONCEGATE_TEST_NO_SUCH_SECRET is not set"),
        "{stderr}"
    );
}

async fn budget_refusals_come_as_one_event_with_their_count(kind: Kind) {
    const REFUSALS: usize = 5;
    let receiver = Receiver::start(Answer::Ok).await;
    let dir = TempDir::new().unwrap();
    let hook = webhook(
        &receiver.url(),
        "[\"budget.exceeded\"]",
        &format!("secrets = [\"{SECRET}\"]"),
    );
    let (gate, _) =
        TestGate::serve_with_webhooks(backend(kind).await, config(&gate_config(&dir, &hook))).await;
    let mut client = gate.client().await;
    for n in 0..=REFUSALS {
        let req = token_request("billing-b", "run-1", "send.sms", &format!(r#"{{"n":{n}}}"#));
        let answer = ask(&mut client, req).await;
        assert_eq!(answer.is_ok(), n == 0, "{answer:?}");
    }
    let got = receiver.wait_for_type("budget.exceeded").await;
    let body = cloudevent(&got[0], "budget.exceeded");
    assert!(got[0].signed_by(SECRET));
    assert_eq!(body["data"]["refusals"], REFUSALS, "{body}");
    assert_eq!(body["data"]["budget"], "sends");
    assert_eq!(body["data"]["window_seconds"], 0.5);
    assert!(got.iter().all(|d| d.id == got[0].id), "one event: {got:#?}");
}
on_stores!(budget_refusals_come_as_one_event_with_their_count: embedded, redis, postgres);
