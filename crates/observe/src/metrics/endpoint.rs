//! The `/metrics` HTTP endpoint, on its own listener (`--metrics-listen`) so that scrapes never
//! share a port, a connection limit or an authentication story with the gRPC API.
//!
//! Serves the Prometheus text format (0.0.4) by default and OpenMetrics text when the scraper asks
//! for it in `Accept`. Owns nothing but HTTP/1.1 plumbing; the series live in [`super::Metrics`].

use std::{convert::Infallible, future::Future, sync::Arc};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use prometheus_client::{encoding, registry::Registry};
use tokio::net::TcpListener;

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The path of the public keys.
pub const JWKS_PATH: &str = "/.well-known/jwks.json";

/// Serves `GET /metrics` from `registry` on `listener` until `shutdown` resolves. Other paths get
/// 404, other methods 405.
pub async fn serve(
    listener: TcpListener,
    registry: Arc<Registry>,
    shutdown: impl Future<Output = ()>,
) {
    serve_with_keys(listener, registry, None, shutdown).await
}

/// Like [`serve`], and `GET /.well-known/jwks.json` answers `jwks` (a JWKS document) when given.
pub async fn serve_with_keys(
    listener: TcpListener,
    registry: Arc<Registry>,
    jwks: Option<Arc<String>>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: keep serving once it passes.
                    tracing::warn!(error = %e, "metrics listener: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let (registry, jwks) = (registry.clone(), jwks.clone());
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let (registry, jwks) = (registry.clone(), jwks.clone());
                async move { Ok::<_, Infallible>(respond(&req, &registry, jwks.as_deref())) }
            });
            if let Err(e) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(error = %e, "metrics connection ended with an error");
            }
        });
    }
}

fn respond(
    req: &Request<Incoming>,
    registry: &Registry,
    jwks: Option<&String>,
) -> Response<Full<Bytes>> {
    if let (JWKS_PATH, Some(jwks)) = (req.uri().path(), jwks) {
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return plain(StatusCode::METHOD_NOT_ALLOWED, "use GET\n");
        }
        let mut response = Response::new(Full::new(Bytes::from(jwks.clone())));
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/jwk-set+json"),
        );
        return response;
    }
    if req.uri().path() != "/metrics" {
        return plain(
            StatusCode::NOT_FOUND,
            "not found: the metrics are at /metrics\n",
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "use GET\n");
    }
    let openmetrics = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/openmetrics-text"));
    let mut body = String::new();
    let (encoded, content_type) = if openmetrics {
        (encoding::text::encode(&mut body, registry), OPENMETRICS)
    } else {
        (
            encoding::prometheus_text::encode(&mut body, registry),
            encoding::prometheus_text::CONTENT_TYPE,
        )
    };
    if encoded.is_err() {
        return plain(StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics\n");
    }
    let mut response = Response::new(Full::new(Bytes::from(body)));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    response
}

fn plain(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *response.status_mut() = status;
    response
}
