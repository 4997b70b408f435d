//! One checkpoint: the journal's records after the checkpoint read, applied and committed,
//! in one redb write transaction or, short of room, one per journal segment (`mod.rs`,
//! "Out of room").

use std::path::Path;

use lanefs::RecordSummary;

use super::abandoned::Abandoned;
use super::kv::{self, Superblock};
use super::window::RECORD_WINDOW;
use super::{Checkpoint, DATA, META, ZEROS, apply, guarded, journal};
use crate::disk::Disk;
use crate::error::CheckpointError;

impl Checkpoint {
    /// Applies the journal's records after the checkpoint up to LSN `upto` (which must be
    /// durable in the journal) and commits them ([`Checkpoint::apply_in_transactions`]); then
    /// removes the segments it covers. `stop` abandons it between records. Returns the
    /// records applied. If redb failed, the database is dropped and reopened, here or (if that
    /// fails too) by the next call or [`Checkpoint::reopen`] (`mod.rs`, "Errors"); a database
    /// a page read found failing is reopened first.
    pub(crate) fn apply_journal(
        &mut self,
        disk: &dyn Disk,
        upto: u64,
        stop: &dyn Fn() -> bool,
    ) -> Result<u64, CheckpointError> {
        if self.needs_reopen() {
            self.reopen(disk)?;
        }
        if upto <= self.sb.lsn {
            if self.recycle_due {
                // Segments the last commit covers, left by a removal that failed (a commit
                // removes them itself).
                self.recycle(disk).map_err(CheckpointError::Store)?;
            }
            return Ok(0);
        }
        // Page readers that meet redb's error meanwhile wait for the outcome.
        self.shared.busy(true);
        // A checkpoint that may lack room keeps what room there is, and what it frees, from
        // the journal's held records until it has committed (`room_hold`).
        let short = |store: &Path| {
            let seg = journal::segments(disk, store)
                .ok()
                .and_then(|s| s.first().map(|&q| journal::segment_len(disk, store, q)))
                .unwrap_or(0);
            disk.available(store)
                .is_some_and(|a| a < journal::checkpoint_room(seg))
        };
        let held = self.room_hold.is_on();
        if short(&self.store) {
            self.room_hold.set(true);
        }
        let r = guarded(
            || self.apply_in_transactions(disk, upto, stop),
            Abandoned::db,
        );
        if r.is_err() {
            self.careful = true;
        }
        // Held after a failure short of room, for the next try; but not after a try that had
        // the room held and still failed: the journal then gets its turn, so that records it
        // holds for lack of room (the removals among them, which the next try can use) are
        // written rather than wait for a checkpoint that cannot succeed without them.
        self.room_hold
            .set(r.is_err() && short(&self.store) && !held);
        let r = match r {
            Ok(applied) => Ok(applied),
            Err(f) if f.reopen => {
                // redb refuses every transaction after some failures ("close and re-open the
                // database"): drop it (its file is left as a crash would leave it: the last
                // committed transaction, which the reopen recovers) and reopen it now.
                match self.reopen(disk) {
                    Ok(()) => Err(f.error),
                    Err(e) => Err(CheckpointError::ThenReopen {
                        failure: Box::new(f.error),
                        reopen: Box::new(e),
                    }),
                }
            }
            Err(f) => Err(f.error),
        };
        self.shared.busy(false);
        r
    }

    /// [`Checkpoint::apply_journal`]'s work: the records applied and committed in one
    /// transaction ([`Checkpoint::apply_and_commit`]); after a failure (`careful`), or on
    /// a host with less room than the whole journal's commit may need, one per journal
    /// segment, each committed and the segment removed before the next is applied, so that
    /// the checkpoint needs room for one segment's changes, not the whole journal's, and the
    /// reserve's room for the first (`mod.rs`, "Out of room").
    fn apply_in_transactions(
        &mut self,
        disk: &dyn Disk,
        upto: u64,
        stop: &dyn Fn() -> bool,
    ) -> Result<u64, Abandoned> {
        let from = self.sb.lsn + 1;
        // One transaction for the whole journal, unless the host's room is short of what that
        // may need (or a checkpoint failed): then one per segment.
        let seqs = journal::segments(disk, &self.store)
            .map_err(|e| Abandoned::other(CheckpointError::Store(e)))?;
        let size = seqs
            .first()
            .map_or(0, |&q| journal::segment_len(disk, &self.store, q));
        let short = disk
            .available(&self.store)
            .is_some_and(|a| a < journal::checkpoint_room(size.saturating_mul(seqs.len() as u64)));
        let segmentwise = self.careful || short;
        if self.careful {
            self.spend_reserve(disk);
        }
        let pages_absorbed = if segmentwise {
            self.freed(disk, self.cursor, from, upto, stop)?
        } else {
            apply::PagesAbsorbed::default()
        };
        // Segment by segment: the last record of each segment in range, then `upto`. (A
        // segment that cannot be read here ends the list: the spare being made, or one
        // removed meanwhile; damage is for the reading of the records to report.)
        let mut ends = Vec::new();
        if segmentwise {
            for &seq in seqs.iter().skip(1) {
                match journal::first_lsn(disk, &self.store, seq) {
                    Ok(Some(first)) if first > upto => break,
                    Ok(Some(first)) if first > from => ends.push(first - 1),
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => break,
                }
            }
        }
        ends.push(upto);
        let mut applied = 0;
        let last = ends.len() - 1;
        for (i, end) in ends.into_iter().enumerate() {
            // Segments covered before the last commit give their room to the next one; the
            // last commit's are kept for reuse (the journal's next spare).
            self.lean = short && i < last;
            let r = self.apply_and_commit(disk, end, stop, &pages_absorbed);
            applied += r.inspect_err(|_| self.lean = false)?;
        }
        self.lean = false;
        self.careful = false;
        Ok(applied)
    }

