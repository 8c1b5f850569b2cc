//! Params → key fields → RFC 8785 (JCS) → SHA-256 → `v1-…`, and the per-field digests that let a
//! conflict name which key fields differ without ever storing or showing their values.
//!
//! Owns: parsing params strictly (no duplicate members, no number a double cannot hold exactly,
//! bounded nesting), key-field selection by JSON Pointer, the fingerprint format. Does no IO and
//! knows nothing of stores or gRPC.

use std::{collections::BTreeMap, fmt};

use base64::Engine as _;
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// The version tag of the canonical form. Changing the canonical form means a new tag, so old keys
/// never silently change meaning.
pub const VERSION_TAG: &str = "v1";

/// Largest integer magnitude accepted: beyond 2^53 a double no longer holds every integer, so two
/// different amounts could share one fingerprint. Numbers with a fraction or exponent must stay
/// below 2^53 in magnitude.
pub const MAX_SAFE_INTEGER: u64 = 1 << 53;

/// Limits applied while parsing params; the defaults are the contract's (docs/CONTRACT.md).
#[derive(Debug, Clone, Copy)]
pub struct ParamsLimits {
    /// Largest accepted params text, in bytes.
    pub max_bytes: usize,
    /// Deepest accepted nesting of arrays and objects (the top-level object is depth 1).
    pub max_depth: usize,
}

impl Default for ParamsLimits {
    fn default() -> Self {
        Self {
            max_bytes: 64 * 1024,
            max_depth: 32,
        }
    }
}

/// Why params were refused. Every variant is the client's mistake.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamsError {
    #[error("params are {0} bytes, more than the limit of {1}")]
    TooLarge(usize, usize),
    #[error("params are not valid JSON: {0}")]
    Syntax(String),
    #[error("params must be a JSON object")]
    NotAnObject,
    #[error("params nest deeper than {0} levels")]
    TooDeep(usize),
    #[error("params repeat the member name {0:?}")]
    DuplicateMember(String),
    #[error(
        "params hold a number beyond 2^53 in magnitude, which JSON doubles cannot represent exactly"
    )]
    UnsafeNumber,
}

