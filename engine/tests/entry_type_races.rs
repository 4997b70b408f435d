//! Races on the type each directory entry keeps beside its inode number (`dir/node.rs`):
//! renames of every flavour (plain, `RENAME_EXCHANGE`, `RENAME_NOREPLACE`, `RENAME_WHITEOUT`,
//! over an existing target), links and unlinks change names between inodes of every type
//! while readers list the directories every way the API offers (`Client::read_dir`, a handle
//! read whole or in pieces, `readdir_inode`, readdirplus by a library and by a kernel
//! caller), and each listed `(name, ino, kind)` is checked against what that inode is.
//! `check_invariants` (which now compares each entry's type with its inode's) runs at every
//! quiescent moment, with an exact comparison of listings with lookups.
//!
//! Seeds: `LANEFS_SEED` (printed); `LANEFS_ROUNDS` scales the rounds.

#[path = "common/seed.rs"]
mod seed;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::{Arc, Barrier, Mutex};

use lanefs::{
    Attr, Client, Config, Ctx, Errno, FileType, Filesystem, Ino, Locking, RENAME_EXCHANGE,
    RENAME_NOREPLACE, RENAME_WHITEOUT,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

// ----- shared helpers ---------------------------------------------------------------------

fn new_fs() -> Arc<Filesystem> {
    Arc::new(Filesystem::new(Config {
        protected_hardlinks: false,
        protected_symlinks: false,
        max_inodes: Some(1 << 20),
        // Ignored by the memory store: a kernel's readdirplus still gets attributes.
        inode_cache: Some(64 * lanefs::INODE_BYTES),
        ..Config::default()
    }))
}

const TYPES: [FileType; 7] = [
    FileType::RegularFile,
    FileType::Directory,
    FileType::Symlink,
    FileType::NamedPipe,
    FileType::Socket,
    FileType::CharDevice,
    FileType::BlockDevice,
];

/// Makes `name` in `dir` of type `t` (a directory gets a file `pin` inside, so that nothing
/// can replace it: a rename over a non-empty directory fails). Character devices are 1/3,
/// never 0/0 (a whiteout).
fn make(fs: &Filesystem, ctx: &Ctx, dir: Ino, name: &[u8], t: FileType) -> Result<Attr, Errno> {
    let reg = libc::S_IFREG | 0o644;
    match t {
        FileType::RegularFile => fs.mknod(ctx, dir, name, reg, 0),
        FileType::Directory => {
            let a = fs.mkdir(ctx, dir, name, 0o755)?;
            fs.mknod(ctx, a.ino, b"pin", reg, 0)
                .expect("a pin in a directory just made, that nobody else names");
            Ok(a)
        }
        FileType::Symlink => fs.symlink(ctx, dir, name, b"somewhere/else"),
        FileType::NamedPipe => fs.mknod(ctx, dir, name, libc::S_IFIFO | 0o644, 0),
        FileType::Socket => fs.mknod(ctx, dir, name, libc::S_IFSOCK | 0o644, 0),
        FileType::CharDevice => fs.mknod(ctx, dir, name, libc::S_IFCHR | 0o644, 0x103),
        FileType::BlockDevice => fs.mknod(ctx, dir, name, libc::S_IFBLK | 0o644, 0x800),
    }
}

/// Ways of listing a directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum How {
    /// `Client::read_dir` by path (no `.`/`..`).
    Client,
    /// One `readdir(plus = false)` through a handle.
    Plain,
    /// `readdir(plus = false)` in pieces of 1..=5 entries, each continued from the last
    /// accepted entry's offset.
    Chunked,
    /// `read_end` + `readdir_inode(plus = false)`.
    NoHandle,
    /// readdirplus by a library caller.
    Plus,
    /// readdirplus by a kernel caller (lookup references forgotten after).
    Kernel,
}

const HOWS: [How; 6] = [
    How::Client,
    How::Plain,
    How::Chunked,
    How::NoHandle,
    How::Plus,
    How::Kernel,
];

#[derive(Clone, Debug)]
struct Listed {
    name: Vec<u8>,
    ino: Ino,
    kind: FileType,
    attr: Option<Attr>,
}

fn show(n: &[u8]) -> String {
    String::from_utf8_lossy(n).into_owned()
}

