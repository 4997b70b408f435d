//! Integration tests that really mount lanefs through FUSE (root, /dev/fuse and fuse3 needed;
//! `.ci/run` installs fuse3). Each test mounts a fresh in-memory filesystem on a temporary
//! directory, works on it with plain system calls and programs (`cp`, `tar`, `sh`), and holds
//! the engine too, so it can check the engine's invariants afterwards.

mod common;
#[path = "../../engine/tests/common/mod.rs"]
mod engine_common;
mod pjdfstest;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::{is_fuse, unmount_retrying, wait_for_mount};
use engine_common::{Kernel, Op, Who, compare};
use lanefs::{Config, Filesystem};
use lanefs_fuse::MountConfig;
use pjdfstest::{pjdfstest, run_pjdfstest};

struct Mounted {
    fs: Arc<Filesystem>,
    dir: tempfile::TempDir,
    mount: Option<lanefs_fuse::Mount>,
    /// The disk store the filesystem lives in, if not memory (closed after the unmount).
    store: Option<lanefs_store::StoreHandle>,
}

impl Mounted {
    fn new(cfg: Config, ttl: Duration) -> Mounted {
        Mounted::serve(Filesystem::new(cfg), None, ttl)
    }

    /// Mounts the filesystem of the disk store in `store` (made if new).
    fn on_store(store: &Path, ttl: Duration) -> Mounted {
        let o = open_store(store);
        Mounted::serve(o.fs, Some(o.store), ttl)
    }

