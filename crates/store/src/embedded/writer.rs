//! The writer thread: drains the queue, applies each step with the ledger inside one write
//! transaction, makes the batch's writes durable in the write-ahead log (one `fdatasync`: group
//! commit), commits the transaction, and only then answers every caller of the batch.

use std::time::{Duration, Instant};

use redb::{Database, Durability, ReadableTable};
use tokio::sync::mpsc;

use super::{
    Clock, Job, MAX_BATCH, Op, Tx, chain,
    codec::{self, decode},
    index::{Tables, list_unresolved, purge_expired},
    wal::{self, Wal},
};
use crate::{Receipts, Reply, StoreError};
use oncegate_domain::ledger::{
    self, CompleteOutcome, Millis, Phase, Record, Refusal, Resolved, Side, SideWrite, Step, Write,
    approval,
};

/// How often, at most, the B-tree is committed durably and the log started afresh (also when the
/// log is half full). Between checkpoints the log alone makes batches durable.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

/// The writer thread's state.
pub(super) struct Writer {
    pub(super) db: Database,
    pub(super) clock: Clock,
    pub(super) wal: Wal,
    pub(super) checkpointed: Instant,
}

/// A reply waiting for its batch to commit.
type Pending = Box<dyn FnOnce() + Send>;

impl Writer {
    pub(super) fn run(mut self, mut rx: mpsc::Receiver<Job>) {
        while let Some(first) = rx.blocking_recv() {
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            if let Err(e) = self.commit_batch(batch) {
                // Dropping the pending replies tells every caller in the batch "unavailable". The
                // log and the B-tree may now disagree about this batch: stop, so that nothing is
                // decided on a state a restart (which replays the log) would not have; every
                // later call is unavailable until the process restarts.
                tracing::error!(error = %e, "embedded store write failed; the store stops (restart the gate)");
                return;
            }
        }
        // Every handle is gone (a clean shutdown): leave the B-tree complete and the log empty,
        // so that the file alone holds everything and the next start has nothing to replay.
        if let Err(e) = self.checkpoint() {
            tracing::error!(error = %e, "embedded store: the last checkpoint failed; the next start replays the log");
        }
    }

    fn commit_batch(&mut self, batch: Vec<Job>) -> Result<(), redb::Error> {
        let now = (self.clock)();
        let mut txn = self.db.begin_write()?;
        let mut replies: Vec<Pending> = Vec::with_capacity(batch.len());
        let mut writes: Vec<wal::Entry> = Vec::new();
        {
            let mut tables = Tables::open(&txn)?;
            let mut chains = chain::Batch::default();
            for job in batch {
                if let Some(reply) = run_job(&mut tables, job, now, &mut writes, &mut chains)? {
                    replies.push(reply);
                }
            }
            // One signature per agent whose chain grew, before anything is durable.
            chains.seal(&mut tables.receipts, &mut writes)?;
            writes.extend(purge_expired(&mut tables, now)?);
            writes.append(&mut tables.side.log);
            writes.extend(tables.take_outbox_log());
        }
        if writes.is_empty() {
            // Reads, pings, listings and refusals changed nothing: no fsync for them.
            txn.abort()?;
        } else if self.wal.fits(&writes) {
            // Durable in the log first: the B-tree commit need not fsync.
            self.wal.append(&writes).map_err(redb::Error::Io)?;
            txn.set_durability(Durability::None)
                .map_err(|e| redb::Error::Io(std::io::Error::other(e.to_string())))?;
            txn.commit()?;
            self.checkpoint_if_due()?;
        } else {
            // A frame too big for what is left of the log: commit durably instead.
            txn.commit()?;
            self.wal.reset().map_err(redb::Error::Io)?;
            self.checkpointed = Instant::now();
        }
        for reply in replies {
            reply();
        }
        Ok(())
    }

    /// Commits the B-tree durably and starts the log afresh, once a second or when the log is
    /// half full. A crash between the two replays frames that the B-tree already holds, which
    /// leaves the same records (every frame entry is a whole record).
    fn checkpoint_if_due(&mut self) -> Result<(), redb::Error> {
        if self.checkpointed.elapsed() < CHECKPOINT_EVERY && self.wal.fill() < 0.5 {
            return Ok(());
        }
        self.checkpoint()
    }

    /// Commits the B-tree durably and starts the log afresh.
    fn checkpoint(&mut self) -> Result<(), redb::Error> {
        let txn = self.db.begin_write()?;
        txn.commit()?;
        self.wal.reset().map_err(redb::Error::Io)?;
        self.checkpointed = Instant::now();
        Ok(())
    }
}

/// Appends a recorded completion to its agent's receipt chain (signer, the record's fingerprint).
type Chain<'a> =
    dyn FnMut((&Receipts, &str), &mut ledger::Completion) -> Result<(), redb::Error> + 'a;

