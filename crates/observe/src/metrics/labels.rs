//! The label values of oncegate's metrics: every one from a closed set, so that no client can grow
//! the number of series. The decisions and what counts as a blocked duplicate (the DAR numerator)
//! are defined here.

use prometheus_client::encoding::EncodeLabelSet;

/// The outcome of one RequestToken, as counted in `oncegate_attempts_total{decision}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// A new token (the key had no live record).
    Granted,
    /// The same holder asked again during its live lease and got the same token back.
    Redelivered,
    /// The lease had ended unresolved and the policy is `regrant`: a new token.
    Regranted,
    /// The action was completed: the original receipt was returned (`ALREADY_COMPLETED`).
    Replayed,
    /// Another attempt holds a live lease (`IDEMPOTENCY_IN_PROGRESS`).
    InProgress,
    /// Same key, different key fields (`IDEMPOTENCY_KEY_REUSED`).
    KeyReused,
    /// The lease ended unresolved and the policy is `reconcile` (`LEASE_EXPIRED_UNRESOLVED`).
    LeaseExpired,
    /// The request was malformed (`INVALID_REQUEST`); the store was not asked.
    Invalid,
    /// An authorization rule forbids it (`POLICY_DENIED`).
    PolicyDenied,
    /// An operator denied the approval it needs (`POLICY_DENIED` on the wire, with the approval).
    ApprovalDenied,
    /// A rule holds it for an operator's approval (`DECISION_PENDING_APPROVAL`).
    PendingApproval,
    /// A budget or velocity cap would be exceeded (`BUDGET_EXCEEDED`).
    BudgetExceeded,
}

impl Decision {
    /// Every decision, in the order docs/operators.md lists them (the duplicate-action rate).
    pub const ALL: [Decision; 12] = [
        Decision::Granted,
        Decision::Redelivered,
        Decision::Regranted,
        Decision::Replayed,
        Decision::InProgress,
        Decision::KeyReused,
        Decision::LeaseExpired,
        Decision::Invalid,
        Decision::PolicyDenied,
        Decision::ApprovalDenied,
        Decision::PendingApproval,
        Decision::BudgetExceeded,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Granted => "granted",
            Decision::Redelivered => "redelivered",
            Decision::Regranted => "regranted",
            Decision::Replayed => "replayed",
            Decision::InProgress => "in_progress",
            Decision::KeyReused => "key_reused",
            Decision::LeaseExpired => "lease_expired",
            Decision::Invalid => "invalid",
            Decision::PolicyDenied => "policy_denied",
            Decision::ApprovalDenied => "approval_denied",
            Decision::PendingApproval => "pending_approval",
            Decision::BudgetExceeded => "budget_exceeded",
        }
    }

    /// True for the attempts the gate stopped from executing an action a second time: the
    /// numerator of DAR. A re-delivery is not blocked (the same worker gets its own token back),
    /// nor is a regrant (it authorizes a new execution), nor an invalid request.
    pub fn is_blocked_duplicate(self) -> bool {
        matches!(
            self,
            Decision::Replayed
                | Decision::InProgress
                | Decision::KeyReused
                | Decision::LeaseExpired
        )
    }
}

/// How an action may have run twice, as counted in `oncegate_double_executions_total{kind}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DoubleExecution {
    /// A Complete was refused with `COMPLETED_BY_OTHER`: another token (or an operator) had
    /// completed the action, so this worker's execution was a second one.
    CompletedByOther,
    /// A superseded token (its lease expired and a newer token was granted) completed first: the
    /// completion is recorded, and the newer holder may have run too.
    SupersededCompletion,
}

impl DoubleExecution {
    /// Both kinds.
    pub const ALL: [DoubleExecution; 2] = [
        DoubleExecution::CompletedByOther,
        DoubleExecution::SupersededCompletion,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            DoubleExecution::CompletedByOther => "completed_by_other",
            DoubleExecution::SupersededCompletion => "superseded_completion",
        }
    }
}

/// The store operations timed and counted, one per store call the gate makes.
pub const STORE_OPERATIONS: [&str; 13] = [
    "request_token",
    "complete",
    "release",
    "extend_lease",
    "get_action",
    "record_external",
    "resolve_expired",
    "list_unresolved",
    "export_receipts",
    "decide_approval",
    "list_approvals",
    "get_budgets",
    "list_undeliverable_events",
];

/// The kinds of store failure: `unavailable` (fail closed, retry later), `corrupt` (a record this
/// version cannot read) and `misconfigured` (a store that could lose records).
pub const STORE_ERRORS: [&str; 3] = ["unavailable", "corrupt", "misconfigured"];

/// The release reasons a client can give (anything else is counted as `other`).
pub const RELEASE_REASONS: [&str; 3] = ["definite_failure", "not_attempted", "resolved_failed"];

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct AttemptLabels {
    pub(super) action: String,
    pub(super) decision: &'static str,
    /// `enforce`, or `shadow` when the gate granted anyway.
    pub(super) mode: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct BlockedLabels {
    pub(super) action: String,
    pub(super) reason: &'static str,
    pub(super) mode: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct BudgetLabels {
    pub(super) budget: String,
    pub(super) decision: &'static str,
    pub(super) mode: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct ExpiredLabels {
    pub(super) action: String,
    pub(super) on_expiry: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct SourceLabels {
    pub(super) source: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct ResolutionLabels {
    pub(super) resolved_by: &'static str,
    pub(super) resolution: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct ReasonLabels {
    pub(super) reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct KindLabels {
    pub(super) kind: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct StoreErrorLabels {
    pub(super) operation: &'static str,
    pub(super) error: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct OperationLabels {
    pub(super) operation: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct RpcLabels {
    pub(super) rpc: String,
    pub(super) code: &'static str,
}

/// The outcomes of one webhook delivery attempt, as counted in
/// `oncegate_webhook_deliveries_total{outcome}`.
pub const WEBHOOK_OUTCOMES: [&str; 3] = ["delivered", "failed", "undeliverable"];

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct WebhookLabels {
    /// The webhook's name in the configuration (a closed set).
    pub(super) webhook: String,
    /// The event type's short name.
    pub(super) event: &'static str,
    pub(super) outcome: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct EventLabels {
    pub(super) event: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct BuildLabels {
    pub(super) version: &'static str,
    pub(super) commit: &'static str,
}

/// The canonical upper-case name of a gRPC status code, as other gRPC tooling labels it.
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}
