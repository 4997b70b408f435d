//! A helper's attack on the checkpointer's direct reading of the journal (`disk.rs`
//! `read_blocks`, `journal/follow.rs` `SegmentReader::get`: aligned reads of 1 MiB with O_DIRECT
//! around the page cache, while the committer writes the same segments) and on absorption
//! (`checkpoint/window.rs` `RecordWindow`, `checkpoint/apply.rs` `Absorbable`/`Tables::absorb`), on
//! real host disks: ext4 under /tmp (O_DIRECT) and tmpfs under /dev/shm.
//!
//! Several threads run random modelled work (files written at odd offsets and sizes, some over
//! 1 MiB and straddling 4 KiB blocks, truncations, renames, links, unlinks, directories,
//! xattrs, bursts of short-lived files so that absorption has ghosts to skip, files made in one
//! window and freed in a later one) and unmodelled work in a shared directory, while another
//! thread takes checkpoints on demand (and evicts the pages they hold, so that live reads
//! come from the checkpoint) and the background checkpointer runs with low thresholds, on
//! small and odd segment sizes (segments switch during checkpoints; with 3 MiB segments
//! records straddle the 1 MiB read windows). Then: every model holds on the live
//! filesystem; `fsck::check` passes; a reopen (after a close, or a drop without one) shows
//! exactly the tree the live filesystem showed (names, inode numbers, generations, cookies,
//! nlink, sizes, blocks, contents, xattrs, times); files made after it get generations and
//! cookies never handed out before. A child process killed while its checkpoints run reopens
//! to the state it last showed. A segment whose length ends inside a block (the last batch in
//! a partial block) is read back by a checkpoint.
//!
//! Every test prints its seed; `LANEFS_SEED=<n>` replays it.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{self, BufRead, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};

use common::{assert_same_tree, cookie_of, dump, host_opts, seed};
use lanefs::{Client, Config, Ctx, Filesystem, Ino, OpenOptions};
use lanefs_store::disk::{BLOCK, Disk, DiskFile, RealDisk};
use lanefs_store::{Options, StoreHandle, fsck, open};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

// ----- a probe between the store and the real disk ---------------------------------------

/// How block reads and writes reach the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// As the real disk does them (O_DIRECT where the host takes it).
    Direct,
    /// As the real disk does them where the host refuses O_DIRECT: ordinary `pread`/`pwrite`
    /// (`RealFile`'s fallback).
    Buffered,
}

#[derive(Default)]
struct Probe {
    /// Block reads, and those whose offset is not on a 1 MiB boundary (a window re-read from
    /// where a batch or record starts).
    reads: AtomicU64,
    reads_mid: AtomicU64,
    /// Block reads longer than 1 MiB (a record larger than a window).
    reads_long: AtomicU64,
    /// Block reads of segment files that had an O_DIRECT descriptor open right after.
    reads_direct_seen: AtomicU64,
    /// Segment files created.
    made: AtomicU64,
}

struct ProbeDisk {
    mode: Mode,
    /// Now and then a block read waits a little, so that the committer runs ahead (and
    /// switches segments) while a checkpoint reads.
    jitter: bool,
    probe: Arc<Probe>,
}

struct ProbeFile {
    inner: Arc<dyn DiskFile>,
    path: PathBuf,
    mode: Mode,
    jitter: bool,
    probe: Arc<Probe>,
    checked: AtomicBool,
}

impl Disk for ProbeDisk {
    common::real_disk_but_open!();
    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn DiskFile>> {
        let new = create && !path.exists();
        let inner = RealDisk.open(path, create)?;
        if new && path.extension().is_some_and(|e| e == "seg") {
            self.probe.made.fetch_add(1, SeqCst);
        }
        Ok(Arc::new(ProbeFile {
            inner,
            path: path.to_path_buf(),
            mode: self.mode,
            jitter: self.jitter,
            probe: self.probe.clone(),
            checked: AtomicBool::new(false),
        }))
    }
    fn capacity(&self, dir: &Path) -> Option<u64> {
        RealDisk.capacity(dir)
    }
}

impl DiskFile for ProbeFile {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        self.inner.read_at(buf, off)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        self.inner.write_at(buf, off)
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.inner.sync_data()
    }
    fn allocate(&self, len: u64) -> io::Result<()> {
        self.inner.allocate(len)
    }
    fn write_blocks(&self, buf: &[u8], off: u64) -> io::Result<()> {
        assert!(
            (buf.as_ptr() as usize).is_multiple_of(BLOCK)
                && buf.len().is_multiple_of(BLOCK)
                && off.is_multiple_of(BLOCK as u64),
            "a block write out of blocks: {:p} len {} at {off}",
            buf.as_ptr(),
            buf.len()
        );
        match self.mode {
            Mode::Direct => self.inner.write_blocks(buf, off),
            Mode::Buffered => self.inner.write_at(buf, off),
        }
    }
    fn read_blocks(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        // The contract of read_blocks, which O_DIRECT needs: whole, aligned blocks.
        assert!(
            (buf.as_ptr() as usize).is_multiple_of(BLOCK)
                && buf.len().is_multiple_of(BLOCK)
                && off.is_multiple_of(BLOCK as u64),
            "a block read out of blocks: {:p} len {} at {off}",
            buf.as_ptr(),
            buf.len()
        );
        let p = &self.probe;
        let k = p.reads.fetch_add(1, SeqCst);
        if !off.is_multiple_of(1 << 20) {
            p.reads_mid.fetch_add(1, SeqCst);
        }
        if buf.len() > 1 << 20 {
            p.reads_long.fetch_add(1, SeqCst);
        }
        if self.jitter && k.is_multiple_of(5) {
            std::thread::sleep(Duration::from_micros(300));
        }
        let r = match self.mode {
            Mode::Direct => self.inner.read_blocks(buf, off),
            Mode::Buffered => self.inner.read_at(buf, off),
        };
        if !self.checked.swap(true, SeqCst) && direct_fd_open(&self.path) {
            p.reads_direct_seen.fetch_add(1, SeqCst);
        }
        r
    }
}