/// Runs one job. A value this job needs that cannot be read (its record, approval or buckets, its
/// agent's receipt chain) answers this job `Corrupt` at once, before it writes anything, and the
/// batch goes on (`None`: answered already); any other failure stops the batch.
fn run_job(
    tables: &mut Tables<'_>,
    job: Job,
    now: Millis,
    writes: &mut Vec<wal::Entry>,
    chains: &mut chain::Batch,
) -> Result<Option<Pending>, redb::Error> {
    let Job { key, op } = job;
    let op = match op {
        Op::List(request, tx) => {
            let page = list_unresolved(&tables.records, &tables.leases, &request, now);
            return read(page.map(|p| replied(now, p)), tx);
        }
        Op::Chain(request, tx) => {
            // Entries appended earlier in this batch are stored (and signed) before the read.
            if !chains.is_empty() {
                chains.seal(&mut tables.receipts, writes)?;
            }
            let entries = chain::export(
                &tables.receipts,
                &request.agent_id,
                request.after,
                request.limit,
            );
            return read(entries, tx);
        }
        Op::Approvals(request, tx) => {
            let agent = request.agent_id.unwrap_or_default();
            let page = tables
                .side
                .list(&agent, request.after.as_ref(), request.limit, now);
            return read(page.map(|p| replied(now, p)), tx);
        }
        Op::Budgets(agent, tx) => {
            return read(tables.side.all_buckets(&agent).map(|b| replied(now, b)), tx);
        }
        Op::OutboxAppend(entries, tx) => {
            let written = tables.outbox().and_then(|o| o.append(&entries, now));
            return read(written.map(|n| replied(now, n)), tx);
        }
        Op::OutboxClaim(c, tx) => {
            let claimed = tables
                .outbox()
                .and_then(|o| o.claim(c.limit, c.lease, &c.claim, now));
            return read(claimed.map(|c| replied(now, c)), tx);
        }
        Op::OutboxSettle(s, tx) => {
            let settled = tables
                .outbox()
                .and_then(|o| o.settle(&s.member, &s.claim, &s.settlement, s.keep, now));
            return read(settled.map(|done| replied(now, done)), tx);
        }
        Op::OutboxList(request, tx) => {
            let page = tables
                .outbox()
                .and_then(|o| o.undeliverable(request.after.as_ref(), request.limit));
            return read(page.map(|p| replied(now, p)), tx);
        }
        op => op,
    };
    let (current, side) = match load(tables, chains, &key, &op) {
        Ok(loaded) => loaded,
        Err(redb::Error::Corrupted(what)) => {
            unreadable(&what);
            op.fail(StoreError::corrupt(what));
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let receipts = &tables.receipts;
    let (write, side_write, reply) =
        apply(op, current.as_ref(), &side, now, &mut |(signer, fp), c| {
            chains.append(receipts, signer, &key, fp, c)
        })?;
    tables.side.write(&key, side_write, now)?;
    if let Write::Put(record) = write {
        let bytes = codec::encode(&record)?;
        tables.put(&key, current.as_ref(), Some((&record, &bytes)))?;
        writes.push(wal::Entry::record(key, Some(bytes)));
    }
    Ok(Some(reply))
}

/// A read's value as the reply of a step that wrote nothing.
fn replied<T>(now: Millis, value: T) -> Reply<T> {
    Reply {
        now,
        result: Ok(value),
        replicas: 0,
    }
}

/// A read-only call's answer, sent after the commit; one that met a value it cannot read is
/// answered `Corrupt` at once.
fn read<T: Send + 'static>(
    value: Result<T, redb::Error>,
    tx: Tx<T>,
) -> Result<Option<Pending>, redb::Error> {
    match value {
        Ok(value) => Ok(Some(Box::new(move || drop(tx.send(Ok(value)))))),
        Err(redb::Error::Corrupted(what)) => {
            unreadable(&what);
            let _ = tx.send(Err(StoreError::corrupt(what)));
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

fn unreadable(what: &str) {
    tracing::error!(%what, "embedded store: a stored value cannot be read; this call fails, the others go on");
}

/// Reads the record and the side state a step runs on, decoding every stored value it needs before
/// anything is written (a `Corrupted` error names the one that cannot be read).
fn load(
    tables: &Tables<'_>,
    chains: &mut chain::Batch,
    key: &[u8],
    op: &Op,
) -> Result<(Option<Record>, Side), redb::Error> {
    let current = match tables.records.get(key)? {
        Some(bytes) => Some(decode(key, bytes.value())?),
        None => None,
    };
    let side = match op {
        Op::Token(req, _) => tables.side.for_token(key, req)?,
        Op::Release(..) | Op::Resolve(..) => Side {
            approval: None,
            buckets: tables
                .side
                .buckets(key, &ledger::reserved_buckets(current.as_ref()))?,
        },
        Op::Decide(..) => Side {
            approval: tables.side.approval(key)?,
            buckets: Default::default(),
        },
        _ => Side::default(),
    };
    if let Op::Complete(_, _, Some(_), _)
    | Op::External(_, Some(_), _)
    | Op::Resolve(_, _, Some(_), _) = op
    {
        // The chain's last entry, read now (once per batch) so that an unreadable one fails this
        // call only.
        chains.check_tail(&tables.receipts, key)?;
    }
    Ok((current, side))
}

/// Sends a step's reply once the batch is committed.
fn finish<T: Send + 'static>(
    step: Step<T>,
    now: Millis,
    tx: Tx<Reply<T>>,
) -> (Write, SideWrite, Pending) {
    let reply = Reply {
        now,
        result: step.reply,
        replicas: 0,
    };
    (
        step.write,
        step.side,
        Box::new(move || drop(tx.send(Ok(reply)))),
    )
}

/// Sends a read's answer once the batch is committed.
fn answer<T: Send + 'static>(value: T, tx: Tx<T>) -> (Write, SideWrite, Pending) {
    (
        Write::Nothing,
        SideWrite::default(),
        Box::new(move || drop(tx.send(Ok(value)))),
    )
}

/// Runs one step of the ledger (with the agent's approvals and budgets where it has any) and
/// packages its reply for after the commit. A completion the step records is chained here, inside
/// the transaction, when the call carries a signer (the batch's head is signed before the commit).
fn apply(
    op: Op,
    current: Option<&Record>,
    side: &Side,
    now: Millis,
    chain: &mut Chain<'_>,
) -> Result<(Write, SideWrite, Pending), redb::Error> {
    Ok(match op {
        Op::Token(req, tx) => finish(ledger::request_token(current, side, &req, now), now, tx),
        Op::Release(token, tx) => finish(ledger::release(current, side, &token, now), now, tx),
        Op::Resolve(resolution, expected, signer, tx) => {
            let mut step = ledger::resolve_expired(current, side, &resolution, expected, now);
            if let (Some(signer), Ok(Resolved::Completed(completion))) = (&signer, &mut step.reply)
            {
                chained(&mut step.write, completion, signer, chain)?;
            }
            finish(step, now, tx)
        }
        Op::Complete(token, receipt, signer, tx) => {
            let mut step = ledger::complete(current, &token, &receipt, now);
            record_chained(&mut step, signer.as_ref(), chain)?;
            finish(step, now, tx)
        }
        Op::External(ext, signer, tx) => {
            let mut step = ledger::record_external(current, &ext, now);
            record_chained(&mut step, signer.as_ref(), chain)?;
            finish(step, now, tx)
        }
        Op::Extend(token, ttl, tx) => {
            finish(ledger::extend_lease(current, &token, ttl, now), now, tx)
        }
        Op::Get(tx) => answer(replied(now, ledger::view(current, now)), tx),
        Op::Decide(decision, tx) => {
            let result = approval::decide(side.approval.as_ref(), &decision, now)
                .map_err(|e| Refusal::ApprovalNotPending { state: e.0 });
            let write = match &result {
                Ok((approval, true)) => SideWrite {
                    approval: Some(approval.clone()),
                    ..SideWrite::default()
                },
                _ => SideWrite::default(),
            };
            let (_, _, pending) = answer(
                Reply {
                    now,
                    result,
                    replicas: 0,
                },
                tx,
            );
            (Write::Nothing, write, pending)
        }
        Op::Ping(tx) => answer((), tx),
        // Answered before a record is read (`run_job`).
        Op::List(..)
        | Op::Chain(..)
        | Op::Approvals(..)
        | Op::Budgets(..)
        | Op::OutboxAppend(..)
        | Op::OutboxClaim(..)
        | Op::OutboxSettle(..)
        | Op::OutboxList(..) => {
            unreachable!("read-only calls are answered before a step is loaded")
        }
    })
}

/// Chains the completion a Complete or an operator's completion records, when the call signs.
fn record_chained(
    step: &mut Step<CompleteOutcome>,
    signer: Option<&Receipts>,
    chain: &mut Chain<'_>,
) -> Result<(), redb::Error> {
    if let (
        Some(signer),
        Ok(CompleteOutcome {
            recorded: true,
            completion,
            ..
        }),
    ) = (signer, &mut step.reply)
    {
        chained(&mut step.write, completion, signer, chain)?;
    }
    Ok(())
}

/// Chains the completion a step records: the reply's completion and the record being written get
/// the same place (and no statement: the chain's head carries it).
fn chained(
    write: &mut Write,
    completion: &mut ledger::Completion,
    signer: &Receipts,
    chain: &mut Chain<'_>,
) -> Result<(), redb::Error> {
    let Write::Put(record) = write else {
        return Err(redb::Error::Corrupted(
            "a recorded completion without a write".into(),
        ));
    };
    chain((signer, &record.fingerprint), completion)?;
    if let Phase::Completed(stored) = &mut record.phase {
        stored.seq = completion.seq;
        stored.statement = completion.statement.clone();
    }
    Ok(())
}
