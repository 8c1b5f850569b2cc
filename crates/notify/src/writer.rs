//! The outbox writer: reads the gate's event queue, aggregates budget refusals (one
//! `budget.exceeded` per budget, agent and window, sent when the window closes), renders each
//! event for every webhook that wants it and writes the outbox, the events of up to 100 ms in one
//! write. A write that fails (the store is
//! down) is tried again with a growing pause while the queue fills (the gate drops what does not
//! fit, and counts it); events a writer already wrote are remembered for a while, so that a held
//! worker asking again and again does not cost a store call each time.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::Arc,
    time::Duration,
};

use tokio::{
    sync::{Notify, mpsc},
    time::Instant,
};

use crate::{Format, Settings};
use oncegate_domain::event::{BudgetRefusals, Event};
use oncegate_gate::Emitted;
use oncegate_store::{NewEntry, Store, StoreError};

/// How many events one outbox write takes at most.
const BATCH: usize = 256;
/// How long the writer gathers events after the first one before it writes them: one outbox
/// write (on the embedded store, one fsync shared with the calls of its batch) for every event
/// of that time, instead of one each, so a stream of events costs the store little.
const LINGER: Duration = Duration::from_millis(100);
/// How many written event ids a writer remembers.
const REMEMBERED: usize = 16_384;

/// Writes events into the outbox: rendered per webhook, skipping ids written lately.
#[derive(Clone)]
pub(crate) struct Outbox {
    store: Store,
    settings: Arc<Settings>,
}

impl Outbox {
    pub(crate) fn new(store: Store, settings: Arc<Settings>) -> Self {
        Self { store, settings }
    }

    /// The outbox entries of `event`: one per webhook that wants its type.
    fn entries(&self, event: &Event) -> Vec<NewEntry> {
        let webhooks = self.settings.webhooks.iter();
        webhooks
            .filter(|w| w.events.contains(&event.kind))
            .map(|w| NewEntry {
                webhook: w.name.clone(),
                id: event.id.clone(),
                event_type: event.kind.name().to_owned(),
                body: match w.format {
                    Format::CloudEvents => event.cloudevent(&self.settings.source),
                    Format::Slack => event.slack(),
                }
                .to_string(),
            })
            .collect()
    }

    /// Writes `events` not in `seen` (and remembers them once written); returns how many outbox
    /// entries were new.
    pub(crate) async fn write(&self, events: &[Event], seen: &mut Seen) -> Result<u32, StoreError> {
        let fresh: Vec<&Event> = events.iter().filter(|e| !seen.contains(&e.id)).collect();
        let entries: Vec<NewEntry> = fresh.iter().flat_map(|e| self.entries(e)).collect();
        if entries.is_empty() {
            return Ok(0);
        }
        let written = self.store.outbox_append(&entries).await?;
        for event in fresh {
            seen.insert(&event.id);
        }
        Ok(written.result.unwrap_or(0))
    }

    /// Writes `events`, trying again (with a growing pause, at most 30 s) until the store takes
    /// them.
    async fn write_until_done(&self, events: &[Event], seen: &mut Seen) -> u32 {
        let mut pause = Duration::from_millis(200);
        loop {
            match self.write(events, seen).await {
                Ok(written) => return written,
                Err(e) => {
                    tracing::warn!(error = %e, events = events.len(), "cannot write events to the outbox; trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(30));
                }
            }
        }
    }
}

/// Event ids written lately (bounded; the oldest forgotten first).
#[derive(Default)]
pub(crate) struct Seen {
    ids: HashSet<String>,
    order: VecDeque<String>,
}

impl Seen {
    fn contains(&self, id: &str) -> bool {
        self.ids.contains(id)
    }

    fn insert(&mut self, id: &str) {
        if self.ids.insert(id.to_owned()) {
            self.order.push_back(id.to_owned());
            if self.order.len() > REMEMBERED
                && let Some(old) = self.order.pop_front()
            {
                self.ids.remove(&old);
            }
        }
    }
}

/// Budget refusals being counted, per (budget, agent), with when their window closes.
#[derive(Default)]
struct Budgets {
    open: HashMap<(String, String), (BudgetRefusals, Instant)>,
}

impl Budgets {
    fn add(&mut self, budget: String, agent: String, action: &str, at: i64, window: i64) {
        let closes = Instant::now() + Duration::from_millis(window.max(1) as u64);
        self.open
            .entry((budget.clone(), agent.clone()))
            .and_modify(|(refused, _)| refused.add(action, at))
            .or_insert_with(|| {
                (
                    BudgetRefusals::first(&budget, &agent, action, at, window),
                    closes,
                )
            });
    }

    /// The windows closed by `now` (all of them when `all`), as events.
    fn close(&mut self, now: Instant, all: bool) -> Vec<Event> {
        let closed: Vec<(String, String)> = self
            .open
            .iter()
            .filter(|(_, (_, closes))| all || *closes <= now)
            .map(|(k, _)| k.clone())
            .collect();
        closed
            .into_iter()
            .filter_map(|k| self.open.remove(&k))
            .map(|(refused, _)| {
                let at = refused.first_at + refused.window;
                Event::budget_exceeded(&refused, at)
            })
            .collect()
    }

    fn next_close(&self) -> Option<Instant> {
        self.open.values().map(|(_, closes)| *closes).min()
    }
}

/// Runs until the gate's queue closes (then writes what is left and stops).
pub(crate) async fn run(outbox: Outbox, mut queue: mpsc::Receiver<Emitted>, wake: Arc<Notify>) {
    let mut seen = Seen::default();
    let mut budgets = Budgets::default();
    let window = outbox.settings.budget_window;
    loop {
        let next_close = budgets.next_close();
        let first = tokio::select! {
            item = queue.recv() => match item {
                Some(item) => Some(item),
                None => break,
            },
            () = sleep_until(next_close) => None,
        };
        let mut events = Vec::new();
        let mut take = |item: Emitted, events: &mut Vec<Event>| match item {
            Emitted::Event(event) => events.push(event),
            Emitted::BudgetRefused {
                budget,
                agent_id,
                action,
                at,
            } => budgets.add(budget, agent_id, &action, at, window),
        };
        if let Some(item) = first {
            take(item, &mut events);
            let until = Instant::now() + LINGER;
            while events.len() < BATCH {
                match tokio::time::timeout_at(until, queue.recv()).await {
                    Ok(Some(item)) => take(item, &mut events),
                    Ok(None) | Err(_) => break,
                }
            }
        }
        events.extend(budgets.close(Instant::now(), false));
        if !events.is_empty() && outbox.write_until_done(&events, &mut seen).await > 0 {
            wake.notify_one();
        }
    }
    let events = budgets.close(Instant::now(), true);
    if !events.is_empty() {
        let _ = outbox.write(&events, &mut seen).await;
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
