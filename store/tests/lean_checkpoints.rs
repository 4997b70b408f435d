//! An attack on checkpoints that commit segment by segment on a host short of room ("lean"
//! checkpoints: docs/STORE.md, Checkpoints, Out of room), written without reading the
//! other tests of this directory.
//!
//! The host is a [`SimDisk`] behind [`Host`], which caps the bytes stored and counts them
//! as a Linux filesystem does: redb grows `checkpoint.redb` with `set_len` (doubling it),
//! which takes no room until written; the SimDisk alone counts the length, and with its own
//! cap no lean checkpoint could ever grow the database.
//!
//! 1. `power_cuts_at_every_flush_of_lean_checkpoints`: writers create, fill, fsync and delete
//!    files while checkpoints run back to back on a host whose cap keeps it a few segments
//!    from full; at every flush of the host a power cut is simulated (before it: lost and
//!    torn; after it: lost, kept and torn), and each image must pass fsck, open, pass the
//!    engine's invariant check, and hold exactly what was acknowledged.
//! 2. `fill_delete_and_go_on`: a store fills its host without syncing, half its files are
//!    deleted, and it must take a file and a sync again within 30 s, then a quarter of what
//!    was deleted, then reopen with exactly its live state.
//! 3. `room_comes_and_goes_under_load`: the host's cap flips between tight and none under
//!    writers that fsync and checkpoints on demand; only ENOSPC may be refused, and once the
//!    cap is lifted the store recovers at once and reopens as it was.
//! 4. `a_checkpoint_short_of_room_keeps_its_room_from_the_journal`: no journal segment is made
//!    while a checkpoint that began short of room runs (the room it frees is its own).
//! 5. `after_a_lean_checkpoint_the_journal_goes_on`: a host filled with fsynced files, a lean
//!    checkpoint, half the files deleted: the store must take a quarter of that again.
//!
//! Each test prints its seed; `LANEFS_SEED` replays one, `LEAN_CHECKPOINTS_SECS` scales the
//! run time of tests 1 and 3, `LEAN_CHECKPOINTS_DEBUG` makes test 2 trace the journal's
//! segments.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{HOUR, seed};
use lanefs::{Client, Config, Filesystem, OpenOptions};
use lanefs_store::disk::{Disk, DiskFile, SimDisk, SyncPoint, Unflushed};
use lanefs_store::{Options, fsck};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const DIR: &str = "/s";

