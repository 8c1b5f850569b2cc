//! Approvals asked in the chat: when the gate holds a gated call for approval and the MCP client
//! declared the elicitation capability, the person in the session is asked (`elicitation/create`:
//! tool, arguments as sent, policy, reason). Accepted → the gateway approves as its own approver
//! principal, with the person's answer in the note; declined or cancelled → it denies, and nothing
//! runs. A client without elicitation, a gateway that cannot decide approvals (a gate server and
//! no `--approver-api-key`), or a question left unanswered gets the held answer: the approval id.

use std::time::{Duration, SystemTime};

use rmcp::{
    RoleServer,
    model::{ElicitRequestParams, ElicitationAction, ElicitationSchema},
    service::{Peer, RequestContext},
};
use serde_json::json;
use tonic::{metadata::MetadataValue, transport::Channel};

use oncegate_domain::{ActionKey, ledger::approval::Decision};
use oncegate_gate::Gate;
use oncegate_observe::telemetry::AUDIT;
use oncegate_proto::{self as pb, gate_admin_service_client::GateAdminServiceClient};

/// The principal the in-process gate records as the decider.
pub const GATEWAY_APPROVER: &str = "oncegate-mcp";

/// The longest a held call waits for the person's answer (the approval may lapse sooner).
const LONGEST_QUESTION: Duration = Duration::from_secs(15 * 60);

/// How the gateway decides approvals.
#[derive(Clone)]
pub enum Approver {
    /// The in-process gate, as [`GATEWAY_APPROVER`].
    Local(Gate),
    /// A gate server's GateAdminService, as the principal of `--approver-api-key`.
    Remote {
        admin: GateAdminServiceClient<Channel>,
        key: MetadataValue<tonic::metadata::Ascii>,
    },
}

/// What the person answered.
#[derive(Debug)]
pub enum Answer {
    /// Accepted, with their note (may be empty).
    Approved(String),
    /// Declined or cancelled (which of the two), with their note.
    Refused(&'static str, String),
}

/// The question for one held call.
pub struct Held<'a> {
    pub tool: &'a str,
    /// The arguments exactly as the client sent them.
    pub arguments: &'a str,
    pub approval: &'a pb::Approval,
    pub key: &'a ActionKey,
}

/// Whether the session's client can be asked.
pub fn can_ask(context: &RequestContext<RoleServer>) -> bool {
    context
        .peer
        .peer_info()
        .is_some_and(|info| info.capabilities.elicitation.is_some())
}

impl Held<'_> {
    /// Asks the person; `None` when no answer came (the client failed, or did not answer in
    /// time), so the held answer stands.
    pub async fn ask(&self, peer: &Peer<RoleServer>) -> Option<Answer> {
        let approval = self.approval;
        let message = format!(
            "The gate holds the tool call `{}` for approval.\n\nArguments: {}\nPolicy: {}\n\
             Reason: {}\n\nAccept to run it once; decline to refuse it (nothing runs).",
            self.tool,
            self.arguments,
            if approval.policy_id.is_empty() {
                "(none named)"
            } else {
                &approval.policy_id
            },
            if approval.reason.is_empty() {
                "(none given)"
            } else {
                &approval.reason
            },
        );
        let schema = ElicitationSchema::from_json_schema(
            json!({
                "type": "object",
                "properties": {
                    "note": {
                        "type": "string",
                        "title": "Note",
                        "description": "Why (kept with the decision in the audit log)",
                        "maxLength": 512,
                    },
                },
            })
            .as_object()
            .cloned()
            .unwrap_or_default(),
        )
        .ok()?;
        let params = ElicitRequestParams::FormElicitationParams {
            meta: None,
            message,
            requested_schema: schema,
        };
        let asked = peer
            .create_elicitation_with_timeout(params, Some(self.time_to_answer()))
            .await;
        let answer = match asked {
            Ok(result) => {
                let note = result
                    .content
                    .as_ref()
                    .and_then(|c| c.get("note"))
                    .and_then(|n| n.as_str())
                    .unwrap_or_default()
                    .chars()
                    .take(512)
                    .collect::<String>();
                match result.action {
                    ElicitationAction::Accept => Answer::Approved(note),
                    ElicitationAction::Decline => Answer::Refused("declined", note),
                    // Cancelled, or an answer this gateway does not know: not an approval.
                    _ => Answer::Refused("cancelled", note),
                }
            }
            Err(error) => {
                tracing::warn!(tool = self.tool, approval_id = %approval.id, %error,
                    "could not ask the MCP client to approve the held call; it stays pending");
                return None;
            }
        };
        let (said, note) = match &answer {
            Answer::Approved(note) => ("accepted", note),
            Answer::Refused(how, note) => (*how, note),
        };
        tracing::info!(target: AUDIT, agent_id = %self.key.agent_id, run_id = %self.key.run_id,
            key = %self.key.key, tool = self.tool, approval_id = %approval.id,
            decision = "mcp_approval_answered", answer = said, note = %note, "tools/call");
        Some(answer)
    }

    /// Until the approval lapses, at most [`LONGEST_QUESTION`].
    fn time_to_answer(&self) -> Duration {
        let lapses = self
            .approval
            .expires_at
            .and_then(|at| SystemTime::try_from(at).ok())
            .and_then(|at| at.duration_since(SystemTime::now()).ok());
        lapses.map_or(LONGEST_QUESTION, |left| left.min(LONGEST_QUESTION))
    }

    /// The note the gate keeps with the decision: who answered where, and what they wrote.
    fn note(&self, answer: &Answer) -> String {
        let (said, note) = match answer {
            Answer::Approved(note) => ("accepted", note),
            Answer::Refused(how, note) => (*how, note),
        };
        let mut text = format!("{said} by the user in the MCP session (tool {})", self.tool);
        if !note.is_empty() {
            text.push_str(": ");
            text.push_str(note);
        }
        text
    }
}

impl Approver {
    /// Records the person's answer at the gate; the error says why it could not.
    pub async fn decide(&self, held: &Held<'_>, answer: &Answer) -> Result<(), String> {
        let approve = matches!(answer, Answer::Approved(_));
        let note = held.note(answer);
        match self {
            Self::Local(gate) => {
                let decision = Decision {
                    id: held.approval.id.clone(),
                    approve,
                    operator: GATEWAY_APPROVER.to_owned(),
                    note,
                };
                gate.decide_approval(held.key, decision)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            }
            Self::Remote { admin, key } => {
                let mut request = tonic::Request::new(pb::DecideApprovalRequest {
                    action: Some(pb::ActionRef {
                        scope: Some(pb::Scope {
                            agent_id: held.key.agent_id.clone(),
                            run_id: held.key.run_id.clone(),
                        }),
                        key: held.key.key.clone(),
                    }),
                    approval_id: held.approval.id.clone(),
                    approve,
                    note,
                });
                request.metadata_mut().insert("authorization", key.clone());
                admin
                    .clone()
                    .decide_approval(request)
                    .await
                    .map(drop)
                    .map_err(|status| format!("{}: {}", status.code(), status.message()))
            }
        }
    }
}
