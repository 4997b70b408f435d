//! The checkpointer's reading of the journal: [`follow`] reads the records it applies
//! forward from where its last checkpoint stopped, instead of a [`super::scan`] from the
//! start of the journal.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::blocks::Blocks;
use super::format::{
    BATCH_HEADER, BatchHeader, RECORD_LEN, SEGMENT_HEADER, SegmentHeader, records,
};
use super::segments::{dir, first_lsn, segment_path, segments};
use crate::disk::{BLOCK, Disk, DiskFile};
use crate::error::StoreError;

/// Where [`follow`] goes on: the batch at byte `offset` of segment `seq` starts with record
/// `lsn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Cursor {
    pub seq: u64,
    pub offset: u64,
    pub lsn: u64,
}

/// Reads one segment forward: keeps the last bytes it read (at least [`SEGMENT_READ`], in
/// whole blocks) and reads again only for bytes outside them.
struct SegmentReader {
    path: PathBuf,
    file: Arc<dyn DiskFile>,
    /// Offset of `buf`'s first byte in the file (a multiple of [`BLOCK`]).
    start: u64,
    /// Bytes of `buf` read from the file.
    len: usize,
    buf: Blocks,
}

/// How much [`SegmentReader`] reads at once, at least. Not the checkpoint's window of records
/// (`checkpoint/window.rs`, `RECORD_WINDOW`).
const SEGMENT_READ: usize = 1 << 20;

impl SegmentReader {
    fn open(disk: &dyn Disk, store: &Path, seq: u64) -> Result<SegmentReader, StoreError> {
        let path = segment_path(store, seq);
        let file = disk
            .open(&path, false)
            .map_err(StoreError::io(&path, "open"))?;
        Ok(SegmentReader {
            path,
            file,
            start: 0,
            len: 0,
            buf: Blocks::default(),
        })
    }

    /// Bytes `off..off + len`, fewer where the file ends. Read in whole blocks around the
    /// host's page cache (`DiskFile::read_blocks`).
    fn get(&mut self, off: u64, len: usize) -> Result<&[u8], StoreError> {
        let have = off >= self.start && off + len as u64 <= self.start + self.len as u64;
        if !have {
            let start = off - off % BLOCK as u64;
            let want = ((off - start) as usize + len)
                .max(SEGMENT_READ)
                .div_ceil(BLOCK);
            let buf = self.buf.bytes(want);
            let mut n = 0;
            while n < buf.len() {
                match self.file.read_blocks(&mut buf[n..], start + n as u64) {
                    Ok(0) => break,
                    Ok(k) => n += k,
                    Err(e) => return Err(StoreError::io(&self.path, "read")(e)),
                }
                if !n.is_multiple_of(BLOCK) {
                    break; // the end of the file
                }
            }
            self.start = start;
            self.len = n;
        }
        let from = ((off - self.start) as usize).min(self.len);
        let to = (from + len).min(self.len);
        Ok(&self.buf_bytes()[from..to])
    }

    /// The bytes read.
    fn buf_bytes(&mut self) -> &[u8] {
        let n = self.len.div_ceil(BLOCK);
        &self.buf.bytes(n)[..self.len]
    }
}

