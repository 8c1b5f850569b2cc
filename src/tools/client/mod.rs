//! A typed Rust client for the gate, and the [`guard`] that runs one action at most once.
//!
//! Errors are a [`ClientError`] enum decoded from each status's `google.rpc.ErrorInfo` reason,
//! not a bare `tonic::Status`, so callers branch on what happened.
//!
//! ```no_run
//! # async fn demo() -> Result<(), oncegate::client::ClientError> {
//! use oncegate::client::{ActionSpec, GateClient};
//! let mut gate = GateClient::connect("http://127.0.0.1:50051").await?;
//! let spec = ActionSpec::new("billing-agent", "run-7", "payments.transfer", r#"{"amount":100}"#);
//! let reply = gate.request_token(&spec).await?;
//! # Ok(()) }
//! ```

pub mod guard;
pub mod verify;

use std::{collections::HashMap, time::Duration};

use tonic::{Code, Status, metadata::MetadataValue, transport::Channel};
use tonic_types::StatusExt;

use crate::pb::{self, action_gate_service_client::ActionGateServiceClient};

pub use guard::{Failure, GuardError, GuardOptions, Outcome};
pub use verify::{GrantClaims, PublicKeys, StatementError, verify_grant};

/// What went wrong, by the gate's ErrorInfo reason.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    /// The idempotency key was used for a request whose key fields differ. Never retry, and never
    /// mint a new key on your own: a person or the planner must decide.
    #[error("idempotency key reused with different key fields: {differing_fields:?}")]
    KeyReused {
        /// The differing key-field paths (JSON Pointers, or `action` / `intent_id`).
        differing_fields: Vec<String>,
    },
    /// Another attempt holds a live lease; retry the same request after `retry_after`.
    #[error("in progress elsewhere; retry after {retry_after:?}")]
    InProgress {
        /// The time left on the other attempt's lease.
        retry_after: Duration,
    },
    /// The lease ended without Complete or Release: reconcile with the provider (ask it with
    /// `provider_key`), then Complete or Release `action` with `token`.
    #[error(
        "lease of fencing {fencing} expired unresolved; reconcile with the provider (provider key \
         {provider_key}) first"
    )]
    LeaseExpired {
        /// The expired attempt's token, to Complete or Release with after reconciling.
        token: String,
        /// The expired attempt's fencing number.
        fencing: u64,
        /// The action, as the gate names it (boxed: it would make every error large).
        action: Box<pb::ActionRef>,
        /// The key the provider was given.
        provider_key: String,
    },
    /// The token was not granted for this action (or was released).
    #[error("token mismatch")]
    TokenMismatch,
    /// The action has no record.
    #[error("token unknown: the action has no record")]
    TokenUnknown,
    /// Another token or an operator completed the action: it may have run twice.
    #[error("completed by another token (fencing {fencing})")]
    CompletedByOther {
        /// The fencing number of the completion that won.
        fencing: u64,
    },
    /// Release or ExtendLease of a completed action.
    #[error("already completed")]
    AlreadyCompleted,
    /// The request was malformed.
    #[error("invalid {field}: {description}")]
    Invalid {
        /// The offending request field.
        field: String,
        /// What is wrong with it.
        description: String,
    },
    /// No or wrong credential.
    #[error("unauthenticated")]
    Unauthenticated,
    /// The principal may not act on this scope.
    #[error("forbidden scope")]
    Forbidden,
    /// The principal's rate limit was hit.
    #[error("rate limited; retry after {retry_after:?}")]
    RateLimited {
        /// When to try again.
        retry_after: Duration,
    },
    /// An authorization policy forbids the action, or an operator denied its approval. Do not
    /// retry; nothing was recorded.
    #[error("denied by authorization policy {policy_id:?}")]
    PolicyDenied {
        /// The deciding policy's id (empty when no policy permits the action).
        policy_id: String,
        /// The denied approval's id, when an operator denied it.
        approval_id: String,
    },
    /// A budget or velocity cap would be exceeded; nothing was recorded.
    #[error("budget {budget:?} exceeded; frees up after {retry_after:?}")]
    BudgetExceeded {
        /// The budget's name.
        budget: String,
        /// When enough of its window frees up (`None`: the action alone is above the limit).
        retry_after: Option<Duration>,
    },
    /// The gate or its store could not be reached, or the call timed out: the outcome of the call
    /// is unknown. Retry with backoff (every gate call is safe to repeat).
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// Anything else the gate answered.
    #[error("gate error {code:?}: {message}")]
    Other {
        /// The gRPC status code.
        code: Code,
        /// The status message.
        message: String,
    },
}

