//! kv-compare: measures candidate embedded key-value stores for lanefs's disk store.
//! See docs/STORE-KV.md for what is measured and why. Usage:
//!
//! ```text
//! kv-compare load       --engine E --dir D [--inodes 1000000] [--batch 100000]
//! kv-compare open       --engine E --dir D          (drops the page cache first)
//! kv-compare checkpoint --engine E --dir D [--sizes 10000,100000] [--reps 5]
//! kv-compare readers    --engine E --dir D [--size 100000] [--batches 3]
//! kv-compare churn      --engine E --dir D [--size 100000] [--batches 100]
//! kv-compare data       --engine E --dir D [--live-mb 1024] [--batch-mb 64] [--churn 24]
//! kv-compare crash      --engine E --dir D [--rounds 10]   (D: a loaded store, changed)
//! ```
//! Engines: redb, redb-qr (redb with quick-repair commits), fjall, lmdb (heed).

mod stores;

use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};
use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use stores::{Op, Store, Table};

// ------------------------------------------------------------------ keys (byte-ordered)

const T_INODE: u8 = b'i';
const T_ENTRY: u8 = b'd';
const T_XATTR: u8 = b'x';
const T_BLOCK: u8 = b'b';
const K_SUPER: &[u8] = b"s";
/// The crash test's own keys: `c ++ batch(u64 BE) ++ j(u32 BE)` and its counter.
const T_CRASH: u8 = b'c';
const K_CRASH: &[u8] = b"sc";

fn k_inode(ino: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(9);
    k.push(T_INODE);
    k.extend_from_slice(&ino.to_be_bytes());
    k
}
fn k_dir(parent: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(40);
    k.push(T_ENTRY);
    k.extend_from_slice(&parent.to_be_bytes());
    k
}
fn k_entry(parent: u64, name: &[u8]) -> Vec<u8> {
    let mut k = k_dir(parent);
    k.extend_from_slice(name);
    k
}
fn k_xattr(ino: u64, name: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + name.len());
    k.push(T_XATTR);
    k.extend_from_slice(&ino.to_be_bytes());
    k.extend_from_slice(name);
    k
}
fn k_block(ino: u64, idx: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(17);
    k.push(T_BLOCK);
    k.extend_from_slice(&ino.to_be_bytes());
    k.extend_from_slice(&idx.to_be_bytes());
    k
}

// ------------------------------------------------------------------ the modelled filesystem

/// Directories 2..2+DIRS live in the root; files are spread over them (about 99 a directory
/// at 1M inodes). Live files are always the inode range [lo, hi): creates take hi, unlinks lo.
const DIRS: u64 = 10_000;
const FIRST_DIR: u64 = 2;
const FIRST_FILE: u64 = FIRST_DIR + DIRS;
const XA_SELINUX: &[u8] = b"security.selinux";
const XA_USER: &[u8] = b"user.tag";

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
fn parent_of(ino: u64) -> u64 {
    if ino < FIRST_FILE { 1 } else { FIRST_DIR + mix(ino) % DIRS }
}
/// 8 to ~30 bytes: "f<hex ino>." and a suffix of 0-19 letters.
fn name_of(ino: u64) -> Vec<u8> {
    let mut n = format!("{}{:x}.", if ino < FIRST_FILE { 'd' } else { 'f' }, ino).into_bytes();
    let h = mix(ino ^ 0x5555);
    for i in 0..(h % 20) {
        n.push(b'a' + ((h >> (i * 3)) % 26) as u8);
    }
    n
}
/// 64 to 128 bytes: generation, mode, uid, gid, nlink, size, four times, rdev, flags, then
/// zeroed room (block map root, project id, ...), as an inode record would be.
fn inode_val(ino: u64, version: u64) -> Vec<u8> {
    let len = 64 + (mix(ino) % 65) as usize;
    let mut v = Vec::with_capacity(len);
    let dir = ino < FIRST_FILE;
    v.extend_from_slice(&(ino * 7 + 1).to_le_bytes()); // generation
    v.extend_from_slice(&(if dir { 0o40755u32 } else { 0o100644 }).to_le_bytes());
    v.extend_from_slice(&1000u32.to_le_bytes());
    v.extend_from_slice(&100u32.to_le_bytes());
    v.extend_from_slice(&(if dir { 2u32 } else { 1 }).to_le_bytes());
    v.extend_from_slice(&(mix(ino ^ version) % 1_000_000).to_le_bytes()); // size
    for t in 0..4u64 {
        v.extend_from_slice(&(1_700_000_000 + version + t).to_le_bytes()[..8]);
        v.extend_from_slice(&((mix(version + t) % 1_000_000_000) as u32).to_le_bytes());
    }
    v.resize(len, 0);
    v
}
/// Child inode, generation, cookie, type: 25 bytes.
fn entry_val(ino: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(25);
    v.extend_from_slice(&ino.to_le_bytes());
    v.extend_from_slice(&(ino * 7 + 1).to_le_bytes());
    v.extend_from_slice(&((1u64 << 48) | ino).to_le_bytes());
    v.push(if ino < FIRST_FILE { 4 } else { 8 });
    v
}
/// 64 to 128 bytes of label-like text.
fn xattr_val(ino: u64, version: u64) -> Vec<u8> {
    let len = 64 + (mix(ino ^ version ^ 0xa5) % 65) as usize;
    let mut v = format!("unconfined_u:object_r:user_home_t:s0:c{}.c{}:", ino % 1024, version).into_bytes();
    while v.len() < len {
        v.push(b'a' + (mix(v.len() as u64 ^ ino) % 26) as u8);
    }
    v.truncate(len);
    v
}

