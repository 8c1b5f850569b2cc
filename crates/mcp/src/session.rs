//! One MCP session of the gateway: the downstream client's server. Every request is forwarded to
//! this session's upstream connection and its answer returned unchanged ([`Session::forward`]),
//! except `tools/call` ([`super::call`]). Owns the session's upstream link: for a client that
//! began with `initialize` (protocol revisions up to 2025-11-25), a connection of its own, started
//! at `initialize` and restarted on demand if it died; for a client of the stateless revision
//! (2026-07-28: no handshake, each request carries its version, client info and capabilities in
//! `_meta`), the gateway-wide link every such request shares ([`Link`], in [`Shared`]). A link
//! holds the connection, its progress-token map and its view of the upstream's tools (from the
//! `tools/list` answers passing through).

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
        ListToolsRequest, PaginatedRequestParams, ProtocolVersion, ResultType, ServerConfig,
        ServerResult,
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

/// One upstream connection and what the gateway learns through it.
#[derive(Default)]
pub struct Link {
    upstream: tokio::sync::Mutex<Option<Connection>>,
    /// What the upstream said of itself when last connected.
    info: Mutex<Option<ServerConfig>>,
    progress: ProgressMap,
    tools: ToolView,
}

/// One MCP session (its own upstream connection), or one stateless request (the shared one).
pub struct Session {
    pub(super) shared: Arc<Shared>,
    /// This session's id: the run of calls that name none.
    pub(super) id: String,
    own: Link,
    client: Mutex<Option<(ClientConfig, Peer<RoleServer>)>>,
    server_info: Mutex<Option<ServerConfig>>,
    /// Made by the HTTP service: a session when the client begins with `initialize`, else one
    /// stateless request.
    http: bool,
}

