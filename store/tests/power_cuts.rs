//! Power cuts at every flush: the store a power cut leaves opens to a state the filesystem
//! was in, with every change a returned sync acknowledged (docs/DESIGN.md, "Durability";
//! store/src/{lib,commit,journal}.rs module docs). Around every flush of a simulated disk
//! (`SimDisk`), crash images are taken: what a power cut at that moment would leave, with the
//! unflushed writes lost, kept, or torn at sector boundaries.
//!
//! Checked two ways:
//! - against a model (the CrashMonkey / ACE method): a small tree made durable, then a
//!   workload of one to four operations (create, mkdir, link, unlink, rename, rmdir,
//!   truncate, write, setxattr, punch, an `O_TMPFILE` file written and linked, one written and
//!   left open unnamed), each possibly followed by an fsync, and always ending with one. Every
//!   image must hold the tree as it was after some prefix of the operations, at least as long
//!   as the prefix the last returned fsync covered, pass the engine's invariant check, and
//!   hold no inode the tree does not name. The workloads: every single operation and every
//!   pair, then random ones of three and four;
//! - against the histories of threads doing random operations on names of their own (written
//!   from the contract and the public API only): each thread's names after recovery are its
//!   state after a prefix of its operations, holding every operation that ended before an
//!   acknowledged sync began, and every operation of another thread that ended before a
//!   recovered one began (real-time order); recovered twice, the same. With group commit,
//!   tiny segments, edge cases (unlinked open files, records larger than a segment, the
//!   longest name), a power cut during recovery itself, and operations ordered only by the
//!   test's own lock. With the same workloads: reopen cycles keep the state, the identity of
//!   (inode, generation) and readdir cookies; injected EIO or ENOSPC lose nothing
//!   acknowledged; a stopped store refuses every change.
//!
//! Random tests print their seed; `LANEFS_SEED=<n>` replays one, `LANEFS_ROUNDS=<n>` runs
//! more (or fewer) seeds of those that run several.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use common::{HOUR, PowerCuts, dump, every_way, opts, seed, tree_diff};
use lanefs::{
    Client, Config, Ctx, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FileType, Filesystem, Ino,
    OpenOptions,
};
use lanefs_store::disk::{SimDisk, Unflushed};
use lanefs_store::open;
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const STORE: &str = "/store";
/// The commit interval of the threads' workloads.
const COMMIT: Duration = Duration::from_millis(5);

fn cfg() -> Config {
    Config {
        protected_hardlinks: false,
        ..Config::default()
    }
}

// ----- one thread against a model ------------------------------------------------------------

