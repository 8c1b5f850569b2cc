//! What a gRPC call to the gate is on HTTP/2, below every way of sending one: the call to send
//! ([`Call`]), the gate's methods' paths, the request's head and its one framed message, and how
//! an answer's message and status are read (from trailers, a trailers-only answer, an HTTP status
//! or an HTTP/2 error). Plain functions of bytes and headers: owns no connection ([`crate::link`]),
//! no stream and no deadline ([`crate::unary`], [`crate::session`]), and nothing of the gate in
//! process ([`crate::in_process`] reads its answers with these).

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode, Uri, header};
use tonic::{Code, Status};

/// The guard's hot RPCs, by their paths.
pub(crate) const REQUEST_TOKEN: &str = "/oncegate.v1.ActionGateService/RequestToken";
pub(crate) const COMPLETE: &str = "/oncegate.v1.ActionGateService/Complete";
pub(crate) const RELEASE: &str = "/oncegate.v1.ActionGateService/Release";
pub(crate) const EXTEND_LEASE: &str = "/oncegate.v1.ActionGateService/ExtendLease";

/// What to send: the full URI of the method (`http://host:port/package.Service/Method`), the
/// serialized message, the headers of the call and its deadline.
pub struct Call {
    pub uri: Uri,
    pub message: Bytes,
    pub metadata: HeaderMap,
    pub deadline: Option<Duration>,
}

/// How a call on a stream of its own failed: with an answer (the gate's status), or with its
/// connection.
pub(crate) enum Failure {
    Answered(Status),
    Broken(Status),
}

impl Failure {
    pub(crate) fn status(self) -> Status {
        match self {
            Failure::Answered(status) | Failure::Broken(status) => status,
        }
    }

    /// An HTTP/2 error: the connection's (gone, refused, reset) or this stream's.
    pub(crate) fn from_h2(error: h2::Error) -> Failure {
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
