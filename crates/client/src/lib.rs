//! A typed Rust client for the gate, and the [`guard`] that runs one action at most once.
//!
//! Errors are a [`ClientError`] enum decoded from each status's `google.rpc.ErrorInfo` reason,
//! not a bare `tonic::Status`, so callers branch on what happened.
//!
//! Light: it depends on the proto and domain crates only, so its dependency tree holds no store,
//! Cedar, rmcp or axum (`tests/integration/layers.rs` checks it).
//!
//! ```no_run
//! # async fn demo() -> Result<(), oncegate_client::ClientError> {
//! use oncegate_client::{ActionSpec, GateClient};
//! let mut gate = GateClient::connect("http://127.0.0.1:50051").await?;
//! let spec = ActionSpec::new("billing-agent", "run-7", "payments.transfer", r#"{"amount":100}"#);
//! let reply = gate.request_token(&spec).await?;
//! # Ok(()) }
//! ```

pub mod address;
pub mod channel;
mod credentials;
mod error;
pub mod guard;
pub mod receipt;
pub mod resolver;
pub mod verify;

use std::time::Duration;

use tonic::{Code, transport::Channel};

use oncegate_proto::{self as pb, action_gate_service_client::ActionGateServiceClient};

use credentials::ApiKey;
pub use error::{BudgetRefusal, ClientError};
pub use guard::{Failure, GateCalls, GuardError, GuardHooks, GuardOptions, Outcome, run_once_on};
pub use receipt::{Receipt, Replay};
pub use resolver::{Lookup, Resolver, Settled, Unresolved};
pub use verify::{GrantClaims, PublicKeys, StatementError, verify_grant};

/// How long [`GateClient::connect`] waits for the connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// One logical action: who does it, what, and with which arguments.
#[derive(Debug, Clone, Default)]
pub struct ActionSpec {
    /// The agent's id.
    pub agent_id: String,
    /// The workflow-run id that survives restarts of the agent.
    pub run_id: String,
    /// The action type or tool name, e.g. `payments.transfer`.
    pub action: String,
    /// The params as a JSON object text.
    pub params_json: String,
    /// Separates deliberate repeats from retries; empty for none.
    pub intent_id: String,
    /// The client-chosen name of the logical action; empty to identify it by its fingerprint.
    pub idempotency_key: String,
    /// This worker's name: a lost grant reply is re-delivered to the same holder.
    pub holder: String,
    /// The lease to ask for; the policy's when `None`.
    pub lease: Option<Duration>,
}

impl ActionSpec {
    /// An action identified by its fingerprint.
    pub fn new(agent_id: &str, run_id: &str, action: &str, params_json: &str) -> Self {
        Self {
            agent_id: agent_id.into(),
            run_id: run_id.into(),
            action: action.into(),
            params_json: params_json.into(),
            ..Self::default()
        }
    }

    /// Names the logical action with an idempotency key.
    pub fn idempotency_key(mut self, key: &str) -> Self {
        self.idempotency_key = key.into();
        self
    }

    /// Names this worker as the holder.
    pub fn holder(mut self, holder: &str) -> Self {
        self.holder = holder.into();
        self
    }

    /// Sets the intent id.
    pub fn intent(mut self, intent_id: &str) -> Self {
        self.intent_id = intent_id.into();
        self
    }

    /// Asks for a specific lease.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    fn to_request(&self) -> pb::RequestTokenRequest {
        pb::RequestTokenRequest {
            scope: Some(pb::Scope {
                agent_id: self.agent_id.clone(),
                run_id: self.run_id.clone(),
            }),
            action: self.action.clone(),
            params_json: self.params_json.clone(),
            intent_id: self.intent_id.clone(),
            idempotency_key: self.idempotency_key.clone(),
            holder: self.holder.clone(),
            lease_ttl: self.lease.map(duration),
        }
    }
}

/// Time from now until `at` (zero when past).
fn remaining(at: prost_types::Timestamp) -> Duration {
    let at =
        std::time::UNIX_EPOCH + Duration::new(at.seconds.max(0) as u64, at.nanos.max(0) as u32);
    at.duration_since(std::time::SystemTime::now())
        .unwrap_or_default()
}

fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

/// A granted token and what comes with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Pass to Complete, Release, ExtendLease.
    pub action: pb::ActionRef,
    /// The one-shot token of this attempt.
    pub token: String,
    /// Pass to the downstream system so it can reject stale holders.
    pub fencing: u64,
    /// Pass to the provider as its own idempotency key.
    pub provider_key: String,
    /// The request's fingerprint.
    pub fingerprint: String,
    /// The lease length the gate granted, as seen from this client (its clock may differ from the
    /// store's a little; only the heartbeat uses it).
    pub lease: Duration,
    /// The signed grant statement to hand the executor with the params ([`verify_grant`] checks
    /// it); empty when the gate does not sign.
    pub statement: String,
}

/// The answer to RequestToken.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenReply {
    /// Execute the action, then Complete or Release.
    Granted(Grant),
    /// Do not execute: here is the original completion, with the action ([`Replay::decoded`]
    /// reads its receipt as its writer meant it).
    AlreadyCompleted(Replay),
    /// Do not execute: a rule holds the action until an operator approves it (then the same
    /// request is granted once).
    PendingApproval(pb::Approval),
}

