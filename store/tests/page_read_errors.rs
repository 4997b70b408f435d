//! Read errors of `checkpoint.redb` while file pages are out of memory (docs/STORE.md, "File
//! data out of memory"): the host fails the reads (`SimDisk::set_read_failing`), with redb's
//! page cache off so that every read of a page reaches the disk. A read of a page out of
//! memory fails with EIO; a change that keeps part of such a page (a partial write, a
//! truncation into it, the edge of a punched hole) fails with EIO and changes nothing, in
//! memory, in the journal, after a power cut; changes that need no page go on; once the host
//! reads again the store serves every byte again, without being reopened, and matches a
//! model after a reopen and after power cuts, with fsck clean. `LANEFS_SEED=<n>` replays
//! one seed of the random test.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{on_demand, seed};
use lanefs::{
    Attr, Client, Config, Ctx, Errno, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, Filesystem,
    OpenOptions, PAGE,
};
use lanefs_store::clock::SimClock;
use lanefs_store::disk::{SimDisk, Unflushed};
use lanefs_store::{Options, StoreError, StoreHandle, fsck, open};
use rand::{Rng, SeedableRng, rngs::StdRng};

const DIR: &str = "/s";
const PUNCH: i32 = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;

fn ck_file() -> PathBuf {
    Path::new(DIR).join("checkpoint.redb")
}

/// Manual checkpoints, redb's cache off, the checkpointer looking every 2 ms on a clock
/// that moves only when the test moves it.
fn opts(disk: &SimDisk, clock: &SimClock) -> Options {
    Options {
        checkpoint_poll: Duration::from_millis(2),
        checkpoint_cache: 0,
        clock: Arc::new(clock.clone()),
        ..on_demand(common::opts(disk, 64 << 10, Duration::from_millis(2)))
    }
}

/// No file data kept in memory beyond what changed since the last checkpoint.
fn cfg() -> Config {
    Config {
        cache_bytes: Some(0),
        ..Config::default()
    }
}

fn rw() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.read(true).write(true);
    o
}

fn rwc() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.read(true).write(true).create(true);
    o
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = StdRng::seed_from_u64(seed);
    (0..len).map(|_| r.random_range(1..=255u8)).collect()
}

fn first_diff(got: &[u8], model: &[u8]) -> String {
    let i = got.iter().zip(model).position(|(a, b)| a != b);
    format!(
        "len {} vs model {}, first difference at {i:?}",
        got.len(),
        model.len()
    )
}

/// The file's whole contents through `fs.read`, or its errno.
fn read_file(fs: &Filesystem, f: &lanefs::File<'_>) -> Result<Vec<u8>, Errno> {
    let size = fs.getattr(f.ino())?.size as usize;
    let mut buf = vec![0xEE; size + 100];
    let n = fs.read(f.handle(), 0, &mut buf)?;
    buf.truncate(n);
    Ok(buf)
}

fn check(fs: &Filesystem, f: &lanefs::File<'_>, model: &[u8], what: &str) {
    let got = read_file(fs, f).unwrap_or_else(|e| panic!("{what}: read: {e:?}"));
    assert!(got == model, "{what}: {}", first_diff(&got, model));
}

fn write(fs: &Filesystem, f: &lanefs::File<'_>, off: u64, data: &[u8]) -> Result<usize, Errno> {
    fs.write(&Ctx::root(), f.handle(), off, data)
}

fn set_len(f: &lanefs::File<'_>, size: u64) -> Result<(), Errno> {
    f.set_len(size)
        .map_err(|e| Errno(e.raw_os_error().expect("an errno")))
}

fn punch(fs: &Filesystem, f: &lanefs::File<'_>, off: u64, len: u64) -> Result<(), Errno> {
    fs.fallocate(&Ctx::root(), f.handle(), PUNCH, off, len)
}

/// Writes `data` at `off` of the model.
fn model_write(m: &mut Vec<u8>, off: u64, data: &[u8]) {
    let end = off as usize + data.len();
    if m.len() < end {
        m.resize(end, 0);
    }
    m[off as usize..end].copy_from_slice(data);
}