/// The modelled filesystem's state, kept in the superblock key so that every command
/// continues where the last one stopped.
struct Model {
    lo: u64,
    hi: u64,
    version: u64,
}

impl Model {
    fn read(s: &dyn Store) -> Model {
        let v = s.get(Table::Meta, K_SUPER).expect("no superblock: run `load` first");
        let f = |i: usize| u64::from_le_bytes(v[i * 8..i * 8 + 8].try_into().unwrap());
        Model { lo: f(0), hi: f(1), version: f(2) }
    }
    fn put(&self, ops: &mut Vec<Op>) {
        let mut v = Vec::with_capacity(24);
        v.extend_from_slice(&self.lo.to_le_bytes());
        v.extend_from_slice(&self.hi.to_le_bytes());
        v.extend_from_slice(&self.version.to_le_bytes());
        ops.push(Op::Put(K_SUPER.to_vec(), v));
    }
    fn create_ops(ino: u64, version: u64, ops: &mut Vec<Op>) {
        ops.push(Op::Put(k_inode(ino), inode_val(ino, version)));
        ops.push(Op::Put(k_entry(parent_of(ino), &name_of(ino)), entry_val(ino)));
        if ino % 10 == 0 {
            ops.push(Op::Put(k_xattr(ino, XA_SELINUX), xattr_val(ino, version)));
        }
        if ino % 10 == 1 {
            ops.push(Op::Put(k_xattr(ino, XA_USER), xattr_val(ino, version)));
        }
    }
    /// A checkpoint's worth of records: creates and unlinks in balance (each with its parent
    /// directory's inode), attribute updates and xattr updates; the superblock last.
    fn batch(&mut self, n: usize, rng: &mut SmallRng) -> Vec<Op> {
        let mut ops = Vec::with_capacity(n + 8);
        while ops.len() < n {
            self.version += 1;
            let r = rng.random_range(0..100);
            if r < 35 {
                let ino = self.hi;
                self.hi += 1;
                Self::create_ops(ino, self.version, &mut ops);
                let p = parent_of(ino);
                ops.push(Op::Put(k_inode(p), inode_val(p, self.version)));
            } else if r < 70 && self.hi - self.lo > 1000 {
                let ino = self.lo;
                self.lo += 1;
                let p = parent_of(ino);
                ops.push(Op::Del(k_entry(p, &name_of(ino))));
                ops.push(Op::Del(k_inode(ino)));
                if ino % 10 == 0 {
                    ops.push(Op::Del(k_xattr(ino, XA_SELINUX)));
                }
                if ino % 10 == 1 {
                    ops.push(Op::Del(k_xattr(ino, XA_USER)));
                }
                ops.push(Op::Put(k_inode(p), inode_val(p, self.version)));
            } else if r < 90 {
                let ino = rng.random_range(self.lo..self.hi);
                ops.push(Op::Put(k_inode(ino), inode_val(ino, self.version)));
            } else {
                let ino = rng.random_range(self.lo..self.hi) / 10 * 10 + 1;
                if ino >= self.lo && ino < self.hi {
                    ops.push(Op::Put(k_xattr(ino, XA_USER), xattr_val(ino, self.version)));
                }
            }
        }
        self.put(&mut ops);
        ops
    }
}

// ------------------------------------------------------------------ measuring

