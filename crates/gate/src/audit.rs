//! The audit trail: one event per decision on the `oncegate::audit` target, and the decision
//! recorded on the RPC span. Names only: never params, receipts or tokens.
//!
//! Inside an RPC, the events run in the RPC's span, which already names the principal, the RPC,
//! the agent, run, action and key: an event adds only what the decision says (its fencing
//! number, the differing fields of a reused key...), so a log line says each thing once. Outside
//! one (the MCP gateway's in-process gate, or an RPC span a filter left out) the event names the
//! action itself ([`audit!`]).

use super::authorization::Mode;
use oncegate_domain::{
    ActionKey,
    ledger::{GrantKind, Refusal, TokenOutcome},
};
use oncegate_observe::{metrics::Decision, telemetry};

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

/// The audit event of a RequestToken: the decision and, where there is one, the fencing number of
/// the grant or completion it names; a reused key names the differing fields, an attempt in
/// progress the time left on its lease, an exceeded budget its name. `mode="shadow"` when the gate
/// grants anyway (enforcement, the default, is not repeated on every line).
pub(super) fn token(
    key: &ActionKey,
    action: &str,
    result: &Result<TokenOutcome, Refusal>,
    mode: Mode,
) {
    let (decision, fencing) = match result {
        Ok(TokenOutcome::Granted(grant, GrantKind::New)) => ("granted", Some(grant.fencing)),
        Ok(TokenOutcome::Granted(grant, GrantKind::Redelivered)) => {
            ("redelivered", Some(grant.fencing))
        }
        Ok(TokenOutcome::Granted(grant, GrantKind::Regranted)) => {
            ("regranted", Some(grant.fencing))
        }
        Ok(TokenOutcome::AlreadyCompleted(done)) => ("replayed", Some(done.fencing)),
        Ok(TokenOutcome::PendingApproval(pending)) => {
            held(key, action, &pending.policy, &pending.id, mode);
            return;
        }
        Err(Refusal::LeaseExpired { fencing, .. }) => ("lease_expired", Some(*fencing)),
        Err(refusal) => (refusal_name(refusal), None),
    };
    let action = (!telemetry::in_rpc_span()).then_some(action);
    let mode = shadow_only(mode);
    match (result, fencing) {
        (Err(Refusal::KeyReused { differing }), _) => {
            let differing = differing.join(",");
            audit!(info, key, decision = decision, action, %differing, mode, "request_token")
        }
        (Err(Refusal::InProgress { retry_after }), _) => {
            audit!(
                info,
                key,
                decision = decision,
                action,
                retry_after_ms = retry_after,
                mode,
                "request_token"
            )
        }
        (Err(Refusal::BudgetExceeded { budget, .. }), _) => {
            audit!(info, key, decision = decision, action, budget = %budget, mode, "request_token")
        }
        (_, Some(fencing)) => {
            audit!(
                info,
                key,
                decision = decision,
                action,
                fencing,
                mode,
                "request_token"
            )
        }
        (_, None) => audit!(
            info,
            key,
            decision = decision,
            action,
            mode,
            "request_token"
        ),
    }
}

/// The audit event of a RequestToken an authorization rule denied.
pub(super) fn policy_denied(key: &ActionKey, action: &str, policy: &str, mode: Mode) {
    let action = (!telemetry::in_rpc_span()).then_some(action);
    audit!(
        info,
        key,
        decision = "policy_denied",
        action,
        policy,
        mode = shadow_only(mode),
        "request_token"
    );
}

/// The audit event of a RequestToken a rule holds for approval (`approval_id` empty in shadow
/// mode, where none is asked for).
pub(super) fn held(key: &ActionKey, action: &str, policy: &str, approval_id: &str, mode: Mode) {
    let action = (!telemetry::in_rpc_span()).then_some(action);
    audit!(
        info,
        key,
        decision = "pending_approval",
        action,
        policy,
        approval_id,
        mode = shadow_only(mode),
        "request_token"
    );
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

/// The metrics decision of a RequestToken reply (`None` for refusals RequestToken never gives).
pub(super) fn token_decision(result: &Result<TokenOutcome, Refusal>) -> Option<Decision> {
    Some(match result {
        Ok(TokenOutcome::Granted(_, GrantKind::New)) => Decision::Granted,
        Ok(TokenOutcome::Granted(_, GrantKind::Redelivered)) => Decision::Redelivered,
        Ok(TokenOutcome::Granted(_, GrantKind::Regranted)) => Decision::Regranted,
        Ok(TokenOutcome::AlreadyCompleted(_)) => Decision::Replayed,
        Ok(TokenOutcome::PendingApproval(_)) => Decision::PendingApproval,
        Err(Refusal::BudgetExceeded { .. }) => Decision::BudgetExceeded,
        Err(Refusal::ApprovalDenied { .. }) => Decision::PolicyDenied,
        Err(Refusal::InProgress { .. }) => Decision::InProgress,
        Err(Refusal::KeyReused { .. }) => Decision::KeyReused,
        Err(Refusal::LeaseExpired { .. }) => Decision::LeaseExpired,
        Err(
            Refusal::TokenMismatch
            | Refusal::TokenUnknown
            | Refusal::CompletedByOther { .. }
            | Refusal::AlreadyCompleted
            | Refusal::RequestRequired
            | Refusal::NotExpired { .. }
            | Refusal::ApprovalNotPending { .. },
        ) => return None,
    })
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
        Refusal::BudgetExceeded { .. } => "budget_exceeded",
        Refusal::ApprovalDenied { .. } => "approval_denied",
        Refusal::ApprovalNotPending { .. } => "approval_not_pending",
    }
}
