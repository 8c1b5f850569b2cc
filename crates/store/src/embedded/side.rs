//! The embedded store's state beside the records, read and written in the same write transaction
//! as the record of each step: approvals (one per action key, with a per-agent index by lapse
//! time) and budget buckets (one per agent and bucket id).

use std::collections::BTreeMap;

use redb::{ReadableTable, Table};

use super::{
    keys::{agent_prefix, ordered, split_entry},
    wal::{Entry, Table as Logged},
};
use crate::{ApprovalEntry, ApprovalPage, ListCursor, list};
use oncegate_domain::{
    ActionKey,
    ledger::{Approval, Bucket, Side, SideWrite},
    ledger::{Millis, TokenRequest},
};

/// The tables a side read or write needs, and the writes made to them (for the write-ahead log).
pub(super) struct SideTables<'t> {
    pub(super) approvals: Table<'t, &'static [u8], &'static [u8]>,
    pub(super) approval_index: Table<'t, &'static [u8], ()>,
    pub(super) budgets: Table<'t, &'static [u8], &'static [u8]>,
    /// Every insert and removal above, in order; the writer logs them with its batch.
    pub(super) log: Vec<Entry>,
}

fn corrupt(what: &str, e: impl std::fmt::Display) -> redb::Error {
    redb::Error::Corrupted(format!("{what}: {e}"))
}

fn agent_of(key: &[u8]) -> Result<String, redb::Error> {
    ActionKey::decode(key)
        .map(|k| k.agent_id)
        .ok_or_else(|| corrupt("action key", "undecodable"))
}

fn bucket_key(agent: &str, id: &str) -> Vec<u8> {
    let mut out = agent_prefix(agent.as_bytes());
    out.extend_from_slice(id.as_bytes());
    out
}

fn index_entry(agent: &str, expires_at: Millis, key: &[u8]) -> Vec<u8> {
    let mut out = agent_prefix(agent.as_bytes());
    out.extend_from_slice(&ordered(expires_at));
    out.extend_from_slice(key);
    out
}

