//! The generated `ActionGateService` trait: the scope check, then proto → domain, the gate, and
//! domain → proto ([`super::convert`]). Nothing else.

use std::sync::Arc;

use tokio::sync::watch;
use tokio_stream::{StreamExt as _, wrappers::ReceiverStream};
use tonic::{Request, Response, Status, Streaming};

use super::{
    auth::{self, Capability, Principal},
    convert::{
        action_key, action_view, completion, duration_ms, release_reason, timestamp, token_response,
    },
    status::{answer, status},
};
use oncegate_gate::{Gate, GateError, TokenCall};
use oncegate_observe::telemetry::{self, layer::observe_message};
use oncegate_proto::{self as pb, action_gate_service_server::ActionGateService};

/// The gRPC face of a [`Gate`].
#[derive(Clone)]
pub struct GateService {
    gate: Gate,
    /// Turns `true` when the server drains: open sessions end (docs/CONTRACT.md, Session).
    draining: watch::Receiver<bool>,
}

impl GateService {
    /// Serves `gate` over gRPC; its sessions end when `draining` turns `true` (or never, when
    /// its sender is gone without having sent it).
    pub fn new(gate: Gate, draining: watch::Receiver<bool>) -> Self {
        Self { gate, draining }
    }
}

/// The responses of one session, as its calls finish.
type SessionStream = ReceiverStream<Result<pb::SessionResponse, Status>>;

/// How many calls of one session may be running or answered and not yet read by the caller: past
/// it, the session reads no new call until the caller reads answers.
const SESSION_BACKLOG: usize = 64;

impl GateService {
    /// One call of a session, answered as its unary method answers it, with the same
    /// observation (docs/CONTRACT.md, Session).
    async fn session_call(
        &self,
        principal: &Arc<Principal>,
        headers: &http::HeaderMap,
        call: pb::SessionRequest,
    ) -> pb::SessionResponse {
        use pb::{session_request::Call, session_response::Result as Answer};
        let timeout = call
            .timeout
            .and_then(|t| std::time::Duration::try_from(t).ok());
        let metrics = self.gate.metrics();
        let result = match call.call {
            Some(Call::RequestToken(message)) => {
                let answered = observe_message(metrics, REQUEST_TOKEN, headers, timeout, async {
                    self.request_token(auth::session_call(principal, message)?)
                        .await
                });
                answered
                    .await
                    .map(|reply| Answer::RequestToken(reply.into_inner()))
            }
            Some(Call::Complete(message)) => {
                let answered = observe_message(metrics, COMPLETE, headers, timeout, async {
                    self.complete(auth::session_call(principal, message)?).await
                });
                answered
                    .await
                    .map(|reply| Answer::Complete(reply.into_inner()))
            }
            None => Err(status(GateError::invalid(
                "call",
                "a session message must carry a call",
            ))),
        };
        pb::SessionResponse {
            id: call.id,
            result: Some(result.unwrap_or_else(|error| {
                Answer::Error(pb::SessionError {
                    code: error.code() as i32,
                    message: error.message().to_owned(),
                    details: error.details().to_vec(),
                })
            })),
        }
    }
}

/// The names a session's calls are observed under: their unary methods'.
const REQUEST_TOKEN: &str = "oncegate.v1.ActionGateService/RequestToken";
const COMPLETE: &str = "oncegate.v1.ActionGateService/Complete";

/// The caller, and the check that it may act for `agent_id` (before any store call).
fn authorized(principal: &Arc<Principal>, agent_id: &str) -> Result<(), GateError> {
    telemetry::record_principal(&principal.name);
    principal.authorize(agent_id, Capability::Work)
}

#[tonic::async_trait]
impl ActionGateService for GateService {
    type SessionStream = SessionStream;

