//! The gate: validation, policy lookup and fingerprinting around one store call per RPC.
//!
//! Owns: what a well-formed request is (limits from SPEC.md "Defaults"), which key identifies an
//! action, minting tokens, and the audit line, metrics and span fields of every decision. Knows no
//! gRPC types (the service converts) and decides no state transition (the store applies the ledger).

use std::{future::Future, sync::Arc, time::Instant};

use crate::{
    error::GateError,
    fingerprint::{self, ParamsError, ParamsLimits},
    ledger::{ActionView, CompleteOutcome, GrantKind, Millis, Refusal, TokenOutcome, TokenRequest},
    metrics::{Decision, DoubleExecution, Metrics},
    policy::{Limits, Policies},
    store::{ActionKey, Store, StoreError},
    telemetry,
};

/// Target of the audit events: one per decision, routable on its own (`RUST_LOG=oncegate::audit=info`).
pub const AUDIT: &str = "oncegate::audit";

/// A RequestToken as the gate sees it.
#[derive(Debug, Clone, Default)]
pub struct TokenCall {
    pub agent_id: String,
    pub run_id: String,
    pub action: String,
    pub params_json: String,
    pub intent_id: String,
    pub idempotency_key: String,
    pub holder: String,
    /// Requested lease, when the caller set one.
    pub lease: Option<Millis>,
}

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
}

/// The gate over one store. Cheap to clone.
#[derive(Clone)]
pub struct Gate {
    store: Store,
    policies: Arc<Policies>,
    metrics: Metrics,
}

impl Gate {
    /// A gate over `store` with `policies`, counting into metrics nobody reads.
    pub fn new(store: Store, policies: Policies) -> Self {
        Self::with_metrics(store, policies, Metrics::default())
    }

    /// A gate over `store` with `policies` that counts every decision into `metrics` (registered
    /// by the caller with the same policies, see [`Metrics::register`]).
    pub fn with_metrics(store: Store, policies: Policies, metrics: Metrics) -> Self {
        Self {
            store,
            policies: Arc::new(policies),
            metrics,
        }
    }

