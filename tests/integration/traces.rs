//! Tracing, black-box: one span per gate RPC carrying scope, action, key, decision and status,
//! linked to the caller's W3C `traceparent`, and never a param, receipt or token in any span or
//! event.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
};

use oncegate_proto as pb;

use crate::support::{Kind, TestGate, token_request};

/// A span's name and fields.
type SpanFields = (String, BTreeMap<String, String>);

/// Spans and events as a subscriber sees them: span id → name and fields, and every value logged.
#[derive(Clone, Default)]
struct Captured {
    spans: Arc<Mutex<HashMap<u64, SpanFields>>>,
    values: Arc<Mutex<Vec<String>>>,
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Captured {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        self.values.lock().unwrap().extend(fields.values().cloned());
        let name = attrs.metadata().name().to_owned();
        self.spans
            .lock()
            .unwrap()
            .insert(id.into_u64(), (name, fields));
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = BTreeMap::new();
        values.record(&mut Fields(&mut fields));
        self.values.lock().unwrap().extend(fields.values().cloned());
        if let Some((_, span)) = self.spans.lock().unwrap().get_mut(&id.into_u64()) {
            span.extend(fields);
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        self.values.lock().unwrap().extend(fields.into_values());
    }
}

impl Captured {
    fn rpc_spans(&self, method: &str) -> Vec<BTreeMap<String, String>> {
        let rpc = format!("oncegate.v1.ActionGateService/{method}");
        let spans = self.spans.lock().unwrap();
        spans
            .values()
            .filter(|(name, f)| name == "rpc" && f.get("rpc") == Some(&rpc))
            .map(|(_, f)| f.clone())
            .collect()
    }
}

fn traced<T>(msg: T, traceparent: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut()
        .insert("traceparent", traceparent.parse().unwrap());
    req
}

/// Set in the child process that runs the capture alone.
const ALONE: &str = "ONCEGATE_TRACES_ALONE";

/// Tracing's callsite interest is process-wide: a test on another thread, with no subscriber,
/// can leave the RPC span's callsite disabled for this test's thread-local subscriber. So the
/// capture runs in a process of its own: this test binary, re-run on this one test.
#[test]
fn rpc_span_carries_scope_action_key_decision_and_the_callers_trace() {
    if std::env::var_os(ALONE).is_some() {
        return tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(capture_one_rpc_of_each_kind());
    }
    let name = "traces::rpc_span_carries_scope_action_key_decision_and_the_callers_trace";
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--test-threads", "1", "--nocapture"])
        .env(ALONE, "1")
        .output()
        .unwrap();
    let shown = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && shown.contains("1 passed"),
        "{shown}"
    );
}

/// Single-threaded on purpose: the server's tasks run on this thread, under this subscriber.
async fn capture_one_rpc_of_each_kind() {
    use tracing_subscriber::layer::SubscriberExt;
    let captured = Captured::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(captured.clone()));
    let gate = TestGate::start(Kind::Embedded).await;
    let mut client = gate.client().await;
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = format!("00-{trace}-00f067aa0ba902b7-01");
    let req = token_request(
        "agent-t",
        "run-t",
        "payments.transfer",
        r#"{"iban":"secret-iban-DE00"}"#,
    );
    let resp = client
        .request_token(traced(req.clone(), &parent))
        .await
        .unwrap()
        .into_inner();
    let token = resp.grant.unwrap().token;
    let action = resp.action.unwrap();
    client.request_token(req).await.unwrap_err();
    client
        .complete(traced(
            pb::CompleteRequest {
                action: Some(action.clone()),
                token: token.clone(),
                receipt: b"secret-receipt".to_vec(),
            },
            &parent,
        ))
        .await
        .unwrap();

    let spans = captured.rpc_spans("RequestToken");
    assert_eq!(spans.len(), 2, "{spans:?}");
    let granted = spans
        .iter()
        .find(|s| s.get("decision").map(String::as_str) == Some("granted"))
        .unwrap();
    let expect = [
        ("agent_id", "agent-t"),
        ("run_id", "run-t"),
        ("action", "payments.transfer"),
        ("key", action.key.as_str()),
        ("grpc.code", "OK"),
        ("trace_id", trace),
        ("parent_span_id", "00f067aa0ba902b7"),
    ];
    for (field, value) in expect {
        assert_eq!(
            granted.get(field).map(String::as_str),
            Some(value),
            "{field} in {granted:?}"
        );
    }
    let refused = spans
        .iter()
        .find(|s| s.get("decision").map(String::as_str) == Some("in_progress"))
        .unwrap();
    assert_eq!(refused["grpc.code"], "ABORTED");
    assert!(
        !refused.contains_key("trace_id"),
        "no traceparent, no trace id"
    );
    let complete = captured.rpc_spans("Complete");
    assert_eq!(complete.len(), 1);
    assert_eq!(complete[0]["decision"], "completed");
    assert_eq!(complete[0]["key"], action.key);

    for value in captured.values.lock().unwrap().iter() {
        for secret in ["secret-iban", "secret-receipt", token.as_str()] {
            assert!(!value.contains(secret), "{secret:?} was logged: {value:?}");
        }
    }
}
