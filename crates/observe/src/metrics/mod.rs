//! The gate's Prometheus metrics: a struct of handles registered once on a [`Registry`] that `main`
//! owns and passes down (the linkerd style), and the `/metrics` endpoint in [`endpoint`].
//!
//! Owns: metric names, label sets, the bounded `action` label, and the definition of a *blocked
//! duplicate* (the numerator of the duplicate-action rate). Does not own: where decisions are made
//! (the gate calls in here), nor RPC timing (the [`super::telemetry`] layer calls in here).
//!
//! Every label takes values from a closed set, so no client can grow the number of series: the
//! `action` label is the name of the policy that governs the action (`payments.transfer`,
//! `payments.*`) or one configurable value for every action no policy names.

pub mod endpoint;
mod labels;

use std::{sync::Arc, time::Duration};

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::{Registry, Unit},
};

use oncegate_domain::ledger::Source;

use labels::{
    AttemptLabels, BlockedLabels, BudgetLabels, BuildLabels, EventLabels, ExpiredLabels,
    KindLabels, OperationLabels, ReasonLabels, ResolutionLabels, RpcLabels, SourceLabels,
    StoreErrorLabels, WebhookLabels,
};
pub use labels::{
    Decision, DoubleExecution, RELEASE_REASONS, STORE_ERRORS, STORE_OPERATIONS, WEBHOOK_OUTCOMES,
    code_name,
};

/// The `mode` label values: decisions enforced, and decisions of shadow mode (granted anyway).
pub const MODES: [&str; 2] = ["enforce", "shadow"];

/// The `resolved_by` label values of `oncegate_resolutions_total`: a person (an operator
/// principal) or an automatic resolver (a resolver principal).
pub const RESOLVED_BY: [&str; 2] = ["operator", "resolver"];

/// The `resolution` label values of `oncegate_resolutions_total`.
pub const RESOLUTIONS: [&str; 2] = ["completed", "failed"];

/// The `decision` label values of `oncegate_budget_decisions_total`.
pub const BUDGET_DECISIONS: [&str; 2] = ["reserved", "exceeded"];

/// The `action` label of every action no policy names, unless configured otherwise.
pub const DEFAULT_OTHER_ACTION: &str = "other";

type LatencyFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Latency buckets from 0.5 ms to 10 s: a Redis round trip sits in the first few, a store call
/// that hits the default 2 s deadline in the last ones.
fn latency_histogram() -> Histogram {
    Histogram::new([
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ])
}

struct Handles {
    other_action: String,
    /// Every `action` label: the policies' names, then the other-action label.
    actions: std::sync::OnceLock<Vec<String>>,
    attempts: Family<AttemptLabels, Counter>,
    blocked: Family<BlockedLabels, Counter>,
    expired: Family<ExpiredLabels, Counter>,
    completions: Family<SourceLabels, Counter>,
    releases: Family<ReasonLabels, Counter>,
    resolutions: Family<ResolutionLabels, Counter>,
    double_executions: Family<KindLabels, Counter>,
    store_errors: Family<StoreErrorLabels, Counter>,
    store_latency: LatencyFamily<OperationLabels>,
    rpc_latency: LatencyFamily<RpcLabels>,
    store_up: Gauge,
    unresolved: Gauge,
    budgets: Family<BudgetLabels, Counter>,
    webhook_deliveries: Family<WebhookLabels, Counter>,
    webhook_pending: Gauge,
    webhook_undeliverable: Gauge,
    events_dropped: Family<EventLabels, Counter>,
}

/// One action label's duplicate-action rate counts (docs/operators.md defines the DAR).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionDar {
    /// The `action` label: a policy's name, or the other-action label.
    pub action: String,
    /// RequestToken calls that got a decision (`oncegate_attempts_total`).
    pub attempts: u64,
    /// Of those, blocked duplicates (`oncegate_blocked_duplicates_total`).
    pub blocked: u64,
}

