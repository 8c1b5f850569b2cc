//! What a receiver gets: the CloudEvents 1.0 structured JSON of an event, or a Slack
//! incoming-webhook message naming it in one line.

use serde_json::{Value, json};

use super::{Event, EventType, rfc3339};

impl Event {
    /// The CloudEvents 1.0 structured-mode JSON of this event, from `source`.
    pub fn cloudevent(&self, source: &str) -> Value {
        json!({
            "specversion": "1.0",
            "id": self.id,
            "source": source,
            "type": self.kind.cloudevents_type(),
            "time": rfc3339(self.time),
            "subject": self.subject,
            "datacontenttype": "application/json",
            "data": self.data,
        })
    }

    /// A Slack incoming-webhook body: `{"text": ...}`, one line saying what happened.
    pub fn slack(&self) -> Value {
        json!({ "text": self.slack_text() })
    }

    fn field(&self, name: &str) -> String {
        match self.data.get(name) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None => String::new(),
            Some(other) => other.to_string(),
        }
    }

    /// `agent/run/key` of an action event.
    fn action_ref(&self) -> String {
        format!(
            "`{}` / `{}` / `{}`",
            self.field("agent_id"),
            self.field("run_id"),
            self.field("key")
        )
    }

    fn slack_text(&self) -> String {
        match self.kind {
            EventType::ApprovalRequested => format!(
                "oncegate: approval requested for `{}` ({}), policy `{}`: {}. Approval id `{}`, lapses {}.",
                self.field("action"),
                self.action_ref(),
                self.field("policy_id"),
                self.field("reason"),
                self.field("approval_id"),
                self.field("expires_at"),
            ),
            EventType::ApprovalDecided => format!(
                "oncegate: approval `{}` of `{}` ({}) {} by {}{}.",
                self.field("approval_id"),
                self.field("action"),
                self.action_ref(),
                self.field("decision"),
                self.field("operator"),
                match self.field("note") {
                    note if note.is_empty() => String::new(),
                    note => format!(": {note}"),
                },
            ),
            EventType::ActionUnresolved => format!(
                "oncegate: action {} unresolved: lease of fencing {} ended {} with no outcome. \
                 Reconcile with the provider (key `{}`), then settle it.",
                self.action_ref(),
                self.field("fencing"),
                self.field("lease_expired_at"),
                self.field("provider_key"),
            ),
            EventType::ExecutionDoubled => format!(
                "oncegate: action {} may have run twice ({}, fencing {}). Investigate with the \
                 provider (key `{}`).",
                self.action_ref(),
                self.field("kind"),
                self.field("fencing"),
                self.field("provider_key"),
            ),
            EventType::BudgetExceeded => format!(
                "oncegate: budget `{}` refused agent `{}` {} time(s) between {} and {}.",
                self.field("budget"),
                self.field("agent_id"),
                self.field("refusals"),
                self.field("first_refused_at"),
                self.field("last_refused_at"),
            ),
            EventType::StoreUnavailable => format!(
                "oncegate: the {} store was unavailable from {} to {} ({} s); calls failed closed \
                 meanwhile.",
                self.field("store"),
                self.field("since"),
                self.field("until"),
                self.field("down_seconds"),
            ),
        }
    }
}
