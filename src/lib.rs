//! oncegate: a gRPC gate that lets an AI agent perform each side-effecting action at most once.
//!
//! The layers, bottom up (ARCHITECTURE.md draws them; `tests/integration/layers.rs` checks that
//! imports only point down). The contract they implement is `docs/CONTRACT.md`.
//! - [`domain`]: the ledger (the action state machine), fingerprints, the action key. No IO.
//! - [`store`]: the Store contract and its two members, embedded (redb) and Redis (Lua;
//!   standalone, Cluster or Sentinel). Persists; does not decide.
//! - [`observe`]: metrics and telemetry (logs, spans, the audit target). Decides nothing.
//! - [`gate`]: validation, the action policy (looked up once per request), token minting, and every
//!   worker and operator operation around one store call: timed, counted, audited.
//! - [`grpc`]: proto ↔ domain, the one Status mapping, the services (thin), auth, TLS, the server.
//! - [`config`]: flags and the configuration file → one validated [`config::Config`]; every default
//!   and exit code.
//! - [`tools`]: the command line, the admin client, the load generator, the Rust client.
//! - [`pb`]: the generated protobuf code, quarantined (used by `grpc` and `tools`).
#![forbid(unsafe_code)]

pub mod config;
pub mod domain;
pub mod gate;
pub mod grpc;
pub mod observe;
pub mod pb;
pub mod store;
pub mod tools;

/// The Rust client and its guard (`oncegate::client`), kept at the crate root for its users.
pub use tools::client;
