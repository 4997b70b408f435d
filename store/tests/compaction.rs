//! Compaction of the checkpoint (`lanefs_store::compact`, `lanefs compact DIR`, and the
//! compaction at open): the room deleted files took in the checkpoint goes back to the host,
//! the filesystem is the same afterwards (tree, numbers, generations, times, contents), and a
//! power cut at any flush of it leaves that same filesystem.
//!
//! Then, adversarially: stores with files of every size (sparse, holes punched, truncated
//! both ways), xattrs, links, symlinks, renames and deletions before, between and after
//! checkpoints; crashes at every flush (and during a recompaction), host errors (ENOSPC,
//! EIO, failing reads, a checkpoint that cannot grow), refusals (no store, a store open
//! elsewhere), compaction at open, after a crash in use, and on a real disk. Every image:
//! fsck clean and the same tree; next inode numbers and generations unchanged.
//!
//! Random tests print their seed; `LANEFS_SEED=<n>` replays one.

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use common::{
    HOUR, PowerCuts, Tree, assert_same_tree, dump, host_opts, on_demand, seed, tree_diff,
};
use lanefs::{Client, Config, Ctx, OpenOptions, TimeSet, Timespec};
use lanefs_store::disk::{SimDisk, SyncPoint, Unflushed};
use lanefs_store::{Options, StoreHandle, compact, fsck, open};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn dir() -> PathBuf {
    PathBuf::from("/store")
}

/// On `disk`: checkpoints on demand only, a commit only on a sync, and redb's page cache.
/// Loaded whole when opened: an opening compacts a mostly free checkpoint only then (a lazy
/// one reads too little of it to tell).
fn cached(disk: &SimDisk) -> Options {
    Options {
        lazy: false,
        ..on_demand(common::opts(disk, 256 << 10, HOUR))
    }
}

/// [`cached`] without the cache: every read of the checkpoint reaches the disk (and its
/// faults).
fn opts(disk: &SimDisk) -> Options {
    Options {
        checkpoint_cache: 0,
        ..cached(disk)
    }
}

// ----- the room of deleted files ------------------------------------------------------------

/// Bytes of file `i`: distinct for every file and offset.
fn file_bytes(i: usize, n: usize) -> Vec<u8> {
    (0..n).map(|k| (k * 7 + i * 131 + k / 4096) as u8).collect()
}

/// What a filesystem is, for comparing: its tree with times, and every kept file's contents.
type State = (Tree, Vec<Vec<u8>>);

fn state(c: &Client) -> State {
    let files = (0..5)
        .map(|i| c.read(format!("/keep/k{i}")).unwrap())
        .collect();
    (dump(c.fs(), true), files)
}

/// A store where 6 MiB of files were written, checkpointed and deleted (the deletion left in
/// the journal, for compaction's checkpoint to apply), and 5 files kept; its state.
fn store_with_deleted_files(disk: &SimDisk) -> State {
    let o = open(&dir(), Config::default(), cached(disk)).unwrap();
    let fs = Arc::new(o.fs);
    let c = Client::root(fs.clone());
    c.create_dir("/keep").unwrap();
    c.create_dir("/gone").unwrap();
    for i in 0..5 {
        c.write(format!("/keep/k{i}"), file_bytes(i, 100_000 + i * 999))
            .unwrap();
    }
    for i in 0..24 {
        c.write(format!("/gone/g{i}"), file_bytes(100 + i, 256 << 10))
            .unwrap();
    }
    fs.sync_all().unwrap();
    o.store.checkpoint().unwrap();
    assert!(ckpt_len(disk) > 6 << 20, "the files' pages are in it");
    for i in 0..24 {
        c.remove_file(format!("/gone/g{i}")).unwrap();
    }
    c.remove_dir("/gone").unwrap();
    fs.sync_all().unwrap();
    let s = state(&c);
    drop(c);
    drop(fs);
    o.store.close().unwrap();
    s
}

fn check_same(disk: &SimDisk, want: &State, what: &str) {
    fsck::check(&dir(), &cached(disk)).unwrap_or_else(|e| panic!("{what}: fsck: {e}"));
    let o = open(&dir(), Config::default(), cached(disk)).unwrap();
    let c = Client::root(Arc::new(o.fs));
    let got = state(&c);
    assert!(got.0 == want.0, "{what}: the tree changed");
    assert!(got.1 == want.1, "{what}: a kept file's contents changed");
    c.fs().check_invariants().unwrap();
}

#[test]
fn compaction_gives_deleted_files_room_back_and_keeps_the_rest() {
    let disk = SimDisk::new();
    let want = store_with_deleted_files(&disk);
    let before = ckpt_len(&disk);
    let r = compact(&dir(), cached(&disk)).unwrap();
    let after = ckpt_len(&disk);
    assert!(r.applied > 24, "the deletions applied: {r:?}");
    assert!(r.after < r.before, "{r:?}");
    assert!(
        after + (5 << 20) < before && after < 2 << 20,
        "checkpoint.redb {before} -> {after} bytes"
    );
    check_same(&disk, &want, "after compaction");
    // Opening a store whose checkpoint is small and dense compacts nothing.
    let o = open(&dir(), Config::default(), cached(&disk)).unwrap();
    drop(o);
    assert_eq!(ckpt_len(&disk), after);
}

