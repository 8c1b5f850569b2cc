//! oncegate: a gRPC gate that lets an AI agent perform each side-effecting action at most once.
//!
//! Reading order (see ARCHITECTURE.md):
//! - [`fingerprint`]: params → key fields → RFC 8785 → SHA-256 → `v1-…`. No IO.
//! - [`ledger`]: the action state machine, `(record, request, now) → (reply, write)`. No IO.
//! - [`store`]: the Store contract and its two members, embedded (redb) and Redis (Lua; standalone,
//!   Cluster or Sentinel).
//! - [`policy`]: the action policies file (key fields, lease, retention, expiry policy).
//! - [`gate`]: validation, fingerprinting and policy around one store call. No gRPC types.
//! - [`error`]: the domain errors and their one translation to `tonic::Status`.
//! - [`service`]: the generated gRPC trait, proto ↔ domain, nothing else.
//! - [`auth`]: principals, credentials (API key hash, client certificate), scopes, rate limits.
//! - [`tls`]: the listener's TLS settings and client-certificate identities.
//! - [`admin`]: the operator API (`GateAdminService`); [`admin_cli`]: `oncegate admin …`.
//! - [`server`]: listener, health, reflection, graceful drain.
//! - [`metrics`]: the Prometheus handles (attempts by decision, DAR, latency) and `/metrics`.
//! - [`telemetry`]: logs, one span per RPC (W3C `traceparent`), OTLP export behind `otel`.
//! - [`cli`]: the command line and its configuration.
//! - [`client`]: a typed Rust client and the guard that runs an action at most once.
//! - [`bench`]: `oncegate bench`, the load generator (a client of the gate, not part of it).
#![forbid(unsafe_code)]

pub mod admin;
pub mod admin_cli;
pub mod auth;
pub mod bench;
pub mod cli;
pub mod client;
pub mod error;
pub mod fingerprint;
pub mod gate;
pub mod ledger;
pub mod metrics;
pub mod pb;
pub mod policy;
pub mod server;
pub mod service;
pub mod store;
pub mod telemetry;
pub mod tls;
