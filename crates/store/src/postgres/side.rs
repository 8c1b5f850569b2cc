//! The PostgreSQL store's reads of an agent's state beside its records: the approvals listing
//! (lapsed approvals dropped first, under the agent's lock, as a step that writes them would),
//! the budget buckets, and the receipt chain's export. The writes of that state happen in the
//! steps that decide them ([`super::records`]).

use super::{
    PostgresStore,
    connection::{AGENT_LOCK, Failure, attempt, lock_id, query},
    receipts,
    steps::{self, DROP_LAPSED},
};
use crate::{ApprovalEntry, ApprovalPage, ListCursor, Reply, StoreError};
use oncegate_domain::{
    ActionKey,
    ledger::{Approval, Bucket, Millis},
    statement::receipt::ChainEntry,
};

const NOW: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8";
const APPROVALS: &str = "SELECT key, expires_at, approval FROM oncegate_approvals \
     WHERE agent = $1 AND (expires_at, key) > ($2, $3) ORDER BY expires_at, key LIMIT $4";

impl PostgresStore {
    pub async fn list_approvals(
        &self,
        agent_id: &str,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Reply<ApprovalPage>, StoreError> {
        let agent = agent_id.to_owned();
        let (from_at, from_key) = match after {
            Some(c) => (c.lease_expires_at, c.key.clone()),
            None => (Millis::MIN, Vec::new()),
        };
        let lock = lock_id(agent.as_bytes());
        let limit_rows = limit as i64;
        attempt!(self, "ListApprovals", |s| async {
            let begin = s.prepare("BEGIN").await?;
            let take = s.prepare("SELECT pg_advisory_xact_lock($1::int4, $2::int4)").await?;
            let now = s.prepare(NOW).await?;
            let drop_lapsed = s.prepare(DROP_LAPSED).await?;
            let list = s.prepare(APPROVALS).await?;
            let commit = s.prepare("COMMIT").await?;
            s.opened();
            let c = s.client();
            let (_, _, now) = tokio::try_join!(
                query(c, &begin, vec![]),
                query(c, &take, vec![&AGENT_LOCK, &lock]),
                query(c, &now, vec![]),
            )?;
            let now: Millis = first(now)?.try_get(0)?;
            let (_, rows, _) = tokio::try_join!(
                query(c, &drop_lapsed, vec![&agent, &now]),
                query(c, &list, vec![&agent, &from_at, &from_key, &limit_rows]),
                query(c, &commit, vec![]),
            )?;
            s.closed();
            let mut page = ApprovalPage::default();
            for row in rows {
                let key: Vec<u8> = row.try_get(0)?;
                let expires_at: Millis = row.try_get(1)?;
                let bytes: Vec<u8> = row.try_get(2)?;
                let Some(action) = ActionKey::decode(&key) else {
                    continue;
                };
                let approval: Approval = rmp_serde::from_slice(&bytes)
                    .map_err(|e| Failure::Corrupt(format!("an approval: {e}")))?;
                page.next = Some(ListCursor::after(&action, expires_at));
                page.items.push(ApprovalEntry {
                    key: action,
                    approval,
                });
            }
            if page.items.len() < limit {
                page.next = None;
            }
            Ok::<_, Failure>(Reply {
                now,
                result: Ok(page),
                replicas: 0,
            })
        }
        .await)
    }

    pub async fn budgets(
        &self,
        agent_id: &str,
    ) -> Result<Reply<Vec<(String, Bucket)>>, StoreError> {
        attempt!(self, "Budgets", |s| async {
            let now = s.prepare(NOW).await?;
            let all = s
                .prepare("SELECT bucket, body FROM oncegate_budgets WHERE agent = $1 ORDER BY bucket")
                .await?;
            let c = s.client();
            let (now, rows) =
                tokio::try_join!(query(c, &now, vec![]), query(c, &all, vec![&agent_id]))?;
            let now: Millis = first(now)?.try_get(0)?;
            let buckets = steps::buckets_of(rows)?;
            Ok::<_, Failure>(Reply {
                now,
                result: Ok(buckets.into_iter().collect()),
                replicas: 0,
            })
        }
        .await)
    }

    pub async fn receipts(
        &self,
        agent_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<ChainEntry>, StoreError> {
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        attempt!(self, "the receipt chain's export", |s| async {
            let export = s.prepare(receipts::EXPORT).await?;
            let rows = s
                .client()
                .query(&export, &[&agent_id, &after, &limit])
                .await?;
            receipts::entries_of(rows)
        }
        .await)
    }
}

/// The one row a statement answers.
fn first(rows: Vec<tokio_postgres::Row>) -> Result<tokio_postgres::Row, Failure> {
    rows.into_iter()
        .next()
        .ok_or_else(|| Failure::Corrupt("PostgreSQL answered no row".into()))
}
