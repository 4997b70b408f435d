//! Concurrency stress tests: many more threads than cores working in a few shared
//! directories, then whole-tree invariant checks; plus targeted races (rename over a looked-up
//! target, readdir under churn, many renames of one source, rmdir against creates).
//!
//! Seeds are printed; `LANEFS_SEED=<n>` replays the random choices (thread interleaving is up
//! to the scheduler).

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::{Arc, Barrier};

use lanefs::{
    Client, Config, Ctx, Errno, Filesystem, LockClass, Locking, OpenOptions, RENAME_EXCHANGE,
    RENAME_NOREPLACE, RENAME_WHITEOUT, ROOT_INO,
};
use rand::{Rng, rngs::StdRng};

/// Sets a stop flag when dropped, so helper threads end even when the main thread panics
/// (otherwise the thread scope would wait for them forever).
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Relaxed);
    }
}

fn fs(locking: Locking) -> Arc<Filesystem> {
    Arc::new(Filesystem::new(Config {
        locking,
        ..Config::default()
    }))
}

/// Every lanefs error a random operation may legitimately meet.
fn expected(e: &std::io::Error) -> bool {
    let ok = [
        Errno::ENOENT,
        Errno::EEXIST,
        Errno::ENOTDIR,
        Errno::EISDIR,
        Errno::ENOTEMPTY,
        Errno::EINVAL,
        Errno::EPERM,
    ];
    ok.iter().any(|x| e.raw_os_error() == Some(x.0))
}

/// 24 threads do random operations in four shared directories (with subdirectories moving
/// between them), then the whole tree must satisfy every invariant.
#[test]
fn random_operations_from_many_threads_keep_invariants() {
    let seed = common::seed::seed("random_operations_from_many_threads_keep_invariants");
    for locking in Locking::ALL {
        let fs = fs(locking);
        let root = Client::root(fs.clone());
        for d in ["/s0", "/s1", "/s2", "/s3"] {
            root.create_dir(d).unwrap();
        }
        let ops = AtomicU64::new(0);
        std::thread::scope(|s| {
            for t in 0..24u64 {
                let (fs, ops) = (fs.clone(), &ops);
                s.spawn(move || {
                    let mut rng = common::seed::rng(seed ^ (t * 0x9E37_79B9));
                    let c = Client::root(fs);
                    let name = |rng: &mut StdRng| {
                        let d = rng.random_range(0..4);
                        match rng.random_range(0..3) {
                            0 => format!("/s{d}/n{}", rng.random_range(0..12)),
                            1 => format!("/s{d}/dir{}", rng.random_range(0..4)),
                            _ => format!(
                                "/s{d}/dir{}/n{}",
                                rng.random_range(0..4),
                                rng.random_range(0..6)
                            ),
                        }
                    };
                    for _ in 0..1500 {
                        let (a, b) = (name(&mut rng), name(&mut rng));
                        let op = rng.random_range(0..12);
                        let r = match op {
                            0 | 1 => c
                                .open(&a, OpenOptions::new().write(true).create_new(true))
                                .map(drop),
                            2 => c.create_dir(&a),
                            3 => c.remove_file(&a),
                            4 => c.remove_dir(&a),
                            5 | 6 => c.rename(&a, &b),
                            7 => c.hard_link(&a, &b),
                            8 => c.write(&a, vec![1u8; rng.random_range(0..9000)]),
                            // Mode and ACL changes, which must keep the two in step.
                            9 => c.set_permissions(&a, rng.random_range(0..0o1000)),
                            10 => c.metadata(&a).and_then(|m| {
                                let p = rng.random_range(0..8u16);
                                let v = common::named_user_acl(1, p, rng.random_range(0..8));
                                let name: &[u8] = match m.is_dir() && rng.random_bool(0.5) {
                                    false => b"system.posix_acl_access",
                                    true => b"system.posix_acl_default",
                                };
                                c.fs()
                                    .setxattr(c.ctx(), m.ino(), name, &v, 0)
                                    .map_err(Into::into)
                            }),
                            _ => c.read_dir(&a).map(drop),
                        };
                        if let Err(e) = r {
                            // A directory found by `metadata` may be replaced by a file
                            // before the default ACL is set: EACCES, as Linux says.
                            let raced_acl = op == 10 && e.raw_os_error() == Some(libc::EACCES);
                            assert!(
                                expected(&e) || raced_acl,
                                "[{}] unexpected error {e:?} on {a} {b}",
                                locking.name()
                            );
                        } else {
                            ops.fetch_add(1, Relaxed);
                        }
                    }
                });
            }
        });
        let report = fs
            .check_invariants()
            .unwrap_or_else(|e| panic!("[{}] seed {seed}:\n{e}", locking.name()));
        let ops = ops.load(Relaxed);
        eprintln!("  [{}] {ops} successful ops; {report:?}", locking.name());
        assert!(
            ops > 24 * 1500 / 10,
            "too few operations succeeded ({ops}): the test is not exercising much"
        );
        assert_eq!(fs.open_handles(), 0);
    }
}

