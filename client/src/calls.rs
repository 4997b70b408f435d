//! The libc entry points this library serves: each locates its path(s) (`paths.rs`), makes
//! the call over the channel when they are on a reachable lanefs mount, and otherwise, or
//! when the server answers "not for the channel" (a path leaving the filesystem), calls the
//! C library's own function. `errno` is set on failure and left alone on success.
//!
//! Descriptors are never the channel's: every file is opened through the kernel (a file
//! created here when its descriptor is first used, `fds.rs`), so `read`, `write`, `mmap`,
//! locks, `fork` and `exec` are the kernel's once it is. What goes over the channel is what the kernel serialises or costs a round trip through FUSE:
//! creating names (`open(O_CREAT)`'s create, `mkdir`, `mknod`, `symlink`, `link`), removing
//! and renaming them, `stat` on paths (with `lanefs run --warm-stat`, not for a name the
//! kernel holds: `warm.rs`),
//! `readlink`, and `chmod`/`chown`/`utimensat` on
//! paths. (`truncate` on a path stays the kernel's: only it knows that a file is being
//! executed, ETXTBSY.) `open(O_CREAT)` creates over the channel and returns a deferred
//! descriptor (`fds.rs`), or, with deferral off, opens the new file through the kernel
//! without `O_CREAT` (a lookup, which the kernel runs in parallel). This process's
//! `unlink` and `rename` settle a deferred descriptor of the name's file first.

use std::ffi::{c_char, c_int, c_uint};

use lanefs_channel::{
    ASK_HELD, FATTR_ATIME, FATTR_ATIME_NOW, FATTR_GID, FATTR_MODE, FATTR_MTIME, FATTR_MTIME_NOW,
    FATTR_UID, FOLLOW, FsyncIn, HELD, LinkIn, NOFOLLOW, OP_FSYNC, OP_LINK, OP_MKDIR, OP_MKNOD,
    OP_READLINK, OP_RENAME, OP_RMDIR, OP_SETATTR, OP_STAT, OP_SYMLINK, OP_UNLINK, RenameIn,
    SetattrIn, StatIn, StatOut, decode_dev, fuse_attr, fuse_mkdir_in, fuse_mknod_in,
};
use zerocopy::IntoBytes;

use crate::conn::{Busy, Outcome, call, note_cred_change};
use crate::mounts::Mount;
use crate::paths::{Located, forget_cwd, locate};
use crate::real::{c_name, path_buf, read_cstr, real, set_errno};
use crate::warm;

type CPath = *const c_char;

