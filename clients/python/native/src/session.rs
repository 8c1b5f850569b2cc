//! RequestToken and Complete as messages of one `Session` stream per connection
//! (docs/CONTRACT.md, Session): a call costs one DATA frame each way instead of a new HTTP/2
//! stream with its headers and trailers: about a fifth less of the client's and of the gate's CPU
//! per cycle (BENCHMARKS.md, "What was tried"). The messages stay opaque: the request's bytes
//! are wrapped in a `SessionRequest` and the reply's bytes cut out of the `SessionResponse`
//! without decoding either, so [`crate::worker`] reads them as it reads a unary reply.
//!
//! A session is opened by the first call that needs one, on the link's connection, with that
//! call's metadata; a call with other metadata goes unary ([`crate::unary`]). A gate that does not
//! know the method answers `UNIMPLEMENTED`: the link then sends every call unary. Owns no
//! deadline and no retry ([`crate::unary::call`] does).

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use h2::{
    RecvStream, SendStream,
    client::{ResponseFuture, SendRequest},
};
use http::{HeaderMap, StatusCode};
use prost::encoding::{WireType, decode_key, decode_varint, encode_key, encode_varint};
use tokio::sync::oneshot;
use tonic::{Code, Status};

use crate::wire::{self, COMPLETE, Call, REQUEST_TOKEN};

/// The method every session runs on.
pub(crate) const SESSION: &str = "/oncegate.v1.ActionGateService/Session";

/// `SessionRequest`'s field of each call it carries, by the unary method's path.
pub(crate) fn field_of(path: &str) -> Option<u32> {
    match path {
        REQUEST_TOKEN => Some(3),
        COMPLETE => Some(4),
        _ => None,
    }
}

/// How a session call failed: with its own answer (the gate's status for this call), or with the
/// session (it ended or broke before answering: whether the call took effect is unknown).
pub(crate) enum Failure {
    Answered(Status),
    Ended(Status),
}

type Waiters = Mutex<HashMap<u64, oneshot::Sender<Result<Bytes, Failure>>>>;

/// One open session: where to write calls, and who waits for which answer.
pub(crate) struct Session {
    send: Mutex<SendStream<Bytes>>,
    shared: Arc<Shared>,
    next_id: AtomicU64,
    /// The metadata it was opened with: only calls with the same use it.
    pub(crate) metadata: HeaderMap,
}

struct Shared {
    waiters: Waiters,
    ended: AtomicBool,
}

impl Session {
    /// Opens a session on the HTTP/2 connection of `send` with the metadata of `call`. Its answers
    /// are read by a task on the current runtime, which fails every waiting call when the session
    /// ends.
    pub(crate) async fn open(send: &SendRequest<Bytes>, call: &Call) -> Result<Session, Failure> {
        let opening = Call {
            uri: call.uri.clone(),
            message: Bytes::new(),
            metadata: call.metadata.clone(),
            deadline: None,
        };
        let mut request = wire::head(&opening).map_err(Failure::Answered)?;
        let mut path = call.uri.clone().into_parts();
        path.path_and_query = Some(http::uri::PathAndQuery::from_static(SESSION));
        *request.uri_mut() = http::Uri::from_parts(path)
            .map_err(|e| Failure::Answered(Status::internal(format!("session URI: {e}"))))?;
        let ended = |e: h2::Error| Failure::Ended(wire::h2_status(e));
        let mut send = send.clone().ready().await.map_err(ended)?;
        let (response, stream) = send.send_request(request, false).map_err(ended)?;
        let shared = Arc::new(Shared {
            waiters: Mutex::default(),
            ended: AtomicBool::new(false),
        });
        let reader = Arc::clone(&shared);
        tokio::spawn(async move {
            let status = read(response, &reader).await;
            reader.ended.store(true, Ordering::Release);
            let waiting: Vec<_> = lock(&reader.waiters).drain().map(|(_, w)| w).collect();
            for waiter in waiting {
                let _ = waiter.send(Err(Failure::Ended(status.clone())));
            }
        });
        Ok(Session {
            send: Mutex::new(stream),
            shared,
            next_id: AtomicU64::new(1),
            metadata: call.metadata.clone(),
        })
    }

