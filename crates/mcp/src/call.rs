//! `tools/call` through the gate. A tool that is not gated (read-only by its annotations, passed
//! through by the file, or unknown to the upstream) is forwarded unchanged. A gated one runs under
//! the client crate's guard ([`run_once_on`], over [`super::gate`]), with the arguments as the
//! client sent them ([`super::sent`]): a grant forwards the call while the guard's heartbeat
//! extends the lease and records the upstream's `CallToolResult` as the receipt; a completed
//! action replays its receipt without calling upstream; a refusal becomes a tool error the model
//! can act on ([`super::answers`]). The gateway's choices are the guard's hooks: it waits for
//! another attempt whatever its lease, fails at once when the gate cannot be reached, releases a
//! call the upstream refused as not attempted, and records a note for a result too large to keep.
//! After a grant:
//!
//! | upstream answer | gate | the model gets |
//! | --- | --- | --- |
//! | a result | Complete (the result is the receipt) | the result |
//! | a result with `isError: true` | Complete (default), or Release with `on_error = "release"` | the result |
//! | JSON-RPC error -32700/-32600/-32601/-32602 (the tool never ran) | Release (not attempted) | the error, unchanged |
//! | any other JSON-RPC error, a broken connection, a timeout, a cancellation | nothing: the lease is kept | a tool error: outcome unknown, reconcile first |
//!
//! A retry of an action whose outcome this gateway lost is answered at once with that unknown
//! outcome ([`super::unknown`]), not after waiting out a lease nobody will complete.

use std::time::Duration;

use rmcp::{
    ErrorData as McpError, RoleServer,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ResultType,
        ServerResult,
    },
    service::{RequestContext, ServiceError},
};

use super::{
    Shared, answers, approve, identity,
    refusal::{action_key, reference_key, refusal},
    sent,
    session::{self, Origin, Session, passthrough_error},
    unknown::Lost,
};
use oncegate_client::{
    ActionSpec, Failure, Grant, GuardError, GuardHooks, GuardOptions, Outcome, run_once_on,
};
use oncegate_config::mcp::{OnToolError, ToolRule};
use oncegate_domain::ActionKey;
use oncegate_observe::telemetry::AUDIT;
use oncegate_proto as pb;

/// JSON-RPC errors that say the request was refused before the tool ran.
const NOT_RUN: [i32; 4] = [-32700, -32600, -32601, -32602];

/// Handles one `tools/call` of the downstream client.
pub async fn call_tool(
    session: &Session,
    params: CallToolRequestParams,
    context: RequestContext<RoleServer>,
) -> Result<CallToolResponse, McpError> {
    let rule = session.shared.settings.rule(&params.name);
    let gated = match rule.gate {
        Some(gate) => gate,
        // Unknown to the upstream: not gated, so the upstream answers with its own error.
        None => session
            .read_only(&params.name, &context.ct)
            .await?
            .is_some_and(|read_only| !read_only),
    };
    let sent = sent::of(&context, &params.name);
    if !gated {
        if sent.as_ref().is_some_and(|sent| !sent.forwardable) {
            return Err(unforwardable());
        }
        // Not retried on a dead connection: the tool may have run.
        let answer = session
            .forward(Session::call_request(params), Origin::of(&context), None)
            .await
            .map_err(passthrough_error)?;
        return response(answer);
    }
    let mut answer = gated_call(session, &rule, params, sent, &context).await?;
    if let CallToolResponse::Complete(result) = &mut answer
        && session::stateless_request(&context.meta)
    {
        // A recorded result of an upstream of a handshake revision, or the gate's own answer.
        result.result_type.get_or_insert(ResultType::COMPLETE);
    }
    Ok(answer)
}

fn response(answer: ServerResult) -> Result<CallToolResponse, McpError> {
    match answer {
        ServerResult::CallToolResult(result) => Ok(CallToolResponse::Complete(result)),
        ServerResult::InputRequiredResult(more) => Ok(CallToolResponse::InputRequired(more)),
        ServerResult::CreateTaskResult(task) => Ok(CallToolResponse::Task(task)),
        other => Err(McpError::internal_error(
            format!("tools/call: the upstream answered with {other:?}"),
            None,
        )),
    }
}

