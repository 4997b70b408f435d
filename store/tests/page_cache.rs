//! File data out of memory (docs/STORE.md, "File data out of memory"): pages a checkpoint
//! holds leave memory (engine `data.rs`, "Pages the store keeps"; `fs/cache.rs`) and are read
//! back from the checkpoint. Every read is checked against a model while checkpoints and
//! eviction passes race the writers, partial changes of pages that are out of memory
//! (writes, truncations, punched holes) keep the rest of the page, memory holds the cache
//! budget, not the data, and changed data in memory is bounded by checkpoints; pages kept
//! fifteen to a key keep their edges.
//!
//! Then, adversarially, against a plain model (a `Vec<u8>` per file): pages evicted after a
//! checkpoint, faulted back in by partial writes, truncations and hole punches, while other
//! threads change the same files; numbers reused, crashes after eviction, readers racing
//! eviction, `SEEK_DATA`/`SEEK_HOLE`, journal replay onto kept pages.
//!
//! Random tests print their seed; `LANEFS_SEED=<n>` replays one.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{
    close_unshared, dump, host_opts, model_allocate, model_punch, model_write, no_cache, on_demand,
    opts, pattern, rw, rwc, seed,
};
use lanefs::{
    Client, Config, Ctx, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, Filesystem, OpenOptions, PAGE,
};
use lanefs_store::disk::{SimDisk, Unflushed};
use lanefs_store::{Options, StoreHandle, fsck, open};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The commit interval of every store here.
const COMMIT: Duration = Duration::from_millis(5);
/// Where the stores on a simulated disk live.
const STORE: &str = "/store";

/// A store on the host whose checkpoints come from the test's own thread, as often as it
/// can.
fn on_host() -> Options {
    on_demand(host_opts(1 << 20, COMMIT))
}

/// One random change to file `f` (`model` is its bytes), or a read checked against `model`.
fn step(fs: &Filesystem, f: &lanefs::File<'_>, model: &mut Vec<u8>, rng: &mut StdRng) {
    let ctx = Ctx::root();
    let limit = 64 * PAGE;
    let off = rng.random_range(0..limit);
    let len = rng.random_range(1..PAGE + PAGE / 2);
    match rng.random_range(0..10) {
        0..=3 => {
            let b = rng.random::<u8>() | 1;
            let data = vec![b; len as usize];
            assert_eq!(f.write_at(&data, off).unwrap(), data.len());
            model_write(model, off, &data);
        }
        4 => {
            let size = rng.random_range(0..limit);
            f.set_len(size).unwrap();
            model.resize(size as usize, 0);
        }
        5 => {
            punch(fs, f, off, len);
            model_punch(model, off, len);
        }
        6 => {
            fs.fallocate(&ctx, f.handle(), FALLOC_FL_KEEP_SIZE, off, len)
                .unwrap();
        }
        _ => {
            let mut b = vec![0xEE; len as usize];
            let n = f.read_at(&mut b, off).unwrap();
            let want = model.get(off as usize..).unwrap_or(&[]);
            let want = &want[..want.len().min(len as usize)];
            assert_eq!(n, want.len(), "read length at {off}");
            assert!(
                b[..n] == *want,
                "read of {len} at {off} differs from the model"
            );
        }
    }
}

fn check_file(c: &Client, path: &str, model: &[u8]) {
    let got = c.read(path).unwrap();
    assert_eq!(got.len(), model.len(), "{path}: size");
    assert!(got == model, "{path}: contents differ from the model");
}

/// Writers change and read their own files (checked against a model at every read) while
/// another thread takes checkpoints and sends every page they hold out of memory; the files
/// are then read whole, and again after a reopen.
#[test]
fn pages_out_of_memory_read_back_under_racing_checkpoints() {
    let seed = seed::seed("pages_out_of_memory_read_back_under_racing_checkpoints");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let opts = on_host();
    let o = open(dir, no_cache(), opts.clone()).unwrap();
    let fs = Arc::new(o.fs);
    let store = Arc::new(o.store);
    let done = Arc::new(AtomicBool::new(false));
    let evicted = Arc::new(AtomicU64::new(0));
    let checkpoints = Arc::new(AtomicU64::new(0));
    let checkpointer = {
        let (fs, store, done, evicted, checkpoints) = (
            fs.clone(),
            store.clone(),
            done.clone(),
            evicted.clone(),
            checkpoints.clone(),
        );
        std::thread::spawn(move || {
            let mut rounds = 0u64;
            // Passes far more often than checkpoints: a pass that dropped a page the last
            // checkpoint does not hold would leave it stale for many reads.
            while !done.load(Relaxed) {
                if rounds.is_multiple_of(8) {
                    store.checkpoint().unwrap();
                    checkpoints.fetch_add(1, Relaxed);
                }
                fs.evict();
                // Passes run by the writers' operations count too.
                evicted.fetch_max(fs.pages_out(), Relaxed);
                rounds += 1;
                std::thread::sleep(Duration::from_micros(500));
            }
        })
    };
    let threads = 3u64;
    let files = 3;
    // Until the checkpointer has taken this many checkpoints (at least `ops` each, at most
    // twenty times as many).
    let (rounds, ops) = (12, 500);
    let writers: Vec<_> = (0..threads)
        .map(|t| {
            let fs = fs.clone();
            let checkpoints = checkpoints.clone();
            std::thread::spawn(move || {
                let c = Client::root(fs.clone());
                let mut rng = StdRng::seed_from_u64(seed ^ t);
                let mut models = vec![Vec::new(); files];
                let open = *OpenOptions::new().read(true).write(true).create(true);
                let handles: Vec<_> = (0..files)
                    .map(|k| c.open(format!("/t{t}-f{k}"), &open).unwrap())
                    .collect();
                let mut n = 0;
                while n < ops || checkpoints.load(Relaxed) < rounds && n < 20 * ops {
                    let k = rng.random_range(0..files);
                    step(&fs, &handles[k], &mut models[k], &mut rng);
                    n += 1;
                    if n % 8 == 0 {
                        // Bursts, with room between them for the checkpointer (on a machine
                        // with few cores it would otherwise never catch up).
                        std::thread::sleep(Duration::from_millis(2));
                    }
                }
                drop(handles);
                models
            })
        })
        .collect();
    let models: Vec<Vec<Vec<u8>>> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    done.store(true, Relaxed);
    checkpointer.join().unwrap();
    assert!(
        evicted.load(Relaxed) > 0,
        "no page ever left memory: the test tested nothing"
    );
    let c = Client::root(fs.clone());
    // Everything the checkpoints hold is out of memory now: these reads come from the store.
    store.checkpoint().unwrap();
    fs.evict();
    assert_eq!(fs.resident_pages(), 0, "every page is in the checkpoint");
    for (t, ms) in models.iter().enumerate() {
        for (k, m) in ms.iter().enumerate() {
            check_file(&c, &format!("/t{t}-f{k}"), m);
        }
    }
    fs.check_invariants().unwrap();
    let want = dump(&fs, true);
    drop(c);
    close_unshared(fs, store);
    let report = fsck::check(dir, &opts).unwrap();
    assert!(report.checkpoint_lsn > 0);
    let r = open(dir, no_cache(), opts).unwrap();
    assert_eq!(r.fs.resident_pages(), 0, "opening reads no page");
    assert!(
        want == dump(&r.fs, true),
        "seed {seed}: reopened store differs"
    );
    let c = Client::root(Arc::new(r.fs));
    for (t, ms) in models.iter().enumerate() {
        for (k, m) in ms.iter().enumerate() {
            check_file(&c, &format!("/t{t}-f{k}"), m);
        }
    }
}

