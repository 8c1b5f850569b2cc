//! The generated `ActionGateService` trait: proto ↔ domain conversions and nothing else.

use std::sync::Arc;

use tonic::{Request, Response, Status};
use tracing::Instrument as _;

use crate::{
    auth::{self, Principal},
    error::GateError,
    gate::{Gate, TokenCall},
    ledger::{self, Millis, TokenOutcome},
    pb::{self, action_gate_service_server::ActionGateService},
    store::ActionKey,
};

/// The gRPC face of a [`Gate`].
#[derive(Clone)]
pub struct GateService {
    gate: Gate,
}

impl GateService {
    /// Serves `gate` over gRPC.
    pub fn new(gate: Gate) -> Self {
        Self { gate }
    }
}

/// The span every audit event of one call runs in: it names the principal, on the audit target so
/// that routing `oncegate::audit` alone keeps it.
pub fn audit_span(principal: &Principal) -> tracing::Span {
    tracing::info_span!(target: crate::gate::AUDIT, "call", principal = %principal.name)
}

/// The caller, and the check that it may act for `agent_id` (before any store call).
fn authorized(principal: &Arc<Principal>, agent_id: &str) -> Result<(), GateError> {
    principal.authorize(agent_id, false)
}

/// Store milliseconds as a protobuf Timestamp.
pub fn timestamp(ms: Millis) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: ms.div_euclid(1000),
        nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
    }
}

/// A protobuf Duration as milliseconds (rounded up, so 1 ns is not zero); `None` when unset.
fn duration_ms(field: &str, d: Option<prost_types::Duration>) -> Result<Option<Millis>, GateError> {
    let Some(d) = d else { return Ok(None) };
    if d.seconds < 0 || d.nanos < 0 || !(0..1_000_000_000).contains(&d.nanos) {
        return Err(GateError::invalid(field, "must be positive"));
    }
    let ms = d
        .seconds
        .checked_mul(1000)
        .and_then(|s| s.checked_add((i64::from(d.nanos) + 999_999) / 1_000_000))
        .ok_or_else(|| GateError::invalid(field, "is too long"))?;
    Ok(Some(ms))
}

/// The action a request names; INVALID_REQUEST when it names none.
pub fn action_key(action: Option<pb::ActionRef>) -> Result<ActionKey, GateError> {
    let action = action.ok_or_else(|| GateError::invalid("action", "is required"))?;
    let scope = action
        .scope
        .ok_or_else(|| GateError::invalid("action.scope", "is required"))?;
    Ok(ActionKey::new(scope.agent_id, scope.run_id, action.key))
}

/// An action key on the wire.
pub fn action_ref(key: &ActionKey) -> pb::ActionRef {
    pb::ActionRef {
        scope: Some(pb::Scope {
            agent_id: key.agent_id.clone(),
            run_id: key.run_id.clone(),
        }),
        key: key.key.clone(),
    }
}

/// A stored completion on the wire.
pub fn completion(done: ledger::Completion) -> pb::Completion {
    pb::Completion {
        receipt: done.receipt,
        completed_at: Some(timestamp(done.completed_at)),
        fencing: done.fencing,
        token: done.token,
        source: match done.source {
            ledger::Source::Worker => pb::CompletionSource::Worker,
            ledger::Source::Operator => pb::CompletionSource::Operator,
        } as i32,
        note: done.note,
        operator: done.operator,
    }
}

