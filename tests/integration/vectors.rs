//! The shared fingerprint vectors (`tests/vectors/fingerprints.json`), checked against the Rust
//! implementation; the Python client checks the same file.

use oncegate_domain::fingerprint::{self, KeyFields, ParamsError, ParamsLimits};
use serde_json::Value;

fn error_name(e: &ParamsError) -> &'static str {
    match e {
        ParamsError::TooLarge(..) => "too_large",
        ParamsError::Syntax(_) => "syntax",
        ParamsError::NotAnObject => "not_an_object",
        ParamsError::TooDeep(_) => "too_deep",
        ParamsError::DuplicateMember(_) => "duplicate_member",
        ParamsError::UnsafeNumber { .. } => "unsafe_number",
        ParamsError::InexactNumber { .. } => "inexact_number",
    }
}

#[test]
fn every_shared_vector_matches() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/vectors/fingerprints.json"
    );
    let file: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let cases = file["cases"].as_array().unwrap();
    assert!(cases.len() >= 60, "at least 60 vectors");
    let mut failures = Vec::new();
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let action = case["action"].as_str().unwrap();
        let intent = case["intent"].as_str().unwrap_or("");
        let key_fields = match case["key_fields"].as_array() {
            None => KeyFields::All,
            Some(pointers) => KeyFields::Pointers(
                pointers
                    .iter()
                    .map(|p| p.as_str().unwrap().to_owned())
                    .collect(),
            ),
        };
        let parsed = fingerprint::parse_params(
            case["params_json"].as_str().unwrap(),
            ParamsLimits::default(),
        );
        match (parsed, case.get("error").and_then(Value::as_str)) {
            (Ok(params), None) => {
                let selection = fingerprint::select(&params, &key_fields);
                let canonical = fingerprint::canonical_form(action, intent, &selection);
                let fp = fingerprint::fingerprint(action, intent, &selection);
                if canonical != case["canonical"].as_str().unwrap()
                    || fp != case["fingerprint"].as_str().unwrap()
                {
                    failures.push(format!("{name}: got {canonical} / {fp}"));
                }
            }
            (Err(e), Some(expected)) if error_name(&e) == expected => {}
            (Err(e), Some(expected)) => {
                failures.push(format!("{name}: expected {expected}, got {e:?}"))
            }
            (Err(e), None) => failures.push(format!("{name}: expected a fingerprint, got {e:?}")),
            (Ok(_), Some(expected)) => {
                failures.push(format!("{name}: expected {expected}, got a fingerprint"))
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} vectors differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The shared statement vectors (`tests/vectors/statements.json`, signed by PyJWT with fixed test
/// keys): each verifies or is refused with the same kind as in Python and TypeScript, and the
/// gate's signer reproduces every statement the file marks, byte for byte.
#[test]
fn every_statement_vector_verifies_and_the_rust_signer_reproduces_them() {
    use oncegate_domain::statement::{
        PublicKeys, StatementKey,
        grant::{GrantCheck, GrantClaims, verify_grant},
    };
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors/statements.json");
    let file: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let keys = PublicKeys::from_jwks(&file["jwks"].to_string()).unwrap();
    let mut failures = Vec::new();
    let mut reproduced = 0;
    for case in file["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let statement = case["statement"].as_str().unwrap();
        let key_fields = match case["key_fields"].as_array() {
            None => KeyFields::All,
            Some(p) => KeyFields::Pointers(p.iter().map(|p| p.as_str().unwrap().into()).collect()),
        };
        let check = GrantCheck {
            audience: case["audience"].as_str().unwrap(),
            params_json: case["params_json"].as_str().unwrap(),
            key_fields: &key_fields,
            issuer: None,
            now: file["now"].as_i64().unwrap(),
        };
        let got = verify_grant(&keys, statement, &check)
            .map(|c| c.fencing)
            .map_err(|e| e.kind());
        let expected = match case.get("error") {
            Some(kind) => Err(kind.as_str().unwrap()),
            None => Ok(case["fencing"].as_u64().unwrap()),
        };
        if got != expected {
            failures.push(format!("{name}: got {got:?}, expected {expected:?}"));
        }
        if let Some(seed) = case.get("seed") {
            let claims: GrantClaims = serde_json::from_value(case["claims"].clone()).unwrap();
            let key = StatementKey::from_seed(&[seed.as_u64().unwrap() as u8; 32]);
            if claims.sign(&key) != statement {
                failures.push(format!("{name}: the Rust signer wrote other bytes"));
            }
            reproduced += 1;
        }
    }
    assert!(reproduced >= 3);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The receipt chain vector (`tests/vectors/receipt_chain.json`, digests and head statements made
/// by a Python implementation of docs/CONTRACT.md §4.x alone): every digest is the one the Rust
/// code computes, the chain verifies, the Rust sealer signs the same heads byte for byte, and a
/// rewritten entry is named.
#[test]
fn the_receipt_chain_vector_verifies_and_the_rust_sealer_reproduces_it() {
    use oncegate_domain::statement::{
        PublicKeys, StatementKey,
        receipt::{
            ChainEntry, FIRST_PREV, ReceiptClaims, ReceiptCore, ReceiptSigner, seal, verify_chain,
        },
    };
    struct Signer(StatementKey);
    impl ReceiptSigner for Signer {
        fn sign_head(&self, core: &ReceiptCore, prev: &str, covers: Vec<String>) -> String {
            ReceiptClaims::new("oncegate", core.clone(), prev, covers).sign(&self.0)
        }
    }
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/vectors/receipt_chain.json"
    );
    let file: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let keys = PublicKeys::from_jwks(&file["jwks"].to_string()).unwrap();
    let mut chain = Vec::new();
    let mut prev = FIRST_PREV.to_owned();
    for entry in file["entries"].as_array().unwrap() {
        let core: ReceiptCore = serde_json::from_value(entry["core"].clone()).unwrap();
        assert_eq!(entry["prev"], prev.as_str());
        prev = core.digest(&prev);
        assert_eq!(entry["digest"], prev.as_str(), "entry {}", core.seq);
        chain.push(ChainEntry {
            core,
            statement: entry["statement"].as_str().unwrap().into(),
        });
    }
    let report = verify_chain(&keys, "billing-agent", &chain);
    assert_eq!((report.verified, report.problems.len()), (chain.len(), 0));

    let signer = Signer(StatementKey::from_seed(&[1; 32]));
    let (mut start, mut prev) = (0, FIRST_PREV.to_owned());
    for size in file["batches"].as_array().unwrap() {
        let run = &chain[start..start + size.as_u64().unwrap() as usize];
        let cores: Vec<ReceiptCore> = run.iter().map(|e| e.core.clone()).collect();
        let sealed = seal(&signer, &prev, &cores);
        assert_eq!(sealed.heads.len(), 1);
        let (i, statement) = &sealed.heads[0];
        assert_eq!(*i, run.len() - 1);
        assert_eq!(
            statement, &run[*i].statement,
            "the head of entry {}",
            run[*i].core.seq
        );
        (start, prev) = (start + run.len(), sealed.digest);
    }

    let mut rewritten = chain.clone();
    rewritten[2].core.receipt_digest = "0".repeat(64);
    let report = verify_chain(&keys, "billing-agent", &rewritten);
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    assert_eq!(report.problems[0].seq, 3);
}
