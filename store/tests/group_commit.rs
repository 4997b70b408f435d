//! An attack on group commit's `sync` (store/src/commit.rs): `Committer::sync` is a `sync_then`
//! whose callback stores the result and unparks the thread, and the committer is woken only
//! by the first sync of a round and by the one that completes the expected group.
//!
//! Written from the public API and the documented contract only (commit.rs's module doc,
//! docs/STORE.md, `lanefs_store::open`, `SimDisk`):
//!
//! - **durability**: 8-32 threads create and write files and sync through every entry point
//!   (`fsync` of a handle, `fsync_inode`, `fsync_inode_then`, `syncfs`, `StoreHandle::sync`);
//!   at every flush of the simulated disk (before and after it), and at random moments from a
//!   thread of its own, the test takes the disk a power cut would leave (unflushed writes
//!   lost, kept, or torn), recovers it, and checks that every thread's files are in a state
//!   the thread went through, no earlier than the last one a sync acknowledged, and that no
//!   operation is recovered while one that ended before it began is missing (the journal is
//!   a prefix of the order of operations).
//! - **liveness** (the commit interval is an hour, so a wake-up the committer misses is a
//!   hang, which a watchdog turns into an abort): thousands of syncs from 1, 2, 8 and 64
//!   threads; syncs from `sync_then` callbacks that resubmit from the committer's thread;
//!   syncs racing `close`; syncs while the disk runs out of space and gets it back; syncs
//!   while every disk operation fails with EIO; syncs from threads that other threads unpark
//!   all the time.
//! - **results**: a sync that returns `Ok` was served by a flush that began after it was
//!   called (the store's flush counter), and the disk a power cut leaves right after it holds
//!   what its thread wrote before it; ENOSPC syncs are followed by `Ok` syncs once space is
//!   back, and nothing written is lost; EIO is sticky (every sync that begins after one
//!   returned EIO returns EIO, before and after the disk works again, and `close` reports it).
//!
//! Every test prints its seed; `LANEFS_SEED=<seed>` reruns it with that seed.

mod common;

use std::collections::BTreeSet;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use common::{opts, seed};
use lanefs::{Client, Config, Errno, Filesystem, OpenOptions};
use lanefs_store::disk::{SimDisk, SyncPoint, Unflushed};
use lanefs_store::{Options, StoreHandle};
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng};

const DIR: &str = "/store";
/// Long enough that a committer which misses a wake-up never runs a round on its own
/// during a test: a missed wake-up is a hang.
const FOREVER: Duration = Duration::from_secs(3600);

// ----- seeds, randomness, watchdog ---------------------------------------------------------

#[derive(Clone)]
/// One stream of a seeded run's random choices.
struct Rng(StdRng);

impl Rng {
    fn new(seed: u64, stream: u64) -> Rng {
        Rng(StdRng::seed_from_u64(
            seed ^ stream.wrapping_mul(0xA24B_AED4_963E_E407),
        ))
    }
    fn next(&mut self) -> u64 {
        self.0.random()
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0.random_range(0..n.max(1))
    }
    fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }
}

/// How long nothing a [`Watchdog`] watches may move before it calls the test hung: far
/// longer than any one step of these tests takes on a loaded 2-CPU machine (seconds), so
/// that it only ever ends a run in which something waits for good.
const STALL: Duration = Duration::from_secs(180);
/// The longest a watched test may take however it moves (a livelock), as a last resort;
/// on a loaded 2-CPU machine these tests take a few minutes at most.
const LAST_RESORT: Duration = Duration::from_secs(1800);

/// Aborts the process (a hang cannot be unwound) if it is not dropped before what
/// `progress` says stays the same for [`STALL`] (nothing moved: a sync hangs, a missed
/// wake-up), or before [`LAST_RESORT`], printing what `progress` says. A run that moves,
/// however slowly (a loaded machine), is waited for: the watchdog decides nothing then.
struct Watchdog {
    done: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    fn new(what: String, progress: impl Fn() -> String + Send + 'static) -> Watchdog {
        let done = Arc::new((Mutex::new(false), Condvar::new()));
        let d = done.clone();
        let thread = std::thread::spawn(move || {
            let began = Instant::now();
            let mut last = progress();
            let mut moved = Instant::now();
            let mut g = d.0.lock().unwrap();
            loop {
                g = d.1.wait_timeout(g, Duration::from_secs(1)).unwrap().0;
                if *g {
                    return;
                }
                let now = progress();
                if now != last {
                    last = now;
                    moved = Instant::now();
                }
                let why = if moved.elapsed() >= STALL {
                    format!("nothing moved for {:?} (a sync hangs?)", moved.elapsed())
                } else if began.elapsed() >= LAST_RESORT {
                    format!("did not finish within {LAST_RESORT:?}")
                } else {
                    continue;
                };
                // Straight to the process's stderr: the test harness captures `eprintln!`
                // (threads inherit the capture), and an abort never prints what it captured.
                use std::io::Write;
                let msg = format!("\ngroup_commit WATCHDOG: {what}: {why}: {last}\n");
                let _ = std::io::stderr().write_all(msg.as_bytes());
                std::process::abort();
            }
        });
        Watchdog {
            done,
            thread: Some(thread),
        }
    }
}

/// A count for each of `n` workers of how far it got, and a [`Watchdog`] over them for the
/// test `what`, which says `counted` and the counts (`"syncs per thread: [..]"`).
fn watched_progress(
    n: usize,
    what: String,
    counted: &'static str,
) -> (Arc<Vec<AtomicUsize>>, Watchdog) {
    let progress: Arc<Vec<AtomicUsize>> = Arc::new((0..n).map(|_| AtomicUsize::new(0)).collect());
    let p = progress.clone();
    let dog = Watchdog::new(what, move || {
        let counts: Vec<usize> = p.iter().map(|a| a.load(SeqCst)).collect();
        format!("{counted}: {counts:?}")
    });
    (progress, dog)
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        *self.done.0.lock().unwrap() = true;
        self.done.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

// ----- the store ---------------------------------------------------------------------------

fn options(sim: &SimDisk, segment: u64, interval: Duration) -> Options {
    Options {
        checkpoint_poll: Duration::from_millis(20),
        ..opts(sim, segment, interval)
    }
}

/// What [`FaultyDisk`] does to the journal's segment files.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Inject {
    Nothing = 0,
    /// Their flushes fail with EIO.
    FlushEio = 1,
    /// Their flushes fail with ENOSPC (the host may have dropped pages it could not write:
    /// the store must stop, not hold records and try again).
    FlushEnospc = 2,
    /// Their writes fail with EIO.
    WriteEio = 3,
    /// Their writes fail with ENOSPC (flushes and the making of segments work).
    WriteEnospc = 4,
}

/// A [`SimDisk`] whose journal segments fail in one way ([`Inject`]) while every other
/// operation works: what `SimDisk::set_failing` (everything fails) cannot do.
struct FaultyDisk {
    inner: SimDisk,
    inject: Arc<std::sync::atomic::AtomicU8>,
}

struct FaultyFile {
    inner: Arc<dyn lanefs_store::disk::DiskFile>,
    segment: bool,
    inject: Arc<std::sync::atomic::AtomicU8>,
}

impl FaultyFile {
    fn fails(&self, kinds: [Inject; 2]) -> Option<std::io::Error> {
        let now = self.inject.load(SeqCst);
        if !self.segment {
            return None;
        }
        if now == kinds[0] as u8 {
            return Some(std::io::Error::from_raw_os_error(libc::EIO));
        }
        if now == kinds[1] as u8 {
            return Some(std::io::Error::from_raw_os_error(libc::ENOSPC));
        }
        None
    }
}

