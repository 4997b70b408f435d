//! Checkpoints (store/src/checkpoint): a store whose journal was folded into its checkpoint
//! (by the background checkpointer, racing the workload, and by `StoreHandle::checkpoint`)
//! reopens to exactly the filesystem it served (tree, inode numbers, generations, cookies,
//! attributes, times, contents, holes, xattrs, ACLs, flags, `O_TMPFILE` files named),
//! orphans included; the journal segments it covers are gone; a power cut anywhere in a
//! checkpoint loses nothing; files made and freed (or renamed and freed) within a checkpoint
//! leave their directories' times and cookies.
//!
//! Then, written from the public API and the contract only: differential checks of a
//! checkpointed and reopened store against the live filesystem (every record kind, random
//! work with concurrent checkpoints and syncs), power cuts at flushes while checkpoints race
//! a workload, reopen cycles that never repeat a generation or a cookie, damage to
//! `checkpoint.redb` and to the journal after it (refused naming the file, or the same
//! filesystem; fsck and repair), and checkpoints on a host that is full or fails.
//!
//! Random tests print their seed; `LANEFS_SEED=<n>` replays one.

mod common;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::time::Duration;

use common::{
    PowerCuts, Tree, assert_same_tree, cookie_of, dump, host_opts, journal_idle, named_user_acl,
    on_demand, opts, seed, tree_diff,
};
use lanefs::{
    Client, Config, Ctx, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FS_APPEND_FL, FS_IMMUTABLE_FL,
    FS_NOATIME_FL, FS_NODUMP_FL, Filesystem, OpenOptions, RENAME_EXCHANGE, RENAME_WHITEOUT,
    SetAttr,
};
use lanefs_store::disk::{SimDisk, SyncPoint, Unflushed};
use lanefs_store::{Opened, Options, StoreError, StoreHandle, fsck, open};
use parking_lot::Mutex;
use rand::{Rng, SeedableRng, rngs::StdRng};

/// The commit interval of the stores of [`eager`].
const COMMIT_EAGER: Duration = Duration::from_millis(5);
/// The commit interval of the others.
const COMMIT: Duration = Duration::from_millis(2);
/// Where the stores on a simulated disk live.
const DIR: &str = "/s";

/// `o` with a busy checkpointer: a checkpoint every few hundred records.
fn eager(o: Options) -> Options {
    Options {
        checkpoint_records: 300,
        checkpoint_segments: 3,
        ..o
    }
}

/// The store at /s on `disk` with a busy checkpointer ([`eager`]), opened.
fn open_eager(disk: &SimDisk) -> Opened {
    let o = eager(opts(disk, 64 << 10, COMMIT_EAGER));
    open(Path::new("/s"), Config::default(), o).unwrap()
}

/// The journal's segments in a store on the host (not those kept for reuse, `.free`).
fn seg_files(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("journal"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "seg")
        })
        .count()
}

/// Two changes to one inode's times that share no lock (creates of two names in one
/// directory, an unlink of one name and a chmod) are replayed in the order they were
/// appended, which may put the earlier stamp last (docs/RECORDS.md, "Order"): after threads
/// raced over the tree at `dir`, one change of each inode's times from this thread makes
/// its last time the same live and replayed (a file made and removed in each directory, a
/// chmod to the same mode of each file, each symlink renamed away and back).
fn settle_times(c: &Client, dir: &str) {
    c.write(format!("{dir}/settle"), b"").unwrap();
    c.remove_file(format!("{dir}/settle")).unwrap();
    for e in c.read_dir(dir).unwrap() {
        let name = String::from_utf8(e.name).unwrap();
        let p = format!("{}/{name}", dir.trim_end_matches('/'));
        let m = c.symlink_metadata(&p).unwrap();
        if m.is_dir() {
            settle_times(c, &p);
        } else if m.is_symlink() {
            c.rename(&p, format!("{p}.settle")).unwrap();
            c.rename(format!("{p}.settle"), &p).unwrap();
        } else {
            c.set_permissions(&p, m.mode() & 0o7777).unwrap();
        }
    }
}

/// Random changes of every kind the records have, from several threads over a small tree;
/// then the times the threads raced over settled ([`settle_times`]).
fn churn(fs: &Arc<lanefs::Filesystem>, threads: u64, ops: usize, seed: u64) {
    let c = Client::root(fs.clone());
    for d in 0..3 {
        let _ = c.create_dir(format!("/d{d}"));
    }
    churn_threads(fs, threads, ops, seed);
    settle_times(&c, "/");
}

fn churn_threads(fs: &Arc<lanefs::Filesystem>, threads: u64, ops: usize, seed: u64) {
    std::thread::scope(|s| {
        for t in 0..threads {
            let fs = fs.clone();
            s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ (t * 0x9E37_79B9));
                let c = Client::root(fs.clone());
                let ctx = Ctx::root();
                for _ in 0..ops {
                    let p = |rng: &mut StdRng| {
                        format!("/d{}/n{}", rng.random_range(0..3), rng.random_range(0..16))
                    };
                    let (a, b) = (p(&mut rng), p(&mut rng));
                    let off = rng.random_range(0..20_000u64);
                    let len = rng.random_range(0..9000u64);
                    let _ = match rng.random_range(0..23) {
                        0..=2 => c.write(&a, vec![t as u8 + 1; len as usize]),
                        3 => c
                            .open(&a, OpenOptions::new().write(true))
                            .and_then(|f| f.write_at(&[7u8; 100], off).map(drop)),
                        4 => c.remove_file(&a),
                        5 => c.rename(&a, &b),
                        6 => c.rename_with_flags(&a, &b, RENAME_EXCHANGE),
                        7 => c.hard_link(&a, &b),
                        8 => c.create_dir(&a),
                        9 => c.remove_dir(&a),
                        10 => c.set_permissions(&a, rng.random_range(0..0o777)),
                        11 => c.symlink(&b, &a),
                        12 => c
                            .open(&a, OpenOptions::new().write(true))
                            .and_then(|f| f.set_len(off)),
                        13 => c.metadata(&a).and_then(|m| {
                            fs.setxattr(&ctx, m.ino(), b"user.t", &[t as u8; 3], 0)
                                .map_err(Into::into)
                        }),
                        14 => c.metadata(&a).and_then(|m| {
                            fs.removexattr(&ctx, m.ino(), b"user.t").map_err(Into::into)
                        }),
                        15 => c.metadata(&a).and_then(|m| {
                            let acl = named_user_acl(1000 + t as u32, 6, 7);
                            fs.setxattr(&ctx, m.ino(), b"system.posix_acl_access", &acl, 0)
                                .map_err(Into::into)
                        }),
                        16 => c.open(&a, OpenOptions::new().write(true)).and_then(|f| {
                            let mode = if rng.random_bool(0.5) {
                                libc::FALLOC_FL_KEEP_SIZE
                            } else {
                                0
                            };
                            fs.fallocate(&ctx, f.handle(), mode, off, len)
                                .map_err(Into::into)
                        }),
                        17 => c.open(&a, OpenOptions::new().write(true)).and_then(|f| {
                            fs.fallocate(
                                &ctx,
                                f.handle(),
                                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                                off,
                                len,
                            )
                            .map_err(Into::into)
                        }),
                        18 => c.set_flags(&a, lanefs::FS_NODUMP_FL),
                        19 => c.metadata(&a).and_then(|m| {
                            let set = SetAttr {
                                uid: Some(rng.random_range(0..3)),
                                ..SetAttr::default()
                            };
                            fs.setattr(&ctx, m.ino(), &set, None)
                                .map(drop)
                                .map_err(Into::into)
                        }),
                        20 => c
                            .create_dir(format!("{a}x"))
                            .and_then(|()| c.rename(format!("{a}x"), &b)),
                        21 => {
                            // An O_TMPFILE file, written, then named a (when a is free)
                            // or closed unnamed.
                            let dir = &a[..a.rfind('/').unwrap()];
                            c.open_tmpfile(dir, OpenOptions::new().write(true))
                                .and_then(|f| {
                                    f.write_at(&vec![t as u8 + 1; len as usize], off)?;
                                    if rng.random_bool(0.8) {
                                        c.link_file(&f, &a)?;
                                    }
                                    Ok(())
                                })
                        }
                        _ => c.metadata(&a).map(drop),
                    };
                }
            });
        }
    });
}

