//! Adversarial tests of checkpoint absorption ("ghosts": files made and freed within one
//! window of a checkpoint, plain renames included), of the window and ghost state kept
//! between checkpoints, of the batch-wise journal follow, and of the committer's run-wise
//! merge. Every test compares, exactly, the live filesystem with the one a reopen (or a
//! power cut) gives back: tree, names, cookies, attributes (times included), contents,
//! xattrs, inode flags; then checks that new cookies and generations are never reused.
//!
//! Seeds: fixed ones; `LANEFS_SEED=<n>` runs that one seed of each randomised test; every
//! failure message names its seed.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{HOUR, PowerCuts, host_opts, on_demand, seed};
use lanefs::{
    Attr, Config, Ctx, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FS_NOATIME_FL, FS_NODUMP_FL, Fh,
    FileType, Filesystem, Ino, RENAME_EXCHANGE, RENAME_NOREPLACE, RENAME_WHITEOUT, SetAttr,
    TimeSet, Timespec,
};
use lanefs_store::disk::{SimDisk, SyncPoint, Unflushed};
use lanefs_store::{Opened, Options, open};
use rand::{Rng, SeedableRng, rngs::StdRng};

fn ctx() -> Ctx {
    Ctx::root()
}

/// Two changes to one directory's times under different names share no lock, and replay
/// keeps the later-appended time, which may be the earlier stamp (docs/RECORDS.md, "Order"):
/// after threads raced in `dirs` (and the root), one more ghost in each, from one thread,
/// makes the last time of each the same live and replayed.
fn settle_times(fs: &Filesystem, dirs: &[Ino]) {
    for &d in dirs.iter().chain([&fs.root()]) {
        fs.mknod(&ctx(), d, b"settle", libc::S_IFREG, 0)
            .expect("mknod");
        fs.unlink(&ctx(), d, b"settle").expect("unlink");
    }
}

/// Makes directories `{prefix}0` .. `{prefix}{n-1}` under the root (mode 0777).
fn mkdirs(fs: &Filesystem, prefix: &str, n: usize) -> Vec<Ino> {
    (0..n)
        .map(|i| {
            fs.mkdir(&ctx(), fs.root(), format!("{prefix}{i}").as_bytes(), 0o777)
                .expect("mkdir")
                .ino
        })
        .collect()
}

fn cfg() -> Config {
    Config {
        protected_hardlinks: false,
        ..Config::default()
    }
}

/// Checkpoints only when asked.
fn manual_opts() -> Options {
    Options {
        checkpoint_changed: 1 << 50,
        checkpoint_poll: HOUR,
        ..on_demand(host_opts(8 << 20, Duration::from_millis(5)))
    }
}

/// Checkpoints all the time, in the background.
fn busy_opts() -> Options {
    Options {
        checkpoint_records: 3000,
        checkpoint_segments: 2,
        checkpoint_changed: 1 << 50,
        checkpoint_poll: Duration::from_millis(2),
        checkpoint_retry: Duration::from_millis(1),
        checkpoint_retry_max: Duration::from_millis(5),
        ..host_opts(2 << 20, Duration::from_millis(2))
    }
}

/// A store directory on a memory filesystem when there is one (flushes cost little, so
/// checkpoints are many).
/// Closes the store (its handle first) and opens the one in `dir` again.
fn reopen(o: Opened, dir: &Path, opts: &Options) -> Opened {
    o.store.close().expect("close");
    drop(o.fs);
    open(dir, cfg(), opts.clone()).expect("reopen")
}

/// A checkpoint, then [`reopen`].
fn checkpoint_reopen(o: Opened, dir: &Path, opts: &Options) -> Opened {
    o.store.checkpoint().expect("checkpoint");
    reopen(o, dir, opts)
}

fn tmp() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(d) = tempfile::Builder::new()
            .prefix("checkpoint_absorbed_renames")
            .tempdir_in(shm)
    {
        return d;
    }
    tempfile::tempdir().expect("tempdir")
}

// ---------------------------------------------------------------------------------------
// Dumps

#[derive(Debug, Clone, PartialEq, Eq)]
struct Node {
    ino: u64,
    generation: u64,
    mode: u32,
    nlink: u32,
    uid: u32,
    gid: u32,
    rdev: u64,
    size: u64,
    atime: Timespec,
    mtime: Timespec,
    ctime: Timespec,
    flags: Option<u32>,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// Length and hash of a regular file's contents.
    data: Option<(u64, u64)>,
    target: Option<Vec<u8>>,
    /// A directory's entries in readdir order: name, cookie, inode, type.
    entries: Vec<(Vec<u8>, u64, u64, FileType)>,
    dotdot: u64,
}

type Dump = BTreeMap<String, Node>;

fn fnv(h: &mut u64, b: &[u8]) {
    for &x in b {
        *h ^= u64::from(x);
        *h = h.wrapping_mul(0x100_0000_01b3);
    }
}

fn node_of(fs: &Filesystem, a: &Attr) -> Node {
    let c = ctx();
    let ino = a.ino;
    let mut xattrs = Vec::new();
    if let Ok(list) = fs.listxattr(&c, ino) {
        for name in list.split(|&b| b == 0).filter(|n| !n.is_empty()) {
            let v = fs.getxattr(&c, ino, name).unwrap_or_else(|e| {
                panic!("getxattr {ino:?} {}: {e:?}", String::from_utf8_lossy(name))
            });
            xattrs.push((name.to_vec(), v));
        }
        xattrs.sort();
    }
    let mut data = None;
    let mut target = None;
    match a.kind() {
        FileType::RegularFile => {
            let fh = fs
                .open(&c, ino, libc::O_RDONLY | libc::O_NOATIME)
                .unwrap_or_else(|e| panic!("open {ino:?}: {e:?}"));
            let mut h = 0xcbf2_9ce4_8422_2325u64;
            let mut buf = vec![0u8; 1 << 20];
            let mut off = 0u64;
            loop {
                let n = fs.read(fh, off, &mut buf).expect("read");
                if n == 0 {
                    break;
                }
                fnv(&mut h, &buf[..n]);
                off += n as u64;
            }
            fs.release(fh).expect("release");
            data = Some((off, h));
        }
        FileType::Symlink => target = Some(fs.readlink(ino).expect("readlink")),
        _ => {}
    }
    Node {
        ino: ino.0,
        generation: a.generation.0,
        mode: a.mode,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        size: a.size,
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        flags: fs.get_flags(ino).ok(),
        xattrs,
        data,
        target,
        entries: Vec::new(),
        dotdot: 0,
    }
}

/// Every name reachable from the root, with what it names; reads nothing that would change
/// an access time.
fn dump(fs: &Filesystem) -> Dump {
    let c = ctx();
    let mut out = BTreeMap::new();
    let mut stack = vec![("/".to_string(), fs.root())];
    while let Some((path, ino)) = stack.pop() {
        let a = fs
            .getattr(ino)
            .unwrap_or_else(|e| panic!("getattr {path}: {e:?}"));
        let mut n = node_of(fs, &a);
        if a.kind() == FileType::Directory {
            let fh = fs
                .opendir_flags(&c, ino, libc::O_NOATIME)
                .unwrap_or_else(|e| panic!("opendir {path}: {e:?}"));
            let mut off = 0;
            loop {
                let mut got = Vec::new();
                fs.readdir(&c, fh, off, false, |e, _| {
                    got.push((e.name.to_vec(), e.offset, e.ino.0, e.kind));
                    true
                })
                .unwrap_or_else(|e| panic!("readdir {path}: {e:?}"));
                let Some(last) = got.last() else { break };
                off = last.1;
                for g in got {
                    match &g.0[..] {
                        b"." => assert_eq!(g.2, ino.0, "{path}: . names another inode"),
                        b".." => n.dotdot = g.2,
                        _ => n.entries.push(g),
                    }
                }
            }
            fs.releasedir(fh).expect("releasedir");
            for (name, _, e, _) in &n.entries {
                let p = if path == "/" {
                    format!("/{}", String::from_utf8_lossy(name))
                } else {
                    format!("{path}/{}", String::from_utf8_lossy(name))
                };
                stack.push((p, Ino(*e)));
            }
        }
        out.insert(path, n);
    }
    out
}

/// Panics with the first differences between two dumps.
fn same(want: &Dump, got: &Dump, what: &str) {
    if want == got {
        return;
    }
    let mut msg = format!(
        "{what}: the dumps differ ({} vs {} names)\n",
        want.len(),
        got.len()
    );
    let mut k = 0;
    for (p, w) in want {
        match got.get(p) {
            None => msg += &format!("  missing after: {p} {w:?}\n"),
            Some(g) if g != w => {
                msg += &format!("  {p}:\n    want {w:?}\n    got  {g:?}\n");
            }
            _ => continue,
        }
        k += 1;
        if k > 8 {
            break;
        }
    }
    for (p, g) in got {
        if !want.contains_key(p) {
            msg += &format!("  extra after: {p} {g:?}\n");
            k += 1;
            if k > 16 {
                break;
            }
        }
    }
    panic!("{msg}");
}

