//! The embedded store's webhook outbox ([`crate::outbox`]): four tables of the same file, written
//! in the writer's transaction (so the same group commit and write-ahead log), never reading or
//! writing an action record. Entries by member; a due index (`due_at ++ member`, pending entries
//! only) that claims read in order; an index of undeliverable entries by when they were given up
//! (the listing); a retention index (`forget_at ++ member`) of settled entries, purged a bounded
//! batch per claim.

use redb::{ReadableTable, ReadableTableMetadata, Table, TableDefinition, WriteTransaction};

use super::{
    keys::ordered,
    wal::{Entry, Table as Logged},
};
use crate::{
    ListCursor,
    outbox::{self, Claimed, NewEntry, OutboxEntry, OutboxPage, OutboxState, Settlement},
};
use oncegate_domain::ledger::Millis;

/// member → entry ([`OutboxEntry::encode`]).
const ENTRIES: TableDefinition<&[u8], &[u8]> = TableDefinition::new("outbox");
/// due_at (ordered) ++ member → (): pending entries.
const DUE: TableDefinition<&[u8], ()> = TableDefinition::new("outbox_due");
/// settled_at (ordered) ++ member → (): undeliverable entries.
const DEAD: TableDefinition<&[u8], ()> = TableDefinition::new("outbox_dead");
/// forget_at (ordered) ++ member → (): settled entries, forgotten after the retention.
const KEEP: TableDefinition<&[u8], ()> = TableDefinition::new("outbox_keep");

/// The outbox tables of one write transaction.
pub(super) struct OutboxTables<'t> {
    entries: Table<'t, &'static [u8], &'static [u8]>,
    due: Table<'t, &'static [u8], ()>,
    dead: Table<'t, &'static [u8], ()>,
    keep: Table<'t, &'static [u8], ()>,
    /// Every insert and removal, in order; the writer logs them with its batch.
    pub(super) log: Vec<Entry>,
}

/// An index entry: the time, ordered, then the member.
fn at(ms: Millis, member: &[u8]) -> Vec<u8> {
    let mut out = ordered(ms).to_vec();
    out.extend_from_slice(member);
    out
}

fn corrupt(e: crate::StoreError) -> redb::Error {
    redb::Error::Corrupted(e.to_string())
}

impl<'t> OutboxTables<'t> {
    pub(super) fn open(txn: &'t WriteTransaction) -> Result<Self, redb::Error> {
        Ok(Self {
            entries: txn.open_table(ENTRIES)?,
            due: txn.open_table(DUE)?,
            dead: txn.open_table(DEAD)?,
            keep: txn.open_table(KEEP)?,
            log: Vec::new(),
        })
    }

    fn index(&mut self, table: Logged, key: &[u8], insert: bool) -> Result<(), redb::Error> {
        let target = match table {
            Logged::OutboxDue => &mut self.due,
            Logged::OutboxDead => &mut self.dead,
            _ => &mut self.keep,
        };
        match insert {
            true => drop(target.insert(key, ())?),
            false => drop(target.remove(key)?),
        }
        self.log.push(Entry::new(table, key, insert.then_some(&[])));
        Ok(())
    }

    /// Writes `new` over `old` (as stored), keeping the due and undeliverable indexes in step.
    fn put(&mut self, old: Option<&OutboxEntry>, new: &OutboxEntry) -> Result<(), redb::Error> {
        let member = new.member();
        if let Some(old) = old {
            match old.state {
                OutboxState::Pending => {
                    self.index(Logged::OutboxDue, &at(old.due_at, &member), false)?
                }
                OutboxState::Undeliverable => {
                    self.index(Logged::OutboxDead, &at(old.settled_at, &member), false)?
                }
                OutboxState::Delivered => {}
            }
        }
        match new.state {
            OutboxState::Pending => {
                self.index(Logged::OutboxDue, &at(new.due_at, &member), true)?
            }
            OutboxState::Undeliverable => {
                self.index(Logged::OutboxDead, &at(new.settled_at, &member), true)?
            }
            OutboxState::Delivered => {}
        }
        let bytes = new.encode().map_err(corrupt)?;
        self.entries.insert(member.as_slice(), bytes.as_slice())?;
        self.log
            .push(Entry::new(Logged::Outbox, &member, Some(&bytes)));
        Ok(())
    }

    fn load(&self, member: &[u8]) -> Result<Option<OutboxEntry>, redb::Error> {
        match self.entries.get(member)? {
            Some(bytes) => OutboxEntry::decode(bytes.value())
                .map(Some)
                .map_err(corrupt),
            None => Ok(None),
        }
    }

    /// Writes each entry not stored yet; returns how many were written.
    pub(super) fn append(&mut self, entries: &[NewEntry], now: Millis) -> Result<u32, redb::Error> {
        let mut written = 0;
        for entry in entries {
            let member = outbox::member(&entry.webhook, &entry.id);
            if self.entries.get(member.as_slice())?.is_some() {
                continue;
            }
            self.put(None, &OutboxEntry::new(entry, now))?;
            written += 1;
        }
        Ok(written)
    }

