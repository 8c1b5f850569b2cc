//! What tests feed a gate: requests with the common fields filled in, lease durations,
//! configuration text, and files for a process to read.

use std::path::{Path, PathBuf};

use oncegate_config::ConfigFile;
use oncegate_domain::ledger::{OnExpiry, TokenRequest};
use oncegate_gate::policy::Policies;
use oncegate_proto::{self as pb};

/// A RequestToken with the common fields filled in.
pub fn token_request(
    agent: &str,
    run: &str,
    action: &str,
    params: &str,
) -> pb::RequestTokenRequest {
    pb::RequestTokenRequest {
        scope: Some(pb::Scope {
            agent_id: agent.into(),
            run_id: run.into(),
        }),
        action: action.into(),
        params_json: params.into(),
        ..Default::default()
    }
}

/// A store-level grant step (for tests that drive a `Store` directly): `fingerprint`, handing out
/// `new_token` with a 60-s lease and retention, reconciling on expiry, no holder, hold or charges.
pub fn store_request(fingerprint: &str, new_token: &str) -> TokenRequest {
    TokenRequest {
        fingerprint: fingerprint.into(),
        digests: String::new(),
        holder: String::new(),
        new_token: new_token.into(),
        lease: 60_000,
        retention: 60_000,
        sliding: false,
        on_expiry: OnExpiry::Reconcile,
        principal: String::new(),
        max_superseded: 8,
        hold: None,
        charges: Vec::new(),
        asked: Default::default(),
    }
}

/// `ms` milliseconds as a lease or extension TTL.
pub fn ttl_ms(ms: u64) -> Option<prost_types::Duration> {
    Some(prost_types::Duration {
        seconds: (ms / 1000) as i64,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    })
}

/// Parses a configuration file's text (policies, limits, principals); panics when it is bad.
pub fn config(text: &str) -> ConfigFile {
    ConfigFile::parse(text).unwrap()
}

/// Parses a configuration file's text and keeps its policies.
pub fn policies(text: &str) -> Policies {
    config(text).policies
}

/// Writes `text` to `name` in `dir` and returns the path.
pub fn write_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// A configuration file's `[authorization]` table naming `rules` (written into `dir` as
/// `rules.cedar`), with `extra` TOML after it.
pub fn with_rules(dir: &Path, rules: &str, extra: &str) -> String {
    let path = write_file(dir, "rules.cedar", rules);
    format!(
        "[authorization]\npolicies = [{:?}]\n{extra}",
        path.display().to_string()
    )
}

/// Everything allowed, except the agent `intern` and transfers above 1000.
pub const BASIC_RULES: &str = r#"
@id("all") permit(principal, action, resource);
@id("no-intern") forbid(principal == Agent::"intern", action, resource);
@id("big-transfers") forbid(principal, action == Action::"payments.transfer", resource)
  when { context.params has amount && context.params.amount > 1000 };
"#;
