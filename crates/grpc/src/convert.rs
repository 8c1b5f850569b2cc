//! proto ↔ domain: the conversions both services share. Nothing else.

use oncegate_domain::{
    ActionKey,
    ledger::{self, Millis},
    ledger::{Approval, ApprovalState, Pending},
    statement::receipt::ChainEntry,
};
use oncegate_gate::{GateError, TokenAnswer};
use oncegate_proto as pb;

/// A RequestToken answer on the wire.
pub fn token_response(answer: TokenAnswer) -> pb::RequestTokenResponse {
    let mut response = pb::RequestTokenResponse {
        action: Some(action_ref(&answer.key)),
        fingerprint: answer.fingerprint,
        ..Default::default()
    };
    match answer.outcome {
        ledger::TokenOutcome::Granted(grant, kind) => {
            response.decision = pb::Decision::Granted as i32;
            response.redelivered = kind == ledger::GrantKind::Redelivered;
            response.grant = Some(pb::Grant {
                token: grant.token,
                fencing: grant.fencing,
                lease_expires_at: Some(timestamp(grant.lease_expires_at)),
                provider_key: answer.provider_key,
                replicas_acknowledged: answer.replicas_acknowledged,
                statement: answer.statement,
            });
        }
        ledger::TokenOutcome::AlreadyCompleted(done) => {
            response.decision = pb::Decision::AlreadyCompleted as i32;
            response.completion = Some(completion(done));
        }
        ledger::TokenOutcome::PendingApproval(pending) => {
            response.decision = pb::Decision::PendingApproval as i32;
            response.approval = Some(approval(&pending));
        }
    }
    response
}

/// A Release reason as the gate names it; INVALID_REQUEST for anything but the two reasons.
pub fn release_reason(reason: i32) -> Result<&'static str, GateError> {
    match pb::ReleaseReason::try_from(reason) {
        Ok(pb::ReleaseReason::DefiniteFailure) => Ok("definite_failure"),
        Ok(pb::ReleaseReason::NotAttempted) => Ok("not_attempted"),
        _ => Err(GateError::invalid(
            "reason",
            "must be RELEASE_REASON_DEFINITE_FAILURE or RELEASE_REASON_NOT_ATTEMPTED",
        )),
    }
}

/// Store milliseconds as a protobuf Timestamp.
pub fn timestamp(ms: Millis) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: ms.div_euclid(1000),
        nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
    }
}

/// A protobuf Duration as milliseconds (rounded up, so 1 ns is not zero); `None` when unset.
pub fn duration_ms(
    field: &str,
    d: Option<prost_types::Duration>,
) -> Result<Option<Millis>, GateError> {
    let Some(d) = d else { return Ok(None) };
    if d.seconds < 0 || d.nanos < 0 || !(0..1_000_000_000).contains(&d.nanos) {
        return Err(GateError::invalid(field, "must be positive"));
    }
    let ms = d
        .seconds
        .checked_mul(1000)
        .and_then(|s| s.checked_add((i64::from(d.nanos) + 999_999) / 1_000_000))
        .ok_or_else(|| GateError::invalid(field, "is too long"))?;
    Ok(Some(ms))
}

/// The action a request names; INVALID_REQUEST when it names none.
pub fn action_key(action: Option<pb::ActionRef>) -> Result<ActionKey, GateError> {
    let action = action.ok_or_else(|| GateError::invalid("action", "is required"))?;
    let scope = action
        .scope
        .ok_or_else(|| GateError::invalid("action.scope", "is required"))?;
    Ok(ActionKey::new(scope.agent_id, scope.run_id, action.key))
}

/// An action key on the wire.
pub fn action_ref(key: &ActionKey) -> pb::ActionRef {
    pb::ActionRef {
        scope: Some(pb::Scope {
            agent_id: key.agent_id.clone(),
            run_id: key.run_id.clone(),
        }),
        key: key.key.clone(),
    }
}

