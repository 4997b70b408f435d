//! Crash consistency under concurrency: threads race namespace operations on a disk store
//! kept on a simulated disk, while power cuts are taken at random moments (during the race,
//! at flushes, and right after a sync returned); every image must recover to a consistent
//! tree that holds every operation acknowledged by a sync, as a prefix of each thread's
//! operations (docs/DESIGN.md §5, docs/STORE.md).
//!
//! Each worker thread owns a directory `/o<j>` that no other thread touches, and the names
//! `t<j>_*` in the common directory `/c` (so that own creates, renames and links race the
//! other threads' in one directory); after each of its operations on them it records a
//! snapshot of them (names, types, modes, link counts, sizes, contents, link targets,
//! xattrs, hard-link grouping). It also races other threads on shared names under `/s` and
//! `/c` (results ignored), for invariant stress. Every recovered tree must pass the
//! engine's invariant check, fsck, and a walk from the root (each inode's nlink equals its
//! names, directories 2 + subdirectories, `..` is the parent, every inode reachable: no
//! orphan survives a crash). A
//! thread's own directory in a recovered image must equal one of its snapshots, no earlier
//! than the last one acknowledged by any sync that returned Ok before the image was taken
//! (a sync acknowledges, for every thread, the operations that thread had completed when
//! the sync began), and no later than the last operation begun when it was taken. Before
//! each own operation a thread notes how far every other thread had got: a recovered state
//! holding that operation must hold those too (prefix across threads).
//!
//! Tests: power cuts during a race (three generations: an image that recovered carries the
//! next race; power cuts are also taken while an image recovers); the same while the host
//! runs out of room now and then; a clean close after a race (the reopened tree, and the
//! image of a power cut after the close, equal the live tree, times and blocks included);
//! and a focused test of a bug the second one found (page reads failing with EIO while a
//! failed checkpoint reopens its database).
//!
//! Seeds: every test prints its seed; `LANEFS_SEED=<n>` replays it (the choices, not the
//! interleaving). `POWER_CUTS_DURING_RACES_SECS` (race seconds per generation) and
//! `POWER_CUTS_DURING_RACES_GENS` (generations of the power-cut test) scale them.

mod common;

use common::kind_char;

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{opts, seed};
use lanefs::{
    Client, Config, Filesystem, Ino, OpenOptions, RENAME_EXCHANGE, RENAME_NOREPLACE,
    RENAME_WHITEOUT, XATTR_CREATE, XATTR_REPLACE,
};
use lanefs_store::disk::{SimDisk, Unflushed};
use lanefs_store::{Options, fsck, open};
use rand::{Rng, SeedableRng, rngs::StdRng};

const STORE: &str = "/store";

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|s| s.parse().ok())
}

thread_local! {
    /// The store's knobs, picked per test (on the test's thread) from its seed.
    static KNOBS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn set_knobs(rng: &mut StdRng) {
    let k = rng.random::<u64>();
    KNOBS.set(k);
    let o = options(&SimDisk::new());
    eprintln!(
        "  segments of {} KiB, commit interval {:?}, flush interval {:?}, checkpoint every {} records",
        o.segment_size >> 10,
        o.commit_interval,
        o.flush_interval,
        o.checkpoint_records
    );
}

fn options(disk: &SimDisk) -> Options {
    let k = KNOBS.get();
    let segment_size = [64 << 10, 256 << 10, 1 << 20][(k % 3) as usize];
    let commit_interval = Duration::from_millis([1, 3, 20][(k / 3 % 3) as usize]);
    Options {
        flush_interval: Duration::from_millis([10, 40, 1000][(k / 9 % 3) as usize]),
        checkpoint_records: [300, 2500, 100_000][(k / 27 % 3) as usize],
        checkpoint_segments: 2,
        journal_segments: 6,
        checkpoint_changed: 128 << 10,
        checkpoint_poll: Duration::from_millis(15),
        checkpoint_retry: Duration::from_millis(20),
        checkpoint_retry_max: Duration::from_millis(200),
        checkpoint_cache: 1 << 20,
        checkpoint_reserve: 0,
        ..opts(disk, segment_size, commit_interval)
    }
}

fn config() -> Config {
    Config {
        protected_hardlinks: false,
        cache_bytes: Some(256 << 10),
        ..Config::default()
    }
}

// ----- snapshots --------------------------------------------------------------------------

/// One name in a tree, as a snapshot keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Ent {
    path: String,
    kind: char,
    mode: u32,
    nlink: u32,
    size: u64,
    /// Hash of a file's contents or a symlink's target.
    data: u64,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// The first path (in sorted order) naming the same inode: identity up to renumbering.
    group: String,
}

type Snap = Vec<Ent>;

fn hash_of<T: Hash>(t: &T) -> u64 {
    let mut h = DefaultHasher::new();
    t.hash(&mut h);
    h.finish()
}

/// What a walk found: the snapshot of the tree under its root, and for each inode its kind,
/// link count and the names found for it.
struct Walk {
    snap: Snap,
    inodes: HashMap<u64, (char, u32, u32)>,
    errs: Vec<String>,
    /// Per path: blocks, atime, mtime, ctime (compared only where they must be equal).
    times: BTreeMap<String, [(i64, u32); 4]>,
}

fn xattrs_of(c: &Client, ino: Ino) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let fs = c.fs();
    let names = fs.listxattr(c.ctx(), ino)?;
    let mut out = Vec::new();
    for n in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let v = fs.getxattr(c.ctx(), ino, n)?;
        out.push((n.to_vec(), v));
    }
    out.sort();
    Ok(out)
}

/// Walks the tree under `root` (which must stay still meanwhile). `parent` is the inode `..`
/// of `root` must name.
fn walk(c: &Client, root: &str) -> io::Result<Walk> {
    walk_roots(c, &[(root, "", None)])
}

/// The common directory, where each thread owns the names starting `t<j>_`.
const COMMON: &str = "/c";

/// A thread's own names: its directory, and its names in the common one (as `@c/<name>`).
fn own_walk(c: &Client, j: usize) -> io::Result<Walk> {
    let base = format!("/o{j}");
    let prefix = format!("t{j}_");
    walk_roots(c, &[(&base, "", None), (COMMON, "@c", Some(&prefix))])
}

/// Walks trees (which must stay still meanwhile): each root's path, the prefix its names
/// get, and the prefix of the names taken from it (then only those, and the directory
/// itself is not checked).
fn walk_roots(c: &Client, roots: &[(&str, &str, Option<&str>)]) -> io::Result<Walk> {
    let mut w = Walk {
        snap: Vec::new(),
        inodes: HashMap::new(),
        errs: Vec::new(),
        times: BTreeMap::new(),
    };
    let mut inos: Vec<u64> = Vec::new();
    for &(root, rel, filter) in roots {
        let parent = c.metadata(format!("{root}/.."))?.ino().0;
        walk_dir(c, root, rel, parent, filter, &mut w, &mut inos)?;
    }
    let root = roots[0].0;
    // Groups: the first path naming each inode.
    let mut order: Vec<usize> = (0..w.snap.len()).collect();
    order.sort_by(|&a, &b| w.snap[a].path.cmp(&w.snap[b].path));
    let mut first: HashMap<u64, String> = HashMap::new();
    for &i in &order {
        first
            .entry(inos[i])
            .or_insert_with(|| w.snap[i].path.clone());
    }
    for (i, e) in w.snap.iter_mut().enumerate() {
        e.group = first[&inos[i]].clone();
    }
    w.snap.sort();
    for (ino, (kind, nlink, names)) in &w.inodes {
        if *kind != 'd' && nlink != names {
            let paths: Vec<&str> = w
                .snap
                .iter()
                .filter(|e| e.group == first[ino])
                .map(|e| e.path.as_str())
                .collect();
            w.errs.push(format!(
                "inode {ino} ({kind}) has nlink {nlink} but {names} names: {paths:?} (under {root})"
            ));
        }
    }
    Ok(w)
}

