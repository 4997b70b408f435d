//! Space through a mount (issue 35, items 1 and 2), as xfstests checks it:
//! - generic/103 fallocates all of `df`'s free space; on a `--store` mount of the default
//!   size (its host's disk) the server grew to 23 GB and was killed, and again while opening
//!   that store. Fallocated ranges must cost memory that does not grow with their length,
//!   live and when the store opens; so must a huge `truncate` up, a write far past the end
//!   and a `copy_file_range` of a sparse file (on a memory mount, where the copy's writes
//!   pass through no journal buffers). The server's VmRSS is read from
//!   /proc/PID/status and bounded.
//! - generic/213: `fallocate -l 1g a; fallocate -l 1g b; rm a b; fallocate -l 1g c` on a
//!   2 GiB filesystem failed with ENOSPC: the space of an unlinked file came back only at the
//!   kernel's FORGET. It must be free when `unlink` returns if nothing has the file open,
//!   and kept while something does.
//!
//! Its own test binary: the servers are measured while nothing else in this process writes
//! beside them. Mounting needs /dev/fuse and root or fusermount3, as in cli.rs.

mod common;

use common::{can_mount, is_root, lanefs};

use std::ffi::CString;
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A mount made by the test, with its server's pid: unmounted when it drops (lazily, so
/// that a failure leaves no mount behind), or by [`Mounted::unmount`], which waits for the
/// server to exit.
struct Mounted {
    mp: PathBuf,
    pid: i32,
    up: bool,
}

impl Mounted {
    fn new(args: &[&str], mp: &Path) -> Mounted {
        let mut a = vec!["mount", "--background"];
        a.extend_from_slice(args);
        a.push(mp.to_str().unwrap());
        let out = lanefs(&a);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut m = Mounted {
            mp: mp.to_path_buf(),
            pid: 0,
            up: true,
        };
        m.pid = match m.stats()["pid"].as_u64() {
            Some(pid) => i32::try_from(pid).unwrap(),
            None => server_of(mp),
        };
        m
    }

    fn stats(&self) -> serde_json::Value {
        let st = lanefs(&["stats", "--json", self.mp.to_str().unwrap()]);
        assert!(
            st.status.success(),
            "{}",
            String::from_utf8_lossy(&st.stderr)
        );
        serde_json::from_slice(&st.stdout).unwrap()
    }

    /// The server's resident set, from /proc/PID/status.
    fn rss(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap();
        let kb: u64 = s
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS");
        kb * 1024
    }

    /// Blocks and inodes in use, as `df` and `df -i` count them.
    fn used(&self) -> (u64, u64) {
        let s = statvfs(&self.mp);
        ((s.f_blocks - s.f_bfree) * s.f_frsize, s.f_files - s.f_ffree)
    }

    /// Unmounts and waits for the server to exit (it lets go of its store then).
    fn unmount(mut self) {
        umount(&self.mp, 0);
        self.up = false;
        // SAFETY: signal 0 only checks that the process exists.
        while unsafe { libc::kill(self.pid, 0) } == 0 {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.up {
            umount(&self.mp, libc::MNT_DETACH);
        }
    }
}

/// The `lanefs` process serving `mp`, found by its command line (for a server whose
/// `lanefs stats` does not say its pid).
fn server_of(mp: &Path) -> i32 {
    let want = mp.as_os_str().as_bytes();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let mut args = c.split(|&b| b == 0);
                args.next().is_some_and(|a| a.ends_with(b"lanefs")) && args.any(|a| a == want)
            })
        })
        .expect("the server's process")
}

fn umount(mp: &Path, flags: i32) {
    if is_root() {
        let c = CString::new(mp.as_os_str().as_bytes()).unwrap();
        // A child another test forks holds copies of this test's descriptors until it
        // execs: an unmount may meet a brief EBUSY (retried for up to 5 s, as in cli.rs).
        for _ in 0..100 {
            // SAFETY: a valid C string; umount2 has no other preconditions.
            let r = unsafe { libc::umount2(c.as_ptr(), flags) };
            let busy = std::io::Error::last_os_error().raw_os_error() == Some(libc::EBUSY);
            if r == 0 || flags != 0 || !busy {
                assert!(r == 0 || flags != 0, "umount {}", mp.display());
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("umount {}: busy", mp.display());
    } else {
        let flag = if flags == 0 { "-u" } else { "-uz" };
        let _ = Command::new("fusermount3").arg(flag).arg(mp).output();
    }
}

fn statvfs(p: &Path) -> libc::statvfs {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: a zeroed statvfs is a valid out-buffer.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and out-buffer.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut s) }, 0);
    s
}

