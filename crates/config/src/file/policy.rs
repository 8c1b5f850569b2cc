//! The policy tables of the configuration file, as written and resolved: `[defaults]`,
//! `[actions."<name>"]` and `[limits]` into the gate's [`ActionPolicy`]s and [`Limits`]; durations in
//! seconds; JSON Pointers checked.

use serde::Deserialize;

use super::error::FileError;
use oncegate_domain::{
    fingerprint::KeyFields,
    ledger::{Millis, OnExpiry},
};
use oncegate_gate::policy::{ActionPolicy, Limits};

/// A policy's lease is within `[limits]`.
pub(super) fn check_lease(
    at: &str,
    policy: &ActionPolicy,
    limits: &Limits,
) -> Result<(), FileError> {
    if policy.lease > limits.max_lease {
        return Err(FileError::new(format!(
            "{at}.lease_ttl_seconds is above limits.max_lease_ttl_seconds"
        )));
    }
    if policy.lease < limits.min_lease {
        return Err(FileError::new(format!(
            "{at}.lease_ttl_seconds is below limits.min_lease_ttl_seconds"
        )));
    }
    Ok(())
}

pub(super) fn limits(table: &LimitsTable) -> Result<Limits, FileError> {
    let builtin = Limits::default();
    Ok(Limits {
        max_params_bytes: table.max_params_bytes.unwrap_or(builtin.max_params_bytes),
        max_params_depth: table.max_params_depth.unwrap_or(builtin.max_params_depth),
        max_receipt_bytes: table.max_receipt_bytes.unwrap_or(builtin.max_receipt_bytes),
        max_id_bytes: table.max_id_bytes.unwrap_or(builtin.max_id_bytes),
        max_lease: match table.max_lease_ttl_seconds {
            Some(Seconds(s)) => seconds("limits.max_lease_ttl_seconds", s)?,
            None => builtin.max_lease,
        },
        min_lease: match table.min_lease_ttl_seconds {
            Some(Seconds(s)) => seconds("limits.min_lease_ttl_seconds", s)?,
            None => builtin.min_lease,
        },
        max_superseded_grants: table
            .max_superseded_grants
            .unwrap_or(builtin.max_superseded_grants),
    })
}

/// `[defaults]` and each `[actions."<name>"]`; unset entries fall back to `[defaults]`, then to the
/// built-in defaults.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PolicyTable {
    pub(super) key_fields: Option<Vec<String>>,
    lease_ttl_seconds: Option<Seconds>,
    retention_seconds: Option<Seconds>,
    sliding: Option<bool>,
    on_expiry: Option<OnExpiry>,
    durability_replicas: Option<u32>,
    audience: Option<String>,
    /// Shadow mode for this action alone.
    shadow: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LimitsTable {
    max_params_bytes: Option<usize>,
    max_params_depth: Option<usize>,
    max_receipt_bytes: Option<usize>,
    max_id_bytes: Option<usize>,
    max_lease_ttl_seconds: Option<Seconds>,
    min_lease_ttl_seconds: Option<Seconds>,
    max_superseded_grants: Option<usize>,
}

/// A duration in the file: a TOML integer or float of seconds. Anything else (`"5"`) is refused as
/// "expected a number of seconds", not serde's "expected f64".
#[derive(Debug, Clone, Copy)]
struct Seconds(f64);

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Seconds;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a number of seconds (e.g. 300 or 0.5, without quotes)")
            }
            fn visit_f64<E>(self, v: f64) -> Result<Seconds, E> {
                Ok(Seconds(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Seconds, E> {
                Ok(Seconds(v as f64))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Seconds, E> {
                Ok(Seconds(v as f64))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

pub(super) fn seconds(what: &str, s: f64) -> Result<Millis, FileError> {
    if !(s.is_finite() && s > 0.0 && s <= 10.0 * 365.0 * 86400.0) {
        return Err(FileError::new(format!(
            "{what} must be a positive number of seconds, got {s}"
        )));
    }
    Ok((s * 1000.0).round().max(1.0) as Millis)
}

pub(super) fn resolve(
    name: Option<&String>,
    table: &PolicyTable,
    base: &ActionPolicy,
) -> Result<ActionPolicy, FileError> {
    let at = |field: &str| match name {
        Some(name) => format!("actions.\"{name}\".{field}"),
        None => format!("defaults.{field}"),
    };
    let key_fields = match &table.key_fields {
        None => base.key_fields.clone(),
        Some(pointers) => {
            for pointer in pointers {
                validate_pointer(pointer).map_err(|why| {
                    FileError::new(format!("{}: {pointer:?} {why}", at("key_fields")))
                })?;
            }
            let mut pointers = pointers.clone();
            pointers.sort();
            pointers.dedup();
            KeyFields::Pointers(pointers)
        }
    };
    Ok(ActionPolicy {
        name: name.cloned(),
        key_fields,
        lease: table
            .lease_ttl_seconds
            .map(|Seconds(s)| seconds(&at("lease_ttl_seconds"), s))
            .transpose()?
            .unwrap_or(base.lease),
        retention: table
            .retention_seconds
            .map(|Seconds(s)| seconds(&at("retention_seconds"), s))
            .transpose()?
            .unwrap_or(base.retention),
        sliding: table.sliding.unwrap_or(base.sliding),
        on_expiry: table.on_expiry.unwrap_or(base.on_expiry),
        durability_replicas: table
            .durability_replicas
            .unwrap_or(base.durability_replicas),
        audience: match &table.audience {
            Some(a) if a.is_empty() => {
                return Err(FileError::new(format!(
                    "{} must not be empty",
                    at("audience")
                )));
            }
            Some(a) => Some(a.clone()),
            None => base.audience.clone(),
        },
        shadow: table.shadow.unwrap_or(base.shadow),
    })
}

/// A JSON Pointer setting at `at`, checked ([`validate_pointer`]).
pub(super) fn pointer(at: &str, pointer: &str) -> Result<(), FileError> {
    validate_pointer(pointer).map_err(|why| FileError::new(format!("{at}: {pointer:?} {why}")))
}

/// RFC 6901: a pointer is empty or starts with `/`, and `~` only escapes `0` or `1`.
fn validate_pointer(pointer: &str) -> Result<(), &'static str> {
    if pointer.is_empty() {
        return Err("selects the whole params; leave key_fields unset instead");
    }
    if !pointer.starts_with('/') {
        return Err("is not a JSON Pointer (it must start with '/')");
    }
    let mut chars = pointer.chars();
    while let Some(c) = chars.next() {
        if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
            return Err("has a '~' that is not '~0' or '~1'");
        }
    }
    Ok(())
}