#[test]
fn a_checkpointed_store_reopens_to_the_same_filesystem() {
    let dir = tempfile::tempdir().unwrap();
    let seed = seed::seed("a_checkpointed_store_reopens_to_the_same_filesystem");
    let o = open(
        dir.path(),
        Config::default(),
        eager(host_opts(64 << 10, COMMIT_EAGER)),
    )
    .unwrap();
    let fs = Arc::new(o.fs);
    for round in 0..3 {
        churn(&fs, 3, 1200, seed ^ round);
        o.store.checkpoint().unwrap();
    }
    let lsn = o.store.checkpoint_lsn();
    assert!(lsn > 1000, "checkpoints were taken: {lsn}");
    // The segments the checkpoint covers are gone: the one being written and its spare are left.
    assert!(
        seg_files(dir.path()) <= 2,
        "{} segments",
        seg_files(dir.path())
    );
    // A tail after the checkpoint, which reopening replays.
    churn(&fs, 2, 400, seed ^ 7);
    let before = dump(&fs, true);
    assert!(before.len() > 15, "{}", before.len());
    drop(fs);
    o.store.close().unwrap();
    let o = open(
        dir.path(),
        Config::default(),
        eager(host_opts(64 << 10, COMMIT_EAGER)),
    )
    .unwrap();
    assert!(
        o.report.lazy && o.report.checkpoint_lsn > 0,
        "{:?}",
        o.report
    );
    assert!(o.report.checkpoint_lsn >= lsn, "{:?}", o.report);
    assert!(o.report.replayed > 0, "{:?}", o.report);
    let after = dump(&o.fs, true);
    assert_same_tree(&format!("seed {seed}: reopened"), &before, &after);
    o.fs.check_invariants().unwrap();
    // fsck agrees, and the store goes on from the checkpoint.
    let fs = Arc::new(o.fs);
    churn(&fs, 2, 300, seed ^ 9);
    let before = dump(&fs, true);
    drop(fs);
    drop(o.store);
    let r = lanefs_store::fsck::check(dir.path(), &Options::default()).unwrap();
    assert!(r.checkpoint_lsn > 0, "{r:?}");
    let o = open(dir.path(), Config::default(), Options::default()).unwrap();
    assert_same_tree(
        &format!("seed {seed}: second reopen"),
        &before,
        &dump(&o.fs, true),
    );
}

#[test]
fn a_file_open_when_its_last_name_went_survives_the_checkpoint_until_freed() {
    let disk = SimDisk::new();
    let o = open_eager(&disk);
    let fs = Arc::new(o.fs);
    let c = Client::root(fs.clone());
    c.write("/keep", b"kept").unwrap();
    let f = c
        .open("/gone", OpenOptions::new().write(true).create(true))
        .unwrap();
    f.write_at(b"abc", 0).unwrap();
    c.remove_file("/gone").unwrap();
    o.store.checkpoint().unwrap();
    // Records after the checkpoint change the orphan; the crash comes before its Free.
    f.write_at(b"more", 10_000).unwrap();
    f.sync_all().unwrap();
    let image = disk.crash(Unflushed::Lost);
    let o2 = open_eager(&image);
    assert!(o2.report.checkpoint_lsn > 0, "{:?}", o2.report);
    assert_eq!(
        o2.report.replayed, 1,
        "the write to the orphan: {:?}",
        o2.report
    );
    let c2 = Client::root(Arc::new(o2.fs));
    assert_eq!(c2.read("/keep").unwrap(), b"kept");
    assert!(c2.metadata("/gone").is_err());
    let st = c2.fs().statfs();
    assert_eq!(
        st.files - st.ffree,
        2,
        "root and /keep: the orphan was freed"
    );
    drop(f);
    drop(c);
    drop(fs);
}

#[test]
fn generations_stay_unique_across_checkpoints() {
    let disk = SimDisk::new();
    let o = open_eager(&disk);
    let c = Client::root(Arc::new(o.fs));
    let mut highest = 0;
    for i in 0..50 {
        c.write(format!("/f{i}"), b"x").unwrap();
        highest = highest.max(
            c.fs()
                .getattr(c.metadata(format!("/f{i}")).unwrap().ino())
                .unwrap()
                .generation
                .0,
        );
        c.remove_file(format!("/f{i}")).unwrap();
    }
    o.store.checkpoint().unwrap();
    drop(c);
    o.store.close().unwrap();
    let o = open_eager(&disk);
    let c = Client::root(Arc::new(o.fs));
    c.write("/new", b"y").unwrap();
    let g = c
        .fs()
        .getattr(c.metadata("/new").unwrap().ino())
        .unwrap()
        .generation
        .0;
    assert!(g > highest, "generation {g} after freed {highest}");
}

#[test]
fn a_power_cut_anywhere_in_a_checkpoint_loses_nothing() {
    let seed = seed::seed("a_power_cut_anywhere_in_a_checkpoint_loses_nothing");
    let disk = SimDisk::new();
    let opts = on_demand(eager(opts(&disk, 64 << 10, COMMIT_EAGER)));
    let o = open(Path::new("/s"), Config::default(), opts.clone()).unwrap();
    let fs = Arc::new(o.fs);
    churn(&fs, 2, 500, seed);
    o.store.sync().unwrap();
    let want = dump(&fs, true);
    let ways = |_, at| match at {
        SyncPoint::Before => vec![Unflushed::Lost, Unflushed::Torn(7)],
        SyncPoint::After => vec![Unflushed::Kept],
    };
    let cuts = PowerCuts::start(&disk, ways, || ());
    o.store.checkpoint().unwrap();
    let images = cuts.take();
    assert!(
        images.len() >= 6,
        "the checkpoint flushes: {}",
        images.len()
    );
    for (k, image) in images.into_iter().enumerate() {
        let mut o = opts.clone();
        o.disk = Arc::new(image.disk.clone());
        let r = open(Path::new("/s"), Config::default(), o)
            .unwrap_or_else(|e| panic!("image {k}: {e}"));
        let what = format!("seed {seed}: image {k} ({})", image.label());
        assert_same_tree(&what, &want, &dump(&r.fs, true));
        r.fs.check_invariants().unwrap();
    }
    drop(fs);
}

#[test]
fn a_damaged_or_missing_checkpoint_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let o = open(
        dir.path(),
        Config::default(),
        eager(host_opts(64 << 10, COMMIT_EAGER)),
    )
    .unwrap();
    let fs = Arc::new(o.fs);
    churn(&fs, 2, 800, 1);
    o.store.checkpoint().unwrap();
    drop(fs);
    o.store.close().unwrap();
    let ck = dir.path().join("checkpoint.redb");
    let good = std::fs::read(&ck).unwrap();
    let seed = seed::seed("a_damaged_or_missing_checkpoint_is_refused_naming_it");
    let mut rng = StdRng::seed_from_u64(seed);
    for _ in 0..20 {
        let mut bad = good.clone();
        for _ in 0..8 {
            let at = rng.random_range(0..bad.len());
            bad[at] ^= 1 << rng.random_range(0..8);
        }
        std::fs::write(&ck, &bad).unwrap();
        // Either the flips hit bytes redb does not use (the same filesystem comes back), or
        // the open fails naming the checkpoint; never a panic, never another filesystem.
        // Opened whole: its integrity check is what refuses the damage.
        let whole = Options {
            lazy: false,
            ..Options::default()
        };
        match open(dir.path(), Config::default(), whole) {
            Ok(o) => {
                o.fs.check_invariants().unwrap();
            }
            Err(StoreError::Damaged { path, .. }) => assert_eq!(path, ck),
            Err(e) => panic!("{e}"),
        }
    }
    std::fs::write(&ck, &good).unwrap();
    assert!(
        !dir.path().join("journal/0000000000000001.seg").exists(),
        "the checkpoint covers the first segment, which is gone"
    );
    std::fs::remove_file(&ck).unwrap();
    match open(dir.path(), Config::default(), Options::default()) {
        Err(StoreError::Damaged { path, what, .. }) => {
            assert_eq!(path, ck);
            assert!(what.contains("missing"), "{what}");
        }
        Ok(_) => panic!("opened without its checkpoint"),
        Err(e) => panic!("{e}"),
    }
}

/// The cookie of `name` in directory `dir` (a path), as a listing gives it.
fn cookie_in(fs: &Arc<lanefs::Filesystem>, dir: &str, name: &[u8]) -> u64 {
    let ino = Client::root(fs.clone()).metadata(dir).unwrap().ino();
    cookie_of(fs, ino, name)
}

/// Takes a checkpoint of the store at /s, closes it, and opens it again from the checkpoint
/// alone (no record replayed): its handle, filesystem and a client of it.
fn reopen_from_checkpoint(
    store: StoreHandle,
    c: Client,
    fs: Arc<lanefs::Filesystem>,
    opts: Options,
) -> (StoreHandle, Arc<lanefs::Filesystem>, Client) {
    store.checkpoint().unwrap();
    drop(c);
    drop(fs);
    store.close().unwrap();
    let o = open(Path::new("/s"), Config::default(), opts).unwrap();
    assert_eq!(
        o.report.replayed, 0,
        "all from the checkpoint: {:?}",
        o.report
    );
    let fs = Arc::new(o.fs);
    let c = Client::root(fs.clone());
    (o.store, fs, c)
}