/// A call's answer as a C return value: 0, or -1 with `errno` set.
fn ret(r: Result<usize, i32>) -> c_int {
    match r {
        Ok(_) => 0,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// Settles `fd` if it is a deferred descriptor (`fds.rs`); false, with errno set, if that
/// failed.
pub(crate) fn settled(fd: c_int) -> bool {
    match crate::fds::settle(fd) {
        Ok(()) => true,
        Err(e) => {
            set_errno(e);
            false
        }
    }
}

/// Settles the descriptor a `/proc/self/fd/N` or `/dev/fd/N` path names, if it is deferred
/// (`fds.rs`); false, with errno set, if that failed.
///
/// # Safety
/// `path` as for [`bytes`].
pub(crate) unsafe fn proc_fd_settled(path: CPath) -> bool {
    if !crate::fds::any() {
        return true;
    }
    let mut pb = path_buf();
    let Some(p) = read_cstr(path, &mut pb) else {
        return true;
    };
    match crate::fds::settle_proc_path(p) {
        Ok(()) => true,
        Err(e) => {
            set_errno(e);
            false
        }
    }
}

/// What the server said, or None if the kernel must be asked (a relative path refused with
/// EACCES included: see `paths.rs`).
fn served(at: &Located<'_>, o: Outcome) -> Option<Result<usize, i32>> {
    match o {
        Outcome::Done(Err(libc::EACCES)) if at.relative => None,
        Outcome::Done(r) => Some(r),
        Outcome::Kernel => None,
    }
}

/// A call on one path, with `before` (a symlink's target) sent ahead of it when given.
///
/// # Safety
/// `path` as for [`bytes`].
#[allow(clippy::too_many_arguments)] // the path, the request and the reply
unsafe fn one(
    dirfd: c_int,
    path: CPath,
    op: u32,
    arg: &[u8],
    before: Option<&[u8]>,
    reply: &mut [u8],
) -> Option<Result<usize, i32>> {
    let mut pb = path_buf();
    let p = read_cstr(path, &mut pb)?;
    one_at(dirfd, p, op, arg, before, reply, None)
}

/// A path through the kernel (the mountpoint and the path from the mount's root, without
/// NUL) and the mount's device number, as [`one_at`] gives them: on the stack, since
/// `open` may be called from a signal handler that interrupted `malloc`.
struct KernelPath {
    buf: [u8; crate::fds::PATH_ROOM],
    /// 0 if the path did not fit.
    len: usize,
    dev: (u32, u32),
}

/// [`one`] on a path already read, which also gives the path through the kernel to
/// `target` when asked.
fn one_at(
    dirfd: c_int,
    p: &[u8],
    op: u32,
    arg: &[u8],
    before: Option<&[u8]>,
    reply: &mut [u8],
    target: Option<&mut KernelPath>,
) -> Option<Result<usize, i32>> {
    let busy = Busy::enter()?;
    let mut buf = std::mem::MaybeUninit::uninit();
    let at = locate(dirfd, p, &mut buf)?;
    if let Some(k) = target {
        let (point, rel) = (&at.mount.point[..], at.rel);
        let len = point.len() + 1 + rel.len();
        if len < k.buf.len() {
            k.buf[..point.len()].copy_from_slice(point);
            k.buf[point.len()] = b'/';
            k.buf[point.len() + 1..len].copy_from_slice(rel);
            k.len = len;
        }
        k.dev = at.mount.dev;
    }
    if op != OP_STAT && op != OP_READLINK && op != OP_SETATTR && at.rel == b"." {
        return None; // the mountpoint: EBUSY, EXDEV at its edge, are the kernel's to say
    }
    if matches!(op, OP_SYMLINK | OP_MKNOD) && p.ends_with(b"/") {
        return None; // EEXIST where something exists, which a walk for a directory misses
    }
    let o = match before {
        None => call(at.mount, op, arg, &[at.rel], reply, &busy),
        Some(b) => call(at.mount, op, arg, &[b, at.rel], reply, &busy),
    };
    let r = served(&at, o);
    if matches!(op, OP_UNLINK | OP_RMDIR) && matches!(r, Some(Ok(_))) && warm::on() {
        warm::forget(at.mount, at.rel);
    }
    r
}

/// A call on two paths, served only when both are on one mount.
///
/// # Safety
/// `p1` and `p2` as for [`bytes`].
unsafe fn two(
    (d1, p1): (c_int, CPath),
    (d2, p2): (c_int, CPath),
    op: u32,
    arg: &[u8],
    reply: &mut [u8],
) -> Option<Result<usize, i32>> {
    let (mut pb1, mut pb2) = (path_buf(), path_buf());
    let (a, b) = (read_cstr(p1, &mut pb1)?, read_cstr(p2, &mut pb2)?);
    let busy = Busy::enter()?;
    let (mut buf1, mut buf2) = (
        std::mem::MaybeUninit::uninit(),
        std::mem::MaybeUninit::uninit(),
    );
    let x = locate(d1, a, &mut buf1)?;
    let y = locate(d2, b, &mut buf2)?;
    // Not across mounts, not of or onto a mountpoint (EBUSY, EXDEV: the kernel's), and not
    // a new name with a trailing slash (EEXIST where something exists: the kernel's).
    let mountpoint = x.rel == b"." || y.rel == b".";
    if !std::ptr::eq::<Mount>(x.mount, y.mount) || mountpoint || op == OP_LINK && b.ends_with(b"/")
    {
        return None;
    }
    let o = call(x.mount, op, arg, &[x.rel, y.rel], reply, &busy);
    if op == OP_RENAME && matches!(o, Outcome::Done(Ok(_))) && warm::on() {
        warm::forget(x.mount, x.rel);
        warm::forget(y.mount, y.rel);
    }
    match o {
        Outcome::Done(Err(libc::EACCES)) if x.relative || y.relative => None,
        Outcome::Done(r) => Some(r),
        Outcome::Kernel => None,
    }
}

// ----- stat -------------------------------------------------------------------------------

/// How [`stat_attr`] asks.
#[derive(Clone, Copy, PartialEq)]
enum Ask {
    /// A program's `stat`: through the kernel for a name it holds, where `warm.rs` is on.
    Program,
    /// A program's `statx` with `AT_STATX_DONT_SYNC`, which the kernel would answer from
    /// attributes it has been told are stale: over the channel.
    Fresh,
    /// This library's own look at what the server has.
    Server,
}

/// `stat` of `path` over the channel: the reply (the attributes, and the birth time) and the
/// mount they are on.
///
/// # Safety
/// `path` as for [`bytes`].
unsafe fn stat_attr(
    dirfd: c_int,
    path: CPath,
    nofollow: bool,
    ask: Ask,
) -> Option<Result<(StatOut, &'static Mount), i32>> {
    let mut pb = path_buf();
    let p = read_cstr(path, &mut pb)?;
    let busy = Busy::enter()?;
    let mut buf = std::mem::MaybeUninit::uninit();
    let at = locate(dirfd, p, &mut buf)?;
    let warm = ask != Ask::Server && warm::on();
    if warm && ask == Ask::Program && warm::held(at.mount, at.rel, nofollow) {
        return None;
    }
    let arg = StatIn {
        flags: if nofollow { NOFOLLOW } else { 0 } | if warm { ASK_HELD } else { 0 },
        padding: 0,
    };
    let mut out = StatOut::default();
    let o = call(
        at.mount,
        OP_STAT,
        arg.as_bytes(),
        &[at.rel],
        out.as_mut_bytes(),
        &busy,
    );
    let r = served(&at, o)?;
    if warm && r.is_ok() {
        warm::note(at.mount, at.rel, nofollow, out.flags & HELD != 0);
    }
    Some(r.map(|_| (out, at.mount)))
}

fn fill_stat(a: &fuse_attr, dev: u64, st: &mut libc::stat) {
    // SAFETY: libc::stat is plain old data; all-zero is a valid value.
    *st = unsafe { std::mem::zeroed() };
    st.st_dev = dev;
    st.st_ino = a.ino;
    st.st_nlink = a.nlink.into();
    st.st_mode = a.mode;
    st.st_uid = a.uid;
    st.st_gid = a.gid;
    st.st_rdev = decode_dev(a.rdev);
    st.st_size = a.size as i64;
    st.st_blksize = if a.blksize == 0 {
        4096
    } else {
        a.blksize.into()
    };
    st.st_blocks = a.blocks as i64;
    st.st_atime = a.atime as i64;
    st.st_atime_nsec = a.atimensec.into();
    st.st_mtime = a.mtime as i64;
    st.st_mtime_nsec = a.mtimensec.into();
    st.st_ctime = a.ctime as i64;
    st.st_ctime_nsec = a.ctimensec.into();
}

/// `stat`-like call: `nofollow` as `lstat`.
///
/// # Safety
/// `path` as for [`bytes`]; `buf` a writable `struct stat`.
unsafe fn do_stat(
    dirfd: c_int,
    path: CPath,
    buf: *mut libc::stat,
    nofollow: bool,
) -> Option<c_int> {
    // SAFETY: the caller's contract.
    let r = unsafe { stat_attr(dirfd, path, nofollow, Ask::Program) }?;
    Some(match r {
        Ok((a, m)) => {
            if buf.is_null() {
                return Some(ret(Err(libc::EFAULT)));
            }
            // SAFETY: `buf` is a writable struct stat (the caller's contract).
            fill_stat(&a.attr, libc::makedev(m.dev.0, m.dev.1), unsafe {
                &mut *buf
            });
            0
        }
        Err(e) => ret(Err(e)),
    })
}

type StatFn = unsafe extern "C" fn(CPath, *mut libc::stat) -> c_int;
type StatAtFn = unsafe extern "C" fn(c_int, CPath, *mut libc::stat, c_int) -> c_int;
type XstatFn = unsafe extern "C" fn(c_int, CPath, *mut libc::stat) -> c_int;
type FxstatatFn = unsafe extern "C" fn(c_int, c_int, CPath, *mut libc::stat, c_int) -> c_int;

/// `fstatat`'s flags this library understands; anything else goes to the kernel, and so
/// does `AT_EMPTY_PATH` (a descriptor's own `fstat`, glibc's `fstat` among them).
fn stat_flags_ok(flags: c_int) -> bool {
    flags & !(libc::AT_SYMLINK_NOFOLLOW | libc::AT_NO_AUTOMOUNT) == 0
}

macro_rules! export_stat {
    ($name:ident, $sym:literal, $nofollow:expr) => {
        /// Interposed: `stat`/`lstat` served over the channel on a lanefs path.
        ///
        /// # Safety
        /// As the C library's function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(path: CPath, buf: *mut libc::stat) -> c_int {
            // SAFETY: the C function's contract.
            if !unsafe { proc_fd_settled(path) } {
                return -1;
            }
            // SAFETY: the C function's contract.
            if let Some(r) = unsafe { do_stat(libc::AT_FDCWD, path, buf, $nofollow) } {
                return r;
            }
            // SAFETY: the C library's own function with the caller's arguments.
            unsafe { real!($sym, StatFn)(path, buf) }
        }
    };
}
export_stat!(stat, c"stat", false);
export_stat!(stat64, c"stat64", false);
export_stat!(lstat, c"lstat", true);
export_stat!(lstat64, c"lstat64", true);

macro_rules! export_fstatat {
    ($name:ident, $sym:literal) => {
        /// Interposed: `fstatat` served over the channel on a lanefs path.
        ///
        /// # Safety
        /// As the C library's function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            dirfd: c_int,
            path: CPath,
            buf: *mut libc::stat,
            flags: c_int,
        ) -> c_int {
            // SAFETY: the C function's contract.
            if !settled(dirfd) || !unsafe { proc_fd_settled(path) } {
                return -1;
            }
            if stat_flags_ok(flags) {
                let nofollow = flags & libc::AT_SYMLINK_NOFOLLOW != 0;
                // SAFETY: the C function's contract.
                if let Some(r) = unsafe { do_stat(dirfd, path, buf, nofollow) } {
                    return r;
                }
            }
            // SAFETY: the C library's own function with the caller's arguments.
            unsafe { real!($sym, StatAtFn)(dirfd, path, buf, flags) }
        }
    };
}
export_fstatat!(fstatat, c"fstatat");
export_fstatat!(fstatat64, c"fstatat64");

