//! Receipt statements and the chain they form: every recorded completion of an agent (a worker's
//! Complete, an operator's external completion or resolution) is entry `seq` of that agent's
//! chain. Each entry's digest covers its fields *and* the digest of the entry before it
//! ([`ReceiptCore::digest`], docs/CONTRACT.md §4.x), so one signature over an entry (a *signed
//! head*) covers every entry before it. The gate signs heads, not every entry: the embedded store
//! signs each agent's last entry of every group commit, the Redis store each chain's tail once per
//! sealing interval. A head's statement also lists the digests of the unsigned entries since the
//! previous head (`covers`), so a verifier names the very entry that was rewritten.
//!
//! The stores append an entry's [`ReceiptCore`] atomically with the completion it records, so two
//! completions of one agent can never claim the same place in the chain; the digests are the
//! signer's (Lua cannot hash with SHA-256).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{PublicKeys, StatementKey};

/// The JOSE `typ` of receipt statements.
pub const RECEIPT_TYPE: &str = "oncegate-receipt+jwt";

/// The `prev` of entry 1: the empty string.
pub const FIRST_PREV: &str = "";

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

/// The object an entry's digest is taken over: the core's fields and `prev`, declared in the
/// order RFC 8785 (JCS) sorts their names, so that serde_json's compact output *is* the JCS form:
/// it writes no whitespace, integers in decimal, and strings with JCS's escaping (`\"`, `\\`,
/// `\b \f \n \r \t`, other control characters as lowercase `\u00xx`, nothing else escaped).
/// `the_digest_is_the_jcs_form_of_the_linked_entry` checks it against a JCS implementation.
#[derive(Serialize)]
struct Linked<'a> {
    agent: &'a str,
    completed_at: i64,
    fencing: u64,
    fingerprint: &'a str,
    key: &'a str,
    prev: &'a str,
    receipt_digest: &'a str,
    run: &'a str,
    seq: u64,
    source: &'a str,
}

/// Feeds what serde_json writes straight into the hash: no buffer.
struct Hashing(Sha256);

impl std::io::Write for Hashing {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.update(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl ReceiptCore {
    /// The entry's digest, which the next entry's `prev` names: lowercase hex SHA-256 of the RFC
    /// 8785 (JCS) form of the object of the core's nine fields and `prev` (the digest of entry
    /// `seq - 1`, [`FIRST_PREV`] for entry 1). Covering `prev` makes it cover the whole chain up
    /// to this entry.
    pub fn digest(&self, prev: &str) -> String {
        let linked = Linked {
            agent: &self.agent,
            completed_at: self.completed_at,
            fencing: self.fencing,
            fingerprint: &self.fingerprint,
            key: &self.key,
            prev,
            receipt_digest: &self.receipt_digest,
            run: &self.run,
            seq: self.seq,
            source: &self.source,
        };
        let mut hashing = Hashing(Sha256::new());
        // Writing strings and integers into a hash cannot fail.
        serde_json::to_writer(&mut hashing, &linked).expect("a core serializes");
        hex::encode(hashing.0.finalize())
    }
}

/// Hex SHA-256 of a receipt.
pub fn receipt_digest(receipt: &[u8]) -> String {
    hex::encode(Sha256::digest(receipt))
}

/// What a receipt statement says: the signed head entry, the issuer, the link to the entry before
/// it, and the digests of the unsigned entries it covers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiptClaims {
    /// The gate that issued it.
    pub iss: String,
    /// When the completion was recorded, Unix seconds.
    pub iat: i64,
    /// The entry.
    #[serde(flatten)]
    pub core: ReceiptCore,
    /// [`ReceiptCore::digest`] of entry `seq - 1`; [`FIRST_PREV`] for the first entry.
    pub prev: String,
    /// The digests of the entries `seq - covers.len()` … `seq - 1`, oldest first: the unsigned
    /// entries since the previous signed head, at most [`MAX_COVERED`]. Its last item is `prev`.
    #[serde(default)]
    pub covers: Vec<String>,
}

impl ReceiptClaims {
    /// The claims of `core`, linked by `prev`, covering the digests `covers`.
    pub fn new(issuer: &str, core: ReceiptCore, prev: &str, covers: Vec<String>) -> Self {
        Self {
            iss: issuer.into(),
            iat: core.completed_at.div_euclid(1000),
            prev: prev.into(),
            covers,
            core,
        }
    }

    /// Signs these claims as a receipt statement.
    pub fn sign(&self, key: &StatementKey) -> String {
        key.sign(RECEIPT_TYPE, self)
    }
}

/// The most digests one head statement lists: a longer unsigned run is sealed by several heads.
pub const MAX_COVERED: usize = 255;

/// Signs receipt heads for a store (the embedded store at each group commit, the Redis store once
/// per sealing interval). Implemented by the gate, which holds the key.
pub trait ReceiptSigner: Send + Sync {
    /// The statement of the head `core`, linked by `prev`, covering the digests `covers`.
    fn sign_head(&self, core: &ReceiptCore, prev: &str, covers: Vec<String>) -> String;
}

/// A run of consecutive unsigned entries, sealed: which of them got a statement, and the last
/// one's digest (the `prev` of the entry after the run).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    /// (index into the run, statement): the run's last entry, and every [`MAX_COVERED`]+1-th.
    pub heads: Vec<(usize, String)>,
    /// The digest of the run's last entry.
    pub digest: String,
}