impl lanefs_store::disk::DiskFile for FaultyFile {
    fn read_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
        self.inner.read_at(buf, off)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> std::io::Result<()> {
        match self.fails([Inject::WriteEio, Inject::WriteEnospc]) {
            Some(e) => Err(e),
            None => self.inner.write_at(buf, off),
        }
    }
    fn write_blocks(&self, buf: &[u8], off: u64) -> std::io::Result<()> {
        match self.fails([Inject::WriteEio, Inject::WriteEnospc]) {
            Some(e) => Err(e),
            None => self.inner.write_blocks(buf, off),
        }
    }
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        match self.fails([Inject::FlushEio, Inject::FlushEnospc]) {
            Some(e) => Err(e),
            None => self.inner.sync_data(),
        }
    }
    fn allocate(&self, len: u64) -> std::io::Result<()> {
        self.inner.allocate(len)
    }
}

impl lanefs_store::disk::Disk for FaultyDisk {
    fn create_dir_all(&self, path: &Path) -> std::io::Result<()> {
        self.inner.create_dir_all(path)
    }
    fn open(
        &self,
        path: &Path,
        create: bool,
    ) -> std::io::Result<Arc<dyn lanefs_store::disk::DiskFile>> {
        let inner = self.inner.open(path, create)?;
        Ok(Arc::new(FaultyFile {
            inner,
            segment: path.extension().is_some_and(|e| e == "seg"),
            inject: self.inject.clone(),
        }))
    }
    fn remove(&self, path: &Path) -> std::io::Result<()> {
        self.inner.remove(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        self.inner.rename(from, to)
    }
    fn list(&self, dir: &Path) -> std::io::Result<Vec<std::ffi::OsString>> {
        self.inner.list(dir)
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        self.inner.sync_dir(dir)
    }
    fn exists(&self, path: &Path) -> bool {
        self.inner.exists(path)
    }
    fn lock(&self, path: &Path) -> std::io::Result<Box<dyn Send + Sync>> {
        self.inner.lock(path)
    }
}

fn open(sim: &SimDisk, o: &Options) -> (Arc<Filesystem>, StoreHandle) {
    let _ = sim;
    let o =
        lanefs_store::open(Path::new(DIR), Config::default(), o.clone()).expect("open the store");
    (Arc::new(o.fs), o.store)
}

/// What one worker thread's files look like: its main file `/w{t}` (absent until created)
/// and the names `/w{t}.{i}` it created.
#[derive(Clone, Default)]
struct Model {
    exists: bool,
    content: Vec<u8>,
    names: BTreeSet<u32>,
}

impl Model {
    fn hash(&self) -> u64 {
        state_hash(self.exists.then_some(&self.content[..]), &self.names)
    }
    fn write(&mut self, off: usize, data: &[u8]) {
        if self.content.len() < off + data.len() {
            self.content.resize(off + data.len(), 0);
        }
        self.content[off..off + data.len()].copy_from_slice(data);
    }
}

fn state_hash(main: Option<&[u8]>, names: &BTreeSet<u32>) -> u64 {
    let mut h = DefaultHasher::new();
    main.hash(&mut h);
    names.hash(&mut h);
    h.finish()
}

fn main_path(t: usize) -> String {
    format!("/w{t}")
}

/// Opens the disk a power cut left and returns each of `n` workers' state hashes.
fn recover(img: SimDisk, o: &Options, n: usize) -> Result<Vec<u64>, String> {
    let opened = lanefs_store::open(
        Path::new(DIR),
        Config::default(),
        Options {
            disk: Arc::new(img),
            commit_interval: Duration::from_millis(100),
            checkpoint_poll: Duration::from_secs(60),
            ..o.clone()
        },
    )
    .map_err(|e| format!("recovery failed: {e}"))?;
    let fs = Arc::new(opened.fs);
    let c = Client::root(fs.clone());
    let mut names: Vec<BTreeSet<u32>> = vec![BTreeSet::new(); n];
    let mut mains = vec![false; n];
    for e in c.read_dir("/").map_err(|e| format!("readdir: {e}"))? {
        let name = String::from_utf8_lossy(&e.name).into_owned();
        if name == "big" || name == "f" {
            // Written by threads that are not workers.
            continue;
        }
        let Some(rest) = name.strip_prefix('w') else {
            return Err(format!("unexpected name {name:?}"));
        };
        match rest.split_once('.') {
            None => {
                mains[rest
                    .parse::<usize>()
                    .map_err(|_| format!("name {name:?}"))?] = true
            }
            Some((t, i)) => {
                let t: usize = t.parse().map_err(|_| format!("name {name:?}"))?;
                names[t].insert(i.parse().map_err(|_| format!("name {name:?}"))?);
            }
        }
    }
    let mut out = Vec::with_capacity(n);
    for t in 0..n {
        let main = match mains[t] {
            true => Some(c.read(main_path(t)).map_err(|e| format!("read {t}: {e}"))?),
            false => None,
        };
        out.push(state_hash(main.as_deref(), &names[t]));
    }
    drop(c);
    drop(fs);
    let _ = opened.store.close();
    Ok(out)
}

/// What the workers did, shared with the checkers.
struct Shared {
    n: usize,
    /// `hist[t][k]`: the hash of worker `t`'s state after its first `k` successful operations.
    hist: Vec<Mutex<Vec<u64>>>,
    /// `tickets[t][k]`: the global tickets drawn just before operation `k` began and just
    /// after it returned.
    tickets: Vec<Mutex<Vec<(u64, u64)>>>,
    /// Operations of each worker that a sync acknowledged (a prefix of its operations).
    acked: Vec<AtomicUsize>,
    /// The latest ticket drawn just before a sync that returned `Ok`: every operation of
    /// any worker that ended before it is acknowledged too (a sync makes every change made
    /// so far durable).
    acked_ticket: AtomicU64,
    ticket: AtomicU64,
    /// Crash images taken: which operations were acknowledged just before, and what the
    /// recovered store held.
    images: Mutex<Vec<Image>>,
    failures: Mutex<Vec<String>>,
    seed: u64,
    opts: Options,
}

struct Image {
    label: String,
    acked: Vec<usize>,
    acked_ticket: u64,
    got: Vec<u64>,
}

impl Shared {
    fn new(n: usize, seed: u64, opts: Options) -> Arc<Shared> {
        let h0 = Model::default().hash();
        Arc::new(Shared {
            n,
            hist: (0..n).map(|_| Mutex::new(vec![h0])).collect(),
            tickets: (0..n).map(|_| Mutex::new(Vec::new())).collect(),
            acked: (0..n).map(|_| AtomicUsize::new(0)).collect(),
            acked_ticket: AtomicU64::new(0),
            ticket: AtomicU64::new(0),
            images: Mutex::new(Vec::new()),
            failures: Mutex::new(Vec::new()),
            seed,
            opts,
        })
    }

    fn fail(&self, what: String) {
        let mut f = self.failures.lock().unwrap();
        if f.len() < 50 {
            f.push(what);
        }
    }

    /// Takes the disk a power cut now would leave (after noting what was acknowledged),
    /// recovers it and keeps what it held, to be checked once every operation is known.
    fn crash_check(&self, disk: &SimDisk, how: Unflushed, label: &str) {
        let acked: Vec<usize> = self.acked.iter().map(|a| a.load(SeqCst)).collect();
        let acked_ticket = self.acked_ticket.load(SeqCst);
        let img = disk.crash(how);
        match recover(img, &self.opts, self.n) {
            Ok(got) => self.images.lock().unwrap().push(Image {
                label: format!("{label} {how:?}"),
                acked,
                acked_ticket,
                got,
            }),
            Err(e) => self.fail(format!("power cut at {label} ({how:?}): {e}")),
        }
    }

