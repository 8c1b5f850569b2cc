//! Per-action authorization as the gate applies it: the rules ([`super::rules`], reloadable), the
//! budgets (what a request charges, from its params), the approval lifetime, and shadow mode.
//! The stateful decisions (approvals, budget windows) are the store step's
//! ([`oncegate_domain::authorization`]); this module only prepares them.

use std::sync::RwLock;

use base64::Engine as _;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{
    GateError,
    rules::{Facts, Rules, Verdict},
};
use oncegate_domain::{
    ledger::Millis,
    ledger::{Charge, budget::MAX_UNITS},
};

/// Whether refusals are enforced or only counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Every decision is enforced (the default).
    #[default]
    Enforce,
    /// Every decision (deduplication, rules, budgets) is computed, counted and audited, but the
    /// gate grants anyway.
    Shadow,
}

impl Mode {
    /// The metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Shadow => "shadow",
        }
    }
}

/// One budget or velocity cap of the configuration file.
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    /// Its name (`[A-Za-z0-9_.-]`, at most 64 bytes): refusals and metrics name it.
    pub name: String,
    /// The actions it applies to: exact names or `prefix*` patterns; every action when empty.
    pub actions: Vec<String>,
    /// One bucket per agent and action instead of one per agent.
    pub per_action: bool,
    pub window: Millis,
    /// The most a window holds, in units of 10^-decimals (a velocity cap: grants).
    pub limit: u64,
    /// The param whose sum is capped (a JSON Pointer); `None`: a velocity cap (grants counted).
    pub sum: Option<String>,
    /// The param that splits the budget (a currency): one bucket per value.
    pub group_by: Option<String>,
    /// Decimal places of `sum` amounts that count (more are refused).
    pub decimals: u32,
}

impl Budget {
    fn applies_to(&self, action: &str) -> bool {
        self.actions.is_empty()
            || self.actions.iter().any(|p| match p.strip_suffix('*') {
                Some(prefix) => action.starts_with(prefix),
                None => p == action,
            })
    }

    /// Units as a person reads them (the limit, a usage).
    pub fn display(&self, units: u64) -> String {
        if self.sum.is_none() || self.decimals == 0 {
            return units.to_string();
        }
        let scale = 10u64.pow(self.decimals);
        format!(
            "{}.{:0width$}",
            units / scale,
            units % scale,
            width = self.decimals as usize
        )
    }

    /// The bucket id of this budget for one action and group value: the name, then a digest (no
    /// separator in client bytes can make two buckets one).
    fn bucket(&self, action: &str, group: &str) -> String {
        let mut hasher = Sha256::new();
        for part in [self.name.as_str(), action, group] {
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part.as_bytes());
        }
        let digest =
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&hasher.finalize()[..16]);
        format!("{}:{digest}", self.name)
    }
}

/// The authorization settings of a configuration file, before the gate runs with them.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// The rules; `None` when no `[authorization] policies` are named.
    pub rules: Option<Rules>,
    pub mode: Mode,
    pub approval_ttl: Millis,
    pub budgets: Vec<Budget>,
}

impl From<Settings> for Authorization {
    fn from(s: Settings) -> Self {
        Self::new(s.rules, s.mode, s.approval_ttl, s.budgets)
    }
}

/// The authorization settings the gate runs with.
#[derive(Debug, Default)]
pub struct Authorization {
    /// The rules, swapped whole on reload; `None`: no `[authorization] policies`, every action
    /// allowed.
    rules: Option<RwLock<Rules>>,
    /// The global mode (an action policy's `shadow = true` shadows that action alone).
    pub mode: Mode,
    /// How long an approval waits (and, approved, stays usable).
    pub approval_ttl: Millis,
    pub budgets: Vec<Budget>,
}

/// The longest group value (e.g. a currency code) a budget accepts.
pub const MAX_GROUP_BYTES: usize = 64;