#[test]
fn a_power_cut_at_any_flush_of_a_compaction_leaves_the_same_filesystem() {
    let disk = SimDisk::new();
    let want = store_with_deleted_files(&disk);
    let cuts = PowerCuts::every_flush(&disk, 0);
    compact(&dir(), cached(&disk)).unwrap();
    let images = cuts.take();
    assert!(images.len() >= 12, "{} images", images.len());
    for (i, img) in images.iter().enumerate() {
        check_same(&img.disk, &want, &format!("image {i} of {}", images.len()));
    }
    check_same(&disk, &want, "after compaction");
}

#[test]
fn compacting_a_directory_that_is_no_store_makes_none() {
    let disk = SimDisk::new();
    let e = compact(&dir(), cached(&disk)).unwrap_err();
    // The error says what the directory is (here: none at all).
    assert!(e.to_string().contains("not a lanefs store"), "{e}");
    assert!(disk.files().is_empty(), "nothing written");
}

// ----- adversarial: every kind of file, crashes, host errors, refusals -----------------------

fn bytes(rng: &mut StdRng, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rng.fill(&mut v[..]);
    v
}

fn close(c: Client, store: StoreHandle) {
    drop(c);
    store.close().expect("close");
}

/// fsck, then opens the store on `disk`, dumps it and closes it.
fn reopen_dump(disk: &SimDisk, what: &str) -> Tree {
    let o = opts(disk);
    if let Err(e) = fsck::check(&dir(), &o) {
        panic!("{what}: fsck failed: {e}");
    }
    let opened = match open(&dir(), Config::default(), o) {
        Ok(o) => o,
        Err(e) => panic!("{what}: open failed: {e}"),
    };
    let t = dump(&opened.fs, true);
    drop(opened.fs);
    opened.store.close().expect("close");
    t
}

/// On a copy of `disk`: statfs, then the inode number and generation a new file, a new
/// directory and a new hard link get (allocation state must survive compaction).
fn probe_next(disk: &SimDisk) -> (u64, u64, u64, Vec<(lanefs::Ino, lanefs::Generation)>) {
    let copy = disk.crash(Unflushed::Kept);
    let o = open(&dir(), Config::default(), opts(&copy)).expect("probe open");
    let st = o.fs.statfs();
    let store = o.store;
    let c = Client::root(Arc::new(o.fs));
    let mut ids = Vec::new();
    for i in 0..3 {
        c.write(format!("/probe-new-{i}"), b"x").unwrap();
        let m = c.metadata(format!("/probe-new-{i}")).unwrap();
        let a = c.fs().getattr(m.ino()).unwrap();
        ids.push((a.ino, a.generation));
        c.create_dir(format!("/probe-dir-{i}")).unwrap();
        let a = c
            .fs()
            .getattr(c.metadata(format!("/probe-dir-{i}")).unwrap().ino())
            .unwrap();
        ids.push((a.ino, a.generation));
        c.remove_file(format!("/probe-new-{i}")).unwrap();
    }
    close(c, store);
    (st.bfree, st.files, st.ffree, ids)
}

fn ckpt_len(disk: &SimDisk) -> u64 {
    disk.files()
        .iter()
        .find(|(p, _)| p == &dir().join("checkpoint.redb"))
        .map(|(_, d)| d.len() as u64)
        .unwrap_or(0)
}

fn setx(c: &Client, path: &str, name: &[u8], value: &[u8]) {
    let ino = c.symlink_metadata(path).unwrap().ino();
    c.fs().setxattr(&Ctx::root(), ino, name, value, 0).unwrap();
}

fn write_at(c: &Client, path: &str, off: u64, data: &[u8]) {
    let f = c
        .open(path, OpenOptions::new().write(true).create(true))
        .unwrap();
    let mut done = 0;
    while done < data.len() {
        done += f.write_at(&data[done..], off + done as u64).unwrap();
    }
}

