//! Test support: real `redis-server` processes on free loopback ports, gates in-process on
//! `127.0.0.1:0` or as real `oncegate` processes, and helpers to read rich gRPC errors.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use oncegate::{
    gate::Gate,
    pb::{self, action_gate_service_client::ActionGateServiceClient},
    policy::Policies,
    server::{self, ServerOptions},
    store::{
        Store,
        embedded::{EmbeddedStore, system_clock},
        redis::{RedisOptions, RedisStore},
    },
};
use tempfile::TempDir;
use tonic::{Code, Status, transport::Channel};
use tonic_types::StatusExt;

/// A free TCP port on 127.0.0.1 (bound and released; the OS does not hand it out again at once).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `redis-server` of the test's own, on a free loopback port, killed on drop.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: TempDir,
    extra: Vec<String>,
}

impl RedisServer {
    /// A Redis that keeps nothing on disk.
    pub fn start() -> Self {
        Self::start_with(&["--save", "", "--appendonly", "no"])
    }

    /// A Redis with extra command-line settings.
    pub fn start_with(extra: &[&str]) -> Self {
        let mut server = Self {
            port: free_port(),
            child: None,
            dir: TempDir::new().unwrap(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--dir",
            ])
            .arg(self.dir.path())
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (make test installs it on Debian)");
        self.child = Some(child);
        wait_for_redis(self.port);
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and directory.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn wait_for_redis(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) {
            let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
            if stream.write_all(b"PING\r\n").is_ok() {
                let mut buf = [0u8; 7];
                if stream.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n" {
                    return;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("redis-server on port {port} did not start");
}

/// Which store a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Embedded,
    Redis,
}

/// A store and whatever keeps it alive.
pub struct Backend {
    pub store: Store,
    pub redis: Option<RedisServer>,
    /// Keeps the embedded store's directory alive.
    pub _dir: Option<TempDir>,
}

/// A fresh, empty store of `kind`.
pub async fn backend(kind: Kind) -> Backend {
    match kind {
        Kind::Embedded => {
            let dir = TempDir::new().unwrap();
            let store = EmbeddedStore::open(dir.path(), system_clock()).unwrap();
            Backend {
                store: Store::Embedded(store),
                redis: None,
                _dir: Some(dir),
            }
        }
        Kind::Redis => {
            let redis = RedisServer::start();
            let store = RedisStore::connect(&redis.url(), RedisOptions::default())
                .await
                .unwrap();
            Backend {
                store: Store::Redis(store),
                redis: Some(redis),
                _dir: None,
            }
        }
    }
}

/// A gate served in-process on `127.0.0.1:0`, stopped on drop.
pub struct TestGate {
    pub addr: SocketAddr,
    pub backend: Backend,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl TestGate {
    /// Serves a fresh store of `kind` with default policies.
    pub async fn start(kind: Kind) -> Self {
        Self::start_with(kind, Policies::default()).await
    }

    /// Serves a fresh store of `kind` with `policies`.
    pub async fn start_with(kind: Kind, policies: Policies) -> Self {
        Self::serve(backend(kind).await, policies).await
    }

    /// Serves an existing backend.
    pub async fn serve(backend: Backend, policies: Policies) -> Self {
        Self::serve_with_options(backend, policies, ServerOptions::default()).await
    }

    /// Serves an existing backend with server options (TLS, message size); the health interval
    /// is always short.
    pub async fn serve_with_options(
        backend: Backend,
        policies: Policies,
        options: ServerOptions,
    ) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let gate = Gate::new(backend.store.clone(), policies);
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
            stop: Some(stop),
        }
    }

    /// A new client (its own HTTP/2 connection).
    pub async fn client(&self) -> ActionGateServiceClient<Channel> {
        connect(&self.addr.to_string()).await
    }
}

impl Drop for TestGate {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
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

/// A real `oncegate serve` process, killed (SIGKILL) on drop.
pub struct GateProcess {
    pub addr: String,
    child: Child,
}

impl GateProcess {
    /// Starts `oncegate serve --listen 127.0.0.1:0 <args>` and waits for its `listening on` line.
    pub fn spawn(args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_oncegate"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line from oncegate: {line:?}"))
            .to_owned();
        Self { addr, child }
    }

    /// Kills the process with SIGKILL, as a crash would.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        self.child.wait().unwrap()
    }
}

impl Drop for GateProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The ErrorInfo reason of a status (every oncegate error carries exactly one).
pub fn reason(status: &Status) -> String {
    status
        .get_error_details()
        .error_info()
        .unwrap_or_else(|| panic!("no ErrorInfo in {status:?}"))
        .reason
        .clone()
}

/// Asserts a status's code and reason, and returns its ErrorInfo metadata.
pub fn expect_error(
    status: &Status,
    code: Code,
    expected: &str,
) -> std::collections::HashMap<String, String> {
    assert_eq!(status.code(), code, "{status:?}");
    let details = status.get_error_details();
    let info = details
        .error_info()
        .unwrap_or_else(|| panic!("no ErrorInfo in {status:?}"));
    assert_eq!(info.reason, expected, "{status:?}");
    assert_eq!(info.domain, "oncegate");
    info.metadata.clone()
}

/// A RequestToken with the common fields filled in.
pub fn token_request(
    agent: &str,
    run: &str,
    action: &str,
    params: &str,
) -> pb::RequestTokenRequest {
    pb::RequestTokenRequest {
        scope: Some(pb::Scope {
            agent_id: agent.into(),
            run_id: run.into(),
        }),
        action: action.into(),
        params_json: params.into(),
        ..Default::default()
    }
}

/// Writes `text` to `name` in `dir` and returns the path.
pub fn write_file(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}
