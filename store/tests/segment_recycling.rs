//! Attacks on journal segment recycling (docs/STORE.md, "Segments", "Recycling"): power cuts
//! at every flush of a store whose segments are recycled many times, reopen cycles, damage in
//! and after the batches of recycled segments, and threads writing while checkpoints run.
//!
//! The tests run fixed seeds, printed; `LANEFS_SEED=<n>` runs another.

mod common;

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashSet};
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::seed;
use lanefs::{Client, OpenOptions};
use lanefs_store::disk::{SimDisk, Unflushed};
use lanefs_store::{Options, StoreError, fsck, open};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SEG: u64 = 1 << 16;
const DIRS: usize = 3;

fn store_dir() -> PathBuf {
    PathBuf::from("/s")
}

fn opts(sim: &SimDisk, background: bool) -> Options {
    Options {
        checkpoint_segments: if background { 2 } else { 1_000_000 },
        checkpoint_records: if background { 400 } else { u64::MAX / 2 },
        journal_segments: if background { 8 } else { 1_000_000 },
        checkpoint_poll: Duration::from_millis(if background { 5 } else { 100_000 }),
        checkpoint_reserve: 0,
        ..common::opts(sim, SEG, Duration::from_millis(2))
    }
}

struct Open {
    c: Client,
    store: lanefs_store::StoreHandle,
    report: lanefs_store::OpenReport,
}

fn open_store(sim: &SimDisk, background: bool) -> Result<Open, StoreError> {
    let o = open(
        &store_dir(),
        lanefs::Config::default(),
        opts(sim, background),
    )?;
    Ok(Open {
        c: Client::root(Arc::new(o.fs)),
        store: o.store,
        report: o.report,
    })
}

type Tree = BTreeMap<String, Vec<u8>>;

/// Power-cut images taken by a hook, each with what it needs checked and how it was made.
type Images<T> = Arc<Mutex<Vec<(SimDisk, T, String)>>>;

fn hash_tree(t: &Tree) -> u64 {
    let mut h = DefaultHasher::new();
    t.hash(&mut h);
    h.finish()
}

/// Every regular file under the DIRS directories (which must exist).
fn read_tree(c: &Client) -> Tree {
    let mut t = Tree::new();
    for d in 0..DIRS {
        let dir = format!("/d{d}");
        let entries = c
            .read_dir(&dir)
            .unwrap_or_else(|e| panic!("read_dir {dir}: {e}"));
        for e in entries {
            let name = String::from_utf8_lossy(e.name.as_ref()).to_string();
            if name == "." || name == ".." {
                continue;
            }
            let p = format!("{dir}/{name}");
            let data = c.read(&p).unwrap_or_else(|e| panic!("read {p}: {e}"));
            t.insert(p, data);
        }
    }
    t
}

