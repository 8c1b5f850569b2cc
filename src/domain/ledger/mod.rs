//! The action state machine: `(stored record, request, now) → (reply, write)`. No IO, no clock, no
//! randomness: the caller passes the store's time and a fresh token in.
//!
//! This is the reference semantics (SPEC.md "States" and "The RPCs"). The embedded store runs it
//! inside a write transaction; the Redis store's Lua scripts mirror it and the conformance suite
//! checks them against it.

use serde::{Deserialize, Serialize};

use crate::domain::fingerprint;

/// Milliseconds since the Unix epoch, on the store's clock.
pub type Millis = i64;

/// One action key's stored record. A record whose `expires_at` has passed does not exist.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The fencing number of the latest grant; grows with every grant, kept across Release.
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
    /// When the store forgets this record.
    pub expires_at: Millis,
    /// Earlier grants of this key that were neither released nor completed: a late Complete with
    /// one of them is still recorded (the effect happened) and counts as a double execution.
    pub older: Vec<TokenGrant>,
    /// Where the action stands.
    pub phase: Phase,
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
    },
    /// The action completed.
    Completed(Completion),
    /// The last token was released: ABSENT for every purpose but the fencing counter.
    Released { token: String },
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
}

/// A request the state machine refuses; each maps to one ErrorInfo reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Same key, different request hash: the differing field names.
    KeyReused { differing: Vec<String> },
    /// Someone holds a live lease; `retry_after` is the time left on it.
    InProgress { retry_after: Millis },
    /// The lease ended unresolved (policy `reconcile`).
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
}

/// What the store must persist after a step.
// A step's write is built once and moved into the store: boxing the record would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Nothing changes.
    Nothing,
    /// Replace the record (its `expires_at` is the store expiry).
    Put(Record),
}

/// A reply and the write that must happen atomically with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step<T> {
    pub reply: Result<T, Refusal>,
    pub write: Write,
}

impl<T> Step<T> {
    fn refuse(refusal: Refusal) -> Self {
        Self {
            reply: Err(refusal),
            write: Write::Nothing,
        }
    }
    fn reply(value: T, write: Write) -> Self {
        Self {
            reply: Ok(value),
            write,
        }
    }
}

/// A record that has passed its store expiry is treated as absent.
fn live(record: Option<&Record>, now: Millis) -> Option<&Record> {
    record.filter(|r| r.expires_at > now)
}

/// RequestToken.
pub fn request_token(
    record: Option<&Record>,
    req: &TokenRequest,
    now: Millis,
) -> Step<TokenOutcome> {
    let record = live(record, now);
    let Some(rec) = record.filter(|r| !matches!(r.phase, Phase::Released { .. })) else {
        let fencing = record.map_or(0, |r| r.fencing) + 1;
        return grant(req, fencing, Vec::new(), now, GrantKind::New);
    };
    if rec.fingerprint != req.fingerprint {
        let differing = fingerprint::differing_fields(&rec.digests, &req.digests);
        return Step::refuse(Refusal::KeyReused { differing });
    }
    match &rec.phase {
        Phase::Completed(completion) => {
            let write = if rec.sliding {
                Write::Put(Record {
                    expires_at: now + rec.retention,
                    ..rec.clone()
                })
            } else {
                Write::Nothing
            };
            Step::reply(TokenOutcome::AlreadyCompleted(completion.clone()), write)
        }
        Phase::Authorized {
            token,
            holder,
            lease_expires_at,
        } if now < *lease_expires_at => {
            if !req.holder.is_empty() && req.holder == *holder {
                let grant = Grant {
                    token: token.clone(),
                    fencing: rec.fencing,
                    lease_expires_at: *lease_expires_at,
                };
                Step::reply(
                    TokenOutcome::Granted(grant, GrantKind::Redelivered),
                    Write::Nothing,
                )
            } else {
                Step::refuse(Refusal::InProgress {
                    retry_after: lease_expires_at - now,
                })
            }
        }
        Phase::Authorized {
            token,
            lease_expires_at,
            ..
        } => match req.on_expiry {
            OnExpiry::Reconcile => Step::refuse(Refusal::LeaseExpired {
                token: token.clone(),
                fencing: rec.fencing,
                expired_at: *lease_expires_at,
            }),
            OnExpiry::Regrant => {
                let mut older = rec.older.clone();
                older.push(TokenGrant {
                    token: token.clone(),
                    fencing: rec.fencing,
                });
                grant(req, rec.fencing + 1, older, now, GrantKind::Regranted)
            }
        },
        Phase::Released { .. } => unreachable!("released records are filtered above"),
    }
}

