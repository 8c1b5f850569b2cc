//! The lease heartbeat of the native guard loop ([`crate::guard`]): extends a grant's lease every
//! third of its length while the guarded function runs, and only extends (it never completes,
//! releases or decides anything about the outcome). The threaded Python guard's heartbeat
//! (`oncegate/guard/heartbeat.py`) does the same for attempts that do not run on this loop.
//!
//! One scheduler thread per process serves every lease (a heap of due times). Starting a
//! heartbeat is a heap push under a lock (waking the thread only when it is the earliest),
//! stopping it a flag and a count: most guarded calls finish long before their first extension
//! is due, and the stopped leases are swept from the heap once they are more than half of it, so
//! the thread wakes for leases still running, not once per call. An extension runs on the background runtime, on the channel's background
//! connection; a failed one asks Python (`failed(key, error)`, with the GIL) whether to keep
//! extending, so that the decision and the log line are the Python heartbeat's.
//!
//! A forked child starts a scheduler of its own on its first heartbeat (threads do not survive a
//! fork); the parent's is leaked there, as the runtimes are.

use std::{
    cmp::Ordering,
    collections::BinaryHeap,
    sync::{
        Arc, Condvar, Mutex, PoisonError,
        atomic::{self, AtomicBool, AtomicU64, AtomicUsize},
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use oncegate_proto as pb;
use prost::Message;
use pyo3::prelude::*;

use crate::{
    channel::{Channel, failure},
    runtime::{self, Mode},
    wire::EXTEND_LEASE,
    worker,
};

/// Stopped leases the heap may hold before a sweep is considered.
const SWEEP_AFTER: usize = 64;

/// One grant's lease, extended until [`Lease::stop`].
pub struct Lease {
    stopped: AtomicBool,
    channel: Py<Channel>,
    request: pb::ExtendLeaseRequest,
    interval: Duration,
    timeout: Option<f64>,
    metadata: Vec<(String, String)>,
    /// `failed(key, error) -> bool`: whether to keep extending after `error`.
    failed: Py<PyAny>,
    scheduler: Arc<Scheduler>,
}

impl Lease {
    /// Stops extending; an extension already in flight is left to finish on its own. Its entry
    /// stays in the heap until it comes due or the stopped ones are swept.
    pub fn stop(&self) {
        if !self.stopped.swap(true, atomic::Ordering::AcqRel) {
            self.scheduler.forget();
        }
    }

    fn stopped(&self) -> bool {
        self.stopped.load(atomic::Ordering::Acquire)
    }
}

/// What [`start`] needs to know of a grant.
pub struct Grant {
    pub agent_id: String,
    pub run_id: String,
    pub key: String,
    pub token: String,
    /// The lease the heartbeat keeps: extended to this from now, every third of it.
    pub ttl: Duration,
}

/// Starts extending `grant`'s lease through `channel`, a third of its length from now.
pub fn start(
    py: Python<'_>,
    channel: Py<Channel>,
    grant: Grant,
    timeout: Option<f64>,
    metadata: Vec<(String, String)>,
    failed: Py<PyAny>,
) -> Arc<Lease> {
    let ttl = i64::try_from(grant.ttl.as_nanos()).unwrap_or(i64::MAX);
    let scheduler = scheduler(py);
    let lease = Arc::new(Lease {
        stopped: AtomicBool::new(false),
        channel,
        request: pb::ExtendLeaseRequest {
            action: Some(pb::ActionRef {
                scope: Some(pb::Scope {
                    agent_id: grant.agent_id,
                    run_id: grant.run_id,
                }),
                key: grant.key,
            }),
            token: grant.token,
            ttl: Some(worker::duration(ttl)),
        },
        interval: grant.ttl / 3,
        timeout,
        metadata,
        failed,
        scheduler: Arc::clone(&scheduler),
    });
    scheduler.schedule(Arc::clone(&lease));
    lease
}

/// A lease due at `at`; the heap's order is the earliest first (then the first scheduled).
struct Due {
    at: Instant,
    order: u64,
    lease: Arc<Lease>,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Due {}

impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Due {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: BinaryHeap is a max-heap, the earliest must come out first.
        (other.at, other.order).cmp(&(self.at, self.order))
    }
}

/// Every heartbeat of one process generation.
struct Scheduler {
    due: Mutex<BinaryHeap<Due>>,
    wake: Condvar,
    order: AtomicU64,
    /// Stopped leases still in the heap. Past half of it they are swept: otherwise the thread
    /// would wake once per guarded call, when its stopped lease comes due, only to drop it.
    stale: AtomicUsize,
}

impl Scheduler {
    /// Schedules `lease`'s next extension a third of its lease from now; wakes the thread only
    /// when it becomes the earliest.
    fn schedule(&self, lease: Arc<Lease>) {
        let entry = Due {
            at: Instant::now() + lease.interval,
            order: self.order.fetch_add(1, atomic::Ordering::Relaxed),
            lease,
        };
        let mut due = self.due.lock().unwrap_or_else(PoisonError::into_inner);
        let earliest = due.peek().is_none_or(|first| entry.at < first.at);
        due.push(entry);
        drop(due);
        if earliest {
            self.wake.notify_one();
        }
    }

    /// One more stopped lease in the heap; past half of it (and past a few), they are swept.
    fn forget(&self) {
        let stale = self.stale.fetch_add(1, atomic::Ordering::Relaxed) + 1;
        if stale <= SWEEP_AFTER {
            return;
        }
        let mut due = self.due.lock().unwrap_or_else(PoisonError::into_inner);
        let stale = self.stale.load(atomic::Ordering::Relaxed);
        if stale > SWEEP_AFTER && stale * 2 > due.len() {
            due.retain(|entry| !entry.lease.stopped());
            self.stale.store(0, atomic::Ordering::Relaxed);
        }
    }

    /// The next lease due and not stopped (a stopped one is dropped when it comes due).
    fn next(&self) -> Arc<Lease> {
        let mut due = self.due.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let Some(first) = due.peek() else {
                due = self.wake.wait(due).unwrap_or_else(PoisonError::into_inner);
                continue;
            };
            let now = Instant::now();
            if first.at > now {
                let wait = first.at - now;
                due = self
                    .wake
                    .wait_timeout(due, wait)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
                continue;
            }
            if let Some(Due { lease, .. }) = due.pop() {
                if !lease.stopped() {
                    return lease;
                }
                // Best effort: a sweep may have counted it already.
                let _ = self.stale.fetch_update(
                    atomic::Ordering::Relaxed,
                    atomic::Ordering::Relaxed,
                    |stale| stale.checked_sub(1),
                );
            }
        }
    }

    fn run(self: Arc<Self>) {
        loop {
            let lease = self.next();
            self.extend(lease);
        }
    }

    /// Sends one ExtendLease for `lease` on the background runtime, then schedules the next one
    /// unless it was stopped meanwhile or Python says to stop after a failure.
    fn extend(self: &Arc<Self>, lease: Arc<Lease>) {
        // The link and the runtime are the channel's, read with the GIL (as every call does); None
        // while the interpreter shuts down.
        let Some(started) = runtime::with_python(|py| {
            let channel = lease.channel.get();
            match channel
                .route(Mode::Background)
                .and_then(|(route, runtime)| {
                    let call = channel.prepare(
                        EXTEND_LEASE,
                        Bytes::from(lease.request.encode_to_vec()),
                        lease.timeout,
                        lease.metadata.clone(),
                    )?;
                    Ok((route, runtime, call))
                }) {
                Ok(started) => Some(started),
                Err(err) => {
                    // A closed channel: ask Python, as for a failed call.
                    if keep_extending(py, &lease, err) {
                        self.schedule(Arc::clone(&lease));
                    }
                    None
                }
            }
        })
        .flatten() else {
            return;
        };
        let (route, runtime, call) = started;
        let scheduler = Arc::clone(self);
        runtime.spawn(async move {
            let outcome = route.call(call).await;
            if lease.stopped() {
                return;
            }
            let keep = match outcome {
                Ok(_) => true,
                Err(status) => runtime::with_python(|py| {
                    let channel = lease.channel.get();
                    let error = failure(py, channel.error(), &status);
                    keep_extending(py, &lease, error)
                })
                .unwrap_or(false),
            };
            if keep && !lease.stopped() {
                scheduler.schedule(lease);
            }
        });
    }
}

/// Python's decision after a failed extension (`failed(key, error)`); a failing callback stops
/// the heartbeat, and says why on stderr.
fn keep_extending(py: Python<'_>, lease: &Lease, error: PyErr) -> bool {
    if lease.stopped() {
        return false;
    }
    let key = lease
        .request
        .action
        .as_ref()
        .map_or("", |action| action.key.as_str());
    match lease
        .failed
        .call1(py, (key, error.into_value(py)))
        .and_then(|keep| keep.is_truthy(py))
    {
        Ok(keep) => keep,
        Err(err) => {
            err.write_unraisable(py, None);
            false
        }
    }
}

/// The scheduler of this process generation, and the generation it was started in. Locked only
/// with the GIL held, so a fork never copies it locked.
static SCHEDULER: Mutex<Option<(u64, Arc<Scheduler>)>> = Mutex::new(None);

/// The scheduler of this process generation, its thread started on first use.
fn scheduler(_py: Python<'_>) -> Arc<Scheduler> {
    let mut current = SCHEDULER.lock().unwrap_or_else(PoisonError::into_inner);
    let generation = runtime::generation();
    if let Some((started, scheduler)) = current.as_ref()
        && *started == generation
    {
        return Arc::clone(scheduler);
    }
    let scheduler = Arc::new(Scheduler {
        due: Mutex::new(BinaryHeap::new()),
        wake: Condvar::new(),
        order: AtomicU64::new(0),
        stale: AtomicUsize::new(0),
    });
    let running = Arc::clone(&scheduler);
    if let Err(err) = std::thread::Builder::new()
        .name("oncegate-lease".into())
        .spawn(move || running.run())
    {
        // Without its thread no lease is extended: say so once; the leases still hold for their
        // length, as with `heartbeat=False`.
        eprintln!("oncegate: could not start the lease heartbeat thread: {err}");
    }
    if let Some(previous) = current.replace((generation, Arc::clone(&scheduler))) {
        // The parent's, in a forked child: its thread is gone and its heap may be locked.
        std::mem::forget(previous);
    }
    scheduler
}
