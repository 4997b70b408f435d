//! The next segment, made ahead of need: zeroed (or recycled) and flushed on a thread of its
//! own, so that switching segments costs no zeroing, and a full host fails there, not in a
//! commit.

use std::path::Path;
use std::sync::Arc;

use super::blocks::Blocks;
use super::format::{SegmentHeader, spare_block};
use super::recycle::recycle_segment;
use super::segments::{dir, head, segment_path};
use crate::disk::{BLOCK, Disk, DiskFile};
use crate::error::StoreError;

pub(super) type SpareJob = std::thread::JoinHandle<Result<(u64, Arc<dyn DiskFile>), StoreError>>;

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

/// A new segment is zero-filled in writes of this size.
const ZERO_FILL: usize = 1 << 20;

/// Makes segment `seq`: recycled from a segment kept for reuse if there is one, else `size`
/// bytes allocated, a spare header and zeros written, flushed, its name flushed. A segment
/// `seq` made before (a spare the store had when it closed or crashed) is kept if it is a
/// whole recycled spare, and otherwise made again in place (never removed first: the
/// checkpointer may be reading the journal's list of segments).
pub(super) fn make_segment(
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
