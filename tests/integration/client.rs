//! The Rust client and guard against a real gate: replay without running, definite failures
//! released, ambiguous ones kept for reconciliation, waiting out an attempt in progress, a
//! reused key stopping the guard, the hooks the MCP gateway runs the guard with, receipts an
//! operator resolved (`oncegate admin resolve` over the admin socket) read as the text or JSON they
//! are, a receipt that cannot be decoded named with its action and writer, and a budget refusal's
//! amounts and time.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use oncegate_client::{
    ActionSpec, BudgetRefusal, ClientError, Failure, GateClient, GuardError, GuardHooks,
    GuardOptions, Outcome, Receipt, TokenReply, run_once_on,
};
use oncegate_gate::policy::Policies;
use oncegate_proto::{self as pb};

use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::{
    Kind, LoggedGate, Scrape, StoreTime, TestGate, config, millis_of, oncegate_command, write_file,
};

async fn gate_client(gate: &TestGate) -> GateClient {
    GateClient::connect(format!("http://{}", gate.addr))
        .await
        .unwrap()
}

#[tokio::test]
async fn the_guard_runs_once_and_replays_after() {
    let gate = TestGate::start(Kind::Embedded).await;
    let client = gate_client(&gate).await;
    let spec = ActionSpec::new("agent", "run", "payments.transfer", r#"{"amount":7}"#);
    let runs = Arc::new(AtomicUsize::new(0));
    let mut receipt = None;
    for _ in 0..3 {
        let runs = runs.clone();
        let outcome = client
            .run_once(&spec, &GuardOptions::default(), |grant| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                assert!(grant.provider_key.starts_with("og-"));
                Ok::<_, Failure<String>>(format!("paid by {}", grant.token).into_bytes())
            })
            .await
            .unwrap();
        let first = receipt.get_or_insert_with(|| outcome.receipt().to_vec());
        assert_eq!(
            outcome.receipt(),
            first.as_slice(),
            "replayed, not run again"
        );
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the closure ran exactly once"
    );
}

