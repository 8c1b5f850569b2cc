//! The webhook outbox on Redis ([`crate::outbox`]): one script per step over the `og:{outbox}`
//! keys ([`keys::OUTBOX_ENTRIES`] and its indexes, one hash tag, so one Cluster slot), on Redis's
//! clock. The listing reads the undeliverable index a batch at a time and the entries by script.

use super::{Decoded, RedisStore, keys, unexpected};
use crate::{
    Claimed, ListCursor, NewEntry, OutboxPage, Reply, Settlement, StoreError,
    outbox::{self, PURGE_BATCH},
};
use oncegate_domain::ledger::Millis;

/// Members read from the undeliverable index per round trip, beyond the page.
const BATCH: usize = 64;

impl RedisStore {
    pub async fn outbox_append(&self, entries: &[NewEntry]) -> Result<Reply<u32>, StoreError> {
        let mut invocation = self.scripts.outbox_append.key(keys::OUTBOX_ENTRIES);
        invocation.key(keys::OUTBOX_DUE);
        for e in entries {
            invocation
                .arg(outbox::member(&e.webhook, &e.id))
                .arg(&e.webhook)
                .arg(&e.id)
                .arg(&e.event_type)
                .arg(&e.body);
        }
        match self.invoke(invocation).await? {
            (now, Decoded::Appended(n)) => Ok(replied(now, n)),
            (_, other) => Err(unexpected("outbox_append", &other)),
        }
    }

    pub async fn outbox_claim(
        &self,
        limit: usize,
        lease: Millis,
        claim: &str,
    ) -> Result<Reply<Claimed>, StoreError> {
        let mut invocation = self.scripts.outbox_claim.key(keys::OUTBOX_ENTRIES);
        invocation
            .key(keys::OUTBOX_DUE)
            .key(keys::OUTBOX_DEAD)
            .key(keys::OUTBOX_KEEP)
            .arg(limit)
            .arg(lease)
            .arg(claim)
            .arg(PURGE_BATCH);
        match self.invoke(invocation).await? {
            (now, Decoded::Outbox(entries, pending, undeliverable)) => Ok(replied(
                now,
                Claimed {
                    entries: entries.into_iter().flatten().collect(),
                    pending,
                    undeliverable,
                },
            )),
            (_, other) => Err(unexpected("outbox_claim", &other)),
        }
    }

    pub async fn outbox_settle(
        &self,
        webhook: &str,
        id: &str,
        claim: &str,
        settlement: &Settlement,
        keep: Millis,
    ) -> Result<Reply<bool>, StoreError> {
        let (outcome, due_at, error) = match settlement {
            Settlement::Delivered => ("delivered", 0, ""),
            Settlement::Retry { due_at, error } => ("retry", *due_at, error.as_str()),
            Settlement::Undeliverable { error } => ("undeliverable", 0, error.as_str()),
        };
        let mut invocation = self.scripts.outbox_settle.key(keys::OUTBOX_ENTRIES);
        invocation
            .key(keys::OUTBOX_DUE)
            .key(keys::OUTBOX_DEAD)
            .key(keys::OUTBOX_KEEP)
            .arg(outbox::member(webhook, id))
            .arg(claim)
            .arg(outcome)
            .arg(due_at)
            .arg(error)
            .arg(keep);
        match self.invoke(invocation).await? {
            (now, Decoded::OutboxSettled(changed)) => Ok(replied(now, changed)),
            (_, other) => Err(unexpected("outbox_settle", &other)),
        }
    }

    /// Undeliverable entries after `after`, by (when given up, member).
    pub async fn outbox_undeliverable(
        &self,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<Reply<OutboxPage>, StoreError> {
        self.eviction.check()?;
        let mut from = after.map(|c| (c.lease_expires_at, c.key.clone()));
        let mut members: Vec<(Vec<u8>, Millis)> = Vec::new();
        loop {
            let min = from
                .as_ref()
                .map_or("-inf".to_owned(), |(s, _)| s.to_string());
            let mut range = redis::cmd("ZRANGE");
            range
                .arg(keys::OUTBOX_DEAD)
                .arg(&min)
                .arg("+inf")
                .arg("BYSCORE")
                .arg("LIMIT")
                .arg(0)
                .arg(BATCH + limit)
                .arg("WITHSCORES");
            let entries: Vec<(Vec<u8>, f64)> = self.query(&range).await?;
            let fetched = entries.len();
            let mut last = None;
            for (member, score) in entries {
                let position = (score as Millis, member);
                if from.as_ref().is_none_or(|f| position > *f) {
                    last = Some(position.clone());
                    if members.len() < limit {
                        members.push((position.1, position.0));
                    }
                }
            }
            if members.len() >= limit || fetched < BATCH + limit || last.is_none() {
                break;
            }
            from = last;
        }
        let mut invocation = self.scripts.outbox_read.key(keys::OUTBOX_ENTRIES);
        invocation.key(keys::OUTBOX_DUE).key(keys::OUTBOX_DEAD);
        for (member, _) in &members {
            invocation.arg(member.as_slice());
        }
        let (now, decoded) = self.invoke(invocation).await?;
        let Decoded::Outbox(found, pending, undeliverable) = decoded else {
            return Err(unexpected("outbox_read", &decoded));
        };
        let mut page = OutboxPage {
            pending,
            undeliverable,
            ..OutboxPage::default()
        };
        for ((member, score), entry) in members.into_iter().zip(found) {
            if let Some(entry) = entry {
                page.next = Some(ListCursor {
                    agent_id: String::new(),
                    lease_expires_at: score,
                    key: member,
                });
                page.items.push(entry);
            }
        }
        if page.items.len() < limit {
            page.next = None;
        }
        Ok(replied(now, page))
    }
}

fn replied<T>(now: Millis, value: T) -> Reply<T> {
    Reply {
        now,
        result: Ok(value),
        replicas: 0,
    }
}
