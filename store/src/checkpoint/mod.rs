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
//! - **A checkpoint** ([`Checkpoint::advance`]) reads the journal records after the
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
//!   (`take`), which is what allows the engine to drop them (docs/STORE.md, "File data out of
//!   memory").
//!
//! **Errors.** After redb fails in a write transaction (the host's ENOSPC or EIO in a write,
//! a growth of the file or a flush, or redb's own error), the `Database` refuses every later
//! transaction ("close and re-open the database"). So when redb's error ends a checkpoint
//! (`apply::ApplyError::Db`, or any error from beginning, writing or committing the
//! transaction, or a panic in redb), [`Checkpoint::advance`] drops the `Database` (after an
//! I/O failure redb writes nothing more to the file, leaving it as a crash would: the last
//! committed transaction, whole, since redb's commit is crash-safe) and opens it again from
//! the same file through the same backend, as the store's opening does (redb's recovery,
//! the superblock; not the integrity check, see `reopen`). If that fails too (still no room, EIO), the store goes on without it,
//! serving from the journal, and the next checkpoint tries the reopen first. A record that
//! does not fit the keys, a journal that cannot be read, or a stop leave redb as it is
//! (the transaction is dropped, i.e. aborted). Segments are removed only up to
//! `committed`, the LSN of the last commit known durable (one that returned `Ok`, or the one
//! found at opening), never past it: a reopen that finds a commit that reported an error
//! builds on it but removes nothing for it until a later commit succeeds, and a reopen that
//! finds less than `committed` is refused (the segments for it may be gone).
//!
//! **Out of room.** A checkpoint needs room of its own before it gives any back: redb writes
//! each transaction's pages anew, and segments go only after the commit. So a store whose
//! journal filled its host (the deleted files' writes still in it) would never get the room
//! back. Three things keep it from that:
//! - the journal being short of room (`Log::low`) makes a checkpoint due, whatever else;
//! - when the journal cannot make its records durable (ENOSPC, records held), `take`
//!   checkpoints the records already durable (`Log::flushed_lsn`), so that the segments
//!   they fill go and the held records (the removals that would free room among them) can
//!   be written;
//! - after a failure (`careful`) the next checkpoint gives up [`RESERVE`] (room kept on the
//!   host for this, made again after a checkpoint succeeds), looks through all its records
//!   for the files they free and writes none of their pages ([`apply::Doomed`]: the Free
//!   deletes them, so the keys end the same), and commits segment by segment, removing each
//!   before applying the next, so that it needs room for one segment's changes at most.
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
//! memory: the caller gets EIO) marks the database broken (`pages::Slot`); the checkpointer
//! reopens it at its next look ([`Checkpoint::repair`]), and a checkpoint on demand first
//! thing, so that once the host reads again the pages read back without a checkpoint being
//! due or the store being reopened.
//!
//! **Retrying.** Each try of a checkpoint applies every record after the last good one
//! again, so while they keep failing the checkpointer waits between tries ([`Backoff`]):
//! `checkpoint_retry` (1 s) after the first failure of a run, twice as long after each
//! further one, at most `checkpoint_retry_max` (a minute), on the store's clock
//! ([`crate::clock`]). Its reopens of the database count as tries: a failed one is a
//! failure, and none is tried while it waits. A checkpoint that succeeds ends the run.
//! [`Checkpointer::now`] (`StoreHandle::checkpoint`) never waits, but counts: its success
//! ends the run, its failure doubles the next wait. The backoff lives in the [`Checkpoint`],
//! under its mutex, with the tries counted for `StoreHandle::checkpoint_status`.
//!
//! **Locking.** The open store's [`Checkpoint`] lives in one mutex (`Checkpointer::ck`).
//! Every use of its `Database`, and the drop and reopen that replace it, happen with that
//! mutex held and `&mut Checkpoint`: by the checkpointer's thread, by
//! [`Checkpointer::now`] (`StoreHandle::checkpoint`), and by [`Checkpointer::lsn`]
//! (`StoreHandle::checkpoint_lsn`, which therefore waits for a checkpoint in progress).
//! Transactions never outlive [`Checkpoint::advance`] or [`Checkpoint::load`], so when the
//! `Database` is dropped nothing holds a transaction of it (redb would otherwise defer its
//! close to the transaction's end), and no one sees the swap. [`Checkpoint::load`] runs
//! while the store is being opened, before the checkpointer exists. fsck opens a
//! `Database` of its own, under the store's lock file, so never while a store has it open.
//!
//! The page readers (`pages.rs`) share the open `Database` through a slot of their own
//! (`Shared`), outside the mutex: a reopen first empties the slot, waits until no reader
//! holds the old `Database` (a read transaction is short), drops it, and puts the new one
//! in. While a checkpoint writes or reopens (`Slot::busy`), a reader that finds the slot
//! empty, or meets redb's error, waits for the database that replaces it (however long the
//! checkpoint takes: woken by the slot's condition variable, whose mutex is taken before the
//! slot's lock) and reads that; reads of file pages out of memory fail with EIO only when
//! there is none (the reopen failed); it lets go of the `Database` it failed on before it waits (the reopen
//! waits for every holder), naming it by the number of the put that put it in the slot. A
//! reader marks the slot broken only if the slot still holds the `Database` the reader
//! failed on, and putting a database in clears the mark, so a reader of a replaced one
//! never breaks its successor.
//!
//! The engine holds every inode and name in memory; the checkpoint bounds the journal, the
//! time to open, and the file data in memory.

pub(crate) mod apply;
mod backend;
pub(crate) mod kv;
mod load;
mod pages;

pub(crate) use pages::{PageReader, Shared, Slot};

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::Duration;

use lanefs::{Glance, PageEpochs, Record, Recovery};
use parking_lot::{Condvar, Mutex};
use redb::{Database, ReadableDatabase, TableDefinition};

use crate::clock::Clock;
use crate::commit::Log;
use crate::disk::Disk;
use crate::error::StoreError;
use crate::journal;
use kv::Superblock;

/// The checkpoint's file name in the store's directory.
pub(crate) const FILE: &str = "checkpoint.redb";
const TMP: &str = "checkpoint.redb.tmp";
/// Room kept for checkpoints ([`Checkpoint::set_reserve`]).
const RESERVE: &str = "checkpoint.reserve";

/// Bytes of records a checkpoint reads before it applies them (`Win`).
const WINDOW: usize = 4 << 20;

/// Records read and not yet applied: their bytes, one after another, and each one's place.
/// Kept by the [`Checkpoint`] between checkpoints, so that its memory is reused.
#[derive(Default)]
struct Win {
    bytes: Vec<u8>,
    /// The LSN of the first record (the others follow on).
    first: u64,
    /// Where each record's bytes are, and its gist's index in `gists` (`NO_GIST`: none).
    recs: Vec<(u32, u32, u32)>,
    gists: Vec<apply::Gist>,
}

const NO_GIST: u32 = u32::MAX;

