//! Behaviour of the inode API that the kernel comparison cannot reach: lookup counts and
//! FORGET, open-but-unlinked files, limits, stale handles, bad names, fallocate, statistics.

use std::io::{Read, Seek, SeekFrom, Write};
use std::sync::Arc;

use lanefs::*;

fn new_fs(cfg: Config) -> (Arc<Filesystem>, Client) {
    let fs = Arc::new(Filesystem::new(cfg));
    let c = Client::root(fs.clone());
    (fs, c)
}

/// Directory `/d` holding 100 empty files, the `i`th named `name(i)`; its inode.
fn dir_of_100(c: &Client, name: impl Fn(u32) -> String) -> Ino {
    c.create_dir("/d").unwrap();
    for i in 0..100 {
        c.write(format!("/d/{}", name(i)), b"").unwrap();
    }
    c.metadata("/d").unwrap().ino()
}

#[test]
fn unlinked_open_file_lives_until_last_close() {
    let (fs, c) = new_fs(Config::default());
    let mut f = c
        .open("/f", OpenOptions::new().read(true).write(true).create(true))
        .unwrap();
    f.write_all(b"still here").unwrap();
    let ino = f.ino();
    c.remove_file("/f").unwrap();
    assert!(!c.exists("/f"));
    assert_eq!(fs.getattr(ino).unwrap().nlink, 0, "open, unlinked: nlink 0");
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "still here");
    let before = fs.statfs().ffree;
    drop(f);
    assert_eq!(
        fs.getattr(ino),
        Err(Errno::ENOENT),
        "freed with its last handle"
    );
    assert_eq!(fs.statfs().ffree, before + 1);
    fs.check_invariants().unwrap();
}

#[test]
fn lookup_counts_keep_inodes_until_forget() {
    let (fs, c) = new_fs(Config::default());
    c.write("/f", b"x").unwrap();
    let ctx = Ctx::root().via_kernel();
    let a = fs.lookup(&ctx, ROOT_INO, b"f").unwrap();
    let b = fs.lookup(&ctx, ROOT_INO, b"f").unwrap();
    assert_eq!(a.ino, b.ino);
    c.remove_file("/f").unwrap();
    assert_eq!(fs.getattr(a.ino).unwrap().nlink, 0, "kernel still holds it");
    fs.forget(a.ino, 1);
    assert!(fs.getattr(a.ino).is_ok(), "one lookup left");
    fs.forget(a.ino, 1);
    assert_eq!(fs.getattr(a.ino), Err(Errno::ENOENT));
    // A reused number comes back with a new generation.
    let n = fs
        .create(&ctx, ROOT_INO, b"g", 0o644, libc::O_RDWR)
        .unwrap();
    fs.release(n.1).unwrap();
    if n.0.ino == a.ino {
        assert_ne!(n.0.generation, a.generation);
    }
    fs.forget(n.0.ino, 1);
    fs.check_invariants().unwrap();
}

#[test]
fn readdirplus_counts_lookups_except_dots_and_refused_entries() {
    let (fs, c) = new_fs(Config::default());
    c.create_dir("/d").unwrap();
    for i in 0..5 {
        c.write(format!("/d/f{i}"), b"").unwrap();
    }
    let d = c.metadata("/d").unwrap().ino();
    let ctx = Ctx::root().via_kernel();
    let fh = fs.opendir(&ctx, d).unwrap();
    let mut taken = Vec::new();
    fs.readdir(&ctx, fh, 0, true, |e, a| {
        assert_eq!(a.unwrap().ino, e.ino);
        if taken.len() == 5 {
            return false; // buffer full: this entry is not consumed
        }
        taken.push((e.name.to_vec(), e.ino));
        true
    })
    .unwrap();
    fs.releasedir(fh).unwrap();
    assert_eq!(taken.len(), 5, ". .. and three files");
    for (name, ino) in &taken[2..] {
        c.remove_file(format!("/d/{}", String::from_utf8_lossy(name)))
            .unwrap();
        assert!(
            fs.getattr(*ino).is_ok(),
            "kept alive by the readdirplus lookup"
        );
        fs.forget(*ino, 1);
        assert_eq!(fs.getattr(*ino), Err(Errno::ENOENT));
    }
    // The two refused/unread files were not pinned: unlinking frees them at once.
    for e in c.read_dir("/d").unwrap() {
        c.remove_file(format!("/d/{}", String::from_utf8_lossy(&e.name)))
            .unwrap();
        assert_eq!(fs.getattr(e.ino), Err(Errno::ENOENT));
    }
    fs.check_invariants().unwrap();
}

/// A kernel caller's readdirplus withholds the attributes of a directory, and of a file that
/// has had two names at once (from its second link on, also once it is back to one name),
/// and takes no reference for them; a file that never had a second name keeps its, and a
/// library caller always gets them all.
#[test]
fn readdirplus_withholds_attributes_of_files_that_had_several_names() {
    let (fs, c) = new_fs(Config::default());
    c.create_dir("/d").unwrap();
    c.create_dir("/d/sub").unwrap();
    c.write("/d/once", b"").unwrap();
    c.write("/d/twice", b"").unwrap();
    let d = c.metadata("/d").unwrap().ino();
    let list = |ctx: &Ctx| {
        let fh = fs.opendir(ctx, d).unwrap();
        let mut out = std::collections::BTreeMap::new();
        fs.readdir(ctx, fh, 0, true, |e, a| {
            if e.name != b"." && e.name != b".." {
                out.insert(
                    String::from_utf8_lossy(e.name).into_owned(),
                    a.map(|a| a.nlink),
                );
            }
            true
        })
        .unwrap();
        fs.releasedir(fh).unwrap();
        out
    };
    let kernel = Ctx::root().via_kernel();
    let forget_all = |l: &std::collections::BTreeMap<String, Option<u32>>| {
        for (n, a) in l {
            if a.is_some() {
                fs.forget(c.metadata(format!("/d/{n}")).unwrap().ino(), 1);
            }
        }
    };
    let l = list(&kernel);
    assert!(l.iter().all(|(n, a)| a.is_some() == (n != "sub")), "{l:?}");
    forget_all(&l);

    c.hard_link("/d/twice", "/d/second").unwrap();
    let l = list(&kernel);
    assert_eq!(l["twice"], None);
    assert_eq!(l["second"], None);
    assert_eq!(l["once"], Some(1));
    assert_eq!(l["sub"], None, "a directory's are withheld");
    assert_eq!(
        list(&Ctx::root())["sub"],
        Some(2),
        "a library caller gets them"
    );
    forget_all(&l);

    c.remove_file("/d/second").unwrap();
    let l = list(&kernel);
    assert_eq!(l["twice"], None, "still withheld with one name left");
    forget_all(&l);
    assert_eq!(
        list(&Ctx::root())["twice"],
        Some(1),
        "a library caller gets them"
    );

    // No reference was taken for it: its last unlink frees it at once.
    let ino = c.metadata("/d/twice").unwrap().ino();
    c.remove_file("/d/twice").unwrap();
    assert_eq!(fs.getattr(ino), Err(Errno::ENOENT));
    fs.check_invariants().unwrap();
}