/// One operation of a model workload.
#[derive(Clone, Copy, Debug)]
enum Op {
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

const OPS: &[Op] = &[
    Op::Create("/new"),
    Op::Create("/A/C/new"),
    Op::Mkdir("/A/D"),
    Op::Mkdir("/B/D"),
    Op::Link("/foo", "/B/link"),
    Op::Link("/A/bar", "/bar2"),
    Op::Unlink("/foo"),
    Op::Unlink("/A/bar"),
    Op::Rename("/foo", "/B/foo"),
    Op::Rename("/A/bar", "/foo"),
    Op::Rename("/A", "/B/A"),
    Op::Rename("/A/C", "/C"),
    Op::Rmdir("/B"),
    Op::Rmdir("/A/C"),
    Op::Truncate("/foo", 0),
    Op::Truncate("/A/bar", 9000),
    Op::Write("/foo", 4090, 20),
    Op::Write("/A/bar", 100, 5000),
    Op::SetXattr("/foo"),
    Op::SetXattr("/A"),
    Op::Punch("/foo", 0, 4096),
    Op::Tmpfile("/A", "/A/tmp"),
    Op::TmpfileOpen("/B"),
];

fn model_tree(c: &Client) {
    c.create_dir("/A").unwrap();
    c.create_dir("/A/C").unwrap();
    c.create_dir("/B").unwrap();
    c.write("/foo", vec![b'f'; 5000]).unwrap();
    c.write("/A/bar", vec![b'b'; 100]).unwrap();
    c.hard_link("/foo", "/A/foo").unwrap();
}

/// Runs an operation; whether it succeeded.
fn apply(c: &Client, s: Op) -> bool {
    let r = match s {
        Op::Create(p) => c
            .open(p, OpenOptions::new().write(true).create_new(true))
            .map(drop),
        Op::Mkdir(p) => c.create_dir(p),
        Op::Link(a, b) => c.hard_link(a, b),
        Op::Unlink(p) => c.remove_file(p),
        Op::Rename(a, b) => c.rename(a, b),
        Op::Rmdir(p) => c.remove_dir(p),
        Op::Truncate(p, n) => c.truncate(p, n),
        Op::Write(p, off, n) => c
            .open(p, OpenOptions::new().write(true))
            .and_then(|f| f.write_at(&vec![b'w'; n], off).map(drop)),
        Op::SetXattr(p) => c.metadata(p).and_then(|m| {
            c.fs()
                .setxattr(c.ctx(), m.ino(), b"user.k", b"value", 0)
                .map_err(Into::into)
        }),
        Op::Punch(p, off, len) => c.open(p, OpenOptions::new().write(true)).and_then(|f| {
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
        Op::Fsync(p) => c
            .open(p, OpenOptions::new().read(true))
            .and_then(|f| f.sync_all()),
        Op::Tmpfile(dir, name) => c
            .open_tmpfile(dir, OpenOptions::new().write(true).mode(0o640))
            .and_then(|f| {
                f.write_at(&vec![b't'; 5000], 0)?;
                c.link_file(&f, name)
            }),
        Op::TmpfileOpen(dir) => c
            .open_tmpfile(dir, OpenOptions::new().write(true))
            .and_then(|f| {
                f.write_at(&vec![b'o'; 6000], 100)?;
                std::mem::forget(f); // open until the filesystem goes
                Ok(())
            }),
    };
    r.is_ok()
}

/// Runs `workload` (an fsync is added at the end) and checks every crash image; how many
/// there were.
fn check_model(workload: &[Op], interval: Duration, seed: u64) -> usize {
    let disk = SimDisk::new();
    let store_dir = Path::new(STORE);
    let o = open(
        store_dir,
        Config::default(),
        opts(&disk, 16 << 10, interval),
    )
    .unwrap();
    let fs = Arc::new(o.fs);
    let c = Client::root(fs.clone());
    model_tree(&c);
    fs.sync_all().unwrap();
    let mut states = vec![dump(&fs, true)];
    // At each cut: how many operations a returned fsync had made durable, and which one ran.
    let durable = Arc::new(AtomicUsize::new(0));
    let step_no = Arc::new(AtomicUsize::new(0));
    let cuts = {
        let (durable, step_no) = (durable.clone(), step_no.clone());
        PowerCuts::start(&disk, every_way(seed), move || {
            (durable.load(SeqCst), step_no.load(SeqCst))
        })
    };
    let mut steps: Vec<Op> = workload.to_vec();
    if !matches!(steps.last(), Some(Op::Fsync(_))) {
        steps.push(Op::Fsync("/"));
    }
    let mut done = 0;
    for s in &steps {
        step_no.store(done + 1, SeqCst);
        if let Op::Fsync(_) = s {
            // An fsync that failed (its file is gone) makes nothing durable.
            if apply(&c, *s) {
                durable.store(done, SeqCst);
            }
        } else {
            apply(&c, *s);
            done += 1;
            states.push(dump(&fs, true));
        }
    }
    let images = cuts.take();
    drop(c);
    drop(fs);
    drop(o.store);
    let n = images.len();
    for img in images {
        let (durable, step) = img.note;
        let what = format!("{} during step {step}", img.label());
        let r = open(
            store_dir,
            Config::default(),
            opts(&img.disk, 16 << 10, interval),
        )
        .unwrap_or_else(|e| panic!("{workload:?}, {what}: open failed: {e}"));
        let got = dump(&r.fs, true);
        let report =
            r.fs.check_invariants()
                .unwrap_or_else(|e| panic!("{workload:?}, {what}: {e}"));
        // Nothing without a name survives recovery (an unnamed tmpfile, an unlinked open
        // file): every inode is one the tree reaches.
        let named: std::collections::HashSet<_> = got.values().map(|n| n.ino).collect();
        assert_eq!(
            report.inodes,
            named.len() as u64,
            "{workload:?}, {what}: inodes without a name"
        );
        let matched = (durable..states.len()).find(|&j| states[j] == got);
        if matched.is_none() {
            panic!(
                "{workload:?}, {what}: the recovered tree is no prefix state from step {durable} \
                 on; it differs from that state:\n{}\nand from the last state:\n{}",
                tree_diff(&states[durable], &got),
                tree_diff(states.last().expect("states"), &got)
            );
        }
    }
    n
}

#[test]
fn every_single_operation_survives_a_power_cut_at_every_flush() {
    let mut images = 0;
    for s in OPS {
        images += check_model(&[*s], HOUR, 1);
    }
    eprintln!("{images} crash images checked");
    assert!(images > OPS.len() * 3);
}

#[test]
fn every_pair_of_operations_with_and_without_fsync_between() {
    let mut images = 0;
    for (i, a) in OPS.iter().enumerate() {
        for (j, b) in OPS.iter().enumerate() {
            let w = match (i + j) % 3 {
                0 => vec![*a, Op::Fsync("/foo"), *b],
                _ => vec![*a, *b],
            };
            images += check_model(&w, HOUR, (i * 100 + j) as u64);
        }
    }
    eprintln!("{images} crash images checked");
}

#[test]
fn random_workloads_of_three_and_four_with_background_commits() {
    let seed = seed::seed("model workloads of three and four");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut images = 0;
    for round in 0..60 {
        let n = rng.random_range(3..=4);
        let mut w = Vec::new();
        for _ in 0..n {
            w.push(OPS[rng.random_range(0..OPS.len())]);
            if rng.random_bool(0.3) {
                w.push(Op::Fsync(["/", "/foo", "/A"][rng.random_range(0..3)]));
            }
        }
        // Half the rounds also commit in the background between steps.
        let interval = match round % 2 {
            0 => HOUR,
            _ => Duration::from_micros(200),
        };
        images += check_model(&w, interval, seed ^ round);
    }
    eprintln!("{images} crash images checked");
}

// ----- threads against their histories -------------------------------------------------------

/// What a name looks like from outside: compared between the live filesystem and a recovered
/// one.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Node {
    File {
        data: Vec<u8>,
        nlink: u32,
        mode: u32,
        xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    },
    Dir {
        mode: u32,
    },
    Symlink(Vec<u8>),
}

type Snap = BTreeMap<String, Node>;

fn xattrs(fs: &Filesystem, ino: Ino) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let ctx = Ctx::root();
    let mut m = BTreeMap::new();
    let list = fs.listxattr(&ctx, ino).expect("listxattr");
    for name in list.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let v = fs.getxattr(&ctx, ino, name).expect("getxattr");
        m.insert(name.to_vec(), v);
    }
    m
}

fn node(c: &Client, path: &str) -> Node {
    let md = c.symlink_metadata(path).expect("metadata");
    let fs = c.fs();
    let attr = fs.getattr(md.ino()).expect("getattr");
    match md.file_type() {
        FileType::Directory => Node::Dir {
            mode: attr.mode & 0o7777,
        },
        FileType::Symlink => Node::Symlink(c.read_link(path).expect("readlink")),
        _ => Node::File {
            data: c.read(path).expect("read"),
            nlink: attr.nlink,
            mode: attr.mode & 0o7777,
            xattrs: xattrs(fs, md.ino()),
        },
    }
}

/// The subtree at `root` (recursively), plus the names in `extra_dir` starting with `prefix`.
fn snapshot(c: &Client, root: &str, extra_dir: Option<(&str, &str)>) -> Snap {
    let mut out = Snap::new();
    let mut stack = vec![root.to_string()];
    while let Some(d) = stack.pop() {
        for e in c.read_dir(&d).expect("read_dir") {
            let name = String::from_utf8(e.name.clone()).expect("utf8 names");
            let p = format!("{d}/{name}");
            let n = node(c, &p);
            if matches!(n, Node::Dir { .. }) {
                stack.push(p.clone());
            }
            out.insert(p, n);
        }
    }
    if let Some((dir, prefix)) = extra_dir {
        for e in c.read_dir(dir).expect("read_dir") {
            let name = String::from_utf8(e.name.clone()).expect("utf8 names");
            if name.starts_with(prefix) {
                let p = format!("{dir}/{name}");
                let n = node(c, &p);
                if matches!(n, Node::Dir { .. }) {
                    // Subtrees of shared directories.
                    for (k, v) in snapshot(c, &p, None) {
                        out.insert(k, v);
                    }
                }
                out.insert(p, n);
            }
        }
    }
    out
}

/// One thread's history: its namespace after each of its operations, and when each started
/// and ended on a global clock.
#[derive(Default, Clone)]
struct History {
    states: Vec<Snap>,
    start: Vec<u64>,
    end: Vec<u64>,
    labels: Vec<String>,
}

static CLOCK: AtomicU64 = AtomicU64::new(1);

fn tick() -> u64 {
    CLOCK.fetch_add(1, SeqCst)
}

