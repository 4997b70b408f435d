//! Attack on the checkpoint's chunks of fifteen pages (docs/STORE.md, "Checkpoints", table
//! `data`): writers change large files at chunk edges (writes, truncations, punched holes,
//! allocations inside and past EOF, removal and re-creation reusing inode numbers) while a
//! thread takes checkpoints and sends pages out of memory; every read is checked against a
//! model, then each file's bytes and `blocks` are compared after a reopen.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::time::Duration;

use common::{
    assert_same_tree, close_unshared, dump, host_opts, model_allocate, model_punch, model_write,
    no_cache, on_demand, rwc, seed,
};
use lanefs::{
    Client, Config, Ctx, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, Filesystem, OpenOptions, PAGE,
};
use lanefs_store::{Options, StoreHandle, fsck, open};
use rand::{Rng, SeedableRng, rngs::StdRng};

const G: u64 = 15 * PAGE;
const CHUNKS: u64 = 20;

/// A store on the host whose checkpoints the test takes.
fn opts() -> Options {
    on_demand(host_opts(1 << 20, Duration::from_millis(5)))
}

/// A store in `dir` ([`opts`], no cache): its filesystem and handle.
fn open_in(dir: &Path) -> (Arc<Filesystem>, StoreHandle) {
    let o = open(dir, no_cache(), opts()).unwrap();
    (Arc::new(o.fs), o.store)
}

/// Everything into the checkpoint and out of memory.
fn checkpoint_all(store: &StoreHandle, fs: &Filesystem) {
    store.checkpoint().unwrap();
    fs.evict();
    assert_eq!(fs.resident_pages(), 0);
}

/// Closes the store in `dir` (its client first) and checks it (fsck).
fn close_and_check(dir: &Path, c: Client, fs: Arc<Filesystem>, store: StoreHandle) {
    drop(c);
    close_unshared(fs, store);
    fsck::check(dir, &opts()).unwrap();
}

/// An offset at, just before or just after a chunk edge (by a page or a byte), or inside one.
fn near(rng: &mut StdRng) -> u64 {
    let g = rng.random_range(0..=CHUNKS) * G;
    match rng.random_range(0..9) {
        0 => g,
        1 => g.saturating_sub(PAGE),
        2 => g + PAGE,
        3 => g.saturating_sub(1),
        4 => g + 1,
        5 => g + 14 * PAGE,
        6 => g.saturating_sub(PAGE) + rng.random_range(0..PAGE),
        7 => g + rng.random_range(0..PAGE) * PAGE,
        _ => g + rng.random_range(0..G),
    }
}

fn length(rng: &mut StdRng) -> u64 {
    match rng.random_range(0..10) {
        0 => 1,
        1 => PAGE,
        2 => G,
        3 => G - PAGE,
        4 => G + PAGE,
        5 => 2 * G,
        6 => PAGE - 1,
        7 => PAGE + 1,
        8 => G + 1,
        _ => rng.random_range(1..3 * G),
    }
}

fn check_read(f: &lanefs::File<'_>, model: &[u8], off: u64, len: u64, what: &str) {
    let mut b = vec![0xEE; len as usize];
    let n = f.read_at(&mut b, off).unwrap();
    let want = model.get(off as usize..).unwrap_or(&[]);
    let want = &want[..want.len().min(len as usize)];
    assert_eq!(n, want.len(), "{what}: read length at {off}+{len}");
    if b[..n] != *want {
        let i = (0..n).find(|&i| b[i] != want[i]).unwrap();
        panic!(
            "{what}: read of {len} at {off} differs from the model at byte {} (page {}, chunk {}): got {:#x}, want {:#x}",
            off + i as u64,
            (off + i as u64) / PAGE,
            (off + i as u64) / G,
            b[i],
            want[i]
        );
    }
}