impl TokenReply {
    /// Reads a RequestToken response (a malformed one is [`ClientError::Other`]). The grant's
    /// lease is measured from this process's clock.
    pub fn from_response(resp: pb::RequestTokenResponse) -> Result<Self, ClientError> {
        let action = resp.action.clone().unwrap_or_default();
        match (resp.decision(), resp.grant, resp.completion) {
            (pb::Decision::Granted, Some(grant), _) => Ok(Self::Granted(Grant {
                lease: grant.lease_expires_at.map(remaining).unwrap_or_default(),
                action,
                token: grant.token,
                fencing: grant.fencing,
                provider_key: grant.provider_key,
                fingerprint: resp.fingerprint,
                statement: grant.statement,
            })),
            (pb::Decision::AlreadyCompleted, _, Some(completion)) => {
                Ok(Self::AlreadyCompleted(Replay { action, completion }))
            }
            (pb::Decision::PendingApproval, ..) if resp.approval.is_some() => {
                Ok(Self::PendingApproval(resp.approval.unwrap_or_default()))
            }
            (decision, ..) => Err(ClientError::Other {
                code: Code::Internal,
                message: format!("malformed RequestToken reply ({decision:?})"),
            }),
        }
    }
}

/// A typed gate client. Cheap to clone (one HTTP/2 channel underneath).
#[derive(Debug, Clone)]
pub struct GateClient {
    inner: ActionGateServiceClient<Channel>,
    api_key: Option<ApiKey>,
}

impl GateClient {
    /// Connects to `endpoint`: `host:port`, `http://host:port`, or `unix:<path>` (the admin
    /// socket of a gate on this machine); for TLS, [`channel::connect`] with its CA and
    /// [`Self::from_channel`]. Another form is [`ClientError::Invalid`], naming the forms.
    pub async fn connect(endpoint: impl Into<String>) -> Result<Self, ClientError> {
        let endpoint = endpoint.into();
        let channel = channel::connect(&endpoint, &channel::Access::default(), CONNECT_TIMEOUT)
            .await
            .map_err(|e| match e {
                channel::ConnectError::Settings(description) => ClientError::Invalid {
                    field: "endpoint".into(),
                    description,
                },
                channel::ConnectError::Unreachable(why) => ClientError::Unavailable(why),
            })?;
        Ok(Self::from_channel(channel))
    }

    /// Wraps an existing channel (for TLS or custom settings).
    pub fn from_channel(channel: Channel) -> Self {
        Self {
            inner: ActionGateServiceClient::new(channel),
            api_key: None,
        }
    }

    /// Sends `authorization: Bearer <key>` with every call.
    pub fn with_api_key(mut self, key: &str) -> Result<Self, ClientError> {
        self.api_key = Some(ApiKey::new(key)?);
        Ok(self)
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        credentials::request(self.api_key.as_ref(), message)
    }

    /// RequestToken.
    pub async fn request_token(&mut self, spec: &ActionSpec) -> Result<TokenReply, ClientError> {
        Ok(self.request_token_for(spec).await?.1)
    }

    /// RequestToken, and the action as the gate names it (its key is the fingerprint when the
    /// spec has no idempotency key).
    pub async fn request_token_for(
        &mut self,
        spec: &ActionSpec,
    ) -> Result<(pb::ActionRef, TokenReply), ClientError> {
        let request = self.request(spec.to_request());
        let resp = self.inner.request_token(request).await?.into_inner();
        let action = resp.action.clone().unwrap_or_default();
        Ok((action, TokenReply::from_response(resp)?))
    }

    /// Complete with a receipt; returns the stored completion.
    pub async fn complete(
        &mut self,
        action: &pb::ActionRef,
        token: &str,
        receipt: &[u8],
    ) -> Result<pb::Completion, ClientError> {
        let request = self.request(pb::CompleteRequest {
            action: Some(action.clone()),
            token: token.into(),
            receipt: receipt.to_vec(),
        });
        let resp = self.inner.complete(request).await?.into_inner();
        Ok(resp.completion.unwrap_or_default())
    }

    /// Release after a definite failure or when the action was not attempted.
    pub async fn release(
        &mut self,
        action: &pb::ActionRef,
        token: &str,
        reason: pb::ReleaseReason,
    ) -> Result<u64, ClientError> {
        let request = self.request(pb::ReleaseRequest {
            action: Some(action.clone()),
            token: token.into(),
            reason: reason as i32,
        });
        Ok(self.inner.release(request).await?.into_inner().fencing)
    }

    /// Extend the lease to now + `ttl`.
    pub async fn extend_lease(
        &mut self,
        action: &pb::ActionRef,
        token: &str,
        ttl: Duration,
    ) -> Result<(), ClientError> {
        let request = self.request(pb::ExtendLeaseRequest {
            action: Some(action.clone()),
            token: token.into(),
            ttl: Some(duration(ttl)),
        });
        self.inner.extend_lease(request).await?;
        Ok(())
    }

    /// The record as it stands.
    pub async fn get_action(
        &mut self,
        action: &pb::ActionRef,
    ) -> Result<pb::GetActionResponse, ClientError> {
        let request = self.request(pb::GetActionRequest {
            action: Some(action.clone()),
        });
        Ok(self.inner.get_action(request).await?.into_inner())
    }
}
