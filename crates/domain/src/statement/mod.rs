//! Signed statements: what the gate vouches for, in a form anyone holding its public keys can check
//! offline. A statement is a JWS in compact serialization (RFC 7515) signed with EdDSA over Ed25519
//! (RFC 8037): `base64url(header) . base64url(claims) . base64url(signature)`, header
//! `{"alg":"EdDSA","kid":…,"typ":…}`. Two kinds, told apart by `typ` (RFC 8725 explicit typing), so
//! one can never be passed off as the other: grants ([`grant`]) and receipts ([`receipt`]).
//!
//! Owns: the envelope (encode, parse, verify), key ids (RFC 7638 JWK thumbprints), the public key
//! set and its JWKS form ([`PublicKeys`]). Pure: keys are given, time is given; generating and
//! loading keys is the gate's and the configuration's.

pub mod grant;
pub mod receipt;

use std::{collections::BTreeMap, sync::Arc};

use aws_lc_rs::signature::Ed25519KeyPair;
use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD as B64};
use ed25519_dalek::{Signature, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// Why a statement was refused. The names ([`StatementError::kind`]) are shared with the Python
/// and TypeScript verifiers and the vectors in `tests/vectors/statements.json`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StatementError {
    /// Not three base64url parts, or a header or claims that are not the expected JSON.
    #[error("malformed statement: {0}")]
    Malformed(String),
    /// `typ` is not the kind of statement asked for, or `alg` is not EdDSA.
    #[error("wrong statement type: {0}")]
    WrongType(String),
    /// No key of the given set has the statement's `kid` (never had it, or it was removed).
    #[error("unknown key id {0:?}")]
    UnknownKey(String),
    /// The signature does not verify with the key its `kid` names: the statement was altered or
    /// not made by the gate.
    #[error("bad signature")]
    BadSignature,
    /// The statement's `exp` has passed.
    #[error("expired at {exp} (now {now})")]
    Expired { exp: i64, now: i64 },
    /// The statement is meant for another audience.
    #[error("audience is {found:?}, not {expected:?}")]
    WrongAudience { expected: String, found: String },
    /// The statement's issuer is not the expected one.
    #[error("issuer is {found:?}, not {expected:?}")]
    WrongIssuer { expected: String, found: String },
    /// The params given do not have the fingerprint the statement vouches for.
    #[error("params do not match: fingerprint {found} is not the granted {expected}")]
    FingerprintMismatch { expected: String, found: String },
    /// The params given cannot be fingerprinted (not a JSON object, an inexact number...).
    #[error("params refused: {0}")]
    BadParams(String),
}

impl StatementError {
    /// The short name every client uses for this refusal (`bad_signature`, `expired`...).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Malformed(_) => "malformed",
            Self::WrongType(_) => "wrong_type",
            Self::UnknownKey(_) => "unknown_key",
            Self::BadSignature => "bad_signature",
            Self::Expired { .. } => "expired",
            Self::WrongAudience { .. } => "wrong_audience",
            Self::WrongIssuer { .. } => "wrong_issuer",
            Self::FingerprintMismatch { .. } => "fingerprint_mismatch",
            Self::BadParams(_) => "bad_params",
        }
    }
}

/// The JOSE header of every statement. Field order is alphabetical, as most JOSE libraries write
/// it, so the same claims signed here and elsewhere give the same bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Header {
    alg: String,
    kid: String,
    typ: String,
}

/// The RFC 7638 thumbprint of an Ed25519 public key: base64url(SHA-256 of
/// `{"crv":"Ed25519","kty":"OKP","x":"<key>"}`). Used as the key id, so every replica given the
/// same key file names it the same way, with nothing to configure.
pub fn key_id(public: &VerifyingKey) -> String {
    let jwk = format!(
        r#"{{"crv":"Ed25519","kty":"OKP","x":"{}"}}"#,
        B64.encode(public.as_bytes())
    );
    B64.encode(Sha256::digest(jwk.as_bytes()))
}

/// A private key that signs statements, with its key id.
#[derive(Clone)]
pub struct StatementKey {
    kid: String,
    key: SigningKey,
    /// The same key in aws-lc, which signs: the same bytes as `key` (Ed25519 signatures are
    /// deterministic, RFC 8032 §5.1.6), in about half the time; its scalar and nonce prefix are
    /// derived once, not at every signature.
    signing: Arc<Ed25519KeyPair>,
    verifying: VerifyingKey,
}

impl std::fmt::Debug for StatementKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatementKey")
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

impl StatementKey {
    /// The key of a 32-byte Ed25519 seed.
    pub fn from_seed(seed: &[u8; 32]) -> Self {
        Self::new(SigningKey::from_bytes(seed))
    }

    /// Wraps an Ed25519 signing key; the key id is its thumbprint.
    pub fn new(key: SigningKey) -> Self {
        let verifying = key.verifying_key();
        let signing =
            Ed25519KeyPair::from_seed_and_public_key(key.as_bytes(), verifying.as_bytes())
                .expect("aws-lc takes every 32-byte Ed25519 seed with its own public key");
        Self {
            kid: key_id(&verifying),
            signing: Arc::new(signing),
            key,
            verifying,
        }
    }

    /// The key id (`kid`) statements signed with this key carry.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The public half.
    pub fn public(&self) -> VerifyingKey {
        self.verifying
    }

    /// The signing key itself (to write it to a file).
    pub fn signing_key(&self) -> &SigningKey {
        &self.key
    }