/// Files made and freed within one checkpoint put nothing of themselves in it (the
/// checkpointer skips their records), but what they did to their directory stays: its
/// times (the remove's, a tick after the create's), and the cookies they used, which are not
/// handed out again after a reopen from the checkpoint alone. Beside them a file made in one
/// checkpoint and freed in the next, and a ghost with data and an xattr.
#[test]
fn files_made_and_freed_within_a_checkpoint_leave_their_directory_as_it_was() {
    let disk = SimDisk::new();
    let manual = || on_demand(eager(opts(&disk, 64 << 10, COMMIT_EAGER)));
    let o = open(Path::new("/s"), Config::default(), manual()).unwrap();
    let fs = Arc::new(o.fs);
    let c = Client::root(fs.clone());
    c.create_dir("/d").unwrap();
    c.create_dir("/e").unwrap();
    c.write("/d/keep", b"k").unwrap();
    c.write("/d/later", b"l").unwrap();
    o.store.checkpoint().unwrap();

    // In /e a ghost's remove, then (a tick later) a create that stays: /e's times are the
    // create's, not the ghost's.
    c.write("/e/ghost", b"").unwrap();
    c.remove_file("/e/ghost").unwrap();
    std::thread::sleep(Duration::from_millis(30));
    c.write("/e/stays", b"").unwrap();
    let e = c.metadata("/e").unwrap().ino();
    let want_e = fs.getattr(e).unwrap();

    c.write("/d/ghost", b"boo").unwrap();
    let g = c.metadata("/d/ghost").unwrap().ino();
    fs.setxattr(&Ctx::root(), g, b"user.x", b"v", 0).unwrap();
    let ghost = cookie_in(&fs, "/d", b"ghost");
    c.remove_file("/d/later").unwrap();
    std::thread::sleep(Duration::from_millis(30)); // the remove's time: a later tick
    c.remove_file("/d/ghost").unwrap();
    let d = c.metadata("/d").unwrap().ino();
    let want = fs.getattr(d).unwrap();
    let (_store, fs, c) = reopen_from_checkpoint(o.store, c, fs, manual());
    let got = fs.getattr(d).unwrap();
    assert_eq!(
        (got.mtime, got.ctime, got.nlink),
        (want.mtime, want.ctime, want.nlink),
        "the directory's times after the ghost's remove"
    );
    let got_e = fs.getattr(e).unwrap();
    assert_eq!(
        (got_e.mtime, got_e.ctime),
        (want_e.mtime, want_e.ctime),
        "the times of a create after a ghost's remove"
    );
    let names: Vec<_> = c
        .read_dir("/d")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, [b"keep".to_vec()]);
    let st = fs.statfs();
    assert_eq!(st.files - st.ffree, 5, "root, /d, /e, /d/keep and /e/stays");
    c.write("/d/new", b"n").unwrap();
    let new = cookie_in(&fs, "/d", b"new");
    assert!(new > ghost, "cookie {new} after the ghost's {ghost}");
    fs.check_invariants().unwrap();
}

/// Files renamed before they are freed, within one checkpoint, are absorbed too (their
/// renames replace nothing): across directories, within one, through a directory removed
/// after they left it. What they did to the directories stays; a file renamed over another
/// is an ordinary one and is applied, and so is the file it replaced.
#[test]
fn files_renamed_and_freed_within_a_checkpoint_leave_their_directories_as_they_were() {
    let disk = SimDisk::new();
    let manual = || on_demand(eager(opts(&disk, 64 << 10, COMMIT_EAGER)));
    let o = open(Path::new("/s"), Config::default(), manual()).unwrap();
    let fs = Arc::new(o.fs);
    let c = Client::root(fs.clone());
    for d in ["/a", "/b", "/c", "/d", "/a/sub"] {
        c.create_dir(d).unwrap();
    }
    c.write("/c/keep", b"old").unwrap();
    o.store.checkpoint().unwrap();
    let tick = || std::thread::sleep(Duration::from_millis(20));

    c.write("/a/g1", b"one").unwrap();
    tick();
    c.rename("/a/g1", "/b/g1x").unwrap();
    tick();
    c.rename("/b/g1x", "/b/g1y").unwrap();
    let renamed = cookie_in(&fs, "/b", b"g1y");
    tick();
    c.remove_file("/b/g1y").unwrap();
    tick();
    c.write("/a/sub/g3", b"three").unwrap();
    c.rename("/a/sub/g3", "/c/g3").unwrap();
    tick();
    c.remove_dir("/a/sub").unwrap();
    tick();
    c.write("/c/tmp", b"new").unwrap();
    c.rename("/c/tmp", "/c/keep").unwrap();
    tick();
    c.remove_file("/c/g3").unwrap();
    // The last change of /d is a ghost leaving it.
    c.write("/d/g4", b"").unwrap();
    tick();
    c.rename("/d/g4", "/b/g4").unwrap();
    tick();
    c.remove_file("/b/g4").unwrap();
    let want: Vec<_> = ["/a", "/b", "/c", "/d"]
        .iter()
        .map(|d| {
            let a = c.metadata(d).unwrap();
            let a = fs.getattr(a.ino()).unwrap();
            (a.mtime, a.ctime, a.nlink)
        })
        .collect();
    let (_store, fs, c) = reopen_from_checkpoint(o.store, c, fs, manual());
    let got: Vec<_> = ["/a", "/b", "/c", "/d"]
        .iter()
        .map(|d| {
            let a = fs.getattr(c.metadata(d).unwrap().ino()).unwrap();
            (a.mtime, a.ctime, a.nlink)
        })
        .collect();
    assert_eq!(got, want, "the directories' times and links");
    let names =
        |d: &str| -> Vec<Vec<u8>> { c.read_dir(d).unwrap().into_iter().map(|e| e.name).collect() };
    assert_eq!(names("/a"), Vec::<Vec<u8>>::new());
    assert_eq!(names("/b"), Vec::<Vec<u8>>::new());
    assert_eq!(names("/c"), [b"keep".to_vec()]);
    assert_eq!(c.read("/c/keep").unwrap(), b"new");
    let st = fs.statfs();
    assert_eq!(st.files - st.ffree, 6, "root, /a, /b, /c, /d and /c/keep");
    c.write("/b/new", b"n").unwrap();
    let new = cookie_in(&fs, "/b", b"new");
    assert!(
        new > renamed,
        "cookie {new} after the renamed ghost's {renamed}"
    );
    fs.check_invariants().unwrap();
}

// ----- from the contract: every record kind, random work, damage, a full or failing host ----

/// On `disk`, segments of `segment` bytes and a checkpoint due after `records` records or
/// `segments` segments.
fn checkpointing(disk: &SimDisk, segment: u64, records: u64, segments: usize) -> Options {
    Options {
        checkpoint_records: records,
        checkpoint_segments: segments,
        ..opts(disk, segment, COMMIT)
    }
}

/// Manual checkpoints only.
fn manual(disk: &SimDisk) -> Options {
    on_demand(opts(disk, 16 << 10, COMMIT))
}

fn reopen(o: Options) -> Opened {
    open(Path::new(DIR), Config::default(), o).unwrap()
}

/// `fs` (a reopened store's) holds exactly the tree `want`; else the test fails saying `what`
/// and how they differ.
fn assert_holds(want: &Tree, fs: &Filesystem, what: &str) {
    let back = dump(fs, true);
    assert!(*want == back, "{what}:\n{}", tree_diff(want, &back));
}

/// Closes the store on `disk` (its client, filesystem and handle), checks it (fsck) and opens
/// it again: it holds the checkpoint at `lsn` and exactly the tree `live` (seed `seed`).
fn close_and_reopen_holding(
    disk: &SimDisk,
    (c, fs, store): (Client, Arc<Filesystem>, StoreHandle),
    lsn: u64,
    live: &Tree,
    seed: u64,
) {
    drop(c);
    drop(fs);
    store.close().unwrap();
    fsck::check(Path::new(DIR), &manual(disk)).unwrap();
    let o = reopen(manual(disk));
    assert_eq!(o.report.checkpoint_lsn, lsn, "seed {seed}");
    assert_holds(live, &o.fs, &format!("seed {seed}: reopened differs"));
}

fn inodes(fs: &Filesystem) -> u64 {
    let s = fs.statfs();
    s.files - s.ffree
}

fn ck(o: &Opened) -> u64 {
    o.store.checkpoint().unwrap()
}

fn fd(c: &Client, p: &str) -> lanefs::Fh {
    // Leaked on purpose for the scripted test: the handle lives as long as the filesystem.
    let f = c
        .open(p, OpenOptions::new().read(true).write(true).create(true))
        .unwrap();
    let h = f.handle();
    std::mem::forget(f);
    h
}

/// Every record kind, with checkpoints between the phases and a journal tail after the last:
/// the reopened store dumps exactly as the live one (times, cookies, blocks, xattrs, flags).
#[test]
fn every_record_kind_survives_checkpoint_and_reopen() {
    scripted(true);
}

/// The same without the unlinked-open file (so that the other record kinds are judged even
/// while the orphan finding stands).
#[test]
fn every_record_kind_but_orphans_survives_checkpoint_and_reopen() {
    scripted(false);
}

/// Minimal: a file unlinked while open, a checkpoint, then a create in the same directory
/// from the same thread; close normally. Opening (and fsck) must work.
#[test]
fn orphan_in_checkpoint_then_create_reopens() {
    let disk = SimDisk::new();
    let o = reopen(manual(&disk));
    let c = Client::root(Arc::new(o.fs));
    let f = c
        .open("/tmp", OpenOptions::new().write(true).create(true))
        .unwrap();
    c.remove_file("/tmp").unwrap();
    o.store.checkpoint().unwrap();
    c.write("/after", b"x").unwrap();
    drop(f);
    drop(c);
    o.store.close().unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        fsck::check(Path::new(DIR), &manual(&disk))
    }));
    assert!(
        matches!(r, Ok(Ok(_))),
        "fsck check: {:?}",
        r.map_err(|_| "panicked")
    );
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        open(Path::new(DIR), Config::default(), manual(&disk))
            .map(|o| Client::root(Arc::new(o.fs)).read("/after").unwrap())
    }));
    assert!(
        matches!(&r, Ok(Ok(v)) if v == b"x"),
        "open: {:?}",
        r.map_err(|_| "panicked")
    );
}