fn write_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/io").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("write_bytes: "))
        .map(|v| v.trim().parse().unwrap())
        .unwrap()
}
fn read_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/io").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("read_bytes: "))
        .map(|v| v.trim().parse().unwrap())
        .unwrap()
}
/// (apparent bytes, allocated bytes) of every file under `dir`.
fn disk_size(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut tot = (0, 0);
    // fjall deletes files while compacting: a file gone between listing and stat is skipped.
    let Ok(list) = std::fs::read_dir(dir) else { return (0, 0) };
    for e in list {
        let Ok(e) = e else { continue };
        let Ok(m) = e.metadata() else { continue };
        if m.is_dir() {
            let (a, b) = disk_size(&e.path());
            tot.0 += a;
            tot.1 += b;
        } else {
            tot.0 += m.len();
            tot.1 += m.blocks() * 512;
        }
    }
    tot
}
fn max_rss_mb() -> f64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct we own.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    ru.ru_maxrss as f64 / 1024.0
}
fn drop_caches() {
    // SAFETY: sync takes no arguments.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").expect("drop caches (needs root)");
}
fn mb(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}
fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
/// p50, p99, max of nanosecond samples, in microseconds.
fn pct(v: &mut [u64]) -> (f64, f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    v.sort_unstable();
    let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize] as f64 / 1e3;
    (at(0.5), at(0.99), *v.last().unwrap() as f64 / 1e3)
}
/// Bytes of every live pair of a table (and the count), read back by a full scan.
fn live_bytes(s: &dyn Store, t: Table) -> (u64, usize) {
    let mut b = 0u64;
    let n = s.scan_prefix(t, b"", &mut |k, v| b += (k.len() + v.len()) as u64);
    (b, n)
}

// ------------------------------------------------------------------ commands

struct Args(HashMap<String, String>);
impl Args {
    fn parse(v: &[String]) -> Args {
        let mut m = HashMap::new();
        let mut i = 0;
        while i < v.len() {
            let k = v[i].strip_prefix("--").unwrap_or_else(|| panic!("bad argument {}", v[i]));
            m.insert(k.to_string(), v.get(i + 1).cloned().unwrap_or_default());
            i += 2;
        }
        Args(m)
    }
    fn s(&self, k: &str) -> String {
        self.0.get(k).cloned().unwrap_or_else(|| panic!("--{k} is needed"))
    }
    fn n(&self, k: &str, d: u64) -> u64 {
        self.0.get(k).map(|v| v.parse().unwrap()).unwrap_or(d)
    }
}

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    let cmd = argv.get(1).cloned().unwrap_or_default();
    let a = Args::parse(&argv[2.min(argv.len())..]);
    let engine = a.s("engine");
    let dir = PathBuf::from(a.s("dir"));
    let cache = a.n("cache-mb", 256) as usize * (1 << 20);
    if cmd == "crash" {
        return crash(&engine, &dir, a.n("rounds", 10), cache);
    }
    if cmd == "open" {
        drop_caches();
    }
    let r0 = read_bytes();
    let t0 = Instant::now();
    let mut store = stores::open(&engine, &dir, cache).unwrap();
    let open_t = t0.elapsed();
    let open_read = read_bytes() - r0;
    println!("# {engine} {cmd} dir={} open={:.1}ms (read {:.1} MiB)", dir.display(), ms(open_t), mb(open_read));
    match cmd.as_str() {
        "load" => load(&*store, &dir, a.n("inodes", 1_000_000), a.n("batch", 100_000) as usize),
        "open" => open_cold(&*store),
        "checkpoint" => {
            let sizes: Vec<usize> = a.0.get("sizes").map(|s| s.as_str()).unwrap_or("10000,100000")
                .split(',').map(|x| x.parse().unwrap()).collect();
            checkpoint(&*store, &dir, &sizes, a.n("reps", 5))
        }
        "readers" => readers(&*store, a.n("size", 100_000) as usize, a.n("batches", 3)),
        "churn" => churn(&*store, &dir, a.n("size", 100_000) as usize, a.n("batches", 100)),
        "data" => data(&*store, &dir, a.n("live-mb", 1024), a.n("batch-mb", 64), a.n("churn", 24)),
        "crash-child" => crash_child(&*store),
        "crash-verify" => crash_verify(&mut *store, a.n("last-done", 0), a.n("killed", 0)),
        "verify" => {
            let (b, n) = live_bytes(&*store, Table::Meta);
            println!("meta: {n} keys, {:.1} MiB; check: {:?}", mb(b), store.check());
        }
        _ => panic!("unknown command {cmd}"),
    }
    store.settle();
    println!("# maxrss={:.0}MiB", max_rss_mb());
}

