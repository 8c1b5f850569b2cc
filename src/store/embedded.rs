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
//! batch per transaction, so the file does not grow without end.

use std::{path::Path, sync::Arc, thread};

use redb::{Database, ReadableTable, TableDefinition};
use tokio::sync::{mpsc, oneshot};

use super::{ActionKey, Durability, Reply, StoreError};
use crate::ledger::{
    self, ActionView, CompleteOutcome, Millis, Record, Step, TokenOutcome, TokenRequest, Write,
};

/// action key (encoded) → record (MessagePack).
const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("records");
/// expires_at (big-endian i64) ++ action key → ().
const EXPIRY: TableDefinition<&[u8], ()> = TableDefinition::new("expiry");

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
    Ping(oneshot::Sender<()>),
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
        Ok(Self { tx })
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
        self.tx.send(job).await.map_err(|_| {
            StoreError::Unavailable("the embedded store's writer has stopped".into())
        })?;
        reply_rx
            .await
            .map_err(|_| StoreError::Unavailable("the embedded store failed to commit".into()))
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
            for job in batch {
                let current = match records.get(job.key.as_slice())? {
                    Some(bytes) => Some(decode(bytes.value())?),
                    None => None,
                };
                let (write, reply) = apply(job.op, current.as_ref(), now);
                if let Write::Put(record) = write {
                    if let Some(old) = &current {
                        expiry.remove(expiry_key(old.expires_at, &job.key).as_slice())?;
                    }
                    let bytes = rmp_serde::to_vec(&record)
                        .map_err(|e| redb::Error::Corrupted(e.to_string()))?;
                    records.insert(job.key.as_slice(), bytes.as_slice())?;
                    expiry.insert(expiry_key(record.expires_at, &job.key).as_slice(), ())?;
                    dirty = true;
                }
                replies.push(reply);
            }
            dirty |= purge_expired(&mut records, &mut expiry, now)?;
        }
        if dirty {
            txn.commit()?;
        } else {
            // Reads, pings and refusals changed nothing: no fsync for them.
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

/// Removes up to [`PURGE_BATCH`] records whose store expiry has passed; true when it removed any.
fn purge_expired(
    records: &mut redb::Table<&[u8], &[u8]>,
    expiry: &mut redb::Table<&[u8], ()>,
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
        records.remove(&index_key[8..])?;
    }
    Ok(purged)
}
