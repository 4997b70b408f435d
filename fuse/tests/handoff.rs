//! The io_uring session's handoff and its guard (`fuse/src/handoff.rs`), and the FORGET
//! batching of the io_uring session's `/dev/fuse` thread.
//!
//! The io_uring queue threads run SCHED_IDLE so that a caller woken by its reply stays on
//! its queue's CPU; a busy thread of the same task group on that CPU would starve them, and
//! the guard must then give them the normal policy:
//! 1. starvation: busy threads of the server's process (on every CPU, pinned beside one
//!    queue while another queue is kept busy, coming and going, started before the mount)
//!    never starve a queue thread for long, and the namespace stays right beside them;
//! 2. lifecycle: mounts and unmounts, aborts and lazy unmounts with the guard asleep,
//!    watching or boosting leave no thread of the session behind;
//! 3. FORGET batching: unlinked inodes (open, O_TMPFILE, hard-linked) are freed promptly
//!    once the kernel lets go of them, and requests interrupted while forgets flow all end.
//!
//! Every test runs on an io_uring session only (it says so and passes elsewhere: the mounts
//! take their transport from `LANEFS_URING`, so `scripts/test.sh` runs these in its io_uring
//! pass), one at a time (busy threads must not disturb another test's timings), with a
//! watchdog around each step that could hang. Root, /dev/fuse and `fuse.enable_uring` needed.
//! The tests after the first were written (as `guardattack.rs`) from the public API and the
//! documented behaviour only.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use lanefs::{Config, Filesystem};
use lanefs_fuse::{Mount, MountConfig, Uring, mount_background};

// ----- helpers --------------------------------------------------------------------------

/// One test at a time: busy threads would disturb the others' timings.
fn serial() -> MutexGuard<'static, ()> {
    static S: Mutex<()> = Mutex::new(());
    S.lock().unwrap_or_else(|e| e.into_inner())
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

struct Mnt {
    _dir: tempfile::TempDir,
    path: PathBuf,
    fs: Arc<Filesystem>,
    m: Option<Mount>,
}

impl Mnt {
    fn new(uring: Uring) -> Mnt {
        Mnt::with_fs(uring, Arc::new(Filesystem::new(Config::default())))
    }

    fn with_fs(uring: Uring, fs: Arc<Filesystem>) -> Mnt {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mnt");
        fs::create_dir(&path).unwrap();
        let cfg = MountConfig {
            uring,
            ..MountConfig::default()
        };
        let m = mount_background(fs.clone(), &path, &cfg).expect("mount");
        Mnt {
            _dir: dir,
            path,
            fs,
            m: Some(m),
        }
    }

    fn mount(&self) -> &Mount {
        self.m.as_ref().unwrap()
    }

    /// Whether the session is io_uring with SCHED_IDLE queue threads; says why not.
    fn guarded(&self, test: &str) -> bool {
        let i = self.mount().info();
        if !i.is_uring() {
            eprintln!(
                "{test}: skipped: the mount is served through {}",
                i.transport()
            );
            return false;
        }
        if !i.sched_idle() {
            eprintln!("{test}: skipped: the queue threads are not SCHED_IDLE here");
            return false;
        }
        true
    }

    fn is_uring(&self, test: &str) -> bool {
        let i = self.mount().info();
        if !i.is_uring() {
            eprintln!(
                "{test}: skipped: the mount is served through {}",
                i.transport()
            );
        }
        i.is_uring()
    }

    /// Unmounts within `secs` seconds, or panics.
    fn unmount(mut self, secs: u64) {
        let mut m = self.m.take().unwrap();
        deadline(secs, "unmount", move || {
            let start = Instant::now();
            loop {
                match m.unmount() {
                    Ok(()) => break,
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                        assert!(start.elapsed() < Duration::from_secs(5), "EBUSY for 5 s");
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(e) => panic!("unmount: {e}"),
                }
            }
        });
    }

    fn free_inodes(&self) -> u64 {
        self.fs.statfs().ffree
    }
}

/// Runs `f` on its own thread and panics if it has not returned within `secs` seconds (the
/// thread is left behind: a hung request cannot be cancelled).
fn deadline<T: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        let r = f();
        let _ = tx.send(());
        r
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) => h.join().unwrap(),
        Err(mpsc::RecvTimeoutError::Disconnected) => match h.join() {
            Ok(r) => r,
            Err(p) => std::panic::resume_unwind(p),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("watchdog: {what} did not finish within {secs} s")
        }
    }
}

fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes one bit of it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set),
            0
        );
    }
}

/// The threads of this process that serve a session: `lanefs-session`, `lanefs-dev*`,
/// `lanefs-q*`, `lanefs-guard` and `lanefs-listings` (which ends with its server).
fn threads_now() -> usize {
    lanefs_threads().len()
}

fn lanefs_threads() -> Vec<String> {
    fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|e| fs::read_to_string(e.ok()?.path().join("comm")).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| s.starts_with("lanefs-") && s != "lanefs-probe")
        .collect()
}