fn load(s: &dyn Store, dir: &Path, inodes: u64, batch: usize) {
    let w0 = write_bytes();
    let t0 = Instant::now();
    let hi = 1 + inodes; // inodes 1..=inodes
    let mut ops = Vec::with_capacity(batch + 8);
    let (mut logical, mut records, mut commits) = (0u64, 0u64, Duration::ZERO);
    let mut flush = |ops: &mut Vec<Op>| {
        logical += ops.iter().map(Op::logical_len).sum::<u64>();
        records += ops.len() as u64;
        commits += s.apply(Table::Meta, ops, &mut || {}).total;
        ops.clear();
    };
    ops.push(Op::Put(k_inode(1), inode_val(1, 0)));
    for ino in FIRST_DIR..hi {
        if ino < FIRST_FILE {
            ops.push(Op::Put(k_inode(ino), inode_val(ino, 0)));
            ops.push(Op::Put(k_entry(1, &name_of(ino)), entry_val(ino)));
        } else {
            Model::create_ops(ino, 0, &mut ops);
        }
        if ops.len() >= batch {
            flush(&mut ops);
        }
    }
    Model { lo: FIRST_FILE, hi, version: 0 }.put(&mut ops);
    flush(&mut ops);
    let el = t0.elapsed();
    s.settle();
    let wb = write_bytes() - w0;
    let (app, alloc) = disk_size(dir);
    let (live, n) = live_bytes(s, Table::Meta);
    println!(
        "load: {records} records ({n} keys, {:.1} MiB logical, {:.1} MiB live) in {:.2}s = {:.0} rec/s; \
         written {:.1} MiB = {:.2}x logical; size {:.1} MiB (allocated {:.1}) = {:.2}x live",
        mb(logical), mb(live), el.as_secs_f64(), records as f64 / el.as_secs_f64(),
        mb(wb), wb as f64 / logical as f64, mb(app), mb(alloc), alloc as f64 / live as f64
    );
    let _ = commits;
}

fn open_cold(s: &dyn Store) {
    let m = Model::read(s);
    let mut rng = SmallRng::seed_from_u64(7);
    let mut lat = Vec::new();
    let r0 = read_bytes();
    for _ in 0..1000 {
        let ino = rng.random_range(m.lo..m.hi);
        let t = Instant::now();
        let v = s.get(Table::Meta, &k_inode(ino));
        lat.push(t.elapsed().as_nanos() as u64);
        assert!(v.is_some());
    }
    let (p50, p99, max) = pct(&mut lat);
    println!("cold get x1000: p50={p50:.0}us p99={p99:.0}us max={max:.0}us (read {:.1} MiB)", mb(read_bytes() - r0));
    for pass in ["cold", "warm"] {
        if pass == "cold" {
            // The gets' page faults may have read ahead much of the file (LMDB's mmap does).
            drop_caches();
        }
        let r0 = read_bytes();
        let t = Instant::now();
        let mut bytes = 0u64;
        let n = s.scan_prefix(Table::Meta, &[T_INODE], &mut |k, v| bytes += (k.len() + v.len()) as u64);
        let el = t.elapsed();
        println!(
            "{pass} scan of inode keys: {n} keys, {:.1} MiB in {:.0}ms = {:.0} keys/s (read {:.1} MiB)",
            mb(bytes), ms(el), n as f64 / el.as_secs_f64(), mb(read_bytes() - r0)
        );
    }
}

fn checkpoint(s: &dyn Store, dir: &Path, sizes: &[usize], reps: u64) {
    let mut m = Model::read(s);
    let mut rng = SmallRng::seed_from_u64(m.version);
    for &n in sizes {
        let (mut tot, mut com, mut wr, mut lg) = (vec![], vec![], 0u64, 0u64);
        for _ in 0..reps {
            let ops = m.batch(n, &mut rng);
            lg += ops.iter().map(Op::logical_len).sum::<u64>();
            let w0 = write_bytes();
            let t = s.apply(Table::Meta, &ops, &mut || {});
            let w = write_bytes() - w0;
            wr += w;
            tot.push(t.total);
            com.push(t.commit);
            println!(
                "  batch {} records: {:.0}ms to durable (commit {:.0}ms) = {:.0} rec/s, written {:.1} MiB",
                ops.len(), ms(t.total), ms(t.commit), ops.len() as f64 / t.total.as_secs_f64(), mb(w)
            );
        }
        tot.sort();
        com.sort();
        let med = tot[tot.len() / 2];
        println!(
            "checkpoint {n}: median {:.0}ms to durable (commit {:.0}ms), {:.0} rec/s; \
             written during commits {:.1} MiB = {:.2}x logical {:.1} MiB",
            ms(med), ms(com[com.len() / 2]), n as f64 / med.as_secs_f64(), mb(wr), wr as f64 / lg as f64, mb(lg)
        );
    }
    let w0 = write_bytes();
    s.settle();
    let (app, alloc) = disk_size(dir);
    println!(
        "after: background writes {:.1} MiB; size {:.1} MiB (allocated {:.1})",
        mb(write_bytes() - w0), mb(app), mb(alloc)
    );
}

