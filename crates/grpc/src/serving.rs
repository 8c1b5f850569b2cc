//! Serving threads: the gRPC connections dealt in turn to threads that each run a current-thread
//! runtime of their own (`--serving-threads`).
//!
//! A connection stays on the thread that took it, with everything its calls do there: the HTTP/2
//! frames, the service's futures and, on a standalone Redis, the commands on a connection that
//! thread opened ([`oncegate_store::redis::serve_on_this_thread`]). Nothing on a call's path
//! crosses to another thread, unlike Tokio's multi-thread scheduler, whose work stealing and
//! cross-thread wake-ups cost more CPU per call than a second thread gains on two cores
//! (BENCHMARKS.md, "What was tried"). The runtime that starts the server is the first serving
//! thread; it also runs everything else the gate does (health, counters, webhooks).
//!
//! Owns: starting the threads before the gate serves, handing each its server, and dealing
//! accepted connections.

use std::{future::Future, io, pin::Pin};

use tokio::{net::TcpStream, sync::mpsc};

/// What a serving thread runs: its share of the server, until it drains.
pub(crate) type Work = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The serving threads beyond the first, started and waiting for their work.
pub(crate) struct ServingThreads {
    waiting: Vec<std::sync::mpsc::SyncSender<Work>>,
}

impl ServingThreads {
    /// Starts `count - 1` threads (none for one), each with its runtime built. Fails when the
    /// system refuses a thread or a runtime; dropped unused, the threads end.
    pub(crate) fn start(count: usize) -> io::Result<Self> {
        let mut waiting = Vec::with_capacity(count.saturating_sub(1));
        for index in 1..count {
            let failed =
                |e: io::Error| io::Error::new(e.kind(), format!("serving thread {index}: {e}"));
            let (work_tx, work_rx) = std::sync::mpsc::sync_channel::<Work>(1);
            let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel::<io::Result<()>>(1);
            std::thread::Builder::new()
                .name(format!("oncegate-serve-{index}"))
                .spawn(move || {
                    let runtime = oncegate_observe::telemetry::hold_lines_on_current_thread(
                        tokio::runtime::Builder::new_current_thread().enable_all(),
                    )
                    .build();
                    let runtime = match runtime {
                        Ok(runtime) => {
                            let _ = ready_tx.send(Ok(()));
                            runtime
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    let Ok(work) = work_rx.recv() else {
                        return;
                    };
                    oncegate_store::redis::serve_on_this_thread(index);
                    runtime.block_on(work);
                    oncegate_observe::telemetry::release_lines();
                })
                .map_err(failed)?;
            ready_rx
                .recv()
                .unwrap_or_else(|_| Err(io::Error::other("the thread ended while starting")))
                .map_err(failed)?;
            waiting.push(work_tx);
        }
        Ok(Self { waiting })
    }

    /// How many threads serve, the first included.
    pub(crate) fn count(&self) -> usize {
        self.waiting.len() + 1
    }

    /// Hands thread `index` (1 and up) the work `work(index)` makes.
    pub(crate) fn run(self, mut work: impl FnMut(usize) -> Work) {
        for (i, thread) in self.waiting.into_iter().enumerate() {
            let _ = thread.send(work(i + 1));
        }
    }
}

/// Deals accepted connections in turn: one to each serving thread's queue, then one kept by the
/// caller (the first serving thread), and again. A connection whose thread has stopped stays with
/// the caller.
pub(crate) struct Dealer {
    threads: Vec<mpsc::UnboundedSender<std::net::TcpStream>>,
    turn: usize,
}

impl Dealer {
    /// A dealer over `threads`' queues (empty: every connection stays).
    pub(crate) fn new(threads: Vec<mpsc::UnboundedSender<std::net::TcpStream>>) -> Self {
        Self { threads, turn: 0 }
    }

    /// `Some` with what the caller serves itself; `None` when a serving thread took it.
    pub(crate) fn deal(
        &mut self,
        accepted: io::Result<TcpStream>,
    ) -> Option<io::Result<TcpStream>> {
        if self.threads.is_empty() {
            return Some(accepted);
        }
        self.turn = (self.turn + 1) % (self.threads.len() + 1);
        let Some(thread) = self.turn.checked_sub(1) else {
            return Some(accepted);
        };
        let std = match accepted.and_then(TcpStream::into_std) {
            Ok(std) => std,
            Err(e) => return Some(Err(e)),
        };
        match self.threads[thread].send(std) {
            Ok(()) => None,
            Err(mpsc::error::SendError(std)) => Some(TcpStream::from_std(std)),
        }
    }
}
