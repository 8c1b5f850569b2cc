//! Gates to test against: in-process on `127.0.0.1:0` over a [`Backend`] ([`TestGate`]), or as real
//! `oncegate serve` processes ([`GateProcess`]; [`LoggedGate`] when the test reads the log;
//! [`serve_to_exit`] when it must not start), and a client that waits for one to listen
//! ([`connect`]).

use std::{
    ffi::OsStr,
    io::{BufRead, BufReader, Read},
    net::SocketAddr,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use oncegate_config::{ConfigFile, defaults};
use oncegate_gate::{Emitter, Gate, policy::Policies};
use oncegate_grpc::server::{self, ServerOptions};
use oncegate_observe::metrics::{self, Metrics};
use oncegate_proto::{
    action_gate_service_client::ActionGateServiceClient,
    gate_admin_service_client::GateAdminServiceClient,
};
use tempfile::TempDir;
use tonic::transport::Channel;

use super::{
    clock::StoreTime,
    stores::{Backend, Kind, backend, backend_with_test_clock},
};

/// A gate served in-process on `127.0.0.1:0`, stopped on drop.
pub struct TestGate {
    pub addr: SocketAddr,
    pub backend: Backend,
    /// How the store's time passes: a test clock only when started by
    /// [`TestGate::start_with_test_clock`] on the embedded store, the system clock otherwise.
    pub time: StoreTime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// The webhook tasks, when the gate delivers webhooks.
    notify: Option<oncegate_notify::Running>,
}

impl TestGate {
    /// Serves a fresh store of `kind` with default policies.
    pub async fn start(kind: Kind) -> Self {
        Self::start_with(kind, Policies::default()).await
    }

    /// Serves a fresh store of `kind` with `config` (policies, and principals if any).
    pub async fn start_with(kind: Kind, config: impl Into<ConfigFile>) -> Self {
        Self::serve(backend(kind).await, config).await
    }

    /// Like [`TestGate::start_with`], with the store's time in the test's hands where it can be:
    /// the embedded store on a test clock that [`TestGate::time`] advances; Redis on its own.
    pub async fn start_with_test_clock(kind: Kind, config: impl Into<ConfigFile>) -> Self {
        let (backend, time) = backend_with_test_clock(kind).await;
        let mut gate = Self::serve(backend, config).await;
        gate.time = time;
        gate
    }

    /// Serves an existing backend.
    pub async fn serve(backend: Backend, config: impl Into<ConfigFile>) -> Self {
        Self::serve_with_options(backend, config, defaults::server()).await
    }

    /// Serves a fresh store of `kind` with `policies`, counting into a registry served on its own
    /// `/metrics` listener, whose address is returned.
    pub async fn start_with_metrics(kind: Kind, policies: Policies) -> (Self, SocketAddr) {
        Self::start_with_config_and_metrics(kind, policies.into()).await
    }

    /// Serves an existing backend with server options (TLS, message size) and the configuration
    /// file's principals; the health interval is always short.
    pub async fn serve_with_options(
        backend: Backend,
        config: impl Into<ConfigFile>,
        options: ServerOptions,
    ) -> Self {
        let ConfigFile {
            policies,
            principals,
            authorization,
            ..
        } = config.into();
        let gate = Gate::new(backend.store.clone(), policies).with_authorization(authorization);
        let options = ServerOptions {
            principals,
            ..options
        };
        Self::serve_gate(backend, gate, options).await
    }

    /// Serves `gate` over `backend` with server options; the health interval is always short.
    pub async fn serve_gate(backend: Backend, gate: Gate, options: ServerOptions) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let options = ServerOptions {
            health_interval: Duration::from_millis(100),
            ..options
        };
        tokio::spawn(server::run(listener, gate, options, async {
            let _ = stopped.await;
        }));
        Self {
            addr,
            backend,
            time: StoreTime::System,
            stop: Some(stop),
            notify: None,
        }
    }

    /// Serves `backend` with `config`, its webhooks delivered (the writer, worker and scan run as
    /// `oncegate serve` runs them), counting into a registry served on its own `/metrics`
    /// listener, whose address is returned. The health interval is short.
    pub async fn serve_with_webhooks(backend: Backend, config: ConfigFile) -> (Self, SocketAddr) {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Metrics::register(
            &mut registry,
            config.policies.names(),
            metrics::DEFAULT_OTHER_ACTION,
        );
        let (emitter, events) = Emitter::channel(config.notifications.wanted());
        let gate = Gate::with_metrics(backend.store.clone(), config.policies, metrics.clone())
            .with_authorization(config.authorization)
            .with_events(emitter);
        let running =
            oncegate_notify::start(backend.store.clone(), metrics, config.notifications, events);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let metrics_addr = listener.local_addr().unwrap();
        tokio::spawn(metrics::endpoint::serve(
            listener,
            std::sync::Arc::new(registry),
            std::future::pending(),
        ));
        let options = ServerOptions {
            principals: config.principals,
            ..defaults::server()
        };
        let mut gate = Self::serve_gate(backend, gate, options).await;
        gate.notify = Some(running);
        (gate, metrics_addr)
    }

    /// Serves a fresh store of `kind` with `config`, and the operator console over the same gate
    /// (keeping its recent decisions, issuing login codes through CreateConsoleLogin) on its own
    /// `127.0.0.1:0` listener, whose base URL is returned. The store's time is the test's where
    /// it can be, as in [`TestGate::start_with_test_clock`].
    pub async fn start_with_console(kind: Kind, config: ConfigFile) -> (Self, String) {
        let (backend, time) = backend_with_test_clock(kind).await;
        let ConfigFile {
            policies,
            principals,
            authorization,
            ..
        } = config;
        let metrics = Metrics::register(
            &mut prometheus_client::registry::Registry::default(),
            policies.names(),
            metrics::DEFAULT_OTHER_ACTION,
        );
        let gate = Gate::with_metrics(backend.store.clone(), policies, metrics)
            .with_authorization(authorization)
            .with_recent_decisions(oncegate_console::RECENT_DECISIONS);
        let logins = oncegate_grpc::auth::LoginCodes::default();
        let console =
            oncegate_console::Console::new(gate.clone(), principals.clone(), logins.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(oncegate_console::serve(
            listener,
            console,
            std::future::pending(),
        ));
        let options = ServerOptions {
            principals,
            console_logins: Some(logins),
            ..defaults::server()
        };
        let mut gate = Self::serve_gate(backend, gate, options).await;
        gate.time = time;
        (gate, url)
    }

    /// A new client (its own HTTP/2 connection).
    pub async fn client(&self) -> ActionGateServiceClient<Channel> {
        connect(&self.addr.to_string()).await
    }

    /// A new client of the operator API.
    pub async fn admin(&self) -> GateAdminServiceClient<Channel> {
        let endpoint = format!("http://{}", self.addr);
        GateAdminServiceClient::connect(endpoint).await.unwrap()
    }

    /// Serves a fresh store of `kind` with `config` (policies, principals, authorization),
    /// counting into a registry served on its own `/metrics` listener, whose address is returned.
    pub async fn start_with_config_and_metrics(
        kind: Kind,
        config: ConfigFile,
    ) -> (Self, SocketAddr) {
        let backend = backend(kind).await;
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Metrics::register(
            &mut registry,
            config.policies.names(),
            metrics::DEFAULT_OTHER_ACTION,
        );
        let gate = Gate::with_metrics(backend.store.clone(), config.policies, metrics)
            .with_authorization(config.authorization);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let metrics_addr = listener.local_addr().unwrap();
        tokio::spawn(metrics::endpoint::serve(
            listener,
            std::sync::Arc::new(registry),
            std::future::pending(),
        ));
        // The unresolved actions are counted often, so that a test sees the gauge move.
        let options = ServerOptions {
            principals: config.principals,
            unresolved_interval: Duration::from_millis(200),
            ..defaults::server()
        };
        (Self::serve_gate(backend, gate, options).await, metrics_addr)
    }
}

impl Drop for TestGate {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.notify.take();
    }
}