/// Structural checks of a dump: every inode's link count equals its names (files) or
/// 2 + subdirectories (directories), `..` names the parent, the size of a directory is
/// 20 bytes per entry counting `.` and `..`.
fn structure(d: &Dump, what: &str) {
    let mut names: HashMap<u64, u32> = HashMap::new();
    for (p, n) in d {
        if n.mode & libc::S_IFMT == libc::S_IFDIR {
            let subdirs = n
                .entries
                .iter()
                .filter(|e| e.3 == FileType::Directory)
                .count() as u32;
            assert_eq!(n.nlink, 2 + subdirs, "{what}: {p}: nlink of a directory");
            assert_eq!(
                n.size,
                20 * (n.entries.len() as u64 + 2),
                "{what}: {p}: size of a directory"
            );
            for e in &n.entries {
                if e.3 == FileType::Directory {
                    let cp = if p == "/" {
                        format!("/{}", String::from_utf8_lossy(&e.0))
                    } else {
                        format!("{p}/{}", String::from_utf8_lossy(&e.0))
                    };
                    assert_eq!(d[&cp].dotdot, n.ino, "{what}: {cp}: .. is not its parent");
                } else {
                    *names.entry(e.2).or_default() += 1;
                }
            }
            let mut cookies: Vec<u64> = n.entries.iter().map(|e| e.1).collect();
            cookies.sort();
            cookies.dedup();
            assert_eq!(
                cookies.len(),
                n.entries.len(),
                "{what}: {p}: cookies repeat"
            );
        }
    }
    for (p, n) in d {
        if n.mode & libc::S_IFMT != libc::S_IFDIR {
            assert_eq!(n.nlink, names[&n.ino], "{what}: {p}: nlink against names");
        }
    }
}

fn cookies_into(d: &Dump, max: &mut HashMap<u64, u64>) {
    for n in d.values() {
        for e in &n.entries {
            let m = max.entry(e.1 >> 48).or_default();
            *m = (*m).max(e.1);
        }
    }
}

/// The cookie of `name` in directory `dir` (readdir without touching the atime).
fn cookie_of(fs: &Filesystem, dir: Ino, name: &[u8]) -> u64 {
    let c = ctx();
    let fh = fs.opendir_flags(&c, dir, libc::O_NOATIME).expect("opendir");
    let mut off = 0;
    let mut found = None;
    'outer: loop {
        let mut got = Vec::new();
        fs.readdir(&c, fh, off, false, |e, _| {
            got.push((e.name.to_vec(), e.offset));
            true
        })
        .expect("readdir");
        let Some(last) = got.last() else { break };
        off = last.1;
        for (n, o) in got {
            if n == name {
                found = Some(o);
                break 'outer;
            }
        }
    }
    fs.releasedir(fh).expect("releasedir");
    found.unwrap_or_else(|| panic!("{} not in {dir:?}", String::from_utf8_lossy(name)))
}

// ---------------------------------------------------------------------------------------
// The single-threaded random workload

/// Names of non-directories, pickable at random.
#[derive(Default)]
struct Pool {
    v: Vec<(u64, Vec<u8>)>,
    idx: HashMap<(u64, Vec<u8>), usize>,
}

impl Pool {
    fn insert(&mut self, k: (u64, Vec<u8>)) {
        assert!(!self.idx.contains_key(&k), "model: {k:?} twice");
        self.idx.insert(k.clone(), self.v.len());
        self.v.push(k);
    }
    fn remove(&mut self, k: &(u64, Vec<u8>)) {
        let i = self.idx.remove(k).expect("model: removing a name it lacks");
        self.v.swap_remove(i);
        if i < self.v.len() {
            *self.idx.get_mut(&self.v[i]).expect("moved") = i;
        }
    }
    fn pick(&self, rng: &mut StdRng) -> Option<(u64, Vec<u8>)> {
        if self.v.is_empty() {
            None
        } else {
            Some(self.v[rng.random_range(0..self.v.len())].clone())
        }
    }
}

struct World {
    seed: u64,
    dir: PathBuf,
    opts: Options,
    o: Option<Opened>,
    rng: StdRng,
    dirs: Vec<u64>,
    /// dir ino -> (parent, name); not the root.
    dir_at: HashMap<u64, (u64, Vec<u8>)>,
    files: Pool,
    open: Vec<Fh>,
    next: u64,
    gens: HashSet<u64>,
    max_gen: u64,
    cookies: HashMap<u64, u64>,
    /// A regular file written in large pieces, so that windows fill.
    ballast: Option<(u64, Vec<u8>)>,
    reopens: u32,
    checkpoints: u32,
    ghosts_made: u64,
    slept: u32,
    /// Bytes of file data written since the last checkpoint (most of the journal's bytes),
    /// and how many checkpoints covered more than two windows' worth.
    pending: u64,
    multiwindow: u32,
}

impl World {
    fn new(seed: u64, dir: &Path, opts: Options) -> World {
        let o = open(dir, cfg(), opts.clone()).expect("open");
        let root = o.fs.root().0;
        World {
            seed,
            dir: dir.to_path_buf(),
            opts,
            o: Some(o),
            rng: StdRng::seed_from_u64(seed),
            dirs: vec![root],
            dir_at: HashMap::new(),
            files: Pool::default(),
            open: Vec::new(),
            next: 0,
            gens: HashSet::new(),
            max_gen: 0,
            cookies: HashMap::new(),
            ballast: None,
            reopens: 0,
            checkpoints: 0,
            ghosts_made: 0,
            slept: 0,
            pending: 0,
            multiwindow: 0,
        }
    }

    fn fs(&self) -> &Filesystem {
        &self.o.as_ref().expect("open").fs
    }

    fn name(&mut self) -> Vec<u8> {
        self.next += 1;
        // Names of varied length, so that records vary in size.
        let pad = self.rng.random_range(0..24usize);
        format!("n{}{}", self.next, "x".repeat(pad)).into_bytes()
    }

    fn pick_dir(&mut self) -> u64 {
        self.dirs[self.rng.random_range(0..self.dirs.len())]
    }

    fn note_gen(&mut self, a: &Attr) {
        let g = a.generation.0;
        assert!(
            self.gens.insert(g),
            "seed {}: generation {g} given twice (inode {:?})",
            self.seed,
            a.ino
        );
        self.max_gen = self.max_gen.max(g);
    }

    fn checkpoint(&mut self) {
        let r = self.o.as_ref().expect("open").store.checkpoint();
        if let Err(e) = r {
            panic!("seed {}: checkpoint failed: {e}", self.seed);
        }
        self.checkpoints += 1;
        if self.pending > 8 << 20 {
            self.multiwindow += 1;
        }
        self.pending = 0;
    }

    /// Makes a new non-directory `name` in `dir`; returns its attributes and, for a regular
    /// file made by `create`, its open handle.
    fn make(&mut self, dir: u64, name: &[u8]) -> (Attr, Option<Fh>) {
        let c = ctx();
        let k = self.rng.random_range(0..10);
        let seed = self.seed;
        let fs = self.fs();
        let r = match k {
            0..=5 => fs
                .create(
                    &c,
                    Ino(dir),
                    name,
                    0o644,
                    libc::O_RDWR | libc::O_CREAT | libc::O_EXCL,
                )
                .map(|(a, fh)| (a, Some(fh))),
            6 => fs
                .mknod(&c, Ino(dir), name, libc::S_IFIFO | 0o600, 0)
                .map(|a| (a, None)),
            7 => fs
                .symlink(&c, Ino(dir), name, b"../some/where/else")
                .map(|a| (a, None)),
            8 => fs
                .mknod(&c, Ino(dir), name, libc::S_IFREG | 0o640, 0)
                .map(|a| (a, None)),
            _ => fs
                .mknod(&c, Ino(dir), name, libc::S_IFCHR | 0o600, 0x0103)
                .map(|a| (a, None)),
        };
        let (a, fh) = r.unwrap_or_else(|e| {
            panic!(
                "seed {seed}: make {dir}/{}: {e:?}",
                String::from_utf8_lossy(name)
            )
        });
        self.note_gen(&a);
        (a, fh)
    }

    /// Changes a file's data or attributes a little (the records a ghost may carry).
    fn fiddle(&mut self, a: &Attr, fh: Option<Fh>) {
        let c = ctx();
        let n = self.rng.random_range(0..4);
        for _ in 0..n {
            let k = self.rng.random_range(0..9);
            let fs = self.fs();
            let ino = a.ino;
            match k {
                0 | 1 if fh.is_some() => {
                    let len = if self.rng.random_bool(0.05) {
                        self.rng.random_range(100_000..400_000)
                    } else {
                        self.rng.random_range(1..5000)
                    };
                    let off = self.rng.random_range(0..20_000u64);
                    let b = self.rng.random_range(0..=255u8);
                    self.pending += len as u64;
                    let fs = self.fs();
                    fs.write(&c, fh.unwrap(), off, &vec![b; len])
                        .expect("write");
                }
                2 => {
                    let v = vec![self.rng.random_range(0..=255u8); self.rng.random_range(0..64)];
                    let name = format!("user.k{}", self.rng.random_range(0..3));
                    let fs = self.fs();
                    let _ = fs.setxattr(&c, ino, name.as_bytes(), &v, 0);
                }
                3 => {
                    let _ = fs.removexattr(&c, ino, b"user.k0");
                }
                4 if a.kind() != FileType::Symlink => {
                    let m = self.rng.random_range(0..0o7777u32);
                    let fs = self.fs();
                    fs.setattr(
                        &c,
                        ino,
                        &SetAttr {
                            mode: Some(m),
                            ..SetAttr::default()
                        },
                        None,
                    )
                    .expect("chmod");
                }
                5 => {
                    let t = Timespec::new(self.rng.random_range(0..2_000_000_000), 7);
                    let fs = self.fs();
                    let r = fs.setattr(
                        &c,
                        ino,
                        &SetAttr {
                            atime: Some(TimeSet::At(t)),
                            mtime: Some(TimeSet::Now),
                            ..SetAttr::default()
                        },
                        None,
                    );
                    if a.kind() == FileType::RegularFile {
                        r.expect("utimes");
                    }
                }
                6 if a.kind() == FileType::RegularFile => {
                    let s = self.rng.random_range(0..30_000u64);
                    let fs = self.fs();
                    fs.setattr(
                        &c,
                        ino,
                        &SetAttr {
                            size: Some(s),
                            ..SetAttr::default()
                        },
                        None,
                    )
                    .expect("truncate");
                }
                7 if a.kind() == FileType::RegularFile => {
                    let f = [0, FS_NODUMP_FL, FS_NOATIME_FL][self.rng.random_range(0..3)];
                    let fs = self.fs();
                    fs.set_flags(&c, ino, f).expect("set_flags");
                }
                8 if fh.is_some() => {
                    let off = self.rng.random_range(0..20_000u64);
                    let len = self.rng.random_range(1..20_000u64);
                    let mode = if self.rng.random_bool(0.5) {
                        FALLOC_FL_KEEP_SIZE
                    } else {
                        FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE
                    };
                    let fs = self.fs();
                    fs.fallocate(&c, fh.unwrap(), mode, off, len)
                        .expect("fallocate");
                }
                _ => {}
            }
        }
    }

