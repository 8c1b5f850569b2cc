//! The worker transitions: RequestToken, Complete, Release, ExtendLease, and the GetAction view.

use super::{
    ActionView, Asked, CompleteOutcome, Completion, Grant, GrantKind, Millis, OnExpiry, Phase,
    ReceiptFormat, Record, Refusal, Source, State, Step, TokenGrant, TokenOutcome, TokenRequest,
    Write, first_fencing, live, refuse_reused,
};

/// RequestToken against the record alone (the side state's part is [`super::side`]'s).
pub(super) fn request_token(
    record: Option<&Record>,
    req: &TokenRequest,
    now: Millis,
) -> Step<TokenOutcome> {
    let Some(rec) = live(record, now) else {
        return grant(req, first_fencing(now), Vec::new(), now, GrantKind::New);
    };
    if matches!(rec.phase, Phase::Released { .. }) && rec.older.is_empty() {
        // A plain tombstone: absent for every purpose but the fencing counter.
        return grant(req, rec.fencing + 1, Vec::new(), now, GrantKind::New);
    }
    if rec.fingerprint != req.fingerprint {
        return Step::refuse(refuse_reused(&rec.digests, &req.digests));
    }
    match &rec.phase {
        Phase::Completed(completion) => {
            let write = if rec.sliding {
                Write::Put(Record {
                    expires_at: Some(now + rec.retention),
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
            principal,
        } if now < *lease_expires_at => {
            // Only the holder that was granted, asking as the same principal, gets the token
            // back: a holder name alone is not a credential.
            if !req.holder.is_empty() && req.holder == *holder && req.principal == *principal {
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
        } => {
            let expired = TokenGrant {
                token: token.clone(),
                fencing: rec.fencing,
            };
            unresolved(rec, req, now, &expired, *lease_expires_at, true)
        }
        Phase::Released { at, .. } => {
            let pending = rec
                .older
                .last()
                .expect("a released record with no superseded grant is a tombstone");
            unresolved(rec, req, now, pending, *at, false)
        }
    }
}

/// A request meeting an unresolved grant (`expired`, whose lease ended `expired_at`): refused
/// under `reconcile`; under `regrant`, a new token, every superseded grant kept (and `expired`
/// joining them when `supersede`), unless that would keep more than the limit.
fn unresolved(
    rec: &Record,
    req: &TokenRequest,
    now: Millis,
    expired: &TokenGrant,
    expired_at: Millis,
    supersede: bool,
) -> Step<TokenOutcome> {
    let refusal = Refusal::LeaseExpired {
        token: expired.token.clone(),
        fencing: expired.fencing,
        expired_at,
    };
    if req.on_expiry == OnExpiry::Reconcile {
        return Step::refuse(refusal);
    }
    let mut older = rec.older.clone();
    if supersede {
        older.push(expired.clone());
    }
    if older.len() > req.max_superseded {
        return Step::refuse(refusal);
    }
    grant(req, rec.fencing + 1, older, now, GrantKind::Regranted)
}

pub(super) fn grant(
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
        // Kept until settled: an expired lease stays visible (EXPIRED) for reconciliation,
        // however long that takes, instead of silently becoming grantable.
        expires_at: None,
        older,
        reservations: Vec::new(),
        asked: req.asked.clone(),
        phase: Phase::Authorized {
            token: req.new_token.clone(),
            holder: req.holder.clone(),
            lease_expires_at,
            principal: req.principal.clone(),
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
    let superseded = rec.older.iter().find(|g| g.token == token);
    match (&rec.phase, superseded) {
        (Phase::Completed(done), _) if done.token == token && done.source == Source::Worker => {
            let outcome = CompleteOutcome {
                completion: done.clone(),
                recorded: false,
                double_execution: false,
            };
            Step::reply(outcome, Write::Nothing)
        }
        (Phase::Completed(done), Some(_)) => Step::refuse(Refusal::CompletedByOther {
            fencing: done.fencing,
            completed_at: done.completed_at,
        }),
        (Phase::Authorized { token: live, .. }, _) if live == token => {
            record_completion(rec, token, rec.fencing, receipt, now, false)
        }
        // A superseded holder finished after a newer grant: the effect happened, so it is
        // recorded, and the newer holder will hear COMPLETED_BY_OTHER.
        (Phase::Authorized { token: live, .. }, Some(old)) => {
            let mut rec = rec.clone();
            rec.older.push(TokenGrant {
                token: live.clone(),
                fencing: rec.fencing,
            });
            record_completion(&rec, token, old.fencing, receipt, now, true)
        }
        // The newer grant was released (it definitely had no effect): the superseded one's
        // effect is the only one.
        (Phase::Released { .. }, Some(old)) => {
            record_completion(rec, token, old.fencing, receipt, now, false)
        }
        (Phase::Completed(_) | Phase::Authorized { .. } | Phase::Released { .. }, _) => {
            Step::refuse(Refusal::TokenMismatch)
        }
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
        seq: 0,
        statement: String::new(),
        format: ReceiptFormat::Unspecified,
    };
    let older = rec
        .older
        .iter()
        .filter(|g| g.token != token)
        .cloned()
        .collect();
    let record = Record {
        expires_at: Some(now + rec.retention),
        older,
        phase: Phase::Completed(completion.clone()),
        asked: Asked::default(),
        ..rec.clone()
    };
    let outcome = CompleteOutcome {
        completion,
        recorded: true,
        double_execution,
    };
    Step::reply(outcome, Write::Put(record))
}

/// Release: gives the live (or expired) token back; the fencing number and the superseded grants
/// are kept (budgets: [`super::side`]).
pub(super) fn release(record: Option<&Record>, token: &str, now: Millis) -> Step<u64> {
    let Some(rec) = live(record, now) else {
        return Step::refuse(Refusal::TokenUnknown);
    };
    match &rec.phase {
        Phase::Authorized { token: live, .. } if live == token => {
            let record = Record {
                expires_at: rec.settled_expiry(now),
                phase: Phase::Released {
                    token: token.to_owned(),
                    at: now,
                },
                ..rec.clone()
            };
            Step::reply(rec.fencing, Write::Put(record))
        }
        // Releasing twice is a no-op, so a worker whose first Release reply was lost can retry.
        Phase::Released {
            token: released, ..
        } if released == token => Step::reply(rec.fencing, Write::Nothing),
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
            principal,
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
                phase: Phase::Authorized {
                    token: live.clone(),
                    holder: holder.clone(),
                    lease_expires_at,
                    principal: principal.clone(),
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
            token: String::new(),
            action: String::new(),
            params: String::new(),
        };
    };
    let mut fencing = rec.fencing;
    let (state, lease_expires_at, completion, holder, token) = match &rec.phase {
        Phase::Authorized {
            token,
            holder,
            lease_expires_at,
            ..
        } => {
            let state = if now < *lease_expires_at {
                State::Authorized
            } else {
                State::Expired
            };
            (
                state,
                Some(*lease_expires_at),
                None,
                holder.clone(),
                token.clone(),
            )
        }
        Phase::Completed(done) => (
            State::Completed,
            None,
            Some(done.clone()),
            String::new(),
            String::new(),
        ),
        Phase::Released { at, .. } => match rec.pending_superseded() {
            Some(pending) => {
                fencing = pending.fencing;
                (
                    State::Expired,
                    Some(*at),
                    None,
                    String::new(),
                    pending.token.clone(),
                )
            }
            None => (State::Absent, None, None, String::new(), String::new()),
        },
    };
    let (action, params) = match state {
        State::Authorized | State::Expired => (rec.asked.action.clone(), rec.asked.params.clone()),
        State::Absent | State::Completed => (String::new(), String::new()),
    };
    ActionView {
        state,
        fencing,
        fingerprint: rec.fingerprint.clone(),
        lease_expires_at,
        completion,
        holder,
        token,
        action,
        params,
    }
}
