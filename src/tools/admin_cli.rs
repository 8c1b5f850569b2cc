//! `oncegate admin get|complete|resolve|list-unresolved`: the operator API from a shell, against
//! a running gate. Output is for a person by default and one JSON document with `--json`.
//!
//! Owns: the client side (channel, TLS, credential) and the rendering. The semantics are the
//! server's. The API key is read from `--api-key` or `ONCEGATE_API_KEY` and sent as
//! `authorization: Bearer <key>`; it is never printed.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use base64::Engine as _;
use clap::{Args, Subcommand, ValueEnum};
use serde_json::{Value, json};
use tonic::{Request, Status, metadata::MetadataValue};
use tonic_types::StatusExt;

use super::gate_channel::{self, GateAccess};

#[path = "admin_audit.rs"]
mod audit;
use crate::{
    config::defaults,
    pb::{
        self, action_gate_service_client::ActionGateServiceClient,
        gate_admin_service_client::GateAdminServiceClient,
    },
};

/// Connection and output settings of `oncegate admin`.
#[derive(Debug, Clone, Args)]
pub struct AdminArgs {
    /// The gate's address: http://host:port, or https://host:port (TLS, with --ca).
    #[arg(long, env = "ONCEGATE_SERVER", default_value = defaults::ADMIN_SERVER)]
    pub server: String,

    #[command(flatten)]
    pub access: GateAccess,

    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,

    /// Deadline of the call, in seconds.
    #[arg(long, default_value_t = 10)]
    pub timeout_seconds: u64,

    #[command(subcommand)]
    pub command: AdminCommand,
}

/// What to do.
#[derive(Debug, Clone, Subcommand)]
pub enum AdminCommand {
    /// Show one action's record.
    Get(ActionArgs),
    /// Record an action done by hand as completed (its worker then hears COMPLETED_BY_OTHER).
    Complete(CompleteArgs),
    /// Settle an expired lease as completed or failed, after reconciling with the provider.
    Resolve(ResolveArgs),
    /// List actions whose lease expired without Complete or Release.
    ListUnresolved(ListArgs),
    /// Export an agent's receipt chain and verify it: signatures, sequence, links. Exits 1 and
    /// names every entry that does not hold.
    Audit(AuditArgs),
}

/// `admin audit`.
#[derive(Debug, Clone, Args)]
pub struct AuditArgs {
    /// The agent whose chain to verify.
    #[arg(long)]
    pub agent: String,
    /// The public keys to verify with (a JWKS file, e.g. kept from `oncegate keys export`); the
    /// keys the gate serves when unset.
    #[arg(long)]
    pub keys: Option<PathBuf>,
}

/// Names one action.
#[derive(Debug, Clone, Args)]
pub struct ActionArgs {
    /// The agent id.
    #[arg(long)]
    pub agent: String,
    /// The run id.
    #[arg(long)]
    pub run: String,
    /// The idempotency key, or the fingerprint (`oncegate fingerprint` computes it).
    #[arg(long)]
    pub key: String,
}

/// A receipt and a note.
#[derive(Debug, Clone, Args)]
pub struct ReceiptArgs {
    /// The receipt as text.
    #[arg(long, conflicts_with = "receipt_file")]
    pub receipt: Option<String>,
    /// A file holding the receipt (bytes).
    #[arg(long)]
    pub receipt_file: Option<PathBuf>,
    /// Why, by whom, which ticket (kept with the completion and audited).
    #[arg(long, default_value = "")]
    pub note: String,
}

impl ReceiptArgs {
    fn bytes(&self) -> Result<Vec<u8>, String> {
        match (&self.receipt, &self.receipt_file) {
            (Some(text), _) => Ok(text.clone().into_bytes()),
            (None, Some(path)) => {
                std::fs::read(path).map_err(|e| format!("--receipt-file {}: {e}", path.display()))
            }
            (None, None) => Ok(Vec::new()),
        }
    }
}

/// `admin complete`.
#[derive(Debug, Clone, Args)]
pub struct CompleteArgs {
    #[command(flatten)]
    pub action: ActionArgs,
    #[command(flatten)]
    pub receipt: ReceiptArgs,
    /// The action type, when the action has no record yet (with --params).
    #[arg(long)]
    pub action_name: Option<String>,
    /// The action's params as the agent would send them (a JSON object).
    #[arg(long, requires = "action_name")]
    pub params: Option<String>,
    /// The intent id the agent would send, if any.
    #[arg(long, requires = "action_name")]
    pub intent: Option<String>,
}

/// What a reconciliation found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Outcome {
    /// The effect happened.
    Completed,
    /// The effect definitely did not happen.
    Failed,
}

