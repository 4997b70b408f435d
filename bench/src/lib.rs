//! # lanefs-bench: the seed workloads (the repository's docs/DESIGN.md, §6 Benchmarks)
//!
//! One harness, one definition per workload, two adapters ([`adapter::Engine`] in-process
//! with a chosen locking mode, [`adapter::Syscalls`] on any mounted path), so the same loop is
//! measured everywhere. Each cell (workload × target × thread count) runs its threads for a
//! warm-up and then a fixed measuring window; it reports operations per second, operations
//! per CPU-second of the worker threads (the stable figure on a shared machine), sampled
//! latency percentiles, and, in-process, the engine's lock statistics.

pub mod adapter;
pub mod report;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::*};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use adapter::{Adapter, Dir, Engine, Paths, Syscalls};
use lanefs::{Errno, Locking};
use serde::Serialize;

/// The workloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// Seed 003: create + close + unlink of the thread's own names in ONE shared directory.
    Crunl,
    /// Seed 003: create a random name, rename it to another random name, unlink, in ONE
    /// shared directory.
    Rndrename,
    /// Seed 000: each thread builds its own tree, then stats every file in it.
    Fstree,
    /// The fstree tree walked as `ls -lR`, `find` and backup scans do: each directory is
    /// listed (open, read to the end, close) and every name listed is then stat'ed.
    Walk,
    /// Seed 001: each thread creates empty files in its own directory, fsync after each.
    Fsmark,
    /// Seed 004: open + read(40 bytes) + close over small files shared by all threads.
    Orc,
}

impl Workload {
    /// Every workload.
    pub const ALL: [Workload; 6] = [
        Workload::Crunl,
        Workload::Rndrename,
        Workload::Fstree,
        Workload::Walk,
        Workload::Fsmark,
        Workload::Orc,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Crunl => "crunl",
            Workload::Rndrename => "rndrename",
            Workload::Fstree => "fstree",
            Workload::Walk => "walk",
            Workload::Fsmark => "fsmark",
            Workload::Orc => "orc",
        }
    }

    /// What one operation is.
    pub fn unit(self) -> &'static str {
        match self {
            Workload::Crunl => "create+close+unlink",
            Workload::Rndrename => "create+rename+unlink",
            Workload::Fstree => "stat",
            Workload::Walk => "stat of a listed name (listings included)",
            Workload::Fsmark => "create+fsync+close",
            Workload::Orc => "open+read+close",
        }
    }
}

impl std::str::FromStr for Workload {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Workload::ALL
            .into_iter()
            .find(|w| w.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown workload '{s}' (expected one of crunl, rndrename, fstree, walk, fsmark, orc)"
                )
            })
    }
}

/// Where a workload runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// In-process, on a fresh engine with this locking mode, through its inode API.
    Engine(Locking),
    /// In-process, on a fresh engine with this locking mode, through its path API
    /// (`Client`, absolute paths).
    Paths(Locking),
    /// In-process, through the inode API, on a fresh disk store under this directory.
    Store(Locking, PathBuf),
    /// System calls under this directory (a lanefs mount, tmpfs, ext4...).
    Path(PathBuf),
    /// No filesystem: each thread inserts and removes its own names in a private hash map.
    /// The machine's own scaling limit at that moment, measured in the same run.
    ShareNothing,
}

impl Target {
    /// Label in tables, JSON and plots.
    pub fn label(&self) -> String {
        match self {
            Target::Engine(l) => l.name().to_string(),
            Target::Paths(l) => format!("{}/paths", l.name()),
            Target::Store(l, _) => format!("{}/disk", l.name()),
            Target::Path(p) => p.display().to_string(),
            Target::ShareNothing => "share-nothing".to_string(),
        }
    }
}

