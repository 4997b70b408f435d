//! lanefs's path API (`Client`) and inode API against the `vfs` crate's `MemoryFS`, an
//! in-process filesystem library used through paths, on the operations a program embedding a
//! filesystem makes most: create + close + unlink, create + rename + unlink, and stat, each
//! thread on names of its own in one shared directory. Same allocator (mimalloc, as the
//! `lanefs` binary), 2 s windows, medians of 3 rounds, the three run round-robin:
//!
//! ```sh
//! cargo run --release -p lanefs-bench --example vs_vfs [THREADS...]
//! ```

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use lanefs::{Client, Config, Ctx, Filesystem, Ino, OpenOptions};
use vfs::FileSystem as _;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const WINDOW: Duration = Duration::from_secs(2);
const ROUNDS: usize = 3;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Work {
    CreateUnlink,
    Rename,
    Stat,
}

/// One library under test: a thread's operation `i`.
trait Lib: Send + Sync {
    fn name(&self) -> &'static str;
    fn setup(&self, threads: usize);
    fn op(&self, w: Work, t: usize, i: u64);
}

struct Vfs(vfs::MemoryFS);

impl Lib for Vfs {
    fn name(&self) -> &'static str {
        "vfs MemoryFS"
    }
    fn setup(&self, threads: usize) {
        self.0.create_dir("/d").unwrap();
        for t in 0..threads {
            for k in 0..64 {
                drop(self.0.create_file(&format!("/d/s{t}-{k}")).unwrap());
            }
        }
    }
    fn op(&self, w: Work, t: usize, i: u64) {
        let a = format!("/d/f{t}-{}", i % 64);
        match w {
            Work::CreateUnlink => {
                drop(self.0.create_file(&a).unwrap());
                self.0.remove_file(&a).unwrap();
            }
            Work::Rename => {
                let b = format!("/d/g{t}-{}", i % 64);
                drop(self.0.create_file(&a).unwrap());
                // MemoryFS has no move_file (NotSupported): copy and remove, as VfsPath's
                // move_file does then.
                if self.0.move_file(&a, &b).is_err() {
                    let mut r = self.0.open_file(&a).unwrap();
                    let mut w = self.0.create_file(&b).unwrap();
                    std::io::copy(&mut r, &mut w).unwrap();
                    drop(w);
                    self.0.remove_file(&a).unwrap();
                }
                self.0.remove_file(&b).unwrap();
            }
            Work::Stat => {
                self.0.metadata(&format!("/d/s{t}-{}", i % 64)).unwrap();
            }
        }
    }
}

struct Paths(Client);

impl Lib for Paths {
    fn name(&self) -> &'static str {
        "lanefs path API"
    }
    fn setup(&self, threads: usize) {
        self.0.create_dir("/d").unwrap();
        for t in 0..threads {
            for k in 0..64 {
                self.0.write(format!("/d/s{t}-{k}"), b"").unwrap();
            }
        }
    }
    fn op(&self, w: Work, t: usize, i: u64) {
        let a = format!("/d/f{t}-{}", i % 64);
        let create = || {
            drop(
                self.0
                    .open(&a, OpenOptions::new().write(true).create(true))
                    .unwrap(),
            )
        };
        match w {
            Work::CreateUnlink => {
                create();
                self.0.remove_file(&a).unwrap();
            }
            Work::Rename => {
                let b = format!("/d/g{t}-{}", i % 64);
                create();
                self.0.rename(&a, &b).unwrap();
                self.0.remove_file(&b).unwrap();
            }
            Work::Stat => {
                self.0.metadata(format!("/d/s{t}-{}", i % 64)).unwrap();
            }
        }
    }
}

struct Inodes {
    fs: Arc<Filesystem>,
    ctx: Ctx,
    dir: std::sync::OnceLock<Ino>,
}

impl Lib for Inodes {
    fn name(&self) -> &'static str {
        "lanefs inode API"
    }
    fn setup(&self, threads: usize) {
        let d = self
            .fs
            .mkdir(&self.ctx, Ino::ROOT, b"d", 0o755)
            .unwrap()
            .ino;
        for t in 0..threads {
            for k in 0..64 {
                let n = format!("s{t}-{k}");
                let (_, fh) = self
                    .fs
                    .create(&self.ctx, d, n.as_bytes(), 0o644, libc::O_WRONLY)
                    .unwrap();
                self.fs.release(fh).unwrap();
            }
        }
        self.dir.set(d).unwrap();
    }
    fn op(&self, w: Work, t: usize, i: u64) {
        let (fs, ctx, d) = (&self.fs, &self.ctx, *self.dir.get().unwrap());
        let a = format!("f{t}-{}", i % 64);
        let create = || {
            let (_, fh) = fs
                .create(ctx, d, a.as_bytes(), 0o644, libc::O_WRONLY)
                .unwrap();
            fs.release(fh).unwrap();
        };
        match w {
            Work::CreateUnlink => {
                create();
                fs.unlink(ctx, d, a.as_bytes()).unwrap();
            }
            Work::Rename => {
                let b = format!("g{t}-{}", i % 64);
                create();
                fs.rename(ctx, d, a.as_bytes(), d, b.as_bytes(), 0).unwrap();
                fs.unlink(ctx, d, b.as_bytes()).unwrap();
            }
            Work::Stat => {
                fs.lookup(ctx, d, format!("s{t}-{}", i % 64).as_bytes())
                    .unwrap();
            }
        }
    }
}

fn fresh(which: usize) -> Box<dyn Lib> {
    let fs = || Arc::new(Filesystem::new(Config::default()));
    match which {
        0 => Box::new(Vfs(vfs::MemoryFS::new())),
        1 => Box::new(Paths(Client::root(fs()))),
        _ => Box::new(Inodes {
            fs: fs(),
            ctx: Ctx::root(),
            dir: Default::default(),
        }),
    }
}

/// Operations per second of `lib` doing `w` with `threads` threads for one window.
fn cell(lib: &dyn Lib, w: Work, threads: usize) -> f64 {
    lib.setup(threads);
    let stop = AtomicBool::new(false);
    let total = AtomicU64::new(0);
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (stop, total) = (&stop, &total);
            s.spawn(move || {
                let mut i = 0u64;
                while !stop.load(Relaxed) {
                    lib.op(w, t, i);
                    i += 1;
                }
                total.fetch_add(i, Relaxed);
            });
        }
        std::thread::sleep(WINDOW);
        stop.store(true, Relaxed);
    });
    total.load(Relaxed) as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let threads: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("thread counts"))
        .collect();
    let threads = if threads.is_empty() {
        vec![1, 2]
    } else {
        threads
    };
    for w in [Work::CreateUnlink, Work::Rename, Work::Stat] {
        println!("{w:?} (ops/s, median of {ROUNDS}; ratio to vfs)");
        for &t in &threads {
            let mut runs: Vec<Vec<f64>> = vec![Vec::new(); 3];
            for _ in 0..ROUNDS {
                for (which, r) in runs.iter_mut().enumerate() {
                    r.push(cell(&*fresh(which), w, t));
                }
            }
            let med: Vec<f64> = runs
                .iter_mut()
                .map(|r| {
                    r.sort_by(f64::total_cmp);
                    r[r.len() / 2]
                })
                .collect();
            for (which, m) in med.iter().enumerate() {
                println!(
                    "  T={t}  {:<18} {:>10.0}  {:.2}x",
                    fresh(which).name(),
                    m,
                    m / med[0]
                );
            }
        }
        std::io::stdout().flush().unwrap();
    }
}