/// `admin resolve`.
#[derive(Debug, Clone, Args)]
pub struct ResolveArgs {
    #[command(flatten)]
    pub action: ActionArgs,
    /// What the reconciliation with the provider found.
    #[arg(long, value_enum)]
    pub outcome: Outcome,
    #[command(flatten)]
    pub receipt: ReceiptArgs,
}

/// `admin list-unresolved`.
#[derive(Debug, Clone, Args)]
pub struct ListArgs {
    /// Only this agent's actions.
    #[arg(long)]
    pub agent: Option<String>,
    /// Entries per page.
    #[arg(long, default_value_t = 100)]
    pub page_size: u32,
    /// Start at this page token (printed after a page when more follow).
    #[arg(long, default_value = "")]
    pub page_token: String,
    /// Follow every page to the end.
    #[arg(long)]
    pub all: bool,
}

use crate::config::exit::{UNAVAILABLE as EX_UNAVAILABLE, USAGE as EX_USAGE};

/// Runs one admin command and prints its result.
pub async fn run(args: AdminArgs) -> ExitCode {
    let timeout = Duration::from_secs(args.timeout_seconds.max(1));
    let channel = match gate_channel::connect(&args.server, &args.access, timeout).await {
        Ok(channel) => channel,
        Err((code, message)) => {
            eprintln!("oncegate admin: {message}");
            return ExitCode::from(code);
        }
    };
    let auth = match &args.access.api_key {
        Some(key) => match MetadataValue::try_from(format!("Bearer {key}")) {
            Ok(mut value) => {
                value.set_sensitive(true);
                Some(value)
            }
            Err(_) => {
                eprintln!("oncegate admin: the API key holds characters a header cannot carry");
                return ExitCode::from(EX_USAGE);
            }
        },
        None => None,
    };
    let interceptor = move |mut req: Request<()>| -> Result<Request<()>, Status> {
        if let Some(value) = &auth {
            req.metadata_mut().insert("authorization", value.clone());
        }
        req.set_timeout(timeout);
        Ok(req)
    };
    let mut gate = ActionGateServiceClient::with_interceptor(channel.clone(), interceptor.clone());
    let mut admin = GateAdminServiceClient::with_interceptor(channel, interceptor);
    let result = match &args.command {
        AdminCommand::Get(a) => gate
            .get_action(pb::GetActionRequest {
                action: Some(action_ref(a)),
            })
            .await
            .map(|r| render_view(&r.into_inner())),
        AdminCommand::Complete(c) => match c.receipt.bytes() {
            Err(e) => Err(Status::invalid_argument(e)),
            Ok(receipt) => admin
                .record_external_completion(pb::RecordExternalCompletionRequest {
                    action: Some(action_ref(&c.action)),
                    receipt,
                    note: c.receipt.note.clone(),
                    action_name: c.action_name.clone().unwrap_or_default(),
                    params_json: c.params.clone().unwrap_or_default(),
                    intent_id: c.intent.clone().unwrap_or_default(),
                })
                .await
                .map(|r| {
                    let r = r.into_inner();
                    let mut out = json!({ "recorded": r.recorded });
                    out["completion"] = r.completion.as_ref().map_or(Value::Null, completion);
                    out
                }),
        },
        AdminCommand::Resolve(r) => match r.receipt.bytes() {
            Err(e) => Err(Status::invalid_argument(e)),
            Ok(receipt) => admin
                .resolve_expired(pb::ResolveExpiredRequest {
                    action: Some(action_ref(&r.action)),
                    resolution: match r.outcome {
                        Outcome::Completed => pb::Resolution::Completed,
                        Outcome::Failed => pb::Resolution::Failed,
                    } as i32,
                    receipt,
                    note: r.receipt.note.clone(),
                })
                .await
                .map(|resp| {
                    let resp = resp.into_inner();
                    json!({
                        "resolution": match r.outcome { Outcome::Completed => "COMPLETED", Outcome::Failed => "FAILED" },
                        "fencing": resp.fencing,
                        "completion": resp.completion.as_ref().map_or(Value::Null, completion),
                    })
                }),
        },
        AdminCommand::ListUnresolved(l) => list(&mut admin, l).await,
        AdminCommand::Audit(a) => audit::run(&mut admin, a).await,
    };
    let failed_audit = matches!(args.command, AdminCommand::Audit(_))
        && result
            .as_ref()
            .is_ok_and(|v| v["intact"] != serde_json::Value::Bool(true));
    match result {
        Ok(value) => {
            if args.json {
                println!("{value:#}");
            } else {
                print!("{}", human(&args.command, &value));
            }
            if failed_audit {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(status) => {
            let reason = status
                .get_error_details()
                .error_info()
                .map(|i| i.reason.clone())
                .unwrap_or_default();
            if args.json {
                println!(
                    "{:#}",
                    json!({"error": {"code": format!("{:?}", status.code()), "reason": reason, "message": status.message()}})
                );
            } else {
                eprintln!(
                    "oncegate admin: {:?} {reason}: {}",
                    status.code(),
                    status.message()
                );
            }
            ExitCode::from(if status.code() == tonic::Code::Unavailable {
                EX_UNAVAILABLE
            } else {
                1
            })
        }
    }
}

fn action_ref(a: &ActionArgs) -> pb::ActionRef {
    pb::ActionRef {
        scope: Some(pb::Scope {
            agent_id: a.agent.clone(),
            run_id: a.run.clone(),
        }),
        key: a.key.clone(),
    }
}

async fn list<T>(admin: &mut GateAdminServiceClient<T>, l: &ListArgs) -> Result<Value, Status>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let mut actions = Vec::new();
    let mut token = l.page_token.clone();
    loop {
        let page = admin
            .list_unresolved(pb::ListUnresolvedRequest {
                agent_id: l.agent.clone().unwrap_or_default(),
                page_size: l.page_size,
                page_token: token,
            })
            .await?
            .into_inner();
        actions.extend(page.actions.iter().map(|a| {
            let scope = a
                .action
                .as_ref()
                .and_then(|r| r.scope.clone())
                .unwrap_or_default();
            json!({
                "agent_id": scope.agent_id,
                "run_id": scope.run_id,
                "key": a.action.as_ref().map(|r| r.key.clone()).unwrap_or_default(),
                "fencing": a.fencing,
                "lease_expired_at": a.lease_expired_at.map(|t| t.to_string()),
                "holder": a.holder,
                "fingerprint": a.fingerprint,
            })
        }));
        token = page.next_page_token;
        if token.is_empty() || !l.all {
            break;
        }
    }
    Ok(json!({ "actions": actions, "next_page_token": token }))
}

fn completion(c: &pb::Completion) -> Value {
    json!({
        "receipt_text": String::from_utf8_lossy(&c.receipt),
        "receipt_base64": base64::engine::general_purpose::STANDARD.encode(&c.receipt),
        "completed_at": c.completed_at.map(|t| t.to_string()),
        "fencing": c.fencing,
        "source": c.source().as_str_name(),
        "note": c.note,
        "operator": c.operator,
    })
}

fn render_view(v: &pb::GetActionResponse) -> Value {
    json!({
        "state": v.state().as_str_name(),
        "fencing": v.fencing,
        "fingerprint": v.fingerprint,
        "lease_expires_at": v.lease_expires_at.map(|t| t.to_string()),
        "holder": v.holder,
        "completion": v.completion.as_ref().map_or(Value::Null, completion),
    })
}

/// The text a person reads: `name  value` lines, one block per listed action.
fn human(command: &AdminCommand, value: &Value) -> String {
    fn lines(prefix: &str, value: &Value, out: &mut String) {
        if let Value::Object(map) = value {
            for (k, v) in map {
                match v {
                    Value::Null => {}
                    Value::Object(_) => lines(&format!("{prefix}{k}."), v, out),
                    Value::String(s) => out.push_str(&format!("{prefix}{k:<20} {s}\n")),
                    other => out.push_str(&format!("{prefix}{k:<20} {other}\n")),
                }
            }
        }
    }
    let mut out = String::new();
    match command {
        AdminCommand::ListUnresolved(_) => {
            let actions = value["actions"].as_array().cloned().unwrap_or_default();
            if actions.is_empty() {
                out.push_str("no unresolved actions\n");
            }
            for a in &actions {
                out.push_str(&format!(
                    "{} / {} / {}  fencing {}  lease ended {}  holder {:?}\n",
                    a["agent_id"].as_str().unwrap_or_default(),
                    a["run_id"].as_str().unwrap_or_default(),
                    a["key"].as_str().unwrap_or_default(),
                    a["fencing"],
                    a["lease_expired_at"].as_str().unwrap_or("?"),
                    a["holder"].as_str().unwrap_or_default(),
                ));
            }
            if let Some(token) = value["next_page_token"].as_str().filter(|t| !t.is_empty()) {
                out.push_str(&format!("more: --page-token {token}\n"));
            }
        }
        AdminCommand::Audit(_) => out.push_str(&audit::human(value)),
        _ => lines("", value, &mut out),
    }
    out
}