fn secs(default: f64) -> Duration {
    let scale: f64 = std::env::var("LEAN_CHECKPOINTS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    Duration::from_secs_f64(default * scale)
}

/// The byte a file `id` holds at `off`: never zero, so that a hole or lost data shows.
fn pat(id: u64, off: u64) -> u8 {
    let x = id
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add((off / 7).wrapping_mul(0xBF58_476D_1CE4_E5B9));
    ((x >> 56) as u8 ^ off as u8) | 1
}

fn content(id: u64, from: u64, len: u64) -> Vec<u8> {
    (from..from + len).map(|o| pat(id, o)).collect()
}

/// A file's name: its id and its full length.
fn name(id: u64, len: u64) -> String {
    format!("f{id}_{len}")
}

fn parse(name: &str) -> Option<(u64, u64)> {
    let (a, b) = name.strip_prefix('f')?.split_once('_')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// Whether `data` is a prefix of what file `id` of full length `len` was given.
fn given(id: u64, len: u64, data: &[u8]) -> Result<(), String> {
    if data.len() as u64 > len {
        return Err(format!("{} bytes, it was given {len}", data.len()));
    }
    for (o, &b) in data.iter().enumerate() {
        if b != pat(id, o as u64) {
            return Err(format!(
                "byte {o} of {} is {b:#04x}, it was given {:#04x}",
                data.len(),
                pat(id, o as u64)
            ));
        }
    }
    Ok(())
}

fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

fn enospc(e: &io::Error) -> bool {
    errno(e) == libc::ENOSPC
}

/// Options for a store on `disk` with segments of `seg` bytes that checkpoints only when
/// asked to.
fn manual_on(disk: Arc<dyn Disk>, seg: u64) -> Options {
    Options {
        disk,
        segment_size: seg,
        checkpoint_poll: HOUR,
        checkpoint_records: u64::MAX,
        checkpoint_segments: 1 << 20,
        journal_segments: 1 << 21,
        checkpoint_changed: 1 << 40,
        ..Options::default()
    }
}

/// [`manual_on`] `host`.
fn manual_opts(host: &Host, seg: u64) -> Options {
    manual_on(Arc::new(host.clone()), seg)
}

/// Asks `store` for a checkpoint until one succeeds or `most` have failed: the last result
/// and the number of tries.
fn checkpoint_tries(store: &lanefs_store::StoreHandle, most: u32) -> (Result<u64, String>, u32) {
    let mut tries = 0;
    loop {
        tries += 1;
        let r = store.checkpoint().map_err(|e| e.to_string());
        if r.is_ok() || tries == most {
            return (r, tries);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Closes `store` (its filesystem already dropped), checks it with fsck, reopens it with
/// `opts` and asserts the invariants and that it holds exactly `live`.
fn close_and_reopen_equal(
    store: lanefs_store::StoreHandle,
    dir: &Path,
    opts: Options,
    live: &BTreeMap<String, Vec<u8>>,
) {
    store.close().expect("close");
    fsck::check(dir, &opts).unwrap();
    let o = lanefs_store::open(dir, Config::default(), opts).unwrap();
    let fs = Arc::new(o.fs);
    fs.check_invariants().unwrap();
    let again = tree(&Client::root(fs.clone())).unwrap();
    assert!(
        *live == again,
        "the reopened store differs from the live one"
    );
}

/// Every regular file under the root, by path, with its contents.
fn tree(c: &Client) -> io::Result<BTreeMap<String, Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![String::new()];
    while let Some(d) = dirs.pop() {
        let p = if d.is_empty() {
            "/".to_string()
        } else {
            d.clone()
        };
        for e in c.read_dir(&p)? {
            let n = format!("{d}/{}", String::from_utf8_lossy(&e.name));
            if e.kind == lanefs::FileType::Directory {
                dirs.push(n);
            } else {
                let data = c.read(&n)?;
                out.insert(n, data);
            }
        }
    }
    Ok(out)
}

fn dir_sync(c: &Client, dir: &str) -> io::Result<()> {
    let f = c.open(
        dir,
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY),
    )?;
    f.sync_all()
}

/// Options for opening a crash image (or reopening to compare): no checkpoint of its own
/// meddles while it is looked at.
fn quiet(disk: &SimDisk, seg: u64) -> Options {
    manual_on(Arc::new(disk.clone()), seg)
}

/// Writes file `id` of `len` bytes in `dir` in pieces (`big`: pieces up to `big` bytes),
/// then fsyncs it if `sync`. Any error is returned as it came.
fn write_file(
    c: &Client,
    dir: &str,
    id: u64,
    len: u64,
    big: u64,
    sync: bool,
    rng: &mut StdRng,
) -> io::Result<()> {
    let p = format!("{dir}/{}", name(id, len));
    let f = c.open(&p, OpenOptions::new().write(true).create_new(true))?;
    let mut at = 0;
    while at < len {
        let n = rng.random_range(1..=big).min(len - at);
        let w = f.write_at(&content(id, at, n), at)?;
        assert_eq!(w as u64, n, "short write");
        at += n;
    }
    if sync {
        f.sync_all()?;
    }
    Ok(())
}

// ------------------------------------------------------------------------------------------
// The host: a simulated disk whose room is counted as a real filesystem counts it.
// ------------------------------------------------------------------------------------------

/// A [`SimDisk`] with a cap on the bytes it holds, counted as a Linux filesystem counts
/// them: the SimDisk counts a file's length as its usage, but redb grows its file with
/// `set_len` (doubling it while it is under 4 GiB), which on ext4, xfs or tmpfs makes a
/// sparse file taking no room until its pages are written. So here a checkpoint file takes
/// the room of the bytes written into it (up to the furthest written), and every other file
/// its length (segments and the reserve are allocated or written whole). Writes, growing
/// `set_len`s and allocations past the cap fail with ENOSPC; `available` is what is left.
#[derive(Clone)]
struct Host {
    sim: SimDisk,
    st: Arc<Mutex<HostState>>,
    /// Journal segments made (allocated afresh, or renamed into place from a free one).
    made: Arc<AtomicU64>,
    /// Journal segments removed (a lean checkpoint's, or beyond the free ones kept), and
    /// renamed to `.free` for reuse.
    removed: Arc<AtomicU64>,
    kept: Arc<AtomicU64>,
    /// Microseconds that creating a journal segment file takes (a slow host).
    create_delay_us: Arc<AtomicU64>,
}

#[derive(Default)]
struct HostState {
    cap: Option<u64>,
    /// Checkpoint files: by name, their number; by number, their length and the 4 KiB
    /// blocks written in it (those a sparse file takes).
    names: HashMap<std::path::PathBuf, u64>,
    sparse: HashMap<u64, Sparse>,
    next: u64,
    /// Journal segments made whole (allocated, or renamed into place), by name.
    segments: HashSet<std::path::PathBuf>,
}

#[derive(Default)]
struct Sparse {
    len: u64,
    blocks: Vec<bool>,
    taken: u64,
}

const HB: u64 = 4096;

impl Sparse {
    /// Bytes that writing `off..end` would add.
    fn grow(&self, off: u64, end: u64) -> u64 {
        (off / HB..end.div_ceil(HB))
            .filter(|&b| !self.blocks.get(b as usize).copied().unwrap_or(false))
            .count() as u64
            * HB
    }

    fn write(&mut self, off: u64, end: u64) {
        self.len = self.len.max(end);
        for b in off / HB..end.div_ceil(HB) {
            let b = b as usize;
            if self.blocks.len() <= b {
                self.blocks.resize(b + 1, false);
            }
            if !self.blocks[b] {
                self.blocks[b] = true;
                self.taken += HB;
            }
        }
    }

    fn set_len(&mut self, len: u64) {
        self.len = len;
        let keep = len.div_ceil(HB) as usize;
        if self.blocks.len() > keep {
            self.taken -= self.blocks[keep..].iter().filter(|&&b| b).count() as u64 * HB;
            self.blocks.truncate(keep);
        }
    }
}

impl HostState {
    /// Bytes of the checkpoint files' lengths that take no room (never written).
    fn slack(&self) -> u64 {
        self.names
            .values()
            .map(|id| {
                let f = &self.sparse[id];
                f.len.saturating_sub(f.taken)
            })
            .sum()
    }
}

fn nospace() -> io::Error {
    io::Error::from_raw_os_error(libc::ENOSPC)
}

impl Host {
    fn new() -> Host {
        Host {
            sim: SimDisk::new(),
            st: Arc::default(),
            made: Arc::default(),
            removed: Arc::default(),
            kept: Arc::default(),
            create_delay_us: Arc::default(),
        }
    }

    fn set_cap(&self, cap: Option<u64>) {
        self.st.lock().unwrap().cap = cap;
    }

    /// Bytes held, as the host counts them.
    fn used(&self) -> u64 {
        let st = self.st.lock().unwrap();
        self.sim.used().saturating_sub(st.slack())
    }

    /// Bytes the checkpoint file takes (its blocks written).
    fn checkpoint_taken(&self) -> u64 {
        let st = self.st.lock().unwrap();
        st.names
            .iter()
            .filter(|(p, _)| p.ends_with("checkpoint.redb"))
            .map(|(_, id)| st.sparse[id].taken)
            .sum()
    }

    /// ENOSPC unless `grow` more bytes fit (with the state locked).
    fn room(&self, st: &HostState, grow: u64) -> io::Result<()> {
        match st.cap {
            Some(cap) if grow > 0 && self.sim.used().saturating_sub(st.slack()) + grow > cap => {
                Err(nospace())
            }
            _ => Ok(()),
        }
    }
}

fn is_ckpt(p: &Path) -> bool {
    p.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.ends_with(".redb") || n.ends_with(".redb.tmp"))
}

fn is_segment(p: &Path) -> bool {
    p.parent()
        .and_then(|d| d.file_name())
        .is_some_and(|d| d == "journal")
        && p.extension().is_some_and(|e| e == "seg")
}

struct HostFile {
    inner: Arc<dyn DiskFile>,
    host: Host,
    /// A checkpoint file's number in [`HostState::sparse`].
    sparse: Option<u64>,
    /// A journal segment's name (the one it was opened by).
    segment: Option<std::path::PathBuf>,
}

impl HostFile {
    /// Writes (or allocates) `off..end` with `w`, if the room it takes fits.
    fn grow(&self, off: u64, end: u64, w: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
        let mut st = self.host.st.lock().unwrap();
        match self.sparse {
            Some(id) => {
                let grow = st.sparse[&id].grow(off, end);
                self.host.room(&st, grow)?;
                w()?;
                st.sparse.get_mut(&id).unwrap().write(off, end);
                Ok(())
            }
            None => {
                let grow = end.saturating_sub(self.inner.len()?);
                self.host.room(&st, grow)?;
                w()
            }
        }
    }
}

impl DiskFile for HostFile {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        self.inner.read_at(buf, off)
    }
    fn read_blocks(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        self.inner.read_blocks(buf, off)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        self.grow(off, off + buf.len() as u64, || {
            self.inner.write_at(buf, off)
        })
    }
    fn write_blocks(&self, buf: &[u8], off: u64) -> io::Result<()> {
        self.grow(off, off + buf.len() as u64, || {
            self.inner.write_blocks(buf, off)
        })
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut st = self.host.st.lock().unwrap();
        match self.sparse {
            Some(id) => {
                // Sparse: a longer file takes no room until written.
                self.inner.set_len(len)?;
                st.sparse.get_mut(&id).unwrap().set_len(len);
                Ok(())
            }
            None => {
                let grow = len.saturating_sub(self.inner.len()?);
                self.host.room(&st, grow)?;
                self.inner.set_len(len)
            }
        }
    }
    fn allocate(&self, len: u64) -> io::Result<()> {
        self.grow(0, len, || self.inner.allocate(len))?;
        if let Some(p) = &self.segment {
            self.host.made.fetch_add(1, SeqCst);
            self.host.st.lock().unwrap().segments.insert(p.clone());
        }
        Ok(())
    }
    fn sync_data(&self) -> io::Result<()> {
        self.inner.sync_data()
    }
}

impl Disk for Host {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.sim.create_dir_all(path)
    }
    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn DiskFile>> {
        let delay = self.create_delay_us.load(SeqCst);
        if delay > 0 && create && is_segment(path) && !self.sim.exists(path) {
            std::thread::sleep(Duration::from_micros(delay));
        }
        let inner = self.sim.open(path, create)?;
        let sparse = if is_ckpt(path) {
            let mut st = self.st.lock().unwrap();
            let id = match st.names.get(path) {
                Some(&id) => id,
                None => {
                    // Found on the disk: all of it counts.
                    let len = inner.len()?;
                    st.next += 1;
                    let id = st.next;
                    st.names.insert(path.to_path_buf(), id);
                    let mut f = Sparse::default();
                    f.write(0, len);
                    st.sparse.insert(id, f);
                    id
                }
            };
            Some(id)
        } else {
            None
        };
        Ok(Arc::new(HostFile {
            inner,
            host: self.clone(),
            sparse,
            segment: is_segment(path).then(|| path.to_path_buf()),
        }))
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut st = self.st.lock().unwrap();
        self.sim.remove(path)?;
        st.names.remove(path);
        // Not a segment whose making failed: one the journal had.
        if st.segments.remove(path) {
            self.removed.fetch_add(1, SeqCst);
        }
        Ok(())
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut st = self.st.lock().unwrap();
        self.sim.rename(from, to)?;
        st.names.remove(to);
        if let Some(id) = st.names.remove(from) {
            st.names.insert(to.to_path_buf(), id);
        }
        if is_segment(to) {
            self.made.fetch_add(1, SeqCst);
            st.segments.insert(to.to_path_buf());
        }
        if st.segments.remove(from) {
            self.kept.fetch_add(1, SeqCst);
        }
        Ok(())
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<std::ffi::OsString>> {
        self.sim.list(dir)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.sim.sync_dir(dir)
    }
    fn exists(&self, path: &Path) -> bool {
        self.sim.exists(path)
    }
    fn lock(&self, path: &Path) -> io::Result<Box<dyn Send + Sync>> {
        self.sim.lock(path)
    }
    fn available(&self, _dir: &Path) -> Option<u64> {
        let st = self.st.lock().unwrap();
        st.cap
            .map(|c| c.saturating_sub(self.sim.used().saturating_sub(st.slack())))
    }
}

// ------------------------------------------------------------------------------------------
// 1. Power cuts at every flush of segmentwise checkpoints.
// ------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Ev {
    /// The file (id, len) was fsynced whole.
    Acked(u64, u64, usize),
    /// Its removal is about to be asked for (from now on it may be gone).
    Unlinking(u64),
    /// Its removal was made durable by an fsync of its directory.
    Unlinked(u64),
}

