//! Why the gate did not do what was asked: one error type for every layer above the store. Its
//! translation to the wire (gRPC status, ErrorInfo reason, details) is `grpc::status`'s alone.

use std::time::Duration;

use oncegate_domain::{
    ActionKey,
    ledger::{Millis, Refusal},
};
use oncegate_store::StoreError;

/// Why the gate did not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    /// The state machine refused (conflict, in progress, wrong token...).
    #[error("refused: {0:?}")]
    Refused(Refusal),
    /// A RequestToken met an action whose outcome is unknown (`LEASE_EXPIRED_UNRESOLVED`): the
    /// refusal with the action it names, so that the answer carries everything settling it needs
    /// (the action reference and its provider key, besides the token and fencing number).
    #[error("refused: {refusal:?} for {key:?}")]
    Unresolved {
        key: Box<ActionKey>,
        refusal: Refusal,
    },
    /// The request is malformed; `field` is the proto field path.
    #[error("invalid {field}: {description}")]
    Invalid { field: String, description: String },
    /// The store could not be used; nothing was granted.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// No credential, or one that no principal holds.
    #[error("unauthenticated")]
    Unauthenticated,
    /// The principal may not act on this scope, or call this RPC; `why` says what is missing
    /// and what to configure.
    #[error("principal {principal:?} may not do this: {why}")]
    ForbiddenScope { principal: String, why: String },
    /// The principal's rate limit is spent; it may call again after `retry_after`.
    #[error("rate limited for {retry_after:?}")]
    RateLimited { retry_after: Duration },
    /// An authorization rule forbids the action (`policy`: the deciding policy's id; empty when
    /// no policy permits it).
    #[error("denied by authorization policy {policy:?}")]
    PolicyDenied { policy: String },
    /// A budget would be exceeded, as a person reads it.
    #[error("budget {:?} would be exceeded", .0.budget)]
    OverBudget(Box<OverBudget>),
}

/// A budget refusal as a person reads it: amounts in the budget's own units (`12.50`, a count of
/// grants for a velocity cap), and when enough of the window frees up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverBudget {
    pub budget: String,
    /// What the window holds, what it allows, what this action would add.
    pub used: String,
    pub limit: String,
    pub requested: String,
    /// The window's length.
    pub window: Millis,
    /// When enough frees up (store clock), and how long that is from the refusal; `None` when the
    /// action alone is above the limit.
    pub retry_at: Option<Millis>,
    pub retry_after: Option<Millis>,
}

impl GateError {
    /// The state machine's refusal, if that is what this error is.
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            Self::Refused(refusal) | Self::Unresolved { refusal, .. } => Some(refusal),
            _ => None,
        }
    }

    /// A malformed-request error.
    pub fn invalid(field: impl Into<String>, description: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.into(),
            description: description.into(),
        }
    }
}
