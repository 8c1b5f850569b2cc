//! What every topology shares (the standalone and Cluster connections of [`super::connection`]
//! and the Sentinel-managed master of [`super::sentinel`]): a node's connection settings, the
//! lanes (separate connections for calls that wait for replicas), and the one way a script runs on
//! a connection, with `WAIT` right behind it.
//!
//! Why lanes: `WAIT` blocks the Redis client connection it is sent on until the replicas answer,
//! and every command queued behind it on that connection waits too. Calls without a durability
//! level therefore never share a connection with calls that wait, and waiting calls are spread
//! over a few connections so that one slow `WAIT` does not hold up all the others.

use std::{
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

use redis::{
    AsyncConnectionConfig, Cmd, ConnectionInfo, IntoConnectionInfo, RedisError, RedisFuture,
    RedisResult, Value, aio::ConnectionLike,
};

use super::{
    RedisOptions,
    library::{Call, is_function_call},
};

/// `host:port` becomes `redis://host:port`; a URL stays as it is.
pub(super) fn node_url(node: &str) -> String {
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

/// Runs `invocation` on one connection, followed by `WAIT` when asked.
pub(super) async fn run_on<C: ConnectionLike + Send>(
    conn: &mut C,
    invocation: &Call<'_>,
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

/// A connection wrapper that sends `WAIT` in the same pipeline as every `FCALL` that passes
/// through it, and keeps WAIT's answer.
///
/// `WAIT` cannot run inside a function, and it counts the replicas that acknowledged this client
/// connection's last write, so it must follow the call on the very same connection. Wrapping the
/// connection keeps [`Call::invoke_async`] the one way functions run, including its reload of the
/// library when Redis does not know the function (the `FUNCTION LOAD` passes through unchanged). On
/// a Cluster, redis-rs routes a pipeline by its first keyed command (the function's `KEYS[1]`) and
/// `WAIT` has no key, so both go to the node that owns the action's slot.
struct WaitAfterScript<'c, C> {
    inner: &'c mut C,
    wait: Wait,
    acknowledged: Option<RedisResult<u32>>,
}

impl<C: ConnectionLike + Send> ConnectionLike for WaitAfterScript<'_, C> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        if !is_function_call(cmd) {
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
