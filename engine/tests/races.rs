//! Races between operations on different names that meet in one inode: a directory being
//! removed while something is created in it, a parent losing its last child while it is itself
//! removed, a directory number recycled in the middle of an operation, and lookups racing a
//! rename. Each test reproduces one failure seen in a review of the engine; each runs for a
//! bounded number of rounds and checks the whole tree's invariants at the end.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::time::{Duration, Instant};

use lanefs::{Config, Ctx, Errno, Filesystem, Ino, RENAME_EXCHANGE, ROOT_INO};

fn fs() -> Arc<Filesystem> {
    Arc::new(Filesystem::new(Config::default()))
}

struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Relaxed);
    }
}

/// An rmdir that will fail (the directory keeps an entry) must never make a create in that
/// directory fail: only a directory that is really removed answers ENOENT.
#[test]
fn an_rmdir_that_fails_never_fails_a_create() {
    let fs = fs();
    let ctx = Ctx::root();
    let d = fs.mkdir(&ctx, ROOT_INO, b"d", 0o755).unwrap().ino;
    fs.mknod(&ctx, d, b"keep", libc::S_IFREG | 0o644, 0)
        .unwrap();
    let stop = AtomicBool::new(false);
    let rmdirs = AtomicU64::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            let _stop = StopOnDrop(&stop);
            while !stop.load(Relaxed) {
                assert_eq!(fs.rmdir(&ctx, ROOT_INO, b"d"), Err(Errno::ENOTEMPTY));
                rmdirs.fetch_add(1, Relaxed);
            }
        });
        let _stop = StopOnDrop(&stop);
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut i = 0u64;
        while Instant::now() < deadline && (i < 20_000 || rmdirs.load(Relaxed) < 1000) {
            fs.mknod(&ctx, d, b"f", libc::S_IFREG | 0o644, 0)
                .unwrap_or_else(|e| panic!("create {i} in a directory that stays: {e:?}"));
            fs.unlink(&ctx, d, b"f").unwrap();
            i += 1;
        }
    });
    fs.check_invariants().unwrap();
}

/// A parent removed while its last subdirectory is being removed: the parent's link count is
/// never decremented after it is dead (that was an "nlink underflow" panic and a leaked
/// child).
#[test]
fn a_parent_removed_while_its_child_is_removed_keeps_link_counts() {
    let fs = fs();
    let stop = AtomicBool::new(false);
    let deadline = Instant::now() + Duration::from_secs(3);
    std::thread::scope(|s| {
        for k in 0..3 {
            let (fs, stop) = (&fs, &stop);
            s.spawn(move || {
                let _stop = StopOnDrop(stop);
                let ctx = Ctx::root();
                let name = format!("p{k}");
                while !stop.load(Relaxed) {
                    let _ = fs.rmdir(&ctx, ROOT_INO, name.as_bytes());
                }
            });
        }
        let _stop = StopOnDrop(&stop);
        let ctx = Ctx::root();
        let mut i = 0u32;
        while Instant::now() < deadline {
            let name = format!("p{}", i % 3);
            i += 1;
            let Ok(p) = fs.mkdir(&ctx, ROOT_INO, name.as_bytes(), 0o755) else {
                continue;
            };
            // Children come and go while the other threads try to remove the parent.
            // Children come and go (removed, or moved out) while the other threads try to
            // remove the parent.
            for j in 0..64 {
                if fs.mkdir(&ctx, p.ino, b"c", 0o755).is_err() {
                    break;
                }
                if j % 2 == 0 {
                    let _ = fs.rmdir(&ctx, p.ino, b"c");
                } else if fs.rename(&ctx, p.ino, b"c", ROOT_INO, b"out", 0).is_ok() {
                    fs.rmdir(&ctx, ROOT_INO, b"out").unwrap();
                }
            }
        }
    });
    fs.check_invariants().unwrap();
}