fn walk_dir(
    c: &Client,
    abs: &str,
    rel: &str,
    parent: u64,
    filter: Option<&str>,
    w: &mut Walk,
    inos: &mut Vec<u64>,
) -> io::Result<()> {
    let me = c.symlink_metadata(abs)?;
    let dotdot = c.metadata(format!("{abs}/.."))?.ino().0;
    if dotdot != parent && filter.is_none() {
        w.errs.push(format!(
            "{abs}: `..` is inode {dotdot}, its parent is {parent}"
        ));
    }
    let mut subdirs = 0;
    let mut list = c.read_dir(abs)?;
    list.sort_by(|a, b| a.name.cmp(&b.name));
    for e in list {
        let name = String::from_utf8_lossy(&e.name).into_owned();
        if filter.is_some_and(|f| !name.starts_with(f)) {
            continue;
        }
        let p = format!("{abs}/{name}");
        let r = if rel.is_empty() {
            name.clone()
        } else {
            format!("{rel}/{name}")
        };
        let m = c.symlink_metadata(&p)?;
        if m.ino() != e.ino {
            w.errs.push(format!(
                "{p}: readdir says inode {}, lookup {}",
                e.ino.0,
                m.ino().0
            ));
        }
        if m.file_type() != e.kind {
            w.errs.push(format!(
                "{p}: readdir says {:?}, lookup {:?}",
                e.kind,
                m.file_type()
            ));
        }
        let kind = kind_char(m.file_type());
        let ino = m.ino().0;
        let ent = w.inodes.entry(ino).or_insert((kind, m.attr.nlink, 0));
        ent.2 += 1;
        if kind == 'd' && ent.2 > 1 {
            w.errs
                .push(format!("{p}: a second name for directory inode {ino}"));
        }
        let data = match kind {
            'f' => {
                let v = c.read(&p)?;
                let h = hash_of(&v);
                remember(h, v);
                h
            }
            'l' => hash_of(&c.read_link(&p)?),
            _ => 0,
        };
        let xattrs = if kind == 'l' {
            Vec::new()
        } else {
            xattrs_of(c, m.ino())?
        };
        w.snap.push(Ent {
            path: r.clone(),
            kind,
            mode: m.mode(),
            nlink: m.attr.nlink,
            size: if kind == 'l' { 0 } else { m.len() },
            data,
            xattrs,
            group: String::new(),
        });
        inos.push(ino);
        let a = &m.attr;
        w.times.insert(
            r.clone(),
            [
                (a.blocks as i64, 0),
                (a.atime.sec, a.atime.nsec),
                (a.mtime.sec, a.mtime.nsec),
                (a.ctime.sec, a.ctime.nsec),
            ],
        );
        if kind == 'd' {
            subdirs += 1;
            if filter.is_some() {
                w.errs
                    .push(format!("{p}: an own directory in the common one"));
            } else if w.inodes[&ino].2 == 1 {
                walk_dir(c, &p, &r, me.ino().0, None, w, inos)?;
            }
        }
    }
    if me.attr.nlink != 2 + subdirs && filter.is_none() {
        w.errs.push(format!(
            "{abs}: directory nlink {} but {subdirs} subdirectories",
            me.attr.nlink
        ));
    }
    Ok(())
}

/// Checks a quiescent filesystem whole: the engine's invariant check, and a walk from the
/// root in which every inode is reachable (no orphan left: no handle is open).
fn check_whole(c: &Client, orphans_allowed: bool) -> Result<Walk, Vec<String>> {
    let mut errs = Vec::new();
    let report = match c.fs().check_invariants() {
        Ok(r) => Some(r),
        Err(e) => {
            errs.push(format!("check_invariants: {e}"));
            None
        }
    };
    let w = match walk(c, "/") {
        Ok(w) => w,
        Err(e) => {
            errs.push(format!("walk from the root failed: {e}"));
            return Err(errs);
        }
    };
    errs.extend(w.errs.iter().cloned());
    if let Some(r) = report {
        // The walk counts every inode but the root.
        let reached = w.inodes.len() as u64 + 1;
        if r.inodes != reached && !(orphans_allowed && r.inodes > reached) {
            errs.push(format!(
                "{} inodes in the table, {reached} reachable from the root",
                r.inodes
            ));
        }
    }
    if errs.is_empty() { Ok(w) } else { Err(errs) }
}

/// Every file content a walk saw, by hash (for reports).
static CONTENTS: Mutex<Option<HashMap<u64, Vec<u8>>>> = Mutex::new(None);

fn remember(h: u64, v: Vec<u8>) {
    CONTENTS
        .lock()
        .unwrap()
        .get_or_insert_with(HashMap::new)
        .entry(h)
        .or_insert(v);
}

/// A content as runs: `offset:byte*len`.
fn runs(h: u64) -> String {
    let g = CONTENTS.lock().unwrap();
    let Some(v) = g.as_ref().and_then(|m| m.get(&h)) else {
        return "?".into();
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j < v.len() && v[j] == v[i] {
            j += 1;
        }
        out.push(format!("{i}:{:02x}*{}", v[i], j - i));
        i = j;
    }
    out.join(" ")
}

fn diff(a: &Snap, b: &Snap) -> String {
    let ma: BTreeMap<&str, &Ent> = a.iter().map(|e| (e.path.as_str(), e)).collect();
    let mb: BTreeMap<&str, &Ent> = b.iter().map(|e| (e.path.as_str(), e)).collect();
    let mut out = Vec::new();
    for (p, e) in &ma {
        match mb.get(p) {
            None => out.push(format!("  - {p} {e:?}")),
            Some(f) if f != e => {
                out.push(format!("  ~ {p}\n      {e:?}\n   -> {f:?}"));
                if e.kind == 'f' && f.kind == 'f' && e.data != f.data {
                    out.push(format!(
                        "      data {}\n   -> data {}",
                        runs(e.data),
                        runs(f.data)
                    ));
                }
            }
            _ => {}
        }
    }
    for (p, f) in &mb {
        if !ma.contains_key(p) {
            out.push(format!("  + {p} {f:?}"));
        }
    }
    if out.len() > 24 {
        let n = out.len();
        out.truncate(24);
        out.push(format!("  ... {} more", n - 24));
    }
    out.join("\n")
}

// ----- the race ---------------------------------------------------------------------------

/// One state of a thread's own directory.
struct State {
    /// The thread's attempt counter when the operation that made it began (0: the start).
    attempt: u64,
    hash: u64,
    /// How far each thread had got (its `done`) when the operation began.
    deps: Vec<u64>,
    what: String,
    snap: Snap,
}

/// A crash image and what was known when it was taken.
struct Image {
    disk: SimDisk,
    /// Per thread: the state index every sync that returned Ok before the image covers.
    acked: Vec<u64>,
    /// Per thread: attempts begun when the image was taken (read after it).
    attempts: Vec<u64>,
    how: String,
}

struct Shared {
    done: Vec<AtomicU64>,
    attempts: Vec<AtomicU64>,
    acked: Vec<AtomicU64>,
    images: Mutex<Vec<Image>>,
    max_images: usize,
    /// Images taken so far, per source (a flush, the crasher, after a sync).
    taken: [AtomicUsize; 4],
    stop: AtomicBool,
    /// The store is being closed: flushes take images more often.
    closing: AtomicBool,
    syncs_ok: AtomicU64,
    syncs_failed: AtomicU64,
    /// Reads of own files that failed (EIO) while the host was short of room.
    read_errors: AtomicU64,
    sync_errors: Mutex<Vec<String>>,
}

impl Shared {
    fn new(threads: usize, max_images: usize) -> Shared {
        let v = || (0..threads).map(|_| AtomicU64::new(0)).collect::<Vec<_>>();
        Shared {
            done: v(),
            attempts: v(),
            acked: v(),
            images: Mutex::new(Vec::new()),
            max_images,
            taken: [const { AtomicUsize::new(0) }; 4],
            stop: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            syncs_ok: AtomicU64::new(0),
            syncs_failed: AtomicU64::new(0),
            read_errors: AtomicU64::new(0),
            sync_errors: Mutex::new(Vec::new()),
        }
    }

