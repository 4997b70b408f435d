//! Power cuts at every flush, checked against a model (the CrashMonkey / ACE method).
//!
//! A store on a simulated disk (`SimDisk`) gets a small tree, made durable. Then a workload of
//! one to four operations (create, mkdir, link, unlink, rename, rmdir, truncate, write,
//! setxattr, punch, an `O_TMPFILE` file written and linked, one written and left open
//! unnamed), each possibly followed by an fsync, and always ending with one. Around
//! every flush the disk makes, crash images are taken: what a power cut at that moment would
//! leave, with the unflushed writes lost, kept, or torn at sector boundaries. Every image is
//! opened as a store and must hold the tree as it was after some prefix of the operations,
//! at least as long as the prefix the last returned fsync covered, pass the engine's
//! invariant check, and hold no inode the tree does not name.
//!
//! The workloads: every single operation and every pair, then random ones of three and four
//! (their seed is printed; `LANEFS_SEED=<n>` replays).

#[path = "../../engine/tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::dump;
use lanefs::{Client, Config, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, OpenOptions};
use lanefs_store::disk::{SimDisk, SyncPoint, Unflushed};
use lanefs_store::{Options, open};
use parking_lot::Mutex;
use rand::{Rng, SeedableRng, rngs::StdRng};

const DIR: &str = "/store";

fn options(disk: &SimDisk, interval: Duration) -> Options {
    Options {
        disk: Arc::new(disk.clone()),
        segment_size: 16 << 10,
        commit_interval: interval,
        ..Options::default()
    }
}

