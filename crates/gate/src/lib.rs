//! The gate: every worker and operator operation as validation, one policy lookup and one store
//! call, each timed, counted and audited here and nowhere else.
//!
//! Owns: what a well-formed request is ([`request`]), which key identifies an action, minting
//! tokens, the action policies ([`policy`]), RequestToken with its rules, budgets and shadow mode
//! (`token`, [`rules`], [`authorization`], `shadow`), signing grants and receipts ([`signing`]),
//! the operator operations ([`operator`], [`approvals`], `watch`: the unresolved actions as they
//! appear), the audit trail ([`audit`]), the events for webhooks each operation emits
//! ([`events`], never waiting for them) and, for the console, this replica's recent decisions
//! ([`recent`]). Knows
//! no gRPC types (the `grpc` layer converts) and decides no state transition (the store applies
//! the ledger).

pub mod approvals;
pub mod audit;
pub mod authorization;
pub mod decision;
pub mod error;
pub mod events;
pub mod operator;
pub mod policy;
pub mod recent;
pub mod request;
pub mod rules;
mod shadow;
pub mod signing;
mod token;
mod watch;

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
    time::Instant,
};

pub use decision::TokenDecision;
pub use error::{GateError, OverBudget};
pub use events::{Emitted, Emitter};
pub use operator::{ExternalCall, ResolvedBy, Settlement};
pub use request::{Prepared, TokenCall};
pub use signing::Signer;

use authorization::Authorization;
use oncegate_domain::{
    ActionKey,
    event::{Event, EventType},
    ledger::{ActionView, CompleteOutcome, Millis, Refusal, TokenOutcome},
};
use oncegate_observe::{
    metrics::{Decision, DoubleExecution, Metrics},
    telemetry,
};
use oncegate_store::{Receipts, Store, StoreError};
use policy::{ActionPolicy, Policies};

/// A RequestToken that was answered (granted or replayed).
#[derive(Debug, Clone)]
pub struct TokenAnswer {
    pub key: ActionKey,
    pub fingerprint: String,
    pub provider_key: String,
    pub outcome: TokenOutcome,
    /// Replicas that confirmed the grant before it was handed out (Redis `WAIT`; 0 without a
    /// durability level).
    pub replicas_acknowledged: u32,
    /// The signed grant statement (empty for a replay, or when the gate does not sign).
    pub statement: String,
    /// True when the grant is shadow mode's: enforcement would have answered otherwise, and the
    /// token is not recorded (Complete, Release and ExtendLease with it touch nothing).
    pub shadow: bool,
}

/// The gate over one store. Cheap to clone.
#[derive(Clone)]
pub struct Gate {
    store: Store,
    policies: Arc<Policies>,
    metrics: Metrics,
    /// Signs grants and receipts; `None`: the gate hands out no statements and keeps no chains.
    signer: Option<Arc<Signer>>,
    /// Where grants are signed when not on the calling task ([`Gate::signing_on_own_thread`]).
    signing_thread: Option<Arc<signing::SigningThread>>,
    authz: Arc<Authorization>,
    /// Where events for webhooks go; `None` (no webhook configured): no event is built.
    events: Option<Emitter>,
    /// WatchUnresolved's shared scan (started by the first watcher).
    watcher: watch::Watcher,
    /// This replica's last RequestToken decisions, for the console; `None`: not kept.
    recent: Option<Arc<recent::RecentDecisions>>,
}

impl Gate {
    /// A gate over `store` with `policies`, counting into metrics nobody reads.
    pub fn new(store: Store, policies: Policies) -> Self {
        Self::with_metrics(store, policies, Metrics::default())
    }

    /// A gate over `store` with `policies` that counts every decision into `metrics` (registered
    /// by the caller with the same policies' names, see [`Metrics::register`]).
    pub fn with_metrics(store: Store, policies: Policies, metrics: Metrics) -> Self {
        Self {
            store,
            policies: Arc::new(policies),
            metrics,
            signer: None,
            signing_thread: None,
            authz: Arc::default(),
            events: None,
            watcher: watch::Watcher::default(),
            recent: None,
        }
    }

    /// This gate, emitting events for webhooks into `emitter`'s queue.
    pub fn with_events(mut self, emitter: Emitter) -> Self {
        self.events = Some(emitter);
        self
    }

    /// Hands an event of `kind` over, built only when some webhook wants it; never waits.
    fn emit(&self, kind: EventType, make: impl FnOnce() -> Emitted) {
        if let Some(events) = &self.events {
            events.emit(kind, &self.metrics, make);
        }
    }

