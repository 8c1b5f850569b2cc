//! The tools that talk to a gate from outside: the command line ([`cli`]), the worker calls
//! (`oncegate call`, [`call_cli`]) and the operator client (`oncegate admin`, [`admin`]) over
//! what they share ([`remote`], [`views`]), the load generator (`oncegate bench`, [`bench`]), the Rust
//! client with its guard and grant verification ([`client`], also `oncegate::client`), the signing
//! keys and `oncegate verify` ([`keys`]), and the MCP gateway (`oncegate
//! mcp`, [`mcp`]). Clients of the gate's gRPC contract use [`crate::pb`] and [`gate_channel`];
//! only the MCP gateway's in-process mode uses the gate itself ([`crate::gate::Gate`]).

pub mod admin;
pub mod bench;
pub mod call_cli;
pub mod cli;
pub mod client;
pub mod fingerprint;
pub mod gate_channel;
pub mod keys;
pub mod mcp;
pub mod remote;
pub mod views;
