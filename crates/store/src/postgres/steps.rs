//! One ledger step as one PostgreSQL transaction: [`load`] begins it, locks the action key (and
//! the agent, when the step reads its approvals, budgets or receipt chain), reads the store's
//! clock and everything the ledger reads, in one pipelined round trip; the caller runs the same
//! [`oncegate_domain::ledger`] function the embedded store runs; [`commit`] writes what the step
//! decided and commits, in a second pipelined round trip. Nothing is decided in SQL.
//!
//! Locks: `pg_advisory_xact_lock` on the key serializes every step of one action, including its
//! first insert (a row lock alone cannot lock a row that does not exist yet); `FOR UPDATE` on the
//! record keeps the purge ([`super::purge`], which skips locked rows) away from it. The agent's
//! lock is always taken after the key's, never before, so steps cannot deadlock on them.
//!
//! Time: one `now` per transaction, the database's `clock_timestamp()` read after the locks are
//! held, so a step never decides with a time earlier than the step before it on the same key, and
//! every gate replica agrees on when a lease ends.

use std::collections::BTreeMap;

use futures_util::future::{BoxFuture, try_join_all};
use tokio_postgres::{Row, types::ToSql};

use super::{
    connection::{AGENT_LOCK, Failure, KEY_LOCK, Session, lock_id, query},
    receipts::{self, Tail},
};
use crate::codec;
use oncegate_domain::ledger::{Approval, Bucket, Millis, Phase, Record, Side, SideWrite, Write};

/// What a step reads besides the record.
#[derive(Default)]
pub(super) struct Plan {
    /// Lock the agent too (the step reads or writes its side state or chain).
    pub(super) agent_lock: bool,
    /// Read the key's approval.
    pub(super) approval: bool,
    /// Read these buckets of the agent.
    pub(super) buckets: Vec<String>,
    /// Read the agent's chain tail.
    pub(super) chain: bool,
}

/// What a step runs on.
pub(super) struct Loaded {
    pub(super) now: Millis,
    pub(super) record: Option<Record>,
    pub(super) side: Side,
    pub(super) tail: Option<Tail>,
    /// Whether the agent's lock is held.
    pub(super) agent_locked: bool,
}

/// The action a step runs on.
pub(super) struct Target<'a> {
    pub(super) key: &'a [u8],
    pub(super) agent: &'a str,
}

type Params<'p> = Vec<&'p (dyn ToSql + Sync)>;

const LOCK: &str = "SELECT pg_advisory_xact_lock($1::int4, $2::int4)";
const RECORD: &str = "SELECT (SELECT record FROM oncegate_records WHERE key = $1 FOR UPDATE), \
                      (extract(epoch FROM clock_timestamp()) * 1000)::int8";
const APPROVAL: &str = "SELECT approval FROM oncegate_approvals WHERE key = $1";
const BUCKETS: &str =
    "SELECT bucket, body FROM oncegate_budgets WHERE agent = $1 AND bucket = ANY($2)";

/// Begins the step's transaction and reads what it runs on (one round trip).
pub(super) async fn load(
    s: &mut Session,
    target: &Target<'_>,
    plan: &Plan,
) -> Result<Loaded, Failure> {
    let begin = s.prepare("BEGIN").await?;
    let lock = s.prepare(LOCK).await?;
    let record = s.prepare(RECORD).await?;
    let approval = s.prepare(APPROVAL).await?;
    let buckets = s.prepare(BUCKETS).await?;
    let tail = s.prepare(receipts::TAIL).await?;
    let key_lock = lock_id(target.key);
    let agent_lock = lock_id(target.agent.as_bytes());
    let agent = target.agent.to_owned();
    s.opened();
    let c = s.client();
    let mut calls: Vec<BoxFuture<'_, Result<Vec<Row>, tokio_postgres::Error>>> = vec![
        query(c, &begin, vec![]),
        query(c, &lock, vec![&KEY_LOCK, &key_lock]),
    ];
    if plan.agent_lock {
        calls.push(query(c, &lock, vec![&AGENT_LOCK, &agent_lock]));
    }
    calls.push(query(c, &record, vec![&target.key]));
    if plan.approval {
        calls.push(query(c, &approval, vec![&target.key]));
    }
    if !plan.buckets.is_empty() {
        calls.push(query(c, &buckets, vec![&agent, &plan.buckets]));
    }
    if plan.chain {
        calls.push(query(c, &tail, vec![&agent]));
    }
    let mut rows = try_join_all(calls).await?.into_iter();
    rows.next(); // BEGIN
    rows.next(); // the key's lock
    if plan.agent_lock {
        rows.next();
    }
    let (record, now) = record_and_now(target.key, rows.next().unwrap_or_default())?;
    let mut loaded = Loaded {
        now,
        record,
        side: Side::default(),
        tail: None,
        agent_locked: plan.agent_lock,
    };
    if plan.approval {
        loaded.side.approval = approval_of(rows.next().unwrap_or_default())?;
    }
    if !plan.buckets.is_empty() {
        loaded.side.buckets = buckets_of(rows.next().unwrap_or_default())?;
    }
    if plan.chain {
        loaded.tail = Some(receipts::tail_of(rows.next().unwrap_or_default())?);
    }
    Ok(loaded)
}

