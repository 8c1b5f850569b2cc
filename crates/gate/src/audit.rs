//! The audit trail: one event per decision on the `oncegate::audit` target, and the decision
//! recorded on the RPC span. Names only: never params, receipts or tokens.
//!
//! Inside an RPC, the events run in the RPC's span, which already names the principal, the RPC,
//! the agent, run, action and key: an event adds only what the decision says (its fencing
//! number, the differing fields of a reused key...), so a log line says each thing once. Outside
//! one (the MCP gateway's in-process gate, or an RPC span a filter left out) the event names the
//! action itself ([`audit!`]).

use super::{authorization::Mode, decision::TokenDecision};
use oncegate_domain::{ActionKey, ledger::Refusal};
use oncegate_observe::telemetry;

/// An audit event about the action `key`: `audit!(info, key, decision = name, field = value, ...,
/// "message")`. The decision is recorded on the RPC span; in one, the event carries the other
/// fields only (the span names the rest); elsewhere the action's agent, run and key and the
/// decision as well. Without `decision = ...` the event changes nothing on the span.
macro_rules! audit {
    ($level:ident, $key:expr, decision = $decision:expr, $($fields:tt)*) => {{
        let key: &oncegate_domain::ActionKey = $key;
        let decision: &str = $decision;
        oncegate_observe::telemetry::record_decision(decision);
        if oncegate_observe::telemetry::in_rpc_span() {
            tracing::$level!(target: oncegate_observe::telemetry::AUDIT, $($fields)*)
        } else {
            tracing::$level!(target: oncegate_observe::telemetry::AUDIT, agent_id = %key.agent_id,
                run_id = %key.run_id, key = %key.key, decision, $($fields)*)
        }
    }};
    ($level:ident, $key:expr, $($fields:tt)*) => {{
        let key: &oncegate_domain::ActionKey = $key;
        if oncegate_observe::telemetry::in_rpc_span() {
            tracing::$level!(target: oncegate_observe::telemetry::AUDIT, $($fields)*)
        } else {
            tracing::$level!(target: oncegate_observe::telemetry::AUDIT, agent_id = %key.agent_id,
                run_id = %key.run_id, key = %key.key, $($fields)*)
        }
    }};
}
pub(crate) use audit;

/// The audit event of a RequestToken: its decision (the metrics label, [`TokenDecision::label`])
/// and what the decision adds: the fencing number of the grant, completion or expired grant it
/// names, the differing fields of a reused key, the time left on a lease in progress, the budget
/// exceeded, the policy that denied or holds it and the approval. `mode="shadow"` when the gate
/// grants anyway (enforcement, the default, is not repeated on every line).
pub(super) fn token(key: &ActionKey, action: &str, decision: &TokenDecision, mode: Mode) {
    let name = decision.label().as_str();
    let action = (!telemetry::in_rpc_span()).then_some(action);
    let mode = shadow_only(mode);
    match decision {
        TokenDecision::KeyReused { differing } => {
            let differing = differing.join(",");
            audit!(info, key, decision = name, action, %differing, mode, "request_token")
        }
        TokenDecision::InProgress { retry_after } => audit!(
            info,
            key,
            decision = name,
            action,
            retry_after_ms = retry_after,
            mode,
            "request_token"
        ),
        TokenDecision::BudgetExceeded(exceeded) => {
            audit!(info, key, decision = name, action, budget = %exceeded.budget,
                used = exceeded.used, limit = exceeded.limit, requested = exceeded.requested,
                mode, "request_token")
        }
        TokenDecision::Held(pending) => audit!(
            info,
            key,
            decision = name,
            action,
            policy = %pending.policy,
            approval_id = %pending.id,
            mode,
            "request_token"
        ),
        TokenDecision::PolicyDenied { policy } => {
            audit!(info, key, decision = name, action, policy = %policy, mode, "request_token")
        }
        TokenDecision::ApprovalDenied { id } => {
            audit!(info, key, decision = name, action, approval_id = %id, mode, "request_token")
        }
        _ => match decision.fencing() {
            Some(fencing) => {
                audit!(
                    info,
                    key,
                    decision = name,
                    action,
                    fencing,
                    mode,
                    "request_token"
                )
            }
            None => audit!(info, key, decision = name, action, mode, "request_token"),
        },
    }
}

/// The audit event of a shadow grant (enforcement would have answered otherwise: the event
/// before this one says how).
pub(super) fn shadow_granted(key: &ActionKey, fencing: u64) {
    audit!(
        info,
        key,
        decision = "shadow_granted",
        fencing,
        "request_token"
    );
}

/// The audit event of a Complete, Release or ExtendLease with a shadow token (nothing stored).
pub(super) fn shadow_call(rpc: &str, key: &ActionKey, fencing: u64) {
    audit!(info, key, decision = "shadow", rpc, fencing, "shadow token");
}

/// The audit event of a refused call.
pub(super) fn refused(rpc: &str, key: &ActionKey, refusal: &Refusal) {
    audit!(info, key, decision = refusal_name(refusal), rpc, "refused");
}

/// The mode field of an audit event: only shadow mode's is written.
fn shadow_only(mode: Mode) -> Option<&'static str> {
    (mode == Mode::Shadow).then_some("shadow")
}

/// The event of a possible double execution (a warning: someone should look).
pub(super) fn double_execution(key: &ActionKey, fencing: u64, what: &str) {
    audit!(warn, key, fencing, "double execution: {what}");
}

/// A short snake_case name of a refusal, for logs and metric labels.
pub fn refusal_name(refusal: &Refusal) -> &'static str {
    match refusal {
        Refusal::KeyReused { .. } => "key_reused",
        Refusal::InProgress { .. } => "in_progress",
        Refusal::LeaseExpired { .. } => "lease_expired",
        Refusal::TokenMismatch => "token_mismatch",
        Refusal::TokenUnknown => "token_unknown",
        Refusal::CompletedByOther { .. } => "completed_by_other",
        Refusal::AlreadyCompleted => "already_completed",
        Refusal::RequestRequired => "request_required",
        Refusal::NotExpired { .. } => "not_expired",
        Refusal::AlreadySettled { .. } => "already_settled",
        Refusal::BudgetExceeded(_) => "budget_exceeded",
        Refusal::ApprovalDenied { .. } => "approval_denied",
        Refusal::ApprovalNotPending { .. } => "approval_not_pending",
    }
}
