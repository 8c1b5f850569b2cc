//! The Redis store: every state-machine step is one Lua function call (`FCALL`, one round trip),
//! so checking and writing are one atomic step across any number of gate replicas. The scripts
//! under `redis/`, one Functions library ([`library`]), mirror [`oncegate_domain::ledger`]; the
//! conformance suite holds them to it.
//!
//! Owns: the per-call deadline, the durability level (`WAIT` after state changes, checked here),
//! and turning decoded script replies ([`reply`], the one place they are decoded) into ledger
//! types. Does not decide anything. The connection to standalone, Cluster or Sentinel
//! deployments is [`connection`]'s.

mod agents;
mod connection;
mod eviction;
mod health;
pub mod keys;
mod lanes;
mod library;
mod listing;
mod operator;
mod outbox;
mod receipts;
mod reply;
mod sentinel;
mod side;
mod worker;

use std::{sync::Arc, time::Duration};

use redis::Value;

use connection::Conn;
pub use connection::{MAX_SERVING_THREADS, Topology, serve_on_this_thread};
use lanes::Wait;
use library::{Call, Function, Library, Source};
pub use reply::unpacked;
use reply::{Decoded, decode, unexpected};
pub use sentinel::FAILOVER_PAUSE;

use super::StoreError;
use oncegate_domain::{ActionKey, ledger::Millis};

/// The scripts, one per transition, as functions of one library ([`library`]).
struct Scripts {
    library: Library,
    request_token: Function,
    complete: Function,
    release: Function,
    extend_lease: Function,
    get: Function,
    /// Not a transition: a no-op write that lets `WAIT` cover an earlier write (see the file).
    sync: Function,
    record_external: Function,
    resolve_expired: Function,
    unresolved: Function,
    /// Reads a receipt chain's seal mark and the entries after it.
    unsealed: Function,
    /// Stores the statements of a chain's heads and moves its seal mark.
    seal: Function,
    /// Reads a page of a receipt chain.
    receipts: Function,
    decide_approval: Function,
    approvals: Function,
    budgets: Function,
    /// The webhook outbox's steps (written against `outbox_prelude.lua`).
    outbox_append: Function,
    outbox_claim: Function,
    outbox_settle: Function,
    outbox_read: Function,
}

/// Every script: its name, what it is written against, whether it writes, how it replies (packed:
/// every script whose reply [`reply::decode`] reads), its text.
const SOURCES: &[Source] = {
    use library::{Access::*, Part::*, Reply::*};
    macro_rules! source {
        ($name:literal, $part:expr, $access:expr, $reply:expr) => {
            Source {
                name: $name,
                part: $part,
                access: $access,
                reply: $reply,
                body: include_str!(concat!($name, ".lua")),
            }
        };
    }
    &[
        source!("request_token", Ledger, Writes, Packed),
        source!("complete", Ledger, Writes, Packed),
        source!("release", Ledger, Writes, Packed),
        source!("extend_lease", Ledger, Writes, Packed),
        source!("get", Ledger, Reads, Packed),
        source!("sync", Plain, Writes, Resp),
        source!("record_external", Ledger, Writes, Packed),
        source!("resolve_expired", Ledger, Writes, Packed),
        source!("unresolved", Ledger, Prunes, Packed),
        source!("unsealed", Plain, Reads, Resp),
        source!("seal", Plain, Writes, Resp),
        source!("receipts", Plain, Reads, Resp),
        source!("decide_approval", Ledger, Writes, Packed),
        source!("approvals", Ledger, Prunes, Packed),
        source!("budgets", Plain, Reads, Packed),
        source!("outbox_append", Outbox, Writes, Packed),
        source!("outbox_claim", Outbox, Writes, Packed),
        source!("outbox_settle", Outbox, Writes, Packed),
        source!("outbox_read", Outbox, Reads, Packed),
    ]
};

impl Scripts {
    fn load() -> Self {
        let library = Library::new(SOURCES);
        let f = |name| library.function(name);
        Self {
            request_token: f("request_token"),
            complete: f("complete"),
            release: f("release"),
            extend_lease: f("extend_lease"),
            get: f("get"),
            sync: f("sync"),
            record_external: f("record_external"),
            resolve_expired: f("resolve_expired"),
            unresolved: f("unresolved"),
            unsealed: f("unsealed"),
            seal: f("seal"),
            receipts: f("receipts"),
            decide_approval: f("decide_approval"),
            approvals: f("approvals"),
            budgets: f("budgets"),
            outbox_append: f("outbox_append"),
            outbox_claim: f("outbox_claim"),
            outbox_settle: f("outbox_settle"),
            outbox_read: f("outbox_read"),
            library,
        }
    }
}

