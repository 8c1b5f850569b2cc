//! `oncegate bench` as `make bench` uses it: a real process loading a real gate for a short while
//! per scenario, on both stores. Checks that the report is well-formed and that every correctness
//! counter is zero. Never a timing assertion: these machines are shared and noisy.

use serde_json::Value;

use crate::support::{Kind, TestGate, on_stores};

async fn oncegate_bench(args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_oncegate"))
        .arg("bench")
        .args(args)
        .output()
        .await
        .unwrap()
}

/// Runs one scenario for ~1.5 s and returns its JSON report, after the checks every report passes.
async fn run_scenario(addr: &str, scenario: &str) -> Value {
    let out = oncegate_bench(&[
        "--target",
        addr,
        "--scenario",
        scenario,
        "--concurrency",
        "8",
        "--connections",
        "2",
        "--keys",
        "2",
        "--duration",
        "1.5",
        "--warmup",
        "0.2",
        "--json",
    ])
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{scenario}: {stderr}");
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{scenario}: not JSON ({e}): {stderr}"));
    assert_eq!(report["scenario"], scenario);
    assert_eq!(report["ok"], true, "{report:#}");
    assert_eq!(report["violations"], 0, "{report:#}");
    for (check, value) in report["checks"].as_object().unwrap() {
        assert_eq!(
            value, 0,
            "{scenario}: check {check} is not zero: {report:#}"
        );
    }
    assert!(
        report["throughput"]["request_token_per_s"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    let latency = &report["latency_ms"]["request_token"];
    assert!(latency["count"].as_u64().unwrap() > 0, "{report:#}");
    let p = |name: &str| latency[name].as_f64().unwrap();
    assert!(p("p50") > 0.0 && p("p50") <= p("p90") && p("p90") <= p("p99"));
    assert!(p("p99") <= p("p999") && p("p999") <= p("max"));
    report
}

fn count(report: &Value, rpc: &str, outcome: &str) -> u64 {
    report["outcomes"][rpc][outcome].as_u64().unwrap_or(0)
}

async fn bench_reports_every_scenario(kind: Kind) {
    let gate = TestGate::start(kind).await;
    let addr = gate.addr.to_string();

    let report = run_scenario(&addr, "grant-complete").await;
    assert!(count(&report, "request_token", "granted") > 0);
    assert!(count(&report, "complete", "completed") > 0);
    assert!(report["throughput"]["pairs_per_s"].as_f64().unwrap() > 0.0);

    let report = run_scenario(&addr, "replay").await;
    let replays = count(&report, "request_token", "already_completed");
    assert!(replays > 0);
    assert_eq!(
        replays,
        report["latency_ms"]["request_token"]["count"]
            .as_u64()
            .unwrap(),
        "every timed replay returned the stored receipt: {report:#}"
    );

    let report = run_scenario(&addr, "contended").await;
    assert!(count(&report, "request_token", "granted") > 0, "{report:#}");
    // 8 callers on 2 keys: most requests meet a live lease.
    assert!(count(&report, "request_token", "IDEMPOTENCY_IN_PROGRESS") > 0);

    run_scenario(&addr, "mix").await;
}
on_stores!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    bench_reports_every_scenario: embedded, redis
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_prints_a_readable_report_and_stops_after_actions() {
    let gate = TestGate::start(Kind::Embedded).await;
    let addr = gate.addr.to_string();
    let out = oncegate_bench(&[
        "--target",
        &addr,
        "--concurrency",
        "4",
        "--actions",
        "40",
        "--duration",
        "30",
        "--warmup",
        "0",
    ])
    .await;
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for expected in [
        "oncegate bench: grant-complete against",
        "throughput:",
        "request_token",
        "granted 40",
        "completed 40",
        "checks: violations 0",
        "result: OK",
    ] {
        assert!(
            text.contains(expected),
            "{expected:?} missing from:\n{text}"
        );
    }
}

#[tokio::test]
async fn bench_refuses_targets_off_this_machine() {
    for target in ["10.1.2.3:50051", "192.168.0.10:50051", "0.0.0.0:50051"] {
        let out = oncegate_bench(&["--target", target, "--duration", "1"]).await;
        assert_eq!(out.status.code(), Some(64), "{target}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("loopback"));
    }
}

/// A load generator the system refuses descriptors (`prlimit --nofile`: enough for the loader,
/// too few for the runtime's epoll and its waker) says why and exits 69, as the gate does, not 1,
/// which is for a run whose checks failed.
#[tokio::test]
async fn a_runtime_the_system_refuses_exits_69_saying_why() {
    let out = tokio::process::Command::new("prlimit")
        .args(["--nofile=4:4", env!("CARGO_BIN_EXE_oncegate"), "bench"])
        .args(["--target", "127.0.0.1:1", "--duration", "1"])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{stderr}");
    assert!(
        stderr.contains("oncegate bench: cannot start the async runtime"),
        "{stderr}"
    );
}
