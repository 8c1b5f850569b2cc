//! The one translation of [`GateError`] to the wire.
//!
//! Every client-visible error is a gRPC status carrying exactly one `google.rpc.ErrorInfo`
//! (domain `oncegate`, reason a [`pb::ErrorReason`] name), plus `RetryInfo` or `BadRequest` where
//! they help (docs/CONTRACT.md, "Errors"). Internal failures are logged with their source and reach
//! the client tersely.

use std::{collections::HashMap, time::Duration};

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use super::convert::timestamp;
use oncegate_domain::time::rfc3339;
use oncegate_domain::{
    ActionKey,
    ledger::{Millis, Refusal, State},
};
use oncegate_gate::{GateError, OverBudget};
use oncegate_proto::ErrorReason;
use oncegate_store::StoreError;

/// The ErrorInfo domain of every oncegate error.
pub const DOMAIN: &str = "oncegate";

/// The ErrorInfo reason `error` carries.
pub fn reason(error: &GateError) -> ErrorReason {
    match error {
        GateError::Refused(refusal) | GateError::Unresolved { refusal, .. } => match refusal {
            Refusal::KeyReused { .. } => ErrorReason::IdempotencyKeyReused,
            Refusal::InProgress { .. } => ErrorReason::IdempotencyInProgress,
            Refusal::LeaseExpired { .. } => ErrorReason::LeaseExpiredUnresolved,
            Refusal::TokenMismatch => ErrorReason::TokenMismatch,
            Refusal::TokenUnknown => ErrorReason::TokenUnknown,
            Refusal::CompletedByOther { .. } => ErrorReason::CompletedByOther,
            Refusal::AlreadyCompleted => ErrorReason::AlreadyCompleted,
            Refusal::RequestRequired => ErrorReason::InvalidRequest,
            Refusal::NotExpired { .. } => ErrorReason::LeaseNotExpired,
            Refusal::AlreadySettled { .. } => ErrorReason::AlreadySettled,
            Refusal::BudgetExceeded { .. } => ErrorReason::BudgetExceeded,
            Refusal::ApprovalDenied { .. } => ErrorReason::PolicyDenied,
            Refusal::ApprovalNotPending { .. } => ErrorReason::ApprovalNotPending,
        },
        GateError::PolicyDenied { .. } => ErrorReason::PolicyDenied,
        GateError::OverBudget(_) => ErrorReason::BudgetExceeded,
        GateError::Invalid { .. } => ErrorReason::InvalidRequest,
        GateError::Unauthenticated => ErrorReason::Unauthenticated,
        GateError::ForbiddenScope { .. } => ErrorReason::ForbiddenScope,
        GateError::RateLimited { .. } => ErrorReason::RateLimited,
        GateError::Store(StoreError::Unavailable { .. } | StoreError::Misconfigured(_)) => {
            ErrorReason::StoreUnavailable
        }
        GateError::Store(StoreError::Corrupt { .. }) => ErrorReason::Internal,
    }
}

/// What one error puts on the wire besides its reason.
struct Wire {
    code: Code,
    message: String,
    metadata: HashMap<String, String>,
    details: ErrorDetails,
}

impl Wire {
    fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            metadata: HashMap::new(),
            details: ErrorDetails::new(),
        }
    }

    fn meta(mut self, key: &str, value: impl ToString) -> Self {
        self.metadata.insert(key.to_owned(), value.to_string());
        self
    }

    fn retry_after(mut self, delay: Duration) -> Self {
        self.details.set_retry_info(Some(delay));
        self
    }

    /// INVALID_ARGUMENT with one BadRequest field violation.
    fn invalid(field: &str, description: &str) -> Self {
        let mut wire = Self::new(
            Code::InvalidArgument,
            format!("invalid {field}: {description}"),
        )
        .meta("field", field);
        wire.details.add_bad_request_violation(field, description);
        wire
    }
}

/// Answers an RPC: the body's value as the response, or its error as the one [`status`] mapping.
/// The services write their bodies in an `async` block, so `?` works on every [`GateError`].
pub fn answer<F>(body: F) -> Answer<F> {
    Answer { body }
}

pin_project_lite::pin_project! {
    /// An RPC's body answered ([`answer`]). A future of its own, not an `async fn`: that would
    /// hold the body twice (as its argument and as what it awaits), and the RPC's future, which
    /// tonic moves whole into its box, with it.
    pub struct Answer<F> {
        #[pin]
        body: F,
    }
}

impl<T, F: std::future::Future<Output = Result<T, GateError>>> std::future::Future for Answer<F> {
    type Output = Result<tonic::Response<T>, Status>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        self.project()
            .body
            .poll(cx)
            .map(|done| done.map(tonic::Response::new).map_err(status))
    }
}

