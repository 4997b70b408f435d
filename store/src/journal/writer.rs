//! Writing the journal: the [`Writer`] writes batches at the journal's end (only the
//! committer does), in whole blocks, and switches to the next segment when one is full.
//!
//! **Errors**: a failed write leaves the [`Writer`] where it was, and the records not written
//! with its caller, so that it can try again: the next try writes the batch at the same place
//! (what the failed write left after it is overwritten, or is a torn tail to a scan, never
//! acknowledged). A segment that cannot be made (its allocation failed) is removed and made
//! again by a later try. [`out_of_space`] tells the errors that are worth retrying from
//! those that are not.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::blocks::Blocks;
use super::format::{
    BATCH_HEADER, BatchHeader, RECORD_LEN, SEGMENT_HEADER, SegmentHeader, push_record, spare_block,
};
use super::recycle::tidy_free;
use super::room::RoomHold;
use super::scan::End;
use super::segments::segment_path;
use super::spare::{Spare, SpareJob, make_segment};
use crate::disk::{BLOCK, Disk, DiskFile};
use crate::error::StoreError;
use crate::layout::u32_at;

/// Records gathered for [`Writer::write_payload`]: room for a batch header, then each record
/// as it goes into a batch. Kept and reused by its owner, so its memory is not faulted in
/// afresh for every commit.
#[derive(Debug)]
pub(crate) struct Payload {
    buf: Vec<u8>,
    pub(super) count: u32,
}

impl Payload {
    pub(crate) fn new() -> Payload {
        Payload {
            buf: vec![0; BATCH_HEADER],
            count: 0,
        }
    }

    /// Adds a record.
    #[inline]
    pub(crate) fn push(&mut self, rec: &[u8]) {
        push_record(&mut self.buf, rec);
        self.count += 1;
    }

    /// Bytes held (records and the header's room).
    pub(crate) fn len(&self) -> usize {
        self.buf.len()
    }

    fn clear(&mut self) {
        self.buf.truncate(BATCH_HEADER);
        self.count = 0;
    }

    /// The records held, in order.
    #[cfg(test)]
    pub(crate) fn records(&self) -> Vec<&[u8]> {
        super::format::records(&self.buf[BATCH_HEADER..], self.count)
            .expect("a well-formed payload")
    }
}

/// Writes batches at the journal's end (only the committer does).
pub(crate) struct Writer {
    store: PathBuf,
    disk: Arc<dyn Disk>,
    uuid: [u8; 16],
    segment_size: u64,
    /// The segment being written, its number, and where the next batch goes.
    file: Option<Arc<dyn DiskFile>>,
    seq: u64,
    offset: u64,
    next_lsn: u64,
    /// Every record below this LSN is flushed.
    flushed_lsn: u64,
    /// A zeroed segment made ahead of need, and its number.
    spare: Option<(u64, Arc<dyn DiskFile>)>,
    /// The thread making the next spare.
    making: Option<SpareJob>,
    buf: Vec<u8>,
    /// The bytes of the block `offset` is in, up to `offset`: rewritten with each batch, as
    /// batches are written in whole blocks (`DiskFile::write_blocks`).
    tail: Vec<u8>,
    /// The segment being written takes no more batches: a crash left bytes after its end
    /// (`recycle.rs`), so the next batch starts the next segment.
    closed: bool,
    /// Where a batch is laid out in whole blocks before it is written.
    staging: Blocks,
    /// Set by the checkpointer while the host's room is kept for its next checkpoint: no
    /// segment is made unless the host has room for it and that checkpoint
    /// ([`RoomHold::check`]).
    room_hold: Arc<RoomHold>,
    /// A spare refused meanwhile, for [`Writer::poll_spare`] to report.
    refused: Option<StoreError>,
    /// When the last spare was asked for, the host had room for fewer than
    /// [`SHORT_SEGMENTS`] more segments ([`Writer::host_short`]).
    host_short: bool,
}

/// Below room for this many more segments on the host, the threads' record buffers are kept
/// small ([`Writer::host_short`]).
const SHORT_SEGMENTS: u64 = 8;

/// Whether `e` is the host running out of space (or quota) in an operation that can simply
/// be tried again: a write, or the making of a segment. A failed flush of the segment being
/// written is never retryable, whatever its errno: after a failed `fsync` the host may have
/// dropped the pages it could not write, so that a later `fsync` succeeds without them.
pub(crate) fn out_of_space(e: &StoreError) -> bool {
    match e {
        StoreError::Io { op, source, .. } => {
            matches!(source.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) && *op != "flush"
        }
        _ => false,
    }
}

