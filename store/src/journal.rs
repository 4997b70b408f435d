//! The journal: segments of checksummed, sequence-numbered batches of records
//! (docs/STORE.md, "The journal", is the specification; `spec.rs` keeps the two in step).
//!
//! A segment is a file `journal/<seq as 16 hex digits>.seg`, allocated at its full size
//! and written with zeros before it is used, by a thread of its own, so that writing into it
//! never grows it. It starts with a 64-byte header; batches follow back to back. A batch is
//! a 48-byte header (its segment, the LSN of its first record, the record count, the
//! payload's length and CRC-32C, the LSN below which everything was flushed when it was
//! written, and the header's own CRC-32C) and its payload: each
//! record as a `u32` length and the record's bytes. Records are numbered from 1 without gap
//! across batches and segments; that number is the record's LSN.
//!
//! The committer writes batches as records come, and flushes (`fdatasync`) only when someone
//! waits for durability (`commit.rs`); each batch header carries the LSN below which every
//! record was flushed when the batch was written. A crash can therefore tear any batch
//! written after the last flush, and leave later ones whole. [`scan`] reads the journal
//! back and stops at the first batch that does not check out:
//! - if nothing valid follows, or every valid batch after it says the torn region was not
//!   yet flushed when it was written, this is the torn tail: it and everything after it is
//!   dropped (none of it was acknowledged: an acknowledgement is a flush, which would have
//!   made the region whole);
//! - if a valid batch after it says the region had been flushed, the journal is damaged
//!   there, and the scan fails naming the file and offset.
//!
//! Before a batch goes into a new segment the previous segment is flushed, so that a flush
//! of the newest segment covers every earlier one. Segment numbers start at 1 and have no
//! gap, and a segment after the journal's end is a spare: zeros throughout, or a **spare
//! header** (a segment header whose first LSN is 0) followed by anything; anything else is
//! damage.
//!
//! **Recycling**: segments a checkpoint covers are renamed `<seq>.free` (at most
//! [`FREE_MAX`] of them; the rest are removed), and the next spare is made from one of them
//! rather than written with zeros: its first block is rewritten as a spare header of its new
//! number, flushed, and the file renamed into place. Its other bytes are an earlier life's
//! batches, which no scan takes for this one's: a batch names its segment and LSN, and both
//! only grow over a store's life. So that the end of a segment's batches is still told from
//! a torn one, every batch write leaves at least a batch header's length of zeros after the
//! batch (or reaches the file's end), and a segment's first block is written whole (header
//! and zeros) when it is started. A writer continuing the journal where anything but zeros
//! follows the end of its segment writes zeros right after the end and flushes; and if a
//! batch of this segment is among the bytes after the end (a crash left it after a clean
//! end), it starts the next segment instead of writing there, so that such a batch is never
//! read as the continuation of new ones.
//!
//! The checkpointer reads the records it applies with [`follow`], forward from where its
//! last checkpoint stopped, instead of a [`scan`] from the start of the journal.
//!
//! **Errors**: a failed write leaves the [`Writer`] where it was, and the records not written
//! with its caller, so that it can try again: the next try writes the batch at the same place
//! (what the failed write left after it is overwritten, or is a torn tail to a scan, never
//! acknowledged). A segment that cannot be made (its allocation failed) is removed and made
//! again by a later try. [`out_of_space`] tells the errors that are worth retrying from
//! those that are not.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

use crate::disk::{BLOCK, Disk, DiskFile};
use crate::error::StoreError;

/// Magic bytes of a segment header.
pub(crate) const SEGMENT_MAGIC: [u8; 8] = *b"LFSJRNL\x01";
/// Magic bytes of a batch header.
pub(crate) const BATCH_MAGIC: [u8; 4] = *b"LFB1";
/// Size of a segment header.
pub(crate) const SEGMENT_HEADER: usize = 64;
/// Size of a batch header.
pub(crate) const BATCH_HEADER: usize = 48;
/// The journal format version.
pub(crate) const VERSION: u32 = 1;

/// How many covered segments are kept for reuse as spares (`<seq>.free`); a checkpoint
/// removes the others it covers.
pub(crate) const FREE_MAX: usize = 4;

/// The directory of the journal in a store.
pub(crate) fn dir(store: &Path) -> PathBuf {
    store.join("journal")
}

/// The path of segment `seq`.
pub(crate) fn segment_path(store: &Path, seq: u64) -> PathBuf {
    dir(store).join(format!("{seq:016x}.seg"))
}

/// The path of a segment kept for reuse, named by the number it had.
pub(crate) fn free_path(store: &Path, seq: u64) -> PathBuf {
    dir(store).join(format!("{seq:016x}.free"))
}

/// A segment's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegmentHeader {
    pub uuid: [u8; 16],
    pub seq: u64,
    /// LSN of its first record; 0 in a spare header (a recycled segment not yet started).
    pub first_lsn: u64,
}

/// Whether `b` (the first bytes of segment `seq`) says the segment holds no record: zeros,
/// or a spare header of this store and number.
fn unused_header(b: &[u8], uuid: &[u8; 16], seq: u64) -> bool {
    match SegmentHeader::decode(b) {
        Ok(None) => true,
        Ok(Some(h)) => h.first_lsn == 0 && h.uuid == *uuid && h.seq == seq,
        Err(_) => false,
    }
}

