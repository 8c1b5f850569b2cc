//! `oncegate bench`: a closed-loop gRPC load generator against a running gate, bounded in time and
//! refusing any target that is not a loopback address.
//!
//! Each of `--concurrency` workers keeps exactly one call in flight, over `--connections` HTTP/2
//! connections shared round-robin. After `--warmup`, calls that end inside the `--duration`
//! window are timed into HDR histograms; the correctness checks count for the whole run. The
//! report gives throughput, p50/p90/p99/p99.9 latency per RPC, counts by decision and ErrorInfo
//! reason, and the checks, which must all be zero (the exit status is 1 otherwise).
//!
//! Owns: the flags, the target check, connections and the run's timeline. The scenarios live in
//! `workload`, the counting and printing in `report`. Starts no gate and no Redis: `make bench`
//! (bench/, bench/README.md) starts them and drives this load generator against them.

mod report;
mod workload;

use std::{
    net::SocketAddr,
    process::ExitCode,
    sync::Arc,
    time::{Duration, Instant},
};

use clap::ValueEnum;
use tokio::task::JoinSet;
use tonic::transport::Endpoint;

pub use report::Report;

use oncegate_proto::action_gate_service_client::ActionGateServiceClient;
use report::RunInfo;
use workload::{Shared, Worker};

/// The longest `--duration` or `--warmup` accepted, in seconds: a load run always ends.
const MAX_SECONDS: f64 = 600.0;
/// Deadline of one call: a stuck gate cannot hold a worker (or the run) forever.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// What a run loads the gate with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// Each worker requests a token for a new action and completes it (grant + complete pairs).
    GrantComplete,
    /// Requests for actions completed before the clock started; each must return its receipt.
    Replay,
    /// Many workers on `--keys` keys: never two live grants for one key, fencing always grows.
    Contended,
    /// Half new actions, four tenths replays, one tenth contended requests.
    Mix,
}

/// Settings of `oncegate bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// The gate, as host:port (or http://host:port). Only loopback addresses (127.0.0.0/8, ::1,
    /// a name resolving only to them) are accepted: this tool never loads another machine.
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub target: String,

    /// What to send.
    #[arg(long, value_enum, default_value_t = Scenario::GrantComplete)]
    pub scenario: Scenario,

    /// Concurrent callers, each with one call in flight (closed loop).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub concurrency: u32,

    /// HTTP/2 connections the callers share, round-robin.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub connections: u32,

    /// Measured time in seconds (decimals allowed), after the warm-up. At most 600.
    #[arg(long, default_value = "10", value_parser = positive_seconds)]
    pub duration: Duration,

    /// Warm-up in seconds before measuring (calls are made but not timed). At most 600.
    #[arg(long, default_value = "1", value_parser = seconds)]
    pub warmup: Duration,

    /// Number of keys the `contended` scenario (and the contended part of `mix`) fights over.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub keys: u32,

    /// Stop after this many new actions were started (grant + complete), warm-up included;
    /// `--duration` still bounds the run. For filling a store to a known size.
    #[arg(long)]
    pub actions: Option<u64>,

    /// Size of each receipt in bytes (0 for an empty receipt).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(0..=65536))]
    pub receipt_bytes: u64,

    /// Name new actions by an idempotency key (the record then also keeps per-field digests)
    /// instead of by their fingerprint.
    #[arg(long)]
    pub idempotency_keys: bool,

    /// Print the report as one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

fn seconds(text: &str) -> Result<Duration, String> {
    let value: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !(0.0..=MAX_SECONDS).contains(&value) {
        return Err(format!("must be between 0 and {MAX_SECONDS} seconds"));
    }
    Ok(Duration::from_secs_f64(value))
}

fn positive_seconds(text: &str) -> Result<Duration, String> {
    let duration = seconds(text)?;
    if duration.is_zero() {
        return Err("must be more than 0 seconds".into());
    }
    Ok(duration)
}

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The target is malformed or not a loopback address.
    #[error("refusing target {target:?}: {why}")]
    Target { target: String, why: String },
    /// The gate could not be reached.
    #[error("cannot connect to {0}")]
    Connect(String),
    /// A worker died or the run overran its bound.
    #[error("load run failed: {0}")]
    Run(String),
}

/// Runs `oncegate bench` and prints its report; exit 1 when a check failed, 64 for a refused
/// target, 69 when the gate cannot be reached or the runtime cannot start.
pub fn main(args: BenchArgs) -> ExitCode {
    // One thread: the load generator shares the cores with the gate and Redis, and a
    // current-thread runtime spends about a third less CPU per call than a multi-thread one
    // (no work stealing, no cross-thread wake-ups), leaving that CPU to what is measured.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("oncegate bench: cannot start the async runtime: {e}");
            return ExitCode::from(oncegate_config::exit::UNAVAILABLE);
        }
    };
    match runtime.block_on(run(&args)) {
        Ok(report) => {
            if args.json {
                println!("{}", report.to_json());
            } else {
                print!("{}", report.to_text());
            }
            if report.ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("oncegate bench: {e}");
            ExitCode::from(match e {
                BenchError::Target { .. } => oncegate_config::exit::USAGE,
                BenchError::Connect(_) => oncegate_config::exit::UNAVAILABLE,
                BenchError::Run(_) => 1,
            })
        }
    }
}