    /// Applies the records after the checkpoint up to `upto` in one transaction, commits it,
    /// and removes the segments it covers.
    fn apply_and_commit(
        &mut self,
        disk: &dyn Disk,
        upto: u64,
        stop: &dyn Fn() -> bool,
        pages_absorbed: &apply::PagesAbsorbed,
    ) -> Result<u64, Abandoned> {
        let from = self.sb.lsn + 1;
        let db = self
            .db
            .as_ref()
            .ok_or_else(|| Abandoned::db("the checkpoint is not open"))?;
        let mut txn = db.begin_write().map_err(Abandoned::db)?;
        txn.set_quick_repair(true);
        let mut applied = 0u64;
        let at = self.cursor.take();
        let (sb, next) = {
            let mut t = apply::Tables {
                meta: txn.open_table(META).map_err(Abandoned::db)?,
                data: txn.open_table(DATA).map_err(Abandoned::db)?,
                zeros: txn.open_table(ZEROS).map_err(Abandoned::db)?,
                max_generation: self.sb.max_generation,
                absorption: std::mem::take(&mut self.absorption),
                pages_absorbed,
                open: None,
                changed: Default::default(),
                cookies: Default::default(),
                inodes: 0,
                pages: 0,
            };
            // The records are read once, into windows of about `RECORD_WINDOW` bytes; each window
            // is looked through for the files whose records cancel out within it
            // (`apply::Absorption`), then applied.
            let mut window = std::mem::take(&mut self.window);
            let mut why: Option<Abandoned> = None;
            let read = journal::follow(
                disk,
                &self.store,
                self.uuid,
                at,
                from,
                upto,
                |first, span, recs| {
                    if stop() {
                        return Err((0, String::new()));
                    }
                    // Decoded as they are read, so that a record that does not decode is
                    // reported where it lies in the journal.
                    window.push(first, span, recs, &mut t.absorption)?;
                    if window.bytes.len() >= RECORD_WINDOW {
                        applied += window.apply(&mut t).map_err(|f| {
                            let s = f.error.to_string();
                            why = Some(f);
                            (0, s)
                        })?;
                    }
                    Ok(())
                },
            );
            if let Some(why) = why {
                return Err(why);
            }
            if read.is_ok() {
                applied += window.apply(&mut t)?;
                self.window = window;
                self.absorption = std::mem::take(&mut t.absorption);
            }
            let next = match read {
                Err(_) if stop() => return Err(Abandoned::other(CheckpointError::Stopped)),
                Err(e) => return Err(Abandoned::other(CheckpointError::Store(e))),
                Ok(next) => next,
            };
            t.end()
                .map_err(|e| Abandoned::applying(e, CheckpointError::WriteBack))?;
            let sb = Superblock {
                uuid: self.uuid,
                lsn: upto,
                max_generation: t.max_generation,
                records: self.sb.records + applied,
                counts: self.sb.counts.and_then(|c| c.plus(t.inodes, t.pages)),
            };
            t.meta
                .insert(kv::SUPER, &sb.encode()[..])
                .map_err(Abandoned::db)?;
            (sb, next)
        };
        txn.commit().map_err(Abandoned::db)?;
        // Durable now (redb's commit flushed it): only now may segments go.
        self.sb = sb;
        self.committed = sb.lsn;
        self.room_hold.set_covered(sb.lsn);
        self.cursor = Some(next);
        self.recycle_due = true;
        self.recycle(disk)
            .map_err(|e| Abandoned::other(CheckpointError::Recycle(e)))?;
        Ok(applied)
    }

    /// The inodes that the records `from..=upto` free (a read of them that only glances at
    /// each): a checkpoint that writes none of their pages ends with the same keys, and
    /// needs no room for data that its own records delete again (`mod.rs`, "Out of room").
    fn freed(
        &self,
        disk: &dyn Disk,
        at: Option<journal::Cursor>,
        from: u64,
        upto: u64,
        stop: &dyn Fn() -> bool,
    ) -> Result<apply::PagesAbsorbed, Abandoned> {
        let mut pages_absorbed = apply::PagesAbsorbed::default();
        journal::follow(
            disk,
            &self.store,
            self.uuid,
            at,
            from,
            upto,
            |_, _, recs| {
                if stop() {
                    return Err((0, "stopped".into()));
                }
                for r in recs {
                    // A record that does not decode is reported by the reading that applies.
                    if let Ok(RecordSummary::Free { inode }) = RecordSummary::decode(r) {
                        pages_absorbed.insert(inode);
                    }
                }
                Ok(())
            },
        )
        .map_err(|e| Abandoned::other(CheckpointError::Store(e)))?;
        Ok(pages_absorbed)
    }
}