fn scripted(with_orphan: bool) {
    let disk = SimDisk::new();
    let o = reopen(manual(&disk));
    let fs = Arc::new(o.fs);
    let c = Client::root(fs.clone());
    let ctx = c.ctx().clone();
    let page = 4096u64;
    // Phase 1: a tree.
    for d in [
        "/a",
        "/b",
        "/a/sub",
        "/b/victim",
        "/b/sub2",
        "/acl",
        "/flags",
    ] {
        c.create_dir(d).unwrap();
    }
    c.write("/a/sub/inner", b"inner").unwrap();
    c.write("/a/x", b"file x").unwrap();
    c.write("/a/holes", b"").unwrap();
    {
        let f = c.open("/a/holes", OpenOptions::new().write(true)).unwrap();
        f.write_at(b"far", 10 * page + 5).unwrap();
        f.write_at(&[7u8; 100], page - 50).unwrap();
    }
    c.symlink("/a/x", "/a/link").unwrap();
    c.mknod("/a/fifo", libc::S_IFIFO | 0o640, 0).unwrap();
    c.mknod("/a/chr", libc::S_IFCHR | 0o600, 0x0501).unwrap();
    fs.check_invariants().unwrap();
    let stage_o = &o.store;
    assert!(stage_o.checkpoint().unwrap() > 0);
    // Phase 2: renames.
    c.rename("/a/sub", "/b/victim").unwrap(); // directory over an empty directory, across
    c.rename_with_flags("/a/x", "/b/sub2", RENAME_EXCHANGE)
        .unwrap(); // file <-> dir, across
    c.write("/b/w", b"whiteout me").unwrap();
    c.rename_with_flags("/b/w", "/a/w2", RENAME_WHITEOUT)
        .unwrap();
    c.write("/a/over", b"old").unwrap();
    c.write("/b/over2", b"new").unwrap();
    c.rename("/b/over2", "/a/over").unwrap(); // file over file, across
    stage_o.checkpoint().unwrap();
    // Phase 3: hard links, unlinked in another order than made.
    c.write("/a/h1", b"linked").unwrap();
    c.hard_link("/a/h1", "/b/h2").unwrap();
    c.hard_link("/a/h1", "/b/h3").unwrap();
    c.hard_link("/b/h2", "/a/h4").unwrap();
    c.remove_file("/a/h1").unwrap();
    stage_o.checkpoint().unwrap();
    c.remove_file("/b/h3").unwrap();
    // Phase 4: an unlinked file that stays open, written after checkpoints.
    let tmp_name = if with_orphan { "/a/tmp" } else { "/a/tmpkept" };
    let tmp = c
        .open(
            tmp_name,
            OpenOptions::new().read(true).write(true).create(true),
        )
        .unwrap();
    tmp.write_at(b"before", 0).unwrap();
    if with_orphan {
        c.remove_file("/a/tmp").unwrap();
    }
    stage_o.checkpoint().unwrap();
    tmp.write_at(b"after the checkpoint", 3 * page).unwrap();
    tmp.set_len(2 * page + 1).unwrap();
    stage_o.checkpoint().unwrap();
    let mut buf = vec![0u8; 6];
    tmp.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, b"before");
    // Phase 5: fallocate beyond EOF, truncation up and down, punches at page edges.
    c.write("/a/fa", vec![1u8; 100]).unwrap();
    let fa = fd(&c, "/a/fa");
    fs.fallocate(&ctx, fa, FALLOC_FL_KEEP_SIZE, 0, 5 * page + 7)
        .unwrap();
    stage_o.checkpoint().unwrap();
    c.truncate("/a/fa", 3 * page + 1).unwrap();
    fs.fallocate(&ctx, fa, FALLOC_FL_KEEP_SIZE, 8 * page, page)
        .unwrap();
    stage_o.checkpoint().unwrap();
    c.truncate("/a/fa", page + 1).unwrap();
    fs.fallocate(&ctx, fa, 0, 2 * page - 3, 10).unwrap();
    c.write("/a/punch", vec![0xABu8; 6 * page as usize])
        .unwrap();
    let pu = fd(&c, "/a/punch");
    let ph = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
    fs.fallocate(&ctx, pu, ph, page, page).unwrap();
    fs.fallocate(&ctx, pu, ph, 3 * page - 1, 2).unwrap();
    fs.fallocate(&ctx, pu, ph, 4 * page + 4095, 1).unwrap();
    fs.fallocate(&ctx, pu, ph, 5 * page, 10 * page).unwrap();
    fs.fallocate(&ctx, pu, ph, 0, 1).unwrap();
    stage_o.checkpoint().unwrap();
    fs.fallocate(&ctx, pu, ph, 2 * page, page).unwrap();
    c.write("/a/trunc", vec![9u8; 3 * page as usize + 11])
        .unwrap();
    c.truncate("/a/trunc", page + 3).unwrap();
    c.truncate("/a/trunc", 4 * page).unwrap();
    // Phase 6: xattrs, ACLs (default on a directory, inherited), flags.
    let xi = c.metadata("/a/fa").unwrap().ino();
    fs.setxattr(&ctx, xi, b"user.a", b"1", 0).unwrap();
    fs.setxattr(&ctx, xi, b"user.b", &[0u8; 300], 0).unwrap();
    stage_o.checkpoint().unwrap();
    fs.removexattr(&ctx, xi, b"user.a").unwrap();
    fs.setxattr(&ctx, xi, b"user.b", b"replaced", 0).unwrap();
    let acl_dir = c.metadata("/acl").unwrap().ino();
    fs.setxattr(
        &ctx,
        acl_dir,
        b"system.posix_acl_default",
        &named_user_acl(1000, 7, 7),
        0,
    )
    .unwrap();
    c.write("/acl/inherits", b"i").unwrap();
    c.create_dir("/acl/subdir").unwrap();
    c.write("/acl/subdir/deeper", b"d").unwrap();
    let ai = c.metadata("/a/holes").unwrap().ino();
    fs.setxattr(
        &ctx,
        ai,
        b"system.posix_acl_access",
        &named_user_acl(77, 6, 4),
        0,
    )
    .unwrap();
    stage_o.checkpoint().unwrap();
    for (n, fl) in [
        ("imm", FS_IMMUTABLE_FL),
        ("app", FS_APPEND_FL),
        ("nodump", FS_NODUMP_FL),
        ("noatime", FS_NOATIME_FL | FS_NODUMP_FL),
    ] {
        c.write(format!("/flags/{n}"), n).unwrap();
        c.set_flags(format!("/flags/{n}"), fl).unwrap();
    }
    c.set_flags("/flags", FS_NOATIME_FL).unwrap();
    c.set_permissions("/b/h2", 0o4755).unwrap();
    c.chown("/b/h2", Some(12), Some(34)).unwrap();
    c.remove_dir("/b/victim/inner").ok(); // a file: refused
    stage_o.checkpoint().unwrap();
    // Phase 7: a journal tail after the last checkpoint.
    c.write("/tail", b"only in the journal").unwrap();
    c.remove_file("/a/fifo").unwrap();
    c.create_dir("/gone").unwrap();
    c.remove_dir("/gone").unwrap();
    tmp.write_at(b"tail write to the orphan", 0).unwrap();
    fs.check_invariants().unwrap();
    let live = dump(&fs, true);
    let live_inodes = inodes(&fs);
    drop(tmp);
    let live_after_close = inodes(&fs);
    assert_eq!(live_after_close + u64::from(with_orphan), live_inodes);
    drop(c);
    let store = o.store;
    store.close().unwrap();
    drop(fs);
    let report = fsck::check(Path::new(DIR), &manual(&disk)).unwrap();
    assert!(report.checkpoint_lsn > 0, "{report:?}");
    let o = reopen(manual(&disk));
    eprintln!("{:?}", o.report);
    assert!(o.report.checkpoint_lsn > 0 && o.report.replayed > 0);
    assert_holds(&live, &o.fs, "reopened differs");
    assert_eq!(inodes(&o.fs), live_after_close);
    o.fs.check_invariants().unwrap();
    // Checkpoint everything and reopen again: all from the checkpoint.
    ck(&o);
    drop(o);
    let o = reopen(manual(&disk));
    assert_holds(&live, &o.fs, "reopened from the checkpoint alone differs");
    assert_eq!(inodes(&o.fs), live_after_close);
    drop(o);
    fsck::check(Path::new(DIR), &manual(&disk)).unwrap();
}