    /// Takes a crash image of `disk` now, if fewer than the most were taken.
    fn capture(&self, disk: &SimDisk, source: usize, how: &str, pick: u64) {
        let most = match source {
            3 => 3,
            _ => self.max_images.div_ceil(3),
        };
        if self.taken[source].fetch_add(1, SeqCst) >= most {
            return;
        }
        let acked: Vec<u64> = self.acked.iter().map(|a| a.load(SeqCst)).collect();
        let mode = match pick % 4 {
            0 => Unflushed::Lost,
            1 => Unflushed::Kept,
            _ => Unflushed::Torn(pick),
        };
        let img = disk.crash(mode);
        let attempts: Vec<u64> = self.attempts.iter().map(|a| a.load(SeqCst)).collect();
        self.images.lock().unwrap().push(Image {
            disk: img,
            acked,
            attempts,
            how: format!("{how} ({mode:?})"),
        });
    }
}

const SHARED_DIRS: [&str; 6] = ["/s", "/s/p0", "/s/p1", "/s/p0/p2", "/s/p1/p3", "/c"];
const SHARED_NAMES: [&str; 9] = ["p0", "p1", "p2", "p3", "n0", "n1", "n2", "n3", "n4"];

fn shared_path(rng: &mut StdRng) -> String {
    format!(
        "{}/{}",
        SHARED_DIRS[rng.random_range(0..SHARED_DIRS.len())],
        SHARED_NAMES[rng.random_range(0..SHARED_NAMES.len())]
    )
}

fn bytes(rng: &mut StdRng, max: usize) -> Vec<u8> {
    let n = rng.random_range(1..=max);
    let b: u8 = rng.random();
    (0..n).map(|i| b.wrapping_add((i / 97) as u8)).collect()
}

/// One racing operation on shared names; what it did does not matter, only that it keeps
/// the tree consistent.
fn shared_op<'c>(c: &'c Client, rng: &mut StdRng, held: &mut Vec<lanefs::File<'c>>) {
    let p = shared_path(rng);
    let q = shared_path(rng);
    let _ = match rng.random_range(0..19) {
        // Reads: they move access times (records of their own) while others remove.
        15 | 16 => c.read(&p).map(drop),
        17 => c.read_dir(&p).map(drop),
        18 => c.open(&p, OpenOptions::new().read(true)).and_then(|f| {
            let mut b = [0u8; 100];
            f.read_at(&mut b, rng.random_range(0..5000))?;
            let _ = c.fs().getxattr(c.ctx(), f.ino(), b"user.s");
            held.push(f);
            Ok(())
        }),
        0 | 1 => c
            .open(&p, OpenOptions::new().write(true).create(true).mode(0o644))
            .and_then(|f| f.write_at(&bytes(rng, 5000), rng.random_range(0..5000)))
            .map(drop),
        2 | 3 => c.create_dir(&p),
        4 => c.remove_file(&p),
        5 => c.remove_dir(&p),
        6..=8 => {
            let flags = match rng.random_range(0..6) {
                0 => RENAME_NOREPLACE,
                1 | 2 => RENAME_EXCHANGE,
                3 => RENAME_WHITEOUT,
                _ => 0,
            };
            c.rename_with_flags(&p, &q, flags)
        }
        9 => c.hard_link(&p, &q),
        10 => c.symlink(SHARED_NAMES[rng.random_range(0..SHARED_NAMES.len())], &p),
        11 => c.truncate(&p, rng.random_range(0..9000)),
        12 => c.open(&p, OpenOptions::new().read(true)).and_then(|f| {
            let v = bytes(rng, 40);
            Ok(c.fs().setxattr(c.ctx(), f.ino(), b"user.s", &v, 0)?)
        }),
        13 => {
            // An open file whose names go: an orphan while held.
            match c.open(&p, OpenOptions::new().read(true).write(true)) {
                Ok(f) if f.metadata().is_ok_and(|m| m.is_file()) => {
                    let _ = c.remove_file(&p);
                    held.push(f);
                }
                _ => {}
            }
            Ok(())
        }
        _ => {
            if let Some(f) = held.last() {
                let _ = f.write_at(&bytes(rng, 3000), rng.random_range(0..6000));
            }
            if !held.is_empty() && rng.random_bool(0.5) {
                let i = rng.random_range(0..held.len());
                held.swap_remove(i);
            }
            Ok(())
        }
    };
}