struct Job {
    flush: u64,
    at: SyncPoint,
    /// Events acknowledged before the image was taken, and events begun before it was
    /// done.
    before: usize,
    after: usize,
    images: Vec<(&'static str, SimDisk)>,
}

/// What the verifier knows: the model built from the events, incrementally.
#[derive(Default)]
struct Model {
    acked_upto: usize,
    started_upto: usize,
    /// id -> (dir index, len)
    acked: HashMap<u64, (usize, u64)>,
    unlinked: HashSet<u64>,
    maybe_gone: HashSet<u64>,
}

impl Model {
    fn advance(&mut self, evs: &[Ev], before: usize, after: usize) {
        for e in &evs[self.acked_upto..before] {
            match *e {
                Ev::Acked(id, len, d) => {
                    self.acked.insert(id, (d, len));
                }
                Ev::Unlinked(id) => {
                    self.unlinked.insert(id);
                }
                Ev::Unlinking(_) => {}
            }
        }
        self.acked_upto = before;
        for e in &evs[self.started_upto..after] {
            if let Ev::Unlinking(id) = *e {
                self.maybe_gone.insert(id);
            }
        }
        self.started_upto = after;
    }
}

/// Checks one crash image against the model; returns what is wrong.
fn check_image(img: &SimDisk, seg: u64, m: &Model) -> Result<(), String> {
    let dir = Path::new(DIR);
    let opts = quiet(img, seg);
    fsck::check(dir, &opts).map_err(|e| format!("fsck: {e}"))?;
    let o = lanefs_store::open(dir, Config::default(), opts).map_err(|e| format!("open: {e}"))?;
    let fs = Arc::new(o.fs);
    fs.check_invariants()
        .map_err(|e| format!("invariants: {e}"))?;
    let c = Client::root(fs.clone());
    let t = tree(&c).map_err(|e| format!("reading the tree: {e}"))?;
    let mut present = HashSet::new();
    for (p, data) in &t {
        let base = p.rsplit('/').next().unwrap_or("");
        let (id, len) = parse(base).ok_or_else(|| format!("unknown file {p}"))?;
        given(id, len, data).map_err(|e| format!("{p}: {e}"))?;
        if m.unlinked.contains(&id) {
            return Err(format!("{p}: its removal was fsynced, it is still there"));
        }
        if m.acked.contains_key(&id) && data.len() as u64 != len {
            return Err(format!(
                "{p}: fsynced with {len} bytes, holds {}",
                data.len()
            ));
        }
        present.insert(id);
    }
    for (&id, &(d, len)) in &m.acked {
        if !present.contains(&id) && !m.maybe_gone.contains(&id) {
            return Err(format!(
                "/w{d}/{} was fsynced and never removed, it is missing",
                name(id, len)
            ));
        }
    }
    drop(c);
    drop(fs);
    o.store.close().map_err(|e| format!("close: {e:?}"))?;
    Ok(())
}

#[test]
fn power_cuts_at_every_flush_of_lean_checkpoints() {
    let seed = seed::seed("power_cuts_at_every_flush_of_lean_checkpoints");
    let seg: u64 = 16 << 10;
    let host = Host::new();
    let sim = host.sim.clone();
    let opts = Options {
        disk: Arc::new(host.clone()),
        segment_size: seg,
        checkpoint_segments: 2,
        checkpoint_poll: Duration::from_millis(20),
        checkpoint_retry: Duration::from_millis(10),
        checkpoint_retry_max: Duration::from_millis(80),
        commit_interval: Duration::from_millis(5),
        ..Options::default()
    };
    let o = lanefs_store::open(Path::new(DIR), Config::default(), opts).unwrap();
    let fs: Arc<Filesystem> = Arc::new(o.fs);
    let store = o.store;
    let c = Client::root(fs.clone());
    const WORKERS: usize = 3;
    for w in 0..WORKERS {
        c.create_dir(format!("/w{w}")).unwrap();
    }
    fs.sync_all().unwrap();

    let evs: Arc<Mutex<Vec<Ev>>> = Arc::default();
    let (tx, rx) = mpsc::sync_channel::<Job>(3);
    let sending = Arc::new(AtomicBool::new(true));
    let flushes = Arc::new(AtomicU64::new(0));
    {
        let (evs, sending, flushes) = (evs.clone(), sending.clone(), flushes.clone());
        let tx = Mutex::new(tx);
        sim.on_sync(move |d, at| {
            if !sending.load(SeqCst) {
                return;
            }
            let n = flushes.fetch_add(1, SeqCst);
            let before = evs.lock().unwrap().len();
            let torn = seed ^ n.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ (at as u64);
            let images = match at {
                // Kept before a flush is the image kept after it.
                SyncPoint::Before => vec![
                    ("lost", d.crash(Unflushed::Lost)),
                    ("torn", d.crash(Unflushed::Torn(torn))),
                ],
                SyncPoint::After => vec![
                    ("lost", d.crash(Unflushed::Lost)),
                    ("kept", d.crash(Unflushed::Kept)),
                    ("torn", d.crash(Unflushed::Torn(torn))),
                ],
            };
            let after = evs.lock().unwrap().len();
            let _ = tx.lock().unwrap().send(Job {
                flush: n,
                at,
                before,
                after,
                images,
            });
        });
    }
    let failed = Arc::new(AtomicBool::new(false));
    let verifier = {
        let (evs, failed) = (evs.clone(), failed.clone());
        std::thread::spawn(move || {
            let mut m = Model::default();
            let mut found: Vec<String> = Vec::new();
            let mut images = 0u64;
            for job in rx {
                let all = evs.lock().unwrap().clone();
                m.advance(&all, job.before, job.after);
                for (kind, img) in &job.images {
                    images += 1;
                    if let Err(e) = check_image(img, seg, &m) {
                        let s = format!("flush {} {:?}, {kind}: {e}", job.flush, job.at);
                        eprintln!("FOUND: {s}");
                        found.push(s);
                        failed.store(true, SeqCst);
                    }
                }
                if found.len() >= 5 {
                    // Drain without checking.
                    failed.store(true, SeqCst);
                }
            }
            (images, found, m.acked.len())
        })
    };

    let stop = AtomicBool::new(false);
    let other_errors: Mutex<Vec<String>> = Mutex::default();
    let (acks, unlinks, refused, cps_ok, cps_err) = (
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    );
    let cp_errs: Mutex<BTreeMap<String, usize>> = Mutex::default();
    let run = secs(8.0);
    let began = Instant::now();
    std::thread::scope(|s| {
        for w in 0..WORKERS {
            let (c, evs, stop, other_errors) = (c.clone(), &evs, &stop, &other_errors);
            let (acks, unlinks, refused) = (&acks, &unlinks, &refused);
            s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ ((w as u64 + 1) * 0x1234_5678_9abc));
                let dir = format!("/w{w}");
                let mut mine: Vec<(u64, u64)> = Vec::new();
                let mut n = 0u64;
                let bad = |what: &str, e: &io::Error| {
                    other_errors
                        .lock()
                        .unwrap()
                        .push(format!("worker {w}: {what}: {e}"));
                };
                while !stop.load(SeqCst) {
                    if !mine.is_empty() && rng.random_bool(0.3) {
                        let (id, len) = mine.swap_remove(rng.random_range(0..mine.len()));
                        evs.lock().unwrap().push(Ev::Unlinking(id));
                        if let Err(e) = c.remove_file(format!("{dir}/{}", name(id, len))) {
                            bad("remove", &e);
                            continue;
                        }
                        match dir_sync(&c, &dir) {
                            Ok(()) => {
                                evs.lock().unwrap().push(Ev::Unlinked(id));
                                unlinks.fetch_add(1, SeqCst);
                            }
                            Err(e) if enospc(&e) => {
                                refused.fetch_add(1, SeqCst);
                            }
                            Err(e) => bad("fsync of a directory", &e),
                        }
                        continue;
                    }
                    n += 1;
                    let id = (w as u64) << 40 | n;
                    let len = match rng.random_range(0..10) {
                        0..=3 => rng.random_range(0..200),
                        4..=6 => rng.random_range(200..6000),
                        7..=8 => rng.random_range(6000..seg),
                        _ => rng.random_range(seg..3 * seg),
                    };
                    let big = if rng.random_bool(0.2) { 2 * seg } else { 4096 };
                    match write_file(&c, &dir, id, len, big, true, &mut rng) {
                        Ok(()) => {
                            evs.lock().unwrap().push(Ev::Acked(id, len, w));
                            acks.fetch_add(1, SeqCst);
                            mine.push((id, len));
                        }
                        Err(e) if enospc(&e) => {
                            refused.fetch_add(1, SeqCst);
                            // Not acknowledged: given back (its removal is never refused).
                            evs.lock().unwrap().push(Ev::Unlinking(id));
                            match c.remove_file(format!("{dir}/{}", name(id, len))) {
                                Ok(()) => {}
                                Err(e) if errno(&e) == libc::ENOENT => {}
                                Err(e) => bad("remove of a refused file", &e),
                            }
                            std::thread::sleep(Duration::from_millis(rng.random_range(0..3)));
                        }
                        Err(e) => bad("write", &e),
                    }
                }
            });
        }
        // Checkpoints on demand, back to back.
        s.spawn(|| {
            while !stop.load(SeqCst) {
                match store.checkpoint().map_err(|e| e.to_string()) {
                    Ok(_) => cps_ok.fetch_add(1, SeqCst),
                    Err(e) => {
                        let key: String = e.chars().take(90).collect();
                        *cp_errs.lock().unwrap().entry(key).or_default() += 1;
                        cps_err.fetch_add(1, SeqCst)
                    }
                };
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        // The host's cap: a few segments above what is used, now and then none at all.
        s.spawn(|| {
            let mut rng = StdRng::seed_from_u64(seed ^ 0xcafe);
            while !stop.load(SeqCst) {
                if began.elapsed() >= run || failed.load(SeqCst) {
                    stop.store(true, SeqCst);
                    break;
                }
                let k = [0u64, 1, 1, 2, 2, 3, 4, 6][rng.random_range(0..8)];
                if rng.random_bool(0.1) {
                    host.set_cap(None);
                } else {
                    host.set_cap(Some(host.used() + k * seg + rng.random_range(0..seg)));
                }
                std::thread::sleep(Duration::from_millis(rng.random_range(2..40)));
            }
        });
    });
    host.set_cap(None);
    sending.store(false, SeqCst);
    sim.clear_hook();
    let (images, found, acked) = verifier.join().unwrap();
    eprintln!(
        "{:?}: {} flushes, {images} images, {} files acked ({acked} seen by the verifier), {} \
         removals acked, {} refusals (ENOSPC), checkpoints {} ok / {} failed",
        began.elapsed(),
        flushes.load(SeqCst),
        acks.load(SeqCst),
        unlinks.load(SeqCst),
        refused.load(SeqCst),
        cps_ok.load(SeqCst),
        cps_err.load(SeqCst)
    );
    eprintln!(
        "  journal segments removed {}, kept for reuse {}, made {}; checkpoint at {}",
        host.removed.load(SeqCst),
        host.kept.load(SeqCst),
        host.made.load(SeqCst),
        store.checkpoint_lsn()
    );
    for (e, n) in cp_errs.lock().unwrap().iter() {
        eprintln!("  checkpoint error x{n}: {e}");
    }
    let other = other_errors.lock().unwrap().clone();
    assert!(found.is_empty(), "crash images wrong: {found:#?}");
    assert!(other.is_empty(), "errors other than ENOSPC: {other:#?}");
    assert!(images > 0 && acks.load(SeqCst) > 0, "nothing ran");
    assert!(
        host.removed.load(SeqCst) > 0,
        "no checkpoint removed a segment: the lean path did not run"
    );

    // Room again: the store goes on, and reopens as it is.
    fs.sync_all().expect("a sync once the cap is lifted");
    store
        .checkpoint()
        .expect("a checkpoint once the cap is lifted");
    fs.check_invariants().unwrap();
    let live = tree(&c).unwrap();
    drop(c);
    drop(fs);
    close_and_reopen_equal(store, Path::new(DIR), quiet(&sim, seg), &live);
}

// ------------------------------------------------------------------------------------------
// 2. Fill, delete, go on.
// ------------------------------------------------------------------------------------------

/// A file written: its path, id and length.
type Written = (String, u64, u64);

/// Writes files without syncing until ENOSPC; returns the files written whole (path, id,
/// len) and the one refused part way (which may hold a prefix).
fn fill(
    c: &Client,
    dir: &str,
    first_id: u64,
    sizes: &[u64],
    rng: &mut StdRng,
) -> (Vec<Written>, Option<Written>) {
    let mut whole = Vec::new();
    let mut id = first_id;
    let began = Instant::now();
    loop {
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "the host never filled"
        );
        id += 1;
        let len = sizes[rng.random_range(0..sizes.len())] + rng.random_range(0..100);
        let p = format!("{dir}/{}", name(id, len));
        match write_file(c, dir, id, len, 128 << 10, false, rng) {
            Ok(()) => whole.push((p, id, len)),
            Err(e) if enospc(&e) => return (whole, Some((p, id, len))),
            Err(e) => panic!("filling: {p}: {e}"),
        }
    }
}

