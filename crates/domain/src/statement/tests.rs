//! Statements: sign → verify round trips and every refusal, rotation, and the receipt chain.

use super::{
    PublicKeys, StatementError, StatementKey,
    grant::{GrantCheck, GrantClaims, verify_grant},
    receipt::{
        ChainEntry, FIRST_PREV, MAX_COVERED, ReceiptClaims, ReceiptCore, ReceiptSigner, seal,
        sign_heads, verify_chain,
    },
};
use crate::fingerprint::{self, KeyFields, ParamsLimits};

const PARAMS: &str = r#"{"amount":100,"currency":"EUR","to":"DE89","memo":"x"}"#;

fn key(n: u8) -> StatementKey {
    StatementKey::from_seed(&[n; 32])
}

fn fields() -> KeyFields {
    KeyFields::Pointers(vec!["/amount".into(), "/currency".into(), "/to".into()])
}

fn claims() -> GrantClaims {
    let params = fingerprint::parse_params(PARAMS, ParamsLimits::default()).unwrap();
    GrantClaims {
        iss: "oncegate".into(),
        aud: "bank".into(),
        iat: 1_000,
        exp: 1_300,
        agent: "billing".into(),
        run: "run-7".into(),
        action: "payments.transfer".into(),
        key: "invoice-1".into(),
        intent: String::new(),
        fingerprint: fingerprint::fingerprint(
            "payments.transfer",
            "",
            &fingerprint::select(&params, &fields()),
        ),
        fencing: 1_700_000_000_000_001,
        provider_key: "og-1".into(),
    }
}

fn check<'a>(params: &'a str, audience: &'a str, key_fields: &'a KeyFields) -> GrantCheck<'a> {
    GrantCheck {
        audience,
        params_json: params,
        key_fields,
        issuer: Some("oncegate"),
        now: 1_100,
    }
}

#[test]
fn a_grant_round_trips_and_the_memo_is_not_a_key_field() {
    let statement = claims().sign(&key(1));
    let keys = PublicKeys::new([key(1).public()]);
    let f = fields();
    let got = verify_grant(&keys, &statement, &check(PARAMS, "bank", &f)).unwrap();
    assert_eq!(got, claims());
    let other_memo = r#"{"memo":"rewritten","to":"DE89","currency":"EUR","amount":100.0}"#;
    verify_grant(&keys, &statement, &check(other_memo, "bank", &f)).unwrap();
}

#[test]
fn every_refusal_is_named() {
    let statement = claims().sign(&key(1));
    let keys = PublicKeys::new([key(1).public()]);
    let f = fields();
    let kind =
        |statement: &str, c: GrantCheck<'_>| verify_grant(&keys, statement, &c).unwrap_err().kind();
    let changed = r#"{"amount":900,"currency":"EUR","to":"DE89"}"#;
    assert_eq!(
        kind(&statement, check(changed, "bank", &f)),
        "fingerprint_mismatch"
    );
    assert_eq!(
        kind(&statement, check(PARAMS, "other", &f)),
        "wrong_audience"
    );
    let late = GrantCheck {
        now: 1_300,
        ..check(PARAMS, "bank", &f)
    };
    assert_eq!(kind(&statement, late), "expired");
    let all = KeyFields::All;
    assert_eq!(
        kind(&statement, check(PARAMS, "bank", &all)),
        "fingerprint_mismatch"
    );
    // A claim changed in transit: the signature no longer holds.
    let mut parts: Vec<String> = statement.split('.').map(str::to_owned).collect();
    let forged = GrantClaims {
        fencing: claims().fencing + 1,
        ..claims()
    };
    parts[1] = forged.sign(&key(1)).split('.').nth(1).unwrap().to_owned();
    assert_eq!(
        kind(&parts.join("."), check(PARAMS, "bank", &f)),
        "bad_signature"
    );
    // Signed by a key that is not in the set.
    assert_eq!(
        kind(&claims().sign(&key(2)), check(PARAMS, "bank", &f)),
        "unknown_key"
    );
    // A receipt is never a grant.
    let receipt = key(1).sign(super::receipt::RECEIPT_TYPE, &claims());
    assert_eq!(kind(&receipt, check(PARAMS, "bank", &f)), "wrong_type");
    assert_eq!(kind("a.b", check(PARAMS, "bank", &f)), "malformed");
}