/// The one mapping of a gate error to the wire: its code, message, `ErrorInfo` and details.
pub fn status(err: GateError) -> Status {
    let reason = reason(&err);
    let wire = match err {
        GateError::Refused(refusal) => refused(refusal),
        GateError::Unresolved { key, refusal } => unresolved(&key, refusal),
        GateError::Invalid { field, description } => Wire::invalid(&field, &description),
        GateError::Store(e) => store(e),
        GateError::Unauthenticated => Wire::new(
            Code::Unauthenticated,
            "a credential is required: `authorization: Bearer <api key>` or a client certificate",
        ),
        GateError::ForbiddenScope { principal, why } => Wire::new(
            Code::PermissionDenied,
            format!("principal {principal:?} may not act on this scope or call this RPC: {why}"),
        )
        .meta("principal", principal),
        GateError::RateLimited { retry_after } => rate_limited(retry_after),
        GateError::PolicyDenied { policy } => Wire::new(
            Code::PermissionDenied,
            if policy.is_empty() {
                "no authorization policy permits this action; nothing was recorded".to_owned()
            } else {
                format!("authorization policy {policy:?} forbids this action; nothing was recorded")
            },
        )
        .meta("policy_id", policy),
        GateError::OverBudget(over) => budget_exceeded(&over),
    };
    let Wire {
        code,
        message,
        metadata,
        mut details,
    } = wire;
    details.set_error_info(reason.as_str_name(), DOMAIN, metadata);
    Status::with_error_details(code, message, details)
}

fn millis(ms: Millis) -> Duration {
    Duration::from_millis(ms.max(0) as u64)
}

fn refused(refusal: Refusal) -> Wire {
    match refusal {
        Refusal::KeyReused { differing } => key_reused(&differing),
        Refusal::InProgress { retry_after } => Wire::new(
            Code::Aborted,
            format!(
                "another attempt holds a live lease; retry the same request in {retry_after} ms"
            ),
        )
        .meta("retry_after_ms", retry_after)
        .retry_after(millis(retry_after)),
        Refusal::LeaseExpired {
            token,
            fencing,
            expired_at,
        } => Wire::new(
            Code::FailedPrecondition,
            format!(
                "the lease of fencing {fencing} ended without Complete or Release; reconcile with \
                 the provider, then Complete or Release with that token"
            ),
        )
        .meta("token", token)
        .meta("fencing", fencing)
        .meta("lease_expired_at", timestamp(expired_at)),
        Refusal::TokenMismatch => Wire::new(
            Code::FailedPrecondition,
            "this token was not granted for this action (or was released)",
        ),
        Refusal::TokenUnknown => Wire::new(Code::FailedPrecondition, "the action has no record"),
        Refusal::CompletedByOther {
            fencing,
            completed_at,
        } => Wire::new(
            Code::FailedPrecondition,
            "the action was already completed by another token or by an operator: it may have \
             run twice",
        )
        .meta("fencing", fencing)
        .meta("completed_at", timestamp(completed_at)),
        Refusal::AlreadyCompleted => Wire::new(
            Code::FailedPrecondition,
            "the action is completed; it cannot be released, extended or completed by an operator",
        ),
        Refusal::RequestRequired => Wire::invalid(
            "params_json",
            "the action has no record: give action_name and params_json so that its request \
             hash can be stored",
        ),
        Refusal::NotExpired { state } => not_expired(state),
        Refusal::AlreadySettled { state, fencing } => {
            let state = state_name(state);
            Wire::new(
                Code::FailedPrecondition,
                format!(
                    "the grant was already settled (by another resolver or an operator, or a newer \
                     grant replaced it): the action is {state} with fencing {fencing}; nothing \
                     was written"
                ),
            )
            .meta("state", state)
            .meta("fencing", fencing)
        }
        Refusal::BudgetExceeded(exceeded) => budget_exceeded(&OverBudget {
            used: exceeded.used.to_string(),
            limit: exceeded.limit.to_string(),
            requested: exceeded.requested.to_string(),
            window: 0,
            retry_at: None,
            retry_after: exceeded.retry_after,
            budget: exceeded.budget,
        }),
        Refusal::ApprovalDenied { id } => Wire::new(
            Code::PermissionDenied,
            "an operator denied the approval this action needs; nothing was recorded",
        )
        .meta("policy_id", "")
        .meta("approval_id", id),
        Refusal::ApprovalNotPending { state } => {
            let state = state.map_or("ABSENT", |s| s.as_str());
            Wire::new(
                Code::FailedPrecondition,
                format!("the approval is {state}, not pending; there is nothing to decide"),
            )
            .meta("state", state)
        }
    }
}

