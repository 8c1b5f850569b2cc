//! A tower layer on the tonic server: for every call of an `oncegate.v1` service, one tracing span
//! (linked to the caller's W3C `traceparent`) and one observation of
//! `oncegate_rpc_duration_seconds{rpc, code}`. Health and reflection calls pass through untouched.
//!
//! The status code is read from the response head: tonic sends an error as a trailers-only
//! response whose headers carry `grpc-status`; a unary reply without it is an OK reply (its
//! `grpc-status: 0` follows in the trailers). Latency is measured to the response head, which for
//! a unary call is the whole handler.
//!
//! The caller's deadline (`grpc-timeout`) ends a call here, `DEADLINE_EXCEEDED`, a moment before
//! tonic's own timer would: tonic answers a call past its `grpc-timeout` `CANCELLED` ("Timeout
//! expired") and drops it unobserved. A call dropped unanswered (its caller cancelled it, or its
//! connection closed) is observed `CANCELLED`.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::{Duration, Instant},
};

use http::{HeaderMap, Request, Response};
use tokio::time::Sleep;
use tower_layer::Layer;
use tower_service::Service;
use tracing::{Span, field::Empty};

use super::{AUDIT, RPC_END, RPC_SPAN, TraceParent};
use crate::metrics::{Metrics, code_name};

/// The package whose calls are traced and timed.
const PACKAGE_PREFIX: &str = "/oncegate.v1.";

/// How much sooner than the caller's deadline a call is ended here: tonic's timer for the same
/// deadline started earlier in the same call, and tokio's timers tick by the millisecond, so this
/// one fires in an earlier tick or in the same one, where the call is polled before tonic's timer.
const DEADLINE_MARGIN: Duration = Duration::from_millis(1);

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

/// The caller's deadline: `grpc-timeout`, at most 8 digits and a unit (`H`, `M`, `S`, `m`, `u`,
/// `n`), as gRPC over HTTP/2 defines it. A malformed value is no deadline, as it is to tonic.
fn caller_timeout(headers: &HeaderMap) -> Option<Duration> {
    let (&unit, digits) = headers.get("grpc-timeout")?.as_bytes().split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits
        .iter()
        .fold(0u64, |n, &digit| n * 10 + u64::from(digit - b'0'));
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The span of one RPC: the fields the gate fills in are declared empty here.
fn rpc_span(rpc: &str, headers: &HeaderMap) -> Span {
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
    let parent = headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(TraceParent::parse);
    if let Some(parent) = parent {
        span.record("trace_id", parent.trace_id.as_str());
        span.record("parent_span_id", parent.parent_id.as_str());
    }
    #[cfg(feature = "otel")]
    super::otel::set_parent(&span, headers);
    span
}

impl<S, B, RB> Service<Request<B>> for RpcService<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    RB: Default,
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
                deadline: None,
                observed: None,
            };
        };
        let start = Instant::now();
        let timeout = caller_timeout(req.headers());
        let span = rpc_span(&rpc, req.headers());
        let inner = span.in_scope(|| self.inner.call(req));
        RpcFuture {
            inner,
            deadline: timeout
                .map(|timeout| tokio::time::sleep(timeout.saturating_sub(DEADLINE_MARGIN))),
            observed: Some(Observed {
                span: Arc::new(span),
                rpc,
                start,
                timeout,
                metrics: self.metrics.clone(),
            }),
        }
    }
}

struct Observed {
    span: Arc<Span>,
    rpc: String,
    start: Instant,
    timeout: Option<Duration>,
    metrics: Metrics,
}

