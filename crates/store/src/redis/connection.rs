//! The connection layer under the Redis store: one Redis deployment, reached as a standalone
//! server, a Cluster or a Sentinel-managed master, and the one way a script runs on it.
//!
//! Owns: opening connections for each topology, the lanes (separate connections for calls that
//! wait for replicas), and sending `WAIT` right behind a script on the same connection.
//! Does not own: scripts, keys, deadlines or reply decoding (`super`, i.e. `store/redis.rs`).
//!
//! Why lanes: `WAIT` blocks the Redis client connection it is sent on until the replicas answer,
//! and every command queued behind it on that connection waits too. Calls without a durability
//! level therefore never share a connection with calls that wait, and waiting calls are spread
//! over a few connections so that one slow `WAIT` does not hold up all the others.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use redis::{
    AsyncConnectionConfig, Cmd, ConnectionInfo, IntoConnectionInfo, RedisError, RedisFuture,
    RedisResult, ScriptInvocation, Value,
    aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig},
    cluster::ClusterClient,
    cluster_async::ClusterConnection,
    cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo},
};

use super::{RedisOptions, sentinel::SentinelConn};

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
        let (nodes, what) = match self {
            Self::Standalone { url } => (std::slice::from_ref(url), "standalone".to_owned()),
            Self::Cluster { nodes } => (nodes.as_slice(), "cluster".to_owned()),
            Self::Sentinel { sentinels, master } => {
                (sentinels.as_slice(), format!("sentinel master {master}"))
            }
        };
        let addrs: Vec<String> = nodes
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
}

/// `host:port` becomes `redis://host:port`; a URL stays as it is.
fn node_url(node: &str) -> String {
    if node.contains("://") {
        node.to_owned()
    } else {
        format!("redis://{node}")
    }
}

/// A node's connection settings, from its URL or `host:port` ([`node_url`]). The configured
/// username and password apply to data nodes whose URL names none. Nagle is off on every
/// connection.
pub(super) fn node_info(node: &str, options: &RedisOptions) -> RedisResult<ConnectionInfo> {
    let info = node_url(node).as_str().into_connection_info()?;
    let mut settings = info.redis_settings().clone();
    if settings.password().is_none() {
        if let Some(password) = &options.password {
            settings = settings.set_password(password);
        }
        if let (None, Some(username)) = (settings.username(), &options.username) {
            settings = settings.set_username(username);
        }
    }
    // TCP_NODELAY: every call is one small request on a multiplexed connection; with Nagle on
    // (redis-rs's default) a request can wait for the previous reply's ACK.
    Ok(info
        .set_redis_settings(settings)
        .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true)))
}

/// Connection settings every topology shares: connect and response deadlines.
pub(super) fn async_config(options: &RedisOptions) -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_connection_timeout(Some(options.call_timeout))
        .set_response_timeout(Some(options.call_timeout))
}

/// Lane 0 carries calls that do not wait; lanes 1.. carry the calls that do, in turn.
pub(super) struct Lanes<C> {
    conns: Vec<C>,
    next: AtomicUsize,
}

impl<C: Clone> Lanes<C> {
    pub(super) fn new(conns: Vec<C>) -> Self {
        assert!(!conns.is_empty(), "at least one lane");
        Self {
            conns,
            next: AtomicUsize::new(0),
        }
    }

    /// The connection for a call; `waits` when the call is followed by `WAIT`.
    pub(super) fn pick(&self, waits: bool) -> C {
        let waiting = self.conns.len() - 1;
        if !waits || waiting == 0 {
            return self.conns[0].clone();
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % waiting;
        self.conns[1 + i].clone()
    }
}

/// How many lanes to open: one for calls that do not wait, plus the waiting ones (with none, a
/// call that waits shares lane 0).
pub(super) fn lane_count(options: &RedisOptions) -> usize {
    1 + options.wait_lanes
}

/// `WAIT replicas timeout`, sent right behind a state-changing script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    /// Replicas that must confirm (at least 1).
    pub replicas: u32,
    /// How long Redis waits for them (WAIT's own timeout; never 0, which would block forever).
    pub timeout: Duration,
}

/// A connection to the configured deployment. Cheap to clone.
#[derive(Clone)]
pub enum Conn {
    /// One server through self-reconnecting managers, one per lane.
    Standalone(Arc<Lanes<ConnectionManager>>),
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
                Ok(Self::Standalone(Arc::new(Lanes::new(lanes))))
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
        invocation: &ScriptInvocation<'_>,
        wait: Option<Wait>,
    ) -> RedisResult<(Value, u32)> {
        match self {
            Self::Standalone(lanes) => {
                run_on(&mut lanes.pick(wait.is_some()), invocation, wait).await
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
            Self::Standalone(lanes) => cmd.query_async(&mut lanes.pick(false)).await,
            Self::Cluster(lanes) => cmd.query_async(&mut lanes.pick(false)).await,
            Self::Sentinel(conn) => conn.query(cmd).await,
        }
    }
}

