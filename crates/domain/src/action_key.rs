//! The action key `agent_id::run_id::K` and its encodings: storage bytes that cannot be confused
//! across scopes, and the provider key. (The Redis key names are the Redis store's.)

use sha2::{Digest, Sha256};

/// One action of one scope. `key` is the idempotency key when the request gave one, else the
/// fingerprint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
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

    /// A stable key for the downstream provider's own idempotency check: the same for every
    /// attempt of this action, different for every other action, at most 43 characters.
    pub fn provider_key(&self) -> String {
        let mut hasher = Sha256::new();
        hasher.update(b"oncegate-provider-key\0");
        hasher.update(self.encode());
        format!("og-{}", hex::encode(&hasher.finalize()[..20]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_that_look_alike_when_joined_are_different_keys() {
        let a = ActionKey::new("a::b", "c", "k");
        let b = ActionKey::new("a", "b::c", "k");
        assert_ne!(a.encode(), b.encode());
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
}