/// Resolves `target` and checks that every address it names is a loopback address.
pub async fn loopback_target(target: &str) -> Result<SocketAddr, BenchError> {
    let refuse = |why: &str| BenchError::Target {
        target: target.to_owned(),
        why: why.to_owned(),
    };
    let host_port = target.strip_prefix("http://").unwrap_or(target);
    if host_port.contains('/') || host_port.is_empty() {
        return Err(refuse("expected host:port"));
    }
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host(host_port)
        .await
        .map_err(|e| refuse(&format!("cannot resolve it ({e})")))?
        .collect();
    match addrs.first() {
        Some(first) if addrs.iter().all(|a| a.ip().is_loopback()) => Ok(*first),
        Some(_) => Err(refuse(
            "it is not a loopback address; oncegate bench only loads a gate on this machine",
        )),
        None => Err(refuse("it resolves to no address")),
    }
}

/// One load run: connect, prepare, warm up, measure, report.
pub async fn run(args: &BenchArgs) -> Result<Report, BenchError> {
    let addr = loopback_target(&args.target).await?;
    let mut clients = Vec::new();
    for _ in 0..args.connections {
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| BenchError::Connect(format!("{addr}: {e}")))?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(5))
            .timeout(CALL_TIMEOUT)
            .connect()
            .await
            .map_err(|e| BenchError::Connect(format!("{addr}: {e}")))?;
        clients.push(ActionGateServiceClient::new(channel));
    }
    let shared = Arc::new(Shared::new(
        args.scenario,
        args.keys,
        usize::try_from(args.receipt_bytes).unwrap_or(0),
        args.idempotency_keys,
        args.actions,
    ));

    let mut preparing = JoinSet::new();
    for id in 0..args.concurrency {
        let client = clients[id as usize % clients.len()].clone();
        preparing.spawn(Worker::new(id, client, shared.clone()).prepare());
    }
    let workers = join_all(preparing).await?;

    let started = Instant::now();
    let start = started + args.warmup;
    let end = start + args.duration;
    let mut running = JoinSet::new();
    for worker in workers {
        running.spawn(worker.run(start, end));
    }
    // Every call has a deadline, so the workers end soon after `end`; this bounds the rest.
    let bound = tokio::time::Instant::from_std(end) + CALL_TIMEOUT * 3;
    let tallies = tokio::time::timeout_at(bound, join_all(running))
        .await
        .map_err(|_| BenchError::Run("the workers did not stop in time".into()))??;
    // With --actions the run may stop before `end`: throughput is over the time really measured.
    let measured = Instant::now().min(end).saturating_duration_since(start);
    let info = RunInfo {
        scenario: args
            .scenario
            .to_possible_value()
            .map_or_else(String::new, |v| v.get_name().to_owned()),
        target: addr.to_string(),
        concurrency: args.concurrency,
        connections: args.connections,
        duration: measured,
        warmup: args.warmup,
    };
    Ok(Report::build(info, tallies))
}

async fn join_all<T: 'static>(mut set: JoinSet<T>) -> Result<Vec<T>, BenchError> {
    let mut out = Vec::with_capacity(set.len());
    while let Some(joined) = set.join_next().await {
        out.push(joined.map_err(|e| BenchError::Run(format!("a worker failed: {e}")))?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_loopback_targets_are_accepted() {
        for ok in [
            "127.0.0.1:50051",
            "http://127.0.0.1:1",
            "[::1]:50051",
            "localhost:50051",
        ] {
            assert!(loopback_target(ok).await.is_ok(), "{ok} should be accepted");
        }
        for bad in [
            "10.0.0.1:50051",
            "192.168.1.1:80",
            "8.8.8.8:53",
            "0.0.0.0:50051",
            "http://127.0.0.1:1/path",
            "",
        ] {
            assert!(
                matches!(loopback_target(bad).await, Err(BenchError::Target { .. })),
                "{bad} should be refused"
            );
        }
    }

    #[test]
    fn durations_are_bounded() {
        assert_eq!(seconds("1.5"), Ok(Duration::from_millis(1500)));
        assert!(seconds("601").is_err());
        assert!(seconds("-1").is_err());
        assert!(seconds("soon").is_err());
        assert!(positive_seconds("0").is_err());
    }
}
