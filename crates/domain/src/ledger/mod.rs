//! The action state machine: `(stored record, request, now) → (reply, write)`. No IO, no clock, no
//! randomness: the caller passes the store's time and a fresh token in.
//!
//! This is the reference semantics (docs/CONTRACT.md, "States" and "Transitions"). The embedded
//! store runs it inside a write transaction; the Redis store's Lua scripts mirror it and the
//! conformance suite checks them against it. This file holds the types; the transitions are in
//! [`worker`] (RequestToken, Complete, Release, ExtendLease, GetAction) and [`operator`]
//! (RecordExternalCompletion, ResolveExpired, what ListUnresolved lists); RequestToken, Release and
//! ResolveExpired reach the agent's approvals ([`approval`]) and budgets ([`budget`]) through
//! [`side`], in the same step.

pub mod approval;
pub mod budget;
mod operator;
mod side;
mod worker;

use serde::{Deserialize, Serialize};

use crate::fingerprint;

pub use approval::{Approval, ApprovalState, Hold, Pending};
pub use budget::{Bucket, Charge, Exceeded, Reservation};
pub use operator::{is_unresolved, record_external};
pub use side::{Side, SideWrite, release, request_token, reserved_buckets, resolve_expired};
pub use worker::{complete, extend_lease, view};

/// Milliseconds since the Unix epoch, on the store's clock.
pub type Millis = i64;

/// One action key's stored record. A record whose `expires_at` has passed does not exist.
///
/// A record whose outcome is unknown never expires: an authorized record (live or expired lease)
/// and a released one with superseded grants still out stay until a Complete, a Release or an
/// operator settles them. Retention applies to settled records only (docs/CONTRACT.md, "Record
/// lifetime").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The fencing number of the latest grant; grows with every grant, kept across Release, and
    /// never below [`first_fencing`] of the grant's time.
    pub fencing: u64,
    /// The request hash every later request for this key must match.
    pub fingerprint: String,
    /// Per-field digests of the stored request (see [`fingerprint::field_digests`]); empty when
    /// the action is keyed by its fingerprint, which can never conflict.
    pub digests: String,
    /// How long a completed record is kept.
    pub retention: Millis,
    /// Whether a replay pushes the retention forward.
    pub sliding: bool,
    /// When the store forgets this record; `None` while its outcome is unknown.
    pub expires_at: Option<Millis>,
    /// Earlier grants of this key that were superseded (their lease ended, a newer token was
    /// granted) and neither completed nor settled: a late Complete with one of them is still
    /// recorded, because the effect happened. At most [`TokenRequest::max_superseded`].
    pub older: Vec<TokenGrant>,
    /// Where the action stands.
    pub phase: Phase,
    /// What its grants reserved in budgets ([`budget`]): a
    /// Release of a grant gives its reservations back; any other end leaves them spent.
    #[serde(default)]
    pub reservations: Vec<Reservation>,
    /// What the latest grant was asked for ([`Asked`]); empty once completed, and in records
    /// written before it was kept.
    #[serde(default)]
    pub asked: Asked,
}

/// A token and the fencing number it was granted with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenGrant {
    pub token: String,
    pub fencing: u64,
}

/// The phase of a stored record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// A token is out; past `lease_expires_at` the action is EXPIRED.
    Authorized {
        token: String,
        holder: String,
        lease_expires_at: Millis,
        /// The principal the token was granted to: only it may have the token redelivered.
        #[serde(default)]
        principal: String,
    },
    /// The action completed.
    Completed(Completion),
    /// The last token was released `at`. Without superseded grants: ABSENT for every purpose but
    /// the fencing counter. With some still out: EXPIRED (unresolved), naming the newest of them.
    Released {
        token: String,
        #[serde(default)]
        at: Millis,
    },
}

impl Record {
    /// The superseded grant a released record still waits on (the newest one), if any: its
    /// outcome is unknown, so the action is unresolved until it completes or an operator settles
    /// it.
    pub fn pending_superseded(&self) -> Option<&TokenGrant> {
        match self.phase {
            Phase::Released { .. } => self.older.last(),
            _ => None,
        }
    }

    /// The store expiry of a settled record written at `now`, or `None` while superseded grants
    /// are still out (then it is not settled).
    pub(super) fn settled_expiry(&self, now: Millis) -> Option<Millis> {
        self.older.is_empty().then_some(now + self.retention)
    }
}

/// The fencing number of a first grant at `now`: the store clock in microseconds (milliseconds ×
/// 1000, plus one so that it is never 0), so fencing never goes backwards for an action key even
/// after a settled record's retention ended and it was forgotten (no key is granted a million
/// times a second).
pub fn first_fencing(now: Millis) -> u64 {
    (now.max(0) as u64) * 1000 + 1
}

