//! Checkpoints: the journal's records applied, in large batches, to an ordered key-value
//! store (redb; docs/STORE-KV.md says why), so that opening a store loads the checkpoint and
//! replays only the journal after it, and the journal segments the checkpoint covers are
//! removed (docs/STORE.md, "Checkpoints", is the specification).
//!
//! - `checkpoint.redb` in the store's directory holds two tables, `meta` (superblock,
//!   inodes, entries, xattrs, orphans) and `data` (file pages), keyed as `kv.rs` says. Its
//!   superblock names the LSN up to which every record is in it; a new store's checkpoint
//!   holds nothing (LSN 0). It is made under a temporary name and renamed into place, so a
//!   crash never leaves a half-made one.
//! - **A checkpoint** ([`Checkpoint::apply_journal`]) reads the journal records after the
//!   superblock's LSN up to a given one (records already flushed: the checkpointer makes
//!   them durable first, so a checkpoint never holds a record a crash could drop from the
//!   journal), applies them (`apply.rs`) and the new superblock in one redb write
//!   transaction, and commits it durably (redb's commit with quick-repair: a crash leaves
//!   the last committed checkpoint whole). Only then are the segments whose records are all
//!   in it removed, oldest first, and the journal directory flushed: a crash in between
//!   leaves segments that opening skips.
//! - **The checkpointer** is a thread of the open store (`spawn`) that takes a checkpoint
//!   when the journal holds [`crate::Options::checkpoint_records`] records after the last
//!   one, or [`crate::Options::checkpoint_segments`] segments. It is the only writer of
//!   the checkpoint; the committer never waits for it, and the engine never sees it. A
//!   checkpoint that fails (the host's error, or a record that does not fit the keys) is
//!   abandoned whole and said on stderr; the journal keeps every record, so nothing is lost,
//!   and the next try starts from the same place, after a wait that doubles with each
//!   failure in a row ("Retrying"). It also reopens, at its next look, a database that a page
//!   read found broken.
//! - **Opening** ([`Checkpoint::load`], `load.rs`) turns the keys into records that the
//!   engine's recovery applies, then the journal after the LSN is replayed as before.
//!
//! - **Pages** (`pages.rs`): the engine reads back the file pages it sent out of memory;
//!   a checkpoint begins a page epoch before its sync and declares it kept after its commit
//!   (`sync_and_apply`), which is what allows the engine to drop them (docs/STORE.md, "File data
//!   out of memory").
//!
//! **Errors.** After redb fails in a write transaction (the host's ENOSPC or EIO in a write,
//! a growth of the file or a flush, or redb's own error), the `Database` refuses every later
//! transaction ("close and re-open the database"). So when redb's error ends a checkpoint
//! (`apply::ApplyError::Db`, or any error from beginning, writing or committing the
//! transaction, or a panic in redb), [`Checkpoint::apply_journal`] drops the `Database` (after an
//! I/O failure redb writes nothing more to the file, leaving it as a crash would: the last
//! committed transaction, whole, since redb's commit is crash-safe) and opens it again from
//! the same file through the same backend, as the store's opening does (redb's recovery,
//! the superblock; not the integrity check, see `open_again`). If that fails too (still no room,
//! EIO), the store goes on without it, serving from the journal, and the next checkpoint tries the
//! reopen first. A record that does not fit the keys, a journal that cannot be read, or a stop
//! leave redb as it is (the transaction is dropped, i.e. aborted). Segments are removed only up to
//! `committed`, the LSN of the last commit known durable (one that returned `Ok`, or the one
//! found at opening), never past it: a reopen that finds a commit that reported an error
//! builds on it but removes nothing for it until a later commit succeeds, and a reopen that
//! finds less than `committed` is refused (the segments for it may be gone).
//!
//! **Out of room.** A checkpoint needs room of its own before it gives any back: redb writes
//! each transaction's pages anew, and segments go only after the commit. So a store whose
//! journal filled its host (the deleted files' writes still in it) would never get the room
//! back. Three things keep it from that:
//! - the journal being short of room (`Committer::low`) makes a checkpoint due, whatever else;
//! - when the journal cannot make its records durable (ENOSPC, records held), `sync_and_apply`
//!   checkpoints the records already durable (`Committer::flushed_lsn`), so that the segments
//!   they fill go and the held records (the removals that would free room among them) can
//!   be written;
//! - after a failure (`careful`) the next checkpoint gives up [`RESERVE`] (room kept on the
//!   host for this, made again after a checkpoint succeeds), looks through all its records
//!   for the files they free and writes none of their pages (the Free absorbs them:
//!   [`apply::PagesAbsorbed`]; it deletes them, so the keys end the same), and commits segment by
//!   segment, removing each before applying the next, so that it needs room for one segment's
//!   changes at most.
//!
//! A commit of one segment's records, with a later record's Free already applied to the
//! pages of a file, is a checkpoint in which that file's data is missing until the journal
//! after it is replayed: recovery always replays to the journal's end, which holds the Free
//! (it was durable before the checkpoint began), so no state that misses the data is ever
//! served; only `fsck --repair` of a journal damaged between the two would show the file
//! with holes where its data was.
//!
//! redb also refuses every transaction after a failed *read* of its file, read transactions
//! included. A page reader that meets redb's error (the host failed a read of a page out of
//! memory: the caller gets EIO) marks the database broken (`pages::SharedDb`); the checkpointer
//! reopens it at its next look ([`Checkpoint::reopen`]), and a checkpoint on demand first
//! thing, so that once the host reads again the pages read back without a checkpoint being
//! due or the store being reopened.
//!
//! **Retrying.** Each try of a checkpoint applies every record after the last good one
//! again, so while they keep failing the checkpointer waits between tries ([`Backoff`]):
//! `checkpoint_retry` (1 s) after the first failure of a run, twice as long after each
//! further one, at most `checkpoint_retry_max` (a minute), on the store's clock
//! ([`crate::clock`]). Its reopens of the database count as tries: a failed one is a
//! failure, and none is tried while it waits. A checkpoint that succeeds ends the run.
//! [`Checkpointer::checkpoint_now`] (`StoreHandle::checkpoint`) never waits, but counts: its
//! success ends the run, its failure doubles the next wait. The backoff lives in the
//! [`Checkpoint`], under its mutex, with the tries counted for `StoreHandle::checkpoint_status`.
//!
//! **Locking.** The open store's [`Checkpoint`] lives in one mutex (`Checkpointer::ck`).
//! Every use of its `Database`, and the drop and reopen that replace it, happen with that
//! mutex held and `&mut Checkpoint`: by the checkpointer's thread, by
//! [`Checkpointer::checkpoint_now`] (`StoreHandle::checkpoint`), and by [`Checkpointer::lsn`]
//! (`StoreHandle::checkpoint_lsn`, which therefore waits for a checkpoint in progress).
//! Transactions never outlive [`Checkpoint::apply_journal`] or [`Checkpoint::load`], so when the
//! `Database` is dropped nothing holds a transaction of it (redb would otherwise defer its
//! close to the transaction's end), and no one sees the swap. [`Checkpoint::load`] runs
//! while the store is being opened, before the checkpointer exists. fsck opens a
//! `Database` of its own, under the store's lock file, so never while a store has it open.
//!
//! The page readers (`pages.rs`) share the open `Database` through a slot of their own
//! (`Shared`), outside the mutex: a reopen first empties the slot, waits until no reader
//! holds the old `Database` (a read transaction is short), drops it, and puts the new one
//! in. While a checkpoint writes or reopens (`SharedDb::busy`), a reader that finds the slot
//! empty, or meets redb's error, waits for the database that replaces it (however long the
//! checkpoint takes: woken by the slot's condition variable, whose mutex is taken before the
//! slot's lock) and reads that; reads of file pages out of memory fail with EIO only when
//! there is none (the reopen failed); it lets go of the `Database` it failed on before it waits
//! (the reopen waits for every holder), naming it by the number of the put that put it in the slot.
//! A reader marks the slot broken only if the slot still holds the `Database` the reader
//! failed on, and putting a database in clears the mark, so a reader of a replaced one
//! never breaks its successor.
//!
//! The engine holds every inode and name in memory; the checkpoint bounds the journal, the
//! time to open, and the file data in memory.

