//! What the gate tells its operators: Prometheus metrics ([`metrics`]) and logs, spans and the
//! audit trail ([`telemetry`]). Decides nothing; the gate calls in. Depends on the domain only.

pub mod metrics;
pub mod telemetry;