/// One step of a workload.
#[derive(Clone, Copy, Debug)]
enum Step {
    Create(&'static str),
    Mkdir(&'static str),
    Link(&'static str, &'static str),
    Unlink(&'static str),
    Rename(&'static str, &'static str),
    Rmdir(&'static str),
    Truncate(&'static str, u64),
    Write(&'static str, u64, usize),
    SetXattr(&'static str),
    Punch(&'static str, u64, u64),
    /// fsync of this file or directory (through an open handle).
    Fsync(&'static str),
    /// An `O_TMPFILE` file made in the directory, written, then linked under the name.
    Tmpfile(&'static str, &'static str),
    /// An `O_TMPFILE` file made in the directory and written, left open and never named
    /// (past the power cut: recovery must leave nothing of it).
    TmpfileOpen(&'static str),
}

const STEPS: &[Step] = &[
    Step::Create("/new"),
    Step::Create("/A/C/new"),
    Step::Mkdir("/A/D"),
    Step::Mkdir("/B/D"),
    Step::Link("/foo", "/B/link"),
    Step::Link("/A/bar", "/bar2"),
    Step::Unlink("/foo"),
    Step::Unlink("/A/bar"),
    Step::Rename("/foo", "/B/foo"),
    Step::Rename("/A/bar", "/foo"),
    Step::Rename("/A", "/B/A"),
    Step::Rename("/A/C", "/C"),
    Step::Rmdir("/B"),
    Step::Rmdir("/A/C"),
    Step::Truncate("/foo", 0),
    Step::Truncate("/A/bar", 9000),
    Step::Write("/foo", 4090, 20),
    Step::Write("/A/bar", 100, 5000),
    Step::SetXattr("/foo"),
    Step::SetXattr("/A"),
    Step::Punch("/foo", 0, 4096),
    Step::Tmpfile("/A", "/A/tmp"),
    Step::TmpfileOpen("/B"),
];

fn setup(c: &Client) {
    c.create_dir("/A").unwrap();
    c.create_dir("/A/C").unwrap();
    c.create_dir("/B").unwrap();
    c.write("/foo", vec![b'f'; 5000]).unwrap();
    c.write("/A/bar", vec![b'b'; 100]).unwrap();
    c.hard_link("/foo", "/A/foo").unwrap();
}

/// Runs a step; whether it succeeded.
fn run(c: &Client, s: Step) -> bool {
    let r = match s {
        Step::Create(p) => c
            .open(p, OpenOptions::new().write(true).create_new(true))
            .map(drop),
        Step::Mkdir(p) => c.create_dir(p),
        Step::Link(a, b) => c.hard_link(a, b),
        Step::Unlink(p) => c.remove_file(p),
        Step::Rename(a, b) => c.rename(a, b),
        Step::Rmdir(p) => c.remove_dir(p),
        Step::Truncate(p, n) => c.truncate(p, n),
        Step::Write(p, off, n) => c
            .open(p, OpenOptions::new().write(true))
            .and_then(|f| f.write_at(&vec![b'w'; n], off).map(drop)),
        Step::SetXattr(p) => c.metadata(p).and_then(|m| {
            c.fs()
                .setxattr(c.ctx(), m.ino(), b"user.k", b"value", 0)
                .map_err(Into::into)
        }),
        Step::Punch(p, off, len) => c.open(p, OpenOptions::new().write(true)).and_then(|f| {
            c.fs()
                .fallocate(
                    c.ctx(),
                    f.handle(),
                    FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                    off,
                    len,
                )
                .map_err(Into::into)
        }),
        Step::Fsync(p) => c
            .open(p, OpenOptions::new().read(true))
            .and_then(|f| f.sync_all()),
        Step::Tmpfile(dir, name) => c
            .open_tmpfile(dir, OpenOptions::new().write(true).mode(0o640))
            .and_then(|f| {
                f.write_at(&vec![b't'; 5000], 0)?;
                c.link_file(&f, name)
            }),
        Step::TmpfileOpen(dir) => c
            .open_tmpfile(dir, OpenOptions::new().write(true))
            .and_then(|f| {
                f.write_at(&vec![b'o'; 6000], 100)?;
                std::mem::forget(f); // open until the filesystem goes
                Ok(())
            }),
    };
    r.is_ok()
}

/// A crash image, and how many steps had been made durable (by a returned fsync) when it
/// was taken.
struct Image {
    disk: SimDisk,
    durable: usize,
    what: String,
}

/// Runs `workload` (an fsync is added at the end) and checks every crash image.
fn check(workload: &[Step], interval: Duration, seed: u64) -> usize {
    let disk = SimDisk::new();
    let store_dir = Path::new(DIR);
    let o = open(store_dir, Config::default(), options(&disk, interval)).unwrap();
    let fs = Arc::new(o.fs);
    let c = Client::root(fs.clone());
    setup(&c);
    fs.sync_all().unwrap();
    let mut states = vec![dump(&fs, true)];
    let images = Arc::new(Mutex::new(Vec::<Image>::new()));
    let durable = Arc::new(AtomicUsize::new(0));
    let step_no = Arc::new(AtomicUsize::new(0));
    {
        let (images, durable, step_no) = (images.clone(), durable.clone(), step_no.clone());
        let mut k = 0u64;
        disk.on_sync(move |d, at| {
            k += 1;
            let modes = [Unflushed::Lost, Unflushed::Kept, Unflushed::Torn(seed ^ k)];
            for u in modes {
                images.lock().push(Image {
                    disk: d.crash(u),
                    durable: durable.load(SeqCst),
                    what: format!(
                        "flush {k} ({at:?}) during step {}, unflushed {u:?}",
                        step_no.load(SeqCst)
                    ),
                });
            }
            let _ = SyncPoint::Before;
        });
    }
    let mut steps: Vec<Step> = workload.to_vec();
    if !matches!(steps.last(), Some(Step::Fsync(_))) {
        steps.push(Step::Fsync("/"));
    }
    let mut done = 0;
    for s in &steps {
        step_no.store(done + 1, SeqCst);
        if let Step::Fsync(_) = s {
            // An fsync that failed (its file is gone) makes nothing durable.
            if run(&c, *s) {
                durable.store(done, SeqCst);
            }
        } else {
            run(&c, *s);
            done += 1;
            states.push(dump(&fs, true));
        }
    }
    disk.clear_hook();
    drop(c);
    drop(fs);
    drop(o.store);
    let images = std::mem::take(&mut *images.lock());
    let n = images.len();
    for img in images {
        let r = open(store_dir, Config::default(), options(&img.disk, interval))
            .unwrap_or_else(|e| panic!("{workload:?}, {}: open failed: {e}", img.what));
        let got = dump(&r.fs, true);
        let report =
            r.fs.check_invariants()
                .unwrap_or_else(|e| panic!("{workload:?}, {}: {e}", img.what));
        // Nothing without a name survives recovery (an unnamed tmpfile, an unlinked open
        // file): every inode is one the tree reaches.
        let named: std::collections::HashSet<_> = got.values().map(|n| n.ino).collect();
        assert_eq!(
            report.inodes,
            named.len() as u64,
            "{workload:?}, {}: inodes without a name",
            img.what
        );
        let matched = (img.durable..states.len()).find(|&j| states[j] == got);
        if matched.is_none() {
            let want = &states[img.durable];
            let diff: Vec<String> = want
                .iter()
                .filter(|(p, n)| got.get(*p) != Some(n))
                .map(|(p, _)| String::from_utf8_lossy(p).into_owned())
                .chain(
                    got.keys()
                        .filter(|p| !want.contains_key(*p))
                        .map(|p| format!("+{}", String::from_utf8_lossy(p))),
                )
                .collect();
            let last = states.last().expect("states");
            let first_diff = last
                .iter()
                .find(|(p, n)| got.get(*p) != Some(n))
                .map(|(p, n)| {
                    let show = |n: &common::Node| {
                        let mut n = n.clone();
                        n.content.truncate(16);
                        format!("{n:?}")
                    };
                    format!(
                        "{}: want {}\n got {}",
                        String::from_utf8_lossy(p),
                        show(n),
                        got.get(p).map_or("nothing".into(), show)
                    )
                });
            panic!(
                "{workload:?}, {}: the recovered tree is no prefix state from step {} on \
                 (differs from it at {diff:?}; from the last state at {first_diff:?})",
                img.what, img.durable
            );
        }
    }
    n
}

#[test]
fn every_single_operation_survives_a_power_cut_at_every_flush() {
    let mut images = 0;
    for s in STEPS {
        images += check(&[*s], Duration::from_secs(3600), 1);
    }
    eprintln!("{images} crash images checked");
    assert!(images > STEPS.len() * 3);
}

#[test]
fn every_pair_of_operations_with_and_without_fsync_between() {
    let mut images = 0;
    for (i, a) in STEPS.iter().enumerate() {
        for (j, b) in STEPS.iter().enumerate() {
            let w = match (i + j) % 3 {
                0 => vec![*a, Step::Fsync("/foo"), *b],
                _ => vec![*a, *b],
            };
            images += check(&w, Duration::from_secs(3600), (i * 100 + j) as u64);
        }
    }
    eprintln!("{images} crash images checked");
}

#[test]
fn random_workloads_of_three_and_four_with_background_commits() {
    let seed = std::env::var("LANEFS_SEED")
        .ok()
        .map(|s| s.parse().unwrap())
        .unwrap_or_else(rand::random);
    eprintln!("crash workloads seed {seed} (LANEFS_SEED={seed} replays)");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut images = 0;
    for round in 0..60 {
        let n = rng.random_range(3..=4);
        let mut w = Vec::new();
        for _ in 0..n {
            w.push(STEPS[rng.random_range(0..STEPS.len())]);
            if rng.random_bool(0.3) {
                w.push(Step::Fsync(["/", "/foo", "/A"][rng.random_range(0..3)]));
            }
        }
        // Half the rounds also commit in the background between steps.
        let interval = match round % 2 {
            0 => Duration::from_secs(3600),
            _ => Duration::from_micros(200),
        };
        images += check(&w, interval, seed ^ round);
    }
    eprintln!("{images} crash images checked");
}
