//! The `oncegate` binary: parse the command line, start tracing, build the [`Config`] (exit 64 when
//! it is bad), open the store (exit 69 when it cannot), and hand over to `server::run`. The other
//! subcommands are the tools that talk to a gate from outside: the worker calls (`oncegate call`,
//! [`call_cli`]) and the operator client (`oncegate admin`, [`admin`]) over what they share
//! ([`remote`], [`views`]), the load generator ([`bench`]), the signing keys and `oncegate verify`
//! ([`keys`]), `oncegate fingerprint`, and the MCP gateway (the `oncegate-mcp` crate, with the
//! default `mcp` feature).
//!
//! The layers below are crates (ARCHITECTURE.md): domain → store, observe → gate → grpc, notify,
//! rules → config, console → client, mcp → this binary. `--console-listen` serves the operator
//! console (`oncegate-console`) beside the gRPC server.

mod admin;
mod bench;
mod call_cli;
mod cli;
mod fingerprint;
mod keys;
mod remote;
mod views;

use std::{process::ExitCode, sync::Arc};

use clap::Parser;
use cli::{Cli, Command};
use oncegate_config::{Config, Notice, ServeArgs, exit};
use oncegate_gate::{Emitter, Gate};
use oncegate_grpc::{auth, server};
use oncegate_observe::{
    metrics::{self, Metrics},
    telemetry,
};
use oncegate_store::{Store, StoreError};
use prometheus_client::registry::Registry;

/// mimalloc instead of the system allocator: malloc/free were about 17% of the gate's CPU per call
/// (perf); with mimalloc the gate runs 12% fewer instructions per call (callgrind, BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(exit::USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match cli.command {
        Command::Fingerprint(args) => fingerprint::run(&args),
        Command::HashKey => hash_key_command(),
        Command::Keys(args) => keys::run(&args),
        Command::Verify(args) => keys::verify(&args),
        Command::Call(args) => with_runtime(|runtime| runtime.block_on(call_cli::run(*args))),
        Command::Admin(args) => with_runtime(|runtime| runtime.block_on(admin::run(*args))),
        Command::Bench(args) => bench::main(args),
        #[cfg(feature = "mcp")]
        Command::Mcp(args) => with_runtime(|runtime| {
            let _telemetry = telemetry::init(args.log_format, None);
            runtime.block_on(oncegate_mcp::run(*args))
        }),
        #[cfg(not(feature = "mcp"))]
        Command::Mcp(_) => {
            eprintln!(
                "oncegate mcp: this oncegate was built without the MCP gateway (`make run` leaves \
                 it out to make the first build shorter). Build it with `cargo build --release \
                 --bin oncegate` (the default features include `mcp`) and run \
                 target/release/oncegate mcp."
            );
            ExitCode::from(exit::USAGE)
        }
        Command::Serve(args) => with_runtime_of(args.worker_threads, |runtime| {
            // Inside the runtime: an OTLP exporter's channel lives on it.
            let _runtime = runtime.enter();
            let _telemetry = telemetry::init(args.log_format, args.otlp_endpoint());
            runtime.block_on(serve(*args))
        }),
    }
}

fn with_runtime(run: impl FnOnce(&tokio::runtime::Runtime) -> ExitCode) -> ExitCode {
    with_runtime_of(None, run)
}

