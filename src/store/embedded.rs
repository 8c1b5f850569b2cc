//! The embedded store: one redb file under `--data-dir`, durable and crash-safe, with the same
//! semantics as Redis because it runs [`crate::ledger`] itself.
//!
//! One writer thread owns the database. Calls queue up on a channel; the writer drains whatever is
//! waiting, applies each step in order inside **one** write transaction (so each step sees the
//! previous one's write, and each is atomic with respect to the others), commits with
//! `Durability::Immediate` (fsync), and only then answers every caller in the batch. This is group
//! commit: under load many calls share one fsync, and no call is acknowledged before its write is
//! on disk.
//!
//! Expired records are removed by the writer from an expiry index (`expires_at ++ key`), a bounded
//! batch per transaction, so the file does not grow without end. A lease index
//! (`agent ++ lease_expires_at ++ key`, one entry per authorized record) is kept in the same
//! transaction as every write, so ListUnresolved never scans the records.
//!
//! Every call has a deadline ([`EmbeddedStore::with_call_timeout`]): a caller that waits longer
//! gets `Unavailable` (the step may still be applied, as the Store contract allows).

use std::{path::Path, sync::Arc, thread, time::Duration};

use redb::{Database, ReadableTable, TableDefinition};
use tokio::sync::{mpsc, oneshot};

use super::{ActionKey, Durability, ListCursor, Page, Reply, StoreError, Unresolved, list};
use crate::ledger::{
    self, ActionView, CompleteOutcome, ExternalCompletion, Millis, Phase, Record, Resolution,
    Resolved, Step, TokenOutcome, TokenRequest, Write,
};

/// action key (encoded) → record (MessagePack).
const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("records");
/// expires_at (big-endian i64) ++ action key → ().
const EXPIRY: TableDefinition<&[u8], ()> = TableDefinition::new("expiry");
/// agent (u32 length ++ bytes) ++ lease_expires_at (order-preserving u64) ++ action key → ().
/// One entry per authorized record: the ListUnresolved index.
const LEASES: TableDefinition<&[u8], ()> = TableDefinition::new("leases");

/// How many expired records one transaction removes at most.
const PURGE_BATCH: usize = 256;
/// How many queued calls one transaction takes at most.
const MAX_BATCH: usize = 1024;

/// The clock the store decides with. The real one reads the system time; tests inject their own.
pub type Clock = Arc<dyn Fn() -> Millis + Send + Sync>;

/// The system clock in Unix milliseconds.
pub fn system_clock() -> Clock {
    Arc::new(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as Millis)
            .unwrap_or(0)
    })
}

/// A cheap, cloneable handle to the writer thread.
#[derive(Clone)]
pub struct EmbeddedStore {
    tx: mpsc::Sender<Job>,
    call_timeout: Duration,
}

/// One queued call: a step to run against the stored record, and where to send its answer.
struct Job {
    key: Vec<u8>,
    op: Op,
}

enum Op {
    Token(TokenRequest, oneshot::Sender<Reply<TokenOutcome>>),
    Complete(String, Vec<u8>, oneshot::Sender<Reply<CompleteOutcome>>),
    Release(String, oneshot::Sender<Reply<u64>>),
    Extend(String, Millis, oneshot::Sender<Reply<Millis>>),
    Get(oneshot::Sender<Reply<ActionView>>),
    External(ExternalCompletion, oneshot::Sender<Reply<CompleteOutcome>>),
    Resolve(Resolution, oneshot::Sender<Reply<Resolved>>),
    List(ListRequest, oneshot::Sender<Reply<Page>>),
    Ping(oneshot::Sender<()>),
}

/// A ListUnresolved call.
struct ListRequest {
    agent_id: Option<String>,
    after: Option<ListCursor>,
    limit: usize,
}

