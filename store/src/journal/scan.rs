//! Reading the journal back when the store opens: [`scan`] reads every record from an LSN
//! on and stops at the first batch that does not check out:
//! - if nothing valid follows, or every valid batch after it says the torn region was not
//!   yet flushed when it was written, this is the torn tail: it and everything after it is
//!   dropped (none of it was acknowledged: an acknowledgement is a flush, which would have
//!   made the region whole);
//! - if a valid batch after it says the region had been flushed, the journal is damaged
//!   there, and the scan fails naming the file and offset.

use std::path::Path;
use std::sync::Arc;

use super::format::{
    BATCH_HEADER, BATCH_MAGIC, BatchHeader, RECORD_LEN, SEGMENT_HEADER, SegmentHeader, records,
    segment_at, unused_header,
};
use super::segments::{head, segment_path, segments};
use crate::disk::{Disk, DiskFile};
use crate::error::StoreError;

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
        let path = segment_path(store, seq);
        let (file, head_bytes, n) = head(disk, &path)?;
        let header = match SegmentHeader::decode(&head_bytes[..n]) {
            Ok(Some(h)) if h.first_lsn != 0 => h,
            Ok(spare) => {
                match spare {
                    // Made but never used, so zeros throughout (the header is flushed before
                    // anything is written after it).
                    None => {
                        let first = first_nonzero(&*file, n as u64)
                            .map_err(StoreError::io(&path, "read"))?;
                        if let Some(at) = first {
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
                        return Err(StoreError::damaged(
                            &path,
                            segment_at::STORE_ID as u64,
                            "segment of another store",
                        ));
                    }
                    Some(h) if h.seq != seq => {
                        return Err(StoreError::damaged(
                            &path,
                            segment_at::SEQ as u64,
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
                let at = SEGMENT_HEADER as u64;
                if after(&file, &path, at, at, seq, 0, &uuid)?.valid.is_some() {
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
            return Err(StoreError::damaged(
                &path,
                segment_at::STORE_ID as u64,
                "segment of another store",
            ));
        }
        if header.seq != seq {
            return Err(StoreError::damaged(
                &path,
                segment_at::SEQ as u64,
                format!("segment number {} in a file named {seq:016x}", header.seq),
            ));
        }
        if started && header.first_lsn != follows {
            return Err(StoreError::damaged(
                &path,
                segment_at::FIRST_LSN as u64,
                format!(
                    "segment starts at record {}, expected {follows}",
                    header.first_lsn
                ),
            ));
        }
        if !started && header.first_lsn > expected {
            return Err(StoreError::damaged(
                &path,
                segment_at::FIRST_LSN as u64,
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
        let len = file.len().map_err(StoreError::io(&path, "size"))? as usize;
        let mut seg = Prefix {
            path: &path,
            file,
            len,
            bytes: head_bytes[..n].to_vec(),
        };
        loop {
            end.offset = at as u64;
            end.next_lsn = lsn.max(expected);
            seg.reach(at + BATCH_HEADER)?;
            let h = BatchHeader::decode(&seg.bytes[at.min(seg.bytes.len())..], &uuid);
            if let Some(h) = h.filter(|h| h.segment == seq && h.first_lsn == lsn) {
                seg.reach(at + BATCH_HEADER + h.len as usize)?;
            }
            let rest = &seg.bytes[at.min(seg.bytes.len())..];
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
                let rest_of = after(&seg.file, &path, at as u64, at as u64 + 1, seq, lsn, &uuid)?;
                if let Some(off) = rest_of.witness {
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
                        end.dirty = rest_of.nonzero;
                        end.later = rest_of.valid.is_some();
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
                rec_at += RECORD_LEN + r.len();
            }
            at += BATCH_HEADER + h.len as usize;
        }
        expected = expected.max(lsn);
        follows = lsn;
    }
    end.next_lsn = expected;
    Ok(end)
}

/// Bytes read at a time from a segment. The batches a scan applies are read as it reaches
/// them; what follows the journal's end (zeros, mostly: a segment is made whole, 64 MiB by
/// default, before its first batch) is searched through one buffer of this size. An opening
/// so reads what was written, and passes once over the rest, in memory it reuses.
const CHUNK: usize = 1 << 20;

/// A segment's bytes from its start, read as far as the scan has needed them.
struct Prefix<'p> {
    path: &'p Path,
    file: Arc<dyn DiskFile>,
    len: usize,
    bytes: Vec<u8>,
}

impl Prefix<'_> {
    /// Holds at least the first `upto` bytes, or the whole file if it is shorter.
    fn reach(&mut self, upto: usize) -> Result<(), StoreError> {
        let have = self.bytes.len();
        let want = upto.min(self.len);
        if want <= have {
            return Ok(());
        }
        let to = want.max(have + CHUNK).min(self.len);
        self.bytes.resize(to, 0);
        self.file
            .read_exact_at(&mut self.bytes[have..], have as u64)
            .map_err(StoreError::io(self.path, "read"))
    }
}

/// What follows a place in a segment, from one pass to its end ([`after`]).
#[derive(Debug, Default)]
struct After {
    /// The first valid batch header of the segment with an LSN of at least the one asked
    /// for, written once records from that LSN on had been flushed (the search stops there).
    witness: Option<u64>,
    /// The first valid batch header of the segment with an LSN of at least the one asked for.
    valid: Option<u64>,
    /// Whether a byte that is not zero follows.
    nonzero: bool,
}

/// Searches segment `seq` after a place: its bytes from `from` for one that is not zero, and
/// batch headers starting at `magic_from` or later (`from` or `from + 1`) for [`After`]'s
/// `valid` and `witness`, as of LSN `lsn`.
#[allow(clippy::too_many_arguments)]
fn after(
    f: &Arc<dyn DiskFile>,
    path: &Path,
    from: u64,
    magic_from: u64,
    seq: u64,
    lsn: u64,
    uuid: &[u8; 16],
) -> Result<After, StoreError> {
    let len = f.len().map_err(StoreError::io(path, "size"))?;
    let finder = memchr::memmem::Finder::new(&BATCH_MAGIC);
    // Each chunk is read with a batch header's length more, so that a header that starts in
    // it is whole in the buffer.
    let mut buf = vec![0u8; CHUNK + BATCH_HEADER];
    let mut out = After::default();
    let mut pos = from;
    while pos < len {
        let n = ((len - pos) as usize).min(buf.len());
        f.read_exact_at(&mut buf[..n], pos)
            .map_err(StoreError::io(path, "read"))?;
        let own = n.min(CHUNK);
        out.nonzero = out.nonzero || nonzero_at(&buf[..own]).is_some();
        for i in finder.find_iter(&buf[..n]) {
            if i >= own {
                break;
            }
            let off = pos + i as u64;
            if off < magic_from {
                continue;
            }
            if let Some(h) = BatchHeader::decode(&buf[i..n], uuid)
                && h.segment == seq
                && h.first_lsn >= lsn
            {
                out.valid.get_or_insert(off);
                if h.flushed > lsn {
                    out.witness = Some(off);
                    return Ok(out);
                }
            }
        }
        pos += own as u64;
    }
    Ok(out)
}

/// The index of the first byte of `b` that is not zero. (Whole blocks are or-ed together
/// first, which the compiler vectorises; a byte-at-a-time search is several times slower
/// over the megabytes of zeros a segment holds.)
fn nonzero_at(b: &[u8]) -> Option<usize> {
    const STEP: usize = 4096;
    let block = b
        .chunks(STEP)
        .position(|c| c.iter().fold(0u8, |a, &x| a | x) != 0)?;
    let at = block * STEP;
    b[at..].iter().position(|&x| x != 0).map(|i| at + i)
}

/// Whether segment `seq` was started: its header is neither zeros nor a spare header.
pub(super) fn segment_is_used(
    disk: &dyn Disk,
    store: &Path,
    uuid: &[u8; 16],
    seq: u64,
) -> Result<bool, StoreError> {
    let (_, h, n) = head(disk, &segment_path(store, seq))?;
    Ok(!unused_header(&h[..n], uuid, seq))
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
        if let Some(i) = nonzero_at(&buf[..n]) {
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