/// One operation on the thread's own directory `base`, chosen from its current state
/// `snap`: `Some((what, result))` when one was tried (a success changes the state exactly
/// as one engine call), `None` when nothing fit.
#[allow(clippy::too_many_arguments)]
fn own_op<'c>(
    c: &'c Client,
    rng: &mut StdRng,
    base: &str,
    snap: &Snap,
    ctr: &mut u64,
    held: &mut Vec<lanefs::File<'c>>,
    shared: &Shared,
    me: usize,
) -> Option<(String, io::Result<()>)> {
    let abs = |rel: &str| {
        if rel.is_empty() {
            base.to_string()
        } else if let Some(name) = rel.strip_prefix("@c/") {
            format!("{COMMON}/{name}")
        } else {
            format!("{base}/{rel}")
        }
    };
    // Directories to make names in: the own one, its subdirectories, and the common one
    // (where no own directory goes).
    let subdirs: Vec<&str> = snap
        .iter()
        .filter(|e| e.kind == 'd')
        .map(|e| e.path.as_str())
        .collect();
    let mut dirs: Vec<&str> = vec!["", "@c"];
    dirs.extend(subdirs.iter().copied());
    let kind_of = |rel: &str| snap.iter().find(|e| e.path == rel).map(|e| e.kind);
    let in_common = |rel: &str| rel.starts_with("@c/");
    let files: Vec<&str> = snap
        .iter()
        .filter(|e| e.kind == 'f')
        .map(|e| e.path.as_str())
        .collect();
    let nondirs: Vec<&str> = snap
        .iter()
        .filter(|e| e.kind != 'd')
        .map(|e| e.path.as_str())
        .collect();
    let all: Vec<&str> = snap.iter().map(|e| e.path.as_str()).collect();
    let pick = |rng: &mut StdRng, v: &[&str]| -> Option<String> {
        (!v.is_empty()).then(|| v[rng.random_range(0..v.len())].to_string())
    };
    let mut fresh = |rng: &mut StdRng, dir: &str| -> String {
        // Mostly a new name; sometimes one that exists there (to replace, or to fail).
        let there: Vec<&str> = snap
            .iter()
            .filter(|e| {
                let parent = e.path.rsplit_once('/').map_or("", |(p, _)| p);
                parent == dir
            })
            .map(|e| e.path.as_str())
            .collect();
        if !there.is_empty() && rng.random_bool(0.3) {
            return there[rng.random_range(0..there.len())].to_string();
        }
        *ctr += 1;
        let name = if dir == "@c" {
            format!("t{me}_e{ctr}")
        } else {
            format!("e{ctr}")
        };
        if dir.is_empty() {
            name
        } else {
            format!("{dir}/{name}")
        }
    };
    let depth = |p: &str| {
        if p.is_empty() {
            0
        } else {
            p.matches('/').count() + 1
        }
    };
    let _ = &subdirs;
    // Marks the start of the attempt: an image taken after this may hold it.
    let begin = || {
        shared.attempts[me].fetch_add(1, SeqCst);
    };
    let op = rng.random_range(0..25);
    Some(match op {
        0 | 1 => {
            let d = pick(rng, &dirs)?;
            let p = fresh(rng, &d);
            begin();
            let r = c
                .open(
                    abs(&p),
                    OpenOptions::new().write(true).create_new(true).mode(0o644),
                )
                .map(drop);
            (format!("create {p}"), r)
        }
        2 | 3 => {
            let f = pick(rng, &files)?;
            // Now and then a write larger than a small segment (a record that gets a
            // segment of its own) or than a checkpoint's chunk of pages.
            let (data, off) = if rng.random_bool(0.015) {
                (bytes(rng, 200 << 10), rng.random_range(0..(64u64 << 10)))
            } else {
                (bytes(rng, 3000), rng.random_range(0..6000))
            };
            let h = c.open(abs(&f), OpenOptions::new().write(true)).ok()?;
            begin();
            let r = h.write_at(&data, off).map(drop);
            (format!("write {f} @{off}+{}", data.len()), r)
        }
        4 => {
            let f = pick(rng, &files)?;
            let size = rng.random_range(0..8000);
            begin();
            (format!("truncate {f} {size}"), c.truncate(abs(&f), size))
        }
        5 => {
            let f = pick(rng, &nondirs)?;
            begin();
            (format!("unlink {f}"), c.remove_file(abs(&f)))
        }
        6 => {
            let d = pick(rng, &dirs)?;
            if depth(&d) >= 3 || d == "@c" {
                return None;
            }
            let p = fresh(rng, &d);
            begin();
            (format!("mkdir {p}"), c.create_dir(abs(&p)))
        }
        7 => {
            let d = pick(rng, &subdirs)?;
            begin();
            (format!("rmdir {d}"), c.remove_dir(abs(&d)))
        }
        8..=10 => {
            let src = pick(rng, &all)?;
            let d = pick(rng, &dirs)?;
            let dst = fresh(rng, &d);
            let (flags, fname) = match rng.random_range(0..10) {
                0..=1 => (RENAME_NOREPLACE, "noreplace"),
                2..=4 => (RENAME_EXCHANGE, "exchange"),
                _ => (0, "plain"),
            };
            // No own directory goes to the common directory.
            if kind_of(&src) == Some('d') && in_common(&dst)
                || flags == RENAME_EXCHANGE && kind_of(&dst) == Some('d') && in_common(&src)
            {
                return None;
            }
            begin();
            (
                format!("rename({fname}) {src} -> {dst}"),
                c.rename_with_flags(abs(&src), abs(&dst), flags),
            )
        }
        11 => {
            let f = pick(rng, &files)?;
            let d = pick(rng, &dirs)?;
            let dst = fresh(rng, &d);
            begin();
            (
                format!("link {f} -> {dst}"),
                c.hard_link(abs(&f), abs(&dst)),
            )
        }
        12 => {
            let d = pick(rng, &dirs)?;
            let p = fresh(rng, &d);
            let target = format!("t{}", rng.random_range(0..1000));
            begin();
            (
                format!("symlink {p} -> {target}"),
                c.symlink(&target, abs(&p)),
            )
        }
        13 => {
            let mut targets: Vec<&str> = snap
                .iter()
                .filter(|e| e.kind != 'l')
                .map(|e| e.path.as_str())
                .collect();
            targets.push("");
            let t = pick(rng, &targets)?;
            if t.is_empty() {
                return None;
            }
            let ino = c.symlink_metadata(abs(&t)).ok()?.ino();
            let name = format!("user.{}", ["a", "b", "c"][rng.random_range(0..3)]);
            let fs = c.fs();
            begin();
            if rng.random_bool(0.25) {
                let r = fs.removexattr(c.ctx(), ino, name.as_bytes());
                (format!("removexattr {t} {name}"), r.map_err(Into::into))
            } else {
                let v = bytes(rng, 64);
                let flags = [0, 0, XATTR_CREATE, XATTR_REPLACE][rng.random_range(0..4)];
                let r = fs.setxattr(c.ctx(), ino, name.as_bytes(), &v, flags);
                (
                    format!("setxattr {t} {name} flags {flags}"),
                    r.map_err(Into::into),
                )
            }
        }
        14 => {
            // A tmpfile, written, then given a name: the name shows it whole.
            let d = pick(rng, &dirs)?;
            let dst = fresh(rng, &d);
            let f = c
                .open_tmpfile(
                    abs(&d),
                    OpenOptions::new().read(true).write(true).mode(0o640),
                )
                .ok()?;
            let data = bytes(rng, 5000);
            f.write_at(&data, rng.random_range(0..3000)).ok()?;
            let _ = c
                .fs()
                .setxattr(c.ctx(), f.ino(), b"user.t", &data[..data.len().min(20)], 0);
            begin();
            (format!("link tmpfile -> {dst}"), c.link_file(&f, abs(&dst)))
        }
        16 => {
            let mut targets: Vec<&str> = snap
                .iter()
                .filter(|e| e.kind == 'f' || e.kind == 'd')
                .map(|e| e.path.as_str())
                .collect();
            targets.retain(|t| !t.is_empty());
            let t = pick(rng, &targets)?;
            let mode = [0o600, 0o640, 0o644, 0o700, 0o755, 0o777, 0o1777][rng.random_range(0..7)];
            begin();
            (
                format!("chmod {t} {mode:o}"),
                c.set_permissions(abs(&t), mode),
            )
        }
        17 => {
            let f = pick(rng, &files)?;
            let h = c.open(abs(&f), OpenOptions::new().write(true)).ok()?;
            let off = rng.random_range(0..9000);
            let len = rng.random_range(1..6000);
            let mode = [
                0,
                lanefs::FALLOC_FL_KEEP_SIZE,
                lanefs::FALLOC_FL_PUNCH_HOLE | lanefs::FALLOC_FL_KEEP_SIZE,
                lanefs::FALLOC_FL_PUNCH_HOLE | lanefs::FALLOC_FL_KEEP_SIZE,
            ][rng.random_range(0..4)];
            begin();
            let r = c
                .fs()
                .fallocate(c.ctx(), h.handle(), mode, off, len)
                .map_err(Into::into);
            (format!("fallocate {f} mode {mode} @{off}+{len}"), r)
        }
        18 => {
            // A write through a file kept open after one of its names went, while it has
            // another: visible, so an own op.
            let linked: Vec<usize> = (0..held.len())
                .filter(|&i| held[i].metadata().is_ok_and(|m| m.attr.nlink > 0))
                .collect();
            if linked.is_empty() {
                return None;
            }
            let i = linked[rng.random_range(0..linked.len())];
            let data = bytes(rng, 3000);
            let off = rng.random_range(0..6000);
            begin();
            let r = held[i].write_at(&data, off).map(drop);
            (
                format!("write held (ino {}) @{off}+{}", held[i].ino().0, data.len()),
                r,
            )
        }
        19 => {
            // Keep an own file open (nothing visible changes): a later rename over it or
            // unlink of its last name leaves it an orphan until it is closed.
            let f = pick(rng, &files)?;
            if let Ok(h) = c.open(abs(&f), OpenOptions::new().read(true).write(true)) {
                held.push(h);
            }
            return None;
        }
        20 => {
            // A tmpfile kept open and written to (nothing visible), named later (21).
            let d = pick(rng, &dirs)?;
            if let Ok(f) = c.open_tmpfile(
                abs(&d),
                OpenOptions::new().read(true).write(true).mode(0o604),
            ) {
                let _ = f.write_at(&bytes(rng, 5000), rng.random_range(0..5000));
                held.push(f);
            }
            return None;
        }
        21 => {
            // Name a held file that has no name: a tmpfile gets its first; an unlinked file
            // is refused (ENOENT).
            let nameless: Vec<usize> = (0..held.len())
                .filter(|&i| held[i].metadata().is_ok_and(|m| m.attr.nlink == 0))
                .collect();
            if nameless.is_empty() {
                return None;
            }
            let i = nameless[rng.random_range(0..nameless.len())];
            let d = pick(rng, &dirs)?;
            let dst = fresh(rng, &d);
            begin();
            let r = c.link_file(&held[i], abs(&dst));
            (format!("link held (ino {}) -> {dst}", held[i].ino().0), r)
        }
        22 => {
            let d = pick(rng, &dirs)?;
            let p = fresh(rng, &d);
            begin();
            (
                format!("mkfifo {p}"),
                c.mknod(abs(&p), libc::S_IFIFO | 0o644, 0),
            )
        }
        23 => {
            let src = pick(rng, &all)?;
            let d = pick(rng, &dirs)?;
            let dst = fresh(rng, &d);
            if kind_of(&src) == Some('d') && in_common(&dst) {
                return None;
            }
            begin();
            (
                format!("rename(whiteout) {src} -> {dst}"),
                c.rename_with_flags(abs(&src), abs(&dst), RENAME_WHITEOUT),
            )
        }
        _ => {
            // Unlink an open file and keep it open: an orphan, written to later.
            let f = pick(rng, &files)?;
            let h = c
                .open(abs(&f), OpenOptions::new().read(true).write(true))
                .ok()?;
            begin();
            let r = c.remove_file(abs(&f));
            held.push(h);
            (format!("unlink open {f}"), r)
        }
    })
}