/// How a forwarded call ended, other than with a result to record.
#[derive(Debug)]
enum Upstream {
    /// `isError: true` from a tool whose errors are definite failures (`on_error = "release"`).
    ToolError(Box<CallToolResult>),
    /// A JSON-RPC error saying the tool never ran.
    Refused(Box<McpError>),
    /// Anything else: what happened. The outcome is unknown.
    Unknown(String),
}

impl Upstream {
    /// The guard's release reason for a definite failure.
    fn release_reason(&self) -> pb::ReleaseReason {
        match self {
            Self::Refused(_) => pb::ReleaseReason::NotAttempted,
            _ => pb::ReleaseReason::DefiniteFailure,
        }
    }
}

/// Arguments rmcp could not read cannot be forwarded as sent.
fn unforwardable() -> McpError {
    McpError::invalid_params(
        "tools/call: the arguments must be a JSON object whose numbers a double can hold; \
         nothing was forwarded",
        None,
    )
}

async fn gated_call(
    session: &Session,
    rule: &ToolRule,
    mut params: CallToolRequestParams,
    sent: Option<sent::Sent>,
    context: &RequestContext<RoleServer>,
) -> Result<CallToolResponse, McpError> {
    let shared = &session.shared;
    // The person's answer to the gateway's own question is not the upstream's to see.
    let answered = approve::take_answer(&mut params);
    let who = match identity::identify(&context.meta, &shared.identity, &session.default_run()) {
        Ok(who) => who,
        Err(message) => return complete(answers::refused("INVALID_REQUEST", &message)),
    };
    let Some(sent) = sent else {
        return complete(answers::refused(
            "INVALID_REQUEST",
            "the gateway could not read this call's arguments exactly as sent (is a member of \
             the request given twice?); nothing was forwarded",
        ));
    };
    let mut spec = ActionSpec::new(&who.agent_id, &who.run_id, &rule.action, &sent.text)
        .holder(&format!("oncegate-mcp-{}", uuid::Uuid::new_v4().simple()));
    spec.idempotency_key = who.idempotency_key;
    let key = reference_key(shared, &spec);
    let lost = shared.unknowns.get(&key);
    let options = GuardOptions {
        // An attempt this gateway lost will not complete: ask once, then say so.
        max_wait: if lost.is_some() {
            Duration::ZERO
        } else {
            shared.in_progress_wait
        },
        poll_interval: Duration::from_millis(250),
        ..GuardOptions::default()
    };
    let hooks = GuardHooks::new()
        .wait_whatever_the_lease()
        .fail_at_once_when_unavailable()
        .release_reason(Upstream::release_reason)
        .replace_oversized_receipt(oversized_note);
    let mut result = None;
    let call = Forward {
        session,
        rule,
        params: &params,
        forwardable: sent.forwardable,
        context,
    };
    let mut outcome = run_once_on(&shared.gate, &spec, &options, &hooks, |grant| {
        call.run(grant, &mut result)
    })
    .await;
    if let Err(GuardError::PendingApproval { approval }) = &outcome
        && let Some(approver) = &shared.approver
    {
        let approval = approval.clone();
        let held = approve::Held {
            tool: &params.name,
            arguments: &sent.text,
            approval: &approval,
            key: &key,
        };
        let answer = if approve::stateless(context) {
            match held.answer_in(answered.as_ref()) {
                Some(answer) => Some(answer),
                None if approve::can_ask_inline(context) => {
                    if let Some(question) = held.input_required() {
                        return Ok(CallToolResponse::InputRequired(question));
                    }
                    None
                }
                None => None,
            }
        } else if approve::can_ask(context) {
            held.ask(&context.peer).await
        } else {
            None
        };
        if let Some(answer) = answer {
            if let Err(why) = approver.decide(&held, &answer).await {
                tracing::warn!(tool = %params.name, approval_id = %approval.id, error = %why,
                    "the person answered, but the gate did not take the decision");
                return complete(answers::refused(
                    "REFUSED",
                    &format!(
                        "the user's answer to approval {} could not be recorded ({why}); the call is \
                         still pending approval",
                        approval.id
                    ),
                ));
            }
            match answer {
                approve::Answer::Approved(_) => {
                    outcome = run_once_on(&shared.gate, &spec, &options, &hooks, |grant| {
                        call.run(grant, &mut result)
                    })
                    .await;
                }
                approve::Answer::Refused(how, _) => {
                    return complete(answers::approval_refused(how, &approval.id));
                }
            }
        }
    }
    let seen = Seen {
        shared,
        tool: params.name.as_ref(),
        key,
        lost,
    };
    seen.answer(outcome, result).map(CallToolResponse::Complete)
}