impl EmbeddedStore {
    /// Opens (or creates) `oncegate.redb` in `dir` and starts the writer thread.
    pub fn open(dir: &Path, clock: Clock) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| StoreError::Unavailable(format!("creating {}: {e}", dir.display())))?;
        let path = dir.join("oncegate.redb");
        let db = Database::create(&path)
            .map_err(|e| StoreError::Unavailable(format!("opening {}: {e}", path.display())))?;
        let setup = || -> Result<(), redb::Error> {
            let txn = db.begin_write()?;
            txn.open_table(RECORDS)?;
            txn.open_table(EXPIRY)?;
            txn.open_table(LEASES)?;
            txn.commit()?;
            Ok(())
        };
        setup()
            .map_err(|e| StoreError::Unavailable(format!("preparing {}: {e}", path.display())))?;
        let (tx, rx) = mpsc::channel(4 * MAX_BATCH);
        thread::Builder::new()
            .name("oncegate-embedded-writer".into())
            .spawn(move || Writer { db, clock }.run(rx))
            .map_err(|e| StoreError::Unavailable(format!("starting the writer thread: {e}")))?;
        Ok(Self {
            tx,
            call_timeout: Duration::from_secs(2),
        })
    }

    /// Sets the deadline of one call (2 s by default). Past it the caller gets `Unavailable`.
    pub fn with_call_timeout(mut self, call_timeout: Duration) -> Self {
        self.call_timeout = call_timeout;
        self
    }

    async fn call<T>(
        &self,
        key: &ActionKey,
        make: impl FnOnce(oneshot::Sender<T>) -> Op,
    ) -> Result<T, StoreError> {
        let (reply_tx, reply_rx) = oneshot::channel();
        let job = Job {
            key: key.encode(),
            op: make(reply_tx),
        };
        let call = async {
            self.tx.send(job).await.map_err(|_| {
                StoreError::Unavailable("the embedded store's writer has stopped".into())
            })?;
            reply_rx
                .await
                .map_err(|_| StoreError::Unavailable("the embedded store failed to commit".into()))
        };
        tokio::time::timeout(self.call_timeout, call)
            .await
            .map_err(|_| {
                StoreError::Unavailable(
                    "the embedded store did not answer within the call timeout".into(),
                )
            })?
    }

    pub async fn request_token(
        &self,
        key: &ActionKey,
        req: &TokenRequest,
    ) -> Result<Reply<TokenOutcome>, StoreError> {
        let req = req.clone();
        self.call(key, |tx| Op::Token(req, tx)).await
    }

    pub async fn complete(
        &self,
        key: &ActionKey,
        token: &str,
        receipt: &[u8],
    ) -> Result<Reply<CompleteOutcome>, StoreError> {
        let (token, receipt) = (token.to_owned(), receipt.to_vec());
        self.call(key, |tx| Op::Complete(token, receipt, tx)).await
    }

    pub async fn release(&self, key: &ActionKey, token: &str) -> Result<Reply<u64>, StoreError> {
        let token = token.to_owned();
        self.call(key, |tx| Op::Release(token, tx)).await
    }

    pub async fn extend_lease(
        &self,
        key: &ActionKey,
        token: &str,
        ttl: Millis,
    ) -> Result<Reply<Millis>, StoreError> {
        let token = token.to_owned();
        self.call(key, |tx| Op::Extend(token, ttl, tx)).await
    }

    pub async fn get(&self, key: &ActionKey) -> Result<Reply<ActionView>, StoreError> {
        self.call(key, Op::Get).await
    }

    pub async fn record_external(
        &self,
        key: &ActionKey,
        ext: &ExternalCompletion,
    ) -> Result<Reply<CompleteOutcome>, StoreError> {
        let ext = ext.clone();
        self.call(key, |tx| Op::External(ext, tx)).await
    }

    pub async fn resolve_expired(
        &self,
        key: &ActionKey,
        resolution: &Resolution,
    ) -> Result<Reply<Resolved>, StoreError> {
        let resolution = resolution.clone();
        self.call(key, |tx| Op::Resolve(resolution, tx)).await
    }

    pub async fn list_unresolved(
        &self,
        agent_id: Option<&str>,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Reply<Page>, StoreError> {
        let request = ListRequest {
            agent_id: agent_id.map(str::to_owned),
            after: after.cloned(),
            limit,
        };
        let key = ActionKey::new("", "", "");
        self.call(&key, |tx| Op::List(request, tx)).await
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        let key = ActionKey::new("", "", "");
        self.call(&key, Op::Ping).await
    }

    pub async fn durability(&self) -> Result<Durability, StoreError> {
        Ok(Durability {
            persistent: true,
            summary: "embedded redb file; every acknowledged change was fsynced before the reply"
                .into(),
        })
    }
}

/// The writer thread's state.
struct Writer {
    db: Database,
    clock: Clock,
}

/// A reply waiting for its batch to commit.
type Pending = Box<dyn FnOnce() + Send>;

impl Writer {
    fn run(self, mut rx: mpsc::Receiver<Job>) {
        while let Some(first) = rx.blocking_recv() {
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            if let Err(e) = self.commit_batch(batch) {
                // Dropping the pending replies tells every caller in the batch "unavailable":
                // nothing of the batch was committed.
                tracing::error!(error = %e, "embedded store transaction failed; the batch was not committed");
            }
        }
    }

