//! The embedded store: one redb file under `--data-dir`, durable and crash-safe, with the same
//! semantics as Redis because it runs [`oncegate_domain::ledger`] itself.
//!
//! One writer thread owns the database. Calls queue up on a channel; the writer drains whatever is
//! waiting, applies each step in order inside **one** write transaction (so each step sees the
//! previous one's write, and each is atomic with respect to the others), appends the batch's
//! writes to the write-ahead log with one `fdatasync` ([`wal`]), commits the transaction, and only
//! then answers every caller in the batch. This is group commit: under load many calls share one
//! fsync, and no call is acknowledged before its write is on disk. The B-tree itself is committed
//! durably once a second (a checkpoint), after which the log starts over.
//!
//! Expired records are removed by the writer from an expiry index (`expires_at ++ key`), a bounded
//! batch per transaction, so the file does not grow without end. A lease index
//! (`agent ++ lease_expires_at ++ key`, one entry per authorized record) is kept in the same
//! transaction as every write, so ListUnresolved never scans the records.
//!
//! The webhook outbox is four more tables ([`outbox`]), written by the same writer in the same
//! transactions.
//!
//! Every call has a deadline (given to [`EmbeddedStore::open`]): a caller that waits longer gets
//! `Unavailable` (the step may still be applied, as the Store contract allows).

mod chain;
mod codec;
mod index;
mod keys;
mod outbox;
mod side;
mod wal;
mod writer;

use std::{path::Path, sync::Arc, thread, time::Duration};

use redb::TableDefinition;
use tokio::sync::{mpsc, oneshot};

use super::{
    ApprovalPage, Claimed, Durability, ListCursor, NewEntry, OutboxPage, Page, Receipts, Reply,
    Settlement, StoreError,
};
use oncegate_domain::{
    ActionKey,
    ledger::{
        ActionView, CompleteOutcome, ExternalCompletion, Millis, Resolution, Resolved,
        TokenOutcome, TokenRequest,
    },
    ledger::{Approval, Bucket, approval::Decision},
    statement::receipt::ChainEntry,
};
use writer::Writer;

/// action key (encoded) → record (MessagePack).
pub(super) const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("records");
/// expires_at (big-endian i64) ++ action key → ().
pub(super) const EXPIRY: TableDefinition<&[u8], ()> = TableDefinition::new("expiry");
/// agent (u32 length ++ bytes) ++ lease_expires_at (order-preserving u64) ++ action key → ().
/// One entry per authorized record: the ListUnresolved index.
pub(super) const LEASES: TableDefinition<&[u8], ()> = TableDefinition::new("leases");

/// action key (encoded) → its approval (MessagePack).
pub(super) const APPROVALS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("approvals");
/// agent (u32 length ++ bytes) ++ lapse time (order-preserving u64) ++ action key → ().
pub(super) const APPROVAL_INDEX: TableDefinition<&[u8], ()> =
    TableDefinition::new("approval_index");
/// agent (u32 length ++ bytes) ++ bucket id → the bucket (MessagePack).
pub(super) const BUDGETS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("budgets");

/// How many expired records one transaction removes at most.
pub(super) const PURGE_BATCH: usize = 256;
/// How many queued calls one transaction takes at most.
pub(super) const MAX_BATCH: usize = 1024;

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
    closed: Closed,
}

/// Whether the writer thread has ended and closed the file, which it does once every handle is
/// dropped: a program that opens the same directory again in the same process (the Python
/// client's in-process gate after a stop) waits for it, since the file stays locked until then.
/// Holding it keeps nothing open.
#[derive(Clone, Default)]
pub struct Closed(Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>);

impl Closed {
    /// Waits at most `timeout` for the file to be closed; whether it is.
    pub fn wait(&self, timeout: Duration) -> bool {
        let (done, changed) = &*self.0;
        let done = done
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (done, _) = changed
            .wait_timeout_while(done, timeout, |done| !*done)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *done
    }

