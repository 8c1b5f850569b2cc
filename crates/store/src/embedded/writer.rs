//! The writer thread: drains the queue, applies each step with the ledger inside one write
//! transaction, makes the batch's writes durable in the write-ahead log (one `fdatasync`: group
//! commit), commits the transaction, and only then answers every caller of the batch.

use std::time::{Duration, Instant};

use redb::{Database, Durability, ReadableTable};
use tokio::sync::{mpsc, oneshot};

use super::{
    Clock, Job, MAX_BATCH, Op, chain,
    index::{Tables, list_unresolved, purge_expired},
    wal::{self, Wal},
};
use crate::{Receipts, Reply};
use oncegate_domain::{
    authorization::{self, Side, SideWrite, approval},
    ledger::{self, CompleteOutcome, Millis, Phase, Record, Refusal, Resolved, Step, Write},
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
            for job in batch {
                let op = match job.op {
                    Op::List(request, tx) => {
                        let reply = Reply {
                            now,
                            result: Ok(list_unresolved(
                                &tables.records,
                                &tables.leases,
                                &request,
                                now,
                            )?),
                        };
                        replies.push(Box::new(move || drop(tx.send(reply))));
                        continue;
                    }
                    Op::Chain(request, tx) => {
                        let entries = chain::export(
                            &tables.receipts,
                            &request.agent_id,
                            request.after,
                            request.limit,
                        )?;
                        replies.push(Box::new(move || drop(tx.send(entries))));
                        continue;
                    }
                    Op::Approvals(request, tx) => {
                        let agent = request.agent_id.unwrap_or_default();
                        let page =
                            tables
                                .side
                                .list(&agent, request.after.as_ref(), request.limit, now)?;
                        let reply = Reply {
                            now,
                            result: Ok(page),
                        };
                        replies.push(Box::new(move || drop(tx.send(reply))));
                        continue;
                    }
                    Op::Budgets(agent, tx) => {
                        let reply = Reply {
                            now,
                            result: Ok(tables.side.all_buckets(&agent)?),
                        };
                        replies.push(Box::new(move || drop(tx.send(reply))));
                        continue;
                    }
                    Op::Decide(decision, tx) => {
                        let stored = tables.side.approval(&job.key)?;
                        let result = approval::decide(stored.as_ref(), &decision, now)
                            .map_err(|e| Refusal::ApprovalNotPending { state: e.0 });
                        if let Ok((approval, true)) = &result {
                            let write = SideWrite {
                                approval: Some(approval.clone()),
                                ..SideWrite::default()
                            };
                            tables.side.write(&job.key, write, now)?;
                        }
                        replies.push(Box::new(move || drop(tx.send(Reply { now, result }))));
                        continue;
                    }
                    op => op,
                };
                let current = match tables.records.get(job.key.as_slice())? {
                    Some(bytes) => Some(decode(bytes.value())?),
                    None => None,
                };
                let loaded = match &op {
                    Op::Token(req, _) => tables.side.for_token(&job.key, req)?,
                    Op::Release(..) | Op::Resolve(..) => Side {
                        approval: None,
                        buckets: tables.side.buckets(
                            &job.key,
                            &authorization::reserved_buckets(current.as_ref()),
                        )?,
                    },
                    _ => Side::default(),
                };
                let receipts = &mut tables.receipts;
                let (write, side_write, reply) = apply(
                    op,
                    current.as_ref(),
                    &loaded,
                    now,
                    &mut |(signer, fp), c| {
                        let (key, bytes) = chain::append(receipts, signer, &job.key, fp, c)?;
                        writes.push(wal::Entry::receipt(key, bytes));
                        Ok(())
                    },
                )?;
                tables.side.write(&job.key, side_write, now)?;
                if let Write::Put(record) = write {
                    let bytes = rmp_serde::to_vec(&record)
                        .map_err(|e| redb::Error::Corrupted(e.to_string()))?;
                    tables.put(&job.key, current.as_ref(), Some((&record, &bytes)))?;
                    writes.push(wal::Entry::record(job.key, Some(bytes)));
                }
                replies.push(reply);
            }
            writes.extend(purge_expired(&mut tables, now)?);
            writes.append(&mut tables.side.log);
        }
        if writes.is_empty() {
            // Reads, pings, listings and refusals changed nothing: no fsync for them.
            txn.abort()?;
        } else {
            let frame = wal::encode(&writes);
            if self.wal.fits(frame.len()) {
                // Durable in the log first: the B-tree commit need not fsync.
                self.wal.append(&frame).map_err(redb::Error::Io)?;
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

/// Sends a step's reply once the batch is committed.
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

/// Runs one step (the ledger's, with approvals and budgets for RequestToken, Release and
/// ResolveExpired) and packages its reply for after the commit. A completion the step records is
/// chained (and signed) here, inside the transaction, when the call carries a signer.
fn apply(
    op: Op,
    current: Option<&Record>,
    side: &Side,
    now: Millis,
    chain: &mut Chain<'_>,
) -> Result<(Write, SideWrite, Pending), redb::Error> {
    Ok(match op {
        Op::Token(req, tx) => {
            let guarded = authorization::request_token(current, side, &req, now);
            let (write, reply) = finish(guarded.step, now, tx);
            (write, guarded.side, reply)
        }
        Op::Release(token, tx) => {
            let guarded = authorization::release(current, side, &token, now);
            let (write, reply) = finish(guarded.step, now, tx);
            (write, guarded.side, reply)
        }
        Op::Resolve(resolution, signer, tx) => {
            let mut guarded = authorization::resolve_expired(current, side, &resolution, now);
            if let (Some(signer), Ok(Resolved::Completed(completion))) =
                (&signer, &mut guarded.step.reply)
            {
                chained(&mut guarded.step.write, completion, signer, chain)?;
            }
            let (write, reply) = finish(guarded.step, now, tx);
            (write, guarded.side, reply)
        }
        op => {
            let (write, reply) = apply_ledger(op, current, now, chain)?;
            (write, SideWrite::default(), reply)
        }
    })
}

/// The steps that are the ledger's alone.
fn apply_ledger(
    op: Op,
    current: Option<&Record>,
    now: Millis,
    chain: &mut Chain<'_>,
) -> Result<(Write, Pending), redb::Error> {
    Ok(match op {
        Op::Complete(token, receipt, signer, tx) => {
            let mut step = ledger::complete(current, &token, &receipt, now);
            if let (
                Some(signer),
                Ok(CompleteOutcome {
                    recorded: true,
                    completion,
                    ..
                }),
            ) = (&signer, &mut step.reply)
            {
                chained(&mut step.write, completion, signer, chain)?;
            }
            finish(step, now, tx)
        }
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
        Op::External(ext, signer, tx) => {
            let mut step = ledger::record_external(current, &ext, now);
            if let (
                Some(signer),
                Ok(CompleteOutcome {
                    recorded: true,
                    completion,
                    ..
                }),
            ) = (&signer, &mut step.reply)
            {
                chained(&mut step.write, completion, signer, chain)?;
            }
            finish(step, now, tx)
        }
        // RequestToken, Release and ResolveExpired run in `apply`.
        Op::Token(..) | Op::Release(..) | Op::Resolve(..) => {
            unreachable!("RequestToken, Release and ResolveExpired run in `apply`")
        }
        // Answered before a record is read (see `commit_batch`).
        Op::List(_, tx) => (Write::Nothing, Box::new(move || drop(tx))),
        Op::Chain(_, tx) => (Write::Nothing, Box::new(move || drop(tx))),
        Op::Approvals(_, tx) => (Write::Nothing, Box::new(move || drop(tx))),
        Op::Budgets(_, tx) => (Write::Nothing, Box::new(move || drop(tx))),
        Op::Decide(_, tx) => (Write::Nothing, Box::new(move || drop(tx))),
        Op::Ping(tx) => (
            Write::Nothing,
            Box::new(move || {
                let _ = tx.send(());
            }),
        ),
    })
}

/// Chains the completion a step records: the reply's completion and the record being written get
/// the same place and statement.
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

pub(super) fn decode(bytes: &[u8]) -> Result<Record, redb::Error> {
    rmp_serde::from_slice(bytes).map_err(|e| redb::Error::Corrupted(format!("record: {e}")))
}
