//! Approvals through real gRPC: a rule holds an action (DECISION_PENDING_APPROVAL and an
//! approval id); an operator approves or denies it (GateAdminService.DecideApproval); an approval
//! covers the next identical request once, never a changed one; pending approvals are listed and
//! lapse.

use oncegate_proto::{self as pb, gate_admin_service_client::GateAdminServiceClient};
use tempfile::TempDir;
use tonic::{Code, transport::Channel};

use crate::support::{
    Kind, OPS_KEY, TestGate, WORKER_KEY, authed, config, expect_error, on_stores, principals_toml,
    write_file,
};

const RULES: &str = r#"
@id("all") permit(principal, action, resource);
@id("deletes") @hold("deletes need approval")
permit(principal, action == Action::"files.delete", resource);
@id("large-payments") @hold("payments above 500 need approval")
permit(principal, action == Action::"payments.transfer", resource)
  when { context.params.amount > 500 };
"#;

fn setup(dir: &TempDir) -> String {
    let rules = write_file(dir.path(), "rules.cedar", RULES);
    format!(
        "[authorization]\npolicies = [{:?}]\napproval_ttl_seconds = 2\n{}",
        rules.display().to_string(),
        principals_toml("")
    )
}

fn delete(path: &str) -> pb::RequestTokenRequest {
    let mut req = crate::support::token_request(
        "billing-files",
        "run-1",
        "files.delete",
        &format!(r#"{{"path":"{path}"}}"#),
    );
    req.idempotency_key = "delete-1".into();
    req
}

fn payment(amount: u32) -> pb::RequestTokenRequest {
    crate::support::token_request(
        "billing-files",
        "run-1",
        "payments.transfer",
        &format!(r#"{{"amount":{amount}}}"#),
    )
}

async fn ask(
    client: &mut pb::action_gate_service_client::ActionGateServiceClient<Channel>,
    req: pb::RequestTokenRequest,
) -> Result<pb::RequestTokenResponse, tonic::Status> {
    client
        .request_token(authed(req, Some(WORKER_KEY)))
        .await
        .map(|r| r.into_inner())
}

/// The approval of a held answer.
fn held(resp: &pb::RequestTokenResponse) -> pb::Approval {
    assert_eq!(resp.decision(), pb::Decision::PendingApproval, "{resp:?}");
    assert!(resp.grant.is_none());
    resp.approval.clone().unwrap()
}

async fn decide(
    admin: &mut GateAdminServiceClient<Channel>,
    action: &pb::ActionRef,
    id: &str,
    approve: bool,
    key: &str,
) -> Result<pb::ApprovalEntry, tonic::Status> {
    admin
        .decide_approval(authed(
            pb::DecideApprovalRequest {
                action: Some(action.clone()),
                approval_id: id.into(),
                approve,
                note: "ticket-9".into(),
            },
            Some(key),
        ))
        .await
        .map(|r| r.into_inner().approval.unwrap())
}

async fn listed(admin: &mut GateAdminServiceClient<Channel>) -> Vec<pb::ApprovalEntry> {
    admin
        .list_approvals(authed(
            pb::ListApprovalsRequest {
                agent_id: "billing-files".into(),
                ..Default::default()
            },
            Some(OPS_KEY),
        ))
        .await
        .unwrap()
        .into_inner()
        .approvals
}

async fn hold_approve_grant_once(kind: Kind) {
    let dir = TempDir::new().unwrap();
    let gate = TestGate::start_with_test_clock(kind, config(&setup(&dir))).await;
    let mut client = gate.client().await;
    let mut admin = gate.admin().await;

    let first = ask(&mut client, delete("/a")).await.unwrap();
    let approval = held(&first);
    assert_eq!(approval.policy_id, "deletes");
    assert_eq!(approval.reason, "deletes need approval");
    let action = first.action.clone().unwrap();
    // Asking again waits on the same approval.
    assert_eq!(
        held(&ask(&mut client, delete("/a")).await.unwrap()).id,
        approval.id
    );
    let pending = listed(&mut admin).await;
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].state(), pb::ApprovalState::Pending);
    assert_eq!(pending[0].action_name, "files.delete");
    // Agents cannot decide.
    let forbidden = decide(&mut admin, &action, &approval.id, true, WORKER_KEY)
        .await
        .unwrap_err();
    expect_error(&forbidden, Code::PermissionDenied, "FORBIDDEN_SCOPE");
    let approved = decide(&mut admin, &action, &approval.id, true, OPS_KEY)
        .await
        .unwrap();
    assert_eq!(approved.state(), pb::ApprovalState::Approved);
    assert_eq!(approved.operator, "ops");

    // A changed request under the same key is not covered.
    let changed = ask(&mut client, delete("/b")).await.unwrap_err();
    let meta = expect_error(&changed, Code::FailedPrecondition, "IDEMPOTENCY_KEY_REUSED");
    assert_eq!(meta["differing_fields"], "/path");
    // The identical request is granted, once.
    let granted = ask(&mut client, delete("/a")).await.unwrap();
    assert_eq!(granted.decision(), pb::Decision::Granted);
    let token = granted.grant.unwrap().token;
    let again = decide(&mut admin, &action, &approval.id, true, OPS_KEY)
        .await
        .unwrap_err();
    let meta = expect_error(&again, Code::FailedPrecondition, "APPROVAL_NOT_PENDING");
    assert_eq!(meta["state"], "USED");
    // Given back, the action needs a new approval: the used one covers nothing more.
    client
        .release(authed(
            pb::ReleaseRequest {
                action: Some(action.clone()),
                token,
                reason: pb::ReleaseReason::NotAttempted as i32,
            },
            Some(WORKER_KEY),
        ))
        .await
        .unwrap();
    let second = held(&ask(&mut client, delete("/a")).await.unwrap());
    assert_ne!(second.id, approval.id);
    // Denied: refused with the approval's id until it lapses.
    let denied = decide(&mut admin, &action, &second.id, false, OPS_KEY)
        .await
        .unwrap();
    assert_eq!(denied.state(), pb::ApprovalState::Denied);
    let refused = ask(&mut client, delete("/a")).await.unwrap_err();
    let meta = expect_error(&refused, Code::PermissionDenied, "POLICY_DENIED");
    assert_eq!(meta["approval_id"], second.id);

    // A payment of 900 approved does not cover one of 901 (another fingerprint, another action).
    let big = ask(&mut client, payment(900)).await.unwrap();
    let big_approval = held(&big);
    decide(
        &mut admin,
        big.action.as_ref().unwrap(),
        &big_approval.id,
        true,
        OPS_KEY,
    )
    .await
    .unwrap();
    let other = held(&ask(&mut client, payment(901)).await.unwrap());
    assert_ne!(other.id, big_approval.id);
    let paid = ask(&mut client, payment(900)).await.unwrap();
    assert_eq!(paid.decision(), pb::Decision::Granted);
    // Below the bound, no hold at all.
    let small = ask(&mut client, payment(10)).await.unwrap();
    assert_eq!(small.decision(), pb::Decision::Granted);

    // Pending approvals lapse: listed until then, asked anew after.
    assert!(
        listed(&mut admin)
            .await
            .iter()
            .any(|e| e.approval.as_ref().unwrap().id == other.id)
    );
    gate.time.pass_beyond(other.expires_at.unwrap()).await;
    assert!(
        !listed(&mut admin)
            .await
            .iter()
            .any(|e| e.approval.as_ref().unwrap().id == other.id)
    );
    let renewed = held(&ask(&mut client, payment(901)).await.unwrap());
    assert_ne!(renewed.id, other.id);
}
on_stores!(hold_approve_grant_once: embedded, redis, postgres);