fn complete(result: CallToolResult) -> Result<CallToolResponse, McpError> {
    Ok(CallToolResponse::Complete(result))
}

/// What the gateway knows of one gated call once the guard is done with it.
struct Seen<'a> {
    shared: &'a Shared,
    tool: &'a str,
    /// The action key as the gateway computes it.
    key: ActionKey,
    /// The attempt at it this gateway lost earlier, if any.
    lost: Option<Lost>,
}

impl Seen<'_> {
    /// What the model gets for the guard's outcome; `result` is the upstream's, when it ran.
    fn answer(
        self,
        outcome: Result<Outcome, GuardError<Upstream>>,
        result: Option<CallToolResult>,
    ) -> Result<CallToolResult, McpError> {
        let Self {
            shared,
            tool,
            key,
            lost,
        } = self;
        match outcome {
            Ok(Outcome::Executed { .. }) => {
                shared.unknowns.forget(&key);
                executed(result)
            }
            Ok(Outcome::Replayed(done)) => {
                shared.unknowns.forget(&key);
                Ok(answers::replay(&done))
            }
            Err(GuardError::Failed(cause)) => definite(cause),
            Err(GuardError::ReleaseFailed { cause, release, .. }) => {
                tracing::warn!(error = %release, tool,
                    "Release after a definite failure failed; the lease will expire");
                definite(cause)
            }
            Err(GuardError::OutcomeUnknown { cause, grant }) => {
                let why = match cause {
                    Upstream::Unknown(why) => why,
                    other => format!("{other:?}"),
                };
                Ok(unknown(shared, tool, &grant, why))
            }
            Err(GuardError::CompleteUnacknowledged { error, grant, .. }) => {
                tracing::error!(%error, key = %grant.action.key, tool,
                    "the tool ran but Complete was not acknowledged; the lease will expire unresolved");
                executed(result)
            }
            // The model relays this to a person: what to run to approve it (the in-process
            // gate serves its admin socket; a gate server's operator runs it against that gate).
            Err(GuardError::PendingApproval { approval }) => Ok(answers::refused(
                "REFUSED",
                &format!(
                    "pending approval {} ({}): an operator must approve this call (`oncegate \
                     admin approve --agent {} --run {} --key {} --id {}`, or the operator \
                     console), then call it again with the same arguments: it runs once",
                    approval.id, approval.reason, key.agent_id, key.run_id, key.key, approval.id
                ),
            )),
            Err(GuardError::InProgressBeyondWait { .. }) => {
                Ok(answers::in_progress(shared.in_progress_wait, &key))
            }
            Err(GuardError::Gate(error)) => Ok(refusal(shared, tool, error, lost, &key)),
        }
    }
}

/// A granted call to forward upstream.
struct Forward<'a> {
    session: &'a Session,
    rule: &'a ToolRule,
    params: &'a CallToolRequestParams,
    /// False when rmcp could not read the arguments as sent.
    forwardable: bool,
    context: &'a RequestContext<RoleServer>,
}

