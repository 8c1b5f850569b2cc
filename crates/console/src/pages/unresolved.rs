//! Unresolved actions: leases that ended with no Complete or Release. Each shows what the
//! operator checks with the provider (its provider key), since when it is unknown, and the two
//! ways to settle it (ResolveExpired through the gate): completed, with the receipt the agent
//! will replay (JSON, validated, or text), or failed (released; the next attempt gets a new
//! token). Operators only: settling is not an approver's.

use bytes::Bytes;
use http::Response;
use http_body_util::Full;

use super::{
    Asked, Fields, action_fields, agent_search, agents_in_view, done, error_block, error_text,
    field,
};
use crate::html::{esc, query, when};
use oncegate_domain::{
    ActionKey,
    ledger::{OperatorReceipt, ReceiptFormat, Resolution, Resolved},
};
use oncegate_gate::{
    GateError,
    operator::{ResolvedBy, Settlement},
};
use oncegate_grpc::auth::Capability;
use oncegate_store::Unresolved;

/// `GET /unresolved[?agent=]`: every agent's for a principal acting for all, else the agents in
/// view.
pub async fn page(asked: &Asked<'_>) -> Response<Full<Bytes>> {
    let principal = asked.principal();
    let gate = &asked.console.inner.gate;
    let named = asked.query.get("agent").filter(|a| !a.is_empty());
    let mut body = String::new();
    let mut items = Vec::new();
    if named.is_none() && principal.acts_for_all() {
        body.push_str(&agent_search(asked, "/unresolved", &[]).replace(
            "No agent in view yet: name one.",
            "Showing every agent's, oldest first.",
        ));
        match principal.authorize_all(Capability::Read) {
            Ok(()) => match gate.list_unresolved(None, "", 0).await {
                Ok(page) => items.extend(page.items),
                Err(e) => body.push_str(&error_block(&e)),
            },
            Err(e) => body.push_str(&error_block(&e)),
        }
    } else {
        let agents = agents_in_view(asked);
        body.push_str(&agent_search(asked, "/unresolved", &agents));
        for agent in &agents {
            let listed = match principal.authorize(agent, Capability::Read) {
                Ok(()) => gate.list_unresolved(Some(agent), "", 0).await,
                Err(e) => Err(e),
            };
            match listed {
                Ok(page) => items.extend(page.items),
                Err(e) => body.push_str(&error_block(&e)),
            }
        }
    }
    if items.is_empty() {
        body.push_str(
            "<p id=\"empty\">No unresolved actions: every lease ended with an outcome.</p>",
        );
    }
    for item in &items {
        body.push_str(&card(asked, item));
    }
    super::page(asked, "/unresolved", "Unresolved actions", &body)
}