    fn serve(fs: Filesystem, store: Option<lanefs_store::StoreHandle>, ttl: Duration) -> Mounted {
        assert!(
            Path::new("/dev/fuse").exists(),
            "/dev/fuse is missing: these tests need FUSE"
        );
        let fs = Arc::new(fs);
        let dir = tempfile::tempdir().unwrap();
        let mc = MountConfig {
            ttl,
            allow_other: true,
            ..MountConfig::default()
        };
        let mount =
            lanefs_fuse::mount_background(fs.clone(), dir.path(), &mc).unwrap_or_else(|e| {
                panic!(
                    "mount on {}: {e} (run as root with fuse3 installed)",
                    dir.path().display()
                )
            });
        // Wait until the kernel answers for the mount.
        wait_for_mount(dir.path());
        Mounted {
            fs,
            dir,
            mount: Some(mount),
            store,
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Unmounts (waiting for the session to end, so no request is in flight) and checks the
    /// engine's invariants.
    fn unmount_and_check(mut self) {
        unmount(&mut self.mount).expect("unmount");
        self.fs
            .check_invariants()
            .unwrap_or_else(|e| panic!("invariants after unmount:\n{e}"));
        if let Some(s) = self.store.take() {
            s.close().expect("close the store");
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = unmount(&mut self.mount);
    }
}

/// The disk store in `store` (made if new), opened with the default options.
fn open_store(store: &Path) -> lanefs_store::Opened {
    lanefs_store::open(store, Config::default(), lanefs_store::Options::default())
        .unwrap_or_else(|e| panic!("open the store {}: {e}", store.display()))
}

/// Unmounts (if mounted) and waits for the server threads (`unmount_retrying`).
fn unmount(m: &mut Option<lanefs_fuse::Mount>) -> std::io::Result<()> {
    let Some(mount) = m else { return Ok(()) };
    unmount_retrying(mount, Duration::from_millis(50))
}

/// `path` opened for reading and writing.
fn open_rw(path: impl AsRef<Path>) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap()
}

/// `path` opened for reading and writing, made if missing, emptied if not.
fn create_rw(path: impl AsRef<Path>) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .unwrap()
}

fn sh(cmd: &str) -> std::process::Output {
    Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .output()
        .expect("sh runs")
}

/// The engine's differential cases (same steps, same users), replayed through the mount with
/// plain system calls and compared with a kernel tmpfs.
#[test]
fn differential_cases_through_the_mount() {
    for case in engine_common::cases::all() {
        let m = Mounted::new(Config::default(), Duration::from_secs(60));
        let base = m.path().join("t");
        std::fs::create_dir(&base).unwrap();
        std::fs::set_permissions(&base, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .unwrap();
        let mut tmpfs = Kernel::new(case.name, case.umask);
        let mut mount = Kernel::at(base, case.umask);
        compare(
            &format!("{} through FUSE", case.name),
            &mut tmpfs,
            &mut mount,
            &case.steps,
        );
        drop(mount);
        m.unmount_and_check();
    }
}

/// A tree copied in with `cp -a` and with `tar` comes back identical, bytes and metadata.
#[test]
fn copy_a_tree_in_and_compare() {
    let m = Mounted::new(Config::default(), Duration::from_secs(60));
    let src = tempfile::tempdir().unwrap();
    copy_tree_in(src.path(), m.path());
    compare_copies(src.path(), m.path());
    m.unmount_and_check();
}

/// The same on a disk store, then again after an unmount, the store closed and reopened, and
/// a new mount: the tree is still identical, bytes and metadata.
#[test]
fn a_disk_store_keeps_a_copied_tree_across_remounts() {
    let store = tempfile::tempdir().unwrap();
    let src = tempfile::tempdir().unwrap();
    let m = Mounted::on_store(store.path(), Duration::from_secs(60));
    copy_tree_in(src.path(), m.path());
    compare_copies(src.path(), m.path());
    m.unmount_and_check();
    for _ in 0..2 {
        let m = Mounted::on_store(store.path(), Duration::from_secs(60));
        compare_copies(src.path(), m.path());
        m.unmount_and_check();
    }
}

/// Makes a tree of every kind of file in `src`, and copies it into `mnt`'s `cp` (with
/// `cp -a`) and `tar` (with tar).
fn copy_tree_in(src: &Path, mnt: &Path) {
    let s = src.display();
    let out = sh(&format!(
        "set -e; cd {s}; mkdir -p a/b/c 'sp ace' x; echo one > a/f; head -c 200000 /dev/urandom > a/b/big; \
         ln a/f a/hard; ln -s ../f a/b/rel; ln -s /nonexistent dangling; chmod 640 a/f; chmod 1777 x; \
         mkfifo a/fifo; touch -d '2001-02-03 04:05:06' a/b/c; printf 'v' > 'sp ace/é'; \
         chown 1000:3000 a/b/big"
    ));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dst = mnt.display();
    let out = sh(&format!(
        "cp -a {s}/. {dst}/cp && cd {s} && tar --format=posix -cf - . | (mkdir {dst}/tar && cd {dst}/tar && tar xpf -)"
    ));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `mnt`'s `cp` and `tar` copies of `src` are identical to it, bytes and metadata.
fn compare_copies(src: &Path, mnt: &Path) {
    let (s, dst) = (src.display(), mnt.display());
    for sub in ["cp", "tar"] {
        // diff cannot compare FIFOs; the metadata listing below covers the one here.
        let out = sh(&format!(
            "diff -r --no-dereference --exclude=fifo {s} {dst}/{sub}"
        ));
        assert!(
            out.status.success(),
            "{sub}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        // Metadata: type, mode, owner, size, mtime, link count and link targets.
        let listing = |root: &str| {
            // Sizes of regular files and symlinks only: a directory's size is its
            // filesystem's own convention (tmpfs and lanefs: 20 bytes per entry).
            let o = sh(&format!(
                "cd {root} && find . \\( -type d -printf '%p %y %m %u %g - %T@ %n %l\\n' \\) -o -printf '%p %y %m %u %g %s %T@ %n %l\\n' | sort"
            ));
            assert!(o.status.success());
            String::from_utf8(o.stdout).unwrap()
        };
        let mut want = listing(&s.to_string());
        let mut got = listing(&format!("{dst}/{sub}"));
        // The top directory itself differs (its times and owner came from mkdir).
        want = want
            .lines()
            .filter(|l| !l.starts_with(". "))
            .collect::<Vec<_>>()
            .join("\n");
        got = got
            .lines()
            .filter(|l| !l.starts_with(". "))
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(want, got, "{sub}: metadata differs");
    }
}

/// Many processes create, write, rename and remove in one mount at once.
#[test]
fn many_processes_work_in_one_mount() {
    let m = Mounted::new(Config::default(), Duration::from_secs(60));
    let d = m.path().display();
    let kids: Vec<_> = (0..8)
        .map(|i| {
            Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "set -e; mkdir -p {d}/shared; for n in $(seq 1 150); do echo $n > {d}/shared/p{i}-$n; \
                     mv {d}/shared/p{i}-$n {d}/shared/q{i}-$n; cat {d}/shared/q{i}-$n >/dev/null; done; \
                     for n in $(seq 1 150); do [ $((n % 3)) -eq 0 ] || rm {d}/shared/q{i}-$n; done"
                ))
                .spawn()
                .unwrap()
        })
        .collect();
    for mut k in kids {
        assert!(k.wait().unwrap().success());
    }
    let names = std::fs::read_dir(m.path().join("shared")).unwrap().count();
    assert_eq!(names, 8 * 50);
    m.unmount_and_check();
}

/// Names at the limits, deep paths, symlink loops, and a full filesystem.
#[test]
fn bad_input_through_the_kernel() {
    let m = Mounted::new(
        Config {
            max_bytes: Some(1 << 20),
            ..Config::default()
        },
        Duration::from_secs(60),
    );
    let p = m.path();
    std::fs::write(p.join("n".repeat(255)), b"ok").unwrap();
    let e = std::fs::write(p.join("n".repeat(256)), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENAMETOOLONG));
    // A path of about PATH_MAX: 16 levels of 250-byte names.
    let mut deep = p.to_path_buf();
    for i in 0..15 {
        deep.push(format!("{i:02}{}", "d".repeat(248)));
        std::fs::create_dir(&deep).unwrap();
    }
    assert!(std::fs::metadata(&deep).unwrap().is_dir());
    let too_deep = deep.join("x".repeat(250)).join("y".repeat(250));
    assert_eq!(
        std::fs::create_dir_all(&too_deep)
            .unwrap_err()
            .raw_os_error(),
        Some(libc::ENAMETOOLONG)
    );
    std::os::unix::fs::symlink("loop2", p.join("loop1")).unwrap();
    std::os::unix::fs::symlink("loop1", p.join("loop2")).unwrap();
    assert_eq!(
        std::fs::read(p.join("loop1")).unwrap_err().raw_os_error(),
        Some(libc::ELOOP)
    );
    let big = vec![1u8; 2 << 20];
    let e = std::fs::write(p.join("big"), &big).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
    std::fs::remove_file(p.join("big")).unwrap();
    std::fs::write(p.join("after"), b"still usable").unwrap();
    assert_eq!(std::fs::read(p.join("after")).unwrap(), b"still usable");
    m.unmount_and_check();
}

/// The room of a file unlinked through the mount is there for the very next request, as on
/// tmpfs: lanefs frees the file only when the kernel's FORGET comes (the kernel may still
/// hold it open), and over io_uring that FORGET comes through `/dev/fuse` while the next
/// request comes through the ring, served by another thread. A request refused with ENOSPC
/// waits briefly for FORGETs (`Forgets` in the server). Without that wait, over io_uring,
/// most of the creates and writes below fail.
#[test]
fn the_room_of_an_unlinked_file_is_there_for_the_next_request() {
    let m = Mounted::new(
        Config {
            max_bytes: Some(1 << 20),
            max_inodes: Some(20),
            ..Config::default()
        },
        Duration::from_secs(60),
    );
    let p = m.path();
    let mut names = Vec::new();
    loop {
        let n = p.join(format!("i{}", names.len()));
        match std::fs::File::create(&n) {
            Ok(_) => names.push(n),
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
                break;
            }
        }
    }
    assert!(names.len() >= 10, "only {} files fit", names.len());
    let mut failed = 0;
    for k in 0..200 {
        let n = &names[k % names.len()];
        std::fs::remove_file(n).unwrap();
        if std::fs::File::create(n).is_err() {
            failed += 1;
            // Make it again for the next rounds (the room comes back eventually).
            for _ in 0..100 {
                if std::fs::File::create(n).is_ok() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    assert_eq!(failed, 0, "creates right after an unlink that failed");
    for n in &names[1..] {
        std::fs::remove_file(n).unwrap();
    }
    let chunk = vec![b'x'; 64 << 10];
    let mut failed = 0;
    for _ in 0..30 {
        let mut f = std::fs::File::create(p.join("a")).unwrap();
        while std::io::Write::write(&mut f, &chunk).is_ok_and(|n| n > 0) {}
        drop(f);
        std::fs::remove_file(p.join("a")).unwrap();
        if std::fs::write(p.join("b"), vec![b'y'; 512 << 10]).is_err() {
            failed += 1;
        }
        let _ = std::fs::remove_file(p.join("b"));
    }
    assert_eq!(
        failed, 0,
        "writes right after the unlink of a file that filled the mount"
    );
    m.unmount_and_check();
}

/// mmap of a file works (the page cache is used, no direct_io).
#[test]
fn mmap_reads_and_writes() {
    let m = Mounted::new(Config::default(), Duration::from_secs(60));
    let path = m.path().join("mapped");
    std::fs::write(&path, vec![b'a'; 8192]).unwrap();
    let f = open_rw(&path);
    use std::os::unix::io::AsRawFd;
    // SAFETY: mapping 8192 bytes of an open file of that size; unmapped below.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            8192,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(ptr, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
    // SAFETY: the mapping is 8192 bytes long and writable.
    unsafe {
        let s = std::slice::from_raw_parts_mut(ptr as *mut u8, 8192);
        assert_eq!(s[100], b'a');
        s[4096..4101].copy_from_slice(b"hello");
        assert_eq!(libc::msync(ptr, 8192, libc::MS_SYNC), 0);
        libc::munmap(ptr, 8192);
    }
    drop(f);
    let back = std::fs::read(&path).unwrap();
    assert_eq!(&back[4096..4101], b"hello");
    // The engine holds the bytes, not only the page cache.
    let c = lanefs::Client::root(m.fs.clone());
    assert_eq!(&c.read("/mapped").unwrap()[4096..4101], b"hello");
}

/// Pages a program wrote through `mmap` that the filesystem had no room for: the write-back
/// fails (`msync` says ENOSPC), and reads then show what the filesystem holds, not the bytes
/// it refused, which the kernel would otherwise keep in its cache as if written.
#[test]
fn pages_whose_write_back_failed_do_not_stay_in_the_cache() {
    const LEN: usize = 8 << 20;
    let cfg = Config {
        max_bytes: Some(4 << 20),
        ..Config::default()
    };
    let m = Mounted::new(cfg, Duration::from_secs(60));
    let path = m.path().join("mapped");
    let f = create_rw(&path);
    f.set_len(LEN as u64).unwrap();
    use std::os::unix::io::AsRawFd;
    // SAFETY: mapping LEN bytes of an open file of that size; unmapped below.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(ptr, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
    // SAFETY: the mapping is LEN bytes long and writable, and is unmapped only below.
    let synced = unsafe {
        let s = std::slice::from_raw_parts_mut(ptr as *mut u8, LEN);
        for page in s.chunks_mut(4096) {
            page[0] = 1;
        }
        let r = libc::msync(ptr, LEN, libc::MS_SYNC);
        let e = std::io::Error::last_os_error();
        libc::munmap(ptr, LEN);
        (r, e.raw_os_error())
    };
    assert_eq!(
        synced,
        (-1, Some(libc::ENOSPC)),
        "msync of 8 MiB of pages on a 4 MiB filesystem"
    );
    let held = lanefs::Client::root(m.fs.clone()).read("/mapped").unwrap();
    let written = |b: &[u8]| b.chunks(4096).filter(|p| p[0] == 1).count();
    assert!(
        (1..LEN / 4096).contains(&written(&held)),
        "the filesystem holds {} of {} pages",
        written(&held),
        LEN / 4096
    );
    // The failed pages are dropped on a thread of the server's after the WRITE's reply, so
    // a read may come just before; it must agree with the filesystem soon after.
    let mut seen = Vec::new();
    for _ in 0..200 {
        seen = std::fs::read(&path).unwrap();
        if seen == held {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        seen == held,
        "reads show {} written pages, the filesystem holds {}",
        written(&seen),
        written(&held)
    );
    drop(f);
    m.unmount_and_check();
}

/// File data through the mount, in the manner of fsx: random writes, reads, truncates, mmap
/// reads and writes, fallocate and hole punching on one file, each checked against a model
/// buffer, and the engine's own copy compared with the model at the end (the page cache and
/// the engine must agree). Prints its seed; `LANEFS_SEED=<n>` replays it.
#[test]
fn data_survives_random_io_like_fsx() {
    use rand::{Rng, rngs::StdRng};
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;

    const MAX: usize = 256 * 1024;
    const PAGE: usize = 4096;
    let seed = engine_common::seed::seed("fsx");
    let mut rng = engine_common::seed::rng(seed);
    let m = Mounted::new(Config::default(), Duration::from_secs(60));
    let path = m.path().join("fsx");
    let f = create_rw(&path);
    let fd = f.as_raw_fd();
    let mut model: Vec<u8> = Vec::new();
    let span = |rng: &mut StdRng, limit: usize| {
        let off = rng.random_range(0..limit);
        let len = rng.random_range(1..=(limit - off).min(64 * 1024));
        (off, len)
    };
    for step in 0..3000 {
        let what = rng.random_range(0..8);
        let ctx = |op: &str| format!("step {step} ({op}), seed {seed}");
        match what {
            0 | 1 => {
                let (off, len) = span(&mut rng, MAX);
                let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                f.write_all_at(&data, off as u64).unwrap();
                if model.len() < off + len {
                    model.resize(off + len, 0);
                }
                model[off..off + len].copy_from_slice(&data);
            }
            2 | 3 if !model.is_empty() => {
                let (off, len) = span(&mut rng, model.len());
                let mut buf = vec![0u8; len];
                f.read_exact_at(&mut buf, off as u64).unwrap();
                assert!(
                    buf == model[off..off + len],
                    "{}: read {off}+{len}",
                    ctx("read")
                );
            }
            4 => {
                let size = rng.random_range(0..MAX);
                f.set_len(size as u64).unwrap();
                model.resize(size, 0);
            }
            5 if !model.is_empty() => {
                // Map a page-aligned window inside the file; read it, and sometimes write it.
                let first = rng.random_range(0..model.len().div_ceil(PAGE));
                let pages = rng.random_range(1..=(model.len().div_ceil(PAGE) - first).min(16));
                let off = first * PAGE;
                let len = (pages * PAGE).min(model.len() - off);
                let write = rng.random_bool(0.5);
                let prot = libc::PROT_READ | if write { libc::PROT_WRITE } else { 0 };
                // SAFETY: a shared mapping of `len` bytes at a page-aligned offset inside the
                // file, unmapped below before the file can shrink.
                let p = unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        len,
                        prot,
                        libc::MAP_SHARED,
                        fd,
                        off as i64,
                    )
                };
                assert_ne!(p, libc::MAP_FAILED, "{}", ctx("mmap"));
                // SAFETY: the mapping is `len` bytes long, readable and (if `write`) writable.
                let s = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, len) };
                assert!(
                    s == &model[off..off + len],
                    "{}: mapped {off}+{len}",
                    ctx("mmap read")
                );
                if write {
                    for b in s.iter_mut() {
                        *b = rng.random();
                    }
                    model[off..off + len].copy_from_slice(s);
                    // SAFETY: flushing and unmapping the mapping made above.
                    assert_eq!(unsafe { libc::msync(p, len, libc::MS_SYNC) }, 0);
                }
                // SAFETY: as above.
                unsafe { libc::munmap(p, len) };
            }
            6 => {
                // fallocate: allocates (zeros where there was nothing) and may extend.
                let (off, len) = span(&mut rng, MAX);
                // SAFETY: plain syscall on an open descriptor.
                let r = unsafe { libc::fallocate(fd, 0, off as i64, len as i64) };
                assert_eq!(
                    r,
                    0,
                    "{}: {}",
                    ctx("fallocate"),
                    std::io::Error::last_os_error()
                );
                if model.len() < off + len {
                    model.resize(off + len, 0);
                }
            }
            7 if !model.is_empty() => {
                let (off, len) = span(&mut rng, model.len());
                let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
                // SAFETY: plain syscall on an open descriptor.
                let r = unsafe { libc::fallocate(fd, mode, off as i64, len as i64) };
                assert_eq!(
                    r,
                    0,
                    "{}: {}",
                    ctx("punch"),
                    std::io::Error::last_os_error()
                );
                model[off..off + len].fill(0);
            }
            _ => {}
        }
        let size = std::fs::metadata(&path).unwrap().len();
        assert_eq!(size, model.len() as u64, "{}: size", ctx("stat"));
    }
    drop(f);
    let whole = std::fs::read(&path).unwrap();
    assert!(
        whole == model,
        "whole file differs from the model (seed {seed})"
    );
    let lib = lanefs::Client::root(m.fs.clone());
    assert!(
        lib.read("/fsx").unwrap() == model,
        "the engine's copy differs (seed {seed})"
    );
    m.unmount_and_check();
}