/// Settings of the Redis connection (defaults: [`oncegate_config::defaults::redis`]).
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
    /// How often the receipt chains that grew are sealed (their new head signed). Between two
    /// seals, entries are recorded but covered by no signature yet.
    pub seal_interval: Duration,
    /// Serve although a node may evict keys (`maxmemory-policy` other than `noeviction`, or
    /// unreadable): UNSAFE, an evicted completion runs its action again. Logged loudly.
    pub allow_eviction: bool,
}

/// Settings for unit tests of this module's parts (values of no importance).
#[cfg(test)]
fn test_options() -> RedisOptions {
    RedisOptions {
        call_timeout: Duration::from_secs(1),
        durability_replicas: 0,
        durability_timeout: Duration::from_millis(500),
        wait_lanes: 0,
        sentinel_check_interval: Duration::from_secs(1),
        seal_interval: Duration::from_millis(50),
        username: None,
        password: None,
        allow_eviction: false,
    }
}

/// A cheap, cloneable handle on one Redis deployment.
#[derive(Clone)]
pub struct RedisStore {
    conn: Conn,
    /// Where `conn` connects, for [`RedisStore::another_connection`].
    topology: Arc<Topology>,
    scripts: Arc<Scripts>,
    options: RedisOptions,
    /// Fails every call closed while a node may evict keys.
    eviction: Arc<eviction::Guard>,
    /// The receipt chains waiting for their next seal.
    sealer: Arc<receipts::Sealer>,
    /// The agents of new grants waiting for the agents index.
    agents: Arc<agents::AgentsQueue>,
}

impl RedisStore {
    /// Connects to the standalone Redis at `url` (`redis://`, `rediss://`, `unix://`).
    pub async fn connect(url: &str, options: RedisOptions) -> Result<Self, StoreError> {
        Self::connect_to(&Topology::Standalone { url: url.into() }, options).await
    }

    /// Connects to `topology`. Fails when Redis cannot be reached within the call timeout, or
    /// (`Misconfigured`) when a node may evict keys; once connected, the handle reconnects (and,
    /// with Sentinel, follows failovers) by itself.
    pub async fn connect_to(
        topology: &Topology,
        options: RedisOptions,
    ) -> Result<Self, StoreError> {
        let conn = open(topology, &options).await?;
        let store = Self {
            conn,
            topology: Arc::new(topology.clone()),
            scripts: Arc::new(Scripts::load()),
            options,
            eviction: Arc::default(),
            sealer: Arc::default(),
            agents: Arc::default(),
        };
        tokio::time::timeout(store.options.call_timeout, store.check_eviction_at_start())
            .await
            .map_err(|_| StoreError::unavailable("Redis did not answer CONFIG GET in time"))??;
        store.load_library().await?;
        store.migrate_agents().await?;
        Ok(store)
    }

    /// The same store over a connection of its own, made on the runtime this is awaited on (its
    /// tasks run there): the scripts, the eviction guard and the sealing and agents queues are
    /// this store's, and nothing of the start-up (the library, the migration, the eviction
    /// check) is done again.
    pub async fn another_connection(&self) -> Result<Self, StoreError> {
        Ok(Self {
            conn: open(&self.topology, &self.options).await?,
            ..self.clone()
        })
    }

    /// Loads the scripts' library when the store connects, so that a Redis that cannot run it
    /// (older than 7.0, or an ACL that denies the gate's user `FUNCTION LOAD` or `FCALL`) is named
    /// at start rather than at the first call. What a retry cures (out of memory, a node loading)
    /// does not stop the start: calls load the library wherever it is missing.
    async fn load_library(&self) -> Result<(), StoreError> {
        let load = self.scripts.library.load_cmd();
        let loaded = tokio::time::timeout(self.options.call_timeout, self.conn.query(&load))
            .await
            .map_err(|_| StoreError::unavailable("Redis did not answer FUNCTION LOAD in time"))?;
        match loaded.map_err(classify) {
            Ok(_) => {
                tracing::debug!(
                    library = self.scripts.library.name(),
                    "Redis functions loaded"
                );
                Ok(())
            }
            Err(e @ StoreError::Unavailable { .. }) => {
                tracing::warn!(
                    library = self.scripts.library.name(),
                    error = %e,
                    "could not load the oncegate functions into Redis yet; every call loads them \
                     where they are missing, and fails closed (STORE_UNAVAILABLE) until then"
                );
                Ok(())
            }
            Err(e) => Err(StoreError::Misconfigured(format!(
                "cannot load oncegate's functions into Redis ({e}); the gate needs Redis 7.0 or \
                 later, and a user allowed FUNCTION LOAD and FCALL"
            ))),
        }
    }

