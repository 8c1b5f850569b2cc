//! The action key `agent_id::run_id::K` and its encodings: storage bytes that cannot be confused
//! across scopes, the Redis key with its hash tag, and the provider key.

use base64::Engine as _;
use sha2::{Digest, Sha256};

/// One action of one scope. `key` is the idempotency key when the request gave one, else the
/// fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ActionKey {
    pub agent_id: String,
    pub run_id: String,
    pub key: String,
}

impl ActionKey {
    /// Builds a key from its parts.
    pub fn new(
        agent_id: impl Into<String>,
        run_id: impl Into<String>,
        key: impl Into<String>,
    ) -> Self {
        Self {
            agent_id: agent_id.into(),
            run_id: run_id.into(),
            key: key.into(),
        }
    }

    /// The unambiguous storage encoding: each part is length-prefixed, so agent `a::b` with run
    /// `c` and agent `a` with run `b::c` never meet.
    pub fn encode(&self) -> Vec<u8> {
        let mut out =
            Vec::with_capacity(self.agent_id.len() + self.run_id.len() + self.key.len() + 16);
        for part in [&self.agent_id, &self.run_id, &self.key] {
            out.extend_from_slice(part.len().to_string().as_bytes());
            out.push(b':');
            out.extend_from_slice(part.as_bytes());
        }
        out
    }

    /// Decodes [`ActionKey::encode`]'s output; `None` when it is not one.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let mut rest = bytes;
        let mut parts = Vec::with_capacity(3);
        for _ in 0..3 {
            let colon = rest.iter().position(|b| *b == b':')?;
            let digits = &rest[..colon];
            // Only the canonical spelling of the length (found by fuzzing: `00:` and `+1:` would
            // decode too, giving one key two encodings).
            if digits.is_empty()
                || !digits.iter().all(u8::is_ascii_digit)
                || (digits.len() > 1 && digits[0] == b'0')
            {
                return None;
            }
            let len: usize = std::str::from_utf8(digits).ok()?.parse().ok()?;
            let start = colon + 1;
            let part = rest.get(start..start + len)?;
            parts.push(String::from_utf8(part.to_vec()).ok()?);
            rest = &rest[start + len..];
        }
        if !rest.is_empty() {
            return None;
        }
        let key = parts.pop()?;
        let run_id = parts.pop()?;
        let agent_id = parts.pop()?;
        Some(Self {
            agent_id,
            run_id,
            key,
        })
    }

    /// The Redis key of the record: `og:{<agent digest>}:<action digest>`. The braces make a
    /// digest of the agent id the Cluster hash tag, so one agent's records and its lease index
    /// ([`ActionKey::redis_index_key`]) share a slot and a script can update both atomically; the
    /// action digest (192 bits of SHA-256 of the encoded action key) names the record. No client
    /// bytes reach the key, so `{`/`}` in ids cannot break the tag.
    pub fn redis_key(&self) -> String {
        let digest = Sha256::digest(self.encode());
        format!(
            "{}:{}",
            agent_tag(&self.agent_id),
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&digest[..24])
        )
    }

    /// The Redis key of the agent's lease index: a sorted set scored by lease expiry whose members
    /// are [`ActionKey::encode`] of the agent's authorized actions (see `src/store/redis/`).
    pub fn redis_index_key(&self) -> String {
        redis_index_key(&self.agent_id)
    }

    /// A stable key for the downstream provider's own idempotency check: the same for every
    /// attempt of this action, different for every other action, at most 43 characters.
    pub fn provider_key(&self) -> String {
        let mut hasher = Sha256::new();
        hasher.update(b"oncegate-provider-key\0");
        hasher.update(self.encode());
        format!("og-{}", hex::encode(&hasher.finalize()[..20]))
    }
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

/// The Redis key of one agent's lease index, `og:{<agent digest>}:leases`.
pub fn redis_index_key(agent_id: &str) -> String {
    format!("{}:leases", agent_tag(agent_id))
}

/// The Redis set of agent ids that were ever granted a token: a hint for listing across agents
/// (kept outside the per-agent slots, so it is updated after the grant, not inside its script).
pub const REDIS_AGENTS_KEY: &str = "og:agents";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_that_look_alike_when_joined_are_different_keys() {
        let a = ActionKey::new("a::b", "c", "k");
        let b = ActionKey::new("a", "b::c", "k");
        assert_ne!(a.encode(), b.encode());
        assert_ne!(a.redis_key(), b.redis_key());
        assert_ne!(a.provider_key(), b.provider_key());
    }

    #[test]
    fn encoding_round_trips() {
        for key in [
            ActionKey::new("a", "b", "c"),
            ActionKey::new("12:x", "", "é:3"),
            ActionKey::new("{tag}", "run", "v1-abc"),
        ] {
            assert_eq!(ActionKey::decode(&key.encode()), Some(key));
        }
        assert_eq!(ActionKey::decode(b"1:a1:b"), None);
        assert_eq!(
            ActionKey::decode(b"00:00:1:B"),
            None,
            "non-canonical lengths"
        );
        assert_eq!(ActionKey::decode(b"+1:a1:b1:c"), None);
        assert_eq!(
            ActionKey::decode(b"0:0:1:B"),
            Some(ActionKey::new("", "", "B"))
        );
        assert_eq!(ActionKey::decode(b"1:a1:b1:cx"), None);
    }

    #[test]
    fn redis_key_has_one_hash_tag_and_no_client_bytes() {
        let key = ActionKey::new("{evil}", "r}", "k{");
        let redis_key = key.redis_key();
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
        assert_eq!(tag(&a.redis_key()), tag(&b.redis_key()));
        assert_eq!(tag(&a.redis_key()), tag(&a.redis_index_key()));
        assert_ne!(a.redis_key(), b.redis_key());
        assert_ne!(tag(&a.redis_key()), tag(&c.redis_key()));
        assert!(a.redis_index_key().ends_with(":leases"));
    }
}
