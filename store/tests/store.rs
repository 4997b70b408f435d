//! The disk store as a user sees it: what is written comes back after a reopen, one server
//! at a time, fsyncs share flushes, damage is refused with the file and offset, and host
//! errors reach the caller.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::Duration;

use common::{HOUR, assert_same_tree, dump, opts, seed};
use lanefs::{Client, Config, Errno, OpenOptions, RENAME_EXCHANGE};
use lanefs_store::disk::{SimDisk, SyncPoint, Unflushed};
use lanefs_store::{Options, StoreError, fsck, open};
use rand::{Rng, SeedableRng, rngs::StdRng};

/// A store on `disk`, with small segments and a commit every 5 ms.
fn sim(disk: &SimDisk) -> Options {
    opts(disk, 64 << 10, Duration::from_millis(5))
}

/// A store on `disk` whose flushes take a millisecond, as on a real device, and whose rounds
/// run only when someone syncs.
fn slow_flush_store(disk: &SimDisk) -> lanefs_store::Opened {
    let o = open(Path::new("/s"), Config::default(), {
        opts(disk, 64 << 10, HOUR)
    })
    .unwrap();
    disk.on_sync(|_, at| {
        if at == SyncPoint::Before {
            std::thread::sleep(Duration::from_millis(1));
        }
    });
    o
}

/// Random work from several threads over a few shared directories.
fn workload(fs: &Arc<lanefs::Filesystem>, threads: u64, ops: usize, seed: u64) {
    let c = Client::root(fs.clone());
    for d in 0..3 {
        let _ = c.create_dir(format!("/d{d}"));
    }
    std::thread::scope(|s| {
        for t in 0..threads {
            let fs = fs.clone();
            s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ (t * 0x9E37_79B9));
                let c = Client::root(fs);
                for _ in 0..ops {
                    let p = |rng: &mut StdRng| {
                        format!("/d{}/n{}", rng.random_range(0..3), rng.random_range(0..20))
                    };
                    let (a, b) = (p(&mut rng), p(&mut rng));
                    let _ = match rng.random_range(0..10) {
                        0..=2 => c.write(&a, vec![t as u8; rng.random_range(0..6000)]),
                        3 => c.remove_file(&a),
                        4 => c.rename(&a, &b),
                        5 => c.rename_with_flags(&a, &b, RENAME_EXCHANGE),
                        6 => c.hard_link(&a, &b),
                        7 => c.create_dir(&a),
                        8 => c.set_permissions(&a, rng.random_range(0..0o777)),
                        _ => c.metadata(&a).and_then(|m| {
                            c.fs()
                                .setxattr(c.ctx(), m.ino(), b"user.t", &[t as u8], 0)
                                .map_err(Into::into)
                        }),
                    };
                }
            });
        }
    });
}

#[test]
fn a_reopened_store_holds_the_same_tree_on_a_real_disk() {
    let dir = tempfile::tempdir().unwrap();
    let seed = seed::seed("a_reopened_store_holds_the_same_tree_on_a_real_disk");
    let o = open(dir.path(), Config::default(), Options::default()).unwrap();
    assert!(o.report.created);
    let fs = Arc::new(o.fs);
    workload(&fs, 4, 1500, seed);
    let before = dump(&fs, true);
    assert!(before.len() > 20);
    drop(fs);
    o.store.close().unwrap();
    let o = open(dir.path(), Config::default(), Options::default()).unwrap();
    assert!(!o.report.created);
    assert!(o.report.replayed > 1000, "{:?}", o.report);
    assert!(!o.report.torn_tail);
    let after = dump(&o.fs, true);
    assert_same_tree(&format!("seed {seed}: reopened"), &before, &after);
    o.fs.check_invariants().unwrap();
    // It keeps working, and a second reopen sees both sessions' changes.
    let fs = Arc::new(o.fs);
    workload(&fs, 2, 500, seed ^ 1);
    let before = dump(&fs, true);
    drop(fs);
    drop(o.store);
    let o = open(dir.path(), Config::default(), Options::default()).unwrap();
    assert_same_tree(
        &format!("seed {seed}: second reopen"),
        &before,
        &dump(&o.fs, true),
    );
}