    fn set(&self) {
        let (done, changed) = &*self.0;
        *done
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = true;
        changed.notify_all();
    }
}

/// One queued call: a step to run against the stored record, and where to send its answer.
pub(super) struct Job {
    pub(super) key: Vec<u8>,
    pub(super) op: Op,
}

/// Where a call's answer goes: its value, or the error that stopped it (a record of this action
/// that cannot be read: `Corrupt`). A dropped sender means the batch did not commit.
pub(super) type Tx<T> = oneshot::Sender<Result<T, StoreError>>;

pub(super) enum Op {
    Token(TokenRequest, Tx<Reply<TokenOutcome>>),
    Complete(
        String,
        Vec<u8>,
        Option<Receipts>,
        Tx<Reply<CompleteOutcome>>,
    ),
    Release(String, Tx<Reply<u64>>),
    Extend(String, Millis, Tx<Reply<Millis>>),
    Get(Tx<Reply<ActionView>>),
    External(
        ExternalCompletion,
        Option<Receipts>,
        Tx<Reply<CompleteOutcome>>,
    ),
    Resolve(
        Resolution,
        Option<u64>,
        Option<Receipts>,
        Tx<Reply<Resolved>>,
    ),
    List(ListRequest, Tx<Reply<Page>>),
    Chain(ChainRequest, Tx<Vec<ChainEntry>>),
    Decide(Decision, Tx<Reply<(Approval, bool)>>),
    Approvals(ListRequest, Tx<Reply<ApprovalPage>>),
    Budgets(String, Tx<Reply<Vec<(String, Bucket)>>>),
    Ping(Tx<()>),
    OutboxAppend(Vec<NewEntry>, Tx<Reply<u32>>),
    OutboxClaim(OutboxClaim, Tx<Reply<Claimed>>),
    OutboxSettle(OutboxSettle, Tx<Reply<bool>>),
    OutboxList(ListRequest, Tx<Reply<OutboxPage>>),
}

/// An outbox claim.
pub(super) struct OutboxClaim {
    pub(super) limit: usize,
    pub(super) lease: Millis,
    pub(super) claim: String,
}

/// An outbox settlement.
pub(super) struct OutboxSettle {
    pub(super) member: Vec<u8>,
    pub(super) claim: String,
    pub(super) settlement: Settlement,
    pub(super) keep: Millis,
}

impl Op {
    /// Answers the call with `error` instead of a value.
    pub(super) fn fail(self, error: StoreError) {
        fn send<T>(tx: Tx<T>, error: StoreError) {
            let _ = tx.send(Err(error));
        }
        match self {
            Op::Token(_, tx) => send(tx, error),
            Op::Complete(.., tx) | Op::External(.., tx) => send(tx, error),
            Op::Release(_, tx) => send(tx, error),
            Op::Extend(_, _, tx) => send(tx, error),
            Op::Get(tx) => send(tx, error),
            Op::Resolve(.., tx) => send(tx, error),
            Op::List(_, tx) => send(tx, error),
            Op::Chain(_, tx) => send(tx, error),
            Op::Decide(_, tx) => send(tx, error),
            Op::Approvals(_, tx) => send(tx, error),
            Op::Budgets(_, tx) => send(tx, error),
            Op::Ping(tx) => send(tx, error),
            Op::OutboxAppend(_, tx) => send(tx, error),
            Op::OutboxClaim(_, tx) => send(tx, error),
            Op::OutboxSettle(_, tx) => send(tx, error),
            Op::OutboxList(_, tx) => send(tx, error),
        }
    }
}

/// A read of one agent's receipt chain.
pub(super) struct ChainRequest {
    pub(super) agent_id: String,
    pub(super) after: u64,
    pub(super) limit: usize,
}

/// A ListUnresolved call.
pub(super) struct ListRequest {
    pub(super) agent_id: Option<String>,
    pub(super) after: Option<ListCursor>,
    pub(super) limit: usize,
}

