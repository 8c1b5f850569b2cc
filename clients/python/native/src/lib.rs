//! The Python client's native core, imported as `oncegate._native`: unary gRPC calls over HTTP/2,
//! and the gate server itself for `oncegate.local`.
//!
//! - The calls. [`channel`] is what Python holds: a threaded caller blocks with the GIL released
//!   ([`channel::Channel::call`]); an asyncio caller gets its answer through a callback
//!   ([`channel::Channel::start`]). A call whose request Python serialized answers with the
//!   response's bytes ([`unary`]); the guard's hot RPCs (RequestToken, Complete, Release,
//!   ExtendLease) take and return plain values instead, their messages built and read here
//!   ([`worker`]), and the threaded guard's common case is one native call ([`guard`]). A failed
//!   call raises the exception Python's factory builds from the status (its code, message and
//!   the `grpc-status-details-bin` trailer that `oncegate.errors.from_rpc_error` decodes): no
//!   error reason and nothing of the guard is decided here.
//! - The server. [`local`] runs `oncegate-server` on a runtime of its own, from `oncegate serve`'s
//!   flags; a channel to it from this process calls its gate directly ([`in_process`]).
//!
//! The modules are layered as the workspace's crates are: a module uses only modules of a lower
//! rank, never one of its own or a higher one (tests/integration/layers.rs fails on any cycle).
//! Bottom up:
//!
//! 0. [`runtime`] (the tokio runtimes, one pair per process), [`wire`] (a gRPC call on HTTP/2:
//!    the methods, the request's head and frame, how an answer is read) and [`json`] (the
//!    receipts' JSON): they use no sibling.
//! 1. [`session`]: the calls on one `Session` stream; [`in_process`]: the calls to the gate in
//!    this process.
//! 2. [`link`]: the connection to one gate and the session on it; [`local`]: the gate server.
//! 3. [`unary`]: one call over a link, on its session or a stream of its own.
//! 4. [`channel`]: what Python holds, routing a call over a link or in process.
//! 5. [`worker`]: the guard's hot RPCs with plain values, over a channel.
//! 6. [`heartbeat`]: the native guard's lease extensions.
//! 7. [`guard`]: the threaded guard's common case as one call.

mod channel;
mod guard;
mod heartbeat;
mod in_process;
mod json;
mod link;
mod local;
mod runtime;
mod session;
mod unary;
mod wire;
mod worker;

use pyo3::prelude::*;

/// mimalloc for this extension's Rust allocations (Python's own stay with Python's allocator:
/// whatever crosses to Python is copied into Python objects). glibc's malloc and free were about
/// a quarter of the CPU of `oncegate.local`'s gate thread (perf, BENCHMARKS.md), as they were of
/// the gate binary's before it took mimalloc (`src/main.rs`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The extension module: `Channel`, `Call`, the plain-value worker calls, `LocalServer`,
/// `forked()`, which `oncegate.native` registers with `os.register_at_fork` so that a forked
/// child starts runtimes and connections of its own, and `exiting()`, which it registers with
/// `atexit`.
#[pymodule]
#[pyo3(name = "_native")]
fn native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<channel::Channel>()?;
    module.add_class::<channel::Call>()?;
    module.add_class::<local::LocalServer>()?;
    module.add_class::<guard::Guard>()?;
    module.add_function(wrap_pyfunction!(forked, module)?)?;
    module.add_function(wrap_pyfunction!(exiting, module)?)?;
    module.add_function(wrap_pyfunction!(json::receipt_json, module)?)?;
    module.add_function(wrap_pyfunction!(worker::request_token, module)?)?;
    module.add_function(wrap_pyfunction!(worker::complete, module)?)?;
    module.add_function(wrap_pyfunction!(worker::release, module)?)?;
    module.add_function(wrap_pyfunction!(worker::extend_lease, module)?)?;
    Ok(())
}

/// Called in a forked child: the runtimes and connections inherited from the parent have no
/// threads behind them any more, so the next call starts new ones.
#[pyfunction]
fn forked() {
    runtime::forked();
}

/// Registered with `atexit` by `oncegate.native`: the interpreter is exiting, so the native
/// core's threads stop calling Python (see [`runtime::with_python`]).
#[pyfunction]
fn exiting(py: Python<'_>) {
    runtime::exiting(py);
}
