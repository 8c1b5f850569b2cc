//! The generated `ActionGateService` trait: the scope check, then proto → domain, the gate, and
//! domain → proto ([`super::convert`]). Nothing else.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::{
    auth::{self, Capability, Principal},
    convert::{
        action_key, action_view, completion, duration_ms, release_reason, timestamp, token_response,
    },
    status::answer,
};
use oncegate_gate::{Gate, GateError, TokenCall};
use oncegate_observe::telemetry;
use oncegate_proto::{self as pb, action_gate_service_server::ActionGateService};

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

/// The caller, and the check that it may act for `agent_id` (before any store call).
fn authorized(principal: &Arc<Principal>, agent_id: &str) -> Result<(), GateError> {
    telemetry::record_principal(&principal.name);
    principal.authorize(agent_id, Capability::Work)
}

#[tonic::async_trait]
impl ActionGateService for GateService {
    async fn request_token(
        &self,
        request: Request<pb::RequestTokenRequest>,
    ) -> Result<Response<pb::RequestTokenResponse>, Status> {
        answer(async move {
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
                principal: principal.name.clone(),
            };
            Ok(token_response(self.gate.request_token(call).await?))
        })
        .await
    }

    async fn complete(
        &self,
        request: Request<pb::CompleteRequest>,
    ) -> Result<Response<pb::CompleteResponse>, Status> {
        answer(async move {
            let principal = auth::principal(&request)?;
            let req = request.into_inner();
            let key = action_key(req.action)?;
            authorized(&principal, &key.agent_id)?;
            let done = self.gate.complete(&key, &req.token, &req.receipt).await?;
            Ok(pb::CompleteResponse {
                completion: Some(completion(done.completion)),
            })
        })
        .await
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        answer(async move {
            let principal = auth::principal(&request)?;
            let req = request.into_inner();
            let key = action_key(req.action)?;
            authorized(&principal, &key.agent_id)?;
            let reason = release_reason(req.reason)?;
            let fencing = self.gate.release(&key, &req.token, reason).await?;
            Ok(pb::ReleaseResponse { fencing })
        })
        .await
    }

    async fn extend_lease(
        &self,
        request: Request<pb::ExtendLeaseRequest>,
    ) -> Result<Response<pb::ExtendLeaseResponse>, Status> {
        answer(async move {
            let principal = auth::principal(&request)?;
            let req = request.into_inner();
            let key = action_key(req.action)?;
            authorized(&principal, &key.agent_id)?;
            let ttl = duration_ms("ttl", req.ttl)?;
            let at = self.gate.extend_lease(&key, &req.token, ttl).await?;
            Ok(pb::ExtendLeaseResponse {
                lease_expires_at: Some(timestamp(at)),
            })
        })
        .await
    }

    async fn get_action(
        &self,
        request: Request<pb::GetActionRequest>,
    ) -> Result<Response<pb::GetActionResponse>, Status> {
        answer(async move {
            let principal = auth::principal(&request)?;
            let key = action_key(request.into_inner().action)?;
            authorized(&principal, &key.agent_id)?;
            let mut view = self.gate.get(&key).await?;
            if principal.role != auth::Role::Operator {
                // The holder names who may have a live token redelivered, and the token itself would
                // let any caller in scope complete or release someone else's live attempt: operators'
                // business only. (An agent that asks again for an expired action hears its token in
                // LEASE_EXPIRED_UNRESOLVED, as the one who may reconcile it.)
                view.holder.clear();
                view.token.clear();
            }
            Ok(action_view(&key, view))
        })
        .await
    }
}
