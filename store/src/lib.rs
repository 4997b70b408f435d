//! lanefs's disk store: the engine's records kept in a journal, made durable by group commit,
//! and replayed when the store is opened again.
//!
//! A store is a directory (docs/STORE.md is its specification):
//! - `lanefs.store`: the store's identity (format version, id), written once;
//! - `lanefs.lock`: locked by the server that has the store open, so a second is refused;
//!   it names the holding process and what it does ([`StoreHandle::note_holder`]), so that
//!   the refusal can say who holds the store;
//! - `journal/`: the records, in segments (`journal/`);
//! - `checkpoint.redb`: the records up to an LSN, applied to keys (`checkpoint/`).
//!
//! [`open`] locks the store, loads its checkpoint and replays the journal after it into a new [`Filesystem`] (a torn tail is
//! dropped; damage anywhere else fails with the file and byte offset) and starts the
//! committer (`commit.rs`), which from then on writes the records the engine appends. The
//! filesystem's `fsync`, `fsyncdir` and `syncfs` wait for group commit. [`StoreHandle`]
//! commits what is left and releases the store when dropped.
//!
//! Every host operation goes through the storage seam ([`disk::Disk`]), so tests cut the
//! power at every flush ([`disk::SimDisk`]).
//!
//! The host's errors reach the engine's callers as errnos (`commit.rs`, "Errors"): when the
//! host runs out of space, changes are refused with ENOSPC before they become visible
//! (those that free space excepted, within a reserve), records not yet written are held and
//! written once there is room, and the store goes on; any other error (EIO) stops it for
//! good, keeping what was acknowledged.
//!
//! Checkpoints (`checkpoint/`) fold the journal into `checkpoint.redb` in the background and
//! remove the segments they cover, so the journal and the time to open are bounded by the
//! filesystem's size, not its history. File data is not loaded at open: pages the checkpoint
//! holds stay there until read, and leave memory again once a checkpoint holds their last
//! change (docs/STORE.md, "File data out of memory"). A checkpoint that fails is tried
//! again after waits that double up to a minute (docs/STORE.md, "Checkpoints", Retrying).
//! Not built yet: a bounded inode cache (every inode and name is loaded at open).

#![deny(missing_docs)]

pub(crate) mod checkpoint;
pub mod clock;
pub mod disk;
pub mod error;
pub mod fsck;
#[doc(hidden)]
pub mod fuzzing;

pub(crate) mod commit;
pub(crate) mod identity;
pub(crate) mod journal;
pub(crate) mod layout;
pub(crate) mod stamp;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use lanefs::{Config, Filesystem, InodeId, PageEpochs, Record, Store};

pub use crate::checkpoint::CheckpointStatus;
use crate::clock::{Clock, RealClock};
use crate::commit::Committer;
pub use crate::commit::Counters;
pub use crate::disk::Holder;
use crate::disk::{Disk, RealDisk};
pub use crate::error::{CheckpointError, StoreError};
use crate::identity::{existing_store, identity};

/// The lock file's name.
const LOCK: &str = "lanefs.lock";
/// The store format version.
pub const FORMAT_VERSION: u32 = 3;

