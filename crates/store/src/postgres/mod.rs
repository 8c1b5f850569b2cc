//! The PostgreSQL store: every step the ledger decides is one PostgreSQL transaction that locks
//! what it reads, runs the same [`oncegate_domain::ledger`] functions as the embedded store, writes
//! and commits ([`steps`]); so a failover to a synchronous standby loses no acknowledged step.
//!
//! - [`connection`]: the pool, a call's session, retries of what the database rolled back, and
//!   what an error means (nothing written, or an outcome unknown when a COMMIT's answer is lost).
//! - [`schema`]: versioned migrations applied at start-up; a newer schema is refused.
//! - [`durability`]: what a commit promises (synchronous standbys), checked at start-up.
//! - [`records`], [`side`], [`receipts`], [`listing`], [`outbox`]: the Store calls.
//! - [`purge`]: expiry without TTLs, in bounded batches off the calls' path.
//!
//! Records are kept in the embedded store's format ([`crate::codec`]) as `bytea`, with the columns
//! listings and the purge read (agent, lease end, expiry), indexed. Time is the database's
//! clock. Does not own: the decisions (the ledger's), the flags (`oncegate-config`).

mod connection;
pub mod durability;
mod listing;
mod outbox;
pub mod purge;
mod receipts;
mod records;
pub mod schema;
mod side;
mod steps;

use std::{sync::Arc, time::Duration};

use deadpool_postgres::Pool;
use tokio_postgres::{NoTls, error::SqlState};

use crate::{Durability, StoreError};
pub use durability::Promise;
pub use purge::Purged;

/// How the store connects and behaves.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    /// Connections this gate opens at most.
    pub pool_size: usize,
    /// Deadline of one store call, waiting for a connection included; also the server's
    /// `statement_timeout`, so a statement stuck on the server ends too.
    pub call_timeout: Duration,
    /// The deployment's durability level: synchronous standbys every commit must be confirmed by;
    /// a server that promises fewer is refused at start-up.
    pub durability_replicas: u32,
    /// How often expired records are purged; `None`: never (tests that purge by hand).
    pub purge_interval: Option<Duration>,
}

/// A handle to the store: cheap to clone, every clone shares the pool.
#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    call_timeout: Duration,
    promise: Arc<Promise>,
    _purge: Option<Arc<purge::PurgeTask>>,
}

/// Why a connection attempt failed, as the operator reads it: what to fix.
fn connect_error(e: tokio_postgres::Error) -> StoreError {
    let code = e.code().cloned();
    let why = match code {
        Some(c) if c == SqlState::INVALID_PASSWORD => {
            "password authentication failed: check the password in --postgres-url (or PGPASSWORD)"
        }
        Some(c) if c == SqlState::INVALID_AUTHORIZATION_SPECIFICATION => {
            "the server refused this user: check the user in --postgres-url and pg_hba.conf"
        }
        Some(c) if c == SqlState::INVALID_CATALOG_NAME => {
            "the database does not exist: create it (CREATE DATABASE) or name another in \
             --postgres-url"
        }
        Some(c) if c == SqlState::TOO_MANY_CONNECTIONS => {
            "the server has no connection slot left: raise max_connections or lower \
             --postgres-pool-size"
        }
        _ => "cannot connect: check the host and port in --postgres-url and that the server runs",
    };
    StoreError::unavailable_by(format!("PostgreSQL: {why}"), e)
}

