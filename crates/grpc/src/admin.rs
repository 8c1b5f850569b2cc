//! The operator API, `GateAdminService`: proto ↔ domain and the operator check, nothing else. The
//! operations themselves (validation, timing, counting, audit) are the gate's
//! ([`oncegate_gate::operator`]).
//!
//! Every RPC needs an operator principal acting within its agents (approvers: DecideApproval and
//! ListApprovals; resolvers: WatchUnresolved and ResolveExpired with an expected fencing number);
//! anyone else gets PERMISSION_DENIED (`FORBIDDEN_SCOPE`) before anything is read.

use std::{collections::HashSet, pin::Pin, sync::Arc};

use tokio::sync::{broadcast::error::RecvError, mpsc};
use tokio_stream::{Stream, wrappers::ReceiverStream};
use tonic::{Request, Response, Status};

use super::{
    auth::{self, Capability, LoginCodes, Principal},
    convert::{
        action_key, action_ref, approval_entry, completion, duration, receipt_entry,
        receipt_format, timestamp,
    },
    status::answer,
};
use oncegate_domain::{
    ActionKey,
    ledger::approval::Decision,
    ledger::{Millis, OperatorReceipt, Resolution, Resolved, State},
};
use oncegate_gate::{ExternalCall, Gate, GateError, ResolvedBy, Settlement};
use oncegate_observe::telemetry;
use oncegate_proto::{self as pb, gate_admin_service_server::GateAdminService};
use oncegate_store::Unresolved;

/// The most entries a WatchUnresolved stream starts with (what is unresolved when it opens).
const WATCH_START_CAP: usize = 10_000;

/// The gRPC face of the operator API over a [`Gate`].
#[derive(Clone)]
pub struct AdminService {
    gate: Gate,
    /// The console's login codes, when the gate serves a console.
    console_logins: Option<LoginCodes>,
}

impl AdminService {
    /// Serves the operator API of `gate`; `console_logins` issues the console's one-time codes
    /// (`None`: no console, CreateConsoleLogin is refused).
    pub fn new(gate: Gate, console_logins: Option<LoginCodes>) -> Self {
        Self {
            gate,
            console_logins,
        }
    }

    /// A resolver scoped by action type settles only those types: the action's type is read
    /// first (the fingerprint covers it, so every grant of the key has the same one). An action
    /// that is not unsettled any more is left to the store, whose answer (ALREADY_SETTLED for the
    /// grant the resolver names) tells the resolver that someone else settled it.
    async fn within_actions(
        &self,
        principal: &Principal,
        key: &ActionKey,
    ) -> Result<(), GateError> {
        let view = self.gate.get(key).await?;
        let unsettled = matches!(view.state, State::Authorized | State::Expired);
        match !unsettled || principal.may_settle_action(&view.action) {
            true => Ok(()),
            false => Err(principal.forbid_action(&view.action)),
        }
    }
}

/// The caller's check: a principal whose role grants `what`, acting within its agents.
fn allowed(principal: &Arc<Principal>, agent_id: &str, what: Capability) -> Result<(), GateError> {
    telemetry::record_principal(&principal.name);
    principal.authorize(agent_id, what)
}

/// Who settles with ResolveExpired: an operator (any settlement), or a resolver, which must name
/// the grant it settles (`expected_fencing`).
fn settler(
    principal: &Arc<Principal>,
    agent_id: &str,
    expected_fencing: u64,
) -> Result<ResolvedBy, GateError> {
    if principal.role.grants(Capability::Settle) {
        allowed(principal, agent_id, Capability::Settle)?;
        return Ok(ResolvedBy::Operator);
    }
    allowed(principal, agent_id, Capability::Resolve)?;
    if expected_fencing == 0 {
        return Err(GateError::invalid(
            "expected_fencing",
            "a resolver settles one grant: give the fencing number WatchUnresolved sent",
        ));
    }
    Ok(ResolvedBy::Resolver)
}