    /// Whether the session ended: the next call opens another.
    pub(crate) fn ended(&self) -> bool {
        self.shared.ended.load(Ordering::Acquire)
    }

    /// Sends `message` as the call in `field` of a `SessionRequest` (with `deadline` as its
    /// timeout) and waits for its answer: the reply's bytes, or how it failed.
    pub(crate) async fn call(
        &self,
        field: u32,
        message: &Bytes,
        deadline: Option<Duration>,
    ) -> Result<Bytes, Failure> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.shared.waiters).insert(id, tx);
        // Dropped unanswered (its deadline, or its caller cancelled it): forgotten.
        let _waiting = Waiting {
            shared: &self.shared,
            id,
        };
        if self.ended() {
            return Err(Failure::Ended(Status::unavailable("the session ended")));
        }
        let frame = request(id, field, message, deadline);
        let sent = lock(&self.send).send_data(frame, false);
        if let Err(error) = sent {
            self.shared.ended.store(true, Ordering::Release);
            return Err(Failure::Ended(wire::h2_status(error)));
        }
        rx.await
            .unwrap_or_else(|_| Err(Failure::Ended(Status::unavailable("the session ended"))))
    }
}

/// Forgets a call's waiter when its future goes.
struct Waiting<'a> {
    shared: &'a Shared,
    id: u64,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        lock(&self.shared.waiters).remove(&self.id);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A `SessionRequest` with `message` as the call in `field`, framed as one gRPC message.
fn request(id: u64, field: u32, message: &Bytes, deadline: Option<Duration>) -> Bytes {
    let mut body = BytesMut::with_capacity(message.len() + 40);
    encode_key(1, WireType::Varint, &mut body);
    encode_varint(id, &mut body);
    if let Some(deadline) = deadline {
        // google.protobuf.Duration: seconds (1), nanos (2).
        let mut timeout = BytesMut::with_capacity(16);
        encode_key(1, WireType::Varint, &mut timeout);
        encode_varint(deadline.as_secs(), &mut timeout);
        encode_key(2, WireType::Varint, &mut timeout);
        encode_varint(u64::from(deadline.subsec_nanos()), &mut timeout);
        encode_key(2, WireType::LengthDelimited, &mut body);
        encode_varint(timeout.len() as u64, &mut body);
        body.put_slice(&timeout);
    }
    encode_key(field, WireType::LengthDelimited, &mut body);
    encode_varint(message.len() as u64, &mut body);
    body.put_slice(message);
    let mut frame = BytesMut::with_capacity(5 + body.len());
    frame.put_u8(0);
    frame.put_u32(body.len() as u32);
    frame.put_slice(&body);
    frame.freeze()
}

/// Reads the session's answers and hands each to its waiter, until the session ends; answers
/// the status it ended with.
async fn read(response: ResponseFuture, shared: &Shared) -> Status {
    let response = match response.await {
        Ok(response) => response,
        Err(error) => return wire::h2_status(error),
    };
    let (parts, body) = response.into_parts();
    if parts.status != StatusCode::OK {
        return wire::http_status(parts.status);
    }
    if let Some(status) = wire::trailers_only(&parts.headers) {
        return status;
    }
    match messages(body, shared).await {
        Ok(Some(trailers)) => match Status::from_header_map(&trailers) {
            Some(status) if status.code() != Code::Ok => status,
            _ => Status::unavailable("the gate ended the session"),
        },
        Ok(None) => Status::unavailable("the gate ended the session without a status"),
        Err(status) => status,
    }
}

/// The framed `SessionResponse`s of `body`, each handed to its waiter; then the trailers.
async fn messages(mut body: RecvStream, shared: &Shared) -> Result<Option<HeaderMap>, Status> {
    let mut received = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(wire::h2_status)?;
        let _ = body.flow_control().release_capacity(chunk.len());
        received.extend_from_slice(&chunk);
        while received.len() >= 5 {
            if received[0] != 0 {
                return Err(Status::internal(
                    "a compressed session message (none was asked for)",
                ));
            }
            let length = u32::from_be_bytes([received[1], received[2], received[3], received[4]]);
            if received.len() < 5 + length as usize {
                break;
            }
            received.advance(5);
            let message = received.split_to(length as usize).freeze();
            let (id, answer) = response(message)
                .ok_or_else(|| Status::internal("the gate sent a malformed session message"))?;
            if let Some(waiter) = lock(&shared.waiters).remove(&id) {
                let _ = waiter.send(answer.map_err(Failure::Answered));
            }
        }
    }
    body.trailers().await.map_err(wire::h2_status)
}