/// How a store is opened.
#[derive(Clone)]
pub struct Options {
    /// The host filesystem (the real one unless a test simulates it).
    pub disk: Arc<dyn Disk>,
    /// Size of a journal segment: at most this; on a host smaller than 32 segments, a
    /// thirty-second of the host (a power of two, at least 8 MiB), so that the journal and its
    /// spare leave most of a small host to data ([`segment_size`]).
    pub segment_size: u64,
    /// How long records wait for a commit when no one asks for one.
    pub commit_interval: Duration,
    /// How long records written without a sync wait for a flush of the journal: a power cut
    /// loses at most about this much of what no one synced (5 s, ext4's commit interval;
    /// `sync(1)` through a mount never reaches the store).
    pub flush_interval: Duration,
    /// A checkpoint is taken once the journal holds this many records after the last one
    /// (docs/STORE.md, "Checkpoints")...
    pub checkpoint_records: u64,
    /// ...or this many segments...
    pub checkpoint_segments: usize,
    /// While the journal holds more segments than this (at least `checkpoint_segments` + 2),
    /// a checkpoint is due, and until one lets segments go the committer writes only for the
    /// checkpointer, and writers and other syncs wait for it: the journal, and so the time a
    /// recovery replays it, stays bounded when records come faster than checkpoints apply
    /// them (docs/STORE.md, "Backpressure").
    pub journal_segments: usize,
    /// ...or once this many bytes of file data changed since the last one began, or half of
    /// [`Config::cache_bytes`] if more. Writers wait once twice as much changed since
    /// the last checkpoint committed began, so that changed data in memory stays bounded
    /// (docs/STORE.md, "Memory").
    pub checkpoint_changed: u64,
    /// How often the checkpointer looks whether a checkpoint is due (and whether the
    /// checkpoint's database must be reopened).
    pub checkpoint_poll: Duration,
    /// After a checkpoint fails, the checkpointer waits this long before it tries again,
    /// twice as long after each further failure, at most `checkpoint_retry_max`, until one
    /// succeeds (docs/STORE.md, "Checkpoints", Retrying). [`StoreHandle::checkpoint`] does
    /// not wait.
    pub checkpoint_retry: Duration,
    /// The longest wait between failed checkpoints.
    pub checkpoint_retry_max: Duration,
    /// redb's page cache for the checkpoint, in bytes (pages of file data out of memory are
    /// read through it).
    pub checkpoint_cache: usize,
    /// Room kept on the host for checkpoints, in bytes, at most what a checkpoint of one
    /// segment may need (a segment and a quarter; the default) (0: none): the file
    /// `checkpoint.reserve`, given up when a checkpoint fails and made again after one
    /// succeeds, so that a store that filled its host can still commit, segment by segment,
    /// the checkpoint that removes segments (docs/STORE.md, "Checkpoints").
    pub checkpoint_reserve: u64,
    /// The clock of those waits (the host's, unless a test simulates it).
    pub clock: Arc<dyn Clock>,
    /// Load the namespace as it is needed instead of whole when the store opens: the open
    /// reads the root and the journal after the checkpoint, and each inode, and each
    /// directory with its files, is read from the checkpoint the first time it is reached
    /// (docs/STORE.md, "Loading on demand").
    pub lazy: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            disk: Arc::new(RealDisk),
            segment_size: 64 << 20,
            commit_interval: Duration::from_millis(100),
            flush_interval: Duration::from_secs(5),
            checkpoint_records: 2_000_000,
            checkpoint_segments: 4,
            journal_segments: 16,
            checkpoint_changed: 16 << 20,
            checkpoint_poll: Duration::from_millis(500),
            checkpoint_retry: Duration::from_secs(1),
            checkpoint_retry_max: Duration::from_secs(60),
            checkpoint_cache: 64 << 20,
            checkpoint_reserve: u64::MAX,
            clock: Arc::new(RealClock),
            lazy: true,
        }
    }
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("segment_size", &self.segment_size)
            .field("commit_interval", &self.commit_interval)
            .field("flush_interval", &self.flush_interval)
            .field("checkpoint_records", &self.checkpoint_records)
            .field("checkpoint_segments", &self.checkpoint_segments)
            .field("journal_segments", &self.journal_segments)
            .field("checkpoint_poll", &self.checkpoint_poll)
            .field("checkpoint_retry", &self.checkpoint_retry)
            .field("checkpoint_retry_max", &self.checkpoint_retry_max)
            .field("checkpoint_cache", &self.checkpoint_cache)
            .field("checkpoint_reserve", &self.checkpoint_reserve)
            .field("lazy", &self.lazy)
            .finish_non_exhaustive()
    }
}

