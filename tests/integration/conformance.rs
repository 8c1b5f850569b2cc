//! The conformance suite: every store is driven with randomised operation sequences and each reply
//! is compared with what the pure ledger answers for the same record, request and store time.
//! Many actors run at once (one task per agent), so the stores are also exercised concurrently.
//! Store time passes between operations: the embedded store's test clock advances, Redis is
//! waited for.

use std::time::Duration;

use std::collections::BTreeMap;

use oncegate_domain::{
    ActionKey,
    fingerprint::{self, KeyFields, ParamsLimits},
    ledger::{
        self, Bucket, Charge, ExternalCompletion, Hold, Millis, OnExpiry, OperatorReceipt,
        ReceiptFormat, Record, RequestHash, Resolution, Side, SideWrite, Step, TokenRequest, Write,
        approval,
    },
};
use oncegate_store::{Reply, Store};

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

/// Applies a guarded step (approvals, budgets) to the model: the record, the key's approval and
/// the agent's buckets, after checking the store said the same thing at the same time.
fn check_guarded<T: PartialEq + std::fmt::Debug>(
    model: &mut Option<Record>,
    side: &mut Side,
    reply: Reply<T>,
    step: impl FnOnce(Option<&Record>, &Side, Millis) -> Step<T>,
    what: &str,
) -> Result<T, ledger::Refusal> {
    let expected = step(model.as_ref(), side, reply.now);
    let SideWrite { approval, buckets } = expected.side;
    assert_eq!(
        reply.result, expected.reply,
        "{what} at {} diverged from the model (record {model:?}, side {side:?})",
        reply.now
    );
    if let Write::Put(record) = expected.write {
        *model = Some(record);
    }
    if approval.is_some() {
        side.approval = approval;
    }
    side.buckets.extend(buckets);
    reply.result
}

/// The transitions a run must have visited for its verdict to mean something (each is rare enough
/// that a generator change could silently stop producing it).
const MUST_VISIT: [&str; 12] = [
    "late complete of a superseded grant after the newer release",
    "regrant refused at the superseded limit",
    "released record still unresolved",
    "superseded grant settled as failed",
    "redelivery refused to another principal",
    "budget exceeded",
    "release gave a reservation back",
    "held for approval",
    "approval covered a grant",
    "denied approval refused a request",
    "approval decision refused",
    "failed resolution gave a reservation back",
];

/// The budgets every actor's agent has: a velocity cap of 3 grants and a sum of 5 units, in short
/// windows so that they fill and free up within a run.
const BUDGETS: [(&str, u64, Millis); 2] = [("cap", 3, 200), ("sum", 5, 300)];

type Visited = std::sync::Arc<std::sync::Mutex<std::collections::BTreeSet<&'static str>>>;