/// 32 MiB of data through a filesystem with a 1 MiB cache: after each checkpoint, the next
/// operation's eviction pass brings memory back under the budget; everything reads back,
/// before and after a reopen.
#[test]
fn memory_holds_the_cache_budget_not_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let budget = 1u64 << 20;
    let cfg = Config {
        cache_bytes: Some(budget),
        ..Config::default()
    };
    let o = open(dir.path(), cfg.clone(), on_host()).unwrap();
    let fs = Arc::new(o.fs);
    let c = Client::root(fs.clone());
    let file = |k: usize| -> Vec<u8> {
        (0..512 << 10)
            .map(|i: usize| (i / 4096 + k * 7) as u8 | 1)
            .collect()
    };
    let mut most = 0;
    for k in 0..64 {
        c.write(format!("/f{k}"), file(k)).unwrap();
        if k % 8 == 7 {
            // 4 MiB written since the last checkpoint: all of it in memory until this one.
            assert!(fs.resident_pages() * PAGE >= 4 << 20);
            o.store.checkpoint().unwrap();
            // The next operation runs the pass.
            c.metadata("/f0").unwrap();
            let _ = c.read("/f0").unwrap();
            most = most.max(fs.resident_pages());
            assert!(
                fs.resident_pages() * PAGE <= budget,
                "{} pages in memory after a checkpoint, budget {}",
                fs.resident_pages(),
                budget / PAGE
            );
        }
    }
    assert!(most > 0, "the budget keeps some pages cached");
    for k in 0..64 {
        assert!(c.read(format!("/f{k}")).unwrap() == file(k), "file {k}");
    }
    let statfs_used = fs.statfs().blocks - fs.statfs().bfree;
    assert!(
        statfs_used * 4096 >= 32 << 20,
        "the data counts as used space"
    );
    drop(c);
    close_unshared(fs, o.store);
    let r = open(dir.path(), cfg, on_host()).unwrap();
    assert_eq!(r.fs.resident_pages(), 0);
    let c = Client::root(Arc::new(r.fs));
    for k in 0..64 {
        assert!(
            c.read(format!("/f{k}")).unwrap() == file(k),
            "file {k} after reopen"
        );
    }
}

/// A store may hold more than the host's memory: its default size limit is its disk's.
#[test]
fn a_store_is_as_large_as_its_disk() {
    let dir = tempfile::tempdir().unwrap();
    let o = open(dir.path(), Config::default(), on_host()).unwrap();
    // SAFETY: statvfs is plain old data, for which all zeros is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let p = std::ffi::CString::new(dir.path().to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path and a struct of the right size to fill.
    assert_eq!(unsafe { libc::statvfs(p.as_ptr(), &mut st) }, 0);
    let disk = st.f_blocks * st.f_frsize;
    let s = o.fs.statfs();
    assert_eq!(s.blocks * s.bsize as u64, disk.div_ceil(PAGE) * PAGE);
}

/// Data changed since the last checkpoint cannot leave memory; the store bounds it (docs/
/// STORE.md, "Memory"): a checkpoint is due once `checkpoint_changed` bytes changed, and
/// writers wait at four times that. Threads writing 48 MiB, ten times that bound, with no
/// checkpoint taken by the test, never find more in memory than the bound plus the cache
/// (and what the threads' own last writes add); everything reads back.
#[test]
fn changed_data_in_memory_is_bounded_by_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let cache = 1u64 << 20;
    let changed = 1u64 << 20;
    let cfg = Config {
        cache_bytes: Some(cache),
        ..Config::default()
    };
    let o = open(
        dir.path(),
        cfg,
        Options {
            checkpoint_changed: changed,
            checkpoint_poll: Duration::from_secs(3600),
            ..on_host()
        },
    )
    .unwrap();
    let fs = Arc::new(o.fs);
    const THREADS: usize = 3;
    const FILE: usize = 4 << 20;
    const FILES: usize = 4;
    let most = AtomicU64::new(0);
    let content = |t: usize, k: usize| -> Vec<u8> {
        (0..FILE)
            .map(|i| ((i / 4096) as u8).wrapping_mul(31) ^ (t * 16 + k) as u8 | 1)
            .collect()
    };
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (fs, most) = (fs.clone(), &most);
            s.spawn(move || {
                let c = Client::root(fs.clone());
                for k in 0..FILES {
                    let data = content(t, k);
                    let mut o = OpenOptions::new();
                    o.write(true).create(true);
                    let f = c.open(format!("/t{t}-{k}"), &o).unwrap();
                    for (n, chunk) in data.chunks(64 << 10).enumerate() {
                        f.write_at(chunk, (n * (64 << 10)) as u64).unwrap();
                        most.fetch_max(fs.resident_pages(), SeqCst);
                    }
                }
            });
        }
    });
    let most = most.load(SeqCst) * PAGE;
    // Four times `changed` may be changed and held; the cache on top; then each thread's
    // writes until its check (every 64 pages it changes) and its wait.
    let bound = 4 * changed + cache + THREADS as u64 * (2 * 64 * PAGE + (64 << 10));
    assert!(
        most <= bound,
        "{most} bytes of file data in memory, bound {bound} (48 MiB written)"
    );
    let c = Client::root(fs.clone());
    for t in 0..THREADS {
        for k in 0..FILES {
            assert!(
                c.read(format!("/t{t}-{k}")).unwrap() == content(t, k),
                "/t{t}-{k}"
            );
        }
    }
    assert!(
        o.store.checkpoint_status().attempts >= 10,
        "checkpoints came as data changed: {:?}",
        o.store.checkpoint_status()
    );
}

