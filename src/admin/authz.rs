//! `oncegate admin approve|deny|list-approvals|budgets`: the operator's side of authorization
//! from a shell (held actions, budgets). Kept apart from [`super`], which owns the
//! output format and the exit codes (the connection and the credential are [`crate::remote`]'s);
//! this module owns only these subcommands and what they print.

use clap::{Args, Subcommand};
use serde_json::{Value, json};
use tonic::{Status, client::GrpcService};

use crate::remote::ActionArgs;
use oncegate_proto::{self as pb, gate_admin_service_client::GateAdminServiceClient};

/// The authorization subcommands of `oncegate admin`.
#[derive(Debug, Clone, Subcommand)]
pub enum AuthzCommand {
    /// Approve an action a rule holds: the next identical RequestToken is granted, once.
    Approve(DecideArgs),
    /// Deny an action a rule holds: identical RequestTokens are refused until the approval lapses.
    Deny(DecideArgs),
    /// List one agent's approvals (pending, approved but unused, denied), oldest first.
    ListApprovals(ListApprovalsArgs),
    /// Show one agent's budgets and velocity caps: used, limit, when the oldest spending frees.
    Budgets(AgentArgs),
}

/// `admin approve` / `admin deny`.
#[derive(Debug, Clone, Args)]
pub struct DecideArgs {
    #[command(flatten)]
    pub action: ActionArgs,
    /// The approval id (RequestToken's `approval.id`, or `list-approvals`).
    #[arg(long)]
    pub id: String,
    /// Why, by whom, which ticket (kept with the approval and audited).
    #[arg(long, default_value = "")]
    pub note: String,
}

/// `admin list-approvals`.
#[derive(Debug, Clone, Args)]
pub struct ListApprovalsArgs {
    /// The agent.
    #[arg(long)]
    pub agent: String,
    /// Entries per page.
    #[arg(long, default_value_t = 100)]
    pub page_size: u32,
    /// Start at this page token.
    #[arg(long, default_value = "")]
    pub page_token: String,
}

/// Names an agent.
#[derive(Debug, Clone, Args)]
pub struct AgentArgs {
    /// The agent.
    #[arg(long)]
    pub agent: String,
}

/// Runs one authorization subcommand; the caller prints the value.
pub async fn run<T>(
    command: &AuthzCommand,
    admin: &mut GateAdminServiceClient<T>,
) -> Result<Value, Status>
where
    T: GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    match command {
        AuthzCommand::Approve(d) | AuthzCommand::Deny(d) => {
            let approve = matches!(command, AuthzCommand::Approve(_));
            let reply = admin
                .decide_approval(pb::DecideApprovalRequest {
                    action: Some(pb::ActionRef {
                        scope: Some(pb::Scope {
                            agent_id: d.action.agent.clone(),
                            run_id: d.action.run.clone(),
                        }),
                        key: d.action.key.clone(),
                    }),
                    approval_id: d.id.clone(),
                    approve,
                    note: d.note.clone(),
                })
                .await?
                .into_inner();
            Ok(reply.approval.as_ref().map_or(Value::Null, entry))
        }
        AuthzCommand::ListApprovals(l) => {
            let page = admin
                .list_approvals(pb::ListApprovalsRequest {
                    agent_id: l.agent.clone(),
                    page_size: l.page_size,
                    page_token: l.page_token.clone(),
                })
                .await?
                .into_inner();
            let approvals: Vec<Value> = page.approvals.iter().map(entry).collect();
            Ok(json!({ "approvals": approvals, "next_page_token": page.next_page_token }))
        }
        AuthzCommand::Budgets(a) => {
            let reply = admin
                .get_budgets(pb::GetBudgetsRequest {
                    agent_id: a.agent.clone(),
                })
                .await?
                .into_inner();
            let budgets: Vec<Value> = reply
                .budgets
                .iter()
                .map(|b| {
                    json!({
                        "budget": b.budget,
                        "action": b.action_name,
                        "group": b.group,
                        "used": b.used,
                        "limit": b.limit,
                        "window_seconds": b.window.map_or(0, |w| w.seconds),
                        "next_release_at": b.next_release_at.map(|t| t.to_string()),
                    })
                })
                .collect();
            Ok(json!({ "budgets": budgets }))
        }
    }
}

fn entry(e: &pb::ApprovalEntry) -> Value {
    let scope = e
        .action
        .as_ref()
        .and_then(|a| a.scope.clone())
        .unwrap_or_default();
    let approval = e.approval.clone().unwrap_or_default();
    json!({
        "id": approval.id,
        "state": e.state().as_str_name().trim_start_matches("APPROVAL_STATE_"),
        "agent_id": scope.agent_id,
        "run_id": scope.run_id,
        "key": e.action.as_ref().map(|a| a.key.clone()).unwrap_or_default(),
        "action_name": e.action_name,
        "policy_id": approval.policy_id,
        "reason": approval.reason,
        "expires_at": approval.expires_at.map(|t| t.to_string()),
        "operator": e.operator,
        "note": e.note,
        "params": serde_json::from_str::<Value>(&e.params_json).unwrap_or(Value::Null),
    })
}

/// The text a person reads for a listing: one line per approval or bucket.
pub fn human(command: &AuthzCommand, value: &Value) -> Option<String> {
    let mut out = String::new();
    match command {
        AuthzCommand::ListApprovals(_) => {
            let list = value["approvals"].as_array().cloned().unwrap_or_default();
            if list.is_empty() {
                out.push_str("no approvals\n");
            }
            for a in &list {
                out.push_str(&format!(
                    "{}  {}  {} / {} / {}  {}  ({})  lapses {}\n",
                    a["id"].as_str().unwrap_or_default(),
                    a["state"].as_str().unwrap_or_default(),
                    a["agent_id"].as_str().unwrap_or_default(),
                    a["run_id"].as_str().unwrap_or_default(),
                    a["key"].as_str().unwrap_or_default(),
                    a["action_name"].as_str().unwrap_or_default(),
                    a["reason"].as_str().unwrap_or_default(),
                    a["expires_at"].as_str().unwrap_or("?"),
                ));
                if !a["params"].is_null() {
                    out.push_str(&format!("    params {}\n", a["params"]));
                }
            }
        }
        AuthzCommand::Budgets(_) => {
            let list = value["budgets"].as_array().cloned().unwrap_or_default();
            if list.is_empty() {
                out.push_str("nothing used in any window\n");
            }
            for b in &list {
                out.push_str(&format!(
                    "{} {} {}  used {} of {} per {} s  frees from {}\n",
                    b["budget"].as_str().unwrap_or_default(),
                    b["action"].as_str().unwrap_or_default(),
                    b["group"].as_str().unwrap_or_default(),
                    b["used"].as_str().unwrap_or_default(),
                    b["limit"].as_str().unwrap_or_default(),
                    b["window_seconds"],
                    b["next_release_at"].as_str().unwrap_or("?"),
                ));
            }
        }
        AuthzCommand::Approve(_) | AuthzCommand::Deny(_) => return None,
    }
    Some(out)
}
