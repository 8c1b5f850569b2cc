//! The one integration test binary: real gRPC servers, a real `redis-server` per test, real
//! `oncegate` processes where a test needs two of them or a crash.

mod admin_cli;
mod approvals;
mod authorization;
mod bench;
mod budgets;
mod call_cli;
mod cli;
mod client;
mod conformance;
mod deploy;
mod durability;
mod eviction;
mod failover;
mod failures;
mod holders;
mod layers;
mod limits;
mod metrics;
mod metrics_endpoint;
mod operator;
mod promise;
mod properties;
mod races;
mod readme;
mod receipts;
mod reflection;
mod rows;
mod security;
mod services;
mod signing;
mod support;
mod tls;
mod traces;
mod validation;
mod vectors;
