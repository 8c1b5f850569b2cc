//! Sentinel: finds the master through Redis Sentinel and follows failovers, so that no call goes
//! to a master that Sentinel has demoted (or is demoting).
//!
//! A connection opened before a failover keeps working against the old master until that server
//! is reconfigured as a replica, which takes seconds; everything written there meanwhile is
//! discarded when it resynchronises. So the master is re-resolved:
//! - at once when any sentinel publishes `+switch-master` for it (every sentinel is subscribed);
//! - when a sentinel publishes `+try-failover` for it, calls fail closed until `+switch-master`
//!   or `-failover-abort-*` (or [`FAILOVER_PAUSE`] passes): from the moment a failover starts,
//!   nothing is written through the master it is about to replace;
//! - when a call fails with `READONLY` or a connection error (the call itself fails closed);
//! - by a periodic check: `ROLE` on the current master, and the sentinels' current answer.
//!
//! Resolution asks every sentinel (`SENTINEL MASTER <name>`) and believes the answer with the
//! highest config epoch, because a sentinel that has not heard of a failover yet still names the
//! old master, which still answers `ROLE` as master until it is converted. redis-rs's own
//! `sentinel` module takes the first sentinel whose master passes `ROLE`, which is exactly that
//! stale case, so it is not used here.
//!
//! Does not own: scripts, `WAIT`, deadlines (the store's).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, Weak},
    time::{Duration, Instant},
};

use redis::{
    Cmd, ConnectionInfo, IntoConnectionInfo, RedisError, RedisResult, Role, Value,
    aio::MultiplexedConnection,
};
use tokio_stream::StreamExt as _;

use super::{
    RedisOptions,
    lanes::{Lanes, Wait, async_config, lane_count, node_info, run_on},
};

/// The longest time calls fail closed after a sentinel announced it is failing the master over,
/// when neither the switch nor an abort is heard.
pub const FAILOVER_PAUSE: Duration = Duration::from_secs(10);

/// The master Sentinel names. Cheap to clone; background tasks stop when the last clone is dropped.
#[derive(Clone)]
pub struct SentinelConn {
    shared: Arc<Shared>,
}

struct Shared {
    name: String,
    sentinels: Vec<ConnectionInfo>,
    options: RedisOptions,
    /// One resolution at a time; calls that find no master wait for it.
    resolving: tokio::sync::Mutex<()>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    master: Option<Arc<Master>>,
    paused_until: Option<Instant>,
    generation: u64,
}

struct Master {
    addr: String,
    lanes: Lanes<MultiplexedConnection>,
    generation: u64,
}

/// One sentinel's view of the master.
#[derive(Debug)]
struct View {
    addr: String,
    epoch: u64,
    usable: bool,
}

fn unavailable(what: impl Into<String>) -> RedisError {
    RedisError::from((
        redis::ErrorKind::Server(redis::ServerErrorKind::MasterDown),
        "sentinel",
        what.into(),
    ))
}

/// Errors after which the master this call used is not trusted any more.
fn must_reresolve(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || matches!(
            e.kind(),
            redis::ErrorKind::Server(
                redis::ServerErrorKind::ReadOnly | redis::ServerErrorKind::MasterDown
            )
        )
}

impl SentinelConn {
    /// Finds the master `name` through `sentinels` and starts following it.
    pub async fn connect(
        sentinels: &[String],
        name: &str,
        options: &RedisOptions,
    ) -> RedisResult<Self> {
        let sentinels = sentinels
            .iter()
            .map(|s| {
                let url = if s.contains("://") {
                    s.clone()
                } else {
                    format!("redis://{s}")
                };
                url.as_str().into_connection_info()
            })
            .collect::<RedisResult<Vec<_>>>()?;
        let shared = Arc::new(Shared {
            name: name.to_owned(),
            sentinels,
            options: options.clone(),
            resolving: tokio::sync::Mutex::new(()),
            state: Mutex::new(State::default()),
        });
        shared.master().await?;
        for i in 0..shared.sentinels.len() {
            tokio::spawn(listen(Arc::downgrade(&shared), i));
        }
        tokio::spawn(check(Arc::downgrade(&shared)));
        Ok(Self { shared })
    }

    /// Runs a script on the current master (see [`super::connection::Conn::run`]).
    pub async fn run(
        &self,
        invocation: &crate::redis::library::Call<'_>,
        wait: Option<Wait>,
    ) -> RedisResult<(Value, u32)> {
        let master = self.shared.master().await?;
        let result = run_on(&mut master.lanes.pick(wait.is_some()), invocation, wait).await;
        self.shared.after(&master, result)
    }

