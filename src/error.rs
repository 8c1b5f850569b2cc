//! The gate's domain errors and their one translation to the wire.
//!
//! Every client-visible error is a gRPC status carrying exactly one `google.rpc.ErrorInfo`
//! (domain `oncegate`), plus `RetryInfo` or `BadRequest` where they help. Internal failures are
//! logged with their source and reach the client tersely.

use std::{collections::HashMap, time::Duration};

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::{
    ledger::{Refusal, State},
    service::timestamp,
    store::StoreError,
};

/// The ErrorInfo domain of every oncegate error.
pub const DOMAIN: &str = "oncegate";

/// Why the gate did not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    /// The state machine refused (conflict, in progress, wrong token...).
    #[error("refused: {0:?}")]
    Refused(Refusal),
    /// The request is malformed; `field` is the proto field path.
    #[error("invalid {field}: {description}")]
    Invalid { field: String, description: String },
    /// The store could not be used; nothing was granted.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// No credential, or one that no principal holds.
    #[error("unauthenticated")]
    Unauthenticated,
    /// The principal may not act on this scope, or call this RPC.
    #[error("principal {principal:?} may not do this")]
    ForbiddenScope { principal: String },
    /// The principal's rate limit is spent; it may call again after `retry_after`.
    #[error("rate limited for {retry_after:?}")]
    RateLimited { retry_after: Duration },
}

impl GateError {
    /// A malformed-request error.
    pub fn invalid(field: impl Into<String>, description: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.into(),
            description: description.into(),
        }
    }

    /// The ErrorInfo reason this error carries.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Refused(refusal) => match refusal {
                Refusal::KeyReused { .. } => "IDEMPOTENCY_KEY_REUSED",
                Refusal::InProgress { .. } => "IDEMPOTENCY_IN_PROGRESS",
                Refusal::LeaseExpired { .. } => "LEASE_EXPIRED_UNRESOLVED",
                Refusal::TokenMismatch => "TOKEN_MISMATCH",
                Refusal::TokenUnknown => "TOKEN_UNKNOWN",
                Refusal::CompletedByOther { .. } => "COMPLETED_BY_OTHER",
                Refusal::AlreadyCompleted => "ALREADY_COMPLETED",
                Refusal::RequestRequired => "INVALID_REQUEST",
                Refusal::NotExpired { .. } => "LEASE_NOT_EXPIRED",
            },
            Self::Invalid { .. } => "INVALID_REQUEST",
            Self::Unauthenticated => "UNAUTHENTICATED",
            Self::ForbiddenScope { .. } => "FORBIDDEN_SCOPE",
            Self::RateLimited { .. } => "RATE_LIMITED",
            Self::Store(StoreError::Unavailable(_)) => "STORE_UNAVAILABLE",
            Self::Store(StoreError::Corrupt(_)) => "INTERNAL",
        }
    }
}

fn millis(ms: i64) -> Duration {
    Duration::from_millis(ms.max(0) as u64)
}

