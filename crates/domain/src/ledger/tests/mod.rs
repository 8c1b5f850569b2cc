//! Table and property tests of the pure state machine, with injected time: the worker transitions
//! here, the operator ones in [`operator`], random sequences in [`properties`].

mod operator;
mod properties;
mod superseded;

use super::*;
// The record's part of the steps (the side state has tests of its own: budget, approval).
use super::{
    operator::resolve_expired,
    worker::{release, request_token},
};

pub(super) const LEASE: Millis = 1_000;
pub(super) const RETENTION: Millis = 10_000;
pub(super) const MAX_SUPERSEDED: usize = 3;

pub(super) fn req(fp: &str, holder: &str, token: &str, on_expiry: OnExpiry) -> TokenRequest {
    TokenRequest {
        fingerprint: fp.into(),
        digests: format!("action=00\n/amount={fp}\n"),
        holder: holder.into(),
        new_token: token.into(),
        lease: LEASE,
        retention: RETENTION,
        sliding: true,
        on_expiry,
        principal: "p".into(),
        max_superseded: MAX_SUPERSEDED,
        hold: None,
        charges: Vec::new(),
        asked: Asked {
            action: "payments.transfer".into(),
            params: format!(r#"{{"fp":"{fp}"}}"#),
        },
    }
}

/// Applies a step's write to `rec` and returns its reply.
pub(super) fn run<T>(
    rec: &mut Option<Record>,
    f: impl FnOnce(Option<&Record>) -> Step<T>,
) -> Result<T, Refusal> {
    let step = f(rec.as_ref());
    apply(rec, step)
}

pub(super) fn apply<T>(rec: &mut Option<Record>, step: Step<T>) -> Result<T, Refusal> {
    if let Write::Put(new) = step.write {
        *rec = Some(new);
    }
    step.reply
}

pub(super) fn granted(result: Result<TokenOutcome, Refusal>) -> Grant {
    match result {
        Ok(TokenOutcome::Granted(grant, _)) => grant,
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[test]
fn absent_grants_with_the_clock_as_fencing_and_a_lease() {
    let mut rec = None;
    let r = run(&mut rec, |r| {
        request_token(r, &req("f", "", "t1", OnExpiry::Reconcile), 100)
    });
    assert_eq!(
        r,
        Ok(TokenOutcome::Granted(
            Grant {
                token: "t1".into(),
                fencing: first_fencing(100),
                lease_expires_at: 100 + LEASE
            },
            GrantKind::New
        ))
    );
    assert_eq!(view(rec.as_ref(), 101).state, State::Authorized);
}

#[test]
fn live_lease_redelivers_to_the_same_holder_only() {
    let mut rec = None;
    run(&mut rec, |_| {
        request_token(None, &req("f", "w1", "t1", OnExpiry::Reconcile), 0)
    })
    .unwrap();
    let again = run(&mut rec, |r| {
        request_token(r, &req("f", "w1", "t2", OnExpiry::Reconcile), 10)
    });
    assert!(
        matches!(again, Ok(TokenOutcome::Granted(ref g, GrantKind::Redelivered)) if g.token == "t1")
    );
    for holder in ["", "w2"] {
        let other = run(&mut rec, |r| {
            request_token(r, &req("f", holder, "t3", OnExpiry::Reconcile), 10)
        });
        assert_eq!(
            other,
            Err(Refusal::InProgress {
                retry_after: LEASE - 10
            })
        );
    }
    // An anonymous first holder never gets redelivery: "" is nobody.
    let mut rec = None;
    run(&mut rec, |_| {
        request_token(None, &req("f", "", "t1", OnExpiry::Reconcile), 0)
    })
    .unwrap();
    let anon = run(&mut rec, |r| {
        request_token(r, &req("f", "", "t2", OnExpiry::Reconcile), 1)
    });
    assert!(matches!(anon, Err(Refusal::InProgress { .. })));
}

#[test]
fn completed_replays_and_slides_retention() {
    let mut rec = None;
    let g = granted(run(&mut rec, |_| {
        request_token(None, &req("f", "", "t1", OnExpiry::Reconcile), 0)
    }));
    let done = run(&mut rec, |r| complete(r, &g.token, b"receipt", 50)).unwrap();
    assert!(done.recorded && !done.double_execution);
    let replay = run(&mut rec, |r| {
        request_token(r, &req("f", "", "t2", OnExpiry::Reconcile), 5_000)
    });
    assert_eq!(
        replay,
        Ok(TokenOutcome::AlreadyCompleted(done.completion.clone()))
    );
    assert_eq!(
        rec.as_ref().unwrap().expires_at,
        Some(5_000 + RETENTION),
        "sliding retention refreshed"
    );
    // Past retention the record is gone and the same request is a new action, whose fencing
    // number is still above every earlier one.
    let later = 5_000 + RETENTION;
    let fresh = granted(run(&mut rec, |r| {
        request_token(r, &req("f", "", "t3", OnExpiry::Reconcile), later)
    }));
    assert_eq!(fresh.fencing, first_fencing(later));
    assert!(fresh.fencing > g.fencing);
}

#[test]
fn an_expired_lease_is_never_forgotten() {
    let mut rec = None;
    let g = granted(run(&mut rec, |_| {
        request_token(None, &req("f", "w", "t1", OnExpiry::Reconcile), 0)
    }));
    assert_eq!(rec.as_ref().unwrap().expires_at, None, "no store expiry");
    // Long past lease end + retention: still EXPIRED, still refused, still listed.
    let much_later = 100 * (LEASE + RETENTION);
    assert_eq!(view(rec.as_ref(), much_later).state, State::Expired);
    assert!(is_unresolved(rec.as_ref(), much_later));
    let again = run(&mut rec, |r| {
        request_token(r, &req("f", "w", "t2", OnExpiry::Reconcile), much_later)
    });
    assert_eq!(
        again,
        Err(Refusal::LeaseExpired {
            token: g.token.clone(),
            fencing: g.fencing,
            expired_at: LEASE
        })
    );
    // A late Complete is still accepted, and only then does retention start.
    let done = run(&mut rec, |r| complete(r, "t1", b"paid", much_later)).unwrap();
    assert!(done.recorded);
    assert_eq!(
        rec.as_ref().unwrap().expires_at,
        Some(much_later + RETENTION)
    );
}

#[test]
fn redelivery_needs_the_same_principal_and_holder() {
    let mut rec = None;
    run(&mut rec, |_| {
        request_token(None, &req("f", "w1", "t1", OnExpiry::Reconcile), 0)
    })
    .unwrap();
    let mut other = req("f", "w1", "t2", OnExpiry::Reconcile);
    other.principal = "someone-else".into();
    assert!(matches!(
        request_token(rec.as_ref(), &other, 10).reply,
        Err(Refusal::InProgress { .. })
    ));
}

#[test]
fn non_sliding_retention_is_not_refreshed() {
    let mut rec = None;
    let mut r = req("f", "", "t1", OnExpiry::Reconcile);
    r.sliding = false;
    let g = granted(run(&mut rec, |_| request_token(None, &r, 0)));
    run(&mut rec, |r| complete(r, &g.token, b"x", 10)).unwrap();
    let step = request_token(rec.as_ref(), &r, 20);
    assert_eq!(step.write, Write::Nothing);
}

#[test]
fn a_different_request_hash_is_refused_in_every_state() {
    let mut rec = None;
    let g = granted(run(&mut rec, |_| {
        request_token(None, &req("f1", "w", "t1", OnExpiry::Regrant), 0)
    }));
    let conflict = |rec: &Option<Record>, now| {
        request_token(rec.as_ref(), &req("f2", "w", "tx", OnExpiry::Regrant), now)
    };
    let expect = Err(Refusal::KeyReused {
        differing: vec!["/amount".into()],
    });
    assert_eq!(conflict(&rec, 1).reply, expect, "authorized");
    assert_eq!(conflict(&rec, LEASE + 1).reply, expect, "expired");
    run(&mut rec, |r| complete(r, &g.token, b"r", 2)).unwrap();
    assert_eq!(conflict(&rec, 3).reply, expect, "completed");
    assert_eq!(conflict(&rec, 3).write, Write::Nothing);
}

#[test]
fn expired_lease_reconcile_refuses_and_regrant_grants_higher_fencing() {
    let mut rec = None;
    let g1 = granted(run(&mut rec, |_| {
        request_token(None, &req("f", "w", "t1", OnExpiry::Reconcile), 0)
    }));
    let refused = request_token(
        rec.as_ref(),
        &req("f", "w", "t2", OnExpiry::Reconcile),
        LEASE,
    );
    assert_eq!(
        refused.reply,
        Err(Refusal::LeaseExpired {
            token: "t1".into(),
            fencing: 1,
            expired_at: LEASE
        })
    );
    assert_eq!(view(rec.as_ref(), LEASE).state, State::Expired);
    let g2 = granted(run(&mut rec, |r| {
        request_token(r, &req("f", "w", "t2", OnExpiry::Regrant), LEASE)
    }));
    assert_eq!((g2.token.as_str(), g2.fencing), ("t2", 2));
    // The superseded holder finishes late: recorded, flagged as a double execution...
    let late = run(&mut rec, |r| complete(r, &g1.token, b"old", LEASE + 5)).unwrap();
    assert!(late.recorded && late.double_execution);
    assert_eq!(late.completion.fencing, 1);
    // ...and the newer holder hears COMPLETED_BY_OTHER.
    let newer = run(&mut rec, |r| complete(r, &g2.token, b"new", LEASE + 6));
    assert_eq!(
        newer,
        Err(Refusal::CompletedByOther {
            fencing: 1,
            completed_at: LEASE + 5
        })
    );
}

#[test]
fn late_complete_with_the_last_token_is_accepted() {
    let mut rec = None;
    let g = granted(run(&mut rec, |_| {
        request_token(None, &req("f", "", "t1", OnExpiry::Reconcile), 0)
    }));
    let done = run(&mut rec, |r| complete(r, &g.token, b"late", LEASE * 3)).unwrap();
    assert!(done.recorded && !done.double_execution);
}

#[test]
fn complete_is_idempotent_and_checks_tokens() {
    let mut rec = None;
    assert_eq!(
        complete(None, "t", b"", 0).reply,
        Err(Refusal::TokenUnknown)
    );
    let g = granted(run(&mut rec, |_| {
        request_token(None, &req("f", "", "t1", OnExpiry::Reconcile), 0)
    }));
    assert_eq!(
        complete(rec.as_ref(), "nope", b"", 1).reply,
        Err(Refusal::TokenMismatch)
    );
    let first = run(&mut rec, |r| complete(r, &g.token, b"one", 1)).unwrap();
    let again = complete(rec.as_ref(), &g.token, b"two", 2);
    assert_eq!(again.write, Write::Nothing);
    let again = again.reply.unwrap();
    assert!(!again.recorded);
    assert_eq!(
        again.completion, first.completion,
        "the stored receipt, not the new one"
    );
    assert_eq!(
        complete(rec.as_ref(), "nope", b"", 3).reply,
        Err(Refusal::TokenMismatch)
    );
}

#[test]
fn release_keeps_fencing_and_refuses_completed() {
    let mut rec = None;
    assert_eq!(release(None, "t", 0).reply, Err(Refusal::TokenUnknown));
    let g = granted(run(&mut rec, |_| {
        request_token(None, &req("f", "", "t1", OnExpiry::Reconcile), 0)
    }));
    assert_eq!(
        release(rec.as_ref(), "other", 1).reply,
        Err(Refusal::TokenMismatch)
    );
    assert_eq!(run(&mut rec, |r| release(r, &g.token, 1)), Ok(1));
    assert_eq!(
        release(rec.as_ref(), &g.token, 2).reply,
        Ok(1),
        "a repeated release is a no-op"
    );
    assert_eq!(view(rec.as_ref(), 2).state, State::Absent);
    assert_eq!(
        complete(rec.as_ref(), &g.token, b"", 2).reply,
        Err(Refusal::TokenMismatch)
    );
    let g2 = granted(run(&mut rec, |r| {
        request_token(r, &req("f", "", "t2", OnExpiry::Reconcile), 3)
    }));
    assert_eq!(g2.fencing, 2, "fencing is never reused across release");
    run(&mut rec, |r| complete(r, &g2.token, b"", 4)).unwrap();
    assert_eq!(
        release(rec.as_ref(), &g2.token, 5).reply,
        Err(Refusal::AlreadyCompleted)
    );
}

#[test]
fn release_of_an_expired_lease_is_allowed() {
    let mut rec = None;
    let g = granted(run(&mut rec, |_| {
        request_token(None, &req("f", "", "t1", OnExpiry::Reconcile), 0)
    }));
    assert_eq!(run(&mut rec, |r| release(r, &g.token, LEASE * 2)), Ok(1));
}

#[test]
fn extend_lease_only_for_the_live_holder() {
    let mut rec = None;
    let g = granted(run(&mut rec, |_| {
        request_token(None, &req("f", "", "t1", OnExpiry::Reconcile), 0)
    }));
    assert_eq!(
        extend_lease(rec.as_ref(), "x", 5_000, 10).reply,
        Err(Refusal::TokenMismatch)
    );
    assert_eq!(
        run(&mut rec, |r| extend_lease(r, &g.token, 5_000, 10)),
        Ok(5_010)
    );
    assert!(matches!(
        request_token(
            rec.as_ref(),
            &req("f", "", "t2", OnExpiry::Reconcile),
            4_000
        )
        .reply,
        Err(Refusal::InProgress { retry_after: 1_010 })
    ));
    assert!(matches!(
        extend_lease(rec.as_ref(), &g.token, 5_000, 6_000).reply,
        Err(Refusal::LeaseExpired { .. })
    ));
    run(&mut rec, |r| complete(r, &g.token, b"", 100)).unwrap();
    assert_eq!(
        extend_lease(rec.as_ref(), &g.token, 10, 101).reply,
        Err(Refusal::AlreadyCompleted)
    );
}