//! One concept to a file:
//! - `database.rs`: the redb database: opening (made if missing, checked, compacted), and
//!   dropping and reopening it after redb failed;
//! - `transaction.rs`: one checkpoint: the records read, applied and committed, in one
//!   transaction or segment by segment;
//! - `window.rs`: the records a checkpoint has read and not yet applied;
//! - `apply.rs`: a record's change to the keys; `kv.rs`: the keys and values;
//! - `recycle.rs`: the segments a committed checkpoint covers leave the journal;
//! - `reserve.rs`: the room kept on the host for checkpoints;
//! - `checkpointer.rs`: the thread that takes checkpoints when they are due;
//! - `backoff.rs`: the waits between failed tries;
//! - `load.rs`: the keys loaded into a filesystem being opened;
//! - `pages.rs`: file pages read back for the engine; `backend.rs`: redb's storage.

mod abandoned;
pub(crate) mod apply;
mod backend;
mod backoff;
mod checkpointer;
mod database;
pub(crate) mod kv;
mod load;
mod on_demand;
mod pages;
mod recycle;
mod reserve;
mod transaction;
mod window;

pub use checkpointer::CheckpointStatus;
pub(crate) use checkpointer::{Checkpointer, Policy, spawn};
#[cfg(test)]
pub(crate) use database::COMPACT_SLACK;
pub(crate) use database::Compact;
pub(crate) use pages::{PageReader, Shared, SharedDb};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use lanefs::Recovery;
use redb::{Database, ReadableDatabase, TableDefinition};

