//! The embedded store's indexes, kept in the same transaction as every write: the expiry index
//! (`expires_at ++ key`, purged a bounded batch per transaction) and the lease index
//! (`agent ++ lease_expires_at ++ key`, one entry per authorized record) that ListUnresolved reads;
//! and [`Tables`], every table of one write transaction (the outbox's opened only when a call of
//! the batch needs them), which replays the write-ahead log.

use redb::{ReadableTable, Table, WriteTransaction};

use super::{
    APPROVAL_INDEX, APPROVALS, BUDGETS, EXPIRY, LEASES, ListRequest, PURGE_BATCH, RECORDS,
    chain::RECEIPTS,
    codec::{self, decode},
    keys::{agent_prefix, expiry_key, lease_entry, split_entry},
    outbox::OutboxTables,
    side::SideTables,
    wal::{self, Table as Logged},
};
use crate::{ListCursor, Page, Unresolved, list};
use oncegate_domain::{
    ActionKey,
    ledger::{self, Millis, Phase, Record},
};

/// The tables of one write transaction.
pub(super) struct Tables<'t> {
    pub(super) records: Table<'t, &'static [u8], &'static [u8]>,
    expiry: Table<'t, &'static [u8], ()>,
    pub(super) leases: Table<'t, &'static [u8], ()>,
    pub(super) receipts: Table<'t, &'static [u8], &'static [u8]>,
    /// Approvals and budgets, beside the records.
    pub(super) side: SideTables<'t>,
    /// The webhook outbox, opened by the first outbox call of the transaction ([`Tables::outbox`]):
    /// a gate without webhooks never opens it.
    outbox: Option<OutboxTables<'t>>,
    txn: &'t WriteTransaction,
}

impl<'t> Tables<'t> {
    pub(super) fn open(txn: &'t WriteTransaction) -> Result<Self, redb::Error> {
        Ok(Self {
            records: txn.open_table(RECORDS)?,
            expiry: txn.open_table(EXPIRY)?,
            leases: txn.open_table(LEASES)?,
            receipts: txn.open_table(RECEIPTS)?,
            side: SideTables {
                approvals: txn.open_table(APPROVALS)?,
                approval_index: txn.open_table(APPROVAL_INDEX)?,
                budgets: txn.open_table(BUDGETS)?,
                log: Vec::new(),
            },
            outbox: None,
            txn,
        })
    }

    /// The outbox tables, opened on first use.
    pub(super) fn outbox(&mut self) -> Result<&mut OutboxTables<'t>, redb::Error> {
        if self.outbox.is_none() {
            self.outbox = Some(OutboxTables::open(self.txn)?);
        }
        Ok(self
            .outbox
            .as_mut()
            .unwrap_or_else(|| unreachable!("opened above")))
    }

    /// The outbox writes made so far (for the write-ahead log), taken.
    pub(super) fn take_outbox_log(&mut self) -> Vec<wal::Entry> {
        self.outbox
            .as_mut()
            .map(|o| std::mem::take(&mut o.log))
            .unwrap_or_default()
    }

    /// Replaces the record at `key` (`old`, as stored) with `new` (the record and its bytes; `None`
    /// deletes it), keeping both indexes in step.
    pub(super) fn put(
        &mut self,
        key: &[u8],
        old: Option<&Record>,
        new: Option<(&Record, &[u8])>,
    ) -> Result<(), redb::Error> {
        if let Some(old) = old {
            if let Some(at) = old.expires_at {
                self.expiry.remove(expiry_key(at, key).as_slice())?;
            }
            if let Some(entry) = lease_key(old, key) {
                self.leases.remove(entry.as_slice())?;
            }
        }
        let Some((record, bytes)) = new else {
            self.records.remove(key)?;
            return Ok(());
        };
        self.records.insert(key, bytes)?;
        if let Some(at) = record.expires_at {
            self.expiry.insert(expiry_key(at, key).as_slice(), ())?;
        }
        if let Some(entry) = lease_key(record, key) {
            self.leases.insert(entry.as_slice(), ())?;
        }
        Ok(())
    }

    /// Applies a logged write (replaying the write-ahead log): a record with its indexes, anything
    /// else as written.
    pub(super) fn replay(&mut self, entry: &wal::Entry) -> Result<(), redb::Error> {
        let (key, bytes) = (entry.key.as_slice(), entry.value.as_deref());
        match entry.table {
            Logged::Records => {}
            Logged::Receipts => return raw(&mut self.receipts, key, bytes),
            Logged::Approvals => return raw(&mut self.side.approvals, key, bytes),
            Logged::Budgets => return raw(&mut self.side.budgets, key, bytes),
            Logged::Outbox | Logged::OutboxDue | Logged::OutboxDead | Logged::OutboxKeep => {
                return self.outbox()?.replay(entry);
            }
            Logged::ApprovalIndex => {
                match bytes {
                    Some(_) => self.side.approval_index.insert(key, ())?,
                    None => self.side.approval_index.remove(key)?,
                };
                return Ok(());
            }
        }
        let old = match self.records.get(key)? {
            Some(stored) => Some(decode(key, stored.value())?),
            None => None,
        };
        let new = match bytes {
            Some(bytes) => Some((decode(key, bytes)?, bytes)),
            None => None,
        };
        self.put(key, old.as_ref(), new.as_ref().map(|(r, b)| (r, *b)))
    }
}

/// A logged write to a table kept as written.
fn raw(
    table: &mut Table<'_, &'static [u8], &'static [u8]>,
    key: &[u8],
    value: Option<&[u8]>,
) -> Result<(), redb::Error> {
    match value {
        Some(value) => table.insert(key, value)?,
        None => table.remove(key)?,
    };
    Ok(())
}

