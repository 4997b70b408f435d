//! The room kept on the host for checkpoints: the file [`RESERVE`] (`mod.rs`, "Out of
//! room").

use crate::disk::Disk;

use super::{Checkpoint, journal};

/// Room kept for checkpoints ([`Checkpoint::set_reserve`]).
const RESERVE: &str = "checkpoint.reserve";

impl Checkpoint {
    /// Keeps `bytes` of room for checkpoints on the host, in the file [`RESERVE`]: a
    /// checkpoint needs room of its own before it removes any segment (redb writes each
    /// transaction's pages anew), and a store whose journal filled the host would have none.
    /// Made now if there is room (else after the next checkpoint that takes every record),
    /// given up before a checkpoint that follows a failure.
    pub(crate) fn set_reserve(&mut self, disk: &dyn Disk, bytes: u64) {
        self.reserve = bytes;
        self.keep_reserve(disk);
    }

    /// Makes [`RESERVE`] whole if it is missing or short (a power cut may leave the name
    /// without the room); a host without the room keeps none (tried again after the next
    /// checkpoint).
    pub(super) fn keep_reserve(&self, disk: &dyn Disk) {
        let p = self.store.join(RESERVE);
        if self.reserve == 0 {
            return;
        }
        let made = disk.open(&p, true).and_then(|f| {
            if f.len()? >= self.reserve {
                return Ok(());
            }
            f.allocate(self.reserve)?;
            f.sync_data()
        });
        if made.is_err() {
            let _ = disk.remove(&p);
        }
    }

    /// Gives the room of [`RESERVE`] to the checkpoint about to be tried (none if missing),
    /// and that of the journal segments kept for reuse.
    pub(super) fn spend_reserve(&self, disk: &dyn Disk) {
        let _ = disk.remove(&self.store.join(RESERVE));
        journal::drop_free(disk, &self.store);
    }
}