    /// A short-lived file: made, perhaps changed, renamed 0 to 3 times (each a plain rename,
    /// same or another directory), and, mostly, removed and freed at once or later.
    fn ghost(&mut self) {
        let c = ctx();
        let mut d = self.pick_dir();
        let mut name = self.name();
        let (a, fh) = self.make(d, &name);
        self.ghosts_made += 1;
        self.fiddle(&a, fh);
        let renames = self.rng.random_range(0..4);
        for _ in 0..renames {
            // Now and then a new clock tick between steps, so that a directory time a step
            // sets differs from the step before's.
            if self.slept < 150 && self.rng.random_bool(0.04) {
                std::thread::sleep(Duration::from_millis(5));
                self.slept += 1;
            }
            let to = if self.rng.random_bool(0.3) {
                d
            } else {
                self.pick_dir()
            };
            let nn = self.name();
            let flags = if self.rng.random_bool(0.3) {
                RENAME_NOREPLACE
            } else {
                0
            };
            let seed = self.seed;
            self.fs()
                .rename(&c, Ino(d), &name, Ino(to), &nn, flags)
                .unwrap_or_else(|e| panic!("seed {seed}: ghost rename: {e:?}"));
            d = to;
            name = nn;
            if self.rng.random_bool(0.2) {
                self.fiddle(&a, fh);
            }
        }
        if self.slept < 150 && self.rng.random_bool(0.03) {
            std::thread::sleep(Duration::from_millis(5));
            self.slept += 1;
        }
        if self.rng.random_bool(0.85) {
            let seed = self.seed;
            self.fs()
                .unlink(&c, Ino(d), &name)
                .unwrap_or_else(|e| panic!("seed {seed}: ghost unlink: {e:?}"));
            if let Some(fh) = fh {
                if self.rng.random_bool(0.75) {
                    self.fs().release(fh).expect("release");
                } else {
                    self.open.push(fh); // an orphan, freed later
                }
            }
        } else {
            self.files.insert((d, name));
            if let Some(fh) = fh {
                self.fs().release(fh).expect("release");
            }
        }
    }

    /// A file that looks like a ghost but is named otherwise before it is freed: a rename
    /// over another name or an exchange (either side), a link, a whiteout rename.
    fn near_ghost(&mut self) {
        let c = ctx();
        let d = self.pick_dir();
        let name = self.name();
        let (a, fh) = self.make(d, &name);
        self.fiddle(&a, fh);
        let k = self.rng.random_range(0..6);
        let seed = self.seed;
        let mut names: Vec<(u64, Vec<u8>)> = vec![(d, name.clone())];
        match k {
            // Over an existing name (the ghost replaces).
            0 => {
                if let Some(victim) = self.files.pick(&mut self.rng) {
                    self.fs()
                        .rename(&c, Ino(d), &name, Ino(victim.0), &victim.1, 0)
                        .unwrap_or_else(|e| panic!("seed {seed}: rename over: {e:?}"));
                    self.files.remove(&victim);
                    names = vec![victim];
                }
            }
            // An existing file over it (the ghost is replaced).
            1 => {
                if let Some(src) = self.files.pick(&mut self.rng) {
                    self.fs()
                        .rename(&c, Ino(src.0), &src.1, Ino(d), &name, 0)
                        .unwrap_or_else(|e| panic!("seed {seed}: rename onto: {e:?}"));
                    self.files.remove(&src);
                    self.files.insert((d, name.clone()));
                    names = vec![];
                }
            }
            // Exchanged with an existing file.
            2 => {
                if let Some(other) = self.files.pick(&mut self.rng) {
                    self.fs()
                        .rename(&c, Ino(d), &name, Ino(other.0), &other.1, RENAME_EXCHANGE)
                        .unwrap_or_else(|e| panic!("seed {seed}: exchange: {e:?}"));
                    // The other file now has the new name, the ghost the old one.
                    self.files.remove(&other);
                    self.files.insert((d, name.clone()));
                    names = vec![other];
                }
            }
            // A second name.
            3 => {
                let to = self.pick_dir();
                let nn = self.name();
                self.fs()
                    .link(&c, a.ino, Ino(to), &nn)
                    .unwrap_or_else(|e| panic!("seed {seed}: link: {e:?}"));
                names.push((to, nn));
            }
            // A whiteout left behind.
            4 => {
                let to = self.pick_dir();
                let nn = self.name();
                self.fs()
                    .rename(&c, Ino(d), &name, Ino(to), &nn, RENAME_WHITEOUT)
                    .unwrap_or_else(|e| panic!("seed {seed}: whiteout rename: {e:?}"));
                self.files.insert((d, name.clone())); // the whiteout
                names = vec![(to, nn)];
            }
            // Exchanged with another fresh file, both removed.
            _ => {
                let n2 = self.name();
                let (a2, fh2) = self.make(d, &n2);
                if let Some(f) = fh2 {
                    self.fs().release(f).expect("release");
                }
                let _ = a2;
                self.fs()
                    .rename(&c, Ino(d), &name, Ino(d), &n2, RENAME_EXCHANGE)
                    .unwrap_or_else(|e| panic!("seed {seed}: exchange fresh: {e:?}"));
                names.push((d, n2));
            }
        }
        // Remove what is left of it (mostly).
        for n in names {
            if self.rng.random_bool(0.8) {
                self.fs()
                    .unlink(&c, Ino(n.0), &n.1)
                    .unwrap_or_else(|e| panic!("seed {seed}: near-ghost unlink: {e:?}"));
            } else {
                self.files.insert(n);
            }
        }
        if let Some(fh) = fh {
            if self.rng.random_bool(0.8) {
                self.fs().release(fh).expect("release");
            } else {
                self.open.push(fh);
            }
        }
    }

    /// A directory made for ghosts to pass through, then removed.
    fn through_dir(&mut self) {
        let c = ctx();
        let seed = self.seed;
        let p = self.pick_dir();
        let dn = self.name();
        let da = self
            .fs()
            .mkdir(&c, Ino(p), &dn, 0o755)
            .unwrap_or_else(|e| panic!("seed {seed}: mkdir: {e:?}"));
        self.note_gen(&da);
        let x = da.ino.0;
        for _ in 0..self.rng.random_range(1..4) {
            let other = self.pick_dir();
            let n = self.name();
            let (src, dst) = if self.rng.random_bool(0.5) {
                (x, other)
            } else {
                (other, x)
            };
            let (_, fh) = self.make(src, &n);
            let n2 = self.name();
            self.fs()
                .rename(&c, Ino(src), &n, Ino(dst), &n2, 0)
                .unwrap_or_else(|e| panic!("seed {seed}: through rename: {e:?}"));
            self.fs()
                .unlink(&c, Ino(dst), &n2)
                .unwrap_or_else(|e| panic!("seed {seed}: through unlink: {e:?}"));
            if let Some(fh) = fh {
                self.fs().release(fh).expect("release");
            }
        }
        if self.rng.random_bool(0.8) {
            self.fs()
                .rmdir(&c, Ino(p), &dn)
                .unwrap_or_else(|e| panic!("seed {seed}: through rmdir: {e:?}"));
        } else {
            self.dirs.push(x);
            self.dir_at.insert(x, (p, dn));
        }
    }

    fn big_write(&mut self) {
        let c = ctx();
        let b = match self.ballast.clone() {
            Some(b) => b,
            None => {
                let n = b"ballast".to_vec();
                let root = self.dirs[0];
                let (a, fh) = self
                    .fs()
                    .create(&c, Ino(root), &n, 0o600, libc::O_RDWR | libc::O_CREAT)
                    .expect("ballast");
                self.note_gen(&a);
                self.fs().release(fh).expect("release");
                self.ballast = Some((root, n.clone()));
                (root, n)
            }
        };
        let a = self
            .fs()
            .lookup(&c, Ino(b.0), &b.1)
            .expect("ballast lookup");
        let fh = self
            .fs()
            .open(&c, a.ino, libc::O_RDWR)
            .expect("ballast open");
        let len = self.rng.random_range(200_000..2_500_000usize);
        self.pending += len as u64;
        let off = self.rng.random_range(0..2_000_000u64);
        let byte = self.rng.random_range(0..=255u8);
        self.fs()
            .write(&c, fh, off, &vec![byte; len])
            .expect("ballast write");
        if self.rng.random_bool(0.2) {
            let size = self.rng.random_range(0..500_000);
            self.fs()
                .setattr(
                    &c,
                    a.ino,
                    &SetAttr {
                        size: Some(size),
                        ..SetAttr::default()
                    },
                    None,
                )
                .expect("ballast truncate");
        }
        self.fs().release(fh).expect("release");
    }

