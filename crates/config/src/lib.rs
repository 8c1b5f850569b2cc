//! Configuration: the flags of `oncegate serve` ([`flags`]) and the configuration file ([`file`],
//! with the MCP gateway's `[mcp]` table in [`mcp`]) become one validated [`Config`], once, at
//! start-up; nothing else reads flags or the file. Every command-line default is in [`defaults`],
//! every exit code in [`exit`].

pub mod defaults;
pub mod file;
pub mod flags;
pub mod gate_access;
pub mod keys;

use std::{net::SocketAddr, path::PathBuf, time::Duration};

pub use file::{ConfigFile, FileError, authorization, mcp};
pub use flags::{ServeArgs, WorkerThreads, cpus};
pub use gate_access::{ADMIN_TARGET_ENV, GateAccess, TARGET_ENV, address_from_env};
pub use keys::SigningConfig;

use oncegate_gate::policy::Policies;
use oncegate_grpc::{
    server::ServerOptions,
    tls::{self, Exposure},
};
use oncegate_observe::metrics::Metrics;
use oncegate_store::{
    Store, StoreError,
    embedded::{EmbeddedStore, system_clock},
    postgres::{PostgresOptions, PostgresStore},
    redis::{RedisOptions, RedisStore, Topology},
};

/// The process exit codes of every `oncegate` command (sysexits).
pub mod exit {
    /// Bad command line or configuration (EX_USAGE).
    pub const USAGE: u8 = 64;
    /// Bad input data (EX_DATAERR).
    pub const DATAERR: u8 = 65;
    /// A service the command needs is unavailable: the store, a port, a gate (EX_UNAVAILABLE).
    pub const UNAVAILABLE: u8 = 69;
}

/// A configuration that cannot be used, with the reason (exit [`exit::USAGE`]); the cause, when
/// there is one, stays its source.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The configuration file.
    #[error(transparent)]
    File(#[from] FileError),
    /// The listener's TLS files.
    #[error("{0}")]
    Tls(#[source] oncegate_grpc::tls::TlsError),
    /// A flag, or a combination of flags, is wrong; the message names them.
    #[error("{0}")]
    Invalid(String),
}

/// Where the gate keeps its records.
#[derive(Debug, Clone)]
pub enum StoreConfig {
    /// The embedded redb file under `data_dir`.
    Embedded {
        data_dir: PathBuf,
        call_timeout: Duration,
        /// redb's page cache, in bytes (`--embedded-cache-mb`).
        cache_bytes: u64,
    },
    /// A Redis deployment.
    Redis {
        topology: Topology,
        options: RedisOptions,
    },
    /// A PostgreSQL database (`--postgres-url`).
    Postgres {
        url: String,
        options: PostgresOptions,
    },
}

impl StoreConfig {
    /// Opens the store (connects to Redis, or opens the file and starts its writer).
    pub async fn open(&self) -> Result<Store, StoreError> {
        match self {
            Self::Embedded {
                data_dir,
                call_timeout,
                cache_bytes,
            } => EmbeddedStore::open_with_cache(
                data_dir,
                system_clock(),
                *call_timeout,
                *cache_bytes,
            )
            .map(Store::Embedded),
            Self::Redis { topology, options } => RedisStore::connect_to(topology, options.clone())
                .await
                .map(Store::Redis),
            Self::Postgres { url, options } => PostgresStore::connect(url, options.clone())
                .await
                .map(Store::Postgres),
        }
    }

    /// A short name for logs: `embedded`, `redis`, `cluster`, `sentinel` or `postgres`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Embedded { .. } => "embedded",
            Self::Redis { topology, .. } => topology.name(),
            Self::Postgres { .. } => "postgres",
        }
    }
}

/// Something the operator should read at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    Info(String),
    Warn(String),
}

/// Everything `oncegate serve` runs with, validated.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub store: StoreConfig,
    pub policies: Policies,
    pub server: ServerOptions,
    /// The deployment's durability level (replicas per state change).
    pub durability_replicas: u32,
    pub metrics_listen: Option<SocketAddr>,
    pub metrics_other_action_label: String,
    /// Where the operator console listens (plain HTTP); `None`: no console.
    pub console_listen: Option<SocketAddr>,
    /// How the gate signs grants and receipts; `None`: it does not.
    pub signing: Option<SigningConfig>,
    /// Rules, budgets, approvals and shadow mode.
    pub authorization: oncegate_gate::authorization::Settings,
    /// Webhooks: `[notifications]`, `[[webhooks]]`.
    pub notifications: oncegate_notify::Settings,
    /// What the operator should hear at start-up, in order.
    pub notices: Vec<Notice>,
}