    /// Signs `claims` as a statement of type `typ`: one Ed25519 signature (RFC 8032; aws-lc's,
    /// the same bytes [`SigningKey::sign`] gives), nothing batched.
    pub fn sign<C: Serialize>(&self, typ: &str, claims: &C) -> String {
        let header = Header {
            alg: "EdDSA".into(),
            kid: self.kid.clone(),
            typ: typ.into(),
        };
        // Serializing plain structs of strings and integers cannot fail.
        let header = serde_json::to_vec(&header).expect("a header serializes");
        let claims = serde_json::to_vec(claims).expect("claims serialize");
        let mut out = String::with_capacity(header.len() * 4 / 3 + claims.len() * 4 / 3 + 90);
        B64.encode_string(&header, &mut out);
        out.push('.');
        B64.encode_string(&claims, &mut out);
        let signature = self.signing.sign(out.as_bytes());
        out.push('.');
        B64.encode_string(signature.as_ref(), &mut out);
        out
    }
}

/// The public keys statements are checked against: key id → key. A key that is not in the set is
/// refused, whatever it signed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublicKeys {
    keys: BTreeMap<String, VerifyingKey>,
}

impl PublicKeys {
    /// A set of keys, each named by its thumbprint.
    pub fn new(keys: impl IntoIterator<Item = VerifyingKey>) -> Self {
        Self {
            keys: keys.into_iter().map(|k| (key_id(&k), k)).collect(),
        }
    }

    /// The key ids in the set.
    pub fn kids(&self) -> impl Iterator<Item = &str> {
        self.keys.keys().map(String::as_str)
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The set as a JWKS document (RFC 7517, OKP keys of RFC 8037), the form clients load.
    pub fn to_jwks(&self) -> Value {
        let keys: Vec<Value> = self
            .keys
            .iter()
            .map(|(kid, key)| {
                json!({"kty": "OKP", "crv": "Ed25519", "x": B64.encode(key.as_bytes()),
                       "kid": kid, "alg": "EdDSA", "use": "sig"})
            })
            .collect();
        json!({ "keys": keys })
    }

    /// Reads a JWKS document; keys other than Ed25519 `OKP` keys are skipped, and a key whose
    /// `kid` is not its thumbprint is refused (a key id must name exactly one key).
    pub fn from_jwks(text: &str) -> Result<Self, String> {
        let doc: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let entries = doc["keys"]
            .as_array()
            .ok_or("a JWKS document has a \"keys\" array")?;
        let mut keys = BTreeMap::new();
        for entry in entries {
            if entry["kty"] != "OKP" || entry["crv"] != "Ed25519" {
                continue;
            }
            let x = entry["x"].as_str().ok_or("an OKP key without \"x\"")?;
            let bytes: [u8; 32] = B64
                .decode(x)
                .ok()
                .and_then(|b| b.try_into().ok())
                .ok_or("\"x\" is not a base64url Ed25519 key")?;
            let key = VerifyingKey::from_bytes(&bytes).map_err(|e| format!("bad key: {e}"))?;
            let kid = key_id(&key);
            if let Some(given) = entry["kid"].as_str()
                && given != kid
            {
                return Err(format!("kid {given:?} is not the key's thumbprint {kid:?}"));
            }
            keys.insert(kid, key);
        }
        Ok(Self { keys })
    }

    /// Verifies a statement of type `typ` and returns its header's key id and its claims. Checks
    /// the envelope and the signature only; the caller checks what the claims say.
    pub fn verify<C: DeserializeOwned>(
        &self,
        typ: &str,
        statement: &str,
    ) -> Result<(String, C), StatementError> {
        let malformed = |what: &str| StatementError::Malformed(what.into());
        let mut parts = statement.split('.');
        let (Some(header_b64), Some(claims_b64), Some(signature_b64), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(malformed("not three dot-separated parts"));
        };
        let header: Header = B64
            .decode(header_b64)
            .ok()
            .and_then(|h| serde_json::from_slice(&h).ok())
            .ok_or_else(|| malformed("the header is not base64url JSON"))?;
        if header.alg != "EdDSA" {
            return Err(StatementError::WrongType(format!("alg {:?}", header.alg)));
        }
        if header.typ != typ {
            return Err(StatementError::WrongType(format!(
                "typ {:?}, expected {typ:?}",
                header.typ
            )));
        }
        let key = self
            .keys
            .get(&header.kid)
            .ok_or_else(|| StatementError::UnknownKey(header.kid.clone()))?;
        let signature: [u8; 64] = B64
            .decode(signature_b64)
            .ok()
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| malformed("the signature is not 64 base64url bytes"))?;
        let signed = &statement[..header_b64.len() + 1 + claims_b64.len()];
        key.verify_strict(signed.as_bytes(), &Signature::from_bytes(&signature))
            .map_err(|_| StatementError::BadSignature)?;
        let claims = B64
            .decode(claims_b64)
            .map_err(|_| malformed("the claims are not base64url"))?;
        let claims = serde_json::from_slice(&claims)
            .map_err(|e| StatementError::Malformed(format!("claims: {e}")))?;
        Ok((header.kid, claims))
    }
}

/// The claims of a statement, without checking anything (to show what a refused statement says).
pub fn unverified_claims(statement: &str) -> Option<Value> {
    let claims = statement.split('.').nth(1)?;
    serde_json::from_slice(&B64.decode(claims).ok()?).ok()
}

#[cfg(test)]
mod tests;
