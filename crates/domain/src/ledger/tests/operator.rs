//! The operator transitions: external completions and the settlement of expired leases.

use super::*;

pub(super) fn hash(fp: &str) -> RequestHash {
    RequestHash {
        fingerprint: fp.into(),
        digests: format!("action=00\n/amount={fp}\n"),
        retention: RETENTION,
        sliding: true,
    }
}

pub(super) fn external(receipt: &[u8], request: Option<RequestHash>) -> ExternalCompletion {
    ExternalCompletion {
        written: OperatorReceipt {
            receipt: receipt.to_vec(),
            format: ReceiptFormat::Text,
            note: "paid by phone".into(),
            operator: "ops".into(),
        },
        request,
    }
}

pub(super) fn resolved_completed(receipt: &[u8]) -> Resolution {
    Resolution::Completed(OperatorReceipt {
        receipt: receipt.to_vec(),
        format: ReceiptFormat::Json,
        note: "provider says paid".into(),
        operator: "ops".into(),
    })
}

#[test]
fn external_completion_of_an_absent_action_needs_its_request_and_is_replayed() {
    assert_eq!(
        record_external(None, &external(b"r", None), 0).reply,
        Err(Refusal::RequestRequired)
    );
    let mut rec = None;
    let done = run(&mut rec, |r| {
        record_external(r, &external(b"r", Some(hash("f"))), 5)
    })
    .unwrap();
    assert!(done.recorded && !done.double_execution);
    assert_eq!(done.completion.source, Source::Operator);
    assert_eq!(done.completion.token, "");
    assert_eq!(done.completion.note, "paid by phone");
    assert_eq!(done.completion.operator, "ops");
    assert_eq!(rec.as_ref().unwrap().expires_at, Some(5 + RETENTION));
    // A worker asking later is told it already happened, with the operator's receipt.
    let replay = request_token(rec.as_ref(), &req("f", "", "t1", OnExpiry::Reconcile), 6).reply;
    assert_eq!(
        replay,
        Ok(TokenOutcome::AlreadyCompleted(done.completion.clone()))
    );
    // A different request under the same key is refused, as for any record.
    assert!(matches!(
        request_token(rec.as_ref(), &req("g", "", "t1", OnExpiry::Reconcile), 6).reply,
        Err(Refusal::KeyReused { .. })
    ));
    // Repeating the same operator completion is a no-op; another one is refused.
    let again = record_external(rec.as_ref(), &external(b"r", None), 7);
    assert_eq!(again.write, Write::Nothing);
    assert!(!again.reply.unwrap().recorded);
    assert_eq!(
        record_external(rec.as_ref(), &external(b"other", None), 7).reply,
        Err(Refusal::AlreadyCompleted)
    );
}

#[test]
fn external_completion_under_a_live_lease_tells_the_holder_completed_by_other() {
    for at in [10, LEASE + 10] {
        let mut rec = None;
        let g = granted(run(&mut rec, |_| {
            request_token(None, &req("f", "w", "t1", OnExpiry::Reconcile), 0)
        }));
        assert!(matches!(
            record_external(rec.as_ref(), &external(b"r", Some(hash("other"))), at).reply,
            Err(Refusal::KeyReused { .. })
        ));
        let done = run(&mut rec, |r| {
            record_external(r, &external(b"r", Some(hash("f"))), at)
        })
        .unwrap();
        assert_eq!(
            done.completion.fencing, 1,
            "the completion belongs to the live grant"
        );
        assert_eq!(view(rec.as_ref(), at).state, State::Completed);
        assert_eq!(
            complete(rec.as_ref(), &g.token, b"worker", at + 1).reply,
            Err(Refusal::CompletedByOther {
                fencing: 1,
                completed_at: at
            })
        );
        assert_eq!(
            release(rec.as_ref(), &g.token, at + 1).reply,
            Err(Refusal::AlreadyCompleted)
        );
    }
}

