//! An authenticated caller: its role, the agents it may act for, its rate limit, and the scope
//! check every RPC makes before the store is asked.

use std::collections::HashSet;

use governor::{
    DefaultDirectRateLimiter,
    clock::{Clock as _, DefaultClock},
};
use serde::Deserialize;

use oncegate_gate::GateError;

/// What a principal is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A worker: the gate RPCs, for its agents only.
    Agent,
    /// A person or tool that settles what needs a human: every RPC, including GateAdminService,
    /// for its agents (every agent when `agents` is unset).
    Operator,
}

/// The agent ids a principal may act for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Agents {
    All,
    Some {
        exact: HashSet<String>,
        prefixes: Vec<String>,
    },
}

impl Agents {
    pub(super) fn parse(patterns: &[String]) -> Self {
        if patterns.iter().any(|p| p == "*") {
            return Self::All;
        }
        let (prefixes, exact): (Vec<_>, Vec<_>) = patterns.iter().partition(|p| p.ends_with('*'));
        Self::Some {
            exact: exact.into_iter().cloned().collect(),
            prefixes: prefixes
                .into_iter()
                .map(|p| p.trim_end_matches('*').to_owned())
                .collect(),
        }
    }

    fn allows(&self, agent_id: &str) -> bool {
        match self {
            Self::All => true,
            Self::Some { exact, prefixes } => {
                exact.contains(agent_id) || prefixes.iter().any(|p| agent_id.starts_with(p))
            }
        }
    }
}

/// An authenticated caller.
#[derive(Debug)]
pub struct Principal {
    /// The configured name (`anonymous` on an open gate).
    pub name: String,
    pub role: Role,
    pub(super) agents: Agents,
    pub(super) limiter: Option<DefaultDirectRateLimiter>,
}

impl Principal {
    /// The caller of a gate configured without principals (open: loopback only unless mutual TLS
    /// or `--insecure`): an agent for every agent. The operator role always needs a named
    /// principal, so that no certificate holder or local process can settle another team's
    /// actions.
    pub fn anonymous() -> Self {
        Self {
            name: "anonymous".into(),
            role: Role::Agent,
            agents: Agents::All,
            limiter: None,
        }
    }

    /// Whether it may act for `agent_id`.
    pub fn may_act_for(&self, agent_id: &str) -> bool {
        self.agents.allows(agent_id)
    }

    /// Whether it may act for every agent (list unresolved actions without naming an agent).
    pub fn acts_for_all(&self) -> bool {
        self.agents == Agents::All
    }

    /// The scope check: `FORBIDDEN_SCOPE` unless it may act for `agent_id` (and, for an
    /// operator-only RPC, is an operator). Decided before any store call, so a refused caller
    /// learns nothing about the action.
    pub fn authorize(&self, agent_id: &str, operator_only: bool) -> Result<(), GateError> {
        let role_ok = !operator_only || self.role == Role::Operator;
        if role_ok && self.may_act_for(agent_id) {
            Ok(())
        } else {
            Err(self.forbidden())
        }
    }

    /// `FORBIDDEN_SCOPE` for this principal.
    pub fn forbidden(&self) -> GateError {
        GateError::ForbiddenScope {
            principal: self.name.clone(),
        }
    }

    pub(super) fn check_rate(&self) -> Result<(), GateError> {
        let Some(limiter) = &self.limiter else {
            return Ok(());
        };
        limiter.check().map_err(|not_until| GateError::RateLimited {
            retry_after: not_until.wait_time_from(DefaultClock::default().now()),
        })
    }
}