/// Says what the host holds and where the store stands (for a failure's report).
fn describe(host: &Host, store: &lanefs_store::StoreHandle) {
    let files: Vec<String> = host
        .sim
        .files()
        .into_iter()
        .filter(|(p, _)| !p.starts_with("/s/lanefs"))
        .map(|(p, d)| format!("{}:{}K", p.display(), d.len() >> 10))
        .collect();
    eprintln!(
        "  host used {} KiB (checkpoint.redb takes {} KiB); {:?}; lsn {} written {:?}; files \
         {}",
        host.used() >> 10,
        host.checkpoint_taken() >> 10,
        store.checkpoint_status(),
        store.checkpoint_lsn(),
        store.counters(),
        files.join(" ")
    );
}

/// Tries `f` until it succeeds with ENOSPC meanwhile, for at most `limit`; returns how long
/// it took.
fn until_ok(
    what: &str,
    limit: Duration,
    on_fail: &dyn Fn(),
    mut f: impl FnMut() -> io::Result<()>,
) -> Duration {
    let began = Instant::now();
    let mut tries = 0;
    loop {
        tries += 1;
        match f() {
            Ok(()) => return began.elapsed(),
            Err(e) if enospc(&e) && began.elapsed() < limit => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => {
                on_fail();
                panic!("{what}: {e} after {tries} tries in {:?}", began.elapsed())
            }
        }
    }
}