/// A stored completion on the wire.
pub fn completion(done: ledger::Completion) -> pb::Completion {
    pb::Completion {
        receipt: done.receipt,
        completed_at: Some(timestamp(done.completed_at)),
        fencing: done.fencing,
        token: done.token,
        source: match done.source {
            ledger::Source::Worker => pb::CompletionSource::Worker,
            ledger::Source::Operator => pb::CompletionSource::Operator,
        } as i32,
        note: done.note,
        operator: done.operator,
        seq: done.seq,
        statement: done.statement,
        receipt_format: match done.format {
            ledger::ReceiptFormat::Unspecified => pb::ReceiptFormat::Unspecified,
            ledger::ReceiptFormat::Json => pb::ReceiptFormat::Json,
            ledger::ReceiptFormat::Text => pb::ReceiptFormat::Text,
        } as i32,
    }
}

/// A receipt format from the wire (an unknown number is unspecified: refused where required).
pub fn receipt_format(format: i32) -> ledger::ReceiptFormat {
    match pb::ReceiptFormat::try_from(format) {
        Ok(pb::ReceiptFormat::Json) => ledger::ReceiptFormat::Json,
        Ok(pb::ReceiptFormat::Text) => ledger::ReceiptFormat::Text,
        _ => ledger::ReceiptFormat::Unspecified,
    }
}

/// A receipt-chain entry on the wire.
pub fn receipt_entry(entry: ChainEntry) -> pb::ReceiptEntry {
    let core = entry.core;
    pb::ReceiptEntry {
        seq: core.seq,
        action: Some(action_ref(&ActionKey::new(core.agent, core.run, core.key))),
        fingerprint: core.fingerprint,
        receipt_digest: core.receipt_digest,
        fencing: core.fencing,
        source: match core.source.as_str() {
            "operator" => pb::CompletionSource::Operator,
            _ => pb::CompletionSource::Worker,
        } as i32,
        completed_at: Some(timestamp(core.completed_at)),
        statement: entry.statement,
    }
}

/// A record view of the action `key` on the wire (every field; the caller blanks what its
/// principal may not see).
pub fn action_view(key: &ActionKey, view: ledger::ActionView) -> pb::GetActionResponse {
    let state = match view.state {
        ledger::State::Absent => pb::ActionState::Absent,
        ledger::State::Authorized => pb::ActionState::Authorized,
        ledger::State::Completed => pb::ActionState::Completed,
        ledger::State::Expired => pb::ActionState::Expired,
    };
    pb::GetActionResponse {
        state: state as i32,
        fencing: view.fencing,
        fingerprint: view.fingerprint,
        lease_expires_at: view.lease_expires_at.map(timestamp),
        completion: view.completion.map(completion),
        holder: view.holder,
        token: view.token,
        provider_key: key.provider_key(),
        action_name: view.action,
        params_json: view.params,
    }
}

/// A pending approval on the wire.
pub fn approval(pending: &Pending) -> pb::Approval {
    pb::Approval {
        id: pending.id.clone(),
        expires_at: Some(timestamp(pending.expires_at)),
        policy_id: pending.policy.clone(),
        reason: pending.reason.clone(),
    }
}

/// A stored approval of `key` on the wire.
pub fn approval_entry(key: &ActionKey, a: Approval) -> pb::ApprovalEntry {
    let state = match a.state {
        ApprovalState::Pending => pb::ApprovalState::Pending,
        ApprovalState::Approved => pb::ApprovalState::Approved,
        ApprovalState::Denied => pb::ApprovalState::Denied,
        ApprovalState::Used => pb::ApprovalState::Used,
    };
    pb::ApprovalEntry {
        action: Some(action_ref(key)),
        approval: Some(pb::Approval {
            id: a.id,
            expires_at: Some(timestamp(a.expires_at)),
            policy_id: a.policy,
            reason: a.reason,
        }),
        state: state as i32,
        action_name: a.action,
        fingerprint: a.fingerprint,
        created_at: Some(timestamp(a.created_at)),
        operator: a.operator,
        note: a.note,
        params_json: a.params,
    }
}

/// Milliseconds as a protobuf Duration.
pub fn duration(ms: Millis) -> prost_types::Duration {
    prost_types::Duration {
        seconds: ms.div_euclid(1000),
        nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
    }
}
