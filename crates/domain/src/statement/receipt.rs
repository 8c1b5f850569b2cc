//! Receipt statements and the chain they form: every recorded completion of an agent (a worker's
//! Complete, an operator's external completion or resolution) is entry `seq` of that agent's
//! chain, and its statement names the digest of entry `seq - 1`. An auditor holding the public keys
//! can then prove that no completion was removed (the sequence numbers are signed and contiguous)
//! or rewritten (each entry's signature covers it, and the next entry's signature covers its
//! digest).
//!
//! The stores append an entry's [`ReceiptCore`] atomically with the completion it records; the
//! link (`prev`) is over the previous entry's core, which the store hands back from the same atomic
//! step, so two completions of one agent can never claim the same place in the chain.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{PublicKeys, StatementKey};

/// The JOSE `typ` of receipt statements.
pub const RECEIPT_TYPE: &str = "oncegate-receipt+jwt";

/// What one chain entry records: the completion, and its place in the agent's chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiptCore {
    /// Position in the agent's chain, from 1.
    pub seq: u64,
    /// The agent.
    pub agent: String,
    /// The workflow run.
    pub run: String,
    /// The action key.
    pub key: String,
    /// The action's request hash.
    pub fingerprint: String,
    /// Hex SHA-256 of the receipt bytes ([`receipt_digest`]).
    pub receipt_digest: String,
    /// The fencing number of the completed grant.
    pub fencing: u64,
    /// `worker` or `operator`.
    pub source: String,
    /// When the completion was recorded, store clock, Unix milliseconds.
    pub completed_at: i64,
}

impl ReceiptCore {
    /// The digest the next entry's `prev` names: hex SHA-256 of the core's RFC 8785 (JCS) form.
    pub fn digest(&self) -> String {
        let canonical = serde_json_canonicalizer::to_vec(self).expect("a core serializes");
        hex::encode(Sha256::digest(&canonical))
    }
}

/// Hex SHA-256 of a receipt.
pub fn receipt_digest(receipt: &[u8]) -> String {
    hex::encode(Sha256::digest(receipt))
}

/// What a receipt statement says: the core, the issuer, and the link to the previous entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiptClaims {
    /// The gate that issued it.
    pub iss: String,
    /// When the completion was recorded, Unix seconds.
    pub iat: i64,
    /// The entry.
    #[serde(flatten)]
    pub core: ReceiptCore,
    /// [`ReceiptCore::digest`] of entry `seq - 1`; empty for the first entry.
    pub prev: String,
}

impl ReceiptClaims {
    /// The claims of `core`, linked to the previous entry's core (`None` for the first).
    pub fn new(issuer: &str, core: ReceiptCore, previous: Option<&ReceiptCore>) -> Self {
        Self {
            iss: issuer.into(),
            iat: core.completed_at.div_euclid(1000),
            prev: previous.map(ReceiptCore::digest).unwrap_or_default(),
            core,
        }
    }

    /// Signs these claims as a receipt statement.
    pub fn sign(&self, key: &StatementKey) -> String {
        key.sign(RECEIPT_TYPE, self)
    }
}

/// Signs receipt statements for a store, which calls it from inside the step that records the
/// completion (embedded) or right after it (Redis). Implemented by the gate, which holds the key.
pub trait ReceiptSigner: Send + Sync {
    /// The statement of `core`, linked to `previous`.
    fn sign_receipt(&self, core: &ReceiptCore, previous: Option<&ReceiptCore>) -> String;
}

/// One stored entry of a chain: its core, and its statement (empty when the gate stopped between
/// recording the completion and storing its signature; the next entry's signature still covers
/// its core).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainEntry {
    pub core: ReceiptCore,
    pub statement: String,
}

/// What went wrong with one entry of a chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainProblem {
    /// The entry's position (the stored one, or the expected one where entries are missing).
    pub seq: u64,
    /// The entry's action key, as stored.
    pub key: String,
    /// What is wrong.
    pub what: String,
}

impl std::fmt::Display for ChainProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "entry {} (key {:?}): {}", self.seq, self.key, self.what)
    }
}

/// The verdict on a chain.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChainReport {
    /// Entries whose statement verified and whose link holds.
    pub verified: usize,
    /// Entries stored without a statement (covered only by the next entry's link).
    pub unsigned: Vec<u64>,
    /// Everything that does not hold, in chain order. Empty: the chain is intact.
    pub problems: Vec<ChainProblem>,
}

/// Verifies an agent's whole chain, entry 1 first: each statement's signature (by a key of
/// `keys`) and type, that it says what the store holds, that the sequence has no gap, and that
/// each entry names the digest of the one before.
pub fn verify_chain(keys: &PublicKeys, agent: &str, entries: &[ChainEntry]) -> ChainReport {
    let mut report = ChainReport::default();
    let mut previous: Option<&ReceiptCore> = None;
    for (i, entry) in entries.iter().enumerate() {
        let expected_seq = i as u64 + 1;
        let mut problem = |what: String| {
            report.problems.push(ChainProblem {
                seq: entry.core.seq,
                key: entry.core.key.clone(),
                what,
            })
        };
        if entry.core.seq != expected_seq {
            problem(format!(
                "expected entry {expected_seq} here: entries are missing or out of order"
            ));
        }
        if entry.core.agent != agent {
            problem(format!("belongs to agent {:?}", entry.core.agent));
        }
        let prev = previous.map(ReceiptCore::digest).unwrap_or_default();
        if entry.statement.is_empty() {
            report.unsigned.push(entry.core.seq);
        } else {
            match keys.verify::<ReceiptClaims>(RECEIPT_TYPE, &entry.statement) {
                Err(e) => problem(format!("statement refused: {e}")),
                Ok((_, claims)) if claims.core != entry.core => {
                    problem("the stored entry differs from its signed statement".into())
                }
                Ok((_, claims)) if claims.prev != prev => problem(
                    "its link does not name the previous entry: an entry before it was removed or rewritten"
                        .into(),
                ),
                Ok(_) => report.verified += 1,
            }
        }
        previous = Some(&entry.core);
    }
    report
}
