//! Runs the gRPC server on a listener it is given: the gate service and the operator API behind
//! the authenticator, gRPC health (overall and per service, the latter following the store) and
//! reflection (v1 and v1alpha, describing the error details too) without credentials, TLS when configured, bounded messages, and a
//! graceful drain with a deadline when `shutdown` resolves.

use std::{future::Future, time::Duration};

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{
    service::interceptor::InterceptedService,
    transport::{Server, server::TcpIncoming},
};
use tonic_health::{ServingStatus, server::HealthReporter};

use super::{
    admin::AdminService,
    auth::{Authenticator, Principals},
    service::GateService,
    tls::TlsSettings,
};
use oncegate_gate::Gate;
use oncegate_observe::telemetry::layer::RpcLayer;
use oncegate_proto as pb;

/// Name of the gate service in the health service (readiness follows the store under this name).
pub const SERVICE_NAME: &str = "oncegate.v1.ActionGateService";

/// Server settings that are not the gate's (defaults: [`oncegate_config::defaults::server`]).
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// How long in-flight calls may take to finish after shutdown begins.
    pub drain_timeout: Duration,
    /// Largest accepted request message.
    pub max_message_bytes: usize,
    /// How often the store is probed for the health service.
    pub health_interval: Duration,
    /// How often the unresolved actions are counted for `oncegate_unresolved_actions`.
    pub unresolved_interval: Duration,
    /// TLS (and mutual TLS) of the listener; plaintext when `None`.
    pub tls: Option<TlsSettings>,
    /// A second, plaintext listener that serves only `grpc.health.v1`, for probes that cannot
    /// speak TLS (Kubernetes gRPC probes) when the main listener does.
    pub health_listen: Option<std::net::SocketAddr>,
    /// Who may call the gate services; empty means an open gate.
    pub principals: Principals,
}

/// Why the server stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("health listener {0}: {1}")]
    HealthListen(std::net::SocketAddr, std::io::Error),
}

/// Serves `gate` on `listener` until `shutdown` resolves, then drains in-flight calls for at most
/// `options.drain_timeout`.
pub async fn run(
    listener: TcpListener,
    gate: Gate,
    options: ServerOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", ServingStatus::Serving)
        .await;
    // The gate's entry exists from the start: NOT_SERVING until the store first answers.
    reporter
        .set_service_status(SERVICE_NAME, ServingStatus::NotServing)
        .await;
    let counter = tokio::spawn(count_unresolved(gate.clone(), options.unresolved_interval));
    let monitor = tokio::spawn(follow_store(
        reporter,
        gate.clone(),
        options.health_interval,
    ));
    let health_only = match options.health_listen {
        Some(addr) => {
            let listener = TcpListener::bind(addr)
                .await
                .map_err(|e| ServeError::HealthListen(addr, e))?;
            tracing::info!(addr = %listener.local_addr().unwrap_or(addr), "plaintext health-only listener");
            let server = Server::builder()
                .add_service(health.clone())
                .serve_with_incoming(TcpListenerStream::new(listener));
            Some(tokio::spawn(server))
        }
        None => None,
    };

    // The error details too (google/rpc/error_details.proto): every error carries an ErrorInfo
    // (and RetryInfo or BadRequest) in an Any, which a reflection client such as grpcurl can only
    // decode when the server describes its type.
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_file_descriptor_set(error_details())
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_file_descriptor_set(error_details())
        .build_v1alpha()?;

    let rpc_layer = RpcLayer::new(gate.metrics().clone());
    // Both gate services sit behind the one authenticator; health and reflection stay open.
    let auth = Authenticator::new(options.principals.clone());
    let service = InterceptedService::new(
        pb::action_gate_service_server::ActionGateServiceServer::new(GateService::new(
            gate.clone(),
        ))
        .max_decoding_message_size(options.max_message_bytes),
        auth.clone(),
    );
    let admin = InterceptedService::new(
        pb::gate_admin_service_server::GateAdminServiceServer::new(AdminService::new(gate))
            .max_decoding_message_size(options.max_message_bytes),
        auth,
    );

    let mut builder = Server::builder();
    if let Some(tls) = &options.tls {
        builder = builder.tls_config(tls.config.clone())?;
    }
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    // TCP_NODELAY on every accepted connection: with Nagle on, small replies wait for the
    // client's delayed ACK (~40 ms each on Linux). `Server::tcp_nodelay` does not reach a
    // listener passed in like this one, so the incoming stream sets it.
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let server = builder
        .layer(rpc_layer)
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(service)
        .add_service(admin)
        .serve_with_incoming_shutdown(incoming, async {
            let _ = stop_rx.await;
        });
    tokio::pin!(server);
    let result = tokio::select! {
        result = &mut server => result.map_err(ServeError::from),
        () = shutdown => {
            tracing::info!(drain_timeout = ?options.drain_timeout, "shutting down: no new calls, draining in-flight ones");
            let _ = stop_tx.send(());
            match tokio::time::timeout(options.drain_timeout, &mut server).await {
                Ok(result) => result.map_err(ServeError::from),
                Err(_) => {
                    tracing::warn!("drain deadline passed with calls still in flight; stopping anyway");
                    Ok(())
                }
            }
        }
    };
    monitor.abort();
    counter.abort();
    if let Some(task) = health_only {
        task.abort();
    }
    result
}

