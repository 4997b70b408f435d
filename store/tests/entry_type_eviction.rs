//! Entry types (`Dirent::kind`) on a lazily opened store with a 64-inode cache: a directory
//! is loaded with its entries' types (from the checkpoint's inode values) but not their
//! files; files are loaded when reached by number, evicted when clean and unheld, and read
//! again. Writers exchange and move names (`RENAME_EXCHANGE`, `RENAME_NOREPLACE`,
//! `RENAME_WHITEOUT | RENAME_NOREPLACE`) between inodes of every type while readers list
//! (every way) and stat, checkpoints and syncs run, power-cut images are taken, and evictions
//! happen; every listed type is checked against what its inode is. Reopens after a clean
//! close and after power cuts (`Unflushed::Lost`, `Kept`, `Torn`) compare listings with `stat`
//! of each name. Kernel readdirplus with the cache three quarters full: names only, no
//! lookup reference.
//!
//! Seeds: `LANEFS_SEED` (printed); `LANEFS_ROUNDS` scales the rounds.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use common::{Watchdog, close_unshared, lazy_opts, pattern, seed};
use lanefs::{
    Attr, Client, Config, Ctx, Errno, FileType, Filesystem, INODE_BYTES, Ino, InodeId,
    RENAME_EXCHANGE, RENAME_NOREPLACE, RENAME_WHITEOUT,
};
use lanefs_store::disk::{SimDisk, Unflushed};
use lanefs_store::{StoreHandle, open};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const STORE: &str = "/lanefs";
const NDIRS: usize = 4;
const USED: usize = 36; // names made per directory at the start
const POOL: usize = 48; // names writers use per directory (the rest free at the start)

const TYPES: [FileType; 7] = [
    FileType::RegularFile,
    FileType::Directory,
    FileType::Symlink,
    FileType::NamedPipe,
    FileType::Socket,
    FileType::CharDevice,
    FileType::BlockDevice,
];

fn tiny_cache() -> Config {
    Config {
        inode_cache: Some(64 * INODE_BYTES),
        protected_hardlinks: false,
        protected_symlinks: false,
        ..Config::default()
    }
}

fn show(n: &[u8]) -> String {
    String::from_utf8_lossy(n).into_owned()
}

fn dname(d: usize) -> Vec<u8> {
    format!("d{d}").into_bytes()
}

fn fname(k: usize) -> Vec<u8> {
    format!("f{k}").into_bytes()
}

/// A regular file's contents: a function of its inode number and generation (kept across
/// renames; another file made later at the same number has others).
fn content(a: &Attr) -> Vec<u8> {
    let g = a.generation.0;
    pattern(
        a.ino.0 ^ g.rotate_left(32),
        200 + ((a.ino.0 ^ g) as usize % 300),
    )
}

fn make(fs: &Filesystem, ctx: &Ctx, dir: Ino, name: &[u8], t: FileType) -> Attr {
    let reg = libc::S_IFREG | 0o644;
    let a = match t {
        FileType::RegularFile => {
            let (a, fh) = fs
                .create(ctx, dir, name, 0o644, libc::O_RDWR | libc::O_EXCL)
                .unwrap();
            fs.write(ctx, fh, 0, &content(&a)).unwrap();
            fs.release(fh).unwrap();
            a
        }
        FileType::Directory => {
            let a = fs.mkdir(ctx, dir, name, 0o755).unwrap();
            fs.mknod(ctx, a.ino, b"pin", reg, 0).unwrap();
            a
        }
        FileType::Symlink => fs.symlink(ctx, dir, name, b"elsewhere").unwrap(),
        FileType::NamedPipe => fs.mknod(ctx, dir, name, libc::S_IFIFO | 0o644, 0).unwrap(),
        FileType::Socket => fs.mknod(ctx, dir, name, libc::S_IFSOCK | 0o644, 0).unwrap(),
        FileType::CharDevice => fs
            .mknod(ctx, dir, name, libc::S_IFCHR | 0o644, 0x103)
            .unwrap(),
        FileType::BlockDevice => fs
            .mknod(ctx, dir, name, libc::S_IFBLK | 0o644, 0x800)
            .unwrap(),
    };
    assert_eq!(a.kind(), t);
    a
}

/// What the starting tree holds: every inode's type (never changes: nothing is freed), and
/// the number of each directory `d<i>`.
#[derive(Clone)]
struct Start {
    types: HashMap<Ino, FileType>,
    dirs: Vec<Ino>,
    /// Inodes named in the `d<i>` (each exactly once, whatever the renames did).
    named: Vec<Ino>,
    max: Ino,
    /// Every number in use at the start.
    built: HashSet<Ino>,
}

impl Start {
    /// The rule every listed or stat'd (ino, type) obeys: a starting inode has its type; any
    /// other is a whiteout, made by a `RENAME_WHITEOUT` here (a 0/0 character device).
    fn check(&self, ino: Ino, kind: FileType, what: &str) {
        match self.types.get(&ino) {
            Some(&t) => assert_eq!(
                kind, t,
                "{what}: inode {ino} is a {t:?}, seen as a {kind:?}"
            ),
            None => {
                assert!(
                    !self.built.contains(&ino),
                    "{what}: inode {ino} is one of the start's (a directory or a pin), listed in a d<i>"
                );
                assert_eq!(
                    kind,
                    FileType::CharDevice,
                    "{what}: inode {ino} made since the start (a whiteout) seen as a {kind:?}"
                );
            }
        }
    }
}