/// A random step of the workload.
fn step(c: &Client, rng: &mut StdRng, t: u64) {
    let fs = c.fs().clone();
    let ctx = c.ctx().clone();
    let p = |rng: &mut StdRng| format!("/d{}/n{}", rng.random_range(0..3), rng.random_range(0..16));
    let (a, b) = (p(rng), p(rng));
    let page = 4096u64;
    let _ = match rng.random_range(0..20) {
        0..=2 => c.write(&a, vec![t as u8 + 1; rng.random_range(0..9000)]),
        3 => c.remove_file(&a),
        4 => c.rename(&a, &b),
        5 => c.rename_with_flags(&a, &b, RENAME_EXCHANGE),
        6 => c.hard_link(&a, &b),
        7 => c.create_dir(&a),
        8 => c.remove_dir(&a),
        9 => c.set_permissions(&a, rng.random_range(0..0o7777)),
        10 => c.truncate(&a, rng.random_range(0..6 * page)),
        11 | 12 => c.open(&a, OpenOptions::new().write(true)).and_then(|f| {
            let (off, len) = (rng.random_range(0..5 * page), rng.random_range(1..3 * page));
            let mode = common::random_falloc_mode(rng);
            fs.fallocate(&ctx, f.handle(), mode, off, len)?;
            Ok(())
        }),
        13 => c.open(&a, OpenOptions::new().write(true)).and_then(|f| {
            f.write_at(b"edge", rng.random_range(0..4) * page + 4094)
                .map(drop)
        }),
        14 => c.metadata(&a).and_then(|m| {
            let v = vec![t as u8; rng.random_range(0..100)];
            fs.setxattr(&ctx, m.ino(), b"user.t", &v, 0)
                .map_err(Into::into)
        }),
        15 => c
            .metadata(&a)
            .and_then(|m| fs.removexattr(&ctx, m.ino(), b"user.t").map_err(Into::into)),
        16 => c.metadata(&a).and_then(|m| {
            let name: &[u8] = if m.is_dir() && rng.random_bool(0.5) {
                b"system.posix_acl_default"
            } else {
                b"system.posix_acl_access"
            };
            fs.setxattr(
                &ctx,
                m.ino(),
                name,
                &named_user_acl(1000 + t as u32, 6, 6),
                0,
            )
            .map_err(Into::into)
        }),
        17 => c.set_flags(
            &a,
            [0, FS_NODUMP_FL, FS_NOATIME_FL, FS_APPEND_FL][rng.random_range(0..4)],
        ),
        18 => c.symlink(&b, &a),
        _ => c.chown(
            &a,
            Some(rng.random_range(0..3)),
            Some(rng.random_range(0..3)),
        ),
    };
}

fn setup_dirs(c: &Client) {
    for d in 0..3 {
        let _ = c.create_dir(format!("/d{d}"));
    }
}

/// Many threads of random work, a background checkpointer with tiny thresholds and tiny
/// segments, and threads calling sync() and checkpoint() at once: the reopened store is the
/// live filesystem.
#[test]
fn random_work_with_concurrent_checkpoints_and_syncs_reopens_identical() {
    let seed = seed::seed("random_work_with_concurrent_checkpoints_and_syncs_reopens_identical");
    let disk = SimDisk::new();
    let o = reopen(checkpointing(&disk, 4096, 64, 2));
    let fs = Arc::new(o.fs);
    setup_dirs(&Client::root(fs.clone()));
    let done = AtomicBool::new(false);
    let cks = AtomicU64::new(0);
    let store = &o.store;
    std::thread::scope(|s| {
        let mut workers = Vec::new();
        for t in 0..4u64 {
            let fs = fs.clone();
            workers.push(s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ (t * 0x9E37_79B9));
                let c = Client::root(fs);
                for k in 0..700 {
                    step(&c, &mut rng, t);
                    if k % 50 == 0 {
                        c.fs().sync_all().unwrap();
                    }
                }
            }));
        }
        for k in 0..3 {
            let (done, cks) = (&done, &cks);
            s.spawn(move || {
                while !done.load(SeqCst) {
                    if k == 0 {
                        store.sync().unwrap();
                    } else {
                        match store.checkpoint() {
                            Ok(_) => {
                                cks.fetch_add(1, SeqCst);
                            }
                            Err(e) => panic!("checkpoint: {e}"),
                        }
                    }
                }
            });
        }
        for w in workers {
            w.join().unwrap();
        }
        done.store(true, SeqCst);
    });
    eprintln!(
        "{} checkpoints, lsn {}",
        cks.load(SeqCst),
        store.checkpoint_lsn()
    );
    fs.check_invariants().unwrap();
    let live = dump(&fs, true);
    let live_inodes = inodes(&fs);
    drop(fs);
    o.store.close().unwrap();
    fsck::check(Path::new(DIR), &manual(&disk)).unwrap();
    let o = reopen(manual(&disk));
    eprintln!("{:?}", o.report);
    assert_holds(&live, &o.fs, &format!("seed {seed}: reopened differs"));
    assert_eq!(inodes(&o.fs), live_inodes, "seed {seed}");
    o.fs.check_invariants().unwrap();
}

/// Power cuts at flushes while a many-threaded workload fsyncs and checkpoints run (the
/// background checkpointer and explicit ones): every image opens, holds every fsynced file,
/// is a prefix per thread, checks clean with fsck and passes the invariant check.
#[test]
fn power_cuts_at_flushes_during_checkpoints_keep_every_fsynced_file() {
    let seed = seed::seed("power_cuts_at_flushes_during_checkpoints_keep_every_fsynced_file");
    let disk = SimDisk::new();
    let o = reopen(checkpointing(&disk, 4096, 40, 2));
    let fs = Arc::new(o.fs);
    setup_dirs(&Client::root(fs.clone()));
    for t in 0..4 {
        Client::root(fs.clone())
            .create_dir(format!("/t{t}"))
            .unwrap();
    }
    fs.sync_all().unwrap();
    // Acknowledged files: (thread, k) -> content.
    let acked: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let n = Arc::new(AtomicU64::new(0));
    let cuts = {
        let (acked, n) = (acked.clone(), n.clone());
        let mut rng = StdRng::seed_from_u64(seed);
        let ways = move |_, at| {
            let k = n.fetch_add(1, SeqCst);
            // Every flush for a while, then a sample, to bound the time.
            if k < 150 || rng.random_range(0..6) == 0 {
                vec![match (k + u64::from(at == SyncPoint::After)) % 3 {
                    0 => Unflushed::Lost,
                    1 => Unflushed::Kept,
                    _ => Unflushed::Torn(seed ^ k),
                }]
            } else {
                vec![]
            }
        };
        PowerCuts::start(&disk, ways, move || acked.lock().clone())
    };
    let done = AtomicBool::new(false);
    let store = &o.store;
    std::thread::scope(|s| {
        let mut workers = Vec::new();
        for t in 0..4u64 {
            let (fs, acked) = (fs.clone(), acked.clone());
            workers.push(s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ (t * 0x9E37_79B9));
                let c = Client::root(fs);
                for k in 0..60u64 {
                    for _ in 0..3 {
                        step(&c, &mut rng, t);
                    }
                    let p = format!("/t{t}/f{k}");
                    let f = c
                        .open(&p, OpenOptions::new().write(true).create_new(true))
                        .unwrap();
                    f.write_at(&content(t, k), 0).unwrap();
                    f.sync_all().unwrap();
                    acked.lock().push((t, k));
                }
            }));
        }
        let done = &done;
        s.spawn(move || {
            while !done.load(SeqCst) {
                if let Err(e) = store.checkpoint() {
                    panic!("checkpoint: {e}");
                }
                std::thread::sleep(Duration::from_millis(3));
            }
        });
        for w in workers {
            w.join().unwrap();
        }
        done.store(true, SeqCst);
    });
    let images = cuts.take();
    eprintln!(
        "{} flushes, checkpoint lsn {}",
        n.load(SeqCst),
        store.checkpoint_lsn()
    );
    drop(fs);
    drop(o.store);
    eprintln!("{} images", images.len());
    let mut with_ck = 0;
    for cut in images {
        let (img, acked) = (cut.disk.clone(), cut.note.clone());
        let ctx = format!("seed {seed}, image at {}", cut.label());
        let o = open(Path::new(DIR), Config::default(), manual(&img))
            .unwrap_or_else(|e| panic!("{ctx}: open: {e}"));
        if o.report.checkpoint_lsn > 0 {
            with_ck += 1;
        }
        let c = Client::root(Arc::new(o.fs));
        c.fs()
            .check_invariants()
            .unwrap_or_else(|e| panic!("{ctx}: invariants: {e}"));
        for &(t, k) in &acked {
            let got = c.read(format!("/t{t}/f{k}"));
            assert!(
                got.as_ref().ok() == Some(&content(t, k)),
                "{ctx}: fsynced /t{t}/f{k} lost or wrong: {:?}",
                got.map(|v| v.len())
            );
        }
        for t in 0..4u64 {
            let mut ks: Vec<u64> = c
                .read_dir(format!("/t{t}"))
                .unwrap()
                .into_iter()
                .map(|e| String::from_utf8(e.name).unwrap()[1..].parse().unwrap())
                .collect();
            ks.sort();
            for (i, k) in ks.iter().enumerate() {
                assert_eq!(i as u64, *k, "{ctx}: /t{t} is not a prefix: {ks:?}");
                let v = c.read(format!("/t{t}/f{k}")).unwrap();
                // The last file may be cut before its write; never anything else.
                assert!(
                    v == content(t, *k) || (v.is_empty() && i + 1 == ks.len()),
                    "{ctx}: /t{t}/f{k} holds {} bytes",
                    v.len()
                );
            }
        }
        drop(c);
        drop(o.store);
        fsck::check(Path::new(DIR), &manual(&img)).unwrap_or_else(|e| panic!("{ctx}: fsck: {e}"));
    }
    eprintln!("{with_ck} images had a checkpoint");
    assert!(with_ck > 0);
}

fn content(t: u64, k: u64) -> Vec<u8> {
    format!("thread {t} file {k} ")
        .repeat((k as usize % 7) * 40 + 1)
        .into_bytes()
}

