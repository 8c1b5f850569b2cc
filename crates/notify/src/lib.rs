//! Webhooks (docs/CONTRACT.md §7): the events the gate emits, written to the outbox in the gate's
//! own store and delivered at least once to the configured endpoints, signed the Standard Webhooks
//! way, with CloudEvents (or Slack) bodies.
//!
//! Three tasks, started by [`start`], none on any request's path:
//! - the outbox writer ([`writer`]) reads the gate's event queue, aggregates budget refusals per
//!   budget, agent and window, renders each event for every webhook that wants it and writes the
//!   outbox (idempotent by webhook and event id);
//! - the delivery worker ([`deliver`]) claims due entries with a lease, POSTs them
//!   ([`sign`]: the headers), and settles each: delivered, retried after a backoff ([`backoff`]),
//!   or undeliverable;
//! - the scan ([`scan`]) finds unresolved actions (no write marks a lease's end) and writes their
//!   `action.unresolved` events.
//!
//! Owns: the webhook settings ([`Settings`], validated by the config crate), signing, backoff,
//! delivery. Does not own: which operation emits what (the gate), the outbox's storage (the store).

pub mod backoff;
mod deliver;
mod scan;
pub mod sign;
mod writer;

use std::{sync::Arc, time::Duration};

use tokio::{sync::mpsc, task::JoinHandle};

use oncegate_domain::{event::EventType, ledger::Millis};
use oncegate_gate::Emitted;
use oncegate_observe::metrics::Metrics;
use oncegate_store::Store;

pub use sign::Secret;

/// How a webhook's body is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// CloudEvents 1.0 structured JSON (`application/cloudevents+json`).
    CloudEvents,
    /// A Slack incoming-webhook message, `{"text": ...}`.
    Slack,
}

/// One `[[webhooks]]` entry, validated.
#[derive(Debug, Clone)]
pub struct Webhook {
    /// Names it in the outbox, the metrics and the listing (the URL may hold a secret: Slack's).
    pub name: String,
    pub url: String,
    /// The event types it receives.
    pub events: Vec<EventType>,
    /// Each signs every delivery (rotation: the old and the new side by side); none: unsigned.
    pub secrets: Vec<Secret>,
    /// An environment variable holding more secrets (space-separated), read at start-up by
    /// [`Settings::read_secret_env`].
    pub secret_env: Option<String>,
    pub format: Format,
    /// How long one attempt may take (connecting included).
    pub timeout: Duration,
    /// Attempts before an event is undeliverable.
    pub max_attempts: u32,
    /// Age (since it was written) past which a failed event is undeliverable.
    pub max_age: Millis,
    /// The first retry's delay, doubling per attempt up to `retry_max`.
    pub retry_initial: Millis,
    pub retry_max: Millis,
}

/// `[notifications]` and every `[[webhooks]]`, validated.
#[derive(Debug, Clone)]
pub struct Settings {
    pub webhooks: Vec<Webhook>,
    /// The CloudEvents `source`.
    pub source: String,
    /// How often the outbox is asked for due entries (besides right after a write).
    pub poll_interval: Duration,
    /// How often unresolved actions are looked for.
    pub scan_interval: Duration,
    /// The aggregation window of `budget.exceeded`.
    pub budget_window: Millis,
    /// How long delivered markers and undeliverable entries are kept.
    pub retention: Millis,
}

/// Defaults of `[notifications]` and of a webhook's settings.
pub mod defaults {
    use oncegate_domain::ledger::Millis;

    pub const SOURCE: &str = "oncegate";
    pub const POLL_INTERVAL_MS: u64 = 1000;
    pub const SCAN_INTERVAL_MS: u64 = 30_000;
    pub const BUDGET_WINDOW: Millis = 60_000;
    pub const RETENTION: Millis = 7 * 86_400_000;
    pub const TIMEOUT_MS: u64 = 10_000;
    pub const MAX_ATTEMPTS: u32 = 15;
    pub const MAX_AGE: Millis = 3 * 86_400_000;
    pub const RETRY_INITIAL: Millis = 5_000;
    pub const RETRY_MAX: Millis = 3_600_000;
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            webhooks: Vec::new(),
            source: defaults::SOURCE.into(),
            poll_interval: Duration::from_millis(defaults::POLL_INTERVAL_MS),
            scan_interval: Duration::from_millis(defaults::SCAN_INTERVAL_MS),
            budget_window: defaults::BUDGET_WINDOW,
            retention: defaults::RETENTION,
        }
    }
}

impl Settings {
    /// True when some webhook is configured (otherwise nothing runs and nothing is emitted).
    pub fn is_active(&self) -> bool {
        !self.webhooks.is_empty()
    }

    /// Every event type some webhook wants.
    pub fn wanted(&self) -> Vec<EventType> {
        let mut wanted: Vec<EventType> = self
            .webhooks
            .iter()
            .flat_map(|w| w.events.iter().copied())
            .collect();
        wanted.sort();
        wanted.dedup();
        wanted
    }

    /// Reads every webhook's `secret_env` (through `env`) and adds its secrets; the error names
    /// the setting and the variable, never a secret.
    pub fn read_secret_env(&mut self, env: &dyn Fn(&str) -> Option<String>) -> Result<(), String> {
        for w in &mut self.webhooks {
            let Some(var) = &w.secret_env else { continue };
            let at = format!("webhooks.{}.secret_env", w.name);
            let value = env(var)
                .ok_or_else(|| format!("{at}: the environment variable {var} is not set"))?;
            let before = w.secrets.len();
            for text in value.split_whitespace() {
                w.secrets
                    .push(Secret::parse(text).map_err(|why| format!("{at} ({var}): {why}"))?);
            }
            if w.secrets.len() == before {
                return Err(format!(
                    "{at}: the environment variable {var} holds no secret"
                ));
            }
        }
        Ok(())
    }

    fn webhook(&self, name: &str) -> Option<&Webhook> {
        self.webhooks.iter().find(|w| w.name == name)
    }

    /// How long a claim holds an entry: the longest attempt, and a second more.
    fn claim_lease(&self) -> Millis {
        let longest = self.webhooks.iter().map(|w| w.timeout).max();
        longest.unwrap_or_default().as_millis() as Millis + 1000
    }
}

/// The running tasks; aborted on drop.
pub struct Running {
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Starts the outbox writer over `events` (the gate's queue), the delivery worker and, when some
/// webhook wants `action.unresolved`, the scan. Registers the webhook metrics' series.
pub fn start(
    store: Store,
    metrics: Metrics,
    settings: Settings,
    events: mpsc::Receiver<Emitted>,
) -> Running {
    // reqwest's rustls needs a process-wide provider; the gate uses ring everywhere.
    let _ = rustls::crypto::ring::default_provider().install_default();
    for webhook in &settings.webhooks {
        let names: Vec<&'static str> = webhook.events.iter().map(|t| t.name()).collect();
        metrics.register_webhooks([webhook.name.as_str()], &names);
    }
    let settings = Arc::new(settings);
    let wake = Arc::new(tokio::sync::Notify::new());
    let outbox = writer::Outbox::new(store.clone(), settings.clone());
    let mut tasks = vec![
        tokio::spawn(writer::run(outbox.clone(), events, wake.clone())),
        tokio::spawn(deliver::run(store.clone(), metrics, settings.clone(), wake)),
    ];
    if settings.wanted().contains(&EventType::ActionUnresolved) {
        tasks.push(tokio::spawn(scan::run(store, outbox, settings)));
    }
    Running { tasks }
}