/// An unresolved action on the wire: what settling it needs.
fn unresolved_action(u: &Unresolved) -> pb::UnresolvedAction {
    pb::UnresolvedAction {
        action: Some(action_ref(&u.key)),
        fencing: u.view.fencing,
        lease_expired_at: u.view.lease_expires_at.map(timestamp),
        holder: u.view.holder.clone(),
        fingerprint: u.view.fingerprint.clone(),
        token: u.view.token.clone(),
        provider_key: u.key.provider_key(),
        action_name: u.asked.action.clone(),
        params_json: u.asked.params.clone(),
    }
}

/// One WatchUnresolved stream: what is unresolved now (of `agent`, or of every agent the
/// principal acts for), then each grant the gate's shared scan finds, until the caller goes away.
async fn watch(
    gate: Gate,
    principal: Arc<Principal>,
    agent: Option<String>,
    out: mpsc::Sender<Result<pb::WatchUnresolvedResponse, Status>>,
) {
    let wanted = |u: &Unresolved| {
        agent.as_deref().is_none_or(|a| a == u.key.agent_id)
            && principal.may_act_for(&u.key.agent_id)
            && principal.may_settle_action(&u.asked.action)
    };
    let send = |u: &Unresolved| {
        out.send(Ok(pb::WatchUnresolvedResponse {
            action: Some(unresolved_action(u)),
        }))
    };
    // Subscribed before listing, so that nothing ending in between is missed; what both show is
    // sent once.
    let mut feed = gate.watch_unresolved();
    let mut listed = HashSet::new();
    let mut token = String::new();
    loop {
        let page = match gate.list_unresolved(agent.as_deref(), &token, 0).await {
            Ok(page) => page,
            Err(e) => {
                let _ = out.send(Err(super::status::status(e))).await;
                return;
            }
        };
        for u in page.items.iter().filter(|u| wanted(u)) {
            listed.insert((u.key.encode(), u.view.fencing));
            if send(u).await.is_err() {
                return;
            }
        }
        match page.next {
            Some(next) if listed.len() < WATCH_START_CAP => token = next.encode(),
            _ => break,
        }
    }
    loop {
        // A caller that went away ends the stream (and its subscription) even when nothing new
        // comes: the shared scan stops once nobody watches.
        let received = tokio::select! {
            received = feed.recv() => received,
            () = out.closed() => return,
        };
        let u = match received {
            Ok(u) => u,
            Err(RecvError::Lagged(missed)) => {
                tracing::warn!(
                    missed,
                    "a WatchUnresolved stream fell behind; it skips some"
                );
                continue;
            }
            Err(RecvError::Closed) => return,
        };
        if !wanted(&u) || listed.remove(&(u.key.encode(), u.view.fencing)) {
            continue;
        }
        if send(&u).await.is_err() {
            return;
        }
    }
}

#[tonic::async_trait]
impl GateAdminService for AdminService {
    type WatchUnresolvedStream =
        Pin<Box<dyn Stream<Item = Result<pb::WatchUnresolvedResponse, Status>> + Send>>;

    async fn watch_unresolved(
        &self,
        request: Request<pb::WatchUnresolvedRequest>,
    ) -> Result<Response<Self::WatchUnresolvedStream>, Status> {
        let principal = auth::principal(&request).map_err(super::status::status)?;
        let req = request.into_inner();
        telemetry::record_principal(&principal.name);
        let agent = (!req.agent_id.is_empty()).then_some(req.agent_id);
        let checked = match &agent {
            Some(agent) => principal.authorize(agent, Capability::Resolve),
            None => principal
                .role
                .grants(Capability::Resolve)
                .then_some(())
                .ok_or_else(|| principal.forbidden(principal.lacks(Capability::Resolve))),
        };
        checked.map_err(super::status::status)?;
        let (out, stream) = mpsc::channel(64);
        tokio::spawn(watch(self.gate.clone(), principal, agent, out));
        Ok(Response::new(Box::pin(ReceiverStream::new(stream))))
    }

