//! The flags of `oncegate serve`, each with an environment fallback, as clap parses them. `--help`
//! is the reference; [`super::Config::from_flags`] validates them once. Every default is one of
//! [`super::defaults`].

use std::{net::SocketAddr, path::PathBuf};

use super::defaults;
use oncegate_observe::telemetry::LogFormat;
use oncegate_store::redis::Topology;

// The groups of `oncegate serve --help`, in the order they are listed.
const LISTENER: &str = "Listener";
const STORE: &str = "Store";
const REDIS: &str = "Redis topologies (set one; none: the embedded store)";
const DURABILITY: &str = "Durability";
const POSTGRES: &str = "PostgreSQL (excludes the Redis topologies)";
const SECURITY: &str = "Security";
const OBSERVABILITY: &str = "Observability";
const LIMITS: &str = "Limits (more in the config file's [limits])";

/// Settings of `oncegate serve`, validated once at start-up.
#[derive(Debug, Clone, clap::Args)]
#[command(next_line_help = true)]
pub struct ServeArgs {
    /// Address of the gRPC listener. Port 0 picks a free port; the bound address is printed on
    /// standard output as `listening on ADDR`.
    #[arg(help_heading = LISTENER, long, env = "ONCEGATE_LISTEN", default_value = defaults::LISTEN)]
    pub listen: SocketAddr,

    /// The config file (TOML): action policies (strict, [defaults], [actions."name"]), [limits],
    /// [[principals]], authorization ([authorization]: Cedar rules, mode, approvals; [[budgets]])
    /// and the MCP gateway's [mcp]; every key in docs/reference/config.md. Without it: built-in
    /// defaults, an open gate, no rules or budgets.
    #[arg(help_heading = LISTENER, long, env = "ONCEGATE_CONFIG")]
    pub config: Option<PathBuf>,

    /// A second, plaintext listener serving only gRPC health, for probes that cannot speak TLS
    /// (Kubernetes gRPC probes) when the main listener uses it. Off when unset.
    #[arg(help_heading = LISTENER, long, env = "ONCEGATE_HEALTH_LISTEN")]
    pub health_listen: Option<SocketAddr>,

    /// Address of the operator console: web pages for operators and approvers (pending approvals,
    /// unresolved actions, recent decisions, budgets, the DAR), plain HTTP, e.g. 127.0.0.1:7480.
    /// Off when unset (`make run` sets 127.0.0.1:7480). A non-loopback address needs --insecure:
    /// put a TLS proxy in front of it.
    #[arg(help_heading = LISTENER, long, env = "ONCEGATE_CONSOLE_LISTEN")]
    pub console_listen: Option<SocketAddr>,