fn fallocate(f: &File, off: u64, len: u64) -> std::io::Result<()> {
    // SAFETY: a valid descriptor; fallocate(2) has no other preconditions.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, off as i64, len as i64) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// `fallocate -l LEN path`: made, allocated, closed.
fn fallocate_new(path: &Path, len: u64) -> std::io::Result<()> {
    fallocate(&File::create(path)?, 0, len)
}

fn mib(b: u64) -> u64 {
    b / MIB
}

/// generic/103 on a `--store` mount of the default size: all of `df`'s free space
/// fallocated, then a truncate up, a write far past the end, a `copy_file_range` of a sparse
/// file, and the store opened again; the server's resident set stays small throughout.
#[test]
fn fallocating_all_free_space_of_a_store_mount_keeps_the_server_small() {
    if !can_mount("fallocating_all_free_space_of_a_store_mount_keeps_the_server_small") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (store, mp) = (dir.path().join("store"), dir.path().join("mnt"));
    std::fs::create_dir(&mp).unwrap();
    let s = store.to_str().unwrap();
    let m = Mounted::new(&["--store", s], &mp);
    let base = m.rss();
    let st = statvfs(&mp);
    let free = st.f_bavail * st.f_frsize;
    let big = File::create(mp.join("big")).unwrap();
    fallocate(&big, 0, free).unwrap();
    drop(big);
    let after = m.rss();
    eprintln!(
        "store mount: {} MiB fallocated, server {} MiB -> {} MiB",
        mib(free),
        mib(base),
        mib(after)
    );
    assert!(
        after < base + 64 * MIB,
        "fallocating {} MiB took the server from {} MiB to {} MiB",
        mib(free),
        mib(base),
        mib(after)
    );
    assert!(m.used().0 >= free, "the space is taken");

    // A truncate up to a terabyte, and a write at two.
    let t = File::create(mp.join("t")).unwrap();
    t.set_len(1 << 40).unwrap();
    let mut p = File::create(mp.join("p")).unwrap();
    p.seek(std::io::SeekFrom::Start(2 << 40)).unwrap();
    p.write_all(b"far").unwrap();
    drop((t, p));
    let grown = m.rss();
    eprintln!("after a truncate up and a far write: {} MiB", mib(grown));
    assert!(
        grown < base + 64 * MIB,
        "the server grew from {} MiB to {} MiB",
        mib(base),
        mib(grown)
    );
    let used = m.used();
    m.unmount();

    // Opened again (the journal replayed, or the checkpoint loaded): as small.
    let m = Mounted::new(&["--store", s], &mp);
    let opened = m.rss();
    eprintln!("store opened again: {} MiB", mib(opened));
    assert!(
        opened < base + 128 * MIB,
        "opening the store took the server to {} MiB (from {} MiB)",
        mib(opened),
        mib(base)
    );
    assert_eq!(m.used(), used);
    std::fs::remove_file(mp.join("big")).unwrap();
    assert!(
        m.used().0 < used.0 - free + MIB,
        "removed: the space is back"
    );
    m.unmount();
}

/// generic/103 on a memory mount: 6 GiB fallocated on a mount of 8 GiB costs the server
/// nothing like 6 GiB, and nor does a `copy_file_range` of a file with a 1 GiB hole (the
/// kernel copies it through reads and writes: the hole's zeros are written, and kept as
/// allocated zeros, not pages).
#[test]
fn fallocating_a_memory_mount_keeps_the_server_small() {
    if !can_mount("fallocating_a_memory_mount_keeps_the_server_small") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path();
    let m = Mounted::new(&["-o", "size=8g"], mp);
    let base = m.rss();
    fallocate_new(&mp.join("f"), 6 * GIB).unwrap();
    let after = m.rss();
    eprintln!(
        "memory mount: 6 GiB fallocated, server {} MiB -> {} MiB",
        mib(base),
        mib(after)
    );
    assert!(
        after < base + 32 * MIB,
        "fallocating 6 GiB took the server from {} MiB to {} MiB",
        mib(base),
        mib(after)
    );
    let mut sparse = File::create(mp.join("sparse")).unwrap();
    sparse.seek(std::io::SeekFrom::Start(GIB)).unwrap();
    sparse.write_all(b"end").unwrap();
    let src = File::open(mp.join("sparse")).unwrap();
    let dst = File::create(mp.join("copy")).unwrap();
    let mut copied = 0;
    loop {
        // SAFETY: valid descriptors; null offsets use the files' own.
        let n = unsafe {
            libc::copy_file_range(
                src.as_raw_fd(),
                std::ptr::null_mut(),
                dst.as_raw_fd(),
                std::ptr::null_mut(),
                2 * GIB as usize,
                0,
            )
        };
        assert!(n >= 0, "{}", std::io::Error::last_os_error());
        if n == 0 {
            break;
        }
        copied += n as u64;
    }
    assert_eq!(copied, GIB + 3);
    drop((sparse, src, dst));
    let mut c = File::open(mp.join("copy")).unwrap();
    c.seek(std::io::SeekFrom::Start(GIB)).unwrap();
    let mut end = [0u8; 3];
    c.read_exact(&mut end).unwrap();
    assert_eq!(&end, b"end");
    drop(c);
    let copied_rss = m.rss();
    eprintln!("after copying 1 GiB with a hole: {} MiB", mib(copied_rss));
    assert!(
        copied_rss < base + 64 * MIB,
        "the copy took the server from {} MiB to {} MiB",
        mib(base),
        mib(copied_rss)
    );
    assert_eq!(
        fallocate_new(&mp.join("g"), 2 * GIB)
            .unwrap_err()
            .raw_os_error(),
        Some(libc::ENOSPC),
        "7 GiB of 8 taken"
    );
    m.unmount();
}

/// generic/213: the space and inodes of removed files are free when `rm` returns.
fn unlinked_space_is_back_at_once(args: &[&str], mp: &Path) {
    let m = Mounted::new(args, mp);
    let (_, inodes) = m.used();
    fallocate_new(&mp.join("a"), GIB).unwrap();
    fallocate_new(&mp.join("b"), GIB).unwrap();
    assert_eq!(
        fallocate_new(&mp.join("x"), GIB)
            .unwrap_err()
            .raw_os_error(),
        Some(libc::ENOSPC),
        "2 GiB of 2 GiB taken"
    );
    std::fs::remove_file(mp.join("x")).unwrap();
    std::fs::remove_file(mp.join("a")).unwrap();
    std::fs::remove_file(mp.join("b")).unwrap();
    // No wait: as on tmpfs, nothing holds them.
    assert_eq!(m.used(), (0, inodes), "df right after rm");
    assert_eq!(m.stats()["inodes_used"].as_u64(), Some(inodes));
    fallocate_new(&mp.join("c"), GIB).unwrap();
    m.unmount();
}

#[test]
fn space_of_removed_files_is_free_when_rm_returns_on_a_memory_mount() {
    if !can_mount("space_of_removed_files_is_free_when_rm_returns_on_a_memory_mount") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    unlinked_space_is_back_at_once(&["-o", "size=2g"], dir.path());
}

#[test]
fn space_of_removed_files_is_free_when_rm_returns_on_a_store_mount() {
    if !can_mount("space_of_removed_files_is_free_when_rm_returns_on_a_store_mount") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (store, mp) = (dir.path().join("store"), dir.path().join("mnt"));
    std::fs::create_dir(&mp).unwrap();
    unlinked_space_is_back_at_once(&["--store", store.to_str().unwrap(), "-o", "size=2g"], &mp);
    // And the store agrees after a reopen.
    let m = Mounted::new(&["--store", store.to_str().unwrap(), "-o", "size=2g"], &mp);
    assert_eq!(m.used().0, GIB);
    assert_eq!(std::fs::metadata(mp.join("c")).unwrap().len(), GIB);
    m.unmount();
    let o = lanefs(&["fsck", store.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// A file unlinked while a process has it open through the mount keeps its data until the
/// last close, as on tmpfs; then its space comes back at once.
#[test]
fn an_unlinked_open_file_keeps_its_data_until_its_last_close() {
    if !can_mount("an_unlinked_open_file_keeps_its_data_until_its_last_close") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path();
    let m = Mounted::new(&["-o", "size=64m"], mp);
    let (_, inodes) = m.used();
    let data: Vec<u8> = (0..8 * MIB).map(|i| (i % 251) as u8).collect();
    let mut f = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(mp.join("f"))
        .unwrap();
    f.write_all(&data).unwrap();
    // A second descriptor of it, and a mapping.
    let g = File::open(mp.join("f")).unwrap();
    std::fs::remove_file(mp.join("f")).unwrap();
    assert!(!mp.join("f").exists());
    assert_eq!(m.used(), (8 * MIB, inodes + 1), "still open: still there");
    f.seek(std::io::SeekFrom::Start(0)).unwrap();
    let mut back = Vec::new();
    f.read_to_end(&mut back).unwrap();
    assert!(back == data, "read back after the unlink");
    f.write_all(b"more").unwrap();
    drop(f);
    assert_eq!(
        m.used(),
        (8 * MIB + 4096, inodes + 1),
        "one descriptor left"
    );
    let mut back = Vec::new();
    (&g).read_to_end(&mut back).unwrap();
    assert_eq!(back.len(), data.len() + 4);
    drop(g);
    // The last close evicts the inode (before close(2) returns); `df` asks the kernel, and
    // the room is back without waiting for the FORGET.
    assert_eq!(m.used(), (0, inodes), "back after the last close");
    m.unmount();
}
