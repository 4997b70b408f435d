//! The harness of the linearizability tests (`permission_linearizability.rs`,
//! `directory_linearizability.rs`): races of operations through the public API beside
//! threads that burn CPU (so that racers are descheduled inside operations), bounded by
//! rounds ([`MAX_ROUNDS`]) and by a time cap ([`phase`]: `LINEARIZABILITY_SECS`, seconds per
//! race phase, default 0.7; raise it with `--release` for long hunts), with a [`Tally`] of
//! checks that reports how many of how many failed, with examples.
//!
//! Randomised races print their seed ([`seed::seed`], from `LANEFS_SEED`, which repeats one);
//! what it repeats is the races' random choices ([`Rng`]), not the scheduler's interleaving.

#![allow(dead_code)]

use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use lanefs::{Attr, Config, Ctx, Filesystem, InodeId, InodeRef};
use rand::rngs::StdRng;
use rand::{Rng as _, RngCore};

use super::seed;

pub type R<T> = lanefs::Result<T>;

/// Seconds each race phase runs (`LINEARIZABILITY_SECS`, default 0.7).
pub fn phase() -> Duration {
    let s = std::env::var("LINEARIZABILITY_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(0.7);
    Duration::from_secs_f64(s)
}

/// Upper bound on rounds of a round-based race, beside the time cap.
pub const MAX_ROUNDS: u64 = 2_000_000;

/// The tests of a test file run one at a time: each wants both cores for its racers and
/// burners, and spin barriers on an oversubscribed machine measure only the scheduler.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

pub fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn new_fs() -> Arc<Filesystem> {
    Arc::new(Filesystem::new(Config {
        protected_hardlinks: false,
        ..Config::default()
    }))
}

pub fn root() -> Ctx {
    Ctx::root()
}

pub fn id(a: &Attr) -> InodeId {
    InodeId {
        ino: a.ino,
        generation: a.generation,
    }
}

/// A new directory `name` with `mode` in `parent`, made by root.
pub fn mkdir_id(fs: &Filesystem, parent: impl Into<InodeRef>, name: &[u8], mode: u32) -> InodeId {
    id(&fs.mkdir(&root(), parent, name, mode).unwrap())
}

/// Threads that burn CPU beside the racers, so that racers are descheduled inside
/// operations: each burns for a random while (up to ~100 µs), then sleeps ~50 µs, so that its
/// wake-ups preempt a racer at random points while leaving the racers most of the cores.
pub struct Burn {
    stop: Arc<AtomicBool>,
    hs: Vec<JoinHandle<()>>,
}

impl Burn {
    pub fn new(n: usize) -> Burn {
        let stop = Arc::new(AtomicBool::new(false));
        let hs = (0..n)
            .map(|i| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut rng = Rng::new(i as u64 + 77);
                    let mut x = i as u64 + 1;
                    while !stop.load(Relaxed) {
                        let until = Instant::now() + Duration::from_micros(rng.below(100));
                        while Instant::now() < until {
                            for _ in 0..200 {
                                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                            }
                            std::hint::black_box(x);
                        }
                        std::thread::sleep(Duration::from_micros(50));
                    }
                })
            })
            .collect();
        Burn { stop, hs }
    }
}

impl Drop for Burn {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
        for h in self.hs.drain(..) {
            let _ = h.join();
        }
    }
}

/// The random choices of a race: the tests' one seeded RNG ([`seed::rng`]), seeded from
/// `LANEFS_SEED` through [`seed::seed`] (or a fixed seed), with the two draws the races make.
pub struct Rng(StdRng);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed::rng(seed))
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.0.random_range(0..n)
    }
}

/// Random spins added before each racer's operation.
pub const JITTER: u64 = 300;
/// Burner threads beside each race.
pub const BURNERS: usize = 1;
/// How far an alignment bias moves per round, and its bound, in spins.
pub const BIAS_STEP: i64 = 40;
pub const BIAS_MAX: i64 = 200_000;

pub fn spin(n: u64) {
    for _ in 0..n {
        std::hint::spin_loop();
    }
}

/// A barrier that spins (then yields): cheaper than a futex wake, so rounds are many.
pub struct SpinBarrier {
    n: usize,
    count: AtomicUsize,
    generation: AtomicUsize,
}

impl SpinBarrier {
    pub fn new(n: usize) -> SpinBarrier {
        SpinBarrier {
            n,
            count: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
        }
    }
    pub fn wait(&self) {
        let g = self.generation.load(Acquire);
        if self.count.fetch_add(1, AcqRel) + 1 == self.n {
            self.count.store(0, Relaxed);
            self.generation.fetch_add(1, Release);
        } else {
            // Spin (up to 50 µs) rather than yield at once: a yield hands the core to a burner for a
            // whole time slice and leaves this racer late for the round.
            let start = Instant::now();
            let mut i = 0u32;
            while self.generation.load(Acquire) == g {
                std::hint::spin_loop();
                i += 1;
                if i % 1024 == 0 && start.elapsed() > Duration::from_micros(50) {
                    std::thread::yield_now();
                }
            }
        }
    }
}

