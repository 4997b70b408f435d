//! Descriptors of files the channel created and the kernel has not opened yet: *deferred*
//! descriptors.
//!
//! `open(O_CREAT)` of a new file makes the file over the channel. Opening it through the
//! kernel then would cost a LOOKUP of the new name (and, when the file is unlinked, an entry
//! invalidation that takes the directory's `i_rwsem` in the kernel): the very lock the
//! channel goes around. Many programs do nothing with such a descriptor but close it (a
//! lock file, a marker, the seeds' create-and-unlink) or fsync and close it. So the program
//! gets a *placeholder* (`/dev/null` opened `O_PATH | O_CLOEXEC`, which reserves the number),
//! and the kernel opens the file only when the program first does something with the
//! descriptor other than close it: [`settle`] opens the file's path through the kernel,
//! checks that it is the inode the channel made, and puts it in the placeholder's place
//! with `dup3` (so the number, and the close-on-exec flag asked for, are the program's).
//!
//! Every function of the C library that takes a descriptor and is not only `close` settles
//! it first (`fdcalls.rs`), as do `fork` (the `pthread_atfork` prepare handler: parent and
//! child then share one open file description, as they must), the `exec` family,
//! `posix_spawn`, `system` and `popen` (all deferred descriptors). What no interposed function
//! reaches sees the placeholder, which fails loudly and touches no file: a raw `read` or
//! `write` is EBADF (an `O_PATH` descriptor), a path relative to it ENOTDIR, an `exec` by
//! a path this library does not see (`execl`, whose variadic arguments it cannot pass on)
//! closes it (`O_CLOEXEC`) instead of handing the child a wrong file. `/proc/self/fd/N`
//! shows `/dev/null` until the descriptor is settled.
//!
//! A deferred descriptor names its file by path. If another process renames or removes the
//! name before this one settles the descriptor, the settling fails with ESTALE, as a
//! descriptor of NFS does (the file, created empty and never written through this
//! descriptor, has lost nothing). This process's own `unlink`, `rename` and `rmdir` settle
//! every deferred descriptor first, so a program that removes a file it holds open keeps it.
//!
//! `fsync` and `fdatasync` of a deferred descriptor go over the channel (`OP_FSYNC`, by
//! path, checked against the inode) without settling it: create, fsync and close (a mail
//! spool, fs_mark) never open the file through the kernel either.
//!
//! `LANEFS_RUN_DEFER=0` (`lanefs run --no-defer`) turns deferral off.
//!
//! State, and why it is safe: which numbers are deferred is a bitmap of atomics ([`BITS`],
//! descriptors below [`MAX_FD`]), read without a lock by every interposed call while
//! [`COUNT`] is above 0 (one load when it is 0, which is the case in a process that has
//! none). What each one is (path, inode, flags) is in [`TABLE`], a mutex taken only to defer
//! or settle (never held across a call into the C library or a channel call, and never taken
//! by a signal handler that interrupted its holder: [`Busy`]). A bit is set after the table
//! entry is written and before the number is returned, and cleared before the number is
//! closed, so a number the kernel hands out again is never taken for deferred. A placeholder
//! closed behind this library's back (a raw `close`) is recognised when settled (it is no
//! longer an `O_PATH` `/dev/null`) and forgotten, not overwritten.

use std::cell::UnsafeCell;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering::*};

use crate::conn::Busy;
use crate::real::{close_raw, errno, fd_stat, real};

/// Descriptors at or above this number are never deferred.
const MAX_FD: usize = 1 << 16;

/// One bit per descriptor number below [`MAX_FD`]: deferred.
static BITS: [AtomicU64; MAX_FD / 64] = [const { AtomicU64::new(0) }; MAX_FD / 64];

/// How many bits of [`BITS`] are set.
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// What a deferred descriptor is.
struct Deferred {
    /// The file's path through the kernel (the mountpoint and the path from the mount's
    /// root), NUL-terminated.
    path: Box<[u8]>,
    /// The inode the channel made.
    ino: u64,
    /// The flags to open it with (the program's, without `O_CREAT`, `O_EXCL`, `O_TRUNC` and
    /// `O_CLOEXEC`).
    flags: c_int,
    /// Whether the program asked for `O_CLOEXEC`.
    cloexec: bool,
}

/// The deferred descriptors' details, by number (entries of closed numbers may linger; the
/// bit says which are live), behind [`Lock`].
static TABLE: Lock = Lock {
    held: AtomicBool::new(false),
    entries: UnsafeCell::new(Vec::new()),
};

