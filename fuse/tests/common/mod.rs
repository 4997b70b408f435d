//! What the FUSE server's mount tests share: whether a path is a FUSE mount, waiting for a
//! mount to appear, and an unmount that rides out a brief EBUSY (each test file uses some of
//! these).
#![allow(dead_code)]

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

/// Whether `p` is on a FUSE filesystem (statfs's `f_type` is FUSE's magic number).
pub fn is_fuse(p: &Path) -> bool {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: zeroed statfs is a valid out-buffer; `c` is a valid C string.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::statfs(c.as_ptr(), &mut s) == 0 && s.f_type as i64 == 0x6573_5546 }
}

/// Waits (up to 2 s) until the kernel answers for the mount at `p`; panics if it does not.
pub fn wait_for_mount(p: &Path) {
    for _ in 0..200 {
        if is_fuse(p) {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(is_fuse(p), "mount did not appear");
}

/// Unmounts and waits for the server threads. Tests run in parallel in one process, and a
/// child another test forks holds copies of this test's descriptors until it execs (and a
/// last close may still be on its way), so an unmount can meet a brief EBUSY: retried 100
/// times, `pause` apart.
pub fn unmount_retrying(m: &mut lanefs_fuse::Mount, pause: Duration) -> std::io::Result<()> {
    for _ in 0..100 {
        match m.unmount() {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => std::thread::sleep(pause),
            r => return r,
        }
    }
    m.unmount()
}
