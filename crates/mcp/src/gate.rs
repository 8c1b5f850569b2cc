//! The gate as the gateway sees it: in-process ([`Gate`], the same one `oncegate serve` runs, on
//! the embedded store) or over gRPC ([`GateClient`]), behind one small interface. Same semantics
//! either way: the gate decides, and counts and audits its decisions where it always does (in
//! process here, on the gate server there). Owns the mapping of both to [`Answer`] / [`Refused`].

use std::time::Duration;

use oncegate_client::{ActionSpec, ClientError, GateClient, TokenReply};
use oncegate_domain::{
    ActionKey,
    ledger::{Refusal, Source, TokenOutcome},
};
use oncegate_gate::{Gate, GateError, TokenCall, audit::refusal_name};
use oncegate_proto as pb;

/// Where the gate is.
#[derive(Clone)]
pub enum GateLink {
    /// In this process, on the embedded store.
    Local(Gate),
    /// A gate server, over gRPC.
    Remote(GateClient),
}

/// One RequestToken, as the gateway asks it.
#[derive(Debug, Clone, Default)]
pub struct Ask {
    pub agent_id: String,
    pub run_id: String,
    pub action: String,
    pub params_json: String,
    pub idempotency_key: String,
    pub holder: String,
}

/// A granted token: run the tool, then Complete or Release it.
#[derive(Debug, Clone)]
pub struct Ticket {
    pub key: ActionKey,
    pub token: String,
    pub fencing: u64,
    pub provider_key: String,
    /// The lease length, for the heartbeat.
    pub lease: Duration,
}

/// A completion the gate holds.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub receipt: Vec<u8>,
    pub fencing: u64,
    /// Recorded by an operator (its receipt is the operator's text, not a tool result).
    pub by_operator: bool,
}

/// What RequestToken answered.
#[derive(Debug, Clone)]
pub enum Answer {
    Granted(Ticket),
    Completed(Recorded),
}

/// Why the gate did not grant, complete, release or extend.
#[derive(Debug, Clone)]
pub enum Refused {
    /// The idempotency key was used with other key fields: their names.
    KeyReused(Vec<String>),
    /// Another attempt holds a live lease; the time left on it.
    InProgress(Duration),
    /// An earlier attempt's lease ended without Complete or Release: reconcile first.
    LeaseExpired { fencing: u64 },
    /// The request is malformed (the field and what is wrong).
    Invalid { field: String, description: String },
    /// The gate or its store cannot be reached (nothing was granted).
    Unavailable(String),
    /// Anything else (unauthenticated, forbidden, a token refused...).
    Other(String),
}

impl GateLink {
    /// RequestToken.
    pub async fn request_token(&self, ask: &Ask) -> Result<Answer, Refused> {
        match self {
            Self::Local(gate) => {
                let call = TokenCall {
                    agent_id: ask.agent_id.clone(),
                    run_id: ask.run_id.clone(),
                    action: ask.action.clone(),
                    params_json: ask.params_json.clone(),
                    idempotency_key: ask.idempotency_key.clone(),
                    holder: ask.holder.clone(),
                    ..Default::default()
                };
                let answer = gate.request_token(call).await.map_err(local_refusal)?;
                Ok(match answer.outcome {
                    TokenOutcome::Granted(grant, _) => {
                        let lease = gate
                            .policies()
                            .for_action(&ask.action)
                            .map_or(0, |p| p.lease);
                        Answer::Granted(Ticket {
                            key: answer.key,
                            token: grant.token,
                            fencing: grant.fencing,
                            provider_key: answer.provider_key,
                            lease: Duration::from_millis(lease.max(0) as u64),
                        })
                    }
                    TokenOutcome::AlreadyCompleted(done) => Answer::Completed(Recorded {
                        by_operator: done.source == Source::Operator,
                        receipt: done.receipt,
                        fencing: done.fencing,
                    }),
                    TokenOutcome::PendingApproval(pending) => {
                        return Err(Refused::Other(format!(
                            "pending approval {} ({}): an operator must approve this call",
                            pending.id, pending.reason
                        )));
                    }
                })
            }
            Self::Remote(client) => {
                let mut spec =
                    ActionSpec::new(&ask.agent_id, &ask.run_id, &ask.action, &ask.params_json)
                        .holder(&ask.holder);
                spec.idempotency_key = ask.idempotency_key.clone();
                let reply = client
                    .clone()
                    .request_token(&spec)
                    .await
                    .map_err(remote_refusal)?;
                Ok(match reply {
                    TokenReply::Granted(grant) => Answer::Granted(Ticket {
                        key: action_key(&grant.action),
                        token: grant.token,
                        fencing: grant.fencing,
                        provider_key: grant.provider_key,
                        lease: grant.lease,
                    }),
                    TokenReply::PendingApproval(approval) => {
                        return Err(Refused::Other(format!(
                            "pending approval {} ({}): an operator must approve this call",
                            approval.id, approval.reason
                        )));
                    }
                    TokenReply::AlreadyCompleted(done) => Answer::Completed(Recorded {
                        by_operator: done.source() == pb::CompletionSource::Operator,
                        receipt: done.receipt,
                        fencing: done.fencing,
                    }),
                })
            }
        }
    }

