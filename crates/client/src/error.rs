//! [`ClientError`]: a failed call, decoded from its status's `google.rpc.ErrorInfo` reason.

use std::{collections::HashMap, time::Duration};

use tonic::{Code, Status};
use tonic_types::StatusExt;

use oncegate_proto as pb;

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
        /// What is wrong with it (the `BadRequest` violation's description; the status message
        /// when the gate sent none).
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
                description: details
                    .bad_request()
                    .and_then(|bad| bad.field_violations.first())
                    .map_or_else(|| status.message().to_owned(), |v| v.description.clone()),
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