    /// Checks every image: each worker's recovered state is one it went through, no earlier
    /// than its last acknowledged one; with `order`, no operation is recovered while one
    /// that ended before it began is missing. Returns the number of images.
    fn check_images(&self, order: bool) -> usize {
        let hist: Vec<Vec<u64>> = self
            .hist
            .iter()
            .map(|h| h.lock().unwrap().clone())
            .collect();
        let tickets: Vec<Vec<(u64, u64)>> = self
            .tickets
            .iter()
            .map(|h| h.lock().unwrap().clone())
            .collect();
        let images = self.images.lock().unwrap();
        for img in images.iter() {
            let mut ks = Vec::with_capacity(self.n);
            for t in 0..self.n {
                // Its own syncs acknowledged `acked[t]` operations; any thread's sync, those
                // that ended before that sync began.
                let by_others = tickets[t]
                    .iter()
                    .take_while(|x| x.1 < img.acked_ticket)
                    .count();
                let need = img.acked[t].max(by_others);
                let at: Vec<usize> = hist[t]
                    .iter()
                    .enumerate()
                    .filter(|(_, h)| **h == img.got[t])
                    .map(|(k, _)| k)
                    .collect();
                let Some(&k) = at.iter().find(|&&k| k >= need) else {
                    match at.last() {
                        None => self.fail(format!(
                            "{}: worker {t}'s recovered files are in no state it went through \
                             (acknowledged: {need} operations)",
                            img.label
                        )),
                        Some(k) => self.fail(format!(
                            "{}: worker {t} recovered after {k} operations, but syncs had \
                             acknowledged {need} ({} by its own)",
                            img.label, img.acked[t]
                        )),
                    }
                    ks.clear();
                    break;
                };
                ks.push(k);
            }
            if !order || ks.len() != self.n {
                continue;
            }
            // Recovered operations are those before ks[t]; the latest of their beginnings
            // must come before the earliest end of a missing one.
            let latest_start = (0..self.n)
                .flat_map(|t| tickets[t][..ks[t]].iter().map(move |x| (x.0, t)))
                .max();
            let earliest_end = (0..self.n)
                .flat_map(|t| tickets[t][ks[t]..].iter().map(move |x| (x.1, t)))
                .min();
            if let (Some((s, ts)), Some((e, te))) = (latest_start, earliest_end)
                && s > e
            {
                self.fail(format!(
                    "{}: not a prefix: an operation of worker {ts} (began at ticket {s}) was \
                     recovered, but one of worker {te} that had ended before it (ticket {e}) \
                     was not",
                    img.label
                ));
            }
        }
        images.len()
    }

    fn assert_ok(&self, what: &str) {
        let f = self.failures.lock().unwrap();
        assert!(
            f.is_empty(),
            "{what} (seed {}, rerun with LANEFS_SEED={}):\n{}",
            self.seed,
            self.seed,
            f.join("\n")
        );
    }
}

/// Takes crash images at every flush of `sim` (before and after it): always with unflushed
/// writes lost, one in `torn` torn, one in `kept` kept.
fn hook_power_cuts(sim: &SimDisk, sh: &Arc<Shared>, stream: u64, torn: u64, kept: u64) {
    let sh = sh.clone();
    let mut rng = Rng::new(sh.seed, stream);
    let armed = AtomicBool::new(true);
    sim.on_sync(move |disk, at| {
        if !armed.load(SeqCst) {
            return;
        }
        let label = match at {
            SyncPoint::Before => "before a flush",
            SyncPoint::After => "after a flush",
        };
        sh.crash_check(disk, Unflushed::Lost, label);
        if rng.chance(torn) {
            sh.crash_check(disk, Unflushed::Torn(rng.next()), label);
        }
        if rng.chance(kept) {
            sh.crash_check(disk, Unflushed::Kept, label);
        }
    });
}

/// How a worker asks for durability.
#[derive(Clone, Copy, Debug)]
enum SyncKind {
    Handle,
    Inode,
    Then,
    Fs,
    Store,
}

impl SyncKind {
    fn pick(rng: &mut Rng) -> SyncKind {
        match rng.below(10) {
            0..=2 => SyncKind::Handle,
            3 => SyncKind::Inode,
            4..=6 => SyncKind::Then,
            7 | 8 => SyncKind::Fs,
            _ => SyncKind::Store,
        }
    }
}

/// One worker's view of the store.
struct Worker<'a> {
    t: usize,
    fs: &'a Arc<Filesystem>,
    /// The store's handle, where the worker may borrow it (not while `close` races it).
    store: Option<&'a StoreHandle>,
    c: Client,
    model: Model,
    ops: usize,
    /// The store's flush count read before this worker's latest operation, while it has
    /// operations no `Ok` sync of its own has acknowledged.
    unsynced: Option<u64>,
    /// After one `Ok` sync in this many, a power cut right away: it must keep every
    /// operation before the sync (0: never).
    cut_every: u64,
    sim: Option<&'a SimDisk>,
    rng: Rng,
}

impl<'a> Worker<'a> {
    fn new(t: usize, fs: &'a Arc<Filesystem>, store: Option<&'a StoreHandle>) -> Worker<'a> {
        Worker {
            t,
            fs,
            store,
            c: Client::root(fs.clone()),
            model: Model::default(),
            ops: 0,
            unsynced: None,
            cut_every: 0,
            sim: None,
            rng: Rng::new(t as u64, 77),
        }
    }

    /// Runs one operation, noting it in `sh` if it succeeded.
    fn op(
        &mut self,
        sh: &Shared,
        f: impl FnOnce(&Client, &mut Model) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let flushes = self.store.map(|s| s.counters().flushes);
        let s = sh.ticket.fetch_add(1, SeqCst);
        let mut m = self.model.clone();
        let r = f(&self.c, &mut m);
        if r.is_ok() {
            self.unsynced = flushes;
        }
        let e = sh.ticket.fetch_add(1, SeqCst);
        if r.is_ok() {
            self.model = m;
            self.ops += 1;
            sh.hist[self.t].lock().unwrap().push(self.model.hash());
            sh.tickets[self.t].lock().unwrap().push((s, e));
        }
        r
    }

    fn create_main(&mut self, sh: &Shared) -> std::io::Result<()> {
        let p = main_path(self.t);
        self.op(sh, |c, m| {
            c.open(&p, OpenOptions::new().write(true).create_new(true))?;
            m.exists = true;
            Ok(())
        })
    }

    fn write(&mut self, sh: &Shared, off: usize, data: &[u8]) -> std::io::Result<()> {
        let p = main_path(self.t);
        self.op(sh, |c, m| {
            let f = c.open(&p, OpenOptions::new().write(true))?;
            let n = f.write_at(data, off as u64)?;
            assert_eq!(n, data.len(), "short write");
            m.write(off, data);
            Ok(())
        })
    }

    fn truncate(&mut self, sh: &Shared, len: usize) -> std::io::Result<()> {
        let p = main_path(self.t);
        self.op(sh, |c, m| {
            c.truncate(&p, len as u64)?;
            m.content.resize(len, 0);
            Ok(())
        })
    }

    fn create_name(&mut self, sh: &Shared, i: u32) -> std::io::Result<()> {
        let p = format!("/w{}.{i}", self.t);
        self.op(sh, |c, m| {
            c.open(&p, OpenOptions::new().write(true).create_new(true))?;
            m.names.insert(i);
            Ok(())
        })
    }

    /// Syncs by `how`; on `Ok`, checks that a flush completed after this worker's latest
    /// unacknowledged operation began (its records were appended then; a sync with nothing
    /// to commit may return without a flush), and notes every operation so far as
    /// acknowledged.
    /// Checks one `Ok` sync in `every` against a power cut taken right after it.
    fn cut_after_sync(mut self, sim: &'a SimDisk, every: u64) -> Self {
        self.sim = Some(sim);
        self.cut_every = every;
        self
    }

    fn sync(&mut self, sh: &Shared, how: SyncKind) -> lanefs::Result<()> {
        let ops = self.ops;
        let start = sh.ticket.fetch_add(1, SeqCst);
        let r = sync_by(self.fs, self.store, &self.c, self.t, how);
        if r.is_ok()
            && let Some(before) = self.unsynced
        {
            let after = self.store.expect("a store").counters().flushes;
            if after <= before {
                sh.fail(format!(
                    "worker {}: a sync ({how:?}) returned Ok, but no flush completed since \
                     the worker's latest operation began (flushes {before} -> {after})",
                    self.t
                ));
            }
        }
        if r.is_ok() {
            self.unsynced = None;
            sh.acked[self.t].fetch_max(ops, SeqCst);
            sh.acked_ticket.fetch_max(start, SeqCst);
            if let Some(sim) = self.sim
                && self.cut_every > 0
                && self.rng.chance(self.cut_every)
            {
                match recover(sim.crash(Unflushed::Lost), &sh.opts, sh.n) {
                    Ok(got) => {
                        let hist = sh.hist[self.t].lock().unwrap();
                        if !hist[ops..].contains(&got[self.t]) {
                            sh.fail(format!(
                                "worker {}: a sync ({how:?}) returned Ok, but a power cut \
                                 right after it loses some of the {ops} operations before it",
                                self.t
                            ));
                        }
                    }
                    Err(e) => sh.fail(format!("power cut after a sync: {e}")),
                }
            }
        }
        r
    }
}