/// What a race left: per thread, its states in order.
struct Raced {
    states: Vec<Vec<State>>,
    own_ops: u64,
}

struct RaceParams {
    threads: usize,
    secs: f64,
    /// Take crash images (a crasher thread, a hook at flushes, after syncs).
    images: bool,
    max_images: usize,
    max_ops: u64,
    /// The host runs out of room at random moments, for a moment (ENOSPC).
    space_pressure: bool,
}

/// Runs the race on an open store whose tree was set up.
fn race(
    fs: &Arc<Filesystem>,
    store: &lanefs_store::StoreHandle,
    disk: &SimDisk,
    p: &RaceParams,
    seed: u64,
    shared: &Arc<Shared>,
) -> Raced {
    let n = p.threads;
    let c0 = Client::root(fs.clone());
    // The starting states.
    let mut starts = Vec::new();
    for j in 0..n {
        let w = own_walk(&c0, j).expect("walk own names");
        assert!(w.errs.is_empty(), "start of thread {j}: {:?}", w.errs);
        starts.push(State {
            attempt: 0,
            hash: hash_of(&w.snap),
            deps: vec![0; n],
            what: "start".into(),
            snap: w.snap,
        });
    }
    if p.images {
        let sh = shared.clone();
        let hook_rng = Mutex::new(StdRng::seed_from_u64(seed ^ 0x5eed));
        disk.on_sync(move |d, at| {
            let mut r = hook_rng.lock().unwrap();
            if sh.closing.load(SeqCst) {
                if r.random_bool(0.4) {
                    let pick = r.random();
                    drop(r);
                    sh.capture(d, 3, &format!("at a flush while closing, {at:?}"), pick);
                }
            } else if r.random_bool(0.006) {
                let pick = r.random();
                drop(r);
                sh.capture(d, 0, &format!("at a flush, {at:?}"), pick);
            }
        });
    }
    let deadline = Instant::now() + Duration::from_secs_f64(p.secs);
    let states: Vec<Vec<State>> = std::thread::scope(|s| {
        // The checkpointer, asked at random.
        s.spawn(|| {
            let mut rng = StdRng::seed_from_u64(seed ^ 0xc0ffee);
            while !shared.stop.load(SeqCst) {
                std::thread::sleep(Duration::from_millis(rng.random_range(5..80)));
                if let Err(e) = store.checkpoint()
                    && !p.space_pressure
                {
                    shared
                        .sync_errors
                        .lock()
                        .unwrap()
                        .push(format!("a checkpoint failed: {e}"));
                }
            }
        });
        if p.space_pressure {
            s.spawn(|| {
                let mut rng = StdRng::seed_from_u64(seed ^ 0x5bace);
                while !shared.stop.load(SeqCst) {
                    std::thread::sleep(Duration::from_millis(rng.random_range(10..200)));
                    let room = rng.random_range(0..(128u64 << 10));
                    disk.set_space(Some(disk.used() + room));
                    std::thread::sleep(Duration::from_millis(rng.random_range(5..300)));
                    disk.set_space(None);
                }
            });
        }
        if p.images {
            s.spawn(|| {
                let mut rng = StdRng::seed_from_u64(seed ^ 0xdead);
                while !shared.stop.load(SeqCst) {
                    let gap = 2000.0 * p.secs / (p.max_images as f64 / 3.0 + 1.0);
                    std::thread::sleep(Duration::from_millis(rng.random_range(1..=gap as u64)));
                    shared.capture(disk, 1, "during the race", rng.random());
                }
            });
        }
        let workers: Vec<_> = starts
            .into_iter()
            .enumerate()
            .map(|(j, start)| {
                let fs = fs.clone();
                let shared = shared.clone();
                s.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(seed.wrapping_add(1 + j as u64 * 7919));
                    let c = Client::root(fs.clone());
                    let base = format!("/o{j}");
                    let mut held: Vec<lanefs::File<'_>> = Vec::new();
                    let mut held_shared: Vec<lanefs::File<'_>> = Vec::new();
                    let mut states = vec![start];
                    let mut ctr = 0u64;
                    let mut ops = 0u64;
                    while Instant::now() < deadline && ops < p.max_ops {
                        let roll = rng.random_range(0..100);
                        if roll < 50 {
                            let deps: Vec<u64> =
                                shared.done.iter().map(|d| d.load(SeqCst)).collect();
                            let cur = &states.last().unwrap().snap;
                            let Some((what, r)) =
                                own_op(&c, &mut rng, &base, cur, &mut ctr, &mut held, &shared, j)
                            else {
                                continue;
                            };
                            ops += 1;
                            let attempt = shared.attempts[j].load(SeqCst);
                            if r.is_ok() {
                                // A read the host did not fail must not fail; if one
                                // does, say so and look again (the state is still there).
                                let mut tries = 0;
                                let w = loop {
                                    match own_walk(&c, j) {
                                        Ok(w) => break w,
                                        Err(e) if tries < 100 => {
                                            tries += 1;
                                            if tries == 1 && p.space_pressure {
                                                // Reads may fail (EIO) while a reopen of
                                                // the checkpoint fails for lack of room;
                                                // counted (the focused test is
                                                // `a_page_read_meeting_a_failed_\
                                                // checkpoint_waits_for_the_reopen`).
                                                shared.read_errors.fetch_add(1, SeqCst);
                                            } else if tries == 1 {
                                                shared.sync_errors.lock().unwrap().push(format!(
                                                    "thread {j}: reading its own files after \
                                                     `{what}` failed: {e}"
                                                ));
                                            }
                                            std::thread::sleep(Duration::from_millis(50));
                                        }
                                        Err(e) => panic!("thread {j}: walk: {e}"),
                                    }
                                };
                                states.push(State {
                                    attempt,
                                    hash: hash_of(&w.snap),
                                    deps,
                                    what,
                                    snap: w.snap,
                                });
                                shared.done[j].store(states.len() as u64 - 1, SeqCst);
                            }
                        } else if roll < 93 {
                            shared_op(&c, &mut rng, &mut held_shared);
                        } else if roll < 96 {
                            // Orphans: written to, or closed (freed).
                            if !held.is_empty() {
                                let i = rng.random_range(0..held.len());
                                // Only a file with no name left is an orphan: one that kept
                                // another name is visible, and its writes would be own ops.
                                let orphan = held[i].metadata().is_ok_and(|m| m.attr.nlink == 0);
                                if orphan && rng.random_bool(0.6) {
                                    let _ = held[i].write_at(
                                        &bytes(&mut rng, 3000),
                                        rng.random_range(0..5000),
                                    );
                                } else {
                                    held.swap_remove(i);
                                }
                            }
                        } else {
                            let before: Vec<u64> =
                                shared.done.iter().map(|d| d.load(SeqCst)).collect();
                            let how = rng.random_range(0..5);
                            let r: lanefs::Result<()> = match how {
                                0 => store.sync(),
                                1 => fs.sync_all(),
                                2 => match held.last() {
                                    Some(f) => f.sync_all().map_err(|e| {
                                        lanefs::Errno(e.raw_os_error().unwrap_or(libc::EIO))
                                    }),
                                    None => fs.sync_all(),
                                },
                                3 => match c.metadata(&base) {
                                    Ok(m) => fs.fsync_inode(m.ino(), rng.random_bool(0.5)),
                                    Err(_) => fs.sync_all(),
                                },
                                _ => match c.metadata(&base) {
                                    // The asynchronous fsync the mount uses.
                                    Ok(m) => {
                                        let (tx, rx) = std::sync::mpsc::channel();
                                        fs.fsync_inode_then(
                                            m.ino(),
                                            true,
                                            Box::new(move |r| {
                                                let _ = tx.send(r);
                                            }),
                                        );
                                        rx.recv().unwrap_or(Err(lanefs::Errno::EIO))
                                    }
                                    Err(_) => fs.sync_all(),
                                },
                            };
                            match r {
                                Ok(()) => {
                                    shared.syncs_ok.fetch_add(1, SeqCst);
                                    for (i, b) in before.iter().enumerate() {
                                        shared.acked[i].fetch_max(*b, SeqCst);
                                    }
                                    if p.images && rng.random_bool(0.03) {
                                        shared.capture(
                                            disk,
                                            2,
                                            "right after a sync returned",
                                            rng.random(),
                                        );
                                    }
                                }
                                Err(e) if e == lanefs::Errno::ENOSPC && p.space_pressure => {
                                    shared.syncs_failed.fetch_add(1, SeqCst);
                                }
                                Err(e) => {
                                    shared.syncs_failed.fetch_add(1, SeqCst);
                                    shared
                                        .sync_errors
                                        .lock()
                                        .unwrap()
                                        .push(format!("thread {j}: sync ({how}) failed: {e:?}"));
                                }
                            }
                        }
                    }
                    drop(held);
                    drop(held_shared);
                    states
                })
            })
            .collect();
        let states = workers.into_iter().map(|w| w.join().unwrap()).collect();
        shared.stop.store(true, SeqCst);
        states
    });
    let own_ops = states.iter().map(|s| s.len() as u64 - 1).sum();
    let common: usize = states
        .iter()
        .map(|s| s.iter().filter(|s| s.what.contains("@c")).count())
        .sum();
    eprintln!("  {own_ops} own ops, {common} of them on names in {COMMON}");
    Raced { states, own_ops }
}