/// The lease-index entry of a record, when it is authorized (live or expired).
pub(super) fn lease_key(record: &Record, key: &[u8]) -> Option<Vec<u8>> {
    let since = match &record.phase {
        Phase::Authorized {
            lease_expires_at, ..
        } => *lease_expires_at,
        Phase::Released { at, .. } if record.pending_superseded().is_some() => *at,
        _ => return None,
    };
    let action = ActionKey::decode(key)?;
    Some(lease_entry(action.agent_id.as_bytes(), since, key))
}

/// Whether a record's outcome is still unknown (authorized, or released with superseded grants
/// out): such a record never expires.
fn unsettled(record: &Record) -> bool {
    matches!(record.phase, Phase::Authorized { .. }) || record.pending_superseded().is_some()
}

/// ListUnresolved over the lease index: entries in `(agent, lease, key)` order after the cursor,
/// whose lease has ended and whose record is still unresolved at `now`. Within one agent the
/// scan stops at the first live lease; across agents it jumps to the next agent.
pub(super) fn list_unresolved(
    records: &redb::Table<&[u8], &[u8]>,
    leases: &redb::Table<&[u8], ()>,
    request: &ListRequest,
    now: Millis,
) -> Result<Page, redb::Error> {
    let only = request.agent_id.as_deref().map(str::as_bytes);
    let mut start = match (&request.after, only) {
        (Some(c), _) => lease_entry(c.agent_id.as_bytes(), c.lease_expires_at, &c.key),
        (None, Some(agent)) => agent_prefix(agent),
        (None, None) => Vec::new(),
    };
    let mut skip_start = request.after.is_some();
    let mut page = Page::default();
    let mut budget = list::scan_budget(request.limit);
    let mut last: Option<ListCursor> = request.after.clone();
    'scan: loop {
        let mut jump = None;
        for entry in leases.range(start.as_slice()..)? {
            let (entry, _) = entry?;
            let entry = entry.value();
            if std::mem::take(&mut skip_start) && entry == start.as_slice() {
                continue;
            }
            let Some((agent, lease, key)) = split_entry(entry) else {
                continue;
            };
            if only.is_some_and(|only| only != agent) {
                break 'scan;
            }
            let Some(action) = ActionKey::decode(key) else {
                continue;
            };
            if page.items.len() >= request.limit || budget == 0 {
                // More may follow: resume after the last entry examined.
                page.next = last.or_else(|| Some(ListCursor::start_of(&action.agent_id)));
                break 'scan;
            }
            budget -= 1;
            if lease > now {
                if only.is_some() {
                    break 'scan;
                }
                // The rest of this agent's leases are live: go on with the next agent.
                let mut next = agent_prefix(agent);
                next.extend_from_slice(&[0xFF; 9]);
                jump = Some(next);
                break;
            }
            last = Some(ListCursor::after(&action, lease));
            let record = match records.get(key)? {
                Some(bytes) => match decode(key, bytes.value()) {
                    Ok(record) => Some(record),
                    Err(e) => {
                        // Listed by nobody until repaired: say so, and list the others.
                        tracing::error!(error = %e, "ListUnresolved skips a record it cannot read");
                        continue;
                    }
                },
                None => None,
            };
            if ledger::is_unresolved(record.as_ref(), now) {
                page.items.push(Unresolved {
                    view: ledger::view(record.as_ref(), now),
                    asked: record.map(|r| r.asked).unwrap_or_default(),
                    key: action,
                });
            }
        }
        match jump {
            Some(next) => start = next,
            None => break,
        }
    }
    Ok(page)
}

/// Removes up to [`PURGE_BATCH`] records whose store expiry has passed, with their index
/// entries; returns the writes made, for the log.
pub(super) fn purge_expired(
    tables: &mut Tables<'_>,
    now: Millis,
) -> Result<Vec<wal::Entry>, redb::Error> {
    let upper = now.max(0).to_be_bytes();
    let due: Vec<Vec<u8>> = tables
        .expiry
        .range(..upper.as_slice())?
        .take(PURGE_BATCH)
        .map(|entry| entry.map(|(k, _)| k.value().to_vec()))
        .collect::<Result<_, _>>()?;
    let mut writes = Vec::with_capacity(due.len());
    for index_key in due {
        let key = &index_key[8..];
        let stored = tables
            .records
            .get(key)?
            .map(|bytes| decode(key, bytes.value()));
        let record = match stored {
            Some(Ok(record)) => record,
            Some(Err(e)) => {
                // Only a settled record has an expiry entry: forgetting it is what is due, and
                // keeping it would stop every later purge at it.
                tracing::warn!(error = %e, "purging an expired record that cannot be read");
                tables.expiry.remove(index_key.as_slice())?;
                tables.records.remove(key)?;
                writes.push(wal::Entry::record(key.to_vec(), None));
                continue;
            }
            None => {
                tables.expiry.remove(index_key.as_slice())?;
                continue;
            }
        };
        if unsettled(&record) {
            // Written by a version that let unresolved records expire: keep it, without expiry.
            let kept = Record {
                expires_at: None,
                ..record.clone()
            };
            let bytes = codec::encode(&kept)?;
            tables.put(key, Some(&record), Some((&kept, &bytes)))?;
            writes.push(wal::Entry::record(key.to_vec(), Some(bytes)));
        } else {
            tables.put(key, Some(&record), None)?;
            writes.push(wal::Entry::record(key.to_vec(), None));
        }
    }
    Ok(writes)
}
