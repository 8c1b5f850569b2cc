//! The gateway's own series, `oncegate_mcp_*`, on the registry `--metrics-listen` serves (beside
//! the in-process gate's `oncegate_*`, whose decisions the gateway's calls are). With `--gate`
//! the decisions are counted on the gate server; these count what only the gateway sees.

use prometheus_client::{metrics::counter::Counter, registry::Registry};

/// The handles of the gateway's series.
#[derive(Debug, Clone, Default)]
pub struct GatewayMetrics {
    gate_unavailable: Counter,
    outcomes_unknown: Counter,
}

impl GatewayMetrics {
    /// Registers the series on `registry` (each starts at 0).
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        let r = registry.sub_registry_with_prefix("oncegate_mcp");
        r.register(
            "gate_unavailable",
            "gated tools/call answered GATE_UNAVAILABLE: the gate (or its store) could not be \
             reached, so nothing was forwarded",
            metrics.gate_unavailable.clone(),
        );
        r.register(
            "outcomes_unknown",
            "gated tools/call forwarded whose outcome the gateway lost (the upstream died, timed \
             out, or the client cancelled): each is an action to reconcile",
            metrics.outcomes_unknown.clone(),
        );
        metrics
    }

    /// A gated call refused because the gate could not be reached.
    pub fn gate_unavailable(&self) {
        self.gate_unavailable.inc();
    }

    /// A forwarded call whose outcome is unknown.
    pub fn outcome_unknown(&self) {
        self.outcomes_unknown.inc();
    }
}