impl Win {
    /// Adds the records `recs` of one batch (first LSN `first`), slices of `span`
    /// (`journal::follow`), which is copied at once. Each is decoded, seen by `ghosts`, and
    /// its gist kept; a record that does not decode is an error naming it by its index.
    fn push(
        &mut self,
        first: u64,
        span: &[u8],
        recs: &[&[u8]],
        ghosts: &mut apply::Ghosts,
    ) -> Result<(), (usize, String)> {
        if self.recs.is_empty() {
            self.first = first;
        }
        debug_assert_eq!(self.first + self.recs.len() as u64, first);
        let start = span.as_ptr() as usize;
        let base = self.bytes.len();
        self.bytes.extend_from_slice(span);
        for (k, r) in recs.iter().enumerate() {
            let at = base + (r.as_ptr() as usize - start);
            // A Create, Remove, Free or plain Rename is decoded only as far as its gist
            // needs (every field is checked all the same); a record of another kind whole.
            let glance = match Record::glance(r) {
                Ok(Glance::Other) => match Record::decode(r) {
                    Ok(rec) => {
                        ghosts.see_other(&rec);
                        Glance::Other
                    }
                    Err(e) => return Err((k, e.to_string())),
                },
                Ok(g) => g,
                Err(e) => return Err((k, e.to_string())),
            };
            let slot = ghosts.see(&glance);
            let g = match apply::Gist::of(&glance, slot) {
                Some(g) => {
                    self.gists.push(g);
                    (self.gists.len() - 1) as u32
                }
                None => NO_GIST,
            };
            self.recs.push((at as u32, (at + r.len()) as u32, g));
        }
        Ok(())
    }

    /// Empties the window, keeping its memory unless a window of unusually large batches
    /// made it grow past three windows' worth.
    fn clear(&mut self) {
        if self.bytes.capacity() > 3 * WINDOW {
            *self = Win::default();
        }
        self.bytes.clear();
        self.recs.clear();
        self.gists.clear();
    }

    /// Applies the records (the ghosts among them found as they were read, and absorbed from
    /// their gists without a second decoding), writes what the ghosts left to write, and
    /// empties the window; returns how many records it applied.
    fn apply(&mut self, t: &mut apply::Tables<'_>) -> Result<u64, Failed> {
        t.ghosts.settle();
        let failed = |lsn: String, e: apply::ApplyError| Failed {
            reopen: matches!(e, apply::ApplyError::Db(_)),
            why: format!("record {lsn}: {e}"),
        };
        for (k, &(a, b, g)) in self.recs.iter().enumerate() {
            let lsn = self.first + k as u64;
            if g != NO_GIST
                && let Some(r) = t.absorb(&self.gists[g as usize])
            {
                r.map_err(|e| failed(lsn.to_string(), e))?;
                continue;
            }
            let bytes = &self.bytes[a as usize..b as usize];
            let r = Record::decode(bytes).map_err(|e| Failed::other(e.to_string()))?;
            t.apply(&r).map_err(|e| failed(lsn.to_string(), e))?;
        }
        let n = self.recs.len() as u64;
        if n > 0 {
            let span = format!("{}..={}", self.first, self.first + n - 1);
            t.finish().map_err(|e| failed(span, e))?;
        }
        t.ghosts.clear();
        self.clear();
        Ok(n)
    }
}

pub(crate) const META: TableDefinition<&[u8], &[u8]> = TableDefinition::new("meta");
pub(crate) const DATA: TableDefinition<&[u8], &[u8]> = TableDefinition::new("data");
/// Runs of allocated zeros (`z` keys): made by the first write transaction of a checkpoint
/// of format 3; a checkpoint of format 2 has none.
pub(crate) const ZEROS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("zeros");

/// The checkpoint of an open store.
pub(crate) struct Checkpoint {
    /// `None` after redb failed, until [`Checkpoint::advance`] reopens it (module doc,
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
    /// The window and ghosts of the last checkpoint, empty, kept for their memory.
    win: Win,
    ghosts: apply::Ghosts,
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
}

/// Why [`Checkpoint::advance_inner`] abandoned a checkpoint.
struct Failed {
    why: String,
    /// redb failed (or panicked): the database may refuse every later transaction, so it is
    /// dropped and reopened.
    reopen: bool,
}

impl Failed {
    fn db(e: impl std::fmt::Display) -> Failed {
        Failed {
            why: e.to_string(),
            reopen: true,
        }
    }

    fn other(why: impl Into<String>) -> Failed {
        Failed {
            why: why.into(),
            reopen: false,
        }
    }
}

fn damaged(path: &Path, what: impl std::fmt::Display) -> StoreError {
    StoreError::damaged(path, 0, what.to_string())
}

/// What a panic said.
fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

/// Runs `f`, which reads the checkpoint through redb, turning a panic into an error: redb
/// checks what it reads, but some damage (a malformed allocator state) makes it panic
/// rather than return an error, and damage must be an error naming the file, never a crash.
/// (The panic's message still reaches stderr through the default hook.)
fn guarded<T, E>(f: impl FnOnce() -> Result<T, E>, err: impl FnOnce(String) -> E) -> Result<T, E> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|p| Err(err(format!("reading it panicked: {}", panic_text(p)))))
}

/// redb's error opening or checking the checkpoint: the host's error (one with an errno:
/// EIO, ENOSPC) as such, anything else as damage (a read past the end of a truncated file
/// is damage, not the host's failure).
fn open_error(path: &Path, what: &str, e: redb::DatabaseError) -> StoreError {
    match e {
        redb::DatabaseError::Storage(redb::StorageError::Io(source))
            if source.raw_os_error().is_some() =>
        {
            StoreError::Io {
                path: path.to_path_buf(),
                op: "open the checkpoint",
                source,
            }
        }
        e => damaged(path, format_args!("{what}: {e}")),
    }
}

/// Opens `path` as a redb database with a page cache of `cache` bytes (`create`: making the
/// file if it is missing).
fn open_db(
    disk: &dyn Disk,
    path: &Path,
    create: bool,
    cache: usize,
) -> Result<Database, StoreError> {
    let file = disk
        .open(path, create)
        .map_err(StoreError::io(path, "open"))?;
    Database::builder()
        .set_cache_size(cache)
        .create_with_backend(backend::Backend::new(file, path))
        .map_err(|e| open_error(path, "the checkpoint cannot be opened", e))
}

/// A checkpoint file whose free space is more than this and more than its data is compacted
/// when the store opens.
pub(crate) const COMPACT_SLACK: u64 = 64 << 20;

/// When opening a checkpoint gives its free space back to the host ([`compact`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Compact {
    /// Never (fsck, which changes nothing).
    Never,
    /// When the file's free space is more than [`COMPACT_SLACK`] and more than its data (a
    /// store opening).
    IfMostlyFree,
    /// Whenever it has any (`lanefs compact`).
    Always,
}

