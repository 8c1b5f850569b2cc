//! What one grant statement costs to sign, against ed25519-dalek signing the same input (the
//! signer before aws-lc took the signatures): BENCHMARKS.md, "What was tried".
//!
//! ```sh
//! cargo run --release -p oncegate-domain --example signing_speed [-- SIGNATURES_PER_ROUND]
//! ```
//!
//! Three rounds; each signs the same grant statement (about 600 bytes of signing input) the given
//! number of times (20,000 unless told) each way and prints µs per statement. The two ways give
//! the same bytes, checked before the clock starts.

use std::{hint::black_box, time::Instant};

use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD as B64};
use ed25519_dalek::Signer as _;
use oncegate_domain::statement::{StatementKey, grant::GrantClaims};

fn main() {
    let n: u32 = match std::env::args().nth(1) {
        None => 20_000,
        Some(arg) => arg.parse().ok().filter(|n| *n > 0).unwrap_or_else(|| {
            eprintln!("signing_speed: SIGNATURES_PER_ROUND must be a positive number, not {arg:?}");
            std::process::exit(2)
        }),
    };
    let key = StatementKey::from_seed(&[7; 32]);
    let claims = GrantClaims {
        iss: "oncegate-bench".into(),
        aud: "payments.transfer".into(),
        iat: 1_764_800_000,
        exp: 1_764_800_030,
        agent: "billing-agent".into(),
        run: "run-42".into(),
        action: "payments.transfer".into(),
        key: "invoice-2026-12-04-000042".into(),
        intent: "intent-7f3a9c".into(),
        fingerprint: format!("v1-{}", "ab".repeat(32)),
        fencing: 42,
        provider_key: format!("og-{}", "cd".repeat(16)),
    };
    let statement = claims.sign(&key);
    let (input, signature) = statement
        .rsplit_once('.')
        .expect("a statement has three parts");
    let by_dalek = key.signing_key().sign(input.as_bytes()).to_bytes();
    assert_eq!(
        B64.decode(signature).expect("base64url"),
        by_dalek,
        "aws-lc and dalek sign alike"
    );
    println!(
        "signing input {} bytes; {n} signatures per round",
        input.len()
    );
    for round in 1..=3 {
        let start = Instant::now();
        for _ in 0..n {
            black_box(black_box(&claims).sign(&key));
        }
        let statement_us = start.elapsed().as_secs_f64() * 1e6 / f64::from(n);
        let start = Instant::now();
        for _ in 0..n {
            black_box(key.signing_key().sign(black_box(input.as_bytes())));
        }
        let dalek_us = start.elapsed().as_secs_f64() * 1e6 / f64::from(n);
        println!(
            "round {round}: a whole statement (JSON, base64, aws-lc's signature) {statement_us:.2} µs; \
             ed25519-dalek's signature alone {dalek_us:.2} µs"
        );
    }
}
