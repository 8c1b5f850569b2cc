//! Expiry without TTLs: a background task forgets what is past its retention, in bounded
//! batches, each its own short transaction, taking only rows no call holds (`FOR UPDATE SKIP
//! LOCKED`), so a purge never makes a call wait. What is purged: records whose store expiry has
//! passed (the column is set only for a settled record, so an unresolved lease, whose outcome is
//! unknown, is never purged, the same rule as the other stores), approvals that lapsed, and
//! outbox entries past their retention. A record past its expiry that is not purged yet is
//! treated as absent by the ledger, so the purge's pace changes no answer.

use std::{sync::Arc, time::Duration};

use deadpool_postgres::Pool;

use super::connection::Session;
use crate::StoreError;

/// How many rows of one table one purge transaction removes at most.
pub const PURGE_BATCH: i64 = 256;

const NOW: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::int8";

/// What one purge pass removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Purged {
    pub records: u64,
    pub approvals: u64,
    pub outbox: u64,
}

impl Purged {
    /// Whether a table had a full batch (more may be due).
    fn full(&self, batch: i64) -> bool {
        let batch = batch as u64;
        self.records >= batch || self.approvals >= batch || self.outbox >= batch
    }
}

/// One batch of each table, `batch` rows at most each (three short transactions).
pub async fn purge_once(pool: &Pool, batch: i64) -> Result<Purged, StoreError> {
    let s = Session::get(pool).await?;
    let c = s.client();
    let run = |sql: String| async move {
        c.execute(&sql, &[&batch])
            .await
            .map_err(|e| StoreError::unavailable_by("PostgreSQL: purging", e))
    };
    let records = run(format!(
        "DELETE FROM oncegate_records WHERE key IN (SELECT key FROM oncegate_records \
         WHERE expires_at <= {NOW} LIMIT $1 FOR UPDATE SKIP LOCKED)"
    ))
    .await?;
    let approvals = run(format!(
        "DELETE FROM oncegate_approvals WHERE key IN (SELECT key FROM oncegate_approvals \
         WHERE expires_at <= {NOW} LIMIT $1 FOR UPDATE SKIP LOCKED)"
    ))
    .await?;
    let outbox = run(format!(
        "DELETE FROM oncegate_outbox WHERE member IN (SELECT member FROM oncegate_outbox \
         WHERE forget_at <= {NOW} LIMIT $1 FOR UPDATE SKIP LOCKED)"
    ))
    .await?;
    Ok(Purged {
        records,
        approvals,
        outbox,
    })
}

/// The purge task of a store, stopped when the last handle of the store is dropped.
pub(super) struct PurgeTask(tokio::task::JoinHandle<()>);

impl Drop for PurgeTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts the task: a pass every `every`, batches back to back while they come back full.
pub(super) fn start(pool: Pool, every: Duration) -> Arc<PurgeTask> {
    Arc::new(PurgeTask(tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            loop {
                match purge_once(&pool, PURGE_BATCH).await {
                    Ok(purged) if purged.full(PURGE_BATCH) => tokio::task::yield_now().await,
                    Ok(_) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, "PostgreSQL purge failed; retried at the next pass");
                        break;
                    }
                }
            }
        }
    })))
}