/// Locks the agent (when not yet) and reads its buckets `ids` and, with `chain`, its chain tail:
/// what Release and ResolveExpired need once the record says which buckets it reserved.
pub(super) async fn load_agent(
    s: &mut Session,
    target: &Target<'_>,
    loaded: &mut Loaded,
    ids: Vec<String>,
    chain: bool,
) -> Result<(), Failure> {
    if ids.is_empty() && !chain {
        return Ok(());
    }
    let lock = s.prepare(LOCK).await?;
    let buckets = s.prepare(BUCKETS).await?;
    let tail = s.prepare(receipts::TAIL).await?;
    let agent_lock = lock_id(target.agent.as_bytes());
    let agent = target.agent.to_owned();
    let c = s.client();
    let mut calls: Vec<BoxFuture<'_, Result<Vec<Row>, tokio_postgres::Error>>> = Vec::new();
    let lock_it = !loaded.agent_locked;
    if lock_it {
        calls.push(query(c, &lock, vec![&AGENT_LOCK, &agent_lock]));
    }
    if !ids.is_empty() {
        calls.push(query(c, &buckets, vec![&agent, &ids]));
    }
    if chain {
        calls.push(query(c, &tail, vec![&agent]));
    }
    let mut rows = try_join_all(calls).await?.into_iter();
    if lock_it {
        rows.next();
        loaded.agent_locked = true;
    }
    if !ids.is_empty() {
        loaded.side.buckets = buckets_of(rows.next().unwrap_or_default())?;
    }
    if chain {
        loaded.tail = Some(receipts::tail_of(rows.next().unwrap_or_default())?);
    }
    Ok(())
}

fn record_and_now(key: &[u8], rows: Vec<Row>) -> Result<(Option<Record>, Millis), Failure> {
    let row = rows
        .into_iter()
        .next()
        .ok_or_else(|| Failure::Corrupt("PostgreSQL answered no row for a record read".into()))?;
    let bytes: Option<Vec<u8>> = row.try_get(0)?;
    let now: Millis = row.try_get(1)?;
    let record = match bytes {
        Some(bytes) => Some(codec::decode(key, &bytes).map_err(Failure::Corrupt)?),
        None => None,
    };
    Ok((record, now))
}

pub(super) fn approval_of(rows: Vec<Row>) -> Result<Option<Approval>, Failure> {
    match rows.into_iter().next() {
        Some(row) => {
            let bytes: Vec<u8> = row.try_get(0)?;
            rmp_serde::from_slice(&bytes)
                .map(Some)
                .map_err(|e| Failure::Corrupt(format!("an approval: {e}")))
        }
        None => Ok(None),
    }
}

pub(super) fn buckets_of(rows: Vec<Row>) -> Result<BTreeMap<String, Bucket>, Failure> {
    let mut out = BTreeMap::new();
    for row in rows {
        let id: String = row.try_get(0)?;
        let bytes: Vec<u8> = row.try_get(1)?;
        let bucket = rmp_serde::from_slice(&bytes)
            .map_err(|e| Failure::Corrupt(format!("budget bucket {id:?}: {e}")))?;
        out.insert(id, bucket);
    }
    Ok(out)
}

/// Where a record stands in the lease index: authorized, its lease end; released with superseded
/// grants out, when it was released; otherwise nowhere.
pub(super) fn lease_at(record: &Record) -> Option<Millis> {
    match &record.phase {
        Phase::Authorized {
            lease_expires_at, ..
        } => Some(*lease_expires_at),
        Phase::Released { at, .. } if record.pending_superseded().is_some() => Some(*at),
        _ => None,
    }
}

/// Whether a record's outcome is still unknown: such a record is never purged.
pub(super) fn unsettled(record: &Record) -> bool {
    matches!(record.phase, Phase::Authorized { .. }) || record.pending_superseded().is_some()
}

const PUT_RECORD: &str = "INSERT INTO oncegate_records (key, agent, record, lease_at, expires_at) \
     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (key) DO UPDATE SET record = excluded.record, \
     lease_at = excluded.lease_at, expires_at = excluded.expires_at";
const PUT_APPROVAL: &str = "INSERT INTO oncegate_approvals (key, agent, expires_at, approval) \
     VALUES ($1, $2, $3, $4) ON CONFLICT (key) DO UPDATE SET expires_at = excluded.expires_at, \
     approval = excluded.approval";
