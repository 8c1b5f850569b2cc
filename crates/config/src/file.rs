//! The configuration file (TOML, `--config`): `strict`, `[defaults]`, `[limits]`,
//! `[actions."<name>"]`, `[[principals]]`, `[mcp]` ([`super::mcp`]), `[authorization]` and
//! `[[budgets]]` ([`super::authorization`]), parsed and validated once into the gate's
//! [`Policies`] and authorization [`Settings`], the server's [`Principals`] and the MCP gateway's
//! [`McpSettings`]. Every error names the setting.

use std::{collections::HashMap, path::Path};

use serde::Deserialize;

use super::{
    authorization::{AuthorizationTable, BudgetTable},
    mcp::{McpSettings, McpTable},
};
use oncegate_domain::{
    fingerprint::KeyFields,
    ledger::{Millis, OnExpiry},
};
use oncegate_gate::{
    authorization::Settings,
    policy::{ActionPolicy, Limits, Policies, builtin_defaults},
};
use oncegate_grpc::auth::{PrincipalConfig, Principals};

/// A configuration file that cannot be used, with the reason.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct FileError(String);

impl FileError {
    pub(super) fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// What the configuration file configures.
#[derive(Debug, Clone, Default)]
pub struct ConfigFile {
    /// The action policies and limits, for the gate.
    pub policies: Policies,
    /// Who may call the gate (`[[principals]]`); empty means an open gate.
    pub principals: Principals,
    /// Rules, budgets, approvals and shadow mode (`[authorization]`, `[[budgets]]`).
    pub authorization: Settings,
}

/// Policies alone: an open gate (no principals), no authorization.
impl From<Policies> for ConfigFile {
    fn from(policies: Policies) -> Self {
        Self {
            policies,
            principals: Principals::default(),
            authorization: Settings::default(),
        }
    }
}

impl ConfigFile {
    /// Reads and validates a configuration file.
    pub fn load(path: &Path) -> Result<Self, FileError> {
        Self::load_with_mcp(path).map(|(file, _)| file)
    }

    /// Reads and validates a configuration file, with its `[mcp]` table (`oncegate mcp`).
    pub fn load_with_mcp(path: &Path) -> Result<(Self, McpSettings), FileError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| FileError(format!("cannot read {}: {e}", path.display())))?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::parse_in(&text, base)
            .map_err(|FileError(e)| FileError(format!("{}: {e}", path.display())))
    }

    /// Parses and validates configuration TOML.
    pub fn parse(text: &str) -> Result<Self, FileError> {
        Self::parse_with_mcp(text).map(|(file, _)| file)
    }

    /// Parses and validates configuration TOML, with its `[mcp]` table. The tools it gates get
    /// action policies of their own (see [`super::mcp`]), for `oncegate serve` as well.
    pub fn parse_with_mcp(text: &str) -> Result<(Self, McpSettings), FileError> {
        Self::parse_in(text, Path::new("."))
    }

    /// Parses configuration TOML whose relative paths (the policy files) start at `base`.
    fn parse_in(text: &str, base: &Path) -> Result<(Self, McpSettings), FileError> {
        let mut file: File = toml::from_str(text).map_err(|e| FileError(e.to_string()))?;
        let mcp = std::mem::take(&mut file.mcp).resolve(&mut file.actions)?;
        let defaults = resolve(None, &file.defaults, &builtin_defaults())?;
        let limits = limits(&file.limits)?;
        if limits.min_lease > limits.max_lease {
            return Err(FileError(
                "limits.min_lease_ttl_seconds is above limits.max_lease_ttl_seconds".into(),
            ));
        }
        check_lease("defaults", &defaults, &limits)?;
        let mut named = Vec::with_capacity(file.actions.len());
        for (name, table) in &file.actions {
            let policy = resolve(Some(name), table, &defaults)?;
            check_lease(&format!("actions.\"{name}\""), &policy, &limits)?;
            named.push(policy);
        }
        let authorization = super::authorization::settings(
            &file.authorization,
            &file.budgets,
            base,
            seconds,
            |at, pointer| {
                validate_pointer(pointer)
                    .map_err(|why| FileError(format!("{at}: {pointer:?} {why}")))
            },
        )?;
        let parsed = Self {
            policies: Policies::new(file.strict, limits, defaults, named),
            principals: Principals::from_config(&file.principals).map_err(FileError)?,
            authorization,
        };
        Ok((parsed, mcp))
    }
}

/// A policy's lease is within `[limits]`.
fn check_lease(at: &str, policy: &ActionPolicy, limits: &Limits) -> Result<(), FileError> {
    if policy.lease > limits.max_lease {
        return Err(FileError(format!(
            "{at}.lease_ttl_seconds is above limits.max_lease_ttl_seconds"
        )));
    }
    if policy.lease < limits.min_lease {
        return Err(FileError(format!(
            "{at}.lease_ttl_seconds is below limits.min_lease_ttl_seconds"
        )));
    }
    Ok(())
}