/// Lists directory `dir` (at `path`) as `how` says; `.` and `..` are checked and left out.
/// Checks what any listing must hold whatever races: no name twice, a readdirplus entry's
/// attributes are of the inode it names with its type, a kernel caller holds a lookup
/// reference exactly on the entries it got attributes for (dropped again here).
fn list(fs: &Arc<Filesystem>, dir: Ino, path: &str, how: How, rng: &mut StdRng) -> Vec<Listed> {
    let lib = Ctx::root();
    let kernel = Ctx::root().via_kernel();
    let mut out: Vec<Listed> = Vec::new();
    let mut dots = Vec::new();
    let mut push = |name: &[u8], ino: Ino, kind: FileType, attr: Option<&Attr>| {
        if name == b"." || name == b".." {
            dots.push((name.to_vec(), ino, kind));
        } else {
            out.push(Listed {
                name: name.to_vec(),
                ino,
                kind,
                attr: attr.copied(),
            });
        }
    };
    match how {
        How::Client => {
            for e in Client::root(fs.clone()).read_dir(path).unwrap() {
                push(&e.name, e.ino, e.kind, None);
            }
        }
        How::Plain | How::Plus | How::Kernel => {
            let ctx = if how == How::Kernel { &kernel } else { &lib };
            let fh = fs.opendir(ctx, dir).unwrap();
            fs.readdir(ctx, fh, 0, how != How::Plain, |e, a| {
                push(e.name, e.ino, e.kind, a);
                true
            })
            .unwrap();
            fs.releasedir(fh).unwrap();
        }
        How::Chunked => {
            let fh = fs.opendir(&lib, dir).unwrap();
            let mut off = 0;
            loop {
                let want = rng.random_range(1..=5usize);
                let mut got = 0;
                let mut last = off;
                fs.readdir(&lib, fh, off, false, |e, a| {
                    if got == want {
                        return false;
                    }
                    got += 1;
                    last = e.offset;
                    push(e.name, e.ino, e.kind, a);
                    true
                })
                .unwrap();
                if got < want {
                    break;
                }
                off = last;
            }
            fs.releasedir(fh).unwrap();
        }
        How::NoHandle => {
            let end = fs.read_end(dir).unwrap();
            fs.readdir_inode(&lib, dir, 0, &end, false, |e, a| {
                push(e.name, e.ino, e.kind, a);
                true
            })
            .unwrap();
        }
    }
    if how != How::Client {
        assert_eq!(
            dots.iter().map(|d| d.0.clone()).collect::<Vec<_>>(),
            vec![b".".to_vec(), b"..".to_vec()],
            "{how:?} of {path}: . and .. first, once each"
        );
        assert_eq!(dots[0].1, dir, "{how:?} of {path}: . is the directory");
        assert!(
            dots.iter().all(|d| d.2 == FileType::Directory),
            "{how:?} of {path}: . and .. are directories: {dots:?}"
        );
    }
    let mut names = HashSet::new();
    for e in &out {
        assert!(
            names.insert(e.name.clone()),
            "{how:?} of {path}: {} listed twice",
            show(&e.name)
        );
        if let Some(a) = &e.attr {
            assert_eq!(
                (a.ino, a.kind()),
                (e.ino, e.kind),
                "{how:?} of {path}: {}: the attributes are of another inode or type",
                show(&e.name)
            );
        }
    }
    if how == How::Kernel {
        for e in &out {
            if e.attr.is_some() {
                assert!(
                    fs.held_by_kernel(e.ino),
                    "kernel readdirplus of {path}: {} came with attributes but no lookup",
                    show(&e.name)
                );
                fs.forget(e.ino, 1);
            }
        }
    }
    out
}

fn kernel_holds_none(fs: &Filesystem, inos: impl IntoIterator<Item = Ino>, what: &str) {
    for i in inos {
        assert!(
            !fs.held_by_kernel(i),
            "{what}: inode {i} still held by the kernel after every FORGET"
        );
    }
}

fn check(fs: &Filesystem, what: &str) {
    if let Err(e) = fs.check_invariants() {
        panic!("{what}: check_invariants:\n{e}");
    }
}

/// Listings of `dirs` (path, ino) at a quiescent moment, by `Plain` and `Client`, compared
/// entry by entry with `lookup` of each name: (name -> (ino, kind)) per directory.
fn quiescent_listing(
    fs: &Arc<Filesystem>,
    dirs: &[(&str, Ino)],
    rng: &mut StdRng,
    what: &str,
) -> Vec<BTreeMap<Vec<u8>, (Ino, FileType)>> {
    let ctx = Ctx::root();
    let mut all = Vec::new();
    for &(path, d) in dirs {
        let mut by = Vec::new();
        for how in HOWS {
            let l = list(fs, d, path, how, rng);
            let m: BTreeMap<_, _> = l
                .iter()
                .map(|e| (e.name.clone(), (e.ino, e.kind)))
                .collect();
            by.push((how, m));
        }
        for (how, m) in &by[1..] {
            assert_eq!(
                &by[0].1, m,
                "{what}: quiescent listings of {path} by {:?} and {how:?} differ",
                by[0].0
            );
        }
        let m = by.swap_remove(0).1;
        for (name, &(ino, kind)) in &m {
            let a = fs
                .lookup(&ctx, d, name)
                .unwrap_or_else(|e| panic!("{what}: {path}/{} listed, lookup {e:?}", show(name)));
            assert_eq!(
                (a.ino, a.kind()),
                (ino, kind),
                "{what}: {path}/{}: listed (ino, type) differs from the inode's",
                show(name)
            );
        }
        all.push(m);
    }
    all
}