/// The scheduling policy of each thread of this process whose name starts with `prefix`.
fn policies(prefix: &str) -> Vec<(String, i32)> {
    fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let comm = fs::read_to_string(e.path().join("comm")).ok()?;
            let tid: i32 = e.file_name().to_str()?.parse().ok()?;
            // SAFETY: no preconditions.
            let p = unsafe { libc::sched_getscheduler(tid) };
            Some((comm.trim().to_string(), p))
        })
        .filter(|(c, _)| c.starts_with(prefix))
        .collect()
}

#[derive(Clone, Copy, Debug)]
enum HogKind {
    Normal,
    Nice(i32),
    Batch,
}

/// Busy threads of this process (the server's own task group).
struct Hogs {
    stop: Arc<AtomicBool>,
    hs: Vec<JoinHandle<()>>,
}

impl Hogs {
    fn start(n: usize, cpu: Option<usize>, kind: HogKind) -> Hogs {
        let stop = Arc::new(AtomicBool::new(false));
        let mut hs = Vec::new();
        for i in 0..n {
            let stop = stop.clone();
            let cpu = cpu.map(|c| c % cpus());
            hs.push(std::thread::spawn(move || {
                if let Some(c) = cpu {
                    pin(c);
                }
                match kind {
                    HogKind::Normal => {}
                    // SAFETY: setpriority on this thread (Linux: a thread id).
                    HogKind::Nice(n) => unsafe {
                        libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as u32, n);
                    },
                    // SAFETY: a valid sched_param.
                    HogKind::Batch => unsafe {
                        let p = libc::sched_param { sched_priority: 0 };
                        libc::sched_setscheduler(0, libc::SCHED_BATCH, &p);
                    },
                }
                let mut x = i as u64;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..10_000 {
                        x = std::hint::black_box(
                            x.wrapping_mul(6364136223846793005).wrapping_add(1),
                        );
                    }
                }
            }));
        }
        Hogs { stop, hs }
    }

    fn stop(self) {}
}

impl Drop for Hogs {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for h in self.hs.drain(..) {
            let _ = h.join();
        }
    }
}

/// Latencies of one thread's requests.
#[derive(Default, Debug, Clone)]
struct Lat {
    n: u64,
    max: Duration,
    over_100ms: u64,
}

impl Lat {
    fn time<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let r = f();
        let d = t.elapsed();
        self.n += 1;
        self.max = self.max.max(d);
        if d > Duration::from_millis(100) {
            self.over_100ms += 1;
        }
        r
    }
}

/// Creates and unlinks files named `tag-N` in `dir` until `stop`, each request timed.
fn churn(dir: &Path, tag: &str, stop: &AtomicBool, limit: Option<u64>) -> Lat {
    let mut lat = Lat::default();
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) && limit.is_none_or(|l| i < l) {
        let p = dir.join(format!("{tag}-{i}"));
        lat.time(|| File::create(&p).unwrap());
        lat.time(|| fs::remove_file(&p).unwrap());
        i += 1;
    }
    lat
}

/// The thread id of this process's thread named `comm`.
fn tid_of(comm: &str) -> Option<u32> {
    fs::read_dir("/proc/self/task").ok()?.find_map(|e| {
        let e = e.ok()?;
        let c = fs::read_to_string(e.path().join("comm")).ok()?;
        (c.trim() == comm).then(|| e.file_name().to_str()?.parse().ok())?
    })
}

/// Watches thread `tid` every 2 ms until `stop`: the longest time it was runnable (state R)
/// while its `schedstat` (run time, wait time: what the guard reads) did not change, that
/// is while it waited for a CPU without the guard being able to see it.
fn unseen_wait(tid: u32, stop: &AtomicBool) -> Duration {
    let (mut longest, mut since) = (Duration::ZERO, None::<(Instant, String)>);
    while !stop.load(Ordering::Relaxed) {
        let st = fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap_or_default();
        let ss = fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).unwrap_or_default();
        let state = st
            .rsplit_once(')')
            .map_or(' ', |(_, r)| r.trim_start().chars().next().unwrap_or(' '));
        let ss: String = ss.split_whitespace().take(2).collect::<Vec<_>>().join(" ");
        match (&since, state == 'R') {
            (Some((t, old)), true) if *old == ss => longest = longest.max(t.elapsed()),
            (_, true) => since = Some((Instant::now(), ss)),
            (_, false) => since = None,
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    longest
}

fn boosts(m: &Mnt) -> u64 {
    m.mount().info().boosts()
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Pins this thread to `cpu` where it can (a CPU outside this process's set stays unpinned).
fn try_pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes one bit of it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
    }
}

fn policy() -> libc::c_int {
    // SAFETY: sched_getscheduler has no memory preconditions.
    unsafe { libc::sched_getscheduler(0) }
}

/// Creates and unlinks `n` files in `dir` (16 names over and over); panics past `limit`.
fn churn_within(dir: &Path, n: usize, limit: Duration) -> Duration {
    let dir = dir.to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let t = Instant::now();
        for i in 0..n {
            let p = dir.join(format!("f{}", i % 16));
            std::fs::File::create(&p).expect("create");
            std::fs::remove_file(&p).expect("unlink");
        }
        let _ = tx.send(t.elapsed());
    });
    rx.recv_timeout(limit).unwrap_or_else(|_| {
        panic!("{n} creates and unlinks not done within {limit:?}: the queue threads starve")
    })
}

