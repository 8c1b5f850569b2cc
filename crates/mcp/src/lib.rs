//! `oncegate mcp`: an MCP proxy that puts the gate in front of one upstream MCP server, so an
//! agent's side-effecting tool calls run at most once without a line of agent code.
//!
//! It speaks MCP to the agent (stdio, or Streamable HTTP with `--listen`) and to one upstream (a
//! child process or a Streamable HTTP URL), built on the official Rust SDK (`rmcp`), on every
//! protocol revision rmcp knows: the stateless 2026-07-28 (each request on its own, any replica
//! answering it) and the revisions with the `initialize` handshake (a session each). Everything
//! passes through unchanged except `tools/call` of gated tools ([`call`]). The gate is the same
//! [`oncegate_gate::Gate`] the gRPC server runs, in process on the embedded store, or a gate server
//! over gRPC (`--gate`); either way its decisions are counted and audited as gRPC ones are.
//!
//! Reading order: [`args`] (flags) → [`run`] (wiring) → [`serve`] (stdio via [`stdio`], HTTP) →
//! [`sent`] (the arguments as sent) → [`handler`] (each MCP method) → [`session`] (one session's
//! upstream) → [`call`] (the gated call, under the client crate's guard) → [`identity`],
//! [`gate`], [`unknown`], [`answers`], [`metrics`]; [`upstream`] (the client side).

pub mod answers;
pub mod approve;
pub mod args;
pub mod call;
pub mod gate;
pub mod handler;
pub mod identity;
pub mod metrics;
pub mod operator;
pub mod refusal;
pub mod sent;
pub mod serve;
pub mod session;
pub mod stdio;
pub mod unknown;
pub mod upstream;

use std::{process::ExitCode, sync::Arc, time::Duration};

pub use args::McpArgs;

use oncegate_client::GateClient;
use oncegate_config::{
    ConfigFile, StoreConfig, TARGET_ENV, address_from_env, defaults, exit, mcp::McpSettings,
};
use oncegate_gate::{Gate, policy::Policies};
use oncegate_observe::metrics::{self as gate_metrics, Metrics};
use oncegate_proto::gate_admin_service_client::GateAdminServiceClient;
use prometheus_client::registry::Registry;
use upstream::Target;

/// What every session of one gateway shares.
pub struct Shared {
    pub target: Target,
    pub gate: gate::GateLink,
    /// The policies of the configuration file (the in-process gate's; with `--gate`, used only
    /// to name actions in the texts operators read).
    pub policies: Arc<Policies>,
    pub settings: McpSettings,
    pub identity: identity::Defaults,
    pub in_progress_wait: Duration,
    pub call_timeout: Duration,
    /// The attempts this gateway forwarded and lost.
    pub unknowns: unknown::Unknowns,
    /// The gateway's own series.
    pub metrics: metrics::GatewayMetrics,
    /// How the gateway decides a held call the person in the session answered; `None`: it
    /// cannot (a gate server and no `--approver-api-key`).
    pub approver: Option<approve::Approver>,
    /// The upstream link the stateless (2026-07-28) requests share.
    pub stateless: session::Link,
    /// The in-process gate's admin socket and console, served while the gateway runs (`None`
    /// with `--gate`).
    pub operator: Option<operator::LocalOperator>,
}

/// Runs `oncegate mcp` until its client goes away (stdio) or SIGINT/SIGTERM (HTTP).
pub async fn run(args: McpArgs) -> ExitCode {
    // An https upstream (reqwest, built without a provider of its own) uses ring, as tonic does.
    let _ = rustls::crypto::ring::default_provider().install_default();
    match build(&args).await {
        Ok(shared) => serve::serve(&args, Arc::new(shared)).await,
        Err((code, message)) => {
            tracing::error!("{message}");
            eprintln!("oncegate mcp: {message}");
            ExitCode::from(code)
        }
    }
}