#[test]
fn a_rotated_key_still_verifies_while_in_the_set_and_not_once_removed() {
    let old = claims().sign(&key(1));
    let new = claims().sign(&key(2));
    let f = fields();
    let rotated = PublicKeys::new([key(2).public(), key(1).public()]);
    verify_grant(&rotated, &old, &check(PARAMS, "bank", &f)).unwrap();
    verify_grant(&rotated, &new, &check(PARAMS, "bank", &f)).unwrap();
    let removed = PublicKeys::new([key(2).public()]);
    assert!(matches!(
        verify_grant(&removed, &old, &check(PARAMS, "bank", &f)),
        Err(StatementError::UnknownKey(kid)) if kid == key(1).kid()
    ));
}

#[test]
fn the_jwks_form_round_trips_and_a_lying_kid_is_refused() {
    let keys = PublicKeys::new([key(1).public(), key(2).public()]);
    let text = keys.to_jwks().to_string();
    assert_eq!(PublicKeys::from_jwks(&text).unwrap(), keys);
    let lying = text.replace(key(1).kid(), "someone-else");
    assert!(PublicKeys::from_jwks(&lying).is_err());
}

fn core(seq: u64, key: &str) -> ReceiptCore {
    ReceiptCore {
        seq,
        agent: "billing".into(),
        run: "run-7".into(),
        key: key.into(),
        fingerprint: "v1-ab".into(),
        receipt_digest: super::receipt::receipt_digest(key.as_bytes()),
        fencing: 10 + seq,
        source: "worker".into(),
        completed_at: 1_000 * seq as i64,
    }
}

struct TestSigner(StatementKey);

impl ReceiptSigner for TestSigner {
    fn sign_head(&self, core: &ReceiptCore, prev: &str, covers: Vec<String>) -> String {
        ReceiptClaims::new("oncegate", core.clone(), prev, covers).sign(&self.0)
    }
}

/// A chain of `batches.iter().sum()` entries, sealed as a store would: one head per batch.
fn sealed_chain(batches: &[usize]) -> Vec<ChainEntry> {
    let signer = TestSigner(key(1));
    let mut entries: Vec<ChainEntry> = Vec::new();
    let mut prev = FIRST_PREV.to_owned();
    for &n in batches {
        let start = entries.len() as u64 + 1;
        let run: Vec<ReceiptCore> = (start..start + n as u64)
            .map(|seq| core(seq, &format!("k{seq}")))
            .collect();
        let sealed = seal(&signer, &prev, &run);
        let base = entries.len();
        entries.extend(run.into_iter().map(|core| ChainEntry {
            core,
            statement: String::new(),
        }));
        for (i, statement) in sealed.heads {
            entries[base + i].statement = statement;
        }
        prev = sealed.digest;
    }
    entries
}

fn chain(n: u64) -> Vec<ChainEntry> {
    sealed_chain(&vec![1; n as usize])
}

#[test]
fn an_entry_digest_covers_its_prev_and_entry_one_links_to_the_empty_string() {
    let one = core(1, "k1");
    assert_ne!(one.digest(""), one.digest(&"0".repeat(64)));
    let chain = sealed_chain(&[1]);
    let (_, claims) = PublicKeys::new([key(1).public()])
        .verify::<ReceiptClaims>(super::receipt::RECEIPT_TYPE, &chain[0].statement)
        .unwrap();
    assert_eq!((claims.prev.as_str(), claims.covers.len()), ("", 0));
}

