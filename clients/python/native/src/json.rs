//! The guard's default receipt encoder, `oncegate.models.json_encode` (compact JSON, keys sorted,
//! `ensure_ascii=False`, UTF-8), for the values it meets most: `None`, `bool`, `int`, `float`,
//! `str`, `list`, `tuple` and `dict` with `str` keys, each of exactly that type. Anything else (a
//! subclass, a `Decimal`, a dataclass, a string that is not valid Unicode, nesting deeper than
//! [`DEPTH`]) makes it answer `None`, and the caller encodes the whole value with the Python
//! encoder instead: the bytes are the same either way, and what the Python encoder refuses is
//! refused as before. In Python that encoding is about 10k instructions for `{"ok": true}`, as
//! much as a sixth of a guarded call.

use std::fmt::Write as _;

use pyo3::{
    prelude::*,
    types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple},
};

/// Containers deeper than this go to the Python encoder (which also detects cycles).
const DEPTH: usize = 64;

/// `json_encode(value)`'s bytes, or `None` where the Python encoder must decide.
pub fn encode(value: &Bound<'_, PyAny>) -> Option<Vec<u8>> {
    let mut out = String::with_capacity(64);
    write(value, &mut out, 0).then(|| out.into_bytes())
}

/// Test hook: what [`encode`] makes of `value` (`None` where it defers to Python).
#[pyfunction]
pub fn receipt_json(value: &Bound<'_, PyAny>) -> Option<Vec<u8>> {
    encode(value)
}

fn write(value: &Bound<'_, PyAny>, out: &mut String, depth: usize) -> bool {
    if value.is_none() {
        out.push_str("null");
    } else if let Ok(flag) = value.cast_exact::<PyBool>() {
        out.push_str(if flag.is_true() { "true" } else { "false" });
    } else if let Ok(int) = value.cast_exact::<PyInt>() {
        let Ok(int) = int.extract::<i64>() else {
            return false; // beyond 64 bits: Python's repr
        };
        let _ = write!(out, "{int}");
    } else if let Ok(float) = value.cast_exact::<PyFloat>() {
        let number = float.value();
        if number.is_nan() {
            out.push_str("NaN");
        } else if number.is_infinite() {
            out.push_str(if number > 0.0 {
                "Infinity"
            } else {
                "-Infinity"
            });
        } else {
            // float.__repr__, as the encoder writes a finite float.
            let Ok(repr) = float.repr() else {
                return false;
            };
            out.push_str(&repr.to_string_lossy());
        }
    } else if let Ok(text) = value.cast_exact::<PyString>() {
        let Ok(text) = text.to_str() else {
            return false; // a lone surrogate: Python's encoder, then its UTF-8, refuses it
        };
        string(text, out);
    } else if depth >= DEPTH {
        return false;
    } else if let Ok(list) = value.cast_exact::<PyList>() {
        return sequence(list.iter(), out, depth);
    } else if let Ok(tuple) = value.cast_exact::<PyTuple>() {
        return sequence(tuple.iter(), out, depth);
    } else if let Ok(dict) = value.cast_exact::<PyDict>() {
        let mut items = Vec::with_capacity(dict.len());
        for (key, item) in dict.iter() {
            let Ok(key) = key.cast_exact::<PyString>() else {
                return false; // the Python encoder converts (or refuses) other keys
            };
            let Ok(key) = key.to_str() else {
                return false;
            };
            items.push((key.to_owned(), item));
        }
        // sort_keys: by code point, which is UTF-8's byte order.
        items.sort_by(|a, b| a.0.cmp(&b.0));
        out.push('{');
        for (i, (key, item)) in items.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            string(key, out);
            out.push(':');
            if !write(item, out, depth + 1) {
                return false;
            }
        }
        out.push('}');
    } else {
        return false;
    }
    true
}

fn sequence<'py>(
    items: impl Iterator<Item = Bound<'py, PyAny>>,
    out: &mut String,
    depth: usize,
) -> bool {
    out.push('[');
    for (i, item) in items.enumerate() {
        if i > 0 {
            out.push(',');
        }
        if !write(&item, out, depth + 1) {
            return false;
        }
    }
    out.push(']');
    true
}

/// A JSON string as Python's `encode_basestring` writes it (`ensure_ascii=False`): `"` and `\`
/// escaped, `\n \r \t \b \f` by name, every other character below U+0020 as `\u00xx`.
fn string(text: &str, out: &mut String) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if c < ' ' => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}