/// A budget refusal a person reads: used and limit in the budget's units, and when it frees up
/// as a time (UTC) and a duration; the metadata carries the same for programs.
fn budget_exceeded(over: &OverBudget) -> Wire {
    let OverBudget {
        budget,
        used,
        limit,
        requested,
        window,
        retry_at,
        retry_after,
    } = over;
    let within = match window {
        0 => String::new(),
        w => format!(" in the last {}", human_duration(*w)),
    };
    let when = match (retry_at, retry_after) {
        (Some(at), Some(ms)) => format!(
            "; it frees up at {} (in {})",
            rfc3339(*at),
            human_duration(*ms)
        ),
        (None, Some(ms)) => format!("; it frees up in {}", human_duration(*ms)),
        _ => "; this action alone is above the limit".to_owned(),
    };
    let mut wire = Wire::new(
        Code::ResourceExhausted,
        format!(
            "budget {budget:?} would be exceeded: {used} of {limit} used{within}, and this action \
             needs {requested}; nothing was recorded{when}"
        ),
    )
    .meta("budget", budget)
    .meta("used", used)
    .meta("limit", limit)
    .meta("requested", requested);
    if let Some(at) = retry_at {
        wire = wire.meta("retry_at", rfc3339(*at));
    }
    match retry_after {
        Some(ms) => wire.meta("retry_after_ms", ms).retry_after(millis(*ms)),
        None => wire,
    }
}

/// A duration as a person reads it, exactly: every unit that is not zero, from days down to
/// milliseconds (`23 h 59 min 12 s`, `1 d 24 min`, `4 min 10 s 350 ms`, `0 ms`), so that the
/// message never rounds a wait away (RetryInfo and `retry_after_ms` carry the same number).
fn human_duration(ms: Millis) -> String {
    let ms = ms.max(0);
    let parts = [
        (ms / 86_400_000, "d"),
        (ms / 3_600_000 % 24, "h"),
        (ms / 60_000 % 60, "min"),
        (ms / 1000 % 60, "s"),
        (ms % 1000, "ms"),
    ];
    let named: Vec<String> = parts
        .iter()
        .filter(|(n, _)| *n != 0)
        .map(|(n, unit)| format!("{n} {unit}"))
        .collect();
    match named.is_empty() {
        true => "0 ms".to_owned(),
        false => named.join(" "),
    }
}

/// A refusal about an unsettled action, naming the action and its provider key: everything
/// settling it needs is in the metadata (and the message says where to ask).
fn unresolved(key: &ActionKey, refusal: Refusal) -> Wire {
    let provider_key = key.provider_key();
    let mut wire = refused(refusal);
    wire.message = format!(
        "{}; ask the provider with provider key {provider_key}",
        wire.message
    );
    wire.meta("agent_id", &key.agent_id)
        .meta("run_id", &key.run_id)
        .meta("key", &key.key)
        .meta("provider_key", provider_key)
}

fn key_reused(differing: &[String]) -> Wire {
    Wire::new(
        Code::FailedPrecondition,
        format!(
            "the idempotency key was already used for a request whose key fields differ ({}); do \
             not retry, and do not mint a new key on your own",
            differing.join(", ")
        ),
    )
    .meta("differing_fields", differing.join(","))
}

fn state_name(state: State) -> &'static str {
    match state {
        State::Absent => "ABSENT",
        State::Authorized => "AUTHORIZED",
        State::Completed => "COMPLETED",
        State::Expired => "EXPIRED",
    }
}

fn not_expired(state: State) -> Wire {
    let state = state_name(state);
    Wire::new(
        Code::FailedPrecondition,
        format!("the action is {state}, not an expired lease; there is nothing to resolve"),
    )
    .meta("state", state)
}

fn store(error: StoreError) -> Wire {
    match error {
        error @ (StoreError::Unavailable { .. } | StoreError::Misconfigured(_)) => {
            tracing::warn!(%error, "store unavailable; failing closed");
            Wire::new(
                Code::Unavailable,
                "the store is unavailable; nothing was granted; retry with backoff",
            )
        }
        error @ StoreError::Corrupt { .. } => {
            tracing::error!(%error, "store returned something unreadable");
            Wire::new(Code::Internal, "internal store error")
        }
    }
}

fn rate_limited(retry_after: Duration) -> Wire {
    let ms = retry_after.as_millis().max(1);
    Wire::new(
        Code::ResourceExhausted,
        format!("rate limit reached; retry in {ms} ms"),
    )
    .meta("retry_after_ms", ms)
    .retry_after(retry_after)
}

#[cfg(test)]
mod tests {
    use super::human_duration;

    #[test]
    fn a_duration_is_written_exactly() {
        for (ms, shown) in [
            (0, "0 ms"),
            (350, "350 ms"),
            (12_000, "12 s"),
            (250_350, "4 min 10 s 350 ms"),
            (86_352_000, "23 h 59 min 12 s"),
            (86_400_000, "1 d"),
            (87_840_000, "1 d 24 min"),
            (90_061_001, "1 d 1 h 1 min 1 s 1 ms"),
        ] {
            assert_eq!(human_duration(ms), shown, "{ms} ms");
        }
    }
}
