//! File data out of memory: pages a checkpoint holds leave memory (engine `data.rs`, "Pages
//! the store keeps"; `fs/cache.rs`) and are read back from the checkpoint. Every read is
//! checked against a model while checkpoints and eviction passes race the writers, partial
//! changes of pages that are out of memory (writes, truncations, punched holes) keep the
//! rest of the page, and memory holds the cache budget, not the data.

#[path = "../../engine/tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::time::Duration;

use common::dump;
use lanefs::{
    Client, Config, Ctx, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, Filesystem, OpenOptions, PAGE,
};
use lanefs_store::{Options, fsck, open};
use rand::{Rng, SeedableRng, rngs::StdRng};

fn seed() -> u64 {
    std::env::var("LANEFS_SEED")
        .ok()
        .map(|s| s.parse().unwrap())
        .unwrap_or_else(rand::random)
}

/// A filesystem that keeps nothing in memory beyond what changed since the last checkpoint.
fn no_cache() -> Config {
    Config {
        cache_bytes: Some(0),
        ..Config::default()
    }
}

fn opts() -> Options {
    Options {
        segment_size: 1 << 20,
        commit_interval: Duration::from_millis(5),
        // Checkpoints come from the test's own thread, as often as it can.
        checkpoint_records: u64::MAX,
        checkpoint_segments: usize::MAX,
        ..Options::default()
    }
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
            let end = (off + len) as usize;
            if model.len() < end {
                model.resize(end, 0);
            }
            model[off as usize..end].fill(b);
        }
        4 => {
            let size = rng.random_range(0..limit);
            f.set_len(size).unwrap();
            model.resize(size as usize, 0);
        }
        5 => {
            let mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
            fs.fallocate(&ctx, f.handle(), mode, off, len).unwrap();
            let end = ((off + len) as usize).min(model.len());
            if (off as usize) < end {
                model[off as usize..end].fill(0);
            }
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
    let seed = seed();
    eprintln!("seed {seed}");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let opts = opts();
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
    let fs = Arc::try_unwrap(fs).unwrap_or_else(|_| panic!("no other reference"));
    drop(fs);
    Arc::try_unwrap(store)
        .unwrap_or_else(|_| panic!("no other reference"))
        .close()
        .unwrap();
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
    let o = open(dir.path(), cfg.clone(), opts()).unwrap();
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
    drop(Arc::try_unwrap(fs).unwrap_or_else(|_| panic!("no other reference")));
    o.store.close().unwrap();
    let r = open(dir.path(), cfg, opts()).unwrap();
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
    let o = open(dir.path(), Config::default(), opts()).unwrap();
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
            ..opts()
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
    let seed = seed();
    eprintln!("seed {seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let o = open(dir.path(), no_cache(), opts()).unwrap();
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
                let end = ((off + len) as usize).min(model.len());
                if (off as usize) < end {
                    model[off as usize..end].fill(0);
                }
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
                    let end = ((off + len) as usize).min(model.len());
                    if (off as usize) < end {
                        model[off as usize..end].fill(0);
                    }
                    format!("punch {off}+{len}")
                }
                _ => {
                    let (off, len) = (near(&mut rng), rng.random_range(1..2 * G));
                    let b = rng.random::<u8>() | 1;
                    f.write_at(&vec![b; len as usize], off).unwrap();
                    let end = (off + len) as usize;
                    if model.len() < end {
                        model.resize(end, 0);
                    }
                    model[off as usize..end].fill(b);
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
    drop(Arc::try_unwrap(fs).unwrap_or_else(|_| panic!("no other reference")));
    o.store.close().unwrap();
    let r = open(dir.path(), no_cache(), opts()).unwrap();
    let c = Client::root(Arc::new(r.fs));
    assert!(c.read("/f").unwrap() == model, "seed {seed}: after reopen");
    assert_eq!(
        c.metadata("/f").unwrap().attr.blocks,
        blocks,
        "pages that exist, after reopen"
    );
}