/// Segment files: (seq, bytes) of `.seg`, and the `.free` seqs.
fn journal_files(sim: &SimDisk) -> (Vec<(u64, Vec<u8>)>, Vec<u64>) {
    let mut segs = Vec::new();
    let mut free = Vec::new();
    for (p, data) in sim.files() {
        let Ok(rest) = p.strip_prefix("/s/journal") else {
            continue;
        };
        let name = rest.to_string_lossy().to_string();
        if let Some(h) = name.strip_suffix(".seg") {
            if let Ok(n) = u64::from_str_radix(h, 16) {
                segs.push((n, data));
            }
        } else if let Some(h) = name.strip_suffix(".free")
            && let Ok(n) = u64::from_str_radix(h, 16)
        {
            free.push(n);
        }
    }
    segs.sort();
    free.sort();
    (segs, free)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

/// Whether the segment holds a stale batch header (LFB1 naming another segment) or is a
/// spare header with non-zero bytes after its first block: evidence of recycling.
fn recycled_evidence(seq: u64, data: &[u8]) -> bool {
    if data.len() >= 64
        && &data[..8] == b"LFSJRNL\x01"
        && u64_at(data, 40) == 0
        && data[4096.min(data.len())..].iter().any(|&b| b != 0)
    {
        return true;
    }
    let mut i = 64;
    while i + 48 <= data.len() {
        if &data[i..i + 4] == b"LFB1" && u64_at(data, i + 8) != seq && u64_at(data, i + 8) != 0 {
            return true;
        }
        i += 1;
    }
    false
}

/// The live batches of a started segment: (offset, len incl. header, first_lsn, count), in
/// the order the scan would take them (from byte 64, segment number and LSN matching).
fn live_batches(seq: u64, data: &[u8]) -> Vec<(usize, usize, u64, u32)> {
    let mut out = Vec::new();
    if data.len() < 64 || &data[..8] != b"LFSJRNL\x01" {
        return out;
    }
    let mut lsn = u64_at(data, 40);
    if lsn == 0 {
        return out;
    }
    let mut at = 64;
    while at + 48 <= data.len() {
        let h = &data[at..at + 48];
        if &h[..4] != b"LFB1" || u64_at(h, 8) != seq || u64_at(h, 16) != lsn {
            break;
        }
        let count = u32_at(h, 24);
        let len = u32_at(h, 28) as usize;
        if at + 48 + len > data.len() || crc32c_sw(&data[at + 48..at + 48 + len]) != u32_at(h, 32) {
            break;
        }
        out.push((at, 48 + len, lsn, count));
        lsn += count as u64;
        at += 48 + len;
    }
    out
}

/// CRC-32C (Castagnoli), bitwise (no dependency).
fn crc32c_sw(b: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &x in b {
        crc ^= x as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

// ---------------------------------------------------------------------------------------
// The single-threaded workload with a model: each step is one engine call, so the journal's
// state after recovery must be the model after some step count.

struct Progress {
    /// Steps begun (the one in progress included).
    started: usize,
    /// Steps covered by an fsync that returned Ok.
    acked: usize,
}

struct Workload {
    model: Tree,
    /// hashes[k]: the model's hash after k steps.
    hashes: Vec<u64>,
    progress: Arc<Mutex<Progress>>,
    rng: StdRng,
    next_name: usize,
    /// Whether steps may take checkpoints.
    checkpoints: bool,
}

impl Workload {
    fn new(seed: u64, start: Tree) -> Workload {
        let h = hash_tree(&start);
        Workload {
            model: start,
            hashes: vec![h],
            progress: Arc::new(Mutex::new(Progress {
                started: 0,
                acked: 0,
            })),
            rng: StdRng::seed_from_u64(seed),
            next_name: 0,
            checkpoints: true,
        }
    }

    fn begin(&self) {
        self.progress.lock().started = self.hashes.len();
    }

    fn end(&mut self) {
        self.hashes.push(hash_tree(&self.model));
    }

    fn pick(&mut self) -> Option<String> {
        if self.model.is_empty() {
            return None;
        }
        let i = self.rng.random_range(0..self.model.len());
        self.model.keys().nth(i).cloned()
    }

    fn fresh(&mut self) -> String {
        self.next_name += 1;
        let d = self.rng.random_range(0..DIRS);
        format!("/d{d}/f{}", self.next_name)
    }

    /// One step (or an fsync / checkpoint, which change nothing in the model).
    fn step(&mut self, o: &Open, tag: u64) {
        let c = &o.c;
        let r = self.rng.random_range(0..100);
        if r < 25 || self.model.len() < 3 {
            let p = self.fresh();
            self.begin();
            c.open(&p, OpenOptions::new().write(true).create_new(true))
                .unwrap_or_else(|e| panic!("create {p}: {e}"));
            self.model.insert(p, Vec::new());
            self.end();
        } else if r < 60 {
            let p = self.pick().unwrap();
            let cur = self.model[&p].len();
            let off = self.rng.random_range(0..=cur.min(8000));
            let len = self.rng.random_range(1..7000);
            let byte = (tag as u8) ^ (self.hashes.len() as u8);
            let data: Vec<u8> = (0..len).map(|i| byte.wrapping_add(i as u8 / 7)).collect();
            self.begin();
            let f = c.open(&p, OpenOptions::new().write(true)).unwrap();
            assert_eq!(f.write_at(&data, off as u64).unwrap(), len);
            drop(f);
            let m = self.model.get_mut(&p).unwrap();
            if m.len() < off + len {
                m.resize(off + len, 0);
            }
            m[off..off + len].copy_from_slice(&data);
            self.end();
        } else if r < 66 {
            let p = self.pick().unwrap();
            let cur = self.model[&p].len();
            let to = self.rng.random_range(0..=cur);
            self.begin();
            c.truncate(&p, to as u64).unwrap();
            self.model.get_mut(&p).unwrap().truncate(to);
            self.end();
        } else if r < 74 {
            let a = self.pick().unwrap();
            let b = if self.rng.random_bool(0.5) {
                self.pick().unwrap()
            } else {
                self.fresh()
            };
            if a == b {
                return;
            }
            self.begin();
            c.rename(&a, &b).unwrap();
            let v = self.model.remove(&a).unwrap();
            self.model.insert(b, v);
            self.end();
        } else if r < 80 {
            let p = self.pick().unwrap();
            self.begin();
            c.remove_file(&p).unwrap();
            self.model.remove(&p);
            self.end();
        } else if r < 97 {
            let Some(p) = self.pick() else { return };
            let done = self.hashes.len() - 1;
            let f = c.open(&p, OpenOptions::new().read(true)).unwrap();
            f.sync_all().unwrap();
            self.progress.lock().acked = done;
        } else if self.checkpoints {
            o.store.checkpoint().unwrap();
        }
    }
}

fn setup_dirs(o: &Open) {
    for d in 0..DIRS {
        o.c.create_dir(format!("/d{d}")).unwrap();
    }
    o.store.sync().unwrap();
}

/// An image to check: the disk, the least and most step counts it may hold.
struct Image {
    disk: SimDisk,
    acked: usize,
    started: usize,
    what: String,
}

fn image_key(d: &SimDisk) -> u64 {
    let mut h = DefaultHasher::new();
    for (p, data) in d.files() {
        p.hash(&mut h);
        data.hash(&mut h);
    }
    h.finish()
}

/// Opens an image, checks it is a prefix state with every acked step, fsck clean, then
/// writes on, closes, reopens and checks again. Returns an error text instead of panicking.
fn check_image(img: &Image, hashes: &[u64], seed: u64) -> Result<(), String> {
    let d = &img.disk;
    let ck = fsck::check(&store_dir(), &opts(d, false))
        .map_err(|e| format!("fsck of the image: {e}"))?;
    // Every few images, power cuts during the reopen and the writes after it (the open's
    // zeros after a dirty end, the segment it closes) are checked too.
    let nested_on = seed.is_multiple_of(40) || std::env::var("SEGMENT_RECYCLING_ONLY").is_ok();
    let nested: Images<Vec<String>> = Arc::default();
    let post_acked: Arc<Mutex<Vec<String>>> = Arc::default();
    if nested_on {
        let (nested, post_acked) = (nested.clone(), post_acked.clone());
        let mut n = 0u64;
        d.on_sync(move |d, point| {
            n += 1;
            let a = post_acked.lock().clone();
            for mode in [
                Unflushed::Lost,
                Unflushed::Kept,
                Unflushed::Torn(seed ^ n << 4),
            ] {
                nested
                    .lock()
                    .push((d.crash(mode), a.clone(), format!("#{n} {point:?} {mode:?}")));
            }
        });
    }
    let o = open_store(d, true).map_err(|e| format!("open: {e}"))?;
    let t = read_tree(&o.c);
    let h = hash_tree(&t);
    let hi = img.started.min(hashes.len() - 1);
    let k = (img.acked..=hi).find(|&k| hashes[k] == h);
    if k.is_none() {
        let near = hashes.iter().position(|&x| x == h);
        return Err(format!(
            "state is not the model after any step in {}..={} (matches step {near:?}); fsck: {ck:?}; open: {:?}; files: {}",
            img.acked,
            hi,
            o.report,
            t.len()
        ));
    }
    // Write on: new files, some synced, then close and reopen.
    let mut t2 = t.clone();
    let mut rng = StdRng::seed_from_u64(seed);
    for i in 0..40 {
        let p = format!("/d{}/post{i}", i % DIRS);
        let len = rng.random_range(1..9000);
        let data: Vec<u8> = (0..len)
            .map(|j| (j as u8).wrapping_mul(31) ^ i as u8)
            .collect();
        o.c.write(&p, &data)
            .map_err(|e| format!("write on {p}: {e}"))?;
        t2.insert(p.clone(), data);
        if i % 7 == 0 {
            let f = o.c.open(&p, OpenOptions::new().read(true)).unwrap();
            f.sync_all().map_err(|e| format!("fsync on: {e}"))?;
            post_acked.lock().push(p.clone());
        }
        if i == 20 {
            o.store
                .checkpoint()
                .map_err(|e| format!("checkpoint after reopen: {e}"))?;
        }
    }
    o.store.close().map_err(|e| format!("close: {e}"))?;
    drop(o.c);
    d.clear_hook();
    for (nd, acked, what) in std::mem::take(&mut *nested.lock()) {
        let r = (|| -> Result<(), String> {
            fsck::check(&store_dir(), &opts(&nd, false)).map_err(|e| format!("fsck: {e}"))?;
            let o = open_store(&nd, false).map_err(|e| format!("open: {e}"))?;
            let mut tn = read_tree(&o.c);
            for p in &acked {
                if tn.get(p) != t2.get(p) {
                    return Err(format!("acknowledged {p} lost or wrong"));
                }
            }
            for (p, v) in &t2 {
                if !t.contains_key(p)
                    && let Some(x) = tn.remove(p)
                    && !x.is_empty()
                    && x != *v
                {
                    return Err(format!("{p}: wrong content ({} bytes)", x.len()));
                }
            }
            if tn != t {
                return Err("the state recovered before the cut changed".into());
            }
            Ok(())
        })();
        r.map_err(|e| {
            format!(
                "nested power cut {what} after reopen: {e}\nimage before reopen:\n{}\nnested image:\n{}",
                describe(&img.disk.crash(Unflushed::Lost)),
                describe(&nd)
            )
        })?;
    }
    fsck::check(&store_dir(), &opts(d, false)).map_err(|e| format!("fsck after write on: {e}"))?;
    let o = open_store(d, false).map_err(|e| format!("reopen after write on: {e}"))?;
    let t3 = read_tree(&o.c);
    if t3 != t2 {
        let diff: Vec<_> = t2
            .keys()
            .chain(t3.keys())
            .filter(|k| t2.get(*k) != t3.get(*k))
            .take(5)
            .map(|k| {
                (
                    k.clone(),
                    t2.get(k).map(|v| v.len()),
                    t3.get(k).map(|v| v.len()),
                )
            })
            .collect();
        return Err(format!(
            "after writing on and reopening, tree differs: {diff:?}"
        ));
    }
    drop(o);
    Ok(())
}

/// Attack 1: power cuts at every flush of a store recycling its segments many times.
#[test]
fn power_cut_at_every_flush_with_recycling() {
    let seed = seed::fixed("power_cut_at_every_flush_with_recycling", 0x5eed_0001);
    let steps: usize = std::env::var("SEGMENT_RECYCLING_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(250);
    eprintln!("seed {seed} steps {steps}");
    let sim = SimDisk::new();
    let o = open_store(&sim, true).unwrap();
    setup_dirs(&o);
    let mut w = Workload::new(seed, Tree::new());
    let images: Arc<Mutex<Vec<Image>>> = Arc::default();
    let seen: Arc<Mutex<HashSet<u64>>> = Arc::default();
    let free_seen = Arc::new(AtomicBool::new(false));
    let stale_seen = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicUsize::new(0));
    {
        let (images, seen, progress) = (images.clone(), seen.clone(), w.progress.clone());
        let (free_seen, stale_seen, calls) = (free_seen.clone(), stale_seen.clone(), calls.clone());
        sim.on_sync(move |d, point| {
            let n = calls.fetch_add(1, Ordering::Relaxed);
            // The least state before the image, the most after it (steps go on meanwhile).
            let acked = progress.lock().acked;
            if n % 16 == 0 {
                let (segs, free) = journal_files(d);
                if !free.is_empty() {
                    free_seen.store(true, Ordering::Relaxed);
                }
                if segs.iter().any(|(s, b)| recycled_evidence(*s, b)) {
                    stale_seen.store(true, Ordering::Relaxed);
                }
            }
            for (i, mode) in [
                Unflushed::Lost,
                Unflushed::Kept,
                Unflushed::Torn(seed ^ (n as u64) << 8),
                Unflushed::Torn(seed ^ (n as u64) << 8 ^ 0x77),
            ]
            .into_iter()
            .enumerate()
            {
                let img = d.crash(mode);
                let started = progress.lock().started;
                let key = image_key(&img);
                if !seen.lock().insert(key) {
                    continue;
                }
                images.lock().push(Image {
                    disk: img,
                    acked,
                    started,
                    what: format!("sync #{n} {point:?} mode {i} {mode:?}"),
                });
            }
        });
    }
    for i in 0..steps {
        w.step(&o, seed ^ i as u64);
    }
    sim.clear_hook();
    o.store.close().unwrap();
    let (segs, free) = journal_files(&sim);
    eprintln!(
        "{} hook calls, {} distinct images, segments {:?}, free {:?}, free seen {}, stale seen {}",
        calls.load(Ordering::Relaxed),
        images.lock().len(),
        segs.iter().map(|s| s.0).collect::<Vec<_>>(),
        free,
        free_seen.load(Ordering::Relaxed),
        stale_seen.load(Ordering::Relaxed)
    );
    assert!(free_seen.load(Ordering::Relaxed), "no .free segment seen");
    assert!(
        stale_seen.load(Ordering::Relaxed),
        "no recycled segment seen"
    );
    // The final store itself.
    let fin = Image {
        disk: sim.crash(Unflushed::Kept),
        acked: w.hashes.len() - 1,
        started: w.hashes.len() - 1,
        what: "final".into(),
    };
    check_image(&fin, &w.hashes, seed).unwrap();
    let images = std::mem::take(&mut *images.lock());
    let budget = std::time::Instant::now();
    let limit: usize = std::env::var("SEGMENT_RECYCLING_IMAGES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(usize::MAX);
    let mut failures = Vec::new();
    let stride = (images.len() / limit.min(images.len()).max(1)).max(1);
    let mut checked = 0;
    let only: Option<usize> = std::env::var("SEGMENT_RECYCLING_ONLY")
        .ok()
        .and_then(|s| s.parse().ok());
    for (i, img) in images.iter().enumerate().step_by(stride) {
        if only.is_some_and(|o| o != i) {
            continue;
        }
        if only.is_some() {
            eprintln!("image {i}: {}\n{}", img.what, describe(&img.disk));
        }
        checked += 1;
        if let Err(e) = check_image(img, &w.hashes, seed ^ i as u64) {
            eprintln!("FAIL seed {seed} image {i} ({}): {e}", img.what);
            failures.push(format!("image {i} ({}): {e}", img.what));
            if failures.len() > 5 {
                break;
            }
        }
    }
    eprintln!("checked {checked} images in {:?}", budget.elapsed());
    assert!(failures.is_empty(), "seed {seed}: {failures:#?}");
}

/// Attack 2: open, write, then close, drop, or cut the power, many times on one disk.
#[test]
fn reopen_cycles_with_recycling() {
    let seed = seed::fixed("reopen_cycles_with_recycling", 0x5eed_0002);
    eprintln!("seed {seed}");
    let mut sim = SimDisk::new();
    let mut rng = StdRng::seed_from_u64(seed);
    {
        let o = open_store(&sim, true).unwrap();
        setup_dirs(&o);
        o.store.close().unwrap();
    }
    // What the next open must find: a state in hashes[lo..=hi].
    let mut expect: (Vec<u64>, usize, usize) = (vec![hash_tree(&Tree::new())], 0, 0);
    let mut stale_seen = false;
    let mut free_seen = false;
    for cycle in 0..100 {
        // Some cycles end with a power cut at a random flush of their open or workload.
        let mut cut_at = 0;
        let cut: Arc<Mutex<Option<(SimDisk, usize)>>> = Arc::default();
        let progress: Arc<Mutex<Progress>> = Arc::new(Mutex::new(Progress {
            started: 0,
            acked: 0,
        }));
        if rng.random_range(0..3) == 0 {
            let at = rng.random_range(1..25u64);
            cut_at = at;
            let torn: u64 = rng.random();
            let (cut, progress) = (cut.clone(), progress.clone());
            let mut n = 0;
            sim.on_sync(move |d, _| {
                n += 1;
                if n == at {
                    let acked = progress.lock().acked;
                    *cut.lock() = Some((d.crash(Unflushed::Torn(torn)), acked));
                }
            });
        }
        let o = open_store(&sim, cycle % 2 == 0)
            .unwrap_or_else(|e| panic!("seed {seed} cycle {cycle}: open: {e}"));
        let syncs_in_open = sim.syncs();
        let t = read_tree(&o.c);
        let h = hash_tree(&t);
        let (hashes, lo, hi) = &expect;
        assert!(
            (*lo..=*hi).any(|k| hashes[k] == h),
            "seed {seed} cycle {cycle}: state not in steps {lo}..={hi} (matches {:?}); report {:?}",
            hashes.iter().position(|&x| x == h),
            o.report
        );
        let mut w = Workload::new(rng.random(), t);
        w.progress = progress;
        w.next_name = cycle * 1000;
        let n = rng.random_range(10..60);
        for i in 0..n {
            w.step(&o, (cycle * 100 + i) as u64);
        }
        let last = w.hashes.len() - 1;
        let how = rng.random_range(0..5);
        let next_sim = match how {
            0 => {
                o.store.close().unwrap();
                drop(o.c);
                sim.clone()
            }
            1 => {
                drop(o);
                sim.clone()
            }
            2 => sim.crash(Unflushed::Kept),
            3 => sim.crash(Unflushed::Lost),
            _ => sim.crash(Unflushed::Torn(rng.random())),
        };
        let acked = w.progress.lock().acked;
        let lo = if how < 2 { last } else { acked };
        expect = (w.hashes.clone(), lo, last);
        sim.clear_hook();
        let next_sim = match cut.lock().take() {
            Some((img, acked)) => {
                eprintln!(
                    "cycle {cycle}: power cut at hook call {cut_at} (the open made {syncs_in_open} flushes, 2 hook calls each)"
                );
                expect.1 = acked;
                img
            }
            None => next_sim,
        };
        // A crashed store's threads still run on the old disk; drop them first.
        sim = next_sim;
        let (segs, free) = journal_files(&sim);
        free_seen |= !free.is_empty();
        stale_seen |= segs.iter().any(|(s, b)| recycled_evidence(*s, b));
        fsck::check(&store_dir(), &opts(&sim, false))
            .unwrap_or_else(|e| panic!("seed {seed} cycle {cycle} (how {how}): fsck: {e}"));
    }
    assert!(free_seen && stale_seen, "no recycling seen");
}

/// Attack 3: damage after the end of recycled segments is no damage; damage inside live
/// batches is, naming the file and offset.
#[test]
fn damage_in_and_after_recycled_batches() {
    let seed = seed::fixed("damage_in_and_after_recycled_batches", 0x5eed_0003);
    eprintln!("seed {seed}");
    let sim = SimDisk::new();
    let o = open_store(&sim, false).unwrap();
    setup_dirs(&o);
    let mut w = Workload::new(seed, Tree::new());
    for i in 0..700 {
        w.step(&o, i);
        if i % 60 == 59 {
            o.store.checkpoint().unwrap();
        }
    }
    // Records after the last checkpoint, spread over segments.
    w.checkpoints = false;
    for i in 0..300 {
        w.step(&o, 1000 + i);
    }
    o.store.close().unwrap();
    drop(o.c);
    let want = w.model.clone();
    let base = fsck::check(&store_dir(), &opts(&sim, false)).unwrap();
    eprintln!("{base:?}");
    let (segs, free) = journal_files(&sim);
    eprintln!(
        "segments {:?} free {free:?}",
        segs.iter().map(|s| s.0).collect::<Vec<_>>()
    );
    let path = |seq: u64| store_dir().join(format!("journal/{seq:016x}.seg"));
    let mut rng = StdRng::seed_from_u64(seed);

    // (a) Flip bytes after the zeros that follow each segment's last batch.
    let mut flipped_any = false;
    let last_used = segs
        .iter()
        .filter(|(s, b)| !live_batches(*s, b).is_empty())
        .map(|s| s.0)
        .max()
        .unwrap();
    for (seq, data) in &segs {
        let batches = live_batches(*seq, data);
        let end = batches.last().map_or(64, |b| b.0 + b.1);
        let from = (end + 48).div_ceil(4096) * 4096;
        // A segment with a zero header must be zeros throughout (spec): not a stale region.
        if from >= data.len() || data[..64].iter().all(|&b| b == 0) {
            continue;
        }
        let nonzero = data[from..].iter().any(|&b| b != 0);
        let mut d = data.clone();
        for _ in 0..64 {
            let at = rng.random_range(from..d.len());
            d[at] ^= 1 << rng.random_range(0..8);
        }
        // And a plausible stale batch header right at `from`.
        if nonzero {
            flipped_any = true;
        }
        sim.put(&path(*seq), d);
    }
    let r = fsck::check(&store_dir(), &opts(&sim, false))
        .unwrap_or_else(|e| panic!("seed {seed}: flips after the ends reported: {e}"));
    assert_eq!(r.records, base.records, "seed {seed}");
    {
        let o = open_store(&sim.crash(Unflushed::Kept), false).unwrap();
        assert!(read_tree(&o.c) == want, "seed {seed}: contents changed");
    }
    for (seq, data) in &segs {
        sim.put(&path(*seq), data.clone());
    }
    eprintln!("stale regions with old bytes flipped: {flipped_any}; last used {last_used}");

    // (b) Flip one byte inside a live batch after the checkpoint.
    let mut tried = 0;
    for (seq, data) in &segs {
        let batches = live_batches(*seq, data);
        for (bi, &(off, len, lsn, _count)) in batches.iter().enumerate() {
            if lsn <= base.checkpoint_lsn {
                continue;
            }
            if rng.random_range(0..3) != 0 {
                continue;
            }
            let last_batch = *seq == last_used && bi == batches.len() - 1;
            for region in [0usize, 1] {
                // 0: the payload; 1: the header (before its CRC).
                let at = if region == 0 {
                    off + 48 + rng.random_range(0..len - 48)
                } else {
                    off + rng.random_range(0..44)
                };
                let mut d = data.clone();
                d[at] ^= 1 << rng.random_range(0..8);
                sim.put(&path(*seq), d);
                tried += 1;
                match fsck::check(&store_dir(), &opts(&sim, false)) {
                    Err(StoreError::Damaged {
                        path: p,
                        offset,
                        what,
                    }) => {
                        assert_eq!(p, path(*seq), "seed {seed}: flip at {seq:x}:{at}: {what}");
                        assert!(
                            offset as usize <= at && offset >= 64,
                            "seed {seed}: flip at {seq:x}:{at} reported at {offset}: {what}"
                        );
                    }
                    Err(e) => panic!("seed {seed}: flip at {seq:x}:{at}: {e}"),
                    Ok(r) => {
                        // Only the journal's last batches may be taken for a torn tail.
                        let later_in_seg = batches.len() - 1 - bi;
                        assert!(
                            r.torn_tail && *seq == last_used,
                            "seed {seed}: flip at segment {seq:x} byte {at} (batch {bi} at {off}, lsn {lsn}, last batch {last_batch}, {later_in_seg} later batches in the segment) not reported: {r:?}"
                        );
                    }
                }
                sim.put(&path(*seq), data.clone());
            }
        }
    }
    assert!(tried > 0);
    eprintln!("tried {tried} flips in live batches");
}

/// Attack 4: threads writing and syncing while checkpoints recycle tiny segments; power cuts
/// at random flushes.
#[test]
fn threads_with_background_checkpoints() {
    let seed = seed::fixed("threads_with_background_checkpoints", 0x5eed_0004);
    eprintln!("seed {seed}");
    let sim = SimDisk::new();
    let o = open_store(&sim, true).unwrap();
    setup_dirs(&o);
    let fs = o.c.fs().clone();
    // Files whose final name and content an fsync acknowledged.
    let acked: Arc<Mutex<BTreeMap<String, Vec<u8>>>> = Arc::default();
    let images: Arc<Mutex<Vec<(SimDisk, Tree)>>> = Arc::default();
    {
        let (acked, images) = (acked.clone(), images.clone());
        let mut rng = StdRng::seed_from_u64(seed);
        sim.on_sync(move |d, _| {
            if rng.random_range(0..6) != 0 {
                return;
            }
            let mode = match rng.random_range(0..4) {
                0 => Unflushed::Lost,
                1 => Unflushed::Kept,
                _ => Unflushed::Torn(rng.random()),
            };
            // What must survive: acknowledged before the image and not yet being removed
            // after it. A worker forgets a file before it removes it, and the removal's
            // unflushed record may reach the image (kept, torn), so a file forgotten
            // between the two looks is not required.
            let before = acked.lock().clone();
            let img = d.crash(mode);
            let after = acked.lock().clone();
            let a: Tree = before
                .into_iter()
                .filter(|(p, _)| after.contains_key(p))
                .collect();
            images.lock().push((img, a));
        });
    }
    let content = |t: usize, i: usize| -> Vec<u8> {
        let len = 500 + (t * 7919 + i * 104_729) % 9000;
        (0..len)
            .map(|j| (j as u8) ^ (t as u8 * 16 + i as u8))
            .collect()
    };
    std::thread::scope(|s| {
        for t in 0..DIRS {
            let fs = fs.clone();
            let acked = acked.clone();
            s.spawn(move || {
                let c = Client::root(fs);
                for i in 0..150 {
                    let tmp = format!("/d{t}/tmp{i}");
                    let fin = format!("/d{t}/f{i}");
                    c.write(&tmp, content(t, i)).unwrap();
                    c.rename(&tmp, &fin).unwrap();
                    if i % 3 == 0 {
                        let f = c.open(&fin, OpenOptions::new().read(true)).unwrap();
                        f.sync_all().unwrap();
                        acked.lock().insert(fin.clone(), content(t, i));
                    }
                    if i >= 10 && i % 2 == 0 {
                        let old = format!("/d{t}/f{}", i - 10);
                        acked.lock().remove(&old);
                        c.remove_file(&old).unwrap();
                    }
                }
            });
        }
    });
    sim.clear_hook();
    o.store.close().unwrap();
    let (segs, free) = journal_files(&sim);
    let evidence = segs.iter().any(|(s, b)| recycled_evidence(*s, b));
    let images = std::mem::take(&mut *images.lock());
    eprintln!(
        "{} images; segments {:?} free {free:?} recycled evidence {evidence}",
        images.len(),
        segs.iter().map(|s| s.0).collect::<Vec<_>>()
    );
    let mut failures = Vec::new();
    for (n, (img, acked)) in images.iter().enumerate() {
        let r = (|| -> Result<(), String> {
            fsck::check(&store_dir(), &opts(img, false)).map_err(|e| format!("fsck: {e}"))?;
            let o = open_store(img, true).map_err(|e| format!("open: {e}"))?;
            let t = read_tree(&o.c);
            for (p, v) in acked {
                match t.get(p) {
                    Some(x) if x == v => {}
                    Some(x) => return Err(format!("{p}: {} bytes, want {}", x.len(), v.len())),
                    None => return Err(format!("acknowledged {p} missing")),
                }
            }
            for (p, v) in &t {
                let name = p.rsplit('/').next().unwrap();
                let th: usize = p[2..3].parse().unwrap();
                if let Some(i) = name.strip_prefix('f') {
                    let i: usize = i.parse().unwrap();
                    if *v != content(th, i) {
                        return Err(format!("{p}: {} bytes, not its content", v.len()));
                    }
                } else if let Some(i) = name.strip_prefix("tmp") {
                    let i: usize = i.parse().unwrap();
                    if !v.is_empty() && *v != content(th, i) {
                        return Err(format!("{p}: {} bytes, a partial content", v.len()));
                    }
                }
            }
            // Write on, close, reopen.
            o.c.write("/d0/after", b"after")
                .map_err(|e| e.to_string())?;
            o.store.sync().map_err(|e| e.to_string())?;
            o.store
                .checkpoint()
                .map_err(|e| format!("checkpoint: {e}"))?;
            for i in 0..30 {
                o.c.write(format!("/d1/after{i}"), content(9, i))
                    .map_err(|e| e.to_string())?;
            }
            o.store.close().map_err(|e| format!("close: {e}"))?;
            drop(o.c);
            fsck::check(&store_dir(), &opts(img, false))
                .map_err(|e| format!("fsck after write on: {e}"))?;
            let o = open_store(img, false).map_err(|e| format!("reopen: {e}"))?;
            let mut t2 = read_tree(&o.c);
            for i in 0..30 {
                if t2.remove(&format!("/d1/after{i}")) != Some(content(9, i)) {
                    return Err(format!("after{i} lost after close"));
                }
            }
            t2.remove("/d0/after");
            if t2 != t {
                return Err("tree changed after write on and reopen".into());
            }
            Ok(())
        })();
        if let Err(e) = r {
            eprintln!("FAIL seed {seed} image {n}: {e}");
            failures.push(format!("image {n}: {e}"));
        }
    }
    assert!(failures.is_empty(), "seed {seed}: {failures:#?}");
}

/// The journal's files, for failure messages.
fn describe(d: &SimDisk) -> String {
    let mut out = String::new();
    for (p, data) in d.files() {
        let name = p.to_string_lossy().to_string();
        if !name.contains("journal") {
            continue;
        }
        let seq = name
            .rsplit('/')
            .next()
            .and_then(|n| n.split('.').next())
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .unwrap_or(0);
        let hdr = if data.len() >= 64 && &data[..8] == b"LFSJRNL\x01" {
            format!(
                "header seq {:x} first_lsn {}",
                u64_at(&data, 32),
                u64_at(&data, 40)
            )
        } else if data.len() >= 64 && data[..64].iter().all(|&b| b == 0) {
            "zero header".into()
        } else {
            "bad header".into()
        };
        let b = live_batches(seq, &data);
        let end = b.last().map_or(64, |x| x.0 + x.1);
        let nz = data[end.min(data.len())..]
            .iter()
            .position(|&x| x != 0)
            .map(|i| i + end);
        let nz4k = data[4096.min(data.len())..]
            .iter()
            .position(|&x| x != 0)
            .map(|i| i + 4096);
        out += &format!(
            "  {name} len {} {hdr}; {} batches lsn {:?}..{:?} end {end}; first nonzero after end {nz:?}, after 4096 {nz4k:?}\n",
            data.len(),
            b.len(),
            b.first().map(|x| x.2),
            b.last().map(|x| x.2 + x.3 as u64),
        );
    }
    out
}

/// Minimal: a store closed with a recycled spare (spare header, an earlier life's bytes after
/// it) as its last segment and no `.free` file left. Reopening makes that spare again
/// afresh, writing zeros over it in place; a power cut during that write must not leave a
/// store that fails to open.
#[test]
fn reopen_over_a_recycled_spare_survives_power_cuts() {
    let mut found = 0;
    for rounds in 1..24u64 {
        let sim = SimDisk::new();
        let per = 6 + rounds % 7;
        {
            let o = open_store(&sim, false).unwrap();
            setup_dirs(&o);
            for r in 0..rounds {
                // About a segment and a half of data, then a checkpoint that frees segments.
                for i in 0..per {
                    o.c.write(format!("/d0/r{r}f{i}"), vec![(r * 16 + i) as u8 | 1; 8000])
                        .unwrap();
                }
                o.store.sync().unwrap();
                if r + 1 < rounds {
                    o.store.checkpoint().unwrap();
                }
            }
            o.store.close().unwrap();
        }
        let (segs, free) = journal_files(&sim);
        let (last, data) = segs.last().unwrap();
        let recycled_spare = &data[..8] == b"LFSJRNL\x01"
            && u64_at(data, 40) == 0
            && data[4096..].iter().any(|&b| b != 0);
        if !(recycled_spare && free.is_empty()) {
            continue;
        }
        found += 1;
        let before = {
            let o = open_store(&sim.crash(Unflushed::Kept), false).unwrap();
            read_tree(&o.c)
        };
        let images: Arc<Mutex<Vec<(SimDisk, String)>>> = Arc::default();
        {
            let images = images.clone();
            let mut n = 0u64;
            sim.on_sync(move |d, point| {
                n += 1;
                for s in 0..6u64 {
                    images.lock().push((
                        d.crash(Unflushed::Torn(n * 100 + s)),
                        format!("sync #{n} {point:?} Torn({})", n * 100 + s),
                    ));
                }
            });
        }
        let o = open_store(&sim, false).unwrap();
        drop(o);
        sim.clear_hook();
        for (img, what) in std::mem::take(&mut *images.lock()) {
            if let Err(e) = fsck::check(&store_dir(), &opts(&img, false)) {
                panic!(
                    "rounds {rounds}: last segment {last:x} a recycled spare, no .free; a power cut at {what} while reopening leaves: {e}\nopen: {:?}\n{}",
                    open_store(&img, false).err(),
                    describe(&img)
                );
            }
            let o = open_store(&img, false)
                .unwrap_or_else(|e| panic!("rounds {rounds} {what}: open: {e}"));
            assert!(
                read_tree(&o.c) == before,
                "rounds {rounds} {what}: contents changed"
            );
        }
        if found == 2 {
            break;
        }
    }
    assert!(
        found > 0,
        "the setup never left a recycled spare with no free segment"
    );
}
