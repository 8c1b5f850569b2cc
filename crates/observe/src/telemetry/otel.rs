//! OpenTelemetry: OTLP/gRPC span export and W3C trace-context propagation. Compiled only with the
//! cargo feature `otel`.
//!
//! The RPC spans of [`super::layer`] become OTLP spans through `tracing-opentelemetry`; their parent
//! is the caller's context, extracted from the request headers by the W3C `TraceContextPropagator`,
//! so the gate's spans join the agent's trace.

use opentelemetry::{
    propagation::{Extractor, TextMapPropagator},
    trace::TracerProvider as _,
};
use opentelemetry_otlp::{SpanExporter, WithExportConfig};
use opentelemetry_sdk::{Resource, propagation::TraceContextPropagator, trace::SdkTracerProvider};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::registry::LookupSpan;

/// The running export pipeline; [`Pipeline::shutdown`] flushes it.
pub struct Pipeline {
    provider: SdkTracerProvider,
}

impl Pipeline {
    /// Starts batch export to the OTLP/gRPC `endpoint` (e.g. `http://otel-collector:4317`) and
    /// returns the layer that feeds it. Call inside the Tokio runtime.
    pub fn start<S>(
        endpoint: &str,
    ) -> Result<
        (
            Self,
            tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::Tracer>,
        ),
        String,
    >
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    {
        let exporter = SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .build()
            .map_err(|e| format!("cannot build the OTLP exporter for {endpoint}: {e}"))?;
        let resource = Resource::builder()
            .with_service_name("oncegate")
            .with_attribute(opentelemetry::KeyValue::new(
                "service.version",
                env!("CARGO_PKG_VERSION"),
            ))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("oncegate");
        let layer = tracing_opentelemetry::layer().with_tracer(tracer);
        Ok((Self { provider }, layer))
    }

    /// Flushes buffered spans and stops the exporter.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            eprintln!("oncegate: OTLP export did not shut down cleanly: {e}");
        }
    }
}

struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// Makes the caller's W3C trace context (`traceparent`, `tracestate`) the parent of `span`.
pub fn set_parent(span: &Span, headers: &http::HeaderMap) {
    if headers.contains_key("traceparent") {
        let cx = TraceContextPropagator::new().extract(&Headers(headers));
        // Fails only when the span is disabled or already started with another parent.
        let _ = span.set_parent(cx);
    }
}
