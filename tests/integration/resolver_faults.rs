//! The Rust resolver under a settlement that fails and may pass: the gate's stream sends an
//! unresolved action once, so a ResolveExpired answered UNAVAILABLE (its store did not answer)
//! while the stream stays open would leave the action for a person until the resolver restarts.
//! The resolver reopens its stream instead, and the gate sends the action again.
//!
//! The answer is injected by a stand-in for the gate's operator service (a real tonic server,
//! speaking the real protocol): a real gate cannot be made to fail one ResolveExpired while its
//! stream goes on without leaving the outcome of that call unknown (a paused Redis runs the
//! queued script when it resumes). What the resolver does with each answer is what is tested;
//! the gate's own answers are `resolvers.rs`'.

use std::{
    pin::Pin,
    sync::{Arc, Mutex},
    time::Duration,
};

use oncegate_client::{Lookup, Resolver};
use oncegate_proto::{
    self as pb,
    gate_admin_service_server::{GateAdminService, GateAdminServiceServer},
};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

/// What the stand-in saw, and the streams it holds open.
#[derive(Default)]
struct Seen {
    opens: usize,
    settlements: usize,
    settled: bool,
    streams: Vec<tokio::sync::mpsc::Sender<Result<pb::WatchUnresolvedResponse, Status>>>,
}

/// The gate's operator service with one unresolved action whose first settlement fails
/// UNAVAILABLE; its streams stay open.
#[derive(Clone, Default)]
struct FlakyGate {
    seen: Arc<Mutex<Seen>>,
    changed: Arc<tokio::sync::Notify>,
}

fn unresolved() -> pb::UnresolvedAction {
    pb::UnresolvedAction {
        action: Some(pb::ActionRef {
            scope: Some(pb::Scope {
                agent_id: "billing-1".into(),
                run_id: "run-1".into(),
            }),
            key: "invoice-9".into(),
        }),
        fencing: 7,
        provider_key: "og-0123".into(),
        action_name: "payments.transfer".into(),
        params_json: r#"{"amount":7}"#.into(),
        token: "t".into(),
        ..Default::default()
    }
}

type Unimplemented<T> = Result<Response<T>, Status>;

fn unimplemented<T>() -> Unimplemented<T> {
    Err(Status::unimplemented("not in this stand-in"))
}

#[tonic::async_trait]
impl GateAdminService for FlakyGate {
    type WatchUnresolvedStream =
        Pin<Box<dyn Stream<Item = Result<pb::WatchUnresolvedResponse, Status>> + Send>>;

    async fn watch_unresolved(
        &self,
        _: Request<pb::WatchUnresolvedRequest>,
    ) -> Result<Response<Self::WatchUnresolvedStream>, Status> {
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        {
            let mut seen = self.seen.lock().unwrap();
            seen.opens += 1;
            // What is unresolved when the stream opens, then nothing more: it stays open.
            if !seen.settled {
                tx.try_send(Ok(pb::WatchUnresolvedResponse {
                    action: Some(unresolved()),
                }))
                .unwrap();
            }
            seen.streams.push(tx);
        }
        self.changed.notify_waiters();
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn resolve_expired(
        &self,
        request: Request<pb::ResolveExpiredRequest>,
    ) -> Unimplemented<pb::ResolveExpiredResponse> {
        let req = request.into_inner();
        assert_eq!(req.expected_fencing, 7, "{req:?}");
        let first = {
            let mut seen = self.seen.lock().unwrap();
            seen.settlements += 1;
            seen.settled = seen.settlements > 1;
            seen.settlements == 1
        };
        self.changed.notify_waiters();
        match first {
            true => Err(Status::unavailable("the store did not answer in time")),
            false => Ok(Response::new(pb::ResolveExpiredResponse {
                fencing: 7,
                completion: None,
            })),
        }
    }

    async fn record_external_completion(
        &self,
        _: Request<pb::RecordExternalCompletionRequest>,
    ) -> Unimplemented<pb::RecordExternalCompletionResponse> {
        unimplemented()
    }
    async fn list_unresolved(
        &self,
        _: Request<pb::ListUnresolvedRequest>,
    ) -> Unimplemented<pb::ListUnresolvedResponse> {
        unimplemented()
    }
    async fn export_receipts(
        &self,
        _: Request<pb::ExportReceiptsRequest>,
    ) -> Unimplemented<pb::ExportReceiptsResponse> {
        unimplemented()
    }
    async fn decide_approval(
        &self,
        _: Request<pb::DecideApprovalRequest>,
    ) -> Unimplemented<pb::DecideApprovalResponse> {
        unimplemented()
    }
    async fn list_approvals(
        &self,
        _: Request<pb::ListApprovalsRequest>,
    ) -> Unimplemented<pb::ListApprovalsResponse> {
        unimplemented()
    }
    async fn get_budgets(
        &self,
        _: Request<pb::GetBudgetsRequest>,
    ) -> Unimplemented<pb::GetBudgetsResponse> {
        unimplemented()
    }
    async fn list_undeliverable_events(
        &self,
        _: Request<pb::ListUndeliverableEventsRequest>,
    ) -> Unimplemented<pb::ListUndeliverableEventsResponse> {
        unimplemented()
    }
    async fn create_console_login(
        &self,
        _: Request<pb::CreateConsoleLoginRequest>,
    ) -> Unimplemented<pb::CreateConsoleLoginResponse> {
        unimplemented()
    }
}

#[tokio::test]
async fn a_settlement_answered_unavailable_is_tried_again_on_a_reopened_stream() {
    let gate = FlakyGate::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(GateAdminServiceServer::new(gate.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    let lookups = Arc::new(Mutex::new(0));
    let counted = lookups.clone();
    let resolver = Resolver::new(channel)
        .backoff(Duration::from_millis(20), Duration::from_millis(200))
        .lookup("payments.transfer", move |u| {
            *counted.lock().unwrap() += 1;
            async move { Ok(Lookup::text(&format!("tx for {}", u.provider_key))) }
        });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(resolver.run(async {
        let _ = stopped.await;
    }));

    // Settled on the second try, after the resolver reopened its stream (the first stays open:
    // only a reopened one sends the action again).
    let settled = async {
        loop {
            let changed = gate.changed.notified();
            if gate.seen.lock().unwrap().settled {
                return;
            }
            changed.await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), settled)
        .await
        .expect("the action is settled once the settlement can pass");
    let _ = stop.send(());
    running.await.unwrap();
    let seen = gate.seen.lock().unwrap();
    assert_eq!(seen.settlements, 2, "failed once, then settled");
    assert!(
        seen.opens >= 2,
        "the stream was reopened: {} opens",
        seen.opens
    );
    assert_eq!(*lookups.lock().unwrap(), 2, "the provider was asked again");
}
