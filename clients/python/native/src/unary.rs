//! One unary gRPC call with opaque messages, on HTTP/2 directly: the request's bytes go out as
//! the message (HEADERS, then one DATA frame that ends the stream), the response's bytes come back
//! as they arrived: the messages are opaque here (Python's protobuf serializes and parses them,
//! or [`crate::worker`] with the prost messages). The status is read from the trailers (or a trailers-only answer) by tonic's
//! `Status::from_header_map`, rich details included. Owns the deadline and the one retry; owns no
//! connection ([`crate::link`]).

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode, Uri, header};
use tonic::{Code, Status};

use crate::{
    link::{Connection, Link},
    session::{self, Failure as SessionFailure},
};

/// What to send: the full URI of the method (`http://host:port/package.Service/Method`), the
/// serialized message, the headers of the call and its deadline.
pub struct Call {
    pub uri: Uri,
    pub message: Bytes,
    pub metadata: HeaderMap,
    pub deadline: Option<Duration>,
}

/// Sends `call` on `link` and waits for its answer, at most its deadline (which also travels as
/// `grpc-timeout`, so the gate gives up at the same time): the response message, or the status
/// the gate answered with. A call past its deadline fails as `DEADLINE_EXCEEDED`; one that
/// reached no gate as `UNAVAILABLE`. A call whose reused connection turns out broken before an
/// answer is tried once more on a new connection (it broke while idle, e.g. the gate restarted);
/// every worker RPC may be repeated, as the guard itself repeats them after a transport error.
pub async fn call(link: &Link, call: Call) -> Result<Bytes, Status> {
    let answer = async {
        match session::field_of(call.uri.path()) {
            Some(field) => on_session(link, &call, field).await,
            None => unary(link, &call).await,
        }
    };
    within(call.deadline, answer).await
}

/// `call` as the call in `field` of the link's session ([`crate::session`]), or unary when the
/// link has none for it. A reused session that ended before the answer is tried once more on a
/// new one, as a broken reused connection is; a gate that does not know sessions gets this call,
/// and every later one, unary.
async fn on_session(link: &Link, call: &Call, field: u32) -> Result<Bytes, Status> {
    let mut tried_fresh = false;
    loop {
        let answer = match link.session(call).await {
            Ok(Some((session, reused))) => {
                tried_fresh |= !reused;
                session.call(field, &call.message, call.deadline).await
            }
            Ok(None) => return unary(link, call).await,
            Err(failure) => Err(failure),
        };
        match answer {
            Ok(reply) => return Ok(reply),
            Err(SessionFailure::Answered(status)) => return Err(status),
            Err(SessionFailure::Ended(status)) if status.code() == Code::Unimplemented => {
                link.unary_only();
                return unary(link, call).await;
            }
            Err(SessionFailure::Ended(status)) if tried_fresh => return Err(status),
            Err(SessionFailure::Ended(_)) => tried_fresh = true,
        }
    }
}

/// `call` on a new HTTP/2 stream of its own; a reused connection that turns out broken before
/// the answer gets one more try on a new one.
async fn unary(link: &Link, call: &Call) -> Result<Bytes, Status> {
    let exchange = async {
        let connection = link.connection().await?;
        match exchange(&connection, call).await {
            Err(Failure::Broken(_)) if connection.reused => {
                connection.broke();
                let fresh = link.connection().await?;
                exchange(&fresh, call).await.map_err(|failure| {
                    if let Failure::Broken(_) = failure {
                        fresh.broke();
                    }
                    failure.status()
                })
            }
            Err(failure) => {
                if let Failure::Broken(_) = failure {
                    connection.broke();
                }
                Err(failure.status())
            }
            Ok(message) => Ok(message),
        }
    };
    exchange.await
}

/// `answer`, or `DEADLINE_EXCEEDED` once `deadline` passed (no deadline when `None`).
async fn within(
    deadline: Option<Duration>,
    answer: impl Future<Output = Result<Bytes, Status>>,
) -> Result<Bytes, Status> {
    match deadline {
        Some(deadline) => tokio::time::timeout(deadline, answer)
            .await
            .unwrap_or_else(|_| Err(deadline_exceeded())),
        None => answer.await,
    }
}

/// How a call failed: with an answer (the gate's status), or with its connection.
enum Failure {
    Answered(Status),
    Broken(Status),
}

impl Failure {
    fn status(self) -> Status {
        match self {
            Failure::Answered(status) | Failure::Broken(status) => status,
        }
    }

    /// An HTTP/2 error: the connection's (gone, refused, reset) or this stream's.
    fn from_h2(error: h2::Error) -> Failure {
        if error.is_io() || error.is_go_away() {
            return Failure::Broken(Status::unavailable(format!("connection lost: {error}")));
        }
        match error.reason() {
            Some(h2::Reason::REFUSED_STREAM) => {
                Failure::Broken(Status::unavailable(format!("refused: {error}")))
            }
            Some(h2::Reason::CANCEL) => Failure::Answered(Status::cancelled(error.to_string())),
            Some(h2::Reason::ENHANCE_YOUR_CALM) => {
                Failure::Answered(Status::resource_exhausted(error.to_string()))
            }
            Some(h2::Reason::INADEQUATE_SECURITY) => {
                Failure::Answered(Status::permission_denied(error.to_string()))
            }
            _ => Failure::Answered(Status::internal(format!("HTTP/2: {error}"))),
        }
    }
}