/// Whether this process holds a descriptor of `path` opened with O_DIRECT.
fn direct_fd_open(path: &Path) -> bool {
    let Ok(rd) = std::fs::read_dir("/proc/self/fd") else {
        return false;
    };
    for e in rd.flatten() {
        let Ok(target) = std::fs::read_link(e.path()) else {
            continue;
        };
        if target != path {
            continue;
        }
        let info = format!("/proc/self/fdinfo/{}", e.file_name().to_string_lossy());
        let Ok(s) = std::fs::read_to_string(info) else {
            continue;
        };
        for l in s.lines() {
            if let Some(f) = l.strip_prefix("flags:")
                && let Ok(flags) = i64::from_str_radix(f.trim(), 8)
                && flags & libc::O_DIRECT as i64 != 0
            {
                return true;
            }
        }
    }
    false
}

#[allow(clippy::unnecessary_cast)] // f_type's type differs between targets
fn is_tmpfs(p: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let mut st = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: a NUL-terminated path and writable memory of the struct's size.
    if unsafe { libc::statfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
        return false;
    }
    // SAFETY: statfs returned 0.
    unsafe { st.assume_init() }.f_type as i64 == 0x0102_1994
}

// ----- configurations ----------------------------------------------------------------------

#[derive(Clone, Debug)]
struct Cfg {
    segment: u64,
    mode: Mode,
    jitter: bool,
    /// The filesystem's page cache (small: pages a checkpoint holds leave memory, and are
    /// read back from it).
    cache: Option<u64>,
    threads: usize,
    ops: usize,
    /// Chance of a write over 1 MiB.
    big: f64,
    /// Whether a thread takes checkpoints on demand while the workers run.
    demand: bool,
}

fn options(cfg: &Cfg, probe: &Arc<Probe>) -> Options {
    Options {
        disk: Arc::new(ProbeDisk {
            mode: cfg.mode,
            jitter: cfg.jitter,
            probe: probe.clone(),
        }),
        checkpoint_records: 700,
        checkpoint_segments: 3,
        checkpoint_changed: 512 << 10,
        checkpoint_poll: Duration::from_millis(3),
        checkpoint_retry: Duration::from_millis(5),
        checkpoint_retry_max: Duration::from_millis(50),
        checkpoint_cache: 4 << 20,
        ..host_opts(cfg.segment, Duration::from_millis(2))
    }
}

fn config(cfg: &Cfg) -> Config {
    Config {
        protected_hardlinks: false,
        cache_bytes: cfg.cache,
        ..Config::default()
    }
}

// ----- a model of each worker's own tree ---------------------------------------------------

#[derive(Clone, Debug, Default)]
struct MFile {
    data: Vec<u8>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    nlink: u32,
}

#[derive(Clone, Debug, Default)]
struct Model {
    t: usize,
    /// Directories that exist (besides `tmp`, always there and empty between operations).
    dirs: BTreeSet<String>,
    names: BTreeMap<String, usize>,
    files: HashMap<usize, MFile>,
    next: usize,
    ghosts: u64,
}

impl Model {
    fn new(t: usize) -> Model {
        let mut m = Model {
            t,
            ..Model::default()
        };
        m.dirs.insert(format!("/w{t}"));
        m.dirs.insert(format!("/w{t}/a"));
        m
    }

    fn parent(p: &str) -> &str {
        &p[..p.rfind('/').unwrap()]
    }

    fn unlink(&mut self, p: &str) {
        let id = self.names.remove(p).unwrap();
        let f = self.files.get_mut(&id).unwrap();
        f.nlink -= 1;
        if f.nlink == 0 {
            self.files.remove(&id);
        }
    }
}

fn gen_of(fs: &Filesystem, ino: Ino) -> u64 {
    fs.getattr(ino).unwrap().generation.0
}

fn random_bytes(rng: &mut StdRng, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rng.fill(&mut v[..]);
    v
}

/// An offset and length for a write: odd, often straddling a 4 KiB block, sometimes over
/// 1 MiB.
fn write_span(rng: &mut StdRng, size: usize, big: f64) -> (u64, usize) {
    let off = match rng.random_range(0..4) {
        0 => rng.random_range(0..=size + 5000),
        1 => (rng.random_range(1..40) * BLOCK).saturating_sub(rng.random_range(1..200)),
        2 => size,
        _ => rng.random_range(0..=size.min(300_000)),
    } as u64;
    let len = if rng.random_bool(big) {
        (1 << 20) + rng.random_range(1..200_000)
    } else if rng.random_bool(0.3) {
        rng.random_range(BLOCK..3 * BLOCK + 100)
    } else {
        rng.random_range(1..2000)
    };
    (off, len)
}

