//! The operator transitions: an external completion (an action done by hand) and the settlement
//! of an expired lease, and what ListUnresolved lists.

use super::{
    Asked, CompleteOutcome, Completion, ExternalCompletion, Millis, OperatorReceipt, Phase, Record,
    Refusal, Resolution, Resolved, Source, State, Step, TokenGrant, Write, live, refuse_reused,
    view,
};

/// A completion recorded by an operator, with the live token (if any) moved to `older` so that
/// its holder's later Complete hears COMPLETED_BY_OTHER: the action may then have run twice.
fn operator_completion(
    rec: &Record,
    written: &OperatorReceipt,
    now: Millis,
) -> (Completion, Record) {
    let completion = Completion {
        receipt: written.receipt.clone(),
        completed_at: now,
        fencing: rec.fencing,
        token: String::new(),
        source: Source::Operator,
        note: written.note.clone(),
        operator: written.operator.clone(),
        seq: 0,
        statement: String::new(),
        format: written.format,
    };
    let mut older = rec.older.clone();
    if let Phase::Authorized { token, .. } = &rec.phase {
        older.push(TokenGrant {
            token: token.clone(),
            fencing: rec.fencing,
        });
    }
    let record = Record {
        expires_at: Some(now + rec.retention),
        older,
        phase: Phase::Completed(completion.clone()),
        asked: Asked::default(),
        ..rec.clone()
    };
    (completion, record)
}

/// RecordExternalCompletion: an operator marks an action completed (done by hand). Works on an
/// absent action (with the request hash), a live or expired lease, or superseded grants still out
/// (their holders later hear COMPLETED_BY_OTHER); repeating the same operator completion is a
/// no-op; an action already completed otherwise is refused.
pub fn record_external(
    record: Option<&Record>,
    ext: &ExternalCompletion,
    now: Millis,
) -> Step<CompleteOutcome> {
    let record = live(record, now);
    // A plain tombstone binds nothing; any other record binds the key to its request.
    let bound =
        record.filter(|r| !(matches!(r.phase, Phase::Released { .. }) && r.older.is_empty()));
    if let (Some(rec), Some(req)) = (bound, &ext.request)
        && rec.fingerprint != req.fingerprint
    {
        return Step::refuse(refuse_reused(&rec.digests, &req.digests));
    }
    let Some(rec) = bound else {
        let Some(req) = &ext.request else {
            return Step::refuse(Refusal::RequestRequired);
        };
        let base = Record {
            fencing: record.map_or(0, |r| r.fencing),
            fingerprint: req.fingerprint.clone(),
            digests: req.digests.clone(),
            retention: req.retention,
            sliding: req.sliding,
            expires_at: Some(now + req.retention),
            older: Vec::new(),
            reservations: Vec::new(),
            asked: Asked::default(),
            phase: Phase::Released {
                token: String::new(),
                at: now,
            },
        };
        let (completion, record) = operator_completion(&base, &ext.written, now);
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
                && done.receipt == ext.written.receipt
                && done.format == ext.written.format
                && done.operator == ext.written.operator =>
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
            let (completion, record) = operator_completion(rec, &ext.written, now);
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
/// (an operator completion) or failed (released, fencing kept). A released action with
/// superseded grants still out is settled one grant at a time, the newest first: failed removes
/// that grant (the action stays unresolved while older ones remain). Anything else is refused.
///
/// With `expected` (a resolver's fencing number, read from ListUnresolved or WatchUnresolved), it
/// settles only the grant with that number while it is unresolved: a second resolver of the same
/// grant is refused (`AlreadyCompleted`, or `AlreadySettled` with the action's state now), so two
/// resolvers never settle one grant twice or differently.
pub(super) fn resolve_expired(
    record: Option<&Record>,
    resolution: &Resolution,
    expected: Option<u64>,
    now: Millis,
) -> Step<Resolved> {
    let current = view(record, now);
    let rec = match (live(record, now), current.state) {
        (_, State::Completed) => return Step::refuse(Refusal::AlreadyCompleted),
        (Some(rec), State::Expired) if expected.is_none_or(|f| f == current.fencing) => rec,
        (_, state) if expected.is_some() => {
            return Step::refuse(Refusal::AlreadySettled {
                state,
                fencing: current.fencing,
            });
        }
        (_, state) => return Step::refuse(Refusal::NotExpired { state }),
    };
    match resolution {
        Resolution::Completed(written) => {
            let (completion, record) = operator_completion(rec, written, now);
            Step::reply(Resolved::Completed(completion), Write::Put(record))
        }
        Resolution::Failed => {
            let mut record = rec.clone();
            if let Phase::Authorized { token, .. } = &rec.phase {
                record.phase = Phase::Released {
                    token: token.clone(),
                    at: now,
                };
            } else {
                record.older.pop();
            }
            record.expires_at = record.settled_expiry(now);
            Step::reply(
                Resolved::Released {
                    fencing: current.fencing,
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
