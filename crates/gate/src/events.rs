//! The events the gate's operations emit for webhooks (docs/CONTRACT.md §7), handed to a bounded
//! queue without waiting: a full queue drops the event and counts it, so no call ever waits for
//! the outbox, the store behind it or a receiver. An event nobody subscribed to is not even built.
//!
//! Owns: which operation emits which event, and the queue's sending end. Does not own: the queue's
//! other end (the notify crate writes the outbox and delivers).

use std::sync::Arc;

use tokio::sync::mpsc;

use oncegate_domain::{
    event::{Event, EventType},
    ledger::Millis,
};
use oncegate_observe::metrics::Metrics;

/// What an operation hands over: an event, or one `BUDGET_EXCEEDED` refusal (aggregated into
/// `budget.exceeded` events by the other end, per budget, agent and window).
#[derive(Debug, Clone, PartialEq)]
pub enum Emitted {
    Event(Event),
    BudgetRefused {
        budget: String,
        agent_id: String,
        action: String,
        at: Millis,
    },
}

impl Emitted {
    /// The event type it is (or becomes).
    pub fn kind(&self) -> EventType {
        match self {
            Self::Event(event) => event.kind,
            Self::BudgetRefused { .. } => EventType::BudgetExceeded,
        }
    }
}

/// How many emitted events may wait for the outbox writer before new ones are dropped.
pub const QUEUE: usize = 4096;

/// The sending end of the event queue, and the types some webhook subscribed to. Cheap to clone.
#[derive(Clone)]
pub struct Emitter {
    tx: mpsc::Sender<Emitted>,
    wanted: Arc<[EventType]>,
}

impl Emitter {
    /// A queue of [`QUEUE`] events for the types in `wanted`, and its receiving end.
    pub fn channel(wanted: impl IntoIterator<Item = EventType>) -> (Self, mpsc::Receiver<Emitted>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        let wanted: Vec<EventType> = wanted.into_iter().collect();
        (
            Self {
                tx,
                wanted: wanted.into(),
            },
            rx,
        )
    }

    /// Whether some webhook wants events of `kind`.
    pub fn wants(&self, kind: EventType) -> bool {
        self.wanted.contains(&kind)
    }

    /// Hands `make()` over when its type is wanted, never waiting; counts it when the queue is
    /// full (or its reader gone).
    pub(crate) fn emit(&self, kind: EventType, metrics: &Metrics, make: impl FnOnce() -> Emitted) {
        if !self.wants(kind) {
            return;
        }
        if self.tx.try_send(make()).is_err() {
            metrics.event_dropped(kind.name());
            tracing::warn!(
                event = kind.name(),
                "event queue full: an event was dropped"
            );
        }
    }
}