/// Who recorded a completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Source {
    Worker,
    Operator,
}

/// A recorded outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Completion {
    pub receipt: Vec<u8>,
    pub completed_at: Millis,
    pub fencing: u64,
    /// The completing token; empty for operator completions.
    pub token: String,
    pub source: Source,
    /// The operator's note (operator completions only; empty otherwise).
    #[serde(default)]
    pub note: String,
    /// The name of the operator principal that recorded it (operator completions only).
    #[serde(default)]
    pub operator: String,
    /// Its position in the agent's receipt chain (0: recorded without a chain, when the gate
    /// does not sign). Set by the store, never by the ledger.
    #[serde(default)]
    pub seq: u64,
    /// Its signed receipt statement (empty without signing). Set by the store, never by the
    /// ledger.
    #[serde(default)]
    pub statement: String,
    /// How the receipt is read (an operator says JSON or text; a worker's is its own encoding).
    #[serde(default)]
    pub format: ReceiptFormat,
}

/// How a receipt's bytes are to be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum ReceiptFormat {
    /// The writer's own encoding (a worker's receipt): its client reads it back.
    #[default]
    Unspecified,
    /// A JSON document.
    Json,
    /// UTF-8 text.
    Text,
}

/// What an operator writes when they record an outcome: the receipt and how to read it, why,
/// and who they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorReceipt {
    pub receipt: Vec<u8>,
    pub format: ReceiptFormat,
    pub note: String,
    /// The operator principal's name.
    pub operator: String,
}

/// What to do when a lease ends without Complete or Release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnExpiry {
    /// Refuse with LEASE_EXPIRED_UNRESOLVED until someone reconciles (the default).
    #[default]
    Reconcile,
    /// Grant a new token with a higher fencing number.
    Regrant,
}

/// A RequestToken, after validation and fingerprinting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRequest {
    pub fingerprint: String,
    pub digests: String,
    pub holder: String,
    /// The token to hand out if this request is granted.
    pub new_token: String,
    pub lease: Millis,
    pub retention: Millis,
    pub sliding: bool,
    pub on_expiry: OnExpiry,
    /// The principal asking: a live token is redelivered only to the principal (and holder) it
    /// was granted to.
    pub principal: String,
    /// The most superseded grants a record may keep: a regrant that would keep more is refused
    /// with `LEASE_EXPIRED_UNRESOLVED` instead (reconcile first).
    pub max_superseded: usize,
    /// A rule's hold: a new token needs an operator's approval first. Not the ledger's concern
    /// ([`request_token`] decides it with the approval).
    pub hold: Option<Hold>,
    /// The budget charges a new token makes (idem).
    pub charges: Vec<Charge>,
    /// The action type and the params as sent, stored with a new grant for a resolver's provider
    /// lookup (see [`Record::asked`]).
    pub asked: Asked,
}

/// What the latest grant of an action key was asked for: the action type and the params as sent
/// (JSON text). Kept while the grant's outcome is unknown, so that ListUnresolved and
/// WatchUnresolved can tell a resolver what to look up; dropped when the action completes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Asked {
    pub action: String,
    pub params: String,
}

/// A granted token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub token: String,
    pub fencing: u64,
    pub lease_expires_at: Millis,
}

/// How a grant came about (for metrics and audit; the wire shows `redelivered`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrantKind {
    /// The key had no live record.
    New,
    /// The same holder asked again while its lease was live: the same token.
    Redelivered,
    /// The lease had expired and the policy is `regrant`.
    Regranted,
}

/// A successful RequestToken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenOutcome {
    Granted(Grant, GrantKind),
    AlreadyCompleted(Completion),
    /// A rule holds the action for an operator's approval (never from the ledger alone).
    PendingApproval(Pending),
}

/// A successful Complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompleteOutcome {
    pub completion: Completion,
    /// False when the Complete repeated one already recorded with the same token.
    pub recorded: bool,
    /// True when the completing token had been superseded by a newer grant: the action may have
    /// run twice.
    pub double_execution: bool,
}

/// The state of an action as reported by GetAction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Absent,
    Authorized,
    Completed,
    Expired,
}

/// A read of one action key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionView {
    pub state: State,
    pub fencing: u64,
    pub fingerprint: String,
    pub lease_expires_at: Option<Millis>,
    pub completion: Option<Completion>,
    pub holder: String,
    /// The token whose outcome is unknown, while the action is unsettled (AUTHORIZED or EXPIRED:
    /// the live or expired grant, or the newest superseded grant still out); empty otherwise. It
    /// is what settling the action needs; who may see it is the caller's business (the gRPC
    /// layer shows it to operators only).
    pub token: String,
    /// The action type its grants were asked for, while the action is unsettled (AUTHORIZED or
    /// EXPIRED); empty otherwise, and in records written before it was kept. The fingerprint
    /// covers the action type, so it is the same for every grant of the key: what a resolver's
    /// `actions` scope is checked against before it settles (docs/CONTRACT.md §7).
    pub action: String,
    /// The params the latest grant was asked with, as sent (JSON text), while the action is
    /// unsettled; empty otherwise, and in records written before they were kept. What an
    /// operator asks the provider about (how much, to whom).
    pub params: String,
}