/// Hands `apply` the records `from..=upto`, which this store's writer has written and
/// flushed, reading forward from `at` (what a previous call returned) or, without it, from
/// the start of the segment that holds `from`; returns where the next call goes on: the first
/// batch that holds a record after `upto`, or the end. What the checkpointer reads, instead
/// of a [`scan`] of whole segments from their start: it reads only the batches it applies
/// (and, without a cursor, those before them in their segment). It checks each batch's
/// checksums and that batches and segments follow on, not what a scan checks to tell a torn
/// tail from damage: the records asked for are known to be there, and anything else is
/// damage. `apply` is called once per batch with the LSN of the first record it is given,
/// the span of the batch's payload that holds the records in range (each after its 4-byte
/// length), and those records (slices of the span), so that a reader can copy them at once.
/// It may stop the reading with an error about one of them (by its index), which is passed
/// on.
pub(crate) fn follow(
    disk: &dyn Disk,
    store: &Path,
    uuid: [u8; 16],
    at: Option<Cursor>,
    from: u64,
    upto: u64,
    mut apply: impl FnMut(u64, &[u8], &[&[u8]]) -> Result<(), (usize, String)>,
) -> Result<Cursor, StoreError> {
    // A cursor at the end of a segment that a checkpoint then removed is no use.
    let at = at.filter(|c| c.lsn <= from && disk.exists(&segment_path(store, c.seq)));
    let mut c = match at {
        Some(c) => c,
        None => {
            let mut start = None;
            for seq in segments(disk, store)? {
                match first_lsn(disk, store, seq)? {
                    Some(lsn) if lsn <= from => start = Some((seq, lsn)),
                    _ => break,
                }
            }
            let Some((seq, lsn)) = start else {
                return Err(StoreError::damaged(
                    dir(store),
                    0,
                    format!("no segment holds record {from}"),
                ));
            };
            Cursor {
                seq,
                offset: SEGMENT_HEADER as u64,
                lsn,
            }
        }
    };
    let mut w = SegmentReader::open(disk, store, c.seq)?;
    while c.lsn <= upto {
        let head = w.get(c.offset, BATCH_HEADER)?;
        let Some(h) = BatchHeader::decode(head, &uuid).filter(|h| h.segment == c.seq) else {
            // No batch here: the segment's batches end, and the next segment goes on.
            let missing = || {
                StoreError::damaged(
                    segment_path(store, c.seq),
                    c.offset,
                    format!(
                        "record {} is wanted, but no batch holding it follows",
                        c.lsn
                    ),
                )
            };
            if !disk.exists(&segment_path(store, c.seq + 1)) {
                return Err(missing());
            }
            let next = SegmentReader::open(disk, store, c.seq + 1)?;
            let mut sh = [0u8; SEGMENT_HEADER];
            let n = next
                .file
                .read_at(&mut sh, 0)
                .map_err(StoreError::io(&next.path, "read"))?;
            match SegmentHeader::decode(&sh[..n]) {
                Ok(Some(s)) if s.uuid == uuid && s.seq == c.seq + 1 && s.first_lsn == c.lsn => {}
                _ => return Err(missing()),
            }
            w = next;
            c = Cursor {
                seq: c.seq + 1,
                offset: SEGMENT_HEADER as u64,
                lsn: c.lsn,
            };
            continue;
        };
        if h.first_lsn != c.lsn {
            return Err(StoreError::damaged(
                &w.path,
                c.offset,
                format!("batch starts at record {}, expected {}", h.first_lsn, c.lsn),
            ));
        }
        let payload = w.get(c.offset + BATCH_HEADER as u64, h.len as usize)?;
        if payload.len() != h.len as usize || crc32c::crc32c(payload) != h.crc {
            return Err(StoreError::damaged(
                &w.path,
                c.offset,
                "batch payload does not check out",
            ));
        }
        let Some(recs) = records(payload, h.count) else {
            return Err(StoreError::damaged(
                &w.path,
                c.offset,
                "batch payload does not hold its record count",
            ));
        };
        // The records of this batch in `from..=upto`.
        let first = from.saturating_sub(c.lsn) as usize;
        let end = (upto + 1 - c.lsn).min(h.count as u64) as usize;
        // Where a record's length field is in the payload: just before the record.
        let frame = |r: &[u8]| r.as_ptr() as usize - payload.as_ptr() as usize - RECORD_LEN;
        if first < end {
            let last = recs[end - 1];
            let span = &payload[frame(recs[first])..frame(last) + RECORD_LEN + last.len()];
            apply(c.lsn + first as u64, span, &recs[first..end]).map_err(|(k, what)| {
                let rec_at = c.offset + BATCH_HEADER as u64 + frame(recs[first + k]) as u64;
                StoreError::damaged(
                    segment_path(store, c.seq),
                    rec_at,
                    format!("record {}: {what}", c.lsn + (first + k) as u64),
                )
            })?;
        }
        if c.lsn + h.count as u64 - 1 > upto {
            // Records after `upto` in this batch: the next call starts here again.
            break;
        }
        c.offset += (BATCH_HEADER + h.len as usize) as u64;
        c.lsn += h.count as u64;
    }
    Ok(c)
}
