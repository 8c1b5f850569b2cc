//! Resolvers end to end, on both stores: a principal with the `resolver` role watches
//! the unresolved actions of its agents (WatchUnresolved: what is unresolved when it starts, then
//! each lease that ends with no outcome) and settles them with ResolveExpired and the fencing
//! number it was sent. The agent's retry replays the resolver's receipt; two resolvers racing on
//! one grant settle it once and the other is told; the settlement is counted with
//! `resolved_by="resolver"`; and a resolver is refused everything else and every agent outside
//! its scope.

use std::time::Duration;

use oncegate_grpc::auth::hash_key;
use oncegate_proto::{
    self as pb, action_gate_service_client::ActionGateServiceClient,
    gate_admin_service_client::GateAdminServiceClient,
};
use tonic::{Code, Streaming, transport::Channel};

use crate::support::{
    Kind, LoggedGate, OPS_KEY, Scrape, TestGate, WORKER_KEY, authed, config, expect_error,
    on_stores, principals_toml, token_request, ttl_ms, unresolved_of, wait_until_completed,
};

/// The bank resolver's API key (`billing-*` agents).
const RESOLVER_KEY: &str = "resolver-secret-key-1";
/// A second resolver replica's key (the same scope, another principal).
const REPLICA_KEY: &str = "resolver-secret-key-2";
/// A resolver of payments only (`actions = ["payments.*"]`), for the same agents.
const PAYMENTS_KEY: &str = "resolver-secret-key-3";
/// How long a test waits for a message it expects on a stream (a failure bound, not a timing
/// assertion: the gate scans about once a second).
const PATIENCE: Duration = Duration::from_secs(30);

fn gate_config() -> oncegate_config::ConfigFile {
    config(&gate_config_text())
}

/// [`gate_config`] as the file says it.
fn gate_config_text() -> String {
    let resolvers = format!(
        r#"
        [[principals]]
        name = "bank-resolver"
        role = "resolver"
        agents = ["billing-*"]
        api_key_sha256 = "{}"

        [[principals]]
        name = "bank-resolver-2"
        role = "resolver"
        agents = ["billing-*"]
        api_key_sha256 = "{}"

        [[principals]]
        name = "hr-worker"
        role = "agent"
        agents = ["hr-*"]
        api_key_sha256 = "{}"

        [[principals]]
        name = "payments-resolver"
        role = "resolver"
        agents = ["billing-*"]
        actions = ["payments.*"]
        api_key_sha256 = "{}"
        "#,
        hash_key(RESOLVER_KEY),
        hash_key(REPLICA_KEY),
        hash_key("hr-worker-key"),
        hash_key(PAYMENTS_KEY),
    );
    format!(
        "[limits]\nmin_lease_ttl_seconds = 0.05\n{}\n{resolvers}",
        principals_toml("")
    )
}

struct Clients {
    gate: ActionGateServiceClient<Channel>,
    admin: GateAdminServiceClient<Channel>,
}

async fn clients(gate: &TestGate) -> Clients {
    Clients {
        gate: gate.client().await,
        admin: gate.admin().await,
    }
}