/// One random change to the file at `path` (its handle `f`, its bytes `model`), or a check.
fn step<'c>(
    c: &'c Client,
    fs: &Filesystem,
    path: &str,
    f: &mut lanefs::File<'c>,
    model: &mut Vec<u8>,
    rng: &mut StdRng,
) {
    let ctx = Ctx::root();
    let off = near(rng);
    let len = length(rng);
    match rng.random_range(0..20) {
        0..=5 => {
            let b = rng.random::<u8>() | 1;
            // Bytes distinct per page so that a page from the wrong place shows.
            let data: Vec<u8> = (0..len)
                .map(|i| b ^ (((off + i) / PAGE) as u8).wrapping_mul(2))
                .collect();
            assert_eq!(f.write_at(&data, off).unwrap(), data.len());
            model_write(model, off, &data);
        }
        6 | 7 => {
            let size = near(rng);
            f.set_len(size).unwrap();
            model.resize(size as usize, 0);
        }
        8..=10 => {
            let mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
            fs.fallocate(&ctx, f.handle(), mode, off, len).unwrap();
            model_punch(model, off, len);
        }
        11 => {
            // Past EOF too: pages beyond the size.
            fs.fallocate(&ctx, f.handle(), FALLOC_FL_KEEP_SIZE, off, len)
                .unwrap();
        }
        12 => {
            fs.fallocate(&ctx, f.handle(), 0, off, len).unwrap();
            model_allocate(model, off, len);
        }
        13 => {
            // Removed and created again (the inode number may be reused), sometimes with the
            // old one kept open and written as an orphan first.
            let orphan = rng.random_bool(0.5);
            if orphan {
                c.remove_file(path).unwrap();
                let data = vec![0x5A; (2 * G) as usize];
                f.write_at(&data, off).unwrap();
                let mut b = vec![0; data.len()];
                assert_eq!(f.read_at(&mut b, off).unwrap(), data.len());
                assert!(b == data, "{path}: orphan reads back");
                *f = c.open(path, &rwc()).unwrap();
            } else {
                let old = std::mem::replace(f, c.open(format!("{path}.tmp"), &rwc()).unwrap());
                drop(old);
                c.remove_file(path).unwrap();
                drop(std::mem::replace(f, c.open(path, &rwc()).unwrap()));
                c.remove_file(format!("{path}.tmp")).unwrap();
            }
            model.clear();
            // A sparse start: a few pages at chunk edges.
            for _ in 0..rng.random_range(0..4) {
                let at = near(rng);
                let b = [rng.random::<u8>() | 1; 10];
                f.write_at(&b, at).unwrap();
                model_write(model, at, &b);
            }
        }
        14 => {
            let got = c.read(path).unwrap();
            assert_eq!(got.len(), model.len(), "{path}: size");
            if got != *model {
                let i = (0..got.len()).find(|&i| got[i] != model[i]).unwrap();
                panic!(
                    "{path}: whole read differs at byte {i} (page {}, chunk {})",
                    i as u64 / PAGE,
                    i as u64 / G
                );
            }
        }
        _ => check_read(f, model, off, len, path),
    }
}

struct Seen {
    size: u64,
    blocks: u64,
    bytes: Vec<u8>,
}

fn snapshot(c: &Client, paths: &[String]) -> BTreeMap<String, Seen> {
    paths
        .iter()
        .map(|p| {
            let m = c.metadata(p).unwrap();
            let bytes = c.read(p).unwrap();
            (
                p.clone(),
                Seen {
                    size: m.attr.size,
                    blocks: m.attr.blocks,
                    bytes,
                },
            )
        })
        .collect()
}

fn compare(want: &BTreeMap<String, Seen>, got: &BTreeMap<String, Seen>, what: &str, seed: u64) {
    for (p, w) in want {
        let g = &got[p];
        assert_eq!(g.size, w.size, "seed {seed}: {what}: {p} size");
        assert_eq!(
            g.blocks, w.blocks,
            "seed {seed}: {what}: {p} blocks (pages that exist)"
        );
        if g.bytes != w.bytes {
            let i = (0..g.bytes.len())
                .find(|&i| g.bytes[i] != w.bytes[i])
                .unwrap();
            panic!(
                "seed {seed}: {what}: {p} differs at byte {i} (page {}, chunk {})",
                i as u64 / PAGE,
                i as u64 / G
            );
        }
    }
}

