//! The gate server as `oncegate serve` runs it, assembled from its flags: [`start`] validates the
//! configuration, opens the store, loads the signer, binds the listeners (gRPC, and metrics and
//! the console when asked) and builds the [`Gate`] with its webhooks; [`Server::run`] then serves
//! until a shutdown future resolves and drains the calls in flight.
//!
//! Two callers: the `oncegate` binary (which prints the bound address, exits 64 on
//! [`StartError::Usage`] and 69 on [`StartError::Unavailable`], and reloads the authorization
//! policies on SIGHUP), and the Python client's in-process gate (`oncegate.local`, in
//! `clients/python/native`), which runs the same server on a runtime of its own inside the Python
//! process and takes no signal. Every failure is logged here, as `oncegate serve` always logged
//! it, and returned with the same words for a caller that has no log to read.

use std::{net::SocketAddr, path::Path, sync::Arc};

use oncegate_config::{Config, Notice, ServeArgs, exit};
use oncegate_gate::{Emitter, Gate};
use oncegate_grpc::{
    auth,
    server::{self, ServerOptions},
};
pub use oncegate_grpc::{in_process::InProcess, server::ServeError};
use oncegate_observe::metrics::{self, Metrics};
use oncegate_store::{Store, StoreError};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

/// Why the server did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The flags or the configuration file are wrong (`oncegate serve` exits 64).
    #[error("bad configuration: {0}")]
    Usage(String),
    /// The store cannot be opened, an address cannot be bound or the signing thread cannot start
    /// (`oncegate serve` exits 69).
    #[error("{0}")]
    Unavailable(String),
}

impl StartError {
    /// The exit code of `oncegate serve` for this failure (sysexits).
    pub fn exit_code(&self) -> u8 {
        match self {
            StartError::Usage(_) => exit::USAGE,
            StartError::Unavailable(_) => exit::UNAVAILABLE,
        }
    }
}

/// A started server: listening, its gate built, not yet serving calls.
pub struct Server {
    /// The gRPC listener, the health-only listener and the admin socket.
    listeners: server::Listeners,
    addr: SocketAddr,
    gate: Gate,
    options: ServerOptions,
    store_closed: Option<oncegate_store::embedded::Closed>,
    /// The webhook tasks; aborted when the server is dropped.
    _notify: Option<oncegate_notify::Running>,
}

