//! A gate's address as every client and the CLI take it, read in one place: `host:port` and
//! `http://host:port` (plaintext HTTP/2), `https://host:port` (TLS), `unix:<path>` (a gate's
//! admin socket on this machine). Anything else is refused with the forms it could have been, in
//! one sentence.
//!
//! Owns the parsing only; the connection is [`crate::channel`]'s.

use std::{fmt, path::PathBuf, str::FromStr};

/// The forms an address may take, as every refusal names them.
pub const FORMS: &str = "host:port, http://host:port, https://host:port (TLS) or unix:<path> \
                         (a gate's admin socket)";

/// Where a gate listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// `host:port` or `http://host:port`: HTTP/2 over TCP (TLS only when the caller gives TLS
    /// files to a bare `host:port`).
    Tcp {
        /// `host:port` (`[v6]:port` for an IPv6 literal).
        authority: String,
        /// Written `http://`: plaintext, whatever TLS files are given.
        plain: bool,
    },
    /// `https://host:port`: HTTP/2 over TLS.
    Tls {
        /// `host:port`.
        authority: String,
    },
    /// `unix:<path>` (or `unix://<absolute path>`): a Unix socket, the gate's admin socket.
    Unix(PathBuf),
}

/// An address in none of the [`FORMS`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{given:?} is not a gate address: give {FORMS}")]
pub struct AddressError {
    /// The address as given.
    pub given: String,
}

impl FromStr for Address {
    type Err = AddressError;

    fn from_str(given: &str) -> Result<Self, Self::Err> {
        let refuse = || AddressError {
            given: given.to_owned(),
        };
        let text = given.trim();
        if let Some(path) = text.strip_prefix("unix://").or(text.strip_prefix("unix:")) {
            return match path.is_empty() {
                true => Err(refuse()),
                false => Ok(Self::Unix(PathBuf::from(path))),
            };
        }
        let (scheme, rest) = match text.split_once("://") {
            Some((scheme, rest)) => (Some(scheme.to_ascii_lowercase()), rest),
            None => (None, text),
        };
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if !is_host_port(authority) {
            return Err(refuse());
        }
        let authority = authority.to_owned();
        match scheme.as_deref() {
            None => Ok(Self::Tcp {
                authority,
                plain: false,
            }),
            Some("http") => Ok(Self::Tcp {
                authority,
                plain: true,
            }),
            Some("https") => Ok(Self::Tls { authority }),
            Some(_) => Err(refuse()),
        }
    }
}

impl fmt::Display for Address {
    /// The address in its URL form: `http://host:port`, `https://host:port`, `unix:<path>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tcp { authority, .. } => write!(f, "http://{authority}"),
            Self::Tls { authority } => write!(f, "https://{authority}"),
            Self::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// `host:port` with a non-empty host (a name, an IPv4 address, or `[v6]`) and a decimal port.
fn is_host_port(text: &str) -> bool {
    let Some((host, port)) = text.rsplit_once(':') else {
        return false;
    };
    let host_ok = if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        !v6.is_empty()
            && v6
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
    } else {
        !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_')
    };
    host_ok && !port.is_empty() && port.len() <= 5 && port.parse::<u16>().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(authority: &str, plain: bool) -> Address {
        Address::Tcp {
            authority: authority.into(),
            plain,
        }
    }

    #[test]
    fn every_form_reads() {
        let cases = [
            ("127.0.0.1:50051", tcp("127.0.0.1:50051", false)),
            ("http://127.0.0.1:50051", tcp("127.0.0.1:50051", true)),
            ("HTTP://gate.example:8443/", tcp("gate.example:8443", true)),
            ("[::1]:50051", tcp("[::1]:50051", false)),
            (
                "https://gate.example:443",
                Address::Tls {
                    authority: "gate.example:443".into(),
                },
            ),
            (
                "unix:/var/lib/oncegate/admin.sock",
                Address::Unix("/var/lib/oncegate/admin.sock".into()),
            ),
            (
                "unix:oncegate-data/admin.sock",
                Address::Unix("oncegate-data/admin.sock".into()),
            ),
            ("unix:///tmp/a.sock", Address::Unix("/tmp/a.sock".into())),
        ];
        for (given, want) in cases {
            assert_eq!(given.parse::<Address>(), Ok(want), "{given}");
        }
    }

    #[test]
    fn other_forms_are_refused_with_the_forms_wanted() {
        for given in [
            "",
            "localhost",
            "http://localhost",
            "grpc://h:1",
            "dns:///h:1",
            "h:port",
            "h:70000",
            "http://h:1/path",
            "unix:",
        ] {
            let err = given.parse::<Address>().unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("{given:?} is not a gate address: give {FORMS}")
            );
        }
    }

    #[test]
    fn displays_as_a_url() {
        let shown = |s: &str| s.parse::<Address>().unwrap().to_string();
        assert_eq!(shown("127.0.0.1:1"), "http://127.0.0.1:1");
        assert_eq!(shown("https://h:2"), "https://h:2");
        assert_eq!(shown("unix:///a/b"), "unix:/a/b");
    }
}
