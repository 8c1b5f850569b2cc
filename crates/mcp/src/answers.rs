//! What the model sees when the gate, not the tool, answers: a replayed result marked in `_meta`,
//! and tool errors (`isError: true`) whose text says what happened and what to do, with the
//! machine-readable reason in `_meta["oncegate/error"]`. Owns every such text; decides nothing.

use std::time::Duration;

use rmcp::model::{CallToolResult, ContentBlock, MetaObject};
use serde_json::{Value, json};

use oncegate_domain::ActionKey;
use oncegate_proto as pb;

/// `_meta` key marking a result the gate replayed instead of running the tool.
pub const META_REPLAYED: &str = "oncegate/replayed";
/// `_meta` key holding the reason of a tool error the gateway produced.
pub const META_ERROR: &str = "oncegate/error";

/// Where an operator finds the action: its key at the gate and the provider key.
pub fn reference(key: &ActionKey) -> String {
    format!(
        "agent {:?}, run {:?}, key {:?}, provider key {}",
        key.agent_id,
        key.run_id,
        key.key,
        key.provider_key()
    )
}

/// The recorded result of an earlier execution, marked replayed.
pub fn replay(done: &pb::Completion) -> CallToolResult {
    let by_operator = done.source() == pb::CompletionSource::Operator;
    let mut result = match serde_json::from_slice::<CallToolResult>(&done.receipt) {
        Ok(result) => result,
        // An operator's receipt is their own text (or a tool result they copied).
        Err(_) => CallToolResult::success(vec![ContentBlock::text(format!(
            "This action was already performed; an operator recorded it as completed: {}",
            String::from_utf8_lossy(&done.receipt)
        ))]),
    };
    let meta = result.meta.get_or_insert_with(MetaObject::new);
    meta.insert(META_REPLAYED.into(), Value::Bool(true));
    meta.insert("oncegate/fencing".into(), json!(done.fencing));
    if by_operator {
        meta.insert("oncegate/recorded_by".into(), json!("operator"));
    }
    result
}

/// The person in the session declined (or cancelled) the approval the gate asked for: the gate
/// recorded a denial, and nothing ran.
pub fn approval_refused(how: &str, approval_id: &str) -> CallToolResult {
    error(
        "APPROVAL_DENIED",
        format!(
            "Not executed. The user {how} the approval this call needed (approval \
             {approval_id}); the gate recorded a denial and the tool did not run. Do not retry \
             the same call: ask the user what they want instead."
        ),
        json!({"oncegate/approval_id": approval_id}),
    )
}

/// The gate recorded a denial of the approval this call needed (asked earlier, of the person in
/// the chat or of an operator): nothing runs, now or on a repeat.
pub fn approval_denied(approval_id: &str) -> CallToolResult {
    error(
        "APPROVAL_DENIED",
        format!(
            "Not executed. The approval this call needed (approval {approval_id}) was declined \
             (by the user when they were asked, or by an operator); the gate recorded a denial \
             and the tool did not run. Do not retry the same call: ask the user what they want \
             instead."
        ),
        json!({"oncegate/approval_id": approval_id}),
    )
}

/// An authorization policy forbids the call (`policy`: the deciding policy's id; empty when no
/// policy permits it).
pub fn policy_denied(policy: &str) -> CallToolResult {
    let why = if policy.is_empty() {
        "no authorization policy permits it".to_owned()
    } else {
        format!("authorization policy {policy:?} forbids it")
    };
    refused("REFUSED", &why)
}

/// The idempotency key was used for a call whose key fields differ.
pub fn key_reused(fields: &[String]) -> CallToolResult {
    let names = if fields.is_empty() {
        "unknown".to_owned()
    } else {
        fields.join(", ")
    };
    error(
        "IDEMPOTENCY_KEY_REUSED",
        format!(
            "Not executed. This idempotency key was already used for a call with different \
             arguments (differing fields: {names}); that earlier call stands. Do not retry under \
             a new idempotency key to get around this: if a second, different action is really \
             wanted, confirm it with the user first."
        ),
        json!({ "oncegate/differing_fields": fields }),
    )
}

/// Another attempt of the same action still holds its lease after the wait. It may be running,
/// or lost by another gateway (an unknown outcome): nobody can tell until its lease ends.
pub fn in_progress(waited: Duration, key: &ActionKey) -> CallToolResult {
    error(
        "IDEMPOTENCY_IN_PROGRESS",
        format!(
            "Not executed here. Another attempt of this action holds its lease and had not \
             finished after {} s: its outcome is unknown or it is still running, so do not \
             re-run it, under this or any other idempotency key. Calling again later with the \
             same arguments returns its result once it is recorded; if that attempt was lost, it \
             must be reconciled first (`oncegate admin resolve`, once its lease has ended). ({})",
            waited.as_secs(),
            reference(key)
        ),
        json!({ "oncegate/provider_key": key.provider_key() }),
    )
}

/// The tool was called but its outcome is unknown: the lease is kept for reconciliation.
pub fn outcome_unknown(why: &str, key: &ActionKey) -> CallToolResult {
    error(
        "OUTCOME_UNKNOWN",
        format!(
            "The outcome of this call is unknown ({why}). The action may or may not have \
             happened. Do not retry it, under this or any other idempotency key, until it has \
             been reconciled: an operator checks with the provider and resolves it (`oncegate \
             admin resolve`). A retry before then is refused; after it, the retry returns the \
             recorded result. Reconcile with: {}",
            reference(key)
        ),
        json!({ "oncegate/provider_key": key.provider_key() }),
    )
}

/// An earlier attempt ended with an unknown outcome and nobody has settled it yet.
pub fn unresolved(fencing: u64, key: &ActionKey) -> CallToolResult {
    error(
        "LEASE_EXPIRED_UNRESOLVED",
        format!(
            "Not executed. An earlier attempt of this action (attempt {fencing}) ended with an \
             unknown outcome and has not been reconciled: it may have happened. Do not retry it, \
             under this or any other idempotency key, until an operator has reconciled it with \
             the provider (`oncegate admin resolve`). Reconcile with: {}",
            reference(key)
        ),
        json!({ "oncegate/provider_key": key.provider_key() }),
    )
}

/// The gate could not be asked: nothing ran (fail closed).
pub fn gate_unavailable(message: &str) -> CallToolResult {
    error(
        "GATE_UNAVAILABLE",
        format!(
            "Not executed: the gate that makes sure this action runs at most once is unavailable \
             ({message}). Nothing was done; call again with the same arguments later."
        ),
        json!({}),
    )
}

/// The gate refused the call as malformed, or for another reason.
pub fn refused(reason: &str, message: &str) -> CallToolResult {
    error(
        reason,
        format!("Not executed: the gate refused this call ({message})."),
        json!({}),
    )
}

fn error(reason: &str, text: String, extra: Value) -> CallToolResult {
    let mut result = CallToolResult::error(vec![ContentBlock::text(text)]);
    let meta = result.meta.get_or_insert_with(MetaObject::new);
    meta.insert(META_ERROR.into(), json!(reason));
    if let Value::Object(extra) = extra {
        for (name, value) in extra {
            meta.insert(name, value);
        }
    }
    result
}
