//! Number literals that RFC 8785 would silently change. JCS writes a number as the shortest decimal
//! that reads back as the same double, so a literal whose decimal value differs from that form
//! (`0.100000000000000001` is written `0.1`, `1e-400` is written `0`) would share a fingerprint
//! with another amount. Such a literal is refused, naming where it is; `0.1`, `1.0`, `1e2`, `-0`
//! and every other literal that is its double's shortest form (up to notation) are accepted.

use super::ParamsError;

/// Checks every number literal with a fraction or an exponent in `text` (valid JSON, already
/// parsed). Integers are checked while parsing (they must stay within ±2^53).
pub(super) fn check_literals(text: &str) -> Result<(), ParamsError> {
    let bytes = text.as_bytes();
    let mut path: Vec<Segment> = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'{' => path.push(Segment::Member {
                name: None,
                expect_name: true,
            }),
            b'[' => path.push(Segment::Index(0)),
            b'}' | b']' => {
                path.pop();
            }
            b',' => match path.last_mut() {
                Some(Segment::Member { expect_name, .. }) => *expect_name = true,
                Some(Segment::Index(index)) => *index += 1,
                None => {}
            },
            b':' => {
                if let Some(Segment::Member { expect_name, .. }) = path.last_mut() {
                    *expect_name = false;
                }
            }
            b'"' => {
                let end = string_end(bytes, i);
                if let Some(Segment::Member {
                    name,
                    expect_name: true,
                }) = path.last_mut()
                {
                    *name = serde_json::from_str(&text[i..=end]).ok();
                }
                i = end;
            }
            b'-' | b'0'..=b'9' => {
                let end = bytes[i..]
                    .iter()
                    .position(|b| !matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
                    .map_or(bytes.len(), |n| i + n);
                let literal = &text[i..end];
                if literal.contains(['.', 'e', 'E']) {
                    check(literal, &path)?;
                }
                i = end;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

/// Where a value sits, one level: an object member (its name, once read) or an array index.
enum Segment {
    Member {
        name: Option<String>,
        expect_name: bool,
    },
    Index(usize),
}

/// The index of the quote that closes the string opening at `start`.
fn string_end(bytes: &[u8], start: usize) -> usize {
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => return i,
            _ => i += 1,
        }
    }
    bytes.len() - 1
}

fn check(literal: &str, path: &[Segment]) -> Result<(), ParamsError> {
    let Ok(value) = literal.parse::<f64>() else {
        return Ok(()); // not a number this scanner understands; the parser already judged it
    };
    // The very form the canonical JSON will hold (ECMAScript's: of two shortest forms, the even
    // one), not merely some shortest form.
    let written = serde_json_canonicalizer::to_string(&value).ok();
    if written
        .as_deref()
        .is_some_and(|written| decimal(literal) == decimal(written))
    {
        return Ok(());
    }
    Err(ParamsError::InexactNumber {
        pointer: pointer(path),
        literal: literal.chars().take(40).collect(),
        nearest: written.unwrap_or_else(|| "infinity".into()),
    })
}

/// The JSON Pointer of the value `path` leads to.
fn pointer(path: &[Segment]) -> String {
    let mut out = String::new();
    for segment in path {
        out.push('/');
        match segment {
            Segment::Member { name, .. } => {
                out.push_str(&super::escape_segment(name.as_deref().unwrap_or_default()));
            }
            Segment::Index(index) => out.push_str(&index.to_string()),
        }
    }
    out
}

/// A decimal literal's exact value as (negative, significant digits, exponent), with zero as
/// `(false, "", 0)` whatever its sign or notation; `None` for an exponent beyond `i64`.
fn decimal(literal: &str) -> Option<(bool, String, i64)> {
    let (negative, unsigned) = match literal.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, literal),
    };
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(at) => (&unsigned[..at], &unsigned[at + 1..]),
        None => (unsigned, "0"),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{whole}{fraction}");
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Some((false, String::new(), 0));
    }
    let significant = digits.trim_end_matches('0');
    let trailing = (digits.len() - significant.len()) as i64;
    let exponent: i64 = exponent.trim_start_matches('+').parse().ok()?;
    let exponent = exponent
        .checked_sub(fraction.len() as i64)?
        .checked_add(trailing)?;
    Some((negative, significant.to_owned(), exponent))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(text: &str) -> Option<(String, String)> {
        match check_literals(text) {
            Ok(()) => None,
            Err(ParamsError::InexactNumber {
                pointer, nearest, ..
            }) => Some((pointer, nearest)),
            Err(other) => panic!("{other:?}"),
        }
    }

    #[test]
    fn what_a_double_holds_is_accepted() {
        for text in [
            r#"{"a":1.0}"#,
            r#"{"a":1e2}"#,
            r#"{"a":0.1}"#,
            r#"{"a":-0}"#,
            r#"{"a":-0.0}"#,
            r#"{"a":0e-999999999999999999999}"#,
            r#"{"a":100.00000000000001}"#,
            r#"{"a":1.5E+300}"#,
            r#"{"a":[0.25,{"b":2.5e-3}]}"#,
            r#"{"a":579460800786596.2}"#,
            r#"{"a":"0.100000000000000001"}"#,
        ] {
            assert_eq!(refused(text), None, "{text}");
        }
    }

    #[test]
    fn a_literal_rounded_into_another_number_is_refused_where_it_is() {
        assert_eq!(
            refused(r#"{"amount":0.100000000000000001}"#),
            Some(("/amount".into(), "0.1".into()))
        );
        assert_eq!(
            refused(r#"{"x":"a,b:[","amount":1e-400}"#),
            Some(("/amount".into(), "0".into()))
        );
        assert_eq!(
            refused(r#"{"amount":100.00000000000002}"#),
            Some(("/amount".into(), "100.00000000000001".into()))
        );
        assert_eq!(
            refused(r#"{"a/b":{"c~":[1,2,0.30000000000000001]}}"#),
            Some(("/a~1b/c~0/2".into(), "0.3".into()))
        );
        assert_eq!(
            refused(r#"{"a":1e999}"#),
            Some(("/a".into(), "infinity".into()))
        );
        // Two shortest forms of one double (…596.25): only the one JCS writes (the even digit).
        assert_eq!(
            refused(r#"{"a":579460800786596.3}"#),
            Some(("/a".into(), "579460800786596.2".into()))
        );
    }
}
