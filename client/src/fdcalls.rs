//! The C library's functions that take a descriptor: each settles a deferred descriptor
//! (`fds.rs`) before the C library's own function runs, so that it acts on the file the
//! program opened and not on the placeholder. `close` and its kin forget one instead; the
//! process-wide changes (`fork`, the `exec` family, `posix_spawn`, `system`, `popen`, and
//! `sendmsg`, which can pass descriptors to another process) settle them all first.
//!
//! A process with no deferred descriptor pays one atomic load per call here.

use std::ffi::{c_char, c_int, c_uint, c_ulong, c_void};

use crate::calls::settled;
use crate::fds::{closing, closing_range, settle, settle_all};
use crate::real::{c_name, real, set_errno};

/// Defines interposed functions of the form `fn NAME(ARGS) -> RET, fd FD, fail F;`: settle
/// descriptor `FD` (`F`: what to return, errno set, if that fails), then call the C
/// library's `NAME`. `all` instead of `fd FD` settles every deferred descriptor, `aio CB`
/// the descriptor of the `aiocb` `CB`.
macro_rules! settling {
    ($($(#[doc = $doc:literal])* fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty,
        $how:ident $($fd:ident)?, fail $fail:expr;)*) => {$(
        $(#[doc = $doc])*
        ///
        /// # Safety
        /// As the C library's function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            settling!(@settle $how $($fd)?, $fail);
            type F = unsafe extern "C" fn($($ty),*) -> $ret;
            const NAME: &std::ffi::CStr = c_name!($name);
            // SAFETY: the C library's own function with the caller's arguments.
            unsafe { real!(NAME, F)($($arg),*) }
        }
    )*};
    (@settle fd $fd:ident, $fail:expr) => {
        if let Err(e) = settle($fd) {
            set_errno(e);
            #[allow(clippy::redundant_closure_call)]
            return ($fail)(e);
        }
    };
    (@settle all, $fail:expr) => {
        settle_all();
    };
    (@settle aio $cb:ident, $fail:expr) => {
        // SAFETY: `$cb` points to the caller's aiocb (the C function's contract).
        if let Some(fd) = unsafe { $cb.as_ref() }.map(|c| c.aio_fildes) {
            settling!(@settle fd fd, $fail);
        }
    };
}

type Off = libc::off_t;
type Off64 = libc::off64_t;
type Iov = *const libc::iovec;

fn minus_one<T: From<i8>>(_: i32) -> T {
    T::from(-1)
}

settling! {
    /// Interposed: `read` (settles a deferred descriptor).
    fn read(fd: c_int, buf: *mut c_void, n: usize) -> isize, fd fd, fail minus_one;
    /// Interposed: `write`.
    fn write(fd: c_int, buf: *const c_void, n: usize) -> isize, fd fd, fail minus_one;
    /// Interposed: `pread`.
    fn pread(fd: c_int, buf: *mut c_void, n: usize, off: Off) -> isize, fd fd, fail minus_one;
    /// Interposed: `pread64`.
    fn pread64(fd: c_int, buf: *mut c_void, n: usize, off: Off64) -> isize, fd fd, fail minus_one;
    /// Interposed: `pwrite`.
    fn pwrite(fd: c_int, buf: *const c_void, n: usize, off: Off) -> isize, fd fd, fail minus_one;
    /// Interposed: `pwrite64`.
    fn pwrite64(fd: c_int, buf: *const c_void, n: usize, off: Off64) -> isize, fd fd,
        fail minus_one;
    /// Interposed: `__read_chk` (`read` built with `_FORTIFY_SOURCE`).
    fn __read_chk(fd: c_int, buf: *mut c_void, n: usize, len: usize) -> isize, fd fd,
        fail minus_one;
    /// Interposed: `__pread_chk`.
    fn __pread_chk(fd: c_int, buf: *mut c_void, n: usize, off: Off, len: usize) -> isize, fd fd,
        fail minus_one;
    /// Interposed: `__pread64_chk`.
    fn __pread64_chk(fd: c_int, buf: *mut c_void, n: usize, off: Off64, len: usize) -> isize,
        fd fd, fail minus_one;
    /// Interposed: `readv`.
    fn readv(fd: c_int, iov: Iov, n: c_int) -> isize, fd fd, fail minus_one;
    /// Interposed: `writev`.
    fn writev(fd: c_int, iov: Iov, n: c_int) -> isize, fd fd, fail minus_one;
    /// Interposed: `preadv`.
    fn preadv(fd: c_int, iov: Iov, n: c_int, off: Off) -> isize, fd fd, fail minus_one;
    /// Interposed: `preadv64`.
    fn preadv64(fd: c_int, iov: Iov, n: c_int, off: Off64) -> isize, fd fd, fail minus_one;
    /// Interposed: `pwritev`.
    fn pwritev(fd: c_int, iov: Iov, n: c_int, off: Off) -> isize, fd fd, fail minus_one;
    /// Interposed: `pwritev64`.
    fn pwritev64(fd: c_int, iov: Iov, n: c_int, off: Off64) -> isize, fd fd, fail minus_one;
    /// Interposed: `preadv2`.
    fn preadv2(fd: c_int, iov: Iov, n: c_int, off: Off, f: c_int) -> isize, fd fd,
        fail minus_one;
    /// Interposed: `preadv64v2`.
    fn preadv64v2(fd: c_int, iov: Iov, n: c_int, off: Off64, f: c_int) -> isize, fd fd,
        fail minus_one;
    /// Interposed: `pwritev2`.
    fn pwritev2(fd: c_int, iov: Iov, n: c_int, off: Off, f: c_int) -> isize, fd fd,
        fail minus_one;
    /// Interposed: `pwritev64v2`.
    fn pwritev64v2(fd: c_int, iov: Iov, n: c_int, off: Off64, f: c_int) -> isize, fd fd,
        fail minus_one;
    /// Interposed: `lseek`.
    fn lseek(fd: c_int, off: Off, whence: c_int) -> Off, fd fd, fail minus_one;
    /// Interposed: `lseek64`.
    fn lseek64(fd: c_int, off: Off64, whence: c_int) -> Off64, fd fd, fail minus_one;
    /// Interposed: `fstat`.
    fn fstat(fd: c_int, buf: *mut libc::stat) -> c_int, fd fd, fail minus_one;
    /// Interposed: `fstat64`.
    fn fstat64(fd: c_int, buf: *mut libc::stat64) -> c_int, fd fd, fail minus_one;
    /// Interposed: glibc's versioned `fstat` (older binaries).
    fn __fxstat(ver: c_int, fd: c_int, buf: *mut libc::stat) -> c_int, fd fd, fail minus_one;
    /// Interposed: `__fxstat64`.
    fn __fxstat64(ver: c_int, fd: c_int, buf: *mut libc::stat64) -> c_int, fd fd,
        fail minus_one;
    /// Interposed: `fstatfs`.
    fn fstatfs(fd: c_int, buf: *mut libc::statfs) -> c_int, fd fd, fail minus_one;
    /// Interposed: `fstatfs64`.
    fn fstatfs64(fd: c_int, buf: *mut libc::statfs64) -> c_int, fd fd, fail minus_one;
    /// Interposed: `fstatvfs`.
    fn fstatvfs(fd: c_int, buf: *mut libc::statvfs) -> c_int, fd fd, fail minus_one;
    /// Interposed: `fstatvfs64`.
    fn fstatvfs64(fd: c_int, buf: *mut libc::statvfs64) -> c_int, fd fd, fail minus_one;
    /// Interposed: `syncfs`.
    fn syncfs(fd: c_int) -> c_int, fd fd, fail minus_one;
    /// Interposed: `ftruncate`.
    fn ftruncate(fd: c_int, len: Off) -> c_int, fd fd, fail minus_one;
    /// Interposed: `ftruncate64`.
    fn ftruncate64(fd: c_int, len: Off64) -> c_int, fd fd, fail minus_one;
    /// Interposed: `fchmod`.
    fn fchmod(fd: c_int, mode: libc::mode_t) -> c_int, fd fd, fail minus_one;
    /// Interposed: `fchown`.
    fn fchown(fd: c_int, uid: libc::uid_t, gid: libc::gid_t) -> c_int, fd fd, fail minus_one;
    /// Interposed: `futimens`.
    fn futimens(fd: c_int, t: *const libc::timespec) -> c_int, fd fd, fail minus_one;
    /// Interposed: `futimes`.
    fn futimes(fd: c_int, t: *const libc::timeval) -> c_int, fd fd, fail minus_one;
    /// Interposed: `ioctl`.
    fn ioctl(fd: c_int, req: c_ulong, arg: c_ulong) -> c_int, fd fd, fail minus_one;
    /// Interposed: `flock`.
    fn flock(fd: c_int, op: c_int) -> c_int, fd fd, fail minus_one;
    /// Interposed: `posix_fadvise` (returns the error number).
    fn posix_fadvise(fd: c_int, off: Off, len: Off, advice: c_int) -> c_int, fd fd,
        fail |e| e;
    /// Interposed: `posix_fadvise64`.
    fn posix_fadvise64(fd: c_int, off: Off64, len: Off64, advice: c_int) -> c_int, fd fd,
        fail |e| e;
    /// Interposed: `posix_fallocate` (returns the error number).
    fn posix_fallocate(fd: c_int, off: Off, len: Off) -> c_int, fd fd, fail |e| e;
    /// Interposed: `posix_fallocate64`.
    fn posix_fallocate64(fd: c_int, off: Off64, len: Off64) -> c_int, fd fd, fail |e| e;
    /// Interposed: `fallocate`.
    fn fallocate(fd: c_int, mode: c_int, off: Off, len: Off) -> c_int, fd fd, fail minus_one;
    /// Interposed: `fallocate64`.
    fn fallocate64(fd: c_int, mode: c_int, off: Off64, len: Off64) -> c_int, fd fd,
        fail minus_one;
    /// Interposed: `readahead`.
    fn readahead(fd: c_int, off: Off64, n: usize) -> isize, fd fd, fail minus_one;
    /// Interposed: `sync_file_range`.
    fn sync_file_range(fd: c_int, off: Off64, n: Off64, flags: c_uint) -> c_int, fd fd,
        fail minus_one;
    /// Interposed: `mmap`.
    fn mmap(a: *mut c_void, n: usize, prot: c_int, fl: c_int, fd: c_int, off: Off) -> *mut c_void,
        fd fd, fail |_| libc::MAP_FAILED;
    /// Interposed: `mmap64`.
    fn mmap64(a: *mut c_void, n: usize, prot: c_int, fl: c_int, fd: c_int, off: Off64)
        -> *mut c_void, fd fd, fail |_| libc::MAP_FAILED;
    /// Interposed: `fdopen`.
    fn fdopen(fd: c_int, mode: *const c_char) -> *mut libc::FILE, fd fd,
        fail |_| std::ptr::null_mut();
    /// Interposed: `fdopendir`.
    fn fdopendir(fd: c_int) -> *mut libc::DIR, fd fd, fail |_| std::ptr::null_mut();
    /// Interposed: `getdents64`.
    fn getdents64(fd: c_int, buf: *mut c_void, n: usize) -> isize, fd fd, fail minus_one;
    /// Interposed: `vdprintf`.
    fn vdprintf(fd: c_int, fmt: *const c_char, ap: *mut c_void) -> c_int, fd fd, fail minus_one;
    /// Interposed: `isatty`.
    fn isatty(fd: c_int) -> c_int, fd fd, fail |_| 0;
    /// Interposed: `dup`.
    fn dup(fd: c_int) -> c_int, fd fd, fail minus_one;
    /// Interposed: `fgetxattr`.
    fn fgetxattr(fd: c_int, name: *const c_char, v: *mut c_void, n: usize) -> isize, fd fd,
        fail minus_one;
    /// Interposed: `fsetxattr`.
    fn fsetxattr(fd: c_int, name: *const c_char, v: *const c_void, n: usize, f: c_int) -> c_int,
        fd fd, fail minus_one;
    /// Interposed: `flistxattr`.
    fn flistxattr(fd: c_int, list: *mut c_char, n: usize) -> isize, fd fd, fail minus_one;
    /// Interposed: `fremovexattr`.
    fn fremovexattr(fd: c_int, name: *const c_char) -> c_int, fd fd, fail minus_one;
    /// Interposed: `faccessat` (a path relative to the descriptor, or `AT_EMPTY_PATH`).
    fn faccessat(fd: c_int, path: *const c_char, mode: c_int, flags: c_int) -> c_int, fd fd,
        fail minus_one;
    /// Interposed: `execve` (every deferred descriptor is settled first).
    fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char)
        -> c_int, all, fail minus_one;
    /// Interposed: `execv`.
    fn execv(path: *const c_char, argv: *const *const c_char) -> c_int, all, fail minus_one;
    /// Interposed: `execvp`.
    fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int, all, fail minus_one;
    /// Interposed: `execvpe`.
    fn execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char)
        -> c_int, all, fail minus_one;
    /// Interposed: `fexecve`.
    fn fexecve(fd: c_int, argv: *const *const c_char, envp: *const *const c_char) -> c_int,
        all, fail minus_one;
    /// Interposed: `posix_spawn`.
    fn posix_spawn(pid: *mut libc::pid_t, path: *const c_char,
        acts: *const libc::posix_spawn_file_actions_t, attr: *const libc::posix_spawnattr_t,
        argv: *const *mut c_char, envp: *const *mut c_char) -> c_int, all, fail |e| e;
    /// Interposed: `posix_spawnp`.
    fn posix_spawnp(pid: *mut libc::pid_t, file: *const c_char,
        acts: *const libc::posix_spawn_file_actions_t, attr: *const libc::posix_spawnattr_t,
        argv: *const *mut c_char, envp: *const *mut c_char) -> c_int, all, fail |e| e;
    /// Interposed: `system`.
    fn system(cmd: *const c_char) -> c_int, all, fail minus_one;
    /// Interposed: `popen`.
    fn popen(cmd: *const c_char, mode: *const c_char) -> *mut libc::FILE, all,
        fail |_| std::ptr::null_mut();
    /// Interposed: `sendmsg` (which may pass descriptors to another process).
    fn sendmsg(sock: c_int, msg: *const libc::msghdr, flags: c_int) -> isize, all,
        fail minus_one;
    /// Interposed: `sendmmsg`.
    fn sendmmsg(sock: c_int, msgs: *mut libc::mmsghdr, n: c_uint, flags: c_int) -> c_int, all,
        fail minus_one;
    /// Interposed: `execveat`.
    fn execveat(fd: c_int, path: *const c_char, argv: *const *const c_char,
        envp: *const *const c_char, flags: c_int) -> c_int, all, fail minus_one;
    /// Interposed: `epoll_ctl` (the descriptor watched).
    fn epoll_ctl(ep: c_int, op: c_int, fd: c_int, ev: *mut libc::epoll_event) -> c_int, fd fd,
        fail minus_one;
    /// Interposed: `tcgetattr`.
    fn tcgetattr(fd: c_int, t: *mut libc::termios) -> c_int, fd fd, fail minus_one;
    /// Interposed: `ttyname`.
    fn ttyname(fd: c_int) -> *mut c_char, fd fd, fail |_| std::ptr::null_mut();
    /// Interposed: `ttyname_r` (returns the error number).
    fn ttyname_r(fd: c_int, buf: *mut c_char, n: usize) -> c_int, fd fd, fail |e| e;
    /// Interposed: `futimesat` (the directory descriptor, or the file with a null path).
    fn futimesat(fd: c_int, path: *const c_char, t: *const libc::timeval) -> c_int, fd fd,
        fail minus_one;
    /// Interposed: `name_to_handle_at`.
    fn name_to_handle_at(fd: c_int, path: *const c_char, h: *mut c_void, mnt: *mut c_int,
        flags: c_int) -> c_int, fd fd, fail minus_one;
    /// Interposed: `aio_read` (the request's descriptor).
    fn aio_read(cb: *mut libc::aiocb) -> c_int, aio cb, fail minus_one;
    /// Interposed: `aio_write`.
    fn aio_write(cb: *mut libc::aiocb) -> c_int, aio cb, fail minus_one;
    /// Interposed: `aio_fsync`.
    fn aio_fsync(op: c_int, cb: *mut libc::aiocb) -> c_int, aio cb, fail minus_one;
    /// Interposed: `aio_read64`.
    fn aio_read64(cb: *mut libc::aiocb) -> c_int, aio cb, fail minus_one;
    /// Interposed: `aio_write64`.
    fn aio_write64(cb: *mut libc::aiocb) -> c_int, aio cb, fail minus_one;
    /// Interposed: `aio_fsync64`.
    fn aio_fsync64(op: c_int, cb: *mut libc::aiocb) -> c_int, aio cb, fail minus_one;
    /// Interposed: `lio_listio` (every deferred descriptor settled).
    fn lio_listio(mode: c_int, list: *const *mut libc::aiocb, n: c_int, ev: *mut libc::sigevent)
        -> c_int, all, fail minus_one;
    /// Interposed: `lio_listio64`.
    fn lio_listio64(mode: c_int, list: *const *mut libc::aiocb, n: c_int,
        ev: *mut libc::sigevent) -> c_int, all, fail minus_one;
}