fn punch(c: &Client, path: &str, off: u64, len: u64) {
    let f = c.open(path, OpenOptions::new().write(true)).unwrap();
    c.fs()
        .fallocate(
            &Ctx::root(),
            f.handle(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off,
            len,
        )
        .unwrap();
}

/// Builds an adversarial filesystem: files of varied sizes (some > 60 KiB), sparse files,
/// holes, truncations, xattrs, hard links, symlinks, renames, and deletions before the
/// first checkpoint, between checkpoints, and only in the journal. `scale` multiplies the
/// number of files. Returns the live filesystem's tree just before closing.
fn populate(disk: &SimDisk, seed: u64, scale: usize) -> Tree {
    let mut rng = StdRng::seed_from_u64(seed);
    let o = open(&dir(), Config::default(), opts(disk)).expect("open new store");
    let store = o.store;
    let c = Client::root(Arc::new(o.fs));
    let sizes = [
        0usize, 1, 100, 4095, 4096, 4097, 8192, 61_440, 61_441, 65_536, 70_001, 131_072, 200_003,
        400_000,
    ];
    for d in 0..4 {
        c.create_dir_all(format!("/d{d}/sub")).unwrap();
    }
    let n = 12 * scale + 4;
    let mut files = Vec::new();
    for i in 0..n {
        let p = format!("/d{}/{}f{i}", i % 4, if i % 3 == 0 { "sub/" } else { "" });
        let sz = sizes[rng.random_range(0..sizes.len())];
        let data = bytes(&mut rng, sz);
        c.write(&p, &data).unwrap();
        files.push(p);
    }
    // Sparse file with holes, and one with a big hole in the middle.
    write_at(&c, "/d0/sparse", 5 << 20, b"tail of a sparse file");
    write_at(&c, "/d0/sparse", 3, b"head");
    let mid = bytes(&mut rng, 90_000);
    write_at(&c, "/d1/holey", 0, &mid);
    write_at(&c, "/d1/holey", 300_000, &mid);
    punch(&c, "/d1/holey", 10_000, 50_000);
    // Xattrs, incl. a large value.
    setx(&c, "/d0", b"user.dir", b"on a directory");
    setx(&c, &files[0], b"user.small", b"v");
    let big = bytes(&mut rng, 3000);
    setx(&c, &files[1], b"user.big", &big);
    // Hard links and symlinks.
    c.hard_link(&files[2], "/d3/link-to-f2").unwrap();
    c.hard_link(&files[2], "/d2/sub/another-link").unwrap();
    c.symlink(&files[3], "/d2/sym").unwrap();
    c.symlink("dangling/target/that/is/long", "/d1/dangle")
        .unwrap();
    // Deleted before any checkpoint.
    let doomed0 = bytes(&mut rng, 150_000);
    c.write("/d0/deleted-before", &doomed0).unwrap();
    c.remove_file("/d0/deleted-before").unwrap();
    store.checkpoint().expect("first checkpoint");

    // Phase 2: deletions, renames, rewrites, truncations between checkpoints.
    for (i, f) in files.iter().enumerate() {
        if i % 5 == 1 && i > 4 {
            c.remove_file(f).unwrap();
        }
    }
    c.rename(&files[4], "/d3/renamed4").unwrap();
    files[4] = "/d3/renamed4".into();
    c.truncate(&files[5], 1234).unwrap();
    c.truncate(&files[7], 300_000).unwrap();
    punch(&c, "/d0/sparse", 0, 4096);
    setx(
        &c,
        &files[0],
        b"user.small",
        b"changed after the first checkpoint",
    );
    let big2 = bytes(&mut rng, 250_000);
    c.write("/d2/big-then-deleted-in-journal", &big2).unwrap();
    c.set_times(
        &files[3],
        Some(TimeSet::At(Timespec::new(1_000_000, 7))),
        Some(TimeSet::At(Timespec::new(2_000_000, 999_999_999))),
    )
    .unwrap();
    store.checkpoint().expect("second checkpoint");

    // Phase 3: journal only.
    for (i, f) in files.iter().enumerate() {
        if i % 5 == 3 && i > 4 {
            c.remove_file(f).unwrap();
        }
    }
    c.remove_file("/d2/big-then-deleted-in-journal").unwrap();
    c.remove_file(&files[2]).unwrap(); // links remain
    c.rename(&files[10], &files[12]).unwrap(); // over an existing file
    let more = bytes(&mut rng, 80_000);
    write_at(&c, &files[9], 40_000, &more);
    c.create_dir_all("/d3/new/deep").unwrap();
    c.write("/d3/new/deep/journal-only", b"only in the journal")
        .unwrap();
    setx(&c, "/d3/new/deep/journal-only", b"user.j", b"jx");
    c.remove_dir("/d2/sub").unwrap_err(); // not empty: fine
    store.sync().unwrap();
    let t = dump(c.fs(), true);
    close(c, store);
    t
}

/// A store built by `populate`, checked to reopen to the same tree before any compaction.
fn built(seed: u64, scale: usize) -> (SimDisk, Tree) {
    let disk = SimDisk::new();
    let want = populate(&disk, seed, scale);
    let got = reopen_dump(&disk, "baseline reopen (no compaction)");
    assert_same_tree("baseline reopen (no compaction)", &want, &got);
    (disk, want)
}

#[test]
fn compact_keeps_filesystem_and_shrinks() {
    let s = seed::seed("compact_keeps_filesystem_and_shrinks");
    let (disk, want) = built(s, 3);
    let len0 = ckpt_len(&disk);
    let next0 = probe_next(&disk);
    let r = compact(&dir(), opts(&disk)).expect("compact");
    assert_eq!(
        next0,
        probe_next(&disk),
        "statfs / next inode numbers and generations changed by compaction"
    );
    eprintln!("report {r:?}, checkpoint {len0} -> {}", ckpt_len(&disk));
    assert!(r.after <= r.before, "compaction grew the store: {r:?}");
    assert_same_tree("after compact", &want, &reopen_dump(&disk, "after compact"));
    // Twice in a row.
    let r2 = compact(&dir(), opts(&disk)).expect("second compact");
    assert_eq!(r2.applied, 0, "nothing left to apply: {r2:?}");
    assert!(r2.after <= r2.before, "{r2:?}");
    assert_same_tree("after second compact", &want, &reopen_dump(&disk, "2nd"));
    // A crash right after a compaction (nothing unflushed should matter).
    for m in [Unflushed::Lost, Unflushed::Torn(s)] {
        let img = disk.crash(m);
        assert_same_tree(
            &format!("crash {m:?} after compact"),
            &want,
            &reopen_dump(&img, "img"),
        );
    }
}

#[test]
fn compact_then_modify_then_compact() {
    let s = seed::seed("compact_then_modify_then_compact");
    let (disk, mut want) = built(s ^ 1, 2);
    compact(&dir(), opts(&disk)).expect("compact");
    // Use the compacted store: write, delete, checkpoint, and compare.
    let o = open(&dir(), Config::default(), opts(&disk)).unwrap();
    let store = o.store;
    let c = Client::root(Arc::new(o.fs));
    assert_same_tree("open after compact", &want, &dump(c.fs(), true));
    let mut rng = StdRng::seed_from_u64(s);
    for i in 0..10 {
        c.write(format!("/d1/post{i}"), bytes(&mut rng, 70_000 + i * 1000))
            .unwrap();
    }
    store.checkpoint().unwrap();
    for i in 0..10 {
        if i % 2 == 0 {
            c.remove_file(format!("/d1/post{i}")).unwrap();
        }
    }
    // Partially overwrite a file whose pages only live in the compacted checkpoint.
    let names: Vec<_> = c.read_dir("/d0").unwrap();
    for e in names {
        let p = format!("/d0/{}", String::from_utf8_lossy(&e.name));
        let m = c.symlink_metadata(&p).unwrap();
        if m.is_file() && m.len() > 70_000 {
            write_at(&c, &p, 65_000, b"overwritten across a page");
        }
    }
    store.checkpoint().unwrap();
    store.sync().unwrap();
    want = dump(c.fs(), true);
    close(c, store);
    compact(&dir(), opts(&disk)).expect("compact 2");
    assert_same_tree(
        "after compact 2",
        &want,
        &reopen_dump(&disk, "after compact 2"),
    );
}

#[test]
fn compact_empty_new_store_twice() {
    let disk = SimDisk::new();
    let o = open(&dir(), Config::default(), opts(&disk)).unwrap();
    let want = dump(&o.fs, true);
    drop(o.fs);
    o.store.close().unwrap();
    let r = compact(&dir(), opts(&disk)).expect("compact empty");
    eprintln!("{r:?}");
    assert_same_tree("empty", &want, &reopen_dump(&disk, "empty"));
    compact(&dir(), opts(&disk)).expect("compact empty twice");
    assert_same_tree("empty 2", &want, &reopen_dump(&disk, "empty 2"));
}

#[test]
fn compact_refuses_non_store() {
    // Missing directory.
    let disk = SimDisk::new();
    assert!(compact(Path::new("/nowhere"), opts(&disk)).is_err());
    assert!(
        disk.files().is_empty(),
        "compact created {:?}",
        disk.files()
    );
    // A directory with unrelated files.
    disk.put(Path::new("/other/readme"), b"not a store".to_vec());
    let before = disk.files();
    assert!(compact(Path::new("/other"), opts(&disk)).is_err());
    assert_eq!(before, disk.files(), "compact changed a non-store");
    // A directory with only a checkpoint-looking file.
    disk.put(Path::new("/fake/checkpoint.redb"), vec![0; 4096]);
    let before = disk.files();
    assert!(compact(Path::new("/fake"), opts(&disk)).is_err());
    assert_eq!(before, disk.files(), "compact changed a non-store");
    // Real disk: an empty dir stays empty, a missing one stays missing.
    let td = tempfile::tempdir_in("/tmp").unwrap();
    let ro = Options {
        segment_size: 256 << 10,
        ..Options::default()
    };
    assert!(compact(td.path(), ro).is_err());
    assert_eq!(std::fs::read_dir(td.path()).unwrap().count(), 0);
    let missing = td.path().join("missing");
    let ro = Options {
        segment_size: 256 << 10,
        ..Options::default()
    };
    assert!(compact(&missing, ro).is_err());
    assert!(!missing.exists(), "compact created {}", missing.display());
}

#[test]
fn compact_refuses_open_store() {
    let (disk, want) = built(seed::seed("compact_refuses_open_store"), 1);
    let o = open(&dir(), Config::default(), opts(&disk)).unwrap();
    let t0 = std::time::Instant::now();
    let r = compact(&dir(), opts(&disk));
    assert!(r.is_err(), "compacted a store open elsewhere: {r:?}");
    eprintln!("refused after {:?}: {}", t0.elapsed(), r.unwrap_err());
    assert_same_tree("still open", &want, &dump(&o.fs, true));
    drop(o.fs);
    o.store.close().unwrap();
    assert_same_tree("after refusal", &want, &reopen_dump(&disk, "after refusal"));
}

/// Cuts the power at every flush of `compact` (before and after it), with unflushed writes
/// lost, kept and torn; every image must fsck clean and open to the same filesystem. Some
/// images are then compacted again, or opened with the open-time compaction, or both.
#[test]
fn crash_at_every_flush_of_compact() {
    let s = seed::seed("crash_at_every_flush_of_compact");
    let (disk, want) = built(s ^ 2, 2);
    let cuts = PowerCuts::every_flush(&disk, s);
    compact(&dir(), opts(&disk)).expect("compact");
    let images = cuts.take();
    assert_same_tree("after compact", &want, &reopen_dump(&disk, "after compact"));
    eprintln!("{} crash images", images.len());
    let mut failures = Vec::new();
    for (i, cut) in images.into_iter().enumerate() {
        let (what, img) = (format!("crash at {}", cut.label()), cut.disk);
        collect(&mut failures, || {
            let got = reopen_dump(&img, &what);
            assert_same_tree(&what, &want, &got);
            match i % 6 {
                0 => {
                    // Compact the crashed image again.
                    compact(&dir(), opts(&img))
                        .unwrap_or_else(|e| panic!("{what}: recompact: {e}"));
                    assert_same_tree(
                        &format!("{what}, recompacted"),
                        &want,
                        &reopen_dump(&img, &what),
                    );
                }
                3 => {
                    // Crash again in the middle of the recompaction.
                    let img2 = img.crash(Unflushed::Kept);
                    let hits: Arc<Mutex<Vec<SimDisk>>> = Default::default();
                    let h = hits.clone();
                    let mut k = 0;
                    img2.on_sync(move |d, _| {
                        k += 1;
                        if k % 7 == 3 {
                            h.lock().unwrap().push(d.crash(Unflushed::Torn(k)));
                        }
                    });
                    compact(&dir(), opts(&img2))
                        .unwrap_or_else(|e| panic!("{what}: recompact: {e}"));
                    img2.clear_hook();
                    for (j, i3) in hits.lock().unwrap().iter().enumerate() {
                        let w = format!("{what}, then crash {j} in the recompaction");
                        assert_same_tree(&w, &want, &reopen_dump(i3, &w));
                    }
                }
                _ => {}
            }
        });
    }
    if !failures.is_empty() {
        panic!(
            "{} crash images failed; first:\n{}",
            failures.len(),
            failures[..failures.len().min(3)].join("\n---\n")
        );
    }
}

/// Runs `f`, adding what it panicked with to `failures`, so that one run reports every case
/// that fails.
fn collect(failures: &mut Vec<String>, f: impl FnOnce()) {
    if let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        failures.push(panic_msg(e));
    }
}

