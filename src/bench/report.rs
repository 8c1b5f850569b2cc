//! What one load run measured: per-worker tallies (latency histograms, outcome counts, correctness
//! counters), merged into one [`Report`] printed as text or JSON.
//!
//! Owns: counting and rendering. Does not send requests (see `workload`).

use std::{collections::BTreeMap, fmt::Write as _, time::Duration};

use hdrhistogram::Histogram;
use serde::Serialize;

/// The RPCs the load tool times, in the order they are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rpc {
    RequestToken,
    Complete,
    Release,
}

impl Rpc {
    const ALL: [Rpc; 3] = [Rpc::RequestToken, Rpc::Complete, Rpc::Release];

    fn name(self) -> &'static str {
        match self {
            Rpc::RequestToken => "request_token",
            Rpc::Complete => "complete",
            Rpc::Release => "release",
        }
    }
}

/// Correctness checks made while loading. Every one of them must stay zero.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Checks {
    /// `contended`: a grant arrived while another worker still held a live lease on the key.
    pub double_grants: u64,
    /// `contended`: a grant's fencing number was not above every earlier grant's on the key.
    pub fencing_regressions: u64,
    /// `contended`: a grant for a key whose action had already been completed.
    pub grants_after_completion: u64,
    /// `replay`: a replay answered with another receipt or token than the stored ones.
    pub receipt_mismatches: u64,
    /// Any reply the scenario cannot produce on a correct gate (a replay of a new action, a
    /// refused Complete of a fresh grant, a store error...).
    pub unexpected: u64,
}

impl Checks {
    fn add(&mut self, other: &Checks) {
        self.double_grants += other.double_grants;
        self.fencing_regressions += other.fencing_regressions;
        self.grants_after_completion += other.grants_after_completion;
        self.receipt_mismatches += other.receipt_mismatches;
        self.unexpected += other.unexpected;
    }

    /// Broken guarantees (not counting unexpected replies).
    pub fn violations(&self) -> u64 {
        self.double_grants
            + self.fencing_regressions
            + self.grants_after_completion
            + self.receipt_mismatches
    }
}

/// What one worker saw during the measured window.
pub struct Tally {
    latency: BTreeMap<Rpc, Histogram<u64>>,
    outcomes: BTreeMap<Rpc, BTreeMap<String, u64>>,
    /// Grant + Complete pairs that finished inside the window.
    pub pairs: u64,
    pub checks: Checks,
}

impl Tally {
    pub fn new() -> Self {
        Self {
            latency: BTreeMap::new(),
            outcomes: BTreeMap::new(),
            pairs: 0,
            checks: Checks::default(),
        }
    }

    /// Records one call: its latency and its outcome (a decision or an ErrorInfo reason).
    pub fn record(&mut self, rpc: Rpc, elapsed: Duration, outcome: &str) {
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        self.latency
            .entry(rpc)
            .or_insert_with(new_histogram)
            .saturating_record(micros.max(1));
        *self
            .outcomes
            .entry(rpc)
            .or_default()
            .entry(outcome.to_owned())
            .or_default() += 1;
    }

    fn merge(&mut self, other: Tally) {
        for (rpc, histogram) in other.latency {
            let mine = self.latency.entry(rpc).or_insert_with(new_histogram);
            // Both histograms cover the same range, so adding cannot fail.
            let _ = mine.add(&histogram);
        }
        for (rpc, counts) in other.outcomes {
            let mine = self.outcomes.entry(rpc).or_default();
            for (outcome, n) in counts {
                *mine.entry(outcome).or_default() += n;
            }
        }
        self.pairs += other.pairs;
        self.checks.add(&other.checks);
    }
}

impl Default for Tally {
    fn default() -> Self {
        Self::new()
    }
}

/// 1 µs to 60 s at three significant digits.
fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

/// Latency percentiles of one RPC, in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub count: u64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

/// Calls per second over the measured window.
#[derive(Debug, Clone, Serialize)]
pub struct Throughput {
    pub request_token_per_s: f64,
    pub pairs_per_s: f64,
    pub rpcs_per_s: f64,
}

/// The result of one run, as printed (`--json` prints exactly this).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub scenario: String,
    pub target: String,
    pub concurrency: u32,
    pub connections: u32,
    pub duration_s: f64,
    pub warmup_s: f64,
    pub throughput: Throughput,
    pub latency_ms: BTreeMap<&'static str, Latency>,
    pub outcomes: BTreeMap<&'static str, BTreeMap<String, u64>>,
    pub checks: Checks,
    pub violations: u64,
    /// True when no guarantee was broken and no reply was unexpected.
    pub ok: bool,
}

