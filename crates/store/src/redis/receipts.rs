//! Receipt chains on Redis. The script that records a completion appends its entry to the agent's
//! chain (`og:{<agent digest>}:receipts`, a list in the agent's slot) in the same atomic step, so
//! concurrent completions of one agent (on any replica) can never fork it or take the same place;
//! that is the call's only script. Lua cannot sign (nor hash with SHA-256), so the gate seals the
//! chain later, off the call's path: the agent is marked, and once per sealing interval
//! ([`RedisOptions::seal_interval`](super::RedisOptions)) a task reads the entries after the chain's
//! seal mark (`og:{<agent digest>}:sealed`, "<seq> <digest>" of the last signed head), computes
//! their digests, signs the last one (a head covers every entry before it) and stores the
//! statement with the new mark (seal.lua, refused if another replica moved the mark meanwhile).
//! ExportReceipts seals the chain first ([`RedisStore::seal_receipts`]). A gate that stops before
//! its next seal leaves the entries after the mark unsigned until a gate seals the chain again.

use std::{collections::HashMap, sync::Mutex};

use redis::Value;

use super::{RedisStore, keys};
use crate::{Receipts, StoreError};
use oncegate_domain::{
    ActionKey,
    ledger::Source,
    statement::receipt::{ChainEntry, MAX_COVERED, ReceiptCore, ReceiptSigner, seal},
};

/// The most entries one seal reads: a longer unsigned run is sealed a page at a time.
const SEAL_PAGE: usize = 4 * (MAX_COVERED + 1);

/// The agents whose chains have entries to seal, and whether a sealing task is running.
#[derive(Default)]
pub(super) struct Sealer {
    state: Mutex<(HashMap<String, Receipts>, bool)>,
}

/// One stored entry as cmsgpack packs it: seq, member, fingerprint, receipt digest, fencing,
/// source, completed_at, statement.
type Packed = (u64, String, String, String, u64, u8, i64, String);

/// Decodes a raw chain entry.
pub(super) fn decode_entry(raw: &[u8]) -> Result<ChainEntry, StoreError> {
    let corrupt = |what: String| StoreError::corrupt(format!("receipt entry: {what}"));
    let (seq, member, fingerprint, receipt_digest, fencing, source, completed_at, statement): Packed =
        rmp_serde::from_slice(raw).map_err(|e| corrupt(e.to_string()))?;
    let key = ActionKey::decode(member.as_bytes()).ok_or_else(|| corrupt("bad member".into()))?;
    let source = match source {
        2 => Source::Operator,
        _ => Source::Worker,
    };
    Ok(ChainEntry {
        core: ReceiptCore {
            seq,
            agent: key.agent_id,
            run: key.run_id,
            key: key.key,
            fingerprint,
            receipt_digest,
            fencing,
            source: crate::source_name(source).into(),
            completed_at,
        },
        statement,
    })
}

impl RedisStore {
    /// Marks `agent_id`'s chain as having entries to seal; the first mark starts a task that seals
    /// every marked chain once per sealing interval, and ends when none is left.
    pub(super) fn mark_unsealed(&self, agent_id: &str, signer: &Receipts) {
        let mut state = self.sealer.state.lock().expect("the sealer's lock");
        if !state.0.contains_key(agent_id) {
            state.0.insert(agent_id.to_owned(), signer.clone());
        }
        if !state.1 {
            state.1 = true;
            let store = self.clone();
            tokio::spawn(async move { store.seal_marked().await });
        }
    }

    /// The sealing task: every interval, seals every chain marked since the last round.
    async fn seal_marked(self) {
        loop {
            tokio::time::sleep(self.options.seal_interval).await;
            let marked = {
                let mut state = self.sealer.state.lock().expect("the sealer's lock");
                if state.0.is_empty() {
                    state.1 = false;
                    return;
                }
                std::mem::take(&mut state.0)
            };
            for (agent_id, signer) in marked {
                if let Err(e) = self.seal_receipts(&agent_id, &signer).await {
                    // Its entries stay unsigned until the chain is sealed again (its next
                    // completion, or an export).
                    tracing::warn!(error = %e, agent_id, "sealing a receipt chain failed");
                }
            }
        }
    }