/// One random operation of worker `m.t`, checked against its model.
fn step(c: &Client, m: &mut Model, rng: &mut StdRng, big: f64, max_gen: &AtomicU64) {
    let fs = c.fs();
    let ctx = Ctx::root();
    let t = m.t;
    let dirs = [
        format!("/w{t}"),
        format!("/w{t}/a"),
        format!("/w{t}/e0"),
        format!("/w{t}/e1"),
    ];
    let pick = |rng: &mut StdRng| {
        format!(
            "{}/f{}",
            dirs[rng.random_range(0..dirs.len())],
            rng.random_range(0..6)
        )
    };
    let a = pick(rng);
    let b = pick(rng);
    let has_parent = |m: &Model, p: &str| m.dirs.contains(Model::parent(p));
    match rng.random_range(0..100) {
        // A whole new content (create or O_TRUNC).
        0..=14 => {
            let n = if rng.random_bool(big) {
                (1 << 20) + rng.random_range(1..300_000)
            } else {
                rng.random_range(0..12_000)
            };
            let data = random_bytes(rng, n);
            let r = c.write(&a, &data);
            if !has_parent(m, &a) {
                assert!(r.is_err(), "write {a} without its directory");
                return;
            }
            r.unwrap_or_else(|e| panic!("write {a}: {e}"));
            match m.names.get(&a) {
                Some(id) => m.files.get_mut(id).unwrap().data = data,
                None => {
                    let ino = c.metadata(&a).unwrap().ino();
                    max_gen.fetch_max(gen_of(fs, ino), SeqCst);
                    m.next += 1;
                    m.names.insert(a, m.next);
                    m.files.insert(
                        m.next,
                        MFile {
                            data,
                            xattrs: BTreeMap::new(),
                            nlink: 1,
                        },
                    );
                }
            }
        }
        // A write at an odd offset.
        15..=39 => {
            let Some(&id) = m.names.get(&a) else {
                assert!(c.open(&a, OpenOptions::new().write(true)).is_err());
                return;
            };
            let f = c.open(&a, OpenOptions::new().write(true)).unwrap();
            let file = m.files.get_mut(&id).unwrap();
            let (off, len) = write_span(rng, file.data.len(), big);
            let data = random_bytes(rng, len);
            assert_eq!(f.write_at(&data, off).unwrap(), len);
            let end = off as usize + len;
            if file.data.len() < end {
                file.data.resize(end, 0);
            }
            file.data[off as usize..end].copy_from_slice(&data);
            if rng.random_bool(0.05) {
                f.sync_all().unwrap();
            }
        }
        // A truncation, shrinking or growing, to an odd size.
        40..=47 => {
            let Some(&id) = m.names.get(&a) else {
                assert!(c.truncate(&a, 5).is_err());
                return;
            };
            let file = m.files.get_mut(&id).unwrap();
            let size = match rng.random_range(0..3) {
                0 => rng.random_range(0..=file.data.len()),
                1 => file.data.len() + rng.random_range(1..9000),
                _ => (rng.random_range(0..8) * BLOCK + rng.random_range(0..3)).min(1 << 21),
            };
            c.truncate(&a, size as u64).unwrap();
            file.data.resize(size, 0);
        }
        // Rename within the worker's tree.
        48..=55 => {
            let r = c.rename(&a, &b);
            let Some(&ia) = m.names.get(&a) else {
                assert!(r.is_err(), "rename of missing {a}");
                return;
            };
            if !has_parent(m, &b) {
                assert!(r.is_err(), "rename into a missing directory {b}");
                return;
            }
            r.unwrap_or_else(|e| panic!("rename {a} {b}: {e}"));
            match m.names.get(&b) {
                _ if a == b => {}
                Some(&ib) if ib == ia => {}
                Some(_) => {
                    m.unlink(&b);
                    m.names.remove(&a);
                    m.names.insert(b, ia);
                }
                None => {
                    m.names.remove(&a);
                    m.names.insert(b, ia);
                }
            }
        }
        // A hard link.
        56..=61 => {
            let r = c.hard_link(&a, &b);
            match m.names.get(&a) {
                Some(&ia) if has_parent(m, &b) && !m.names.contains_key(&b) => {
                    r.unwrap_or_else(|e| panic!("link {a} {b}: {e}"));
                    m.files.get_mut(&ia).unwrap().nlink += 1;
                    m.names.insert(b, ia);
                }
                _ => assert!(r.is_err(), "link {a} {b} should fail"),
            }
        }
        // An unlink.
        62..=69 => {
            let r = c.remove_file(&a);
            if m.names.contains_key(&a) {
                r.unwrap_or_else(|e| panic!("unlink {a}: {e}"));
                m.unlink(&a);
            } else {
                assert!(r.is_err());
            }
        }
        // mkdir / rmdir of e0, e1.
        70..=73 => {
            let d = format!("/w{t}/e{}", rng.random_range(0..2));
            if m.dirs.contains(&d) {
                let empty = !m.names.keys().any(|n| Model::parent(n) == d);
                let r = c.remove_dir(&d);
                if empty {
                    r.unwrap_or_else(|e| panic!("rmdir {d}: {e}"));
                    m.dirs.remove(&d);
                } else {
                    assert!(r.is_err(), "rmdir of non-empty {d}");
                }
            } else {
                c.create_dir(&d).unwrap();
                m.dirs.insert(d);
            }
        }
        // xattrs.
        74..=79 => {
            let Some(&id) = m.names.get(&a) else {
                return;
            };
            let ino = c.metadata(&a).unwrap().ino();
            let name = format!("user.x{}", rng.random_range(0..4)).into_bytes();
            let file = m.files.get_mut(&id).unwrap();
            if rng.random_bool(0.7) {
                let n = rng.random_range(0..300);
                let v = random_bytes(rng, n);
                fs.setxattr(&ctx, ino, &name, &v, 0).unwrap();
                file.xattrs.insert(name, v);
            } else {
                let r = fs.removexattr(&ctx, ino, &name);
                assert_eq!(r.is_ok(), file.xattrs.remove(&name).is_some());
            }
        }
        // A burst of short-lived files: absorption's ghosts.
        80..=91 => {
            let n = rng.random_range(3..40);
            for _ in 0..n {
                m.ghosts += 1;
                let p = format!("/w{t}/tmp/g{}", m.ghosts);
                let f = c
                    .open(
                        &p,
                        OpenOptions::new().read(true).write(true).create_new(true),
                    )
                    .unwrap();
                max_gen.fetch_max(gen_of(fs, f.ino()), SeqCst);
                if rng.random_bool(0.8) {
                    let (off, len) = write_span(rng, 0, 0.0);
                    f.write_at(&random_bytes(rng, len), off).unwrap();
                }
                if rng.random_bool(0.2) {
                    fs.setxattr(&ctx, f.ino(), b"user.g", b"ghost", 0).unwrap();
                }
                if rng.random_bool(0.1) {
                    f.set_len(rng.random_range(0..9000)).unwrap();
                }
                if rng.random_bool(0.01) {
                    // The remove a tick of the (coarse) clock after the create.
                    std::thread::sleep(Duration::from_millis(5));
                }
                if rng.random_bool(0.25) {
                    // Unlinked while open: freed when the handle goes.
                    c.remove_file(&p).unwrap();
                    f.write_at(b"after the unlink", 3).unwrap();
                    drop(f);
                } else {
                    drop(f);
                    c.remove_file(&p).unwrap();
                }
            }
        }
        // Unmodelled work in a shared directory.
        92..=97 => {
            let s = |rng: &mut StdRng| format!("/shared/s{}", rng.random_range(0..10));
            let (x, y) = (s(rng), s(rng));
            let _ = match rng.random_range(0..5) {
                0 => {
                    let n = rng.random_range(0..6000);
                    c.write(&x, random_bytes(rng, n))
                }
                1 => c.rename(&x, &y),
                2 => c.hard_link(&x, &y),
                3 => c.remove_file(&x),
                _ => c.metadata(&x).and_then(|md| {
                    fs.setxattr(&ctx, md.ino(), b"user.s", &[t as u8], 0)
                        .map_err(Into::into)
                }),
            };
        }
        // A sync.
        _ => {
            if rng.random_bool(0.5) {
                fs.sync_all().unwrap();
            } else if let Ok(md) = c.metadata(&a) {
                let _ = fs.fsync_inode(md.ino(), rng.random_bool(0.5));
            }
        }
    }
}

