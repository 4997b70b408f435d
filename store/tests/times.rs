//! Times stamped by changes that share no lock (engine/src/time.rs, "Times that changes
//! stamp"): creates and removes of different names in one directory, links of one file from
//! two directories. Their times must never go backwards, and a store reopened after them, from
//! its journal or from a checkpoint, must hold the very times the live filesystem had.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use common::host_opts;
use lanefs::{Attr, Config, Ctx, Filesystem, Timespec};
use lanefs_store::{Options, open};

/// Small segments and frequent checkpoints, so that rounds reopen from checkpoints whose
/// windows absorbed short-lived files, as well as from the journal.
fn opts() -> Options {
    Options {
        checkpoint_records: 2000,
        checkpoint_segments: 1,
        checkpoint_poll: Duration::from_millis(20),
        ..host_opts(1 << 20, Duration::from_millis(2))
    }
}

fn dir(fs: &Filesystem, name: &[u8]) -> Attr {
    let ctx = Ctx::root();
    fs.mkdir(&ctx, fs.root(), name, 0o755)
        .or_else(|_| fs.lookup(&ctx, fs.root(), name))
        .unwrap()
}

/// The times of `/d`, `/x`, `/y` and `/x/f`.
fn times(fs: &Filesystem) -> BTreeMap<&'static str, (Timespec, Timespec)> {
    let ctx = Ctx::root();
    let mut m = BTreeMap::new();
    for name in ["d", "x", "y"] {
        let a = fs.lookup(&ctx, fs.root(), name.as_bytes()).unwrap();
        m.insert(name, (a.mtime, a.ctime));
    }
    let x = fs.lookup(&ctx, fs.root(), b"x").unwrap();
    let f = fs.lookup(&ctx, x.ino, b"f").unwrap();
    m.insert("x/f", (f.mtime, f.ctime));
    m
}

/// Six threads create and remove names of their own in `/d`; two link `/x/f` into `/y` and
/// `/x` and unlink those names again; a watcher checks that `/d`'s mtime and `/x/f`'s ctime
/// never go backwards. Returns how many times they did.
fn race(fs: &Filesystem, how_long: Duration) -> u64 {
    let ctx = Ctx::root();
    let (d, x, y) = (dir(fs, b"d"), dir(fs, b"x"), dir(fs, b"y"));
    let f = fs
        .mknod(&ctx, x.ino, b"f", libc::S_IFREG | 0o644, 0)
        .or_else(|_| fs.lookup(&ctx, x.ino, b"f"))
        .unwrap();
    let stop = AtomicBool::new(false);
    let backwards = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..8u32 {
            let (stop, d, x, y, f) = (&stop, &d, &x, &y, &f);
            s.spawn(move || {
                let ctx = Ctx::root();
                let mut i = 0u64;
                while !stop.load(Relaxed) {
                    let name = format!("t{t}-{}", i % 64).into_bytes();
                    if t < 6 {
                        fs.mknod(&ctx, d.ino, &name, libc::S_IFREG | 0o644, 0)
                            .unwrap();
                        fs.unlink(&ctx, d.ino, &name).unwrap();
                    } else {
                        let to = if t == 6 { y.ino } else { x.ino };
                        fs.link(&ctx, f.ino, to, &name).unwrap();
                        fs.unlink(&ctx, to, &name).unwrap();
                    }
                    i += 1;
                }
            });
        }
        let (stop, backwards, d, f) = (&stop, &backwards, &d, &f);
        s.spawn(move || {
            let end = Instant::now() + how_long;
            let (mut dm, mut fc) = (Timespec::default(), Timespec::default());
            while Instant::now() < end {
                let (dm2, fc2) = (
                    fs.getattr(d.ino).unwrap().mtime,
                    fs.getattr(f.ino).unwrap().ctime,
                );
                if dm2 < dm || fc2 < fc {
                    backwards.fetch_add(1, Relaxed);
                }
                (dm, fc) = (dm.max(dm2), fc.max(fc2));
            }
            stop.store(true, Relaxed);
        });
    });
    backwards.load(Relaxed)
}

fn reopen_round(path: &Path, round: u32) {
    let o = open(path, Config::default(), opts()).unwrap();
    let backwards = race(&o.fs, Duration::from_millis(400));
    assert_eq!(backwards, 0, "round {round}: a time went backwards");
    let live = times(&o.fs);
    if round % 2 == 1 {
        // Everything in a checkpoint: the reopen loads the times the checkpointer wrote.
        o.store.checkpoint().unwrap();
    }
    let lanefs_store::Opened { fs, store, .. } = o;
    store.close().unwrap();
    drop(fs);
    let o = open(path, Config::default(), opts()).unwrap();
    assert_eq!(
        times(&o.fs),
        live,
        "round {round}: times after a clean reopen differ from the live ones"
    );
    o.store.close().unwrap();
}

#[test]
fn concurrent_changes_leave_the_same_times_live_and_after_reopen() {
    let tmp = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    let path = tmp.path().join("store");
    for round in 0..6 {
        reopen_round(&path, round);
    }
}

#[test]
fn a_change_moves_a_time_set_far_ahead_back_to_now() {
    let tmp = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    let o = open(&tmp.path().join("store"), Config::default(), opts()).unwrap();
    let (fs, ctx) = (&o.fs, Ctx::root());
    let d = dir(fs, b"d");
    let ahead = Timespec::new(Timespec::now().sec + 3600, 0);
    let set = lanefs::SetAttr {
        mtime: Some(lanefs::TimeSet::At(ahead)),
        ..Default::default()
    };
    fs.setattr(&ctx, d.ino, &set, None).unwrap();
    assert_eq!(fs.getattr(d.ino).unwrap().mtime, ahead);
    fs.mknod(&ctx, d.ino, b"n", libc::S_IFREG | 0o644, 0)
        .unwrap();
    let now = fs.getattr(d.ino).unwrap().mtime;
    assert!(
        now < ahead,
        "a create leaves an mtime an hour ahead: {now:?}"
    );
    let lanefs_store::Opened { fs, store, .. } = o;
    store.close().unwrap();
    drop(fs);
    let o = open(&tmp.path().join("store"), Config::default(), opts()).unwrap();
    let d = o.fs.lookup(&ctx, o.fs.root(), b"d").unwrap();
    assert_eq!(d.mtime, now);
    o.store.close().unwrap();
}