fn churn(s: &dyn Store, dir: &Path, size: usize, batches: u64) {
    let mut m = Model::read(s);
    let mut rng = SmallRng::seed_from_u64(m.version ^ 0xc4);
    let (live0, _) = live_bytes(s, Table::Meta);
    let (_, alloc0) = disk_size(dir);
    println!("churn start: live {:.1} MiB, allocated {:.1} MiB", mb(live0), mb(alloc0));
    let w0 = write_bytes();
    let t0 = Instant::now();
    let (mut lg, mut recs) = (0u64, 0u64);
    let mut totals = vec![];
    for b in 1..=batches {
        let ops = m.batch(size, &mut rng);
        lg += ops.iter().map(Op::logical_len).sum::<u64>();
        recs += ops.len() as u64;
        totals.push(s.apply(Table::Meta, &ops, &mut || {}).total);
        if b % (batches / 10).max(1) == 0 {
            let (app, alloc) = disk_size(dir);
            println!(
                "  after {b} batches ({recs} records, {:.0}s): size {:.1} MiB (allocated {:.1}), written {:.1} MiB = {:.2}x logical",
                t0.elapsed().as_secs_f64(), mb(app), mb(alloc), mb(write_bytes() - w0), (write_bytes() - w0) as f64 / lg as f64
            );
        }
    }
    let el = t0.elapsed();
    s.settle();
    let wb = write_bytes() - w0;
    let (app, alloc) = disk_size(dir);
    let (live, n) = live_bytes(s, Table::Meta);
    totals.sort();
    println!(
        "churn: {recs} records in {batches} batches, {:.1}s = {:.0} rec/s (median batch {:.0}ms, max {:.0}ms); \
         written {:.1} MiB = {:.2}x logical {:.1} MiB; end: {n} keys live {:.1} MiB, size {:.1} MiB (allocated {:.1}) = {:.2}x live",
        el.as_secs_f64(), recs as f64 / el.as_secs_f64(), ms(totals[totals.len() / 2]), ms(*totals.last().unwrap()),
        mb(wb), wb as f64 / lg as f64, mb(lg), mb(live), mb(app), mb(alloc), alloc as f64 / live as f64
    );
}

