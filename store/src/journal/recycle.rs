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

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::format::{SegmentHeader, spare_block};
use super::segments::{dir, head, listing, segment_path};
use crate::disk::{Disk, DiskFile};
use crate::error::StoreError;

/// How many covered segments are kept for reuse as spares (`<seq>.free`); a checkpoint
/// removes the others it covers.
pub(crate) const FREE_MAX: usize = 4;

/// The path of a segment kept for reuse, named by the number it had.
pub(crate) fn free_path(store: &Path, seq: u64) -> PathBuf {
    dir(store).join(format!("{seq:016x}.free"))
}

/// The segments kept for reuse (`<seq>.free`), by the number they had.
pub(crate) fn free_segments(disk: &dyn Disk, store: &Path) -> Result<Vec<u64>, StoreError> {
    Ok(listing(disk, store)?.1)
}

/// Removes the names of free segments that a crash may have left on a file of the journal:
/// a rename cut short between its two steps leaves the file under both names (the host
/// journals a rename as one operation, but a crash image of this project's tests may keep
/// the new name without the old one's removal). Such a free segment is `<k>.free` beside
/// `<k>.seg` (a checkpoint's rename of a covered segment), or one whose first block is a
/// spare header of a number `<s>.seg` has (a spare's rename into place); reusing it would
/// write over a segment of the journal. Dropping the name loses nothing: the file is kept
/// by its other name, or is only room not reused. Run before the writer makes any spare.
pub(super) fn tidy_free(disk: &dyn Disk, store: &Path, uuid: &[u8; 16]) -> Result<(), StoreError> {
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

/// Makes segment `seq` out of a segment kept for reuse (module doc): the
/// lowest `<n>.free` of `size` bytes gets a spare header of number `seq` (flushed), and is
/// renamed into place (the name flushed). Free segments of another size are removed (a
/// segment grown for one large record, or written with another `segment_size`). `None` when
/// there is none to reuse, or reusing one failed (it is removed then: a segment is made
/// afresh instead, and reports the host's error if it has one).
pub(super) fn recycle_segment(
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
