//! Records replay to the filesystem that produced them.
//!
//! A store that keeps every record (encoded, in the order the engine appended them) is
//! given to a filesystem; random operations run on it from several threads; then a fresh
//! engine is built from the records alone (`Filesystem::recover`) and the two trees are
//! compared: names, readdir cookies and order, inode numbers and generations, types, modes,
//! owners, sizes, link counts, device numbers, symlink targets, file contents, extended
//! attributes, and (single-threaded) timestamps. Orphans, files unlinked while open and
//! `O_TMPFILE` files still unnamed, must be gone from the rebuilt tree, as after a crash.
//!
//! Seeds are printed; `LANEFS_SEED=<n>` replays a run's random choices.

mod common;

use std::sync::{Arc, Mutex};

use common::dump;

use lanefs::*;
use rand::{Rng, rngs::StdRng};

/// Keeps every record's bytes, in append order (one lock: appends are serialised in the
/// order the engine made them, which is what this test checks replays).
#[derive(Default)]
struct Recorder {
    records: Mutex<Vec<Vec<u8>>>,
}

impl Store for Recorder {
    fn append(&self, rec: &Record<'_>) -> Result<()> {
        let b = rec.to_bytes();
        assert_eq!(Record::decode(&b).as_ref(), Ok(rec), "round trip");
        self.records.lock().unwrap().push(b);
        Ok(())
    }
    fn sync(&self) -> Result<()> {
        Ok(())
    }
    fn durable(&self) -> bool {
        true
    }
}

fn cfg() -> Config {
    Config {
        max_bytes: Some(64 << 20),
        protected_hardlinks: true,
        ..Config::default()
    }
}

/// A filesystem rebuilt from `rec`'s records.
fn rebuild(rec: &Recorder) -> Filesystem {
    let mut r = Filesystem::recover(cfg(), Arc::new(MemoryStore));
    let records = rec.records.lock().unwrap();
    eprintln!("  {} records", records.len());
    assert!(records.len() > 200, "the workload changed almost nothing");
    let acls = records
        .iter()
        .filter(|b| matches!(Record::decode(b), Ok(Record::SetAcl { .. })))
        .count();
    eprintln!("  {acls} ACL changes");
    assert!(acls > 0, "the workload set no ACL");
    let count = |f: fn(&Record<'_>) -> bool| {
        records
            .iter()
            .filter(|b| Record::decode(b).is_ok_and(|r| f(&r)))
            .count()
    };
    let flags = count(|r| matches!(r, Record::SetFlags { .. }));
    let inherited = count(|r| matches!(r, Record::Create { flags, .. } if *flags != 0));
    let whiteouts = count(|r| matches!(r, Record::RenameWhiteout { .. }));
    let tmpfiles = count(|r| matches!(r, Record::Tmpfile { .. }));
    eprintln!(
        "  {flags} flag changes, {inherited} inheriting creates, {whiteouts} whiteouts, \
         {tmpfiles} tmpfiles"
    );
    // (A short run may draw no whiteout.)
    assert!(
        flags > 0 && (whiteouts > 0 && tmpfiles > 0 || records.len() < 1000),
        "the workload set no flag or made no whiteout or tmpfile"
    );
    for (i, b) in records.iter().enumerate() {
        let record = Record::decode(b).unwrap();
        r.apply(&record)
            .unwrap_or_else(|e| panic!("record {i} ({record:?}): {e}"));
    }
    r.finish().unwrap()
}