#[tokio::test]
async fn a_definite_failure_releases_and_an_ambiguous_one_does_not() {
    let gate = TestGate::start(Kind::Redis).await;
    let client = gate_client(&gate).await;
    let spec = ActionSpec::new("agent", "run", "orders.create", r#"{"sku":"A"}"#);
    let first = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let seen = first.clone();
    let err = client
        .run_once(&spec, &GuardOptions::default(), |grant| async move {
            seen.store(grant.fencing, Ordering::SeqCst);
            Err::<Vec<u8>, _>(Failure::Definite("card declined"))
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err, GuardError::Failed("card declined")),
        "{err:?}"
    );
    // Released: the next attempt is granted with a higher fencing number.
    let outcome = client
        .run_once(&spec, &GuardOptions::default(), |grant| async move {
            assert_eq!(grant.fencing, first.load(Ordering::SeqCst) + 1);
            Ok::<_, Failure<&str>>(b"ok".to_vec())
        })
        .await
        .unwrap();
    assert!(matches!(outcome, Outcome::Executed { .. }));

    let spec = ActionSpec::new("agent", "run", "orders.create", r#"{"sku":"B"}"#);
    let err = client
        .run_once(&spec, &GuardOptions::default(), |_| async {
            // An unmarked error is ambiguous: a timeout talking to the provider.
            Err::<Vec<u8>, Failure<&str>>("provider timed out".into())
        })
        .await
        .unwrap_err();
    let GuardError::OutcomeUnknown { grant, .. } = err else {
        panic!("expected OutcomeUnknown, got {err:?}");
    };
    let view = client.clone().get_action(&grant.action).await.unwrap();
    assert_eq!(
        view.state(),
        pb::ActionState::Authorized,
        "never released on an ambiguous failure"
    );
}

#[tokio::test]
async fn the_guard_waits_for_an_attempt_in_progress_and_gets_its_receipt() {
    let gate = TestGate::start(Kind::Embedded).await;
    let mut raw = gate_client(&gate).await;
    let spec = ActionSpec::new("agent", "run", "email.send", r#"{"to":"x"}"#);
    // The first attempt's lease (5 s) ends within the waiter's max_wait (10 s): it is waited for.
    let leased = spec.clone().lease(Duration::from_secs(5));
    let TokenReply::Granted(first) = raw.request_token(&leased).await.unwrap() else {
        panic!("expected a grant");
    };
    let finisher = {
        let mut raw = raw.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            raw.complete(&first.action, &first.token, b"sent once")
                .await
                .unwrap();
        })
    };
    // RetryInfo says "up to 5 s"; the guard polls every poll_interval within its bound and gets
    // the receipt as soon as the first attempt completes.
    let options = GuardOptions {
        max_wait: Duration::from_secs(10),
        poll_interval: Duration::from_millis(100),
        ..GuardOptions::default()
    };
    let outcome = raw
        .run_once(&spec, &options, |_| async {
            Ok::<_, Failure<()>>(b"second".to_vec())
        })
        .await
        .unwrap();
    finisher.await.unwrap();
    let Outcome::Replayed(done) = outcome else {
        panic!("expected a replay, got {outcome:?}");
    };
    assert_eq!(done.receipt, b"sent once");

    // A lease (300 s) beyond the bound is not waited for: the guard stops at once and says the
    // lease may be the caller's own earlier attempt.
    let other = ActionSpec::new("agent", "run", "email.send", r#"{"to":"y"}"#);
    raw.request_token(&other).await.unwrap();
    let short = GuardOptions {
        max_wait: Duration::from_millis(300),
        ..options
    };
    let err = raw
        .run_once(&other, &short, |_| async {
            Ok::<_, Failure<()>>(b"never".to_vec())
        })
        .await
        .unwrap_err();
    let GuardError::InProgressBeyondWait {
        retry_after,
        max_wait,
    } = &err
    else {
        panic!("expected InProgressBeyondWait, got {err:?}");
    };
    assert!(*retry_after > Duration::from_secs(200) && *max_wait == short.max_wait);
    assert!(
        err.to_string()
            .contains("may be this caller's own earlier attempt"),
        "{err}"
    );
}

#[tokio::test]
async fn a_reused_key_stops_the_guard_with_the_differing_fields() {
    let gate = TestGate::start(Kind::Embedded).await;
    let client = gate_client(&gate).await;
    let first = ActionSpec::new("agent", "run", "payments.transfer", r#"{"amount":1}"#)
        .idempotency_key("k-1");
    client
        .run_once(&first, &GuardOptions::default(), |_| async {
            Ok::<_, Failure<()>>(b"ok".to_vec())
        })
        .await
        .unwrap();
    let changed = ActionSpec::new("agent", "run", "payments.transfer", r#"{"amount":2}"#)
        .idempotency_key("k-1");
    let ran = Arc::new(AtomicUsize::new(0));
    let ran2 = ran.clone();
    let err = client
        .run_once(&changed, &GuardOptions::default(), |_| async move {
            ran2.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Failure<()>>(b"no".to_vec())
        })
        .await
        .unwrap_err();
    match err {
        GuardError::Gate(ClientError::KeyReused { differing_fields }) => {
            assert_eq!(differing_fields, ["/amount"])
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn the_heartbeat_keeps_a_long_action_alive() {
    let gate = TestGate::start_with_test_clock(Kind::Embedded, Policies::default()).await;
    let StoreTime::Test(clock) = gate.time.clone() else {
        panic!("the embedded store runs on a test clock");
    };
    let client = gate_client(&gate).await;
    let lease = Duration::from_millis(1500);
    let spec = ActionSpec::new("agent", "run", "deploy", r#"{"v":1}"#).lease(lease);
    // The heartbeat runs on real time, the lease on the store's test clock: beats come often so
    // that the test waits little for one.
    let options = GuardOptions {
        heartbeat: Some(Duration::from_millis(50)),
        ..GuardOptions::default()
    };
    let probe = client.clone();
    let probe_spec = spec.clone();
    let outcome = client
        .run_once(&spec, &options, |grant| async move {
            // 2.5 s of store time pass in steps shorter than the lease; after each step a
            // heartbeat must extend the lease from the new store time.
            for _ in 0..5 {
                clock.advance(Duration::from_millis(500));
                let extended_to = clock.now() + lease.as_millis() as i64;
                let deadline = Instant::now() + Duration::from_secs(10);
                loop {
                    let view = probe.clone().get_action(&grant.action).await.unwrap();
                    if millis_of(view.lease_expires_at.unwrap()) >= extended_to {
                        break;
                    }
                    assert!(Instant::now() < deadline, "no heartbeat extended the lease");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            // Past the original 1.5 s lease, still ours: others are told it is in progress.
            let err = probe.clone().request_token(&probe_spec).await.unwrap_err();
            assert!(matches!(err, ClientError::InProgress { .. }), "{err:?}");
            Ok::<_, Failure<()>>(grant.token.into_bytes())
        })
        .await
        .unwrap();
    assert!(matches!(outcome, Outcome::Executed { .. }));
}

/// The guard's hooks (what the MCP gateway runs it with) change what they name and nothing else:
/// the release reason, a receipt too large to keep, waiting for a lease longer than the wait, and
/// an unreachable gate.
#[tokio::test]
async fn the_guard_hooks_change_what_they_name() {
    let mut policies = Policies::default();
    policies.limits.max_receipt_bytes = 64;
    let (gate, metrics) = TestGate::start_with_metrics(Kind::Embedded, policies).await;
    let client = gate_client(&gate).await;
    let defaults = GuardOptions::default();

    // A definite failure of an action that never started: released as not attempted.
    let spec = ActionSpec::new("agent", "run", "payments.transfer", r#"{"amount":1}"#);
    let never = GuardHooks::new().release_reason(|_: &&str| pb::ReleaseReason::NotAttempted);
    let err = run_once_on(&client, &spec, &defaults, &never, |_| async {
        Err::<Vec<u8>, _>(Failure::Definite("refused before sending"))
    })
    .await
    .unwrap_err();
    assert!(
        matches!(err, GuardError::Failed("refused before sending")),
        "{err:?}"
    );
    let scrape = Scrape::fetch(metrics).await;
    let releases = |reason| scrape.sum("oncegate_releases_total", &[("reason", reason)]);
    assert_eq!(
        (releases("not_attempted"), releases("definite_failure")),
        (1.0, 0.0)
    );

    // A receipt above the limit: without the hook, Complete is not acknowledged; with it, the
    // replacement is recorded, and replayed later.
    let large = vec![b'x'; 100];
    let spec = ActionSpec::new("agent", "run", "report.export", r#"{"month":5}"#);
    let err = client
        .run_once(&spec, &defaults, |_| async {
            Ok::<_, Failure<()>>(large.clone())
        })
        .await
        .unwrap_err();
    let GuardError::CompleteUnacknowledged { error, .. } = &err else {
        panic!("expected CompleteUnacknowledged, got {err:?}");
    };
    assert!(matches!(error, ClientError::Invalid { field, .. } if field == "receipt"));
    let spec = ActionSpec::new("agent", "run", "report.export", r#"{"month":6}"#);
    let note = GuardHooks::<()>::new()
        .replace_oversized_receipt(|r| format!("{} bytes, not kept", r.len()).into_bytes());
    let outcome = run_once_on(&client, &spec, &defaults, &note, |_| async {
        Ok::<_, Failure<()>>(large.clone())
    })
    .await
    .unwrap();
    assert_eq!(outcome.receipt(), b"100 bytes, not kept");
    let again = client
        .run_once(&spec, &defaults, |_| async {
            Ok::<_, Failure<()>>(b"no".to_vec())
        })
        .await
        .unwrap();
    assert!(matches!(&again, Outcome::Replayed(done) if done.receipt == b"100 bytes, not kept"));

    // Another attempt's lease (300 s) outlasts the wait: by default the guard stops at once;
    // told to wait whatever the lease, it polls for the whole wait and then says in progress.
    let other = ActionSpec::new("agent", "run", "email.send", r#"{"to":"x"}"#);
    client.clone().request_token(&other).await.unwrap();
    let short = GuardOptions {
        max_wait: Duration::from_millis(300),
        poll_interval: Duration::from_millis(50),
        ..GuardOptions::default()
    };
    let ran = Arc::new(AtomicUsize::new(0));
    let work = |_| {
        let ran = ran.clone();
        async move {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Failure<()>>(b"sent".to_vec())
        }
    };
    let err = client.run_once(&other, &short, work).await.unwrap_err();
    assert!(
        matches!(err, GuardError::InProgressBeyondWait { .. }),
        "{err:?}"
    );
    let patient = GuardHooks::new().wait_whatever_the_lease();
    let err = run_once_on(&client, &other, &short, &patient, work)
        .await
        .unwrap_err();
    assert!(
        matches!(err, GuardError::Gate(ClientError::InProgress { .. })),
        "{err:?}"
    );

    // Nobody listens: told to fail at once, the guard does not wait out its hour.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let channel = tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect_lazy();
    let nobody = GateClient::from_channel(channel);
    let hour = GuardOptions {
        max_wait: Duration::from_secs(3600),
        ..GuardOptions::default()
    };
    let fast = GuardHooks::new().fail_at_once_when_unavailable();
    let err = run_once_on(&nobody, &spec, &hour, &fast, work)
        .await
        .unwrap_err();
    assert!(
        matches!(err, GuardError::Gate(ClientError::Unavailable(_))),
        "{err:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0, "nothing ran");
}

/// A real `oncegate serve` on the embedded store in `dir/data`, with leases as short as 50 ms:
/// its local operator is `oncegate admin --data-dir <dir>/data`, over the admin socket there.
async fn served_with_operator(dir: &TempDir) -> (LoggedGate, GateClient) {
    let config = write_file(
        dir.path(),
        "gate.toml",
        "[limits]\nmin_lease_ttl_seconds = 0.05\n",
    );
    let served = LoggedGate::start(
        dir,
        &[
            "--listen",
            "127.0.0.1:0",
            "--config",
            config.to_str().unwrap(),
        ],
    );
    let client = GateClient::connect(format!("http://{}", served.addr))
        .await
        .unwrap();
    (served, client)
}

/// An attempt whose outcome is unknown and whose lease has ended: an operator's to settle.
async fn left_unresolved(client: &GateClient, spec: &ActionSpec) -> pb::ActionRef {
    let leased = spec.clone().lease(Duration::from_millis(100));
    let err = client
        .run_once(&leased, &GuardOptions::default(), |_| async {
            Err::<Vec<u8>, Failure<&str>>("provider timed out".into())
        })
        .await
        .unwrap_err();
    let GuardError::OutcomeUnknown { grant, .. } = err else {
        panic!("expected OutcomeUnknown, got {err:?}");
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while client
        .clone()
        .get_action(&grant.action)
        .await
        .unwrap()
        .state()
        != pb::ActionState::Expired
    {
        assert!(Instant::now() < deadline, "the lease did not end");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    grant.action
}

/// `oncegate admin resolve --outcome completed` as the gate's local operator; its text output.
fn operator_resolves(
    dir: &TempDir,
    action: &pb::ActionRef,
    receipt: &str,
    format: &[&str],
) -> String {
    let scope = action.scope.clone().unwrap();
    let data = dir.path().join("data");
    let out = oncegate_command()
        .args(["admin", "resolve", "--data-dir", data.to_str().unwrap()])
        .args([
            "--agent",
            &scope.agent_id,
            "--run",
            &scope.run_id,
            "--key",
            &action.key,
        ])
        .args(["--outcome", "completed", "--receipt", receipt])
        .args(format)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    String::from_utf8(out.stdout).unwrap()
}

/// The line of `oncegate admin`'s text output that says what the operator's receipt is.
fn shown_format(shown: &str) -> Option<&str> {
    shown
        .lines()
        .find_map(|line| line.trim().strip_prefix("completion.receipt_format"))
        .map(str::trim)
}

/// The guard's replay of `spec`, which must not run anything.
async fn replayed(client: &GateClient, spec: &ActionSpec) -> Outcome {
    let outcome = client
        .run_once(spec, &GuardOptions::default(), |_| async {
            Err::<Vec<u8>, _>(Failure::Definite("a completed action must not run"))
        })
        .await
        .unwrap();
    assert!(matches!(outcome, Outcome::Replayed(_)), "{outcome:?}");
    outcome
}

#[tokio::test]
async fn an_operators_text_and_json_receipts_replay_as_they_were_written() {
    let dir = TempDir::new().unwrap();
    let (_served, client) = served_with_operator(&dir).await;

    // Text that would parse as JSON: the operator's word, not the bytes, says what it is.
    let text = ActionSpec::new("reconciled", "run-1", "pay", r#"{"n":1}"#);
    let action = left_unresolved(&client, &text).await;
    let shown = operator_resolves(&dir, &action, "12345", &["--receipt-format", "text"]);
    assert_eq!(shown_format(&shown), Some("text"), "{shown}");
    let outcome = replayed(&client, &text).await;
    assert_eq!(outcome.decoded().unwrap(), Receipt::Text("12345".into()));
    assert_eq!(outcome.json::<String>().unwrap(), "12345");
    assert_eq!(outcome.action(), &action);
    let Outcome::Replayed(done) = outcome else {
        unreachable!()
    };
    assert_eq!(done.receipt_format(), pb::ReceiptFormat::Text);
    assert_eq!(done.source(), pb::CompletionSource::Operator);
    assert_eq!(done.operator, "local-operator");

    // No --receipt-format: the CLI says JSON because it parses as JSON.
    let value = ActionSpec::new("reconciled", "run-1", "pay", r#"{"n":2}"#);
    let action = left_unresolved(&client, &value).await;
    let shown = operator_resolves(
        &dir,
        &action,
        r#"{"transfer_id": "tr-op-2", "amount": 50}"#,
        &[],
    );
    assert_eq!(shown_format(&shown), Some("json"), "{shown}");
    let outcome = replayed(&client, &value).await;
    let expected = json!({"transfer_id": "tr-op-2", "amount": 50});
    assert_eq!(outcome.decoded().unwrap(), Receipt::Json(expected.clone()));
    assert_eq!(outcome.json::<Value>().unwrap(), expected);
    // The raw RequestToken's completion reads the same way.
    let mut raw = client.clone();
    let (named, TokenReply::AlreadyCompleted(done)) = raw.request_token_for(&value).await.unwrap()
    else {
        panic!("expected the completion");
    };
    assert_eq!(
        oncegate_client::receipt::decode(&named, &done).unwrap(),
        Receipt::Json(expected)
    );
}

#[tokio::test]
async fn a_receipt_the_client_cannot_decode_names_the_action_and_its_writer() {
    let gate = TestGate::start(Kind::Embedded).await;
    let mut client = gate_client(&gate).await;
    let spec = ActionSpec::new("reconciled", "run-3", "pay", r#"{"n":3}"#);
    let TokenReply::Granted(grant) = client.request_token(&spec).await.unwrap() else {
        panic!("expected a grant");
    };
    // A worker completes by hand with bytes that are not JSON.
    client
        .complete(&grant.action, &grant.token, b"\xffraw-42")
        .await
        .unwrap();
    let outcome = replayed(&client, &spec).await;
    assert_eq!(
        outcome.decoded().unwrap(),
        Receipt::Bytes(b"\xffraw-42".to_vec())
    );
    let err = outcome.json::<Value>().unwrap_err();
    let ClientError::ReceiptUndecodable {
        action,
        writer,
        operator,
        format,
        fencing,
        ..
    } = &err
    else {
        panic!("expected ReceiptUndecodable, got {err:?}");
    };
    assert_eq!(**action, grant.action);
    assert_eq!(
        (*writer, operator.as_str(), *format, *fencing),
        (
            pb::CompletionSource::Worker,
            "",
            pb::ReceiptFormat::Unspecified,
            grant.fencing
        )
    );
    assert!(!err.is_retryable());
    let shown = err.to_string();
    for part in [
        r#"agent "reconciled""#.to_owned(),
        r#"run "run-3""#.to_owned(),
        format!("key {:?}", grant.action.key),
        format!("a worker (fencing {})", grant.fencing),
        "not run again".to_owned(),
    ] {
        assert!(shown.contains(&part), "{part} in {shown}");
    }
}

#[tokio::test]
async fn a_budget_refusal_says_used_limit_and_when_it_frees_up() {
    let gate = TestGate::start_with(
        Kind::Embedded,
        config(
            r#"
[[budgets]]
name = "eur-per-day"
actions = ["payments.refund"]
window_seconds = 86400
limit = "100.00"
sum = "/amount"
decimals = 2
"#,
        ),
    )
    .await;
    let mut client = gate_client(&gate).await;
    let refund = |amount: &str, key: &str| {
        ActionSpec::new(
            "refunder",
            "run-1",
            "payments.refund",
            &format!(r#"{{"amount":{amount}}}"#),
        )
        .idempotency_key(key)
    };
    let first = client.request_token(&refund("99.5", "r-1")).await.unwrap();
    assert!(matches!(first, TokenReply::Granted(_)), "{first:?}");
    let err = client.request_token(&refund("1", "r-2")).await.unwrap_err();
    let ClientError::BudgetExceeded(refused) = &err else {
        panic!("expected BudgetExceeded, got {err:?}");
    };
    let BudgetRefusal {
        budget,
        used,
        limit,
        requested,
        retry_at,
        retry_after,
        ..
    } = refused.as_ref();
    assert_eq!(
        (
            budget.as_str(),
            used.as_str(),
            limit.as_str(),
            requested.as_str()
        ),
        ("eur-per-day", "99.50", "100.00", "1.00")
    );
    let retry_at = retry_at.expect("when it frees up");
    let retry_after = retry_after.expect("how long until then");
    assert!(retry_at > SystemTime::now() && retry_after > Duration::from_secs(86_000));
    assert!(!err.is_retryable());
    // It reads as the gate words it, with the time it names.
    let shown = err.to_string();
    // The gate writes the time as RFC 3339 UTC to the millisecond (".000" included), as
    // oncegate_domain::time does; the client carries the same instant.
    let millis = retry_at.duration_since(UNIX_EPOCH).unwrap().as_millis();
    let at = oncegate_domain::time::rfc3339(i64::try_from(millis).unwrap());
    assert!(
        shown.starts_with(&format!(
            "budget \"eur-per-day\" would be exceeded: 99.50 of 100.00 used in the last 1 d, and \
             this action needs 1.00; nothing was recorded; it frees up at {at} (in "
        )),
        "{shown}"
    );
    // The duration is exact, not rounded to its largest unit: its parts add up to the wait
    // RetryInfo carries.
    let said = &shown[shown.rfind("(in ").unwrap() + 4..shown.rfind(')').unwrap()];
    let words: Vec<&str> = said.split(' ').collect();
    let said_ms: u128 = words
        .chunks(2)
        .map(|part| {
            let n: u128 = part[0].parse().unwrap();
            n * match part[1] {
                "d" => 86_400_000,
                "h" => 3_600_000,
                "min" => 60_000,
                "s" => 1000,
                "ms" => 1,
                unit => panic!("unit {unit} in {said}"),
            }
        })
        .sum();
    assert_eq!(said_ms, retry_after.as_millis(), "{said}");
}