/// Gives the free space of a checkpoint file back to the host (the pages of files deleted
/// since, which redb keeps in the file for later transactions) when `when` says so: redb
/// moves the pages in use towards the start and cuts the file (`Database::compact`,
/// repeated while it finds more to do). Only at opening, before anything reads the
/// checkpoint: redb compacts only a database with no transaction open. Each step is one of
/// redb's two-phase commits, so a crash leaves the checkpoint as one of them left it, with
/// the same contents (compaction moves pages; it changes no key or value). Returns why it
/// failed, if it did.
fn compact(db: &mut Database, disk: &dyn Disk, path: &Path, when: Compact) -> Result<(), String> {
    if when == Compact::Never {
        // Not even a write transaction to read the statistics: fsck writes nothing.
        return Ok(());
    }
    let len = || {
        disk.open(path, false)
            .and_then(|f| f.len())
            .map_err(|e| e.to_string())
    };
    let stats = {
        let txn = db.begin_write().map_err(|e| e.to_string())?;
        let stats = txn.stats().map_err(|e| e.to_string())?;
        txn.abort().map_err(|e| e.to_string())?;
        stats
    };
    let used = stats.allocated_pages() * stats.page_size() as u64;
    let before = len()?;
    let free = before.saturating_sub(used);
    let due = match when {
        Compact::IfMostlyFree => free > COMPACT_SLACK.max(used),
        Compact::Always => free > 0,
        Compact::Never => false,
    };
    if !due {
        return Ok(());
    }
    for _ in 0..8 {
        match db.compact() {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => return Err(e.to_string()),
        }
    }
    eprintln!(
        "lanefs: {}: compacted from {} to {} MiB ({} MiB in use)",
        path.display(),
        before >> 20,
        len()? >> 20,
        used >> 20
    );
    Ok(())
}

impl Checkpoint {
    /// Opens the checkpoint of the store in `dir` (id `uuid`), with a page cache of `cache`
    /// bytes. A store that has none is one whose journal starts at its beginning (else the
    /// checkpoint is missing: damage); with `create` an empty one is made for it, without,
    /// `None` is returned. `compact` says when the file gives its free space back to the
    /// host first ([`compact`]).
    pub(crate) fn open(
        disk: &dyn Disk,
        dir: &Path,
        uuid: [u8; 16],
        create: bool,
        compact: Compact,
        cache: usize,
    ) -> Result<Option<Checkpoint>, StoreError> {
        let path = dir.join(FILE);
        if !disk.exists(&path) {
            Self::may_be_missing(disk, dir)?;
            if !create {
                return Ok(None);
            }
            Self::make(disk, dir, uuid, cache)?;
        }
        guarded(
            || Self::open_made(disk, dir, &path, uuid, true, compact, cache),
            |e| damaged(&path, e),
        )
        .map(Some)
    }

    /// Opens the existing checkpoint `path`; `verify` runs redb's integrity check, and
    /// `compact` then says whether to [`compact`] it.
    #[allow(clippy::too_many_arguments)]
    fn open_made(
        disk: &dyn Disk,
        dir: &Path,
        path: &Path,
        uuid: [u8; 16],
        verify: bool,
        compact: Compact,
        cache: usize,
    ) -> Result<Checkpoint, StoreError> {
        let path = path.to_path_buf();
        let mut db = open_db(disk, &path, false, cache)?;
        // redb verifies its page checksums here, not on every read: without this check a
        // damaged data page would load as file contents.
        match verify.then(|| db.check_integrity()) {
            None | Some(Ok(true)) => {}
            Some(Ok(false)) => return Err(damaged(&path, "redb's integrity check failed")),
            Some(Err(e)) => return Err(open_error(&path, "redb's integrity check", e)),
        }
        if let Err(why) = self::compact(&mut db, disk, &path, compact) {
            // The checkpoint is as it was before the failed step (each of redb's commits is
            // whole or not at all), but redb takes no transaction after a failed one.
            eprintln!(
                "lanefs: {}: not compacted: {why}; the free space stays in the file",
                path.display()
            );
            db = open_db(disk, &path, false, cache)?;
        }
        let sb = {
            let txn = db
                .begin_read()
                .map_err(|e| damaged(&path, format_args!("reading the checkpoint: {e}")))?;
            let t = txn.open_table(META).map_err(|e| {
                damaged(&path, format_args!("the checkpoint has no table meta: {e}"))
            })?;
            let v = t
                .get(kv::SUPER)
                .map_err(|e| damaged(&path, format_args!("reading the superblock: {e}")))?
                .ok_or_else(|| damaged(&path, "the checkpoint has no superblock"))?;
            Superblock::decode(v.value()).map_err(|e| damaged(&path, e))?
        };
        if sb.uuid != uuid {
            return Err(damaged(&path, "checkpoint of another store"));
        }
        let db = Arc::new(db);
        Ok(Checkpoint {
            shared: Slot::new(Some(db.clone())),
            db: Some(db),
            path,
            store: dir.to_path_buf(),
            uuid,
            committed: sb.lsn,
            cursor: None,
            sb,
            recycle_due: false,
            win: Win::default(),
            ghosts: apply::Ghosts::default(),
            cache,
            backoff: Backoff::default(),
            attempts: 0,
            careful: false,
            lean: false,
            room_hold: {
                let h = Arc::<journal::RoomHold>::default();
                h.set_covered(sb.lsn);
                h
            },
            reserve: 0,
        })
    }

    /// Compacts the checkpoint if it is mostly free space ([`Compact::IfMostlyFree`]): a
    /// store opening, once it is loaded and before anything else reads it. `held`: the bytes
    /// of keys and values the load read, no more than the database's pages in use hold, so
    /// a file of at most `held + max(COMPACT_SLACK, held)` bytes cannot be due, and redb need
    /// not count its pages in use (which reads every page of the file).
    pub(crate) fn compact_if_mostly_free(
        &mut self,
        disk: &dyn Disk,
        held: u64,
    ) -> Result<(), StoreError> {
        let len = disk
            .open(&self.path, false)
            .and_then(|f| f.len())
            .map_err(StoreError::io(&self.path, "stat"))?;
        if len.saturating_sub(held) <= COMPACT_SLACK.max(held) {
            return Ok(());
        }
        let Some(db) = self.db.take() else {
            return Ok(());
        };
        self.shared.put(None);
        let db = match Arc::try_unwrap(db) {
            Ok(db) => db,
            Err(db) => {
                // Something reads it (nothing should, this early): not compacted now.
                self.shared.put(Some(db.clone()));
                self.db = Some(db);
                return Ok(());
            }
        };
        let path = self.path.clone();
        let cache = self.cache;
        let db = guarded(
            || {
                let mut db = db;
                if let Err(why) = compact(&mut db, disk, &path, Compact::IfMostlyFree) {
                    // As it was before the failed step, but redb takes no transaction after
                    // a failed one.
                    eprintln!(
                        "lanefs: {}: not compacted: {why}; the free space stays in the file",
                        path.display()
                    );
                    drop(db);
                    db = open_db(disk, &path, false, cache)?;
                }
                Ok(db)
            },
            |e| damaged(&path, e),
        )?;
        let db = Arc::new(db);
        self.shared.put(Some(db.clone()));
        self.db = Some(db);
        Ok(())
    }

