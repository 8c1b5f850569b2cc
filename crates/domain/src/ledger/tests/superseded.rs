//! Superseded grants: a late Complete with an older token after the newer one's Release, a
//! regrant after it, and the bound on how many are kept.

use super::*;

#[test]
fn a_superseded_complete_after_the_newer_release_is_recorded() {
    let mut rec = None;
    let t1 = granted(run(&mut rec, |_| {
        request_token(None, &req("f", "", "t1", OnExpiry::Regrant), 0)
    }));
    let t2 = granted(run(&mut rec, |r| {
        request_token(r, &req("f", "", "t2", OnExpiry::Regrant), LEASE + 1)
    }));
    assert_eq!(t2.fencing, t1.fencing + 1);
    // The newer holder fails definitely and releases: the superseded grant is still out.
    let released_at = LEASE + 2;
    run(&mut rec, |r| release(r, "t2", released_at)).unwrap();
    assert_eq!(rec.as_ref().unwrap().expires_at, None, "not settled");
    let v = view(rec.as_ref(), released_at + 100 * RETENTION);
    assert_eq!(
        (v.state, v.fencing, v.lease_expires_at),
        (State::Expired, t1.fencing, Some(released_at))
    );
    // Under reconcile, a request is told to reconcile the superseded grant.
    let refused = request_token(
        rec.as_ref(),
        &req("f", "", "t3", OnExpiry::Reconcile),
        released_at + 1,
    );
    assert_eq!(
        refused.reply,
        Err(Refusal::LeaseExpired {
            token: "t1".into(),
            fencing: t1.fencing,
            expired_at: released_at
        })
    );
    // The superseded payment succeeded after all: recorded, not a double execution.
    let done = run(&mut rec, |r| complete(r, "t1", b"tx-1", released_at + 5)).unwrap();
    assert!(done.recorded && !done.double_execution);
    assert_eq!(done.completion.fencing, t1.fencing);
    let replay = request_token(
        rec.as_ref(),
        &req("f", "", "t4", OnExpiry::Regrant),
        released_at + 6,
    );
    assert_eq!(
        replay.reply,
        Ok(TokenOutcome::AlreadyCompleted(done.completion))
    );
}

#[test]
fn a_regrant_after_the_newer_release_keeps_the_superseded_grants() {
    let mut rec = None;
    let t1 = granted(run(&mut rec, |_| {
        request_token(None, &req("f", "", "t1", OnExpiry::Regrant), 0)
    }));
    run(&mut rec, |r| {
        request_token(r, &req("f", "", "t2", OnExpiry::Regrant), LEASE + 1)
    })
    .unwrap();
    run(&mut rec, |r| release(r, "t2", LEASE + 2)).unwrap();
    // Another key's request under the same key is still a conflict: the key is bound.
    let other = request_token(
        rec.as_ref(),
        &req("g", "", "tx", OnExpiry::Regrant),
        LEASE + 3,
    );
    assert!(matches!(other.reply, Err(Refusal::KeyReused { .. })));
    let t3 = run(&mut rec, |r| {
        request_token(r, &req("f", "", "t3", OnExpiry::Regrant), LEASE + 3)
    });
    assert!(matches!(
        t3,
        Ok(TokenOutcome::Granted(_, GrantKind::Regranted))
    ));
    // t1 finishes late: recorded, and it may have run beside t3.
    let done = run(&mut rec, |r| complete(r, "t1", b"tx-1", LEASE + 4)).unwrap();
    assert!(done.recorded && done.double_execution);
    assert_eq!(done.completion.fencing, t1.fencing);
    assert!(matches!(
        complete(rec.as_ref(), "t3", b"tx-3", LEASE + 5).reply,
        Err(Refusal::CompletedByOther { .. })
    ));
}

#[test]
fn superseded_grants_are_bounded() {
    let mut rec = None;
    let mut now = 0;
    let mut last = granted(run(&mut rec, |_| {
        request_token(None, &req("f", "", "t0", OnExpiry::Regrant), now)
    }));
    for i in 1..=MAX_SUPERSEDED {
        now += LEASE;
        last = granted(run(&mut rec, |r| {
            request_token(r, &req("f", "", &format!("t{i}"), OnExpiry::Regrant), now)
        }));
    }
    assert_eq!(rec.as_ref().unwrap().older.len(), MAX_SUPERSEDED);
    now += LEASE;
    let refused = run(&mut rec, |r| {
        request_token(r, &req("f", "", "too-many", OnExpiry::Regrant), now)
    });
    assert_eq!(
        refused,
        Err(Refusal::LeaseExpired {
            token: last.token,
            fencing: last.fencing,
            expired_at: now
        })
    );
    assert_eq!(
        rec.as_ref().unwrap().older.len(),
        MAX_SUPERSEDED,
        "none dropped"
    );
}
