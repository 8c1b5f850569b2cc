//! Metrics, black-box: a scripted workload with known outcomes through real gRPC on the Redis
//! store, then a scrape of `/metrics` over HTTP (every counter equals what the workload did, and
//! DAR from the scrape is the expected ratio); Redis stopped and restarted under the gate (health
//! and `oncegate_store_up` follow it). Operator calls are in `metrics_operator.rs`; the endpoint
//! and the binary's metrics flags in `metrics_endpoint.rs`.

use std::{
    collections::{BTreeSet, HashMap},
    time::{Duration, Instant},
};

use oncegate_proto::{self as pb, action_gate_service_client::ActionGateServiceClient};
use tonic::{Code, transport::Channel};
use tonic_health::pb::health_check_response::ServingStatus;

use crate::support::{
    Kind, Scrape, StoreTime, TestGate, expect_error, health, token_request, ttl_ms, wait_for_health,
};

type Client = ActionGateServiceClient<Channel>;

const POLICIES: &str = r#"
[limits]
min_lease_ttl_seconds = 0.05
[actions."payments.transfer"]
key_fields = ["/amount", "/currency", "/to"]
[actions."payments.regrant"]
on_expiry = "regrant"
[actions."email.*"]
"#;

const PT: &str = "payments.transfer";
const PR: &str = "payments.regrant";
const EMAIL: &str = "email.*";
const OTHER: &str = "other";

/// What the workload did, as the metrics must show it.
#[derive(Default)]
struct Expected {
    attempts: HashMap<(&'static str, &'static str), f64>,
    completions: f64,
    releases: HashMap<&'static str, f64>,
    double: HashMap<&'static str, f64>,
    unresolved: HashMap<(&'static str, &'static str), f64>,
    rpc: HashMap<(&'static str, &'static str), f64>,
    store_calls: HashMap<&'static str, f64>,
}

impl Expected {
    fn attempt(&mut self, action: &'static str, decision: &'static str) {
        *self.attempts.entry((action, decision)).or_default() += 1.0;
        let code = match decision {
            "granted" | "redelivered" | "regranted" | "replayed" => "OK",
            "in_progress" => "ABORTED",
            "key_reused" | "lease_expired" => "FAILED_PRECONDITION",
            "invalid" => "INVALID_ARGUMENT",
            other => panic!("unknown decision {other}"),
        };
        self.rpc_call("RequestToken", code);
        if decision != "invalid" {
            self.store_call("request_token");
        }
        match decision {
            "lease_expired" => *self.unresolved.entry((action, "reconcile")).or_default() += 1.0,
            "regranted" => *self.unresolved.entry((action, "regrant")).or_default() += 1.0,
            _ => {}
        }
    }

    fn rpc_call(&mut self, method: &'static str, code: &'static str) {
        *self.rpc.entry((method, code)).or_default() += 1.0;
    }

    fn store_call(&mut self, operation: &'static str) {
        *self.store_calls.entry(operation).or_default() += 1.0;
    }
}

/// A client that records what every call should have counted.
struct Workload {
    client: Client,
    want: Expected,
    /// How the store's time passes (for the leases left to expire).
    time: StoreTime,
}

impl Workload {
    async fn token(
        &mut self,
        label: &'static str,
        req: pb::RequestTokenRequest,
        decision: &'static str,
    ) -> Result<pb::RequestTokenResponse, tonic::Status> {
        let result = self.client.request_token(req).await.map(|r| r.into_inner());
        match (&result, decision) {
            (Ok(resp), "replayed") => assert_eq!(resp.decision(), pb::Decision::AlreadyCompleted),
            (Ok(resp), "redelivered") => assert!(resp.redelivered, "{resp:?}"),
            (Ok(resp), _) => assert_eq!(resp.decision(), pb::Decision::Granted, "{decision}"),
            (Err(status), "in_progress") => {
                expect_error(status, Code::Aborted, "IDEMPOTENCY_IN_PROGRESS");
            }
            (Err(status), "key_reused") => {
                expect_error(status, Code::FailedPrecondition, "IDEMPOTENCY_KEY_REUSED");
            }
            (Err(status), "lease_expired") => {
                expect_error(status, Code::FailedPrecondition, "LEASE_EXPIRED_UNRESOLVED");
            }
            (Err(status), "invalid") => {
                expect_error(status, Code::InvalidArgument, "INVALID_REQUEST");
            }
            (Err(status), _) => panic!("{decision}: {status:?}"),
        }
        self.want.attempt(label, decision);
        result
    }

