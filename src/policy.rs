//! Action policies: the TOML file given with `--config`, parsed and validated once.
//!
//! The server, not each client, decides which params are key fields, so every client in every
//! language fingerprints the same way. Owns: the file format, defaults, limits, and the lookup of
//! an action's policy (exact name first, then the longest matching `prefix*` pattern). The
//! `[[principals]]` entries of the same file are validated by [`crate::auth`].

use std::{collections::HashMap, path::Path};

use serde::Deserialize;

use crate::{
    auth::{PrincipalConfig, Principals},
    fingerprint::KeyFields,
    ledger::Millis,
    ledger::OnExpiry,
};

/// The policy file, as written.
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
}

/// `[defaults]` and each `[actions."<name>"]`; unset entries fall back to `[defaults]`, then to the
/// built-in defaults.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyTable {
    key_fields: Option<Vec<String>>,
    lease_ttl_seconds: Option<f64>,
    retention_seconds: Option<f64>,
    sliding: Option<bool>,
    on_expiry: Option<OnExpiry>,
    durability_replicas: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsTable {
    max_params_bytes: Option<usize>,
    max_params_depth: Option<usize>,
    max_receipt_bytes: Option<usize>,
    max_id_bytes: Option<usize>,
    max_lease_ttl_seconds: Option<f64>,
}

/// The policy one action runs under.
#[derive(Debug, Clone, PartialEq)]
pub struct ActionPolicy {
    /// The policy's name in the file (`payments.transfer`, `payments.*`), `None` for the defaults.
    pub name: Option<String>,
    pub key_fields: KeyFields,
    pub lease: Millis,
    pub retention: Millis,
    pub sliding: bool,
    pub on_expiry: OnExpiry,
    /// Replicas that must confirm this action's grants (Redis `WAIT`); the deployment's
    /// `--durability-replicas` applies when it is higher. 0: this policy asks for none.
    pub durability_replicas: u32,
}

/// Input limits (SPEC.md "Defaults").
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub max_params_bytes: usize,
    pub max_params_depth: usize,
    pub max_receipt_bytes: usize,
    pub max_id_bytes: usize,
    pub max_lease: Millis,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_params_bytes: 64 * 1024,
            max_params_depth: 32,
            max_receipt_bytes: 64 * 1024,
            max_id_bytes: 256,
            max_lease: 24 * 3600 * 1000,
        }
    }
}

/// Every policy, validated.
#[derive(Debug, Clone)]
pub struct Policies {
    /// Refuse actions that no policy names.
    pub strict: bool,
    pub limits: Limits,
    defaults: ActionPolicy,
    exact: HashMap<String, ActionPolicy>,
    /// `(prefix, policy)`, longest prefix first.
    prefixes: Vec<(String, ActionPolicy)>,
    /// Who may call the gate (`[[principals]]`); empty means an open gate.
    pub principals: Principals,
}

impl Default for Policies {
    fn default() -> Self {
        Self {
            strict: false,
            limits: Limits::default(),
            defaults: builtin_defaults(),
            exact: HashMap::new(),
            prefixes: Vec::new(),
            principals: Principals::default(),
        }
    }
}

fn builtin_defaults() -> ActionPolicy {
    ActionPolicy {
        name: None,
        key_fields: KeyFields::All,
        lease: 300_000,
        retention: 24 * 3600 * 1000,
        sliding: true,
        on_expiry: OnExpiry::Reconcile,
        durability_replicas: 0,
    }
}

/// A policy file that cannot be used, with the reason.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PolicyError(String);

