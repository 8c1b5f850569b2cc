//! The tokio runtimes of the process, started on first use: a current-thread runtime that each
//! threaded caller drives itself while it waits (no hand-off to another thread on the way in or
//! out), and a one-worker runtime whose thread answers the asyncio callers.
//!
//! Between calls nobody drives the current-thread runtime, so a thread of its own does, briefly,
//! every [`IDLE_TICK`]: an idle connection still answers the gate's PINGs (a gate shutting down
//! waits for that acknowledgement before it closes) and notices a GOAWAY or a closed socket.
//!
//! A forked child inherits the parent's runtimes without their threads. [`forked`] (called by
//! Python after every fork) starts a new generation: the next call builds new runtimes and every
//! channel reconnects on them. The old ones are leaked, not dropped: dropping them would wait for
//! threads that do not exist in the child.

use std::{
    sync::{
        Mutex, PoisonError,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use pyo3::Python;
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

/// How often the idle driver runs the current-thread runtime's pending work.
const IDLE_TICK: Duration = Duration::from_millis(200);

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

/// Whether the threads of the native core may still call Python: false once the interpreter
/// began to exit ([`exiting`]).
static PYTHON_OPEN: AtomicBool = AtomicBool::new(true);

/// The threads of the native core inside [`with_python`] (waiting for the GIL, or holding it).
static CALLING_PYTHON: AtomicUsize = AtomicUsize::new(0);

/// How long [`exiting`] waits for the threads already calling Python.
const EXIT_WAIT: Duration = Duration::from_secs(2);

/// Runs `f` with the GIL on a thread of the native core (a call's `done`, the heartbeat), or
/// answers `None` when the interpreter is exiting. Python ends a thread that asks for the GIL
/// while it finalizes by unwinding it from inside `take_gil`, which aborts the process when the
/// unwinding meets Rust frames; [`exiting`] closes the door first and lets the threads already
/// through it finish.
pub fn with_python<R>(f: impl for<'py> FnOnce(Python<'py>) -> R) -> Option<R> {
    CALLING_PYTHON.fetch_add(1, Ordering::SeqCst);
    let result = if PYTHON_OPEN.load(Ordering::SeqCst) {
        Python::try_attach(f)
    } else {
        None
    };
    CALLING_PYTHON.fetch_sub(1, Ordering::SeqCst);
    result
}

/// The interpreter is exiting (an `atexit` hook, so before it finalizes): no thread of the native
/// core calls Python from now on, and those already on their way get the GIL (released here) and
/// finish, for at most [`EXIT_WAIT`].
pub fn exiting(py: Python<'_>) {
    PYTHON_OPEN.store(false, Ordering::SeqCst);
    py.detach(|| {
        let deadline = Instant::now() + EXIT_WAIT;
        while CALLING_PYTHON.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    });
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
    if mode == Mode::Blocking {
        std::thread::Builder::new()
            .name("oncegate-idle".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(IDLE_TICK);
                    // Parks for a millisecond: runs what arrived (a PING, a GOAWAY, an EOF) and
                    // the tasks it wakes. A caller that comes meanwhile is driven by this thread
                    // until then.
                    runtime.block_on(async { tokio::time::sleep(Duration::from_millis(1)).await });
                }
            })?;
    }
    *slot = Some(runtime);
    Ok(runtime)
}