fn thread_rng(seed: u64, round: u64, t: u64) -> StdRng {
    StdRng::seed_from_u64(
        seed ^ round.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ (t + 1).wrapping_mul(0xD1B5_4A32_D192_ED03),
    )
}

// ----- 1: exchanges only, types fixed per inode ---------------------------------------------

/// Two directories, each with one name per type (twice); writers exchange random pairs of
/// names (same or different directory, a file with a directory included) with
/// `RENAME_EXCHANGE`, so the set of names and the type of each inode never change; no inode
/// is ever freed, so numbers are never reused. Each listing, however it races, must hold
/// every name exactly once, each with its inode's one type; a lookup likewise. Quiescent:
/// every listing way agrees with lookups, the names still name a permutation of the
/// inodes, check_invariants, no kernel reference left.
#[test]
fn exchanges_keep_entry_types_with_their_inodes() {
    exchanges(
        "exchanges_keep_entry_types_with_their_inodes",
        Locking::Lanes,
        seed::rounds(40),
    );
}

/// [`exchanges_keep_entry_types_with_their_inodes`] under the benchmarks' "before" locking
/// modes (a directory lock per mutation; one global lock), fewer rounds.
#[test]
fn exchanges_keep_entry_types_dirlock_and_coarse() {
    let r = seed::rounds(40).div_ceil(4);
    exchanges("exchanges_keep_entry_types (dirlock)", Locking::DirLock, r);
    exchanges("exchanges_keep_entry_types (coarse)", Locking::Coarse, r);
}