fn grant(
    req: &TokenRequest,
    fencing: u64,
    older: Vec<TokenGrant>,
    now: Millis,
    kind: GrantKind,
) -> Step<TokenOutcome> {
    let lease_expires_at = now + req.lease;
    let record = Record {
        fencing,
        fingerprint: req.fingerprint.clone(),
        digests: req.digests.clone(),
        retention: req.retention,
        sliding: req.sliding,
        // The record outlives its lease by the retention window, so an expired lease stays
        // visible (EXPIRED) for reconciliation instead of silently becoming grantable.
        expires_at: lease_expires_at + req.retention,
        older,
        phase: Phase::Authorized {
            token: req.new_token.clone(),
            holder: req.holder.clone(),
            lease_expires_at,
        },
    };
    let grant = Grant {
        token: req.new_token.clone(),
        fencing,
        lease_expires_at,
    };
    Step::reply(TokenOutcome::Granted(grant, kind), Write::Put(record))
}

/// Complete.
pub fn complete(
    record: Option<&Record>,
    token: &str,
    receipt: &[u8],
    now: Millis,
) -> Step<CompleteOutcome> {
    let Some(rec) = live(record, now) else {
        return Step::refuse(Refusal::TokenUnknown);
    };
    match &rec.phase {
        Phase::Completed(done) if done.token == token && done.source == Source::Worker => {
            let outcome = CompleteOutcome {
                completion: done.clone(),
                recorded: false,
                double_execution: false,
            };
            Step::reply(outcome, Write::Nothing)
        }
        Phase::Completed(done) => {
            if rec.older.iter().any(|g| g.token == token) {
                Step::refuse(Refusal::CompletedByOther {
                    fencing: done.fencing,
                    completed_at: done.completed_at,
                })
            } else {
                Step::refuse(Refusal::TokenMismatch)
            }
        }
        Phase::Authorized { token: live, .. } if live == token => {
            record_completion(rec, token, rec.fencing, receipt, now, false)
        }
        Phase::Authorized { token: live, .. } => {
            match rec.older.iter().find(|g| g.token == token) {
                // A superseded holder finished after a newer grant: the effect happened, so it is
                // recorded, and the newer holder will hear COMPLETED_BY_OTHER.
                Some(old) => {
                    let fencing = old.fencing;
                    let mut rec = rec.clone();
                    rec.older.push(TokenGrant {
                        token: live.clone(),
                        fencing: rec.fencing,
                    });
                    record_completion(&rec, token, fencing, receipt, now, true)
                }
                None => Step::refuse(Refusal::TokenMismatch),
            }
        }
        Phase::Released { .. } => Step::refuse(Refusal::TokenMismatch),
    }
}

fn record_completion(
    rec: &Record,
    token: &str,
    fencing: u64,
    receipt: &[u8],
    now: Millis,
    double_execution: bool,
) -> Step<CompleteOutcome> {
    let completion = Completion {
        receipt: receipt.to_vec(),
        completed_at: now,
        fencing,
        token: token.to_owned(),
        source: Source::Worker,
        note: String::new(),
        operator: String::new(),
    };
    let older = rec
        .older
        .iter()
        .filter(|g| g.token != token)
        .cloned()
        .collect();
    let record = Record {
        expires_at: now + rec.retention,
        older,
        phase: Phase::Completed(completion.clone()),
        ..rec.clone()
    };
    let outcome = CompleteOutcome {
        completion,
        recorded: true,
        double_execution,
    };
    Step::reply(outcome, Write::Put(record))
}