/// The checkpoint keeps a file's pages fifteen to a key (docs/STORE.md, "Checkpoints"):
/// holes punched, space allocated and sizes cut at, across and within those groups (whole
/// groups, a group's edges, one page inside one) leave exactly the model's bytes, read back
/// from the checkpoint after every change, again after a reopen, and with each page's
/// existence (`st_blocks`) right.
#[test]
fn pages_grouped_by_fifteen_keep_their_edges() {
    const G: u64 = 15 * PAGE;
    let seed = seed::seed("pages_grouped_by_fifteen_keep_their_edges");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let o = open(dir.path(), no_cache(), on_host()).unwrap();
    let fs = Arc::new(o.fs);
    let c = Client::root(fs.clone());
    let ctx = Ctx::root();
    let open_rw = *OpenOptions::new().read(true).write(true).create(true);
    let f = c.open("/f", &open_rw).unwrap();
    // Every page distinct, none ending in zeros: 7 groups and a part of one.
    let mut model: Vec<u8> = (0..7 * G + 5 * PAGE + 100)
        .map(|i| ((i / PAGE) as u8).wrapping_mul(13) ^ (i as u8) | 1)
        .collect();
    assert_eq!(f.write_at(&model, 0).unwrap(), model.len());
    // Offsets on, one page before and one page after group boundaries, and inside pages.
    let near = |rng: &mut StdRng| -> u64 {
        let g = rng.random_range(0..8u64) * G;
        let at = match rng.random_range(0..4) {
            0 => g,
            1 => g.saturating_sub(PAGE),
            2 => g + PAGE,
            _ => g + rng.random_range(0..G),
        };
        at + if rng.random_bool(0.3) {
            rng.random_range(1..PAGE)
        } else {
            0
        }
    };
    let punch = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
    let mut fixed = vec![
        (punch, G, 2 * G),                      // two whole groups
        (punch, 4 * G - PAGE, 2 * PAGE),        // across a boundary, whole pages
        (punch, 5 * G + 3 * PAGE, PAGE),        // one page inside a group
        (punch, 6 * G + 10, G),                 // across, with partial pages at both ends
        (FALLOC_FL_KEEP_SIZE, G + PAGE, 3 * G), // pages of zeros into punched groups
    ];
    fixed.reverse();
    for round in 0..40 {
        let what = if let Some((mode, off, len)) = fixed.pop() {
            fs.fallocate(&ctx, f.handle(), mode, off, len).unwrap();
            if mode & FALLOC_FL_PUNCH_HOLE != 0 {
                model_punch(&mut model, off, len);
            }
            format!("fallocate {mode:#x} {off}+{len}")
        } else {
            match rng.random_range(0..4) {
                0 => {
                    let size = near(&mut rng);
                    f.set_len(size).unwrap();
                    model.resize(size as usize, 0);
                    format!("truncate to {size}")
                }
                1 => {
                    let (off, len) = (near(&mut rng), rng.random_range(1..3 * G));
                    fs.fallocate(&ctx, f.handle(), punch, off, len).unwrap();
                    model_punch(&mut model, off, len);
                    format!("punch {off}+{len}")
                }
                _ => {
                    let (off, len) = (near(&mut rng), rng.random_range(1..2 * G));
                    let data = vec![rng.random::<u8>() | 1; len as usize];
                    f.write_at(&data, off).unwrap();
                    model_write(&mut model, off, &data);
                    format!("write {off}+{len}")
                }
            }
        };
        o.store.checkpoint().unwrap();
        fs.evict();
        assert_eq!(
            fs.resident_pages(),
            0,
            "round {round}: every page in the checkpoint"
        );
        let got = c.read("/f").unwrap();
        assert_eq!(
            got.len(),
            model.len(),
            "seed {seed}, round {round}, {what}: size"
        );
        assert!(
            got == model,
            "seed {seed}, round {round}, after {what}: contents differ"
        );
    }
    let blocks = c.metadata("/f").unwrap().attr.blocks;
    drop(f);
    drop(c);
    close_unshared(fs, o.store);
    let r = open(dir.path(), no_cache(), on_host()).unwrap();
    let c = Client::root(Arc::new(r.fs));
    assert!(c.read("/f").unwrap() == model, "seed {seed}: after reopen");
    assert_eq!(
        c.metadata("/f").unwrap().attr.blocks,
        blocks,
        "pages that exist, after reopen"
    );
}

// ----- adversarial, against a plain model ----------------------------------------------------

fn cfg() -> Config {
    Config {
        protected_hardlinks: false,
        ..no_cache()
    }
}

fn open_fs(disk: &SimDisk) -> (Arc<Filesystem>, StoreHandle) {
    let o = open(Path::new(STORE), cfg(), opts(disk, 64 << 10, COMMIT)).expect("open store");
    (Arc::new(o.fs), o.store)
}

fn close(fs: Arc<Filesystem>, store: StoreHandle) {
    drop(fs);
    store.close().expect("clean close");
}

fn fsck_clean(disk: &SimDisk, what: &str) {
    lanefs_store::fsck::check(Path::new(STORE), &opts(disk, 64 << 10, COMMIT))
        .unwrap_or_else(|e| panic!("{what}: fsck: {e:?}"));
}

fn read_all(f: &lanefs::File<'_>, len: usize) -> Vec<u8> {
    let mut buf = vec![0xEEu8; len + 4096];
    let mut got = 0;
    loop {
        let n = f.read_at(&mut buf[got..], got as u64).expect("read");
        if n == 0 {
            break;
        }
        got += n;
        if got == buf.len() {
            buf.resize(buf.len() * 2, 0xEE);
        }
    }
    buf.truncate(got);
    buf
}

fn first_diff(a: &[u8], b: &[u8]) -> String {
    if a.len() != b.len() {
        let i = a.iter().zip(b).position(|(x, y)| x != y);
        return format!("len {} vs model {}, first diff {:?}", a.len(), b.len(), i);
    }
    let i = a.iter().zip(b).position(|(x, y)| x != y).unwrap();
    format!("first diff at {i}: got {:#x} model {:#x}", a[i], b[i])
}

fn check_eq(got: &[u8], model: &[u8], what: &str) {
    if got != model {
        panic!("{what}: {}", first_diff(got, model));
    }
}

/// `f` read whole equals `model`.
fn check_read(f: &lanefs::File<'_>, model: &[u8], what: &str) {
    check_eq(&read_all(f, model.len()), model, what);
}

/// A checkpoint, then an eviction pass (its count of pages sent out).
fn checkpoint_evict(store: &StoreHandle, fs: &Filesystem) -> u64 {
    store.checkpoint().unwrap();
    fs.evict()
}

/// Punches a hole of `len` bytes at `off` in `f`, keeping its size.
fn punch(fs: &Filesystem, f: &lanefs::File<'_>, off: u64, len: u64) {
    let mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
    fs.fallocate(&Ctx::root(), f.handle(), mode, off, len)
        .unwrap();
}

/// Opens the store on `disk`, runs `body` on its filesystem, its handle and a root client,
/// then closes it cleanly.
fn with_store<R>(
    disk: &SimDisk,
    body: impl FnOnce(&Arc<Filesystem>, &StoreHandle, &Client) -> R,
) -> R {
    let (fs, store) = open_fs(disk);
    let c = Client::root(fs.clone());
    let r = body(&fs, &store, &c);
    drop(c);
    close(fs, store);
    r
}

/// In `s`, a thread that takes a checkpoint and runs an eviction pass, again and again
/// (`pause` between rounds) until `stop`.
fn spawn_checkpointer<'s>(
    s: &'s std::thread::Scope<'s, '_>,
    store: &'s StoreHandle,
    fs: Arc<Filesystem>,
    stop: &'s AtomicBool,
    pause: Option<Duration>,
) {
    s.spawn(move || {
        while !stop.load(SeqCst) {
            store.checkpoint().expect("checkpoint");
            fs.evict();
            if let Some(pause) = pause {
                std::thread::sleep(pause);
            }
        }
    });
}

/// Joins the threads `hs`, setting `stop` as each ends, and passes a panic of theirs on.
fn join_stopping(hs: Vec<std::thread::ScopedJoinHandle<'_, ()>>, stop: &AtomicBool) {
    for h in hs {
        let r = h.join();
        stop.store(true, SeqCst);
        if let Err(e) = r {
            std::panic::resume_unwind(e);
        }
    }
}

