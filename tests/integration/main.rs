//! The one integration test binary: real gRPC servers, a real `redis-server` per test, real
//! `oncegate` processes where a test needs two of them or a crash.

mod admin;
mod cli;
mod conformance;
mod failures;
mod pki;
mod properties;
mod races;
mod rows;
mod security;
mod support;
