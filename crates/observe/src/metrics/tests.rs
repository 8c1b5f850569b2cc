use super::*;

fn scrape(registry: &Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text
}

#[test]
fn the_action_label_is_the_policy_name_or_the_other_value() {
    let mut registry = Registry::default();
    let m = Metrics::register(&mut registry, ["pay", "mail.*"], "unnamed");
    for policy in [Some("pay"), Some("mail.*"), None, None, None] {
        m.attempt(policy, Decision::InProgress);
    }
    let text = scrape(&registry);
    assert!(text.contains(
        r#"oncegate_attempts_total{action="pay",decision="in_progress",mode="enforce"} 1"#
    ));
    assert!(text.contains(
        r#"oncegate_attempts_total{action="mail.*",decision="in_progress",mode="enforce"} 1"#
    ));
    assert!(text.contains(
        r#"oncegate_attempts_total{action="unnamed",decision="in_progress",mode="enforce"} 3"#
    ));
    assert!(text.contains(
        r#"oncegate_blocked_duplicates_total{action="unnamed",reason="in_progress",mode="enforce"} 3"#
    ));
}

#[test]
fn bounded_series_start_at_zero() {
    let mut registry = Registry::default();
    Metrics::register(&mut registry, [], "other");
    let text = scrape(&registry);
    assert!(text.contains(r#"oncegate_double_executions_total{kind="completed_by_other"} 0"#));
    assert!(
        text.contains(
            r#"oncegate_attempts_total{action="other",decision="granted",mode="shadow"} 0"#
        )
    );
    assert!(text.contains(
        r#"oncegate_store_errors_total{operation="request_token",error="unavailable"} 0"#
    ));
    assert!(text.contains("oncegate_build_info{version="));
}

#[test]
fn only_the_four_refusing_decisions_are_blocked_duplicates() {
    let blocked: Vec<_> = Decision::ALL
        .into_iter()
        .filter(|d| d.is_blocked_duplicate())
        .map(Decision::as_str)
        .collect();
    assert_eq!(
        blocked,
        ["replayed", "in_progress", "key_reused", "lease_expired"]
    );
}

#[test]
fn the_other_action_label_cannot_be_empty_or_a_policy_name() {
    assert!(Metrics::check_other_action_label("other", ["other"]).is_err());
    assert!(Metrics::check_other_action_label("", ["other"]).is_err());
    assert!(Metrics::check_other_action_label("unnamed", ["other"]).is_ok());
}