fn sync_by(
    fs: &Arc<Filesystem>,
    store: Option<&StoreHandle>,
    c: &Client,
    t: usize,
    how: SyncKind,
) -> lanefs::Result<()> {
    let errno = |e: std::io::Error| Errno(e.raw_os_error().unwrap_or(libc::EIO));
    match how {
        SyncKind::Handle | SyncKind::Inode | SyncKind::Then => {
            let f = match c.open(main_path(t), OpenOptions::new().read(true)) {
                Ok(f) => f,
                // Not created yet (or refused): sync the whole store instead.
                Err(_) => return fs.sync_all(),
            };
            match how {
                SyncKind::Handle => f.sync_all().map_err(errno),
                SyncKind::Inode => fs.fsync_inode(f.ino(), false),
                _ => {
                    let (tx, rx) = mpsc::channel();
                    fs.fsync_inode_then(
                        f.ino(),
                        true,
                        Box::new(move |r| {
                            let _ = tx.send(r);
                        }),
                    );
                    rx.recv().expect("sync_then calls its callback")
                }
            }
        }
        SyncKind::Fs => fs.sync_all(),
        SyncKind::Store => match store {
            Some(s) => s.sync(),
            None => fs.sync_all(),
        },
    }
}

fn data(t: usize, i: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (t.wrapping_mul(131) ^ i.wrapping_mul(17) ^ j.wrapping_mul(7)) as u8 | 1)
        .collect()
}

/// The state hashes of a fresh recovery of `sim` as a power cut now would leave it.
fn recover_now(sim: &SimDisk, sh: &Shared, how: Unflushed) -> Vec<u64> {
    recover(sim.crash(how), &sh.opts, sh.n).unwrap_or_else(|e| {
        panic!("seed {}: {e}", sh.seed);
    })
}

/// Every worker's recovered state is exactly its state after all its successful operations.
fn assert_all_kept(sh: &Shared, got: &[u64], what: &str) {
    for (t, &got) in got.iter().enumerate().take(sh.n) {
        let hist = sh.hist[t].lock().unwrap();
        let last = hist.len() - 1;
        if got != hist[last] {
            let at: Vec<usize> = (0..hist.len()).filter(|&k| hist[k] == got).collect();
            panic!(
                "seed {}: {what}: worker {t} recovered in state(s) {at:?}, not after its {last} \
                 successful operations (acknowledged: {})",
                sh.seed,
                sh.acked[t].load(SeqCst)
            );
        }
    }
}

// ----- 1. durability through power cuts ----------------------------------------------------

/// `n` workers each create a file, write to it and create names, syncing after most
/// operations by every entry point; power cuts at every flush and at random moments.
fn durability(name: &str, n: usize, ops: usize) {
    let seed = seed::seed(&format!("group_commit::{name}"));
    let sim = SimDisk::new();
    let mut opts = options(&sim, 32 << 10, FOREVER);
    // Checkpoints run during the test (their flushes are power-cut points too) and remove
    // the segments they cover.
    opts.checkpoint_segments = 3;
    opts.checkpoint_poll = Duration::from_millis(5);
    let sh = Shared::new(n, seed, opts.clone());
    hook_power_cuts(&sim, &sh, 1, 3, 8);
    let done = AtomicBool::new(false);
    let (progress, dog) =
        watched_progress(n, format!("{name} (seed {seed})"), "operations per worker");
    let (fs, store) = open(&sim, &opts);
    let started = Instant::now();
    let random_cuts = AtomicUsize::new(0);
    // Workers that returned (done, or stopped by a failure).
    let ended = AtomicUsize::new(0);
    let simr = &sim;
    std::thread::scope(|s| {
        for t in 0..n {
            let (fs, store, sh, progress, ended) = (&fs, &store, &sh, &progress, &ended);
            s.spawn(move || {
                struct Ended<'a>(&'a AtomicUsize);
                impl Drop for Ended<'_> {
                    fn drop(&mut self) {
                        self.0.fetch_add(1, SeqCst);
                    }
                }
                let _ended = Ended(ended);
                let mut rng = Rng::new(seed, 100 + t as u64);
                let mut w = Worker::new(t, fs, Some(store)).cut_after_sync(simr, 6);
                for i in 0..ops {
                    let r = if i == 0 {
                        w.create_main(sh)
                    } else if rng.chance(4) {
                        w.create_name(sh, i as u32)
                    } else {
                        let len = 16 + rng.below(200) as usize;
                        let off = w.model.content.len();
                        w.write(sh, off, &data(t, i, len))
                    };
                    if let Err(e) = r {
                        sh.fail(format!("worker {t}: operation {i} failed: {e}"));
                        return;
                    }
                    progress[t].store(i + 1, SeqCst);
                    if !rng.chance(5) {
                        let how = SyncKind::pick(&mut rng);
                        if let Err(e) = w.sync(sh, how) {
                            sh.fail(format!("worker {t}: sync ({how:?}) after {i}: {e}"));
                        }
                    }
                }
            });
        }
        // Power cuts at random moments (between flushes, right after syncs return).
        s.spawn(|| {
            let mut rng = Rng::new(seed, 2);
            while !done.load(SeqCst) {
                std::thread::sleep(Duration::from_micros(rng.below(3000)));
                sh.crash_check(&sim, Unflushed::Lost, "a random moment");
                random_cuts.fetch_add(1, SeqCst);
            }
        });
        // Wait for every worker to return, its last sync included (the scope joins the
        // crasher too, so stop it first).
        while ended.load(SeqCst) < n {
            std::thread::sleep(Duration::from_millis(2));
        }
        done.store(true, SeqCst);
    });
    let run = started.elapsed();
    sim.clear_hook();
    let flushes = store.counters().flushes;
    store.close().expect("close");
    drop(dog);
    let images = sh.check_images(true);
    sh.assert_ok(name);
    // After a clean close every operation is durable.
    let got = recover_now(&sim, &sh, Unflushed::Lost);
    assert_all_kept(&sh, &got, "after close");
    eprintln!(
        "group_commit::{name}: {n} workers x {ops} operations in {run:?}, {flushes} journal \
         flushes, {images} power cuts checked ({} at random moments)",
        random_cuts.load(SeqCst)
    );
}

/// A `#[test]` function for each `name => call;`: the test `name` makes the call.
macro_rules! tests {
    ($($name:ident => $call:expr;)*) => {
        $(
            #[test]
            fn $name() {
                $call;
            }
        )*
    };
}

tests! {
    durability_8_threads_power_cut_at_every_flush => durability("durability_8", 8, 500);
    durability_16_threads_power_cut_at_every_flush => durability("durability_16", 16, 200);
    durability_32_threads_power_cut_at_every_flush => durability("durability_32", 32, 120);
}

// ----- 2. liveness --------------------------------------------------------------------------

