//! What the store's tests share (each test file says `mod common;`):
//! - [`seed`]: the seeds of the random tests, from one environment variable, `LANEFS_SEED`,
//!   printed so that a failure can be repeated (`engine/tests/common/seed.rs`, the same for
//!   the engine's and the mount's tests);
//! - [`tree`]: the whole filesystem as a map of paths ([`dump`], what reopens and crash
//!   images are compared by) and [`assert_same_tree`], which says what differs
//!   (`engine/tests/common/tree.rs`);
//! - [`opts`], [`host_opts`] and [`on_demand`]: the options of a test store;
//! - [`PowerCuts`]: the images a power cut at each flush of a simulated disk would leave;
//! - [`Watchdog`]: a hang fails the test instead of hanging;
//! - [`rw`], [`rwc`], [`no_cache`], [`pattern`], [`close_unshared`]: open options, a
//!   filesystem that caches no page, random file contents, a clean close;
//! - [`model_write`], [`model_punch`], [`model_allocate`]: what a change does to a file's
//!   bytes held in a plain `Vec<u8>`, the model random tests check reads against;
//! - [`real_disk_but_open`]: a test's own `Disk` that changes only how files open;
//! - [`cache_within`]: whether a bounded inode cache is within its budget.

#![allow(dead_code)]

#[path = "../../../engine/tests/common/seed.rs"]
pub mod seed;
#[path = "../../../engine/tests/common/tree.rs"]
pub mod tree;

#[allow(unused_imports)] // each test binary uses some
pub use tree::{Node, Tree, assert_same_tree, cookie_of, dump, named_user_acl, tree_diff};

use std::sync::{Arc, mpsc};
use std::time::Duration;

use lanefs::{Config, FileType, Filesystem, OpenOptions};
use lanefs_store::disk::{SimDisk, SyncPoint, Unflushed};
use lanefs_store::{Options, StoreHandle};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Whether what `fs`'s bounded cache counts (inodes and entries) is within `bytes`, but for
/// the entries of directories something holds (a handle, the kernel; the root), which no
/// eviction pass can free, as the last pass counted them (`Filesystem::held_entries`).
pub fn cache_within(fs: &Filesystem, bytes: u64) -> bool {
    fs.inode_cache_bytes() <= bytes + fs.held_entries() * lanefs::ENTRY_BYTES
}

/// The options of a test store on `disk` opened lazily (`lazy`) or whole, checkpointed only
/// on demand, with no reserve kept for checkpoints.
pub fn lazy_opts(disk: &SimDisk, lazy: bool) -> Options {
    Options {
        lazy,
        checkpoint_reserve: 0,
        ..on_demand(opts(disk, 1 << 20, HOUR))
    }
}

/// A commit or checkpoint interval that never comes during a test: only syncs (or a
/// checkpoint on demand) make one happen.
pub const HOUR: Duration = Duration::from_secs(3600);

/// The options of a test store on the host's own disk (a temporary directory): journal
/// segments of `segment_size` bytes, a commit every `commit_interval`, the rest the defaults.
pub fn host_opts(segment_size: u64, commit_interval: Duration) -> Options {
    Options {
        segment_size,
        commit_interval,
        ..Options::default()
    }
}

/// [`host_opts`] on the simulated `disk` (a clone of it: the same disk).
pub fn opts(disk: &SimDisk, segment_size: u64, commit_interval: Duration) -> Options {
    Options {
        disk: Arc::new(disk.clone()),
        ..host_opts(segment_size, commit_interval)
    }
}

/// `o` with checkpoints only when the test asks for one (`StoreHandle::checkpoint`): no count
/// of records or of segments makes one due (the changed-data budget still may).
pub fn on_demand(o: Options) -> Options {
    Options {
        checkpoint_records: u64::MAX,
        checkpoint_segments: usize::MAX,
        ..o
    }
}

/// Open for reading and writing.
pub fn rw() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.read(true).write(true);
    o
}

/// Open for reading and writing, created if missing.
pub fn rwc() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.read(true).write(true).create(true);
    o
}

/// A filesystem that keeps no file data in memory beyond what changed since the last
/// checkpoint.
pub fn no_cache() -> Config {
    Config {
        cache_bytes: Some(0),
        ..Config::default()
    }
}

