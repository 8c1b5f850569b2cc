//! The PostgreSQL store's connections: the pool (deadpool over tokio-postgres), one call's
//! session on a pooled connection ([`Session`]: its transaction, its pipelined statements, a
//! connection that is thrown away rather than pooled when a call ends mid-transaction), and what a
//! driver error means for the caller ([`Failure`]: a retry when nothing committed, unknown when
//! the COMMIT's answer was lost, corrupt for a value that cannot be read).
//!
//! Does not own: the steps themselves ([`super::steps`]), the schema ([`super::schema`]).

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use tokio_postgres::{NoTls, Statement, error::SqlState};

use crate::StoreError;

/// Why one attempt of a step failed.
#[derive(Debug)]
pub(super) enum Failure {
    /// The database refused or failed a statement before COMMIT: nothing committed.
    Db(tokio_postgres::Error),
    /// COMMIT was sent and no answer came back (the connection was lost): the step may or may not
    /// have been applied.
    Unknown(tokio_postgres::Error),
    /// A stored value of this step cannot be read; nothing was written.
    Corrupt(String),
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        Self::Db(e)
    }
}

impl Failure {
    /// Whether the attempt is known not to have committed and may simply run again: a
    /// serialization failure or a deadlock (the database rolled the transaction back).
    pub(super) fn retryable(&self) -> bool {
        match self {
            Self::Db(e) => matches!(
                e.code(),
                Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE
                    || *c == SqlState::T_R_DEADLOCK_DETECTED
            ),
            _ => false,
        }
    }

    /// The store error the caller sees, for a step named `what`.
    pub(super) fn into_error(self, what: &str) -> StoreError {
        match self {
            Self::Corrupt(why) => StoreError::corrupt(why),
            Self::Unknown(e) => StoreError::unavailable_by(
                format!(
                    "PostgreSQL: the connection was lost during {what}'s COMMIT; whether it was \
                     applied is unknown (retry the same call)"
                ),
                e,
            ),
            Self::Db(e) => {
                let why = match e.code() {
                    Some(c) if *c == SqlState::QUERY_CANCELED => {
                        "a statement exceeded the store timeout (statement_timeout)".to_owned()
                    }
                    Some(c) if *c == SqlState::READ_ONLY_SQL_TRANSACTION => {
                        "the server is read-only (a standby); nothing was written".to_owned()
                    }
                    Some(c) => format!("the server refused it (SQLSTATE {}); nothing was written", c.code()),
                    None if e.is_closed() => "the connection is closed; nothing was written".into(),
                    None => "the connection failed; nothing was written".into(),
                };
                StoreError::unavailable_by(format!("PostgreSQL, {what}: {why}"), e)
            }
        }
    }
}

/// The pool of one store, built from a libpq URL.
pub(super) fn pool(
    config: tokio_postgres::Config,
    size: usize,
    call_timeout: Duration,
) -> Result<Pool, StoreError> {
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            // A pooled connection is checked by whether its socket is still open; a call on a
            // connection the server dropped meanwhile fails and is not retried blindly.
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        // Half the call's deadline waiting for a connection, so that a call that waited in vain
        // says so (the pool is exhausted) instead of meeting the deadline without a reason.
        .wait_timeout(Some(call_timeout / 2))
        .create_timeout(Some(call_timeout))
        .recycle_timeout(Some(call_timeout))
        .build()
        .map_err(|e| StoreError::unavailable_by("building the PostgreSQL connection pool", e))
}

/// A pooled connection a store call holds. While a transaction is open on it and the call is
/// dropped (its deadline passed), the connection is taken out of the pool and closed, so the
/// server rolls the transaction back and nothing half-done is handed to the next call.
pub(super) struct Session {
    conn: Option<Object>,
    open: bool,
}

