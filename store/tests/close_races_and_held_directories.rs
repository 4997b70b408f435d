//! Changes racing the store's close, and eviction of a cache with held directories, checked
//! through the public API against models:
//!
//! 1. `Committer::append` / `shutdown` (store/src/commit.rs): a change whose call returned
//!    `Ok` while `StoreHandle::close()` (or a drop of the handle) raced it is durable. Worker
//!    threads create, write, link, rename, unlink, mkdir and rmdir through the `Filesystem`
//!    API, each in a directory of its own, while another thread closes or drops the store at
//!    a random moment; every call's result is recorded. The store is then reopened from the
//!    image a power cut right after the close would leave (`Unflushed::Lost`): each worker's
//!    directory must be exactly what its acknowledged calls made (every `Ok` there, no
//!    refused change there), no call may succeed after one of its thread's was refused with
//!    EROFS, changes after the close are refused with EROFS, and the tree is consistent.
//!
//! 2. Held directories and eviction (engine/src/fs/lazy.rs, "Eviction"): a lazily opened
//!    store with a small inode cache, with threads that open and close directory handles and
//!    take and forget kernel lookups on many directories while others create, unlink, link,
//!    write and rename (within and across directories, directories too), list through handles
//!    (each entry once, the listing exact; a listing resumed by cookie after the directory was
//!    let go and evicted), and run eviction passes and checkpoints in a loop. Checked against
//!    a model: names map to the right inodes, link counts, `..`, file contents; nothing lost
//!    after everything is evicted and read again; `check_invariants`; once every holder let
//!    go, passes bring the cache within its budget plus the root's held entries (and a
//!    directory let go makes a pass due by itself); the tree the same after a reopen.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use lanefs::{Config, Ctx, Errno, FileType, Filesystem, Ino, ROOT_INO};
use lanefs_store::StoreHandle;
use lanefs_store::disk::{SimDisk, Unflushed};
use parking_lot::{Mutex, RwLock};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn store_dir() -> &'static Path {
    Path::new("/held_attack")
}

fn ctx() -> Ctx {
    Ctx::root()
}

fn read_all(fs: &Filesystem, ino: Ino) -> Vec<u8> {
    let a = fs.getattr(ino).unwrap();
    let fh = fs
        .open(&ctx(), ino, libc::O_RDONLY | libc::O_NOATIME)
        .unwrap();
    let mut buf = vec![0u8; a.size as usize + 16];
    let n = fs.read(fh, 0, &mut buf).unwrap();
    fs.release(fh).unwrap();
    buf.truncate(n);
    buf
}

/// The entries of directory `dir` (without `.` and `..`) as one full listing through a fresh
/// handle, panicking on a name or cookie listed twice.
fn list(fs: &Filesystem, dir: Ino) -> BTreeMap<Vec<u8>, Ino> {
    let fh = fs.opendir_flags(&ctx(), dir, libc::O_NOATIME).unwrap();
    let out = list_fh(fs, fh, 0, usize::MAX).0;
    fs.releasedir(fh).unwrap();
    out
}

/// Reads through `fh` from `offset`, at most `max` entries (not `.`/`..`); the entries and the
/// cookie of the last one read (or `offset`). Duplicate names or cookies panic.
fn list_fh(fs: &Filesystem, fh: u64, offset: u64, max: usize) -> (BTreeMap<Vec<u8>, Ino>, u64) {
    let mut out = BTreeMap::new();
    let mut cookies = HashSet::new();
    let mut last = offset;
    let mut dup = None;
    fs.readdir(&ctx(), fh, offset, false, |e, _| {
        if e.name == b"." || e.name == b".." {
            last = e.offset;
            return true;
        }
        if out.len() >= max {
            return false;
        }
        if !cookies.insert(e.offset) || out.insert(e.name.to_vec(), e.ino).is_some() {
            dup = Some((String::from_utf8_lossy(e.name).into_owned(), e.offset));
        }
        last = e.offset;
        true
    })
    .unwrap();
    if let Some((n, o)) = dup {
        panic!("listing of a directory returned {n:?} (cookie {o}) twice");
    }
    (out, last)
}

// ------------------------------------------------------------------------------------------
// Change 1: acknowledged changes survive a racing close or drop.
// ------------------------------------------------------------------------------------------

/// What a worker's acknowledged call does to its model.
type ModelChange = Box<dyn FnOnce(&mut Owned)>;

/// What a holder thread still holds when it stops: directory handles and kernel lookups.
type HeldOut = (Vec<u64>, Vec<Ino>);

#[derive(Clone, Debug, Default, PartialEq)]
struct Owned {
    /// name -> file id
    names: BTreeMap<Vec<u8>, u32>,
    /// file id -> (ino, content)
    files: BTreeMap<u32, (Ino, Vec<u8>)>,
    /// empty subdirectories: name -> ino
    dirs: BTreeMap<Vec<u8>, Ino>,
}

#[derive(Debug)]
struct WorkerLog {
    dir: Ino,
    model: Owned,
    calls: u64,
    acked: u64,
    /// (call index, op) of a call that returned Ok after one of this thread's was refused.
    ok_after_refusal: Option<(u64, String)>,
    first_refusal: Option<(u64, String)>,
}

