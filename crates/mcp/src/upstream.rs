//! The upstream MCP server: a child process speaking stdio (`--upstream-command`) or a server
//! over Streamable HTTP (`--upstream-url`). A downstream session (a client that began with
//! `initialize`) gets a connection of its own, initialized with the client's own `initialize`
//! parameters, or, when the upstream refuses the handshake (it speaks only the stateless
//! 2026-07-28 revision), opened with `server/discover`. The stateless downstream requests share
//! one connection, opened with `server/discover` and falling back to `initialize` for an upstream
//! that predates it ([`Lifecycle`]). What the upstream sends on its own (sampling, elicitation and
//! roots requests, notifications) goes to the session's downstream peer unchanged, except that
//! progress tokens are mapped back to the downstream's (and to the peer that asked). Owns the
//! connection; decides nothing about tools.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use rmcp::{
    ClientLifecycleMode, ClientServiceExt, ErrorData as McpError, RoleClient, RoleServer,
    model::{
        ClientCapabilities, ClientConfig, ClientResult, Implementation, ProgressToken,
        ProtocolVersion, RequestMetaObject, ServerNotification, ServerRequest,
    },
    service::{NotificationContext, Peer, RequestContext, RunningService, Service, ServiceError},
    transport::{StreamableHttpClientTransport, TokioChildProcess},
};

/// Where the upstream is.
#[derive(Debug, Clone)]
pub enum Target {
    /// A command line to start, speaking MCP on its stdin/stdout.
    Command(Vec<String>),
    /// A Streamable HTTP endpoint.
    Url(String),
}

/// Upstream progress tokens → the downstream's and the peer to tell, for the calls in flight.
pub type ProgressMap =
    Arc<Mutex<HashMap<ProgressToken, (ProgressToken, Option<Peer<RoleServer>>)>>>;

/// How long an upstream may take to answer `server/discover` (a child process starting
/// included) before the gateway tries the handshake instead.
const DISCOVER_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// How a connection to the upstream opens.
#[derive(Debug, Clone)]
pub enum Lifecycle {
    /// A downstream session's: `initialize` at the client's version; `server/discover` when the
    /// upstream refuses the handshake.
    Handshake,
    /// The stateless requests': `server/discover`, `initialize` for an upstream without it.
    Stateless,
}

/// The gateway as the client of the shared stateless connection (each request still carries
/// its own client's capabilities: [`capabilities_of`]).
pub fn gateway_info() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("oncegate-mcp", env!("CARGO_PKG_VERSION")),
    )
}

/// The downstream's `_meta` for the upstream: without the keys that describe the downstream's
/// protocol version and client (the gateway's connection states its own).
pub fn meta_for_upstream(meta: &RequestMetaObject) -> RequestMetaObject {
    let mut meta = meta.clone();
    meta.retain(|key, _| !key.starts_with("io.modelcontextprotocol/"));
    meta
}

/// The downstream client's capabilities from a stateless request's `_meta`, to pass on.
pub fn capabilities_of(meta: &RequestMetaObject) -> Option<RequestMetaObject> {
    let capabilities = meta.client_capabilities()?;
    let mut only = RequestMetaObject::new();
    only.set_client_capabilities(capabilities);
    Some(only)
}

/// A live upstream connection.
pub type Connection = RunningService<RoleClient, Relay>;

/// The gateway's client side: relays what the upstream sends to the downstream peer.
#[derive(Clone)]
pub struct Relay {
    info: ClientConfig,
    /// The session's client; `None` on the shared stateless connection (a 2026-07-28 client
    /// takes no requests from servers).
    downstream: Option<Peer<RoleServer>>,
    progress: ProgressMap,
    on_tools_changed: Arc<dyn Fn() + Send + Sync>,
}

impl Relay {
    /// A relay presenting `info` (the downstream client's initialize parameters) upstream.
    pub fn new(
        info: ClientConfig,
        downstream: Option<Peer<RoleServer>>,
        progress: ProgressMap,
        on_tools_changed: impl Fn() + Send + Sync + 'static,
    ) -> Self {
        Self {
            info,
            downstream,
            progress,
            on_tools_changed: Arc::new(on_tools_changed),
        }
    }
}

impl Service<RoleClient> for Relay {
    async fn handle_request(
        &self,
        request: ServerRequest,
        _context: RequestContext<RoleClient>,
    ) -> Result<ClientResult, McpError> {
        match request {
            // Liveness of the gateway's own connection: answered here.
            ServerRequest::PingRequest(_) => Ok(ClientResult::empty(())),
            request => match &self.downstream {
                Some(downstream) => downstream
                    .send_request(request)
                    .await
                    .map_err(downstream_error),
                None => Err(McpError::invalid_request(
                    "the MCP client speaks the stateless protocol revision (2026-07-28) and \
                     takes no requests from servers: ask for input in a tool result instead",
                    None,
                )),
            },
        }
    }