/// The default size of redb's page cache, in MiB (`--embedded-cache-mb`). redb's own default is
/// 1 GiB, which a gate fills as its file grows: the cache, not the data, was most of the gate's
/// memory. Hot records are recent ones, so a small cache serves the load.
pub const DEFAULT_CACHE_MB: u64 = 64;

impl EmbeddedStore {
    /// Opens (or creates) `oncegate.redb` in `dir` with the default cache ([`DEFAULT_CACHE_MB`])
    /// and starts the writer thread. A caller that waits longer than `call_timeout` for its step
    /// gets `Unavailable`.
    pub fn open(dir: &Path, clock: Clock, call_timeout: Duration) -> Result<Self, StoreError> {
        Self::open_with_cache(dir, clock, call_timeout, DEFAULT_CACHE_MB << 20)
    }

    /// [`EmbeddedStore::open`] with a page cache of `cache_bytes`: the bound of the memory redb
    /// holds for the file, whatever its size.
    pub fn open_with_cache(
        dir: &Path,
        clock: Clock,
        call_timeout: Duration,
        cache_bytes: u64,
    ) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| StoreError::unavailable_by(format!("creating {}", dir.display()), e))?;
        let path = dir.join("oncegate.redb");
        let db = redb::Builder::new()
            .set_cache_size(usize::try_from(cache_bytes).unwrap_or(usize::MAX))
            .create(&path)
            .map_err(|e| StoreError::unavailable_by(format!("opening {}", path.display()), e))?;
        let (mut wal, frames) = wal::Wal::open(dir).map_err(|e| {
            StoreError::unavailable_by(format!("opening the log in {}", dir.display()), e)
        })?;
        let recovered = frames.len();
        // The tables, and the batches the log holds beyond the B-tree's last durable commit (a
        // crash came between a batch's log write and the next checkpoint), committed durably
        // before the log starts a new generation.
        let mut setup = || -> Result<(), redb::Error> {
            let txn = db.begin_write()?;
            {
                let mut tables = index::Tables::open(&txn)?;
                for entry in frames.iter().flatten() {
                    tables.replay(entry)?;
                }
            }
            txn.commit()?;
            wal.reset().map_err(redb::Error::Io)
        };
        setup()
            .map_err(|e| StoreError::unavailable_by(format!("preparing {}", path.display()), e))?;
        if recovered > 0 {
            tracing::info!(
                batches = recovered,
                "embedded store: replayed the write-ahead log"
            );
        }
        let (tx, rx) = mpsc::channel(4 * MAX_BATCH);
        let writer = Writer {
            db,
            clock,
            wal,
            checkpointed: std::time::Instant::now(),
        };
        let closed = Closed::default();
        let on_exit = closed.clone();
        thread::Builder::new()
            .name("oncegate-embedded-writer".into())
            .spawn(move || {
                // `run` owns the database: it is closed when `run` returns.
                writer.run(rx);
                on_exit.set();
            })
            .map_err(|e| StoreError::unavailable_by("starting the writer thread", e))?;
        Ok(Self {
            tx,
            call_timeout,
            closed,
        })
    }

    /// What tells when the file is closed (every handle dropped, the writer ended).
    pub fn closed(&self) -> Closed {
        self.closed.clone()
    }

    async fn call<T>(
        &self,
        key: &ActionKey,
        make: impl FnOnce(Tx<T>) -> Op,
    ) -> Result<T, StoreError> {
        let (reply_tx, reply_rx) = oneshot::channel();
        let job = Job {
            key: key.encode(),
            op: make(reply_tx),
        };
        let call = async {
            self.tx
                .send(job)
                .await
                .map_err(|_| StoreError::unavailable("the embedded store's writer has stopped"))?;
            reply_rx
                .await
                .map_err(|_| StoreError::unavailable("the embedded store failed to commit"))
        };
        tokio::time::timeout(self.call_timeout, call)
            .await
            .map_err(|_| {
                StoreError::unavailable("the embedded store did not answer within the call timeout")
            })??
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
        receipts: Option<&Receipts>,
    ) -> Result<Reply<CompleteOutcome>, StoreError> {
        let (token, receipt, receipts) = (token.to_owned(), receipt.to_vec(), receipts.cloned());
        self.call(key, |tx| Op::Complete(token, receipt, receipts, tx))
            .await
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
        receipts: Option<&Receipts>,
    ) -> Result<Reply<CompleteOutcome>, StoreError> {
        let (ext, receipts) = (ext.clone(), receipts.cloned());
        self.call(key, |tx| Op::External(ext, receipts, tx)).await
    }

    pub async fn resolve_expired(
        &self,
        key: &ActionKey,
        resolution: &Resolution,
        expected: Option<u64>,
        receipts: Option<&Receipts>,
    ) -> Result<Reply<Resolved>, StoreError> {
        let (resolution, receipts) = (resolution.clone(), receipts.cloned());
        self.call(key, |tx| Op::Resolve(resolution, expected, receipts, tx))
            .await
    }

    /// Up to `limit` entries of `agent_id`'s receipt chain after entry `after`.
    pub async fn receipts(
        &self,
        agent_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<ChainEntry>, StoreError> {
        let request = ChainRequest {
            agent_id: agent_id.to_owned(),
            after,
            limit,
        };
        let key = ActionKey::new("", "", "");
        self.call(&key, |tx| Op::Chain(request, tx)).await
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

    pub async fn decide_approval(
        &self,
        key: &ActionKey,
        decision: &Decision,
    ) -> Result<Reply<(Approval, bool)>, StoreError> {
        let decision = decision.clone();
        self.call(key, |tx| Op::Decide(decision, tx)).await
    }

    pub async fn list_approvals(
        &self,
        agent_id: &str,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Reply<ApprovalPage>, StoreError> {
        let request = ListRequest {
            agent_id: Some(agent_id.to_owned()),
            after: after.cloned(),
            limit,
        };
        let key = ActionKey::new("", "", "");
        self.call(&key, |tx| Op::Approvals(request, tx)).await
    }

    pub async fn budgets(
        &self,
        agent_id: &str,
    ) -> Result<Reply<Vec<(String, Bucket)>>, StoreError> {
        let agent = agent_id.to_owned();
        let key = ActionKey::new("", "", "");
        self.call(&key, |tx| Op::Budgets(agent, tx)).await
    }

    pub async fn outbox_append(&self, entries: &[NewEntry]) -> Result<Reply<u32>, StoreError> {
        let entries = entries.to_vec();
        let key = ActionKey::new("", "", "");
        self.call(&key, |tx| Op::OutboxAppend(entries, tx)).await
    }

    pub async fn outbox_claim(
        &self,
        limit: usize,
        lease: Millis,
        claim: &str,
    ) -> Result<Reply<Claimed>, StoreError> {
        let request = OutboxClaim {
            limit,
            lease,
            claim: claim.to_owned(),
        };
        let key = ActionKey::new("", "", "");
        self.call(&key, |tx| Op::OutboxClaim(request, tx)).await
    }

    pub async fn outbox_settle(
        &self,
        webhook: &str,
        id: &str,
        claim: &str,
        settlement: &Settlement,
        keep: Millis,
    ) -> Result<Reply<bool>, StoreError> {
        let request = OutboxSettle {
            member: crate::outbox::member(webhook, id),
            claim: claim.to_owned(),
            settlement: settlement.clone(),
            keep,
        };
        let key = ActionKey::new("", "", "");
        self.call(&key, |tx| Op::OutboxSettle(request, tx)).await
    }

    pub async fn outbox_undeliverable(
        &self,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Reply<OutboxPage>, StoreError> {
        let request = ListRequest {
            agent_id: None,
            after: after.cloned(),
            limit,
        };
        let key = ActionKey::new("", "", "");
        self.call(&key, |tx| Op::OutboxList(request, tx)).await
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