    /// One random operation on what exists.
    fn step(&mut self) {
        let c = ctx();
        let seed = self.seed;
        let k = self.rng.random_range(0..100);
        match k {
            0..=34 => self.ghost(),
            35..=42 => self.near_ghost(),
            43..=46 => self.through_dir(),
            47..=52 => {
                // A kept file.
                let d = self.pick_dir();
                let n = self.name();
                let (a, fh) = self.make(d, &n);
                self.fiddle(&a, fh);
                if let Some(fh) = fh {
                    self.fs().release(fh).expect("release");
                }
                self.files.insert((d, n));
            }
            53..=57 => {
                // Change a kept file.
                if let Some(f) = self.files.pick(&mut self.rng) {
                    let a = self.fs().lookup(&c, Ino(f.0), &f.1).expect("lookup");
                    let fh = if a.kind() == FileType::RegularFile {
                        Some(self.fs().open(&c, a.ino, libc::O_RDWR).expect("open"))
                    } else {
                        None
                    };
                    self.fiddle(&a, fh);
                    if let Some(fh) = fh {
                        self.fs().release(fh).expect("release");
                    }
                }
            }
            58..=63 => {
                // Plain rename of a kept file (not a ghost: made in an earlier window, or
                // freed in a later one, mostly).
                if let Some(f) = self.files.pick(&mut self.rng) {
                    let to = self.pick_dir();
                    let nn = self.name();
                    self.fs()
                        .rename(&c, Ino(f.0), &f.1, Ino(to), &nn, 0)
                        .unwrap_or_else(|e| panic!("seed {seed}: rename kept: {e:?}"));
                    self.files.remove(&f);
                    self.files.insert((to, nn));
                }
            }
            64..=69 => {
                // Remove a kept name (perhaps with an open handle: an orphan).
                if let Some(f) = self.files.pick(&mut self.rng) {
                    let hold = self.rng.random_bool(0.3);
                    let a = self.fs().lookup(&c, Ino(f.0), &f.1).expect("lookup");
                    if hold && a.kind() == FileType::RegularFile {
                        let fh = self.fs().open(&c, a.ino, libc::O_RDWR).expect("open");
                        self.open.push(fh);
                    }
                    self.fs()
                        .unlink(&c, Ino(f.0), &f.1)
                        .unwrap_or_else(|e| panic!("seed {seed}: unlink kept: {e:?}"));
                    self.files.remove(&f);
                }
            }
            70..=72 => {
                // Rename over a kept name, or exchange two.
                if let (Some(a), Some(b)) = (
                    self.files.pick(&mut self.rng),
                    self.files.pick(&mut self.rng),
                ) && a != b
                    && self.fs().lookup(&c, Ino(a.0), &a.1).expect("lookup").ino
                        != self.fs().lookup(&c, Ino(b.0), &b.1).expect("lookup").ino
                {
                    if self.rng.random_bool(0.5) {
                        self.fs()
                            .rename(&c, Ino(a.0), &a.1, Ino(b.0), &b.1, RENAME_EXCHANGE)
                            .unwrap_or_else(|e| panic!("seed {seed}: exchange kept: {e:?}"));
                    } else {
                        let r = self.fs().rename(&c, Ino(a.0), &a.1, Ino(b.0), &b.1, 0);
                        match r {
                            Ok(()) => self.files.remove(&a),
                            // Two names of one inode: nothing happens (POSIX).
                            Err(e) => panic!("seed {seed}: rename over kept: {e:?}"),
                        }
                    }
                }
            }
            73..=75 => {
                // Link a kept non-directory.
                if let Some(f) = self.files.pick(&mut self.rng) {
                    let a = self.fs().lookup(&c, Ino(f.0), &f.1).expect("lookup");
                    let to = self.pick_dir();
                    let nn = self.name();
                    self.fs()
                        .link(&c, a.ino, Ino(to), &nn)
                        .unwrap_or_else(|e| panic!("seed {seed}: link kept: {e:?}"));
                    self.files.insert((to, nn));
                }
            }
            76..=78 => {
                if self.dirs.len() < 40 {
                    let p = self.pick_dir();
                    let n = self.name();
                    let a = self
                        .fs()
                        .mkdir(&c, Ino(p), &n, 0o755)
                        .unwrap_or_else(|e| panic!("seed {seed}: mkdir: {e:?}"));
                    self.note_gen(&a);
                    if self.rng.random_bool(0.2) {
                        self.fs()
                            .set_flags(&c, a.ino, FS_NODUMP_FL)
                            .expect("dir flags");
                    }
                    self.dirs.push(a.ino.0);
                    self.dir_at.insert(a.ino.0, (p, n));
                }
            }
            79..=80 => {
                // Remove a directory if it is empty.
                if self.dirs.len() > 1 {
                    let i = self.rng.random_range(1..self.dirs.len());
                    let d = self.dirs[i];
                    let (p, n) = self.dir_at[&d].clone();
                    if self.fs().rmdir(&c, Ino(p), &n).is_ok() {
                        self.dirs.swap_remove(i);
                        self.dir_at.remove(&d);
                    }
                }
            }
            81..=82 => {
                // Move a directory.
                if self.dirs.len() > 1 {
                    let i = self.rng.random_range(1..self.dirs.len());
                    let d = self.dirs[i];
                    let (p, n) = self.dir_at[&d].clone();
                    let to = self.pick_dir();
                    let nn = self.name();
                    if self.fs().rename(&c, Ino(p), &n, Ino(to), &nn, 0).is_ok() {
                        self.dir_at.insert(d, (to, nn));
                    }
                }
            }
            83..=84 => {
                // O_TMPFILE: kept unnamed, linked, or freed.
                let d = self.pick_dir();
                let (a, fh) = self
                    .fs()
                    .tmpfile(&c, Ino(d), 0o600, libc::O_RDWR)
                    .unwrap_or_else(|e| panic!("seed {seed}: tmpfile: {e:?}"));
                self.note_gen(&a);
                self.fiddle(&a, Some(fh));
                if self.rng.random_bool(0.5) {
                    let to = self.pick_dir();
                    let nn = self.name();
                    self.fs()
                        .link(&c, a.ino, Ino(to), &nn)
                        .unwrap_or_else(|e| panic!("seed {seed}: link tmpfile: {e:?}"));
                    if self.rng.random_bool(0.5) {
                        self.fs().unlink(&c, Ino(to), &nn).expect("unlink tmpfile");
                    } else {
                        self.files.insert((to, nn));
                    }
                }
                if self.rng.random_bool(0.7) {
                    self.fs().release(fh).expect("release");
                } else {
                    self.open.push(fh);
                }
            }
            85..=87 => {
                // Free an orphan.
                if !self.open.is_empty() {
                    let i = self.rng.random_range(0..self.open.len());
                    let fh = self.open.swap_remove(i);
                    self.fs().release(fh).expect("release");
                }
            }
            88..=89 => {
                // A directory's own attributes.
                let d = self.pick_dir();
                let t = Timespec::new(self.rng.random_range(0..2_000_000_000), 3);
                self.fs()
                    .setattr(
                        &c,
                        Ino(d),
                        &SetAttr {
                            mtime: Some(TimeSet::At(t)),
                            ..SetAttr::default()
                        },
                        None,
                    )
                    .expect("dir utimes");
                if self.rng.random_bool(0.3) {
                    let _ = self.fs().setxattr(&c, Ino(d), b"user.dir", b"v", 0);
                }
            }
            90..=95 => self.big_write(),
            96..=97 => {
                self.o.as_ref().unwrap().store.sync().expect("sync");
            }
            _ => self.checkpoint(),
        }
    }

    /// A ghost that is the last file made before a reopen, its cookies seen: a create, a
    /// rename to another directory, the removal.
    fn probe(&mut self) {
        let c = ctx();
        let a = self.dirs[0];
        let b = if self.dirs.len() > 1 {
            self.dirs[1 + self.rng.random_range(0..self.dirs.len() - 1)]
        } else {
            a
        };
        let n = self.name();
        let (at, fh) = self
            .fs()
            .create(
                &c,
                Ino(a),
                &n,
                0o600,
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL,
            )
            .expect("probe create");
        self.note_gen(&at);
        let c1 = cookie_of(self.fs(), Ino(a), &n);
        std::thread::sleep(Duration::from_millis(5));
        let n2 = self.name();
        self.fs()
            .rename(&c, Ino(a), &n, Ino(b), &n2, 0)
            .expect("probe rename");
        let c2 = cookie_of(self.fs(), Ino(b), &n2);
        self.fs().unlink(&c, Ino(b), &n2).expect("probe unlink");
        self.fs().release(fh).expect("release");
        for k in [c1, c2] {
            let m = self.cookies.entry(k >> 48).or_default();
            *m = (*m).max(k);
        }
    }