/// The store on `disk`, reopened: `path` reads as `model`.
fn reopened_reads(disk: &SimDisk, path: &str, model: &[u8], what: &str) {
    with_store(disk, |_, _, c| {
        check_read(&c.open(path, &rw()).unwrap(), model, what)
    });
}

fn blocks(fs: &Filesystem, ino: lanefs::Ino) -> u64 {
    fs.getattr(ino).unwrap().blocks
}

/// Applies one random op to file `f` and its model; returns a description.
fn random_op(
    fs: &Filesystem,
    f: &lanefs::File<'_>,
    model: &mut Vec<u8>,
    rng: &mut StdRng,
) -> String {
    let max = 6 * PAGE;
    match rng.random_range(0..10) {
        0..=3 => {
            let off = rng.random_range(0..max);
            let len = rng.random_range(1..2 * PAGE + 10) as usize;
            let data = pattern(rng.random(), len);
            f.write_at(&data, off).unwrap();
            model_write(model, off, &data);
            format!("write {off}+{len}")
        }
        4 | 5 => {
            let n = rng.random_range(0..max);
            f.set_len(n).unwrap();
            model.resize(n as usize, 0);
            format!("set_len {n}")
        }
        6 | 7 => {
            let off = rng.random_range(0..max);
            let len = rng.random_range(1..2 * PAGE + 10);
            punch(fs, f, off, len);
            model_punch(model, off, len);
            format!("punch {off}+{len}")
        }
        8 => {
            let off = rng.random_range(0..max);
            let len = rng.random_range(1..2 * PAGE);
            fs.fallocate(&Ctx::root(), f.handle(), FALLOC_FL_KEEP_SIZE, off, len)
                .unwrap();
            format!("falloc keep {off}+{len}")
        }
        _ => {
            let off = rng.random_range(0..max);
            let len = rng.random_range(1..2 * PAGE);
            fs.fallocate(&Ctx::root(), f.handle(), 0, off, len).unwrap();
            model_allocate(model, off, len);
            format!("falloc {off}+{len}")
        }
    }
}

/// Several threads change and read the same files (serialized per file by the model's lock)
/// while another thread checkpoints and evicts in a loop; every read equals the model, a
/// file's st_blocks do not change across an eviction, and the reopened store equals the
/// model and passes fsck.
#[test]
fn concurrent_same_files_vs_model() {
    for seed in seed::seeds("pages out of memory", seed::counting(1000, 3)) {
        eprintln!("seed {seed}");
        let disk = SimDisk::new();
        let (fs, store) = open_fs(&disk);
        let c = Client::root(fs.clone());
        const FILES: usize = 3;
        let models: Vec<Mutex<Vec<u8>>> = (0..FILES).map(|_| Mutex::new(Vec::new())).collect();
        let files: Vec<_> = (0..FILES)
            .map(|i| c.open(format!("/f{i}"), &rwc()).unwrap())
            .collect();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let pause = Some(Duration::from_millis(1));
            spawn_checkpointer(s, &store, fs.clone(), &stop, pause);
            let mut hs = Vec::new();
            for t in 0..3u64 {
                let fs = fs.clone();
                let models = &models;
                let files = &files;
                hs.push(s.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(seed * 31 + t);
                    let mut log = Vec::new();
                    for op in 0..250 {
                        let i = rng.random_range(0..FILES);
                        let mut m = models[i].lock().unwrap();
                        let f = &files[i];
                        log.push(format!("t{t} f{i} {}", random_op(&fs, f, &mut m, &mut rng)));
                        if log.len() > 8 {
                            log.remove(0);
                        }
                        let got = read_all(f, m.len());
                        if got != *m {
                            panic!(
                                "seed {seed} op {op}: {} after {log:#?}",
                                first_diff(&got, &m)
                            );
                        }
                        if op % 7 == 0 {
                            let b = blocks(&fs, f.ino());
                            fs.evict();
                            let b2 = blocks(&fs, f.ino());
                            assert_eq!(b, b2, "seed {seed}: st_blocks changed across evict");
                            let got = read_all(f, m.len());
                            check_eq(&got, &m, &format!("seed {seed} op {op} after evict"));
                        }
                    }
                }));
            }
            join_stopping(hs, &stop);
            stop.store(true, SeqCst);
        });
        let blocks_before: Vec<u64> = files.iter().map(|f| blocks(&fs, f.ino())).collect();
        let bfree = fs.statfs().bfree;
        drop(files);
        drop(c);
        close(fs, store);
        fsck_clean(&disk, &format!("seed {seed}"));
        with_store(&disk, |fs, _, c| {
            assert_eq!(
                fs.statfs().bfree,
                bfree,
                "seed {seed}: statfs bfree after reopen"
            );
            for i in 0..FILES {
                let f = c.open(format!("/f{i}"), &rw()).unwrap();
                let m = models[i].lock().unwrap();
                assert_eq!(
                    blocks(fs, f.ino()),
                    blocks_before[i],
                    "seed {seed}: f{i} blocks after reopen"
                );
                check_read(&f, &m, &format!("seed {seed} reopen f{i}"));
            }
        });
    }
}

/// Truncating into an evicted last page, then extending (by set_len, by a write past EOF,
/// by fallocate): the bytes past the truncation point read as zeros, before and after
/// another checkpoint/evict, and after reopen.
#[test]
fn truncate_into_evicted_then_extend() {
    for variant in 0..6u32 {
        let disk = SimDisk::new();
        let m = with_store(&disk, |fs, store, c| {
            let f = c.open("/a", &rwc()).unwrap();
            let mut m = pattern(variant as u64, (3 * PAGE + 1000) as usize);
            f.write_at(&m, 0).unwrap();
            assert!(checkpoint_evict(store, fs) > 0 || variant > 0);
            let cut = [PAGE + 17, 3 * PAGE + 5, 2 * PAGE - 1][(variant % 3) as usize];
            f.set_len(cut).unwrap();
            m.truncate(cut as usize);
            if variant >= 3 {
                checkpoint_evict(store, fs);
            }
            let newlen = 5 * PAGE + 3;
            match variant % 3 {
                0 => f.set_len(newlen).unwrap(),
                1 => {
                    f.write_at(b"Z", newlen - 1).unwrap();
                }
                _ => fs
                    .fallocate(&Ctx::root(), f.handle(), 0, 0, newlen)
                    .unwrap(),
            }
            m.resize(newlen as usize, 0);
            if variant % 3 == 1 {
                m[newlen as usize - 1] = b'Z';
            }
            check_read(&f, &m, &format!("variant {variant} live"));
            checkpoint_evict(store, fs);
            check_read(&f, &m, &format!("variant {variant} after evict"));
            m
        });
        fsck_clean(&disk, "truncate");
        reopened_reads(&disk, "/a", &m, &format!("variant {variant} reopen"));
    }
}

