//! Runs one payment at most once through the guard, against a gate on 127.0.0.1:50051
//! (start one with `make run`), then runs it "again" the way a retrying agent would.
//!
//! ```sh
//! cargo run -p oncegate-client --example guard -- 127.0.0.1:50051
//! ```

use oncegate_client::{ActionSpec, Failure, GateClient, GuardOptions, Outcome};

/// A stand-in for a payment provider call that honours the provider key.
async fn pay(amount: u64, provider_key: &str) -> Result<String, Failure<String>> {
    if amount == 0 {
        // The provider rejected it outright: definitely no effect, so the token may be released.
        return Err(Failure::Definite("amount must be positive".into()));
    }
    Ok(format!("tx-{}", &provider_key[3..15]))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let target = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:50051".into());
    let gate = GateClient::connect(format!("http://{target}")).await?;
    let spec = ActionSpec::new(
        "billing-agent",
        "run-42",
        "payments.transfer",
        r#"{"amount":100,"to":"DE89"}"#,
    )
    .idempotency_key("invoice-1001");

    for attempt in 1..=2 {
        let outcome = gate
            .run_once(&spec, &GuardOptions::default(), |grant| async move {
                let tx = pay(100, &grant.provider_key).await?;
                Ok::<_, Failure<String>>(tx.into_bytes())
            })
            .await?;
        match outcome {
            Outcome::Executed { receipt, grant } => println!(
                "attempt {attempt}: paid (fencing {}), receipt {}",
                grant.fencing,
                String::from_utf8_lossy(&receipt)
            ),
            Outcome::Replayed(done) => println!(
                "attempt {attempt}: already paid, nothing ran; original receipt {}",
                String::from_utf8_lossy(&done.receipt)
            ),
        }
    }
    Ok(())
}