/// Sizes and durations.
#[derive(Clone, Debug)]
pub struct Params {
    /// Measuring window per cell.
    pub seconds: f64,
    /// Warm-up before the window.
    pub warmup: f64,
    /// Empty files created in a separate directory of each in-process filesystem first.
    pub prefill: usize,
    /// fstree: directories per thread.
    pub fstree_dirs: usize,
    /// fstree: files per directory.
    pub fstree_files: usize,
    /// orc: number of shared files.
    pub orc_files: usize,
    /// Fixed work instead of a time window: each thread does exactly this many operations,
    /// and the cell measures the time until the last thread finishes.
    pub iterations: Option<u64>,
    /// fstree: drop caches after building the trees and time one pass over every file (the
    /// seed-000 backup-scan workload). Kernel caches are dropped with
    /// `/proc/sys/vm/drop_caches` (root only); the in-process memory store has no cache.
    pub cold: bool,
    /// On a disk store (`Target::Store`): after the set-up, checkpoint, close and open the
    /// store again (timed, [`Cell::reopened`]), so that the workload runs on the namespace as
    /// a remount or a restarted program reads it from the disk (seed 000's cold scan).
    pub reopen: bool,
    /// With [`Params::reopen`]: the opened store's [`lanefs::Config::inode_cache`] (`None`:
    /// the default bound).
    pub inode_cache: Option<u64>,
}

impl Params {
    /// Defaults that finish in about a minute on two cores.
    pub fn quick() -> Params {
        Params {
            seconds: 1.0,
            warmup: 0.2,
            prefill: 100_000,
            fstree_dirs: 50,
            fstree_files: 200,
            orc_files: 254,
            iterations: None,
            cold: false,
            reopen: false,
            inode_cache: None,
        }
    }

    /// The seeds' own sizes (fstree: 1000 x 1000 per thread).
    pub fn seed() -> Params {
        Params {
            seconds: 5.0,
            warmup: 0.5,
            prefill: 1_000_000,
            fstree_dirs: 1000,
            fstree_files: 1000,
            orc_files: 254,
            iterations: None,
            cold: false,
            reopen: false,
            inode_cache: None,
        }
    }
}

/// One lock class's counters during a cell.
#[derive(Clone, Debug, Serialize)]
pub struct LockRow {
    /// Lock class.
    pub class: &'static str,
    /// Acquisitions.
    pub acquired: u64,
    /// Contended acquisitions.
    pub contended: u64,
    /// Nanoseconds waited.
    pub wait_ns: u64,
}

/// The result of one cell.
#[derive(Clone, Debug, Serialize)]
pub struct Cell {
    /// Workload.
    pub workload: Workload,
    /// What one operation is.
    pub unit: &'static str,
    /// Threads.
    pub threads: usize,
    /// Locking mode, path, or "share-nothing".
    pub target: String,
    /// Operations completed in the window.
    pub ops: u64,
    /// Length of the window.
    pub seconds: f64,
    /// Operations per second.
    pub ops_per_sec: f64,
    /// Operations per CPU-second of the worker threads.
    pub ops_per_cpu_sec: f64,
    /// Median latency of one operation (sampled).
    pub p50_ns: u64,
    /// 99th percentile latency (sampled).
    pub p99_ns: u64,
    /// Lock classes by wait time, in-process only.
    pub locks: Vec<LockRow>,
    /// A cold fstree pass (one stat of every file after building the trees).
    pub cold: bool,
    /// Whether the kernel's caches were dropped before the pass.
    pub caches_dropped: bool,
    /// On a disk store: its journal's flushes and records during the run.
    pub commits: Option<Commits>,
    /// With [`Params::reopen`]: the store's opening before the run.
    pub reopened: Option<Reopen>,
    /// With [`Params::reopen`]: what the reopened store held in memory after the run.
    pub cache_after: Option<CacheAfter>,
}