macro_rules! export_sendfile {
    ($name:ident, $off:ty) => {
        /// Interposed: `sendfile`/`sendfile64` (both descriptors settled).
        ///
        /// # Safety
        /// As the C library's function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(out: c_int, fd: c_int, off: *mut $off, n: usize) -> isize {
            if !settled(out) || !settled(fd) {
                return -1;
            }
            type F = unsafe extern "C" fn(c_int, c_int, *mut $off, usize) -> isize;
            const NAME: &std::ffi::CStr = c_name!($name);
            // SAFETY: the C library's own function with the caller's arguments.
            unsafe { real!(NAME, F)(out, fd, off, n) }
        }
    };
}
export_sendfile!(sendfile, Off);
export_sendfile!(sendfile64, Off64);

macro_rules! export_poll {
    ($name:ident, ($($a:ident: $t:ty),*)) => {
        /// Interposed: `poll`/`ppoll` (every descriptor polled is settled).
        ///
        /// # Safety
        /// As the C library's function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(fds: *mut libc::pollfd, n: libc::nfds_t $(, $a: $t)*)
            -> c_int {
            if crate::fds::any() && !fds.is_null() {
                for i in 0..n as usize {
                    // SAFETY: `fds` holds `n` pollfds (the caller's contract).
                    let _ = settle(unsafe { (*fds.add(i)).fd });
                }
            }
            type F = unsafe extern "C" fn(*mut libc::pollfd, libc::nfds_t $(, $t)*) -> c_int;
            const NAME: &std::ffi::CStr = c_name!($name);
            // SAFETY: the C library's own function with the caller's arguments.
            unsafe { real!(NAME, F)(fds, n $(, $a)*) }
        }
    };
}
export_poll!(poll, (timeout: c_int));
export_poll!(ppoll, (t: *const libc::timespec, mask: *const libc::sigset_t));
export_poll!(__poll_chk, (timeout: c_int, len: usize));
export_poll!(__ppoll_chk, (t: *const libc::timespec, mask: *const libc::sigset_t, len: usize));

