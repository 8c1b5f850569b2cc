//! What a gate's refusal of a gated `tools/call` becomes for the model (a tool error from
//! [`super::answers`], counted and logged where the gate could not be reached), and the action
//! key the texts name, computed as the gate computes it. Decides nothing.

use oncegate_client::{ActionSpec, ClientError};
use oncegate_domain::ActionKey;
use oncegate_gate::request::prepare_token;
use oncegate_proto as pb;
use rmcp::model::CallToolResult;

use super::{Shared, answers, unknown::Lost};

/// What the gate's refusal tells the model. An attempt "in progress" that this gateway lost is
/// its unknown outcome, said at once.
pub(crate) fn refusal(
    shared: &Shared,
    tool: &str,
    error: ClientError,
    lost: Option<Lost>,
    key: &ActionKey,
) -> CallToolResult {
    match error {
        ClientError::KeyReused { differing_fields } => answers::key_reused(&differing_fields),
        ClientError::InProgress { .. } => match lost {
            Some(lost) => answers::outcome_unknown(
                &format!(
                    "attempt {} of this call, forwarded by this gateway: {}",
                    lost.fencing, lost.why
                ),
                key,
            ),
            None => answers::in_progress(shared.in_progress_wait, key),
        },
        ClientError::LeaseExpired {
            fencing, action, ..
        } => {
            let named = action_key(&action);
            let key = if named.key.is_empty() { key } else { &named };
            answers::unresolved(fencing, key)
        }
        ClientError::Invalid { field, description } => answers::refused(
            "INVALID_REQUEST",
            &format!("invalid {field}: {description}"),
        ),
        ClientError::Unavailable(message) => {
            shared.metrics.gate_unavailable();
            tracing::warn!(tool, error = %message,
                "the gate is unavailable: the call was not forwarded (GATE_UNAVAILABLE)");
            answers::gate_unavailable(&message)
        }
        ClientError::PolicyDenied { approval_id, .. } if !approval_id.is_empty() => {
            answers::approval_denied(&approval_id)
        }
        ClientError::PolicyDenied { policy_id, .. } => answers::policy_denied(&policy_id),
        ClientError::RateLimited { retry_after } => {
            answers::gate_unavailable(&format!("rate limited for {retry_after:?}"))
        }
        other => answers::refused("REFUSED", &other.to_string()),
    }
}

/// The action key as the gate computes it (for the texts an operator reads, and to find an
/// attempt this gateway lost), from the gateway's own policies: exact in process, and with a gate
/// server that runs the same file.
pub(crate) fn reference_key(shared: &Shared, spec: &ActionSpec) -> ActionKey {
    let policies = &shared.policies;
    let call = oncegate_gate::TokenCall {
        agent_id: spec.agent_id.clone(),
        run_id: spec.run_id.clone(),
        action: spec.action.clone(),
        params_json: spec.params_json.clone(),
        idempotency_key: spec.idempotency_key.clone(),
        ..Default::default()
    };
    match prepare_token(
        &policies.limits,
        policies.for_action(&spec.action),
        call,
        String::new(),
    ) {
        Ok(prepared) => prepared.key,
        Err(_) => ActionKey::new(&spec.agent_id, &spec.run_id, &spec.idempotency_key),
    }
}

/// The action a gate message names, as a key.
pub(crate) fn action_key(action: &pb::ActionRef) -> ActionKey {
    let scope = action.scope.clone().unwrap_or_default();
    ActionKey::new(scope.agent_id, scope.run_id, action.key.clone())
}
