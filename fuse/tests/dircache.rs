//! The kernel's cache of directory listings on a lanefs mount (`FOPEN_CACHE_DIR`, see the
//! `lanefs-fuse` module doc, "Directory listings"): a listing is served from the cache, and a
//! cached listing never misses a change, whether the change comes through the mount or
//! through the library while mounted, from one thread or two, including a directory's `..`
//! after it moved. Every listing is compared with the engine's own (`.` and `..` included,
//! with inode numbers and types). Needs root, /dev/fuse and fuse3, as `mount.rs`.

mod common;

use common::{unmount_retrying, wait_for_mount};

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use lanefs::{Config, Ctx, FileType, Filesystem, Ino};
use lanefs_fuse::MountConfig;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

struct Mounted {
    fs: Arc<Filesystem>,
    dir: tempfile::TempDir,
    mount: Option<lanefs_fuse::Mount>,
}

impl Mounted {
    fn new() -> Mounted {
        Mounted::with_ttl(Duration::from_secs(60))
    }

    fn with_ttl(ttl: Duration) -> Mounted {
        let fs = Arc::new(Filesystem::new(Config::default()));
        let dir = tempfile::tempdir().unwrap();
        let mc = MountConfig {
            ttl,
            ..MountConfig::default()
        };
        let mount = lanefs_fuse::mount_background(fs.clone(), dir.path(), &mc)
            .unwrap_or_else(|e| panic!("mount: {e} (run as root with fuse3 installed)"));
        wait_for_mount(dir.path());
        Mounted {
            fs,
            dir,
            mount: Some(mount),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn unmount_and_check(mut self) {
        let mut mount = self.mount.take().unwrap();
        unmount_retrying(&mut mount, Duration::from_millis(50)).expect("unmount");
        self.fs
            .check_invariants()
            .unwrap_or_else(|e| panic!("invariants after unmount:\n{e}"));
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(m) = &mut self.mount {
            let _ = m.unmount();
        }
    }
}

/// name -> (inode number, `d_type`), `.` and `..` included.
type Listing = BTreeMap<Vec<u8>, (u64, u8)>;

/// A listing through the mount, with `opendir` / `readdir` (one `getdents` stream), of a
/// directory that nothing changes meanwhile: no name comes twice.
fn list_mount(dir: &Path) -> std::io::Result<Listing> {
    let mut out = Listing::new();
    for (name, ino, ty) in stream(dir)? {
        assert!(out.insert(name, (ino, ty)).is_none(), "a name listed twice");
    }
    Ok(out)
}

/// The names one `opendir` / `readdir` stream of `dir` returns, of a directory that may be
/// changing: a name removed and made again while the stream runs may come twice (two
/// files, as on tmpfs).
fn names_mount(dir: &Path) -> BTreeSet<Vec<u8>> {
    stream(dir)
        .unwrap()
        .into_iter()
        .map(|(n, _, _)| n)
        .collect()
}

/// Every entry of one `opendir` / `readdir` stream of `dir`: name, inode number, `d_type`.
fn stream(dir: &Path) -> std::io::Result<Vec<(Vec<u8>, u64, u8)>> {
    let c = CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: `c` is a valid C string.
    let d = unsafe { libc::opendir(c.as_ptr()) };
    if d.is_null() {
        return Err(std::io::Error::last_os_error());
    }
    let mut out = Vec::new();
    loop {
        // SAFETY: `d` is an open directory stream, used by this thread only.
        let e = unsafe { libc::readdir(d) };
        if e.is_null() {
            break;
        }
        // SAFETY: readdir returned a valid entry, alive until the next readdir on `d`.
        let (name, ino, ty) = unsafe {
            let e = &*e;
            let name = std::ffi::CStr::from_ptr(e.d_name.as_ptr())
                .to_bytes()
                .to_vec();
            (name, e.d_ino, e.d_type)
        };
        out.push((name, ino, ty));
    }
    // SAFETY: `d` came from opendir and is closed once.
    unsafe { libc::closedir(d) };
    Ok(out)
}

fn d_type(k: FileType) -> u8 {
    match k {
        FileType::RegularFile => libc::DT_REG,
        FileType::Directory => libc::DT_DIR,
        FileType::Symlink => libc::DT_LNK,
        FileType::CharDevice => libc::DT_CHR,
        FileType::BlockDevice => libc::DT_BLK,
        FileType::NamedPipe => libc::DT_FIFO,
        FileType::Socket => libc::DT_SOCK,
    }
}

/// The engine's listing of directory `ino` (the truth).
fn list_engine(fs: &Filesystem, ino: u64) -> Listing {
    let ctx = Ctx::root();
    let fh = fs.opendir(&ctx, Ino(ino)).unwrap();
    let mut out = Listing::new();
    fs.readdir(&ctx, fh, 0, false, |e, _| {
        out.insert(e.name.to_vec(), (e.ino.get(), d_type(e.kind)));
        true
    })
    .unwrap();
    fs.releasedir(fh).unwrap();
    out
}

fn show(l: &Listing) -> Vec<String> {
    l.iter()
        .map(|(n, (i, t))| format!("{}:{i}:{t}", String::from_utf8_lossy(n)))
        .collect()
}

/// Lists `rel` under the mount and compares it with the engine's listing.
fn check(m: &Mounted, rel: &str, what: &str) {
    let p = m.path().join(rel);
    let ino = std::fs::symlink_metadata(&p).unwrap().ino();
    let seen = list_mount(&p).unwrap();
    let truth = list_engine(&m.fs, ino);
    assert_eq!(
        show(&seen),
        show(&truth),
        "listing of {rel} after {what} differs from the engine's"
    );
}

/// The directories to check: the top ones and every directory directly in them.
fn dirs(m: &Mounted, tops: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for t in tops {
        out.push(t.to_string());
        let ino = std::fs::symlink_metadata(m.path().join(t)).unwrap().ino();
        for (n, (_, ty)) in list_engine(&m.fs, ino) {
            if ty == libc::DT_DIR && n != b"." && n != b".." {
                out.push(format!("{t}/{}", String::from_utf8(n).unwrap()));
            }
        }
    }
    out
}

const TOPS: [&str; 3] = ["d0", "d1", "o"];

/// One random namespace change among `TOPS`, through the mount or through the library;
/// it may fail (a name taken or missing), which changes nothing. Returns what it tried.
fn random_change(m: &Mounted, lib: &lanefs::Client, rng: &mut StdRng) -> String {
    let top = |rng: &mut StdRng| TOPS[rng.random_range(0..TOPS.len())];
    let name = |rng: &mut StdRng| format!("n{}", rng.random_range(0..8));
    let (a, b) = (
        format!("{}/{}", top(rng), name(rng)),
        format!("{}/{}", top(rng), name(rng)),
    );
    let via_mount = rng.random_bool(0.5);
    let op = rng.random_range(0..8);
    let mp = |r: &str| m.path().join(r);
    let lp = |r: &str| PathBuf::from("/").join(r);
    let r: Result<(), std::io::Error> = if via_mount {
        match op {
            0 => std::fs::File::create(mp(&a)).map(drop),
            1 => std::fs::remove_file(mp(&a)),
            2 | 3 => std::fs::rename(mp(&a), mp(&b)),
            4 => std::fs::create_dir(mp(&a)),
            5 => std::fs::remove_dir(mp(&a)),
            6 => std::fs::hard_link(mp(&a), mp(&b)),
            _ => std::os::unix::fs::symlink("t", mp(&a)),
        }
    } else {
        match op {
            0 => lib.write(lp(&a), b"").map(drop),
            1 => lib.remove_file(lp(&a)),
            2 | 3 => lib.rename(lp(&a), lp(&b)),
            4 => lib.create_dir(lp(&a)),
            5 => lib.remove_dir(lp(&a)),
            6 => lib.hard_link(lp(&a), lp(&b)),
            _ => lib.symlink("t", lp(&a)),
        }
    };
    let via = if via_mount { "mount" } else { "library" };
    format!(
        "{via} op {op} {a} {b}: {:?}",
        r.map_err(|e| e.raw_os_error())
    )
}

/// A listing read twice with no change in between is read from the kernel's cache the second
/// time: no READDIR reaches the engine. A change through the mount makes the next read ask.
/// The kernel opens directories by itself: no OPENDIR reaches the engine either.
#[test]
fn a_listing_is_served_from_the_kernel_cache() {
    let m = Mounted::new();
    let d = m.path().join("d");
    std::fs::create_dir(&d).unwrap();
    for i in 0..50 {
        std::fs::File::create(d.join(format!("f{i}"))).unwrap();
    }
    let readdirs = || m.fs.stats().op(lanefs::Op::Readdir);
    let opendirs = || m.fs.stats().op(lanefs::Op::Opendir);
    let opened = opendirs();
    let first = list_mount(&d).unwrap();
    assert_eq!(first.len(), 52);
    let before = readdirs();
    for _ in 0..5 {
        assert_eq!(list_mount(&d).unwrap(), first);
    }
    assert_eq!(readdirs(), before, "cached listings sent READDIR");
    std::fs::File::create(d.join("new")).unwrap();
    let after = list_mount(&d).unwrap();
    assert!(
        readdirs() > before,
        "a changed directory was not read again"
    );
    assert_eq!(after.len(), 53);
    assert_eq!(opendirs(), opened, "OPENDIR reached the engine");
    m.unmount_and_check();
}

/// Once the entries a cached listing names have expired (the entry timeout), the listing is
/// dropped too, so a walk reads the directory again with READDIRPLUS (which refreshes every
/// entry) instead of revalidating each name with a LOOKUP.
#[test]
fn a_listing_older_than_the_entry_timeout_is_read_again() {
    let m = Mounted::with_ttl(Duration::from_secs(1));
    let d = m.path().join("d");
    std::fs::create_dir(&d).unwrap();
    for i in 0..200 {
        std::fs::File::create(d.join(format!("f{i}"))).unwrap();
    }
    let walk = || {
        for name in list_mount(&d).unwrap().keys() {
            let p = d.join(std::ffi::OsStr::from_bytes(name));
            std::fs::symlink_metadata(p).unwrap();
        }
    };
    walk();
    walk();
    std::thread::sleep(Duration::from_millis(2500));
    let before = m.fs.stats();
    walk();
    let delta = m.fs.stats().since(&before);
    assert!(
        delta.op(lanefs::Op::Readdir) > 0,
        "the expired listing was served from the cache"
    );
    assert!(
        delta.op(lanefs::Op::Lookup) < 20,
        "{} LOOKUPs after the listing expired",
        delta.op(lanefs::Op::Lookup)
    );
    m.unmount_and_check();
}

/// Every kind of change, through the mount and through the library, each followed by a
/// listing of every directory compared with the engine's (each directory was listed, so
/// cached, before the change).
#[test]
fn a_cached_listing_never_misses_a_change() {
    let m = Mounted::new();
    let lib = lanefs::Client::root(m.fs.clone());
    for t in TOPS {
        std::fs::create_dir(m.path().join(t)).unwrap();
    }
    let mut rng = StdRng::seed_from_u64(0x11fe);
    for d in dirs(&m, &TOPS) {
        check(&m, &d, "setup");
    }
    for _ in 0..600 {
        let what = random_change(&m, &lib, &mut rng);
        for d in dirs(&m, &TOPS) {
            check(&m, &d, &what);
        }
    }
    m.unmount_and_check();
}

/// Two threads change the directories at once (through the mount and the library, at
/// random) and list them through the mount meanwhile, so listings are read into the cache
/// while the library and the mount change them; after each round every listing is compared
/// with the engine's.
#[test]
fn cached_listings_never_miss_changes_from_two_threads() {
    let m = Arc::new(Mounted::new());
    for t in TOPS {
        std::fs::create_dir(m.path().join(t)).unwrap();
    }
    const ROUNDS: usize = 60;
    let barrier = Arc::new(Barrier::new(3));
    let workers: Vec<_> = (0..2u64)
        .map(|w| {
            let (m, barrier) = (m.clone(), barrier.clone());
            std::thread::spawn(move || {
                let lib = lanefs::Client::root(m.fs.clone());
                let mut rng = StdRng::seed_from_u64(0xd1c + w);
                for _ in 0..ROUNDS {
                    for _ in 0..30 {
                        random_change(&m, &lib, &mut rng);
                        let t = TOPS[rng.random_range(0..TOPS.len())];
                        let _ = list_mount(&m.path().join(t));
                    }
                    barrier.wait(); // round done
                    barrier.wait(); // checked
                }
            })
        })
        .collect();
    for round in 0..ROUNDS {
        barrier.wait();
        for d in dirs(&m, &TOPS) {
            check(&m, &d, &format!("round {round}"));
        }
        barrier.wait();
    }
    for w in workers {
        w.join().unwrap();
    }
    Arc::into_inner(m).unwrap().unmount_and_check();
}

/// A directory whose listing is cached, moved to another parent (through the mount, then
/// through the library, then exchanged with another directory): its `..` follows the move,
/// and its entries stay listed.
#[test]
fn a_cached_listing_follows_its_directory_when_it_moves() {
    let m = Mounted::new();
    let lib = lanefs::Client::root(m.fs.clone());
    for p in ["a", "b", "c", "a/d", "c/e"] {
        std::fs::create_dir(m.path().join(p)).unwrap();
    }
    for i in 0..10 {
        std::fs::File::create(m.path().join(format!("a/d/f{i}"))).unwrap();
    }
    let ino = |p: &str| std::fs::metadata(m.path().join(p)).unwrap().ino();
    let dotdot = |p: &str| list_mount(&m.path().join(p)).unwrap()[&b".."[..]].0;
    check(&m, "a/d", "setup");
    assert_eq!(dotdot("a/d"), ino("a"));

    std::fs::rename(m.path().join("a/d"), m.path().join("b/d")).unwrap();
    check(&m, "b/d", "a rename through the mount");
    assert_eq!(dotdot("b/d"), ino("b"));

    lib.rename("/b/d", "/c/d").unwrap();
    check(&m, "c/d", "a rename through the library");
    assert_eq!(dotdot("c/d"), ino("c"));

    // Within its parent: `..` stays.
    std::fs::rename(m.path().join("c/d"), m.path().join("c/d2")).unwrap();
    check(&m, "c/d2", "a rename within the parent");

    // Exchanged with a directory in another parent, through the mount and the library.
    check(&m, "c/e", "setup");
    std::fs::rename(m.path().join("c/e"), m.path().join("a/e")).unwrap();
    check(&m, "a/e", "setup");
    let exchange = |x: &str, y: &str| {
        let (x, y) = (
            CString::new(m.path().join(x).as_os_str().as_bytes()).unwrap(),
            CString::new(m.path().join(y).as_os_str().as_bytes()).unwrap(),
        );
        // SAFETY: both are valid C strings.
        let rc = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                x.as_ptr(),
                libc::AT_FDCWD,
                y.as_ptr(),
                libc::RENAME_EXCHANGE,
            )
        };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    };
    exchange("c/d2", "a/e");
    check(&m, "a/e", "an exchange through the mount");
    check(&m, "c/d2", "an exchange through the mount");
    assert_eq!(dotdot("a/e"), ino("a"));
    assert_eq!(dotdot("c/d2"), ino("c"));
    lib.rename_with_flags("/a/e", "/c/d2", lanefs::RENAME_EXCHANGE)
        .unwrap();
    check(&m, "a/e", "an exchange through the library");
    check(&m, "c/d2", "an exchange through the library");
    assert_eq!(list_mount(&m.path().join("c/d2")).unwrap().len(), 12);
    m.unmount_and_check();
}

