//! What `oncegate call` and `oncegate admin` share: the connection flags (accepted before or after
//! the subcommand), the channel with the API key on every call, the flags that name an action or
//! carry a receipt, and how a failed call is reported (its reason, metadata and cause chain) with
//! its exit code.
//!
//! Owns no RPC and no rendering of answers ([`super::views`]). The API key is sent as
//! `authorization: Bearer <key>` and never printed.

use std::{error::Error as _, path::PathBuf, process::ExitCode, time::Duration};

use clap::{Args, ValueEnum};
use serde_json::{Map, Value, json};
use tonic::{
    Request, Status,
    metadata::{Ascii, MetadataValue},
    service::{Interceptor, interceptor::InterceptedService},
    transport::Channel,
};
use tonic_types::StatusExt;

use oncegate_client::channel::{self, Access, ConnectError};
use oncegate_config::{
    ADMIN_TARGET_ENV, TARGET_ENV, address_from_env, defaults,
    exit::{UNAVAILABLE as EX_UNAVAILABLE, USAGE as EX_USAGE},
};
use oncegate_observe::metrics::code_name;
use oncegate_proto::{
    self as pb, action_gate_service_client::ActionGateServiceClient,
    gate_admin_service_client::GateAdminServiceClient,
};

/// The exit code of a call the gate refused (any status but UNAVAILABLE).
pub const EX_REFUSED: u8 = 1;

const CONNECTION: &str = "Connection (before or after the subcommand)";

/// How to reach the gate, and how to print: the global options of `oncegate call` and
/// `oncegate admin`, accepted anywhere on the command line (`admin get ... --json`).
#[derive(Debug, Clone, Args)]
pub struct RemoteArgs {
    /// The gate's address: host:port or http://host:port (plaintext), https://host:port (TLS,
    /// with --ca), or unix:<path> (a gate's admin socket). Default: `oncegate admin` uses
    /// unix:<data-dir>/admin.sock when that socket exists (the gate's machine: its user is the
    /// operator), else http://127.0.0.1:50051. From the environment: ONCEGATE_TARGET for
    /// `oncegate call`, ONCEGATE_ADMIN_TARGET for `oncegate admin` (ONCEGATE_SERVER, their earlier
    /// name, is still read, with a warning).
    #[arg(long, global = true, help_heading = CONNECTION)]
    pub server: Option<String>,

    /// The data directory of a gate on this machine, where `oncegate admin` looks for its admin
    /// socket when --server is not given.
    #[arg(long, global = true, env = "ONCEGATE_DATA_DIR", default_value = defaults::DATA_DIR,
          help_heading = CONNECTION)]
    pub data_dir: PathBuf,

    /// The admin socket of a gate on this machine, where `oncegate admin` looks when no address
    /// is given (default: <data-dir>/admin.sock; `oncegate serve --admin-socket` moves it).
    #[arg(long, global = true, env = "ONCEGATE_ADMIN_SOCKET", help_heading = CONNECTION)]
    pub admin_socket: Option<PathBuf>,

    /// The API key, sent as `authorization: Bearer <key>`.
    #[arg(long, global = true, env = "ONCEGATE_API_KEY", hide_env_values = true,
          help_heading = CONNECTION)]
    pub api_key: Option<String>,

    /// PEM file of the CA that signed the gate's certificate (enables TLS).
    #[arg(long, global = true, env = "ONCEGATE_CA", help_heading = CONNECTION)]
    pub ca: Option<PathBuf>,

    /// PEM file of the client certificate, for mutual TLS (with --client-key).
    #[arg(long, global = true, env = "ONCEGATE_CLIENT_CERT", help_heading = CONNECTION)]
    pub cert: Option<PathBuf>,

    /// PEM file of the client certificate's private key, for mutual TLS (with --cert). Before the
    /// subcommand it may also be given as --key (after it, --key names the action).
    #[arg(long, global = true, env = "ONCEGATE_CLIENT_KEY", help_heading = CONNECTION)]
    pub client_key: Option<PathBuf>,

    /// The earlier name of --client-key, before the subcommand only.
    #[arg(long = "key", hide = true, conflicts_with = "client_key")]
    pub key_before_subcommand: Option<PathBuf>,

    /// The server name to verify in the gate's certificate (default: the host of the URL).
    #[arg(long, global = true, env = "ONCEGATE_TLS_DOMAIN", help_heading = CONNECTION)]
    pub tls_domain: Option<String>,

    /// Print one JSON document (on standard output, errors too) instead of text.
    #[arg(long, global = true, help_heading = CONNECTION)]
    pub json: bool,

    /// Deadline of the connection and of the call, in seconds.
    #[arg(long, global = true, default_value_t = 10, help_heading = CONNECTION)]
    pub timeout_seconds: u64,
}

