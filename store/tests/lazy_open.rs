//! Opening a store lazily (`Options::lazy`: the namespace is read from the checkpoint as it is
//! needed, engine `fs/lazy.rs`) serves exactly what opening it whole serves: the same tree,
//! attributes, data, xattrs and link counts, after a checkpoint and a journal tail, after a
//! power cut, with orphans, hard links and moved directories; and changes made on a lazily
//! opened store leave the same store as the same changes made on one opened whole.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::{assert_same_tree, dump, seed};
use lanefs::{Client, Config, Ctx, Filesystem, OpenOptions};
use lanefs_store::disk::{SimDisk, Unflushed};
use lanefs_store::{Opened, open};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn dir() -> PathBuf {
    PathBuf::from("/s")
}

fn open_on(sim: &SimDisk, lazy: bool) -> Opened {
    open(&dir(), Config::default(), common::lazy_opts(sim, lazy)).unwrap()
}

const DIRS: [&str; 6] = ["/a", "/b", "/a/c", "/b/d", "/a/c/e", "/x"];

/// A random path: a name in one of the directories (or the root).
fn path(rng: &mut StdRng, prefix: &str) -> String {
    let d = if rng.random_range(0..5) == 0 {
        ""
    } else {
        DIRS[rng.random_range(0..DIRS.len())]
    };
    format!("{d}/{prefix}{}", rng.random_range(0..12))
}

/// `n` random changes; errors (a name missing, a directory not empty) are part of the game.
/// Handles opened and unlinked stay open in `open` (orphans at a crash or a checkpoint).
fn changes<'a>(c: &'a Client, rng: &mut StdRng, n: usize, open: &mut Vec<lanefs::File<'a>>) {
    for _ in 0..n {
        let p = path(rng, "f");
        let _ = match rng.random_range(0..16) {
            0..=2 => {
                let len = [0, 10, 4096, 5000, 70_000][rng.random_range(0..5)];
                let b: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
                c.write(&p, b)
            }
            3 => c
                .open(&p, OpenOptions::new().write(true))
                .and_then(|f| f.write_at(b"middle", rng.random_range(0..9000)).map(drop)),
            4 => c.truncate(&p, rng.random_range(0..20_000)),
            5 => c.remove_file(&p),
            6 => c.rename(&p, path(rng, "f")),
            7 => c.hard_link(&p, path(rng, "f")),
            8 => c.symlink(&p, path(rng, "l")),
            9 => {
                let d = DIRS[rng.random_range(0..DIRS.len())];
                let to = format!(
                    "{}/m{}",
                    DIRS[rng.random_range(0..DIRS.len())],
                    rng.random_range(0..3)
                );
                c.rename(d, to).or_else(|_| c.create_dir(d))
            }
            10 => c.create_dir(DIRS[rng.random_range(0..DIRS.len())]),
            11 => c.remove_dir(path(rng, "m")),
            12 => c.set_permissions(&p, 0o600 | rng.random_range(0..0o100)),
            13 => c.metadata(&p).and_then(|m| {
                c.fs()
                    .setxattr(
                        &Ctx::root(),
                        m.ino(),
                        b"user.k",
                        &[rng.random::<u8>(); 9],
                        0,
                    )
                    .map_err(Into::into)
            }),
            14 => c
                .open(&p, OpenOptions::new().read(true).write(true))
                .and_then(|f| {
                    let fs = c.fs();
                    fs.fallocate(
                        &Ctx::root(),
                        f.handle(),
                        lanefs::FALLOC_FL_KEEP_SIZE,
                        0,
                        3 << 12,
                    )
                    .map_err(std::io::Error::from)
                }),
            _ => c
                .open(&p, OpenOptions::new().read(true).write(true))
                .and_then(|f| {
                    f.write_at(b"orphan", 100)?;
                    c.remove_file(&p)?;
                    open.push(f);
                    Ok(())
                }),
        };
    }
}