macro_rules! export_xstat {
    ($name:ident, $sym:literal, $nofollow:expr) => {
        /// Interposed: glibc's versioned `stat` entry (older binaries).
        ///
        /// # Safety
        /// As the C library's function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(ver: c_int, path: CPath, buf: *mut libc::stat) -> c_int {
            // SAFETY: the C function's contract.
            if !unsafe { proc_fd_settled(path) } {
                return -1;
            }
            if ver == 1 {
                // SAFETY: the C function's contract.
                if let Some(r) = unsafe { do_stat(libc::AT_FDCWD, path, buf, $nofollow) } {
                    return r;
                }
            }
            // SAFETY: the C library's own function with the caller's arguments.
            unsafe { real!($sym, XstatFn)(ver, path, buf) }
        }
    };
}
export_xstat!(__xstat, c"__xstat", false);
export_xstat!(__xstat64, c"__xstat64", false);
export_xstat!(__lxstat, c"__lxstat", true);
export_xstat!(__lxstat64, c"__lxstat64", true);

macro_rules! export_fxstatat {
    ($name:ident, $sym:literal) => {
        /// Interposed: glibc's versioned `fstatat` entry (older binaries).
        ///
        /// # Safety
        /// As the C library's function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            ver: c_int,
            dirfd: c_int,
            path: CPath,
            buf: *mut libc::stat,
            flags: c_int,
        ) -> c_int {
            if !settled(dirfd) {
                return -1;
            }
            if ver == 1 && stat_flags_ok(flags) {
                let nofollow = flags & libc::AT_SYMLINK_NOFOLLOW != 0;
                // SAFETY: the C function's contract.
                if let Some(r) = unsafe { do_stat(dirfd, path, buf, nofollow) } {
                    return r;
                }
            }
            // SAFETY: the C library's own function with the caller's arguments.
            unsafe { real!($sym, FxstatatFn)(ver, dirfd, path, buf, flags) }
        }
    };
}
export_fxstatat!(__fxstatat, c"__fxstatat");
export_fxstatat!(__fxstatat64, c"__fxstatat64");

const STATX_ATTR_MOUNT_ROOT: u64 = 0x2000;
const STATX_ATTR_AUTOMOUNT: u64 = 0x1000;
const STATX_ATTR_DAX: u64 = 0x0020_0000;

/// Interposed: `statx` served over the channel on a lanefs path, with what the kernel
/// reports for a FUSE file: the basic fields and the mount id.
///
/// # Safety
/// As the C library's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn statx(
    dirfd: c_int,
    path: CPath,
    flags: c_int,
    mask: c_uint,
    buf: *mut libc::statx,
) -> c_int {
    // SAFETY: the C function's contract.
    if !settled(dirfd) || !unsafe { proc_fd_settled(path) } {
        return -1;
    }
    // The sync flags ask the kernel about its cache; the server's answer is always fresh.
    // Both at once, or the reserved mask bit, are EINVAL, and the unique mount id is the
    // kernel's: those go to the kernel, which answers them.
    let sync = libc::AT_STATX_FORCE_SYNC | libc::AT_STATX_DONT_SYNC;
    const STATX_RESERVED: c_uint = 0x8000_0000;
    const STATX_MNT_ID_UNIQUE: c_uint = 0x4000;
    let served = flags & sync != sync && mask & (STATX_RESERVED | STATX_MNT_ID_UNIQUE) == 0;
    if served && stat_flags_ok(flags & !sync) {
        let nofollow = flags & libc::AT_SYMLINK_NOFOLLOW != 0;
        let ask = match flags & libc::AT_STATX_DONT_SYNC {
            0 => Ask::Program,
            _ => Ask::Fresh,
        };
        // SAFETY: the C function's contract.
        if let Some(r) = unsafe { stat_attr(dirfd, path, nofollow, ask) } {
            return match r {
                Ok(_) if buf.is_null() => ret(Err(libc::EFAULT)),
                Ok((a, m)) => {
                    // SAFETY: `buf` is a writable struct statx (the caller's contract). The
                    // kernel reports the basic fields whatever `mask` asks for.
                    fill_statx(&a, m, unsafe { &mut *buf });
                    0
                }
                Err(e) => ret(Err(e)),
            };
        }
    }
    type StatxFn = unsafe extern "C" fn(c_int, CPath, c_int, c_uint, *mut libc::statx) -> c_int;
    // SAFETY: the C library's own function with the caller's arguments.
    unsafe { real!(c"statx", StatxFn)(dirfd, path, flags, mask, buf) }
}