fn exchanges(name: &str, locking: Locking, rounds: u64) {
    let seed = seed::seed(name);
    let fs = Arc::new(Filesystem::new(Config {
        locking,
        ..(*new_fs()).config().clone()
    }));
    let ctx = Ctx::root();
    let p = fs.mkdir(&ctx, Ino::ROOT, b"p", 0o755).unwrap().ino;
    let q = fs.mkdir(&ctx, Ino::ROOT, b"q", 0o755).unwrap().ino;
    let dirs = [("/p", p), ("/q", q)];
    let mut types: HashMap<Ino, FileType> = HashMap::new();
    let mut slots: Vec<(usize, Vec<u8>)> = Vec::new();
    for (di, &(_, d)) in dirs.iter().enumerate() {
        for k in 0..14 {
            let t = TYPES[k % TYPES.len()];
            let name = format!("n{k}").into_bytes();
            let a = make(&fs, &ctx, d, &name, t).unwrap();
            assert_eq!(a.kind(), t);
            types.insert(a.ino, t);
            slots.push((di, name));
        }
    }
    let all_inos: Vec<Ino> = types.keys().copied().collect();
    let types = Arc::new(types);
    let slots = Arc::new(slots);
    let (writers, readers) = (2u64, 3u64);
    let ops_per_round = 3000u64;
    let listings = AtomicU64::new(0);
    let exchanges = AtomicU64::new(0);
    for round in 0..rounds {
        let done = AtomicU64::new(0);
        let start = Barrier::new((writers + readers + 1) as usize);
        std::thread::scope(|s| {
            for w in 0..writers {
                let (fs, slots, done, start, exchanges) = (&fs, &slots, &done, &start, &exchanges);
                s.spawn(move || {
                    let mut rng = thread_rng(seed, round, w);
                    let ctx = Ctx::root();
                    start.wait();
                    for _ in 0..ops_per_round {
                        let a = &slots[rng.random_range(0..slots.len())];
                        let b = &slots[rng.random_range(0..slots.len())];
                        let r =
                            fs.rename(&ctx, dirs[a.0].1, &a.1, dirs[b.0].1, &b.1, RENAME_EXCHANGE);
                        assert_eq!(
                            r,
                            Ok(()),
                            "exchange {}/{} <-> {}/{}",
                            dirs[a.0].0,
                            show(&a.1),
                            dirs[b.0].0,
                            show(&b.1)
                        );
                        exchanges.fetch_add(1, Relaxed);
                    }
                    done.fetch_add(1, SeqCst);
                });
            }
            for r in 0..readers {
                let (fs, types, slots, done, start, listings) =
                    (&fs, &types, &slots, &done, &start, &listings);
                s.spawn(move || {
                    let mut rng = thread_rng(seed, round, 100 + r);
                    let ctx = Ctx::root();
                    start.wait();
                    let mut k = 0usize;
                    loop {
                        let finished = done.load(SeqCst) == writers;
                        if r == 2 {
                            // Lookups of random names: the inode found is of its fixed type.
                            for _ in 0..32 {
                                let sl = &slots[rng.random_range(0..slots.len())];
                                let a = fs.lookup(&ctx, dirs[sl.0].1, &sl.1).unwrap();
                                assert_eq!(
                                    Some(&a.kind()),
                                    types.get(&a.ino),
                                    "lookup {}/{}: inode {} has the wrong type",
                                    dirs[sl.0].0,
                                    show(&sl.1),
                                    a.ino
                                );
                            }
                        }
                        let how = HOWS[(k + r as usize) % HOWS.len()];
                        let (path, d) = dirs[rng.random_range(0..2)];
                        let l = list(fs, d, path, how, &mut rng);
                        let want: HashSet<Vec<u8>> = (0..14).map(|k| format!("n{k}").into_bytes()).collect();
                        let got: HashSet<Vec<u8>> = l.iter().map(|e| e.name.clone()).collect();
                        assert_eq!(got, want, "{how:?} of {path}: names exchanged are never missing");
                        for e in &l {
                            let t = types.get(&e.ino);
                            assert_eq!(
                                Some(&e.kind),
                                t,
                                "round {round}: {how:?} of {path}: {} listed as inode {} of type {:?}, \
                                 which is a {t:?}",
                                show(&e.name),
                                e.ino,
                                e.kind
                            );
                            if how == How::Kernel {
                                assert_eq!(
                                    e.attr.is_some(),
                                    e.kind != FileType::Directory,
                                    "kernel readdirplus, unbounded cache: attributes for every \
                                     file never shared, none for a directory ({})",
                                    show(&e.name)
                                );
                            }
                        }
                        listings.fetch_add(1, Relaxed);
                        k += 1;
                        if finished {
                            break;
                        }
                    }
                });
            }
            start.wait();
        });
        let what = format!("seed {seed} round {round}");
        check(&fs, &what);
        let mut rng = thread_rng(seed, round, 999);
        let maps = quiescent_listing(&fs, &dirs, &mut rng, &what);
        let mut seen: Vec<Ino> = maps.iter().flat_map(|m| m.values().map(|v| v.0)).collect();
        seen.sort();
        let mut want = all_inos.clone();
        want.sort();
        assert_eq!(seen, want, "{what}: names no longer name each inode once");
        for m in &maps {
            for (n, (i, k)) in m {
                assert_eq!(types.get(i), Some(k), "{what}: {} quiescent type", show(n));
            }
        }
        kernel_holds_none(&fs, all_inos.iter().copied(), &what);
    }
    eprintln!(
        "{name}: {} exchanges, {} listings over {rounds} rounds",
        exchanges.load(Relaxed),
        listings.load(Relaxed)
    );
}

// ----- 2: every kind of rename, links and unlinks, against a model ---------------------------

/// What the test knows of the names (changed only under the names' locks) and inodes.
struct Model {
    /// slot -> inode it names.
    names: Mutex<HashMap<usize, Ino>>,
    /// Every inode's type, registered before any name makes it visible (whiteouts: just
    /// after their rename, under the source name's lock).
    types: Mutex<HashMap<Ino, FileType>>,
}

