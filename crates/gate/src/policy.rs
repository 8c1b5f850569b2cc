//! Action policies: which params are key fields, lease, retention, expiry policy and durability
//! per action, and the input limits; the lookup of an action's policy (exact name first, then the
//! longest matching `prefix*` pattern, then the defaults unless strict).
//!
//! The server, not each client, decides which params are key fields, so every client in every
//! language fingerprints the same way. The file these come from is read by [`oncegate_config`].

use std::collections::HashMap;

use oncegate_domain::{
    fingerprint::{KeyFields, ParamsLimits},
    ledger::{Millis, OnExpiry},
};

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
    /// The audience (`aud`) of this action's grant statements: who is meant to execute it (a
    /// provider's name). `None`: the action's name.
    pub audience: Option<String>,
    /// Shadow mode for this action: every decision computed and counted, but granted anyway.
    pub shadow: bool,
}

/// Input limits (docs/CONTRACT.md, "Defaults and limits").
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub max_params_bytes: usize,
    pub max_params_depth: usize,
    pub max_receipt_bytes: usize,
    pub max_id_bytes: usize,
    pub max_lease: Millis,
    /// The shortest lease (and extension) a request may ask for.
    pub min_lease: Millis,
    /// The most superseded grants one record keeps (see [`TokenRequest::max_superseded`]).
    ///
    /// [`TokenRequest::max_superseded`]: oncegate_domain::ledger::TokenRequest::max_superseded
    pub max_superseded_grants: usize,
}

impl Default for Limits {
    fn default() -> Self {
        let params = ParamsLimits::default();
        Self {
            max_params_bytes: params.max_bytes,
            max_params_depth: params.max_depth,
            max_receipt_bytes: 64 * 1024,
            max_id_bytes: 256,
            max_lease: 24 * 3600 * 1000,
            min_lease: 1000,
            max_superseded_grants: 8,
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
}

impl Default for Policies {
    fn default() -> Self {
        Self {
            strict: false,
            limits: Limits::default(),
            defaults: builtin_defaults(),
            exact: HashMap::new(),
            prefixes: Vec::new(),
        }
    }
}

/// The built-in defaults (docs/CONTRACT.md, "Defaults and limits").
pub fn builtin_defaults() -> ActionPolicy {
    ActionPolicy {
        name: None,
        key_fields: KeyFields::All,
        lease: 300_000,
        retention: 24 * 3600 * 1000,
        sliding: true,
        on_expiry: OnExpiry::Reconcile,
        durability_replicas: 0,
        audience: None,
        shadow: false,
    }
}

impl Limits {
    /// The limits the params parser enforces.
    pub fn params(&self) -> ParamsLimits {
        ParamsLimits {
            max_bytes: self.max_params_bytes,
            max_depth: self.max_params_depth,
        }
    }
}

impl Policies {
    /// Policies from validated parts: the defaults (for actions no policy names, unless
    /// `strict`), and named policies (`name` exact, or `prefix*`).
    pub fn new(
        strict: bool,
        limits: Limits,
        defaults: ActionPolicy,
        named: impl IntoIterator<Item = ActionPolicy>,
    ) -> Self {
        let mut policies = Self {
            strict,
            limits,
            defaults,
            exact: HashMap::new(),
            prefixes: Vec::new(),
        };
        for policy in named {
            let name = policy.name.clone().unwrap_or_default();
            match name.strip_suffix('*') {
                Some(prefix) => policies.prefixes.push((prefix.to_owned(), policy)),
                None => {
                    policies.exact.insert(name, policy);
                }
            }
        }
        policies
            .prefixes
            .sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
        policies
    }

    /// The policy of actions that no named policy covers.
    pub fn defaults(&self) -> &ActionPolicy {
        &self.defaults
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