async fn build(args: &McpArgs) -> Result<Shared, (u8, String)> {
    let usage = |m: String| (exit::USAGE, m);
    let (file, settings) = match &args.config {
        Some(path) => ConfigFile::load_with_mcp(path).map_err(|e| usage(e.to_string()))?,
        None => Default::default(),
    };
    let target = match (&args.upstream_url, args.upstream_command.is_empty()) {
        (Some(url), true) => Target::Url(url.clone()),
        (None, false) => Target::Command(args.upstream_command.clone()),
        _ => {
            return Err(usage(
                "give one of --upstream-command and --upstream-url".into(),
            ));
        }
    };
    let agent_id = args
        .agent_id
        .clone()
        .or_else(|| settings.agent_id.clone())
        .unwrap_or_else(|| defaults::MCP_AGENT_ID.to_owned());
    let mut registry = Registry::default();
    let gateway_metrics = metrics::GatewayMetrics::register(&mut registry);
    // --gate (or ONCEGATE_TARGET, read by clap), else the earlier name of that variable.
    let gate_address = args
        .gate
        .clone()
        .or_else(|| address_from_env(TARGET_ENV, &["ONCEGATE_GATE"]));
    if gate_address.is_none() && args.approver_api_key.is_some() {
        return Err(usage(
            "--approver-api-key needs --gate (the in-process gate decides as oncegate-mcp)".into(),
        ));
    }
    let (gate, approver, local_operator) = match &gate_address {
        Some(url) => {
            let (gate, approver) = remote_gate(url, args)?;
            (gate, approver, None)
        }
        None => {
            let gate = local_gate(
                args,
                &file.policies,
                file.authorization.clone(),
                &mut registry,
            )
            .await?;
            // A held call must be approvable by an operator while the gateway runs: the admin
            // socket (and the console, when asked), as `oncegate serve` serves them.
            let (gate, local_operator) =
                operator::start(args, gate.0, file.principals.clone()).await?;
            let approver = approve::Approver::Local(gate.clone());
            (
                gate::GateLink::Local(gate::LocalGate(gate)),
                Some(approver),
                Some(local_operator),
            )
        }
    };
    if let Some(addr) = args.metrics_listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| (exit::UNAVAILABLE, format!("--metrics-listen {addr}: {e}")))?;
        tracing::info!(addr = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            "metrics of the gateway (and of the in-process gate)");
        tokio::spawn(gate_metrics::endpoint::serve(
            listener,
            Arc::new(registry),
            std::future::pending(),
        ));
    }
    Ok(Shared {
        target,
        gate,
        policies: Arc::new(file.policies),
        settings,
        identity: identity::Defaults {
            agent_id,
            run_id: args.run_id.clone(),
        },
        in_progress_wait: Duration::from_secs(args.in_progress_wait_seconds),
        call_timeout: Duration::from_secs(args.call_timeout_seconds),
        unknowns: unknown::Unknowns::default(),
        metrics: gateway_metrics,
        approver,
        stateless: session::Link::default(),
        operator: local_operator,
    })
}

/// The gate server, connected on first use: a gateway started while the gate is down still
/// serves (its gated calls fail closed with `GATE_UNAVAILABLE`, the others pass through). With
/// `--approver-api-key`, the same channel decides approvals.
fn remote_gate(
    url: &str,
    args: &McpArgs,
) -> Result<(gate::GateLink, Option<approve::Approver>), (u8, String)> {
    let channel = args
        .access
        .connect_lazy(url, Duration::from_secs(10))
        .map_err(|(code, m)| (code, format!("--gate: {m}")))?;
    let unheadable = |flag: &str| {
        (
            exit::USAGE,
            format!("{flag} holds characters a header cannot carry"),
        )
    };
    let mut client = GateClient::from_channel(channel.clone());
    if let Some(key) = &args.access.api_key {
        client = client
            .with_api_key(key)
            .map_err(|_| unheadable("--api-key"))?;
    }
    let approver = match &args.approver_api_key {
        Some(key) => Some(approve::Approver::Remote {
            admin: GateAdminServiceClient::new(channel),
            key: format!("Bearer {key}")
                .parse()
                .map_err(|_| unheadable("--approver-api-key"))?,
        }),
        None => None,
    };
    Ok((gate::GateLink::Remote(client), approver))
}

async fn local_gate(
    args: &McpArgs,
    policies: &Policies,
    authorization: oncegate_gate::authorization::Settings,
    registry: &mut Registry,
) -> Result<gate::LocalGate, (u8, String)> {
    let store = StoreConfig::Embedded {
        data_dir: args.data_dir.clone(),
        call_timeout: Duration::from_millis(defaults::STORE_TIMEOUT_MS),
        cache_bytes: defaults::EMBEDDED_CACHE_MB << 20,
    }
    .open()
    .await
    .map_err(|e| {
        (
            exit::UNAVAILABLE,
            format!(
                "cannot open the embedded store in {}: {e}",
                args.data_dir.display()
            ),
        )
    })?;
    let metrics = Metrics::register(registry, policies.names(), defaults::OTHER_ACTION_LABEL);
    Ok(gate::LocalGate(
        Gate::with_metrics(store, policies.clone(), metrics).with_authorization(authorization),
    ))
}
