//! The embedded store's receipt chains: one entry per recorded completion, keyed
//! `agent (u32 length ++ bytes) ++ seq (u64, big-endian)`, appended inside the write transaction
//! of the completion itself, so a chain can neither fork nor miss a completion. Each agent's last
//! entry of a group commit is its *head*: signed once, in the same transaction, before the batch
//! is made durable ([`Batch::seal`]), so every committed entry is covered by a signed head and a
//! crash leaves nothing unsigned.

use std::collections::HashMap;

use redb::{ReadableTable, Table, TableDefinition};
use serde::{Deserialize, Serialize};

use super::wal;
use crate::{Receipts, source_name};
use oncegate_domain::{
    ActionKey,
    ledger::Completion,
    statement::receipt::{ChainEntry, FIRST_PREV, ReceiptCore, receipt_digest, seal},
};

/// agent prefix ++ seq → entry (MessagePack).
pub(super) const RECEIPTS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("receipts");

/// One stored entry.
#[derive(Serialize, Deserialize)]
struct Stored {
    core: ReceiptCore,
    /// Empty unless the entry is a signed head.
    statement: String,
    /// The entry's digest ([`ReceiptCore::digest`]), so that the next append links to it without
    /// walking the chain. Empty in entries written before issue 25.
    #[serde(default)]
    digest: String,
}

/// The entries one group commit appended, per agent, to be sealed before the commit.
#[derive(Default)]
pub(super) struct Batch {
    runs: HashMap<String, Run>,
}

/// One agent's entries of the batch.
struct Run {
    signer: Receipts,
    /// The digest of the entry before the run.
    prev: String,
    /// (table key, entry), in chain order.
    entries: Vec<(Vec<u8>, Stored)>,
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

/// The last entry of `agent_id`'s chain, if any.
fn tail(
    table: &impl ReadableTable<&'static [u8], &'static [u8]>,
    agent_id: &str,
) -> Result<Option<Stored>, redb::Error> {
    let start = entry_key(agent_id, 0);
    let end = entry_key(agent_id, u64::MAX);
    match table.range(start.as_slice()..=end.as_slice())?.next_back() {
        Some(entry) => Ok(Some(
            rmp_serde::from_slice(entry?.1.value()).map_err(corrupt)?,
        )),
        None => Ok(None),
    }
}

impl Batch {
    /// Appends a just-recorded completion to its agent's chain: the completion gets its place
    /// (`seq`); its statement comes with the batch's head ([`Batch::seal`]), so the completion
    /// itself carries none. `fingerprint` is the record's request hash.
    pub(super) fn append(
        &mut self,
        table: &mut Table<&[u8], &[u8]>,
        signer: &Receipts,
        encoded_key: &[u8],
        fingerprint: &str,
        completion: &mut Completion,
    ) -> Result<(), redb::Error> {
        let key =
            ActionKey::decode(encoded_key).ok_or_else(|| corrupt("undecodable action key"))?;
        let previous = tail(table, &key.agent_id)?;
        let core = ReceiptCore {
            seq: previous.as_ref().map_or(1, |p| p.core.seq + 1),
            agent: key.agent_id.clone(),
            run: key.run_id,
            key: key.key,
            fingerprint: fingerprint.to_owned(),
            receipt_digest: receipt_digest(&completion.receipt),
            fencing: completion.fencing,
            source: source_name(completion.source).into(),
            completed_at: completion.completed_at,
        };
        let prev = previous.map_or_else(|| FIRST_PREV.to_owned(), |p| p.digest);
        let digest = core.digest(&prev);
        completion.seq = core.seq;
        completion.statement = String::new();
        let entry = entry_key(&key.agent_id, core.seq);
        let stored = Stored {
            core,
            statement: String::new(),
            digest,
        };
        let bytes = rmp_serde::to_vec(&stored).map_err(corrupt)?;
        table.insert(entry.as_slice(), bytes.as_slice())?;
        self.runs
            .entry(key.agent_id)
            .or_insert_with(|| Run {
                signer: signer.clone(),
                prev,
                entries: Vec::new(),
            })
            .entries
            .push((entry, stored));
        Ok(())
    }

    /// Signs each agent's head (its last entry of the batch, linked to the entries before it and
    /// listing their digests), stores it, and hands every appended entry to the write-ahead log.
    pub(super) fn seal(
        self,
        table: &mut Table<&[u8], &[u8]>,
        writes: &mut Vec<wal::Entry>,
    ) -> Result<(), redb::Error> {
        for run in self.runs.into_values() {
            let cores: Vec<ReceiptCore> = run.entries.iter().map(|(_, s)| s.core.clone()).collect();
            let sealed = seal(run.signer.as_ref(), &run.prev, &cores);
            let mut entries = run.entries;
            for (i, statement) in sealed.heads {
                entries[i].1.statement = statement;
            }
            for (key, stored) in entries {
                let bytes = rmp_serde::to_vec(&stored).map_err(corrupt)?;
                if !stored.statement.is_empty() {
                    table.insert(key.as_slice(), bytes.as_slice())?;
                }
                writes.push(wal::Entry::receipt(key, bytes));
            }
        }
        Ok(())
    }
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