fn xattrs_of(fs: &Filesystem, ino: Ino) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let ctx = Ctx::root();
    fs.listxattr(&ctx, ino)
        .unwrap()
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| (n.to_vec(), fs.getxattr(&ctx, ino, n).unwrap()))
        .collect()
}

/// The filesystem holds what model `m` says.
fn verify(c: &Client, m: &Model, what: &str) {
    let fs = c.fs();
    let t = m.t;
    assert!(
        c.read_dir(format!("/w{t}/tmp")).unwrap().is_empty(),
        "{what}: /w{t}/tmp is not empty"
    );
    for d in &m.dirs {
        let mut got: Vec<String> = c
            .read_dir(d)
            .unwrap_or_else(|e| panic!("{what}: read_dir {d}: {e}"))
            .into_iter()
            .map(|e| format!("{d}/{}", String::from_utf8(e.name).unwrap()))
            .filter(|p| !m.dirs.contains(p) && !p.ends_with("/tmp") && !p.ends_with("/a"))
            .collect();
        got.sort();
        let want: Vec<String> = m
            .names
            .keys()
            .filter(|n| Model::parent(n) == d)
            .cloned()
            .collect();
        assert_eq!(got, want, "{what}: the names in {d}");
    }
    let mut inos: HashMap<usize, Ino> = HashMap::new();
    for (p, id) in &m.names {
        let f = &m.files[id];
        let ino = c.metadata(p).unwrap().ino();
        assert_eq!(*inos.entry(*id).or_insert(ino), ino, "{what}: {p}'s inode");
        let attr = fs.getattr(ino).unwrap();
        assert_eq!(attr.nlink, f.nlink, "{what}: {p}'s link count");
        assert_eq!(attr.size, f.data.len() as u64, "{what}: {p}'s size");
        let got = c.read(p).unwrap();
        if got != f.data {
            let at = got.iter().zip(&f.data).position(|(x, y)| x != y);
            panic!(
                "{what}: {p}'s contents differ (len {} want {}, first difference at {at:?})",
                got.len(),
                f.data.len()
            );
        }
        assert_eq!(xattrs_of(fs, ino), f.xattrs, "{what}: {p}'s xattrs");
    }
}

// ----- comparing trees ---------------------------------------------------------------------

/// The tree as text, contents by checksum (what a child process hands its parent).
fn fingerprint(fs: &Filesystem) -> String {
    dump(fs, true)
        .into_iter()
        .map(|(p, mut n)| {
            let c = std::mem::take(&mut n.content);
            format!(
                "{} {n:?} len {} crc {:08x}\n",
                String::from_utf8_lossy(&p),
                c.len(),
                crc32c::crc32c(&c)
            )
        })
        .collect()
}

// ----- sessions ----------------------------------------------------------------------------

struct Outcome {
    checkpoints: u64,
    switched_during: u64,
}

/// Runs the workers for one session, with a thread taking checkpoints (and evicting what
/// they hold) until they are done.
impl Outcome {
    /// What round `round` of a session on `store` did, for the report.
    fn line(&self, round: u32, store: &StoreHandle) -> String {
        format!(
            "round {round}: {} checkpoints on demand, {} saw a new segment, ckpt lsn {}, lsn {}",
            self.checkpoints,
            self.switched_during,
            store.checkpoint_lsn(),
            store.counters().lsn
        )
    }
}

/// No checkpoint of `store`'s checkpointer failed (`what` names the run).
fn no_background_failures(store: &StoreHandle, what: &str) {
    let st = store.checkpoint_status();
    assert_eq!(
        st.failures, 0,
        "{what}: background checkpoints failed: {st:?}"
    );
}

fn session(
    fs: &Arc<Filesystem>,
    store: &StoreHandle,
    probe: &Probe,
    models: &mut [Model],
    cfg: &Cfg,
    seed: u64,
    max_gen: &AtomicU64,
) -> Outcome {
    let done = AtomicBool::new(false);
    let (checkpoints, switched_during) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        let ck = s.spawn(|| {
            let mut rng = StdRng::seed_from_u64(seed ^ 0xC0FFEE);
            while cfg.demand && !done.load(SeqCst) {
                let before = probe.made.load(SeqCst);
                if let Err(e) = store.checkpoint() {
                    done.store(true, SeqCst);
                    panic!("a checkpoint on demand failed: {e}");
                }
                checkpoints.fetch_add(1, SeqCst);
                if probe.made.load(SeqCst) > before {
                    switched_during.fetch_add(1, SeqCst);
                }
                if rng.random_bool(0.3) {
                    fs.evict();
                }
                std::thread::sleep(Duration::from_micros(rng.random_range(0..3000)));
            }
        });
        let workers: Vec<_> = models
            .iter_mut()
            .enumerate()
            .map(|(t, m)| {
                let fs = fs.clone();
                let done = &done;
                s.spawn(move || {
                    let c = Client::root(fs);
                    let mut rng = StdRng::seed_from_u64(seed ^ ((t as u64 + 1) * 0x9E37_79B9));
                    for i in 0..cfg.ops {
                        if done.load(SeqCst) {
                            break;
                        }
                        step(&c, m, &mut rng, cfg.big, max_gen);
                        if i % 16 == 15 {
                            std::thread::sleep(Duration::from_micros(rng.random_range(0..1500)));
                        }
                    }
                })
            })
            .collect();
        let mut panicked = None;
        for w in workers {
            if let Err(e) = w.join() {
                panicked = Some(e);
            }
        }
        done.store(true, SeqCst);
        if let Err(e) = ck.join() {
            std::panic::resume_unwind(e);
        }
        if let Some(e) = panicked {
            std::panic::resume_unwind(e);
        }
    });
    Outcome {
        checkpoints: checkpoints.load(SeqCst),
        switched_during: switched_during.load(SeqCst),
    }
}

fn setup(c: &Client, threads: usize) {
    c.create_dir("/shared").unwrap();
    for t in 0..threads {
        for d in ["", "/a", "/tmp"] {
            c.create_dir(format!("/w{t}{d}")).unwrap();
        }
    }
}