/// Operations addressed to a directory by number while that directory is removed and a new
/// one takes its number: whatever happens, each operation acts on one directory, and the
/// tree keeps its invariants (no entry in a dead directory, `..` right, link counts right,
/// everything reachable).
#[test]
fn a_directory_number_recycled_mid_operation_is_never_mixed_up() {
    let fs = fs();
    let ctx = Ctx::root();
    fs.mkdir(&ctx, ROOT_INO, b"other", 0o755).unwrap();
    let stop = AtomicBool::new(false);
    let current = AtomicU64::new(fs.mkdir(&ctx, ROOT_INO, b"p", 0o755).unwrap().ino.get());
    let deadline = Instant::now() + Duration::from_secs(3);
    std::thread::scope(|s| {
        // Recycles p's number: rmdir p; mkdir p (numbers are reused last in, first out).
        s.spawn(|| {
            let _stop = StopOnDrop(&stop);
            let ctx = Ctx::root();
            while Instant::now() < deadline {
                if fs.rmdir(&ctx, ROOT_INO, b"p").is_ok() {
                    if let Ok(a) = fs.mkdir(&ctx, ROOT_INO, b"p", 0o755) {
                        current.store(a.ino.get(), Relaxed);
                    }
                }
            }
        });
        for t in 0..3u64 {
            let (fs, stop, current) = (&fs, &stop, &current);
            s.spawn(move || {
                let _stop = StopOnDrop(stop);
                let ctx = Ctx::root();
                let other = fs.lookup(&ctx, ROOT_INO, b"other").unwrap().ino;
                let mut i = 0u64;
                while !stop.load(Relaxed) {
                    let p = Ino(current.load(Relaxed));
                    let name = format!("x{t}");
                    let n = name.as_bytes();
                    let _ = match i % 6 {
                        0 => fs.mknod(&ctx, p, n, libc::S_IFREG | 0o644, 0).map(drop),
                        1 => fs.unlink(&ctx, p, n),
                        2 => fs.mkdir(&ctx, p, n, 0o755).map(drop),
                        3 => fs.rmdir(&ctx, p, n),
                        4 => fs.rename(&ctx, other, n, p, n, 0),
                        _ => fs.rename(&ctx, p, n, other, n, 0),
                    };
                    i += 1;
                }
            });
        }
    });
    fs.check_invariants().unwrap();
}

/// A lookup racing a rename sees the state before it or after it, never a mix. After k
/// exchanges of directories `a` and `b` (RENAME_EXCHANGE), `a` names x and `b` names y if k is
/// even, the other way round if odd. A reader that looks up `a`, then `b`, sees states k_a <=
/// k_b; when at most one exchange can have overlapped the two lookups (started-after <=
/// done-before + 1), the only forbidden outcome is k_a = k_b + 1: `a` already exchanged and
/// `b` not yet, one directory under both names, which a rename made in two steps shows.
#[test]
fn lookups_never_see_half_of_an_exchange() {
    let fs = fs();
    let ctx = Ctx::root();
    let p1 = fs.mkdir(&ctx, ROOT_INO, b"p1", 0o755).unwrap().ino;
    let p2 = fs.mkdir(&ctx, ROOT_INO, b"p2", 0o755).unwrap().ino;
    let x = fs.mkdir(&ctx, p1, b"a", 0o755).unwrap().ino;
    let y = fs.mkdir(&ctx, p2, b"b", 0o755).unwrap().ino;
    let stop = AtomicBool::new(false);
    let (started, done) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        s.spawn(|| {
            let _stop = StopOnDrop(&stop);
            let ctx = Ctx::root();
            while !stop.load(Relaxed) {
                started.fetch_add(1, SeqCst);
                fs.rename(&ctx, p1, b"a", p2, b"b", RENAME_EXCHANGE)
                    .unwrap();
                done.fetch_add(1, SeqCst);
            }
        });
        let _stop = StopOnDrop(&stop);
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut overlapped = 0u64;
        while Instant::now() < deadline && overlapped < 50_000 {
            let d0 = done.load(SeqCst);
            let a = fs.lookup(&ctx, p1, b"a").unwrap().ino;
            let b = fs.lookup(&ctx, p2, b"b").unwrap().ino;
            let s1 = started.load(SeqCst);
            // `..` of what each name gave is the directory it was found in when no exchange
            // can have overlapped the lookups.
            let ups: Vec<Ino> = [a, b]
                .iter()
                .map(|&i| fs.lookup(&ctx, i, b"..").unwrap().ino)
                .collect();
            if started.load(SeqCst) == d0 {
                assert_eq!(
                    ups,
                    [p1, p2],
                    "'..' disagrees with where the name was found"
                );
            }
            if s1 > d0 + 1 {
                continue;
            }
            overlapped += u64::from(s1 == d0 + 1);
            let b_before = if d0 % 2 == 0 { y } else { x };
            assert!(
                !(a == b_before && b == b_before),
                "a already exchanged, b not yet: one directory under both names"
            );
        }
        assert!(
            overlapped > 100,
            "only {overlapped} lookup pairs overlapped an exchange"
        );
    });
    fs.check_invariants().unwrap();
}