/// Puts the API key and the deadline on every call.
#[derive(Clone)]
pub struct CallCredentials {
    auth: Option<MetadataValue<Ascii>>,
    timeout: Duration,
}

impl Interceptor for CallCredentials {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = &self.auth {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        request.set_timeout(self.timeout);
        Ok(request)
    }
}

/// A channel to the gate, with credentials.
pub type Authed = InterceptedService<Channel, CallCredentials>;

/// A connected gate: both services over one channel.
pub struct Remote {
    /// The worker API.
    pub gate: ActionGateServiceClient<Authed>,
    /// The operator API.
    pub admin: GateAdminServiceClient<Authed>,
    /// Over the admin socket: the caller is the gate's local operator.
    pub local_operator: bool,
    /// Calls carry an API key.
    pub keyed: bool,
}

/// The address a command calls, and the admin socket it looked for first and did not find (when
/// no address was given).
pub struct Target {
    /// The address, in any of its forms.
    pub address: String,
    /// The admin socket looked for (an absolute path) that does not exist.
    pub socket_absent: Option<PathBuf>,
}

/// A command that could not run, with its exit code and message.
pub struct Stop {
    code: u8,
    message: String,
}

impl Stop {
    /// Bad flags (exit 64).
    pub fn usage(message: impl Into<String>) -> Self {
        Self {
            code: EX_USAGE,
            message: message.into(),
        }
    }

    /// Prints the message (`<tool>: ...` on standard error, or a JSON document) and exits.
    pub fn exit(self, tool: &str, json: bool) -> ExitCode {
        if json {
            println!(
                "{:#}",
                json!({"error": {"code": if self.code == EX_USAGE { "USAGE" } else { "UNAVAILABLE" },
                                 "message": self.message}})
            );
        } else {
            eprintln!("{tool}: {}", self.message);
        }
        ExitCode::from(self.code)
    }
}

impl RemoteArgs {
    /// The gate to call: --server, else the environment's address (the operator's for the
    /// operator's commands, `admin_socket`; else the worker's), else (for the operator's commands)
    /// the admin socket (--admin-socket, else in --data-dir) when it exists, else the local
    /// default.
    pub fn target(&self, admin_socket: bool) -> Target {
        let given = |address: String| Target {
            address,
            socket_absent: None,
        };
        if let Some(server) = &self.server {
            return given(server.clone());
        }
        let name = if admin_socket {
            ADMIN_TARGET_ENV
        } else {
            TARGET_ENV
        };
        if let Some(server) = address_from_env(name, &["ONCEGATE_SERVER"]) {
            return given(server);
        }
        if !admin_socket {
            return given(defaults::ADMIN_SERVER.to_owned());
        }
        let socket = self
            .admin_socket
            .clone()
            .unwrap_or_else(|| self.data_dir.join(defaults::ADMIN_SOCKET));
        if socket.exists() {
            return given(format!("unix:{}", socket.display()));
        }
        Target {
            address: defaults::ADMIN_SERVER.to_owned(),
            socket_absent: Some(std::path::absolute(&socket).unwrap_or(socket)),
        }
    }