/// `n` threads each sync `per` times, by every entry point, writing between most syncs; one
/// more thread writes big buffers (2 MiB rounds) when `writer`. The commit interval is an
/// hour: a sync the committer is not woken for hangs.
fn rapid(name: &str, n: usize, per: usize, writer: bool) {
    let seed = seed::seed(&format!("group_commit::{name}"));
    let sim = SimDisk::new();
    let opts = options(&sim, if writer { 4 << 20 } else { 256 << 10 }, FOREVER);
    let sh = Shared::new(n, seed, opts.clone());
    let (progress, dog) = watched_progress(n, format!("{name} (seed {seed})"), "syncs per thread");
    let (fs, store) = open(&sim, &opts);
    let started = Instant::now();
    let slowest = Mutex::new(Duration::ZERO);
    let stop = AtomicBool::new(false);
    let simr = &sim;
    std::thread::scope(|s| {
        let mut handles = Vec::new();
        for t in 0..n {
            let (fs, store, sh, progress, slowest) = (&fs, &store, &sh, &progress, &slowest);
            handles.push(s.spawn(move || {
                let mut rng = Rng::new(seed, 100 + t as u64);
                let mut w = Worker::new(t, fs, Some(store)).cut_after_sync(simr, 40);
                w.create_main(sh).expect("create");
                let mut worst = Duration::ZERO;
                for i in 0..per {
                    if rng.chance(2) {
                        let off = rng.below(4096) as usize;
                        w.write(sh, off, &data(t, i, 1 + rng.below(64) as usize))
                            .expect("write");
                    }
                    let how = SyncKind::pick(&mut rng);
                    let t0 = Instant::now();
                    if let Err(e) = w.sync(sh, how) {
                        sh.fail(format!("thread {t}: sync {i} ({how:?}): {e}"));
                    }
                    worst = worst.max(t0.elapsed());
                    progress[t].store(i + 1, SeqCst);
                }
                let mut g = slowest.lock().unwrap();
                *g = (*g).max(worst);
            }));
        }
        if writer {
            let (fs, stop) = (&fs, &stop);
            s.spawn(move || {
                let c = Client::root(fs.clone());
                let f = c
                    .open("/big", OpenOptions::new().write(true).create(true))
                    .unwrap();
                // 64 KiB at a time, paced, about 24 MiB in all: buffers pass 2 MiB (the
                // committer is kicked) without the test becoming a throughput benchmark.
                let buf = vec![7u8; 64 << 10];
                let mut off = 0u64;
                while !stop.load(SeqCst) && off < (24 << 20) {
                    f.write_at(&buf, off % (4 << 20)).unwrap();
                    off += buf.len() as u64;
                    if off.is_multiple_of(1 << 20) {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
            });
        }
        for h in handles {
            h.join().unwrap();
        }
        stop.store(true, SeqCst);
    });
    let run = started.elapsed();
    let flushes = store.counters().flushes;
    sh.assert_ok(name);
    store.close().expect("close");
    drop(dog);
    let got = recover_now(&sim, &sh, Unflushed::Lost);
    assert_all_kept(&sh, &got, "after close");
    eprintln!(
        "group_commit::{name}: {} syncs from {n} threads in {run:?} ({flushes} flushes), the \
         slowest {:?}",
        n * per,
        slowest.lock().unwrap()
    );
}

tests! {
    rapid_syncs_1_thread => rapid("rapid_1", 1, 10000, false);
    rapid_syncs_2_threads => rapid("rapid_2", 2, 5000, false);
    rapid_syncs_8_threads_and_a_big_writer => rapid("rapid_8", 8, 1000, true);
    rapid_syncs_64_threads => rapid("rapid_64", 64, 150, false);
}

/// `sync_then` callbacks that ask for the next sync from inside the callback (on the
/// committer's thread, as a server answering at once might), alongside blocking syncs.
#[test]
fn sync_then_chains_resubmitted_from_the_callback() {
    let seed = seed::seed("group_commit::chains");
    let sim = SimDisk::new();
    let opts = options(&sim, 256 << 10, FOREVER);
    const CHAINS: usize = 16;
    const LINKS: usize = 300;
    let left = Arc::new(AtomicUsize::new(CHAINS));
    let links = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let l = links.clone();
    let dog = Watchdog::new(format!("chains (seed {seed})"), move || {
        format!("links done: {}", l.load(SeqCst))
    });
    let (fs, store) = open(&sim, &opts);
    let c = Client::root(fs.clone());
    let f = c
        .open("/f", OpenOptions::new().write(true).create(true))
        .unwrap();
    let ino = f.ino();

    fn link(
        fs: Arc<Filesystem>,
        ino: lanefs::Ino,
        n: usize,
        left: Arc<AtomicUsize>,
        links: Arc<AtomicUsize>,
        errors: Arc<Mutex<Vec<String>>>,
    ) {
        let fs2 = fs.clone();
        fs.fsync_inode_then(
            ino,
            false,
            Box::new(move |r| {
                links.fetch_add(1, SeqCst);
                if let Err(e) = r {
                    errors.lock().unwrap().push(format!("link {n}: {e}"));
                }
                if n + 1 < LINKS {
                    link(fs2, ino, n + 1, left, links, errors);
                } else {
                    left.fetch_sub(1, SeqCst);
                }
            }),
        );
    }
    for _ in 0..CHAINS {
        link(
            fs.clone(),
            ino,
            0,
            left.clone(),
            links.clone(),
            errors.clone(),
        );
    }
    // Blocking syncs alongside.
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (fs, c) = (&fs, &c);
            s.spawn(move || {
                let f = c.open("/f", OpenOptions::new().write(true)).unwrap();
                for i in 0..300u64 {
                    f.write_at(&[t as u8; 8], (t * 8 + i) % 512).unwrap();
                    fs.sync_all().unwrap();
                }
            });
        }
    });
    while left.load(SeqCst) > 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(dog);
    assert!(
        errors.lock().unwrap().is_empty(),
        "seed {seed}: {:?}",
        errors.lock().unwrap()
    );
    assert_eq!(links.load(SeqCst), CHAINS * LINKS);
    drop(f);
    drop(c);
    store.close().unwrap();
}