#[test]
fn external_completion_after_release_keeps_the_fencing_and_after_a_worker_is_refused() {
    let mut rec = None;
    let g = granted(run(&mut rec, |_| {
        request_token(None, &req("f", "", "t1", OnExpiry::Reconcile), 0)
    }));
    run(&mut rec, |r| release(r, &g.token, 1)).unwrap();
    assert_eq!(
        record_external(rec.as_ref(), &external(b"r", None), 2).reply,
        Err(Refusal::RequestRequired),
        "a released action is absent"
    );
    let done = run(&mut rec, |r| {
        record_external(r, &external(b"r", Some(hash("f2"))), 2)
    })
    .unwrap();
    assert_eq!(done.completion.fencing, 1);

    let mut rec = None;
    let g = granted(run(&mut rec, |_| {
        request_token(None, &req("f", "", "t1", OnExpiry::Reconcile), 0)
    }));
    run(&mut rec, |r| complete(r, &g.token, b"w", 1)).unwrap();
    assert_eq!(
        record_external(rec.as_ref(), &external(b"r", None), 2).reply,
        Err(Refusal::AlreadyCompleted)
    );
}

#[test]
fn resolve_expired_only_settles_expired_leases() {
    assert_eq!(
        resolve_expired(None, &Resolution::Failed, None, 0).reply,
        Err(Refusal::NotExpired {
            state: State::Absent
        })
    );
    let mut rec = None;
    let g = granted(run(&mut rec, |_| {
        request_token(None, &req("f", "w", "t1", OnExpiry::Reconcile), 0)
    }));
    assert!(is_unresolved(rec.as_ref(), LEASE));
    assert!(!is_unresolved(rec.as_ref(), LEASE - 1));
    assert_eq!(
        resolve_expired(rec.as_ref(), &Resolution::Failed, None, LEASE - 1).reply,
        Err(Refusal::NotExpired {
            state: State::Authorized
        })
    );
    // Failed: released with the fencing kept; the next grant gets a higher number.
    let mut failed = rec.clone();
    assert_eq!(
        run(&mut failed, |r| resolve_expired(
            r,
            &Resolution::Failed,
            None,
            LEASE
        )),
        Ok(Resolved::Released { fencing: 1 })
    );
    assert!(!is_unresolved(failed.as_ref(), LEASE));
    assert_eq!(view(failed.as_ref(), LEASE).state, State::Absent);
    let again = granted(run(&mut failed, |r| {
        request_token(r, &req("f", "w", "t2", OnExpiry::Reconcile), LEASE + 1)
    }));
    assert_eq!(again.fencing, 2);
    assert_eq!(
        complete(failed.as_ref(), &g.token, b"late", LEASE + 2).reply,
        Err(Refusal::TokenMismatch)
    );
    // Completed: an operator completion; the expired holder hears COMPLETED_BY_OTHER.
    let mut done = rec.clone();
    let Ok(Resolved::Completed(completion)) = run(&mut done, |r| {
        resolve_expired(r, &resolved_completed(b"p"), None, LEASE)
    }) else {
        panic!("expected a completion");
    };
    assert_eq!(
        (completion.source, completion.fencing),
        (Source::Operator, 1)
    );
    assert_eq!(
        complete(done.as_ref(), &g.token, b"late", LEASE + 2).reply,
        Err(Refusal::CompletedByOther {
            fencing: 1,
            completed_at: LEASE
        })
    );
    assert_eq!(
        resolve_expired(done.as_ref(), &Resolution::Failed, None, LEASE + 3).reply,
        Err(Refusal::AlreadyCompleted)
    );
}

