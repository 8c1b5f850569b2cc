//! Authorization rules: Cedar policies over who asks, which action and its params, evaluated
//! before the store (they need no state). Allow, deny, or hold for an operator's approval.
//!
//! The Cedar request of a RequestToken:
//! - principal `Agent::"<agent_id>"`, resource `Run::"<run_id>"`;
//! - action `Action::"<action>"`, a member of `Action::"<prefix>"` for every dotted prefix, so
//!   `action in Action::"payments"` covers `payments.transfer` and `payments.refund.eu`;
//! - context `{ principal: "<authenticated principal>", params: {…}, decimal_params: {…},
//!   idempotency_key, intent_id }`: params as a Cedar record (integers as `Long`, fractions as
//!   `decimal` when they have at most 4 places, else their text; `null` members left out; arrays as
//!   sets), and `decimal_params` the same record with every number that fits a `decimal` as one,
//!   integers included. An amount may come as `12` or as `12.5`: a `Long` and a `decimal` cannot be
//!   compared with one operator, and a rule that errors denies, so a rule on such a param reads
//!   `decimal_params` (`.greaterThan(decimal("10000.00"))`) and holds for both.
//!
//! Cedar's semantics: deny unless a `permit` applies and no `forbid` does. A permit annotated
//! `@hold("why")` holds instead of allowing: if any satisfied permit carries it, the action needs
//! an approval (a broad `permit` elsewhere does not lift a hold). A policy that errors while
//! evaluating (a missing attribute, a type mismatch) denies: an agent must not slip past a
//! `forbid` by sending a param of the wrong type. Policy ids: `@id("…")` when given, else
//! `<file name>#<n>`.
//!
//! The gate sees a rule set through [`RuleSet`]; the Cedar evaluation is the `oncegate-rules`
//! crate's, so that the gate (and everything above it but the configuration) compiles without
//! Cedar, the largest crate of the build, which a cold build would otherwise wait for.

use std::{path::PathBuf, sync::Arc};

/// What the rules say about one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// `policy`: the forbidding (or erroring) policy; empty when no permit applied.
    Deny {
        policy: String,
    },
    /// A permit with `@hold("reason")` applied.
    Hold {
        policy: String,
        reason: String,
    },
}

/// The facts of one request the rules see.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    pub principal: &'a str,
    pub agent_id: &'a str,
    pub run_id: &'a str,
    pub action: &'a str,
    pub idempotency_key: &'a str,
    pub intent_id: &'a str,
    pub params: &'a serde_json::Map<String, serde_json::Value>,
}

/// A loaded, validated set of rules: what the gate asks, and swaps whole on reload.
pub trait RuleSet: std::fmt::Debug + Send + Sync {
    /// Evaluates one request.
    fn evaluate(&self, facts: &Facts<'_>) -> Verdict;

    /// Reads the same files again (SIGHUP); the error says what is wrong, and where.
    fn reload(&self) -> Result<Rules, String>;

    /// How many policies are loaded.
    fn len(&self) -> usize;

    /// Whether no policy is loaded (every request is denied).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The files the policies come from.
    fn files(&self) -> &[PathBuf];
}

/// A shared rule set.
pub type Rules = Arc<dyn RuleSet>;
