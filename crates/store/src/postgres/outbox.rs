//! The PostgreSQL store's webhook outbox ([`crate::outbox`]): one row per (webhook, event id),
//! its entry in the shared encoding, with the columns its indexes need (state, when due, when
//! given up, when forgotten). Each operation is one transaction. A claim takes due rows with
//! `FOR UPDATE SKIP LOCKED`, so two gates' workers never claim the same entry and never wait for
//! each other; settled entries past their retention are forgotten a bounded batch per claim (and
//! by the purge task, [`super::purge`]).

use super::{
    PostgresStore,
    connection::{Failure, Session, attempt},
};
use crate::{
    Claimed, ListCursor, NewEntry, OutboxPage, Reply, Settlement, StoreError,
    outbox::{self, OutboxEntry, OutboxState},
};
use oncegate_domain::ledger::Millis;

const NOW: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8";
const INSERT: &str = "INSERT INTO oncegate_outbox (member, state, due_at, settled_at, forget_at, entry) \
     VALUES ($1, $2, $3, $4, NULL, $5) ON CONFLICT (member) DO NOTHING";
const DUE: &str = "SELECT member, entry FROM oncegate_outbox WHERE state = 1 AND due_at <= $1 \
     ORDER BY due_at, member LIMIT $2 FOR UPDATE SKIP LOCKED";
const UPDATE: &str = "UPDATE oncegate_outbox SET state = $2, due_at = $3, settled_at = $4, \
     forget_at = $5, entry = $6 WHERE member = $1";
const COUNTS: &str = "SELECT count(*) FILTER (WHERE state = 1), count(*) FILTER (WHERE state = 3) \
     FROM oncegate_outbox";
const ONE: &str = "SELECT entry FROM oncegate_outbox WHERE member = $1 FOR UPDATE";
const DEAD: &str = "SELECT member, entry FROM oncegate_outbox WHERE state = 3 \
     AND (settled_at, member) > ($1, $2) ORDER BY settled_at, member LIMIT $3";
/// Settled entries past their retention, a bounded batch, skipping rows another call holds.
const FORGET: &str = "DELETE FROM oncegate_outbox WHERE member IN (SELECT member \
     FROM oncegate_outbox WHERE forget_at <= $1 LIMIT $2 FOR UPDATE SKIP LOCKED)";

fn code(state: OutboxState) -> i16 {
    match state {
        OutboxState::Pending => 1,
        OutboxState::Delivered => 2,
        OutboxState::Undeliverable => 3,
    }
}

fn decode(bytes: &[u8]) -> Result<OutboxEntry, Failure> {
    OutboxEntry::decode(bytes).map_err(|e| Failure::Corrupt(e.to_string()))
}

fn encode(entry: &OutboxEntry) -> Result<Vec<u8>, Failure> {
    entry.encode().map_err(|e| Failure::Corrupt(e.to_string()))
}

/// Begins a transaction and reads the database's clock (one round trip).
async fn begin(s: &mut Session) -> Result<Millis, Failure> {
    let begin = s.prepare("BEGIN").await?;
    let now = s.prepare(NOW).await?;
    s.opened();
    let c = s.client();
    let (_, now) = tokio::try_join!(c.query(&begin, &[]), c.query_one(&now, &[]))?;
    Ok(now.try_get(0)?)
}

async fn commit(s: &mut Session) -> Result<(), Failure> {
    let commit = s.prepare("COMMIT").await?;
    match s.client().query(&commit, &[]).await {
        Ok(_) => {
            s.closed();
            Ok(())
        }
        Err(e) if e.code().is_none() => Err(Failure::Unknown(e)),
        Err(e) => Err(Failure::Db(e)),
    }
}

async fn counts(s: &Session) -> Result<(u64, u64), Failure> {
    let counts = s.prepare(COUNTS).await?;
    let row = s.client().query_one(&counts, &[]).await?;
    Ok((
        row.try_get::<_, i64>(0)? as u64,
        row.try_get::<_, i64>(1)? as u64,
    ))
}

/// Writes `entry` over its row.
async fn put(s: &Session, entry: &OutboxEntry, forget_at: Option<Millis>) -> Result<(), Failure> {
    let update = s.prepare(UPDATE).await?;
    let bytes = encode(entry)?;
    s.client()
        .query(
            &update,
            &[
                &entry.member(),
                &code(entry.state),
                &entry.due_at,
                &entry.settled_at,
                &forget_at,
                &bytes,
            ],
        )
        .await?;
    Ok(())
}

