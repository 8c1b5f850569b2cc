//! The configuration file's authorization tables: `[authorization]` (the Cedar policy files, the
//! mode, the approval lifetime) and `[[budgets]]`, validated into the gate's
//! [`Settings`]. The policy files are read and parsed here, at start-up: a broken one is a bad
//! configuration (exit 64) with Cedar's own message.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{
    error::FileError,
    policy::{pointer, seconds},
};
use oncegate_domain::ledger::budget::MAX_UNITS;
use oncegate_gate::authorization::{Budget, Mode, Settings, scaled};
use oncegate_rules::CedarRules;

/// Default approval lifetime: one hour.
pub const DEFAULT_APPROVAL_TTL_SECONDS: f64 = 3600.0;

/// `[authorization]`, as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AuthorizationTable {
    /// Cedar policy files, relative to the configuration file's folder.
    #[serde(default)]
    policies: Vec<PathBuf>,
    /// `enforce` (default) or `shadow`.
    #[serde(default)]
    mode: Option<String>,
    approval_ttl_seconds: Option<f64>,
}

/// One `[[budgets]]` entry, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BudgetTable {
    name: String,
    #[serde(default)]
    actions: Vec<String>,
    /// `agent` (default) or `agent_action`.
    #[serde(default)]
    per: Option<String>,
    window_seconds: f64,
    /// A number, or a decimal string for exact amounts.
    limit: toml::Value,
    sum: Option<String>,
    group_by: Option<String>,
    decimals: Option<u32>,
}

/// Validates both tables; `base` is the folder relative policy paths start from.
pub(super) fn settings(
    table: &AuthorizationTable,
    budgets: &[BudgetTable],
    base: &Path,
) -> Result<Settings, FileError> {
    let mode = match table.mode.as_deref() {
        None | Some("enforce") => Mode::Enforce,
        Some("shadow") => Mode::Shadow,
        Some(other) => {
            return Err(FileError::new(format!(
                "authorization.mode must be \"enforce\" or \"shadow\", got {other:?}"
            )));
        }
    };
    let rules = if table.policies.is_empty() {
        None
    } else {
        let files: Vec<PathBuf> = table.policies.iter().map(|p| base.join(p)).collect();
        Some(
            CedarRules::shared(&files)
                .map_err(|e| FileError::new(format!("authorization.policies: {e}")))?,
        )
    };
    let approval_ttl = seconds(
        "authorization.approval_ttl_seconds",
        table
            .approval_ttl_seconds
            .unwrap_or(DEFAULT_APPROVAL_TTL_SECONDS),
    )?;
    let mut parsed: Vec<Budget> = Vec::with_capacity(budgets.len());
    for b in budgets {
        let budget = budget(b)?;
        if parsed.iter().any(|p| p.name == budget.name) {
            return Err(FileError::new(format!(
                "budgets: the name {:?} is used twice",
                budget.name
            )));
        }
        parsed.push(budget);
    }
    Ok(Settings {
        rules,
        mode,
        approval_ttl,
        budgets: parsed,
    })
}

fn budget(b: &BudgetTable) -> Result<Budget, FileError> {
    let at = |field: &str| format!("budgets.{}.{field}", b.name);
    let valid_name = !b.name.is_empty()
        && b.name.len() <= 64
        && b.name
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"_.-".contains(&c));
    if !valid_name {
        return Err(FileError::new(format!(
            "budgets: name {:?} must be 1 to 64 of A-Z a-z 0-9 _ . -",
            b.name
        )));
    }
    let per_action = match b.per.as_deref() {
        None | Some("agent") => false,
        Some("agent_action") => true,
        Some(other) => {
            return Err(FileError::new(format!(
                "{} must be \"agent\" or \"agent_action\", got {other:?}",
                at("per")
            )));
        }
    };
    for p in b.sum.iter().chain(&b.group_by) {
        pointer(&at("sum/group_by"), p)?;
    }
    let decimals = match (&b.sum, b.decimals) {
        (None, Some(_)) => {
            return Err(FileError::new(format!(
                "{}: a velocity cap (no `sum`) counts grants; decimals do not apply",
                at("decimals")
            )));
        }
        (None, None) => 0,
        (Some(_), d) => d.unwrap_or(2),
    };
    if decimals > 9 {
        return Err(FileError::new(format!(
            "{} must be at most 9",
            at("decimals")
        )));
    }
    let text = match &b.limit {
        toml::Value::Integer(n) => n.to_string(),
        toml::Value::Float(f) => f.to_string(),
        toml::Value::String(s) => s.clone(),
        _ => String::new(),
    };
    let limit = scaled(&text, decimals).filter(|l| *l > 0).ok_or_else(|| {
        FileError::new(format!(
            "{} must be a positive number with at most {decimals} decimal places, below {}",
            at("limit"),
            MAX_UNITS / 10u64.pow(decimals)
        ))
    })?;
    Ok(Budget {
        name: b.name.clone(),
        actions: b.actions.clone(),
        per_action,
        window: seconds(&at("window_seconds"), b.window_seconds)?,
        limit,
        sum: b.sum.clone(),
        group_by: b.group_by.clone(),
        decimals,
    })
}
