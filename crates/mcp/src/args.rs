//! The flags of `oncegate mcp`, each with an environment fallback. `oncegate mcp --help` is the
//! reference; [`super::run`] validates them once. Defaults are [`oncegate_config::defaults`]'.

use std::{net::SocketAddr, path::PathBuf};

use clap::Args;

use oncegate_config::GateAccess;
use oncegate_config::defaults;
use oncegate_observe::telemetry::LogFormat;

/// Settings of `oncegate mcp`.
///
/// An MCP proxy that puts the gate in front of one upstream MCP server: every message passes
/// through unchanged except `tools/call` of gated tools, which run at most once per action.
#[derive(Debug, Clone, Args)]
pub struct McpArgs {
    /// The upstream MCP server as a child process speaking stdio: the command and its arguments.
    /// Takes every following argument, so put it last.
    #[arg(long, num_args = 1.., allow_hyphen_values = true, value_name = "COMMAND",
          conflicts_with = "upstream_url", required_unless_present = "upstream_url")]
    pub upstream_command: Vec<String>,

    /// The upstream MCP server over Streamable HTTP, e.g. http://127.0.0.1:8000/mcp.
    #[arg(long, env = "ONCEGATE_MCP_UPSTREAM_URL")]
    pub upstream_url: Option<String>,

    /// Serve MCP over Streamable HTTP on this address (at /mcp) instead of stdio. Port 0 picks a
    /// free port; the bound address is printed on standard output as `listening on ADDR`.
    #[arg(long, env = "ONCEGATE_MCP_LISTEN")]
    pub listen: Option<SocketAddr>,

    /// Host names (or host:port) the Streamable HTTP listener accepts in the `Host` header, comma-
    /// separated (DNS-rebinding protection). Default: loopback names only.
    #[arg(long, env = "ONCEGATE_MCP_ALLOWED_HOSTS", value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,

    /// A gate over gRPC: host:port or http://host:port, https://host:port (TLS, with --ca), or
    /// unix:<path> (a gate's admin socket). Without it, the gateway runs the
    /// gate in-process on the embedded store under --data-dir. Connected on first use: while it
    /// is unreachable, gated calls answer GATE_UNAVAILABLE and nothing is forwarded.
    /// ONCEGATE_GATE, its earlier environment name, is still read, with a warning.
    #[arg(long, env = "ONCEGATE_TARGET")]
    pub gate: Option<String>,

    #[command(flatten)]
    pub access: GateAccess,

    /// With --gate: the API key of a principal with the `approver` (or `operator`) role, so that
    /// a call the gate holds for approval is asked in the chat (`elicitation/create`, when the
    /// client supports it) and the person's answer decided at the gate. Without it, a held call
    /// answers with the approval id. The in-process gate needs none (it decides as
    /// `oncegate-mcp`).
    #[arg(long, env = "ONCEGATE_MCP_APPROVER_API_KEY", hide_env_values = true)]
    pub approver_api_key: Option<String>,

    /// The configuration file: `[mcp]` (which tools are gated, their action names and key
    /// fields) and, for the in-process gate, the action policies, limits, [authorization] and
    /// [[budgets]]; every key in docs/reference/config.md.
    #[arg(long, env = "ONCEGATE_CONFIG")]
    pub config: Option<PathBuf>,

    /// The in-process gate's embedded store directory (ignored with --gate). One process per
    /// directory: for several gateways, run a gate and use --gate.
    #[arg(long, env = "ONCEGATE_DATA_DIR", default_value = defaults::DATA_DIR)]
    pub data_dir: PathBuf,

    /// The in-process gate's admin socket, as `oncegate serve` serves it: a Unix socket (mode
    /// 0600) on which this machine's user of the gateway is the operator, so that `oncegate admin
    /// approve` (and every admin command) reaches the gate while the gateway runs. Default:
    /// <data-dir>/admin.sock. Ignored with --gate (that gate serves its own).
    #[arg(
        long,
        env = "ONCEGATE_ADMIN_SOCKET",
        conflicts_with = "no_admin_socket"
    )]
    pub admin_socket: Option<PathBuf>,

    /// Serve no admin socket for the in-process gate (then nobody can approve a held call but
    /// the person in the chat, through elicitation).
    #[arg(long, env = "ONCEGATE_NO_ADMIN_SOCKET")]
    pub no_admin_socket: bool,

    /// The operator console of the in-process gate, as `oncegate serve --console-listen`: web
    /// pages for approvals and unresolved actions, plain HTTP on a loopback address (e.g.
    /// 127.0.0.1:7480); log in with a code from `oncegate admin console-login`. Off when unset.
    #[arg(long, env = "ONCEGATE_CONSOLE_LISTEN", conflicts_with = "gate")]
    pub console_listen: Option<SocketAddr>,

    /// The agent the gateway acts for (else `[mcp] agent_id`, else "mcp"). With --gate and API
    /// keys, one of the principal's agents.
    #[arg(long, env = "ONCEGATE_AGENT_ID")]
    pub agent_id: Option<String>,

    /// The run id of calls whose `_meta` carries no `oncegate/run_id`. Without it, each MCP
    /// session is its own run (retries deduplicate only within the session).
    #[arg(long, env = "ONCEGATE_RUN_ID")]
    pub run_id: Option<String>,

    /// How long a gated call waits for an attempt of the same action in progress elsewhere before
    /// answering with a tool error, in seconds. Not for an attempt this gateway lost (answered at
    /// once), nor for an unreachable gate (fails at once).
    #[arg(long, env = "ONCEGATE_MCP_IN_PROGRESS_WAIT_SECONDS",
          default_value_t = defaults::MCP_IN_PROGRESS_WAIT_SECONDS)]
    pub in_progress_wait_seconds: u64,

    /// Deadline of one forwarded call of a gated tool, in seconds; past it the outcome is unknown.
    #[arg(long, env = "ONCEGATE_MCP_CALL_TIMEOUT_SECONDS",
          default_value_t = defaults::MCP_CALL_TIMEOUT_SECONDS,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub call_timeout_seconds: u64,

    /// Prometheus endpoint (`GET /metrics`): the gateway's own series (`oncegate_mcp_*`) and, in
    /// process, the gate's. Off when unset.
    #[arg(long, env = "ONCEGATE_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,

    /// Log format (logs go to standard error; standard output carries MCP in stdio mode).
    #[arg(long, env = "ONCEGATE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}