fn limits(table: &LimitsTable) -> Result<Limits, FileError> {
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

/// The file, as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    strict: bool,
    #[serde(default)]
    defaults: PolicyTable,
    #[serde(default)]
    limits: LimitsTable,
    #[serde(default)]
    actions: HashMap<String, PolicyTable>,
    #[serde(default)]
    principals: Vec<PrincipalConfig>,
    #[serde(default)]
    mcp: McpTable,
    #[serde(default)]
    authorization: AuthorizationTable,
    #[serde(default)]
    budgets: Vec<BudgetTable>,
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
struct LimitsTable {
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

fn seconds(what: &str, s: f64) -> Result<Millis, FileError> {
    if !(s.is_finite() && s > 0.0 && s <= 10.0 * 365.0 * 86400.0) {
        return Err(FileError(format!(
            "{what} must be a positive number of seconds, got {s}"
        )));
    }
    Ok((s * 1000.0).round().max(1.0) as Millis)
}

fn resolve(
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
                validate_pointer(pointer)
                    .map_err(|why| FileError(format!("{}: {pointer:?} {why}", at("key_fields"))))?;
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
                return Err(FileError(format!("{} must not be empty", at("audience"))));
            }
            Some(a) => Some(a.clone()),
            None => base.audience.clone(),
        },
        shadow: table.shadow.unwrap_or(base.shadow),
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use oncegate_domain::{fingerprint::KeyFields, ledger::OnExpiry};

    fn parse(text: &str) -> Result<Policies, FileError> {
        ConfigFile::parse(text).map(|file| file.policies)
    }

    #[test]
    fn exact_then_longest_prefix_then_defaults() {
        let p = parse(
            r#"
            [defaults]
            lease_ttl_seconds = 10
            [actions."payments.*"]
            retention_seconds = 60
            [actions."payments.transfer.*"]
            on_expiry = "regrant"
            [actions."payments.transfer"]
            key_fields = ["/amount", "/to"]
            sliding = false
            "#,
        )
        .unwrap();
        let exact = p.for_action("payments.transfer").unwrap();
        assert_eq!(
            exact.key_fields,
            KeyFields::Pointers(vec!["/amount".into(), "/to".into()])
        );
        assert!(!exact.sliding);
        assert_eq!(exact.lease, 10_000);
        assert_eq!(
            p.for_action("payments.transfer.eu").unwrap().on_expiry,
            OnExpiry::Regrant
        );
        assert_eq!(p.for_action("payments.refund").unwrap().retention, 60_000);
        let other = p.for_action("email.send").unwrap();
        assert_eq!(other.name, None);
        assert_eq!(other.key_fields, KeyFields::All);
    }

    #[test]
    fn durability_is_inherited_and_the_highest_is_known() {
        let p = parse(
            "[defaults]\ndurability_replicas = 1\n[actions.\"pay.*\"]\ndurability_replicas = 2\n[actions.\"log\"]\ndurability_replicas = 0\n[actions.\"x\"]\n",
        )
        .unwrap();
        assert_eq!(p.for_action("pay.eu").unwrap().durability_replicas, 2);
        assert_eq!(p.for_action("log").unwrap().durability_replicas, 0);
        assert_eq!(p.for_action("x").unwrap().durability_replicas, 1);
        assert_eq!(p.for_action("other").unwrap().durability_replicas, 1);
        assert_eq!(p.highest_durability(), 2);
        assert_eq!(ConfigFile::default().policies.highest_durability(), 0);
    }

    #[test]
    fn strict_refuses_actions_without_policy() {
        let p = parse("strict = true\n[actions.\"a\"]\n").unwrap();
        assert!(p.for_action("a").is_some());
        assert!(p.for_action("b").is_none());
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        for (text, needle) in [
            (
                "[actions.\"a\"]\nkey_fields = [\"amount\"]",
                "must start with '/'",
            ),
            ("[actions.\"a\"]\nkey_fields = [\"/a~2\"]", "'~0' or '~1'"),
            ("[defaults]\nlease_ttl_seconds = 0", "positive"),
            (
                "[defaults]\nlease_ttl_seconds = \"5\"",
                "expected a number of seconds",
            ),
            (
                "[limits]\nmin_lease_ttl_seconds = true",
                "a number of seconds",
            ),
            ("[defaults]\nlease_tl_seconds = 5", "unknown field"),
            ("[defaults]\non_expiry = \"sometimes\"", "unknown variant"),
            (
                "[limits]\nmax_lease_ttl_seconds = 5\n[defaults]\nlease_ttl_seconds = 6",
                "above",
            ),
        ] {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }
}
