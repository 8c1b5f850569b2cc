//! Runs the gRPC server on listeners bound before it serves ([`Listeners`]: the gRPC listener it
//! is given, a health-only one and the admin socket): the gate service and the operator API
//! behind the authenticator, gRPC health (overall and per service, the latter following the
//! store) and reflection (v1 and v1alpha, describing the error details too) without credentials,
//! TLS when configured, bounded messages, and a graceful drain with a deadline when `shutdown`
//! resolves.

use std::{future::Future, time::Duration};

use tokio::{
    net::{TcpListener, TcpStream},
    sync::mpsc,
};
use tokio_stream::{StreamExt as _, wrappers::TcpListenerStream};
use tonic::{
    service::interceptor::InterceptedService,
    transport::{Server, server::TcpIncoming},
};
use tonic_health::{ServingStatus, server::HealthReporter};

use super::{
    admin::AdminService,
    auth::{Authenticator, LoginCodes, Principals},
    one_write::OneWrite,
    service::GateService,
    serving::{Dealer, ServingThreads},
    tls::TlsSettings,
};
use oncegate_gate::Gate;
use oncegate_observe::telemetry::layer::RpcLayer;
use oncegate_proto as pb;

type Gated<S> = InterceptedService<S, Authenticator>;

/// Both gate services behind `auth`, their messages bounded; the worker service's sessions end
/// when `draining` turns `true`.
pub(crate) fn services(
    gate: &Gate,
    options: &ServerOptions,
    auth: Authenticator,
    draining: tokio::sync::watch::Receiver<bool>,
) -> (
    Gated<pb::action_gate_service_server::ActionGateServiceServer<GateService>>,
    Gated<pb::gate_admin_service_server::GateAdminServiceServer<AdminService>>,
) {
    let service = InterceptedService::new(
        pb::action_gate_service_server::ActionGateServiceServer::new(GateService::new(
            gate.clone(),
            draining,
        ))
        .max_decoding_message_size(options.max_message_bytes),
        auth.clone(),
    );
    let admin = InterceptedService::new(
        pb::gate_admin_service_server::GateAdminServiceServer::new(AdminService::new(
            gate.clone(),
            options.console_logins.clone(),
        ))
        .max_decoding_message_size(options.max_message_bytes),
        auth,
    );
    (service, admin)
}

/// The Unix socket at `path` that serves both gate services to the local operator, bound: the
/// socket is created mode 0600 (only the gate's user, and root, can connect), a stale one from an
/// earlier run is replaced, and a path that is not a socket is refused. Dropped, it removes its
/// socket file.
struct AdminSocket {
    listener: Option<tokio::net::UnixListener>,
    path: std::path::PathBuf,
}

impl AdminSocket {
    /// Binds `path`; `None` when another gate already serves it (replicas sharing a data
    /// directory): that one answers `oncegate admin`.
    fn bind(path: &std::path::Path) -> Result<Option<Self>, ServeError> {
        use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
        let failed = |source| ServeError::AdminSocket {
            path: path.to_owned(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(failed)?;
        }
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_socket() => {
                if std::os::unix::net::UnixStream::connect(path).is_ok() {
                    tracing::warn!(socket = %path.display(), "another gate serves this admin socket; this one serves none");
                    return Ok(None);
                }
                std::fs::remove_file(path).map_err(failed)?
            }
            Ok(_) => {
                return Err(failed(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    "exists and is not a socket; remove it or choose another --admin-socket",
                )));
            }
            Err(_) => {}
        }
        // Bound under a name of its own, set to owner read/write only, then linked into place:
        // the socket is never at `path` with the mode the umask gave it (anyone the umask let in
        // could connect, as the local operator, until the mode was set), and a socket another
        // gate put there meanwhile is not replaced (the link fails, as the bind did).
        let unready = path.with_file_name(format!(
            ".{}.{}",
            path.file_name().unwrap_or_default().to_string_lossy(),
            std::process::id()
        ));
        let _ = std::fs::remove_file(&unready);
        let listener = tokio::net::UnixListener::bind(&unready).map_err(failed)?;
        let placed = std::fs::set_permissions(&unready, std::fs::Permissions::from_mode(0o600))
            .and_then(|()| std::fs::hard_link(&unready, path));
        let _ = std::fs::remove_file(&unready);
        placed.map_err(failed)?;
        tracing::info!(socket = %path.display(), "admin socket: `oncegate admin` on this machine is the local operator");
        Ok(Some(Self {
            listener: Some(listener),
            path: path.to_owned(),
        }))
    }

    /// Serves both gate services on the socket until the task is aborted.
    fn serve(
        &mut self,
        gate: &Gate,
        options: &ServerOptions,
        rpc_layer: RpcLayer,
        draining: tokio::sync::watch::Receiver<bool>,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let listener = self.listener.take()?;
        let (service, admin) = services(gate, options, Authenticator::local(), draining);
        let server = Server::builder()
            .layer(rpc_layer)
            .add_service(service)
            .add_service(admin)
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener));
        Some(tokio::spawn(async move {
            if let Err(e) = server.await {
                tracing::error!(error = %e, "the admin socket stopped serving");
            }
        }))
    }
}

