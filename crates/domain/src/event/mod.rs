//! Events for webhooks (docs/CONTRACT.md §7): what happened, as plain data with a deterministic
//! id, and the bodies a receiver gets (CloudEvents 1.0 JSON, a Slack message). Pure: the time is
//! passed in, the id is derived from what the event is about, so every replica and every restart
//! names one event the same way and the outbox can drop a repeat.
//!
//! Does not own: when an event is emitted (the gate), where it waits (the store's outbox), how it
//! is signed and sent (the notify crate).

mod body;

#[cfg(test)]
mod tests;

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

pub use crate::time::rfc3339;

use crate::{
    ActionKey,
    ledger::{Approval, ApprovalState, Millis, Pending},
};

/// The kinds of event, each a CloudEvents `type` (`dev.oncegate.` + [`EventType::name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventType {
    ApprovalRequested,
    ApprovalDecided,
    ActionUnresolved,
    ExecutionDoubled,
    BudgetExceeded,
    StoreUnavailable,
}

/// The prefix of every CloudEvents `type` the gate sends.
pub const TYPE_PREFIX: &str = "dev.oncegate.";

impl EventType {
    /// Every type, in the contract's order.
    pub const ALL: [EventType; 6] = [
        Self::ApprovalRequested,
        Self::ApprovalDecided,
        Self::ActionUnresolved,
        Self::ExecutionDoubled,
        Self::BudgetExceeded,
        Self::StoreUnavailable,
    ];

    /// The short name the configuration file and the metrics use: `approval.requested`, ...
    pub fn name(self) -> &'static str {
        match self {
            Self::ApprovalRequested => "approval.requested",
            Self::ApprovalDecided => "approval.decided",
            Self::ActionUnresolved => "action.unresolved",
            Self::ExecutionDoubled => "execution.doubled",
            Self::BudgetExceeded => "budget.exceeded",
            Self::StoreUnavailable => "store.unavailable",
        }
    }

    /// The CloudEvents `type`: `dev.oncegate.approval.requested`, ...
    pub fn cloudevents_type(self) -> String {
        format!("{TYPE_PREFIX}{}", self.name())
    }

    /// The type a short name or a full CloudEvents type names.
    pub fn parse(text: &str) -> Option<Self> {
        let short = text.strip_prefix(TYPE_PREFIX).unwrap_or(text);
        Self::ALL.into_iter().find(|t| t.name() == short)
    }
}

/// One event: its type, its id (the same for the same happening on every replica), when it
/// happened (store time where a store step decided it), its subject and its data.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub kind: EventType,
    pub id: String,
    pub time: Millis,
    /// The CloudEvents `subject`: the agent id (the store's name for `store.unavailable`).
    pub subject: String,
    pub data: Map<String, Value>,
}

/// `evt_` + 32 hex digits of a SHA-256 over the type and `parts`, each length-prefixed so that no
/// two lists of parts meet.
pub fn event_id(kind: EventType, parts: &[&[u8]]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"oncegate-event\0");
    for part in std::iter::once(kind.name().as_bytes()).chain(parts.iter().copied()) {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    format!("evt_{}", &hex::encode(hasher.finalize())[..32])
}

/// The fields every action event names: agent, run, key and the provider key.
fn action_fields(key: &ActionKey) -> Map<String, Value> {
    let mut data = Map::new();
    data.insert("agent_id".into(), json!(key.agent_id));
    data.insert("run_id".into(), json!(key.run_id));
    data.insert("key".into(), json!(key.key));
    data.insert("provider_key".into(), json!(key.provider_key()));
    data
}

/// What a held RequestToken tells the approvers, besides the action and the pending approval.
#[derive(Debug, Clone, Copy)]
pub struct Requested<'a> {
    pub action: &'a str,
    /// The principal that asked.
    pub principal: &'a str,
    /// The request's params (a JSON object), what the approver decides on.
    pub params: Option<&'a Map<String, Value>>,
}