/// One worker: ops on its own directory `dir` until refused, then a few more, all of which
/// must be refused too.
fn close_worker(fs: &Filesystem, dir: Ino, seed: u64, id: usize) -> WorkerLog {
    let mut rng = StdRng::seed_from_u64(seed ^ (id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut m = Owned::default();
    let mut log = WorkerLog {
        dir,
        model: Owned::default(),
        calls: 0,
        acked: 0,
        ok_after_refusal: None,
        first_refusal: None,
    };
    let mut next_fid = 0u32;
    let mut after_refusal = 0;
    loop {
        if log.first_refusal.is_some() {
            after_refusal += 1;
            if after_refusal > 8 {
                break;
            }
        }
        if log.calls > 20_000 {
            break;
        }
        let fresh =
            |rng: &mut StdRng| format!("n{}", rng.random_range(0..1_000_000u32)).into_bytes();
        let pick_name = |rng: &mut StdRng, m: &Owned| -> Option<Vec<u8>> {
            if m.names.is_empty() {
                return None;
            }
            let k = rng.random_range(0..m.names.len());
            m.names.keys().nth(k).cloned()
        };
        let choice = rng.random_range(0..100);
        // Each arm: a call that must append (or is refused), its description, and what the
        // model becomes if it returns Ok.
        let (desc, r): (String, lanefs::Result<ModelChange>) = if choice < 30 || m.names.is_empty()
        {
            let name = fresh(&mut rng);
            if m.names.contains_key(&name) || m.dirs.contains_key(&name) {
                continue;
            }
            let data = common::pattern(rng.random(), rng.random_range(1..3000));
            let fid = next_fid;
            next_fid += 1;
            // create, then a write through the handle: two calls, recorded one by one.
            let desc = format!("create {}", String::from_utf8_lossy(&name));
            match fs.create(&ctx(), dir, &name, 0o644, libc::O_RDWR | libc::O_EXCL) {
                Ok((a, fh)) => {
                    note(&mut log, true, &desc);
                    let ino = a.ino;
                    m.names.insert(name.clone(), fid);
                    m.files.insert(fid, (ino, Vec::new()));
                    let wdesc = format!(
                        "write {} bytes to new {}",
                        data.len(),
                        String::from_utf8_lossy(&name)
                    );
                    let w = fs.write(&ctx(), fh, 0, &data);
                    let _ = fs.release(fh);
                    match w {
                        Ok(n) => {
                            assert_eq!(n, data.len());
                            (
                                wdesc,
                                Ok(Box::new(move |m: &mut Owned| {
                                    m.files.get_mut(&fid).unwrap().1 = data;
                                })),
                            )
                        }
                        Err(e) => (wdesc, Err(e)),
                    }
                }
                Err(e) => (desc, Err(e)),
            }
        } else if choice < 50 {
            let name = pick_name(&mut rng, &m).unwrap();
            let fid = m.names[&name];
            let ino = m.files[&fid].0;
            let off = rng.random_range(0..4000u64);
            let data = common::pattern(rng.random(), rng.random_range(1..2000));
            let desc = format!(
                "write {} at {off} to {}",
                data.len(),
                String::from_utf8_lossy(&name)
            );
            match fs.open(&ctx(), ino, libc::O_RDWR) {
                Ok(fh) => {
                    let w = fs.write(&ctx(), fh, off, &data);
                    let _ = fs.release(fh);
                    match w {
                        Ok(n) => {
                            assert_eq!(n, data.len());
                            (
                                desc,
                                Ok(Box::new(move |m: &mut Owned| {
                                    common::model_write(
                                        &mut m.files.get_mut(&fid).unwrap().1,
                                        off,
                                        &data,
                                    );
                                })),
                            )
                        }
                        Err(e) => (desc, Err(e)),
                    }
                }
                Err(e) => (desc, Err(e)),
            }
        } else if choice < 65 {
            let from = pick_name(&mut rng, &m).unwrap();
            let to = if rng.random_bool(0.3) {
                pick_name(&mut rng, &m).unwrap()
            } else {
                fresh(&mut rng)
            };
            if m.dirs.contains_key(&to) || m.names.get(&to) == m.names.get(&from) {
                // A rename between two names of one inode (or a name and itself) changes
                // nothing and appends nothing: not a call that must be refused.
                continue;
            }
            let desc = format!(
                "rename {} -> {}",
                String::from_utf8_lossy(&from),
                String::from_utf8_lossy(&to)
            );
            let r = fs.rename(&ctx(), dir, &from, dir, &to, 0);
            (
                desc,
                r.map(|()| -> Box<dyn FnOnce(&mut Owned)> {
                    Box::new(move |m: &mut Owned| {
                        let fid = m.names[&from];
                        if m.names.get(&to) == Some(&fid) {
                            return; // same inode: nothing happens
                        }
                        m.names.remove(&from);
                        if let Some(old) = m.names.insert(to, fid)
                            && !m.names.values().any(|&f| f == old)
                        {
                            m.files.remove(&old);
                        }
                    })
                }),
            )
        } else if choice < 75 {
            let from = pick_name(&mut rng, &m).unwrap();
            let to = fresh(&mut rng);
            if m.names.contains_key(&to) || m.dirs.contains_key(&to) {
                continue;
            }
            let fid = m.names[&from];
            let ino = m.files[&fid].0;
            let desc = format!(
                "link {} -> {}",
                String::from_utf8_lossy(&from),
                String::from_utf8_lossy(&to)
            );
            let r = fs.link(&ctx(), ino, dir, &to);
            (
                desc,
                r.map(|_| -> Box<dyn FnOnce(&mut Owned)> {
                    Box::new(move |m: &mut Owned| {
                        m.names.insert(to, fid);
                    })
                }),
            )
        } else if choice < 90 {
            let name = pick_name(&mut rng, &m).unwrap();
            let desc = format!("unlink {}", String::from_utf8_lossy(&name));
            let r = fs.unlink(&ctx(), dir, &name);
            (
                desc,
                r.map(|()| -> Box<dyn FnOnce(&mut Owned)> {
                    Box::new(move |m: &mut Owned| {
                        let fid = m.names.remove(&name).unwrap();
                        if !m.names.values().any(|&f| f == fid) {
                            m.files.remove(&fid);
                        }
                    })
                }),
            )
        } else if choice < 96 || m.dirs.is_empty() {
            let name = fresh(&mut rng);
            if m.names.contains_key(&name) || m.dirs.contains_key(&name) {
                continue;
            }
            let desc = format!("mkdir {}", String::from_utf8_lossy(&name));
            let r = fs.mkdir(&ctx(), dir, &name, 0o755);
            (
                desc,
                r.map(|a| -> Box<dyn FnOnce(&mut Owned)> {
                    Box::new(move |m: &mut Owned| {
                        m.dirs.insert(name, a.ino);
                    })
                }),
            )
        } else {
            let k = rng.random_range(0..m.dirs.len());
            let name = m.dirs.keys().nth(k).cloned().unwrap();
            let desc = format!("rmdir {}", String::from_utf8_lossy(&name));
            let r = fs.rmdir(&ctx(), dir, &name);
            (
                desc,
                r.map(|()| -> Box<dyn FnOnce(&mut Owned)> {
                    Box::new(move |m: &mut Owned| {
                        m.dirs.remove(&name);
                    })
                }),
            )
        };
        match r {
            Ok(apply) => {
                apply(&mut m);
                note(&mut log, true, &desc);
            }
            Err(e) if e == Errno::EROFS => note(&mut log, false, &desc),
            Err(e) => panic!("worker {id}: {desc}: unexpected error {e:?}"),
        }
    }
    log.model = m;
    log
}

fn note(log: &mut WorkerLog, ok: bool, desc: &str) {
    log.calls += 1;
    if ok {
        log.acked += 1;
        if log.first_refusal.is_some() && log.ok_after_refusal.is_none() {
            log.ok_after_refusal = Some((log.calls, desc.to_string()));
        }
    } else if log.first_refusal.is_none() {
        log.first_refusal = Some((log.calls, desc.to_string()));
    }
}

/// What worker directory `dir` holds after a reopen, as an `Owned` keyed by the names'
/// inodes (file ids are the model's: mapped through the inodes).
fn observed(fs: &Filesystem, dir: Ino, want: &Owned) -> Result<(), String> {
    let listed = list(fs, dir);
    let want_names: BTreeSet<&Vec<u8>> = want.names.keys().chain(want.dirs.keys()).collect();
    let got_names: BTreeSet<&Vec<u8>> = listed.keys().collect();
    if want_names != got_names {
        let missing: Vec<_> = want_names
            .difference(&got_names)
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .collect();
        let extra: Vec<_> = got_names
            .difference(&want_names)
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .collect();
        return Err(format!(
            "names differ: acknowledged but missing {missing:?}, present but never acknowledged {extra:?}"
        ));
    }
    for (name, fid) in &want.names {
        let (ino, content) = &want.files[fid];
        if listed[name] != *ino {
            return Err(format!(
                "{}: ino {:?}, want {ino:?}",
                String::from_utf8_lossy(name),
                listed[name]
            ));
        }
        let a = fs
            .getattr(*ino)
            .map_err(|e| format!("getattr {ino:?}: {e:?}"))?;
        let links = want.names.values().filter(|&&f| f == *fid).count() as u32;
        if a.nlink != links {
            return Err(format!(
                "{}: nlink {}, want {links}",
                String::from_utf8_lossy(name),
                a.nlink
            ));
        }
        let got = read_all(fs, *ino);
        if got != *content {
            return Err(format!(
                "{}: content differs (len {} want {})",
                String::from_utf8_lossy(name),
                got.len(),
                content.len()
            ));
        }
    }
    for (name, ino) in &want.dirs {
        if listed[name] != *ino {
            return Err(format!(
                "dir {}: ino differs",
                String::from_utf8_lossy(name)
            ));
        }
    }
    Ok(())
}

fn close_race_rounds(what: &str, drop_instead: bool) {
    let seed = common::seed::seed(what);
    let mut rng = StdRng::seed_from_u64(seed);
    let _w = common::Watchdog::new(what, Duration::from_secs(600));
    let start = Instant::now();
    let mut rounds = 0;
    let mut total_acked = 0u64;
    let mut total_refused = 0u64;
    while rounds < 40 && start.elapsed() < Duration::from_secs(12) {
        rounds += 1;
        let round_seed: u64 = rng.random();
        let disk = SimDisk::new();
        let o = lanefs_store::open(
            store_dir(),
            Config::default(),
            common::lazy_opts(&disk, false),
        )
        .unwrap();
        let fs = Arc::new(o.fs);
        let store = o.store;
        let workers = rng.random_range(2..=6usize);
        let dirs: Vec<Ino> = (0..workers)
            .map(|i| {
                fs.mkdir(&ctx(), ROOT_INO, format!("w{i}").as_bytes(), 0o755)
                    .unwrap()
                    .ino
            })
            .collect();
        store.sync().unwrap();
        let delay = Duration::from_micros(match rng.random_range(0..4) {
            0 => 0,
            1 => rng.random_range(0..200),
            2 => rng.random_range(0..3000),
            _ => rng.random_range(0..20_000),
        });
        let syncer = rng.random_bool(0.5);
        let barrier = Arc::new(Barrier::new(workers + 1 + syncer as usize));
        let stop = Arc::new(AtomicBool::new(false));
        let handles: Vec<_> = dirs
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                let (fs, b) = (fs.clone(), barrier.clone());
                std::thread::spawn(move || {
                    b.wait();
                    close_worker(&fs, d, round_seed, i)
                })
            })
            .collect();
        // Sometimes an fsync-er on the side: syncs that return Ok must be durable, too, and
        // make rounds happen in the middle of the race.
        let sync_thread = syncer.then(|| {
            let (fs, b, stop) = (fs.clone(), barrier.clone(), stop.clone());
            std::thread::spawn(move || {
                b.wait();
                let mut ok = 0u64;
                while !stop.load(Relaxed) {
                    match fs.sync_all() {
                        Ok(()) => ok += 1,
                        // A closed store answers every sync EIO (commit.rs, `sync_then_as`:
                        // "Closed: no sync succeeds"); a stopped one EROFS-refuses changes.
                        Err(e) if e == Errno::EROFS || e == Errno::EIO => {}
                        Err(e) => panic!("sync_all: {e:?}"),
                    }
                    std::thread::yield_now();
                }
                ok
            })
        });
        barrier.wait();
        std::thread::sleep(delay);
        let closed = if drop_instead {
            drop(store);
            Ok(())
        } else {
            store.close()
        };
        let logs: Vec<WorkerLog> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        stop.store(true, Relaxed);
        if let Some(t) = sync_thread {
            t.join().unwrap();
        }
        closed.unwrap_or_else(|e| panic!("{what} seed {seed} round {rounds}: close failed: {e:?}"));
        // After the close, every change is refused.
        assert_eq!(
            fs.mkdir(&ctx(), ROOT_INO, b"after-close", 0o755).err(),
            Some(Errno::EROFS),
            "{what} seed {seed} round {rounds}: a change after close was not refused with EROFS"
        );
        for (i, l) in logs.iter().enumerate() {
            assert!(
                l.ok_after_refusal.is_none(),
                "{what} seed {seed} round {rounds}: worker {i}: call {:?} returned Ok after call {:?} was refused",
                l.ok_after_refusal,
                l.first_refusal
            );
            assert!(
                l.first_refusal.is_some(),
                "worker {i} never refused (ran out of calls)"
            );
            total_acked += l.acked;
            total_refused += l.calls - l.acked;
        }
        drop(Arc::try_unwrap(fs).unwrap_or_else(|_| panic!("no other reference")));
        // The image a power cut right after the close leaves: everything acknowledged was
        // flushed by the close.
        for how in [Unflushed::Lost, Unflushed::Kept] {
            let img = disk.crash(how);
            let o = lanefs_store::open(
                store_dir(),
                Config::default(),
                common::lazy_opts(&img, false),
            )
            .unwrap_or_else(|e| panic!("{what} seed {seed} round {rounds}: reopen ({how:?}): {e}"));
            o.fs.check_invariants().unwrap_or_else(|e| {
                panic!("{what} seed {seed} round {rounds}: invariants after reopen ({how:?}): {e}")
            });
            let root = list(&o.fs, ROOT_INO);
            assert_eq!(
                root.len(),
                workers,
                "{what} seed {seed} round {rounds}: root after reopen: {root:?}"
            );
            for (i, l) in logs.iter().enumerate() {
                if let Err(e) = observed(&o.fs, l.dir, &l.model) {
                    panic!(
                        "{what} seed {seed} round {rounds} (delay {delay:?}, image {how:?}): worker {i} \
                         ({} calls, {} acknowledged, first refused: {:?}): {e}",
                        l.calls, l.acked, l.first_refusal
                    );
                }
            }
            o.store.close().unwrap();
        }
    }
    eprintln!(
        "{what}: seed {seed}: {rounds} rounds, {total_acked} calls acknowledged, {total_refused} refused, {:?}",
        start.elapsed()
    );
}

