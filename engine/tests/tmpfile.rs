//! `O_TMPFILE`: a regular file made with no name ([`Filesystem::tmpfile`]), in no listing,
//! freed when closed unless a link gives it a name first; what a create in its directory
//! would check and give it; the link that names it (not after `O_EXCL`, and never for a
//! file whose last name went); and links racing listings.

use std::io::{Read, Write};
use std::sync::Arc;

use lanefs::*;

mod common;

fn new_fs(cfg: Config) -> (Arc<Filesystem>, Client) {
    let fs = Arc::new(Filesystem::new(cfg));
    let c = Client::root(fs.clone());
    (fs, c)
}

fn names(c: &Client, dir: &str) -> Vec<String> {
    let mut v: Vec<String> = c
        .read_dir(dir)
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8(e.name).unwrap())
        .collect();
    v.sort();
    v
}

fn rw() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.read(true).write(true).mode(0o600);
    o
}

#[test]
fn a_tmpfile_has_no_name_counts_against_the_limits_and_goes_with_its_last_close() {
    let (fs, c) = new_fs(Config::default());
    c.create_dir("/d").unwrap();
    c.write("/d/other", b"x").unwrap();
    let d_before = c.metadata("/d").unwrap();
    let st0 = fs.statfs();
    let mut f = c.open_tmpfile("/d", &rw()).unwrap();
    let a = f.metadata().unwrap();
    assert_eq!(a.attr.nlink, 0, "no name");
    assert_eq!(a.mode(), libc::S_IFREG | 0o600);
    assert_eq!(a.len(), 0);
    assert_eq!(names(&c, "/d"), ["other"], "in no listing");
    assert_eq!(fs.statfs().ffree, st0.ffree - 1, "one inode taken");
    let data = vec![b't'; 3 * 4096 + 10];
    f.write_all(&data).unwrap();
    assert_eq!(fs.statfs().bfree, st0.bfree - 4, "four pages taken");
    let mut back = Vec::new();
    std::io::Seek::rewind(&mut f).unwrap();
    f.read_to_end(&mut back).unwrap();
    assert_eq!(back, data);
    // The directory is left alone: no entry, no time stamped (as tmpfs).
    let d_after = c.metadata("/d").unwrap();
    assert_eq!(d_after.attr.mtime, d_before.attr.mtime);
    assert_eq!(d_after.attr.ctime, d_before.attr.ctime);
    assert_eq!(d_after.len(), d_before.len());
    fs.check_invariants().unwrap();
    let ino = f.ino();
    drop(f);
    assert_eq!(
        fs.getattr(ino),
        Err(Errno::ENOENT),
        "freed by its last close"
    );
    assert_eq!(fs.statfs(), st0, "its inode and pages given back");
    fs.check_invariants().unwrap();
}

#[test]
fn a_link_gives_it_a_name_with_the_data_written_before() {
    let (fs, c) = new_fs(Config::default());
    c.create_dir("/d").unwrap();
    let mut f = c.open_tmpfile("/d", &rw()).unwrap();
    f.write_all(b"written before the link").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20)); // a later tick of the clock
    let d_before = c.metadata("/d").unwrap();
    c.link_file(&f, "/d/named").unwrap();
    let a = c.metadata("/d/named").unwrap();
    assert_eq!(a.ino(), f.ino());
    assert_eq!(a.attr.nlink, 1);
    assert_eq!(names(&c, "/d"), ["named"]);
    assert!(c.metadata("/d").unwrap().attr.mtime > d_before.attr.mtime);
    assert_eq!(c.read("/d/named").unwrap(), b"written before the link");
    // Written after, through the tmpfile's own handle: one file.
    f.write_all(b", and after").unwrap();
    // A second name, as for any file (the first link took the tmpfile's mark).
    c.link_file(&f, "/second").unwrap();
    assert_eq!(f.metadata().unwrap().attr.nlink, 2);
    drop(f);
    assert_eq!(
        c.read("/second").unwrap(),
        b"written before the link, and after"
    );
    c.remove_file("/d/named").unwrap();
    assert_eq!(c.metadata("/second").unwrap().attr.nlink, 1);
    fs.check_invariants().unwrap();
}

