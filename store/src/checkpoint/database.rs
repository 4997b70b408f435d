//! The checkpoint's redb database: opening it (made if missing, checked, compacted when
//! mostly free), and dropping and reopening it after redb failed (`mod.rs`, "Errors").

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use redb::{Database, ReadableDatabase};

use super::backoff::Backoff;
use super::kv::{self, Superblock};
use super::window::RecordWindow;
use super::{Checkpoint, DATA, FILE, META, SharedDb, ZEROS, apply, backend, journal};
use crate::disk::Disk;
use crate::error::{CheckpointError, StoreError};

const TMP: &str = "checkpoint.redb.tmp";

pub(super) fn damaged(path: &Path, what: impl std::fmt::Display) -> StoreError {
    StoreError::damaged(path, 0, what.to_string())
}

/// What a panic said.
pub(super) fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

/// Runs `f`, which reads the checkpoint through redb, turning a panic into an error: redb
/// checks what it reads, but some damage (a malformed allocator state) makes it panic
/// rather than return an error, and damage must be an error naming the file, never a crash.
/// (The panic's message still reaches stderr through the default hook.)
pub(super) fn guarded<T, E>(
    f: impl FnOnce() -> Result<T, E>,
    err: impl FnOnce(String) -> E,
) -> Result<T, E> {
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
pub(super) fn open_db(
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

/// A checkpoint file that no checkpoint was ever committed to is made again, after a failed
/// one, only when it is larger than this ([`Checkpoint::start_afresh`]): an empty database
/// takes a few pages.
const AFRESH_ABOVE: u64 = 4 << 20;

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
    /// host first ([`compact`]). `verify` runs redb's integrity check, which reads the whole
    /// file (a lazy opening leaves it out: docs/STORE.md, "Loading on demand").
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn open(
        disk: &dyn Disk,
        dir: &Path,
        uuid: [u8; 16],
        create: bool,
        verify: bool,
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
            || Self::open_made(disk, dir, &path, uuid, verify, compact, cache),
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
            shared: SharedDb::new(Some(db.clone())),
            db: Some(db),
            path,
            store: dir.to_path_buf(),
            uuid,
            committed: sb.lsn,
            cursor: None,
            sb,
            recycle_due: false,
            window: RecordWindow::default(),
            absorption: apply::Absorption::default(),
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
            compacted_at: None,
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

    /// Gives the free space of the checkpoint's file back to the host while the store is
    /// open, for a journal down to one segment that cannot make its next one for lack of
    /// room (docs/STORE.md, "Checkpoints", Out of room, known bug C): the room deleted files
    /// had in the file, or a failed transaction left written there, is all the host has to
    /// give then. Once while the journal's segment is
    /// `segment` (the journal then either gets its next one or has nothing more to gain
    /// from another try). Page readers wait meanwhile, as for a reopen; the database is
    /// dropped, compacted ([`compact`]: each step one of redb's two-phase commits, changing
    /// no key or value) and opened again. Returns whether it compacted.
    pub(crate) fn compact_for_room(
        &mut self,
        disk: &dyn Disk,
        segment: u64,
    ) -> Result<bool, CheckpointError> {
        if self.compacted_at == Some(segment) {
            return Ok(false);
        }
        self.compacted_at = Some(segment);
        self.shared.busy(true);
        self.close_db();
        let (path, cache) = (self.path.clone(), self.cache);
        let compacted = guarded(
            || {
                let mut db = open_db(disk, &path, false, cache)?;
                Ok(compact(&mut db, disk, &path, Compact::Always))
            },
            |e| damaged(&path, e),
        );
        let r = self.open_again(disk);
        self.shared.busy(false);
        r?;
        match compacted.map_err(CheckpointError::Reopen)? {
            Ok(()) => Ok(true),
            Err(why) => {
                eprintln!(
                    "lanefs: {}: not compacted for the journal's room: {why}",
                    path.display()
                );
                Ok(false)
            }
        }
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
                    counts: Some(kv::Counts::default()),
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

    /// Whether the database is to be reopened: a failure left it closed, or a page read
    /// found redb failing (`mod.rs`, "Errors").
    pub(crate) fn needs_reopen(&self) -> bool {
        self.db.is_none() || self.shared.broken()
    }

    /// Drops the database, if open, and opens it again from its file.
    /// Page readers meanwhile wait for it ([`pages::SharedDb::busy`]) rather than fail.
    pub(crate) fn reopen(&mut self, disk: &dyn Disk) -> Result<(), CheckpointError> {
        self.shared.busy(true);
        self.close_db();
        let mut r = self.open_again(disk);
        if r.is_ok() && self.committed == 0 && self.sb.lsn == 0 {
            r = self.start_afresh(disk);
        }
        self.shared.busy(false);
        r
    }

    /// After a failure, while no checkpoint has ever been committed: the file holds an empty
    /// checkpoint and whatever the failed transactions wrote into it, which redb keeps as
    /// free space in the file, not on the host (a first checkpoint that failed on a full
    /// host leaves the file as large as the host let it grow, and the next try, segment by
    /// segment, then finds no room: docs/STORE.md, known bug C). The file is removed and an
    /// empty one made: the journal starts at segment 1 (no checkpoint ever covered a
    /// segment), so a crash in between leaves a store that may lack its checkpoint, and
    /// [`Checkpoint::open_again`] makes it again when making it fails now.
    fn start_afresh(&mut self, disk: &dyn Disk) -> Result<(), CheckpointError> {
        let len = disk.open(&self.path, false).and_then(|f| f.len());
        if len.is_ok_and(|l| l <= AFRESH_ABOVE) {
            return Ok(());
        }
        self.close_db();
        disk.remove(&self.path)
            .and_then(|()| disk.sync_dir(&self.store))
            .map_err(|e| CheckpointError::Reopen(StoreError::io(&self.path, "remove")(e)))?;
        self.open_again(disk)
    }

    /// Drops the database (redb closes its file), never panicking.
    pub(super) fn close_db(&mut self) {
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
            // Nothing of it is borrowed: transactions live only inside `apply_in_transactions`.
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
    fn open_again(&mut self, disk: &dyn Disk) -> Result<(), CheckpointError> {
        if self.committed == 0 && !disk.exists(&self.path) {
            // Removed to start afresh ([`Checkpoint::start_afresh`]).
            Self::may_be_missing(disk, &self.store).map_err(CheckpointError::Reopen)?;
            Self::make(disk, &self.store, self.uuid, self.cache)
                .map_err(CheckpointError::Reopen)?;
        }
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
        .map_err(CheckpointError::Reopen)?;
        let sb = fresh.sb;
        if sb.lsn < self.committed {
            // A commit that returned Ok is gone, and the segments it covered may be too.
            return Err(CheckpointError::CommitLost {
                path: self.path.clone(),
                holds: sb.lsn,
                committed: self.committed,
            });
        }
        // Above `committed` only if a commit that reported an error (in its last flush)
        // reached the file anyway: build on it, but remove no segment for it until a commit
        // is known durable (`committed` stays).
        self.sb = sb;
        self.shared.put(fresh.db.clone());
        self.db = fresh.db;
        Ok(())
    }
}