/// Release: gives the live (or expired) token back; the fencing number is kept.
pub fn release(record: Option<&Record>, token: &str, now: Millis) -> Step<u64> {
    let Some(rec) = live(record, now) else {
        return Step::refuse(Refusal::TokenUnknown);
    };
    match &rec.phase {
        Phase::Authorized { token: live, .. } if live == token => {
            let record = Record {
                expires_at: now + rec.retention,
                phase: Phase::Released {
                    token: token.to_owned(),
                },
                ..rec.clone()
            };
            Step::reply(rec.fencing, Write::Put(record))
        }
        // Releasing twice is a no-op, so a worker whose first Release reply was lost can retry.
        Phase::Released { token: released } if released == token => {
            Step::reply(rec.fencing, Write::Nothing)
        }
        Phase::Completed(_) => Step::refuse(Refusal::AlreadyCompleted),
        Phase::Authorized { .. } | Phase::Released { .. } => Step::refuse(Refusal::TokenMismatch),
    }
}

/// ExtendLease: only the holder of a live lease may extend it.
pub fn extend_lease(
    record: Option<&Record>,
    token: &str,
    ttl: Millis,
    now: Millis,
) -> Step<Millis> {
    let Some(rec) = live(record, now) else {
        return Step::refuse(Refusal::TokenUnknown);
    };
    match &rec.phase {
        Phase::Authorized {
            token: live,
            holder,
            lease_expires_at,
        } if live == token => {
            if now >= *lease_expires_at {
                return Step::refuse(Refusal::LeaseExpired {
                    token: live.clone(),
                    fencing: rec.fencing,
                    expired_at: *lease_expires_at,
                });
            }
            let lease_expires_at = now + ttl;
            let record = Record {
                expires_at: lease_expires_at + rec.retention,
                phase: Phase::Authorized {
                    token: live.clone(),
                    holder: holder.clone(),
                    lease_expires_at,
                },
                ..rec.clone()
            };
            Step::reply(lease_expires_at, Write::Put(record))
        }
        Phase::Completed(_) => Step::refuse(Refusal::AlreadyCompleted),
        Phase::Authorized { .. } | Phase::Released { .. } => Step::refuse(Refusal::TokenMismatch),
    }
}

/// GetAction.
pub fn view(record: Option<&Record>, now: Millis) -> ActionView {
    let Some(rec) = live(record, now) else {
        return ActionView {
            state: State::Absent,
            fencing: 0,
            fingerprint: String::new(),
            lease_expires_at: None,
            completion: None,
            holder: String::new(),
        };
    };
    let (state, lease_expires_at, completion, holder) = match &rec.phase {
        Phase::Authorized {
            holder,
            lease_expires_at,
            ..
        } => {
            let state = if now < *lease_expires_at {
                State::Authorized
            } else {
                State::Expired
            };
            (state, Some(*lease_expires_at), None, holder.clone())
        }
        Phase::Completed(done) => (State::Completed, None, Some(done.clone()), String::new()),
        Phase::Released { .. } => (State::Absent, None, None, String::new()),
    };
    ActionView {
        state,
        fencing: rec.fencing,
        fingerprint: rec.fingerprint.clone(),
        lease_expires_at,
        completion,
        holder,
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
    pub receipt: Vec<u8>,
    pub note: String,
    /// The operator principal's name.
    pub operator: String,
    /// Required when the action has no record; checked against the stored hash otherwise.
    pub request: Option<RequestHash>,
}

/// How an operator settles an expired lease after reconciling with the provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// The effect happened: record it, as an operator completion.
    Completed {
        receipt: Vec<u8>,
        note: String,
        operator: String,
    },
    /// The effect definitely did not happen: release (fencing kept), so the action can be granted
    /// again with a higher fencing number.
    Failed,
}

/// A successful ResolveExpired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    Completed(Completion),
    /// Released; the fencing number of the expired grant.
    Released {
        fencing: u64,
    },
}

/// A completion recorded by an operator, with the live token (if any) moved to `older` so that
/// its holder's later Complete hears COMPLETED_BY_OTHER: the action may then have run twice.
fn operator_completion(
    rec: &Record,
    receipt: &[u8],
    note: &str,
    operator: &str,
    now: Millis,
) -> (Completion, Record) {
    let completion = Completion {
        receipt: receipt.to_vec(),
        completed_at: now,
        fencing: rec.fencing,
        token: String::new(),
        source: Source::Operator,
        note: note.to_owned(),
        operator: operator.to_owned(),
    };
    let mut older = rec.older.clone();
    if let Phase::Authorized { token, .. } = &rec.phase {
        older.push(TokenGrant {
            token: token.clone(),
            fencing: rec.fencing,
        });
    }
    let record = Record {
        expires_at: now + rec.retention,
        older,
        phase: Phase::Completed(completion.clone()),
        ..rec.clone()
    };
    (completion, record)
}