/// `lseek(SEEK_DATA / SEEK_HOLE)` answers as on the kernel's tmpfs, for sparse files with
/// data at the start, in the middle, across pages and at the end.
#[test]
fn seek_data_and_hole_match_tmpfs() {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;

    let m = Mounted::new(Config::default(), Duration::from_secs(60));
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    const P: u64 = 4096;
    let layouts: [&[(u64, usize)]; 4] = [
        &[(1 << 20, 1)],
        &[(0, 10), (3 * P + 5, 2 * P as usize), (10 * P, 1)],
        &[(P - 1, 2), (8 * P, 1)],
        &[(0, 3 * P as usize)],
    ];
    for (n, layout) in layouts.iter().enumerate() {
        let answers = |dir: &Path| {
            let f = std::fs::File::create(dir.join(format!("sparse{n}"))).unwrap();
            for &(off, len) in layout.iter() {
                f.write_all_at(&vec![7u8; len], off).unwrap();
            }
            let size = f.metadata().unwrap().len();
            let mut out = Vec::new();
            for off in [
                0,
                1,
                P - 1,
                P,
                2 * P + 3,
                5 * P,
                1 << 20,
                size - 1,
                size,
                size + 1,
            ] {
                for whence in [libc::SEEK_DATA, libc::SEEK_HOLE] {
                    // SAFETY: plain syscall on an open descriptor.
                    let r = unsafe { libc::lseek(f.as_raw_fd(), off as i64, whence) };
                    let e = std::io::Error::last_os_error().raw_os_error();
                    out.push((off, whence, if r < 0 { Err(e) } else { Ok(r) }));
                }
            }
            out
        };
        assert_eq!(
            answers(m.path()),
            answers(shm.path()),
            "layout {n}: {layout:?}"
        );
    }
    m.unmount_and_check();
}

/// A program running from the mount cannot be truncated: `open(O_RDONLY|O_TRUNC)` is refused
/// with ETXTBSY and the file keeps its bytes. (With FUSE_ATOMIC_O_TRUNC the kernel hands that
/// open to the server before its own ETXTBSY check: a server that truncates first leaves the
/// running program's pages gone, and it dies of SIGSEGV or SIGBUS.)
#[test]
fn a_running_program_is_not_truncated() {
    let m = Mounted::new(Config::default(), Duration::from_secs(60));
    let prog = m.path().join("sleep");
    let orig = std::fs::read("/bin/sleep").unwrap();
    std::fs::write(&prog, &orig).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut child = Command::new(&prog).arg("30").spawn().unwrap();
    let c = CString::new(prog.as_os_str().as_bytes()).unwrap();
    let open = |flags: i32| {
        // SAFETY: a NUL-terminated path; a descriptor that opened is closed at once.
        let fd = unsafe { libc::open(c.as_ptr(), flags) };
        if fd < 0 {
            return std::io::Error::last_os_error().raw_os_error();
        }
        // SAFETY: fd was just opened here.
        unsafe { libc::close(fd) };
        None
    };
    for flags in [libc::O_WRONLY, libc::O_RDWR, libc::O_RDONLY | libc::O_TRUNC] {
        assert_eq!(open(flags), Some(libc::ETXTBSY), "open flags {flags:#o}");
    }
    let now = std::fs::read(&prog).unwrap();
    assert!(
        now == orig,
        "the running program changed: {} bytes, was {}",
        now.len(),
        orig.len()
    );
    assert!(child.try_wait().unwrap().is_none(), "the program died");
    child.kill().unwrap();
    child.wait().unwrap();
    // Once it has exited (FUSE releases the exec handle shortly after), O_TRUNC truncates.
    let mut truncated = false;
    for _ in 0..500 {
        match open(libc::O_RDONLY | libc::O_TRUNC) {
            None => {
                truncated = true;
                break;
            }
            Some(libc::ETXTBSY) => std::thread::sleep(Duration::from_millis(10)),
            Some(e) => panic!("open(O_TRUNC) after exit: errno {e}"),
        }
    }
    assert!(truncated, "O_TRUNC still refused after the program exited");
    assert_eq!(std::fs::metadata(&prog).unwrap().len(), 0);
    m.unmount_and_check();
}

/// Unmounting while files are open neither hangs nor leaves the session running.
#[test]
fn unmount_with_open_files() {
    let m = Mounted::new(Config::default(), Duration::from_secs(60));
    std::fs::write(m.path().join("f"), b"x").unwrap();
    let open = std::fs::File::open(m.path().join("f")).unwrap();
    let mp: PathBuf = m.path().to_path_buf();
    let out = Command::new("fusermount3")
        .arg("-uz")
        .arg(&mp)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(open);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(m);
        let _ = tx.send(());
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("the session ended after unmount");
    assert!(!is_fuse(&mp));
}

/// Operations that should not reach the kernel's per-directory limits show the lock counters
/// through the engine the server wraps (what `lanefs stats` prints).
#[test]
fn requests_are_counted_in_engine_statistics() {
    let m = Mounted::new(Config::default(), Duration::from_secs(60));
    let before = m.fs.stats();
    for i in 0..20 {
        std::fs::write(m.path().join(format!("f{i}")), b"x").unwrap();
    }
    let d = m.fs.stats().since(&before);
    // The kernel creates regular files with MKNOD (the server answers CREATE with ENOSYS).
    assert!(
        d.op(lanefs::Op::Mknod) >= 20,
        "{:?}",
        d.op(lanefs::Op::Mknod)
    );
    assert!(d.op(lanefs::Op::Write) >= 20);
    let json = lanefs_fuse::stats_json(&m.fs, None);
    assert!(json["ops"]["mknod"].as_u64().unwrap() >= 20);
    let _ = (Who::Root, Op::SleepMs(0));
}

/// The mount shows up as `fuse.lanefs`, as harnesses that find a mount by its type expect.
#[test]
fn mount_type_is_fuse_lanefs() {
    let m = Mounted::new(Config::default(), Duration::from_secs(60));
    let canon = std::fs::canonicalize(m.path()).unwrap();
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info
        .lines()
        .find(|l| l.split(' ').nth(4) == canon.to_str())
        .expect("mount in mountinfo");
    // After the optional fields comes "-", then the filesystem type.
    let fstype = line.split(" - ").nth(1).and_then(|r| r.split(' ').next());
    assert_eq!(fstype, Some("fuse.lanefs"), "{line}");
    assert!(line.contains("default_permissions"), "{line}");
    m.unmount_and_check();
}