#[tonic::async_trait]
impl ActionGateService for GateService {
    async fn request_token(
        &self,
        request: Request<pb::RequestTokenRequest>,
    ) -> Result<Response<pb::RequestTokenResponse>, Status> {
        let principal = auth::principal(&request)?;
        let req = request.into_inner();
        // A request that cannot even be converted is still an attempt: counted as `invalid`.
        let invalid = |e: GateError| self.gate.invalid_attempt(&req.action, e);
        let scope = req
            .scope
            .ok_or_else(|| invalid(GateError::invalid("scope", "is required")))?;
        authorized(&principal, &scope.agent_id)?;
        let lease = duration_ms("lease_ttl", req.lease_ttl).map_err(invalid)?;
        let call = TokenCall {
            agent_id: scope.agent_id,
            run_id: scope.run_id,
            action: req.action,
            params_json: req.params_json,
            intent_id: req.intent_id,
            idempotency_key: req.idempotency_key,
            holder: req.holder,
            lease,
        };
        let answer = self
            .gate
            .request_token(call)
            .instrument(audit_span(&principal))
            .await?;
        let mut response = pb::RequestTokenResponse {
            action: Some(action_ref(&answer.key)),
            fingerprint: answer.fingerprint,
            ..Default::default()
        };
        match answer.outcome {
            TokenOutcome::Granted(grant, kind) => {
                response.decision = pb::Decision::Granted as i32;
                response.redelivered = kind == ledger::GrantKind::Redelivered;
                response.grant = Some(pb::Grant {
                    token: grant.token,
                    fencing: grant.fencing,
                    lease_expires_at: Some(timestamp(grant.lease_expires_at)),
                    provider_key: answer.provider_key,
                    replicas_acknowledged: answer.replicas_acknowledged,
                });
            }
            TokenOutcome::AlreadyCompleted(done) => {
                response.decision = pb::Decision::AlreadyCompleted as i32;
                response.completion = Some(completion(done));
            }
        }
        Ok(Response::new(response))
    }

    async fn complete(
        &self,
        request: Request<pb::CompleteRequest>,
    ) -> Result<Response<pb::CompleteResponse>, Status> {
        let principal = auth::principal(&request)?;
        let req = request.into_inner();
        let key = action_key(req.action)?;
        authorized(&principal, &key.agent_id)?;
        let done = self
            .gate
            .complete(&key, &req.token, &req.receipt)
            .instrument(audit_span(&principal))
            .await?;
        Ok(Response::new(pb::CompleteResponse {
            completion: Some(completion(done.completion)),
        }))
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        let principal = auth::principal(&request)?;
        let req = request.into_inner();
        let key = action_key(req.action)?;
        authorized(&principal, &key.agent_id)?;
        let reason = match pb::ReleaseReason::try_from(req.reason) {
            Ok(pb::ReleaseReason::DefiniteFailure) => "definite_failure",
            Ok(pb::ReleaseReason::NotAttempted) => "not_attempted",
            _ => {
                return Err(GateError::invalid(
                    "reason",
                    "must be RELEASE_REASON_DEFINITE_FAILURE or RELEASE_REASON_NOT_ATTEMPTED",
                )
                .into());
            }
        };
        let fencing = self
            .gate
            .release(&key, &req.token, reason)
            .instrument(audit_span(&principal))
            .await?;
        Ok(Response::new(pb::ReleaseResponse { fencing }))
    }

    async fn extend_lease(
        &self,
        request: Request<pb::ExtendLeaseRequest>,
    ) -> Result<Response<pb::ExtendLeaseResponse>, Status> {
        let principal = auth::principal(&request)?;
        let req = request.into_inner();
        let key = action_key(req.action)?;
        authorized(&principal, &key.agent_id)?;
        let ttl = duration_ms("ttl", req.ttl)?;
        let at = self
            .gate
            .extend_lease(&key, &req.token, ttl)
            .instrument(audit_span(&principal))
            .await?;
        Ok(Response::new(pb::ExtendLeaseResponse {
            lease_expires_at: Some(timestamp(at)),
        }))
    }

    async fn get_action(
        &self,
        request: Request<pb::GetActionRequest>,
    ) -> Result<Response<pb::GetActionResponse>, Status> {
        let principal = auth::principal(&request)?;
        let key = action_key(request.into_inner().action)?;
        authorized(&principal, &key.agent_id)?;
        let view = self.gate.get(&key).await?;
        Ok(Response::new(action_view(view)))
    }
}

/// A record view on the wire.
pub fn action_view(view: ledger::ActionView) -> pb::GetActionResponse {
    let state = match view.state {
        ledger::State::Absent => pb::ActionState::Absent,
        ledger::State::Authorized => pb::ActionState::Authorized,
        ledger::State::Completed => pb::ActionState::Completed,
        ledger::State::Expired => pb::ActionState::Expired,
    };
    pb::GetActionResponse {
        state: state as i32,
        fencing: view.fencing,
        fingerprint: view.fingerprint,
        lease_expires_at: view.lease_expires_at.map(timestamp),
        completion: view.completion.map(completion),
        holder: view.holder,
    }
}
