//! The gate as the gateway's guard sees it: in process ([`LocalGate`], the same [`Gate`] `oncegate
//! serve` runs, on the embedded store) or over gRPC ([`GateClient`]), behind the client crate's
//! [`GateCalls`]. The in-process gate's answers and errors go through the gRPC layer's own
//! conversions ([`convert`], [`status`]) and the client's decoding, so the gateway reads exactly
//! what a gate server would have answered, whichever gate it has. The gate decides, counts and
//! audits where it always does (in process here, on the gate server there).

use std::time::Duration;

use oncegate_client::{ActionSpec, ClientError, GateCalls, GateClient, Grant, TokenReply};
use oncegate_gate::{Gate, GateError, TokenCall};
use oncegate_grpc::{convert, status};
use oncegate_proto as pb;

/// Where the gate is.
#[derive(Clone)]
pub enum GateLink {
    /// In this process, on the embedded store.
    Local(LocalGate),
    /// A gate server, over gRPC.
    Remote(GateClient),
}

/// The in-process gate, making the worker calls as the gRPC service does.
#[derive(Clone)]
pub struct LocalGate(pub Gate);

impl GateCalls for LocalGate {
    async fn request_token(&self, spec: &ActionSpec) -> Result<TokenReply, ClientError> {
        let lease = spec.lease.map(millis);
        let call = TokenCall {
            agent_id: spec.agent_id.clone(),
            run_id: spec.run_id.clone(),
            action: spec.action.clone(),
            params_json: spec.params_json.clone(),
            intent_id: spec.intent_id.clone(),
            idempotency_key: spec.idempotency_key.clone(),
            holder: spec.holder.clone(),
            lease,
            principal: String::new(),
        };
        let answer = self.0.request_token(call).await.map_err(client_error)?;
        TokenReply::from_response(convert::token_response(answer))
    }

    async fn complete(&self, grant: &Grant, receipt: &[u8]) -> Result<pb::Completion, ClientError> {
        let key = convert::action_key(Some(grant.action.clone())).map_err(client_error)?;
        let done = self
            .0
            .complete(&key, &grant.token, receipt)
            .await
            .map_err(client_error)?;
        Ok(convert::completion(done.completion))
    }

    async fn release(&self, grant: &Grant, reason: pb::ReleaseReason) -> Result<u64, ClientError> {
        let key = convert::action_key(Some(grant.action.clone())).map_err(client_error)?;
        let reason = convert::release_reason(reason as i32).map_err(client_error)?;
        self.0
            .release(&key, &grant.token, reason)
            .await
            .map_err(client_error)
    }

    async fn extend_lease(&self, grant: &Grant, ttl: Duration) -> Result<(), ClientError> {
        let key = convert::action_key(Some(grant.action.clone())).map_err(client_error)?;
        self.0
            .extend_lease(&key, &grant.token, Some(millis(ttl)))
            .await
            .map(drop)
            .map_err(client_error)
    }
}

/// Milliseconds, rounded up as the gRPC service rounds a protobuf Duration.
fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_nanos().div_ceil(1_000_000)).unwrap_or(i64::MAX)
}

/// A gate error as a client reads it from the wire: the one status mapping, decoded.
fn client_error(error: GateError) -> ClientError {
    ClientError::from_status(&status::status(error))
}

impl GateCalls for GateLink {
    async fn request_token(&self, spec: &ActionSpec) -> Result<TokenReply, ClientError> {
        match self {
            Self::Local(gate) => gate.request_token(spec).await,
            Self::Remote(client) => GateCalls::request_token(client, spec).await,
        }
    }

    async fn complete(&self, grant: &Grant, receipt: &[u8]) -> Result<pb::Completion, ClientError> {
        match self {
            Self::Local(gate) => gate.complete(grant, receipt).await,
            Self::Remote(client) => GateCalls::complete(client, grant, receipt).await,
        }
    }

    async fn release(&self, grant: &Grant, reason: pb::ReleaseReason) -> Result<u64, ClientError> {
        match self {
            Self::Local(gate) => gate.release(grant, reason).await,
            Self::Remote(client) => GateCalls::release(client, grant, reason).await,
        }
    }

    async fn extend_lease(&self, grant: &Grant, ttl: Duration) -> Result<(), ClientError> {
        match self {
            Self::Local(gate) => gate.extend_lease(grant, ttl).await,
            Self::Remote(client) => GateCalls::extend_lease(client, grant, ttl).await,
        }
    }
}