/// The process that owns [`TABLE`]: one that shares this memory without being it (a
/// `vfork` child, a raw `clone`) settles descriptors in its own descriptor table but
/// leaves the owner's bookkeeping alone.
static OWNER: AtomicI32 = AtomicI32::new(0);

/// A spin lock around the table. Not `std::sync::Mutex`: the fork handlers must hold it
/// across `fork` (so that no other thread is changing the table when the child's copy is
/// made) and release it in both parent and child, which a guard-based mutex cannot; it is
/// held only for a table change or one settle.
struct Lock {
    held: AtomicBool,
    entries: UnsafeCell<Vec<(c_int, Deferred)>>,
}

// SAFETY: `entries` is reached only through a `Guard`, which exists only while `held` was
// taken by a compare-exchange (Acquire) and is released (Release) when it is dropped.
unsafe impl Sync for Lock {}

struct Guard(&'static Lock);

impl Lock {
    fn try_lock(&'static self) -> Option<Guard> {
        // `then`, not `then_some`: a guard made and dropped when the lock is taken would
        // release it under its holder.
        self.held
            .compare_exchange(false, true, Acquire, Relaxed)
            .is_ok()
            .then(|| Guard(self))
    }

    fn lock(&'static self) -> Guard {
        loop {
            if let Some(g) = self.try_lock() {
                return g;
            }
            std::thread::yield_now();
        }
    }
}

impl std::ops::Deref for Guard {
    type Target = Vec<(c_int, Deferred)>;
    fn deref(&self) -> &Self::Target {
        // SAFETY: this guard holds the lock (see `Lock`).
        unsafe { &*self.0.entries.get() }
    }
}

impl std::ops::DerefMut for Guard {
    fn deref_mut(&mut self) -> &mut Self::Target {
        // SAFETY: this guard holds the lock, and `&mut self` makes this the only reference.
        unsafe { &mut *self.0.entries.get() }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.held.store(false, Release);
    }
}

/// This process's id, from the kernel.
fn own_pid() -> i32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::syscall(libc::SYS_getpid) as i32 }
}

/// Before `fork` (the `pthread_atfork` prepare handler): every deferred descriptor is
/// settled, so that parent and child share its open file description, and the table stays
/// locked until [`after_fork`], so that no deferral starts meanwhile.
pub(crate) fn before_fork() {
    // Not from a signal handler that interrupted this thread inside this module, which may
    // hold the lock.
    let Some(_busy) = Busy::enter() else { return };
    let mut t = TABLE.lock();
    settle_all_locked(&mut t);
    std::mem::forget(t);
    FORK_HELD.store(true, Release);
}

/// Whether [`before_fork`] left the table locked.
static FORK_HELD: AtomicBool = AtomicBool::new(false);

/// After `fork`, in the parent and in the child: the table is unlocked; the child owns its
/// copy. Also called in the child of a fork that ran no handler, where no other thread is
/// left to hold the lock.
pub(crate) fn after_fork(child: bool) {
    if child {
        OWNER.store(own_pid(), Release);
    }
    if FORK_HELD.swap(false, AcqRel) || child {
        TABLE.held.store(false, Release);
    }
}

/// Whether deferral is on (`LANEFS_RUN_DEFER`, default on).
pub(crate) fn on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("LANEFS_RUN_DEFER").is_none_or(|v| v != "0"))
}

fn bit(fd: c_int) -> Option<(&'static AtomicU64, u64)> {
    let i = usize::try_from(fd).ok().filter(|&i| i < MAX_FD)?;
    Some((&BITS[i / 64], 1u64 << (i % 64)))
}

/// Whether `fd` is deferred.
#[inline]
fn is(fd: c_int) -> bool {
    bit(fd).is_some_and(|(w, m)| w.load(Acquire) & m != 0)
}

/// Clears `fd`'s bit; whether it was set.
fn clear(fd: c_int) -> bool {
    match bit(fd) {
        Some((w, m)) if w.fetch_and(!m, AcqRel) & m != 0 => {
            COUNT.fetch_sub(1, AcqRel);
            true
        }
        _ => false,
    }
}

