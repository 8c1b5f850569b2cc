//! This replica's last RequestToken decisions, kept in memory for the operator console: a bounded
//! ring fed from the one decision path (the [`TokenDecision`] every RequestToken ends in), newest
//! first when read. Off unless asked for ([`Gate::with_recent_decisions`]): without it a
//! RequestToken does no work for it.
//!
//! Not a store of decisions: another replica's, and this one's before a restart, are not here
//! (the audit trail, `oncegate::audit`, has them all). Never params, receipts or tokens.

use std::{collections::VecDeque, sync::Mutex};

use super::{Gate, TokenDecision, authorization::Mode};
use oncegate_domain::{ActionKey, ledger::Millis};

/// One RequestToken decision as the console lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecentDecision {
    /// When it was decided (the store's clock; the gate's for a rule's denial).
    pub at: Millis,
    pub agent_id: String,
    pub run_id: String,
    pub key: String,
    /// The action type, as asked.
    pub action: String,
    /// The decision's name (the metrics and audit label: `granted`, `replayed`...).
    pub decision: &'static str,
    /// `enforce`, or `shadow` when the gate granted anyway.
    pub mode: &'static str,
    /// What the decision adds: the fencing number, the policy or approval, the budget.
    pub detail: String,
}

/// A bounded ring of decisions (the oldest is dropped when full).
#[derive(Debug)]
pub struct RecentDecisions {
    capacity: usize,
    ring: Mutex<VecDeque<RecentDecision>>,
}

impl RecentDecisions {
    /// A ring of at most `capacity` decisions.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            ring: Mutex::new(VecDeque::with_capacity(capacity.max(1))),
        }
    }

    /// How many it keeps.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn push(&self, decision: RecentDecision) {
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        if ring.len() == self.capacity {
            ring.pop_back();
        }
        ring.push_front(decision);
    }

    /// The decisions `matches` keeps, newest first, at most `limit`.
    pub fn newest(
        &self,
        limit: usize,
        matches: impl Fn(&RecentDecision) -> bool,
    ) -> Vec<RecentDecision> {
        let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        ring.iter()
            .filter(|d| matches(d))
            .take(limit)
            .cloned()
            .collect()
    }
}

/// What a decision adds to its name, for a person.
fn detail(decision: &TokenDecision) -> String {
    match decision {
        TokenDecision::Granted { grant, .. } => format!("fencing {}", grant.fencing),
        TokenDecision::Replayed(done) => format!("fencing {}", done.fencing),
        TokenDecision::LeaseExpired { fencing, .. } => format!("fencing {fencing} unresolved"),
        TokenDecision::Held(pending) => {
            format!("approval {} (policy {})", pending.id, pending.policy)
        }
        TokenDecision::KeyReused { differing } => format!("differing: {}", differing.join(", ")),
        TokenDecision::InProgress { retry_after } => format!("retry in {retry_after} ms"),
        TokenDecision::BudgetExceeded(e) => format!("budget {}", e.budget),
        TokenDecision::ApprovalDenied { id } => format!("approval {id} denied"),
        TokenDecision::PolicyDenied { policy } => format!("policy {policy}"),
    }
}

impl Gate {
    /// This gate, keeping its last `capacity` RequestToken decisions for the console.
    pub fn with_recent_decisions(mut self, capacity: usize) -> Self {
        self.recent = Some(std::sync::Arc::new(RecentDecisions::new(capacity)));
        self
    }

    /// The ring of recent decisions, when kept.
    pub fn recent_decisions(&self) -> Option<&RecentDecisions> {
        self.recent.as_deref()
    }

    /// Keeps one decision in the ring, when there is one.
    pub(super) fn remember(
        &self,
        key: &ActionKey,
        action: &str,
        decision: &TokenDecision,
        mode: Mode,
        at: Millis,
    ) {
        if let Some(recent) = &self.recent {
            recent.push(RecentDecision {
                at,
                agent_id: key.agent_id.clone(),
                run_id: key.run_id.clone(),
                key: key.key.clone(),
                action: action.to_owned(),
                decision: decision.label().as_str(),
                mode: mode.as_str(),
                detail: detail(decision),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(n: i64) -> RecentDecision {
        RecentDecision {
            at: n,
            agent_id: format!("a{}", n % 2),
            run_id: "r".into(),
            key: format!("k{n}"),
            action: "pay".into(),
            decision: "granted",
            mode: "enforce",
            detail: String::new(),
        }
    }

    #[test]
    fn the_ring_keeps_the_newest_and_filters() {
        let ring = RecentDecisions::new(3);
        for n in 0..5 {
            ring.push(decision(n));
        }
        let all: Vec<i64> = ring.newest(10, |_| true).iter().map(|d| d.at).collect();
        assert_eq!(all, [4, 3, 2]);
        let odd: Vec<i64> = ring
            .newest(10, |d| d.agent_id == "a1")
            .iter()
            .map(|d| d.at)
            .collect();
        assert_eq!(odd, [3]);
        assert_eq!(ring.newest(1, |_| true).len(), 1);
    }
}
