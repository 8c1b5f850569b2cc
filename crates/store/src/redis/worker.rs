//! The worker transitions on Redis: RequestToken, Complete, Release, ExtendLease and GetAction,
//! each one script call, held to the durability level (`WAIT`) before it is acknowledged.

use super::{Decoded, Extra, Ran, RedisStore, confirmed, unexpected};
use crate::{Receipts, Reply, StoreError};
use oncegate_domain::{
    ActionKey,
    ledger::{
        ActionView, CompleteOutcome, GrantKind, Millis, OnExpiry, TokenOutcome, TokenRequest,
        refuse_reused,
    },
    statement::receipt::receipt_digest,
};

impl RedisStore {
    /// RequestToken; a grant is handed out only once `replicas` replicas (or the deployment's
    /// level, if higher) confirmed it. Otherwise UNAVAILABLE: the record stays AUTHORIZED until
    /// its lease ends, and nobody holds its token.
    pub async fn request_token(
        &self,
        key: &ActionKey,
        req: &TokenRequest,
        replicas: u32,
    ) -> Result<Reply<TokenOutcome>, StoreError> {
        let (lease, retention) = (req.lease.to_string(), req.retention.to_string());
        let max_superseded = req.max_superseded.to_string();
        let on_expiry = match req.on_expiry {
            OnExpiry::Reconcile => "reconcile",
            OnExpiry::Regrant => "regrant",
        };
        let (hold, charges) = authorization_args(req)?;
        let args: [&[u8]; 14] = [
            req.fingerprint.as_bytes(),
            req.digests.as_bytes(),
            req.holder.as_bytes(),
            req.new_token.as_bytes(),
            lease.as_bytes(),
            retention.as_bytes(),
            if req.sliding { b"1" } else { b"0" },
            on_expiry.as_bytes(),
            req.principal.as_bytes(),
            max_superseded.as_bytes(),
            &hold,
            &charges,
            req.asked.action.as_bytes(),
            req.asked.params.as_bytes(),
        ];
        // The budgets and approval keys only when the request carries a hold or charges: the
        // plain path passes what it always did.
        let extra: &[Extra] = if req.hold.is_some() || !req.charges.is_empty() {
            &[Extra::Budgets, Extra::Approval, Extra::Approvals]
        } else {
            &[]
        };
        let wait = self.wait_for(replicas);
        let Ran {
            now,
            decoded,
            mut acknowledged,
        } = self
            .run(&self.scripts.request_token, key, extra, &args, wait)
            .await?;
        if let Decoded::Granted { opened: true, .. } = decoded {
            self.remember_agent(&key.agent_id);
        }
        let result = match decoded {
            Decoded::Granted { grant, kind, .. } => {
                if kind == GrantKind::Redelivered {
                    acknowledged = self.sync(key, wait, acknowledged).await?;
                }
                confirmed(wait, acknowledged, "grant")?;
                Ok(TokenOutcome::Granted(grant, kind))
            }
            Decoded::Completed { completion, .. } => Ok(TokenOutcome::AlreadyCompleted(completion)),
            Decoded::Pending(pending) => Ok(TokenOutcome::PendingApproval(pending)),
            Decoded::KeyReused(stored) => Err(refuse_reused(&stored, &req.digests)),
            Decoded::Refused(refusal) => Err(refusal),
            other => return Err(unexpected("request_token", &other)),
        };
        Ok(Reply {
            now,
            result,
            replicas: acknowledged,
        })
    }