/// Validates `args`, opens the store and binds every listener `args` asks for. Metrics and the
/// console are served from here on; gRPC calls from [`Server::run`] on. With `reload_on_hangup`,
/// SIGHUP reloads the authorization policies (only a process's own server should take it).
pub async fn start(args: &ServeArgs, reload_on_hangup: bool) -> Result<Server, StartError> {
    let mut config = Config::from_flags(args).map_err(|e| usage(e.to_string()))?;
    for notice in &config.notices {
        match notice {
            Notice::Info(message) => tracing::info!("{message}"),
            Notice::Warn(message) => tracing::warn!("{message}"),
        }
    }
    let store = match config.store.open().await {
        Ok(store) => store,
        Err(StoreError::Misconfigured(why)) => return Err(usage(why)),
        Err(e) => {
            tracing::error!(error = %e, "cannot open the store");
            return Err(StartError::Unavailable(format!(
                "cannot open the store: {e}"
            )));
        }
    };
    report_durability(&store).await;
    let store_closed = match &store {
        Store::Embedded(embedded) => Some(embedded.closed()),
        Store::Redis(_) | Store::Postgres(_) => None,
    };
    let signer = config
        .signing
        .as_ref()
        .map(|s| s.signer())
        .transpose()
        .map_err(|e| usage(e.to_string()))?;
    if let Some(signer) = &signer {
        tracing::info!(
            kid = signer.active_kid(),
            issuer = signer.issuer(),
            published = signer.public_keys().kids().count(),
            "signing grants and receipts"
        );
    }
    let jwks = signer
        .as_ref()
        .map(|s| Arc::new(s.public_keys().to_jwks().to_string()));
    let mut registry = Registry::default();
    let metrics = Metrics::register(
        &mut registry,
        config.policies.names(),
        &config.metrics_other_action_label,
    );
    if let Some(addr) = config.metrics_listen {
        serve_metrics(addr, registry, jwks).await?;
    }
    let console_listener = match config.console_listen {
        Some(addr) => Some(bind(addr).await.map_err(|e| {
            tracing::error!(console_listen = %addr, error = %e, "cannot listen for the console");
            unavailable("cannot listen for the console", addr, &e)
        })?),
        None => None,
    };
    // The console's one-time codes: issued over the admin API, redeemed by the console.
    let console_logins = console_listener
        .as_ref()
        .map(|_| auth::LoginCodes::default());
    config.server.console_logins = console_logins.clone();
    let listener = bind(config.listen).await.map_err(|e| {
        tracing::error!(listen = %config.listen, error = %e, "cannot listen");
        unavailable("cannot listen", config.listen, &e)
    })?;
    let addr = listener.local_addr().map_err(|e| {
        tracing::error!(listen = %config.listen, error = %e, "cannot read the bound address");
        StartError::Unavailable(format!(
            "cannot read the bound address of {}: {e}",
            config.listen
        ))
    })?;
    // The health-only listener, the admin socket and the serving threads too, before the
    // start-up line.
    let listeners = server::Listeners::bind(listener, &config.server)
        .await
        .map_err(|e| {
            let what = match e {
                server::ServeError::ServingThreads(_) => "cannot start serving",
                _ => "cannot listen",
            };
            tracing::error!(error = %e, "{what}");
            StartError::Unavailable(e.to_string())
        })?;
    // The start-up line and the policies' line below read what the gate takes.
    let (policies, strict, budgets) = (
        config.policies.names().count(),
        config.policies.strict,
        config.authorization.budgets.len(),
    );
    let rules = (config.authorization.rules.as_ref())
        .map(|rules| (rules.len(), config.authorization.mode.as_str()));
    let mut gate = Gate::with_metrics(store.clone(), config.policies, metrics.clone())
        .with_authorization(config.authorization);
    if let Some(signer) = signer {
        gate = gate.with_signer(signer);
        // The grants' signatures go to a thread of their own, so that the calls' I/O goes on
        // meanwhile (BENCHMARKS.md, "What was tried").
        gate = gate.signing_on_own_thread().map_err(|e| {
            tracing::error!(error = %e, "cannot start the signing thread");
            StartError::Unavailable(format!("cannot start the signing thread: {e}"))
        })?;
    }
    let cpus = oncegate_config::cpus();
    let config_file = args
        .config
        .as_ref()
        .map_or_else(|| "none".to_owned(), |p| p.display().to_string());
    tracing::info!(%addr, store = config.store.name(), durability_replicas = config.durability_replicas,
        config = %config_file, policies, strict, principals = config.server.principals.len(),
        budgets,
        worker_threads = tokio::runtime::Handle::current().metrics().num_workers(),
        runtime = runtime_flavor(), cpus,
        worker_threads_rule = args.worker_threads(cpus).rule(),
        serving_threads = config.server.serving_threads,
        // Absolute, so that an operator elsewhere knows what to give `oncegate admin --admin-socket`.
        admin_socket = %config.server.admin_socket.as_ref().map_or_else(|| "none".to_owned(),
            |p| std::path::absolute(p).unwrap_or_else(|_| p.clone()).display().to_string()),
        "oncegate serving");
    if let Some((policies, mode)) = rules {
        tracing::info!(
            policies,
            mode,
            "authorization policies loaded (SIGHUP reloads them)"
        );
    }
    if console_listener.is_some() {
        gate = gate.with_recent_decisions(oncegate_console::RECENT_DECISIONS);
    }
    // Webhooks: the gate's events go through a bounded queue to the outbox writer; the delivery
    // worker and the scan run beside the server. Nothing at all without a webhook.
    let notify = config.notifications.is_active().then(|| {
        let (emitter, events) = Emitter::channel(config.notifications.wanted());
        gate = gate.clone().with_events(emitter);
        tracing::info!(
            webhooks = config.notifications.webhooks.len(),
            "webhooks: delivering events from the outbox"
        );
        oncegate_notify::start(store, metrics, config.notifications, events)
    });
    if let (Some(listener), Some(logins)) = (console_listener, console_logins) {
        serve_console(listener, &gate, &config.server, logins);
    }
    if reload_on_hangup {
        reload_policies_on_hangup(gate.clone());
    }
    Ok(Server {
        listeners,
        addr,
        gate,
        options: config.server,
        store_closed,
        _notify: notify,
    })
}

impl Server {
    /// The address the gRPC listener is bound to (port 0 resolved).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The admin socket's path, when the server serves one.
    pub fn admin_socket(&self) -> Option<&Path> {
        self.options.admin_socket.as_deref()
    }

    /// For the embedded store: what tells when its file is closed, after [`Server::run`] returned
    /// and the runtime dropped every task holding the store.
    pub fn store_closed(&self) -> Option<oncegate_store::embedded::Closed> {
        self.store_closed.clone()
    }