/// One reader thread does random inode gets and ~100-entry directory scans, each in its own
/// read snapshot, while this thread commits big checkpoint batches.
fn readers(s: &dyn Store, size: usize, batches: u64) {
    let mut m = Model::read(s);
    let (lo, hi) = (m.lo, m.hi);
    let mut rng = SmallRng::seed_from_u64(m.version ^ 0x7ead);
    // Prepare the batches first so that building them does not count.
    let prepared: Vec<Vec<Op>> = (0..batches).map(|_| m.batch(size, &mut rng)).collect();
    let stop = AtomicBool::new(false);
    let t0 = Instant::now();
    // (start ns, latency ns, kind: 0 get, 1 scan, found)
    let samples: Mutex<Vec<(u64, u64, u8, u32)>> = Mutex::new(Vec::new());
    let windows: Mutex<Vec<(u64, u64, u64)>> = Mutex::new(Vec::new()); // (begin, commit, end) ns
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let mut rng = SmallRng::seed_from_u64(99);
            let mut v = Vec::with_capacity(1 << 20);
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let st = t0.elapsed().as_nanos() as u64;
                if i % 2 == 0 {
                    let found = s.get(Table::Meta, &k_inode(rng.random_range(lo..hi))).is_some() as u32;
                    v.push((st, t0.elapsed().as_nanos() as u64 - st, 0, found));
                } else {
                    let d = FIRST_DIR + rng.random_range(0..DIRS);
                    let n = s.scan_prefix(Table::Meta, &k_dir(d), &mut |_, _| {}) as u32;
                    v.push((st, t0.elapsed().as_nanos() as u64 - st, 1, n));
                }
            }
            *samples.lock().unwrap() = v;
        });
        std::thread::sleep(Duration::from_secs(2));
        for ops in &prepared {
            let b = t0.elapsed().as_nanos() as u64;
            let mut c = 0;
            s.apply(Table::Meta, ops, &mut || c = t0.elapsed().as_nanos() as u64);
            windows.lock().unwrap().push((b, c, t0.elapsed().as_nanos() as u64));
            std::thread::sleep(Duration::from_secs(1));
        }
        std::thread::sleep(Duration::from_secs(1));
        stop.store(true, Ordering::Relaxed);
    });
    let samples = samples.into_inner().unwrap();
    let windows = windows.into_inner().unwrap();
    let phase = |st: u64, end: u64| -> usize {
        for &(b, c, e) in &windows {
            if end > b && st < c {
                return 1; // overlaps the building of the write transaction
            }
            if end > c && st < e {
                return 2; // overlaps the commit
            }
        }
        0
    };
    let names = ["idle", "txn-build", "commit"];
    let (mut wsum, mut csum) = (0u64, 0u64);
    for &(b, c, e) in &windows {
        wsum += c - b;
        csum += e - c;
        println!("  write txn: build {:.0}ms, commit {:.0}ms", (c - b) as f64 / 1e6, (e - c) as f64 / 1e6);
    }
    let idle_ns = (samples.last().map(|x| x.0).unwrap_or(0)).saturating_sub(wsum + csum);
    for kind in 0..2u8 {
        for ph in 0..3 {
            let mut lat: Vec<u64> = samples.iter().filter(|x| x.2 == kind && phase(x.0, x.0 + x.1) == ph).map(|x| x.1).collect();
            let cnt = lat.len();
            let span = [idle_ns, wsum, csum][ph] as f64 / 1e9;
            let (p50, p99, max) = pct(&mut lat);
            println!(
                "readers {} during {:9}: {cnt:7} ops ({:.0}/s) p50={p50:.1}us p99={p99:.1}us max={max:.0}us",
                ["get ", "scan"][kind as usize], names[ph], cnt as f64 / span.max(1e-9)
            );
        }
    }
    let scans: Vec<u32> = samples.iter().filter(|x| x.2 == 1).map(|x| x.3).collect();
    let gets: Vec<u32> = samples.iter().filter(|x| x.2 == 0).map(|x| x.3).collect();
    // The longest time the reader went without finishing an operation.
    let mut gap = 0u64;
    for w in samples.windows(2) {
        gap = gap.max((w[1].0 + w[1].1).saturating_sub(w[0].0 + w[0].1));
    }
    println!(
        "readers: mean scan {:.1} entries, gets found {:.1}%, longest gap between finished reads {:.1}ms",
        scans.iter().map(|&x| x as f64).sum::<f64>() / scans.len() as f64,
        100.0 * gets.iter().map(|&x| x as f64).sum::<f64>() / gets.len() as f64,
        gap as f64 / 1e6
    );
}

/// Data blocks of 4-64 KiB (random, incompressible) in their own table: files of 1-16 blocks,
/// loaded to `live_mb`, then churned: per batch, half the bytes overwrite random blocks of
/// live files and half replace the oldest files by new ones.
fn data(s: &dyn Store, dir: &Path, live_mb: u64, batch_mb: u64, churn: u64) {
    let mut rng = SmallRng::seed_from_u64(3);
    let blocks_of = |ino: u64| 1 + mix(ino ^ 0xb10c) % 16;
    let block = |rng: &mut SmallRng| {
        let mut v = vec![0u8; rng.random_range(4096..=65536)];
        rng.fill_bytes(&mut v);
        v
    };
    let (mut lo, mut hi) = (1u64 << 32, 1u64 << 32);
    let batch_b = batch_mb << 20;
    let run = |name: &str, ops: &[Op], stats: &mut (u64, u64, Duration, Vec<Duration>)| {
        let lg: u64 = ops.iter().map(Op::logical_len).sum();
        let w0 = write_bytes();
        let t = s.apply(Table::Data, ops, &mut || {});
        stats.0 += lg;
        stats.1 += write_bytes() - w0;
        stats.2 += t.total;
        stats.3.push(t.total);
        let _ = name;
    };
    // load
    let mut st = (0, 0, Duration::ZERO, vec![]);
    let w_all = write_bytes();
    let mut live = 0u64;
    while live < live_mb << 20 {
        let mut ops = vec![];
        let mut b = 0u64;
        while b < batch_b {
            let ino = hi;
            hi += 1;
            for i in 0..blocks_of(ino) {
                let v = block(&mut rng);
                b += v.len() as u64;
                ops.push(Op::Put(k_block(ino, i), v));
            }
        }
        live += b;
        run("load", &ops, &mut st);
    }
    s.settle();
    let wb = write_bytes() - w_all;
    let (app, alloc) = disk_size(dir);
    st.3.sort();
    println!(
        "data load: {:.0} MiB in {} batches, {:.0} MiB/s while committing (median batch {:.0}ms to durable); \
         written {:.0} MiB = {:.2}x logical; size {:.0} MiB (allocated {:.0})",
        mb(st.0), st.3.len(), mb(st.0) / st.2.as_secs_f64(), ms(st.3[st.3.len() / 2]), mb(wb), wb as f64 / st.0 as f64, mb(app), mb(alloc)
    );
    let mut st = (0, 0, Duration::ZERO, vec![]);
    let w_all = write_bytes();
    for c in 1..=churn {
        let mut ops = vec![];
        let mut b = 0u64;
        while b < batch_b / 2 {
            let ino = rng.random_range(lo..hi);
            let i = rng.random_range(0..blocks_of(ino));
            let v = block(&mut rng);
            b += v.len() as u64;
            ops.push(Op::Put(k_block(ino, i), v));
        }
        let mut freed = 0u64;
        while freed < batch_b / 2 {
            let ino = lo;
            lo += 1;
            for i in 0..blocks_of(ino) {
                ops.push(Op::Del(k_block(ino, i)));
                freed += 34 << 10; // mean block size
            }
            let ino = hi;
            hi += 1;
            for i in 0..blocks_of(ino) {
                let v = block(&mut rng);
                ops.push(Op::Put(k_block(ino, i), v));
            }
        }
        run("churn", &ops, &mut st);
        if c % (churn / 4).max(1) == 0 {
            let (app, alloc) = disk_size(dir);
            println!("  after {c} churn batches: size {:.0} MiB (allocated {:.0})", mb(app), mb(alloc));
        }
    }
    s.settle();
    let wb = write_bytes() - w_all;
    let (app, alloc) = disk_size(dir);
    let (live, n) = live_bytes(s, Table::Data);
    st.3.sort();
    println!(
        "data churn: {:.0} MiB in {} batches, {:.0} MiB/s while committing (median batch {:.0}ms); written {:.0} MiB = {:.2}x logical; \
         end: {n} blocks live {:.0} MiB, size {:.0} MiB (allocated {:.0}) = {:.2}x live",
        mb(st.0), churn, mb(st.0) / st.2.as_secs_f64(), ms(st.3[st.3.len() / 2]), mb(wb), wb as f64 / st.0 as f64,
        mb(live), mb(app), mb(alloc), alloc as f64 / live as f64
    );
}