/// The kernel's `statx` of a FUSE file: the basic fields, the birth time where the inode has
/// one, the mount id, and the attributes the VFS sets (`STATX_ATTR_MOUNT_ROOT` on the root,
/// and the mask of those it can set). Not `STATX_ATTR_IMMUTABLE`, `_APPEND` or `_NODUMP`,
/// although lanefs has them (`lanefs::Attr::statx_attributes`) and answers FUSE_STATX with
/// them: Linux (6.18 included) drops them from a FUSE server's reply, and a call here reports
/// what it would through the kernel (`cli/tests/run.rs`,
/// `statx_under_lanefs_run_agrees_with_the_kernel`).
fn fill_statx(out: &StatOut, m: &Mount, sx: &mut libc::statx) {
    let a = &out.attr;
    // SAFETY: libc::statx is plain old data; all-zero is a valid value.
    *sx = unsafe { std::mem::zeroed() };
    sx.stx_mask = libc::STATX_BASIC_STATS | libc::STATX_MNT_ID;
    sx.stx_blksize = if a.blksize == 0 { 4096 } else { a.blksize };
    sx.stx_attributes_mask = STATX_ATTR_AUTOMOUNT | STATX_ATTR_MOUNT_ROOT | STATX_ATTR_DAX;
    if a.ino == 1 {
        sx.stx_attributes = STATX_ATTR_MOUNT_ROOT;
    }
    sx.stx_nlink = a.nlink;
    sx.stx_uid = a.uid;
    sx.stx_gid = a.gid;
    sx.stx_mode = a.mode as u16;
    sx.stx_ino = a.ino;
    sx.stx_size = a.size;
    sx.stx_blocks = a.blocks;
    let t = |s: u64, ns: u32| {
        // SAFETY: plain old data; all-zero is valid.
        let mut t: libc::statx_timestamp = unsafe { std::mem::zeroed() };
        t.tv_sec = s as i64;
        t.tv_nsec = ns;
        t
    };
    sx.stx_atime = t(a.atime, a.atimensec);
    sx.stx_mtime = t(a.mtime, a.mtimensec);
    sx.stx_ctime = t(a.ctime, a.ctimensec);
    if let Some((sec, nsec)) = out.birth() {
        sx.stx_mask |= libc::STATX_BTIME;
        sx.stx_btime = t(sec as u64, nsec);
    }
    let rdev = decode_dev(a.rdev);
    sx.stx_rdev_major = libc::major(rdev);
    sx.stx_rdev_minor = libc::minor(rdev);
    sx.stx_dev_major = m.dev.0;
    sx.stx_dev_minor = m.dev.1;
    sx.stx_mnt_id = m.mnt_id;
}

// ----- names ------------------------------------------------------------------------------

/// The process's umask, as this library last saw it set (read from `/proc` at first use).
static UMASK: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(u32::MAX);

fn umask_now() -> u32 {
    use std::sync::atomic::Ordering::Relaxed;
    let u = UMASK.load(Relaxed);
    if u != u32::MAX {
        return u;
    }
    let u = read_umask().unwrap_or(0o022);
    UMASK.store(u, Relaxed);
    u
}

/// `Umask:` of `/proc/self/status`.
fn read_umask() -> Option<u32> {
    // SAFETY: openat of a NUL-terminated path.
    let fd = crate::real::sys(unsafe {
        libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            c"/proc/self/status".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    })
    .ok()? as i32;
    let mut buf = [0u8; 4096];
    // SAFETY: the kernel writes at most `buf.len()` bytes.
    let n = crate::real::sys(unsafe { libc::syscall(libc::SYS_read, fd, buf.as_mut_ptr(), 4096) });
    crate::real::close_raw(fd);
    let text = &buf[..n.ok()?];
    let line = text
        .split(|&b| b == b'\n')
        .find_map(|l| l.strip_prefix(b"Umask:"))?;
    let s = std::str::from_utf8(line).ok()?.trim();
    u32::from_str_radix(s, 8).ok()
}

/// Interposed: remembers the umask that creations over the channel apply.
///
/// # Safety
/// As the C library's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn umask(mask: libc::mode_t) -> libc::mode_t {
    type F = unsafe extern "C" fn(libc::mode_t) -> libc::mode_t;
    // SAFETY: the C library's own function.
    let old = unsafe { real!(c"umask", F)(mask) };
    UMASK.store(mask & 0o777, std::sync::atomic::Ordering::Relaxed);
    old
}

/// The kernel's `new_encode_dev`, as FUSE's MKNOD carries a device number.
fn encode_dev(dev: libc::dev_t) -> u32 {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12)
}

/// `mknod` over the channel.
///
/// # Safety
/// `path` as for [`bytes`].
unsafe fn do_mknod(
    dirfd: c_int,
    path: CPath,
    mode: libc::mode_t,
    dev: libc::dev_t,
) -> Option<c_int> {
    let kind = match mode & libc::S_IFMT {
        0 => libc::S_IFREG,
        k @ (libc::S_IFREG | libc::S_IFCHR | libc::S_IFBLK | libc::S_IFIFO | libc::S_IFSOCK) => k,
        _ => return None,
    };
    let arg = fuse_mknod_in {
        mode: kind | (mode & 0o7777),
        rdev: encode_dev(dev),
        umask: umask_now(),
        padding: 0,
    };
    let mut out = StatOut::default();
    // SAFETY: the caller's contract.
    let r = unsafe {
        one(
            dirfd,
            path,
            OP_MKNOD,
            arg.as_bytes(),
            None,
            out.as_mut_bytes(),
        )
    }?;
    Some(ret(r))
}

/// Defines interposed C functions, each `fn NAME(ARGS) -> RET => TRY;`: `TRY` (an
/// `Option` of the return value, evaluated in an `unsafe` block under the C function's
/// contract) serves the call over the channel, and `None` passes it to the C library's own
/// `NAME` with the same arguments.
macro_rules! interpose {
    ($($(#[doc = $doc:literal])* fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty
        $(, settling $($fd:ident),+)? => $try:expr;)*) => {$(
        $(#[doc = $doc])*
        ///
        /// # Safety
        /// As the C library's function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            $($(
                if let Err(e) = crate::fds::settle($fd) {
                    set_errno(e);
                    return -1;
                }
            )+)?
            // SAFETY: the C function's contract.
            if let Some(r) = unsafe { $try } {
                return r;
            }
            type F = unsafe extern "C" fn($($ty),*) -> $ret;
            const NAME: &std::ffi::CStr = c_name!($name);
            // SAFETY: the C library's own function with the caller's arguments.
            unsafe { real!(NAME, F)($($arg),*) }
        }
    )*};
}

interpose! {
    /// Interposed: `mknod`.
    fn mknod(path: CPath, mode: libc::mode_t, dev: libc::dev_t) -> c_int
        => do_mknod(libc::AT_FDCWD, path, mode, dev);

    /// Interposed: `mknodat`.
    fn mknodat(dirfd: c_int, path: CPath, mode: libc::mode_t, dev: libc::dev_t) -> c_int, settling dirfd
        => do_mknod(dirfd, path, mode, dev);
}