/// What opening a store found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpenReport {
    /// Whether the store was created by this open.
    pub created: bool,
    /// Inodes loaded from the checkpoint.
    pub loaded: u64,
    /// The LSN the checkpoint holds every record up to (0: none).
    pub checkpoint_lsn: u64,
    /// Records replayed from the journal (after the checkpoint).
    pub replayed: u64,
    /// Whether a torn tail (a batch cut by a crash, never acknowledged) was dropped.
    pub torn_tail: bool,
    /// Whether stamps come from the time-stamp counter (else a shared counter).
    pub tsc_stamps: bool,
    /// Whether the namespace is loaded as it is needed ([`Options::lazy`], and a checkpoint
    /// that counts what it holds).
    pub lazy: bool,
    /// When the store was loaded whole: how the counts its checkpoint kept differ from what
    /// it holds (a bug; the next checkpoint writes the right ones).
    pub counts_wrong: Option<String>,
}

/// An open store and the filesystem it holds.
pub struct Opened {
    /// The filesystem; its changes are journaled.
    pub fs: Filesystem,
    /// The store: keep it as long as the filesystem is used; dropping it commits what is
    /// left and releases the store.
    pub store: StoreHandle,
    /// What opening found.
    pub report: OpenReport,
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened")
            .field("report", &self.report)
            .finish_non_exhaustive()
    }
}

/// The engine's view of the store: appends go to the committer.
struct DiskStore {
    committer: Arc<Committer>,
    epochs: Arc<PageEpochs>,
    pages: checkpoint::PageReader,
    /// The host and the store's directory, for [`Store::available`].
    disk: Arc<dyn Disk>,
    dir: PathBuf,
}

impl Store for DiskStore {
    #[inline]
    fn append(&self, rec: &Record<'_>) -> lanefs::Result<()> {
        self.committer.append(rec)
    }

    fn sync(&self) -> lanefs::Result<()> {
        self.committer.sync()
    }

    fn sync_then(&self, done: lanefs::SyncDone) {
        self.committer.sync_then(done)
    }

    fn durable(&self) -> bool {
        true
    }

    fn page_epochs(&self) -> Option<Arc<PageEpochs>> {
        Some(self.epochs.clone())
    }

    fn available(&self) -> Option<u64> {
        self.disk.available(&self.dir)
    }

    fn read_pages(&self, inode: InodeId, first: u64, buf: &mut [u8]) -> lanefs::Result<()> {
        self.pages.read(inode, first, buf)
    }

    fn load_inode(&self, ino: lanefs::Ino) -> lanefs::Result<Option<lanefs::LoadedInode>> {
        self.pages.inode(ino)
    }

    fn load_entries(
        &self,
        dir: lanefs::Ino,
        files: u64,
    ) -> lanefs::Result<Vec<lanefs::LoadedEntry>> {
        self.pages.entries(dir, files)
    }
}

/// An open store (see [`Opened`]).
pub struct StoreHandle {
    checkpointer: checkpoint::Checkpointer,
    committer: Arc<Committer>,
    committer_thread: Option<std::thread::JoinHandle<()>>,
    dir: PathBuf,
    disk: Arc<dyn Disk>,
    _lock: Box<dyn Send + Sync>,
}