/// A replacing rename (`mv a b` over an existing `b`) never shows one inode under both names:
/// a lookup of `b` that finds the moved inode is followed by a lookup of `a` that does not.
#[test]
fn lookups_never_see_both_names_of_a_replacing_rename() {
    let fs = fs();
    let ctx = Ctx::root();
    let d = fs.mkdir(&ctx, ROOT_INO, b"d", 0o755).unwrap().ino;
    fs.mknod(&ctx, d, b"b", libc::S_IFREG | 0o644, 0).unwrap();
    let stop = AtomicBool::new(false);
    let renames = AtomicU64::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            let _stop = StopOnDrop(&stop);
            let ctx = Ctx::root();
            while !stop.load(Relaxed) {
                fs.mknod(&ctx, d, b"a", libc::S_IFREG | 0o644, 0).unwrap();
                fs.rename(&ctx, d, b"a", d, b"b", 0).unwrap();
                renames.fetch_add(1, Relaxed);
            }
        });
        let _stop = StopOnDrop(&stop);
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut both = 0u64;
        let mut checks = 0u64;
        while Instant::now() < deadline && (checks < 500_000 || renames.load(Relaxed) < 5000) {
            // The same inode (number and generation: a freed number comes back at once, with
            // another generation) under both names.
            if let Ok(b) = fs.lookup(&ctx, d, b"b") {
                if let Ok(a) = fs.lookup(&ctx, d, b"a") {
                    if (a.ino, a.generation) == (b.ino, b.generation) {
                        both += 1;
                    }
                }
            }
            checks += 1;
        }
        assert_eq!(
            both, 0,
            "{both} of {checks} lookups saw one inode under both names"
        );
    });
    fs.check_invariants().unwrap();
}