impl PostgresStore {
    pub async fn outbox_append(&self, entries: &[NewEntry]) -> Result<Reply<u32>, StoreError> {
        attempt!(self, "the outbox append", |s| async {
            let now = begin(&mut s).await?;
            let insert = s.prepare(INSERT).await?;
            let mut written = 0u32;
            for entry in entries {
                let new = OutboxEntry::new(entry, now);
                let bytes = encode(&new)?;
                let n = s
                    .client()
                    .execute(
                        &insert,
                        &[&new.member(), &code(new.state), &new.due_at, &0i64, &bytes],
                    )
                    .await?;
                written += n as u32;
            }
            commit(&mut s).await?;
            Ok::<_, Failure>(Reply {
                now,
                result: Ok(written),
                replicas: 0,
            })
        }
        .await)
    }

    pub async fn outbox_claim(
        &self,
        limit: usize,
        lease: Millis,
        claim: &str,
    ) -> Result<Reply<Claimed>, StoreError> {
        attempt!(self, "the outbox claim", |s| async {
            let now = begin(&mut s).await?;
            let forget = s.prepare(FORGET).await?;
            let due = s.prepare(DUE).await?;
            s.client()
                .execute(&forget, &[&now, &(outbox::PURGE_BATCH as i64)])
                .await?;
            let rows = s.client().query(&due, &[&now, &(limit as i64)]).await?;
            let mut claimed = Claimed::default();
            for row in rows {
                let member: Vec<u8> = row.try_get(0)?;
                let bytes: Vec<u8> = row.try_get(1)?;
                let stored = match decode(&bytes) {
                    Ok(entry) if entry.state == OutboxState::Pending => entry,
                    Ok(_) => continue,
                    Err(e) => {
                        // Nobody can deliver it; keeping it due would stop every later claim.
                        tracing::error!(error = ?e, "outbox: dropping an entry that cannot be read");
                        let drop = s.prepare("DELETE FROM oncegate_outbox WHERE member = $1").await?;
                        s.client().execute(&drop, &[&member]).await?;
                        continue;
                    }
                };
                let entry = stored.claimed(claim, now, lease);
                put(&s, &entry, None).await?;
                claimed.entries.push(entry);
            }
            (claimed.pending, claimed.undeliverable) = counts(&s).await?;
            commit(&mut s).await?;
            Ok::<_, Failure>(Reply {
                now,
                result: Ok(claimed),
                replicas: 0,
            })
        }
        .await)
    }

    pub async fn outbox_settle(
        &self,
        webhook: &str,
        id: &str,
        claim: &str,
        settlement: &Settlement,
        keep: Millis,
    ) -> Result<Reply<bool>, StoreError> {
        let member = outbox::member(webhook, id);
        attempt!(self, "the outbox settlement", |s| async {
            let now = begin(&mut s).await?;
            let one = s.prepare(ONE).await?;
            let row = s.client().query_opt(&one, &[&member]).await?;
            let mut done = false;
            if let Some(row) = row {
                let stored = decode(&row.try_get::<_, Vec<u8>>(0)?)?;
                if let Some(settled) = stored.settled(claim, settlement, now) {
                    let forget = (settled.state != OutboxState::Pending)
                        .then(|| now.saturating_add(keep));
                    put(&s, &settled, forget).await?;
                    done = true;
                }
            }
            commit(&mut s).await?;
            Ok::<_, Failure>(Reply {
                now,
                result: Ok(done),
                replicas: 0,
            })
        }
        .await)
    }

    pub async fn outbox_undeliverable(
        &self,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Reply<OutboxPage>, StoreError> {
        let (from_at, from_member) = match after {
            Some(c) => (c.lease_expires_at, c.key.clone()),
            None => (Millis::MIN, Vec::new()),
        };
        attempt!(self, "the outbox listing", |s| async {
            let now = s.prepare(NOW).await?;
            let dead = s.prepare(DEAD).await?;
            let now: Millis = s.client().query_one(&now, &[]).await?.try_get(0)?;
            let rows = s
                .client()
                .query(&dead, &[&from_at, &from_member, &(limit as i64)])
                .await?;
            let (pending, undeliverable) = counts(&s).await?;
            let mut page = OutboxPage {
                pending,
                undeliverable,
                ..OutboxPage::default()
            };
            for row in rows {
                let member: Vec<u8> = row.try_get(0)?;
                match decode(&row.try_get::<_, Vec<u8>>(1)?) {
                    Ok(entry) => {
                        page.next = Some(ListCursor {
                            agent_id: String::new(),
                            lease_expires_at: entry.settled_at,
                            key: member,
                        });
                        page.items.push(entry);
                    }
                    Err(e) => {
                        tracing::error!(error = ?e, "outbox: an undeliverable entry cannot be read")
                    }
                }
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
}