impl From<GateError> for Status {
    fn from(err: GateError) -> Self {
        let reason = err.reason();
        let mut metadata = HashMap::new();
        let mut details = ErrorDetails::new();
        let (code, message) = match &err {
            GateError::Refused(refusal) => match refusal {
                Refusal::KeyReused { differing } => {
                    metadata.insert("differing_fields".to_owned(), differing.join(","));
                    (
                        Code::FailedPrecondition,
                        format!(
                            "the idempotency key was already used for a request whose key fields differ ({}); \
                             do not retry, and do not mint a new key on your own",
                            differing.join(", ")
                        ),
                    )
                }
                Refusal::InProgress { retry_after } => {
                    metadata.insert("retry_after_ms".to_owned(), retry_after.to_string());
                    details.set_retry_info(Some(millis(*retry_after)));
                    (
                        Code::Aborted,
                        format!(
                            "another attempt holds a live lease; retry the same request in {retry_after} ms"
                        ),
                    )
                }
                Refusal::LeaseExpired {
                    token,
                    fencing,
                    expired_at,
                } => {
                    metadata.insert("token".to_owned(), token.clone());
                    metadata.insert("fencing".to_owned(), fencing.to_string());
                    metadata.insert(
                        "lease_expired_at".to_owned(),
                        timestamp(*expired_at).to_string(),
                    );
                    (
                        Code::FailedPrecondition,
                        format!(
                            "the lease of fencing {fencing} ended without Complete or Release; reconcile with the \
                             provider, then Complete or Release with that token"
                        ),
                    )
                }
                Refusal::TokenMismatch => (
                    Code::FailedPrecondition,
                    "this token was not granted for this action (or was released)".to_owned(),
                ),
                Refusal::TokenUnknown => (
                    Code::FailedPrecondition,
                    "the action has no record".to_owned(),
                ),
                Refusal::CompletedByOther {
                    fencing,
                    completed_at,
                } => {
                    metadata.insert("fencing".to_owned(), fencing.to_string());
                    metadata.insert(
                        "completed_at".to_owned(),
                        timestamp(*completed_at).to_string(),
                    );
                    (
                        Code::FailedPrecondition,
                        "the action was already completed by another token or by an operator: it may have run twice"
                            .to_owned(),
                    )
                }
                Refusal::AlreadyCompleted => (
                    Code::FailedPrecondition,
                    "the action is completed; it cannot be released, extended or completed by an operator"
                        .to_owned(),
                ),
                Refusal::RequestRequired => {
                    let field = "params_json";
                    let description = "the action has no record: give action_name and params_json so that its request hash can be stored";
                    metadata.insert("field".to_owned(), field.to_owned());
                    details.add_bad_request_violation(field, description);
                    (Code::InvalidArgument, format!("invalid {field}: {description}"))
                }
                Refusal::NotExpired { state } => {
                    let state = match state {
                        State::Absent => "ABSENT",
                        State::Authorized => "AUTHORIZED",
                        State::Completed => "COMPLETED",
                        State::Expired => "EXPIRED",
                    };
                    metadata.insert("state".to_owned(), state.to_owned());
                    (
                        Code::FailedPrecondition,
                        format!("the action is {state}, not an expired lease; there is nothing to resolve"),
                    )
                }
            },
            GateError::Invalid { field, description } => {
                metadata.insert("field".to_owned(), field.clone());
                details.add_bad_request_violation(field.clone(), description.clone());
                (
                    Code::InvalidArgument,
                    format!("invalid {field}: {description}"),
                )
            }
            GateError::Store(StoreError::Unavailable(source)) => {
                tracing::warn!(error = %source, "store unavailable; failing closed");
                (
                    Code::Unavailable,
                    "the store is unavailable; nothing was granted; retry with backoff".to_owned(),
                )
            }
            GateError::Store(StoreError::Corrupt(source)) => {
                tracing::error!(error = %source, "store returned something unreadable");
                (Code::Internal, "internal store error".to_owned())
            }
            GateError::Unauthenticated => (
                Code::Unauthenticated,
                "a credential is required: `authorization: Bearer <api key>` or a client certificate"
                    .to_owned(),
            ),
            GateError::ForbiddenScope { principal } => {
                metadata.insert("principal".to_owned(), principal.clone());
                (
                    Code::PermissionDenied,
                    format!("principal {principal:?} may not act on this scope or call this RPC"),
                )
            }
            GateError::RateLimited { retry_after } => {
                let ms = retry_after.as_millis().max(1);
                metadata.insert("retry_after_ms".to_owned(), ms.to_string());
                details.set_retry_info(Some(*retry_after));
                (
                    Code::ResourceExhausted,
                    format!("rate limit reached; retry in {ms} ms"),
                )
            }
        };
        details.set_error_info(reason, DOMAIN, metadata);
        Status::with_error_details(code, message, details)
    }
}
