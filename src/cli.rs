//! The command line: `oncegate serve` (its flags are [`oncegate_config::ServeArgs`]),
//! `oncegate fingerprint`, `oncegate hash-key`, `oncegate call …` ([`super::call_cli`]),
//! `oncegate admin …` ([`super::admin`]), `oncegate bench` ([`super::bench`]), `oncegate mcp`
//! ([`super::mcp`]), `oncegate keys` and `oncegate verify` ([`super::keys`]), `oncegate migrate`. `--help` is the
//! reference.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use oncegate_config::ServeArgs;

/// oncegate: perform each side-effecting action of an AI agent at most once.
///
/// Workers ask the gate for a one-shot token before they act, report the outcome after, and get
/// the original receipt back when they retry. Runs on an embedded durable store by default, or in
/// front of Redis (--redis-url) or PostgreSQL (--postgres-url). Optionally it also decides whether an agent may act: Cedar
/// rules, budgets and approvals ([authorization] and [[budgets]] in `serve --config`; `admin
/// approve`, `deny`, `list-approvals`, `budgets`). Guides: docs/README.md.
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
    Serve(Box<ServeArgs>),
    /// Print the fingerprint the gate computes for an action, offline.
    Fingerprint(FingerprintArgs),
    /// Read an API key on standard input and print its SHA-256 (for `api_key_sha256`).
    HashKey,
    /// The worker API against a running gate: request-token, complete, release, extend, get.
    Call(Box<super::call_cli::CallArgs>),
    /// The operator API against a running gate: get, complete, resolve, list-unresolved, audit;
    /// approvals and budgets: approve, deny, list-approvals, budgets.
    Admin(Box<super::admin::AdminArgs>),
    /// Load a running gate on this machine and report throughput, latency and correctness.
    Bench(super::bench::BenchArgs),
    /// An MCP proxy that puts the gate in front of an MCP server: gated tools run at most once.
    #[cfg(feature = "mcp")]
    Mcp(Box<oncegate_mcp::McpArgs>),
    /// An MCP proxy that puts the gate in front of an MCP server (not in this build: `make run`
    /// leaves it out; `cargo build --release --bin oncegate` builds it).
    #[cfg(not(feature = "mcp"))]
    Mcp(McpLeftOut),
    /// The signing keys: generate a key file, export the public keys as JWKS.
    Keys(super::keys::KeysArgs),
    /// Check a grant statement offline, as the action's executor would; prints its claims.
    Verify(super::keys::VerifyArgs),
    /// Apply the PostgreSQL store's schema migrations and exit (`serve` applies them too, at
    /// start-up); a database migrated by a newer oncegate is refused.
    Migrate(MigrateArgs),
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

/// `oncegate mcp` in a build without the `mcp` feature: whatever follows is taken, and the command
/// says how to get the gateway.
#[cfg(not(feature = "mcp"))]
#[derive(Debug, clap::Args)]
pub struct McpLeftOut {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    pub args: Vec<String>,
}

/// Settings of `oncegate migrate`.
#[derive(Debug, Clone, clap::Args)]
pub struct MigrateArgs {
    /// The PostgreSQL URL (libpq form), as `serve --postgres-url` takes it.
    #[arg(long, env = "ONCEGATE_POSTGRES_URL", hide_env_values = true)]
    pub postgres_url: String,
    /// Deadline of one statement in milliseconds (the connection included).
    #[arg(long, env = "ONCEGATE_STORE_TIMEOUT_MS", default_value_t = oncegate_config::defaults::STORE_TIMEOUT_MS)]
    pub store_timeout_ms: u64,
}