impl Event {
    /// `approval.requested`: a rule held `key`'s request for the approval `pending`.
    pub fn approval_requested(
        key: &ActionKey,
        pending: &Pending,
        asked: Requested<'_>,
        now: Millis,
    ) -> Self {
        let mut data = action_fields(key);
        data.insert("action".into(), json!(asked.action));
        data.insert("approval_id".into(), json!(pending.id));
        data.insert("policy_id".into(), json!(pending.policy));
        data.insert("reason".into(), json!(pending.reason));
        data.insert("expires_at".into(), json!(rfc3339(pending.expires_at)));
        data.insert("principal".into(), json!(asked.principal));
        if let Some(params) = asked.params {
            data.insert("params".into(), Value::Object(params.clone()));
        }
        Self {
            kind: EventType::ApprovalRequested,
            id: event_id(EventType::ApprovalRequested, &[pending.id.as_bytes()]),
            time: now,
            subject: key.agent_id.clone(),
            data,
        }
    }

    /// `approval.decided`: an operator approved or denied `approval` of `key`.
    pub fn approval_decided(key: &ActionKey, approval: &Approval, now: Millis) -> Self {
        let mut data = action_fields(key);
        let decision = match approval.state {
            ApprovalState::Denied => "denied",
            _ => "approved",
        };
        data.insert("action".into(), json!(approval.action));
        data.insert("approval_id".into(), json!(approval.id));
        data.insert("decision".into(), json!(decision));
        data.insert("operator".into(), json!(approval.operator));
        data.insert("note".into(), json!(approval.note));
        data.insert("policy_id".into(), json!(approval.policy));
        data.insert("reason".into(), json!(approval.reason));
        data.insert("expires_at".into(), json!(rfc3339(approval.expires_at)));
        // No params: they travel only in `approval.requested`, to the approvers who decide on
        // them; a receiver of decisions alone (an audit sink) is promised it never gets them.
        Self {
            kind: EventType::ApprovalDecided,
            id: event_id(EventType::ApprovalDecided, &[approval.id.as_bytes()]),
            time: now,
            subject: key.agent_id.clone(),
            data,
        }
    }

    /// `action.unresolved`: the lease of `key`'s grant `fencing` ended at `lease_expired_at` with
    /// no outcome. `action` when the caller knows it (a RequestToken does, a listing does not).
    pub fn action_unresolved(key: &ActionKey, lapsed: Lapsed<'_>, now: Millis) -> Self {
        let mut data = action_fields(key);
        data.insert("fencing".into(), json!(lapsed.fencing));
        data.insert(
            "lease_expired_at".into(),
            json!(lapsed.lease_expired_at.map(rfc3339)),
        );
        data.insert("holder".into(), json!(lapsed.holder));
        data.insert("fingerprint".into(), json!(lapsed.fingerprint));
        if let Some(action) = lapsed.action {
            data.insert("action".into(), json!(action));
        }
        let fencing = lapsed.fencing.to_be_bytes();
        Self {
            kind: EventType::ActionUnresolved,
            id: event_id(EventType::ActionUnresolved, &[&key.encode(), &fencing]),
            time: now,
            subject: key.agent_id.clone(),
            data,
        }
    }

    /// `execution.doubled`: `key` may have run twice (`kind`: `superseded_completion` or
    /// `completed_by_other`); `token` (only hashed into the id, never sent) is the completing one.
    pub fn execution_doubled(
        key: &ActionKey,
        kind: &str,
        fencing: u64,
        token: &str,
        now: Millis,
    ) -> Self {
        let mut data = action_fields(key);
        data.insert("kind".into(), json!(kind));
        data.insert("fencing".into(), json!(fencing));
        Self {
            kind: EventType::ExecutionDoubled,
            id: event_id(
                EventType::ExecutionDoubled,
                &[&key.encode(), kind.as_bytes(), token.as_bytes()],
            ),
            time: now,
            subject: key.agent_id.clone(),
            data,
        }
    }

