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
    ($name:expr, $ty:ty) => {{
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

/// The C name of the Rust function `$name` as a `&'static CStr` (the C library's function of
/// the same name is what an interposed function passes a call on to).
macro_rules! c_name {
    ($name:ident) => {{
        const NAME: &std::ffi::CStr = match std::ffi::CStr::from_bytes_with_nul(
            concat!(stringify!($name), "\0").as_bytes(),
        ) {
            Ok(n) => n,
            Err(_) => panic!("a C name"),
        };
        NAME
    }};
}
pub(crate) use c_name;

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

/// Room for a path read from the program ([`read_cstr`]): `PATH_MAX` bytes, not zeroed.
pub(crate) type PathBuf = std::mem::MaybeUninit<[u8; PATH_MAX]>;

/// A fresh [`PathBuf`] (uninitialised: [`read_cstr`] exposes only the bytes it wrote).
pub(crate) const fn path_buf() -> PathBuf {
    std::mem::MaybeUninit::uninit()
}

/// Copies the C string at `p` into `buf` and returns it (without its NUL). None for a null
/// pointer, an address the program has not mapped (the call then goes to the kernel, which
/// answers EFAULT as the program expects) and a string of [`PATH_MAX`] bytes or more (the
/// kernel's ENAMETOOLONG). The copy is the one the call uses, so another thread changing
/// the string meanwhile cannot make the path change between uses.
///
/// A string on the calling thread's stack, above its stack pointer, is copied here: that
/// memory is mapped for as long as the frames that own it are live, which they are while
/// they wait for this call ([`stack_end`]). Any other string is copied by the kernel
/// (`process_vm_readv` on this process), which fails instead of faulting where the address
/// is not mapped: the first 256 bytes, and the rest only if the NUL is not among them.
pub(crate) fn read_cstr(p: *const libc::c_char, buf: &mut PathBuf) -> Option<&[u8]> {
    if p.is_null() {
        return None;
    }
    let out = buf.as_mut_ptr().cast::<u8>();
    let addr = p as usize;
    let len = match stack_end(addr) {
        Some(end) => {
            let room = (end - addr).min(PATH_MAX);
            let mut n = 0;
            while n < room {
                // SAFETY: `addr + n` is below `end`, on this thread's live stack (mapped:
                // `stack_end`); a volatile read because another thread may write the
                // program's buffer meanwhile. `out + n` is inside `buf` (n < PATH_MAX).
                unsafe {
                    let b = std::ptr::read_volatile(p.cast::<u8>().add(n));
                    out.add(n).write(b);
                    if b == 0 {
                        break;
                    }
                }
                n += 1;
            }
            if n == PATH_MAX {
                return None;
            }
            if n == room {
                // The stack ends before the string does: let the kernel copy it.
                vm_read_cstr(addr, out)?
            } else {
                n
            }
        }
        None => vm_read_cstr(addr, out)?,
    };
    // SAFETY: the first `len` bytes of `buf` were written above (len < PATH_MAX).
    Some(unsafe { std::slice::from_raw_parts(out, len) })
}

/// The string at `addr` copied by the kernel into `out` (room for [`PATH_MAX`] bytes): its
/// length, or None (unmapped, or [`PATH_MAX`] bytes or more).
fn vm_read_cstr(addr: usize, out: *mut u8) -> Option<usize> {
    let mut got = 0;
    for want in [256, PATH_MAX] {
        let n = vm_read(addr + got, out.wrapping_add(got), want - got)?;
        // SAFETY: the kernel wrote `n` bytes at `out + got`, inside `out`'s PATH_MAX.
        let new = unsafe { std::slice::from_raw_parts(out.add(got), n) };
        if let Some(i) = new.iter().position(|&b| b == 0) {
            return Some(got + i);
        }
        got += n;
        if got < want {
            // The string runs into memory the program has not mapped.
            return None;
        }
    }
    None
}

/// Copies up to `len` bytes at `addr` in this process into `out` through the kernel, which
/// copies whole pieces (split at page boundaries) up to the first it cannot read: the bytes
/// copied, None if none could be.
fn vm_read(addr: usize, out: *mut u8, len: usize) -> Option<usize> {
    let page = 4096;
    let first = (page - addr % page).min(len);
    let local = libc::iovec {
        iov_base: out.cast(),
        iov_len: len,
    };
    let remote = [
        libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: first,
        },
        libc::iovec {
            iov_base: addr.wrapping_add(first) as *mut libc::c_void,
            iov_len: len - first,
        },
    ];
    // No second piece past the end of the address space (the kernel faults the first).
    let pieces = if first < len && addr.checked_add(len).is_some() {
        2
    } else {
        1
    };
    // SAFETY: the kernel writes at most `len` bytes at `out` (the caller's room) and reads
    // our own memory with fault checking.
    let n = unsafe { libc::process_vm_readv(pid(), &local, 1, remote.as_ptr(), pieces, 0) };
    (n > 0).then_some(n as usize)
}

std::thread_local! {
    // This thread's stack: (lowest address, end), (0, 0) before it is asked, (0, 1) while
    // it is being asked (a call the asking makes reads its strings through the kernel) or
    // if it cannot be told.
    static STACK: std::cell::Cell<(usize, usize)> = const { std::cell::Cell::new((0, 0)) };
}

/// Where this thread's stack ends, if `addr` is on it above the current stack pointer: the
/// bytes from `addr` to there are mapped for as long as the caller's frames are live (a
/// thread's stack is mapped from its stack pointer up, the main thread's included, whose
/// stack grows down on demand). None otherwise (the heap, static data, a signal handler's
/// alternate stack elsewhere, a thread whose stack cannot be told).
fn stack_end(addr: usize) -> Option<usize> {
    let here = 0u8;
    let sp = std::ptr::from_ref(&here) as usize;
    let (lo, end) = match STACK.get() {
        (0, 0) => {
            STACK.set((0, 1));
            let s = ask_stack().unwrap_or((0, 1));
            STACK.set(s);
            s
        }
        s => s,
    };
    (lo <= sp && sp <= addr && addr < end).then_some(end)
}

/// This thread's stack as `pthread_getattr_np` tells it: (lowest address, end).
fn ask_stack() -> Option<(usize, usize)> {
    let mut attr = std::mem::MaybeUninit::<libc::pthread_attr_t>::uninit();
    // SAFETY: pthread_getattr_np initialises `attr` on success, which is checked.
    if unsafe { libc::pthread_getattr_np(libc::pthread_self(), attr.as_mut_ptr()) } != 0 {
        return None;
    }
    let (mut base, mut size) = (std::ptr::null_mut(), 0usize);
    // SAFETY: `attr` was initialised above; the out-pointers are valid.
    let r = unsafe { libc::pthread_attr_getstack(attr.as_ptr(), &mut base, &mut size) };
    // SAFETY: `attr` was initialised above and is destroyed once.
    unsafe { libc::pthread_attr_destroy(attr.as_mut_ptr()) };
    let lo = base as usize;
    (r == 0 && size > 0).then(|| (lo, lo.saturating_add(size)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(p: *const u8) -> Option<Vec<u8>> {
        let mut b = path_buf();
        read_cstr(p.cast(), &mut b).map(<[u8]>::to_vec)
    }

    /// `pages` fresh pages, the last `none` of them unreadable.
    fn pages(pages: usize, none: usize) -> &'static mut [u8] {
        let len = pages * 4096;
        // SAFETY: a fresh anonymous mapping; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let readable = (pages - none) * 4096;
        // SAFETY: the tail of the mapping made above.
        let r = unsafe { libc::mprotect(p.cast::<u8>().add(readable).cast(), len - readable, 0) };
        assert_eq!(r, 0);
        // SAFETY: the readable part of the mapping, leaked for the test's length.
        unsafe { std::slice::from_raw_parts_mut(p.cast(), readable) }
    }

    #[test]
    fn a_string_on_the_stack_is_read_here() {
        let s = *b"/mnt/lanefs/a/b\0";
        assert!(stack_end(s.as_ptr() as usize).is_some());
        assert_eq!(read(s.as_ptr()).unwrap(), b"/mnt/lanefs/a/b");
    }

    #[test]
    fn a_string_elsewhere_is_read_by_the_kernel() {
        let short = b"/a/b\0".to_vec();
        assert!(stack_end(short.as_ptr() as usize).is_none());
        assert_eq!(read(short.as_ptr()).unwrap(), b"/a/b");
        // Past the first 256 bytes, and the longest path there is.
        for n in [255, 256, 257, 1000, PATH_MAX - 1] {
            let mut long = vec![b'x'; n];
            long.push(0);
            assert_eq!(read(long.as_ptr()).unwrap().len(), n, "{n} bytes");
        }
        let mut too_long = vec![b'x'; PATH_MAX];
        too_long.push(0);
        assert_eq!(read(too_long.as_ptr()), None);
    }

    #[test]
    fn unmapped_memory_is_refused_not_touched() {
        assert_eq!(read(std::ptr::null()), None);
        let none = pages(1, 1);
        assert_eq!(read(none.as_ptr()), None);
        // A string that runs from a readable page into an unreadable one, within the first
        // 256 bytes and after them.
        let half = pages(2, 1);
        for tail in [10, 300, 4096] {
            let at = half.len() - tail;
            half[at..].fill(b'y');
            assert_eq!(
                read(half[at..].as_ptr()),
                None,
                "{tail} bytes before the hole"
            );
        }
        // One that ends just before the hole is read whole.
        let end = half.len() - 1;
        half[end] = 0;
        assert_eq!(read(half[end - 20..].as_ptr()).unwrap(), vec![b'y'; 20]);
    }

    #[test]
    fn a_stack_string_is_read_on_another_thread_too() {
        std::thread::spawn(|| {
            let s = *b"rel/ative\0";
            assert!(stack_end(s.as_ptr() as usize).is_some());
            assert_eq!(read(s.as_ptr()).unwrap(), b"rel/ative");
        })
        .join()
        .unwrap();
    }
}