// ----- 1. starvation ---------------------------------------------------------------------

/// A busy normal thread on every CPU, in the server's own process: the guard boosts the
/// starving queue threads and the requests go on.
#[test]
fn a_busy_loop_in_the_servers_process_does_not_starve_its_queue_threads() {
    let _s = serial();
    if !is_root() {
        eprintln!("skipped: mounting needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let fs = Arc::new(lanefs::Filesystem::new(Config::default()));
    let m = lanefs_fuse::mount_background(fs, dir.path(), &MountConfig::default())
        .unwrap_or_else(|e| panic!("mount: {e}"));
    if !m.info().is_uring() {
        eprintln!("skipped: served through {}", m.info().transport());
        return;
    }
    if !m.info().sched_idle() {
        eprintln!("skipped: the queue threads keep the normal policy on this machine");
        return;
    }
    // Unloaded first: the guard wakes, and the requests are served. (No boost is expected
    // here on an idle machine; other processes' load may cause some, and a queue thread
    // boosted then may still hold its boost through the busy loop below, which then needs
    // none of its own.)
    churn_within(dir.path(), 200, Duration::from_secs(30));

    // A busy normal thread on every CPU, in this process, which holds the queue threads:
    // without the guard a SCHED_IDLE queue thread gets almost no CPU beside it.
    let stop = Arc::new(AtomicBool::new(false));
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let busy: Vec<_> = (0..cpus)
        .map(|cpu| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                try_pin(cpu);
                assert_eq!(policy(), libc::SCHED_OTHER);
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let took = churn_within(dir.path(), 2000, Duration::from_secs(90));
    stop.store(true, Ordering::Relaxed);
    for b in busy {
        b.join().unwrap();
    }
    eprintln!(
        "2000 creates and unlinks beside {cpus} busy threads: {took:?}, {} boosts",
        m.info().boosts()
    );
    // Only the guard boosts: without it there is none, and the loop starves (below).
    assert!(
        m.info().boosts() > 0,
        "the guard never gave a starving queue thread the normal policy"
    );
    // Starving, they took about 20 s here (a guard that never acts); guarded, 0.2 s.
    assert!(took < Duration::from_secs(10), "{took:?}: starved for long");
    let mut m = m;
    m.unmount().expect("unmount");
}

/// Busy threads of the server's process on CPU 0 and a caller on CPU 0, while a caller on
/// CPU 1 keeps queue 1 busy (so the guard never sees the queues quiet). The module doc of
/// `handoff.rs` says a queue thread waits at most about one period (10 ms) before it is made
/// normal; this allows a second for any one request.
fn pinned_starvation(baseline: bool, hogs: usize, secs: u64) -> Option<(Lat, Lat, u64, Duration)> {
    // The baseline: /dev/fuse, whose request threads are normal and not pinned.
    let m = Mnt::new(if baseline {
        Uring::Off
    } else {
        Uring::from_env()
    });
    if !baseline && !m.guarded("pinned_starvation") {
        m.unmount(10);
        return None;
    }
    let d0 = m.path.join("q0");
    let d1 = m.path.join("q1");
    fs::create_dir(&d0).unwrap();
    fs::create_dir(&d1).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let keeper = {
        let (d1, stop) = (d1.clone(), stop.clone());
        std::thread::spawn(move || {
            pin(1);
            churn(&d1, "k", &stop, None)
        })
    };
    let h = Hogs::start(hogs, Some(0), HogKind::Normal);
    let sampler = tid_of("lanefs-q0").map(|tid| {
        let stop = stop.clone();
        std::thread::spawn(move || unseen_wait(tid, &stop))
    });
    let probe = {
        let (d0, stop) = (d0.clone(), stop.clone());
        std::thread::spawn(move || {
            pin(0);
            churn(&d0, "p", &stop, None)
        })
    };
    // The probe must make progress: a watchdog on the whole run.
    let watchdog_stop = stop.clone();
    let r = deadline(secs + 30, "the pinned starvation run", move || {
        std::thread::sleep(Duration::from_secs(secs));
        watchdog_stop.store(true, Ordering::Relaxed);
        (probe.join().unwrap(), keeper.join().unwrap())
    });
    h.stop();
    let unseen = sampler.map_or(Duration::ZERO, |s| s.join().unwrap());
    let b = boosts(&m);
    m.unmount(10);
    Some((r.0, r.1, b, unseen))
}

#[test]
fn starving_queue_thread_is_boosted_while_another_queue_is_busy() {
    let _s = serial();
    if cpus() < 2 {
        eprintln!("skipped: needs 2 CPUs");
        return;
    }
    let Some((probe, keeper, b, unseen)) = pinned_starvation(false, 4, 6) else {
        return;
    };
    eprintln!(
        "io_uring: probe on CPU 0 {probe:?}; keeper on CPU 1 {keeper:?}; boosts {b}; \
         lanefs-q0 runnable with its schedstat unchanged for up to {unseen:?}"
    );
    let (probe_off, _) = pinned_starvation(true, 4, 3)
        .map(|(p, k, _, _)| (p, k))
        .unwrap();
    eprintln!("uring=off: probe on CPU 0 {probe_off:?}");
    // The module doc promises about one period (10 ms) of waiting; a quarter of a second
    // (or four times the worst of uring=off, on a machine loaded by others) leaves room for
    // the probe's own share of CPU 0 (uring=off: about 20 ms here).
    let bound = Duration::from_millis(250).max(probe_off.max * 4);
    assert!(
        probe.max < bound,
        "a request from CPU 0 waited {:?} (with uring=off: at most {:?}): queue 0's \
         SCHED_IDLE thread starved while the guard watched it, runnable with its schedstat \
         unchanged for up to {unseen:?} ({} requests over 100 ms, {b} boosts)",
        probe.max,
        probe_off.max,
        probe.over_100ms
    );
}

/// Busy threads started and stopped over and over, pinned to one CPU or not, so the guard
/// sleeps, wakes, boosts and unboosts; every request of the callers (on every CPU) must
/// finish within the watchdog's bound.
#[test]
fn hogs_come_and_go() {
    let _s = serial();
    let m = Mnt::new(Uring::from_env());
    if !m.guarded("hogs_come_and_go") {
        return m.unmount(10);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let callers: Vec<_> = (0..cpus())
        .map(|c| {
            let d = m.path.join(format!("c{c}"));
            fs::create_dir(&d).unwrap();
            let stop = stop.clone();
            std::thread::spawn(move || {
                pin(c);
                let mut lat = Lat::default();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // Bursts and pauses: the guard goes to sleep (200 ms quiet) and wakes.
                    lat = {
                        let l = churn(&d, &format!("b{i}"), &stop, Some(50));
                        Lat {
                            n: lat.n + l.n,
                            max: lat.max.max(l.max),
                            over_100ms: lat.over_100ms + l.over_100ms,
                        }
                    };
                    if i % 3 == 2 {
                        std::thread::sleep(Duration::from_millis(250));
                    }
                    i += 1;
                }
                lat
            })
        })
        .collect();
    let plan = [
        (2, Some(0), HogKind::Normal),
        (0, None, HogKind::Normal),
        (3 * cpus(), None, HogKind::Normal),
        (0, None, HogKind::Normal),
        (2, Some(1), HogKind::Batch),
        (2, Some(0), HogKind::Nice(10)),
        (0, None, HogKind::Normal),
        (4, Some(0), HogKind::Normal),
        (0, None, HogKind::Normal),
        (2 * cpus() + 1, None, HogKind::Nice(-5)),
    ];
    let stop2 = stop.clone();
    let lats = deadline(60, "hogs_come_and_go", move || {
        for (n, cpu, kind) in plan {
            let h = Hogs::start(n, cpu, kind);
            std::thread::sleep(Duration::from_millis(700));
            drop(h);
            std::thread::sleep(Duration::from_millis(if n == 0 { 300 } else { 50 }));
        }
        stop2.store(true, Ordering::Relaxed);
        callers
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    eprintln!("hogs_come_and_go: {lats:?}, boosts {}", boosts(&m));
    for l in &lats {
        assert!(l.n > 0, "a caller made no progress");
        assert!(l.max < Duration::from_secs(1), "a request took {:?}", l.max);
    }
    // Asleep after the quiet: every queue thread normal (module doc).
    std::thread::sleep(Duration::from_millis(600));
    for (name, p) in policies("lanefs-q") {
        assert_eq!(
            p,
            libc::SCHED_OTHER,
            "{name} is not normal after 600 ms of quiet"
        );
    }
    m.unmount(10);
}

/// Busy threads started before the mount, in greater number than the CPUs, unpinned, some
/// nice'd, some SCHED_BATCH; 16 threads create, rename, link, unlink and list in shared
/// directories with invariant checks.
#[test]
fn namespace_invariants_with_hogs_from_before_the_mount() {
    let _s = serial();
    let h = (
        Hogs::start(cpus() + 1, None, HogKind::Normal),
        Hogs::start(1, None, HogKind::Nice(19)),
        Hogs::start(1, None, HogKind::Batch),
    );
    let m = Mnt::new(Uring::from_env());
    if !m.is_uring("namespace_invariants_with_hogs_from_before_the_mount") {
        drop(h);
        return m.unmount(10);
    }
    let p = m.path.clone();
    let lat = deadline(60, "namespace invariants with hogs", move || {
        namespace_invariants(&p, 16, 120)
    });
    eprintln!(
        "namespace invariants with hogs: {lat:?}, boosts {}",
        boosts(&m)
    );
    assert!(
        lat.max < Duration::from_secs(2),
        "a request took {:?}",
        lat.max
    );
    drop(h);
    m.unmount(10);
}

#[test]
fn namespace_invariants_many_threads() {
    let _s = serial();
    // On either transport: what it checks is the server's and the kernel's caches, not the
    // guard.
    let m = Mnt::new(Uring::from_env());
    let p = m.path.clone();
    let lat = deadline(60, "namespace invariants", move || {
        namespace_invariants(&p, 48, 60)
    });
    eprintln!("namespace invariants, 48 threads: {lat:?}");
    m.unmount(10);
}

/// `threads` threads each make `ops` random changes to their own names in four shared
/// directories and check, after each, what the mount shows of them.
fn namespace_invariants(root: &Path, threads: usize, ops: usize) -> Lat {
    let dirs: Vec<PathBuf> = (0..4).map(|i| root.join(format!("shared{i}"))).collect();
    for d in &dirs {
        fs::create_dir_all(d).unwrap();
    }
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let dirs = dirs.clone();
            std::thread::spawn(move || {
                let mut lat = Lat::default();
                let mut rng = t as u64 * 7919 + 1;
                let mut next = move || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng
                };
                // file id -> its names (dir index, name)
                let mut files: BTreeMap<u64, BTreeSet<(usize, String)>> = BTreeMap::new();
                let mut serial = 0u64;
                for _ in 0..ops {
                    let choice = next() % 10;
                    if files.is_empty() || choice < 3 {
                        let d = (next() % 4) as usize;
                        let name = format!("t{t}-{serial}");
                        let id = serial;
                        serial += 1;
                        let path = dirs[d].join(&name);
                        lat.time(|| {
                            let mut f = OpenOptions::new()
                                .write(true)
                                .create_new(true)
                                .open(&path)
                                .unwrap();
                            f.write_all(&id.to_le_bytes()).unwrap();
                        });
                        files.insert(id, BTreeSet::from([(d, name)]));
                    } else {
                        let ids: Vec<u64> = files.keys().copied().collect();
                        let id = ids[(next() % ids.len() as u64) as usize];
                        let names: Vec<_> = files[&id].iter().cloned().collect();
                        let (d, name) = names[(next() % names.len() as u64) as usize].clone();
                        let from = dirs[d].join(&name);
                        match choice {
                            3..=4 => {
                                // rename to another directory (and a new name)
                                let nd = (next() % 4) as usize;
                                let nn = format!("t{t}-{serial}");
                                serial += 1;
                                let to = dirs[nd].join(&nn);
                                lat.time(|| fs::rename(&from, &to))
                                    .unwrap_or_else(|e| panic!("rename {from:?} {to:?}: {e}"));
                                let s = files.get_mut(&id).unwrap();
                                s.remove(&(d, name));
                                s.insert((nd, nn));
                            }
                            5..=6 => {
                                let nd = (next() % 4) as usize;
                                let nn = format!("t{t}-{serial}");
                                serial += 1;
                                let to = dirs[nd].join(&nn);
                                lat.time(|| fs::hard_link(&from, &to))
                                    .unwrap_or_else(|e| panic!("link {from:?} {to:?}: {e}"));
                                files.get_mut(&id).unwrap().insert((nd, nn));
                            }
                            _ => {
                                lat.time(|| fs::remove_file(&from))
                                    .unwrap_or_else(|e| panic!("unlink {from:?}: {e}"));
                                let s = files.get_mut(&id).unwrap();
                                s.remove(&(d, name));
                                if s.is_empty() {
                                    files.remove(&id);
                                }
                            }
                        }
                    }
                    // Invariants: each file's link count and contents; each directory's
                    // listing of this thread's names.
                    if next() % 4 == 0 {
                        for (id, names) in &files {
                            for (d, n) in names {
                                let p = dirs[*d].join(n);
                                let md = lat.time(|| fs::metadata(&p)).unwrap();
                                assert_eq!(
                                    md.nlink(),
                                    names.len() as u64,
                                    "link count of {} (names {names:?})",
                                    p.display()
                                );
                                let mut b = Vec::new();
                                File::open(&p).unwrap().read_to_end(&mut b).unwrap();
                                assert_eq!(b, id.to_le_bytes(), "contents of {}", p.display());
                            }
                        }
                        let d = (next() % 4) as usize;
                        let prefix = format!("t{t}-");
                        let seen: BTreeSet<String> = lat
                            .time(|| fs::read_dir(&dirs[d]).unwrap())
                            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                            .filter(|n| n.starts_with(&prefix))
                            .collect();
                        let known: BTreeSet<String> = files
                            .values()
                            .flatten()
                            .filter(|(dd, _)| *dd == d)
                            .map(|(_, n)| n.clone())
                            .collect();
                        assert_eq!(seen, known, "listing of {}", dirs[d].display());
                    }
                }
                // Clean up this thread's names.
                for names in files.values() {
                    for (d, n) in names {
                        fs::remove_file(dirs[*d].join(n)).unwrap();
                    }
                }
                lat
            })
        })
        .collect();
    let mut all = Lat::default();
    for h in hs {
        let l = h.join().unwrap();
        all.n += l.n;
        all.max = all.max.max(l.max);
        all.over_100ms += l.over_100ms;
    }
    for d in &dirs {
        assert_eq!(
            fs::read_dir(d).unwrap().count(),
            0,
            "{} not empty",
            d.display()
        );
    }
    all
}

// ----- 2. lifecycle ----------------------------------------------------------------------

/// Many mounts and unmounts, with the guard asleep, awake, or boosting at the unmount; no
/// thread of any of them is left.
#[test]
fn mount_cycles_leave_no_threads() {
    let _s = serial();
    {
        let m = Mnt::new(Uring::from_env());
        let uring = m.is_uring("mount_cycles_leave_no_threads");
        m.unmount(10);
        if !uring {
            return;
        }
    }
    let before = threads_now();
    let mut max_during = 0;
    for i in 0..24 {
        let m = Mnt::new(Uring::from_env());
        max_during = max_during.max(threads_now());
        match i % 4 {
            // Unmounted at once: the guard has never woken.
            0 => {}
            // Unmounted right after requests: the guard is watching.
            1 => {
                churn(&m.path, "x", &AtomicBool::new(false), Some(20));
            }
            // Unmounted after the quiet: the guard sleeps.
            2 => {
                churn(&m.path, "x", &AtomicBool::new(false), Some(20));
                std::thread::sleep(Duration::from_millis(260));
            }
            // Unmounted while a starving queue thread is boosted.
            _ => {
                let h = Hogs::start(2, Some(0), HogKind::Normal);
                let p = m.path.clone();
                deadline(20, "churn beside hogs", move || {
                    pin(0);
                    churn(&p, "x", &AtomicBool::new(false), Some(50))
                });
                m.unmount(20);
                drop(h);
                continue;
            }
        }
        m.unmount(10);
    }
    threads_back_to(
        before,
        &format!("after 24 mounts (max during {max_during})"),
    );
}

/// Waits up to 3 s for the server threads to be back to `before` (threads of a finished
/// session may take a moment to be reaped), and fails naming those left.
fn threads_back_to(before: usize, what: &str) {
    let start = Instant::now();
    while threads_now() > before && start.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        threads_now() <= before,
        "threads: {before} before, {} {what} (lanefs threads left: {:?})",
        threads_now(),
        lanefs_threads()
    );
}

/// The fusectl connection directory of a mount: its device's minor number.
fn fusectl_abort(mnt: &Path) -> PathBuf {
    let dev = fs::metadata(mnt).unwrap().dev();
    // SAFETY: pure arithmetic on a dev_t.
    let minor = libc::minor(dev);
    let p = PathBuf::from(format!("/sys/fs/fuse/connections/{minor}/abort"));
    if !p.exists() {
        // fusectl may be unmounted.
        let _ = std::process::Command::new("mount")
            .args(["-t", "fusectl", "none", "/sys/fs/fuse/connections"])
            .status();
    }
    p
}

/// An abort through fusectl while callers are busy beside busy threads (the guard watching
/// and boosting) and while the guard sleeps: no hang, the mount goes, threads go.
#[test]
fn abort_while_guard_watches_or_sleeps() {
    let _s = serial();
    let before = threads_now();
    for sleeping in [false, true] {
        let m = Mnt::new(Uring::from_env());
        if !m.is_uring("abort_while_guard_watches_or_sleeps") {
            return m.unmount(10);
        }
        let abort = fusectl_abort(&m.path);
        if !abort.exists() {
            eprintln!("skipped: no fusectl");
            return m.unmount(10);
        }
        let h = Hogs::start(if sleeping { 0 } else { 3 }, Some(0), HogKind::Normal);
        let stop = Arc::new(AtomicBool::new(false));
        let callers: Vec<_> = (0..if sleeping { 0 } else { 4 })
            .map(|c| {
                let (p, stop) = (m.path.clone(), stop.clone());
                std::thread::spawn(move || {
                    pin(c % cpus());
                    let mut errs = 0;
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) {
                        if File::create(p.join(format!("a{c}-{i}"))).is_err() {
                            errs += 1;
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        i += 1;
                    }
                    errs
                })
            })
            .collect();
        if sleeping {
            churn(&m.path, "s", &AtomicBool::new(false), Some(10));
            std::thread::sleep(Duration::from_millis(400));
        } else {
            std::thread::sleep(Duration::from_millis(500));
        }
        fs::write(&abort, "1").unwrap();
        std::thread::sleep(Duration::from_millis(100));
        stop.store(true, Ordering::Relaxed);
        deadline(20, "callers after the abort", move || {
            for c in callers {
                c.join().unwrap();
            }
        });
        // Requests fail with ENOTCONN now.
        let e = fs::metadata(m.path.join("nothing")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOTCONN), "after abort: {e}");
        drop(h);
        m.unmount(20);
    }
    threads_back_to(before, "after the aborted sessions");
}

