//! The one integration test binary: real gRPC servers, a real `redis-server` per test, real
//! `oncegate` processes where a test needs two of them or a crash.

mod cli;
mod conformance;
mod durability;
mod failover;
mod failures;
mod races;
mod rows;
mod support;