#[test]
fn acked_changes_survive_racing_close() {
    close_race_rounds("acked_changes_survive_racing_close", false);
}

#[test]
fn acked_changes_survive_racing_drop() {
    close_race_rounds("acked_changes_survive_racing_drop", true);
}

// ------------------------------------------------------------------------------------------
// Change 2: held directories and eviction.
// ------------------------------------------------------------------------------------------

/// The namespace as the test made it.
#[derive(Clone, Debug, Default)]
struct Model {
    /// dir ino -> (parent ino, names -> ino)
    dirs: BTreeMap<Ino, (Ino, BTreeMap<Vec<u8>, Ino>)>,
    /// file ino -> content
    files: HashMap<Ino, Vec<u8>>,
    /// Fixed directories (never moved or removed), and movable ones (moved among the fixed).
    fixed: Vec<Ino>,
    movable: Vec<Ino>,
}

impl Model {
    fn kind(&self, ino: Ino) -> FileType {
        if self.dirs.contains_key(&ino) {
            FileType::Directory
        } else {
            FileType::RegularFile
        }
    }
    fn links(&self, ino: Ino) -> u32 {
        if let Some((_, names)) = self.dirs.get(&ino) {
            2 + names.values().filter(|i| self.dirs.contains_key(i)).count() as u32
        } else {
            self.dirs
                .values()
                .map(|(_, n)| n.values().filter(|&&i| i == ino).count() as u32)
                .sum()
        }
    }
    fn all_dirs(&self) -> Vec<Ino> {
        self.dirs.keys().copied().collect()
    }
}