    /// Connects to the gate ([`Self::target`]); the failure names its cause (connection
    /// refused, TLS, DNS...) and, when no address was given, where it looked and how to point it.
    pub async fn connect(&self, admin_socket: bool) -> Result<Remote, Stop> {
        let timeout = Duration::from_secs(self.timeout_seconds.max(1));
        let access = self.access()?;
        let target = self.target(admin_socket);
        let channel = channel::connect(&target.address, &access, timeout)
            .await
            .map_err(|e| match e {
                ConnectError::Settings(_) => Stop::usage(e.to_string()),
                ConnectError::Unreachable(why) => Stop {
                    code: EX_UNAVAILABLE,
                    message: match &target.socket_absent {
                        Some(socket) => format!(
                            "no admin socket at {} and {why}. On the gate's machine give \
                             --data-dir (the gate's data directory) or --admin-socket; from \
                             elsewhere --server (or {ADMIN_TARGET_ENV}) with an operator's \
                             --api-key",
                            socket.display()
                        ),
                        None => why,
                    },
                },
            })?;
        let auth = match &self.api_key {
            Some(key) => {
                let mut value = MetadataValue::try_from(format!("Bearer {key}")).map_err(|_| {
                    Stop::usage("the API key holds characters a header cannot carry")
                })?;
                value.set_sensitive(true);
                Some(value)
            }
            None => None,
        };
        let credentials = CallCredentials { auth, timeout };
        Ok(Remote {
            gate: ActionGateServiceClient::with_interceptor(channel.clone(), credentials.clone()),
            admin: GateAdminServiceClient::with_interceptor(channel, credentials),
            local_operator: channel::is_unix(&target.address),
            keyed: self.api_key.is_some(),
        })
    }

    fn access(&self) -> Result<Access, Stop> {
        let key = self
            .client_key
            .clone()
            .or_else(|| self.key_before_subcommand.clone());
        if self.cert.is_some() != key.is_some() {
            return Err(Stop::usage("mutual TLS needs both --cert and --client-key"));
        }
        Ok(Access {
            ca: self.ca.clone(),
            cert: self.cert.clone(),
            key,
            tls_domain: self.tls_domain.clone(),
        })
    }
}

/// Names one action.
#[derive(Debug, Clone, Args)]
pub struct ActionArgs {
    /// The agent id.
    #[arg(long)]
    pub agent: String,
    /// The run id.
    #[arg(long)]
    pub run: String,
    /// The action's key: its idempotency key, or its fingerprint when it has none (as printed by
    /// `call request-token`, or computed by `oncegate fingerprint`).
    #[arg(long)]
    pub key: String,
}

impl ActionArgs {
    /// The action on the wire.
    pub fn to_ref(&self) -> pb::ActionRef {
        pb::ActionRef {
            scope: Some(pb::Scope {
                agent_id: self.agent.clone(),
                run_id: self.run.clone(),
            }),
            key: self.key.clone(),
        }
    }
}

/// A receipt, as text or from a file, and what it is.
#[derive(Debug, Clone, Args)]
pub struct ReceiptArgs {
    /// The receipt as text (e.g. the provider's transaction id, or JSON).
    #[arg(long, conflicts_with = "receipt_file")]
    pub receipt: Option<String>,
    /// A file holding the receipt (bytes).
    #[arg(long)]
    pub receipt_file: Option<PathBuf>,
    /// What an operator's receipt is, so that every client replays it: json (replayed as the
    /// value) or text (replayed as text). Default: json when it parses as JSON, else text.
    #[arg(long, value_enum)]
    pub receipt_format: Option<ReceiptFormatArg>,
}

/// `--receipt-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReceiptFormatArg {
    Json,
    Text,
}

