//! Verification wherever the executor is: a provider, a bank, a tool server written in Rust checks
//! a grant statement offline, with the gate's public keys (its JWKS), against the params it was
//! asked to act on, and gets the fencing number to compare with the highest it has seen.
//!
//! ```
//! use oncegate_client::{PublicKeys, verify_grant};
//! # let (jwks, statement) = ("{\"keys\":[]}", "");
//! let keys = PublicKeys::from_jwks(jwks).unwrap(); // GET /.well-known/jwks.json, or `oncegate keys export`
//! let params = r#"{"amount":100,"currency":"EUR","to":"DE89"}"#;
//! match verify_grant(&keys, statement, params, &["/amount", "/currency", "/to"], "bank") {
//!     Ok(grant) => assert!(grant.fencing > 0), // refuse it if lower than the last one seen
//!     Err(refused) => eprintln!("refused ({}): {refused}", refused.kind()),
//! }
//! ```

use std::time::{SystemTime, UNIX_EPOCH};

pub use oncegate_domain::statement::{
    PublicKeys, StatementError,
    grant::{GrantCheck, GrantClaims},
};
use oncegate_domain::{fingerprint::KeyFields, statement::grant};

/// Verifies a grant statement now (this machine's clock): signature by one of `keys`, type, not
/// expired, meant for `audience`, and `params_json` has the fingerprint it vouches for under
/// `key_fields` (the action policy's JSON Pointers; empty: every param counts). Returns what it
/// says, `fencing` included.
pub fn verify_grant(
    keys: &PublicKeys,
    statement: &str,
    params_json: &str,
    key_fields: &[&str],
    audience: &str,
) -> Result<GrantClaims, StatementError> {
    let key_fields = match key_fields {
        [] => KeyFields::All,
        pointers => KeyFields::Pointers(pointers.iter().map(|p| (*p).to_owned()).collect()),
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    grant::verify_grant(
        keys,
        statement,
        &GrantCheck {
            audience,
            params_json,
            key_fields: &key_fields,
            issuer: None,
            now,
        },
    )
}
