//! The Redis store: every state-machine step is one Lua script call (one round trip), so checking
//! and writing are one atomic step across any number of gate replicas. The scripts under
//! `redis/` mirror [`crate::ledger`]; the conformance suite holds them to it.
//!
//! Owns: the per-call deadline, the durability level (`WAIT` after state changes, checked here),
//! and turning decoded script replies ([`reply`], the one place they are decoded) into ledger types. Does not decide anything. The
//! connection to standalone, Cluster or Sentinel deployments is [`connection`]'s.

mod connection;
mod reply;
mod sentinel;

use std::{sync::Arc, time::Duration};

use redis::{Script, Value};

pub use connection::Topology;
use connection::{Conn, Wait};
use reply::{Decoded, decode, unexpected};
pub use sentinel::FAILOVER_PAUSE;

use super::{Acked, ActionKey, Durability, ListCursor, Page, Reply, StoreError};
use crate::fingerprint;
use crate::ledger::{
    ActionView, CompleteOutcome, ExternalCompletion, GrantKind, Millis, OnExpiry, Refusal,
    Resolution, Resolved, TokenOutcome, TokenRequest,
};

mod listing;

const PRELUDE: &str = include_str!("redis/prelude.lua");

/// The loaded scripts, one per transition.
struct Scripts {
    request_token: Script,
    complete: Script,
    release: Script,
    extend_lease: Script,
    get: Script,
    /// Not a transition: a no-op write that lets `WAIT` cover an earlier write (see the file).
    sync: Script,
    record_external: Script,
    resolve_expired: Script,
    unresolved: Script,
}

impl Scripts {
    fn load() -> Self {
        let with_prelude = |body: &str| Script::new(&format!("{PRELUDE}\n{body}"));
        Self {
            request_token: with_prelude(include_str!("redis/request_token.lua")),
            complete: with_prelude(include_str!("redis/complete.lua")),
            release: with_prelude(include_str!("redis/release.lua")),
            extend_lease: with_prelude(include_str!("redis/extend_lease.lua")),
            get: with_prelude(include_str!("redis/get.lua")),
            sync: Script::new(include_str!("redis/sync.lua")),
            record_external: with_prelude(include_str!("redis/record_external.lua")),
            resolve_expired: with_prelude(include_str!("redis/resolve_expired.lua")),
            unresolved: with_prelude(include_str!("redis/unresolved.lua")),
        }
    }
}

/// Settings of the Redis connection.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// Deadline for one store call, connection included; past it the call fails closed.
    pub call_timeout: Duration,
    /// The deployment's durability level: every state change waits (`WAIT`) for at least this
    /// many replicas before it is acknowledged; a policy may ask for more. 0: no waiting.
    pub durability_replicas: u32,
    /// How long `WAIT` lets the replicas take (below `call_timeout`); past it, too few confirmed.
    pub durability_timeout: Duration,
    /// Connections reserved for calls that wait for replicas (each `WAIT` blocks its connection);
    /// 0 when no durability level is configured anywhere.
    pub wait_lanes: usize,
    /// Sentinel: how often the master's `ROLE` and the sentinels' answer are checked.
    pub sentinel_check_interval: Duration,
    /// Username for the data nodes, unless their URL names one.
    pub username: Option<String>,
    /// Password for the data nodes, unless their URL names one.
    pub password: Option<String>,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            call_timeout: Duration::from_secs(2),
            durability_replicas: 0,
            durability_timeout: Duration::from_secs(1),
            wait_lanes: 4,
            sentinel_check_interval: Duration::from_secs(1),
            username: None,
            password: None,
        }
    }
}

/// A cheap, cloneable handle on one Redis deployment.
#[derive(Clone)]
pub struct RedisStore {
    conn: Conn,
    scripts: Arc<Scripts>,
    options: RedisOptions,
    /// Agents this process already added to the `og:agents` hint set.
    agents_seen: Arc<listing::SeenAgents>,
}