fn card(asked: &Asked<'_>, item: &Unresolved) -> String {
    let (key, view) = (&item.key, &item.view);
    let since = view
        .lease_expires_at
        .map_or_else(|| "unknown".to_owned(), when);
    let fields = action_fields(asked, &key.agent_id, &key.run_id, &key.key);
    format!(
        "<section class=\"card unresolved\" data-agent=\"{agent}\" data-key=\"{k}\">\
         <h2><code>{k}</code></h2><dl>\
         <dt>Agent</dt><dd><code>{agent}</code></dd><dt>Run</dt><dd><code>{run}</code></dd>\
         <dt>Key</dt><dd><code>{k}</code></dd>\
         <dt>Provider key</dt><dd><code class=\"provider-key\">{provider}</code></dd>\
         <dt>Unknown since</dt><dd>{since}</dd><dt>Fencing</dt><dd>{fencing}</dd>\
         <dt>Holder</dt><dd>{holder}</dd><dt>Fingerprint</dt><dd><code>{fp}</code></dd></dl>\
         <p class=\"note\">The attempt with fencing {fencing} may or may not have happened. Ask the \
         provider about idempotency key <code>{provider}</code>; then settle it here. \
         <strong>Completed</strong>: the agent's next RequestToken replays the receipt you write. \
         <strong>Failed</strong>: it is released and the next attempt gets a new token (fencing \
         {next}).</p>\
         <form method=\"post\" action=\"/unresolved/settle\" class=\"inline\">{fields}\
         <input type=\"hidden\" name=\"fencing\" value=\"{fencing}\">\
         <input type=\"hidden\" name=\"outcome\" value=\"completed\">\
         <label>Receipt<textarea name=\"receipt\" required></textarea></label>\
         <label>Format<select name=\"receipt_format\"><option value=\"json\">JSON</option>\
         <option value=\"text\">Text</option></select></label>\
         <label>Note (audited)<textarea name=\"note\" maxlength=\"1024\"></textarea></label>\
         <button type=\"submit\" class=\"approve\">Settle as completed</button></form>\
         <form method=\"post\" action=\"/unresolved/settle\" class=\"inline\">{fields}\
         <input type=\"hidden\" name=\"fencing\" value=\"{fencing}\">\
         <input type=\"hidden\" name=\"outcome\" value=\"failed\">\
         <label>Note (audited)<textarea name=\"note\" maxlength=\"1024\"></textarea></label>\
         <button type=\"submit\" class=\"deny\">Settle as failed</button></form></section>",
        agent = esc(&key.agent_id),
        run = esc(&key.run_id),
        k = esc(&key.key),
        provider = esc(&key.provider_key()),
        fencing = view.fencing,
        next = view.fencing + 1,
        holder = match view.holder.is_empty() {
            true => "<span class=\"muted\">(none given)</span>".to_owned(),
            false => esc(&view.holder),
        },
        fp = esc(&view.fingerprint),
    )
}

/// `POST /unresolved/settle`: ResolveExpired as the principal, completed (with a receipt of the
/// format chosen) or failed.
pub async fn settle(asked: &Asked<'_>, form: &Fields) -> Response<Full<Bytes>> {
    let key = ActionKey::new(field(form, "agent"), field(form, "run"), field(form, "key"));
    let principal = asked.principal();
    let note = field(form, "note").to_owned();
    let resolution = match field(form, "outcome") {
        "completed" => {
            let format = match field(form, "receipt_format") {
                "json" => ReceiptFormat::Json,
                "text" => ReceiptFormat::Text,
                _ => ReceiptFormat::Unspecified,
            };
            Ok(Resolution::Completed(OperatorReceipt {
                receipt: field(form, "receipt").as_bytes().to_vec(),
                format,
                note: note.clone(),
                operator: principal.name.clone(),
            }))
        }
        "failed" if field(form, "receipt").is_empty() => Ok(Resolution::Failed),
        "failed" => Err(GateError::invalid(
            "receipt",
            "a failed action has no receipt; leave it empty",
        )),
        _ => Err(GateError::invalid("outcome", "must be completed or failed")),
    };
    let gate = &asked.console.inner.gate;
    let result = match (
        principal.authorize(&key.agent_id, Capability::Settle),
        resolution,
    ) {
        (Err(e), _) | (Ok(()), Err(e)) => Err(e),
        // The grant the page showed, and no other: a page left open while the action was
        // settled and granted again settles nothing.
        (Ok(()), Ok(resolution)) => {
            gate.resolve_expired(Settlement {
                key: key.clone(),
                resolution,
                note: note.clone(),
                expected_fencing: field(form, "fencing").parse().ok(),
                resolved_by: ResolvedBy::Operator,
            })
            .await
        }
    };
    let message = match result {
        Ok(Resolved::Completed(done)) => format!(
            "Settled as completed (fencing {}): agent {}, key {}. Its next RequestToken replays \
             the receipt.",
            done.fencing, key.agent_id, key.key
        ),
        Ok(Resolved::Released { fencing }) => format!(
            "Settled as failed (fencing {fencing}): agent {}, key {}. The next attempt gets a new \
             token.",
            key.agent_id, key.key
        ),
        Err(e) => format!("Not settled: {}", error_text(&e)),
    };
    let next = match principal.acts_for_all() {
        true => "/unresolved".to_owned(),
        false => format!("/unresolved?agent={}", query(&key.agent_id)),
    };
    done(asked, &next, message)
}
