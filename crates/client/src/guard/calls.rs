//! [`GateCalls`]: the four worker calls the guard makes, on the client's own types. A
//! [`GateClient`] makes them over gRPC; the MCP gateway's in-process gate makes them directly and
//! answers them as the gate server would, so one guard serves both.

use std::{future::Future, time::Duration};

use crate::{ActionSpec, ClientError, GateClient, Grant, TokenReply};
use oncegate_proto as pb;

/// The worker calls of a gate, as the guard ([`super::run_once_on`]) makes them. Errors are
/// [`ClientError`]s, decoded from the gate's `ErrorInfo` reasons whatever carried them.
pub trait GateCalls: Sync {
    /// RequestToken.
    fn request_token(
        &self,
        spec: &ActionSpec,
    ) -> impl Future<Output = Result<TokenReply, ClientError>> + Send;

    /// Complete `grant` with `receipt`; the stored completion.
    fn complete(
        &self,
        grant: &Grant,
        receipt: &[u8],
    ) -> impl Future<Output = Result<pb::Completion, ClientError>> + Send;

    /// Release `grant` for `reason`; its fencing number.
    fn release(
        &self,
        grant: &Grant,
        reason: pb::ReleaseReason,
    ) -> impl Future<Output = Result<u64, ClientError>> + Send;

    /// ExtendLease of `grant` to now + `ttl`.
    fn extend_lease(
        &self,
        grant: &Grant,
        ttl: Duration,
    ) -> impl Future<Output = Result<(), ClientError>> + Send;
}

/// Over gRPC: each call on a clone of the client (one channel underneath).
impl GateCalls for GateClient {
    async fn request_token(&self, spec: &ActionSpec) -> Result<TokenReply, ClientError> {
        GateClient::request_token(&mut self.clone(), spec).await
    }

    async fn complete(&self, grant: &Grant, receipt: &[u8]) -> Result<pb::Completion, ClientError> {
        GateClient::complete(&mut self.clone(), &grant.action, &grant.token, receipt).await
    }

    async fn release(&self, grant: &Grant, reason: pb::ReleaseReason) -> Result<u64, ClientError> {
        GateClient::release(&mut self.clone(), &grant.action, &grant.token, reason).await
    }

    async fn extend_lease(&self, grant: &Grant, ttl: Duration) -> Result<(), ClientError> {
        GateClient::extend_lease(&mut self.clone(), &grant.action, &grant.token, ttl).await
    }
}
