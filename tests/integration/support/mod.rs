//! Test support, the one home of every helper more than one test file uses (test files never
//! import from each other). By concern:
//! - [`redis`]: a `redis-server` of the test's own on a free loopback port; [`topology`]: Cluster
//!   and Sentinel deployments of them.
//! - [`postgres`]: a PostgreSQL server of the test's own ([`PgServer`], from the Debian binaries,
//!   on a free loopback port), and a database per test on one server per test process.
//! - [`stores`]: a fresh store of every [`Kind`] ([`backend`]), and [`on_stores!`].
//! - [`clock`]: store time a test moves ([`TestClock`], [`StoreTime`]).
//! - [`gate`]: gates in-process on `127.0.0.1:0` ([`TestGate`]) or as real `oncegate` processes
//!   ([`GateProcess`], [`LoggedGate`], [`serve_to_exit`], [`run_to_exit`], one refused every
//!   thread: [`oncegate_without_threads`], on a Redis of its own:
//!   [`serve_on_redis_without_threads`]), and [`connect`].
//! - [`inputs`]: requests, TTLs, configuration text, files; [`calls`]: one worker RPC each.
//! - [`principals`]: the worker and operator of access-controlled gates, [`authed`] requests;
//!   [`pki`]: certificates made here and a TLS channel.
//! - [`errors`]: rich-status checks; [`health`]: probes; [`scrape`]: `/metrics` parsed.
//! - [`receiver`]: a webhook receiver on `127.0.0.1:0` that records deliveries and checks their
//!   signatures.
//! - [`browser`]: a headless Chromium driven over WebDriver (the console's tests).
//! - [`signing`]: fixed test keys, the signer made from them, gates that sign.
//!
//! # One test on several stores
//!
//! Write the test once, taking the store's [`Kind`], then name the stores it runs on:
//!
//! ```ignore
//! async fn expired_lease_is_refused(kind: Kind) {
//!     let gate = TestGate::start_with_test_clock(kind, policies()).await;
//!     let mut client = gate.client().await;
//!     let (action, grant) = grant(&mut client, req).await;
//!     gate.time.pass_beyond(grant.lease_expires_at.unwrap()).await;
//!     // ...
//! }
//! on_stores!(expired_lease_is_refused: embedded, redis, cluster, sentinel);
//! ```
//!
//! [`on_stores!`] generates a module of that name with one `#[tokio::test]` per store, so each
//! store's case is listed, run, filtered and reported by its own name
//! (`rows::expired_lease_is_refused::cluster`). A test on another runtime puts its attribute
//! first: `on_stores!(#[tokio::test(flavor = "multi_thread", worker_threads = 4)] name: redis);`.
//! A store name other than `embedded`, `redis`, `cluster`, `sentinel` or `postgres` does not
//! compile.
//!
//! # Store time
//!
//! A test that waits for store time (a lease to end, a retention to pass) starts its gate with
//! [`TestGate::start_with_test_clock`] (or its store with [`backend_with_test_clock`]) and lets
//! time pass through [`StoreTime`]: on the embedded store that advances a [`TestClock`] at once;
//! Redis decides with its own `TIME`, so there the test waits, and only until the timestamp the
//! gate returned has passed ([`StoreTime::pass_beyond`]).

pub mod browser;
pub mod calls;
pub mod clock;
pub mod errors;
pub mod gate;
pub mod health;
pub mod inputs;
pub mod pki;
pub mod postgres;
pub mod principals;
pub mod receiver;
pub mod redis;
pub mod scrape;
pub mod signing;
pub mod stores;
pub mod topology;

// The support API, importable from `support` by name whether a test uses it today or not.
#[allow(
    unused_imports,
    reason = "re-exports for every test file, present and future"
)]
pub use self::{
    browser::Browser,
    calls::{
        complete, complete_as, grant, grant_as, release, state, unresolved_of, wait_until_completed,
    },
    clock::{StoreTime, TestClock, millis_of},
    errors::{expect_error, reason},
    gate::{
        GateProcess, LoggedGate, TestGate, connect, oncegate_command, oncegate_without_threads,
        run_to_exit, serve_on_redis_without_threads, serve_to_exit,
    },
    health::{health, wait_for_health},
    inputs::{
        BASIC_RULES, config, policies, store_request, token_request, ttl_ms, with_rules, write_file,
    },
    pki::{Ca, Pem, Pki, PkiFiles, tls_channel},
    principals::{OPS_KEY, WORKER_KEY, authed, principals_toml},
    receiver::{Answer, Delivery, Receiver},
    postgres::PgServer,
    redis::{RedisServer, free_port},
    scrape::{Scrape, http_get},
    signing::{test_key, test_signer},
    stores::{
        Backend, Kind, STORE_TIMEOUT, backend, backend_with, backend_with_server,
        backend_with_test_clock, postgres_backend, postgres_options, test_options,
    },
};
pub(crate) use stores::{on_stores, store_kind};
