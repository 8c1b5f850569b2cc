//! Budgets and velocity caps, pure: how much of a window a bucket has used, whether a grant fits,
//! and what it reserves. A velocity cap is a budget whose every grant weighs 1.
//!
//! A window is counted in [`SLOTS`] slots of `window / SLOTS` each (at least 1 ms): a grant adds
//! its amount to the slot it falls in, and a slot counts while any part of it is inside the
//! window. So a grant counts for at least the window and at most the window plus one slot: never
//! more than the limit in any window, and memory per bucket bounded by the slot count, however
//! many grants. Amounts are integers (the param scaled by the budget's decimals), exact in Lua's
//! doubles below 2^53.

use serde::{Deserialize, Serialize};

use super::Millis;

/// How many slots one window is counted in.
pub const SLOTS: i64 = 60;

/// The largest limit or amount a budget takes, so that every sum stays exact in a double.
pub const MAX_UNITS: u64 = 1 << 50;

/// One grant's charge on one budget bucket, computed by the gate from the configuration and the
/// request's params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    /// The bucket's id within the agent: unique per (budget, action when per action, group).
    pub bucket: String,
    /// The budget's name (refusals and metrics).
    pub budget: String,
    /// The action when the budget counts per agent and action; empty otherwise (display).
    pub action: String,
    /// The group value (a currency) when the budget groups; empty otherwise (display).
    pub group: String,
    /// The most the window may hold.
    pub limit: u64,
    pub window: Millis,
    /// What this grant weighs (1 for a velocity cap).
    pub amount: u64,
}

/// One bucket's spending: `(slot start, amount)`, oldest first, only slots still in a window.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bucket {
    /// The action (per-action budgets) and the group value, for the operator read.
    pub action: String,
    pub group: String,
    pub slots: Vec<(Millis, u64)>,
}

/// What a grant reserved in one bucket: returned by a Release of that grant, final otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    /// The fencing number of the grant that reserved it.
    pub fencing: u64,
    pub bucket: String,
    /// The start of the slot it was added to.
    pub slot: Millis,
    pub amount: u64,
}

/// A grant that does not fit: the budget, what its window holds and allows and what the grant
/// would add (in the budget's units), and when enough of the window frees up (`None` when the
/// amount alone is above the limit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exceeded {
    pub budget: String,
    pub retry_after: Option<Millis>,
    pub used: u64,
    pub limit: u64,
    pub requested: u64,
}

/// The slot length of a window.
pub fn slot_len(window: Millis) -> Millis {
    ((window + SLOTS - 1) / SLOTS).max(1)
}

/// Whether a slot starting at `start` still counts at `now` for a window.
fn counts(start: Millis, window: Millis, now: Millis) -> bool {
    start + slot_len(window) > now - window
}

impl Bucket {
    /// What the window ending at `now` holds.
    pub fn used(&self, window: Millis, now: Millis) -> u64 {
        self.slots
            .iter()
            .filter(|(start, _)| counts(*start, window, now))
            .map(|(_, amount)| amount)
            .sum()
    }

    /// When the oldest slot still counting stops counting (`None` when nothing counts).
    pub fn next_release(&self, window: Millis, now: Millis) -> Option<Millis> {
        self.slots
            .iter()
            .find(|(start, _)| counts(*start, window, now))
            .map(|(start, _)| start + slot_len(window) + window)
    }

    /// How long until `amount` more fits under `limit`.
    fn fits_in(&self, limit: u64, amount: u64, window: Millis, now: Millis) -> Option<Millis> {
        if amount > limit {
            return None;
        }
        let mut used = self.used(window, now);
        for (start, spent) in self.slots.iter().filter(|(s, _)| counts(*s, window, now)) {
            used -= spent;
            if used + amount <= limit {
                return Some((start + slot_len(window) + window - now).max(1));
            }
        }
        Some(1)
    }

    /// Forgets the slots no window counts any more.
    fn prune(&mut self, window: Millis, now: Millis) {
        self.slots.retain(|(start, _)| counts(*start, window, now));
    }

    /// Gives back `amount` to the slot starting at `slot` (nothing when it no longer counts).
    pub fn give_back(&mut self, slot: Millis, amount: u64) {
        if let Some(entry) = self.slots.iter_mut().find(|(start, _)| *start == slot) {
            entry.1 = entry.1.saturating_sub(amount);
        }
        self.slots.retain(|(_, amount)| *amount > 0);
    }
}