/// Ends every fault the cases set on `disk`: the hook, failing writes and reads, a file
/// that cannot grow, a full host.
fn heal(disk: &SimDisk) {
    disk.clear_hook();
    disk.set_failing(false);
    disk.set_read_failing(None);
    disk.set_file_full(None);
    disk.set_space(None);
}

fn panic_msg(e: Box<dyn std::any::Any + Send>) -> String {
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// ENOSPC at various byte budgets during compaction: an error or a message, never a panic,
/// then with room again the same filesystem opens and compaction succeeds.
#[test]
fn enospc_during_compact() {
    let s = seed::seed("enospc_during_compact");
    let (base, want) = built(s ^ 3, 2);
    let used = base.used();
    let cp = ckpt_len(&base);
    eprintln!("used {used}, checkpoint {cp}");
    let mut budgets: Vec<u64> = vec![0, used / 2, used.saturating_sub(4096), used];
    for k in [
        1u64,
        512,
        4096,
        8192,
        20_000,
        65_536,
        200_000,
        1 << 20,
        3 << 20,
    ] {
        budgets.push(used + k);
    }
    let mut failures = Vec::new();
    for b in budgets {
        let disk = base.crash(Unflushed::Kept);
        disk.set_space(Some(b));
        let what = format!("budget {b} (used {used})");
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            compact(&dir(), opts(&disk))
        }));
        let res = match r {
            Err(e) => {
                failures.push(format!("{what}: compact panicked: {}", panic_msg(e)));
                continue;
            }
            Ok(r) => r,
        };
        eprintln!(
            "{what}: {:?}",
            res.as_ref().map(|_| ()).map_err(|e| e.to_string())
        );
        disk.set_space(None);
        collect(&mut failures, || {
            assert_same_tree(&what, &want, &reopen_dump(&disk, &what));
            // Also a power cut now (after the failed compaction).
            let img = disk.crash(Unflushed::Lost);
            assert_same_tree(&format!("{what} + crash"), &want, &reopen_dump(&img, &what));
            compact(&dir(), opts(&disk))
                .unwrap_or_else(|e| panic!("{what}: compact with room: {e}"));
            assert_same_tree(
                &format!("{what}, compacted with room"),
                &want,
                &reopen_dump(&disk, &what),
            );
        });
    }
    assert!(failures.is_empty(), "{}", failures.join("\n---\n"));
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    Eio,
    ReadEio,
    FileFull,
    Space,
}

