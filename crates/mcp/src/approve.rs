//! Approvals asked in the chat: when the gate holds a gated call for approval and the MCP client
//! declared the elicitation capability, the person in the session is asked (`elicitation/create`:
//! tool, arguments as sent, policy, reason). Accepted → the gateway approves as its own approver
//! principal, with the person's answer in the note; declined or cancelled → it denies, and nothing
//! runs. A client without elicitation, a gateway that cannot decide approvals (a gate server and
//! no `--approver-api-key`), or a question left unanswered gets the held answer: the approval id.
//!
//! How the question travels depends on the client's protocol revision. In a session (up to
//! 2025-11-25) the gateway sends `elicitation/create` and waits ([`Held::ask`]). A stateless client
//! (2026-07-28) takes no requests from servers: the call is answered with an input request
//! ([`Held::input_required`]: the same question, under [`INPUT_KEY`], the approval id in
//! `requestState`), and the client calls again with the person's answer in `inputResponses`
//! ([`take_answer`]), on whichever gateway replica it reaches. The answer counts only for the
//! approval the gate still holds for that call (the state names it); the gate decides as above.

use std::time::{Duration, SystemTime};

use rmcp::{
    RoleServer,
    model::{
        CallToolRequestParams, ElicitRequest, ElicitRequestParams, ElicitResult, ElicitationAction,
        ElicitationSchema, InputRequest, InputRequests, InputRequiredResult, Request,
    },
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

/// The key of the approval question among a call's input requests (and of its answer).
pub const INPUT_KEY: &str = "oncegate/approval";

/// What the gateway's `requestState` holds before the approval id.
const STATE_PREFIX: &str = "oncegate/approval:";

/// Whether the session's client can be asked.
pub fn can_ask(context: &RequestContext<RoleServer>) -> bool {
    context
        .peer
        .peer_info()
        .is_some_and(|info| info.capabilities.elicitation.is_some())
}

/// Whether the request is of the stateless revision (its `_meta` names a version without the
/// handshake), and so can only be asked through an input request.
pub fn stateless(context: &RequestContext<RoleServer>) -> bool {
    context
        .meta
        .protocol_version()
        .is_some_and(|version| !version.has_initialize())
}

/// Whether a stateless request's client declared elicitation (in the request's own `_meta`).
pub fn can_ask_inline(context: &RequestContext<RoleServer>) -> bool {
    context
        .meta
        .client_capabilities()
        .is_some_and(|capabilities| capabilities.elicitation.is_some())
}

/// The person's answer a stateless client sent again with the call: the approval id its state
/// names and the answer as sent. Both are removed from `params`, which go upstream.
pub fn take_answer(params: &mut CallToolRequestParams) -> Option<(String, serde_json::Value)> {
    let id = params
        .request_state
        .as_deref()
        .and_then(|state| state.strip_prefix(STATE_PREFIX))?
        .to_owned();
    params.request_state = None;
    let answer = params
        .input_responses
        .as_mut()
        .and_then(|responses| responses.remove(INPUT_KEY));
    if params
        .input_responses
        .as_ref()
        .is_some_and(|responses| responses.is_empty())
    {
        params.input_responses = None;
    }
    answer.map(|answer| (id, answer))
}

impl Held<'_> {
    /// Asks the person; `None` when no answer came (the client failed, or did not answer in
    /// time), so the held answer stands.
    pub async fn ask(&self, peer: &Peer<RoleServer>) -> Option<Answer> {
        let params = self.question()?;
        let asked = peer
            .create_elicitation_with_timeout(params, Some(self.time_to_answer()))
            .await;
        match asked {
            Ok(result) => Some(self.answered(result)),
            Err(error) => {
                tracing::warn!(tool = self.tool, approval_id = %self.approval.id, %error,
                    "could not ask the MCP client to approve the held call; it stays pending");
                None
            }
        }
    }

    /// The question as an input request, for a stateless client to ask and call again with.
    pub fn input_required(&self) -> Option<InputRequiredResult> {
        let question: ElicitRequest = Request::new(self.question()?);
        let requests =
            InputRequests::from([(INPUT_KEY.to_owned(), InputRequest::Elicitation(question))]);
        Some(InputRequiredResult::new(
            Some(requests),
            Some(format!("{STATE_PREFIX}{}", self.approval.id)),
        ))
    }

    /// The person's answer a stateless client sent again (as [`take_answer`] found it), when it
    /// answers the approval the gate holds now; `None` when it answers another (asked again).
    pub fn answer_in(&self, sent: Option<&(String, serde_json::Value)>) -> Option<Answer> {
        let (id, answer) = sent?;
        if *id != self.approval.id {
            return None;
        }
        match serde_json::from_value::<ElicitResult>(answer.clone()) {
            Ok(result) => Some(self.answered(result)),
            // Not an elicitation result: as a question left unanswered, never as an approval.
            Err(error) => {
                tracing::warn!(tool = self.tool, approval_id = %self.approval.id, %error,
                    "the MCP client's answer to the approval question could not be read");
                Some(self.answered(ElicitResult::new(ElicitationAction::Cancel)))
            }
        }
    }

    /// The question: the tool, the arguments as sent, the policy and its reason, and a note.
    fn question(&self) -> Option<ElicitRequestParams> {
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
        Some(ElicitRequestParams::FormElicitationParams {
            meta: None,
            message,
            requested_schema: schema,
        })
    }

    /// What the person answered, audited.
    fn answered(&self, result: ElicitResult) -> Answer {
        let approval = self.approval;
        let answer = {
            {
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
        };
        let (said, note) = match &answer {
            Answer::Approved(note) => ("accepted", note),
            Answer::Refused(how, note) => (*how, note),
        };
        tracing::info!(target: AUDIT, agent_id = %self.key.agent_id, run_id = %self.key.run_id,
            key = %self.key.key, tool = self.tool, approval_id = %approval.id,
            decision = "mcp_approval_answered", answer = said, note = %note, "tools/call");
        answer
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
