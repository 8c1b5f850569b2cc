//! The eviction guard: a Redis that may evict keys (`maxmemory-policy` other than `noeviction`)
//! can drop a COMPLETED record under memory pressure, and the action then runs again. The policy
//! of every node the store writes to (the server, each Cluster master, the master Sentinel names
//! now) is read at start-up, where anything else refuses to start, and again with every health
//! probe, where anything else makes every call fail closed (and health NOT_SERVING) until it is
//! `noeviction` again. `--allow-redis-eviction` turns the refusal into a loud warning.

use std::sync::{
    Mutex,
    atomic::{AtomicBool, Ordering},
};

use redis::Value;

use super::{RedisStore, classify, connection::Conn};
use crate::StoreError;

/// The one policy under which Redis never drops a key it holds.
const SAFE_POLICY: &str = "noeviction";

/// What the last check found: `None` while every node is safe.
#[derive(Debug, Default)]
pub(super) struct Guard {
    unsafe_now: AtomicBool,
    reason: Mutex<Option<String>>,
}

impl Guard {
    /// `Unavailable` with the reason while the last check found an evicting node.
    pub(super) fn check(&self) -> Result<(), StoreError> {
        if !self.unsafe_now.load(Ordering::Acquire) {
            return Ok(());
        }
        let reason = self
            .reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        Err(StoreError::unavailable(reason.unwrap_or_default()))
    }

    fn set(&self, reason: Option<String>) {
        let was = self.unsafe_now.swap(reason.is_some(), Ordering::AcqRel);
        match (&reason, was) {
            (Some(why), false) => tracing::error!("{why}; failing every call closed"),
            (None, true) => tracing::info!("Redis maxmemory-policy is noeviction again; serving"),
            _ => {}
        }
        *self.reason.lock().unwrap_or_else(|e| e.into_inner()) = reason;
    }
}

/// `maxmemory-policy` of every node the store writes to, as `(node, policy)`.
async fn policies(conn: &Conn) -> Result<Vec<(String, String)>, redis::RedisError> {
    let mut get = redis::cmd("CONFIG");
    get.arg("GET").arg("maxmemory-policy");
    let answers = conn.query_writable_nodes(&get).await?;
    let mut out = Vec::with_capacity(answers.len());
    for (node, value) in answers {
        if let Value::ServerError(e) = &value {
            return Err(redis::RedisError::from(e.clone()));
        }
        let pair: Vec<String> = redis::from_redis_value(value)?;
        let policy = pair.get(1).cloned().unwrap_or_default();
        out.push((node, policy));
    }
    Ok(out)
}

/// The complaint about `found`, or `None` when every node is safe.
fn judge(found: &[(String, String)]) -> Option<String> {
    let evicting: Vec<String> = found
        .iter()
        .filter(|(_, policy)| policy != SAFE_POLICY)
        .map(|(node, policy)| format!("{node}: {policy}"))
        .collect();
    (!evicting.is_empty()).then(|| {
        format!(
            "Redis maxmemory-policy is not noeviction ({}): under memory pressure Redis would \
             evict records, and an evicted completion runs its action again. Set \
             `maxmemory-policy noeviction` (or pass --allow-redis-eviction to accept the risk)",
            evicting.join(", ")
        )
    })
}

impl RedisStore {
    /// At start-up: `Misconfigured` when a node may evict (or its policy cannot be read) and the
    /// operator did not allow it.
    pub(super) async fn check_eviction_at_start(&self) -> Result<(), StoreError> {
        let found = match policies(&self.conn).await {
            Ok(found) => found,
            Err(e) if self.options.allow_eviction => {
                tracing::warn!(error = %e, "could not read Redis maxmemory-policy; allowed by --allow-redis-eviction");
                return Ok(());
            }
            Err(e) if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() => {
                return Err(classify(e));
            }
            Err(e) => {
                return Err(StoreError::Misconfigured(format!(
                    "could not read Redis maxmemory-policy ({e}); an evicting Redis forgets \
                     completions. Make sure it is noeviction, then pass --allow-redis-eviction"
                )));
            }
        };
        match judge(&found) {
            None => Ok(()),
            Some(why) if self.options.allow_eviction => {
                tracing::warn!("UNSAFE, allowed by --allow-redis-eviction: {why}");
                Ok(())
            }
            Some(why) => Err(StoreError::Misconfigured(why)),
        }
    }

    /// With every health probe: an evicting node seen now fails every call closed until the
    /// policy is safe again (unless allowed). Errors reading it are the probe's own failure.
    pub(super) async fn recheck_eviction(&self) -> Result<(), StoreError> {
        let found = policies(&self.conn).await.map_err(classify)?;
        let complaint = judge(&found);
        if self.options.allow_eviction {
            return Ok(());
        }
        self.eviction.set(complaint);
        self.eviction.check()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_noeviction_is_safe_and_the_complaint_names_the_nodes() {
        let safe = [("a".to_owned(), "noeviction".to_owned())];
        assert_eq!(judge(&safe), None);
        let mixed = [
            ("a".to_owned(), "noeviction".to_owned()),
            ("b:7001".to_owned(), "allkeys-lru".to_owned()),
        ];
        let why = judge(&mixed).unwrap();
        assert!(why.contains("b:7001: allkeys-lru"), "{why}");
        assert!(!why.contains("a: noeviction"), "{why}");
    }

    #[test]
    fn the_guard_fails_closed_until_cleared() {
        let guard = Guard::default();
        assert!(guard.check().is_ok());
        guard.set(Some("evicting".into()));
        assert!(
            matches!(guard.check(), Err(StoreError::Unavailable { what, .. }) if what == "evicting")
        );
        guard.set(None);
        assert!(guard.check().is_ok());
    }
}