    /// A store may lack a checkpoint only while its journal starts at segment 1.
    fn may_be_missing(disk: &dyn Disk, dir: &Path) -> Result<(), StoreError> {
        let segs = journal::segments(disk, dir)?;
        match segs.first() {
            Some(&first) if first != 1 => Err(damaged(
                &dir.join(FILE),
                format_args!(
                    "the checkpoint is missing, and the journal starts at segment {first:016x}"
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Makes an empty checkpoint (LSN 0) under a temporary name and renames it into place.
    fn make(disk: &dyn Disk, dir: &Path, uuid: [u8; 16], cache: usize) -> Result<(), StoreError> {
        let tmp = dir.join(TMP);
        if disk.exists(&tmp) {
            disk.remove(&tmp).map_err(StoreError::io(&tmp, "remove"))?;
        }
        {
            let db = open_db(disk, &tmp, true, cache)?;
            let fail = |e: &dyn std::fmt::Display| StoreError::Io {
                path: tmp.clone(),
                op: "make the checkpoint",
                source: std::io::Error::other(e.to_string()),
            };
            let txn = db.begin_write().map_err(|e| fail(&e))?;
            {
                let mut t = txn.open_table(META).map_err(|e| fail(&e))?;
                let sb = Superblock {
                    uuid,
                    ..Superblock::default()
                };
                t.insert(kv::SUPER, &sb.encode()[..])
                    .map_err(|e| fail(&e))?;
                txn.open_table(DATA).map_err(|e| fail(&e))?;
                txn.open_table(ZEROS).map_err(|e| fail(&e))?;
            }
            txn.commit().map_err(|e| fail(&e))?;
        }
        let path = dir.join(FILE);
        disk.rename(&tmp, &path)
            .map_err(StoreError::io(&path, "rename"))?;
        disk.sync_dir(dir)
            .map_err(StoreError::io(dir, "flush directory"))
    }

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
        let db = self
            .db
            .as_ref()
            .ok_or_else(|| damaged(&self.path, "the checkpoint is not open"))?;
        guarded(
            || {
                let txn = db.begin_read().map_err(|e| {
                    damaged(&self.path, format_args!("reading the checkpoint: {e}"))
                })?;
                load::load(&txn, &self.sb, rec).map_err(|e| damaged(&self.path, e))
            },
            |e| damaged(&self.path, e),
        )
    }

    /// Applies the journal's records after the checkpoint up to LSN `upto` (which must be
    /// durable in the journal) and commits them; then removes the segments it covers. `stop`
    /// abandons it between records. Returns the records applied. If redb failed, the
    /// database is dropped and reopened, here or (if that fails too) by the next call or
    /// [`Checkpoint::repair`] (module doc, "Errors"); a database a page read found failing
    /// is reopened first.
    pub(crate) fn advance(
        &mut self,
        disk: &dyn Disk,
        upto: u64,
        stop: &dyn Fn() -> bool,
    ) -> Result<u64, String> {
        if self.needs_repair() {
            self.repair(disk)?;
        }
        if upto <= self.sb.lsn {
            if self.recycle_due {
                // Segments the last commit covers, left by a removal that failed (a commit
                // removes them itself).
                self.recycle(disk).map_err(|e| e.to_string())?;
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
        let r = guarded(|| self.advance_inner(disk, upto, stop), Failed::db);
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
                match self.repair(disk) {
                    Ok(()) => Err(f.why),
                    Err(e) => Err(format!("{}; then {e}", f.why)),
                }
            }
            Err(f) => Err(f.why),
        };
        self.shared.busy(false);
        r
    }

    /// The flag the journal's writer reads before it makes a segment: set while the last
    /// checkpoint failed with the host short of room for one segment's commit, so that the
    /// room the next one frees (its reserve, the segments kept for reuse) goes to it, not to
    /// the journal's held records (docs/STORE.md, "Checkpoints", Out of room).
    pub(crate) fn room_hold(&self) -> Arc<journal::RoomHold> {
        self.room_hold.clone()
    }

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
    fn keep_reserve(&self, disk: &dyn Disk) {
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
    fn spend_reserve(&self, disk: &dyn Disk) {
        let _ = disk.remove(&self.store.join(RESERVE));
        journal::drop_free(disk, &self.store);
    }

    /// Whether the database is to be reopened: a failure left it closed, or a page read
    /// found redb failing (module doc, "Errors").
    pub(crate) fn needs_repair(&self) -> bool {
        self.db.is_none() || self.shared.broken()
    }

    /// Drops the database, if open, and opens it again from its file.
    /// Page readers meanwhile wait for it ([`pages::Slot::busy`]) rather than fail.
    pub(crate) fn repair(&mut self, disk: &dyn Disk) -> Result<(), String> {
        self.shared.busy(true);
        self.close_db();
        let r = self.reopen(disk);
        self.shared.busy(false);
        r
    }

    /// Drops the database (redb closes its file), never panicking.
    fn close_db(&mut self) {
        self.shared.put(None);
        if let Some(mut db) = self.db.take() {
            // Page readers that took it before the slot was emptied finish their read
            // transaction: wait for them, so that the reopen never opens the file while
            // another `Database` of it is alive.
            let db = loop {
                match Arc::try_unwrap(db) {
                    Ok(db) => break db,
                    Err(still) => {
                        db = still;
                        std::thread::sleep(Duration::from_micros(100));
                    }
                }
            };
            // Nothing of it is borrowed: transactions live only inside `advance_inner`.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(db)));
        }
    }

    /// Opens the database again from its file, through the same storage seam, after redb
    /// failed: it recovers to its last committed transaction, as after a crash. The
    /// superblock found there becomes the base of the next transaction. Without redb's
    /// integrity check (a read of the whole file, which opening the store did): a failed
    /// transaction never writes over a page the last committed one uses (redb's commit is
    /// crash-safe at any point), so the reopened database holds what the dropped one had
    /// committed, no less trustworthy than it, and retrying on a full host does not read the
    /// whole checkpoint each time.
    fn reopen(&mut self, disk: &dyn Disk) -> Result<(), String> {
        let fresh = guarded(
            || {
                Self::open_made(
                    disk,
                    &self.store,
                    &self.path,
                    self.uuid,
                    false,
                    Compact::Never,
                    self.cache,
                )
            },
            |e| damaged(&self.path, e),
        )
        .map_err(|e| format!("reopening the checkpoint: {e}"))?;
        let sb = fresh.sb;
        if sb.lsn < self.committed {
            // A commit that returned Ok is gone, and the segments it covered may be too.
            return Err(format!(
                "reopening the checkpoint: {}: it holds records up to {}, but a commit up to {} \
                 had succeeded",
                self.path.display(),
                sb.lsn,
                self.committed
            ));
        }
        // Above `committed` only if a commit that reported an error (in its last flush)
        // reached the file anyway: build on it, but remove no segment for it until a commit
        // is known durable (`committed` stays).
        self.sb = sb;
        self.shared.put(fresh.db.clone());
        self.db = fresh.db;
        Ok(())
    }

    /// [`Checkpoint::advance`]'s work: one transaction; after a failure (`careful`), or on
    /// a host with less room than the whole journal's commit may need, one per journal
    /// segment, each committed and the segment removed before the next is applied, so that
    /// the checkpoint needs room for one segment's changes, not the whole journal's, and the
    /// reserve's room for the first (module doc, "Out of room").
    fn advance_inner(
        &mut self,
        disk: &dyn Disk,
        upto: u64,
        stop: &dyn Fn() -> bool,
    ) -> Result<u64, Failed> {
        let from = self.sb.lsn + 1;
        // One transaction for the whole journal, unless the host's room is short of what that
        // may need (or a checkpoint failed): then one per segment.
        let seqs =
            journal::segments(disk, &self.store).map_err(|e| Failed::other(e.to_string()))?;
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
        let doomed = if segmentwise {
            self.freed(disk, self.cursor, from, upto, stop)?
        } else {
            apply::Doomed::default()
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
            let r = self.apply_and_commit(disk, end, stop, &doomed);
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
        doomed: &apply::Doomed,
    ) -> Result<u64, Failed> {
        let from = self.sb.lsn + 1;
        let db = self
            .db
            .as_ref()
            .ok_or_else(|| Failed::db("the checkpoint is not open"))?;
        let mut txn = db.begin_write().map_err(Failed::db)?;
        txn.set_quick_repair(true);
        let mut applied = 0u64;
        let at = self.cursor.take();
        let (sb, next) = {
            let mut t = apply::Tables {
                meta: txn.open_table(META).map_err(Failed::db)?,
                data: txn.open_table(DATA).map_err(Failed::db)?,
                zeros: txn.open_table(ZEROS).map_err(Failed::db)?,
                max_generation: self.sb.max_generation,
                ghosts: std::mem::take(&mut self.ghosts),
                doomed,
                open: None,
                changed: Default::default(),
                cookies: Default::default(),
            };
            // The records are read once, into windows of about `WINDOW` bytes; each window
            // is looked through for the files whose records cancel out within it
            // (`apply::Ghosts`), then applied.
            let mut win = std::mem::take(&mut self.win);
            let mut why: Option<Failed> = None;
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
                    win.push(first, span, recs, &mut t.ghosts)?;
                    if win.bytes.len() >= WINDOW {
                        applied += win.apply(&mut t).map_err(|f| {
                            let s = f.why.clone();
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
                applied += win.apply(&mut t)?;
                self.win = win;
                self.ghosts = std::mem::take(&mut t.ghosts);
            }
            let next = match read {
                Err(_) if stop() => return Err(Failed::other("stopped")),
                Err(e) => return Err(Failed::other(e.to_string())),
                Ok(next) => next,
            };
            t.end().map_err(|e| Failed {
                reopen: matches!(e, apply::ApplyError::Db(_)),
                why: format!("writing back pages and inodes: {e}"),
            })?;
            let sb = Superblock {
                uuid: self.uuid,
                lsn: upto,
                max_generation: t.max_generation,
                records: self.sb.records + applied,
            };
            t.meta
                .insert(kv::SUPER, &sb.encode()[..])
                .map_err(Failed::db)?;
            (sb, next)
        };
        txn.commit().map_err(Failed::db)?;
        // Durable now (redb's commit flushed it): only now may segments go.
        self.sb = sb;
        self.committed = sb.lsn;
        self.room_hold.set_covered(sb.lsn);
        self.cursor = Some(next);
        self.recycle_due = true;
        self.recycle(disk)
            .map_err(|e| Failed::other(format!("the checkpoint is committed, but: {e}")))?;
        Ok(applied)
    }

    /// The inodes that the records `from..=upto` free (a read of them that only glances at
    /// each): a checkpoint that writes none of their pages ends with the same keys, and
    /// needs no room for data that its own records delete again (module doc, "Out of room").
    fn freed(
        &self,
        disk: &dyn Disk,
        at: Option<journal::Cursor>,
        from: u64,
        upto: u64,
        stop: &dyn Fn() -> bool,
    ) -> Result<apply::Doomed, Failed> {
        let mut doomed = apply::Doomed::default();
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
                    if let Ok(Glance::Free { inode }) = Record::glance(r) {
                        doomed.insert(inode);
                    }
                }
                Ok(())
            },
        )
        .map_err(|e| Failed::other(e.to_string()))?;
        Ok(doomed)
    }

    /// Takes the journal segments whose records are all in the checkpoint out of the
    /// journal, oldest first: segment `k` goes when segment `k + 1` starts at or below the
    /// record after it. Only segments that `committed` covers go: never one a crash could
    /// still need. Each is kept for reuse as a spare (renamed `<k>.free`) while fewer than
    /// [`journal::FREE_MAX`] are, and removed otherwise, and always by a checkpoint short of
    /// room (`lean`: its room is what the next segment's commit needs).
    fn recycle(&mut self, disk: &dyn Disk) -> Result<(), StoreError> {
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

/// When the checkpointer takes a checkpoint.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Policy {
    /// Records in the journal after the checkpoint.
    pub records: u64,
    /// Segments in the journal.
    pub segments: usize,
    /// Segments in the journal beyond which the committer holds off until a checkpoint
    /// lets some go, and a checkpoint is due ([`Log::set_checkpointing`]; commit.rs,
    /// "Backpressure").
    pub journal_segments: usize,
    /// Pages of file data changed since the last checkpoint began that make one due, and
    /// changed since the last one committed began that make writers wait
    /// ([`PageEpochs::set_budget`]).
    pub changed_due: u64,
    pub changed_limit: u64,
    /// How often it looks.
    pub poll: Duration,
    /// The wait after the first failure in a row ([`Backoff`]).
    pub retry: Duration,
    /// The longest wait.
    pub retry_max: Duration,
}

/// The waits between failed tries (module doc, "Retrying"): after the `n`th failure in a row
/// the checkpointer waits `retry * 2^(n-1)`, at most `retry_max`, by the store's clock; a
/// checkpoint that succeeds ends the run. Kept with the [`Checkpoint`], under its mutex, so
/// that a checkpoint on demand counts too.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Backoff {
    /// Failures since the last checkpoint that succeeded.
    failures: u32,
    /// When the checkpointer may try again (`None`: whenever a checkpoint is due).
    until: Option<Duration>,
}

impl Backoff {
    /// Whether the checkpointer may try at `now`.
    pub(crate) fn ready(&self, now: Duration) -> bool {
        self.until.is_none_or(|t| now >= t)
    }

    /// Counts a failure that ended at `now`; returns the wait before the next try.
    pub(crate) fn failed(&mut self, now: Duration, p: &Policy) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let wait = delay(self.failures, p.retry, p.retry_max);
        self.until = Some(now.saturating_add(wait));
        wait
    }

    /// A checkpoint succeeded: the next one is taken as soon as it is due.
    pub(crate) fn succeeded(&mut self) {
        *self = Backoff::default();
    }
}

/// The wait after the `n`th failure in a row (`n >= 1`): `first` doubled `n - 1` times, at
/// most `max`.
fn delay(n: u32, first: Duration, max: Duration) -> Duration {
    let doubled = 2u32.saturating_pow(n.saturating_sub(1));
    first.saturating_mul(doubled).min(max)
}

/// What the checkpointer has done ([`crate::StoreHandle::checkpoint_status`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckpointStatus {
    /// Times the checkpointer's thread has looked whether a checkpoint is due
    /// ([`crate::Options::checkpoint_poll`]), each counted once it has done what it found to do.
    pub polls: u64,
    /// Checkpoints begun, by the checkpointer or on demand.
    pub attempts: u64,
    /// Failed tries (checkpoints, or reopens of the checkpoint's database) since the last
    /// checkpoint that succeeded.
    pub failures: u32,
    /// While there are failures: when the checkpointer tries again, by the store's clock
    /// ([`crate::Options::clock`]).
    pub retry_at: Option<Duration>,
}

/// The checkpointer's thread and how to stop it.
/// What the checkpointer's thread is woken for.
#[derive(Default)]
struct Wake {
    /// The store is closing.
    stop: bool,
    /// A checkpoint may be due before the next poll ([`PageEpochs::set_budget`]).
    nudged: bool,
}

pub(crate) struct Checkpointer {
    stop: Arc<(Mutex<Wake>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
    ck: Arc<Mutex<Checkpoint>>,
    log: Arc<Log>,
    disk: Arc<dyn Disk>,
    epochs: Arc<PageEpochs>,
    policy: Policy,
    clock: Arc<dyn Clock>,
    /// [`CheckpointStatus::polls`].
    polls: Arc<AtomicU64>,
}

/// Takes a checkpoint of every record appended so far; returns the records it applied. It
/// begins a page epoch first and declares it kept once the checkpoint is committed, so that
/// the engine may drop the pages it holds (engine `data.rs`, "Pages the store keeps").
fn take(
    ck: &mut Checkpoint,
    log: &Log,
    disk: &dyn Disk,
    epochs: &PageEpochs,
    stop: &dyn Fn() -> bool,
) -> Result<u64, String> {
    let epoch = epochs.begin();
    // Every record appended before the first sync (so every change labelled with `epoch` or
    // before) is written when it returns; the second makes every record written by then
    // durable.
    let synced = log.sync_for_checkpoint().and_then(|()| {
        let written = log.counters().lsn;
        log.sync_for_checkpoint().map(|()| written)
    });
    match synced {
        Ok(written) => {
            let applied = ck.advance(disk, written, stop)?;
            epochs.kept(epoch);
            ck.keep_reserve(disk);
            Ok(applied)
        }
        Err(e) if e == lanefs::Errno::ENOSPC => {
            // Records are held for lack of room (commit.rs, "Errors"), perhaps the removals
            // that would give it back: the records already durable are taken, and the
            // segments they fill removed, so that the held ones can be written. Not every
            // change labelled `epoch` is in it: the epoch is not declared kept, and the
            // attempt counts as failed (the next one takes everything), and the reserve is
            // left to the journal until one succeeds.
            ck.careful = true;
            let durable = log.flushed_lsn();
            let applied = ck.advance(disk, durable, stop)?;
            ck.careful = true;
            Err(format!(
                "journal commit: {e}; the {applied} records up to {durable} that were durable \
                 were taken"
            ))
        }
        Err(e) => Err(format!("journal commit: {e}")),
    }
}

/// What [`take`] needs besides the checkpoint.
struct Ctx<'a> {
    log: &'a Log,
    disk: &'a dyn Disk,
    epochs: &'a PageEpochs,
    policy: &'a Policy,
    clock: &'a dyn Clock,
}

/// [`take`], counted in the checkpoint's attempts and its [`Backoff`] (a failure that a
/// stop caused is not counted as one).
fn attempt(ck: &mut Checkpoint, c: &Ctx<'_>, stop: &dyn Fn() -> bool) -> Result<u64, String> {
    ck.attempts += 1;
    // From now until a look finds none due, a journal over its size takes only syncs, so
    // that writers wait for this checkpoint and the next rather than grow the journal in
    // between, or while a checkpoint asked for runs (commit.rs, "Backpressure").
    let first = |ck: &Checkpoint| {
        journal::segments(c.disk, &ck.store)
            .ok()
            .and_then(|s| s.first().copied())
    };
    c.log.set_checkpointing(true, first(ck));
    let r = take(ck, c.log, c.disk, c.epochs, stop);
    c.log.set_checkpointed(ck.lsn());
    // After a failure nothing ends a wait until the next try.
    c.log.set_checkpointing(r.is_ok(), first(ck));
    match &r {
        Ok(_) => ck.backoff.succeeded(),
        Err(_) if stop() => {}
        Err(_) => {
            ck.backoff.failed(c.clock.now(), c.policy);
        }
    }
    // Writers over the budget of changed pages wait for checkpoints only while they succeed,
    // and not once the store is closing (`Checkpointer::stop`).
    if !stop() {
        c.epochs.set_stalled(r.is_err());
    }
    r
}

impl Checkpointer {
    fn ctx(&self) -> Ctx<'_> {
        Ctx {
            log: &self.log,
            disk: &*self.disk,
            epochs: &self.epochs,
            policy: &self.policy,
            clock: &*self.clock,
        }
    }

    /// Takes a checkpoint of every record appended so far, now (whatever the [`Backoff`]
    /// says; its outcome counts there); returns the records it applied.
    pub(crate) fn now(&self) -> Result<u64, String> {
        attempt(&mut self.ck.lock(), &self.ctx(), &|| false)
    }

    /// Every record up to this LSN is in the checkpoint.
    pub(crate) fn lsn(&self) -> u64 {
        self.ck.lock().lsn()
    }

    /// What the checkpointer has done.
    pub(crate) fn status(&self) -> CheckpointStatus {
        let ck = self.ck.lock();
        CheckpointStatus {
            polls: self.polls.load(SeqCst),
            attempts: ck.attempts,
            failures: ck.backoff.failures,
            retry_at: ck.backoff.until,
        }
    }

    /// Stops the thread (a checkpoint in progress is abandoned) and waits for it.
    pub(crate) fn stop(&mut self) {
        self.epochs.set_stalled(true);
        if let Some(t) = self.thread.take() {
            self.stop.0.lock().stop = true;
            self.stop.1.notify_all();
            let _ = t.join();
        }
        // No checkpoint will come: the journal's writers wait for none.
        self.log.set_checkpointing(false, None);
        // Again: an attempt that was running when the first call came may have cleared it.
        self.epochs.set_stalled(true);
    }
}

impl Checkpointer {
    /// Stops the checkpointer and closes the checkpoint's database (the store is being
    /// closed): a filesystem that outlives its store reads no page from it any more (EIO),
    /// and never writes to a file another opening of the store may be using.
    pub(crate) fn close(&mut self) {
        self.stop();
        self.ck.lock().close_db();
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One look of the checkpointer's thread (module doc, "Errors" and "Retrying"): unless
/// it is waiting after failures, it reopens a database that a page read found failing or a
/// failed checkpoint left closed, and takes a checkpoint if one is due. `said`: a failure of
/// the current run was said on stderr. Returns false if it was stopped.
fn look(ck: &mut Checkpoint, c: &Ctx<'_>, stopped: &dyn Fn() -> bool, said: &mut bool) -> bool {
    if !ck.backoff.ready(c.clock.now()) {
        return true;
    }
    if ck.needs_repair() {
        // Cheap (no integrity check), and reads of pages out of memory fail until it is done:
        // not left for a checkpoint to become due.
        if let Err(e) = ck.repair(c.disk) {
            // Nothing ends a wait for checkpoints until the next try.
            c.log.set_checkpointing(false, None);
            let wait = ck.backoff.failed(c.clock.now(), c.policy);
            if !*said {
                eprintln!(
                    "lanefs: {e} (pages out of memory cannot be read until it reopens; will try \
                     again in {wait:?}, then less often)"
                );
                *said = true;
            }
            return true;
        }
    }
    let written = c.log.counters().lsn;
    let mut seqs = journal::segments(c.disk, &ck.store).unwrap_or_default();
    if c.log.low() && written <= ck.lsn() && seqs.len() > 1 {
        // Short of room with every record in the checkpoint: a segment it covers can go once
        // the one after it has started (perhaps since the last commit), kept for reuse as the
        // journal's next spare.
        if ck.recycle(c.disk).is_ok() {
            seqs = journal::segments(c.disk, &ck.store).unwrap_or_default();
        }
    }
    let segments = seqs.len();
    // Changed pages due even with every record already in the checkpoint (they were appended
    // while the last one synced): a checkpoint with nothing to apply still declares their
    // epoch kept, which writers waiting for it need.
    let due = written.saturating_sub(ck.lsn()) >= c.policy.records
        || (segments >= c.policy.segments && written > ck.lsn())
        || c.epochs.due()
        // Short of room: only a checkpoint gives the journal's segments back.
        || (c.log.low() && written > ck.lsn())
        // Over its bound: writers wait for this checkpoint (commit.rs, "Backpressure").
        || (segments > c.policy.journal_segments && written > ck.lsn());
    if !due {
        // No wait for a checkpoint while none is due: none would end it.
        c.log.set_checkpointing(false, seqs.first().copied());
        return true;
    }
    let failures = ck.backoff.failures;
    let r = attempt(ck, c, stopped);
    match r {
        Ok(_) => {
            if *said {
                eprintln!(
                    "lanefs: checkpoint of {} succeeded after {failures} failed tries",
                    ck.path().display()
                );
            }
            *said = false;
        }
        Err(_) if stopped() => return false,
        Err(e) => {
            if !*said {
                eprintln!(
                    "lanefs: checkpoint of {} failed (the journal keeps every record; will try \
                     again in {:?}, then less often): {e}",
                    ck.path().display(),
                    ck.backoff
                        .until
                        .unwrap_or_default()
                        .saturating_sub(c.clock.now()),
                );
                *said = true;
            }
        }
    }
    true
}

/// Starts the checkpointer of an open store (see the module doc).
pub(crate) fn spawn(
    ck: Checkpoint,
    log: Arc<Log>,
    disk: Arc<dyn Disk>,
    epochs: Arc<PageEpochs>,
    policy: Policy,
    clock: Arc<dyn Clock>,
) -> Checkpointer {
    let stop = Arc::new((Mutex::new(Wake::default()), Condvar::new()));
    let polls = Arc::new(AtomicU64::new(0));
    let ck = Arc::new(Mutex::new(ck));
    let wake = stop.clone();
    epochs.set_budget(
        policy.changed_due,
        policy.changed_limit,
        Box::new(move || {
            wake.0.lock().nudged = true;
            wake.1.notify_all();
        }),
    );
    let mut c = Checkpointer {
        stop,
        thread: None,
        ck,
        log,
        disk,
        epochs,
        policy,
        clock,
        polls,
    };
    let (s, ck, log, disk, epochs, clock, polls) = (
        c.stop.clone(),
        c.ck.clone(),
        c.log.clone(),
        c.disk.clone(),
        c.epochs.clone(),
        c.clock.clone(),
        c.polls.clone(),
    );
    let thread = std::thread::Builder::new()
        .name("lanefs-checkpoint".into())
        .spawn(move || {
            let stopped = || s.0.lock().stop;
            let ctx = Ctx {
                log: &log,
                disk: &*disk,
                epochs: &epochs,
                policy: &policy,
                clock: &*clock,
            };
            let mut said = false;
            loop {
                {
                    let mut g = s.0.lock();
                    if !g.stop && !g.nudged {
                        s.1.wait_for(&mut g, policy.poll);
                    }
                    if g.stop {
                        return;
                    }
                    g.nudged = false;
                }
                if !look(&mut ck.lock(), &ctx, &stopped, &mut said) {
                    return;
                }
                polls.fetch_add(1, SeqCst);
            }
        })
        .expect("spawn the checkpointer");
    c.thread = Some(thread);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(retry: u64, max: u64) -> Policy {
        Policy {
            records: 1,
            segments: 1,
            journal_segments: 3,
            changed_due: 1,
            changed_limit: 1,
            poll: Duration::from_millis(1),
            retry: Duration::from_secs(retry),
            retry_max: Duration::from_secs(max),
        }
    }

    #[test]
    fn waits_double_from_the_first_up_to_the_longest_and_a_success_ends_them() {
        let p = policy(1, 60);
        let mut b = Backoff::default();
        let s = Duration::from_secs;
        assert!(b.ready(s(0)));
        let mut now = s(100);
        let mut waits = Vec::new();
        for _ in 0..9 {
            let w = b.failed(now, &p);
            waits.push(w.as_secs());
            assert!(!b.ready(now + w - Duration::from_nanos(1)));
            assert!(b.ready(now + w));
            now += w;
        }
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(b.failures, 9);
        b.succeeded();
        assert_eq!(b, Backoff::default());
        assert!(b.ready(now));
        assert_eq!(
            b.failed(now, &p),
            s(1),
            "a new run starts from the first wait"
        );
    }

    #[test]
    fn a_long_run_of_failures_never_overflows() {
        let p = policy(1, 60);
        assert_eq!(delay(1, p.retry, p.retry_max), Duration::from_secs(1));
        assert_eq!(delay(u32::MAX, p.retry, p.retry_max), p.retry_max);
        assert_eq!(
            delay(40, Duration::MAX, Duration::MAX),
            Duration::MAX,
            "saturates"
        );
        let mut b = Backoff {
            failures: u32::MAX,
            until: None,
        };
        assert_eq!(b.failed(Duration::MAX, &p), p.retry_max);
        assert_eq!(b.failures, u32::MAX);
        assert_eq!(b.until, Some(Duration::MAX));
        // A first wait longer than the longest is cut to it.
        assert_eq!(delay(1, Duration::from_secs(90), p.retry_max), p.retry_max);
    }
}

#[cfg(test)]
mod load_tests {
    use std::path::Path;
    use std::sync::Arc;
    use std::time::Duration;

    use lanefs::{Client, Config, Ctx, Filesystem, MemoryStore};
    use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata};

    use super::{Checkpoint, Compact, DATA, META, kv};
    use crate::disk::SimDisk;

    const FIRST_COOKIE: u64 = 1 << 48;

    /// A new store on a simulated disk: the disk, its directory, its options, and it open.
    fn new_store() -> (SimDisk, &'static Path, crate::Options, crate::Opened) {
        let disk = SimDisk::new();
        let dir = Path::new("/s");
        let opts = crate::Options {
            disk: Arc::new(disk.clone()),
            ..crate::Options::default()
        };
        let o = crate::open(dir, Config::default(), opts.clone()).unwrap();
        (disk, dir, opts, o)
    }

    /// A checkpointed store of 30 directories of 10 files (many of the tests' 64-entry
    /// windows); then `damage` changes its `meta` table directly (redb's checksums stay
    /// right), and the opening must fail with an error containing `want`, within a minute:
    /// the tree's reader and the thread applying what it read stop each other, whichever
    /// fails.
    fn refused(damage: impl FnOnce(&mut redb::Table<&[u8], &[u8]>), want: &str) {
        let (disk, dir, opts, o) = new_store();
        let c = Client::root(Arc::new(o.fs));
        for d in 0..30 {
            c.create_dir(format!("/d{d:02}")).unwrap();
            for f in 0..10 {
                c.write(format!("/d{d:02}/f{f}"), b"x").unwrap();
            }
        }
        o.store.checkpoint().unwrap();
        drop(c);
        o.store.close().unwrap();
        {
            let db = super::open_db(&disk, &dir.join(super::FILE), false, 1 << 20).unwrap();
            let txn = db.begin_write().unwrap();
            {
                let mut t = txn.open_table(META).unwrap();
                damage(&mut t);
            }
            txn.commit().unwrap();
        }
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let r = crate::open(dir, Config::default(), opts).map(drop);
            let _ = tx.send(r.map_err(|e| e.to_string()));
        });
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(Err(e)) => {
                eprintln!("refused: {e}");
                assert!(e.contains(want), "{e}")
            }
            Ok(Ok(())) => panic!("a damaged checkpoint opened"),
            Err(_) => panic!("opening a damaged checkpoint hung"),
        }
    }

