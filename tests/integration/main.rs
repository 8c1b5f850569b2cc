//! The one integration test binary: real gRPC servers, a real `redis-server` per test, real
//! `oncegate` processes where a test needs two of them or a crash.

mod bench;
mod cli;
mod conformance;
mod failures;
mod races;
mod rows;
mod support;