    /// Forgets settled entries past their retention, then claims due ones.
    pub(super) fn claim(
        &mut self,
        limit: usize,
        lease: Millis,
        claim: &str,
        now: Millis,
    ) -> Result<Claimed, redb::Error> {
        self.purge(now)?;
        let upper = ordered(now.saturating_add(1));
        let due: Vec<Vec<u8>> = self
            .due
            .range(..upper.as_slice())?
            .take(limit)
            .map(|e| e.map(|(k, _)| k.value().to_vec()))
            .collect::<Result<_, _>>()?;
        let mut entries = Vec::with_capacity(due.len());
        for key in due {
            let member = &key[8..];
            let stored = match self.load(member) {
                Ok(Some(entry)) if entry.state == OutboxState::Pending => entry,
                Ok(_) => {
                    self.index(Logged::OutboxDue, &key, false)?;
                    continue;
                }
                Err(redb::Error::Corrupted(what)) => {
                    // Nobody can deliver it; keeping it due would stop every later claim at it.
                    tracing::error!(%what, "outbox: dropping an entry that cannot be read");
                    self.index(Logged::OutboxDue, &key, false)?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let claimed = stored.clone().claimed(claim, now, lease);
            self.put(Some(&stored), &claimed)?;
            entries.push(claimed);
        }
        Ok(Claimed {
            entries,
            pending: self.due.len()?,
            undeliverable: self.dead.len()?,
        })
    }

    fn purge(&mut self, now: Millis) -> Result<(), redb::Error> {
        let upper = ordered(now.saturating_add(1));
        let expired: Vec<Vec<u8>> = self
            .keep
            .range(..upper.as_slice())?
            .take(outbox::PURGE_BATCH)
            .map(|e| e.map(|(k, _)| k.value().to_vec()))
            .collect::<Result<_, _>>()?;
        for key in expired {
            self.index(Logged::OutboxKeep, &key, false)?;
            let member = &key[8..];
            if let Ok(Some(entry)) = self.load(member)
                && entry.state == OutboxState::Undeliverable
            {
                self.index(Logged::OutboxDead, &at(entry.settled_at, member), false)?;
            }
            self.entries.remove(member)?;
            self.log.push(Entry::new(Logged::Outbox, member, None));
        }
        Ok(())
    }

    /// Settles a claimed entry; false when it is not pending under `claim`.
    pub(super) fn settle(
        &mut self,
        member: &[u8],
        claim: &str,
        settlement: &Settlement,
        keep: Millis,
        now: Millis,
    ) -> Result<bool, redb::Error> {
        let Some(stored) = self.load(member)? else {
            return Ok(false);
        };
        let Some(settled) = stored.clone().settled(claim, settlement, now) else {
            return Ok(false);
        };
        self.put(Some(&stored), &settled)?;
        if settled.state != OutboxState::Pending {
            self.index(
                Logged::OutboxKeep,
                &at(now.saturating_add(keep), member),
                true,
            )?;
        }
        Ok(true)
    }

    /// Undeliverable entries after `after`, oldest given up first.
    pub(super) fn undeliverable(
        &self,
        after: Option<&ListCursor>,
        limit: usize,
    ) -> Result<OutboxPage, redb::Error> {
        let start = after.map_or_else(Vec::new, |c| at(c.lease_expires_at, &c.key));
        let mut page = OutboxPage {
            pending: self.due.len()?,
            undeliverable: self.dead.len()?,
            ..OutboxPage::default()
        };
        for entry in self.dead.range(start.as_slice()..)? {
            let (key, _) = entry?;
            let key = key.value();
            if after.is_some() && key == start.as_slice() {
                continue;
            }
            if page.items.len() >= limit {
                break;
            }
            match self.load(&key[8..]) {
                Ok(Some(entry)) => {
                    page.next = Some(ListCursor {
                        agent_id: String::new(),
                        lease_expires_at: entry.settled_at,
                        key: key[8..].to_vec(),
                    });
                    page.items.push(entry);
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(error = %e, "outbox: an undeliverable entry cannot be read")
                }
            }
        }
        if page.items.len() < limit {
            page.next = None;
        }
        Ok(page)
    }

    /// Applies a logged write (replaying the write-ahead log).
    pub(super) fn replay(&mut self, entry: &Entry) -> Result<(), redb::Error> {
        let (key, value) = (entry.key.as_slice(), entry.value.as_deref());
        let unit = match entry.table {
            Logged::Outbox => {
                match value {
                    Some(v) => drop(self.entries.insert(key, v)?),
                    None => drop(self.entries.remove(key)?),
                }
                return Ok(());
            }
            Logged::OutboxDue => &mut self.due,
            Logged::OutboxDead => &mut self.dead,
            _ => &mut self.keep,
        };
        match value {
            Some(_) => drop(unit.insert(key, ())?),
            None => drop(unit.remove(key)?),
        }
        Ok(())
    }
}
