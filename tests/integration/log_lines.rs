//! The gate's log lines under load. A current-thread runtime's thread (every serving thread, the
//! first one with `--worker-threads 1`) holds the lines of a busy stretch and writes them together
//! when it goes idle (`crates/observe/src/telemetry/held.rs`); a multi-thread runtime writes each
//! line at once. Either way every call's lines reach standard error, whole and in each call's
//! order, while the gate serves and when it stops.

use std::collections::BTreeMap;

use tempfile::TempDir;

use crate::support::{LoggedGate, complete, connect, grant, token_request};

const CALLERS: usize = 16;
const ACTIONS: usize = 20;

#[tokio::test]
async fn every_calls_lines_reach_the_log_whole_and_in_order_from_held_threads() {
    lines_of_busy_callers("1").await;
}

#[tokio::test]
async fn every_calls_lines_reach_the_log_whole_and_in_order_beside_a_multi_thread_runtime() {
    lines_of_busy_callers("2").await;
}

/// Busy callers on a gate with two serving threads, the first a runtime of `workers` threads;
/// then its log, line by line, and its last lines when it stops.
async fn lines_of_busy_callers(workers: &str) {
    let dir = TempDir::new().unwrap();
    let mut gate = LoggedGate::start(
        &dir,
        &[
            "--listen",
            "127.0.0.1:0",
            "--serving-threads",
            "2",
            "--worker-threads",
            workers,
        ],
    );
    // Callers on connections of their own (dealt to both serving threads), all at once.
    let mut callers = tokio::task::JoinSet::new();
    for caller in 0..CALLERS {
        let addr = gate.addr.clone();
        callers.spawn(async move {
            let mut client = connect(&addr).await;
            for action in 0..ACTIONS {
                let run = format!("run-{caller}-{action}");
                let req = token_request("logged", &run, "payments.transfer", r#"{"amount":5}"#);
                let (action, grant) = grant(&mut client, req).await;
                complete(&mut client, &action, &grant.token, b"{}")
                    .await
                    .unwrap();
            }
        });
    }
    callers.join_all().await;

    // Nothing is left to serve: each thread goes idle and writes what it held.
    let calls = CALLERS * ACTIONS;
    let log = gate.wait_for_log("oncegate::rpc: finished", 2 * calls);
    let mut per_run: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for line in log.lines() {
        // Whole lines: each starts with its timestamp, none cut into by another.
        assert!(
            line.len() > 30 && line.as_bytes()[4] == b'-' && line.as_bytes()[10] == b'T',
            "not a whole line: {line:?}"
        );
        assert_eq!(
            line.matches(" INFO ").count() + line.matches(" WARN ").count(),
            1,
            "{line:?}"
        );
        if let Some(run) = line.split(" run_id=").nth(1) {
            let run = run.split([' ', '}']).next().unwrap().to_owned();
            let what = if line.contains("oncegate::audit: ") {
                line.split("oncegate::audit: ")
                    .nth(1)
                    .unwrap()
                    .split(' ')
                    .next()
                    .unwrap()
            } else if line.contains("oncegate::rpc: finished") {
                if line.contains("/RequestToken ") {
                    "finished RequestToken"
                } else {
                    "finished Complete"
                }
            } else {
                continue;
            };
            per_run.entry(run).or_default().push(what);
        }
    }
    assert_eq!(per_run.len(), calls, "every action's lines");
    for (run, lines) in &per_run {
        assert_eq!(
            lines,
            &[
                "request_token",
                "finished RequestToken",
                "complete",
                "finished Complete"
            ],
            "{run}: each call's audit line, then its end, in the order the calls came"
        );
    }

    // Stopping: what the gate logs while it drains and stops is written before it exits.
    assert!(gate.terminate().success());
    let log = gate.log();
    assert!(log.contains("shutting down: no new calls"), "{log}");
    assert!(log.trim_end().ends_with("stopped"), "{log}");
}