/// Parses params text into a JSON object, refusing what RFC 8785 cannot canonicalise faithfully.
pub fn parse_params(text: &str, limits: ParamsLimits) -> Result<Map<String, Value>, ParamsError> {
    if text.len() > limits.max_bytes {
        return Err(ParamsError::TooLarge(text.len(), limits.max_bytes));
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let value = StrictValue {
        depth: 0,
        max_depth: limits.max_depth,
    }
    .deserialize(&mut de)
    .map_err(classify)?;
    de.end().map_err(classify)?;
    match value {
        Value::Object(map) => Ok(map),
        _ => Err(ParamsError::NotAnObject),
    }
}

/// Our own errors travel through serde as custom messages; this recovers them.
fn classify(err: serde_json::Error) -> ParamsError {
    let msg = err.to_string();
    if let Some(rest) = msg.strip_prefix(DUPLICATE_PREFIX) {
        let name = rest.split(SEPARATOR).next().unwrap_or_default();
        return ParamsError::DuplicateMember(name.to_owned());
    }
    if let Some(rest) = msg.strip_prefix(TOO_DEEP_PREFIX) {
        let depth = rest.split(SEPARATOR).next().unwrap_or_default();
        return ParamsError::TooDeep(depth.parse().unwrap_or(0));
    }
    if msg.starts_with(UNSAFE_NUMBER) || msg.starts_with("number out of range") {
        return ParamsError::UnsafeNumber;
    }
    if msg.starts_with("recursion limit exceeded") {
        return ParamsError::TooDeep(0);
    }
    ParamsError::Syntax(msg)
}

const DUPLICATE_PREFIX: &str = "oncegate-duplicate:";
const TOO_DEEP_PREFIX: &str = "oncegate-too-deep:";
const UNSAFE_NUMBER: &str = "oncegate-unsafe-number";
const SEPARATOR: char = '\u{0}';

/// A `serde_json::Value` builder that checks duplicates, depth and number range in one pass.
struct StrictValue {
    depth: usize,
    max_depth: usize,
}

impl StrictValue {
    fn nested(&self) -> Self {
        Self {
            depth: self.depth + 1,
            max_depth: self.max_depth,
        }
    }

    fn enter<E: de::Error>(&self) -> Result<(), E> {
        if self.depth + 1 > self.max_depth {
            return Err(E::custom(format!(
                "{TOO_DEEP_PREFIX}{}{SEPARATOR}",
                self.max_depth
            )));
        }
        Ok(())
    }
}

impl<'de> DeserializeSeed<'de> for StrictValue {
    type Value = Value;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

/// Integers are exact up to and including 2^53.
fn checked_integer<E: de::Error>(magnitude: u64, value: Value) -> Result<Value, E> {
    if magnitude > MAX_SAFE_INTEGER {
        return Err(E::custom(UNSAFE_NUMBER));
    }
    Ok(value)
}

impl<'de> Visitor<'de> for StrictValue {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        checked_integer(v.unsigned_abs(), Value::from(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        checked_integer(v, Value::from(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        let value = serde_json::Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom(UNSAFE_NUMBER))?;
        // From 2^53 on every double is an integer, and the literal may have been rounded to it
        // (9007199254740993.0 parses to 2^53): refuse rather than fingerprint a different number.
        if v.abs() >= MAX_SAFE_INTEGER as f64 {
            return Err(E::custom(UNSAFE_NUMBER));
        }
        Ok(value)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        self.enter()?;
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self.nested())? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        self.enter()?;
        let mut members = Map::new();
        while let Some(name) = map.next_key::<String>()? {
            if members.contains_key(&name) {
                return Err(de::Error::custom(format!(
                    "{DUPLICATE_PREFIX}{name}{SEPARATOR}"
                )));
            }
            let value = map.next_value_seed(self.nested())?;
            members.insert(name, value);
        }
        Ok(Value::Object(members))
    }
}

/// What counts as the key fields of an action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyFields {
    /// Every param counts (the default when no policy names key fields).
    All,
    /// Only the params at these JSON Pointers count; an absent pointer contributes `null`.
    Pointers(Vec<String>),
}

/// The selected key fields of one request: path → value, in a stable order.
///
/// With [`KeyFields::All`] the paths are the top-level members as JSON Pointers (`/amount`).
#[derive(Debug, Clone, PartialEq)]
pub struct Selection {
    fields: BTreeMap<String, Value>,
    all: Option<Value>,
}

/// Picks the key fields out of parsed params.
pub fn select(params: &Map<String, Value>, key_fields: &KeyFields) -> Selection {
    match key_fields {
        KeyFields::All => Selection {
            fields: params
                .iter()
                .map(|(name, value)| (pointer_for_member(name), value.clone()))
                .collect(),
            all: Some(Value::Object(params.clone())),
        },
        KeyFields::Pointers(pointers) => {
            let root = Value::Object(params.clone());
            Selection {
                fields: pointers
                    .iter()
                    .map(|p| (p.clone(), root.pointer(p).cloned().unwrap_or(Value::Null)))
                    .collect(),
                all: None,
            }
        }
    }
}

/// Escapes a member name as one JSON Pointer reference token (RFC 6901).
fn pointer_for_member(name: &str) -> String {
    format!("/{}", name.replace('~', "~0").replace('/', "~1"))
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
    match &selection.all {
        Some(all) => write_jcs(&mut out, all),
        None => write_jcs(&mut out, &selection.fields),
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
    for (path, value) in &selection.fields {
        let canonical =
            serde_json_canonicalizer::to_string(value).expect("canonicalising a finite JSON value");
        push(path, &canonical);
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
mod tests {
    use super::*;

    fn fp(action: &str, params: &str, intent: &str, key_fields: &KeyFields) -> String {
        let params = parse_params(params, ParamsLimits::default()).unwrap();
        fingerprint(action, intent, &select(&params, key_fields))
    }

    #[test]
    fn key_order_whitespace_and_number_spelling_do_not_matter() {
        let a = fp("pay", r#"{"amount":1,"to":"x"}"#, "", &KeyFields::All);
        let b = fp(
            "pay",
            "{ \"to\" : \"x\",\n \"amount\" : 1.0 }",
            "",
            &KeyFields::All,
        );
        let c = fp("pay", r#"{"to":"x","amount":1e0}"#, "", &KeyFields::All);
        assert_eq!(a, b);
        assert_eq!(a, c);
        assert!(a.starts_with("v1-") && a.len() == 3 + 64);
    }

    #[test]
    fn action_intent_and_values_change_the_fingerprint() {
        let base = fp("pay", r#"{"amount":1}"#, "", &KeyFields::All);
        assert_ne!(base, fp("refund", r#"{"amount":1}"#, "", &KeyFields::All));
        assert_ne!(base, fp("pay", r#"{"amount":2}"#, "", &KeyFields::All));
        assert_ne!(base, fp("pay", r#"{"amount":1}"#, "i-1", &KeyFields::All));
    }

    #[test]
    fn canonical_form_matches_a_hand_written_jcs_document() {
        let params = parse_params(r#"{"b":[1,2.5,-0],"a":"é"}"#, ParamsLimits::default()).unwrap();
        let form = canonical_form("pay", "", &select(&params, &KeyFields::All));
        assert_eq!(
            form,
            r#"{"action":"pay","intent":null,"params":{"a":"é","b":[1,2.5,0]}}"#
        );
    }

    /// The reference: canonicalise the whole document at once.
    fn whole_document(action: &str, intent: &str, selection: &Selection) -> String {
        let params = match &selection.all {
            Some(all) => all.clone(),
            None => serde_json::to_value(&selection.fields).unwrap(),
        };
        let intent = if intent.is_empty() {
            Value::Null
        } else {
            Value::String(intent.to_owned())
        };
        let doc = serde_json::json!({"action": action, "intent": intent, "params": params});
        serde_json_canonicalizer::to_string(&doc).unwrap()
    }

    fn json_value() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (-(1i64 << 53)..(1i64 << 53)).prop_map(Value::from),
            (-1e15f64..1e15).prop_map(Value::from),
            r#"[a-zé€😀\\"\n\x7f/~]{0,6}"#.prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map("[a-z€😀/~\r]{0,4}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        #[test]
        fn member_by_member_equals_the_whole_document(
            params in proptest::collection::btree_map("[a-z€😀/~\r]{0,4}", json_value(), 0..5),
            action in r#"[a-z.é"]{1,8}"#,
            intent in r"[a-z\\]{0,3}",
            pointers in proptest::collection::vec("/[a-z€/~]{0,4}", 0..3),
        ) {
            let params: Map<String, Value> = params.into_iter().collect();
            for key_fields in [KeyFields::All, KeyFields::Pointers(pointers.clone())] {
                let selection = select(&params, &key_fields);
                proptest::prop_assert_eq!(
                    canonical_form(&action, &intent, &selection),
                    whole_document(&action, &intent, &selection)
                );
            }
        }
    }

    #[test]
    fn rfc8785_number_examples_serialise_as_published() {
        // RFC 8785 appendix B: IEEE-754 values and their canonical text.
        for (input, expected) in [
            ("1e+30", "1e+30"),
            ("4.50", "4.5"),
            ("0.002", "0.002"),
            ("1E-7", "1e-7"),
            ("333333333.33333329", "333333333.3333333"),
            ("-0", "0"),
            ("9007199254740992", "9007199254740992"),
            ("295147905179352830000", "295147905179352830000"),
        ] {
            let value: Value = serde_json::from_str(input).unwrap();
            assert_eq!(
                serde_json_canonicalizer::to_string(&value).unwrap(),
                expected,
                "{input}"
            );
        }
    }

    #[test]
    fn rfc8785_sorts_members_by_utf16_code_units() {
        // RFC 8785 section 3.2.3's sorting example.
        let input = r#"{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew Letter Dalet With Dagesh","1":"One","\ud83d\ude00":"Emoji: Grinning Face","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis"}"#;
        let value: Value = serde_json::from_str(input).unwrap();
        let out = serde_json_canonicalizer::to_string(&value).unwrap();
        let order: Vec<&str> = out
            .split("\":\"")
            .skip(1)
            .map(|s| s.split('"').next().unwrap())
            .collect();
        assert_eq!(
            order,
            [
                "Carriage Return",
                "One",
                "Control",
                "Latin Small Letter O With Diaeresis",
                "Euro Sign",
                "Emoji: Grinning Face",
                "Hebrew Letter Dalet With Dagesh"
            ]
        );
    }

    #[test]
    fn policy_pointers_select_fields_and_absent_ones_are_null() {
        let kf = KeyFields::Pointers(vec!["/amount".into(), "/to/iban".into()]);
        let a = fp(
            "pay",
            r#"{"amount":5,"to":{"iban":"X"},"memo":"hi"}"#,
            "",
            &kf,
        );
        let b = fp(
            "pay",
            r#"{"memo":"rewritten","to":{"iban":"X"},"amount":5}"#,
            "",
            &kf,
        );
        assert_eq!(a, b, "a non-key field does not change the fingerprint");
        let params = parse_params(r#"{"amount":5}"#, ParamsLimits::default()).unwrap();
        let form = canonical_form("pay", "", &select(&params, &kf));
        assert_eq!(
            form,
            r#"{"action":"pay","intent":null,"params":{"/amount":5,"/to/iban":null}}"#
        );
    }

    #[test]
    fn refuses_what_jcs_cannot_represent() {
        let limits = ParamsLimits::default();
        assert_eq!(
            parse_params(r#"{"a":1,"a":2}"#, limits),
            Err(ParamsError::DuplicateMember("a".into()))
        );
        assert_eq!(
            parse_params(r#"{"a":9007199254740993}"#, limits),
            Err(ParamsError::UnsafeNumber)
        );
        assert_eq!(
            parse_params(r#"{"a":-18446744073709551616}"#, limits),
            Err(ParamsError::UnsafeNumber)
        );
        assert!(parse_params(r#"{"a":9007199254740992}"#, limits).is_ok());
        assert!(parse_params(r#"{"a":-9007199254740992}"#, limits).is_ok());
        assert_eq!(
            parse_params(r#"{"a":9007199254740993.0}"#, limits),
            Err(ParamsError::UnsafeNumber)
        );
        assert_eq!(
            parse_params(r#"{"a":1e300}"#, limits),
            Err(ParamsError::UnsafeNumber)
        );
        assert!(parse_params(r#"{"a":1.5e15}"#, limits).is_ok());
        assert_eq!(parse_params("[1]", limits), Err(ParamsError::NotAnObject));
        assert!(matches!(
            parse_params("{", limits),
            Err(ParamsError::Syntax(_))
        ));
        assert!(matches!(
            parse_params(r#"{"a":1} x"#, limits),
            Err(ParamsError::Syntax(_))
        ));
    }

    #[test]
    fn nesting_and_size_limits() {
        let limits = ParamsLimits {
            max_bytes: 64,
            max_depth: 3,
        };
        assert!(parse_params(r#"{"a":{"b":[1]}}"#, limits).is_ok());
        assert_eq!(
            parse_params(r#"{"a":{"b":[[1]]}}"#, limits),
            Err(ParamsError::TooDeep(3))
        );
        let big = format!(r#"{{"a":"{}"}}"#, "x".repeat(100));
        assert!(matches!(
            parse_params(&big, limits),
            Err(ParamsError::TooLarge(_, 64))
        ));
    }

    #[test]
    fn differing_fields_names_paths_not_values() {
        let params1 =
            parse_params(r#"{"amount":5,"to":"a","a/b":1}"#, ParamsLimits::default()).unwrap();
        let params2 =
            parse_params(r#"{"amount":6,"to":"a","new":1}"#, ParamsLimits::default()).unwrap();
        let d1 = field_digests("pay", "", &select(&params1, &KeyFields::All));
        let d2 = field_digests("pay", "", &select(&params2, &KeyFields::All));
        assert_eq!(differing_fields(&d1, &d2), ["/amount", "/a~1b", "/new"]);
        let d3 = field_digests("refund", "i", &select(&params1, &KeyFields::All));
        assert_eq!(differing_fields(&d1, &d3), ["action", "intent_id"]);
        assert!(!d1.contains("\"a\""), "digests never carry values");
    }
}