/// A FORGET of more lookup references than the inode holds drops those it holds and is
/// counted, and the inode lives on while it has a name (the kernel has been seen to forget
/// once more than it looked up; a panic there would hang the mount).
#[test]
fn a_forget_of_more_than_was_looked_up_is_counted_not_fatal() {
    let (fs, c) = new_fs(Config::default());
    c.write("/f", b"x").unwrap();
    let kernel = Ctx::root().via_kernel();
    let a = fs.lookup(&kernel, Ino::ROOT, b"f").unwrap();
    assert_eq!(fs.over_forgets(), 0);
    fs.forget(a.ino, 3);
    assert_eq!(fs.over_forgets(), 2);
    assert_eq!(c.read("/f").unwrap(), b"x", "still named, still there");
    // Unlinked with no reference left: freed at once.
    c.remove_file("/f").unwrap();
    assert_eq!(fs.getattr(a.ino), Err(Errno::ENOENT));
    fs.forget(a.ino, 1); // of an inode already freed: nothing
    fs.check_invariants().unwrap();
}

#[test]
fn size_and_inode_limits_give_enospc_and_stay_usable() {
    let (fs, c) = new_fs(Config {
        max_bytes: Some(64 * 1024),
        max_inodes: Some(10),
        ..Config::default()
    });
    let mut f = c
        .open("/big", OpenOptions::new().write(true).create(true))
        .unwrap();
    let chunk = vec![7u8; 10_000];
    let mut written = 0;
    loop {
        match f.write(&chunk) {
            Ok(n) => written += n,
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
                break;
            }
        }
    }
    assert_eq!(
        written,
        64 * 1024,
        "filled exactly to the limit (short write at the end)"
    );
    drop(f);
    assert_eq!(fs.statfs().bfree, 0);
    let mut made = 0;
    for i in 0..20 {
        match c.write(format!("/f{i}"), b"") {
            Ok(()) => made += 1,
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ENOSPC)),
        }
    }
    assert_eq!(made, 10 - 2, "root and /big count against the inode limit");
    c.truncate("/big", 0).unwrap();
    assert_eq!(fs.statfs().bfree, fs.statfs().blocks, "space comes back");
    c.remove_file("/f0").unwrap();
    c.write("/again", b"ok").unwrap();
    fs.check_invariants().unwrap();
}

#[test]
fn stale_handles_and_inodes_and_bad_names() {
    let (fs, _c) = new_fs(Config::default());
    let ctx = Ctx::root();
    let (a, fh) = fs
        .create(&ctx, ROOT_INO, b"f", 0o644, libc::O_RDWR)
        .unwrap();
    fs.release(fh).unwrap();
    let mut buf = [0u8; 4];
    assert_eq!(fs.read(fh, 0, &mut buf), Err(Errno::EBADF));
    assert_eq!(fs.write(&ctx, fh, 0, b"x"), Err(Errno::EBADF));
    assert_eq!(fs.release(fh), Err(Errno::EBADF));
    assert_eq!(fs.fsync(12345, false), Err(Errno::EBADF));
    assert_eq!(fs.getattr(Ino(999_999)), Err(Errno::ENOENT));
    assert_eq!(fs.getattr(Ino(u64::MAX)), Err(Errno::ENOENT));
    assert_eq!(fs.lookup(&ctx, a.ino, b"x"), Err(Errno::ENOTDIR));
    assert_eq!(fs.mkdir(&ctx, ROOT_INO, b"a/b", 0o755), Err(Errno::EINVAL));
    assert_eq!(fs.mkdir(&ctx, ROOT_INO, b"a\0b", 0o755), Err(Errno::EINVAL));
    assert_eq!(fs.mkdir(&ctx, ROOT_INO, b"", 0o755), Err(Errno::ENOENT));
    assert_eq!(
        fs.mkdir(&ctx, ROOT_INO, &[b'n'; 256], 0o755),
        Err(Errno::ENAMETOOLONG)
    );
    assert!(fs.mkdir(&ctx, ROOT_INO, &[b'n'; 255], 0o755).is_ok());
    assert_eq!(
        fs.rename(&ctx, ROOT_INO, b"f", ROOT_INO, b"g", 0xff),
        Err(Errno::EINVAL)
    );
    assert_eq!(
        fs.symlink(&ctx, ROOT_INO, b"s", &[b'x'; 4096]),
        Err(Errno::ENAMETOOLONG)
    );
    // Names are bytes, not UTF-8.
    fs.mkdir(&ctx, ROOT_INO, &[0xff, 0xfe, b'x'], 0o755)
        .unwrap();
    assert!(fs.lookup(&ctx, ROOT_INO, &[0xff, 0xfe, b'x']).is_ok());
    let (_, rofh) = fs
        .create(&ctx, ROOT_INO, b"ro", 0o644, libc::O_RDONLY)
        .unwrap();
    assert_eq!(fs.write(&ctx, rofh, 0, b"x"), Err(Errno::EBADF));
    assert_eq!(fs.fallocate(&ctx, rofh, 0, 0, 10), Err(Errno::EBADF));
    fs.release(rofh).unwrap();
    fs.check_invariants().unwrap();
}