#[test]
#[ignore = "fails in about one run in six: the known bug C in docs/STORE.md, Checkpoints, Out of room"]
fn fill_delete_and_go_on() {
    let seed = seed::seed("fill_delete_and_go_on");
    let mut rng = StdRng::seed_from_u64(seed);
    let seg: u64 = 4 << 20;
    let cap = 32 * seg;
    let host = Host::new();
    host.set_cap(Some(cap));
    let opts = Options {
        disk: Arc::new(host.clone()),
        segment_size: seg,
        // The default waits (1 s doubling to a minute) would make the bound below the
        // backoff's, not the room's.
        checkpoint_retry: Duration::from_millis(50),
        checkpoint_retry_max: Duration::from_millis(400),
        ..Options::default()
    };
    let dir = Path::new(DIR);
    let o = lanefs_store::open(dir, Config::default(), opts.clone()).unwrap();
    let fs = Arc::new(o.fs);
    let store = o.store;
    let c = Client::root(fs.clone());
    c.create_dir("/d").unwrap();
    let sizes = [10, 3000, seg, 3 * seg];
    let tracing = Arc::new(AtomicBool::new(
        std::env::var("LEAN_CHECKPOINTS_DEBUG").is_ok(),
    ));
    if tracing.load(SeqCst) {
        let (host, tracing) = (host.clone(), tracing.clone());
        std::thread::spawn(move || {
            let mut last = String::new();
            let t0 = Instant::now();
            while tracing.load(SeqCst) {
                let names = |d: &str| {
                    let mut v: Vec<String> = host
                        .list(Path::new(d))
                        .unwrap_or_default()
                        .into_iter()
                        .map(|n| n.to_string_lossy().trim_start_matches('0').to_string())
                        .collect();
                    v.sort();
                    v
                };
                let j = names("/s/journal");
                let top = names("/s");
                let now = format!(
                    "journal {} [{} .. {}] free {:?} reserve {} avail {:?}",
                    j.len(),
                    j.first().cloned().unwrap_or_default(),
                    j.iter()
                        .rfind(|n| n.ends_with(".seg"))
                        .cloned()
                        .unwrap_or_default(),
                    j.iter()
                        .filter(|n| n.ends_with(".free"))
                        .collect::<Vec<_>>(),
                    top.iter().any(|n| n == "checkpoint.reserve"),
                    host.available(Path::new("/s")).map(|a| a >> 10)
                );
                if now != last {
                    eprintln!("  {:>8.3?} {now}", t0.elapsed());
                    last = now;
                }
                std::thread::sleep(Duration::from_micros(300));
            }
        });
    }
    let mut live_model: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut gone: Vec<String> = Vec::new();
    for round in 0..2u64 {
        let t0 = Instant::now();
        let (whole, partial) = fill(&c, "/d", (round + 1) << 32, &sizes, &mut rng);
        let bytes: u64 = whole.iter().map(|w| w.2).sum();
        eprintln!(
            "round {round}: filled in {:?}: {} files whole ({} MiB), host used {} MiB of {} MiB",
            t0.elapsed(),
            whole.len(),
            bytes >> 20,
            host.used() >> 20,
            cap >> 20
        );
        for (p, id, len) in &whole {
            live_model.insert(p.clone(), (*id, *len));
        }
        // The refused file: what it holds, it keeps (a prefix), unless removed below.
        let mut partial_path = None;
        if let Some((p, id, len)) = &partial
            && c.exists(p)
        {
            partial_path = Some((p.clone(), *id, *len));
        }
        // Delete half of what is there (every other file), the refused one too.
        let t1 = Instant::now();
        let mut freed = 0;
        let names: Vec<String> = live_model.keys().cloned().collect();
        for (k, p) in names.iter().enumerate() {
            if k % 2 == round as usize % 2 {
                c.remove_file(p)
                    .unwrap_or_else(|e| panic!("removal of {p} refused: {e}"));
                freed += live_model.remove(p).unwrap().1;
                gone.push(p.clone());
            }
        }
        if let Some((p, _, _)) = partial_path.take() {
            c.remove_file(&p).unwrap();
            gone.push(p);
        }
        eprintln!(
            "round {round}: {} MiB deleted in {:?}",
            freed >> 20,
            t1.elapsed()
        );
        if std::env::var("LEAN_CHECKPOINTS_DEBUG").is_ok() {
            for _ in 0..8 {
                std::thread::sleep(Duration::from_millis(1000));
                describe(&host, &store);
            }
            eprintln!("manual checkpoint: {:?}", store.checkpoint());
            describe(&host, &store);
        }
        // A small file and its sync must go through again, within 30 s.
        let small = (round + 1) << 32 | 0xffff_0000;
        let mut k = 0;
        let took = until_ok(
            "a small file after the deletions",
            Duration::from_secs(30),
            &|| describe(&host, &store),
            || {
                k += 1;
                let id = small + k;
                let p = format!("/d/{}", name(id, 100));
                let _ = c.remove_file(&p);
                let r = c
                    .write(&p, content(id, 0, 100))
                    .and_then(|()| Ok(fs.sync_all()?));
                if r.is_ok() {
                    live_model.insert(p, (id, 100));
                } else {
                    let _ = c.remove_file(&p);
                }
                r
            },
        );
        eprintln!("round {round}: a small file and sync went through after {took:?}");
        // Then a quarter of what was deleted, in files of each size, each synced, within
        // 30 s: the host took no more than "a few megabytes at once" back (docs/STORE.md,
        // "Out of room"), so each piece refused for ENOSPC is tried again, as a patient
        // writer would, while checkpoints cycle the journal through the checkpoint's free
        // pages.
        let t2 = Instant::now();
        let limit = Duration::from_secs(30);
        let mut written = 0;
        let mut id = (round + 1) << 32 | 0xfff0_0000;
        let mut refusals = 0u64;
        while written < freed / 4 {
            id += 1;
            let len = sizes[rng.random_range(0..sizes.len())].min(freed / 4 - written + 10);
            let p = format!("/d/{}", name(id, len));
            let what = format!("{p} ({written} of {} bytes)", freed / 4);
            let retry = |r: io::Result<()>, refusals: &mut u64| match r {
                Ok(()) => true,
                Err(e) if enospc(&e) && t2.elapsed() < limit => {
                    *refusals += 1;
                    std::thread::sleep(Duration::from_millis(10));
                    false
                }
                Err(e) => {
                    describe(&host, &store);
                    panic!("{what}: {e} after {:?}, {refusals} refusals", t2.elapsed())
                }
            };
            let f = loop {
                let r = c.open(&p, OpenOptions::new().write(true).create_new(true));
                match r {
                    Ok(f) => break f,
                    Err(e) => {
                        retry(Err(e), &mut refusals);
                    }
                }
            };
            let mut at = 0;
            while at < len {
                let n = (128 << 10).min(len - at);
                let r = f
                    .write_at(&content(id, at, n), at)
                    .map(|w| assert_eq!(w as u64, n));
                if retry(r, &mut refusals) {
                    at += n;
                }
            }
            while !retry(f.sync_all(), &mut refusals) {}
            drop(f);
            live_model.insert(p, (id, len));
            written += len;
        }
        eprintln!(
            "round {round}: {} MiB more written and synced in {:?} ({refusals} refusals); \
             checkpoints {:?}",
            written >> 20,
            t2.elapsed(),
            store.checkpoint_status()
        );
    }
    tracing.store(false, SeqCst);
    // The live state is the model.
    let live = tree(&c).unwrap();
    for (p, (id, len)) in &live_model {
        let d = live.get(p).unwrap_or_else(|| panic!("{p} missing"));
        assert_eq!(d.len() as u64, *len, "{p}");
        given(*id, *len, d).unwrap();
    }
    for p in &gone {
        assert!(!live.contains_key(p), "{p} deleted, still there");
    }
    assert_eq!(live.len(), live_model.len(), "files nobody wrote");
    fs.check_invariants().unwrap();
    fs.sync_all().unwrap();
    drop(c);
    drop(fs);
    close_and_reopen_equal(store, dir, opts, &live);
}