/// Checks every name, link count, `..` and content of `m` against `fs`.
fn check_model(fs: &Filesystem, m: &Model, what: &str) {
    for (&dir, (parent, names)) in &m.dirs {
        let listed = list(fs, dir);
        if &listed != names {
            let want: BTreeSet<_> = names.iter().collect();
            let got: BTreeSet<_> = listed.iter().collect();
            let missing: Vec<_> = want.difference(&got).collect();
            let extra: Vec<_> = got.difference(&want).collect();
            panic!("{what}: listing of dir {dir:?} differs: missing {missing:?}, extra {extra:?}");
        }
        let dotdot = fs.lookup(&ctx(), dir, b"..").unwrap().ino;
        assert_eq!(dotdot, *parent, "{what}: `..` of {dir:?}");
        let a = fs.getattr(dir).unwrap();
        assert_eq!(a.kind(), FileType::Directory);
        assert_eq!(a.nlink, m.links(dir), "{what}: nlink of dir {dir:?}");
        for (name, &ino) in names {
            let a = fs.lookup(&ctx(), dir, name).unwrap_or_else(|e| {
                panic!(
                    "{what}: lookup {dir:?}/{}: {e:?}",
                    String::from_utf8_lossy(name)
                )
            });
            assert_eq!(
                a.ino,
                ino,
                "{what}: {dir:?}/{} names the wrong inode",
                String::from_utf8_lossy(name)
            );
            assert_eq!(a.kind(), m.kind(ino), "{what}: kind of {ino:?}");
            assert_eq!(
                a.nlink,
                m.links(ino),
                "{what}: nlink of {ino:?} ({dir:?}/{})",
                String::from_utf8_lossy(name)
            );
        }
    }
    for (&ino, content) in &m.files {
        let got = read_all(fs, ino);
        assert!(
            got == *content,
            "{what}: content of {ino:?} differs (len {} want {})",
            got.len(),
            content.len()
        );
    }
}