/// Changes a program makes through the library while the filesystem is mounted reach the
/// kernel's caches at once, although the mount caches names, attributes and pages for 60 s.
#[test]
fn library_changes_invalidate_the_kernel_caches() {
    let m = Mounted::new(Config::default(), Duration::from_secs(60));
    let lib = lanefs::Client::root(m.fs.clone());
    let p = |n: &str| m.path().join(n);
    let stat = |n: &str| std::fs::symlink_metadata(p(n)).map_err(|e| e.raw_os_error());
    use std::os::unix::fs::MetadataExt;

    // A missing name is cached as a negative entry; the library creates it.
    assert_eq!(stat("x").unwrap_err(), Some(libc::ENOENT));
    lib.write("/x", b"one").unwrap();
    assert_eq!(std::fs::read(p("x")).unwrap(), b"one");

    // The pages are cached (the kernel keeps them across opens in no-open mode); the library rewrites them.
    lib.write("/x", b"two!").unwrap();
    assert_eq!(std::fs::read(p("x")).unwrap(), b"two!");
    let f = lib
        .open("/x", lanefs::OpenOptions::new().write(true))
        .unwrap();
    f.write_at(b"TW", 0).unwrap();
    drop(f);
    assert_eq!(std::fs::read(p("x")).unwrap(), b"TWo!");

    // Attributes: mode, and nlink through a hard link.
    lib.set_permissions("/x", 0o600).unwrap();
    assert_eq!(stat("x").unwrap().mode() & 0o7777, 0o600);
    lib.hard_link("/x", "/x2").unwrap();
    assert_eq!(stat("x").unwrap().nlink(), 2);

    // Renames and removals: the old names go, the new ones appear.
    lib.rename("/x", "/y").unwrap();
    assert_eq!(stat("x").unwrap_err(), Some(libc::ENOENT));
    assert_eq!(std::fs::read(p("y")).unwrap(), b"TWo!");
    lib.remove_file("/x2").unwrap();
    assert_eq!(stat("x2").unwrap_err(), Some(libc::ENOENT));
    assert_eq!(stat("y").unwrap().nlink(), 1);
    lib.create_dir("/d").unwrap();
    assert!(stat("d").unwrap().is_dir());
    lib.rename("/y", "/d/y").unwrap();
    assert_eq!(std::fs::read(p("d/y")).unwrap(), b"TWo!");
    lib.remove_file("/d/y").unwrap();
    lib.remove_dir("/d").unwrap();
    assert_eq!(stat("d").unwrap_err(), Some(libc::ENOENT));
    m.unmount_and_check();
}

/// pjdfstest (the Rust port of the POSIX filesystem test suite, `cargo install pjdfstest`)
/// against a lanefs mount, as root, switching to two unprivileged users, with a second
/// filesystem for the EXDEV cases. `.ci/run` installs it and sets `LANEFS_REQUIRE_PJDFSTEST`;
/// elsewhere the test says it did not run when the binary is missing. The read-only-remount
/// cases are left out (they remount through `mount(8)`, which needs lanefs on the system PATH).
#[test]
fn pjdfstest_passes() {
    let Some(bin) = pjdfstest() else { return };
    let m = Mounted::new(Config::default(), Duration::from_secs(60));
    run_pjdfstest(&bin, m.path(), &[]);
    m.unmount_and_check();
}

/// pjdfstest on a disk store, and again on the same store after an unmount, the store closed
/// and reopened, and a new mount.
#[test]
fn pjdfstest_passes_on_a_disk_store_across_remounts() {
    let Some(bin) = pjdfstest() else { return };
    let store = tempfile::tempdir().unwrap();
    for _ in 0..2 {
        let m = Mounted::on_store(store.path(), Duration::from_secs(60));
        run_pjdfstest(&bin, m.path(), &[]);
        m.unmount_and_check();
    }
}

/// A user who does not own a set-user-ID, set-group-ID or file-capability file may still
/// write, truncate and fallocate it (if its mode allows), and the change takes the
/// privileges away, as on tmpfs: nothing answers EPERM. (Without FUSE_HANDLE_KILLPRIV_V2 the
/// kernel asked lanefs for a chmod on the writer's credentials, refused, and the write with
/// it.)
#[test]
fn non_owners_write_set_id_and_capability_files_and_take_the_privileges_away() {
    let m = Mounted::new(Config::default(), Duration::from_secs(60));
    let d = m.path().join("d");
    std::fs::create_dir(&d).unwrap();
    std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let as_nobody = |cmd: &str| {
        let o = sh(&format!(
            "cd {} && setpriv --reuid=65534 --regid=65534 --clear-groups {cmd}",
            d.display()
        ));
        assert!(
            o.status.success(),
            "{cmd}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    let mode = |n: &str| {
        std::os::unix::fs::MetadataExt::mode(&std::fs::metadata(d.join(n)).unwrap()) & 0o7777
    };
    let set_mode = |n: &str, mode: u32| {
        std::fs::set_permissions(
            d.join(n),
            std::os::unix::fs::PermissionsExt::from_mode(mode),
        )
        .unwrap()
    };
    std::fs::write(d.join("a"), b"").unwrap();
    set_mode("a", 0o4777);
    as_nobody("truncate -s 1 a");
    assert_eq!(mode("a"), 0o777);
    std::fs::write(d.join("b"), b"").unwrap();
    set_mode("b", 0o2767);
    as_nobody("sh -c 'echo x >> b'");
    assert_eq!(mode("b"), 0o767);
    // Capabilities: a version-2 `security.capability` value granting cap_setuid.
    std::fs::write(d.join("c"), b"").unwrap();
    set_mode("c", 0o777);
    let caps = b"\x01\x00\x00\x02\x80\x00\x00\x00\x80\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00";
    let path = CString::new(d.join("c").as_os_str().as_bytes()).unwrap();
    let name = CString::new("security.capability").unwrap();
    // SAFETY: valid C strings and a buffer of the given length.
    let r = unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            caps.as_ptr().cast(),
            caps.len(),
            0,
        )
    };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    as_nobody("fallocate -l 4096 c");
    // SAFETY: as above, asking only for the size.
    let r = unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
    assert_eq!(r, -1, "capabilities survived a non-owner's fallocate");
    assert_eq!(std::fs::metadata(d.join("c")).unwrap().len(), 4096);
    // xfstests generic/683: a non-owner's fallocate and hole punch take the set-id bits
    // away, and the mode the kernel shows says so at once.
    for (n, cmd) in [
        ("e", "fallocate -o 65536 -l 65536 e"),
        ("f", "fallocate -p -l 4096 f"),
    ] {
        std::fs::write(d.join(n), vec![b'x'; 8192]).unwrap();
        set_mode(n, 0o6666);
        as_nobody(cmd);
        assert_eq!(mode(n), 0o666, "{cmd}");
    }
    // Root without CAP_FSETID loses them too (the kernel flags the truncate's SETATTR).
    for (n, cmd) in [("g", "truncate -s 100 g"), ("h", "fallocate -l 8192 h")] {
        std::fs::write(d.join(n), b"abc").unwrap();
        set_mode(n, 0o6777);
        let o = sh(&format!(
            "cd {} && setpriv --inh-caps=-fsetid --bounding-set=-fsetid {cmd}",
            d.display()
        ));
        assert!(
            o.status.success(),
            "{cmd}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(mode(n), 0o777, "root without CAP_FSETID: {cmd}");
    }
    // `chown(path, -1, -1)` takes them as any chown does (an owner's, and root's).
    std::fs::write(d.join("i"), b"").unwrap();
    set_mode("i", 0o6755);
    std::os::unix::fs::chown(d.join("i"), None, None).unwrap();
    assert_eq!(mode("i"), 0o755);
    m.unmount_and_check();
}

/// lanefs updates access times on the reads it serves as the atime mount options say:
/// `noatime` never, `strictatime` on every read that reaches it; and an `O_NOATIME` read
/// leaves the time alone (the kernel passes the file's flags with each READ).
#[test]
fn access_times_follow_noatime_strictatime_and_o_noatime() {
    let old = libc::timespec {
        tv_sec: 946_684_800, // 2000-01-01
        tv_nsec: 0,
    };
    let read_moves_atime = |m: &Mounted, flags: i32| {
        let f = m.path().join("f");
        std::fs::write(&f, b"abc").unwrap();
        let c = CString::new(f.as_os_str().as_bytes()).unwrap();
        let times = [
            old,
            libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_OMIT,
            },
        ];
        // SAFETY: a valid path and two timespecs.
        let r = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) };
        assert_eq!(r, 0);
        // SAFETY: a valid path; the descriptor is closed below.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | flags) };
        assert!(fd >= 0, "{}", std::io::Error::last_os_error());
        // The file's pages dropped from the page cache, so that the read reaches lanefs.
        // SAFETY: our own descriptor.
        let r = unsafe { libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(r, 0);
        let mut b = [0u8; 3];
        // SAFETY: a buffer of 3 bytes.
        assert_eq!(unsafe { libc::read(fd, b.as_mut_ptr().cast(), 3) }, 3);
        // SAFETY: our own descriptor.
        unsafe { libc::close(fd) };
        std::os::unix::fs::MetadataExt::atime(&std::fs::metadata(&f).unwrap()) != old.tv_sec
    };
    // (`lanefs mount -o noatime` and `-o strictatime` set these: cli/src/mount.rs.)
    let mounted = |atime| {
        Mounted::new(
            Config {
                atime,
                ..Config::default()
            },
            Duration::from_secs(60),
        )
    };
    let m = mounted(lanefs::Atime::Relative);
    assert!(read_moves_atime(&m, 0), "relatime: a day-old atime moves");
    assert!(!read_moves_atime(&m, libc::O_NOATIME), "O_NOATIME");
    m.unmount_and_check();
    let m = mounted(lanefs::Atime::Never);
    assert!(!read_moves_atime(&m, 0), "noatime");
    m.unmount_and_check();
    let m = mounted(lanefs::Atime::Strict);
    assert!(read_moves_atime(&m, 0), "strictatime");
    m.unmount_and_check();
}

