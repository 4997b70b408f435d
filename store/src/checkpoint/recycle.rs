//! The segments a committed checkpoint covers leave the journal: kept for reuse as spares,
//! or removed (`journal/recycle.rs`).

use crate::disk::Disk;
use crate::error::StoreError;

use super::{Checkpoint, journal};

impl Checkpoint {
    /// Takes the journal segments whose records are all in the checkpoint out of the
    /// journal, oldest first: segment `k` goes when segment `k + 1` starts at or below the
    /// record after it. Only segments that `committed` covers go: never one a crash could
    /// still need. Each is kept for reuse as a spare (renamed `<k>.free`) while fewer than
    /// [`journal::FREE_MAX`] are, and removed otherwise, and always by a checkpoint short of
    /// room (`lean`: its room is what the next segment's commit needs).
    pub(super) fn recycle(&mut self, disk: &dyn Disk) -> Result<(), StoreError> {
        let seqs = journal::segments(disk, &self.store)?;
        let mut free = journal::free_segments(disk, &self.store)?.len();
        let mut removed = false;
        for w in seqs.windows(2) {
            let first = match journal::first_lsn(disk, &self.store, w[1]) {
                Ok(first) => first,
                // A spare the journal removed since the listing (it could not be made whole
                // for lack of room): it holds no record, so nothing after it is covered.
                Err(_) if !disk.exists(&journal::segment_path(&self.store, w[1])) => break,
                Err(e) => return Err(e),
            };
            match first {
                Some(first) if first <= self.committed + 1 => {
                    let p = journal::segment_path(&self.store, w[0]);
                    // A checkpoint short of room gives every segment's room back.
                    if free < journal::FREE_MAX && !self.lean {
                        let to = journal::free_path(&self.store, w[0]);
                        disk.rename(&p, &to).map_err(StoreError::io(&p, "rename"))?;
                        free += 1;
                    } else {
                        disk.remove(&p).map_err(StoreError::io(&p, "remove"))?;
                    }
                    removed = true;
                }
                _ => break,
            }
        }
        if removed {
            let jd = journal::dir(&self.store);
            disk.sync_dir(&jd)
                .map_err(StoreError::io(&jd, "flush directory"))?;
        }
        self.recycle_due = false;
        Ok(())
    }
}