#[test]
fn o_excl_forbids_a_name_and_a_named_then_unlinked_file_gets_none() {
    let (fs, c) = new_fs(Config::default());
    let excl = *rw().create_new(true);
    let f = c.open_tmpfile("/", &excl).unwrap();
    let e = c.link_file(&f, "/x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "O_TMPFILE|O_EXCL");
    assert!(!c.exists("/x"));
    drop(f);

    // An ordinary file whose last name went: ENOENT, as ever.
    let f = c
        .open("/plain", OpenOptions::new().write(true).create(true))
        .unwrap();
    c.remove_file("/plain").unwrap();
    let e = c.link_file(&f, "/back").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "unlinked open file");
    drop(f);

    // A tmpfile named once and unlinked again is such a file too.
    let f = c.open_tmpfile("/", &rw()).unwrap();
    c.link_file(&f, "/once").unwrap();
    c.remove_file("/once").unwrap();
    assert_eq!(f.metadata().unwrap().attr.nlink, 0);
    let e = c.link_file(&f, "/twice").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    drop(f);

    // A link that fails for the name (EEXIST) leaves the tmpfile linkable.
    c.write("/taken", b"").unwrap();
    let f = c.open_tmpfile("/", &rw()).unwrap();
    let e = c.link_file(&f, "/taken").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
    c.link_file(&f, "/free").unwrap();
    drop(f);
    assert_eq!(names(&c, "/"), ["free", "taken"]);
    fs.check_invariants().unwrap();
    assert_eq!(
        fs.statfs().files - fs.statfs().ffree,
        3,
        "root, taken, free"
    );
}

#[test]
fn the_directory_is_checked_as_for_a_create() {
    let (fs, c) = new_fs(Config::default());
    c.create_dir("/d").unwrap();
    c.set_permissions("/d", 0o755).unwrap();
    c.write("/file", b"").unwrap();
    let user = Client::new(fs.clone(), Ctx::user(1000, 1000));
    let err = |r: std::io::Result<File<'_>>| r.map(drop).unwrap_err().raw_os_error();
    assert_eq!(
        err(user.open_tmpfile("/d", &rw())),
        Some(libc::EACCES),
        "no write permission on the directory"
    );
    c.set_permissions("/d", 0o733).unwrap();
    assert!(user.open_tmpfile("/d", &rw()).is_ok(), "write and search");
    c.set_permissions("/d", 0o776).unwrap();
    assert_eq!(
        err(user.open_tmpfile("/d", &rw())),
        Some(libc::EACCES),
        "write without search"
    );
    assert_eq!(err(c.open_tmpfile("/file", &rw())), Some(libc::ENOTDIR));
    assert_eq!(err(c.open_tmpfile("/missing", &rw())), Some(libc::ENOENT));
    assert_eq!(
        err(c.open_tmpfile("/", OpenOptions::new().read(true))),
        Some(libc::EINVAL),
        "read-only access"
    );
    // A directory removed after it was found: ENOENT, by number and by exact id.
    c.create_dir("/gone").unwrap();
    let gone = c.metadata("/gone").unwrap();
    let ctx = Ctx::root().via_kernel();
    let kept = fs.lookup(&ctx, ROOT_INO, b"gone").unwrap(); // the kernel's reference
    c.remove_dir("/gone").unwrap();
    let id = InodeId {
        ino: kept.ino,
        generation: kept.generation,
    };
    assert_eq!(
        fs.tmpfile(&Ctx::root(), gone.ino(), 0o600, libc::O_RDWR)
            .map(drop),
        Err(Errno::ENOENT)
    );
    assert_eq!(
        fs.tmpfile(&Ctx::root(), id, 0o600, libc::O_RDWR).map(drop),
        Err(Errno::ENOENT)
    );
    fs.forget(kept.ino, 1);
    // An immutable directory refuses it (EPERM), as a create.
    c.set_flags("/d", FS_IMMUTABLE_FL).unwrap();
    assert_eq!(err(c.open_tmpfile("/d", &rw())), Some(libc::EPERM));
    c.set_flags("/d", 0).unwrap();
    fs.check_invariants().unwrap();
    assert_eq!(fs.statfs().files - fs.statfs().ffree, 3, "root, d, file");

    let (ro, _) = new_fs(Config {
        read_only: true,
        ..Config::default()
    });
    assert_eq!(
        ro.tmpfile(&Ctx::root(), ROOT_INO, 0o600, libc::O_RDWR)
            .map(drop),
        Err(Errno::EROFS)
    );
}

/// The attributes and ACL a new file gets in `dir` from `c`: by a create, and by a tmpfile.
fn created_and_tmpfile(c: &Client, dir: &str, mode: u32) -> [(u32, u32, u32, u32, Vec<u8>); 2] {
    let fs = c.fs();
    let acl = |ino| {
        fs.getxattr(&Ctx::root(), ino, b"system.posix_acl_access")
            .unwrap_or_default()
    };
    let path = format!("{dir}/created");
    let f = c
        .open(
            &path,
            OpenOptions::new().write(true).create(true).mode(mode),
        )
        .unwrap();
    let a = f.metadata().unwrap().attr;
    let created = (
        a.mode,
        a.uid,
        a.gid,
        fs.get_flags(a.ino).unwrap(),
        acl(a.ino),
    );
    drop(f);
    fs.unlink(&Ctx::root(), c.metadata(dir).unwrap().ino(), b"created")
        .unwrap();
    let f = c
        .open_tmpfile(dir, OpenOptions::new().write(true).mode(mode))
        .unwrap();
    let a = f.metadata().unwrap().attr;
    let tmp = (
        a.mode,
        a.uid,
        a.gid,
        fs.get_flags(a.ino).unwrap(),
        acl(a.ino),
    );
    [created, tmp]
}