/// Makes the tree the race starts from, and syncs it.
fn setup(c: &Client, threads: usize, rng: &mut StdRng) {
    for d in ["/s", "/s/p0", "/s/p1", COMMON] {
        c.create_dir(d).unwrap();
    }
    for j in 0..threads {
        let b = format!("/o{j}");
        c.create_dir(&b).unwrap();
        c.create_dir(format!("{b}/d0")).unwrap();
        c.write(format!("{b}/f0"), bytes(rng, 3000)).unwrap();
        c.write(format!("{b}/d0/f1"), bytes(rng, 3000)).unwrap();
        c.hard_link(format!("{b}/f0"), format!("{b}/d0/h0"))
            .unwrap();
        c.symlink("f0", format!("{b}/l0")).unwrap();
        c.write(format!("{COMMON}/t{j}_c0"), bytes(rng, 2000))
            .unwrap();
    }
    c.fs().sync_all().unwrap();
}

thread_local! {
    /// What the images recovered to, over a test: images opened, with a checkpoint, with a
    /// torn tail dropped; records replayed; threads found past their acknowledged state.
    /// Kept per test thread (`verify` runs on it), so that tests run side by side do not mix.
    static STATS: [std::cell::Cell<u64>; 5] = const { [const { std::cell::Cell::new(0) }; 5] };
}

fn stat(i: usize, n: u64) {
    STATS.with(|s| s[i].set(s[i].get() + n));
}

fn stats() -> String {
    let v: Vec<u64> = STATS.with(|s| s.iter().map(|a| a.get()).collect());
    format!(
        "{} images opened, {} from a checkpoint, {} with a torn tail, {} records replayed, \
         {} thread states past the acknowledged one",
        v[0], v[1], v[2], v[3], v[4]
    )
}

/// Checks one crash image (see the module doc); returns what was wrong. With `nested`,
/// power cuts are also taken at flushes while the image recovers and is read (its
/// recovery's own writes: freed orphans, zeros after a torn end, spares), and each of those
/// images must hold what this one must.
fn verify(img: &Image, states: &[Vec<State>], nested: bool, seed: u64) -> Vec<String> {
    let n = states.len();
    let mut errs = Vec::new();
    let dir = Path::new(STORE);
    if let Err(e) = fsck::check(dir, &options(&img.disk)) {
        errs.push(format!("fsck: {e}"));
    }
    let subs: Arc<Mutex<Vec<Image>>> = Arc::default();
    if nested {
        let subs = subs.clone();
        let mut r = StdRng::seed_from_u64(seed);
        let (acked, attempts) = (img.acked.clone(), img.attempts.clone());
        img.disk.on_sync(move |d, at| {
            let mut subs = subs.lock().unwrap();
            if subs.len() < 2 && r.random_bool(0.3) {
                let pick: u64 = r.random();
                let mode = match pick % 3 {
                    0 => Unflushed::Lost,
                    _ => Unflushed::Torn(pick),
                };
                subs.push(Image {
                    disk: d.crash(mode),
                    acked: acked.clone(),
                    attempts: attempts.clone(),
                    how: format!("while recovering, at a flush, {at:?} ({mode:?})"),
                });
            }
        });
    }
    let o = match open(dir, config(), options(&img.disk)) {
        Ok(o) => o,
        Err(e) => {
            errs.push(format!("open failed: {e}"));
            return errs;
        }
    };
    stat(0, 1);
    stat(1, (o.report.checkpoint_lsn > 0) as u64);
    stat(2, o.report.torn_tail as u64);
    stat(3, o.report.replayed);
    let fs = Arc::new(o.fs);
    let c = Client::root(fs.clone());
    if let Err(e) = check_whole(&c, false) {
        errs.extend(e);
    }
    // Per thread: the candidate states its directory matches.
    let mut cands: Vec<Vec<usize>> = Vec::new();
    #[allow(clippy::needless_range_loop)]
    for j in 0..n {
        let base = format!("/o{j}");
        let w = match own_walk(&c, j) {
            Ok(w) => w,
            Err(e) => {
                errs.push(format!("thread {j}: walk of {base} failed: {e}"));
                cands.push(Vec::new());
                continue;
            }
        };
        let h = hash_of(&w.snap);
        let acked = img.acked[j] as usize;
        let cand: Vec<usize> = states[j]
            .iter()
            .enumerate()
            .filter(|(_, s)| s.hash == h && s.attempt <= img.attempts[j])
            .map(|(k, _)| k)
            .collect();
        let hist = &states[j];
        if cand.is_empty() {
            // The closest state, for the report.
            let later: Vec<usize> = hist
                .iter()
                .enumerate()
                .filter(|(_, s)| s.hash == h)
                .map(|(k, _)| k)
                .collect();
            let k = acked.min(hist.len() - 1);
            let bound = hist
                .iter()
                .rposition(|s| s.attempt <= img.attempts[j])
                .unwrap_or(0);
            let closest = (0..=bound)
                .min_by_key(|&k| {
                    let d = diff(&hist[k].snap, &w.snap);
                    (d.lines().count(), bound - k)
                })
                .unwrap();
            let around: Vec<String> = (closest.saturating_sub(3)
                ..=(closest + 3).min(hist.len() - 1))
                .map(|k| format!("#{k} (attempt {}) {}", hist[k].attempt, hist[k].what))
                .collect();
            errs.push(format!(
                "thread {j}: closest state #{closest} (last possible #{bound}); ops around: \n    {}\n  diff from it:\n{}",
                around.join("\n    "),
                diff(&hist[closest].snap, &w.snap)
            ));
            errs.push(format!(
                "thread {j}: {base} matches none of its states up to attempt {} (states {} \
                 begun later match: {later:?}); acked state {acked} ({}), diff from it:\n{}",
                img.attempts[j],
                hist.len(),
                hist[k].what,
                diff(&hist[k].snap, &w.snap)
            ));
        } else if *cand.last().unwrap() < acked {
            let got = *cand.last().unwrap();
            let lost: Vec<String> = (got + 1..=acked.min(hist.len() - 1))
                .take(8)
                .map(|k| format!("#{k} {}", hist[k].what))
                .collect();
            errs.push(format!(
                "thread {j}: acknowledged state {acked} lost: recovered state is #{got} ({}), \
                 lost ops {lost:?}; diff from acked:\n{}",
                hist[got].what,
                diff(&hist[acked.min(hist.len() - 1)].snap, &w.snap)
            ));
        }
        if cand.last().is_some_and(|&k| k > acked) {
            stat(4, 1);
        }
        cands.push(cand);
    }
    // Prefix across threads.
    for j in 0..n {
        let Some(&kj) = cands[j]
            .iter()
            .find(|&&k| k >= img.acked[j] as usize)
            .or(cands[j].last())
        else {
            continue;
        };
        for i in 0..n {
            if i == j || cands[i].is_empty() {
                continue;
            }
            let need = states[j][kj].deps[i] as usize;
            let have = *cands[i].last().unwrap();
            if need > have {
                errs.push(format!(
                    "thread {j}'s op #{kj} ({}) recovered, but thread {i} is at #{have} ({}) \
                     though its op #{need} ({}) completed before #{kj} began",
                    states[j][kj].what, states[i][have].what, states[i][need].what
                ));
            }
        }
    }
    drop(c);
    drop(fs);
    if let Err(e) = o.store.close() {
        errs.push(format!("close after recovery: {e:?}"));
    }
    img.disk.clear_hook();
    let subs = std::mem::take(&mut *subs.lock().unwrap());
    for (k, sub) in subs.iter().enumerate() {
        let e = verify(sub, states, false, seed);
        if !e.is_empty() {
            errs.push(format!(
                "an image taken {} (nested {k}):\n    {}",
                sub.how,
                e.join("\n    ")
            ));
        }
    }
    errs
}

