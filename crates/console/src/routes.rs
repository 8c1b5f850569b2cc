//! Requests in, pages out: who is asking (the session cookie), whether a state-changing POST may
//! change anything (a live session, its CSRF token compared in constant time, and a same-origin
//! request when the browser says where it comes from), then the page or the operation.
//!
//! A GET without a session goes to the login form; a POST without one, or without the right
//! token, or from another site changes nothing: 403, saying why.

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Incoming;
use tracing::Instrument as _;

use super::{
    Console, SESSION_COOKIE,
    asked::{Asked, fields},
    html, pages,
    respond::{html_response, redirect, refused, with_type},
};
use oncegate_grpc::auth::Role;
use oncegate_observe::telemetry::AUDIT;

/// Largest form body (a receipt is at most the gate's receipt limit; the store refuses more).
const MAX_FORM_BYTES: usize = 1 << 20;

/// Answers one request.
pub async fn handle(console: &Console, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    match (&method, path.as_str()) {
        (&Method::GET, "/console.css") => {
            return with_type(
                Response::new(Full::new(Bytes::from_static(html::CSS.as_bytes()))),
                "text/css; charset=utf-8",
            );
        }
        (&Method::GET, "/login") => return pages::login(None, StatusCode::OK),
        (&Method::POST, "/login") => return login(console, req).await,
        _ => {}
    }
    let cookie = session_cookie(&req);
    let found = cookie
        .as_deref()
        .and_then(|id| console.inner.sessions.find(id));
    let Some((session, flash)) = found else {
        return match method {
            Method::GET | Method::HEAD => redirect("/login"),
            _ => refused(
                "No valid session: nothing was changed. Log in again (sessions end at logout, \
                 after 8 hours, and when the gate restarts).",
            ),
        };
    };
    let session_id = cookie.unwrap_or_default();
    let span = tracing::info_span!(target: AUDIT, "console", principal = %session.principal.name,
        path = %path);
    let query = fields(req.uri().query().unwrap_or_default().as_bytes());
    let asked = Asked {
        console,
        session: &session,
        session_id: &session_id,
        query,
        flash,
    };
    async move {
        match method {
            Method::GET | Method::HEAD => pages::get(&asked, &path).await,
            Method::POST => {
                let form = match checked_form(&asked, req).await {
                    Ok(form) => form,
                    Err(response) => return response,
                };
                pages::post(&asked, &path, &form).await
            }
            _ => html_response(
                StatusCode::METHOD_NOT_ALLOWED,
                html::bare("Not allowed", "<p>Use GET or POST.</p>"),
            ),
        }
    }
    .instrument(span)
    .await
}

/// The form of a POST that may change something: from this site, with the session's CSRF token.
async fn checked_form(
    asked: &Asked<'_>,
    req: Request<Incoming>,
) -> Result<super::asked::Fields, Response<Full<Bytes>>> {
    if let Some(why) = cross_site(&req) {
        audit_refusal(&asked.session.principal.name, &why);
        return Err(refused(&why));
    }
    let form = read_form(req).await.map_err(|why| refused(&why))?;
    let token = form.get("csrf").map(String::as_str).unwrap_or_default();
    if !asked.session.csrf_matches(token) {
        let why = match token.is_empty() {
            true => "The form carried no CSRF token: nothing was changed.",
            false => {
                "The form's CSRF token is not this session's: nothing was changed. Reload the \
                      page and submit it again."
            }
        };
        audit_refusal(&asked.session.principal.name, why);
        return Err(refused(why));
    }
    Ok(form)
}

fn audit_refusal(principal: &str, why: &str) {
    tracing::info!(target: AUDIT, principal, decision = "console_refused", why, "console");
}

/// Why a request that says where it comes from is not from this console, if it is not.
fn cross_site<B>(req: &Request<B>) -> Option<String> {
    let value = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = value("sec-fetch-site")
        && site != "same-origin"
        && site != "none"
    {
        return Some(format!(
            "The browser says this request comes from another site ({site}): nothing was changed."
        ));
    }
    if let Some(origin) = value("origin") {
        let host = value("host").unwrap_or_default();
        let same = [format!("http://{host}"), format!("https://{host}")];
        if !same.iter().any(|s| s == origin) {
            return Some(format!(
                "The request's origin ({origin}) is not this console's: nothing was changed."
            ));
        }
    }
    None
}

async fn read_form(req: Request<Incoming>) -> Result<super::asked::Fields, String> {
    let body = Limited::new(req.into_body(), MAX_FORM_BYTES)
        .collect()
        .await
        .map_err(|e| format!("The form could not be read ({e}): nothing was changed."))?;
    Ok(fields(&body.to_bytes()))
}

/// `POST /login`: an API key of a configured operator or approver, or a one-time code.
async fn login(console: &Console, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if let Some(why) = cross_site(&req) {
        return pages::login(Some(&why), StatusCode::FORBIDDEN);
    }
    let form = match read_form(req).await {
        Ok(form) => form,
        Err(why) => return pages::login(Some(&why), StatusCode::BAD_REQUEST),
    };
    let typed = form.get("credential").map(|c| c.trim()).unwrap_or_default();
    let inner = &console.inner;
    let (principal, via) = match inner.logins.redeem(typed) {
        Some(p) => (Some(p), "login_code"),
        None => (inner.principals.by_api_key(typed), "api_key"),
    };
    let principal = match principal {
        Some(p) if p.role != Role::Agent => p,
        Some(p) => {
            tracing::info!(target: AUDIT, principal = %p.name, decision = "console_login_refused",
                "console");
            return pages::login(
                Some(
                    "That key is an agent's: the console needs an operator or approver principal.",
                ),
                StatusCode::FORBIDDEN,
            );
        }
        None => {
            tracing::info!(target: AUDIT, decision = "console_login_refused", "console");
            return pages::login(
                Some(
                    "Not a key of an operator or approver principal, nor a login code this gate \
                     issued in the last 5 minutes (each code works once).",
                ),
                StatusCode::FORBIDDEN,
            );
        }
    };
    tracing::info!(target: AUDIT, principal = %principal.name, decision = "console_login", via,
        "console");
    let id = inner.sessions.start(principal);
    let mut response = redirect("/approvals");
    let cookie = format!(
        "{SESSION_COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}",
        super::SESSION_TTL.as_secs()
    );
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

fn session_cookie<B>(req: &Request<B>) -> Option<String> {
    req.headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == SESSION_COOKIE)
        .map(|(_, value)| value.to_owned())
}
