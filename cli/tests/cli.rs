//! The `lanefs` binary as a user runs it: background mounts, the mount-helper form that
//! `mount -t fuse.lanefs` and /etc/fstab use, `lanefs stats`, and the one-line errors.
//! Mounting needs /dev/fuse; as root (the normal case here) the tests mount with `mount(2)`
//! and unmount with `umount2(2)`, so they need nothing else, except the one that goes
//! through `mount(8)` and `mount.fuse3` (`scripts/test.sh` installs fuse3). As another user
//! they mount through `fusermount3`, and the tests that need root say so and skip.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_lanefs");

fn lanefs(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run lanefs")
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Whether this test can run: as root always; otherwise it says why it skips.
fn needs_root(test: &str) -> bool {
    if !is_root() {
        eprintln!("{test}: SKIPPED: needs root (run the tests as root: scripts/test.sh)");
    }
    is_root()
}

/// Whether this process can mount at all (root, or fusermount3 and a usable /dev/fuse);
/// otherwise the test says why it skips.
fn can_mount(test: &str) -> bool {
    if is_root() {
        return true;
    }
    let fusermount = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("fusermount3").exists()));
    let dev = CString::new("/dev/fuse").unwrap();
    // SAFETY: a valid C string; access(2) has no other preconditions.
    let dev_ok = unsafe { libc::access(dev.as_ptr(), libc::R_OK | libc::W_OK) } == 0;
    if !(fusermount && dev_ok) {
        eprintln!(
            "{test}: SKIPPED: not root, and fusermount3 is missing or /dev/fuse is not \
             readable and writable"
        );
        return false;
    }
    true
}

/// `/proc/PID/mountinfo`'s line for the topmost mount at `p` (PID `self` for this process).
fn mountinfo_line(pid: &str, p: &Path) -> Option<String> {
    let canon = std::fs::canonicalize(p).unwrap();
    std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .unwrap()
        .lines()
        .rev()
        .find(|l| l.split(' ').nth(4) == Some(canon.to_str().unwrap()))
        .map(String::from)
}

fn mounted(p: &Path) -> bool {
    mountinfo_line("self", p).is_some()
}

