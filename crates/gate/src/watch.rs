//! WatchUnresolved's source: one scan per gate replica, shared by every watching stream.
//!
//! Nothing is written when a lease ends (the store's clock decides), so, as the webhook scan
//! does for `action.unresolved` (`oncegate_notify`), the watcher lists every agent's unresolved
//! actions (ListUnresolved, from the per-agent lease indexes: no key scan, no per-agent polling)
//! every [`INTERVAL`], and hands each grant it had not seen on the previous scan, `(action key,
//! fencing)`, to a broadcast channel. It scans only while a stream is subscribed, and starts on
//! the first subscription. A stream starts with a listing of its own (what is unresolved now) and
//! then follows the channel; a stream that falls behind the channel skips what it missed, and its
//! caller sees it again on the next subscription (an action may be sent more than once; settling
//! is conditional on its fencing, so a repeat does no harm).
//!
//! Does not own: who may watch what (the `grpc` layer filters each entry by the caller's scope).

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::sync::broadcast;

use oncegate_observe::telemetry::{self, AUDIT};
use oncegate_store::{ListCursor, Store, StoreError, Unresolved};

/// How often the watcher lists the unresolved actions while someone watches: a lease that ends
/// is sent within about this long.
pub const INTERVAL: Duration = Duration::from_secs(1);
/// The most unresolved actions one scan looks at (as the unresolved count and the webhook scan).
const CAP: usize = 10_000;
/// One listing page.
const PAGE: usize = 1000;
/// Entries a slow stream may fall behind by before it skips some.
const CHANNEL: usize = 4096;

/// The shared scan and its channel. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Watcher {
    inner: Arc<Inner>,
}

struct Inner {
    sender: broadcast::Sender<Arc<Unresolved>>,
    started: Mutex<bool>,
}

impl Default for Watcher {
    fn default() -> Self {
        let (sender, _) = broadcast::channel(CHANNEL);
        Self {
            inner: Arc::new(Inner {
                sender,
                started: Mutex::new(false),
            }),
        }
    }
}

impl Watcher {
    /// A receiver of every grant that becomes unresolved from now on; starts the scan over `store`
    /// on the first call.
    pub(crate) fn subscribe(&self, store: &Store) -> broadcast::Receiver<Arc<Unresolved>> {
        let receiver = self.inner.sender.subscribe();
        let mut started = self.inner.started.lock().unwrap_or_else(|e| e.into_inner());
        if !*started {
            *started = true;
            tokio::spawn(run(store.clone(), self.inner.sender.clone()));
        }
        receiver
    }
}

/// The scan loop: idle (no store call) while nobody watches.
async fn run(store: Store, sender: broadcast::Sender<Arc<Unresolved>>) {
    let mut seen: HashSet<(Vec<u8>, u64)> = HashSet::new();
    loop {
        tokio::time::sleep(INTERVAL).await;
        if sender.receiver_count() == 0 {
            continue;
        }
        match scan(&store).await {
            Ok(now) => {
                let mut current = HashSet::with_capacity(now.len());
                for u in now {
                    let id = (u.key.encode(), u.view.fencing);
                    if !seen.contains(&id) {
                        // No receiver left between the check and here is not an error.
                        let _ = sender.send(Arc::new(u));
                    }
                    current.insert(id);
                }
                seen = current;
            }
            Err(e) => tracing::debug!(error = %e, "could not scan the unresolved actions to watch"),
        }
    }
}

/// Every unresolved action of every agent, at most [`CAP`].
async fn scan(store: &Store) -> Result<Vec<Unresolved>, StoreError> {
    let mut out = Vec::new();
    let mut after: Option<ListCursor> = None;
    loop {
        let reply = store.list_unresolved(None, after.as_ref(), PAGE).await?;
        let Ok(page) = reply.result else {
            return Ok(out);
        };
        out.extend(page.items);
        match page.next {
            Some(next) if out.len() < CAP => after = Some(next),
            _ => return Ok(out),
        }
    }
}

impl super::Gate {
    /// WatchUnresolved's feed: every grant of any agent that becomes unresolved from now on (the
    /// caller filters by scope and lists what is unresolved already with
    /// [`list_unresolved`](super::Gate::list_unresolved)).
    pub fn watch_unresolved(&self) -> broadcast::Receiver<Arc<Unresolved>> {
        let receiver = self.watcher.subscribe(&self.store);
        telemetry::record_decision("watching");
        tracing::info!(target: AUDIT, decision = "watching", "watch_unresolved");
        receiver
    }
}
