//! The Python client's native core, imported as `oncegate._native`: one unary gRPC call over
//! HTTP/2, given the method's path and the request already serialized by Python's protobuf, answered with
//! the response's bytes or an exception built from the status (its code, message and the
//! `grpc-status-details-bin` trailer that `oncegate.errors.from_rpc_error` decodes).
//!
//! It knows no message type, no error reason and nothing of the guard: `oncegate/native.py` turns
//! these calls into the stubs the RPC layer calls through, and every decision stays in Python. A
//! threaded caller blocks with the GIL released ([`channel::Channel::call`]); an asyncio caller gets
//! its answer through a callback ([`channel::Channel::start`]). Modules: [`runtime`] (the tokio
//! runtimes, one pair per process), [`link`] (the connection), [`unary`] (the call itself),
//! [`channel`] (what Python holds).

mod channel;
mod link;
mod runtime;
mod unary;
mod worker;

use pyo3::prelude::*;

/// The extension module: `Channel`, `Call`, and `forked()`, which `oncegate.native` registers
/// with `os.register_at_fork` so that a forked child starts runtimes and connections of its own.
#[pymodule]
#[pyo3(name = "_native")]
fn native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<channel::Channel>()?;
    module.add_class::<channel::Call>()?;
    module.add_function(wrap_pyfunction!(forked, module)?)?;
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