use crate::error::StoreError;
use crate::journal;
use backoff::Backoff;
use database::{damaged, guarded, panic_text};
use kv::Superblock;
use window::RecordWindow;

/// The checkpoint's file name in the store's directory.
pub(crate) const FILE: &str = "checkpoint.redb";

pub(crate) const META: TableDefinition<&[u8], &[u8]> = TableDefinition::new("meta");
pub(crate) const DATA: TableDefinition<&[u8], &[u8]> = TableDefinition::new("data");
/// Runs of allocated zeros (`z` keys): made by the first write transaction of a checkpoint
/// of format 3; a checkpoint of format 2 has none.
pub(crate) const ZEROS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("zeros");

/// The checkpoint of an open store.
pub(crate) struct Checkpoint {
    /// `None` after redb failed, until [`Checkpoint::apply_journal`] reopens it (module doc,
    /// "Errors").
    db: Option<Arc<Database>>,
    /// The same database, for the page readers (module doc, "Locking").
    shared: Shared,
    path: PathBuf,
    store: PathBuf,
    uuid: [u8; 16],
    /// The superblock of the state `db` holds: what the next transaction builds on.
    sb: Superblock,
    /// Every record up to this LSN is in a checkpoint whose commit was known durable: one
    /// that returned without error, or the one found when the store was opened. Segments are
    /// removed up to it, never past it. Below `sb.lsn` only when a reopen found a commit that
    /// had reported an error (its flush may not have made it durable), until the next
    /// commit succeeds.
    committed: u64,
    /// Where the next checkpoint's records start in the journal (`journal::follow`), known
    /// after a checkpoint this store committed; `None` after a failure or a reopen.
    cursor: Option<journal::Cursor>,
    /// The segments `committed` covers may still be there (their removal failed).
    recycle_due: bool,
    /// The window and absorption state of the last checkpoint, empty, kept for their memory.
    window: RecordWindow,
    absorption: apply::Absorption,
    /// redb's page cache, in bytes ([`crate::Options::checkpoint_cache`]).
    cache: usize,
    /// When the checkpointer tries again after failures (module doc, "Retrying").
    backoff: Backoff,
    /// Checkpoints begun, by the checkpointer or on demand.
    attempts: u64,
    /// A checkpoint failed, or its sync did for lack of room, since the last one that took
    /// every record: the next one first looks through all its records for the files they
    /// free, and writes none of their data (module doc, "Out of room").
    careful: bool,
    /// The checkpoint under way commits segment by segment for lack of room on the host:
    /// each segment it covers before its last commit is removed, not kept for reuse, so that
    /// the next commit has room.
    lean: bool,
    /// Bytes of room kept for checkpoints in [`RESERVE`] (0: none).
    reserve: u64,
    /// Set while the last checkpoint failed with the host short of room for one segment's
    /// commit: the journal makes no segment meanwhile ([`Checkpoint::room_hold`]).
    room_hold: Arc<journal::RoomHold>,
    /// The journal segment during which the file was last compacted for the journal's room
    /// ([`Checkpoint::compact_for_room`]): once per segment at most.
    compacted_at: Option<u64>,
}