/// The protocol of a round-based race: a driver and racers meet at a [`SpinBarrier`] to
/// start each round and to end it (and at any step between); the driver ends the race at
/// the time cap, after [`MAX_ROUNDS`] rounds, or when it asks to, and the racers' loops then
/// return.
pub struct Rounds {
    bar: SpinBarrier,
    stop: AtomicBool,
    end: Instant,
}

impl Rounds {
    /// For `parties` threads (the driver included), racing for `cap` from now.
    pub fn new(parties: usize, cap: Duration) -> Rounds {
        Rounds {
            bar: SpinBarrier::new(parties),
            stop: AtomicBool::new(false),
            end: Instant::now() + cap,
        }
    }
    /// The barrier every party meets at.
    pub fn wait(&self) {
        self.bar.wait();
    }
    /// A racer: until the driver ends the race, waits for a round to start, runs `round`,
    /// and waits for the round's end.
    pub fn racer(&self, mut round: impl FnMut()) {
        loop {
            self.bar.wait();
            if self.stop.load(Acquire) {
                break;
            }
            round();
            self.bar.wait();
        }
    }
    /// The driver, once `r` rounds are done: whether the race is over (the time cap or
    /// [`MAX_ROUNDS`]); if so, the racers are released to return.
    pub fn over(&self, r: u64) -> bool {
        self.over_or(r, false)
    }
    /// [`Rounds::over`], or the driver has seen `enough`.
    pub fn over_or(&self, r: u64, enough: bool) -> bool {
        if Instant::now() >= self.end || r >= MAX_ROUNDS || enough {
            self.stop.store(true, Release);
            self.bar.wait();
            return true;
        }
        false
    }
}

/// Counts checks and failures; keeps a few examples.
pub struct Tally {
    pub what: String,
    pub checks: AtomicU64,
    pub bad: AtomicU64,
    pub examples: Mutex<Vec<String>>,
}

impl Tally {
    pub fn new(what: impl Into<String>) -> Tally {
        Tally {
            what: what.into(),
            checks: AtomicU64::new(0),
            bad: AtomicU64::new(0),
            examples: Mutex::new(Vec::new()),
        }
    }
    pub fn check(&self, ok: bool, msg: impl FnOnce() -> String) -> bool {
        self.checks.fetch_add(1, Relaxed);
        if !ok {
            self.bad.fetch_add(1, Relaxed);
            let mut ex = self.examples.lock().unwrap();
            if ex.len() < 8 {
                ex.push(msg());
            }
        }
        ok
    }
    pub fn fail(&self, msg: impl FnOnce() -> String) {
        self.check(false, msg);
    }
    /// [`Tally::finish`], then `fs`'s invariants must hold.
    pub fn finish_and_check(&self, fs: &Filesystem) {
        self.finish();
        fs.check_invariants().unwrap();
    }
    pub fn finish(&self) {
        let (bad, checks) = (self.bad.load(SeqCst), self.checks.load(SeqCst));
        eprintln!("{}: {bad} of {checks} checks failed", self.what);
        if bad > 0 {
            panic!(
                "{bad} of {checks} checks failed: {}\nexamples:\n  {}",
                self.what,
                self.examples.lock().unwrap().join("\n  ")
            );
        }
    }
}
pub fn mkfile(
    fs: &Filesystem,
    ctx: &Ctx,
    dir: impl Into<InodeRef>,
    name: &[u8],
    mode: u32,
) -> R<Attr> {
    let (a, fh) = fs.create(
        ctx,
        dir,
        name,
        mode,
        libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
    )?;
    fs.release(fh).unwrap();
    Ok(a)
}

/// A racing thread's body: given its index and the stop flag.
pub type Worker<'a> = Box<dyn Fn(usize, &AtomicBool) + Send + Sync + 'a>;

/// Runs `workers` (each given its index and a stop flag) beside one burner until the time
/// cap, then stops them.
pub fn race(workers: Vec<Worker<'_>>) {
    let stop = AtomicBool::new(false);
    let _burn = Burn::new(BURNERS);
    let end = Instant::now() + phase();
    std::thread::scope(|s| {
        for (i, w) in workers.iter().enumerate() {
            let stop = &stop;
            s.spawn(move || w(i, stop));
        }
        while Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
        }
        stop.store(true, Release);
    });
}