async fn exchange(connection: &Connection, call: &Call) -> Result<Bytes, Failure> {
    let mut send = connection
        .send
        .clone()
        .ready()
        .await
        .map_err(Failure::from_h2)?;
    let request = head(call).map_err(Failure::Answered)?;
    let (response, mut stream) = send
        .send_request(request, false)
        .map_err(Failure::from_h2)?;
    stream
        .send_data(frame(&call.message).map_err(Failure::Answered)?, true)
        .map_err(Failure::from_h2)?;

    let response = response.await.map_err(Failure::from_h2)?;
    let (parts, mut body) = response.into_parts();
    if parts.status != StatusCode::OK {
        return Err(Failure::Answered(http_status(parts.status)));
    }
    if let Some(status) = trailers_only(&parts.headers) {
        return Err(Failure::Answered(status));
    }
    let mut received = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(Failure::from_h2)?;
        let _ = body.flow_control().release_capacity(chunk.len());
        received.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await.map_err(Failure::from_h2)?;
    ended(received.freeze(), trailers.as_ref()).map_err(Failure::Answered)
}

/// The status of an HTTP/2 error, as a unary call reports it.
pub(crate) fn h2_status(error: h2::Error) -> Status {
    Failure::from_h2(error).status()
}

/// The request of `call` without its body: the method's URI and the call's headers (the
/// deadline as `grpc-timeout`, then the metadata).
pub(crate) fn head(call: &Call) -> Result<Request<()>, Status> {
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(call.uri.clone())
        .body(())
        .map_err(|e| Status::internal(format!("request: {e}")))?;
    let headers = request.headers_mut();
    headers.reserve(call.metadata.len() + 4);
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert(header::TE, HeaderValue::from_static("trailers"));
    headers.insert(
        header::USER_AGENT,
        HeaderValue::from_static("oncegate-python-native"),
    );
    if let Some(deadline) = call.deadline {
        headers.insert("grpc-timeout", grpc_timeout(deadline));
    }
    for (name, value) in &call.metadata {
        headers.append(name, value.clone());
    }
    Ok(request)
}

/// `message` as the one message of a request: not compressed, its length, its bytes.
pub(crate) fn frame(message: &Bytes) -> Result<Bytes, Status> {
    let length = u32::try_from(message.len())
        .map_err(|_| Status::resource_exhausted("request message over 4 GiB"))?;
    let mut frame = BytesMut::with_capacity(5 + message.len());
    frame.put_u8(0);
    frame.put_u32(length);
    frame.put_slice(message);
    Ok(frame.freeze())
}

/// The status of a trailers-only answer (how a failed call usually comes): in the headers.
pub(crate) fn trailers_only(headers: &HeaderMap) -> Option<Status> {
    Status::from_header_map(headers).map(|status| {
        if status.code() == Code::Ok {
            Status::internal("the gate answered OK without a message")
        } else {
            status
        }
    })
}

/// The message of an answer that ended with `trailers` after `received`, or its status.
pub(crate) fn ended(received: Bytes, trailers: Option<&HeaderMap>) -> Result<Bytes, Status> {
    match trailers.and_then(Status::from_header_map) {
        Some(status) if status.code() == Code::Ok => message(received),
        Some(status) => Err(status),
        None => Err(Status::internal("the answer ended without a gRPC status")),
    }
}

/// How a call past its deadline fails.
fn deadline_exceeded() -> Status {
    Status::new(Code::DeadlineExceeded, "Deadline Exceeded")
}

/// The one message of a unary answer: a 5-byte prefix (not compressed, length) and the bytes.
fn message(mut received: Bytes) -> Result<Bytes, Status> {
    let invalid = |why: &str| Status::internal(format!("the answer: {why}"));
    if received.len() < 5 {
        return Err(invalid("no message"));
    }
    if received.get_u8() != 0 {
        return Err(invalid("a compressed message (none was asked for)"));
    }
    let length = received.get_u32() as usize;
    if received.len() != length {
        return Err(invalid("not exactly one message"));
    }
    Ok(received)
}

/// `grpc-timeout`: at most 8 digits and a unit.
fn grpc_timeout(deadline: Duration) -> HeaderValue {
    let millis = deadline.as_millis();
    let text = if millis < 100_000_000 {
        format!("{millis}m")
    } else {
        format!("{}S", deadline.as_secs().min(99_999_999))
    };
    HeaderValue::try_from(text).unwrap_or_else(|_| HeaderValue::from_static("99999999S"))
}

/// The status of an answer that is not HTTP 200 (a proxy's), as gRPC maps HTTP codes.
pub(crate) fn http_status(status: StatusCode) -> Status {
    let code = match status.as_u16() {
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        429 | 502..=504 => Code::Unavailable,
        _ => Code::Unknown,
    };
    Status::new(code, format!("HTTP status {status}"))
}
