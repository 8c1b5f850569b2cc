//! The embedded store's use of the shared record format ([`crate::codec`]): a record that cannot
//! be read is reported as `redb::Error::Corrupted` naming its action, so that the writer answers
//! that action `Corrupt` and goes on with the others.

use oncegate_domain::ledger::Record;

/// The record stored under `key` (an encoded action key).
pub(super) fn decode(key: &[u8], bytes: &[u8]) -> Result<Record, redb::Error> {
    crate::codec::decode(key, bytes).map_err(redb::Error::Corrupted)
}

/// The bytes of `record`.
pub(super) fn encode(record: &Record) -> Result<Vec<u8>, redb::Error> {
    crate::codec::encode(record).map_err(redb::Error::Corrupted)
}
