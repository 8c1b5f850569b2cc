//! One MCP session of the gateway: the downstream client's server. Every request is forwarded to
//! this session's upstream connection and its answer returned unchanged ([`Session::forward`]),
//! except `tools/call` ([`super::call`]). Owns the session's upstream connection (started at
//! `initialize`, restarted on demand if it died), its progress-token map and its view of the
//! upstream's tools (from the `tools/list` answers passing through).

use std::{
    borrow::Cow,
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use rmcp::{
    ErrorData as McpError, RoleServer,
    model::{
        CallToolRequest, ClientConfig, ClientRequest, ErrorCode, GetMeta, InitializeRequestParams,
        ListToolsRequest, PaginatedRequestParams, ProtocolVersion, ServerConfig, ServerResult,
    },
    service::{Peer, PeerRequestOptions, ServiceError},
};
use tokio_util::sync::CancellationToken;

use super::{
    Shared,
    upstream::{self, Connection, ProgressMap, Relay},
};

/// What the session knows of the upstream's tools: name → `readOnlyHint: true`.
type ToolView = Arc<Mutex<Option<HashMap<String, bool>>>>;

/// One MCP session (its own upstream connection).
pub struct Session {
    pub(super) shared: Arc<Shared>,
    /// This session's id: the run of calls that name none.
    pub(super) id: String,
    upstream: tokio::sync::Mutex<Option<Connection>>,
    client: Mutex<Option<(ClientConfig, Peer<RoleServer>)>>,
    server_info: Mutex<Option<ServerConfig>>,
    progress: ProgressMap,
    tools: ToolView,
}

impl Session {
    /// A new session of the gateway.
    pub fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            id: uuid::Uuid::new_v4().simple().to_string(),
            upstream: tokio::sync::Mutex::new(None),
            client: Mutex::new(None),
            server_info: Mutex::new(None),
            progress: ProgressMap::default(),
            tools: ToolView::default(),
        }
    }

    /// Connects upstream as `info`, relaying to `downstream`; returns the upstream's answer to
    /// `initialize`.
    pub(super) async fn start(
        &self,
        info: InitializeRequestParams,
        downstream: Peer<RoleServer>,
    ) -> Result<ServerConfig, McpError> {
        *self.client.lock().unwrap() = Some((info, downstream));
        let mut upstream = self.upstream.lock().await;
        let connection = self.connect().await?;
        let peer = connection.peer_info().ok_or_else(|| {
            McpError::internal_error("the upstream sent no initialize result", None)
        })?;
        // The upstream's answer as it came, for the downstream client.
        let mut answer = ServerConfig::new(peer.capabilities.clone())
            .with_protocol_version(peer.protocol_version.clone());
        if let Some(implementation) = &peer.server_info {
            answer = answer.with_server_info(implementation.clone());
        }
        answer.instructions = peer.instructions.clone();
        answer.meta = peer.meta.clone();
        *upstream = Some(connection);
        *self.server_info.lock().unwrap() = Some(answer.clone());
        Ok(answer)
    }

    async fn connect(&self) -> Result<Connection, McpError> {
        let (info, downstream) = self.client.lock().unwrap().clone().ok_or_else(|| {
            McpError::invalid_request("initialize first: the gateway has no session yet", None)
        })?;
        let tools = self.tools.clone();
        let relay = Relay::new(info, downstream, self.progress.clone(), move || {
            *tools.lock().unwrap() = None;
        });
        upstream::connect(&self.shared.target, relay)
            .await
            .map_err(|e| McpError::internal_error(e, None))
    }

    /// The upstream peer, reconnecting when the connection died (the upstream process exited).
    async fn peer(&self) -> Result<Peer<rmcp::RoleClient>, McpError> {
        let mut upstream = self.upstream.lock().await;
        if let Some(connection) = upstream.as_ref()
            && !connection.is_closed()
        {
            return Ok(connection.peer().clone());
        }
        tracing::warn!("the upstream MCP connection is closed: reconnecting");
        let connection = self.connect().await?;
        let peer = connection.peer().clone();
        *upstream = Some(connection);
        Ok(peer)
    }

    /// [`Self::forward`] for a request that is not gated: when the upstream connection turns out
    /// to be dead, once more on a new one (nothing ran).
    pub(super) async fn forward_again(
        &self,
        request: ClientRequest,
        meta: &rmcp::model::RequestMetaObject,
        ct: &CancellationToken,
    ) -> Result<ServerResult, ServiceError> {
        match self.forward(request.clone(), meta, ct, None).await {
            Err(ServiceError::TransportClosed | ServiceError::TransportSend(_)) => {
                self.forward(request, meta, ct, None).await
            }
            result => result,
        }
    }

    /// Sends a notification of the downstream client's upstream.
    pub(super) async fn notify(
        &self,
        notification: rmcp::model::ClientNotification,
    ) -> Result<(), ServiceError> {
        let peer = self.peer().await.map_err(ServiceError::McpError)?;
        peer.send_notification(notification).await
    }

    /// The upstream's `initialize` answer, once connected.
    pub(super) fn server_info(&self) -> Option<ServerConfig> {
        self.server_info.lock().unwrap().clone()
    }

    /// Sends `request` upstream with the downstream's request `_meta`, relaying progress and
    /// cancellation (`ct`), within `timeout` if given. The upstream's answer, unchanged.
    pub(super) async fn forward(
        &self,
        mut request: ClientRequest,
        meta: &rmcp::model::RequestMetaObject,
        ct: &CancellationToken,
        timeout: Option<Duration>,
    ) -> Result<ServerResult, ServiceError> {
        let peer = self.peer().await.map_err(ServiceError::McpError)?;
        let downstream_token = meta.get_progress_token();
        *request.get_meta_mut() = meta.clone();
        let options = match timeout {
            Some(timeout) => PeerRequestOptions::with_timeout(timeout),
            None => PeerRequestOptions::no_options(),
        };
        let handle = peer.send_request_with_option(request, options).await?;
        let upstream_token = handle.progress_token.clone();
        if let Some(token) = downstream_token {
            self.progress
                .lock()
                .unwrap()
                .insert(upstream_token.clone(), token);
        }
        let (id, upstream) = (handle.id.clone(), handle.peer.clone());
        let result = tokio::select! {
            result = handle.await_response() => result,
            () = ct.cancelled() => {
                // The client gave up: tell the upstream, as the client told us.
                let cancel = rmcp::model::CancelledNotification::new(
                    rmcp::model::CancelledNotificationParam::new(
                        Some(id),
                        Some("cancelled by the MCP client".into()),
                    ),
                );
                let _ = upstream.send_notification(cancel.into()).await;
                Err(ServiceError::Cancelled { reason: Some("cancelled by the MCP client".into()) })
            }
        };
        self.progress.lock().unwrap().remove(&upstream_token);
        if let Err(ServiceError::TransportClosed | ServiceError::TransportSend(_)) = &result {
            // The upstream is gone (its process died): the next request starts it again.
            self.upstream.lock().await.take();
        }
        if let Ok(ServerResult::ListToolsResult(list)) = &result {
            let mut view = self.tools.lock().unwrap();
            let view = view.get_or_insert_with(HashMap::new);
            for tool in &list.tools {
                let read_only = tool.annotations.as_ref().and_then(|a| a.read_only_hint);
                view.insert(tool.name.to_string(), read_only == Some(true));
            }
        }
        result
    }

    /// Whether the upstream says `tool` is read-only; `None` when it lists no such tool. Lists
    /// the tools itself when the session has not seen them.
    pub(super) async fn read_only(
        &self,
        tool: &str,
        ct: &CancellationToken,
    ) -> Result<Option<bool>, McpError> {
        if let Some(view) = self.tools.lock().unwrap().as_ref()
            && let Some(read_only) = view.get(tool)
        {
            return Ok(Some(*read_only));
        }
        let mut cursor = None;
        for _page in 0..100 {
            let params = cursor
                .take()
                .map(|c| PaginatedRequestParams::default().with_cursor(Some(c)));
            let request = ListToolsRequest {
                method: Default::default(),
                params,
                extensions: Default::default(),
            };
            let answer = self
                .forward_again(request.into(), &Default::default(), ct)
                .await
                .map_err(passthrough_error)?;
            let ServerResult::ListToolsResult(list) = answer else {
                return Err(McpError::internal_error(
                    "tools/list: unexpected answer",
                    None,
                ));
            };
            match list.next_cursor {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        Ok(self
            .tools
            .lock()
            .unwrap()
            .as_ref()
            .and_then(|view| view.get(tool).copied()))
    }

    /// Forwards a `tools/call` unchanged (a tool that is not gated).
    pub(super) fn call_request(params: rmcp::model::CallToolRequestParams) -> ClientRequest {
        CallToolRequest::new(params).into()
    }

    /// The protocol versions the session offers: the upstream's once connected, else those with
    /// an `initialize` handshake (the gateway keeps the session lifecycle on both sides).
    pub(super) fn versions(&self) -> Cow<'static, [ProtocolVersion]> {
        match self.server_info() {
            Some(info) => Cow::Owned(vec![info.protocol_version]),
            None => Cow::Owned(
                ProtocolVersion::KNOWN_VERSIONS
                    .iter()
                    .filter(|v| v.has_initialize())
                    .cloned()
                    .collect(),
            ),
        }
    }
}

/// An upstream failure on a request that is not gated: the upstream's own JSON-RPC error
/// unchanged, anything else an internal error naming what happened.
pub(super) fn passthrough_error(error: ServiceError) -> McpError {
    match error {
        ServiceError::McpError(e) => e,
        ServiceError::Timeout { timeout } => McpError::new(
            ErrorCode::INTERNAL_ERROR,
            format!("the upstream MCP server did not answer within {timeout:?}"),
            None,
        ),
        other => McpError::internal_error(format!("upstream MCP server: {other}"), None),
    }
}
