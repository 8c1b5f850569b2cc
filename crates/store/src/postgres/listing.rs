//! ListUnresolved (and WatchUnresolved's scan) on PostgreSQL: the lease index
//! (`agent, lease_at, key`, one entry per authorized record or released one with superseded
//! grants out) read in order after the cursor, only the entries whose lease has ended at the
//! database's `now`, each checked against its record by the ledger ([`ledger::is_unresolved`]).
//! Not a snapshot, as on the other stores: one statement, no lock; a record that cannot be read
//! is skipped (and logged), the others are listed.

use super::{
    PostgresStore,
    connection::{Failure, attempt},
};
use crate::{ListCursor, Page, Reply, StoreError, Unresolved, codec, list};
use oncegate_domain::{
    ActionKey,
    ledger::{self, Millis},
};

const NOW: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8";
const ALL: &str = "SELECT key, agent, lease_at, record FROM oncegate_records \
     WHERE lease_at IS NOT NULL AND lease_at <= $1 AND (agent, lease_at, key) > ($2, $3, $4) \
     ORDER BY agent, lease_at, key LIMIT $5";
const ONE: &str = "SELECT key, agent, lease_at, record FROM oncegate_records \
     WHERE agent = $2 AND lease_at IS NOT NULL AND lease_at <= $1 AND (lease_at, key) > ($3, $4) \
     ORDER BY lease_at, key LIMIT $5";

impl PostgresStore {
    pub async fn list_unresolved(
        &self,
        agent_id: Option<&str>,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Reply<Page>, StoreError> {
        let start = match (after, agent_id) {
            (Some(c), _) => c.clone(),
            (None, Some(agent)) => ListCursor::start_of(agent),
            (None, None) => ListCursor::start_of(""),
        };
        // Stale entries are skipped: a page may come back short with a cursor rather than
        // examine more than this.
        let budget = list::scan_budget(limit);
        attempt!(self, "ListUnresolved", |s| async {
            let now = s.prepare(NOW).await?;
            let scan = s.prepare(if agent_id.is_some() { ONE } else { ALL }).await?;
            let now: Millis = s.client().query_one(&now, &[]).await?.try_get(0)?;
            let rows = s
                .client()
                .query(
                    &scan,
                    &[
                        &now,
                        &agent_id.unwrap_or(start.agent_id.as_str()),
                        &start.lease_expires_at,
                        &start.key,
                        &(budget as i64),
                    ],
                )
                .await?;
            let examined = rows.len();
            let mut page = Page::default();
            let mut last = None;
            for row in rows {
                if page.items.len() >= limit {
                    break;
                }
                let key: Vec<u8> = row.try_get(0)?;
                let lease: Millis = row.try_get(2)?;
                let bytes: Vec<u8> = row.try_get(3)?;
                let Some(action) = ActionKey::decode(&key) else {
                    continue;
                };
                last = Some(ListCursor::after(&action, lease));
                let record = match codec::decode(&key, &bytes) {
                    Ok(record) => record,
                    Err(e) => {
                        // Listed by nobody until repaired: say so, and list the others.
                        tracing::error!(error = %e, "ListUnresolved skips a record it cannot read");
                        continue;
                    }
                };
                if ledger::is_unresolved(Some(&record), now) {
                    page.items.push(Unresolved {
                        view: ledger::view(Some(&record), now),
                        asked: record.asked.clone(),
                        key: action,
                    });
                }
            }
            if page.items.len() >= limit || examined >= budget {
                page.next = last;
            }
            Ok::<_, Failure>(Reply {
                now,
                result: Ok(page),
                replicas: 0,
            })
        }
        .await)
    }
}
