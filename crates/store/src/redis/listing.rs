//! ListUnresolved on Redis: walks each agent's lease index (`og:{<agent digest>}:leases`, a
//! sorted set scored by lease expiry) oldest first, and checks each member against its record
//! with `unresolved.lua`, which drops stale members. No key is ever scanned.
//!
//! Listing every agent walks the agents index ([`keys::AGENTS`], a sorted set ordered like the
//! listing: shorter ids first, then bytes), a page visiting a bounded number of agents. It is a
//! hint: it is updated after each grant that opens an agent's lease index ([`super::agents`]; it
//! lives in another slot than the grant's keys, so it cannot be inside the grant's script), and an
//! agent whose update failed (after its retries) is missing from it until its lease index opens
//! again. Agents without a lease index are pruned as the listing meets them. Listing one agent
//! never depends on it.

use super::keys;
use super::{Decoded, RedisStore, classify};
use crate::{ListCursor, Page, Reply, StoreError, Unresolved, list::scan_budget};
use oncegate_domain::{
    ActionKey,
    ledger::{ActionView, Asked, Millis},
};

/// Members fetched from an index per round trip.
const BATCH: usize = 64;

/// What unresolved.lua found for one index member.
#[derive(Debug)]
// Built once per listed member and consumed at once: boxing the view would buy nothing.
#[allow(clippy::large_enum_variant)]
pub(super) enum Checked {
    /// The record is gone, completed or released; the member was removed.
    Stale,
    /// The lease is live: this member and every later one of the agent are not unresolved.
    Live,
    /// The lease ended unresolved, with what its latest grant was asked for (boxed: a view is
    /// large beside the other variants).
    Unresolved(Box<(ActionView, Asked)>),
}

/// An agent's member of the agents index: its id's length (fixed width) then the id, so that the
/// index's byte order is the listing's order.
pub(super) fn agent_member(agent_id: &str) -> String {
    format!("{:010}:{agent_id}", agent_id.len())
}

fn agent_of(member: &str) -> Option<&str> {
    member.split_once(':').map(|(_, agent)| agent)
}

impl RedisStore {
    /// Start-up, once per deployment: copies the agents of the older `og:agents` set into the
    /// agents index, and clears the expiry that unsettled records (and lease indexes) had before
    /// they stopped expiring, then deletes the set.
    pub(super) async fn migrate_agents(&self) -> Result<(), StoreError> {
        let mut exists = redis::cmd("EXISTS");
        exists.arg(keys::OLD_AGENTS);
        if self.query::<i64>(&exists).await? == 0 {
            return Ok(());
        }
        let mut members = redis::cmd("SMEMBERS");
        members.arg(keys::OLD_AGENTS);
        let agents: Vec<String> = self.query(&members).await?;
        for agent in &agents {
            let index = keys::lease_index(agent);
            let mut range = redis::cmd("ZRANGE");
            range.arg(&index).arg(0).arg(-1);
            let entries: Vec<Vec<u8>> = self.query(&range).await?;
            for key in entries.iter().filter_map(|m| ActionKey::decode(m)) {
                let mut persist = redis::cmd("PERSIST");
                persist.arg(keys::record(&key));
                self.query::<i64>(&persist).await?;
            }
            let mut persist = redis::cmd("PERSIST");
            persist.arg(&index);
            self.query::<i64>(&persist).await?;
            let mut add = redis::cmd("ZADD");
            add.arg(keys::AGENTS).arg(0).arg(agent_member(agent));
            self.query::<i64>(&add).await?;
        }
        let mut del = redis::cmd("DEL");
        del.arg(keys::OLD_AGENTS);
        self.query::<i64>(&del).await?;
        tracing::info!(
            agents = agents.len(),
            "migrated the og:agents set to the agents index; unsettled records no longer expire"
        );
        Ok(())
    }

    /// One command with the call deadline.
    pub(super) async fn query<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
    ) -> Result<T, StoreError> {
        let value = tokio::time::timeout(self.options.call_timeout, self.conn.query(cmd))
            .await
            .map_err(|_| StoreError::unavailable("Redis did not answer within the call timeout"))?
            .map_err(classify)?;
        redis::from_redis_value(value)
            .map_err(|e| StoreError::corrupt_by(format!("unexpected reply to {cmd:?}"), e))
    }

    /// Redis's clock, for a listing that ran no script.
    async fn now(&self) -> Result<Millis, StoreError> {
        let (secs, micros): (i64, i64) = self.query(&redis::cmd("TIME")).await?;
        Ok(secs * 1000 + micros / 1000)
    }
}

