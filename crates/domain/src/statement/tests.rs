//! Statements: sign → verify round trips and every refusal, rotation, and the receipt chain.

use super::{
    PublicKeys, StatementError, StatementKey,
    grant::{GrantCheck, GrantClaims, verify_grant},
    receipt::{ChainEntry, ReceiptClaims, ReceiptCore, verify_chain},
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

fn chain(n: u64) -> Vec<ChainEntry> {
    let mut entries: Vec<ChainEntry> = Vec::new();
    for seq in 1..=n {
        let core = core(seq, &format!("k{seq}"));
        let previous = entries.last().map(|e| &e.core);
        let statement = ReceiptClaims::new("oncegate", core.clone(), previous).sign(&key(1));
        entries.push(ChainEntry { core, statement });
    }
    entries
}

#[test]
fn an_intact_chain_verifies_and_every_tampering_is_named() {
    let keys = PublicKeys::new([key(1).public()]);
    let report = verify_chain(&keys, "billing", &chain(4));
    assert_eq!((report.verified, report.problems.len()), (4, 0));

    let mut rewritten = chain(4);
    rewritten[1].core.receipt_digest = "00".into();
    let report = verify_chain(&keys, "billing", &rewritten);
    assert_eq!(report.problems.len(), 2, "{:?}", report.problems);
    assert_eq!(report.problems[0].seq, 2);
    assert!(
        report.problems[0]
            .what
            .contains("differs from its signed statement")
    );
    assert_eq!(report.problems[1].seq, 3, "the next link no longer holds");

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
        (2, vec![2], 0)
    );
}
