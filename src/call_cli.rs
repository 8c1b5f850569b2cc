//! `oncegate call request-token|complete|release|extend|get`: the worker API from a shell, one
//! RPC per subcommand, against a running gate. For trying the gate, scripts and reconciling by
//! hand; agents use a client library and its guard.
//!
//! Output is `name  value` lines by default and one JSON document with `--json`; the connection
//! options ([`RemoteArgs`]) go before or after the subcommand, as for `oncegate admin`. A refusal
//! prints its reason and metadata and exits 1 (69 when the gate or its store is unavailable).

use std::{process::ExitCode, time::Duration};

use clap::{Args, Subcommand, ValueEnum};
use serde_json::{Value, json};
use tonic::Status;

use super::{
    remote::{self, ActionArgs, ReceiptArgs, Remote, RemoteArgs, Stop},
    views,
};
use oncegate_proto as pb;

const TOOL: &str = "oncegate call";

/// The request fields the gate's messages name, and the flags of `oncegate call` that set them.
const FLAGS: [(&str, &str); 7] = [
    ("params_json", "--params"),
    ("idempotency_key", "--idempotency-key"),
    ("intent_id", "--intent"),
    ("lease_ttl", "--lease-seconds"),
    ("agent_id", "--agent"),
    ("run_id", "--run"),
    ("ttl", "--ttl-seconds"),
];

/// `oncegate call`: connection and output settings, and the RPC.
#[derive(Debug, Clone, Args)]
pub struct CallArgs {
    #[command(flatten)]
    pub remote: RemoteArgs,

    #[command(subcommand)]
    pub command: CallCommand,
}

/// The worker RPCs.
#[derive(Debug, Clone, Subcommand)]
pub enum CallCommand {
    /// Ask for the one-shot token of an action (RequestToken): granted (a token, a fencing number,
    /// a provider key), already completed (the original receipt), or refused.
    RequestToken(RequestTokenArgs),
    /// Report that the action ran, with its receipt (Complete).
    Complete(CompleteArgs),
    /// Give the token back after a definite failure, or when the action was not attempted
    /// (Release). Never after a timeout: reconcile first.
    Release(ReleaseArgs),
    /// Extend the lease of a live token (ExtendLease).
    Extend(ExtendArgs),
    /// Show the action's record (GetAction): state, fencing, provider key; the token to operators.
    Get(ActionArgs),
}

/// `call request-token`.
#[derive(Debug, Clone, Args)]
pub struct RequestTokenArgs {
    /// The agent id.
    #[arg(long)]
    pub agent: String,
    /// The workflow run id (one that survives restarts of the agent).
    #[arg(long)]
    pub run: String,
    /// The action type or tool name, e.g. payments.transfer.
    #[arg(long)]
    pub action: String,
    /// The action's arguments, a JSON object.
    #[arg(long)]
    pub params: String,
    /// The client-chosen name of the logical action; without it the fingerprint names it.
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// Separates deliberate repeats (two real transfers) from retries.
    #[arg(long)]
    pub intent: Option<String>,
    /// The name of the asking worker: asking again with it while the lease is live gets the same
    /// token back.
    #[arg(long)]
    pub holder: Option<String>,
    /// The lease to ask for, in seconds (the action policy's when unset).
    #[arg(long)]
    pub lease_seconds: Option<f64>,
}

/// `call complete`.
#[derive(Debug, Clone, Args)]
pub struct CompleteArgs {
    #[command(flatten)]
    pub action: ActionArgs,
    /// The token of the attempt that ran.
    #[arg(long)]
    pub token: String,
    #[command(flatten)]
    pub receipt: ReceiptArgs,
}

/// Why a token is given back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReleaseReason {
    /// The attempt ran and definitely had no effect (the provider said so).
    DefiniteFailure,
    /// The action was not attempted at all.
    NotAttempted,
}

/// `call release`.
#[derive(Debug, Clone, Args)]
pub struct ReleaseArgs {
    #[command(flatten)]
    pub action: ActionArgs,
    /// The token being given back.
    #[arg(long)]
    pub token: String,
    /// Why.
    #[arg(long, value_enum)]
    pub reason: ReleaseReason,
}

