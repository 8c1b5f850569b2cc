//! The operator console in a real headless Chromium (chromedriver over WebDriver) against a real
//! gate: an approval granted from the page lets the next identical RequestToken through once; an
//! unresolved action settled from the page as completed replays its JSON receipt to the agent; a
//! request without a session, or a POST without or with a wrong CSRF token or from another
//! origin, changes nothing; an approver decides approvals and cannot settle; params are shown as
//! text, never as markup. Screenshots of the approvals and unresolved pages go to
//! `target/tmp/console/` (the ones in docs/images come from there).

use std::path::PathBuf;

use oncegate_grpc::auth::hash_key;
use oncegate_proto::{self as pb, gate_admin_service_client::GateAdminServiceClient};
use tempfile::TempDir;
use tonic::{Code, transport::Channel};

use crate::support::{
    Browser, Kind, LoggedGate, OPS_KEY, TestGate, WORKER_KEY, authed, browser::http_client, config,
    expect_error, free_port, grant_as, on_stores, oncegate_command, principals_toml, serve_to_exit,
    token_request, ttl_ms, write_file,
};

/// The approver principal's API key.
const APPROVER_KEY: &str = "finance-lead-key-1";

const RULES: &str = r#"
@id("all") permit(principal, action, resource);
@id("deletes") @hold("deletes need a person's approval")
permit(principal, action == Action::"files.delete", resource);
"#;

/// Rules that hold deletes, the worker and operator of the support, and an approver for
/// `billing-*`.
fn setup(dir: &TempDir) -> oncegate_config::ConfigFile {
    let rules = write_file(dir.path(), "rules.cedar", RULES);
    config(&format!(
        "[authorization]\npolicies = [{:?}]\napproval_ttl_seconds = 600\n{}\n\
         [[principals]]\nname = \"finance-lead\"\nrole = \"approver\"\nagents = [\"billing-*\"]\n\
         api_key_sha256 = \"{}\"\n",
        rules.display().to_string(),
        principals_toml(""),
        hash_key(APPROVER_KEY)
    ))
}

/// A delete of `path` under one idempotency key.
fn delete(path: &str) -> pb::RequestTokenRequest {
    let params = serde_json::json!({ "path": path }).to_string();
    let mut req = token_request("billing-files", "run-7", "files.delete", &params);
    req.idempotency_key = "delete-1".into();
    req
}

async fn ask(
    gate: &TestGate,
    req: pb::RequestTokenRequest,
) -> Result<pb::RequestTokenResponse, tonic::Status> {
    let mut client = gate.client().await;
    client
        .request_token(authed(req, Some(WORKER_KEY)))
        .await
        .map(|r| r.into_inner())
}

async fn approvals(admin: &mut GateAdminServiceClient<Channel>) -> Vec<pb::ApprovalEntry> {
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

/// Logs in through the form with `credential`.
async fn log_in(browser: &Browser, url: &str, credential: &str) {
    browser.goto(&format!("{url}/approvals")).await;
    assert!(
        browser.url().await.ends_with("/login"),
        "no session: the login form"
    );
    browser.type_into("#credential", credential).await;
    browser.click("button[type=submit]").await;
    let at = browser.url().await;
    assert!(
        at.ends_with("/approvals"),
        "{at}: {}",
        browser.text("main").await
    );
}

fn screenshots() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console")
}

