//! The grant statement: what the gate vouches for when it hands out a token, so that the system
//! that executes the action (a bank, a provider) can check, offline, that this caller holds a live
//! grant for exactly these params, and which fencing number it carries.

use serde::{Deserialize, Serialize};

use super::{PublicKeys, StatementError, StatementKey};
use crate::fingerprint::{self, KeyFields, ParamsLimits};

/// The JOSE `typ` of grant statements.
pub const GRANT_TYPE: &str = "oncegate-grant+jwt";

/// What a grant statement says. Serialized in this field order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantClaims {
    /// The gate that issued it (`--signing-issuer`).
    pub iss: String,
    /// Who may act on it: the action policy's `audience`, else the action's name.
    pub aud: String,
    /// When it was issued, store clock, Unix seconds.
    pub iat: i64,
    /// When the lease ends (at grant time), Unix seconds rounded down: the statement is not valid
    /// past the lease it vouches for.
    pub exp: i64,
    /// The agent.
    pub agent: String,
    /// The workflow run.
    pub run: String,
    /// The action's name, e.g. `payments.transfer`.
    pub action: String,
    /// The action key: the idempotency key, or the fingerprint.
    pub key: String,
    /// The request's intent id (empty when none): part of the fingerprint.
    pub intent: String,
    /// The request hash of the granted params (`v1-…`).
    pub fingerprint: String,
    /// The grant's fencing number: an executor refuses anything lower than what it has seen.
    pub fencing: u64,
    /// The provider key of the action.
    pub provider_key: String,
}

impl GrantClaims {
    /// Signs these claims as a grant statement.
    pub fn sign(&self, key: &StatementKey) -> String {
        key.sign(GRANT_TYPE, self)
    }
}

/// What an executor checks a grant statement against, besides the keys.
#[derive(Debug, Clone)]
pub struct GrantCheck<'a> {
    /// The audience the executor answers to (it must be the statement's `aud`).
    pub audience: &'a str,
    /// The params the executor was asked to act on, as JSON text.
    pub params_json: &'a str,
    /// The action policy's key fields (the gate's `key_fields`; [`KeyFields::All`] when none).
    pub key_fields: &'a KeyFields,
    /// The issuer to insist on; `None` accepts any issuer the keys vouch for.
    pub issuer: Option<&'a str>,
    /// Now, Unix seconds (the executor's clock).
    pub now: i64,
}

/// Verifies a grant statement: the signature (by a key of `keys`), its type, that it has not
/// expired, that it is meant for `check.audience`, and that `check.params_json` has the fingerprint
/// it vouches for (with the statement's action and intent and the given key fields). Returns the
/// claims; their `fencing` is the number to compare with the highest one the executor has seen.
pub fn verify_grant(
    keys: &PublicKeys,
    statement: &str,
    check: &GrantCheck<'_>,
) -> Result<GrantClaims, StatementError> {
    let (_, claims): (String, GrantClaims) = keys.verify(GRANT_TYPE, statement)?;
    if claims.exp <= check.now {
        return Err(StatementError::Expired {
            exp: claims.exp,
            now: check.now,
        });
    }
    if claims.aud != check.audience {
        return Err(StatementError::WrongAudience {
            expected: check.audience.into(),
            found: claims.aud,
        });
    }
    if let Some(issuer) = check.issuer
        && claims.iss != issuer
    {
        return Err(StatementError::WrongIssuer {
            expected: issuer.into(),
            found: claims.iss,
        });
    }
    let params = fingerprint::parse_params(check.params_json, ParamsLimits::default())
        .map_err(|e| StatementError::BadParams(e.to_string()))?;
    let selection = fingerprint::select(&params, check.key_fields);
    let found = fingerprint::fingerprint(&claims.action, &claims.intent, &selection);
    if found != claims.fingerprint {
        return Err(StatementError::FingerprintMismatch {
            expected: claims.fingerprint,
            found,
        });
    }
    Ok(claims)
}
