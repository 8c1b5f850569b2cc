//! Writing the agents index ([`keys::AGENTS`]) after grants that opened an agent's lease index:
//! the agents of the grants are queued, and one task at a time adds every queued agent with one
//! `ZADD`, then takes what queued meanwhile. Under load that is one command per Redis round trip
//! instead of one per grant (and no task per grant); a grant's reply never waits for it.
//!
//! Only a grant that opened its agent's lease index (request_token.lua's `opened`: its member is
//! the only one) queues the agent. While the lease index has another member, the grant that
//! opened it has added the agent, or its `ZADD` is still to come: that `ZADD` is sent after its
//! grant's script, so after any prune that could remove the agent (`listing::Walk::prune` removes
//! only an agent whose lease index does not exist, and puts it back when the index exists after
//! the removal). A failed write is retried for a while: no later grant adds the agent again until
//! its lease index is opened anew.
//!
//! Owns: the queue and its task. The index's meaning (a hint, pruned by the listing) is
//! [`super::listing`]'s.

use std::{collections::BTreeSet, sync::Mutex, time::Duration};

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

    /// Queues again agents whose write failed (the writing task goes on).
    fn put_back(&self, agents: BTreeSet<String>) {
        self.state
            .lock()
            .expect("the agents queue's lock")
            .0
            .extend(agents);
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

/// How many rounds in a row the agents index write is tried before the agents of the last one
/// are given up; the pause doubles from [`RETRY_PAUSE`] (0.5 + 1 + 2 + 4 s of pauses).
const WRITE_ATTEMPTS: u32 = 5;
const RETRY_PAUSE: Duration = Duration::from_millis(500);

impl RedisStore {
    /// Adds `agent_id` to the agents index after a grant that opened the agent's lease index,
    /// without holding up the grant's reply. Never cached: a listing may prune the agent between
    /// two such grants (see `listing::Walk::prune`); the `ZADD` that carries it is sent after this
    /// call, so after the grant. Failures are logged and retried ([`WRITE_ATTEMPTS`]), then given
    /// up: the grant itself has happened, and listing one agent does not need the index.
    pub(super) fn remember_agent(&self, agent_id: &str) {
        if self.agents.push(agent_id) {
            let store = self.clone();
            tokio::spawn(async move { store.write_agents().await });
        }
    }

    /// The writing task: one `ZADD` of every queued agent per round, until the queue is empty. A
    /// failed round is tried again after a pause, with whatever queued meanwhile, up to
    /// [`WRITE_ATTEMPTS`] rounds in a row.
    async fn write_agents(self) {
        let mut failed = 0;
        while let Some(agents) = self.agents.take() {
            let mut cmd = redis::cmd("ZADD");
            cmd.arg(keys::AGENTS);
            for agent in &agents {
                cmd.arg(0).arg(agent_member(agent));
            }
            match self.query::<i64>(&cmd).await {
                Ok(_) => failed = 0,
                Err(e) if failed + 1 < WRITE_ATTEMPTS => {
                    failed += 1;
                    let pause = RETRY_PAUSE * (1 << (failed - 1));
                    tracing::warn!(error = %e, agents = agents.len(), retry_in_ms = pause.as_millis() as u64,
                        "could not add agents to the agents index; trying again");
                    self.agents.put_back(agents);
                    tokio::time::sleep(pause).await;
                }
                Err(e) => {
                    failed = 0;
                    tracing::error!(error = %e, agents = ?agents, attempts = WRITE_ATTEMPTS,
                        "gave up adding agents to the agents index: listing every agent misses \
                         them until a grant opens their lease index again (listing one agent \
                         by id still finds its actions)");
                }
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

    #[test]
    fn agents_put_back_are_taken_with_those_queued_meanwhile() {
        let queue = AgentsQueue::default();
        assert!(queue.push("a"));
        let failed = queue.take().unwrap();
        assert!(!queue.push("b"), "the task still runs while it retries");
        queue.put_back(failed);
        let taken: Vec<_> = queue.take().unwrap().into_iter().collect();
        assert_eq!(taken, ["a", "b"]);
        assert!(queue.take().is_none());
    }
}
