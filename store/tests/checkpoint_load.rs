//! Attacks on a checkpoint's application of records (changed inodes kept in slots, lanes'
//! cookies written at the end) and on the load of a checkpoint at open (the tree in windows,
//! inodes in runs of keys, xattrs and pages with one cursor each, compaction decided after
//! the load): whatever the filesystem was before a checkpoint and a close, it is after the
//! reopen, and a power cut during a checkpoint leaves what was synced.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{PowerCuts, seed};
use lanefs::{
    Client, Config, Ctx, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FS_NOATIME_FL, FS_NODUMP_FL,
    FileType, Filesystem, Ino, TimeSet, Timespec,
};
use lanefs_store::disk::{SimDisk, SyncPoint, Unflushed};
use lanefs_store::{Options, fsck, open};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const DIR: &str = "/store";

fn dir() -> &'static Path {
    Path::new(DIR)
}

/// On `disk`, segments of `segment` bytes; checkpoints only on demand, no reserve; loaded
/// whole when opened (this file tests that load; `lazy_open.rs` the other).
fn opts(disk: &SimDisk, segment: u64) -> Options {
    Options {
        lazy: false,
        checkpoint_records: u64::MAX / 4,
        checkpoint_segments: 1 << 20,
        journal_segments: 1 << 21,
        checkpoint_changed: u64::MAX / 8,
        checkpoint_poll: Duration::from_secs(3600),
        checkpoint_reserve: 0,
        ..common::opts(disk, segment, Duration::from_millis(1))
    }
}

const ROOT: Ino = Ino(1);

