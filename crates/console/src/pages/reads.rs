//! What operators read: this replica's recent RequestToken decisions (searchable by agent, run
//! and key), budgets used against their limits per agent, and the duplicate-action rate per
//! action from the gate's own counters. Approvers see none of it (their role reads approvals).

use std::fmt::Write as _;

use bytes::Bytes;
use http::Response;
use http_body_util::Full;

use super::{Asked, agent_search, agents_in_view, error_block};
use crate::html::{esc, when};
use oncegate_grpc::auth::Capability;

/// Rows the decisions page shows, at most.
const MAX_ROWS: usize = 200;

/// The page of a principal whose role does not read this: what it lacks.
fn unreadable(asked: &Asked<'_>, path: &str, title: &str) -> Option<Response<Full<Bytes>>> {
    let e = asked.principal().authorize_role(Capability::Read).err()?;
    Some(super::page(asked, path, title, &error_block(&e)))
}

/// `GET /decisions[?agent=&run=&key=]`.
pub fn decisions(asked: &Asked<'_>) -> Response<Full<Bytes>> {
    let (path, title) = ("/decisions", "Recent decisions");
    if let Some(refused) = unreadable(asked, path, title) {
        return refused;
    }
    let principal = asked.principal();
    let want = |name: &str| asked.query.get(name).cloned().unwrap_or_default();
    let (agent, run, key) = (want("agent"), want("run"), want("key"));
    let mut body = format!(
        "<form method=\"get\" action=\"/decisions\" class=\"search\">\
         <label>Agent<input name=\"agent\" value=\"{}\"></label>\
         <label>Run<input name=\"run\" value=\"{}\"></label>\
         <label>Key<input name=\"key\" value=\"{}\"></label>\
         <button type=\"submit\">Search</button></form>",
        esc(&agent),
        esc(&run),
        esc(&key)
    );
    let Some(recent) = asked.console.inner.gate.recent_decisions() else {
        body.push_str("<p class=\"note\">This gate keeps no recent decisions.</p>");
        return super::page(asked, path, title, &body);
    };
    let _ = write!(
        body,
        "<p class=\"note\" id=\"scope\">This gate replica's last {} RequestToken decisions, kept in \
         memory since it started (other replicas', and older ones, are in the audit log, \
         <code>oncegate::audit</code>). Matching ids contain what you type.</p>",
        recent.capacity()
    );
    let rows = recent.newest(MAX_ROWS, |d| {
        principal.may_act_for(&d.agent_id)
            && d.agent_id.contains(agent.as_str())
            && d.run_id.contains(run.as_str())
            && d.key.contains(key.as_str())
    });
    body.push_str(
        "<table id=\"decisions\"><thead><tr><th>When</th><th>Agent</th><th>Run</th><th>Key</th>\
         <th>Action</th><th>Decision</th><th>Detail</th></tr></thead><tbody>",
    );
    for d in &rows {
        let mode = match d.mode {
            "shadow" => " <span class=\"muted\">(shadow)</span>",
            _ => "",
        };
        let _ = write!(
            body,
            "<tr><td>{}</td><td><code>{}</code></td><td><code>{}</code></td><td><code>{}</code>\
             </td><td>{}</td><td class=\"decision\">{}{mode}</td><td>{}</td></tr>",
            when(d.at),
            esc(&d.agent_id),
            esc(&d.run_id),
            esc(&d.key),
            esc(&d.action),
            d.decision,
            esc(&d.detail)
        );
    }
    body.push_str("</tbody></table>");
    if rows.is_empty() {
        body.push_str("<p id=\"empty\">No decision matches.</p>");
    }
    super::page(asked, path, title, &body)
}

/// `GET /budgets[?agent=]`: used and limit of each bucket with spending in its window.
pub async fn budgets(asked: &Asked<'_>) -> Response<Full<Bytes>> {
    let (path, title) = ("/budgets", "Budgets");
    if let Some(refused) = unreadable(asked, path, title) {
        return refused;
    }
    let principal = asked.principal();
    let agents = agents_in_view(asked);
    let mut body = agent_search(asked, path, &agents);
    let mut rows = String::new();
    for agent in &agents {
        let read = match principal.authorize(agent, Capability::Read) {
            Ok(()) => asked.console.inner.gate.budgets(agent).await,
            Err(e) => Err(e),
        };
        let usage = match read {
            Ok(usage) => usage,
            Err(e) => {
                body.push_str(&error_block(&e));
                continue;
            }
        };
        for u in usage {
            let share = match (u.used.parse::<f64>(), u.limit.parse::<f64>()) {
                (Ok(used), Ok(limit)) if limit > 0.0 => (used / limit).clamp(0.0, 1.0),
                _ => 0.0,
            };
            let _ = write!(
                rows,
                "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{} / {}</td>\
                 <td><meter min=\"0\" max=\"1\" high=\"0.8\" value=\"{share:.3}\"></meter></td>\
                 <td>{} s</td><td>{}</td></tr>",
                esc(agent),
                esc(&u.budget),
                esc(&u.action),
                esc(&u.group),
                esc(&u.used),
                esc(&u.limit),
                u.window / 1000,
                u.next_release_at.map_or_else(String::new, when),
            );
        }
    }
    if rows.is_empty() {
        body.push_str(
            "<p id=\"empty\">No spending within any budget's window for these agents.</p>",
        );
    } else {
        let _ = write!(
            body,
            "<table id=\"budgets\"><thead><tr><th>Agent</th><th>Budget</th><th>Action</th>\
             <th>Group</th><th>Used / limit</th><th></th><th>Window</th><th>Frees up</th></tr>\
             </thead><tbody>{rows}</tbody></table>"
        );
    }
    super::page(asked, path, title, &body)
}

/// `GET /dar`: blocked duplicates over attempts, per action, since this replica started.
pub fn dar(asked: &Asked<'_>) -> Response<Full<Bytes>> {
    let (path, title) = ("/dar", "Duplicate-action rate");
    if let Some(refused) = unreadable(asked, path, title) {
        return refused;
    }
    let mut body = String::from(
        "<p class=\"note\">DAR = blocked duplicate attempts / all attempts (RequestToken calls \
         that got a decision), per action, counted by this gate replica since it started: the \
         counters behind <code>oncegate_blocked_duplicates_total</code> and \
         <code>oncegate_attempts_total</code>. The 5-minute rate across replicas is \
         Prometheus's <code>oncegate:dar_by_action:ratio_rate5m</code>.</p>\
         <table id=\"dar\"><thead><tr><th>Action</th><th>Attempts</th><th>Blocked duplicates</th>\
         <th>DAR</th></tr></thead><tbody>",
    );
    for row in asked.console.inner.gate.metrics().duplicate_rates() {
        let rate = row
            .rate()
            .map_or_else(|| "–".to_owned(), |r| format!("{:.1}%", r * 100.0));
        let _ = write!(
            body,
            "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{rate}</td></tr>",
            esc(&row.action),
            row.attempts,
            row.blocked
        );
    }
    body.push_str("</tbody></table>");
    super::page(asked, path, title, &body)
}