/// Does one random operation on thread `t`'s names; returns a label. `synced` gets the
/// start tick of the operation if it was an fsync-like call that returned Ok.
fn random_op(c: &Client, t: usize, rng: &mut StdRng, sync_p: f64) -> (String, Option<bool>) {
    let fs = c.fs();
    let ctx = Ctx::root();
    let own = format!("/t{t}");
    let shared = "/shared";
    let pick_name = |rng: &mut StdRng| -> String {
        let i = rng.random_range(0..4);
        match rng.random_range(0..4) {
            0 => format!("{shared}/t{t}_f{i}"),
            1 => format!("{own}/d{}/f{i}", rng.random_range(0..2)),
            _ => format!("{own}/f{i}"),
        }
    };
    let r = rng.random::<f64>();
    if r < sync_p {
        // A durability call on something this thread has.
        let which = rng.random_range(0..4);
        let p = pick_name(rng);
        let res = match which {
            0 => match c.symlink_metadata(&p) {
                Ok(m) => fs.fsync_inode(m.ino(), false).map_err(std::io::Error::from),
                Err(e) => Err(e),
            },
            1 => match c.symlink_metadata(&p) {
                Ok(m) => fs.fsync_inode(m.ino(), true).map_err(std::io::Error::from),
                Err(e) => Err(e),
            },
            2 => {
                let d = if rng.random_bool(0.5) {
                    own.clone()
                } else {
                    shared.to_string()
                };
                match c.metadata(&d) {
                    Ok(m) => match fs.opendir(&ctx, m.ino()) {
                        Ok(fh) => {
                            let r = fs.fsync(fh, false).map_err(std::io::Error::from);
                            let _ = fs.releasedir(fh);
                            r
                        }
                        Err(e) => Err(e.into()),
                    },
                    Err(e) => Err(e),
                }
            }
            _ => fs.sync_all().map_err(std::io::Error::from),
        };
        let label = format!("sync{which} {p}");
        return match res {
            Ok(()) => (label, Some(true)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (label, Some(false)),
            Err(e) => (format!("{label}: {e}"), Some(false)),
        };
    }
    let p = pick_name(rng);
    let q = pick_name(rng);
    let k = rng.random_range(0..16);
    let res: std::io::Result<()> = match k {
        0 | 1 | 14 | 15 => c
            .open(&p, OpenOptions::new().write(true).create(true))
            .map(|_| ()),
        2..=4 => {
            // One write at a random offset (sometimes far: sparse).
            let off = if rng.random_bool(0.2) {
                rng.random_range(0..200_000)
            } else {
                rng.random_range(0..3000)
            };
            let len = rng.random_range(0..6000);
            let byte = rng.random::<u8>();
            let data: Vec<u8> = (0..len).map(|i| byte.wrapping_add(i as u8)).collect();
            match c.symlink_metadata(&p) {
                Ok(m) if m.is_file() => fs
                    .write_inode(&ctx, m.ino(), off, &data)
                    .map(|_| ())
                    .map_err(Into::into),
                Ok(_) => Ok(()),
                Err(e) => Err(e),
            }
        }
        5 => {
            let len = if rng.random_bool(0.5) {
                0
            } else {
                rng.random_range(0..9000)
            };
            c.truncate(&p, len)
        }
        6 => c.remove_file(&p),
        7 => c.rename(&p, &q),
        8 => c.hard_link(&p, &q),
        9 => c.symlink(format!("target-{}", rng.random::<u16>()), &p),
        10 => {
            let d = format!("{own}/d{}", rng.random_range(0..2));
            if rng.random_bool(0.5) {
                c.create_dir(&d)
            } else {
                c.remove_dir(&d)
            }
        }
        11 => {
            // Rename of a directory over a directory (empty or not).
            let a = format!("{own}/d{}", rng.random_range(0..2));
            let b = format!("{own}/d{}", rng.random_range(0..2));
            c.rename(&a, &b)
        }
        12 => match c.symlink_metadata(&p) {
            Ok(m) if m.is_file() => {
                let name = format!("user.a{}", rng.random_range(0..3));
                let v = vec![rng.random::<u8>(); rng.random_range(0..300)];
                if rng.random_bool(0.8) {
                    fs.setxattr(&ctx, m.ino(), name.as_bytes(), &v, 0)
                        .map_err(Into::into)
                } else {
                    fs.removexattr(&ctx, m.ino(), name.as_bytes())
                        .map_err(Into::into)
                }
            }
            Ok(_) => Ok(()),
            Err(e) => Err(e),
        },
        _ => c.set_permissions(&p, 0o600 | rng.random_range(0..0o100)),
    };
    let label = format!("op{k} {p} {q}");
    match res {
        Ok(()) => (label, None),
        Err(e) => (format!("{label}: {e}"), None),
    }
}

/// A crash image and what had been acknowledged when it was taken: the start tick of the
/// latest fsync-like call that had returned Ok.
struct Image {
    label: String,
    disk: SimDisk,
    acked: u64,
}

impl Image {
    /// The images of `cuts`, whose note is what was acknowledged.
    fn all(cuts: PowerCuts<u64>, name: &str) -> Vec<Image> {
        cuts.take()
            .into_iter()
            .map(|c| Image {
                label: format!("{name}{}", c.label()),
                acked: c.note,
                disk: c.disk,
            })
            .collect()
    }
}

struct Run {
    histories: Vec<History>,
    images: Vec<Image>,
    /// Start ticks of the fsyncs that returned Ok, in no order.
    final_acked: u64,
}

/// Runs `threads` threads doing `ops` random operations each on a store on `disk`, taking
/// crash images at every flush (`modes`, Before and After), at most `max_images`.
#[allow(clippy::too_many_arguments)]
fn run_workload(
    seed: u64,
    disk: &SimDisk,
    threads: usize,
    ops: usize,
    segment_size: u64,
    sync_p: f64,
    modes: &[Unflushed],
    max_images: usize,
) -> Run {
    let o =
        open(Path::new(STORE), cfg(), opts(disk, segment_size, COMMIT)).expect("open a new store");
    let fs = Arc::new(o.fs);
    let c = Client::root(fs.clone());
    c.create_dir("/shared").unwrap();
    for t in 0..threads {
        c.create_dir(format!("/t{t}")).unwrap();
        c.create_dir(format!("/t{t}/d0")).unwrap();
    }
    fs.sync_all().unwrap();
    let acked = Arc::new(AtomicU64::new(0));
    let cuts = {
        let acked = acked.clone();
        let modes = modes.to_vec();
        let mut taken = 0;
        PowerCuts::start(
            disk,
            move |n, _| {
                if taken >= max_images {
                    return vec![];
                }
                taken += modes.len();
                let torn = |m: &Unflushed| match m {
                    Unflushed::Torn(s) => Unflushed::Torn(s ^ n.wrapping_mul(0x9e37_79b9)),
                    m => *m,
                };
                modes.iter().map(torn).collect()
            },
            move || acked.load(SeqCst),
        )
    };
    let histories: Vec<History> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let fs = fs.clone();
                let acked = acked.clone();
                s.spawn(move || {
                    let c = Client::root(fs);
                    let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(1000) + t as u64);
                    let own = format!("/t{t}");
                    let prefix = format!("t{t}_");
                    let mut h = History::default();
                    h.states
                        .push(snapshot(&c, &own, Some(("/shared", &prefix))));
                    h.start.push(0);
                    h.end.push(0);
                    h.labels.push("initial".into());
                    for _ in 0..ops {
                        let st = tick();
                        let (label, synced) = random_op(&c, t, &mut rng, sync_p);
                        let en = tick();
                        if synced == Some(true) {
                            acked.fetch_max(st, SeqCst);
                        }
                        h.states
                            .push(snapshot(&c, &own, Some(("/shared", &prefix))));
                        h.start.push(st);
                        h.end.push(en);
                        h.labels.push(label);
                    }
                    h
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let images = Image::all(cuts, "");
    let final_acked = acked.load(SeqCst);
    drop(c);
    fs.check_invariants().expect("live filesystem consistent");
    drop(fs);
    o.store.close().expect("clean close");
    Run {
        histories,
        images,
        final_acked,
    }
}

/// Checks a recovered filesystem against the histories: each thread's names equal its state
/// after some prefix of its operations, every operation that ended before an acknowledged
/// fsync started is included, and operations that ended before an included one started are
/// included too (real time order).
fn check_prefix(
    fs: Arc<Filesystem>,
    run: &Run,
    acked: u64,
    what: &str,
) -> Result<Vec<usize>, String> {
    fs.check_invariants()
        .map_err(|e| format!("{what}: invariants: {e}"))?;
    let c = Client::root(fs.clone());
    let n = run.histories.len();
    let mut matches: Vec<Vec<usize>> = Vec::new();
    for (t, h) in run.histories.iter().enumerate() {
        let own = format!("/t{t}");
        let prefix = format!("t{t}_");
        if !c.exists(&own) {
            return Err(format!("{what}: {own} missing"));
        }
        let r = snapshot(&c, &own, Some(("/shared", &prefix)));
        let m: Vec<usize> = (0..h.states.len()).filter(|&k| h.states[k] == r).collect();
        if m.is_empty() {
            // Closest state, for the report.
            let best = (0..h.states.len())
                .min_by_key(|&k| diff(&h.states[k], &r).len())
                .unwrap();
            return Err(format!(
                "{what}: thread {t}: recovered names match no prefix; closest is after op {best} \
                 ({}), differences: {:?}",
                h.labels[best],
                diff(&h.states[best], &r)
            ));
        }
        matches.push(m);
    }
    // Least fixpoint of the requirements.
    let need_before = |h: &History, tick: u64| -> usize {
        (0..h.end.len())
            .rev()
            .find(|&j| h.end[j] < tick)
            .unwrap_or(0)
    };
    let mut k: Vec<usize> = Vec::with_capacity(n);
    #[allow(clippy::needless_range_loop)]
    for t in 0..n {
        let req = need_before(&run.histories[t], acked);
        match matches[t].iter().find(|&&x| x >= req) {
            Some(&x) => k.push(x),
            None => {
                let h = &run.histories[t];
                return Err(format!(
                    "{what}: thread {t}: an fsync (tick {acked}) was acknowledged after op {req} \
                     ({}) but the recovered state is after op(s) {:?} ({})",
                    h.labels[req],
                    matches[t],
                    matches[t]
                        .iter()
                        .map(|&i| h.labels[i].clone())
                        .collect::<Vec<_>>()
                        .join("; ")
                ));
            }
        }
    }
    loop {
        let mut changed = false;
        for t in 0..n {
            if k[t] == 0 {
                continue;
            }
            let st = run.histories[t].start[k[t]];
            for u in 0..n {
                if u == t {
                    continue;
                }
                let req = need_before(&run.histories[u], st);
                if k[u] < req {
                    match matches[u].iter().find(|&&x| x >= req) {
                        Some(&x) => {
                            k[u] = x;
                            changed = true;
                        }
                        None => {
                            return Err(format!(
                                "{what}: real-time order: thread {t} op {} ({}) is recovered, but \
                                 thread {u} op {req} ({}) which ended before it started is not \
                                 (thread {u} recovered at {:?})",
                                k[t],
                                run.histories[t].labels[k[t]],
                                run.histories[u].labels[req],
                                matches[u]
                            ));
                        }
                    }
                }
            }
        }
        if !changed {
            return Ok(k);
        }
    }
}

fn diff(a: &Snap, b: &Snap) -> Vec<String> {
    let mut out = Vec::new();
    for (k, v) in a {
        match b.get(k) {
            None => out.push(format!("-{k}")),
            Some(w) if w != v => out.push(format!("~{k}: {} vs {}", short(v), short(w))),
            _ => {}
        }
    }
    for k in b.keys() {
        if !a.contains_key(k) {
            out.push(format!("+{k}"));
        }
    }
    out
}

fn short(n: &Node) -> String {
    match n {
        Node::File {
            data,
            nlink,
            mode,
            xattrs,
        } => format!(
            "file(len {}, crc {:x}, nlink {nlink}, mode {mode:o}, xattrs {})",
            data.len(),
            crc(data),
            xattrs.len()
        ),
        other => format!("{other:?}"),
    }
}

fn crc(d: &[u8]) -> u64 {
    d.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// Recovers `img` twice (the second open must find exactly what the first left) and checks
/// it.
fn recover_and_check(run: &Run, img: &Image, segment_size: u64, what: &str) -> Result<(), String> {
    let o = open(
        Path::new(STORE),
        cfg(),
        opts(&img.disk, segment_size, COMMIT),
    )
    .map_err(|e| format!("{what}: open refused: {e}"))?;
    let fs = Arc::new(o.fs);
    let k = check_prefix(fs.clone(), run, img.acked, what)?;
    let first: Vec<Snap> = (0..run.histories.len())
        .map(|t| run.histories[t].states[k[t]].clone())
        .collect();
    drop(fs);
    o.store
        .close()
        .map_err(|e| format!("{what}: close after recovery: {e}"))?;
    // Reopen: the same state.
    let o = open(
        Path::new(STORE),
        cfg(),
        opts(&img.disk, segment_size, COMMIT),
    )
    .map_err(|e| format!("{what}: second open refused: {e}"))?;
    let fs = Arc::new(o.fs);
    fs.check_invariants()
        .map_err(|e| format!("{what}: second open: invariants: {e}"))?;
    let c = Client::root(fs.clone());
    for (t, want) in first.iter().enumerate() {
        let got = snapshot(&c, &format!("/t{t}"), Some(("/shared", &format!("t{t}_"))));
        if &got != want {
            return Err(format!(
                "{what}: second open differs from the first for thread {t}: {:?}",
                diff(want, &got)
            ));
        }
    }
    drop(c);
    drop(fs);
    o.store
        .close()
        .map_err(|e| format!("{what}: close after second open: {e}"))?;
    Ok(())
}

fn crash_attack(
    base: u64,
    rounds: u64,
    threads: usize,
    ops: usize,
    segment_size: u64,
    sync_p: f64,
) {
    for seed in seed::seeds("power cuts", seed::counting(base, rounds)) {
        eprintln!(
            "power cuts: seed {seed}: threads={threads} ops={ops} segment_size={segment_size}"
        );
        let disk = SimDisk::new();
        let modes = [
            Unflushed::Lost,
            Unflushed::Kept,
            Unflushed::Torn(seed),
            Unflushed::Torn(seed ^ 0x5555),
        ];
        let run = run_workload(seed, &disk, threads, ops, segment_size, sync_p, &modes, 600);
        let mut failures = Vec::new();
        for img in &run.images {
            let what = format!("seed {seed} {}", img.label);
            if let Err(e) = recover_and_check(&run, img, segment_size, &what) {
                failures.push(e);
            }
        }
        // And the disk as the clean close left it: everything.
        let fin = Image {
            label: "after clean close".into(),
            disk: disk.crash(Unflushed::Lost),
            acked: u64::MAX,
        };
        if let Err(e) = recover_and_check(&run, &fin, segment_size, &format!("seed {seed} clean")) {
            failures.push(e);
        }
        let _ = run.final_acked;
        eprintln!(
            "  {} images checked, {} failures",
            run.images.len() + 1,
            failures.len()
        );
        if !failures.is_empty() {
            for f in failures.iter().take(5) {
                eprintln!("FAIL {f}");
            }
            panic!(
                "seed {seed}: {} failures, first: {}",
                failures.len(),
                failures[0]
            );
        }
    }
}

/// Attack 1c: one thread, so that the recovered state must be exactly the state after some
/// prefix k with k at least the last fsync.
#[test]
fn power_cut_single_thread_prefix() {
    crash_attack(1000, 3, 1, 150, 64 << 10, 0.12);
}

/// Attacks 1 and 2: many threads, group commit, power cut at every flush.
#[test]
fn power_cut_many_threads_group_commit() {
    crash_attack(2000, 2, 6, 50, 64 << 10, 0.15);
}

/// Attack 5: tiny segments, so that batches split across many segments and records are
/// larger than a segment.
#[test]
fn power_cut_tiny_segments() {
    crash_attack(3000, 2, 3, 50, 8 << 10, 0.15);
}

/// Reads directory `dir` from `offset`, at most `max` entries (not `.`/`..`); returns the
/// names and the cookie of the last.
fn read_some(fs: &Filesystem, dir: Ino, offset: u64, max: usize) -> (Vec<Vec<u8>>, u64) {
    let ctx = Ctx::root();
    let fh = fs.opendir(&ctx, dir).expect("opendir");
    let mut names = Vec::new();
    let mut last = offset;
    fs.readdir(&ctx, fh, offset, false, |e, _| {
        if names.len() >= max {
            return false;
        }
        last = e.offset;
        if e.name != b"." && e.name != b".." {
            names.push(e.name.to_vec());
        }
        true
    })
    .expect("readdir");
    fs.releasedir(fh).expect("releasedir");
    (names, last)
}

/// Attack 3: open, mutate, close cleanly, reopen, 20 times: the state survives exactly;
/// (ino, generation) never names two different files; a readdir continued after a restart
/// with a cookie from before it returns the rest, each entry once.
#[test]
fn reopen_cycles_keep_state_identity_and_cookies() {
    for seed in seed::seeds("reopen cycles", seed::counting(4000, 2)) {
        let disk = SimDisk::new();
        let mut rng = StdRng::seed_from_u64(seed);
        let mut ids: BTreeMap<(u64, u64), String> = BTreeMap::new();
        let mut expected: Option<Snap> = None;
        let mut cookie: Option<(Vec<Vec<u8>>, u64)> = None;
        let mut next_tag = 0u64;
        for cycle in 0..20 {
            let o = open(Path::new(STORE), cfg(), opts(&disk, 16 << 10, COMMIT))
                .unwrap_or_else(|e| panic!("seed {seed} cycle {cycle}: open: {e}"));
            assert_eq!(o.report.created, cycle == 0);
            let fs = Arc::new(o.fs);
            fs.check_invariants()
                .unwrap_or_else(|e| panic!("seed {seed} cycle {cycle}: {e}"));
            let c = Client::root(fs.clone());
            if cycle == 0 {
                c.create_dir("/t0").unwrap();
                c.create_dir("/t0/d0").unwrap();
                c.create_dir("/shared").unwrap();
                c.create_dir("/tags").unwrap();
            }
            let now = snapshot(&c, "/t0", Some(("/shared", "t0_")));
            if let Some(want) = &expected {
                assert!(
                    &now == want,
                    "seed {seed} cycle {cycle}: state after reopen differs: {:?}",
                    diff(want, &now)
                );
            }
            // Cookie continued across the restart: the names before it, then the rest, once
            // each, are exactly the directory's names (it did not change).
            let tags = c.metadata("/tags").unwrap().ino();
            if let Some((first, off)) = cookie.take() {
                let (rest, _) = read_some(&fs, tags, off, usize::MAX);
                let mut all: Vec<Vec<u8>> = first.iter().chain(rest.iter()).cloned().collect();
                let n = all.len();
                all.sort();
                all.dedup();
                assert_eq!(
                    n,
                    all.len(),
                    "seed {seed} cycle {cycle}: entry returned twice"
                );
                let mut want: Vec<Vec<u8>> = c
                    .read_dir("/tags")
                    .unwrap()
                    .into_iter()
                    .map(|e| e.name)
                    .collect();
                want.sort();
                assert_eq!(
                    all, want,
                    "seed {seed} cycle {cycle}: readdir across a restart"
                );
            }
            // Identity: tagged files, some removed and some renamed, inode numbers reused.
            for _ in 0..rng.random_range(1..12) {
                let names: Vec<Vec<u8>> = c
                    .read_dir("/tags")
                    .unwrap()
                    .into_iter()
                    .map(|e| e.name)
                    .collect();
                match rng.random_range(0..3) {
                    0 if !names.is_empty() => {
                        let n = &names[rng.random_range(0..names.len())];
                        c.remove_file(format!("/tags/{}", String::from_utf8_lossy(n)))
                            .unwrap();
                    }
                    1 if !names.is_empty() => {
                        let n = &names[rng.random_range(0..names.len())];
                        c.rename(
                            format!("/tags/{}", String::from_utf8_lossy(n)),
                            format!("/tags/r{next_tag}"),
                        )
                        .unwrap();
                        next_tag += 1;
                    }
                    _ => {
                        let tag = format!("id-{next_tag}");
                        next_tag += 1;
                        c.write(format!("/tags/{tag}"), tag.as_bytes()).unwrap();
                    }
                }
            }
            for e in c.read_dir("/tags").unwrap() {
                let p = format!("/tags/{}", String::from_utf8_lossy(&e.name));
                let a = fs.getattr(c.metadata(&p).unwrap().ino()).unwrap();
                let tag = String::from_utf8(c.read(&p).unwrap()).unwrap();
                let key = (a.ino.0, a.generation.0);
                if let Some(old) = ids.insert(key, tag.clone()) {
                    assert_eq!(
                        old, tag,
                        "seed {seed} cycle {cycle}: (ino, generation) {key:?} names two files"
                    );
                }
            }
            for _ in 0..rng.random_range(5..40) {
                random_op(&c, 0, &mut rng, 0.05);
            }
            expected = Some(snapshot(&c, "/t0", Some(("/shared", "t0_"))));
            if rng.random_bool(0.7) {
                cookie = Some(read_some(&fs, tags, 0, rng.random_range(0..6)));
            }
            drop(c);
            fs.check_invariants().unwrap();
            drop(fs);
            o.store.close().expect("clean close");
            // Sometimes the clean close is followed by a power cut: nothing may be lost.
            if rng.random_bool(0.3) {
                let d = disk.crash(Unflushed::Lost);
                let o = open(Path::new(STORE), cfg(), opts(&d, 16 << 10, COMMIT))
                    .unwrap_or_else(|e| panic!("seed {seed} cycle {cycle}: open after cut: {e}"));
                let c = Client::root(Arc::new(o.fs));
                let got = snapshot(&c, "/t0", Some(("/shared", "t0_")));
                let want = expected.as_ref().unwrap();
                assert!(
                    &got == want,
                    "seed {seed} cycle {cycle}: a clean close was not durable: {:?}",
                    diff(want, &got)
                );
            }
        }
    }
}

/// Attack 4: EIO or ENOSPC at a random point while threads work: no panic, every error is an
/// errno, and after the failure is over, reopening finds every acknowledged operation.
#[test]
fn injected_errors_lose_nothing_acknowledged() {
    for seed in seed::seeds("injected errors", seed::counting(5000, 8)) {
        let mut rng = StdRng::seed_from_u64(seed);
        let enospc = rng.random_bool(0.5);
        let fail_after = rng.random_range(0..60);
        eprintln!("injected errors: seed {seed}: enospc={enospc} after {fail_after} ops");
        let disk = SimDisk::new();
        let o = open(Path::new(STORE), cfg(), opts(&disk, 16 << 10, COMMIT)).unwrap();
        let fs = Arc::new(o.fs);
        let c = Client::root(fs.clone());
        c.create_dir("/shared").unwrap();
        for t in 0..3 {
            c.create_dir(format!("/t{t}")).unwrap();
            c.create_dir(format!("/t{t}/d0")).unwrap();
        }
        fs.sync_all().unwrap();
        let done = AtomicU64::new(0);
        let failed = std::sync::atomic::AtomicBool::new(false);
        let errors = Mutex::new(Vec::<String>::new());
        let histories: Vec<(History, u64)> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3)
                .map(|t| {
                    let (fs, disk, done, failed, errors) =
                        (fs.clone(), disk.clone(), &done, &failed, &errors);
                    s.spawn(move || {
                        let c = Client::root(fs);
                        let mut rng = StdRng::seed_from_u64(seed * 100 + t as u64);
                        let prefix = format!("t{t}_");
                        let own = format!("/t{t}");
                        let mut h = History::default();
                        let mut acked = 0;
                        h.states
                            .push(snapshot(&c, &own, Some(("/shared", &prefix))));
                        h.start.push(0);
                        h.end.push(0);
                        h.labels.push("initial".into());
                        for _ in 0..80 {
                            if done.fetch_add(1, SeqCst) == fail_after && !failed.swap(true, SeqCst)
                            {
                                if enospc {
                                    disk.set_space(Some(disk.used() + rng.random_range(0..20_000)));
                                } else {
                                    disk.set_failing(true);
                                }
                            }
                            let st = tick();
                            let (label, synced) = random_op(&c, t, &mut rng, 0.2);
                            let en = tick();
                            if synced == Some(true) {
                                acked = st;
                            }
                            if label.contains("os error")
                                && !label.contains("os error 2)")
                                && !label.contains("os error 39)")
                                && !label.contains("os error 17)")
                                && !label.contains("os error 20)")
                                && !label.contains("os error 21)")
                                && !label.contains("os error 22)")
                                && !label.contains("os error 61)")
                            {
                                errors.lock().push(label.clone());
                            }
                            h.states
                                .push(snapshot(&c, &own, Some(("/shared", &prefix))));
                            h.start.push(st);
                            h.end.push(en);
                            h.labels.push(label);
                        }
                        (h, acked)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let errs = errors.lock().clone();
        for e in &errs {
            assert!(
                e.contains("os error 5)") || e.contains("os error 28)"),
                "seed {seed}: unexpected error {e}"
            );
        }
        let acked = histories.iter().map(|h| h.1).max().unwrap();
        drop(c);
        drop(fs);
        let _ = o.store.close();
        disk.set_failing(false);
        disk.set_space(None);
        let run = Run {
            histories: histories.into_iter().map(|h| h.0).collect(),
            images: Vec::new(),
            final_acked: acked,
        };
        for (what, d) in [
            ("same disk", disk.clone()),
            ("power cut", disk.crash(Unflushed::Lost)),
            ("torn", disk.crash(Unflushed::Torn(seed))),
        ] {
            let img = Image {
                label: what.into(),
                disk: d,
                acked,
            };
            recover_and_check(&run, &img, 16 << 10, &format!("seed {seed} {what}"))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        eprintln!("  {} I/O errors reached callers", errs.len());
    }
}

/// Attack: a power cut during recovery itself (while it zeroes a torn tail or commits what
/// finishing appended), then recovery again: still a prefix with everything acknowledged.
#[test]
fn power_cut_during_recovery() {
    for seed in seed::seeds("power cuts during recovery", seed::counting(6000, 2)) {
        let disk = SimDisk::new();
        let modes = [Unflushed::Kept, Unflushed::Torn(seed)];
        let run = run_workload(seed, &disk, 3, 40, 8 << 10, 0.15, &modes, 200);
        let mut checked = 0;
        for img in run.images.iter().step_by(3) {
            let nested = PowerCuts::every_flush(&img.disk, 0);
            let o = open(Path::new(STORE), cfg(), opts(&img.disk, 8 << 10, COMMIT))
                .unwrap_or_else(|e| panic!("seed {seed} {}: open: {e}", img.label));
            let nested = nested.take();
            drop(o);
            for cut in nested {
                let what = format!("seed {seed} {} then recovery {}", img.label, cut.label());
                let nimg = Image {
                    label: what.clone(),
                    disk: cut.disk,
                    acked: img.acked,
                };
                recover_and_check(&run, &nimg, 8 << 10, &what).unwrap_or_else(|e| panic!("{e}"));
                checked += 1;
            }
        }
        eprintln!("  {checked} nested images checked");
    }
}

type Step = Box<dyn Fn(&Client, &mut Vec<lanefs::Fh>) -> std::io::Result<bool>>;

/// Runs `steps` on one thread (each returns whether it was an acknowledged sync), with crash
/// images at every flush, and checks each image against the states after each step.
fn scripted(name: &str, segment_size: u64, steps: Vec<Step>) {
    let disk = SimDisk::new();
    let o = open(Path::new(STORE), cfg(), opts(&disk, segment_size, COMMIT)).unwrap();
    let fs = Arc::new(o.fs);
    let c = Client::root(fs.clone());
    c.create_dir("/t0").unwrap();
    c.create_dir("/shared").unwrap();
    fs.sync_all().unwrap();
    let acked = Arc::new(AtomicU64::new(0));
    let cuts = {
        let acked = acked.clone();
        let ways = |n: u64, _| {
            let torn = [Unflushed::Torn(n), Unflushed::Torn(!n)];
            [Unflushed::Lost, Unflushed::Kept]
                .into_iter()
                .chain(torn)
                .collect()
        };
        PowerCuts::start(&disk, ways, move || acked.load(SeqCst))
    };
    let mut h = History::default();
    let snap = |c: &Client| snapshot(c, "/t0", Some(("/shared", "t0_")));
    h.states.push(snap(&c));
    h.start.push(0);
    h.end.push(0);
    h.labels.push("initial".into());
    let mut handles = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let st = tick();
        let r = step(&c, &mut handles);
        let en = tick();
        match r {
            Ok(true) => {
                acked.fetch_max(st, SeqCst);
            }
            Ok(false) => {}
            Err(e) => panic!("{name}: step {i} failed: {e}"),
        }
        h.states.push(snap(&c));
        h.start.push(st);
        h.end.push(en);
        h.labels.push(format!("step {i}"));
    }
    let run = Run {
        histories: vec![h],
        images: Image::all(cuts, &format!("{name}: ")),
        final_acked: acked.load(SeqCst),
    };
    let mut failures = Vec::new();
    for img in &run.images {
        if let Err(e) = recover_and_check(&run, img, segment_size, &img.label) {
            failures.push(e);
        }
    }
    // Open handles still held at the cut: recovery frees the orphans.
    drop(handles);
    drop(c);
    drop(fs);
    o.store.close().unwrap();
    let fin = Image {
        label: format!("{name}: clean close"),
        disk: disk.crash(Unflushed::Lost),
        acked: u64::MAX,
    };
    if let Err(e) = recover_and_check(&run, &fin, segment_size, &fin.label) {
        failures.push(e);
    }
    eprintln!(
        "{name}: {} images, {} failures",
        run.images.len() + 1,
        failures.len()
    );
    for f in failures.iter().take(5) {
        eprintln!("FAIL {f}");
    }
    assert!(failures.is_empty(), "{}", failures[0]);
}

fn ino(c: &Client, p: &str) -> Ino {
    c.symlink_metadata(p).unwrap().ino()
}

/// Creates an empty file (one record).
fn mk(c: &Client, p: &str) -> std::io::Result<bool> {
    c.open(p, OpenOptions::new().write(true).create_new(true))
        .map(|_| false)
}

/// One write (one record).
fn put(c: &Client, p: &str, off: u64, data: &[u8]) -> std::io::Result<bool> {
    c.fs()
        .write_inode(&Ctx::root(), ino(c, p), off, data)
        .map(|_| false)
        .map_err(Into::into)
}

fn fsync(c: &Client, p: &str) -> std::io::Result<bool> {
    c.fs().fsync_inode(ino(c, p), false)?;
    Ok(true)
}

/// Attack 5: an unlinked file still open, written and fsynced; a file truncated down after
/// an fsync; records larger than a segment; the longest name; hard links across
/// directories; a directory renamed over an empty one; zero-length files.
#[test]
fn power_cut_edge_cases() {
    let long = "x".repeat(255);
    let long2 = long.clone();
    let steps: Vec<Step> = vec![
        Box::new(|c, _| mk(c, "/t0/a")),
        Box::new(|c, _| put(c, "/t0/a", 0, &[7u8; 20_000])),
        Box::new(|c, _| fsync(c, "/t0/a")),
        Box::new(|c, _| c.truncate("/t0/a", 100).map(|()| false)),
        Box::new(|c, _| c.truncate("/t0/a", 5000).map(|()| false)),
        Box::new(|c, _| fsync(c, "/t0/a")),
        Box::new(|c, h| {
            let fs = c.fs();
            let (_, fh) = fs
                .create(&Ctx::root(), ino(c, "/t0"), b"orphan", 0o644, libc::O_RDWR)
                .map_err(std::io::Error::from)?;
            h.push(fh);
            Ok(false)
        }),
        Box::new(|c, h| {
            c.fs()
                .write(&Ctx::root(), h[0], 0, &[1u8; 3000])
                .map(|_| false)
                .map_err(Into::into)
        }),
        Box::new(|c, _| c.hard_link("/t0/orphan", "/shared/t0_link").map(|()| false)),
        Box::new(|c, _| c.remove_file("/t0/orphan").map(|()| false)),
        Box::new(|c, _| c.remove_file("/shared/t0_link").map(|()| false)),
        Box::new(|c, h| c.fs().fsync(h[0], false).map(|()| true).map_err(Into::into)),
        // A record much larger than a segment.
        Box::new(|c, _| mk(c, "/t0/big")),
        Box::new(|c, _| {
            let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
            put(c, "/t0/big", 0, &data)
        }),
        Box::new(|c, _| c.fs().sync_all().map(|()| true).map_err(Into::into)),
        Box::new(move |c, _| mk(c, &format!("/t0/{long}"))),
        Box::new(move |c, _| {
            c.hard_link(format!("/t0/{long2}"), "/shared/t0_l2")
                .map(|()| false)
        }),
        Box::new(|c, _| {
            let too_long = "y".repeat(256);
            match c.write(format!("/t0/{too_long}"), b"") {
                Err(e) if e.raw_os_error() == Some(libc::ENAMETOOLONG) => Ok(false),
                other => panic!("a 256-byte name: {other:?}"),
            }
        }),
        Box::new(|c, _| c.create_dir("/t0/d1").map(|()| false)),
        Box::new(|c, _| c.create_dir("/t0/d2").map(|()| false)),
        Box::new(|c, _| mk(c, "/t0/d1/in")),
        Box::new(|c, _| put(c, "/t0/d1/in", 0, b"inside")),
        Box::new(|c, _| c.rename("/t0/d1", "/t0/d2").map(|()| false)),
        Box::new(|c, _| fsync(c, "/t0/d2/in")),
        Box::new(|c, _| c.truncate("/t0/big", 10).map(|()| false)),
        Box::new(|c, _| {
            c.fs()
                .write_inode(&Ctx::root(), ino(c, "/t0/big"), 1 << 20, b"far")
                .map(|_| false)
                .map_err(Into::into)
        }),
        Box::new(|c, _| fsync(c, "/t0/big")),
        Box::new(|c, _| c.rename("/t0/big", "/shared/t0_big").map(|()| false)),
        Box::new(|c, _| fsync(c, "/shared/t0_big")),
    ];
    scripted("edge cases", 8 << 10, steps);
}

/// Attack: operations of different threads ordered only by the test's own lock (a token
/// passed around): the recovered files must be a prefix of that order.
#[test]
fn power_cut_respects_cross_thread_order() {
    for seed in seed::seeds("cross-thread order", seed::counting(7000, 2)) {
        let disk = SimDisk::new();
        let o = open(Path::new(STORE), cfg(), opts(&disk, 16 << 10, COMMIT)).unwrap();
        let fs = Arc::new(o.fs);
        let c = Client::root(fs.clone());
        c.create_dir("/seq").unwrap();
        c.write("/counter", b"0").unwrap();
        fs.sync_all().unwrap();
        let acked = Arc::new(AtomicU64::new(0));
        let cuts = {
            let acked = acked.clone();
            PowerCuts::start(&disk, every_way(seed), move || acked.load(SeqCst))
        };
        let token = Mutex::new(0u64);
        std::thread::scope(|s| {
            for t in 0..4 {
                let (fs, token, acked) = (fs.clone(), &token, acked.clone());
                s.spawn(move || {
                    let c = Client::root(fs.clone());
                    let mut rng = StdRng::seed_from_u64(seed * 10 + t);
                    for _ in 0..40 {
                        let mut v = token.lock();
                        *v += 1;
                        // create /seq/<v>, then the counter says v.
                        c.write(format!("/seq/{}", *v), b"").unwrap();
                        fs.write_inode(
                            &Ctx::root(),
                            ino(&c, "/counter"),
                            0,
                            format!("{:08}", *v).as_bytes(),
                        )
                        .unwrap();
                        let mine = *v;
                        drop(v);
                        if rng.random_bool(0.2) {
                            fs.sync_all().unwrap();
                            acked.fetch_max(mine, SeqCst);
                        }
                    }
                });
            }
        });
        let imgs = Image::all(cuts, "");
        let n = imgs.len();
        for Image {
            label,
            disk: d,
            acked,
        } in imgs
        {
            let o = open(Path::new(STORE), cfg(), opts(&d, 16 << 10, COMMIT))
                .unwrap_or_else(|e| panic!("seed {seed} {label}: {e}"));
            let c = Client::root(Arc::new(o.fs));
            c.fs().check_invariants().unwrap();
            let mut got: Vec<u64> = c
                .read_dir("/seq")
                .unwrap()
                .into_iter()
                .map(|e| String::from_utf8(e.name).unwrap().parse().unwrap())
                .collect();
            got.sort();
            let k = got.len() as u64;
            assert_eq!(
                got,
                (1..=k).collect::<Vec<_>>(),
                "seed {seed} {label}: not a prefix"
            );
            let counter = c.read("/counter").unwrap();
            let cv: u64 = std::str::from_utf8(&counter)
                .unwrap()
                .trim_end_matches('\0')
                .parse()
                .unwrap_or(0);
            assert!(
                cv == k || cv + 1 == k,
                "seed {seed} {label}: counter {cv} with {k} files"
            );
            assert!(
                cv >= acked,
                "seed {seed} {label}: acknowledged {acked}, recovered {cv}"
            );
        }
        eprintln!("  {n} images checked");
        drop(c);
        drop(fs);
        o.store.close().unwrap();
    }
}

/// Attack 4b: once the store has stopped (EIO on a flush), no further change becomes visible:
/// every mutation fails with the store's errno and the live names stay as they were.
#[test]
fn stopped_store_refuses_changes() {
    let disk = SimDisk::new();
    let o = open(Path::new(STORE), cfg(), opts(&disk, 16 << 10, COMMIT)).unwrap();
    let fs = Arc::new(o.fs);
    let c = Client::root(fs.clone());
    c.create_dir("/t0").unwrap();
    mk(&c, "/t0/a").unwrap();
    put(&c, "/t0/a", 0, b"hello").unwrap();
    fs.sync_all().unwrap();
    disk.set_failing(true);
    mk(&c, "/t0/b").unwrap(); // appended before the store stopped: may stay visible
    let e = fs.sync_all().expect_err("a flush on a failing disk");
    assert_eq!(e.0, libc::EIO);
    let before = snapshot(&c, "/t0", None);
    let tries: Vec<(&str, std::io::Result<bool>)> = vec![
        ("create", mk(&c, "/t0/c")),
        ("write", put(&c, "/t0/a", 0, b"HELLO")),
        ("rename", c.rename("/t0/a", "/t0/z").map(|()| false)),
        ("unlink", c.remove_file("/t0/b").map(|()| false)),
        ("mkdir", c.create_dir("/t0/d").map(|()| false)),
        ("truncate", c.truncate("/t0/a", 1).map(|()| false)),
    ];
    for (what, r) in tries {
        let e = r.expect_err(what);
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "{what}: {e}");
    }
    assert_eq!(
        snapshot(&c, "/t0", None),
        before,
        "a refused change became visible"
    );
    drop(c);
    drop(fs);
    assert!(o.store.close().is_err());
    disk.set_failing(false);
    let o = open(Path::new(STORE), cfg(), opts(&disk, 16 << 10, COMMIT)).unwrap();
    let c = Client::root(Arc::new(o.fs));
    assert_eq!(c.read("/t0/a").unwrap(), b"hello");
}