    /// One plain command on the current master.
    pub async fn query(&self, cmd: &Cmd) -> RedisResult<Value> {
        let master = self.shared.master().await?;
        let result = cmd.query_async(&mut master.lanes.pick(false)).await;
        self.shared.after(&master, result)
    }
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current master, resolving it when there is none. Fails closed during a failover.
    async fn master(&self) -> RedisResult<Arc<Master>> {
        if let Some(master) = self.current()? {
            return Ok(master);
        }
        let _one_at_a_time = self.resolving.lock().await;
        if let Some(master) = self.current()? {
            return Ok(master);
        }
        let master = self.resolve().await?;
        let mut state = self.state();
        if state.paused_until.is_some() {
            // A failover began while this resolution ran: do not trust its answer.
            return Err(unavailable(
                "a failover started while the master was resolved",
            ));
        }
        state.generation += 1;
        let master = Arc::new(Master {
            generation: state.generation,
            ..master
        });
        state.master = Some(master.clone());
        tracing::info!(master = %master.addr, name = %self.name, "using the master Sentinel names");
        Ok(master)
    }

    fn current(&self) -> RedisResult<Option<Arc<Master>>> {
        let mut state = self.state();
        if let Some(until) = state.paused_until {
            if Instant::now() < until {
                return Err(unavailable(
                    "Sentinel is failing the master over; failing closed until it is done",
                ));
            }
            tracing::warn!(name = %self.name, "no end of the failover was heard; resolving the master again");
            state.paused_until = None;
            state.master = None;
        }
        Ok(state.master.clone())
    }

    /// Drops `master` when `result` says it cannot be trusted any more; and fails closed a call
    /// that `master` answered after it stopped being trusted. A master stalled (paused, cut off)
    /// past `down-after-milliseconds` answers the calls queued on it when it resumes, and a replica
    /// Sentinel has not reconfigured yet can still confirm their `WAIT`; once the failover that
    /// began meanwhile is done, both resynchronise from the new master and drop those writes. So
    /// such an answer is an unknown outcome, never an acknowledgement (found by `make soak`).
    fn after<T>(&self, master: &Master, result: RedisResult<T>) -> RedisResult<T> {
        match &result {
            Err(e) if must_reresolve(e) => self.forget(master.generation, &e.to_string()),
            Ok(_) if !self.trusts(master.generation) => {
                return Err(unavailable(
                    "the master was being failed over or replaced while this call ran; its outcome is unknown",
                ));
            }
            _ => {}
        }
        result
    }

    /// Whether the master of `generation` is still the one calls go to, with no failover started.
    fn trusts(&self, generation: u64) -> bool {
        let state = self.state();
        state.paused_until.is_none()
            && state
                .master
                .as_ref()
                .is_some_and(|m| m.generation == generation)
    }

    fn forget(&self, generation: u64, why: &str) {
        let mut state = self.state();
        if let Some(master) = &state.master
            && master.generation == generation
        {
            tracing::warn!(master = %master.addr, reason = why, "leaving the master; resolving it again");
            state.master = None;
        }
    }

    /// The address every sentinel would agree on: the answer with the highest config epoch.
    async fn ask_sentinels(&self) -> RedisResult<String> {
        // Every sentinel is asked at once; each ask has its own deadline.
        let asks: Vec<_> = self
            .sentinels
            .iter()
            .map(|info| {
                let (info, name, options) = (info.clone(), self.name.clone(), self.options.clone());
                tokio::spawn(async move { ask(&info, &name, &options).await })
            })
            .collect();
        let mut last_err = None;
        let mut best: Option<View> = None;
        for ask in asks {
            let view = ask
                .await
                .unwrap_or_else(|e| Err(unavailable(format!("sentinel lookup failed: {e}"))));
            match view {
                Ok(view) => {
                    if best.as_ref().is_none_or(|b| view.epoch > b.epoch) {
                        best = Some(view);
                    }
                }
                Err(e) => last_err = Some(e),
            }
        }
        match best {
            Some(view) if view.usable => Ok(view.addr),
            Some(view) => Err(unavailable(format!(
                "the sentinels with the newest configuration (epoch {}) see master {} as down or failing over",
                view.epoch, view.addr
            ))),
            None => Err(last_err.unwrap_or_else(|| unavailable("no sentinel configured"))),
        }
    }

    /// Asks the sentinels, connects every lane to the master they name and checks its `ROLE`.
    async fn resolve(&self) -> RedisResult<Master> {
        let addr = self.ask_sentinels().await?;
        let client = redis::Client::open(node_info(&addr, &self.options)?)?;
        let config = async_config(&self.options);
        let mut lanes = Vec::new();
        for _ in 0..lane_count(&self.options) {
            lanes.push(
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?,
            );
        }
        let role: Role = redis::cmd("ROLE").query_async(&mut lanes[0]).await?;
        if !matches!(role, Role::Primary { .. }) {
            return Err(unavailable(format!(
                "Sentinel names {addr} as master but it is not one (yet)"
            )));
        }
        Ok(Master {
            addr,
            lanes: Lanes::new(lanes),
            generation: 0,
        })
    }

