//! The answers of `oncegate call` and `oncegate admin` as JSON values (what `--json` prints), and
//! as the text a person reads: one `name  value` line per field, nested names dotted as in the
//! JSON (`grant.token`), empty values left out.
//!
//! An unsettled action always shows what settling it needs: its action reference, token (where
//! the gate shows it), fencing number, provider key, since when its lease ended, and what its
//! latest grant was asked for: the action type and the params exactly as the agent sent them
//! (which provider to ask, for what amount, to whom).

use base64::Engine as _;
use serde_json::{Value, json};

use oncegate_proto as pb;

/// An action reference.
pub fn action_ref(action: Option<&pb::ActionRef>) -> Value {
    let action = action.cloned().unwrap_or_default();
    let scope = action.scope.unwrap_or_default();
    json!({ "agent_id": scope.agent_id, "run_id": scope.run_id, "key": action.key })
}

/// A stored completion: the receipt as text (lossy UTF-8) and exactly (base64).
pub fn completion(c: &pb::Completion) -> Value {
    json!({
        "receipt_text": String::from_utf8_lossy(&c.receipt),
        "receipt_base64": base64::engine::general_purpose::STANDARD.encode(&c.receipt),
        "completed_at": c.completed_at.map(|t| t.to_string()),
        "fencing": c.fencing,
        "source": c.source().as_str_name(),
        "note": c.note,
        "operator": c.operator,
        "seq": (c.seq != 0).then_some(c.seq),
        "statement": c.statement,
        // Shown for an operator's receipt, which says what it is (a worker's is its own).
        "receipt_format": match c.receipt_format() {
            pb::ReceiptFormat::Json => Some("json"),
            pb::ReceiptFormat::Text => Some("text"),
            pb::ReceiptFormat::Unspecified => None,
        },
    })
}

/// A RequestToken answer.
pub fn token_answer(r: &pb::RequestTokenResponse) -> Value {
    json!({
        "decision": r.decision().as_str_name(),
        "action": action_ref(r.action.as_ref()),
        "fingerprint": r.fingerprint,
        "grant": r.grant.as_ref().map(|g| json!({
            "token": g.token,
            "fencing": g.fencing,
            "lease_expires_at": g.lease_expires_at.map(|t| t.to_string()),
            "provider_key": g.provider_key,
            "replicas_acknowledged": g.replicas_acknowledged,
            "statement": g.statement,
        })),
        "redelivered": r.redelivered,
        "completion": r.completion.as_ref().map(completion),
        "approval": r.approval.as_ref().map(|a| json!({
            "id": a.id,
            "expires_at": a.expires_at.map(|t| t.to_string()),
            "policy_id": a.policy_id,
            "reason": a.reason,
        })),
    })
}

/// A GetAction answer for `action`. The token, the action type and the params are empty unless
/// the caller is an operator and the action unsettled.
pub fn action_view(action: &pb::ActionRef, v: &pb::GetActionResponse) -> Value {
    json!({
        "action": action_ref(Some(action)),
        "state": v.state().as_str_name(),
        "fencing": v.fencing,
        "fingerprint": v.fingerprint,
        "lease_expires_at": v.lease_expires_at.map(|t| t.to_string()),
        "token": v.token,
        "provider_key": v.provider_key,
        "holder": v.holder,
        "action_name": v.action_name,
        "params_json": v.params_json,
        "completion": v.completion.as_ref().map(completion),
    })
}

/// One entry of ListUnresolved (the action reference's fields at the top, as they always were).
pub fn unresolved(a: &pb::UnresolvedAction) -> Value {
    let action = action_ref(a.action.as_ref());
    json!({
        "agent_id": action["agent_id"],
        "run_id": action["run_id"],
        "key": action["key"],
        "token": a.token,
        "fencing": a.fencing,
        "provider_key": a.provider_key,
        "lease_expired_at": a.lease_expired_at.map(|t| t.to_string()),
        "holder": a.holder,
        "fingerprint": a.fingerprint,
        "action_name": a.action_name,
        "params_json": a.params_json,
    })
}

/// `value` as `name  value` lines, names aligned, nested names dotted; nulls and empty strings
/// are left out.
pub fn text(value: &Value) -> String {
    let mut pairs = Vec::new();
    flatten("", value, &mut pairs);
    let width = pairs.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    pairs
        .iter()
        .map(|(k, v)| format!("{k:<width$}  {v}\n"))
        .collect()
}

/// The order fields are read in: what was decided, which action, what settling it needs, then
/// the rest (JSON objects are sorted by name, which reads badly).
const FIELD_ORDER: [&str; 19] = [
    "decision",
    "state",
    "resolution",
    "recorded",
    "action",
    "agent_id",
    "run_id",
    "key",
    "grant",
    "token",
    "fencing",
    "provider_key",
    "action_name",
    "params_json",
    "lease_expires_at",
    "lease_expired_at",
    "completion",
    "receipt_text",
    "receipt_base64",
];

fn rank(name: &str) -> usize {
    FIELD_ORDER
        .iter()
        .position(|n| *n == name)
        .unwrap_or(FIELD_ORDER.len())
}

fn flatten(prefix: &str, value: &Value, out: &mut Vec<(String, String)>) {
    let Value::Object(map) = value else { return };
    let mut fields: Vec<_> = map.iter().collect();
    // Stable: fields outside FIELD_ORDER keep their (alphabetical) order.
    fields.sort_by_key(|(k, _)| rank(k));
    for (k, v) in fields {
        let name = format!("{prefix}{k}");
        match v {
            Value::Null => {}
            Value::String(s) if s.is_empty() => {}
            Value::Object(_) => flatten(&format!("{name}."), v, out),
            Value::String(s) => out.push((name, s.clone())),
            other => out.push((name, other.to_string())),
        }
    }
}

/// A ListUnresolved listing as text: one block per action, headed by its reference and since when
/// it is unresolved, then what settling it needs.
pub fn unresolved_text(listing: &Value) -> String {
    let actions = listing["actions"].as_array().cloned().unwrap_or_default();
    let mut out = String::new();
    if actions.is_empty() {
        out.push_str("no unresolved actions\n");
    }
    for a in &actions {
        out.push_str(&format!(
            "{} / {} / {}  unresolved since {}\n",
            a["agent_id"].as_str().unwrap_or_default(),
            a["run_id"].as_str().unwrap_or_default(),
            a["key"].as_str().unwrap_or_default(),
            a["lease_expired_at"].as_str().unwrap_or("?"),
        ));
        let details = json!({
            "token": a["token"],
            "fencing": a["fencing"],
            "provider_key": a["provider_key"],
            "action_name": a["action_name"],
            "params_json": a["params_json"],
            "holder": a["holder"],
        });
        for line in text(&details).lines() {
            out.push_str(&format!("  {line}\n"));
        }
    }
    if let Some(token) = listing["next_page_token"]
        .as_str()
        .filter(|t| !t.is_empty())
    {
        out.push_str(&format!("more: --page-token {token}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_aligns_dotted_names_and_leaves_out_empty_values() {
        let value = json!({"decision": "X", "grant": {"token": "t", "fencing": 7}, "note": "",
                           "completion": null});
        assert_eq!(
            text(&value),
            "decision       X\ngrant.token    t\ngrant.fencing  7\n"
        );
    }
}
