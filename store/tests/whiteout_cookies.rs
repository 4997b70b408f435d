//! Whiteouts that take over the name's readdir cookie (`Dirents::heir`), written by a
//! helper without reading the other tests: directory reads one entry at a time and resumed
//! at returned offsets while threads make whiteouts (over targets, over whiteouts, across
//! directories), rename them away, unlink them and put names back: no name twice, none
//! present throughout missed (a name renamed over while read included), increasing
//! offsets, distinct cookies, link counts, rmdir of a directory of whiteouts; then on a disk
//! store, reopens from the journal and from checkpoints, simulated power cuts after each
//! sync and in mid-run with background checkpoints, and compaction: the tree (offsets
//! included) equals the live one, fsck is clean, and new entries get fresh cookies. Failing
//! commits and the inode limit leave the listing unchanged.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::time::{Duration, Instant};

use common::seed;
use lanefs::{Config, Ctx, Errno, FileType, Filesystem, Ino, RENAME_WHITEOUT, ROOT_INO};
use rand::Rng;
use rand::rngs::StdRng;

fn c() -> Ctx {
    Ctx::root()
}

/// One read of directory `d`, one entry per readdir call, resuming at the returned offset.
fn read_one_by_one(fs: &Filesystem, d: Ino) -> Vec<(u64, Vec<u8>, Ino, FileType)> {
    let fh = fs.opendir(&c(), d).unwrap();
    let mut out = Vec::new();
    let mut off = 0;
    loop {
        let mut got = None;
        fs.readdir(&c(), fh, off, false, |e, _| {
            if got.is_some() {
                return false;
            }
            got = Some((e.offset, e.name.to_vec(), e.ino, e.kind));
            true
        })
        .unwrap();
        match got {
            None => break,
            Some(g) => {
                off = g.0;
                out.push(g);
            }
        }
    }
    fs.releasedir(fh).unwrap();
    out
}

fn read_all(fs: &Filesystem, d: Ino) -> Vec<(u64, Vec<u8>, Ino, FileType)> {
    let fh = fs.opendir(&c(), d).unwrap();
    let mut out = Vec::new();
    fs.readdir(&c(), fh, 0, false, |e, _| {
        out.push((e.offset, e.name.to_vec(), e.ino, e.kind));
        true
    })
    .unwrap();
    fs.releasedir(fh).unwrap();
    out
}

fn check_read(r: &[(u64, Vec<u8>, Ino, FileType)], what: &str) {
    let mut seen = HashSet::new();
    let mut last = 0;
    for (off, name, _, _) in r {
        assert!(
            *off > last,
            "{what}: offsets not increasing: {last} then {off} ({:?})",
            String::from_utf8_lossy(name)
        );
        last = *off;
        assert!(
            seen.insert(name.clone()),
            "{what}: name {:?} twice",
            String::from_utf8_lossy(name)
        );
    }
}

fn pname(i: u64) -> Vec<u8> {
    format!("p{i}").into_bytes()
}
fn qname(i: u64) -> Vec<u8> {
    format!("q{i}").into_bytes()
}

const NP: u64 = 24;
const NQ: u64 = 24;

/// Sets up /d (persistent names p*, churn names q*) and /e.
fn setup(fs: &Filesystem) -> (Ino, Ino) {
    let d = fs.mkdir(&c(), ROOT_INO, b"d", 0o755).unwrap().ino;
    let e = fs.mkdir(&c(), ROOT_INO, b"e", 0o755).unwrap().ino;
    for i in 0..NP {
        let (_, fh) = fs.create(&c(), d, &pname(i), 0o644, libc::O_RDWR).unwrap();
        fs.release(fh).unwrap();
    }
    (d, e)
}

