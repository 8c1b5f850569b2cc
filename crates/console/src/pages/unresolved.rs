//! Unresolved actions: leases that ended with no Complete or Release. Each shows what the
//! operator checks with the provider (its provider key), since when it is unknown, and the two
//! ways to settle it (ResolveExpired through the gate): completed, with the receipt the agent
//! will replay (JSON, validated, or text; guessed as `oncegate admin` guesses unless chosen), or
//! failed (released; the next attempt gets a new token). It shows what the action was asked
//! for, the type and the params exactly as sent, so the operator knows what to ask the provider.
//! A refused settlement comes back as an error with the form as typed. Operators only: settling
//! is not an approver's.

use bytes::Bytes;
use http::Response;
use http_body_util::Full;

use super::{
    Asked, Fields, action_fields, agent_search, agents_in_view, done, error_block, error_text,
    field, refused,
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
    let fencing = view.fencing.to_string();
    // The form the gate just refused comes back as it was typed.
    let this = |outcome| {
        [
            ("agent", key.agent_id.as_str()),
            ("run", key.run_id.as_str()),
            ("key", key.key.as_str()),
            ("fencing", fencing.as_str()),
            ("outcome", outcome),
        ]
    };
    let completed = asked.typed(&this("completed"));
    let failed = asked.typed(&this("failed"));
    let typed = |form: Option<&super::Fields>, name: &str| {
        esc(form.and_then(|f| f.get(name)).map_or("", String::as_str))
    };
    let format = completed
        .and_then(|f| f.get("receipt_format"))
        .map_or("guess", String::as_str);
    let option = |value: &str, label: &str| {
        let selected = match value == format {
            true => " selected",
            false => "",
        };
        format!("<option value=\"{value}\"{selected}>{label}</option>")
    };
    // What was asked for, exactly as the agent sent it: which provider, how much, to whom.
    let (action, params) = match item.asked.action.is_empty() {
        true => (
            "<span class=\"muted\">(not kept: granted before this gate kept it)</span>".to_owned(),
            "<p class=\"muted\">(params not kept: granted before this gate kept them)</p>"
                .to_owned(),
        ),
        false => (
            format!(
                "<code class=\"action-name\">{}</code>",
                esc(&item.asked.action)
            ),
            format!("<pre class=\"params\">{}</pre>", esc(&item.asked.params)),
        ),
    };
    format!(
        "<section class=\"card unresolved\" data-agent=\"{agent}\" data-key=\"{k}\">\
         <h2><code>{k}</code></h2><dl>\
         <dt>Action</dt><dd>{action}</dd>\
         <dt>Agent</dt><dd><code>{agent}</code></dd><dt>Run</dt><dd><code>{run}</code></dd>\
         <dt>Key</dt><dd><code>{k}</code></dd>\
         <dt>Provider key</dt><dd><code class=\"provider-key\">{provider}</code></dd>\
         <dt>Unknown since</dt><dd>{since}</dd><dt>Fencing</dt><dd>{fencing}</dd>\
         <dt>Holder</dt><dd>{holder}</dd><dt>Fingerprint</dt><dd><code>{fp}</code></dd></dl>\
         <h3>Params, as the agent sent them</h3>{params}\
         <p class=\"note\">The attempt with fencing {fencing} may or may not have happened. Ask the \
         provider about idempotency key <code>{provider}</code>; then settle it here. \
         <strong>Completed</strong>: the agent's next RequestToken replays the receipt you write. \
         <strong>Failed</strong>: it is released and the next attempt gets a new token (fencing \
         {next}).</p>\
         <form method=\"post\" action=\"/unresolved/settle\" class=\"inline\">{fields}\
         <input type=\"hidden\" name=\"fencing\" value=\"{fencing}\">\
         <input type=\"hidden\" name=\"outcome\" value=\"completed\">\
         <label>Receipt (what the provider answered, e.g. its transaction id)\
         <textarea name=\"receipt\" required>{receipt}</textarea></label>\
         <label>Replayed as<select name=\"receipt_format\">{guess}{json}{text}</select></label>\
         <label>Note (audited)<textarea name=\"note\" maxlength=\"1024\">{note_completed}</textarea>\
         </label><button type=\"submit\" class=\"approve\">Settle as completed</button></form>\
         <form method=\"post\" action=\"/unresolved/settle\" class=\"inline\">{fields}\
         <input type=\"hidden\" name=\"fencing\" value=\"{fencing}\">\
         <input type=\"hidden\" name=\"outcome\" value=\"failed\">\
         <label>Note (audited)<textarea name=\"note\" maxlength=\"1024\">{note_failed}</textarea>\
         </label><button type=\"submit\" class=\"deny\">Settle as failed</button></form></section>",
        agent = esc(&key.agent_id),
        run = esc(&key.run_id),
        k = esc(&key.key),
        provider = esc(&key.provider_key()),
        next = view.fencing + 1,
        holder = match view.holder.is_empty() {
            true => "<span class=\"muted\">(none given)</span>".to_owned(),
            false => esc(&view.holder),
        },
        fp = esc(&view.fingerprint),
        receipt = typed(completed, "receipt"),
        note_completed = typed(completed, "note"),
        note_failed = typed(failed, "note"),
        guess = option(
            "guess",
            "JSON if it parses as JSON, else text (as the CLI guesses)"
        ),
        json = option("json", "JSON"),
        text = option("text", "Text"),
    )
}

/// The receipt format the form chose: JSON or text as chosen, else guessed as `oncegate admin`
/// guesses it: JSON when the receipt parses as JSON, else text (a bank's plain id, `tx_777`).
fn receipt_format(chosen: &str, receipt: &str) -> ReceiptFormat {
    match chosen {
        "json" => ReceiptFormat::Json,
        "text" => ReceiptFormat::Text,
        _ if serde_json::from_str::<serde_json::Value>(receipt).is_ok() => ReceiptFormat::Json,
        _ => ReceiptFormat::Text,
    }
}

/// `POST /unresolved/settle`: ResolveExpired as the principal, completed (with a receipt of the
/// format chosen) or failed.
pub async fn settle(asked: &Asked<'_>, form: &Fields) -> Response<Full<Bytes>> {
    let key = ActionKey::new(field(form, "agent"), field(form, "run"), field(form, "key"));
    let principal = asked.principal();
    let note = field(form, "note").to_owned();
    let resolution = match field(form, "outcome") {
        "completed" => {
            let format = receipt_format(field(form, "receipt_format"), field(form, "receipt"));
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
    let next = match principal.acts_for_all() {
        true => "/unresolved".to_owned(),
        false => format!("/unresolved?agent={}", query(&key.agent_id)),
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
        Err(e) => {
            let mut message = format!("Not settled: {}", error_text(&e));
            if matches!(&e, GateError::Invalid { field: named, .. } if named == "receipt")
                && field(form, "receipt_format") == "json"
            {
                message.push_str(
                    ". A plain id (tx_777) is text: choose Text, or leave \"Replayed as\" to the \
                     guess.",
                );
            }
            return refused(asked, &next, message, form);
        }
    };
    done(asked, &next, message)
}