    /// Threads that run calls (the async runtime's workers). Default: one per CPU available to
    /// the process, but one CPU fewer when Redis runs on this machine (every Redis address given
    /// is loopback or a Unix socket), which leaves Redis a core of its own. One thread is Tokio's
    /// current-thread scheduler, which writes the Redis commands and replies of the calls ready
    /// together in one system call each: on 2 CPUs shared with Redis, about 0.6x the gate CPU per
    /// call of two workers and as many calls per second (BENCHMARKS.md, "What was tried"). Set
    /// it when the gate's share of the machine is not what the CPU count says. The start-up line
    /// logs the count, the scheduler, the CPUs and which rule chose the count. A signing gate
    /// signs its grants on one thread more (`oncegate-signer`), so that a signature does not hold
    /// the calls queued behind it.
    #[arg(help_heading = LISTENER, long, env = "ONCEGATE_WORKER_THREADS",
          value_parser = clap::value_parser!(u16).range(1..=i64::from(defaults::MAX_WORKER_THREADS)))]
    pub worker_threads: Option<u16>,

    /// Threads the gRPC connections are dealt to in turn, each running a current-thread runtime
    /// of its own; the runtime of `--worker-threads` is the first. A connection stays on its
    /// thread, and so does everything its calls do (on a standalone Redis, their commands go on
    /// a connection that thread opens). For many clients with a connection each (worker
    /// processes), 2 on 2 CPUs beside Redis made the Python decorator about 1.1x the cycles per
    /// second of 1 on one VM and no faster on another, for 15-25% more gate CPU per call
    /// (BENCHMARKS.md, "What was tried"): measure on your host. One busy connection is served by
    /// one thread whatever this says.
    #[arg(help_heading = LISTENER, long, env = "ONCEGATE_SERVING_THREADS", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=defaults::MAX_SERVING_THREADS as i64))]
    pub serving_threads: u16,

    /// On SIGTERM/SIGINT, how long in-flight calls may take to finish, in seconds.
    #[arg(help_heading = LISTENER, long, env = "ONCEGATE_DRAIN_SECONDS", default_value_t = defaults::DRAIN_SECONDS)]
    pub drain_seconds: u64,

    /// Directory of the embedded store's file and of the admin socket (created if missing). With
    /// --redis-url (or Sentinel, Cluster) it holds only the admin socket, <data-dir>/admin.sock.
    #[arg(help_heading = STORE, long, env = "ONCEGATE_DATA_DIR", default_value = defaults::DATA_DIR)]
    pub data_dir: PathBuf,

    /// The embedded store's page cache in MiB: the most memory redb keeps for the file, however
    /// large it grows (redb's own default is 1024). Ignored with Redis.
    #[arg(help_heading = STORE, long, env = "ONCEGATE_EMBEDDED_CACHE_MB", default_value_t = defaults::EMBEDDED_CACHE_MB,
          value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    pub embedded_cache_mb: u64,

    /// Deadline of one store call in milliseconds; past it the call fails closed with UNAVAILABLE.
    #[arg(help_heading = STORE, long, env = "ONCEGATE_STORE_TIMEOUT_MS", default_value_t = defaults::STORE_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub store_timeout_ms: u64,

    /// Redis URL (redis://[user:pass@]host:port[/db], rediss:// for TLS) of a standalone Redis.
    /// Without it (and without --redis-cluster-nodes or --redis-sentinels) the gate uses the
    /// embedded store under --data-dir.
    #[arg(help_heading = REDIS, long, env = "ONCEGATE_REDIS_URL")]
    pub redis_url: Option<String>,

    /// Redis Cluster seed nodes, comma-separated host:port (or redis:// URLs); the gate discovers
    /// the rest. Excludes --redis-url and --redis-sentinels.
    #[arg(help_heading = REDIS, long, env = "ONCEGATE_REDIS_CLUSTER_NODES", value_delimiter = ',')]
    pub redis_cluster_nodes: Vec<String>,

    /// Redis Sentinel addresses, comma-separated host:port (or redis:// URLs with the sentinels'
    /// own credentials); needs --redis-sentinel-master. Excludes --redis-url and
    /// --redis-cluster-nodes.
    #[arg(help_heading = REDIS, long, env = "ONCEGATE_REDIS_SENTINELS", value_delimiter = ',')]
    pub redis_sentinels: Vec<String>,

    /// The name Sentinel knows the master by (`sentinel monitor <name> ...`).
    #[arg(help_heading = REDIS, long, env = "ONCEGATE_REDIS_SENTINEL_MASTER")]
    pub redis_sentinel_master: Option<String>,

    /// Username for the Redis data nodes (Cluster nodes, the Sentinel-managed master, or the
    /// --redis-url server), unless their URL names one.
    #[arg(help_heading = REDIS, long, env = "ONCEGATE_REDIS_USERNAME")]
    pub redis_username: Option<String>,

    /// Password for the Redis data nodes, unless their URL names one. Prefer the environment
    /// variable (from a Secret) to the flag, which shows in process lists.
    #[arg(help_heading = REDIS, long, env = "ONCEGATE_REDIS_PASSWORD", hide_env_values = true)]
    pub redis_password: Option<String>,

    /// Sentinel only: how often the master's ROLE and the sentinels' answer are re-checked, in
    /// milliseconds (failover events are followed at once; this catches missed ones).
    #[arg(help_heading = REDIS, long, env = "ONCEGATE_REDIS_SENTINEL_CHECK_MS", default_value_t = defaults::SENTINEL_CHECK_MS,
          value_parser = clap::value_parser!(u64).range(50..=60_000))]
    pub redis_sentinel_check_ms: u64,

    /// UNSAFE: serve although Redis may evict keys (its maxmemory-policy is not noeviction, or
    /// cannot be read). An evicted completion runs its action again. Without it such a Redis is
    /// refused at start-up (exit 64) and, if its policy changes later, every call fails closed.
    #[arg(help_heading = REDIS, long, env = "ONCEGATE_ALLOW_REDIS_EVICTION")]
    pub allow_redis_eviction: bool,

    /// PostgreSQL URL (libpq form: postgresql://user:password@host:port/database?options). Several
    /// hosts with target_session_attrs=read-write (postgresql://h1:5432,h2:5432/db?
    /// target_session_attrs=read-write) let the gate follow a promoted standby without a restart.
    /// The schema is migrated at start-up. Excludes the Redis flags. Prefer the environment
    /// variable (from a Secret) when the URL holds a password.
    #[arg(help_heading = POSTGRES, long, env = "ONCEGATE_POSTGRES_URL", hide_env_values = true)]
    pub postgres_url: Option<String>,

    /// PostgreSQL connections this gate opens at most. A call holds one only for its step's two
    /// round trips, so 16 keep a busy gate's calls flowing; replicas × this must stay below the
    /// server's max_connections (100 by default), with room for other clients.
    #[arg(help_heading = POSTGRES, long, env = "ONCEGATE_POSTGRES_POOL_SIZE", default_value_t = defaults::POSTGRES_POOL_SIZE,
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub postgres_pool_size: u64,

    /// Durability level: replicas that must confirm every state change (Redis WAIT) before it is
    /// acknowledged. When fewer confirm, a grant is not handed out and a Complete returns
    /// UNAVAILABLE. A policy's durability_replicas may ask for more. Needs Redis with replicas, or
    /// PostgreSQL with as many synchronous standbys.
    #[arg(help_heading = DURABILITY, long, env = "ONCEGATE_DURABILITY_REPLICAS", default_value_t = defaults::DURABILITY_REPLICAS)]
    pub durability_replicas: u32,

    /// How long WAIT lets the replicas take, in milliseconds; must be below --store-timeout-ms.
    #[arg(help_heading = DURABILITY, long, env = "ONCEGATE_DURABILITY_TIMEOUT_MS", default_value_t = defaults::DURABILITY_TIMEOUT_MS,
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub durability_timeout_ms: u64,

    /// PEM certificate chain of the listener: serve TLS (with --tls-key).
    #[arg(help_heading = SECURITY, long, env = "ONCEGATE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of --tls-cert.
    #[arg(help_heading = SECURITY, long, env = "ONCEGATE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// PEM CA bundle for client certificates: mutual TLS (needs --tls-cert). Principals with a
    /// cert_identity authenticate with such a certificate; without principals, every caller must
    /// present one.
    #[arg(help_heading = SECURITY, long, env = "ONCEGATE_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// Serve a non-loopback address without principals or client certificates, open to anyone
    /// who can reach it. Without it such a start is refused (exit 64).
    #[arg(help_heading = SECURITY, long, env = "ONCEGATE_INSECURE")]
    pub insecure: bool,

    /// The admin socket: a Unix socket (mode 0600) on which the gate's own user is the operator,
    /// so `oncegate admin` on this machine works with no principal configured. Default:
    /// <data-dir>/admin.sock, on every store (its directory is created); the start-up line names
    /// it.
    #[arg(help_heading = SECURITY, long, env = "ONCEGATE_ADMIN_SOCKET", conflicts_with = "no_admin_socket")]
    pub admin_socket: Option<PathBuf>,

    /// Serve no admin socket (operators then need a principal and an API key or certificate).
    #[arg(help_heading = SECURITY, long, env = "ONCEGATE_NO_ADMIN_SOCKET")]
    pub no_admin_socket: bool,

    /// Ed25519 private key (PKCS#8 PEM: `oncegate keys generate`, or `openssl genpkey -algorithm
    /// ed25519`) that signs grant and receipt statements. Without it the embedded store generates
    /// one into --data-dir at first start; on Redis the gate then serves unsigned (warned), since
    /// every replica must sign with the same key: give them all this file.
    #[arg(help_heading = SECURITY, long, env = "ONCEGATE_SIGNING_KEY")]
    pub signing_key: Option<PathBuf>,

    /// Retired signing keys, comma-separated PEM files (private or public): still published and
    /// still verifying what they signed, never signing. Remove one once its last grant expired
    /// (the longest lease) and no auditor needs it: statements it signed are then refused.
    #[arg(help_heading = SECURITY, long, env = "ONCEGATE_RETIRED_SIGNING_KEYS", value_delimiter = ',')]
    pub retired_signing_keys: Vec<PathBuf>,

    /// The issuer (`iss`) every statement names.
    #[arg(help_heading = SECURITY, long, env = "ONCEGATE_SIGNING_ISSUER", default_value = defaults::SIGNING_ISSUER)]
    pub signing_issuer: String,

    /// Serve without signing: no grant statements, no receipt chains.
    #[arg(help_heading = SECURITY, long, env = "ONCEGATE_UNSIGNED", conflicts_with = "signing_key")]
    pub unsigned: bool,

    /// Log format.
    #[arg(help_heading = OBSERVABILITY, long, env = "ONCEGATE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Address of the Prometheus endpoint (`GET /metrics`, plain HTTP), e.g. 0.0.0.0:9464. Off
    /// when unset. Keep it off the public network: the series name the configured actions.
    #[arg(help_heading = OBSERVABILITY, long, env = "ONCEGATE_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,

    /// The `action` metric label of every action that no policy names, so that agents inventing
    /// action names cannot grow the number of series. Must not be a policy's name.
    #[arg(help_heading = OBSERVABILITY, long, env = "ONCEGATE_METRICS_OTHER_ACTION_LABEL", default_value = defaults::OTHER_ACTION_LABEL)]
    pub metrics_other_action_label: String,

    /// OTLP/gRPC endpoint for trace export, e.g. http://otel-collector:4317 (builds with the `otel`
    /// feature only). Off when unset.
    #[cfg(feature = "otel")]
    #[arg(help_heading = OBSERVABILITY, long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,

    /// Largest accepted gRPC request message, in bytes.
    #[arg(help_heading = LIMITS, long, env = "ONCEGATE_MAX_MESSAGE_BYTES", default_value_t = defaults::MAX_MESSAGE_BYTES,
          value_parser = clap::value_parser!(u64).range(1024..=64 * 1024 * 1024))]
    pub max_message_bytes: u64,
}