    /// Complete; acknowledged only once enough replicas confirmed the completion (a repeated
    /// Complete checks the stored one), else UNAVAILABLE so that the worker retries it. With
    /// `receipts`, a recorded completion is chained in the same script, and its agent's chain
    /// marked for the next seal.
    pub async fn complete(
        &self,
        key: &ActionKey,
        token: &str,
        receipt: &[u8],
        replicas: u32,
        receipts: Option<&Receipts>,
    ) -> Result<Reply<CompleteOutcome>, StoreError> {
        let wait = self.wait_for(replicas);
        let digest = receipts
            .map(|_| receipt_digest(receipt))
            .unwrap_or_default();
        let Ran {
            now,
            decoded,
            mut acknowledged,
        } = self
            .run(
                &self.scripts.complete,
                key,
                &[Extra::Receipts],
                &[token.as_bytes(), receipt, digest.as_bytes()],
                wait,
            )
            .await?;
        let result = match decoded {
            Decoded::Completed {
                completion,
                recorded,
                double_execution,
                chained,
            } => {
                if let (Some(signer), true) = (receipts, chained) {
                    self.mark_unsealed(&key.agent_id, signer);
                }
                if !recorded {
                    acknowledged = self.sync(key, wait, acknowledged).await?;
                }
                confirmed(wait, acknowledged, "completion")?;
                Ok(CompleteOutcome {
                    completion,
                    recorded,
                    double_execution,
                })
            }
            Decoded::Refused(refusal) => Err(refusal),
            other => return Err(unexpected("complete", &other)),
        };
        Ok(Reply {
            now,
            result,
            replicas: acknowledged,
        })
    }

    /// Release, acknowledged once enough replicas confirmed it.
    pub async fn release(
        &self,
        key: &ActionKey,
        token: &str,
        replicas: u32,
    ) -> Result<Reply<u64>, StoreError> {
        let wait = self.wait_for(replicas);
        let Ran {
            now,
            decoded,
            acknowledged,
        } = self
            .run(
                &self.scripts.release,
                key,
                &[Extra::Budgets],
                &[token.as_bytes()],
                wait,
            )
            .await?;
        let result = match decoded {
            Decoded::Released(fencing) => {
                confirmed(wait, acknowledged, "release")?;
                Ok(fencing)
            }
            Decoded::Refused(refusal) => Err(refusal),
            other => return Err(unexpected("release", &other)),
        };
        Ok(Reply {
            now,
            result,
            replicas: acknowledged,
        })
    }

    /// ExtendLease, acknowledged once enough replicas confirmed it (a lost extension would let
    /// the lease end early on the new master after a failover).
    pub async fn extend_lease(
        &self,
        key: &ActionKey,
        token: &str,
        ttl: Millis,
        replicas: u32,
    ) -> Result<Reply<Millis>, StoreError> {
        let wait = self.wait_for(replicas);
        let ttl = ttl.to_string();
        let Ran {
            now,
            decoded,
            acknowledged,
        } = self
            .run(
                &self.scripts.extend_lease,
                key,
                &[],
                &[token.as_bytes(), ttl.as_bytes()],
                wait,
            )
            .await?;
        let result = match decoded {
            Decoded::Extended(at) => {
                confirmed(wait, acknowledged, "lease extension")?;
                Ok(at)
            }
            Decoded::Refused(refusal) => Err(refusal),
            other => return Err(unexpected("extend_lease", &other)),
        };
        Ok(Reply {
            now,
            result,
            replicas: acknowledged,
        })
    }

    pub async fn get(&self, key: &ActionKey) -> Result<Reply<ActionView>, StoreError> {
        let Ran { now, decoded, .. } = self.run(&self.scripts.get, key, &[], &[], None).await?;
        match decoded {
            Decoded::View(view) => Ok(Reply {
                now,
                result: Ok(view),
                replicas: 0,
            }),
            other => Err(unexpected("get", &other)),
        }
    }
}

/// The hold and the charges of a request as the script takes them: MessagePack arrays (what
/// `cmsgpack.unpack` reads as Lua arrays); empty for none.
fn authorization_args(req: &TokenRequest) -> Result<(Vec<u8>, Vec<u8>), StoreError> {
    fn pack<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, StoreError> {
        rmp_serde::to_vec(value).map_err(|e| StoreError::corrupt_by("packing", e))
    }
    let hold = match &req.hold {
        Some(h) => pack(&(&h.policy, &h.reason, &h.new_id, h.ttl, &h.action, &h.params))?,
        None => Vec::new(),
    };
    let charges = if req.charges.is_empty() {
        Vec::new()
    } else {
        let rows: Vec<_> = req
            .charges
            .iter()
            .map(|c| {
                (
                    &c.bucket, &c.budget, &c.action, &c.group, c.limit, c.window, c.amount,
                )
            })
            .collect();
        pack(&rows)?
    };
    Ok((hold, charges))
}
