//! Who may settle or pick up an action and the listing's bounded work over the
//! agents index: the operator role needs a named principal, a holder name is no
//! credential, and the agents index forgets agents with nothing left to list.

use oncegate_config::defaults;
use oncegate_grpc::{server::ServerOptions, tls};
use oncegate_proto::{
    self as pb, action_gate_service_client::ActionGateServiceClient,
    gate_admin_service_client::GateAdminServiceClient,
};
use oncegate_store::redis::keys;
use tonic::{Code, transport::Channel};

use crate::support::{
    Kind, LoggedGate, OPS_KEY, Pki, RedisServer, TestGate, WORKER_KEY, authed, backend,
    complete_as, config, connect, expect_error, grant, grant_as, on_stores, principals_toml,
    tls_channel, token_request,
};

/// Mutual TLS without `[[principals]]` (the shape of a quick production start): every certificate
/// holder may act as an agent, none as an operator, so no worker pod can settle another team's
/// payment as failed and have it paid again.
async fn without_principals_a_certificate_is_no_operator(kind: Kind) {
    let pki = Pki::new();
    let settings = tls::settings(
        pki.server.cert.as_bytes(),
        pki.server.key.as_bytes(),
        Some(pki.ca.pem.as_bytes()),
        true,
    )
    .unwrap();
    let options = ServerOptions {
        tls: Some(settings),
        ..defaults::server()
    };
    let gate = TestGate::serve_with_options(
        backend(kind).await,
        oncegate_gate::policy::Policies::default(),
        options,
    )
    .await;
    let channel = tls_channel(&gate.addr.to_string(), &pki.ca.pem, Some(&pki.worker))
        .await
        .unwrap();
    let mut worker = ActionGateServiceClient::new(channel.clone());
    let (action, _) = grant(
        &mut worker,
        token_request("team-b", "run", "pay", r#"{"n":1}"#),
    )
    .await;
    let mut admin = GateAdminServiceClient::new(channel);
    let status = admin
        .resolve_expired(pb::ResolveExpiredRequest {
            action: Some(action),
            resolution: pb::Resolution::Failed as i32,
            ..Default::default()
        })
        .await
        .unwrap_err();
    expect_error(&status, Code::PermissionDenied, "FORBIDDEN_SCOPE");
    let status = admin
        .list_unresolved(pb::ListUnresolvedRequest::default())
        .await
        .unwrap_err();
    expect_error(&status, Code::PermissionDenied, "FORBIDDEN_SCOPE");
}
on_stores!(without_principals_a_certificate_is_no_operator: embedded, redis);

/// Two agent principals allowed for the same agents: the one that was granted gets its live token
/// redelivered; the other, even knowing the params and the holder name, does not. GetAction shows
/// the holder to operators only.
async fn a_holder_name_is_no_credential(kind: Kind) {
    const OTHER_KEY: &str = "second-worker-key-2";
    let second = format!(
        "[[principals]]\nname = \"billing-worker-2\"\nrole = \"agent\"\nagents = [\"billing-*\"]\napi_key_sha256 = \"{}\"\n",
        oncegate_grpc::auth::hash_key(OTHER_KEY)
    );
    let gate =
        TestGate::start_with(kind, config(&format!("{}\n{second}", principals_toml("")))).await;
    let channel: Channel = tonic::transport::Endpoint::from_shared(format!("http://{}", gate.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = ActionGateServiceClient::new(channel.clone());
    let mut req = token_request("billing-1", "run", "pay", r#"{"n":1}"#);
    req.holder = "worker-7".into();
    let first = client
        .request_token(authed(req.clone(), Some(WORKER_KEY)))
        .await
        .unwrap()
        .into_inner();
    let (action, token) = (first.action.unwrap(), first.grant.unwrap().token);
    let again = client
        .request_token(authed(req.clone(), Some(WORKER_KEY)))
        .await
        .unwrap()
        .into_inner();
    assert!(again.redelivered && again.grant.unwrap().token == token);
    let status = client
        .request_token(authed(req, Some(OTHER_KEY)))
        .await
        .unwrap_err();
    expect_error(&status, Code::Aborted, "IDEMPOTENCY_IN_PROGRESS");

    let get = pb::GetActionRequest {
        action: Some(action),
    };
    for (key, holder) in [(WORKER_KEY, ""), (OTHER_KEY, ""), (OPS_KEY, "worker-7")] {
        let view = client
            .get_action(authed(get.clone(), Some(key)))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(view.holder, holder, "as {key}");
    }
}
on_stores!(a_holder_name_is_no_credential: embedded, redis);

/// Every node the agents index may live on: it is one key, on one node; the others answer MOVED.
fn agents_index_ports(gate: &TestGate) -> Vec<u16> {
    match (&gate.backend.redis, &gate.backend.cluster) {
        (Some(redis), _) => vec![redis.port],
        (None, Some(cluster)) => cluster.nodes.iter().map(|n| n.port).collect(),
        _ => unreachable!("a Redis backend"),
    }
}

/// 300 agents whose actions all settled: one all-agents page visits a bounded number of them
/// (and says where to go on), and the agents index forgets every agent with nothing to list.
async fn listing_every_agent_is_bounded_and_prunes_settled_agents(kind: Kind) {
    let gate = TestGate::start_with(kind, config(&principals_toml(""))).await;
    let channel: Channel = tonic::transport::Endpoint::from_shared(format!("http://{}", gate.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = ActionGateServiceClient::new(channel.clone());
    let mut admin = GateAdminServiceClient::new(channel);
    for i in 0..300 {
        let req = token_request(&format!("billing-{i:03}"), "run", "pay", r#"{"n":1}"#);
        let (action, grant) = grant_as(&mut client, req, Some(WORKER_KEY)).await;
        complete_as(&mut client, &action, &grant.token, b"ok", Some(WORKER_KEY))
            .await
            .unwrap();
    }
    let ports = agents_index_ports(&gate);
    let agents = || {
        ports
            .iter()
            .map(|port| {
                crate::support::topology::query::<i64>(*port, redis::cmd("ZCARD").arg(keys::AGENTS))
                    .unwrap_or(0)
            })
            .sum::<i64>()
    };
    // The index entries are written after each grant, without holding it up: wait for them.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while agents() < 300 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(agents(), 300);
    let list = |token: String| pb::ListUnresolvedRequest {
        page_size: 1,
        page_token: token,
        ..Default::default()
    };
    let first = admin
        .list_unresolved(authed(list(String::new()), Some(OPS_KEY)))
        .await
        .unwrap()
        .into_inner();
    assert!(first.actions.is_empty());
    assert!(
        !first.next_page_token.is_empty(),
        "one page does not visit all 300 agents"
    );
    let left = agents();
    assert!(
        left > 0 && left < 300,
        "the visited agents were pruned: {left} left"
    );
    let mut token = first.next_page_token;
    while !token.is_empty() {
        token = admin
            .list_unresolved(authed(list(token), Some(OPS_KEY)))
            .await
            .unwrap()
            .into_inner()
            .next_page_token;
    }
    assert_eq!(agents(), 0, "every settled agent pruned");
}
on_stores!(listing_every_agent_is_bounded_and_prunes_settled_agents: redis, cluster);

/// A failed write of the agents index is logged and tried again with what queued meanwhile; after
/// its attempts the agents of the last one are given up, logged by name, and the next agent starts
/// the writing afresh. The index key holds a string meanwhile, so each `ZADD` to it fails
/// (`WRONGTYPE`) while every other command of the gate works.
#[tokio::test]
async fn a_failed_agents_index_write_is_tried_again_then_given_up_and_logged() {
    use std::time::{Duration, Instant};

    let redis = RedisServer::start();
    let dir = tempfile::TempDir::new().unwrap();
    let url = redis.url();
    let gate = LoggedGate::serve(
        &dir,
        &["--listen", "127.0.0.1:0", "--redis-url", &url, "--unsigned"],
    );
    let mut client = connect(&gate.addr).await;
    let query = |cmd: &redis::Cmd| crate::support::topology::query::<redis::Value>(redis.port, cmd);
    let break_index = || query(redis::cmd("SET").arg(keys::AGENTS).arg("not a sorted set"));
    let mend_index = || query(redis::cmd("DEL").arg(keys::AGENTS));
    let indexed = |agent: &str| {
        let member = format!("{:010}:{agent}", agent.len());
        query(redis::cmd("ZSCORE").arg(keys::AGENTS).arg(member))
            .is_ok_and(|score| score != redis::Value::Nil)
    };
    let wait = |what: &str, done: &dyn Fn() -> bool, within: Duration| {
        let deadline = Instant::now() + within;
        while !done() {
            assert!(Instant::now() < deadline, "{what}: {}", gate.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let retried = "could not add agents to the agents index; trying again";
    let given_up = "gave up adding agents to the agents index";

    // A write that fails once is made on the next attempt (half a second later).
    break_index().unwrap();
    grant(
        &mut client,
        token_request("billing-late", "run", "pay", "{}"),
    )
    .await;
    gate.wait_for_log(retried, 1);
    mend_index().unwrap();
    wait(
        "billing-late indexed on a later attempt",
        &|| indexed("billing-late"),
        Duration::from_secs(10),
    );
    assert!(!gate.log().contains(given_up), "{}", gate.log());
    // One retry warning or more, as the mend met the pauses.
    let retried_before = gate.log().matches(retried).count();

    // A write that keeps failing is given up after 5 attempts (7.5 s of pauses), by name.
    break_index().unwrap();
    grant(
        &mut client,
        token_request("billing-lost", "run", "pay", "{}"),
    )
    .await;
    wait(
        "the write given up",
        &|| gate.log().contains(given_up),
        Duration::from_secs(30),
    );
    let log = gate.log();
    assert_eq!(log.matches(retried).count(), retried_before + 4, "{log}");
    let line = log.lines().find(|l| l.contains(given_up)).unwrap();
    assert!(
        line.contains("billing-lost") && line.contains("ERROR"),
        "{line}"
    );

    // The writing ended with it: the next agent's grant starts it again.
    mend_index().unwrap();
    grant(
        &mut client,
        token_request("billing-next", "run", "pay", "{}"),
    )
    .await;
    wait(
        "billing-next indexed",
        &|| indexed("billing-next"),
        Duration::from_secs(10),
    );
    assert!(!indexed("billing-lost"), "given up, not written later");
}

/// The agents index is written when a grant opens its agent's lease index, not on every grant: a
/// grant beside an unsettled action of the same agent leaves the index as it is, and a grant that
/// opens the lease index again (after a listing pruned the agent) puts the agent back.
async fn the_agents_index_is_written_when_an_agents_lease_index_opens(kind: Kind) {
    use std::time::{Duration, Instant};

    let gate = TestGate::start_with(kind, config(&principals_toml(""))).await;
    let channel: Channel = tonic::transport::Endpoint::from_shared(format!("http://{}", gate.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = ActionGateServiceClient::new(channel.clone());
    let mut admin = GateAdminServiceClient::new(channel);
    let ports = agents_index_ports(&gate);
    let indexed = |agent: &str| {
        let mut score = redis::cmd("ZSCORE");
        score
            .arg(keys::AGENTS)
            .arg(format!("{:010}:{agent}", agent.len()));
        ports.iter().any(|port| {
            crate::support::topology::query::<Option<String>>(*port, &score)
                .ok()
                .flatten()
                .is_some()
        })
    };
    // Index entries are written after their grant, without holding it up: wait for one.
    let wait_indexed = |agent: &'static str| {
        let indexed = &indexed;
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !indexed(agent) {
                assert!(
                    Instant::now() < deadline,
                    "{agent} never reached the agents index"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let req = |agent: &str, n: u32| token_request(agent, "run", "pay", &format!(r#"{{"n":{n}}}"#));

    let (open_action, open_grant) =
        grant_as(&mut client, req("billing-fleet", 0), Some(WORKER_KEY)).await;
    wait_indexed("billing-fleet").await;
    // As if that write had been lost: the index forgets the agent.
    for port in &ports {
        let _ = crate::support::topology::query::<i64>(*port, redis::cmd("DEL").arg(keys::AGENTS));
    }
    let mut beside = Vec::new();
    for n in 1..=5 {
        beside.push(grant_as(&mut client, req("billing-fleet", n), Some(WORKER_KEY)).await);
    }
    // One writing task takes the queue in order: once a later agent is in, every write queued
    // before it has been made.
    grant_as(&mut client, req("billing-barrier", 0), Some(WORKER_KEY)).await;
    wait_indexed("billing-barrier").await;
    assert!(
        !indexed("billing-fleet"),
        "grants beside an unsettled action of the agent do not write the agents index"
    );

    // Every action of the agent settled: its lease index is gone, and a listing prunes it.
    for (action, grant) in beside.iter().chain([&(open_action, open_grant)]) {
        complete_as(&mut client, action, &grant.token, b"ok", Some(WORKER_KEY))
            .await
            .unwrap();
    }
    let request = pb::ListUnresolvedRequest {
        page_size: 1000,
        ..Default::default()
    };
    let mut token = String::new();
    loop {
        let page = admin
            .list_unresolved(authed(
                pb::ListUnresolvedRequest {
                    page_token: token,
                    ..request.clone()
                },
                Some(OPS_KEY),
            ))
            .await
            .unwrap()
            .into_inner();
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    assert!(
        !indexed("billing-fleet"),
        "the listing pruned the settled agent"
    );
    grant_as(&mut client, req("billing-fleet", 6), Some(WORKER_KEY)).await;
    wait_indexed("billing-fleet").await;
}
on_stores!(the_agents_index_is_written_when_an_agents_lease_index_opens: redis, cluster);