    /// The inode number of `/dNN/fN` as the checkpoint's entry names it.
    fn target(t: &redb::Table<&[u8], &[u8]>, parent: &[u8], name: &[u8]) -> u64 {
        let root = kv::named_key(kv::ENTRY, 1, parent);
        let d = kv::EntryVal::decode(t.get(&root[..]).unwrap().unwrap().value()).unwrap();
        let k = kv::named_key(kv::ENTRY, d.target.ino.0, name);
        kv::EntryVal::decode(t.get(&k[..]).unwrap().unwrap().value())
            .unwrap()
            .target
            .ino
            .0
    }

    /// The reader fails (a named inode is missing) in a late window.
    #[test]
    fn a_missing_inode_refuses_the_opening() {
        refused(
            |t| {
                let ino = target(t, b"d27", b"f3");
                t.remove(&kv::ino_key(kv::INODE, ino)[..]).unwrap();
            },
            "is named but missing",
        );
    }

    /// The applying thread fails (a second name for an inode with one link: a create of a
    /// number in use) in the first window, while the reader has more to send.
    #[test]
    fn an_entry_the_engine_refuses_refuses_the_opening() {
        second_name(FIRST_COOKIE | 0xffff_ffff, "in use");
    }

    /// A cookie no entry can have (below the first, or past the last slot) is refused, not
    /// used as a slot's index.
    #[test]
    fn an_entry_with_a_cookie_out_of_range_refuses_the_opening() {
        second_name(999, "out of range");
        second_name(200 << 48, "out of range");
        refused(
            |t| {
                let k = kv::ino_key(kv::COOKIE, 100);
                t.insert(&k[..], &(100u64 << 48).to_le_bytes()[..]).unwrap();
            },
            "out of range",
        );
    }