/// One random operation. Names p* always exist in d (only RENAME_WHITEOUT away from them, or
/// renames over them); q* in d and e churn.
fn rop(fs: &Filesystem, r: &mut StdRng, d: Ino, e: Ino) {
    let p = pname(r.random_range(0..NP));
    let q = qname(r.random_range(0..NQ));
    let other = if r.random_range(0..2) == 0 { d } else { e };
    let _ = match r.random_range(0..10) {
        // p -> q (in d or e), leaving a whiteout at p (whiteout over whiteout too)
        0..=2 => fs.rename(&c(), d, &p, other, &q, RENAME_WHITEOUT),
        // q -> p, replacing (keeps p's cookie)
        3 | 4 => fs.rename(&c(), other, &q, d, &p, 0),
        // q -> q' with whiteout
        5 => fs.rename(
            &c(),
            other,
            &q,
            d,
            &qname(r.random_range(0..NQ)),
            RENAME_WHITEOUT,
        ),
        // unlink a q (whiteouts included)
        6 => fs.unlink(&c(), other, &q),
        // create q
        7 => fs
            .create(&c(), other, &q, 0o644, libc::O_RDWR | libc::O_EXCL)
            .map(|(_, fh)| fs.release(fh).unwrap()),
        // p -> p' with whiteout over existing p'
        8 => fs.rename(
            &c(),
            d,
            &p,
            d,
            &pname(r.random_range(0..NP)),
            RENAME_WHITEOUT,
        ),
        // q -> p with whiteout over p
        _ => fs.rename(&c(), other, &q, d, &p, RENAME_WHITEOUT),
    };
}

fn verify_static(fs: &Filesystem, dirs: &[Ino]) {
    fs.check_invariants().unwrap();
    for &d in dirs {
        let r = read_all(fs, d);
        check_read(&r, "final");
        let mut cookies = HashSet::new();
        let mut subdirs = 0;
        for (off, name, ino, kind) in r.iter().skip(2) {
            assert!(cookies.insert(*off));
            let a = fs.lookup(&c(), d, name).unwrap();
            assert_eq!(a.ino, *ino);
            if *kind == FileType::Directory {
                subdirs += 1;
            } else {
                // every file here has one name (no hard links made)
                assert_eq!(a.nlink, 1, "{:?}", String::from_utf8_lossy(name));
            }
            if *kind == FileType::CharDevice {
                assert_eq!(a.rdev, 0);
            }
        }
        let da = fs.getattr(d).unwrap();
        assert_eq!(da.nlink, 2 + subdirs);
        assert_eq!(da.size, 20 * r.len() as u64, "size vs entries");
    }
}