/// `mkdir` over the channel.
///
/// # Safety
/// `path` as for [`bytes`].
unsafe fn do_mkdir(dirfd: c_int, path: CPath, mode: libc::mode_t) -> Option<c_int> {
    let arg = fuse_mkdir_in {
        mode: mode & 0o7777,
        umask: umask_now(),
    };
    let mut out = StatOut::default();
    // SAFETY: the caller's contract.
    let r = unsafe {
        one(
            dirfd,
            path,
            OP_MKDIR,
            arg.as_bytes(),
            None,
            out.as_mut_bytes(),
        )
    }?;
    Some(ret(r))
}

interpose! {
    /// Interposed: `mkdir`.
    fn mkdir(path: CPath, mode: libc::mode_t) -> c_int
        => do_mkdir(libc::AT_FDCWD, path, mode);

    /// Interposed: `mkdirat`.
    fn mkdirat(dirfd: c_int, path: CPath, mode: libc::mode_t) -> c_int, settling dirfd
        => do_mkdir(dirfd, path, mode);

    /// Interposed: `unlink`.
    fn unlink(path: CPath) -> c_int
        => {
            before_removing(libc::AT_FDCWD, path);
            one(libc::AT_FDCWD, path, OP_UNLINK, &[], None, &mut []).map(ret)
        };

    /// Interposed: `rmdir`.
    fn rmdir(path: CPath) -> c_int
        => one(libc::AT_FDCWD, path, OP_RMDIR, &[], None, &mut []).map(ret);

    /// Interposed: `remove` (the C library's calls `unlink` and `rmdir` where no one sees;
    /// only deferred descriptors are settled here).
    fn remove(path: CPath) -> c_int
        => {
            before_removing(libc::AT_FDCWD, path);
            None
        };
}

/// Interposed: `unlinkat` (with `AT_REMOVEDIR`, an rmdir).
///
/// # Safety
/// As the C library's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn unlinkat(dirfd: c_int, path: CPath, flags: c_int) -> c_int {
    if !settled(dirfd) {
        return -1;
    }
    let op = match flags {
        0 => Some(OP_UNLINK),
        libc::AT_REMOVEDIR => Some(OP_RMDIR),
        _ => None,
    };
    if let Some(op) = op {
        // SAFETY: the C function's contract.
        unsafe { before_removing(dirfd, path) };
        // SAFETY: the C function's contract.
        if let Some(r) = unsafe { one(dirfd, path, op, &[], None, &mut []) } {
            return ret(r);
        }
    }
    type F = unsafe extern "C" fn(c_int, CPath, c_int) -> c_int;
    // SAFETY: the C library's own function with the caller's arguments.
    unsafe { real!(c"unlinkat", F)(dirfd, path, flags) }
}

/// Before this process removes, renames, replaces, `chmod`s or `chown`s the name at `path`:
/// a deferred descriptor of the file it names (`fds.rs`) is settled while the name still
/// leads to it and the file still lets it be opened (all of them, for a directory or a
/// symlink, which their paths may go through).
///
/// # Safety
/// `path` as for [`bytes`].
unsafe fn before_removing(dirfd: c_int, path: CPath) {
    if !crate::fds::any() {
        return;
    }
    // SAFETY: the caller's contract.
    match unsafe { stat_attr(dirfd, path, true, Ask::Server) } {
        Some(Ok((a, _))) if a.attr.mode & libc::S_IFMT == libc::S_IFREG => {
            crate::fds::settle_ino(a.attr.ino)
        }
        Some(Err(libc::ENOENT)) => {}
        // A directory or a symlink (which the paths of deferred files may go through), or
        // a path the kernel resolves (through a symlink out and back in).
        _ => crate::fds::settle_all(),
    }
}

/// `renameat2` over the channel.
///
/// # Safety
/// The paths as for [`bytes`].
unsafe fn do_rename(from: (c_int, CPath), to: (c_int, CPath), flags: c_uint) -> Option<c_int> {
    // SAFETY: the caller's contract.
    unsafe {
        before_removing(from.0, from.1);
        before_removing(to.0, to.1);
    }
    if flags & !(libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE) != 0 {
        return None; // RENAME_WHITEOUT and anything newer: the kernel's checks
    }
    let arg = RenameIn { flags, padding: 0 };
    // SAFETY: the caller's contract.
    Some(ret(unsafe {
        two(from, to, OP_RENAME, arg.as_bytes(), &mut [])
    }?))
}

interpose! {
    /// Interposed: `rename`.
    fn rename(old: CPath, new: CPath) -> c_int
        => do_rename((libc::AT_FDCWD, old), (libc::AT_FDCWD, new), 0);

    /// Interposed: `renameat`.
    fn renameat(od: c_int, old: CPath, nd: c_int, new: CPath) -> c_int, settling od, nd
        => do_rename((od, old), (nd, new), 0);

    /// Interposed: `renameat2`.
    fn renameat2(od: c_int, old: CPath, nd: c_int, new: CPath, flags: c_uint) -> c_int,
        settling od, nd
        => do_rename((od, old), (nd, new), flags);
}

/// `linkat` over the channel.
///
/// # Safety
/// The paths as for [`bytes`].
unsafe fn do_link(from: (c_int, CPath), to: (c_int, CPath), flags: c_int) -> Option<c_int> {
    // SAFETY: the caller's contract.
    if !unsafe { proc_fd_settled(from.1) } {
        return Some(-1);
    }
    if flags & !libc::AT_SYMLINK_FOLLOW != 0 {
        return None; // AT_EMPTY_PATH: a descriptor, the kernel's
    }
    let arg = LinkIn {
        flags: if flags & libc::AT_SYMLINK_FOLLOW != 0 {
            FOLLOW
        } else {
            0
        },
        padding: 0,
    };
    let mut out = StatOut::default();
    // SAFETY: the caller's contract.
    Some(ret(unsafe {
        two(from, to, OP_LINK, arg.as_bytes(), out.as_mut_bytes())
    }?))
}

interpose! {
    /// Interposed: `link`.
    fn link(old: CPath, new: CPath) -> c_int
        => do_link((libc::AT_FDCWD, old), (libc::AT_FDCWD, new), 0);

    /// Interposed: `linkat`.
    fn linkat(od: c_int, old: CPath, nd: c_int, new: CPath, flags: c_int) -> c_int,
        settling od, nd
        => do_link((od, old), (nd, new), flags);
}

/// `symlinkat` over the channel.
///
/// # Safety
/// `target` and `path` as for [`bytes`].
unsafe fn do_symlink(target: CPath, dirfd: c_int, path: CPath) -> Option<c_int> {
    let mut tb = path_buf();
    let t = read_cstr(target, &mut tb)?;
    let mut out = StatOut::default();
    // SAFETY: the caller's contract.
    let r = unsafe { one(dirfd, path, OP_SYMLINK, &[], Some(t), out.as_mut_bytes()) }?;
    Some(ret(r))
}