/// The filesystem as a map, loaded whole by the walk; its invariants checked.
fn tree(fs: &Filesystem) -> common::Tree {
    fs.check_invariants().unwrap();
    dump(fs, true)
}

/// For each seed: changes, a checkpoint, more changes (the journal's tail), then a clean
/// close or a power cut; the store opened whole and lazily gives the same tree; the same
/// changes then made on both give the same store again.
#[test]
fn a_lazy_open_serves_what_a_whole_open_serves() {
    for s in seed::seeds("lazy_open", 0..12) {
        let mut rng = StdRng::seed_from_u64(s);
        let sim = SimDisk::new();
        let crash = s % 3 == 0;
        let image = {
            let o = open_on(&sim, false);
            let fs = Arc::new(o.fs);
            let c = Client::root(fs.clone());
            for d in DIRS {
                let _ = c.create_dir(d);
            }
            let mut held = Vec::new();
            changes(&c, &mut rng, 300, &mut held);
            o.store.checkpoint().unwrap();
            let n = rng.random_range(0..150);
            changes(&c, &mut rng, n, &mut held);
            if crash {
                o.store.sync().unwrap();
                changes(&c, &mut rng, 20, &mut held);
                let img = sim.crash(Unflushed::Kept);
                drop(held);
                img
            } else {
                drop(held);
                drop(c);
                o.store.close().unwrap();
                sim.clone()
            }
        };
        let copy = image.crash(Unflushed::Kept);
        let whole = open_on(&image, false);
        let lazy = open_on(&copy, true);
        assert_eq!(whole.report.counts_wrong, None, "seed {s}");
        assert!(lazy.report.lazy && !whole.report.lazy, "seed {s}");
        assert_eq!(
            lazy.report.loaded, 0,
            "seed {s}: a lazy open loads nothing whole"
        );
        // What the limits count: the store's counts against what a whole load counted.
        assert_eq!(lazy.fs.statfs(), whole.fs.statfs(), "seed {s}: statfs");
        let at_open = lazy.fs.loaded_inodes();
        let want = tree(&whole.fs);
        let got = dump(&lazy.fs, true);
        assert!(
            at_open < want.len() as u64,
            "seed {s}: the lazy open loaded {at_open} of {} inodes before the walk",
            want.len()
        );
        assert_same_tree(&format!("seed {s}: lazy against whole"), &want, &got);
        lazy.fs.check_invariants().unwrap();
        // The same changes on both, then both closed and opened whole.
        let mut after = Vec::new();
        for (o, img) in [(whole, &image), (lazy, &copy)] {
            let fs = Arc::new(o.fs);
            let c = Client::root(fs.clone());
            let mut r = StdRng::seed_from_u64(s ^ 0xa5a5);
            let mut held = Vec::new();
            changes(&c, &mut r, 200, &mut held);
            drop(held);
            drop(c);
            o.store.close().unwrap();
            drop(fs);
            let re = open_on(img, false);
            assert_eq!(re.report.counts_wrong, None, "seed {s}");
            re.fs.check_invariants().unwrap();
            // New inodes take other numbers (a lazy open hands out none of the store's
            // holes) and their changes other times.
            let mut t = dump(&re.fs, false);
            for n in t.values_mut() {
                (n.ino, n.generation, n.cookie) = (lanefs::Ino(0), lanefs::Generation(0), 0);
            }
            after.push(t);
            re.store.close().unwrap();
        }
        assert_same_tree(
            &format!("seed {s}: changes after a lazy open"),
            &after[0],
            &after[1],
        );
    }
}

