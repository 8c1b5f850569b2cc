//! The connection layer under the Redis store: one Redis deployment, reached as a standalone
//! server, a Cluster or a Sentinel-managed master, and the one way a script runs on it.
//!
//! Owns: opening connections for each topology. The lanes and sending `WAIT` right behind a script
//! are [`super::lanes`]'s; scripts, keys, deadlines and reply decoding `super`'s.

use std::{cell::Cell, sync::Arc};

use redis::{
    Cmd, ConnectionAddr, IntoConnectionInfo, RedisResult, Value,
    aio::{ConnectionManager, ConnectionManagerConfig},
    cluster::ClusterClient,
    cluster_async::ClusterConnection,
    cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo},
};

use super::{
    RedisOptions,
    lanes::{Lanes, Wait, lane_count, node_info, node_url, run_on},
    sentinel::SentinelConn,
};
use tokio::sync::OnceCell;

/// Which Redis deployment the store talks to. Exactly one is configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// One server (or a proxy in front of several), by URL: `redis://`, `rediss://`, `unix://`.
    Standalone { url: String },
    /// A Redis Cluster, found through any of these seed nodes (`host:port` or URLs).
    Cluster { nodes: Vec<String> },
    /// A master managed by Redis Sentinel: the sentinels (`host:port` or URLs) and the master's name.
    Sentinel {
        sentinels: Vec<String>,
        master: String,
    },
}

impl Topology {
    /// A short name for logs: `standalone`, `cluster`, `sentinel`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Standalone { .. } => "standalone",
            Self::Cluster { .. } => "cluster",
            Self::Sentinel { .. } => "sentinel",
        }
    }
}

impl Topology {
    /// Where it is, for messages: its name and addresses (`host:port` or a socket path, never a
    /// credential), e.g. `standalone at 127.0.0.1:6379`.
    pub fn describe(&self) -> String {
        let what = match self {
            Self::Standalone { .. } => "standalone".to_owned(),
            Self::Cluster { .. } => "cluster".to_owned(),
            Self::Sentinel { master, .. } => format!("sentinel master {master}"),
        };
        let addrs: Vec<String> = self
            .addresses()
            .iter()
            .map(|node| {
                node_url(node)
                    .as_str()
                    .into_connection_info()
                    .map_or_else(|_| "an unreadable address".into(), |i| i.addr().to_string())
            })
            .collect();
        format!("{what} at {}", addrs.join(", "))
    }

    /// Whether Redis runs on this machine: every address the gate is given is a loopback one
    /// (`localhost`, 127.0.0.0/8, `::1`) or a Unix socket. For Sentinel these are the sentinels'
    /// (the master's address is learnt from them at run time). An unreadable address is not.
    pub fn is_on_this_machine(&self) -> bool {
        self.addresses().iter().all(|node| {
            node_url(node)
                .as_str()
                .into_connection_info()
                .is_ok_and(|info| match info.addr() {
                    ConnectionAddr::Tcp(host, _) | ConnectionAddr::TcpTls { host, .. } => {
                        is_loopback(host)
                    }
                    ConnectionAddr::Unix(_) => true,
                    _ => false,
                })
        })
    }

    /// The addresses the gate is given: the URL, the seed nodes or the sentinels.
    fn addresses(&self) -> &[String] {
        match self {
            Self::Standalone { url } => std::slice::from_ref(url),
            Self::Cluster { nodes } => nodes,
            Self::Sentinel { sentinels, .. } => sentinels,
        }
    }
}

thread_local! {
    /// Which of the server's serving threads this is; 0 on every other thread.
    static SERVING_THREAD: Cell<usize> = const { Cell::new(0) };
}

/// The most serving threads whose calls get standalone connections of their own; a thread past
/// them shares the first thread's.
pub const MAX_SERVING_THREADS: usize = 64;

