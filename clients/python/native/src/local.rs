//! `oncegate.local`: the gate server `oncegate serve` runs ([`oncegate_server`]), on the embedded
//! store or on Redis, inside the Python process. It takes `oncegate serve`'s flags (`--data-dir`,
//! `--config`, `--unsigned`, `--redis-url`, ...; `--help` lists them) and nothing from the
//! environment: a Python process's `ONCEGATE_*` variables belong to whatever else it runs, not to
//! a gate it starts in passing.
//!
//! The server runs on a tokio runtime of its own (its workers are the gate's `--worker-threads`;
//! one is a one-worker runtime here, not `serve`'s current-thread one, since no caller's thread
//! drives it),
//! apart from the client's runtimes ([`crate::runtime`]), and listens on loopback TCP as a gate
//! server does, so that every client, native or grpcio, threaded or asyncio, reaches it and reads
//! the same answers and errors; the native channels of this process skip the socket and call its
//! gate service directly ([`crate::in_process`]). [`LocalServer::stop`] drains it and drops the
//! runtime, which closes the store: the same data directory can then be opened again.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use clap::{Args, Command, FromArgMatches};
use oncegate_config::ServeArgs;
use oncegate_observe::telemetry::{self, LogFormat};
use oncegate_server::StartError;
use oncegate_store::embedded::Closed;
use pyo3::{
    exceptions::{PyOSError, PyRuntimeError, PyValueError},
    prelude::*,
};
use tokio::{runtime::Runtime, sync::oneshot, task::JoinHandle};

use crate::{
    in_process::Route,
    runtime::{self, Mode},
};

/// How long [`LocalServer::stop`] waits for the runtime's tasks after the drain.
const SHUTDOWN: Duration = Duration::from_secs(5);

/// A gate server in this process: `LocalServer(flags, log)`, where `flags` are `oncegate serve`'s
/// (without the program name) and `log`, when not `None`, installs the gate's log lines on stderr
/// filtered by it (`RUST_LOG`'s syntax), unless the process already has a tracing subscriber.
#[pyclass(frozen, module = "oncegate._native")]
pub struct LocalServer {
    #[pyo3(get)]
    address: String,
    #[pyo3(get)]
    admin_socket: Option<String>,
    /// The store's directory, as the flags left it.
    #[pyo3(get)]
    data_dir: String,
    /// The process generation it was started in: a forked child does not own it.
    generation: u64,
    running: Mutex<Option<Running>>,
}

struct Running {
    runtime: Runtime,
    store_closed: Option<Closed>,
    stop: oneshot::Sender<()>,
    served: JoinHandle<Result<(), oncegate_server::ServeError>>,
    /// How this process's channels reach the gate without the listener.
    route: Arc<Route>,
}

#[pymethods]
impl LocalServer {
    #[new]
    #[pyo3(signature = (flags, log = None))]
    fn new(py: Python<'_>, flags: Vec<String>, log: Option<&str>) -> PyResult<Self> {
        let args = parse(&flags)?;
        if let Some(directives) = log {
            telemetry::try_init_embedded(LogFormat::Text, directives)
                .map_err(|why| PyValueError::new_err(format!("log: {why}")))?;
        }
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.enable_all().thread_name("oncegate-local");
        if let Some(workers) = args.worker_threads {
            builder.worker_threads(usize::from(workers));
        }
        let runtime = builder.build()?;
        let server = py
            .detach(|| runtime.block_on(oncegate_server::start(&args, false)))
            .map_err(|e| match e {
                StartError::Usage(_) => PyValueError::new_err(e.to_string()),
                StartError::Unavailable(_) => PyOSError::new_err(e.to_string()),
            })?;
        let address = server.addr().to_string();
        // On Redis, a second connection for the blocking callers, on the runtime they drive.
        let blocking = runtime::get(Mode::Blocking)?;
        let direct = py
            .detach(|| blocking.block_on(server.in_process_on_this_runtime()))
            .map_err(|e| PyOSError::new_err(e.to_string()))?;
        let route = Route::register(
            address.clone(),
            server.in_process(),
            direct,
            runtime.handle().clone(),
        );
        let data_dir = args.data_dir.display().to_string();
        let admin_socket = server.admin_socket().map(|path| path.display().to_string());
        let store_closed = server.store_closed();
        let (stop, stopped) = oneshot::channel::<()>();
        let served = runtime.spawn(server.run(async {
            let _ = stopped.await;
        }));
        Ok(LocalServer {
            address,
            admin_socket,
            data_dir,
            generation: runtime::generation(),
            running: Mutex::new(Some(Running {
                runtime,
                store_closed,
                stop,
                served,
                route,
            })),
        })
    }

    /// Whether it still serves (`stop` not called yet).
    #[getter]
    fn running(&self) -> bool {
        self.lock().is_some()
    }

    /// Stops accepting calls, waits for the calls in flight (at most `--drain-seconds`), then
    /// drops the runtime, which closes the store. Idempotent. In a forked child it does nothing:
    /// the server's threads are the parent's.
    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        if self.generation != runtime::generation() {
            return Ok(());
        }
        let Some(running) = self.lock().take() else {
            return Ok(());
        };
        let Running {
            runtime,
            store_closed,
            stop,
            served,
            route,
        } = running;
        route.withdraw();
        let _ = stop.send(());
        let (outcome, closed) = py.detach(|| {
            let outcome = runtime.block_on(async {
                let outcome = served.await;
                // The calls of this process's channels, which skip the listener's drain.
                let _ = tokio::time::timeout(SHUTDOWN, route.drained()).await;
                outcome
            });
            // Dropping the runtime's tasks drops the last handles on the store; its writer
            // thread then closes the file, which another start in this process may want.
            runtime.shutdown_timeout(SHUTDOWN);
            let closed = store_closed.is_none_or(|closed| closed.wait(SHUTDOWN));
            (outcome, closed)
        });
        if !closed {
            return Err(PyRuntimeError::new_err(format!(
                "the local gate stopped, but its store was not closed within {SHUTDOWN:?}"
            )));
        }
        match outcome {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(PyRuntimeError::new_err(format!(
                "the local gate failed: {e}"
            ))),
            Err(e) => Err(PyRuntimeError::new_err(format!(
                "the local gate's task ended abnormally: {e}"
            ))),
        }
    }
}

impl LocalServer {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Running>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for LocalServer {
    /// Never stopped: stop serving without waiting (the store is crash-safe either way). In a
    /// forked child the runtime is leaked instead: its threads are the parent's, and dropping it
    /// would wait for them forever.
    fn drop(&mut self) {
        let Some(running) = self.lock().take() else {
            return;
        };
        if self.generation != runtime::generation() {
            std::mem::forget(running);
            return;
        }
        running.route.withdraw();
        let _ = running.stop.send(());
        running.runtime.shutdown_background();
    }
}

/// `oncegate serve`'s flags, every environment fallback removed; a flag given again overrides
/// the earlier one (the caller's `--listen` or `--data-dir` over `oncegate.local`'s own).
fn parse(flags: &[String]) -> PyResult<ServeArgs> {
    let command = ServeArgs::augment_args(Command::new("oncegate.local").no_binary_name(true))
        .args_override_self(true)
        .mut_args(|arg| arg.env(None));
    let matches = command
        .try_get_matches_from(flags)
        .map_err(|e| PyValueError::new_err(e.render().to_string()))?;
    ServeArgs::from_arg_matches(&matches).map_err(|e| PyValueError::new_err(e.to_string()))
}