// ------------------------------------------------------------------ crash test

fn crash_key(batch: u64, j: u32) -> Vec<u8> {
    let mut k = vec![T_CRASH];
    k.extend_from_slice(&batch.to_be_bytes());
    k.extend_from_slice(&j.to_be_bytes());
    k
}
const CRASH_KEYS: u32 = 50_000;

fn crash_counter(s: &dyn Store) -> u64 {
    s.get(Table::Meta, K_CRASH).map(|v| u64::from_le_bytes(v[..8].try_into().unwrap())).unwrap_or(0)
}

/// Commits batches forever: batch n puts 50k keys of its own, deletes the 50k of batch n-2,
/// and sets the counter to n; says "commit n" before committing and "done n" after.
fn crash_child(s: &dyn Store) {
    let mut n = crash_counter(s);
    let out = std::io::stdout();
    loop {
        n += 1;
        let mut ops = Vec::with_capacity(2 * CRASH_KEYS as usize + 1);
        for j in 0..CRASH_KEYS {
            ops.push(Op::Put(crash_key(n, j), inode_val(n ^ j as u64, n)));
            if n >= 3 {
                ops.push(Op::Del(crash_key(n - 2, j)));
            }
        }
        ops.push(Op::Put(K_CRASH.to_vec(), n.to_le_bytes().to_vec()));
        s.apply(Table::Meta, &ops, &mut || {
            writeln!(out.lock(), "commit {n}").unwrap();
        });
        writeln!(out.lock(), "done {n}").unwrap();
    }
}

/// Prints `VERDICT ok ...` when the reopened store holds exactly the state after a whole
/// batch, at least the last one reported durable and at most the one being committed.
fn crash_verify(s: &mut dyn Store, last_done: u64, killed_in: u64) {
    let n = crash_counter(s);
    let count = |s: &dyn Store, b: u64| if b == 0 { 0 } else { s.scan_prefix(Table::Meta, &crash_key(b, 0)[..9], &mut |_, _| {}) };
    let (c0, c1, cm2, cp1) = (count(s, n), count(s, n.saturating_sub(1)), count(s, n.saturating_sub(2)), count(s, n + 1));
    let want1 = if n >= 2 { CRASH_KEYS as usize } else { 0 };
    let consistent = c0 == CRASH_KEYS as usize && c1 == want1 && cm2 == 0 && cp1 == 0;
    let durable = n >= last_done && n <= killed_in;
    let check = s.check();
    let (_, keys) = live_bytes(s, Table::Meta);
    let good = consistent && durable && check != Some(false);
    println!(
        "VERDICT {} state = batch {n} (last reported durable {last_done}, killed committing {killed_in}); \
         batch keys {c0}/{c1}/{cm2}/{cp1} (n, n-1, n-2, n+1): {}, {}; integrity check {:?}; {keys} keys readable",
        if good { "ok" } else { "BAD" },
        if consistent { "consistent" } else { "INCONSISTENT" },
        if durable { "durable" } else { "LOST A REPORTED COMMIT" },
        check
    );
}