/// Interposed: `close` (a deferred descriptor is deferred no longer once closed).
///
/// # Safety
/// As the C library's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    type F = unsafe extern "C" fn(c_int) -> c_int;
    // SAFETY: the C library's own function with the caller's arguments.
    closing(fd, || unsafe { real!(c"close", F)(fd) }, |&r| r == 0)
}

/// Interposed: `close_range`.
///
/// # Safety
/// As the C library's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    type F = unsafe extern "C" fn(c_uint, c_uint, c_int) -> c_int;
    let cloexec = flags & libc::CLOSE_RANGE_CLOEXEC as c_int != 0;
    closing_range(
        first,
        last,
        cloexec,
        // SAFETY: the C library's own function with the caller's arguments.
        || unsafe { real!(c"close_range", F)(first, last, flags) },
        |&r| r == 0,
    )
}

/// Interposed: `closefrom`.
///
/// # Safety
/// As the C library's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn closefrom(first: c_int) {
    type F = unsafe extern "C" fn(c_int);
    closing_range(
        first.max(0) as c_uint,
        c_uint::MAX,
        false,
        // SAFETY: the C library's own function with the caller's arguments.
        || unsafe { real!(c"closefrom", F)(first) },
        |_| true,
    )
}

macro_rules! export_dup2 {
    ($name:ident, ($($a:ident: $t:ty),*)) => {
        /// Interposed: `dup2`/`dup3` (the source is settled; a deferred target, which the
        /// call closes, is deferred no longer once it succeeded).
        ///
        /// # Safety
        /// As the C library's function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(old: c_int, new: c_int $(, $a: $t)*) -> c_int {
            if let Err(e) = settle(old) {
                set_errno(e);
                return -1;
            }
            type F = unsafe extern "C" fn(c_int, c_int $(, $t)*) -> c_int;
            const NAME: &std::ffi::CStr = c_name!($name);
            // SAFETY: the C library's own function with the caller's arguments.
            let call = || unsafe { real!(NAME, F)(old, new $(, $a)*) };
            if new == old {
                return call();
            }
            closing(new, call, |&r| r == new)
        }
    };
}
export_dup2!(dup2, ());
export_dup2!(dup3, (flags: c_int));