impl Drop for AdminSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The admin socket served on its own, for a gate in a process that serves no gRPC listener (the
/// MCP gateway's in-process gate): both services to the local operator, exactly as `oncegate
/// serve` serves them there, so that `oncegate admin` on the machine reaches that gate. Dropped,
/// it stops serving and removes its socket file.
pub struct AdminSocketServer {
    task: tokio::task::JoinHandle<()>,
    _socket: AdminSocket,
    // Kept so that the services' sessions see no drain until the socket goes.
    _draining: tokio::sync::watch::Sender<bool>,
}

impl AdminSocketServer {
    /// Binds `path` (as `oncegate serve` binds its admin socket) and serves `gate` on it with
    /// `options`' limits and console login codes. `None` when another live gate serves the
    /// socket already.
    pub fn start(
        path: &std::path::Path,
        gate: &Gate,
        options: &ServerOptions,
    ) -> Result<Option<Self>, ServeError> {
        let Some(mut socket) = AdminSocket::bind(path)? else {
            return Ok(None);
        };
        let (draining_tx, draining) = tokio::sync::watch::channel(false);
        let layer = RpcLayer::new(gate.metrics().clone());
        let Some(task) = socket.serve(gate, options, layer, draining) else {
            return Ok(None);
        };
        Ok(Some(Self {
            task,
            _socket: socket,
            _draining: draining_tx,
        }))
    }
}

impl Drop for AdminSocketServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Every listener of a server, bound before it serves: the gRPC listener it is given, and the
/// health-only listener and the admin socket its options ask for. Bound first, a port in use or
/// an unusable socket path fails the start, before the gate says it serves.
pub struct Listeners {
    grpc: TcpListener,
    health: Option<TcpListener>,
    admin: Option<AdminSocket>,
    serving: ServingThreads,
}

impl Listeners {
    /// Binds what `options` ask for beside `grpc`.
    pub async fn bind(grpc: TcpListener, options: &ServerOptions) -> Result<Self, ServeError> {
        let health = match options.health_listen {
            Some(addr) => {
                let listener = TcpListener::bind(addr)
                    .await
                    .map_err(|e| ServeError::HealthListen(addr, e))?;
                tracing::info!(addr = %listener.local_addr().unwrap_or(addr), "plaintext health-only listener");
                Some(listener)
            }
            None => None,
        };
        let admin = match &options.admin_socket {
            Some(path) => AdminSocket::bind(path)?,
            None => None,
        };
        let serving =
            ServingThreads::start(options.serving_threads).map_err(ServeError::ServingThreads)?;
        Ok(Self {
            grpc,
            health,
            admin,
            serving,
        })
    }
}

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
    /// A Unix socket (mode 0600) serving both gate services to the local operator: `oncegate
    /// admin` on the gate's machine needs no principal. `None`: no socket.
    pub admin_socket: Option<std::path::PathBuf>,
    /// The operator console's one-time login codes, issued by CreateConsoleLogin; `None` when
    /// the gate serves no console.
    pub console_logins: Option<LoginCodes>,
    /// How many threads the gRPC connections are dealt to, each with a current-thread runtime of
    /// its own; the runtime that runs the server is the first (`--serving-threads`).
    pub serving_threads: usize,
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
    #[error("cannot start the serving threads: {0}")]
    ServingThreads(std::io::Error),
    #[error("admin socket {}: {source}", path.display())]
    AdminSocket {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

/// Serves `gate` on `listener` until `shutdown` resolves, then drains in-flight calls for at most
/// `options.drain_timeout`: [`run_on`] over the [`Listeners`] bound here.
pub async fn run(
    listener: TcpListener,
    gate: Gate,
    options: ServerOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let listeners = Listeners::bind(listener, &options).await?;
    run_on(listeners, gate, options, shutdown).await
}

/// Serves `gate` on `listeners` until `shutdown` resolves, then drains in-flight calls for at
/// most `options.drain_timeout`.
pub async fn run_on(
    listeners: Listeners,
    gate: Gate,
    options: ServerOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let Listeners {
        grpc: listener,
        health: health_listener,
        admin: mut admin_socket,
        serving,
    } = listeners;
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
    let health_only = health_listener.map(|listener| {
        let server = Server::builder()
            .add_service(health.clone())
            .serve_with_incoming(TcpListenerStream::new(listener));
        tokio::spawn(server)
    });

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

    // Turns `true` when the drain starts: every serving thread stops, and open sessions end.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let rpc_layer = RpcLayer::new(gate.metrics().clone());
    let local = (admin_socket.as_mut())
        .and_then(|socket| socket.serve(&gate, &options, rpc_layer.clone(), stop_rx.clone()));
    // Both gate services sit behind the one authenticator; health and reflection stay open.
    let (service, admin) = services(
        &gate,
        &options,
        Authenticator::new(options.principals.clone()),
        stop_rx.clone(),
    );

    let mut builder = Server::builder();
    if let Some(tls) = &options.tls {
        builder = builder.tls_config(tls.config.clone())?;
    }
    // TCP_NODELAY on every accepted connection: with Nagle on, small replies wait for the
    // client's delayed ACK (~40 ms each on Linux). `Server::tcp_nodelay` does not reach a
    // listener passed in like this one, so the incoming stream sets it. Each connection's writes
    // are gathered until h2 flushes (`OneWrite`): a reply leaves in one segment.
    let wrap = if options.tls.is_some() {
        OneWrite::under_tls
    } else {
        OneWrite::new
    };
    let (threads, dealt): (Vec<_>, Vec<_>) = (1..serving.count())
        .map(|_| mpsc::unbounded_channel::<std::net::TcpStream>())
        .unzip();
    let mut dealer = Dealer::new(threads);
    let incoming = TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .filter_map(move |accepted| dealer.deal(accepted).map(|kept| kept.map(wrap)));
    let router = builder
        .layer(rpc_layer)
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(service)
        .add_service(admin);
    // The other serving threads: the same services on the connections dealt to them, drained
    // with this one.
    let stopped = |mut stop: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stop.wait_for(|stop| *stop).await;
    };
    let mut drained = Vec::with_capacity(dealt.len());
    let mut dealt = dealt.into_iter();
    serving.run(|index| {
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        drained.push(done_rx);
        let incoming = tokio_stream::wrappers::UnboundedReceiverStream::new(
            dealt.next().expect("a queue per serving thread"),
        )
        .map(move |std| TcpStream::from_std(std).map(wrap));
        let server = router
            .clone()
            .serve_with_incoming_shutdown(incoming, stopped(stop_rx.clone()));
        Box::pin(async move {
            if let Err(e) = server.await {
                tracing::error!(serving_thread = index, error = %e, "a serving thread stopped serving");
            }
            let _ = done_tx.send(());
        })
    });
    let all_drained = async move {
        for done in drained {
            let _ = done.await;
        }
    };
    let server = router.serve_with_incoming_shutdown(incoming, stopped(stop_rx));
    tokio::pin!(server);
    let result = tokio::select! {
        result = &mut server => {
            let _ = stop_tx.send(true);
            result.map_err(ServeError::from)
        }
        () = shutdown => {
            tracing::info!(drain_timeout = ?options.drain_timeout, "shutting down: no new calls, draining in-flight ones");
            let _ = stop_tx.send(true);
            let every_thread = async {
                let result = (&mut server).await;
                all_drained.await;
                result
            };
            match tokio::time::timeout(options.drain_timeout, every_thread).await {
                Ok(result) => result.map_err(ServeError::from),
                Err(_) => {
                    tracing::warn!("drain deadline passed with calls still in flight; stopping anyway");
                    Ok(())
                }
            }
        }
    };
    monitor.abort();
    if let Some(task) = local {
        task.abort();
    }
    // Its socket file goes with it.
    drop(admin_socket);
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

/// The system clock in Unix milliseconds.
fn wall_clock() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
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
///
/// When the store answers again after failing, the gate emits `store.unavailable` with when the
/// outage began and ended (its own clock: the store's could not be read meanwhile), written once
/// the store can take it.
async fn follow_store(reporter: HealthReporter, gate: Gate, interval: Duration) {
    let mut last = None;
    let mut down_since: Option<i64> = None;
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
        match (status, down_since) {
            (ServingStatus::NotServing, None) => down_since = Some(wall_clock()),
            (ServingStatus::Serving, Some(since)) => {
                gate.store_was_unavailable(since, wall_clock());
                down_since = None;
            }
            _ => {}
        }
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
