//! The operator transitions on Redis: an external completion, the settlement of an expired lease,
//! and the listing of unresolved actions (in [`super::listing`]).

use super::{Decoded, Extra, Ran, RedisStore, confirmed, listing, unexpected};
use crate::{ListCursor, Page, Receipts, Reply, StoreError};
use oncegate_domain::{
    ActionKey,
    ledger::{
        CompleteOutcome, ExternalCompletion, ReceiptFormat, Resolution, Resolved, refuse_reused,
    },
    statement::receipt::receipt_digest,
};

impl RedisStore {
    /// An operator's completion, held to the durability level like a Complete: a repeated one
    /// (`recorded = false`) first rewrites the record's expiry unchanged, so `WAIT` covers the
    /// original write too.
    pub async fn record_external(
        &self,
        key: &ActionKey,
        ext: &ExternalCompletion,
        replicas: u32,
        receipts: Option<&Receipts>,
    ) -> Result<Reply<CompleteOutcome>, StoreError> {
        let (fp, digests, retention, sliding) = match &ext.request {
            Some(r) => (
                r.fingerprint.as_str(),
                r.digests.as_str(),
                r.retention.to_string(),
                r.sliding,
            ),
            None => ("", "", "0".to_owned(), false),
        };
        let written = &ext.written;
        let digest = receipts
            .map(|_| receipt_digest(&written.receipt))
            .unwrap_or_default();
        let args: [&[u8]; 10] = [
            &written.receipt,
            written.note.as_bytes(),
            written.operator.as_bytes(),
            if ext.request.is_some() { b"1" } else { b"0" },
            fp.as_bytes(),
            digests.as_bytes(),
            retention.as_bytes(),
            if sliding { b"1" } else { b"0" },
            digest.as_bytes(),
            format_arg(written.format),
        ];
        let wait = self.wait_for(replicas);
        let Ran {
            now,
            decoded,
            mut acknowledged,
        } = self
            .run(
                &self.scripts.record_external,
                key,
                &[Extra::Receipts],
                &args,
                wait,
            )
            .await?;
        if let Decoded::Completed {
            recorded, chained, ..
        } = &decoded
        {
            if let (Some(signer), true) = (receipts, *chained) {
                self.mark_unsealed(&key.agent_id, signer);
            }
            if !*recorded {
                acknowledged = self.sync(key, wait, acknowledged).await?;
            }
            confirmed(wait, acknowledged, "operator completion")?;
        }
        let result = match decoded {
            Decoded::Completed {
                completion,
                recorded,
                double_execution,
                ..
            } => Ok(CompleteOutcome {
                completion,
                recorded,
                double_execution,
            }),
            Decoded::KeyReused(stored) => Err(refuse_reused(&stored, digests)),
            Decoded::Refused(refusal) => Err(refusal),
            other => return Err(unexpected("record_external", &other)),
        };
        Ok(Reply {
            now,
            result,
            replicas: acknowledged,
        })
    }

    /// An operator's settlement of an expired lease, held to the durability level like a Complete.
    pub async fn resolve_expired(
        &self,
        key: &ActionKey,
        resolution: &Resolution,
        expected: Option<u64>,
        replicas: u32,
        receipts: Option<&Receipts>,
    ) -> Result<Reply<Resolved>, StoreError> {
        let digest = match (resolution, receipts) {
            (Resolution::Completed(written), Some(_)) => receipt_digest(&written.receipt),
            _ => String::new(),
        };
        let expected = expected.map(|f| f.to_string()).unwrap_or_default();
        let args: [&[u8]; 7] = match resolution {
            Resolution::Completed(written) => [
                b"completed",
                &written.receipt,
                written.note.as_bytes(),
                written.operator.as_bytes(),
                digest.as_bytes(),
                format_arg(written.format),
                expected.as_bytes(),
            ],
            Resolution::Failed => [b"failed", b"", b"", b"", b"", b"0", expected.as_bytes()],
        };
        let wait = self.wait_for(replicas);
        let Ran {
            now,
            decoded,
            acknowledged,
        } = self
            .run(
                &self.scripts.resolve_expired,
                key,
                &[Extra::Receipts, Extra::Budgets],
                &args,
                wait,
            )
            .await?;
        if let (Some(signer), Decoded::Completed { chained: true, .. }) = (receipts, &decoded) {
            self.mark_unsealed(&key.agent_id, signer);
        }
        if !matches!(decoded, Decoded::Refused(_)) {
            confirmed(wait, acknowledged, "resolution")?;
        }
        let result = match decoded {
            Decoded::Completed { completion, .. } => Ok(Resolved::Completed(completion)),
            Decoded::Released(fencing) => Ok(Resolved::Released { fencing }),
            Decoded::Refused(refusal) => Err(refusal),
            other => return Err(unexpected("resolve_expired", &other)),
        };
        Ok(Reply {
            now,
            result,
            replicas: acknowledged,
        })
    }

    pub async fn list_unresolved(
        &self,
        agent_id: Option<&str>,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Reply<Page>, StoreError> {
        listing::list(self, agent_id, after, limit).await
    }
}

/// A receipt format as the scripts take it (the RECEIPT_FORMAT slot of prelude.lua).
fn format_arg(format: ReceiptFormat) -> &'static [u8] {
    match format {
        ReceiptFormat::Unspecified => b"0",
        ReceiptFormat::Json => b"1",
        ReceiptFormat::Text => b"2",
    }
}
