//! Test support, the one home of every helper more than one test file uses (test files never
//! import from each other). By concern:
//! - [`redis`]: a `redis-server` of the test's own on a free loopback port; [`topology`]: Cluster
//!   and Sentinel deployments of them.
//! - [`stores`]: a fresh store of every [`Kind`] ([`backend`]), and [`on_stores!`].
//! - [`gate`]: gates in-process on `127.0.0.1:0` ([`TestGate`]) or as real `oncegate` processes
//!   ([`GateProcess`], [`LoggedGate`]), and [`connect`].
//! - [`inputs`]: requests, TTLs, configuration text, files; [`calls`]: one worker RPC each.
//! - [`principals`]: the worker and operator of access-controlled gates, [`authed`] requests;
//!   [`pki`]: certificates made here and a TLS channel.
//! - [`errors`]: rich-status checks; [`health`]: probes; [`scrape`]: `/metrics` parsed.
//!
//! # One test on several stores
//!
//! Write the test once, taking the store's [`Kind`], then name the stores it runs on:
//!
//! ```ignore
//! async fn expired_lease_is_refused(kind: Kind) {
//!     let gate = TestGate::start_with(kind, policies()).await;
//!     let mut client = gate.client().await;
//!     // ...
//! }
//! on_stores!(expired_lease_is_refused: embedded, redis, cluster, sentinel);
//! ```
//!
//! [`on_stores!`] generates a module of that name with one `#[tokio::test]` per store, so each
//! store's case is listed, run, filtered and reported by its own name
//! (`rows::expired_lease_is_refused::cluster`). A test on another runtime puts its attribute
//! first: `on_stores!(#[tokio::test(flavor = "multi_thread", worker_threads = 4)] name: redis);`.
//! A store name other than `embedded`, `redis`, `cluster` or `sentinel` does not compile.

pub mod calls;
pub mod errors;
pub mod gate;
pub mod health;
pub mod inputs;
pub mod pki;
pub mod principals;
pub mod redis;
pub mod scrape;
pub mod stores;
pub mod topology;

// The support API, importable from `support` by name whether a test uses it today or not.
#[allow(
    unused_imports,
    reason = "re-exports for every test file, present and future"
)]
pub use self::{
    calls::{complete, grant, release, state},
    errors::{expect_error, reason},
    gate::{GateProcess, LoggedGate, TestGate, connect, oncegate_command},
    health::{health, wait_for_health},
    inputs::{config, policies, token_request, ttl_ms, write_file},
    pki::{Ca, Pem, Pki, PkiFiles, tls_channel},
    principals::{OPS_KEY, WORKER_KEY, authed, principals_toml},
    redis::{RedisServer, free_port},
    scrape::{Scrape, http_get},
    stores::{Backend, Kind, STORE_TIMEOUT, backend, backend_with, test_options},
};
pub(crate) use stores::{on_stores, store_kind};