impl Authorization {
    /// Settings from validated parts.
    pub fn new(
        rules: Option<Rules>,
        mode: Mode,
        approval_ttl: Millis,
        budgets: Vec<Budget>,
    ) -> Self {
        Self {
            rules: rules.map(RwLock::new),
            mode,
            approval_ttl,
            budgets,
        }
    }

    /// Whether any rule or budget is configured (else RequestToken does no authorization work).
    pub fn is_active(&self) -> bool {
        self.rules.is_some() || !self.budgets.is_empty()
    }

    /// The rules as they stand (`None` when none are configured).
    pub fn rules(&self) -> Option<Rules> {
        let lock = self.rules.as_ref()?;
        Some(lock.read().unwrap_or_else(|e| e.into_inner()).clone())
    }

    /// What the rules say (Allow when there are none).
    pub fn verdict(&self, facts: &Facts<'_>) -> Verdict {
        match self.rules() {
            Some(rules) => rules.evaluate(facts),
            None => Verdict::Allow,
        }
    }

    /// Reads the policy files again; on success the new set replaces the old one for every later
    /// request (calls in flight finish with the old one), and the number of policies is returned.
    /// On failure the old set stays and the reason is returned.
    pub fn reload(&self) -> Result<usize, String> {
        let Some(lock) = &self.rules else {
            return Err("no [authorization] policies are configured".into());
        };
        let current = lock.read().unwrap_or_else(|e| e.into_inner()).clone();
        let fresh = current.reload()?;
        let count = fresh.len();
        *lock.write().unwrap_or_else(|e| e.into_inner()) = fresh;
        Ok(count)
    }

    /// The budget charges of a request for `action` with `params`: INVALID_REQUEST when a budget
    /// applies and its params are missing or unusable (a budget never lets an action through
    /// uncounted).
    pub fn charges(
        &self,
        action: &str,
        params: &serde_json::Map<String, Value>,
    ) -> Result<Vec<Charge>, GateError> {
        let mut charges = Vec::new();
        for budget in self.budgets.iter().filter(|b| b.applies_to(action)) {
            let group = match &budget.group_by {
                None => String::new(),
                Some(pointer) => group_value(params, pointer, &budget.name)?,
            };
            let amount = match &budget.sum {
                None => 1,
                Some(pointer) => amount(params, pointer, budget)?,
            };
            let scope = if budget.per_action { action } else { "" };
            charges.push(Charge {
                bucket: budget.bucket(scope, &group),
                budget: budget.name.clone(),
                action: scope.to_owned(),
                group,
                limit: budget.limit,
                window: budget.window,
                amount,
            });
        }
        Ok(charges)
    }

    /// The budget named `name`.
    pub fn budget(&self, name: &str) -> Option<&Budget> {
        self.budgets.iter().find(|b| b.name == name)
    }
}

fn lookup<'p>(params: &'p serde_json::Map<String, Value>, pointer: &str) -> Option<&'p Value> {
    let mut parts = pointer.split('/').skip(1);
    let first = parts.next()?.replace("~1", "/").replace("~0", "~");
    let mut value = params.get(&first)?;
    for part in parts {
        value = value.pointer(&format!("/{part}"))?;
    }
    Some(value)
}

fn invalid(pointer: &str, budget: &str, why: &str) -> GateError {
    GateError::invalid(
        "params_json",
        format!("{pointer} {why} (budget {budget:?} needs it)"),
    )
}

fn group_value(
    params: &serde_json::Map<String, Value>,
    pointer: &str,
    budget: &str,
) -> Result<String, GateError> {
    let value = match lookup(params, pointer) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::Bool(b)) => b.to_string(),
        _ => return Err(invalid(pointer, budget, "is missing or not a string")),
    };
    if value.is_empty() || value.len() > MAX_GROUP_BYTES {
        return Err(invalid(
            pointer,
            budget,
            &format!("must be 1 to {MAX_GROUP_BYTES} bytes"),
        ));
    }
    Ok(value)
}

