//! The console's pages and the operations its forms run: approvals (`approvals`), unresolved
//! actions (`unresolved`), and what operators read (`reads`: recent decisions, budgets, the
//! duplicate-action rate). Each checks the principal's capability for what it shows or changes,
//! as the operator API does, before calling the gate.

mod approvals;
mod reads;
mod unresolved;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::Full;

use http::{HeaderValue, header};

use super::{
    asked::{Asked, Fields},
    html::{self, Frame, esc},
    respond,
    session::Flash,
};
use oncegate_gate::GateError;
use oncegate_grpc::auth::Capability;
use oncegate_observe::telemetry::AUDIT;

/// Agents a page lists when it is not told one, at most.
const MAX_AGENTS: usize = 100;

/// `GET path`.
pub async fn get(asked: &Asked<'_>, path: &str) -> Response<Full<Bytes>> {
    match path {
        "/" => respond::redirect("/approvals"),
        "/approvals" => approvals::page(asked).await,
        "/unresolved" => unresolved::page(asked).await,
        "/decisions" => reads::decisions(asked),
        "/budgets" => reads::budgets(asked).await,
        "/dar" => reads::dar(asked),
        _ => not_found(),
    }
}

/// `POST path` with a checked form (a live session, its CSRF token, same origin).
pub async fn post(asked: &Asked<'_>, path: &str, form: &Fields) -> Response<Full<Bytes>> {
    match path {
        "/logout" => logout(asked),
        "/approvals/decide" => approvals::decide(asked, form).await,
        "/unresolved/settle" => unresolved::settle(asked, form).await,
        _ => not_found(),
    }
}

fn not_found() -> Response<Full<Bytes>> {
    respond::html_response(
        StatusCode::NOT_FOUND,
        html::bare("Not found", "<p><a href=\"/approvals\">Approvals</a></p>"),
    )
}

/// The login form, with why the last attempt failed.
pub fn login(error: Option<&str>, status: StatusCode) -> Response<Full<Bytes>> {
    let error = error
        .map(|e| format!("<p class=\"error\" id=\"refused\">{}</p>", esc(e)))
        .unwrap_or_default();
    let body = format!(
        "{error}<form method=\"post\" action=\"/login\" class=\"card\">\
         <label>API key or login code\
         <input type=\"password\" name=\"credential\" id=\"credential\" autocomplete=\"off\" \
         autofocus required></label><p><button type=\"submit\" class=\"primary\">Log in</button>\
         </p></form><p class=\"note\">An operator or approver logs in with the API key of their \
         <code>[[principals]]</code> entry. On the gate's machine, with no principal set up, \
         <code>oncegate admin console-login</code> prints a one-time code (it works once, for 5 \
         minutes). The key or code goes in this form, never in a URL.</p>"
    );
    respond::html_response(status, html::bare("Log in", &body))
}

/// Ends the session and clears its cookie.
fn logout(asked: &Asked<'_>) -> Response<Full<Bytes>> {
    asked.console.inner.sessions.end(asked.session_id);
    tracing::info!(target: AUDIT, principal = %asked.principal().name, decision = "console_logout",
        "console");
    let mut response = respond::redirect("/login");
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("oncegate_console=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"),
    );
    response
}

/// A logged-in page: the frame around `body`.
fn page(asked: &Asked<'_>, path: &str, title: &str, body: &str) -> Response<Full<Bytes>> {
    let principal = asked.principal();
    let frame = Frame {
        path,
        title,
        principal: &principal.name,
        role: principal.role.as_str(),
        csrf: &asked.session.csrf,
        reads: principal.role.grants(Capability::Read),
        flash: asked
            .flash
            .as_ref()
            .map(|f| (f.message.as_str(), f.refused)),
    };
    respond::html_response(StatusCode::OK, html::page(&frame, body))
}

/// After a form that did what it said: its outcome shown once on `next`.
fn done(asked: &Asked<'_>, next: &str, message: String) -> Response<Full<Bytes>> {
    asked
        .console
        .inner
        .sessions
        .flash(asked.session_id, Flash::done(message));
    respond::redirect(next)
}

/// After a form the gate refused: the refusal shown once on `next` as an error, and the form
/// filled in again with what was typed (`form`, without its CSRF token).
fn refused(asked: &Asked<'_>, next: &str, message: String, form: &Fields) -> Response<Full<Bytes>> {
    let mut typed = form.clone();
    typed.remove("csrf");
    asked
        .console
        .inner
        .sessions
        .flash(asked.session_id, Flash::refused(message, typed));
    respond::redirect(next)
}

/// A gate error as a person reads it.
fn error_text(e: &GateError) -> String {
    match e {
        GateError::Refused(refusal) => format!("refused by the store: {refusal:?}"),
        other => other.to_string(),
    }
}

/// `<p class="error">` for a failed read or operation.
fn error_block(e: &GateError) -> String {
    format!("<p class=\"error\">{}</p>", esc(&error_text(e)))
}

/// The agents a page lists: the one asked for (`?agent=`), else those the principal's `agents`
/// name exactly and those this replica decided for recently, each one it may act for.
fn agents_in_view(asked: &Asked<'_>) -> Vec<String> {
    if let Some(agent) = asked.query.get("agent").filter(|a| !a.is_empty()) {
        return vec![agent.clone()];
    }
    let principal = asked.principal();
    let mut agents = principal.named_agents();
    if let Some(recent) = asked.console.inner.gate.recent_decisions() {
        for d in recent.newest(recent.capacity(), |d| principal.may_act_for(&d.agent_id)) {
            agents.push(d.agent_id);
        }
    }
    agents.sort();
    agents.dedup();
    agents.truncate(MAX_AGENTS);
    agents
}

/// The form that asks for one agent, and what the page lists without one.
fn agent_search(asked: &Asked<'_>, action: &str, listed: &[String]) -> String {
    let agent = asked.query.get("agent").cloned().unwrap_or_default();
    let scope = match (agent.is_empty(), listed.is_empty()) {
        (false, _) => format!("Showing agent <code>{}</code>.", esc(&agent)),
        (true, true) => "No agent in view yet: name one.".to_owned(),
        (true, false) => format!(
            "Showing the agents your principal names and those this gate replica decided for \
             recently: {}. Name another to see it.",
            listed
                .iter()
                .map(|a| format!("<code>{}</code>", esc(a)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    format!(
        "<form method=\"get\" action=\"{action}\" class=\"search\"><label>Agent\
         <input name=\"agent\" value=\"{}\"></label><button type=\"submit\">Show</button></form>\
         <p class=\"note\">{scope}</p>",
        esc(&agent)
    )
}

/// The hidden fields naming an action, and the session's CSRF token.
fn action_fields(asked: &Asked<'_>, agent: &str, run: &str, key: &str) -> String {
    format!(
        "<input type=\"hidden\" name=\"csrf\" value=\"{}\">\
         <input type=\"hidden\" name=\"agent\" value=\"{}\">\
         <input type=\"hidden\" name=\"run\" value=\"{}\">\
         <input type=\"hidden\" name=\"key\" value=\"{}\">",
        esc(&asked.session.csrf),
        esc(agent),
        esc(run),
        esc(key)
    )
}

/// A form field, empty when absent.
fn field<'f>(form: &'f Fields, name: &str) -> &'f str {
    form.get(name).map(String::as_str).unwrap_or_default()
}