impl Session {
    /// A new session of the gateway.
    pub fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            id: uuid::Uuid::new_v4().simple().to_string(),
            own: Link::default(),
            client: Mutex::new(None),
            server_info: Mutex::new(None),
            http: false,
        }
    }

    /// A session of the HTTP service (or one stateless request, when it begins without
    /// `initialize`).
    pub fn over_http(shared: Arc<Shared>) -> Self {
        Self {
            http: true,
            ..Self::new(shared)
        }
    }

    /// The run of a gated call that names none, when the gateway names none either: the MCP
    /// session's; for a stateless HTTP request, which has none, the one every replica shares.
    pub(super) fn default_run(&self) -> String {
        if self.http && !self.has_session() {
            super::identity::STATELESS_RUN.to_owned()
        } else {
            format!("mcp-session-{}", self.id)
        }
    }

    /// Whether the client began with `initialize` (a session of its own); else its requests are
    /// stateless and share the gateway's link.
    fn has_session(&self) -> bool {
        self.client.lock().unwrap().is_some()
    }

    /// The upstream link this session's requests go through.
    fn link(&self) -> &Link {
        if self.has_session() {
            &self.own
        } else {
            &self.shared.stateless
        }
    }

    /// Connects upstream as `info`, relaying to `downstream`; returns the upstream's answer to
    /// `initialize`.
    pub(super) async fn start(
        &self,
        info: InitializeRequestParams,
        downstream: Peer<RoleServer>,
    ) -> Result<ServerConfig, McpError> {
        let requested = info.protocol_version.clone();
        *self.client.lock().unwrap() = Some((info, downstream));
        let mut upstream = self.own.upstream.lock().await;
        let connection = self.connect().await?;
        let Some(answer) = self.own.info.lock().unwrap().clone() else {
            return Err(McpError::internal_error(
                "the upstream sent no initialize result",
                None,
            ));
        };
        let peer = &answer;
        // The upstream's answer as it came, for the downstream client.
        // A stateless upstream has no handshake version: the client's own, when the gateway
        // speaks it.
        let version = if peer.protocol_version.has_initialize() {
            peer.protocol_version.clone()
        } else if requested.has_initialize() && ProtocolVersion::KNOWN_VERSIONS.contains(&requested)
        {
            requested
        } else {
            ProtocolVersion::LATEST_WITH_INITIALIZE
        };
        let answer = answer.clone().with_protocol_version(version);
        *upstream = Some(connection);
        *self.server_info.lock().unwrap() = Some(answer.clone());
        Ok(answer)
    }

    async fn connect(&self) -> Result<Connection, McpError> {
        let link = self.link();
        let tools = link.tools.clone();
        let forget = move || {
            *tools.lock().unwrap() = None;
        };
        let client = self.client.lock().unwrap().clone();
        let (relay, lifecycle) = match client {
            Some((info, downstream)) => {
                let lifecycle = upstream::Lifecycle::Handshake;
                let relay = Relay::new(info, Some(downstream), link.progress.clone(), forget);
                (relay, lifecycle)
            }
            None => {
                let relay = Relay::new(
                    upstream::gateway_info(),
                    None,
                    link.progress.clone(),
                    forget,
                );
                (relay, upstream::Lifecycle::Stateless)
            }
        };
        let connection = upstream::connect(&self.shared.target, relay, lifecycle)
            .await
            .map_err(|e| McpError::internal_error(e, None))?;
        *link.info.lock().unwrap() = connection.peer_info().map(|peer| {
            // The upstream's answer as it came, for the downstream client.
            let mut answer = ServerConfig::new(peer.capabilities.clone())
                .with_protocol_version(peer.protocol_version.clone());
            if let Some(implementation) = &peer.server_info {
                answer = answer.with_server_info(implementation.clone());
            }
            answer.instructions = peer.instructions.clone();
            answer.meta = peer.meta.clone();
            answer
        });
        Ok(connection)
    }

    /// What the upstream says of itself (connecting when it must): its capabilities,
    /// implementation and instructions, for `server/discover`.
    pub(super) async fn upstream_info(&self) -> Result<ServerConfig, McpError> {
        self.peer().await?;
        self.link()
            .info
            .lock()
            .unwrap()
            .clone()
            .ok_or_else(|| McpError::internal_error("the upstream did not describe itself", None))
    }

    /// What the upstream last said of itself, if it was reached.
    pub(super) fn known_info(&self) -> Option<ServerConfig> {
        self.server_info()
            .or_else(|| self.link().info.lock().unwrap().clone())
    }

    /// The upstream peer, reconnecting when the connection died (the upstream process exited).
    async fn peer(&self) -> Result<Peer<rmcp::RoleClient>, McpError> {
        let mut upstream = self.link().upstream.lock().await;
        if let Some(connection) = upstream.as_ref()
            && !connection.is_closed()
        {
            return Ok(connection.peer().clone());
        }
        if upstream.is_some() {
            tracing::warn!("the upstream MCP connection is closed: reconnecting");
        }
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
        from: Origin<'_>,
    ) -> Result<ServerResult, ServiceError> {
        match self.forward(request.clone(), from, None).await {
            Err(ServiceError::TransportClosed | ServiceError::TransportSend(_)) => {
                self.forward(request, from, None).await
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

    /// Sends `request` upstream with the downstream's request `_meta`, relaying progress to the
    /// downstream peer and cancellation (`ct`), within `timeout` if given. The upstream's answer,
    /// unchanged.
    pub(super) async fn forward(
        &self,
        mut request: ClientRequest,
        from: Origin<'_>,
        timeout: Option<Duration>,
    ) -> Result<ServerResult, ServiceError> {
        let Origin {
            meta,
            ct,
            peer: downstream,
        } = from;
        let peer = self.peer().await.map_err(ServiceError::McpError)?;
        let downstream_token = meta.get_progress_token().filter(|_| downstream.is_some());
        *request.get_meta_mut() = upstream::meta_for_upstream(meta);
        let mut options = match timeout {
            Some(timeout) => PeerRequestOptions::with_timeout(timeout),
            None => PeerRequestOptions::no_options(),
        };
        let stateless = peer
            .peer_info()
            .is_some_and(|info| !info.protocol_version.has_initialize());
        if stateless && let Some(capabilities) = upstream::capabilities_of(meta) {
            // A stateless upstream learns what the downstream client can do (its input
            // requests go back to it), not what the gateway's own connection declared.
            options = options.with_meta(capabilities);
        }
        let handle = peer.send_request_with_option(request, options).await?;
        let upstream_token = handle.progress_token.clone();
        let link = self.link();
        if let Some(token) = downstream_token {
            link.progress
                .lock()
                .unwrap()
                .insert(upstream_token.clone(), (token, downstream.cloned()));
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
        link.progress.lock().unwrap().remove(&upstream_token);
        if let Err(ServiceError::TransportClosed | ServiceError::TransportSend(_)) = &result {
            // The upstream is gone (its process died): the next request starts it again.
            link.upstream.lock().await.take();
        }
        let mut result = result;
        if let Ok(answer) = &mut result
            && stateless_request(meta)
        {
            mark_complete(answer);
        }
        if let Ok(ServerResult::ListToolsResult(list)) = &result {
            let mut view = link.tools.lock().unwrap();
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
        if let Some(view) = self.link().tools.lock().unwrap().as_ref()
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
            let from = Origin {
                meta: &Default::default(),
                ct,
                peer: None,
            };
            let answer = self
                .forward_again(request.into(), from)
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
            .link()
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

    /// The protocol versions the gateway offers: every one it knows (the stateless 2026-07-28 and
    /// those with an `initialize` handshake; rmcp negotiates them as the specification says); once
    /// a session's upstream answered a handshake, that upstream's version (the methods and
    /// features of the session are the upstream's).
    pub(super) fn versions(&self) -> Cow<'static, [ProtocolVersion]> {
        match self.server_info() {
            Some(info) if self.has_session() => Cow::Owned(vec![info.protocol_version]),
            _ => Cow::Borrowed(ProtocolVersion::KNOWN_VERSIONS),
        }
    }
}

/// Whether a request is of the stateless revision (its `_meta` names a version without the
/// handshake).
pub(super) fn stateless_request(meta: &rmcp::model::RequestMetaObject) -> bool {
    meta.protocol_version()
        .is_some_and(|version| !version.has_initialize())
}

/// Marks a result `resultType: "complete"` when it says nothing (an upstream of a handshake
/// revision never does; a stateless client requires it).
pub(super) fn mark_complete(answer: &mut ServerResult) {
    let result_type = match answer {
        ServerResult::CompleteResult(r) => &mut r.result_type,
        ServerResult::GetPromptResult(r) => &mut r.result_type,
        ServerResult::ListPromptsResult(r) => &mut r.result_type,
        ServerResult::ListResourcesResult(r) => &mut r.result_type,
        ServerResult::ListResourceTemplatesResult(r) => &mut r.result_type,
        ServerResult::ReadResourceResult(r) => &mut r.result_type,
        ServerResult::ListToolsResult(r) => &mut r.result_type,
        ServerResult::CallToolResult(r) => &mut r.result_type,
        _ => return,
    };
    result_type.get_or_insert(ResultType::COMPLETE);
}

/// Where a forwarded request came from: its `_meta`, its cancellation, and the downstream peer
/// its progress goes to (`None`: none is relayed).
#[derive(Clone, Copy)]
pub(super) struct Origin<'a> {
    pub meta: &'a rmcp::model::RequestMetaObject,
    pub ct: &'a CancellationToken,
    pub peer: Option<&'a Peer<RoleServer>>,
}

impl<'a> Origin<'a> {
    /// The request `context` handles.
    pub fn of(context: &'a rmcp::service::RequestContext<RoleServer>) -> Self {
        Self {
            meta: &context.meta,
            ct: &context.ct,
            peer: Some(&context.peer),
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