impl Forward<'_> {
    /// Forwards the call (the guard's closure): a result to record (kept in `result` for the
    /// model), or how it failed.
    async fn run(
        &self,
        grant: Grant,
        result: &mut Option<CallToolResult>,
    ) -> Result<Vec<u8>, Failure<Upstream>> {
        let Self {
            session,
            rule,
            params,
            forwardable,
            context,
        } = *self;
        let shared = &session.shared;
        if !forwardable {
            // The gate refuses what rmcp cannot read; should it not, the upstream still never
            // gets arguments other than those sent.
            return Err(Failure::Definite(Upstream::Refused(Box::new(
                unforwardable(),
            ))));
        }
        let key = action_key(&grant.action);
        tracing::info!(target: AUDIT, agent_id = %key.agent_id, run_id = %key.run_id,
            action = %rule.action, key = %key.key, tool = %params.name, fencing = grant.fencing,
            decision = "mcp_forwarded", "tools/call");
        let answer = session
            .forward(
                Session::call_request(params.clone()),
                Origin::of(context),
                Some(shared.call_timeout),
            )
            .await;
        let unknown = |why: String| Err(Failure::Ambiguous(Upstream::Unknown(why)));
        match answer {
            Ok(ServerResult::CallToolResult(done)) => {
                if done.is_error == Some(true) && rule.on_error == OnToolError::Release {
                    return Err(Failure::Definite(Upstream::ToolError(Box::new(done))));
                }
                let receipt = serde_json::to_vec(&done).unwrap_or_default();
                *result = Some(done);
                Ok(receipt)
            }
            Ok(other) => unknown(format!(
                "the upstream answered with something other than a tool result ({})",
                variant_name(&other)
            )),
            Err(ServiceError::McpError(error)) if NOT_RUN.contains(&error.code.0) => {
                Err(Failure::Definite(Upstream::Refused(Box::new(error))))
            }
            Err(ServiceError::McpError(error)) => unknown(format!(
                "the upstream answered with JSON-RPC error {}: {}",
                error.code.0, error.message
            )),
            Err(ServiceError::Timeout { timeout }) => unknown(format!(
                "the upstream MCP server did not answer within {} s",
                timeout.as_secs()
            )),
            Err(ServiceError::Cancelled { .. }) => {
                unknown("the call was cancelled while the tool ran".into())
            }
            Err(other) => unknown(format!(
                "the connection to the upstream MCP server failed during the call: {other}"
            )),
        }
    }
}

/// The upstream's result the guard recorded.
fn executed(result: Option<CallToolResult>) -> Result<CallToolResult, McpError> {
    result.ok_or_else(|| McpError::internal_error("the recorded tool result went missing", None))
}

/// A definite failure, its token released: what the upstream said, unchanged.
fn definite(cause: Upstream) -> Result<CallToolResult, McpError> {
    match cause {
        Upstream::ToolError(result) => Ok(*result),
        Upstream::Refused(error) => Err(*error),
        Upstream::Unknown(why) => Err(McpError::internal_error(why, None)),
    }
}

/// What Complete records when the gate refuses the result as too large to keep.
fn oversized_note(receipt: &[u8]) -> Vec<u8> {
    let note = CallToolResult::success(vec![ContentBlock::text(format!(
        "This action was performed once; its result ({} bytes) was larger than the gate keeps, \
         so it cannot be shown again.",
        receipt.len()
    ))]);
    serde_json::to_vec(&note).unwrap_or_default()
}

/// The outcome is unknown: the lease is kept (the guard did not release it); remember, count,
/// audit, tell the model.
fn unknown(shared: &Shared, tool: &str, grant: &Grant, why: String) -> CallToolResult {
    let key = action_key(&grant.action);
    tracing::warn!(target: AUDIT, agent_id = %key.agent_id, run_id = %key.run_id,
        key = %key.key, tool, fencing = grant.fencing, decision = "mcp_outcome_unknown",
        why, "tools/call");
    shared.metrics.outcome_unknown();
    let answer = answers::outcome_unknown(&why, &key);
    shared.unknowns.remember(
        key,
        Lost {
            fencing: grant.fencing,
            why,
        },
    );
    answer
}

fn variant_name(answer: &ServerResult) -> &'static str {
    match answer {
        ServerResult::InputRequiredResult(_) => "input required",
        ServerResult::CreateTaskResult(_) => "a task",
        _ => "another result",
    }
}
