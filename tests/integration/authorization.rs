//! Authorization rules through real gRPC: Cedar policies deny by agent and by a param bound
//! before anything is recorded; a broken policy file stops start-up (exit 64, Cedar's message)
//! and, on SIGHUP, leaves the previous policies in force; docs/authorization.md's example. Shadow mode is in
//! `shadow.rs`.

use oncegate_proto as pb;
use tempfile::TempDir;
use tonic::Code;

use crate::support::{
    BASIC_RULES, Kind, LoggedGate, TestGate, complete, config, expect_error, grant, on_stores,
    oncegate_command, state, token_request, with_rules, write_file,
};

async fn rules_deny_by_agent_and_by_a_param_bound(kind: Kind) {
    let dir = TempDir::new().unwrap();
    let gate = TestGate::start_with(kind, config(&with_rules(dir.path(), BASIC_RULES, ""))).await;
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
on_stores!(rules_deny_by_agent_and_by_a_param_bound: embedded, redis, postgres);

#[test]
fn a_broken_policy_file_stops_start_up_with_cedars_message() {
    let dir = TempDir::new().unwrap();
    let cfg = write_file(
        dir.path(),
        "oncegate.toml",
        &with_rules(
            dir.path(),
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
    let cfg = write_file(
        dir.path(),
        "oncegate.toml",
        &with_rules(dir.path(), BASIC_RULES, ""),
    );
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

/// docs/authorization.md's example configuration and policies, as written there, behave as the
/// page says, line by line of its "What the agent sees".
#[tokio::test]
async fn the_documented_example_does_what_the_page_says() {
    let page = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/authorization.md"
    ))
    .unwrap();
    let block = |lang: &str| crate::readme::first_block(&page, lang);
    let dir = TempDir::new().unwrap();
    write_file(dir.path(), "rules.cedar", &block("cedar"));
    let path = write_file(dir.path(), "oncegate.toml", &block("toml"));
    let file = oncegate_config::ConfigFile::load(&path).unwrap();
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
    for (amount, key) in [("10000.01", "c1"), ("10001", "c2")] {
        let denied = client
            .request_token(pay("ceiling-bot", amount, key))
            .await
            .unwrap_err();
        assert_eq!(
            expect_error(&denied, Code::PermissionDenied, "POLICY_DENIED")["policy_id"],
            "transfer-ceiling",
            "{amount}"
        );
    }
    // A fraction passes the ceiling as an integer does (one rule on decimal_params); 10000 passes
    // it too, and meets the day's budget instead.
    grant(&mut client, pay("ceiling-bot", "12.5", "c3")).await;
    let over = client
        .request_token(pay("ceiling-bot-2", "10000", "c4"))
        .await
        .unwrap_err();
    assert_eq!(
        expect_error(&over, Code::ResourceExhausted, "BUDGET_EXCEEDED")["budget"],
        "payments-per-day"
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