/// `call extend`.
#[derive(Debug, Clone, Args)]
pub struct ExtendArgs {
    #[command(flatten)]
    pub action: ActionArgs,
    /// The holder's live token.
    #[arg(long)]
    pub token: String,
    /// The new lease length, counted from now, in seconds.
    #[arg(long)]
    pub ttl_seconds: f64,
}

/// Runs one worker RPC and prints its answer.
pub async fn run(args: CallArgs) -> ExitCode {
    let json = args.remote.json;
    let mut remote = match args.remote.connect(false).await {
        Ok(remote) => remote,
        Err(stop) => return stop.exit(TOOL, json),
    };
    match call(&mut remote, &args.command).await {
        Ok(Ok(value)) => {
            if json {
                println!("{value:#}");
            } else {
                print!("{}", views::text(&value));
            }
            ExitCode::SUCCESS
        }
        Ok(Err(stop)) => stop.exit(TOOL, json),
        Err(status) => remote::refused(TOOL, json, &status, &FLAGS),
    }
}

async fn call(remote: &mut Remote, command: &CallCommand) -> Result<Result<Value, Stop>, Status> {
    let gate = &mut remote.gate;
    Ok(Ok(match command {
        CallCommand::RequestToken(r) => {
            let lease_ttl = match r.lease_seconds.map(seconds).transpose() {
                Ok(lease) => lease,
                Err(stop) => return Ok(Err(stop)),
            };
            let answer = gate
                .request_token(pb::RequestTokenRequest {
                    scope: Some(pb::Scope {
                        agent_id: r.agent.clone(),
                        run_id: r.run.clone(),
                    }),
                    action: r.action.clone(),
                    params_json: r.params.clone(),
                    intent_id: r.intent.clone().unwrap_or_default(),
                    idempotency_key: r.idempotency_key.clone().unwrap_or_default(),
                    holder: r.holder.clone().unwrap_or_default(),
                    lease_ttl,
                })
                .await?;
            views::token_answer(&answer.into_inner())
        }
        CallCommand::Complete(c) => {
            let receipt = match c.receipt.bytes() {
                Ok(receipt) => receipt,
                Err(stop) => return Ok(Err(stop)),
            };
            let done = gate
                .complete(pb::CompleteRequest {
                    action: Some(c.action.to_ref()),
                    token: c.token.clone(),
                    receipt,
                })
                .await?
                .into_inner();
            json!({
                "action": views::action_ref(Some(&c.action.to_ref())),
                "completion": done.completion.as_ref().map(views::completion),
            })
        }
        CallCommand::Release(r) => {
            let reason = match r.reason {
                ReleaseReason::DefiniteFailure => pb::ReleaseReason::DefiniteFailure,
                ReleaseReason::NotAttempted => pb::ReleaseReason::NotAttempted,
            };
            let released = gate
                .release(pb::ReleaseRequest {
                    action: Some(r.action.to_ref()),
                    token: r.token.clone(),
                    reason: reason as i32,
                })
                .await?
                .into_inner();
            json!({
                "action": views::action_ref(Some(&r.action.to_ref())),
                "released": true,
                "fencing": released.fencing,
            })
        }
        CallCommand::Extend(e) => {
            let ttl = match seconds(e.ttl_seconds) {
                Ok(ttl) => ttl,
                Err(stop) => return Ok(Err(stop)),
            };
            let extended = gate
                .extend_lease(pb::ExtendLeaseRequest {
                    action: Some(e.action.to_ref()),
                    token: e.token.clone(),
                    ttl: Some(ttl),
                })
                .await?
                .into_inner();
            json!({
                "action": views::action_ref(Some(&e.action.to_ref())),
                "lease_expires_at": extended.lease_expires_at.map(|t| t.to_string()),
            })
        }
        CallCommand::Get(a) => {
            let view = gate
                .get_action(pb::GetActionRequest {
                    action: Some(a.to_ref()),
                })
                .await?
                .into_inner();
            views::action_view(&a.to_ref(), &view)
        }
    }))
}

/// Seconds on the command line as a protobuf Duration.
fn seconds(s: f64) -> Result<prost_types::Duration, Stop> {
    if !(s.is_finite() && s > 0.0 && s <= 10.0 * 365.0 * 86400.0) {
        return Err(Stop::usage(format!(
            "a lease must be a positive number of seconds, got {s}"
        )));
    }
    let d = Duration::from_secs_f64(s);
    Ok(prost_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    })
}
