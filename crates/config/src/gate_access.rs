//! The flags that say how to reach a gate over gRPC (`oncegate call`, `oncegate admin`, `oncegate
//! mcp --gate`): the API key and TLS files, and the channel they open, with the exit code a
//! failure means, and the two environment variables that name a gate ([`TARGET_ENV`],
//! [`ADMIN_TARGET_ENV`]) with the earlier names still read. The channel itself is the client
//! crate's ([`oncegate_client::channel`]).

use std::{path::PathBuf, time::Duration};

use clap::Args;
use oncegate_client::channel::{self, Access, ConnectError};
use tonic::transport::Channel;

use crate::exit;

/// The worker's gate address (`oncegate call`, `oncegate mcp --gate`, the clients, the examples).
pub const TARGET_ENV: &str = "ONCEGATE_TARGET";

/// The operator's gate address (`oncegate admin`, the resolvers): often the admin socket.
pub const ADMIN_TARGET_ENV: &str = "ONCEGATE_ADMIN_TARGET";

/// A gate address from the environment: `name`'s value, else that of the first of `old` (earlier
/// names) that is set, with one line on standard error naming `name`. Empty values count as unset.
pub fn address_from_env(name: &str, old: &[&str]) -> Option<String> {
    let read = |var: &str| std::env::var(var).ok().filter(|v| !v.trim().is_empty());
    if let Some(value) = read(name) {
        return Some(value);
    }
    old.iter().find_map(|var| {
        let value = read(var)?;
        eprintln!("oncegate: {var} is deprecated: set {name} instead");
        Some(value)
    })
}

/// How to reach a gate: credentials and TLS.
#[derive(Debug, Clone, Args)]
pub struct GateAccess {
    /// The API key, sent as `authorization: Bearer <key>`.
    #[arg(long, env = "ONCEGATE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,

    /// PEM file of the CA that signed the gate's certificate (enables TLS).
    #[arg(long, env = "ONCEGATE_CA")]
    pub ca: Option<PathBuf>,

    /// PEM file of the client certificate, for mutual TLS (with --key).
    #[arg(long, env = "ONCEGATE_CLIENT_CERT", requires = "key")]
    pub cert: Option<PathBuf>,

    /// PEM file of the client certificate's private key, for mutual TLS (with --cert).
    #[arg(long, env = "ONCEGATE_CLIENT_KEY", requires = "cert")]
    pub key: Option<PathBuf>,

    /// The server name to verify in the gate's certificate (default: the host of the URL).
    #[arg(long, env = "ONCEGATE_TLS_DOMAIN")]
    pub tls_domain: Option<String>,
}

impl GateAccess {
    /// The TLS settings, as the client crate takes them.
    pub fn access(&self) -> Access {
        Access {
            ca: self.ca.clone(),
            cert: self.cert.clone(),
            key: self.key.clone(),
            tls_domain: self.tls_domain.clone(),
        }
    }

    /// Opens a channel to the gate at `url`. On failure, the exit code (64: bad settings, 69:
    /// unreachable) and a message naming the setting or the cause.
    pub async fn connect(&self, url: &str, timeout: Duration) -> Result<Channel, (u8, String)> {
        channel::connect(url, &self.access(), timeout)
            .await
            .map_err(exit_code)
    }

    /// A channel that connects on first use (see [`channel::connect_lazy`]); only bad settings
    /// fail here (exit code 64).
    pub fn connect_lazy(&self, url: &str, timeout: Duration) -> Result<Channel, (u8, String)> {
        channel::connect_lazy(url, &self.access(), timeout).map_err(exit_code)
    }
}

fn exit_code(e: ConnectError) -> (u8, String) {
    let code = match e {
        ConnectError::Settings(_) => exit::USAGE,
        ConnectError::Unreachable(_) => exit::UNAVAILABLE,
    };
    (code, e.to_string())
}