impl std::fmt::Debug for StoreHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreHandle")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl StoreHandle {
    /// Makes every change so far durable (as `syncfs`).
    pub fn sync(&self) -> lanefs::Result<()> {
        self.committer.sync()
    }

    /// Commits what is left, stops the committer and releases the store (changes to the
    /// filesystem after this are refused with EROFS); returns the error
    /// that stopped the store, if one did (ENOSPC: records held for lack of space could not
    /// be written even then, and are lost; no `sync` had acknowledged them).
    pub fn close(mut self) -> lanefs::Result<()> {
        self.stop()
    }

    fn stop(&mut self) -> lanefs::Result<()> {
        self.checkpointer.close();
        if let Some(t) = self.committer_thread.take() {
            self.committer.shutdown();
            let _ = t.join();
        }
        match self.committer.error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// What the store's committer has done since the store was opened.
    pub fn counters(&self) -> Counters {
        self.committer.counters()
    }

    /// Takes a checkpoint of every change so far, now (the checkpointer also takes them on
    /// its own, docs/STORE.md "Checkpoints"); returns the records it applied. An error says
    /// why the checkpoint was abandoned; the journal still holds every record. It does not
    /// wait out the checkpointer's delay after failed checkpoints
    /// ([`Options::checkpoint_retry`]); its outcome counts as theirs (a success ends the
    /// delays, a failure doubles the next).
    pub fn checkpoint(&self) -> Result<u64, CheckpointError> {
        self.checkpointer.checkpoint_now()
    }

    /// What the checkpointer has done: checkpoints tried, failures in a row, when it tries
    /// again. Waits for a checkpoint in progress.
    pub fn checkpoint_status(&self) -> CheckpointStatus {
        self.checkpointer.status()
    }

    /// Every record up to this LSN is in the checkpoint (0: none).
    pub fn checkpoint_lsn(&self) -> u64 {
        self.checkpointer.lsn()
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes `note`, what the holder does with the store (one line or more of text), into
    /// the lock file, beside this process's id, for whoever finds the store in use
    /// ([`StoreError::Locked`]). An opened store's note is `opened`.
    pub fn note_holder(&self, note: &str) -> std::io::Result<()> {
        self.disk.note_lock(&self.dir.join(LOCK), note)
    }
}

impl Drop for StoreHandle {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// The least segment size [`segment_size`] picks for a small host: four of the largest
/// write a FUSE request carries (1 MiB), so that a record of one fills no more than a
/// quarter of a segment.
const MIN_AUTO_SEGMENT: u64 = 4 << 20;

/// The segment size of a store on a host of `capacity` bytes: `most`, or on a small host a
/// thirty-second of it rounded down to a power of two, at least 4 MiB (a 64 MiB segment, its
/// spare and the checkpoint's reserve would take most of a 200 MiB host). Segments of
/// another size already in the journal are read as they are (docs/STORE.md, "Segments").
pub fn segment_size(most: u64, capacity: Option<u64>) -> u64 {
    match capacity {
        Some(c) => {
            let share = c / 32;
            let pow2 = if share == 0 { 0 } else { 1 << share.ilog2() };
            most.min(pow2.max(MIN_AUTO_SEGMENT))
        }
        None => most,
    }
}

/// Takes the store's lock (see the module doc) and notes `note` in it, what this process
/// does with the store ([`StoreHandle::note_holder`]).
///
/// A lock found held is tried again for a moment before the store is refused: `flock`
/// belongs to the open file, which a child the process is spawning holds too (between its
/// fork and its exec, which closes it), so a store just closed by this process may look
/// locked for that long.
fn lock(disk: &dyn Disk, dir: &Path, note: &str) -> Result<Box<dyn Send + Sync>, StoreError> {
    let p = dir.join(LOCK);
    let mut tries = 0;
    loop {
        match disk.lock(&p) {
            Ok(l) => {
                // Only said to whoever finds the store in use: not worth failing for.
                let _ = disk.note_lock(&p, note);
                return Ok(l);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                tries += 1;
                if tries == 20 {
                    let holder = disk.lock_holder(&p);
                    return Err(StoreError::Locked { path: p, holder });
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(StoreError::io(&p, "lock")(e)),
        }
    }
}

/// What [`compact`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactReport {
    /// Records the checkpoint took from the journal.
    pub applied: u64,
    /// Bytes of the checkpoint file and the journal segments before.
    pub before: u64,
    /// And after.
    pub after: u64,
}

/// Applies the journal of the store in `dir` to its checkpoint (the segments it covered go)
/// and gives the checkpoint file's free space back to the host: the room that deleted files'
/// data took, which redb otherwise keeps in the file for later checkpoints (docs/STORE.md,
/// "Compaction"). The store must exist and must not be open elsewhere; what it holds does
/// not change.
pub fn compact(dir: &Path, opts: Options) -> Result<CompactReport, StoreError> {
    let disk = opts.disk.clone();
    existing_store(&*disk, dir)?;
    identity(&*disk, dir, false)?;
    let size = || -> Result<u64, StoreError> {
        let mut files = vec![dir.join(checkpoint::FILE)];
        files.extend(
            journal::segments(&*disk, dir)?
                .into_iter()
                .map(|s| journal::segment_path(dir, s)),
        );
        files.extend(
            journal::free_segments(&*disk, dir)?
                .into_iter()
                .map(|s| journal::free_path(dir, s)),
        );
        let mut n = 0;
        for p in files.iter().filter(|p| disk.exists(p)) {
            let f = disk.open(p, false).map_err(StoreError::io(p, "open"))?;
            n += f.len().map_err(StoreError::io(p, "stat"))?;
        }
        Ok(n)
    };
    let before = size()?;
    let cache = opts.checkpoint_cache;
    let o = open(dir, Config::default(), opts)?;
    let applied = o.store.checkpoint();
    drop(o.fs);
    o.store.close().map_err(|e| StoreError::Io {
        path: dir.to_path_buf(),
        op: "close",
        source: std::io::Error::from_raw_os_error(e.0),
    })?;
    let applied = applied.map_err(|why| StoreError::Io {
        path: dir.join(checkpoint::FILE),
        op: "checkpoint",
        source: std::io::Error::other(why),
    })?;
    let _lock = lock(&*disk, dir, "compact")?;
    let (uuid, _) = identity(&*disk, dir, false)?;
    checkpoint::Checkpoint::open(
        &*disk,
        dir,
        uuid,
        false,
        true,
        checkpoint::Compact::Always,
        cache,
    )?;
    // The journal's segments kept for reuse give their room back too.
    journal::drop_free(&*disk, dir);
    Ok(CompactReport {
        applied,
        before,
        after: size()?,
    })
}

/// Opens the store in `dir`, creating it if the directory is empty or missing (see the
/// module doc). `cfg` gives the filesystem's limits and locking mode, and the root's
/// attributes when the store is new; without a size limit the store may hold as much as the
/// filesystem its directory is on.
pub fn open(dir: &Path, mut cfg: Config, opts: Options) -> Result<Opened, StoreError> {
    let disk = &*opts.disk;
    let jd = journal::dir(dir);
    disk.create_dir_all(&jd)
        .map_err(StoreError::io(&jd, "create"))?;
    let capacity = disk.capacity(dir);
    if cfg.max_bytes.is_none() {
        cfg.max_bytes = capacity.map(|b| b.min(lanefs::MAX_FILE_SIZE));
    }
    let segment_size = segment_size(opts.segment_size, capacity);
    let lock = lock(disk, dir, "opened")?;
    let (uuid, created) = identity(disk, dir, true)?;
    if created {
        disk.sync_dir(dir)
            .map_err(StoreError::io(dir, "flush directory"))?;
    }
    let committer = Arc::new(Committer::new(opts.commit_interval, opts.flush_interval));
    let cache_pages = cfg.cache_pages();
    let mut ck = checkpoint::Checkpoint::open(
        disk,
        dir,
        uuid,
        true,
        // Reading the whole file is what a lazy opening is not to do; a whole one reads it
        // anyway.
        !opts.lazy,
        // After loading, which tells whether it can be due without redb reading every page.
        checkpoint::Compact::Never,
        opts.checkpoint_cache,
    )?
    .expect("made if missing");
    ck.set_reserve(
        disk,
        opts.checkpoint_reserve
            .min(journal::checkpoint_room(segment_size)),
    );
    let epochs = Arc::new(PageEpochs::default());
    let store: Arc<dyn Store> = Arc::new(DiskStore {
        committer: committer.clone(),
        epochs: epochs.clone(),
        pages: ck.pages(),
        disk: opts.disk.clone(),
        dir: dir.to_path_buf(),
    });
    let counts = match opts.lazy && ck.lsn() != 0 {
        true => ck.lazy_counts()?,
        false => None,
    };
    let mut counts_wrong = None;
    let (mut rec, loaded) = if let Some(counts) = counts {
        let max = ck.max_ino()?;
        let mut rec =
            Filesystem::recover_lazy(cfg, store, max, counts).map_err(|e| StoreError::Damaged {
                path: ck.path().to_path_buf(),
                offset: 0,
                what: e.to_string(),
            })?;
        ck.begin_lazy(&mut rec)?;
        (rec, 0)
    } else {
        // Whole: a store without a checkpoint, without counts (made before they were
        // kept), or not opened lazily. The counts are checked against what was loaded.
        let mut rec = Filesystem::recover(cfg, store);
        let loaded = ck.load(&mut rec)?;
        ck.compact_if_mostly_free(disk, loaded.bytes)?;
        counts_wrong = ck.check_counts(rec.usage());
        if let Some(w) = &counts_wrong {
            eprintln!("lanefs: {w} (corrected by the next checkpoint)");
        }
        (rec, loaded.inodes)
    };
    let checkpoint_lsn = ck.lsn();
    let synthesized = rec.records();
    let end = journal::scan(disk, dir, uuid, checkpoint_lsn + 1, |_, bytes| {
        let r = Record::decode(bytes).map_err(|e| e.to_string())?;
        rec.apply(&r).map_err(|e| e.to_string())
    })?;
    let replayed = rec.records() - synthesized;
    let mut writer = journal::Writer::new(opts.disk.clone(), dir, uuid, segment_size, end)?;
    writer.hold_room_with(ck.room_hold());
    let committer_thread = commit::spawn(committer.clone(), writer);
    // File data changed since the last checkpoint cannot leave memory: bounded by checkpoints
    // (docs/STORE.md, "Memory").
    let changed_due = (cache_pages / 2).max(opts.checkpoint_changed.div_ceil(lanefs::PAGE));
    let policy = checkpoint::Policy {
        records: opts.checkpoint_records,
        segments: opts.checkpoint_segments,
        journal_segments: opts
            .journal_segments
            .max(opts.checkpoint_segments.saturating_add(2)),
        changed_due,
        changed_limit: changed_due.saturating_mul(2),
        poll: opts.checkpoint_poll,
        retry: opts.checkpoint_retry,
        retry_max: opts.checkpoint_retry_max,
    };
    committer.set_max_segments(policy.journal_segments as u64);
    let checkpointer = checkpoint::spawn(
        ck,
        committer.clone(),
        opts.disk.clone(),
        epochs,
        policy,
        opts.clock.clone(),
    );
    let handle = StoreHandle {
        checkpointer,
        committer: committer.clone(),
        committer_thread: Some(committer_thread),
        dir: dir.to_path_buf(),
        disk: opts.disk.clone(),
        _lock: lock,
    };
    let fs = rec.finish().map_err(|e| StoreError::Damaged {
        path: jd.clone(),
        offset: end.offset,
        what: format!("the journal's records do not end in a consistent state: {e}"),
    })?;
    // What finishing appended (a new store's root, the freeing of orphans) is made durable
    // before the filesystem is handed out; except that a store whose host is full opens
    // with the freeing of its orphans held (the journal's records wait for room, as any
    // others: commit.rs, "Errors"), since an opening after a crash frees them again, and
    // removals inside the store are what gives the room back.
    match committer.sync() {
        Ok(()) => {}
        Err(e) if e == lanefs::Errno::ENOSPC && !created => {
            eprintln!(
                "lanefs: {}: no room to write the freeing of orphaned inodes; it waits for room \
                 (changes other than removals are refused until then)",
                jd.display()
            );
        }
        Err(e) => {
            return Err(StoreError::Io {
                path: jd.clone(),
                op: "commit",
                source: std::io::Error::from_raw_os_error(e.0),
            });
        }
    }
    Ok(Opened {
        fs,
        store: handle,
        report: OpenReport {
            created,
            loaded,
            checkpoint_lsn,
            replayed,
            torn_tail: end.torn,
            tsc_stamps: committer.uses_tsc(),
            lazy: counts.is_some(),
            counts_wrong,
        },
    })
}
#[cfg(test)]
mod spec;
