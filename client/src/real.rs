//! The C library's own functions, for the calls this library passes on.
//!
//! This library exports `open`, `stat`, `unlink` and the rest under their libc names, so
//! that the dynamic linker binds a program's calls to it; a call to one of those names from
//! inside this library would bind back to itself. Its own calls therefore go to the next
//! definition in the lookup order (`dlsym(RTLD_NEXT)`, resolved once per name), or, for the
//! few system calls it makes for itself (`getcwd`, `readlinkat`, `fstat`), straight to the
//! kernel with `syscall(2)`, which no one interposes.

use std::ffi::CStr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// The next definition of `name` after this library's, or 0. Cached in `slot`.
pub(crate) fn next(name: &CStr, slot: &AtomicUsize) -> usize {
    let p = slot.load(Relaxed);
    if p != 0 {
        return p;
    }
    // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT is a valid pseudo-handle.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
    slot.store(p, Relaxed);
    p
}

/// The libc function `$name` (a C string literal) as a function pointer of type `$ty`.
/// Aborts if libc has no such function (this library is only ever loaded into programs
/// linked with glibc, which has every one it names).
macro_rules! real {
    ($name:literal, $ty:ty) => {{
        static SLOT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let p = $crate::real::next($name, &SLOT);
        if p == 0 {
            std::process::abort();
        }
        // SAFETY: `p` is the address of the libc function `$name`, whose C signature is `$ty`.
        #[allow(unused_unsafe)]
        let f = unsafe { std::mem::transmute::<usize, $ty>(p) };
        f
    }};
}
pub(crate) use real;

/// Sets `errno`.
pub(crate) fn set_errno(e: i32) {
    // SAFETY: the calling thread's errno location is always valid.
    unsafe { *libc::__errno_location() = e };
}

/// `errno`.
pub(crate) fn errno() -> i32 {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() }
}

/// The system call's result as a Result: the value, or the errno (which is left as the
/// call set it: callers that fall back restore what they need).
pub(crate) fn sys(r: libc::c_long) -> Result<usize, i32> {
    if r < 0 { Err(errno()) } else { Ok(r as usize) }
}

/// `getcwd(2)` into `buf`: the length of the path (without its NUL).
pub(crate) fn getcwd(buf: &mut [u8]) -> Result<usize, i32> {
    // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`.
    let n = sys(unsafe { libc::syscall(libc::SYS_getcwd, buf.as_mut_ptr(), buf.len()) })?;
    // The kernel's length counts the NUL; "(unreachable)" paths do not start with '/'.
    Ok(n.saturating_sub(1))
}

/// `readlinkat(2)` of `path` into `buf`: the target's length.
pub(crate) fn readlink_raw(path: &CStr, buf: &mut [u8]) -> Result<usize, i32> {
    // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`.
    sys(unsafe {
        libc::syscall(
            libc::SYS_readlinkat,
            libc::AT_FDCWD,
            path.as_ptr(),
            buf.as_mut_ptr(),
            buf.len(),
        )
    })
}

/// `fstat(2)` of descriptor `fd`.
pub(crate) fn fd_stat(fd: i32) -> Result<libc::stat, i32> {
    // SAFETY: a zeroed stat is a valid out-buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: the kernel writes one `struct stat`.
    sys(unsafe { libc::syscall(libc::SYS_fstat, fd, &mut st) })?;
    Ok(st)
}

/// The inode number of descriptor `fd`, or 0.
pub(crate) fn fd_ino(fd: i32) -> u64 {
    fd_stat(fd).map_or(0, |st| st.st_ino)
}

/// `close(2)` without going through anyone's `close`.
pub(crate) fn close_raw(fd: i32) {
    // SAFETY: closing a descriptor this library owns.
    unsafe { libc::syscall(libc::SYS_close, fd) };
}

/// This process's id, kept (not asked of the kernel for every path): set at the first use
/// and again in a forked child (`conn.rs` registers the handler when the library loads).
static PID: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

fn pid() -> libc::pid_t {
    let p = PID.load(Relaxed);
    if p != 0 {
        return p;
    }
    // SAFETY: getpid has no preconditions.
    let p = unsafe { libc::getpid() };
    PID.store(p, Relaxed);
    p
}

/// A forked child's process id is its own.
pub(crate) fn forget_pid() {
    PID.store(0, Relaxed);
}

/// `PATH_MAX`: a path of this many bytes or more (its NUL included) is ENAMETOOLONG.
pub(crate) const PATH_MAX: usize = 4096;

/// Copies the C string at `p` into `buf` through the kernel (`process_vm_readv` on this
/// process), which, unlike reading it here, fails instead of faulting where the program
/// passed an address it has not mapped: the call then goes to the kernel, which answers
/// EFAULT as the program expects. None also for a string of [`PATH_MAX`] bytes or more (the
/// kernel's ENAMETOOLONG). The copy is the one the call uses, so another thread changing
/// the string meanwhile cannot make the path change between uses.
pub(crate) fn read_cstr(p: *const libc::c_char, buf: &mut [u8; PATH_MAX]) -> Option<&[u8]> {
    if p.is_null() {
        return None;
    }
    let addr = p as usize;
    let page = 4096;
    let first = (page - addr % page).min(PATH_MAX);
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: PATH_MAX,
    };
    // Two remote pieces split at the page boundary: the kernel copies whole pieces up to
    // the first one it cannot read.
    let remote = [
        libc::iovec {
            iov_base: p as *mut libc::c_void,
            iov_len: first,
        },
        libc::iovec {
            iov_base: addr.wrapping_add(first) as *mut libc::c_void,
            iov_len: PATH_MAX - first,
        },
    ];
    // No second piece past the end of the address space (the kernel faults the first).
    let pieces = if first < PATH_MAX && addr.checked_add(PATH_MAX).is_some() {
        2
    } else {
        1
    };
    // SAFETY: the kernel writes at most PATH_MAX bytes into `buf` and reads our own memory
    // with fault checking.
    let n = unsafe { libc::process_vm_readv(pid(), &local, 1, remote.as_ptr(), pieces, 0) };
    if n <= 0 {
        return None;
    }
    let got = &buf[..n as usize];
    let len = got.iter().position(|&b| b == 0)?;
    Some(&buf[..len])
}
