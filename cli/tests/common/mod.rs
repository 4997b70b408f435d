//! What the `lanefs` binary's tests share: the binary, running it, and whether this process
//! may mount (each test file uses some of these).
#![allow(dead_code)]

use std::ffi::CString;
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
