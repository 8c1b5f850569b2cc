//! The Redis key names of the store: no client bytes reach them, so `{`/`}` in ids cannot break
//! the Cluster hash tag, and one agent's keys share a slot.

use base64::Engine as _;
use sha2::{Digest, Sha256};

use oncegate_domain::ActionKey;

/// The agents index: a sorted set (all scores 0) of the agents that may have unresolved actions,
/// each as `<id length, 10 digits>:<id>` so that its byte order is the listing's order. A hint
/// for listing across agents (kept outside the per-agent slots, so it is updated after a grant,
/// not inside its script); agents without a lease index are pruned by the listing.
pub const AGENTS: &str = "og:agents:index";

/// The set of agent ids that versions before the agents index kept (migrated at start-up).
pub const OLD_AGENTS: &str = "og:agents";

/// The webhook outbox's keys (layout in `outbox_prelude.lua`): one hash tag of their own, so that
/// every outbox script runs on one Cluster slot, apart from every agent's.
pub const OUTBOX_ENTRIES: &str = "og:{outbox}:entries";
/// Pending outbox members by when they may be claimed.
pub const OUTBOX_DUE: &str = "og:{outbox}:due";
/// Undeliverable outbox members by when they were given up.
pub const OUTBOX_DEAD: &str = "og:{outbox}:dead";
/// Settled outbox members by when they are forgotten.
pub const OUTBOX_KEEP: &str = "og:{outbox}:keep";

/// The keys of one agent, from its hash tag computed once: one SHA-256 of the agent id per call,
/// however many of the agent's keys the call passes.
pub struct Agent {
    tag: String,
}

impl Agent {
    /// The keys of `agent_id`.
    pub fn new(agent_id: &str) -> Self {
        Self {
            tag: agent_tag(agent_id),
        }
    }

    /// The Redis key of an action's record: `og:{<agent digest>}:<action digest>`. The braces make a
    /// digest of the agent id the Cluster hash tag, so one agent's records and its lease index
    /// share a slot and a script can update both atomically; the action digest (192 bits of
    /// SHA-256 of the encoded action key) names the record. `key` must be of this agent.
    pub fn record(&self, key: &ActionKey) -> String {
        let digest = Sha256::digest(key.encode());
        format!(
            "{}:{}",
            self.tag,
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&digest[..24])
        )
    }

    /// The agent's lease index, `og:{<agent digest>}:leases`: a sorted set scored by lease expiry
    /// whose members are [`ActionKey::encode`] of the agent's authorized actions.
    pub fn leases(&self) -> String {
        format!("{}:leases", self.tag)
    }

    /// The agent's receipt chain, `og:{<agent digest>}:receipts`: a list of MessagePack entries,
    /// one per recorded completion (layout in `prelude.lua`). In the agent's slot, so the script
    /// that records a completion appends to it atomically.
    pub fn receipts(&self) -> String {
        format!("{}:receipts", self.tag)
    }

    /// The seal mark of the agent's receipt chain, `og:{<agent digest>}:sealed`: `"<seq>
    /// <digest>"` of its last signed head, where the next seal starts (absent: nothing sealed).
    pub fn sealed(&self) -> String {
        format!("{}:sealed", self.tag)
    }

    /// The agent's budget buckets, `og:{<agent digest>}:budgets`: a hash, one field per bucket
    /// (budget, action when per action, group value), so that Release reaches the buckets a
    /// record names without building key names in a script.
    pub fn budgets(&self) -> String {
        format!("{}:budgets", self.tag)
    }

    /// The agent's approvals index, `og:{<agent digest>}:approvals`: a sorted set scored by lapse
    /// time whose members are [`ActionKey::encode`] of actions with an approval.
    pub fn approvals(&self) -> String {
        format!("{}:approvals", self.tag)
    }

    /// The key of the approval of the action whose record key is `record`: `:approval` after it
    /// (same slot).
    pub fn approval_of(record: &str) -> String {
        format!("{record}:approval")
    }
}

/// The record key of `key` (see [`Agent::record`]).
pub fn record(key: &ActionKey) -> String {
    Agent::new(&key.agent_id).record(key)
}

/// The lease index of `agent_id` (see [`Agent::leases`]).
pub fn lease_index(agent_id: &str) -> String {
    Agent::new(agent_id).leases()
}

/// The receipt chain of `agent_id` (see [`Agent::receipts`]).
pub fn receipts(agent_id: &str) -> String {
    Agent::new(agent_id).receipts()
}

/// The seal mark of `agent_id`'s receipt chain (see [`Agent::sealed`]).
pub fn sealed(agent_id: &str) -> String {
    Agent::new(agent_id).sealed()
}

/// The approval of `key` (see [`Agent::approval_of`]).
pub fn approval(key: &ActionKey) -> String {
    Agent::approval_of(&record(key))
}

/// `og:{<base64url(SHA-256("agent\0" ++ agent_id))[..16 bytes]>}`: the hash-tagged prefix of
/// every Redis key of one agent.
fn agent_tag(agent_id: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"agent\0");
    hasher.update(agent_id.as_bytes());
    format!(
        "og:{{{}}}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&hasher.finalize()[..16])
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_that_look_alike_when_joined_are_different_keys() {
        let a = ActionKey::new("a::b", "c", "k");
        let b = ActionKey::new("a", "b::c", "k");
        assert_ne!(record(&a), record(&b));
    }

    #[test]
    fn record_key_has_one_hash_tag_and_no_client_bytes() {
        let key = ActionKey::new("{evil}", "r}", "k{");
        let redis_key = record(&key);
        assert!(redis_key.starts_with("og:{"));
        assert_eq!(redis_key.matches('{').count(), 1);
        assert_eq!(redis_key.matches('}').count(), 1);
        assert_eq!(redis_key.len(), 4 + 22 + 2 + 32);
        assert!(!redis_key.contains("evil"));
    }

    #[test]
    fn one_agent_shares_a_hash_tag_and_agents_do_not() {
        let tag = |k: &str| k[k.find('{').unwrap()..=k.find('}').unwrap()].to_owned();
        let a = ActionKey::new("billing", "r1", "k1");
        let b = ActionKey::new("billing", "r2", "k2");
        let c = ActionKey::new("billing2", "r1", "k1");
        assert_eq!(tag(&record(&a)), tag(&record(&b)));
        assert_eq!(tag(&record(&a)), tag(&lease_index(&a.agent_id)));
        assert_ne!(record(&a), record(&b));
        assert_ne!(tag(&record(&a)), tag(&record(&c)));
        assert!(lease_index("billing").ends_with(":leases"));
        assert_eq!(tag(&record(&a)), tag(&receipts(&a.agent_id)));
    }
}
