//! What Python holds: a [`Channel`] to one gate (an `http://host:port` address; a [`Link`] per
//! runtime, made again after a fork; or, when this process serves that address with
//! `oncegate.local`, that gate's service in process, [`in_process`]), and the [`Call`] an asyncio
//! caller may cancel. A failed call becomes the exception that the Python side's factory builds
//! from `(code, message, details)`; this module decides nothing about it.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use bytes::Bytes;
use http::{
    HeaderMap, HeaderName, HeaderValue, Uri,
    uri::{Authority, PathAndQuery, Scheme},
};
use pyo3::{
    exceptions::{PyRuntimeError, PyValueError},
    prelude::*,
    types::PyBytes,
};
use tokio::{runtime::Runtime, task::AbortHandle};
use tonic::Status;

use crate::{
    in_process,
    link::Link,
    runtime::{self, Mode},
    unary, wire,
};

/// A channel to one gate: `Channel(uri, connect_timeout, error)`, where `error(code, message,
/// details)` returns the exception to raise for a failed call (`code` the gRPC status code as an
/// integer, `details` the `grpc-status-details-bin` bytes, empty when there were none).
#[pyclass(frozen, module = "oncegate._native")]
pub struct Channel {
    authority: Authority,
    connect_timeout: Duration,
    error: Py<PyAny>,
    connections: Mutex<Connections>,
    /// The gate at `authority` when this process serves it (`oncegate.local`): the calls go to
    /// it directly ([`in_process`]).
    local: Option<Arc<in_process::Route>>,
}

/// Where a call goes: over the channel's connection, or to the gate in this process.
#[derive(Clone)]
pub(crate) enum Route {
    Connection(Arc<Link>),
    InProcess(Arc<in_process::Route>),
}

impl Route {
    /// Sends `call` and waits for its answer: the response's bytes, or the status.
    pub(crate) async fn call(&self, call: wire::Call) -> Result<Bytes, Status> {
        match self {
            Route::Connection(link) => unary::call(link, call).await,
            Route::InProcess(gate) => gate.call(call).await,
        }
    }
}

/// The connections of one process generation, one per runtime (a connection is driven by the
/// runtime that opened it). Locked only with the GIL held.
#[derive(Default)]
struct Connections {
    generation: u64,
    closed: bool,
    blocking: Option<Arc<Link>>,
    background: Option<Arc<Link>>,
}

#[pymethods]
impl Channel {
    #[new]
    fn new(uri: &str, connect_timeout: f64, error: Py<PyAny>) -> PyResult<Self> {
        let parsed = Uri::try_from(uri).ok();
        let authority = parsed
            .filter(|u| u.scheme() == Some(&Scheme::HTTP) && u.port().is_some())
            .and_then(|u| u.authority().cloned())
            .ok_or_else(|| PyValueError::new_err(format!("{uri:?}: not http://host:port")))?;
        Ok(Channel {
            local: in_process::find(authority.as_str()),
            authority,
            connect_timeout: seconds(connect_timeout)?,
            error,
            connections: Mutex::new(Connections {
                generation: runtime::generation(),
                ..Connections::default()
            }),
        })
    }

    /// Calls the method at `path` with `request` (serialized) and returns the response's bytes;
    /// blocks, with the GIL released, for at most `timeout` seconds (no deadline when `None`).
    /// `metadata` is a sequence of `(key, value)` pairs sent with the call.
    #[pyo3(signature = (path, request, timeout, metadata))]
    fn call<'py>(
        &self,
        py: Python<'py>,
        path: &str,
        request: &[u8],
        timeout: Option<f64>,
        metadata: Vec<(String, String)>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let call = self.prepare(path, Bytes::copy_from_slice(request), timeout, metadata)?;
        let response = self.block(py, call)?;
        Ok(PyBytes::new(py, &response))
    }

    /// Starts the same call on the background runtime and returns at once; `done` is called with
    /// the response's bytes or the exception, on the runtime's thread (an asyncio caller passes
    /// `loop.call_soon_threadsafe` bound to its future). Cancelling the returned [`Call`] drops
    /// the call, and `done` is then never called.
    #[pyo3(signature = (path, request, timeout, metadata, done))]
    fn start(
        &self,
        py: Python<'_>,
        path: &str,
        request: &[u8],
        timeout: Option<f64>,
        metadata: Vec<(String, String)>,
        done: Py<PyAny>,
    ) -> PyResult<Call> {
        let call = self.prepare(path, Bytes::copy_from_slice(request), timeout, metadata)?;
        self.spawn(py, call, done, |py, response| {
            Ok(PyBytes::new(py, &response).into_any().unbind())
        })
    }

    /// Drops the connections; a call after this raises `ValueError`, as on a closed grpcio
    /// channel.
    fn close(&self) {
        let mut connections = self.lock();
        connections.closed = true;
        connections.blocking = None;
        connections.background = None;
    }
}

