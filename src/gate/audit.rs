//! The audit trail: one event per decision on the `oncegate::audit` target, in the span of the
//! call that names its principal, and the decision recorded on the RPC span. Names only: never
//! params, receipts or tokens.

use crate::{
    domain::{
        ActionKey,
        ledger::{GrantKind, Refusal, TokenOutcome},
    },
    observe::{
        metrics::Decision,
        telemetry::{self, AUDIT},
    },
};

/// The audit event of a RequestToken.
pub(super) fn token(key: &ActionKey, action: &str, result: &Result<TokenOutcome, Refusal>) {
    let (decision, fencing) = match result {
        Ok(TokenOutcome::Granted(grant, GrantKind::New)) => ("granted", grant.fencing),
        Ok(TokenOutcome::Granted(grant, GrantKind::Redelivered)) => ("redelivered", grant.fencing),
        Ok(TokenOutcome::Granted(grant, GrantKind::Regranted)) => ("regranted", grant.fencing),
        Ok(TokenOutcome::AlreadyCompleted(done)) => ("replayed", done.fencing),
        Err(refusal) => (refusal_name(refusal), 0),
    };
    telemetry::record_decision(decision);
    tracing::info!(target: AUDIT, agent_id = %key.agent_id, run_id = %key.run_id, action, key = %key.key,
        decision, fencing, "request_token");
}

/// The audit event of a refused call.
pub(super) fn refused(rpc: &str, key: &ActionKey, refusal: &Refusal) {
    telemetry::record_decision(refusal_name(refusal));
    tracing::info!(target: AUDIT, agent_id = %key.agent_id, run_id = %key.run_id, key = %key.key,
        decision = refusal_name(refusal), rpc, "refused");
}

/// The event of a possible double execution (a warning: someone should look).
pub(super) fn double_execution(key: &ActionKey, fencing: u64, what: &str) {
    tracing::warn!(target: AUDIT, agent_id = %key.agent_id, run_id = %key.run_id, key = %key.key,
        fencing, "double execution: {what}");
}

/// The metrics decision of a RequestToken reply (`None` for refusals RequestToken never gives).
pub(super) fn token_decision(result: &Result<TokenOutcome, Refusal>) -> Option<Decision> {
    Some(match result {
        Ok(TokenOutcome::Granted(_, GrantKind::New)) => Decision::Granted,
        Ok(TokenOutcome::Granted(_, GrantKind::Redelivered)) => Decision::Redelivered,
        Ok(TokenOutcome::Granted(_, GrantKind::Regranted)) => Decision::Regranted,
        Ok(TokenOutcome::AlreadyCompleted(_)) => Decision::Replayed,
        Err(Refusal::InProgress { .. }) => Decision::InProgress,
        Err(Refusal::KeyReused { .. }) => Decision::KeyReused,
        Err(Refusal::LeaseExpired { .. }) => Decision::LeaseExpired,
        Err(
            Refusal::TokenMismatch
            | Refusal::TokenUnknown
            | Refusal::CompletedByOther { .. }
            | Refusal::AlreadyCompleted
            | Refusal::RequestRequired
            | Refusal::NotExpired { .. },
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
    }
}