/// How the run was set up, for the report's header.
pub struct RunInfo {
    pub scenario: String,
    pub target: String,
    pub concurrency: u32,
    pub connections: u32,
    pub duration: Duration,
    pub warmup: Duration,
}

impl Report {
    /// Merges the workers' tallies into one report.
    pub fn build(info: RunInfo, tallies: Vec<Tally>) -> Self {
        let mut total = Tally::new();
        for tally in tallies {
            total.merge(tally);
        }
        let seconds = info.duration.as_secs_f64().max(1e-9);
        let count = |rpc: Rpc| total.latency.get(&rpc).map_or(0, Histogram::len);
        let rpcs: u64 = Rpc::ALL.iter().map(|rpc| count(*rpc)).sum();
        let latency_ms = Rpc::ALL
            .iter()
            .filter_map(|rpc| Some((rpc.name(), total.latency.get(rpc)?)))
            .map(|(name, h)| {
                let ms = |micros: u64| micros as f64 / 1000.0;
                let latency = Latency {
                    count: h.len(),
                    p50: ms(h.value_at_quantile(0.50)),
                    p90: ms(h.value_at_quantile(0.90)),
                    p99: ms(h.value_at_quantile(0.99)),
                    p999: ms(h.value_at_quantile(0.999)),
                    max: ms(h.max()),
                };
                (name, latency)
            })
            .collect();
        let outcomes = total
            .outcomes
            .into_iter()
            .map(|(rpc, counts)| (rpc.name(), counts))
            .collect();
        let violations = total.checks.violations();
        Self {
            scenario: info.scenario,
            target: info.target,
            concurrency: info.concurrency,
            connections: info.connections,
            duration_s: info.duration.as_secs_f64(),
            warmup_s: info.warmup.as_secs_f64(),
            throughput: Throughput {
                request_token_per_s: count(Rpc::RequestToken) as f64 / seconds,
                pairs_per_s: total.pairs as f64 / seconds,
                rpcs_per_s: rpcs as f64 / seconds,
            },
            latency_ms,
            outcomes,
            checks: total.checks,
            violations,
            ok: violations == 0 && total.checks.unexpected == 0,
        }
    }

    /// The report as one JSON object.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report always serialises")
    }

    /// The report for a person.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "oncegate bench: {} against {}, {} callers on {} connection(s), {:.1} s measured after {:.1} s warm-up",
            self.scenario,
            self.target,
            self.concurrency,
            self.connections,
            self.duration_s,
            self.warmup_s
        );
        let t = &self.throughput;
        let _ = writeln!(
            out,
            "throughput: {:.0} RequestToken/s, {:.0} grant+complete pairs/s, {:.0} RPCs/s",
            t.request_token_per_s, t.pairs_per_s, t.rpcs_per_s
        );
        let _ = writeln!(
            out,
            "latency (ms)    {:>9} {:>8} {:>8} {:>8} {:>8} {:>8}",
            "count", "p50", "p90", "p99", "p99.9", "max"
        );
        let ordered = Rpc::ALL
            .iter()
            .filter_map(|rpc| self.latency_ms.get_key_value(rpc.name()));
        for (name, l) in ordered {
            let _ = writeln!(
                out,
                "  {name:<14}{:>9} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>8.3}",
                l.count, l.p50, l.p90, l.p99, l.p999, l.max
            );
        }
        let _ = writeln!(out, "outcomes:");
        let ordered = Rpc::ALL
            .iter()
            .filter_map(|rpc| self.outcomes.get_key_value(rpc.name()));
        for (name, counts) in ordered {
            let list: Vec<String> = counts.iter().map(|(k, n)| format!("{k} {n}")).collect();
            let _ = writeln!(out, "  {name}: {}", list.join(", "));
        }
        let c = &self.checks;
        let _ = writeln!(
            out,
            "checks: violations {} (double grants {}, fencing regressions {}, grants after completion {}, \
             replay receipt mismatches {}); unexpected replies {}",
            self.violations,
            c.double_grants,
            c.fencing_regressions,
            c.grants_after_completion,
            c.receipt_mismatches,
            c.unexpected
        );
        let _ = writeln!(out, "result: {}", if self.ok { "OK" } else { "FAILED" });
        out
    }
}
