//! Test support: real `redis-server` processes on free loopback ports, gates in-process on
//! `127.0.0.1:0` or as real `oncegate` processes, and helpers to read rich gRPC errors. Cluster
//! and Sentinel deployments are in [`topology`].

pub mod topology;

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use oncegate::{
    config::{ConfigFile, defaults},
    gate::{Gate, policy::Policies},
    grpc::server::{self, ServerOptions},
    observe::metrics::{self, Metrics},
    pb::{self, action_gate_service_client::ActionGateServiceClient},
    store::{
        Store,
        embedded::{EmbeddedStore, system_clock},
        redis::{RedisOptions, RedisStore, Topology},
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

    /// Settings every test server gets: replicas sync at once instead of after the default
    /// 5 s diskless-sync delay.
    fn common_args() -> [&'static str; 2] {
        ["--repl-diskless-sync-delay", "0"]
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
            .args(Self::common_args())
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
    /// Standalone Redis.
    Redis,
    /// A Redis Cluster of three masters.
    Cluster,
    /// A Sentinel-managed master with one replica and three sentinels.
    Sentinel,
}

/// A store and whatever keeps it alive.
pub struct Backend {
    pub store: Store,
    pub redis: Option<RedisServer>,
    pub cluster: Option<topology::RedisCluster>,
    pub sentinel: Option<topology::SentinelSet>,
    /// Keeps the embedded store's directory alive.
    pub _dir: Option<TempDir>,
}

impl Backend {
    /// The `oncegate serve` flags that reach this backend's Redis.
    pub fn gate_args(&self) -> Vec<String> {
        if let Some(redis) = &self.redis {
            vec!["--redis-url".into(), redis.url()]
        } else if let Some(cluster) = &self.cluster {
            vec!["--redis-cluster-nodes".into(), cluster.addrs().join(",")]
        } else if let Some(sentinel) = &self.sentinel {
            vec![
                "--redis-sentinels".into(),
                sentinel.addrs().join(","),
                "--redis-sentinel-master".into(),
                topology::MASTER_NAME.into(),
                "--redis-sentinel-check-ms".into(),
                "200".into(),
            ]
        } else {
            panic!("the embedded store has no address")
        }
    }
}

/// Redis options for tests: fast Sentinel checks, otherwise the defaults.
pub fn test_options() -> RedisOptions {
    RedisOptions {
        sentinel_check_interval: Duration::from_millis(200),
        ..defaults::redis()
    }
}

/// The store call deadline of the tests' stores (the default).
pub const STORE_TIMEOUT: Duration = Duration::from_millis(defaults::STORE_TIMEOUT_MS);

/// Parses a configuration file's text (policies, limits, principals); panics when it is bad.
pub fn config(text: &str) -> ConfigFile {
    ConfigFile::parse(text).unwrap()
}

/// Parses a configuration file's text and keeps its policies.
pub fn policies(text: &str) -> Policies {
    config(text).policies
}

/// A fresh, empty store of `kind`.
pub async fn backend(kind: Kind) -> Backend {
    backend_with(kind, test_options()).await
}

/// A fresh, empty store of `kind` with these Redis options.
pub async fn backend_with(kind: Kind, options: RedisOptions) -> Backend {
    let (mut redis, mut cluster, mut sentinel) = (None, None, None);
    let topology = match kind {
        Kind::Embedded => {
            let dir = TempDir::new().unwrap();
            let store = EmbeddedStore::open(dir.path(), system_clock(), STORE_TIMEOUT).unwrap();
            return Backend {
                store: Store::Embedded(store),
                redis,
                cluster,
                sentinel,
                _dir: Some(dir),
            };
        }
        Kind::Redis => {
            let server = RedisServer::start();
            let url = server.url();
            redis = Some(server);
            Topology::Standalone { url }
        }
        Kind::Cluster => {
            let started = tokio::task::spawn_blocking(|| topology::RedisCluster::start(3, 0))
                .await
                .unwrap();
            let nodes = started.addrs();
            cluster = Some(started);
            Topology::Cluster { nodes }
        }
        Kind::Sentinel => {
            let started = tokio::task::spawn_blocking(|| topology::SentinelSet::start(1, false))
                .await
                .unwrap();
            let sentinels = started.addrs();
            sentinel = Some(started);
            Topology::Sentinel {
                sentinels,
                master: topology::MASTER_NAME.into(),
            }
        }
    };
    let store = RedisStore::connect_to(&topology, options).await.unwrap();
    Backend {
        store: Store::Redis(store),
        redis,
        cluster,
        sentinel,
        _dir: None,
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

    /// Serves a fresh store of `kind` with `config` (policies, and principals if any).
    pub async fn start_with(kind: Kind, config: impl Into<ConfigFile>) -> Self {
        Self::serve(backend(kind).await, config).await
    }

    /// Serves an existing backend.
    pub async fn serve(backend: Backend, config: impl Into<ConfigFile>) -> Self {
        Self::serve_with_options(backend, config, defaults::server()).await
    }

    /// Serves a fresh store of `kind` with `policies`, counting into a registry served on its own
    /// `/metrics` listener, whose address is returned.
    pub async fn start_with_metrics(kind: Kind, policies: Policies) -> (Self, SocketAddr) {
        let backend = backend(kind).await;
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Metrics::register(
            &mut registry,
            policies.names(),
            metrics::DEFAULT_OTHER_ACTION,
        );
        let gate = Gate::with_metrics(backend.store.clone(), policies, metrics);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let metrics_addr = listener.local_addr().unwrap();
        tokio::spawn(metrics::endpoint::serve(
            listener,
            std::sync::Arc::new(registry),
            std::future::pending(),
        ));
        let gate = Self::serve_gate(backend, gate, defaults::server()).await;
        (gate, metrics_addr)
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
        } = config.into();
        let gate = Gate::new(backend.store.clone(), policies);
        let options = ServerOptions {
            principals,
            ..options
        };
        Self::serve_gate(backend, gate, options).await
    }

    /// Serves `gate` over `backend` with server options.
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

/// One GET over plain HTTP/1.1 (`Connection: close`): the status code and the body.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"));
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_owned())
}

/// A parsed Prometheus text exposition: series name → (labels → value).
pub struct Scrape {
    series: Vec<(String, std::collections::BTreeMap<String, String>, f64)>,
}

impl Scrape {
    /// `GET /metrics` on `addr`, parsed.
    pub async fn fetch(addr: SocketAddr) -> Self {
        let (status, body) = http_get(addr, "/metrics").await;
        assert_eq!(status, 200, "{body}");
        Self::parse(&body)
    }

    /// Parses the text format (one sample per line; label values without escapes).
    pub fn parse(text: &str) -> Self {
        let mut series = Vec::new();
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let (name_labels, value) = line.rsplit_once(' ').unwrap();
            let value: f64 = value.parse().unwrap();
            let (name, labels) = match name_labels.split_once('{') {
                Some((name, rest)) => (name, rest.strip_suffix('}').unwrap()),
                None => (name_labels, ""),
            };
            let labels = labels
                .split(',')
                .filter(|kv| !kv.is_empty())
                .map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap();
                    (k.to_owned(), v.trim_matches('"').to_owned())
                })
                .collect();
            series.push((name.to_owned(), labels, value));
        }
        Self { series }
    }

    /// Every series of `name` as (labels, value).
    pub fn series(
        &self,
        name: &str,
    ) -> impl Iterator<Item = (&std::collections::BTreeMap<String, String>, f64)> {
        self.series
            .iter()
            .filter(move |(n, _, _)| n == name)
            .map(|(_, labels, value)| (labels, *value))
    }

    /// The value of the series of `name` whose labels include `labels` (summed over the rest).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.series(name)
            .filter(|(l, _)| {
                labels
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|(_, v)| v)
            .sum()
    }

    /// Every series name in the scrape.
    pub fn names(&self) -> std::collections::BTreeSet<&str> {
        self.series.iter().map(|(n, _, _)| n.as_str()).collect()
    }
}
