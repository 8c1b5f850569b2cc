//! The byte layouts of the embedded store's index keys, shared by the record indexes
//! ([`super::index`]) and the approval index ([`super::side`]): `expires_at ++ key` for expiry,
//! `agent (u32 length ++ bytes) ++ ordered millis ++ key` for the per-agent lease and approval
//! indexes.

use oncegate_domain::ledger::Millis;

/// The expiry-index entry of a record expiring `expires_at`.
pub(super) fn expiry_key(expires_at: Millis, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + key.len());
    out.extend_from_slice(&expires_at.to_be_bytes());
    out.extend_from_slice(key);
    out
}

/// The agent prefix of a lease-index entry: `u32 length ++ agent bytes`.
pub(super) fn agent_prefix(agent_id: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + agent_id.len());
    out.extend_from_slice(&(agent_id.len() as u32).to_be_bytes());
    out.extend_from_slice(agent_id);
    out
}

/// Millis as big-endian bytes that sort like the numbers (sign bit flipped).
pub(super) fn ordered(ms: Millis) -> [u8; 8] {
    ((ms as u64) ^ (1 << 63)).to_be_bytes()
}

pub(super) fn lease_entry(agent_id: &[u8], lease_expires_at: Millis, key: &[u8]) -> Vec<u8> {
    let mut out = agent_prefix(agent_id);
    out.extend_from_slice(&ordered(lease_expires_at));
    out.extend_from_slice(key);
    out
}

/// Splits a lease-index entry into (agent, lease_expires_at, action key).
pub(super) fn split_entry(entry: &[u8]) -> Option<(&[u8], Millis, &[u8])> {
    let len = u32::from_be_bytes(entry.get(..4)?.try_into().ok()?) as usize;
    let agent = entry.get(4..4 + len)?;
    let lease: [u8; 8] = entry.get(4 + len..12 + len)?.try_into().ok()?;
    let lease = (u64::from_be_bytes(lease) ^ (1 << 63)) as Millis;
    Some((agent, lease, &entry[12 + len..]))
}