#[test]
fn fallocate_allocates_keeps_size_and_punches() {
    let (fs, c) = new_fs(Config::default());
    let ctx = Ctx::root();
    let f = c
        .open("/f", OpenOptions::new().read(true).write(true).create(true))
        .unwrap();
    let fh = f.handle();
    fs.fallocate(&ctx, fh, 0, 0, 3 * 4096).unwrap();
    let a = fs.getattr(f.ino()).unwrap();
    assert_eq!((a.size, a.blocks), (3 * 4096, 24));
    fs.fallocate(&ctx, fh, FALLOC_FL_KEEP_SIZE, 3 * 4096, 4096)
        .unwrap();
    let a = fs.getattr(f.ino()).unwrap();
    assert_eq!((a.size, a.blocks), (3 * 4096, 32));
    f.write_at(&[9u8; 3 * 4096], 0).unwrap();
    fs.fallocate(
        &ctx,
        fh,
        FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
        100,
        4096 + 10,
    )
    .unwrap();
    let mut buf = vec![0u8; 3 * 4096];
    f.read_at(&mut buf, 0).unwrap();
    assert!(buf[..100].iter().all(|&b| b == 9));
    assert!(buf[100..4096 + 110].iter().all(|&b| b == 0));
    assert!(buf[4096 + 110..].iter().all(|&b| b == 9));
    assert_eq!(
        fs.getattr(f.ino()).unwrap().blocks,
        32,
        "no page lies wholly in the hole"
    );
    assert_eq!(
        fs.fallocate(&ctx, fh, FALLOC_FL_PUNCH_HOLE, 0, 1),
        Err(Errno::EOPNOTSUPP)
    );
    assert_eq!(fs.fallocate(&ctx, fh, 0, 0, 0), Err(Errno::EINVAL));
    assert_eq!(
        fs.fallocate(&ctx, fh, 0, i64::MAX as u64, 2),
        Err(Errno::EFBIG)
    );
    drop(f);
    fs.check_invariants().unwrap();
}

#[test]
fn read_only_filesystem_refuses_changes() {
    let (fs, c) = new_fs(Config {
        read_only: true,
        ..Config::default()
    });
    assert_eq!(
        c.create_dir("/d").unwrap_err().raw_os_error(),
        Some(libc::EROFS)
    );
    assert_eq!(
        fs.access(&Ctx::root(), ROOT_INO, MAY_WRITE),
        Err(Errno::EROFS)
    );
    assert!(c.read_dir("/").unwrap().is_empty());
}

#[test]
fn statistics_count_operations_and_locks() {
    let (fs, c) = new_fs(Config {
        locking: Locking::Coarse,
        ..Config::default()
    });
    let before = fs.stats();
    c.create_dir("/d").unwrap();
    c.metadata("/d").unwrap();
    let d = fs.stats().since(&before);
    assert_eq!(d.op(Op::Mkdir), 1);
    assert!(d.op(Op::Lookup) >= 1);
    assert!(
        d.lock(LockClass::Coarse).acquired >= 2,
        "coarse mode takes the global lock per op"
    );
    assert_eq!("dirlock".parse::<Locking>(), Ok(Locking::DirLock));
    assert!("nope".parse::<Locking>().is_err());
    let (lanes, c2) = new_fs(Config::default());
    c2.create_dir("/d").unwrap();
    assert_eq!(
        lanes.stats().lock(LockClass::Coarse).acquired,
        0,
        "lanes never takes it"
    );
    assert_eq!(lanes.stats().lock(LockClass::DirLock).acquired, 0);
}

#[test]
fn readdir_of_removed_directory_is_enoent_and_offsets_resume() {
    let (fs, c) = new_fs(Config::default());
    let ctx = Ctx::root();
    let d = dir_of_100(&c, |i| format!("{i:03}"));
    let fh = fs.opendir(&ctx, d).unwrap();
    let mut first = Vec::new();
    fs.readdir(&ctx, fh, 0, false, |e, _| {
        first.push((e.offset, e.name.to_vec()));
        first.len() < 10
    })
    .unwrap();
    // Resume from the 9th entry's offset: the 10th comes next.
    let mut rest = Vec::new();
    fs.readdir(&ctx, fh, first[8].0, false, |e, _| {
        rest.push(e.name.to_vec());
        true
    })
    .unwrap();
    assert_eq!(rest[0], first[9].1);
    assert_eq!(rest.len(), 102 - 9);
    for i in 0..100 {
        c.remove_file(format!("/d/{i:03}")).unwrap();
    }
    c.remove_dir("/d").unwrap();
    assert_eq!(
        fs.readdir(&ctx, fh, 0, false, |_, _| true),
        Err(Errno::ENOENT)
    );
    assert_eq!(fs.getattr(d).unwrap().nlink, 0, "kept by the open handle");
    fs.releasedir(fh).unwrap();
    assert_eq!(fs.getattr(d), Err(Errno::ENOENT));
}

#[test]
fn path_api_follows_symlinks_and_detects_loops() {
    let (_fs, c) = new_fs(Config::default());
    c.create_dir_all("/a/b/c").unwrap();
    c.symlink("b/c", "/a/link").unwrap();
    c.symlink("/a/link/../..", "/up").unwrap();
    c.write("/a/link/f", b"via link").unwrap();
    assert_eq!(c.read("/a/b/c/f").unwrap(), b"via link");
    assert_eq!(
        c.metadata("/up").unwrap().ino(),
        c.metadata("/a").unwrap().ino(),
        "physical .."
    );
    c.symlink("self", "/self").unwrap();
    assert_eq!(
        c.metadata("/self").unwrap_err().raw_os_error(),
        Some(libc::ELOOP)
    );
    assert_eq!(
        c.read("/a/b/c/f/").unwrap_err().raw_os_error(),
        Some(libc::ENOTDIR)
    );
    let mut c2 = c.clone();
    c2.set_current_dir("/a/b").unwrap();
    assert_eq!(c2.read("c/f").unwrap(), b"via link");
    c.remove_dir_all("/a").unwrap();
    assert!(!c.exists("/a"));
    let deep = "/x".repeat(2100);
    assert_eq!(
        c.create_dir_all(&deep).unwrap_err().raw_os_error(),
        Some(libc::ENAMETOOLONG)
    );
}

/// Records what the filesystem reports to an installed invalidation sink.
#[derive(Default)]
struct Recorder(std::sync::Mutex<Vec<String>>);

