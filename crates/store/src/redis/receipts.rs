//! Receipt chains on Redis. The script that records a completion appends its entry to the agent's
//! chain (`og:{<agent digest>}:receipts`, a list in the agent's slot) in the same atomic step and
//! hands back that entry and the one before it; the gate's signer signs the entry linked to the
//! previous one, and [`RedisStore::seal`] stores the statement (seal.lua) with the `WAIT` of the
//! durability level. Lua cannot sign, so the statement comes one round trip later; the chain's
//! order, though, is fixed by the first script alone, so concurrent completions of one agent (on
//! any replica) can never fork it or take the same place.

use redis::Value;

use super::{Decoded, Extra, Ran, RedisStore, keys, unexpected};
use crate::{Receipts, StoreError};
use oncegate_domain::{
    ActionKey,
    ledger::{Completion, Source},
    statement::receipt::{ChainEntry, ReceiptCore},
};

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
    /// Signs the entry a script just appended (linked to the one before it) and stores its
    /// statement, waiting for `wait`'s replicas; the completion gets the statement. Returns how
    /// many replicas confirmed.
    pub(super) async fn seal(
        &self,
        key: &ActionKey,
        completion: &mut Completion,
        (previous, entry): (Vec<u8>, Vec<u8>),
        signer: &Receipts,
        wait: Option<super::Wait>,
    ) -> Result<u32, StoreError> {
        let entry = decode_entry(&entry)?;
        let previous = match previous.is_empty() {
            true => None,
            false => Some(decode_entry(&previous)?),
        };
        let statement = signer.sign_receipt(&entry.core, previous.as_ref().map(|p| &p.core));
        let seq = entry.core.seq.to_string();
        let Ran {
            decoded,
            acknowledged,
            ..
        } = self
            .run(
                &self.scripts.seal,
                key,
                &[Extra::Receipts],
                &[seq.as_bytes(), statement.as_bytes()],
                wait,
            )
            .await?;
        if !matches!(decoded, Decoded::Sealed(true)) {
            return Err(unexpected("seal", &decoded));
        }
        completion.statement = statement;
        Ok(acknowledged)
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