/// Other threads unpark the syncing threads all the time, and hand them work through their
/// own park/unpark protocol: a sync must neither return early (every `Ok` is checked against
/// a power cut taken right after it) nor lose another protocol's wake-up.
#[test]
fn spurious_unparks_do_not_end_a_sync_early() {
    let seed = seed::seed("group_commit::unparks");
    let sim = SimDisk::new();
    let opts = options(&sim, 256 << 10, FOREVER);
    const N: usize = 4;
    const ROUNDS: usize = 120;
    let sh = Shared::new(N, seed, opts.clone());
    let (progress, dog) =
        watched_progress(N, format!("unparks (seed {seed})"), "rounds per thread");
    let (fs, store) = open(&sim, &opts);
    let stop = AtomicBool::new(false);
    let go: Vec<AtomicBool> = (0..N).map(|_| AtomicBool::new(false)).collect();
    let early = AtomicUsize::new(0);
    std::thread::scope(|s| {
        let (threads_tx, threads_rx) = mpsc::channel::<(usize, std::thread::Thread)>();
        let mut handles = Vec::new();
        for t in 0..N {
            let (fs, store, sh, progress, go, sim, early) =
                (&fs, &store, &sh, &progress, &go, &sim, &early);
            let tx = threads_tx.clone();
            handles.push(s.spawn(move || {
                tx.send((t, std::thread::current())).unwrap();
                let mut rng = Rng::new(seed, 100 + t as u64);
                let mut w = Worker::new(t, fs, Some(store));
                w.create_main(sh).unwrap();
                for i in 0..ROUNDS {
                    // Wait for the feeder's go-ahead (its own flag-and-park protocol).
                    while !go[t].swap(false, SeqCst) {
                        std::thread::park();
                    }
                    let off = w.model.content.len();
                    w.write(sh, off, &data(t, i, 8)).unwrap();
                    let how = SyncKind::pick(&mut rng);
                    let ops = w.ops;
                    match w.sync(sh, how) {
                        Ok(()) => {
                            if i % 3 == 0 {
                                // A power cut right now keeps what this thread wrote.
                                let got = recover(sim.crash(Unflushed::Lost), &sh.opts, N)
                                    .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
                                let hist = sh.hist[t].lock().unwrap();
                                if !hist[ops..].contains(&got[t]) {
                                    early.fetch_add(1, SeqCst);
                                    sh.fail(format!(
                                        "thread {t}: sync {i} ({how:?}) returned Ok but a power \
                                         cut right after it loses the thread's writes"
                                    ));
                                }
                            }
                        }
                        Err(e) => sh.fail(format!("thread {t}: sync {i} ({how:?}): {e}")),
                    }
                    progress[t].store(i + 1, SeqCst);
                }
            }));
        }
        drop(threads_tx);
        let threads: Vec<(usize, std::thread::Thread)> = threads_rx.iter().take(N).collect();
        // The unparker: spurious wake-ups, all the time.
        {
            let (threads, stop) = (threads.clone(), &stop);
            s.spawn(move || {
                let mut i = 0u64;
                while !stop.load(SeqCst) {
                    for (_, th) in &threads {
                        th.unpark();
                    }
                    i += 1;
                    if i.is_multiple_of(64) {
                        std::thread::yield_now();
                    }
                }
            });
        }
        // The feeder: gives each thread its go-ahead (flag, then unpark) once it finished
        // the round before.
        {
            let (threads, stop, go, progress) = (threads.clone(), &stop, &go, &progress);
            s.spawn(move || {
                let mut given = [0usize; N];
                while !stop.load(SeqCst) {
                    for (t, th) in &threads {
                        if given[*t] < ROUNDS && progress[*t].load(SeqCst) == given[*t] {
                            given[*t] += 1;
                            go[*t].store(true, SeqCst);
                            th.unpark();
                        }
                    }
                    std::thread::sleep(Duration::from_micros(50));
                }
            });
        }
        for h in handles {
            h.join().unwrap();
        }
        stop.store(true, SeqCst);
    });
    drop(dog);
    sh.assert_ok("unparks");
    assert_eq!(early.load(SeqCst), 0);
    store.close().unwrap();
    let got = recover_now(&sim, &sh, Unflushed::Lost);
    assert_all_kept(&sh, &got, "after close");
}

// ----- 3. close, ENOSPC, EIO --------------------------------------------------------------

/// Threads write and sync until a write or a sync fails, while the store is closed under
/// them at a random moment: every sync returns, every `Ok` is durable, every sync that
/// begins after `close` returned fails, and after a clean close every successful write is
/// on disk.
#[test]
fn syncs_racing_close() {
    let seed = seed::seed("group_commit::close");
    let mut rng = Rng::new(seed, 1);
    let started = Instant::now();
    let mut iterations = 0;
    let mut acked_total = 0;
    while iterations < 40 && (iterations < 8 || started.elapsed() < Duration::from_secs(6)) {
        let it = iterations as u64;
        iterations += 1;
        let n = 1 + rng.below(12) as usize;
        let interval = match rng.below(3) {
            0 => Duration::from_millis(1),
            _ => FOREVER,
        };
        let sim = SimDisk::new();
        let opts = options(&sim, 64 << 10, interval);
        let sh = Shared::new(n, seed ^ it, opts.clone());
        if rng.chance(3) {
            hook_power_cuts(&sim, &sh, 7 + it, 4, 16);
        }
        let closed = AtomicBool::new(false);
        let (progress, dog) = watched_progress(
            n,
            format!("close iteration {it} (seed {seed})"),
            "operations per thread",
        );
        let (fs, store) = open(&sim, &opts);
        let delay = Duration::from_micros(rng.below(4000));
        let closing = rng.below(3);
        let mut store = Some(store);
        let simr = &sim;
        let close_result = std::thread::scope(|s| {
            for t in 0..n {
                let (fs, sh, closed, progress) = (&fs, &sh, &closed, &progress);
                s.spawn(move || {
                    let mut rng = Rng::new(sh.seed, 100 + t as u64);
                    let mut w = Worker::new(t, fs, None).cut_after_sync(simr, 8);
                    if w.create_main(sh).is_ok() {
                        for i in 1.. {
                            let off = rng.below(2048) as usize;
                            let wrote = w.write(sh, off, &data(t, i, 1 + rng.below(100) as usize));
                            progress[t].store(i, SeqCst);
                            let was_closed = closed.load(SeqCst);
                            let how = SyncKind::pick(&mut rng);
                            let synced = match rng.chance(3) {
                                true => None,
                                false => Some(w.sync(sh, how)),
                            };
                            if was_closed && let Some(Ok(())) = synced {
                                sh.fail(format!(
                                    "thread {t}: a sync ({how:?}) that began after close \
                                     returned Ok"
                                ));
                            }
                            if wrote.is_err() || matches!(synced, Some(Err(_))) {
                                break;
                            }
                        }
                    }
                    // Every sync from now on returns, and none says Ok once the store is
                    // closed.
                    while !closed.load(SeqCst) {
                        std::thread::sleep(Duration::from_micros(100));
                    }
                    for _ in 0..5 {
                        let how = SyncKind::pick(&mut rng);
                        if let Ok(()) = w.sync(sh, how) {
                            sh.fail(format!(
                                "thread {t}: a sync ({how:?}) after close returned Ok"
                            ));
                        }
                    }
                });
            }
            std::thread::sleep(delay);
            let store = store.take().expect("the store");
            let r = match closing {
                0 => {
                    drop(store);
                    None
                }
                _ => Some(store.close()),
            };
            closed.store(true, SeqCst);
            r
        });
        drop(dog);
        sim.clear_hook();
        sh.check_images(false);
        sh.assert_ok(&format!("close iteration {it}"));
        let got = recover_now(&sim, &sh, Unflushed::Lost);
        match close_result {
            Some(Err(e)) => panic!("seed {seed}: close failed: {e}"),
            // A clean close commits every change it did not refuse.
            _ => assert_all_kept(&sh, &got, &format!("close iteration {it}")),
        }
        acked_total += sh.acked.iter().map(|a| a.load(SeqCst)).sum::<usize>();
    }
    eprintln!(
        "group_commit::close: {iterations} closes raced by syncing threads, {acked_total} \
         operations acknowledged"
    );
}

/// What happens to the disk in the middle of a fault test.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    /// The disk fills up, then has room again.
    SpaceBack,
    /// The disk fills up, then fails with EIO, then works again (with room).
    SpaceThenEio,
    /// The disk fails with EIO, then works again.
    Eio,
    /// Only the journal's flushes fail, with EIO; then they work again.
    FlushEio,
    /// Only the journal's flushes fail, with ENOSPC (which stops the store all the same: a
    /// failed flush may have lost pages); then they work again.
    FlushEnospc,
    /// Only the journal's writes fail, with EIO; then they work again.
    WriteEio,
    /// Only the journal's writes fail, with ENOSPC (records are held); then they work again.
    WriteEnospc,
}

impl Fault {
    /// What a sync returns during the fault.
    fn errno(self) -> Errno {
        match self {
            Fault::SpaceBack | Fault::SpaceThenEio | Fault::WriteEnospc => Errno::ENOSPC,
            _ => Errno::EIO,
        }
    }
    /// Whether syncs succeed again after the fault (else the store stopped for good).
    fn passes(self) -> bool {
        matches!(self, Fault::SpaceBack | Fault::WriteEnospc)
    }
}

/// A sync's outcome, with the tickets drawn around it.
struct Outcome {
    start: u64,
    end: u64,
    sync: bool,
    r: Result<(), i32>,
}

