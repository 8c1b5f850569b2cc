//! The embedded store's receipt chains: one entry per recorded completion, keyed
//! `agent (u32 length ++ bytes) ++ seq (u64, big-endian)`, appended inside the write transaction
//! of the completion itself, so a chain can neither fork nor miss a completion. Each agent's last
//! entry of a group commit is its *head*: signed once, in the same transaction, before the batch
//! is made durable ([`Batch::seal`]), so every committed entry is covered by a signed head and a
//! crash leaves nothing unsigned.
//!
//! Per batch, each agent's stored tail is read once; the batch's entries are linked in memory
//! (each digest computed once) and written once, with their statements, when the batch is sealed.

use std::collections::HashMap;

use redb::{ReadableTable, Table, TableDefinition};
use serde::{Deserialize, Serialize};

use super::wal;
use crate::{Receipts, source_name};
use oncegate_domain::{
    ActionKey,
    ledger::Completion,
    statement::receipt::{ChainEntry, FIRST_PREV, ReceiptCore, receipt_digest, sign_heads},
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
    /// walking the chain. Empty in entries written before the chain linked each entry to the one
    /// before it (`prev`).
    #[serde(default)]
    digest: String,
}

/// The entries one group commit appended, per agent, to be sealed and stored before the commit.
#[derive(Default)]
pub(super) struct Batch {
    runs: HashMap<String, Run>,
}

/// One agent's chain in the batch: where it stood before the batch, and the entries appended.
struct Run {
    /// The first append's signer (every call of one gate carries the same one).
    signer: Option<Receipts>,
    /// The seq and digest of the entry before the run (0 and [`FIRST_PREV`]: none).
    before: (u64, String),
    /// (table key, entry), in chain order; stored by [`Batch::seal`], each written once.
    entries: Vec<(Vec<u8>, Stored)>,
}

impl Run {
    /// The seq and digest the next entry follows.
    fn tail(&self) -> (u64, &str) {
        match self.entries.last() {
            Some((_, last)) => (last.core.seq, &last.digest),
            None => (self.before.0, &self.before.1),
        }
    }
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
    /// Reads, once per batch, the last stored entry of the chain of the agent of `encoded_key`
    /// (failing when it cannot be read), so that a step knows before it writes anything that it
    /// can append, and its append links to it without reading it again.
    pub(super) fn check_tail(
        &mut self,
        table: &impl ReadableTable<&'static [u8], &'static [u8]>,
        encoded_key: &[u8],
    ) -> Result<(), redb::Error> {
        let key =
            ActionKey::decode(encoded_key).ok_or_else(|| corrupt("undecodable action key"))?;
        self.run(table, key.agent_id).map(drop)
    }

    /// The batch's run of `agent_id`'s chain, begun from its stored tail on first use.
    fn run(
        &mut self,
        table: &impl ReadableTable<&'static [u8], &'static [u8]>,
        agent_id: String,
    ) -> Result<&mut Run, redb::Error> {
        use std::collections::hash_map::Entry;
        Ok(match self.runs.entry(agent_id) {
            Entry::Occupied(run) => run.into_mut(),
            Entry::Vacant(vacant) => {
                let before = tail(table, vacant.key())?
                    .map_or_else(|| (0, FIRST_PREV.to_owned()), |t| (t.core.seq, t.digest));
                vacant.insert(Run {
                    signer: None,
                    before,
                    entries: Vec::new(),
                })
            }
        })
    }

    /// Appends a just-recorded completion to its agent's chain: the completion gets its place
    /// (`seq`); its statement comes with the batch's head ([`Batch::seal`]), so the completion
    /// itself carries none. `fingerprint` is the record's request hash.
    pub(super) fn append(
        &mut self,
        table: &impl ReadableTable<&'static [u8], &'static [u8]>,
        signer: &Receipts,
        encoded_key: &[u8],
        fingerprint: &str,
        completion: &mut Completion,
    ) -> Result<(), redb::Error> {
        let key =
            ActionKey::decode(encoded_key).ok_or_else(|| corrupt("undecodable action key"))?;
        let entry = |seq| entry_key(&key.agent_id, seq);
        let run = self.run(table, key.agent_id.clone())?;
        let (last, prev) = run.tail();
        let core = ReceiptCore {
            seq: last + 1,
            agent: key.agent_id.clone(),
            run: key.run_id,
            key: key.key,
            fingerprint: fingerprint.to_owned(),
            receipt_digest: receipt_digest(&completion.receipt),
            fencing: completion.fencing,
            source: source_name(completion.source).into(),
            completed_at: completion.completed_at,
        };
        let digest = core.digest(prev);
        completion.seq = core.seq;
        completion.statement = String::new();
        run.signer.get_or_insert_with(|| signer.clone());
        run.entries.push((
            entry(core.seq),
            Stored {
                core,
                statement: String::new(),
                digest,
            },
        ));
        Ok(())
    }

    /// Signs each agent's head (its last entry of the batch, linked to the entries before it and
    /// listing their digests), stores every appended entry, and hands them to the write-ahead log.
    /// The batch is empty afterwards.
    pub(super) fn seal(
        &mut self,
        table: &mut Table<&[u8], &[u8]>,
        writes: &mut Vec<wal::Entry>,
    ) -> Result<(), redb::Error> {
        for (_, run) in self.runs.drain() {
            let (Some(signer), false) = (&run.signer, run.entries.is_empty()) else {
                continue;
            };
            let linked: Vec<(&ReceiptCore, &str)> = run
                .entries
                .iter()
                .map(|(_, s)| (&s.core, s.digest.as_str()))
                .collect();
            let heads = sign_heads(signer.as_ref(), &run.before.1, &linked);
            let mut entries = run.entries;
            for (i, statement) in heads {
                entries[i].1.statement = statement;
            }
            for (key, stored) in entries {
                let bytes = rmp_serde::to_vec(&stored).map_err(corrupt)?;
                table.insert(key.as_slice(), bytes.as_slice())?;
                writes.push(wal::Entry::receipt(key, bytes));
            }
        }
        Ok(())
    }

    /// Whether entries wait to be sealed.
    pub(super) fn is_empty(&self) -> bool {
        self.runs.values().all(|run| run.entries.is_empty())
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
