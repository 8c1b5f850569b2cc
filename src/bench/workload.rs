//! The load itself: closed-loop workers, each with one request in flight at a time, running a
//! scenario against the gate and checking its answers while they load.
//!
//! Owns: what each scenario sends and what a correct gate must answer. Does not print (see
//! `report`) or choose targets (see `bench`).

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use tonic::{Status, transport::Channel};
use tonic_types::StatusExt;

use super::{
    Scenario,
    report::{Rpc, Tally},
};
use oncegate_proto::{self as pb, action_gate_service_client::ActionGateServiceClient};

/// The action name every bench request uses.
const ACTION: &str = "bench.transfer";
/// Completed actions each worker creates before the clock starts, for `replay` and `mix`.
const REPLAY_POOL: u64 = 8;

type Client = ActionGateServiceClient<Channel>;

/// What every worker shares: the plan and, for `contended`, who holds which key.
pub struct Shared {
    pub scenario: Scenario,
    /// A run id of this bench run's own, so runs never meet each other's records.
    pub run_id: String,
    pub receipt_bytes: usize,
    /// Name new actions by an idempotency key instead of by their fingerprint.
    pub idempotency_keys: bool,
    /// Stop after this many new actions (grant + complete), across all workers.
    pub max_actions: Option<u64>,
    actions_started: AtomicU64,
    slots: Vec<Mutex<Slot>>,
}

/// What the workers know about one contended key.
#[derive(Default)]
struct Slot {
    /// Completing a key's action moves the slot on to a fresh key (generation).
    generation: u64,
    /// The worker holding a live lease on the current key, if any.
    holder: Option<u32>,
    /// The highest fencing number granted on the current key.
    fencing: u64,
}

impl Shared {
    /// Shared state for `keys` contended keys.
    pub fn new(
        scenario: Scenario,
        keys: u32,
        receipt_bytes: usize,
        idempotency_keys: bool,
        max_actions: Option<u64>,
    ) -> Self {
        Self {
            scenario,
            run_id: format!("bench-{}", uuid::Uuid::new_v4().simple()),
            receipt_bytes,
            idempotency_keys,
            max_actions,
            actions_started: AtomicU64::new(0),
            slots: (0..keys.max(1)).map(|_| Mutex::default()).collect(),
        }
    }

    fn slot(&self, i: usize) -> std::sync::MutexGuard<'_, Slot> {
        // A poisoned slot only means another worker panicked; its counters are still usable.
        self.slots[i].lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A completed action and what its replays must return.
struct Replayable {
    request: pb::RequestTokenRequest,
    token: String,
    receipt: Vec<u8>,
}

/// One closed-loop caller.
pub struct Worker {
    id: u32,
    client: Client,
    shared: Arc<Shared>,
    rng: SplitMix,
    next_action: u64,
    pool: Vec<Replayable>,
    /// The measured window; nothing is timed outside it (checks count everywhere).
    window: Option<(Instant, Instant)>,
    tally: Tally,
}

impl Worker {
    pub fn new(id: u32, client: Client, shared: Arc<Shared>) -> Self {
        Self {
            id,
            client,
            shared,
            rng: SplitMix::seeded(u64::from(id)),
            next_action: 0,
            pool: Vec::new(),
            window: None,
            tally: Tally::new(),
        }
    }

    /// Before the clock starts: the completed actions `replay` and `mix` ask for again.
    pub async fn prepare(mut self) -> Self {
        if matches!(self.shared.scenario, Scenario::Replay | Scenario::Mix) {
            for _ in 0..REPLAY_POOL {
                if let Some(done) = self.grant_complete().await {
                    self.pool.push(done);
                }
            }
        }
        self
    }

    /// Loads until `end` (or until `--actions` new actions were started), timing calls that end
    /// inside `[start, end]`.
    pub async fn run(mut self, start: Instant, end: Instant) -> Tally {
        self.window = Some((start, end));
        while Instant::now() < end {
            let go_on = match self.shared.scenario {
                Scenario::GrantComplete => self.new_action().await,
                Scenario::Replay => self.replay().await,
                Scenario::Contended => self.contend().await,
                Scenario::Mix => match self.rng.below(10) {
                    0..=4 => self.new_action().await,
                    5..=8 => self.replay().await,
                    _ => self.contend().await,
                },
            };
            if !go_on {
                break;
            }
        }
        self.tally
    }