/// A placeholder for a file the channel made at `path` (mountpoint and path from the
/// mount's root, without NUL), inode `ino`, opened with `flags`: the descriptor to return to
/// the program, or None (deferral off, no `/dev/null`, a number too high, re-entered): then
/// the caller opens the file through the kernel.
pub(crate) fn defer(path: &[u8], ino: u64, flags: c_int) -> Option<c_int> {
    if !on() {
        return None;
    }
    let _busy = Busy::enter()?;
    type OpenAt = unsafe extern "C" fn(c_int, *const libc::c_char, c_int, ...) -> c_int;
    // SAFETY: the C library's own `openat` of a constant path.
    let fd = unsafe {
        real!(c"openat", OpenAt)(
            libc::AT_FDCWD,
            c"/dev/null".as_ptr(),
            libc::O_PATH | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    let Some((w, m)) = bit(fd) else {
        close_raw(fd);
        return None;
    };
    let mut p = Vec::with_capacity(path.len() + 1);
    p.extend_from_slice(path);
    p.push(0);
    let d = Deferred {
        path: p.into_boxed_slice(),
        ino,
        flags: flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_CLOEXEC),
        cloexec: flags & libc::O_CLOEXEC != 0,
    };
    let mut t = TABLE.lock();
    let pid = own_pid();
    match OWNER.load(Acquire) {
        0 => OWNER.store(pid, Release),
        o if o != pid => {
            // A vfork child or raw clone sharing the owner's memory: its descriptors are
            // not the owner's to keep track of.
            drop(t);
            close_raw(fd);
            return None;
        }
        _ => {}
    }
    match t.iter_mut().find(|(n, _)| *n == fd) {
        Some(e) => e.1 = d,
        None => t.push((fd, d)),
    }
    COUNT.fetch_add(1, AcqRel);
    w.fetch_or(m, AcqRel);
    Some(fd)
}

/// `fd` is being closed (by `close`, or as the target of `dup2`): it is no longer deferred.
/// Waits for a settle of it in progress (another thread's, or `fork`'s): that settle puts
/// the file in the number's place, and must not do so after the number was closed and
/// handed out again.
#[inline]
pub(crate) fn closing(fd: c_int) {
    if COUNT.load(Acquire) != 0 && is(fd) {
        closing_slow(fd);
    }
}

#[cold]
fn closing_slow(fd: c_int) {
    match Busy::enter() {
        Some(_busy) => {
            let mut t = TABLE.lock();
            if clear(fd) {
                t.retain(|(n, _)| *n != fd);
            }
        }
        // A signal handler that interrupted this thread inside this module (which may hold
        // the lock): the bit alone; the details stay until the number is deferred again.
        None => {
            clear(fd);
        }
    }
}

/// Descriptors `first..=last` are being closed (`close_range`, `closefrom`).
pub(crate) fn closing_range(first: u32, last: u32) {
    if COUNT.load(Acquire) == 0 {
        return;
    }
    let last = (last as usize).min(MAX_FD - 1);
    for fd in (first as usize)..=last {
        closing(fd as c_int);
    }
}

/// Opens `fd`'s file through the kernel if `fd` is deferred (see the module doc); the errno
/// to fail the program's call with otherwise.
#[inline]
pub(crate) fn settle(fd: c_int) -> Result<(), i32> {
    if COUNT.load(Acquire) == 0 || !is(fd) {
        return Ok(());
    }
    settle_slow(fd)
}

/// Settles every deferred descriptor (before an `exec`, or the rename of a directory by
/// this process). One that cannot be settled stays deferred.
pub(crate) fn settle_all() {
    if COUNT.load(Acquire) == 0 {
        return;
    }
    let Some(_busy) = Busy::enter() else { return };
    settle_all_locked(&mut TABLE.lock());
}

fn settle_all_locked(t: &mut Guard) {
    if COUNT.load(Acquire) == 0 {
        return;
    }
    for (i, w) in BITS.iter().enumerate() {
        let mut bits = w.load(Acquire);
        while bits != 0 {
            let b = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let _ = settle_locked(t, (i * 64 + b) as c_int);
        }
    }
}

/// Settles the deferred descriptors of inode `ino` (before this process removes or renames a
/// name of it).
pub(crate) fn settle_ino(ino: u64) {
    if COUNT.load(Acquire) == 0 {
        return;
    }
    let fds: Vec<c_int> = TABLE
        .lock()
        .iter()
        .filter(|(_, d)| d.ino == ino)
        .map(|(n, _)| *n)
        .collect();
    for fd in fds {
        let _ = settle(fd);
    }
}

/// The path through the kernel (without its NUL) and the inode of `fd`, if it is deferred.
pub(crate) fn deferred(fd: c_int) -> Option<(Vec<u8>, u64)> {
    if COUNT.load(Acquire) == 0 || !is(fd) {
        return None;
    }
    let _busy = Busy::enter()?;
    let t = TABLE.lock();
    let (_, d) = t.iter().find(|(n, _)| *n == fd)?;
    Some((d.path[..d.path.len() - 1].to_vec(), d.ino))
}

/// Whether this process has deferred descriptors.
#[inline]
pub(crate) fn any() -> bool {
    COUNT.load(Acquire) != 0
}

/// Whether `fd` is still this library's placeholder: an `O_PATH` descriptor of `/dev/null`.
fn placeholder(fd: c_int) -> bool {
    let Ok(st) = fd_stat(fd) else { return false };
    // SAFETY: F_GETFL on any number only reads the descriptor's flags.
    let fl = unsafe { libc::syscall(libc::SYS_fcntl, fd, libc::F_GETFL) };
    st.st_mode & libc::S_IFMT == libc::S_IFCHR
        && st.st_rdev == libc::makedev(1, 3)
        && fl >= 0
        && (fl as c_int) & libc::O_PATH != 0
}

#[cold]
fn settle_slow(fd: c_int) -> Result<(), i32> {
    // A signal handler that interrupted this thread inside this module cannot wait for it.
    let Some(_busy) = Busy::enter() else {
        return Err(libc::EINTR);
    };
    settle_locked(&mut TABLE.lock(), fd)
}

fn settle_locked(t: &mut Guard, fd: c_int) -> Result<(), i32> {
    if !is(fd) {
        return Ok(()); // settled or closed meanwhile
    }
    // In a process that shares the owner's memory (a vfork child), the descriptor is
    // settled in its own table and the owner's bookkeeping is left as it is.
    let owner = OWNER.load(Acquire) == own_pid();
    let Some(at) = t.iter().position(|(n, _)| *n == fd) else {
        if owner {
            clear(fd);
        }
        return Ok(());
    };
    if !placeholder(fd) {
        // Closed behind this library's back, and the number reused: not ours to replace.
        if owner {
            clear(fd);
            t.swap_remove(at);
        }
        return Ok(());
    }
    let d = &t[at].1;
    type OpenAt = unsafe extern "C" fn(c_int, *const libc::c_char, c_int, ...) -> c_int;
    // SAFETY: the C library's own `openat` of a NUL-terminated path.
    let k = unsafe {
        real!(c"openat", OpenAt)(
            libc::AT_FDCWD,
            d.path.as_ptr().cast(),
            d.flags | libc::O_CLOEXEC,
        )
    };
    if k < 0 {
        let e = errno();
        return Err(if e == libc::ENOENT { libc::ESTALE } else { e });
    }
    if fd_stat(k).map(|st| st.st_ino) != Ok(d.ino) {
        close_raw(k);
        return Err(libc::ESTALE);
    }
    let flags = if d.cloexec { libc::O_CLOEXEC } else { 0 };
    // SAFETY: dup3 of a descriptor this function just opened onto the placeholder, which
    // is this library's (checked above, under the table's lock, which every settle holds).
    let r = unsafe { libc::syscall(libc::SYS_dup3, k, fd, flags) };
    let e = errno();
    close_raw(k);
    if r < 0 {
        return Err(e);
    }
    if owner {
        clear(fd);
        t.swap_remove(at);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_try_lock_leaves_the_lock_held() {
        static L: Lock = Lock {
            held: AtomicBool::new(false),
            entries: UnsafeCell::new(Vec::new()),
        };
        let g = L.try_lock().expect("free");
        assert!(L.try_lock().is_none());
        assert!(L.held.load(Relaxed), "still held by the first guard");
        drop(g);
        assert!(L.try_lock().is_some());
    }

    #[test]
    fn bits_count_and_clear_once() {
        // Numbers far above what this test process opens.
        let fd = 60_000;
        let (w, m) = bit(fd).unwrap();
        assert!(!is(fd));
        COUNT.fetch_add(1, AcqRel);
        w.fetch_or(m, AcqRel);
        assert!(is(fd));
        assert!(clear(fd));
        assert!(!clear(fd), "a second clear finds nothing");
        assert!(!is(fd));
        assert!(bit(MAX_FD as c_int).is_none() && bit(-1).is_none());
    }
}