/// Marks the calling thread as the server's serving thread `index` (1 and up; the runtime that
/// starts the server is 0). A standalone store's calls that do not wait for replicas then go on a
/// connection opened on this thread, the first time it runs one: its commands and replies never
/// cross to another thread's runtime (BENCHMARKS.md, "What was tried").
pub fn serve_on_this_thread(index: usize) {
    SERVING_THREAD.set(index);
}

/// A standalone server's connections: the lanes every thread shares, and one more for each
/// serving thread but the first, opened by that thread.
pub struct Standalone {
    shared: Lanes<ConnectionManager>,
    client: redis::Client,
    config: ConnectionManagerConfig,
    serving_threads: Box<[OnceCell<ConnectionManager>]>,
}

impl Standalone {
    /// The connection for a call on this thread; `waits` when the call is followed by `WAIT`,
    /// which always goes on the shared lanes (they spread the waiting calls).
    async fn pick(&self, waits: bool) -> RedisResult<ConnectionManager> {
        let thread = SERVING_THREAD.get();
        match self.serving_threads.get(thread.wrapping_sub(1)) {
            Some(own) if !waits => own
                .get_or_try_init(|| {
                    ConnectionManager::new_with_config(self.client.clone(), self.config.clone())
                })
                .await
                .cloned(),
            _ => Ok(self.shared.pick(waits)),
        }
    }
}

/// A connection to the configured deployment. Cheap to clone.
#[derive(Clone)]
pub enum Conn {
    /// One server through self-reconnecting managers, one per lane, and one more per serving
    /// thread ([`serve_on_this_thread`]).
    Standalone(Arc<Standalone>),
    /// A Redis Cluster; each lane is a cluster connection (one multiplexed connection per node)
    /// that follows slot moves and failovers by itself.
    Cluster(Arc<Lanes<ClusterConnection>>),
    /// The master Sentinel names, re-resolved on failover (see `sentinel/`).
    Sentinel(SentinelConn),
}

impl Conn {
    /// Connects to `topology`. Fails when nothing answers within the call timeout.
    pub async fn connect(topology: &Topology, options: &RedisOptions) -> RedisResult<Self> {
        match topology {
            Topology::Standalone { url } => {
                let info = node_info(url, options)?;
                let client = redis::Client::open(info)?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(options.call_timeout))
                    .set_response_timeout(Some(options.call_timeout))
                    .set_number_of_retries(1);
                let mut lanes = Vec::new();
                for _ in 0..lane_count(options) {
                    lanes.push(
                        ConnectionManager::new_with_config(client.clone(), config.clone()).await?,
                    );
                }
                Ok(Self::Standalone(Arc::new(Standalone {
                    shared: Lanes::new(lanes),
                    client,
                    config,
                    serving_threads: (1..MAX_SERVING_THREADS).map(|_| OnceCell::new()).collect(),
                })))
            }
            Topology::Cluster { nodes } => {
                let infos = nodes
                    .iter()
                    .map(|node| node_info(node, options))
                    .collect::<RedisResult<Vec<_>>>()?;
                let mut builder = ClusterClient::builder(infos)
                    .connection_timeout(options.call_timeout)
                    .response_timeout(options.call_timeout)
                    .retries(2);
                if let Some(password) = &options.password {
                    builder = builder.password(password);
                }
                if let Some(username) = &options.username {
                    builder = builder.username(username);
                }
                let client = builder.build()?;
                let mut lanes = Vec::new();
                for _ in 0..lane_count(options) {
                    lanes.push(client.get_async_connection().await?);
                }
                Ok(Self::Cluster(Arc::new(Lanes::new(lanes))))
            }
            Topology::Sentinel { sentinels, master } => Ok(Self::Sentinel(
                SentinelConn::connect(sentinels, master, options).await?,
            )),
        }
    }

    /// Runs a script; with `wait`, `WAIT` follows it on the same connection in the same round
    /// trip. Returns the script's reply and how many replicas confirmed (0 without `wait`).
    pub async fn run(
        &self,
        invocation: &super::library::Call<'_>,
        wait: Option<Wait>,
    ) -> RedisResult<(Value, u32)> {
        match self {
            Self::Standalone(server) => {
                run_on(&mut server.pick(wait.is_some()).await?, invocation, wait).await
            }
            Self::Cluster(lanes) => run_on(&mut lanes.pick(wait.is_some()), invocation, wait).await,
            Self::Sentinel(conn) => conn.run(invocation, wait).await,
        }
    }

    /// `cmd` on every node the store writes to, as `(node, answer)`: the server, each Cluster
    /// master, or the master Sentinel names now.
    pub async fn query_writable_nodes(&self, cmd: &Cmd) -> RedisResult<Vec<(String, Value)>> {
        match self {
            Self::Standalone(_) | Self::Sentinel(_) => {
                let name = if matches!(self, Self::Sentinel(_)) {
                    "the master"
                } else {
                    "the server"
                };
                Ok(vec![(name.to_owned(), self.query(cmd).await?)])
            }
            Self::Cluster(lanes) => {
                let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                match lanes
                    .pick(false)
                    .route_command(cmd.clone(), routing)
                    .await?
                {
                    Value::Map(answers) => Ok(answers
                        .into_iter()
                        .map(|(node, answer)| {
                            let node = redis::from_redis_value::<String>(node)
                                .unwrap_or_else(|_| "a master".into());
                            (node, answer)
                        })
                        .collect()),
                    other => Ok(vec![("the cluster".into(), other)]),
                }
            }
        }
    }

    /// One plain command (PING, CONFIG GET) on the lane that never waits. On a Cluster it goes
    /// where redis-rs routes it (PING to every master; CONFIG GET to a random node).
    pub async fn query(&self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Self::Standalone(server) => cmd.query_async(&mut server.shared.pick(false)).await,
            Self::Cluster(lanes) => cmd.query_async(&mut lanes.pick(false)).await,
            Self::Sentinel(conn) => conn.query(cmd).await,
        }
    }
}