/// Waits until the journal of the store at `dir` on `disk` is idle after a sync: the spare
/// segment made ahead of need (docs/STORE.md, "Segment switch") is whole (at least `size`
/// bytes) and durable, so that nothing but a checkpoint touches the disk until the workload
/// goes on. The event itself, not a quiet spell: the segment maker's thread may start late on
/// a loaded machine.
pub fn journal_idle(disk: &SimDisk, dir: &std::path::Path, size: u64) {
    let jd = dir.join("journal");
    let last = |d: &SimDisk| {
        d.files()
            .into_iter()
            .filter(|(p, _)| p.parent() == Some(&jd) && p.extension().is_some_and(|e| e == "seg"))
            .max_by(|a, b| a.0.cmp(&b.0))
    };
    let t = std::time::Instant::now();
    loop {
        let img = disk.crash(Unflushed::Lost);
        if let (Some((p, b)), Some((q, _))) = (last(&img), last(disk))
            && p == q
            && b.len() as u64 >= size
            // Zeros throughout, or a spare header (first LSN 0).
            && (b.iter().all(|&x| x == 0) || (&b[..8] == b"LFSJRNL\x01" && b[40..48] == [0; 8]))
        {
            return;
        }
        // Made off the hot path, in milliseconds; the limit only ends a test that would
        // wait for good, even on a loaded machine.
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "no spare segment is made"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}
/// `len` random bytes, none zero, the same for the same `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = StdRng::seed_from_u64(seed);
    (0..len).map(|_| r.random_range(1..=255u8)).collect()
}

/// Closes a store cleanly, its filesystem `fs` first; nothing else may hold either (a handle
/// given whole is taken as it is).
pub fn close_unshared(fs: Arc<Filesystem>, store: impl Into<Arc<StoreHandle>>) {
    drop(Arc::try_unwrap(fs).unwrap_or_else(|_| panic!("no other reference")));
    Arc::try_unwrap(store.into())
        .unwrap_or_else(|_| panic!("no other reference"))
        .close()
        .unwrap();
}

/// A random mode of `fallocate`: space allocated (the size grown), space allocated with the
/// size kept, or a hole punched.
pub fn random_falloc_mode(rng: &mut impl Rng) -> i32 {
    match rng.random_range(0..3) {
        0 => 0,
        1 => lanefs::FALLOC_FL_KEEP_SIZE,
        _ => lanefs::FALLOC_FL_PUNCH_HOLE | lanefs::FALLOC_FL_KEEP_SIZE,
    }
}

/// A file's bytes `model` after `data` was written at `off`.
pub fn model_write(model: &mut Vec<u8>, off: u64, data: &[u8]) {
    let end = off as usize + data.len();
    if model.len() < end {
        model.resize(end, 0);
    }
    model[off as usize..end].copy_from_slice(data);
}

/// A file's bytes `model` after a hole was punched over `len` bytes at `off` (the size kept).
pub fn model_punch(model: &mut [u8], off: u64, len: u64) {
    let end = ((off + len) as usize).min(model.len());
    if (off as usize) < end {
        model[off as usize..end].fill(0);
    }
}

/// A file's bytes `model` after `len` bytes at `off` were allocated (the size grown to their
/// end).
pub fn model_allocate(model: &mut Vec<u8>, off: u64, len: u64) {
    let end = (off + len) as usize;
    if model.len() < end {
        model.resize(end, 0);
    }
}

/// The methods of an `impl Disk` for a disk that changes only how files open: each of the
/// others calls the host's disk (`RealDisk`) as it is; `capacity` and `available` stay the
/// trait's defaults unless the impl gives its own.
#[allow(unused_macros)] // the test binaries with a disk of their own use it
macro_rules! real_disk_but_open {
    () => {
        fn create_dir_all(&self, path: &std::path::Path) -> std::io::Result<()> {
            lanefs_store::disk::RealDisk.create_dir_all(path)
        }
        fn remove(&self, path: &std::path::Path) -> std::io::Result<()> {
            lanefs_store::disk::RealDisk.remove(path)
        }
        fn rename(&self, from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
            lanefs_store::disk::RealDisk.rename(from, to)
        }
        fn list(&self, dir: &std::path::Path) -> std::io::Result<Vec<std::ffi::OsString>> {
            lanefs_store::disk::RealDisk.list(dir)
        }
        fn sync_dir(&self, dir: &std::path::Path) -> std::io::Result<()> {
            lanefs_store::disk::RealDisk.sync_dir(dir)
        }
        fn exists(&self, path: &std::path::Path) -> bool {
            lanefs_store::disk::RealDisk.exists(path)
        }
        fn lock(&self, path: &std::path::Path) -> std::io::Result<Box<dyn Send + Sync>> {
            lanefs_store::disk::RealDisk.lock(path)
        }
    };
}
#[allow(unused_imports)] // the test binaries with a disk of their own use it
pub(crate) use real_disk_but_open;

/// One image [`PowerCuts`] took: the disk a power cut would have left.
pub struct Cut<T> {
    /// The hook's call it was taken at: 1, 2, ... (each flush calls it twice, before and
    /// after).
    pub call: u64,
    pub at: SyncPoint,
    /// What became of the writes not flushed yet.
    pub how: Unflushed,
    pub disk: SimDisk,
    /// What the test knew just before it was taken ([`PowerCuts::start`]'s `note`): a lower
    /// bound (whatever was acknowledged then is in the image).
    pub note: T,
    /// `note` again, just after it was taken: an upper bound (whatever began after this
    /// is not in the image). The hook does not stop other threads, which may write between
    /// the first `note` and the image.
    pub note_after: T,
}

