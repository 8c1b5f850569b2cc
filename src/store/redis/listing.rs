//! ListUnresolved on Redis: walks each agent's lease index (`og:{<agent digest>}:leases`, a
//! sorted set scored by lease expiry) oldest first, and checks each member against its record
//! with `unresolved.lua`, which drops stale members. No key is ever scanned.
//!
//! Listing every agent uses the `og:agents` set, a hint: it is updated after a new grant (it
//! lives in another slot than the grant's keys, so it cannot be inside the grant's script), and
//! an agent whose only grant happened while that update failed is missing from it until its next
//! grant. Listing one agent never depends on it.

use std::{collections::HashSet, sync::Mutex};

use super::keys;
use super::{Decoded, RedisStore, classify};
use crate::{
    domain::{
        ActionKey,
        ledger::{ActionView, Millis},
    },
    store::{ListCursor, Page, Reply, StoreError, Unresolved, list::scan_budget},
};

/// Members fetched from an index per round trip.
const BATCH: usize = 64;
/// Past this many remembered agents the memory is cleared (it only saves round trips).
const MAX_SEEN: usize = 100_000;

/// What unresolved.lua found for one index member.
#[derive(Debug)]
pub(super) enum Checked {
    /// The record is gone, completed or released; the member was removed.
    Stale,
    /// The lease is live: this member and every later one of the agent are not unresolved.
    Live,
    /// The lease ended unresolved.
    Unresolved(ActionView),
}

/// The agents this process already added to `og:agents`.
#[derive(Debug, Default)]
pub(super) struct SeenAgents(Mutex<HashSet<String>>);

impl RedisStore {
    /// Adds `agent_id` to the `og:agents` hint set once per process. Failures are logged and
    /// ignored: the grant itself has happened, and listing one agent does not need the set.
    pub(super) async fn remember_agent(&self, agent_id: &str) {
        {
            let seen = self.agents_seen.0.lock().unwrap_or_else(|e| e.into_inner());
            if seen.contains(agent_id) {
                return;
            }
        }
        let mut cmd = redis::cmd("SADD");
        cmd.arg(keys::AGENTS).arg(agent_id);
        match self.query::<i64>(&cmd).await {
            Ok(_) => {
                let mut seen = self.agents_seen.0.lock().unwrap_or_else(|e| e.into_inner());
                if seen.len() >= MAX_SEEN {
                    seen.clear();
                }
                seen.insert(agent_id.to_owned());
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not add the agent to the og:agents hint set")
            }
        }
    }

    /// One command with the call deadline.
    async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, StoreError> {
        let value = tokio::time::timeout(self.options.call_timeout, self.conn.query(cmd))
            .await
            .map_err(|_| {
                StoreError::Unavailable("Redis did not answer within the call timeout".into())
            })?
            .map_err(classify)?;
        redis::from_redis_value(value)
            .map_err(|e| StoreError::Corrupt(format!("unexpected reply to {cmd:?}: {e}")))
    }

    /// Redis's clock, for a listing that ran no script.
    async fn now(&self) -> Result<Millis, StoreError> {
        let (secs, micros): (i64, i64) = self.query(&redis::cmd("TIME")).await?;
        Ok(secs * 1000 + micros / 1000)
    }
}

/// Agents in the order both stores list them: by length, then bytes.
fn agent_order(a: &String, b: &String) -> std::cmp::Ordering {
    (a.len(), a.as_bytes()).cmp(&(b.len(), b.as_bytes()))
}