impl RedisStore {
    /// Connects to the standalone Redis at `url` (`redis://`, `rediss://`, `unix://`).
    pub async fn connect(url: &str, options: RedisOptions) -> Result<Self, StoreError> {
        Self::connect_to(&Topology::Standalone { url: url.into() }, options).await
    }

    /// Connects to `topology`. Fails when Redis cannot be reached within the call timeout; once
    /// connected, the handle reconnects (and, with Sentinel, follows failovers) by itself.
    pub async fn connect_to(
        topology: &Topology,
        options: RedisOptions,
    ) -> Result<Self, StoreError> {
        let conn = tokio::time::timeout(options.call_timeout, Conn::connect(topology, &options))
            .await
            .map_err(|_| {
                StoreError::Unavailable(format!(
                    "timed out connecting to Redis ({})",
                    topology.name()
                ))
            })?
            .map_err(unavailable)?;
        Ok(Self {
            conn,
            scripts: Arc::new(Scripts::load()),
            options,
            agents_seen: Arc::default(),
        })
    }

    /// The `WAIT` a state change needs: the deployment's level or the policy's, whichever is higher.
    fn wait_for(&self, replicas: u32) -> Option<Wait> {
        let replicas = replicas.max(self.options.durability_replicas);
        (replicas > 0).then_some(Wait {
            replicas,
            timeout: self.options.durability_timeout,
        })
    }

    /// Runs a per-action script: KEYS = [record, the agent's lease index], ARGV = [member, args…],
    /// followed by `WAIT` on the same connection when `wait` asks for it.
    async fn run_raw(
        &self,
        script: &Script,
        key: &ActionKey,
        args: &[&[u8]],
        wait: Option<Wait>,
    ) -> Result<(Value, u32), StoreError> {
        let mut invocation = script.key(key.redis_key());
        invocation.key(key.redis_index_key()).arg(key.encode());
        for arg in args {
            invocation.arg(*arg);
        }
        tokio::time::timeout(self.options.call_timeout, self.conn.run(&invocation, wait))
            .await
            .map_err(|_| {
                StoreError::Unavailable("Redis did not answer within the call timeout".into())
            })?
            .map_err(classify)
    }

    async fn run(
        &self,
        script: &Script,
        key: &ActionKey,
        args: &[&[u8]],
        wait: Option<Wait>,
    ) -> Result<(Millis, Decoded, u32), StoreError> {
        let (value, acknowledged) = self.run_raw(script, key, args, wait).await?;
        let (now, decoded) = decode(value)?;
        Ok((now, decoded, acknowledged))
    }

    /// Invokes a prepared script (not a per-action one) with the call deadline and decodes its
    /// reply.
    async fn invoke(
        &self,
        invocation: redis::ScriptInvocation<'_>,
    ) -> Result<(Millis, Decoded), StoreError> {
        let (value, _) =
            tokio::time::timeout(self.options.call_timeout, self.conn.run(&invocation, None))
                .await
                .map_err(|_| {
                    StoreError::Unavailable("Redis did not answer within the call timeout".into())
                })?
                .map_err(classify)?;
        decode(value)
    }

    /// For a reply that hands out or confirms an earlier write (a re-delivered grant, a repeated
    /// Complete): a no-op write plus `WAIT`, so the count covers that earlier write too.
    async fn sync(
        &self,
        key: &ActionKey,
        wait: Option<Wait>,
        acknowledged: u32,
    ) -> Result<u32, StoreError> {
        if wait.is_none() {
            return Ok(acknowledged);
        }
        Ok(self.run_raw(&self.scripts.sync, key, &[], wait).await?.1)
    }

    /// RequestToken at the deployment's durability level.
    pub async fn request_token(
        &self,
        key: &ActionKey,
        req: &TokenRequest,
    ) -> Result<Reply<TokenOutcome>, StoreError> {
        Ok(self.request_token_durable(key, req, 0).await?.reply)
    }

