//! `tools/call` through the gate. A tool that is not gated (read-only by its annotations, passed
//! through by the file, or unknown to the upstream) is forwarded unchanged. A gated one asks the
//! gate first: a grant forwards the call while a heartbeat extends the lease and records the
//! upstream's `CallToolResult` as the receipt; a completed action replays its receipt without
//! calling upstream; a refusal becomes a tool error the model can act on. After a grant:
//!
//! | upstream answer | gate | the model gets |
//! | --- | --- | --- |
//! | a result | Complete (the result is the receipt) | the result |
//! | a result with `isError: true` | Complete (default), or Release with `on_error = "release"` | the result |
//! | JSON-RPC error -32700/-32600/-32601/-32602 (the tool never ran) | Release (not attempted) | the error, unchanged |
//! | any other JSON-RPC error, a broken connection, a timeout, a cancellation | nothing: the lease is kept | a tool error: outcome unknown, reconcile first |

use std::time::{Duration, Instant};

use rmcp::{
    ErrorData as McpError, RoleServer,
    model::{CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ServerResult},
    service::{RequestContext, ServiceError},
};

use super::{
    answers,
    gate::{Answer, Ask, GateLink, Refused, Ticket},
    identity,
    session::{Session, passthrough_error},
};
use oncegate_config::mcp::{OnToolError, ToolRule};
use oncegate_domain::ActionKey;
use oncegate_gate::request::prepare_token;
use oncegate_observe::telemetry::AUDIT;

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
    if !gated {
        // Not retried on a dead connection: the tool may have run.
        let answer = session
            .forward(
                Session::call_request(params),
                &context.meta,
                &context.ct,
                None,
            )
            .await
            .map_err(passthrough_error)?;
        return response(answer);
    }
    gated_call(session, &rule, params, &context)
        .await
        .map(CallToolResponse::Complete)
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

async fn gated_call(
    session: &Session,
    rule: &ToolRule,
    params: CallToolRequestParams,
    context: &RequestContext<RoleServer>,
) -> Result<CallToolResult, McpError> {
    let shared = &session.shared;
    let who = match identity::identify(&context.meta, &shared.identity, &session.id) {
        Ok(who) => who,
        Err(message) => return Ok(answers::refused("INVALID_REQUEST", &message)),
    };
    let arguments = params.arguments.clone().unwrap_or_default();
    let ask = Ask {
        agent_id: who.agent_id,
        run_id: who.run_id,
        action: rule.action.clone(),
        params_json: serde_json::Value::Object(arguments).to_string(),
        idempotency_key: who.idempotency_key,
        holder: format!("oncegate-mcp-{}", uuid::Uuid::new_v4().simple()),
    };
    let key = reference_key(shared, &ask);
    let wait = shared.in_progress_wait;
    let ticket = match acquire(&shared.gate, &ask, wait).await {
        Ok(Answer::Granted(ticket)) => ticket,
        Ok(Answer::Completed(recorded)) => return Ok(answers::replay(&recorded)),
        Err(refused) => return Ok(refusal(refused, wait, &key)),
    };
    tracing::info!(target: AUDIT, agent_id = %ask.agent_id, run_id = %ask.run_id, action = %ask.action,
        key = %ticket.key.key, tool = %params.name, fencing = ticket.fencing, decision = "mcp_forwarded",
        "tools/call");
    let heartbeat = heartbeat(shared.gate.clone(), ticket.clone());
    let answer = session
        .forward(
            Session::call_request(params.clone()),
            &context.meta,
            &context.ct,
            Some(shared.call_timeout),
        )
        .await;
    heartbeat.abort();
    match answer {
        Ok(ServerResult::CallToolResult(result)) => {
            if result.is_error == Some(true) && rule.on_error == OnToolError::Release {
                if let Err(e) = shared.gate.release(&ticket, true).await {
                    tracing::warn!(?e, tool = %params.name, "release after a tool error failed; the lease will expire");
                }
                return Ok(result);
            }
            complete(&shared.gate, &ticket, &result).await;
            Ok(result)
        }
        Ok(other) => Ok(unknown(
            &params.name,
            &ticket,
            &format!(
                "the upstream answered with something other than a tool result ({})",
                variant_name(&other)
            ),
        )),
        Err(ServiceError::McpError(error)) if NOT_RUN.contains(&error.code.0) => {
            if let Err(e) = shared.gate.release(&ticket, false).await {
                tracing::warn!(?e, tool = %params.name, "release after an upstream refusal failed");
            }
            Err(error)
        }
        Err(ServiceError::McpError(error)) => Ok(unknown(
            &params.name,
            &ticket,
            &format!(
                "the upstream answered with JSON-RPC error {}: {}",
                error.code.0, error.message
            ),
        )),
        Err(ServiceError::Timeout { timeout }) => Ok(unknown(
            &params.name,
            &ticket,
            &format!(
                "the upstream MCP server did not answer within {} s",
                timeout.as_secs()
            ),
        )),
        Err(ServiceError::Cancelled { .. }) => Ok(unknown(
            &params.name,
            &ticket,
            "the call was cancelled while the tool ran",
        )),
        Err(other) => Ok(unknown(
            &params.name,
            &ticket,
            &format!("the connection to the upstream MCP server failed during the call: {other}"),
        )),
    }
}