    /// The `WAIT` a state change needs: the deployment's level or the policy's, whichever is higher.
    fn wait_for(&self, replicas: u32) -> Option<Wait> {
        let replicas = replicas.max(self.options.durability_replicas);
        (replicas > 0).then_some(Wait {
            replicas,
            timeout: self.options.durability_timeout,
        })
    }

    /// Runs one per-action script: KEYS = [the record, the agent's lease index, then `extra`
    /// keys of the same agent], ARGV = [the encoded action key, args…], followed by `WAIT` on the
    /// same connection when `wait` asks for it; the reply decoded ([`reply`], the one place).
    async fn run(
        &self,
        script: &Function,
        key: &ActionKey,
        extra: &[Extra],
        args: &[&[u8]],
        wait: Option<Wait>,
    ) -> Result<Ran, StoreError> {
        let (value, acknowledged) = self
            .call(&invocation(script, key, extra, args), wait)
            .await?;
        let (now, decoded) = decode(value)?;
        Ok(Ran {
            now,
            decoded,
            acknowledged,
        })
    }

    /// Runs a prepared script (not a per-action one) and decodes its reply.
    async fn invoke(&self, invocation: Call<'_>) -> Result<(Millis, Decoded), StoreError> {
        decode(self.call(&invocation, None).await?.0)
    }

    /// Every script call: the eviction guard, the call deadline, and what a failure means
    /// ([`classify`]). Returns Redis' answer and the replicas `WAIT` counted.
    async fn call(
        &self,
        invocation: &Call<'_>,
        wait: Option<Wait>,
    ) -> Result<(Value, u32), StoreError> {
        self.eviction.check()?;
        tokio::time::timeout(self.options.call_timeout, self.conn.run(invocation, wait))
            .await
            .map_err(|_| StoreError::unavailable("Redis did not answer within the call timeout"))?
            .map_err(classify)
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
        let sync = invocation(&self.scripts.sync, key, &[], &[]);
        Ok(self.call(&sync, wait).await?.1)
    }
}

/// A per-action script's decoded answer.
struct Ran {
    /// The script's clock (Redis `TIME`).
    now: Millis,
    decoded: Decoded,
    /// Replicas `WAIT` counted (0 without a wait).
    acknowledged: u32,
}

/// The keys of the action's agent a per-action script takes after the record and the lease index.
#[derive(Debug, Clone, Copy)]
enum Extra {
    /// The agent's receipt chain.
    Receipts,
    /// The agent's budget buckets.
    Budgets,
    /// The action's approval.
    Approval,
    /// The agent's approvals index.
    Approvals,
}

/// A connection to `topology`, within the call timeout.
async fn open(topology: &Topology, options: &RedisOptions) -> Result<Conn, StoreError> {
    tokio::time::timeout(options.call_timeout, Conn::connect(topology, options))
        .await
        .map_err(|_| {
            StoreError::unavailable(format!(
                "timed out connecting to Redis ({})",
                topology.describe()
            ))
        })?
        .map_err(|e| {
            StoreError::unavailable_by(
                format!("cannot connect to Redis ({})", topology.describe()),
                e,
            )
        })
}

/// A per-action script invocation: every key of the agent from one hash tag ([`keys::Agent`]).
fn invocation<'s>(
    script: &'s Function,
    key: &ActionKey,
    extra: &[Extra],
    args: &[&[u8]],
) -> Call<'s> {
    let agent = keys::Agent::new(&key.agent_id);
    let record = agent.record(key);
    let mut invocation = script.key(&record);
    invocation.key(agent.leases());
    for k in extra {
        invocation.key(match k {
            Extra::Receipts => agent.receipts(),
            Extra::Budgets => agent.budgets(),
            Extra::Approval => keys::Agent::approval_of(&record),
            Extra::Approvals => agent.approvals(),
        });
    }
    invocation.arg(key.encode());
    for arg in args {
        invocation.arg(*arg);
    }
    invocation
}