/// From the `k`th flush of `disk` on, the host fails as `fault` says (`cp`: the checkpoint
/// file, for the faults aimed at it), for `dur` hook calls (`u64::MAX`: for good).
fn inject(disk: &SimDisk, cp: &Path, fault: Fault, k: u64, dur: u64) {
    let cp = cp.to_path_buf();
    let (mut n, mut calls, mut started) = (0u64, 0u64, None);
    disk.on_sync(move |d, at| {
        calls += 1;
        if started.is_some_and(|c0| calls - c0 == dur) {
            d.set_failing(false);
            d.set_read_failing(None);
            d.set_file_full(None);
            d.set_space(None);
        }
        if at != SyncPoint::Before {
            return;
        }
        n += 1;
        if n == k {
            started = Some(calls);
            match fault {
                Fault::Eio => d.set_failing(true),
                Fault::ReadEio => d.set_read_failing(Some(&cp)),
                Fault::FileFull => d.set_file_full(Some(&cp)),
                Fault::Space => d.set_space(Some(d.used())),
            }
        }
    });
}

/// A host error starting at the k-th flush of a compaction.
#[test]
fn host_errors_mid_compact() {
    let s = seed::seed("host_errors_mid_compact");
    let (base, want) = built(s ^ 4, 1);
    // How many flushes does a compaction take?
    let probe = base.crash(Unflushed::Kept);
    let before = probe.syncs();
    compact(&dir(), opts(&probe)).unwrap();
    let total = probe.syncs() - before;
    eprintln!("compact takes {total} flushes");
    let cp = dir().join("checkpoint.redb");
    let mut failures = Vec::new();
    for fault in [Fault::Eio, Fault::ReadEio, Fault::FileFull, Fault::Space] {
        for k in (1..=total + 1).step_by(if total > 40 { 3 } else { 1 }) {
            let disk = base.crash(Unflushed::Kept);
            // Permanent, or transient: cleared again this many hook calls later.
            let dur = [u64::MAX, 1, 2, 4][(k as usize) % 4];
            inject(&disk, &cp, fault, k, dur);
            let what = format!(
                "{fault:?} from flush {k}/{total} for {dur} hook calls",
                dur = [u64::MAX, 1, 2, 4][(k as usize) % 4]
            );
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                compact(&dir(), opts(&disk))
            }));
            heal(&disk);
            match r {
                Err(e) => {
                    failures.push(format!("{what}: compact panicked: {}", panic_msg(e)));
                    continue;
                }
                Ok(r) => {
                    if let Err(e) = &r {
                        eprintln!("{what}: {e}");
                    }
                }
            }
            collect(&mut failures, || {
                // A power cut right after the failure, then the healthy disk itself.
                let img = disk.crash(Unflushed::Lost);
                assert_same_tree(&format!("{what} + crash"), &want, &reopen_dump(&img, &what));
                assert_same_tree(&what, &want, &reopen_dump(&disk, &what));
                compact(&dir(), opts(&disk))
                    .unwrap_or_else(|e| panic!("{what}: compact healthy: {e}"));
                assert_same_tree(
                    &format!("{what}, recompacted"),
                    &want,
                    &reopen_dump(&disk, &what),
                );
            });
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures[..failures.len().min(5)].join("\n---\n")
    );
}