/// Two directories of 12 names each, with a lock per name held by a writer for the names
/// it changes (readers take none), so that a model says what each change must do. Every
/// inode keeps a second name in `/keep` (directories keep a file inside), so none is ever
/// freed and each number keeps its one type. Writers: creations (made in a private staging
/// directory, its type registered, then moved in with `RENAME_NOREPLACE`), renames with
/// flags 0, `RENAME_NOREPLACE`, `RENAME_EXCHANGE` and `RENAME_WHITEOUT` (the errno checked
/// against the model: ENOENT, EEXIST, EISDIR, ENOTDIR, ENOTEMPTY), links and unlinks.
/// Readers list both directories every way, each entry's type checked against its inode's
/// (an inode not registered yet, a whiteout, checked again at the end of the round).
/// Quiescent: listings == model, lookups agree, check_invariants.
#[test]
fn renames_whiteouts_links_against_a_model() {
    let seed = seed::seed("renames_whiteouts_links_against_a_model");
    let rounds = seed::rounds(40);
    let fs = new_fs();
    let ctx = Ctx::root();
    let p = fs.mkdir(&ctx, Ino::ROOT, b"p", 0o755).unwrap().ino;
    let q = fs.mkdir(&ctx, Ino::ROOT, b"q", 0o755).unwrap().ino;
    let keep = fs.mkdir(&ctx, Ino::ROOT, b"keep", 0o755).unwrap().ino;
    let stage = fs.mkdir(&ctx, Ino::ROOT, b"stage", 0o755).unwrap().ino;
    let dirs = [("/p", p), ("/q", q)];
    const PER_DIR: usize = 12;
    let slot_dir = |s: usize| dirs[s / PER_DIR];
    let slot_name = |s: usize| format!("e{}", s % PER_DIR).into_bytes();
    let nslots = 2 * PER_DIR;
    let locks: Vec<Mutex<()>> = (0..nslots).map(|_| Mutex::new(())).collect();
    let model = Model {
        names: Mutex::new(HashMap::new()),
        types: Mutex::new(HashMap::new()),
    };
    let keep_seq = AtomicU64::new(0);
    let keep_link = |fs: &Filesystem, ino: Ino| {
        let n = format!("k{}", keep_seq.fetch_add(1, Relaxed)).into_bytes();
        fs.link(&Ctx::root(), ino, keep, &n).unwrap();
    };
    let (writers, readers) = (3u64, 2u64);
    let ops_per_round = 3000u64;
    let counts: Vec<AtomicU64> = (0..8).map(|_| AtomicU64::new(0)).collect();
    let listings = AtomicU64::new(0);
    let stages: Vec<Ino> = (0..writers)
        .map(|w| {
            fs.mkdir(&ctx, stage, format!("t{w}").as_bytes(), 0o755)
                .unwrap()
                .ino
        })
        .collect();
    for round in 0..rounds {
        let done = AtomicU64::new(0);
        let start = Barrier::new((writers + readers + 1) as usize);
        let suspects: Mutex<Vec<(String, Ino, FileType)>> = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for w in 0..writers {
                let (fs, locks, model, done, start, counts, keep_link, stages, keep_seq) = (
                    &fs, &locks, &model, &done, &start, &counts, &keep_link, &stages, &keep_seq,
                );
                s.spawn(move || {
                    let mut rng = thread_rng(seed, round, w);
                    let ctx = Ctx::root();
                    let my_stage = stages[w as usize];
                    start.wait();
                    for _ in 0..ops_per_round {
                        let a = rng.random_range(0..nslots);
                        let b = rng.random_range(0..nslots);
                        let (lo, hi) = (a.min(b), a.max(b));
                        let _la = locks[lo].lock().unwrap();
                        let _lb = (lo != hi).then(|| locks[hi].lock().unwrap());
                        let (ad, an) = (slot_dir(a), slot_name(a));
                        let (bd, bn) = (slot_dir(b), slot_name(b));
                        let at = |s: usize| model.names.lock().unwrap().get(&s).copied();
                        let ty = |i: Ino| model.types.lock().unwrap()[&i];
                        let op = rng.random_range(0..10u32);
                        let what = format!(
                            "seed {seed} round {round} writer {w}: op {op} on {}/{} and {}/{}",
                            ad.0,
                            show(&an),
                            bd.0,
                            show(&bn)
                        );
                        match op {
                            // Create at `a`.
                            0 | 1 => {
                                let t = TYPES[rng.random_range(0..TYPES.len())];
                                if at(a).is_some() {
                                    assert_eq!(
                                        make(fs, &ctx, ad.1, &an, t).map(|_| ()),
                                        Err(Errno::EEXIST),
                                        "{what}: create over an existing name"
                                    );
                                    continue;
                                }
                                let x = make(fs, &ctx, my_stage, b"x", t).unwrap();
                                model.types.lock().unwrap().insert(x.ino, t);
                                if t != FileType::Directory {
                                    keep_link(fs, x.ino);
                                }
                                let r =
                                    fs.rename(&ctx, my_stage, b"x", ad.1, &an, RENAME_NOREPLACE);
                                assert_eq!(r, Ok(()), "{what}: move a new {t:?} in");
                                model.names.lock().unwrap().insert(a, x.ino);
                                counts[0].fetch_add(1, Relaxed);
                            }
                            // Rename `a` to `b` with some flags.
                            2..=6 => {
                                let flags =
                                    [0, 0, RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_WHITEOUT]
                                        [(op - 2) as usize];
                                let (src, dst) = (at(a), at(b));
                                let r = fs.rename(&ctx, ad.1, &an, bd.1, &bn, flags);
                                let want = match (src, dst) {
                                    (None, _) => Err(Errno::ENOENT),
                                    (Some(_), Some(_)) if flags == RENAME_NOREPLACE => {
                                        Err(Errno::EEXIST)
                                    }
                                    (Some(_), None) if flags == RENAME_EXCHANGE => {
                                        Err(Errno::ENOENT)
                                    }
                                    (Some(x), Some(y)) if x == y => Ok(()),
                                    (Some(_), Some(_)) if flags == RENAME_EXCHANGE => Ok(()),
                                    (Some(x), Some(y)) => {
                                        let (xd, yd) = (
                                            ty(x) == FileType::Directory,
                                            ty(y) == FileType::Directory,
                                        );
                                        match (xd, yd) {
                                            (true, false) => Err(Errno::ENOTDIR),
                                            (false, true) => Err(Errno::EISDIR),
                                            (true, true) => Err(Errno::ENOTEMPTY),
                                            (false, false) => Ok(()),
                                        }
                                    }
                                    (Some(_), None) => Ok(()),
                                };
                                assert_eq!(
                                    r, want,
                                    "{what}: rename flags {flags:#x}, src {src:?} dst {dst:?}"
                                );
                                if r.is_err() || src == dst {
                                    continue;
                                }
                                let x = src.unwrap();
                                let mut names = model.names.lock().unwrap();
                                if flags == RENAME_EXCHANGE {
                                    names.insert(a, dst.unwrap());
                                    names.insert(b, x);
                                    counts[3].fetch_add(1, Relaxed);
                                    continue;
                                }
                                names.remove(&a);
                                names.insert(b, x);
                                drop(names);
                                if flags == RENAME_WHITEOUT {
                                    // The whiteout: under `a`'s lock, nobody else changes it.
                                    let wa = fs.lookup(&ctx, ad.1, &an).unwrap_or_else(|e| {
                                        panic!("{what}: no whiteout left at the source: {e:?}")
                                    });
                                    assert_eq!(
                                        (wa.kind(), wa.rdev),
                                        (FileType::CharDevice, 0),
                                        "{what}: the whiteout left is a 0/0 character device"
                                    );
                                    model
                                        .types
                                        .lock()
                                        .unwrap()
                                        .insert(wa.ino, FileType::CharDevice);
                                    keep_link(fs, wa.ino);
                                    model.names.lock().unwrap().insert(a, wa.ino);
                                    counts[4].fetch_add(1, Relaxed);
                                } else {
                                    counts[if dst.is_some() { 2 } else { 1 }].fetch_add(1, Relaxed);
                                }
                            }
                            // Link `a` as `b`.
                            7 => {
                                let (src, dst) = (at(a), at(b));
                                let Some(sx) = src else { continue };
                                let r = fs.link(&ctx, sx, bd.1, &bn);
                                match (src, dst) {
                                    (None, _) => unreachable!(),
                                    (Some(_), Some(_)) => assert_eq!(
                                        r.map(|_| ()),
                                        Err(Errno::EEXIST),
                                        "{what}: link over a name"
                                    ),
                                    (Some(x), None) if ty(x) == FileType::Directory => assert_eq!(
                                        r.map(|_| ()),
                                        Err(Errno::EPERM),
                                        "{what}: link of a directory"
                                    ),
                                    (Some(x), None) => {
                                        let got =
                                            r.unwrap_or_else(|e| panic!("{what}: link {e:?}"));
                                        assert_eq!(
                                            (got.ino, got.kind()),
                                            (x, ty(x)),
                                            "{what}: link"
                                        );
                                        model.names.lock().unwrap().insert(b, x);
                                        counts[5].fetch_add(1, Relaxed);
                                    }
                                }
                            }
                            // Unlink `a`.
                            _ => {
                                let r = fs.unlink(&ctx, ad.1, &an);
                                match at(a) {
                                    None => assert_eq!(r, Err(Errno::ENOENT), "{what}: unlink"),
                                    Some(x) if ty(x) == FileType::Directory => {
                                        assert_eq!(r, Err(Errno::EISDIR), "{what}: unlink a dir");
                                        // Retired to /keep instead (never freed).
                                        let n = format!("d{}", keep_seq.fetch_add(1, Relaxed));
                                        let r = fs.rename(
                                            &ctx,
                                            ad.1,
                                            &an,
                                            keep,
                                            n.as_bytes(),
                                            RENAME_NOREPLACE,
                                        );
                                        assert_eq!(r, Ok(()), "{what}: retire a directory");
                                        model.names.lock().unwrap().remove(&a);
                                        counts[7].fetch_add(1, Relaxed);
                                    }
                                    Some(_) => {
                                        assert_eq!(r, Ok(()), "{what}: unlink");
                                        model.names.lock().unwrap().remove(&a);
                                        counts[6].fetch_add(1, Relaxed);
                                    }
                                }
                            }
                        }
                    }
                    done.fetch_add(1, SeqCst);
                });
            }
            for r in 0..readers {
                let (fs, model, done, start, suspects, listings) =
                    (&fs, &model, &done, &start, &suspects, &listings);
                s.spawn(move || {
                    let mut rng = thread_rng(seed, round, 100 + r);
                    start.wait();
                    let mut k = 0usize;
                    loop {
                        let finished = done.load(SeqCst) == writers;
                        let how = HOWS[(k * 7 + r as usize) % HOWS.len()];
                        let (path, d) = dirs[rng.random_range(0..2)];
                        for e in list(fs, d, path, how, &mut rng) {
                            let t = model.types.lock().unwrap().get(&e.ino).copied();
                            match t {
                                Some(t) => assert_eq!(
                                    e.kind,
                                    t,
                                    "seed {seed} round {round}: {how:?} of {path}: {} listed as \
                                     inode {} of type {:?}, which is a {t:?}",
                                    show(&e.name),
                                    e.ino,
                                    e.kind
                                ),
                                None => suspects.lock().unwrap().push((
                                    format!("{how:?} of {path}: {}", show(&e.name)),
                                    e.ino,
                                    e.kind,
                                )),
                            }
                        }
                        listings.fetch_add(1, Relaxed);
                        k += 1;
                        if finished {
                            break;
                        }
                    }
                });
            }
            start.wait();
        });
        let what = format!("seed {seed} round {round}");
        let types = model.types.lock().unwrap().clone();
        for (w, ino, kind) in suspects.lock().unwrap().iter() {
            assert_eq!(
                types.get(ino),
                Some(kind),
                "{what}: {w} listed as inode {ino} of type {kind:?} (registered after)"
            );
        }
        check(&fs, &what);
        let mut rng = thread_rng(seed, round, 999);
        let maps = quiescent_listing(&fs, &dirs, &mut rng, &what);
        let names = model.names.lock().unwrap().clone();
        for (di, m) in maps.iter().enumerate() {
            let want: BTreeMap<Vec<u8>, (Ino, FileType)> = names
                .iter()
                .filter(|(s, _)| **s / PER_DIR == di)
                .map(|(s, i)| (slot_name(*s), (*i, types[i])))
                .collect();
            assert_eq!(
                m, &want,
                "{what}: listing of {} and the model differ",
                dirs[di].0
            );
        }
        kernel_holds_none(&fs, types.keys().copied(), &what);
    }
    let c: Vec<u64> = counts.iter().map(|c| c.load(Relaxed)).collect();
    eprintln!(
        "model: created {}, moved {}, replaced {}, exchanged {}, whiteouts {}, linked {}, \
         unlinked {}, directories retired {}; {} listings over {rounds} rounds",
        c[0],
        c[1],
        c[2],
        c[3],
        c[4],
        c[5],
        c[6],
        c[7],
        listings.load(Relaxed)
    );
}

