//! `oncegate keys generate|export` and `oncegate verify`: the signing keys from a shell (make a key
//! file; print the public keys as the JWKS document executors load), and a grant statement
//! checked offline as an executor would.

use std::{path::PathBuf, process::ExitCode};

use clap::{Args, Subcommand};

use oncegate_client::{PublicKeys, verify_grant};
use oncegate_config::{
    SigningConfig, defaults, exit,
    keys::{self, ActiveKey},
};

/// `oncegate keys`.
#[derive(Debug, Clone, Args)]
pub struct KeysArgs {
    #[command(subcommand)]
    pub command: KeysCommand,
}

/// What to do with keys.
#[derive(Debug, Clone, Subcommand)]
pub enum KeysCommand {
    /// Write a new Ed25519 signing key (PKCS#8 PEM, mode 0600) to a file that does not exist yet.
    Generate {
        /// The key file to create.
        #[arg(long)]
        out: PathBuf,
    },
    /// Print the public keys a gate with these settings publishes, as a JWKS document.
    Export(ExportArgs),
}

/// The key settings of `oncegate serve`, to export what that gate would publish.
#[derive(Debug, Clone, Args)]
pub struct ExportArgs {
    /// The gate's --signing-key.
    #[arg(long, env = "ONCEGATE_SIGNING_KEY")]
    pub signing_key: Option<PathBuf>,
    /// The gate's --retired-signing-keys.
    #[arg(long, env = "ONCEGATE_RETIRED_SIGNING_KEYS", value_delimiter = ',')]
    pub retired_signing_keys: Vec<PathBuf>,
    /// The embedded gate's --data-dir (its generated key), when there is no --signing-key.
    #[arg(long, env = "ONCEGATE_DATA_DIR", default_value = defaults::DATA_DIR)]
    pub data_dir: PathBuf,
}

/// `oncegate verify`: checks a grant statement as the executor of the action would.
#[derive(Debug, Clone, Args)]
pub struct VerifyArgs {
    /// The gate's public keys: a JWKS file (`oncegate keys export`, or the gate's
    /// /.well-known/jwks.json).
    #[arg(long)]
    pub keys: PathBuf,
    /// The grant statement (Grant.statement).
    #[arg(long)]
    pub statement: String,
    /// The params the executor is asked to act on (a JSON object).
    #[arg(long)]
    pub params: String,
    /// The action policy's key fields, comma-separated JSON Pointers; every param when unset.
    #[arg(long, value_delimiter = ',')]
    pub key_fields: Vec<String>,
    /// The audience the executor answers to (the policy's `audience`, else the action name).
    #[arg(long)]
    pub audience: String,
}

/// Runs `oncegate keys …`.
pub fn run(args: &KeysArgs) -> ExitCode {
    match &args.command {
        KeysCommand::Generate { out } => match keys::generate_file(out) {
            Ok(key) => {
                println!("{}", key.kid());
                ExitCode::SUCCESS
            }
            Err(e) => fail(exit::UNAVAILABLE, &e),
        },
        KeysCommand::Export(export) => {
            let active = match &export.signing_key {
                Some(path) => ActiveKey::File(path.clone()),
                None => ActiveKey::Generated(export.data_dir.join(keys::GENERATED_KEY_FILE)),
            };
            let config = SigningConfig {
                issuer: defaults::SIGNING_ISSUER.into(),
                active,
                retired: export.retired_signing_keys.clone(),
            };
            match config.public_keys() {
                Ok(keys) => {
                    println!("{:#}", PublicKeys::new(keys).to_jwks());
                    ExitCode::SUCCESS
                }
                Err(e) => fail(exit::USAGE, &e),
            }
        }
    }
}

/// Runs `oncegate verify`: prints the verified claims (JSON) and exits 0, or names the refusal
/// (`refused: <kind>: …`) and exits 1.
pub fn verify(args: &VerifyArgs) -> ExitCode {
    let keys = match std::fs::read_to_string(&args.keys)
        .map_err(|e| e.to_string())
        .and_then(|text| PublicKeys::from_jwks(&text))
    {
        Ok(keys) => keys,
        Err(e) => return fail(exit::USAGE, &format!("--keys {}: {e}", args.keys.display())),
    };
    let fields: Vec<&str> = args.key_fields.iter().map(String::as_str).collect();
    match verify_grant(
        &keys,
        &args.statement,
        &args.params,
        &fields,
        &args.audience,
    ) {
        Ok(claims) => {
            println!("{:#}", serde_json::json!(claims));
            ExitCode::SUCCESS
        }
        Err(refused) => {
            eprintln!("refused: {}: {refused}", refused.kind());
            ExitCode::FAILURE
        }
    }
}

fn fail(code: u8, message: &str) -> ExitCode {
    eprintln!("oncegate: {message}");
    ExitCode::from(code)
}