/// What a reopened (lazily loaded) store held in memory after a run.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct CacheAfter {
    /// Inodes in memory.
    pub inodes: u64,
    /// Directory entries in memory.
    pub entries: u64,
    /// Inodes evicted during the run.
    pub evicted: u64,
    /// Of those, directories.
    pub dirs_evicted: u64,
    /// What the bounded cache counts those as ([`lanefs::Filesystem::inode_cache_bytes`]).
    pub cache_bytes: u64,
    /// The bench process's resident memory.
    pub rss: u64,
}

/// A disk store's opening after the set-up ([`Params::reopen`]).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Reopen {
    /// Seconds the opening took.
    pub seconds: f64,
    /// Inodes it loaded from the checkpoint.
    pub inodes: u64,
    /// Records it replayed from the journal.
    pub replayed: u64,
}

/// A disk store's commits during a cell.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Commits {
    /// Journal flushes.
    pub flushes: u64,
    /// Records written.
    pub records: u64,
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A small fast random generator for names (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Per-thread state of a running workload.
enum Job {
    Crunl {
        dir: Dir,
    },
    Rndrename {
        dir: Dir,
    },
    Fstree {
        dirs: Vec<Dir>,
        files: usize,
    },
    Walk {
        dirs: Vec<Dir>,
        /// The directory being walked (an index into `dirs`), its names, the next to stat.
        at: usize,
        names: Vec<String>,
        next: usize,
    },
    Fsmark {
        dir: Dir,
    },
    Orc {
        dir: Dir,
        files: usize,
        buf: [u8; 40],
    },
    ShareNothing {
        map: std::collections::HashMap<u64, u64>,
    },
}

/// Builds each thread's state (untimed), telling `progress` how far the trees are.
fn prepare(
    w: Workload,
    a: &dyn Adapter,
    threads: usize,
    p: &Params,
    progress: &mut dyn FnMut(Stage),
) -> Result<Vec<Job>, Errno> {
    let base = a.base();
    Ok(match w {
        Workload::Crunl | Workload::Rndrename => {
            let dir = a.mkdir(base, "shared")?;
            (0..threads)
                .map(|_| {
                    if w == Workload::Crunl {
                        Job::Crunl { dir }
                    } else {
                        Job::Rndrename { dir }
                    }
                })
                .collect()
        }
        Workload::Fstree | Workload::Walk => (0..threads)
            .map(|t| {
                progress(Stage::Trees { done: t, threads });
                let top = a.mkdir(base, &format!("tree{t}"))?;
                let mut dirs = Vec::with_capacity(p.fstree_dirs);
                for d in 0..p.fstree_dirs {
                    let dir = a.mkdir(top, &format!("d{d}"))?;
                    for f in 0..p.fstree_files {
                        a.create(dir, &format!("f{f}"))?;
                    }
                    dirs.push(dir);
                }
                Ok(if w == Workload::Walk {
                    Job::Walk {
                        at: dirs.len() - 1,
                        dirs,
                        names: Vec::new(),
                        next: 0,
                    }
                } else {
                    Job::Fstree {
                        dirs,
                        files: p.fstree_files,
                    }
                })
            })
            .collect::<Result<_, Errno>>()?,
        Workload::Fsmark => (0..threads)
            .map(|t| {
                Ok(Job::Fsmark {
                    dir: a.mkdir(base, &format!("mark{t}"))?,
                })
            })
            .collect::<Result<_, Errno>>()?,
        Workload::Orc => {
            let dir = a.mkdir(base, "gids")?;
            for i in 0..p.orc_files {
                a.create_with(
                    dir,
                    &format!("{i}"),
                    format!("fe80:0000:0000:0000:0000:0000:{i:04x}:{i:04x}").as_bytes(),
                )?;
            }
            (0..threads)
                .map(|_| Job::Orc {
                    dir,
                    files: p.orc_files,
                    buf: [0; 40],
                })
                .collect()
        }
    })
}

/// One operation of a job; `i` counts this thread's operations.
fn step(
    job: &mut Job,
    a: Option<&dyn Adapter>,
    tid: usize,
    i: u64,
    rng: &mut Rng,
    name: &mut String,
) -> Result<(), Errno> {
    use std::fmt::Write;
    name.clear();
    match job {
        Job::Crunl { dir } => {
            let _ = write!(name, "c{tid}-{}", i % 64);
            let a = a.expect("adapter");
            a.create(*dir, name)?;
            a.unlink(*dir, name)
        }
        Job::Rndrename { dir } => {
            let a = a.expect("adapter");
            let _ = write!(name, "r{tid}-{:x}", rng.next() % 100_000);
            let to = format!("r{tid}-{:x}", rng.next() % 100_000);
            a.create(*dir, name)?;
            match a.rename(*dir, name, &to) {
                Ok(()) => a.unlink(*dir, &to),
                Err(e) => Err(e),
            }
        }
        Job::Fstree { dirs, files } => {
            let n = i as usize;
            let _ = write!(name, "f{}", n % *files);
            a.expect("adapter")
                .stat(dirs[(n / *files) % dirs.len()], name)
        }
        Job::Walk {
            dirs,
            at,
            names,
            next,
        } => {
            let a = a.expect("adapter");
            while *next == names.len() {
                *at = (*at + 1) % dirs.len();
                a.list(dirs[*at], names)?;
                *next = 0;
            }
            *next += 1;
            a.stat(dirs[*at], &names[*next - 1])
        }
        Job::Fsmark { dir } => {
            let _ = write!(name, "m{i:010}");
            a.expect("adapter").create_fsync(*dir, name)
        }
        Job::Orc { dir, files, buf } => {
            let _ = write!(name, "{}", (tid as u64 + i) % *files as u64);
            a.expect("adapter").open_read(*dir, name, buf).map(drop)
        }
        Job::ShareNothing { map } => {
            let k = ((tid as u64) << 32) | (i % 64);
            map.insert(k, i);
            map.remove(&k);
            Ok(())
        }
    }
}

const WARM: u8 = 0;
const MEASURE: u8 = 1;
const STOP: u8 = 2;

/// Where a running cell is, for a progress line ([`run_cell_reporting`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Stage {
    /// Creating this many empty files in the in-process filesystem first.
    Prefill(usize),
    /// fstree, walk: building the threads' trees, `done` of `threads` built.
    Trees {
        /// Trees built.
        done: usize,
        /// Trees to build.
        threads: usize,
    },
    /// Building the threads' other state.
    SetUp,
    /// Checkpointing, closing and opening the disk store again ([`Params::reopen`]).
    Reopen,
    /// Running before the window (for this many seconds).
    WarmUp(f64),
    /// In the measuring window: `elapsed` of `window` seconds.
    Window {
        /// Seconds measured so far.
        elapsed: f64,
        /// The window's length.
        window: f64,
    },
    /// Fixed work: `done` of `total` operations (all threads together).
    Work {
        /// Operations done.
        done: u64,
        /// Operations to do.
        total: u64,
    },
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Stage::Prefill(n) => write!(f, "prefilling {n} files"),
            Stage::Trees { done, threads } => {
                write!(f, "building trees, {done}/{threads} done")
            }
            Stage::SetUp => write!(f, "setting up"),
            Stage::Reopen => write!(f, "closing and opening the store again"),
            Stage::WarmUp(s) => write!(f, "warming up ({s:.1} s)"),
            Stage::Window { elapsed, window } => {
                write!(f, "measuring, {elapsed:.1}/{window:.1} s")
            }
            Stage::Work { done, total } => write!(
                f,
                "measuring, {done}/{total} operations ({:.0}%)",
                done as f64 * 100.0 / total.max(1) as f64
            ),
        }
    }
}

