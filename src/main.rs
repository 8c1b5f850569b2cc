//! The `oncegate` binary: parse the command line, start tracing, and start the server
//! (`oncegate-server`: exit 64 when the configuration is bad, 69 when the store cannot be opened,
//! an address bound or a thread started), print the bound address and serve until
//! SIGTERM or SIGINT. The other subcommands are the tools that talk to a gate from outside: the
//! worker calls (`oncegate call`, [`call_cli`]) and the operator client (`oncegate admin`,
//! [`admin`]) over what they share ([`remote`], [`views`]), the load generator ([`bench`]), the
//! signing keys and `oncegate verify` ([`keys`]), `oncegate fingerprint`, and the MCP gateway (the
//! `oncegate-mcp` crate, with the default `mcp` feature).
//!
//! The layers below are crates (ARCHITECTURE.md): domain → store, observe → gate → grpc, notify,
//! rules → config, console → server, mcp → this binary. `--console-listen` serves the operator
//! console (`oncegate-console`) beside the gRPC server.

mod admin;
mod bench;
mod call_cli;
mod cli;
mod fingerprint;
mod keys;
mod remote;
mod views;

use std::process::ExitCode;

use clap::Parser;
use cli::{Cli, Command};
use oncegate_config::{ServeArgs, WorkerThreads, cpus, exit};
use oncegate_grpc::auth;
use oncegate_observe::telemetry;

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
        Command::Migrate(args) => with_runtime(|runtime| runtime.block_on(migrate(args))),
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
        Command::Serve(args) => with_runtime_of(Some(args.worker_threads(cpus())), |runtime| {
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
/// current-thread scheduler (see [`WorkerThreads::is_current_thread`]).
fn with_runtime_of(
    workers: Option<WorkerThreads>,
    run: impl FnOnce(&tokio::runtime::Runtime) -> ExitCode,
) -> ExitCode {
    let mut builder = match workers {
        Some(workers) if workers.is_current_thread() => {
            let mut builder = tokio::runtime::Builder::new_current_thread();
            // This thread writes the log lines of a busy stretch together when it goes idle.
            telemetry::hold_lines_on_current_thread(&mut builder);
            builder
        }
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    builder.enable_all();
    if let Some(workers) = workers.filter(|w| !w.is_current_thread()) {
        builder.worker_threads(workers.count());
    }
    match build(&mut builder) {
        Ok(runtime) => {
            let code = run(&runtime);
            // A current-thread runtime's lines since it last went idle, held on this thread.
            telemetry::release_lines();
            code
        }
        Err(why) => {
            eprintln!("oncegate: cannot start the async runtime: {why}");
            ExitCode::from(exit::UNAVAILABLE)
        }
    }
}

/// Builds the runtime, or says why not. Tokio panics instead of returning an error when the
/// system refuses one of a multi-thread runtime's threads (a container's task limit, a user's
/// `RLIMIT_NPROC`): that panic, quiet, is such a reason too. Only this thread runs here, so
/// silencing the panic hook meanwhile silences nothing else.
fn build(builder: &mut tokio::runtime::Builder) -> Result<tokio::runtime::Runtime, String> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| builder.build()));
    std::panic::set_hook(hook);
    match built {
        Ok(runtime) => runtime.map_err(|e| e.to_string()),
        Err(panic) => Err(panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "the runtime panicked while starting".to_owned())),
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
    let server = match oncegate_server::start(&args, true).await {
        Ok(server) => server,
        // Logged where it happened, with its fields.
        Err(e) => return ExitCode::from(e.exit_code()),
    };
    // Standard output carries this one line, the port-0 discovery contract (tests and clients
    // read it); every log line goes to standard error, the start-up line before it.
    println!("listening on {}", server.addr());
    match server.run(shutdown_signal()).await {
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

/// `oncegate migrate`: the PostgreSQL schema brought to this binary's version; exits 64 on a bad
/// URL or a newer schema, 69 when the database cannot be reached.
async fn migrate(args: cli::MigrateArgs) -> ExitCode {
    let timeout = std::time::Duration::from_millis(args.store_timeout_ms.max(1));
    match oncegate_store::postgres::migrate(&args.postgres_url, timeout).await {
        Ok(applied) if applied.is_empty() => {
            println!(
                "schema at version {}: nothing to apply",
                oncegate_store::postgres::schema::binary_version()
            );
            ExitCode::SUCCESS
        }
        Ok(applied) => {
            println!("applied schema versions {applied:?}");
            ExitCode::SUCCESS
        }
        Err(oncegate_store::StoreError::Misconfigured(why)) => {
            eprintln!("oncegate migrate: {why}");
            ExitCode::from(exit::USAGE)
        }
        Err(e) => {
            eprintln!("oncegate migrate: {e}");
            ExitCode::from(exit::UNAVAILABLE)
        }
    }
}