#[test]
fn one_head_per_batch_covers_every_entry_and_names_a_rewritten_one() {
    let keys = PublicKeys::new([key(1).public()]);
    let chain = sealed_chain(&[3, 1, 4]);
    let signed: Vec<u64> = chain
        .iter()
        .filter(|e| !e.statement.is_empty())
        .map(|e| e.core.seq)
        .collect();
    assert_eq!(
        signed,
        vec![3, 4, 8],
        "one statement per batch, on its last entry"
    );
    let report = verify_chain(&keys, "billing", &chain);
    assert_eq!((report.verified, report.problems.len()), (8, 0));

    // An unsigned entry in the middle of a batch, rewritten: named, and only it.
    for victim in [0, 1, 4, 5, 6] {
        let mut rewritten = chain.clone();
        rewritten[victim].core.receipt_digest = "00".into();
        let report = verify_chain(&keys, "billing", &rewritten);
        assert_eq!(report.problems.len(), 1, "{victim}: {:?}", report.problems);
        assert_eq!(report.problems[0].seq, victim as u64 + 1);
        assert!(report.problems[0].what.contains("rewritten"));
    }
    // A head rewritten: named as differing from its statement; the next batch still verifies.
    let mut rewritten = chain.clone();
    rewritten[2].core.fencing = 1;
    let report = verify_chain(&keys, "billing", &rewritten);
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    assert_eq!(report.problems[0].seq, 3);
    assert!(
        report.problems[0]
            .what
            .contains("differs from its signed statement")
    );
    assert_eq!(report.verified, 5);
}

#[test]
fn entries_after_the_last_head_are_unsigned_yet_not_tampered() {
    let keys = PublicKeys::new([key(1).public()]);
    // A crash after two more entries were recorded and before their head was signed.
    let mut chain = sealed_chain(&[2, 3]);
    chain[4].statement.clear();
    let report = verify_chain(&keys, "billing", &chain);
    assert_eq!(
        (
            report.verified,
            report.unsigned.clone(),
            report.problems.len()
        ),
        (2, vec![3, 4, 5], 0)
    );
    // The next head, signed after the restart over every unsigned entry, covers them all.
    let signer = TestSigner(key(1));
    let prev = chain[1].core.digest(&chain[0].core.digest(FIRST_PREV));
    let run: Vec<ReceiptCore> = chain[2..].iter().map(|e| e.core.clone()).collect();
    let sealed = seal(&signer, &prev, &run);
    assert_eq!(sealed.heads.len(), 1);
    chain[4].statement = sealed.heads[0].1.clone();
    let report = verify_chain(&keys, "billing", &chain);
    assert_eq!(
        (
            report.verified,
            report.unsigned.len(),
            report.problems.len()
        ),
        (5, 0, 0)
    );
}

#[test]
fn a_long_unsigned_run_is_sealed_by_several_heads() {
    let keys = PublicKeys::new([key(1).public()]);
    let chain = sealed_chain(&[MAX_COVERED * 2 + 3]);
    let heads = chain.iter().filter(|e| !e.statement.is_empty()).count();
    assert_eq!(heads, 3);
    let report = verify_chain(&keys, "billing", &chain);
    assert_eq!((report.verified, report.problems.len()), (chain.len(), 0));
}

#[test]
fn an_intact_chain_verifies_and_every_tampering_is_named() {
    let keys = PublicKeys::new([key(1).public()]);
    let report = verify_chain(&keys, "billing", &chain(4));
    assert_eq!((report.verified, report.problems.len()), (4, 0));

    let mut rewritten = chain(4);
    rewritten[1].core.receipt_digest = "00".into();
    let report = verify_chain(&keys, "billing", &rewritten);
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    assert_eq!(report.problems[0].seq, 2);
    assert!(
        report.problems[0]
            .what
            .contains("differs from its signed statement")
    );

    let mut removed = chain(4);
    removed.remove(1);
    let report = verify_chain(&keys, "billing", &removed);
    assert_eq!(report.problems[0].seq, 3);
    assert!(report.problems.iter().any(|p| p.what.contains("link")));

    let mut unsigned = chain(3);
    unsigned[1].statement.clear();
    let report = verify_chain(&keys, "billing", &unsigned);
    assert_eq!(
        (
            report.verified,
            report.unsigned.clone(),
            report.problems.len()
        ),
        (3, vec![], 0),
        "entry 3's head covers entry 2"
    );
}

