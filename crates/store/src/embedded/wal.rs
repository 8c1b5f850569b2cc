//! The embedded store's write-ahead log: group commit in front of the B-tree.
//!
//! A batch's writes (the records it puts or deletes, as the bytes the B-tree stores) are appended
//! to `oncegate.wal` as one frame and made durable with one `fdatasync` before any caller of the
//! batch is answered; the B-tree transaction is then committed without an fsync of its own. Every
//! so often a checkpoint commits the B-tree durably and starts a new generation of the log. After
//! a crash (`kill -9`, power loss) the B-tree is at its last durable commit and the log's frames
//! of the current generation bring it up to the last acknowledged batch.
//!
//! The file is preallocated, so appending does not change its size (an `fdatasync` then writes
//! the data only). Layout: a header block (magic, generation) then frames; a frame is
//! `generation u64, length u32, crc32 u32, payload`; the payload is entries
//! `key length u32, key, tag u8, value length u32, value`, the tag naming the table (bits 1 and
//! up, [`Table`]) and whether the key is written (bit 0) or deleted. Replay stops
//! at the first frame of another generation or with a bad checksum: a frame torn by a crash was
//! never acknowledged.

use std::{
    fs::{File, OpenOptions},
    io,
    os::unix::fs::FileExt,
    path::Path,
};

/// Where the frames start: the header block is this long.
const HEADER: u64 = 4096;
/// The file's preallocated size; a frame that does not fit triggers a checkpoint first.
const CAPACITY: u64 = 64 << 20;
/// Identifies the file and its format.
const MAGIC: &[u8; 8] = b"OGWAL002";
/// Generation, length and checksum before each payload.
const FRAME_HEADER: usize = 16;
/// The most frame memory kept between appends.
const KEPT_FRAME: usize = 1 << 20;

/// The table a logged write goes to. Records are replayed with their indexes (expiry, leases);
/// the others as written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Table {
    Records,
    Receipts,
    Approvals,
    ApprovalIndex,
    Budgets,
    Outbox,
    OutboxDue,
    OutboxDead,
    OutboxKeep,
}

impl Table {
    const ALL: [Table; 9] = [
        Table::Records,
        Table::Receipts,
        Table::Approvals,
        Table::ApprovalIndex,
        Table::Budgets,
        Table::Outbox,
        Table::OutboxDue,
        Table::OutboxDead,
        Table::OutboxKeep,
    ];
}

/// One write of a batch: a table, a key and its new bytes (`None`: deleted), as the B-tree stores
/// them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Entry {
    pub(super) table: Table,
    pub(super) key: Vec<u8>,
    pub(super) value: Option<Vec<u8>>,
}

impl Entry {
    pub(super) fn record(key: Vec<u8>, value: Option<Vec<u8>>) -> Self {
        Self {
            table: Table::Records,
            key,
            value,
        }
    }

    pub(super) fn receipt(key: Vec<u8>, value: Vec<u8>) -> Self {
        Self {
            table: Table::Receipts,
            key,
            value: Some(value),
        }
    }

    pub(super) fn new(table: Table, key: &[u8], value: Option<&[u8]>) -> Self {
        Self {
            table,
            key: key.to_vec(),
            value: value.map(<[u8]>::to_vec),
        }
    }

    fn tag(&self) -> u8 {
        ((self.table as u8) << 1) | u8::from(self.value.is_some())
    }
}

/// The log file and where the next frame goes.
pub(super) struct Wal {
    file: File,
    generation: u64,
    offset: u64,
    /// The frame being written, kept between appends: a batch's frame is tens of kilobytes, encoded
    /// here once instead of into two new allocations per batch (the payload, then the payload
    /// copied behind its header).
    frame: Vec<u8>,
}

impl Wal {
    /// Opens (or creates) the log in `dir` and returns it with the frames of its current
    /// generation, in order, to replay on top of the B-tree's last durable commit.
    pub(super) fn open(dir: &Path) -> io::Result<(Self, Vec<Vec<Entry>>)> {
        let path = dir.join("oncegate.wal");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        let mut wal = Self {
            file,
            generation: 0,
            offset: HEADER,
            frame: Vec::new(),
        };
        if wal.file.metadata()?.len() < HEADER + CAPACITY {
            wal.file.set_len(HEADER + CAPACITY)?;
        }
        let mut header = [0u8; 16];
        wal.file.read_exact_at(&mut header, 0)?;
        if &header[..8] == MAGIC {
            wal.generation = u64::from_le_bytes(header[8..16].try_into().unwrap_or_default());
        } else {
            // A new log: write the header, durably, before anything trusts it.
            wal.write_header()?;
            wal.file.sync_all()?;
            return Ok((wal, Vec::new()));
        }
        let frames = wal.read_frames()?;
        Ok((wal, frames))
    }