impl ServeArgs {
    /// The admin socket to serve, if any.
    pub fn admin_socket(&self) -> Option<PathBuf> {
        if self.no_admin_socket {
            return None;
        }
        Some(
            self.admin_socket
                .clone()
                .unwrap_or_else(|| self.data_dir.join(defaults::ADMIN_SOCKET)),
        )
    }

    /// The OTLP endpoint, if trace export is configured (always `None` without the `otel` feature).
    pub fn otlp_endpoint(&self) -> Option<&str> {
        #[cfg(feature = "otel")]
        return self.otlp_endpoint.as_deref();
        #[cfg(not(feature = "otel"))]
        None
    }

    /// How many threads run calls on a machine of `cpus` CPUs, and by which rule (the reasons are
    /// in `--worker-threads`'s help).
    pub fn worker_threads(&self, cpus: usize) -> WorkerThreads {
        let cpus = cpus.max(1);
        match self.worker_threads {
            Some(threads) => WorkerThreads::Flag(threads.into()),
            None => match self.redis_topology() {
                Ok(Some(redis)) if redis.is_on_this_machine() && cpus > 1 => {
                    WorkerThreads::BesideRedis(cpus - 1)
                }
                _ => WorkerThreads::PerCpu(cpus),
            },
        }
    }

    /// The Redis deployment to use, `None` for the embedded store. Exactly one of --redis-url,
    /// --redis-cluster-nodes and --redis-sentinels may be set; the error names the settings.
    pub fn redis_topology(&self) -> Result<Option<Topology>, String> {
        let redis = self.redis_url.is_some()
            || !self.redis_cluster_nodes.is_empty()
            || !self.redis_sentinels.is_empty();
        if self.postgres_url.is_some() {
            if redis {
                return Err(
                    "set either --postgres-url or a Redis topology (--redis-url, \
                            --redis-cluster-nodes, --redis-sentinels), not both"
                        .into(),
                );
            }
            return Ok(None);
        }
        let set = [
            self.redis_url.is_some(),
            !self.redis_cluster_nodes.is_empty(),
            !self.redis_sentinels.is_empty(),
        ];
        if set.iter().filter(|s| **s).count() > 1 {
            return Err("set only one of --redis-url, --redis-cluster-nodes and --redis-sentinels \
                        (ONCEGATE_REDIS_URL, ONCEGATE_REDIS_CLUSTER_NODES, ONCEGATE_REDIS_SENTINELS)"
                .into());
        }
        let blank = |list: &[String]| list.iter().any(|n| n.trim().is_empty());
        if blank(&self.redis_cluster_nodes) || blank(&self.redis_sentinels) {
            return Err(
                "--redis-cluster-nodes / --redis-sentinels: empty address in the list".into(),
            );
        }
        if self.redis_sentinels.is_empty() != self.redis_sentinel_master.is_none() {
            return Err("--redis-sentinels and --redis-sentinel-master go together".into());
        }
        let topology = if let Some(url) = &self.redis_url {
            Topology::Standalone { url: url.clone() }
        } else if !self.redis_cluster_nodes.is_empty() {
            Topology::Cluster {
                nodes: self.redis_cluster_nodes.clone(),
            }
        } else if let Some(master) = &self.redis_sentinel_master {
            Topology::Sentinel {
                sentinels: self.redis_sentinels.clone(),
                master: master.clone(),
            }
        } else {
            if self.durability_replicas > 0 {
                return Err(
                    "--durability-replicas needs Redis with replicas; the embedded store has none"
                        .into(),
                );
            }
            return Ok(None);
        };
        if self.durability_timeout_ms >= self.store_timeout_ms {
            return Err("--durability-timeout-ms must be below --store-timeout-ms".into());
        }
        Ok(Some(topology))
    }
}

