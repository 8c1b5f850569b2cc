//! The domain: what an action is and what may happen to it. Pure functions and plain data: no IO,
//! no clock, no randomness, no gRPC or store types. Every other layer builds on this one.
//!
//! - [`ledger`]: the action state machine, `(record, side, request, now) → (reply, writes)`, with
//!   the approvals and budgets decided in the same step; the
//!   reference semantics of `docs/CONTRACT.md`, which both stores are checked against.
//! - [`fingerprint`]: strict params parsing, key-field selection, RFC 8785, SHA-256, `v1-…`.
//! - [`action_key`]: the action key, its unambiguous encoding, and the provider key.
//! - [`event`]: events for webhooks: types, deterministic ids, CloudEvents and Slack bodies.
//! - [`time`]: RFC 3339 times from the store's milliseconds.
//! - [`statement`]: signed statements (JWS, EdDSA): grants an executor verifies offline, receipts
//!   chained per agent.

pub mod action_key;
pub mod event;
pub mod fingerprint;
pub mod ledger;
pub mod statement;
pub mod time;

pub use action_key::ActionKey;