    fn in_window(&self, at: Instant) -> bool {
        self.window
            .is_some_and(|(start, end)| at >= start && at <= end)
    }

    fn note(&mut self, rpc: Rpc, started: Instant, outcome: &str) {
        let ended = Instant::now();
        if self.in_window(ended) {
            self.tally.record(rpc, ended - started, outcome);
        }
    }

    fn receipt(&self, n: u64) -> Vec<u8> {
        let mut receipt = format!("receipt-{}-{}-{n}", self.shared.run_id, self.id).into_bytes();
        receipt.resize(self.shared.receipt_bytes, b'.');
        receipt
    }

    fn request(&self, params: String, idempotency_key: String) -> pb::RequestTokenRequest {
        pb::RequestTokenRequest {
            scope: Some(pb::Scope {
                agent_id: "bench-agent".into(),
                run_id: self.shared.run_id.clone(),
            }),
            action: ACTION.into(),
            params_json: params,
            idempotency_key,
            ..Default::default()
        }
    }

    /// `grant-complete`: one new action, granted then completed. False once `--actions` is spent.
    async fn new_action(&mut self) -> bool {
        if let Some(max) = self.shared.max_actions
            && self.shared.actions_started.fetch_add(1, Ordering::Relaxed) >= max
        {
            return false;
        }
        if self.grant_complete().await.is_some() {
            let now = Instant::now();
            if self.in_window(now) {
                self.tally.pairs += 1;
            }
        }
        true
    }

    async fn grant_complete(&mut self) -> Option<Replayable> {
        let n = self.next_action;
        self.next_action += 1;
        let params = format!(
            r#"{{"amount":{n},"currency":"EUR","to":"acct-{}"}}"#,
            self.id
        );
        let key = if self.shared.idempotency_keys {
            format!("w{}-n{n}", self.id)
        } else {
            String::new()
        };
        let request = self.request(params, key);
        let started = Instant::now();
        let reply = self.client.request_token(request.clone()).await;
        self.note(Rpc::RequestToken, started, &token_outcome(&reply));
        let Some((action, grant)) = fresh_grant(reply) else {
            self.tally.checks.unexpected += 1;
            return None;
        };
        let receipt = self.receipt(n);
        let completed = self.complete(action, &grant.token, receipt.clone()).await;
        match completed {
            Some(done) if done.token == grant.token && done.receipt == receipt => {
                Some(Replayable {
                    request,
                    token: grant.token,
                    receipt,
                })
            }
            _ => {
                self.tally.checks.unexpected += 1;
                None
            }
        }
    }

    async fn complete(
        &mut self,
        action: Option<pb::ActionRef>,
        token: &str,
        receipt: Vec<u8>,
    ) -> Option<pb::Completion> {
        let started = Instant::now();
        let reply = self
            .client
            .complete(pb::CompleteRequest {
                action,
                token: token.to_owned(),
                receipt,
            })
            .await;
        let outcome = match &reply {
            Ok(_) => "completed".to_owned(),
            Err(status) => reason(status),
        };
        self.note(Rpc::Complete, started, &outcome);
        reply.ok().and_then(|r| r.into_inner().completion)
    }

    async fn release(&mut self, action: Option<pb::ActionRef>, token: &str) -> Option<u64> {
        let started = Instant::now();
        let reply = self
            .client
            .release(pb::ReleaseRequest {
                action,
                token: token.to_owned(),
                reason: pb::ReleaseReason::NotAttempted as i32,
            })
            .await;
        let outcome = match &reply {
            Ok(_) => "released".to_owned(),
            Err(status) => reason(status),
        };
        self.note(Rpc::Release, started, &outcome);
        reply.ok().map(|r| r.into_inner().fencing)
    }

    /// `replay`: ask again for a completed action; the answer must be its stored receipt.
    async fn replay(&mut self) -> bool {
        if self.pool.is_empty() {
            // Preparation failed (already counted as unexpected); fall back to new actions.
            return self.new_action().await;
        }
        let i = self.rng.below(self.pool.len() as u64) as usize;
        let request = self.pool[i].request.clone();
        let started = Instant::now();
        let reply = self.client.request_token(request).await;
        self.note(Rpc::RequestToken, started, &token_outcome(&reply));
        let entry = &self.pool[i];
        match reply.map(|r| r.into_inner()) {
            Ok(resp) if resp.decision() == pb::Decision::AlreadyCompleted => {
                let matches = resp
                    .completion
                    .is_some_and(|c| c.receipt == entry.receipt && c.token == entry.token);
                if !matches {
                    self.tally.checks.receipt_mismatches += 1;
                }
            }
            // A completed action answered with anything but its receipt breaks the guarantee.
            Ok(_) => self.tally.checks.receipt_mismatches += 1,
            Err(_) => self.tally.checks.unexpected += 1,
        }
        true
    }