const FIXED: usize = 12;
const FILES: usize = 30;
const MOVABLE: usize = 5;

/// Makes the store: fixed dirs `/d<k>` with files, movable dirs `/d<k>/m<i>` with a few files;
/// checkpointed and closed. Returns the model.
fn make_store(disk: &SimDisk, seed: u64) -> Model {
    let o = lanefs_store::open(
        store_dir(),
        Config::default(),
        common::lazy_opts(disk, false),
    )
    .unwrap();
    let fs = &o.fs;
    let mut m = Model::default();
    m.dirs.insert(ROOT_INO, (ROOT_INO, BTreeMap::new()));
    let mut rng = StdRng::seed_from_u64(seed);
    let mk_file = |m: &mut Model, dir: Ino, name: Vec<u8>, rng: &mut StdRng| {
        let data = common::pattern(rng.random(), rng.random_range(1..600));
        let (a, fh) = fs
            .create(&ctx(), dir, &name, 0o644, libc::O_RDWR | libc::O_EXCL)
            .unwrap();
        fs.write(&ctx(), fh, 0, &data).unwrap();
        fs.release(fh).unwrap();
        m.files.insert(a.ino, data);
        m.dirs.get_mut(&dir).unwrap().1.insert(name, a.ino);
    };
    for k in 0..FIXED {
        let name = format!("d{k}").into_bytes();
        let a = fs.mkdir(&ctx(), ROOT_INO, &name, 0o755).unwrap();
        m.dirs.get_mut(&ROOT_INO).unwrap().1.insert(name, a.ino);
        m.dirs.insert(a.ino, (ROOT_INO, BTreeMap::new()));
        m.fixed.push(a.ino);
        for j in 0..FILES {
            mk_file(&mut m, a.ino, format!("f{j}").into_bytes(), &mut rng);
        }
    }
    for i in 0..MOVABLE {
        let parent = m.fixed[i % FIXED];
        let name = format!("m{i}").into_bytes();
        let a = fs.mkdir(&ctx(), parent, &name, 0o755).unwrap();
        m.dirs.get_mut(&parent).unwrap().1.insert(name, a.ino);
        m.dirs.insert(a.ino, (parent, BTreeMap::new()));
        m.movable.push(a.ino);
        for j in 0..6 {
            mk_file(&mut m, a.ino, format!("g{j}").into_bytes(), &mut rng);
        }
    }
    check_model(fs, &m, "made");
    o.store.checkpoint().unwrap();
    common::close_unshared(Arc::new(o.fs), o.store);
    m
}

fn open_lazy(disk: &SimDisk, budget_inodes: u64) -> (Arc<Filesystem>, Arc<StoreHandle>) {
    let cfg = Config {
        inode_cache: Some(budget_inodes * lanefs::INODE_BYTES),
        ..Config::default()
    };
    let o = lanefs_store::open(store_dir(), cfg, common::lazy_opts(disk, true)).unwrap();
    assert!(o.report.lazy, "the store opens lazily");
    let store = Arc::new(o.store);
    // Nothing is evicted before a checkpoint taken after the open.
    store.checkpoint().unwrap();
    (Arc::new(o.fs), store)
}

/// One random change of the namespace, made and modelled under the model's write lock.
fn mutate(fs: &Filesystem, m: &mut Model, rng: &mut StdRng, next: &mut u64) {
    let dirs = m.all_dirs();
    let rand_dir = |rng: &mut StdRng| dirs[rng.random_range(0..dirs.len())];
    let rand_file = |m: &Model, rng: &mut StdRng| -> Option<(Ino, Vec<u8>, Ino)> {
        // A random (dir, name) naming a file.
        for _ in 0..8 {
            let d = m.all_dirs()[rng.random_range(0..m.dirs.len())];
            let names = &m.dirs[&d].1;
            let files: Vec<_> = names
                .iter()
                .filter(|(_, i)| !m.dirs.contains_key(i))
                .collect();
            if !files.is_empty() {
                let (n, i) = files[rng.random_range(0..files.len())];
                return Some((d, n.clone(), *i));
            }
        }
        None
    };
    let mut fresh = || {
        *next += 1;
        format!("x{next}").into_bytes()
    };
    match rng.random_range(0..100) {
        0..25 => {
            let d = rand_dir(rng);
            let name = fresh();
            let data = common::pattern(rng.random(), rng.random_range(1..400));
            let (a, fh) = fs
                .create(&ctx(), d, &name, 0o644, libc::O_RDWR | libc::O_EXCL)
                .unwrap();
            fs.write(&ctx(), fh, 0, &data).unwrap();
            fs.release(fh).unwrap();
            m.files.insert(a.ino, data);
            m.dirs.get_mut(&d).unwrap().1.insert(name, a.ino);
        }
        25..42 => {
            let Some((d, name, ino)) = rand_file(m, rng) else {
                return;
            };
            fs.unlink(&ctx(), d, &name).unwrap();
            m.dirs.get_mut(&d).unwrap().1.remove(&name);
            if m.links(ino) == 0 {
                m.files.remove(&ino);
            }
        }
        42..70 => {
            // Rename a file, within its directory or across, sometimes over another file.
            let Some((d, name, ino)) = rand_file(m, rng) else {
                return;
            };
            let nd = if rng.random_bool(0.4) {
                d
            } else {
                rand_dir(rng)
            };
            let target = if rng.random_bool(0.3) {
                match rand_file(m, rng) {
                    Some((d2, n2, _)) if d2 == nd => n2,
                    _ => fresh(),
                }
            } else {
                fresh()
            };
            fs.rename(&ctx(), d, &name, nd, &target, 0)
                .unwrap_or_else(|e| {
                    panic!(
                        "rename {d:?}/{} -> {nd:?}/{}: {e:?}",
                        String::from_utf8_lossy(&name),
                        String::from_utf8_lossy(&target)
                    )
                });
            if m.dirs[&nd].1.get(&target) == Some(&ino) {
                return; // two names of one inode: nothing happens
            }
            m.dirs.get_mut(&d).unwrap().1.remove(&name);
            if let Some(old) = m.dirs.get_mut(&nd).unwrap().1.insert(target, ino)
                && m.links(old) == 0
            {
                m.files.remove(&old);
            }
        }
        70..80 => {
            let Some((_, _, ino)) = rand_file(m, rng) else {
                return;
            };
            let d = rand_dir(rng);
            let name = fresh();
            fs.link(&ctx(), ino, d, &name).unwrap();
            m.dirs.get_mut(&d).unwrap().1.insert(name, ino);
        }
        80..88 => {
            let Some((_, _, ino)) = rand_file(m, rng) else {
                return;
            };
            let data = common::pattern(rng.random(), rng.random_range(1..300));
            let off = rng.random_range(0..500u64);
            let fh = fs.open(&ctx(), ino, libc::O_RDWR).unwrap();
            fs.write(&ctx(), fh, off, &data).unwrap();
            fs.release(fh).unwrap();
            common::model_write(m.files.get_mut(&ino).unwrap(), off, &data);
        }
        _ => {
            // Move a movable directory to another fixed directory (or within its own).
            let md = m.movable[rng.random_range(0..m.movable.len())];
            let parent = m.dirs[&md].0;
            let name = m.dirs[&parent]
                .1
                .iter()
                .find(|(_, i)| **i == md)
                .unwrap()
                .0
                .clone();
            let np = m.fixed[rng.random_range(0..m.fixed.len())];
            let nn = fresh();
            fs.rename(&ctx(), parent, &name, np, &nn, 0).unwrap();
            m.dirs.get_mut(&parent).unwrap().1.remove(&name);
            m.dirs.get_mut(&np).unwrap().1.insert(nn, md);
            m.dirs.get_mut(&md).unwrap().0 = np;
        }
    }
}