/// After a reopen: a new file gets a generation above every one handed out before.
fn fresh_generation(fs: &Arc<Filesystem>, max_gen: &AtomicU64, what: &str) {
    let c = Client::root(fs.clone());
    c.write("/fresh", b"x").unwrap();
    let g = gen_of(fs, c.metadata("/fresh").unwrap().ino());
    let most = max_gen.load(SeqCst);
    assert!(
        g > most,
        "{what}: a new file after the reopen got generation {g}, but {most} was handed out before"
    );
    c.remove_file("/fresh").unwrap();
}

fn into_inner(fs: Arc<Filesystem>) -> Filesystem {
    Arc::try_unwrap(fs).unwrap_or_else(|_| panic!("no other reference"))
}

/// Two sessions on one store: session, close, fsck, reopen and compare; session, drop
/// without close, fsck, reopen and compare.
fn scenario(root: &Path, cfg: &Cfg, base: u64, tag: u64) {
    let t0 = Instant::now();
    let dir = root.join("store");
    let probe = Arc::new(Probe::default());
    let opts = options(cfg, &probe);
    let what = format!("LANEFS_SEED={base} {cfg:?}");
    let seed = base.wrapping_add(tag.wrapping_mul(0x0010_0000_0001));
    let mut rng = StdRng::seed_from_u64(seed);
    let max_gen = AtomicU64::new(0);
    let o = open(&dir, config(cfg), opts.clone()).unwrap();
    let fs = Arc::new(o.fs);
    let store = o.store;
    setup(&Client::root(fs.clone()), cfg.threads);
    let mut models: Vec<Model> = (0..cfg.threads).map(Model::new).collect();

    let mut report = Vec::new();
    let out = session(&fs, &store, &probe, &mut models, cfg, seed, &max_gen);
    let c = Client::root(fs.clone());
    for m in &models {
        verify(&c, m, &format!("{what}: round 0, live"));
    }
    drop(c);
    fs.check_invariants()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    if rng.random_bool(0.5) {
        store.checkpoint().unwrap();
    }
    no_background_failures(&store, &what);
    let want = dump(&fs, true);
    report.push(out.line(0, &store));
    drop(into_inner(fs));
    store.close().unwrap();
    let r = fsck::check(&dir, &opts).unwrap_or_else(|e| panic!("{what}: fsck: {e}"));
    assert!(!r.torn_tail, "{what}: {r:?}");
    let o = open(&dir, config(cfg), opts.clone()).unwrap();
    assert!(!o.report.torn_tail, "{what}: {:?}", o.report);
    assert_same_tree(&format!("{what}: round 0"), &want, &dump(&o.fs, true));
    o.fs.check_invariants().unwrap();
    let fs = Arc::new(o.fs);
    let c = Client::root(fs.clone());
    for m in &models {
        verify(&c, m, &format!("{what}: round 0, reopened"));
    }
    drop(c);
    fresh_generation(&fs, &max_gen, &what);
    return_round(
        seed,
        cfg,
        &dir,
        &opts,
        fs,
        o.store,
        &probe,
        &mut models,
        &max_gen,
        &mut report,
        &what,
    );
    let p = &probe;
    eprintln!(
        "{what}: {} block reads ({} not on a MiB, {} over a MiB, {} with O_DIRECT seen), {} segments made; {}; {:.1?}",
        p.reads.load(SeqCst),
        p.reads_mid.load(SeqCst),
        p.reads_long.load(SeqCst),
        p.reads_direct_seen.load(SeqCst),
        p.made.load(SeqCst),
        report.join("; "),
        t0.elapsed()
    );
    assert!(
        p.reads.load(SeqCst) > 0,
        "{what}: the checkpointer read nothing"
    );
    if cfg.mode == Mode::Direct && !is_tmpfs(root) {
        assert!(
            p.reads_direct_seen.load(SeqCst) > 0,
            "{what}: no segment read had an O_DIRECT descriptor"
        );
    }
}

/// The second round of [`scenario`]: work on the reopened store, then drop it without a
/// close, check, reopen, compare.
#[allow(clippy::too_many_arguments)]
fn return_round(
    seed: u64,
    cfg: &Cfg,
    dir: &Path,
    opts: &Options,
    fs: Arc<Filesystem>,
    store: StoreHandle,
    probe: &Probe,
    models: &mut [Model],
    max_gen: &AtomicU64,
    report: &mut Vec<String>,
    what: &str,
) {
    let out = session(&fs, &store, probe, models, cfg, seed ^ 0x5EC0, max_gen);
    let c = Client::root(fs.clone());
    for m in models.iter() {
        verify(&c, m, &format!("{what}: round 1, live"));
    }
    drop(c);
    fs.check_invariants().unwrap();
    no_background_failures(&store, what);
    let want = dump(&fs, true);
    report.push(out.line(1, &store));
    drop(into_inner(fs));
    drop(store); // without close
    let r = fsck::check(dir, opts).unwrap_or_else(|e| panic!("{what}: fsck: {e}"));
    assert!(!r.torn_tail, "{what}: {r:?}");
    let o = open(dir, config(cfg), opts.clone()).unwrap();
    assert_same_tree(&format!("{what}: round 1"), &want, &dump(&o.fs, true));
    o.fs.check_invariants().unwrap();
    let fs = Arc::new(o.fs);
    let c = Client::root(fs.clone());
    for m in models.iter() {
        verify(&c, m, &format!("{what}: round 1, reopened"));
    }
    drop(c);
    fresh_generation(&fs, max_gen, what);
    // A last checkpoint of everything, then a reopen from the checkpoint alone.
    let want = dump(&fs, true);
    o.store.checkpoint().unwrap();
    drop(into_inner(fs));
    o.store.close().unwrap();
    fsck::check(dir, opts).unwrap();
    let o = open(dir, config(cfg), opts.clone()).unwrap();
    assert!(o.report.replayed < 5, "{what}: {:?}", o.report);
    assert_same_tree(
        &format!("{what}: from the checkpoint"),
        &want,
        &dump(&o.fs, true),
    );
    o.store.close().unwrap();
}

// ----- the random workloads ----------------------------------------------------------------

fn ext4_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    assert!(
        !is_tmpfs(d.path()),
        "{} is expected on a disk",
        d.path().display()
    );
    d
}

fn shm_dir() -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix("checkpoint_direct_reads")
        .tempdir_in("/dev/shm")
        .unwrap();
    assert!(is_tmpfs(d.path()));
    d
}

