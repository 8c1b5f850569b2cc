//! HTML for the console: escaping (every value that is not the console's own text goes through
//! [`esc`]: params, notes, ids and reasons come from agents and people), the page frame with its
//! navigation, and the stylesheet. No script anywhere.

use std::fmt::Write as _;

use oncegate_domain::ledger::Millis;

/// `text` safe inside HTML text and double- or single-quoted attribute values.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `value` as a query-string component.
pub fn query(value: &str) -> String {
    form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

/// The gate's clock now, in milliseconds since the Unix epoch.
pub fn now_ms() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as Millis)
}

/// A time as RFC 3339 (UTC) with how long ago or ahead it is, for a person.
pub fn when(at: Millis) -> String {
    let now = now_ms();
    let span = |ms: Millis| {
        let s = ms / 1000;
        match s {
            0..60 => format!("{s} s"),
            60..3600 => format!("{} min", s / 60),
            3600..86_400 => format!("{} h {} min", s / 3600, s % 3600 / 60),
            _ => format!("{} d {} h", s / 86_400, s % 86_400 / 3600),
        }
    };
    let relative = match at <= now {
        true => format!("{} ago", span(now - at)),
        false => format!("in {}", span(at - now)),
    };
    format!(
        "<time datetime=\"{t}\">{t}</time> <span class=\"muted\">({relative})</span>",
        t = esc(&oncegate_domain::time::rfc3339(at))
    )
}

/// The pages in the navigation bar: path, title, and whether an approver sees it.
const NAV: [(&str, &str, bool); 5] = [
    ("/approvals", "Approvals", true),
    ("/unresolved", "Unresolved", false),
    ("/decisions", "Recent decisions", false),
    ("/budgets", "Budgets", false),
    ("/dar", "Duplicate rate", false),
];

/// What the frame of a logged-in page shows besides its body.
pub struct Frame<'a> {
    pub path: &'a str,
    pub title: &'a str,
    pub principal: &'a str,
    pub role: &'a str,
    pub csrf: &'a str,
    /// Whether the principal reads more than approvals (an operator).
    pub reads: bool,
    /// What the last form did, and whether it was refused (then shown as an error).
    pub flash: Option<(&'a str, bool)>,
}

/// A whole logged-in page.
pub fn page(frame: &Frame<'_>, body: &str) -> String {
    let mut nav = String::new();
    for (path, title, approver) in NAV {
        if !approver && !frame.reads {
            continue;
        }
        let current = match path == frame.path {
            true => " aria-current=\"page\"",
            false => "",
        };
        let _ = write!(nav, "<a href=\"{path}\"{current}>{title}</a>");
    }
    // A refusal is an error a screen reader announces at once, never a success-styled note.
    let flash = match frame.flash {
        Some((message, false)) => format!(
            "<p class=\"flash\" id=\"flash\" role=\"status\">{}</p>",
            esc(message)
        ),
        Some((message, true)) => format!(
            "<p class=\"flash refused\" id=\"flash\" role=\"alert\">{}</p>",
            esc(message)
        ),
        None => String::new(),
    };
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title} · oncegate console</title><link rel=\"stylesheet\" href=\"/console.css\">\
         </head><body><header><strong class=\"brand\">oncegate</strong><nav>{nav}</nav>\
         <form method=\"post\" action=\"/logout\" class=\"who\">\
         <span>{principal} <span class=\"muted\">({role})</span></span>\
         <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         <button type=\"submit\">Log out</button></form></header>\
         <main><h1>{title}</h1>{flash}{body}</main></body></html>\n",
        title = esc(frame.title),
        principal = esc(frame.principal),
        role = esc(frame.role),
        csrf = esc(frame.csrf),
    )
}