impl lanefs::notify::Invalidate for Recorder {
    fn entry(&self, parent: Ino, name: &[u8]) -> bool {
        let name = String::from_utf8_lossy(name);
        self.0
            .lock()
            .unwrap()
            .push(format!("entry {parent} {name}"));
        true
    }
    fn inode(&self, ino: Ino, data: Option<(u64, u64)>) -> bool {
        self.0.lock().unwrap().push(format!("inode {ino} {data:?}"));
        true
    }
    fn listing(&self, dir: Ino) -> bool {
        self.0.lock().unwrap().push(format!("listing {dir}"));
        true
    }
}

impl Recorder {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

#[test]
fn library_changes_are_reported_to_the_invalidator_and_kernel_ones_are_not() {
    let (fs, c) = new_fs(Config::default());
    let rec = Arc::new(Recorder::default());
    fs.set_invalidator(Some(rec.clone()));
    let root = fs.root();
    c.create_dir("/d").unwrap();
    let d = c.metadata("/d").unwrap().ino();
    assert_eq!(rec.take(), [format!("entry {root} d")]);
    c.write("/d/f", b"hello").unwrap();
    let f = c.metadata("/d/f").unwrap().ino();
    assert_eq!(
        rec.take(),
        [
            format!("entry {d} f"),
            format!("inode {f} Some((0, 0))"), // O_TRUNC
            format!("inode {f} Some((0, 5))"),
        ]
    );
    c.hard_link("/d/f", "/g").unwrap();
    assert_eq!(
        rec.take(),
        [format!("inode {f} None"), format!("entry {root} g")]
    );
    // A rename reports the inode it moves (its ctime, seen through its other names), before
    // the names (the kernel may let an inode go once its entry is dropped).
    c.rename("/g", "/d/h").unwrap();
    assert_eq!(
        rec.take(),
        [
            format!("inode {f} None"),
            format!("entry {root} g"),
            format!("entry {d} h")
        ]
    );
    // And the one it replaces (its link count and ctime).
    c.write("/r", b"r").unwrap();
    let r = c.metadata("/r").unwrap().ino();
    rec.take();
    c.rename("/r", "/d/f").unwrap();
    assert_eq!(
        rec.take(),
        [
            format!("inode {r} None"),
            format!("inode {f} None"),
            format!("entry {root} r"),
            format!("entry {d} f")
        ]
    );
    assert_eq!(c.metadata("/d/h").unwrap().attr.nlink, 1);
    c.set_permissions("/d/h", 0o600).unwrap();
    assert_eq!(rec.take(), [format!("inode {f} None")]);
    c.remove_file("/d/h").unwrap();
    assert_eq!(
        rec.take(),
        [format!("inode {f} None"), format!("entry {d} h")]
    );
    // Failed operations report nothing.
    assert!(c.remove_file("/d/nothing").is_err());
    assert!(c.create_dir("/d").is_err());
    assert_eq!(rec.take(), Vec::<String>::new());

    // A directory moved to another parent: its own listing (`..`) changed too; moved within
    // its parent, or a file moved, it did not.
    c.create_dir("/m").unwrap();
    let m = c.metadata("/m").unwrap().ino();
    rec.take();
    c.rename("/m", "/d/m").unwrap();
    assert_eq!(
        rec.take(),
        [
            format!("inode {m} None"),
            format!("listing {m}"),
            format!("entry {root} m"),
            format!("entry {d} m")
        ]
    );
    c.rename("/d/m", "/d/m2").unwrap();
    assert_eq!(
        rec.take(),
        [
            format!("inode {m} None"),
            format!("entry {d} m"),
            format!("entry {d} m2")
        ]
    );
    c.create_dir("/x").unwrap();
    let x = c.metadata("/x").unwrap().ino();
    rec.take();
    c.rename_with_flags("/x", "/d/m2", lanefs::RENAME_EXCHANGE)
        .unwrap();
    assert_eq!(
        rec.take(),
        [
            format!("inode {x} None"),
            format!("inode {m} None"),
            format!("listing {x}"),
            format!("listing {m}"),
            format!("entry {root} x"),
            format!("entry {d} m2")
        ]
    );
    c.remove_dir("/x").unwrap();
    c.remove_dir("/d/m2").unwrap();
    rec.take();

    // The kernel keeps its own caches: nothing it does is reported.
    let kernel = Ctx::root().via_kernel();
    let a = fs.mkdir(&kernel, root, b"k", 0o755).unwrap();
    fs.rmdir(&kernel, root, b"k").unwrap();
    fs.forget(a.ino, 1);
    assert_eq!(rec.take(), Vec::<String>::new());

    fs.set_invalidator(None);
    c.remove_file("/d/f").unwrap();
    assert_eq!(rec.take(), Vec::<String>::new(), "removed sink");
}

/// A sink that, like the kernel, holds no inode until it has been "handed" one: its
/// attribute invalidations find nothing for the first `misses` calls.
struct Late {
    misses: std::sync::atomic::AtomicU32,
    calls: std::sync::atomic::AtomicU32,
}

impl lanefs::notify::Invalidate for Late {
    fn entry(&self, _: Ino, _: &[u8]) -> bool {
        true
    }
    fn inode(&self, _: Ino, _: Option<(u64, u64)>) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        self.calls.fetch_add(1, SeqCst);
        self.misses
            .fetch_update(SeqCst, SeqCst, |m| m.checked_sub(1))
            .is_err()
    }
    fn listing(&self, _: Ino) -> bool {
        true
    }
}

/// A library change whose invalidation finds nothing is tried again while a kernel caller
/// holds a lookup reference on the inode (its answer may not be applied yet), until it lands;
/// it gives up after `SETTLE` and is counted; with no reference held it is not tried again.
#[test]
fn invalidations_of_an_inode_the_kernel_is_being_handed_are_tried_again() {
    use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
    let (fs, c) = new_fs(Config::default());
    c.write("/f", b"x").unwrap();
    let sink = Arc::new(Late {
        misses: AtomicU32::new(0),
        calls: AtomicU32::new(0),
    });
    fs.set_invalidator(Some(sink.clone()));
    let kernel = Ctx::root().via_kernel();
    let f = fs.lookup(&kernel, fs.root(), b"f").unwrap().ino;

    // Held: five misses, then the sixth call lands.
    sink.misses.store(5, SeqCst);
    c.set_permissions("/f", 0o600).unwrap();
    assert_eq!(sink.calls.swap(0, SeqCst), 6);
    assert_eq!(fs.invalidations_given_up(), 0);

    // Held, never found: gives up after SETTLE, counted.
    sink.misses.store(u32::MAX, SeqCst);
    let t = std::time::Instant::now();
    c.set_permissions("/f", 0o640).unwrap();
    assert!(t.elapsed() >= lanefs::notify::SETTLE);
    assert!(sink.calls.swap(0, SeqCst) > 1);
    assert_eq!(fs.invalidations_given_up(), 1);

    // Forgotten: one call, nothing waited for.
    fs.forget(f, 1);
    c.set_permissions("/f", 0o644).unwrap();
    assert_eq!(sink.calls.swap(0, SeqCst), 1);
    assert_eq!(fs.invalidations_given_up(), 1);
    assert_eq!(c.metadata("/f").unwrap().attr.mode & 0o7777, 0o644);
}