/// Unmounts as `umount` does: with umount2(2) as root (no fuse3 needed), with
/// `fusermount3 -u` otherwise.
fn unmount(p: &Path) {
    if is_root() {
        let c = CString::new(p.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid C string; umount2 has no other preconditions.
        let r = unsafe { libc::umount2(c.as_ptr(), 0) };
        assert_eq!(
            r,
            0,
            "umount2 {}: {}",
            p.display(),
            std::io::Error::last_os_error()
        );
    } else {
        let out = Command::new("fusermount3")
            .arg("-u")
            .arg(p)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "fusermount3 -u: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for _ in 0..100 {
        if !mounted(p) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{} still mounted", p.display());
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn background_mount_stats_and_unmount() {
    if !can_mount("background_mount_stats_and_unmount") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path();
    let out = lanefs(&[
        "mount",
        "--background",
        "-o",
        "size=8m,nr_inodes=1000",
        mp.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(mounted(mp));
    // Mounted by root, it serves every user (as tmpfs does): allow_other is on.
    let line = mountinfo_line("self", mp).unwrap();
    assert_eq!(line.contains("allow_other"), is_root(), "{line}");
    std::fs::write(mp.join("hello"), b"world").unwrap();
    assert_eq!(std::fs::read(mp.join("hello")).unwrap(), b"world");
    // statfs reflects the options.
    let df = Command::new("df").arg("-k").arg(mp).output().unwrap();
    assert!(
        String::from_utf8_lossy(&df.stdout).contains("8192"),
        "{}",
        String::from_utf8_lossy(&df.stdout)
    );
    let st = lanefs(&["stats", "--json", mp.to_str().unwrap()]);
    assert!(st.status.success(), "{}", stderr(&st));
    let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    // Through the mount the kernel creates regular files with MKNOD (no-open mode).
    assert!(v["ops"]["mknod"].as_u64().unwrap() >= 1, "{v}");
    assert!(v["locks"]["stripe"]["acquired"].as_u64().unwrap() >= 1);
    let human = lanefs(&["stats", mp.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&human.stdout).contains("mknod"));
    // Mounting again on the same directory is refused with a clear message.
    let again = lanefs(&["mount", "--background", mp.to_str().unwrap()]);
    assert!(!again.status.success());
    assert!(
        stderr(&again).contains("already mounted"),
        "{}",
        stderr(&again)
    );
    unmount(mp);
    // The server exits (and removes its control socket) right after the unmount.
    let mut gone = lanefs(&["stats", mp.to_str().unwrap()]);
    for _ in 0..100 {
        if !gone.status.success() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
        gone = lanefs(&["stats", mp.to_str().unwrap()]);
    }
    assert!(!gone.status.success());
    assert!(
        stderr(&gone).contains("no running lanefs mount"),
        "{}",
        stderr(&gone)
    );
}

#[test]
fn clear_errors_for_bad_mountpoints_and_options() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let o = lanefs(&["mount", missing.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("does not exist"), "{}", stderr(&o));
    let file = dir.path().join("file");
    std::fs::write(&file, b"").unwrap();
    let o = lanefs(&["mount", file.to_str().unwrap()]);
    assert!(stderr(&o).contains("not a directory"), "{}", stderr(&o));
    let o = lanefs(&["mount", "-o", "bogus", dir.path().to_str().unwrap()]);
    assert!(
        stderr(&o).contains("unknown mount option 'bogus'"),
        "{}",
        stderr(&o)
    );
    let o = lanefs(&[
        "mount",
        "--store",
        "/var/lib/x",
        dir.path().to_str().unwrap(),
    ]);
    assert!(
        stderr(&o).contains("only the memory store"),
        "{}",
        stderr(&o)
    );
    assert_eq!(stderr(&o).lines().count(), 1, "one line: {}", stderr(&o));
}

/// `mount -t fuse.lanefs memory DIR -o ...` makes mount.fuse3 run `lanefs memory DIR -o ...`
/// (with `lanefs` found in the system's PATH). The test uses mount.fuse3's explicit form,
/// `mount -t fuse /path/to/lanefs#memory DIR`, which runs the same command line without
/// installing the binary.
#[test]
fn mount_through_mount_fuse3() {
    if !needs_root("mount_through_mount_fuse3") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path();
    let out = Command::new("mount")
        .args(["-t", "fuse", "-o", "size=4m,allow_other,locking=dirlock"])
        .arg(format!("{BIN}#memory"))
        .arg(mp)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mount -t fuse.lanefs (needs mount.fuse3 from fuse3, which scripts/test.sh installs): {}",
        stderr(&out)
    );
    assert!(mounted(mp));
    std::fs::create_dir(mp.join("d")).unwrap();
    let st = lanefs(&["stats", "--json", mp.to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    assert_eq!(v["locking"], "dirlock");
    unmount(mp);
    // The helper form directly, as fstab's mount.fuse3 line runs it.
    let out = lanefs(&["memory", mp.to_str().unwrap(), "-o", "ro"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let e = std::fs::create_dir(mp.join("x")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));
    unmount(mp);
}

#[test]
fn foreground_mount_ends_on_sigterm() {
    if !can_mount("foreground_mount_ends_on_sigterm") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path().to_path_buf();
    let mut child = Command::new(BIN)
        .args(["mount", mp.to_str().unwrap()])
        .spawn()
        .unwrap();
    for _ in 0..200 {
        if mounted(&mp) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(mounted(&mp));
    std::fs::write(mp.join("f"), b"x").unwrap();
    // SAFETY: sending a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(status.success(), "exit status {status:?}");
    assert!(!mounted(&mp), "unmounted on SIGTERM");
}

#[test]
fn help_names_every_command() {
    let o = lanefs(&["--help"]);
    let s = String::from_utf8_lossy(&o.stdout);
    for c in ["mount", "stats", "bench"] {
        assert!(s.contains(c), "{s}");
    }
    let o = lanefs(&["bench", "nonsense"]);
    assert!(
        stderr(&o).contains("unknown workload 'nonsense'"),
        "{}",
        stderr(&o)
    );
}

/// A mount whose server was killed leaves a dead FUSE mount behind; mounting there again says
/// so and how to detach it, instead of "Transport endpoint is not connected".
#[test]
fn mounting_over_a_dead_server_says_how_to_detach_it() {
    if !can_mount("mounting_over_a_dead_server_says_how_to_detach_it") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path();
    let mut server = Command::new(BIN)
        .args(["mount", mp.to_str().unwrap()])
        .spawn()
        .unwrap();
    for _ in 0..200 {
        if mounted(mp) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(mounted(mp));
    server.kill().unwrap();
    server.wait().unwrap();
    let again = lanefs(&["mount", "--background", mp.to_str().unwrap()]);
    assert!(!again.status.success());
    let msg = stderr(&again);
    assert!(
        msg.contains("server has exited") && msg.contains("fusermount3 -u"),
        "{msg}"
    );
    assert_eq!(msg.trim_end().lines().count(), 1, "one line: {msg}");
    unmount(mp);
}