pub(super) async fn list(
    store: &RedisStore,
    agent_id: Option<&str>,
    after: Option<&ListCursor>,
    limit: usize,
) -> Result<Reply<Page>, StoreError> {
    let mut walk = Walk {
        store,
        page: Page::default(),
        budget: scan_budget(limit),
        limit,
        last: after.cloned(),
        now: None,
    };
    match agent_id {
        Some(agent) => {
            let from = after.map(|c| (c.lease_expires_at, c.key.clone()));
            if !walk.agent(agent, from).await? {
                walk.page.next = Some(walk.resume(agent));
            }
        }
        None => walk.agents(after).await?,
    }
    let now = match walk.now {
        Some(now) => now,
        None => store.now().await?,
    };
    Ok(Reply {
        now,
        result: Ok(walk.page),
        replicas: 0,
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
    /// Where the next page resumes when this one stopped inside `agent`.
    fn resume(&self, agent: &str) -> ListCursor {
        self.last
            .clone()
            .unwrap_or_else(|| ListCursor::start_of(agent))
    }

    /// Lists every agent from the cursor's agent on, in index order. Each agent visited costs one
    /// unit of the page's budget, so a page's work is bounded however many agents have no
    /// unresolved action.
    async fn agents(&mut self, after: Option<&ListCursor>) -> Result<(), StoreError> {
        let mut low = match after {
            Some(c) => format!("[{}", agent_member(&c.agent_id)),
            None => "-".to_owned(),
        };
        loop {
            let mut cmd = redis::cmd("ZRANGEBYLEX");
            cmd.arg(keys::AGENTS)
                .arg(&low)
                .arg("+")
                .arg("LIMIT")
                .arg(0)
                .arg(BATCH);
            let members: Vec<String> = self.store.query(&cmd).await?;
            let fetched = members.len();
            for member in members {
                let Some(agent) = agent_of(&member) else {
                    continue;
                };
                if self.budget == 0 || self.page.items.len() >= self.limit {
                    self.page.next = Some(self.resume(agent));
                    return Ok(());
                }
                self.budget -= 1;
                let from = after
                    .filter(|c| c.agent_id == agent)
                    .map(|c| (c.lease_expires_at, c.key.clone()));
                let examined = self.budget;
                if !self.agent(agent, from).await? {
                    self.page.next = Some(self.resume(agent));
                    return Ok(());
                }
                if self.budget == examined {
                    // Nothing examined: maybe no index left (prune checks).
                    self.prune(agent, &member).await?;
                }
                low = format!("({member}");
            }
            if fetched < BATCH {
                return Ok(());
            }
        }
    }

    /// Removes an agent whose lease index no longer exists from the agents index. A grant may
    /// create the index meanwhile; its own ZADD comes after it, and the second EXISTS puts the
    /// agent back when the grant came between, so no agent with an index is left out.
    async fn prune(&mut self, agent: &str, member: &str) -> Result<(), StoreError> {
        let index = keys::lease_index(agent);
        let mut exists = redis::cmd("EXISTS");
        exists.arg(&index);
        if self.store.query::<i64>(&exists).await? != 0 {
            return Ok(());
        }
        let mut remove = redis::cmd("ZREM");
        remove.arg(keys::AGENTS).arg(member);
        self.store.query::<i64>(&remove).await?;
        if self.store.query::<i64>(&exists).await? != 0 {
            let mut add = redis::cmd("ZADD");
            add.arg(keys::AGENTS).arg(0).arg(member);
            self.store.query::<i64>(&add).await?;
        }
        Ok(())
    }

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
                return Err(StoreError::corrupt("unresolved.lua answered a short list"));
            }
            for ((member, score, key), checked) in fresh.into_iter().zip(checked) {
                if matches!(checked, Checked::Live) {
                    return Ok(true);
                }
                self.budget = self.budget.saturating_sub(1);
                self.last = Some(ListCursor::after(&key, score));
                if let Checked::Unresolved(found) = checked {
                    let (view, asked) = *found;
                    self.page.items.push(Unresolved { key, view, asked });
                }
                from = Some((score, member));
            }
        }
    }
}
