//! How the embedded store keeps a record: the ledger's [`Record`] as MessagePack. A record that
//! cannot be read is reported as `redb::Error::Corrupted` naming its action, so that the writer
//! answers that action `Corrupt` and goes on with the others.

use oncegate_domain::{ActionKey, ledger::Record};

/// The record stored under `key` (an encoded action key).
pub(super) fn decode(key: &[u8], bytes: &[u8]) -> Result<Record, redb::Error> {
    rmp_serde::from_slice(bytes)
        .map_err(|e| redb::Error::Corrupted(format!("the record of {}: {e}", describe(key))))
}

/// The bytes of `record`.
pub(super) fn encode(record: &Record) -> Result<Vec<u8>, redb::Error> {
    rmp_serde::to_vec(record).map_err(|e| redb::Error::Corrupted(format!("encoding a record: {e}")))
}

/// An encoded action key as an operator reads it.
pub(super) fn describe(key: &[u8]) -> String {
    match ActionKey::decode(key) {
        Some(k) => format!(
            "agent {:?}, run {:?}, key {:?}",
            k.agent_id, k.run_id, k.key
        ),
        None => format!("an undecodable action key ({} bytes)", key.len()),
    }
}
