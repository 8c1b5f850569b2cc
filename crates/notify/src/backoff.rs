//! When a failed delivery is tried again: exponential backoff with jitter, capped. Attempt `n`
//! (1 for the first retry) waits between half and all of `min(max, initial × 2^(n-1))`, so that
//! many events failing together (a receiver down) do not come back together.

use oncegate_domain::ledger::Millis;

/// The delay before the retry after `attempts` failed attempts, `random` a uniform value in
/// `[0, 1)` (the caller's randomness; tests pass their own).
pub fn delay(attempts: u32, initial: Millis, max: Millis, random: f64) -> Millis {
    let doublings = attempts.saturating_sub(1).min(62);
    let ceiling = initial
        .max(1)
        .saturating_mul(1i64 << doublings.min(40))
        .min(max.max(1));
    let half = ceiling / 2;
    half + ((ceiling - half) as f64 * random.clamp(0.0, 1.0)) as Millis
}

/// A uniform value in `[0, 1)` from the system's randomness.
pub fn random() -> f64 {
    (uuid::Uuid::new_v4().as_u128() >> 75) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_per_attempt_within_the_jitter_and_stops_at_the_cap() {
        for (attempts, low, high) in [
            (1, 500, 1000),
            (2, 1000, 2000),
            (3, 2000, 4000),
            (6, 16_000, 32_000),
            (7, 30_000, 60_000),
            (40, 30_000, 60_000),
            (u32::MAX, 30_000, 60_000),
        ] {
            assert_eq!(
                delay(attempts, 1000, 60_000, 0.0),
                low,
                "attempt {attempts}"
            );
            assert!(delay(attempts, 1000, 60_000, 0.999_999) <= high);
            assert!(delay(attempts, 1000, 60_000, 0.999_999) > high - 2);
        }
    }

    #[test]
    fn randomness_spreads_the_delays() {
        let samples: Vec<f64> = (0..200).map(|_| random()).collect();
        assert!(samples.iter().all(|r| (0.0..1.0).contains(r)));
        let distinct = samples
            .iter()
            .map(|r| delay(3, 1000, 60_000, *r))
            .collect::<std::collections::BTreeSet<_>>();
        assert!(distinct.len() > 100, "{}", distinct.len());
    }
}