    /// The worker API for callers in this process, answered as the listener answers it, without
    /// a socket ([`InProcess`]). It answers for as long as the runtime that runs the server does.
    pub fn in_process(&self) -> InProcess {
        InProcess::new(&self.gate, &self.options)
    }

    /// [`Server::in_process`] over a connection of its own to the same Redis, made on the
    /// runtime this is awaited on: a caller that drives that runtime itself does the store's
    /// I/O on its own thread. `None` on the embedded store.
    pub async fn in_process_on_this_runtime(&self) -> Result<Option<InProcess>, StartError> {
        let store = self.gate.store().another_connection().await.map_err(|e| {
            StartError::Unavailable(format!("cannot open a second connection to the store: {e}"))
        })?;
        Ok(store.map(|store| InProcess::new(&self.gate.on_store(store), &self.options)))
    }

    /// Serves calls until `shutdown` resolves, then drains the calls in flight (for at most the
    /// drain timeout of the flags).
    pub async fn run(
        self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<(), ServeError> {
        server::run_on(self.listeners, self.gate, self.options, shutdown).await
    }
}

/// The scheduler that runs calls, for the start-up line: `current_thread` (one thread) or
/// `multi_thread`.
fn runtime_flavor() -> &'static str {
    match tokio::runtime::Handle::current().runtime_flavor() {
        tokio::runtime::RuntimeFlavor::CurrentThread => "current_thread",
        _ => "multi_thread",
    }
}

fn usage(why: String) -> StartError {
    tracing::error!("bad configuration: {why}");
    StartError::Usage(why)
}

async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

fn unavailable(what: &str, addr: SocketAddr, e: &std::io::Error) -> StartError {
    StartError::Unavailable(format!("{what} on {addr}: {e}"))
}

/// Logs what the store keeps across a restart, and warns when it may lose completions.
async fn report_durability(store: &Store) {
    match store.durability().await {
        Ok(d) if d.persistent => tracing::info!(store = %d.summary, "store ready"),
        Ok(d) => {
            tracing::warn!(store = %d.summary, "the store may lose acknowledged completions on restart")
        }
        Err(e) => tracing::warn!(error = %e, "could not read the store's durability settings"),
    }
}

/// Serves `GET /metrics` (and the public keys, when the gate signs) on `addr`.
async fn serve_metrics(
    addr: SocketAddr,
    registry: Registry,
    jwks: Option<Arc<String>>,
) -> Result<(), StartError> {
    let listener = bind(addr).await.map_err(|e| {
        tracing::error!(metrics_listen = %addr, error = %e, "cannot listen for metrics");
        unavailable("cannot listen for metrics", addr, &e)
    })?;
    let bound = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    tracing::info!(addr = %bound, "metrics at http://{bound}/metrics");
    tokio::spawn(metrics::endpoint::serve_with_keys(
        listener,
        Arc::new(registry),
        jwks,
        std::future::pending(),
    ));
    Ok(())
}

/// Serves the operator console on `listener`; its people log in with an operator's or
/// approver's API key, or a code from `oncegate admin console-login`.
fn serve_console(
    listener: TcpListener,
    gate: &Gate,
    server: &ServerOptions,
    logins: auth::LoginCodes,
) {
    let bound = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    tracing::info!(
        url = %format!("http://{bound}/"),
        "operator console at http://{bound}/ (log in with an operator's or approver's API key, \
         or a code from `oncegate admin console-login` on this machine)"
    );
    let console = oncegate_console::Console::new(gate.clone(), server.principals.clone(), logins);
    tokio::spawn(oncegate_console::serve(
        listener,
        console,
        std::future::pending(),
    ));
}

/// On SIGHUP, reads the authorization policy files again: a valid set replaces the old one for
/// every later request (calls in flight finish with the one they started with); a broken one is
/// logged with Cedar's reason and the old set stays.
fn reload_policies_on_hangup(gate: Gate) {
    #[cfg(unix)]
    tokio::spawn(async move {
        let Ok(mut hangups) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        else {
            tracing::warn!("cannot listen for SIGHUP; policies will not be reloaded");
            return;
        };
        while hangups.recv().await.is_some() {
            match gate.authorization().reload() {
                Ok(count) => tracing::info!(policies = count, "authorization policies reloaded"),
                Err(why) => tracing::error!(
                    "authorization policies not reloaded, keeping the previous ones: {why}"
                ),
            }
        }
    });
    #[cfg(not(unix))]
    drop(gate);
}