impl Channel {
    /// The factory of the exception a failed call raises.
    pub(crate) fn error(&self) -> &Py<PyAny> {
        &self.error
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Connections> {
        self.connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Where a call of `mode` goes, and the runtime that waits for it: the gate in this process,
    /// or the link of `mode` in this process's generation (it connects on its first call, and
    /// again after its connection broke).
    pub(crate) fn route(&self, mode: Mode) -> PyResult<(Route, &'static Runtime)> {
        let runtime =
            runtime::get(mode).map_err(|e| PyRuntimeError::new_err(format!("tokio: {e}")))?;
        let mut connections = self.lock();
        if connections.closed {
            return Err(PyValueError::new_err(
                "Cannot invoke RPC on closed channel!",
            ));
        }
        let now = runtime::generation();
        if connections.generation != now {
            // The parent's links: their connections' tasks lived on the parent's runtimes.
            // Leaked, as those runtimes are (runtime.rs).
            std::mem::forget(std::mem::take(&mut *connections));
            connections.generation = now;
        }
        let slot = match mode {
            Mode::Blocking => &mut connections.blocking,
            Mode::Background => &mut connections.background,
        };
        if let Some(local) = self.local.as_ref().filter(|local| local.reachable()) {
            return Ok((Route::InProcess(Arc::clone(local)), runtime));
        }
        let link = slot.get_or_insert_with(|| {
            Arc::new(Link::new(
                self.authority.as_str().to_owned(),
                self.connect_timeout,
            ))
        });
        Ok((Route::Connection(Arc::clone(link)), runtime))
    }

    /// Blocks on `call` with the GIL released; the response's bytes, or the exception the
    /// factory makes of its status.
    pub(crate) fn block(&self, py: Python<'_>, call: wire::Call) -> PyResult<Bytes> {
        let (route, runtime) = self.route(Mode::Blocking)?;
        py.detach(|| match &route {
            Route::InProcess(gate) => gate.block(call, runtime),
            Route::Connection(_) => runtime.block_on(route.call(call)),
        })
        .map_err(|status| failure(py, &self.error, &status))
    }

    /// Starts `call` on the background runtime; `done` is called, on the runtime's thread, with
    /// what `answer` makes of the response's bytes, or with the exception (the factory's, or
    /// `answer`'s own failure).
    pub(crate) fn spawn(
        &self,
        py: Python<'_>,
        call: wire::Call,
        done: Py<PyAny>,
        answer: fn(Python<'_>, Bytes) -> PyResult<Py<PyAny>>,
    ) -> PyResult<Call> {
        let (route, runtime) = self.route(Mode::Background)?;
        let error = self.error.clone_ref(py);
        let task = runtime.spawn(async move {
            let outcome = route.call(call).await;
            // None only while the interpreter shuts down: nobody is waiting any more.
            runtime::with_python(|py| {
                let answer = outcome
                    .map_err(|status| failure(py, &error, &status))
                    .and_then(|response| answer(py, response))
                    .unwrap_or_else(|err| err.into_value(py).into_any());
                if let Err(err) = done.call1(py, (answer,)) {
                    err.write_unraisable(py, None);
                }
            });
        });
        Ok(Call {
            task: task.abort_handle(),
        })
    }

    pub(crate) fn prepare(
        &self,
        path: &str,
        message: Bytes,
        timeout: Option<f64>,
        metadata: Vec<(String, String)>,
    ) -> PyResult<wire::Call> {
        let uri = Uri::builder()
            .scheme(Scheme::HTTP)
            .authority(self.authority.clone())
            .path_and_query(
                PathAndQuery::try_from(path)
                    .map_err(|e| PyValueError::new_err(format!("{path:?}: {e}")))?,
            )
            .build()
            .map_err(|e| PyValueError::new_err(format!("{path:?}: {e}")))?;
        Ok(wire::Call {
            uri,
            message,
            metadata: header_map(metadata)?,
            deadline: timeout.map(seconds).transpose()?,
        })
    }
}

/// A call started by [`Channel::start`].
#[pyclass(frozen, module = "oncegate._native")]
pub struct Call {
    task: AbortHandle,
}

#[pymethods]
impl Call {
    /// Drops the call (its `done` is not called afterwards); nothing happens once it finished.
    fn cancel(&self) {
        self.task.abort();
    }
}

/// The exception the Python side's factory makes of `status`, or the factory's own failure.
pub(crate) fn failure(py: Python<'_>, error: &Py<PyAny>, status: &Status) -> PyErr {
    let details = PyBytes::new(py, status.details());
    match error.call1(py, (i32::from(status.code()), status.message(), details)) {
        Ok(exception) => PyErr::from_value(exception.into_bound(py)),
        Err(err) => err,
    }
}

fn seconds(value: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(value)
        .map_err(|e| PyValueError::new_err(format!("{value} seconds: {e}")))
}

fn header_map(pairs: Vec<(String, String)>) -> PyResult<HeaderMap> {
    let mut map = HeaderMap::with_capacity(pairs.len());
    for (key, value) in pairs {
        let name = HeaderName::from_bytes(key.as_bytes())
            .map_err(|e| PyValueError::new_err(format!("metadata key {key:?}: {e}")))?;
        let value = HeaderValue::try_from(value.as_str())
            .map_err(|e| PyValueError::new_err(format!("metadata value of {key:?}: {e}")))?;
        map.append(name, value);
    }
    Ok(map)
}