    /// Closes the store (after a checkpoint, or not) and opens it again; the filesystem
    /// must be the same, new cookies above every cookie used, new generations new.
    fn reopen(&mut self, checkpoint_first: bool) {
        let c = ctx();
        let seed = self.seed;
        let release_all = checkpoint_first || self.rng.random_bool(0.5);
        if release_all {
            for fh in std::mem::take(&mut self.open) {
                self.fs().release(fh).expect("release");
            }
        }
        self.probe();
        if checkpoint_first {
            self.checkpoint();
        }
        let before = dump(self.fs());
        structure(&before, &format!("seed {seed}: live"));
        cookies_into(&before, &mut self.cookies);
        if let Err(e) = self.fs().check_invariants() {
            panic!("seed {seed}: live invariants: {e}");
        }
        let o = self.o.take().expect("open");
        let lsn = o.store.checkpoint_lsn();
        o.store.close().expect("close");
        drop(o.fs);
        self.open.clear();
        let o = open(&self.dir, cfg(), self.opts.clone())
            .unwrap_or_else(|e| panic!("seed {seed}: reopen: {e}"));
        let report = o.report.clone();
        self.o = Some(o);
        self.reopens += 1;
        let after = dump(self.fs());
        same(
            &before,
            &after,
            &format!(
                "seed {seed}: reopen {} (checkpoint lsn {lsn}, {report:?})",
                self.reopens
            ),
        );
        if let Err(e) = self.fs().check_invariants() {
            panic!("seed {seed}: invariants after reopen: {e}");
        }
        if checkpoint_first {
            assert_eq!(
                report.replayed, 0,
                "seed {seed}: a checkpoint just before close leaves nothing to replay"
            );
        }
        // New entries: cookies above every cookie seen in their lane, generations new.
        let root = self.dirs[0];
        for _ in 0..3 {
            let n = self.name();
            let (a, fh) = self
                .fs()
                .create(
                    &c,
                    Ino(root),
                    &n,
                    0o600,
                    libc::O_RDWR | libc::O_CREAT | libc::O_EXCL,
                )
                .expect("create after reopen");
            self.fs().release(fh).expect("release");
            assert!(
                a.generation.0 > self.max_gen,
                "seed {seed}: generation {} after reopen, but {} was given before",
                a.generation.0,
                self.max_gen
            );
            self.note_gen(&a);
            let k = cookie_of(self.fs(), Ino(root), &n);
            if let Some(&m) = self.cookies.get(&(k >> 48)) {
                assert!(
                    k > m,
                    "seed {seed}: cookie {k:#x} after reopen, but {m:#x} was used before"
                );
            }
            let m = self.cookies.entry(k >> 48).or_default();
            *m = (*m).max(k);
            self.files.insert((root, n));
        }
    }
}

fn random_run(seed: u64, steps: usize, reopens: usize) -> (u32, u32, u32, u64) {
    let tmp = tmp();
    let mut w = World::new(seed, tmp.path(), manual_opts());
    for r in 0..reopens {
        for _ in 0..steps / reopens {
            w.step();
        }
        let ck = r % 2 == 0 || w.rng.random_bool(0.5);
        w.reopen(ck);
    }
    (w.reopens, w.checkpoints, w.multiwindow, w.ghosts_made)
}

/// A random single-threaded workload of ghosts, near ghosts (renames that replace or
/// exchange, links, whiteouts, tmpfiles), orphans, directories ghosts pass through, and
/// large writes that split checkpoints into several windows; manual checkpoints at random
/// points; close and reopen (after a checkpoint or not) compared exactly.
#[test]
fn random_workload_survives_reopen() {
    for seed in seed::seeds("random_workload_survives_reopen", [1, 2, 3]) {
        let t = Instant::now();
        eprintln!("random_workload_survives_reopen: seed {seed}");
        let (r, c, m, g) = random_run(seed, 2400, 4);
        eprintln!(
            "  seed {seed}: {r} reopens, {c} checkpoints ({m} of more than two windows), \
             {g} ghosts, {:?}",
            t.elapsed()
        );
    }
}

/// Many ghosts in a few directories, in checkpoints that span several windows: a window
/// boundary falls between the create and free of some, the ghost-state blocks are reused
/// from one window and checkpoint to the next.
#[test]
fn ghost_storms_across_windows_and_checkpoints() {
    for seed in seed::seeds("ghost_storms_across_windows_and_checkpoints", [11, 12]) {
        eprintln!("ghost_storms_across_windows_and_checkpoints: seed {seed}");
        let tmp = tmp();
        let mut w = World::new(seed, tmp.path(), manual_opts());
        let c = ctx();
        let root = w.dirs[0];
        let mut ds = vec![root];
        for i in 0..3 {
            let a = w
                .fs()
                .mkdir(&c, Ino(root), format!("d{i}").as_bytes(), 0o755)
                .expect("mkdir");
            w.note_gen(&a);
            w.dirs.push(a.ino.0);
            w.dir_at
                .insert(a.ino.0, (root, format!("d{i}").into_bytes()));
            ds.push(a.ino.0);
        }
        for round in 0..6 {
            // About 4000 ghosts a round (some 1 MB of records) with ballast between.
            let n = w.rng.random_range(2000..6000);
            for i in 0..n {
                let d = ds[w.rng.random_range(0..ds.len())];
                let to = ds[w.rng.random_range(0..ds.len())];
                let nm = format!("g{round}.{i}").into_bytes();
                let a = w
                    .fs()
                    .mknod(&c, Ino(d), &nm, libc::S_IFREG | 0o600, 0)
                    .expect("mknod");
                w.note_gen(&a);
                let (dd, nn) = if w.rng.random_bool(0.5) {
                    let nn = format!("h{round}.{i}").into_bytes();
                    w.fs()
                        .rename(&c, Ino(d), &nm, Ino(to), &nn, 0)
                        .expect("rename");
                    (to, nn)
                } else {
                    (d, nm)
                };
                // A few stay a while: freed in a later window or checkpoint.
                if w.rng.random_bool(0.02) {
                    w.files.insert((dd, nn));
                } else {
                    w.fs().unlink(&c, Ino(dd), &nn).expect("unlink");
                }
                if w.rng.random_bool(0.004) {
                    w.big_write();
                }
                if w.rng.random_bool(0.0005) {
                    w.checkpoint();
                }
            }
            // Remove some of those that stayed.
            let keep: Vec<_> = w.files.v.clone();
            for f in keep {
                if w.rng.random_bool(0.5) {
                    w.fs().unlink(&c, Ino(f.0), &f.1).expect("unlink kept");
                    w.files.remove(&f);
                }
            }
            if round % 2 == 1 {
                w.reopen(round % 4 == 1);
            } else {
                w.checkpoint();
            }
        }
        w.reopen(true);
    }
}

// ---------------------------------------------------------------------------------------
// Power cuts

/// Power cuts at every flush of checkpoints (and crash images taken right after a sync):
/// the store opened from any of them is the filesystem as it was synced.
#[test]
fn power_cuts_during_checkpoints() {
    for seed in seed::seeds("power_cuts_during_checkpoints", [21]) {
        eprintln!("power_cuts_during_checkpoints: seed {seed}");
        let disk = SimDisk::new();
        let opts = Options {
            disk: Arc::new(disk.clone()),
            ..manual_opts()
        };
        let dir = Path::new("/sim/store");
        let mut w = World::new(seed, dir, opts.clone());
        let mut checked = 0;
        for round in 0..5 {
            for _ in 0..500 {
                w.step();
            }
            // Every handle released, so that the state synced is the state the tree shows
            // (an orphan would be freed by the crash's recovery).
            for fh in std::mem::take(&mut w.open) {
                w.fs().release(fh).expect("release");
            }
            w.o.as_ref().unwrap().store.sync().expect("sync");
            let want = dump(w.fs());
            let r = round as u64;
            let ways = move |call: u64, p| {
                let k = call - 1;
                let how = match k % 3 {
                    0 => Unflushed::Lost,
                    1 => Unflushed::Kept,
                    _ => Unflushed::Torn(k * 7919 + r),
                };
                match p == SyncPoint::Before || k.is_multiple_of(2) {
                    true => vec![how],
                    false => vec![],
                }
            };
            let cuts = PowerCuts::start(&disk, ways, || ());
            w.checkpoint();
            let images = cuts.take();
            // A cut right after the sync, too.
            let mut all = vec![disk.crash(Unflushed::Lost)];
            // At most a few of the checkpoint's flush points, spread out.
            let step = (images.len() / 6).max(1);
            all.extend(images.into_iter().step_by(step).map(|c| c.disk));
            for (i, img) in all.into_iter().enumerate() {
                let o = open(
                    dir,
                    cfg(),
                    Options {
                        disk: Arc::new(img),
                        ..opts.clone()
                    },
                )
                .unwrap_or_else(|e| panic!("seed {seed}: round {round}: image {i}: open: {e}"));
                let got = dump(&o.fs);
                same(
                    &want,
                    &got,
                    &format!("seed {seed}: round {round}: power cut image {i}"),
                );
                // The image's store takes a checkpoint of what it replayed, and opens again.
                o.store
                    .checkpoint()
                    .unwrap_or_else(|e| panic!("seed {seed}: image {i}: checkpoint: {e}"));
                checked += 1;
                drop(o);
            }
            if round % 2 == 1 {
                w.reopen(false);
            }
        }
        eprintln!("  seed {seed}: {checked} crash images checked");
    }
}

// ---------------------------------------------------------------------------------------
// Many threads, checkpoints in the background

/// What one worker did: generations it was given, the highest cookie it saw per lane.
#[derive(Default)]
struct Seen {
    gens: Vec<u64>,
    cookies: HashMap<u64, u64>,
}