/// Runs `f(i)` in `threads` threads until `secs` seconds have passed, each with its own
/// index; panics with the first thread's panic.
fn for_a_while(threads: usize, secs: f64, f: impl Fn(usize, &dyn Fn() -> bool) + Sync) {
    let end = std::time::Instant::now() + Duration::from_secs_f64(secs);
    let going = || std::time::Instant::now() < end;
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|i| {
                let (f, going) = (&f, &going);
                s.spawn(move || f(i, going))
            })
            .collect();
        for h in hs {
            if let Err(p) = h.join() {
                std::panic::resume_unwind(p);
            }
        }
    });
}

/// Listings read in several `getdents` calls (a directory of a few pages) by some threads
/// while others change the directory: a name removed before a listing began is never in it,
/// and a name made before it began always is. (The kernel fills its cache of a listing across
/// the calls of one stream; a change between two of them leaves a complete cache that holds
/// the old names, which a stream that got its first page from lanefs and continues at a later
/// offset would be served, unless the server drops the cache at the change.)
#[test]
fn a_listing_shows_every_change_made_before_it_began() {
    let m = Mounted::new();
    let d = m.path().join("d");
    std::fs::create_dir(&d).unwrap();
    for i in 0..300 {
        std::fs::File::create(d.join(format!("a-long-enough-name-to-fill-pages-{i:04}"))).unwrap();
    }
    let tried = std::sync::atomic::AtomicUsize::new(0);
    for_a_while(6, 4.0, |t, going| {
        if t < 3 {
            // Listers: keep the cache being filled.
            while going() {
                let l = names_mount(&d);
                assert!(l.len() >= 302, "{} names listed", l.len());
            }
            return;
        }
        let mut n = 0u64;
        while going() {
            let name = format!("z{t}-{n}");
            n += 1;
            std::fs::File::create(d.join(&name)).unwrap();
            assert!(
                names_mount(&d).contains(name.as_bytes()),
                "{name}, made before the listing began, is not in it"
            );
            std::fs::remove_file(d.join(&name)).unwrap();
            assert!(
                !names_mount(&d).contains(name.as_bytes()),
                "{name}, removed before the listing began, is in it"
            );
            tried.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    });
    assert!(tried.into_inner() > 0);
    check(&m, "d", "the changes");
    m.unmount_and_check();
}

/// A file with a second name in another directory loses and gains that name over and over,
/// while other threads list the file's own directory (READDIRPLUS, whose attributes refresh
/// the kernel's inode) and change it (so that the listing is read again): `link(2)` never
/// fails, and the file's link count is right after each step. (The kernel lowers its cached
/// link count by itself when an unlink returns; attributes read after lanefs removed the name
/// but applied before that would be lowered twice, to 0, and `link(2)` of a file with link
/// count 0 fails with ENOENT.)
#[test]
fn a_hard_linked_file_stays_linkable_while_its_directory_is_listed() {
    let m = Mounted::new();
    let (a, b) = (m.path().join("a"), m.path().join("b"));
    std::fs::create_dir(&a).unwrap();
    std::fs::create_dir(&b).unwrap();
    const LINKERS: usize = 8;
    let files: Vec<PathBuf> = (0..LINKERS).map(|i| a.join(format!("f{i}"))).collect();
    for f in &files {
        std::fs::write(f, b"x").unwrap();
    }
    for_a_while(LINKERS + 6, 4.0, |t, going| {
        if t >= 6 {
            // The linkers run at the lowest priority, so that a woken unlinker is the last
            // to run: the window between lanefs's unlink and the kernel's own count-down
            // widens, and listings fall into it.
            // SAFETY: plain system calls on this thread.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as u32, 19) };
        }
        let mut n = 0u64;
        while going() {
            n += 1;
            match t {
                0..4 => {
                    assert!(names_mount(&a).len() >= LINKERS);
                }
                4 | 5 => {
                    let scratch = a.join(format!("s{t}"));
                    std::fs::File::create(&scratch).unwrap();
                    std::fs::remove_file(&scratch).unwrap();
                }
                _ => {
                    let f = &files[t - 6];
                    let other = b.join(format!("l{t}-{n}"));
                    std::fs::hard_link(f, &other).unwrap_or_else(|e| {
                        panic!("link {} -> {}: {e}", f.display(), other.display())
                    });
                    assert_eq!(std::fs::metadata(f).unwrap().nlink(), 2);
                    // No `stat` before the next link: it would refresh the count.
                    std::fs::remove_file(&other).unwrap();
                }
            }
        }
    });
    m.unmount_and_check();
}

/// Names made, renamed (over another name or not) and removed through the library while
/// other threads look them up through the mount, all the time: after a removal or a rename
/// away returns the kernel never finds the name, after a rename to it finds the inode
/// renamed, and after a creation returns it finds the file. (A LOOKUP that found a name
/// before its removal and is still on its way into the kernel must not leave an entry
/// behind; a change skips the entry invalidation only when the kernel can hold nothing of
/// the names, `server/kernel_names.rs`.) The entry timeout is long, so a stale entry would
/// stay.
#[test]
fn a_library_removal_leaves_the_kernel_no_entry_of_the_name() {
    let m = Mounted::new();
    let d = m.path().join("d");
    std::fs::create_dir(&d).unwrap();
    let lib = lanefs::Client::root(m.fs.clone());
    let tried = std::sync::atomic::AtomicUsize::new(0);
    for_a_while(6, 3.0, |t, going| {
        let mut rng = StdRng::seed_from_u64(t as u64);
        if t < 3 {
            while going() {
                let r = if rng.random_bool(0.5) { "r" } else { "" };
                let name = format!("n{}-{}{r}", rng.random_range(3..6), rng.random_range(0..4));
                let _ = std::fs::symlink_metadata(d.join(name));
            }
            return;
        }
        let mut n = 0u64;
        while going() {
            let name = format!("n{t}-{}", n % 4);
            n += 1;
            let lp = PathBuf::from("/d").join(&name);
            lib.write(&lp, b"x").unwrap();
            if rng.random_bool(0.5) {
                assert!(
                    std::fs::symlink_metadata(d.join(&name)).is_ok(),
                    "{name}, made through the library, is not seen through the mount"
                );
            }
            let name = if rng.random_bool(0.5) {
                // Renamed, over the other name half the time.
                let to = format!("{name}r");
                let tp = PathBuf::from("/d").join(&to);
                if rng.random_bool(0.5) {
                    lib.write(&tp, b"y").unwrap();
                    if rng.random_bool(0.5) {
                        let _ = std::fs::symlink_metadata(d.join(&to));
                    }
                }
                let ino = lib.metadata(&lp).unwrap().ino().get();
                lib.rename(&lp, &tp).unwrap();
                assert!(
                    std::fs::symlink_metadata(d.join(&name)).is_err(),
                    "{name}, renamed away through the library, is still seen through the mount"
                );
                let seen = std::fs::symlink_metadata(d.join(&to)).map(|m| m.ino());
                assert_eq!(seen.ok(), Some(ino), "{to}, renamed to, through the mount");
                (to, tp)
            } else {
                (name, lp)
            };
            let (name, lp) = name;
            lib.remove_file(&lp).unwrap();
            let r = std::fs::symlink_metadata(d.join(&name));
            assert!(
                r.is_err(),
                "{name}, removed through the library, is still seen through the mount"
            );
            tried.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    });
    assert!(tried.into_inner() > 0);
    check(&m, "d", "the changes");
    m.unmount_and_check();
}

/// Names made exclusively, looked up through the mount, and removed, by three threads
/// through the library over a few shared names (a lock-file dance): a name made again
/// while the removal of its previous file is still being reported to the kernel must not
/// be taken as one the kernel holds nothing under; the kernel then kept serving the old,
/// removed inode under the name (`server/kernel_names.rs`, 3).
#[test]
fn a_name_made_again_while_its_removal_is_reported_is_the_new_file() {
    let m = Mounted::new();
    let d = m.path().join("d");
    std::fs::create_dir(&d).unwrap();
    let lib = lanefs::Client::root(m.fs.clone());
    let won = std::sync::atomic::AtomicUsize::new(0);
    for_a_while(3, 3.0, |t, going| {
        let mut k = t;
        while going() {
            k += 1;
            let name = format!("lock{}", k % 3);
            let lp = PathBuf::from("/d").join(&name);
            let made = lib.open(&lp, lanefs::OpenOptions::new().write(true).create_new(true));
            let Ok(f) = made else { continue };
            let ino = f.metadata().unwrap().ino().get();
            drop(f);
            let seen = std::fs::symlink_metadata(d.join(&name)).map(|m| m.ino());
            assert_eq!(
                seen.ok(),
                Some(ino),
                "{name}: the kernel's inode is not the new file"
            );
            lib.remove_file(&lp).unwrap();
            won.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    });
    assert!(won.into_inner() > 0);
    m.unmount_and_check();
}
