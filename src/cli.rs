//! The command line: `oncegate serve`, `oncegate fingerprint` and `oncegate bench`. Every flag of
//! the gate has an environment fallback and shows in `--help`, which is the reference.

use std::{net::SocketAddr, path::PathBuf};

use clap::{Parser, Subcommand, ValueEnum};

/// oncegate: perform each side-effecting action of an AI agent at most once.
///
/// Workers ask the gate for a one-shot token before they act, report the outcome after, and get
/// the original receipt back when they retry. Runs on an embedded durable store by default, or in
/// front of Redis with --redis-url.
#[derive(Debug, Parser)]
#[command(name = "oncegate", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// What to do.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gate's gRPC server.
    Serve(ServeArgs),
    /// Print the fingerprint the gate computes for an action, offline.
    Fingerprint(FingerprintArgs),
    /// Load a running gate on this machine and report throughput, latency and correctness.
    Bench(crate::bench::BenchArgs),
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Settings of `oncegate serve`, validated once at start-up.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Address of the gRPC listener. Port 0 picks a free port; the bound address is printed on
    /// standard output as `listening on ADDR`.
    #[arg(long, env = "ONCEGATE_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,

    /// Redis URL (redis://[user:pass@]host:port[/db], rediss:// for TLS). Without it the gate uses
    /// the embedded store under --data-dir.
    #[arg(long, env = "ONCEGATE_REDIS_URL")]
    pub redis_url: Option<String>,

    /// Directory of the embedded store's file (created if missing). Ignored with --redis-url.
    #[arg(long, env = "ONCEGATE_DATA_DIR", default_value = "oncegate-data")]
    pub data_dir: PathBuf,

    /// Action policies file (TOML: strict, [defaults], [limits], [actions."name"]); see README.
    #[arg(long, env = "ONCEGATE_CONFIG")]
    pub config: Option<PathBuf>,

    /// Log format.
    #[arg(long, env = "ONCEGATE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Deadline of one store call in milliseconds; past it the call fails closed with UNAVAILABLE.
    #[arg(long, env = "ONCEGATE_STORE_TIMEOUT_MS", default_value_t = 2000,
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub store_timeout_ms: u64,

    /// On SIGTERM/SIGINT, how long in-flight calls may take to finish, in seconds.
    #[arg(long, env = "ONCEGATE_DRAIN_SECONDS", default_value_t = 20)]
    pub drain_seconds: u64,
}

/// Settings of `oncegate fingerprint`.
#[derive(Debug, Clone, clap::Args)]
pub struct FingerprintArgs {
    /// The action name, e.g. payments.transfer.
    #[arg(long)]
    pub action: String,

    /// The params as a JSON object.
    #[arg(long)]
    pub params: String,

    /// The intent id, if the request carries one.
    #[arg(long, default_value = "")]
    pub intent: String,

    /// The policies file, so the action's key fields apply exactly as on the server.
    #[arg(long, env = "ONCEGATE_CONFIG")]
    pub config: Option<PathBuf>,
}