impl ReceiptArgs {
    /// The operator receipt's format: as given, or json when `receipt` parses as JSON, else text.
    pub fn format(&self, receipt: &[u8]) -> pb::ReceiptFormat {
        match self.receipt_format {
            Some(ReceiptFormatArg::Json) => pb::ReceiptFormat::Json,
            Some(ReceiptFormatArg::Text) => pb::ReceiptFormat::Text,
            None if serde_json::from_slice::<Value>(receipt).is_ok() => pb::ReceiptFormat::Json,
            None => pb::ReceiptFormat::Text,
        }
    }

    /// The receipt's bytes (empty when neither is given).
    pub fn bytes(&self) -> Result<Vec<u8>, Stop> {
        match (&self.receipt, &self.receipt_file) {
            (Some(text), _) => Ok(text.clone().into_bytes()),
            (None, Some(path)) => std::fs::read(path)
                .map_err(|e| Stop::usage(format!("--receipt-file {}: {e}", path.display()))),
            (None, None) => Ok(Vec::new()),
        }
    }
}

/// Prints a refused or failed call and returns its exit code: 69 when the gate (or its store) was
/// unavailable, 1 otherwise. `flags` maps the request's field names, as the gate's message names
/// them, to this command's flags (`params_json` → `--params`).
pub fn refused(tool: &str, json: bool, status: &Status, flags: &[(&str, &str)]) -> ExitCode {
    let details = status.get_error_details();
    let info = details.error_info();
    let reason = info.map(|i| i.reason.clone()).unwrap_or_default();
    let metadata: Map<String, Value> = info
        .map(|i| {
            let mut pairs: Vec<_> = i.metadata.iter().collect();
            pairs.sort();
            pairs
                .into_iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect()
        })
        .unwrap_or_default();
    let message = with_flags(&with_cause(status), flags);
    let code = code_name(status.code());
    if json {
        let mut error = json!({"code": code, "reason": reason, "message": message,
                               "metadata": metadata});
        if let Some(delay) = details.retry_info().and_then(|r| r.retry_delay) {
            error["retry_after_ms"] = json!(delay.as_millis() as u64);
        }
        println!("{:#}", json!({ "error": error }));
    } else {
        let label = if reason.is_empty() {
            code.to_owned()
        } else {
            format!("{reason} ({code})")
        };
        let mut out = format!("{tool}: {label}: {message}\n");
        let width = metadata.keys().map(String::len).max().unwrap_or(0);
        for (k, v) in &metadata {
            out.push_str(&format!(
                "  {k:<width$}  {}\n",
                v.as_str().unwrap_or_default()
            ));
        }
        eprint!("{out}");
    }
    ExitCode::from(if status.code() == tonic::Code::Unavailable {
        EX_UNAVAILABLE
    } else {
        EX_REFUSED
    })
}

/// The status message followed by its cause chain (a transport error's "connection refused").
fn with_cause(status: &Status) -> String {
    channel::with_causes(status.message().to_owned(), status.source())
}

/// `message` with each request field name (a whole word: `ttl`, never inside `settled`) replaced
/// by the flag that sets it.
fn with_flags(message: &str, flags: &[(&str, &str)]) -> String {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(start) = rest.find(|c: char| word(c)) {
        out.push_str(&rest[..start]);
        let end = rest[start..]
            .find(|c: char| !word(c))
            .map_or(rest.len(), |n| start + n);
        let token = &rest[start..end];
        match flags.iter().find(|(field, _)| *field == token) {
            Some((_, flag)) => out.push_str(flag),
            None => out.push_str(token),
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::with_flags;

    #[test]
    fn field_names_become_flags_as_whole_words_only() {
        let flags = [("params_json", "--params"), ("ttl", "--ttl-seconds")];
        assert_eq!(
            with_flags(
                "give action_name and params_json; ttl is settled (ttl)",
                &flags
            ),
            "give action_name and --params; --ttl-seconds is settled (--ttl-seconds)"
        );
    }
}