impl Observed {
    /// The call ended with `code`: its span's last event and its latency.
    fn finish(self, code: tonic::Code) {
        self.span.record("grpc.code", code_name(code));
        let elapsed = self.start.elapsed();
        let elapsed_ms = elapsed.as_micros() as f64 / 1000.0;
        // The span's last event: logs show its fields only with an event, and the code is known
        // only now.
        match code {
            tonic::Code::DeadlineExceeded => tracing::info!(target: RPC_END, parent: &*self.span,
                elapsed_ms, timeout_ms = self.timeout.map(|t| t.as_millis() as u64),
                "finished: the caller's deadline passed before the gate answered"),
            tonic::Code::Cancelled => tracing::info!(target: RPC_END, parent: &*self.span,
                elapsed_ms, "finished: dropped unanswered (its caller cancelled it, or its connection closed)"),
            _ => tracing::info!(target: RPC_END, parent: &*self.span, elapsed_ms, "finished"),
        }
        // UNIMPLEMENTED is what tonic answers for a method no service has: the path came from the
        // client, so it must not become a label value.
        if code != tonic::Code::Unimplemented {
            self.metrics.rpc(&self.rpc, code, elapsed);
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`RpcService`]: polls the call inside its span, ends it at the
    /// caller's deadline, and observes it when the response head is ready (or when it is dropped
    /// unanswered: its caller cancelled it, or its connection closed).
    pub struct RpcFuture<F> {
        #[pin]
        inner: F,
        #[pin]
        deadline: Option<Sleep>,
        observed: Option<Observed>,
    }

    impl<F> PinnedDrop for RpcFuture<F> {
        fn drop(this: Pin<&mut Self>) {
            if let Some(observed) = this.project().observed.take() {
                observed.finish(tonic::Code::Cancelled);
            }
        }
    }
}

impl<F, RB, E> Future for RpcFuture<F>
where
    F: Future<Output = Result<Response<RB>, E>>,
    RB: Default,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let Some(observed) = this.observed.as_ref() else {
            return this.inner.poll(cx);
        };
        let polled = {
            let _entered = observed.span.enter();
            super::with_rpc_span(&observed.span, || this.inner.poll(cx))
        };
        let result = match polled {
            Poll::Ready(result) => result,
            Poll::Pending => {
                let Some(deadline) = this.deadline.as_pin_mut() else {
                    return Poll::Pending;
                };
                std::task::ready!(deadline.poll(cx));
                Ok(deadline_passed().into_http())
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
            observed.finish(code);
        }
        Poll::Ready(result)
    }
}

/// One call carried as a message of a stream (`Session`) rather than as an HTTP request of its
/// own: observed as a unary call of `rpc` (`package.Service/Method`) is, with the same span (its
/// parent the stream's `traceparent` in `headers`), the same `finished` line and the same
/// latency observation, and ended `DEADLINE_EXCEEDED` when `timeout` passes first. Dropped
/// unanswered, it is observed `CANCELLED`.
pub async fn observe_message<T>(
    metrics: &Metrics,
    rpc: &str,
    headers: &HeaderMap,
    timeout: Option<Duration>,
    call: impl Future<Output = Result<T, tonic::Status>>,
) -> Result<T, tonic::Status> {
    let span = Arc::new(rpc_span(rpc, headers));
    let mut observed = Unanswered(Some(Observed {
        span: Arc::clone(&span),
        rpc: rpc.to_owned(),
        start: Instant::now(),
        timeout,
        metrics: metrics.clone(),
    }));
    let call = InSpan { span, inner: call };
    let result = match timeout {
        Some(timeout) => tokio::time::timeout(timeout.saturating_sub(DEADLINE_MARGIN), call)
            .await
            .unwrap_or_else(|_| Err(deadline_passed())),
        None => call.await,
    };
    let code = result
        .as_ref()
        .map_or_else(tonic::Status::code, |_| tonic::Code::Ok);
    if let Some(observed) = observed.0.take() {
        observed.finish(code);
    }
    result
}

/// How a call past its caller's deadline is answered.
fn deadline_passed() -> tonic::Status {
    tonic::Status::deadline_exceeded(
        "the caller's deadline passed before the gate answered: the call may or may not have \
         taken effect; ask again with the same request to learn which",
    )
}

/// An observation still owed: made `CANCELLED` if its call is dropped before it answers.
struct Unanswered(Option<Observed>);

impl Drop for Unanswered {
    fn drop(&mut self) {
        if let Some(observed) = self.0.take() {
            observed.finish(tonic::Code::Cancelled);
        }
    }
}

pin_project_lite::pin_project! {
    /// A future polled inside its RPC's span, as [`RpcFuture`] polls a unary call.
    struct InSpan<F> {
        span: Arc<Span>,
        #[pin]
        inner: F,
    }
}

impl<F: Future> Future for InSpan<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let _entered = this.span.enter();
        super::with_rpc_span(this.span, || this.inner.poll(cx))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::HeaderMap;

    use super::{caller_timeout, rpc_name};

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

    fn timeout(value: &str) -> Option<Duration> {
        let mut headers = HeaderMap::new();
        headers.insert("grpc-timeout", value.parse().unwrap());
        caller_timeout(&headers)
    }

    #[test]
    fn the_callers_deadline_is_read_as_grpc_over_http2_writes_it() {
        assert_eq!(timeout("500m"), Some(Duration::from_millis(500)));
        assert_eq!(timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(
            timeout("99999999u"),
            Some(Duration::from_micros(99_999_999))
        );
        assert_eq!(timeout("7n"), Some(Duration::from_nanos(7)));
        // Malformed: no deadline, as tonic reads it.
        for bad in ["", "m", "123456789m", "5x", "-5m", "5 m", "1.5S"] {
            assert_eq!(timeout(bad), None, "{bad:?}");
        }
        assert_eq!(caller_timeout(&HeaderMap::new()), None);
    }
}