/// A file handle as `name_to_handle_at` fills it (`struct file_handle` with room for
/// `MAX_HANDLE_SZ` bytes).
#[repr(C)]
struct Handle {
    bytes: u32,
    kind: i32,
    data: [u8; libc::MAX_HANDLE_SZ as usize],
}

/// `name_to_handle_at(AT_FDCWD, path, ..., 0)`.
fn handle_of(path: &Path) -> Handle {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut h = Handle {
        bytes: libc::MAX_HANDLE_SZ as u32,
        kind: 0,
        data: [0; libc::MAX_HANDLE_SZ as usize],
    };
    let mut mount_id = 0;
    // SAFETY: `h` is a `struct file_handle` with `bytes` bytes of room after its header.
    let r = unsafe {
        libc::name_to_handle_at(
            libc::AT_FDCWD,
            c.as_ptr(),
            (&mut h as *mut Handle).cast(),
            &mut mount_id,
            0,
        )
    };
    assert_eq!(
        r,
        0,
        "name_to_handle_at {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    h
}

/// `open_by_handle_at(mount_fd, h, flags)` as a `File`, or the errno.
fn open_by_handle(mount: &std::fs::File, h: &mut Handle, flags: i32) -> Result<std::fs::File, i32> {
    use std::os::unix::io::{AsRawFd, FromRawFd};
    // SAFETY: `h` is a handle `name_to_handle_at` filled; the descriptor returned is owned
    // by the `File` made from it.
    let fd =
        unsafe { libc::open_by_handle_at(mount.as_raw_fd(), (h as *mut Handle).cast(), flags) };
    if fd < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap())
    } else {
        // SAFETY: a new descriptor nobody else owns.
        Ok(unsafe { std::fs::File::from_raw_fd(fd) })
    }
}

/// Drops the kernel's unused dentries and inodes (`echo 2 > /proc/sys/vm/drop_caches`), so
/// that an inode no open file holds leaves the kernel's cache (FUSE sends FORGET for it).
fn drop_dentries_and_inodes() {
    std::fs::write("/proc/sys/vm/drop_caches", "2").expect("drop_caches (needs root)");
}

/// Exported file handles (`name_to_handle_at`, then `open_by_handle_at`, as NFS export and
/// fanotify users do) open a file and a directory again after their inodes left the kernel's
/// cache, as on tmpfs; a handle of a removed file is stale (ESTALE), as on tmpfs. (Without
/// FUSE_EXPORT_SUPPORT the kernel answered ESTALE for every inode it had forgotten.)
#[test]
fn exported_handles_open_after_the_kernel_forgot_the_inode() {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;

    let m = Mounted::new(Config::default(), Duration::from_secs(60));
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let run = |root: &Path| {
        let base = root.join("export");
        std::fs::create_dir_all(base.join("d/sub")).unwrap();
        std::fs::write(base.join("d/f"), b"exported bytes").unwrap();
        std::fs::write(base.join("gone"), b"x").unwrap();
        std::fs::write(base.join("replaced"), b"old").unwrap();
        let mut file = handle_of(&base.join("d/f"));
        let mut dir = handle_of(&base.join("d"));
        let mut gone = handle_of(&base.join("gone"));
        let mut replaced = handle_of(&base.join("replaced"));
        let ino = std::fs::metadata(base.join("d/f")).unwrap().ino();
        std::fs::remove_file(base.join("gone")).unwrap();
        std::fs::write(base.join("new"), b"new").unwrap();
        std::fs::rename(base.join("new"), base.join("replaced")).unwrap();
        drop_dentries_and_inodes();
        let mnt = std::fs::File::open(root).unwrap();
        let mut out = Vec::new();
        match open_by_handle(&mnt, &mut file, libc::O_RDONLY) {
            Ok(mut f) => {
                let mut s = String::new();
                f.read_to_string(&mut s).unwrap();
                assert_eq!(f.metadata().unwrap().ino(), ino);
                out.push(format!("file: {s}"));
            }
            Err(e) => out.push(format!("file: errno {e}")),
        }
        match open_by_handle(&mnt, &mut dir, libc::O_RDONLY | libc::O_DIRECTORY) {
            Ok(f) => {
                let md = f.metadata().unwrap();
                // Read the directory through the descriptor the handle opened.
                let names = std::fs::read_dir(format!("/proc/self/fd/{}", {
                    use std::os::unix::io::AsRawFd;
                    f.as_raw_fd()
                }))
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect::<std::collections::BTreeSet<_>>();
                out.push(format!("dir: is_dir {} {names:?}", md.is_dir()));
            }
            Err(e) => out.push(format!("dir: errno {e}")),
        }
        for (what, h) in [("removed", &mut gone), ("replaced", &mut replaced)] {
            match open_by_handle(&mnt, h, libc::O_RDONLY) {
                Ok(_) => out.push(format!("{what}: opened")),
                Err(e) => out.push(format!("{what}: errno {e}")),
            }
        }
        out
    };
    let on_tmpfs = run(shm.path());
    assert_eq!(
        on_tmpfs,
        [
            "file: exported bytes",
            "dir: is_dir true {\"f\", \"sub\"}",
            &format!("removed: errno {}", libc::ESTALE),
            &format!("replaced: errno {}", libc::ESTALE),
        ]
    );
    assert_eq!(run(m.path()), on_tmpfs);
    m.unmount_and_check();
}

/// `lseek(SEEK_DATA / SEEK_HOLE)` with a negative offset answers ENXIO, as tmpfs does (the
/// offset is past no data and before no hole), not EINVAL.
#[test]
fn seek_data_and_hole_with_negative_offsets_match_tmpfs() {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;

    let m = Mounted::new(Config::default(), Duration::from_secs(60));
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let answers = |dir: &Path| {
        let mut out = Vec::new();
        for (name, data) in [("empty", &b""[..]), ("data", &b"some data"[..])] {
            let f = create_rw(dir.join(name));
            f.write_all_at(data, 0).unwrap();
            for off in [-1i64, -4096, i64::MIN] {
                for whence in [libc::SEEK_DATA, libc::SEEK_HOLE] {
                    // SAFETY: plain syscall on an open descriptor.
                    let r = unsafe { libc::lseek(f.as_raw_fd(), off, whence) };
                    let e = std::io::Error::last_os_error().raw_os_error();
                    out.push((name, off, whence, if r < 0 { Err(e) } else { Ok(r) }));
                }
            }
        }
        out
    };
    let on_tmpfs = answers(shm.path());
    assert!(
        on_tmpfs.iter().all(|a| a.3 == Err(Some(libc::ENXIO))),
        "{on_tmpfs:?}"
    );
    assert_eq!(answers(m.path()), on_tmpfs);
    m.unmount_and_check();
}

/// One pass over a directory of 5,000 files, renaming each entry it returns to `TMP` and
/// back, returns every name exactly once and ends, as on tmpfs (each rename gives the name a
/// new place in the directory; a read that followed it would never end, and lanefs once
/// returned 14,529-15,001 entries here).
#[test]
fn readdir_ends_while_its_entries_are_renamed_like_tmpfs() {
    const N: usize = 5000;
    let m = Mounted::new(Config::default(), Duration::from_secs(60));
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let run = |dir: &Path| {
        for i in 0..N {
            std::fs::File::create(dir.join(format!("f{i:05}"))).unwrap();
        }
        let mut seen = std::collections::BTreeMap::<String, usize>::new();
        let mut count = 0;
        for e in std::fs::read_dir(dir).unwrap() {
            let name = e.unwrap().file_name().into_string().unwrap();
            count += 1;
            assert!(count <= 3 * N, "readdir does not end: {count} entries");
            if name != "TMP" {
                std::fs::rename(dir.join(&name), dir.join("TMP")).unwrap();
                std::fs::rename(dir.join("TMP"), dir.join(&name)).unwrap();
            }
            *seen.entry(name).or_default() += 1;
        }
        let once = seen.values().all(|&n| n == 1);
        (count, seen.len(), once, seen.contains_key("TMP"))
    };
    let on_tmpfs = run(shm.path());
    assert_eq!(on_tmpfs, (N, N, true, false));
    assert_eq!(run(m.path()), on_tmpfs);
    m.unmount_and_check();
}

/// A store that says it is durable, and keeps nothing.
struct SaysDurable;

impl lanefs::Store for SaysDurable {
    fn append(&self, _: &lanefs::Record<'_>) -> lanefs::Result<()> {
        Ok(())
    }
    fn sync(&self) -> lanefs::Result<()> {
        Ok(())
    }
    fn durable(&self) -> bool {
        true
    }
}