impl<T> Cut<T> {
    /// Where it was taken, for messages.
    pub fn label(&self) -> String {
        format!(
            "flush call {} ({:?}), unflushed {:?}",
            self.call, self.at, self.how
        )
    }
}

/// The ways of [`PowerCuts::every_flush`]: the unflushed writes lost, kept, and torn (the
/// sectors that reach the disk chosen by `seed ^ call`).
pub fn every_way(seed: u64) -> impl FnMut(u64, SyncPoint) -> Vec<Unflushed> + Send + 'static {
    move |call, _| {
        vec![
            Unflushed::Lost,
            Unflushed::Kept,
            Unflushed::Torn(seed ^ call),
        ]
    }
}

/// Power cuts at the flushes of a simulated disk: from its hook (`SimDisk::on_sync`, before
/// and after every flush), the images a power cut at that moment would leave. The hook ends
/// with [`PowerCuts::take`], or when this is dropped.
pub struct PowerCuts<T = ()> {
    disk: SimDisk,
    cuts: Arc<Mutex<Vec<Cut<T>>>>,
}

impl PowerCuts<()> {
    /// At every flush, before and after it, the three images of [`every_way`].
    pub fn every_flush(disk: &SimDisk, seed: u64) -> PowerCuts<()> {
        PowerCuts::start(disk, every_way(seed), || ())
    }
}

impl<T: Send + 'static> PowerCuts<T> {
    /// At each call of the hook (its number, 1, 2, ..., and whether before or after the
    /// flush), one image for each way `ways` gives (none: no image then), with what `note`
    /// says the test knew just before and just after the images were taken (how far it had
    /// got, what was acknowledged).
    pub fn start(
        disk: &SimDisk,
        mut ways: impl FnMut(u64, SyncPoint) -> Vec<Unflushed> + Send + 'static,
        mut note: impl FnMut() -> T + Send + 'static,
    ) -> PowerCuts<T>
    where
        T: Clone,
    {
        let cuts: Arc<Mutex<Vec<Cut<T>>>> = Arc::default();
        let c = cuts.clone();
        let mut call = 0u64;
        disk.on_sync(move |d, at| {
            call += 1;
            let ways = ways(call, at);
            if ways.is_empty() {
                return;
            }
            let before = note();
            let disks: Vec<_> = ways.into_iter().map(|how| (how, d.crash(how))).collect();
            let after = note();
            let mut c = c.lock();
            for (how, disk) in disks {
                c.push(Cut {
                    call,
                    at,
                    how,
                    disk,
                    note: before.clone(),
                    note_after: after.clone(),
                });
            }
        });
        PowerCuts {
            disk: disk.clone(),
            cuts,
        }
    }

    /// Ends the hook; the images taken.
    pub fn take(self) -> Vec<Cut<T>> {
        self.disk.clear_hook();
        std::mem::take(&mut *self.cuts.lock())
    }
}

impl<T> Drop for PowerCuts<T> {
    fn drop(&mut self) {
        self.disk.clear_hook();
    }
}

/// Aborts the process, saying `what`, unless dropped within `limit`: a hang (which cannot be
/// unwound) fails the test instead of hanging the run. A last resort, minutes, far past what
/// the test takes on a loaded 2-CPU machine: it decides nothing in a run that ends.
/// With `LANEFS_HANG_WAIT` set it waits ten minutes before the abort, for a debugger.
pub struct Watchdog {
    tx: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    pub fn new(what: impl Into<String>, limit: Duration) -> Watchdog {
        let what = what.into();
        let (tx, rx) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
                // Straight to the process's stderr: the test harness captures `eprintln!`,
                // and an abort never prints what it captured.
                use std::io::Write;
                let pid = std::process::id();
                let msg = format!("\nWATCHDOG: {what} still running after {limit:?} (pid {pid})\n");
                let _ = std::io::stderr().write_all(msg.as_bytes());
                if std::env::var_os("LANEFS_HANG_WAIT").is_some() {
                    std::thread::sleep(Duration::from_secs(600));
                }
                std::process::abort();
            }
        });
        Watchdog {
            tx: Some(tx),
            thread: Some(thread),
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A file type as one letter, as `ls -l` shows it (trees compared by shape).
pub fn kind_char(k: FileType) -> char {
    match k {
        FileType::Directory => 'd',
        FileType::RegularFile => 'f',
        FileType::Symlink => 'l',
        FileType::CharDevice => 'c',
        FileType::BlockDevice => 'b',
        FileType::NamedPipe => 'p',
        FileType::Socket => 's',
    }
}