    /// Reads calls until the caller ends its side or the gate drains, runs each as its own task
    /// (as a unary call would run), and sends each answer as it comes; then, once every call
    /// read has been answered, ends the stream (`UNAVAILABLE` when draining).
    async fn session(
        &self,
        request: Request<Streaming<pb::SessionRequest>>,
    ) -> Result<Response<SessionStream>, Status> {
        let principal = auth::principal(&request).map_err(status)?;
        let headers = Arc::new(request.metadata().clone().into_headers());
        let mut calls = request.into_inner();
        let (answers, stream) = tokio::sync::mpsc::channel(SESSION_BACKLOG);
        let service = self.clone();
        let mut draining = self.draining.clone();
        tokio::spawn(async move {
            let drained = async move {
                if draining.wait_for(|draining| *draining).await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            tokio::pin!(drained);
            let mut running = tokio::task::JoinSet::new();
            let ended = loop {
                let call = tokio::select! {
                    biased;
                    () = &mut drained => break Some(Status::unavailable(
                        "the gate is draining: open a new session (on another replica)",
                    )),
                    Some(_) = running.join_next(), if !running.is_empty() => continue,
                    call = calls.next() => call,
                };
                match call {
                    Some(Ok(call)) => {
                        // A place for its answer first: a caller that stops reading stops the
                        // session's reading too, instead of answers piling up in the gate.
                        let Ok(slot) = answers.clone().reserve_owned().await else {
                            break None; // the caller is gone
                        };
                        let (service, principal, headers) =
                            (service.clone(), principal.clone(), headers.clone());
                        running.spawn(async move {
                            let response = service.session_call(&principal, &headers, call).await;
                            slot.send(Ok(response));
                        });
                    }
                    Some(Err(error)) => break Some(error),
                    None => break None,
                }
            };
            // Every call read is answered before the stream ends.
            while running.join_next().await.is_some() {}
            if let Some(status) = ended {
                let _ = answers.send(Err(status)).await;
            }
        });
        Ok(Response::new(ReceiverStream::new(stream)))
    }

    async fn request_token(
        &self,
        request: Request<pb::RequestTokenRequest>,
    ) -> Result<Response<pb::RequestTokenResponse>, Status> {
        answer(async move {
            let principal = auth::principal(&request)?;
            let req = request.into_inner();
            // A request that cannot even be converted is still an attempt: counted as `invalid`.
            let invalid = |e: GateError| self.gate.invalid_attempt(&req.action, e);
            let scope = req
                .scope
                .ok_or_else(|| invalid(GateError::invalid("scope", "is required")))?;
            authorized(&principal, &scope.agent_id)?;
            let lease = duration_ms("lease_ttl", req.lease_ttl).map_err(invalid)?;
            let call = TokenCall {
                agent_id: scope.agent_id,
                run_id: scope.run_id,
                action: req.action,
                params_json: req.params_json,
                intent_id: req.intent_id,
                idempotency_key: req.idempotency_key,
                holder: req.holder,
                lease,
                principal: principal.name.clone(),
            };
            Ok(token_response(self.gate.request_token(call).await?))
        })
        .await
    }

    async fn complete(
        &self,
        request: Request<pb::CompleteRequest>,
    ) -> Result<Response<pb::CompleteResponse>, Status> {
        answer(async move {
            let principal = auth::principal(&request)?;
            let req = request.into_inner();
            let key = action_key(req.action)?;
            authorized(&principal, &key.agent_id)?;
            let done = self.gate.complete(&key, &req.token, &req.receipt).await?;
            Ok(pb::CompleteResponse {
                completion: Some(completion(done.completion)),
            })
        })
        .await
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        answer(async move {
            let principal = auth::principal(&request)?;
            let req = request.into_inner();
            let key = action_key(req.action)?;
            authorized(&principal, &key.agent_id)?;
            let reason = release_reason(req.reason)?;
            let fencing = self.gate.release(&key, &req.token, reason).await?;
            Ok(pb::ReleaseResponse { fencing })
        })
        .await
    }

    async fn extend_lease(
        &self,
        request: Request<pb::ExtendLeaseRequest>,
    ) -> Result<Response<pb::ExtendLeaseResponse>, Status> {
        answer(async move {
            let principal = auth::principal(&request)?;
            let req = request.into_inner();
            let key = action_key(req.action)?;
            authorized(&principal, &key.agent_id)?;
            let ttl = duration_ms("ttl", req.ttl)?;
            let at = self.gate.extend_lease(&key, &req.token, ttl).await?;
            Ok(pb::ExtendLeaseResponse {
                lease_expires_at: Some(timestamp(at)),
            })
        })
        .await
    }

    async fn get_action(
        &self,
        request: Request<pb::GetActionRequest>,
    ) -> Result<Response<pb::GetActionResponse>, Status> {
        answer(async move {
            let principal = auth::principal(&request)?;
            let key = action_key(request.into_inner().action)?;
            authorized(&principal, &key.agent_id)?;
            let mut view = self.gate.get(&key).await?;
            if principal.role != auth::Role::Operator {
                // The holder names who may have a live token redelivered, and the token itself would
                // let any caller in scope complete or release someone else's live attempt: operators'
                // business only. (An agent that asks again for an expired action hears its token in
                // LEASE_EXPIRED_UNRESOLVED, as the one who may reconcile it.)
                view.holder.clear();
                view.token.clear();
                // What the unsettled grant was asked for is what an operator reconciles with.
                view.action.clear();
                view.params.clear();
            }
            Ok(action_view(&key, view))
        })
        .await
    }
}
