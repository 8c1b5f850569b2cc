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
    /// A person who decides held actions (a finance lead, an on-call engineer): DecideApproval
    /// and ListApprovals for its agents (every agent when `agents` is unset), and nothing else.
    Approver,
    /// An automatic resolver (a worker that asks the provider by provider key): WatchUnresolved
    /// and ResolveExpired with an expected fencing number, for its agents (every agent when
    /// `agents` is unset) and its action types (every type when `actions` is unset), and nothing
    /// else.
    Resolver,
}

impl Role {
    /// Its name, as the config file writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Agent => "agent",
            Self::Operator => "operator",
            Self::Approver => "approver",
            Self::Resolver => "resolver",
        }
    }

    /// Whether the role may do `what`.
    pub fn grants(self, what: Capability) -> bool {
        matches!(
            (self, what),
            (Self::Operator, _)
                | (Self::Agent, Capability::Work)
                | (Self::Approver, Capability::Approve)
                | (Self::Resolver, Capability::Resolve)
        )
    }
}

/// What an RPC needs of its caller, besides acting for the agent it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capability {
    /// The worker RPCs (ActionGateService).
    Work,
    /// Deciding and listing approvals.
    Approve,
    /// Settling actions: an operator's completion, ResolveExpired.
    Settle,
    /// Reading what operators read: unresolved actions, receipt chains, budgets.
    Read,
    /// Watching unresolved actions and settling them one grant at a time (ResolveExpired with
    /// an expected fencing number): what a resolver does.
    Resolve,
}

impl Capability {
    /// The roles that have it, for the refusal's message.
    fn roles(self) -> &'static str {
        match self {
            Self::Work => "agent or operator",
            Self::Approve => "operator or approver",
            Self::Settle | Self::Read => "operator",
            Self::Resolve => "operator or resolver",
        }
    }
}

/// The name of the caller that presented no credential.
pub const ANONYMOUS: &str = "anonymous";

/// The name of the caller on the gate's admin socket.
pub const LOCAL_OPERATOR: &str = "local-operator";

/// The names a principal's scope admits (agent ids in `agents`, action types in `actions`):
/// exact names and `prefix*` patterns, or `*` for every one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Patterns {
    All,
    Some {
        exact: HashSet<String>,
        prefixes: Vec<String>,
    },
}

impl Patterns {
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

    fn allows(&self, name: &str) -> bool {
        match self {
            Self::All => true,
            Self::Some { exact, prefixes } => {
                exact.contains(name) || prefixes.iter().any(|p| name.starts_with(p))
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
    pub(super) agents: Patterns,
    /// The action types it may settle (a resolver's `actions`; every type for other roles).
    pub(super) actions: Patterns,
    pub(super) limiter: Option<DefaultDirectRateLimiter>,
}

impl Principal {
    /// The caller of a gate configured without principals (open: loopback only unless mutual TLS
    /// or `--insecure`): an agent for every agent. The operator role always needs a named
    /// principal, so that no certificate holder or local process can settle another team's
    /// actions.
    pub fn anonymous() -> Self {
        Self {
            name: ANONYMOUS.into(),
            role: Role::Agent,
            agents: Patterns::All,
            actions: Patterns::All,
            limiter: None,
        }
    }

    /// The caller on the gate's own admin socket (`<data-dir>/admin.sock`, mode 0600): whoever can
    /// open it is the user that runs the gate (or root), so it is an operator for every agent.
    pub fn local_operator() -> Self {
        Self {
            name: LOCAL_OPERATOR.into(),
            role: Role::Operator,
            agents: Patterns::All,
            actions: Patterns::All,
            limiter: None,
        }
    }

    /// Whether it may act for `agent_id`.
    pub fn may_act_for(&self, agent_id: &str) -> bool {
        self.agents.allows(agent_id)
    }

    /// Whether it may settle actions of type `action` (a resolver's `actions` scope). An empty
    /// type (a settled action, or a record written before the type was kept) is within an
    /// unscoped principal's reach only.
    pub fn may_settle_action(&self, action: &str) -> bool {
        self.actions == Patterns::All || (!action.is_empty() && self.actions.allows(action))
    }

    /// Whether its `actions` scope is narrower than every action type.
    pub fn scoped_by_action(&self) -> bool {
        self.actions != Patterns::All
    }

    /// `FORBIDDEN_SCOPE` for an action type outside its `actions`.
    pub fn forbid_action(&self, action: &str) -> GateError {
        let what = match action {
            "" => "an action whose type the gate does not know (settled, or granted before the \
                   gate kept action types)"
                .to_owned(),
            action => format!("action type {action:?}"),
        };
        self.forbidden(format!(
            "it may not settle {what}: its `actions` in [[principals]] do not name it"
        ))
    }

    /// The agent ids its `agents` name exactly (not its `prefix*` patterns), sorted: where a
    /// listing by agent can start without being told one.
    pub fn named_agents(&self) -> Vec<String> {
        match &self.agents {
            Patterns::All => Vec::new(),
            Patterns::Some { exact, .. } => {
                let mut named: Vec<String> = exact.iter().cloned().collect();
                named.sort();
                named
            }
        }
    }

    /// Whether it may act for every agent (list unresolved actions without naming an agent).
    pub fn acts_for_all(&self) -> bool {
        self.agents == Patterns::All
    }

    /// The scope check: `FORBIDDEN_SCOPE` unless its role grants `what` and it may act for
    /// `agent_id`. Decided before any store call, so a refused caller learns nothing about the
    /// action. The refusal says what is missing.
    pub fn authorize(&self, agent_id: &str, what: Capability) -> Result<(), GateError> {
        if !self.role.grants(what) {
            return Err(self.forbidden(self.lacks(what)));
        }
        if !self.may_act_for(agent_id) {
            return Err(self.forbidden(format!(
                "it may not act for agent {agent_id:?} (its `agents` in [[principals]] do not \
                 name it)"
            )));
        }
        Ok(())
    }

    /// The check of a call about no agent: only that its role grants `what`.
    pub fn authorize_role(&self, what: Capability) -> Result<(), GateError> {
        match self.role.grants(what) {
            true => Ok(()),
            false => Err(self.forbidden(self.lacks(what))),
        }
    }

    /// The check of a call about every agent at once (listing without naming an agent).
    pub fn authorize_all(&self, what: Capability) -> Result<(), GateError> {
        if !self.role.grants(what) {
            return Err(self.forbidden(self.lacks(what)));
        }
        if !self.acts_for_all() {
            return Err(
                self.forbidden("it does not act for every agent: name one (--agent)".to_owned())
            );
        }
        Ok(())
    }

    /// Why this principal's role does not allow `what`, and what to configure.
    pub fn lacks(&self, what: Capability) -> String {
        let needs = what.roles();
        if self.name == ANONYMOUS {
            return format!(
                "this needs a principal with the {needs} role, and the caller presented no \
                 credential: on the gate's machine run `oncegate admin` as the user that runs the \
                 gate (it connects through <data-dir>/admin.sock); from elsewhere add a \
                 [[principals]] entry with role = \"operator\" (or \"approver\") and an \
                 api_key_sha256 to the config file (`oncegate hash-key` prints it) and pass its \
                 key with --api-key"
            );
        }
        format!(
            "its role is {} and this needs the {needs} role (role in its [[principals]] entry)",
            self.role.as_str()
        )
    }

    /// `FORBIDDEN_SCOPE` for this principal, saying why.
    pub fn forbidden(&self, why: String) -> GateError {
        GateError::ForbiddenScope {
            principal: self.name.clone(),
            why,
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