/// Makes the store: `NDIRS` directories of `USED` names of every type, a checkpoint, a
/// clean close.
fn build(disk: &SimDisk) -> Start {
    let o = open(Path::new(STORE), tiny_cache(), lazy_opts(disk, false)).unwrap();
    let fs = Arc::new(o.fs);
    let ctx = Ctx::root();
    let mut types = HashMap::new();
    let mut dirs = Vec::new();
    let mut named = Vec::new();
    for d in 0..NDIRS {
        let di = fs.mkdir(&ctx, Ino::ROOT, &dname(d), 0o755).unwrap().ino;
        dirs.push(di);
        for k in 0..USED {
            let t = TYPES[(k + d) % TYPES.len()];
            let a = make(&fs, &ctx, di, &fname(k), t);
            types.insert(a.ino, t);
            named.push(a.ino);
        }
    }
    // Every number in use (pins included): a fresh one, made later, is none of them.
    let mut built: HashSet<Ino> = types.keys().copied().chain(dirs.iter().copied()).collect();
    for (&i, &t) in &types {
        if t == FileType::Directory {
            built.insert(fs.lookup(&ctx, i, b"pin").unwrap().ino);
        }
    }
    let max = Ino(built.iter().map(|i| i.0).max().unwrap());
    o.store.checkpoint().unwrap();
    close_unshared(fs, o.store);
    named.sort();
    Start {
        types,
        dirs,
        named,
        max,
        built,
    }
}