/// Seals `run`, consecutive unsigned entries oldest first, the first of which follows the entry
/// whose digest is `prev` ([`FIRST_PREV`] when it is entry 1): signs its last entry, and one
/// entry in every [`MAX_COVERED`] + 1 before it, so that no statement lists more digests.
pub fn seal(signer: &dyn ReceiptSigner, prev: &str, run: &[ReceiptCore]) -> Sealed {
    let mut digests: Vec<String> = Vec::with_capacity(run.len());
    for core in run {
        let digest = core.digest(digests.last().map_or(prev, String::as_str));
        digests.push(digest);
    }
    let linked: Vec<(&ReceiptCore, &str)> =
        run.iter().zip(digests.iter().map(String::as_str)).collect();
    Sealed {
        heads: sign_heads(signer, prev, &linked),
        digest: digests.pop().unwrap_or_else(|| prev.to_owned()),
    }
}

/// [`seal`] for a store that already has each entry's digest (it computed it to link the next
/// entry): `run` is each entry with its [`ReceiptCore::digest`], oldest first, the first following
/// the entry whose digest is `prev`. Returns the heads: (index into `run`, statement).
pub fn sign_heads(
    signer: &dyn ReceiptSigner,
    prev: &str,
    run: &[(&ReceiptCore, &str)],
) -> Vec<(usize, String)> {
    let mut prev = prev;
    let mut covers = Vec::new();
    let mut heads = Vec::new();
    for (i, &(core, digest)) in run.iter().enumerate() {
        if i + 1 == run.len() || covers.len() == MAX_COVERED {
            heads.push((i, signer.sign_head(core, prev, std::mem::take(&mut covers))));
        } else {
            covers.push(digest.to_owned());
        }
        prev = digest;
    }
    heads
}

/// One stored entry of a chain: its core, and its statement (empty unless the entry is a signed
/// head: a later head covers it, or, after the last head, nothing signed covers it yet).
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
    /// Entries covered by a signed head that verified (the head included) with every link holding.
    pub verified: usize,
    /// Entries after the last signed head: recorded, but covered by no signature *yet* (the gate
    /// signs them with the next head; a gate that stopped before leaves them so until then). They
    /// cannot be checked, and are not problems.
    pub unsigned: Vec<u64>,
    /// Everything that does not hold, in chain order. Empty: every signed entry and every entry
    /// before the last signed head is intact.
    pub problems: Vec<ChainProblem>,
}

/// An entry not yet covered by a head.
struct Pending<'a> {
    entry: &'a ChainEntry,
    /// The digest it was recomputed over (the entry before it).
    prev: String,
}

/// Verifies an agent's whole chain, entry 1 first: the sequence has no gap, each head's statement
/// verifies (signature by a key of `keys`, type) and says what the store holds, each head's link
/// names the digest of the entries before it as stored, and each entry a head covers has the
/// digest the head lists (which names a rewritten entry exactly).
pub fn verify_chain(keys: &PublicKeys, agent: &str, entries: &[ChainEntry]) -> ChainReport {
    let mut report = ChainReport::default();
    // The digest of the previous entry: recomputed from the stored cores, restarted from each
    // head's signed digest so that one rewrite is named once, in its own stretch.
    let mut prev = FIRST_PREV.to_owned();
    let mut pending: Vec<Pending<'_>> = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let expected_seq = i as u64 + 1;
        if entry.core.seq != expected_seq {
            report.problems.push(problem(
                entry,
                format!("expected entry {expected_seq} here: entries are missing or out of order"),
            ));
        }
        if entry.core.agent != agent {
            report.problems.push(problem(
                entry,
                format!("belongs to agent {:?}", entry.core.agent),
            ));
        }
        let verified = match entry.statement.is_empty() {
            true => None,
            false => Some(keys.verify::<ReceiptClaims>(RECEIPT_TYPE, &entry.statement)),
        };
        match verified {
            None | Some(Err(_)) => {
                if let Some(Err(e)) = verified {
                    report
                        .problems
                        .push(problem(entry, format!("statement refused: {e}")));
                }
                let digest = entry.core.digest(&prev);
                let before = std::mem::replace(&mut prev, digest);
                pending.push(Pending {
                    entry,
                    prev: before,
                });
            }
            Some(Ok((_, claims))) => {
                let covered = std::mem::take(&mut pending);
                prev = check_head(&mut report, entry, &claims, &covered, &prev);
            }
        }
    }
    report.unsigned = pending.iter().map(|p| p.entry.core.seq).collect();
    report
}

/// Checks one signed head against the entries it covers; returns its digest as signed.
fn check_head(
    report: &mut ChainReport,
    head: &ChainEntry,
    claims: &ReceiptClaims,
    covered: &[Pending<'_>],
    link: &str,
) -> String {
    let before = report.problems.len();
    // The covered entries the head lists, each checked on its own against the signed digests.
    let listed = covered.len().min(claims.covers.len());
    let first = covered.len() - listed;
    let mut signed_prev = covered
        .get(first)
        .map(|p| p.prev.clone())
        .unwrap_or_default();
    for (pending, signed) in covered[first..]
        .iter()
        .zip(&claims.covers[claims.covers.len() - listed..])
    {
        if pending.entry.core.digest(&signed_prev) != *signed {
            report.problems.push(problem(
                pending.entry,
                format!(
                    "rewritten: its digest is not the one the signed head (entry {}) covers",
                    claims.core.seq
                ),
            ));
        }
        signed_prev = signed.clone();
    }
    if claims.core != head.core {
        report.problems.push(problem(
            head,
            "the stored entry differs from its signed statement".into(),
        ));
    }
    if claims.prev != link && report.problems.len() == before {
        report.problems.push(problem(
            head,
            "its link does not name the previous entry: an entry before it was removed or rewritten"
                .into(),
        ));
    }
    if report.problems.len() == before {
        report.verified += covered.len() + 1;
    }
    claims.core.digest(&claims.prev)
}

fn problem(entry: &ChainEntry, what: String) -> ChainProblem {
    ChainProblem {
        seq: entry.core.seq,
        key: entry.core.key.clone(),
        what,
    }
}