impl Config {
    /// Validates the flags and the configuration file they name.
    pub fn from_flags(args: &ServeArgs) -> Result<Self, ConfigError> {
        let file = match &args.config {
            Some(path) => ConfigFile::load(path)?,
            None => ConfigFile::default(),
        };
        let mut notices = Vec::new();
        let mut notifications = file.notifications;
        notifications
            .read_secret_env(&|name| std::env::var(name).ok())
            .map_err(ConfigError::Invalid)?;
        // Agents need a credential only once some principal has the agent role.
        let agents_identified = file.principals.has_agents();
        let tls = listener_tls(args, agents_identified, &mut notices, &file.principals)?;
        Metrics::check_other_action_label(&args.metrics_other_action_label, file.policies.names())
            .map_err(|e| ConfigError::Invalid(format!("--metrics-other-action-label: {e}")))?;
        let store = store_config(args, &file.policies)?;
        let signing = signing_config(args, &store, &mut notices);
        if let Some(console) = args.console_listen
            && !console.ip().is_loopback()
        {
            let warning = format!(
                "the operator console on {console} is plain HTTP: API keys, login codes and \
                 session cookies cross the network in clear text; terminate TLS in front of it"
            );
            match args.insecure {
                true => notices.push(Notice::Warn(format!("INSECURE: {warning}"))),
                false => {
                    return Err(ConfigError::Invalid(format!(
                        "refusing --console-listen {console}: {warning}, listen on loopback, or \
                         pass --insecure to accept the risk"
                    )));
                }
            }
        }
        let server = ServerOptions {
            drain_timeout: Duration::from_secs(args.drain_seconds),
            max_message_bytes: args.max_message_bytes as usize,
            tls,
            health_listen: args.health_listen,
            principals: file.principals,
            admin_socket: args.admin_socket(),
            serving_threads: args.serving_threads.into(),
            ..defaults::server()
        };
        Ok(Self {
            listen: args.listen,
            store,
            policies: file.policies,
            server,
            durability_replicas: args.durability_replicas,
            metrics_listen: args.metrics_listen,
            metrics_other_action_label: args.metrics_other_action_label.clone(),
            console_listen: args.console_listen,
            signing,
            authorization: file.authorization,
            notifications,
            notices,
        })
    }
}

/// The listener's TLS settings and the secure-by-default check: a gate whose agents call without
/// a credential (no agent principal) is open, as one without principals is.
fn listener_tls(
    args: &ServeArgs,
    agents_identified: bool,
    notices: &mut Vec<Notice>,
    principals: &oncegate_grpc::auth::Principals,
) -> Result<Option<tls::TlsSettings>, ConfigError> {
    let settings = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(
            tls::load(cert, key, args.tls_client_ca.as_deref(), !agents_identified)
                .map_err(ConfigError::Tls)?,
        ),
        _ => None,
    };
    match tls::judge_listener(
        &args.listen,
        agents_identified,
        settings.as_ref(),
        args.insecure,
    ) {
        Exposure::Fine => {}
        Exposure::Warn(message) => notices.push(Notice::Warn(message)),
        Exposure::Refuse(message) => return Err(ConfigError::Invalid(message)),
    }
    if principals.is_empty() {
        notices.push(Notice::Info(
            "no principals configured: every caller may act for every agent".into(),
        ));
    } else if !agents_identified {
        notices.push(Notice::Info(format!(
            "{} principal(s) configured, none with the agent role: agents call without a \
             credential (anonymous, for every agent); name agent principals to require keys",
            principals.len()
        )));
    }
    Ok(settings)
}

/// How the gate signs: the key file when given; else a key generated into the embedded store's
/// data directory; on Redis without a key file, not at all (a key per replica would not verify
/// across replicas), with a warning.
fn signing_config(
    args: &ServeArgs,
    store: &StoreConfig,
    notices: &mut Vec<Notice>,
) -> Option<SigningConfig> {
    let active = match (&args.signing_key, store) {
        _ if args.unsigned => {
            notices.push(Notice::Warn(
                "--unsigned: grants carry no signed statement and completions no receipt chain"
                    .into(),
            ));
            return None;
        }
        (Some(path), _) => keys::ActiveKey::File(path.clone()),
        (None, StoreConfig::Embedded { data_dir, .. }) => {
            keys::ActiveKey::Generated(data_dir.join(keys::GENERATED_KEY_FILE))
        }
        (None, StoreConfig::Redis { .. } | StoreConfig::Postgres { .. }) => {
            notices.push(Notice::Warn(
                "no --signing-key on a shared store (Redis, PostgreSQL): serving UNSIGNED (no \
                 grant statements, no receipt chains); give every replica the same key file to \
                 sign"
                    .into(),
            ));
            return None;
        }
    };
    Some(SigningConfig {
        issuer: args.signing_issuer.clone(),
        active,
        retired: args.retired_signing_keys.clone(),
    })
}

/// The store the flags name, with the durability level checked against it.
fn store_config(args: &ServeArgs, policies: &Policies) -> Result<StoreConfig, ConfigError> {
    let call_timeout = Duration::from_millis(args.store_timeout_ms);
    let topology = args.redis_topology().map_err(ConfigError::Invalid)?;
    if let Some(url) = &args.postgres_url {
        return Ok(StoreConfig::Postgres {
            url: url.clone(),
            options: PostgresOptions {
                pool_size: usize::try_from(args.postgres_pool_size).unwrap_or(usize::MAX),
                call_timeout,
                durability_replicas: args.durability_replicas,
                purge_interval: Some(defaults::POSTGRES_PURGE_INTERVAL),
            },
        });
    }
    let Some(topology) = topology else {
        if policies.highest_durability() > 0 {
            return Err(ConfigError::Invalid(
                "a policy sets durability_replicas, which needs Redis with replicas".into(),
            ));
        }
        return Ok(StoreConfig::Embedded {
            data_dir: args.data_dir.clone(),
            call_timeout,
            cache_bytes: args.embedded_cache_mb << 20,
        });
    };
    let mut options = RedisOptions {
        call_timeout,
        durability_replicas: args.durability_replicas,
        durability_timeout: Duration::from_millis(args.durability_timeout_ms),
        sentinel_check_interval: Duration::from_millis(args.redis_sentinel_check_ms),
        username: args.redis_username.clone(),
        password: args.redis_password.clone(),
        allow_eviction: args.allow_redis_eviction,
        ..defaults::redis()
    };
    if args.durability_replicas == 0 && policies.highest_durability() == 0 {
        // Nothing ever waits for replicas: no connections reserved for WAIT.
        options.wait_lanes = 0;
    }
    Ok(StoreConfig::Redis { topology, options })
}