#[test]
fn superseded_grants_are_resolved_one_at_a_time() {
    let mut rec = None;
    run(&mut rec, |_| {
        request_token(None, &req("f", "", "t1", OnExpiry::Regrant), 0)
    })
    .unwrap();
    let t2 = granted(run(&mut rec, |r| {
        request_token(r, &req("f", "", "t2", OnExpiry::Regrant), LEASE)
    }));
    let t3 = granted(run(&mut rec, |r| {
        request_token(r, &req("f", "", "t3", OnExpiry::Regrant), 2 * LEASE)
    }));
    run(&mut rec, |r| release(r, "t3", 2 * LEASE + 1)).unwrap();
    // t2 (the newest superseded grant) is the one to reconcile first, then t1.
    let now = 2 * LEASE + 2;
    let first = run(&mut rec, |r| {
        resolve_expired(r, &Resolution::Failed, None, now)
    })
    .unwrap();
    assert_eq!(
        first,
        Resolved::Released {
            fencing: t2.fencing
        }
    );
    assert_eq!(view(rec.as_ref(), now).state, State::Expired);
    assert_eq!(rec.as_ref().unwrap().expires_at, None);
    let second = run(&mut rec, |r| {
        resolve_expired(r, &Resolution::Failed, None, now)
    })
    .unwrap();
    assert_eq!(
        second,
        Resolved::Released {
            fencing: t2.fencing - 1
        }
    );
    // All settled: a plain tombstone with the retention, fencing kept for the next grant.
    assert_eq!(view(rec.as_ref(), now).state, State::Absent);
    assert_eq!(rec.as_ref().unwrap().expires_at, Some(now + RETENTION));
    let next = granted(run(&mut rec, |r| {
        request_token(r, &req("f", "", "t4", OnExpiry::Reconcile), now + 1)
    }));
    assert_eq!(next.fencing, t3.fencing + 1);
}

#[test]
fn a_resolver_settles_only_the_grant_it_was_shown() {
    // Two resolvers saw the same expired grant (fencing 1 after a regrant: t1 superseded by t2,
    // whose lease also ended). The first settles it; the second is told, and nothing changes.
    let mut rec = None;
    run(&mut rec, |_| {
        request_token(None, &req("f", "", "t1", OnExpiry::Regrant), 0)
    })
    .unwrap();
    let t2 = granted(run(&mut rec, |r| {
        request_token(r, &req("f", "", "t2", OnExpiry::Regrant), LEASE)
    }));
    let now = 2 * LEASE;
    let shown = view(rec.as_ref(), now);
    assert_eq!((shown.state, shown.fencing), (State::Expired, t2.fencing));
    let stale = Some(t2.fencing - 1);
    assert_eq!(
        resolve_expired(rec.as_ref(), &Resolution::Failed, stale, now).reply,
        Err(Refusal::AlreadySettled {
            state: State::Expired,
            fencing: t2.fencing
        }),
        "a grant that is not the unresolved one is not settled"
    );
    let expected = Some(t2.fencing);
    let first = run(&mut rec, |r| {
        resolve_expired(r, &Resolution::Failed, expected, now)
    });
    assert_eq!(
        first,
        Ok(Resolved::Released {
            fencing: t2.fencing
        })
    );
    // The released record still waits on t1 (EXPIRED, fencing t2 - 1): the second resolver of
    // t2 must not settle t1 in its place.
    let before = rec.clone();
    assert_eq!(
        resolve_expired(rec.as_ref(), &Resolution::Failed, expected, now).reply,
        Err(Refusal::AlreadySettled {
            state: State::Expired,
            fencing: t2.fencing - 1
        })
    );
    assert_eq!(rec, before);
    // Completed by one resolver: the other hears ALREADY_COMPLETED, even with a receipt.
    let done = run(&mut rec, |r| {
        resolve_expired(r, &resolved_completed(b"p"), Some(t2.fencing - 1), now)
    });
    assert!(matches!(done, Ok(Resolved::Completed(_))), "{done:?}");
    assert_eq!(
        resolve_expired(
            rec.as_ref(),
            &resolved_completed(b"q"),
            Some(t2.fencing - 1),
            now
        )
        .reply,
        Err(Refusal::AlreadyCompleted)
    );
    // Nothing there at all (never granted, or forgotten): settled as far as a resolver knows.
    assert_eq!(
        resolve_expired(None, &Resolution::Failed, Some(7), now).reply,
        Err(Refusal::AlreadySettled {
            state: State::Absent,
            fencing: 0
        })
    );
}
