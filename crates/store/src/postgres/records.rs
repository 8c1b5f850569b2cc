//! The PostgreSQL store's steps on one action: RequestToken, Complete, Release, ExtendLease,
//! GetAction, RecordExternalCompletion, ResolveExpired and an operator's approval decision. Each
//! attempt is one transaction ([`super::steps`]) that runs the ledger function the embedded store
//! runs on what it read.

use super::{
    PostgresStore,
    connection::{Failure, Session, attempt},
    receipts,
    steps::{self, Loaded, Plan, Target, Writes},
};
use crate::{Receipts, Reply, StoreError};
use oncegate_domain::{
    ActionKey,
    ledger::{
        self, ActionView, CompleteOutcome, ExternalCompletion, Millis, Refusal, Resolution,
        Resolved, SideWrite, Step, TokenOutcome, TokenRequest, Write,
        approval::{self, Approval, Decision},
    },
};

/// An action's encoded key and its agent.
struct Action {
    key: ActionKey,
    encoded: Vec<u8>,
}

impl Action {
    fn new(key: &ActionKey) -> Self {
        Self {
            key: key.clone(),
            encoded: key.encode(),
        }
    }

    fn target(&self) -> Target<'_> {
        Target {
            key: &self.encoded,
            agent: &self.key.agent_id,
        }
    }
}

impl PostgresStore {
    /// Commits a step's writes and packages its reply.
    async fn finish<T>(
        &self,
        s: &mut Session,
        action: &Action,
        loaded: &Loaded,
        step: Step<T>,
        chain: Option<(i64, Vec<u8>)>,
    ) -> Result<Reply<T>, Failure> {
        let wrote = !matches!(step.write, Write::Nothing)
            || step.side.approval.is_some()
            || !step.side.buckets.is_empty()
            || chain.is_some();
        let writes = Writes {
            record: step.write,
            side: step.side,
            chain,
        };
        steps::commit(
            s,
            &action.target(),
            loaded.now,
            writes,
            self.promise.replicas > 0,
        )
        .await?;
        Ok(Reply {
            now: loaded.now,
            result: step.reply,
            replicas: if wrote { self.promise.replicas } else { 0 },
        })
    }

    pub async fn request_token(
        &self,
        key: &ActionKey,
        req: &TokenRequest,
        replicas: u32,
    ) -> Result<Reply<TokenOutcome>, StoreError> {
        self.promise.check(replicas)?;
        let action = Action::new(key);
        let mut buckets: Vec<String> = req.charges.iter().map(|c| c.bucket.clone()).collect();
        buckets.sort();
        buckets.dedup();
        let plan = Plan {
            agent_lock: req.hold.is_some() || !buckets.is_empty(),
            approval: req.hold.is_some(),
            buckets,
            chain: false,
        };
        attempt!(self, "RequestToken", |s| async {
            let loaded = steps::load(&mut s, &action.target(), &plan).await?;
            let step = ledger::request_token(loaded.record.as_ref(), &loaded.side, req, loaded.now);
            self.finish(&mut s, &action, &loaded, step, None).await
        }
        .await)
    }

    pub async fn complete(
        &self,
        key: &ActionKey,
        token: &str,
        receipt: &[u8],
        replicas: u32,
        signer: Option<&Receipts>,
    ) -> Result<Reply<CompleteOutcome>, StoreError> {
        self.promise.check(replicas)?;
        let action = Action::new(key);
        let plan = Plan {
            agent_lock: signer.is_some(),
            chain: signer.is_some(),
            ..Plan::default()
        };
        attempt!(self, "Complete", |s| async {
            let loaded = steps::load(&mut s, &action.target(), &plan).await?;
            let mut step = ledger::complete(loaded.record.as_ref(), token, receipt, loaded.now);
            let chain =
                receipts::record_chained(&mut step, loaded.tail.as_ref(), signer, &action.key)?;
            self.finish(&mut s, &action, &loaded, step, chain).await
        }
        .await)
    }

    pub async fn release(
        &self,
        key: &ActionKey,
        token: &str,
        replicas: u32,
    ) -> Result<Reply<u64>, StoreError> {
        self.promise.check(replicas)?;
        let action = Action::new(key);
        attempt!(self, "Release", |s| async {
            let mut loaded = steps::load(&mut s, &action.target(), &Plan::default()).await?;
            let ids = ledger::reserved_buckets(loaded.record.as_ref());
            steps::load_agent(&mut s, &action.target(), &mut loaded, ids, false).await?;
            let step = ledger::release(loaded.record.as_ref(), &loaded.side, token, loaded.now);
            self.finish(&mut s, &action, &loaded, step, None).await
        }
        .await)
    }

