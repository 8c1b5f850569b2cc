//! Every default of the command line, once. `--help` shows them; [`server`] and [`redis`] build
//! the server's and the Redis store's settings from them (for tests and embedders too). The action
//! policy defaults (lease, retention, limits) are the gate's: [`oncegate_gate::policy`].

use std::time::Duration;

use oncegate_grpc::{auth::Principals, server::ServerOptions};
use oncegate_store::redis::RedisOptions;

/// Address of the gRPC listener.
pub const LISTEN: &str = "127.0.0.1:50051";
/// Directory of the embedded store's file.
pub const DATA_DIR: &str = "oncegate-data";
/// The admin socket's file name, in the data directory.
pub const ADMIN_SOCKET: &str = "admin.sock";
/// The issuer (`iss`) of every signed statement.
pub const SIGNING_ISSUER: &str = "oncegate";
/// Deadline of one store call, in milliseconds.
pub const STORE_TIMEOUT_MS: u64 = 2000;
/// The embedded store's page cache, in MiB.
pub const EMBEDDED_CACHE_MB: u64 = oncegate_store::embedded::DEFAULT_CACHE_MB;
/// Durability level: replicas that must confirm every state change.
pub const DURABILITY_REPLICAS: u32 = 0;
/// `--postgres-pool-size` (its help says why).
pub const POSTGRES_POOL_SIZE: u64 = 16;
/// How often the PostgreSQL store purges what is past its retention.
pub const POSTGRES_PURGE_INTERVAL: Duration = Duration::from_secs(1);
/// How long `WAIT` lets the replicas take, in milliseconds.
pub const DURABILITY_TIMEOUT_MS: u64 = 1000;
/// Sentinel: how often the master's role is re-checked, in milliseconds.
pub const SENTINEL_CHECK_MS: u64 = 1000;
/// Redis: how often the receipt chains that grew get their head signed, in milliseconds. Not a
/// flag: it bounds how long a completion stays covered by no signature (and what a gate that
/// stops leaves unsigned until the next seal), and at 50 ms costs a few signatures a second.
pub const SEAL_INTERVAL_MS: u64 = 50;
/// Connections reserved for calls that `WAIT` for replicas (when a durability level is set).
pub const WAIT_LANES: usize = 4;
/// The most `--serving-threads` accepts: past it, the threads would share standalone Redis
/// connections.
pub const MAX_SERVING_THREADS: u16 = oncegate_store::redis::MAX_SERVING_THREADS as u16;
/// The most `--worker-threads` accepts.
pub const MAX_WORKER_THREADS: u16 = 1024;
/// On SIGTERM/SIGINT, how long in-flight calls may take to finish, in seconds.
pub const DRAIN_SECONDS: u64 = 20;
/// Largest accepted gRPC request message, in bytes.
pub const MAX_MESSAGE_BYTES: u64 = 256 * 1024;
/// How often the store is probed for the health service.
pub const HEALTH_INTERVAL: Duration = Duration::from_secs(1);
/// How often the unresolved actions are counted (a listing of every agent).
pub const UNRESOLVED_INTERVAL: Duration = Duration::from_secs(30);
/// The `action` metric label of every action no policy names.
pub const OTHER_ACTION_LABEL: &str = oncegate_observe::metrics::DEFAULT_OTHER_ACTION;

/// The server settings of a gate started without flags (and without principals: open).
pub fn server() -> ServerOptions {
    ServerOptions {
        drain_timeout: Duration::from_secs(DRAIN_SECONDS),
        max_message_bytes: MAX_MESSAGE_BYTES as usize,
        health_interval: HEALTH_INTERVAL,
        unresolved_interval: UNRESOLVED_INTERVAL,
        tls: None,
        health_listen: None,
        principals: Principals::default(),
        admin_socket: None,
        console_logins: None,
        serving_threads: 1,
    }
}

/// The Redis settings of a gate started without flags.
pub fn redis() -> RedisOptions {
    RedisOptions {
        call_timeout: Duration::from_millis(STORE_TIMEOUT_MS),
        durability_replicas: DURABILITY_REPLICAS,
        durability_timeout: Duration::from_millis(DURABILITY_TIMEOUT_MS),
        wait_lanes: WAIT_LANES,
        sentinel_check_interval: Duration::from_millis(SENTINEL_CHECK_MS),
        seal_interval: Duration::from_millis(SEAL_INTERVAL_MS),
        username: None,
        password: None,
        allow_eviction: false,
    }
}

/// `oncegate admin`: the gate's address.
pub const ADMIN_SERVER: &str = "http://127.0.0.1:50051";
/// `oncegate mcp`: the agent id when neither `--agent-id` nor `[mcp] agent_id` names one.
pub const MCP_AGENT_ID: &str = "mcp";
/// `oncegate mcp`: how long a gated call waits for an attempt in progress elsewhere, in seconds.
pub const MCP_IN_PROGRESS_WAIT_SECONDS: u64 = 30;
/// `oncegate mcp`: deadline of one forwarded `tools/call` of a gated tool, in seconds.
pub const MCP_CALL_TIMEOUT_SECONDS: u64 = 600;
/// `oncegate mcp --listen`: the path of the Streamable HTTP endpoint.
pub const MCP_PATH: &str = "/mcp";