/// fallocate KEEP_SIZE beyond EOF of an evicted file, evict again, then extend: the new
/// region reads as zeros and old bytes are intact; st_blocks unchanged by evict.
#[test]
fn falloc_keep_size_beyond_eof_evicted() {
    let disk = SimDisk::new();
    let (m, b) = with_store(&disk, |fs, store, c| {
        let f = c.open("/k", &rwc()).unwrap();
        let mut m = pattern(7, (PAGE + 100) as usize);
        f.write_at(&m, 0).unwrap();
        checkpoint_evict(store, fs);
        fs.fallocate(&Ctx::root(), f.handle(), FALLOC_FL_KEEP_SIZE, 50, 6 * PAGE)
            .unwrap();
        assert_eq!(f.metadata().unwrap().attr.size, m.len() as u64);
        let b = blocks(fs, f.ino());
        checkpoint_evict(store, fs);
        assert_eq!(
            blocks(fs, f.ino()),
            b,
            "blocks across evict after falloc keep"
        );
        check_read(&f, &m, "after falloc keep");
        f.set_len(4 * PAGE).unwrap();
        m.resize(4 * PAGE as usize, 0);
        check_read(&f, &m, "extended");
        f.write_at(b"xy", 5 * PAGE + 10).unwrap();
        m.resize(5 * PAGE as usize + 12, 0);
        m[5 * PAGE as usize + 10..].copy_from_slice(b"xy");
        check_read(&f, &m, "written past");
        checkpoint_evict(store, fs);
        check_read(&f, &m, "evicted again");
        (m, blocks(fs, f.ino()))
    });
    fsck_clean(&disk, "falloc");
    with_store(&disk, |fs, _, c| {
        let f = c.open("/k", &rw()).unwrap();
        check_read(&f, &m, "reopen");
        assert_eq!(blocks(fs, f.ino()), b, "blocks after reopen");
    });
}

/// A file with evicted pages, open, is renamed and then unlinked; reads and partial writes
/// through the handle still see its bytes, across more checkpoints/evictions; after close and
/// reopen the name is gone and fsck is clean; statfs bfree returns to what it was.
#[test]
fn unlink_rename_open_evicted() {
    let disk = SimDisk::new();
    let free0 = with_store(&disk, |fs, store, c| {
        let free0 = fs.statfs().bfree;
        let f = c.open("/u", &rwc()).unwrap();
        let mut m = pattern(9, (4 * PAGE + 7) as usize);
        f.write_at(&m, 0).unwrap();
        checkpoint_evict(store, fs);
        c.rename("/u", "/v").unwrap();
        checkpoint_evict(store, fs);
        check_read(&f, &m, "after rename");
        c.remove_file("/v").unwrap();
        check_read(&f, &m, "after unlink");
        checkpoint_evict(store, fs);
        check_read(&f, &m, "after unlink+checkpoint+evict");
        f.write_at(b"hello", PAGE + 3).unwrap();
        m[PAGE as usize + 3..PAGE as usize + 8].copy_from_slice(b"hello");
        punch(fs, &f, 2 * PAGE + 100, 300);
        m[2 * PAGE as usize + 100..2 * PAGE as usize + 400].fill(0);
        checkpoint_evict(store, fs);
        check_read(&f, &m, "orphan after writes");
        drop(f);
        checkpoint_evict(store, fs);
        assert_eq!(fs.statfs().bfree, free0, "bfree after orphan released");
        free0
    });
    fsck_clean(&disk, "unlink");
    with_store(&disk, |fs, _, c| {
        assert!(fs.statfs().bfree == free0, "bfree after reopen");
        assert!(c.metadata("/u").is_err() && c.metadata("/v").is_err());
    });
}

/// Delete a file whose pages were evicted, then create files until its inode number comes
/// back; the new file must never show the old bytes (extended by set_len, by a sparse write,
/// by fallocate), live, after checkpoint+evict and after reopen.
#[test]
fn ino_reuse_never_shows_old_bytes() {
    let disk = SimDisk::new();
    with_store(&disk, |fs, store, c| {
        let mut reused = 0;
        for round in 0..4u64 {
            let f = c.open("/old", &rwc()).unwrap();
            let old = f.ino();
            f.write_at(&vec![0xAB; 5 * PAGE as usize], 0).unwrap();
            checkpoint_evict(store, fs);
            drop(f);
            c.remove_file("/old").unwrap();
            if round % 2 == 1 {
                checkpoint_evict(store, fs);
            }
            let mut made = Vec::new();
            for n in 0..200 {
                let name = format!("/n{round}_{n}");
                let g = c.open(&name, &rwc()).unwrap();
                let hit = g.ino() == old;
                made.push(name.clone());
                if hit {
                    reused += 1;
                    match round % 3 {
                        0 => g.set_len(5 * PAGE).unwrap(),
                        1 => {
                            g.write_at(b"q", 5 * PAGE - 1).unwrap();
                        }
                        _ => fs
                            .fallocate(&Ctx::root(), g.handle(), 0, 0, 5 * PAGE)
                            .unwrap(),
                    }
                    let mut m = vec![0u8; 5 * PAGE as usize];
                    if round % 3 == 1 {
                        m[5 * PAGE as usize - 1] = b'q';
                    }
                    check_read(&g, &m, &format!("round {round} reused ino live"));
                    g.write_at(b"p", PAGE + 1).unwrap();
                    m[PAGE as usize + 1] = b'p';
                    check_read(&g, &m, &format!("round {round} partial write"));
                    checkpoint_evict(store, fs);
                    check_read(&g, &m, &format!("round {round} after evict"));
                    break;
                }
            }
            for n in made {
                c.remove_file(&n).unwrap();
            }
        }
        eprintln!("inode numbers reused in {reused} of 4 rounds");
    });
    fsck_clean(&disk, "ino reuse");
    let (fs, store) = open_fs(&disk);
    drop(fs);
    store.close().unwrap();
}

/// Crash images taken right after an eviction (and after faulting changes on evicted pages
/// followed by fsync) recover to the model at the last fsync/checkpoint and pass fsck.
#[test]
fn crash_after_evict() {
    for seed in seed::seeds("pages out of memory", seed::counting(2000, 4)) {
        let disk = SimDisk::new();
        let images = with_store(&disk, |fs, store, c| {
            let mut rng = StdRng::seed_from_u64(seed);
            let f = c.open("/c", &rwc()).unwrap();
            let mut m = Vec::new();
            let mut images = Vec::new();
            for step in 0..12 {
                for _ in 0..rng.random_range(1..5) {
                    random_op(fs, &f, &mut m, &mut rng);
                }
                if step % 2 == 0 {
                    checkpoint_evict(store, fs);
                } else {
                    f.sync_all().unwrap();
                    checkpoint_evict(store, fs);
                    // a faulting change, synced
                    let off = rng.random_range(0..4 * PAGE);
                    punch(fs, &f, off, 100);
                    model_punch(&mut m, off, 100);
                    f.sync_all().unwrap();
                }
                images.push((disk.crash(Unflushed::Lost), m.clone(), step));
            }
            images
        });
        for (img, model, step) in images {
            let what = format!("seed {seed} image after step {step}");
            reopened_reads(&img, "/c", &model, &what);
            fsck_clean(&img, &what);
        }
    }
}