/// Grants `req` to the worker holding `key`.
async fn grant(
    c: &mut Clients,
    req: pb::RequestTokenRequest,
    key: &str,
) -> pb::RequestTokenResponse {
    let resp = c
        .gate
        .request_token(authed(req, Some(key)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.decision(), pb::Decision::Granted, "{resp:?}");
    resp
}

/// A payment of `amount` for `agent` with a short lease, granted and left without an outcome.
async fn lapse(
    c: &mut Clients,
    gate: &TestGate,
    agent: &str,
    amount: u32,
    key: &str,
) -> pb::RequestTokenRequest {
    let mut req = token_request(
        agent,
        "run-1",
        "payments.transfer",
        &format!(r#"{{"amount":{amount},"to":"DE89"}}"#),
    );
    req.lease_ttl = ttl_ms(100);
    let resp = grant(c, req.clone(), key).await;
    gate.time
        .pass_beyond(resp.grant.unwrap().lease_expires_at.unwrap())
        .await;
    req.lease_ttl = None;
    req
}

/// Like [`lapse`], for an action of type `action` (a new action each call).
async fn lapse_action(
    c: &mut Clients,
    gate: &TestGate,
    agent: &str,
    action: &str,
) -> pb::RequestTokenRequest {
    let mut req = token_request(agent, "run-1", action, r#"{"to":"someone"}"#);
    req.lease_ttl = ttl_ms(100);
    let resp = grant(c, req.clone(), WORKER_KEY).await;
    gate.time
        .pass_beyond(resp.grant.unwrap().lease_expires_at.unwrap())
        .await;
    req.lease_ttl = None;
    req
}

async fn watch(
    c: &mut Clients,
    agent: &str,
    key: &str,
) -> Result<Streaming<pb::WatchUnresolvedResponse>, tonic::Status> {
    c.admin
        .watch_unresolved(authed(
            pb::WatchUnresolvedRequest {
                agent_id: agent.into(),
            },
            Some(key),
        ))
        .await
        .map(|r| r.into_inner())
}

/// The next action on the stream (fails the test after [`PATIENCE`]).
async fn next(stream: &mut Streaming<pb::WatchUnresolvedResponse>) -> pb::UnresolvedAction {
    let message = tokio::time::timeout(PATIENCE, stream.message())
        .await
        .expect("an unresolved action within the patience")
        .expect("the stream is healthy")
        .expect("the stream is open");
    message.action.unwrap()
}

fn settle(
    u: &pb::UnresolvedAction,
    receipt: Option<&[u8]>,
    key: &str,
) -> tonic::Request<pb::ResolveExpiredRequest> {
    let (resolution, format) = match receipt {
        Some(_) => (pb::Resolution::Completed, pb::ReceiptFormat::Json),
        None => (pb::Resolution::Failed, pb::ReceiptFormat::Unspecified),
    };
    authed(
        pb::ResolveExpiredRequest {
            action: u.action.clone(),
            resolution: resolution as i32,
            receipt: receipt.unwrap_or_default().to_vec(),
            receipt_format: format as i32,
            note: format!("provider lookup of {}", u.provider_key),
            expected_fencing: u.fencing,
        },
        Some(key),
    )
}

async fn a_lapsed_lease_reaches_a_watching_resolver_and_its_receipt_is_replayed(kind: Kind) {
    let (gate, metrics) = TestGate::start_with_config_and_metrics(kind, gate_config()).await;
    let mut c = clients(&gate).await;
    // Unresolved before anyone watches: the stream starts with it.
    let before = lapse(&mut c, &gate, "billing-1", 10, WORKER_KEY).await;
    let mut stream = watch(&mut c, "", RESOLVER_KEY).await.unwrap();
    let first = next(&mut stream).await;
    assert_eq!(agent(&first), "billing-1");
    assert!(first.provider_key.starts_with("og-") && !first.token.is_empty());

    // A lease that ends while the resolver watches is sent within seconds of its end.
    let during = lapse(&mut c, &gate, "billing-2", 20, WORKER_KEY).await;
    let second = next(&mut stream).await;
    assert_eq!(agent(&second), "billing-2");
    // With what a provider lookup needs.
    assert_eq!(
        (second.action_name.as_str(), second.params_json.as_str()),
        ("payments.transfer", r#"{"amount":20,"to":"DE89"}"#)
    );
    assert!(second.provider_key.starts_with("og-") && second.fencing > 0);

    // The provider knows both: one happened, one did not.
    let done = c
        .admin
        .resolve_expired(settle(&second, Some(br#"{"tx":"tx_20"}"#), RESOLVER_KEY))
        .await
        .unwrap()
        .into_inner();
    let completion = done.completion.unwrap();
    assert_eq!(completion.source(), pb::CompletionSource::Operator);
    assert_eq!(
        (completion.operator.as_str(), completion.fencing),
        ("bank-resolver", second.fencing)
    );
    let failed = c
        .admin
        .resolve_expired(settle(&first, None, RESOLVER_KEY))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((failed.fencing, failed.completion), (first.fencing, None));

    // The agent's retry replays the resolver's receipt; the other is granted again.
    let replay = c
        .gate
        .request_token(authed(during, Some(WORKER_KEY)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(replay.decision(), pb::Decision::AlreadyCompleted);
    assert_eq!(replay.completion.unwrap().receipt, br#"{"tx":"tx_20"}"#);
    let again = grant(&mut c, before, WORKER_KEY).await;
    assert_eq!(again.grant.unwrap().fencing, first.fencing + 1);

    // Counted as the resolver's, not an operator's.
    let scrape = Scrape::fetch(metrics).await;
    let count = |by, resolution| {
        scrape.sum(
            "oncegate_resolutions_total",
            &[("resolved_by", by), ("resolution", resolution)],
        )
    };
    assert_eq!(count("resolver", "completed"), 1.0);
    assert_eq!(count("resolver", "failed"), 1.0);
    assert_eq!(
        count("operator", "completed") + count("operator", "failed"),
        0.0
    );
}
on_stores!(a_lapsed_lease_reaches_a_watching_resolver_and_its_receipt_is_replayed: embedded, redis, postgres);

/// The agent of an unresolved action.
fn agent(u: &pb::UnresolvedAction) -> &str {
    &u.action.as_ref().unwrap().scope.as_ref().unwrap().agent_id
}

async fn two_resolvers_racing_settle_one_grant_once(kind: Kind) {
    let (gate, metrics) = TestGate::start_with_config_and_metrics(kind, gate_config()).await;
    let mut c = clients(&gate).await;
    const N: u32 = 6;
    for amount in 0..N {
        lapse(&mut c, &gate, "billing-race", amount, WORKER_KEY).await;
    }
    // Both replicas see every action (each from its own stream) and settle them at once, one
    // as completed and one as failed on every other action: each grant is settled once, by one of
    // them, and the other hears so.
    let mut streams = [
        watch(&mut c, "billing-race", RESOLVER_KEY).await.unwrap(),
        watch(&mut c, "billing-race", REPLICA_KEY).await.unwrap(),
    ];
    let mut settled = 0;
    for i in 0..N {
        let seen = [next(&mut streams[0]).await, next(&mut streams[1]).await];
        assert_eq!(seen[0], seen[1], "both replicas are sent the same grant");
        let u = &seen[0];
        let second_receipt = if i % 2 == 0 {
            None
        } else {
            Some(&br#"{"tx":"other"}"#[..])
        };
        let (mut a, mut b) = (gate.admin().await, gate.admin().await);
        let (one, two) = tokio::join!(
            a.resolve_expired(settle(u, Some(br#"{"tx":"one"}"#), RESOLVER_KEY)),
            b.resolve_expired(settle(u, second_receipt, REPLICA_KEY)),
        );
        let (won, lost) = match (one, two) {
            (Ok(won), Err(lost)) | (Err(lost), Ok(won)) => (won.into_inner(), lost),
            other => panic!("exactly one resolver settles a grant: {other:?}"),
        };
        assert_eq!(won.fencing, u.fencing);
        let reason = crate::support::reason(&lost);
        assert!(
            reason == "ALREADY_COMPLETED" || reason == "ALREADY_SETTLED",
            "the other is told it is settled: {lost:?}"
        );
        assert_eq!(lost.code(), Code::FailedPrecondition);
        settled += 1;
    }
    let scrape = Scrape::fetch(metrics).await;
    let total: f64 = scrape
        .series("oncegate_resolutions_total")
        .map(|(_, v)| v)
        .sum();
    assert_eq!(total, f64::from(settled));
    let left = unresolved_of(&mut c.admin, "billing-race", OPS_KEY).await;
    assert!(left.is_empty(), "{left:?}");
}
on_stores!(two_resolvers_racing_settle_one_grant_once: embedded, redis, postgres);

async fn a_resolver_settles_only_the_grant_it_was_sent(kind: Kind) {
    let gate = TestGate::start_with(kind, gate_config()).await;
    let mut c = clients(&gate).await;
    let req = lapse(&mut c, &gate, "billing-stale", 1, WORKER_KEY).await;
    let mut stream = watch(&mut c, "billing-stale", RESOLVER_KEY).await.unwrap();
    let stale = next(&mut stream).await;
    // An operator settles it first as failed; the action is granted again and lapses again.
    c.admin
        .resolve_expired(settle(&stale, None, OPS_KEY))
        .await
        .unwrap();
    let mut again = req.clone();
    again.lease_ttl = ttl_ms(100);
    let regrant = grant(&mut c, again, WORKER_KEY).await.grant.unwrap();
    gate.time
        .pass_beyond(regrant.lease_expires_at.unwrap())
        .await;
    // The resolver's late answer about the first grant settles nothing.
    let status = c
        .admin
        .resolve_expired(settle(&stale, Some(br#"{"tx":"late"}"#), RESOLVER_KEY))
        .await
        .unwrap_err();
    let meta = expect_error(&status, Code::FailedPrecondition, "ALREADY_SETTLED");
    assert_eq!(meta["state"], "EXPIRED");
    assert_eq!(meta["fencing"], regrant.fencing.to_string());
    let fresh = next(&mut stream).await;
    assert_eq!(fresh.fencing, regrant.fencing);
    c.admin
        .resolve_expired(settle(&fresh, Some(br#"{"tx":"t"}"#), RESOLVER_KEY))
        .await
        .unwrap();
}
on_stores!(a_resolver_settles_only_the_grant_it_was_sent: embedded, redis, postgres);

async fn a_resolver_scoped_by_action_type_sees_and_settles_only_those(kind: Kind) {
    let gate = TestGate::start_with(kind, gate_config()).await;
    let mut c = clients(&gate).await;
    // The mail lapses first, so that a stream that leaked it would send it first.
    lapse_action(&mut c, &gate, "billing-scoped", "mail.send").await;
    lapse_action(&mut c, &gate, "billing-scoped", "payments.transfer").await;
    let mut stream = watch(&mut c, "", PAYMENTS_KEY).await.unwrap();
    let payment = next(&mut stream).await;
    assert_eq!(payment.action_name, "payments.transfer");
    // An unscoped resolver of the same agents sees both.
    let mut everything = watch(&mut c, "billing-scoped", RESOLVER_KEY).await.unwrap();
    let mut seen = [
        next(&mut everything).await.action_name,
        next(&mut everything).await.action_name,
    ];
    seen.sort();
    assert_eq!(seen, ["mail.send", "payments.transfer"]);
    let mail = unresolved_of(&mut c.admin, "billing-scoped", OPS_KEY)
        .await
        .into_iter()
        .find(|u| u.action_name == "mail.send")
        .unwrap();

    // Settling the mail is refused, naming its type, and leaves it unresolved.
    let status = c
        .admin
        .resolve_expired(settle(&mail, None, PAYMENTS_KEY))
        .await
        .unwrap_err();
    expect_error(&status, Code::PermissionDenied, "FORBIDDEN_SCOPE");
    assert!(status.message().contains(r#""mail.send""#), "{status:?}");
    let listed = unresolved_of(&mut c.admin, "billing-scoped", OPS_KEY).await;
    assert_eq!(listed.len(), 2, "{listed:?}");

    // The payment is settled; settled again (another replica), it is told so, not refused for
    // its scope: the type of a settled action is not read.
    c.admin
        .resolve_expired(settle(&payment, Some(br#"{"tx":"t"}"#), PAYMENTS_KEY))
        .await
        .unwrap();
    let again = c
        .admin
        .resolve_expired(settle(&payment, Some(br#"{"tx":"t"}"#), PAYMENTS_KEY))
        .await
        .unwrap_err();
    let reason = crate::support::reason(&again);
    assert!(
        reason == "ALREADY_COMPLETED" || reason == "ALREADY_SETTLED",
        "{again:?}"
    );
}
on_stores!(a_resolver_scoped_by_action_type_sees_and_settles_only_those: embedded, redis, postgres);

async fn a_resolver_is_refused_everything_else(kind: Kind) {
    let gate = TestGate::start_with(kind, gate_config()).await;
    let mut c = clients(&gate).await;
    // An action outside its scope lapses first, so that a stream that leaked it would send it
    // first (agents are listed shorter ids first).
    lapse(&mut c, &gate, "hr-1", 1, "hr-worker-key").await;
    lapse(&mut c, &gate, "billing-scope", 2, WORKER_KEY).await;
    let mut stream = watch(&mut c, "", RESOLVER_KEY).await.unwrap();
    let mine = next(&mut stream).await;
    assert_eq!(agent(&mine), "billing-scope");
    let hr = unresolved_of(&mut c.admin, "hr-1", OPS_KEY).await.remove(0);

    let refused = |status: tonic::Status| {
        expect_error(&status, Code::PermissionDenied, "FORBIDDEN_SCOPE");
    };
    // Outside its agents: neither watched nor settled.
    refused(watch(&mut c, "hr-1", RESOLVER_KEY).await.unwrap_err());
    refused(
        c.admin
            .resolve_expired(settle(&hr, None, RESOLVER_KEY))
            .await
            .unwrap_err(),
    );
    // A settlement must name the grant.
    let mut unconditional = settle(&mine, None, RESOLVER_KEY);
    unconditional.get_mut().expected_fencing = 0;
    let status = c.admin.resolve_expired(unconditional).await.unwrap_err();
    let meta = expect_error(&status, Code::InvalidArgument, "INVALID_REQUEST");
    assert_eq!(meta["field"], "expected_fencing");
    // Every other admin RPC, and the worker API.
    let action = mine.action.clone();
    let a = &mut c.admin;
    let key = Some(RESOLVER_KEY);
    refused(
        a.record_external_completion(authed(
            pb::RecordExternalCompletionRequest {
                action: action.clone(),
                receipt: b"x".to_vec(),
                receipt_format: pb::ReceiptFormat::Text as i32,
                ..Default::default()
            },
            key,
        ))
        .await
        .unwrap_err(),
    );
    refused(
        a.list_unresolved(authed(
            pb::ListUnresolvedRequest {
                agent_id: "billing-scope".into(),
                ..Default::default()
            },
            key,
        ))
        .await
        .unwrap_err(),
    );
    refused(
        a.export_receipts(authed(
            pb::ExportReceiptsRequest {
                agent_id: "billing-scope".into(),
                ..Default::default()
            },
            key,
        ))
        .await
        .unwrap_err(),
    );
    refused(
        a.decide_approval(authed(
            pb::DecideApprovalRequest {
                action: action.clone(),
                approval_id: "a".into(),
                approve: true,
                ..Default::default()
            },
            key,
        ))
        .await
        .unwrap_err(),
    );
    refused(
        a.list_approvals(authed(
            pb::ListApprovalsRequest {
                agent_id: "billing-scope".into(),
                ..Default::default()
            },
            key,
        ))
        .await
        .unwrap_err(),
    );
    refused(
        a.get_budgets(authed(
            pb::GetBudgetsRequest {
                agent_id: "billing-scope".into(),
            },
            key,
        ))
        .await
        .unwrap_err(),
    );
    refused(
        a.list_undeliverable_events(authed(pb::ListUndeliverableEventsRequest::default(), key))
            .await
            .unwrap_err(),
    );
    let worker = token_request(
        "billing-scope",
        "run-9",
        "payments.transfer",
        r#"{"amount":3}"#,
    );
    refused(c.gate.request_token(authed(worker, key)).await.unwrap_err());
    refused(
        c.gate
            .get_action(authed(
                pb::GetActionRequest {
                    action: action.clone(),
                },
                key,
            ))
            .await
            .unwrap_err(),
    );
    // Agents are not resolvers.
    refused(
        watch(&mut c, "billing-scope", WORKER_KEY)
            .await
            .unwrap_err(),
    );
    // Still unresolved: nothing above changed it; the resolver can settle it.
    c.admin
        .resolve_expired(settle(&mine, None, RESOLVER_KEY))
        .await
        .unwrap();
}
on_stores!(a_resolver_is_refused_everything_else: embedded, redis, postgres);

/// The Rust client's resolver against a real gate: a fake bank that knows some provider keys.
async fn the_rust_resolver_settles_what_the_provider_knows(kind: Kind) {
    use std::{
        collections::HashMap,
        sync::{Arc, Mutex},
    };

    use oncegate_client::{Lookup, Resolver};

    let gate = TestGate::start_with(kind, gate_config()).await;
    let mut c = clients(&gate).await;
    // Five payments whose leases end with no outcome, and one email nobody can look up.
    let mut asked = Vec::new();
    for amount in 1..=5 {
        let mut req = token_request(
            "billing-rust",
            "run-1",
            "payments.transfer",
            &format!(r#"{{"amount":{amount},"to":"DE89"}}"#),
        );
        req.lease_ttl = ttl_ms(100);
        let resp = grant(&mut c, req.clone(), WORKER_KEY).await;
        req.lease_ttl = None;
        asked.push((req, resp.grant.unwrap()));
    }
    let mut email = token_request("billing-rust", "run-1", "email.send", r#"{"to":"a@b"}"#);
    email.lease_ttl = ttl_ms(100);
    let email_grant = grant(&mut c, email, WORKER_KEY).await.grant.unwrap();
    gate.time
        .pass_beyond(email_grant.lease_expires_at.unwrap())
        .await;
    for (_, g) in &asked {
        gate.time.pass_beyond(g.lease_expires_at.unwrap()).await;
    }
    // The bank: amount 1 was paid (tx_1), amount 2 never reached it, amount 3 it cannot tell,
    // amount 4 its lookup fails, amount 5 its lookup hangs.
    let bank: HashMap<String, u32> = asked
        .iter()
        .map(|(req, g)| {
            let amount = req.params_json[10..11].parse().unwrap();
            (g.provider_key.clone(), amount)
        })
        .collect();
    let looked = Arc::new(Mutex::new(Vec::new()));
    let seen = looked.clone();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", gate.addr))
        .unwrap()
        .connect_lazy();
    let resolver = Resolver::new(channel)
        .with_api_key(RESOLVER_KEY)
        .unwrap()
        .timeout(Duration::from_millis(300))
        .lookup("payments.transfer", move |u| {
            let amount = bank[&u.provider_key];
            assert_eq!(
                u.params()["amount"],
                amount,
                "the params come with the action"
            );
            seen.lock().unwrap().push(amount);
            async move {
                match amount {
                    1 => Ok(Lookup::json(&serde_json::json!({"tx": "tx_1"}))),
                    2 => Ok(Lookup::Failed),
                    3 => Ok(Lookup::Unknown),
                    4 => Err("the bank answered 503".into()),
                    _ => std::future::pending().await,
                }
            }
        });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(resolver.run(async {
        let _ = stopped.await;
    }));
    // Wait until every payment was looked up and the two the bank knows are settled.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let left = loop {
        let left = unresolved_of(&mut c.admin, "billing-rust", OPS_KEY).await;
        if looked.lock().unwrap().len() >= 5 && left.len() == 4 {
            break left;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not settled: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let _ = stop.send(());
    running.await.unwrap();
    // Left for a person: what the bank could not answer, and the email (no lookup for it).
    let mut names: Vec<_> = left
        .iter()
        .map(|u| (u.action_name.clone(), u.params_json.clone()))
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            ("email.send".to_owned(), r#"{"to":"a@b"}"#.to_owned()),
            (
                "payments.transfer".into(),
                r#"{"amount":3,"to":"DE89"}"#.into()
            ),
            (
                "payments.transfer".into(),
                r#"{"amount":4,"to":"DE89"}"#.into()
            ),
            (
                "payments.transfer".into(),
                r#"{"amount":5,"to":"DE89"}"#.into()
            ),
        ]
    );
    // The paid one replays the bank's receipt; the one that never happened is granted again.
    let replay = c
        .gate
        .request_token(authed(asked[0].0.clone(), Some(WORKER_KEY)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(replay.decision(), pb::Decision::AlreadyCompleted);
    let completion = replay.completion.unwrap();
    assert_eq!(completion.receipt, br#"{"tx":"tx_1"}"#);
    assert_eq!(completion.operator, "bank-resolver");
    let again = grant(&mut c, asked[1].0.clone(), WORKER_KEY).await;
    assert_eq!(again.grant.unwrap().fencing, asked[1].1.fencing + 1);
}
on_stores!(the_rust_resolver_settles_what_the_provider_knows: embedded, redis, postgres);

/// A gate process on the embedded store in `dir/data`, at `addr`, with [`gate_config`]'s
/// principals (killed on drop).
fn gate_process(dir: &tempfile::TempDir, addr: &str) -> LoggedGate {
    let config = dir.path().join("oncegate.toml");
    std::fs::write(&config, gate_config_text()).unwrap();
    LoggedGate::start(
        dir,
        &["--listen", addr, "--config", config.to_str().unwrap()],
    )
}

/// A lease of `agent` that ends with no outcome (200 ms, in real time: a gate process); the
/// action it names.
async fn lapse_on(addr: &str, agent: &str) -> pb::ActionRef {
    let mut client = crate::support::connect(addr).await;
    let mut req = token_request(agent, "run-1", "payments.transfer", r#"{"amount":7}"#);
    req.lease_ttl = ttl_ms(200);
    let resp = client
        .request_token(authed(req, Some(WORKER_KEY)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.decision(), pb::Decision::Granted, "{resp:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    resp.action.unwrap()
}

/// Waits (at most [`PATIENCE`]) until `action` is completed, on the gate at `addr`.
async fn settled(addr: &str, action: pb::ActionRef) {
    let mut client = crate::support::connect(addr).await;
    wait_until_completed(&mut client, &action, Some(WORKER_KEY), PATIENCE).await;
}

#[tokio::test]
async fn the_rust_resolver_reopens_its_stream_when_the_gate_comes_back() {
    use oncegate_client::{Lookup, Resolver};

    let dir = tempfile::TempDir::new().unwrap();
    let addr = format!("127.0.0.1:{}", crate::support::free_port());
    let gate = gate_process(&dir, &addr);
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    let resolver = Resolver::new(channel)
        .with_api_key(RESOLVER_KEY)
        .unwrap()
        .backoff(Duration::from_millis(50), Duration::from_millis(500))
        .lookup("payments.transfer", |_| async {
            Ok(Lookup::json(&serde_json::json!({"tx": "found"})))
        });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(resolver.run(async {
        let _ = stopped.await;
    }));
    // Settled while the stream is open.
    settled(&addr, lapse_on(&addr, "billing-before").await).await;

    // The gate crashes (SIGKILL) and comes back on the same address: the resolver's stream
    // broke, and it reopens it, so a lease that ends afterwards is settled too.
    drop(gate);
    let _gate = gate_process(&dir, &addr);
    settled(&addr, lapse_on(&addr, "billing-after").await).await;
    let _ = stop.send(());
    running.await.unwrap();
}
