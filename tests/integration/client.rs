//! The Rust client and guard against a real gate: replay without running, definite failures
//! released, ambiguous ones kept for reconciliation, waiting out an attempt in progress, a
//! reused key stopping the guard, and the hooks the MCP gateway runs the guard with.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use oncegate_client::{
    ActionSpec, ClientError, Failure, GateClient, GuardError, GuardHooks, GuardOptions, Outcome,
    TokenReply, run_once_on,
};
use oncegate_gate::policy::Policies;
use oncegate_proto::{self as pb};

use crate::support::{Kind, Scrape, StoreTime, TestGate, millis_of};

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