// ----- 3: numbers freed and reused under other types -----------------------------------------

/// No locks, no model, no second names: creations straight into the listed directories,
/// unlinks, rmdirs and renames over targets free inodes, whose numbers come back as other
/// types (a directory's as a file's, ...). A listed entry's type must be one its number has
/// had (registered when its creation returned, so checked at the end of the round), or a
/// whiteout's (a character device: only whiteouts are made 0/0 and creations here make no
/// character device). Quiescent: every listing way agrees with lookups, check_invariants,
/// no kernel reference left.
#[test]
fn reused_numbers_under_other_types() {
    let seed = seed::seed("reused_numbers_under_other_types");
    let rounds = seed::rounds(40);
    let fs = new_fs();
    let ctx = Ctx::root();
    let p = fs.mkdir(&ctx, Ino::ROOT, b"p", 0o755).unwrap().ino;
    let q = fs.mkdir(&ctx, Ino::ROOT, b"q", 0o755).unwrap().ino;
    let dirs = [("/p", p), ("/q", q)];
    let ever: Mutex<HashMap<Ino, HashSet<FileType>>> = Mutex::new(HashMap::new());
    let (writers, readers) = (3u64, 2u64);
    let ops_per_round = 3000u64;
    let ok_ops = AtomicU64::new(0);
    let listings = AtomicU64::new(0);
    let types_no_chr: Vec<FileType> = TYPES
        .iter()
        .copied()
        .filter(|t| *t != FileType::CharDevice)
        .collect();
    let max_ino = AtomicU64::new(0);
    for round in 0..rounds {
        let done = AtomicU64::new(0);
        let start = Barrier::new((writers + readers + 1) as usize);
        let suspects: Mutex<Vec<(String, Ino, FileType)>> = Mutex::new(Vec::new());
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            for w in 0..writers {
                let (fs, ever, done, start, ok_ops, types_no_chr, max_ino) =
                    (&fs, &ever, &done, &start, &ok_ops, &types_no_chr, &max_ino);
                s.spawn(move || {
                    let mut rng = thread_rng(seed, round, w);
                    let ctx = Ctx::root();
                    start.wait();
                    for _ in 0..ops_per_round {
                        let (_, ad) = dirs[rng.random_range(0..2)];
                        let (_, bd) = dirs[rng.random_range(0..2)];
                        let an = format!("r{}", rng.random_range(0..10)).into_bytes();
                        let bn = format!("r{}", rng.random_range(0..10)).into_bytes();
                        let r = match rng.random_range(0..12) {
                            0..=2 => {
                                let t = types_no_chr[rng.random_range(0..types_no_chr.len())];
                                let r = if t == FileType::Directory {
                                    // Empty: a rename over it, or an rmdir, frees it.
                                    fs.mkdir(&ctx, ad, &an, 0o755)
                                } else {
                                    make(fs, &ctx, ad, &an, t)
                                };
                                if let Ok(a) = &r {
                                    ever.lock().unwrap().entry(a.ino).or_default().insert(t);
                                    max_ino.fetch_max(a.ino.0, Relaxed);
                                }
                                r.map(|_| ())
                            }
                            3 => fs.rename(&ctx, ad, &an, bd, &bn, 0),
                            4 => fs.rename(&ctx, ad, &an, bd, &bn, RENAME_NOREPLACE),
                            5 | 6 => fs.rename(&ctx, ad, &an, bd, &bn, RENAME_EXCHANGE),
                            7 => fs.rename(&ctx, ad, &an, bd, &bn, RENAME_WHITEOUT),
                            8 => match fs.lookup(&ctx, ad, &an) {
                                Ok(a) => fs.link(&ctx, a.ino, bd, &bn).map(|_| ()),
                                Err(e) => Err(e),
                            },
                            9 | 10 => fs.unlink(&ctx, ad, &an),
                            _ => fs.rmdir(&ctx, ad, &an),
                        };
                        match r {
                            Ok(()) => {
                                ok_ops.fetch_add(1, Relaxed);
                            }
                            Err(e) => assert!(
                                [
                                    Errno::ENOENT,
                                    Errno::EEXIST,
                                    Errno::EISDIR,
                                    Errno::ENOTDIR,
                                    Errno::ENOTEMPTY,
                                    Errno::EPERM,
                                    Errno::EINVAL,
                                ]
                                .contains(&e),
                                "seed {seed} round {round}: unexpected {e:?}"
                            ),
                        }
                    }
                    done.fetch_add(1, SeqCst);
                });
            }
            for r in 0..readers {
                let (fs, ever, done, start, suspects, listings, stop) =
                    (&fs, &ever, &done, &start, &suspects, &listings, &stop);
                s.spawn(move || {
                    let mut rng = thread_rng(seed, round, 100 + r);
                    start.wait();
                    let mut k = 0usize;
                    loop {
                        let finished = done.load(SeqCst) == writers;
                        let how = HOWS[(k * 5 + r as usize) % HOWS.len()];
                        let (path, d) = dirs[rng.random_range(0..2)];
                        for e in list(fs, d, path, how, &mut rng) {
                            if e.kind == FileType::CharDevice {
                                continue; // a whiteout
                            }
                            let known = ever
                                .lock()
                                .unwrap()
                                .get(&e.ino)
                                .is_some_and(|s| s.contains(&e.kind));
                            if !known {
                                suspects.lock().unwrap().push((
                                    format!("{how:?} of {path}: {}", show(&e.name)),
                                    e.ino,
                                    e.kind,
                                ));
                            }
                        }
                        listings.fetch_add(1, Relaxed);
                        k += 1;
                        if finished || stop.load(Relaxed) {
                            break;
                        }
                    }
                });
            }
            start.wait();
        });
        let what = format!("seed {seed} round {round}");
        let ever_now = ever.lock().unwrap().clone();
        for (w, ino, kind) in suspects.lock().unwrap().iter() {
            assert!(
                ever_now.get(ino).is_some_and(|s| s.contains(kind)),
                "{what}: {w} listed as inode {ino} of type {kind:?}, a type that number never \
                 had (it had {:?})",
                ever_now.get(ino)
            );
        }
        check(&fs, &what);
        let mut rng = thread_rng(seed, round, 999);
        quiescent_listing(&fs, &dirs, &mut rng, &what);
        kernel_holds_none(&fs, (1..=max_ino.load(Relaxed) + 64).map(Ino), &what);
    }
    eprintln!(
        "reuse: {} operations succeeded, {} listings over {rounds} rounds",
        ok_ops.load(Relaxed),
        listings.load(Relaxed)
    );
}
