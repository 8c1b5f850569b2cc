//! The Redis store: every state-machine step is one Lua script call (one round trip), so checking
//! and writing are one atomic step across any number of gate replicas. The scripts under
//! `redis/` mirror [`crate::ledger`]; the conformance suite holds them to it.
//!
//! Owns: the connection (a multiplexed, self-reconnecting `ConnectionManager`), the per-call
//! deadline, and decoding script replies (in [`decode`], the one place). Does not decide anything.

use std::{sync::Arc, time::Duration};

use redis::{IntoConnectionInfo, Script, Value, aio::ConnectionManager};

use super::{ActionKey, Durability, Reply, StoreError};
use crate::fingerprint;
use crate::ledger::{
    ActionView, CompleteOutcome, Completion, Grant, GrantKind, Millis, OnExpiry, Refusal, Source,
    State, TokenOutcome, TokenRequest,
};

const PRELUDE: &str = include_str!("redis/prelude.lua");

/// The loaded scripts, one per transition.
struct Scripts {
    request_token: Script,
    complete: Script,
    release: Script,
    extend_lease: Script,
    get: Script,
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
        }
    }
}

/// Settings of the Redis connection.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// Deadline for one store call, connection included; past it the call fails closed.
    pub call_timeout: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            call_timeout: Duration::from_secs(2),
        }
    }
}

/// A cheap, cloneable handle on one Redis deployment.
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    scripts: Arc<Scripts>,
    options: RedisOptions,
}