/// One worker's round: ghosts through shared and own directories (cross-directory renames
/// among them), kept files moved between shared directories, links, removals, directories
/// made and removed, an occasional large write; then a probe ghost whose cookie it notes.
fn worker(fs: &Filesystem, t: usize, round: usize, shared: &[Ino], own: Ino, seed: u64) -> Seen {
    let c = ctx();
    let mut rng = StdRng::seed_from_u64(seed ^ ((t as u64) << 32) ^ ((round as u64) << 48));
    let mut seen = Seen::default();
    let mut kept: Vec<(Ino, Vec<u8>)> = Vec::new();
    let mut sub: Option<(Ino, Vec<u8>)> = None;
    let mut k = 0u64;
    let mut name = |p: &str| {
        k += 1;
        format!("{p}{t}.{round}.{k}").into_bytes()
    };
    let pick = |rng: &mut StdRng, sub: &Option<(Ino, Vec<u8>)>| -> Ino {
        match rng.random_range(0..10) {
            0..=5 => shared[rng.random_range(0..shared.len())],
            6 | 7 => own,
            _ => sub.as_ref().map_or(own, |s| s.0),
        }
    };
    for i in 0..900 {
        // Room, now and then, for the committer and the checkpointer on a small machine.
        if i % 50 == 49 {
            std::thread::sleep(Duration::from_millis(2));
        }
        match rng.random_range(0..100) {
            0..=59 => {
                let d = pick(&mut rng, &sub);
                let n = name("g");
                let (a, fh) = if rng.random_bool(0.5) {
                    let (a, fh) = fs
                        .create(
                            &c,
                            d,
                            &n,
                            0o644,
                            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL,
                        )
                        .unwrap_or_else(|e| panic!("seed {seed} t{t}: create: {e:?}"));
                    (a, Some(fh))
                } else {
                    let a = fs
                        .mknod(&c, d, &n, libc::S_IFREG | 0o600, 0)
                        .unwrap_or_else(|e| panic!("seed {seed} t{t}: mknod: {e:?}"));
                    (a, None)
                };
                seen.gens.push(a.generation.0);
                if let Some(fh) = fh
                    && rng.random_bool(0.3)
                {
                    fs.write(&c, fh, 0, &vec![t as u8; rng.random_range(1..3000)])
                        .expect("write");
                }
                if rng.random_bool(0.2) {
                    let _ = fs.setxattr(&c, a.ino, b"user.t", b"x", 0);
                }
                let (mut dd, mut nn) = (d, n);
                for _ in 0..rng.random_range(0..3) {
                    let to = pick(&mut rng, &sub);
                    let n2 = name("r");
                    fs.rename(&c, dd, &nn, to, &n2, 0)
                        .unwrap_or_else(|e| panic!("seed {seed} t{t}: ghost rename: {e:?}"));
                    dd = to;
                    nn = n2;
                }
                if rng.random_bool(0.9) {
                    fs.unlink(&c, dd, &nn)
                        .unwrap_or_else(|e| panic!("seed {seed} t{t}: ghost unlink: {e:?}"));
                } else {
                    kept.push((dd, nn));
                }
                if let Some(fh) = fh {
                    fs.release(fh).expect("release");
                }
            }
            60..=69 => {
                // Move a kept file to another shared directory, or over another kept one.
                if kept.len() >= 2 {
                    let a = rng.random_range(0..kept.len());
                    if rng.random_bool(0.3) {
                        let b = rng.random_range(0..kept.len());
                        let same_inode = |x: &(Ino, Vec<u8>), y: &(Ino, Vec<u8>)| {
                            fs.lookup(&c, x.0, &x.1).expect("lookup").ino
                                == fs.lookup(&c, y.0, &y.1).expect("lookup").ino
                        };
                        if a != b && !same_inode(&kept[a], &kept[b]) {
                            let (x, y) = (kept[a].clone(), kept[b].clone());
                            let flags = if rng.random_bool(0.5) {
                                RENAME_EXCHANGE
                            } else {
                                0
                            };
                            fs.rename(&c, x.0, &x.1, y.0, &y.1, flags)
                                .unwrap_or_else(|e| {
                                    panic!("seed {seed} t{t}: rename over kept: {e:?}")
                                });
                            if flags == 0 {
                                kept.swap_remove(a);
                            }
                        }
                    } else {
                        let to = pick(&mut rng, &sub);
                        let n2 = name("m");
                        let x = kept[a].clone();
                        fs.rename(&c, x.0, &x.1, to, &n2, 0)
                            .unwrap_or_else(|e| panic!("seed {seed} t{t}: move kept: {e:?}"));
                        kept[a] = (to, n2);
                    }
                }
            }
            70..=74 => {
                if let Some(x) = kept.first().cloned() {
                    let a = fs.lookup(&c, x.0, &x.1).expect("lookup");
                    let to = pick(&mut rng, &sub);
                    let n2 = name("l");
                    fs.link(&c, a.ino, to, &n2).expect("link");
                    kept.push((to, n2));
                }
            }
            75..=84 => {
                if !kept.is_empty() {
                    let a = rng.random_range(0..kept.len());
                    let x = kept.swap_remove(a);
                    fs.unlink(&c, x.0, &x.1)
                        .unwrap_or_else(|e| panic!("seed {seed} t{t}: unlink kept: {e:?}"));
                }
            }
            85..=89 => {
                // A subdirectory of the worker's own, made or (when emptied) removed.
                match sub.take() {
                    None => {
                        let n = name("d");
                        let a = fs.mkdir(&c, own, &n, 0o755).expect("mkdir");
                        seen.gens.push(a.generation.0);
                        sub = Some((a.ino, n));
                    }
                    Some((d, n)) => {
                        // Move out what is kept there, then remove it.
                        for x in kept.iter_mut() {
                            if x.0 == d {
                                let n2 = format!("o{t}.{round}.{i}.{}", rng.random::<u32>())
                                    .into_bytes();
                                fs.rename(&c, x.0, &x.1, own, &n2, 0).expect("move out");
                                *x = (own, n2);
                            }
                        }
                        fs.rmdir(&c, own, &n)
                            .unwrap_or_else(|e| panic!("seed {seed} t{t}: rmdir: {e:?}"));
                    }
                }
            }
            90..=91 => {
                let n = name("b");
                let (a, fh) = fs
                    .create(
                        &c,
                        own,
                        &n,
                        0o644,
                        libc::O_RDWR | libc::O_CREAT | libc::O_EXCL,
                    )
                    .expect("create big");
                seen.gens.push(a.generation.0);
                fs.write(&c, fh, 0, &vec![7u8; rng.random_range(50_000..300_000)])
                    .expect("big write");
                fs.release(fh).expect("release");
                if rng.random_bool(0.7) {
                    fs.unlink(&c, own, &n).expect("unlink big");
                } else {
                    kept.push((own, n));
                }
            }
            _ => {
                // A chmod or utimes on a shared directory (its times race the ghosts').
                let d = shared[rng.random_range(0..shared.len())];
                let _ = fs.setattr(
                    &c,
                    d,
                    &SetAttr {
                        mode: Some(0o755),
                        ..SetAttr::default()
                    },
                    None,
                );
            }
        }
    }
    // The subdirectory is left as it is (kept files may be in it).
    // A probe ghost: its cookies are the highest this thread's lane gave.
    let d = shared[t % shared.len()];
    let n = name("p");
    let (a, fh) = fs
        .create(
            &c,
            d,
            &n,
            0o600,
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL,
        )
        .expect("probe");
    seen.gens.push(a.generation.0);
    let c1 = cookie_of(fs, d, &n);
    let to = shared[(t + 1) % shared.len()];
    let n2 = name("q");
    fs.rename(&c, d, &n, to, &n2, 0).expect("probe rename");
    let c2 = cookie_of(fs, to, &n2);
    fs.unlink(&c, to, &n2).expect("probe unlink");
    fs.release(fh).expect("release");
    for k in [c1, c2] {
        let m = seen.cookies.entry(k >> 48).or_default();
        *m = (*m).max(k);
    }
    seen
}