    fn write_header(&self) -> io::Result<()> {
        let mut header = [0u8; 16];
        header[..8].copy_from_slice(MAGIC);
        header[8..].copy_from_slice(&self.generation.to_le_bytes());
        self.file.write_all_at(&header, 0)
    }

    /// The valid frames of the current generation, from the start.
    fn read_frames(&mut self) -> io::Result<Vec<Vec<Entry>>> {
        let size = self.file.metadata()?.len();
        let mut frames = Vec::new();
        let mut offset = HEADER;
        loop {
            if offset + FRAME_HEADER as u64 > size {
                break;
            }
            let mut head = [0u8; FRAME_HEADER];
            self.file.read_exact_at(&mut head, offset)?;
            let generation = u64::from_le_bytes(head[..8].try_into().unwrap_or_default());
            let len = u32::from_le_bytes(head[8..12].try_into().unwrap_or_default()) as u64;
            let crc = u32::from_le_bytes(head[12..16].try_into().unwrap_or_default());
            let end = offset + FRAME_HEADER as u64 + len;
            if generation != self.generation || len == 0 || end > size {
                break;
            }
            let mut payload = vec![0u8; len as usize];
            self.file
                .read_exact_at(&mut payload, offset + FRAME_HEADER as u64)?;
            if checksum(generation, &payload) != crc {
                break;
            }
            let Some(entries) = decode(&payload) else {
                break;
            };
            frames.push(entries);
            offset = end;
        }
        self.offset = offset;
        Ok(frames)
    }

    /// Whether a frame holding `entries` fits after the frames already written.
    pub(super) fn fits(&self, entries: &[Entry]) -> bool {
        self.offset + (FRAME_HEADER + payload_len(entries)) as u64 <= HEADER + CAPACITY
    }

    /// How full the log is, as a share of its capacity.
    pub(super) fn fill(&self) -> f64 {
        (self.offset - HEADER) as f64 / CAPACITY as f64
    }

    /// Appends one frame holding `entries` and makes it durable (`fdatasync`) before returning.
    pub(super) fn append(&mut self, entries: &[Entry]) -> io::Result<()> {
        let frame = &mut self.frame;
        frame.clear();
        frame.reserve(FRAME_HEADER + payload_len(entries));
        frame.resize(FRAME_HEADER, 0);
        encode_into(entries, frame);
        let payload_len = frame.len() - FRAME_HEADER;
        let crc = checksum(self.generation, &frame[FRAME_HEADER..]);
        frame[..8].copy_from_slice(&self.generation.to_le_bytes());
        frame[8..12].copy_from_slice(&(payload_len as u32).to_le_bytes());
        frame[12..16].copy_from_slice(&crc.to_le_bytes());
        self.file.write_all_at(frame, self.offset)?;
        self.file.sync_data()?;
        self.offset += frame.len() as u64;
        if frame.capacity() > KEPT_FRAME {
            // After a burst, do not hold its frame's memory for good.
            frame.clear();
            frame.shrink_to(KEPT_FRAME);
        }
        Ok(())
    }

    /// Starts a new generation: every frame written so far is obsolete (call it after the B-tree
    /// was committed durably).
    pub(super) fn reset(&mut self) -> io::Result<()> {
        self.generation += 1;
        self.write_header()?;
        self.file.sync_data()?;
        self.offset = HEADER;
        Ok(())
    }
}

fn checksum(generation: u64, payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&generation.to_le_bytes());
    hasher.update(payload);
    hasher.finalize()
}

/// The bytes of the payload of a frame holding `entries`.
fn payload_len(entries: &[Entry]) -> usize {
    entries
        .iter()
        .map(|e| 9 + e.key.len() + e.value.as_ref().map_or(0, Vec::len))
        .sum()
}