/// The descriptors of `google/rpc/error_details.proto` and `google/rpc/status.proto` (with the
/// well-known types they import), as clients know them: tonic-types names them without their
/// directory, and a client resolving an import by its usual name would not find them.
fn error_details() -> prost_types::FileDescriptorSet {
    let mut set = <prost_types::FileDescriptorSet as prost::Message>::decode(
        tonic_types::pb::FILE_DESCRIPTOR_SET,
    )
    .unwrap_or_default();
    for file in &mut set.file {
        for name in file.name.iter_mut().chain(file.dependency.iter_mut()) {
            if !name.contains('/') {
                *name = format!("google/rpc/{name}");
            }
        }
    }
    set
}

/// The most unresolved actions one count looks for (the gauge says "at least this many" beyond).
const UNRESOLVED_COUNT_CAP: usize = 10_000;

/// Keeps `oncegate_unresolved_actions` current: an unresolved action never expires, so the gauge
/// (and the alert on it) stays up until someone reconciles it.
async fn count_unresolved(gate: Gate, interval: Duration) {
    loop {
        if let Err(e) = gate.count_unresolved(UNRESOLVED_COUNT_CAP).await {
            tracing::debug!(error = %e, "could not count the unresolved actions");
        }
        tokio::time::sleep(interval).await;
    }
}

/// Keeps the per-service health entry in step with the store: NOT_SERVING while it is unreachable,
/// SERVING when it answers again. The overall entry stays SERVING (liveness must not restart a
/// healthy process because Redis is down).
async fn follow_store(reporter: HealthReporter, gate: Gate, interval: Duration) {
    let mut last = None;
    loop {
        let status = match tokio::time::timeout(
            interval.max(Duration::from_millis(200)),
            gate.store().ping(),
        )
        .await
        {
            Ok(Ok(())) => ServingStatus::Serving,
            Ok(Err(e)) => {
                if last != Some(ServingStatus::NotServing) {
                    tracing::warn!(error = %e, "store unreachable: reporting NOT_SERVING");
                }
                ServingStatus::NotServing
            }
            Err(_) => ServingStatus::NotServing,
        };
        gate.metrics()
            .set_store_up(status == ServingStatus::Serving);
        if last != Some(status) {
            if last.is_some() && status == ServingStatus::Serving {
                tracing::info!("store reachable again: reporting SERVING");
            }
            reporter.set_service_status(SERVICE_NAME, status).await;
            last = Some(status);
        }
        tokio::time::sleep(interval).await;
    }
}