/// `n` workers write, truncate and sync while the disk runs out of space or fails (`fault`),
/// with power cuts at every flush. The commit interval is an hour: the committer runs for
/// syncs, and every 50 ms for held records.
///
/// Each worker goes on through the fault until one of its syncs fails, and the next phase
/// begins only once every worker's has: the test waits for that, however long it takes.
/// Where the disk fills (`set_space`), no checkpoint runs: a checkpoint gives the journal's
/// segments back, which on a full host is what the store is meant to do (docs/STORE.md,
/// "Out of room"), and with the checkpointer keeping up with the workers (as when a loaded
/// machine slows them down: 11 checkpoints, all committed, in the 20 s one run waited) the
/// disk never filled and no sync met it. Without checkpoints the journal can only grow, so
/// every worker's sync meets the full disk once the room in its segments is used up.
fn faults(name: &str, fault: Fault) {
    let seed = seed::seed(&format!("group_commit::{name}"));
    let n = 6;
    let sim = SimDisk::new();
    let inject = Arc::new(std::sync::atomic::AtomicU8::new(Inject::Nothing as u8));
    let mut opts = Options {
        disk: Arc::new(FaultyDisk {
            inner: sim.clone(),
            inject: inject.clone(),
        }),
        ..options(&sim, 64 << 10, FOREVER)
    };
    if matches!(fault, Fault::SpaceBack | Fault::SpaceThenEio) {
        // The checkpointer looks only every poll (or when pages changed pass their budget,
        // 16 MiB, which these workers' few KiB never reach).
        opts.checkpoint_poll = FOREVER;
    }
    let sh = Shared::new(n, seed, opts.clone());
    hook_power_cuts(&sim, &sh, 3, 4, 16);
    // 0: normal; 1: fault; 2: recovered (room again, or the disk works again).
    let phase = AtomicUsize::new(0);
    let ready = AtomicUsize::new(0);
    let (progress, dog) =
        watched_progress(n, format!("{name} (seed {seed})"), "operations per worker");
    let (fs, store) = open(&sim, &opts);
    let outcomes: Mutex<Vec<Outcome>> = Mutex::new(Vec::new());
    let enospc_syncs = AtomicUsize::new(0);
    let eio_syncs = AtomicUsize::new(0);
    let enospc_refused = AtomicUsize::new(0);
    let slow_back = Mutex::new(Vec::new());
    let started = Instant::now();
    let simr = &sim;
    std::thread::scope(|s| {
        for t in 0..n {
            let (fs, store, sh, phase, ready, progress, outcomes) =
                (&fs, &store, &sh, &phase, &ready, &progress, &outcomes);
            let (enospc_syncs, enospc_refused, slow_back, eio_syncs) =
                (&enospc_syncs, &enospc_refused, &slow_back, &eio_syncs);
            s.spawn(move || {
                let mut rng = Rng::new(seed, 100 + t as u64);
                let mut w = Worker::new(t, fs, Some(store)).cut_after_sync(simr, 3);
                w.create_main(sh).unwrap();
                let note = |sync: bool, start: u64, r: &lanefs::Result<()>| {
                    let end = sh.ticket.fetch_add(1, SeqCst);
                    outcomes.lock().unwrap().push(Outcome {
                        start,
                        end,
                        sync,
                        r: r.map_err(|e| e.0),
                    });
                };
                let mut i = 0usize;
                let mut step =
                    |w: &mut Worker, rng: &mut Rng| -> (lanefs::Result<()>, lanefs::Result<()>) {
                        i += 1;
                        let start = sh.ticket.fetch_add(1, SeqCst);
                        let r = if rng.chance(2) {
                            let off = rng.below(3000) as usize;
                            w.write(sh, off, &data(t, i, 1 + rng.below(400) as usize))
                        } else {
                            w.truncate(sh, rng.below(3000) as usize)
                        };
                        let r = r.map_err(|e| Errno(e.raw_os_error().unwrap_or(-1)));
                        note(false, start, &r);
                        if r == Err(Errno::ENOSPC) {
                            enospc_refused.fetch_add(1, SeqCst);
                        }
                        progress[t].fetch_add(1, SeqCst);
                        let start = sh.ticket.fetch_add(1, SeqCst);
                        let sr = w.sync(sh, SyncKind::pick(rng));
                        note(true, start, &sr);
                        (r, sr)
                    };
                // Normal.
                for _ in 0..15 {
                    let (r, sr) = step(&mut w, &mut rng);
                    if r.is_err() || sr.is_err() {
                        sh.fail(format!("worker {t}: before the fault: {r:?} {sr:?}"));
                    }
                }
                ready.fetch_add(1, SeqCst);
                while phase.load(SeqCst) == 0 {
                    std::thread::sleep(Duration::from_micros(200));
                }
                // The fault: until this worker's sync fails (or the phase ends).
                let mut failed = false;
                while phase.load(SeqCst) == 1 {
                    if !failed {
                        let (_, sr) = step(&mut w, &mut rng);
                        match sr {
                            Ok(()) => {}
                            Err(e) if e == fault.errno() => {
                                match e {
                                    Errno::ENOSPC => enospc_syncs.fetch_add(1, SeqCst),
                                    _ => eio_syncs.fetch_add(1, SeqCst),
                                };
                                failed = true;
                                ready.fetch_add(1, SeqCst);
                            }
                            Err(e) => {
                                sh.fail(format!("worker {t}: during the fault: sync: {e}"));
                                failed = true;
                                ready.fetch_add(1, SeqCst);
                            }
                        }
                    } else {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
                if !failed {
                    ready.fetch_add(1, SeqCst);
                }
                while phase.load(SeqCst) == 2 {
                    std::thread::sleep(Duration::from_micros(200));
                }
                // After: room again (the next syncs succeed), or the disk works again (the
                // store stays stopped).
                match fault.passes() {
                    true => {
                        let back = Instant::now();
                        let mut attempts = 0;
                        loop {
                            attempts += 1;
                            let start = sh.ticket.fetch_add(1, SeqCst);
                            let sr = w.sync(sh, SyncKind::pick(&mut rng));
                            note(true, start, &sr);
                            match sr {
                                Ok(()) => break,
                                Err(Errno::ENOSPC) if attempts < 100 => {
                                    std::thread::sleep(Duration::from_millis(1));
                                }
                                Err(e) => {
                                    sh.fail(format!(
                                        "worker {t}: room is back, but sync {attempts} still \
                                         fails: {e}"
                                    ));
                                    break;
                                }
                            }
                        }
                        slow_back.lock().unwrap().push((attempts, back.elapsed()));
                        // From now on every sync succeeds; writes may be refused a little
                        // while longer (until the next segment is made).
                        for _ in 0..30 {
                            let (r, sr) = step(&mut w, &mut rng);
                            if let Err(e) = sr {
                                sh.fail(format!(
                                    "worker {t}: a sync failed ({e}) after one had succeeded \
                                     with room back"
                                ));
                            }
                            if r.is_err() && r != Err(Errno::ENOSPC) {
                                sh.fail(format!("worker {t}: with room back: {r:?}"));
                            }
                        }
                    }
                    false => {
                        for _ in 0..8 {
                            let (r, sr) = step(&mut w, &mut rng);
                            if r != Err(Errno::EIO) || sr != Err(Errno::EIO) {
                                sh.fail(format!(
                                    "worker {t}: the disk works again, but the stopped store \
                                     gave write {r:?}, sync {sr:?} (EIO is sticky)"
                                ));
                            }
                        }
                    }
                }
            });
        }
        // The conductor.
        let wait_ready = |k: usize| {
            while ready.load(SeqCst) < k {
                std::thread::sleep(Duration::from_micros(200));
            }
        };
        wait_ready(n);
        let mut rng = Rng::new(seed, 5);
        match fault {
            Fault::SpaceBack | Fault::SpaceThenEio => sim.set_space(Some(sim.used())),
            Fault::Eio => {
                std::thread::sleep(Duration::from_micros(rng.below(2000)));
                sim.set_failing(true);
            }
            Fault::FlushEio | Fault::FlushEnospc | Fault::WriteEio | Fault::WriteEnospc => {
                std::thread::sleep(Duration::from_micros(rng.below(2000)));
                let how = match fault {
                    Fault::FlushEio => Inject::FlushEio,
                    Fault::FlushEnospc => Inject::FlushEnospc,
                    Fault::WriteEio => Inject::WriteEio,
                    _ => Inject::WriteEnospc,
                };
                inject.store(how as u8, SeqCst);
            }
        }
        phase.store(1, SeqCst);
        // Until every worker saw its sync fail (a deadline here once let the next phase's
        // EIO reach workers still on their way to the full disk on a loaded machine).
        wait_ready(2 * n);
        if fault == Fault::SpaceThenEio {
            sim.set_failing(true);
            // A sync now meets the failing disk (the held records are written again).
            let r = store.sync();
            if r != Err(Errno::EIO) {
                sh.fail(format!(
                    "a sync with held records on a failing disk gave {r:?}"
                ));
            }
        }
        phase.store(2, SeqCst);
        sim.set_space(None);
        sim.set_failing(false);
        inject.store(Inject::Nothing as u8, SeqCst);
        phase.store(3, SeqCst);
    });
    let run = started.elapsed();
    drop(dog);
    sim.clear_hook();
    let closed = store.close();
    sh.check_images(false);
    sh.assert_ok(name);
    // EIO is sticky: every sync and write that began after a sync returned EIO fails.
    let outcomes = outcomes.into_inner().unwrap();
    if let Some(first) = outcomes
        .iter()
        .filter(|o| o.sync && o.r == Err(libc::EIO))
        .map(|o| o.end)
        .min()
    {
        for o in &outcomes {
            if o.start > first && o.r != Err(libc::EIO) {
                panic!(
                    "seed {seed}: a {} that began after a sync returned EIO gave {:?}",
                    if o.sync { "sync" } else { "write" },
                    o.r
                );
            }
        }
    }
    let got = recover_now(&sim, &sh, Unflushed::Lost);
    match fault.passes() {
        true => {
            closed.expect("close with room back");
            assert!(
                enospc_syncs.load(SeqCst) > 0,
                "seed {seed}: no sync met the full disk (the test did not reach held records)"
            );
            // No change is lost to ENOSPC: every write the store took is durable.
            assert_all_kept(&sh, &got, "room back, closed");
        }
        false => {
            if fault != Fault::SpaceThenEio {
                assert_eq!(
                    eio_syncs.load(SeqCst),
                    n,
                    "seed {seed}: every worker's sync meets the failing disk"
                );
            } else {
                assert!(
                    enospc_syncs.load(SeqCst) > 0,
                    "seed {seed}: no sync met the full disk"
                );
            }
            assert_eq!(
                closed,
                Err(Errno::EIO),
                "seed {seed}: close of a stopped store"
            );
            // What was acknowledged survives; the rest is a prefix.
            sh.images.lock().unwrap().clear();
            for how in [Unflushed::Lost, Unflushed::Kept, Unflushed::Torn(seed)] {
                sh.crash_check(&sim, how, "after the store stopped");
            }
            sh.check_images(false);
            sh.assert_ok(name);
        }
    }
    eprintln!(
        "group_commit::{name}: {run:?}; ENOSPC syncs {}, writes refused for space {}, syncs to \
         succeed again with room back (attempts, time): {:?}",
        enospc_syncs.load(SeqCst),
        enospc_refused.load(SeqCst),
        slow_back.lock().unwrap()
    );
}

tests! {
    enospc_then_room_again => faults("enospc", Fault::SpaceBack);
    eio_stops_the_store_for_good => faults("eio", Fault::Eio);
    eio_while_records_are_held => faults("enospc_eio", Fault::SpaceThenEio);
    journal_flushes_fail_with_eio => faults("flush_eio", Fault::FlushEio);
    journal_flushes_fail_with_enospc => faults("flush_enospc", Fault::FlushEnospc);
    journal_writes_fail_with_eio => faults("write_eio", Fault::WriteEio);
    journal_writes_fail_with_enospc_then_work => faults("write_enospc", Fault::WriteEnospc);
}

/// The store is closed while records are held for lack of space and threads keep syncing:
/// `close` reports ENOSPC (the held records could not be written even then), every sync
/// returns (ENOSPC while held, an error once closed, never `Ok` for a held record), and what
/// was acknowledged before survives a power cut.
#[test]
fn close_while_records_are_held() {
    let seed = seed::seed("group_commit::close_held");
    let mut rng = Rng::new(seed, 1);
    for it in 0..6u64 {
        let n = 1 + rng.below(6) as usize;
        let sim = SimDisk::new();
        let inject = Arc::new(std::sync::atomic::AtomicU8::new(Inject::Nothing as u8));
        let opts = Options {
            disk: Arc::new(FaultyDisk {
                inner: sim.clone(),
                inject: inject.clone(),
            }),
            ..options(&sim, 64 << 10, FOREVER)
        };
        let sh = Shared::new(n, seed ^ it, opts.clone());
        let closed = AtomicBool::new(false);
        let held = AtomicUsize::new(0);
        let (progress, dog) = watched_progress(
            n,
            format!("close_held iteration {it} (seed {seed})"),
            "syncs per thread",
        );
        let (fs, store) = open(&sim, &opts);
        let mut store = Some(store);
        let simr = &sim;
        let close_result = std::thread::scope(|s| {
            for t in 0..n {
                let (fs, sh, closed, progress, held) = (&fs, &sh, &closed, &progress, &held);
                s.spawn(move || {
                    let mut rng = Rng::new(sh.seed, 100 + t as u64);
                    let mut w = Worker::new(t, fs, None).cut_after_sync(simr, 4);
                    let _ = w.create_main(sh);
                    let mut after = 0;
                    for i in 1.. {
                        let was_closed = closed.load(SeqCst);
                        if rng.chance(2) {
                            let _ = w.write(sh, rng.below(1000) as usize, &data(t, i, 40));
                        } else {
                            let _ = w.truncate(sh, rng.below(1000) as usize);
                        }
                        let how = SyncKind::pick(&mut rng);
                        match w.sync(sh, how) {
                            Ok(()) if was_closed => sh.fail(format!(
                                "thread {t}: a sync ({how:?}) that began after close returned Ok"
                            )),
                            Err(Errno::ENOSPC) => {
                                held.fetch_add(1, SeqCst);
                            }
                            _ => {}
                        }
                        progress[t].store(i, SeqCst);
                        if was_closed {
                            after += 1;
                            if after == 5 {
                                break;
                            }
                        }
                    }
                });
            }
            // Some syncs first, then the journal's writes fail for lack of space; close once
            // a sync met the held records (every round fails from then on, so one does).
            std::thread::sleep(Duration::from_micros(500 + rng.below(3000)));
            inject.store(Inject::WriteEnospc as u8, SeqCst);
            while held.load(SeqCst) == 0 {
                std::thread::sleep(Duration::from_micros(200));
            }
            std::thread::sleep(Duration::from_micros(rng.below(2000)));
            let r = store.take().expect("the store").close();
            closed.store(true, SeqCst);
            r
        });
        drop(dog);
        assert!(
            held.load(SeqCst) > 0,
            "seed {seed}: no sync met the held records"
        );
        assert_eq!(
            close_result,
            Err(Errno::ENOSPC),
            "seed {seed}: close with records held on a full journal"
        );
        for how in [Unflushed::Lost, Unflushed::Kept, Unflushed::Torn(seed ^ it)] {
            sh.crash_check(&sim, how, &format!("after close (iteration {it})"));
        }
        sh.check_images(false);
        sh.assert_ok(&format!("close_held iteration {it}"));
    }
}