/// The workload most runs here take ([`run`]); each changes some of it.
const BASE: Cfg = Cfg {
    segment: 64 << 10,
    mode: Mode::Direct,
    jitter: true,
    cache: Some(256 << 10),
    threads: 3,
    ops: 2000,
    big: 0.01,
    demand: true,
};

/// A store with no workload of its own and no checkpoint but those the test takes (none due
/// by records, segments, changed data or time), block reads by `mode`, a page cache of
/// `cache`: its [`Cfg`] and options (`probe` watching its disk).
fn quiet(mode: Mode, cache: Option<u64>, probe: &Arc<Probe>) -> (Cfg, Options) {
    let cfg = Cfg {
        segment: 256 << 10,
        mode,
        jitter: false,
        cache,
        threads: 0,
        ops: 0,
        big: 0.0,
        demand: false,
    };
    let opts = Options {
        checkpoint_records: u64::MAX,
        checkpoint_segments: usize::MAX,
        checkpoint_changed: 1 << 40,
        checkpoint_poll: Duration::from_secs(3600),
        ..options(&cfg, probe)
    };
    (cfg, opts)
}

fn run(tag: u64, root: &Path, cfg: Cfg) {
    let seed = seed::seed(&format!("checkpoint_direct_reads, {cfg:?}"));
    scenario(root, &cfg, seed, tag);
}

/// 64 KiB segments: a segment switch every few batches, so checkpoints on demand and in the
/// background keep reading segments the committer has just left or is still writing; a small
/// page cache, so that live reads come from the checkpoint.
#[test]
fn ext4_small_segments_direct() {
    let d = ext4_dir();
    run(1, d.path(), BASE);
}

/// Segments of an odd size (not a multiple of a block, nor of 1 MiB).
#[test]
fn ext4_odd_segments_direct() {
    let d = ext4_dir();
    run(
        2,
        d.path(),
        Cfg {
            segment: 200_017,
            cache: None,
            big: 0.015,
            ..BASE
        },
    );
}

/// Segments of 3 MiB and a bit: many batches and records straddle the 1 MiB read windows.
#[test]
fn ext4_records_straddle_read_windows() {
    let d = ext4_dir();
    run(
        3,
        d.path(),
        Cfg {
            segment: (3 << 20) + 12_345,
            jitter: false,
            cache: Some(512 << 10),
            threads: 2,
            ops: 3000,
            big: 0.02,
            ..BASE
        },
    );
}

/// What a host that refuses O_DIRECT gets: buffered block reads and writes.
#[test]
fn ext4_buffered_fallback() {
    let d = ext4_dir();
    run(
        4,
        d.path(),
        Cfg {
            segment: 256 << 10,
            mode: Mode::Buffered,
            ops: 1500,
            ..BASE
        },
    );
}

/// tmpfs: the real disk's block reads and writes as the host takes them (this kernel's
/// tmpfs takes O_DIRECT opens; older ones refuse them and the fallback runs).
#[test]
fn tmpfs_real_disk() {
    let d = shm_dir();
    run(5, d.path(), Cfg { ops: 1500, ..BASE });
}

/// tmpfs with odd segments of about 1 MiB, buffered.
#[test]
fn tmpfs_odd_segments_buffered() {
    let d = shm_dir();
    run(
        6,
        d.path(),
        Cfg {
            segment: 1_000_003,
            mode: Mode::Buffered,
            jitter: false,
            cache: None,
            threads: 2,
            big: 0.02,
            ..BASE
        },
    );
}

// ----- ghosts last in a checkpoint ---------------------------------------------------------

/// Checkpoints whose last records are ghosts (files made and freed within the window): after
/// a close and reopen the directory shows the times the ghosts' removes gave it, and a file
/// made then (by the same thread, so the same cookie lane) gets a generation and a cookie
/// above the ghosts'. Between the phases: a file made in one window and freed in the next (a
/// record of more than a window between), directories made and removed around ghosts.
#[test]
fn ghosts_last_keep_times_generations_and_cookies() {
    let seed = seed::seed("ghosts_last_keep_times_generations_and_cookies");
    let mut rng = StdRng::seed_from_u64(seed.wrapping_add(7));
    let d = ext4_dir();
    let dir = d.path().join("store");
    let probe = Arc::new(Probe::default());
    let (cfg, opts) = quiet(Mode::Direct, None, &probe);
    let mut max_gen = 0u64;
    let mut max_cookie = 0u64;
    {
        let o = open(&dir, config(&cfg), opts.clone()).unwrap();
        let c = Client::root(Arc::new(o.fs));
        c.create_dir("/g").unwrap();
        c.write("/keep", b"kept").unwrap();
        drop(c);
        o.store.close().unwrap();
    }
    for phase in 0..4 {
        let what = format!("LANEFS_SEED={seed}, phase {phase}");
        let o = open(&dir, config(&cfg), opts.clone()).unwrap();
        let fs = Arc::new(o.fs);
        let c = Client::root(fs.clone());
        if phase > 0 {
            // Made after the reopen, by this thread: above every ghost before it.
            c.write("/g/new", b"n").unwrap();
            let ino = c.metadata("/g/new").unwrap().ino();
            let g = gen_of(&fs, ino);
            assert!(
                g > max_gen,
                "{what}: generation {g} after ghosts up to {max_gen}"
            );
            let ck = cookie_of(&fs, c.metadata("/g").unwrap().ino(), b"new");
            assert!(
                ck > max_cookie,
                "{what}: cookie {ck:#x} after ghosts' up to {max_cookie:#x}"
            );
            c.remove_file("/g/new").unwrap();
        }
        if phase == 1 {
            // Made in one window, freed in the next.
            c.write("/g/span", random_bytes(&mut rng, 5000)).unwrap();
            c.write("/big", random_bytes(&mut rng, (4 << 20) + 77_777))
                .unwrap();
            c.remove_file("/g/span").unwrap();
        }
        if phase == 2 {
            // A directory made, with ghosts in it, and removed; one made and kept.
            for k in 0..2 {
                c.create_dir(format!("/g/d{k}")).unwrap();
                for i in 0..rng.random_range(1..20) {
                    let p = format!("/g/d{k}/x{i}");
                    c.write(&p, random_bytes(&mut rng, 300)).unwrap();
                    max_gen = max_gen.max(gen_of(&fs, c.metadata(&p).unwrap().ino()));
                    c.remove_file(&p).unwrap();
                }
            }
            c.remove_dir("/g/d0").unwrap();
        }
        let g_ino = c.metadata("/g").unwrap().ino();
        let n = rng.random_range(20..200);
        for i in 0..n {
            let p = format!("/g/x{phase}_{i}");
            let f = c
                .open(
                    &p,
                    OpenOptions::new().read(true).write(true).create_new(true),
                )
                .unwrap();
            max_gen = max_gen.max(gen_of(&fs, f.ino()));
            let (off, len) = write_span(&mut rng, 0, 0.0);
            f.write_at(&random_bytes(&mut rng, len), off).unwrap();
            if rng.random_bool(0.3) {
                fs.setxattr(&Ctx::root(), f.ino(), b"user.g", b"v", 0)
                    .unwrap();
            }
            if rng.random_bool(0.2) {
                f.set_len(rng.random_range(0..5000)).unwrap();
            }
            if i + 1 == n || rng.random_bool(0.1) {
                max_cookie = max_cookie.max(cookie_of(
                    &fs,
                    g_ino,
                    p.rsplit('/').next().unwrap().as_bytes(),
                ));
            }
            if i + 1 == n || rng.random_bool(0.05) {
                // The remove a clock tick (coarse) after the create: the directory's times
                // differ.
                std::thread::sleep(Duration::from_millis(6));
            }
            if rng.random_bool(0.3) {
                c.remove_file(&p).unwrap();
                drop(f);
            } else {
                drop(f);
                c.remove_file(&p).unwrap();
            }
        }
        o.store.checkpoint().unwrap();
        let want = dump(&fs, true);
        drop(c);
        drop(into_inner(fs));
        o.store.close().unwrap();
        let r = fsck::check(&dir, &opts).unwrap_or_else(|e| panic!("{what}: fsck: {e}"));
        assert!(r.checkpoint_lsn > 0);
        let o = open(&dir, config(&cfg), opts.clone()).unwrap();
        assert_eq!(
            o.report.replayed, 0,
            "{what}: the checkpoint holds every record"
        );
        assert_same_tree(&what, &want, &dump(&o.fs, true));
        o.fs.check_invariants().unwrap();
        o.store.close().unwrap();
    }
}