    /// Reacts to one sentinel event about our master.
    fn on_event(&self, channel: &str, payload: &str) {
        let words: Vec<&str> = payload.split_whitespace().collect();
        let about_us = match channel {
            "+switch-master" => words.first() == Some(&self.name.as_str()),
            _ => words.first() == Some(&"master") && words.get(1) == Some(&self.name.as_str()),
        };
        if !about_us {
            return;
        }
        let mut state = self.state();
        match channel {
            "+try-failover" => {
                tracing::warn!(name = %self.name, "Sentinel started a failover: failing closed until it ends");
                state.paused_until = Some(Instant::now() + FAILOVER_PAUSE);
                state.master = None;
            }
            "+switch-master" => {
                tracing::warn!(name = %self.name, event = payload, "Sentinel switched the master");
                state.paused_until = None;
                state.master = None;
            }
            c if c.starts_with("-failover-abort") => {
                tracing::warn!(name = %self.name, event = c, "Sentinel aborted the failover");
                state.paused_until = None;
                state.master = None;
            }
            _ => {}
        }
    }

    /// The periodic check: the sentinels still name our master, and it still says it is one.
    async fn check(&self) {
        let Ok(Some(master)) = self.current() else {
            return;
        };
        let timeout = self.options.call_timeout;
        match self.ask_sentinels().await {
            Ok(addr) if addr != master.addr => {
                self.forget(master.generation, &format!("the sentinels now name {addr}"));
                return;
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "periodic sentinel check failed"),
        }
        let role = tokio::time::timeout(
            timeout,
            redis::cmd("ROLE").query_async::<Role>(&mut master.lanes.pick(false)),
        )
        .await;
        match role {
            Ok(Ok(Role::Primary { .. })) => {}
            Ok(Ok(_)) => self.forget(master.generation, "ROLE says it is not a master any more"),
            Ok(Err(e)) => self.forget(master.generation, &e.to_string()),
            Err(_) => self.forget(master.generation, "ROLE timed out"),
        }
    }
}

/// One sentinel's answer to `SENTINEL MASTER <name>`.
async fn ask(info: &ConnectionInfo, name: &str, options: &RedisOptions) -> RedisResult<View> {
    let timeout = options.call_timeout;
    let asked = tokio::time::timeout(timeout, async {
        let client = redis::Client::open(info.clone())?;
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&async_config(options))
            .await?;
        redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(name)
            .query_async::<HashMap<String, String>>(&mut conn)
            .await
    })
    .await
    .map_err(|_| unavailable("a sentinel did not answer in time"))??;
    let get = |k: &str| asked.get(k).cloned().unwrap_or_default();
    let flags = get("flags");
    Ok(View {
        addr: format!("{}:{}", get("ip"), get("port")),
        epoch: get("config-epoch").parse().unwrap_or(0),
        usable: !flags
            .split(',')
            .any(|f| matches!(f, "s_down" | "o_down" | "failover_in_progress")),
    })
}

/// Follows one sentinel's events for as long as the store lives, reconnecting when it drops.
async fn listen(shared: Weak<Shared>, index: usize) {
    loop {
        let Some(strong) = shared.upgrade() else {
            return;
        };
        let info = strong.sentinels[index].clone();
        let interval = strong.options.sentinel_check_interval;
        let timeout = strong.options.call_timeout;
        drop(strong);
        let subscribed = tokio::time::timeout(timeout, async {
            let client = redis::Client::open(info)?;
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.psubscribe("*").await?;
            Ok::<_, RedisError>(pubsub)
        })
        .await;
        let Ok(Ok(pubsub)) = subscribed else {
            tokio::time::sleep(interval).await;
            continue;
        };
        let mut messages = pubsub.into_on_message();
        loop {
            match tokio::time::timeout(interval, messages.next()).await {
                Err(_) if shared.strong_count() == 0 => return,
                Err(_) => {}
                Ok(None) => break,
                Ok(Some(msg)) => {
                    let Some(strong) = shared.upgrade() else {
                        return;
                    };
                    let payload: String = msg.get_payload().unwrap_or_default();
                    strong.on_event(msg.get_channel_name(), &payload);
                }
            }
        }
        tokio::time::sleep(interval.min(Duration::from_millis(200))).await;
    }
}

/// The periodic check, every `sentinel_check_interval`, for as long as the store lives.
async fn check(shared: Weak<Shared>) {
    loop {
        let Some(interval) = shared.upgrade().map(|s| s.options.sentinel_check_interval) else {
            return;
        };
        tokio::time::sleep(interval).await;
        let Some(strong) = shared.upgrade() else {
            return;
        };
        strong.check().await;
    }
}

#[cfg(test)]
mod tests;
