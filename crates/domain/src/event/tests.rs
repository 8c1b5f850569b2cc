//! Events: their ids, their CloudEvents and Slack bodies, and the timestamps in them.

use serde_json::json;

use super::*;
use crate::ledger::{Approval, ApprovalState, Pending};

fn key() -> ActionKey {
    ActionKey::new("billing", "run-7", "invoice-1001")
}

#[test]
fn timestamps_are_rfc3339_utc() {
    assert_eq!(rfc3339(1_614_265_330_000), "2021-02-25T15:02:10.000Z");
}

#[test]
fn an_event_body_is_a_cloudevent() {
    let pending = Pending {
        id: "ap-1".into(),
        expires_at: 1_614_265_330_000,
        policy: "large".into(),
        reason: "above 10k".into(),
    };
    let params = json!({"amount": 12500});
    let asked = Requested {
        action: "payments.transfer",
        principal: "worker",
        params: params.as_object(),
    };
    let event = Event::approval_requested(&key(), &pending, asked, 1_614_265_000_000);
    let body = event.cloudevent("oncegate");
    assert_eq!(body["specversion"], "1.0");
    assert_eq!(body["id"], json!(event.id));
    assert_eq!(body["source"], "oncegate");
    assert_eq!(body["type"], "dev.oncegate.approval.requested");
    assert_eq!(body["time"], "2021-02-25T14:56:40.000Z");
    assert_eq!(body["subject"], "billing");
    assert_eq!(body["datacontenttype"], "application/json");
    let data = &body["data"];
    assert_eq!(data["agent_id"], "billing");
    assert_eq!(data["run_id"], "run-7");
    assert_eq!(data["key"], "invoice-1001");
    assert_eq!(data["provider_key"], json!(key().provider_key()));
    assert_eq!(data["approval_id"], "ap-1");
    assert_eq!(data["policy_id"], "large");
    assert_eq!(data["params"], params);
    assert_eq!(data["expires_at"], "2021-02-25T15:02:10.000Z");
    let slack = event.slack();
    let text = slack["text"].as_str().unwrap();
    assert!(
        text.contains("payments.transfer") && text.contains("ap-1"),
        "{text}"
    );
}

#[test]
fn ids_name_what_the_event_is_about_and_nothing_else() {
    let approval = Approval {
        id: "ap-1".into(),
        fingerprint: "v1-x".into(),
        digests: String::new(),
        state: ApprovalState::Approved,
        created_at: 1,
        expires_at: 2,
        policy: "p".into(),
        reason: "r".into(),
        action: "a".into(),
        operator: "ops".into(),
        note: "ok".into(),
        params: r#"{"amount":1}"#.into(),
    };
    let decided = Event::approval_decided(&key(), &approval, 10);
    let later = Event::approval_decided(&key(), &approval, 99);
    assert_eq!(
        decided.id, later.id,
        "the same decision, whenever it is seen"
    );
    assert!(decided.id.starts_with("evt_") && decided.id.len() == 36);
    assert_eq!(decided.data["decision"], "approved");
    assert!(
        !decided.data.contains_key("params")
            && !decided
                .cloudevent("oncegate")
                .to_string()
                .contains("amount"),
        "params travel only in approval.requested: {:?}",
        decided.data
    );
    let lapsed = |fencing| Lapsed {
        fencing,
        lease_expired_at: Some(5),
        holder: "h",
        fingerprint: "v1-f",
        action: None,
    };
    let a = Event::action_unresolved(&key(), lapsed(7), 10);
    let b = Event::action_unresolved(&key(), lapsed(7), 20);
    let c = Event::action_unresolved(&key(), lapsed(8), 10);
    assert_eq!(a.id, b.id);
    assert_ne!(a.id, c.id);
    assert_ne!(
        event_id(EventType::ApprovalRequested, &[b"ab", b"c"]),
        event_id(EventType::ApprovalRequested, &[b"a", b"bc"])
    );
    assert_ne!(
        event_id(EventType::ApprovalRequested, &[b"x"]),
        event_id(EventType::ApprovalDecided, &[b"x"])
    );
}

#[test]
fn no_token_reaches_a_doubled_execution_event() {
    let event = Event::execution_doubled(&key(), "completed_by_other", 3, "secret-token", 1);
    let body = event.cloudevent("oncegate").to_string();
    assert!(!body.contains("secret-token"), "{body}");
    let other = Event::execution_doubled(&key(), "completed_by_other", 3, "another", 1);
    assert_ne!(
        event.id, other.id,
        "each holder's double execution is its own event"
    );
}

#[test]
fn budget_refusals_aggregate_into_one_event() {
    let mut refused = BudgetRefusals::first("daily", "billing", "pay", 1000, 60_000);
    for i in 0..20 {
        refused.add(&format!("action-{i}"), 1000 + i);
    }
    refused.add("pay", 5000);
    assert_eq!(refused.refusals, 22);
    assert_eq!(refused.actions.len(), BudgetRefusals::MAX_ACTIONS);
    let event = Event::budget_exceeded(&refused, 61_000);
    assert_eq!(event.data["refusals"], 22);
    assert!(
        event.data["window_seconds"].is_u64(),
        "a whole number of seconds is a JSON integer: {}",
        event.data["window_seconds"]
    );
    let body = event.cloudevent("oncegate").to_string();
    assert!(
        body.contains("\"window_seconds\":60") && !body.contains("60.0"),
        "written as 60, not 60.0: {body}"
    );
    let odd = BudgetRefusals::first("daily", "billing", "pay", 1000, 1500);
    assert_eq!(
        Event::budget_exceeded(&odd, 2500).data["window_seconds"],
        json!(1.5)
    );
    let down = Event::store_unavailable("redis", 1000, 13_000);
    assert!(
        down.data["down_seconds"].is_u64(),
        "{}",
        down.data["down_seconds"]
    );
    assert_eq!(
        Event::store_unavailable("redis", 1000, 1250).data["down_seconds"],
        json!(0.25)
    );
    assert_eq!(event.data["last_refused_at"], json!(rfc3339(5000)));
}

#[test]
fn types_parse_by_short_or_full_name() {
    for t in EventType::ALL {
        assert_eq!(EventType::parse(t.name()), Some(t));
        assert_eq!(EventType::parse(&t.cloudevents_type()), Some(t));
    }
    assert_eq!(EventType::parse("approval"), None);
}
