//! The connection to a gate over gRPC, shared by `oncegate call`, `oncegate admin` and `oncegate
//! mcp --gate`: the TLS settings ([`Access`]) and the channel they open ([`connect`]) to an
//! address as [`crate::address`] reads it, whose failure names its cause. Owns no RPC and no command-line flags (the config crate's
//! `GateAccess`).

use std::{path::PathBuf, time::Duration};

use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::address::{Address, AddressError};

/// How to reach a gate: TLS files and the server name to verify (the API key travels per call, see
/// [`crate::GateClient::with_api_key`]).
#[derive(Debug, Clone, Default)]
pub struct Access {
    /// PEM file of the CA that signed the gate's certificate (enables TLS).
    pub ca: Option<PathBuf>,
    /// PEM file of the client certificate, for mutual TLS (with `key`).
    pub cert: Option<PathBuf>,
    /// PEM file of the client certificate's private key, for mutual TLS (with `cert`).
    pub key: Option<PathBuf>,
    /// The server name to verify in the gate's certificate (default: the host of the URL).
    pub tls_domain: Option<String>,
}

/// Why a channel could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The settings are wrong (a bad URL, an unreadable PEM file, TLS without a CA).
    #[error("{0}")]
    Settings(String),
    /// The gate could not be reached; the message carries the cause chain.
    #[error("{0}")]
    Unreachable(String),
}

/// Opens a channel to the gate at `address` (any of [`address::FORMS`]). On failure, the
/// settings it found wrong (the address among them) or why the gate is unreachable, with the
/// cause chain.
pub async fn connect(
    address: &str,
    access: &Access,
    timeout: Duration,
) -> Result<Channel, ConnectError> {
    let parsed = parse(address)?;
    let unreachable = |e: tonic::transport::Error| {
        let why = with_causes(e.to_string(), std::error::Error::source(&e));
        ConnectError::Unreachable(format!("cannot reach {parsed}: {why}"))
    };
    match &parsed {
        Address::Unix(path) => unix_endpoint(timeout)
            .connect_with_connector(unix_connector(path.clone()))
            .await
            .map_err(unreachable),
        _ => endpoint(&parsed, access, timeout)?
            .connect()
            .await
            .map_err(unreachable),
    }
}

/// A channel to the gate at `address` that connects on first use and reconnects on its own, for a
/// long-running process that must start while the gate is down (each call then fails as
/// unavailable). Only bad settings fail here.
pub fn connect_lazy(
    address: &str,
    access: &Access,
    timeout: Duration,
) -> Result<Channel, ConnectError> {
    let parsed = parse(address)?;
    Ok(match &parsed {
        Address::Unix(path) => {
            unix_endpoint(timeout).connect_with_connector_lazy(unix_connector(path.clone()))
        }
        _ => endpoint(&parsed, access, timeout)?.connect_lazy(),
    })
}

/// Whether `address` names a Unix socket (`unix:<path>`): a gate's admin socket.
pub fn is_unix(address: &str) -> bool {
    matches!(address.parse(), Ok(Address::Unix(_)))
}

fn parse(address: &str) -> Result<Address, ConnectError> {
    address
        .parse()
        .map_err(|e: AddressError| ConnectError::Settings(e.to_string()))
}

/// The endpoint of a Unix socket: its URI is a placeholder, and its `:authority` `localhost`,
/// which every HTTP/2 server takes (the socket's path is no authority).
fn unix_endpoint(timeout: Duration) -> Endpoint {
    Endpoint::from_static("http://localhost").connect_timeout(timeout)
}

fn unix_connector(
    path: PathBuf,
) -> impl tower::Service<
    tonic::transport::Uri,
    Response = hyper_util::rt::TokioIo<tokio::net::UnixStream>,
    Error = std::io::Error,
    Future: Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |_: tonic::transport::Uri| {
        let path = path.clone();
        async move {
            let stream = tokio::net::UnixStream::connect(path).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
        }
    })
}

/// The TCP endpoint: TLS for `https://`, and for a bare `host:port` given TLS files; an
/// `http://` address given TLS files is refused (it says plaintext).
fn endpoint(
    address: &Address,
    access: &Access,
    timeout: Duration,
) -> Result<Endpoint, ConnectError> {
    let usage = ConnectError::Settings;
    let tls_files = access.ca.is_some() || access.cert.is_some();
    let (authority, tls) = match address {
        Address::Tcp { authority, plain } => {
            if *plain && tls_files {
                return Err(usage(format!(
                    "{address} is plaintext, yet TLS files are given: give https://{authority}"
                )));
            }
            (authority, tls_files)
        }
        Address::Tls { authority } => (authority, true),
        Address::Unix(_) => unreachable!("a Unix socket has no TCP endpoint"),
    };
    let scheme = if tls { "https" } else { "http" };
    let url = format!("{scheme}://{authority}");
    let mut endpoint = Endpoint::from_shared(url.clone())
        .map_err(|e| usage(format!("{url:?}: {e}")))?
        .connect_timeout(timeout);
    if tls {
        let read =
            |p: &PathBuf| std::fs::read(p).map_err(|e| usage(format!("{}: {e}", p.display())));
        let Some(ca) = &access.ca else {
            return Err(usage(
                "TLS needs --ca (the CA that signed the gate's certificate)".into(),
            ));
        };
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca)?));
        if let (Some(cert), Some(key)) = (&access.cert, &access.key) {
            config = config.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        if let Some(domain) = &access.tls_domain {
            config = config.domain_name(domain.clone());
        }
        endpoint = endpoint
            .tls_config(config)
            .map_err(|e| usage(format!("TLS configuration: {e}")))?;
    }
    Ok(endpoint)
}

/// `message` followed by each error of the `source` chain, joined by ": ", skipping a cause the
/// text already says: `transport error: tcp connect error: Connection refused (os error 111)`, not
/// tonic's bare `transport error`.
pub fn with_causes(
    mut message: String,
    mut source: Option<&(dyn std::error::Error + 'static)>,
) -> String {
    while let Some(cause) = source {
        let text = cause.to_string();
        if !text.is_empty() && !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}
