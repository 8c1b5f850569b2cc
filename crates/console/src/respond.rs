//! Answers: HTML pages, redirects after a form, refusals, and the headers every answer carries
//! (no script, no framing, no caching, no referrer beyond the console: `same-origin`, since with
//! `no-referrer` browsers send `Origin: null`, which the same-origin check must refuse).

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::Full;

use super::html;

/// A 403 page saying why nothing was changed.
pub fn refused(why: &str) -> Response<Full<Bytes>> {
    let body = format!(
        "<p class=\"error\" id=\"refused\">{}</p><p><a href=\"/login\">Log in</a> · \
         <a href=\"/approvals\">Approvals</a></p>",
        html::esc(why)
    );
    html_response(StatusCode::FORBIDDEN, html::bare("Refused", &body))
}

/// A 303 to `location` (after a POST, the page to show next).
pub fn redirect(location: &str) -> Response<Full<Bytes>> {
    let mut response = secured(Response::new(Full::new(Bytes::new())));
    *response.status_mut() = StatusCode::SEE_OTHER;
    if let Ok(value) = HeaderValue::from_str(location) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    response
}

/// An HTML page.
pub fn html_response(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = with_type(
        secured(Response::new(Full::new(Bytes::from(body)))),
        "text/html; charset=utf-8",
    );
    *response.status_mut() = status;
    response
}

pub fn with_type(
    mut response: Response<Full<Bytes>>,
    content_type: &'static str,
) -> Response<Full<Bytes>> {
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// The headers every console answer carries: no script, no framing, no caching, no referrer
/// to other sites.
fn secured(mut response: Response<Full<Bytes>>) -> Response<Full<Bytes>> {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}