    /// The metric handles this gate counts into.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The store this gate uses.
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
        let action = call.action.clone();
        let Prepared { key, request } = match prepare_token(&self.policies, call, new_token()) {
            Ok(prepared) => prepared,
            Err(e) => return Err(self.invalid_attempt(&action, e)),
        };
        telemetry::record_action(&key.agent_id, &key.run_id, Some(&action), &key.key);
        let durability = self
            .policies
            .for_action(&action)
            .map_or(0, |p| p.durability_replicas);
        let acked = self
            .timed(
                "request_token",
                self.store.request_token_durable(&key, &request, durability),
            )
            .await?;
        let reply = acked.reply;
        if let Some(decision) = token_decision(&reply.result) {
            self.metrics.attempt(self.policy_name(&action), decision);
        }
        audit_token(&key, &action, &reply.result);
        let outcome = reply.result.map_err(GateError::Refused)?;
        Ok(TokenAnswer {
            provider_key: key.provider_key(),
            key,
            fingerprint: request.fingerprint,
            outcome,
            replicas_acknowledged: acked.replicas,
        })
    }

    /// Counts a RequestToken refused as malformed (decision `invalid`) and returns its error. The
    /// service calls this for requests it cannot even convert (a missing scope, a bad duration).
    pub fn invalid_attempt(&self, action: &str, error: GateError) -> GateError {
        self.metrics
            .attempt(self.policy_name(action), Decision::Invalid);
        telemetry::record_decision(Decision::Invalid.as_str());
        error
    }

    /// The name of the policy governing `action`, the metrics' `action` label (`None`: no policy
    /// names it).
    fn policy_name(&self, action: &str) -> Option<&str> {
        self.policies
            .for_action(action)
            .and_then(|p| p.name.as_deref())
    }

    /// Runs one store call, timing it and counting its failure.
    async fn timed<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let start = Instant::now();
        let result = call.await;
        self.metrics
            .store_call(operation, start.elapsed(), result.as_ref().err());
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
        if receipt.len() > self.policies.limits.max_receipt_bytes {
            return Err(GateError::invalid(
                "receipt",
                format!(
                    "is {} bytes, more than the limit of {}",
                    receipt.len(),
                    self.policies.limits.max_receipt_bytes
                ),
            ));
        }
        let durability = self.policies.highest_durability();
        let reply = self
            .timed(
                "complete",
                self.store.complete_durable(key, token, receipt, durability),
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
                    tracing::warn!(target: AUDIT, agent_id = %key.agent_id, run_id = %key.run_id, key = %key.key,
                        fencing = done.completion.fencing, "double execution: a superseded token completed");
                }
                let decision = if done.recorded {
                    "completed"
                } else {
                    "complete_repeated"
                };
                telemetry::record_decision(decision);
                tracing::info!(target: AUDIT, agent_id = %key.agent_id, run_id = %key.run_id, key = %key.key,
                    decision, fencing = done.completion.fencing, "complete");
            }
            Err(refusal @ Refusal::CompletedByOther { fencing, .. }) => {
                // The holder ran an action someone else (a newer token or an operator) completed.
                self.metrics
                    .double_execution(DoubleExecution::CompletedByOther);
                tracing::warn!(target: AUDIT, agent_id = %key.agent_id, run_id = %key.run_id, key = %key.key,
                    fencing, "double execution: the action was completed by another token or an operator");
                audit_refusal("complete", key, refusal);
            }
            Err(refusal) => audit_refusal("complete", key, refusal),
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
            .timed(
                "release",
                self.store.release_durable(key, token, durability),
            )
            .await?
            .reply;
        match &reply.result {
            Ok(fencing) => {
                self.metrics.release(reason);
                telemetry::record_decision("released");
                tracing::info!(target: AUDIT, agent_id = %key.agent_id, run_id = %key.run_id,
                key = %key.key, decision = "released", reason, fencing, "release")
            }
            Err(refusal) => audit_refusal("release", key, refusal),
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
        let ttl = match ttl {
            None => return Err(GateError::invalid("ttl", "is required")),
            Some(ms) if ms <= 0 => return Err(GateError::invalid("ttl", "must be positive")),
            Some(ms) if ms > self.policies.limits.max_lease => {
                return Err(GateError::invalid(
                    "ttl",
                    format!(
                        "must be at most {} s",
                        self.policies.limits.max_lease / 1000
                    ),
                ));
            }
            Some(ms) => ms,
        };
        let durability = self.policies.highest_durability();
        let reply = self
            .timed(
                "extend_lease",
                self.store.extend_lease_durable(key, token, ttl, durability),
            )
            .await?
            .reply;
        match &reply.result {
            Ok(_) => telemetry::record_decision("extended"),
            Err(refusal) => audit_refusal("extend_lease", key, refusal),
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

    fn check_id(&self, field: &str, value: &str, required: bool) -> Result<(), GateError> {
        check_id(&self.policies.limits, field, value, required)
    }

    /// Validates an action reference (ids present and within the limits).
    pub fn check_ref(&self, key: &ActionKey) -> Result<(), GateError> {
        self.check_id("action.scope.agent_id", &key.agent_id, true)?;
        self.check_id("action.scope.run_id", &key.run_id, true)?;
        self.check_id("action.key", &key.key, true)
    }

    fn check_token(&self, token: &str) -> Result<(), GateError> {
        self.check_id("token", token, true)
    }
}

/// A validated, fingerprinted RequestToken, ready for the store.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub key: ActionKey,
    pub request: TokenRequest,
}

/// Validates a RequestToken against the limits and policies and computes its key and request
/// hash; `new_token` is handed out if the store grants. Pure: the fuzz targets and property tests
/// drive it directly.
pub fn prepare_token(
    policies: &Policies,
    call: TokenCall,
    new_token: String,
) -> Result<Prepared, GateError> {
    let limits = &policies.limits;
    check_id(limits, "scope.agent_id", &call.agent_id, true)?;
    check_id(limits, "scope.run_id", &call.run_id, true)?;
    check_id(limits, "action", &call.action, true)?;
    check_id(limits, "intent_id", &call.intent_id, false)?;
    check_id(limits, "idempotency_key", &call.idempotency_key, false)?;
    check_id(limits, "holder", &call.holder, false)?;
    let policy = policies.for_action(&call.action).ok_or_else(|| {
        GateError::invalid(
            "action",
            "no policy names this action and the gate is strict",
        )
    })?;
    let lease = match call.lease {
        None => policy.lease,
        Some(ms) if ms <= 0 => return Err(GateError::invalid("lease_ttl", "must be positive")),
        Some(ms) if ms > limits.max_lease => {
            return Err(GateError::invalid(
                "lease_ttl",
                format!("must be at most {} s", limits.max_lease / 1000),
            ));
        }
        Some(ms) => ms,
    };
    let params_limits = ParamsLimits {
        max_bytes: limits.max_params_bytes,
        max_depth: limits.max_params_depth,
    };
    let params =
        fingerprint::parse_params(&call.params_json, params_limits).map_err(params_error)?;
    let selection = fingerprint::select(&params, &policy.key_fields);
    let fp = fingerprint::fingerprint(&call.action, &call.intent_id, &selection);
    let keyed = !call.idempotency_key.is_empty();
    let key = ActionKey::new(
        call.agent_id,
        call.run_id,
        if keyed {
            call.idempotency_key
        } else {
            fp.clone()
        },
    );
    let request = TokenRequest {
        fingerprint: fp,
        // Only an idempotency key can meet a different request; a fingerprint key cannot.
        digests: if keyed {
            fingerprint::field_digests(&call.action, &call.intent_id, &selection)
        } else {
            String::new()
        },
        holder: call.holder,
        new_token,
        lease,
        retention: policy.retention,
        sliding: policy.sliding,
        on_expiry: policy.on_expiry,
    };
    Ok(Prepared { key, request })
}