    async fn record_external_completion(
        &self,
        request: Request<pb::RecordExternalCompletionRequest>,
    ) -> Result<Response<pb::RecordExternalCompletionResponse>, Status> {
        answer(async move {
            let principal = auth::principal(&request)?;
            let req = request.into_inner();
            let key = action_key(req.action)?;
            allowed(&principal, &key.agent_id, Capability::Settle)?;
            let call = ExternalCall {
                key,
                receipt: req.receipt,
                format: receipt_format(req.receipt_format),
                note: req.note,
                operator: principal.name.clone(),
                action_name: req.action_name,
                params_json: req.params_json,
                intent_id: req.intent_id,
            };
            let done = self.gate.record_external(call).await?;
            Ok(pb::RecordExternalCompletionResponse {
                completion: Some(completion(done.completion)),
                recorded: done.recorded,
            })
        })
        .await
    }

    async fn resolve_expired(
        &self,
        request: Request<pb::ResolveExpiredRequest>,
    ) -> Result<Response<pb::ResolveExpiredResponse>, Status> {
        answer(async move {
            let principal = auth::principal(&request)?;
            let req = request.into_inner();
            let key = action_key(req.action)?;
            let resolved_by = settler(&principal, &key.agent_id, req.expected_fencing)?;
            if principal.scoped_by_action() {
                self.within_actions(&principal, &key).await?;
            }
            let resolution = match pb::Resolution::try_from(req.resolution) {
                Ok(pb::Resolution::Completed) => Resolution::Completed(OperatorReceipt {
                    receipt: req.receipt,
                    format: receipt_format(req.receipt_format),
                    note: req.note.clone(),
                    operator: principal.name.clone(),
                }),
                Ok(pb::Resolution::Failed) if req.receipt.is_empty() => Resolution::Failed,
                Ok(pb::Resolution::Failed) => {
                    return Err(GateError::invalid(
                        "receipt",
                        "a failed action has no receipt; leave it empty",
                    ));
                }
                _ => {
                    return Err(GateError::invalid(
                        "resolution",
                        "must be RESOLUTION_COMPLETED or RESOLUTION_FAILED",
                    ));
                }
            };
            let settlement = Settlement {
                key,
                resolution,
                note: req.note,
                expected_fencing: (req.expected_fencing != 0).then_some(req.expected_fencing),
                resolved_by,
            };
            let resolved = self.gate.resolve_expired(settlement).await?;
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
            Ok(response)
        })
        .await
    }

    async fn list_unresolved(
        &self,
        request: Request<pb::ListUnresolvedRequest>,
    ) -> Result<Response<pb::ListUnresolvedResponse>, Status> {
        answer(async move {
            let principal = auth::principal(&request)?;
            let req = request.into_inner();
            let agent = (!req.agent_id.is_empty()).then_some(req.agent_id.as_str());
            telemetry::record_principal(&principal.name);
            match agent {
                Some(agent) => allowed(&principal, agent, Capability::Read)?,
                None => principal.authorize_all(Capability::Read)?,
            }
            let page = self
                .gate
                .list_unresolved(agent, &req.page_token, req.page_size)
                .await?;
            Ok(pb::ListUnresolvedResponse {
                actions: page.items.iter().map(unresolved_action).collect(),
                next_page_token: page.next.map(|c| c.encode()).unwrap_or_default(),
            })
        })
        .await
    }

    async fn export_receipts(
        &self,
        request: Request<pb::ExportReceiptsRequest>,
    ) -> Result<Response<pb::ExportReceiptsResponse>, Status> {
        answer(async move {
            let principal = auth::principal(&request)?;
            let req = request.into_inner();
            allowed(&principal, &req.agent_id, Capability::Read)?;
            let page = self
                .gate
                .receipt_chain(&req.agent_id, req.after_seq, req.page_size)
                .await?;
            Ok(pb::ExportReceiptsResponse {
                next_after_seq: page.next_after,
                jwks: page.jwks,
                entries: page.entries.into_iter().map(receipt_entry).collect(),
            })
        })
        .await
    }

    async fn decide_approval(
        &self,
        request: Request<pb::DecideApprovalRequest>,
    ) -> Result<Response<pb::DecideApprovalResponse>, Status> {
        answer(async move {
            let principal = auth::principal(&request)?;
            let req = request.into_inner();
            let key = action_key(req.action)?;
            allowed(&principal, &key.agent_id, Capability::Approve)?;
            let decision = Decision {
                id: req.approval_id,
                approve: req.approve,
                operator: principal.name.clone(),
                note: req.note,
            };
            let approval = self.gate.decide_approval(&key, decision).await?;
            Ok(pb::DecideApprovalResponse {
                approval: Some(approval_entry(&key, approval)),
            })
        })
        .await
    }

