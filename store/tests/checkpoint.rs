//! Checkpoints: a store whose journal was folded into its checkpoint (by the background
//! checkpointer, racing the workload, and by `StoreHandle::checkpoint`) reopens to exactly
//! the filesystem it served (tree, inode numbers, generations, cookies, attributes, times,
//! contents, holes, xattrs, ACLs, flags, `O_TMPFILE` files named), orphans included; the journal segments it covers
//! are gone; a power cut anywhere in a checkpoint loses nothing; damage to the checkpoint
//! is refused naming the file.

#[path = "../../engine/tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{dump, named_user_acl};
use lanefs::{Client, Config, Ctx, OpenOptions, RENAME_EXCHANGE, SetAttr};
use lanefs_store::disk::{SimDisk, SyncPoint, Unflushed};
use lanefs_store::{Options, StoreError, StoreHandle, open};
use rand::{Rng, SeedableRng, rngs::StdRng};

fn seed() -> u64 {
    std::env::var("LANEFS_SEED")
        .ok()
        .map(|s| s.parse().unwrap())
        .unwrap_or_else(rand::random)
}

/// Options that make the checkpointer busy: a checkpoint every few hundred records.
fn eager(disk: Option<&SimDisk>) -> Options {
    let mut o = Options {
        segment_size: 64 << 10,
        commit_interval: Duration::from_millis(5),
        checkpoint_records: 300,
        checkpoint_segments: 3,
        ..Options::default()
    };
    if let Some(d) = disk {
        o.disk = Arc::new(d.clone());
    }
    o
}

/// The journal's segments (not those kept for reuse, `.free`).
fn segments(dir: &Path) -> usize {
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
    let seed = seed();
    eprintln!("seed {seed}");
    let o = open(dir.path(), Config::default(), eager(None)).unwrap();
    let fs = Arc::new(o.fs);
    for round in 0..3 {
        churn(&fs, 3, 1200, seed ^ round);
        o.store.checkpoint().unwrap();
    }
    let lsn = o.store.checkpoint_lsn();
    assert!(lsn > 1000, "checkpoints were taken: {lsn}");
    // The segments the checkpoint covers are gone: the one being written and its spare are left.
    assert!(
        segments(dir.path()) <= 2,
        "{} segments",
        segments(dir.path())
    );
    // A tail after the checkpoint, which reopening replays.
    churn(&fs, 2, 400, seed ^ 7);
    let before = dump(&fs, true);
    assert!(before.len() > 15, "{}", before.len());
    drop(fs);
    o.store.close().unwrap();
    let o = open(dir.path(), Config::default(), eager(None)).unwrap();
    assert!(o.report.loaded > 10, "{:?}", o.report);
    assert!(o.report.checkpoint_lsn >= lsn, "{:?}", o.report);
    assert!(o.report.replayed > 0, "{:?}", o.report);
    let after = dump(&o.fs, true);
    for (k, v) in &before {
        assert_eq!(
            Some(v),
            after.get(k),
            "seed {seed}: {}",
            String::from_utf8_lossy(k)
        );
    }
    assert_eq!(before.len(), after.len(), "seed {seed}");
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
    assert!(
        before == dump(&o.fs, true),
        "seed {seed}: second reopen differs"
    );
}

#[test]
fn a_file_open_when_its_last_name_went_survives_the_checkpoint_until_freed() {
    let disk = SimDisk::new();
    let o = open(Path::new("/s"), Config::default(), eager(Some(&disk))).unwrap();
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
    let o2 = open(Path::new("/s"), Config::default(), eager(Some(&image))).unwrap();
    assert!(o2.report.loaded >= 2, "{:?}", o2.report);
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
    let o = open(Path::new("/s"), Config::default(), eager(Some(&disk))).unwrap();
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
    let o = open(Path::new("/s"), Config::default(), eager(Some(&disk))).unwrap();
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
    let seed = seed();
    eprintln!("seed {seed}");
    let disk = SimDisk::new();
    let mut opts = eager(Some(&disk));
    opts.checkpoint_records = u64::MAX;
    opts.checkpoint_segments = usize::MAX;
    let o = open(Path::new("/s"), Config::default(), opts.clone()).unwrap();
    let fs = Arc::new(o.fs);
    churn(&fs, 2, 500, seed);
    o.store.sync().unwrap();
    let want = dump(&fs, true);
    let images = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let im = images.clone();
    disk.on_sync(move |d, at| {
        if at == SyncPoint::Before {
            im.lock().push(d.crash(Unflushed::Lost));
            im.lock().push(d.crash(Unflushed::Torn(7)));
        } else {
            im.lock().push(d.crash(Unflushed::Kept));
        }
    });
    o.store.checkpoint().unwrap();
    disk.clear_hook();
    let images = std::mem::take(&mut *images.lock());
    assert!(
        images.len() >= 6,
        "the checkpoint flushes: {}",
        images.len()
    );
    for (k, image) in images.into_iter().enumerate() {
        let mut o = opts.clone();
        o.disk = Arc::new(image);
        let r = open(Path::new("/s"), Config::default(), o)
            .unwrap_or_else(|e| panic!("image {k}: {e}"));
        assert!(want == dump(&r.fs, true), "seed {seed}: image {k} differs");
        r.fs.check_invariants().unwrap();
    }
    drop(fs);
}

#[test]
fn a_damaged_or_missing_checkpoint_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let o = open(dir.path(), Config::default(), eager(None)).unwrap();
    let fs = Arc::new(o.fs);
    churn(&fs, 2, 800, 1);
    o.store.checkpoint().unwrap();
    drop(fs);
    o.store.close().unwrap();
    let ck = dir.path().join("checkpoint.redb");
    let good = std::fs::read(&ck).unwrap();
    let mut rng = StdRng::seed_from_u64(seed());
    for _ in 0..20 {
        let mut bad = good.clone();
        for _ in 0..8 {
            let at = rng.random_range(0..bad.len());
            bad[at] ^= 1 << rng.random_range(0..8);
        }
        std::fs::write(&ck, &bad).unwrap();
        // Either the flips hit bytes redb does not use (the same filesystem comes back), or
        // the open fails naming the checkpoint; never a panic, never another filesystem.
        match open(dir.path(), Config::default(), Options::default()) {
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
fn cookie_of(fs: &Arc<lanefs::Filesystem>, dir: &str, name: &[u8]) -> u64 {
    let ino = Client::root(fs.clone()).metadata(dir).unwrap().ino();
    common::cookie_of(fs, ino, name)
}

/// Options under which only `StoreHandle::checkpoint` takes checkpoints.
fn manual_checkpoints(disk: &SimDisk) -> Options {
    Options {
        checkpoint_records: u64::MAX,
        checkpoint_segments: usize::MAX,
        ..eager(Some(disk))
    }
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
    let manual = || manual_checkpoints(&disk);
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
    let ghost = cookie_of(&fs, "/d", b"ghost");
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
    let new = cookie_of(&fs, "/d", b"new");
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
    let manual = || manual_checkpoints(&disk);
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
    let renamed = cookie_of(&fs, "/b", b"g1y");
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
    let new = cookie_of(&fs, "/b", b"new");
    assert!(
        new > renamed,
        "cookie {new} after the renamed ghost's {renamed}"
    );
    fs.check_invariants().unwrap();
}
