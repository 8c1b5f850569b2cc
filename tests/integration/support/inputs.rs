//! What tests feed a gate: requests with the common fields filled in, configuration text, and
//! files for a process to read.

use std::path::{Path, PathBuf};

use oncegate::{config::ConfigFile, gate::policy::Policies, pb};

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
