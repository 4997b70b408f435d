//! Adversarial tests of the changed-page budget (engine `data.rs` `PageEpochs`, `fs/cache.rs`
//! `after_data_op`, the checkpointer's nudge and `journal::follow`): tiny budgets, many
//! writers, truncations, punched holes, fsync, checkpoints on demand from other threads,
//! closing the store under writers. A watchdog aborts the process on a hang.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::time::Duration;

use common::{Watchdog, host_opts, on_demand, seed};
use lanefs::{
    Client, Config, Ctx, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, Filesystem, OpenOptions, PAGE,
};
use lanefs_store::{Options, fsck, open};
use rand::{Rng, SeedableRng, rngs::StdRng};

/// How long a test may run before its [`Watchdog`] calls it hung: a last resort, minutes, far
/// past what a test takes on a loaded 2-CPU machine (the seven together took 19 s beside
/// `stress-ng --cpu 4`).
const LIMIT: Duration = Duration::from_secs(300);

/// A store on the host whose checkpoints come on demand or once `changed` bytes of file
/// data changed.
fn opts(changed: u64) -> Options {
    Options {
        checkpoint_changed: changed,
        ..on_demand(host_opts(1 << 20, Duration::from_millis(2)))
    }
}

fn cfg(cache: u64) -> Config {
    Config {
        cache_bytes: Some(cache),
        ..Config::default()
    }
}

const SPAN: u64 = 96 * PAGE;

/// One random change or checked read of `f`, with `model` its bytes.
fn step(fs: &Filesystem, f: &lanefs::File<'_>, model: &mut Vec<u8>, rng: &mut StdRng, what: &str) {
    let ctx = Ctx::root();
    let off = rng.random_range(0..SPAN);
    // Mostly small, sometimes many pages at once (one op counted after a checkpoint began).
    let len = if rng.random_range(0..4) == 0 {
        rng.random_range(PAGE..48 * PAGE)
    } else {
        rng.random_range(1..2 * PAGE)
    };
    match rng.random_range(0..14) {
        0..=4 => {
            let b = rng.random::<u8>() | 1;
            let data = vec![b; len as usize];
            assert_eq!(f.write_at(&data, off).unwrap(), data.len(), "{what}");
            let end = (off + len) as usize;
            if model.len() < end {
                model.resize(end, 0);
            }
            model[off as usize..end].fill(b);
        }
        5 => {
            let size = rng.random_range(0..SPAN);
            f.set_len(size).unwrap();
            model.resize(size as usize, 0);
        }
        6 | 7 => {
            fs.fallocate(
                &ctx,
                f.handle(),
                FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                off,
                len,
            )
            .unwrap();
            let end = ((off + len) as usize).min(model.len());
            if (off as usize) < end {
                model[off as usize..end].fill(0);
            }
        }
        8 => {
            let keep = rng.random_bool(0.5);
            let mode = if keep { FALLOC_FL_KEEP_SIZE } else { 0 };
            fs.fallocate(&ctx, f.handle(), mode, off, len).unwrap();
            if !keep && model.len() < (off + len) as usize {
                model.resize((off + len) as usize, 0);
            }
        }
        9 => f.sync_all().unwrap(),
        _ => {
            let mut b = vec![0u8; len as usize];
            let n = f.read_at(&mut b, off).unwrap();
            let want = model.len().saturating_sub(off as usize).min(len as usize);
            assert_eq!(n, want, "{what}: read length at {off}+{len}");
            assert!(
                n == 0 || b[..n] == model[off as usize..off as usize + n],
                "{what}: read at {off}+{len} differs from the model"
            );
        }
    }
}

fn check_file(c: &Client, path: &str, model: &[u8], when: &str) {
    let got = c.read(path).unwrap();
    assert_eq!(got.len(), model.len(), "{when}: {path}: size");
    if got != model {
        let at = got.iter().zip(model).position(|(a, b)| a != b).unwrap();
        panic!(
            "{when}: {path}: contents differ from the model first at byte {at} (page {}): got {} want {}",
            at as u64 / PAGE,
            got[at],
            model[at]
        );
    }
}

struct Run {
    threads: usize,
    files: usize,
    ops: usize,
    changed: u64,
    cache: u64,
    /// Explicit checkpoints from a racing thread.
    ondemand: bool,
}