/// Writers on their own files racing a checkpointer; returns the models by path.
fn race(
    fs: &Arc<Filesystem>,
    store: &Arc<StoreHandle>,
    seed: u64,
    models: BTreeMap<String, Vec<u8>>,
    threads: u64,
    ops: u64,
) -> BTreeMap<String, Vec<u8>> {
    let done = Arc::new(AtomicBool::new(false));
    let checkpoints = Arc::new(AtomicU64::new(0));
    let evicted = Arc::new(AtomicU64::new(0));
    let checkpointer = {
        let (fs, store, done, checkpoints, evicted) = (
            fs.clone(),
            store.clone(),
            done.clone(),
            checkpoints.clone(),
            evicted.clone(),
        );
        let mut rng = StdRng::seed_from_u64(seed ^ 0xC0FFEE);
        std::thread::spawn(move || {
            while !done.load(Relaxed) {
                if rng.random_range(0..4) == 0 {
                    store.checkpoint().unwrap();
                    checkpoints.fetch_add(1, Relaxed);
                }
                evicted.fetch_add(fs.evict(), Relaxed);
                std::thread::sleep(Duration::from_micros(rng.random_range(100..1500)));
            }
        })
    };
    // A reader of everyone's files (contents unchecked: racing the writers), whose reads of
    // pages out of memory must not fail.
    let reader = {
        let (fs, done) = (fs.clone(), done.clone());
        let paths: Vec<String> = models.keys().cloned().collect();
        let mut rng = StdRng::seed_from_u64(seed ^ 0xBEEF);
        std::thread::spawn(move || {
            let c = Client::root(fs.clone());
            let mut reads = 0u64;
            while !done.load(Relaxed) {
                let p = &paths[rng.random_range(0..paths.len())];
                let f = match c.open(p, OpenOptions::new().read(true)) {
                    Ok(f) => f,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => panic!("open {p}: {e}"),
                };
                for _ in 0..4 {
                    let off = near(&mut rng);
                    let mut b = vec![0u8; length(&mut rng) as usize];
                    if let Err(e) = f.read_at(&mut b, off) {
                        panic!("seed {seed}: racing read of {p} at {off}: {e}");
                    }
                    reads += 1;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            reads
        })
    };
    let mut by_thread: Vec<BTreeMap<String, Vec<u8>>> = vec![BTreeMap::new(); threads as usize];
    for (p, m) in models {
        let t: usize = p[2..p.find('-').unwrap()].parse().unwrap();
        by_thread[t].insert(p, m);
    }
    let writers: Vec<_> = by_thread
        .into_iter()
        .enumerate()
        .map(|(t, mut models)| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let c = Client::root(fs.clone());
                let mut rng = StdRng::seed_from_u64(seed ^ ((t as u64 + 1) * 0x9E37_79B9));
                let paths: Vec<String> = models.keys().cloned().collect();
                let mut handles: Vec<_> =
                    paths.iter().map(|p| c.open(p, &rwc()).unwrap()).collect();
                for n in 0..ops {
                    let k = rng.random_range(0..paths.len());
                    let m = models.get_mut(&paths[k]).unwrap();
                    step(&c, &fs, &paths[k], &mut handles[k], m, &mut rng);
                    if n % 6 == 0 {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                // Each file read whole once more, out of memory.
                for (k, p) in paths.iter().enumerate() {
                    let m = &models[p];
                    check_read(&handles[k], m, 0, m.len() as u64 + PAGE, p);
                }
                drop(handles);
                models
            })
        })
        .collect();
    let mut out = BTreeMap::new();
    for w in writers {
        out.extend(w.join().unwrap());
    }
    done.store(true, Relaxed);
    checkpointer.join().unwrap();
    let reads = reader.join().unwrap();
    assert!(reads > 0, "the reader read");
    assert!(
        checkpoints.load(Relaxed) > 0,
        "no checkpoint raced the writers"
    );
    eprintln!(
        "{} checkpoints raced the writers, {} pages evicted by the checkpointer",
        checkpoints.load(Relaxed),
        evicted.load(Relaxed)
    );
    out
}

fn check_models(c: &Client, models: &BTreeMap<String, Vec<u8>>, what: &str, seed: u64) {
    for (p, m) in models {
        let got = c.read(p).unwrap();
        assert_eq!(got.len(), m.len(), "seed {seed}: {what}: {p} size");
        if got != *m {
            let i = (0..got.len()).find(|&i| got[i] != m[i]).unwrap();
            panic!(
                "seed {seed}: {what}: {p} differs from the model at byte {i} (page {}, chunk {})",
                i as u64 / PAGE,
                i as u64 / G
            );
        }
    }
}

#[test]
fn chunks_survive_racing_changes_at_their_edges() {
    let seed = seed::seed("chunks_survive_racing_changes_at_their_edges");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let opts = opts();
    let threads = 3u64;
    let files = 2;
    let mut models = BTreeMap::new();
    for t in 0..threads {
        for k in 0..files {
            models.insert(format!("/t{t}-f{k}"), Vec::new());
        }
    }
    let paths: Vec<String> = models.keys().cloned().collect();
    let mut round_dumps = None;
    for round in 0..3 {
        // Round 1 also has the store's own checkpoints (every few hundred records) and a
        // small cache, beside the test's.
        let (cfg, o2) = if round == 1 {
            let cfg = Config {
                cache_bytes: Some(16 * PAGE),
                ..Config::default()
            };
            (
                cfg,
                Options {
                    checkpoint_records: 300,
                    ..opts.clone()
                },
            )
        } else {
            (no_cache(), opts.clone())
        };
        let o = open(dir, cfg, o2).unwrap();
        let fs = Arc::new(o.fs);
        let store = Arc::new(o.store);
        {
            let c = Client::root(fs.clone());
            if round == 0 {
                for p in &paths {
                    c.open(p, &rwc()).unwrap();
                }
            } else {
                let (want, want_dump) = round_dumps.take().unwrap();
                check_models(&c, &models, &format!("reopen {round}"), seed);
                let got = snapshot(&c, &paths);
                compare(&want, &got, &format!("reopen {round}"), seed);
                let what = format!("seed {seed}: reopen {round}");
                assert_same_tree(&what, &want_dump, &dump(&fs, false));
            }
        }
        models = race(&fs, &store, seed ^ round, models, threads, 2500);
        eprintln!("round {round}: pages out {}", fs.pages_out());
        let c = Client::root(fs.clone());
        check_models(&c, &models, &format!("round {round} live"), seed);
        let live = snapshot(&c, &paths);
        // Everything into the checkpoint and out of memory: blocks and bytes unchanged.
        if round != 1 {
            store.checkpoint().unwrap();
            fs.evict();
            assert_eq!(fs.resident_pages(), 0, "every page is in the checkpoint");
            let out = snapshot(&c, &paths);
            compare(
                &live,
                &out,
                &format!("round {round} after checkpoint"),
                seed,
            );
            fs.evict();
        }
        fs.check_invariants().unwrap();
        let want_dump = dump(&fs, false);
        drop(c);
        close_unshared(fs, store);
        let report = fsck::check(dir, &opts).unwrap();
        assert!(report.checkpoint_lsn > 0);
        round_dumps = Some((live, want_dump));
    }
    let (want, want_dump) = round_dumps.unwrap();
    let r = open(dir, no_cache(), opts.clone()).unwrap();
    let fs = Arc::new(r.fs);
    let c = Client::root(fs.clone());
    check_models(&c, &models, "final reopen", seed);
    compare(&want, &snapshot(&c, &paths), "final reopen", seed);
    assert_same_tree(
        &format!("seed {seed}: final reopen"),
        &want_dump,
        &dump(&fs, false),
    );
    // Once more after a checkpoint of the reopened store.
    r.store.checkpoint().unwrap();
    fs.evict();
    compare(&want, &snapshot(&c, &paths), "final checkpoint", seed);
}

/// Deterministic shapes: a file with pages past its size then truncated; holes at every
/// chunk edge; an inode removed and its number reused, within and across checkpoints.
#[test]
fn chunk_edges_deterministic() {
    let seed = seed::seed("chunk_edges_deterministic");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (fs, store) = open_in(dir);
    let c = Client::root(fs.clone());
    let ctx = Ctx::root();
    let punch = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
    let cp = || checkpoint_all(&store, &fs);
    let blocks = |p: &str| c.metadata(p).unwrap().attr.blocks;
    let mut models: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut blockset: BTreeMap<String, u64> = BTreeMap::new();

    // 1: pages past EOF (KEEP_SIZE), then truncations around chunk edges.
    {
        let f = c.open("/beyond", &rwc()).unwrap();
        let mut m: Vec<u8> = (0..(2 * G + 3 * PAGE + 7))
            .map(|i| (i / PAGE) as u8 | 1)
            .collect();
        f.write_at(&m, 0).unwrap();
        fs.fallocate(&ctx, f.handle(), FALLOC_FL_KEEP_SIZE, 0, 5 * G)
            .unwrap();
        assert_eq!(blocks("/beyond"), 5 * 15 * (PAGE / 512));
        cp();
        assert_eq!(
            blocks("/beyond"),
            5 * 15 * (PAGE / 512),
            "past EOF after checkpoint"
        );
        check_read(&f, &m, 0, 6 * G, "/beyond");
        // Pages 0..`exist` exist: a shrink drops those past the new size; a growth adds
        // none and drops none (the pages fallocated past the old end stay, as on tmpfs).
        let mut exist = 5 * 15;
        for size in [4 * G + PAGE, 4 * G, 3 * G - 1, 3 * G + 1, 2 * G + PAGE - 1] {
            let old = m.len() as u64;
            f.set_len(size).unwrap();
            m.resize(size as usize, 0);
            if size < old {
                exist = size.div_ceil(PAGE).min(exist);
            }
            assert_eq!(blocks("/beyond"), exist * (PAGE / 512), "size {size} live");
            cp();
            check_read(&f, &m, 0, 6 * G, "/beyond");
            assert_eq!(blocks("/beyond"), exist * (PAGE / 512), "size {size}");
        }
        // Grow again: zeros past the old size, no pages.
        f.set_len(6 * G).unwrap();
        m.resize((6 * G) as usize, 0);
        cp();
        check_read(&f, &m, 0, 7 * G, "/beyond");
        models.insert("/beyond".into(), m);
        blockset.insert("/beyond".into(), blocks("/beyond"));
    }

    // 2: holes at every chunk edge of a full file.
    {
        let f = c.open("/holes", &rwc()).unwrap();
        let mut m: Vec<u8> = (0..(CHUNKS * G))
            .map(|i| ((i / PAGE) as u8).wrapping_mul(7) ^ (i as u8) | 1)
            .collect();
        f.write_at(&m, 0).unwrap();
        cp();
        let mut holes = 0;
        for g in 1..CHUNKS {
            let e = g * G;
            let (off, len) = match g % 6 {
                0 => (e - PAGE, 2 * PAGE),
                1 => (e, PAGE),
                2 => (e - PAGE, PAGE),
                3 => (e - 1, 2),
                4 => (e - PAGE + 1, 2 * PAGE - 2),
                _ => (e - G, G),
            };
            fs.fallocate(&ctx, f.handle(), punch, off, len).unwrap();
            m[off as usize..(off + len) as usize].fill(0);
            holes += 1;
            if holes % 3 == 0 {
                cp();
            }
            check_read(&f, &m, e.saturating_sub(2 * G), 4 * G, "/holes");
        }
        cp();
        check_read(&f, &m, 0, CHUNKS * G + G, "/holes");
        // Punched a chunk and then re-written a single page in it.
        fs.fallocate(&ctx, f.handle(), punch, 3 * G, 3 * G).unwrap();
        m[(3 * G) as usize..(6 * G) as usize].fill(0);
        f.write_at(&[9; 5], 4 * G + 14 * PAGE).unwrap();
        m[(4 * G + 14 * PAGE) as usize..(4 * G + 14 * PAGE + 5) as usize].fill(9);
        cp();
        check_read(&f, &m, 0, CHUNKS * G + G, "/holes");
        models.insert("/holes".into(), m);
        blockset.insert("/holes".into(), blocks("/holes"));
    }

    // 3: inode reuse, within one checkpoint and across.
    {
        for i in 0..6u64 {
            let p = "/reuse";
            let f = c.open(p, &rwc()).unwrap();
            let big: Vec<u8> = (0..(4 * G)).map(|x| (x / PAGE) as u8 | 0x81).collect();
            f.write_at(&big, 0).unwrap();
            if i % 2 == 0 {
                cp();
            }
            let ino = f.ino();
            drop(f);
            c.remove_file(p).unwrap();
            if i % 3 == 0 {
                cp();
            }
            let f = c.open(p, &rwc()).unwrap();
            eprintln!("reuse {i}: old ino {ino:?}, new {:?}", f.ino());
            // Sparse: one byte at a chunk edge, a size reaching over the old data.
            f.write_at(&[3], 2 * G + PAGE - 1).unwrap();
            f.set_len(5 * G).unwrap();
            let mut m = vec![0u8; (5 * G) as usize];
            m[(2 * G + PAGE - 1) as usize] = 3;
            if i % 2 == 1 {
                cp();
            }
            check_read(&f, &m, 0, 6 * G, "/reuse");
            assert_eq!(blocks(p), PAGE / 512, "reuse {i}: one page exists");
            cp();
            check_read(&f, &m, 0, 6 * G, "/reuse");
            assert_eq!(
                blocks(p),
                PAGE / 512,
                "reuse {i}: one page exists after checkpoint"
            );
            models.insert(p.into(), m);
            blockset.insert(p.into(), blocks(p));
        }
    }

    // 4: a write that spans many chunks, partly out of memory, at odd offsets.
    {
        let f = c.open("/span", &rwc()).unwrap();
        let mut m = Vec::new();
        let mut rng = StdRng::seed_from_u64(seed);
        for _ in 0..40 {
            let off = near(&mut rng);
            let len = length(&mut rng);
            let data = vec![rng.random::<u8>() | 1; len as usize];
            f.write_at(&data, off).unwrap();
            model_write(&mut m, off, &data);
            if rng.random_bool(0.3) {
                cp();
            }
            if rng.random_bool(0.3) {
                let o2 = near(&mut rng);
                let l2 = length(&mut rng);
                fs.fallocate(&ctx, f.handle(), punch, o2, l2).unwrap();
                model_punch(&mut m, o2, l2);
            }
            check_read(&f, &m, 0, m.len() as u64 + G, "/span");
        }
        models.insert("/span".into(), m);
        blockset.insert("/span".into(), blocks("/span"));
    }

    // 5: pages past EOF at close: a file of size 0 with pages over a chunk edge, and one
    // with a short size and whole chunks past it.
    {
        let f = c.open("/past0", &rwc()).unwrap();
        fs.fallocate(
            &ctx,
            f.handle(),
            FALLOC_FL_KEEP_SIZE,
            2 * G - PAGE,
            G + 2 * PAGE,
        )
        .unwrap();
        let f2 = c.open("/past1", &rwc()).unwrap();
        f2.write_at(&[7; 10], G - 5).unwrap();
        fs.fallocate(&ctx, f2.handle(), FALLOC_FL_KEEP_SIZE, 0, 4 * G)
            .unwrap();
        cp();
        let mut m = vec![0u8; (G + 5) as usize];
        m[(G - 5) as usize..].fill(7);
        check_read(&f2, &m, 0, 5 * G, "/past1");
        check_read(&f, &[], 0, 5 * G, "/past0");
        assert_eq!(blocks("/past0"), 17 * (PAGE / 512));
        assert_eq!(blocks("/past1"), 60 * (PAGE / 512));
        models.insert("/past0".into(), Vec::new());
        models.insert("/past1".into(), m);
        blockset.insert("/past0".into(), blocks("/past0"));
        blockset.insert("/past1".into(), blocks("/past1"));
    }

    check_models(&c, &models, "before close", seed);
    let want_dump = dump(&fs, false);
    close_and_check(dir, c, fs, store);
    let r = open(dir, no_cache(), opts()).unwrap();
    let fs = Arc::new(r.fs);
    let c = Client::root(fs.clone());
    check_models(&c, &models, "after reopen", seed);
    for (p, b) in &blockset {
        assert_eq!(
            c.metadata(p).unwrap().attr.blocks,
            *b,
            "{p}: blocks after reopen"
        );
    }
    assert_same_tree(
        &format!("seed {seed}: after reopen"),
        &want_dump,
        &dump(&fs, false),
    );
}

/// Pages at the far end of the largest file (chunk numbers near 2^51), holes punched across
/// everything, truncations that cut between them; read back from the checkpoint and after a
/// reopen.
#[test]
fn chunks_far_out() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (fs, store) = open_in(dir);
    let c = Client::root(fs.clone());
    let ctx = Ctx::root();
    let punch = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
    let cp = || checkpoint_all(&store, &fs);
    let max = lanefs::MAX_FILE_SIZE;
    let f = c.open("/far", &rwc()).unwrap();
    let top = max / PAGE * PAGE; // the start of the last (partial) page
    let spots = [
        3,
        G - 1,
        G,
        top - 2 * G,
        top - G - 1,
        top - G,
        top - PAGE,
        top,
        max - 1,
    ];
    for (i, &at) in spots.iter().enumerate() {
        assert_eq!(f.write_at(&[i as u8 + 1], at).unwrap(), 1, "write at {at}");
    }
    let size = c.metadata("/far").unwrap().attr.size;
    assert_eq!(size, max);
    let blocks0 = c.metadata("/far").unwrap().attr.blocks;
    let readback = |c: &Client, f: &lanefs::File<'_>, live: &[u64], what: &str| {
        for (i, &at) in spots.iter().enumerate() {
            let size = c.metadata("/far").unwrap().attr.size;
            let mut b = [0xEEu8; 3];
            let from = at.saturating_sub(1);
            let n = f.read_at(&mut b, from).unwrap();
            let want_n = (size.saturating_sub(from)).min(3) as usize;
            assert_eq!(n, want_n, "{what}: read length at {from}");
            let v = if live.contains(&at) { i as u8 + 1 } else { 0 };
            if at < size {
                // The byte at `at` may be overwritten by a neighbour spot's byte only if
                // they coincide, which they do not.
                assert_eq!(b[(at - from) as usize], v, "{what}: byte at {at}");
            }
        }
    };
    readback(&c, &f, &spots, "live");
    cp();
    readback(&c, &f, &spots, "from the checkpoint");
    assert_eq!(c.metadata("/far").unwrap().attr.blocks, blocks0);
    // A hole over the middle, from chunk 1 to the last chunk but one.
    fs.fallocate(&ctx, f.handle(), punch, G, top - G - 1 - G)
        .unwrap();
    let live: Vec<u64> = spots
        .iter()
        .copied()
        .filter(|&a| !(G..top - G - 1).contains(&a))
        .collect();
    readback(&c, &f, &live, "after the punch");
    cp();
    readback(&c, &f, &live, "after the punch, from the checkpoint");
    let blocks1 = c.metadata("/far").unwrap().attr.blocks;
    assert_eq!(blocks1, blocks0 - 2 * (PAGE / 512), "two pages went");
    // Cut between the far pages.
    f.set_len(top - G + 1).unwrap();
    let live: Vec<u64> = live.into_iter().filter(|&a| a < top - G + 1).collect();
    readback(&c, &f, &live, "after the cut");
    cp();
    readback(&c, &f, &live, "after the cut, from the checkpoint");
    let blocks2 = c.metadata("/far").unwrap().attr.blocks;
    drop(f);
    close_and_check(dir, c, fs, store);
    let r = open(dir, no_cache(), opts()).unwrap();
    let fs = Arc::new(r.fs);
    let c = Client::root(fs.clone());
    assert_eq!(c.metadata("/far").unwrap().attr.blocks, blocks2);
    assert_eq!(c.metadata("/far").unwrap().attr.size, top - G + 1);
    let f = c.open("/far", &rwc()).unwrap();
    readback(&c, &f, &live, "after reopen");
    // Removed: every chunk goes (the next file gets a clean number).
    drop(f);
    c.remove_file("/far").unwrap();
    r.store.checkpoint().unwrap();
    let f = c.open("/far2", &rwc()).unwrap();
    f.set_len(max).unwrap();
    let mut b = [0xEEu8; 2];
    for &at in &spots {
        assert_eq!(f.read_at(&mut b, at.min(max - 2)).unwrap(), 2);
        assert_eq!(b, [0, 0], "a new file at {at}");
    }
    assert_eq!(c.metadata("/far2").unwrap().attr.blocks, 0);
}