/// An access ACL's owner, mask and other entries are the mode's permission bits, whatever
/// races: chmods, ACLs set and removed, chowns and `UTIME_NOW` touches run against each
/// other, and after each round the stored ACL (if any) must agree with the mode, while a
/// named user's opens are only ever allowed or refused.
#[test]
fn chmod_and_acl_changes_keep_the_acl_and_the_mode_in_step() {
    const ACCESS: &[u8] = b"system.posix_acl_access";
    let acl = |p: u16, mask: u16| common::named_user_acl(7, p, mask);
    let fs = fs();
    let root = Ctx::root();
    let user = Ctx::user(7, 7);
    let f = fs
        .mknod(&root, ROOT_INO, b"f", libc::S_IFREG | 0o640, 0)
        .unwrap()
        .ino;
    for round in 0..300u32 {
        std::thread::scope(|s| {
            s.spawn(|| {
                for k in 0..40u32 {
                    let mode = (round * 7 + k * 13) & 0o777;
                    let set = lanefs::SetAttr {
                        mode: Some(mode),
                        ..Default::default()
                    };
                    fs.setattr(&root, f, &set, None).unwrap();
                }
            });
            s.spawn(|| {
                for k in 0..40u16 {
                    let r = match k % 3 {
                        2 => fs.removexattr(&root, f, ACCESS),
                        _ => fs.setxattr(&root, f, ACCESS, &acl(k % 8, (k / 8) % 8), 0),
                    };
                    assert!(matches!(r, Ok(()) | Err(Errno::ENODATA)), "{r:?}");
                }
            });
            s.spawn(|| {
                for k in 0..40u32 {
                    let set = lanefs::SetAttr {
                        uid: Some(k % 2),
                        mtime: Some(lanefs::TimeSet::Now),
                        ..Default::default()
                    };
                    fs.setattr(&root, f, &set, None).unwrap();
                }
            });
            s.spawn(|| {
                for _ in 0..40 {
                    // A touch (both times to now), which write permission allows: the ACL's
                    // (a single time to now needs ownership, as an explicit time does).
                    let set = lanefs::SetAttr {
                        atime: Some(lanefs::TimeSet::Now),
                        mtime: Some(lanefs::TimeSet::Now),
                        ..Default::default()
                    };
                    match fs.setattr(&user, f, &set, None).map(drop) {
                        Ok(()) | Err(Errno::EACCES) => {}
                        r => panic!("touch by a named user: {r:?}"),
                    }
                    match fs.open(&user, f, libc::O_RDONLY) {
                        Ok(fh) => fs.release(fh).unwrap(),
                        Err(Errno::EACCES) => {}
                        r => panic!("open by a named user: {r:?}"),
                    }
                }
            });
        });
        let mode = fs.getattr(f).unwrap().mode;
        match fs.getxattr(&root, f, ACCESS) {
            Err(Errno::ENODATA) => {}
            Ok(v) => {
                let entries: Vec<(u16, u16)> = v[4..]
                    .chunks(8)
                    .map(|e| {
                        (
                            u16::from_le_bytes([e[0], e[1]]),
                            u16::from_le_bytes([e[2], e[3]]),
                        )
                    })
                    .collect();
                let perm = |tag| entries.iter().find(|e| e.0 == tag).unwrap().1 as u32;
                assert_eq!(
                    perm(1),
                    (mode >> 6) & 7,
                    "round {round}: owner entry vs {mode:o}"
                );
                assert_eq!(
                    perm(0x10),
                    (mode >> 3) & 7,
                    "round {round}: mask vs {mode:o}"
                );
                assert_eq!(
                    perm(0x20),
                    mode & 7,
                    "round {round}: other entry vs {mode:o}"
                );
            }
            r => panic!("{r:?}"),
        }
        fs.check_invariants().unwrap();
        // The ACL still decides: read for the named user through the mask, then not.
        let chmod = |mode| {
            let set = lanefs::SetAttr {
                mode: Some(mode),
                uid: Some(0),
                ..Default::default()
            };
            fs.setattr(&root, f, &set, None).unwrap();
        };
        fs.setxattr(&root, f, ACCESS, &acl(4, 4), 0).unwrap();
        chmod(0o640);
        fs.release(fs.open(&user, f, libc::O_RDONLY).unwrap())
            .unwrap();
        chmod(0o600);
        assert_eq!(fs.open(&user, f, libc::O_RDONLY), Err(Errno::EACCES));
    }
}

/// A read of a directory, one entry per call, racing a `RENAME_WHITEOUT` of one of its names
/// (and that name put back), must never return the name twice: the whiteout takes the
/// source entry's offset (`Filesystem::readdir`'s doc). Before it did, 9 reads in 2 s
/// returned "a" twice.
#[test]
fn a_whiteout_rename_never_shows_a_name_twice_in_one_read() {
    use lanefs::RENAME_WHITEOUT;
    let fs = &fs();
    let ctx = Ctx::root();
    let d = fs.mkdir(&ctx, ROOT_INO, b"d", 0o755).unwrap().ino;
    let o = fs.mkdir(&ctx, ROOT_INO, b"o", 0o755).unwrap().ino;
    for n in [&b"a"[..], b"c", b"e"] {
        fs.mknod(&ctx, d, n, libc::S_IFREG | 0o644, 0).unwrap();
    }
    let stop = AtomicBool::new(false);
    let mut twice = 0;
    std::thread::scope(|s| {
        let stop = &stop;
        s.spawn(move || {
            let ctx = Ctx::root();
            while !stop.load(Relaxed) {
                fs.rename(&ctx, d, b"a", o, b"x", RENAME_WHITEOUT).unwrap();
                fs.unlink(&ctx, d, b"a").unwrap();
                fs.rename(&ctx, o, b"x", d, b"a", 0).unwrap();
            }
        });
        let _stop = StopOnDrop(stop);
        let end = Instant::now() + Duration::from_secs(2);
        while Instant::now() < end {
            let fh = fs.opendir(&ctx, d).unwrap();
            let (mut names, mut off) = (Vec::new(), 0);
            loop {
                let mut got = false;
                fs.readdir(&ctx, fh, off, false, |e, _| {
                    if got {
                        return false;
                    }
                    got = true;
                    off = e.offset;
                    names.push(e.name.to_vec());
                    true
                })
                .unwrap();
                if !got {
                    break;
                }
            }
            fs.releasedir(fh).unwrap();
            twice += usize::from(names.iter().filter(|n| n.as_slice() == b"a").count() > 1);
        }
    });
    assert_eq!(twice, 0, "reads that returned \"a\" twice");
}