const PARAMS: [&str; 2] = [r#"{"amount":1}"#, r#"{"amount":2,"memo":"x"}"#];

/// One actor: random operations on the keys of one agent (one at a time), each reply checked
/// against the model.
struct Actor {
    store: Store,
    time: StoreTime,
    rng: Rng,
    seed: u64,
    key: ActionKey,
    /// The current key's request variant (a retry sends it again; a conflict the other one).
    variant: usize,
    model: Option<Record>,
    /// The keys this actor left behind, with their last record: untouched since, they still age.
    retired: Vec<(ActionKey, Option<Record>)>,
    tokens: Vec<String>,
    visited: Visited,
    /// The current key's approval and the agent's budget buckets, as the model has them.
    side: Side,
    /// Whether the current key's requests are held by a rule, and charged to the budgets.
    held: bool,
    charged: bool,
}

impl Actor {
    fn visit(&self, what: &'static str) {
        self.visited.lock().unwrap().insert(what);
    }

    fn released_with_superseded(&self) -> bool {
        self.model
            .as_ref()
            .is_some_and(|r| r.pending_superseded().is_some())
    }

    /// Mostly one of the last few tokens (the ones whose fate is still open), sometimes any.
    fn pick(&mut self) -> String {
        let n = self.tokens.len() as u64;
        let index = if self.rng.below(4) > 0 {
            n - 1 - self.rng.below(n.min(3))
        } else {
            self.rng.below(n)
        };
        self.tokens[index as usize].clone()
    }

    fn random_request(&mut self, i: usize, on_expiry: Option<OnExpiry>) -> TokenRequest {
        let rng = &mut self.rng;
        // Mostly the same request (a retry), sometimes a conflicting one.
        let variant = self.variant ^ usize::from(rng.below(6) == 0);
        TokenRequest {
            fingerprint: format!("fp-{variant}"),
            digests: digests(PARAMS[variant]),
            holder: ["", "h1", "h2"][rng.below(3) as usize].to_owned(),
            new_token: format!("tok-{}-{i}", self.seed),
            lease: [40, 40, 40, 5_000][rng.below(4) as usize],
            retention: [150, 150, 150, 60_000][rng.below(4) as usize],
            sliding: rng.below(2) == 0,
            on_expiry: on_expiry.unwrap_or(if rng.below(2) == 0 {
                OnExpiry::Reconcile
            } else {
                OnExpiry::Regrant
            }),
            // Two principals, so that redelivery to the wrong one is exercised; a small cap on
            // superseded grants, so that reaching it is.
            principal: ["p1", "p2"][rng.below(2) as usize].to_owned(),
            max_superseded: 2,
            hold: self.held.then(|| Hold {
                policy: "p".into(),
                reason: "needs approval".into(),
                new_id: format!("ap-{}-{i}", self.seed),
                ttl: 400,
                action: "pay".into(),
                params: format!(r#"{{"amount":{i}}}"#),
            }),
            charges: if self.charged {
                BUDGETS
                    .iter()
                    .map(|(name, limit, window)| Charge {
                        bucket: format!("{name}:b"),
                        budget: (*name).into(),
                        action: String::new(),
                        group: String::new(),
                        limit: *limit,
                        window: *window,
                        amount: if *name == "sum" { 1 + rng.below(3) } else { 1 },
                    })
                    .collect()
            } else {
                Vec::new()
            },
            // The params vary with the grant, so that a listing that showed an older grant's
            // would differ from the model's.
            asked: ledger::Asked {
                action: "pay".into(),
                params: format!(r#"{{"attempt":{i}}}"#),
            },
        }
    }

    async fn request(&mut self, req: TokenRequest) {
        let reply = self.store.request_token(&self.key, &req, 0).await.unwrap();
        if let Some(ledger::Phase::Authorized {
            holder, principal, ..
        }) = self.model.as_ref().map(|r| &r.phase)
            && !req.holder.is_empty()
            && *holder == req.holder
            && *principal != req.principal
            && matches!(reply.result, Err(ledger::Refusal::InProgress { .. }))
        {
            self.visit("redelivery refused to another principal");
        }
        if req.on_expiry == OnExpiry::Regrant
            && matches!(reply.result, Err(ledger::Refusal::LeaseExpired { .. }))
        {
            self.visit("regrant refused at the superseded limit");
        }
        let approved = approval::live(self.side.approval.as_ref(), reply.now)
            .is_some_and(|a| a.state == approval::ApprovalState::Approved);
        let outcome = check_guarded(
            &mut self.model,
            &mut self.side,
            reply,
            |r, side, now| ledger::request_token(r, side, &req, now),
            "request_token",
        );
        match &outcome {
            Ok(ledger::TokenOutcome::Granted(grant, _)) => {
                if req.hold.is_some() && approved {
                    self.visit("approval covered a grant");
                }
                self.tokens.push(grant.token.clone());
            }
            Ok(ledger::TokenOutcome::PendingApproval(_)) => self.visit("held for approval"),
            Err(ledger::Refusal::BudgetExceeded(_)) => self.visit("budget exceeded"),
            Err(ledger::Refusal::ApprovalDenied { .. }) => {
                self.visit("denied approval refused a request")
            }
            _ => {}
        }
    }

    /// An operator decides the current key's approval (sometimes with an id it does not have);
    /// after a decision the agent asks again at once (as a polling agent would).
    async fn decide(&mut self, i: usize) {
        let id = match (&self.side.approval, self.rng.below(5)) {
            (Some(a), 1..) => a.id.clone(),
            _ => "unknown".to_owned(),
        };
        let decision = approval::Decision {
            id,
            approve: self.rng.below(2) == 0,
            operator: "ops".into(),
            note: String::new(),
        };
        let reply = self
            .store
            .decide_approval(&self.key, &decision, 0)
            .await
            .unwrap();
        let expected = approval::decide(self.side.approval.as_ref(), &decision, reply.now)
            .map_err(|e| ledger::Refusal::ApprovalNotPending { state: e.0 });
        assert_eq!(
            reply.result, expected,
            "decide_approval diverged at {}",
            reply.now
        );
        match expected {
            Ok((a, _)) => {
                self.side.approval = Some(a);
                let mut req = self.random_request(i, None);
                req.fingerprint = format!("fp-{}", self.variant);
                req.digests = digests(PARAMS[self.variant]);
                self.request(req).await;
            }
            Err(_) => self.visit("approval decision refused"),
        }
    }

    /// The agent's buckets hold what the model's do, judged at the store's `now`.
    async fn budgets(&mut self) {
        let reply = self.store.budgets(&self.key.agent_id).await.unwrap();
        let stored: BTreeMap<String, Bucket> = reply.result.unwrap().into_iter().collect();
        for (name, _, window) in BUDGETS {
            let id = format!("{name}:b");
            let used =
                |b: &BTreeMap<String, Bucket>| b.get(&id).map_or(0, |b| b.used(window, reply.now));
            assert_eq!(
                used(&stored),
                used(&self.side.buckets),
                "budget {name} diverged at {}: store {stored:?}, model {:?}",
                reply.now,
                self.side.buckets
            );
        }
    }

    async fn complete(&mut self, token: String, receipt: Vec<u8>) {
        let superseded_after_release = self.released_with_superseded();
        let reply = self
            .store
            .complete(&self.key, &token, &receipt, 0, None)
            .await
            .unwrap();
        let done = check(
            &mut self.model,
            reply,
            |r, now| ledger::complete(r, &token, &receipt, now),
            "complete",
        );
        if superseded_after_release && done.is_ok_and(|d| d.recorded) {
            self.visit("late complete of a superseded grant after the newer release");
        }
    }

    async fn release(&mut self, token: String) {
        let reply = self.store.release(&self.key, &token, 0).await.unwrap();
        let reserved = self
            .model
            .as_ref()
            .is_some_and(|r| r.reservations.iter().any(|x| x.fencing == r.fencing));
        let released = check_guarded(
            &mut self.model,
            &mut self.side,
            reply,
            |r, side, now| ledger::release(r, side, &token, now),
            "release",
        );
        if reserved
            && released.is_ok()
            && self
                .model
                .as_ref()
                .is_some_and(|r| r.reservations.iter().all(|x| x.fencing != r.fencing))
        {
            self.visit("release gave a reservation back");
        }
    }

    async fn extend(&mut self, token: String, ttl: Millis) {
        let reply = self
            .store
            .extend_lease(&self.key, &token, ttl, 0)
            .await
            .unwrap();
        check(
            &mut self.model,
            reply,
            |r, now| ledger::extend_lease(r, &token, ttl, now),
            "extend_lease",
        )
        .ok();
    }

    async fn get(&mut self) {
        let reply = self.store.get(&self.key).await.unwrap();
        assert_eq!(
            reply.result,
            Ok(ledger::view(self.model.as_ref(), reply.now)),
            "get diverged"
        );
        if self.released_with_superseded() {
            self.visit("released record still unresolved");
        }
    }

    async fn external(&mut self) {
        let rng = &mut self.rng;
        let variant = rng.below(2) as usize;
        let ext = ExternalCompletion {
            written: OperatorReceipt {
                receipt: [&b"by hand"[..], b"phone"][rng.below(2) as usize].to_vec(),
                // Two formats: a repeat in the other one is another completion.
                format: [ReceiptFormat::Text, ReceiptFormat::Json][rng.below(2) as usize],
                note: "ticket-1".into(),
                operator: ["ops", "ops2"][rng.below(2) as usize].into(),
            },
            request: (rng.below(3) > 0).then(|| RequestHash {
                fingerprint: format!("fp-{variant}"),
                digests: digests(PARAMS[variant]),
                retention: [150, 60_000][rng.below(2) as usize],
                sliding: rng.below(2) == 0,
            }),
        };
        let reply = self
            .store
            .record_external(&self.key, &ext, 0, None)
            .await
            .unwrap();
        check(
            &mut self.model,
            reply,
            |r, now| ledger::record_external(r, &ext, now),
            "record_external",
        )
        .ok();
    }

    async fn resolve(&mut self, i: usize) {
        let resolution = if self.rng.below(2) == 0 {
            Resolution::Failed
        } else {
            Resolution::Completed(OperatorReceipt {
                receipt: format!("\"resolved-{i}\"").into_bytes(),
                format: ReceiptFormat::Json,
                note: "reconciled".into(),
                operator: "ops".into(),
            })
        };
        let superseded = self.released_with_superseded();
        // A resolver's condition: none (an operator), the unresolved grant's fencing as the model
        // knows it, or one it no longer has.
        let unresolved = self.model.as_ref().map_or(0, |r| {
            r.pending_superseded().map_or(r.fencing, |g| g.fencing)
        });
        let expected = match self.rng.below(4) {
            0 | 1 => None,
            2 => Some(unresolved),
            _ => Some(unresolved.saturating_sub(1).max(1)),
        };
        let reply = self
            .store
            .resolve_expired(&self.key, &resolution, expected, 0, None)
            .await
            .unwrap();
        let reserved = self
            .model
            .as_ref()
            .is_some_and(|r| !r.reservations.is_empty());
        let resolved = check_guarded(
            &mut self.model,
            &mut self.side,
            reply,
            |r, side, now| ledger::resolve_expired(r, side, &resolution, expected, now),
            "resolve_expired",
        );
        if reserved && matches!(resolved, Ok(ledger::Resolved::Released { .. })) {
            self.visit("failed resolution gave a reservation back");
        }
        if superseded && matches!(resolved, Ok(ledger::Resolved::Released { .. })) {
            self.visit("superseded grant settled as failed");
        }
    }

    /// This actor owns its agent: the agent's unresolved list is exactly its keys whose model
    /// says they are unresolved, oldest lease first.
    async fn list(&mut self) {
        let reply = self
            .store
            .list_unresolved(Some(&self.key.agent_id), None, 1000)
            .await
            .unwrap();
        let page = reply.result.unwrap();
        let current = (self.key.clone(), self.model.clone());
        let mut expected: Vec<_> = self
            .retired
            .iter()
            .chain([&current])
            .filter(|(_, m)| ledger::is_unresolved(m.as_ref(), reply.now))
            .map(|(k, m)| {
                let asked = m.as_ref().map(|r| r.asked.clone()).unwrap_or_default();
                (k.clone(), ledger::view(m.as_ref(), reply.now), asked)
            })
            .collect();
        expected.sort_by_key(|(k, v, _)| (v.lease_expires_at, k.encode()));
        let listed: Vec<_> = page
            .items
            .into_iter()
            .map(|u| (u.key, u.view, u.asked))
            .collect();
        assert_eq!(
            listed, expected,
            "list_unresolved diverged at {}",
            reply.now
        );
        assert_eq!(page.next, None);
    }

    /// A new action of the same agent, so that no actor spends its run on a record that only
    /// waits (a long retention, an unresolved lease under reconcile).
    fn rotate(&mut self, i: usize) {
        let next = ActionKey::new(
            self.key.agent_id.clone(),
            "run",
            format!("key-{}-{i}", self.seed),
        );
        self.retired
            .push((std::mem::replace(&mut self.key, next), self.model.take()));
        self.variant = self.rng.below(2) as usize;
        self.side.approval = None;
        self.held = self.rng.below(3) == 0;
        self.charged = self.rng.below(2) == 0;
    }

    /// A regrant past an expired lease, then the newer token released: the path to a released
    /// record whose superseded grant is still out (random operations continue from there).
    async fn supersede_and_release(&mut self, i: usize) {
        let mut req = self.random_request(i, Some(OnExpiry::Regrant));
        req.lease = 40;
        self.request(req).await;
        self.time.pass(Duration::from_millis(45)).await;
        let mut again = self.random_request(i + 1_000_000, Some(OnExpiry::Regrant));
        again.fingerprint = format!("fp-{}", self.variant);
        again.digests = digests(PARAMS[self.variant]);
        self.request(again).await;
        let newest = self.tokens.last().cloned().unwrap_or_default();
        self.release(newest).await;
    }

    async fn run(mut self, ops: usize) {
        for i in 0..ops {
            match self.rng.below(19) {
                16 => self.decide(i).await,
                17 => self.budgets().await,
                18 => {
                    let req = self.random_request(i, None);
                    self.request(req).await;
                }
                0..=3 => {
                    let req = self.random_request(i, None);
                    self.request(req).await;
                }
                4 | 5 => {
                    let token = self.pick();
                    self.complete(token, format!("receipt-{i}").into_bytes())
                        .await;
                }
                6 => {
                    let token = self.pick();
                    self.release(token).await;
                }
                7 => {
                    let token = self.pick();
                    let ttl = [30, 4_000][self.rng.below(2) as usize];
                    self.extend(token, ttl).await;
                }
                8 => self.get().await,
                9 => self.external().await,
                10 => self.resolve(i).await,
                11 => self.list().await,
                12 | 13 => {
                    let ms = self.rng.below(60);
                    self.time.pass(Duration::from_millis(ms)).await;
                }
                14 => self.supersede_and_release(i).await,
                _ => self.rotate(i),
            }
        }
    }
}

async fn random_sequences_match_the_model(kind: Kind) {
    let (backend, time) = backend_with_test_clock(kind).await;
    let visited = Visited::default();
    let actors: Vec<_> = (1..=24u64)
        .map(|seed| {
            let actor = Actor {
                store: backend.store.clone(),
                time: time.clone(),
                rng: Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1),
                seed,
                key: ActionKey::new(format!("agent-{seed}"), "run", format!("key-{seed}")),
                variant: 0,
                model: None,
                retired: Vec::new(),
                tokens: vec!["never-granted".to_owned()],
                visited: visited.clone(),
                side: Side::default(),
                held: seed % 3 == 0,
                charged: seed % 2 == 0,
            };
            tokio::spawn(actor.run(200))
        })
        .collect();
    for actor in actors {
        actor.await.unwrap();
    }
    let visited = visited.lock().unwrap();
    let missed: Vec<_> = MUST_VISIT
        .iter()
        .filter(|w| !visited.contains(*w))
        .collect();
    assert!(missed.is_empty(), "the sequences never reached: {missed:?}");
}

on_stores!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    random_sequences_match_the_model: embedded, redis, cluster, sentinel, postgres
);