pub(super) async fn list(
    store: &RedisStore,
    agent_id: Option<&str>,
    after: Option<&ListCursor>,
    limit: usize,
) -> Result<Reply<Page>, StoreError> {
    let agents = match agent_id {
        Some(agent) => vec![agent.to_owned()],
        None => {
            let mut cmd = redis::cmd("SMEMBERS");
            cmd.arg(keys::AGENTS);
            let mut all: Vec<String> = store.query(&cmd).await?;
            all.sort_by(agent_order);
            if let Some(c) = after {
                all.retain(|a| agent_order(a, &c.agent_id).is_ge());
            }
            all
        }
    };
    let mut walk = Walk {
        store,
        page: Page::default(),
        budget: scan_budget(limit),
        limit,
        last: after.cloned(),
        now: None,
    };
    for agent in agents {
        let from = after
            .filter(|c| c.agent_id == agent)
            .map(|c| (c.lease_expires_at, c.key.clone()));
        if !walk.agent(&agent, from).await? {
            let resume = walk
                .last
                .clone()
                .unwrap_or_else(|| ListCursor::start_of(&agent));
            walk.page.next = Some(resume);
            break;
        }
    }
    let now = match walk.now {
        Some(now) => now,
        None => store.now().await?,
    };
    Ok(Reply {
        now,
        result: Ok(walk.page),
    })
}

/// The state of one listing call.
struct Walk<'a> {
    store: &'a RedisStore,
    page: Page,
    budget: usize,
    limit: usize,
    /// The last index entry examined: where the next page resumes.
    last: Option<ListCursor>,
    now: Option<Millis>,
}

impl Walk<'_> {
    /// Lists one agent's unresolved actions after `from`. False when the page filled up (or the
    /// scan budget ran out) before the agent's index was exhausted.
    async fn agent(
        &mut self,
        agent: &str,
        mut from: Option<(Millis, Vec<u8>)>,
    ) -> Result<bool, StoreError> {
        let index = keys::lease_index(agent);
        let mut offset = 0;
        loop {
            if self.page.items.len() >= self.limit || self.budget == 0 {
                return Ok(false);
            }
            let mut cmd = redis::cmd("ZRANGEBYSCORE");
            cmd.arg(&index)
                .arg(
                    from.as_ref()
                        .map_or("-inf".to_owned(), |(l, _)| l.to_string()),
                )
                .arg("+inf")
                .arg("WITHSCORES")
                .arg("LIMIT")
                .arg(offset)
                .arg(BATCH);
            let entries: Vec<(Vec<u8>, f64)> = self.store.query(&cmd).await?;
            let fetched = entries.len();
            let room = (self.limit - self.page.items.len()).min(self.budget);
            let fresh: Vec<(Vec<u8>, Millis, ActionKey)> = entries
                .into_iter()
                .map(|(member, score)| (member, score as Millis))
                .filter(|(member, score)| {
                    from.as_ref()
                        .is_none_or(|(l, k)| (*score, member.as_slice()) > (*l, k.as_slice()))
                })
                .filter_map(|(member, score)| {
                    let key = ActionKey::decode(&member)?;
                    (key.agent_id == agent).then_some((member, score, key))
                })
                .take(room)
                .collect();
            if fresh.is_empty() {
                if fetched < BATCH {
                    return Ok(true);
                }
                // A full batch of entries at or before the cursor (ties on one millisecond).
                offset += fetched;
                continue;
            }
            offset = 0;
            let mut invocation = self.store.scripts.unresolved.key(&index);
            for (member, _, key) in &fresh {
                invocation.key(keys::record(key)).arg(member.as_slice());
            }
            let (now, decoded) = self.store.invoke(invocation).await?;
            self.now = Some(now);
            let Decoded::Checked(checked) = decoded else {
                return Err(super::unexpected("unresolved", &decoded));
            };
            if checked.len() != fresh.len() {
                return Err(StoreError::Corrupt(
                    "unresolved.lua answered a short list".into(),
                ));
            }
            for ((member, score, key), checked) in fresh.into_iter().zip(checked) {
                if matches!(checked, Checked::Live) {
                    return Ok(true);
                }
                self.budget = self.budget.saturating_sub(1);
                self.last = Some(ListCursor::after(&key, score));
                if let Checked::Unresolved(view) = checked {
                    self.page.items.push(Unresolved { key, view });
                }
                from = Some((score, member));
            }
        }
    }
}