/// A name that exists throughout a directory read is returned by it even when a rename
/// points the name at another inode meanwhile and the inode it named is freed (found by a
/// helper's attack: the read met the freed inode and left the name out), by readdir and by a
/// kernel caller's readdirplus, which takes a reference on each entry.
#[test]
fn a_name_renamed_over_during_a_read_is_still_returned() {
    let fs = &fs();
    let root = Ctx::root();
    let d = fs.mkdir(&root, ROOT_INO, b"d", 0o755).unwrap().ino;
    let e = fs.mkdir(&root, ROOT_INO, b"e", 0o755).unwrap().ino;
    let names: Vec<Vec<u8>> = (0..8).map(|i| format!("p{i}").into_bytes()).collect();
    for n in &names {
        fs.mknod(&root, d, n, libc::S_IFREG | 0o644, 0).unwrap();
    }
    let stop = AtomicBool::new(false);
    let mut bad = Vec::new();
    std::thread::scope(|s| {
        let (stop, names) = (&stop, &names);
        s.spawn(move || {
            let ctx = Ctx::root();
            for k in 0.. {
                if stop.load(Relaxed) {
                    break;
                }
                fs.mknod(&ctx, e, b"q", libc::S_IFREG | 0o644, 0).unwrap();
                fs.rename(&ctx, e, b"q", d, &names[k % 8], 0).unwrap();
            }
        });
        let _stop = StopOnDrop(stop);
        let end = Instant::now() + Duration::from_secs(3);
        let mut reads = 0u64;
        while Instant::now() < end {
            let plus = reads % 2 == 1;
            let ctx = if plus {
                Ctx::root().via_kernel()
            } else {
                Ctx::root()
            };
            let fh = fs.opendir(&ctx, d).unwrap();
            let mut got = Vec::new();
            fs.readdir(&ctx, fh, 0, plus, |e, _| {
                got.push((e.name.to_vec(), e.ino));
                true
            })
            .unwrap();
            fs.releasedir(fh).unwrap();
            for (n, ino) in &got {
                if plus && n != b"." && n != b".." {
                    fs.forget(*ino, 1);
                }
            }
            let mut listed: Vec<Vec<u8>> = got.into_iter().map(|(n, _)| n).collect();
            listed.retain(|n| n != b"." && n != b"..");
            listed.sort();
            if listed != *names {
                bad.push((plus, listed));
            }
            reads += 1;
        }
        assert!(reads > 100, "only {reads} reads");
    });
    fs.check_invariants().unwrap();
    assert!(
        bad.is_empty(),
        "{} reads left a name out or doubled one: {:?}",
        bad.len(),
        &bad[..bad.len().min(3)]
    );
}

/// A lookup of a name that a rename keeps pointing at new inodes never fails (POSIX: the
/// name stays visible throughout a rename over it), for a library caller and for the
/// kernel, whose lookups take a reference on what they find (a reference on the inode the
/// name named a moment before, freed meanwhile, failed with ENOENT).
#[test]
fn a_name_renamed_over_is_always_found() {
    let fs = &fs();
    let root = Ctx::root();
    let d = fs.mkdir(&root, ROOT_INO, b"d", 0o755).unwrap().ino;
    let e = fs.mkdir(&root, ROOT_INO, b"e", 0o755).unwrap().ino;
    fs.mknod(&root, d, b"x", libc::S_IFREG | 0o644, 0).unwrap();
    let stop = AtomicBool::new(false);
    let failed = AtomicU64::new(0);
    std::thread::scope(|s| {
        let stop = &stop;
        s.spawn(move || {
            let ctx = Ctx::root();
            while !stop.load(Relaxed) {
                fs.mknod(&ctx, e, b"q", libc::S_IFREG | 0o644, 0).unwrap();
                fs.rename(&ctx, e, b"q", d, b"x", 0).unwrap();
            }
        });
        let _stop = StopOnDrop(stop);
        let end = Instant::now() + Duration::from_secs(2);
        let mut n = 0u64;
        while Instant::now() < end {
            let kernel = n % 2 == 1;
            let ctx = if kernel {
                Ctx::root().via_kernel()
            } else {
                Ctx::root()
            };
            match fs.lookup(&ctx, d, b"x") {
                Ok(a) if kernel => fs.forget(a.ino, 1),
                Ok(_) => {}
                Err(_) => {
                    failed.fetch_add(1, Relaxed);
                }
            }
            n += 1;
        }
        assert!(n > 1000, "only {n} lookups");
    });
    fs.check_invariants().unwrap();
    assert_eq!(failed.load(Relaxed), 0, "lookups that failed");
}

