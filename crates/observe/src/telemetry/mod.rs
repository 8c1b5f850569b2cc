//! Tracing: the subscriber (`init`), one span per gate RPC ([`layer::RpcLayer`]), the incoming
//! W3C `traceparent` ([`TraceParent`]), the audit target ([`AUDIT`]), and the helpers the gate uses
//! to put what it decided on the current span.
//!
//! A span carries the RPC, principal, scope, action, key, decision and status code, and the
//! caller's trace and span ids; its last event ([`RPC_END`]) logs the status and latency, so that
//! the span's fields reach the logs complete (text and JSON alike).
//! Never params, receipts or tokens: they are secrets the gate holds for its callers. OpenTelemetry
//! OTLP export lives in [`otel`], behind the cargo feature `otel` (off by default): without it no
//! OpenTelemetry crate is compiled in.

mod held;
pub mod layer;
#[cfg(feature = "otel")]
pub mod otel;
mod text;

pub use held::{hold_lines_on_current_thread, release_lines};

use std::sync::Arc;

use tracing::Span;
use tracing_subscriber::{EnvFilter, Layer, layer::SubscriberExt, util::SubscriberInitExt};

/// Target of the audit events: one per decision, routable on its own (`RUST_LOG=oncegate::audit=info`).
pub const AUDIT: &str = "oncegate::audit";

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Name of the per-RPC span (on the [`AUDIT`] target, so that routing the audit trail alone keeps
/// the principal and the action its events belong to).
pub const RPC_SPAN: &str = "rpc";

/// Target of the one event that ends each RPC: its status code (`grpc.code`, on the span) and
/// latency. `RUST_LOG=info,oncegate::rpc=warn` leaves it out.
pub const RPC_END: &str = "oncegate::rpc";

/// The fields of an incoming W3C Trace Context `traceparent` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceParent {
    /// 32 lowercase hex digits, not all zero.
    pub trace_id: String,
    /// The caller's span: 16 lowercase hex digits, not all zero.
    pub parent_id: String,
    /// The caller's `sampled` flag.
    pub sampled: bool,
}

impl TraceParent {
    /// Parses a `traceparent` value (W3C Trace Context, level 1): `00-<trace-id>-<parent-id>-<flags>`.
    /// A later version is read by its first four fields, as the recommendation asks; anything
    /// malformed is `None` (the gate then starts a new trace rather than trusting a broken one).
    pub fn parse(value: &str) -> Option<Self> {
        let value = value.trim();
        let bytes = value.as_bytes();
        if bytes.len() < 55 || !value.is_ascii() {
            return None;
        }
        let version = &value[..2];
        if !is_lower_hex(version) || version == "ff" {
            return None;
        }
        if version == "00" && bytes.len() != 55 {
            return None;
        }
        if bytes.len() > 55 && bytes[55] != b'-' {
            return None;
        }
        if bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
            return None;
        }
        let (trace_id, parent_id, flags) = (&value[3..35], &value[36..52], &value[53..55]);
        let non_zero = |s: &str| s.bytes().any(|b| b != b'0');
        let well_formed = [trace_id, parent_id, flags].into_iter().all(is_lower_hex)
            && non_zero(trace_id)
            && non_zero(parent_id);
        if !well_formed {
            return None;
        }
        let flags = u8::from_str_radix(flags, 16).ok()?;
        Some(Self {
            trace_id: trace_id.to_owned(),
            parent_id: parent_id.to_owned(),
            sampled: flags & 1 == 1,
        })
    }
}

fn is_lower_hex(s: &str) -> bool {
    s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Puts what the gate knows about the action on the current RPC span (a no-op outside one).
pub fn record_action(agent_id: &str, run_id: &str, action: Option<&str>, key: &str) {
    use tracing::field::display;
    on_rpc_span(|span| {
        span.record("agent_id", display(agent_id));
        span.record("run_id", display(run_id));
        if let Some(action) = action {
            span.record("action", display(action));
        }
        if !key.is_empty() {
            span.record("key", display(key));
        }
    });
}

/// Puts the gate's decision on the current RPC span (a no-op outside one).
pub fn record_decision(decision: &str) {
    on_rpc_span(|span| {
        span.record("decision", tracing::field::display(decision));
    });
}

/// Puts the authenticated caller on the current RPC span (a no-op outside one).
pub fn record_principal(principal: &str) {
    on_rpc_span(|span| {
        span.record("principal", tracing::field::display(principal));
    });
}

/// Whether an RPC span that logs is current: then it names the principal, the RPC and the action,
/// and an audit event need not repeat them.
pub fn in_rpc_span() -> bool {
    CURRENT_RPC
        .try_with(|span| !span.is_disabled())
        .unwrap_or(false)
}

tokio::task_local! {
    /// The span of the RPC being polled, so the gate can record on it even from inside a child
    /// span (the audit span that names the principal). Shared, not cloned, per poll: cloning a
    /// span is a trip through the subscriber's registry (and dropping the clone another).
    static CURRENT_RPC: Arc<Span>;
}

/// Runs `f` (one poll of an RPC) with `span` as the RPC span.
pub(crate) fn with_rpc_span<R>(span: &Arc<Span>, f: impl FnOnce() -> R) -> R {
    CURRENT_RPC.sync_scope(Arc::clone(span), f)
}

/// Runs `f` on the current RPC's span, or on the current span outside one.
fn on_rpc_span(f: impl FnOnce(&Span)) {
    let mut f = Some(f);
    let ran = CURRENT_RPC.try_with(|span| f.take().map(|f| f(span)));
    if ran.is_err()
        && let Some(f) = f
    {
        f(&Span::current());
    }
}

/// Keeps the tracing pipeline alive; dropping it flushes the OTLP exporter, if any.
#[must_use = "dropping the guard stops trace export"]
pub struct TelemetryGuard {
    #[cfg(feature = "otel")]
    otel: Option<otel::Pipeline>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        #[cfg(feature = "otel")]
        if let Some(pipeline) = self.otel.take() {
            pipeline.shutdown();
        }
    }
}

