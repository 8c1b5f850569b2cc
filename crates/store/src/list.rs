//! Listing unresolved actions (ListUnresolved): the page type and the cursor both stores share.
//!
//! Both stores keep one lease index per agent ordered by `(lease expiry, encoded action key)`
//! and list agents in id order, so a page is the next entries after a cursor in the order
//! `(agent_id, lease_expires_at, encoded key)`. The cursor is opaque to clients (base64url).

use base64::Engine as _;

use oncegate_domain::{
    ActionKey,
    ledger::{ActionView, Asked, Millis},
};

/// Where a listing resumes: strictly after this position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListCursor {
    pub agent_id: String,
    pub lease_expires_at: Millis,
    /// [`ActionKey::encode`] of the last entry examined.
    pub key: Vec<u8>,
}

impl ListCursor {
    /// The position of an entry (resume after it).
    pub fn after(key: &ActionKey, lease_expires_at: Millis) -> Self {
        Self {
            agent_id: key.agent_id.clone(),
            lease_expires_at,
            key: key.encode(),
        }
    }

    /// The position before every entry of `agent_id`.
    pub fn start_of(agent_id: &str) -> Self {
        Self {
            agent_id: agent_id.to_owned(),
            lease_expires_at: Millis::MIN,
            key: Vec::new(),
        }
    }

    /// The opaque page token.
    pub fn encode(&self) -> String {
        let mut out = Vec::with_capacity(self.agent_id.len() + self.key.len() + 12);
        out.extend_from_slice(&(self.agent_id.len() as u32).to_be_bytes());
        out.extend_from_slice(self.agent_id.as_bytes());
        out.extend_from_slice(&self.lease_expires_at.to_be_bytes());
        out.extend_from_slice(&self.key);
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(out)
    }

    /// Parses a page token; `None` when it is not one.
    pub fn decode(token: &str) -> Option<Self> {
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token)
            .ok()?;
        let len = u32::from_be_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
        let agent = bytes.get(4..4usize.checked_add(len)?)?;
        let rest = &bytes[4 + len..];
        let lease = Millis::from_be_bytes(rest.get(..8)?.try_into().ok()?);
        Some(Self {
            agent_id: String::from_utf8(agent.to_vec()).ok()?,
            lease_expires_at: lease,
            key: rest[8..].to_vec(),
        })
    }

    /// Whether the entry `(lease, key)` of this cursor's agent comes after the cursor.
    pub fn is_before(&self, lease_expires_at: Millis, key: &[u8]) -> bool {
        (self.lease_expires_at, self.key.as_slice()) < (lease_expires_at, key)
    }
}

/// One action whose lease expired without Complete or Release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unresolved {
    pub key: ActionKey,
    /// Its record as GetAction would show it (state EXPIRED).
    pub view: ActionView,
    /// What its latest grant was asked for: the action type and params (empty for records
    /// written before they were kept).
    pub asked: Asked,
}

/// A page of unresolved actions.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Page {
    pub items: Vec<Unresolved>,
    /// Where the next page starts; `None` when the listing is complete.
    pub next: Option<ListCursor>,
}

/// How many index entries one listing call examines at most, for a page of `limit`: stale
/// entries are skipped, so a page may come back short with a cursor rather than scan forever.
pub fn scan_budget(limit: usize) -> usize {
    limit.saturating_mul(4).saturating_add(256)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_reject_garbage() {
        for c in [
            ListCursor::start_of("a"),
            ListCursor::after(&ActionKey::new("x:y", "r", "k"), 1_700_000_000_000),
            ListCursor::start_of(""),
        ] {
            assert_eq!(ListCursor::decode(&c.encode()), Some(c));
        }
        assert_eq!(ListCursor::decode("!!"), None);
        assert_eq!(ListCursor::decode("AAAA"), None);
        assert_eq!(ListCursor::decode("_____wAA"), None);
    }
}
