//! Signing keys: read from PEM files (PKCS#8 private keys, or SPKI public keys for retired ones),
//! or generated at first start into the embedded store's data directory, and the [`Signer`] they
//! make. `oncegate keys generate` writes a key file with [`generate_file`].
//!
//! Replicas on Redis must share their keys: a key generated per replica would sign statements the
//! other replicas do not publish. So only the embedded store (one process per data directory)
//! generates a key by itself.

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    sync::Arc,
};

use ed25519_dalek::{
    SigningKey, VerifyingKey,
    pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, spki::der::pem::LineEnding},
};

use oncegate_domain::statement::StatementKey;
use oncegate_gate::Signer;

/// The file a data directory keeps its generated signing key in.
pub const GENERATED_KEY_FILE: &str = "signing-key.pem";

/// Where the active key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActiveKey {
    /// A key file given by `--signing-key`.
    File(PathBuf),
    /// `<data dir>/signing-key.pem`, generated when missing (embedded store only).
    Generated(PathBuf),
}

/// How the gate signs; `None` in [`super::Config`] means it does not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SigningConfig {
    pub issuer: String,
    pub active: ActiveKey,
    /// Retired keys: published and still verifying, never signing.
    pub retired: Vec<PathBuf>,
}

impl SigningConfig {
    /// Loads (or generates) the keys and makes the signer.
    pub fn signer(&self) -> Result<Arc<Signer>, String> {
        let active = match &self.active {
            ActiveKey::File(path) => read_private(path)?,
            ActiveKey::Generated(path) if path.exists() => read_private(path)?,
            ActiveKey::Generated(path) => generate_file(path)?,
        };
        let retired = self
            .retired
            .iter()
            .map(|p| read_public(p))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Signer::new(self.issuer.clone(), active, retired))
    }

    /// The public keys this configuration publishes, without generating anything.
    pub fn public_keys(&self) -> Result<Vec<VerifyingKey>, String> {
        let path = match &self.active {
            ActiveKey::File(path) | ActiveKey::Generated(path) => path,
        };
        let mut keys = vec![read_private(path)?.public()];
        for retired in &self.retired {
            keys.push(read_public(retired)?);
        }
        Ok(keys)
    }
}

/// Reads an Ed25519 private key (PKCS#8 PEM, as `oncegate keys generate` or
/// `openssl genpkey -algorithm ed25519` write it).
pub fn read_private(path: &Path) -> Result<StatementKey, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read signing key {}: {e}", path.display()))?;
    SigningKey::from_pkcs8_pem(&text)
        .map(StatementKey::new)
        .map_err(|e| {
            format!(
                "{}: not an Ed25519 private key in PKCS#8 PEM: {e}",
                path.display()
            )
        })
}

/// Reads the public half of a key file: a PKCS#8 private key or an SPKI public key (PEM).
pub fn read_public(path: &Path) -> Result<VerifyingKey, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read key {}: {e}", path.display()))?;
    if let Ok(key) = VerifyingKey::from_public_key_pem(&text) {
        return Ok(key);
    }
    SigningKey::from_pkcs8_pem(&text)
        .map(|k| k.verifying_key())
        .map_err(|e| format!("{}: not an Ed25519 key in PEM: {e}", path.display()))
}

/// Generates a key from the operating system's random source and writes it to `path` (PKCS#8
/// PEM, mode 0600, never over an existing file).
pub fn generate_file(path: &Path) -> Result<StatementKey, String> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| format!("no randomness for a key: {e}"))?;
    let key = StatementKey::from_seed(&seed);
    let pem = key
        .signing_key()
        .to_pkcs8_pem(LineEnding::LF)
        .map_err(|e| format!("cannot encode the key: {e}"))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options
        .open(path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    file.write_all(pem.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(key)
}