struct Shared {
    fs: Arc<Filesystem>,
    store: Arc<StoreHandle>,
    model: RwLock<Model>,
    stop: AtomicBool,
    listings: AtomicU64,
    resumed: AtomicU64,
    kernel_lookups: AtomicU64,
    passes: AtomicU64,
}

#[test]
fn held_directories_under_churn() {
    let what = "held_directories_under_churn";
    let seed = common::seed::seed(what);
    let _w = common::Watchdog::new(what, Duration::from_secs(600));
    let t0 = Instant::now();
    let disk = SimDisk::new();
    let model = make_store(&disk, seed);
    let budget = 64u64;
    let (fs, store) = open_lazy(&disk, budget);
    let sh = Arc::new(Shared {
        fs: fs.clone(),
        store: store.clone(),
        model: RwLock::new(model),
        stop: AtomicBool::new(false),
        listings: AtomicU64::new(0),
        resumed: AtomicU64::new(0),
        kernel_lookups: AtomicU64::new(0),
        passes: AtomicU64::new(0),
    });
    let run_for = Duration::from_secs(7);
    let mut threads: Vec<std::thread::JoinHandle<()>> = Vec::new();
    let next = Arc::new(Mutex::new(0u64));

    // Mutators.
    for t in 0..2u64 {
        let (sh, next) = (sh.clone(), next.clone());
        threads.push(std::thread::spawn(move || {
            let mut rng = StdRng::seed_from_u64(seed ^ (0x100 + t));
            let mut n = 0u64;
            while !sh.stop.load(Relaxed) {
                let mut m = sh.model.write();
                let mut nx = next.lock();
                mutate(&sh.fs, &mut m, &mut rng, &mut nx);
                drop(nx);
                n += 1;
                if n.is_multiple_of(300) {
                    check_model(&sh.fs, &m, &format!("{what} seed {seed}: during churn"));
                }
                drop(m);
                std::thread::yield_now();
            }
        }));
    }

    // Holders: directory handles and kernel lookups, taken and let go.
    let held_out: Arc<Mutex<Vec<HeldOut>>> = Arc::default();
    for t in 0..2u64 {
        let (sh, held_out) = (sh.clone(), held_out.clone());
        threads.push(std::thread::spawn(move || {
            let mut rng = StdRng::seed_from_u64(seed ^ (0x200 + t));
            let kctx = Ctx::root().via_kernel();
            let mut fhs: Vec<(u64, Ino)> = Vec::new();
            let mut looked: Vec<Ino> = Vec::new();
            while !sh.stop.load(Relaxed) {
                match rng.random_range(0..100) {
                    0..25 => {
                        let dirs = sh.model.read().all_dirs();
                        let d = dirs[rng.random_range(0..dirs.len())];
                        fhs.push((sh.fs.opendir(&ctx(), d).unwrap(), d));
                    }
                    25..45 if !fhs.is_empty() => {
                        let (fh, _) = fhs.swap_remove(rng.random_range(0..fhs.len()));
                        sh.fs.releasedir(fh).unwrap();
                    }
                    45..65 if !fhs.is_empty() => {
                        // A whole listing through a held handle, exact against the model.
                        let (fh, d) = fhs[rng.random_range(0..fhs.len())];
                        let m = sh.model.read();
                        let (got, _) = list_fh(&sh.fs, fh, 0, usize::MAX);
                        assert!(
                            got == m.dirs[&d].1,
                            "{what} seed {seed}: listing of held {d:?} through its handle differs: got {got:?} want {:?}",
                            m.dirs[&d].1
                        );
                        sh.listings.fetch_add(1, Relaxed);
                    }
                    65..88 => {
                        // A kernel lookup: of a directory (by its name in its parent), or of
                        // a random name.
                        let m = sh.model.read();
                        let dirs = m.all_dirs();
                        let d = dirs[rng.random_range(0..dirs.len())];
                        let names = &m.dirs[&d].1;
                        if names.is_empty() {
                            continue;
                        }
                        let k = rng.random_range(0..names.len());
                        let (name, &ino) = names.iter().nth(k).unwrap();
                        let a = sh.fs.lookup(&kctx, d, name).unwrap();
                        assert_eq!(a.ino, ino, "{what} seed {seed}: kernel lookup {d:?}/{}", String::from_utf8_lossy(name));
                        looked.push(a.ino);
                        sh.kernel_lookups.fetch_add(1, Relaxed);
                    }
                    _ if !looked.is_empty() => {
                        let ino = looked.swap_remove(rng.random_range(0..looked.len()));
                        sh.fs.forget(ino, 1);
                    }
                    _ => {}
                }
                if fhs.len() > 20 {
                    let (fh, _) = fhs.swap_remove(0);
                    sh.fs.releasedir(fh).unwrap();
                }
                if looked.len() > 40 {
                    let ino = looked.swap_remove(0);
                    sh.fs.forget(ino, 1);
                }
                std::thread::yield_now();
            }
            held_out
                .lock()
                .push((fhs.into_iter().map(|(f, _)| f).collect(), looked));
        }));
    }

    // Lister: listings resumed by cookie after the directory was let go (and perhaps
    // evicted), exact under the model's read lock; and unlocked listings (each name once).
    {
        let sh = sh.clone();
        threads.push(std::thread::spawn(move || {
            let mut rng = StdRng::seed_from_u64(seed ^ 0x300);
            while !sh.stop.load(Relaxed) {
                let dirs = sh.model.read().all_dirs();
                let d = dirs[rng.random_range(0..dirs.len())];
                if rng.random_bool(0.5) {
                    let m = sh.model.read();
                    let want = &m.dirs[&d].1;
                    let fh = sh.fs.opendir(&ctx(), d).unwrap();
                    let half = rng.random_range(0..=want.len());
                    let (mut got, cookie) = list_fh(&sh.fs, fh, 0, half);
                    sh.fs.releasedir(fh).unwrap();
                    // Let it go: a pass may take it now (if nothing else holds it).
                    for _ in 0..rng.random_range(0..4) {
                        sh.fs.evict_inodes(rng.random_bool(0.5));
                    }
                    let fh = sh.fs.opendir(&ctx(), d).unwrap();
                    let (rest, _) = list_fh(&sh.fs, fh, cookie, usize::MAX);
                    sh.fs.releasedir(fh).unwrap();
                    for (n, i) in rest {
                        assert!(
                            got.insert(n.clone(), i).is_none(),
                            "{what} seed {seed}: resumed listing of {d:?} returned {} again",
                            String::from_utf8_lossy(&n)
                        );
                    }
                    assert!(
                        &got == want,
                        "{what} seed {seed}: resumed listing of {d:?} (split at {half}) differs: got {got:?} want {want:?}"
                    );
                    sh.resumed.fetch_add(1, Relaxed);
                } else {
                    // Unlocked: duplicates panic inside list_fh.
                    let fh = sh.fs.opendir(&ctx(), d).unwrap();
                    let _ = list_fh(&sh.fs, fh, 0, usize::MAX);
                    sh.fs.releasedir(fh).unwrap();
                }
                sh.listings.fetch_add(1, Relaxed);
            }
        }));
    }

    // Evicter and checkpointer.
    {
        let sh = sh.clone();
        threads.push(std::thread::spawn(move || {
            let mut rng = StdRng::seed_from_u64(seed ^ 0x400);
            while !sh.stop.load(Relaxed) {
                sh.fs.evict_inodes(rng.random_bool(0.1));
                sh.passes.fetch_add(1, Relaxed);
                if rng.random_bool(0.1) {
                    sh.store.checkpoint().unwrap();
                }
                std::thread::sleep(Duration::from_micros(rng.random_range(0..500)));
            }
        }));
    }

    std::thread::sleep(run_for);
    sh.stop.store(true, Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    eprintln!(
        "{what}: churn done in {:?}: {} listings ({} resumed), {} kernel lookups, {} passes; evicted {} ({} dirs)",
        t0.elapsed(),
        sh.listings.load(Relaxed),
        sh.resumed.load(Relaxed),
        sh.kernel_lookups.load(Relaxed),
        sh.passes.load(Relaxed),
        fs.inodes_evicted(),
        fs.directories_evicted()
    );
    let model = sh.model.read().clone();
    check_model(
        &fs,
        &model,
        &format!("{what} seed {seed}: after churn, holders still holding"),
    );

    // Let go of everything.
    for (fhs, looked) in held_out.lock().drain(..) {
        for fh in fhs {
            fs.releasedir(fh).unwrap();
        }
        for ino in looked {
            fs.forget(ino, 1);
        }
    }
    assert_eq!(fs.open_handles(), 0, "handles left open");
    let root_entries = model.dirs[&ROOT_INO].1.len() as u64;
    // The budget has a floor (64 inodes: `Lazy::new`); what the filesystem works to.
    let bbytes = fs.inode_budget().expect("bounded") * lanefs::INODE_BYTES;
    let mut within = false;
    for i in 0..300 {
        if i % 10 == 0 {
            store.checkpoint().unwrap();
        }
        fs.evict_inodes(false);
        if common::cache_within(&fs, bbytes) && i > 5 {
            within = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let (bytes, held) = (fs.inode_cache_bytes(), fs.held_entries());
    eprintln!(
        "{what}: after letting go: cache {bytes} bytes ({} inodes, {} entries), held entries {held}, budget {}",
        fs.inodes_in_memory(),
        fs.entries_in_memory(),
        bbytes
    );
    assert!(
        within,
        "{what} seed {seed}: with nothing held, passes left the cache at {bytes} bytes: over budget {bbytes} + held {held} entries"
    );
    assert!(
        held <= root_entries,
        "{what} seed {seed}: with only the root held, held_entries says {held} (the root has {root_entries})"
    );

    // Everything evicted, then read again.
    for i in 0..50 {
        if i % 5 == 0 {
            store.checkpoint().unwrap();
        }
        fs.evict_inodes(true);
        std::thread::sleep(Duration::from_millis(1));
    }
    eprintln!(
        "{what}: after evicting all: {} inodes in memory, {} entries, evicted {} ({} dirs)",
        fs.inodes_in_memory(),
        fs.entries_in_memory(),
        fs.inodes_evicted(),
        fs.directories_evicted()
    );
    check_model(
        &fs,
        &model,
        &format!("{what} seed {seed}: re-read after evicting everything"),
    );
    fs.check_invariants()
        .unwrap_or_else(|e| panic!("{what} seed {seed}: invariants: {e}"));

    // Close, reopen (lazily and whole), compare.
    let before = common::dump(&fs, false);
    drop(sh);
    common::close_unshared(fs, store);
    let (fs2, store2) = open_lazy(&disk, budget);
    let after = common::dump(&fs2, false);
    common::assert_same_tree(&format!("{what} seed {seed}: lazy reopen"), &before, &after);
    check_model(&fs2, &model, &format!("{what} seed {seed}: lazy reopen"));
    fs2.check_invariants()
        .unwrap_or_else(|e| panic!("{what} seed {seed}: invariants after lazy reopen: {e}"));
    common::close_unshared(fs2, store2);
    let o = lanefs_store::open(
        store_dir(),
        Config::default(),
        common::lazy_opts(&disk, false),
    )
    .unwrap();
    let whole = common::dump(&o.fs, false);
    common::assert_same_tree(
        &format!("{what} seed {seed}: whole reopen"),
        &before,
        &whole,
    );
    o.fs.check_invariants().unwrap();
    common::close_unshared(Arc::new(o.fs), o.store);
    eprintln!("{what}: seed {seed}: done in {:?}", t0.elapsed());
}

/// Many directories held (handles, kernel lookups), the cache filled past its budget by
/// reading them: passes leave the held entries out of their goal (the cache within budget +
/// held entries); then every holder lets go and, with no explicit pass, plain operations
/// (which run a pass once one is due) bring the cache within the budget: a directory let go
/// makes a pass due by itself.
#[test]
fn letting_go_makes_a_pass_due() {
    let what = "letting_go_makes_a_pass_due";
    let seed = common::seed::seed(what);
    let _w = common::Watchdog::new(what, Duration::from_secs(600));
    let t0 = Instant::now();
    let mut rng = StdRng::seed_from_u64(seed);
    let disk = SimDisk::new();
    let model = make_store(&disk, seed);
    let budget = 64u64;
    let (fs, store) = open_lazy(&disk, budget);
    // The budget has a floor (64 inodes: `Lazy::new`); what the filesystem works to.
    let bbytes = fs.inode_budget().expect("bounded") * lanefs::INODE_BYTES;
    let kctx = Ctx::root().via_kernel();
    let mut fhs = Vec::new();
    let mut looked = Vec::new();
    let dirs: Vec<Ino> = model
        .dirs
        .keys()
        .copied()
        .filter(|&d| d != ROOT_INO)
        .collect();
    // Hold a random half of the directories by handle, the rest (some) by a kernel lookup.
    for &d in &dirs {
        match rng.random_range(0..3) {
            0 => fhs.push(fs.opendir(&ctx(), d).unwrap()),
            1 => {
                let p = model.dirs[&d].0;
                let name = model.dirs[&p].1.iter().find(|(_, i)| **i == d).unwrap().0;
                let a = fs.lookup(&kctx, p, name).unwrap();
                assert_eq!(a.ino, d);
                looked.push(d);
            }
            _ => {}
        }
    }
    // Read everything: the files come in, the cache goes over.
    check_model(&fs, &model, &format!("{what} seed {seed}: first read"));
    store.checkpoint().unwrap();
    for _ in 0..200 {
        fs.evict_inodes(false);
        if common::cache_within(&fs, bbytes) {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let (held_bytes, held) = (fs.inode_cache_bytes(), fs.held_entries());
    eprintln!(
        "{what}: held: cache {held_bytes} bytes, {} inodes, {} entries, held entries {held}, {} dir handles, {} kernel lookups",
        fs.inodes_in_memory(),
        fs.entries_in_memory(),
        fhs.len(),
        looked.len()
    );
    assert!(
        common::cache_within(&fs, bbytes),
        "{what} seed {seed}: with directories held, passes left {held_bytes} bytes, over budget {bbytes} + {held} held entries"
    );
    // Let go, then only plain operations.
    for fh in fhs.drain(..) {
        fs.releasedir(fh).unwrap();
    }
    for ino in looked.drain(..) {
        fs.forget(ino, 1);
    }
    let mut ops = 0;
    let within = loop {
        if common::cache_within(&fs, bbytes)
            && fs.held_entries() <= model.dirs[&ROOT_INO].1.len() as u64
        {
            break true;
        }
        if ops >= 20_000 {
            break false;
        }
        // A plain operation runs a pass if one is due; grace periods end over time.
        fs.getattr(ROOT_INO).unwrap();
        ops += 1;
        if ops % 100 == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    eprintln!(
        "{what}: after letting go and {ops} getattrs: cache {} bytes, {} inodes, {} entries, held entries {}",
        fs.inode_cache_bytes(),
        fs.inodes_in_memory(),
        fs.entries_in_memory(),
        fs.held_entries()
    );
    assert!(
        within,
        "{what} seed {seed}: after every holder let go, {ops} operations did not bring the cache ({} bytes, held entries {}) within budget {bbytes} (+ the root's {} entries)",
        fs.inode_cache_bytes(),
        fs.held_entries(),
        model.dirs[&ROOT_INO].1.len()
    );
    check_model(
        &fs,
        &model,
        &format!("{what} seed {seed}: after letting go"),
    );
    fs.check_invariants().unwrap();
    common::close_unshared(fs, store);
    eprintln!("{what}: seed {seed}: done in {:?}", t0.elapsed());
}
