//! A tower layer on the tonic server: for every call of an `oncegate.v1` service, one tracing span
//! (linked to the caller's W3C `traceparent`) and one observation of
//! `oncegate_rpc_duration_seconds{rpc, code}`. Health and reflection calls pass through untouched.
//!
//! The status code is read from the response head: tonic sends an error as a trailers-only
//! response whose headers carry `grpc-status`; a unary reply without it is an OK reply (its
//! `grpc-status: 0` follows in the trailers). Latency is measured to the response head, which for
//! a unary call is the whole handler.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Instant,
};

use http::{Request, Response};
use tower_layer::Layer;
use tower_service::Service;
use tracing::{Span, field::Empty};

use super::{AUDIT, RPC_END, RPC_SPAN, TraceParent};
use crate::metrics::{Metrics, code_name};

/// The package whose calls are traced and timed.
const PACKAGE_PREFIX: &str = "/oncegate.v1.";

/// Adds the per-RPC span and latency histogram to every service it wraps.
#[derive(Clone)]
pub struct RpcLayer {
    metrics: Metrics,
}

impl RpcLayer {
    /// Observes into `metrics`.
    pub fn new(metrics: Metrics) -> Self {
        Self { metrics }
    }
}

impl<S> Layer<S> for RpcLayer {
    type Service = RpcService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RpcService {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// The service [`RpcLayer`] produces.
#[derive(Clone)]
pub struct RpcService<S> {
    inner: S,
    metrics: Metrics,
}

/// `package.Service/Method` of a gate call, `None` for anything else (health, reflection).
fn rpc_name(path: &str) -> Option<&str> {
    path.starts_with(PACKAGE_PREFIX).then(|| &path[1..])
}

/// The span of one RPC: the fields the gate fills in are declared empty here.
fn rpc_span<B>(rpc: &str, req: &Request<B>) -> Span {
    macro_rules! span {
        ($($otel:tt)*) => {
            tracing::info_span!(
                target: AUDIT,
                RPC_SPAN,
                $($otel)*
                rpc = %rpc,
                principal = Empty,
                trace_id = Empty,
                parent_span_id = Empty,
                agent_id = Empty,
                run_id = Empty,
                action = Empty,
                key = Empty,
                decision = Empty,
                grpc.code = Empty,
            )
        };
    }
    // The OpenTelemetry span name and kind only where they are exported.
    #[cfg(feature = "otel")]
    let span = span!(otel.name = rpc, otel.kind = "server",);
    #[cfg(not(feature = "otel"))]
    let span = span!();
    let parent = req
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(TraceParent::parse);
    if let Some(parent) = parent {
        span.record("trace_id", parent.trace_id.as_str());
        span.record("parent_span_id", parent.parent_id.as_str());
    }
    #[cfg(feature = "otel")]
    super::otel::set_parent(&span, req.headers());
    span
}

impl<S, B, RB> Service<Request<B>> for RpcService<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = RpcFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let Some(rpc) = rpc_name(req.uri().path()).map(str::to_owned) else {
            return RpcFuture {
                inner: self.inner.call(req),
                observed: None,
            };
        };
        let start = Instant::now();
        let span = rpc_span(&rpc, &req);
        let inner = span.in_scope(|| self.inner.call(req));
        RpcFuture {
            inner,
            observed: Some(Observed {
                span: Arc::new(span),
                rpc,
                start,
                metrics: self.metrics.clone(),
            }),
        }
    }
}

struct Observed {
    span: Arc<Span>,
    rpc: String,
    start: Instant,
    metrics: Metrics,
}

pin_project_lite::pin_project! {
    /// The response future of [`RpcService`]: polls the call inside its span and observes it when
    /// the response head is ready.
    pub struct RpcFuture<F> {
        #[pin]
        inner: F,
        observed: Option<Observed>,
    }
}

impl<F, RB, E> Future for RpcFuture<F>
where
    F: Future<Output = Result<Response<RB>, E>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Some(observed) = this.observed.as_ref() else {
            return this.inner.poll(cx);
        };
        let result = {
            let _entered = observed.span.enter();
            match super::with_rpc_span(&observed.span, || this.inner.poll(cx)) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(result) => result,
            }
        };
        let code = match &result {
            Ok(response) => response
                .headers()
                .get("grpc-status")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<i32>().ok())
                .map_or(tonic::Code::Ok, tonic::Code::from_i32),
            Err(_) => tonic::Code::Unknown,
        };
        if let Some(observed) = this.observed.take() {
            observed.span.record("grpc.code", code_name(code));
            let elapsed = observed.start.elapsed();
            // The span's last event: logs show its fields only with an event, and the code is
            // known only now.
            tracing::info!(target: RPC_END, parent: &*observed.span,
                elapsed_ms = elapsed.as_micros() as f64 / 1000.0, "finished");
            // UNIMPLEMENTED is what tonic answers for a method no service has: the path came from
            // the client, so it must not become a label value.
            if code != tonic::Code::Unimplemented {
                observed.metrics.rpc(&observed.rpc, code, elapsed);
            }
        }
        Poll::Ready(result)
    }
}

#[cfg(test)]
mod tests {
    use super::rpc_name;

    #[test]
    fn only_gate_packages_are_observed() {
        assert_eq!(
            rpc_name("/oncegate.v1.ActionGateService/RequestToken"),
            Some("oncegate.v1.ActionGateService/RequestToken")
        );
        assert_eq!(rpc_name("/grpc.health.v1.Health/Check"), None);
        assert_eq!(
            rpc_name("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"),
            None
        );
    }
}