// ------------------------------------------------------------------------------------------
// 3. Room comes and goes under load.
// ------------------------------------------------------------------------------------------

#[test]
fn room_comes_and_goes_under_load() {
    let seed = seed::seed("room_comes_and_goes_under_load");
    let seg: u64 = 64 << 10;
    let host = Host::new();

    let opts = Options {
        disk: Arc::new(host.clone()),
        segment_size: seg,
        checkpoint_segments: 3,
        checkpoint_poll: Duration::from_millis(30),
        checkpoint_retry: Duration::from_millis(20),
        checkpoint_retry_max: Duration::from_millis(200),
        ..Options::default()
    };
    let dir = Path::new(DIR);
    let o = lanefs_store::open(dir, Config::default(), opts.clone()).unwrap();
    let fs = Arc::new(o.fs);
    let store = o.store;
    let c = Client::root(fs.clone());
    const WORKERS: usize = 3;
    for w in 0..WORKERS {
        c.create_dir(format!("/w{w}")).unwrap();
    }
    fs.sync_all().unwrap();
    let stop = AtomicBool::new(false);
    let other: Mutex<Vec<String>> = Mutex::default();
    // Per worker: files acked (path -> (id, len)), removals acked, removals begun.
    type Kept = (BTreeMap<String, (u64, u64)>, Vec<String>, HashSet<String>);
    let models: Vec<Mutex<Kept>> = (0..WORKERS).map(|_| Mutex::default()).collect();
    let (acks, refused, cps_ok, cps_err, flips) = (
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    );
    let run = secs(5.0);
    let began = Instant::now();
    std::thread::scope(|s| {
        for (w, model) in models.iter().enumerate() {
            let (c, stop, other) = (c.clone(), &stop, &other);
            let (acks, refused) = (&acks, &refused);
            s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ ((w as u64 + 7) * 0x9876_5432));
                let dir = format!("/w{w}");
                let mut n = 0u64;
                let bad = |what: String, e: &io::Error| {
                    other
                        .lock()
                        .unwrap()
                        .push(format!("worker {w}: {what}: {e}"));
                };
                while !stop.load(SeqCst) {
                    let mine: Vec<String> = model.lock().unwrap().0.keys().cloned().collect();
                    if !mine.is_empty() && rng.random_bool(0.35) {
                        let p = mine[rng.random_range(0..mine.len())].clone();
                        model.lock().unwrap().2.insert(p.clone());
                        model.lock().unwrap().0.remove(&p);
                        if let Err(e) = c.remove_file(&p) {
                            bad(format!("remove {p}"), &e);
                            continue;
                        }
                        match dir_sync(&c, &dir) {
                            Ok(()) => model.lock().unwrap().1.push(p),
                            Err(e) if enospc(&e) => {
                                refused.fetch_add(1, SeqCst);
                            }
                            Err(e) => bad("fsync of a directory".into(), &e),
                        }
                        continue;
                    }
                    n += 1;
                    let id = (w as u64 + 1) << 40 | n;
                    let len = match rng.random_range(0..10) {
                        0..=3 => rng.random_range(0..300),
                        4..=7 => rng.random_range(300..seg / 2),
                        _ => rng.random_range(seg / 2..2 * seg),
                    };
                    let p = format!("{dir}/{}", name(id, len));
                    match write_file(&c, &dir, id, len, 32 << 10, true, &mut rng) {
                        Ok(()) => {
                            model.lock().unwrap().0.insert(p, (id, len));
                            acks.fetch_add(1, SeqCst);
                        }
                        Err(e) if enospc(&e) => {
                            refused.fetch_add(1, SeqCst);
                            std::thread::sleep(Duration::from_millis(1));
                            if rng.random_bool(0.5) {
                                model.lock().unwrap().2.insert(p.clone());
                                match c.remove_file(&p) {
                                    Ok(()) => {}
                                    Err(e) if errno(&e) == libc::ENOENT => {}
                                    Err(e) => bad(format!("remove of refused {p}"), &e),
                                }
                            }
                        }
                        Err(e) => bad(format!("write {p}"), &e),
                    }
                }
            });
        }
        s.spawn(|| {
            while !stop.load(SeqCst) {
                match store.checkpoint() {
                    Ok(_) => cps_ok.fetch_add(1, SeqCst),
                    Err(_) => cps_err.fetch_add(1, SeqCst),
                };
                std::thread::sleep(Duration::from_millis(3));
            }
        });
        s.spawn(|| {
            let mut rng = StdRng::seed_from_u64(seed ^ 0xf11b);
            while began.elapsed() < run {
                flips.fetch_add(1, SeqCst);
                let k = rng.random_range(0..3);
                host.set_cap(Some(host.used() + k * seg + rng.random_range(0..seg)));
                std::thread::sleep(Duration::from_millis(rng.random_range(30..300)));
                host.set_cap(None);
                std::thread::sleep(Duration::from_millis(rng.random_range(30..300)));
            }
            stop.store(true, SeqCst);
        });
    });
    host.set_cap(None);
    eprintln!(
        "{:?}: {} cap flips, {} files acked, {} refusals, checkpoints {} ok / {} failed, {:?}",
        began.elapsed(),
        flips.load(SeqCst),
        acks.load(SeqCst),
        refused.load(SeqCst),
        cps_ok.load(SeqCst),
        cps_err.load(SeqCst),
        store.checkpoint_status()
    );
    eprintln!(
        "  journal segments removed {}, kept for reuse {}, made {}",
        host.removed.load(SeqCst),
        host.kept.load(SeqCst),
        host.made.load(SeqCst),
    );
    let other = other.into_inner().unwrap();
    assert!(other.is_empty(), "errors other than ENOSPC: {other:#?}");
    // The cap is lifted: the store recovers at once.
    if let Err(e) = fs.sync_all() {
        panic!("the first sync once the cap is lifted: {e:?}");
    }
    if let Err(e) = store.checkpoint() {
        panic!("the first checkpoint once the cap is lifted: {e}");
    }
    fs.check_invariants().unwrap();
    let live = tree(&c).unwrap();
    for p in live.keys() {
        let base = p.rsplit('/').next().unwrap();
        let (id, len) = parse(base).unwrap_or_else(|| panic!("unknown {p}"));
        given(id, len, &live[p]).unwrap_or_else(|e| panic!("{p}: {e}"));
    }
    for m in &models {
        let m = m.lock().unwrap();
        for (p, (_, len)) in &m.0 {
            let d = live
                .get(p)
                .unwrap_or_else(|| panic!("{p} was fsynced, it is missing"));
            assert_eq!(d.len() as u64, *len, "{p}");
        }
        for p in &m.1 {
            assert!(!live.contains_key(p), "{p}: removal fsynced, still there");
        }
    }
    drop(c);
    drop(fs);
    close_and_reopen_equal(store, dir, opts, &live);
}