/// Zeroes `off..off+len` of the model, within its size.
fn model_punch(m: &mut [u8], off: u64, len: u64) {
    let end = ((off + len) as usize).min(m.len());
    if (off as usize) < end {
        m[off as usize..end].fill(0);
    }
}

/// Waits until `f` holds; fails after 120 s (the events waited for take milliseconds: the
/// limit only ends a test that would wait for good, even on a loaded machine).
fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(120), "waited for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits until the checkpointer has looked `n` more times (each look started after this
/// call, so it saw everything done before it).
fn polls(store: &StoreHandle, n: u64) {
    let p = store.checkpoint_status().polls;
    wait_until("the checkpointer to look", || {
        store.checkpoint_status().polls > p + n
    });
}

/// A store holding file `/f` of `model`'s bytes, checkpointed and sent out of memory.
struct Setup {
    disk: SimDisk,
    clock: SimClock,
    fs: Arc<Filesystem>,
    store: StoreHandle,
    model: Vec<u8>,
}

fn setup(seed: u64, len: usize) -> Setup {
    let disk = SimDisk::new();
    let clock = SimClock::new();
    let o = open(Path::new(DIR), cfg(), opts(&disk, &clock)).unwrap();
    let fs = Arc::new(o.fs);
    let model = pattern(seed, len);
    {
        let c = Client::root(fs.clone());
        let f = c.open("/f", &rwc()).unwrap();
        assert_eq!(write(&fs, &f, 0, &model), Ok(model.len()));
    }
    o.store.checkpoint().unwrap();
    assert!(fs.evict() > 0);
    assert_eq!(fs.resident_pages(), 0, "every page is out of memory");
    Setup {
        disk,
        clock,
        fs,
        store: o.store,
        model,
    }
}

impl Setup {
    /// Closes the store, checks it with fsck, opens it again and checks `/f` against the
    /// model; also each of `images` (a power-cut disk and the model it must hold).
    fn finish(self, images: Vec<(SimDisk, Vec<u8>)>, what: &str) {
        let Setup {
            disk,
            clock,
            fs,
            store,
            model,
        } = self;
        drop(fs);
        store.close().unwrap();
        for (d, m) in std::iter::once((disk, model)).chain(images) {
            fsck::check(Path::new(DIR), &opts(&d, &clock))
                .unwrap_or_else(|e| panic!("{what}: fsck: {e}"));
            let o = open(Path::new(DIR), cfg(), opts(&d, &clock)).unwrap();
            let fs = Arc::new(o.fs);
            let c = Client::root(fs.clone());
            let f = c.open("/f", &rw()).unwrap();
            check(&fs, &f, &m, &format!("{what}: reopened"));
            drop(f);
            drop(c);
            drop(fs);
            o.store.close().unwrap();
        }
    }
}

/// The page cache is off, so every read of a page out of memory reaches the disk (else
/// these tests would inject errors redb never sees).
#[test]
fn every_read_of_a_page_out_of_memory_reaches_the_disk() {
    let s = setup(1, (3 * PAGE) as usize);
    let c = Client::root(s.fs.clone());
    let f = c.open("/f", &rw()).unwrap();
    for _ in 0..3 {
        let before = s.disk.reads(&ck_file());
        check(&s.fs, &f, &s.model, "read");
        assert!(s.disk.reads(&ck_file()) > before, "served from a cache");
    }
    drop(f);
    drop(c);
    s.finish(vec![], "reads");
}