    /// `store.unavailable`: the store failed the health probe from `since` until `until` (the
    /// gate's clock: the store's could not be read meanwhile).
    pub fn store_was_unavailable(&self, since: Millis, until: Millis) {
        self.emit(EventType::StoreUnavailable, || {
            Emitted::Event(Event::store_unavailable(self.store.kind(), since, until))
        });
    }

    /// This gate, signing every grant and every recorded completion with `signer`.
    pub fn with_signer(mut self, signer: Arc<Signer>) -> Self {
        self.signer = Some(signer);
        self
    }

    /// This gate, signing grant statements on a thread of their own (see `SigningThread`), as
    /// a served gate does. Nothing changes when the gate does not sign.
    pub fn signing_on_own_thread(mut self) -> std::io::Result<Self> {
        if let Some(signer) = &self.signer {
            self.signing_thread = Some(Arc::new(signing::SigningThread::start(signer.clone())?));
        }
        Ok(self)
    }

    /// The signer, when the gate signs.
    pub fn signer(&self) -> Option<&Arc<Signer>> {
        self.signer.as_ref()
    }

    /// The signer as the stores take it for receipt chains.
    fn receipts(&self) -> Option<Receipts> {
        self.signer.clone().map(|s| s as Receipts)
    }

    /// This gate with `authz`: rules, budgets, approvals and shadow mode (none by default). The
    /// budgets' metric series start at zero.
    pub fn with_authorization(mut self, authz: impl Into<Authorization>) -> Self {
        let authz: Authorization = authz.into();
        self.metrics
            .register_budgets(authz.budgets.iter().map(|b| b.name.as_str()));
        self.authz = Arc::new(authz);
        self
    }

    /// The authorization settings (rules reload through it).
    pub fn authorization(&self) -> &Authorization {
        &self.authz
    }

    /// The metric handles this gate counts into.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// This gate (its policies, rules, signer, metrics and events) over another handle on the
    /// same store: a second connection to the same Redis, say, whose tasks run where it was
    /// opened.
    pub fn on_store(&self, store: Store) -> Self {
        Self {
            store,
            // Its callers drive their own runtime and wait for their answer: a hand-off to
            // another thread would only add two wake-ups.
            signing_thread: None,
            ..self.clone()
        }
    }

    /// The store this gate uses (for health probes; every state change goes through the gate).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The policies this gate enforces.
    pub fn policies(&self) -> &Policies {
        &self.policies
    }

    /// Counts a RequestToken refused as malformed (decision `invalid`) and returns its error. The
    /// `grpc` layer calls this for requests it cannot even convert (a missing scope, a bad
    /// duration).
    pub fn invalid_attempt(&self, action: &str, error: GateError) -> GateError {
        self.invalid(self.policies.for_action(action), error)
    }

    fn invalid(&self, policy: Option<&ActionPolicy>, error: GateError) -> GateError {
        self.metrics.attempt(policy_name(policy), Decision::Invalid);
        telemetry::record_decision(Decision::Invalid.as_str());
        error
    }

