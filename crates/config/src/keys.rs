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
/// PEM, mode 0600, never over an existing file). The key is written and synced under a temporary
/// name beside `path`, then linked into place: a start killed half-way leaves no `path` to refuse
/// at the next start, and `path` never holds part of a key.
pub fn generate_file(path: &Path) -> Result<StatementKey, String> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| format!("no randomness for a key: {e}"))?;
    let key = StatementKey::from_seed(&seed);
    let pem = key
        .signing_key()
        .to_pkcs8_pem(LineEnding::LF)
        .map_err(|e| format!("cannot encode the key: {e}"))?;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let cannot = |e: std::io::Error| format!("cannot create {}: {e}", path.display());
    // tempfile creates it mode 0600.
    let mut file = tempfile::Builder::new()
        .prefix(".signing-key-")
        .tempfile_in(dir)
        .map_err(cannot)?;
    file.write_all(pem.as_bytes())
        .and_then(|()| file.as_file().sync_all())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    file.persist_noclobber(path).map_err(|e| cannot(e.error))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| format!("cannot sync {}: {e}", dir.display()))?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn a_generated_key_appears_whole_at_its_path_and_is_never_overwritten() {
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("data").join(GENERATED_KEY_FILE);
        let key = generate_file(&path).unwrap();
        assert_eq!(read_private(&path).unwrap().public(), key.public());
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [GENERATED_KEY_FILE], "nothing but the key is left");

        let refused = generate_file(&path).err().unwrap();
        assert!(refused.starts_with("cannot create"), "{refused}");
        assert_eq!(read_private(&path).unwrap().public(), key.public());
        assert_eq!(
            std::fs::read_dir(path.parent().unwrap()).unwrap().count(),
            1
        );
    }
}