// ----- a segment that ends inside a block --------------------------------------------------

/// The end of the last batch of the last segment that holds any.
fn journal_end(store: &Path) -> (PathBuf, u64) {
    let jd = store.join("journal");
    let mut segs: Vec<PathBuf> = std::fs::read_dir(&jd)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    segs.sort();
    let used = segs
        .into_iter()
        .rev()
        .find(|p| {
            // Neither zeros nor a spare header (first LSN 0).
            let b = std::fs::read(p).unwrap();
            b.len() >= 64 && b[..64].iter().any(|&x| x != 0) && b[40..48] != [0; 8]
        })
        .expect("a used segment");
    let b = std::fs::read(&used).unwrap();
    let mut at = 64usize;
    while at + 48 <= b.len() && &b[at..at + 4] == b"LFB1" {
        let len = u32::from_le_bytes(b[at + 28..at + 32].try_into().unwrap()) as usize;
        at += 48 + len;
    }
    (used, at as u64)
}

/// A segment whose file ends where its last batch does, inside a block (what a host that
/// keeps a file's exact length leaves, and what `fsck --repair` writes): a checkpoint taken
/// before anything is appended reads that last partial block, and holds every record.
#[test]
fn a_segment_ending_inside_a_block_is_read_back_whole() {
    let seed = seed::seed("a_segment_ending_inside_a_block_is_read_back_whole");
    let mut rng = StdRng::seed_from_u64(seed.wrapping_add(8));
    for (k, mode) in [Mode::Direct, Mode::Buffered].into_iter().enumerate() {
        let what = format!("LANEFS_SEED={seed}, {mode:?}");
        let d = if k == 0 { ext4_dir() } else { shm_dir() };
        let dir = d.path().join("store");
        let probe = Arc::new(Probe::default());
        let (cfg, opts) = quiet(mode, Some(0), &probe);
        let mut end;
        let mut n = 0;
        loop {
            let o = open(&dir, config(&cfg), opts.clone()).unwrap();
            let c = Client::root(Arc::new(o.fs));
            for _ in 0..rng.random_range(5..40) {
                n += 1;
                // Before this operation's records, so that records always follow it.
                if n == 30 {
                    o.store.checkpoint().unwrap();
                }
                let p = format!("/f{}", n % 23);
                let len = rng.random_range(0..7000);
                c.write(&p, random_bytes(&mut rng, len)).unwrap();
                if rng.random_bool(0.2) {
                    c.remove_file(&p).unwrap();
                }
                c.fs().sync_all().unwrap();
            }
            drop(c);
            o.store.close().unwrap();
            end = journal_end(&dir);
            if !end.1.is_multiple_of(BLOCK as u64) {
                break;
            }
        }
        let (seg, at) = end;
        std::fs::OpenOptions::new()
            .write(true)
            .open(&seg)
            .unwrap()
            .set_len(at)
            .unwrap();
        fsck::check(&dir, &opts).unwrap_or_else(|e| panic!("{what}: fsck: {e}"));
        let o = open(&dir, config(&cfg), opts.clone()).unwrap();
        assert!(!o.report.torn_tail, "{what}: {:?}", o.report);
        let want = dump(&o.fs, true);
        assert_eq!(
            std::fs::metadata(&seg).unwrap().len(),
            at,
            "{what}: opening wrote to the end segment"
        );
        let applied = o
            .store
            .checkpoint()
            .unwrap_or_else(|e| panic!("{what}: a checkpoint of a segment ending at {at}: {e}"));
        assert!(applied > 0, "{what}");
        // Reads from here on come from the checkpoint.
        o.fs.evict();
        assert_eq!(o.fs.resident_pages(), 0, "{what}");
        assert_same_tree(
            &format!("{what}: from the checkpoint, live"),
            &want,
            &dump(&o.fs, true),
        );
        drop(o.fs);
        o.store.close().unwrap();
        fsck::check(&dir, &opts).unwrap();
        let o = open(&dir, config(&cfg), opts.clone()).unwrap();
        assert_eq!(o.report.replayed, 0, "{what}: {:?}", o.report);
        assert_same_tree(&format!("{what}: reopened"), &want, &dump(&o.fs, true));
        o.store.close().unwrap();
    }
}

