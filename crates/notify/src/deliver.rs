//! The delivery worker: claims due outbox entries (a lease each, so that no other replica delivers
//! one at the same time), POSTs each to its webhook with the Standard Webhooks headers, and
//! settles it: delivered on a 2xx, otherwise tried again after a backoff, or undeliverable once
//! its attempts or its age are used up. A worker that dies mid-delivery leaves the entry claimed
//! until the lease ends; then any worker delivers it again, with the same `webhook-id`.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::{sync::Notify, task::JoinSet};

use crate::{Format, Settings, Webhook, backoff, sign};
use oncegate_domain::{event::EventType, ledger::Millis};
use oncegate_observe::metrics::Metrics;
use oncegate_store::{OutboxEntry, Settlement, Store};

/// How many deliveries run at once at most (each claim takes what room is left, so one slow
/// receiver holds its own deliveries, not the others').
const IN_FLIGHT: usize = 32;

pub(crate) async fn run(
    store: Store,
    metrics: Metrics,
    settings: Arc<Settings>,
    wake: Arc<Notify>,
) {
    let client = match reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("oncegate/", env!("CARGO_PKG_VERSION")))
        .build()
    {
        Ok(client) => client,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the webhook HTTP client; no webhook is delivered");
            return;
        }
    };
    let lease = settings.claim_lease();
    let mut in_flight = JoinSet::new();
    // Claim at once: after a write (woken), on a poll, while the last claim found more than it
    // had room for, or when half the room is free; not after every single delivery.
    let mut claim_now = true;
    loop {
        let room = IN_FLIGHT - in_flight.len();
        if room > 0 && (claim_now || room >= IN_FLIGHT / 2) {
            let claim = uuid::Uuid::new_v4().simple().to_string();
            claim_now = false;
            match store.outbox_claim(room, lease, &claim).await {
                Ok(reply) => {
                    let now = reply.now;
                    if let Ok(claimed) = reply.result {
                        metrics.set_outbox(claimed.pending, claimed.undeliverable);
                        claim_now = claimed.entries.len() == room;
                        let started = Instant::now();
                        for entry in claimed.entries {
                            let attempt = Attempt {
                                store: store.clone(),
                                metrics: metrics.clone(),
                                settings: settings.clone(),
                                client: client.clone(),
                                claim: claim.clone(),
                                store_now: move || now + started.elapsed().as_millis() as Millis,
                            };
                            in_flight.spawn(attempt.run(entry));
                        }
                    }
                }
                Err(e) => tracing::debug!(error = %e, "cannot claim webhook deliveries"),
            }
        }
        if claim_now && in_flight.len() < IN_FLIGHT {
            continue;
        }
        tokio::select! {
            Some(_) = in_flight.join_next(), if !in_flight.is_empty() => {}
            () = wake.notified() => claim_now = true,
            () = tokio::time::sleep(settings.poll_interval) => claim_now = true,
        }
    }
}

/// One delivery attempt of one claimed entry.
struct Attempt<N> {
    store: Store,
    metrics: Metrics,
    settings: Arc<Settings>,
    client: reqwest::Client,
    claim: String,
    /// The store's clock, estimated from the claim's answer.
    store_now: N,
}

impl<N: Fn() -> Millis> Attempt<N> {
    async fn run(self, entry: OutboxEntry) {
        let event = EventType::parse(&entry.event_type).map_or("unknown", EventType::name);
        let (settlement, outcome) = match self.settings.webhook(&entry.webhook) {
            None => (
                Settlement::Undeliverable {
                    error: "no webhook of this name is configured any more".into(),
                },
                "undeliverable",
            ),
            Some(webhook) => match post(&self.client, webhook, &entry).await {
                Ok(()) => (Settlement::Delivered, "delivered"),
                Err(error) => self.after_failure(webhook, &entry, error),
            },
        };
        self.metrics
            .webhook_delivery(&entry.webhook, event, outcome);
        if outcome == "undeliverable" {
            tracing::warn!(webhook = %entry.webhook, event, id = %entry.id,
                attempts = entry.attempts, "webhook event undeliverable");
        }
        let settled = self
            .store
            .outbox_settle(
                &entry.webhook,
                &entry.id,
                &self.claim,
                &settlement,
                self.settings.retention,
            )
            .await;
        if let Err(e) = settled {
            // The claim's lease ends and the entry is delivered again: at least once.
            tracing::warn!(error = %e, id = %entry.id, "cannot settle a webhook delivery; it will be sent again");
        }
    }

    /// A failed attempt: retried after the backoff, or undeliverable when out of attempts or age.
    fn after_failure(
        &self,
        webhook: &Webhook,
        entry: &OutboxEntry,
        error: String,
    ) -> (Settlement, &'static str) {
        let now = (self.store_now)();
        let exhausted = entry.attempts >= webhook.max_attempts
            || now.saturating_sub(entry.created_at) >= webhook.max_age;
        if exhausted {
            return (Settlement::Undeliverable { error }, "undeliverable");
        }
        let delay = backoff::delay(
            entry.attempts,
            webhook.retry_initial,
            webhook.retry_max,
            backoff::random(),
        );
        let due_at = now + delay;
        (Settlement::Retry { due_at, error }, "failed")
    }
}

/// POSTs one entry; `Err` says why it was not a 2xx (never the URL: it may hold a secret).
async fn post(
    client: &reqwest::Client,
    webhook: &Webhook,
    entry: &OutboxEntry,
) -> Result<(), String> {
    let timestamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let content_type = match webhook.format {
        Format::CloudEvents => "application/cloudevents+json",
        Format::Slack => "application/json",
    };
    let mut request = client
        .post(&webhook.url)
        .timeout(webhook.timeout)
        .header("content-type", content_type)
        .header("webhook-id", &entry.id)
        .header("webhook-timestamp", timestamp.to_string());
    if let Some(signature) = sign::signature_header(
        &webhook.secrets,
        &entry.id,
        timestamp,
        entry.body.as_bytes(),
    ) {
        request = request.header("webhook-signature", signature);
    }
    let response = request
        .body(entry.body.clone())
        .send()
        .await
        .map_err(|e| describe(&e.without_url(), webhook.timeout))?;
    let status = response.status();
    // Read (and drop) the answer, so the connection can be reused.
    let _ = response.bytes().await;
    match status.is_success() {
        true => Ok(()),
        false => Err(format!("HTTP {status}")),
    }
}

fn describe(e: &reqwest::Error, timeout: Duration) -> String {
    if e.is_timeout() {
        return format!("no answer within {} ms", timeout.as_millis());
    }
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        message = format!("{message}: {cause}");
        source = cause.source();
    }
    message
}