/// Threads stat every file of a lazily opened store at once, each its own order: every
/// inode is read once (the store's copy of a number is loaded at most once), and every stat
/// agrees with a whole open.
#[test]
fn threads_missing_at_once_load_each_inode_once() {
    let sim = SimDisk::new();
    {
        let o = open_on(&sim, false);
        let c = Client::root(Arc::new(o.fs));
        for d in 0..20 {
            c.create_dir(format!("/d{d}")).unwrap();
            for f in 0..50 {
                c.write(format!("/d{d}/f{f}"), [d as u8; 3]).unwrap();
            }
        }
        o.store.checkpoint().unwrap();
        drop(c);
        o.store.close().unwrap();
    }
    let o = open_on(&sim, true);
    let fs = Arc::new(o.fs);
    let barrier = std::sync::Barrier::new(8);
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let (fs, barrier) = (fs.clone(), &barrier);
            s.spawn(move || {
                let c = Client::root(fs);
                barrier.wait();
                let mut rng = StdRng::seed_from_u64(t);
                for _ in 0..400 {
                    let (d, f) = (rng.random_range(0..20), rng.random_range(0..50));
                    let m = c.metadata(format!("/d{d}/f{f}")).unwrap();
                    assert_eq!(m.len(), 3);
                }
            });
        }
    });
    // 20 directories, their 1000 files, the root.
    assert_eq!(fs.loaded_inodes(), 1021);
    fs.check_invariants().unwrap();
    assert_eq!(
        fs.loaded_inodes(),
        1021,
        "the check found nothing left to load"
    );
}

/// A checkpoint that holds orphans (files open when their last name went), and no record
/// after it: a lazy open makes them again through the root, as a whole open does, and
/// leaves the root's times as kept; both free them, and count the same.
#[test]
fn orphans_of_a_checkpoint_leave_the_root_as_kept() {
    let sim = SimDisk::new();
    let o = open_on(&sim, false);
    let fs = Arc::new(o.fs);
    let c = Client::root(fs.clone());
    c.create_dir("/d").unwrap();
    let mut held = Vec::new();
    for i in 0..3 {
        let p = format!("/o{i}");
        c.write(&p, vec![7u8; 9000]).unwrap();
        held.push(c.open(&p, OpenOptions::new().read(true)).unwrap());
        c.remove_file(&p).unwrap();
    }
    // The root's times move later than the orphans' passing names would set them.
    c.set_times(
        "/",
        Some(lanefs::TimeSet::At(lanefs::Timespec::new(1_000_000, 5))),
        Some(lanefs::TimeSet::At(lanefs::Timespec::new(2_000_000, 7))),
    )
    .unwrap();
    o.store.checkpoint().unwrap();
    let image = sim.crash(Unflushed::Lost);
    drop(held);
    let copy = image.crash(Unflushed::Kept);
    let whole = open_on(&image, false);
    let lazy = open_on(&copy, true);
    assert!(lazy.report.lazy);
    assert_eq!(whole.report.counts_wrong, None);
    assert_eq!(lazy.fs.statfs(), whole.fs.statfs());
    assert_same_tree("orphans", &tree(&whole.fs), &dump(&lazy.fs, true));
}

/// Reads everything reachable from the root through the engine, errors and all: what a
/// walk of a damaged store gives (never a panic). Returns the errors met.
fn walk_tolerant(fs: &Filesystem) -> Vec<lanefs::Errno> {
    let ctx = Ctx::root();
    let mut errs = Vec::new();
    let mut stack = vec![lanefs::ROOT_INO];
    let mut seen = std::collections::HashSet::new();
    while let Some(ino) = stack.pop() {
        if !seen.insert(ino) {
            continue;
        }
        let a = match fs.getattr(ino) {
            Ok(a) => a,
            Err(e) => {
                errs.push(e);
                continue;
            }
        };
        match a.kind() {
            lanefs::FileType::Directory => {
                let fh = match fs.opendir(&ctx, ino) {
                    Ok(fh) => fh,
                    Err(e) => {
                        errs.push(e);
                        continue;
                    }
                };
                let mut names = Vec::new();
                if let Err(e) = fs.readdir(&ctx, fh, 0, false, |e, _| {
                    names.push(e.name.to_vec());
                    true
                }) {
                    errs.push(e);
                }
                let _ = fs.releasedir(fh);
                for n in names.iter().filter(|n| &n[..] != b"." && &n[..] != b"..") {
                    match fs.lookup(&ctx, ino, n) {
                        Ok(c) => stack.push(c.ino),
                        Err(e) => errs.push(e),
                    }
                }
            }
            lanefs::FileType::RegularFile => match fs.open(&ctx, ino, libc::O_RDONLY) {
                Ok(fh) => {
                    let mut buf = vec![0; a.size.min(1 << 20) as usize];
                    if let Err(e) = fs.read(fh, 0, &mut buf) {
                        errs.push(e);
                    }
                    let _ = fs.release(fh);
                }
                Err(e) => errs.push(e),
            },
            _ => {}
        }
    }
    errs
}

