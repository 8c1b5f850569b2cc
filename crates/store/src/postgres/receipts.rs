//! The PostgreSQL store's receipt chains: one row per entry (`agent`, `seq`), appended in the
//! transaction of the completion itself, under the agent's lock, so a chain can neither fork nor
//! miss a completion. Every entry is signed as the chain's head in that transaction, before
//! COMMIT (as the embedded store signs each group commit's heads), so every committed entry is
//! covered by a signed head and nothing waits for a sealing pass. One signature per completion:
//! the embedded store's group commit can share one among several, Redis seals off the call's path.
//!
//! An entry is stored as the embedded store stores it (core, statement, digest, MessagePack).

use serde::{Deserialize, Serialize};
use tokio_postgres::Row;

use super::connection::Failure;
use crate::{Receipts, source_name};
use oncegate_domain::{
    ActionKey,
    ledger::{self, Completion, Phase, Write},
    statement::receipt::{ChainEntry, FIRST_PREV, ReceiptCore, receipt_digest, sign_heads},
};

/// The last entry of an agent's chain.
pub(super) const TAIL: &str =
    "SELECT entry FROM oncegate_receipts WHERE agent = $1 ORDER BY seq DESC LIMIT 1";
/// A new entry.
pub(super) const PUT: &str = "INSERT INTO oncegate_receipts (agent, seq, entry) VALUES ($1, $2, $3)";
/// Entries after a seq, in chain order.
pub(super) const EXPORT: &str = "SELECT entry FROM oncegate_receipts WHERE agent = $1 AND seq > $2 \
                                 ORDER BY seq LIMIT $3";

/// One stored entry.
#[derive(Serialize, Deserialize)]
struct Stored {
    core: ReceiptCore,
    /// The signed head's statement (every entry this store writes is one).
    statement: String,
    /// The entry's digest ([`ReceiptCore::digest`]), so the next append links without a walk.
    #[serde(default)]
    digest: String,
}

/// Where a chain stands: the last entry's seq and digest (0 and [`FIRST_PREV`]: empty).
pub(super) struct Tail {
    seq: u64,
    digest: String,
}

fn decode(bytes: &[u8]) -> Result<Stored, Failure> {
    rmp_serde::from_slice(bytes).map_err(|e| Failure::Corrupt(format!("a receipt chain entry: {e}")))
}

/// The tail from [`TAIL`]'s rows.
pub(super) fn tail_of(rows: Vec<Row>) -> Result<Tail, Failure> {
    match rows.into_iter().next() {
        Some(row) => {
            let stored = decode(&row.try_get::<_, Vec<u8>>(0)?)?;
            Ok(Tail {
                seq: stored.core.seq,
                digest: stored.digest,
            })
        }
        None => Ok(Tail {
            seq: 0,
            digest: FIRST_PREV.to_owned(),
        }),
    }
}

/// Appends the completion a step records to its agent's chain and signs it as the head: the
/// completion (and the record being written) get its place; returns (seq, stored entry) to
/// insert with the step's writes.
pub(super) fn append(
    tail: &Tail,
    signer: &Receipts,
    key: &ActionKey,
    write: &mut Write,
    completion: &mut Completion,
) -> Result<(i64, Vec<u8>), Failure> {
    let Write::Put(record) = write else {
        return Err(Failure::Corrupt(
            "a recorded completion without a write".into(),
        ));
    };
    let core = ReceiptCore {
        seq: tail.seq + 1,
        agent: key.agent_id.clone(),
        run: key.run_id.clone(),
        key: key.key.clone(),
        fingerprint: record.fingerprint.clone(),
        receipt_digest: receipt_digest(&completion.receipt),
        fencing: completion.fencing,
        source: source_name(completion.source).into(),
        completed_at: completion.completed_at,
    };
    let digest = core.digest(&tail.digest);
    let statement = sign_heads(signer.as_ref(), &tail.digest, &[(&core, digest.as_str())])
        .pop()
        .map(|(_, s)| s)
        .unwrap_or_default();
    completion.seq = core.seq;
    completion.statement = String::new();
    if let Phase::Completed(stored) = &mut record.phase {
        stored.seq = completion.seq;
        stored.statement = String::new();
    }
    let seq = core.seq as i64;
    let stored = Stored {
        core,
        statement,
        digest,
    };
    let bytes = rmp_serde::to_vec(&stored)
        .map_err(|e| Failure::Corrupt(format!("encoding a receipt chain entry: {e}")))?;
    Ok((seq, bytes))
}

/// Chains the completion a Complete or an operator's completion records, when the call signs.
pub(super) fn record_chained(
    step: &mut ledger::Step<ledger::CompleteOutcome>,
    tail: Option<&Tail>,
    signer: Option<&Receipts>,
    key: &ActionKey,
) -> Result<Option<(i64, Vec<u8>)>, Failure> {
    if let (
        Some(signer),
        Some(tail),
        Ok(ledger::CompleteOutcome {
            recorded: true,
            completion,
            ..
        }),
    ) = (signer, tail, &mut step.reply)
    {
        return append(tail, signer, key, &mut step.write, completion).map(Some);
    }
    Ok(None)
}

/// Chain entries from [`EXPORT`]'s rows.
pub(super) fn entries_of(rows: Vec<Row>) -> Result<Vec<ChainEntry>, Failure> {
    rows.into_iter()
        .map(|row| {
            let stored = decode(&row.try_get::<_, Vec<u8>>(0)?)?;
            Ok(ChainEntry {
                core: stored.core,
                statement: stored.statement,
            })
        })
        .collect()
}