/// The driver's settings from a libpq URL, with the gate's own: its application name, the
/// statement timeout from the call deadline, and an end to transactions left idle (a gate frozen
/// mid-step must not hold an action's lock for ever).
pub fn parse_url(url: &str, call_timeout: Duration) -> Result<tokio_postgres::Config, StoreError> {
    let mut config: tokio_postgres::Config = url.parse().map_err(|e| {
        StoreError::Misconfigured(format!(
            "--postgres-url is not a PostgreSQL URL (postgresql://user:password@host:port/database): {e}"
        ))
    })?;
    let ms = call_timeout.as_millis().max(1);
    let ours = format!(
        "-c statement_timeout={ms} -c idle_in_transaction_session_timeout={}",
        ms.saturating_mul(4).max(1000)
    );
    let options = match config.get_options() {
        Some(theirs) if !theirs.is_empty() => format!("{theirs} {ours}"),
        _ => ours,
    };
    config.options(options);
    if config.get_application_name().is_none() {
        config.application_name("oncegate");
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(call_timeout.max(Duration::from_secs(1)));
    }
    Ok(config)
}

/// One connection outside the pool (start-up, `oncegate migrate`).
async fn connect_once(config: &tokio_postgres::Config) -> Result<tokio_postgres::Client, StoreError> {
    let (client, connection) = config.connect(NoTls).await.map_err(connect_error)?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "PostgreSQL start-up connection ended");
        }
    });
    Ok(client)
}

/// Applies the migrations this binary has to the database at `url` (refusing a newer schema);
/// the versions applied now.
pub async fn migrate(url: &str, call_timeout: Duration) -> Result<Vec<i32>, StoreError> {
    let config = parse_url(url, call_timeout)?;
    let mut client = connect_once(&config).await?;
    schema::migrate(&mut client).await
}

impl PostgresStore {
    /// Connects to the database at `url`, applies the schema's migrations, reads what a commit
    /// promises and refuses a durability level it does not meet, then starts the pool and the
    /// purge task (on the runtime this is awaited on).
    pub async fn connect(url: &str, options: PostgresOptions) -> Result<Self, StoreError> {
        let config = parse_url(url, options.call_timeout)?;
        let mut client = connect_once(&config).await?;
        let applied = schema::migrate(&mut client).await?;
        if !applied.is_empty() {
            tracing::info!(versions = ?applied, "PostgreSQL: schema migrated");
        }
        let promise = Promise::read(&client)
            .await
            .map_err(|e| StoreError::unavailable_by("PostgreSQL: reading its settings", e))?;
        promise.require(options.durability_replicas)?;
        drop(client);
        let pool = connection::pool(config, options.pool_size.max(1), options.call_timeout)?;
        let purge = options
            .purge_interval
            .map(|every| purge::start(pool.clone(), every));
        Ok(Self {
            pool,
            call_timeout: options.call_timeout,
            promise: Arc::new(promise),
            _purge: purge,
        })
    }

    /// What a commit promises, as read at start-up.
    pub fn promise(&self) -> &Promise {
        &self.promise
    }

    /// One purge pass of at most `batch` rows per table, now (the task does it on its own).
    pub async fn purge_once(&self, batch: i64) -> Result<Purged, StoreError> {
        purge::purge_once(&self.pool, batch).await
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        let call = async {
            let s = connection::Session::get(&self.pool).await?;
            s.client()
                .simple_query("SELECT 1")
                .await
                .map(drop)
                .map_err(|e| StoreError::unavailable_by("PostgreSQL: ping", e))
        };
        tokio::time::timeout(self.call_timeout, call)
            .await
            .map_err(|_| StoreError::unavailable("PostgreSQL did not answer a ping in time"))?
    }

    /// What a commit promises now (read again from the server).
    pub async fn durability(&self) -> Result<Durability, StoreError> {
        let s = connection::Session::get(&self.pool).await?;
        let promise = Promise::read(s.client())
            .await
            .map_err(|e| StoreError::unavailable_by("PostgreSQL: reading its settings", e))?;
        Ok(promise.durability())
    }
}

/// The `pg_advisory_xact_lock(class, id)` pair every step on `key` takes first: an operator (or a
/// test) holding it keeps every gate's steps on that action waiting.
pub fn action_lock(key: &oncegate_domain::ActionKey) -> (i32, i32) {
    (connection::KEY_LOCK, connection::lock_id(&key.encode()))
}