/// Reads of pages out of memory fail with EIO while the host fails them (never zeros or
/// other bytes), pages in memory still read; once the host reads again, the checkpointer
/// reopens the database redb gave up on (after the wait that follows its failed reopen) and
/// every byte reads back, without a checkpoint or a reopen of the store.
#[test]
fn reads_out_of_memory_fail_with_eio_then_read_back_once_the_host_reads() {
    let mut s = setup(2, (5 * PAGE + 700) as usize);
    let c = Client::root(s.fs.clone());
    let f = c.open("/f", &rw()).unwrap();
    let attr = s.fs.getattr(f.ino()).unwrap();
    s.disk.set_read_failing(Some(&ck_file()));
    let before = s.disk.reads(&ck_file());
    for (off, len) in [
        (0, 10),
        (PAGE - 3, 6),
        (2 * PAGE, 3 * PAGE),
        (5 * PAGE + 600, 200),
    ] {
        let mut buf = vec![0xEE; len as usize];
        assert_eq!(
            s.fs.read(f.handle(), off, &mut buf),
            Err(Errno::EIO),
            "read of {len} at {off}"
        );
    }
    assert!(
        s.disk.reads(&ck_file()) > before,
        "the failure came from the disk"
    );
    // A read of nothing but the size's end needs no page.
    let mut buf = [0u8; 10];
    assert_eq!(s.fs.read(f.handle(), attr.size, &mut buf), Ok(0));
    // A page brought into memory by a whole-page write reads from memory.
    let new = pattern(20, PAGE as usize);
    assert_eq!(write(&s.fs, &f, PAGE, &new), Ok(new.len()));
    model_write(&mut s.model, PAGE, &new);
    let mut buf = vec![0u8; PAGE as usize];
    assert_eq!(s.fs.read(f.handle(), PAGE, &mut buf), Ok(PAGE as usize));
    assert!(buf == new);
    // The checkpointer tries to reopen the database the failed read broke, fails (the host
    // still fails), and waits before it tries again.
    wait_until("a failed reopen", || {
        s.store.checkpoint_status().failures == 1
    });
    let st = s.store.checkpoint_status();
    assert_eq!(st.attempts, 1, "no checkpoint was due");
    assert_eq!(st.retry_at, Some(Duration::from_secs(1)));
    assert_eq!(read_file(&s.fs, &f), Err(Errno::EIO));
    s.disk.set_read_failing(None);
    // Waiting, it leaves the database closed, whatever the host does now.
    polls(&s.store, 5);
    assert_eq!(read_file(&s.fs, &f), Err(Errno::EIO));
    assert_eq!(s.store.checkpoint_status().failures, 1);
    s.clock.advance(Duration::from_secs(1));
    polls(&s.store, 1);
    check(&s.fs, &f, &s.model, "after the host reads again");
    let back = s.fs.getattr(f.ino()).unwrap();
    assert_eq!((back.size, back.blocks), (attr.size, attr.blocks));
    drop(f);
    drop(c);
    s.finish(vec![], "reads");
}

/// Asserts that `r` is EIO and that the file's attributes (size, blocks, times) and the
/// pages out of memory are as before.
fn refused<T: std::fmt::Debug>(
    fs: &Filesystem,
    f: &lanefs::File<'_>,
    r: Result<T, Errno>,
    before: &Attr,
    out: u64,
    what: &str,
) {
    assert_eq!(r.map(|_| ()), Err(Errno::EIO), "{what}");
    assert_eq!(
        fs.getattr(f.ino()).unwrap(),
        *before,
        "{what}: attributes changed"
    );
    assert_eq!(fs.pages_out(), out, "{what}: pages came into memory");
}

