//! The upstream MCP server: a child process speaking stdio (`--upstream-command`) or a server
//! over Streamable HTTP (`--upstream-url`), one connection per downstream session, initialized
//! with the downstream client's own `initialize` parameters. What the upstream sends on its own
//! (sampling, elicitation and roots requests, notifications) goes to the downstream peer
//! unchanged, except that progress tokens are mapped back to the downstream's. Owns the
//! connection; decides nothing about tools.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use rmcp::{
    ErrorData as McpError, RoleClient, RoleServer, ServiceExt,
    model::{ClientConfig, ClientResult, ProgressToken, ServerNotification, ServerRequest},
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

/// Upstream progress tokens → the downstream's, for the calls in flight.
pub type ProgressMap = Arc<Mutex<HashMap<ProgressToken, ProgressToken>>>;

/// A live upstream connection.
pub type Connection = RunningService<RoleClient, Relay>;

/// The gateway's client side: relays what the upstream sends to the downstream peer.
pub struct Relay {
    info: ClientConfig,
    downstream: Peer<RoleServer>,
    progress: ProgressMap,
    on_tools_changed: Box<dyn Fn() + Send + Sync>,
}

impl Relay {
    /// A relay presenting `info` (the downstream client's initialize parameters) upstream.
    pub fn new(
        info: ClientConfig,
        downstream: Peer<RoleServer>,
        progress: ProgressMap,
        on_tools_changed: impl Fn() + Send + Sync + 'static,
    ) -> Self {
        Self {
            info,
            downstream,
            progress,
            on_tools_changed: Box::new(on_tools_changed),
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
            request => self
                .downstream
                .send_request(request)
                .await
                .map_err(downstream_error),
        }
    }

    async fn handle_notification(
        &self,
        notification: ServerNotification,
        _context: NotificationContext<RoleClient>,
    ) -> Result<(), McpError> {
        let notification = match notification {
            ServerNotification::ProgressNotification(mut progress) => {
                let mapped = self
                    .progress
                    .lock()
                    .map(|map| map.get(&progress.params.progress_token).cloned())
                    .unwrap_or_default();
                match mapped {
                    Some(token) => progress.params.progress_token = token,
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
        if let Err(e) = self.downstream.send_notification(notification).await {
            tracing::debug!(error = %e, "could not relay an upstream notification");
        }
        Ok(())
    }

    fn get_info(&self) -> ClientConfig {
        self.info.clone()
    }
}

/// Connects to the upstream and runs the initialize handshake with the relay's client info.
pub async fn connect(target: &Target, relay: Relay) -> Result<Connection, String> {
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
                .serve(transport)
                .await
                .map_err(|e| format!("upstream {program:?} did not initialize: {e}"))
        }
        Target::Url(url) => relay
            .serve(StreamableHttpClientTransport::from_uri(url.as_str()))
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
