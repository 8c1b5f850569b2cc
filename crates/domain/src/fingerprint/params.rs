//! Strict params parsing: one pass that refuses duplicate members, nesting beyond the limit and
//! integers beyond ±2^53, then (only when the params hold a fraction or an exponent) a check of
//! those literals ([`super::numbers`]), so that RFC 8785 canonicalises what was sent. Every number
//! refused is named by its JSON Pointer.

use std::{
    cell::{Cell, RefCell},
    fmt,
};

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

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
        "params hold a number at {}, beyond 2^53 in magnitude, which a double cannot hold \
         exactly; send it as a string",
        at(pointer)
    )]
    UnsafeNumber {
        /// The JSON Pointer of the number (empty: the params text is that number).
        pointer: String,
    },
    #[error(
        "params hold the number {literal} at {pointer}, which a double cannot hold: it would be \
         read as {nearest}; send it as a string, or rounded to what a double holds"
    )]
    InexactNumber {
        /// The JSON Pointer of the number.
        pointer: String,
        /// The literal as sent (its first 40 characters).
        literal: String,
        /// The double it would be read as, in its shortest form.
        nearest: String,
    },
}

/// Where a refused number sits, for the message: its pointer, or the top level.
fn at(pointer: &str) -> String {
    if pointer.is_empty() {
        "the top level".to_owned()
    } else {
        pointer.to_owned()
    }
}

/// Parses params text into a JSON object, refusing what RFC 8785 cannot canonicalise faithfully.
pub fn parse_params(text: &str, limits: ParamsLimits) -> Result<Map<String, Value>, ParamsError> {
    if text.len() > limits.max_bytes {
        return Err(ParamsError::TooLarge(text.len(), limits.max_bytes));
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let fractions = Cell::new(false);
    // The path to the value being read. A value that fails leaves its own path here (nothing is
    // popped on the way out of an error), so a number serde_json itself refuses (beyond the
    // double range) is named as well as one the visitor refuses.
    let path = RefCell::new(Vec::new());
    let classify = |e| classify(e, &path.borrow());
    let value = StrictValue {
        depth: 0,
        max_depth: limits.max_depth,
        fractions: &fractions,
        path: &path,
    }
    .deserialize(&mut de)
    .map_err(classify)?;
    de.end().map_err(classify)?;
    let Value::Object(map) = value else {
        return Err(ParamsError::NotAnObject);
    };
    if fractions.get() {
        super::numbers::check_literals(text)?;
    }
    Ok(map)
}

/// Our own errors travel through serde as custom messages; this recovers them. `path` is where
/// the parse stopped.
fn classify(err: serde_json::Error, path: &[String]) -> ParamsError {
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
        return ParamsError::UnsafeNumber {
            pointer: path.iter().map(|segment| format!("/{segment}")).collect(),
        };
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

/// A `serde_json::Value` builder that checks duplicates, depth and number range in one pass, and
/// notes whether any number had a fraction or an exponent.
struct StrictValue<'a> {
    depth: usize,
    max_depth: usize,
    fractions: &'a Cell<bool>,
    /// The reference tokens (escaped) of the value being read.
    path: &'a RefCell<Vec<String>>,
}

impl StrictValue<'_> {
    fn nested(&self) -> Self {
        Self {
            depth: self.depth + 1,
            max_depth: self.max_depth,
            fractions: self.fractions,
            path: self.path,
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

impl<'de> DeserializeSeed<'de> for StrictValue<'_> {
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

impl<'de> Visitor<'de> for StrictValue<'_> {
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
        self.fractions.set(true);
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
        loop {
            self.path.borrow_mut().push(items.len().to_string());
            let Some(item) = seq.next_element_seed(self.nested())? else {
                self.path.borrow_mut().pop();
                break;
            };
            self.path.borrow_mut().pop();
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
            self.path.borrow_mut().push(super::escape_segment(&name));
            let value = map.next_value_seed(self.nested())?;
            self.path.borrow_mut().pop();
            members.insert(name, value);
        }
        Ok(Value::Object(members))
    }
}