    async fn grant(
        &mut self,
        label: &'static str,
        req: pb::RequestTokenRequest,
    ) -> (pb::ActionRef, String) {
        let resp = self.token(label, req, "granted").await.unwrap();
        (resp.action.unwrap(), resp.grant.unwrap().token)
    }

    /// Complete; `recorded` says whether it is a new completion (a repeat is not counted).
    async fn complete(
        &mut self,
        action: &pb::ActionRef,
        token: &str,
        recorded: bool,
    ) -> Result<(), tonic::Status> {
        let result = self
            .client
            .complete(pb::CompleteRequest {
                action: Some(action.clone()),
                token: token.into(),
                receipt: b"receipt".to_vec(),
            })
            .await;
        self.want.store_call("complete");
        match &result {
            Ok(_) => {
                self.want.rpc_call("Complete", "OK");
                if recorded {
                    self.want.completions += 1.0;
                }
            }
            Err(status) => {
                expect_error(status, Code::FailedPrecondition, "COMPLETED_BY_OTHER");
                self.want.rpc_call("Complete", "FAILED_PRECONDITION");
                *self.want.double.entry("completed_by_other").or_default() += 1.0;
            }
        }
        result.map(|_| ())
    }

    async fn release(&mut self, action: &pb::ActionRef, token: &str, reason: pb::ReleaseReason) {
        self.client
            .release(pb::ReleaseRequest {
                action: Some(action.clone()),
                token: token.into(),
                reason: reason as i32,
            })
            .await
            .unwrap();
        self.want.store_call("release");
        self.want.rpc_call("Release", "OK");
        let label = match reason {
            pb::ReleaseReason::DefiniteFailure => "definite_failure",
            _ => "not_attempted",
        };
        *self.want.releases.entry(label).or_default() += 1.0;
    }
}

fn with_lease(mut req: pb::RequestTokenRequest, ms: u64) -> pb::RequestTokenRequest {
    req.lease_ttl = ttl_ms(ms);
    req
}