/// The CPUs available to the process (a container's CPU limit counts); 1 when unknown.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// How many threads run calls, and which rule chose the count ([`ServeArgs::worker_threads`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerThreads {
    /// `--worker-threads`.
    Flag(usize),
    /// One per CPU: the embedded store, or Redis on other machines.
    PerCpu(usize),
    /// One per CPU but one, left to a Redis on this machine.
    BesideRedis(usize),
}

impl WorkerThreads {
    /// The number of threads.
    pub fn count(self) -> usize {
        match self {
            Self::Flag(n) | Self::PerCpu(n) | Self::BesideRedis(n) => n,
        }
    }

    /// One thread is Tokio's current-thread scheduler: it runs tasks in the order they were
    /// woken, so the connections write for every call that became ready at once, where the
    /// multi-thread scheduler, even with one worker, runs a woken task first.
    pub fn is_current_thread(self) -> bool {
        self.count() == 1
    }

    /// The rule, for the start-up line: `flag`, `cpus` or `cpus_but_one_for_local_redis`.
    pub fn rule(self) -> &'static str {
        match self {
            Self::Flag(_) => "flag",
            Self::PerCpu(_) => "cpus",
            Self::BesideRedis(_) => "cpus_but_one_for_local_redis",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Serve {
        #[command(flatten)]
        args: ServeArgs,
    }

    fn threads(flags: &[&str], cpus: usize) -> WorkerThreads {
        let args = Serve::try_parse_from(std::iter::once("serve").chain(flags.iter().copied()))
            .unwrap()
            .args;
        args.worker_threads(cpus)
    }

    #[test]
    fn a_redis_on_this_machine_is_left_one_cpu() {
        let local = ["--redis-url", "redis://127.0.0.1:6379"];
        assert_eq!(threads(&local, 2), WorkerThreads::BesideRedis(1));
        assert!(threads(&local, 2).is_current_thread());
        assert_eq!(threads(&local, 8), WorkerThreads::BesideRedis(7));
        assert_eq!(threads(&local, 1), WorkerThreads::PerCpu(1));
        let cluster = ["--redis-cluster-nodes", "127.0.0.1:7000,localhost:7001"];
        assert_eq!(threads(&cluster, 4), WorkerThreads::BesideRedis(3));
    }

    #[test]
    fn elsewhere_and_embedded_get_one_thread_per_cpu_and_the_flag_wins() {
        let remote = ["--redis-url", "redis://10.1.2.3:6379"];
        assert_eq!(threads(&remote, 2), WorkerThreads::PerCpu(2));
        assert_eq!(threads(&[], 2), WorkerThreads::PerCpu(2));
        assert!(!threads(&[], 2).is_current_thread());
        assert_eq!(threads(&[], 0), WorkerThreads::PerCpu(1));
        let flagged = [
            "--redis-url",
            "redis://127.0.0.1:6379",
            "--worker-threads",
            "2",
        ];
        assert_eq!(threads(&flagged, 2), WorkerThreads::Flag(2));
        assert_eq!(threads(&flagged, 2).rule(), "flag");
    }
}