/// RequestToken, waiting within `wait` while another attempt holds the lease (or the gate is
/// briefly unavailable: the holder makes asking again safe).
async fn acquire(gate: &GateLink, ask: &Ask, wait: Duration) -> Result<Answer, Refused> {
    let deadline = Instant::now() + wait;
    let mut backoff = Duration::from_millis(50);
    loop {
        let refused = match gate.request_token(ask).await {
            Ok(answer) => return Ok(answer),
            Err(refused) => refused,
        };
        let delay = match &refused {
            Refused::InProgress(left) => (*left).min(Duration::from_millis(250)),
            Refused::Unavailable(_) => {
                backoff = (backoff * 2).min(Duration::from_secs(1));
                backoff
            }
            _ => return Err(refused),
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(refused);
        }
        tokio::time::sleep(delay.clamp(Duration::from_millis(10), left)).await;
    }
}

fn refusal(refused: Refused, wait: Duration, key: &ActionKey) -> CallToolResult {
    match refused {
        Refused::KeyReused(fields) => answers::key_reused(&fields),
        Refused::InProgress(_) => answers::in_progress(wait, key),
        Refused::LeaseExpired { fencing } => answers::unresolved(fencing, key),
        Refused::Unavailable(message) => answers::gate_unavailable(&message),
        Refused::Invalid { field, description } => {
            answers::refused("INVALID_REQUEST", &format!("{field}: {description}"))
        }
        Refused::Other(message) => answers::refused("REFUSED", &message),
    }
}

/// The action key as the gate computes it (for the texts an operator reads), from the
/// gateway's own policies: exact in process, and with a gate server that runs the same file.
fn reference_key(shared: &super::Shared, ask: &Ask) -> ActionKey {
    let policies = &shared.policies;
    let call = oncegate_gate::TokenCall {
        agent_id: ask.agent_id.clone(),
        run_id: ask.run_id.clone(),
        action: ask.action.clone(),
        params_json: ask.params_json.clone(),
        idempotency_key: ask.idempotency_key.clone(),
        ..Default::default()
    };
    match prepare_token(
        &policies.limits,
        policies.for_action(&ask.action),
        call,
        String::new(),
    ) {
        Ok(prepared) => prepared.key,
        Err(_) => ActionKey::new(&ask.agent_id, &ask.run_id, &ask.idempotency_key),
    }
}

/// Extends the lease every third of it while the tool runs.
fn heartbeat(gate: GateLink, ticket: Ticket) -> tokio::task::JoinHandle<()> {
    let every = (ticket.lease / 3).max(Duration::from_millis(500));
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            if let Err(e) = gate.extend(&ticket).await {
                tracing::warn!(?e, key = %ticket.key.key, "heartbeat: ExtendLease failed");
                if !matches!(e, Refused::Unavailable(_)) {
                    return;
                }
            }
        }
    })
}

/// Records `result` as the receipt, retrying while the gate is unavailable; a result larger than
/// the gate keeps is recorded as a note saying so.
async fn complete(gate: &GateLink, ticket: &Ticket, result: &CallToolResult) {
    let mut receipt = serde_json::to_vec(result).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut backoff = Duration::from_millis(50);
    loop {
        match gate.complete(ticket, &receipt).await {
            Ok(()) => return,
            Err(Refused::Invalid { field, .. }) if field == "receipt" => {
                let note = CallToolResult::success(vec![ContentBlock::text(format!(
                    "This action was performed once; its result ({} bytes) was larger than the \
                     gate keeps, so it cannot be shown again.",
                    receipt.len()
                ))]);
                receipt = serde_json::to_vec(&note).unwrap_or_default();
            }
            Err(Refused::Unavailable(_)) if Instant::now() < deadline => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
            Err(e) => {
                tracing::error!(?e, key = %ticket.key.key,
                    "the tool ran but Complete was not acknowledged; the lease will expire unresolved");
                return;
            }
        }
    }
}

/// The outcome is unknown: keep the lease, audit, tell the model.
fn unknown(tool: &str, ticket: &Ticket, why: &str) -> CallToolResult {
    tracing::warn!(target: AUDIT, agent_id = %ticket.key.agent_id, run_id = %ticket.key.run_id,
        key = %ticket.key.key, tool, fencing = ticket.fencing, decision = "mcp_outcome_unknown",
        why, "tools/call");
    answers::outcome_unknown(why, &ticket.key)
}

fn variant_name(answer: &ServerResult) -> &'static str {
    match answer {
        ServerResult::InputRequiredResult(_) => "input required",
        ServerResult::CreateTaskResult(_) => "a task",
        _ => "another result",
    }
}