impl Writer {
    /// A writer continuing the journal at `end`.
    pub(crate) fn new(
        disk: Arc<dyn Disk>,
        store: &Path,
        uuid: [u8; 16],
        segment_size: u64,
        end: End,
    ) -> Result<Writer, StoreError> {
        let mut w = Writer {
            store: store.to_path_buf(),
            disk,
            uuid,
            segment_size,
            file: None,
            seq: end.segment,
            offset: end.offset,
            next_lsn: end.next_lsn,
            flushed_lsn: 0,
            spare: None,
            making: None,
            buf: Vec::new(),
            tail: Vec::new(),
            closed: false,
            staging: Blocks::default(),
            room_hold: Arc::default(),
            refused: None,
            host_short: false,
        };
        tidy_free(&*w.disk, store, &uuid)?;
        if end.segment != 0 {
            let p = segment_path(store, end.segment);
            let f = w.disk.open(&p, false).map_err(StoreError::io(&p, "open"))?;
            if end.dirty && !end.started {
                // A torn first write: the segment becomes a spare again (its other bytes are
                // an earlier life's, or the torn write's, and no scan reads them).
                f.write_blocks(spare_block(uuid, end.segment).bytes(1), 0)
                    .and_then(|()| f.sync_data())
                    .map_err(StoreError::io(&p, "rewrite the torn header"))?;
            }
            if end.started {
                let base = end.offset - end.offset % BLOCK as u64;
                w.tail = vec![0; (end.offset - base) as usize];
                f.read_exact_at(&mut w.tail, base)
                    .map_err(StoreError::io(&p, "read"))?;
                w.file = Some(f);
                if end.dirty {
                    // Bytes after the end (a torn batch, batches of this life left after a
                    // clean end, or an earlier life's): zeros go right after the end, so
                    // that the end is clean even if the next batch goes to the next
                    // segment. If a batch of this segment is among those bytes, the next
                    // batch does go there, so that it is never read as a new batch's
                    // continuation (`recycle.rs`); an earlier life's batches
                    // name another segment, and are written over.
                    w.write_end()
                        .map_err(StoreError::io(&p, "write zeros after the end"))?;
                    w.closed = end.later;
                }
                // What the scan read may sit in the host's page cache only (a killed
                // process): flushed now, so that batches written after it say so truly.
                let f = w.file.as_ref().expect("just set");
                f.sync_data().map_err(StoreError::io(&p, "flush"))?;
            } else {
                // Unused, or with a torn first write: the next batch starts it.
                w.spare = Some((end.segment, f));
                w.seq = end.segment - 1;
            }
        }
        w.flushed_lsn = w.next_lsn;
        w.prepare_spare();
        Ok(w)
    }

    /// Starts making the next segment, zeroed and flushed, on a thread of its own, so that
    /// switching segments later costs no zeroing (nothing if one is ready or being made).
    pub(crate) fn prepare_spare(&mut self) {
        if self.spare.is_some() || self.making.is_some() || self.refused.is_some() {
            return;
        }
        self.host_short = self
            .disk
            .available(&self.store)
            .is_some_and(|a| a < SHORT_SEGMENTS * self.segment_size);
        let covered = self.room_hold.covers(self.next_lsn.saturating_sub(1));
        let (seq, size) = (self.seq + 1, self.segment_size);
        if let Err(e) = self
            .room_hold
            .check(&*self.disk, &self.store, seq, size, covered)
        {
            self.refused = Some(e);
            return;
        }
        let (disk, store, uuid) = (self.disk.clone(), self.store.clone(), self.uuid);
        self.making = Some(
            std::thread::Builder::new()
                .name("lanefs-segment".into())
                .spawn(move || make_segment(&*disk, &store, uuid, seq, size).map(|f| (seq, f)))
                .expect("spawn the segment maker"),
        );
    }

    /// Where the spare segment stands; collects the maker's result if it has finished (or,
    /// with `wait`, once it has). After [`Spare::Failed`] nothing is being made:
    /// [`Writer::prepare_spare`] tries again.
    pub(crate) fn poll_spare(&mut self, wait: bool) -> Spare {
        if let Some(e) = self.refused.take() {
            return Spare::Failed(e);
        }
        if let Some(job) = self.making.take_if(|j| wait || j.is_finished()) {
            match job.join().expect("the segment maker does not panic") {
                Ok(made) => self.spare = Some(made),
                Err(e) => return Spare::Failed(e),
            }
        }
        match (&self.spare, &self.making) {
            (Some(_), _) => Spare::Ready,
            (None, Some(_)) => Spare::Making,
            (None, None) => Spare::Missing,
        }
    }