// ----- a killed process --------------------------------------------------------------------

const KILL_ROUNDS: usize = 4;

/// The child of [`a_process_killed_while_checkpointing_reopens_to_what_it_showed`]: nothing
/// unless started by it. Works in rounds; after each it syncs, writes its tree's fingerprint
/// next to the store, says READY, and takes checkpoints until told to go on (or killed).
#[test]
fn kill_child_entry() {
    let Ok(dir) = std::env::var("DIRECT_READS_CHILD") else {
        return;
    };
    let dir = PathBuf::from(dir);
    let var = |k: &str| -> u64 { std::env::var(k).unwrap().parse().unwrap() };
    let seed = var("DIRECT_READS_CHILD_SEED");
    let cfg = Cfg {
        segment: var("DIRECT_READS_CHILD_SEGMENT"),
        mode: Mode::Direct,
        jitter: true,
        cache: Some(256 << 10),
        threads: 2,
        ops: 600,
        big: 0.03,
        demand: false,
    };
    let probe = Arc::new(Probe::default());
    let opts = Options {
        // Checkpoints come mostly when the child says READY: they have a backlog then.
        checkpoint_records: 50_000,
        checkpoint_segments: 200,
        checkpoint_changed: 64 << 20,
        ..options(&cfg, &probe)
    };
    let o = open(&dir.join("store"), config(&cfg), opts).unwrap();
    let fs = Arc::new(o.fs);
    let store = o.store;
    setup(&Client::root(fs.clone()), cfg.threads);
    let mut models: Vec<Model> = (0..cfg.threads).map(Model::new).collect();
    let max_gen = AtomicU64::new(0);
    let stdin = io::stdin();
    for r in 0..KILL_ROUNDS {
        session(
            &fs,
            &store,
            &probe,
            &mut models,
            &cfg,
            seed ^ r as u64,
            &max_gen,
        );
        let c = Client::root(fs.clone());
        for m in &models {
            verify(&c, m, &format!("child seed {seed}, round {r}"));
        }
        drop(c);
        fs.sync_all().unwrap();
        let fp = fingerprint(&fs);
        let tmp = dir.join("state.tmp");
        std::fs::write(&tmp, fp).unwrap();
        std::fs::rename(&tmp, dir.join(format!("state-{r}"))).unwrap();
        let go = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !go.load(SeqCst) {
                    store.checkpoint().unwrap();
                }
            });
            println!("READY {r}");
            io::stdout().flush().unwrap();
            let mut line = String::new();
            stdin.lock().read_line(&mut line).unwrap();
            go.store(true, SeqCst);
        });
    }
    println!("DONE");
}

/// A process killed (SIGKILL: everything it wrote is kept, nothing more) while checkpoints
/// run, right after it showed its tree: `fsck` passes, and the store reopens to exactly that
/// tree; a checkpoint and another reopen keep it.
#[test]
fn a_process_killed_while_checkpointing_reopens_to_what_it_showed() {
    let seed = seed::seed("a_process_killed_while_checkpointing_reopens_to_what_it_showed");
    let mut rng = StdRng::seed_from_u64(seed.wrapping_add(9));
    for segment in [64 << 10, 200_017, 1_500_007] {
        let d = ext4_dir();
        let target = rng.random_range(0..KILL_ROUNDS);
        let delay = Duration::from_micros(match rng.random_range(0..3) {
            0 => 0,
            1 => rng.random_range(0..5_000),
            _ => rng.random_range(0..40_000),
        });
        let what = format!(
            "LANEFS_SEED={seed}, segment {segment}, killed after round {target} + {delay:?}"
        );
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "kill_child_entry",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("DIRECT_READS_CHILD", d.path())
            .env("DIRECT_READS_CHILD_SEED", (seed ^ segment).to_string())
            .env("DIRECT_READS_CHILD_SEGMENT", segment.to_string())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut to_child = child.stdin.take().unwrap();
        let lines = io::BufReader::new(child.stdout.take().unwrap()).lines();
        let mut killed = false;
        for line in lines {
            let line = line.unwrap();
            // (libtest's "test kill_child_entry ... " may come first on the line)
            let Some(r) = line.split("READY ").nth(1) else {
                continue;
            };
            let r: usize = r.trim().parse().unwrap();
            if r == target {
                std::thread::sleep(delay);
                child.kill().unwrap();
                killed = true;
                break;
            }
            writeln!(to_child, "go").unwrap();
            to_child.flush().unwrap();
        }
        let status = child.wait().unwrap();
        assert!(killed, "{what}: the child ended first: {status}");
        let state = std::fs::read_to_string(d.path().join(format!("state-{target}"))).unwrap();
        let dir = d.path().join("store");
        let opts = Options {
            segment_size: segment,
            ..Options::default()
        };
        let cfg = Config {
            protected_hardlinks: false,
            ..Config::default()
        };
        fsck::check(&dir, &opts).unwrap_or_else(|e| panic!("{what}: fsck: {e}"));
        let o = open(&dir, cfg.clone(), opts.clone()).unwrap_or_else(|e| panic!("{what}: {e}"));
        let same = |got: String, when: &str| {
            if got != state {
                let diff: Vec<String> = state
                    .lines()
                    .zip(got.lines())
                    .filter(|(a, b)| a != b)
                    .take(4)
                    .map(|(a, b)| format!("  shown    {a}\n  reopened {b}"))
                    .collect();
                panic!(
                    "{what}: {when}: the tree differs ({} lines shown, {} reopened)\n{}",
                    state.lines().count(),
                    got.lines().count(),
                    diff.join("\n")
                );
            }
        };
        same(fingerprint(&o.fs), "reopened");
        o.fs.check_invariants().unwrap();
        eprintln!("{what}: {:?}", o.report);
        o.store.checkpoint().unwrap();
        same(fingerprint(&o.fs), "checkpointed");
        drop(o.fs);
        o.store.close().unwrap();
        fsck::check(&dir, &opts).unwrap();
        let o = open(&dir, cfg, opts).unwrap();
        same(fingerprint(&o.fs), "reopened after a checkpoint");
        o.store.close().unwrap();
    }
}