/// Threads change, recreate (unlink + create, so inode numbers come back) and read the same
/// files while another thread checkpoints and evicts in a loop; now and then the main thread
/// takes every file's lock, fsyncs them all and takes a crash image: each image must recover
/// to exactly the models of that moment, with fsck clean. Also checks that evictions happened
/// (pages_out) and that reads of freshly recreated files never show old bytes.
#[test]
fn concurrent_recreate_crash_images() {
    for seed in seed::seeds("pages out of memory", seed::counting(3000, 4)) {
        eprintln!("seed {seed}");
        let disk = SimDisk::new();
        let (fs, store) = open_fs(&disk);
        let c = Client::root(fs.clone());
        const FILES: usize = 4;
        let slots: Vec<Mutex<(lanefs::File<'_>, Vec<u8>)>> = (0..FILES)
            .map(|i| Mutex::new((c.open(format!("/f{i}"), &rwc()).unwrap(), Vec::new())))
            .collect();
        let stop = AtomicBool::new(false);
        let mut images = Vec::new();
        let mut max_out = 0;
        std::thread::scope(|s| {
            spawn_checkpointer(s, &store, fs.clone(), &stop, None);
            let mut hs = Vec::new();
            for t in 0..3u64 {
                let fs = fs.clone();
                let slots = &slots;
                let c = &c;
                hs.push(s.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(seed * 131 + t);
                    for op in 0..1500 {
                        let i = rng.random_range(0..FILES);
                        let mut g = slots[i].lock().unwrap();
                        let (f, m) = &mut *g;
                        let what = if rng.random_range(0..12) == 0 {
                            c.remove_file(format!("/f{i}")).unwrap();
                            *f = c.open(format!("/f{i}"), &rwc()).unwrap();
                            m.clear();
                            let n = rng.random_range(0..4 * PAGE);
                            let kind = rng.random_range(0..3);
                            m.resize(n as usize, 0);
                            if kind == 1 && n > 0 {
                                m[n as usize - 1] = b'w';
                            }
                            match kind {
                                0 => f.set_len(n).unwrap(),
                                1 => {
                                    if n > 0 {
                                        f.write_at(b"w", n - 1).unwrap();
                                    }
                                }
                                _ => {
                                    if n > 0 {
                                        fs.fallocate(&Ctx::root(), f.handle(), 0, 0, n).unwrap()
                                    }
                                }
                            }
                            format!("recreate {n}")
                        } else {
                            random_op(&fs, f, m, &mut rng)
                        };
                        let got = read_all(f, m.len());
                        if got != *m {
                            panic!(
                                "seed {seed} t{t} op {op} f{i} {what}: {}",
                                first_diff(&got, m)
                            );
                        }
                    }
                }));
            }
            let mut rng = StdRng::seed_from_u64(seed);
            while !hs.iter().all(|h| h.is_finished()) {
                std::thread::sleep(Duration::from_millis(rng.random_range(1..4)));
                let gs: Vec<_> = slots.iter().map(|s| s.lock().unwrap()).collect();
                for g in &gs {
                    g.0.sync_all().unwrap();
                }
                if rng.random_range(0..2) == 0 {
                    checkpoint_evict(&store, &fs);
                }
                max_out = max_out.max(fs.pages_out());
                let img = disk.crash(Unflushed::Lost);
                images.push((img, gs.iter().map(|g| g.1.clone()).collect::<Vec<_>>()));
                max_out = max_out.max(fs.pages_out());
            }
            stop.store(true, SeqCst);
            for h in hs {
                if let Err(e) = h.join() {
                    std::panic::resume_unwind(e);
                }
            }
        });
        eprintln!(
            "seed {seed}: {} images, max pages_out {max_out}",
            images.len()
        );
        drop(slots);
        drop(c);
        close(fs, store);
        for (k, (img, models)) in images.into_iter().enumerate() {
            let what = format!("seed {seed} image {k}");
            for (i, m) in models.iter().enumerate() {
                reopened_reads(&img, &format!("/f{i}"), m, &format!("{what} f{i}"));
            }
            fsck_clean(&img, &what);
        }
    }
}

/// With `cache_bytes: Some(0)` and no explicit evict, the automatic pass sends pages out on
/// reads/writes after a checkpoint; contents stay right, st_blocks and statfs do not move.
#[test]
fn automatic_eviction_keeps_contents_and_accounting() {
    let disk = SimDisk::new();
    let (fs, store) = open_fs(&disk);
    let c = Client::root(fs.clone());
    let mut models = Vec::new();
    for i in 0..8u64 {
        let m = pattern(i, (i * 3000 + 5000) as usize);
        c.write(format!("/a{i}"), &m).unwrap();
        models.push(m);
    }
    let blocks0: Vec<u64> = (0..8)
        .map(|i| c.metadata(format!("/a{i}")).unwrap().attr.blocks)
        .collect();
    let free0 = fs.statfs().bfree;
    store.checkpoint().unwrap();
    for (i, m) in models.iter().enumerate() {
        check_eq(&c.read(format!("/a{i}")).unwrap(), m, &format!("a{i}"));
    }
    let _ = c.read("/a0").unwrap();
    assert!(fs.pages_out() > 0, "automatic pass evicted nothing");
    let blocks1: Vec<u64> = (0..8)
        .map(|i| c.metadata(format!("/a{i}")).unwrap().attr.blocks)
        .collect();
    assert_eq!(blocks0, blocks1);
    assert_eq!(fs.statfs().bfree, free0);
    // partial overwrite of an evicted page, truncate into one, punch one
    let f = c.open("/a3", &rw()).unwrap();
    f.write_at(b"abc", 4097).unwrap();
    models[3][4097..4100].copy_from_slice(b"abc");
    f.set_len(10000).unwrap();
    models[3].truncate(10000);
    punch(&fs, &f, 100, 200);
    models[3][100..300].fill(0);
    f.set_len(20000).unwrap();
    models[3].resize(20000, 0);
    check_eq(&read_all(&f, 20000), &models[3], "a3 after changes");
    drop(f);
    drop(c);
    close(fs, store);
    fsck_clean(&disk, "auto");
    with_store(&disk, |fs, _, c| {
        assert!(fs.pages_out() > 0, "open loads no page");
        for (i, m) in models.iter().enumerate() {
            check_eq(
                &c.read(format!("/a{i}")).unwrap(),
                m,
                &format!("reopen a{i}"),
            );
        }
    });
}

/// Readers without any lock read a region of a file nobody changes, while a writer rewrites,
/// truncates and punches other pages of the same file (beyond the stable region) and another
/// thread checkpoints and evicts in a loop: the stable region always reads the same.
#[test]
fn unlocked_readers_race_eviction() {
    for seed in seed::seeds("pages out of memory", seed::counting(4000, 3)) {
        let disk = SimDisk::new();
        with_store(&disk, |fs, store, c| {
            let stable = pattern(seed, (8 * PAGE) as usize);
            let f = c.open("/r", &rwc()).unwrap();
            f.write_at(&stable, 0).unwrap();
            let stop = AtomicBool::new(false);
            std::thread::scope(|s| {
                spawn_checkpointer(s, store, fs.clone(), &stop, None);
                let f = &f;
                let fs3 = fs.clone();
                let stop3 = &stop;
                s.spawn(move || {
                    let mut rng = StdRng::seed_from_u64(seed);
                    while !stop3.load(SeqCst) {
                        let off = 8 * PAGE + rng.random_range(0..4 * PAGE);
                        match rng.random_range(0..3) {
                            0 => {
                                f.write_at(&pattern(rng.random(), 5000), off).unwrap();
                            }
                            1 => f.set_len(off).unwrap(),
                            _ => punch(&fs3, f, off, 3000),
                        }
                    }
                });
                let mut hs = Vec::new();
                for t in 0..2u64 {
                    let stable = &stable;
                    hs.push(s.spawn(move || {
                        let mut rng = StdRng::seed_from_u64(seed ^ t);
                        for _ in 0..3000 {
                            let off = rng.random_range(0..8 * PAGE);
                            let len = rng.random_range(1..=(8 * PAGE - off).min(3 * PAGE)) as usize;
                            let mut b = vec![0u8; len];
                            let n = f.read_at(&mut b, off).unwrap();
                            assert_eq!(n, len);
                            check_eq(
                                &b,
                                &stable[off as usize..off as usize + len],
                                &format!("seed {seed} read {off}+{len}"),
                            );
                        }
                    }));
                }
                join_stopping(hs, &stop);
            });
        });
        fsck_clean(&disk, "readers");
    }
}