/// Through the path API, reading a file and changing the mode of a directory whose names a
/// rename keeps pointing at new inodes never fail: an inode freed after the walk found it
/// sends the call back to walk again. (A directory opened and then replaced reads as ENOENT
/// afterwards, as on Linux, whose getdents fails so on a removed directory.)
#[test]
fn paths_renamed_over_are_always_opened() {
    let fs = fs();
    let c = lanefs::Client::root(fs.clone());
    c.create_dir("/d").unwrap();
    c.create_dir("/e").unwrap();
    c.write("/d/x", b"x").unwrap();
    c.create_dir("/d/sub").unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let (stop, c) = (&stop, &c);
        s.spawn(move || {
            while !stop.load(Relaxed) {
                c.write("/e/q", b"q").unwrap();
                c.rename("/e/q", "/d/x").unwrap();
                c.create_dir("/e/s").unwrap();
                c.rename("/e/s", "/d/sub").unwrap();
            }
        });
        let _stop = StopOnDrop(stop);
        let end = Instant::now() + Duration::from_secs(2);
        let (mut n, mut failed) = (0u64, Vec::new());
        while Instant::now() < end {
            if let Err(e) = c.read("/d/x") {
                failed.push(format!("read: {e}"));
            }
            if let Err(e) = c.set_permissions("/d/sub", 0o750) {
                failed.push(format!("set_permissions: {e}"));
            }
            n += 1;
        }
        assert!(n > 500, "only {n} rounds");
        assert!(
            failed.is_empty(),
            "{} of {n} rounds failed: {:?}",
            failed.len(),
            &failed[..failed.len().min(4)]
        );
    });
    fs.check_invariants().unwrap();
}

/// Burns a CPU until `stop`, so that the racing threads beside it are descheduled in the
/// middle of their operations (the windows below are a few instructions wide; on an idle
/// machine a thread is rarely preempted inside one).
fn burn(stop: &AtomicBool) {
    while !stop.load(Relaxed) {
        std::hint::spin_loop();
    }
}

