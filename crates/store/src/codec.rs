//! How a record is kept, in the embedded store's file and in PostgreSQL's `bytea` alike: the
//! ledger's [`Record`] as MessagePack, so that both stores read and write one format (and a
//! record moved from one to the other means the same). The errors name the action, so that a
//! store answers that action `Corrupt` and serves the others. Redis keeps its records in a hash
//! of its own (its scripts read the fields).

use oncegate_domain::{ActionKey, ledger::Record};

/// The record stored under `key` (an encoded action key); the error names the action.
pub fn decode(key: &[u8], bytes: &[u8]) -> Result<Record, String> {
    rmp_serde::from_slice(bytes).map_err(|e| format!("the record of {}: {e}", describe(key)))
}

/// The bytes of `record`.
pub fn encode(record: &Record) -> Result<Vec<u8>, String> {
    rmp_serde::to_vec(record).map_err(|e| format!("encoding a record: {e}"))
}

/// An encoded action key as an operator reads it.
pub fn describe(key: &[u8]) -> String {
    match ActionKey::decode(key) {
        Some(k) => format!(
            "agent {:?}, run {:?}, key {:?}",
            k.agent_id, k.run_id, k.key
        ),
        None => format!("an undecodable action key ({} bytes)", key.len()),
    }
}