    /// `refused` with an entry `/again` naming `/d00/f0`, with `cookie`.
    fn second_name(cookie: u64, want: &str) {
        refused(
            |t| {
                let d = target(t, b"d00", b"f0");
                let e = kv::EntryVal {
                    target: lanefs::InodeId {
                        ino: lanefs::Ino(d),
                        generation: {
                            let k = kv::ino_key(kv::INODE, d);
                            let v = t.get(&k[..]).unwrap().unwrap();
                            lanefs::Generation(kv::InodeVal::decode(v.value()).unwrap().generation)
                        },
                    },
                    cookie,
                };
                let k = kv::named_key(kv::ENTRY, 1, b"again");
                t.insert(&k[..], &e.encode()[..]).unwrap();
            },
            want,
        );
    }

    /// What a load reads is no more than the pages redb keeps in use hold: the bound that
    /// lets an opening skip counting them (`Checkpoint::compact_if_mostly_free`). A store of
    /// every kind of key: files with data (sparse, and pages past the size), hard links,
    /// symlinks, xattrs, an orphan, nested directories.
    #[test]
    fn a_load_reads_no_more_than_the_pages_in_use_hold() {
        let (disk, dir, _, o) = new_store();
        let fs = Arc::new(o.fs);
        let c = Client::root(fs.clone());
        let mut data = 0;
        for d in 0..20 {
            c.create_dir(format!("/d{d}")).unwrap();
            c.create_dir(format!("/d{d}/sub")).unwrap();
            for f in 0..50 {
                let n = (d * 50 + f) * 997 % 70_000;
                c.write(format!("/d{d}/sub/f{f}"), vec![d as u8 + 1; n])
                    .unwrap();
                data += n;
            }
            c.hard_link(format!("/d{d}/sub/f0"), format!("/d{d}/link"))
                .unwrap();
            c.symlink("/d0/sub/f1", format!("/d{d}/sym")).unwrap();
        }
        let ctx = Ctx::root();
        let f = fs.lookup(&ctx, lanefs::InodeId::ROOT.ino, b"d1").unwrap();
        fs.setxattr(&ctx, f.ino, b"user.a", &[7; 300], 0).unwrap();
        let mut read = lanefs::OpenOptions::new();
        read.read(true);
        let open_file = c.open("/d2/sub/f3", &read).unwrap();
        c.remove_file("/d2/sub/f3").unwrap();
        fs.sync_all().unwrap();
        o.store.checkpoint().unwrap();
        drop(open_file);
        drop(c);
        drop(fs);
        o.store.close().unwrap();

        let (uuid, _) = crate::identity(&disk, dir, false).unwrap();
        let ck = Checkpoint::open(&disk, dir, uuid, false, Compact::Never, 1 << 20)
            .unwrap()
            .unwrap();
        let mut rec = Filesystem::recover(Config::default(), Arc::new(MemoryStore));
        let loaded = ck.load(&mut rec).unwrap();
        let db = ck.db.as_ref().unwrap();
        let stored = {
            let txn = db.begin_read().unwrap();
            let t = txn.open_table(DATA).unwrap();
            t.len().unwrap()
        };
        assert!(stored > 0, "the files' pages are in the checkpoint");
        assert!(
            loaded.bytes > data as u64,
            "the load counted the pages it read: {} bytes for {data} bytes of file data",
            loaded.bytes
        );
        drop(ck);
        let mut db = super::open_db(&disk, &dir.join(super::FILE), false, 1 << 20).unwrap();
        let stats = {
            let txn = db.begin_write().unwrap();
            let s = txn.stats().unwrap();
            txn.abort().unwrap();
            s
        };
        let in_use = stats.allocated_pages() * stats.page_size() as u64;
        assert!(
            loaded.bytes <= in_use,
            "the load read {} bytes, the pages in use hold {in_use}",
            loaded.bytes
        );
        assert!(db.check_integrity().unwrap());
    }
}