/// Writes that keep part of a page out of memory fail with EIO and change nothing while the
/// host fails its reads; whole-page writes and writes past the end go on; a checkpoint
/// fails; a power cut then, and the store once the host reads again (a checkpoint on demand
/// reopens the database at once), hold exactly the model.
#[test]
fn partial_writes_into_pages_out_of_memory_fail_and_change_nothing() {
    let mut s = setup(3, (6 * PAGE + 700) as usize);
    let c = Client::root(s.fs.clone());
    let f = c.open("/f", &rw()).unwrap();
    let ck_lsn = s.store.checkpoint_lsn();
    s.disk.set_read_failing(Some(&ck_file()));
    let before = s.fs.getattr(f.ino()).unwrap();
    let out = s.fs.pages_out();
    let size = before.size;
    for (off, len, what) in [
        (PAGE + 10, 3, "inside a page"),
        (PAGE / 2, 2 * PAGE, "both edges partial"),
        (2 * PAGE, PAGE + 1, "a whole page, then part of the next"),
        (
            3 * PAGE + 1,
            PAGE - 1,
            "the rest of a page after its first byte",
        ),
        (size, 100, "at the end, inside the last page"),
        (size - 5, 2 * PAGE, "across the end"),
    ] {
        let data = vec![0xA5; len as usize];
        refused(&s.fs, &f, write(&s.fs, &f, off, &data), &before, out, what);
    }
    // What needs no page out of memory: whole pages, a page past the end (the last page's
    // bytes past the size are zeros, never read), a hole.
    let whole = pattern(30, 2 * PAGE as usize);
    assert_eq!(write(&s.fs, &f, 4 * PAGE, &whole), Ok(whole.len()));
    model_write(&mut s.model, 4 * PAGE, &whole);
    let far = pattern(31, 10);
    assert_eq!(write(&s.fs, &f, 20 * PAGE + 5, &far), Ok(far.len()));
    model_write(&mut s.model, 20 * PAGE + 5, &far);
    // Into the page just written: it is in memory.
    assert_eq!(write(&s.fs, &f, 4 * PAGE + 9, b"mem"), Ok(3));
    model_write(&mut s.model, 4 * PAGE + 9, b"mem");
    assert_eq!(s.fs.getattr(f.ino()).unwrap().size, s.model.len() as u64);
    // A checkpoint reads the checkpoint too: it fails, and keeps nothing.
    let e = s
        .store
        .checkpoint()
        .expect_err("a checkpoint while reads fail")
        .to_string();
    assert!(e.contains("os error 5"), "not EIO: {e}");
    assert_eq!(s.store.checkpoint_lsn(), ck_lsn);
    f.sync_all().unwrap();
    let image = s.disk.crash(Unflushed::Lost);
    // Opening the store fails while the host fails its reads, with an error, not a panic.
    let img_failing = s.disk.crash(Unflushed::Lost);
    img_failing.set_read_failing(Some(&ck_file()));
    match open(Path::new(DIR), cfg(), opts(&img_failing, &s.clock)) {
        Err(StoreError::Io { source, .. }) if source.raw_os_error() == Some(libc::EIO) => {}
        Err(e) => panic!("open while reads fail: not the host's EIO: {e}"),
        Ok(_) => panic!("opened a store whose checkpoint cannot be read"),
    }
    s.disk.set_read_failing(None);
    // On demand: reopened and checkpointed at once, whatever the checkpointer waits for.
    s.store.checkpoint().unwrap();
    assert_eq!(s.store.checkpoint_status().failures, 0);
    check(&s.fs, &f, &s.model, "after the host reads again");
    // The refused writes work now.
    assert_eq!(write(&s.fs, &f, PAGE + 10, b"abc"), Ok(3));
    model_write(&mut s.model, PAGE + 10, b"abc");
    s.store.checkpoint().unwrap();
    s.fs.evict();
    check(&s.fs, &f, &s.model, "out of memory again");
    let model_then = {
        let mut m = pattern(3, (6 * PAGE + 700) as usize);
        model_write(&mut m, 4 * PAGE, &whole);
        model_write(&mut m, 20 * PAGE + 5, &far);
        model_write(&mut m, 4 * PAGE + 9, b"mem");
        m
    };
    drop(f);
    drop(c);
    s.finish(vec![(image, model_then)], "writes");
}

