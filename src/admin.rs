//! The operator API, `GateAdminService`: completions done by hand, expired leases settled after
//! reconciliation, and the list of unresolved actions. proto ↔ domain, validation, and one audit
//! event per operator action; the semantics are the ledger's ([`crate::ledger::record_external`],
//! [`crate::ledger::resolve_expired`]) applied by the store in one atomic step.
//!
//! Every RPC needs an operator principal acting within its agents; agent principals get
//! PERMISSION_DENIED (`FORBIDDEN_SCOPE`) before anything is read.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::{
    auth::{self, Principal},
    error::GateError,
    fingerprint::{self, ParamsLimits},
    gate::{AUDIT, Gate, check_id, refusal_name},
    ledger::{ExternalCompletion, RequestHash, Resolution, Resolved, Source},
    pb::{self, gate_admin_service_server::GateAdminService},
    service::{action_key, action_ref, audit_span, completion, timestamp},
    store::{ActionKey, ListCursor},
};

/// Longest operator note, in bytes.
pub const MAX_NOTE_BYTES: usize = 1024;
/// Default and largest ListUnresolved page.
const DEFAULT_PAGE: u32 = 100;
const MAX_PAGE: u32 = 1000;

/// The gRPC face of the operator API over a [`Gate`].
#[derive(Clone)]
pub struct AdminService {
    gate: Gate,
}

impl AdminService {
    /// Serves the operator API of `gate`.
    pub fn new(gate: Gate) -> Self {
        Self { gate }
    }

    /// Checks the action reference, the receipt and the note against the limits.
    fn check(&self, key: &ActionKey, receipt: &[u8], note: &str) -> Result<(), GateError> {
        self.gate.check_ref(key)?;
        let max = self.gate.policies().limits.max_receipt_bytes;
        if receipt.len() > max {
            return Err(GateError::invalid(
                "receipt",
                format!("is {} bytes, more than the limit of {max}", receipt.len()),
            ));
        }
        if note.len() > MAX_NOTE_BYTES {
            return Err(GateError::invalid(
                "note",
                format!(
                    "is {} bytes, more than the limit of {MAX_NOTE_BYTES}",
                    note.len()
                ),
            ));
        }
        Ok(())
    }

    /// The request hash of an external completion, computed as RequestToken does (the action
    /// policy's key fields and retention); `None` when the request names no action.
    fn request_hash(
        &self,
        key: &ActionKey,
        action: &str,
        params_json: &str,
        intent_id: &str,
    ) -> Result<Option<RequestHash>, GateError> {
        if action.is_empty() && params_json.is_empty() && intent_id.is_empty() {
            return Ok(None);
        }
        let policies = self.gate.policies();
        check_id(&policies.limits, "action_name", action, true)?;
        check_id(&policies.limits, "intent_id", intent_id, false)?;
        let policy = policies.for_action(action).ok_or_else(|| {
            GateError::invalid(
                "action_name",
                "no policy names this action and the gate is strict",
            )
        })?;
        let limits = ParamsLimits {
            max_bytes: policies.limits.max_params_bytes,
            max_depth: policies.limits.max_params_depth,
        };
        let params = fingerprint::parse_params(params_json, limits)
            .map_err(|e| GateError::invalid("params_json", e.to_string()))?;
        let selection = fingerprint::select(&params, &policy.key_fields);
        let fp = fingerprint::fingerprint(action, intent_id, &selection);
        // Keyed by its fingerprint, an action cannot meet another request; keyed by an
        // idempotency key it can, and the digests name the differing fields.
        let digests = if key.key == fp {
            String::new()
        } else {
            fingerprint::field_digests(action, intent_id, &selection)
        };
        Ok(Some(RequestHash {
            fingerprint: fp,
            digests,
            retention: policy.retention,
            sliding: policy.sliding,
        }))
    }
}

/// The operator check: an operator principal acting within its agents.
fn operator(principal: &Arc<Principal>, agent_id: &str) -> Result<(), GateError> {
    principal.authorize(agent_id, true)
}

#[tonic::async_trait]
impl GateAdminService for AdminService {
    async fn record_external_completion(
        &self,
        request: Request<pb::RecordExternalCompletionRequest>,
    ) -> Result<Response<pb::RecordExternalCompletionResponse>, Status> {
        let principal = auth::principal(&request)?;
        let req = request.into_inner();
        let key = action_key(req.action)?;
        operator(&principal, &key.agent_id)?;
        self.check(&key, &req.receipt, &req.note)?;
        let hash = self.request_hash(&key, &req.action_name, &req.params_json, &req.intent_id)?;
        let ext = ExternalCompletion {
            receipt: req.receipt,
            note: req.note,
            operator: principal.name.clone(),
            request: hash,
        };
        let reply = self
            .gate
            .store()
            .record_external(&key, &ext)
            .await
            .map_err(GateError::from)?;
        let span = audit_span(&principal);
        let _entered = span.enter();
        let decision = match &reply.result {
            Ok(done) if done.recorded => "completed_by_operator",
            Ok(_) => "operator_completion_repeated",
            Err(refusal) => refusal_name(refusal),
        };
        tracing::info!(target: AUDIT, agent_id = %key.agent_id, run_id = %key.run_id, key = %key.key,
            decision, fencing = reply.result.as_ref().map_or(0, |d| d.completion.fencing),
            note = %ext.note, "record_external_completion");
        let done = reply.result.map_err(GateError::Refused)?;
        if done.recorded {
            self.gate.metrics().completion(Source::Operator);
        }
        Ok(Response::new(pb::RecordExternalCompletionResponse {
            completion: Some(completion(done.completion)),
            recorded: done.recorded,
        }))
    }

