//! The tokio runtimes of the process, started on first use: a current-thread runtime that each
//! threaded caller drives itself while it waits (no hand-off to another thread on the way in or
//! out), and a one-worker runtime whose thread answers the asyncio callers.
//!
//! A forked child inherits the parent's runtimes without their threads. [`forked`] (called by
//! Python after every fork) starts a new generation: the next call builds new runtimes and every
//! channel reconnects on them. The old ones are leaked, not dropped: dropping them would wait for
//! threads that do not exist in the child.

use std::sync::{
    Mutex, PoisonError,
    atomic::{AtomicU64, Ordering},
};

use tokio::runtime::{Builder, Runtime};

/// Which runtime a call runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Driven by the calling thread inside `block_on`, the GIL released.
    Blocking,
    /// Driven by the runtime's own worker thread; the caller is called back.
    Background,
}

static GENERATION: AtomicU64 = AtomicU64::new(0);

struct Runtimes {
    generation: u64,
    blocking: Option<&'static Runtime>,
    background: Option<&'static Runtime>,
}

/// Locked only by callers that hold the GIL, so a fork (which holds it too) never copies it locked.
static RUNTIMES: Mutex<Runtimes> = Mutex::new(Runtimes {
    generation: 0,
    blocking: None,
    background: None,
});

/// The generation of this process: how many forks since the module was loaded.
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// A fork happened: what was started before it is not used again in this process.
pub fn forked() {
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// The runtime of `mode` in this process's generation, started when it is the first call.
pub fn get(mode: Mode) -> std::io::Result<&'static Runtime> {
    let mut runtimes = RUNTIMES.lock().unwrap_or_else(PoisonError::into_inner);
    let now = generation();
    if runtimes.generation != now {
        *runtimes = Runtimes {
            generation: now,
            blocking: None,
            background: None,
        };
    }
    let slot = match mode {
        Mode::Blocking => &mut runtimes.blocking,
        Mode::Background => &mut runtimes.background,
    };
    if let Some(runtime) = *slot {
        return Ok(runtime);
    }
    let runtime = match mode {
        Mode::Blocking => Builder::new_current_thread().enable_all().build()?,
        Mode::Background => Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("oncegate-io")
            .enable_all()
            .build()?,
    };
    let runtime: &'static Runtime = Box::leak(Box::new(runtime));
    *slot = Some(runtime);
    Ok(runtime)
}