/// `localhost` or a loopback IP address (`[::1]` as a URL writes it, too).
fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topology_is_described_by_its_addresses_without_credentials() {
        let standalone = Topology::Standalone {
            url: "redis://gate:s3cret@10.0.0.1:6380/2".into(),
        };
        assert_eq!(standalone.describe(), "standalone at 10.0.0.1:6380");
        let sentinel = Topology::Sentinel {
            sentinels: vec!["10.0.0.2:26379".into(), "redis://:pw@10.0.0.3:26379".into()],
            master: "mymaster".into(),
        };
        assert_eq!(
            sentinel.describe(),
            "sentinel master mymaster at 10.0.0.2:26379, 10.0.0.3:26379"
        );
    }

    #[test]
    fn redis_is_on_this_machine_when_every_address_is_loopback_or_a_socket() {
        let standalone = |url: &str| Topology::Standalone { url: url.into() };
        for local in [
            "redis://127.0.0.1:6379",
            "redis://localhost:6379/2",
            "redis://127.0.0.2:6380",
            "redis://[::1]:6379",
            "unix:///run/redis.sock",
        ] {
            assert!(standalone(local).is_on_this_machine(), "{local}");
        }
        for elsewhere in [
            "redis://10.0.0.1:6379",
            "redis://redis.internal:6379",
            "not a url",
        ] {
            assert!(!standalone(elsewhere).is_on_this_machine(), "{elsewhere}");
        }
        let cluster = |nodes: &[&str]| Topology::Cluster {
            nodes: nodes.iter().map(|n| (*n).to_owned()).collect(),
        };
        assert!(cluster(&["127.0.0.1:7000", "localhost:7001"]).is_on_this_machine());
        assert!(!cluster(&["127.0.0.1:7000", "10.0.0.5:7001"]).is_on_this_machine());
        let sentinel = Topology::Sentinel {
            sentinels: vec!["127.0.0.1:26379".into()],
            master: "mymaster".into(),
        };
        assert!(sentinel.is_on_this_machine());
    }
}