    /// `contended`: many workers on a few keys. A worker that gets a grant checks that nobody else
    /// holds the key, then releases it (three times in four) or completes it (which moves the slot
    /// on to a fresh key), so the keys stay contended for the whole run.
    async fn contend(&mut self) -> bool {
        let slot = self.rng.below(self.shared.slots.len() as u64) as usize;
        let generation = self.shared.slot(slot).generation;
        let request = self.request(
            format!(r#"{{"slot":{slot}}}"#),
            format!("slot{slot}-gen{generation}"),
        );
        let started = Instant::now();
        let reply = self.client.request_token(request).await;
        self.note(Rpc::RequestToken, started, &token_outcome(&reply));
        let reply = match reply {
            Ok(resp) => resp.into_inner(),
            Err(status) => {
                if reason(&status) != "IDEMPOTENCY_IN_PROGRESS" {
                    self.tally.checks.unexpected += 1;
                }
                return true;
            }
        };
        if reply.decision() != pb::Decision::Granted {
            // ALREADY_COMPLETED: the slot moved on after this worker read its generation.
            return true;
        }
        let Some(grant) = reply.grant else {
            self.tally.checks.unexpected += 1;
            return true;
        };
        {
            let mut s = self.shared.slot(slot);
            if s.generation != generation {
                self.tally.checks.grants_after_completion += 1;
            } else {
                if s.holder.is_some() {
                    self.tally.checks.double_grants += 1;
                }
                if grant.fencing <= s.fencing {
                    self.tally.checks.fencing_regressions += 1;
                }
                s.fencing = s.fencing.max(grant.fencing);
                s.holder = Some(self.id);
            }
        }
        // "Execute" the action: let the other workers run while this lease is held.
        tokio::task::yield_now().await;
        let complete = self.rng.below(4) == 0;
        {
            // Give the key up in the shared view *before* the store hears of it, so a grant seen
            // while `holder` is set really overlapped a live lease.
            let mut s = self.shared.slot(slot);
            if s.generation == generation && s.holder == Some(self.id) {
                s.holder = None;
                if complete {
                    s.generation += 1;
                    s.fencing = 0;
                }
            }
        }
        let ok = if complete {
            let receipt = self.receipt(grant.fencing);
            self.complete(reply.action, &grant.token, receipt)
                .await
                .is_some_and(|c| c.token == grant.token && c.fencing == grant.fencing)
        } else {
            self.release(reply.action, &grant.token).await == Some(grant.fencing)
        };
        if !ok {
            self.tally.checks.unexpected += 1;
        }
        true
    }
}

/// The action and grant of a reply that granted a new token; `None` for anything else.
fn fresh_grant(
    reply: Result<tonic::Response<pb::RequestTokenResponse>, Status>,
) -> Option<(Option<pb::ActionRef>, pb::Grant)> {
    let resp = reply.ok()?.into_inner();
    if resp.decision() != pb::Decision::Granted || resp.redelivered {
        return None;
    }
    Some((resp.action, resp.grant?))
}

fn token_outcome(reply: &Result<tonic::Response<pb::RequestTokenResponse>, Status>) -> String {
    match reply {
        Ok(resp) => match resp.get_ref().decision() {
            pb::Decision::Granted if resp.get_ref().redelivered => "redelivered".into(),
            pb::Decision::Granted => "granted".into(),
            pb::Decision::AlreadyCompleted => "already_completed".into(),
            pb::Decision::PendingApproval => "pending_approval".into(),
            pb::Decision::Unspecified => "unspecified".into(),
        },
        Err(status) => reason(status),
    }
}

/// The ErrorInfo reason of an error, or the bare gRPC code when it carries none.
fn reason(status: &Status) -> String {
    match status.get_error_details().error_info() {
        Some(info) => info.reason.clone(),
        None => format!("grpc_{:?}", status.code()),
    }
}

/// A small, fast pseudo-random generator (SplitMix64): which key or replay to pick next.
struct SplitMix(u64);

impl SplitMix {
    fn seeded(seed: u64) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
            .subsec_nanos();
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(nanos))
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}
