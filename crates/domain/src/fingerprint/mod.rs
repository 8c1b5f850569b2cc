//! Params → key fields → RFC 8785 (JCS) → SHA-256 → `v1-…`, and the per-field digests that let a
//! conflict name which key fields differ without ever storing or showing their values.
//!
//! Owns: parsing params strictly (no duplicate members, no number a double cannot hold exactly,
//! bounded nesting), key-field selection by JSON Pointer, the fingerprint format. Does no IO and
//! knows nothing of stores or gRPC.

mod numbers;
mod params;

use std::collections::BTreeMap;

use base64::Engine as _;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

pub use params::{MAX_SAFE_INTEGER, ParamsError, ParamsLimits, parse_params};

/// The version tag of the canonical form. Changing the canonical form means a new tag, so old keys
/// never silently change meaning.
pub const VERSION_TAG: &str = "v1";

/// One reference token of a JSON Pointer (RFC 6901): `~` as `~0`, `/` as `~1`.
fn escape_segment(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

/// What counts as the key fields of an action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyFields {
    /// Every param counts (the default when no policy names key fields).
    All,
    /// Only the params at these JSON Pointers count; an absent pointer contributes `null`.
    Pointers(Vec<String>),
}

/// The selected key fields of one request, borrowed from the parsed params (nothing is copied).
#[derive(Debug, Clone, PartialEq)]
pub enum Selection<'a> {
    /// Every param counts: the whole params object (its fields are its top-level members, named
    /// by JSON Pointers such as `/amount` in [`field_digests`]).
    All(&'a Map<String, Value>),
    /// Each key-field pointer → its value (`null` when absent), in a stable order.
    Pointers(BTreeMap<&'a str, &'a Value>),
}

static NULL: Value = Value::Null;

/// Picks the key fields out of parsed params.
pub fn select<'a>(params: &'a Map<String, Value>, key_fields: &'a KeyFields) -> Selection<'a> {
    match key_fields {
        KeyFields::All => Selection::All(params),
        KeyFields::Pointers(pointers) => Selection::Pointers(
            pointers
                .iter()
                .map(|p| (p.as_str(), resolve(params, p).unwrap_or(&NULL)))
                .collect(),
        ),
    }
}

/// The value at JSON Pointer `pointer` (RFC 6901) inside `params`, without building a value of the
/// whole object: the first reference token names a member, the rest is [`Value::pointer`]'s.
fn resolve<'a>(params: &'a Map<String, Value>, pointer: &str) -> Option<&'a Value> {
    let rest = pointer.strip_prefix('/')?;
    let (first, tail) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, ""),
    };
    let member = first.replace("~1", "/").replace("~0", "~");
    params.get(&member)?.pointer(tail)
}

/// Escapes a member name as one JSON Pointer reference token (RFC 6901).
fn pointer_for_member(name: &str) -> String {
    format!("/{}", escape_segment(name))
}

/// The canonical JSON (RFC 8785) of `{"action", "intent", "params"}`.
///
/// Written member by member in JCS order (`action` < `intent` < `params`), each value by the
/// canonicaliser: the same bytes as canonicalising the whole document, without building it (and
/// copying the params into it) on every request.
pub fn canonical_form(action: &str, intent: &str, selection: &Selection) -> String {
    let mut out = Vec::with_capacity(128 + action.len() + intent.len());
    out.extend_from_slice(br#"{"action":"#);
    write_jcs(&mut out, &action);
    out.extend_from_slice(br#","intent":"#);
    if intent.is_empty() {
        out.extend_from_slice(b"null");
    } else {
        write_jcs(&mut out, &intent);
    }
    out.extend_from_slice(br#","params":"#);
    // The whole params object when every param counts, else each key-field pointer → its value.
    match selection {
        Selection::All(params) => write_jcs(&mut out, params),
        Selection::Pointers(fields) => write_jcs(&mut out, fields),
    }
    out.push(b'}');
    String::from_utf8(out).expect("the canonicaliser writes UTF-8")
}

fn write_jcs<S: serde::Serialize>(out: &mut Vec<u8>, value: &S) {
    // Serialising strings and values we parsed ourselves cannot fail: every number is finite.
    serde_json_canonicalizer::to_writer(value, out).expect("canonicalising a finite JSON value");
}

/// The fingerprint: `v1-` and the lowercase hex SHA-256 of the canonical form.
pub fn fingerprint(action: &str, intent: &str, selection: &Selection) -> String {
    let canonical = canonical_form(action, intent, selection);
    format!(
        "{VERSION_TAG}-{}",
        hex::encode(Sha256::digest(canonical.as_bytes()))
    )
}

/// Short digests of each key field (and of the action and intent), stored with an action that has
/// an idempotency key so that a conflicting retry can be told *which* fields differ, never their
/// values. Encoded as `name=<digest>` lines, sorted by name, where the digest is the first 48 bits
/// of the SHA-256 of the field's canonical JSON in base64url (8 characters): these only *name*
/// the differing fields (the fingerprint decides the conflict), and every byte is stored with
/// each idempotency-keyed record.
pub fn field_digests(action: &str, intent: &str, selection: &Selection) -> String {
    let mut out = String::new();
    let mut push = |name: &str, canonical: &str| {
        let digest = Sha256::digest(canonical.as_bytes());
        out.push_str(&escape_name(name));
        out.push('=');
        out.push_str(&base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&digest[..6]));
        out.push('\n');
    };
    push("action", action);
    push("intent_id", intent);
    let canonical =
        |value: &Value| serde_json_canonicalizer::to_string(value).expect("a finite JSON value");
    match selection {
        Selection::All(params) => {
            // In pointer order, as a map of pointers would be.
            let fields: BTreeMap<String, &Value> = params
                .iter()
                .map(|(name, value)| (pointer_for_member(name), value))
                .collect();
            for (path, value) in fields {
                push(&path, &canonical(value));
            }
        }
        Selection::Pointers(fields) => {
            for (path, value) in fields {
                push(path, &canonical(value));
            }
        }
    }
    out
}

/// Names never contain `=` or a newline once escaped, so the digest lines stay unambiguous.
fn escape_name(name: &str) -> String {
    name.replace('%', "%25")
        .replace('=', "%3D")
        .replace('\n', "%0A")
}

fn unescape_name(name: &str) -> String {
    name.replace("%0A", "\n")
        .replace("%3D", "=")
        .replace("%25", "%")
}

fn parse_digests(encoded: &str) -> BTreeMap<String, &str> {
    encoded
        .lines()
        .filter_map(|line| line.rsplit_once('='))
        .map(|(name, digest)| (unescape_name(name), digest))
        .collect()
}

/// The names whose digests differ between a stored request and a new one: key-field JSON
/// Pointers, plus `action` or `intent_id` when those changed. Sorted; never values.
pub fn differing_fields(stored: &str, new: &str) -> Vec<String> {
    let stored = parse_digests(stored);
    let new = parse_digests(new);
    let mut names: Vec<String> = stored
        .keys()
        .chain(new.keys())
        .filter(|name| stored.get(*name) != new.get(*name))
        .cloned()
        .collect();
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests;