/// Truncations into a page out of memory and punched holes whose edges fall in one fail
/// with EIO and change nothing while the host fails its reads; truncations to a page
/// boundary, growth, allocation and holes of whole pages (or whose edges fall in holes) go
/// on; the store then holds exactly the model, after a power cut too.
#[test]
fn truncations_and_holes_into_pages_out_of_memory_fail_and_change_nothing() {
    let mut s = setup(4, (8 * PAGE + 300) as usize);
    let c = Client::root(s.fs.clone());
    let f = c.open("/f", &rw()).unwrap();
    s.disk.set_read_failing(Some(&ck_file()));
    let mut before = s.fs.getattr(f.ino()).unwrap();
    let mut out = s.fs.pages_out();
    for size in [7 * PAGE + 1, 2 * PAGE + 100, PAGE - 1, 1] {
        refused(
            &s.fs,
            &f,
            set_len(&f, size),
            &before,
            out,
            &format!("truncate to {size}"),
        );
    }
    for (off, len) in [
        (PAGE + 100, 50),
        (100, PAGE),
        (3 * PAGE, PAGE + 1),
        (5 * PAGE - 1, 2),
        (6 * PAGE + 7, 10 * PAGE),
    ] {
        refused(
            &s.fs,
            &f,
            punch(&s.fs, &f, off, len),
            &before,
            out,
            &format!("punch {len} at {off}"),
        );
    }
    // Truncating to a page boundary drops whole pages only.
    set_len(&f, 7 * PAGE).unwrap();
    s.model.truncate(7 * PAGE as usize);
    // A whole page punched out, then a hole whose edge falls in it (a hole: nothing read).
    punch(&s.fs, &f, PAGE, PAGE).unwrap();
    model_punch(&mut s.model, PAGE, PAGE);
    punch(&s.fs, &f, 2 * PAGE - 10, PAGE + 10).unwrap();
    model_punch(&mut s.model, 2 * PAGE - 10, PAGE + 10);
    // Growing and allocating keep every byte.
    set_len(&f, 9 * PAGE + 11).unwrap();
    s.model.resize(9 * PAGE as usize + 11, 0);
    s.fs.fallocate(&Ctx::root(), f.handle(), 0, 0, 12 * PAGE)
        .unwrap();
    s.model.resize(12 * PAGE as usize, 0);
    before = s.fs.getattr(f.ino()).unwrap();
    out = s.fs.pages_out();
    assert_eq!(before.size, s.model.len() as u64);
    refused(&s.fs, &f, set_len(&f, 5 * PAGE + 5), &before, out, "again");
    f.sync_all().unwrap();
    let image = (s.disk.crash(Unflushed::Lost), s.model.clone());
    s.disk.set_read_failing(None);
    s.store.checkpoint().unwrap();
    check(&s.fs, &f, &s.model, "after the host reads again");
    // What was refused works now.
    set_len(&f, 5 * PAGE + 5).unwrap();
    s.model.truncate(5 * PAGE as usize + 5);
    punch(&s.fs, &f, 100, PAGE).unwrap();
    model_punch(&mut s.model, 100, PAGE);
    check(&s.fs, &f, &s.model, "after the refused changes");
    drop(f);
    drop(c);
    s.finish(vec![image], "truncations");
}

/// Random writes, truncations, holes, allocations and reads of three files, checked
/// against a model at every step, while the host's reads of the checkpoint fail now and
/// then and checkpoints and eviction passes come between: every operation either does what
/// the model says, or fails with EIO (only while reads fail) and changes nothing. Power
/// cuts after syncs, and the store reopened, hold the model.
#[test]
fn random_changes_while_reads_fail_now_and_then_match_a_model() {
    for seed in seed::seeds("random_changes_while_reads_fail", seed::fresh(2)) {
        eprintln!("seed {seed}");
        random_run(seed);
    }
}