    /// Makes the writer make no segment while `hold` is on (the checkpointer's
    /// [`crate::checkpoint::Checkpoint::room_hold`]).
    pub(crate) fn hold_room_with(&mut self, hold: Arc<RoomHold>) {
        self.room_hold = hold;
    }

    /// Whether the host had room for fewer than [`SHORT_SEGMENTS`] more segments when the
    /// last spare was asked for: the committer then keeps the threads' buffers small, so
    /// that what they hold when the host fills (records the journal must write before any
    /// removal after them) stays small too (commit.rs, "Backpressure").
    pub(crate) fn host_short(&self) -> bool {
        self.host_short
    }

    /// The sequence number of the segment being written.
    pub(crate) fn seq(&self) -> u64 {
        self.seq
    }

    /// The LSN of the last record in the journal (0: none yet).
    pub(crate) fn last_lsn(&self) -> u64 {
        self.next_lsn.saturating_sub(1)
    }

    /// Bytes left for batches in the segment being written (0: none yet, or it is closed).
    pub(crate) fn room(&self) -> u64 {
        match self.file {
            Some(_) if !self.closed => self.segment_size.saturating_sub(self.offset),
            _ => 0,
        }
    }

    /// The size of a segment.
    pub(crate) fn segment_size(&self) -> u64 {
        self.segment_size
    }

    /// The spare segment, waiting for the one being made, or making it now.
    fn take_spare(&mut self) -> Result<(u64, Arc<dyn DiskFile>), StoreError> {
        if let Some(job) = self.making.take() {
            // A failed attempt is made again below (space may be back since).
            if let Ok(made) = job.join().expect("the segment maker does not panic") {
                self.spare.get_or_insert(made);
            }
        }
        match self.spare.take() {
            Some(s) => Ok(s),
            None => {
                self.refused = None;
                let (disk, store, seq, size) =
                    (&*self.disk, &self.store, self.seq + 1, self.segment_size);
                let covered = self.room_hold.covers(self.next_lsn.saturating_sub(1));
                self.room_hold
                    .make(disk, store, seq, size, covered, || {
                        make_segment(disk, store, self.uuid, seq, size)
                    })
                    .map(|f| (seq, f))
            }
        }
    }

    /// Flushes what was written: every record written so far is durable once this returns.
    pub(crate) fn flush(&mut self) -> Result<(), StoreError> {
        if self.flushed_lsn == self.next_lsn {
            return Ok(());
        }
        if let Some(f) = &self.file {
            let p = segment_path(&self.store, self.seq);
            f.sync_data().map_err(StoreError::io(&p, "flush"))?;
        }
        self.flushed_lsn = self.next_lsn;
        Ok(())
    }

    /// Writes `records` as one or more batches (not flushed: see [`Writer::flush`]); returns
    /// the LSN of the last.
    pub(crate) fn write(&mut self, records: &[&[u8]]) -> Result<u64, StoreError> {
        let mut p = Payload::new();
        for r in records {
            p.push(r);
        }
        self.write_payload(&mut p)
    }

    /// Writes the records of `p` as one or more batches (not flushed: see
    /// [`Writer::flush`]), and empties it; returns the LSN of the last record. Records go to
    /// the current segment while they fit, then to the next; a record larger than a segment
    /// gets one of its own, grown to hold it. On an error `p` keeps the records not written
    /// (whole batches are written or not: a batch that failed part way is written again, at
    /// the same place, by the next call), so that the caller can retry (module doc).
    pub(crate) fn write_payload(&mut self, p: &mut Payload) -> Result<u64, StoreError> {
        let room = |w: &Writer| w.room() as usize;
        if p.count > 0 && p.buf.len() > room(self) {
            // Whole records up to the room left, then the rest into new segments.
            let mut at = BATCH_HEADER;
            let mut written = 0u32;
            while at < p.buf.len() {
                let mut end = at;
                let mut n = 0u32;
                while end < p.buf.len() {
                    let len = u32_at(&p.buf, end) as usize;
                    if BATCH_HEADER + (end + RECORD_LEN + len - at) > room(self) && n > 0 {
                        break;
                    }
                    end += RECORD_LEN + len;
                    n += 1;
                }
                let mut part = std::mem::take(&mut self.buf);
                part.clear();
                part.resize(BATCH_HEADER, 0);
                part.extend_from_slice(&p.buf[at..end]);
                let r = if BATCH_HEADER + (end - at) > room(self) {
                    self.switch()
                } else {
                    Ok(())
                }
                .and_then(|()| self.write_batch(&mut part, n));
                self.buf = part;
                if let Err(e) = r {
                    // What was written leaves `p`; the rest stays for the caller to retry.
                    p.buf.drain(BATCH_HEADER..at);
                    p.count -= written;
                    return Err(e);
                }
                written += n;
                at = end;
            }
        } else if p.count > 0 {
            let n = p.count;
            self.write_batch(&mut p.buf, n)?;
        }
        p.clear();
        Ok(self.next_lsn - 1)
    }