/// Bit flips and zeroed pages in `checkpoint.redb` of a store opened lazily (which leaves
/// out redb's whole-file integrity check): the opening fails naming the file, or the walk
/// meets EIO where it reads damage (the store says which file), never a panic, never a
/// hang; every case is one a whole opening refuses or opens to the same tree.
#[test]
fn damage_met_by_a_lazy_opening_is_eio_never_a_panic() {
    let sim = SimDisk::new();
    {
        let o = open_on(&sim, false);
        let c = Client::root(Arc::new(o.fs));
        let mut rng = StdRng::seed_from_u64(7);
        for d in DIRS {
            let _ = c.create_dir(d);
        }
        let mut held = Vec::new();
        changes(&c, &mut rng, 400, &mut held);
        drop(held);
        o.store.checkpoint().unwrap();
        drop(c);
        o.store.close().unwrap();
    }
    let file = dir().join("checkpoint.redb");
    let bytes = sim
        .files()
        .into_iter()
        .find(|(p, _)| *p == file)
        .map(|(_, b)| b)
        .unwrap();
    let seed = seed::fixed("lazy damage", 11);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut cases: Vec<(String, Vec<u8>)> = Vec::new();
    for p in 0..bytes.len().div_ceil(4096) {
        let mut b = bytes.clone();
        let end = ((p + 1) * 4096).min(b.len());
        b[p * 4096..end].fill(0);
        cases.push((format!("page {p} zeroed"), b));
    }
    for _ in 0..100 {
        let mut b = bytes.clone();
        let at = rng.random_range(0..b.len());
        let bit = rng.random_range(0..8);
        b[at] ^= 1 << bit;
        cases.push((format!("bit {bit} of byte {at} flipped"), b));
    }
    let (mut refused, mut eio) = (0, 0);
    for (what, b) in cases {
        let img = sim.crash(Unflushed::Kept);
        img.put(&file, b);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            match open(&dir(), Config::default(), common::lazy_opts(&img, true)) {
                Ok(o) => Ok(walk_tolerant(&o.fs)),
                Err(e) => Err(e),
            }
        }));
        match r {
            Err(_) => panic!("seed {seed}: {what}: a panic"),
            Ok(Err(e)) => {
                let named = match &e {
                    lanefs_store::StoreError::Damaged { path, .. }
                    | lanefs_store::StoreError::Io { path, .. } => *path == file,
                    _ => false,
                };
                assert!(
                    named,
                    "seed {seed}: {what}: {e} does not name the checkpoint"
                );
                if std::env::var_os("LAZY_DAMAGE_SHOW").is_some() {
                    eprintln!("{what}: refused: {e}");
                }
                refused += 1;
            }
            Ok(Ok(errs)) => {
                assert!(
                    errs.iter().all(|&e| e == lanefs::Errno::EIO),
                    "seed {seed}: {what}: {errs:?}"
                );
                eio += usize::from(!errs.is_empty());
                if std::env::var_os("LAZY_DAMAGE_SHOW").is_some() {
                    eprintln!("{what}: {errs:?}");
                }
            }
        }
    }
    eprintln!("refused at the opening {refused}, EIO met by the walk {eio}");
    assert!(refused + eio > 0, "no damage was found at all");
}