/// (a) A held delete, approved from the page by an operator who logged in with a one-time code:
/// the next identical RequestToken is granted, once. The params (with markup in them) are shown
/// as text.
async fn approve_from_the_page_grants_once(kind: Kind) {
    let dir = TempDir::new().unwrap();
    let (gate, url) = TestGate::start_with_console(kind, setup(&dir)).await;
    let sneaky = "/tmp/<script>document.title='pwned'</script><img src=x onerror=alert(1)>";
    let held = ask(&gate, delete(sneaky)).await.unwrap();
    assert_eq!(held.decision(), pb::Decision::PendingApproval, "{held:?}");

    // Day one: the operator asks the gate for a code (here with its key; `oncegate admin
    // console-login` on the admin socket does the same) and types it into the form.
    let mut admin = gate.admin().await;
    let code = admin
        .create_console_login(authed(pb::CreateConsoleLoginRequest {}, Some(OPS_KEY)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code.principal, "ops");
    let browser = Browser::start().await;
    log_in(&browser, &url, &code.code).await;

    let card = "section.approval[data-key='delete-1']";
    assert!(
        browser
            .text(&format!("{card} .state"))
            .await
            .contains("PENDING")
    );
    assert_eq!(
        browser.text(&format!("{card} .reason")).await,
        "deletes need a person's approval"
    );
    let params = browser.text(&format!("{card} pre.params")).await;
    assert!(
        params.contains(sneaky),
        "params shown as sent, as text: {params}"
    );
    assert!(
        browser
            .all("pre.params script, pre.params img")
            .await
            .is_empty()
    );
    assert_eq!(
        browser.run("return document.title").await,
        "Approvals · oncegate console"
    );
    // What each button will do is said before the click.
    let consequences = browser.text(&format!("{card} .consequences")).await;
    assert!(
        consequences.contains("Approve: the held call runs once, when the agent asks again")
            && consequences
                .contains("Deny: identical requests are refused until the approval lapses"),
        "{consequences}"
    );
    browser
        .screenshot(&screenshots().join("console-approvals.png"))
        .await;

    browser
        .type_into(
            &format!("{card} textarea[name=note]"),
            "checked with the file owner",
        )
        .await;
    browser.click(&format!("{card} button.approve")).await;
    assert!(
        browser
            .text(".flash")
            .await
            .starts_with("APPROVED files.delete")
    );
    let entry = approvals(&mut admin).await.remove(0);
    assert_eq!(entry.state(), pb::ApprovalState::Approved);
    assert_eq!(
        (entry.operator.as_str(), entry.note.as_str()),
        ("ops", "checked with the file owner")
    );

    // The next identical request is granted; once released, the next one is held again.
    let granted = ask(&gate, delete(sneaky)).await.unwrap();
    assert_eq!(granted.decision(), pb::Decision::Granted, "{granted:?}");
    let mut client = gate.client().await;
    client
        .release(authed(
            pb::ReleaseRequest {
                action: granted.action.clone(),
                token: granted.grant.unwrap().token,
                reason: pb::ReleaseReason::NotAttempted as i32,
            },
            Some(WORKER_KEY),
        ))
        .await
        .unwrap();
    let again = ask(&gate, delete(sneaky)).await.unwrap();
    assert_eq!(
        again.decision(),
        pb::Decision::PendingApproval,
        "used once: {again:?}"
    );

    // Recent decisions, searched by agent and key: the hold, the grant, the second hold.
    browser
        .goto(&format!("{url}/decisions?agent=billing-files&key=delete-1"))
        .await;
    let mut decisions = Vec::new();
    for cell in browser.all("#decisions td.decision").await {
        decisions.push(browser.text_of(&cell).await);
    }
    assert_eq!(
        decisions,
        ["pending_approval", "granted", "pending_approval"]
    );
    browser
        .goto(&format!("{url}/decisions?key=no-such-key"))
        .await;
    assert!(browser.all("#decisions td.decision").await.is_empty());
    assert!(browser.text("#scope").await.contains("last 1000"));
    // The DAR page reads the counters: three attempts, none a blocked duplicate.
    browser.goto(&format!("{url}/dar")).await;
    assert_eq!(browser.text("#dar tbody tr").await, "other 3 0 0.0%");

    // The code worked once.
    let second = Browser::start().await;
    second.goto(&format!("{url}/login")).await;
    second.type_into("#credential", &code.code).await;
    second.click("button[type=submit]").await;
    assert!(
        second
            .text("#refused")
            .await
            .contains("each code works once")
    );
}
on_stores!(approve_from_the_page_grants_once: embedded, redis);

/// (b) A lease that ended with no outcome, settled from the page as completed with a JSON
/// receipt: the agent's next RequestToken replays that receipt.
async fn settled_on_the_page_replays_its_receipt(kind: Kind) {
    let dir = TempDir::new().unwrap();
    let (gate, url) = TestGate::start_with_console(kind, setup(&dir)).await;
    let mut client = gate.client().await;
    let mut req = token_request(
        "billing-pay",
        "run-3",
        "payments.transfer",
        r#"{"amount":12}"#,
    );
    req.idempotency_key = "pay-12".into();
    req.lease_ttl = ttl_ms(1000);
    let (action, g) = grant_as(&mut client, req.clone(), Some(WORKER_KEY)).await;
    gate.time.pass_beyond(g.lease_expires_at.unwrap()).await;
    let status = ask(&gate, req.clone()).await.unwrap_err();
    expect_error(
        &status,
        Code::FailedPrecondition,
        "LEASE_EXPIRED_UNRESOLVED",
    );

    let browser = Browser::start().await;
    log_in(&browser, &url, OPS_KEY).await;
    browser.goto(&format!("{url}/unresolved")).await;
    let card = "section.unresolved[data-key='pay-12']";
    let provider_key = browser.text(&format!("{card} .provider-key")).await;
    assert_eq!(provider_key, action_provider_key(&action));
    // What to ask the provider about: the action type and the params as sent.
    assert_eq!(
        browser.text(&format!("{card} .action-name")).await,
        "payments.transfer"
    );
    assert_eq!(
        browser.text(&format!("{card} pre.params")).await,
        r#"{"amount":12}"#
    );

    let receipt = r#"{"transfer":"tr_42","status":"succeeded"}"#;
    browser
        .type_into(&format!("{card} textarea[name=receipt]"), receipt)
        .await;
    browser
        .type_into(
            &format!("{card} form textarea[name=note]"),
            "found tr_42 at the bank",
        )
        .await;
    browser.click(&format!("{card} button.approve")).await;
    assert!(
        browser
            .text(".flash")
            .await
            .starts_with("Settled as completed")
    );

    let replay = ask(&gate, req).await.unwrap();
    assert_eq!(
        replay.decision(),
        pb::Decision::AlreadyCompleted,
        "{replay:?}"
    );
    let done = replay.completion.unwrap();
    assert_eq!(done.receipt, receipt.as_bytes());
    assert_eq!(done.receipt_format(), pb::ReceiptFormat::Json);
    assert_eq!(done.note, "found tr_42 at the bank");
}
on_stores!(settled_on_the_page_replays_its_receipt: embedded);

/// (b') A bank's plain transaction id, settled from the page: the card says what was asked for
/// (the type and the params exactly as sent); the id forced as JSON is refused in an error
/// (role=alert, red), not a success-styled note, and the form keeps what was typed; the format
/// left to its default is guessed as `oncegate admin` guesses it, so `tx_777` settles as text.
async fn a_plain_receipt_id_settles_as_text_and_a_refusal_keeps_what_was_typed(kind: Kind) {
    let dir = TempDir::new().unwrap();
    let (gate, url) = TestGate::start_with_console(kind, setup(&dir)).await;
    let mut client = gate.client().await;
    // As an agent wrote them: spaces, and 250.00 rather than 250.
    let params = r#"{"amount": 250.00, "currency": "EUR", "to": "FR76 3000 6000"}"#;
    let mut req = token_request("billing-pay", "run-4", "payments.transfer", params);
    req.idempotency_key = "invoice-777".into();
    req.lease_ttl = ttl_ms(1000);
    let (_, g) = grant_as(&mut client, req.clone(), Some(WORKER_KEY)).await;
    gate.time.pass_beyond(g.lease_expires_at.unwrap()).await;

    let browser = Browser::start().await;
    log_in(&browser, &url, OPS_KEY).await;
    browser.goto(&format!("{url}/unresolved")).await;
    let card = "section.unresolved[data-key='invoice-777']";
    assert_eq!(
        browser.text(&format!("{card} .action-name")).await,
        "payments.transfer"
    );
    assert_eq!(browser.text(&format!("{card} pre.params")).await, params);
    let value = |css: String| {
        let browser = &browser;
        async move {
            let found = browser
                .run(&format!("return document.querySelector(\"{css}\").value"))
                .await;
            found.as_str().unwrap().to_owned()
        }
    };
    let format = format!("{card} select[name=receipt_format]");
    assert_eq!(
        value(format.clone()).await,
        "guess",
        "guessed unless chosen"
    );
    browser
        .screenshot(&screenshots().join("console-unresolved.png"))
        .await;

    // Forced as JSON, a plain id is refused: an error, and nothing typed is lost.
    browser
        .type_into(&format!("{card} textarea[name=receipt]"), "tx_777")
        .await;
    browser
        .type_into(
            &format!("{card} form textarea[name=note]"),
            "bank statement line 42",
        )
        .await;
    browser
        .run(&format!(
            "document.querySelector(\"{format}\").value = 'json'; return true"
        ))
        .await;
    browser.click(&format!("{card} button.approve")).await;
    let alert = browser.text("#flash[role=alert]").await;
    assert!(
        alert.starts_with("Not settled") && alert.contains("A plain id (tx_777) is text"),
        "{alert}"
    );
    assert!(browser.all("#flash[role=status]").await.is_empty());
    let colour = browser
        .run("return getComputedStyle(document.querySelector('#flash')).backgroundColor")
        .await;
    assert_eq!(
        colour, "rgb(255, 235, 233)",
        "the error's red, not the success's green"
    );
    assert_eq!(
        value(format!("{card} textarea[name=receipt]")).await,
        "tx_777"
    );
    assert_eq!(
        value(format!("{card} form textarea[name=note]")).await,
        "bank statement line 42"
    );
    assert_eq!(value(format.clone()).await, "json");
    let mut admin = gate.admin().await;
    let still = admin
        .list_unresolved(authed(pb::ListUnresolvedRequest::default(), Some(OPS_KEY)))
        .await
        .unwrap()
        .into_inner()
        .actions;
    assert_eq!(still.len(), 1, "nothing was settled: {still:?}");
    browser
        .run("document.querySelector('#flash').scrollIntoView(); return true")
        .await;
    browser
        .screenshot(&screenshots().join("console-unresolved-refused.png"))
        .await;

    // Left to the guess (as `oncegate admin resolve` guesses), the same id settles as text.
    browser
        .run(&format!(
            "document.querySelector(\"{format}\").value = 'guess'; return true"
        ))
        .await;
    browser.click(&format!("{card} button.approve")).await;
    let done = browser.text("#flash[role=status]").await;
    assert!(done.starts_with("Settled as completed"), "{done}");
    let colour = browser
        .run("return getComputedStyle(document.querySelector('#flash')).backgroundColor")
        .await;
    assert_eq!(colour, "rgb(218, 251, 225)", "a success is green");
    let replay = ask(&gate, req).await.unwrap();
    assert_eq!(replay.decision(), pb::Decision::AlreadyCompleted);
    let completion = replay.completion.unwrap();
    assert_eq!(completion.receipt, b"tx_777");
    assert_eq!(completion.receipt_format(), pb::ReceiptFormat::Text);
    assert_eq!(completion.note, "bank statement line 42");
}
on_stores!(a_plain_receipt_id_settles_as_text_and_a_refusal_keeps_what_was_typed: embedded);

/// The provider key of `action`, as the gate derives it.
fn action_provider_key(action: &pb::ActionRef) -> String {
    let scope = action.scope.clone().unwrap();
    oncegate_domain::ActionKey::new(scope.agent_id, scope.run_id, action.key.clone()).provider_key()
}

/// (c) No session, no CSRF token, a wrong one, another origin: nothing changes (the approval
/// stays pending), and the page says why.
async fn without_session_or_token_nothing_changes(kind: Kind) {
    let dir = TempDir::new().unwrap();
    let (gate, url) = TestGate::start_with_console(kind, setup(&dir)).await;
    let held = ask(&gate, delete("/a")).await.unwrap();
    let approval_id = held.approval.unwrap().id;
    let mut admin = gate.admin().await;
    let pending =
        |entries: Vec<pb::ApprovalEntry>| entries[0].state() == pb::ApprovalState::Pending;

    // Without credentials: the browser lands on the login form, sees no approval.
    let browser = Browser::start().await;
    browser.goto(&format!("{url}/approvals")).await;
    assert!(browser.url().await.ends_with("/login"));
    assert!(browser.all("section.approval").await.is_empty());
    // A forged POST with no session (an HTTP client, no cookie) is refused.
    let http = http_client();
    let form = format!(
        "agent=billing-files&run=run-7&key=delete-1&approval_id={approval_id}&decision=approve&csrf=x"
    );
    let forged = http
        .post(format!("{url}/approvals/decide"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form)
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), 403);
    assert!(forged.text().await.unwrap().contains("No valid session"));
    assert!(pending(approvals(&mut admin).await));

    // Logged in, a form whose token was removed, then one whose token was changed.
    log_in(&browser, &url, OPS_KEY).await;
    let card = "section.approval[data-key='delete-1']";
    for (tamper, why) in [
        (
            "f.querySelector('input[name=csrf]').remove()",
            "no CSRF token",
        ),
        (
            "f.querySelector('input[name=csrf]').value = 'wrong'",
            "not this session's",
        ),
    ] {
        browser.goto(&format!("{url}/approvals")).await;
        browser
            .run(&format!(
                "const f = document.querySelector(\"{card} form\"); {tamper};"
            ))
            .await;
        browser.click(&format!("{card} button.approve")).await;
        assert!(browser.text("#refused").await.contains(why), "{why}");
        assert!(
            pending(approvals(&mut admin).await),
            "{why}: nothing changed"
        );
    }
    // A page of another origin posting the whole form (the right token included) is refused.
    browser.goto(&format!("{url}/approvals")).await;
    let csrf = browser
        .run("return document.querySelector('input[name=csrf]').value")
        .await;
    let evil = http
        .post(format!("{url}/approvals/decide"))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("origin", "http://evil.example")
        .body(format!(
            "agent=billing-files&run=run-7&key=delete-1&approval_id={approval_id}&decision=approve&csrf={}",
            csrf.as_str().unwrap()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(evil.status(), 403, "no session cookie and another origin");
    assert!(pending(approvals(&mut admin).await));

    // And the untampered form does decide (the checks above refused for their reasons).
    browser.click(&format!("{card} button.deny")).await;
    assert!(browser.text(".flash").await.starts_with("DENIED"));
    let state = approvals(&mut admin).await[0].state();
    assert_eq!(state, pb::ApprovalState::Denied);
}
on_stores!(without_session_or_token_nothing_changes: embedded);

/// (d) An approver (role `approver`) logs in with its key, decides an approval, and cannot see
/// or settle unresolved actions: a settle it posts anyway changes nothing.
async fn an_approver_decides_and_cannot_settle(kind: Kind) {
    let dir = TempDir::new().unwrap();
    let (gate, url) = TestGate::start_with_console(kind, setup(&dir)).await;
    ask(&gate, delete("/b")).await.unwrap();
    let mut client = gate.client().await;
    let mut req = token_request(
        "billing-pay",
        "run-3",
        "payments.transfer",
        r#"{"amount":5}"#,
    );
    req.lease_ttl = ttl_ms(1000);
    let (action, g) = grant_as(&mut client, req, Some(WORKER_KEY)).await;
    gate.time.pass_beyond(g.lease_expires_at.unwrap()).await;

    let browser = Browser::start().await;
    log_in(&browser, &url, APPROVER_KEY).await;
    assert!(
        browser
            .text("header .who")
            .await
            .contains("finance-lead (approver)")
    );
    let nav = browser.text("header nav").await;
    assert_eq!(nav, "Approvals", "an approver's navigation: {nav}");
    let card = "section.approval[data-key='delete-1']";
    browser.click(&format!("{card} button.approve")).await;
    assert!(browser.text(".flash").await.starts_with("APPROVED"));

    browser.goto(&format!("{url}/unresolved")).await;
    assert!(browser.all("section.unresolved").await.is_empty());
    assert!(
        browser
            .text("p.error")
            .await
            .contains("its role is approver")
    );
    // A settle form posted anyway (built in the page, with the session's own token) is refused.
    let scope = action.scope.clone().unwrap();
    browser
        .run(&format!(
            "const f = document.createElement('form'); f.method = 'post'; \
             f.action = '/unresolved/settle'; \
             for (const [n, v] of Object.entries({{csrf: document.querySelector('input[name=csrf]').value, \
               agent: '{}', run: '{}', key: '{}', outcome: 'failed'}})) {{ \
               const i = document.createElement('input'); i.name = n; i.value = v; f.append(i); }} \
             document.body.append(f); f.submit();",
            scope.agent_id, scope.run_id, action.key
        ))
        .await;
    let refusal = browser.text("#flash[role=alert]").await;
    assert!(refusal.starts_with("Not settled"), "{refusal}");
    let mut admin = gate.admin().await;
    let still = admin
        .list_unresolved(authed(pb::ListUnresolvedRequest::default(), Some(OPS_KEY)))
        .await
        .unwrap()
        .into_inner()
        .actions;
    assert_eq!(still.len(), 1, "still unresolved: {still:?}");
}
on_stores!(an_approver_decides_and_cannot_settle: embedded);

/// Day one, with the real binary: `oncegate serve --console-listen` and no principal configured
/// logs the console's URL; on the gate's machine `oncegate admin console-login` (over the admin
/// socket) prints a code that opens a session as the local operator, once. Over the network,
/// without a credential, no code is issued.
#[tokio::test]
async fn day_one_a_code_from_the_admin_socket_opens_a_session() {
    let dir = TempDir::new().unwrap();
    let console = format!("127.0.0.1:{}", free_port());
    let gate = LoggedGate::start(
        &dir,
        &["--listen", "127.0.0.1:0", "--console-listen", &console],
    );
    gate.wait_for_log(&format!("operator console at http://{console}/"), 1);
    let data = dir.path().join("data");
    let socket = data.join("admin.sock");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !socket.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let admin = |args: &[&str]| {
        oncegate_command()
            .args([
                "admin",
                "console-login",
                "--data-dir",
                data.to_str().unwrap(),
            ])
            .args(args)
            .env_remove("ONCEGATE_SERVER")
            .env_remove("ONCEGATE_ADMIN_TARGET")
            .output()
            .unwrap()
    };
    let network = admin(&["--server", &format!("http://{}", gate.addr)]);
    assert_eq!(network.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&network.stderr).contains("FORBIDDEN_SCOPE"));
    let local = admin(&[]);
    let out = String::from_utf8(local.stdout).unwrap();
    assert_eq!(
        local.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&local.stderr)
    );
    assert!(out.contains("logs in as local-operator"), "{out}");
    let code = out.lines().next().unwrap().trim().to_owned();

    let http = http_client();
    let base = format!("http://{console}");
    let anonymous = http.get(format!("{base}/approvals")).send().await.unwrap();
    assert_eq!(anonymous.status(), 303);
    assert_eq!(anonymous.headers()["location"], "/login");
    let login = |code: String| {
        http.post(format!("{base}/login"))
            .header("content-type", "application/x-www-form-urlencoded")
            .header("origin", base.clone())
            .body(format!("credential={code}"))
            .send()
    };
    let opened = login(code.clone()).await.unwrap();
    assert_eq!(opened.status(), 303);
    let cookie = opened.headers()["set-cookie"].to_str().unwrap().to_owned();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(cookie.contains(attribute), "{cookie}");
    }
    let session = cookie.split(';').next().unwrap().to_owned();
    let page = http
        .get(format!("{base}/approvals"))
        .header("cookie", session)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let headers = page.headers().clone();
    assert!(page.text().await.unwrap().contains("local-operator"));
    assert!(
        headers["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("default-src 'none'")
    );
    let again = login(code).await.unwrap();
    assert_eq!(again.status(), 403, "a code works once");
    gate.wait_for_log("console_login", 1);
}

/// The console is plain HTTP: a non-loopback address is refused (exit 64) unless `--insecure`.
#[test]
fn a_console_off_loopback_needs_insecure() {
    let dir = TempDir::new().unwrap();
    let data = dir.path().join("data");
    let (code, stderr) = serve_to_exit(&[
        "--console-listen",
        "0.0.0.0:0",
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(64), "{stderr}");
    assert!(
        stderr.contains("refusing --console-listen 0.0.0.0:0") && stderr.contains("--insecure"),
        "{stderr}"
    );
}