/// A store whose checkpoint holds > 64 MiB of deleted files' room (more than in use).
fn big_store(seed: u64) -> (SimDisk, Tree) {
    let mut rng = StdRng::seed_from_u64(seed);
    let disk = SimDisk::new();
    let want = {
        let o = open(&dir(), Config::default(), opts(&disk)).unwrap();
        let store = o.store;
        let c = Client::root(Arc::new(o.fs));
        c.create_dir("/keep").unwrap();
        for i in 0..6 {
            c.write(format!("/keep/k{i}"), bytes(&mut rng, 30_000 + i * 20_000))
                .unwrap();
        }
        setx(&c, "/keep/k1", b"user.x", b"y");
        c.hard_link("/keep/k2", "/k2-link").unwrap();
        let chunk = bytes(&mut rng, 1 << 20);
        for i in 0..68 {
            c.write(format!("/gone{i}"), &chunk).unwrap();
            // Interleave kept data so it sits after freed pages.
            if i % 12 == 0 {
                c.write(format!("/keep/late{i}"), &chunk[..70_000]).unwrap();
            }
        }
        store.checkpoint().unwrap();
        for i in 0..68 {
            c.remove_file(format!("/gone{i}")).unwrap();
        }
        store.checkpoint().unwrap();
        // Journal only, after the last checkpoint.
        c.write("/keep/journal-only", b"not in the checkpoint")
            .unwrap();
        c.remove_file("/keep/late24").unwrap();
        c.truncate("/keep/k5", 100).unwrap();
        store.sync().unwrap();
        let t = dump(c.fs(), true);
        close(c, store);
        t
    };
    let big = ckpt_len(&disk);
    assert!(big > 64 << 20, "setup: checkpoint only {big}");
    (disk, want)
}