/// [`with_runtime`] with `workers` threads (one per CPU when `None`). One thread is Tokio's
/// current-thread scheduler: its tasks run in the order they were woken, so the calls that became
/// ready together have their Redis commands and their replies written together (one `writev`
/// each), where the multi-thread scheduler runs a woken task first and writes each on its own.
fn with_runtime_of(
    workers: Option<u16>,
    run: impl FnOnce(&tokio::runtime::Runtime) -> ExitCode,
) -> ExitCode {
    let mut builder = match workers {
        Some(1) => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    builder.enable_all();
    if let Some(workers) = workers.filter(|&w| w > 1) {
        builder.worker_threads(usize::from(workers));
    }
    match builder.build() {
        Ok(runtime) => run(&runtime),
        Err(e) => {
            eprintln!("oncegate: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `oncegate hash-key`: the SHA-256 of the key on standard input (one trailing newline ignored).
fn hash_key_command() -> ExitCode {
    let mut key = String::new();
    if let Err(e) = std::io::Read::read_to_string(&mut std::io::stdin(), &mut key) {
        eprintln!("oncegate: cannot read the key from standard input: {e}");
        return ExitCode::from(exit::DATAERR);
    }
    let key = key
        .strip_suffix('\n')
        .map(|k| k.strip_suffix('\r').unwrap_or(k))
        .unwrap_or(&key);
    if key.is_empty() {
        eprintln!("oncegate: the key on standard input is empty");
        return ExitCode::from(exit::DATAERR);
    }
    println!("{}", auth::hash_key(key));
    ExitCode::SUCCESS
}

async fn serve(args: ServeArgs) -> ExitCode {
    let mut config = match Config::from_flags(&args) {
        Ok(config) => config,
        Err(e) => {
            tracing::error!("bad configuration: {e}");
            return ExitCode::from(exit::USAGE);
        }
    };
    for notice in &config.notices {
        match notice {
            Notice::Info(message) => tracing::info!("{message}"),
            Notice::Warn(message) => tracing::warn!("{message}"),
        }
    }
    let store = match config.store.open().await {
        Ok(store) => store,
        Err(StoreError::Misconfigured(why)) => {
            tracing::error!("bad configuration: {why}");
            return ExitCode::from(exit::USAGE);
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot open the store");
            return ExitCode::from(exit::UNAVAILABLE);
        }
    };
    report_durability(&store).await;
    let signer = match config.signing.as_ref().map(|s| s.signer()).transpose() {
        Ok(signer) => signer,
        Err(e) => {
            tracing::error!("bad configuration: {e}");
            return ExitCode::from(exit::USAGE);
        }
    };
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
    if let Some(addr) = config.metrics_listen
        && let Err(code) = serve_metrics(addr, registry, jwks).await
    {
        return code;
    }
    let console_listener = match config.console_listen {
        Some(addr) => match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => Some(listener),
            Err(e) => {
                tracing::error!(console_listen = %addr, error = %e, "cannot listen for the console");
                return ExitCode::from(exit::UNAVAILABLE);
            }
        },
        None => None,
    };
    // The console's one-time codes: issued over the admin API, redeemed by the console.
    let console_logins = console_listener
        .as_ref()
        .map(|_| auth::LoginCodes::default());
    config.server.console_logins = console_logins.clone();
    let listener = match tokio::net::TcpListener::bind(config.listen).await {
        Ok(listener) => listener,
        Err(e) => {
            tracing::error!(listen = %config.listen, error = %e, "cannot listen");
            return ExitCode::from(exit::UNAVAILABLE);
        }
    };
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let config_file = args
        .config
        .as_ref()
        .map_or_else(|| "none".to_owned(), |p| p.display().to_string());
    tracing::info!(%addr, store = config.store.name(), durability_replicas = config.durability_replicas,
        config = %config_file, policies = config.policies.names().count(),
        strict = config.policies.strict, principals = config.server.principals.len(),
        budgets = config.authorization.budgets.len(),
        worker_threads = tokio::runtime::Handle::current().metrics().num_workers(),
        runtime = runtime_flavor(), cpus = std::thread::available_parallelism().map_or(1, |n| n.get()),
        admin_socket = %config.server.admin_socket.as_ref().map_or_else(|| "none".to_owned(), |p| p.display().to_string()),
        "oncegate serving");
    if let Some(rules) = &config.authorization.rules {
        tracing::info!(
            policies = rules.len(),
            mode = config.authorization.mode.as_str(),
            "authorization policies loaded (SIGHUP reloads them)"
        );
    }
    // Standard output carries this one line, the port-0 discovery contract (tests and clients
    // read it); every log line goes to standard error, the start-up line above before it.
    println!("listening on {addr}");
    let mut gate = Gate::with_metrics(store.clone(), config.policies, metrics.clone())
        .with_authorization(config.authorization);
    if let Some(signer) = signer {
        gate = gate.with_signer(signer);
    }
    if console_listener.is_some() {
        gate = gate.with_recent_decisions(oncegate_console::RECENT_DECISIONS);
    }
    // Webhooks: the gate's events go through a bounded queue to the outbox writer; the delivery
    // worker and the scan run beside the server. Nothing at all without a webhook.
    let _notify = config.notifications.is_active().then(|| {
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
    reload_on_hangup(gate.clone());
    match server::run(listener, gate, config.server, shutdown_signal()).await {
        Ok(()) => {
            tracing::info!("stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!(error = %e, "server failed");
            ExitCode::FAILURE
        }
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

/// Serves `GET /metrics` (and the public keys, when the gate signs) on `addr`; exit 69 when the
/// address cannot be bound.
async fn serve_metrics(
    addr: std::net::SocketAddr,
    registry: Registry,
    jwks: Option<Arc<String>>,
) -> Result<(), ExitCode> {
    match tokio::net::TcpListener::bind(addr).await {
        Ok(listener) => {
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
        Err(e) => {
            tracing::error!(metrics_listen = %addr, error = %e, "cannot listen for metrics");
            Err(ExitCode::from(exit::UNAVAILABLE))
        }
    }
}

/// Serves the operator console on `listener`; its people log in with an operator's or
/// approver's API key, or a code from `oncegate admin console-login`.
fn serve_console(
    listener: tokio::net::TcpListener,
    gate: &Gate,
    server: &server::ServerOptions,
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
fn reload_on_hangup(gate: Gate) {
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

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
