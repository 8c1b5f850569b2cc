//! `oncegate fingerprint`: the fingerprint the gate computes for a request, offline, with the
//! configuration file's key fields and limits (the gate's own request hashing, not a copy).

use std::process::ExitCode;

use crate::cli::FingerprintArgs;
use oncegate_config::{ConfigFile, exit};
use oncegate_gate::{GateError, request};

/// Prints the fingerprint of `args`' request; exit 64 on a bad configuration file, 65 on a
/// request the gate would refuse.
pub fn run(args: &FingerprintArgs) -> ExitCode {
    let file = match &args.config {
        Some(path) => match ConfigFile::load(path) {
            Ok(file) => file,
            Err(e) => {
                eprintln!("oncegate: bad configuration: {e}");
                return ExitCode::from(exit::USAGE);
            }
        },
        None => ConfigFile::default(),
    };
    let policies = &file.policies;
    let Some(policy) = policies.for_action(&args.action) else {
        eprintln!(
            "oncegate: no policy names {:?} and the configuration is strict",
            args.action
        );
        return ExitCode::from(exit::DATAERR);
    };
    match request::hash_request(
        &policies.limits,
        policy,
        &args.action,
        &args.params,
        &args.intent,
        |_| false,
    ) {
        Ok(hashed) => {
            println!("{}", hashed.fingerprint);
            ExitCode::SUCCESS
        }
        Err(GateError::Invalid { description, .. }) => {
            eprintln!("oncegate: {description}");
            ExitCode::from(exit::DATAERR)
        }
        Err(e) => {
            eprintln!("oncegate: {e}");
            ExitCode::from(exit::DATAERR)
        }
    }
}