fn assert_same(live: &Filesystem, rebuilt: &Filesystem, with_times: bool, seed: u64) {
    let a = dump(live, with_times);
    // A few ticks of the coarse clock apart, so that any timestamp the dumps themselves set
    // differs (they read files with O_NOATIME, which must not set one).
    std::thread::sleep(std::time::Duration::from_millis(20));
    let b = dump(rebuilt, with_times);
    eprintln!("  {} names compared", a.len());
    assert!(
        a.len() > 20,
        "seed {seed}: the workload left almost nothing to compare"
    );
    for (p, n) in &a {
        match b.get(p) {
            Some(m) if m == n => {}
            other => panic!(
                "seed {seed}: {} differs:\n live    {n:?}\n rebuilt {other:?}",
                String::from_utf8_lossy(p)
            ),
        }
    }
    assert_eq!(
        a.len(),
        b.len(),
        "seed {seed}: rebuilt tree has extra names"
    );
    rebuilt
        .check_invariants()
        .unwrap_or_else(|e| panic!("seed {seed}: rebuilt tree: {e}"));
    assert_eq!(
        live.statfs().ffree,
        rebuilt.statfs().ffree,
        "seed {seed}: inode count"
    );
    assert_eq!(
        live.statfs().bfree,
        rebuilt.statfs().bfree,
        "seed {seed}: space used"
    );
}

/// One random operation on a small tree, through the path API as user `uid` or root.
fn random_op(c: &Client, rng: &mut StdRng, kept: &mut Vec<Fh>) {
    let d = rng.random_range(0..3);
    let name = |rng: &mut StdRng| match rng.random_range(0..3) {
        0 => format!("/d{d}/f{}", rng.random_range(0..6)),
        1 => format!("/d{d}/s{}", rng.random_range(0..3)),
        _ => format!(
            "/d{d}/s{}/f{}",
            rng.random_range(0..3),
            rng.random_range(0..4)
        ),
    };
    let (a, b) = (name(rng), name(rng));
    let flags = [0, RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_WHITEOUT][rng.random_range(0..4)];
    let _ = match rng.random_range(0..25) {
        0 | 1 => c.write(&a, vec![b'a' + d as u8; rng.random_range(0..9000)]),
        2 => c.create_dir(&a),
        3 => c.remove_file(&a),
        4 => c.remove_dir(&a),
        5 | 6 => c.rename_with_flags(&a, &b, flags),
        7 => c.hard_link(&a, &b),
        8 => c.symlink(&b, &a),
        9 => c.mknod(&a, libc::S_IFIFO | 0o640, 0),
        10 => c.set_permissions(&a, rng.random_range(0..0o7777)),
        11 => c.chown(
            &a,
            Some(rng.random_range(0..3)),
            Some(rng.random_range(0..3)),
        ),
        12 => c.truncate(&a, rng.random_range(0..20_000)),
        13 => c.set_times(
            &a,
            Some(TimeSet::At(Timespec::new(5, 6))),
            Some(TimeSet::Now),
        ),
        14 => c.metadata(&a).and_then(|m| {
            c.fs()
                .setxattr(c.ctx(), m.ino(), b"user.k", &[d as u8; 3], 0)
                .map_err(Into::into)
        }),
        15 => c.metadata(&a).and_then(|m| {
            c.fs()
                .removexattr(c.ctx(), m.ino(), b"user.k")
                .map_err(Into::into)
        }),
        16 => {
            // Keep a file open (its engine handle), so that a later unlink makes it an
            // orphan until closed.
            c.open(&a, OpenOptions::new().read(true).write(true))
                .map(|mut f| {
                    use std::io::Write;
                    let _ = f.write_all(b"orphan data");
                    kept.push(f.handle());
                    std::mem::forget(f);
                })
        }
        17 => {
            if let Some(fh) = kept.pop() {
                c.fs().release(fh).unwrap();
            }
            Ok(())
        }
        18 => c.open(&a, OpenOptions::new().write(true)).map(|f| {
            let off = rng.random_range(0..10_000);
            let len = rng.random_range(1..10_000);
            let fs = c.fs();
            let mode = [
                0,
                FALLOC_FL_KEEP_SIZE,
                FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
            ][rng.random_range(0..3)];
            let _ = fs.fallocate(c.ctx(), f.handle(), mode, off, len);
        }),
        19 | 20 => c.metadata(&a).and_then(|m| {
            // An access or default ACL with a named user, or one the mode bits express.
            let p = rng.random_range(0..8u16);
            let mut e = vec![
                (1u16, 6u16, u32::MAX),
                (4, p, u32::MAX),
                (0x20, 4, u32::MAX),
            ];
            if rng.random_bool(0.7) {
                e.insert(1, (2, p, 1));
                e.insert(3, (0x10, 7 - p, u32::MAX));
            }
            let name: &[u8] = match rng.random_bool(0.5) {
                true => b"system.posix_acl_access",
                false => b"system.posix_acl_default",
            };
            c.fs()
                .setxattr(c.ctx(), m.ino(), name, &acl(&e), 0)
                .map_err(Into::into)
        }),
        21 => c.metadata(&a).and_then(|m| {
            let name: &[u8] = match rng.random_bool(0.5) {
                true => b"system.posix_acl_access",
                false => b"system.posix_acl_default",
            };
            c.fs()
                .removexattr(c.ctx(), m.ino(), name)
                .map_err(Into::into)
        }),
        22 => c.metadata(&a).and_then(|m| {
            // Mostly 'd' and 'A' (which new inodes inherit) or none; sometimes 'i' or 'a',
            // which stop most changes until cleared.
            let f = [
                0,
                0,
                0,
                FS_NODUMP_FL,
                FS_NOATIME_FL | FS_NODUMP_FL,
                FS_IMMUTABLE_FL,
                FS_APPEND_FL,
            ][rng.random_range(0..7)];
            c.fs()
                .set_flags(c.ctx(), m.ino(), f)
                .map(drop)
                .map_err(Into::into)
        }),
        23 => {
            // An `O_TMPFILE` file in a's directory, written, then named a (which may be
            // taken: it stays unnamed), or kept open unnamed (freed when closed, or by
            // recovery), or made with O_EXCL (never named).
            let dir = &a[..a.rfind('/').expect("absolute")];
            let mut o = OpenOptions::new();
            o.read(true).write(true).mode(0o640);
            let excl = rng.random_bool(0.2);
            o.create_new(excl);
            c.open_tmpfile(dir, &o).map(|mut f| {
                use std::io::Write;
                let _ = f.write_all(&vec![b't'; rng.random_range(0..9000)]);
                let r = c.link_file(&f, &a);
                assert!(!excl || r.is_err(), "an O_EXCL tmpfile was linked");
                if rng.random_bool(0.3) {
                    kept.push(f.handle());
                    std::mem::forget(f);
                }
            })
        }
        _ => c.read(&a).map(drop),
    };
}

