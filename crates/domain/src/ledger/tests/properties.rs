//! Random operation sequences against the invariants of the ledger.

use proptest::prelude::*;

use super::{
    operator::{external, hash, resolved_completed},
    *,
};

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
    /// Invariants over random sequences: at most one live token at any instant, fencing grows with
    /// each new grant (even after a record was forgotten), a completion is never replaced by
    /// another one, an unsettled record never expires, superseded grants stay within the limit.
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
                        if *kind != GrantKind::Redelivered {
                            prop_assert!(before.state != State::Authorized, "granted while a lease was live");
                            prop_assert!(before.state != State::Completed, "granted a completed action");
                            prop_assert!(g.fencing > max_fencing, "fencing went backwards");
                            tokens.push(g.token.clone());
                        }
                        max_fencing = max_fencing.max(g.fencing);
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
                    let step = resolve_expired(rec.as_ref(), &resolution, None, now);
                    prop_assert_eq!(step.reply.is_ok(), before == State::Expired);
                    if let Ok(Resolved::Completed(done)) = apply(&mut rec, step) {
                        completion = Some(done);
                    }
                }
            }
            if let Some(r) = &rec {
                prop_assert!(r.fencing <= max_fencing.max(1));
                let unsettled = matches!(r.phase, Phase::Authorized { .. }) || r.pending_superseded().is_some();
                prop_assert!(!unsettled || r.expires_at.is_none(), "an unsettled record would expire");
                prop_assert!(r.older.len() <= MAX_SUPERSEDED);
            }
            if view(rec.as_ref(), now).state != State::Completed {
                completion = None;
            }
        }
    }
}
