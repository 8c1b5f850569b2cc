//! Where the agent reaches the gateway: stdio (one session: the MCP client started this
//! process; [`super::stdio`]), or Streamable HTTP at `/mcp` with `--listen` (a session per
//! client, each with its own upstream connection; rmcp's service, behind a layer that captures
//! each `tools/call`'s arguments as sent ([`super::sent`]) and answers a session's DELETE 200 as
//! the reference SDKs do, where rmcp answers 202). Owns the listeners and shutdown; nothing about
//! MCP methods.

use std::{borrow::Cow, convert::Infallible, process::ExitCode, sync::Arc};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper_util::rt::TokioIo;
use rmcp::{
    ServiceExt,
    transport::{
        common::server_side_http::SessionId,
        streamable_http_server::{
            StreamableHttpServerConfig, StreamableHttpService,
            session::{SessionManager as _, local::LocalSessionManager},
        },
    },
};
use tokio_util::sync::CancellationToken;
use tower_service::Service as _;

use super::{McpArgs, Shared, sent, session::Session, stdio::Stdio};
use oncegate_config::{defaults, exit};

/// Serves MCP on stdio, or on `--listen`.
pub async fn serve(args: &McpArgs, shared: Arc<Shared>) -> ExitCode {
    match args.listen {
        None => stdio(shared).await,
        Some(addr) => http(addr, args.allowed_hosts.clone(), shared).await,
    }
}

async fn stdio(shared: Arc<Shared>) -> ExitCode {
    let session = Session::new(shared);
    let (stdin, stdout) = rmcp::transport::stdio();
    let running = match session.serve(Stdio::new(stdin, stdout)).await {
        Ok(running) => running,
        Err(e) => {
            tracing::error!(error = %e, "the MCP session did not start");
            return ExitCode::FAILURE;
        }
    };
    match running.waiting().await {
        Ok(reason) => {
            tracing::info!(?reason, "the MCP client went away");
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!(error = %e, "the MCP session failed");
            ExitCode::FAILURE
        }
    }
}

async fn http(addr: std::net::SocketAddr, hosts: Vec<String>, shared: Arc<Shared>) -> ExitCode {
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(listener) => listener,
        Err(e) => {
            tracing::error!(listen = %addr, error = %e, "cannot listen");
            return ExitCode::from(exit::UNAVAILABLE);
        }
    };
    let bound = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    println!("listening on {bound}");
    tracing::info!(addr = %bound, path = defaults::MCP_PATH, "oncegate mcp serving Streamable HTTP");
    let stop = CancellationToken::new();
    let mut config = StreamableHttpServerConfig::default().with_cancellation_token(stop.clone());
    if !hosts.is_empty() {
        config = config.with_allowed_hosts(hosts);
    }
    let body_limit = config.max_request_body_bytes;
    let sessions = Arc::new(LocalSessionManager::default());
    let service = StreamableHttpService::new(
        move || Ok(Session::over_http(shared.clone())),
        sessions.clone(),
        config,
    );
    let signal = shutdown_signal();
    tokio::pin!(signal);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            },
            () = &mut signal => break,
        };
        let (service, sessions) = (service.clone(), sessions.clone());
        let route = hyper::service::service_fn(move |request| {
            route(service.clone(), sessions.clone(), request, body_limit)
        });
        tokio::spawn(async move {
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), route)
                .await
            {
                tracing::debug!(error = %e, "connection ended");
            }
        });
    }
    stop.cancel();
    tracing::info!("stopped");
    ExitCode::SUCCESS
}

type Mcp = StreamableHttpService<Session, LocalSessionManager>;
type Response = http::Response<BoxBody<Bytes, Infallible>>;

/// One HTTP request: `/mcp` to rmcp (with the arguments as sent), anything else 404.
async fn route(
    mut service: Mcp,
    sessions: Arc<LocalSessionManager>,
    request: http::Request<hyper::body::Incoming>,
    body_limit: usize,
) -> Result<Response, Infallible> {
    if request.uri().path() != defaults::MCP_PATH {
        return Ok(not_found());
    }
    let delete = request.method() == http::Method::DELETE;
    let session = request
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(SessionId::from);
    let request = match captured(request, body_limit).await {
        Ok(request) => request,
        Err(refused) => return Ok(refused),
    };
    if !delete {
        return service.call(request).await;
    }
    // A client ending its session (MCP Streamable HTTP): a session that is not there (ended
    // already, or never was) is 404, as for any request naming it; rmcp would answer 202.
    if let Some(session) = session
        && !sessions.has_session(&session).await.unwrap_or(false)
    {
        return Ok(plain(
            http::StatusCode::NOT_FOUND,
            "Not Found: Session not found\n",
        ));
    }
    let mut response = service.call(request).await?;
    if response.status() == http::StatusCode::ACCEPTED {
        // Ended by now: 200, as the MCP SDKs answer (and their clients expect: 200 or 204).
        *response.status_mut() = http::StatusCode::OK;
    }
    Ok(response)
}

fn not_found() -> http::Response<BoxBody<Bytes, Infallible>> {
    plain(http::StatusCode::NOT_FOUND, "not found: use /mcp\n")
}

fn plain(
    status: http::StatusCode,
    text: &'static str,
) -> http::Response<BoxBody<Bytes, Infallible>> {
    let mut response = http::Response::new(Full::new(Bytes::from_static(text.as_bytes())).boxed());
    *response.status_mut() = status;
    response
}

/// The request with its body read (at most `limit` bytes, rmcp's own limit) and, when it is a
/// `tools/call`, the call's arguments as sent in its extensions, for the handler.
async fn captured(
    request: http::Request<hyper::body::Incoming>,
    limit: usize,
) -> Result<http::Request<Full<Bytes>>, http::Response<BoxBody<Bytes, Infallible>>> {
    let (mut parts, body) = request.into_parts();
    let body = match http_body_util::Limited::new(body, limit).collect().await {
        Ok(body) => body.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(plain(
                http::StatusCode::PAYLOAD_TOO_LARGE,
                "Payload Too Large: the request body is above the limit\n",
            ));
        }
        Err(e) => {
            tracing::debug!(error = %e, "reading a request body failed");
            return Err(plain(
                http::StatusCode::BAD_REQUEST,
                "Bad Request: the body could not be read\n",
            ));
        }
    };
    let mut body = body;
    if parts.method == http::Method::POST
        && let Ok(text) = std::str::from_utf8(&body)
    {
        let (readable, call) = sent::prepare(text);
        if let Some(call) = call {
            parts.extensions.insert(call);
        }
        if let Cow::Owned(readable) = readable {
            body = Bytes::from(readable);
        }
    }
    Ok(http::Request::from_parts(parts, Full::new(body)))
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        () = term => {},
    }
}
