//! The conformance suite: every store is driven with randomised operation sequences and each reply
//! is compared with what the pure ledger answers for the same record, request and store time.
//! Many actors run at once (one task per action key), so the stores are also exercised
//! concurrently. Store time passes between operations: the embedded store's test clock advances,
//! Redis is waited for.

use std::time::Duration;

use oncegate::{
    domain::ActionKey,
    domain::fingerprint::{self, KeyFields, ParamsLimits},
    domain::ledger::{
        self, ExternalCompletion, Millis, OnExpiry, Record, RequestHash, Resolution, Step,
        TokenRequest, Write,
    },
    store::{Reply, Store},
};

use crate::support::{Kind, StoreTime, backend_with_test_clock, on_stores};

/// A tiny deterministic generator (xorshift), so a failing seed can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn digests(params: &str) -> String {
    let params = fingerprint::parse_params(params, ParamsLimits::default()).unwrap();
    fingerprint::field_digests("pay", "", &fingerprint::select(&params, &KeyFields::All))
}

/// Applies the model's step, after checking the store said the same thing at the same time.
fn check<T: PartialEq + std::fmt::Debug>(
    model: &mut Option<Record>,
    reply: Reply<T>,
    step: impl FnOnce(Option<&Record>, Millis) -> Step<T>,
    what: &str,
) -> Result<T, ledger::Refusal> {
    let expected = step(model.as_ref(), reply.now);
    assert_eq!(
        reply.result, expected.reply,
        "{what} at {} diverged from the model (record {model:?})",
        reply.now
    );
    if let Write::Put(record) = expected.write {
        *model = Some(record);
    }
    reply.result
}

/// One actor: a random sequence of operations on one action key, checked step by step, letting up
/// to 60 ms of store time pass now and then.
async fn actor(store: Store, time: StoreTime, seed: u64, ops: usize) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let key = ActionKey::new(format!("agent-{seed}"), "run", format!("key-{seed}"));
    let params = [r#"{"amount":1}"#, r#"{"amount":2,"memo":"x"}"#];
    let mut model: Option<Record> = None;
    let mut tokens = vec!["never-granted".to_owned()];
    for i in 0..ops {
        let pick = |rng: &mut Rng, tokens: &Vec<String>| {
            tokens[rng.below(tokens.len() as u64) as usize].clone()
        };
        match rng.below(13) {
            0..=3 => {
                let variant = rng.below(2) as usize;
                let req = TokenRequest {
                    fingerprint: format!("fp-{variant}"),
                    digests: digests(params[variant]),
                    holder: ["", "h1", "h2"][rng.below(3) as usize].to_owned(),
                    new_token: format!("tok-{seed}-{i}"),
                    lease: [40, 5_000][rng.below(2) as usize],
                    retention: [150, 60_000][rng.below(2) as usize],
                    sliding: rng.below(2) == 0,
                    on_expiry: if rng.below(2) == 0 {
                        OnExpiry::Reconcile
                    } else {
                        OnExpiry::Regrant
                    },
                };
                let reply = store.request_token(&key, &req, 0).await.unwrap().reply;
                let outcome = check(
                    &mut model,
                    reply,
                    |r, now| ledger::request_token(r, &req, now),
                    "request_token",
                );
                if let Ok(ledger::TokenOutcome::Granted(grant, _)) = outcome {
                    tokens.push(grant.token);
                }
            }
            4 | 5 => {
                let token = pick(&mut rng, &tokens);
                let receipt = format!("receipt-{i}").into_bytes();
                let reply = store
                    .complete(&key, &token, &receipt, 0)
                    .await
                    .unwrap()
                    .reply;
                check(
                    &mut model,
                    reply,
                    |r, now| ledger::complete(r, &token, &receipt, now),
                    "complete",
                )
                .ok();
            }
            6 => {
                let token = pick(&mut rng, &tokens);
                let reply = store.release(&key, &token, 0).await.unwrap().reply;
                check(
                    &mut model,
                    reply,
                    |r, now| ledger::release(r, &token, now),
                    "release",
                )
                .ok();
            }
            7 => {
                let token = pick(&mut rng, &tokens);
                let ttl = [30, 4_000][rng.below(2) as usize];
                let reply = store
                    .extend_lease(&key, &token, ttl, 0)
                    .await
                    .unwrap()
                    .reply;
                check(
                    &mut model,
                    reply,
                    |r, now| ledger::extend_lease(r, &token, ttl, now),
                    "extend_lease",
                )
                .ok();
            }
            8 => {
                let reply = store.get(&key).await.unwrap();
                assert_eq!(
                    reply.result,
                    Ok(ledger::view(model.as_ref(), reply.now)),
                    "get diverged"
                );
            }
            9 => {
                let variant = rng.below(2) as usize;
                let ext = ExternalCompletion {
                    receipt: [&b"by hand"[..], b"phone"][rng.below(2) as usize].to_vec(),
                    note: "ticket-1".into(),
                    operator: ["ops", "ops2"][rng.below(2) as usize].into(),
                    request: (rng.below(3) > 0).then(|| RequestHash {
                        fingerprint: format!("fp-{variant}"),
                        digests: digests(params[variant]),
                        retention: [150, 60_000][rng.below(2) as usize],
                        sliding: rng.below(2) == 0,
                    }),
                };
                let reply = store.record_external(&key, &ext).await.unwrap();
                check(
                    &mut model,
                    reply,
                    |r, now| ledger::record_external(r, &ext, now),
                    "record_external",
                )
                .ok();
            }
            10 => {
                let resolution = if rng.below(2) == 0 {
                    Resolution::Failed
                } else {
                    Resolution::Completed {
                        receipt: format!("resolved-{i}").into_bytes(),
                        note: "reconciled".into(),
                        operator: "ops".into(),
                    }
                };
                let reply = store.resolve_expired(&key, &resolution).await.unwrap();
                check(
                    &mut model,
                    reply,
                    |r, now| ledger::resolve_expired(r, &resolution, now),
                    "resolve_expired",
                )
                .ok();
            }
            11 => {
                // This actor owns its agent: the agent's unresolved list is exactly this key
                // when the model says its lease ended unresolved.
                let reply = store
                    .list_unresolved(Some(&key.agent_id), None, 10)
                    .await
                    .unwrap();
                let page = reply.result.unwrap();
                let expected: Vec<_> = ledger::is_unresolved(model.as_ref(), reply.now)
                    .then(|| (key.clone(), ledger::view(model.as_ref(), reply.now)))
                    .into_iter()
                    .collect();
                let listed: Vec<_> = page.items.into_iter().map(|u| (u.key, u.view)).collect();
                assert_eq!(
                    listed, expected,
                    "list_unresolved diverged at {}",
                    reply.now
                );
                assert_eq!(page.next, None);
            }
            _ => time.pass(Duration::from_millis(rng.below(60))).await,
        }
    }
}

async fn random_sequences_match_the_model(kind: Kind) {
    let (backend, time) = backend_with_test_clock(kind).await;
    let actors: Vec<_> = (1..=24u64)
        .map(|seed| tokio::spawn(actor(backend.store.clone(), time.clone(), seed, 120)))
        .collect();
    for actor in actors {
        actor.await.unwrap();
    }
}
on_stores!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    random_sequences_match_the_model: embedded, redis, cluster, sentinel
);
