//! Authorization rules through real gRPC: Cedar policies deny by agent and by a param bound
//! before anything is recorded; a broken policy file stops start-up (exit 64, Cedar's message)
//! and, on SIGHUP, leaves the previous policies in force; shadow mode grants what enforcement
//! would refuse and counts it apart.

use oncegate::pb;
use tempfile::TempDir;
use tonic::Code;

use crate::support::{
    Kind, LoggedGate, OPS_KEY, Scrape, TestGate, WORKER_KEY, authed, complete, config,
    expect_error, grant, on_stores, oncegate_command, principals_toml, state, token_request,
    write_file,
};

/// Everything allowed, except the agent `intern` and transfers above 1000.
pub const RULES: &str = r#"
@id("all") permit(principal, action, resource);
@id("no-intern") forbid(principal == Agent::"intern", action, resource);
@id("big-transfers") forbid(principal, action == Action::"payments.transfer", resource)
  when { context.params has amount && context.params.amount > 1000 };
"#;

/// A configuration file naming `rules` (written into `dir`), with `extra` TOML after it.
fn with_rules(dir: &TempDir, rules: &str, extra: &str) -> String {
    let path = write_file(dir.path(), "rules.cedar", rules);
    format!(
        "[authorization]\npolicies = [{:?}]\n{extra}",
        path.display().to_string()
    )
}

async fn rules_deny_by_agent_and_by_a_param_bound(kind: Kind) {
    let dir = TempDir::new().unwrap();
    let gate = TestGate::start_with(kind, config(&with_rules(&dir, RULES, ""))).await;
    let mut client = gate.client().await;
    let pay = |agent: &str, amount: u32| {
        token_request(
            agent,
            "run-1",
            "payments.transfer",
            &format!(r#"{{"amount":{amount},"currency":"EUR"}}"#),
        )
    };
    let denied = client.request_token(pay("intern", 10)).await.unwrap_err();
    let meta = expect_error(&denied, Code::PermissionDenied, "POLICY_DENIED");
    assert_eq!(meta["policy_id"], "no-intern");
    let denied = client
        .request_token(pay("billing", 5000))
        .await
        .unwrap_err();
    let meta = expect_error(&denied, Code::PermissionDenied, "POLICY_DENIED");
    assert_eq!(meta["policy_id"], "big-transfers");
    // Nothing was recorded for the denied request: its key is absent.
    let mut probe = pay("billing", 5000);
    probe.idempotency_key = "k-big".into();
    client.request_token(probe).await.unwrap_err();
    let action = pb::ActionRef {
        scope: Some(pb::Scope {
            agent_id: "billing".into(),
            run_id: "run-1".into(),
        }),
        key: "k-big".into(),
    };
    assert_eq!(
        state(&mut client, &action).await.state(),
        pb::ActionState::Absent
    );
    // Within the rules: granted.
    let (action, g) = grant(&mut client, pay("billing", 1000)).await;
    complete(&mut client, &action, &g.token, b"tx")
        .await
        .unwrap();
}
on_stores!(rules_deny_by_agent_and_by_a_param_bound: embedded, redis);

#[test]
fn a_broken_policy_file_stops_start_up_with_cedars_message() {
    let dir = TempDir::new().unwrap();
    let cfg = write_file(
        dir.path(),
        "oncegate.toml",
        &with_rules(
            &dir,
            "permit(principal, action, resource) when { x > };",
            "",
        ),
    );
    let out = oncegate_command()
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--config")
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("rules.cedar"), "{log}");
    assert!(log.contains("unexpected token"), "{log}");
}