/// Fails closed when fewer replicas than asked confirmed a state change.
fn confirmed(wait: Option<Wait>, acknowledged: u32, what: &str) -> Result<(), StoreError> {
    match wait {
        Some(wait) if acknowledged < wait.replicas => Err(StoreError::unavailable(format!(
            "only {acknowledged} of {} replicas confirmed the {what} within {} ms; not acknowledged",
            wait.replicas,
            wait.timeout.as_millis()
        ))),
        _ => Ok(()),
    }
}

/// Server errors that waiting cures: out of memory under `noeviction` (`OOM`), a busy script
/// (`BUSY`), too few replicas for `min-replicas-to-write` (`NOREPLICAS`), a failing snapshot that
/// stops writes (`MISCONF`), a `WAIT` released because its master became a replica during a
/// failover (`UNBLOCKED`: its write's fate is unknown; found by `make soak` on a Cluster).
const TRANSIENT_CODES: [&str; 5] = ["OOM", "BUSY", "NOREPLICAS", "MISCONF", "UNBLOCKED"];

/// Connection trouble, failover, overload and the server errors a retry can cure fail closed as
/// UNAVAILABLE (retryable: a guard keeps retrying its Complete); anything else Redis says (a
/// script error) is a bug or a foreign record, not something a retry fixes.
pub(super) fn classify(e: redis::RedisError) -> StoreError {
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
        )
        || e.code().is_some_and(|code| TRANSIENT_CODES.contains(&code));
    if transient {
        StoreError::unavailable_by("Redis", e)
    } else {
        StoreError::corrupt_by("Redis answered with an error", e)
    }
}

#[cfg(test)]
mod classify_tests {
    use super::*;

    fn server_error(reply: &[u8]) -> redis::RedisError {
        redis::parse_redis_value(reply)
            .and_then(Value::extract_error)
            .expect_err("an error reply")
    }

    #[test]
    fn a_wait_unblocked_by_a_failover_fails_closed() {
        let e = server_error(
            b"-UNBLOCKED force unblock from blocking operation, instance state changed (master -> replica?)\r\n",
        );
        assert!(matches!(classify(e), StoreError::Unavailable { .. }));
    }

    /// `reply` is STORE_UNAVAILABLE (retryable), and says what Redis said.
    fn fails_closed_retryably(reply: &[u8], said: &str) {
        match classify(server_error(reply)) {
            e @ StoreError::Unavailable { .. } => {
                let message = e.to_string();
                assert!(message.contains(said), "{message}")
            }
            other => panic!(
                "{:?} classified as {other:?}",
                String::from_utf8_lossy(reply)
            ),
        }
    }

    #[test]
    fn out_of_memory_under_noeviction_fails_closed() {
        fails_closed_retryably(
            b"-OOM command not allowed when used memory > 'maxmemory'.\r\n",
            "maxmemory",
        );
    }

    #[test]
    fn a_busy_script_fails_closed() {
        fails_closed_retryably(
            b"-BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.\r\n",
            "busy running a script",
        );
    }

    #[test]
    fn too_few_replicas_for_min_replicas_to_write_fails_closed() {
        fails_closed_retryably(
            b"-NOREPLICAS Not enough good replicas to write.\r\n",
            "Not enough good replicas",
        );
    }

    #[test]
    fn writes_stopped_by_a_failing_snapshot_fail_closed() {
        fails_closed_retryably(
            b"-MISCONF Redis is configured to save RDB snapshots, but it's currently unable to \
              persist to disk. Commands that may modify the data set are disabled, because this \
              instance is configured to report errors during writes if RDB snapshotting fails \
              (stop-writes-on-bgsave-error option). Please check the Redis logs for details \
              about the RDB error.\r\n",
            "unable to persist to disk",
        );
    }

    #[test]
    fn a_code_that_merely_starts_like_a_transient_one_is_not_retried() {
        // RESTORE's "target key name already exists": not BUSY, and no retry cures it.
        let e = server_error(b"-BUSYKEY Target key name already exists.\r\n");
        assert!(matches!(classify(e), StoreError::Corrupt { .. }));
    }

    #[test]
    fn a_script_error_is_not_retried() {
        let e =
            server_error(b"-ERR user_script:1: Script attempted to access nonexistent global\r\n");
        assert!(matches!(classify(e), StoreError::Corrupt { .. }));
    }
}