    /// Runs one store call, timing it and counting its failure.
    fn timed<F>(&self, operation: &'static str, call: F) -> Timed<'_, F> {
        Timed {
            metrics: &self.metrics,
            operation,
            start: None,
            call,
        }
    }

    /// Complete: record the outcome of an attempt.
    pub async fn complete(
        &self,
        key: &ActionKey,
        token: &str,
        receipt: &[u8],
    ) -> Result<CompleteOutcome, GateError> {
        self.check_ref(key)?;
        self.check_token(token)?;
        telemetry::record_action(&key.agent_id, &key.run_id, None, &key.key);
        let limits = &self.policies.limits;
        request::check_bytes("receipt", receipt.len(), limits.max_receipt_bytes)?;
        if let Some(done) = shadow::complete(key, token, receipt) {
            return Ok(done);
        }
        let durability = self.policies.highest_durability();
        let reply = self
            .timed(
                "complete",
                self.store
                    .complete(key, token, receipt, durability, self.receipts().as_ref()),
            )
            .await?;
        match &reply.result {
            Ok(done) => {
                if done.recorded {
                    self.metrics.completion(done.completion.source);
                }
                if done.double_execution {
                    self.emit(EventType::ExecutionDoubled, || {
                        Emitted::Event(Event::execution_doubled(
                            key,
                            DoubleExecution::SupersededCompletion.as_str(),
                            done.completion.fencing,
                            token,
                            reply.now,
                        ))
                    });
                    self.metrics
                        .double_execution(DoubleExecution::SupersededCompletion);
                    audit::double_execution(
                        key,
                        done.completion.fencing,
                        "a superseded token completed",
                    );
                }
                let decision = if done.recorded {
                    "completed"
                } else {
                    "complete_repeated"
                };
                audit::audit!(
                    info,
                    key,
                    decision = decision,
                    fencing = done.completion.fencing,
                    "complete"
                );
            }
            Err(refusal @ Refusal::CompletedByOther { fencing, .. }) => {
                // The holder ran an action someone else (a newer token or an operator) completed.
                self.metrics
                    .double_execution(DoubleExecution::CompletedByOther);
                self.emit(EventType::ExecutionDoubled, || {
                    Emitted::Event(Event::execution_doubled(
                        key,
                        DoubleExecution::CompletedByOther.as_str(),
                        *fencing,
                        token,
                        reply.now,
                    ))
                });
                audit::double_execution(
                    key,
                    *fencing,
                    "the action was completed by another token or an operator",
                );
                audit::refused("complete", key, refusal);
            }
            Err(refusal) => audit::refused("complete", key, refusal),
        }
        reply.result.map_err(GateError::Refused)
    }

    /// Release: give a token back after a definite failure or a non-attempt.
    pub async fn release(
        &self,
        key: &ActionKey,
        token: &str,
        reason: &str,
    ) -> Result<u64, GateError> {
        self.check_ref(key)?;
        self.check_token(token)?;
        telemetry::record_action(&key.agent_id, &key.run_id, None, &key.key);
        if let Some(fencing) = shadow::release(key, token) {
            return Ok(fencing);
        }
        let durability = self.policies.highest_durability();
        let reply = self
            .timed("release", self.store.release(key, token, durability))
            .await?;
        match &reply.result {
            Ok(fencing) => {
                self.metrics.release(reason);
                audit::audit!(info, key, decision = "released", reason, fencing, "release")
            }
            Err(refusal) => audit::refused("release", key, refusal),
        }
        reply.result.map_err(GateError::Refused)
    }

    /// ExtendLease: move a live lease to now + ttl.
    pub async fn extend_lease(
        &self,
        key: &ActionKey,
        token: &str,
        ttl: Option<Millis>,
    ) -> Result<Millis, GateError> {
        self.check_ref(key)?;
        self.check_token(token)?;
        telemetry::record_action(&key.agent_id, &key.run_id, None, &key.key);
        let ttl = ttl.ok_or_else(|| GateError::invalid("ttl", "is required"))?;
        let ttl = request::check_ttl(&self.policies.limits, "ttl", ttl)?;
        if let Some(at) = shadow::extend(key, token, ttl) {
            return Ok(at);
        }
        let durability = self.policies.highest_durability();
        let reply = self
            .timed(
                "extend_lease",
                self.store.extend_lease(key, token, ttl, durability),
            )
            .await?;
        match &reply.result {
            Ok(_) => telemetry::record_decision("extended"),
            Err(refusal) => audit::refused("extend_lease", key, refusal),
        }
        reply.result.map_err(GateError::Refused)
    }

    /// GetAction: the record as it stands.
    pub async fn get(&self, key: &ActionKey) -> Result<ActionView, GateError> {
        self.check_ref(key)?;
        telemetry::record_action(&key.agent_id, &key.run_id, None, &key.key);
        let reply = self.timed("get_action", self.store.get(key)).await?;
        reply.result.map_err(GateError::Refused)
    }

    /// Validates an action reference (ids present and within the limits).
    pub fn check_ref(&self, key: &ActionKey) -> Result<(), GateError> {
        request::check_ref(&self.policies.limits, key)
    }

    fn check_token(&self, token: &str) -> Result<(), GateError> {
        request::check_id(&self.policies.limits, "token", token, true)
    }
}

/// The metrics' `action` label of a policy (`None`: no policy names the action).
fn policy_name(policy: Option<&ActionPolicy>) -> Option<&str> {
    policy.and_then(|p| p.name.as_deref())
}

pin_project_lite::pin_project! {
    /// One store call ([`Gate::timed`]), timed from its first poll and counted when it ends. A
    /// future of its own, not an `async fn`: that would hold the call's future twice (as its
    /// argument and as what it awaits), and so every RPC's future above it, which is moved whole
    /// (into its box, and into each caller's state).
    struct Timed<'a, F> {
        metrics: &'a Metrics,
        operation: &'static str,
        start: Option<Instant>,
        #[pin]
        call: F,
    }
}

impl<T, F: Future<Output = Result<T, StoreError>>> Future for Timed<'_, F> {
    type Output = Result<T, StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let start = *this.start.get_or_insert_with(Instant::now);
        let result = ready!(this.call.poll(cx));
        this.metrics.store_call(
            this.operation,
            start.elapsed(),
            result.as_ref().err().map(StoreError::kind),
        );
        if result.is_err() {
            telemetry::record_decision("store_error");
        }
        Poll::Ready(result)
    }
}
