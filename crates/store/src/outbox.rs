//! The webhook outbox (docs/CONTRACT.md §7): events waiting for delivery, kept in the gate's own
//! store so that they survive a restart. The types and the one encoding both stores share; each
//! store's operations are atomic ([`crate::Store`] says what each one does).
//!
//! An entry is one event for one webhook, named by (webhook, event id): its *member*. It is
//! pending (waiting, or claimed by a delivery worker until its claim lease ends), delivered (a
//! marker kept for the retention, so that the same event is never written again) or undeliverable
//! (kept for the retention, listed and counted). Time is the store's.

use crate::{ListCursor, StoreError};
use oncegate_domain::ledger::Millis;

/// An event to write for one webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEntry {
    /// The webhook's name in the configuration.
    pub webhook: String,
    /// The event id (`webhook-id`).
    pub id: String,
    /// The event type's short name (`approval.requested`).
    pub event_type: String,
    /// The body to send, as rendered for this webhook.
    pub body: String,
}

/// Where an entry stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutboxState {
    Pending,
    Delivered,
    Undeliverable,
}

/// One stored entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEntry {
    pub webhook: String,
    pub id: String,
    pub event_type: String,
    /// Empty once delivered (the marker keeps no body).
    pub body: String,
    /// When it was written (store clock).
    pub created_at: Millis,
    /// Delivery attempts started (each claim is one).
    pub attempts: u32,
    pub state: OutboxState,
    /// Pending: when it may be claimed next (a claimed entry: when its claim lease ends).
    pub due_at: Millis,
    /// The claim of the worker delivering it (empty until first claimed).
    pub claim: String,
    /// Why the last attempt failed.
    pub last_error: String,
    /// When it was delivered or given up (0 while pending).
    pub settled_at: Millis,
}

/// How a delivery attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settlement {
    /// A 2xx answer.
    Delivered,
    /// Failed; try again at `due_at`.
    Retry { due_at: Millis, error: String },
    /// Failed for the last time (attempts or age exhausted).
    Undeliverable { error: String },
}

/// A claim's answer: the entries claimed, and how many are pending and undeliverable after it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Claimed {
    pub entries: Vec<OutboxEntry>,
    pub pending: u64,
    pub undeliverable: u64,
}

/// A page of undeliverable entries, oldest given up first, with the counts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OutboxPage {
    pub items: Vec<OutboxEntry>,
    /// Where the next page starts (`lease_expires_at`: when given up; `key`: the member).
    pub next: Option<ListCursor>,
    pub pending: u64,
    pub undeliverable: u64,
}

/// How many expired markers one store step forgets at most.
pub const PURGE_BATCH: usize = 64;

/// The member of (webhook, event id): the webhook length-prefixed, so no two pairs meet.
pub fn member(webhook: &str, id: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + webhook.len() + id.len());
    out.extend_from_slice(&(webhook.len() as u32).to_be_bytes());
    out.extend_from_slice(webhook.as_bytes());
    out.extend_from_slice(id.as_bytes());
    out
}

/// The stored layout, a MessagePack array (the Redis scripts read and write it with `cmsgpack`,
/// slots in this order; state 1 pending, 2 delivered, 3 undeliverable).
type Packed = (
    String,
    String,
    String,
    String,
    Millis,
    u32,
    u8,
    Millis,
    String,
    String,
    Millis,
);

impl OutboxState {
    fn code(self) -> u8 {
        match self {
            Self::Pending => 1,
            Self::Delivered => 2,
            Self::Undeliverable => 3,
        }
    }
}

impl OutboxEntry {
    /// A new pending entry, due at once.
    pub fn new(entry: &NewEntry, now: Millis) -> Self {
        Self {
            webhook: entry.webhook.clone(),
            id: entry.id.clone(),
            event_type: entry.event_type.clone(),
            body: entry.body.clone(),
            created_at: now,
            attempts: 0,
            state: OutboxState::Pending,
            due_at: now,
            claim: String::new(),
            last_error: String::new(),
            settled_at: 0,
        }
    }

