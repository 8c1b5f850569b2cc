//! The gate: every worker and operator operation as validation, one policy lookup and one store
//! call, each timed, counted and audited here and nowhere else.
//!
//! Owns: what a well-formed request is ([`request`]), which key identifies an action, minting
//! tokens, the action policies ([`policy`]), the operator operations ([`operator`]) and the audit
//! trail ([`audit`]). Knows no gRPC types (the `grpc` layer converts) and decides no state
//! transition (the store applies the ledger).

pub mod audit;
pub mod error;
pub mod operator;
pub mod policy;
pub mod request;
pub mod signing;

use std::{future::Future, sync::Arc, time::Instant};

pub use error::GateError;
pub use operator::ExternalCall;
pub use request::{Prepared, TokenCall};
pub use signing::Signer;

use crate::{
    domain::{
        ActionKey,
        ledger::{ActionView, CompleteOutcome, Millis, Refusal, TokenOutcome},
        statement::grant::GrantClaims,
    },
    observe::{
        metrics::{Decision, DoubleExecution, Metrics},
        telemetry,
    },
    store::{Receipts, Store, StoreError},
};
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
}

/// The gate over one store. Cheap to clone.
#[derive(Clone)]
pub struct Gate {
    store: Store,
    policies: Arc<Policies>,
    metrics: Metrics,
    /// Signs grants and receipts; `None`: the gate hands out no statements and keeps no chains.
    signer: Option<Arc<Signer>>,
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
        }
    }

    /// This gate, signing every grant and every recorded completion with `signer`.
    pub fn with_signer(mut self, signer: Arc<Signer>) -> Self {
        self.signer = Some(signer);
        self
    }

    /// The signer, when the gate signs.
    pub fn signer(&self) -> Option<&Arc<Signer>> {
        self.signer.as_ref()
    }

    /// The signer as the stores take it for receipt chains.
    fn receipts(&self) -> Option<Receipts> {
        self.signer.clone().map(|s| s as Receipts)
    }

    /// The metric handles this gate counts into.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The store this gate uses (for health probes; every state change goes through the gate).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The policies this gate enforces.
    pub fn policies(&self) -> &Policies {
        &self.policies
    }

    /// RequestToken: validate, fingerprint with the action's key fields, then one atomic store step.
    /// Every call is counted in `oncegate_attempts_total`, by decision, unless the store failed.
    pub async fn request_token(&self, call: TokenCall) -> Result<TokenAnswer, GateError> {
        let policy = self.policies.for_action(&call.action);
        let action = call.action.clone();
        let intent = call.intent_id.clone();
        let limits = &self.policies.limits;
        let Prepared { key, request } =
            match request::prepare_token(limits, policy, call, request::new_token()) {
                Ok(prepared) => prepared,
                Err(e) => return Err(self.invalid(policy, e)),
            };
        telemetry::record_action(&key.agent_id, &key.run_id, Some(&action), &key.key);
        let durability = policy.map_or(0, |p| p.durability_replicas);
        let acked = self
            .timed(
                "request_token",
                self.store.request_token(&key, &request, durability),
            )
            .await?;
        let reply = acked.reply;
        if let Some(decision) = audit::token_decision(&reply.result) {
            self.metrics.attempt(policy_name(policy), decision);
        }
        audit::token(&key, &action, &reply.result);
        let outcome = reply.result.map_err(|refusal| match refusal {
            Refusal::LeaseExpired { .. } => GateError::Unresolved {
                key: key.clone(),
                refusal,
            },
            refusal => GateError::Refused(refusal),
        })?;
        let provider_key = key.provider_key();
        let statement = match (&self.signer, &outcome) {
            (Some(signer), TokenOutcome::Granted(grant, _)) => {
                let claims = GrantClaims {
                    iss: signer.issuer().into(),
                    aud: policy
                        .and_then(|p| p.audience.clone())
                        .unwrap_or_else(|| action.clone()),
                    iat: reply.now.div_euclid(1000),
                    exp: grant.lease_expires_at.div_euclid(1000),
                    agent: key.agent_id.clone(),
                    run: key.run_id.clone(),
                    action,
                    key: key.key.clone(),
                    intent,
                    fingerprint: request.fingerprint.clone(),
                    fencing: grant.fencing,
                    provider_key: provider_key.clone(),
                };
                signer.sign_grant(&claims)
            }
            _ => String::new(),
        };
        Ok(TokenAnswer {
            provider_key,
            key,
            fingerprint: request.fingerprint,
            outcome,
            replicas_acknowledged: acked.replicas,
            statement,
        })
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
    async fn timed<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let start = Instant::now();
        let result = call.await;
        self.metrics.store_call(
            operation,
            start.elapsed(),
            result.as_ref().err().map(StoreError::kind),
        );
        if result.is_err() {
            telemetry::record_decision("store_error");
        }
        result
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
        let durability = self.policies.highest_durability();
        let reply = self
            .timed(
                "complete",
                self.store
                    .complete(key, token, receipt, durability, self.receipts().as_ref()),
            )
            .await?
            .reply;
        match &reply.result {
            Ok(done) => {
                if done.recorded {
                    self.metrics.completion(done.completion.source);
                }
                if done.double_execution {
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
                telemetry::record_decision(decision);
                audit::audit!(
                    info,
                    key,
                    decision,
                    fencing = done.completion.fencing,
                    "complete"
                );
            }
            Err(refusal @ Refusal::CompletedByOther { fencing, .. }) => {
                // The holder ran an action someone else (a newer token or an operator) completed.
                self.metrics
                    .double_execution(DoubleExecution::CompletedByOther);
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
        let durability = self.policies.highest_durability();
        let reply = self
            .timed("release", self.store.release(key, token, durability))
            .await?
            .reply;
        match &reply.result {
            Ok(fencing) => {
                self.metrics.release(reason);
                telemetry::record_decision("released");
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
        let durability = self.policies.highest_durability();
        let reply = self
            .timed(
                "extend_lease",
                self.store.extend_lease(key, token, ttl, durability),
            )
            .await?
            .reply;
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
