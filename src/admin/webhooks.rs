//! `oncegate admin webhooks`: the webhook events given up after their last delivery attempt
//! (ListUndeliverableEvents), with how many wait for delivery, as text or one JSON document.

use clap::Args;
use serde_json::{Value, json};
use tonic::Status;

use crate::remote::Authed;
use oncegate_proto::{self as pb, gate_admin_service_client::GateAdminServiceClient};

/// `admin webhooks`.
#[derive(Debug, Clone, Args)]
pub struct WebhooksArgs {
    /// Entries per page.
    #[arg(long, default_value_t = 100)]
    pub page_size: u32,
    /// Start at this page token (printed after a page when more follow).
    #[arg(long, default_value = "")]
    pub page_token: String,
    /// Follow every page to the end.
    #[arg(long)]
    pub all: bool,
}

/// Lists the undeliverable events.
pub async fn run(
    admin: &mut GateAdminServiceClient<Authed>,
    w: &WebhooksArgs,
) -> Result<Value, Status> {
    let mut events = Vec::new();
    let mut token = w.page_token.clone();
    let (mut pending, mut undeliverable);
    loop {
        let page = admin
            .list_undeliverable_events(pb::ListUndeliverableEventsRequest {
                page_size: w.page_size,
                page_token: token,
            })
            .await?
            .into_inner();
        (pending, undeliverable) = (page.pending, page.undeliverable);
        events.extend(page.events.iter().map(|e| {
            json!({
                "id": e.id,
                "webhook": e.webhook,
                "event_type": e.event_type,
                "attempts": e.attempts,
                "last_error": e.last_error,
                "created_at": e.created_at.map(|t| t.to_string()),
                "given_up_at": e.given_up_at.map(|t| t.to_string()),
                "body": e.body,
            })
        }));
        token = page.next_page_token;
        if token.is_empty() || !w.all {
            break;
        }
    }
    Ok(json!({
        "pending": pending,
        "undeliverable": undeliverable,
        "events": events,
        "next_page_token": token,
    }))
}

/// The text a person reads: the counts, then one line per event.
pub fn human(value: &Value) -> String {
    let mut out = format!(
        "{} event(s) waiting for delivery, {} undeliverable\n",
        value["pending"], value["undeliverable"]
    );
    for e in value["events"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "{}  {}  {}  {} attempt(s), given up {}: {}\n",
            e["id"].as_str().unwrap_or_default(),
            e["webhook"].as_str().unwrap_or_default(),
            e["event_type"].as_str().unwrap_or_default(),
            e["attempts"],
            e["given_up_at"].as_str().unwrap_or("?"),
            e["last_error"].as_str().unwrap_or_default(),
        ));
    }
    if let Some(token) = value["next_page_token"].as_str().filter(|t| !t.is_empty()) {
        out.push_str(&format!("more: --page-token {token}\n"));
    }
    out
}
