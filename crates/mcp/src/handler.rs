//! The MCP server the downstream client talks to: rmcp's [`ServerHandler`] for a [`Session`],
//! every method forwarded unchanged (requests and their answers, JSON-RPC errors included) and
//! `tools/call` handed to [`super::call`]. Owns the mapping of each MCP method to the upstream
//! request and back; nothing else.

// Logging and resource subscriptions are deprecated in the 2026 protocol, not in the versions
// the gateway negotiates: it forwards them like every other method.
#![allow(deprecated)]

use std::borrow::Cow;

use rmcp::{
    ErrorData as McpError, RoleServer, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, ClientRequest, CompleteRequest,
        CompleteRequestParams, CompleteResult, CustomNotification, CustomRequest, CustomResult,
        DiscoverResult, GetPromptRequest, GetPromptRequestParams, GetPromptResponse,
        InitializeRequestParams, InitializeResult, ListPromptsRequest, ListPromptsResult,
        ListResourceTemplatesRequest, ListResourceTemplatesResult, ListResourcesRequest,
        ListResourcesResult, ListToolsRequest, ListToolsResult, PaginatedRequestParams,
        PingRequest, ProtocolVersion, ReadResourceRequest, ReadResourceRequestParams,
        ReadResourceResponse, ServerConfig, ServerResult, SetLevelRequest, SetLevelRequestParams,
        SubscribeRequest, SubscribeRequestParams, UnsubscribeRequest, UnsubscribeRequestParams,
    },
    service::{NotificationContext, RequestContext},
};

use super::{
    call,
    session::{self, Session, passthrough_error},
};

/// Forwards `$request` and unpacks the answer as `$variant` (another answer is a protocol error
/// of the upstream's).
macro_rules! forward {
    ($self:ident, $context:ident, $request:expr, $variant:ident) => {
        match $self.forward_request($request.into(), &$context).await? {
            ServerResult::$variant(result) => Ok(result.into()),
            other => Err(unexpected(&other)),
        }
    };
}

impl Session {
    async fn forward_request(
        &self,
        request: ClientRequest,
        context: &RequestContext<RoleServer>,
    ) -> Result<ServerResult, McpError> {
        self.forward_again(request, session::Origin::of(context))
            .await
            .map_err(passthrough_error)
    }
}

fn unexpected(answer: &ServerResult) -> McpError {
    McpError::internal_error(
        format!("the upstream MCP server answered with an unexpected result: {answer:?}"),
        None,
    )
}

fn request<M: Default, P>(params: P) -> rmcp::model::Request<M, P> {
    rmcp::model::Request::new(params)
}

fn optional<M: Default, P>(params: Option<P>) -> rmcp::model::RequestOptionalParam<M, P> {
    rmcp::model::RequestOptionalParam {
        method: M::default(),
        params,
        extensions: Default::default(),
    }
}

impl ServerHandler for Session {
    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, McpError> {
        context.peer.set_peer_info(request.clone());
        self.start(request, context.peer.clone()).await
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        self.versions()
    }

    fn get_info(&self) -> ServerConfig {
        self.known_info().unwrap_or_default()
    }

    async fn discover(
        &self,
        _context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, McpError> {
        let info = self.upstream_info().await?;
        Ok(DiscoverResult::from_server_info(
            self.versions().into_owned(),
            info,
        ))
    }

    async fn ping(&self, context: RequestContext<RoleServer>) -> Result<(), McpError> {
        let ping = PingRequest {
            method: Default::default(),
            extensions: Default::default(),
        };
        self.forward_request(ping.into(), &context).await.map(drop)
    }

    async fn complete(
        &self,
        params: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, McpError> {
        let complete: CompleteRequest = request(params);
        forward!(self, context, complete, CompleteResult)
    }

    async fn set_level(
        &self,
        params: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let set: SetLevelRequest = request(params);
        self.forward_request(set.into(), &context).await.map(drop)
    }

    async fn get_prompt(
        &self,
        params: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, McpError> {
        let get: GetPromptRequest = request(params);
        match self.forward_request(get.into(), &context).await? {
            ServerResult::GetPromptResult(result) => Ok(result.into()),
            ServerResult::InputRequiredResult(more) => Ok(GetPromptResponse::InputRequired(more)),
            other => Err(unexpected(&other)),
        }
    }

    async fn list_prompts(
        &self,
        params: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, McpError> {
        let list: ListPromptsRequest = optional(params);
        forward!(self, context, list, ListPromptsResult)
    }

    async fn list_resources(
        &self,
        params: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let list: ListResourcesRequest = optional(params);
        forward!(self, context, list, ListResourcesResult)
    }

    async fn list_resource_templates(
        &self,
        params: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        let list: ListResourceTemplatesRequest = optional(params);
        forward!(self, context, list, ListResourceTemplatesResult)
    }

    async fn read_resource(
        &self,
        params: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let read: ReadResourceRequest = request(params);
        match self.forward_request(read.into(), &context).await? {
            ServerResult::ReadResourceResult(result) => Ok(result.into()),
            ServerResult::InputRequiredResult(more) => {
                Ok(ReadResourceResponse::InputRequired(more))
            }
            other => Err(unexpected(&other)),
        }
    }

    async fn subscribe(
        &self,
        params: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let subscribe: SubscribeRequest = request(params);
        self.forward_request(subscribe.into(), &context)
            .await
            .map(drop)
    }

    async fn unsubscribe(
        &self,
        params: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let unsubscribe: UnsubscribeRequest = request(params);
        self.forward_request(unsubscribe.into(), &context)
            .await
            .map(drop)
    }

    async fn list_tools(
        &self,
        params: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let list: ListToolsRequest = optional(params);
        forward!(self, context, list, ListToolsResult)
    }

    async fn call_tool(
        &self,
        params: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        call::call_tool(self, params, context).await
    }

    async fn on_custom_request(
        &self,
        request: CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<CustomResult, McpError> {
        forward!(self, context, request, CustomResult)
    }

    async fn on_roots_list_changed(&self, context: NotificationContext<RoleServer>) {
        self.notify_upstream(
            rmcp::model::RootsListChangedNotification {
                method: Default::default(),
                extensions: Default::default(),
            }
            .into(),
            context,
        )
        .await;
    }

    async fn on_custom_notification(
        &self,
        notification: CustomNotification,
        context: NotificationContext<RoleServer>,
    ) {
        self.notify_upstream(notification.into(), context).await;
    }
}

impl Session {
    async fn notify_upstream(
        &self,
        notification: rmcp::model::ClientNotification,
        _context: NotificationContext<RoleServer>,
    ) {
        if let Err(e) = self.notify(notification).await {
            tracing::debug!(error = %e, "could not relay a notification upstream");
        }
    }
}