/// A client on `addr` (`host:port`), retrying the connection for a few seconds.
pub async fn connect(addr: &str) -> ActionGateServiceClient<Channel> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match ActionGateServiceClient::connect(format!("http://{addr}")).await {
            Ok(client) => return client,
            Err(e) if Instant::now() > deadline => panic!("cannot connect to {addr}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// The `oncegate` binary under test.
pub fn oncegate_command() -> Command {
    Command::new(env!("CARGO_BIN_EXE_oncegate"))
}

/// `oncegate` under a limit of one task (`prlimit --nproc=1:1`), so that the system refuses it
/// every thread. As root, whom the limit does not hold, it runs as a user id of its own, which is
/// given `owned` (what the command reads or writes): the limit counts every task of that user, so
/// two such commands at once must not share one (a test process's id and a count make it).
pub fn oncegate_without_threads(owned: &[&Path]) -> Command {
    static MADE: AtomicU32 = AtomicU32::new(0);
    let mut command = Command::new("prlimit");
    command.arg("--nproc=1:1");
    if std::fs::metadata("/proc/self").unwrap().uid() == 0 {
        let made = MADE.fetch_add(1, Ordering::Relaxed) % 16;
        let uid = 1_000_000 + std::process::id() * 16 + made;
        for path in owned {
            std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
        }
        let id = uid.to_string();
        command.args(["setpriv", "--reuid", &id, "--regid", &id, "--clear-groups"]);
    }
    command.arg(env!("CARGO_BIN_EXE_oncegate"));
    command
}

/// `oncegate serve` with one worker thread on a Redis of its own, with `args`, refused every
/// thread ([`oncegate_without_threads`], given `owned`), run to its exit: the exit code and
/// standard error, logged at `info`. One worker thread is Tokio's current-thread scheduler, so the
/// first thread refused is one the gate itself asks for.
pub fn serve_on_redis_without_threads(owned: &[&Path], args: &[&str]) -> (Option<i32>, String) {
    let redis = super::RedisServer::start();
    let mut command = oncegate_without_threads(owned);
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--no-admin-socket"])
        .args(["--redis-url", &redis.url(), "--worker-threads", "1"])
        .args(args)
        .env_remove("ONCEGATE_DATA_DIR")
        .env_remove("ONCEGATE_API_KEY")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null());
    run_to_exit(command)
}

/// Sends SIGTERM to `child` and waits for its exit status.
fn terminate(child: &mut Child) -> std::process::ExitStatus {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    child.wait().unwrap()
}

/// Reads the `listening on <addr>` line a starting `oncegate serve` prints first; `None` when the
/// first line is something else (the process failed to start).
fn listening_on(child: &mut Child) -> (Option<String>, String) {
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line.trim().strip_prefix("listening on ").map(str::to_owned);
    (addr, line)
}

/// `--no-admin-socket` unless `args` choose a data directory or an admin socket: a gate on Redis
/// started without either would open `./oncegate-data/admin.sock` in the checkout, shared by every
/// such test.
fn no_stray_admin_socket<S: AsRef<OsStr>>(args: &[S]) -> Option<&'static str> {
    let chosen = args.iter().any(|arg| {
        let arg = arg.as_ref().to_string_lossy();
        arg.contains("data-dir") || arg.contains("admin-socket")
    });
    (!chosen).then_some("--no-admin-socket")
}