/// A lazy unmount with a file still open: the file stays usable (the session lives on, the
/// guard with it) and the session ends at its close.
#[test]
fn lazy_unmount_with_open_file() {
    let _s = serial();
    let before = threads_now();
    let mut m = Mnt::new(Uring::from_env());
    if !m.is_uring("lazy_unmount_with_open_file") {
        return m.unmount(10);
    }
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.path.join("open"))
        .unwrap();
    f.write_all(b"before").unwrap();
    let h = Hogs::start(2, Some(0), HogKind::Normal);
    let c = CString::new(m.path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid path.
    assert_eq!(unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) }, 0);
    let mut f = deadline(20, "use of a file after a lazy unmount", move || {
        pin(0);
        for i in 0..200 {
            f.seek(SeekFrom::Start(0)).unwrap();
            f.write_all(format!("after {i}").as_bytes()).unwrap();
            f.sync_all().unwrap();
        }
        f
    });
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert!(s.starts_with("after 199"), "{s}");
    drop(f);
    drop(h);
    // The Mount's unmount finds it gone and waits for the session's end.
    let mut mm = m.m.take().unwrap();
    deadline(20, "the session's end after the last close", move || {
        mm.unmount().unwrap()
    });
    threads_back_to(before, "after the lazily unmounted session ended");
}