/// The data operations by inode, for a caller that keeps open files itself (the FUSE server
/// in no-open mode): same data and attributes as through a handle, no handle involved, and
/// `ftruncate` by `TruncateBy::OpenFile` needs no write permission on the file.
#[test]
fn data_operations_by_inode_match_those_by_handle() {
    let (fs, c) = new_fs(Config::default());
    let user = Ctx::user(1000, 1000);
    c.create_dir("/d").unwrap();
    c.set_permissions("/d", 0o777).unwrap();
    let alice = Client::new(fs.clone(), user.clone());
    alice.write("/d/f", b"").unwrap();
    let ino = alice.metadata("/d/f").unwrap().ino();
    let handles = fs.open_handles();
    assert_eq!(fs.write_inode(&user, ino, 5, b"hello").unwrap(), 5);
    let mut buf = [0xffu8; 16];
    assert_eq!(fs.read_inode(ino, 0, &mut buf).unwrap(), 10);
    assert_eq!(&buf[..10], b"\0\0\0\0\0hello");
    assert_eq!(fs.read_inode(ino, 10, &mut buf).unwrap(), 0, "end of file");
    fs.fallocate_inode(&user, ino, 0, 0, 8192).unwrap();
    assert_eq!(fs.getattr(ino).unwrap().size, 8192);
    assert_eq!(fs.getattr(ino).unwrap().blocks, 16);
    fs.fallocate_inode(
        &user,
        ino,
        FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
        0,
        8192,
    )
    .unwrap();
    assert_eq!(fs.getattr(ino).unwrap().blocks, 0);
    fs.fsync_inode(ino, false).unwrap();
    assert_eq!(fs.open_handles(), handles, "no handle was taken");
    // Read-only for everyone now: truncate by path is refused, an ftruncate of a file the
    // caller holds open for writing is not.
    alice.set_permissions("/d/f", 0o444).unwrap();
    let shrink = SetAttr {
        size: Some(3),
        ..SetAttr::default()
    };
    assert_eq!(
        fs.setattr(&user, ino, &shrink, None).unwrap_err(),
        Errno::EACCES
    );
    let a = fs
        .setattr(&user, ino, &shrink, Some(TruncateBy::OpenFile))
        .unwrap();
    assert_eq!(a.size, 3);
    // By inode, a file must exist; a directory is no file.
    let d = c.metadata("/d").unwrap().ino();
    assert_eq!(fs.read_inode(d, 0, &mut buf).unwrap_err(), Errno::EISDIR);
    assert_eq!(
        fs.read_inode(Ino(999_999), 0, &mut buf).unwrap_err(),
        Errno::ENOENT
    );
    assert_eq!(
        fs.fsync_inode(Ino(999_999), true).unwrap_err(),
        Errno::ENOENT
    );
}

/// `O_NOATIME`: reads through such a handle leave the access time alone (relatime would have
/// set it: the file was just written); only the owner (or root) may ask for it.
#[test]
fn o_noatime_reads_leave_atime_alone_and_need_ownership() {
    let (fs, c) = new_fs(Config::default());
    c.create_dir("/d").unwrap();
    c.set_permissions("/d", 0o777).unwrap();
    c.write("/d/f", b"data").unwrap();
    c.set_permissions("/d/f", 0o644).unwrap();
    let ino = c.metadata("/d/f").unwrap().ino();
    c.set_times("/d/f", Some(TimeSet::At(Timespec::new(1000, 0))), None)
        .unwrap();
    let ctx = Ctx::root();
    let read = |flags| {
        let fh = fs.open(&ctx, ino, flags).unwrap();
        let mut b = [0u8; 4];
        assert_eq!(fs.read(fh, 0, &mut b).unwrap(), 4);
        fs.release(fh).unwrap();
        fs.getattr(ino).unwrap().atime
    };
    assert_eq!(
        read(libc::O_RDONLY | libc::O_NOATIME),
        Timespec::new(1000, 0)
    );
    assert_ne!(
        read(libc::O_RDONLY),
        Timespec::new(1000, 0),
        "relatime updates it"
    );
    let other = Ctx::user(1000, 1000);
    assert_eq!(
        fs.open(&other, ino, libc::O_RDONLY | libc::O_NOATIME),
        Err(Errno::EPERM)
    );
    assert!(fs.open(&other, ino, libc::O_RDONLY).is_ok());
    // A caller that keeps open files itself passes the open's flags with each read.
    c.set_times("/d/f", Some(TimeSet::At(Timespec::new(1000, 0))), None)
        .unwrap();
    let mut b = [0u8; 4];
    fs.read_inode_flags(ino, 0, &mut b, libc::O_RDONLY | libc::O_NOATIME)
        .unwrap();
    assert_eq!(fs.getattr(ino).unwrap().atime, Timespec::new(1000, 0));
    fs.read_inode_flags(ino, 0, &mut b, libc::O_RDONLY).unwrap();
    assert_ne!(fs.getattr(ino).unwrap().atime, Timespec::new(1000, 0));
}