/// RecordExternalCompletion: an operator marks an action completed (done by hand). Works on an
/// absent action (with the request hash), a live or expired lease (the holder later hears
/// COMPLETED_BY_OTHER); repeating the same operator completion is a no-op; an action already
/// completed otherwise is refused.
pub fn record_external(
    record: Option<&Record>,
    ext: &ExternalCompletion,
    now: Millis,
) -> Step<CompleteOutcome> {
    let record = live(record, now);
    if let (Some(rec), Some(req)) = (record, &ext.request)
        && !matches!(rec.phase, Phase::Released { .. })
        && rec.fingerprint != req.fingerprint
    {
        let differing = fingerprint::differing_fields(&rec.digests, &req.digests);
        return Step::refuse(Refusal::KeyReused { differing });
    }
    let Some(rec) = record.filter(|r| !matches!(r.phase, Phase::Released { .. })) else {
        let Some(req) = &ext.request else {
            return Step::refuse(Refusal::RequestRequired);
        };
        let base = Record {
            fencing: record.map_or(0, |r| r.fencing),
            fingerprint: req.fingerprint.clone(),
            digests: req.digests.clone(),
            retention: req.retention,
            sliding: req.sliding,
            expires_at: now + req.retention,
            older: Vec::new(),
            phase: Phase::Released {
                token: String::new(),
            },
        };
        let (completion, record) =
            operator_completion(&base, &ext.receipt, &ext.note, &ext.operator, now);
        let outcome = CompleteOutcome {
            completion,
            recorded: true,
            double_execution: false,
        };
        return Step::reply(outcome, Write::Put(record));
    };
    match &rec.phase {
        Phase::Completed(done)
            if done.source == Source::Operator
                && done.receipt == ext.receipt
                && done.operator == ext.operator =>
        {
            let outcome = CompleteOutcome {
                completion: done.clone(),
                recorded: false,
                double_execution: false,
            };
            Step::reply(outcome, Write::Nothing)
        }
        Phase::Completed(_) => Step::refuse(Refusal::AlreadyCompleted),
        _ => {
            let (completion, record) =
                operator_completion(rec, &ext.receipt, &ext.note, &ext.operator, now);
            let outcome = CompleteOutcome {
                completion,
                recorded: true,
                double_execution: false,
            };
            Step::reply(outcome, Write::Put(record))
        }
    }
}

/// ResolveExpired: settles an action whose lease ended without Complete or Release, as completed
/// (an operator completion) or failed (released, fencing kept). Anything else is refused.
pub fn resolve_expired(
    record: Option<&Record>,
    resolution: &Resolution,
    now: Millis,
) -> Step<Resolved> {
    let current = view(record, now);
    let rec = match (live(record, now), current.state) {
        (Some(rec), State::Expired) => rec,
        (_, State::Completed) => return Step::refuse(Refusal::AlreadyCompleted),
        (_, state) => return Step::refuse(Refusal::NotExpired { state }),
    };
    let Phase::Authorized { token, .. } = &rec.phase else {
        unreachable!("an expired record is authorized");
    };
    match resolution {
        Resolution::Completed {
            receipt,
            note,
            operator,
        } => {
            let (completion, record) = operator_completion(rec, receipt, note, operator, now);
            Step::reply(Resolved::Completed(completion), Write::Put(record))
        }
        Resolution::Failed => {
            let record = Record {
                expires_at: now + rec.retention,
                phase: Phase::Released {
                    token: token.clone(),
                },
                ..rec.clone()
            };
            Step::reply(
                Resolved::Released {
                    fencing: rec.fencing,
                },
                Write::Put(record),
            )
        }
    }
}

/// Whether a record is an unresolved expired lease at `now` (what ListUnresolved lists).
pub fn is_unresolved(record: Option<&Record>, now: Millis) -> bool {
    view(record, now).state == State::Expired
}

#[cfg(test)]
mod tests;