// ----- 3. FORGET batching ----------------------------------------------------------------

/// Waits up to `secs` for the filesystem's free inodes to reach `want`.
fn wait_free(m: &Mnt, want: u64, secs: u64) -> Result<Duration, u64> {
    let start = Instant::now();
    loop {
        let f = m.free_inodes();
        if f >= want {
            return Ok(start.elapsed());
        }
        if start.elapsed() > Duration::from_secs(secs) {
            return Err(f);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn unlinked_inodes_are_freed_promptly() {
    let _s = serial();
    let m = Mnt::new(Uring::from_env());
    if !m.is_uring("unlinked_inodes_are_freed_promptly") {
        return m.unmount(10);
    }
    let base = m.free_inodes();
    // One at a time.
    for i in 0..50 {
        let p = m.path.join(format!("one{i}"));
        File::create(&p).unwrap();
        fs::remove_file(&p).unwrap();
        match wait_free(&m, base, 2) {
            Ok(d) => assert!(d < Duration::from_millis(500), "freed after {d:?}"),
            Err(f) => panic!("inode of one{i} not freed in 2 s ({} in use)", base - f),
        }
    }
    // A burst from several threads.
    let p = m.path.clone();
    deadline(30, "a burst of unlinks", move || {
        let hs: Vec<_> = (0..4)
            .map(|t| {
                let p = p.clone();
                std::thread::spawn(move || {
                    for i in 0..1500 {
                        File::create(p.join(format!("b{t}-{i}"))).unwrap();
                    }
                    for i in 0..1500 {
                        fs::remove_file(p.join(format!("b{t}-{i}"))).unwrap();
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    });
    match wait_free(&m, base, 5) {
        Ok(d) => eprintln!("6000 unlinked inodes freed {d:?} after the last unlink"),
        Err(f) => panic!("{} inodes still in use 5 s after 6000 unlinks", base - f),
    }
    m.unmount(10);
}

#[test]
fn unlinked_open_files_tmpfiles_and_hard_links() {
    let _s = serial();
    let m = Mnt::new(Uring::from_env());
    if !m.is_uring("unlinked_open_files_tmpfiles_and_hard_links") {
        return m.unmount(10);
    }
    let base = m.free_inodes();
    // Unlinked while open: readable and writable until closed, then freed.
    let mut open = Vec::new();
    for i in 0..20 {
        let p = m.path.join(format!("u{i}"));
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&p)
            .unwrap();
        f.write_all(format!("data {i}").as_bytes()).unwrap();
        fs::remove_file(&p).unwrap();
        open.push(f);
    }
    // Forgets of other, closed inodes arrive meanwhile.
    churn(&m.path, "noise", &AtomicBool::new(false), Some(200));
    std::thread::sleep(Duration::from_millis(50));
    for (i, f) in open.iter_mut().enumerate() {
        f.seek(SeekFrom::Start(0)).unwrap();
        let mut s = String::new();
        f.read_to_string(&mut s).unwrap();
        assert_eq!(s, format!("data {i}"));
        assert_eq!(f.metadata().unwrap().nlink(), 0);
        f.write_all(b"+").unwrap();
        f.sync_all().unwrap();
    }
    assert!(
        m.free_inodes() <= base - 20,
        "open unlinked files freed early"
    );
    drop(open);
    wait_free(&m, base, 2).unwrap_or_else(|f| panic!("{} inodes not freed", base - f));

    // O_TMPFILE: one closed without a name (freed), one given a name (kept).
    let mk = || {
        OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_TMPFILE)
            .open(&m.path)
    };
    match mk() {
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
            eprintln!("O_TMPFILE not supported by this kernel: part skipped")
        }
        r => {
            let mut t = r.unwrap();
            t.write_all(b"tmp").unwrap();
            drop(t);
            wait_free(&m, base, 2).unwrap_or_else(|f| panic!("tmpfile not freed ({})", base - f));
            let mut t = mk().unwrap();
            t.write_all(b"named").unwrap();
            let src = CString::new(format!(
                "/proc/self/fd/{}",
                std::os::fd::AsRawFd::as_raw_fd(&t)
            ))
            .unwrap();
            let dst = CString::new(m.path.join("named").as_os_str().as_bytes()).unwrap();
            // SAFETY: valid paths.
            let r = unsafe {
                libc::linkat(
                    libc::AT_FDCWD,
                    src.as_ptr(),
                    libc::AT_FDCWD,
                    dst.as_ptr(),
                    libc::AT_SYMLINK_FOLLOW,
                )
            };
            assert_eq!(r, 0, "linkat: {}", std::io::Error::last_os_error());
            drop(t);
            std::thread::sleep(Duration::from_millis(20));
            assert_eq!(fs::read(m.path.join("named")).unwrap(), b"named");
            fs::remove_file(m.path.join("named")).unwrap();
            wait_free(&m, base, 2)
                .unwrap_or_else(|f| panic!("named tmpfile not freed ({})", base - f));
        }
    }

    // Hard links: the inode lives while any name or open file does.
    let a = m.path.join("h0");
    fs::write(&a, b"linked").unwrap();
    for i in 1..10 {
        fs::hard_link(&a, m.path.join(format!("h{i}"))).unwrap();
    }
    for i in 0..9 {
        fs::remove_file(m.path.join(format!("h{i}"))).unwrap();
        let md = fs::metadata(m.path.join("h9")).unwrap();
        assert_eq!(md.nlink(), 9 - i as u64);
    }
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(fs::read(m.path.join("h9")).unwrap(), b"linked");
    let f = File::open(m.path.join("h9")).unwrap();
    fs::remove_file(m.path.join("h9")).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(m.free_inodes(), base - 1, "the open, unlinked inode");
    drop(f);
    wait_free(&m, base, 2).unwrap_or_else(|f| panic!("linked inode not freed ({})", base - f));
    m.unmount(10);
}

extern "C" fn on_signal(_: libc::c_int) {}

/// Signals to threads blocked in requests (`fsync` through group commit on a durable
/// store, writes) while forgets flow: every request ends, EINTR or not.
#[test]
fn interrupts_with_forgets_flowing() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let opened = lanefs_store::open(
        dir.path(),
        Config::default(),
        lanefs_store::Options::default(),
    )
    .unwrap();
    let fs = Arc::new(opened.fs);
    let store = opened.store;
    let m = Mnt::with_fs(Uring::from_env(), fs);
    if !m.is_uring("interrupts_with_forgets_flowing") {
        m.unmount(10);
        drop(store);
        return;
    }
    // SAFETY: a handler that does nothing; no SA_RESTART, so blocked calls may see EINTR.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as *const () as usize;
        libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut());
    }
    let stop = Arc::new(AtomicBool::new(false));
    let eintr = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let tids = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..4)
        .map(|t| {
            let (p, stop, eintr, done, tids) = (
                m.path.clone(),
                stop.clone(),
                eintr.clone(),
                done.clone(),
                tids.clone(),
            );
            std::thread::spawn(move || {
                // SAFETY: gettid has no preconditions.
                tids.lock().unwrap().push(unsafe { libc::gettid() });
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let path = p.join(format!("f{t}-{i}"));
                    let mut f = File::create(&path).unwrap();
                    let _ = f.write_all(&[7u8; 8192]);
                    match f.sync_all() {
                        Ok(()) => {}
                        Err(e) if e.raw_os_error() == Some(libc::EINTR) => {
                            eintr.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => panic!("fsync: {e}"),
                    }
                    drop(f);
                    // Unlinks feed the /dev/fuse thread forgets while the signals come.
                    let _ = fs::remove_file(&path);
                    done.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(50));
    let tids2 = tids.lock().unwrap().clone();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        for &tid in &tids2 {
            // SAFETY: signals a thread of this process.
            unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, libc::SIGUSR1) };
        }
        std::thread::sleep(Duration::from_micros(300));
    }
    stop.store(true, Ordering::Relaxed);
    deadline(20, "workers under signals", move || {
        for w in workers {
            w.join().unwrap();
        }
    });
    eprintln!(
        "interrupts: {} fsyncs, {} EINTR",
        done.load(Ordering::Relaxed),
        eintr.load(Ordering::Relaxed)
    );
    assert!(done.load(Ordering::Relaxed) > 0);
    m.unmount(20);
    drop(store);
}