#[test]
fn owner_group_mode_acl_and_inherited_flags_are_a_creates() {
    let (fs, c) = new_fs(Config::default());
    c.create_dir("/sgid").unwrap();
    c.chown("/sgid", None, Some(50)).unwrap();
    c.set_permissions("/sgid", 0o2777).unwrap();
    c.create_dir("/acl").unwrap();
    c.set_permissions("/acl", 0o777).unwrap();
    let def = common::named_user_acl(1000, 7, 5);
    let acl_dir = c.metadata("/acl").unwrap().ino();
    fs.setxattr(&Ctx::root(), acl_dir, b"system.posix_acl_default", &def, 0)
        .unwrap();
    c.create_dir("/flags").unwrap();
    c.set_permissions("/flags", 0o777).unwrap();
    c.set_flags("/flags", FS_NODUMP_FL | FS_NOATIME_FL).unwrap();
    let user = Client::new(fs.clone(), Ctx::user(1000, 1000).with_umask(0o027));
    for (dir, mode) in [
        ("/sgid", 0o2777),
        ("/sgid", 0o666),
        ("/acl", 0o666),
        ("/flags", 0o4755),
    ] {
        let [created, tmp] = created_and_tmpfile(&user, dir, mode);
        assert_eq!(tmp, created, "{dir}, mode {mode:o}");
    }
    let [_, (mode, uid, gid, _, _)] = created_and_tmpfile(&user, "/sgid", 0o666);
    assert_eq!(
        (mode, uid, gid),
        (libc::S_IFREG | 0o640, 1000, 50),
        "umask 027, the setgid directory's group"
    );
    let [_, (mode, _, _, _, acl)] = created_and_tmpfile(&user, "/acl", 0o666);
    assert_eq!(mode & 0o777, 0o640, "the default ACL masks, not the umask");
    assert!(!acl.is_empty(), "it inherits an access ACL");
    let [_, (_, _, _, flags, _)] = created_and_tmpfile(&user, "/flags", 0o600);
    assert_eq!(flags, FS_NODUMP_FL | FS_NOATIME_FL);
    fs.check_invariants().unwrap();
}

#[test]
fn a_kernel_tmpfile_lives_until_its_handle_and_lookup_are_both_gone() {
    let (fs, c) = new_fs(Config::default());
    let ctx = Ctx::root().via_kernel();
    let (a, fh) = fs.tmpfile(&ctx, ROOT_INO, 0o600, libc::O_RDWR).unwrap();
    assert_eq!(a.nlink, 0);
    fs.write(&ctx, fh, 0, b"kernel").unwrap();
    fs.release(fh).unwrap();
    assert_eq!(fs.getattr(a.ino).unwrap().size, 6, "its lookup keeps it");
    // FUSE LINK names it by number; the kernel's reference comes with the reply.
    let l = fs.link(&ctx, a.ino, ROOT_INO, b"k").unwrap();
    assert_eq!(l.nlink, 1);
    fs.forget(a.ino, 2);
    assert_eq!(c.read("/k").unwrap(), b"kernel");

    let (b, fh) = fs.tmpfile(&ctx, ROOT_INO, 0o600, libc::O_WRONLY).unwrap();
    fs.forget(b.ino, 1);
    assert!(fs.getattr(b.ino).is_ok(), "its handle keeps it");
    fs.release(fh).unwrap();
    assert_eq!(fs.getattr(b.ino), Err(Errno::ENOENT));
    assert_eq!(fs.statfs().files - fs.statfs().ffree, 2, "root and /k");
    fs.check_invariants().unwrap();
}

#[test]
fn every_locking_mode_makes_and_links_tmpfiles() {
    for locking in Locking::ALL {
        let (fs, c) = new_fs(Config {
            locking,
            ..Config::default()
        });
        let mut f = c.open_tmpfile("/", &rw()).unwrap();
        f.write_all(b"m").unwrap();
        c.link_file(&f, "/m").unwrap();
        drop(f);
        drop(c.open_tmpfile("/", &rw()).unwrap());
        assert_eq!(c.read("/m").unwrap(), b"m", "{locking:?}");
        fs.check_invariants().unwrap();
        assert_eq!(fs.statfs().files - fs.statfs().ffree, 2, "{locking:?}");
    }
}