    /// `budget.exceeded`: the refusals of one budget for one agent in one aggregation window.
    pub fn budget_exceeded(refused: &BudgetRefusals, now: Millis) -> Self {
        let mut data = Map::new();
        data.insert("budget".into(), json!(refused.budget));
        data.insert("agent_id".into(), json!(refused.agent_id));
        data.insert("refusals".into(), json!(refused.refusals));
        data.insert("first_refused_at".into(), json!(rfc3339(refused.first_at)));
        data.insert("last_refused_at".into(), json!(rfc3339(refused.last_at)));
        data.insert("window_seconds".into(), seconds(refused.window));
        data.insert("actions".into(), json!(refused.actions));
        let first = refused.first_at.to_be_bytes();
        Self {
            kind: EventType::BudgetExceeded,
            id: event_id(
                EventType::BudgetExceeded,
                &[
                    refused.budget.as_bytes(),
                    refused.agent_id.as_bytes(),
                    &first,
                ],
            ),
            time: now,
            subject: refused.agent_id.clone(),
            data,
        }
    }

    /// `store.unavailable`: `store` failed the health probe from `since` until `until`.
    pub fn store_unavailable(store: &str, since: Millis, until: Millis) -> Self {
        let mut data = Map::new();
        data.insert("store".into(), json!(store));
        data.insert("since".into(), json!(rfc3339(since)));
        data.insert("until".into(), json!(rfc3339(until)));
        data.insert("down_seconds".into(), seconds((until - since).max(0)));
        Self {
            kind: EventType::StoreUnavailable,
            id: event_id(
                EventType::StoreUnavailable,
                &[store.as_bytes(), &since.to_be_bytes()],
            ),
            time: until,
            subject: store.to_owned(),
            data,
        }
    }
}

/// `ms` in seconds as JSON: an integer when it is a whole number of seconds (`60`, never `60.0`:
/// a receiver that reads integers strictly gets one), else the exact fraction (`1.5`).
fn seconds(ms: Millis) -> Value {
    match ms % 1000 {
        0 => json!(ms / 1000),
        _ => json!(ms as f64 / 1000.0),
    }
}

/// A lease that ended with no outcome, as an `action.unresolved` event names it.
#[derive(Debug, Clone, Copy)]
pub struct Lapsed<'a> {
    pub fencing: u64,
    /// When the lease ended (`None`: not known to the caller, a regrant).
    pub lease_expired_at: Option<Millis>,
    pub holder: &'a str,
    pub fingerprint: &'a str,
    pub action: Option<&'a str>,
}

/// The `BUDGET_EXCEEDED` refusals of one budget for one agent within one aggregation window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetRefusals {
    pub budget: String,
    pub agent_id: String,
    pub refusals: u64,
    pub first_at: Millis,
    pub last_at: Millis,
    /// The aggregation window.
    pub window: Millis,
    /// The actions refused, in the order first seen, at most [`BudgetRefusals::MAX_ACTIONS`].
    pub actions: Vec<String>,
}

impl BudgetRefusals {
    /// The most action names one event lists.
    pub const MAX_ACTIONS: usize = 16;

    /// The first refusal of a window.
    pub fn first(budget: &str, agent_id: &str, action: &str, at: Millis, window: Millis) -> Self {
        Self {
            budget: budget.to_owned(),
            agent_id: agent_id.to_owned(),
            refusals: 1,
            first_at: at,
            last_at: at,
            window,
            actions: vec![action.to_owned()],
        }
    }

    /// One more refusal in the same window.
    pub fn add(&mut self, action: &str, at: Millis) {
        self.refusals += 1;
        self.last_at = self.last_at.max(at);
        if self.actions.len() < Self::MAX_ACTIONS && !self.actions.iter().any(|a| a == action) {
            self.actions.push(action.to_owned());
        }
    }
}