/// Appends the payload of a frame holding `entries` to `out`.
fn encode_into(entries: &[Entry], out: &mut Vec<u8>) {
    for entry in entries {
        out.extend_from_slice(&(entry.key.len() as u32).to_le_bytes());
        out.extend_from_slice(&entry.key);
        out.push(entry.tag());
        let value = entry.value.as_deref().unwrap_or_default();
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
        out.extend_from_slice(value);
    }
}

fn decode(mut payload: &[u8]) -> Option<Vec<Entry>> {
    fn take<'a>(input: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (head, rest) = input.split_at_checked(n)?;
        *input = rest;
        Some(head)
    }
    fn length(input: &mut &[u8]) -> Option<usize> {
        Some(u32::from_le_bytes(take(input, 4)?.try_into().ok()?) as usize)
    }
    let mut entries = Vec::new();
    while !payload.is_empty() {
        let key_len = length(&mut payload)?;
        let key = take(&mut payload, key_len)?.to_vec();
        let tag = take(&mut payload, 1)?[0];
        let table = *Table::ALL.get(usize::from(tag >> 1))?;
        let value_len = length(&mut payload)?;
        let value = take(&mut payload, value_len)?.to_vec();
        entries.push(Entry {
            table,
            key,
            value: (tag & 1 == 1).then_some(value),
        });
    }
    Some(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_survive_reopening_and_a_reset_obsoletes_them() {
        let dir = tempfile::TempDir::new().unwrap();
        let (mut wal, frames) = Wal::open(dir.path()).unwrap();
        assert!(frames.is_empty());
        let first = vec![Entry::record(b"k1".to_vec(), Some(b"v1".to_vec()))];
        let second = vec![
            Entry::record(b"k2".to_vec(), None),
            Entry::receipt(b"a1".to_vec(), b"r1".to_vec()),
            Entry::new(Table::Budgets, b"b1", Some(b"slots")),
            Entry::new(Table::ApprovalIndex, b"i1", None),
            Entry::new(Table::Outbox, b"m1", Some(b"entry")),
            Entry::new(Table::OutboxKeep, b"k1", Some(&[])),
            Entry::record(b"k1".to_vec(), Some(vec![])),
        ];
        wal.append(&first).unwrap();
        wal.append(&second).unwrap();
        drop(wal);
        let (mut wal, frames) = Wal::open(dir.path()).unwrap();
        assert_eq!(frames, vec![first.clone(), second]);
        wal.reset().unwrap();
        wal.append(&first).unwrap();
        drop(wal);
        let (_, frames) = Wal::open(dir.path()).unwrap();
        assert_eq!(frames, vec![first], "only the new generation's frames");
    }

    #[test]
    fn the_kept_frame_holds_no_bytes_of_the_one_before() {
        let dir = tempfile::TempDir::new().unwrap();
        let (mut wal, _) = Wal::open(dir.path()).unwrap();
        let big = vec![Entry::record(
            b"big".to_vec(),
            Some(vec![7; 2 * KEPT_FRAME]),
        )];
        let small = vec![Entry::record(b"k".to_vec(), Some(b"v".to_vec()))];
        let empty = vec![Entry::record(b"gone".to_vec(), None)];
        wal.append(&big).unwrap();
        assert!(
            wal.frame.capacity() <= KEPT_FRAME,
            "a burst's frame is not kept"
        );
        wal.append(&small).unwrap();
        wal.append(&empty).unwrap();
        drop(wal);
        let (_, frames) = Wal::open(dir.path()).unwrap();
        assert_eq!(frames, vec![big, small, empty]);
    }

    #[test]
    fn a_torn_frame_ends_the_replay() {
        let dir = tempfile::TempDir::new().unwrap();
        let (mut wal, _) = Wal::open(dir.path()).unwrap();
        let entry = vec![Entry::record(b"k".to_vec(), Some(b"value".to_vec()))];
        wal.append(&entry).unwrap();
        let torn_at = wal.offset;
        wal.append(&entry).unwrap();
        // The second frame's last byte never reached the disk.
        wal.file.write_all_at(&[0xFF], wal.offset - 1).unwrap();
        drop(wal);
        let (wal, frames) = Wal::open(dir.path()).unwrap();
        assert_eq!(frames.len(), 1);
        assert_eq!(
            wal.offset, torn_at,
            "the next frame overwrites the torn one"
        );
    }
}