    async fn list_approvals(
        &self,
        request: Request<pb::ListApprovalsRequest>,
    ) -> Result<Response<pb::ListApprovalsResponse>, Status> {
        answer(async move {
            let principal = auth::principal(&request)?;
            let req = request.into_inner();
            allowed(&principal, &req.agent_id, Capability::Approve)?;
            let page = self
                .gate
                .list_approvals(&req.agent_id, &req.page_token, req.page_size)
                .await?;
            Ok(pb::ListApprovalsResponse {
                approvals: page
                    .items
                    .into_iter()
                    .map(|e| approval_entry(&e.key, e.approval))
                    .collect(),
                next_page_token: page.next.map(|c| c.encode()).unwrap_or_default(),
            })
        })
        .await
    }

    async fn get_budgets(
        &self,
        request: Request<pb::GetBudgetsRequest>,
    ) -> Result<Response<pb::GetBudgetsResponse>, Status> {
        answer(async move {
            let principal = auth::principal(&request)?;
            let req = request.into_inner();
            allowed(&principal, &req.agent_id, Capability::Read)?;
            let usage = self.gate.budgets(&req.agent_id).await?;
            Ok(pb::GetBudgetsResponse {
                budgets: usage
                    .into_iter()
                    .map(|u| pb::BudgetUsage {
                        budget: u.budget,
                        action_name: u.action,
                        group: u.group,
                        used: u.used,
                        limit: u.limit,
                        window: Some(duration(u.window)),
                        next_release_at: u.next_release_at.map(timestamp),
                    })
                    .collect(),
            })
        })
        .await
    }

    async fn list_undeliverable_events(
        &self,
        request: Request<pb::ListUndeliverableEventsRequest>,
    ) -> Result<Response<pb::ListUndeliverableEventsResponse>, Status> {
        answer(async move {
            let principal = auth::principal(&request)?;
            let req = request.into_inner();
            telemetry::record_principal(&principal.name);
            principal.authorize_all(Capability::Read)?;
            let page = self
                .gate
                .undeliverable_events(&req.page_token, req.page_size)
                .await?;
            Ok(pb::ListUndeliverableEventsResponse {
                events: page
                    .items
                    .into_iter()
                    .map(|e| pb::UndeliverableEvent {
                        id: e.id,
                        webhook: e.webhook,
                        event_type: e.event_type,
                        attempts: e.attempts,
                        last_error: e.last_error,
                        created_at: Some(timestamp(e.created_at)),
                        given_up_at: Some(timestamp(e.settled_at)),
                        body: e.body,
                    })
                    .collect(),
                next_page_token: page.next.map(|c| c.encode()).unwrap_or_default(),
                pending: page.pending,
                undeliverable: page.undeliverable,
            })
        })
        .await
    }

    async fn create_console_login(
        &self,
        request: Request<pb::CreateConsoleLoginRequest>,
    ) -> Result<Response<pb::CreateConsoleLoginResponse>, Status> {
        answer(async move {
            let principal = auth::principal(&request)?;
            telemetry::record_principal(&principal.name);
            principal.authorize_role(Capability::Approve)?;
            let Some(logins) = &self.console_logins else {
                return Err(GateError::invalid(
                    "console",
                    "this gate serves no console: start it with --console-listen",
                ));
            };
            let issued = logins
                .issue(principal.clone())
                .map_err(|what| {
                    GateError::Store(oncegate_store::StoreError::Unavailable { what, source: None })
                })?;
            telemetry::record_decision("console_login_issued");
            tracing::info!(target: oncegate_observe::telemetry::AUDIT, decision = "console_login_issued",
                principal = %principal.name, "create_console_login");
            Ok(pb::CreateConsoleLoginResponse {
                code: issued.code,
                expires_in: Some(duration(issued.ttl.as_millis() as Millis)),
                principal: principal.name.clone(),
            })
        })
        .await
    }
}