#[test]
fn a_second_server_is_refused_until_the_first_closes() {
    let dir = tempfile::tempdir().unwrap();
    let o = open(dir.path(), Config::default(), Options::default()).unwrap();
    match open(dir.path(), Config::default(), Options::default()) {
        Err(e @ StoreError::Locked { .. }) => {
            let StoreError::Locked { path, holder } = &e else {
                unreachable!()
            };
            assert_eq!(path, &dir.path().join("lanefs.lock"));
            // The refusal names the process holding the store and what it does.
            assert_eq!(
                holder,
                &Some(lanefs_store::Holder {
                    pid: Some(std::process::id()),
                    note: "opened".into()
                })
            );
            assert!(
                e.to_string().ends_with(&format!(
                    "in use by process {} (opened)",
                    std::process::id()
                )),
                "{e}"
            );
        }
        r => panic!("second open: {r:?}"),
    }
    o.store.note_holder("serving /mnt").unwrap();
    match open(dir.path(), Config::default(), Options::default()) {
        Err(StoreError::Locked {
            holder: Some(h), ..
        }) => assert_eq!(h.note, "serving /mnt"),
        r => panic!("second open: {r:?}"),
    }
    drop(o);
    open(dir.path(), Config::default(), Options::default()).unwrap();
}

/// `fsck` and `compact` of a directory that holds no store say what the directory is, and
/// leave it as it was (no lock file made in an empty one).
#[test]
fn fsck_and_compact_say_what_a_directory_without_a_store_is() {
    let dir = tempfile::tempdir().unwrap();
    let opts = Options::default();
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let missing = dir.path().join("missing");
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    for (d, what) in [
        (&empty, "no lanefs.store"),
        (&missing, "no such directory"),
        (&file, "not a directory"),
    ] {
        let want = format!("{}: not a lanefs store: {what}", d.display());
        for e in [
            fsck::check(d, &opts).unwrap_err(),
            fsck::repair(d, &opts).unwrap_err(),
            lanefs_store::compact(d, opts.clone()).unwrap_err(),
        ] {
            assert!(matches!(e, StoreError::NotAStore { .. }), "{e}");
            assert_eq!(e.to_string(), want);
        }
    }
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0);
    assert!(!missing.exists());
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
}

#[test]
fn not_a_store_and_unknown_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("lanefs.store"), b"something else").unwrap();
    let e = open(dir.path(), Config::default(), Options::default()).unwrap_err();
    assert!(matches!(e, StoreError::NotAStore { .. }), "{e}");
    assert!(e.to_string().contains("lanefs.store"), "{e}");
}

/// Many threads fsyncing at once are served by fewer flushes than fsyncs, and every fsync
/// that returned survives a power cut.
#[test]
fn concurrent_fsyncs_share_flushes() {
    let disk = SimDisk::new();
    let o = slow_flush_store(&disk);
    let fs = Arc::new(o.fs);
    let before = disk.syncs();
    let fsyncs = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..8 {
            let (fs, fsyncs) = (fs.clone(), &fsyncs);
            s.spawn(move || {
                let c = Client::root(fs);
                for k in 0..40 {
                    let f = c
                        .open(
                            format!("/t{t}-{k}"),
                            OpenOptions::new().write(true).create_new(true),
                        )
                        .unwrap();
                    f.sync_all().unwrap();
                    fsyncs.fetch_add(1, SeqCst);
                }
            });
        }
    });
    disk.clear_hook();
    let flushes = disk.syncs() - before;
    let fsyncs = fsyncs.load(SeqCst);
    eprintln!("{fsyncs} fsyncs, {flushes} flushes");
    assert_eq!(fsyncs, 320);
    assert!(
        flushes < fsyncs * 3 / 4,
        "{flushes} flushes for {fsyncs} fsyncs"
    );
    let crashed = disk.crash(Unflushed::Lost);
    drop(fs);
    drop(o.store);
    let o = open(Path::new("/s"), Config::default(), sim(&crashed)).unwrap();
    let c = Client::root(Arc::new(o.fs));
    assert_eq!(c.read_dir("/").unwrap().len(), 320);
}

