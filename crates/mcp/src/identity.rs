//! Who acts and which action a gated call is. The agent comes from the gateway's configuration;
//! the run from the request's `_meta` (`oncegate/run_id`), else `--run-id`, else the MCP session
//! (a stateless request over HTTP has none: its run is [`STATELESS_RUN`], the same on every
//! replica, so a repeated call is one action whichever replica answers);
//! the idempotency key from `_meta` (`oncegate/idempotency_key`, or `idempotencyKey` as the
//! closed MCP proposal named it), else none: the gate then names the action by the fingerprint
//! of the arguments (with the action's key fields). Owns these `_meta` names; decides nothing.

use serde_json::{Map, Value};

/// `_meta` key naming the run a call belongs to (the workflow run that survives agent restarts).
pub const META_RUN_ID: &str = "oncegate/run_id";
/// `_meta` key naming the logical action (the idempotency key).
pub const META_IDEMPOTENCY_KEY: &str = "oncegate/idempotency_key";
/// The same, as the closed MCP proposal (SEP for `tools/call` idempotency) named it.
pub const META_IDEMPOTENCY_KEY_PROPOSAL: &str = "idempotencyKey";

/// The run of a stateless HTTP request that names none (and of a gateway without `--run-id`).
pub const STATELESS_RUN: &str = "mcp-stateless";

/// The gateway's own identity settings.
#[derive(Debug, Clone)]
pub struct Defaults {
    /// The agent every call acts for.
    pub agent_id: String,
    /// The run of calls whose `_meta` names none (`None`: the session).
    pub run_id: Option<String>,
}

/// Who acts, in which run, under which key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub agent_id: String,
    pub run_id: String,
    /// Empty: the action is named by its fingerprint.
    pub idempotency_key: String,
}

/// The identity of a call with request `_meta` `meta`, whose run is `session_run` when neither
/// the request nor the gateway names one. An error names the `_meta` key that is not a non-empty
/// string.
pub fn identify(
    meta: &Map<String, Value>,
    defaults: &Defaults,
    session_run: &str,
) -> Result<Identity, String> {
    let run_id = match text(meta, META_RUN_ID)? {
        Some(run) => run,
        None => defaults
            .run_id
            .clone()
            .unwrap_or_else(|| session_run.to_owned()),
    };
    let idempotency_key = match text(meta, META_IDEMPOTENCY_KEY)? {
        Some(key) => key,
        None => text(meta, META_IDEMPOTENCY_KEY_PROPOSAL)?.unwrap_or_default(),
    };
    Ok(Identity {
        agent_id: defaults.agent_id.clone(),
        run_id,
        idempotency_key,
    })
}

fn text(meta: &Map<String, Value>, key: &str) -> Result<Option<String>, String> {
    match meta.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
        Some(_) => Err(format!("_meta[\"{key}\"] must be a non-empty string")),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn meta(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap()
    }

    #[test]
    fn meta_beats_flags_beats_session() {
        let flags = Defaults {
            agent_id: "a".into(),
            run_id: Some("flag-run".into()),
        };
        let none = Defaults {
            agent_id: "a".into(),
            run_id: None,
        };
        let id = identify(
            &meta(json!({"oncegate/run_id": "r", "idempotencyKey": "k"})),
            &flags,
            "s",
        )
        .unwrap();
        assert_eq!(
            (id.run_id.as_str(), id.idempotency_key.as_str()),
            ("r", "k")
        );
        let id = identify(
            &meta(json!({"oncegate/idempotency_key": "k1", "idempotencyKey": "k2"})),
            &flags,
            "s",
        )
        .unwrap();
        assert_eq!(
            (id.run_id.as_str(), id.idempotency_key.as_str()),
            ("flag-run", "k1")
        );
        let id = identify(&meta(json!({})), &none, "mcp-session-s1").unwrap();
        assert_eq!(
            (id.run_id.as_str(), id.idempotency_key.as_str()),
            ("mcp-session-s1", "")
        );
        let err = identify(&meta(json!({"oncegate/run_id": 7})), &none, "s").unwrap_err();
        assert!(err.contains("oncegate/run_id"), "{err}");
    }
}