/// The `atime` mount options (`Config::atime`, `Config::no_dir_atime`): `noatime` never
/// moves an access time, `strictatime` on every read (relatime leaves one that is after
/// the last change and less than a day old), `nodiratime` not a directory's.
#[test]
fn access_times_follow_the_atime_options() {
    // An access time after the last change and less than a day old: relatime keeps it.
    let recent = || {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        Timespec::new(now.as_secs() as i64 - 60, 0)
    };
    let run = |atime: Atime, no_dir_atime: bool, old: Timespec| {
        let (fs, c) = new_fs(Config {
            atime,
            no_dir_atime,
            ..Config::default()
        });
        c.create_dir("/d").unwrap();
        c.write("/d/f", b"data").unwrap();
        // Modification and change times before `old` (a SetAttr of the ctime, as FUSE can
        // send one).
        let before = Some(TimeSet::At(Timespec::new(old.sec - 10, 0)));
        for p in ["/d/f", "/d"] {
            c.set_times(p, Some(TimeSet::At(old)), before).unwrap();
            let ino = c.metadata(p).unwrap().ino();
            fs.setattr(
                &Ctx::root(),
                ino,
                &SetAttr {
                    ctime: Some(Timespec::new(old.sec - 10, 0)),
                    ..SetAttr::default()
                },
                None,
            )
            .unwrap();
        }
        assert_eq!(c.read("/d/f").unwrap(), b"data");
        assert!(c.read_dir("/d").unwrap().iter().any(|e| e.name == b"f"));
        let moved = |p: &str| c.metadata(p).unwrap().attr.atime != old;
        (moved("/d/f"), moved("/d"))
    };
    let day_old = Timespec::new(recent().sec - 90_000, 0);
    assert_eq!(run(Atime::Relative, false, recent()), (false, false));
    assert_eq!(run(Atime::Relative, false, day_old), (true, true));
    assert_eq!(run(Atime::Strict, false, recent()), (true, true));
    assert_eq!(run(Atime::Never, false, day_old), (false, false));
    assert_eq!(run(Atime::Relative, true, day_old), (true, false));
    assert_eq!(run(Atime::Strict, true, recent()), (true, false));
}

/// Privileges a change takes away, as the kernel's tmpfs does (checked there with setpriv
/// and setcap): a non-owner's truncate or write clears set-user-ID, and set-group-ID when
/// the file is group-executable or the writer is not in its group; capabilities go on any
/// write, fallocate or chown, root's included; root keeps set-id bits when it writes; a
/// chown clears set-user-ID even when root makes it. None of these fails with EPERM.
#[test]
fn writes_truncates_and_chowns_take_privileges_away_as_linux_does() {
    let (fs, c) = new_fs(Config::default());
    c.create_dir("/d").unwrap();
    c.set_permissions("/d", 0o777).unwrap();
    let nobody = Client::new(fs.clone(), Ctx::user(65534, 65534));
    let member = Client::new(fs.clone(), Ctx::user(65534, 100));
    let mode = |p: &str| c.metadata(p).unwrap().mode() & 0o7777;
    let caps = b"\x01\x00\x00\x02\x80\x00\x00\x00\x80\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00";
    let with_caps = |p: &str| {
        c.write(p, b"").unwrap();
        let ino = c.metadata(p).unwrap().ino();
        fs.setxattr(&Ctx::root(), ino, b"security.capability", caps, 0)
            .unwrap();
        ino
    };
    let append_x = |who: &Client, p: &str| {
        who.open(p, OpenOptions::new().append(true))
            .unwrap()
            .write_all(b"x")
            .unwrap()
    };
    let has_caps = |ino| {
        fs.getxattr(&Ctx::root(), ino, b"security.capability")
            .is_ok()
    };

    c.write("/d/a", b"").unwrap();
    c.set_permissions("/d/a", 0o4777).unwrap();
    nobody.truncate("/d/a", 1).unwrap();
    assert_eq!(
        mode("/d/a"),
        0o777,
        "a non-owner's truncate clears set-user-ID"
    );

    c.write("/d/b", b"").unwrap();
    c.set_permissions("/d/b", 0o2767).unwrap();
    append_x(&nobody, "/d/b");
    assert_eq!(mode("/d/b"), 0o767, "set-group-ID, writer not in the group");
    c.write("/d/c", b"").unwrap();
    c.chown("/d/c", None, Some(100)).unwrap();
    c.set_permissions("/d/c", 0o2767).unwrap();
    append_x(&member, "/d/c");
    assert_eq!(
        mode("/d/c"),
        0o2767,
        "kept: not group-executable, writer in the group"
    );
    c.set_permissions("/d/c", 0o2777).unwrap();
    append_x(&member, "/d/c");
    assert_eq!(
        mode("/d/c"),
        0o777,
        "group-executable: cleared for a member too"
    );

    let d = with_caps("/d/caps-fallocate");
    c.set_permissions("/d/caps-fallocate", 0o777).unwrap();
    let f = nobody
        .open("/d/caps-fallocate", OpenOptions::new().write(true))
        .unwrap();
    fs.fallocate(nobody.ctx(), f.handle(), 0, 0, 4096).unwrap();
    assert!(!has_caps(d), "capabilities go on a non-owner's fallocate");
    let e = with_caps("/d/caps-root-write");
    append_x(&c, "/d/caps-root-write");
    assert!(!has_caps(e), "and on root's write");
    let g = with_caps("/d/caps-chown");
    c.chown("/d/caps-chown", Some(65534), None).unwrap();
    assert!(!has_caps(g), "and on a chown");

    c.write("/d/f", b"").unwrap();
    c.set_permissions("/d/f", 0o6777).unwrap();
    append_x(&c, "/d/f");
    assert_eq!(
        mode("/d/f"),
        0o6777,
        "root keeps set-id bits when it writes"
    );
    c.set_permissions("/d/f", 0o4755).unwrap();
    c.chown("/d/f", Some(65534), None).unwrap();
    assert_eq!(
        mode("/d/f"),
        0o755,
        "a chown clears set-user-ID, root's too"
    );
    fs.check_invariants().unwrap();
}

