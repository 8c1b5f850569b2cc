//! The writer thread: drains the queue, applies each step with the ledger inside one write
//! transaction, commits (fsync) and only then answers every caller of the batch.

use redb::{Database, ReadableTable};
use tokio::sync::{mpsc, oneshot};

use super::{
    Clock, EXPIRY, Job, LEASES, MAX_BATCH, Op, RECORDS,
    chain::{self, RECEIPTS},
    index::{expiry_key, lease_key, list_unresolved, purge_expired},
};
use crate::{
    domain::ledger::{self, CompleteOutcome, Millis, Phase, Record, Resolved, Step, Write},
    store::{Receipts, Reply},
};

/// The writer thread's state.
pub(super) struct Writer {
    pub(super) db: Database,
    pub(super) clock: Clock,
}

/// A reply waiting for its batch to commit.
type Pending = Box<dyn FnOnce() + Send>;

impl Writer {
    pub(super) fn run(self, mut rx: mpsc::Receiver<Job>) {
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
            let mut receipts = txn.open_table(RECEIPTS)?;
            for job in batch {
                let op = match job.op {
                    Op::List(request, tx) => {
                        let reply = Reply {
                            now,
                            result: Ok(list_unresolved(&records, &leases, &request, now)?),
                        };
                        replies.push(Box::new(move || drop(tx.send(reply))));
                        continue;
                    }
                    Op::Chain(request, tx) => {
                        let entries = chain::export(
                            &receipts,
                            &request.agent_id,
                            request.after,
                            request.limit,
                        )?;
                        replies.push(Box::new(move || drop(tx.send(entries))));
                        continue;
                    }
                    op => op,
                };
                let current = match records.get(job.key.as_slice())? {
                    Some(bytes) => Some(decode(bytes.value())?),
                    None => None,
                };
                let (write, reply) = apply(op, current.as_ref(), now, &mut |w, c| {
                    chain::append(&mut receipts, w.0, &job.key, w.1, c)
                })?;
                if let Write::Put(record) = write {
                    if let Some(old) = &current {
                        if let Some(at) = old.expires_at {
                            expiry.remove(expiry_key(at, &job.key).as_slice())?;
                        }
                        if let Some(entry) = lease_key(old, &job.key) {
                            leases.remove(entry.as_slice())?;
                        }
                    }
                    let bytes = rmp_serde::to_vec(&record)
                        .map_err(|e| redb::Error::Corrupted(e.to_string()))?;
                    records.insert(job.key.as_slice(), bytes.as_slice())?;
                    if let Some(at) = record.expires_at {
                        expiry.insert(expiry_key(at, &job.key).as_slice(), ())?;
                    }
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

/// Appends a recorded completion to its agent's receipt chain (signer, the record's fingerprint).
type Chain<'a> =
    dyn FnMut((&Receipts, &str), &mut ledger::Completion) -> Result<(), redb::Error> + 'a;

/// Runs one ledger step and packages its reply for after the commit. A completion the step
/// records is chained (and signed) here, inside the transaction, when the call carries a signer.
fn apply(
    op: Op,
    current: Option<&Record>,
    now: Millis,
    chain: &mut Chain<'_>,
) -> Result<(Write, Pending), redb::Error> {
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
    Ok(match op {
        Op::Token(req, tx) => finish(ledger::request_token(current, &req, now), now, tx),
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
        Op::Resolve(resolution, signer, tx) => {
            let mut step = ledger::resolve_expired(current, &resolution, now);
            if let (Some(signer), Ok(Resolved::Completed(completion))) = (&signer, &mut step.reply)
            {
                chained(&mut step.write, completion, signer, chain)?;
            }
            finish(step, now, tx)
        }
        Op::List(_, tx) => (Write::Nothing, Box::new(move || drop(tx))),
        Op::Chain(_, tx) => (Write::Nothing, Box::new(move || drop(tx))),
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
