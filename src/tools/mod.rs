//! The tools that talk to a gate from outside: the command line ([`cli`]), the operator client
//! (`oncegate admin`, [`admin_cli`]), the load generator (`oncegate bench`, [`bench`]) and the
//! Rust client with its guard ([`client`], also `oncegate::client`). Clients of the gate's gRPC
//! contract: they use [`crate::pb`], never the gate's internals.

pub mod admin_cli;
pub mod bench;
pub mod cli;
pub mod client;
pub mod fingerprint;