    /// RequestToken; a grant is handed out only once `replicas` replicas (or the deployment's
    /// level, if higher) confirmed it. Otherwise UNAVAILABLE: the record stays AUTHORIZED until
    /// its lease ends, and nobody holds its token.
    pub async fn request_token_durable(
        &self,
        key: &ActionKey,
        req: &TokenRequest,
        replicas: u32,
    ) -> Result<Acked<TokenOutcome>, StoreError> {
        let (lease, retention) = (req.lease.to_string(), req.retention.to_string());
        let on_expiry = match req.on_expiry {
            OnExpiry::Reconcile => "reconcile",
            OnExpiry::Regrant => "regrant",
        };
        let args: [&[u8]; 8] = [
            req.fingerprint.as_bytes(),
            req.digests.as_bytes(),
            req.holder.as_bytes(),
            req.new_token.as_bytes(),
            lease.as_bytes(),
            retention.as_bytes(),
            if req.sliding { b"1" } else { b"0" },
            on_expiry.as_bytes(),
        ];
        let wait = self.wait_for(replicas);
        let (now, decoded, mut acknowledged) = self
            .run(&self.scripts.request_token, key, &args, wait)
            .await?;
        if matches!(decoded, Decoded::Granted(_, GrantKind::New)) {
            self.remember_agent(&key.agent_id).await;
        }
        let result = match decoded {
            Decoded::Granted(grant, kind) => {
                if kind == GrantKind::Redelivered {
                    acknowledged = self.sync(key, wait, acknowledged).await?;
                }
                confirmed(wait, acknowledged, "grant")?;
                Ok(TokenOutcome::Granted(grant, kind))
            }
            Decoded::Completed { completion, .. } => Ok(TokenOutcome::AlreadyCompleted(completion)),
            Decoded::KeyReused(stored) => Err(Refusal::KeyReused {
                differing: fingerprint::differing_fields(&stored, &req.digests),
            }),
            Decoded::Refused(refusal) => Err(refusal),
            other => return Err(unexpected("request_token", &other)),
        };
        Ok(Acked {
            reply: Reply { now, result },
            replicas: acknowledged,
        })
    }

    /// Complete at the deployment's durability level.
    pub async fn complete(
        &self,
        key: &ActionKey,
        token: &str,
        receipt: &[u8],
    ) -> Result<Reply<CompleteOutcome>, StoreError> {
        Ok(self.complete_durable(key, token, receipt, 0).await?.reply)
    }

    /// Complete; acknowledged only once enough replicas confirmed the completion (a repeated
    /// Complete checks the stored one), else UNAVAILABLE so that the worker retries it.
    pub async fn complete_durable(
        &self,
        key: &ActionKey,
        token: &str,
        receipt: &[u8],
        replicas: u32,
    ) -> Result<Acked<CompleteOutcome>, StoreError> {
        let wait = self.wait_for(replicas);
        let (now, decoded, mut acknowledged) = self
            .run(
                &self.scripts.complete,
                key,
                &[token.as_bytes(), receipt],
                wait,
            )
            .await?;
        let result = match decoded {
            Decoded::Completed {
                completion,
                recorded,
                double_execution,
            } => {
                if !recorded {
                    acknowledged = self.sync(key, wait, acknowledged).await?;
                }
                confirmed(wait, acknowledged, "completion")?;
                Ok(CompleteOutcome {
                    completion,
                    recorded,
                    double_execution,
                })
            }
            Decoded::Refused(refusal) => Err(refusal),
            other => return Err(unexpected("complete", &other)),
        };
        Ok(Acked {
            reply: Reply { now, result },
            replicas: acknowledged,
        })
    }

    /// Release at the deployment's durability level.
    pub async fn release(&self, key: &ActionKey, token: &str) -> Result<Reply<u64>, StoreError> {
        Ok(self.release_durable(key, token, 0).await?.reply)
    }

    /// Release, acknowledged once enough replicas confirmed it.
    pub async fn release_durable(
        &self,
        key: &ActionKey,
        token: &str,
        replicas: u32,
    ) -> Result<Acked<u64>, StoreError> {
        let wait = self.wait_for(replicas);
        let (now, decoded, acknowledged) = self
            .run(&self.scripts.release, key, &[token.as_bytes()], wait)
            .await?;
        let result = match decoded {
            Decoded::Released(fencing) => {
                confirmed(wait, acknowledged, "release")?;
                Ok(fencing)
            }
            Decoded::Refused(refusal) => Err(refusal),
            other => return Err(unexpected("release", &other)),
        };
        Ok(Acked {
            reply: Reply { now, result },
            replicas: acknowledged,
        })
    }