/// Kills a committing child with SIGKILL, reopens the store, and checks that it holds exactly
/// the state of a batch boundary no older than the last batch reported durable.
fn crash(engine: &str, dir: &Path, rounds: u64, cache: usize) {
    let exe = std::env::current_exe().unwrap();
    let mut rng = SmallRng::seed_from_u64(11);
    let (mut ok, mut mid) = (0, 0);
    let mut reopen = vec![];
    for round in 1..=rounds {
        let mut child = std::process::Command::new(&exe)
            .args(["crash-child", "--engine", engine, "--dir", dir.to_str().unwrap()])
            .args(["--cache-mb", &(cache >> 20).to_string()])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<(String, Instant)>();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(stdout).lines() {
                let Ok(l) = l else { break };
                if tx.send((l, Instant::now())).is_err() {
                    break;
                }
            }
        });
        // Let it complete 1-3 batches, then kill it a random part of a commit's length after
        // it starts committing the next.
        let target = rng.random_range(2..=4u64);
        let (mut commits, mut last_commit_len, mut last_done, mut commit_at) = (0, Duration::from_millis(200), 0u64, None);
        let mut first = None;
        let killed_in;
        loop {
            let (l, at) = rx.recv_timeout(Duration::from_secs(600)).expect("child silent");
            if l.starts_with('#') {
                continue;
            }
            let (word, n) = l.split_once(' ').unwrap();
            let n: u64 = n.parse().unwrap();
            first.get_or_insert(n);
            if word == "commit" {
                commits += 1;
                commit_at = Some(at);
                if commits == target {
                    let d = last_commit_len.mul_f64(rng.random_range(0.0..1.0));
                    std::thread::sleep(d.saturating_sub(at.elapsed()));
                    // SAFETY: kill on our own child's pid.
                    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
                    killed_in = n;
                    break;
                }
            } else {
                last_done = n;
                last_commit_len = at - commit_at.unwrap();
            }
        }
        child.wait().unwrap();
        // The reader thread may lag the child: what it printed before dying tells which
        // commit it was in (its last "commit n") and which it had reported durable.
        let mut killed_in = killed_in;
        while let Ok((l, _)) = rx.recv_timeout(Duration::from_millis(300)) {
            match l.split_once(' ') {
                Some(("commit", n)) => killed_in = killed_in.max(n.parse().unwrap()),
                Some(("done", n)) => last_done = last_done.max(n.parse().unwrap()),
                _ => {}
            }
        }
        let done_killed = last_done == killed_in;
        if !done_killed {
            mid += 1;
        }
        let out = std::process::Command::new(&exe)
            .args(["crash-verify", "--engine", engine, "--dir", dir.to_str().unwrap()])
            .args(["--cache-mb", &(cache >> 20).to_string()])
            .args(["--last-done", &last_done.to_string(), "--killed", &killed_in.to_string()])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let verdict = match text.lines().find_map(|l| l.strip_prefix("VERDICT ")) {
            Some(v) => {
                if v.starts_with("ok") {
                    ok += 1;
                }
                let ms_open: f64 = text.lines().find_map(|l| l.split("open=").nth(1))
                    .and_then(|x| x.split("ms").next()).and_then(|x| x.parse().ok()).unwrap_or(f64::NAN);
                reopen.push(Duration::from_secs_f64(ms_open / 1e3));
                format!("reopen {ms_open:.0}ms; {v}{}", if done_killed { " (the killed commit had finished)" } else { "" })
            }
            None => format!("FAILED: exit {:?}; {}", out.status, String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("")),
        };
        println!("round {round}: killed during commit {killed_in}, after {} batches; {verdict}", target - 1);
    }
    reopen.sort();
    println!(
        "crash {engine}: {ok}/{rounds} rounds recovered a committed, consistent state; {mid} kills landed inside a commit; \
         reopen median {:.0}ms max {:.0}ms",
        reopen.get(reopen.len() / 2).map(|d| ms(*d)).unwrap_or(0.0),
        reopen.last().map(|d| ms(*d)).unwrap_or(0.0)
    );
}
