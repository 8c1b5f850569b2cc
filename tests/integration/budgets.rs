//! Budgets and velocity caps through real gRPC: 100 EUR per hour admits 60 + 40, refuses the next
//! 1 (RESOURCE_EXHAUSTED, BUDGET_EXCEEDED, the budget's name and when it frees up), takes 40 back
//! on a Release, and counts each decision; holds across gate restarts and replicas; never goes
//! over under 50 racing callers; a velocity cap counts grants; the operator read shows what is
//! used.

use std::time::Duration;

use oncegate_proto::{
    self as pb, action_gate_service_client::ActionGateServiceClient,
    gate_admin_service_client::GateAdminServiceClient,
};
use tempfile::TempDir;
use tonic::{Code, transport::Channel};
use tonic_types::StatusExt;

use crate::support::{
    GateProcess, Kind, LoggedGate, OPS_KEY, RedisServer, Scrape, TestGate, authed, backend, config,
    connect, expect_error, grant, on_stores, principals_toml, token_request, write_file,
};

/// 100 EUR (per currency) per hour for payments, and 3 e-mails per hour per agent and action.
pub const BUDGETS: &str = r#"
[[budgets]]
name = "eur-per-hour"
actions = ["payments.*"]
window_seconds = 3600
limit = 100
sum = "/amount"
group_by = "/currency"

[[budgets]]
name = "emails-per-hour"
actions = ["email.*"]
per = "agent_action"
window_seconds = 3600
limit = 3
"#;