/// A `SessionResponse`'s id and its answer: the reply's bytes as they came, or the status.
fn response(mut message: Bytes) -> Option<(u64, Result<Bytes, Status>)> {
    let mut id = 0;
    let mut answer = None;
    while message.has_remaining() {
        let (field, wire) = decode_key(&mut message).ok()?;
        match (field, wire) {
            (1, WireType::Varint) => id = decode_varint(&mut message).ok()?,
            (2 | 3, WireType::LengthDelimited) => answer = Some(Ok(bytes(&mut message)?)),
            (4, WireType::LengthDelimited) => answer = Some(Err(error(bytes(&mut message)?)?)),
            _ => return None,
        }
    }
    Some((id, answer?))
}

/// A `SessionError` as the status a unary call would have failed with.
fn error(mut message: Bytes) -> Option<Status> {
    let (mut code, mut text, mut details) = (0, String::new(), Bytes::new());
    while message.has_remaining() {
        let (field, wire) = decode_key(&mut message).ok()?;
        match (field, wire) {
            (1, WireType::Varint) => code = decode_varint(&mut message).ok()? as i32,
            (2, WireType::LengthDelimited) => {
                text = String::from_utf8_lossy(&bytes(&mut message)?).into_owned();
            }
            (3, WireType::LengthDelimited) => details = bytes(&mut message)?,
            _ => return None,
        }
    }
    Some(Status::with_details(Code::from_i32(code), text, details))
}

/// A length-delimited field's bytes.
fn bytes(message: &mut Bytes) -> Option<Bytes> {
    let length = usize::try_from(decode_varint(message).ok()?).ok()?;
    (message.remaining() >= length).then(|| message.split_to(length))
}

#[cfg(test)]
mod tests {
    use oncegate_proto as pb;
    use prost::Message;

    use super::*;

    #[test]
    fn a_call_is_wrapped_as_the_gate_reads_a_session_request() {
        let inner = pb::CompleteRequest {
            token: "t".into(),
            receipt: b"{}".to_vec(),
            ..Default::default()
        };
        let frame = request(
            7,
            4,
            &Bytes::from(inner.encode_to_vec()),
            Some(Duration::from_millis(1500)),
        );
        let decoded = pb::SessionRequest::decode(&frame[5..]).unwrap();
        assert_eq!(
            frame.len() - 5,
            u32::from_be_bytes(frame[1..5].try_into().unwrap()) as usize
        );
        assert_eq!(decoded.id, 7);
        let timeout = decoded.timeout.unwrap();
        assert_eq!((timeout.seconds, timeout.nanos), (1, 500_000_000));
        assert_eq!(
            decoded.call,
            Some(pb::session_request::Call::Complete(inner))
        );
    }

    #[test]
    fn a_response_is_cut_out_as_the_unary_reply_or_its_status() {
        let reply = pb::CompleteResponse::default();
        let answered = pb::SessionResponse {
            id: 3,
            result: Some(pb::session_response::Result::Complete(reply.clone())),
        };
        let (id, answer) = response(answered.encode_to_vec().into()).unwrap();
        assert_eq!(id, 3);
        assert_eq!(answer.unwrap(), reply.encode_to_vec());

        let failed = pb::SessionResponse {
            id: 4,
            result: Some(pb::session_response::Result::Error(pb::SessionError {
                code: Code::FailedPrecondition as i32,
                message: "token mismatch".into(),
                details: b"\x08\x09".to_vec(),
            })),
        };
        let (id, answer) = response(failed.encode_to_vec().into()).unwrap();
        assert_eq!(id, 4);
        let status = answer.unwrap_err();
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert_eq!(status.message(), "token mismatch");
        assert_eq!(status.details(), b"\x08\x09");

        assert!(
            response(Bytes::from_static(b"\x08")).is_none(),
            "a truncated message"
        );
        assert!(
            response(Bytes::from_static(b"\x08\x01")).is_none(),
            "no result"
        );
    }
}