fn fnv(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for &b in data {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

fn ts(t: Timespec) -> String {
    format!("{}.{:09}", t.sec, t.nsec)
}

/// A textual image of the whole filesystem reachable from the root (atime left out: reading
/// moves it), with its consistency checked (link counts against names, `..`, unique cookies).
fn snapshot(fs: &Filesystem) -> String {
    let ctx = Ctx::root();
    let mut out = String::new();
    let mut names: BTreeMap<u64, u32> = BTreeMap::new();
    let mut subdirs: HashMap<u64, u32> = HashMap::new();
    let mut parent_of: HashMap<u64, u64> = HashMap::new();
    let mut kinds: HashMap<u64, FileType> = HashMap::new();
    let mut q = VecDeque::from([ROOT]);
    let mut bad = Vec::new();
    kinds.insert(1, FileType::Directory);
    while let Some(d) = q.pop_front() {
        let end = fs.read_end(d).unwrap();
        let mut ents = Vec::new();
        fs.readdir_inode(&ctx, d, 0, &end, false, |e, _| {
            ents.push((e.name.to_vec(), e.offset, e.ino, e.kind));
            true
        })
        .unwrap();
        let mut cookies = HashSet::new();
        let dotdot = fs.lookup(&ctx, d, b"..").unwrap().ino.0;
        writeln!(out, "dir {} ..={}", d.0, dotdot).unwrap();
        for (name, cookie, ino, kind) in ents {
            if name == b"." || name == b".." {
                continue;
            }
            if !cookies.insert(cookie) {
                bad.push(format!("dir {}: cookie {cookie} twice", d.0));
            }
            writeln!(
                out,
                "  {} cookie={} ino={} {:?}",
                String::from_utf8_lossy(&name),
                cookie,
                ino.0,
                kind
            )
            .unwrap();
            let a = fs.lookup(&ctx, d, &name).unwrap();
            if a.ino != ino {
                bad.push(format!("dir {}: lookup of {:?} differs", d.0, name));
            }
            *names.entry(ino.0).or_default() += 1;
            kinds.insert(ino.0, kind);
            if kind == FileType::Directory {
                *subdirs.entry(d.0).or_default() += 1;
                parent_of.insert(ino.0, d.0);
                q.push_back(ino);
            }
        }
    }
    names.insert(1, 0);
    for (&ino, &n) in &names {
        let a = fs.getattr(Ino(ino)).unwrap();
        let kind = kinds[&ino];
        if kind == FileType::Directory {
            let want = 2 + subdirs.get(&ino).copied().unwrap_or(0);
            if a.nlink != want {
                bad.push(format!("dir {ino}: nlink {} for {want}", a.nlink));
            }
            if ino != 1 {
                let dd = fs.lookup(&ctx, Ino(ino), b"..").unwrap().ino.0;
                if dd != parent_of[&ino] {
                    bad.push(format!("dir {ino}: .. is {dd}, not {}", parent_of[&ino]));
                }
            }
        } else if a.nlink != n {
            bad.push(format!("inode {ino}: nlink {} for {n} names", a.nlink));
        }
        let size = if kind == FileType::Directory {
            0
        } else {
            a.size
        };
        writeln!(
            out,
            "inode {} gen={} mode={:o} nlink={} uid={} gid={} rdev={} size={} mtime={} ctime={}",
            ino,
            a.generation.0,
            a.mode,
            a.nlink,
            a.uid,
            a.gid,
            a.rdev,
            size,
            ts(a.mtime),
            ts(a.ctime)
        )
        .unwrap();
        if matches!(kind, FileType::RegularFile | FileType::Directory) {
            writeln!(out, "  flags={:x}", fs.get_flags(Ino(ino)).unwrap()).unwrap();
        }
        let list = fs.listxattr(&ctx, Ino(ino)).unwrap();
        let mut xs: Vec<&[u8]> = list.split(|&b| b == 0).filter(|n| !n.is_empty()).collect();
        xs.sort();
        for x in xs {
            let v = fs.getxattr(&ctx, Ino(ino), x).unwrap();
            writeln!(out, "  xattr {} = {:?}", String::from_utf8_lossy(x), v).unwrap();
        }
        match kind {
            FileType::RegularFile => {
                let mut buf = vec![0u8; a.size as usize];
                let mut at = 0;
                while at < buf.len() {
                    let n = fs.read_inode(Ino(ino), at as u64, &mut buf[at..]).unwrap();
                    assert!(n > 0, "inode {ino}: short read at {at} of {}", a.size);
                    at += n;
                }
                writeln!(out, "  data len={} fnv={:x}", buf.len(), fnv(&buf)).unwrap();
            }
            FileType::Symlink => {
                let t = fs.readlink(Ino(ino)).unwrap();
                writeln!(out, "  target {:?}", String::from_utf8_lossy(&t)).unwrap();
            }
            _ => {}
        }
    }
    if let Err(e) = fs.check_invariants() {
        bad.push(format!("invariants: {e}"));
    }
    assert!(bad.is_empty(), "inconsistent filesystem: {bad:#?}");
    out
}

/// Syncs, takes the filesystem's snapshot, takes a checkpoint if `checkpoint`, and closes
/// the store; returns the snapshot.
fn close_synced(
    store: lanefs_store::StoreHandle,
    fs: Arc<Filesystem>,
    c: Client,
    checkpoint: bool,
) -> String {
    fs.sync_all().unwrap();
    let want = snapshot(&fs);
    if checkpoint {
        store.checkpoint().unwrap();
    }
    drop(c);
    drop(fs);
    store.close().unwrap();
    want
}

/// Opens the store with `o`, checks that it holds `want` ([`same`]), and closes it.
fn reopens_as(o: Options, what: &str, want: &str) {
    let opened = open(dir(), Config::default(), o).unwrap_or_else(|e| panic!("{what}: {e}"));
    let fs = Arc::new(opened.fs);
    same(what, want, &snapshot(&fs));
    drop(fs);
    opened.store.close().unwrap();
}

fn same(what: &str, want: &str, got: &str) {
    if want == got {
        return;
    }
    let (w, g): (Vec<&str>, Vec<&str>) = (want.lines().collect(), got.lines().collect());
    let mut shown = 0;
    let mut report = String::new();
    for i in 0..w.len().max(g.len()) {
        let (a, b) = (w.get(i).copied(), g.get(i).copied());
        if a != b {
            writeln!(report, "line {i}: want {a:?}\n          got  {b:?}").unwrap();
            shown += 1;
            if shown > 12 {
                break;
            }
        }
    }
    panic!(
        "{what}: the filesystem differs ({} vs {} lines):\n{report}",
        w.len(),
        g.len()
    );
}

/// A valid POSIX ACL xattr value (version 2) granting user `uid` `perm`.
fn acl(uid: u32, perm: u16) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    let mut e = |tag: u16, perm: u16, id: u32| {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    };
    e(0x01, 7, u32::MAX);
    e(0x02, perm, uid);
    e(0x04, 5, u32::MAX);
    e(0x10, 7, u32::MAX);
    e(0x20, 4, u32::MAX);
    v
}

/// Paths known to exist (a workload's view, kept in step with what succeeded).
struct Names {
    dirs: Vec<String>,
    files: Vec<String>,
    next: u64,
}

impl Names {
    fn pick_dir(&self, r: &mut StdRng) -> String {
        self.dirs[r.random_range(0..self.dirs.len())].clone()
    }
    fn pick_file(&self, r: &mut StdRng) -> Option<String> {
        (!self.files.is_empty()).then(|| self.files[r.random_range(0..self.files.len())].clone())
    }
    fn fresh(&mut self, d: &str, p: &str) -> String {
        self.next += 1;
        if d == "/" {
            format!("/{p}{}", self.next)
        } else {
            format!("{d}/{p}{}", self.next)
        }
    }
    fn moved(&mut self, from: &str, to: &str) {
        let pre = format!("{from}/");
        for p in self.dirs.iter_mut().chain(self.files.iter_mut()) {
            if p == from {
                *p = to.to_string();
            } else if let Some(rest) = p.strip_prefix(&pre) {
                *p = format!("{to}/{rest}");
            }
        }
    }
}

/// One random change; returns whether the store was asked for a checkpoint.
fn step(
    c: &Client,
    fs: &Filesystem,
    n: &mut Names,
    open: &mut Vec<lanefs::Fh>,
    r: &mut StdRng,
    ckpt: &dyn Fn(),
) {
    let ctx = Ctx::root();
    let ino = |p: &str| c.symlink_metadata(p).ok().map(|m| m.ino());
    match r.random_range(0..100) {
        0..=24 => {
            let d = n.pick_dir(r);
            let p = n.fresh(&d, "f");
            let len = [0, 1, 4095, 4096, 5000, 70_000][r.random_range(0..6)];
            let byte = r.random::<u8>();
            if c.write(&p, vec![byte; len]).is_ok() {
                n.files.push(p);
            }
        }
        25..=32 => {
            let d = n.pick_dir(r);
            let p = n.fresh(&d, "d");
            if c.create_dir(&p).is_ok() {
                n.dirs.push(p);
            }
        }
        33..=38 => {
            if let Some(f) = n.pick_file(r) {
                let d = n.pick_dir(r);
                let p = n.fresh(&d, "l");
                if c.hard_link(&f, &p).is_ok() {
                    n.files.push(p);
                }
            }
        }
        39..=44 => {
            // A file renamed: to a new name, or over another file.
            if let Some(f) = n.pick_file(r) {
                let to = if r.random_bool(0.5) {
                    n.pick_file(r).unwrap()
                } else {
                    let d = n.pick_dir(r);
                    n.fresh(&d, "r")
                };
                if c.rename(&f, &to).is_ok() && f != to {
                    let replaced = n.files.contains(&to);
                    n.files.retain(|p| *p != f);
                    if !replaced {
                        n.files.push(to);
                    }
                }
            }
        }
        45..=48 => {
            // A directory moved (maybe over an empty one).
            if n.dirs.len() > 1 {
                let d = n.dirs[r.random_range(1..n.dirs.len())].clone();
                let to = if r.random_bool(0.3) {
                    n.pick_dir(r)
                } else {
                    let p = n.pick_dir(r);
                    n.fresh(&p, "m")
                };
                if to != d && c.rename(&d, &to).is_ok() {
                    if n.dirs.contains(&to) {
                        n.dirs.retain(|p| *p != to);
                    }
                    n.moved(&d, &to);
                }
            }
        }
        49..=54 => {
            if let Some(f) = n.pick_file(r) {
                if r.random_bool(0.3)
                    && let Some(i) = ino(&f)
                    && let Ok(fh) = fs.open(&ctx, i, libc::O_RDWR)
                {
                    open.push(fh);
                }
                if c.remove_file(&f).is_ok() {
                    n.files.retain(|p| *p != f);
                }
            }
        }
        55..=56 => {
            if n.dirs.len() > 1 {
                let d = n.dirs[r.random_range(1..n.dirs.len())].clone();
                if c.remove_dir(&d).is_ok() {
                    n.dirs.retain(|p| *p != d);
                }
            }
        }
        57..=62 => {
            // Writes: sparse, past the size, into the middle; truncates.
            if let Some(f) = n.pick_file(r)
                && let Some(i) = ino(&f)
            {
                let off = [0, 100, 4096, 8191, 65_536, 1 << 20][r.random_range(0..6)];
                let len = r.random_range(1..9000);
                let b = r.random::<u8>();
                let _ = fs.write_inode(&ctx, i, off, &vec![b; len]);
                if r.random_bool(0.3) {
                    let _ = c.truncate(&f, r.random_range(0..80_000));
                }
            }
        }
        63..=65 => {
            if let Some(f) = n.pick_file(r)
                && let Some(i) = ino(&f)
            {
                let off = r.random_range(0..20) * 4096;
                let len = r.random_range(1..5) * 4096;
                let mode = if r.random_bool(0.5) {
                    FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
                } else if r.random_bool(0.5) {
                    FALLOC_FL_KEEP_SIZE
                } else {
                    0
                };
                let _ = fs.fallocate_inode(&ctx, i, mode, off, len);
            }
        }
        66..=72 => {
            // xattrs and ACLs, on files and directories.
            let p = if r.random_bool(0.5) {
                n.pick_dir(r)
            } else {
                n.pick_file(r).unwrap_or_else(|| "/".into())
            };
            if let Some(i) = ino(&p) {
                let k = r.random_range(0..6);
                let _ = match k {
                    0 => fs.setxattr(&ctx, i, b"system.posix_acl_access", &acl(1000 + k, 5), 0),
                    1 => fs.setxattr(
                        &ctx,
                        i,
                        b"system.posix_acl_default",
                        &acl(2000 + r.random_range(0..3), 6),
                        0,
                    ),
                    2 => fs.removexattr(&ctx, i, b"user.a"),
                    3 => fs.removexattr(&ctx, i, b"system.posix_acl_default"),
                    _ => fs.setxattr(
                        &ctx,
                        i,
                        format!("user.{}", [b'a', b'b', b'c'][r.random_range(0..3)] as char)
                            .as_bytes(),
                        &vec![r.random::<u8>(); r.random_range(0..300)],
                        0,
                    ),
                };
            }
        }
        73..=76 => {
            let d = n.pick_dir(r);
            let p = n.fresh(&d, "s");
            let _ = c.symlink(format!("target-{}", r.random::<u32>()), &p);
        }
        77..=84 => {
            let p = if r.random_bool(0.5) {
                n.pick_dir(r)
            } else {
                n.pick_file(r).unwrap_or_else(|| "/".into())
            };
            let _ = match r.random_range(0..4) {
                0 => c.set_permissions(&p, 0o700 | r.random_range(0..0o100)),
                1 => c.chown(&p, Some(r.random_range(0..3)), Some(r.random_range(0..3))),
                2 => c.set_times(
                    &p,
                    Some(TimeSet::At(Timespec {
                        sec: r.random_range(0..1 << 30),
                        nsec: 7,
                    })),
                    Some(TimeSet::At(Timespec {
                        sec: r.random_range(0..1 << 30),
                        nsec: r.random_range(0..1_000_000_000),
                    })),
                ),
                _ => {
                    // Immutable and append-only now and then, never on the root.
                    let rare = if p == "/" {
                        0
                    } else {
                        2 * (r.random_range(0..10) == 0) as usize
                    };
                    c.set_flags(
                        &p,
                        [
                            0,
                            FS_NODUMP_FL,
                            FS_NOATIME_FL,
                            FS_NODUMP_FL | FS_NOATIME_FL,
                            0,
                            0,
                            lanefs::FS_APPEND_FL,
                            lanefs::FS_IMMUTABLE_FL,
                        ][r.random_range(0..6) + rare],
                    )
                }
            };
        }
        85..=87 => {
            let d = n.pick_dir(r);
            let p = n.fresh(&d, "n");
            let _ = c.mknod(&p, libc::S_IFIFO | 0o644, 0);
        }
        88..=91 => {
            // Open files closed (orphans freed), numbers reused by the next creates.
            if !open.is_empty() {
                let fh = open.swap_remove(r.random_range(0..open.len()));
                fs.release(fh).unwrap();
            }
        }
        92..=94 => {
            // A burst of creates and removes in one directory (slots taken and given back).
            let d = n.pick_dir(r);
            let mut made = Vec::new();
            for _ in 0..r.random_range(1..40) {
                let p = n.fresh(&d, "b");
                if c.write(&p, b"x").is_ok() {
                    made.push(p);
                }
            }
            for p in made {
                // (An append-only directory keeps its entries.)
                if !r.random_bool(0.7) || c.remove_file(&p).is_err() {
                    n.files.push(p);
                }
            }
        }
        95 => {
            // A tmpfile (an orphan from its start), given a name half the time.
            let d = n.pick_dir(r);
            let mut o = lanefs::OpenOptions::new();
            o.read(true).write(true).mode(0o640);
            if let Ok(f) = c.open_tmpfile(&d, &o) {
                let _ = f.write_at(&vec![3u8; r.random_range(0..10_000)], 0);
                if r.random_bool(0.5) {
                    let p = n.fresh(&d, "t");
                    if c.link_file(&f, &p).is_ok() {
                        n.files.push(p);
                    }
                }
            }
        }
        96 => {
            // Exchange two files, or leave a whiteout where one was.
            if let (Some(a), Some(b)) = (n.pick_file(r), n.pick_file(r))
                && a != b
            {
                if r.random_bool(0.5) {
                    let _ = c.rename_with_flags(&a, &b, lanefs::RENAME_EXCHANGE);
                } else if c.rename_with_flags(&a, &b, lanefs::RENAME_WHITEOUT).is_ok() {
                    n.files.retain(|p| *p != a);
                }
            }
        }
        _ => ckpt(),
    }
}

/// Random workloads of several hundred inodes (more than the 256 slots), checkpoints at
/// random points; after each close and reopen the filesystem is what it was, and it goes on
/// (new entries after the reopen keep the old ones' listing and take fresh cookies).
#[test]
fn random_workloads_survive_checkpoint_and_reopen() {
    for seed in seed::seeds(
        "random_workloads_survive_checkpoint_and_reopen",
        [1, 2, 3, 4],
    ) {
        eprintln!("random_workloads seed {seed}");
        let mut r = StdRng::seed_from_u64(seed);
        let disk = SimDisk::new();
        let segment = if seed % 2 == 0 { 1 << 20 } else { 8 << 20 };
        let mut names = Names {
            dirs: vec!["/".into()],
            files: Vec::new(),
            next: 0,
        };
        let checkpoints = std::cell::Cell::new(0u32);
        for round in 0..3 {
            let o = open(dir(), Config::default(), opts(&disk, segment)).unwrap();
            let fs = Arc::new(o.fs);
            let c = Client::root(fs.clone());
            let mut handles = Vec::new();
            let store = &o.store;
            let ck = || {
                store.checkpoint().unwrap();
                checkpoints.set(checkpoints.get() + 1);
            };
            let steps = if round == 0 { 1500 } else { 600 };
            for _ in 0..steps {
                step(&c, &fs, &mut names, &mut handles, &mut r, &ck);
            }
            checkpoints.set(checkpoints.get() + 1);
            o.store.checkpoint().unwrap();
            // A few more steps journaled after the last checkpoint, half the time.
            if r.random_bool(0.5) {
                for _ in 0..50 {
                    step(&c, &fs, &mut names, &mut handles, &mut r, &|| {});
                }
            }
            fs.sync_all().unwrap();
            let want = snapshot(&fs);
            // The same disk, crashed now, replays to the same state too.
            let image = disk.crash(Unflushed::Lost);
            for fh in handles.drain(..) {
                fs.release(fh).unwrap();
            }
            drop(c);
            drop(fs);
            o.store.close().unwrap();

            fsck::check(dir(), &opts(&disk, segment)).unwrap();
            let o = open(dir(), Config::default(), opts(&disk, segment)).unwrap();
            let fs = Arc::new(o.fs);
            same(
                &format!("seed {seed} round {round} reopen"),
                &want,
                &snapshot(&fs),
            );
            // Entries made after the reopen do not disturb the old ones' order and cookies.
            let c = Client::root(fs.clone());
            let old = want.clone();
            for d in names.dirs.clone().iter().take(20) {
                let p = names.fresh(d, "after");
                if c.write(&p, b"after").is_ok() {
                    names.files.push(p);
                }
            }
            let now = snapshot(&fs);
            for line in old
                .lines()
                .filter(|l| l.starts_with("  ") && l.contains("cookie="))
            {
                assert!(
                    now.contains(line),
                    "seed {seed}: entry {line:?} changed after creates following the reopen"
                );
            }
            fs.sync_all().unwrap();
            drop(c);
            drop(fs);
            o.store.close().unwrap();

            let o = open(dir(), Config::default(), opts(&image, segment)).unwrap();
            let fs = Arc::new(o.fs);
            same(
                &format!("seed {seed} round {round} crash image"),
                &want,
                &snapshot(&fs),
            );
            // The image goes on: its orphans were freed at the open, and their numbers are
            // taken again by creates that a checkpoint applies.
            let c = Client::root(fs.clone());
            for i in 0..300 {
                let p = format!("/img{round}_{i}");
                c.write(&p, vec![i as u8; i * 40]).unwrap();
                if i % 3 == 0 {
                    c.remove_file(&p).unwrap();
                }
            }
            o.store.checkpoint().unwrap();
            fs.sync_all().unwrap();
            let want2 = snapshot(&fs);
            drop(c);
            drop(fs);
            o.store.close().unwrap();
            reopens_as(
                opts(&image, segment),
                &format!("seed {seed} round {round} crash image, again"),
                &want2,
            );
        }
        eprintln!(
            "seed {seed}: {} dirs {} files, {} checkpoints",
            names.dirs.len(),
            names.files.len(),
            checkpoints.get()
        );
    }
}

/// Creates and frees that reuse inode numbers within one checkpoint, with a directory
/// changed in between, in slots shared by many inodes (numbers 256 apart).
#[test]
fn number_reuse_and_slot_collisions_within_one_checkpoint() {
    let disk = SimDisk::new();
    let o = open(dir(), Config::default(), opts(&disk, 8 << 20)).unwrap();
    let fs = Arc::new(o.fs);
    let c = Client::root(fs.clone());
    let ctx = Ctx::root();
    for d in 0..4 {
        c.create_dir(format!("/d{d}")).unwrap();
    }
    o.store.checkpoint().unwrap();
    let mut seen: HashMap<u64, u32> = HashMap::new();
    for round in 0..6 {
        for i in 0..700 {
            let p = format!("/d{}/f{round}_{i}", i % 4);
            c.write(&p, vec![i as u8; i % 3 * 3000]).unwrap();
            let m = c.metadata(&p).unwrap();
            *seen.entry(m.ino().0).or_default() += 1;
            if i % 5 == 0 {
                let ino = m.ino();
                fs.setxattr(&ctx, ino, b"user.k", format!("{round}.{i}").as_bytes(), 0)
                    .unwrap();
            }
            if i % 7 == 0 {
                c.hard_link(&p, format!("/d{}/h{round}_{i}", (i + 1) % 4))
                    .unwrap();
            }
        }
        for i in (0..700).filter(|i| (i + round) % 3 != 0) {
            let p = format!("/d{}/f{round}_{i}", i % 4);
            c.remove_file(&p).unwrap();
        }
        if round % 2 == 1 {
            o.store.checkpoint().unwrap();
        }
    }
    assert!(
        seen.values().any(|&n| n > 1),
        "numbers were reused ({} numbers)",
        seen.len()
    );
    let want = close_synced(o.store, fs, c, true);
    reopens_as(opts(&disk, 8 << 20), "number reuse", &want);
    fsck::check(dir(), &opts(&disk, 8 << 20)).unwrap();
}

/// A directory of more than one window's entries (65,536), hard links to its files from
/// directories across windows, a deep chain of directories, numbers spread out: the load
/// rebuilds it all.
#[test]
fn a_tree_larger_than_a_window_loads() {
    let disk = SimDisk::new();
    let o = open(dir(), Config::default(), opts(&disk, 16 << 20)).unwrap();
    let fs = Arc::new(o.fs);
    let c = Client::root(fs.clone());
    let ctx = Ctx::root();
    c.create_dir("/a").unwrap();
    c.create_dir("/big").unwrap();
    c.create_dir("/z").unwrap();
    let n = 70_000;
    for i in 0..n {
        c.write(format!("/big/f{i}"), b"").unwrap();
        if i % 9_000 == 0 {
            // Removed again: numbers freed in the middle.
            c.create_dir(format!("/a/sub{i}")).unwrap();
        }
    }
    for i in (0..n).step_by(997) {
        c.hard_link(format!("/big/f{i}"), format!("/a/l{i}"))
            .unwrap();
        c.hard_link(format!("/big/f{i}"), format!("/z/l{i}"))
            .unwrap();
        let m = c.metadata(format!("/big/f{i}")).unwrap();
        fs.setxattr(&ctx, m.ino(), b"user.i", format!("{i}").as_bytes(), 0)
            .unwrap();
        fs.write_inode(&ctx, m.ino(), (i as u64) * 13, b"data")
            .unwrap();
    }
    for i in (0..n).step_by(3) {
        c.remove_file(format!("/big/f{i}")).unwrap();
    }
    let mut p = String::from("/z");
    for d in 0..150 {
        p = format!("{p}/d{d}");
        c.create_dir(&p).unwrap();
        c.hard_link("/big/f1", format!("{p}/link")).unwrap();
    }
    // Entries added to the big directory after the walk has passed it in the first window.
    for i in 0..100 {
        c.write(format!("/a/late{i}"), [i as u8]).unwrap();
    }
    let want = close_synced(o.store, fs, c, true);
    let o = open(dir(), Config::default(), opts(&disk, 16 << 20)).unwrap();
    assert!(o.report.loaded > 45_000, "loaded {}", o.report.loaded);
    assert_eq!(o.report.replayed, 0);
    let fs = Arc::new(o.fs);
    same("large tree", &want, &snapshot(&fs));
    // Continued: new entries in the big directory after the reopen.
    let c = Client::root(fs.clone());
    for i in 0..50 {
        c.write(format!("/big/new{i}"), b"").unwrap();
    }
    let now = snapshot(&fs);
    for line in want.lines().filter(|l| l.contains("cookie=")) {
        assert!(now.contains(line), "entry {line:?} changed");
    }
    drop(c);
    drop(fs);
    o.store.close().unwrap();
}

fn checkpoint_len(disk: &SimDisk) -> u64 {
    disk.files()
        .into_iter()
        .find(|(p, _)| p == &PathBuf::from(DIR).join("checkpoint.redb"))
        .map(|(_, d)| d.len() as u64)
        .expect("a checkpoint file")
}

/// A checkpoint mostly free after deletions is compacted at the next open (and what is left
/// reads back, pages out of memory included); one mostly in use is not.
#[test]
fn compaction_at_open_keeps_the_contents() {
    for delete in [true, false] {
        let disk = SimDisk::new();
        let o = open(dir(), Config::default(), opts(&disk, 16 << 20)).unwrap();
        let fs = Arc::new(o.fs);
        let c = Client::root(fs.clone());
        let ctx = Ctx::root();
        c.create_dir("/d").unwrap();
        let mut r = StdRng::seed_from_u64(7);
        for i in 0..70u32 {
            let mut data = vec![0u8; 1 << 20];
            r.fill(&mut data[..]);
            c.write(format!("/d/f{i}"), &data).unwrap();
            let ino = c.metadata(format!("/d/f{i}")).unwrap().ino();
            fs.setxattr(&ctx, ino, b"user.n", &i.to_le_bytes(), 0)
                .unwrap();
            if i % 10 == 0 {
                c.hard_link(format!("/d/f{i}"), format!("/l{i}")).unwrap();
            }
        }
        o.store.checkpoint().unwrap();
        if delete {
            for i in 0..70 {
                if i % 10 != 3 {
                    c.remove_file(format!("/d/f{i}")).unwrap();
                }
            }
            o.store.checkpoint().unwrap();
        }
        let want = close_synced(o.store, fs, c, false);
        let before = checkpoint_len(&disk);
        let o = open(dir(), Config::default(), opts(&disk, 16 << 20)).unwrap();
        let after = checkpoint_len(&disk);
        eprintln!("delete={delete}: checkpoint {before} -> {after} bytes");
        if delete {
            assert!(after < before / 2, "not compacted: {before} -> {after}");
        } else {
            assert!(after >= before * 9 / 10, "compacted: {before} -> {after}");
        }
        let fs = Arc::new(o.fs);
        same(
            &format!("compaction delete={delete}"),
            &want,
            &snapshot(&fs),
        );
        // Goes on: writes over kept pages, a checkpoint, a reopen.
        let c = Client::root(fs.clone());
        c.write("/d/f3", b"rewritten").unwrap();
        let want = close_synced(o.store, fs, c, true);
        fsck::check(dir(), &opts(&disk, 16 << 20)).unwrap();
        reopens_as(
            opts(&disk, 16 << 20),
            &format!("compaction delete={delete}, again"),
            &want,
        );
    }
}

/// A power cut at every flush of a checkpoint (lost, kept and torn writes): the reopened
/// filesystem is the one synced before the checkpoint began.
#[test]
fn power_cuts_during_checkpoints() {
    let mut images_total = 0;
    for seed in seed::seeds("power_cuts_during_checkpoints", [11, 12, 13]) {
        eprintln!("power_cuts seed {seed}");
        let mut r = StdRng::seed_from_u64(seed);
        let disk = SimDisk::new();
        let segment = 1 << 20;
        let o = open(dir(), Config::default(), opts(&disk, segment)).unwrap();
        let fs = Arc::new(o.fs);
        let c = Client::root(fs.clone());
        let mut names = Names {
            dirs: vec!["/".into()],
            files: Vec::new(),
            next: 0,
        };
        let mut handles = Vec::new();
        for round in 0..4 {
            for _ in 0..400 {
                step(&c, &fs, &mut names, &mut handles, &mut r, &|| {});
            }
            fs.sync_all().unwrap();
            let want = snapshot(&fs);
            fs.sync_all().unwrap();
            let ways = move |k: u64, point| {
                vec![match (point, k % 3) {
                    (SyncPoint::Before, 0) => Unflushed::Lost,
                    (SyncPoint::Before, 1) => Unflushed::Torn(seed * 1000 + k),
                    (SyncPoint::Before, _) => Unflushed::Kept,
                    (SyncPoint::After, _) => Unflushed::Torn(seed * 7919 + k),
                }]
            };
            let cuts = PowerCuts::start(&disk, ways, || ());
            o.store.checkpoint().unwrap();
            let images: Vec<(u64, SimDisk)> =
                cuts.take().into_iter().map(|c| (c.call, c.disk)).collect();
            assert!(!images.is_empty(), "the checkpoint flushed nothing");
            for (k, img) in images.iter().step_by(1 + images.len() / 12) {
                images_total += 1;
                reopens_as(
                    opts(img, segment),
                    &format!("seed {seed} round {round} cut at sync {k}"),
                    &want,
                );
            }
        }
        for fh in handles.drain(..) {
            fs.release(fh).unwrap();
        }
        drop(c);
        drop(fs);
        o.store.close().unwrap();
    }
    eprintln!("power cut images opened: {images_total}");
}

/// The cookies of entries removed before a checkpoint are not handed out again after the
/// reopen (whether the entries' files were made and removed within the checkpoint, or the
/// checkpoint before applied their creates).
#[test]
fn cookies_of_removed_entries_are_not_reused_after_reopen() {
    for split in [false, true] {
        let disk = SimDisk::new();
        let o = open(dir(), Config::default(), opts(&disk, 8 << 20)).unwrap();
        let fs = Arc::new(o.fs);
        let c = Client::root(fs.clone());
        let ctx = Ctx::root();
        c.create_dir("/d").unwrap();
        let d = c.metadata("/d").unwrap().ino();
        o.store.checkpoint().unwrap();
        let cookies = |fs: &Filesystem| {
            let end = fs.read_end(d).unwrap();
            let mut v = Vec::new();
            fs.readdir_inode(&ctx, d, 0, &end, false, |e, _| {
                if e.name != b"." && e.name != b".." {
                    v.push(e.offset);
                }
                true
            })
            .unwrap();
            v
        };
        for i in 0..600 {
            c.write(format!("/d/f{i}"), b"x").unwrap();
            if i % 2 == 0 {
                c.hard_link(format!("/d/f{i}"), format!("/h{i}")).unwrap();
            }
        }
        let old = cookies(&fs);
        assert_eq!(old.len(), 600);
        if split {
            o.store.checkpoint().unwrap();
        }
        for i in 0..600 {
            c.remove_file(format!("/d/f{i}")).unwrap();
            if i % 2 == 0 {
                c.remove_file(format!("/h{i}")).unwrap();
            }
        }
        o.store.checkpoint().unwrap();
        drop(c);
        drop(fs);
        o.store.close().unwrap();
        let o = open(dir(), Config::default(), opts(&disk, 8 << 20)).unwrap();
        assert_eq!(o.report.replayed, 0);
        let fs = Arc::new(o.fs);
        let c = Client::root(fs.clone());
        for i in 0..600 {
            c.write(format!("/d/g{i}"), b"y").unwrap();
        }
        let new = cookies(&fs);
        let old: HashSet<u64> = old.into_iter().collect();
        let reused: Vec<u64> = new.iter().copied().filter(|k| old.contains(k)).collect();
        assert!(
            reused.is_empty(),
            "split={split}: {} cookies handed out again after the reopen: {:?}",
            reused.len(),
            &reused[..reused.len().min(5)]
        );
        drop(c);
        drop(fs);
        o.store.close().unwrap();
    }
}

/// Several threads (so several cookie lanes) change the filesystem while the checkpointer
/// takes checkpoints in the background; power cuts are taken at flushes along the way. Every
/// image opens consistent with every file synced before its cut; the store closed at the end
/// reopens as it was.
#[test]
fn background_checkpoints_under_threads_and_power_cuts() {
    for seed in seed::seeds(
        "background_checkpoints_under_threads_and_power_cuts",
        [21, 22],
    ) {
        eprintln!("threads seed {seed}");
        let disk = SimDisk::new();
        let mut o_ = opts(&disk, 1 << 20);
        o_.checkpoint_records = 400;
        o_.checkpoint_poll = Duration::from_millis(2);
        let o = open(dir(), Config::default(), o_.clone()).unwrap();
        let fs = Arc::new(o.fs);
        // (path, contents, xattr) of files synced and never changed again.
        type Frozen = Vec<(String, Vec<u8>, Vec<u8>)>;
        let frozen: Arc<Mutex<Frozen>> = Arc::default();
        let cuts = {
            let fr = frozen.clone();
            let mut taken = 0;
            let ways = move |k: u64, point| {
                if !k.is_multiple_of(29) || taken >= 12 {
                    return vec![];
                }
                taken += 1;
                vec![match point {
                    SyncPoint::Before => Unflushed::Torn(seed ^ k),
                    SyncPoint::After => Unflushed::Lost,
                }]
            };
            PowerCuts::start(&disk, ways, move || fr.lock().unwrap().clone())
        };
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let fs = fs.clone();
                let frozen = frozen.clone();
                std::thread::spawn(move || {
                    let ctx = Ctx::root();
                    let c = Client::root(fs.clone());
                    let mut r = StdRng::seed_from_u64(seed * 100 + t);
                    let me = format!("/t{t}");
                    c.create_dir(&me).unwrap();
                    let _ = c.create_dir("/shared");
                    let mut live: Vec<String> = Vec::new();
                    for i in 0..700 {
                        let p = if i % 2 == 0 {
                            format!("{me}/f{i}")
                        } else {
                            format!("/shared/t{t}_{i}")
                        };
                        let data = vec![(i % 251) as u8; r.random_range(0..6000)];
                        c.write(&p, &data).unwrap();
                        let x = format!("{t}:{i}").into_bytes();
                        let ino = c.metadata(&p).unwrap().ino();
                        fs.setxattr(&ctx, ino, b"user.x", &x, 0).unwrap();
                        match r.random_range(0..10) {
                            0..=3 => live.push(p),
                            4..=5 => c.remove_file(&p).unwrap(),
                            6 => {
                                let q = format!("{p}.moved");
                                c.rename(&p, &q).unwrap();
                                live.push(q);
                            }
                            7 => {
                                c.hard_link(&p, format!("{p}.link")).unwrap();
                                live.push(p);
                            }
                            _ => {
                                fs.sync_all().unwrap();
                                frozen.lock().unwrap().push((p, data, x));
                            }
                        }
                        if r.random_bool(0.2) && !live.is_empty() {
                            let v = live.swap_remove(r.random_range(0..live.len()));
                            c.remove_file(&v).unwrap();
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let images: Vec<(SimDisk, Frozen)> =
            cuts.take().into_iter().map(|c| (c.disk, c.note)).collect();
        fs.sync_all().unwrap();
        let want = snapshot(&fs);
        let frozen_all = frozen.lock().unwrap().clone();
        assert!(
            o.store.checkpoint_lsn() > 0,
            "no background checkpoint was taken"
        );
        eprintln!(
            "seed {seed}: {} frozen files, {} images, checkpoint lsn {}",
            frozen_all.len(),
            images.len(),
            o.store.checkpoint_lsn()
        );
        drop(fs);
        o.store.close().unwrap();
        reopens_as(o_.clone(), &format!("threads seed {seed} reopen"), &want);
        assert!(!images.is_empty());
        for (n, (img, fr)) in images.into_iter().enumerate() {
            let mut oi = opts(&img, 1 << 20);
            oi.checkpoint_poll = Duration::from_secs(3600);
            let o = open(dir(), Config::default(), oi.clone())
                .unwrap_or_else(|e| panic!("seed {seed} image {n}: {e}"));
            let fs = Arc::new(o.fs);
            snapshot(&fs);
            let c = Client::root(fs.clone());
            let ctx = Ctx::root();
            for (p, data, x) in &fr {
                let got = c
                    .read(p)
                    .unwrap_or_else(|e| panic!("seed {seed} image {n}: synced {p} lost: {e}"));
                assert!(
                    got == *data,
                    "seed {seed} image {n}: synced {p} has other bytes"
                );
                let ino = c.metadata(p).unwrap().ino();
                assert_eq!(fs.getxattr(&ctx, ino, b"user.x").unwrap(), *x, "{p}");
            }
            // The image goes on through a checkpoint and a reopen.
            for i in 0..300 {
                c.write(format!("/after{i}"), [i as u8]).unwrap();
            }
            o.store.checkpoint().unwrap();
            fs.sync_all().unwrap();
            let w = snapshot(&fs);
            drop(c);
            drop(fs);
            o.store.close().unwrap();
            reopens_as(oi, &format!("threads seed {seed} image {n} reopen"), &w);
        }
    }
}

/// Power cuts during the compaction an opening does after the load: every image opens to
/// the filesystem that was closed.
#[test]
fn power_cuts_during_open_time_compaction() {
    let disk = SimDisk::new();
    let o = open(dir(), Config::default(), opts(&disk, 16 << 20)).unwrap();
    let fs = Arc::new(o.fs);
    let c = Client::root(fs.clone());
    let mut r = StdRng::seed_from_u64(99);
    for i in 0..50u32 {
        let mut data = vec![0u8; 1 << 20];
        r.fill(&mut data[..]);
        c.write(format!("/f{i}"), &data).unwrap();
    }
    for i in 0..300u32 {
        c.write(format!("/s{i}"), i.to_le_bytes()).unwrap();
    }
    o.store.checkpoint().unwrap();
    for i in 0..50u32 {
        if i % 10 != 0 {
            c.remove_file(format!("/f{i}")).unwrap();
        }
    }
    o.store.checkpoint().unwrap();
    let want = close_synced(o.store, fs, c, false);
    let before = checkpoint_len(&disk);
    // How many flushes an opening makes, counted on a copy; then cuts spread over them.
    let copy = disk.crash(Unflushed::Kept);
    let o = open(dir(), Config::default(), opts(&copy, 16 << 20)).unwrap();
    let syncs = copy.syncs();
    drop(o);
    let every = (syncs / 6).max(1);
    let mut taken = 0;
    let ways = move |k: u64, point| {
        if !(k.is_multiple_of(every) || k + 3 >= syncs) || taken >= 14 {
            return vec![];
        }
        taken += 1;
        vec![match point {
            SyncPoint::Before => Unflushed::Torn(k),
            SyncPoint::After => Unflushed::Lost,
        }]
    };
    let cuts = PowerCuts::start(&disk, ways, || ());
    let o = open(dir(), Config::default(), opts(&disk, 16 << 20)).unwrap();
    let images = cuts.take();
    let after = checkpoint_len(&disk);
    assert!(after < before / 2, "not compacted: {before} -> {after}");
    let fs = Arc::new(o.fs);
    same("compacted", &want, &snapshot(&fs));
    drop(fs);
    o.store.close().unwrap();
    let images: Vec<SimDisk> = images.into_iter().map(|c| c.disk).collect();
    eprintln!(
        "compaction: {before} -> {after} bytes, {} images of {syncs} flushes",
        images.len()
    );
    assert!(!images.is_empty());
    for (n, img) in images.iter().enumerate() {
        reopens_as(opts(img, 16 << 20), &format!("compaction cut {n}"), &want);
    }
}

/// Directories whose numbers share a slot (256 apart) changed in turn within one
/// checkpoint, removed and their numbers taken again by new directories and files in them.
#[test]
fn directories_sharing_slots() {
    let disk = SimDisk::new();
    let o = open(dir(), Config::default(), opts(&disk, 8 << 20)).unwrap();
    let fs = Arc::new(o.fs);
    let c = Client::root(fs.clone());
    let mut by_slot: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for i in 0..1200 {
        let p = format!("/d{i}");
        c.create_dir(&p).unwrap();
        let ino = c.metadata(&p).unwrap().ino().0;
        by_slot.entry(ino % 256).or_default().push(p);
    }
    o.store.checkpoint().unwrap();
    let groups: Vec<Vec<String>> = by_slot.into_values().filter(|g| g.len() >= 3).collect();
    assert!(groups.len() > 10, "{} groups", groups.len());
    for (gi, g) in groups.iter().enumerate().take(40) {
        for round in 0..5 {
            for d in g {
                c.write(format!("{d}/r{round}"), [round as u8]).unwrap();
                c.create_dir(format!("{d}/s{round}")).unwrap();
            }
            for d in g.iter().step_by(2) {
                c.remove_dir(format!("{d}/s{round}")).unwrap();
                c.remove_file(format!("{d}/r{round}")).unwrap();
            }
        }
        // A directory of the group moved under another of it, and one removed whole.
        c.rename(&g[1], format!("{}/moved{gi}", g[0])).unwrap();
        let last = g.last().unwrap();
        if g.len() > 3 {
            for e in c.read_dir(last).unwrap() {
                let p = format!("{last}/{}", String::from_utf8_lossy(&e.name));
                if e.kind == FileType::Directory {
                    c.remove_dir(&p).unwrap();
                } else {
                    c.remove_file(&p).unwrap();
                }
            }
            c.remove_dir(last).unwrap();
            c.create_dir(format!("/again{gi}")).unwrap();
            c.write(format!("/again{gi}/x"), b"x").unwrap();
        }
    }
    let want = close_synced(o.store, fs, c, true);
    let o = open(dir(), Config::default(), opts(&disk, 8 << 20)).unwrap();
    assert_eq!(o.report.replayed, 0);
    let fs = Arc::new(o.fs);
    same("directories sharing slots", &want, &snapshot(&fs));
    drop(fs);
    o.store.close().unwrap();
}