/// On a mount of a store that keeps nothing (the memory store), `fsync` and `fdatasync` of
/// files and directories succeed without a request reaching lanefs (the kernel is told once,
/// with ENOSYS, that there is nothing to sync); on a durable store each reaches the engine.
/// Data written through a shared mapping is still written back by `fsync`.
#[test]
fn fsync_on_a_volatile_store_sends_no_request() {
    use std::os::unix::io::AsRawFd;

    for volatile in [false, true] {
        let fs = Arc::new(match volatile {
            true => Filesystem::new(Config::default()),
            false => Filesystem::recover(Config::default(), Arc::new(SaysDurable))
                .finish()
                .unwrap(),
        });
        let dir = tempfile::tempdir().unwrap();
        let mc = MountConfig::default();
        let mut mount = Some(lanefs_fuse::mount_background(fs.clone(), dir.path(), &mc).unwrap());
        for _ in 0..200 {
            if is_fuse(dir.path()) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let p = dir.path().join("f");
        std::fs::write(&p, vec![b'a'; 4096]).unwrap();
        let f = open_rw(&p);
        let before = fs.stats();
        // SAFETY: a shared writable mapping of the file's one page, unmapped below.
        unsafe {
            let m = libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            );
            assert_ne!(m, libc::MAP_FAILED);
            std::ptr::copy_nonoverlapping(b"synced".as_ptr(), m as *mut u8, 6);
            for _ in 0..3 {
                f.sync_all().unwrap();
                f.sync_data().unwrap();
            }
            libc::munmap(m, 4096);
        }
        // The page reached the engine at the fsync, before the mapping went away.
        let lib = lanefs::Client::root(fs.clone());
        assert_eq!(&lib.read("/f").unwrap()[..6], b"synced");
        let d = std::fs::File::open(dir.path()).unwrap();
        for _ in 0..3 {
            d.sync_all().unwrap();
        }
        let fsyncs = fs.stats().since(&before).op(lanefs::Op::Fsync);
        if volatile {
            assert_eq!(
                fsyncs, 0,
                "volatile store: no FSYNC or FSYNCDIR reaches lanefs"
            );
        } else {
            assert_eq!(fsyncs, 9, "six file and three directory syncs");
        }
        drop((f, d));
        unmount(&mut mount).unwrap();
        fs.check_invariants().unwrap();
    }
}

/// `chattr` and `lsattr` work through the mount (FUSE_IOCTL: the kernel reads the old flags
/// with FS_IOC_FSGETXATTR before FS_IOC_SETFLAGS), and what the kernel lets through because it
/// does not know a FUSE inode is immutable or append-only is refused by the server: an open
/// for writing succeeds, its writes do not (README, the differences; docs/DESIGN.md §7).
#[test]
fn inode_flags_through_the_mount() {
    use std::io::Write;
    let m = Mounted::new(Config::default(), Duration::from_secs(60));
    let d = m.path().display();
    let out = sh(&format!(
        "set -e; cd {d}; echo data > f; mkdir dir; chattr +i f; chattr +a dir; chattr +dA dir; \
         lsattr -d f dir | cut -c1-22; rm -f f 2>&1 || true; touch dir/new; rm dir/new 2>&1 || true; \
         chattr -i f; chattr -a dir; rm f dir/new; lsattr -d dir | cut -c1-22"
    ));
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("----i---"), "{text}");
    assert!(lines[1].starts_with("-----adA"), "{text}");
    assert!(text.contains("Operation not permitted"), "{text}");
    assert!(lines.last().unwrap().starts_with("------dA"), "{text}");

    let f = m.path().join("g");
    std::fs::write(&f, b"x").unwrap();
    m.fs.set_flags(
        &lanefs::Ctx::root(),
        m.fs.lookup(&lanefs::Ctx::root(), m.fs.root(), b"g")
            .unwrap()
            .ino,
        lanefs::FS_IMMUTABLE_FL,
    )
    .unwrap();
    // The kernel opens it (it never asks the server), the write is refused.
    let mut w = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
    let e = w.write_all(b"y").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM));
    let e = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&f)
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM), "O_TRUNC is a SETATTR");
    drop(w);
    // Append-only: only O_APPEND writes go through.
    let ino =
        m.fs.lookup(&lanefs::Ctx::root(), m.fs.root(), b"g")
            .unwrap()
            .ino;
    m.fs.set_flags(&lanefs::Ctx::root(), ino, lanefs::FS_APPEND_FL)
        .unwrap();
    let mut w = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
    assert_eq!(
        w.write_all(b"y").unwrap_err().raw_os_error(),
        Some(libc::EPERM)
    );
    let mut a = std::fs::OpenOptions::new().append(true).open(&f).unwrap();
    a.write_all(b"z").unwrap();
    drop((w, a));
    assert_eq!(std::fs::read(&f).unwrap(), b"xz");
    m.fs.set_flags(&lanefs::Ctx::root(), ino, 0).unwrap();
    m.unmount_and_check();
}

/// `statx(2)` of `path` through the kernel (not following a last symlink), with `mask` and
/// the sync flags in `flags`.
fn statx(path: &Path, mask: u32, flags: i32) -> libc::statx {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: statx is plain old data; all-zero is a valid value.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid C string and `sx` a writable struct statx.
    let r = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW | flags,
            mask,
            &mut sx,
        )
    };
    assert_eq!(
        r,
        0,
        "statx {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    sx
}