/// A page for someone not logged in (the login form, a refusal).
pub fn bare(title: &str, body: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title} · oncegate console</title><link rel=\"stylesheet\" href=\"/console.css\">\
         </head><body><header><strong class=\"brand\">oncegate</strong></header>\
         <main class=\"narrow\"><h1>{title}</h1>{body}</main></body></html>\n",
        title = esc(title)
    )
}

/// The stylesheet (served at `/console.css`: the pages' Content-Security-Policy allows no
/// inline style).
pub const CSS: &str = r#"
:root { --fg: #1d2329; --muted: #5f6b76; --line: #d8dee4; --bg: #f6f8fa; --accent: #0b5cad;
  --ok: #116329; --bad: #a40e26; --warn: #7d4e00; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); background: var(--bg); }
header { display: flex; align-items: center; gap: 1.5rem; padding: .6rem 1.5rem; background: #fff; border-bottom: 1px solid var(--line); }
.brand { font-size: 1.1rem; letter-spacing: .02em; }
nav { display: flex; gap: 1rem; flex: 1; }
nav a { color: var(--fg); text-decoration: none; padding: .2rem 0; }
nav a[aria-current] { border-bottom: 2px solid var(--accent); font-weight: 600; }
.who { display: flex; align-items: center; gap: .6rem; margin: 0; }
main { padding: 1rem 1.5rem 3rem; max-width: 1200px; }
main.narrow { max-width: 34rem; }
h1 { font-size: 1.4rem; margin: .4rem 0 1rem; }
h2 { font-size: 1.05rem; margin: 0 0 .5rem; }
.muted { color: var(--muted); }
.note { color: var(--muted); font-size: .9rem; margin: 0 0 1rem; }
.flash { background: #dafbe1; border: 1px solid #aceebb; padding: .5rem .8rem; border-radius: 6px; }
.error, .flash.refused { background: #ffebe9; border: 1px solid #ffcecb; padding: .5rem .8rem; border-radius: 6px; color: var(--bad); }
.card { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 1rem; margin: 0 0 1rem; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: .2rem 1rem; margin: 0 0 .8rem; }
dt { color: var(--muted); }
dd { margin: 0; overflow-wrap: anywhere; }
code, pre { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: .85rem; }
pre { background: var(--bg); border: 1px solid var(--line); border-radius: 6px; padding: .6rem; margin: 0 0 .8rem; white-space: pre-wrap; overflow-wrap: anywhere; }
table { border-collapse: collapse; width: 100%; background: #fff; border: 1px solid var(--line); }
th, td { text-align: left; padding: .35rem .6rem; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: var(--bg); font-weight: 600; }
form.inline, form.search { display: flex; flex-wrap: wrap; gap: .5rem; align-items: end; margin: 0 0 1rem; }
label { display: flex; flex-direction: column; gap: .15rem; font-size: .85rem; color: var(--muted); }
input, textarea, select { font: inherit; padding: .3rem .45rem; border: 1px solid var(--line); border-radius: 6px; color: var(--fg); background: #fff; }
textarea { min-width: 22rem; min-height: 2.4rem; }
button { font: inherit; padding: .3rem .9rem; border-radius: 6px; border: 1px solid var(--line); background: #fff; cursor: pointer; }
button.approve { background: var(--ok); border-color: var(--ok); color: #fff; }
button.deny { background: var(--bad); border-color: var(--bad); color: #fff; }
button.primary { background: var(--accent); border-color: var(--accent); color: #fff; }
.state { font-weight: 600; font-size: .8rem; padding: .1rem .45rem; border-radius: 999px; border: 1px solid currentColor; }
.state.PENDING { color: var(--warn); } .state.APPROVED, .state.USED { color: var(--ok); } .state.DENIED { color: var(--bad); }
meter { width: 8rem; }
h3 { font-size: .9rem; margin: .4rem 0; color: var(--muted); }
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_is_escaped() {
        assert_eq!(
            esc(r#"<script>alert("x")</script>&'"#),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&#39;"
        );
        assert_eq!(query("a b&c"), "a+b%26c");
    }
}