impl Checkpoint {
    /// Every record up to this LSN is in the checkpoint.
    pub(crate) fn lsn(&self) -> u64 {
        self.sb.lsn
    }

    /// The checkpoint's file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// A reader of the checkpoint's file pages (`pages.rs`).
    pub(crate) fn pages(&self) -> PageReader {
        PageReader::new(self.shared.clone(), self.path.clone())
    }

    /// Loads the checkpoint into `rec` (see `load.rs`).
    pub(crate) fn load(&self, rec: &mut Recovery) -> Result<load::Loaded, StoreError> {
        if self.sb.lsn == 0 {
            return Ok(load::Loaded::default());
        }
        self.read(|txn| load::load(txn, &self.sb, rec))
    }

    /// The highest inode number the checkpoint holds (1 for none: the root's), for a lazy
    /// opening (`on_demand.rs`).
    pub(crate) fn max_ino(&self) -> Result<u64, StoreError> {
        self.read(on_demand::max_ino)
    }

    /// What the checkpoint holds, counted (`None`: it does not know), less its orphaned
    /// directories (`on_demand::orphan_dirs`): for a lazy opening.
    pub(crate) fn lazy_counts(&self) -> Result<Option<(u64, u64)>, StoreError> {
        let Some(c) = self.sb.counts else {
            return Ok(None);
        };
        let dirs = self.read(on_demand::orphan_dirs)?;
        Ok(Some((c.inodes.saturating_sub(dirs), c.pages)))
    }

    /// After the checkpoint was loaded whole into a filesystem that counts `inodes` and
    /// `pages`: what its superblock's counts say otherwise (`None`: they agree, or there is
    /// no checkpoint yet). The counted figures replace the kept ones either way, and the
    /// next checkpoint writes them.
    pub(crate) fn check_counts(&mut self, (inodes, pages): (u64, u64)) -> Option<String> {
        if self.sb.lsn == 0 {
            return None;
        }
        let counted = kv::Counts { inodes, pages };
        let kept = self.sb.counts.replace(counted);
        match kept {
            Some(k) if k != counted => Some(format!(
                "{}: the superblock counts {} inodes and {} pages, the checkpoint holds {inodes} \
                 and {pages}",
                self.path.display(),
                k.inodes,
                k.pages
            )),
            _ => None,
        }
    }

    /// Gives `rec` what a lazy opening needs of the checkpoint before the journal's records:
    /// its marks and orphans (`load::begin_lazy`). Nothing for a store without a checkpoint.
    pub(crate) fn begin_lazy(&self, rec: &mut Recovery) -> Result<(), StoreError> {
        if self.sb.lsn == 0 {
            return Ok(());
        }
        self.read(|txn| load::begin_lazy(txn, &self.sb, rec))
    }

    /// Runs `f` in a read transaction of the database, damage and panics said with its path.
    fn read<T>(
        &self,
        f: impl FnOnce(&redb::ReadTransaction) -> Result<T, String>,
    ) -> Result<T, StoreError> {
        let db = self
            .db
            .as_ref()
            .ok_or_else(|| damaged(&self.path, "the checkpoint is not open"))?;
        guarded(
            || {
                let txn = db.begin_read().map_err(|e| {
                    damaged(&self.path, format_args!("reading the checkpoint: {e}"))
                })?;
                f(&txn).map_err(|e| damaged(&self.path, e))
            },
            |e| damaged(&self.path, e),
        )
    }

    /// The flag the journal's writer reads before it makes a segment: set while the last
    /// checkpoint failed with the host short of room for one segment's commit, so that the
    /// room the next one frees (its reserve, the segments kept for reuse) goes to it, not to
    /// the journal's held records (docs/STORE.md, "Checkpoints", Out of room).
    pub(crate) fn room_hold(&self) -> Arc<journal::RoomHold> {
        self.room_hold.clone()
    }
}

#[cfg(test)]
mod load_tests;