/// Runs `oncegate serve --listen 127.0.0.1:0 <args>` to its exit, killed after 20 s (the code is
/// then `None`): the exit code and standard error.
pub fn serve_to_exit<S: AsRef<OsStr>>(args: &[S]) -> (Option<i32>, String) {
    let mut command = oncegate_command();
    command
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(args)
        .args(no_stray_admin_socket(args))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null());
    run_to_exit(command)
}

/// Runs `command` to its exit, killed after 20 s (the code is then `None`): the exit code and
/// standard error.
pub fn run_to_exit(mut command: Command) -> (Option<i32>, String) {
    let mut child = command.stderr(Stdio::piped()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (status.code(), stderr)
}

/// A real `oncegate serve` process, killed (SIGKILL) on drop.
pub struct GateProcess {
    pub addr: String,
    child: Child,
}

impl GateProcess {
    /// Starts `oncegate serve --listen 127.0.0.1:0 <args>` and waits for its `listening on` line.
    pub fn spawn(args: &[&str]) -> Self {
        let mut child = oncegate_command()
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .args(no_stray_admin_socket(args))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let (addr, line) = listening_on(&mut child);
        let addr = addr.unwrap_or_else(|| panic!("unexpected first line from oncegate: {line:?}"));
        Self { addr, child }
    }

    /// Kills the process with SIGKILL, as a crash would.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        terminate(&mut self.child)
    }
}

impl Drop for GateProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A real `oncegate serve` process on the embedded store in `dir/data` (or on the store its
/// arguments name), logging at `info` into a file the test reads; killed on drop.
pub struct LoggedGate {
    pub addr: String,
    child: Child,
    log: PathBuf,
}

impl LoggedGate {
    /// Starts `oncegate serve --data-dir <dir>/data <args>` (`args` choose the listener) and waits
    /// for its `listening on` line.
    pub fn start(dir: &TempDir, args: &[&str]) -> Self {
        let data = dir.path().join("data");
        let mut with_data = vec!["--data-dir", data.to_str().unwrap()];
        with_data.extend_from_slice(args);
        Self::serve(dir, &with_data)
    }

    /// Starts `oncegate serve <args>` (`args` choose the store and the listener), logging into
    /// `dir/gate.log`, and waits for its `listening on` line.
    pub fn serve(dir: &TempDir, args: &[&str]) -> Self {
        let log = dir.path().join("gate.log");
        let mut child = oncegate_command()
            .arg("serve")
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let (addr, line) = listening_on(&mut child);
        let addr = addr.unwrap_or_else(|| {
            panic!(
                "unexpected first line {line:?}: {}",
                std::fs::read_to_string(&log).unwrap()
            )
        });
        Self { addr, child, log }
    }

    /// The log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap()
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        terminate(&mut self.child)
    }

    /// Sends SIGHUP (the gate reloads its authorization policies).
    pub fn hangup(&self) {
        let status = Command::new("kill")
            .arg("-HUP")
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits (at most 10 s) until the log holds `needle` `times` times, and returns the log.
    pub fn wait_for_log(&self, needle: &str, times: usize) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.log();
            if log.matches(needle).count() >= times {
                return log;
            }
            assert!(Instant::now() < deadline, "{needle:?} not logged: {log}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for LoggedGate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