fn secs() -> f64 {
    std::env::var("POWER_CUTS_DURING_RACES_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0)
}

/// Power cuts during a race, at flushes and right after syncs; each image is recovered and
/// checked, and one of them carries the next generation of the race (recovery of a store
/// that recovered before).
#[test]
fn power_cuts_during_a_race_keep_acknowledged_prefixes() {
    let seed = seed::seed("power_cuts_during_a_race_keep_acknowledged_prefixes");
    power_cut_generations(
        seed,
        false,
        env_u64("POWER_CUTS_DURING_RACES_GENS").unwrap_or(3),
    );
}

/// The same, while the host runs out of room now and then (records held, changes refused
/// with ENOSPC, syncs failing with it, checkpoints failing): a sync that returns Ok still
/// made everything before it durable, and nothing refused shows.
#[test]
fn power_cuts_while_the_host_fills_keep_acknowledged_prefixes() {
    let seed = seed::seed("power_cuts_while_the_host_fills_keep_acknowledged_prefixes");
    power_cut_generations(
        seed,
        true,
        env_u64("POWER_CUTS_DURING_RACES_GENS").unwrap_or(3).min(2),
    );
}

fn power_cut_generations(seed: u64, space_pressure: bool, gens: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    set_knobs(&mut rng);
    let threads = rng.random_range(4..=7);
    let params = RaceParams {
        threads,
        secs: secs(),
        images: true,
        max_images: 24,
        max_ops: 4000,
        space_pressure,
    };
    let mut disk = SimDisk::new();
    let mut failures: Vec<String> = Vec::new();
    let mut checked = 0;
    let t0 = Instant::now();
    for g in 0..gens {
        let o = open(Path::new(STORE), config(), options(&disk)).expect("open");
        let fs = Arc::new(o.fs);
        let c = Client::root(fs.clone());
        if g == 0 {
            setup(&c, threads, &mut rng);
        } else {
            // What the image recovered to is the start; make it durable so that the
            // acknowledgements start from it.
            fs.sync_all().unwrap();
        }
        let shared = Arc::new(Shared::new(threads, params.max_images));
        let raced = race(&fs, &o.store, &disk, &params, seed ^ g, &shared);
        // The live tree after the race.
        match check_whole(&c, false) {
            Ok(_) => {}
            Err(e) => failures.push(format!("gen {g}: live tree after the race: {e:?}")),
        }
        for (j, st) in raced.states.iter().enumerate() {
            let w = own_walk(&c, j).unwrap();
            if w.snap != st.last().unwrap().snap {
                failures.push(format!(
                    "gen {g}: thread {j}'s live directory differs from its last state:\n{}",
                    diff(&st.last().unwrap().snap, &w.snap)
                ));
            }
        }
        failures.extend(shared.sync_errors.lock().unwrap().drain(..));
        drop(c);
        drop(fs);
        shared.closing.store(true, SeqCst);
        o.store.close().expect("close");
        disk.clear_hook();
        let images = std::mem::take(&mut *shared.images.lock().unwrap());
        eprintln!(
            "gen {g}: {threads} threads, {} own ops, {} syncs ok, {} failed, {} reads of own \
             files failed (EIO), {} images, {} KiB on disk, {:.1}s",
            raced.own_ops,
            shared.syncs_ok.load(SeqCst),
            shared.syncs_failed.load(SeqCst),
            shared.read_errors.load(SeqCst),
            images.len(),
            disk.used() >> 10,
            t0.elapsed().as_secs_f64()
        );
        let mut next: Option<SimDisk> = None;
        let mut nimg = 0usize;
        for (k, img) in images.iter().enumerate() {
            let errs = verify(img, &raced.states, true, seed ^ (k as u64) << 8 ^ g);
            checked += 1;
            if errs.is_empty() {
                nimg += 1;
                if next.is_none() || rng.random_bool(0.3) {
                    next = Some(img.disk.clone());
                }
            } else {
                failures.push(format!(
                    "gen {g} image {k} taken {}, acked {:?}, attempts {:?}:\n  {}",
                    img.how,
                    img.acked,
                    img.attempts,
                    errs.join("\n  ")
                ));
            }
        }
        eprintln!(
            "gen {g}: {nimg}/{} images recovered correctly",
            images.len()
        );
        match next {
            Some(d) => disk = d,
            None => break,
        }
    }
    eprintln!(
        "{checked} images checked in {:.1}s, {} failures; {}",
        t0.elapsed().as_secs_f64(),
        failures.len(),
        stats()
    );
    no_failures(seed, &failures);
}

/// Fails with every failure found, and the seed that replays them.
fn no_failures(seed: u64, failures: &[String]) {
    assert!(
        failures.is_empty(),
        "seed {seed}: {} failures:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// A clean close after a race: the reopened tree equals the live one exactly (names,
/// identity of inodes up to renumbering, modes, sizes, contents, xattrs, link counts), and
/// so does the image a power cut right after the close leaves.
#[test]
fn a_clean_close_after_a_race_reopens_the_same_tree() {
    let seed = seed::seed("a_clean_close_after_a_race_reopens_the_same_tree");
    let mut rng = StdRng::seed_from_u64(seed);
    set_knobs(&mut rng);
    let threads = rng.random_range(4..=8);
    let params = RaceParams {
        threads,
        secs: secs(),
        images: false,
        max_images: 0,
        max_ops: 4000,
        space_pressure: false,
    };
    let disk = SimDisk::new();
    let mut failures = Vec::new();
    for round in 0..2 {
        let o = open(Path::new(STORE), config(), options(&disk)).expect("open");
        let fs = Arc::new(o.fs);
        let c = Client::root(fs.clone());
        if round == 0 {
            setup(&c, threads, &mut rng);
        }
        let shared = Arc::new(Shared::new(threads, 0));
        let raced = race(&fs, &o.store, &disk, &params, seed ^ round, &shared);
        let live = match check_whole(&c, false) {
            Ok(w) => w.snap,
            Err(e) => {
                failures.push(format!("round {round}: live tree: {e:?}"));
                walk(&c, "/").unwrap().snap
            }
        };
        // A second walk: the first one's reads moved access times.
        let live_times = walk(&c, "/").unwrap().times;
        failures.extend(shared.sync_errors.lock().unwrap().drain(..));
        drop(c);
        drop(fs);
        o.store.close().expect("close");
        eprintln!(
            "round {round}: {threads} threads, {} own ops, {} entries",
            raced.own_ops,
            live.len()
        );
        let lost = disk.crash(Unflushed::Lost);
        for (what, d) in [("reopened", disk.clone()), ("power cut after close", lost)] {
            match open(Path::new(STORE), config(), options(&d)) {
                Ok(o2) => {
                    let fs2 = Arc::new(o2.fs);
                    let c2 = Client::root(fs2.clone());
                    match check_whole(&c2, false) {
                        Ok(w) if w.snap == live => {
                            let bad: Vec<String> = live_times
                                .iter()
                                .filter(|(p, t)| w.times.get(*p) != Some(t))
                                .take(10)
                                .map(|(p, t)| format!("{p}: live {t:?}, now {:?}", w.times.get(p)))
                                .collect();
                            if !bad.is_empty() {
                                failures.push(format!(
                                    "round {round}: {what}: blocks or times differ \
                                     ([blocks, atime, mtime, ctime]):\n  {}",
                                    bad.join("\n  ")
                                ));
                            }
                        }
                        Ok(w) => failures.push(format!(
                            "round {round}: {what}: tree differs from the live one:\n{}",
                            diff(&live, &w.snap)
                        )),
                        Err(e) => failures.push(format!("round {round}: {what}: {e:?}")),
                    }
                    drop(c2);
                    drop(fs2);
                    o2.store.close().unwrap();
                }
                Err(e) => failures.push(format!("round {round}: {what}: open failed: {e}")),
            }
        }
        if let Err(e) = fsck::check(Path::new(STORE), &options(&disk)) {
            failures.push(format!("round {round}: fsck: {e}"));
        }
    }
    no_failures(seed, &failures);
}

/// Found by `power_cuts_while_the_host_fills_keep_acknowledged_prefixes` (reads of own
/// files failing with EIO while checkpoints failed for lack of room), reduced: a page read
/// that meets redb's refusal after a checkpoint's transaction failed must wait for the
/// reopened database and read from it (docs/STORE.md, "Memory": "a read of pages out of
/// memory meanwhile (or one that meets redb's refusal while the checkpoint is still
/// writing) waits for the reopened database, up to 2 s, and reads from it; only if the
/// reopen fails do such reads fail with EIO"). No read may fail but in a round whose reopen
/// failed too (the host still short of room): before 7d29bc9 a reader that met the error
/// held the broken `Database` while it waited, the reopen (`Checkpoint::close_db`) waited
/// for every holder to let it go, and the read waited out its 2 s and failed with EIO
/// although the reopen then succeeded (5 of 5 runs on 578c7b6).
#[test]
fn a_page_read_meeting_a_failed_checkpoint_waits_for_the_reopen() {
    let disk = SimDisk::new();
    let opts = || Options {
        segment_size: 1 << 20,
        checkpoint_records: u64::MAX,
        checkpoint_segments: 1000,
        journal_segments: 1000,
        checkpoint_changed: 1 << 30,
        checkpoint_poll: Duration::from_secs(3600),
        ..options(&disk)
    };
    let o = open(Path::new(STORE), config(), opts()).expect("open");
    let fs = Arc::new(o.fs);
    let c = Client::root(fs.clone());
    let files: Vec<String> = (0..32).map(|i| format!("/f{i}")).collect();
    for (i, f) in files.iter().enumerate() {
        c.write(f, vec![i as u8 + 1; 16 << 10]).unwrap();
    }
    fs.sync_all().unwrap();
    o.store.checkpoint().expect("a first checkpoint");
    fs.evict();
    let stop = AtomicBool::new(false);
    // Reads that failed, with the round they began in.
    let failed: Mutex<Vec<(u64, String)>> = Mutex::new(Vec::new());
    let round_now = AtomicU64::new(0);
    // Rounds whose reopen failed (the host still short of room): reads may fail then.
    let mut excused: Vec<u64> = Vec::new();
    let mut checkpoints_failed = 0;
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for r in 0..2 {
            let (c, files, stop, failed, round_now) = (&c, &files, &stop, &failed, &round_now);
            s.spawn(move || {
                while !stop.load(SeqCst) {
                    for (i, f) in files.iter().enumerate().skip(r) {
                        let t = Instant::now();
                        let round = round_now.load(SeqCst);
                        match c.read(f) {
                            Ok(v) => assert!(v.iter().all(|&b| b == i as u8 + 1), "{f}"),
                            Err(e) => failed.lock().unwrap().push((
                                round,
                                format!("read of {f} failed after {:?}: {e}", t.elapsed()),
                            )),
                        }
                    }
                }
            });
        }
        // The readers stop however this ends (a panic below included).
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, SeqCst);
            }
        }
        let _stop = Stop(&stop);
        for round in 0..40 {
            round_now.store(round, SeqCst);
            let unexcused = failed
                .lock()
                .unwrap()
                .iter()
                .any(|(r, _)| !excused.contains(r));
            if unexcused || t0.elapsed() > Duration::from_secs(12) {
                break;
            }
            // Something for the checkpoint to apply, more than the host has room for: new
            // pages each round, so that redb cannot reuse the room of pages it freed.
            // (The journal may still be short of room from the last round for a moment.)
            let mut tries = 0;
            while c
                .write(format!("/big{round}"), vec![round as u8; 128 << 10])
                .and_then(|()| Ok(fs.sync_all()?))
                .is_err()
            {
                tries += 1;
                assert!(tries < 500, "the store never took a write again");
                std::thread::sleep(Duration::from_millis(10));
            }
            disk.set_space(Some(disk.used() + (16 << 10)));
            let t = Instant::now();
            if let Err(e) = o.store.checkpoint().map_err(|e| e.to_string()) {
                checkpoints_failed += 1;
                eprintln!("a checkpoint failed after {:?}: {e}", t.elapsed());
                // The failed transaction's database is dropped and reopened at once; if
                // the host's lack of room fails the reopen too, reads may fail (with EIO)
                // until a reopen succeeds: this round proves nothing.
                if e.contains("reopening") {
                    excused.push(round);
                }
            }
            disk.set_space(None);
            o.store.checkpoint().expect("a checkpoint with room");
            // Reads begun from here on find the database reopened.
            round_now.store(round + 1000, SeqCst);
            fs.evict();
        }
    });
    let all = failed.into_inner().unwrap();
    let failed: Vec<String> = all
        .iter()
        .filter(|(r, _)| !excused.contains(r))
        .map(|(_, e)| e.clone())
        .collect();
    eprintln!(
        "{checkpoints_failed} checkpoints failed for lack of room ({} of them and their \
         reopen) in {:.1}s; {} reads failed, {} of them while a reopen had failed",
        excused.len(),
        t0.elapsed().as_secs_f64(),
        all.len(),
        all.len() - failed.len()
    );
    assert!(
        checkpoints_failed > 0,
        "no checkpoint failed: the test did not test"
    );
    drop(c);
    drop(fs);
    o.store.close().unwrap();
    assert!(
        failed.is_empty(),
        "reads failed although every reopen succeeded:\n{}",
        failed.join("\n")
    );
}