    /// Its member.
    pub fn member(&self) -> Vec<u8> {
        member(&self.webhook, &self.id)
    }

    /// The stored bytes.
    pub fn encode(&self) -> Result<Vec<u8>, StoreError> {
        let packed: Packed = (
            self.webhook.clone(),
            self.id.clone(),
            self.event_type.clone(),
            self.body.clone(),
            self.created_at,
            self.attempts,
            self.state.code(),
            self.due_at,
            self.claim.clone(),
            self.last_error.clone(),
            self.settled_at,
        );
        rmp_serde::to_vec(&packed)
            .map_err(|e| StoreError::corrupt_by("encoding an outbox entry", e))
    }

    /// An entry from its stored bytes.
    pub fn decode(bytes: &[u8]) -> Result<Self, StoreError> {
        let p: Packed = rmp_serde::from_slice(bytes)
            .map_err(|e| StoreError::corrupt_by("an outbox entry", e))?;
        let state = match p.6 {
            1 => OutboxState::Pending,
            2 => OutboxState::Delivered,
            3 => OutboxState::Undeliverable,
            n => return Err(StoreError::corrupt(format!("outbox entry state {n}"))),
        };
        Ok(Self {
            webhook: p.0,
            id: p.1,
            event_type: p.2,
            body: p.3,
            created_at: p.4,
            attempts: p.5,
            state,
            due_at: p.7,
            claim: p.8,
            last_error: p.9,
            settled_at: p.10,
        })
    }

    /// Claims a due pending entry for `claim` until `now + lease` (one more attempt).
    pub fn claimed(mut self, claim: &str, now: Millis, lease: Millis) -> Self {
        self.attempts += 1;
        self.claim = claim.to_owned();
        self.due_at = now + lease;
        self
    }

    /// Applies a settlement of the claim `claim` at `now`; `None` when the entry is not pending
    /// under that claim any more (another worker took it over, or it was settled): nothing
    /// changes.
    pub fn settled(mut self, claim: &str, settlement: &Settlement, now: Millis) -> Option<Self> {
        if self.state != OutboxState::Pending || self.claim != claim {
            return None;
        }
        match settlement {
            Settlement::Delivered => {
                self.state = OutboxState::Delivered;
                self.body.clear();
                self.last_error.clear();
                self.settled_at = now;
            }
            Settlement::Retry { due_at, error } => {
                self.due_at = *due_at;
                self.last_error = error.clone();
            }
            Settlement::Undeliverable { error } => {
                self.state = OutboxState::Undeliverable;
                self.last_error = error.clone();
                self.settled_at = now;
            }
        }
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> OutboxEntry {
        OutboxEntry::new(
            &NewEntry {
                webhook: "ops".into(),
                id: "evt_1".into(),
                event_type: "approval.requested".into(),
                body: "{\"a\":\"é\"}".into(),
            },
            100,
        )
    }

    #[test]
    fn an_entry_round_trips() {
        let e = entry().claimed("c1", 200, 50);
        assert_eq!(OutboxEntry::decode(&e.encode().unwrap()).unwrap(), e);
        assert_eq!((e.attempts, e.due_at), (1, 250));
    }

    #[test]
    fn only_the_current_claim_settles_a_pending_entry() {
        let e = entry().claimed("c1", 200, 50);
        assert!(
            e.clone()
                .settled("c0", &Settlement::Delivered, 210)
                .is_none()
        );
        let done = e.settled("c1", &Settlement::Delivered, 210).unwrap();
        assert_eq!(
            (done.state, done.body.as_str(), done.settled_at),
            (OutboxState::Delivered, "", 210)
        );
        assert!(
            done.settled("c1", &Settlement::Delivered, 220).is_none(),
            "settled once"
        );
    }

    #[test]
    fn members_do_not_meet() {
        assert_ne!(member("ab", "c"), member("a", "bc"));
    }
}