    /// Writes one batch: `buf` is a header's room followed by `count` records. The batch is
    /// written in whole blocks: the bytes of the block it starts in that are already there
    /// (`tail`, rewritten as they were), the batch, and zeros to the end of the block that
    /// holds a batch header's length after it, or of the segment (where the next batch
    /// starts over them; they mark the end of the batches, whatever an earlier life of the
    /// file left after them).
    fn write_batch(&mut self, buf: &mut [u8], count: u32) -> Result<(), StoreError> {
        let h = BatchHeader {
            segment: self.seq,
            first_lsn: self.next_lsn,
            count,
            len: (buf.len() - BATCH_HEADER) as u32,
            crc: crc32c::crc32c(&buf[BATCH_HEADER..]),
            flushed: self.flushed_lsn,
        };
        buf[..BATCH_HEADER].copy_from_slice(&h.encode(&self.uuid));
        let base = self.offset - self.tail.len() as u64;
        let total = self.tail.len() + buf.len();
        let blocks = self.padded(base, total, self.segment_size).div_ceil(BLOCK);
        let out = self.staging.bytes(blocks);
        out[..self.tail.len()].copy_from_slice(&self.tail);
        out[self.tail.len()..total].copy_from_slice(buf);
        out[total..].fill(0);
        let p = segment_path(&self.store, self.seq);
        let f = self.file.as_ref().expect("a segment to write");
        f.write_blocks(out, base)
            .map_err(StoreError::io(&p, "write"))?;
        self.tail.clear();
        self.tail
            .extend_from_slice(&out[total - total % BLOCK..total]);
        self.offset += buf.len() as u64;
        self.next_lsn += count as u64;
        Ok(())
    }

    /// How far a write of `total` bytes from `base` (block-aligned, in the segment being
    /// written) writes zeros: a batch header's length past its end, but not past `len`, the
    /// length of the file (a write that reaches past it, in a segment grown for one large
    /// record, ends the file anyway).
    fn padded(&self, base: u64, total: usize, len: u64) -> usize {
        let to_end = len.saturating_sub(base) as usize;
        (total + BATCH_HEADER).min(to_end).max(total)
    }

    /// Writes zeros after the end of the segment being written (as [`Writer::write_batch`]
    /// leaves after a batch), rewriting the bytes before it in its block as they are.
    fn write_end(&mut self) -> std::io::Result<()> {
        let f = self.file.clone().expect("a segment");
        let base = self.offset - self.tail.len() as u64;
        let total = self.tail.len();
        let len = f.len()?.max(self.segment_size);
        let blocks = self.padded(base, total, len).div_ceil(BLOCK);
        let out = self.staging.bytes(blocks);
        out[..total].copy_from_slice(&self.tail);
        out[total..].fill(0);
        match blocks {
            0 => Ok(()),
            _ => f.write_blocks(out, base),
        }
    }

    /// Starts the next segment (the spare if there is one), after flushing the current one:
    /// a flush of the newest segment then covers every earlier one.
    fn switch(&mut self) -> Result<(), StoreError> {
        self.flush()?;
        let (seq, f) = self.take_spare()?;
        let h = SegmentHeader {
            uuid: self.uuid,
            seq,
            first_lsn: self.next_lsn,
        };
        let p = segment_path(&self.store, seq);
        // Flushed alone, so that a torn header can only be a segment with nothing after it;
        // written with the zeros of the rest of its block, which mark the end of a segment
        // that is left with no batch (a recycled one holds an earlier life's bytes there).
        let header = h.encode();
        let first = self.staging.bytes(1);
        first.fill(0);
        first[..SEGMENT_HEADER].copy_from_slice(&header);
        if let Err(e) = f.write_blocks(first, 0) {
            // Kept for the next try.
            self.spare = Some((seq, f));
            return Err(StoreError::io(&p, "write header")(e));
        }
        f.sync_data().map_err(StoreError::io(&p, "flush"))?;
        self.tail.clear();
        self.tail.extend_from_slice(&header);
        self.file = Some(f);
        self.seq = seq;
        self.offset = SEGMENT_HEADER as u64;
        self.closed = false;
        self.prepare_spare();
        Ok(())
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // A segment being made is finished before the store can be opened again.
        if let Some(job) = self.making.take() {
            let _ = job.join();
        }
    }
}
