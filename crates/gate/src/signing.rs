//! The gate's signer: the active key that signs every grant and the heads of the receipt chains,
//! the issuer name, and the public keys it publishes (the active one and the retired ones that
//! still verify). One Ed25519 signature per grant; receipt chains get one per head (the stores
//! decide which entries are heads: docs/CONTRACT.md §4.x), which covers every entry before it.
//!
//! Where the keys come from (files, or generated into the data directory) is the configuration's.

use std::sync::Arc;

use ed25519_dalek::VerifyingKey;

use oncegate_domain::statement::{
    PublicKeys, StatementKey,
    grant::GrantClaims,
    receipt::{ReceiptClaims, ReceiptCore, ReceiptSigner},
};

/// Signs statements with one active key and publishes the keys that verify them.
#[derive(Debug)]
pub struct Signer {
    issuer: String,
    active: StatementKey,
    published: PublicKeys,
}

impl Signer {
    /// A signer with `active`, naming itself `issuer`; `retired` keys are published (and so still
    /// verify what they signed) but sign nothing.
    pub fn new(
        issuer: impl Into<String>,
        active: StatementKey,
        retired: impl IntoIterator<Item = VerifyingKey>,
    ) -> Arc<Self> {
        let published = PublicKeys::new(std::iter::once(active.public()).chain(retired));
        Arc::new(Self {
            issuer: issuer.into(),
            active,
            published,
        })
    }

    /// The issuer (`iss`) of every statement.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The key id of the active key.
    pub fn active_kid(&self) -> &str {
        self.active.kid()
    }

    /// The keys statements are verified with: the active key and the retired ones.
    pub fn public_keys(&self) -> &PublicKeys {
        &self.published
    }

    /// Signs a grant statement.
    pub fn sign_grant(&self, claims: &GrantClaims) -> String {
        claims.sign(&self.active)
    }
}

impl ReceiptSigner for Signer {
    fn sign_head(&self, core: &ReceiptCore, prev: &str, covers: Vec<String>) -> String {
        ReceiptClaims::new(&self.issuer, core.clone(), prev, covers).sign(&self.active)
    }
}
