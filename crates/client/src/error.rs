//! [`ClientError`]: a failed call, decoded from its status's `google.rpc.ErrorInfo` reason.

use std::{
    collections::HashMap,
    str::FromStr,
    time::{Duration, SystemTime},
};

use tonic::{Code, Status};
use tonic_types::StatusExt;

use crate::receipt::{action_text, writer_text};
use oncegate_proto as pb;

/// What went wrong, by the gate's ErrorInfo reason (and, for
/// [`ClientError::ReceiptUndecodable`], a replayed receipt this client cannot read).
///
/// Retry delays are [`Duration`]s (the Python and TypeScript clients say milliseconds, with the
/// unit in the name: `retry_after_ms`, `retryAfterMs`).
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
    /// Release or ExtendLease of a completed action (or a resolver's settlement of an action
    /// another resolver or an operator completed).
    #[error("already completed")]
    AlreadyCompleted,
    /// A resolver's settlement of a grant that is no longer unresolved: another resolver or an
    /// operator settled it, or a newer grant replaced it. Nothing was written.
    #[error("already settled: the action is {state} with fencing {fencing}")]
    AlreadySettled {
        /// The action's state now (`ABSENT`, `AUTHORIZED`, `EXPIRED`).
        state: String,
        /// Its fencing number now.
        fencing: u64,
    },
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
    /// A budget or velocity cap would be exceeded; nothing was recorded. It displays as the gate
    /// words it (boxed: it would make every error large).
    #[error("{0}")]
    BudgetExceeded(Box<BudgetRefusal>),
    /// A replayed receipt that cannot be read as asked ([`crate::Replay::json`],
    /// [`crate::Replay::decoded`]). The action completed and is not run again: a worker's receipt
    /// that is not JSON was written by a client with another encoding (or by hand); read its
    /// bytes instead.
    #[error(
        "the receipt of {} ({}) cannot be decoded: {reason}; the action was not run again",
        action_text(action),
        writer_text(*writer, operator, *format, *fencing)
    )]
    ReceiptUndecodable {
        /// The completed action.
        action: Box<pb::ActionRef>,
        /// Who wrote the receipt: a worker, or an operator.
        writer: pb::CompletionSource,
        /// The operator principal who wrote it (empty for a worker's receipt).
        operator: String,
        /// The format its writer stated (`Unspecified`: a worker's own encoding).
        format: pb::ReceiptFormat,
        /// The fencing number of the completion.
        fencing: u64,
        /// Why it cannot be read.
        reason: String,
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
            Some("ALREADY_SETTLED") => Self::AlreadySettled {
                state: get("state"),
                fencing: get("fencing").parse().unwrap_or(0),
            },
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
            Some("BUDGET_EXCEEDED") => Self::BudgetExceeded(Box::new(BudgetRefusal {
                budget: get("budget"),
                used: get("used"),
                limit: get("limit"),
                requested: get("requested"),
                retry_at: meta
                    .get("retry_at")
                    .and_then(|at| prost_types::Timestamp::from_str(at).ok())
                    .and_then(|at| SystemTime::try_from(at).ok()),
                retry_after: details
                    .retry_info()
                    .and_then(|r| r.retry_delay)
                    .or_else(|| {
                        meta.get("retry_after_ms")
                            .and_then(|ms| ms.parse().ok())
                            .map(Duration::from_millis)
                    }),
                message: status.message().to_owned(),
            })),
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

/// A budget's refusal: what its window holds, its limit, what the action needs, and when it frees
/// up. It displays as the gate words it: `budget "eur-per-day" would be exceeded: 9950.00 of
/// 10000.00 used in the last 1 d, and this action needs 100.00; nothing was recorded; it frees up
/// at 2026-12-03T14:05:00Z (in 23 h 59 min)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetRefusal {
    /// The budget's name.
    pub budget: String,
    /// What its window holds already, as the gate writes it in the budget's units (decimal text,
    /// exact: `"9950.00"`; grants for a velocity cap).
    pub used: String,
    /// The budget's limit over its window, in its units.
    pub limit: String,
    /// What this action would add, in the budget's units.
    pub requested: String,
    /// When enough of its window frees up (`None`: the action alone is above the limit).
    pub retry_at: Option<SystemTime>,
    /// How long until then (`None`: the action alone is above the limit).
    pub retry_after: Option<Duration>,
    /// The gate's message.
    pub message: String,
}

impl std::fmt::Display for BudgetRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<Status> for ClientError {
    fn from(status: Status) -> Self {
        Self::from_status(&status)
    }
}
