//! The gRPC face of the gate: proto ↔ domain ([`convert`]), the one [`oncegate_gate::GateError`] →
//! `tonic::Status` mapping ([`status`]), the two services (thin: [`service`] for workers,
//! [`admin`] for operators), who a caller is ([`auth`], [`tls`]) and the server that runs them
//! ([`server`]), or answers a caller in its own process ([`in_process`]).

pub mod admin;
pub mod auth;
pub mod convert;
pub mod in_process;
pub mod one_write;
pub mod server;
pub mod service;
mod serving;
pub mod status;
pub mod tls;