interpose! {
    /// Interposed: `symlink`.
    fn symlink(target: CPath, path: CPath) -> c_int
        => do_symlink(target, libc::AT_FDCWD, path);

    /// Interposed: `symlinkat`.
    fn symlinkat(target: CPath, dirfd: c_int, path: CPath) -> c_int, settling dirfd
        => do_symlink(target, dirfd, path);
}

/// `readlinkat` over the channel.
///
/// # Safety
/// `path` as for [`bytes`]; `buf` writable for `size` bytes.
unsafe fn do_readlink(dirfd: c_int, path: CPath, buf: *mut c_char, size: usize) -> Option<isize> {
    // SAFETY: the caller's contract.
    if !unsafe { proc_fd_settled(path) } {
        return Some(-1);
    }
    if size == 0 || buf.is_null() {
        return None;
    }
    let mut t = [0u8; 4096];
    // SAFETY: the caller's contract.
    let r = unsafe { one(dirfd, path, OP_READLINK, &[], None, &mut t) }?;
    Some(match r {
        Ok(n) => {
            let n = n.min(size);
            // SAFETY: `buf` is writable for `size` >= `n` bytes.
            unsafe { std::ptr::copy_nonoverlapping(t.as_ptr(), buf.cast(), n) };
            n as isize
        }
        Err(e) => {
            set_errno(e);
            -1
        }
    })
}

interpose! {
    /// Interposed: `readlink`.
    fn readlink(path: CPath, buf: *mut c_char, size: usize) -> isize
        => do_readlink(libc::AT_FDCWD, path, buf, size);

    /// Interposed: `readlinkat`.
    fn readlinkat(dirfd: c_int, path: CPath, buf: *mut c_char, size: usize) -> isize,
        settling dirfd
        => do_readlink(dirfd, path, buf, size);
}

// ----- attributes -------------------------------------------------------------------------

/// A SETATTR over the channel.
///
/// # Safety
/// `path` as for [`bytes`].
unsafe fn do_setattr(dirfd: c_int, path: CPath, s: &SetattrIn) -> Option<c_int> {
    // SAFETY: the caller's contract.
    if !unsafe { proc_fd_settled(path) } {
        return Some(-1);
    }
    if s.valid & (FATTR_MODE | FATTR_UID | FATTR_GID) != 0 {
        // SAFETY: the caller's contract.
        unsafe { before_removing(dirfd, path) };
    }
    let mut out = StatOut::default();
    // SAFETY: the caller's contract.
    let r = unsafe {
        one(
            dirfd,
            path,
            OP_SETATTR,
            s.as_bytes(),
            None,
            out.as_mut_bytes(),
        )
    }?;
    Some(ret(r))
}

fn chmod_arg(mode: libc::mode_t) -> SetattrIn {
    SetattrIn {
        valid: FATTR_MODE,
        mode: mode & 0o7777,
        ..SetattrIn::default()
    }
}

fn chown_arg(uid: libc::uid_t, gid: libc::gid_t, nofollow: bool) -> SetattrIn {
    SetattrIn {
        valid: FATTR_UID | FATTR_GID,
        flags: if nofollow { NOFOLLOW } else { 0 },
        uid,
        gid,
        ..SetattrIn::default()
    }
}

interpose! {
    /// Interposed: `chmod`.
    fn chmod(path: CPath, mode: libc::mode_t) -> c_int
        => do_setattr(libc::AT_FDCWD, path, &chmod_arg(mode));
}

/// Interposed: `fchmodat` (without flags; `AT_SYMLINK_NOFOLLOW` goes to the kernel).
///
/// # Safety
/// As the C library's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fchmodat(
    dirfd: c_int,
    path: CPath,
    mode: libc::mode_t,
    flags: c_int,
) -> c_int {
    if !settled(dirfd) {
        return -1;
    }
    if flags == 0 {
        // SAFETY: the C function's contract.
        if let Some(r) = unsafe { do_setattr(dirfd, path, &chmod_arg(mode)) } {
            return r;
        }
    }
    type F = unsafe extern "C" fn(c_int, CPath, libc::mode_t, c_int) -> c_int;
    // SAFETY: the C library's own function with the caller's arguments.
    unsafe { real!(c"fchmodat", F)(dirfd, path, mode, flags) }
}

macro_rules! export_chown {
    ($name:ident, $sym:literal, $nofollow:expr) => {
        /// Interposed: `chown`/`lchown`.
        ///
        /// # Safety
        /// As the C library's function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(path: CPath, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
            let arg = chown_arg(uid, gid, $nofollow);
            // SAFETY: the C function's contract.
            if let Some(r) = unsafe { do_setattr(libc::AT_FDCWD, path, &arg) } {
                return r;
            }
            type F = unsafe extern "C" fn(CPath, libc::uid_t, libc::gid_t) -> c_int;
            // SAFETY: the C library's own function with the caller's arguments.
            unsafe { real!($sym, F)(path, uid, gid) }
        }
    };
}
export_chown!(chown, c"chown", false);
export_chown!(lchown, c"lchown", true);

/// Interposed: `fchownat`.
///
/// # Safety
/// As the C library's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fchownat(
    dirfd: c_int,
    path: CPath,
    uid: libc::uid_t,
    gid: libc::gid_t,
    flags: c_int,
) -> c_int {
    if !settled(dirfd) {
        return -1;
    }
    if flags & !libc::AT_SYMLINK_NOFOLLOW == 0 {
        let arg = chown_arg(uid, gid, flags != 0);
        // SAFETY: the C function's contract.
        if let Some(r) = unsafe { do_setattr(dirfd, path, &arg) } {
            return r;
        }
    }
    type F = unsafe extern "C" fn(c_int, CPath, libc::uid_t, libc::gid_t, c_int) -> c_int;
    // SAFETY: the C library's own function with the caller's arguments.
    unsafe { real!(c"fchownat", F)(dirfd, path, uid, gid, flags) }
}