/// `fs.protected_hardlinks` for library callers: with the rule on, a user may not link
/// another's file they cannot read and write, nor a set-id or special file; with it off, as
/// with the sysctl at 0, they may. Kernel callers are left to the kernel's own setting.
#[test]
fn protected_hardlinks_is_a_policy_with_the_sysctls_default() {
    let default = std::fs::read_to_string("/proc/sys/fs/protected_hardlinks")
        .map_or(true, |s| s.trim() != "0");
    assert_eq!(Config::default().protected_hardlinks, default);
    for protect in [true, false] {
        let (fs, root) = new_fs(Config {
            protected_hardlinks: protect,
            ..Config::default()
        });
        root.create_dir("/pub").unwrap();
        root.set_permissions("/pub", 0o1777).unwrap();
        root.write("/pub/theirs", b"x").unwrap();
        root.set_permissions("/pub/theirs", 0o644).unwrap();
        root.write("/pub/suid", b"x").unwrap();
        root.set_permissions("/pub/suid", 0o4777).unwrap();
        root.mknod("/pub/fifo", libc::S_IFIFO | 0o666, 0).unwrap();
        root.write("/pub/open", b"x").unwrap();
        root.set_permissions("/pub/open", 0o666).unwrap();
        let user = Client::new(fs.clone(), Ctx::user(1000, 1000));
        let kernel = Client::new(fs.clone(), Ctx::user(1000, 1000).via_kernel());
        for (src, refused) in [
            ("theirs", protect),
            ("suid", protect),
            ("fifo", protect),
            ("open", false),
        ] {
            let r = user.hard_link(format!("/pub/{src}"), format!("/pub/{src}-u"));
            match refused {
                true => assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EPERM), "{src}"),
                false => r.unwrap_or_else(|e| panic!("{src} (protect {protect}): {e}")),
            }
            kernel
                .hard_link(format!("/pub/{src}"), format!("/pub/{src}-k"))
                .unwrap_or_else(|e| panic!("{src} via the kernel: {e}"));
        }
        assert_eq!(
            root.metadata("/pub/theirs").unwrap().attr.nlink,
            if protect { 2 } else { 3 }
        );
        fs.check_invariants().unwrap();
    }
}

/// Inode flags where the kernel comparison cannot reach: handles opened before a flag was set
/// (written to, as on Linux), writes and fallocate by inode (checked each time), a read-only
/// filesystem, special files, and the whiteout's inode and link counts.
#[test]
fn inode_flags_on_open_files_and_by_inode() {
    let (fs, c) = new_fs(Config::default());
    let root = Ctx::root();
    let mut f = c
        .open("/f", OpenOptions::new().read(true).write(true).create(true))
        .unwrap();
    let ino = f.ino();
    c.set_flags("/f", FS_IMMUTABLE_FL).unwrap();
    assert_eq!(c.flags("/f").unwrap(), FS_IMMUTABLE_FL);
    // Opened before: writes and an ftruncate go through (as on Linux), fallocate does not.
    f.write_all(b"before").unwrap();
    f.set_len(3).unwrap();
    assert_eq!(fs.fallocate(&root, f.handle(), 0, 0, 10), Err(Errno::EPERM));
    // By inode (a FUSE server's open files): refused.
    assert_eq!(fs.write_inode(&root, ino, 0, b"x"), Err(Errno::EPERM));
    assert_eq!(
        fs.write_inode_flags(&root, ino, 0, b"x", libc::O_WRONLY | libc::O_APPEND),
        Err(Errno::EPERM)
    );
    let set = SetAttr {
        size: Some(0),
        ..SetAttr::default()
    };
    assert_eq!(
        fs.setattr(&root, ino, &set, Some(TruncateBy::OpenFile))
            .map(drop),
        Err(Errno::EPERM)
    );
    // Append only: by inode, O_APPEND writes only; no truncate, no punch, allocations yes.
    c.set_flags("/f", FS_APPEND_FL).unwrap();
    assert_eq!(fs.write_inode(&root, ino, 3, b"x"), Err(Errno::EPERM));
    let a = fs.write_inode_flags(&root, ino, 3, b"x", libc::O_WRONLY | libc::O_APPEND);
    assert_eq!(a, Ok(1));
    assert_eq!(
        f.set_len(0).map_err(|e| e.raw_os_error()),
        Err(Some(libc::EPERM))
    );
    let punch = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
    assert_eq!(
        fs.fallocate_inode(&root, ino, punch, 0, 1),
        Err(Errno::EPERM)
    );
    fs.fallocate_inode(&root, ino, FALLOC_FL_KEEP_SIZE, 0, 8192)
        .unwrap();
    assert_eq!(c.read("/f").unwrap(), b"befx");
    drop(f);
    c.set_flags("/f", 0).unwrap();
    // Other inodes have no flags to show; unknown ones are refused after the owner check.
    c.mknod("/p", libc::S_IFIFO | 0o644, 0).unwrap();
    assert_eq!(
        c.flags("/p").map_err(|e| e.raw_os_error()),
        Err(Some(libc::ENOTTY))
    );
    let user = Client::new(fs.clone(), Ctx::user(5, 5));
    assert_eq!(
        user.set_flags("/f", 0x8).map_err(|e| e.raw_os_error()),
        Err(Some(libc::EPERM))
    );
    assert_eq!(
        c.set_flags("/f", 0x8).map_err(|e| e.raw_os_error()),
        Err(Some(libc::EOPNOTSUPP))
    );
    // A whiteout: a new inode, nlink 1, the directories' counts unchanged by it.
    c.create_dir_all("/s/d").unwrap();
    let before = fs.statfs().ffree;
    c.rename_with_flags("/s/d", "/moved", RENAME_WHITEOUT)
        .unwrap();
    assert_eq!(fs.statfs().ffree, before - 1);
    let w = c.symlink_metadata("/s/d").unwrap();
    assert_eq!((w.mode(), w.attr.nlink, w.attr.rdev), (libc::S_IFCHR, 1, 0));
    assert_eq!(c.metadata("/s").unwrap().attr.nlink, 2);
    assert_eq!(fs.getattr(ROOT_INO).unwrap().nlink, 4); // ., .., s, moved
    fs.check_invariants().unwrap();
    // Read-only: EROFS first.
    let ro = Filesystem::new(Config {
        read_only: true,
        ..Config::default()
    });
    assert_eq!(
        ro.set_flags(&root, ROOT_INO, 0).map(drop),
        Err(Errno::EROFS)
    );
    assert_eq!(ro.get_flags(ROOT_INO), Ok(0));
}