/// A request the state machine refuses; each maps to one ErrorInfo reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Same key, different request hash: the differing field names.
    KeyReused { differing: Vec<String> },
    /// Someone holds a live lease; `retry_after` is the time left on it.
    InProgress { retry_after: Millis },
    /// The lease ended unresolved (policy `reconcile`, or `regrant` with the superseded grants at
    /// their limit): `token` and `fencing` name the grant to reconcile, `expired_at` when its lease
    /// ended (for a superseded grant, when the newer token was released).
    LeaseExpired {
        token: String,
        fencing: u64,
        expired_at: Millis,
    },
    /// The token was never granted for this key (or was released).
    TokenMismatch,
    /// The key has no record.
    TokenUnknown,
    /// Another token (or an operator) completed the action.
    CompletedByOther { fencing: u64, completed_at: Millis },
    /// Release or ExtendLease of a completed action (or an operator completion of one).
    AlreadyCompleted,
    /// An operator completion of an action without a record must say what the action was, so
    /// that its request hash can be stored.
    RequestRequired,
    /// ResolveExpired of an action whose lease has not ended unresolved (absent or live).
    NotExpired { state: State },
    /// ResolveExpired with an expected fencing number of an action that is no longer unresolved
    /// with that number (another resolver or operator settled it, or a newer grant replaced it):
    /// its state and fencing number now.
    AlreadySettled { state: State, fencing: u64 },
    /// A budget would be exceeded by the grant: which, what its window holds and allows, what
    /// the grant would add, and when enough of it frees up.
    BudgetExceeded(Exceeded),
    /// An operator denied the approval this request needs.
    ApprovalDenied { id: String },
    /// DecideApproval of an approval that is not pending: its state, or `None` when there is no
    /// live approval with that id.
    ApprovalNotPending { state: Option<ApprovalState> },
}

/// What the store must persist after a step.
// A step's write is built once and moved into the store: boxing the record would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Nothing changes.
    Nothing,
    /// Replace the record (its `expires_at`, if any, is the store expiry).
    Put(Record),
}

/// A reply and the writes that must happen atomically with it: the record's, and the agent's
/// approval and budget buckets' ([`SideWrite`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step<T> {
    pub reply: Result<T, Refusal>,
    pub write: Write,
    pub side: SideWrite,
}

impl<T> Step<T> {
    fn refuse(refusal: Refusal) -> Self {
        Self {
            reply: Err(refusal),
            write: Write::Nothing,
            side: SideWrite::default(),
        }
    }
    fn reply(value: T, write: Write) -> Self {
        Self {
            reply: Ok(value),
            write,
            side: SideWrite::default(),
        }
    }
}

/// The refusal of a request whose hash differs from the stored one: the stored request's field
/// digests against the request's name the differing fields. Both stores answer with it (the Redis
/// scripts return the stored digests), so the fields are named the same way everywhere.
pub fn refuse_reused(stored_digests: &str, request_digests: &str) -> Refusal {
    Refusal::KeyReused {
        differing: fingerprint::differing_fields(stored_digests, request_digests),
    }
}

/// What an operator completion stores when the action has no record yet: the request hash (and
/// field digests) a later RequestToken must match, and the action policy's retention.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHash {
    pub fingerprint: String,
    pub digests: String,
    pub retention: Millis,
    pub sliding: bool,
}

/// An operator's record of an action done by hand, outside any agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalCompletion {
    pub written: OperatorReceipt,
    /// Required when the action has no record; checked against the stored hash otherwise.
    pub request: Option<RequestHash>,
}

/// How an operator settles an expired lease after reconciling with the provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// The effect happened: record it, as an operator completion.
    Completed(OperatorReceipt),
    /// The effect definitely did not happen: release (fencing kept), so the action can be granted
    /// again with a higher fencing number.
    Failed,
}

/// A successful ResolveExpired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    Completed(Completion),
    /// Settled as failed; the fencing number of the expired grant.
    Released {
        fencing: u64,
    },
}

/// A record that has passed its store expiry is treated as absent.
fn live(record: Option<&Record>, now: Millis) -> Option<&Record> {
    record.filter(|r| r.expires_at.is_none_or(|at| at > now))
}

#[cfg(test)]
mod tests;