/// SEEK_DATA / SEEK_HOLE answers at every page boundary (and inside pages) are the same
/// before and after an eviction, and after reopen.
#[test]
fn seek_data_hole_across_eviction() {
    let disk = SimDisk::new();
    let (fs, store) = open_fs(&disk);
    let c = Client::root(fs.clone());
    let f = c.open("/s", &rwc()).unwrap();
    f.write_at(&[1u8; 100], PAGE + 5).unwrap();
    f.write_at(&[2u8; 100], 4 * PAGE).unwrap();
    f.write_at(&[3u8; 10], 7 * PAGE + 1).unwrap();
    punch(&fs, &f, 4 * PAGE, PAGE);
    fs.fallocate(
        &Ctx::root(),
        f.handle(),
        FALLOC_FL_KEEP_SIZE,
        9 * PAGE,
        PAGE,
    )
    .unwrap();
    let ino = f.ino();
    let probe = |fs: &Filesystem| -> Vec<(u64, i32, Option<u64>)> {
        let mut v = Vec::new();
        for off in (0..9 * PAGE).step_by(1024) {
            for w in [libc::SEEK_DATA, libc::SEEK_HOLE] {
                v.push((off, w, fs.seek_data_hole(ino, off, w).ok()));
            }
        }
        v
    };
    let before = probe(&fs);
    let b = blocks(&fs, ino);
    store.checkpoint().unwrap();
    assert!(fs.evict() > 0);
    assert_eq!(probe(&fs), before, "seek answers changed across evict");
    assert_eq!(blocks(&fs, ino), b, "blocks changed across evict");
    drop(f);
    drop(c);
    close(fs, store);
    let (fs, store) = open_fs(&disk);
    assert_eq!(probe(&fs), before, "seek answers changed across reopen");
    assert_eq!(blocks(&fs, ino), b, "blocks changed across reopen");
    drop(fs);
    store.close().unwrap();
}

/// Changes made to evicted pages after a checkpoint (partial writes, truncations into a page
/// followed by extension, punches) and fsynced but never checkpointed: the crash image
/// replays the journal on top of pages that only the checkpoint holds, and must equal the
/// model; also with every unflushed write surviving (process crash).
#[test]
fn journal_replay_onto_kept_pages() {
    for seed in seed::seeds("pages out of memory", seed::counting(5000, 6)) {
        let disk = SimDisk::new();
        let (m, log, imgs) = with_store(&disk, |fs, store, c| {
            let mut rng = StdRng::seed_from_u64(seed);
            let f = c.open("/j", &rwc()).unwrap();
            let mut m = pattern(seed, (6 * PAGE + 123) as usize);
            f.write_at(&m, 0).unwrap();
            checkpoint_evict(store, fs);
            let mut log = Vec::new();
            for _ in 0..rng.random_range(1..8) {
                log.push(random_op(fs, &f, &mut m, &mut rng));
                if rng.random_range(0..3) == 0 {
                    // evicting again must not drop the unchecked-in changes
                    fs.evict();
                }
            }
            f.sync_all().unwrap();
            let imgs = [
                disk.crash(Unflushed::Lost),
                disk.crash(Unflushed::Kept),
                disk.crash(Unflushed::Torn(seed)),
            ];
            check_read(&f, &m, &format!("seed {seed} live {log:?}"));
            (m, log, imgs)
        });
        for (k, img) in imgs.iter().enumerate() {
            let what = format!("seed {seed} image {k} after {log:?}");
            with_store(img, |fs, store, c| {
                let f = c.open("/j", &rw()).unwrap();
                check_read(&f, &m, &what);
                // and once more evicted after a checkpoint of the recovered store
                checkpoint_evict(store, fs);
                check_read(&f, &m, &format!("{what} re-evicted"));
            });
            fsck_clean(img, &what);
        }
        reopened_reads(&disk, "/j", &m, &format!("seed {seed} clean reopen"));
    }
}

/// A file whose pages only the checkpoint holds is deleted; a new file gets its inode number
/// and is extended (no checkpoint in between); a crash image (and a clean reopen) must show
/// the new file as zeros, never the old pages, also after a checkpoint of the recovered
/// store and an eviction; also checks open loads no page and resident/out counts.
#[test]
fn ino_reuse_across_crash_and_reopen() {
    for round in 0..6u64 {
        let disk = SimDisk::new();
        let (fs, store) = open_fs(&disk);
        let c = Client::root(fs.clone());
        let f = c.open("/old", &rwc()).unwrap();
        let old = f.ino();
        f.write_at(&vec![0xCD; 6 * PAGE as usize], 0).unwrap();
        checkpoint_evict(&store, &fs);
        drop(f);
        c.remove_file("/old").unwrap();
        let mut names = Vec::new();
        let mut found = None;
        for n in 0..300 {
            let name = format!("/n{n}");
            let g = c.open(&name, &rwc()).unwrap();
            if g.ino() == old {
                found = Some(name);
                break;
            }
            names.push(name);
        }
        let name = found.expect("inode number reused");
        let g = c.open(&name, &rw()).unwrap();
        let mut m = vec![0u8; 6 * PAGE as usize];
        match round % 3 {
            0 => g.set_len(6 * PAGE).unwrap(),
            1 => {
                g.write_at(b"e", 6 * PAGE - 1).unwrap();
                m[6 * PAGE as usize - 1] = b'e';
            }
            _ => fs
                .fallocate(&Ctx::root(), g.handle(), 0, 0, 6 * PAGE)
                .unwrap(),
        }
        g.write_at(b"mid", 2 * PAGE + 10).unwrap();
        m[2 * PAGE as usize + 10..2 * PAGE as usize + 13].copy_from_slice(b"mid");
        if round >= 3 {
            for n in &names {
                c.remove_file(n).unwrap();
            }
        }
        g.sync_all().unwrap();
        let img = disk.crash(Unflushed::Lost);
        check_read(&g, &m, &format!("round {round} live"));
        drop(g);
        drop(c);
        close(fs, store);
        for (k, d) in [img, disk.clone()].iter().enumerate() {
            let what = format!(
                "round {round} {}",
                if k == 0 {
                    "crash image"
                } else {
                    "clean reopen"
                }
            );
            with_store(d, |fs, store, c| {
                let g = c.open(&name, &rw()).unwrap();
                check_read(&g, &m, &what);
                checkpoint_evict(store, fs);
                check_read(&g, &m, &format!("{what} checkpointed+evicted"));
            });
            fsck_clean(d, &what);
            reopened_reads(d, &name, &m, &format!("{what} second reopen"));
        }
    }
}