/// The digest as docs/CONTRACT.md §4.x defines it, with a general RFC 8785 implementation: the
/// JCS form of the ten members (names sorted by the canonicalizer, not by declaration order).
fn digest_by_the_definition(core: &ReceiptCore, prev: &str) -> String {
    use sha2::{Digest, Sha256};
    let object = serde_json::json!({
        "seq": core.seq, "agent": core.agent, "run": core.run, "key": core.key,
        "fingerprint": core.fingerprint, "receipt_digest": core.receipt_digest,
        "fencing": core.fencing, "source": core.source, "completed_at": core.completed_at,
        "prev": prev,
    });
    let canonical = serde_json_canonicalizer::to_vec(&object).unwrap();
    hex::encode(Sha256::digest(&canonical))
}

proptest::proptest! {
    #[test]
    fn the_digest_is_the_jcs_form_of_the_linked_entry(
        seq in 0u64..(1 << 53),
        strings in proptest::collection::vec(r#"[a-zé€😀\\"\n\r\t\x00\x01\x08\x0c\x1f\x7f/<>&'~]{0,8}"#, 7),
        fencing in 0u64..(1 << 53),
        completed_at in -(1i64 << 53)..(1i64 << 53),
    ) {
        let core = ReceiptCore {
            seq,
            agent: strings[0].clone(),
            run: strings[1].clone(),
            key: strings[2].clone(),
            fingerprint: strings[3].clone(),
            receipt_digest: strings[4].clone(),
            fencing,
            source: strings[5].clone(),
            completed_at,
        };
        let prev = &strings[6];
        proptest::prop_assert_eq!(core.digest(prev), digest_by_the_definition(&core, prev));
    }
}

proptest::proptest! {
    /// aws-lc signs (for speed) what ed25519-dalek keeps and verifies: over any seed and any
    /// claims, its signature is dalek's, byte for byte, and verifies strictly.
    #[test]
    fn aws_lc_signs_the_bytes_dalek_would_for_any_key_and_claims(
        seed in proptest::array::uniform32(proptest::num::u8::ANY),
        agent in "\\PC{0,40}",
        key_text in "\\PC{0,300}",
        fencing in proptest::num::u64::ANY,
    ) {
        use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD as B64};
        use ed25519_dalek::Signer as _;
        let key = StatementKey::from_seed(&seed);
        let statement = GrantClaims { agent, key: key_text, fencing, ..claims() }.sign(&key);
        let (signed, signature) = statement.rsplit_once('.').unwrap();
        let expected = key.signing_key().sign(signed.as_bytes());
        proptest::prop_assert_eq!(B64.decode(signature).unwrap(), expected.to_bytes().to_vec());
        proptest::prop_assert!(key.public().verify_strict(signed.as_bytes(), &expected).is_ok());
    }
}

#[test]
fn sealing_with_the_digests_a_store_kept_signs_the_same_heads() {
    let signer = TestSigner(key(1));
    let run: Vec<ReceiptCore> = (4..4 + MAX_COVERED as u64 + 3)
        .map(|seq| core(seq, &format!("k{seq}")))
        .collect();
    let prev = core(3, "k3").digest("abc");
    let sealed = seal(&signer, &prev, &run);
    let mut digests: Vec<String> = Vec::new();
    for core in &run {
        let digest = core.digest(digests.last().unwrap_or(&prev));
        digests.push(digest);
    }
    let linked: Vec<(&ReceiptCore, &str)> =
        run.iter().zip(digests.iter().map(String::as_str)).collect();
    assert_eq!(sign_heads(&signer, &prev, &linked), sealed.heads);
    assert_eq!(sealed.heads.len(), 2);
    assert_eq!(digests.last(), Some(&sealed.digest));
}