fn random_run(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let disk = SimDisk::new();
    let clock = SimClock::new();
    let o = open(Path::new(DIR), cfg(), opts(&disk, &clock)).unwrap();
    let fs = Arc::new(o.fs);
    let store = o.store;
    let c = Client::root(fs.clone());
    let names = ["/a", "/b", "/c"];
    let files: Vec<_> = names.iter().map(|n| c.open(n, &rwc()).unwrap()).collect();
    let mut models = vec![Vec::new(); names.len()];
    let mut images = Vec::new();
    let mut failing = false;
    let (mut refused, mut done) = (0u64, 0u64);
    let limit = 24 * PAGE;
    for step in 0..1500 {
        let what = format!("seed {seed} step {step}");
        match rng.random_range(0..100) {
            0..=2 => {
                failing = !failing;
                if failing {
                    disk.set_read_failing(Some(&ck_file()));
                } else {
                    disk.set_read_failing(None);
                    // Reopens the database a failed read broke, at once.
                    store
                        .checkpoint()
                        .unwrap_or_else(|e| panic!("{what}: checkpoint: {e}"));
                }
            }
            3..=6 => {
                // While reads fail it fails, unless it has nothing to do and no read failed
                // yet.
                let r = store.checkpoint();
                assert!(failing || r.is_ok(), "{what}: checkpoint: {r:?}");
                fs.evict();
            }
            7 => {
                fs.sync_all().unwrap();
                if images.len() < 4 {
                    images.push((disk.crash(Unflushed::Lost), models.clone(), step));
                }
            }
            _ => {
                let k = rng.random_range(0..files.len());
                let (f, m) = (&files[k], &mut models[k]);
                let off = rng.random_range(0..limit);
                let len = match rng.random_range(0..4) {
                    0 => PAGE,
                    1 => rng.random_range(1..64),
                    _ => rng.random_range(1..3 * PAGE),
                };
                // Page-aligned now and then, so whole pages are changed too.
                let off = if rng.random_bool(0.3) {
                    off / PAGE * PAGE
                } else {
                    off
                };
                let before = fs.getattr(f.ino()).unwrap();
                let r = match rng.random_range(0..10) {
                    0..=3 => {
                        let data = pattern(rng.random(), len as usize);
                        write(&fs, f, off, &data).map(|n| {
                            assert_eq!(n, data.len(), "{what}: short write");
                            model_write(m, off, &data);
                        })
                    }
                    4 => {
                        let size = if rng.random_bool(0.3) {
                            off / PAGE * PAGE
                        } else {
                            off
                        };
                        set_len(f, size).map(|()| m.resize(size as usize, 0))
                    }
                    5 => punch(&fs, f, off, len).map(|()| model_punch(m, off, len)),
                    6 => fs.fallocate(&Ctx::root(), f.handle(), FALLOC_FL_KEEP_SIZE, off, len),
                    _ => {
                        let mut buf = vec![0xEE; len as usize];
                        fs.read(f.handle(), off, &mut buf).map(|n| {
                            let want = m.get(off as usize..).unwrap_or(&[]);
                            let want = &want[..want.len().min(len as usize)];
                            assert_eq!(n, want.len(), "{what}: read length");
                            assert!(
                                buf[..n] == *want,
                                "{what}: read of {len} at {off}: {}",
                                first_diff(&buf[..n], want)
                            );
                        })
                    }
                };
                match r {
                    Ok(()) => done += 1,
                    Err(e) => {
                        assert!(failing, "{what}: {e:?} while the host reads");
                        assert_eq!(e, Errno::EIO, "{what}");
                        let after = fs.getattr(f.ino()).unwrap();
                        assert_eq!(after, before, "{what}: a refused change changed the file");
                        refused += 1;
                    }
                }
                assert_eq!(fs.getattr(f.ino()).unwrap().size, m.len() as u64, "{what}");
            }
        }
    }
    eprintln!("seed {seed}: {done} operations done, {refused} refused");
    assert!(refused > 0, "seed {seed}: no operation met a failing read");
    disk.set_read_failing(None);
    store.checkpoint().unwrap();
    for (k, f) in files.iter().enumerate() {
        check(
            &fs,
            f,
            &models[k],
            &format!("seed {seed}: {} at the end", names[k]),
        );
    }
    drop(files);
    drop(c);
    drop(fs);
    store.close().unwrap();
    let end = (disk, models, usize::MAX);
    for (d, ms, step) in std::iter::once(end).chain(images) {
        let what = format!("seed {seed}: image after step {step}");
        fsck::check(Path::new(DIR), &opts(&d, &clock))
            .unwrap_or_else(|e| panic!("{what}: fsck: {e}"));
        let o = open(Path::new(DIR), cfg(), opts(&d, &clock)).unwrap();
        let fs = Arc::new(o.fs);
        let c = Client::root(fs.clone());
        for (k, n) in names.iter().enumerate() {
            let f = c.open(n, &rw()).unwrap();
            check(&fs, &f, &ms[k], &format!("{what}: {n}"));
        }
        drop(c);
        drop(fs);
        o.store.close().unwrap();
    }
}