macro_rules! export_two_fds {
    ($name:ident) => {
        /// Interposed: `copy_file_range`/`splice` (both descriptors settled).
        ///
        /// # Safety
        /// As the C library's function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            fd_in: c_int,
            off_in: *mut Off64,
            fd_out: c_int,
            off_out: *mut Off64,
            n: usize,
            flags: c_uint,
        ) -> isize {
            if !settled(fd_in) || !settled(fd_out) {
                return -1;
            }
            type F =
                unsafe extern "C" fn(c_int, *mut Off64, c_int, *mut Off64, usize, c_uint) -> isize;
            // SAFETY: the C library's own function with the caller's arguments.
            unsafe { real!(c_name!($name), F)(fd_in, off_in, fd_out, off_out, n, flags) }
        }
    };
}
export_two_fds!(copy_file_range);
export_two_fds!(splice);

macro_rules! export_fsync {
    ($name:ident, $sym:literal, $datasync:expr) => {
        /// Interposed: `fsync`/`fdatasync`: of a deferred descriptor, over the channel
        /// (`fds.rs`); otherwise the C library's.
        ///
        /// # Safety
        /// As the C library's function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int) -> c_int {
            let mut buf = [0; crate::fds::PATH_ROOM];
            if let Some(made) = crate::fds::deferred(fd, &mut buf) {
                match crate::calls::fsync_deferred(&made, $datasync) {
                    Some(Ok(_)) => return 0,
                    Some(Err(e)) => {
                        set_errno(e);
                        return -1;
                    }
                    None => {}
                }
            }
            if let Err(e) = settle(fd) {
                set_errno(e);
                return -1;
            }
            type F = unsafe extern "C" fn(c_int) -> c_int;
            // SAFETY: the C library's own function with the caller's arguments.
            unsafe { real!($sym, F)(fd) }
        }
    };
}
export_fsync!(fsync, c"fsync", false);
export_fsync!(fdatasync, c"fdatasync", true);