fn amount(
    params: &serde_json::Map<String, Value>,
    pointer: &str,
    budget: &Budget,
) -> Result<u64, GateError> {
    let text = match lookup(params, pointer) {
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::String(s)) => s.clone(),
        _ => return Err(invalid(pointer, &budget.name, "is missing or not a number")),
    };
    scaled(&text, budget.decimals).ok_or_else(|| {
        invalid(
            pointer,
            &budget.name,
            &format!(
                "must be a non-negative number with at most {} decimal places, below {}",
                budget.decimals,
                MAX_UNITS / 10u64.pow(budget.decimals)
            ),
        )
    })
}

/// A non-negative decimal number (`12`, `12.5`, `1.25e2`) in units of 10^-decimals; `None` when
/// it is negative, malformed, more precise than that, or at least [`MAX_UNITS`] units.
pub fn scaled(text: &str, decimals: u32) -> Option<u64> {
    let (mantissa, exponent) = match text.split_once(['e', 'E']) {
        Some((m, e)) => (m, e.parse::<i32>().ok()?),
        None => (text, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if int.is_empty()
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let digits = format!("{int}{frac}");
    let digits = digits.trim_start_matches('0');
    // value = digits × 10^(exponent − len(frac)); in units: × 10^decimals.
    let shift = exponent - frac.len() as i32 + decimals as i32;
    let mut units: u128 = if digits.is_empty() {
        0
    } else {
        digits.parse().ok()?
    };
    if shift >= 0 {
        units = units.checked_mul(10u128.checked_pow(shift as u32)?)?;
    } else {
        let div = 10u128.checked_pow((-shift) as u32).unwrap_or(u128::MAX);
        if !units.is_multiple_of(div) {
            return None;
        }
        units /= div;
    }
    (units < MAX_UNITS as u128).then_some(units as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_scale_exactly_or_are_refused() {
        assert_eq!(scaled("60", 2), Some(6000));
        assert_eq!(scaled("19.99", 2), Some(1999));
        assert_eq!(scaled("1.25e2", 2), Some(12500));
        assert_eq!(scaled("0.1", 2), Some(10));
        assert_eq!(scaled("0.001", 2), None);
        assert_eq!(scaled("-1", 2), None);
        assert_eq!(scaled("1e300", 2), None);
        assert_eq!(scaled("abc", 2), None);
        assert_eq!(scaled("5.000", 0), Some(5));
    }

    fn budget(sum: Option<&str>, group: Option<&str>) -> Budget {
        Budget {
            name: "eur".into(),
            actions: vec!["payments.*".into()],
            per_action: false,
            window: 3_600_000,
            limit: 10_000,
            sum: sum.map(str::to_owned),
            group_by: group.map(str::to_owned),
            decimals: 2,
        }
    }

    #[test]
    fn charges_follow_actions_groups_and_pointers() {
        let authz = Authorization::new(
            None,
            Mode::Enforce,
            1,
            vec![budget(Some("/amount"), Some("/currency"))],
        );
        let params = serde_json::json!({"amount": 60, "currency": "EUR"});
        let params = params.as_object().unwrap();
        let charges = authz.charges("payments.transfer", params).unwrap();
        assert_eq!(charges.len(), 1);
        assert_eq!(charges[0].amount, 6000);
        assert_eq!(charges[0].group, "EUR");
        let usd = serde_json::json!({"amount": 60, "currency": "USD"});
        let usd = authz
            .charges("payments.x", usd.as_object().unwrap())
            .unwrap();
        assert_ne!(usd[0].bucket, charges[0].bucket);
        assert!(authz.charges("email.send", params).unwrap().is_empty());
        let missing = serde_json::json!({"amount": 60});
        assert!(
            authz
                .charges("payments.transfer", missing.as_object().unwrap())
                .is_err()
        );
        assert_eq!(budget(Some("/a"), None).display(12345), "123.45");
    }
}