/// `fsync_inode_then` (what the mount answers FSYNC with): the callback comes once the
/// change is durable, never before (a power cut right after it keeps the file), many
/// callbacks share flushes, and after the store stops they get its error.
#[test]
fn fsync_callbacks_come_after_the_flush_and_share_it() {
    let disk = SimDisk::new();
    let o = slow_flush_store(&disk);
    let fs = Arc::new(o.fs);
    let c = Client::root(fs.clone());
    let before = disk.syncs();
    let (tx, rx) = std::sync::mpsc::channel();
    for k in 0..64 {
        c.write(format!("/f{k}"), format!("{k}")).unwrap();
        let ino = c.metadata(format!("/f{k}")).unwrap().ino();
        // The power is cut as soon as the callback says durable: the file must survive.
        let (tx, disk) = (tx.clone(), disk.clone());
        fs.fsync_inode_then(
            ino,
            false,
            Box::new(move |r| {
                let image = r.is_ok().then(|| disk.crash(Unflushed::Lost));
                tx.send((k, r, image)).unwrap();
            }),
        );
    }
    drop(tx);
    let mut acked = 0;
    for (k, r, image) in rx.iter() {
        assert_eq!(r, Ok(()), "fsync of /f{k}");
        let o = open(Path::new("/s"), Config::default(), sim(&image.unwrap())).unwrap();
        let c = Client::root(Arc::new(o.fs));
        assert_eq!(c.read_to_string(format!("/f{k}")).unwrap(), format!("{k}"));
        acked += 1;
    }
    assert_eq!(acked, 64);
    let flushes = disk.syncs() - before;
    assert!(flushes < 64, "{flushes} flushes for 64 callbacks");
    // A stopped store answers at once with its error.
    disk.clear_hook();
    disk.set_failing(true);
    c.write("/g", b"x").ok();
    let (tx, rx) = std::sync::mpsc::channel();
    let root = c.metadata("/").unwrap().ino();
    fs.fsync_inode_then(root, false, Box::new(move |r| tx.send(r).unwrap()));
    // (At once; the limit, 120 s, only ends a test whose callback never comes.)
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(120)).unwrap(),
        Err(Errno::EIO)
    );
    let (tx, rx) = std::sync::mpsc::channel();
    fs.fsync_inode_then(root, false, Box::new(move |r| tx.send(r).unwrap()));
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(120)).unwrap(),
        Err(Errno::EIO)
    );
}

/// An fsync with nothing appended since a flush covered everything returns without a
/// flush (through a handle, by inode, and by callback); once any thread appends, the next
/// fsync of the same clean file flushes, and what that thread did survives a power cut
/// after it (everything that completed before an fsync is durable, not only its file).
#[test]
fn an_fsync_with_nothing_to_commit_costs_no_flush() {
    let disk = SimDisk::new();
    let o = slow_flush_store(&disk);
    let fs = Arc::new(o.fs);
    let c = Client::root(fs.clone());
    c.write("/a", b"a").unwrap();
    let ino = c.metadata("/a").unwrap().ino();
    let f = c.open("/a", OpenOptions::new().read(true)).unwrap();
    f.sync_all().unwrap();
    let before = disk.syncs();
    for _ in 0..50 {
        f.sync_all().unwrap();
        fs.fsync_inode(ino, true).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        fs.fsync_inode_then(ino, false, Box::new(move |r| tx.send(r).unwrap()));
        assert_eq!(rx.try_recv(), Ok(Ok(())), "answered at once");
    }
    assert_eq!(
        disk.syncs(),
        before,
        "flushes for fsyncs with nothing to commit"
    );
    for k in 0..3 {
        // Another thread's change, completed before the fsync of the (clean) file `/a`.
        let c2 = Client::root(fs.clone());
        std::thread::spawn(move || c2.write(format!("/b{k}"), b"b").unwrap())
            .join()
            .unwrap();
        let n = disk.syncs();
        f.sync_all().unwrap();
        assert!(disk.syncs() > n, "no flush for another thread's change");
        let image = disk.crash(Unflushed::Lost);
        let o = open(Path::new("/s"), Config::default(), sim(&image)).unwrap();
        let c = Client::root(Arc::new(o.fs));
        assert_eq!(c.read(format!("/b{k}")).unwrap(), b"b");
    }
    // The file's own change, made by this thread: flushed too.
    c.write("/a", b"aa").unwrap();
    let n = disk.syncs();
    fs.fsync_inode(ino, false).unwrap();
    assert!(disk.syncs() > n, "no flush for the file's own change");
}

/// A change no one syncs is flushed once it has waited the flush interval, so that a power
/// cut loses at most about that much; with an interval longer than the test, it is not.
#[test]
fn unsynced_changes_are_flushed_after_the_flush_interval() {
    for (interval, flushed) in [
        (Duration::from_millis(200), true),
        (Duration::from_secs(3600), false),
    ] {
        let disk = SimDisk::new();
        let mut opts = sim(&disk);
        opts.flush_interval = interval;
        let o = open(Path::new("/s"), Config::default(), opts).unwrap();
        let c = Client::root(Arc::new(o.fs));
        let before = o.store.counters().flushes;
        c.write("/unsynced", b"x").unwrap();
        let survives = || {
            let image = disk.crash(Unflushed::Lost);
            let mut opts = sim(&image);
            opts.commit_interval = Duration::from_secs(3600);
            let o = open(Path::new("/s"), Config::default(), opts).unwrap();
            Client::root(Arc::new(o.fs)).read("/unsynced").is_ok()
        };
        // Polled, for a slow machine: the flush is due 200 ms after the write's round; the
        // test waits for it (up to 120 s, which only ends a test whose flush never comes).
        // Where no flush is due, 1 s of none is what it checks.
        let t0 = std::time::Instant::now();
        let mut survived = survives();
        while !survived && t0.elapsed() < Duration::from_secs(if flushed { 120 } else { 1 }) {
            std::thread::sleep(Duration::from_millis(100));
            survived = survives();
        }
        assert_eq!(
            survived, flushed,
            "flush interval {interval:?}: the unsynced file after a power cut"
        );
        assert_eq!(
            o.store.counters().flushes > before,
            flushed,
            "flush interval {interval:?}: flushes without a sync"
        );
    }
}