/// 16 threads making ghosts in shared directories while checkpoints run in the
/// background (and on demand from another thread); then the invariants, and a reopen that
/// must give the same filesystem, cookies above all used, generations new.
#[test]
fn threads_race_background_checkpoints() {
    for seed in seed::seeds("threads_race_background_checkpoints", [31]) {
        eprintln!("threads_race_background_checkpoints: seed {seed}");
        let tmp = tmp();
        let opts = busy_opts();
        let mut o = open(tmp.path(), cfg(), opts.clone()).expect("open");
        let threads = 12;
        let shared = mkdirs(&o.fs, "s", 4);
        let own = mkdirs(&o.fs, "t", threads);
        let mut all_gens: HashSet<u64> = HashSet::new();
        let mut max_gen = 0;
        let mut cookies: HashMap<u64, u64> = HashMap::new();
        for round in 0..5 {
            let t0 = Instant::now();
            let done = AtomicBool::new(false);
            let forced = AtomicU64::new(0);
            let seens: Vec<Seen> = std::thread::scope(|s| {
                let fs = &o.fs;
                let store = &o.store;
                let (done, forced) = (&done, &forced);
                let ck = s.spawn(move || {
                    while !done.load(Ordering::SeqCst) {
                        let t = Instant::now();
                        if std::env::var("CHECKPOINT_ABSORBED_RENAMES_VERBOSE").is_ok() {
                            store.sync().expect("sync");
                            eprintln!("    sync {:?}", t.elapsed());
                        }
                        let r = store.checkpoint();
                        if std::env::var("CHECKPOINT_ABSORBED_RENAMES_VERBOSE").is_ok() {
                            eprintln!("    checkpoint {:?} {:?}", r, t.elapsed());
                        }
                        if let Err(e) = r {
                            panic!("seed {seed}: checkpoint during the race: {e}");
                        }
                        forced.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(3));
                    }
                });
                let hs: Vec<_> = (0..threads)
                    .map(|t| {
                        let shared = &shared;
                        let own = own[t];
                        s.spawn(move || worker(fs, t, round, shared, own, seed))
                    })
                    .collect();
                let r = hs.into_iter().map(|h| h.join().expect("worker")).collect();
                done.store(true, Ordering::SeqCst);
                ck.join().expect("checkpoint thread");
                r
            });
            let status = o.store.checkpoint_status();
            eprintln!(
                "  round {round}: {:?}, {} on-demand checkpoints, status {status:?}",
                t0.elapsed(),
                forced.load(Ordering::SeqCst)
            );
            for s in &seens {
                for &g in &s.gens {
                    assert!(
                        all_gens.insert(g),
                        "seed {seed}: generation {g} given twice"
                    );
                    max_gen = max_gen.max(g);
                }
                for (&l, &m) in &s.cookies {
                    let x = cookies.entry(l).or_default();
                    *x = (*x).max(m);
                }
            }
            if let Err(e) = o.fs.check_invariants() {
                panic!("seed {seed}: invariants after the race: {e}");
            }
            settle_times(&o.fs, &shared);
            let before = dump(&o.fs);
            structure(&before, &format!("seed {seed}: round {round}: live"));
            cookies_into(&before, &mut cookies);
            if round % 2 == 0 {
                o.store.checkpoint().expect("last checkpoint");
            }
            o = reopen(o, tmp.path(), &opts);
            let after = dump(&o.fs);
            same(
                &before,
                &after,
                &format!("seed {seed}: round {round}: reopen"),
            );
            if let Err(e) = o.fs.check_invariants() {
                panic!("seed {seed}: invariants after reopen: {e}");
            }
            // New threads take the lanes the workers had: their cookies must be above.
            let fs = &o.fs;
            let got: Vec<(u64, u64)> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..threads)
                    .map(|t| {
                        s.spawn(move || {
                            let c = ctx();
                            let n = format!("after{round}.{t}").into_bytes();
                            let d = Ino(fs.root().0);
                            let (a, fh) = fs
                                .create(&c, d, &n, 0o600, libc::O_RDWR | libc::O_CREAT)
                                .expect("create after");
                            fs.release(fh).expect("release");
                            (a.generation.0, cookie_of(fs, d, &n))
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().expect("after")).collect()
            });
            let max_before = max_gen;
            let cookies_before = cookies.clone();
            for (g, k) in got {
                assert!(
                    g > max_before,
                    "seed {seed}: round {round}: generation {g} after reopen, {max_before} before"
                );
                assert!(all_gens.insert(g));
                max_gen = g.max(max_gen);
                if let Some(&m) = cookies_before.get(&(k >> 48)) {
                    assert!(
                        k > m,
                        "seed {seed}: round {round}: cookie {k:#x} after reopen, {m:#x} before"
                    );
                }
                let x = cookies.entry(k >> 48).or_default();
                *x = (*x).max(k);
            }
        }
    }
}

/// Generations from many 1024-blocks in one window: threads take generations in runs of
/// 1024, so blocks interleave; inode numbers are reused within a window. Checkpoints on
/// demand while the threads run; then a reopen.
#[test]
fn interleaved_generation_blocks_and_reused_numbers() {
    for seed in seed::seeds("interleaved_generation_blocks_and_reused_numbers", [41]) {
        eprintln!("interleaved_generation_blocks_and_reused_numbers: seed {seed}");
        let tmp = tmp();
        let opts = manual_opts();
        let mut o = open(tmp.path(), cfg(), opts.clone()).expect("open");
        let c = ctx();
        let root = o.fs.root();
        let d = o.fs.mkdir(&c, root, b"d", 0o777).expect("mkdir").ino;
        let e = o.fs.mkdir(&c, root, b"e", 0o777).expect("mkdir").ino;
        for round in 0..3 {
            let done = AtomicBool::new(false);
            std::thread::scope(|s| {
                let fs = &o.fs;
                let store = &o.store;
                let done = &done;
                let ck = s.spawn(move || {
                    while !done.load(Ordering::SeqCst) {
                        store
                            .checkpoint()
                            .unwrap_or_else(|e| panic!("seed {seed}: checkpoint: {e}"));
                        std::thread::sleep(Duration::from_millis(1));
                    }
                });
                let hs: Vec<_> = (0..12)
                    .map(|t| {
                        s.spawn(move || {
                            let c = ctx();
                            let mut rng = StdRng::seed_from_u64(seed + t as u64 * 1000 + round);
                            // Kept files every so often, so that numbers are reused and
                            // generations from each block survive too.
                            for i in 0..2500 {
                                let n = format!("f{round}.{t}.{i}").into_bytes();
                                let a = fs
                                    .mknod(&c, d, &n, libc::S_IFREG | 0o600, 0)
                                    .expect("mknod");
                                let _ = a;
                                let keep = rng.random_bool(0.01);
                                if rng.random_bool(0.5) {
                                    let n2 = format!("x{round}.{t}.{i}").into_bytes();
                                    fs.rename(&c, d, &n, e, &n2, 0).expect("rename");
                                    if !keep {
                                        fs.unlink(&c, e, &n2).expect("unlink");
                                    }
                                } else if !keep {
                                    fs.unlink(&c, d, &n).expect("unlink");
                                }
                            }
                        })
                    })
                    .collect();
                for h in hs {
                    h.join().expect("thread");
                }
                done.store(true, Ordering::SeqCst);
                ck.join().expect("checkpointer");
            });
            let before = dump(&o.fs);
            structure(&before, &format!("seed {seed}: round {round}: live"));
            if round == 1 {
                o.store.checkpoint().expect("checkpoint");
            }
            o = reopen(o, tmp.path(), &opts);
            same(
                &before,
                &dump(&o.fs),
                &format!("seed {seed}: round {round}: reopen"),
            );
            let max = before.values().map(|n| n.generation).max().unwrap_or(0);
            let a =
                o.fs.mknod(&c, root, format!("z{round}").as_bytes(), libc::S_IFREG, 0)
                    .expect("mknod");
            assert!(a.generation.0 > max, "seed {seed}: generation reused");
        }
    }
}

/// The directory times a ghost's rename leaves: created in one directory, moved (after a
/// clock tick) to another, removed there; nothing else touches either directory. A
/// checkpoint of all of it, then a reopen.
#[test]
fn ghost_rename_directory_times() {
    let tmp = tmp();
    let opts = manual_opts();
    let o = open(tmp.path(), cfg(), opts.clone()).expect("open");
    let c = ctx();
    let root = o.fs.root();
    let mut pairs = Vec::new();
    for i in 0..20 {
        let a =
            o.fs.mkdir(&c, root, format!("a{i}").as_bytes(), 0o755)
                .expect("mkdir")
                .ino;
        let b =
            o.fs.mkdir(&c, root, format!("b{i}").as_bytes(), 0o755)
                .expect("mkdir")
                .ino;
        let m =
            o.fs.mkdir(&c, root, format!("m{i}").as_bytes(), 0o755)
                .expect("mkdir")
                .ino;
        pairs.push((a, b, m));
    }
    o.store.checkpoint().expect("checkpoint");
    std::thread::sleep(Duration::from_millis(10));
    for (i, &(a, b, m)) in pairs.iter().enumerate() {
        // Made in a, moved to m (same tick or not), then to b, removed there.
        o.fs.mknod(&c, a, b"f", libc::S_IFREG | 0o600, 0)
            .expect("mknod");
        if i % 2 == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        o.fs.rename(&c, a, b"f", m, b"g", 0).expect("rename");
        std::thread::sleep(Duration::from_millis(5));
        o.fs.rename(&c, m, b"g", b, b"h", 0).expect("rename");
        if i % 3 == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        o.fs.unlink(&c, b, b"h").expect("unlink");
    }
    let before = dump(&o.fs);
    let o = checkpoint_reopen(o, tmp.path(), &opts);
    assert_eq!(o.report.replayed, 0);
    same(&before, &dump(&o.fs), "ghost rename directory times");
}

/// A file made in one checkpoint, renamed and removed in the next: not a ghost (its
/// create is not in the window); its rename and removal must reach the checkpoint.
#[test]
fn renamed_and_freed_in_a_later_checkpoint() {
    let tmp = tmp();
    let opts = manual_opts();
    let o = open(tmp.path(), cfg(), opts.clone()).expect("open");
    let c = ctx();
    let [a, b] = ["a", "b"].map(|n| {
        o.fs.mkdir(&c, o.fs.root(), n.as_bytes(), 0o755)
            .expect("mkdir")
            .ino
    });
    for i in 0..50 {
        let (_, fh) =
            o.fs.create(
                &c,
                a,
                format!("f{i}").as_bytes(),
                0o644,
                libc::O_RDWR | libc::O_CREAT,
            )
            .expect("create");
        o.fs.write(&c, fh, 0, b"data").expect("write");
        o.fs.release(fh).expect("release");
    }
    o.store.checkpoint().expect("checkpoint");
    for i in 0..50 {
        let n = format!("f{i}").into_bytes();
        let n2 = format!("g{i}").into_bytes();
        o.fs.rename(&c, a, &n, b, &n2, 0).expect("rename");
        if i % 2 == 0 {
            o.fs.unlink(&c, b, &n2).expect("unlink");
        }
        // Ghosts between them, made in this window.
        let g = format!("h{i}").into_bytes();
        o.fs.mknod(&c, b, &g, libc::S_IFREG, 0).expect("mknod");
        o.fs.rename(&c, b, &g, a, &g, 0).expect("rename");
        o.fs.unlink(&c, a, &g).expect("unlink");
    }
    let before = dump(&o.fs);
    let o = checkpoint_reopen(o, tmp.path(), &opts);
    same(
        &before,
        &dump(&o.fs),
        "renamed and freed a checkpoint later",
    );
}