    /// ExtendLease at the deployment's durability level.
    pub async fn extend_lease(
        &self,
        key: &ActionKey,
        token: &str,
        ttl: Millis,
    ) -> Result<Reply<Millis>, StoreError> {
        Ok(self.extend_lease_durable(key, token, ttl, 0).await?.reply)
    }

    /// ExtendLease, acknowledged once enough replicas confirmed it (a lost extension would let
    /// the lease end early on the new master after a failover).
    pub async fn extend_lease_durable(
        &self,
        key: &ActionKey,
        token: &str,
        ttl: Millis,
        replicas: u32,
    ) -> Result<Acked<Millis>, StoreError> {
        let wait = self.wait_for(replicas);
        let ttl = ttl.to_string();
        let (now, decoded, acknowledged) = self
            .run(
                &self.scripts.extend_lease,
                key,
                &[token.as_bytes(), ttl.as_bytes()],
                wait,
            )
            .await?;
        let result = match decoded {
            Decoded::Extended(at) => {
                confirmed(wait, acknowledged, "lease extension")?;
                Ok(at)
            }
            Decoded::Refused(refusal) => Err(refusal),
            other => return Err(unexpected("extend_lease", &other)),
        };
        Ok(Acked {
            reply: Reply { now, result },
            replicas: acknowledged,
        })
    }

    pub async fn get(&self, key: &ActionKey) -> Result<Reply<ActionView>, StoreError> {
        let (now, decoded, _) = self.run(&self.scripts.get, key, &[], None).await?;
        match decoded {
            Decoded::View(view) => Ok(Reply {
                now,
                result: Ok(view),
            }),
            other => Err(unexpected("get", &other)),
        }
    }

    pub async fn record_external(
        &self,
        key: &ActionKey,
        ext: &ExternalCompletion,
    ) -> Result<Reply<CompleteOutcome>, StoreError> {
        let (fp, digests, retention, sliding) = match &ext.request {
            Some(r) => (
                r.fingerprint.as_str(),
                r.digests.as_str(),
                r.retention.to_string(),
                r.sliding,
            ),
            None => ("", "", "0".to_owned(), false),
        };
        let args: [&[u8]; 8] = [
            &ext.receipt,
            ext.note.as_bytes(),
            ext.operator.as_bytes(),
            if ext.request.is_some() { b"1" } else { b"0" },
            fp.as_bytes(),
            digests.as_bytes(),
            retention.as_bytes(),
            if sliding { b"1" } else { b"0" },
        ];
        // An operator's write is held to the deployment's durability level like a Complete.
        let wait = self.wait_for(0);
        let (now, decoded, acknowledged) = self
            .run(&self.scripts.record_external, key, &args, wait)
            .await?;
        if matches!(decoded, Decoded::Completed { recorded: true, .. }) {
            confirmed(wait, acknowledged, "operator completion")?;
        }
        let result = match decoded {
            Decoded::Completed {
                completion,
                recorded,
                double_execution,
            } => Ok(CompleteOutcome {
                completion,
                recorded,
                double_execution,
            }),
            Decoded::KeyReused(stored) => Err(Refusal::KeyReused {
                differing: fingerprint::differing_fields(&stored, digests),
            }),
            Decoded::Refused(refusal) => Err(refusal),
            other => return Err(unexpected("record_external", &other)),
        };
        Ok(Reply { now, result })
    }