/// 20 reopen cycles with checkpoints in between: the tree is the same each time, inode
/// numbers and cookies of surviving names are stable, and no (inode, generation) pair is
/// ever handed out twice, nor a directory cookie.
#[test]
fn reopen_cycles_keep_ids_and_never_repeat_generations_or_cookies() {
    let seed = seed::seed("reopen_cycles_keep_ids_and_never_repeat_generations_or_cookies");
    let disk = SimDisk::new();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut ids: HashMap<(u64, u64), String> = HashMap::new();
    let mut cookies: HashMap<u64, String> = HashMap::new();
    let mut prev: Option<Tree> = None;
    for cycle in 0..20 {
        let o = reopen(checkpointing(&disk, 4096, 100, 3));
        let fs = Arc::new(o.fs);
        let c = Client::root(fs.clone());
        let now = dump(&fs, true);
        if let Some(p) = &prev {
            assert!(
                *p == now,
                "seed {seed}, cycle {cycle}: reopened differs:\n{}",
                tree_diff(p, &now)
            );
        }
        setup_dirs(&c);
        for k in 0..30 {
            // New names: remember every (ino, generation) and cookie.
            let name = format!("/d{}/c{cycle}-{k}", k % 3);
            if rng.random_bool(0.3) {
                c.create_dir(&name).unwrap();
            } else {
                c.write(&name, format!("{cycle} {k}")).unwrap();
            }
            let a = c.metadata(&name).unwrap();
            let g = fs.getattr(a.ino()).unwrap().generation;
            if let Some(old) = ids.insert((a.ino().0, g.0), name.clone()) {
                panic!(
                    "seed {seed}: {name} has inode {} generation {} as {old} had",
                    a.ino().0,
                    g.0
                );
            }
            for _ in 0..3 {
                step(&c, &mut rng, cycle);
            }
            // Remove some of the new names again, so numbers are reused.
            if rng.random_bool(0.6) {
                let _ = c.remove_file(&name).or_else(|_| c.remove_dir(&name));
            }
        }
        for (p, n) in dump(&fs, false) {
            if p == b"/" {
                continue;
            }
            let ps = String::from_utf8_lossy(&p).to_string();
            match cookies.get(&n.cookie) {
                Some(old) if *old != ps => {
                    // The same cookie for another name is fine only if it is a rename of
                    // the same entry; names made this cycle must be fresh.
                    if ps.contains(&format!("c{cycle}-")) {
                        panic!(
                            "seed {seed}, cycle {cycle}: {ps} reuses cookie {} of {old}",
                            n.cookie
                        );
                    }
                }
                _ => {
                    cookies.insert(n.cookie, ps);
                }
            }
        }
        if cycle % 2 == 0 {
            o.store.checkpoint().unwrap();
        }
        if cycle % 3 == 0 {
            c.write(format!("/tail{cycle}"), b"after").unwrap();
        }
        prev = Some(dump(&fs, true));
        drop(c);
        drop(fs);
        o.store.close().unwrap();
    }
    fsck::check(Path::new(DIR), &manual(&disk)).unwrap();
}

/// A cookie handed out and then removed before a checkpoint is never handed out again after
/// reopening (journal replay alone keeps this: the removed entry's record raises the
/// counter).
#[test]
fn cookies_of_removed_entries_are_not_reused_after_a_checkpoint() {
    for checkpoint in [false, true] {
        let disk = SimDisk::new();
        let o = reopen(manual(&disk));
        let c = Client::root(Arc::new(o.fs));
        let mut seen = HashSet::new();
        for k in 0..20 {
            c.write(format!("/f{k}"), b"x").unwrap();
        }
        for (_, n) in dump(c.fs(), false) {
            seen.insert(n.cookie);
        }
        for k in 5..20 {
            c.remove_file(format!("/f{k}")).unwrap();
        }
        if checkpoint {
            o.store.checkpoint().unwrap();
        }
        drop(c);
        drop(o.store);
        let o = reopen(manual(&disk));
        let c = Client::root(Arc::new(o.fs));
        for k in 0..20 {
            c.write(format!("/g{k}"), b"y").unwrap();
        }
        for (p, n) in dump(c.fs(), false) {
            if p.starts_with(b"/g") {
                assert!(
                    !seen.contains(&n.cookie),
                    "checkpoint {checkpoint}: {} got cookie {:#x}, which a removed entry had",
                    String::from_utf8_lossy(&p),
                    n.cookie
                );
            }
        }
    }
}

/// A checkpointed store with journal after it, for the damage tests; returns the expected
/// dump.
fn damaged_base(disk: &SimDisk) -> Tree {
    let o = reopen(manual(disk));
    let c = Client::root(Arc::new(o.fs));
    let mut rng = StdRng::seed_from_u64(7);
    setup_dirs(&c);
    for k in 0..400 {
        step(&c, &mut rng, k % 4);
    }
    for k in 0..40 {
        c.write(format!("/big{k}"), vec![k as u8; 5000 + k * 100])
            .unwrap();
    }
    o.store.checkpoint().unwrap();
    for k in 0..100 {
        step(&c, &mut rng, k % 4);
    }
    c.fs().sync_all().unwrap();
    let live = dump(c.fs(), true);
    drop(c);
    o.store.close().unwrap();
    live
}

fn ckpt_path() -> PathBuf {
    Path::new(DIR).join("checkpoint.redb")
}

/// What opening a damaged image gave: the same filesystem, or an error naming `file`.
fn judge(img: &SimDisk, live: &Tree, file: &Path, what: &str) -> bool {
    // Opened whole: its integrity check is what refuses the damage (a lazy opening finds it
    // as it reads: `lazy_open.rs`).
    let whole = Options {
        lazy: false,
        ..manual(img)
    };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        open(Path::new(DIR), Config::default(), whole).map(|o| dump(&o.fs, true))
    }));
    match r {
        Err(_) => panic!("{what}: open panicked"),
        Ok(Ok(back)) => {
            assert!(
                back == *live,
                "{what}: damage gave a different filesystem:\n{}",
                tree_diff(live, &back)
            );
            false
        }
        Ok(Err(e)) => {
            let named = match &e {
                StoreError::Damaged { path, .. } | StoreError::Io { path, .. } => path == file,
                _ => false,
            };
            assert!(named, "{what}: error does not name {}: {e}", file.display());
            // fsck must also find it (or, at least, not panic).
            let f = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                fsck::check(Path::new(DIR), &manual(img))
            }));
            match f {
                Err(_) => panic!("{what}: fsck check panicked"),
                Ok(Ok(r)) => panic!("{what}: open refused ({e}) but fsck check passed: {r:?}"),
                Ok(Err(_)) => {}
            }
            true
        }
    }
}

/// Bit flips, truncation and zeroed pages in checkpoint.redb: an error naming the file or
/// the very same filesystem; never a panic, never another filesystem.
#[test]
fn damage_to_the_checkpoint_is_an_error_naming_it() {
    let seed = seed::seed("damage_to_the_checkpoint_is_an_error_naming_it");
    let disk = SimDisk::new();
    let live = damaged_base(&disk);
    let file = ckpt_path();
    let bytes = disk
        .files()
        .into_iter()
        .find(|(p, _)| *p == file)
        .map(|(_, b)| b)
        .unwrap();
    eprintln!("checkpoint.redb: {} bytes", bytes.len());
    let mut rng = StdRng::seed_from_u64(seed);
    let mut refused = 0;
    let mut cases: Vec<(String, Vec<u8>)> = Vec::new();
    for len in [0, 1, 100, 511, 4096, bytes.len() / 2, bytes.len() - 1] {
        cases.push((format!("truncated to {len}"), bytes[..len].to_vec()));
    }
    for p in 0..bytes.len().div_ceil(4096) {
        let mut b = bytes.clone();
        let end = ((p + 1) * 4096).min(b.len());
        b[p * 4096..end].fill(0);
        cases.push((format!("page {p} zeroed"), b));
    }
    for _ in 0..150 {
        let mut b = bytes.clone();
        let at = if rng.random_bool(0.3) {
            rng.random_range(0..b.len().min(4096))
        } else {
            rng.random_range(0..b.len())
        };
        let bit = rng.random_range(0..8);
        b[at] ^= 1 << bit;
        cases.push((format!("bit {bit} of byte {at} flipped"), b));
    }
    let total = cases.len();
    for (what, b) in cases {
        let img = disk.crash(Unflushed::Kept);
        img.put(&file, b);
        if judge(&img, &live, &file, &format!("seed {seed}: {what}")) {
            refused += 1;
        }
    }
    eprintln!("{refused} of {total} refused");
    // A missing checkpoint once segments were removed.
    let img = disk.crash(Unflushed::Kept);
    let segs: Vec<PathBuf> = img
        .files()
        .into_iter()
        .map(|(p, _)| p)
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    assert!(
        !segs.iter().any(|p| p.ends_with("0000000000000001.seg")),
        "segment 1 should be gone after the checkpoint: {segs:?}"
    );
}