/// Power cuts at random flushes while threads make ghosts and checkpoints run in the
/// background (so that a cut falls inside a checkpoint, and a checkpoint's end inside a
/// batch). What a cut leaves is unknown, but it must be one filesystem: opened (the journal
/// after its checkpoint replayed), it is whole; a checkpoint of it, then a reopen (loaded
/// from that checkpoint), gives exactly the same filesystem back.
#[test]
fn crash_images_under_concurrency_replay_equals_checkpoint() {
    for seed in seed::seeds(
        "crash_images_under_concurrency_replay_equals_checkpoint",
        [51],
    ) {
        eprintln!("crash_images_under_concurrency_replay_equals_checkpoint: seed {seed}");
        let disk = SimDisk::new();
        let dir = Path::new("/sim/race");
        let opts = Options {
            disk: Arc::new(disk.clone()),
            ..busy_opts()
        };
        let o = open(dir, cfg(), opts.clone()).expect("open");
        let shared = mkdirs(&o.fs, "s", 3);
        let own = mkdirs(&o.fs, "t", 6);
        let every = 2 + seed % 3;
        let ways = move |call: u64, _| {
            let k = call - 1;
            if k % every != 1 || k / every >= 12 {
                return vec![];
            }
            vec![match (k / every) % 3 {
                0 => Unflushed::Lost,
                1 => Unflushed::Kept,
                _ => Unflushed::Torn(k ^ 0x5eed),
            }]
        };
        let cuts = PowerCuts::start(&disk, ways, || ());
        std::thread::scope(|s| {
            let fs = &o.fs;
            let hs: Vec<_> = (0..own.len())
                .map(|t| {
                    let (shared, own) = (&shared, own[t]);
                    s.spawn(move || worker(fs, t, 0, shared, own, seed))
                })
                .collect();
            for h in hs {
                h.join().expect("worker");
            }
        });
        let imgs: Vec<SimDisk> = cuts.take().into_iter().map(|c| c.disk).collect();
        o.store.close().expect("close");
        drop(o.fs);
        eprintln!("  seed {seed}: {} crash images", imgs.len());
        assert!(!imgs.is_empty(), "seed {seed}: no crash image taken");
        for (i, img) in imgs.into_iter().enumerate() {
            let mopts = Options {
                disk: Arc::new(img.clone()),
                ..manual_opts()
            };
            let what = format!("seed {seed}: image {i}");
            let o = open(dir, cfg(), mopts.clone()).unwrap_or_else(|e| panic!("{what}: open: {e}"));
            let replayed = o.report.clone();
            if let Err(e) = o.fs.check_invariants() {
                panic!("{what}: invariants: {e}");
            }
            let a = dump(&o.fs);
            structure(&a, &what);
            o.store
                .checkpoint()
                .unwrap_or_else(|e| panic!("{what}: checkpoint: {e}"));
            o.store.close().expect("close");
            drop(o.fs);
            let o = open(dir, cfg(), mopts).unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
            assert_eq!(o.report.replayed, 0, "{what}");
            same(
                &a,
                &dump(&o.fs),
                &format!("{what}: replayed ({replayed:?}) against loaded"),
            );
        }
    }
}

/// Records larger than a window (and than a segment): single writes of many MiB, to ghosts
/// and to kept files, between small ghosts; the window grows past its reuse limit and is
/// given back, then reused. Checkpoints, a reopen.
#[test]
fn records_larger_than_a_window() {
    let tmp = tmp();
    let opts = manual_opts();
    let o = open(tmp.path(), cfg(), opts.clone()).expect("open");
    let c = ctx();
    let [a, b] = ["a", "b"].map(|n| {
        o.fs.mkdir(&c, o.fs.root(), n.as_bytes(), 0o755)
            .expect("mkdir")
            .ino
    });
    let mut rng = StdRng::seed_from_u64(61);
    for round in 0..4 {
        for i in 0..6 {
            let n = format!("big{round}.{i}").into_bytes();
            let (_, fh) =
                o.fs.create(
                    &c,
                    a,
                    &n,
                    0o644,
                    libc::O_RDWR | libc::O_CREAT | libc::O_EXCL,
                )
                .expect("create");
            let len = rng.random_range((5 << 20)..(14 << 20));
            o.fs.write(&c, fh, rng.random_range(0..4096), &vec![i as u8 + 1; len])
                .expect("write");
            o.fs.release(fh).expect("release");
            // Small ghosts on either side of it.
            for j in 0..50 {
                let g = format!("g{round}.{i}.{j}").into_bytes();
                o.fs.mknod(&c, a, &g, libc::S_IFREG, 0).expect("mknod");
                o.fs.rename(&c, a, &g, b, &g, 0).expect("rename");
                o.fs.unlink(&c, b, &g).expect("unlink");
            }
            let n2 = format!("r{round}.{i}").into_bytes();
            o.fs.rename(&c, a, &n, b, &n2, 0).expect("rename big");
            if i % 2 == 0 {
                // The big file is a ghost (made, renamed, freed here).
                o.fs.unlink(&c, b, &n2).expect("unlink big");
            }
        }
        o.store
            .checkpoint()
            .unwrap_or_else(|e| panic!("round {round}: checkpoint: {e}"));
        // Some removed in the next checkpoint.
        if round % 2 == 1 {
            for i in (1..6).step_by(2) {
                let _ = o.fs.unlink(&c, b, format!("r{}.{i}", round - 1).as_bytes());
            }
        }
    }
    let before = dump(&o.fs);
    let o = checkpoint_reopen(o, tmp.path(), &opts);
    same(&before, &dump(&o.fs), "records larger than a window");
}

/// Long runs of nothing but ghosts, through more directories and cookie lanes than the
/// checkpoint gathers before it writes (16 of each): one thread through 40 directories,
/// then 24 threads at once (24 lanes). Every directory's times and every lane's highest
/// cookie must survive a checkpoint and reopen.
#[test]
fn ghost_runs_through_many_directories_and_lanes() {
    let tmp = tmp();
    let opts = manual_opts();
    let mut o = open(tmp.path(), cfg(), opts.clone()).expect("open");
    let c = ctx();
    let dirs = mkdirs(&o.fs, "d", 40);
    o.store.checkpoint().expect("checkpoint");
    std::thread::sleep(Duration::from_millis(5));
    let mut cookies: HashMap<u64, u64> = HashMap::new();
    for pass in 0..3 {
        // One thread: a run of ghosts, each through two of the 40 directories.
        for i in 0..200usize {
            let (a, b) = (dirs[i % 40], dirs[(i * 7 + pass) % 40]);
            let n = format!("p{pass}.{i}").into_bytes();
            o.fs.mknod(&c, a, &n, libc::S_IFREG, 0).expect("mknod");
            if i % 50 == 0 {
                std::thread::sleep(Duration::from_millis(5));
            }
            o.fs.rename(&c, a, &n, b, &n, 0).expect("rename");
            o.fs.unlink(&c, b, &n).expect("unlink");
        }
        // 24 threads, each a lane of its own, the last of each lane's cookies noted.
        let seen: Vec<u64> = std::thread::scope(|s| {
            let fs = &o.fs;
            let dirs = &dirs;
            let hs: Vec<_> = (0..24usize)
                .map(|t| {
                    s.spawn(move || {
                        let c = ctx();
                        let mut last = 0;
                        for i in 0..300usize {
                            let (a, b) = (dirs[(t + i) % 40], dirs[(t * 3 + i * 11) % 40]);
                            let n = format!("q{pass}.{t}.{i}").into_bytes();
                            fs.mknod(&c, a, &n, libc::S_IFREG, 0).expect("mknod");
                            fs.rename(&c, a, &n, b, &n, 0).expect("rename");
                            if i == 299 {
                                last = cookie_of(fs, b, &n);
                            }
                            fs.unlink(&c, b, &n).expect("unlink");
                        }
                        last
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("thread")).collect()
        });
        for k in seen {
            let m = cookies.entry(k >> 48).or_default();
            *m = (*m).max(k);
        }
        settle_times(&o.fs, &dirs);
        let before = dump(&o.fs);
        structure(&before, "many lanes: live");
        o = checkpoint_reopen(o, tmp.path(), &opts);
        assert_eq!(o.report.replayed, 0);
        same(&before, &dump(&o.fs), &format!("many lanes: pass {pass}"));
        // Threads again, in the same lanes: their cookies above those noted.
        let got: Vec<u64> = std::thread::scope(|s| {
            let fs = &o.fs;
            let hs: Vec<_> = (0..24usize)
                .map(|t| {
                    s.spawn(move || {
                        let c = ctx();
                        let n = format!("after{pass}.{t}").into_bytes();
                        fs.mknod(&c, fs.root(), &n, libc::S_IFREG, 0)
                            .expect("mknod");
                        let k = cookie_of(fs, fs.root(), &n);
                        fs.unlink(&c, fs.root(), &n).expect("unlink");
                        k
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("thread")).collect()
        });
        let before_cookies = cookies.clone();
        for k in got {
            if let Some(&m) = before_cookies.get(&(k >> 48)) {
                assert!(
                    k > m,
                    "pass {pass}: cookie {k:#x} after reopen, {m:#x} before"
                );
            }
            let m = cookies.entry(k >> 48).or_default();
            *m = (*m).max(k);
        }
    }
}
