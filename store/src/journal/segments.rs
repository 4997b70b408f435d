//! The journal's directory: the names of its segment files, their listing, and their first
//! bytes.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::format::SEGMENT_HEADER;
use super::format::SegmentHeader;
use crate::disk::{Disk, DiskFile};
use crate::error::StoreError;

/// The directory of the journal in a store.
pub(crate) fn dir(store: &Path) -> PathBuf {
    store.join("journal")
}

/// The path of segment `seq`.
pub(crate) fn segment_path(store: &Path, seq: u64) -> PathBuf {
    dir(store).join(format!("{seq:016x}.seg"))
}

/// The journal's segments, by sequence number (segments kept for reuse are not among
/// them; other files are refused).
pub(crate) fn segments(disk: &dyn Disk, store: &Path) -> Result<Vec<u64>, StoreError> {
    Ok(listing(disk, store)?.0)
}

/// The journal directory's segments and segments kept for reuse, each sorted.
pub(super) fn listing(disk: &dyn Disk, store: &Path) -> Result<(Vec<u64>, Vec<u64>), StoreError> {
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

/// A file opened, its first bytes (a segment header's length), and how many it has of them.
pub(super) type Head = (Arc<dyn DiskFile>, [u8; SEGMENT_HEADER], usize);

/// The file at `p`, opened, and its first bytes: a segment header's length, or fewer (the
/// count) if the file is shorter.
pub(super) fn head(disk: &dyn Disk, p: &Path) -> Result<Head, StoreError> {
    let f = disk.open(p, false).map_err(StoreError::io(p, "open"))?;
    let mut h = [0u8; SEGMENT_HEADER];
    let n = f.read_at(&mut h, 0).map_err(StoreError::io(p, "read"))?;
    Ok((f, h, n))
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

/// The length of segment `seq` (0 if it cannot be read).
pub(crate) fn segment_len(disk: &dyn Disk, store: &Path, seq: u64) -> u64 {
    disk.open(&segment_path(store, seq), false)
        .and_then(|f| f.len())
        .unwrap_or(0)
}