    /// Complete with `receipt`.
    pub async fn complete(&self, ticket: &Ticket, receipt: &[u8]) -> Result<(), Refused> {
        match self {
            Self::Local(gate) => gate
                .complete(&ticket.key, &ticket.token, receipt)
                .await
                .map(drop)
                .map_err(local_refusal),
            Self::Remote(client) => client
                .clone()
                .complete(&action_ref(&ticket.key), &ticket.token, receipt)
                .await
                .map(drop)
                .map_err(remote_refusal),
        }
    }

    /// Release: `attempted` = the tool ran and definitely failed; otherwise it never ran.
    pub async fn release(&self, ticket: &Ticket, attempted: bool) -> Result<(), Refused> {
        let reason = if attempted {
            pb::ReleaseReason::DefiniteFailure
        } else {
            pb::ReleaseReason::NotAttempted
        };
        match self {
            Self::Local(gate) => {
                let name = if attempted {
                    "definite_failure"
                } else {
                    "not_attempted"
                };
                gate.release(&ticket.key, &ticket.token, name)
                    .await
                    .map(drop)
                    .map_err(local_refusal)
            }
            Self::Remote(client) => client
                .clone()
                .release(&action_ref(&ticket.key), &ticket.token, reason)
                .await
                .map(drop)
                .map_err(remote_refusal),
        }
    }

    /// ExtendLease by the ticket's lease length (the heartbeat).
    pub async fn extend(&self, ticket: &Ticket) -> Result<(), Refused> {
        let ttl = ticket.lease.max(Duration::from_secs(1));
        match self {
            Self::Local(gate) => gate
                .extend_lease(&ticket.key, &ticket.token, Some(ttl.as_millis() as i64))
                .await
                .map(drop)
                .map_err(local_refusal),
            Self::Remote(client) => client
                .clone()
                .extend_lease(&action_ref(&ticket.key), &ticket.token, ttl)
                .await
                .map_err(remote_refusal),
        }
    }
}

fn action_key(action: &pb::ActionRef) -> ActionKey {
    let scope = action.scope.clone().unwrap_or_default();
    ActionKey::new(scope.agent_id, scope.run_id, action.key.clone())
}

fn action_ref(key: &ActionKey) -> pb::ActionRef {
    pb::ActionRef {
        scope: Some(pb::Scope {
            agent_id: key.agent_id.clone(),
            run_id: key.run_id.clone(),
        }),
        key: key.key.clone(),
    }
}

fn local_refusal(error: GateError) -> Refused {
    match error {
        GateError::Refused(refusal) | GateError::Unresolved { refusal, .. } => match refusal {
            Refusal::KeyReused { differing } => Refused::KeyReused(differing),
            Refusal::InProgress { retry_after } => {
                Refused::InProgress(Duration::from_millis(retry_after.max(0) as u64))
            }
            Refusal::LeaseExpired { fencing, .. } => Refused::LeaseExpired { fencing },
            other => Refused::Other(refusal_name(&other).to_owned()),
        },
        GateError::Invalid { field, description } => Refused::Invalid { field, description },
        GateError::Store(e) => Refused::Unavailable(e.to_string()),
        other => Refused::Other(other.to_string()),
    }
}

fn remote_refusal(error: ClientError) -> Refused {
    match error {
        ClientError::KeyReused { differing_fields } => Refused::KeyReused(differing_fields),
        ClientError::InProgress { retry_after } => Refused::InProgress(retry_after),
        ClientError::LeaseExpired { fencing, .. } => Refused::LeaseExpired { fencing },
        ClientError::Invalid { field, description } => Refused::Invalid { field, description },
        ClientError::Unavailable(message) => Refused::Unavailable(message),
        ClientError::RateLimited { retry_after } => {
            Refused::Unavailable(format!("rate limited for {retry_after:?}"))
        }
        other => Refused::Other(other.to_string()),
    }
}