    async fn resolve_expired(
        &self,
        request: Request<pb::ResolveExpiredRequest>,
    ) -> Result<Response<pb::ResolveExpiredResponse>, Status> {
        let principal = auth::principal(&request)?;
        let req = request.into_inner();
        let key = action_key(req.action)?;
        operator(&principal, &key.agent_id)?;
        self.check(&key, &req.receipt, &req.note)?;
        let resolution = match pb::Resolution::try_from(req.resolution) {
            Ok(pb::Resolution::Completed) => Resolution::Completed {
                receipt: req.receipt,
                note: req.note.clone(),
                operator: principal.name.clone(),
            },
            Ok(pb::Resolution::Failed) if req.receipt.is_empty() => Resolution::Failed,
            Ok(pb::Resolution::Failed) => {
                return Err(GateError::invalid(
                    "receipt",
                    "a failed action has no receipt; leave it empty",
                )
                .into());
            }
            _ => {
                return Err(GateError::invalid(
                    "resolution",
                    "must be RESOLUTION_COMPLETED or RESOLUTION_FAILED",
                )
                .into());
            }
        };
        let reply = self
            .gate
            .store()
            .resolve_expired(&key, &resolution)
            .await
            .map_err(GateError::from)?;
        let span = audit_span(&principal);
        let _entered = span.enter();
        let (decision, fencing) = match &reply.result {
            Ok(Resolved::Completed(done)) => ("resolved_completed", done.fencing),
            Ok(Resolved::Released { fencing }) => ("resolved_failed", *fencing),
            Err(refusal) => (refusal_name(refusal), 0),
        };
        tracing::info!(target: AUDIT, agent_id = %key.agent_id, run_id = %key.run_id, key = %key.key,
            decision, fencing, note = %req.note, "resolve_expired");
        let resolved = reply.result.map_err(GateError::Refused)?;
        match &resolved {
            Resolved::Completed(_) => self.gate.metrics().completion(Source::Operator),
            Resolved::Released { .. } => self.gate.metrics().release("resolved_failed"),
        }
        let response = match resolved {
            Resolved::Completed(done) => pb::ResolveExpiredResponse {
                fencing: done.fencing,
                completion: Some(completion(done)),
            },
            Resolved::Released { fencing } => pb::ResolveExpiredResponse {
                fencing,
                completion: None,
            },
        };
        Ok(Response::new(response))
    }

    async fn list_unresolved(
        &self,
        request: Request<pb::ListUnresolvedRequest>,
    ) -> Result<Response<pb::ListUnresolvedResponse>, Status> {
        let principal = auth::principal(&request)?;
        let req = request.into_inner();
        let agent = (!req.agent_id.is_empty()).then_some(req.agent_id.as_str());
        match agent {
            Some(agent) => operator(&principal, agent)?,
            None if principal.role == auth::Role::Operator && principal.acts_for_all() => {}
            None => return Err(principal.forbidden().into()),
        }
        if let Some(agent) = agent {
            check_id(&self.gate.policies().limits, "agent_id", agent, true)?;
        }
        let limit = match req.page_size {
            0 => DEFAULT_PAGE,
            n if n <= MAX_PAGE => n,
            _ => {
                return Err(
                    GateError::invalid("page_size", format!("must be at most {MAX_PAGE}")).into(),
                );
            }
        };
        let after = match req.page_token.as_str() {
            "" => None,
            token => {
                let cursor = ListCursor::decode(token)
                    .filter(|c| agent.is_none_or(|a| a == c.agent_id))
                    .ok_or_else(|| {
                        GateError::invalid("page_token", "is not a token this listing returned")
                    })?;
                Some(cursor)
            }
        };
        let reply = self
            .gate
            .store()
            .list_unresolved(agent, after.as_ref(), limit as usize)
            .await
            .map_err(GateError::from)?;
        let page = reply.result.map_err(GateError::Refused)?;
        let span = audit_span(&principal);
        let _entered = span.enter();
        tracing::info!(target: AUDIT, agent_id = agent.unwrap_or("*"), count = page.items.len(),
            decision = "listed", "list_unresolved");
        Ok(Response::new(pb::ListUnresolvedResponse {
            actions: page
                .items
                .into_iter()
                .map(|u| pb::UnresolvedAction {
                    action: Some(action_ref(&u.key)),
                    fencing: u.view.fencing,
                    lease_expired_at: u.view.lease_expires_at.map(timestamp),
                    holder: u.view.holder,
                    fingerprint: u.view.fingerprint,
                })
                .collect(),
            next_page_token: page.next.map(|c| c.encode()).unwrap_or_default(),
        }))
    }
}
