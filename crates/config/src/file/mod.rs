//! The configuration file (TOML, `--config`): `strict`, `[defaults]`, `[limits]`,
//! `[actions."<name>"]`, `[[principals]]`, `[mcp]` ([`mcp`]), `[authorization]` and
//! `[[budgets]]` ([`authorization`]), `[notifications]` and `[[webhooks]]` ([`webhooks`]), parsed
//! and validated once into the gate's [`Policies`] and authorization [`Settings`], the server's
//! [`Principals`], the webhooks' [`oncegate_notify::Settings`] and the MCP gateway's
//! [`McpSettings`]. Every error names the setting.

use std::{collections::HashMap, path::Path};

use serde::Deserialize;

pub mod authorization;
mod error;
pub mod mcp;
mod policy;
mod webhooks;

pub use error::FileError;

use authorization::{AuthorizationTable, BudgetTable};
use mcp::{McpSettings, McpTable};
use oncegate_gate::{
    authorization::Settings,
    policy::{Policies, builtin_defaults},
};
use oncegate_grpc::auth::{PrincipalConfig, Principals};
use policy::{LimitsTable, PolicyTable, check_lease, limits, resolve};

/// What the configuration file configures.
#[derive(Debug, Clone, Default)]
pub struct ConfigFile {
    /// The action policies and limits, for the gate.
    pub policies: Policies,
    /// Who may call the gate (`[[principals]]`); empty means an open gate.
    pub principals: Principals,
    /// Rules, budgets, approvals and shadow mode (`[authorization]`, `[[budgets]]`).
    pub authorization: Settings,
    /// Webhooks (`[notifications]`, `[[webhooks]]`); none by default.
    pub notifications: oncegate_notify::Settings,
}

/// Policies alone: an open gate (no principals), no authorization.
impl From<Policies> for ConfigFile {
    fn from(policies: Policies) -> Self {
        Self {
            policies,
            principals: Principals::default(),
            authorization: Settings::default(),
            notifications: oncegate_notify::Settings::default(),
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
            .map_err(|e| FileError::new(format!("cannot read {}: {e}", path.display())))?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::parse_in(&text, base).map_err(|e| FileError::In {
            path: path.to_owned(),
            source: Box::new(e),
        })
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
        let mut file: File = toml::from_str(text)?;
        let mcp = std::mem::take(&mut file.mcp).resolve(&mut file.actions)?;
        let defaults = resolve(None, &file.defaults, &builtin_defaults())?;
        let limits = limits(&file.limits)?;
        if limits.min_lease > limits.max_lease {
            return Err(FileError::new(
                "limits.min_lease_ttl_seconds is above limits.max_lease_ttl_seconds",
            ));
        }
        check_lease("defaults", &defaults, &limits)?;
        let mut named = Vec::with_capacity(file.actions.len());
        for (name, table) in &file.actions {
            let policy = resolve(Some(name), table, &defaults)?;
            check_lease(&format!("actions.\"{name}\""), &policy, &limits)?;
            named.push(policy);
        }
        let authorization = authorization::settings(&file.authorization, &file.budgets, base)?;
        let notifications = webhooks::settings(&file.notifications, &file.webhooks)?;
        let parsed = Self {
            policies: Policies::new(file.strict, limits, defaults, named),
            principals: Principals::from_config(&file.principals).map_err(FileError::new)?,
            authorization,
            notifications,
        };
        Ok((parsed, mcp))
    }
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
    #[serde(default)]
    notifications: webhooks::NotificationsTable,
    #[serde(default)]
    webhooks: Vec<webhooks::WebhookTable>,
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