/// Writers change their own files while (optionally) another thread takes checkpoints on
/// demand; every file is checked against its model, after a close + fsck + reopen too, and
/// again after a second close/reopen (records `follow` read across checkpoints).
fn run(name: &'static str, r: Run) {
    let seed = seed::seed(name);
    let _wd = Watchdog::new(format!("{name} (seed {seed})"), LIMIT);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let o = open(dir, cfg(r.cache), opts(r.changed)).unwrap();
    let fs = Arc::new(o.fs);
    let store = Arc::new(o.store);
    let done = Arc::new(AtomicBool::new(false));
    let most = Arc::new(AtomicU64::new(0));
    let ck = {
        let (store, done, fs, most) = (store.clone(), done.clone(), fs.clone(), most.clone());
        let on = r.ondemand;
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !done.load(Relaxed) {
                most.fetch_max(fs.resident_pages(), Relaxed);
                if on {
                    store.checkpoint().unwrap();
                    n += 1;
                    if n.is_multiple_of(5) {
                        fs.evict();
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            n
        })
    };
    let models: Vec<Vec<(String, Vec<u8>)>> = (0..r.threads)
        .map(|t| {
            let fs = fs.clone();
            let (files, ops) = (r.files, r.ops);
            std::thread::spawn(move || {
                let c = Client::root(fs.clone());
                let mut rng = StdRng::seed_from_u64(seed ^ ((t as u64 + 1) * 0x9e37_79b9));
                let open = *OpenOptions::new().read(true).write(true).create(true);
                let names: Vec<String> = (0..files).map(|k| format!("/t{t}-f{k}")).collect();
                let handles: Vec<_> = names.iter().map(|p| c.open(p, &open).unwrap()).collect();
                let mut models = vec![Vec::new(); files];
                for i in 0..ops {
                    let k = rng.random_range(0..files);
                    let what = format!("seed {seed} thread {t} op {i} {}", names[k]);
                    step(&fs, &handles[k], &mut models[k], &mut rng, &what);
                }
                drop(handles);
                names.into_iter().zip(models).collect()
            })
        })
        .map(|h| h.join().unwrap())
        .collect();
    done.store(true, Relaxed);
    let n = ck.join().unwrap();
    let most = most.load(Relaxed);
    eprintln!("{name}: {n} checkpoints on demand, most resident {most} pages");
    let c = Client::root(fs.clone());
    for (p, m) in models.iter().flatten() {
        check_file(&c, p, m, &format!("{name} seed {seed} before close"));
    }
    // Memory: cache + 4 D + 64 pages per writing thread (+ the largest single op), docs "Memory".
    let d = (r.cache / PAGE / 2).max(r.changed.div_ceil(PAGE));
    let bound = r.cache / PAGE + 4 * d + 64 * r.threads as u64 + 48 + 2 * r.threads as u64 * 48;
    assert!(
        most <= bound,
        "{name} seed {seed}: {most} pages resident, bound {bound}"
    );
    drop(c);
    drop(fs);
    Arc::try_unwrap(store).unwrap().close().unwrap();
    fsck::check(dir, &opts(r.changed)).unwrap();
    for round in 0..2 {
        let o = open(dir, cfg(r.cache), opts(r.changed)).unwrap();
        let fs = Arc::new(o.fs);
        let c = Client::root(fs.clone());
        for (p, m) in models.iter().flatten() {
            check_file(
                &c,
                p,
                m,
                &format!("{name} seed {seed} after reopen {round}"),
            );
        }
        // Some more changes, then a checkpoint, so the next reopen starts from a new one.
        let p = &models[0][0].0;
        let f = c
            .open(p, OpenOptions::new().read(true).write(true))
            .unwrap();
        f.write_at(&[7u8; 10], 0).unwrap();
        drop(f);
        o.store.checkpoint().unwrap();
        f_restore(&c, p, &models[0][0].1);
        drop(c);
        drop(fs);
        o.store.close().unwrap();
        fsck::check(dir, &opts(r.changed)).unwrap();
    }
}

/// Puts back the bytes the last round overwrote.
fn f_restore(c: &Client, p: &str, model: &[u8]) {
    let f = c
        .open(p, OpenOptions::new().read(true).write(true))
        .unwrap();
    let n = model.len().min(10);
    if model.len() < 10 {
        f.set_len(model.len() as u64).unwrap();
    }
    f.write_at(&model[..n], 0).unwrap();
}

#[test]
fn tiny_budget_many_writers() {
    run(
        "tiny_budget_many_writers",
        Run {
            threads: 4,
            files: 2,
            ops: 600,
            changed: 4096,
            cache: 0,
            ondemand: false,
        },
    );
}

#[test]
fn tiny_budget_with_checkpoints_on_demand() {
    run(
        "tiny_budget_with_checkpoints_on_demand",
        Run {
            threads: 4,
            files: 2,
            ops: 500,
            changed: 4096,
            cache: 0,
            ondemand: true,
        },
    );
}

#[test]
fn small_budget_small_cache() {
    run(
        "small_budget_small_cache",
        Run {
            threads: 3,
            files: 3,
            ops: 600,
            changed: 64 * PAGE,
            cache: 32 * PAGE,
            ondemand: true,
        },
    );
}

/// Writers go on while the store is closed under them (a bounded number of writes each
/// after the close began): none may hang in the throttle (the store is stalled once it
/// stops), whatever their calls return, and the close must return once they stop.
#[test]
fn close_under_throttled_writers() {
    close_under_writers(300, false);
}

/// As above, but the writers keep writing until `close` returns: `close` refuses appends
/// from its start (EROFS), so its last round ends. (Found here: before, the committer's
/// shutdown round carried the records stamped after it began for ever, and the record
/// buffers grew without bound.)
#[test]
fn close_under_writers_that_never_stop() {
    close_under_writers(300, true);
}

fn close_under_writers(extra_writes: u64, until_closed: bool) {
    let seed = seed::seed("close_under_writers");
    let _wd = Watchdog::new(format!("close_under_writers (seed {seed})"), LIMIT);
    let tmp = tempfile::tempdir().unwrap();
    let o = open(tmp.path(), cfg(0), opts(4096)).unwrap();
    let fs = Arc::new(o.fs);
    let closing = Arc::new(AtomicBool::new(false));
    let after = Arc::new(AtomicU64::new(0));
    let closed = Arc::new(AtomicBool::new(false));
    let ok_after_close = Arc::new(AtomicU64::new(0));
    let hs: Vec<_> = (0..4)
        .map(|t| {
            let (fs, closing, after) = (fs.clone(), closing.clone(), after.clone());
            let (closed, ok_after_close) = (closed.clone(), ok_after_close.clone());
            std::thread::spawn(move || {
                let c = Client::root(fs.clone());
                let f = c
                    .open(
                        format!("/w{t}"),
                        OpenOptions::new().read(true).write(true).create(true),
                    )
                    .unwrap();
                let mut rng = StdRng::seed_from_u64(seed ^ t);
                let mut extra = 0;
                let buf = vec![t as u8 + 1; 16 * PAGE as usize];
                while extra < extra_writes {
                    let off = rng.random_range(0..256) * PAGE;
                    let was_closed = closed.load(SeqCst);
                    if f.write_at(&buf, off).is_ok() && was_closed {
                        ok_after_close.fetch_add(1, Relaxed);
                    }
                    if closing.load(SeqCst) {
                        extra += 1;
                        after.fetch_add(1, Relaxed);
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    if !until_closed {
        closing.store(true, SeqCst);
    }
    let _ = o.store.close();
    closed.store(true, SeqCst);
    closing.store(true, SeqCst);
    for h in hs {
        h.join().unwrap();
    }
    eprintln!(
        "writes after close began: {}; acknowledged (Ok) after close returned: {}",
        after.load(Relaxed),
        ok_after_close.load(Relaxed)
    );
    assert_eq!(
        ok_after_close.load(Relaxed),
        0,
        "seed {seed}: a write after close returned succeeded"
    );
}

/// Only large writes (64..256 pages each: one operation counts many pages at once, and takes
/// long enough to straddle a checkpoint's `begin`), a tiny budget, no checkpoints on demand:
/// a writer whose record the checkpoint holds but whose pages were counted after it began
/// must not leave every writer waiting for a checkpoint that never becomes due.
#[test]
fn large_writes_straddle_checkpoint_begin() {
    large_writes(4096, 64..256, 100);
}

/// As above with a budget a few writes fill: checkpoints become due (nudge) before writers
/// wait, so writers go on through a checkpoint's journal sync.
#[test]
fn large_writes_medium_budget() {
    large_writes(64 * PAGE, 8..48, 300);
}

fn large_writes(changed: u64, pages: std::ops::Range<u64>, ops: usize) {
    let seed = seed::seed(&format!("large_writes (changed {changed})"));
    let _wd = Watchdog::new(format!("large_writes (seed {seed})"), LIMIT);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let o = open(dir, cfg(0), opts(changed)).unwrap();
    let fs = Arc::new(o.fs);
    let models: Vec<(String, Vec<u8>)> = (0..4u64)
        .map(|t| {
            let fs = fs.clone();
            let pages = pages.clone();
            std::thread::spawn(move || {
                let c = Client::root(fs.clone());
                let p = format!("/big{t}");
                let f = c
                    .open(&p, OpenOptions::new().read(true).write(true).create(true))
                    .unwrap();
                let mut rng = StdRng::seed_from_u64(seed ^ ((t + 1) * 0x51));
                let mut model = Vec::new();
                for i in 0..ops {
                    let off = rng.random_range(0..512) * PAGE + rng.random_range(0..PAGE);
                    let len = rng.random_range(pages.start * PAGE..pages.end * PAGE);
                    let b = (i as u8) | 1;
                    f.write_at(&vec![b; len as usize], off).unwrap();
                    let end = (off + len) as usize;
                    if model.len() < end {
                        model.resize(end, 0);
                    }
                    model[off as usize..end].fill(b);
                }
                (p, model)
            })
        })
        .map(|h| h.join().unwrap())
        .collect();
    let c = Client::root(fs.clone());
    for (p, m) in &models {
        check_file(&c, p, m, "large writes, before close");
    }
    drop(c);
    drop(fs);
    o.store.close().unwrap();
    fsck::check(dir, &opts(changed)).unwrap();
    let o = open(dir, cfg(0), opts(changed)).unwrap();
    let c = Client::root(Arc::new(o.fs));
    for (p, m) in &models {
        check_file(&c, p, m, "large writes, after reopen");
    }
}