fn open_lazy(disk: &SimDisk, what: &str) -> (Arc<Filesystem>, Arc<StoreHandle>) {
    let o = open(Path::new(STORE), tiny_cache(), lazy_opts(disk, true))
        .unwrap_or_else(|e| panic!("{what}: open: {e}"));
    assert!(
        o.report.lazy,
        "{what}: the store opened whole: {:?}",
        o.report
    );
    (Arc::new(o.fs), Arc::new(o.store))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum How {
    Client,
    Plain,
    Chunked,
    Plus,
    Kernel,
}

const HOWS: [How; 5] = [
    How::Client,
    How::Plain,
    How::Chunked,
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

/// Lists `d<d>` as `how` says (`.` and `..` left out), checking what holds whatever races:
/// no name twice; readdirplus attributes are of the inode listed, of its type; a kernel
/// caller holds a lookup reference on exactly the entries it got attributes for (and none
/// on the others: only one thread lists as the kernel) — dropped again here.
fn list(fs: &Arc<Filesystem>, dir: Ino, d: usize, how: How, rng: &mut StdRng) -> Vec<Listed> {
    let lib = Ctx::root();
    let kernel = Ctx::root().via_kernel();
    let mut out: Vec<Listed> = Vec::new();
    let mut push = |name: &[u8], ino: Ino, kind: FileType, attr: Option<&Attr>| {
        if name != b"." && name != b".." {
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
            let c = Client::root(fs.clone());
            for e in c.read_dir(format!("/d{d}")).unwrap() {
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
                let want = rng.random_range(1..=7usize);
                let (mut got, mut last) = (0, off);
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
    }
    let mut names = HashSet::new();
    for e in &out {
        assert!(
            names.insert(e.name.clone()),
            "{how:?} of d{d}: {} twice",
            show(&e.name)
        );
        if let Some(a) = &e.attr {
            assert_eq!(
                (a.ino, a.kind()),
                (e.ino, e.kind),
                "{how:?} of d{d}: {}: attributes of another inode or type",
                show(&e.name)
            );
        }
        if how == How::Kernel {
            assert_eq!(
                fs.held_by_kernel(e.ino),
                e.attr.is_some(),
                "kernel readdirplus of d{d}: {} (inode {}): attributes {} but a lookup \
                 reference held: {}",
                show(&e.name),
                e.ino,
                e.attr.is_some(),
                fs.held_by_kernel(e.ino)
            );
        }
    }
    if how == How::Kernel {
        for e in &out {
            if e.attr.is_some() {
                fs.forget(e.ino, 1);
            }
        }
    }
    out
}

type Tree = BTreeMap<(usize, Vec<u8>), (Ino, FileType)>;

/// Directory `dir` (number `d`) listed every way, which must agree, and each entry looked up
/// by name, which must give the listed inode and type: (name, its attributes, a label for
/// messages).
fn listed_as_stat(
    fs: &Arc<Filesystem>,
    dir: Ino,
    d: usize,
    rng: &mut StdRng,
    what: &str,
) -> Vec<(Vec<u8>, Attr, String)> {
    let ctx = Ctx::root();
    let mut first: Option<BTreeMap<Vec<u8>, (Ino, FileType)>> = None;
    for how in HOWS {
        let m: BTreeMap<_, _> = list(fs, dir, d, how, rng)
            .into_iter()
            .map(|e| (e.name, (e.ino, e.kind)))
            .collect();
        match &first {
            None => first = Some(m),
            Some(f) => assert_eq!(f, &m, "{what}: d{d}: listings by {:?} and {how:?}", HOWS[0]),
        }
    }
    let mut out = Vec::new();
    for (name, (ino, kind)) in first.unwrap() {
        let w = format!("{what}: d{d}/{}", show(&name));
        let a = fs
            .lookup(&ctx, dir, &name)
            .unwrap_or_else(|e| panic!("{w}: listed but lookup {e:?}"));
        assert_eq!(
            (a.ino, a.kind()),
            (ino, kind),
            "{w}: listed (ino, type) vs stat"
        );
        out.push((name, a, w));
    }
    out
}

/// At a quiescent moment: every directory listed every way (the same), each entry compared
/// with `lookup` of its name (ino and type) and with the start's rule; each starting inode
/// named exactly once; check_invariants. Returns the tree.
fn quiescent(fs: &Arc<Filesystem>, start: &Start, rng: &mut StdRng, what: &str) -> Tree {
    let ctx = Ctx::root();
    let mut tree = Tree::new();
    for d in 0..NDIRS {
        let dir = fs
            .lookup(&ctx, Ino::ROOT, &dname(d))
            .unwrap_or_else(|e| panic!("{what}: d{d}: {e:?}"))
            .ino;
        assert_eq!(dir, start.dirs[d], "{what}: d{d} is another directory");
        for (name, a, w) in listed_as_stat(fs, dir, d, rng, what) {
            let (ino, kind) = (a.ino, a.kind());
            start.check(ino, kind, &w);
            tree.insert((d, name), (ino, kind));
        }
    }
    let mut named: Vec<Ino> = tree
        .values()
        .map(|v| v.0)
        .filter(|i| start.types.contains_key(i))
        .collect();
    named.sort();
    assert_eq!(
        named, start.named,
        "{what}: each starting inode named exactly once"
    );
    if let Err(e) = fs.check_invariants() {
        panic!("{what}: check_invariants:\n{e}");
    }
    tree
}

/// The checkpointer thread of a race: checkpoints (counted in `checkpoints`) and syncs at
/// random until `finished()` was true before its last step, and two power-cut images of
/// `disk` at most, taken at random moments, into `images`.
fn checkpointer(
    store: &StoreHandle,
    disk: &SimDisk,
    images: &Mutex<Vec<(String, SimDisk)>>,
    checkpoints: &AtomicU64,
    (seed, round): (u64, u64),
    finished: impl Fn() -> bool,
) {
    let mut rng = thread_rng(seed, round, 300);
    let mut n = 0u64;
    loop {
        let last = finished();
        if rng.random_bool(0.3) {
            store.sync().unwrap();
        } else {
            store.checkpoint().unwrap();
            checkpoints.fetch_add(1, Relaxed);
        }
        if n < 2 && rng.random_bool(0.3) {
            let how = [Unflushed::Lost, Unflushed::Kept, Unflushed::Torn(seed ^ n)]
                [rng.random_range(0..3)];
            images
                .lock()
                .unwrap()
                .push((format!("round {round} image {n} {how:?}"), disk.crash(how)));
            n += 1;
        }
        if last {
            break;
        }
    }
}

fn thread_rng(seed: u64, round: u64, t: u64) -> StdRng {
    StdRng::seed_from_u64(
        seed ^ round.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ (t + 1).wrapping_mul(0xD1B5_4A32_D192_ED03),
    )
}

/// One writer's change: an exchange, a move to a free name, or a move that leaves a
/// whiteout, between random names of random directories; or an eviction pass. Nothing is
/// ever freed.
fn change(fs: &Filesystem, dirs: &[Ino], rng: &mut StdRng) -> Result<(), Errno> {
    let ctx = Ctx::root();
    let (a, b) = (rng.random_range(0..NDIRS), rng.random_range(0..NDIRS));
    let (an, bn) = (
        fname(rng.random_range(0..POOL)),
        fname(rng.random_range(0..POOL)),
    );
    let flags = match rng.random_range(0..10) {
        0..=4 => RENAME_EXCHANGE,
        5..=7 => RENAME_NOREPLACE,
        8 => RENAME_WHITEOUT | RENAME_NOREPLACE,
        _ => {
            fs.evict_inodes(rng.random_bool(0.3));
            return Ok(());
        }
    };
    fs.rename(&ctx, dirs[a], &an, dirs[b], &bn, flags)
}

/// A lazily opened store with a 64-inode cache, many more inodes than that: writers
/// exchange and move names between inodes of every type, a reader lists every way (one
/// kernel readdirplus among them), a stat'er looks names up (loading files, making the
/// cache evict) and reads regular files, a checkpointer takes checkpoints and syncs, and
/// takes power-cut images, all at once. Each listed or stat'd type is checked against the
/// inode's. Quiescent after each round: listings vs stat, each starting inode named once,
/// check_invariants. Then: a synced image equals the tree exactly, a reopen after a clean
/// close equals it too (and listing a directory loads none of its files), and every image
/// taken mid-race opens to a tree that obeys the same rules.
#[test]
fn lazy_store_entry_types_race_eviction_and_checkpoints() {
    let seed = seed::seed("lazy_store_entry_types_race_eviction_and_checkpoints");
    let _wd = Watchdog::new(
        "lazy_store_entry_types_race_eviction_and_checkpoints",
        Duration::from_secs(600),
    );
    let rounds = seed::rounds(16);
    let disk = SimDisk::new();
    let start = build(&disk);
    let (mut fs, mut store) = open_lazy(&disk, "first lazy open");
    assert_eq!(fs.inode_budget(), Some(64));
    let dirs = start.dirs.clone();
    let (writers, ops) = (2u64, 1500u64);
    let images: Mutex<Vec<(String, SimDisk)>> = Mutex::new(Vec::new());
    let counts = [
        AtomicU64::new(0), // changes made
        AtomicU64::new(0), // listings
        AtomicU64::new(0), // stats
        AtomicU64::new(0), // checkpoints
    ];
    for round in 0..rounds {
        if round > 0 {
            // Reopened each round: the directories load again, racing the renames and the
            // listings (a loaded directory is never evicted).
            close_unshared(fs, store);
            (fs, store) = open_lazy(&disk, &format!("seed {seed} reopen before round {round}"));
        }
        let done = AtomicU64::new(0);
        let go = Barrier::new(writers as usize + 4);
        std::thread::scope(|s| {
            for w in 0..writers {
                let (fs, dirs, done, go, counts) = (&fs, &dirs, &done, &go, &counts);
                s.spawn(move || {
                    let mut rng = thread_rng(seed, round, w);
                    go.wait();
                    for _ in 0..ops {
                        match change(fs, dirs, &mut rng) {
                            Ok(()) => {
                                counts[0].fetch_add(1, Relaxed);
                            }
                            Err(e) => assert!(
                                [Errno::ENOENT, Errno::EEXIST].contains(&e),
                                "seed {seed} round {round}: change: {e:?}"
                            ),
                        }
                    }
                    done.fetch_add(1, SeqCst);
                });
            }
            // The reader.
            {
                let (fs, start, done, go, counts) = (&fs, &start, &done, &go, &counts);
                s.spawn(move || {
                    let mut rng = thread_rng(seed, round, 100);
                    go.wait();
                    for k in 0usize.. {
                        let finished = done.load(SeqCst) == writers;
                        let how = HOWS[k % HOWS.len()];
                        let d = rng.random_range(0..NDIRS);
                        for e in list(fs, start.dirs[d], d, how, &mut rng) {
                            let w = format!(
                                "seed {seed} round {round}: {how:?} of d{d}: {}",
                                show(&e.name)
                            );
                            start.check(e.ino, e.kind, &w);
                        }
                        counts[1].fetch_add(1, Relaxed);
                        if finished {
                            break;
                        }
                    }
                });
            }
            // The stat'er: lookups (which load, and make passes due), getattr by number,
            // reads of regular files.
            {
                let (fs, start, done, go, counts) = (&fs, &start, &done, &go, &counts);
                s.spawn(move || {
                    let mut rng = thread_rng(seed, round, 200);
                    let ctx = Ctx::root();
                    go.wait();
                    loop {
                        let finished = done.load(SeqCst) == writers;
                        for _ in 0..16 {
                            let d = rng.random_range(0..NDIRS);
                            let n = fname(rng.random_range(0..POOL));
                            let w = format!("seed {seed} round {round}: stat d{d}/{}", show(&n));
                            let a = match fs.lookup(&ctx, start.dirs[d], &n) {
                                Ok(a) => a,
                                Err(Errno::ENOENT) => continue,
                                Err(e) => panic!("{w}: {e:?}"),
                            };
                            start.check(a.ino, a.kind(), &w);
                            match fs.getattr(a.ino) {
                                Ok(b) => assert_eq!(b.kind(), a.kind(), "{w}: getattr by number"),
                                Err(e) => panic!("{w}: getattr {}: {e:?}", a.ino),
                            }
                            if a.kind() == FileType::RegularFile && rng.random_bool(0.3) {
                                let fh = fs.open(&ctx, a.ino, libc::O_RDONLY).unwrap();
                                let mut buf = vec![0u8; 1024];
                                let got = fs.read(fh, 0, &mut buf).unwrap();
                                fs.release(fh).unwrap();
                                assert_eq!(&buf[..got], &content(&a)[..], "{w}: contents");
                            }
                            counts[2].fetch_add(1, Relaxed);
                        }
                        if finished {
                            break;
                        }
                    }
                });
            }
            // The checkpointer: checkpoints, syncs, power-cut images.
            {
                let (store, disk, counts, images) = (&store, &disk, &counts, &images);
                let finished = || done.load(SeqCst) == writers;
                let go = &go;
                s.spawn(move || {
                    go.wait();
                    checkpointer(store, disk, images, &counts[3], (seed, round), finished)
                });
            }
            go.wait();
        });
        let what = format!("seed {seed} round {round}");
        let mut rng = thread_rng(seed, round, 999);
        quiescent(&fs, &start, &mut rng, &what);
        // Evictions again after the check loaded everything.
        fs.evict_inodes(true);
    }
    let what = format!("seed {seed} after the rounds");
    let mut rng = thread_rng(seed, rounds, 999);
    let tree = quiescent(&fs, &start, &mut rng, &what);
    store.sync().unwrap();
    let synced = disk.crash(Unflushed::Lost);
    // A few changes that no sync covers, then a clean close.
    for _ in 0..200 {
        let _ = change(&fs, &dirs, &mut rng);
    }
    let last = quiescent(&fs, &start, &mut rng, &what);
    eprintln!(
        "lazy store: {} changes, {} listings, {} stats, {} checkpoints over {rounds} rounds; \
         {} inodes evicted, {} loaded; {} power-cut images",
        counts[0].load(Relaxed),
        counts[1].load(Relaxed),
        counts[2].load(Relaxed),
        counts[3].load(Relaxed),
        fs.inodes_evicted(),
        fs.loaded_inodes(),
        images.lock().unwrap().len()
    );
    close_unshared(fs, store);

    // Reopened after the clean close: the tree as it was, and a listing reads no file.
    let (fs, store) = open_lazy(&disk, "reopen");
    let ctx = Ctx::root();
    for d in 0..NDIRS {
        let fh = fs.opendir(&ctx, start.dirs[d]).unwrap();
        let before = fs.loaded_inodes();
        let mut seen = 0;
        fs.readdir(&ctx, fh, 0, false, |e, _| {
            if e.name != b"." && e.name != b".." {
                let (ino, kind) = last[&(d, e.name.to_vec())];
                assert_eq!(
                    (e.ino, e.kind),
                    (ino, kind),
                    "reopen: d{d}/{}",
                    show(e.name)
                );
                seen += 1;
            }
            true
        })
        .unwrap();
        fs.releasedir(fh).unwrap();
        assert_eq!(
            fs.loaded_inodes(),
            before,
            "reopen: a plain listing of d{d} ({seen} entries) loaded files"
        );
    }
    let again = quiescent(&fs, &start, &mut rng, "reopen after a clean close");
    assert_eq!(again, last, "reopen after a clean close: the tree changed");
    close_unshared(fs, store);

    // The image of a power cut just after a sync: that tree exactly.
    let (fs, store) = open_lazy(&synced, "synced image");
    let got = quiescent(&fs, &start, &mut rng, "synced image (Lost)");
    assert_eq!(
        got, tree,
        "seed {seed}: a power cut just after a sync lost or changed names"
    );
    close_unshared(fs, store);

    // Images taken mid-race: whatever prefix survived, the same rules.
    for (label, img) in images.into_inner().unwrap() {
        let what = format!("seed {seed}: {label}");
        let (fs, store) = open_lazy(&img, &what);
        quiescent(&fs, &start, &mut rng, &what);
        close_unshared(fs, store);
    }
}

/// A kernel caller's readdirplus while the 64-inode cache is three quarters full or more:
/// every entry comes without attributes and takes no lookup reference (`held_by_kernel`
/// false), with the type its inode has; once alone (a stat'er filling the cache at the same
/// time), then with stat's racing. Afterwards the kernel holds nothing, the types agree
/// with stat, and check_invariants passes; reopened after a power cut with the unflushed
/// writes kept, the same.
#[test]
fn kernel_readdirplus_on_a_full_cache_takes_no_reference() {
    let seed = seed::seed("kernel_readdirplus_on_a_full_cache_takes_no_reference");
    let _wd = Watchdog::new(
        "kernel_readdirplus_on_a_full_cache",
        Duration::from_secs(600),
    );
    let disk = SimDisk::new();
    let start = build(&disk);
    let (fs, store) = open_lazy(&disk, "lazy open");
    let ctx = Ctx::root();
    let kernel = Ctx::root().via_kernel();
    let budget = fs.inode_budget().unwrap();
    // What the cache holds as it counts it against the budget: inodes, and directory
    // entries at `ENTRY_BYTES` each, in inodes.
    let held = |fs: &Filesystem| fs.inode_cache_bytes().div_ceil(lanefs::INODE_BYTES);
    let mut rng = thread_rng(seed, 0, 0);
    // Fill the cache: stat every name (far more inodes than the budget).
    let fill = |fs: &Filesystem| {
        for d in 0..NDIRS {
            for k in 0..USED {
                let _ = fs.lookup(&ctx, start.dirs[d], &fname(k));
            }
        }
    };
    let kernel_list = |fs: &Filesystem, d: usize, tight_required: bool| -> (u64, u64) {
        let fh = fs.opendir(&kernel, start.dirs[d]).unwrap();
        let tight = held(fs) >= budget - budget / 4;
        let (mut bare, mut with) = (0u64, 0u64);
        let mut pinned = Vec::new();
        fs.readdir(&kernel, fh, 0, true, |e, a| {
            if e.name == b"." || e.name == b".." {
                return true;
            }
            start.check(
                e.ino,
                e.kind,
                &format!("kernel readdirplus d{d}/{}", show(e.name)),
            );
            match a {
                None => {
                    bare += 1;
                    assert!(
                        !fs.held_by_kernel(e.ino),
                        "seed {seed}: d{d}/{}: no attributes, yet a lookup reference",
                        show(e.name)
                    );
                }
                Some(a) => {
                    with += 1;
                    assert!(
                        !tight_required,
                        "seed {seed}: d{d}/{}: attributes (inode {}) with the cache at {} of \
                         {budget}",
                        show(e.name),
                        a.ino,
                        held(fs)
                    );
                    assert!(fs.held_by_kernel(e.ino));
                    pinned.push(e.ino);
                }
            }
            true
        })
        .unwrap();
        fs.releasedir(fh).unwrap();
        for i in pinned {
            fs.forget(i, 1);
        }
        let _ = tight;
        (bare, with)
    };
    fill(&fs);
    fs.evict_inodes(false);
    fill(&fs);
    let m = held(&fs);
    assert!(
        m >= budget - budget / 4,
        "the cache is not three quarters full after stat'ing every name: {m} of {budget}"
    );
    let mut bare = 0;
    for d in 0..NDIRS {
        // Kept full: a stat of every name of the directory just before.
        for k in 0..USED {
            let _ = fs.lookup(&ctx, start.dirs[d], &fname(k));
        }
        let full = held(&fs) >= budget - budget / 4;
        bare += kernel_list(&fs, d, full).0;
    }
    assert!(bare > 0, "no entry without attributes on a full cache");
    // Racing: a stat'er keeps loading while the kernel lists, and a writer exchanges.
    let rounds = seed::rounds(16);
    let (listed_bare, listed_with) = (AtomicU64::new(0), AtomicU64::new(0));
    for round in 0..rounds {
        let done = AtomicU64::new(0);
        std::thread::scope(|s| {
            let (fs2, done2) = (&fs, &done);
            let dirs = &start.dirs;
            s.spawn(move || {
                let mut rng = thread_rng(seed, round, 1);
                for _ in 0..300 {
                    let _ = change(fs2, dirs, &mut rng);
                    let d = rng.random_range(0..NDIRS);
                    let _ = fs2.lookup(&Ctx::root(), dirs[d], &fname(rng.random_range(0..POOL)));
                }
                done2.fetch_add(1, SeqCst);
            });
            loop {
                let finished = done.load(SeqCst) == 1;
                let (b, w) = kernel_list(&fs, rng.random_range(0..NDIRS), false);
                listed_bare.fetch_add(b, Relaxed);
                listed_with.fetch_add(w, Relaxed);
                if finished {
                    break;
                }
            }
        });
        let what = format!("seed {seed} round {round}");
        quiescent(&fs, &start, &mut rng, &what);
        for i in 1..start.max.0 + 4096 {
            assert!(
                !fs.held_by_kernel(Ino(i)),
                "{what}: inode {i} still held by the kernel"
            );
        }
        fill(&fs);
    }
    eprintln!(
        "kernel readdirplus: {bare} bare entries alone; racing: {} bare, {} with attributes",
        listed_bare.load(Relaxed),
        listed_with.load(Relaxed)
    );
    let tree = quiescent(&fs, &start, &mut rng, "before the power cut");
    store.sync().unwrap();
    let img = disk.crash(Unflushed::Kept);
    close_unshared(fs, store);
    let (fs, store) = open_lazy(&img, "after a power cut (Kept)");
    let got = quiescent(&fs, &start, &mut rng, "after a power cut (Kept)");
    assert_eq!(got, tree, "seed {seed}: after a synced power cut (Kept)");
    close_unshared(fs, store);
}

// ----- numbers freed and made again under other types ---------------------------------------

/// What a tree holds per name: inode, generation, type.
type GenTree = BTreeMap<(usize, Vec<u8>), (Ino, u64, FileType)>;

/// Quiescent checks of a store whose numbers are reused: every listing way agrees, each
/// entry agrees with `lookup` (ino and type) and has a type its number has had (`ever`;
/// whiteouts, the only 0/0 character devices, aside), each regular file holds the contents
/// of its (ino, generation), check_invariants, and the kernel holds nothing.
fn quiescent_reused(
    fs: &Arc<Filesystem>,
    dirs: &[Ino],
    ever: &HashMap<Ino, HashSet<FileType>>,
    rng: &mut StdRng,
    what: &str,
) -> GenTree {
    let ctx = Ctx::root();
    let mut tree = GenTree::new();
    for (d, &dir) in dirs.iter().enumerate() {
        for (name, a, w) in listed_as_stat(fs, dir, d, rng, what) {
            let (ino, kind) = (a.ino, a.kind());
            // Whiteouts (0/0 character devices) are made by renames, unregistered.
            if kind != FileType::CharDevice || a.rdev != 0 {
                assert!(
                    ever.get(&ino).is_some_and(|t| t.contains(&kind)),
                    "{w}: inode {ino} listed as a {kind:?}, a type that number never had ({:?})",
                    ever.get(&ino)
                );
            }
            if kind == FileType::RegularFile {
                let fh = fs.open(&ctx, ino, libc::O_RDONLY).unwrap();
                let mut buf = vec![0u8; 1024];
                let got = fs.read(fh, 0, &mut buf).unwrap();
                fs.release(fh).unwrap();
                assert_eq!(
                    &buf[..got],
                    &content(&a)[..],
                    "{w}: contents of inode {ino}"
                );
            }
            tree.insert((d, name), (ino, a.generation.0, kind));
        }
    }
    if let Err(e) = fs.check_invariants() {
        panic!("{what}: check_invariants:\n{e}");
    }
    tree
}

/// One writer's change on a store whose numbers are reused: a node of any type but a
/// character device made in the writer's own directory `stage` (its type registered in
/// `ever`, a regular file written whole) then moved in with `RENAME_NOREPLACE`; a rename
/// (flags 0, `RENAME_NOREPLACE`, `RENAME_EXCHANGE`, `RENAME_WHITEOUT`) that may replace and
/// free a target; a link; an unlink; an rmdir; an eviction pass. Returns whether it
/// succeeded.
fn change_reusing(
    fs: &Filesystem,
    dirs: &[Ino],
    stage: Ino,
    ever: &Mutex<HashMap<Ino, HashSet<FileType>>>,
    rng: &mut StdRng,
    what: &str,
) -> bool {
    let ctx = Ctx::root();
    let (a, b) = (rng.random_range(0..NDIRS), rng.random_range(0..NDIRS));
    let (an, bn) = (
        fname(rng.random_range(0..POOL)),
        fname(rng.random_range(0..POOL)),
    );
    let r = match rng.random_range(0..14) {
        0..=2 => {
            let t = [
                FileType::RegularFile,
                FileType::RegularFile,
                FileType::Directory,
                FileType::Symlink,
                FileType::NamedPipe,
                FileType::Socket,
                FileType::BlockDevice,
            ][rng.random_range(0..7)];
            let x = if t == FileType::Directory && rng.random_bool(0.5) {
                // Empty: an rmdir or a rename over it frees it.
                fs.mkdir(&ctx, stage, b"x", 0o755).unwrap()
            } else {
                make(fs, &ctx, stage, b"x", t)
            };
            // Registered before it is moved where it can be listed (a pin is a file).
            ever.lock().unwrap().entry(x.ino).or_default().insert(t);
            if t == FileType::Directory
                && let Ok(pin) = fs.lookup(&ctx, x.ino, b"pin")
            {
                ever.lock()
                    .unwrap()
                    .entry(pin.ino)
                    .or_default()
                    .insert(FileType::RegularFile);
            }
            let r = fs.rename(&ctx, stage, b"x", dirs[a], &an, RENAME_NOREPLACE);
            if r.is_err() {
                // Taken: goes again (freed; and its pin with it).
                if t == FileType::Directory {
                    let _ = fs.unlink(&ctx, x.ino, b"pin");
                    fs.rmdir(&ctx, stage, b"x").unwrap();
                } else {
                    fs.unlink(&ctx, stage, b"x").unwrap();
                }
            }
            r
        }
        3 => fs.rename(&ctx, dirs[a], &an, dirs[b], &bn, 0),
        4 => fs.rename(&ctx, dirs[a], &an, dirs[b], &bn, RENAME_NOREPLACE),
        5 | 6 => fs.rename(&ctx, dirs[a], &an, dirs[b], &bn, RENAME_EXCHANGE),
        7 => fs.rename(&ctx, dirs[a], &an, dirs[b], &bn, RENAME_WHITEOUT),
        8 => match fs.lookup(&ctx, dirs[a], &an) {
            Ok(x) => fs.link(&ctx, x.ino, dirs[b], &bn).map(|_| ()),
            Err(e) => Err(e),
        },
        9 | 10 => fs.unlink(&ctx, dirs[a], &an),
        11 => fs.rmdir(&ctx, dirs[a], &an),
        12 => {
            // A pinned directory emptied and removed (its pin's number and its own freed).
            match fs.lookup(&ctx, dirs[a], &an) {
                Ok(x) if x.kind() == FileType::Directory => {
                    let _ = fs.unlink(&ctx, x.ino, b"pin");
                    fs.rmdir(&ctx, dirs[a], &an)
                }
                Ok(_) => Err(Errno::ENOTDIR),
                Err(e) => Err(e),
            }
        }
        _ => {
            fs.evict_inodes(rng.random_bool(0.3));
            Ok(())
        }
    };
    match r {
        Ok(()) => true,
        Err(e) => {
            assert!(
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
                "{what}: unexpected {e:?}"
            );
            false
        }
    }
}

/// The lazy store with a 64-inode cache again, but numbers are freed and made again under
/// other types (unlinks, rmdirs, renames over targets, whiteouts, links), while files are
/// evicted and read again, checkpoints, syncs and power-cut images race. Readers and a
/// stat'er check each listed or stat'd type is one its number has had (every creation is
/// registered before it is moved into a listed directory) and each regular file's contents
/// are its own. Quiescent: `quiescent_reused`. Then a synced image, a lazy reopen after a
/// clean close and a whole open all give the tree exactly, and each mid-race image passes
/// `quiescent_reused`.
#[test]
fn lazy_store_reused_numbers_race_eviction() {
    let seed = seed::seed("lazy_store_reused_numbers_race_eviction");
    let _wd = Watchdog::new(
        "lazy_store_reused_numbers_race_eviction",
        Duration::from_secs(600),
    );
    let rounds = seed::rounds(16);
    let disk = SimDisk::new();
    let start = build(&disk);
    let ever: Mutex<HashMap<Ino, HashSet<FileType>>> = Mutex::new(
        start
            .types
            .iter()
            .map(|(&i, &t)| (i, HashSet::from([t])))
            .collect(),
    );
    let (fs, store) = open_lazy(&disk, "first lazy open");
    let ctx = Ctx::root();
    // Pins of the starting directories are regular files.
    for (&i, &t) in &start.types {
        if t == FileType::Directory {
            let pin = fs.lookup(&ctx, i, b"pin").unwrap().ino;
            ever.lock()
                .unwrap()
                .entry(pin)
                .or_default()
                .insert(FileType::RegularFile);
        }
    }
    let dirs = start.dirs.clone();
    let writers = 2u64;
    let stages: Vec<Ino> = (0..writers)
        .map(|w| {
            fs.mkdir(&ctx, Ino::ROOT, format!("s{w}").as_bytes(), 0o755)
                .unwrap()
                .ino
        })
        .collect();
    let ops = 1500u64;
    let images: Mutex<Vec<(String, SimDisk)>> = Mutex::new(Vec::new());
    let counts = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
    for round in 0..rounds {
        let done = AtomicU64::new(0);
        let go = Barrier::new(writers as usize + 4);
        std::thread::scope(|s| {
            for w in 0..writers {
                let (fs, dirs, stages, ever, done, go, counts) =
                    (&fs, &dirs, &stages, &ever, &done, &go, &counts);
                s.spawn(move || {
                    let mut rng = thread_rng(seed, round, w);
                    let what = format!("seed {seed} round {round} writer {w}");
                    go.wait();
                    for _ in 0..ops {
                        if change_reusing(fs, dirs, stages[w as usize], ever, &mut rng, &what) {
                            counts[0].fetch_add(1, Relaxed);
                        }
                    }
                    done.fetch_add(1, SeqCst);
                });
            }
            // Reader and stat'er.
            for r in 0..2u64 {
                let (fs, dirs, ever, done, go, counts) = (&fs, &dirs, &ever, &done, &go, &counts);
                s.spawn(move || {
                    let mut rng = thread_rng(seed, round, 100 + r);
                    let ctx = Ctx::root();
                    let mut held = Vec::new();
                    go.wait();
                    for k in 0usize.. {
                        let finished = done.load(SeqCst) == writers;
                        let d = rng.random_range(0..NDIRS);
                        let seen: Vec<(String, Ino, FileType, Option<Attr>)> = if r == 0 {
                            let how = HOWS[k % HOWS.len()];
                            list(fs, dirs[d], d, how, &mut rng)
                                .into_iter()
                                .map(|e| {
                                    (
                                        format!("{how:?} of d{d}: {}", show(&e.name)),
                                        e.ino,
                                        e.kind,
                                        None,
                                    )
                                })
                                .collect()
                        } else {
                            // Some files kept open a while, across their unlinks: orphans
                            // in the power-cut images.
                            if held.len() > 6 || (finished && !held.is_empty()) {
                                let i = rng.random_range(0..held.len());
                                fs.release(held.swap_remove(i)).unwrap();
                            }
                            let n = fname(rng.random_range(0..POOL));
                            match fs.lookup(&ctx, dirs[d], &n) {
                                Ok(a) => vec![(
                                    format!("stat d{d}/{}", show(&n)),
                                    a.ino,
                                    a.kind(),
                                    Some(a),
                                )],
                                Err(Errno::ENOENT) => vec![],
                                Err(e) => panic!("seed {seed} round {round}: stat: {e:?}"),
                            }
                        };
                        for (w, ino, kind, a) in seen {
                            let w = format!("seed {seed} round {round}: {w}");
                            if kind != FileType::CharDevice {
                                let e = ever.lock().unwrap().get(&ino).cloned();
                                assert!(
                                    e.as_ref().is_some_and(|t| t.contains(&kind)),
                                    "{w}: inode {ino} seen as a {kind:?}, a type that number never \
                                     had ({e:?})"
                                );
                            }
                            if let Some(a) = a.filter(|a| a.kind() == FileType::RegularFile) {
                                // That very inode's contents (by number and
                                // generation); gone since: fine.
                                let id = InodeId {
                                    ino: a.ino,
                                    generation: a.generation,
                                };
                                if let Ok(fh) = fs.open(&ctx, id, libc::O_RDONLY) {
                                    let mut buf = vec![0u8; 1024];
                                    let got = fs
                                        .read(fh, 0, &mut buf)
                                        .unwrap_or_else(|e| panic!("{w}: read: {e:?}"));
                                    assert_eq!(&buf[..got], &content(&a)[..], "{w}: contents");
                                    if rng.random_bool(0.2) {
                                        held.push(fh);
                                    } else {
                                        fs.release(fh).unwrap();
                                    }
                                }
                            }
                        }
                        counts[1].fetch_add(1, Relaxed);
                        if finished && held.is_empty() {
                            break;
                        }
                    }
                });
            }
            {
                let (store, disk, counts, images) = (&store, &disk, &counts, &images);
                let finished = || done.load(SeqCst) == writers;
                let go = &go;
                s.spawn(move || {
                    go.wait();
                    checkpointer(store, disk, images, &counts[2], (seed, round), finished)
                });
            }
            go.wait();
        });
        let what = format!("seed {seed} round {round}");
        let mut rng = thread_rng(seed, round, 999);
        let e = ever.lock().unwrap().clone();
        quiescent_reused(&fs, &dirs, &e, &mut rng, &what);
        for i in 1..e.keys().map(|i| i.0).max().unwrap() + 64 {
            assert!(
                !fs.held_by_kernel(Ino(i)),
                "{what}: inode {i} still held by the kernel"
            );
        }
        fs.evict_inodes(true);
    }
    let e = ever.lock().unwrap().clone();
    let mut rng = thread_rng(seed, rounds, 999);
    let tree = quiescent_reused(&fs, &dirs, &e, &mut rng, "after the rounds");
    store.sync().unwrap();
    let synced = disk.crash(Unflushed::Lost);
    eprintln!(
        "reused numbers: {} changes, {} reads, {} checkpoints over {rounds} rounds; {} inodes \
         evicted, {} loaded; {} numbers with several types; {} power-cut images",
        counts[0].load(Relaxed),
        counts[1].load(Relaxed),
        counts[2].load(Relaxed),
        fs.inodes_evicted(),
        fs.loaded_inodes(),
        e.values().filter(|t| t.len() > 1).count(),
        images.lock().unwrap().len()
    );
    close_unshared(fs, store);
    let (fs, store) = open_lazy(&disk, "reopen");
    let again = quiescent_reused(&fs, &dirs, &e, &mut rng, "reopen after a clean close");
    assert_eq!(again, tree, "seed {seed}: reopen after a clean close");
    close_unshared(fs, store);
    let o = open(Path::new(STORE), tiny_cache(), lazy_opts(&disk, false)).unwrap();
    let (fs, store) = (Arc::new(o.fs), o.store);
    let whole = quiescent_reused(&fs, &dirs, &e, &mut rng, "whole open");
    assert_eq!(whole, tree, "seed {seed}: a whole open");
    close_unshared(fs, store);
    let (fs, store) = open_lazy(&synced, "synced image");
    let got = quiescent_reused(&fs, &dirs, &e, &mut rng, "synced image (Lost)");
    assert_eq!(got, tree, "seed {seed}: a power cut just after a sync");
    close_unshared(fs, store);
    for (label, img) in images.into_inner().unwrap() {
        let what = format!("seed {seed}: {label}");
        let (fs, store) = open_lazy(&img, &what);
        quiescent_reused(&fs, &dirs, &e, &mut rng, &what);
        close_unshared(fs, store);
    }
}