/// Threads make tmpfiles in one directory, write them, and link each under one or two
/// names (some are never linked, some are `O_EXCL`), while others list the directory: a
/// listed name always has its whole contents and a link count of at least 1 (a tmpfile is
/// never seen before its link), and at the end every file's link count is its number of
/// names and nothing else is left.
#[test]
fn links_of_tmpfiles_racing_listings() {
    const MAKERS: usize = 4;
    const FILES: usize = 300;
    let (fs, c) = new_fs(Config::default());
    c.create_dir("/d").unwrap();
    let dir = c.metadata("/d").unwrap().ino();
    let done = std::sync::atomic::AtomicBool::new(false);
    let content = |t: usize, i: usize| format!("file {t}-{i} ").repeat(1 + i % 700);
    std::thread::scope(|s| {
        let makers: Vec<_> = (0..MAKERS)
            .map(|t| {
                let fs = fs.clone();
                s.spawn(move || {
                    let c = Client::root(fs);
                    let mut named = 0;
                    for i in 0..FILES {
                        let mut o = rw();
                        if i % 7 == 3 {
                            o.create_new(true); // O_EXCL
                        }
                        let mut f = c.open_tmpfile("/d", &o).unwrap();
                        f.write_all(content(t, i).as_bytes()).unwrap();
                        if i % 5 == 4 && i % 7 != 3 {
                            continue; // closed unnamed: freed
                        }
                        let r = c.link_file(&f, format!("/d/a{t}-{i}"));
                        if i % 7 == 3 {
                            assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::ENOENT));
                            continue;
                        }
                        r.unwrap();
                        named += 1;
                        if i % 3 == 0 {
                            c.link_file(&f, format!("/d/b{t}-{i}")).unwrap();
                        }
                    }
                    named
                })
            })
            .collect();
        let listers: Vec<_> = (0..2)
            .map(|_| {
                let fs = fs.clone();
                let done = &done;
                s.spawn(move || {
                    let ctx = Ctx::root();
                    let mut seen = 0usize;
                    while !done.load(std::sync::atomic::Ordering::Relaxed) {
                        let fh = fs.opendir(&ctx, dir).unwrap();
                        let mut listed = Vec::new();
                        fs.readdir(&ctx, fh, 0, true, |e, a| {
                            if e.name != b"." && e.name != b".." {
                                let a = a.expect("readdirplus attributes");
                                assert!(a.nlink >= 1, "{:?} listed with nlink 0", e.name);
                                listed.push((e.name.to_vec(), a.ino));
                            }
                            true
                        })
                        .unwrap();
                        fs.releasedir(fh).unwrap();
                        let c = Client::root(fs.clone());
                        for (name, _) in listed.iter().step_by(7) {
                            let name = String::from_utf8(name.clone()).unwrap();
                            let (t, i) = name[1..].split_once('-').unwrap();
                            let (t, i) = (t.parse().unwrap(), i.parse().unwrap());
                            match c.read(format!("/d/{name}")) {
                                Ok(data) => assert_eq!(data, content(t, i).as_bytes()),
                                Err(e) => panic!("{name} listed, then {e}"),
                            }
                        }
                        seen += listed.len();
                    }
                    seen
                })
            })
            .collect();
        let named: usize = makers.into_iter().map(|h| h.join().unwrap()).sum();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let seen: usize = listers.into_iter().map(|l| l.join().unwrap()).sum();
        eprintln!("{named} files named, {seen} names listed while they were");
        let listed = c.read_dir("/d").unwrap();
        let seconds = (0..FILES).filter(|i| i % 3 == 0 && i % 7 != 3 && i % 5 != 4);
        assert_eq!(listed.len(), named + MAKERS * seconds.count());
        for e in &listed {
            let name = String::from_utf8(e.name.clone()).unwrap();
            let (t, i): (usize, usize) = {
                let (t, i) = name[1..].split_once('-').unwrap();
                (t.parse().unwrap(), i.parse().unwrap())
            };
            let want = if i % 3 == 0 { 2 } else { 1 };
            let a = c.metadata(format!("/d/{name}")).unwrap();
            assert_eq!(a.attr.nlink, want, "{name}");
            assert_eq!(
                c.read(format!("/d/{name}")).unwrap(),
                content(t, i).as_bytes()
            );
        }
    });
    let report = fs.check_invariants().unwrap();
    assert_eq!(
        fs.statfs().files - fs.statfs().ffree,
        report.inodes,
        "no tmpfile left behind"
    );
    let named_files = (0..FILES).filter(|i| i % 7 != 3 && i % 5 != 4).count() * MAKERS;
    assert_eq!(
        report.inodes as usize,
        2 + named_files,
        "root, /d, the named"
    );
}
