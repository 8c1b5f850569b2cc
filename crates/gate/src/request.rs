//! What a well-formed request is, and how a request is hashed: the limits (docs/CONTRACT.md,
//! "Defaults and limits"), the action key, the fingerprint and field digests. One copy, used by
//! RequestToken, by the operator's external completion and by `oncegate fingerprint`.

use super::{
    GateError,
    policy::{ActionPolicy, Limits, Policies},
};
use oncegate_domain::{
    ActionKey,
    fingerprint::{self, ParamsError},
    ledger::{Asked, Millis, RequestHash, TokenRequest},
};

/// A RequestToken as the gate sees it.
#[derive(Debug, Clone, Default)]
pub struct TokenCall {
    pub agent_id: String,
    pub run_id: String,
    pub action: String,
    pub params_json: String,
    pub intent_id: String,
    pub idempotency_key: String,
    pub holder: String,
    /// Requested lease, when the caller set one.
    pub lease: Option<Millis>,
    /// The authenticated principal's name: a live token is redelivered only to it.
    pub principal: String,
}

/// A validated, fingerprinted RequestToken, ready for the store.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub key: ActionKey,
    pub request: TokenRequest,
    /// The parsed params (for the authorization rules and budgets).
    pub params: serde_json::Map<String, serde_json::Value>,
    /// The params as sent (kept with an approval, for the approver).
    pub params_json: String,
    /// The action type, as asked.
    pub action: String,
    /// The intent, as asked (empty: none).
    pub intent_id: String,
    /// True when the action is named by the caller's idempotency key (the action key's `key`).
    pub keyed: bool,
}

impl Prepared {
    /// The caller's idempotency key (empty when the action is keyed by its fingerprint).
    pub fn idempotency_key(&self) -> &str {
        if self.keyed { &self.key.key } else { "" }
    }
}

/// A request's identity: its fingerprint, and the per-field digests that name differing fields
/// (empty unless `keyed`: an action keyed by its fingerprint can never meet another request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hashed {
    pub fingerprint: String,
    pub digests: String,
    /// The parsed params.
    pub params: serde_json::Map<String, serde_json::Value>,
}

/// The policy governing `action`: INVALID_REQUEST (on `field`) when the gate is strict and no
/// policy names it.
pub fn policy_for<'p>(
    policies: &'p Policies,
    field: &str,
    action: &str,
) -> Result<&'p ActionPolicy, GateError> {
    policies.for_action(action).ok_or_else(|| {
        GateError::invalid(field, "no policy names this action and the gate is strict")
    })
}

/// Parses `params_json` strictly, selects the policy's key fields and hashes the request; the
/// digests are computed when `keyed(fingerprint)` says the action key is not the fingerprint.
pub fn hash_request(
    limits: &Limits,
    policy: &ActionPolicy,
    action: &str,
    params_json: &str,
    intent_id: &str,
    keyed: impl FnOnce(&str) -> bool,
) -> Result<Hashed, GateError> {
    let params = fingerprint::parse_params(params_json, limits.params()).map_err(params_error)?;
    let selection = fingerprint::select(&params, &policy.key_fields);
    let fingerprint = fingerprint::fingerprint(action, intent_id, &selection);
    let digests = if keyed(&fingerprint) {
        fingerprint::field_digests(action, intent_id, &selection)
    } else {
        String::new()
    };
    Ok(Hashed {
        fingerprint,
        digests,
        params,
    })
}