/// How often a running cell tells where it is.
const REPORT_EVERY: Duration = Duration::from_millis(250);

/// A worker's count of operations, on a cache line of its own.
#[repr(align(128))]
#[derive(Default)]
struct Done(AtomicU64);

/// Counts a worker out when it ends, however it ends, and wakes the thread waiting for them.
struct Finished(Arc<std::sync::atomic::AtomicUsize>, std::thread::Thread);

impl Drop for Finished {
    fn drop(&mut self) {
        self.0.fetch_add(1, Release);
        self.1.unpark();
    }
}

/// Runs one cell.
pub fn run_cell(w: Workload, target: &Target, threads: usize, p: &Params) -> Result<Cell, String> {
    run_cell_reporting(w, target, threads, p, &mut |_| {})
}

/// Runs one cell, telling `progress` where it is: at each stage, and about every 250 ms
/// while it measures.
pub fn run_cell_reporting(
    w: Workload,
    target: &Target,
    threads: usize,
    p: &Params,
    progress: &mut dyn FnMut(Stage),
) -> Result<Cell, String> {
    if p.prefill > 0
        && matches!(w, Workload::Crunl | Workload::Rndrename)
        && matches!(
            target,
            Target::Engine(_) | Target::Store(..) | Target::Paths(_)
        )
    {
        progress(Stage::Prefill(p.prefill));
    }
    // The disk store's adapter by its type too, to open it again after the set-up.
    let mut on_store: Option<Arc<Engine>> = None;
    let mut adapter: Option<Arc<dyn Adapter>> = match target {
        Target::Engine(l) => Some(Arc::new(Engine::new(
            *l,
            if matches!(w, Workload::Crunl | Workload::Rndrename) {
                p.prefill
            } else {
                0
            },
        ))),
        Target::Store(l, dir) => {
            let e = Arc::new(Engine::with_store(
                *l,
                if matches!(w, Workload::Crunl | Workload::Rndrename) {
                    p.prefill
                } else {
                    0
                },
                Some(dir),
            )?);
            on_store = Some(e.clone());
            Some(e)
        }
        Target::Paths(l) => Some(Arc::new(Paths::new(
            *l,
            if matches!(w, Workload::Crunl | Workload::Rndrename) {
                p.prefill
            } else {
                0
            },
        ))),
        Target::Path(path) => {
            Some(Arc::new(Syscalls::new(path, w.name()).map_err(|e| {
                format!("cannot work under {}: {e}", path.display())
            })?))
        }
        Target::ShareNothing => None,
    };
    progress(Stage::SetUp);
    let jobs = match &adapter {
        Some(a) => prepare(w, a.as_ref(), threads, p, progress)
            .map_err(|e| format!("{} set-up on {}: {e}", w.name(), target.label()))?,
        None => (0..threads)
            .map(|_| Job::ShareNothing {
                map: Default::default(),
            })
            .collect(),
    };
    let mut reopened = None;
    let mut reopened_fs: Option<Arc<lanefs::Filesystem>> = None;
    if let Some(e) = on_store.take().filter(|_| p.reopen) {
        progress(Stage::Reopen);
        // The workload's own handle goes first: the store is closed only when unshared.
        drop(adapter.take());
        let e =
            Arc::try_unwrap(e).map_err(|_| "the store's adapter is still in use".to_string())?;
        let (e, r) = e
            .reopen(p.inode_cache)
            .map_err(|e| format!("opening the store again: {e}"))?;
        reopened_fs = Some(e.fs.clone());
        reopened = Some(Reopen {
            seconds: r.secs,
            inodes: r.inodes,
            replayed: r.replayed,
        });
        adapter = Some(Arc::new(e));
    }
    drop(on_store);
    // Fixed work: an explicit count, or one pass over every file for a cold fstree.
    let fixed = match (w, p.cold) {
        (Workload::Fstree, true) => Some((p.fstree_dirs * p.fstree_files) as u64),
        _ => p.iterations,
    };
    let mut dropped = false;
    if fixed.is_some() && p.cold && matches!(target, Target::Path(_)) {
        dropped = drop_caches();
    }
    let phase = Arc::new(AtomicU8::new(if fixed.is_some() { MEASURE } else { WARM }));
    let barrier = Arc::new(Barrier::new(threads + 1));
    // Each worker's operations in the window so far, for the progress of fixed work.
    let done: Arc<Vec<Done>> = Arc::new((0..threads).map(|_| Done::default()).collect());
    let finished = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let before = adapter.as_ref().and_then(|a| a.engine().map(|e| e.stats()));
    let handles: Vec<_> = jobs
        .into_iter()
        .enumerate()
        .map(|(tid, mut job)| {
            let (phase, barrier, adapter) = (phase.clone(), barrier.clone(), adapter.clone());
            let done = done.clone();
            let finished = Finished(finished.clone(), std::thread::current());
            std::thread::spawn(
                move || -> Result<(u64, u64, Vec<u32>, Instant, Instant), Errno> {
                    let _finished = finished;
                    let mut rng =
                        Rng(0x9E37_79B9_7F4A_7C15 ^ ((tid as u64 + 1) * 0x1234_5678_9ABC));
                    let mut name = String::with_capacity(32);
                    let a = adapter.as_deref();
                    let mut lat = Vec::with_capacity(1 << 16);
                    barrier.wait();
                    let mut i = 0u64;
                    while phase.load(Relaxed) == WARM {
                        step(&mut job, a, tid, i, &mut rng, &mut name)?;
                        i += 1;
                    }
                    let (start_ops, start_cpu, started) = (i, thread_cpu_ns(), Instant::now());
                    let end = fixed.unwrap_or(u64::MAX);
                    while i < end && phase.load(Relaxed) == MEASURE {
                        if i % 4096 == 0 {
                            done[tid].0.store(i - start_ops, Relaxed);
                        }
                        if i % 8 == 0 {
                            let t = Instant::now();
                            step(&mut job, a, tid, i, &mut rng, &mut name)?;
                            lat.push(t.elapsed().as_nanos().min(u32::MAX as u128) as u32);
                        } else {
                            step(&mut job, a, tid, i, &mut rng, &mut name)?;
                        }
                        i += 1;
                    }
                    done[tid].0.store(i - start_ops, Relaxed);
                    Ok((
                        i - start_ops,
                        thread_cpu_ns() - start_cpu,
                        lat,
                        started,
                        Instant::now(),
                    ))
                },
            )
        })
        .collect();
    barrier.wait();
    let commits = || adapter.as_ref().and_then(|a| a.store_counters());
    let (snap, t0, commits0) = if let Some(per_thread) = fixed {
        let t0 = Instant::now();
        let total = per_thread.saturating_mul(threads as u64);
        loop {
            // Read first: once every worker has finished, each one's count (stored before
            // its end was counted, with Release) is its last, and the line says all of it.
            let all = finished.load(Acquire) == threads;
            progress(Stage::Work {
                done: done.iter().map(|d| d.0.load(Relaxed)).sum(),
                total,
            });
            if all {
                break;
            }
            // Woken early when the work ends, so a short cell is not made longer.
            std::thread::park_timeout(REPORT_EVERY);
        }
        (before, t0, commits())
    } else {
        progress(Stage::WarmUp(p.warmup));
        std::thread::sleep(Duration::from_secs_f64(p.warmup));
        let commits0 = commits();
        let snap = adapter
            .as_ref()
            .and_then(|a| a.engine().map(|e| e.stats()))
            .or(before);
        phase.store(MEASURE, Relaxed);
        let t0 = Instant::now();
        let window = Duration::from_secs_f64(p.seconds);
        loop {
            let elapsed = t0.elapsed();
            progress(Stage::Window {
                // The window is what is measured, however late this thread wakes.
                elapsed: elapsed.min(window).as_secs_f64(),
                window: p.seconds,
            });
            if elapsed >= window {
                break;
            }
            std::thread::sleep(REPORT_EVERY.min(window - elapsed));
        }
        phase.store(STOP, Relaxed);
        (snap, t0, commits0)
    };
    let (mut ops, mut cpu, mut lat) = (0u64, 0u64, Vec::new());
    let (mut first_start, mut last_end) = (None::<Instant>, None::<Instant>);
    for h in handles {
        let (o, c, l, started, ended) = h
            .join()
            .map_err(|_| "a benchmark thread panicked".to_string())?
            .map_err(|e| format!("{} on {}: {e}", w.name(), target.label()))?;
        ops += o;
        cpu += c;
        lat.extend(l);
        first_start = Some(first_start.map_or(started, |f| f.min(started)));
        last_end = Some(last_end.map_or(ended, |e| e.max(ended)));
    }
    // Fixed work is timed from the first worker's start to the last one's end (the main
    // thread may be scheduled late on a small machine); a window from its own clock.
    let secs = match (fixed, first_start, last_end) {
        (Some(_), Some(a), Some(b)) => (b - a).as_secs_f64(),
        _ => t0.elapsed().as_secs_f64(),
    };
    lat.sort_unstable();
    let pct = |q: f64| {
        lat.get(((lat.len() as f64 * q) as usize).min(lat.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0) as u64
    };
    let locks = match (
        adapter.as_ref().and_then(|a| a.engine().map(|e| e.stats())),
        snap,
    ) {
        (Some(now), Some(then)) => now
            .since(&then)
            .hottest_locks()
            .into_iter()
            .take(4)
            .map(|(c, l)| LockRow {
                class: c.name(),
                acquired: l.acquired,
                contended: l.contended,
                wait_ns: l.wait_ns,
            })
            .collect(),
        _ => Vec::new(),
    };
    Ok(Cell {
        cold: p.cold && w == Workload::Fstree,
        caches_dropped: dropped,
        workload: w,
        unit: w.unit(),
        threads,
        target: target.label(),
        ops,
        seconds: secs,
        ops_per_sec: ops as f64 / secs,
        ops_per_cpu_sec: if cpu > 0 {
            ops as f64 / (cpu as f64 / 1e9)
        } else {
            0.0
        },
        p50_ns: pct(0.5),
        p99_ns: pct(0.99),
        locks,
        commits: match (commits0, commits()) {
            (Some(a), Some(b)) => Some(Commits {
                flushes: b.flushes - a.flushes,
                records: b.lsn - a.lsn,
            }),
            _ => None,
        },
        reopened,
        cache_after: reopened_fs.map(|fs| CacheAfter {
            inodes: fs.inodes_in_memory(),
            entries: fs.entries_in_memory(),
            evicted: fs.inodes_evicted(),
            dirs_evicted: fs.directories_evicted(),
            cache_bytes: fs.inode_cache_bytes(),
            rss: rss_bytes(),
        }),
    })
}

/// Writes back and drops the kernel's page, dentry and inode caches (needs root).
fn drop_caches() -> bool {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", b"3").is_ok()
}

/// Resident memory of this process, in bytes.
pub fn rss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = s
        .split_whitespace()
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

/// Creates `files` empty files with 16-byte names, 1000 per directory (the memory workload).
pub fn create_empty_files(e: &Engine, files: usize) {
    let mut dir = e.base();
    for i in 0..files {
        if i % 1000 == 0 {
            dir = e
                .mkdir(e.base(), &format!("dir{:012}", i / 1000))
                .expect("mkdir");
        }
        e.create(dir, &format!("file{i:012}")).expect("create");
    }
}

/// Memory per empty file (inode + entry, 16-byte names) at `files` files, 1000 per directory,
/// measured as the growth of resident memory.
pub fn memory_per_file(files: usize) -> f64 {
    let e = Engine::new(Locking::Lanes, 0);
    let before = rss_bytes();
    create_empty_files(&e, files);
    let grown = rss_bytes().saturating_sub(before);
    assert_eq!(
        e.fs.statfs().files - e.fs.statfs().ffree,
        files as u64 + files.div_ceil(1000) as u64 + 1
    );
    grown as f64 / files as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_workload_runs_in_process_and_on_a_path() {
        let p = Params {
            seconds: 0.05,
            warmup: 0.01,
            prefill: 100,
            fstree_dirs: 2,
            fstree_files: 5,
            orc_files: 4,
            iterations: None,
            cold: false,
            reopen: false,
            inode_cache: None,
        };
        // A tmpfs path: on a disk, fsmark's fsyncs can take longer than the 50 ms window
        // when the machine is busy, and the cell would measure nothing.
        let shm = std::path::Path::new("/dev/shm");
        let tmp = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        for w in Workload::ALL {
            for target in [
                Target::Engine(Locking::Lanes),
                Target::Engine(Locking::Coarse),
                Target::Path(tmp.clone()),
            ] {
                let c = run_cell(w, &target, 2, &p).unwrap();
                assert!(c.ops > 0, "{} on {} did nothing", w.name(), target.label());
                assert!(c.ops_per_cpu_sec > 0.0 && c.p99_ns >= c.p50_ns);
                if let Target::Engine(_) = target {
                    assert!(
                        !c.locks.is_empty() || w == Workload::Fstree,
                        "{}: lock stats",
                        w.name()
                    );
                }
            }
        }
        assert!(
            run_cell(Workload::Crunl, &Target::ShareNothing, 1, &p)
                .unwrap()
                .ops
                > 0
        );
    }

    #[test]
    fn fixed_work_and_cold_passes_do_exactly_the_work() {
        let p = Params {
            iterations: Some(300),
            prefill: 10,
            ..Params::quick()
        };
        let c = run_cell(Workload::Crunl, &Target::Engine(Locking::Lanes), 3, &p).unwrap();
        assert_eq!(c.ops, 900);
        let cold = Params {
            cold: true,
            fstree_dirs: 3,
            fstree_files: 7,
            ..Params::quick()
        };
        let c = run_cell(Workload::Fstree, &Target::Engine(Locking::Lanes), 2, &cold).unwrap();
        assert_eq!(c.ops, 2 * 21, "one pass over each thread's tree");
        assert!(c.cold && !c.caches_dropped, "nothing to drop in-process");
    }

    /// A disk store opened again after the set-up: the pass stats every file of the trees,
    /// which the opening left in the checkpoint (it read the root and its files, replayed
    /// nothing), as it reaches them.
    #[test]
    fn a_reopened_store_is_scanned_as_it_was_read() {
        let tmp = tempfile::tempdir().unwrap();
        let p = Params {
            cold: true,
            reopen: true,
            fstree_dirs: 3,
            fstree_files: 7,
            ..Params::quick()
        };
        let target = Target::Store(Locking::Lanes, tmp.path().into());
        let c = run_cell(Workload::Fstree, &target, 2, &p).unwrap();
        assert_eq!(c.ops, 2 * 21, "one pass over each thread's tree");
        let r = c.reopened.expect("reopened");
        // The root alone (the trees are in directories below it).
        assert_eq!(r.inodes, 1, "{r:?}");
        assert_eq!(r.replayed, 0, "{r:?}");
        // Without --reopen, or not on a store: none.
        let c = run_cell(Workload::Fstree, &Target::Engine(Locking::Lanes), 1, &p).unwrap();
        assert!(c.reopened.is_none());
        assert_eq!(
            std::fs::read_dir(tmp.path()).unwrap().count(),
            0,
            "the store's directory is removed"
        );
    }

    #[test]
    fn bad_path_is_a_clear_error() {
        let p = Params::quick();
        let e = run_cell(
            Workload::Crunl,
            &Target::Path("/nonexistent/x".into()),
            1,
            &p,
        )
        .unwrap_err();
        assert!(e.contains("/nonexistent/x"), "{e}");
    }
}
