//! What the `lanefs` binary's tests share: the binary, running it, whether this process
//! may mount, and finding and taking down mounts (each test file uses some of these).
#![allow(dead_code)]

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Command, Output};

/// The `lanefs` binary cargo built for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_lanefs");

/// Runs `lanefs ARGS` to its end.
pub fn lanefs(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run lanefs")
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The line of `/proc/PID/mountinfo` (PID `self` for this process) for the topmost mount at
/// `path`, which must be canonical: it is not looked up on the filesystem (which would wait
/// for a server that does not answer).
pub fn mountinfo_line_at(pid: &str, path: &Path) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .unwrap()
        .lines()
        .rev()
        .find(|l| l.split(' ').nth(4) == Some(path.to_str().unwrap()))
        .map(String::from)
}

/// umount2(2) of `path` with `flags`: its return value (the error in `errno`).
pub fn umount2(path: &Path, flags: i32) -> i32 {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid C string; umount2 has no other preconditions.
    unsafe { libc::umount2(c.as_ptr(), flags) }
}

/// Whether this test can run: as root always; otherwise it says why it skips.
pub fn needs_root(test: &str) -> bool {
    if !is_root() {
        eprintln!("{test}: SKIPPED: needs root (run the tests as root: scripts/test.sh)");
    }
    is_root()
}

/// Whether this process can mount at all (root, or fusermount3 and a usable /dev/fuse);
/// otherwise the test says why it skips.
pub fn can_mount(test: &str) -> bool {
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
