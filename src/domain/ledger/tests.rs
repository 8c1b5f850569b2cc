//! Table and property tests of the pure state machine, with injected time.

use proptest::prelude::*;

use super::*;

const LEASE: Millis = 1_000;
const RETENTION: Millis = 10_000;

fn req(fp: &str, holder: &str, token: &str, on_expiry: OnExpiry) -> TokenRequest {
    TokenRequest {
        fingerprint: fp.into(),
        digests: format!("action=00\n/amount={fp}\n"),
        holder: holder.into(),
        new_token: token.into(),
        lease: LEASE,
        retention: RETENTION,
        sliding: true,
        on_expiry,
    }
}

/// Applies a step's write to `rec` and returns its reply.
fn run<T>(
    rec: &mut Option<Record>,
    f: impl FnOnce(Option<&Record>) -> Step<T>,
) -> Result<T, Refusal> {
    let step = f(rec.as_ref());
    apply(rec, step)
}

fn apply<T>(rec: &mut Option<Record>, step: Step<T>) -> Result<T, Refusal> {
    if let Write::Put(new) = step.write {
        *rec = Some(new);
    }
    step.reply
}

fn granted(result: Result<TokenOutcome, Refusal>) -> Grant {
    match result {
        Ok(TokenOutcome::Granted(grant, _)) => grant,
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[test]
fn absent_grants_with_fencing_one_and_a_lease() {
    let mut rec = None;
    let r = run(&mut rec, |r| {
        request_token(r, &req("f", "", "t1", OnExpiry::Reconcile), 100)
    });
    assert_eq!(
        r,
        Ok(TokenOutcome::Granted(
            Grant {
                token: "t1".into(),
                fencing: 1,
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
        5_000 + RETENTION,
        "sliding retention refreshed"
    );
    // Past retention the record is gone and the same request is a new action.
    let later = 5_000 + RETENTION;
    let fresh = granted(run(&mut rec, |r| {
        request_token(r, &req("f", "", "t3", OnExpiry::Reconcile), later)
    }));
    assert_eq!(fresh.fencing, 1);
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

fn hash(fp: &str) -> RequestHash {
    RequestHash {
        fingerprint: fp.into(),
        digests: format!("action=00\n/amount={fp}\n"),
        retention: RETENTION,
        sliding: true,
    }
}

fn external(receipt: &[u8], request: Option<RequestHash>) -> ExternalCompletion {
    ExternalCompletion {
        receipt: receipt.to_vec(),
        note: "paid by phone".into(),
        operator: "ops".into(),
        request,
    }
}

fn resolved_completed(receipt: &[u8]) -> Resolution {
    Resolution::Completed {
        receipt: receipt.to_vec(),
        note: "provider says paid".into(),
        operator: "ops".into(),
    }
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
    assert_eq!(rec.as_ref().unwrap().expires_at, 5 + RETENTION);
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
        resolve_expired(None, &Resolution::Failed, 0).reply,
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
        resolve_expired(rec.as_ref(), &Resolution::Failed, LEASE - 1).reply,
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
        resolve_expired(r, &resolved_completed(b"p"), LEASE)
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
        resolve_expired(done.as_ref(), &Resolution::Failed, LEASE + 3).reply,
        Err(Refusal::AlreadyCompleted)
    );
}

/// One random operation of the property test.
#[derive(Debug, Clone)]
enum Op {
    Token { fp: u8, holder: u8, regrant: bool },
    Complete { token: u8 },
    Release { token: u8 },
    Extend { token: u8 },
    External { fp: u8, with_hash: bool },
    Resolve { completed: bool },
    Wait(Millis),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..2u8, 0..3u8, any::<bool>()).prop_map(|(fp, holder, regrant)| Op::Token {
            fp,
            holder,
            regrant
        }),
        (0..6u8).prop_map(|token| Op::Complete { token }),
        (0..6u8).prop_map(|token| Op::Release { token }),
        (0..6u8).prop_map(|token| Op::Extend { token }),
        (0..2u8, any::<bool>()).prop_map(|(fp, with_hash)| Op::External { fp, with_hash }),
        any::<bool>().prop_map(|completed| Op::Resolve { completed }),
        (0..2 * LEASE).prop_map(Op::Wait),
    ]
}

proptest! {
    /// Invariants over random sequences: at most one live token at any instant, fencing never
    /// decreases and grows with each new grant, a completion is never replaced by another one.
    #[test]
    fn random_sequences_keep_the_invariants(ops in proptest::collection::vec(op(), 1..60)) {
        let mut rec: Option<Record> = None;
        let mut now: Millis = 0;
        let mut tokens: Vec<String> = vec!["never-granted".into()];
        let mut max_fencing = 0;
        let mut completion: Option<Completion> = None;
        for (i, op) in ops.into_iter().enumerate() {
            match op {
                Op::Wait(ms) => now += ms,
                Op::Token { fp, holder, regrant } => {
                    let token = format!("t{i}");
                    let holder = ["", "a", "b"][holder as usize];
                    let policy = if regrant { OnExpiry::Regrant } else { OnExpiry::Reconcile };
                    let before = view(rec.as_ref(), now);
                    let step = request_token(rec.as_ref(), &req(&format!("f{fp}"), holder, &token, policy), now);
                    if let Ok(TokenOutcome::Granted(g, kind)) = &step.reply {
                        // A record past its expiry is gone, fencing included: numbering restarts.
                        let expired = rec.as_ref().is_none_or(|r| r.expires_at <= now);
                        if *kind != GrantKind::Redelivered {
                            prop_assert!(before.state != State::Authorized, "granted while a lease was live");
                            prop_assert!(before.state != State::Completed, "granted a completed action");
                            prop_assert!(g.fencing > max_fencing || expired);
                            tokens.push(g.token.clone());
                        }
                        max_fencing = if expired { g.fencing } else { max_fencing.max(g.fencing) };
                    }
                    apply(&mut rec, step).ok();
                }
                Op::Complete { token } => {
                    let token = tokens[token as usize % tokens.len()].clone();
                    let step = complete(rec.as_ref(), &token, token.as_bytes(), now);
                    if let (Ok(done), Some(prev)) = (&step.reply, &completion)
                        && view(rec.as_ref(), now).state == State::Completed
                    {
                        prop_assert_eq!(&done.completion, prev, "a completion was replaced");
                    }
                    if let Ok(done) = apply(&mut rec, step) {
                        completion = Some(done.completion);
                    }
                }
                Op::Release { token } => {
                    let token = tokens[token as usize % tokens.len()].clone();
                    run(&mut rec, |r| release(r, &token, now)).ok();
                }
                Op::Extend { token } => {
                    let token = tokens[token as usize % tokens.len()].clone();
                    run(&mut rec, |r| extend_lease(r, &token, LEASE, now)).ok();
                }
                Op::External { fp, with_hash } => {
                    let ext = external(b"hand", with_hash.then(|| hash(&format!("f{fp}"))));
                    let before = view(rec.as_ref(), now).state;
                    let step = record_external(rec.as_ref(), &ext, now);
                    if let (Ok(done), Some(prev)) = (&step.reply, &completion)
                        && before == State::Completed
                    {
                        prop_assert_eq!(&done.completion, prev, "a completion was replaced");
                    }
                    if let Ok(done) = apply(&mut rec, step) {
                        completion = Some(done.completion);
                    }
                }
                Op::Resolve { completed } => {
                    let before = view(rec.as_ref(), now).state;
                    let resolution = if completed { resolved_completed(b"p") } else { Resolution::Failed };
                    let step = resolve_expired(rec.as_ref(), &resolution, now);
                    prop_assert_eq!(step.reply.is_ok(), before == State::Expired);
                    if let Ok(Resolved::Completed(done)) = apply(&mut rec, step) {
                        completion = Some(done);
                    }
                }
            }
            if let Some(r) = &rec {
                prop_assert!(r.fencing <= max_fencing.max(1));
            }
            if view(rec.as_ref(), now).state != State::Completed {
                completion = None;
            }
        }
    }
}
