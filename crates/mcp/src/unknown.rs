//! What this gateway saw end with an unknown outcome: the actions whose call it forwarded and then
//! lost (the upstream died, timed out, or the client cancelled), each with why.
//!
//! The gate cannot tell such an attempt from one still running until its lease ends: both hold a
//! live lease, so a retry hears "in progress". The gateway that lost the attempt knows better,
//! and answers a retry at once with the unknown outcome instead of waiting for a result that is
//! not coming. Only a hint for the answer: the gate is still asked first, and whatever it answers
//! beyond "in progress" (a replay after an operator settled it, a new grant after a release)
//! wins, and ends the entry. Kept in memory, at most [`CAPACITY`] actions, oldest dropped first.

use std::{
    collections::{HashMap, VecDeque},
    sync::Mutex,
};

use oncegate_domain::ActionKey;

/// The most actions remembered.
pub const CAPACITY: usize = 10_000;

/// One attempt whose outcome is unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost {
    /// Its fencing number (the attempt, as an operator sees it).
    pub fencing: u64,
    /// What happened to it.
    pub why: String,
}

/// The attempts this gateway lost, by action.
#[derive(Debug, Default)]
pub struct Unknowns {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    lost: HashMap<ActionKey, Lost>,
    order: VecDeque<ActionKey>,
}

impl Unknowns {
    /// Remembers that the attempt at `key` was lost.
    pub fn remember(&self, key: ActionKey, lost: Lost) {
        let mut inner = self.inner.lock().unwrap();
        if inner.lost.insert(key.clone(), lost).is_none() {
            inner.order.push_back(key);
        }
        while inner.lost.len() > CAPACITY {
            let Some(oldest) = inner.order.pop_front() else {
                break;
            };
            inner.lost.remove(&oldest);
        }
    }

    /// The lost attempt at `key`, if this gateway lost one.
    pub fn get(&self, key: &ActionKey) -> Option<Lost> {
        self.inner.lock().unwrap().lost.get(key).cloned()
    }

    /// The gate has settled `key` (or granted it anew): nothing to remember any more.
    pub fn forget(&self, key: &ActionKey) {
        let mut inner = self.inner.lock().unwrap();
        if inner.lost.remove(key).is_some() {
            inner.order.retain(|k| k != key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: usize) -> ActionKey {
        ActionKey::new("a", "r", format!("k{n}"))
    }

    #[test]
    fn remembers_until_forgotten_and_drops_the_oldest_beyond_capacity() {
        let unknowns = Unknowns::default();
        let lost = |fencing| Lost {
            fencing,
            why: "died".into(),
        };
        for n in 0..=CAPACITY {
            unknowns.remember(key(n), lost(n as u64));
        }
        assert_eq!(unknowns.get(&key(0)), None, "the oldest went first");
        assert_eq!(unknowns.get(&key(1)), Some(lost(1)));
        assert_eq!(unknowns.get(&key(CAPACITY)), Some(lost(CAPACITY as u64)));
        unknowns.forget(&key(1));
        assert_eq!(unknowns.get(&key(1)), None);
        unknowns.remember(key(1), lost(9));
        assert_eq!(unknowns.get(&key(1)), Some(lost(9)));
    }
}