macro_rules! export_locking {
    ($name:ident, ($($a:ident: $t:ty),*), $locks:expr) => {
        /// Interposed: `fcntl`/`lockf` (settles the descriptor; a record lock settles every
        /// deferred descriptor first and ends deferral in this process, `fds.rs`).
        ///
        /// # Safety
        /// As the C library's function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int, cmd: c_int $(, $a: $t)*) -> c_int {
            if $locks(cmd) {
                crate::fds::record_locks();
            }
            if !settled(fd) {
                return -1;
            }
            type F = unsafe extern "C" fn(c_int, c_int $(, $t)*) -> c_int;
            // SAFETY: the C library's own function with the caller's arguments.
            unsafe { real!(c_name!($name), F)(fd, cmd $(, $a)*) }
        }
    };
}

/// Whether `fcntl` command `cmd` takes a POSIX record lock.
fn fcntl_locks(cmd: c_int) -> bool {
    matches!(cmd, libc::F_SETLK | libc::F_SETLKW)
}

export_locking!(fcntl, (arg: c_ulong), fcntl_locks);
export_locking!(fcntl64, (arg: c_ulong), fcntl_locks);
export_locking!(lockf, (len: Off), |cmd| cmd != libc::F_TEST);
export_locking!(lockf64, (len: Off64), |cmd| cmd != libc::F_TEST);