/// A file renamed over an existing target is never seen missing by lookups of the target.
#[test]
fn rename_over_target_is_never_seen_missing() {
    for locking in Locking::ALL {
        let fs = fs(locking);
        let c = Client::root(fs.clone());
        c.create_dir("/d").unwrap();
        c.write("/d/target", b"0").unwrap();
        let d = c.metadata("/d").unwrap().ino();
        let stop = AtomicBool::new(false);
        let seen = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..3 {
                let (fs, stop, seen) = (&fs, &stop, &seen);
                s.spawn(move || {
                    let ctx = Ctx::root();
                    while !stop.load(Relaxed) {
                        match fs.lookup(&ctx, d, b"target") {
                            Ok(_) => {
                                seen.fetch_add(1, Relaxed);
                            }
                            Err(e) => panic!("[{}] target missing: {e:?}", locking.name()),
                        }
                    }
                });
            }
            let _stop = StopOnDrop(&stop);
            for i in 0..20_000 {
                let tmp = format!("/d/tmp{}", i % 7);
                c.write(&tmp, i.to_string()).unwrap();
                c.rename(&tmp, "/d/target").unwrap();
            }
            stop.store(true, Relaxed);
        });
        assert!(
            seen.load(Relaxed) > 1000,
            "lookups ran: {}",
            seen.load(Relaxed)
        );
        assert_eq!(c.read_to_string("/d/target").unwrap(), "19999");
        fs.check_invariants().unwrap();
    }
}

/// A readdir that runs while other threads create and unlink names returns every entry that
/// exists throughout exactly once (and nothing twice).
#[test]
fn readdir_during_churn_returns_each_surviving_entry_once() {
    let fs = fs(Locking::Lanes);
    let c = Client::root(fs.clone());
    c.create_dir("/d").unwrap();
    for i in 0..600 {
        c.write(format!("/d/stable{i}"), b"").unwrap();
    }
    let d = c.metadata("/d").unwrap().ino();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..4 {
            let (fs, stop) = (fs.clone(), &stop);
            s.spawn(move || {
                let c = Client::root(fs);
                let mut i = 0u64;
                while !stop.load(Relaxed) {
                    let n = format!("/d/churn{t}-{}", i % 50);
                    let _ = c.write(&n, b"x");
                    let _ = c.remove_file(format!("/d/churn{t}-{}", (i + 25) % 50));
                    i += 1;
                }
            });
        }
        let _stop = StopOnDrop(&stop);
        let ctx = Ctx::root();
        for _ in 0..40 {
            let fh = fs.opendir(&ctx, d).unwrap();
            let mut names: HashMap<Vec<u8>, u32> = HashMap::new();
            let mut off = 0;
            let mut last_off = 0;
            // Small batches: each call stops after 7 entries and resumes from the offset.
            loop {
                let mut got = 0;
                fs.readdir(&ctx, fh, off, false, |e, _| {
                    if got == 7 {
                        return false;
                    }
                    got += 1;
                    assert!(
                        e.offset > last_off,
                        "offsets go forward: {} after {last_off}",
                        e.offset
                    );
                    last_off = e.offset;
                    off = e.offset;
                    *names.entry(e.name.to_vec()).or_default() += 1;
                    true
                })
                .unwrap();
                if got == 0 {
                    break;
                }
            }
            fs.releasedir(fh).unwrap();
            // A churn name may come back twice (an old incarnation, then a re-created one
            // at a later cookie); entries that exist throughout come exactly once.
            for i in 0..600 {
                let k = names
                    .get(format!("stable{i}").as_bytes())
                    .copied()
                    .unwrap_or(0);
                assert_eq!(k, 1, "stable{i} returned {k} times");
            }
        }
        stop.store(true, Relaxed);
    });
    fs.check_invariants().unwrap();
}