impl SideTables<'_> {
    /// The stored approval of an action key (lapsed or not: the domain judges).
    pub(super) fn approval(&self, key: &[u8]) -> Result<Option<Approval>, redb::Error> {
        match self.approvals.get(key)? {
            Some(bytes) => rmp_serde::from_slice(bytes.value())
                .map(Some)
                .map_err(|e| corrupt("approval", e)),
            None => Ok(None),
        }
    }

    /// The buckets `ids` of the agent of `key`, as stored.
    pub(super) fn buckets<'i>(
        &self,
        key: &[u8],
        ids: impl IntoIterator<Item = &'i String>,
    ) -> Result<BTreeMap<String, Bucket>, redb::Error> {
        let mut ids = ids.into_iter().peekable();
        let mut out = BTreeMap::new();
        if ids.peek().is_none() {
            return Ok(out);
        }
        let agent = agent_of(key)?;
        for id in ids {
            if let Some(bytes) = self.budgets.get(bucket_key(&agent, id).as_slice())? {
                let bucket =
                    rmp_serde::from_slice(bytes.value()).map_err(|e| corrupt("bucket", e))?;
                out.insert(id.clone(), bucket);
            }
        }
        Ok(out)
    }

    /// What RequestToken reads besides the record: the approval when the rules hold the request,
    /// the buckets it charges.
    pub(super) fn for_token(&self, key: &[u8], req: &TokenRequest) -> Result<Side, redb::Error> {
        Ok(Side {
            approval: match req.hold {
                Some(_) => self.approval(key)?,
                None => None,
            },
            buckets: self.buckets(key, req.charges.iter().map(|c| &c.bucket))?,
        })
    }

    /// Applies a step's side writes: the approval (re-indexed) and the buckets (an empty one is
    /// removed). Lapsed approvals of the agent are dropped on the way.
    pub(super) fn write(
        &mut self,
        key: &[u8],
        side: SideWrite,
        now: Millis,
    ) -> Result<bool, redb::Error> {
        if side.approval.is_none() && side.buckets.is_empty() {
            return Ok(false);
        }
        let agent = agent_of(key)?;
        if let Some(approval) = side.approval {
            if let Some(old) = self.approval(key)? {
                self.unindex(&index_entry(&agent, old.expires_at, key))?;
            }
            let bytes = rmp_serde::to_vec(&approval).map_err(|e| corrupt("approval", e))?;
            self.approvals.insert(key, bytes.as_slice())?;
            self.log
                .push(Entry::new(Logged::Approvals, key, Some(&bytes)));
            let entry = index_entry(&agent, approval.expires_at, key);
            self.approval_index.insert(entry.as_slice(), ())?;
            self.log
                .push(Entry::new(Logged::ApprovalIndex, &entry, Some(&[])));
            self.drop_lapsed(&agent, now)?;
        }
        for (id, bucket) in side.buckets {
            let bkey = bucket_key(&agent, &id);
            if bucket.slots.is_empty() {
                self.budgets.remove(bkey.as_slice())?;
                self.log.push(Entry::new(Logged::Budgets, &bkey, None));
            } else {
                let bytes = rmp_serde::to_vec(&bucket).map_err(|e| corrupt("bucket", e))?;
                self.budgets.insert(bkey.as_slice(), bytes.as_slice())?;
                self.log
                    .push(Entry::new(Logged::Budgets, &bkey, Some(&bytes)));
            }
        }
        Ok(true)
    }

    /// Removes the agent's approvals that lapsed by `now`, with their index entries.
    fn drop_lapsed(&mut self, agent: &str, now: Millis) -> Result<(), redb::Error> {
        let start = agent_prefix(agent.as_bytes());
        let end = index_entry(agent, now + 1, b"");
        let lapsed: Vec<Vec<u8>> = self
            .approval_index
            .range(start.as_slice()..end.as_slice())?
            .take(list::scan_budget(0))
            .map(|e| e.map(|(k, _)| k.value().to_vec()))
            .collect::<Result<_, _>>()?;
        for entry in lapsed {
            self.unindex(&entry)?;
            if let Some((_, _, key)) = split_entry(&entry) {
                self.approvals.remove(key)?;
                self.log.push(Entry::new(Logged::Approvals, key, None));
            }
        }
        Ok(())
    }

    fn unindex(&mut self, entry: &[u8]) -> Result<(), redb::Error> {
        self.approval_index.remove(entry)?;
        self.log
            .push(Entry::new(Logged::ApprovalIndex, entry, None));
        Ok(())
    }

    /// One agent's live approvals after `after`, by lapse time.
    pub(super) fn list(
        &mut self,
        agent: &str,
        after: Option<&ListCursor>,
        limit: usize,
        now: Millis,
    ) -> Result<ApprovalPage, redb::Error> {
        self.drop_lapsed(agent, now)?;
        let start = match after {
            Some(c) => index_entry(agent, c.lease_expires_at, &c.key),
            None => agent_prefix(agent.as_bytes()),
        };
        let prefix = agent_prefix(agent.as_bytes());
        let mut page = ApprovalPage::default();
        for entry in self.approval_index.range(start.as_slice()..)? {
            let (entry, _) = entry?;
            let entry = entry.value();
            if !entry.starts_with(&prefix) {
                break;
            }
            if after.is_some() && entry == start.as_slice() {
                continue;
            }
            let Some((_, expires_at, key)) = split_entry(entry) else {
                continue;
            };
            let Some(action) = ActionKey::decode(key) else {
                continue;
            };
            if page.items.len() >= limit {
                break;
            }
            if let Some(approval) = self.approval(key)? {
                page.next = Some(ListCursor::after(&action, expires_at));
                page.items.push(ApprovalEntry {
                    key: action,
                    approval,
                });
            }
        }
        if page.items.len() < limit {
            page.next = None;
        }
        Ok(page)
    }

    /// Every bucket of one agent.
    pub(super) fn all_buckets(&self, agent: &str) -> Result<Vec<(String, Bucket)>, redb::Error> {
        let prefix = agent_prefix(agent.as_bytes());
        let mut out = Vec::new();
        for entry in self.budgets.range(prefix.as_slice()..)? {
            let (k, v) = entry?;
            let Some(id) = k.value().strip_prefix(prefix.as_slice()) else {
                break;
            };
            let bucket = rmp_serde::from_slice(v.value()).map_err(|e| corrupt("bucket", e))?;
            out.push((String::from_utf8_lossy(id).into_owned(), bucket));
        }
        Ok(out)
    }
}