impl Policies {
    /// Reads and validates a policy file.
    pub fn load(path: &Path) -> Result<Self, PolicyError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| PolicyError(format!("cannot read {}: {e}", path.display())))?;
        Self::parse(&text).map_err(|PolicyError(e)| PolicyError(format!("{}: {e}", path.display())))
    }

    /// Parses and validates policy TOML.
    pub fn parse(text: &str) -> Result<Self, PolicyError> {
        let file: File = toml::from_str(text).map_err(|e| PolicyError(e.to_string()))?;
        let base = builtin_defaults();
        let defaults = resolve(None, &file.defaults, &base)?;
        let builtin = Limits::default();
        let limits = Limits {
            max_params_bytes: file
                .limits
                .max_params_bytes
                .unwrap_or(builtin.max_params_bytes),
            max_params_depth: file
                .limits
                .max_params_depth
                .unwrap_or(builtin.max_params_depth),
            max_receipt_bytes: file
                .limits
                .max_receipt_bytes
                .unwrap_or(builtin.max_receipt_bytes),
            max_id_bytes: file.limits.max_id_bytes.unwrap_or(builtin.max_id_bytes),
            max_lease: match file.limits.max_lease_ttl_seconds {
                Some(s) => seconds("limits.max_lease_ttl_seconds", s)?,
                None => builtin.max_lease,
            },
        };
        let mut policies = Self {
            strict: file.strict,
            limits,
            defaults,
            exact: HashMap::new(),
            prefixes: Vec::new(),
            principals: Principals::from_config(&file.principals).map_err(PolicyError)?,
        };
        for (name, table) in &file.actions {
            let policy = resolve(Some(name), table, &policies.defaults)?;
            if policy.lease > limits.max_lease {
                return Err(PolicyError(format!(
                    "actions.\"{name}\": lease_ttl_seconds is above limits.max_lease_ttl_seconds"
                )));
            }
            match name.strip_suffix('*') {
                Some(prefix) => policies.prefixes.push((prefix.to_owned(), policy)),
                None => {
                    policies.exact.insert(name.clone(), policy);
                }
            }
        }
        if policies.defaults.lease > limits.max_lease {
            return Err(PolicyError(
                "defaults.lease_ttl_seconds is above limits.max_lease_ttl_seconds".into(),
            ));
        }
        policies
            .prefixes
            .sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
        Ok(policies)
    }

    /// The policy for `action`, or `None` when the configuration is strict and no policy names it.
    pub fn for_action(&self, action: &str) -> Option<&ActionPolicy> {
        if let Some(policy) = self.exact.get(action) {
            return Some(policy);
        }
        if let Some((_, policy)) = self
            .prefixes
            .iter()
            .find(|(prefix, _)| action.starts_with(prefix.as_str()))
        {
            return Some(policy);
        }
        (!self.strict).then_some(&self.defaults)
    }

    /// The highest durability level any policy asks for: Complete, Release and ExtendLease name no
    /// action, so they wait for this many replicas (or the deployment's level, if higher).
    pub fn highest_durability(&self) -> u32 {
        self.exact
            .values()
            .chain(self.prefixes.iter().map(|(_, p)| p))
            .map(|p| p.durability_replicas)
            .fold(self.defaults.durability_replicas, u32::max)
    }

    /// The names of every configured policy (bounded, for metric labels).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.exact
            .keys()
            .map(String::as_str)
            .chain(self.prefixes.iter().filter_map(|(_, p)| p.name.as_deref()))
    }
}

fn seconds(what: &str, s: f64) -> Result<Millis, PolicyError> {
    if !(s.is_finite() && s > 0.0 && s <= 10.0 * 365.0 * 86400.0) {
        return Err(PolicyError(format!(
            "{what} must be a positive number of seconds, got {s}"
        )));
    }
    Ok((s * 1000.0).round().max(1.0) as Millis)
}

fn resolve(
    name: Option<&String>,
    table: &PolicyTable,
    base: &ActionPolicy,
) -> Result<ActionPolicy, PolicyError> {
    let at = |field: &str| match name {
        Some(name) => format!("actions.\"{name}\".{field}"),
        None => format!("defaults.{field}"),
    };
    let key_fields = match &table.key_fields {
        None => base.key_fields.clone(),
        Some(pointers) => {
            for pointer in pointers {
                validate_pointer(pointer).map_err(|why| {
                    PolicyError(format!("{}: {pointer:?} {why}", at("key_fields")))
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
            .map(|s| seconds(&at("lease_ttl_seconds"), s))
            .transpose()?
            .unwrap_or(base.lease),
        retention: table
            .retention_seconds
            .map(|s| seconds(&at("retention_seconds"), s))
            .transpose()?
            .unwrap_or(base.retention),
        sliding: table.sliding.unwrap_or(base.sliding),
        on_expiry: table.on_expiry.unwrap_or(base.on_expiry),
        durability_replicas: table
            .durability_replicas
            .unwrap_or(base.durability_replicas),
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

    #[test]
    fn exact_then_longest_prefix_then_defaults() {
        let p = Policies::parse(
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
        let p = Policies::parse(
            "[defaults]\ndurability_replicas = 1\n[actions.\"pay.*\"]\ndurability_replicas = 2\n[actions.\"log\"]\ndurability_replicas = 0\n[actions.\"x\"]\n",
        )
        .unwrap();
        assert_eq!(p.for_action("pay.eu").unwrap().durability_replicas, 2);
        assert_eq!(p.for_action("log").unwrap().durability_replicas, 0);
        assert_eq!(p.for_action("x").unwrap().durability_replicas, 1);
        assert_eq!(p.for_action("other").unwrap().durability_replicas, 1);
        assert_eq!(p.highest_durability(), 2);
        assert_eq!(Policies::default().highest_durability(), 0);
    }

    #[test]
    fn strict_refuses_actions_without_policy() {
        let p = Policies::parse("strict = true\n[actions.\"a\"]\n").unwrap();
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
            ("[defaults]\nlease_tl_seconds = 5", "unknown field"),
            ("[defaults]\non_expiry = \"sometimes\"", "unknown variant"),
            (
                "[limits]\nmax_lease_ttl_seconds = 5\n[defaults]\nlease_ttl_seconds = 6",
                "above",
            ),
        ] {
            let err = Policies::parse(text).unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }
}