/// Defines interposed functions on a path, `fn NAME(ARGS) -> RET, fail F;` whose first
/// argument is the path: a path `/proc/self/fd/N` (or `/dev/fd/N`) of a deferred descriptor
/// is settled first, then the C library's `NAME` runs (`F`: what to return, errno set, if
/// the settling fails).
macro_rules! proc_paths {
    ($($(#[doc = $doc:literal])* fn $name:ident(path: *const c_char $(, $a:ident: $t:ty)*) -> $ret:ty,
        fail $fail:expr;)*) => {$(
        $(#[doc = $doc])*
        ///
        /// # Safety
        /// As the C library's function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(path: *const c_char $(, $a: $t)*) -> $ret {
            // SAFETY: the C function's contract.
            if !unsafe { crate::calls::proc_fd_settled(path) } {
                return $fail;
            }
            type F = unsafe extern "C" fn(*const c_char $(, $t)*) -> $ret;
            // SAFETY: the C library's own function with the caller's arguments.
            unsafe { real!(c_name!($name), F)(path $(, $a)*) }
        }
    )*};
}

proc_paths! {
    /// Interposed: `truncate` (a `/proc/self/fd/N` path of a deferred descriptor settled).
    fn truncate(path: *const c_char, len: Off) -> c_int, fail -1;
    /// Interposed: `truncate64`.
    fn truncate64(path: *const c_char, len: Off64) -> c_int, fail -1;
    /// Interposed: `utime`.
    fn utime(path: *const c_char, t: *const libc::utimbuf) -> c_int, fail -1;
    /// Interposed: `utimes`.
    fn utimes(path: *const c_char, t: *const libc::timeval) -> c_int, fail -1;
    /// Interposed: `lutimes`.
    fn lutimes(path: *const c_char, t: *const libc::timeval) -> c_int, fail -1;
    /// Interposed: `access`.
    fn access(path: *const c_char, mode: c_int) -> c_int, fail -1;
    /// Interposed: `euidaccess`.
    fn euidaccess(path: *const c_char, mode: c_int) -> c_int, fail -1;
    /// Interposed: `eaccess`.
    fn eaccess(path: *const c_char, mode: c_int) -> c_int, fail -1;
    /// Interposed: `setxattr`.
    fn setxattr(path: *const c_char, name: *const c_char, v: *const c_void, n: usize, f: c_int)
        -> c_int, fail -1;
    /// Interposed: `lsetxattr`.
    fn lsetxattr(path: *const c_char, name: *const c_char, v: *const c_void, n: usize, f: c_int)
        -> c_int, fail -1;
    /// Interposed: `getxattr`.
    fn getxattr(path: *const c_char, name: *const c_char, v: *mut c_void, n: usize) -> isize,
        fail -1;
    /// Interposed: `lgetxattr`.
    fn lgetxattr(path: *const c_char, name: *const c_char, v: *mut c_void, n: usize) -> isize,
        fail -1;
    /// Interposed: `listxattr`.
    fn listxattr(path: *const c_char, list: *mut c_char, n: usize) -> isize, fail -1;
    /// Interposed: `llistxattr`.
    fn llistxattr(path: *const c_char, list: *mut c_char, n: usize) -> isize, fail -1;
    /// Interposed: `removexattr`.
    fn removexattr(path: *const c_char, name: *const c_char) -> c_int, fail -1;
    /// Interposed: `lremovexattr`.
    fn lremovexattr(path: *const c_char, name: *const c_char) -> c_int, fail -1;
}