/// Validates a RequestToken against the limits and its action's `policy` (looked up once by the
/// caller; `None` when the gate is strict and no policy names the action) and computes its key
/// and request hash; `new_token` is handed out if the store grants. Pure: the fuzz targets and
/// property tests drive it directly.
pub fn prepare_token(
    limits: &Limits,
    policy: Option<&ActionPolicy>,
    call: TokenCall,
    new_token: String,
) -> Result<Prepared, GateError> {
    check_id(limits, "scope.agent_id", &call.agent_id, true)?;
    check_id(limits, "scope.run_id", &call.run_id, true)?;
    check_id(limits, "action", &call.action, true)?;
    check_id(limits, "intent_id", &call.intent_id, false)?;
    check_id(limits, "idempotency_key", &call.idempotency_key, false)?;
    check_id(limits, "holder", &call.holder, false)?;
    let policy = policy.ok_or_else(|| {
        GateError::invalid(
            "action",
            "no policy names this action and the gate is strict",
        )
    })?;
    let lease = match call.lease {
        None => policy.lease,
        Some(ms) => check_ttl(limits, "lease_ttl", ms)?,
    };
    let keyed = !call.idempotency_key.is_empty();
    let hashed = hash_request(
        limits,
        policy,
        &call.action,
        &call.params_json,
        &call.intent_id,
        |_| keyed,
    )?;
    let key = ActionKey::new(
        call.agent_id,
        call.run_id,
        if keyed {
            call.idempotency_key
        } else {
            hashed.fingerprint.clone()
        },
    );
    let request = TokenRequest {
        fingerprint: hashed.fingerprint,
        digests: hashed.digests,
        holder: call.holder,
        new_token,
        lease,
        retention: policy.retention,
        sliding: policy.sliding,
        on_expiry: policy.on_expiry,
        principal: call.principal,
        max_superseded: limits.max_superseded_grants,
        hold: None,
        charges: Vec::new(),
        asked: Asked {
            action: call.action.clone(),
            params: call.params_json.clone(),
        },
    };
    Ok(Prepared {
        key,
        request,
        params: hashed.params,
        params_json: call.params_json,
        action: call.action,
        intent_id: call.intent_id,
        keyed,
    })
}

/// The request hash an operator's completion of an action stores when the action has no record:
/// computed exactly as RequestToken computes it for the same key (`None` when the request names
/// no action).
pub fn operator_request_hash(
    policies: &Policies,
    key: &ActionKey,
    action: &str,
    params_json: &str,
    intent_id: &str,
) -> Result<Option<RequestHash>, GateError> {
    if action.is_empty() && params_json.is_empty() && intent_id.is_empty() {
        return Ok(None);
    }
    let limits = &policies.limits;
    check_id(limits, "action_name", action, true)?;
    check_id(limits, "intent_id", intent_id, false)?;
    let policy = policy_for(policies, "action_name", action)?;
    // Keyed by its fingerprint the action cannot meet another request, so it needs no digests;
    // keyed by an idempotency key it can, and the digests name the differing fields.
    let hashed = hash_request(
        limits,
        policy,
        action,
        params_json,
        intent_id,
        |fingerprint| key.key != fingerprint,
    )?;
    Ok(Some(RequestHash {
        fingerprint: hashed.fingerprint,
        digests: hashed.digests,
        retention: policy.retention,
        sliding: policy.sliding,
    }))
}

/// A requested lease or extension: within `[limits]` (at least `min_lease_ttl_seconds`, at most
/// `max_lease_ttl_seconds`).
pub fn check_ttl(limits: &Limits, field: &str, ms: Millis) -> Result<Millis, GateError> {
    if ms <= 0 {
        return Err(GateError::invalid(field, "must be positive"));
    }
    if ms < limits.min_lease {
        return Err(GateError::invalid(
            field,
            format!("must be at least {} ms", limits.min_lease),
        ));
    }
    if ms > limits.max_lease {
        return Err(GateError::invalid(
            field,
            format!("must be at most {} s", limits.max_lease / 1000),
        ));
    }
    Ok(ms)
}

/// An id is within `max_id_bytes`, and present when `required`.
pub fn check_id(
    limits: &Limits,
    field: &str,
    value: &str,
    required: bool,
) -> Result<(), GateError> {
    let max = limits.max_id_bytes;
    if required && value.is_empty() {
        return Err(GateError::invalid(field, "must not be empty"));
    }
    if value.len() > max {
        return Err(GateError::invalid(
            field,
            format!("is {} bytes, more than the limit of {max}", value.len()),
        ));
    }
    Ok(())
}

/// Checks a byte field (a receipt, a note) against its limit.
pub fn check_bytes(field: &str, len: usize, max: usize) -> Result<(), GateError> {
    if len > max {
        return Err(GateError::invalid(
            field,
            format!("is {len} bytes, more than the limit of {max}"),
        ));
    }
    Ok(())
}

/// Validates an action reference (ids present and within the limits).
pub fn check_ref(limits: &Limits, key: &ActionKey) -> Result<(), GateError> {
    check_id(limits, "action.scope.agent_id", &key.agent_id, true)?;
    check_id(limits, "action.scope.run_id", &key.run_id, true)?;
    check_id(limits, "action.key", &key.key, true)
}

/// A fresh one-shot token: a UUIDv4 carries 122 random bits from the OS generator.
pub(super) fn new_token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

fn params_error(e: ParamsError) -> GateError {
    GateError::invalid("params_json", e.to_string())
}
