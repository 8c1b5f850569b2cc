//! `oncegate admin get|complete|resolve|list-unresolved|audit|webhooks|console-login` (and the authorization
//! subcommands of [`authz`]): the operator API from a shell, against a running gate. Output is for
//! a person by default and one JSON document with `--json`; the connection options
//! ([`RemoteArgs`]) go before or after the subcommand.
//!
//! Owns: the operator subcommands and their rendering. The semantics are the server's; the
//! connection, credentials and error reports are [`super::remote`]'s.

use std::{path::PathBuf, process::ExitCode};

use clap::{Args, Subcommand, ValueEnum};
use serde_json::{Value, json};
use tonic::Status;

use super::{
    remote::{self, ActionArgs, Authed, ReceiptArgs, Remote, RemoteArgs, Stop},
    views,
};
use oncegate_proto::{self as pb, gate_admin_service_client::GateAdminServiceClient};

mod audit;
pub mod authz;
mod webhooks;

const TOOL: &str = "oncegate admin";

/// The request fields the gate's messages name, and the flags of `oncegate admin` that set them.
const FLAGS: [(&str, &str); 4] = [
    ("action_name", "--action-name"),
    ("params_json", "--params"),
    ("intent_id", "--intent"),
    ("agent_id", "--agent"),
];

/// `oncegate admin`: connection and output settings, and the subcommand.
#[derive(Debug, Clone, Args)]
pub struct AdminArgs {
    #[command(flatten)]
    pub remote: RemoteArgs,

    #[command(subcommand)]
    pub command: AdminCommand,
}