    fn commit_batch(&self, batch: Vec<Job>) -> Result<(), redb::Error> {
        let now = (self.clock)();
        let txn = self.db.begin_write()?;
        let mut replies: Vec<Pending> = Vec::with_capacity(batch.len());
        let mut dirty = false;
        {
            let mut records = txn.open_table(RECORDS)?;
            let mut expiry = txn.open_table(EXPIRY)?;
            let mut leases = txn.open_table(LEASES)?;
            for job in batch {
                if let Op::List(request, tx) = job.op {
                    let reply = Reply {
                        now,
                        result: Ok(list_unresolved(&records, &leases, &request, now)?),
                    };
                    replies.push(Box::new(move || drop(tx.send(reply))));
                    continue;
                }
                let current = match records.get(job.key.as_slice())? {
                    Some(bytes) => Some(decode(bytes.value())?),
                    None => None,
                };
                let (write, reply) = apply(job.op, current.as_ref(), now);
                if let Write::Put(record) = write {
                    if let Some(old) = &current {
                        expiry.remove(expiry_key(old.expires_at, &job.key).as_slice())?;
                        if let Some(entry) = lease_key(old, &job.key) {
                            leases.remove(entry.as_slice())?;
                        }
                    }
                    let bytes = rmp_serde::to_vec(&record)
                        .map_err(|e| redb::Error::Corrupted(e.to_string()))?;
                    records.insert(job.key.as_slice(), bytes.as_slice())?;
                    expiry.insert(expiry_key(record.expires_at, &job.key).as_slice(), ())?;
                    if let Some(entry) = lease_key(&record, &job.key) {
                        leases.insert(entry.as_slice(), ())?;
                    }
                    dirty = true;
                }
                replies.push(reply);
            }
            dirty |= purge_expired(&mut records, &mut expiry, &mut leases, now)?;
        }
        if dirty {
            txn.commit()?;
        } else {
            // Reads, pings, listings and refusals changed nothing: no fsync for them.
            txn.abort()?;
        }
        for reply in replies {
            reply();
        }
        Ok(())
    }
}

/// Runs one ledger step and packages its reply for after the commit.
fn apply(op: Op, current: Option<&Record>, now: Millis) -> (Write, Pending) {
    fn finish<T: Send + 'static>(
        step: Step<T>,
        now: Millis,
        tx: oneshot::Sender<Reply<T>>,
    ) -> (Write, Pending) {
        let reply = Reply {
            now,
            result: step.reply,
        };
        (step.write, Box::new(move || drop(tx.send(reply))))
    }
    match op {
        Op::Token(req, tx) => finish(ledger::request_token(current, &req, now), now, tx),
        Op::Complete(token, receipt, tx) => {
            finish(ledger::complete(current, &token, &receipt, now), now, tx)
        }
        Op::Release(token, tx) => finish(ledger::release(current, &token, now), now, tx),
        Op::Extend(token, ttl, tx) => {
            finish(ledger::extend_lease(current, &token, ttl, now), now, tx)
        }
        Op::Get(tx) => {
            let reply = Reply {
                now,
                result: Ok(ledger::view(current, now)),
            };
            (Write::Nothing, Box::new(move || drop(tx.send(reply))))
        }
        Op::External(ext, tx) => finish(ledger::record_external(current, &ext, now), now, tx),
        Op::Resolve(resolution, tx) => {
            finish(ledger::resolve_expired(current, &resolution, now), now, tx)
        }
        Op::List(_, tx) => (Write::Nothing, Box::new(move || drop(tx))),
        Op::Ping(tx) => (
            Write::Nothing,
            Box::new(move || {
                let _ = tx.send(());
            }),
        ),
    }
}

fn decode(bytes: &[u8]) -> Result<Record, redb::Error> {
    rmp_serde::from_slice(bytes).map_err(|e| redb::Error::Corrupted(format!("record: {e}")))
}

fn expiry_key(expires_at: Millis, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + key.len());
    out.extend_from_slice(&expires_at.to_be_bytes());
    out.extend_from_slice(key);
    out
}

/// The agent prefix of a lease-index entry: `u32 length ++ agent bytes`.
fn agent_prefix(agent_id: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + agent_id.len());
    out.extend_from_slice(&(agent_id.len() as u32).to_be_bytes());
    out.extend_from_slice(agent_id);
    out
}

/// Millis as big-endian bytes that sort like the numbers (sign bit flipped).
fn ordered(ms: Millis) -> [u8; 8] {
    ((ms as u64) ^ (1 << 63)).to_be_bytes()
}

fn lease_entry(agent_id: &[u8], lease_expires_at: Millis, key: &[u8]) -> Vec<u8> {
    let mut out = agent_prefix(agent_id);
    out.extend_from_slice(&ordered(lease_expires_at));
    out.extend_from_slice(key);
    out
}