/// The open-time compaction: > 64 MiB of deleted data in the checkpoint; a power cut at
/// every flush of it (checked at once, so as not to keep a 100 MiB image per flush).
#[test]
fn open_time_auto_compaction() {
    let s = seed::seed("open_time_auto_compaction");
    let (disk, want) = big_store(s ^ 5);
    let big = ckpt_len(&disk);
    eprintln!("checkpoint {big} bytes before open");
    // How many flushes does the open-time compaction take? Check ~8 of them, spread.
    let probe = disk.crash(Unflushed::Kept);
    let _ = reopen_dump(&probe, "probe");
    let total = probe.syncs();
    drop(probe);
    let step = (total / 4).max(1);
    eprintln!("open with compaction takes {total} flushes; checking every {step}th");
    let img0 = disk.crash(Unflushed::Kept);
    let failures: Arc<Mutex<Vec<String>>> = Default::default();
    let f = failures.clone();
    let w = want.clone();
    let mut k = 0u64;
    img0.on_sync(move |d, at| {
        k += 1;
        if k % step != step / 2 && k != total {
            return;
        }
        let m = match (k / step) % 3 {
            0 => Unflushed::Lost,
            1 => Unflushed::Kept,
            _ => Unflushed::Torn(s ^ k),
        };
        let img = d.crash(m);
        let what = format!("crash at flush {k} ({at:?}, {m:?}) of an open-time compaction");
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            assert_same_tree(&what, &w, &reopen_dump(&img, &what));
        }));
        if let Err(e) = r {
            f.lock().unwrap().push(panic_msg(e));
        }
    });
    let t0 = std::time::Instant::now();
    let got = reopen_dump(&img0, "auto compaction open (with crash checks)");
    img0.clear_hook();
    eprintln!("open with crash checks took {:?}", t0.elapsed());
    assert_same_tree("auto compaction open (crash copy)", &want, &got);
    let f = failures.lock().unwrap();
    assert!(
        f.is_empty(),
        "{} crash images failed:\n{}",
        f.len(),
        f[..f.len().min(3)].join("\n---\n")
    );
    drop(f);

    let got = reopen_dump(&disk, "auto compaction open");
    assert_same_tree("auto compaction open", &want, &got);
    let small = ckpt_len(&disk);
    eprintln!("checkpoint {small} bytes after open");
    assert!(small < big / 2, "open did not compact: {big} -> {small}");
    assert_same_tree("after auto compaction", &want, &reopen_dump(&disk, "again"));
}

/// Host errors during the open-time compaction: the open goes on (or fails cleanly), never
/// loses data, and the healthy store opens the same and compacts.
#[test]
fn open_time_compaction_host_errors() {
    let s = seed::seed("open_time_compaction_host_errors");
    let (base, want) = big_store(s ^ 7);
    let big = ckpt_len(&base);
    let cp = dir().join("checkpoint.redb");
    let mut failures = Vec::new();
    // ENOSPC from the start: nothing may grow.
    {
        let disk = base.crash(Unflushed::Kept);
        disk.set_space(Some(disk.used()));
        let what = "open-time compaction with a full host";
        if let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let o = opts(&disk);
            let opened = open(&dir(), Config::default(), o);
            match opened {
                Ok(op) => {
                    assert_same_tree(what, &want, &dump(&op.fs, true));
                    drop(op.fs);
                    let _ = op.store.close();
                }
                Err(e) => eprintln!("{what}: open refused: {e}"),
            }
        })) {
            failures.push(format!("{what}: panicked: {}", panic_msg(e)));
        }
        disk.set_space(None);
        assert_same_tree(what, &want, &reopen_dump(&disk, what));
        assert!(ckpt_len(&disk) < big / 2, "healthy open did not compact");
    }
    for fault in [Fault::Eio, Fault::FileFull, Fault::Space] {
        for k in [2u64, 6] {
            let disk = base.crash(Unflushed::Kept);
            let dur = if k % 2 == 0 { 2 } else { u64::MAX };
            inject(&disk, &cp, fault, k, dur);
            let what = format!("open-time compaction, {fault:?} from flush {k} for {dur}");
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                match open(&dir(), Config::default(), opts(&disk)) {
                    Ok(op) => {
                        let t = dump(&op.fs, true);
                        drop(op.fs);
                        let _ = op.store.close();
                        Some(t)
                    }
                    Err(e) => {
                        eprintln!("{what}: open refused: {e}");
                        None
                    }
                }
            }));
            heal(&disk);
            match r {
                Err(e) => {
                    failures.push(format!("{what}: open panicked: {}", panic_msg(e)));
                    continue;
                }
                Ok(Some(t)) => {
                    if t != want {
                        failures.push(format!(
                            "{what}: the open that saw the fault served another filesystem:\n{}",
                            tree_diff(&want, &t)
                        ));
                    }
                }
                Ok(None) => {}
            }
            collect(&mut failures, || {
                if k == 2 {
                    let img = disk.crash(Unflushed::Lost);
                    assert_same_tree(&format!("{what} + crash"), &want, &reopen_dump(&img, &what));
                }
                assert_same_tree(&what, &want, &reopen_dump(&disk, &what));
            });
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures[..failures.len().min(5)].join("\n---\n")
    );
}