/// A permission check reads the mode and the access ACL as one state: a chmod rewrites both
/// (the ACL's mask is the mode's group bits), and a check that took the mode from before a
/// chmod and the ACL from after it answers what neither state answers. The file flips
/// between two modes; every caller whose answer is the same in both (read first, in each
/// state alone) must get that answer throughout, refusals and grants alike.
#[test]
fn a_permission_check_reads_the_mode_and_the_acl_as_one_state() {
    const ACCESS: &[u8] = b"system.posix_acl_access";
    const MODES: [u32; 2] = [0o664, 0o604];
    let fs = fs();
    let root = Ctx::root();
    let f = fs
        .mknod(&root, ROOT_INO, b"f", libc::S_IFREG | MODES[0], 0)
        .unwrap()
        .ino;
    // user 2000: r-- (a named entry); user 3000: --- (named); user 4000: no entry.
    let mut acl = common::named_user_acl(2000, 4, 6);
    acl.splice(20..20, {
        let mut e = 2u16.to_le_bytes().to_vec();
        e.extend_from_slice(&0u16.to_le_bytes());
        e.extend_from_slice(&3000u32.to_le_bytes());
        e
    });
    fs.setxattr(&root, f, ACCESS, &acl, 0).unwrap();
    let chmod = |mode| {
        let set = lanefs::SetAttr {
            mode: Some(mode),
            ..Default::default()
        };
        fs.setattr(&root, f, &set, None).unwrap();
    };
    let callers: Vec<Ctx> = [2000, 3000, 4000].map(|u| Ctx::user(u, u)).to_vec();
    let answer = |c: &Ctx, mask: u32| fs.access(c, f, mask).is_ok();
    let mut expect = Vec::new();
    for c in &callers {
        for mask in [libc::R_OK as u32, libc::W_OK as u32] {
            let per_mode: Vec<bool> = MODES
                .iter()
                .map(|&m| {
                    chmod(m);
                    answer(c, mask)
                })
                .collect();
            if per_mode[0] == per_mode[1] {
                expect.push((c.clone(), mask, per_mode[0]));
            }
        }
    }
    chmod(MODES[0]);
    assert!(
        expect.iter().any(|&(_, _, ok)| ok) && expect.iter().any(|&(_, _, ok)| !ok),
        "the callers cover a grant and a refusal that both modes agree on: {expect:?}"
    );
    let stop = AtomicBool::new(false);
    let wrong = AtomicU64::new(0);
    let checks = AtomicU64::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            let _stop = StopOnDrop(&stop);
            let mut k = 0;
            while !stop.load(Relaxed) {
                chmod(MODES[k % 2]);
                k += 1;
            }
        });
        s.spawn(|| burn(&stop));
        s.spawn(|| {
            let _stop = StopOnDrop(&stop);
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline {
                for (c, mask, ok) in &expect {
                    checks.fetch_add(1, Relaxed);
                    let by_open =
                        (*mask == libc::R_OK as u32).then(|| match fs.open(c, f, libc::O_RDONLY) {
                            Ok(fh) => {
                                fs.release(fh).unwrap();
                                true
                            }
                            Err(Errno::EACCES) => false,
                            r => panic!("open by uid {}: {r:?}", c.uid),
                        });
                    for got in [Some(answer(c, *mask)), by_open].into_iter().flatten() {
                        if got != *ok {
                            wrong.fetch_add(1, Relaxed);
                        }
                    }
                }
            }
        });
    });
    let wrong = wrong.load(Relaxed);
    assert_eq!(
        wrong,
        0,
        "{wrong} of {} checks answered what neither mode answers",
        checks.load(Relaxed)
    );
}

/// Once a create in directory C has failed with ENOENT because C is being removed, C's name
/// is gone: the caller who was told ENOENT must not find C again by its name.
#[test]
fn a_directory_a_create_was_refused_in_is_not_found_again() {
    let fs = fs();
    let ctx = Ctx::root();
    let stop = AtomicBool::new(false);
    let (refused, seen_again) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        s.spawn(|| {
            let _stop = StopOnDrop(&stop);
            while !stop.load(Relaxed) {
                match fs.mkdir(&ctx, ROOT_INO, b"C", 0o755) {
                    Ok(_) | Err(Errno::EEXIST) => {}
                    r => panic!("mkdir C: {r:?}"),
                }
                match fs.rmdir(&ctx, ROOT_INO, b"C") {
                    Ok(()) | Err(Errno::ENOTEMPTY) | Err(Errno::ENOENT) => {}
                    r => panic!("rmdir C: {r:?}"),
                }
            }
        });
        s.spawn(|| burn(&stop));
        let _stop = StopOnDrop(&stop);
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            let Ok(c) = fs.lookup(&ctx, ROOT_INO, b"C") else {
                continue;
            };
            let id = lanefs::InodeId {
                ino: c.ino,
                generation: c.generation,
            };
            match fs.mknod(&ctx, id, b"x", libc::S_IFREG | 0o644, 0) {
                Ok(_) => {
                    let _ = fs.unlink(&ctx, id, b"x");
                }
                Err(Errno::ENOENT) => {
                    refused.fetch_add(1, Relaxed);
                    if let Ok(again) = fs.lookup(&ctx, ROOT_INO, b"C") {
                        if (again.ino, again.generation) == (c.ino, c.generation) {
                            seen_again.fetch_add(1, Relaxed);
                        }
                    }
                }
                r => panic!("mknod in C: {r:?}"),
            }
        }
    });
    let seen_again = seen_again.load(Relaxed);
    assert!(
        refused.load(Relaxed) > 0,
        "no create was refused: no race ran"
    );
    assert_eq!(
        seen_again,
        0,
        "{seen_again} of {} refused creates found the removed directory again",
        refused.load(Relaxed)
    );
    fs.check_invariants().unwrap();
}