// ------------------------------------------------------------------------------------------
// 4. The room a checkpoint short of room frees is its own.
// ------------------------------------------------------------------------------------------

/// docs/STORE.md, "Out of room": "While such a checkpoint runs, and after it fails with the
/// host still short, the journal makes no new segment (`Checkpoint::room_hold`): the room the
/// checkpoint frees goes to it, not to held records". A store fills its host without syncing
/// (records held), and a checkpoint is asked for: it begins short of room for even one
/// segment's commit, gives up `checkpoint.reserve` (it follows a failure: its own sync's), and
/// no journal segment may be made until it returns. Tried on a few fresh stores, as the
/// journal's spare is made on a thread of its own.
#[test]
#[ignore = "fails: known bug A in docs/STORE.md, Checkpoints, Out of room (a spare started before the room hold takes the reserve; left so on purpose for now, see there)"]
fn a_checkpoint_short_of_room_keeps_its_room_from_the_journal() {
    let seed = seed::seed("a_checkpoint_short_of_room_keeps_its_room_from_the_journal");
    let mut rng = StdRng::seed_from_u64(seed);
    let seg: u64 = 1 << 20;
    let mut found = Vec::new();
    for trial in 0..6 {
        let host = Host::new();
        host.set_cap(Some(16 * seg));
        // A host that takes a moment to create a file (the window is there without it, but
        // narrower: most runs of this test on an idle machine find it all the same).
        host.create_delay_us.store(2000, SeqCst);
        // Only the checkpoints asked for below.
        let opts = manual_opts(&host, seg);
        let dir = Path::new(DIR);
        let o = lanefs_store::open(dir, Config::default(), opts).unwrap();
        let fs = Arc::new(o.fs);
        let c = Client::root(fs.clone());
        c.create_dir("/d").unwrap();
        let (whole, _) = fill(&c, "/d", 1 << 32, &[3000, seg / 2, seg], &mut rng);
        // The journal's spare maker has failed a few times by now.
        std::thread::sleep(Duration::from_millis(rng.random_range(60..200)));
        let avail = host.available(dir).unwrap();
        assert!(
            avail < seg + seg / 4,
            "the host is not short: {avail} bytes left"
        );
        let before = host.made.load(SeqCst);
        let r = o.store.checkpoint();
        let made = host.made.load(SeqCst) - before;
        eprintln!(
            "trial {trial}: {} files, {} KiB left; checkpoint: {r:?}; segments made meanwhile: \
             {made}; {} KiB left after",
            whole.len(),
            avail >> 10,
            host.available(dir).unwrap() >> 10
        );
        if made > 0 {
            found.push(format!(
                "trial {trial}: {made} journal segment(s) made while a checkpoint that began \
                 with {} KiB left (short of {} KiB for one segment) ran; it returned {r:?} and \
                 left {} KiB",
                avail >> 10,
                (seg + seg / 4) >> 10,
                host.available(dir).unwrap() >> 10
            ));
            break;
        }
        drop(c);
        drop(fs);
        let _ = o.store.close();
    }
    assert!(found.is_empty(), "{found:#?}");
}

