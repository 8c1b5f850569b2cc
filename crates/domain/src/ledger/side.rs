//! The steps that read and write an agent's side state besides the record: approvals
//! ([`super::approval`]) and budgets ([`super::budget`]) around RequestToken, Release and
//! ResolveExpired. The stateless rules (Cedar) are the gate's and run before the store; what needs
//! state (an approval, a budget's window) is decided here, in the same atomic step as the grant, so
//! two replicas can never both spend the last of a budget.
//!
//! Only a grant that would write a new token (new or regrant) is held or charged: a redelivery,
//! a replay and every refusal are the record's answer unchanged. A hold is decided before the
//! budgets (an operator approves a request, the budget then decides whether it fits now); a
//! refusal by either writes nothing, so an approval is used only by a grant.
//!
//! The embedded store runs these steps; the Redis scripts mirror them (`prelude.lua`'s budget
//! and approval helpers); the conformance suite holds both to them.

use std::collections::BTreeMap;

use super::{
    GrantKind, Millis, Record, Refusal, Resolution, Resolved, Step, TokenOutcome, TokenRequest,
    Write, approval, budget, live, operator, refuse_reused, worker,
};

/// The state of one agent a step may read besides the record: the action key's approval and the
/// budget buckets the step touches (absent ones have used nothing).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Side {
    pub approval: Option<approval::Approval>,
    pub buckets: BTreeMap<String, budget::Bucket>,
}

/// What a step writes besides the record: an approval to store, buckets to replace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SideWrite {
    pub approval: Option<approval::Approval>,
    pub buckets: BTreeMap<String, budget::Bucket>,
}

/// RequestToken with holds and budgets: the ledger decides; a new token is then held (unless an
/// approval covers it) and charged (all budgets or none).
pub fn request_token(
    record: Option<&Record>,
    side: &Side,
    req: &TokenRequest,
    now: Millis,
) -> Step<TokenOutcome> {
    let step = worker::request_token(record, req, now);
    let (grant, kind, mut rec) = match step {
        Step {
            reply: Ok(TokenOutcome::Granted(grant, kind)),
            write: Write::Put(rec),
            ..
        } if kind != GrantKind::Redelivered => (grant, kind, rec),
        step => return step,
    };
    let mut write = SideWrite::default();
    if let Some(hold) = &req.hold {
        let stored = side.approval.as_ref();
        match approval::meet(stored, hold, &req.fingerprint, &req.digests, now) {
            approval::Met::Covered(used) => write.approval = Some(used),
            approval::Met::Wait { pending, store } => {
                return Step {
                    reply: Ok(TokenOutcome::PendingApproval(pending)),
                    write: Write::Nothing,
                    side: SideWrite {
                        approval: store,
                        buckets: BTreeMap::new(),
                    },
                };
            }
            approval::Met::Denied { id } => return Step::refuse(Refusal::ApprovalDenied { id }),
            approval::Met::OtherRequest { digests } => {
                return Step::refuse(refuse_reused(&digests, &req.digests));
            }
        }
    }
    if kind == GrantKind::Regranted {
        // The superseded grants' reservations stay: their outcome is unknown.
        rec.reservations = live(record, now)
            .map(|r| r.reservations.clone())
            .unwrap_or_default();
    }
    if !req.charges.is_empty() {
        let mut buckets = side.buckets.clone();
        match budget::charge(&mut buckets, &req.charges, grant.fencing, now) {
            Ok(reserved) => rec.reservations.extend(reserved),
            Err(exceeded) => return Step::refuse(Refusal::BudgetExceeded(exceeded)),
        }
        write.buckets = buckets;
    }
    Step {
        reply: Ok(TokenOutcome::Granted(grant, kind)),
        write: Write::Put(rec),
        side: write,
    }
}

/// Release with budgets: the released grant's reservations go back to their buckets.
pub fn release(record: Option<&Record>, side: &Side, token: &str, now: Millis) -> Step<u64> {
    let step = worker::release(record, token, now);
    let Step {
        reply: Ok(fencing),
        write: Write::Put(mut rec),
        ..
    } = step
    else {
        return step;
    };
    let side = give_back(&mut rec, side, fencing);
    Step {
        reply: Ok(fencing),
        write: Write::Put(rec),
        side,
    }
}

/// ResolveExpired with budgets: settled as failed (the grant definitely had no effect), the
/// grant's reservations go back, as a Release's do; settled as completed, they stay spent.
pub fn resolve_expired(
    record: Option<&Record>,
    side: &Side,
    resolution: &Resolution,
    expected: Option<u64>,
    now: Millis,
) -> Step<Resolved> {
    let step = operator::resolve_expired(record, resolution, expected, now);
    let Step {
        reply: Ok(Resolved::Released { fencing }),
        write: Write::Put(mut rec),
        ..
    } = step
    else {
        return step;
    };
    let side = give_back(&mut rec, side, fencing);
    Step {
        reply: Ok(Resolved::Released { fencing }),
        write: Write::Put(rec),
        side,
    }
}

/// Takes the reservations of the grant with `fencing` out of `rec` and gives them back to their
/// buckets (a bucket with nothing stored has nothing in the window to give back to).
fn give_back(rec: &mut Record, side: &Side, fencing: u64) -> SideWrite {
    let mut write = SideWrite::default();
    let (back, kept) = std::mem::take(&mut rec.reservations)
        .into_iter()
        .partition::<Vec<_>, _>(|r| r.fencing == fencing);
    rec.reservations = kept;
    for r in back {
        let Some(stored) = side.buckets.get(&r.bucket) else {
            continue;
        };
        let bucket = write
            .buckets
            .entry(r.bucket.clone())
            .or_insert_with(|| stored.clone());
        bucket.give_back(r.slot, r.amount);
    }
    write
}

/// The buckets a Release of `record` may give back to (what a store loads before [`release`]).
pub fn reserved_buckets(record: Option<&Record>) -> Vec<String> {
    let mut ids: Vec<String> = record
        .map(|r| r.reservations.iter().map(|r| r.bucket.clone()).collect())
        .unwrap_or_default();
    ids.sort();
    ids.dedup();
    ids
}
