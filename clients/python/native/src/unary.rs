//! One gRPC call to the gate over a link ([`crate::link`]): as the call of its kind on the link's
//! session ([`crate::session`]) when it has one, otherwise on an HTTP/2 stream of its own (its
//! request's bytes out as the message, HEADERS then one DATA frame that ends the stream, the
//! response's bytes back as they arrived, the status from the trailers or a trailers-only answer:
//! [`crate::wire`]). The messages are opaque here (Python's protobuf serializes and parses them,
//! or [`crate::worker`] with the prost messages). Owns the deadline and the one retry; owns no
//! connection.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::StatusCode;
use tonic::{Code, Status};

use crate::{
    link::{Connection, Link},
    session::{self, Failure as SessionFailure},
    wire::{Call, Failure, ended, frame, head, http_status, trailers_only},
};

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

/// How a call past its deadline fails.
fn deadline_exceeded() -> Status {
    Status::new(Code::DeadlineExceeded, "Deadline Exceeded")
}
