//! TLS for the gRPC listener (rustls through tonic) and the identities of a client certificate.
//!
//! Owns: reading the PEM files of `--tls-cert`, `--tls-key`, `--tls-client-ca` and checking them
//! once at start-up; what a certificate's identities are (subject CNs and DNS, URI and e-mail
//! SANs). Does not own: deciding who a caller is ([`super::auth`]).

use std::{path::Path, time::Duration};

use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

/// How long a client may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The listener's TLS settings, checked.
#[derive(Debug, Clone)]
pub struct TlsSettings {
    /// What tonic serves with.
    pub config: ServerTlsConfig,
    /// True with a client CA: client certificates are verified against it.
    pub mutual: bool,
}

/// Why the listener's TLS settings cannot be used; the cause stays the source.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file named by `flag` cannot be read.
    #[error("{flag} {}: {source}", path.display())]
    Read {
        flag: &'static str,
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The certificate, key or client CA does not make a TLS configuration.
    #[error("TLS configuration: {0}")]
    Config(#[source] tonic::transport::Error),
}

/// Builds the listener's TLS settings from PEM text. With a client CA, a client certificate is
/// verified against it when presented, and required when `require_client_cert` (a gate without
/// principals relies on the certificate alone); otherwise callers without one must send an API key.
pub fn settings(
    cert_pem: &[u8],
    key_pem: &[u8],
    client_ca_pem: Option<&[u8]>,
    require_client_cert: bool,
) -> Result<TlsSettings, TlsError> {
    let mut config = ServerTlsConfig::new()
        .identity(Identity::from_pem(cert_pem, key_pem))
        .timeout(HANDSHAKE_TIMEOUT);
    if let Some(ca) = client_ca_pem {
        config = config
            .client_ca_root(Certificate::from_pem(ca))
            .client_auth_optional(!require_client_cert);
    }
    // tonic reads the PEM only when the server is built: do it now, so bad files fail start-up.
    Server::builder()
        .tls_config(config.clone())
        .map_err(TlsError::Config)?;
    Ok(TlsSettings {
        config,
        mutual: client_ca_pem.is_some(),
    })
}

/// Reads the PEM files and builds the settings (see [`settings`]).
pub fn load(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
    require_client_cert: bool,
) -> Result<TlsSettings, TlsError> {
    let read = |flag: &'static str, path: &Path| {
        std::fs::read(path).map_err(|source| TlsError::Read {
            flag,
            path: path.to_owned(),
            source,
        })
    };
    let cert = read("--tls-cert", cert)?;
    let key = read("--tls-key", key)?;
    let ca = client_ca.map(|p| read("--tls-client-ca", p)).transpose()?;
    settings(&cert, &key, ca.as_deref(), require_client_cert)
}

/// The identities of a (verified) certificate: its subject common names, then its DNS, URI and
/// e-mail subject alternative names. Empty when the DER does not parse.
pub fn identities(der: &[u8]) -> Vec<String> {
    let Ok((_, cert)) = X509Certificate::from_der(der) else {
        return Vec::new();
    };
    let mut out: Vec<String> = cert
        .subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok().map(str::to_owned))
        .collect();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(s) | GeneralName::URI(s) | GeneralName::RFC822Name(s) => {
                    out.push((*s).to_owned())
                }
                _ => {}
            }
        }
    }
    out
}

/// What start-up makes of a listener's exposure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exposure {
    /// Nothing to say.
    Fine,
    /// Start, with this warning.
    Warn(String),
    /// Refuse to start (exit 64), for this reason.
    Refuse(String),
}

/// Secure by default: a gate without principals is open, so it may listen only on loopback,
/// unless mutual TLS admits only holders of a client certificate or the operator said
/// `--insecure`. Principals without TLS are allowed with a warning (API keys in clear text; a
/// TLS-terminating proxy or mesh in front may be the answer).
pub fn judge_listener(
    listen: &std::net::SocketAddr,
    principals: bool,
    tls: Option<&TlsSettings>,
    insecure: bool,
) -> Exposure {
    if listen.ip().is_loopback() {
        return Exposure::Fine;
    }
    match (principals, tls) {
        (true, Some(_)) => Exposure::Fine,
        (true, None) => Exposure::Warn(format!(
            "serving {listen} without TLS: API keys and tokens cross the network in clear text; \
             use --tls-cert/--tls-key or terminate TLS in front of the gate"
        )),
        (false, Some(t)) if t.mutual => Exposure::Fine,
        (false, _) if insecure => Exposure::Warn(format!(
            "INSECURE: no principals are configured and {listen} is not loopback: anyone who can \
             reach it can spend, complete, release and resolve every agent's actions (--insecure)"
        )),
        (false, _) => Exposure::Refuse(format!(
            "refusing to serve {listen} with no principals configured: anyone who could reach it \
             could act for every agent. Configure [[principals]] in --config, or mutual TLS \
             (--tls-client-ca), or listen on loopback, or pass --insecure to accept the risk"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_may_be_open() {
        let lo: std::net::SocketAddr = "127.0.0.1:1".parse().unwrap();
        let lo6: std::net::SocketAddr = "[::1]:1".parse().unwrap();
        let any: std::net::SocketAddr = "0.0.0.0:1".parse().unwrap();
        assert_eq!(judge_listener(&lo, false, None, false), Exposure::Fine);
        assert_eq!(judge_listener(&lo6, false, None, false), Exposure::Fine);
        assert!(matches!(
            judge_listener(&any, false, None, false),
            Exposure::Refuse(_)
        ));
        assert!(
            matches!(judge_listener(&any, false, None, true), Exposure::Warn(m) if m.starts_with("INSECURE"))
        );
        assert!(matches!(
            judge_listener(&any, true, None, false),
            Exposure::Warn(_)
        ));
    }
}