/// Logs (text or JSON, to stderr, filtered by `RUST_LOG`, `info` by default; the lines of a
/// current-thread runtime's busy stretch written together, [`hold_lines_on_current_thread`]) and,
/// with the `otel` feature and an endpoint, OTLP span export. With an endpoint, call from inside
/// the Tokio runtime (the exporter's gRPC channel lives on it). Without the feature the endpoint
/// is always `None`.
pub fn init(format: LogFormat, otlp_endpoint: Option<&str>) -> TelemetryGuard {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry()
        .with(filter)
        .with(lines(format));
    #[cfg(feature = "otel")]
    {
        let (pipeline, layer) = match otlp_endpoint.map(otel::Pipeline::start) {
            Some(Ok((pipeline, layer))) => (Some(pipeline), Some(layer)),
            Some(Err(e)) => {
                eprintln!("oncegate: OTLP export disabled: {e}");
                (None, None)
            }
            None => (None, None),
        };
        registry.with(layer).init();
        TelemetryGuard { otel: pipeline }
    }
    #[cfg(not(feature = "otel"))]
    {
        debug_assert!(otlp_endpoint.is_none(), "no OTLP without the otel feature");
        registry.init();
        TelemetryGuard {}
    }
}

/// The log lines of [`init`] (to stderr, text or JSON), as a layer.
fn lines<S>(format: LogFormat) -> Box<dyn tracing_subscriber::Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(held::HeldStderr)
        .with_ansi(false);
    match format {
        // tracing-subscriber's default format, written for less CPU per line (`text`).
        LogFormat::Text => fmt
            .event_format(text::TextFormat::default())
            .fmt_fields(text::TextFields)
            .boxed(),
        // The current span (the RPC's) is enough: the span list would repeat it.
        LogFormat::Json => fmt.json().flatten_event(true).with_span_list(false).boxed(),
    }
}

/// [`init`]'s log lines for a gate that runs inside another program (the Python client's
/// `oncegate.local`), filtered by `directives` (`RUST_LOG`'s syntax: `info`,
/// `warn,oncegate::audit=info`, ...), no OTLP. Installed only when the program has no tracing
/// subscriber yet: `Ok(false)` when it has one (its own then receives the gate's events).
pub fn try_init_embedded(format: LogFormat, directives: &str) -> Result<bool, String> {
    let filter = EnvFilter::try_new(directives).map_err(|e| format!("{directives:?}: {e}"))?;
    Ok(tracing_subscriber::registry()
        .with(filter)
        .with(lines(format))
        .try_init()
        .is_ok())
}

#[cfg(test)]
mod tests {
    use super::TraceParent;

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const SPAN: &str = "00f067aa0ba902b7";

    #[test]
    fn parses_the_w3c_example() {
        let tp = TraceParent::parse(&format!("00-{TRACE}-{SPAN}-01")).unwrap();
        assert_eq!(tp.trace_id, TRACE);
        assert_eq!(tp.parent_id, SPAN);
        assert!(tp.sampled);
        assert!(
            !TraceParent::parse(&format!("00-{TRACE}-{SPAN}-00"))
                .unwrap()
                .sampled
        );
    }

    #[test]
    fn later_versions_are_read_by_their_known_fields() {
        assert!(TraceParent::parse(&format!("01-{TRACE}-{SPAN}-01-extra")).is_some());
        assert!(TraceParent::parse(&format!("01-{TRACE}-{SPAN}-01x")).is_none());
    }

    #[test]
    fn refuses_malformed_values() {
        for bad in [
            String::new(),
            format!("ff-{TRACE}-{SPAN}-01"),
            format!("00-{TRACE}-{SPAN}-01-extra"),
            format!("00-{}-{SPAN}-01", "0".repeat(32)),
            format!("00-{TRACE}-{}-01", "0".repeat(16)),
            format!("00-{}-{SPAN}-01", TRACE.to_uppercase()),
            format!("00-{TRACE}-{SPAN}-0g"),
            format!("00_{TRACE}-{SPAN}-01"),
            format!("00-{TRACE}{SPAN}--01"),
            "00-é".repeat(20),
        ] {
            assert_eq!(TraceParent::parse(&bad), None, "{bad:?}");
        }
    }
}