/// `statx` through the kernel. The kernel asks with FUSE_STATX (7.39) when a call wants the
/// birth time and does not have it, and lanefs answers with it: one request for a file just
/// made, none for the next call (the kernel keeps the birth time with the attributes). The
/// answer's basic fields and birth time are the engine's, for every kind of inode, through
/// the FUSE_STATX, GETATTR and cached paths alike.
///
/// The inode flags 'i', 'a' and 'd': FUSE_STATX carries their `STATX_ATTR_*` bits and
/// mask, which Linux (6.6 to 6.18 at least) drops: `fuse_do_statx` copies only the mask,
/// the basic fields and the birth time of the reply, and nothing else gives a FUSE inode
/// these bits. So the kernel reports either exactly the engine's bits and their mask, or,
/// as on those kernels, none of them and no mask for them (printed).
#[test]
fn statx_through_the_kernel() {
    let m = Mounted::new(Config::default(), Duration::from_secs(60));
    let d = m.path().display();
    let out = sh(&format!(
        "set -e; cd {d}; echo data > i; touch a n plain; mkdir dir; chattr +i i; chattr +a a; \
         chattr +d n; chattr +d dir; mkfifo dir/fifo; ln -s target dir/link; \
         mknod dir/chr c 259 300"
    ));
    assert!(out.status.success(), "{out:?}");
    let root = lanefs::Ctx::root();
    let engine = |name: &str| {
        let mut ino = m.fs.root();
        for c in name.split('/') {
            ino = m.fs.lookup(&root, ino, c.as_bytes()).unwrap().ino;
        }
        m.fs.getattr(ino).unwrap()
    };
    // Through the library too: the kernel's cached attributes are dropped with the change.
    m.fs.set_flags(
        &root,
        engine("plain").ino,
        lanefs::FS_IMMUTABLE_FL | lanefs::FS_APPEND_FL,
    )
    .unwrap();
    let names = [
        "i", "a", "n", "plain", "dir", "dir/fifo", "dir/link", "dir/chr",
    ];
    let ours = lanefs::STATX_ATTRS;
    let basic = libc::STATX_BASIC_STATS;
    let btime = libc::STATX_BTIME;
    let calls = [
        (basic | btime, 0),
        (basic | btime, libc::AT_STATX_FORCE_SYNC),
        (basic, 0),
        (basic, libc::AT_STATX_FORCE_SYNC),
        (btime, libc::AT_STATX_DONT_SYNC),
    ];
    let mut copied = None;
    for (mask, flags) in calls {
        for name in names {
            let sx = statx(&m.path().join(name), mask, flags);
            let a = engine(name);
            let at = format!("{name} (mask {mask:#x}, flags {flags:#x})");
            assert_eq!(sx.stx_mask & basic, basic, "{at}");
            // Asked for, the birth time is there; not asked for, it may be (the kernel's
            // cached one); either way the engine's.
            if mask & btime != 0 {
                assert_eq!(sx.stx_mask & btime, btime, "{at}: the birth time");
            }
            if sx.stx_mask & btime != 0 {
                let b = a.btime.expect("the engine keeps birth times");
                assert_eq!(
                    (sx.stx_btime.tv_sec, sx.stx_btime.tv_nsec),
                    (b.sec, b.nsec),
                    "{at}: the birth time"
                );
            }
            assert_eq!(
                (
                    sx.stx_ino,
                    u32::from(sx.stx_mode),
                    sx.stx_nlink,
                    sx.stx_size
                ),
                (a.ino.get(), a.mode, a.nlink, a.size),
                "{at}"
            );
            assert_eq!(
                (sx.stx_uid, sx.stx_gid, sx.stx_blocks),
                (a.uid, a.gid, a.blocks)
            );
            assert_eq!(
                (sx.stx_mtime.tv_sec, sx.stx_mtime.tv_nsec),
                (a.mtime.sec, a.mtime.nsec)
            );
            assert_eq!(
                (sx.stx_ctime.tv_sec, sx.stx_ctime.tv_nsec),
                (a.ctime.sec, a.ctime.nsec)
            );
            if name == "dir/chr" {
                assert_eq!((sx.stx_rdev_major, sx.stx_rdev_minor), (259, 300), "{at}");
            }
            let shown = (sx.stx_attributes & ours, sx.stx_attributes_mask & ours);
            let want = a.statx_attributes();
            let now = if shown == (want, ours) {
                true
            } else {
                assert_eq!(shown, (0, 0), "{at}: the engine's bits are {want:#x}");
                false
            };
            assert_eq!(
                *copied.get_or_insert(now),
                now,
                "{at}: the kernel changed its mind"
            );
        }
    }
    eprintln!(
        "statx_through_the_kernel: this kernel {} the STATX_ATTR_* bits of FUSE_STATX",
        if copied == Some(true) {
            "reports"
        } else {
            "drops"
        }
    );
    // A file just made: its attributes are cached, its birth time never asked. Asking for it
    // is one FUSE_STATX (served by one engine getattr); the next call is served by the cache.
    let new = m.path().join("new");
    let c = CString::new(new.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid C string.
    let r = unsafe { libc::mknod(c.as_ptr(), libc::S_IFREG | 0o644, 0) };
    assert_eq!(r, 0);
    // (The make dropped the root's cached attributes, which the walk's permission check
    // needs: fetched here.)
    statx(m.path(), basic, 0);
    let getattrs = || m.fs.stats().op(lanefs::Op::Getattr);
    for (want, call) in [(1, "first"), (0, "second")] {
        let before = getattrs();
        let sx = statx(&new, basic | btime, 0);
        assert_eq!(sx.stx_size, 0);
        assert_eq!(sx.stx_mask & btime, btime, "{call} statx");
        assert_eq!(getattrs() - before, want, "{call} statx");
    }
    // And cleared again.
    for name in ["i", "a", "n", "plain", "dir"] {
        m.fs.set_flags(&root, engine(name).ino, 0).unwrap();
        let sx = statx(
            &m.path().join(name),
            basic | btime,
            libc::AT_STATX_FORCE_SYNC,
        );
        assert_eq!(sx.stx_attributes & ours, 0, "{name}");
    }
    m.unmount_and_check();
}

/// overlayfs with its upper and work directories on lanefs: removing a lower file leaves a
/// whiteout (RENAME_WHITEOUT, or a 0/0 device) in the upper directory, and the file is gone
/// from the overlay. Skipped where overlayfs cannot be mounted (no module, not root, or a
/// kernel that refuses FUSE as an upper layer).
#[test]
fn overlayfs_upper_on_lanefs() {
    let m = Mounted::new(Config::default(), Duration::from_secs(60));
    let lower = tempfile::tempdir().unwrap();
    let merged = tempfile::tempdir().unwrap();
    std::fs::write(lower.path().join("gone"), b"lower").unwrap();
    std::fs::write(lower.path().join("kept"), b"lower").unwrap();
    std::fs::create_dir(lower.path().join("ldir")).unwrap();
    std::fs::write(lower.path().join("ldir/inner"), b"lower").unwrap();
    let (up, work) = (m.path().join("upper"), m.path().join("work"));
    std::fs::create_dir(&up).unwrap();
    std::fs::create_dir(&work).unwrap();
    let out = sh(&format!(
        "mount -t overlay overlay -o lowerdir={},upperdir={},workdir={} {}",
        lower.path().display(),
        up.display(),
        work.display(),
        merged.path().display()
    ));
    if !out.status.success() {
        eprintln!(
            "skipped: overlayfs not mountable here: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        return;
    }
    let mp = merged.path();
    let r = (|| -> std::io::Result<()> {
        std::fs::remove_file(mp.join("gone"))?;
        std::fs::remove_dir_all(mp.join("ldir"))?;
        std::fs::write(mp.join("kept"), b"upper")?;
        std::fs::rename(mp.join("kept"), mp.join("moved"))?;
        Ok(())
    })();
    let listing: Vec<String> = std::fs::read_dir(mp)
        .map(|rd| {
            let mut v: Vec<String> = rd
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        })
        .unwrap_or_default();
    let wh = std::fs::symlink_metadata(up.join("gone"));
    sh(&format!("umount {}", mp.display()));
    r.expect("changes through the overlay");
    assert_eq!(listing, ["moved"], "the overlay shows what is left");
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let wh = wh.expect("a whiteout in the upper directory");
    assert!(wh.file_type().is_char_device() && wh.rdev() == 0, "{wh:?}");
    m.unmount_and_check();
}

/// `open(dir, O_TMPFILE | flags, 0600)` through the mount (FUSE_TMPFILE): the file as an open
/// `File`, or the errno.
fn open_tmpfile(dir: &Path, flags: i32) -> Result<std::fs::File, i32> {
    use std::os::fd::FromRawFd;
    let c = CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: `c` is a valid C string; open has no other memory-safety preconditions.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_TMPFILE | flags, 0o600) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// Gives the open file `f` the name `to`: `linkat` of `/proc/self/fd/N` following the
/// symlink (any user may), or with `AT_EMPTY_PATH` (as root).
fn link_open_file(f: &std::fs::File, to: &Path, empty_path: bool) -> Result<(), i32> {
    use std::os::fd::AsRawFd;
    let to = CString::new(to.as_os_str().as_bytes()).unwrap();
    let r = if empty_path {
        // SAFETY: valid C strings and an open descriptor.
        unsafe {
            libc::linkat(
                f.as_raw_fd(),
                c"".as_ptr(),
                libc::AT_FDCWD,
                to.as_ptr(),
                libc::AT_EMPTY_PATH,
            )
        }
    } else {
        let from = CString::new(format!("/proc/self/fd/{}", f.as_raw_fd())).unwrap();
        // SAFETY: valid C strings.
        unsafe {
            libc::linkat(
                libc::AT_FDCWD,
                from.as_ptr(),
                libc::AT_FDCWD,
                to.as_ptr(),
                libc::AT_SYMLINK_FOLLOW,
            )
        }
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap())
    }
}

fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

/// Waits (the kernel forgets an unnamed file's inode after its last close, asynchronously)
/// until the engine holds `n` inodes.
fn wait_for_inodes(fs: &Filesystem, n: u64) {
    let used = || fs.statfs().files - fs.statfs().ffree;
    for _ in 0..500 {
        if used() == n {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(used(), n, "inodes in the engine");
}

/// `O_TMPFILE` through the mount: a file with no name, in no listing, written, then linked
/// through `/proc/self/fd` (and with `AT_EMPTY_PATH`) with its data; not after `O_EXCL`, and
/// an unlinked file cannot be linked back; one never linked is freed after its close.
#[test]
fn o_tmpfile_and_linkat_through_the_mount() {
    use std::io::{Read, Seek, Write};
    use std::os::unix::fs::MetadataExt;

    let m = Mounted::new(Config::default(), Duration::from_secs(60));
    let d = m.path().join("d");
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("other"), b"x").unwrap();
    let base = m.fs.statfs().files - m.fs.statfs().ffree;

    let mut f = open_tmpfile(&d, libc::O_RDWR).expect("O_TMPFILE through the mount");
    let md = f.metadata().unwrap();
    assert_eq!(md.nlink(), 0);
    assert_eq!(md.mode(), libc::S_IFREG | 0o600);
    f.write_all(b"written before the link").unwrap();
    assert_eq!(listing(&d), ["other"], "no name before the link");
    assert_eq!(m.fs.statfs().files - m.fs.statfs().ffree, base + 1);
    link_open_file(&f, &d.join("named"), false).unwrap();
    assert_eq!(f.metadata().unwrap().nlink(), 1);
    assert_eq!(listing(&d), ["named", "other"]);
    assert_eq!(
        std::fs::read(d.join("named")).unwrap(),
        b"written before the link"
    );
    f.write_all(b", and after").unwrap();
    f.rewind().unwrap();
    let mut back = String::new();
    f.read_to_string(&mut back).unwrap();
    assert_eq!(back, "written before the link, and after");
    drop(f);
    assert_eq!(
        std::fs::read(d.join("named")).unwrap(),
        b"written before the link, and after"
    );
    let st = std::fs::metadata(d.join("named")).unwrap();
    assert_eq!((st.nlink(), st.len()), (1, 34));

    // AT_EMPTY_PATH names it too.
    let mut f = open_tmpfile(&d, libc::O_WRONLY).unwrap();
    f.write_all(b"empty path").unwrap();
    link_open_file(&f, &d.join("by-fd"), true).unwrap();
    drop(f);
    assert_eq!(std::fs::read(d.join("by-fd")).unwrap(), b"empty path");

    // O_EXCL: never a name.
    let f = open_tmpfile(&d, libc::O_RDWR | libc::O_EXCL).unwrap();
    assert_eq!(
        link_open_file(&f, &d.join("excl"), false),
        Err(libc::ENOENT)
    );
    drop(f);
    // An ordinary file whose last name went: not linked back.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(d.join("plain"))
        .unwrap();
    std::fs::remove_file(d.join("plain")).unwrap();
    assert_eq!(
        link_open_file(&f, &d.join("back"), false),
        Err(libc::ENOENT)
    );
    drop(f);

    // Unnamed ones, written and closed, never show and leave nothing.
    for i in 0..20 {
        let mut f = open_tmpfile(&d, libc::O_RDWR).unwrap();
        f.write_all(&vec![b'u'; 5000 + i]).unwrap();
        assert_eq!(listing(&d), ["by-fd", "named", "other"]);
    }
    // Read-only access: EINVAL from the kernel; a regular file: ENOTDIR.
    assert_eq!(open_tmpfile(&d, libc::O_RDONLY).err(), Some(libc::EINVAL));
    assert_eq!(
        open_tmpfile(&d.join("other"), libc::O_RDWR).err(),
        Some(libc::ENOTDIR)
    );
    wait_for_inodes(&m.fs, base + 2);
    assert_eq!(listing(&d), ["by-fd", "named", "other"]);
    m.unmount_and_check();
}

/// Threads make `O_TMPFILE` files through the mount, write them and link them into one
/// directory (some under two names, some never), while others list it and read what they
/// list: a listed name always has its whole contents and a link count of at least 1, and at
/// the end every file's link count is its number of names and no unnamed file is left.
#[test]
fn tmpfiles_linked_into_one_directory_while_it_is_listed_through_the_mount() {
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

    const MAKERS: usize = 4;
    const FILES: usize = 60;
    let m = Mounted::new(Config::default(), Duration::from_secs(60));
    let d = m.path().join("d");
    std::fs::create_dir(&d).unwrap();
    let content = |t: usize, i: usize| format!("{t}-{i};").repeat(1 + i * 37);
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let makers: Vec<_> = (0..MAKERS)
            .map(|t| {
                let d = d.clone();
                s.spawn(move || {
                    for i in 0..FILES {
                        let mut f = open_tmpfile(&d, libc::O_RDWR).unwrap();
                        f.write_all(content(t, i).as_bytes()).unwrap();
                        if i % 5 == 4 {
                            continue; // never named
                        }
                        link_open_file(&f, &d.join(format!("a{t}-{i}")), false).unwrap();
                        if i % 3 == 0 {
                            link_open_file(&f, &d.join(format!("b{t}-{i}")), i % 2 == 0).unwrap();
                        }
                    }
                })
            })
            .collect();
        let listers: Vec<_> = (0..2)
            .map(|_| {
                let (d, done) = (d.clone(), &done);
                s.spawn(move || {
                    let mut listed = 0;
                    while !done.load(Relaxed) {
                        for name in listing(&d) {
                            let p = d.join(&name);
                            let st = std::fs::metadata(&p).unwrap();
                            assert!(st.nlink() >= 1, "{name} listed with no link");
                            let (t, i) = name[1..].split_once('-').unwrap();
                            let want = content(t.parse().unwrap(), i.parse().unwrap());
                            assert_eq!(std::fs::read(&p).unwrap(), want.as_bytes(), "{name}");
                            listed += 1;
                        }
                    }
                    listed
                })
            })
            .collect();
        for h in makers {
            h.join().unwrap();
        }
        done.store(true, Relaxed);
        let listed: usize = listers.into_iter().map(|h| h.join().unwrap()).sum();
        eprintln!("{listed} names listed and read while the files were linked");
    });
    let names = listing(&d);
    let per_maker = (0..FILES).filter(|i| i % 5 != 4).count();
    let seconds = (0..FILES).filter(|i| i % 5 != 4 && i % 3 == 0).count();
    assert_eq!(names.len(), MAKERS * (per_maker + seconds));
    for name in &names {
        let i: usize = name.split_once('-').unwrap().1.parse().unwrap();
        let st = std::fs::metadata(d.join(name)).unwrap();
        assert_eq!(st.nlink(), if i % 3 == 0 { 2 } else { 1 }, "{name}");
    }
    wait_for_inodes(&m.fs, 2 + (MAKERS * per_maker) as u64);
    m.unmount_and_check();
}