pub(super) const DROP_LAPSED: &str =
    "DELETE FROM oncegate_approvals WHERE agent = $1 AND expires_at <= $2";
const PUT_BUCKET: &str = "INSERT INTO oncegate_budgets (agent, bucket, body) VALUES ($1, $2, $3) \
     ON CONFLICT (agent, bucket) DO UPDATE SET body = excluded.body";
const DROP_BUCKET: &str = "DELETE FROM oncegate_budgets WHERE agent = $1 AND bucket = $2";
const NO_TIMEOUT: &str = "SET LOCAL statement_timeout = 0";

/// What a step writes.
pub(super) struct Writes {
    pub(super) record: Write,
    pub(super) side: SideWrite,
    /// A chain entry: (seq, stored entry).
    pub(super) chain: Option<(i64, Vec<u8>)>,
}

/// Writes what the step decided and commits it (one round trip). With `synchronous`, COMMIT
/// runs without the statement timeout: cancelled while it waits for a synchronous standby,
/// PostgreSQL would keep the commit locally and answer success; past the call deadline the gate
/// drops the connection instead and reports the outcome unknown.
pub(super) async fn commit(
    s: &mut Session,
    target: &Target<'_>,
    now: Millis,
    writes: Writes,
    synchronous: bool,
) -> Result<(), Failure> {
    let put_record = s.prepare(PUT_RECORD).await?;
    let put_approval = s.prepare(PUT_APPROVAL).await?;
    let drop_lapsed = s.prepare(DROP_LAPSED).await?;
    let put_bucket = s.prepare(PUT_BUCKET).await?;
    let drop_bucket = s.prepare(DROP_BUCKET).await?;
    let put_entry = s.prepare(receipts::PUT).await?;
    let no_timeout = s.prepare(NO_TIMEOUT).await?;
    let commit = s.prepare("COMMIT").await?;

    // Every value encoded before anything is sent.
    let record = match &writes.record {
        Write::Put(record) => Some((
            codec::encode(record).map_err(Failure::Corrupt)?,
            lease_at(record),
            // Never an expiry while the outcome is unknown, whatever the record says.
            record.expires_at.filter(|_| !unsettled(record)),
        )),
        Write::Nothing => None,
    };
    let approval = match &writes.side.approval {
        Some(a) => Some((
            a.expires_at,
            rmp_serde::to_vec(a).map_err(|e| Failure::Corrupt(format!("an approval: {e}")))?,
        )),
        None => None,
    };
    let mut buckets = Vec::new();
    for (id, bucket) in &writes.side.buckets {
        let body = match bucket.slots.is_empty() {
            true => None,
            false => Some(
                rmp_serde::to_vec(bucket)
                    .map_err(|e| Failure::Corrupt(format!("budget bucket {id:?}: {e}")))?,
            ),
        };
        buckets.push((id.clone(), body));
    }
    let agent = target.agent.to_owned();
    let key = target.key;

    let c = s.client();
    let mut calls: Vec<BoxFuture<'_, Result<Vec<Row>, tokio_postgres::Error>>> = Vec::new();
    if let Some((bytes, lease, expires)) = &record {
        let params: Params<'_> = vec![&key, &agent, bytes, lease, expires];
        calls.push(query(c, &put_record, params));
    }
    if let Some((expires_at, bytes)) = &approval {
        calls.push(
            query(c, &put_approval, vec![&key, &agent, expires_at, bytes]),
        );
        calls.push(query(c, &drop_lapsed, vec![&agent, &now]));
    }
    for (id, body) in &buckets {
        match body {
            Some(body) => calls.push(query(c, &put_bucket, vec![&agent, id, body])),
            None => calls.push(query(c, &drop_bucket, vec![&agent, id])),
        }
    }
    if let Some((seq, entry)) = &writes.chain {
        calls.push(query(c, &put_entry, vec![&agent, seq, entry]));
    }
    let wrote = !calls.is_empty();
    if wrote && synchronous {
        calls.push(query(c, &no_timeout, vec![]));
    }
    let writes_sent = try_join_all(calls);
    let committed = query(c, &commit, vec![]);
    // Pipelined: the writes and COMMIT leave together; a write that fails makes COMMIT roll back.
    let (written, committed) = tokio::join!(writes_sent, committed);
    if let Err(e) = written {
        return Err(Failure::Db(e));
    }
    match committed {
        Ok(_) => {
            s.closed();
            Ok(())
        }
        // The server answered: it rolled back (a serialization failure at commit, say).
        Err(e) if e.code().is_some() => Err(Failure::Db(e)),
        // No answer: the commit may have happened.
        Err(e) if wrote => Err(Failure::Unknown(e)),
        Err(e) => Err(Failure::Db(e)),
    }
}