/// The SETATTR of `utimensat(times, flags)`, or None for what the kernel decides alone (a
/// time out of range, both times omitted).
///
/// # Safety
/// `times` null or two readable timespecs.
unsafe fn utimens_arg(times: *const libc::timespec, flags: c_int) -> Option<SetattrIn> {
    let mut s = SetattrIn {
        flags: if flags & libc::AT_SYMLINK_NOFOLLOW != 0 {
            NOFOLLOW
        } else {
            0
        },
        ..SetattrIn::default()
    };
    if times.is_null() {
        s.valid = FATTR_ATIME | FATTR_ATIME_NOW | FATTR_MTIME | FATTR_MTIME_NOW;
        return Some(s);
    }
    // SAFETY: the caller's contract.
    let (a, m) = unsafe { (*times, *times.add(1)) };
    if a.tv_nsec == libc::UTIME_OMIT && m.tv_nsec == libc::UTIME_OMIT {
        return None;
    }
    for (t, bit, now, sec, nsec) in [
        (
            a,
            FATTR_ATIME,
            FATTR_ATIME_NOW,
            &mut s.atime,
            &mut s.atimensec,
        ),
        (
            m,
            FATTR_MTIME,
            FATTR_MTIME_NOW,
            &mut s.mtime,
            &mut s.mtimensec,
        ),
    ] {
        match t.tv_nsec {
            libc::UTIME_OMIT => {}
            libc::UTIME_NOW => s.valid |= bit | now,
            ns if (0..1_000_000_000).contains(&ns) => {
                s.valid |= bit;
                *sec = t.tv_sec as u64;
                *nsec = ns as u32;
            }
            _ => return None,
        }
    }
    Some(s)
}

/// Interposed: `utimensat` on a path.
///
/// # Safety
/// As the C library's function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn utimensat(
    dirfd: c_int,
    path: CPath,
    times: *const libc::timespec,
    flags: c_int,
) -> c_int {
    if !settled(dirfd) {
        return -1;
    }
    if !path.is_null() && flags & !libc::AT_SYMLINK_NOFOLLOW == 0 {
        // SAFETY: the C function's contract.
        if let Some(arg) = unsafe { utimens_arg(times, flags) } {
            // SAFETY: the C function's contract.
            if let Some(r) = unsafe { do_setattr(dirfd, path, &arg) } {
                return r;
            }
        }
    }
    type F = unsafe extern "C" fn(c_int, CPath, *const libc::timespec, c_int) -> c_int;
    // SAFETY: the C library's own function with the caller's arguments.
    unsafe { real!(c"utimensat", F)(dirfd, path, times, flags) }
}

// ----- open -------------------------------------------------------------------------------

/// `open(O_CREAT)`: the create over the channel, then the open through the kernel. None
/// when the kernel must do it all: flags this library leaves alone (`O_TMPFILE`,
/// `O_DIRECTORY`, `O_PATH`), a path ending in `/`, `.` or `..`, or a mode that would not let
/// the creator open the file it made (the kernel's create-and-open is exempt from the
/// permission check; an open after the create is not).
///
/// # Safety
/// `path` as for [`bytes`].
unsafe fn open_create(dirfd: c_int, path: CPath, flags: c_int, mode: c_uint) -> Option<c_int> {
    if flags & libc::O_CREAT == 0
        || flags & (libc::O_TMPFILE | libc::O_DIRECTORY | libc::O_PATH) != 0
    {
        return None;
    }
    let mut pb = path_buf();
    let p = read_cstr(path, &mut pb)?;
    let last = p.rsplit(|&b| b == b'/').next().unwrap_or(p);
    if p.ends_with(b"/") || last == b"." || last == b".." {
        return None;
    }
    let perm = mode & 0o7777 & !umask_now();
    let need = match flags & libc::O_ACCMODE {
        libc::O_RDONLY => 0o400,
        libc::O_WRONLY => 0o200,
        _ => 0o600,
    };
    if perm & need != need {
        return None;
    }
    let arg = fuse_mknod_in {
        mode: libc::S_IFREG | (mode & 0o7777),
        rdev: 0,
        umask: umask_now(),
        padding: 0,
    };
    let mut out = StatOut::default();
    let mut target = KernelPath {
        buf: [0; crate::fds::PATH_ROOM],
        len: 0,
        dev: (0, 0),
    };
    let made = one_at(
        dirfd,
        p,
        OP_MKNOD,
        arg.as_bytes(),
        None,
        out.as_mut_bytes(),
        Some(&mut target),
    )?;
    // The kernel opens it when the program first uses the descriptor (`fds.rs`), unless
    // the mode it got (a default ACL's) keeps its owner from the access asked for.
    if made.is_ok() && out.attr.mode & need == need {
        let m = crate::fds::Made {
            path: &target.buf[..target.len],
            ino: out.attr.ino,
            btime: out.birth(),
            dev: target.dev,
        };
        if let Some(fd) = crate::fds::defer(m, flags) {
            return Some(fd);
        }
    }
    let kernel_flags = match made {
        // Made: opened without O_CREAT (a lookup, in parallel with others in the directory);
        // it is empty, so O_TRUNC has nothing to do.
        Ok(_) => flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC),
        Err(libc::EEXIST) if flags & libc::O_EXCL != 0 => return Some(ret(Err(libc::EEXIST))),
        // There already (a file, or a symlink to follow): the kernel opens it as asked.
        Err(libc::EEXIST) => return None,
        Err(e) => return Some(ret(Err(e))),
    };
    // SAFETY: the C library's own `openat` with the caller's path.
    let fd = unsafe { real!(c"openat", OpenAtFn)(dirfd, path, kernel_flags, 0) };
    let e = crate::real::errno();
    if fd >= 0 {
        return Some(fd);
    }
    // The kernel's `open(O_CREAT)` leaves no file when it fails: the one made here goes again
    // (if the name still names it).
    // SAFETY: the caller's contract.
    unsafe { undo_create(dirfd, path, out.attr.ino) };
    if e != libc::EACCES && e != libc::ENOENT {
        set_errno(e);
        return Some(-1);
    }
    // ENOENT: gone again before the open (another process removed it), or the kernel sees
    // another file at the path than the channel did. EACCES: a mode the umask check let
    // through, but a default ACL made the new file's owner bits withhold the access asked
    // for; the kernel's create-and-open is exempt from that check, its open after a create
    // is not. Either way: as asked, through the kernel.
    None
}

/// `fsync` of a deferred descriptor (`fds.rs`) over the channel: `path` is its path
/// through the kernel, `ino` its inode. None when the kernel must do it (the descriptor is
/// then settled first).
pub(crate) fn fsync_deferred(
    made: &crate::fds::Made<'_>,
    datasync: bool,
) -> Option<Result<usize, i32>> {
    let (path, ino) = (made.path, made.ino);
    let arg = FsyncIn {
        ino,
        datasync: u32::from(datasync),
        padding: 0,
    };
    match one_at(
        libc::AT_FDCWD,
        path,
        OP_FSYNC,
        arg.as_bytes(),
        None,
        &mut [],
        None,
    )? {
        // Renamed or removed since (by another process): the kernel's descriptor then
        // decides (the settling fails with ESTALE, as this would).
        Err(libc::ENOENT) => None,
        r => Some(r),
    }
}