/// Evicted pages dropped by a truncation or punched out whole, then checkpointed (or only
/// journaled, then crash), then the store reopened: no stale page may come back from the
/// checkpoint (extending the file after reopen reads zeros; st_blocks and statfs match).
#[test]
fn dropped_kept_pages_do_not_return_after_reopen() {
    for variant in 0..8u32 {
        let disk = SimDisk::new();
        let (mut m, b, free, img) = with_store(&disk, |fs, store, c| {
            let f = c.open("/t", &rwc()).unwrap();
            let mut m = vec![0x77u8; 6 * PAGE as usize];
            f.write_at(&m, 0).unwrap();
            checkpoint_evict(store, fs);
            if variant & 1 == 0 {
                f.set_len(PAGE / 2).unwrap();
                m.truncate(PAGE as usize / 2);
            } else {
                punch(fs, &f, 100, 5 * PAGE);
                m[100..100 + 5 * PAGE as usize].fill(0);
            }
            if variant & 2 == 0 {
                checkpoint_evict(store, fs);
            }
            f.sync_all().unwrap();
            let b = blocks(fs, f.ino());
            let free = fs.statfs().bfree;
            (m, b, free, disk.crash(Unflushed::Lost))
        });
        let d = if variant & 4 == 0 { disk.clone() } else { img };
        let what = format!("variant {variant}");
        with_store(&d, |fs, store, c| {
            let f = c.open("/t", &rw()).unwrap();
            assert_eq!(blocks(fs, f.ino()), b, "{what}: st_blocks after reopen");
            assert_eq!(fs.statfs().bfree, free, "{what}: bfree after reopen");
            f.set_len(6 * PAGE).unwrap();
            m.resize(6 * PAGE as usize, 0);
            check_read(&f, &m, &format!("{what} extended after reopen"));
            checkpoint_evict(store, fs);
            check_read(&f, &m, &format!("{what} extended, evicted"));
        });
        fsck_clean(&d, &what);
    }
}

/// With a size limit of 16 pages, a full filesystem whose pages are evicted: partial writes
/// into evicted pages need no new space (no ENOSPC), a write past the limit is refused, a
/// rename over a file with evicted pages frees them, an O_TMPFILE file with evicted pages
/// linked in survives a crash; statfs equal before/after evict and after reopen.
#[test]
fn size_limit_with_evicted_pages() {
    let disk = SimDisk::new();
    let mut cf = cfg();
    cf.max_bytes = Some(16 * PAGE);
    let o = open(Path::new(STORE), cf.clone(), opts(&disk, 64 << 10, COMMIT)).unwrap();
    let (fs, store) = (Arc::new(o.fs), o.store);
    let c = Client::root(fs.clone());
    let mut a = pattern(1, 10 * PAGE as usize);
    let b = pattern(2, 6 * PAGE as usize);
    c.write("/a", &a).unwrap();
    c.write("/b", &b).unwrap();
    let st = fs.statfs();
    assert_eq!(st.bfree, 0, "full");
    store.checkpoint().unwrap();
    assert!(fs.evict() > 0);
    assert_eq!(fs.statfs().bfree, st.bfree, "bfree across evict");
    let f = c.open("/a", &rw()).unwrap();
    f.write_at(b"partial", 3 * PAGE + 11)
        .expect("partial write into an evicted page of a full fs");
    a[3 * PAGE as usize + 11..3 * PAGE as usize + 18].copy_from_slice(b"partial");
    assert!(f.write_at(b"x", 20 * PAGE).is_err(), "write past the limit");
    check_read(&f, &a, "a");
    f.set_len(6 * PAGE).unwrap();
    a.truncate(6 * PAGE as usize);
    assert_eq!(fs.statfs().bfree, 4, "truncate of evicted pages frees them");
    drop(f);
    // rename over /b (evicted) frees its 6 pages
    let t = c.open_tmpfile("/", &rw()).unwrap();
    let tdata = pattern(3, 4 * PAGE as usize);
    t.write_at(&tdata, 0).unwrap();
    checkpoint_evict(&store, &fs);
    check_read(&t, &tdata, "tmpfile evicted");
    c.link_file(&t, "/tl").unwrap();
    c.rename("/tl", "/b").unwrap();
    drop(t);
    let free = fs.statfs().bfree;
    assert_eq!(free, 6, "6 pages freed by the rename");
    c.write("/c", [9u8; 2 * PAGE as usize])
        .expect("freed space is usable");
    let cdata = vec![9u8; 2 * PAGE as usize];
    let sync = c.open("/c", &rw()).unwrap();
    sync.sync_all().unwrap();
    drop(sync);
    checkpoint_evict(&store, &fs);
    let img = disk.crash(Unflushed::Lost);
    drop(c);
    close(fs, store);
    for d in [disk.clone(), img] {
        let o = open(Path::new(STORE), cf.clone(), opts(&d, 64 << 10, COMMIT)).unwrap();
        let (fs, store) = (Arc::new(o.fs), o.store);
        assert_eq!(fs.statfs().bfree, 4, "bfree after reopen");
        let c = Client::root(fs.clone());
        check_eq(&c.read("/a").unwrap(), &a, "a reopen");
        check_eq(&c.read("/b").unwrap(), &tdata, "b reopen");
        check_eq(&c.read("/c").unwrap(), &cdata, "c reopen");
        drop(c);
        close(fs, store);
        fsck_clean(&d, "size limit");
    }
}

/// The same model check on a store in a real directory (the real disk backend under redb):
/// random ops with checkpoints and evictions in between, reads compared to the model, then
/// close, fsck and reopen.
#[test]
fn real_dir_random_ops_vs_model() {
    for seed in seed::seeds("pages out of memory", seed::counting(6000, 1)) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("s");
        let o = open(&dir, cfg(), Options::default()).unwrap();
        let (fs, store) = (Arc::new(o.fs), o.store);
        let c = Client::root(fs.clone());
        let mut rng = StdRng::seed_from_u64(seed);
        let files: Vec<_> = (0..3)
            .map(|i| c.open(format!("/f{i}"), &rwc()).unwrap())
            .collect();
        let mut models = vec![Vec::new(); 3];
        for op in 0..400 {
            let i = rng.random_range(0..3);
            let what = random_op(&fs, &files[i], &mut models[i], &mut rng);
            if op % 20 == 0 {
                checkpoint_evict(&store, &fs);
            }
            check_read(
                &files[i],
                &models[i],
                &format!("seed {seed} op {op} {what}"),
            );
        }
        drop(files);
        drop(c);
        close(fs, store);
        lanefs_store::fsck::check(&dir, &Options::default()).expect("fsck");
        let o = open(&dir, cfg(), Options::default()).unwrap();
        let (fs, store) = (Arc::new(o.fs), o.store);
        let c = Client::root(fs.clone());
        for (i, m) in models.iter().enumerate() {
            check_eq(
                &c.read(format!("/f{i}")).unwrap(),
                m,
                &format!("seed {seed} reopen f{i}"),
            );
        }
        drop(c);
        close(fs, store);
    }
}