/// An id is within `max_id_bytes`, and present when `required`.
pub fn check_id(
    limits: &Limits,
    field: &str,
    value: &str,
    required: bool,
) -> Result<(), GateError> {
    let max = limits.max_id_bytes;
    if required && value.is_empty() {
        return Err(GateError::invalid(field, "must not be empty"));
    }
    if value.len() > max {
        return Err(GateError::invalid(
            field,
            format!("is {} bytes, more than the limit of {max}", value.len()),
        ));
    }
    Ok(())
}

/// A fresh one-shot token: a UUIDv4 carries 122 random bits from the OS generator.
fn new_token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

fn params_error(e: ParamsError) -> GateError {
    GateError::invalid("params_json", e.to_string())
}

fn audit_token(key: &ActionKey, action: &str, result: &Result<TokenOutcome, Refusal>) {
    let (decision, fencing) = match result {
        Ok(TokenOutcome::Granted(grant, GrantKind::New)) => ("granted", grant.fencing),
        Ok(TokenOutcome::Granted(grant, GrantKind::Redelivered)) => ("redelivered", grant.fencing),
        Ok(TokenOutcome::Granted(grant, GrantKind::Regranted)) => ("regranted", grant.fencing),
        Ok(TokenOutcome::AlreadyCompleted(done)) => ("replayed", done.fencing),
        Err(refusal) => (refusal_name(refusal), 0),
    };
    telemetry::record_decision(decision);
    tracing::info!(target: AUDIT, agent_id = %key.agent_id, run_id = %key.run_id, action, key = %key.key,
        decision, fencing, "request_token");
}

/// The metrics decision of a RequestToken reply (`None` for refusals RequestToken never gives).
fn token_decision(result: &Result<TokenOutcome, Refusal>) -> Option<Decision> {
    Some(match result {
        Ok(TokenOutcome::Granted(_, GrantKind::New)) => Decision::Granted,
        Ok(TokenOutcome::Granted(_, GrantKind::Redelivered)) => Decision::Redelivered,
        Ok(TokenOutcome::Granted(_, GrantKind::Regranted)) => Decision::Regranted,
        Ok(TokenOutcome::AlreadyCompleted(_)) => Decision::Replayed,
        Err(Refusal::InProgress { .. }) => Decision::InProgress,
        Err(Refusal::KeyReused { .. }) => Decision::KeyReused,
        Err(Refusal::LeaseExpired { .. }) => Decision::LeaseExpired,
        Err(
            Refusal::TokenMismatch
            | Refusal::TokenUnknown
            | Refusal::CompletedByOther { .. }
            | Refusal::AlreadyCompleted
            | Refusal::RequestRequired
            | Refusal::NotExpired { .. },
        ) => return None,
    })
}

fn audit_refusal(rpc: &str, key: &ActionKey, refusal: &Refusal) {
    telemetry::record_decision(refusal_name(refusal));
    tracing::info!(target: AUDIT, agent_id = %key.agent_id, run_id = %key.run_id, key = %key.key,
        decision = refusal_name(refusal), rpc, "refused");
}

/// A short snake_case name of a refusal, for logs and metric labels.
pub fn refusal_name(refusal: &Refusal) -> &'static str {
    match refusal {
        Refusal::KeyReused { .. } => "key_reused",
        Refusal::InProgress { .. } => "in_progress",
        Refusal::LeaseExpired { .. } => "lease_expired",
        Refusal::TokenMismatch => "token_mismatch",
        Refusal::TokenUnknown => "token_unknown",
        Refusal::CompletedByOther { .. } => "completed_by_other",
        Refusal::AlreadyCompleted => "already_completed",
        Refusal::RequestRequired => "request_required",
        Refusal::NotExpired { .. } => "not_expired",
    }
}