impl ActionDar {
    /// blocked / attempts; `None` before the first attempt.
    pub fn rate(&self) -> Option<f64> {
        (self.attempts > 0).then(|| self.blocked as f64 / self.attempts as f64)
    }
}

/// The gate's metric handles. Cheap to clone; every clone counts into the same series.
///
/// [`Metrics::default`] counts into a registry nobody reads (for gates built without metrics, and
/// tests); [`Metrics::register`] registers the handles on the caller's registry.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Handles>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::register(&mut Registry::default(), [], DEFAULT_OTHER_ACTION)
    }
}

impl Metrics {
    /// Checks the label that stands for every action no policy names: it must be non-empty and
    /// must not be a policy's name (the two series would be indistinguishable).
    pub fn check_other_action_label<'a>(
        label: &str,
        policy_names: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), String> {
        if label.is_empty() {
            return Err("the other-action metrics label must not be empty".into());
        }
        if policy_names.into_iter().any(|name| name == label) {
            return Err(format!(
                "the other-action metrics label {label:?} is also the name of a policy"
            ));
        }
        Ok(())
    }

    /// Registers every metric on `registry` and returns the handles. Series of bounded label sets
    /// (every policy × decision, every store operation...) start at zero, so that `increase()` in
    /// an alert sees the first event of a series instead of its birth.
    pub fn register<'a>(
        registry: &mut Registry,
        policy_names: impl IntoIterator<Item = &'a str>,
        other_action: &str,
    ) -> Self {
        let handles = Handles {
            other_action: other_action.to_owned(),
            actions: std::sync::OnceLock::new(),
            attempts: Family::default(),
            blocked: Family::default(),
            expired: Family::default(),
            completions: Family::default(),
            releases: Family::default(),
            resolutions: Family::default(),
            double_executions: Family::default(),
            store_errors: Family::default(),
            store_latency: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            rpc_latency: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            store_up: Gauge::default(),
            unresolved: Gauge::default(),
            budgets: Family::default(),
            webhook_deliveries: Family::default(),
            webhook_pending: Gauge::default(),
            webhook_undeliverable: Gauge::default(),
            events_dropped: Family::default(),
        };
        let build_info = Family::<BuildLabels, Gauge>::default();
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
                commit: option_env!("ONCEGATE_GIT_COMMIT").unwrap_or("unknown"),
            })
            .set(1);
        let r = registry.sub_registry_with_prefix("oncegate");
        r.register(
            "attempts",
            "RequestToken calls by action, decision (granted, redelivered, regranted, replayed, \
             in_progress, key_reused, lease_expired, invalid, policy_denied, approval_denied, pending_approval, \
             budget_exceeded) and mode (enforce; shadow: what enforcement would have decided, \
             granted anyway); the DAR denominator",
            handles.attempts.clone(),
        );
        r.register(
            "blocked_duplicates",
            "RequestToken calls refused or answered with a replay instead of a second execution \
             (reason: replayed, in_progress, key_reused, lease_expired), by mode (shadow: would \
             have been); the DAR numerator",
            handles.blocked.clone(),
        );
        r.register(
            "unresolved_expired_leases",
            "RequestToken calls that met a lease that had ended without Complete or Release \
             (on_expiry: reconcile = refused, regrant = superseded by a new token)",
            handles.expired.clone(),
        );
        r.register(
            "completions",
            "Completions recorded, by source (worker, operator); repeated Completes are not counted",
            handles.completions.clone(),
        );
        r.register(
            "releases",
            "Successful Release calls, by reason",
            handles.releases.clone(),
        );
        r.register(
            "resolutions",
            "Expired leases settled by ResolveExpired, by who settled them (resolved_by: operator, \
             a person; resolver, an automatic resolver that asked the provider) and resolution \
             (completed, failed)",
            handles.resolutions.clone(),
        );
        r.register(
            "double_executions",
            "Signs that an action ran twice (kind: completed_by_other, superseded_completion)",
            handles.double_executions.clone(),
        );
        r.register(
            "store_errors",
            "Store calls that failed (error: unavailable, corrupt), by operation; nothing was granted",
            handles.store_errors.clone(),
        );
        r.register_with_unit(
            "store_duration",
            "Store round trip of one state-machine step, by operation (errors included)",
            Unit::Seconds,
            handles.store_latency.clone(),
        );
        r.register_with_unit(
            "rpc_duration",
            "gRPC call latency of the gate's services, by RPC and gRPC status code",
            Unit::Seconds,
            handles.rpc_latency.clone(),
        );
        r.register(
            "store_up",
            "1 while the store answers the health probe, 0 while it does not",
            handles.store_up.clone(),
        );
        r.register(
            "unresolved_actions",
            "Actions whose outcome is unknown, as of the last count: leases that ended without \
             Complete or Release, superseded grants still out. They never expire on their own; \
             it stays above 0 until each one is reconciled (capped at the count's limit)",
            handles.unresolved.clone(),
        );
        r.register(
            "budget_decisions",
            "Budget and velocity-cap checks of grants, by budget, decision (reserved, exceeded) \
             and mode (enforce, shadow)",
            handles.budgets.clone(),
        );
        r.register(
            "webhook_deliveries",
            "Webhook delivery attempts, by webhook, event type and outcome (delivered: a 2xx; \
             failed: retried later; undeliverable: the last attempt failed, given up)",
            handles.webhook_deliveries.clone(),
        );
        r.register(
            "webhook_outbox_pending",
            "Events in the outbox waiting for delivery (or being delivered), as of the last claim",
            handles.webhook_pending.clone(),
        );
        r.register(
            "webhook_undeliverable",
            "Events given up after their last attempt, kept for the retention (oncegate admin \
             webhooks lists them), as of the last claim",
            handles.webhook_undeliverable.clone(),
        );
        r.register(
            "webhook_events_dropped",
            "Events dropped before the outbox because the gate's event queue was full, by type",
            handles.events_dropped.clone(),
        );
        r.register("build_info", "The running build (always 1)", build_info);
        let metrics = Self {
            inner: Arc::new(handles),
        };
        metrics.zero_bounded_series(policy_names);
        metrics
    }

    /// Starts every budget's series at zero (the budget names are the configuration's).
    pub fn register_budgets<'a>(&self, names: impl IntoIterator<Item = &'a str>) {
        for budget in names {
            for decision in BUDGET_DECISIONS {
                for mode in MODES {
                    let _ = self.inner.budgets.get_or_create(&BudgetLabels {
                        budget: budget.to_owned(),
                        decision,
                        mode,
                    });
                }
            }
        }
    }

    /// Starts the webhook series of `webhooks` for the event types `events` at zero.
    pub fn register_webhooks<'a>(
        &self,
        webhooks: impl IntoIterator<Item = &'a str>,
        events: &[&'static str],
    ) {
        for webhook in webhooks {
            for &event in events {
                for outcome in WEBHOOK_OUTCOMES {
                    let _ = self.inner.webhook_deliveries.get_or_create(&WebhookLabels {
                        webhook: webhook.to_owned(),
                        event,
                        outcome,
                    });
                }
            }
        }
        for &event in events {
            let _ = self
                .inner
                .events_dropped
                .get_or_create(&EventLabels { event });
        }
    }

    /// Counts one webhook delivery attempt; `outcome` is one of [`WEBHOOK_OUTCOMES`].
    pub fn webhook_delivery(&self, webhook: &str, event: &'static str, outcome: &'static str) {
        self.inner
            .webhook_deliveries
            .get_or_create(&WebhookLabels {
                webhook: webhook.to_owned(),
                event,
                outcome,
            })
            .inc();
    }

    /// Sets the outbox gauges (the last claim's view).
    pub fn set_outbox(&self, pending: u64, undeliverable: u64) {
        let h = &self.inner;
        h.webhook_pending
            .set(i64::try_from(pending).unwrap_or(i64::MAX));
        h.webhook_undeliverable
            .set(i64::try_from(undeliverable).unwrap_or(i64::MAX));
    }

    /// Counts an event dropped because the event queue was full.
    pub fn event_dropped(&self, event: &'static str) {
        self.inner
            .events_dropped
            .get_or_create(&EventLabels { event })
            .inc();
    }

    /// The duplicate-action rate's counts per `action` label since this process started (both
    /// modes, as `oncegate:dar_by_action:ratio_rate5m` sums them), read from the counters
    /// themselves: what the operator console shows. Every label set is bounded and started at
    /// zero, so reading them creates no series.
    pub fn duplicate_rates(&self) -> Vec<ActionDar> {
        let h = &self.inner;
        let actions = h.actions.get().map(Vec::as_slice).unwrap_or_default();
        actions
            .iter()
            .map(|action| {
                let mut row = ActionDar {
                    action: action.clone(),
                    attempts: 0,
                    blocked: 0,
                };
                for decision in Decision::ALL {
                    for mode in MODES {
                        let labels = AttemptLabels {
                            action: action.clone(),
                            decision: decision.as_str(),
                            mode,
                        };
                        row.attempts += h.attempts.get_or_create(&labels).get();
                        if decision.is_blocked_duplicate() {
                            let labels = BlockedLabels {
                                action: action.clone(),
                                reason: decision.as_str(),
                                mode,
                            };
                            row.blocked += h.blocked.get_or_create(&labels).get();
                        }
                    }
                }
                row
            })
            .collect()
    }

    /// Counts one budget check of a grant: `decision` is one of [`BUDGET_DECISIONS`], `mode` one
    /// of [`MODES`].
    pub fn budget(&self, budget: &str, decision: &'static str, mode: &'static str) {
        self.inner
            .budgets
            .get_or_create(&BudgetLabels {
                budget: budget.to_owned(),
                decision,
                mode,
            })
            .inc();
    }

    fn zero_bounded_series<'a>(&self, policy_names: impl IntoIterator<Item = &'a str>) {
        let h = &self.inner;
        let mut actions: Vec<String> = policy_names.into_iter().map(str::to_owned).collect();
        actions.push(h.other_action.clone());
        let actions = h.actions.get_or_init(|| actions);
        for action in actions {
            for on_expiry in ["reconcile", "regrant"] {
                let _ = h.expired.get_or_create(&ExpiredLabels {
                    action: action.to_owned(),
                    on_expiry,
                });
            }
            for decision in Decision::ALL {
                for mode in MODES {
                    let _ = h.attempts.get_or_create(&AttemptLabels {
                        action: action.to_owned(),
                        decision: decision.as_str(),
                        mode,
                    });
                    if decision.is_blocked_duplicate() {
                        let _ = h.blocked.get_or_create(&BlockedLabels {
                            action: action.to_owned(),
                            reason: decision.as_str(),
                            mode,
                        });
                    }
                }
            }
        }
        for source in ["worker", "operator"] {
            let _ = h.completions.get_or_create(&SourceLabels { source });
        }
        for reason in RELEASE_REASONS {
            let _ = h.releases.get_or_create(&ReasonLabels { reason });
        }
        for resolved_by in RESOLVED_BY {
            for resolution in RESOLUTIONS {
                let _ = h.resolutions.get_or_create(&ResolutionLabels {
                    resolved_by,
                    resolution,
                });
            }
        }
        for kind in DoubleExecution::ALL {
            let _ = h.double_executions.get_or_create(&KindLabels {
                kind: kind.as_str(),
            });
        }
        for kind in oncegate_domain::event::EventType::ALL {
            let _ = h
                .events_dropped
                .get_or_create(&EventLabels { event: kind.name() });
        }
        for operation in STORE_OPERATIONS {
            for error in STORE_ERRORS {
                let _ = h
                    .store_errors
                    .get_or_create(&StoreErrorLabels { operation, error });
            }
        }
    }

    /// The `action` label of an action governed by the policy named `policy` (`None`: no policy
    /// names it).
    pub fn action_label<'a>(&'a self, policy: Option<&'a str>) -> &'a str {
        policy.unwrap_or(&self.inner.other_action)
    }

    /// Counts one enforced RequestToken decision for an action governed by the policy named
    /// `policy`.
    pub fn attempt(&self, policy: Option<&str>, decision: Decision) {
        self.attempt_in(policy, decision, "enforce");
    }

    /// Counts one RequestToken decision in `mode` (one of [`MODES`]): `shadow` for what
    /// enforcement would have decided where the gate granted anyway.
    pub fn attempt_in(&self, policy: Option<&str>, decision: Decision, mode: &'static str) {
        let h = &self.inner;
        let action = self.action_label(policy).to_owned();
        if decision.is_blocked_duplicate() {
            h.blocked
                .get_or_create(&BlockedLabels {
                    action: action.clone(),
                    reason: decision.as_str(),
                    mode,
                })
                .inc();
        }
        let on_expiry = match decision {
            Decision::LeaseExpired => Some("reconcile"),
            Decision::Regranted => Some("regrant"),
            _ => None,
        };
        if let Some(on_expiry) = on_expiry {
            h.expired
                .get_or_create(&ExpiredLabels {
                    action: action.clone(),
                    on_expiry,
                })
                .inc();
        }
        h.attempts
            .get_or_create(&AttemptLabels {
                action,
                decision: decision.as_str(),
                mode,
            })
            .inc();
    }

    /// Counts a recorded completion. The operator path (the admin API) calls this with
    /// [`Source::Operator`].
    pub fn completion(&self, source: Source) {
        let source = match source {
            Source::Worker => "worker",
            Source::Operator => "operator",
        };
        self.inner
            .completions
            .get_or_create(&SourceLabels { source })
            .inc();
    }

    /// Counts a successful Release; a reason outside [`RELEASE_REASONS`] is counted as `other`.
    pub fn release(&self, reason: &str) {
        let reason = RELEASE_REASONS
            .into_iter()
            .find(|r| *r == reason)
            .unwrap_or("other");
        self.inner
            .releases
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Counts an expired lease settled by ResolveExpired: `resolved_by` one of [`RESOLVED_BY`],
    /// `completed` or failed.
    pub fn resolution(&self, resolved_by: &'static str, completed: bool) {
        let resolution = RESOLUTIONS[usize::from(!completed)];
        self.inner
            .resolutions
            .get_or_create(&ResolutionLabels {
                resolved_by,
                resolution,
            })
            .inc();
    }

    /// Counts a sign of a double execution.
    pub fn double_execution(&self, kind: DoubleExecution) {
        self.inner
            .double_executions
            .get_or_create(&KindLabels {
                kind: kind.as_str(),
            })
            .inc();
    }

    /// Records one store call: its round trip, and its error if it failed. `operation` is one of
    /// [`STORE_OPERATIONS`], `error` one of [`STORE_ERRORS`].
    pub fn store_call(
        &self,
        operation: &'static str,
        elapsed: Duration,
        error: Option<&'static str>,
    ) {
        let h = &self.inner;
        h.store_latency
            .get_or_create(&OperationLabels { operation })
            .observe(elapsed.as_secs_f64());
        if let Some(error) = error {
            h.store_errors
                .get_or_create(&StoreErrorLabels { operation, error })
                .inc();
        }
    }

    /// Records one gRPC call of the gate's services. `rpc` is `package.Service/Method`, taken only
    /// from methods the server implements (the caller's responsibility), so it stays bounded.
    pub fn rpc(&self, rpc: &str, code: tonic::Code, elapsed: Duration) {
        self.inner
            .rpc_latency
            .get_or_create(&RpcLabels {
                rpc: rpc.to_owned(),
                code: code_name(code),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// Sets the store gauge (the health probe's view).
    pub fn set_store_up(&self, up: bool) {
        self.inner.store_up.set(i64::from(up));
    }

    /// Sets the number of unresolved actions (the periodic count's view).
    pub fn set_unresolved(&self, count: usize) {
        self.inner
            .unresolved
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests;