/// Removes the file `open_create` made at `path` if the name still names inode `ino`.
///
/// # Safety
/// `path` as for [`bytes`].
unsafe fn undo_create(dirfd: c_int, path: CPath, ino: u64) {
    // SAFETY: the caller's contract.
    if let Some(Ok((a, _))) = unsafe { stat_attr(dirfd, path, true, Ask::Server) } {
        if a.attr.ino == ino {
            // SAFETY: as above.
            let _ = unsafe { one(dirfd, path, OP_UNLINK, &[], None, &mut []) };
        }
    }
}

type OpenFn = unsafe extern "C" fn(CPath, c_int, ...) -> c_int;
type OpenAtFn = unsafe extern "C" fn(c_int, CPath, c_int, ...) -> c_int;

macro_rules! export_open {
    ($name:ident, $sym:literal) => {
        /// Interposed: `open` (its create goes over the channel).
        ///
        /// # Safety
        /// As the C library's function (`mode` read only with `O_CREAT` or `O_TMPFILE`).
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(path: CPath, flags: c_int, mode: c_uint) -> c_int {
            // SAFETY: the C function's contract.
            if !unsafe { proc_fd_settled(path) } {
                return -1;
            }
            // SAFETY: the C function's contract.
            if let Some(fd) = unsafe { open_create(libc::AT_FDCWD, path, flags, mode) } {
                return fd;
            }
            // SAFETY: the C library's own function with the caller's arguments.
            unsafe { real!($sym, OpenFn)(path, flags, mode) }
        }
    };
}
export_open!(open, c"open");
export_open!(open64, c"open64");

macro_rules! export_openat {
    ($name:ident, $sym:literal) => {
        /// Interposed: `openat` (its create goes over the channel).
        ///
        /// # Safety
        /// As the C library's function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            dirfd: c_int,
            path: CPath,
            flags: c_int,
            mode: c_uint,
        ) -> c_int {
            // SAFETY: the C function's contract.
            if !settled(dirfd) || !unsafe { proc_fd_settled(path) } {
                return -1;
            }
            // SAFETY: the C function's contract.
            if let Some(fd) = unsafe { open_create(dirfd, path, flags, mode) } {
                return fd;
            }
            // SAFETY: the C library's own function with the caller's arguments.
            unsafe { real!($sym, OpenAtFn)(dirfd, path, flags, mode) }
        }
    };
}
export_openat!(openat, c"openat");
export_openat!(openat64, c"openat64");

macro_rules! export_creat {
    ($name:ident, $sym:literal) => {
        /// Interposed: `creat`.
        ///
        /// # Safety
        /// As the C library's function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(path: CPath, mode: libc::mode_t) -> c_int {
            let flags = libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC;
            // SAFETY: the C function's contract.
            if let Some(fd) = unsafe { open_create(libc::AT_FDCWD, path, flags, mode) } {
                return fd;
            }
            type F = unsafe extern "C" fn(CPath, libc::mode_t) -> c_int;
            // SAFETY: the C library's own function with the caller's arguments.
            unsafe { real!($sym, F)(path, mode) }
        }
    };
}
export_creat!(creat, c"creat");
export_creat!(creat64, c"creat64");

// ----- process state ----------------------------------------------------------------------

macro_rules! export_cwd_change {
    ($name:ident, $sym:literal, $arg:ty) => {
        /// Interposed: the working directory changes (`paths.rs` forgets where it was).
        ///
        /// # Safety
        /// As the C library's function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(a: $arg) -> c_int {
            type F = unsafe extern "C" fn($arg) -> c_int;
            // SAFETY: the C library's own function with the caller's arguments.
            let r = unsafe { real!($sym, F)(a) };
            forget_cwd();
            r
        }
    };
}
export_cwd_change!(chdir, c"chdir", CPath);
export_cwd_change!(fchdir, c"fchdir", c_int);

macro_rules! export_setid {
    ($name:ident, $sym:literal, ($($a:ident: $t:ty),*)) => {
        /// Interposed: the credentials change; every channel connects again (`conn.rs`).
        ///
        /// # Safety
        /// As the C library's function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($a: $t),*) -> c_int {
            // Deferred files are opened with the credentials that made them.
            crate::fds::settle_all();
            type F = unsafe extern "C" fn($($t),*) -> c_int;
            // SAFETY: the C library's own function with the caller's arguments.
            let r = unsafe { real!($sym, F)($($a),*) };
            note_cred_change();
            r
        }
    };
}
export_setid!(setuid, c"setuid", (u: libc::uid_t));
export_setid!(setgid, c"setgid", (g: libc::gid_t));
export_setid!(seteuid, c"seteuid", (u: libc::uid_t));
export_setid!(setegid, c"setegid", (g: libc::gid_t));
export_setid!(setreuid, c"setreuid", (r: libc::uid_t, e: libc::uid_t));
export_setid!(setregid, c"setregid", (r: libc::gid_t, e: libc::gid_t));
export_setid!(setresuid, c"setresuid", (r: libc::uid_t, e: libc::uid_t, s: libc::uid_t));
export_setid!(setresgid, c"setresgid", (r: libc::gid_t, e: libc::gid_t, s: libc::gid_t));
export_setid!(setfsuid, c"setfsuid", (u: libc::uid_t));
export_setid!(setfsgid, c"setfsgid", (g: libc::gid_t));
export_setid!(setgroups, c"setgroups", (n: usize, l: *const libc::gid_t));
export_setid!(capset, c"capset", (h: *mut libc::c_void, d: *const libc::c_void));

macro_rules! export_isolating {
    ($name:ident, $sym:literal, ($($a:ident: $t:ty),*), $when:expr) => {
        /// Interposed: the process's root or mount namespace may change; if it did, every
        /// call goes through the kernel from then on (`mounts.rs`).
        ///
        /// # Safety
        /// As the C library's function.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($a: $t),*) -> c_int {
            // Deferred files' paths are this root's and this namespace's.
            crate::fds::settle_all();
            type F = unsafe extern "C" fn($($t),*) -> c_int;
            // SAFETY: the C library's own function with the caller's arguments.
            let r = unsafe { real!($sym, F)($($a),*) };
            if r == 0 && $when {
                crate::mounts::isolate();
                note_cred_change();
            }
            r
        }
    };
}
export_isolating!(chroot, c"chroot", (p: CPath), true);
export_isolating!(unshare, c"unshare", (flags: c_int), flags & (libc::CLONE_NEWNS | libc::CLONE_NEWUSER) != 0);
export_isolating!(setns, c"setns", (fd: c_int, nstype: c_int), true);