impl Session {
    pub(super) async fn get(pool: &Pool) -> Result<Self, StoreError> {
        match pool.get().await {
            Ok(conn) => Ok(Self {
                conn: Some(conn),
                open: false,
            }),
            Err(deadpool_postgres::PoolError::Timeout(_)) => Err(StoreError::unavailable(
                "PostgreSQL: no pooled connection came free within the call timeout \
                 (--postgres-pool-size bounds them)",
            )),
            Err(deadpool_postgres::PoolError::Backend(e)) => Err(StoreError::unavailable_by(
                "PostgreSQL: cannot connect",
                e,
            )),
            Err(e) => Err(StoreError::unavailable_by("PostgreSQL: cannot connect", e)),
        }
    }

    pub(super) fn client(&self) -> &deadpool_postgres::ClientWrapper {
        self.conn
            .as_ref()
            .unwrap_or_else(|| unreachable!("a session holds its connection until dropped"))
    }

    /// A statement, prepared once per connection.
    pub(super) async fn prepare(&self, sql: &str) -> Result<Statement, Failure> {
        Ok(self.client().prepare_cached(sql).await?)
    }

    /// Marks a transaction open: from here until [`Session::closed`] a dropped session closes
    /// its connection.
    pub(super) fn opened(&mut self) {
        self.open = true;
    }

    /// Marks the transaction ended (committed or rolled back).
    pub(super) fn closed(&mut self) {
        self.open = false;
    }

    /// Rolls back after a failed or corrupt attempt; a connection that cannot is closed.
    pub(super) async fn rollback(&mut self) {
        if self.open && self.client().batch_execute("ROLLBACK").await.is_ok() {
            self.open = false;
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if self.open
            && let Some(conn) = self.conn.take()
        {
            drop(Object::take(conn));
        }
    }
}

/// Runs `$attempt` (an expression using the session `$s`) in a fresh session, again while it
/// fails with a serialization failure or a deadlock (nothing committed), under the call
/// deadline; the error the caller sees otherwise.
macro_rules! attempt {
    ($store:expr, $what:expr, |$s:ident| $attempt:expr) => {{
        let store = $store;
        let run = async {
            let mut tries = 0u32;
            loop {
                let mut $s = $crate::postgres::connection::Session::get(&store.pool).await?;
                let result = $attempt;
                match result {
                    Ok(value) => break Ok(value),
                    Err(failure) => {
                        $s.rollback().await;
                        tries += 1;
                        if failure.retryable() && tries < $crate::postgres::connection::RETRIES {
                            continue;
                        }
                        break Err(failure.into_error($what));
                    }
                }
            }
        };
        match tokio::time::timeout(store.call_timeout, run).await {
            Ok(result) => result,
            Err(_) => Err($crate::StoreError::unavailable(format!(
                "PostgreSQL did not answer {} within the call timeout; whether it was applied is \
                 unknown",
                $what
            ))),
        }
    }};
}
pub(super) use attempt;

/// How many times one call runs a step that the database rolled back (serialization failure,
/// deadlock) before it reports the failure.
pub(super) const RETRIES: u32 = 5;

/// The lock classes of `pg_advisory_xact_lock(class, hash)`: a step locks its action key first,
/// then, when it reads or writes its agent's approvals, budgets or receipt chain, its agent;
/// never the other way round, so two steps cannot deadlock on them.
pub(super) const KEY_LOCK: i32 = 1;
pub(super) const AGENT_LOCK: i32 = 2;

/// The 32-bit lock id of a key or an agent (two that meet only wait for each other).
pub(super) fn lock_id(bytes: &[u8]) -> i32 {
    crc32fast::hash(bytes) as i32
}

/// A statement's rows, as a future that owns its parameters (so a step can collect several and
/// send them together: they are pipelined in the order first polled).
pub(super) fn query<'a>(
    client: &'a tokio_postgres::Client,
    statement: &'a Statement,
    params: Vec<&'a (dyn tokio_postgres::types::ToSql + Sync)>,
) -> futures_util::future::BoxFuture<'a, Result<Vec<tokio_postgres::Row>, tokio_postgres::Error>> {
    use futures_util::{FutureExt, TryStreamExt};
    async move { client.query_raw(statement, params).await?.try_collect().await }.boxed()
}