pub fn pay(agent: &str, key: &str, amount: &str, currency: &str) -> pb::RequestTokenRequest {
    let mut req = token_request(
        agent,
        "run-1",
        "payments.transfer",
        &format!(r#"{{"amount":{amount},"currency":"{currency}"}}"#),
    );
    req.idempotency_key = key.into();
    req
}

/// The refusal of a grant that does not fit: its budget and when it frees up.
fn exceeded(status: &tonic::Status) -> (String, Option<Duration>) {
    let meta = expect_error(status, Code::ResourceExhausted, "BUDGET_EXCEEDED");
    let retry = status
        .get_error_details()
        .retry_info()
        .and_then(|r| r.retry_delay);
    (meta["budget"].clone(), retry)
}

async fn budgets_of(
    admin: &mut GateAdminServiceClient<Channel>,
    agent: &str,
) -> Vec<pb::BudgetUsage> {
    admin
        .get_budgets(authed(
            pb::GetBudgetsRequest {
                agent_id: agent.into(),
            },
            Some(OPS_KEY),
        ))
        .await
        .unwrap()
        .into_inner()
        .budgets
}

async fn sixty_and_forty_fit_one_more_does_not_and_a_release_gives_forty_back(kind: Kind) {
    let (gate, metrics) = TestGate::start_with_config_and_metrics(
        kind,
        config(&format!("{BUDGETS}{}", principals_toml(""))),
    )
    .await;
    let mut client = gate.client().await;
    fn worker<T>(req: T) -> tonic::Request<T> {
        authed(req, Some(crate::support::WORKER_KEY))
    }
    let granted = |r: Result<tonic::Response<pb::RequestTokenResponse>, tonic::Status>| {
        let r = r.unwrap().into_inner();
        assert_eq!(r.decision(), pb::Decision::Granted);
        (r.action.unwrap(), r.grant.unwrap())
    };
    granted(
        client
            .request_token(worker(pay("billing-a", "i-1", "60", "EUR")))
            .await,
    );
    let (forty, forty_grant) = granted(
        client
            .request_token(worker(pay("billing-a", "i-2", "40.00", "EUR")))
            .await,
    );
    let refused = client
        .request_token(worker(pay("billing-a", "i-3", "1", "EUR")))
        .await
        .unwrap_err();
    let (budget, retry) = exceeded(&refused);
    assert_eq!(budget, "eur-per-hour");
    // What a person reads: used and limit in the budget's units, when and in how long it frees up.
    let meta = expect_error(&refused, Code::ResourceExhausted, "BUDGET_EXCEEDED");
    assert_eq!(
        (
            meta["used"].as_str(),
            meta["limit"].as_str(),
            meta["requested"].as_str()
        ),
        ("100.00", "100.00", "1.00"),
        "{meta:?}"
    );
    let message = refused.message();
    assert!(
        message.contains("100.00 of 100.00 used in the last 1 h, and this action needs 1.00"),
        "{message}"
    );
    assert!(
        message.contains(&format!("it frees up at {}", meta["retry_at"]))
            && meta["retry_at"].ends_with('Z')
            && (message.contains("(in 1 h") || message.contains("(in 59 min")),
        "{message}"
    );
    let retry = retry.expect("RetryInfo says when the window frees up");
    assert!(
        retry > Duration::from_secs(3500) && retry <= Duration::from_secs(3661),
        "{retry:?}"
    );
    // Other currencies and other agents have budgets of their own.
    granted(
        client
            .request_token(worker(pay("billing-a", "i-4", "100", "USD")))
            .await,
    );
    granted(
        client
            .request_token(worker(pay("billing-b", "i-1", "100", "EUR")))
            .await,
    );

    let mut admin = gate.admin().await;
    let eur = budgets_of(&mut admin, "billing-a").await;
    let eur: Vec<_> = eur.iter().filter(|b| b.group == "EUR").collect();
    assert_eq!(eur.len(), 1);
    assert_eq!(
        (eur[0].used.as_str(), eur[0].limit.as_str()),
        ("100.00", "100.00")
    );
    assert_eq!(eur[0].budget, "eur-per-hour");

    // A Release returns the reservation: 40 fits again, 41 does not.
    client
        .release(worker(pb::ReleaseRequest {
            action: Some(forty),
            token: forty_grant.token,
            reason: pb::ReleaseReason::NotAttempted as i32,
        }))
        .await
        .unwrap();
    let refused = client
        .request_token(worker(pay("billing-a", "i-5", "41", "EUR")))
        .await
        .unwrap_err();
    exceeded(&refused);
    granted(
        client
            .request_token(worker(pay("billing-a", "i-5", "40", "EUR")))
            .await,
    );
    let eur = budgets_of(&mut admin, "billing-a").await;
    assert!(
        eur.iter().any(|b| b.group == "EUR" && b.used == "100.00"),
        "{eur:?}"
    );

    // Enforced budget decisions are counted: five grants reserved, two refusals exceeded.
    let scrape = Scrape::fetch(metrics).await;
    let budget = |decision: &str, mode: &str| scrape.budget("eur-per-hour", decision, mode);
    assert_eq!(budget("reserved", "enforce"), 5.0);
    assert_eq!(budget("exceeded", "enforce"), 2.0);
    assert_eq!(
        budget("reserved", "shadow") + budget("exceeded", "shadow"),
        0.0
    );
    let attempts = |decision: &str| {
        scrape.sum(
            "oncegate_attempts_total",
            &[("decision", decision), ("mode", "enforce")],
        )
    };
    assert_eq!(attempts("granted"), 5.0);
    assert_eq!(attempts("budget_exceeded"), 2.0);
}
on_stores!(sixty_and_forty_fit_one_more_does_not_and_a_release_gives_forty_back: embedded, redis, cluster, postgres);

async fn a_velocity_cap_counts_grants_per_agent_and_action(kind: Kind) {
    let gate = TestGate::start_with(kind, config(BUDGETS)).await;
    let mut client = gate.client().await;
    let mail =
        |to: &str, action: &str| token_request("bot", "r", action, &format!(r#"{{"to":"{to}"}}"#));
    for to in ["a", "b", "c"] {
        grant(&mut client, mail(to, "email.send")).await;
    }
    let refused = client
        .request_token(mail("d", "email.send"))
        .await
        .unwrap_err();
    assert_eq!(exceeded(&refused).0, "emails-per-hour");
    // Per agent and action: another action of the same agent has its own count.
    grant(&mut client, mail("d", "email.reply")).await;
    // A replay is not a grant: it spends nothing.
    let replay = client
        .request_token(mail("a", "email.send"))
        .await
        .unwrap_err();
    expect_error(&replay, Code::Aborted, "IDEMPOTENCY_IN_PROGRESS");
}
on_stores!(a_velocity_cap_counts_grants_per_agent_and_action: embedded, redis, postgres);

#[tokio::test]
async fn the_budget_holds_across_a_restart_of_the_embedded_gate() {
    let dir = TempDir::new().unwrap();
    let cfg = write_file(dir.path(), "oncegate.toml", BUDGETS);
    let args = ["--listen", "127.0.0.1:0", "--config", cfg.to_str().unwrap()];
    {
        let gate = LoggedGate::start(&dir, &args);
        let mut client = connect(&gate.addr).await;
        grant(&mut client, pay("a", "k1", "60", "EUR")).await;
        grant(&mut client, pay("a", "k2", "40", "EUR")).await;
    }
    // The first gate was killed (SIGKILL) well within the embedded store's checkpoint interval:
    // the budget comes back from the write-ahead log.
    let gate = LoggedGate::start(&dir, &args);
    let mut client = connect(&gate.addr).await;
    let refused = client
        .request_token(pay("a", "k3", "1", "EUR"))
        .await
        .unwrap_err();
    assert_eq!(exceeded(&refused).0, "eur-per-hour");
}

/// A gate process on a Redis of the test's own spends the budget and is killed (SIGKILL: the
/// process and its connections to Redis gone); a new gate process on the same Redis refuses the
/// next euro: the window is the store's, not the gate's.
#[tokio::test]
async fn the_budget_holds_across_a_gate_restart_on_the_same_redis() {
    let redis = RedisServer::start();
    let dir = TempDir::new().unwrap();
    let cfg = write_file(dir.path(), "oncegate.toml", BUDGETS);
    let url = redis.url();
    let args = ["--redis-url", &url, "--config", cfg.to_str().unwrap()];
    let mut first = GateProcess::spawn(&args);
    let mut client = connect(&first.addr).await;
    grant(&mut client, pay("a", "k1", "60", "EUR")).await;
    grant(&mut client, pay("a", "k2", "40", "EUR")).await;
    first.kill9();
    let gone = ActionGateServiceClient::connect(format!("http://{}", first.addr)).await;
    assert!(
        gone.is_err(),
        "the first gate still listens on {}",
        first.addr
    );

    let second = GateProcess::spawn(&args);
    let mut client = connect(&second.addr).await;
    let refused = client
        .request_token(pay("a", "k3", "1", "EUR"))
        .await
        .unwrap_err();
    assert_eq!(exceeded(&refused).0, "eur-per-hour");
    // Another agent's budget is untouched: the refusal is the spent window, not a broken gate.
    grant(&mut client, pay("b", "k3", "100", "EUR")).await;
}

/// 50 callers race for 10 EUR each against 100 EUR: exactly ten grants, whichever gate they ask.
async fn never_over_budget_under_fifty_racing_callers(kind: Kind) {
    let backend = backend(kind).await;
    let dir = TempDir::new().unwrap();
    let cfg = write_file(dir.path(), "oncegate.toml", BUDGETS);
    let mut addrs = Vec::new();
    let mut processes = Vec::new();
    let in_process;
    if kind == Kind::Embedded {
        in_process = Some(TestGate::serve(backend, config(BUDGETS)).await);
        addrs.push(in_process.as_ref().unwrap().addr.to_string());
    } else {
        in_process = None;
        for _ in 0..2 {
            let mut args: Vec<String> = backend.gate_args();
            args.extend(["--config".into(), cfg.display().to_string()]);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let process = GateProcess::spawn(&args);
            addrs.push(process.addr.clone());
            processes.push(process);
        }
    }
    let calls: Vec<_> = (0..50)
        .map(|i| {
            let addr = addrs[i % addrs.len()].clone();
            tokio::spawn(async move {
                let mut client = connect(&addr).await;
                client
                    .request_token(pay("racer", &format!("k-{i}"), "10", "EUR"))
                    .await
            })
        })
        .collect();
    let mut granted = 0;
    for call in calls {
        match call.await.unwrap() {
            Ok(r) => {
                assert_eq!(r.into_inner().decision(), pb::Decision::Granted);
                granted += 1;
            }
            Err(status) => assert_eq!(exceeded(&status).0, "eur-per-hour"),
        }
    }
    assert_eq!(granted, 10, "exactly 100 EUR granted");
    drop(in_process);
}
on_stores!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    never_over_budget_under_fifty_racing_callers: embedded, redis, cluster, postgres
);

/// An expired grant keeps its reservation until an operator settles it: FAILED gives it back.
async fn a_failed_resolution_gives_the_reservation_back(kind: Kind) {
    let text = format!(
        "{BUDGETS}[limits]\nmin_lease_ttl_seconds = 0.05\n{}",
        principals_toml("")
    );
    let gate = TestGate::start_with_test_clock(kind, config(&text)).await;
    let mut client = gate.client().await;
    let mut admin = gate.admin().await;
    fn worker<T>(req: T) -> tonic::Request<T> {
        authed(req, Some(crate::support::WORKER_KEY))
    }
    let mut all = pay("billing-z", "k1", "100", "EUR");
    all.lease_ttl = crate::support::ttl_ms(100);
    let held = client
        .request_token(worker(all))
        .await
        .unwrap()
        .into_inner();
    let lease_end = held.grant.as_ref().unwrap().lease_expires_at.unwrap();
    gate.time.pass_beyond(lease_end).await;
    // Expired and unresolved: still reserved.
    let refused = client
        .request_token(worker(pay("billing-z", "k2", "1", "EUR")))
        .await
        .unwrap_err();
    exceeded(&refused);
    admin
        .resolve_expired(authed(
            pb::ResolveExpiredRequest {
                action: held.action,
                resolution: pb::Resolution::Failed as i32,
                note: "the bank never saw it".into(),
                ..Default::default()
            },
            Some(OPS_KEY),
        ))
        .await
        .unwrap();
    let again = client
        .request_token(worker(pay("billing-z", "k3", "100", "EUR")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.decision(), pb::Decision::Granted);
}
on_stores!(a_failed_resolution_gives_the_reservation_back: embedded, redis, postgres);