    async fn handle_notification(
        &self,
        notification: ServerNotification,
        _context: NotificationContext<RoleClient>,
    ) -> Result<(), McpError> {
        let mut to = self.downstream.clone();
        let notification = match notification {
            ServerNotification::ProgressNotification(mut progress) => {
                let mapped = self
                    .progress
                    .lock()
                    .map(|map| map.get(&progress.params.progress_token).cloned())
                    .unwrap_or_default();
                match mapped {
                    Some((token, peer)) => {
                        progress.params.progress_token = token;
                        to = peer.or(to);
                    }
                    // The downstream asked for no progress on this call.
                    None => return Ok(()),
                }
                ServerNotification::ProgressNotification(progress)
            }
            ServerNotification::ToolListChangedNotification(changed) => {
                (self.on_tools_changed)();
                ServerNotification::ToolListChangedNotification(changed)
            }
            other => other,
        };
        let Some(to) = to else {
            // The shared stateless connection: nobody listens beyond a request's own answer.
            return Ok(());
        };
        if let Err(e) = to.send_notification(notification).await {
            tracing::debug!(error = %e, "could not relay an upstream notification");
        }
        Ok(())
    }

    fn get_info(&self) -> ClientConfig {
        self.info.clone()
    }
}

/// Connects to the upstream as `lifecycle` says, with the relay's client info.
pub async fn connect(
    target: &Target,
    relay: Relay,
    lifecycle: Lifecycle,
) -> Result<Connection, String> {
    let newest = vec![ProtocolVersion::V_2026_07_28];
    match lifecycle {
        Lifecycle::Stateless => {
            // Not rmcp's `Auto`: it takes a slow start (a child process still loading) for an
            // upstream without `server/discover`. An upstream that has none says so (-32601).
            let mode = ClientLifecycleMode::Discover {
                preferred_versions: newest,
            };
            let discovered = tokio::time::timeout(DISCOVER_WAIT, open(target, relay.clone(), mode));
            match discovered.await {
                Ok(Ok(connection)) => Ok(connection),
                answer => {
                    let discover = match answer {
                        Ok(Err(why)) => why,
                        _ => format!("no answer to server/discover within {DISCOVER_WAIT:?}"),
                    };
                    let mut info = relay.info.clone();
                    info.protocol_version = ProtocolVersion::LATEST_WITH_INITIALIZE;
                    let relay = Relay { info, ..relay };
                    open(target, relay, ClientLifecycleMode::Initialize)
                        .await
                        .map_err(|handshake| format!("{discover}; with initialize: {handshake}"))
                }
            }
        }
        Lifecycle::Handshake => {
            match open(target, relay.clone(), ClientLifecycleMode::Initialize).await {
                Ok(connection) => Ok(connection),
                Err(handshake) => {
                    // An upstream of the stateless revision alone refuses the handshake.
                    let mode = ClientLifecycleMode::Discover {
                        preferred_versions: newest,
                    };
                    open(target, relay, mode).await.map_err(|discover| {
                        format!("{handshake}; with server/discover: {discover}")
                    })
                }
            }
        }
    }
}

async fn open(
    target: &Target,
    relay: Relay,
    mode: ClientLifecycleMode,
) -> Result<Connection, String> {
    match target {
        Target::Command(argv) => {
            let (program, args) = argv
                .split_first()
                .ok_or("--upstream-command names no program")?;
            let mut command = tokio::process::Command::new(program);
            command.args(args);
            let transport = TokioChildProcess::new(command)
                .map_err(|e| format!("cannot start {program:?}: {e}"))?;
            relay
                .serve_with_lifecycle(transport, mode)
                .await
                .map_err(|e| format!("upstream {program:?} did not initialize: {e}"))
        }
        Target::Url(url) => relay
            .serve_with_lifecycle(StreamableHttpClientTransport::from_uri(url.as_str()), mode)
            .await
            .map_err(|e| format!("upstream {url} did not initialize: {e}")),
    }
}

/// A failure to reach the downstream client, as the upstream sees it.
fn downstream_error(error: ServiceError) -> McpError {
    match error {
        ServiceError::McpError(e) => e,
        other => McpError::internal_error(format!("the MCP client did not answer: {other}"), None),
    }
}