/// A checkpointed store whose journal after the checkpoint is damaged: open names the
/// segment; fsck finds it; repair cuts it back to a prefix that keeps every record the
/// checkpoint holds; the repaired store opens and checks clean.
#[test]
fn journal_damage_after_a_checkpoint_is_found_and_repaired() {
    let disk = SimDisk::new();
    let o = reopen(manual(&disk));
    let c = Client::root(Arc::new(o.fs));
    for k in 0..60 {
        c.write(format!("/early{k}"), vec![k as u8; 700]).unwrap();
    }
    o.store.checkpoint().unwrap();
    for k in 0..60 {
        c.write(format!("/late{k}"), vec![k as u8; 700]).unwrap();
        c.fs().sync_all().unwrap();
    }
    drop(c);
    o.store.close().unwrap();
    let segs: Vec<(PathBuf, Vec<u8>)> = disk
        .files()
        .into_iter()
        .filter(|(p, _)| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    eprintln!(
        "segments {:?}",
        segs.iter()
            .map(|(p, b)| (p.file_name().unwrap().to_owned(), b.len()))
            .collect::<Vec<_>>()
    );
    assert!(
        segs.len() >= 2,
        "want several segments after the checkpoint"
    );
    // Damage in the middle of the first remaining segment.
    let (path, mut bytes) = segs[0].clone();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x10;
    disk.put(&path, bytes);
    match open(Path::new(DIR), Config::default(), manual(&disk)) {
        Err(StoreError::Damaged { path: p, .. }) => assert_eq!(p, path),
        r => panic!("open of a damaged journal: {r:?}"),
    }
    let e = fsck::check(Path::new(DIR), &manual(&disk)).unwrap_err();
    assert!(matches!(e, StoreError::Damaged { .. }), "{e}");
    let r = fsck::repair(Path::new(DIR), &manual(&disk)).unwrap();
    eprintln!("{r:?}");
    assert!(r.cut_at.is_some());
    let after = fsck::check(Path::new(DIR), &manual(&disk)).unwrap();
    assert!(after.checkpoint_lsn > 0);
    let o = reopen(manual(&disk));
    let c = Client::root(Arc::new(o.fs));
    for k in 0..60 {
        assert_eq!(c.read(format!("/early{k}")).unwrap(), vec![k as u8; 700]);
    }
    let mut late: Vec<u64> = c
        .read_dir("/")
        .unwrap()
        .into_iter()
        .filter_map(|e| {
            String::from_utf8(e.name)
                .unwrap()
                .strip_prefix("late")
                .map(|s| s.parse().unwrap())
        })
        .collect();
    late.sort();
    for (i, k) in late.iter().enumerate() {
        assert_eq!(i as u64, *k, "late files not a prefix: {late:?}");
    }
    assert!(late.len() < 60);
    c.write("/post", b"repair").unwrap();
    o.store.checkpoint().unwrap();
    drop(c);
    drop(o.store);
    let o = reopen(manual(&disk));
    assert_eq!(
        Client::root(Arc::new(o.fs)).read("/post").unwrap(),
        b"repair"
    );
    drop(o.store);
    // A segment removed from the middle of the journal: damage, not a shorter filesystem.
    let segs: Vec<PathBuf> = disk
        .files()
        .into_iter()
        .map(|(p, _)| p)
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    if segs.len() >= 3 {
        let img = disk.crash(Unflushed::Kept);
        // SimDisk has no remove; emptying the segment is the nearest damage.
        img.put(&segs[1], Vec::new());
        let r = open(Path::new(DIR), Config::default(), manual(&img));
        assert!(
            matches!(r, Err(StoreError::Damaged { .. })),
            "emptied middle segment: {:?}",
            r.map(|o| o.report)
        );
    }
}

/// Removing the journal segments a checkpoint covers: with the checkpoint removed as well,
/// opening must refuse (the journal no longer starts at segment 1).
#[test]
fn a_missing_checkpoint_after_recycling_is_damage() {
    let disk = SimDisk::new();
    let o = reopen(checkpointing(&disk, 4096, u64::MAX, usize::MAX));
    let c = Client::root(Arc::new(o.fs));
    for k in 0..100 {
        c.write(format!("/f{k}"), vec![1u8; 500]).unwrap();
    }
    o.store.checkpoint().unwrap();
    c.write("/after", b"a").unwrap();
    drop(c);
    o.store.close().unwrap();
    // Replace the checkpoint with an empty file: the store must not open as empty.
    let img = disk.crash(Unflushed::Kept);
    img.put(&ckpt_path(), Vec::new());
    let r = open(Path::new(DIR), Config::default(), manual(&img));
    match r {
        Err(StoreError::Damaged { path, .. }) => assert_eq!(path, ckpt_path()),
        Err(e) => panic!("not Damaged naming the checkpoint: {e}"),
        Ok(o) => panic!("an emptied checkpoint opened: {:?}", o.report),
    }
}

/// The journal's segments, in order: (sequence number, LSN of the first record; `None` for
/// a spare), read from the files as docs/STORE.md ("Segments") lays them out.
fn segments(disk: &SimDisk) -> Vec<(u64, Option<u64>)> {
    let jd = Path::new(DIR).join("journal");
    let mut v: Vec<_> = disk
        .files()
        .into_iter()
        .filter(|(p, _)| p.parent() == Some(&jd) && p.extension().is_some_and(|e| e == "seg"))
        .map(|(p, b)| {
            let name = p.file_name().unwrap().to_str().unwrap().to_owned();
            let seq = u64::from_str_radix(name.strip_suffix(".seg").unwrap(), 16).unwrap();
            // Zeros, or a spare header (first LSN 0): a spare.
            let first = (b.len() >= 64)
                .then(|| u64::from_le_bytes(b[40..48].try_into().unwrap()))
                .filter(|&l| l != 0);
            (seq, first)
        })
        .collect();
    v.sort();
    v
}

/// After a checkpoint up to `lsn`: no segment it covers is left (one whose successor starts
/// at or below `lsn + 1`), and none it does not cover is gone (the first one left starts at
/// or below `lsn + 1`, and the sequence numbers have no gap).
fn assert_recycled(segs: &[(u64, Option<u64>)], lsn: u64, what: &str) {
    for w in segs.windows(2) {
        if let Some(first) = w[1].1 {
            assert!(
                first > lsn + 1,
                "{what}: segment {} is covered by the checkpoint up to {lsn} (segment {} starts \
                 at {first}) but was not removed: {segs:?}",
                w[0].0,
                w[1].0
            );
        }
        assert_eq!(w[0].0 + 1, w[1].0, "{what}: a gap in the journal: {segs:?}");
    }
    if let Some(&(_, Some(first))) = segs.first() {
        assert!(
            first <= lsn + 1,
            "{what}: the journal starts at record {first}, the checkpoint ends at {lsn}: {segs:?}"
        );
    }
}

/// Whether a checkpoint's error is the host's ENOSPC.
fn is_enospc(e: &str) -> bool {
    e.contains(&std::io::Error::from_raw_os_error(libc::ENOSPC).to_string())
}

fn file_len(disk: &SimDisk, path: &Path) -> u64 {
    disk.files()
        .into_iter()
        .find(|(p, _)| p == path)
        .map_or(0, |(_, b)| b.len() as u64)
}

/// A store with a checkpoint, journal after it, and more new file data after it than
/// `checkpoint.redb` holds in all (so that the next checkpoint must grow the file), all
/// durable. Returns the store, its filesystem and client, and the workload's generator.
fn grown_past_checkpoint(
    disk: &SimDisk,
    seed: u64,
) -> (StoreHandle, Arc<Filesystem>, Client, StdRng) {
    let Opened { fs, store, .. } = reopen(checkpointing(disk, 8192, u64::MAX, usize::MAX));
    let fs = Arc::new(fs);
    let c = Client::root(fs.clone());
    let mut rng = StdRng::seed_from_u64(seed);
    setup_dirs(&c);
    for k in 0..300 {
        step(&c, &mut rng, k % 4);
    }
    assert!(store.checkpoint().unwrap() > 0);
    for k in 0..200 {
        step(&c, &mut rng, k % 4);
    }
    let ck_len = file_len(disk, &ckpt_path());
    let (mut big, mut k) = (0u64, 0u64);
    while big < 2 * ck_len + (64 << 10) {
        let n = rng.random_range(20_000..60_000);
        c.write(format!("/big{k}"), vec![(k as u8) | 1; n]).unwrap();
        big += n as u64;
        k += 1;
    }
    fs.sync_all().unwrap();
    journal_idle(disk, Path::new(DIR), 8192);
    (store, fs, c, rng)
}

/// Checkpoints while the host is full: each commits, segment by segment (the host is short
/// of room for the whole journal's), what fits in the room it has (pages redb freed before,
/// segments removed by its earlier commits), failing with ENOSPC at the first that does not
/// (redb refuses every transaction after a failed one until its database is reopened); no segment goes that the committed checkpoint does not cover, and
/// nothing acknowledged is lost (power cuts during the full period keep every fsynced file
/// and the checkpoint committed so far); once there is room again a checkpoint of the same
/// open store succeeds, the segments it covers are removed, a power cut then keeps it, and
/// the reopened store is exactly the live one.
#[test]
fn checkpoint_while_out_of_space_then_recovers() {
    let seed = seed::seed("checkpoint_while_out_of_space_then_recovers");
    let disk = SimDisk::new();
    let (store, fs, c, mut rng) = grown_past_checkpoint(&disk, seed);
    let mut ck_lsn = store.checkpoint_lsn();
    assert!(ck_lsn > 0);
    let mut acked_dump = dump(&fs, false);
    // Little room: less than the checkpoint must grow by.
    for extra in [0u64, 0, 0, 100, 1000, 5000, 20000] {
        let before = segments(&disk);
        disk.set_space(Some(disk.used() + extra));
        let r = store.checkpoint().map_err(|e| e.to_string());
        eprintln!("checkpoint with {extra} bytes of room: {r:?}");
        match r {
            Ok(_) => {}
            Err(e) => assert!(
                is_enospc(&e),
                "seed {seed}: a checkpoint with {extra} bytes of room failed, but not for \
                 lack of space: {e}"
            ),
        }
        let lsn = store.checkpoint_lsn();
        assert!(lsn >= ck_lsn, "seed {seed}");
        ck_lsn = lsn;
        // (A spare the journal could not make for lack of room is removed by the journal:
        // it holds no record. Waiting for an idle journal keeps that from happening here,
        // but it would not be wrong.)
        let after = segments(&disk);
        for w in before.windows(2) {
            let covered = matches!(w[1].1, Some(first) if first <= ck_lsn + 1);
            assert!(
                covered || w[0].1.is_none() || after.contains(&w[0]),
                "seed {seed}: segment {} removed, but the checkpoint ends at {ck_lsn}",
                w[0].0
            );
        }
        // Images of the full host keep what was acknowledged.
        let img = disk.crash(Unflushed::Lost);
        let oi = open(Path::new(DIR), Config::default(), manual(&img))
            .unwrap_or_else(|e| panic!("seed {seed}: image while full ({extra}): {e}"));
        assert_eq!(oi.report.checkpoint_lsn, ck_lsn, "seed {seed}");
        let back = dump(&oi.fs, false);
        for (p, n) in &acked_dump {
            let b = back
                .get(p)
                .unwrap_or_else(|| panic!("seed {seed}: {} lost", String::from_utf8_lossy(p)));
            assert!(
                b.content == n.content,
                "seed {seed}: {} content differs ({} vs {} bytes)",
                String::from_utf8_lossy(p),
                b.content.len(),
                n.content.len()
            );
        }
        drop(oi);
        // Let more records in for the next try.
        disk.set_space(None);
        for k in 0..30 {
            step(&c, &mut rng, k % 4);
        }
        fs.sync_all()
            .unwrap_or_else(|e| panic!("seed {seed}: sync with room: {e:?}"));
        journal_idle(&disk, Path::new(DIR), 8192);
        acked_dump = dump(&fs, false);
    }
    // Room again; the same open store.
    let before = segments(&disk);
    let n = store
        .checkpoint()
        .unwrap_or_else(|e| panic!("seed {seed}: checkpoint once there is room: {e}"));
    eprintln!("checkpoint with room: {n} records");
    assert!(n > 0, "seed {seed}");
    let lsn = store.checkpoint_lsn();
    assert_eq!(
        lsn,
        store.counters().lsn,
        "seed {seed}: the checkpoint holds every record written"
    );
    let after = segments(&disk);
    eprintln!("segments before {before:?}\nafter {after:?}");
    assert_recycled(&after, lsn, &format!("seed {seed}"));
    let removed: Vec<u64> = before
        .iter()
        .map(|s| s.0)
        .filter(|q| !after.iter().any(|a| a.0 == *q))
        .collect();
    assert!(
        !removed.is_empty(),
        "seed {seed}: no segment removed: {before:?}"
    );
    assert!(
        removed.iter().all(|&q| q < after[0].0),
        "seed {seed}: removed {removed:?}, left {after:?}"
    );
    // The new checkpoint is durable: a power cut now keeps it and the whole live tree.
    let live = dump(&fs, true);
    let img = disk.crash(Unflushed::Lost);
    let oi = open(Path::new(DIR), Config::default(), manual(&img)).unwrap();
    assert_eq!(oi.report.checkpoint_lsn, lsn, "seed {seed}");
    assert_holds(
        &live,
        &oi.fs,
        &format!("seed {seed}: power cut after the checkpoint"),
    );
    drop(oi);
    for k in 0..50 {
        step(&c, &mut rng, k % 4);
    }
    let live = dump(&fs, true);
    close_and_reopen_holding(&disk, (c, fs, store), lsn, &live, seed);
}

/// A checkpoint on a host with no room that also fails (EIO) from its second flush on: the
/// checkpoint, which commits segment by segment on so short a host, fails for lack of space
/// or at the flush after its first (redb reuses pages it freed before), and the drop or the
/// reopen of its database after the failure flushes too:
/// the reopen fails, and so does the next one; the store goes on from its journal; once the
/// host works, the next checkpoint reopens the database and succeeds, without reopening the
/// store.
#[test]
fn checkpoint_reopen_that_fails_is_tried_again() {
    let seed = seed::seed("checkpoint_reopen_that_fails_is_tried_again");
    let disk = SimDisk::new();
    let (store, fs, c, mut rng) = grown_past_checkpoint(&disk, seed);
    let ck_lsn = store.checkpoint_lsn();
    let before = segments(&disk);
    let live = dump(&fs, true);
    // No room (the checkpoint fails growing its file, before any flush of its own); the
    // first flush goes through, everything after it fails.
    disk.set_space(Some(disk.used()));
    disk.on_sync(|d, at| {
        if at == SyncPoint::Before {
            d.set_failing(true);
        }
    });
    let r = store.checkpoint().map_err(|e| e.to_string());
    disk.clear_hook();
    eprintln!("checkpoint on a failing host: {r:?}");
    let e = r.expect_err("a checkpoint on a failing host succeeded");
    assert!(
        (is_enospc(&e) || e.contains(&std::io::Error::from_raw_os_error(libc::EIO).to_string()))
            && e.contains("reopening the checkpoint"),
        "seed {seed}: not ENOSPC or EIO, then a failed reopen: {e}"
    );
    assert_eq!(store.checkpoint_lsn(), ck_lsn);
    // Still failing: the reopen fails again, nothing else happens.
    let e = store
        .checkpoint()
        .expect_err("checkpoint on a failing host")
        .to_string();
    assert!(e.contains("reopening the checkpoint"), "seed {seed}: {e}");
    // A power cut now keeps the last checkpoint and every synced change.
    let img = disk.crash(Unflushed::Lost);
    let oi = open(Path::new(DIR), Config::default(), manual(&img)).unwrap();
    assert_eq!(oi.report.checkpoint_lsn, ck_lsn, "seed {seed}");
    assert_holds(&live, &oi.fs, &format!("seed {seed}: image"));
    drop(oi);
    disk.set_failing(false);
    disk.set_space(None);
    assert_eq!(segments(&disk), before, "seed {seed}");
    // The journal never failed: the store serves on.
    fs.sync_all().unwrap();
    for k in 0..30 {
        step(&c, &mut rng, k % 4);
    }
    let n = store
        .checkpoint()
        .unwrap_or_else(|e| panic!("seed {seed}: checkpoint once the host works: {e}"));
    assert!(n > 0);
    let lsn = store.checkpoint_lsn();
    assert_eq!(lsn, store.counters().lsn, "seed {seed}");
    assert_recycled(&segments(&disk), lsn, &format!("seed {seed}"));
    assert!(
        segments(&disk)[0].0 > before[0].0,
        "seed {seed}: nothing removed"
    );
    let live2 = dump(&fs, true);
    close_and_reopen_holding(&disk, (c, fs, store), lsn, &live2, seed);
}

/// A checkpoint when the host fails (EIO) is refused; what was acknowledged survives; and the
/// store (stopped by EIO) reopens to a state including every acknowledged change. Also with
/// the host failing only during the checkpoint's own flushes.
#[test]
fn checkpoint_on_a_failing_host_loses_nothing_acknowledged() {
    for variant in 0..2 {
        let disk = SimDisk::new();
        let o = reopen(checkpointing(&disk, 8192, u64::MAX, usize::MAX));
        let fs = Arc::new(o.fs);
        let c = Client::root(fs.clone());
        let mut rng = StdRng::seed_from_u64(variant);
        setup_dirs(&c);
        for k in 0..300 {
            step(&c, &mut rng, k % 4);
        }
        fs.sync_all().unwrap();
        o.store.checkpoint().unwrap();
        for k in 0..100 {
            step(&c, &mut rng, k % 4);
        }
        fs.sync_all().unwrap();
        let acked = dump(&fs, true);
        if variant == 0 {
            disk.set_failing(true);
        } else {
            // Fail from the checkpoint's second flush on.
            let n = Arc::new(AtomicU64::new(0));
            disk.on_sync(move |d, at| {
                if at == SyncPoint::Before && n.fetch_add(1, SeqCst) == 2 {
                    d.set_failing(true);
                }
            });
        }
        let r = o.store.checkpoint();
        eprintln!("variant {variant}: checkpoint on a failing host: {r:?}");
        disk.clear_hook();
        disk.set_failing(false);
        let _ = o.store.checkpoint();
        drop(c);
        drop(fs);
        let _ = o.store.close();
        for img in [disk.crash(Unflushed::Lost), disk.crash(Unflushed::Kept)] {
            let o = open(Path::new(DIR), Config::default(), manual(&img))
                .unwrap_or_else(|e| panic!("variant {variant}: reopen: {e}"));
            assert_holds(
                &acked,
                &o.fs,
                &format!("variant {variant}: reopened differs from the acknowledged state"),
            );
            drop(o);
            fsck::check(Path::new(DIR), &manual(&img)).unwrap();
        }
    }
}