/// `readdir_inode` reads without a handle up to the end it is given: names created after the
/// end was taken are left out (so a read that keeps its end ends), a fresh end includes them,
/// reading resumes after any returned cookie, and it needs a live directory.
#[test]
fn readdir_by_inode_stops_at_the_end_it_is_given() {
    let (fs, c) = new_fs(Config::default());
    let ctx = Ctx::root();
    let d = dir_of_100(&c, |i| format!("f{i}"));
    let read = |from: u64, end: &DirEnd| {
        let mut out = Vec::new();
        fs.readdir_inode(&ctx, d, from, end, false, |e, _| {
            out.push((String::from_utf8(e.name.to_vec()).unwrap(), e.offset));
            true
        })
        .unwrap();
        out
    };
    let end = fs.read_end(d).unwrap();
    let all = read(0, &end);
    assert_eq!(all.len(), 102);
    assert_eq!(&all[0].0, ".");
    assert_eq!(&all[1].0, "..");
    // A name renamed away and back gets a new cookie: past the old end, not read again.
    c.rename("/d/f5", "/d/tmp").unwrap();
    c.rename("/d/tmp", "/d/f5").unwrap();
    c.write("/d/new", b"").unwrap();
    let (cut_name, cut) = all[50].clone();
    let rest = read(cut, &end);
    let names: Vec<&str> = rest.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(rest.len(), 51, "{names:?}");
    assert!(!names.contains(&"new") && !names.contains(&cut_name.as_str()));
    // A fresh end sees both.
    let again = read(0, &fs.read_end(d).unwrap());
    assert_eq!(again.len(), 103);
    assert!(again.iter().any(|(n, _)| n == "new"));
    assert_eq!(again.iter().filter(|(n, _)| n == "f5").count(), 1);
    c.remove_dir_all("/d").unwrap();
    assert_eq!(
        fs.readdir_inode(&ctx, d, 0, &end, false, |_, _| true),
        Err(Errno::ENOENT)
    );
}

/// `At` resolves from a given directory, and confined it refuses with EXDEV exactly the
/// paths that leave the filesystem when it is mounted in a larger tree: absolute paths,
/// absolute symlink targets (anywhere in the walk), and `..` from the root; everything else
/// resolves as the path API does.
#[test]
fn a_confined_resolution_hands_back_what_leaves_the_filesystem() {
    use lanefs::At;
    let fs = Arc::new(Filesystem::new(Config::default()));
    let c = Client::root(fs.clone());
    c.create_dir_all("/a/b").unwrap();
    c.write("/a/b/f", b"x").unwrap();
    c.symlink("b/f", "/a/rel").unwrap();
    c.symlink("/a/b/f", "/a/abs").unwrap();
    c.symlink("../..", "/a/up").unwrap();
    let ctx = lanefs::Ctx::root();
    let a = c.metadata("/a").unwrap().attr;
    let at = At::new(&fs, &ctx, a.ino).confined();
    assert_eq!(at.stat(b"rel", true).unwrap().size, 1);
    assert_eq!(at.stat(b"b/../rel", true).unwrap().size, 1);
    assert_eq!(
        at.stat(b"abs", false).unwrap().kind(),
        lanefs::FileType::Symlink
    );
    for (path, follow) in [
        (&b"abs"[..], true),
        (b"/a", true),
        (b"../..", true),
        (b"up/x", true),
        (b"abs/x", false),
    ] {
        assert_eq!(at.stat(path, follow), Err(Errno::EXDEV), "{path:?}");
    }
    assert_eq!(at.mkdir(b"../../x", 0o755), Err(Errno::EXDEV));
    assert_eq!(
        at.rmdir(b".."),
        Err(Errno::ENOTEMPTY),
        "as Linux: rmdir(\"a/..\")"
    );
    let root = At::new(&fs, &ctx, lanefs::ROOT_INO).confined();
    assert_eq!(root.rmdir(b".."), Err(Errno::EXDEV));
    // Unconfined, the same paths resolve inside the filesystem, as the path API's do.
    let free = At::new(&fs, &ctx, a.ino);
    assert_eq!(free.stat(b"abs", true).unwrap().size, 1);
    assert_eq!(free.stat(b"/a", true).unwrap().ino, a.ino);
    // Two directories: a rename and a link from one to the other.
    let b = root.stat(b"a/b", true).unwrap();
    let in_b = root.from_dir(b.ino);
    at.rename(b"rel", &in_b, b"moved", 0).unwrap();
    assert_eq!(in_b.readlink(b"moved").unwrap(), b"b/f");
    in_b.link(b"f", false, &root, b"hard").unwrap();
    assert_eq!(root.stat(b"hard", true).unwrap().nlink, 2);
}

/// `fs.protected_symlinks` for library callers (the channel of `lanefs run` among them): in
/// a sticky, world-writable directory a symlink is followed only by its owner or when the
/// directory's owner owns it too, root included (`may_follow_link`); elsewhere, and with
/// the rule off, by anyone.
#[test]
fn protected_symlinks_are_followed_only_by_their_owners() {
    for protect in [true, false] {
        let fs = Filesystem::new(Config {
            protected_symlinks: protect,
            ..Config::default()
        });
        let root = Ctx::root();
        let d = fs.mkdir(&root, ROOT_INO, b"tmp", 0o1777).unwrap().ino;
        fs.mkdir(&root, ROOT_INO, b"plain", 0o777).unwrap();
        let user = Ctx::user(1000, 1000);
        let other = Ctx::user(2000, 2000);
        fs.symlink(&user, d, b"l", b"/tmp").unwrap();
        let plain = fs.lookup(&root, ROOT_INO, b"plain").unwrap().ino;
        fs.symlink(&user, plain, b"l", b"/tmp").unwrap();
        let follow = |ctx: &Ctx, path: &[u8]| {
            lanefs::At::new(&fs, ctx, ROOT_INO)
                .stat(path, true)
                .map(|_| ())
        };
        assert_eq!(follow(&user, b"/tmp/l"), Ok(()), "its owner");
        let refused = if protect { Err(Errno::EACCES) } else { Ok(()) };
        assert_eq!(follow(&other, b"/tmp/l"), refused, "protect {protect}");
        assert_eq!(follow(&root, b"/tmp/l/"), refused, "root too");
        assert_eq!(follow(&other, b"/plain/l"), Ok(()), "not sticky");
        // Not followed: nothing to refuse.
        assert!(
            lanefs::At::new(&fs, &other, ROOT_INO)
                .stat(b"/tmp/l", false)
                .is_ok()
        );
    }
}