/// Runs `invocation` on one connection, followed by `WAIT` when asked.
pub(super) async fn run_on<C: ConnectionLike + Send>(
    conn: &mut C,
    invocation: &ScriptInvocation<'_>,
    wait: Option<Wait>,
) -> RedisResult<(Value, u32)> {
    let Some(wait) = wait else {
        return Ok((invocation.invoke_async(conn).await?, 0));
    };
    let mut waiting = WaitAfterScript {
        inner: conn,
        wait,
        acknowledged: None,
    };
    let value = invocation.invoke_async(&mut waiting).await?;
    let acknowledged = waiting.acknowledged.take().unwrap_or(Ok(0))?;
    Ok((value, acknowledged))
}

/// A connection wrapper that sends `WAIT` in the same pipeline as every `EVALSHA`/`EVAL` that
/// passes through it, and keeps WAIT's answer.
///
/// `WAIT` cannot run inside a script, and it counts the replicas that acknowledged this client
/// connection's last write, so it must follow the script on the very same connection. Wrapping the
/// connection (instead of building `EVALSHA` by hand) keeps `ScriptInvocation` the one way scripts
/// run, including its reload on `NOSCRIPT` (the `SCRIPT LOAD` passes through unchanged). On a
/// Cluster, redis-rs routes a pipeline by its first keyed command (the script's `KEYS[1]`) and
/// `WAIT` has no key, so both go to the node that owns the action's slot.
struct WaitAfterScript<'c, C> {
    inner: &'c mut C,
    wait: Wait,
    acknowledged: Option<RedisResult<u32>>,
}

fn is_script_call(cmd: &Cmd) -> bool {
    matches!(
        cmd.args_iter().next(),
        Some(redis::Arg::Simple(name)) if name.eq_ignore_ascii_case(b"EVALSHA") || name.eq_ignore_ascii_case(b"EVAL")
    )
}

impl<C: ConnectionLike + Send> ConnectionLike for WaitAfterScript<'_, C> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        if !is_script_call(cmd) {
            return self.inner.req_packed_command(cmd);
        }
        Box::pin(async move {
            let timeout_ms = self.wait.timeout.as_millis().clamp(1, u128::from(u32::MAX)) as u64;
            let mut pipe = redis::pipe();
            pipe.add_command(cmd.clone())
                .cmd("WAIT")
                .arg(self.wait.replicas)
                .arg(timeout_ms)
                .ignore_errors();
            let mut replies: Vec<Value> = pipe.query_async(&mut *self.inner).await?;
            if replies.len() != 2 {
                return Err(RedisError::from((
                    redis::ErrorKind::Client,
                    "script + WAIT pipeline answered with the wrong number of replies",
                )));
            }
            let wait_reply = replies.pop().unwrap_or(Value::Nil);
            self.acknowledged = Some(match wait_reply.extract_error() {
                Ok(Value::Int(n)) => Ok(u32::try_from(n).unwrap_or(0)),
                Ok(other) => Err(RedisError::from((
                    redis::ErrorKind::Client,
                    "WAIT answered something other than an integer",
                    format!("{other:?}"),
                ))),
                Err(e) => Err(e),
            });
            Ok(replies.pop().unwrap_or(Value::Nil))
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.inner.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_that_wait_never_share_lane_zero() {
        let lanes = Lanes::new(vec![0, 1, 2, 3]);
        assert_eq!(lanes.pick(false), 0);
        let waiting: Vec<_> = (0..6).map(|_| lanes.pick(true)).collect();
        assert_eq!(waiting, [1, 2, 3, 1, 2, 3]);
        assert_eq!(Lanes::new(vec![7]).pick(true), 7, "one lane serves both");
    }

    #[test]
    fn only_script_calls_get_a_wait() {
        assert!(is_script_call(redis::cmd("EVALSHA").arg("abc").arg(1)));
        assert!(is_script_call(redis::cmd("eval").arg("return 1").arg(0)));
        assert!(!is_script_call(redis::cmd("SCRIPT").arg("LOAD").arg("x")));
        assert!(!is_script_call(&redis::cmd("PING")));
    }

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
    fn host_port_becomes_a_url_and_gets_the_configured_credentials() {
        let options = RedisOptions {
            password: Some("s3cret".into()),
            username: Some("gate".into()),
            ..crate::redis::test_options()
        };
        let info = node_info("10.0.0.1:6380", &options).unwrap();
        assert_eq!(info.addr().to_string(), "10.0.0.1:6380");
        assert_eq!(info.redis_settings().password(), Some("s3cret"));
        assert_eq!(info.redis_settings().username(), Some("gate"));
        // A URL with its own password keeps it.
        let info = node_info("redis://:own@10.0.0.1:6380", &options).unwrap();
        assert_eq!(info.redis_settings().password(), Some("own"));
    }
}