/// The lease-index entry of a record, when it is authorized (live or expired).
fn lease_key(record: &Record, key: &[u8]) -> Option<Vec<u8>> {
    let Phase::Authorized {
        lease_expires_at, ..
    } = &record.phase
    else {
        return None;
    };
    let action = ActionKey::decode(key)?;
    Some(lease_entry(
        action.agent_id.as_bytes(),
        *lease_expires_at,
        key,
    ))
}

/// Splits a lease-index entry into (agent, lease_expires_at, action key).
fn split_entry(entry: &[u8]) -> Option<(&[u8], Millis, &[u8])> {
    let len = u32::from_be_bytes(entry.get(..4)?.try_into().ok()?) as usize;
    let agent = entry.get(4..4 + len)?;
    let lease: [u8; 8] = entry.get(4 + len..12 + len)?.try_into().ok()?;
    let lease = (u64::from_be_bytes(lease) ^ (1 << 63)) as Millis;
    Some((agent, lease, &entry[12 + len..]))
}

/// ListUnresolved over the lease index: entries in `(agent, lease, key)` order after the cursor,
/// whose lease has ended and whose record is still unresolved at `now`. Within one agent the
/// scan stops at the first live lease; across agents it jumps to the next agent.
fn list_unresolved(
    records: &redb::Table<&[u8], &[u8]>,
    leases: &redb::Table<&[u8], ()>,
    request: &ListRequest,
    now: Millis,
) -> Result<Page, redb::Error> {
    let only = request.agent_id.as_deref().map(str::as_bytes);
    let mut start = match (&request.after, only) {
        (Some(c), _) => lease_entry(c.agent_id.as_bytes(), c.lease_expires_at, &c.key),
        (None, Some(agent)) => agent_prefix(agent),
        (None, None) => Vec::new(),
    };
    let mut skip_start = request.after.is_some();
    let mut page = Page::default();
    let mut budget = list::scan_budget(request.limit);
    let mut last: Option<ListCursor> = request.after.clone();
    'scan: loop {
        let mut jump = None;
        for entry in leases.range(start.as_slice()..)? {
            let (entry, _) = entry?;
            let entry = entry.value();
            if std::mem::take(&mut skip_start) && entry == start.as_slice() {
                continue;
            }
            let Some((agent, lease, key)) = split_entry(entry) else {
                continue;
            };
            if only.is_some_and(|only| only != agent) {
                break 'scan;
            }
            let Some(action) = ActionKey::decode(key) else {
                continue;
            };
            if page.items.len() >= request.limit || budget == 0 {
                // More may follow: resume after the last entry examined.
                page.next = last.or_else(|| Some(ListCursor::start_of(&action.agent_id)));
                break 'scan;
            }
            budget -= 1;
            if lease > now {
                if only.is_some() {
                    break 'scan;
                }
                // The rest of this agent's leases are live: go on with the next agent.
                let mut next = agent_prefix(agent);
                next.extend_from_slice(&[0xFF; 9]);
                jump = Some(next);
                break;
            }
            let record = match records.get(key)? {
                Some(bytes) => Some(decode(bytes.value())?),
                None => None,
            };
            last = Some(ListCursor::after(&action, lease));
            if ledger::is_unresolved(record.as_ref(), now) {
                page.items.push(Unresolved {
                    view: ledger::view(record.as_ref(), now),
                    key: action,
                });
            }
        }
        match jump {
            Some(next) => start = next,
            None => break,
        }
    }
    Ok(page)
}

/// Removes up to [`PURGE_BATCH`] records whose store expiry has passed, with their lease-index
/// entries.
fn purge_expired(
    records: &mut redb::Table<&[u8], &[u8]>,
    expiry: &mut redb::Table<&[u8], ()>,
    leases: &mut redb::Table<&[u8], ()>,
    now: Millis,
) -> Result<bool, redb::Error> {
    let upper = now.max(0).to_be_bytes();
    let due: Vec<Vec<u8>> = expiry
        .range(..upper.as_slice())?
        .take(PURGE_BATCH)
        .map(|entry| entry.map(|(k, _)| k.value().to_vec()))
        .collect::<Result<_, _>>()?;
    let purged = !due.is_empty();
    for index_key in due {
        expiry.remove(index_key.as_slice())?;
        let key = &index_key[8..];
        let removed = match records.remove(key)? {
            Some(bytes) => Some(decode(bytes.value())?),
            None => None,
        };
        if let Some(entry) = removed.as_ref().and_then(|r| lease_key(r, key)) {
            leases.remove(entry.as_slice())?;
        }
    }
    Ok(purged)
}