impl RedisStore {
    /// Connects to `url` (`redis://`, `rediss://`, `unix://`). Fails when Redis cannot be reached
    /// within the call timeout; once connected, the handle reconnects by itself.
    pub async fn connect(url: &str, options: RedisOptions) -> Result<Self, StoreError> {
        let invalid =
            |e: redis::RedisError| StoreError::Unavailable(format!("invalid Redis URL: {e}"));
        // TCP_NODELAY: every call is one small request on a multiplexed connection; with Nagle on
        // (redis-rs's default) a request can wait for the previous reply's ACK.
        let info = url
            .into_connection_info()
            .map_err(invalid)?
            .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
        let client = redis::Client::open(info).map_err(invalid)?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.call_timeout))
            .set_response_timeout(Some(options.call_timeout))
            .set_number_of_retries(1);
        let conn = tokio::time::timeout(
            options.call_timeout,
            ConnectionManager::new_with_config(client, config),
        )
        .await
        .map_err(|_| StoreError::Unavailable("timed out connecting to Redis".into()))?
        .map_err(unavailable)?;
        Ok(Self {
            conn,
            scripts: Arc::new(Scripts::load()),
            options,
        })
    }

    async fn run(
        &self,
        script: &Script,
        key: &ActionKey,
        args: &[&[u8]],
    ) -> Result<(Millis, Decoded), StoreError> {
        let mut invocation = script.key(key.redis_key());
        for arg in args {
            invocation.arg(*arg);
        }
        let mut conn = self.conn.clone();
        let value: Value = tokio::time::timeout(
            self.options.call_timeout,
            invocation.invoke_async(&mut conn),
        )
        .await
        .map_err(|_| {
            StoreError::Unavailable("Redis did not answer within the call timeout".into())
        })?
        .map_err(classify)?;
        decode(value)
    }

    pub async fn request_token(
        &self,
        key: &ActionKey,
        req: &TokenRequest,
    ) -> Result<Reply<TokenOutcome>, StoreError> {
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
        let (now, decoded) = self.run(&self.scripts.request_token, key, &args).await?;
        let result = match decoded {
            Decoded::Granted(grant, kind) => Ok(TokenOutcome::Granted(grant, kind)),
            Decoded::Completed { completion, .. } => Ok(TokenOutcome::AlreadyCompleted(completion)),
            Decoded::KeyReused(stored) => Err(Refusal::KeyReused {
                differing: fingerprint::differing_fields(&stored, &req.digests),
            }),
            Decoded::Refused(refusal) => Err(refusal),
            other => return Err(unexpected("request_token", &other)),
        };
        Ok(Reply { now, result })
    }

    pub async fn complete(
        &self,
        key: &ActionKey,
        token: &str,
        receipt: &[u8],
    ) -> Result<Reply<CompleteOutcome>, StoreError> {
        let (now, decoded) = self
            .run(&self.scripts.complete, key, &[token.as_bytes(), receipt])
            .await?;
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
            Decoded::Refused(refusal) => Err(refusal),
            other => return Err(unexpected("complete", &other)),
        };
        Ok(Reply { now, result })
    }

    pub async fn release(&self, key: &ActionKey, token: &str) -> Result<Reply<u64>, StoreError> {
        let (now, decoded) = self
            .run(&self.scripts.release, key, &[token.as_bytes()])
            .await?;
        let result = match decoded {
            Decoded::Released(fencing) => Ok(fencing),
            Decoded::Refused(refusal) => Err(refusal),
            other => return Err(unexpected("release", &other)),
        };
        Ok(Reply { now, result })
    }

    pub async fn extend_lease(
        &self,
        key: &ActionKey,
        token: &str,
        ttl: Millis,
    ) -> Result<Reply<Millis>, StoreError> {
        let ttl = ttl.to_string();
        let (now, decoded) = self
            .run(
                &self.scripts.extend_lease,
                key,
                &[token.as_bytes(), ttl.as_bytes()],
            )
            .await?;
        let result = match decoded {
            Decoded::Extended(at) => Ok(at),
            Decoded::Refused(refusal) => Err(refusal),
            other => return Err(unexpected("extend_lease", &other)),
        };
        Ok(Reply { now, result })
    }

    pub async fn get(&self, key: &ActionKey) -> Result<Reply<ActionView>, StoreError> {
        let (now, decoded) = self.run(&self.scripts.get, key, &[]).await?;
        match decoded {
            Decoded::View(view) => Ok(Reply {
                now,
                result: Ok(view),
            }),
            other => Err(unexpected("get", &other)),
        }
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        tokio::time::timeout(
            self.options.call_timeout,
            redis::cmd("PING").query_async::<String>(&mut conn),
        )
        .await
        .map_err(|_| StoreError::Unavailable("Redis did not answer PING in time".into()))?
        .map_err(classify)?;
        Ok(())
    }

    /// Reads `appendonly` and `save`; a managed Redis that refuses CONFIG is reported as unknown.
    pub async fn durability(&self) -> Result<Durability, StoreError> {
        let mut conn = self.conn.clone();
        let config: Result<Vec<String>, _> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("appendonly")
            .arg("appendfsync")
            .arg("save")
            .query_async(&mut conn)
            .await;
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

/// What a script said, decoded once.
#[derive(Debug)]
enum Decoded {
    Granted(Grant, GrantKind),
    Completed {
        completion: Completion,
        recorded: bool,
        double_execution: bool,
    },
    KeyReused(String),
    Released(u64),
    Extended(Millis),
    View(ActionView),
    Refused(Refusal),
}

fn unexpected(op: &str, decoded: &Decoded) -> StoreError {
    StoreError::Corrupt(format!("script {op} answered {decoded:?}"))
}

/// The one place script replies are decoded. Layouts are documented in each script's header.
fn decode(value: Value) -> Result<(Millis, Decoded), StoreError> {
    let Value::Array(items) = value else {
        return Err(StoreError::Corrupt(format!(
            "script reply is not an array: {value:?}"
        )));
    };
    let mut fields = Fields { items, next: 0 };
    let now = fields.int()?;
    let tag = fields.string()?;
    let decoded = match tag.as_str() {
        "granted" => {
            let kind = match fields.int()? {
                1 => GrantKind::New,
                2 => GrantKind::Redelivered,
                3 => GrantKind::Regranted,
                n => return Err(StoreError::Corrupt(format!("unknown grant kind {n}"))),
            };
            let token = fields.string()?;
            let fencing = fields.uint()?;
            let lease_expires_at = fields.int()?;
            Decoded::Granted(
                Grant {
                    token,
                    fencing,
                    lease_expires_at,
                },
                kind,
            )
        }
        "completed" => {
            let recorded = fields.int()? == 1;
            let double_execution = fields.int()? == 1;
            Decoded::Completed {
                completion: fields.completion()?,
                recorded,
                double_execution,
            }
        }
        "key_reused" => Decoded::KeyReused(fields.string()?),
        "released" => Decoded::Released(fields.uint()?),
        "extended" => Decoded::Extended(fields.int()?),
        "view" => {
            let state = match fields.int()? {
                1 => State::Absent,
                2 => State::Authorized,
                3 => State::Completed,
                4 => State::Expired,
                n => return Err(StoreError::Corrupt(format!("unknown state {n}"))),
            };
            let fencing = fields.uint()?;
            let fingerprint = fields.string()?;
            let lease = fields.int()?;
            let holder = fields.string()?;
            let has_completion = fields.int()? == 1;
            let completion = fields.completion()?;
            Decoded::View(ActionView {
                state,
                fencing,
                fingerprint,
                lease_expires_at: matches!(state, State::Authorized | State::Expired)
                    .then_some(lease),
                completion: has_completion.then_some(completion),
                holder,
            })
        }
        "in_progress" => Decoded::Refused(Refusal::InProgress {
            retry_after: fields.int()?,
        }),
        "lease_expired" => Decoded::Refused(Refusal::LeaseExpired {
            token: fields.string()?,
            fencing: fields.uint()?,
            expired_at: fields.int()?,
        }),
        "token_mismatch" => Decoded::Refused(Refusal::TokenMismatch),
        "token_unknown" => Decoded::Refused(Refusal::TokenUnknown),
        "already_completed" => Decoded::Refused(Refusal::AlreadyCompleted),
        "completed_by_other" => Decoded::Refused(Refusal::CompletedByOther {
            fencing: fields.uint()?,
            completed_at: fields.int()?,
        }),
        other => {
            return Err(StoreError::Corrupt(format!(
                "unknown script reply tag {other:?}"
            )));
        }
    };
    Ok((now, decoded))
}

/// A cursor over a script's reply array.
struct Fields {
    items: Vec<Value>,
    next: usize,
}

impl Fields {
    fn take(&mut self) -> Result<Value, StoreError> {
        let value = self
            .items
            .get_mut(self.next)
            .map(|v| std::mem::replace(v, Value::Nil))
            .ok_or_else(|| {
                StoreError::Corrupt(format!("script reply too short (field {})", self.next))
            })?;
        self.next += 1;
        Ok(value)
    }

    fn int(&mut self) -> Result<i64, StoreError> {
        match self.take()? {
            Value::Int(n) => Ok(n),
            other => Err(StoreError::Corrupt(format!(
                "expected an integer, got {other:?}"
            ))),
        }
    }

    fn uint(&mut self) -> Result<u64, StoreError> {
        let n = self.int()?;
        u64::try_from(n).map_err(|_| StoreError::Corrupt(format!("negative counter {n}")))
    }

    fn bytes(&mut self) -> Result<Vec<u8>, StoreError> {
        match self.take()? {
            Value::BulkString(bytes) => Ok(bytes),
            Value::SimpleString(s) => Ok(s.into_bytes()),
            other => Err(StoreError::Corrupt(format!(
                "expected a string, got {other:?}"
            ))),
        }
    }

    fn string(&mut self) -> Result<String, StoreError> {
        String::from_utf8(self.bytes()?)
            .map_err(|e| StoreError::Corrupt(format!("non-UTF-8 text: {e}")))
    }

    fn completion(&mut self) -> Result<Completion, StoreError> {
        let receipt = self.bytes()?;
        let completed_at = self.int()?;
        let fencing = self.uint()?;
        let token = self.string()?;
        let source = match self.int()? {
            2 => Source::Operator,
            _ => Source::Worker,
        };
        Ok(Completion {
            receipt,
            completed_at,
            fencing,
            token,
            source,
        })
    }
}