#[tokio::test]
async fn sighup_reloads_the_policies_and_a_broken_file_keeps_the_old_ones() {
    let dir = TempDir::new().unwrap();
    let cfg = write_file(dir.path(), "oncegate.toml", &with_rules(&dir, RULES, ""));
    let gate = LoggedGate::start(
        &dir,
        &["--listen", "127.0.0.1:0", "--config", cfg.to_str().unwrap()],
    );
    let mut client = crate::support::connect(&gate.addr).await;
    let intern = || token_request("intern", "r", "email.send", r#"{"to":"a@b.c"}"#);
    let denied = client.request_token(intern()).await.unwrap_err();
    expect_error(&denied, Code::PermissionDenied, "POLICY_DENIED");

    // A broken file: the reload is refused, Cedar's reason is logged, the old rules stay.
    write_file(
        dir.path(),
        "rules.cedar",
        "forbid(principal, action, resource) when {",
    );
    gate.hangup();
    let log = gate.wait_for_log("not reloaded, keeping the previous ones", 1);
    assert!(log.contains("rules.cedar"), "{log}");
    let denied = client.request_token(intern()).await.unwrap_err();
    expect_error(&denied, Code::PermissionDenied, "POLICY_DENIED");
    grant(
        &mut client,
        token_request("billing", "r", "email.send", r#"{"to":"a@b.c"}"#),
    )
    .await;

    // A valid file replaces them, without a restart.
    write_file(
        dir.path(),
        "rules.cedar",
        "@id(\"only-email\") permit(principal, action == Action::\"email.send\", resource);",
    );
    gate.hangup();
    gate.wait_for_log("authorization policies reloaded", 1);
    grant(&mut client, intern()).await;
    let denied = client
        .request_token(token_request("billing", "r", "payments.transfer", "{}"))
        .await
        .unwrap_err();
    let meta = expect_error(&denied, Code::PermissionDenied, "POLICY_DENIED");
    assert_eq!(meta["policy_id"], "", "no permit applies");
}

async fn shadow_mode_grants_what_enforcement_refuses_and_counts_it(kind: Kind) {
    let dir = TempDir::new().unwrap();
    let text = with_rules(
        &dir,
        RULES,
        r#"mode = "shadow"

[[budgets]]
name = "eur-per-hour"
actions = ["payments.*"]
window_seconds = 3600
limit = 100
sum = "/amount"
group_by = "/currency"

[actions."payments.transfer"]
"#,
    );
    let (gate, metrics) = TestGate::start_with_config_and_metrics(kind, config(&text)).await;
    let mut client = gate.client().await;
    let pay = |agent: &str, amount: u32, key: &str| {
        let mut req = token_request(
            agent,
            "run-1",
            "payments.transfer",
            &format!(r#"{{"amount":{amount},"currency":"EUR"}}"#),
        );
        req.idempotency_key = key.into();
        req
    };
    // Denied by a rule, over the budget, and a duplicate of a completed action: all granted.
    let (_, denied) = grant(&mut client, pay("intern", 10, "a")).await;
    assert!(denied.token.starts_with("shadow-"), "{denied:?}");
    let (action, first) = grant(&mut client, pay("billing", 90, "b")).await;
    assert!(!first.token.starts_with("shadow-"), "a real grant");
    let (_, over) = grant(&mut client, pay("billing", 20, "c")).await;
    assert!(over.token.starts_with("shadow-"));
    complete(&mut client, &action, &first.token, b"tx-b")
        .await
        .unwrap();
    let (again_action, again) = grant(&mut client, pay("billing", 90, "b")).await;
    assert!(again.token.starts_with("shadow-"));
    // A shadow token completes without touching the record: the first completion stays.
    complete(&mut client, &again_action, &again.token, b"tx-b2")
        .await
        .unwrap();
    let view = state(&mut client, &action).await;
    assert_eq!(view.completion.unwrap().receipt, b"tx-b");

    let scrape = Scrape::fetch(metrics).await;
    let count = |decision: &str, mode: &str| {
        scrape.sum(
            "oncegate_attempts_total",
            &[
                ("action", "payments.transfer"),
                ("decision", decision),
                ("mode", mode),
            ],
        )
    };
    assert_eq!(count("policy_denied", "shadow"), 1.0);
    assert_eq!(count("budget_exceeded", "shadow"), 1.0);
    assert_eq!(count("replayed", "shadow"), 1.0);
    assert_eq!(count("granted", "shadow"), 1.0);
    assert_eq!(count("policy_denied", "enforce"), 0.0);
    assert_eq!(scrape.budget("eur-per-hour", "exceeded", "shadow"), 1.0);
    assert_eq!(
        scrape.sum(
            "oncegate_blocked_duplicates_total",
            &[("reason", "replayed"), ("mode", "shadow")],
        ),
        1.0
    );
}
on_stores!(shadow_mode_grants_what_enforcement_refuses_and_counts_it: embedded, redis);

/// The README's example configuration and policies, as written there, behave as it says.
#[tokio::test]
async fn the_readme_example_does_what_the_readme_says() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let section = &readme[readme.find("## Authorization").unwrap()..];
    let block = |lang: &str| {
        let start = section.find(&format!("```{lang}\n")).unwrap() + lang.len() + 4;
        section[start..start + section[start..].find("```").unwrap()].to_owned()
    };
    let dir = TempDir::new().unwrap();
    write_file(dir.path(), "rules.cedar", &block("cedar"));
    let path = write_file(dir.path(), "oncegate.toml", &block("toml"));
    let file = oncegate::config::ConfigFile::load(&path).unwrap();
    let gate = TestGate::start_with(Kind::Embedded, file).await;
    let mut client = gate.client().await;
    let pay = |agent: &str, amount: &str, key: &str| {
        let mut req = token_request(
            agent,
            "run-7",
            "payments.transfer",
            &format!(r#"{{"amount":{amount},"currency":"EUR"}}"#),
        );
        req.idempotency_key = key.into();
        req
    };
    let denied = client
        .request_token(pay("intern-bot", "10", "p0"))
        .await
        .unwrap_err();
    assert_eq!(
        expect_error(&denied, Code::PermissionDenied, "POLICY_DENIED")["policy_id"],
        "interns-do-not-pay"
    );
    let denied = client
        .request_token(pay("billing-agent", "10001", "p1"))
        .await
        .unwrap_err();
    assert_eq!(
        expect_error(&denied, Code::PermissionDenied, "POLICY_DENIED")["policy_id"],
        "transfer-ceiling"
    );
    grant(&mut client, pay("billing-agent", "3000", "p2")).await;
    grant(&mut client, pay("billing-agent", "2000", "p3")).await;
    let over = client
        .request_token(pay("billing-agent", "1", "p4"))
        .await
        .unwrap_err();
    assert_eq!(
        expect_error(&over, Code::ResourceExhausted, "BUDGET_EXCEEDED")["budget"],
        "payments-per-day"
    );
    let held = client
        .request_token(token_request(
            "cleanup-bot",
            "run-7",
            "files.delete",
            r#"{"path":"/a"}"#,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(held.decision(), pb::Decision::PendingApproval);
    assert_eq!(held.approval.unwrap().reason, "deletes need a human");
    for n in 0..50 {
        grant(
            &mut client,
            token_request("mailer", "r", "email.send", &format!(r#"{{"n":{n}}}"#)),
        )
        .await;
    }
    let capped = client
        .request_token(token_request("mailer", "r", "email.send", r#"{"n":50}"#))
        .await
        .unwrap_err();
    assert_eq!(
        expect_error(&capped, Code::ResourceExhausted, "BUDGET_EXCEEDED")["budget"],
        "emails-per-hour"
    );
}

/// Rules for [`an_actions_own_shadow_mode_leaves_the_other_actions_enforced`]: one agent denied
/// everywhere, deletes and purges held for an operator.
const PER_ACTION_RULES: &str = r#"
@id("all") permit(principal, action, resource);
@id("no-interns") forbid(principal == Agent::"billing-intern", action, resource);
@id("deletes") @hold("deletes need a human")
permit(principal, action == Action::"files.delete", resource);
@id("purges") @hold("purges need a human")
permit(principal, action == Action::"files.purge", resource);
"#;

/// `shadow = true` on one action shadows that action alone: its rule denial, its budget refusal
/// and its hold are granted anyway (a hold leaves no approval behind) and counted as shadow, while
/// a sibling action under the same rules and the same budget is refused, held and counted as
/// enforced.
async fn an_actions_own_shadow_mode_leaves_the_other_actions_enforced(kind: Kind) {
    let dir = TempDir::new().unwrap();
    let text = with_rules(
        &dir,
        PER_ACTION_RULES,
        &format!(
            r#"
[[budgets]]
name = "eur-per-hour"
actions = ["payments.*"]
window_seconds = 3600
limit = 100
sum = "/amount"
group_by = "/currency"

[actions."payments.transfer"]
shadow = true

[actions."payments.refund"]

[actions."files.delete"]
shadow = true

[actions."files.purge"]
{}"#,
            principals_toml("")
        ),
    );
    let (gate, metrics) = TestGate::start_with_config_and_metrics(kind, config(&text)).await;
    let mut client = gate.client().await;
    let mut admin = gate.admin().await;
    let mut ask = async |req: pb::RequestTokenRequest| {
        client
            .request_token(authed(req, Some(WORKER_KEY)))
            .await
            .map(|r| r.into_inner())
    };
    let money = |agent: &str, action: &str, amount: u32, key: &str| {
        let mut req = token_request(
            agent,
            "run-1",
            action,
            &format!(r#"{{"amount":{amount},"currency":"EUR"}}"#),
        );
        req.idempotency_key = key.into();
        req
    };
    let granted = |resp: &pb::RequestTokenResponse| {
        assert_eq!(resp.decision(), pb::Decision::Granted, "{resp:?}");
        resp.grant.clone().unwrap().token
    };

    // A rule denial: granted for the shadowed action, refused for the enforced one.
    let token = granted(
        &ask(money("billing-intern", "payments.transfer", 10, "t0"))
            .await
            .unwrap(),
    );
    assert!(token.starts_with("shadow-"), "{token}");
    let denied = ask(money("billing-intern", "payments.refund", 10, "r0"))
        .await
        .unwrap_err();
    let meta = expect_error(&denied, Code::PermissionDenied, "POLICY_DENIED");
    assert_eq!(meta["policy_id"], "no-interns");

    // A budget refusal: the shadowed action's real grant fills the budget the two share; the
    // next transfer is granted in shadow, the next refund refused.
    let token = granted(
        &ask(money("billing-a", "payments.transfer", 100, "t1"))
            .await
            .unwrap(),
    );
    assert!(!token.starts_with("shadow-"), "a real grant: {token}");
    let token = granted(
        &ask(money("billing-a", "payments.transfer", 1, "t2"))
            .await
            .unwrap(),
    );
    assert!(token.starts_with("shadow-"), "{token}");
    let over = ask(money("billing-a", "payments.refund", 1, "r1"))
        .await
        .unwrap_err();
    assert_eq!(
        expect_error(&over, Code::ResourceExhausted, "BUDGET_EXCEEDED")["budget"],
        "eur-per-hour"
    );

    // A hold: the shadowed delete is granted, records nothing and leaves no approval; the
    // enforced purge waits on one (asked twice, the same one).
    let file = |action: &str, key: &str| {
        let mut req = token_request("billing-files", "run-1", action, r#"{"path":"/a"}"#);
        req.idempotency_key = key.into();
        req
    };
    let token = granted(&ask(file("files.delete", "d1")).await.unwrap());
    assert!(token.starts_with("shadow-"), "{token}");
    let approvals = |agent: &str| pb::ListApprovalsRequest {
        agent_id: agent.into(),
        ..Default::default()
    };
    let listed = admin
        .list_approvals(authed(approvals("billing-files"), Some(OPS_KEY)))
        .await
        .unwrap()
        .into_inner()
        .approvals;
    assert!(listed.is_empty(), "a shadow hold asks nobody: {listed:?}");
    let delete = pb::ActionRef {
        scope: Some(pb::Scope {
            agent_id: "billing-files".into(),
            run_id: "run-1".into(),
        }),
        key: "d1".into(),
    };
    let view = client
        .get_action(authed(
            pb::GetActionRequest {
                action: Some(delete),
            },
            Some(WORKER_KEY),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(view.state(), pb::ActionState::Absent);
    let mut ask = async |req: pb::RequestTokenRequest| {
        client
            .request_token(authed(req, Some(WORKER_KEY)))
            .await
            .unwrap()
            .into_inner()
    };
    let held = ask(file("files.purge", "p1")).await;
    assert_eq!(held.decision(), pb::Decision::PendingApproval, "{held:?}");
    let again = ask(file("files.purge", "p1")).await;
    assert_eq!(again.approval, held.approval);
    let listed = admin
        .list_approvals(authed(approvals("billing-files"), Some(OPS_KEY)))
        .await
        .unwrap()
        .into_inner()
        .approvals;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].action_name, "files.purge");
    assert_eq!(listed[0].approval, held.approval);

    let scrape = Scrape::fetch(metrics).await;
    let attempts = |action: &str, decision: &str, mode: &str| {
        scrape.sum(
            "oncegate_attempts_total",
            &[("action", action), ("decision", decision), ("mode", mode)],
        )
    };
    let all = |action: &str, mode: &str| {
        scrape.sum(
            "oncegate_attempts_total",
            &[("action", action), ("mode", mode)],
        )
    };
    assert_eq!(
        attempts("payments.transfer", "policy_denied", "shadow"),
        1.0
    );
    assert_eq!(
        attempts("payments.transfer", "budget_exceeded", "shadow"),
        1.0
    );
    assert_eq!(attempts("payments.transfer", "granted", "shadow"), 1.0);
    assert_eq!(all("payments.transfer", "enforce"), 0.0);
    assert_eq!(attempts("payments.refund", "policy_denied", "enforce"), 1.0);
    assert_eq!(
        attempts("payments.refund", "budget_exceeded", "enforce"),
        1.0
    );
    assert_eq!(all("payments.refund", "shadow"), 0.0);
    assert_eq!(attempts("files.delete", "pending_approval", "shadow"), 1.0);
    assert_eq!(all("files.delete", "enforce"), 0.0);
    assert_eq!(attempts("files.purge", "pending_approval", "enforce"), 2.0);
    assert_eq!(all("files.purge", "shadow"), 0.0);
    let budget = |decision: &str, mode: &str| scrape.budget("eur-per-hour", decision, mode);
    assert_eq!(budget("reserved", "shadow"), 1.0);
    assert_eq!(budget("exceeded", "shadow"), 1.0);
    assert_eq!(budget("exceeded", "enforce"), 1.0);
    assert_eq!(budget("reserved", "enforce"), 0.0);
}
on_stores!(an_actions_own_shadow_mode_leaves_the_other_actions_enforced: embedded, redis);