/// A power cut while the store was being used (journal with a torn tail), then compaction:
/// the image must open the same before and after compacting it.
#[test]
fn compact_after_crash_in_use() {
    let s = seed::seed("compact_after_crash_in_use");
    let disk = SimDisk::new();
    let images: Arc<Mutex<Vec<(u64, SimDisk)>>> = Default::default();
    let im = images.clone();
    let mut n = 0u64;
    disk.on_sync(move |d, at| {
        n += 1;
        if at == SyncPoint::After && n.is_multiple_of(9) {
            im.lock()
                .unwrap()
                .push((n, d.crash(Unflushed::Torn(s ^ n))));
        }
    });
    let _ = populate(&disk, s ^ 8, 1);
    disk.clear_hook();
    let images = std::mem::take(&mut *images.lock().unwrap());
    eprintln!("{} images", images.len());
    let mut failures = Vec::new();
    for (n, img) in images {
        let what = format!("crash at flush {n} while in use");
        collect(&mut failures, || {
            let before = reopen_dump(&img, &what);
            compact(&dir(), opts(&img)).unwrap_or_else(|e| panic!("{what}: compact: {e}"));
            assert_same_tree(
                &format!("{what}, compacted"),
                &before,
                &reopen_dump(&img, &what),
            );
        });
    }
    assert!(failures.is_empty(), "{}", failures.join("\n---\n"));
}

/// The real disk, in a temp dir under /tmp.
#[test]
fn real_disk_compact() {
    let s = seed::seed("real_disk_compact");
    let mut rng = StdRng::seed_from_u64(s ^ 6);
    let td = tempfile::tempdir_in("/tmp").unwrap();
    let d = td.path().join("store");
    let ro = || on_demand(host_opts(256 << 10, HOUR));
    let want = {
        let o = open(&d, Config::default(), ro()).unwrap();
        let store = o.store;
        let c = Client::root(Arc::new(o.fs));
        for i in 0..40 {
            c.write(format!("/f{i}"), bytes(&mut rng, 10_000 + i * 9_000))
                .unwrap();
        }
        c.hard_link("/f1", "/h1").unwrap();
        setx(&c, "/f2", b"user.a", b"b");
        write_at(&c, "/sparse", 7 << 20, b"x");
        store.checkpoint().unwrap();
        for i in 0..40 {
            if i % 3 != 0 {
                c.remove_file(format!("/f{i}")).unwrap();
            }
        }
        store.checkpoint().unwrap();
        c.remove_file("/f0").unwrap();
        c.write("/journal-only", b"j").unwrap();
        store.sync().unwrap();
        let t = dump(c.fs(), true);
        close(c, store);
        t
    };
    let len = |p: &Path| std::fs::metadata(p.join("checkpoint.redb")).unwrap().len();
    let l0 = len(&d);
    let r = compact(&d, ro()).expect("compact real");
    let l1 = len(&d);
    eprintln!("real: {r:?}, checkpoint {l0} -> {l1}");
    assert!(l1 < l0, "checkpoint did not shrink: {l0} -> {l1}");
    fsck::check(&d, &ro()).expect("fsck");
    let o = open(&d, Config::default(), ro()).unwrap();
    assert_same_tree("real disk", &want, &dump(&o.fs, true));
    // Locked while open.
    assert!(
        compact(&d, ro()).is_err(),
        "compacted a real store open elsewhere"
    );
    drop(o.fs);
    o.store.close().unwrap();
    compact(&d, ro()).expect("compact real twice");
    let o = open(&d, Config::default(), ro()).unwrap();
    assert_same_tree("real disk twice", &want, &dump(&o.fs, true));
    drop(o.fs);
    o.store.close().unwrap();
}