/// Grants, re-delivery, replays, in-progress, key reuse, releases, invalid requests, a reconcile
/// lease expiry with a late Complete, and a double execution under `regrant`.
async fn run_workload(w: &mut Workload) {
    let pay1 = token_request(
        "agent",
        "run",
        PT,
        r#"{"amount":1,"currency":"EUR","to":"X"}"#,
    );
    let (a, t) = w.grant(PT, pay1.clone()).await;
    w.complete(&a, &t, true).await.unwrap();
    w.complete(&a, &t, false).await.unwrap(); // a repeat: no new completion
    w.token(PT, pay1.clone(), "replayed").await.unwrap();
    w.token(PT, pay1, "replayed").await.unwrap();

    let mut pay2 = token_request(
        "agent",
        "run",
        PT,
        r#"{"amount":2,"currency":"EUR","to":"X"}"#,
    );
    pay2.idempotency_key = "invoice-2".into();
    pay2.holder = "worker-1".into();
    let (a, t) = w.grant(PT, pay2.clone()).await;
    w.token(PT, pay2.clone(), "redelivered").await.unwrap();
    let mut other_holder = pay2.clone();
    other_holder.holder = String::new();
    w.token(PT, other_holder, "in_progress").await.unwrap_err();
    let mut rewritten = pay2.clone();
    rewritten.params_json = r#"{"amount":20,"currency":"EUR","to":"X"}"#.into();
    w.token(PT, rewritten, "key_reused").await.unwrap_err();
    w.release(&a, &t, pb::ReleaseReason::DefiniteFailure).await;
    let (a, t) = w.grant(PT, pay2).await;
    w.release(&a, &t, pb::ReleaseReason::NotAttempted).await;

    let mail = token_request("agent", "run", "email.send", r#"{"to":"a@b.c"}"#);
    let (a, t) = w.grant(EMAIL, mail.clone()).await;
    w.token(EMAIL, mail.clone(), "in_progress")
        .await
        .unwrap_err();
    w.token(EMAIL, mail.clone(), "in_progress")
        .await
        .unwrap_err();
    w.complete(&a, &t, true).await.unwrap();

    // Actions no policy names fold into one label value, however many there are.
    for action in ["misc.a", "misc.b", "misc.c"] {
        w.grant(OTHER, token_request("agent", "run", action, "{}"))
            .await;
    }
    w.token(
        OTHER,
        token_request("agent", "run", "misc.d", "[1]"),
        "invalid",
    )
    .await
    .unwrap_err();
    let mut no_scope = token_request("agent", "run", PT, "{}");
    no_scope.scope = None;
    w.token(PT, no_scope, "invalid").await.unwrap_err();
    let mut bad_lease = mail;
    bad_lease.lease_ttl = Some(prost_types::Duration {
        seconds: -1,
        nanos: 0,
    });
    w.token(EMAIL, bad_lease, "invalid").await.unwrap_err();

    // Two short leases left to expire: one under `regrant`, one under `reconcile`.
    let regrant = with_lease(token_request("agent", "run", PR, r#"{"n":1}"#), 300);
    let (ra, first) = w.grant(PR, regrant.clone()).await;
    let pay3 = with_lease(
        token_request(
            "agent",
            "run",
            PT,
            r#"{"amount":3,"currency":"EUR","to":"X"}"#,
        ),
        300,
    );
    let granted = w.token(PT, pay3.clone(), "granted").await.unwrap();
    let (pa, late) = (granted.action.unwrap(), granted.grant.unwrap());
    // Granted last, its lease ends last.
    w.time.pass_beyond(late.lease_expires_at.unwrap()).await;
    let late = late.token;

    let second = w.token(PR, regrant.clone(), "regranted").await.unwrap();
    let second = second.grant.unwrap().token;
    // The superseded holder finishes first: recorded, and flagged as a double execution...
    w.complete(&ra, &first, true).await.unwrap();
    *w.want.double.entry("superseded_completion").or_default() += 1.0;
    // ...and the newer holder's Complete hears COMPLETED_BY_OTHER.
    w.complete(&ra, &second, false).await.unwrap_err();
    w.token(PR, regrant, "replayed").await.unwrap();

    w.token(PT, pay3.clone(), "lease_expired")
        .await
        .unwrap_err();
    w.token(PT, pay3.clone(), "lease_expired")
        .await
        .unwrap_err();
    w.complete(&pa, &late, true).await.unwrap(); // late, accepted: the effect happened
    w.token(PT, pay3, "replayed").await.unwrap();
}

fn check_counters(scrape: &Scrape, want: &Expected) {
    // Every attempts series, including the ones that must stay at zero.
    let mut seen = BTreeSet::new();
    for (labels, value) in scrape.series("oncegate_attempts_total") {
        let key = (labels["action"].as_str(), labels["decision"].as_str());
        // Nothing runs in shadow mode here: every shadow series stays at zero.
        let expected = match labels["mode"].as_str() {
            "shadow" => 0.0,
            _ => want
                .attempts
                .iter()
                .find(|((a, d), _)| (*a, *d) == key)
                .map_or(0.0, |(_, v)| *v),
        };
        assert_eq!(value, expected, "attempts {key:?} {labels:?}");
        seen.insert((key.0.to_owned(), key.1.to_owned()));
    }
    for (action, decision) in want.attempts.keys() {
        assert!(
            seen.contains(&((*action).to_owned(), (*decision).to_owned())),
            "no series for {action}/{decision}"
        );
    }
    assert_eq!(
        seen.iter()
            .map(|(a, _)| a.as_str())
            .collect::<BTreeSet<_>>(),
        BTreeSet::from([EMAIL, OTHER, PR, PT]),
        "the action label is bounded to the policy names and one other value"
    );
    for (labels, value) in scrape.series("oncegate_blocked_duplicates_total") {
        let (action, reason) = (labels["action"].as_str(), labels["reason"].as_str());
        let mode = labels["mode"].as_str();
        assert_eq!(
            value,
            scrape.sum(
                "oncegate_attempts_total",
                &[("action", action), ("decision", reason), ("mode", mode)]
            ),
            "blocked {action}/{reason}/{mode}"
        );
    }
    for (labels, value) in scrape.series("oncegate_unresolved_expired_leases_total") {
        let key = (labels["action"].as_str(), labels["on_expiry"].as_str());
        let expected = want
            .unresolved
            .iter()
            .find(|((a, o), _)| (*a, *o) == key)
            .map_or(0.0, |(_, v)| *v);
        assert_eq!(value, expected, "unresolved {key:?}");
    }
    let c = "oncegate_completions_total";
    assert_eq!(scrape.sum(c, &[("source", "worker")]), want.completions);
    assert_eq!(scrape.sum(c, &[("source", "operator")]), 0.0);
    for reason in ["definite_failure", "not_attempted"] {
        let got = scrape.sum("oncegate_releases_total", &[("reason", reason)]);
        assert_eq!(got, want.releases[reason], "releases {reason}");
    }
    for kind in ["completed_by_other", "superseded_completion"] {
        let got = scrape.sum("oncegate_double_executions_total", &[("kind", kind)]);
        assert_eq!(got, want.double[kind], "double executions {kind}");
    }
    assert_eq!(scrape.sum("oncegate_store_errors_total", &[]), 0.0);
    for (operation, calls) in &want.store_calls {
        let got = scrape.sum(
            "oncegate_store_duration_seconds_count",
            &[("operation", operation)],
        );
        assert_eq!(got, *calls, "store calls {operation}");
    }
    for ((method, code), calls) in &want.rpc {
        let rpc = format!("oncegate.v1.ActionGateService/{method}");
        let got = scrape.sum(
            "oncegate_rpc_duration_seconds_count",
            &[("rpc", &rpc), ("code", code)],
        );
        assert_eq!(got, *calls, "rpc {method} {code}");
    }
    let rpc_total: f64 = want.rpc.values().sum();
    assert_eq!(
        scrape.sum("oncegate_rpc_duration_seconds_count", &[]),
        rpc_total,
        "no other RPC is observed (health checks are not)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripted_workload_is_counted_exactly_and_health_follows_redis() {
    let policies = crate::support::policies(POLICIES);
    let (mut gate, metrics_addr) = TestGate::start_with_metrics(Kind::Redis, policies).await;
    let addr = gate.addr.to_string();
    let mut w = Workload {
        client: gate.client().await,
        want: Expected::default(),
        time: gate.time.clone(),
    };
    wait_for_health(&addr, ServingStatus::Serving).await;
    run_workload(&mut w).await;

    let scrape = Scrape::fetch(metrics_addr).await;
    check_counters(&scrape, &w.want);
    // DAR, as the recording rule computes it, from the scrape alone.
    let attempts = scrape.sum("oncegate_attempts_total", &[]);
    let blocked = scrape.sum("oncegate_blocked_duplicates_total", &[]);
    assert_eq!((blocked, attempts), (10.0, 24.0));
    assert_eq!(blocked / attempts, 10.0 / 24.0);
    let pt_dar = scrape.sum("oncegate_blocked_duplicates_total", &[("action", PT)])
        / scrape.sum("oncegate_attempts_total", &[("action", PT)]);
    assert_eq!(pt_dar, 7.0 / 13.0);
    assert_eq!(scrape.sum("oncegate_store_up", &[]), 1.0);
    assert_eq!(scrape.series("oncegate_build_info").count(), 1);

    // Redis goes away: calls fail closed and are counted as store errors (not as attempts);
    // readiness and the gauge follow the store, liveness does not.
    gate.backend.redis.as_mut().unwrap().stop();
    let status = w
        .client
        .request_token(token_request("agent", "run", "misc.e", "{}"))
        .await
        .unwrap_err();
    expect_error(&status, Code::Unavailable, "STORE_UNAVAILABLE");
    wait_for_health(&addr, ServingStatus::NotServing).await;
    assert_eq!(health(&addr, "").await, ServingStatus::Serving);
    let down = Scrape::fetch(metrics_addr).await;
    assert_eq!(down.sum("oncegate_store_up", &[]), 0.0);
    let errors = &[("operation", "request_token"), ("error", "unavailable")];
    assert_eq!(down.sum("oncegate_store_errors_total", errors), 1.0);
    // Nothing else counted a store error: the unresolved-actions gauge (every 200 ms here) reads
    // the store outside the timed calls.
    assert_eq!(down.sum("oncegate_store_errors_total", &[]), 1.0);
    assert_eq!(down.sum("oncegate_attempts_total", &[]), 24.0);
    let unavailable = &[
        ("rpc", "oncegate.v1.ActionGateService/RequestToken"),
        ("code", "UNAVAILABLE"),
    ];
    assert_eq!(
        down.sum("oncegate_rpc_duration_seconds_count", unavailable),
        1.0
    );

    gate.backend.redis.as_mut().unwrap().restart();
    wait_for_health(&addr, ServingStatus::Serving).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Scrape::fetch(metrics_addr)
        .await
        .sum("oncegate_store_up", &[])
        != 1.0
    {
        assert!(
            Instant::now() < deadline,
            "oncegate_store_up never returned to 1"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