/// Eight threads rename the same source at once: exactly one wins, the others get ENOENT,
/// and exactly one copy exists afterwards.
#[test]
fn eight_renames_of_one_source_have_one_winner() {
    for locking in Locking::ALL {
        let fs = fs(locking);
        let c = Client::root(fs.clone());
        c.create_dir("/a").unwrap();
        c.create_dir("/b").unwrap();
        for round in 0..300 {
            let src_dir = round % 2 == 0;
            if src_dir {
                c.create_dir("/a/src").unwrap();
            } else {
                c.write("/a/src", b"payload").unwrap();
            }
            let barrier = Barrier::new(8);
            let results: Vec<Result<(), i32>> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..8)
                    .map(|t| {
                        let (fs, barrier) = (fs.clone(), &barrier);
                        s.spawn(move || {
                            let c = Client::root(fs);
                            barrier.wait();
                            let dst = if t % 2 == 0 {
                                format!("/a/dst{t}")
                            } else {
                                format!("/b/dst{t}")
                            };
                            c.rename("/a/src", dst)
                                .map_err(|e| e.raw_os_error().unwrap())
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let wins = results.iter().filter(|r| r.is_ok()).count();
            assert_eq!(wins, 1, "[{}] round {round}: {results:?}", locking.name());
            assert!(
                results.iter().all(|r| r.is_ok() || *r == Err(libc::ENOENT)),
                "{results:?}"
            );
            let mut copies = 0;
            for dir in ["/a", "/b"] {
                for e in c.read_dir(dir).unwrap() {
                    if e.name.starts_with(b"dst") {
                        copies += 1;
                        let p = format!("{dir}/{}", String::from_utf8_lossy(&e.name));
                        if src_dir {
                            c.remove_dir(&p).unwrap();
                        } else {
                            assert_eq!(c.read(&p).unwrap(), b"payload");
                            c.remove_file(&p).unwrap();
                        }
                    }
                }
            }
            assert_eq!(
                copies,
                1,
                "[{}] round {round}: exactly one copy",
                locking.name()
            );
        }
        fs.check_invariants().unwrap();
    }
}

/// rmdir racing creates inside the directory: every create either lands in a directory that
/// survives, or fails with ENOENT; no entry is ever left in a removed directory. Runs until
/// both sides have succeeded often (or a deadline passes, which fails the test).
#[test]
fn rmdir_races_creates_without_losing_entries() {
    for locking in Locking::ALL {
        let fs = fs(locking);
        let c = Client::root(fs.clone());
        c.create_dir("/p").unwrap();
        let stop = AtomicBool::new(false);
        let created = AtomicU64::new(0);
        // Until 200 of each; the deadline only ends a run that would not get there (a
        // livelock), far past the seconds this takes on a loaded machine.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
        let removed = std::thread::scope(|s| {
            for t in 0..3 {
                let (fs, stop, created) = (fs.clone(), &stop, &created);
                s.spawn(move || {
                    let c = Client::root(fs);
                    let mut i = 0u64;
                    while !stop.load(Relaxed) {
                        let n = format!("/p/victim/f{t}-{i}");
                        match c.write(&n, b"") {
                            Ok(()) => {
                                created.fetch_add(1, Relaxed);
                                c.remove_file(&n).unwrap();
                            }
                            Err(e) => assert!(
                                e.raw_os_error() == Some(libc::ENOENT),
                                "create in a dying directory: {e:?}"
                            ),
                        }
                        i += 1;
                        std::thread::yield_now();
                    }
                });
            }
            let _stop = StopOnDrop(&stop);
            let mut removed = 0u64;
            while (removed < 200 || created.load(Relaxed) < 200)
                && std::time::Instant::now() < deadline
            {
                let _ = c.create_dir("/p/victim");
                match c.remove_dir("/p/victim") {
                    Ok(()) => removed += 1,
                    Err(e) => assert!(matches!(
                        e.raw_os_error(),
                        Some(libc::ENOTEMPTY) | Some(libc::ENOENT)
                    )),
                }
            }
            stop.store(true, Relaxed);
            removed
        });
        let created = created.load(Relaxed);
        eprintln!(
            "  [{}] {removed} rmdirs and {created} creates succeeded",
            locking.name()
        );
        assert!(
            removed >= 200 && created >= 200,
            "[{}] {removed} rmdirs, {created} creates",
            locking.name()
        );
        fs.check_invariants()
            .unwrap_or_else(|e| panic!("[{}]\n{e}", locking.name()));
    }
}

/// Directories moved between parents by many threads at once (the cross-directory rename
/// case that takes the filesystem-wide rename lock): no deadlock, no cycle, no lost subtree.
#[test]
fn concurrent_directory_moves_never_form_cycles() {
    let seed = common::seed::seed("concurrent_directory_moves_never_form_cycles");
    let fs = fs(Locking::Lanes);
    let c = Client::root(fs.clone());
    let dirs: Vec<String> = (0..8).map(|i| format!("/d{i}")).collect();
    for d in &dirs {
        c.create_dir(d).unwrap();
    }
    std::thread::scope(|s| {
        for t in 0..12u64 {
            let fs = fs.clone();
            s.spawn(move || {
                let c = Client::root(fs);
                let mut rng = common::seed::rng(seed ^ t);
                for _ in 0..3000 {
                    // Walk down a random existing path, then try to move it somewhere random.
                    let pick = |rng: &mut StdRng| {
                        let mut p = format!("/d{}", rng.random_range(0..8));
                        for _ in 0..rng.random_range(0..3) {
                            match c.read_dir(&p) {
                                Ok(v) if !v.is_empty() => {
                                    let e = &v[rng.random_range(0..v.len())];
                                    p = format!("{p}/{}", String::from_utf8_lossy(&e.name));
                                }
                                _ => break,
                            }
                        }
                        p
                    };
                    let (a, b) = (pick(&mut rng), pick(&mut rng));
                    // NOREPLACE: a move never destroys an empty target directory.
                    let _ = c.rename_with_flags(
                        &a,
                        format!("{b}/m{}", rng.random_range(0..4)),
                        libc::RENAME_NOREPLACE,
                    );
                }
            });
        }
    });
    let report = fs
        .check_invariants()
        .unwrap_or_else(|e| panic!("seed {seed}:\n{e}"));
    assert_eq!(report.dirs, 9, "no directory lost: {report:?}");
    assert!(
        fs.stats().lock(LockClass::Rename).acquired > 0,
        "the rename lock was exercised"
    );
}

/// The cost of a rename, in lock acquisitions, does not grow with the number of unrelated
/// files in the filesystem (no scan of other entries anywhere on the path).
#[test]
fn rename_cost_does_not_grow_with_unrelated_files() {
    let cost = |unrelated: usize| {
        let fs = fs(Locking::Lanes);
        let c = Client::root(fs.clone());
        c.create_dir("/big").unwrap();
        for i in 0..unrelated {
            c.write(format!("/big/f{i}"), b"").unwrap();
        }
        c.create_dir("/w").unwrap();
        c.write("/w/a", b"").unwrap();
        let w = c.metadata("/w").unwrap().ino();
        let ctx = Ctx::root();
        let before = fs.stats();
        fs.rename(&ctx, w, b"a", w, b"b", 0).unwrap();
        fs.rename(&ctx, w, b"b", ROOT_INO, b"moved", 0).unwrap();
        let d = fs.stats().since(&before);
        let stripes = d.lock(LockClass::Stripe).acquired;
        assert!(
            (2..=4).contains(&stripes),
            "two stripes per rename: {stripes}"
        );
        // Everything but stripes (whose count depends on hash collisions) and attribute
        // writes (which depend on the clock ticking) must be the same whatever the size.
        LockClass::ALL
            .iter()
            .filter(|c| !matches!(c, LockClass::Stripe | LockClass::Attr))
            .map(|&c| (c, d.lock(c).acquired))
            .collect::<Vec<_>>()
    };
    let small = cost(10);
    let large = cost(100_000);
    assert_eq!(small, large);
    // Two renames: a handful of dirent-map lookups and updates each, and a few other locks.
    let (map, rest): (Vec<_>, Vec<_>) = small
        .iter()
        .partition(|(c, _)| *c == LockClass::DirentShard);
    assert!(map.iter().map(|(_, n)| n).sum::<u64>() <= 20, "{small:?}");
    assert!(rest.iter().map(|(_, n)| n).sum::<u64>() <= 8, "{small:?}");
}

/// Rounds of namespace races on a small tree: in each round 8 threads run create, mkdir,
/// link, unlink, rmdir and rename (no flags, RENAME_NOREPLACE, RENAME_EXCHANGE,
/// RENAME_WHITEOUT, whose whiteouts then take part like any name), through the
/// path API and through the inode API by number (numbers go stale and are reused), then the
/// round ends and every invariant is checked: the tree is reachable from the root with no
/// cycle, `..` names the directory holding each directory, every link count equals the
/// names, and no entry lives in a removed directory. All three locking modes.
#[test]
fn rounds_of_namespace_races_keep_invariants_after_every_round() {
    let seed = common::seed::seed("rounds_of_namespace_races_keep_invariants_after_every_round");
    for locking in Locking::ALL {
        let fs = fs(locking);
        let root = Client::root(fs.clone());
        for d in ["/a", "/b", "/a/x", "/b/y"] {
            root.create_dir(d).unwrap();
        }
        let mut done = 0u64;
        for round in 0..8u64 {
            let ok = AtomicU64::new(0);
            std::thread::scope(|s| {
                for t in 0..8u64 {
                    let (fs, ok) = (fs.clone(), &ok);
                    s.spawn(move || {
                        let mut rng = common::seed::rng(seed ^ (round << 32) ^ (t * 0x9E37_79B9));
                        let c = Client::root(fs.clone());
                        let ctx = Ctx::root();
                        let path = |rng: &mut StdRng| {
                            let dirs = ["/a", "/b", "/a/x", "/b/y", "/a/x/z", "/b/y/z"];
                            let d = dirs[rng.random_range(0..dirs.len())];
                            match rng.random_range(0..3) {
                                0 => format!("{d}/f{}", rng.random_range(0..4)),
                                1 => format!("{d}/z"),
                                _ => format!("{d}/x"),
                            }
                        };
                        for _ in 0..3000 {
                            let (p, q) = (path(&mut rng), path(&mut rng));
                            let flags = [0, RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_WHITEOUT]
                                [rng.random_range(0..4)];
                            let r = match rng.random_range(0..9) {
                                0 => c.write(&p, b"").map(drop),
                                1 => c.create_dir(&p),
                                2 => c.hard_link(&p, &q),
                                3 => c.remove_file(&p),
                                4 => c.remove_dir(&p),
                                5 | 6 => c.rename_with_flags(&p, &q, flags),
                                _ => {
                                    // By number: resolve the parents now, act later, when
                                    // their numbers may name other directories.
                                    let (pp, pn) = p.rsplit_once('/').unwrap();
                                    let (qp, qn) = q.rsplit_once('/').unwrap();
                                    match (c.metadata(pp), c.metadata(qp)) {
                                        (Ok(a), Ok(b)) => {
                                            std::thread::yield_now();
                                            fs.rename(
                                                &ctx,
                                                a.ino(),
                                                pn.as_bytes(),
                                                b.ino(),
                                                qn.as_bytes(),
                                                flags,
                                            )
                                            .map_err(Into::into)
                                        }
                                        (Err(e), _) | (_, Err(e)) => Err(e),
                                    }
                                }
                            };
                            match r {
                                Ok(()) => {
                                    ok.fetch_add(1, Relaxed);
                                }
                                Err(e) => assert!(
                                    expected(&e) || e.raw_os_error() == Some(libc::EBUSY),
                                    "[{}] unexpected {e:?} on {p} {q}",
                                    locking.name()
                                ),
                            }
                        }
                    });
                }
            });
            fs.check_invariants().unwrap_or_else(|e| {
                panic!(
                    "[{}] seed {seed}, after round {round}:\n{e}",
                    locking.name()
                )
            });
            done += ok.load(Relaxed);
        }
        eprintln!("  [{}] {done} operations succeeded", locking.name());
        assert!(
            done > 20_000,
            "[{}] too few successes: {done}",
            locking.name()
        );
    }
}
