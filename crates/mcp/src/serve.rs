//! Where the agent reaches the gateway: stdio (one session: the MCP client started this
//! process), or Streamable HTTP at `/mcp` with `--listen` (a session per client, each with its
//! own upstream connection). Owns the listeners and shutdown; nothing about MCP methods.

use std::{convert::Infallible, process::ExitCode, sync::Arc};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper_util::rt::TokioIo;
use rmcp::{
    ServiceExt,
    transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    },
};
use tokio_util::sync::CancellationToken;
use tower_service::Service as _;

use super::{McpArgs, Shared, session::Session};
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
    let running = match session.serve(rmcp::transport::stdio()).await {
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
    let service = StreamableHttpService::new(
        move || Ok(Session::new(shared.clone())),
        Arc::new(LocalSessionManager::default()),
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
        let service = service.clone();
        let route =
            hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                let mut service = service.clone();
                async move {
                    if request.uri().path() != defaults::MCP_PATH {
                        return Ok::<_, Infallible>(not_found());
                    }
                    service.call(request).await
                }
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

fn not_found() -> http::Response<BoxBody<Bytes, Infallible>> {
    let mut response =
        http::Response::new(Full::new(Bytes::from_static(b"not found: use /mcp\n")).boxed());
    *response.status_mut() = http::StatusCode::NOT_FOUND;
    response
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
