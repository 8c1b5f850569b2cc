//! Approvals: the held actions of the agents in view, pending first, each with the exact params
//! the agent sent, the policy that holds it and its reason, and what each choice will do before
//! it is made; approve or deny with a note (DecideApproval through the gate, audited with the
//! principal and the note). A refused decision comes back as an error with the note as typed.

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
    ledger::{ApprovalState, approval::Decision},
};
use oncegate_grpc::auth::Capability;
use oncegate_store::ApprovalEntry;

/// `GET /approvals[?agent=]`.
pub async fn page(asked: &Asked<'_>) -> Response<Full<Bytes>> {
    let principal = asked.principal();
    let agents = agents_in_view(asked);
    let mut body = agent_search(asked, "/approvals", &agents);
    let gate = &asked.console.inner.gate;
    let mut entries = Vec::new();
    for agent in &agents {
        let listed = match principal.authorize(agent, Capability::Approve) {
            Ok(()) => gate.list_approvals(agent, "", 0).await,
            Err(e) => Err(e),
        };
        match listed {
            Ok(page) => entries.extend(page.items),
            Err(e) => body.push_str(&error_block(&e)),
        }
    }
    // Pending first, then by when they were asked for.
    entries.sort_by_key(|e| {
        (
            e.approval.state != ApprovalState::Pending,
            e.approval.created_at,
        )
    });
    if entries.is_empty() {
        body.push_str(
            "<p id=\"empty\">No approvals are waiting, decided or unused for these agents.</p>",
        );
    }
    for entry in &entries {
        body.push_str(&card(asked, entry));
    }
    super::page(asked, "/approvals", "Approvals", &body)
}

/// One approval: what it is about and, while pending, the decision form.
fn card(asked: &Asked<'_>, entry: &ApprovalEntry) -> String {
    let (key, a) = (&entry.key, &entry.approval);
    let params = match serde_json::from_str::<serde_json::Value>(&a.params) {
        Ok(value) => serde_json::to_string_pretty(&value).unwrap_or_else(|_| a.params.clone()),
        Err(_) if a.params.is_empty() => {
            "(not kept: asked for before this gate kept params)".into()
        }
        Err(_) => a.params.clone(),
    };
    let decided = match a.operator.is_empty() {
        true => String::new(),
        false => format!(
            "<dt>Decided by</dt><dd>{}</dd><dt>Note</dt><dd>{}</dd>",
            esc(&a.operator),
            esc(&a.note)
        ),
    };
    // A decision the gate refused comes back with its note as typed.
    let typed = asked.typed(&[
        ("agent", &key.agent_id),
        ("run", &key.run_id),
        ("key", &key.key),
        ("approval_id", &a.id),
    ]);
    let form = match a.state {
        ApprovalState::Pending => format!(
            "<p class=\"note consequences\"><strong>Approve</strong>: the held call runs once, \
             when the agent asks again with the same request (its next identical RequestToken is \
             granted, once; a different request is not covered). <strong>Deny</strong>: identical \
             requests are refused until the approval lapses ({lapses}).</p>\
             <form method=\"post\" action=\"/approvals/decide\" class=\"inline\">{fields}\
             <input type=\"hidden\" name=\"approval_id\" value=\"{id}\">\
             <label>Note (audited)<textarea name=\"note\" maxlength=\"1024\">{note}</textarea>\
             </label><button type=\"submit\" name=\"decision\" value=\"approve\" \
             class=\"approve\">Approve</button><button type=\"submit\" name=\"decision\" \
             value=\"deny\" class=\"deny\">Deny</button></form>",
            fields = action_fields(asked, &key.agent_id, &key.run_id, &key.key),
            id = esc(&a.id),
            lapses = when(a.expires_at),
            note = esc(typed.and_then(|t| t.get("note")).map_or("", String::as_str)),
        ),
        ApprovalState::Approved => {
            "<p class=\"note\">Approved: the next identical RequestToken of \
             this action is granted, once.</p>"
                .into()
        }
        ApprovalState::Used => "<p class=\"note\">Approved and used by a grant.</p>".into(),
        ApprovalState::Denied => "<p class=\"note\">Denied: identical requests are refused until \
             it lapses.</p>"
            .into(),
    };
    format!(
        "<section class=\"card approval\" data-agent=\"{agent}\" data-key=\"{k}\">\
         <h2>{action} <span class=\"state {state}\">{state}</span></h2><dl>\
         <dt>Agent</dt><dd><code>{agent}</code></dd><dt>Run</dt><dd><code>{run}</code></dd>\
         <dt>Key</dt><dd><code>{k}</code></dd><dt>Policy</dt><dd><code>{policy}</code></dd>\
         <dt>Reason</dt><dd class=\"reason\">{reason}</dd><dt>Asked</dt><dd>{asked_at}</dd>\
         <dt>Lapses</dt><dd>{lapses}</dd><dt>Approval id</dt><dd><code>{id}</code></dd>\
         {decided}</dl><h3>Params</h3><pre class=\"params\">{params}</pre>{form}</section>",
        agent = esc(&key.agent_id),
        run = esc(&key.run_id),
        k = esc(&key.key),
        action = esc(&a.action),
        state = a.state.as_str(),
        policy = esc(&a.policy),
        reason = esc(&a.reason),
        asked_at = when(a.created_at),
        lapses = when(a.expires_at),
        id = esc(&a.id),
        params = esc(&params),
    )
}

/// `POST /approvals/decide`: approve or deny one pending approval, as the principal, with a note.
pub async fn decide(asked: &Asked<'_>, form: &Fields) -> Response<Full<Bytes>> {
    let key = ActionKey::new(field(form, "agent"), field(form, "run"), field(form, "key"));
    let approve = match field(form, "decision") {
        "approve" => true,
        "deny" => false,
        _ => {
            return done(asked, "/approvals", "Choose Approve or Deny.".into());
        }
    };
    let principal = asked.principal();
    let decision = Decision {
        id: field(form, "approval_id").to_owned(),
        approve,
        operator: principal.name.clone(),
        note: field(form, "note").to_owned(),
    };
    let gate = &asked.console.inner.gate;
    let result = match principal.authorize(&key.agent_id, Capability::Approve) {
        Ok(()) => gate.decide_approval(&key, decision).await,
        Err(e) => Err(e),
    };
    let next = format!("/approvals?agent={}", query(&key.agent_id));
    let message = match result {
        Ok(a) => format!(
            "{} {} (agent {}, key {}).",
            a.state.as_str(),
            a.action,
            key.agent_id,
            key.key
        ),
        Err(e) => {
            let message = format!("Not decided: {}", error_text(&e));
            return refused(asked, &next, message, form);
        }
    };
    done(asked, &next, message)
}
