//! Store time as a test moves it. The embedded store decides with the clock it is given: on a
//! [`TestClock`] its time passes only when the test advances it, at once. Redis decides with its
//! own `TIME`, which nothing here can move, so on Redis store time passes by waiting. [`StoreTime`]
//! lets a test written once for every store say "let this much store time pass" either way.

use std::{
    sync::{
        Arc,
        atomic::{AtomicI64, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use oncegate_domain::ledger::Millis;
use oncegate_store::embedded::Clock;

/// A clock in Unix milliseconds that moves only when the test moves it. It starts at the system
/// time, so the timestamps a gate returns look like real ones.
#[derive(Clone)]
pub struct TestClock(Arc<AtomicI64>);

impl TestClock {
    /// A clock standing at the system time.
    pub fn new() -> Self {
        Self(Arc::new(AtomicI64::new(system_millis())))
    }

    /// Where the clock stands.
    pub fn now(&self) -> Millis {
        self.0.load(Ordering::SeqCst)
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_millis() as Millis, Ordering::SeqCst);
    }

    /// Moves the clock to `at`, unless it already stands there or later (it never goes back).
    pub fn advance_to(&self, at: Millis) {
        self.0.fetch_max(at, Ordering::SeqCst);
    }

    /// The clock as [`oncegate_store::embedded::EmbeddedStore::open`] takes it.
    pub fn clock(&self) -> Clock {
        let clock = self.clone();
        Arc::new(move || clock.now())
    }
}

impl Default for TestClock {
    fn default() -> Self {
        Self::new()
    }
}

/// How store time passes for a test's store.
#[derive(Clone)]
pub enum StoreTime {
    /// The embedded store on a [`TestClock`]: time passes when the test advances the clock.
    Test(TestClock),
    /// Redis (its `TIME`), or the embedded store on the system clock: time passes by waiting.
    System,
}

/// On the system clock, how far past a timestamp [`StoreTime::pass_beyond`] waits. Redis and this
/// process read the same system clock and a lease ends on a whole millisecond, so this only covers
/// the clock being stepped under the test.
const SYSTEM_MARGIN: Duration = Duration::from_millis(20);

impl StoreTime {
    /// Lets `by` of store time pass: advances the test clock, or sleeps that long.
    pub async fn pass(&self, by: Duration) {
        match self {
            Self::Test(clock) => clock.advance(by),
            Self::System => tokio::time::sleep(by).await,
        }
    }

    /// Lets store time pass until `at` (a timestamp the gate returned, such as a lease's end) is
    /// past: the test clock moves to 1 ms beyond it; on the system clock this sleeps until then
    /// (plus a small margin), and not longer.
    pub async fn pass_beyond(&self, at: prost_types::Timestamp) {
        let at = millis_of(at);
        match self {
            Self::Test(clock) => clock.advance_to(at + 1),
            Self::System => {
                let until = UNIX_EPOCH + Duration::from_millis(at as u64 + 1) + SYSTEM_MARGIN;
                while let Ok(left) = until.duration_since(SystemTime::now()) {
                    tokio::time::sleep(left).await;
                }
            }
        }
    }
}

/// A timestamp the gate returned, in the store's Unix milliseconds.
pub fn millis_of(at: prost_types::Timestamp) -> Millis {
    at.seconds * 1000 + Millis::from(at.nanos) / 1_000_000
}

/// The system time in Unix milliseconds.
fn system_millis() -> Millis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as Millis
}