    pub async fn extend_lease(
        &self,
        key: &ActionKey,
        token: &str,
        ttl: Millis,
        replicas: u32,
    ) -> Result<Reply<Millis>, StoreError> {
        self.promise.check(replicas)?;
        let action = Action::new(key);
        attempt!(self, "ExtendLease", |s| async {
            let loaded = steps::load(&mut s, &action.target(), &Plan::default()).await?;
            let step = ledger::extend_lease(loaded.record.as_ref(), token, ttl, loaded.now);
            self.finish(&mut s, &action, &loaded, step, None).await
        }
        .await)
    }

    /// GetAction: one statement, no transaction and no lock (a read of the committed record).
    pub async fn get(&self, key: &ActionKey) -> Result<Reply<ActionView>, StoreError> {
        let encoded = key.encode();
        attempt!(self, "GetAction", |s| async {
            let stmt = s
                .prepare(
                    "SELECT (SELECT record FROM oncegate_records WHERE key = $1), \
                     (extract(epoch FROM clock_timestamp()) * 1000)::int8",
                )
                .await?;
            let row = s.client().query_one(&stmt, &[&encoded]).await?;
            let bytes: Option<Vec<u8>> = row.try_get(0)?;
            let now: Millis = row.try_get(1)?;
            let record = match bytes {
                Some(b) => Some(crate::codec::decode(&encoded, &b).map_err(Failure::Corrupt)?),
                None => None,
            };
            Ok::<_, Failure>(Reply {
                now,
                result: Ok(ledger::view(record.as_ref(), now)),
                replicas: 0,
            })
        }
        .await)
    }

    pub async fn record_external(
        &self,
        key: &ActionKey,
        ext: &ExternalCompletion,
        replicas: u32,
        signer: Option<&Receipts>,
    ) -> Result<Reply<CompleteOutcome>, StoreError> {
        self.promise.check(replicas)?;
        let action = Action::new(key);
        let plan = Plan {
            agent_lock: signer.is_some(),
            chain: signer.is_some(),
            ..Plan::default()
        };
        attempt!(self, "RecordExternalCompletion", |s| async {
            let loaded = steps::load(&mut s, &action.target(), &plan).await?;
            let mut step = ledger::record_external(loaded.record.as_ref(), ext, loaded.now);
            let chain =
                receipts::record_chained(&mut step, loaded.tail.as_ref(), signer, &action.key)?;
            self.finish(&mut s, &action, &loaded, step, chain).await
        }
        .await)
    }

    pub async fn resolve_expired(
        &self,
        key: &ActionKey,
        resolution: &Resolution,
        expected: Option<u64>,
        replicas: u32,
        signer: Option<&Receipts>,
    ) -> Result<Reply<Resolved>, StoreError> {
        self.promise.check(replicas)?;
        let action = Action::new(key);
        attempt!(self, "ResolveExpired", |s| async {
            let mut loaded = steps::load(&mut s, &action.target(), &Plan::default()).await?;
            let ids = ledger::reserved_buckets(loaded.record.as_ref());
            steps::load_agent(&mut s, &action.target(), &mut loaded, ids, signer.is_some())
                .await?;
            let mut step = ledger::resolve_expired(
                loaded.record.as_ref(),
                &loaded.side,
                resolution,
                expected,
                loaded.now,
            );
            let mut chain = None;
            if let (Some(signer), Some(tail), Ok(Resolved::Completed(completion))) =
                (signer, loaded.tail.as_ref(), &mut step.reply)
            {
                chain = Some(receipts::append(
                    tail,
                    signer,
                    &action.key,
                    &mut step.write,
                    completion,
                )?);
            }
            self.finish(&mut s, &action, &loaded, step, chain).await
        }
        .await)
    }

    pub async fn decide_approval(
        &self,
        key: &ActionKey,
        decision: &Decision,
        replicas: u32,
    ) -> Result<Reply<(Approval, bool)>, StoreError> {
        self.promise.check(replicas)?;
        let action = Action::new(key);
        let plan = Plan {
            agent_lock: true,
            approval: true,
            ..Plan::default()
        };
        attempt!(self, "DecideApproval", |s| async {
            let loaded = steps::load(&mut s, &action.target(), &plan).await?;
            let result = approval::decide(loaded.side.approval.as_ref(), decision, loaded.now)
                .map_err(|e| Refusal::ApprovalNotPending { state: e.0 });
            let side = match &result {
                Ok((approval, true)) => SideWrite {
                    approval: Some(approval.clone()),
                    ..SideWrite::default()
                },
                _ => SideWrite::default(),
            };
            let step = Step {
                reply: result,
                write: Write::Nothing,
                side,
            };
            self.finish(&mut s, &action, &loaded, step, None).await
        }
        .await)
    }
}