    pub async fn resolve_expired(
        &self,
        key: &ActionKey,
        resolution: &Resolution,
    ) -> Result<Reply<Resolved>, StoreError> {
        let args: [&[u8]; 4] = match resolution {
            Resolution::Completed {
                receipt,
                note,
                operator,
            } => [b"completed", receipt, note.as_bytes(), operator.as_bytes()],
            Resolution::Failed => [b"failed", b"", b"", b""],
        };
        let wait = self.wait_for(0);
        let (now, decoded, acknowledged) = self
            .run(&self.scripts.resolve_expired, key, &args, wait)
            .await?;
        if !matches!(decoded, Decoded::Refused(_)) {
            confirmed(wait, acknowledged, "resolution")?;
        }
        let result = match decoded {
            Decoded::Completed { completion, .. } => Ok(Resolved::Completed(completion)),
            Decoded::Released(fencing) => Ok(Resolved::Released { fencing }),
            Decoded::Refused(refusal) => Err(refusal),
            other => return Err(unexpected("resolve_expired", &other)),
        };
        Ok(Reply { now, result })
    }

    pub async fn list_unresolved(
        &self,
        agent_id: Option<&str>,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Reply<Page>, StoreError> {
        listing::list(self, agent_id, after, limit).await
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        tokio::time::timeout(
            self.options.call_timeout,
            self.conn.query(&redis::cmd("PING")),
        )
        .await
        .map_err(|_| StoreError::Unavailable("Redis did not answer PING in time".into()))?
        .map_err(classify)?;
        Ok(())
    }

    /// Reads `appendonly` and `save`; a managed Redis that refuses CONFIG is reported as unknown.
    pub async fn durability(&self) -> Result<Durability, StoreError> {
        let mut get = redis::cmd("CONFIG");
        get.arg("GET")
            .arg("appendonly")
            .arg("appendfsync")
            .arg("save");
        let config: Result<Vec<String>, _> =
            tokio::time::timeout(self.options.call_timeout, self.conn.query(&get))
                .await
                .map_err(|_| ())
                .and_then(|r| r.map_err(|_| ()))
                .and_then(|v| redis::from_redis_value(v).map_err(|_| ()));
        let Ok(pairs) = config else {
            return Ok(Durability {
                persistent: false,
                summary: "could not read Redis persistence settings (CONFIG GET refused); check appendonly/save yourself".into(),
            });
        };
        let get = |name: &str| {
            pairs
                .chunks(2)
                .find(|kv| kv[0] == name)
                .and_then(|kv| kv.get(1))
                .cloned()
                .unwrap_or_default()
        };
        let (aof, fsync, save) = (get("appendonly") == "yes", get("appendfsync"), get("save"));
        let summary = match (aof, save.is_empty()) {
            (true, _) => format!("Redis AOF on (appendfsync {fsync}); RDB save '{save}'"),
            (false, false) => format!("Redis RDB snapshots only (save '{save}'): changes since the last snapshot are lost on a crash"),
            (false, true) => "Redis keeps nothing on disk (no AOF, no RDB): every record is lost when Redis restarts".into(),
        };
        Ok(Durability {
            persistent: aof || !save.is_empty(),
            summary,
        })
    }
}

/// Fails closed when fewer replicas than asked confirmed a state change.
fn confirmed(wait: Option<Wait>, acknowledged: u32, what: &str) -> Result<(), StoreError> {
    match wait {
        Some(wait) if acknowledged < wait.replicas => Err(StoreError::Unavailable(format!(
            "only {acknowledged} of {} replicas confirmed the {what} within {} ms; not acknowledged",
            wait.replicas,
            wait.timeout.as_millis()
        ))),
        _ => Ok(()),
    }
}

fn unavailable(e: redis::RedisError) -> StoreError {
    StoreError::Unavailable(e.to_string())
}

/// Connection trouble, failover and overload fail closed as UNAVAILABLE; anything else Redis says
/// (a script error) is a bug or a foreign record, not something a retry fixes.
fn classify(e: redis::RedisError) -> StoreError {
    use redis::{ErrorKind, ServerErrorKind as S};
    let transient = e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_cluster_error()
        || matches!(
            e.kind(),
            ErrorKind::Io
                | ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(
                    S::BusyLoading | S::TryAgain | S::ClusterDown | S::MasterDown | S::ReadOnly
                )
        );
    if transient {
        StoreError::Unavailable(e.to_string())
    } else {
        StoreError::Corrupt(e.to_string())
    }
}