/// An rmdir racing a create: either the create wins (rmdir says ENOTEMPTY, and a listing
/// made after that shows the new name, which nobody removes) or the rmdir wins (the create
/// says ENOENT). A create counted but not yet visible must not make the rmdir fail while a
/// listing still finds the directory empty.
#[test]
fn an_rmdir_that_says_enotempty_leaves_a_listing_that_is_not_empty() {
    let fs = fs();
    let ctx = Ctx::root();
    let stop = AtomicBool::new(false);
    let (rounds, refused, empty) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        s.spawn(|| burn(&stop));
        s.spawn(|| burn(&stop));
        let _stop = StopOnDrop(&stop);
        let deadline = Instant::now() + Duration::from_secs(4);
        while Instant::now() < deadline {
            let d = fs.mkdir(&ctx, ROOT_INO, b"D", 0o755).unwrap();
            let id = lanefs::InodeId {
                ino: d.ino,
                generation: d.generation,
            };
            let created = std::thread::scope(|s| {
                let creator = s.spawn(|| fs.mknod(&ctx, id, b"x", libc::S_IFREG | 0o644, 0));
                let removed = fs.rmdir(&ctx, ROOT_INO, b"D");
                if removed == Err(Errno::ENOTEMPTY) {
                    refused.fetch_add(1, Relaxed);
                    let fh = fs.opendir(&ctx, id).unwrap();
                    let mut names = Vec::new();
                    fs.readdir(&ctx, fh, 0, false, |e, _| {
                        names.push(e.name.to_vec());
                        true
                    })
                    .unwrap();
                    fs.releasedir(fh).unwrap();
                    if !names.iter().any(|n| n == b"x") {
                        empty.fetch_add(1, Relaxed);
                    }
                } else {
                    assert_eq!(removed, Ok(()), "rmdir of D");
                }
                let created = creator.join().unwrap();
                match (&removed, &created) {
                    (Ok(()), Err(Errno::ENOENT)) | (Err(Errno::ENOTEMPTY), Ok(_)) => {}
                    _ => panic!("rmdir {removed:?} and create {created:?} in D"),
                }
                created.is_ok()
            });
            if created {
                fs.unlink(&ctx, id, b"x").unwrap();
                fs.rmdir(&ctx, ROOT_INO, b"D").unwrap();
            }
            rounds.fetch_add(1, Relaxed);
        }
    });
    let empty = empty.load(Relaxed);
    assert_eq!(
        empty,
        0,
        "{empty} of {} refused rmdirs (in {} rounds) were followed by an empty listing",
        refused.load(Relaxed),
        rounds.load(Relaxed)
    );
    fs.check_invariants().unwrap();
}

/// Growing a file with `truncate` keeps the pages `fallocate(FALLOC_FL_KEEP_SIZE)` gave it
/// past its end (tmpfs: `shmem_setattr` cuts pages only when the size shrinks); shrinking
/// cuts them, as it cuts written ones.
#[test]
fn a_growing_truncate_keeps_pages_fallocated_past_the_end() {
    let fs = fs();
    let ctx = Ctx::root();
    let (a, fh) = fs
        .create(&ctx, ROOT_INO, b"f", libc::S_IFREG | 0o644, libc::O_RDWR)
        .unwrap();
    fs.fallocate(&ctx, fh, libc::FALLOC_FL_KEEP_SIZE, 0, 16 * 4096)
        .unwrap();
    assert_eq!(fs.getattr(a.ino).unwrap().blocks, 16 * 8);
    let truncate = |size| {
        let set = lanefs::SetAttr {
            size: Some(size),
            ..Default::default()
        };
        fs.setattr(&ctx, a.ino, &set, Some(lanefs::TruncateBy::Handle(fh)))
            .unwrap()
    };
    let grown = truncate(4 * 4096);
    assert_eq!(
        (grown.size, grown.blocks),
        (4 * 4096, 16 * 8),
        "grown to 4 pages"
    );
    let grown = truncate(5 * 4096 + 100);
    assert_eq!(grown.blocks, 16 * 8, "grown to 5 pages and a bit");
    let shrunk = truncate(2 * 4096 + 1);
    assert_eq!(shrunk.blocks, 3 * 8, "shrunk to 2 pages and a byte");
    fs.release(fh).unwrap();
}
