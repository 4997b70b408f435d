//! The checkpointer's hold on the host's room, and the room a checkpoint may need.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

use super::segments::segment_path;
use crate::disk::Disk;
use crate::error::StoreError;

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
    pub(super) fn covers(&self, lsn: u64) -> bool {
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
    pub(super) fn check(
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
    pub(super) fn make<T>(
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

/// The room on the host a checkpoint of journal segments of `journal` bytes in all may need:
/// the data of the records they hold, which it copies into `checkpoint.redb` before the
/// segments go, and a quarter more for the database's own pages (a commit of one segment of
/// 8 MiB of file data took 8.9 MiB of a tmpfs).
pub(crate) fn checkpoint_room(journal: u64) -> u64 {
    journal.saturating_add(journal / 4)
}