/// An ACL in the attribute value format.
fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

/// Runs the workload; returns the filesystem, its records, and the handles still open (some
/// of unlinked files: orphans, which the rebuilt filesystem does not have).
fn run(threads: u64, ops: usize, seed: u64) -> (Arc<Filesystem>, Arc<Recorder>, Vec<Fh>) {
    let rec = Arc::new(Recorder::default());
    let fs = Arc::new(Filesystem::recover(cfg(), rec.clone()).finish().unwrap());
    let root = Client::root(fs.clone());
    for d in 0..3 {
        root.create_dir(format!("/d{d}")).unwrap();
    }
    root.set_permissions("/d2", 0o1777).unwrap();
    let open = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let fs = fs.clone();
                s.spawn(move || {
                    let mut rng = common::seed::rng(seed ^ (t * 0x9E37_79B9));
                    let c = if t % 3 == 2 {
                        Client::new(fs, Ctx::user(1, 1).with_umask(0o022))
                    } else {
                        Client::root(fs)
                    };
                    let mut kept = Vec::new();
                    for _ in 0..ops {
                        random_op(&c, &mut rng, &mut kept);
                    }
                    // Half the files stay open until after the rebuild; the rest close now.
                    let half = kept.len() / 2;
                    for fh in kept.drain(half..) {
                        c.fs().release(fh).unwrap();
                    }
                    kept
                })
            })
            .collect();
        hs.into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    fs.check_invariants().unwrap();
    (fs, rec, open)
}

#[test]
fn one_thread_replays_exactly_including_times() {
    let seed = common::seed::seed("one_thread_replays_exactly_including_times");
    let (fs, rec, open) = run(1, 3000, seed);
    let rebuilt = rebuild(&rec);
    open.into_iter().for_each(|fh| fs.release(fh).unwrap());
    assert_same(&fs, &rebuilt, true, seed);
}