/// On a disk store: a tmpfile linked and fsynced through the mount is there after the store
/// is closed and reopened; one left unnamed is not, and fsck finds the store clean.
#[test]
fn a_tmpfile_linked_through_the_mount_is_durable_on_a_disk_store() {
    use std::io::Write;

    let store = tempfile::tempdir().unwrap();
    let m = Mounted::on_store(store.path(), Duration::from_secs(60));
    let mut f = open_tmpfile(m.path(), libc::O_RDWR).unwrap();
    f.write_all(&vec![b'k'; 10_000]).unwrap();
    link_open_file(&f, &m.path().join("kept"), false).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let mut unnamed = open_tmpfile(m.path(), libc::O_RDWR).unwrap();
    unnamed.write_all(&vec![b'u'; 10_000]).unwrap();
    unnamed.sync_all().unwrap();
    drop(unnamed);
    m.unmount_and_check();
    let r = lanefs_store::fsck::check(store.path(), &lanefs_store::Options::default()).unwrap();
    assert_eq!(r.inodes, 2, "root and kept: {r:?}");
    let o = open_store(store.path());
    let c = lanefs::Client::root(Arc::new(o.fs));
    assert_eq!(c.read("/kept").unwrap(), vec![b'k'; 10_000]);
    assert_eq!(c.read_dir("/").unwrap().len(), 1);
    let s = c.fs().statfs();
    assert_eq!(s.files - s.ffree, 2);
    assert_eq!(s.blocks - s.bfree, 3, "the kept file's pages only");
    c.fs().check_invariants().unwrap();
}

/// A bounded inode cache served through the mount: the kernel keeps every directory a
/// program walked (a lookup reference, and its dentry) until its own memory pressure, and
/// with them their entries, which no eviction pass can free. A pass that finds held entries
/// a large part of the cache asks the kernel to let go of the directories it holds and does
/// not use (`FUSE_NOTIFY_PRUNE`, Linux 6.18); their FORGETs make them evictable, and they
/// go with their entries. The same for files the kernel looked up.
#[test]
fn directories_the_kernel_walked_are_let_go() {
    const DIRS: usize = 40;
    const FILES: usize = 50;
    let store = tempfile::tempdir().unwrap();
    {
        let o = open_store(store.path());
        let c = lanefs::Client::root(Arc::new(o.fs));
        for d in 0..DIRS {
            c.create_dir(format!("/d{d}")).unwrap();
            for f in 0..FILES {
                c.write(format!("/d{d}/f{f}"), b"x").unwrap();
            }
        }
        o.store.checkpoint().unwrap();
        drop(c);
        o.store.close().unwrap();
    }
    let cfg = Config {
        inode_cache: Some(64 * lanefs::INODE_BYTES),
        ..Config::default()
    };
    let opts = lanefs_store::Options {
        lazy: true,
        ..lanefs_store::Options::default()
    };
    let o = lanefs_store::open(store.path(), cfg, opts).unwrap();
    // Nothing is evicted before a checkpoint taken after the opening.
    o.store.checkpoint().unwrap();
    let m = Mounted::serve(o.fs, Some(o.store), Duration::from_secs(60));
    // Each directory listed through the kernel (getdents only, as `ls -f`): the kernel
    // looks each up and keeps it.
    for d in 0..DIRS {
        let n = std::fs::read_dir(m.path().join(format!("d{d}")))
            .unwrap()
            .count();
        assert_eq!(n, FILES, "d{d}");
    }
    let fs = m.fs.clone();
    let counts = |fs: &Filesystem| {
        format!(
            "{} inodes and {} entries ({} of held directories) in memory, {} inodes pruned, \
             {} evicted ({} directories)",
            fs.inodes_in_memory(),
            fs.entries_in_memory(),
            fs.held_entries(),
            fs.inodes_pruned(),
            fs.inodes_evicted(),
            fs.directories_evicted()
        )
    };
    // Passes run until `done`: the kernel's FORGETs of what it was asked to let go of come
    // in meanwhile (a kernel before 7.45 refuses the prune: the test fails then).
    let passes_until = |done: &dyn Fn(&Filesystem) -> bool, what: &str| {
        let before = counts(&fs);
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while !done(&fs) {
            assert!(
                std::time::Instant::now() < deadline,
                "{what} stay: {} (before the passes: {before})",
                counts(&fs)
            );
            fs.evict_inodes(false);
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    passes_until(
        &|fs| {
            fs.directories_evicted() >= (DIRS / 2) as u64
                && fs.entries_in_memory() <= (DIRS * FILES / 2) as u64
        },
        "the walked directories",
    );
    assert!(fs.inodes_pruned() > 0, "{}", counts(&fs));
    // What went comes back through the mount.
    for d in 0..DIRS {
        assert_eq!(
            std::fs::read_dir(m.path().join(format!("d{d}")))
                .unwrap()
                .count(),
            FILES
        );
    }
    // Every file stat'd through the kernel, which then holds each (a lookup, a dentry):
    // 2000 inodes against a budget of 64. The passes have it let go of them too.
    for d in 0..DIRS {
        for f in 0..FILES {
            let md = std::fs::metadata(m.path().join(format!("d{d}/f{f}"))).unwrap();
            assert_eq!(md.len(), 1, "d{d}/f{f}");
        }
    }
    passes_until(
        &|fs| fs.inodes_in_memory() <= 2 * 64,
        "the files the kernel looked up",
    );
    assert_eq!(
        std::fs::read(m.path().join(format!("d{}/f{}", DIRS - 1, FILES - 1))).unwrap(),
        b"x"
    );
    m.unmount_and_check();
}