impl SegmentHeader {
    pub(crate) fn encode(&self) -> [u8; SEGMENT_HEADER] {
        let mut b = [0u8; SEGMENT_HEADER];
        b[0..8].copy_from_slice(&SEGMENT_MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(SEGMENT_HEADER as u32).to_le_bytes());
        b[16..32].copy_from_slice(&self.uuid);
        b[32..40].copy_from_slice(&self.seq.to_le_bytes());
        b[40..48].copy_from_slice(&self.first_lsn.to_le_bytes());
        let crc = crc32c::crc32c(&b[..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// `Ok(None)`: all zeros (a segment made but never used).
    pub(crate) fn decode(b: &[u8]) -> Result<Option<SegmentHeader>, &'static str> {
        if b.len() < SEGMENT_HEADER {
            return match b.iter().all(|&x| x == 0) {
                true => Ok(None),
                false => Err("segment header cut short"),
            };
        }
        let b = &b[..SEGMENT_HEADER];
        if b.iter().all(|&x| x == 0) {
            return Ok(None);
        }
        if b[0..8] != SEGMENT_MAGIC {
            return Err("not a journal segment (bad magic)");
        }
        if crc32c::crc32c(&b[..60]) != u32_at(b, 60) {
            return Err("segment header checksum mismatch");
        }
        if u32_at(b, 8) != VERSION {
            return Err("unknown journal format version");
        }
        Ok(Some(SegmentHeader {
            uuid: b[16..32].try_into().expect("16 bytes"),
            seq: u64_at(b, 32),
            first_lsn: u64_at(b, 40),
        }))
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// A batch's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BatchHeader {
    pub segment: u64,
    pub first_lsn: u64,
    pub count: u32,
    pub len: u32,
    pub crc: u32,
    /// Every record with a lower LSN had been flushed when this batch was written.
    pub flushed: u64,
}

impl BatchHeader {
    /// Its bytes. The header's checksum is seeded with the store's id, so bytes stored
    /// inside a record (a file's data) cannot pass for a batch header of this store.
    pub(crate) fn encode(&self, uuid: &[u8; 16]) -> [u8; BATCH_HEADER] {
        let mut b = [0u8; BATCH_HEADER];
        b[0..4].copy_from_slice(&BATCH_MAGIC);
        b[4..8].copy_from_slice(&1u32.to_le_bytes());
        b[8..16].copy_from_slice(&self.segment.to_le_bytes());
        b[16..24].copy_from_slice(&self.first_lsn.to_le_bytes());
        b[24..28].copy_from_slice(&self.count.to_le_bytes());
        b[28..32].copy_from_slice(&self.len.to_le_bytes());
        b[32..36].copy_from_slice(&self.crc.to_le_bytes());
        b[36..44].copy_from_slice(&self.flushed.to_le_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c(uuid), &b[..44]);
        b[44..48].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// `None` unless the bytes are a batch header of store `uuid` whose checksum holds.
    pub(crate) fn decode(b: &[u8], uuid: &[u8; 16]) -> Option<BatchHeader> {
        if b.len() < BATCH_HEADER || b[0..4] != BATCH_MAGIC || u32_at(b, 4) != 1 {
            return None;
        }
        if crc32c::crc32c_append(crc32c::crc32c(uuid), &b[..44]) != u32_at(b, 44) {
            return None;
        }
        Some(BatchHeader {
            segment: u64_at(b, 8),
            first_lsn: u64_at(b, 16),
            count: u32_at(b, 24),
            len: u32_at(b, 28),
            crc: u32_at(b, 32),
            flushed: u64_at(b, 36),
        })
    }
}

/// Appends one record (length and bytes) to a batch payload.
pub(crate) fn push_record(payload: &mut Vec<u8>, rec: &[u8]) {
    payload.extend_from_slice(&(rec.len() as u32).to_le_bytes());
    payload.extend_from_slice(rec);
}

/// Records gathered for [`Writer::write_payload`]: room for a batch header, then each record
/// as it goes into a batch. Kept and reused by its owner, so its memory is not faulted in
/// afresh for every commit.
#[derive(Debug)]
pub(crate) struct Payload {
    buf: Vec<u8>,
    count: u32,
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
        records(&self.buf[BATCH_HEADER..], self.count).expect("a well-formed payload")
    }
}

/// Splits a payload into its records; `None` if it does not hold exactly `count` of them.
pub(crate) fn records(payload: &[u8], count: u32) -> Option<Vec<&[u8]>> {
    // At most one record per 4 bytes, however large a count a header claims.
    let mut out = Vec::with_capacity((count as usize).min(payload.len() / 4));
    let mut at = 0usize;
    while at < payload.len() {
        let len = u32_at(payload.get(at..at + 4)?, 0) as usize;
        at += 4;
        out.push(payload.get(at..at + len)?);
        at += len;
    }
    (out.len() == count as usize).then_some(out)
}

/// A whole segment holding `records` (LSNs from `first_lsn`) in one batch (what repair
/// writes).
pub(crate) fn encode_segment(
    uuid: [u8; 16],
    seq: u64,
    first_lsn: u64,
    records: &[&[u8]],
) -> Vec<u8> {
    let mut b = SegmentHeader {
        uuid,
        seq,
        first_lsn,
    }
    .encode()
    .to_vec();
    let mut payload = Vec::new();
    for r in records {
        push_record(&mut payload, r);
    }
    let h = BatchHeader {
        segment: seq,
        first_lsn,
        count: records.len() as u32,
        len: payload.len() as u32,
        crc: crc32c::crc32c(&payload),
        flushed: first_lsn,
    };
    b.extend_from_slice(&h.encode(&uuid));
    b.extend_from_slice(&payload);
    b
}

/// Where the journal ends: the segment and offset where the next batch goes, and its LSN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct End {
    /// The segment to write into (0: none yet).
    pub segment: u64,
    /// Offset of the next batch in it.
    pub offset: u64,
    /// LSN of the next record.
    pub next_lsn: u64,
    /// Whether a torn tail was dropped.
    pub torn: bool,
    /// Whether anything but zeros follows the end in `segment` (a torn tail, a batch the scan
    /// did not take after a clean end, or an earlier life's bytes of a recycled segment): the
    /// writer writes zeros right after the end before writing there.
    pub dirty: bool,
    /// Whether a valid batch of `segment`, from the end's LSN on, follows the end (one the
    /// scan did not take after a clean end): the writer then starts the next segment instead
    /// of writing there (a new batch could end where it starts).
    pub later: bool,
    /// Whether `segment` has a valid header (false: it is unused, or its header was torn,
    /// and the next batch starts it afresh).
    pub started: bool,
}

/// The journal's segments, by sequence number (segments kept for reuse are not among
/// them; other files are refused).
pub(crate) fn segments(disk: &dyn Disk, store: &Path) -> Result<Vec<u64>, StoreError> {
    Ok(listing(disk, store)?.0)
}

/// The segments kept for reuse (`<seq>.free`), by the number they had.
pub(crate) fn free_segments(disk: &dyn Disk, store: &Path) -> Result<Vec<u64>, StoreError> {
    Ok(listing(disk, store)?.1)
}

/// The journal directory's segments and segments kept for reuse, each sorted.
fn listing(disk: &dyn Disk, store: &Path) -> Result<(Vec<u64>, Vec<u64>), StoreError> {
    let d = dir(store);
    let (mut seqs, mut free) = (Vec::new(), Vec::new());
    for name in disk.list(&d).map_err(StoreError::io(&d, "list"))? {
        let name = name.to_string_lossy().into_owned();
        let number = |suffix: &str| {
            name.strip_suffix(suffix)
                .filter(|s| s.len() == 16)
                .and_then(|s| u64::from_str_radix(s, 16).ok())
                .filter(|&n| n > 0)
        };
        match (number(".seg"), number(".free")) {
            (Some(seq), _) => seqs.push(seq),
            (_, Some(seq)) => free.push(seq),
            _ => {
                return Err(StoreError::NotAStore {
                    path: d.join(&name),
                    what: "unexpected file in the journal directory".into(),
                });
            }
        }
    }
    seqs.sort_unstable();
    free.sort_unstable();
    Ok((seqs, free))
}

/// Removes the names of free segments that a crash may have left on a file of the journal:
/// a rename cut short between its two steps leaves the file under both names (the host
/// journals a rename as one operation, but a crash image of this project's tests may keep
/// the new name without the old one's removal). Such a free segment is `<k>.free` beside
/// `<k>.seg` (a checkpoint's rename of a covered segment), or one whose first block is a
/// spare header of a number `<s>.seg` has (a spare's rename into place); reusing it would
/// write over a segment of the journal. Dropping the name loses nothing: the file is kept
/// by its other name, or is only room not reused. Run before the writer makes any spare.
fn tidy_free(disk: &dyn Disk, store: &Path, uuid: &[u8; 16]) -> Result<(), StoreError> {
    let (seqs, free) = listing(disk, store)?;
    let is_segment = |n: u64| seqs.binary_search(&n).is_ok();
    // The number a free segment's spare header names, if it has one.
    let spare_of = |p: &Path| -> Result<Option<u64>, StoreError> {
        let (_, h, got) = head(disk, p)?;
        Ok(match SegmentHeader::decode(&h[..got]) {
            Ok(Some(h)) if h.first_lsn == 0 && h.uuid == *uuid => Some(h.seq),
            _ => None,
        })
    };
    let mut removed = false;
    for n in free {
        let p = free_path(store, n);
        if is_segment(n) || spare_of(&p)?.is_some_and(is_segment) {
            disk.remove(&p).map_err(StoreError::io(&p, "remove"))?;
            removed = true;
        }
    }
    if removed {
        let d = dir(store);
        disk.sync_dir(&d)
            .map_err(StoreError::io(&d, "flush directory"))?;
    }
    Ok(())
}

/// Removes the segments kept for reuse, giving their room back to the host (errors are
/// ignored: a file left is only room not given back).
pub(crate) fn drop_free(disk: &dyn Disk, store: &Path) {
    for seq in free_segments(disk, store).unwrap_or_default() {
        let _ = disk.remove(&free_path(store, seq));
    }
}

/// Reads every record with an LSN from `from_lsn` on, in order, handing each to `apply`
/// (which may refuse it; its error is reported at the record's place). Returns where the
/// journal ends. See the module doc for what is a torn tail and what is damage.
pub(crate) fn scan(
    disk: &dyn Disk,
    store: &Path,
    uuid: [u8; 16],
    from_lsn: u64,
    mut apply: impl FnMut(u64, &[u8]) -> Result<(), String>,
) -> Result<End, StoreError> {
    let seqs = segments(disk, store)?;
    // Each segment's bytes are read once, when the scan reaches it.
    let read = |seq: u64| -> Result<(PathBuf, Vec<u8>), StoreError> {
        let p = segment_path(store, seq);
        let f = disk.open(&p, false).map_err(StoreError::io(&p, "open"))?;
        let b = f.read_all().map_err(StoreError::io(&p, "read"))?;
        Ok((p, b))
    };
    let mut expected = from_lsn;
    let mut end = End {
        segment: 0,
        offset: SEGMENT_HEADER as u64,
        next_lsn: from_lsn,
        torn: false,
        dirty: false,
        later: false,
        started: false,
    };
    let mut started = false;
    // The LSN after the last record of the segment before (segments follow on without gap,
    // whether or not their records are wanted).
    let mut follows = from_lsn;
    for (k, &seq) in seqs.iter().enumerate() {
        // Segments are made one after another, each name flushed before the next is made:
        // a missing number is a removed segment, never something a crash leaves.
        let want = match k {
            0 if from_lsn == 1 => Some(1),
            0 => None,
            _ => Some(seqs[k - 1] + 1),
        };
        if let Some(want) = want.filter(|&w| w != seq) {
            return Err(StoreError::damaged(
                segment_path(store, seq),
                0,
                format!("segment {want:016x} is missing"),
            ));
        }
        let (path, bytes) = read(seq)?;
        let header = match SegmentHeader::decode(&bytes) {
            Ok(Some(h)) if h.first_lsn != 0 => h,
            Ok(spare) => {
                match spare {
                    // Made but never used, so zeros throughout (the header is flushed before
                    // anything is written after it).
                    None => {
                        if let Some(at) = bytes.iter().position(|&b| b != 0) {
                            return Err(StoreError::damaged(
                                &path,
                                0,
                                format!(
                                    "segment header is zeros, but the segment holds data at \
                                     byte {at}"
                                ),
                            ));
                        }
                    }
                    // A recycled segment not yet started: what follows is an earlier life's.
                    Some(h) if h.uuid != uuid => {
                        return Err(StoreError::damaged(&path, 16, "segment of another store"));
                    }
                    Some(h) if h.seq != seq => {
                        return Err(StoreError::damaged(
                            &path,
                            32,
                            format!("spare segment number {} in a file named {seq:016x}", h.seq),
                        ));
                    }
                    Some(_) => {}
                }
                // Every later segment must be unused too.
                contiguous(store, &seqs[k..])?;
                later_must_be_unused(disk, store, &seqs[k + 1..], uuid, expected)?;
                if end.segment == 0 || !started {
                    end.segment = seq;
                    end.offset = SEGMENT_HEADER as u64;
                    end.started = false;
                }
                end.next_lsn = expected;
                return Ok(end);
            }
            Err(what) => {
                // A torn header: the segment's first write never completed (the header is
                // flushed before any batch is written after it), unless batches or a later
                // segment were written after it.
                if valid_after(&bytes, SEGMENT_HEADER, seq, 0, &uuid).is_some() {
                    return Err(StoreError::damaged(&path, 0, what));
                }
                contiguous(store, &seqs[k..])?;
                later_must_be_unused(disk, store, &seqs[k + 1..], uuid, expected)
                    .map_err(|_| StoreError::damaged(&path, 0, what))?;
                end.segment = seq;
                end.offset = SEGMENT_HEADER as u64;
                end.torn = true;
                end.dirty = true;
                end.started = false;
                end.next_lsn = expected;
                return Ok(end);
            }
        };
        if header.uuid != uuid {
            return Err(StoreError::damaged(&path, 16, "segment of another store"));
        }
        if header.seq != seq {
            return Err(StoreError::damaged(
                &path,
                32,
                format!("segment number {} in a file named {seq:016x}", header.seq),
            ));
        }
        if started && header.first_lsn != follows {
            return Err(StoreError::damaged(
                &path,
                40,
                format!(
                    "segment starts at record {}, expected {follows}",
                    header.first_lsn
                ),
            ));
        }
        if !started && header.first_lsn > expected {
            return Err(StoreError::damaged(
                &path,
                40,
                format!(
                    "first segment starts at record {}, records from {expected} are missing",
                    header.first_lsn
                ),
            ));
        }
        started = true;
        let mut lsn = header.first_lsn;
        let mut at = SEGMENT_HEADER;
        end.segment = seq;
        end.started = true;
        loop {
            end.offset = at as u64;
            end.next_lsn = lsn.max(expected);
            let rest = &bytes[at.min(bytes.len())..];
            let h = BatchHeader::decode(rest, &uuid);
            let clean_end =
                rest.len() < BATCH_HEADER || rest[..BATCH_HEADER].iter().all(|&b| b == 0);
            let ok = h.filter(|h| {
                h.segment == seq
                    && h.first_lsn == lsn
                    && rest.len() >= BATCH_HEADER + h.len as usize
                    && crc32c::crc32c(&rest[BATCH_HEADER..BATCH_HEADER + h.len as usize]) == h.crc
            });
            let Some(h) = ok else {
                // The end of this segment's batches: clean (zeros, or a batch of an older
                // life of the file) or torn. Either way it is the journal's end, unless a
                // later batch says this place had been flushed (module doc).
                let stale = h.is_some_and(|h| h.segment != seq || h.first_lsn < lsn);
                if let Some(off) = flushed_witness(&bytes, at + 1, seq, lsn, &uuid) {
                    return Err(StoreError::damaged(
                        &path,
                        at as u64,
                        format!(
                            "batch does not check out, but the batch at byte {off} was written \
                             after this one was flushed"
                        ),
                    ));
                }
                match seqs.get(k + 1) {
                    Some(&next) if segment_is_used(disk, store, &uuid, next)? => {
                        if !(clean_end || stale) {
                            return Err(StoreError::damaged(
                                &path,
                                at as u64,
                                "batch does not check out, and later segments follow",
                            ));
                        }
                        break;
                    }
                    _ => {
                        if lsn < expected {
                            // The journal ends before the records wanted start: the writer
                            // could not continue it (its next batch would not follow on).
                            return Err(StoreError::damaged(
                                &path,
                                at as u64,
                                format!(
                                    "the journal ends at record {lsn}, before record {expected}"
                                ),
                            ));
                        }
                        end.torn = !(clean_end || stale);
                        end.dirty = bytes[at.min(bytes.len())..].iter().any(|&b| b != 0);
                        end.later = valid_after(&bytes, at + 1, seq, lsn, &uuid).is_some();
                        contiguous(store, &seqs[k..])?;
                        later_must_be_unused(disk, store, &seqs[k + 1..], uuid, lsn)?;
                        return Ok(end);
                    }
                }
            };
            let payload = &rest[BATCH_HEADER..BATCH_HEADER + h.len as usize];
            let Some(recs) = records(payload, h.count) else {
                return Err(StoreError::damaged(
                    &path,
                    at as u64,
                    "batch payload does not hold its record count",
                ));
            };
            let mut rec_at = at + BATCH_HEADER;
            for r in recs {
                if lsn >= expected {
                    apply(lsn, r).map_err(|what| {
                        StoreError::damaged(&path, rec_at as u64, format!("record {lsn}: {what}"))
                    })?;
                    expected = lsn + 1;
                }
                lsn += 1;
                rec_at += 4 + r.len();
            }
            at += BATCH_HEADER + h.len as usize;
        }
        expected = expected.max(lsn);
        follows = lsn;
    }
    end.next_lsn = expected;
    Ok(end)
}

/// Where [`follow`] goes on: the batch at byte `offset` of segment `seq` starts with record
/// `lsn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Cursor {
    pub seq: u64,
    pub offset: u64,
    pub lsn: u64,
}

/// Bytes of one segment, read forward a window at a time.
struct Window {
    path: PathBuf,
    file: Arc<dyn DiskFile>,
    /// Offset of `buf`'s first byte in the file (a multiple of [`BLOCK`]).
    start: u64,
    /// Bytes of `buf` read from the file.
    len: usize,
    buf: Blocks,
}

/// How much [`Window`] reads at once.
const WINDOW: usize = 1 << 20;

impl Window {
    fn open(disk: &dyn Disk, store: &Path, seq: u64) -> Result<Window, StoreError> {
        let path = segment_path(store, seq);
        let file = disk
            .open(&path, false)
            .map_err(StoreError::io(&path, "open"))?;
        Ok(Window {
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
            let want = ((off - start) as usize + len).max(WINDOW).div_ceil(BLOCK);
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
    let mut w = Window::open(disk, store, c.seq)?;
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
            let next = Window::open(disk, store, c.seq + 1)?;
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
        // Where a record's length field is in the payload: 4 bytes before the record.
        let frame = |r: &[u8]| r.as_ptr() as usize - payload.as_ptr() as usize - 4;
        if first < end {
            let last = recs[end - 1];
            let span = &payload[frame(recs[first])..frame(last) + 4 + last.len()];
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

/// The offset of the first valid batch header of segment `seq` at or after `from` that was
/// written once records from `lsn` on had been flushed.
fn flushed_witness(
    bytes: &[u8],
    from: usize,
    seq: u64,
    lsn: u64,
    uuid: &[u8; 16],
) -> Option<usize> {
    let mut at = from;
    while at + BATCH_HEADER <= bytes.len() {
        let next = bytes[at..].windows(4).position(|w| w == BATCH_MAGIC)? + at;
        if let Some(h) = BatchHeader::decode(&bytes[next..], uuid)
            && h.segment == seq
            && h.first_lsn >= lsn
            && h.flushed > lsn
        {
            return Some(next);
        }
        at = next + 1;
    }
    None
}

/// The offset of the first valid batch header of segment `seq` with an LSN of at least `lsn`
/// at or after `from`.
fn valid_after(bytes: &[u8], from: usize, seq: u64, lsn: u64, uuid: &[u8; 16]) -> Option<usize> {
    let mut at = from;
    while at + BATCH_HEADER <= bytes.len() {
        let next = bytes[at..].windows(4).position(|w| w == BATCH_MAGIC)? + at;
        if let Some(h) = BatchHeader::decode(&bytes[next..], uuid)
            && h.segment == seq
            && h.first_lsn >= lsn
        {
            return Some(next);
        }
        at = next + 1;
    }
    None
}

/// A file opened, its first bytes (a segment header's length), and how many it has of them.
type Head = (Arc<dyn DiskFile>, [u8; SEGMENT_HEADER], usize);

/// The file at `p`, opened, and its first bytes: a segment header's length, or fewer (the
/// count) if the file is shorter.
fn head(disk: &dyn Disk, p: &Path) -> Result<Head, StoreError> {
    let f = disk.open(p, false).map_err(StoreError::io(p, "open"))?;
    let mut h = [0u8; SEGMENT_HEADER];
    let n = f.read_at(&mut h, 0).map_err(StoreError::io(p, "read"))?;
    Ok((f, h, n))
}

/// Whether segment `seq` was started: its header is neither zeros nor a spare header.
fn segment_is_used(
    disk: &dyn Disk,
    store: &Path,
    uuid: &[u8; 16],
    seq: u64,
) -> Result<bool, StoreError> {
    let (_, h, n) = head(disk, &segment_path(store, seq))?;
    Ok(!unused_header(&h[..n], uuid, seq))
}

/// The LSN segment `seq` starts at, if its header is whole and it was started.
pub(crate) fn first_lsn(
    disk: &dyn Disk,
    store: &Path,
    seq: u64,
) -> Result<Option<u64>, StoreError> {
    let (_, h, n) = head(disk, &segment_path(store, seq))?;
    Ok(SegmentHeader::decode(&h[..n])
        .ok()
        .flatten()
        .map(|h| h.first_lsn)
        .filter(|&lsn| lsn != 0))
}

/// `seqs` must follow each other without a gap (see the check at the top of [`scan`]).
fn contiguous(store: &Path, seqs: &[u64]) -> Result<(), StoreError> {
    for w in seqs.windows(2) {
        if w[1] != w[0] + 1 {
            return Err(StoreError::damaged(
                segment_path(store, w[1]),
                0,
                format!("segment {:016x} is missing", w[0] + 1),
            ));
        }
    }
    Ok(())
}

/// The offset of the first byte of `f` from `from` on that is not zero.
fn first_nonzero(f: &dyn DiskFile, from: u64) -> std::io::Result<Option<u64>> {
    let mut buf = vec![0u8; 1 << 20];
    let mut at = from;
    loop {
        let n = f.read_at(&mut buf, at)?;
        if n == 0 {
            return Ok(None);
        }
        if let Some(i) = buf[..n].iter().position(|&b| b != 0) {
            return Ok(Some(at + i as u64));
        }
        at += n as u64;
    }
}

/// Segments after the journal's end must be unused: they are spares (zeros throughout, or a
/// spare header and an earlier life's bytes). `lsn` is the journal's next LSN, for the
/// message.
fn later_must_be_unused(
    disk: &dyn Disk,
    store: &Path,
    seqs: &[u64],
    uuid: [u8; 16],
    lsn: u64,
) -> Result<(), StoreError> {
    for &seq in seqs {
        let p = segment_path(store, seq);
        let (f, h, n) = head(disk, &p)?;
        let what = match SegmentHeader::decode(&h[..n]) {
            Ok(Some(h)) if h.first_lsn == 0 && h.uuid == uuid && h.seq == seq => continue,
            Ok(None) => match first_nonzero(&*f, n as u64).map_err(StoreError::io(&p, "read"))? {
                None => continue,
                Some(at) => format!(
                    "segment after the end of the journal (record {lsn}) holds data at byte {at}"
                ),
            },
            Ok(Some(h)) if h.uuid == uuid && h.first_lsn >= lsn => format!(
                "segment with records from {} follows the end of the journal (record {lsn})",
                h.first_lsn
            ),
            // A segment gets a header only once every earlier one is flushed and whole, so
            // none can follow the journal's end: this is no spare, whatever it holds.
            _ => format!("segment after the end of the journal (record {lsn}) is not empty"),
        };
        return Err(StoreError::damaged(&p, 0, what));
    }
    Ok(())
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
    /// (module doc, "Recycling"), so the next batch starts the next segment.
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

/// Memory aligned to [`BLOCK`], in whole blocks, for block writes.
#[derive(Default)]
struct Blocks(Vec<Block>);

#[derive(Clone, Copy)]
#[repr(C, align(4096))]
struct Block([u8; BLOCK]);

impl Blocks {
    /// The first `n` blocks as bytes, growing the buffer if needed.
    fn bytes(&mut self, n: usize) -> &mut [u8] {
        if self.0.len() < n {
            self.0.resize(n, Block([0; BLOCK]));
        }
        // SAFETY: `Block` is `repr(C)` over a byte array with no padding (its size equals its
        // alignment, BLOCK), so `n` consecutive blocks of the vector are `n * BLOCK`
        // initialized bytes, borrowed mutably for as long as `self` is.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast::<u8>(), n * BLOCK) }
    }
}

type SpareJob = std::thread::JoinHandle<Result<(u64, Arc<dyn DiskFile>), StoreError>>;

/// Where the next segment stands ([`Writer::poll_spare`]).
#[derive(Debug)]
pub(crate) enum Spare {
    /// Made, waiting to be used.
    Ready,
    /// Being made.
    Making,
    /// Neither (the last attempt failed and was reported).
    Missing,
    /// Making it failed (a partly made file is removed).
    Failed(StoreError),
}

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
                    // continuation (module doc, "Recycling"); an earlier life's batches
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
    /// the same place, by the next call), so that the caller can retry (module doc,
    /// "Errors").
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
                    if BATCH_HEADER + (end + 4 + len - at) > room(self) && n > 0 {
                        break;
                    }
                    end += 4 + len;
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

/// A new segment is zero-filled in writes of this size.
const ZERO_FILL: usize = 1 << 20;

/// The first block of a spare made from a recycled segment: a spare header (first LSN 0)
/// of number `seq`, then zeros.
fn spare_block(uuid: [u8; 16], seq: u64) -> Blocks {
    let mut b = Blocks::default();
    let header = SegmentHeader {
        uuid,
        seq,
        first_lsn: 0,
    }
    .encode();
    b.bytes(1)[..SEGMENT_HEADER].copy_from_slice(&header);
    b
}

/// Makes segment `seq` out of a segment kept for reuse (module doc, "Recycling"): the
/// lowest `<n>.free` of `size` bytes gets a spare header of number `seq` (flushed), and is
/// renamed into place (the name flushed). Free segments of another size are removed (a
/// segment grown for one large record, or written with another `segment_size`). `None` when
/// there is none to reuse, or reusing one failed (it is removed then: a segment is made
/// afresh instead, and reports the host's error if it has one).
fn recycle_segment(
    disk: &dyn Disk,
    store: &Path,
    uuid: [u8; 16],
    seq: u64,
    size: u64,
) -> Option<Arc<dyn DiskFile>> {
    let d = dir(store);
    let p = segment_path(store, seq);
    for n in free_segments(disk, store).ok()? {
        let from = free_path(store, n);
        let reused = disk.open(&from, false).and_then(|f| {
            if f.len()? != size {
                return Err(std::io::Error::other("not a segment's size"));
            }
            // The rename that made it free is flushed before its header changes: otherwise
            // a crash could bring back the covered segment with a spare header of a later
            // number, which a scan takes for damage.
            disk.sync_dir(&d)?;
            f.write_blocks(spare_block(uuid, seq).bytes(1), 0)?;
            f.sync_data()?;
            disk.rename(&from, &p)?;
            disk.sync_dir(&d)?;
            Ok(f)
        });
        match reused {
            Ok(f) => return Some(f),
            Err(_) => {
                let _ = disk.remove(&from);
            }
        }
    }
    None
}

/// The checkpointer's hold on the host's room (docs/STORE.md, "Checkpoints", Out of room):
/// while it is on, the journal makes no segment unless the host has room for one beside what
/// a checkpoint of one segment may need, so that the room a checkpoint short of it frees
/// (its reserve, the segments it removes) goes to that checkpoint, not to held records.
///
/// The committer looks at the hold when it asks for a spare ([`Writer::prepare_spare`]) and,
/// making one itself ([`Writer::take_spare`]), again under `making`, which turning the hold
/// on takes. The spare maker's thread does not look again: a spare begun before the hold
/// went on may take the room the checkpoint's reserve gives back (docs/STORE.md, known bug
/// A). Looking there too was tried and made things worse: a store that filled a 64 MiB tmpfs
/// through a mount then stayed stuck after half its files were deleted (3 runs of 3), as
/// the removals held in memory never reached the journal while every checkpoint, without
/// them, failed for lack of room; with the spare made they are written, and the checkpoint
/// that follows skips the deleted files' data. Turning the hold off waits for nothing.
#[derive(Default)]
pub(crate) struct RoomHold {
    on: AtomicBool,
    /// Held while a segment is made, and while the hold goes on.
    making: parking_lot::Mutex<()>,
    /// The LSN of the last record the checkpoint holds, durably (0: not known).
    covered: std::sync::atomic::AtomicU64,
}

impl RoomHold {
    /// The checkpoint now durably holds every record up to `lsn`.
    pub(crate) fn set_covered(&self, lsn: u64) {
        self.covered.fetch_max(lsn, SeqCst);
    }

    /// Whether the checkpoint holds every record up to `lsn`.
    fn covers(&self, lsn: u64) -> bool {
        self.covered.load(SeqCst) >= lsn
    }

    /// Whether the hold is on.
    pub(crate) fn is_on(&self) -> bool {
        self.on.load(SeqCst)
    }

    /// Turns the hold on (once any segment being made is made) or off.
    pub(crate) fn set(&self, on: bool) {
        if on {
            let _making = self.making.lock();
            self.on.store(true, SeqCst);
        } else {
            self.on.store(false, SeqCst);
        }
    }

    /// ENOSPC, naming segment `seq`, while the hold is on and the host has no room for a
    /// segment of `size` beside what a checkpoint of one segment may need; never while every
    /// record written is in the checkpoint (`covered`: no checkpoint needs room for them, and
    /// records held for lack of room could otherwise never be written).
    fn check(
        &self,
        disk: &dyn Disk,
        store: &Path,
        seq: u64,
        size: u64,
        covered: bool,
    ) -> Result<(), StoreError> {
        if !self.on.load(SeqCst) || covered {
            return Ok(());
        }
        let room = size.saturating_add(checkpoint_room(size));
        if disk.available(store).is_none_or(|a| a >= room) {
            return Ok(());
        }
        Err(StoreError::Io {
            path: segment_path(store, seq),
            op: "make: the host's room is kept for a checkpoint that failed for lack of it",
            source: std::io::Error::from_raw_os_error(libc::ENOSPC),
        })
    }

    /// `make()`s segment `seq` unless the hold refuses it ([`RoomHold::check`]), the hold
    /// kept off meanwhile.
    fn make<T>(
        &self,
        disk: &dyn Disk,
        store: &Path,
        seq: u64,
        size: u64,
        covered: bool,
        make: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let _making = self.making.lock();
        self.check(disk, store, seq, size, covered)?;
        make()
    }
}

/// Below room for this many more segments on the host, the threads' record buffers are kept
/// small ([`Writer::host_short`]).
const SHORT_SEGMENTS: u64 = 8;

/// The length of segment `seq` (0 if it cannot be read).
pub(crate) fn segment_len(disk: &dyn Disk, store: &Path, seq: u64) -> u64 {
    disk.open(&segment_path(store, seq), false)
        .and_then(|f| f.len())
        .unwrap_or(0)
}

/// The room on the host a checkpoint of journal segments of `journal` bytes in all may need:
/// the data of the records they hold, which it copies into `checkpoint.redb` before the
/// segments go, and a quarter more for the database's own pages (a commit of one segment of
/// 8 MiB of file data took 8.9 MiB of a tmpfs).
pub(crate) fn checkpoint_room(journal: u64) -> u64 {
    journal.saturating_add(journal / 4)
}

/// Makes segment `seq`: recycled from a segment kept for reuse if there is one, else `size`
/// bytes allocated, a spare header and zeros written, flushed, its name flushed. A segment
/// `seq` made before (a spare the store had when it closed or crashed) is kept if it is a
/// whole recycled spare, and otherwise made again in place (never removed first: the
/// checkpointer may be reading the journal's list of segments).
fn make_segment(
    disk: &dyn Disk,
    store: &Path,
    uuid: [u8; 16],
    seq: u64,
    size: u64,
) -> Result<Arc<dyn DiskFile>, StoreError> {
    let p = segment_path(store, seq);
    if disk.exists(&p) {
        let (f, h, n) = head(disk, &p)?;
        let spare = matches!(SegmentHeader::decode(&h[..n]),
            Ok(Some(h)) if h.first_lsn == 0 && h.uuid == uuid && h.seq == seq);
        if spare && f.len().map_err(StoreError::io(&p, "size"))? == size {
            return Ok(f);
        }
    }
    if let Some(f) = recycle_segment(disk, store, uuid, seq, size) {
        return Ok(f);
    }
    let f = disk.open(&p, true).map_err(StoreError::io(&p, "create"))?;
    // Allocated (so that a full host fails here, not in a commit), then written with zeros:
    // a flush after a write into allocated but unwritten extents must also commit the host
    // filesystem's journal (the extents become written), which made each flush cost 300 µs
    // instead of 125 µs on ext4 here. Database logs pre-zero their files for the same reason.
    // The first block is a spare header (and zeros), written before the zeros after it: a
    // file of this number left from before (a spare, perhaps recycled, of another size) then
    // never shows zeros over its header with its old bytes after them, whatever a power cut
    // keeps of these writes.
    let mut zeros = Blocks(Vec::new());
    let zeros = zeros.bytes(ZERO_FILL / BLOCK);
    let made = f
        .allocate(size)
        .map_err(StoreError::io(&p, "allocate"))
        .and_then(|()| {
            f.write_blocks(spare_block(uuid, seq).bytes(1), 0)
                .map_err(StoreError::io(&p, "write the spare header"))?;
            let mut at = BLOCK as u64;
            while at < size {
                let n = (size - at).min(ZERO_FILL as u64) as usize;
                f.write_blocks(&zeros[..n.div_ceil(BLOCK) * BLOCK], at)
                    .map_err(StoreError::io(&p, "write zeros"))?;
                at += n as u64;
            }
            Ok(())
        })
        .and_then(|()| {
            f.sync_data()
                .map_err(StoreError::io(&p, "flush new segment"))
        })
        .and_then(|()| {
            let d = dir(store);
            disk.sync_dir(&d)
                .map_err(StoreError::io(&d, "flush directory"))
        });
    if let Err(e) = made {
        // Whatever was allocated goes back to the host; the file is unused (zeros, or a spare
        // header first) in any case, which a scan takes for a spare if the removal does not
        // happen.
        drop(f);
        let _ = disk.remove(&p);
        return Err(e);
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::{SimDisk, Unflushed};

    const UUID: [u8; 16] = [7; 16];

    fn writer(disk: &SimDisk, seg: u64) -> Writer {
        let store = Path::new("/s");
        disk.create_dir_all(&dir(store)).unwrap();
        let end = scan(disk, store, UUID, 1, |_, _| Ok(())).unwrap();
        Writer::new(Arc::new(disk.clone()), store, UUID, seg, end).unwrap()
    }

    fn all(disk: &SimDisk) -> Result<(Vec<Vec<u8>>, End), StoreError> {
        let mut v = Vec::new();
        let end = scan(disk, Path::new("/s"), UUID, 1, |lsn, r| {
            assert_eq!(lsn, v.len() as u64 + 1);
            v.push(r.to_vec());
            Ok(())
        })?;
        Ok((v, end))
    }

    fn recs(n: usize, size: usize) -> Vec<Vec<u8>> {
        (0..n).map(|i| vec![i as u8; size + i % 7]).collect()
    }

    #[test]
    fn records_come_back_in_order_across_segments_and_reopens() {
        let d = SimDisk::new();
        let mut w = writer(&d, 4096);
        let rs = recs(300, 40);
        for chunk in rs.chunks(17) {
            let refs: Vec<&[u8]> = chunk.iter().map(|r| &r[..]).collect();
            w.write(&refs).unwrap();
        }
        let (got, end) = all(&d).unwrap();
        assert_eq!(got, rs);
        assert_eq!(end.next_lsn, 301);
        assert!(!end.torn);
        assert!(segments(&d, Path::new("/s")).unwrap().len() > 3);
        // Reopened, the journal continues where it ended.
        let mut w = writer(&d, 4096);
        w.write(&[b"after".as_slice()]).unwrap();
        let (got, _) = all(&d).unwrap();
        assert_eq!(got.len(), 301);
        assert_eq!(got[300], b"after");
    }

    /// What the checkpointer reads: `follow`, from a cursor or from nothing, hands over
    /// exactly records `from..=upto`, across segments, a reopen, a record larger than a
    /// segment, and segments removed as a checkpoint removes them.
    #[test]
    fn follow_reads_exactly_the_records_asked_for_from_a_cursor_or_from_nothing() {
        use rand::{Rng, SeedableRng, rngs::StdRng};
        let seed: u64 = rand::random();
        let mut rng = StdRng::seed_from_u64(seed);
        let d = SimDisk::new();
        let store = Path::new("/s");
        let mut w = writer(&d, 4096);
        let mut rs = recs(300, 40);
        rs.insert(150, vec![5u8; 9000]);
        for chunk in rs[..200].chunks(17) {
            let refs: Vec<&[u8]> = chunk.iter().map(|r| &r[..]).collect();
            w.write(&refs).unwrap();
        }
        drop(w);
        let mut w = writer(&d, 4096);
        for chunk in rs[200..].chunks(5) {
            let refs: Vec<&[u8]> = chunk.iter().map(|r| &r[..]).collect();
            w.write(&refs).unwrap();
        }
        let last = rs.len() as u64;
        let (mut from, mut cursor) = (1u64, None);
        while from <= last {
            let upto = rng.random_range(from..=last.min(from + 60));
            for at in [None, cursor] {
                let mut got = Vec::new();
                let next = follow(&d, store, UUID, at, from, upto, |first, _, rs| {
                    for (k, r) in rs.iter().enumerate() {
                        got.push((first + k as u64, r.to_vec()));
                    }
                    Ok(())
                })
                .unwrap_or_else(|e| panic!("seed {seed}: {from}..={upto} from {at:?}: {e}"));
                let want: Vec<_> = (from..=upto)
                    .map(|l| (l, rs[l as usize - 1].clone()))
                    .collect();
                assert!(got == want, "seed {seed}: {from}..={upto} from {at:?}");
                assert!(next.lsn <= upto + 1, "seed {seed}: {next:?}");
                cursor = Some(next);
            }
            from = upto + 1;
            // As a checkpoint up to `upto` does: segment k goes once k + 1 starts at or
            // below `upto + 1`.
            let seqs = segments(&d, store).unwrap();
            for pair in seqs.windows(2) {
                match first_lsn(&d, store, pair[1]).unwrap() {
                    Some(l) if l <= from => d.remove(&segment_path(store, pair[0])).unwrap(),
                    _ => break,
                }
            }
        }
        // A record that is not there is an error, not a wait or a panic.
        let e = follow(
            &d,
            store,
            UUID,
            cursor,
            last + 1,
            last + 1,
            |_, _, _| Ok(()),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains(&format!("record {}", last + 1)),
            "{e}"
        );
    }

    #[test]
    fn a_record_larger_than_a_segment_gets_one_of_its_own() {
        let d = SimDisk::new();
        let mut w = writer(&d, 1024);
        let big = vec![9u8; 5000];
        w.write(&[b"a".as_slice(), &big, b"b"]).unwrap();
        let (got, _) = all(&d).unwrap();
        assert_eq!(got, vec![b"a".to_vec(), big, b"b".to_vec()]);
    }

    /// A power cut at any flush leaves a prefix of the batches written, every flushed batch
    /// included, and the journal opens without error.
    #[test]
    fn power_cuts_leave_a_prefix_with_every_flushed_batch() {
        let d = SimDisk::new();
        let images = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let flushed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut w = writer(&d, 2048);
        {
            let images = images.clone();
            let flushed = flushed.clone();
            d.on_sync(move |disk, _| {
                let f = flushed.load(std::sync::atomic::Ordering::SeqCst);
                for u in [Unflushed::Lost, Unflushed::Kept, Unflushed::Torn(f as u64)] {
                    images.lock().push((f, disk.crash(u)));
                }
            });
        }
        let rs = recs(120, 30);
        for (k, chunk) in rs.chunks(5).enumerate() {
            let refs: Vec<&[u8]> = chunk.iter().map(|r| &r[..]).collect();
            w.write(&refs).unwrap();
            // Some batches stay unflushed for a while: a power cut may tear any of them.
            if k % 3 == 2 {
                w.flush().unwrap();
                flushed.store((k + 1) * 5, std::sync::atomic::Ordering::SeqCst);
            }
        }
        d.clear_hook();
        let images = std::mem::take(&mut *images.lock());
        assert!(images.len() > 50);
        for (f, img) in images {
            let (got, _) = all(&img).unwrap_or_else(|e| panic!("after {f} records: {e}"));
            assert!(
                got.len() >= f,
                "{} records back, {f} were flushed",
                got.len()
            );
            assert_eq!(got[..], rs[..got.len()]);
        }
    }

    /// A write that fails for lack of space leaves the records it did not write in the
    /// payload, and writing them again once there is room puts every record in the journal
    /// once, in order.
    #[test]
    fn records_not_written_for_lack_of_space_are_written_by_a_later_try() {
        let d = SimDisk::new();
        let mut w = writer(&d, 4096);
        w.write(&[b"first".as_slice()]).unwrap();
        assert!(matches!(w.poll_spare(true), Spare::Ready));
        d.set_space(Some(d.used()));
        // More than the room left in the segment and its spare.
        let rs = recs(100, 100);
        let mut p = Payload::new();
        for r in &rs {
            p.push(r);
        }
        let e = w.write_payload(&mut p).unwrap_err();
        assert!(out_of_space(&e), "{e}");
        let left = p.count as usize;
        assert!(left > 0 && left < rs.len(), "{left} left");
        let (got, _) = all(&d).unwrap();
        assert_eq!(got[1..], rs[..rs.len() - left]);
        // Still no room: the next try fails too, and loses nothing.
        assert!(out_of_space(&w.write_payload(&mut p).unwrap_err()));
        assert_eq!(p.count as usize, left);
        assert!(matches!(w.poll_spare(false), Spare::Missing));
        d.set_space(None);
        w.write_payload(&mut p).unwrap();
        assert_eq!(p.count, 0);
        w.flush().unwrap();
        let (got, end) = all(&d).unwrap();
        assert_eq!(got.len(), rs.len() + 1);
        assert_eq!(got[1..], rs[..]);
        assert!(!end.torn);
    }

    /// Offsets of the batches in a segment's bytes.
    fn batch_offsets(bytes: &[u8]) -> Vec<usize> {
        let mut at = SEGMENT_HEADER;
        let mut v = Vec::new();
        while let Some(h) = BatchHeader::decode(&bytes[at..], &UUID) {
            v.push(at);
            at += BATCH_HEADER + h.len as usize;
        }
        v
    }

    #[test]
    fn damage_before_the_tail_names_the_file_and_offset() {
        let d = SimDisk::new();
        let mut w = writer(&d, 1 << 16);
        for r in recs(10, 100) {
            w.write(&[&r]).unwrap();
            w.flush().unwrap();
        }
        let path = segment_path(Path::new("/s"), 1);
        let (_, bytes) = d.files().into_iter().find(|(p, _)| *p == path).unwrap();
        let batches = batch_offsets(&bytes);
        assert_eq!(batches.len(), 10);
        // A flipped byte in the third batch's payload: damage, reported there.
        let mut bad = bytes.clone();
        bad[batches[2] + BATCH_HEADER + 10] ^= 1;
        d.put(&path, bad);
        match all(&d) {
            Err(StoreError::Damaged {
                path: p, offset, ..
            }) => {
                assert_eq!(p, path);
                assert_eq!(offset, batches[2] as u64);
            }
            r => panic!("{r:?}"),
        }
        // The same flip in the last batch is a torn tail: dropped.
        let mut tail = bytes.clone();
        tail[batches[9] + BATCH_HEADER + 10] ^= 1;
        d.put(&path, tail);
        let (got, e) = all(&d).unwrap();
        assert_eq!(got.len(), 9);
        assert!(e.torn);
        assert_eq!(e.offset as usize, batches[9]);
        // A damaged segment header, with records after it: damage at byte 0.
        let mut head = bytes.clone();
        head[20] ^= 1;
        d.put(&path, head);
        match all(&d) {
            Err(StoreError::Damaged { offset: 0, .. }) => {}
            r => panic!("{r:?}"),
        }
    }
}

#[cfg(test)]
mod regressions {
    use super::*;
    use crate::disk::{SimDisk, Unflushed};

    const UUID: [u8; 16] = [7; 16];

    fn scan_all(disk: &SimDisk) -> Result<(Vec<Vec<u8>>, End), StoreError> {
        let mut v = Vec::new();
        let end = scan(disk, Path::new("/s"), UUID, 1, |_, r| {
            v.push(r.to_vec());
            Ok(())
        })?;
        Ok((v, end))
    }

    fn writer(disk: &SimDisk) -> Writer {
        let store = Path::new("/s");
        disk.create_dir_all(&dir(store)).unwrap();
        let end = scan(disk, store, UUID, 1, |_, _| Ok(())).unwrap();
        Writer::new(Arc::new(disk.clone()), store, UUID, 1 << 20, end).unwrap()
    }

    /// A crash can lose the sector holding a batch's header while a later batch, written
    /// without a flush between, survives whole. The scan ends cleanly at the zeros; the
    /// later batch must not come back as the continuation of batches written after the
    /// reopen that happen to end exactly where it starts.
    #[test]
    fn a_batch_left_after_a_clean_end_is_not_read_after_later_writes() {
        let d = SimDisk::new();
        let path = segment_path(Path::new("/s"), 1);
        let mut w = writer(&d);
        // Batch A, flushed: ends at 64 + 48 + 4 + 100.
        w.write(&[&[1u8; 100][..]]).unwrap();
        w.flush().unwrap();
        let b_at = SEGMENT_HEADER + BATCH_HEADER + 4 + 100;
        // Batch B (two records) ends exactly at a block boundary; batch C follows it.
        let b_len = BLOCK - b_at - BATCH_HEADER - 8;
        w.write(&[&[2u8; 10][..], &vec![2u8; b_len - 10]]).unwrap();
        w.write(&[&[3u8; 50][..]]).unwrap();
        drop(w);
        let (_, mut bytes) = d.files().into_iter().find(|(p, _)| *p == path).unwrap();
        // The crash: B's header never reached the disk (its bytes read as zeros); C did.
        bytes[b_at..b_at + BATCH_HEADER].fill(0);
        d.put(&path, bytes);
        let (got, end) = scan_all(&d).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(end.offset as usize, b_at);
        // Reopened: two new records of B's sizes end exactly where C starts.
        let mut w = writer(&d);
        w.write(&[&[4u8; 10][..], &vec![4u8; b_len - 10]]).unwrap();
        w.flush().unwrap();
        drop(w);
        let (got, _) = scan_all(&d).unwrap();
        assert_eq!(
            got.len(),
            3,
            "C, never acknowledged, came back after the new batch"
        );
        assert_eq!(got[2], vec![4u8; b_len - 10]);
    }

    /// Segment numbers never have a gap: a removed segment is damage, even when it was the
    /// last one in use (its spare left behind) or the first one.
    #[test]
    fn a_removed_segment_is_damage_wherever_it_was() {
        let store = Path::new("/s");
        let make = || {
            let d = SimDisk::new();
            let mut w = Writer::new(Arc::new(d.clone()), store, UUID, 4096, {
                d.create_dir_all(&dir(store)).unwrap();
                scan(&d, store, UUID, 1, |_, _| Ok(())).unwrap()
            })
            .unwrap();
            for k in 0..40u8 {
                w.write(&[&[k; 300][..]]).unwrap();
            }
            w.flush().unwrap();
            drop(w);
            d
        };
        let d = make();
        let seqs = segments(&d, store).unwrap();
        assert!(seqs.len() >= 4, "{seqs:?}");
        let last = *seqs.last().unwrap();
        // The spare is unused; the one before it is the last in use.
        assert!(!segment_is_used(&d, store, &UUID, last).unwrap());
        for gone in [1, last - 1, last / 2] {
            let d = make();
            d.remove(&segment_path(store, gone)).unwrap();
            match scan_all(&d) {
                Err(StoreError::Damaged {
                    path,
                    offset: 0,
                    what,
                }) => {
                    assert!(what.contains("missing"), "{what}");
                    assert_eq!(path, segment_path(store, gone + 1));
                }
                r => panic!("segment {gone} removed: {:?}", r.map(|(v, e)| (v.len(), e))),
            }
        }
    }

    /// As a checkpoint of every record up to `upto` does (`checkpoint::recycle`): segment
    /// `k` leaves the journal once `k + 1` starts at or below `upto + 1`, kept for reuse
    /// while fewer than `FREE_MAX` are.
    fn retire(d: &SimDisk, store: &Path, upto: u64) {
        let seqs = segments(d, store).unwrap();
        let mut free = free_segments(d, store).unwrap().len();
        for pair in seqs.windows(2) {
            match first_lsn(d, store, pair[1]).unwrap() {
                Some(l) if l <= upto + 1 => {
                    let p = segment_path(store, pair[0]);
                    if free < FREE_MAX {
                        d.rename(&p, &free_path(store, pair[0])).unwrap();
                        free += 1;
                    } else {
                        d.remove(&p).unwrap();
                    }
                }
                _ => break,
            }
        }
        d.sync_dir(&dir(store)).unwrap();
    }

    /// The records of `img` from `from` on, and where its journal ends.
    fn from_lsn(img: &SimDisk, from: u64) -> Result<(Vec<Vec<u8>>, End), StoreError> {
        let mut v = Vec::new();
        let end = scan(img, Path::new("/s"), UUID, from, |lsn, r| {
            assert_eq!(lsn, from + v.len() as u64);
            v.push(r.to_vec());
            Ok(())
        })?;
        Ok((v, end))
    }

    /// Segments recycled as spares hold an earlier life's batches after the end: a power cut
    /// at any flush (of a batch, a switch, a spare's header or a rename), with unflushed
    /// writes lost, kept or torn, leaves a journal that opens to a prefix of the records
    /// with every flushed one, never with a stale batch in it; a writer continuing such a
    /// journal (after a torn end, or stale bytes after a clean one) adds records that read
    /// back after that prefix, across further reopens.
    #[test]
    fn recycled_segments_come_back_as_a_prefix_after_power_cuts() {
        use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
        let store = Path::new("/s");
        let d = SimDisk::new();
        let images = Arc::new(parking_lot::Mutex::new(Vec::new()));
        // Records flushed, and the checkpoint's LSN (its records are no longer needed).
        let flushed = Arc::new(AtomicUsize::new(0));
        let ck = Arc::new(AtomicU64::new(0));
        d.create_dir_all(&dir(store)).unwrap();
        let end = scan(&d, store, UUID, 1, |_, _| Ok(())).unwrap();
        let mut w = Writer::new(Arc::new(d.clone()), store, UUID, 8192, end).unwrap();
        {
            let (images, flushed, ck) = (images.clone(), flushed.clone(), ck.clone());
            let mut n = 0u64;
            d.on_sync(move |disk, _| {
                n += 1;
                let f = flushed.load(SeqCst);
                let c = ck.load(SeqCst);
                let u = match n % 3 {
                    0 => Unflushed::Lost,
                    1 => Unflushed::Kept,
                    _ => Unflushed::Torn(n),
                };
                images.lock().push((f, c, disk.crash(u)));
            });
        }
        let rs: Vec<Vec<u8>> = (0..900)
            .map(|i| vec![(i % 251) as u8; 60 + i % 300])
            .collect();
        for (k, chunk) in rs.chunks(7).enumerate() {
            let refs: Vec<&[u8]> = chunk.iter().map(|r| &r[..]).collect();
            w.write(&refs).unwrap();
            if k % 4 == 3 {
                w.flush().unwrap();
                flushed.store((k + 1) * 7, SeqCst);
            }
            if k % 9 == 8 {
                // A checkpoint of everything flushed: its segments leave the journal.
                let upto = flushed.load(SeqCst) as u64;
                ck.store(upto, SeqCst);
                retire(&d, store, upto);
            }
        }
        w.flush().unwrap();
        drop(w);
        d.clear_hook();
        let images = std::mem::take(&mut *images.lock());
        assert!(images.len() > 100, "{} images", images.len());
        // Spares were made from recycled segments (else this tests nothing new).
        let recycled = images
            .iter()
            .filter(|(_, _, img)| {
                img.files().iter().any(|(p, b)| {
                    p.extension().is_some_and(|e| e == "seg")
                        && SegmentHeader::decode(b).is_ok_and(|h| h.is_some())
                        && b[SEGMENT_HEADER..].iter().any(|&x| x != 0)
                        && b.windows(4).filter(|w| *w == BATCH_MAGIC).count() > 0
                })
            })
            .count();
        assert!(recycled > 0);
        for (i, (f, c, img)) in images.into_iter().enumerate() {
            let want = |got: &[Vec<u8>]| {
                assert!(
                    c as usize + got.len() >= f,
                    "image {i}: {} records back after {c}, {f} were flushed",
                    got.len()
                );
                assert!(
                    got[..] == rs[c as usize..c as usize + got.len()],
                    "image {i}: records after {c} differ"
                );
            };
            let (got, end) = from_lsn(&img, c + 1).unwrap_or_else(|e| panic!("image {i}: {e}"));
            want(&got);
            // Continued twice, reopened in between: what was there, then the new records.
            let mut more = Vec::new();
            for round in 0..2u8 {
                let end = from_lsn(&img, c + 1)
                    .unwrap_or_else(|e| panic!("image {i}, reopen {round}: {e}"))
                    .1;
                let mut w = Writer::new(Arc::new(img.clone()), store, UUID, 8192, end).unwrap();
                for j in 0..25u8 {
                    let r = vec![200 + round, j, 0xee];
                    w.write(&[&r[..]]).unwrap();
                    more.push(r);
                }
                w.flush().unwrap();
            }
            let (again, _) = from_lsn(&img, c + 1).unwrap_or_else(|e| panic!("image {i}: {e}"));
            assert_eq!(again.len(), got.len() + more.len(), "image {i} ({end:?})");
            assert!(again[..got.len()] == got[..], "image {i}");
            assert!(again[got.len()..] == more[..], "image {i}");
        }
    }

    /// A writer reopening a journal whose last segment was grown past the segment size for
    /// one large record, with bytes a crash left after its end, closes that segment with
    /// zeros after the end (the file's length, not the segment size, bounds them), so that
    /// the segment still ends cleanly once later segments follow it.
    #[test]
    fn a_grown_segment_with_bytes_after_its_end_is_closed_cleanly() {
        let store = Path::new("/s");
        let d = SimDisk::new();
        let mut w = writer(&d);
        // Its batch ends exactly at a block's end (header 64, batch header 48, frame 4).
        let big = vec![3u8; (1 << 20) + 2 * BLOCK - SEGMENT_HEADER - BATCH_HEADER - 4];
        w.write(&[&big[..]]).unwrap();
        w.flush().unwrap();
        drop(w);
        // The grown segment: garbage after its last batch, as a torn later batch leaves.
        let seqs = segments(&d, store).unwrap();
        let grown = seqs
            .iter()
            .map(|&s| segment_path(store, s))
            .find(|p| d.files().iter().any(|(q, b)| q == p && b.len() > 1 << 20))
            .expect("a grown segment");
        let (_, mut bytes) = d.files().into_iter().find(|(q, _)| *q == grown).unwrap();
        let end = batch_end(&bytes);
        assert_eq!(end % BLOCK, 0);
        bytes.resize(end + 700, 0);
        bytes[end..].fill(0x5a);
        d.put(&grown, bytes);
        let (got, e) = scan_all(&d).unwrap();
        assert_eq!(got, vec![big.clone()]);
        assert!(e.dirty && e.torn, "{e:?}");
        let mut w = writer(&d);
        w.write(&[b"after".as_slice()]).unwrap();
        w.flush().unwrap();
        drop(w);
        let (got, e) = scan_all(&d).unwrap();
        assert_eq!(got, vec![big, b"after".to_vec()]);
        assert!(!e.torn, "{e:?}");
    }

    /// The end of the batches of a segment's bytes.
    fn batch_end(b: &[u8]) -> usize {
        let mut at = SEGMENT_HEADER;
        while let Some(h) = BatchHeader::decode(&b[at..], &UUID) {
            at += BATCH_HEADER + h.len as usize;
        }
        at
    }

    /// A payload whose header claims billions of records is refused without allocating
    /// for them.
    #[test]
    fn a_huge_record_count_allocates_nothing() {
        assert_eq!(records(&[1, 0, 0, 0, 9], u32::MAX), None);
        assert_eq!(records(&[1, 0, 0, 0, 9], 1), Some(vec![&[9u8][..]]));
    }

    /// A zeroed header does not make a segment that holds batches pass for an unused one
    /// (which would drop every record in it, acknowledged or not); found by the fuzzer.
    #[test]
    fn a_zeroed_header_of_the_last_segment_in_use_is_damage() {
        let d = SimDisk::new();
        let store = Path::new("/s");
        d.create_dir_all(&dir(store)).unwrap();
        let end = scan(&d, store, UUID, 1, |_, _| Ok(())).unwrap();
        let mut w = Writer::new(Arc::new(d.clone()), store, UUID, 4096, end).unwrap();
        for k in 0..30u8 {
            w.write(&[&[k; 300][..]]).unwrap();
            w.flush().unwrap();
        }
        drop(w);
        let seqs = segments(&d, store).unwrap();
        let last = seqs[seqs.len() - 2];
        assert!(segment_is_used(&d, store, &UUID, last).unwrap());
        let p = segment_path(store, last);
        let (_, mut bytes) = d.files().into_iter().find(|(q, _)| *q == p).unwrap();
        bytes[..SEGMENT_HEADER].fill(0);
        d.put(&p, bytes);
        match scan_all(&d) {
            Err(StoreError::Damaged {
                path, offset: 0, ..
            }) => assert_eq!(path, p),
            r => panic!("{:?}", r.map(|(v, e)| (v.len(), e))),
        }
    }
}
