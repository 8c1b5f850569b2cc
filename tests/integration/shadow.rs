//! Shadow mode through real gRPC: globally or for one action, every decision is computed and
//! counted as enforcement would make it (`mode="shadow"`), and granted anyway with a token
//! recorded nowhere; the other actions stay enforced.

use oncegate_proto as pb;
use tempfile::TempDir;
use tonic::Code;

use crate::support::{
    BASIC_RULES, Kind, OPS_KEY, Scrape, TestGate, WORKER_KEY, authed, complete, config,
    expect_error, grant, on_stores, principals_toml, state, token_request, with_rules,
};

async fn shadow_mode_grants_what_enforcement_refuses_and_counts_it(kind: Kind) {
    let dir = TempDir::new().unwrap();
    let text = with_rules(
        dir.path(),
        BASIC_RULES,
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
        dir.path(),
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