/// A store on a simulated disk with fifty small files, each synced, then dropped without a
/// close: the disk.
fn fifty_synced_files() -> SimDisk {
    let disk = SimDisk::new();
    let o = open(Path::new("/s"), Config::default(), sim(&disk)).unwrap();
    let c = Client::root(Arc::new(o.fs));
    for k in 0..50 {
        c.write(format!("/f{k}"), vec![k as u8; 300]).unwrap();
        c.fs().sync_all().unwrap();
    }
    drop(c);
    drop(o.store);
    disk
}

#[test]
fn journal_damage_is_refused_naming_the_file_and_offset() {
    let disk = fifty_synced_files();
    let (path, mut bytes) = disk
        .files()
        .into_iter()
        .find(|(p, _)| p.ends_with("journal/0000000000000001.seg"))
        .unwrap();
    bytes[2000] ^= 0x40;
    disk.put(&path, bytes);
    match open(Path::new("/s"), Config::default(), sim(&disk)) {
        Err(StoreError::Damaged {
            path: p, offset, ..
        }) => {
            assert_eq!(p, path);
            assert!(offset <= 2000 && offset > 1000, "offset {offset}");
        }
        r => panic!("{r:?}"),
    }
}

/// EIO from the host stops the store for good (as ext4's errors=remount-ro): the error
/// reaches the callers, every later change and sync gets EIO even once the host works again,
/// `close` reports it, and what was made durable before survives. (Running out of space is
/// not fatal: tests/out_of_space.rs.)
#[test]
fn an_io_error_stops_the_store_and_the_durable_prefix_survives() {
    let disk = SimDisk::new();
    let o = open(Path::new("/s"), Config::default(), sim(&disk)).unwrap();
    let c = Client::root(Arc::new(o.fs));
    c.write("/kept", b"durable").unwrap();
    c.fs().sync_all().unwrap();
    disk.set_failing(true);
    let mut seen = None;
    for k in 0..2000 {
        if let Err(e) = c.write(format!("/f{k}"), vec![1u8; 1000]) {
            seen = Some(e);
            break;
        }
        if let Err(e) = c.fs().sync_all() {
            seen = Some(std::io::Error::from_raw_os_error(e.0));
            break;
        }
    }
    let e = seen.expect("an error");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    // Reads still work; changes are refused with the same errno.
    assert_eq!(c.read("/kept").unwrap(), b"durable");
    let e = c.write("/later", b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO));
    assert!(!c.exists("/later"));
    // The host working again does not restart the store.
    disk.set_failing(false);
    let e = c.create_dir("/later").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO));
    assert_eq!(c.fs().sync_all(), Err(Errno::EIO));
    drop(c);
    assert_eq!(o.store.close(), Err(Errno::EIO));
    for d in [disk.crash(Unflushed::Lost), disk] {
        let o = open(Path::new("/s"), Config::default(), sim(&d)).unwrap();
        let c = Client::root(Arc::new(o.fs));
        assert_eq!(c.read("/kept").unwrap(), b"durable");
        assert!(!c.exists("/later"));
        c.fs().check_invariants().unwrap();
        c.write("/after", b"works").unwrap();
        c.fs().sync_all().unwrap();
    }
}