// ------------------------------------------------------------------------------------------
// 5. After a lean checkpoint the journal can still go on.
// ------------------------------------------------------------------------------------------

/// docs/STORE.md, "Out of room": after a store filled its host, deleting half its files lets
/// it take "a few more megabytes at once, and the rest as checkpoints cycle the journal's
/// segments through the database's free pages"; a lean checkpoint keeps "the last commit's
/// segments ... for reuse, for the journal's next spare". Here checkpoints are only those
/// asked for (so the schedule is this test's): files are written and fsynced until the host
/// is full, half are deleted, checkpoints are taken until one succeeds, and then a quarter of
/// what was deleted must go in (each piece refused for ENOSPC tried again after a checkpoint
/// asked for), within 5 s.
#[test]
#[ignore = "fails on 2 of 3 seeds: known bug B in docs/STORE.md, Checkpoints, Out of room (segmentwise commits outgrow the reserve)"]
fn after_a_lean_checkpoint_the_journal_goes_on() {
    let seed = seed::seed("after_a_lean_checkpoint_the_journal_goes_on");
    let mut rng = StdRng::seed_from_u64(seed);
    // The least segment lanefs_store::segment_size picks for a small host.
    let seg: u64 = 4 << 20;
    let host = Host::new();
    host.set_cap(Some(32 * seg));
    let opts = manual_opts(&host, seg);
    let dir = Path::new(DIR);
    let o = lanefs_store::open(dir, Config::default(), opts).unwrap();
    let fs = Arc::new(o.fs);
    let store = o.store;
    let c = Client::root(fs.clone());
    c.create_dir("/d").unwrap();
    let mut files = Vec::new();
    let mut id = 0u64;
    loop {
        id += 1;
        let len = rng.random_range(seg / 8..seg / 2);
        match write_file(&c, "/d", id, len, 128 << 10, true, &mut rng) {
            Ok(()) => files.push((format!("/d/{}", name(id, len)), len)),
            Err(e) if enospc(&e) => break,
            Err(e) => panic!("{e}"),
        }
    }
    let full: u64 = files.iter().map(|f| f.1).sum();
    // The files' data goes into the checkpoint first (segment by segment: the host is
    // short), so that deleting them frees pages of the checkpoint, not of the journal.
    let _ = c.remove_file(format!("/d/{}", name(id, 0)));
    let (first, tries) = checkpoint_tries(&store, 8);
    eprintln!(
        "{} KiB synced in {} files; first checkpoint after {tries} tries: {first:?}; segments \
         removed {}, kept {}; {} KiB left",
        full >> 10,
        files.len(),
        host.removed.load(SeqCst),
        host.kept.load(SeqCst),
        host.available(dir).unwrap() >> 10
    );
    let mut freed = 0;
    for (k, (p, len)) in files.iter().enumerate() {
        if k % 2 == 0 {
            c.remove_file(p).unwrap();
            freed += len;
        }
    }
    let _ = c.remove_file(format!("/d/{}", name(id, 0)));
    let (r, tries) = checkpoint_tries(&store, 8);
    eprintln!(
        "{} KiB deleted; checkpoint after {tries} tries: {r:?}; segments removed {}, kept {}; \
         {} KiB left",
        freed >> 10,
        host.removed.load(SeqCst),
        host.kept.load(SeqCst),
        host.available(dir).unwrap() >> 10
    );
    let began = Instant::now();
    let mut written = 0;
    let mut refusals = 0;
    let mut failed: Option<String> = None;
    'all: while written < freed / 4 {
        id += 1;
        let len = (256u64 << 10).min(freed / 4 - written + 1);
        let p = format!("/d/{}", name(id, len));
        // Ok(true): done; Ok(false): refused for ENOSPC, try again; Err: give up.
        let mut step = |r: io::Result<()>| match r {
            Ok(()) => Ok(true),
            Err(e) if enospc(&e) && began.elapsed() < Duration::from_secs(5) => {
                refusals += 1;
                let _ = store.checkpoint();
                std::thread::sleep(Duration::from_millis(5));
                Ok(false)
            }
            Err(e) => Err(format!(
                "{written} of {} bytes went in after {freed} were deleted: {p}: {e} \
                 ({refusals} refusals in {:?})",
                freed / 4,
                began.elapsed()
            )),
        };
        let f = loop {
            match c.open(&p, OpenOptions::new().write(true).create_new(true)) {
                Ok(f) => break f,
                Err(e) => {
                    if let Err(why) = step(Err(e)) {
                        failed = Some(why);
                        break 'all;
                    }
                }
            }
        };
        let mut at = 0;
        while at < len {
            let n = (64u64 << 10).min(len - at);
            match step(f.write_at(&content(id, at, n), at).map(drop)) {
                Ok(true) => at += n,
                Ok(false) => {}
                Err(why) => {
                    failed = Some(why);
                    break 'all;
                }
            }
        }
        loop {
            match step(f.sync_all()) {
                Ok(true) => break,
                Ok(false) => {}
                Err(why) => {
                    failed = Some(why);
                    break 'all;
                }
            }
        }
        written += len;
    }
    if let Some(why) = failed {
        describe(&host, &store);
        // Does a reopen (on the same host, still full) give the room back?
        drop(c);
        drop(fs);
        let closed = store.close();
        let opts = Options {
            disk: Arc::new(host.clone()),
            segment_size: seg,
            ..Options::default()
        };
        let again = match lanefs_store::open(dir, Config::default(), opts) {
            Ok(o) => {
                let r: Vec<_> = (0..3).map(|_| o.store.checkpoint()).collect();
                let left = host.available(dir).unwrap() >> 10;
                format!("reopened; 3 checkpoints: {r:?}; {left} KiB left")
            }
            Err(e) => format!("the reopen failed: {e}"),
        };
        panic!("{why}; closing: {closed:?}; {again}");
    }
    eprintln!(
        "{} KiB more went in, in {:?} ({refusals} refusals)",
        written >> 10,
        began.elapsed()
    );
}
