//! Redis Cluster and Sentinel deployments of the test's own: real `redis-server` processes on
//! free loopback ports, formed by the test and killed on drop.

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use tempfile::TempDir;

use super::redis::{RedisServer, free_port, wait_for_redis};

/// Sentinel's name for the master in every test deployment.
pub const MASTER_NAME: &str = "oncegate-test";

/// Polls `check` until it is true, panicking with `what` after `limit`.
pub fn wait_until(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One command on `127.0.0.1:port`, synchronously (errors as `Err`).
pub fn query<T: redis::FromRedisValue>(port: u16, cmd: &redis::Cmd) -> redis::RedisResult<T> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let mut conn = client.get_connection_with_timeout(Duration::from_secs(2))?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    cmd.query(&mut conn)
}

/// `INFO <section>` of a server as text ("" when it does not answer).
pub fn info(port: u16, section: &str) -> String {
    query(port, redis::cmd("INFO").arg(section)).unwrap_or_default()
}

/// A Redis Cluster: `masters` masters, each with `replicas` replicas.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts the servers, forms the cluster with `redis-cli --cluster create` and waits until
    /// every node reports `cluster_state:ok` (and every replica is in sync).
    pub fn start(masters: usize, replicas: usize) -> Self {
        let nodes: Vec<RedisServer> = (0..masters * (1 + replicas))
            .map(|_| {
                let bus = free_port().to_string();
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-port",
                    &bus,
                    "--cluster-node-timeout",
                    "2000",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli must be installed with redis-server");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        for node in &nodes {
            wait_until("the cluster is formed", Duration::from_secs(20), || {
                query::<String>(node.port, redis::cmd("CLUSTER").arg("INFO"))
                    .is_ok_and(|i| i.contains("cluster_state:ok"))
            });
        }
        if replicas > 0 {
            for node in &nodes {
                wait_until("replicas are in sync", Duration::from_secs(20), || {
                    let i = info(node.port, "replication");
                    i.contains("role:master") && i.matches("state=online").count() == replicas
                        || i.contains("master_link_status:up")
                });
            }
        }
        Self { nodes }
    }

    /// `127.0.0.1:port` of every node, for `--redis-cluster-nodes`.
    pub fn addrs(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect()
    }
}

/// A process started by the test, killed on drop.
struct Process {
    child: Option<Child>,
}

impl Process {
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A master with `replicas` replicas, watched by three sentinels (quorum 2).
pub struct SentinelSet {
    /// Data nodes; index 0 is the first master (after a failover, ask [`SentinelSet::master_port`]).
    pub servers: Vec<RedisServer>,
    pub sentinel_ports: Vec<u16>,
    /// Held for their drop, which kills them.
    _sentinels: Vec<Process>,
    _dir: TempDir,
}

impl SentinelSet {
    /// Starts the servers and three sentinels; returns once every sentinel sees the master and
    /// its replicas (and, with `peers`, the other sentinels, which a failover needs).
    pub fn start(replicas: usize, peers: bool) -> Self {
        let master = RedisServer::start();
        let master_port = master.port.to_string();
        let mut servers = vec![master];
        for _ in 0..replicas {
            servers.push(RedisServer::start_with(&[
                "--save",
                "",
                "--appendonly",
                "no",
                "--replicaof",
                "127.0.0.1",
                &master_port,
            ]));
        }
        let dir = TempDir::new().unwrap();
        let mut sentinel_ports = Vec::new();
        let mut sentinels = Vec::new();
        for i in 0..3 {
            let port = free_port();
            sentinels.push(spawn_sentinel(dir.path(), i, port, &master_port));
            sentinel_ports.push(port);
        }
        for &port in &sentinel_ports {
            wait_until(
                "the sentinels see the deployment",
                Duration::from_secs(30),
                || {
                    let seen = |what: &str| {
                        query::<Vec<redis::Value>>(
                            port,
                            redis::cmd("SENTINEL").arg(what).arg(MASTER_NAME),
                        )
                        .map(|v| v.len())
                        .unwrap_or(0)
                    };
                    seen("REPLICAS") == replicas && (!peers || seen("SENTINELS") == 2)
                },
            );
        }
        Self {
            servers,
            sentinel_ports,
            _sentinels: sentinels,
            _dir: dir,
        }
    }

    /// `127.0.0.1:port` of every sentinel, for `--redis-sentinels`.
    pub fn addrs(&self) -> Vec<String> {
        self.sentinel_ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect()
    }

    /// The master's port as the first sentinel that answers names it.
    pub fn master_port(&self) -> Option<u16> {
        self.sentinel_ports.iter().find_map(|&port| {
            query::<Vec<String>>(
                port,
                redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(MASTER_NAME),
            )
            .ok()
            .and_then(|v| v.get(1).and_then(|p| p.parse().ok()))
        })
    }

    /// The data node listening on `port`.
    pub fn server(&mut self, port: u16) -> &mut RedisServer {
        self.servers
            .iter_mut()
            .find(|s| s.port == port)
            .expect("a data node of this deployment")
    }
}

fn spawn_sentinel(dir: &Path, index: usize, port: u16, master_port: &str) -> Process {
    let conf = dir.join(format!("sentinel-{index}.conf"));
    std::fs::write(
        &conf,
        format!(
            "port {port}\nbind 127.0.0.1\ndir {dir}\n\
             sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
             sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
             sentinel failover-timeout {MASTER_NAME} 4000\n\
             sentinel parallel-syncs {MASTER_NAME} 2\n",
            dir = dir.display()
        ),
    )
    .unwrap();
    let child = Command::new("redis-server")
        .arg(&conf)
        .arg("--sentinel")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server must be installed");
    wait_for_redis(port);
    Process { child: Some(child) }
}