/// `fsck` finds the damage `open` refuses; `--repair` keeps the records before it, which
/// then open, and a repaired store checks clean.
#[test]
fn fsck_finds_damage_and_repair_keeps_the_prefix() {
    let disk = fifty_synced_files();
    let clean = lanefs_store::fsck::check(Path::new("/s"), &sim(&disk)).unwrap();
    assert!(clean.records > 100 && !clean.torn_tail, "{clean:?}");
    let (path, mut bytes) = disk
        .files()
        .into_iter()
        .find(|(p, _)| p.ends_with("journal/0000000000000001.seg"))
        .unwrap();
    bytes[6000] ^= 0x40;
    disk.put(&path, bytes);
    let e = lanefs_store::fsck::check(Path::new("/s"), &sim(&disk)).unwrap_err();
    assert!(matches!(e, StoreError::Damaged { .. }), "{e}");
    let r = lanefs_store::fsck::repair(Path::new("/s"), &sim(&disk)).unwrap();
    eprintln!("{r:?}");
    assert!(r.cut_at.is_some() && r.dropped_bytes > 0);
    let after = lanefs_store::fsck::check(Path::new("/s"), &sim(&disk)).unwrap();
    assert_eq!(after.records, r.kept);
    let o = open(Path::new("/s"), Config::default(), sim(&disk)).unwrap();
    let c = Client::root(Arc::new(o.fs));
    let mut names: Vec<String> = c
        .read_dir("/")
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8(e.name).unwrap())
        .collect();
    names.sort_by_key(|n| n[1..].parse::<u32>().unwrap());
    assert!(
        !names.is_empty() && names.len() < 50,
        "{} files kept",
        names.len()
    );
    for (k, n) in names.iter().enumerate() {
        assert_eq!(*n, format!("f{k}"), "the kept files are a prefix");
        assert_eq!(c.read(format!("/{n}")).unwrap(), vec![k as u8; 300]);
    }
    // The repaired store takes new changes and keeps them.
    c.write("/new", b"after repair").unwrap();
    c.fs().sync_all().unwrap();
    drop(c);
    drop(o.store);
    let o = open(Path::new("/s"), Config::default(), sim(&disk)).unwrap();
    assert_eq!(
        Client::root(Arc::new(o.fs)).read("/new").unwrap(),
        b"after repair"
    );
}

/// A store on a small host uses smaller segments: a thirty-second of the host, a power of
/// two, at least 8 MiB, never above what `Options::segment_size` allows.
#[test]
fn segments_shrink_on_a_small_host() {
    use lanefs_store::segment_size;
    const M: u64 = 1 << 20;
    assert_eq!(segment_size(64 * M, None), 64 * M);
    assert_eq!(segment_size(64 * M, Some(96 * M)), 4 * M);
    assert_eq!(segment_size(64 * M, Some(320 * M)), 8 * M);
    assert_eq!(segment_size(64 * M, Some(1000 * M)), 16 * M);
    assert_eq!(segment_size(64 * M, Some(2048 * M)), 64 * M);
    assert_eq!(segment_size(64 * M, Some(1 << 40)), 64 * M);
    assert_eq!(segment_size(64 * M, Some(8 * M)), 4 * M);
    assert_eq!(segment_size(256 << 10, Some(8 * M)), 256 << 10);
    assert_eq!(segment_size(64 * M, Some(0)), 4 * M);
}

/// A growing truncate keeps the pages `fallocate(FALLOC_FL_KEEP_SIZE)` gave past the end, in
/// the live filesystem, in the journal's replay and in the checkpoint (the two ways a reopen
/// rebuilds a file), as tmpfs does.
#[test]
fn pages_fallocated_past_the_end_survive_a_growing_truncate_and_a_reopen() {
    let disk = SimDisk::new();
    let ctx = lanefs::Ctx::root();
    let truncate = |fs: &lanefs::Filesystem, ino, size| {
        let set = lanefs::SetAttr {
            size: Some(size),
            ..Default::default()
        };
        fs.setattr(&ctx, ino, &set, None).unwrap()
    };
    for checkpointed in [false, true] {
        let o = open(Path::new("/s"), Config::default(), sim(&disk)).unwrap();
        let name = format!("f{checkpointed}");
        let (a, fh) =
            o.fs.create(
                &ctx,
                lanefs::ROOT_INO,
                name.as_bytes(),
                0o100644,
                libc::O_RDWR,
            )
            .unwrap();
        o.fs.fallocate(&ctx, fh, libc::FALLOC_FL_KEEP_SIZE, 0, 16 * 4096)
            .unwrap();
        o.fs.release(fh).unwrap();
        assert_eq!(truncate(&o.fs, a.ino, 4 * 4096).blocks, 16 * 8);
        if checkpointed {
            o.store.checkpoint().unwrap();
        }
        o.store.close().unwrap();
        let o = open(Path::new("/s"), Config::default(), sim(&disk)).unwrap();
        let again =
            o.fs.lookup(&ctx, lanefs::ROOT_INO, name.as_bytes())
                .unwrap();
        assert_eq!(
            (again.size, again.blocks),
            (4 * 4096, 16 * 8),
            "reopened (checkpointed: {checkpointed})"
        );
        assert_eq!(truncate(&o.fs, again.ino, 4096 + 1).blocks, 2 * 8);
        o.store.close().unwrap();
    }
}
