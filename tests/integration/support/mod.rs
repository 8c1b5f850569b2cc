//! Test support, the one home of every helper more than one test file uses (test files never
//! import from each other). By concern:
//! - [`redis`]: a `redis-server` of the test's own on a free loopback port; [`topology`]: Cluster
//!   and Sentinel deployments of them.
//! - [`stores`]: a fresh store of every [`Kind`] ([`backend`]).
//! - [`gate`]: gates in-process on `127.0.0.1:0` ([`TestGate`]) or as real `oncegate` processes
//!   ([`GateProcess`]), and [`connect`].
//! - [`inputs`]: requests, configuration text, files.
//! - [`principals`]: the worker and operator of access-controlled gates, [`authed`] requests;
//!   [`pki`]: certificates made here and a TLS channel.
//! - [`errors`]: rich-status checks; [`health`]: probes; [`scrape`]: `/metrics` parsed.

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
    errors::{expect_error, reason},
    gate::{GateProcess, TestGate, connect},
    health::{health, wait_for_health},
    inputs::{config, policies, token_request, write_file},
    pki::{Ca, Pem, PkiFiles, tls_channel},
    principals::{OPS_KEY, WORKER_KEY, authed, principals_toml},
    redis::{RedisServer, free_port},
    scrape::{Scrape, http_get},
    stores::{Backend, Kind, STORE_TIMEOUT, backend, backend_with, test_options},
};