/// The Rust guard: a held action is neither run nor an error of the gate's, but its own outcome
/// carrying the approval id; `oncegate admin approve` (the operator's command line) lets the same
/// call through once; `list-approvals` shows it on the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_surfaces_a_pending_approval_and_the_cli_approves_it() {
    use oncegate_client::{ActionSpec, Failure, GateClient, GuardError, GuardOptions, Outcome};

    let dir = TempDir::new().unwrap();
    let gate = TestGate::start_with(Kind::Embedded, config(&setup(&dir))).await;
    let client = GateClient::connect(format!("http://{}", gate.addr))
        .await
        .unwrap()
        .with_api_key(WORKER_KEY)
        .unwrap();
    let spec = ActionSpec::new(
        "billing-files",
        "run-9",
        "files.delete",
        r#"{"path":"/tmp/x"}"#,
    )
    .idempotency_key("delete-9");
    let ran = std::sync::atomic::AtomicUsize::new(0);
    let work = |_grant| {
        ran.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async { Ok::<_, Failure<String>>(b"deleted".to_vec()) }
    };
    let held = client
        .run_once(&spec, &GuardOptions::default(), work)
        .await
        .unwrap_err();
    let GuardError::PendingApproval { approval } = held else {
        panic!("expected a pending approval, got {held:?}")
    };
    assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 0);

    let admin = |args: &[&str]| {
        let out = crate::support::oncegate_command()
            .args([
                "admin",
                "--server",
                &format!("http://{}", gate.addr),
                "--api-key",
                OPS_KEY,
                "--json",
            ])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let listed = admin(&["list-approvals", "--agent", "billing-files"]);
    assert_eq!(listed["approvals"][0]["id"], approval.id.as_str());
    assert_eq!(listed["approvals"][0]["state"], "PENDING");
    let approved = admin(&[
        "approve",
        "--agent",
        "billing-files",
        "--run",
        "run-9",
        "--key",
        "delete-9",
        "--id",
        &approval.id,
        "--note",
        "ticket-12",
    ]);
    assert_eq!(approved["state"], "APPROVED");
    let outcome = client
        .run_once(&spec, &GuardOptions::default(), work)
        .await
        .unwrap();
    assert!(matches!(outcome, Outcome::Executed { .. }), "{outcome:?}");
    assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// `oncegate admin deny` refuses a held action (the Rust client sees `PolicyDenied` with the
/// approval's id) and `oncegate admin budgets` shows what is used of what limit, as text and as
/// JSON; the denied action charged nothing. The client decodes a rule's denial and a budget's
/// refusal too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_denies_a_held_action_and_shows_the_budgets() {
    use oncegate_client::{ActionSpec, ClientError, GateClient, TokenReply};

    let dir = TempDir::new().unwrap();
    let rules = write_file(
        dir.path(),
        "rules.cedar",
        &format!(
            "{RULES}\n@id(\"no-interns\") forbid(principal == Agent::\"billing-intern\", action, \
             resource);\n"
        ),
    );
    let text = format!(
        r#"[authorization]
policies = [{:?}]
approval_ttl_seconds = 3600

[[budgets]]
name = "eur-per-day"
actions = ["payments.*"]
window_seconds = 86400
limit = 1000
sum = "/amount"
{}"#,
        rules.display().to_string(),
        principals_toml("")
    );
    let gate = TestGate::start_with(Kind::Embedded, config(&text)).await;
    let mut client = GateClient::connect(format!("http://{}", gate.addr))
        .await
        .unwrap()
        .with_api_key(WORKER_KEY)
        .unwrap();
    let pay = |amount: u32, key: &str| {
        ActionSpec::new(
            "billing-cli",
            "run-3",
            "payments.transfer",
            &format!(r#"{{"amount":{amount}}}"#),
        )
        .idempotency_key(key)
    };
    let server = format!("http://{}", gate.addr);
    let cli = |json: bool, args: &[&str]| {
        let out = crate::support::oncegate_command()
            .args(["admin", "--server", &server, "--api-key", OPS_KEY])
            .args(json.then_some("--json"))
            .args(args)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    };

    let reply = client.request_token(&pay(300, "pay-300")).await.unwrap();
    assert!(matches!(reply, TokenReply::Granted(_)), "{reply:?}");
    let TokenReply::PendingApproval(approval) =
        client.request_token(&pay(900, "pay-900")).await.unwrap()
    else {
        panic!("900 is held")
    };
    assert_eq!(approval.policy_id, "large-payments");
    let denied = cli(
        true,
        &[
            "deny",
            "--agent",
            "billing-cli",
            "--run",
            "run-3",
            "--key",
            "pay-900",
            "--id",
            &approval.id,
            "--note",
            "ticket-13",
        ],
    );
    let denied: serde_json::Value = serde_json::from_str(&denied).unwrap();
    assert_eq!(denied["state"], "DENIED");
    assert_eq!(denied["id"], approval.id.as_str());
    assert_eq!(denied["operator"], "ops");
    assert_eq!(denied["note"], "ticket-13");
    let refused = client
        .request_token(&pay(900, "pay-900"))
        .await
        .unwrap_err();
    let ClientError::PolicyDenied {
        approval_id,
        policy_id,
    } = &refused
    else {
        panic!("expected PolicyDenied, got {refused:?}")
    };
    assert_eq!(approval_id, &approval.id);
    assert_eq!(policy_id, "");
    assert!(!refused.is_retryable());

    // Only the granted 300 is used: the held, then denied, 900 charged nothing.
    let budgets = ["budgets", "--agent", "billing-cli"];
    let shown = cli(false, &budgets);
    assert!(
        shown.starts_with("eur-per-day ") && shown.contains("used 300.00 of 1000.00 per 86400 s"),
        "{shown}"
    );
    let shown: serde_json::Value = serde_json::from_str(&cli(true, &budgets)).unwrap();
    let list = shown["budgets"].as_array().unwrap();
    assert_eq!(list.len(), 1, "{shown}");
    assert_eq!(list[0]["budget"], "eur-per-day");
    assert_eq!(list[0]["used"], "300.00");
    assert_eq!(list[0]["limit"], "1000.00");
    assert_eq!(list[0]["window_seconds"], 86400);

    // 300 + 500 fit, 201 more does not: the client's BudgetExceeded names the budget and when
    // it frees up (a day, and at most one slot of the window's sixty).
    client.request_token(&pay(500, "pay-500")).await.unwrap();
    let over = client
        .request_token(&pay(201, "pay-201"))
        .await
        .unwrap_err();
    let ClientError::BudgetExceeded(refused) = &over else {
        panic!("expected BudgetExceeded, got {over:?}")
    };
    assert_eq!(refused.budget, "eur-per-day");
    let retry_after = refused.retry_after.expect("when the window frees up");
    assert!(
        retry_after > std::time::Duration::from_secs(86_000)
            && retry_after <= std::time::Duration::from_secs(86_400 + 1_440),
        "{retry_after:?}"
    );
    assert!(!over.is_retryable());
    let shown = cli(false, &budgets);
    assert!(shown.contains("used 800.00 of 1000.00"), "{shown}");

    // A rule's denial: the deciding policy, no approval.
    let intern = ActionSpec::new(
        "billing-intern",
        "run-3",
        "payments.transfer",
        r#"{"amount":1}"#,
    );
    let refused = client.request_token(&intern).await.unwrap_err();
    let ClientError::PolicyDenied {
        approval_id,
        policy_id,
    } = &refused
    else {
        panic!("expected PolicyDenied, got {refused:?}")
    };
    assert_eq!(policy_id, "no-interns");
    assert_eq!(approval_id, "");
}

/// A denied approval is one decision with one name: `approval_denied` in
/// `oncegate_attempts_total`, apart from a rule's `policy_denied` (the same POLICY_DENIED on the
/// wire).
#[tokio::test]
async fn a_denied_approval_is_counted_as_approval_denied() {
    let dir = TempDir::new().unwrap();
    let (gate, metrics) =
        TestGate::start_with_config_and_metrics(Kind::Embedded, config(&setup(&dir))).await;
    let mut client = gate.client().await;
    let mut admin = gate.admin().await;
    let first = ask(&mut client, delete("/a")).await.unwrap();
    let approval = held(&first);
    decide(
        &mut admin,
        first.action.as_ref().unwrap(),
        &approval.id,
        false,
        OPS_KEY,
    )
    .await
    .unwrap();
    let refused = ask(&mut client, delete("/a")).await.unwrap_err();
    expect_error(&refused, Code::PermissionDenied, "POLICY_DENIED");
    let scrape = crate::support::Scrape::fetch(metrics).await;
    let count = |decision: &str| {
        scrape.sum(
            "oncegate_attempts_total",
            &[("decision", decision), ("mode", "enforce")],
        )
    };
    assert_eq!(count("pending_approval"), 1.0);
    assert_eq!(count("approval_denied"), 1.0);
    assert_eq!(count("policy_denied"), 0.0);
}