/// Charges a grant to every bucket it touches, all or nothing: `Err` (and `buckets` unchanged)
/// when one would exceed its limit, else the reservations made (`fencing` is the grant's).
/// `buckets` holds the stored state of each charged bucket (absent: nothing used).
pub fn charge(
    buckets: &mut std::collections::BTreeMap<String, Bucket>,
    charges: &[Charge],
    fencing: u64,
    now: Millis,
) -> Result<Vec<Reservation>, Exceeded> {
    for c in charges {
        let bucket = buckets.get(&c.bucket).cloned().unwrap_or_default();
        let used = bucket.used(c.window, now);
        if used + c.amount > c.limit {
            return Err(Exceeded {
                budget: c.budget.clone(),
                retry_after: bucket.fits_in(c.limit, c.amount, c.window, now),
                used,
                limit: c.limit,
                requested: c.amount,
            });
        }
    }
    let mut reserved = Vec::with_capacity(charges.len());
    for c in charges {
        let bucket = buckets.entry(c.bucket.clone()).or_default();
        bucket.action.clone_from(&c.action);
        bucket.group.clone_from(&c.group);
        bucket.prune(c.window, now);
        let slot = now.div_euclid(slot_len(c.window)) * slot_len(c.window);
        match bucket.slots.last_mut() {
            Some((start, amount)) if *start == slot => *amount += c.amount,
            _ => bucket.slots.push((slot, c.amount)),
        }
        reserved.push(Reservation {
            fencing,
            bucket: c.bucket.clone(),
            slot,
            amount: c.amount,
        });
    }
    Ok(reserved)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    const HOUR: Millis = 3_600_000;

    fn eur(amount: u64) -> Charge {
        Charge {
            bucket: "b".into(),
            budget: "eur".into(),
            action: String::new(),
            group: "EUR".into(),
            limit: 100,
            window: HOUR,
            amount,
        }
    }

    #[test]
    fn sixty_and_forty_fit_one_more_does_not_until_the_window_passes() {
        let mut b = BTreeMap::new();
        charge(&mut b, &[eur(60)], 1, 1_000).unwrap();
        charge(&mut b, &[eur(40)], 2, 2_000).unwrap();
        let refused = charge(&mut b, &[eur(1)], 3, 3_000).unwrap_err();
        assert_eq!(refused.budget, "eur");
        // The 60 went into the first slot [0, 60 s): it stops counting once that slot leaves the
        // window.
        assert_eq!(refused.retry_after, Some(slot_len(HOUR) + HOUR - 3_000));
        assert_eq!(b["b"].used(HOUR, 3_000), 100);
        let later = slot_len(HOUR) + HOUR;
        assert_eq!(b["b"].used(HOUR, later), 0);
        charge(&mut b, &[eur(1)], 3, later).unwrap();
    }

    #[test]
    fn a_given_back_reservation_frees_its_amount() {
        let mut b = BTreeMap::new();
        let r = charge(&mut b, &[eur(60)], 1, 1_000).unwrap();
        let r2 = charge(&mut b, &[eur(40)], 2, 90_000).unwrap();
        b.get_mut("b").unwrap().give_back(r2[0].slot, 40);
        assert_eq!(b["b"].used(HOUR, 100_000), 60);
        assert_eq!(r[0].amount, 60);
        charge(&mut b, &[eur(40)], 3, 100_000).unwrap();
    }

    #[test]
    fn all_or_nothing_across_buckets_and_too_large_never_fits() {
        let mut b = BTreeMap::new();
        let count = Charge {
            bucket: "c".into(),
            budget: "count".into(),
            limit: 1,
            amount: 1,
            ..eur(1)
        };
        charge(&mut b, std::slice::from_ref(&count), 1, 0).unwrap();
        let before = b.clone();
        let refused = charge(&mut b, &[eur(10), count], 2, 10).unwrap_err();
        assert_eq!(refused.budget, "count");
        assert_eq!(b, before);
        assert_eq!(
            charge(&mut b, &[eur(101)], 3, 10).unwrap_err().retry_after,
            None
        );
    }

    #[test]
    fn a_grant_counts_at_least_the_window_and_at_most_one_slot_more() {
        for at in [0, 1, 59_999, 60_000, 1_234_567] {
            let mut b = BTreeMap::new();
            charge(&mut b, &[eur(100)], 1, at).unwrap();
            assert_eq!(b["b"].used(HOUR, at + HOUR - 1), 100);
            assert_eq!(b["b"].used(HOUR, at + HOUR + slot_len(HOUR)), 0);
        }
    }
}