/// What to do.
#[derive(Debug, Clone, Subcommand)]
pub enum AdminCommand {
    /// Show one action's record, with its token while unsettled (operators see it).
    Get(ActionArgs),
    /// Record an action done by hand as completed (its worker then hears COMPLETED_BY_OTHER).
    Complete(CompleteArgs),
    /// Settle an expired lease as completed or failed, after reconciling with the provider.
    Resolve(ResolveArgs),
    /// List actions whose lease expired without Complete or Release, with what settling them needs.
    ListUnresolved(ListArgs),
    /// Export an agent's receipt chain and verify it: signatures, sequence, links. Exits 1 and
    /// names every entry that does not hold.
    Audit(AuditArgs),
    /// List the webhook events given up after their last delivery attempt (kept for the
    /// retention), with why, and how many events wait for delivery.
    Webhooks(webhooks::WebhooksArgs),
    /// Print a one-time code that logs into the operator console (--console-listen) as you: it
    /// works once, for 5 minutes, typed into the console's login form.
    ConsoleLogin,
    #[command(flatten)]
    Authz(authz::AuthzCommand),
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

/// `admin complete`.
#[derive(Debug, Clone, Args)]
pub struct CompleteArgs {
    #[command(flatten)]
    pub action: ActionArgs,
    #[command(flatten)]
    pub receipt: ReceiptArgs,
    /// Why, by whom, which ticket (kept with the completion and audited).
    #[arg(long, default_value = "")]
    pub note: String,
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
    /// Why, by whom, which ticket (kept with a completion, always audited).
    #[arg(long, default_value = "")]
    pub note: String,
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

/// Runs one admin command and prints its result.
pub async fn run(args: AdminArgs) -> ExitCode {
    let json = args.remote.json;
    let mut remote = match args.remote.connect(true).await {
        Ok(remote) => remote,
        Err(stop) => return stop.exit(TOOL, json),
    };
    let result = match &args.command {
        AdminCommand::Get(a) => remote
            .gate
            .get_action(pb::GetActionRequest {
                action: Some(a.to_ref()),
            })
            .await
            .map(|r| {
                let mut view = views::action_view(&a.to_ref(), &r.into_inner());
                withheld_token(&mut view, &remote);
                Ok(view)
            }),
        AdminCommand::Complete(c) => complete(&mut remote.admin, c).await,
        AdminCommand::Resolve(r) => resolve(&mut remote.admin, r).await,
        AdminCommand::ListUnresolved(l) => list(&mut remote.admin, l).await.map(Ok),
        AdminCommand::Audit(a) => audit::run(&mut remote.admin, a).await.map(Ok),
        AdminCommand::Webhooks(w) => webhooks::run(&mut remote.admin, w).await.map(Ok),
        AdminCommand::ConsoleLogin => console_login(&mut remote.admin).await.map(Ok),
        AdminCommand::Authz(c) => authz::run(c, &mut remote.admin).await.map(Ok),
    };
    let failed_audit = matches!(args.command, AdminCommand::Audit(_))
        && matches!(&result, Ok(Ok(v)) if v["intact"] != Value::Bool(true));
    match result {
        Ok(Ok(value)) => {
            if json {
                println!("{value:#}");
            } else if let AdminCommand::ListUnresolved(_) = args.command {
                print!("{}", views::unresolved_text(&value));
            } else if let AdminCommand::Audit(_) = args.command {
                print!("{}", audit::human(&value));
            } else if let AdminCommand::ConsoleLogin = args.command {
                print!("{}", console_login_text(&value));
            } else if let AdminCommand::Webhooks(_) = args.command {
                print!("{}", webhooks::human(&value));
            } else if let AdminCommand::Authz(c) = &args.command
                && let Some(text) = authz::human(c, &value)
            {
                print!("{text}");
            } else {
                print!("{}", views::text(&value));
            }
            if failed_audit {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Ok(Err(stop)) => stop.exit(TOOL, json),
        Err(status) => remote::refused(TOOL, json, &status, &FLAGS),
    }
}

async fn complete(
    admin: &mut GateAdminServiceClient<Authed>,
    c: &CompleteArgs,
) -> Result<Result<Value, Stop>, Status> {
    let receipt = match c.receipt.bytes() {
        Ok(receipt) => receipt,
        Err(stop) => return Ok(Err(stop)),
    };
    let r = admin
        .record_external_completion(pb::RecordExternalCompletionRequest {
            action: Some(c.action.to_ref()),
            receipt_format: c.receipt.format(&receipt) as i32,
            receipt,
            note: c.note.clone(),
            action_name: c.action_name.clone().unwrap_or_default(),
            params_json: c.params.clone().unwrap_or_default(),
            intent_id: c.intent.clone().unwrap_or_default(),
        })
        .await?
        .into_inner();
    Ok(Ok(json!({
        "recorded": r.recorded,
        "completion": r.completion.as_ref().map(views::completion),
    })))
}

async fn resolve(
    admin: &mut GateAdminServiceClient<Authed>,
    r: &ResolveArgs,
) -> Result<Result<Value, Stop>, Status> {
    let receipt = match r.receipt.bytes() {
        Ok(receipt) => receipt,
        Err(stop) => return Ok(Err(stop)),
    };
    let (resolution, name) = match r.outcome {
        Outcome::Completed => (pb::Resolution::Completed, "COMPLETED"),
        Outcome::Failed => (pb::Resolution::Failed, "FAILED"),
    };
    let resp = admin
        .resolve_expired(pb::ResolveExpiredRequest {
            action: Some(r.action.to_ref()),
            resolution: resolution as i32,
            receipt_format: match r.outcome {
                Outcome::Completed => r.receipt.format(&receipt) as i32,
                Outcome::Failed => pb::ReceiptFormat::Unspecified as i32,
            },
            receipt,
            note: r.note.clone(),
            expected_fencing: 0,
        })
        .await?
        .into_inner();
    Ok(Ok(json!({
        "resolution": name,
        "fencing": resp.fencing,
        "completion": resp.completion.as_ref().map(views::completion),
    })))
}

async fn list(admin: &mut GateAdminServiceClient<Authed>, l: &ListArgs) -> Result<Value, Status> {
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
        actions.extend(page.actions.iter().map(views::unresolved));
        token = page.next_page_token;
        if token.is_empty() || !l.all {
            break;
        }
    }
    Ok(json!({ "actions": actions, "next_page_token": token }))
}

/// `admin console-login`: a one-time console code for the caller.
async fn console_login(admin: &mut GateAdminServiceClient<Authed>) -> Result<Value, Status> {
    let r = admin
        .create_console_login(pb::CreateConsoleLoginRequest {})
        .await?
        .into_inner();
    Ok(json!({
        "code": r.code,
        "expires_in_seconds": r.expires_in.map_or(0, |d| d.seconds),
        "principal": r.principal,
    }))
}

fn console_login_text(value: &Value) -> String {
    format!(
        "{}\n\nType this code into the console's login form (it works once, within {} s, and logs \
         in as {}).\n",
        value["code"].as_str().unwrap_or_default(),
        value["expires_in_seconds"],
        value["principal"].as_str().unwrap_or_default()
    )
}

/// Says why an unsettled action's token is missing: the gate shows it to operators only, and this
/// call reached it as another principal (no API key over the network, or a key without the role).
fn withheld_token(view: &mut Value, remote: &Remote) {
    let unsettled = matches!(
        view["state"].as_str(),
        Some("ACTION_STATE_AUTHORIZED" | "ACTION_STATE_EXPIRED")
    );
    if !unsettled || view["token"] != "" || remote.local_operator {
        return;
    }
    let how = if remote.keyed {
        "this API key's principal lacks the operator role"
    } else {
        "this call carried no API key"
    };
    view["token_withheld"] = Value::String(format!(
        "the gate shows an unsettled action's token to operators only, and {how}: give an \
         operator's --api-key, or run on the gate's machine (its admin socket: --data-dir or \
         --admin-socket)"
    ));
}
