//! Writing the agents index ([`keys::AGENTS`]) after new grants: the agents of the grants are
//! queued, and one task at a time adds every queued agent with one `ZADD`, then takes what queued
//! meanwhile. Under load that is one command per Redis round trip instead of one per grant (and no
//! task per grant); a grant's reply never waits for it.
//!
//! Owns: the queue and its task. The index's meaning (a hint, pruned by the listing) is
//! [`super::listing`]'s.

use std::{collections::BTreeSet, sync::Mutex};

use super::{RedisStore, keys, listing::agent_member};

/// The agents whose new grants are not in the index yet, and whether a task is writing them.
#[derive(Default)]
pub(super) struct AgentsQueue {
    state: Mutex<(BTreeSet<String>, bool)>,
}

impl AgentsQueue {
    /// Queues `agent_id`; true when no task is writing and the caller must start one.
    fn push(&self, agent_id: &str) -> bool {
        let mut state = self.state.lock().expect("the agents queue's lock");
        if !state.0.contains(agent_id) {
            state.0.insert(agent_id.to_owned());
        }
        !std::mem::replace(&mut state.1, true)
    }

    /// Takes every queued agent; none left ends the task (the next push starts another).
    fn take(&self) -> Option<BTreeSet<String>> {
        let mut state = self.state.lock().expect("the agents queue's lock");
        if state.0.is_empty() {
            state.1 = false;
            return None;
        }
        Some(std::mem::take(&mut state.0))
    }
}

impl RedisStore {
    /// Adds `agent_id` to the agents index after a new grant (which may have created the agent's
    /// lease index), without holding up the grant's reply. Always sent, never cached: a listing
    /// may prune the agent in between (see `listing::Walk::prune`); the `ZADD` that carries it is
    /// sent after this call, so after the grant. Failures are logged and ignored: the grant itself
    /// has happened, and listing one agent does not need the index.
    pub(super) fn remember_agent(&self, agent_id: &str) {
        if self.agents.push(agent_id) {
            let store = self.clone();
            tokio::spawn(async move { store.write_agents().await });
        }
    }

    /// The writing task: one `ZADD` of every queued agent per round, until the queue is empty.
    async fn write_agents(self) {
        while let Some(agents) = self.agents.take() {
            let mut cmd = redis::cmd("ZADD");
            cmd.arg(keys::AGENTS);
            for agent in &agents {
                cmd.arg(0).arg(agent_member(agent));
            }
            if let Err(e) = self.query::<i64>(&cmd).await {
                tracing::warn!(error = %e, agents = agents.len(), "could not add agents to the agents index");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::AgentsQueue;

    #[test]
    fn one_task_takes_every_agent_queued_while_it_writes() {
        let queue = AgentsQueue::default();
        assert!(queue.push("a"), "the first agent starts a task");
        assert!(!queue.push("b"), "a running task takes the next ones");
        assert!(!queue.push("a"));
        let taken: Vec<_> = queue.take().unwrap().into_iter().collect();
        assert_eq!(taken, ["a", "b"], "each agent once");
        assert!(
            !queue.push("c"),
            "the task runs until it finds the queue empty"
        );
        assert_eq!(queue.take().unwrap().len(), 1);
        assert!(queue.take().is_none(), "empty: the task ends");
        assert!(queue.push("d"), "and the next agent starts another");
    }
}
