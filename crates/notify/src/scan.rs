//! The unresolved-action scan: nothing is written when a lease ends (the store's clock decides),
//! so `action.unresolved` is found by listing every agent's unresolved actions (ListUnresolved)
//! every `scan_interval` and writing an event for each whose lease ended within the last half of
//! the retention. The event id is the action key and fencing, so a scan (or a replica, or a
//! restart) never writes one twice while its delivered marker is kept.

use std::sync::Arc;

use crate::{
    Settings,
    writer::{Outbox, Seen},
};
use oncegate_domain::event::{Event, Lapsed};
use oncegate_store::{ListCursor, Store, StoreError};

/// The most unresolved actions one scan looks at (the `oncegate_unresolved_actions` count's cap).
const CAP: usize = 10_000;
/// One listing page.
const PAGE: usize = 1000;

pub(crate) async fn run(store: Store, outbox: Outbox, settings: Arc<Settings>) {
    let mut seen = Seen::default();
    loop {
        if let Err(e) = scan(&store, &outbox, &settings, &mut seen).await {
            tracing::debug!(error = %e, "could not scan the unresolved actions for events");
        }
        tokio::time::sleep(settings.scan_interval).await;
    }
}

async fn scan(
    store: &Store,
    outbox: &Outbox,
    settings: &Settings,
    seen: &mut Seen,
) -> Result<(), StoreError> {
    let mut after: Option<ListCursor> = None;
    let mut looked = 0;
    loop {
        let reply = store.list_unresolved(None, after.as_ref(), PAGE).await?;
        let now = reply.now;
        let Ok(page) = reply.result else {
            return Ok(());
        };
        looked += page.items.len();
        let since = now - settings.retention / 2;
        let events: Vec<Event> = page
            .items
            .iter()
            .filter(|u| u.view.lease_expires_at.is_some_and(|at| at >= since))
            .map(|u| {
                let lapsed = Lapsed {
                    fencing: u.view.fencing,
                    lease_expired_at: u.view.lease_expires_at,
                    holder: &u.view.holder,
                    fingerprint: &u.view.fingerprint,
                    action: None,
                };
                Event::action_unresolved(&u.key, lapsed, now)
            })
            .collect();
        outbox.write(&events, seen).await?;
        match page.next {
            Some(next) if looked < CAP => after = Some(next),
            _ => return Ok(()),
        }
    }
}