impl ClientError {
    /// Decodes a status by its ErrorInfo reason.
    pub fn from_status(status: &Status) -> Self {
        let details = status.get_error_details();
        let retry_after = details
            .retry_info()
            .and_then(|r| r.retry_delay)
            .unwrap_or(Duration::from_millis(100));
        let info = details.error_info();
        let meta: HashMap<String, String> = info.map(|i| i.metadata.clone()).unwrap_or_default();
        let get = |k: &str| meta.get(k).cloned().unwrap_or_default();
        match info.map(|i| i.reason.as_str()) {
            Some("IDEMPOTENCY_KEY_REUSED") => Self::KeyReused {
                differing_fields: get("differing_fields")
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect(),
            },
            Some("IDEMPOTENCY_IN_PROGRESS") => Self::InProgress { retry_after },
            Some("LEASE_EXPIRED_UNRESOLVED") => Self::LeaseExpired {
                token: get("token"),
                fencing: get("fencing").parse().unwrap_or(0),
                action: Box::new(pb::ActionRef {
                    scope: Some(pb::Scope {
                        agent_id: get("agent_id"),
                        run_id: get("run_id"),
                    }),
                    key: get("key"),
                }),
                provider_key: get("provider_key"),
            },
            Some("TOKEN_MISMATCH") => Self::TokenMismatch,
            Some("TOKEN_UNKNOWN") => Self::TokenUnknown,
            Some("COMPLETED_BY_OTHER") => Self::CompletedByOther {
                fencing: get("fencing").parse().unwrap_or(0),
            },
            Some("ALREADY_COMPLETED") => Self::AlreadyCompleted,
            Some("INVALID_REQUEST") => Self::Invalid {
                field: get("field"),
                description: status.message().to_owned(),
            },
            Some("UNAUTHENTICATED") => Self::Unauthenticated,
            Some("FORBIDDEN_SCOPE") => Self::Forbidden,
            Some("RATE_LIMITED") => Self::RateLimited { retry_after },
            Some("POLICY_DENIED") => Self::PolicyDenied {
                policy_id: get("policy_id"),
                approval_id: get("approval_id"),
            },
            Some("BUDGET_EXCEEDED") => Self::BudgetExceeded {
                budget: get("budget"),
                retry_after: details.retry_info().and_then(|r| r.retry_delay),
            },
            _ => match status.code() {
                Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => {
                    Self::Unavailable(status.message().to_owned())
                }
                Code::Unauthenticated => Self::Unauthenticated,
                Code::PermissionDenied => Self::Forbidden,
                code => Self::Other {
                    code,
                    message: status.message().to_owned(),
                },
            },
        }
    }

    /// True when repeating the same call later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Self::Unavailable(_) | Self::InProgress { .. } | Self::RateLimited { .. }
        )
    }
}

impl From<Status> for ClientError {
    fn from(status: Status) -> Self {
        Self::from_status(&status)
    }
}

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
    /// Do not execute: here is the original completion.
    AlreadyCompleted(pb::Completion),
    /// Do not execute: a rule holds the action until an operator approves it (then the same
    /// request is granted once).
    PendingApproval(pb::Approval),
}

/// A typed gate client. Cheap to clone (one HTTP/2 channel underneath).
#[derive(Debug, Clone)]
pub struct GateClient {
    inner: ActionGateServiceClient<Channel>,
    api_key: Option<MetadataValue<tonic::metadata::Ascii>>,
}

impl GateClient {
    /// Connects to `endpoint` (`http://host:port`).
    pub async fn connect(endpoint: impl Into<String>) -> Result<Self, ClientError> {
        let channel = Channel::from_shared(endpoint.into())
            .map_err(|e| ClientError::Invalid {
                field: "endpoint".into(),
                description: e.to_string(),
            })?
            .connect()
            .await
            .map_err(|e| ClientError::Unavailable(e.to_string()))?;
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
        let value = format!("Bearer {key}")
            .parse()
            .map_err(|_| ClientError::Invalid {
                field: "api_key".into(),
                description: "not valid header text".into(),
            })?;
        self.api_key = Some(value);
        Ok(self)
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(key) = &self.api_key {
            request.metadata_mut().insert("authorization", key.clone());
        }
        request
    }

    /// RequestToken.
    pub async fn request_token(&mut self, spec: &ActionSpec) -> Result<TokenReply, ClientError> {
        let request = self.request(spec.to_request());
        let resp = self.inner.request_token(request).await?.into_inner();
        let action = resp.action.clone().unwrap_or_default();
        match (resp.decision(), resp.grant, resp.completion) {
            (pb::Decision::Granted, Some(grant), _) => Ok(TokenReply::Granted(Grant {
                lease: grant.lease_expires_at.map(remaining).unwrap_or_default(),
                action,
                token: grant.token,
                fencing: grant.fencing,
                provider_key: grant.provider_key,
                fingerprint: resp.fingerprint,
                statement: grant.statement,
            })),
            (pb::Decision::AlreadyCompleted, _, Some(done)) => {
                Ok(TokenReply::AlreadyCompleted(done))
            }
            (pb::Decision::PendingApproval, ..) if resp.approval.is_some() => Ok(
                TokenReply::PendingApproval(resp.approval.unwrap_or_default()),
            ),
            (decision, ..) => Err(ClientError::Other {
                code: Code::Internal,
                message: format!("malformed RequestToken reply ({decision:?})"),
            }),
        }
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