#[test]
fn races_one_by_one() {
    let fs = Arc::new(Filesystem::new(Config::default()));
    let (d, e) = setup(&fs);
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let mut hs = Vec::new();
    for t in 0..3u64 {
        let (fs, stop) = (fs.clone(), stop.clone());
        hs.push(std::thread::spawn(move || {
            let mut r = seed::rng(0x9e3779b97f4a7c15 ^ ((t + 1) * 7919));
            while !stop.load(Relaxed) {
                rop(&fs, &mut r, d, e);
            }
        }));
    }
    for t in 0..2u64 {
        let (fs, stop, reads) = (fs.clone(), stop.clone(), reads.clone());
        hs.push(std::thread::spawn(move || {
            let mut r = seed::rng(12345 + t);
            let mut pcookie: HashMap<Vec<u8>, u64> = HashMap::new();
            while !stop.load(Relaxed) {
                let res = read_one_by_one(&fs, d);
                check_read(&res, "one-by-one");
                let names: HashSet<_> = res.iter().map(|x| x.1.clone()).collect();
                for i in 0..NP {
                    assert!(names.contains(&pname(i)), "p{i} missing from a read");
                }
                for (off, name, _, _) in &res {
                    if name[0] == b'p' {
                        let old = *pcookie.entry(name.clone()).or_insert(*off);
                        assert_eq!(
                            old,
                            *off,
                            "cookie of {:?} changed",
                            String::from_utf8_lossy(name)
                        );
                    }
                }
                // seekdir: resume at an earlier returned offset on a fresh read handle of the
                // same read (same fh keeps the end).
                if res.len() > 3 {
                    let fh = fs.opendir(&c(), d).unwrap();
                    // start the read
                    let mut first = Vec::new();
                    fs.readdir(&c(), fh, 0, false, |e, _| {
                        first.push((e.offset, e.name.to_vec()));
                        first.len() < 5
                    })
                    .unwrap();
                    let pick = res[r.random_range(0..res.len() as u64) as usize].0;
                    let mut rest = Vec::new();
                    fs.readdir(&c(), fh, pick, false, |e, _| {
                        rest.push((e.offset, e.name.to_vec()));
                        true
                    })
                    .unwrap();
                    fs.releasedir(fh).unwrap();
                    let mut seen = HashSet::new();
                    let mut last = pick;
                    for (o, n) in &rest {
                        assert!(*o > last, "seek to {pick}: offset {o} after {last}");
                        last = *o;
                        assert!(
                            seen.insert(n.clone()),
                            "seek: {:?} twice",
                            String::from_utf8_lossy(n)
                        );
                    }
                    // every p with cookie > pick must be there
                    for i in 0..NP {
                        if let Some(&ck) = pcookie.get(&pname(i))
                            && ck > pick
                        {
                            assert!(seen.contains(&pname(i)), "seek {pick}: p{i} ({ck}) missing");
                        }
                    }
                }
                reads.fetch_add(1, Relaxed);
            }
        }));
    }
    std::thread::sleep(Duration::from_secs(
        std::env::var("WHITEOUT_COOKIES_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(4),
    ));
    stop.store(true, Relaxed);
    for h in hs {
        h.join().unwrap();
    }
    eprintln!("reads: {}", reads.load(Relaxed));
    verify_static(&fs, &[d, e]);
}

#[test]
fn rmdir_only_whiteouts() {
    let fs = Filesystem::new(Config::default());
    let d = fs.mkdir(&c(), ROOT_INO, b"d", 0o755).unwrap().ino;
    for i in 0..5 {
        let (_, fh) = fs.create(&c(), d, &pname(i), 0o644, libc::O_RDWR).unwrap();
        fs.release(fh).unwrap();
        fs.rename(&c(), d, &pname(i), ROOT_INO, &pname(i), RENAME_WHITEOUT)
            .unwrap();
    }
    // whiteout over whiteout
    fs.rename(&c(), d, &pname(0), d, &pname(1), RENAME_WHITEOUT)
        .unwrap();
    let r = read_all(&fs, d);
    check_read(&r, "wo");
    assert_eq!(r.len(), 2 + 5);
    assert_eq!(fs.rmdir(&c(), ROOT_INO, b"d"), Err(Errno::ENOTEMPTY));
    for i in 0..5 {
        fs.unlink(&c(), d, &pname(i)).unwrap();
    }
    fs.rmdir(&c(), ROOT_INO, b"d").unwrap();
    fs.check_invariants().unwrap();
}

#[test]
fn heir_cookie_and_read_in_progress() {
    let fs = Filesystem::new(Config::default());
    let d = fs.mkdir(&c(), ROOT_INO, b"d", 0o755).unwrap().ino;
    for i in 0..10 {
        let (_, fh) = fs.create(&c(), d, &pname(i), 0o644, libc::O_RDWR).unwrap();
        fs.release(fh).unwrap();
    }
    let before = read_all(&fs, d);
    let fh = fs.opendir(&c(), d).unwrap();
    let mut got = Vec::new();
    fs.readdir(&c(), fh, 0, false, |e, _| {
        got.push((e.offset, e.name.to_vec()));
        got.len() < 6
    })
    .unwrap();
    // whiteout-rename everything, returned or not, and the whiteouts again
    for i in 0..10 {
        fs.rename(&c(), d, &pname(i), d, &qname(i), RENAME_WHITEOUT)
            .unwrap();
    }
    for i in 0..10 {
        fs.rename(&c(), d, &pname(i), d, &qname(i + 100), RENAME_WHITEOUT)
            .unwrap();
    }
    let last = got.last().unwrap().0;
    fs.readdir(&c(), fh, last, false, |e, _| {
        got.push((e.offset, e.name.to_vec()));
        true
    })
    .unwrap();
    let names: Vec<_> = got
        .iter()
        .map(|x| String::from_utf8_lossy(&x.1).into_owned())
        .collect();
    let mut seen = HashSet::new();
    for n in &names {
        assert!(seen.insert(n.clone()), "{n} twice in {names:?}");
    }
    for i in 0..10 {
        assert!(seen.contains(&format!("p{i}")), "p{i} missing: {names:?}");
    }
    fs.releasedir(fh).unwrap();
    let after = read_all(&fs, d);
    for (off, name, _, _) in &before {
        let a = after.iter().find(|x| &x.1 == name).unwrap();
        assert_eq!(a.0, *off);
    }
    // new entries get fresh cookies
    let cookies: HashSet<u64> = after.iter().map(|x| x.0).collect();
    assert_eq!(cookies.len(), after.len());
    fs.check_invariants().unwrap();
}

// ---------- disk store ----------

type Snap = BTreeMap<Vec<u8>, Vec<(u64, Vec<u8>, u64, FileType, u32, u64)>>;

/// Whole tree: per directory path, entries (offset, name, ino, kind, nlink, rdev).
fn snapshot(fs: &Filesystem) -> Snap {
    let mut out = Snap::new();
    let mut stack = vec![(b"/".to_vec(), ROOT_INO)];
    while let Some((path, d)) = stack.pop() {
        let r = read_all(fs, d);
        check_read(&r, "snapshot");
        let mut v = Vec::new();
        for (off, name, ino, kind) in r.into_iter().skip(2) {
            let a = fs.lookup(&c(), d, &name).unwrap();
            assert_eq!(a.ino, ino);
            if kind == FileType::Directory {
                let mut p = path.clone();
                p.extend_from_slice(&name);
                p.push(b'/');
                stack.push((p, ino));
            }
            v.push((off, name, ino.0, kind, a.nlink, a.rdev));
        }
        let a = fs.getattr(d).unwrap();
        v.push((0, b".".to_vec(), d.0, FileType::Directory, a.nlink, a.size));
        out.insert(path, v);
    }
    out
}

fn workload(fs: &Arc<Filesystem>, seed: u64, secs: u64, threads: u64) -> (Ino, Ino) {
    let (d, e) = setup(fs);
    let stop = Arc::new(AtomicBool::new(false));
    let mut hs = Vec::new();
    for t in 0..threads {
        let (fs, stop) = (fs.clone(), stop.clone());
        hs.push(std::thread::spawn(move || {
            let mut r = seed::rng(seed ^ ((t + 1) * 0x51ed27));
            let t0 = Instant::now();
            let mut n = 0;
            while !stop.load(Relaxed) && n < 20000 {
                rop(&fs, &mut r, d, e);
                n += 1;
                if t0.elapsed().as_secs() >= secs {
                    break;
                }
            }
        }));
    }
    for h in hs {
        h.join().unwrap();
    }
    stop.store(true, Relaxed);
    (d, e)
}

fn fresh_cookies_after_reopen(fs: &Filesystem, snap: &Snap) {
    // create in every directory; cookie distinct from every existing entry there
    let mut stack = vec![ROOT_INO];
    let mut n = 0;
    while let Some(d) = stack.pop() {
        let r = read_all(fs, d);
        let before: HashSet<u64> = r.iter().map(|x| x.0).collect();
        for (_, _, ino, kind) in r.iter().skip(2) {
            if *kind == FileType::Directory {
                stack.push(*ino);
            }
        }
        for k in 0..3 {
            let name = format!("new{k}").into_bytes();
            let (_, fh) = fs.create(&c(), d, &name, 0o644, libc::O_RDWR).unwrap();
            fs.release(fh).unwrap();
            let r2 = read_all(fs, d);
            let mine = r2.iter().find(|x| x.1 == name).unwrap().0;
            assert!(
                !before.contains(&mine),
                "new cookie {mine:#x} reused in dir {d:?}"
            );
            let all: HashSet<u64> = r2.iter().map(|x| x.0).collect();
            assert_eq!(all.len(), r2.len(), "duplicate cookies");
            n += 1;
        }
    }
    let _ = (n, snap);
    fs.check_invariants().unwrap();
}

fn opts() -> lanefs_store::Options {
    lanefs_store::Options {
        commit_interval: Duration::from_millis(5),
        ..Default::default()
    }
}

fn open(dir: &std::path::Path, o: lanefs_store::Options) -> lanefs_store::Opened {
    lanefs_store::open(dir, Config::default(), o).unwrap()
}

#[test]
fn disk_reopen_and_checkpoint() {
    let keep = std::env::var("WHITEOUT_COOKIES_KEEP").ok();
    let tmp = tempfile::tempdir().unwrap();
    let dir = match &keep {
        Some(k) => std::path::PathBuf::from(k),
        None => tmp.path().join("s"),
    };
    let o = opts();
    let live;
    {
        let op = open(&dir, o.clone());
        let fs = Arc::new(op.fs);
        workload(&fs, 77, 2, 3);
        fs.check_invariants().unwrap();
        live = snapshot(&fs);
        op.store.sync().unwrap();
        drop(fs);
        op.store.close().unwrap();
    }
    // journal replay
    {
        let op = open(&dir, o.clone());
        eprintln!("reopen 1: {:?}", op.report);
        op.fs.check_invariants().unwrap();
        let s = snapshot(&op.fs);
        assert_eq!(s, live, "after journal replay");
        // checkpoint, then reopen
        op.store.checkpoint().unwrap();
        op.store.close().unwrap();
    }
    {
        let op = open(&dir, o.clone());
        eprintln!("reopen 2: {:?}", op.report);
        op.fs.check_invariants().unwrap();
        let s = snapshot(&op.fs);
        assert_eq!(s, live, "after checkpoint");
        // more work on top of the checkpoint, then journal replay on top of checkpoint
        let fs = Arc::new(op.fs);
        let d = fs.lookup(&c(), ROOT_INO, b"d").unwrap().ino;
        let e = fs.lookup(&c(), ROOT_INO, b"e").unwrap().ino;
        let mut r = seed::rng(999);
        for _ in 0..3000 {
            rop(&fs, &mut r, d, e);
        }
        let live2 = snapshot(&fs);
        op.store.checkpoint().unwrap();
        for _ in 0..3000 {
            rop(&fs, &mut r, d, e);
        }
        let live3 = snapshot(&fs);
        op.store.sync().unwrap();
        drop(fs);
        op.store.close().unwrap();
        let op = open(&dir, o.clone());
        eprintln!("reopen 3: {:?}", op.report);
        op.fs.check_invariants().unwrap();
        assert_eq!(snapshot(&op.fs), live3, "checkpoint + journal");
        let _ = live2;
        op.store.checkpoint().unwrap();
        op.store.close().unwrap();
    }
    let o2 = opts();
    let rep = lanefs_store::fsck::check(&dir, &o2).unwrap();
    eprintln!("fsck: {rep:?}");
    {
        let op = open(&dir, o.clone());
        fresh_cookies_after_reopen(&op.fs, &live);
        let s = snapshot(&op.fs);
        op.store.close().unwrap();
        let op = open(&dir, o.clone());
        assert_eq!(snapshot(&op.fs), s, "after new creates");
        op.store.close().unwrap();
    }
    if keep.is_some() {
        std::mem::forget(tmp);
    }
}

#[test]
fn simdisk_crash_images() {
    use lanefs_store::disk::{SimDisk, Unflushed};
    let sim = Arc::new(SimDisk::new());
    let dir = std::path::PathBuf::from("/sim/store");
    let mut o = opts();
    o.disk = sim.clone();
    let op = open(&dir, o.clone());
    let fs = Arc::new(op.fs);
    let (d, e) = setup(&fs);
    let mut r = seed::rng(4242);
    let mut synced: Vec<(Snap, SimDisk)> = Vec::new();
    for round in 0..6 {
        for _ in 0..400 {
            rop(&fs, &mut r, d, e);
        }
        if round == 2 {
            op.store.checkpoint().unwrap();
        }
        op.store.sync().unwrap();
        let s = snapshot(&fs);
        // after a sync, any crash image must hold at least this state; with nothing more
        // written, exactly it.
        for mode in [Unflushed::Lost, Unflushed::Kept, Unflushed::Torn(round)] {
            synced.push((s.clone(), sim.crash(mode)));
        }
    }
    drop(fs);
    op.store.close().unwrap();
    for (i, (s, img)) in synced.into_iter().enumerate() {
        let mut o = opts();
        o.disk = Arc::new(img);
        let op = open(&dir, o.clone());
        op.fs
            .check_invariants()
            .unwrap_or_else(|e| panic!("image {i}: {e}"));
        assert_eq!(snapshot(&op.fs), s, "image {i}");
        fresh_cookies_after_reopen(&op.fs, &s);
        op.store.close().unwrap();
        lanefs_store::fsck::check(&dir, &o).unwrap_or_else(|e| panic!("fsck image {i}: {e}"));
    }
}

fn missing_race(mode: u32) -> u64 {
    let fs = Arc::new(Filesystem::new(Config::default()));
    let d = fs.mkdir(&c(), ROOT_INO, b"d", 0o755).unwrap().ino;
    let e = fs.mkdir(&c(), ROOT_INO, b"e", 0o755).unwrap().ino;
    for i in 0..8 {
        let (_, fh) = fs.create(&c(), d, &pname(i), 0o644, libc::O_RDWR).unwrap();
        fs.release(fh).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let w = {
        let (fs, stop) = (fs.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut k = 0u64;
            while !stop.load(Relaxed) {
                let p = pname(k % 8);
                if mode == 0 {
                    // heir only: p -> e/q leaving a whiteout at p, then drop e/q
                    fs.rename(&c(), d, &p, e, b"q", RENAME_WHITEOUT).unwrap();
                    fs.unlink(&c(), e, b"q").unwrap();
                } else {
                    // plain rename over p (no whiteouts at all)
                    let (_, fh) = fs.create(&c(), e, b"q", 0o644, libc::O_RDWR).unwrap();
                    fs.release(fh).unwrap();
                    fs.rename(&c(), e, b"q", d, &p, 0).unwrap();
                }
                k += 1;
            }
        })
    };
    let mut misses = 0;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(3) {
        let r = read_all(&fs, d);
        check_read(&r, "missing_race");
        if r.len() != 2 + 8 {
            misses += 1;
        }
    }
    stop.store(true, Relaxed);
    w.join().unwrap();
    fs.check_invariants().unwrap();
    misses
}

#[test]
fn name_missing_heir_only() {
    let m = missing_race(0);
    assert_eq!(m, 0, "reads that missed a p name (heir only)");
}

#[test]
fn name_missing_plain_replace() {
    let m = missing_race(1);
    assert_eq!(m, 0, "reads that missed a p name (plain rename over)");
}

#[test]
fn failing_commit_and_quota() {
    use lanefs_store::disk::SimDisk;
    let sim = Arc::new(SimDisk::new());
    let dir = std::path::PathBuf::from("/sim/f");
    let mut o = opts();
    o.disk = sim.clone();
    let op = open(&dir, o.clone());
    let fs = &op.fs;
    let d = fs.mkdir(&c(), ROOT_INO, b"d", 0o755).unwrap().ino;
    for i in 0..4 {
        let (_, fh) = fs.create(&c(), d, &pname(i), 0o644, libc::O_RDWR).unwrap();
        fs.release(fh).unwrap();
    }
    fs.rename(&c(), d, &pname(0), d, &qname(0), RENAME_WHITEOUT)
        .unwrap();
    op.store.sync().unwrap();
    let before = snapshot(fs);
    sim.set_failing(true);
    let mut errs = 0;
    for i in 0..4 {
        let r = fs.rename(&c(), d, &pname(i), d, &qname(10 + i), RENAME_WHITEOUT);
        if r.is_err() {
            errs += 1;
        }
        let _ = op.store.sync();
    }
    eprintln!("failing: {errs} errors");
    fs.check_invariants().unwrap();
    let r = read_all(fs, d);
    check_read(&r, "after failing");
    drop(op);
    let _ = before;
}

#[test]
fn inode_quota_whiteout() {
    let cfg = Config {
        max_inodes: Some(6),
        ..Default::default()
    };
    let fs = Filesystem::new(cfg);
    let d = fs.mkdir(&c(), ROOT_INO, b"d", 0o755).unwrap().ino;
    let mut made = 0;
    for i in 0..10 {
        match fs.create(&c(), d, &pname(i), 0o644, libc::O_RDWR) {
            Ok((_, fh)) => {
                fs.release(fh).unwrap();
                made += 1
            }
            Err(_) => break,
        }
    }
    let before = read_all(&fs, d);
    let r = fs.rename(&c(), d, &pname(0), d, &qname(0), RENAME_WHITEOUT);
    eprintln!("made {made}, whiteout rename at quota: {r:?}");
    assert!(r.is_err());
    assert_eq!(read_all(&fs, d), before);
    fs.check_invariants().unwrap();
    fs.unlink(&c(), d, &pname(1)).unwrap();
    fs.rename(&c(), d, &pname(0), d, &qname(0), RENAME_WHITEOUT)
        .unwrap();
    let after = read_all(&fs, d);
    check_read(&after, "q");
    assert_eq!(
        after.iter().find(|x| x.1 == pname(0)).unwrap().0,
        before.iter().find(|x| x.1 == pname(0)).unwrap().0
    );
    fs.check_invariants().unwrap();
}

#[test]
fn dirs_race() {
    let fs = Arc::new(Filesystem::new(Config::default()));
    let d = fs.mkdir(&c(), ROOT_INO, b"d", 0o755).unwrap().ino;
    let e = fs.mkdir(&c(), ROOT_INO, b"e", 0o755).unwrap().ino;
    for i in 0..8 {
        let s = fs
            .mkdir(&c(), d, &format!("s{i}").into_bytes(), 0o755)
            .unwrap()
            .ino;
        for j in 0..3 {
            let (_, fh) = fs.create(&c(), s, &pname(j), 0o644, libc::O_RDWR).unwrap();
            fs.release(fh).unwrap();
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut hs = Vec::new();
    for t in 0..3u64 {
        let (fs, stop) = (fs.clone(), stop.clone());
        hs.push(std::thread::spawn(move || {
            let mut r = seed::rng(0xabcdef ^ ((t + 1) * 104729));
            while !stop.load(Relaxed) {
                let i = r.random_range(0..8);
                let s = format!("s{i}").into_bytes();
                let tn = format!("t{}", r.random_range(0..8)).into_bytes();
                let (from, to) = if r.random_range(0..2) == 0 {
                    (d, e)
                } else {
                    (e, d)
                };
                let _ = match r.random_range(0..8) {
                    0 | 1 => fs.rename(&c(), from, &s, to, &tn, RENAME_WHITEOUT),
                    2 => fs.rename(&c(), from, &tn, to, &s, RENAME_WHITEOUT),
                    3 => fs
                        .rmdir(&c(), from, &tn)
                        .or_else(|_| fs.unlink(&c(), from, &tn)),
                    4 => fs.unlink(&c(), from, &s),
                    5 => {
                        // whiteouts inside a subdirectory, then try to rmdir it
                        if let Ok(a) = fs.lookup(&c(), from, &s)
                            && a.mode & libc::S_IFMT == libc::S_IFDIR
                        {
                            for j in 0..3 {
                                let _ = fs.rename(
                                    &c(),
                                    a.ino,
                                    &pname(j),
                                    a.ino,
                                    &qname(j),
                                    RENAME_WHITEOUT,
                                );
                                let _ = fs.unlink(&c(), a.ino, &qname(j));
                            }
                            let rr = fs.rmdir(&c(), from, &s);
                            if let Ok(l) = fs.lookup(&c(), from, &s) {
                                let _ = l;
                            }
                            if rr.is_ok() {
                                let _ = fs.mkdir(&c(), from, &s, 0o755);
                            }
                        }
                        Ok(())
                    }
                    6 => fs.mkdir(&c(), from, &s, 0o755).map(|_| ()),
                    _ => {
                        if let Ok(a) = fs.lookup(&c(), from, &s)
                            && a.mode & libc::S_IFMT == libc::S_IFDIR
                        {
                            for j in 0..3 {
                                let _ = fs.unlink(&c(), a.ino, &pname(j));
                            }
                            let _ = fs.rmdir(&c(), from, &s);
                        }
                        Ok(())
                    }
                };
            }
        }));
    }
    let rd = {
        let (fs, stop) = (fs.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Relaxed) {
                for dd in [d, e] {
                    let r = read_one_by_one(&fs, dd);
                    check_read(&r, "dirs");
                    for (_, name, ino, kind) in r.iter().skip(2) {
                        if *kind == FileType::Directory
                            && let Ok(fh) = fs.opendir(&c(), *ino)
                        {
                            let mut v = Vec::new();
                            let _ = fs.readdir(&c(), fh, 0, true, |e, _| {
                                v.push((e.offset, e.name.to_vec(), e.ino, e.kind));
                                true
                            });
                            check_read(&v, "sub");
                            fs.releasedir(fh).unwrap();
                        }
                        let _ = name;
                    }
                    n += 1;
                }
            }
            n
        })
    };
    std::thread::sleep(Duration::from_secs(4));
    stop.store(true, Relaxed);
    for h in hs {
        h.join().unwrap();
    }
    eprintln!("reads {}", rd.join().unwrap());
    fs.check_invariants().unwrap();
    // rmdir semantics in the final state
    for dd in [d, e] {
        for (_, name, ino, kind) in read_all(&fs, dd).into_iter().skip(2) {
            if kind != FileType::Directory {
                continue;
            }
            let inner = read_all(&fs, ino);
            let r = fs.rmdir(&c(), dd, &name);
            if inner.len() > 2 {
                assert_eq!(
                    r,
                    Err(Errno::ENOTEMPTY),
                    "{:?}",
                    String::from_utf8_lossy(&name)
                );
                for (_, n, _, _) in inner.into_iter().skip(2) {
                    fs.unlink(&c(), ino, &n).unwrap();
                }
                fs.rmdir(&c(), dd, &name).unwrap();
            } else {
                r.unwrap();
            }
        }
    }
    verify_static(&fs, &[d, e]);
}

#[test]
fn background_checkpoints_and_midflight_crashes() {
    use lanefs_store::disk::{SimDisk, Unflushed};
    let sim = Arc::new(SimDisk::new());
    let dir = std::path::PathBuf::from("/sim/bg");
    let mut o = opts();
    o.disk = sim.clone();
    o.checkpoint_records = 300;
    o.checkpoint_poll = Duration::from_millis(5);
    o.checkpoint_changed = 4096;
    let op = open(&dir, o.clone());
    let fs = Arc::new(op.fs);
    let (d, e) = setup(&fs);
    let stop = Arc::new(AtomicBool::new(false));
    let mut hs = Vec::new();
    for t in 0..2u64 {
        let (fs, stop) = (fs.clone(), stop.clone());
        hs.push(std::thread::spawn(move || {
            let mut r = seed::rng(0x1234567 ^ ((t + 1) * 31));
            while !stop.load(Relaxed) {
                rop(&fs, &mut r, d, e);
            }
        }));
    }
    let mut imgs = Vec::new();
    for k in 0..6u64 {
        std::thread::sleep(Duration::from_millis(150));
        imgs.push(sim.crash(if k % 2 == 0 {
            Unflushed::Kept
        } else {
            Unflushed::Torn(k)
        }));
    }
    stop.store(true, Relaxed);
    for h in hs {
        h.join().unwrap();
    }
    let live = snapshot(&fs);
    op.store.sync().unwrap();
    eprintln!("checkpoint lsn {}", op.store.checkpoint_lsn());
    drop(fs);
    op.store.close().unwrap();
    {
        let op = open(&dir, o.clone());
        assert_eq!(
            snapshot(&op.fs),
            live,
            "reopen after background checkpoints"
        );
        op.store.close().unwrap();
    }
    for (i, img) in imgs.into_iter().enumerate() {
        let mut o2 = opts();
        o2.disk = Arc::new(img);
        let op = open(&dir, o2.clone());
        eprintln!("img {i}: {:?}", op.report);
        op.fs
            .check_invariants()
            .unwrap_or_else(|e| panic!("image {i}: {e}"));
        let s = snapshot(&op.fs);
        fresh_cookies_after_reopen(&op.fs, &s);
        let s2 = snapshot(&op.fs);
        op.store.close().unwrap();
        let op = open(&dir, o2.clone());
        assert_eq!(snapshot(&op.fs), s2, "image {i} reopened");
        op.store.close().unwrap();
        lanefs_store::fsck::check(&dir, &o2).unwrap_or_else(|e| panic!("fsck image {i}: {e}"));
    }
}

#[test]
fn compact_keeps_heirs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("s");
    let o = opts();
    let op = open(&dir, o.clone());
    let fs = Arc::new(op.fs);
    workload(&fs, 5, 1, 2);
    let live = snapshot(&fs);
    op.store.sync().unwrap();
    drop(fs);
    op.store.close().unwrap();
    let rep = lanefs_store::compact(&dir, o.clone()).unwrap();
    eprintln!("compact: {rep:?}");
    let op = open(&dir, o.clone());
    op.fs.check_invariants().unwrap();
    assert_eq!(snapshot(&op.fs), live, "after compact");
    fresh_cookies_after_reopen(&op.fs, &live);
    op.store.close().unwrap();
    lanefs_store::fsck::check(&dir, &o).unwrap();
}
