//! The embedded store's receipt chains: one entry per recorded completion, keyed
//! `agent (u32 length ++ bytes) ++ seq (u64, big-endian)`, appended and signed inside the write
//! transaction of the completion itself, so a chain can neither fork nor miss a completion.

use redb::{ReadableTable, Table, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::{Receipts, source_name};
use oncegate_domain::{
    ActionKey,
    ledger::Completion,
    statement::receipt::{ChainEntry, ReceiptCore, receipt_digest},
};

/// agent prefix ++ seq → entry (MessagePack).
pub(super) const RECEIPTS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("receipts");

/// One stored entry.
#[derive(Serialize, Deserialize)]
struct Stored {
    core: ReceiptCore,
    statement: String,
}

fn prefix(agent_id: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + agent_id.len() + 8);
    out.extend_from_slice(&(agent_id.len() as u32).to_be_bytes());
    out.extend_from_slice(agent_id.as_bytes());
    out
}

fn entry_key(agent_id: &str, seq: u64) -> Vec<u8> {
    let mut out = prefix(agent_id);
    out.extend_from_slice(&seq.to_be_bytes());
    out
}

fn corrupt(e: impl std::fmt::Display) -> redb::Error {
    redb::Error::Corrupted(format!("a receipt chain entry: {e}"))
}

/// Reads the last entry of the chain of the agent of `encoded_key` (failing when it cannot be
/// read), so that a step knows before it writes anything that it can append.
pub(super) fn check_tail(
    table: &impl ReadableTable<&'static [u8], &'static [u8]>,
    encoded_key: &[u8],
) -> Result<(), redb::Error> {
    let key = ActionKey::decode(encoded_key).ok_or_else(|| corrupt("undecodable action key"))?;
    tail(table, &key.agent_id).map(drop)
}

/// The core of the last entry of `agent_id`'s chain, if any.
fn tail(
    table: &impl ReadableTable<&'static [u8], &'static [u8]>,
    agent_id: &str,
) -> Result<Option<ReceiptCore>, redb::Error> {
    let start = entry_key(agent_id, 0);
    let end = entry_key(agent_id, u64::MAX);
    match table.range(start.as_slice()..=end.as_slice())?.next_back() {
        Some(entry) => {
            let stored: Stored = rmp_serde::from_slice(entry?.1.value()).map_err(corrupt)?;
            Ok(Some(stored.core))
        }
        None => Ok(None),
    }
}

/// Appends a just-recorded completion to its agent's chain and signs it: the completion gets its
/// place (`seq`) and its statement. `fingerprint` is the record's request hash. Returns the entry
/// written (key and bytes), for the write-ahead log.
pub(super) fn append(
    table: &mut Table<&[u8], &[u8]>,
    signer: &Receipts,
    encoded_key: &[u8],
    fingerprint: &str,
    completion: &mut Completion,
) -> Result<(Vec<u8>, Vec<u8>), redb::Error> {
    let key = ActionKey::decode(encoded_key).ok_or_else(|| corrupt("undecodable action key"))?;
    let previous = tail(table, &key.agent_id)?;
    let core = ReceiptCore {
        seq: previous.as_ref().map_or(1, |p| p.seq + 1),
        agent: key.agent_id.clone(),
        run: key.run_id,
        key: key.key,
        fingerprint: fingerprint.to_owned(),
        receipt_digest: receipt_digest(&completion.receipt),
        fencing: completion.fencing,
        source: source_name(completion.source).into(),
        completed_at: completion.completed_at,
    };
    let statement = signer.sign_receipt(&core, previous.as_ref());
    completion.seq = core.seq;
    completion.statement = statement.clone();
    let bytes = rmp_serde::to_vec(&Stored { core, statement }).map_err(corrupt)?;
    let entry = entry_key(&key.agent_id, completion.seq);
    table.insert(entry.as_slice(), bytes.as_slice())?;
    Ok((entry, bytes))
}

/// Up to `limit` entries of an agent's chain after `after` (0: from the start).
pub(super) fn export(
    table: &impl ReadableTable<&'static [u8], &'static [u8]>,
    agent_id: &str,
    after: u64,
    limit: usize,
) -> Result<Vec<ChainEntry>, redb::Error> {
    let start = entry_key(agent_id, after.saturating_add(1));
    let end = entry_key(agent_id, u64::MAX);
    let mut out = Vec::new();
    for entry in table.range(start.as_slice()..=end.as_slice())?.take(limit) {
        let stored: Stored = rmp_serde::from_slice(entry?.1.value()).map_err(corrupt)?;
        out.push(ChainEntry {
            core: stored.core,
            statement: stored.statement,
        });
    }
    Ok(out)
}