    /// Seals `agent_id`'s chain now: signs the head of the entries after its seal mark (and more
    /// heads when they are many) and stores them. Another replica sealing it at the same time
    /// makes this one read again.
    pub async fn seal_receipts(&self, agent_id: &str, signer: &Receipts) -> Result<(), StoreError> {
        let agent = keys::Agent::new(agent_id);
        let (chain, mark_key) = (agent.receipts(), agent.sealed());
        loop {
            let mut read = self.scripts.unsealed.key(&chain);
            read.key(&mark_key).arg(SEAL_PAGE);
            let (value, _) = self.call(&read, None).await?;
            // Decoding the entries, digesting each and signing the head take CPU in proportion to
            // the entries since the last seal: done on Tokio's blocking pool, not on the thread
            // that runs the calls (beside a local Redis, the gate's only one).
            let signer = signer.clone();
            let ready = tokio::task::spawn_blocking(move || prepare(value, signer.as_ref()))
                .await
                .unwrap_or_else(|e| match e.try_into_panic() {
                    Ok(panic) => std::panic::resume_unwind(panic),
                    Err(_) => Err(StoreError::unavailable("the gate is shutting down")),
                })?;
            let Some(ready) = ready else {
                return Ok(());
            };
            let mut write = self.scripts.seal.key(&chain);
            write.key(&mark_key).arg(&ready.mark).arg(&ready.new_mark);
            for (seq, statement) in &ready.heads {
                write.arg(seq).arg(statement);
            }
            let (value, _) = self.call(&write, None).await?;
            // 0: another replica sealed meanwhile; read again from its mark.
            if matches!(value, Value::Int(1)) && ready.entries < SEAL_PAGE {
                return Ok(());
            }
        }
    }

    /// Up to `limit` entries of `agent_id`'s chain after entry `after`.
    pub async fn receipts(
        &self,
        agent_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<ChainEntry>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut invocation = self.scripts.receipts.key(keys::receipts(agent_id));
        invocation.arg(after).arg(after + limit as u64 - 1);
        let (value, _) = self.call(&invocation, None).await?;
        let Value::Array(items) = value else {
            return Err(StoreError::corrupt(format!("receipts answered {value:?}")));
        };
        items
            .into_iter()
            .map(|item| match item {
                Value::BulkString(raw) => decode_entry(&raw),
                other => Err(StoreError::corrupt(format!("receipt entry {other:?}"))),
            })
            .collect()
    }
}

/// One seal, ready to store: the mark it moves from and the one it moves to, each head's seq and
/// statement, and how many entries it covers.
struct Ready {
    mark: String,
    new_mark: String,
    heads: Vec<(u64, String)>,
    entries: usize,
}

/// Seals the entries of the unsealed script's answer: decodes them, digests each from the mark's
/// digest on, and signs the heads. None: nothing after the mark.
fn prepare(value: Value, signer: &dyn ReceiptSigner) -> Result<Option<Ready>, StoreError> {
    let (mark, entries) = unsealed(value)?;
    let Some(last) = entries.last().map(|e| e.core.seq) else {
        return Ok(None);
    };
    let cores: Vec<ReceiptCore> = entries.into_iter().map(|e| e.core).collect();
    let prev = mark.split_once(' ').map_or("", |(_, digest)| digest);
    let sealed = seal(signer, prev, &cores);
    Ok(Some(Ready {
        new_mark: format!("{last} {}", sealed.digest),
        heads: (sealed.heads.into_iter())
            .map(|(i, statement)| (cores[i].seq, statement))
            .collect(),
        entries: cores.len(),
        mark,
    }))
}

/// The unsealed script's answer: the seal mark and the entries after it.
fn unsealed(value: Value) -> Result<(String, Vec<ChainEntry>), StoreError> {
    let corrupt = |what: String| StoreError::corrupt(format!("unsealed answered {what}"));
    let Value::Array(items) = value else {
        return Err(corrupt(format!("{value:?}")));
    };
    let mut items = items.into_iter();
    let mark = match items.next() {
        Some(Value::BulkString(raw)) => {
            String::from_utf8(raw).map_err(|e| corrupt(e.to_string()))?
        }
        other => return Err(corrupt(format!("a mark {other:?}"))),
    };
    let entries = items
        .map(|item| match item {
            Value::BulkString(raw) => decode_entry(&raw),
            other => Err(corrupt(format!("an entry {other:?}"))),
        })
        .collect::<Result<_, _>>()?;
    Ok((mark, entries))
}