#[test]
fn many_threads_replay_to_the_same_tree() {
    let seed = common::seed::seed("many_threads_replay_to_the_same_tree");
    for round in 0..3 {
        let (fs, rec, open) = run(8, 1500, seed.wrapping_add(round));
        let rebuilt = rebuild(&rec);
        open.into_iter().for_each(|fh| fs.release(fh).unwrap());
        assert_same(&fs, &rebuilt, false, seed.wrapping_add(round));
    }
}

#[test]
fn a_rebuilt_filesystem_continues_without_reusing_ids_or_cookies() {
    let seed = common::seed::seed("a_rebuilt_filesystem_continues_without_reusing_ids_or_cookies");
    let (fs, rec, _open) = run(2, 500, seed);
    let rebuilt = Arc::new(rebuild(&rec));
    let before = dump(&rebuilt, false);
    let c = Client::root(rebuilt.clone());
    for i in 0..200 {
        c.write(format!("/d0/new{i}"), b"x").unwrap();
    }
    let after = dump(&rebuilt, false);
    for (p, n) in after.iter().filter(|(p, _)| !before.contains_key(*p)) {
        for m in before.values() {
            assert!(
                (n.ino, n.generation) != (m.ino, m.generation),
                "{} reuses an id",
                String::from_utf8_lossy(p)
            );
            assert!(n.generation != m.generation, "generation reused");
        }
    }
    let cookies: Vec<u64> = after
        .values()
        .map(|n| n.cookie)
        .filter(|&c| c != 0)
        .collect();
    let mut unique = cookies.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), cookies.len(), "a cookie handed out twice");
    rebuilt.check_invariants().unwrap();
    drop(fs);
}

/// A `RENAME_WHITEOUT`'s whiteout takes the source entry's cookie; a record that gives it a
/// cookie of its own (as lanefs wrote before that rule) still replays, the whiteout then
/// being a new entry at that cookie.
#[test]
fn whiteout_records_replay_with_the_sources_cookie_or_their_own() {
    let rec = Arc::new(Recorder::default());
    let fs = Arc::new(Filesystem::recover(cfg(), rec.clone()).finish().unwrap());
    let c = Client::root(fs.clone());
    c.create_dir("/d").unwrap();
    for n in ["a", "b"] {
        c.write(format!("/d/{n}"), b"x").unwrap();
    }
    let d = c.metadata("/d").unwrap().ino();
    let a = common::cookie_of(&fs, d, b"a");
    c.rename_with_flags("/d/a", "/d/z", RENAME_WHITEOUT)
        .unwrap();
    assert_eq!(
        common::cookie_of(&fs, d, b"a"),
        a,
        "the whiteout has the source's cookie"
    );
    let own = common::cookie_of(&fs, d, b"z") + 1000;
    let records = rec.records.lock().unwrap().clone();
    for old in [false, true] {
        let mut r = Filesystem::recover(cfg(), Arc::new(MemoryStore));
        for b in &records {
            let mut record = Record::decode(b).unwrap();
            if let Record::RenameWhiteout {
                whiteout_cookie, ..
            } = &mut record
            {
                assert_eq!(*whiteout_cookie, a);
                if old {
                    *whiteout_cookie = own;
                }
            }
            r.apply(&record).unwrap();
        }
        let rebuilt = Arc::new(r.finish().unwrap());
        rebuilt.check_invariants().unwrap();
        let want = if old { own } else { a };
        assert_eq!(common::cookie_of(&rebuilt, d, b"a"), want, "old: {old}");
        let mut live = dump(&fs, false);
        live.get_mut(&b"/d/a"[..]).unwrap().cookie = want;
        assert_eq!(live, dump(&rebuilt, false), "old: {old}");
        let names: Vec<_> = Client::root(rebuilt.clone())
            .read_dir("/d")
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names.len(), 3, "a (the whiteout), b, z: {names:?}");
    }
}
