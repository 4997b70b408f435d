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
//! descriptor other than close it: [`settle`] opens the file's path through the kernel
//! (`O_NOFOLLOW | O_NONBLOCK`, so that nothing put at the path meanwhile can make it wait
//! or follow a link), checks that it is the file the channel made (a regular file of the
//! mount's device with its inode number and birth time: numbers are reused), and puts it
//! in the placeholder's place with `dup3` (so the number, and the close-on-exec flag asked
//! for, are the program's). Descriptors 0 to 2 are never deferred: the C library writes
//! `stdout` and `stderr` with system calls no one can interpose.
//!
//! Every function of the C library that takes a descriptor and is not only `close` settles
//! it first (`fdcalls.rs`), as do the changes of process state it may not survive:
//! `fork` (the `pthread_atfork` prepare handler, which keeps the table locked and signals
//! blocked until the fork is done: parent and child then share one open file description,
//! as they must), the `exec` family, `posix_spawn`, `system`, `popen`, passing
//! descriptors (`sendmsg`), and credential and root changes (`setuid`, `chroot`: the file is
//! opened with the credentials that created it). This process's own removal, rename,
//! `chmod`, `chown`, `utimensat` and `truncate` of the name settle the descriptors of that
//! file first (of every deferred file, for a directory or a symlink, whose change can move
//! them), so a program that removes or locks down a file it holds open keeps it. `fsync` and
//! `fdatasync` of a deferred descriptor go over the channel (`OP_FSYNC`, by path, checked
//! against the inode) without settling it: create, fsync and close (a mail spool, fs_mark)
//! never open the file through the kernel either. (The server answers "the kernel's" when
//! the kernel holds the inode, whose dirty pages, of another descriptor or a shared mapping,
//! only the kernel's own FSYNC writes back; the descriptor is then settled and fsynced.)
//!
//! What no interposed function reaches sees the placeholder, which fails loudly and touches
//! no file: a raw `read` or `write` is EBADF, a path relative to it ENOTDIR, an `exec` by a
//! path this library does not see (`execl`, whose variadic arguments stable Rust cannot
//! take, nor pass on) closes it (`O_CLOEXEC`) instead of handing the child a wrong file,
//! and `dprintf` (variadic too, and writing with a system call of the C library's own) fails
//! with EBADF; `/proc/self/fd/N` shows
//! `/dev/null` until the descriptor is settled (an `open` or `stat` of that path settles it
//! first). A child that shares this memory without `fork`'s handlers (`vfork`, a raw
//! `clone`) settles what it uses in its own descriptor table and leaves this process's
//! bookkeeping alone: its open file description is then its own. A name another process
//! renames, removes or locks down before this one settles the descriptor makes the settling
//! fail (ESTALE, or EACCES), as a descriptor of NFS does (the file, created empty and never
//! written through this descriptor, has lost nothing). Settling needs one free descriptor
//! number for a moment (EMFILE at the limit).
//!
//! A process that takes a POSIX record lock (`fcntl(F_SETLK)`, `lockf`) has every deferred
//! descriptor settled first and defers none from then on: such locks go when the process
//! closes any descriptor of the file, which settling does (the descriptor it opens) and
//! closing a placeholder does not. `LANEFS_RUN_DEFER=0` (`lanefs run --no-defer`) turns
//! deferral off.
//!
//! State, and why it is safe: which numbers are deferred is a bitmap of atomics ([`BITS`],
//! descriptors below [`MAX_FD`]), read without a lock by every interposed call while
//! [`COUNT`] is above 0 (one load when it is 0, which is the case in a process that has
//! none). What each one is (path, inode, flags) is in [`TABLE`] (a fixed array by number,
//! paths in slots of its own pages: nothing here calls `malloc`, which a signal handler
//! cannot), behind a lock taken to defer, to settle, and around the `close` or `dup2` that
//! ends a deferred number: a settle and the
//! call that closes the number never interleave, and the bit is cleared only after the
//! number was closed, so a thread that finds the bit clear uses what the number is now. A
//! bit is set after the table entry is written and before the number is returned. The lock
//! is never waited for by a signal handler that interrupted its holder ([`InTable`]) and is
//! never held across a channel call. A placeholder closed behind this library's back (a raw
//! `close`) is recognised when settled (it is no longer an `O_PATH` `/dev/null`) and
//! forgotten, not overwritten.

use std::cell::{Cell, UnsafeCell};
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering::*};

use crate::real::{close_raw, errno, fd_stat, real};

/// Descriptors at or above this number are never deferred.
const MAX_FD: usize = 1 << 16;

/// One bit per descriptor number below [`MAX_FD`]: deferred.
static BITS: [AtomicU64; MAX_FD / 64] = [const { AtomicU64::new(0) }; MAX_FD / 64];

/// How many bits of [`BITS`] are set.
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// The file a deferred descriptor stands for.
#[derive(Clone, Copy)]
pub(crate) struct Made<'p> {
    /// Its path through the kernel (the mountpoint and the path from the mount's root),
    /// without NUL.
    pub path: &'p [u8],
    /// Its inode number.
    pub ino: u64,
    /// Its birth time, if the server gave one.
    pub btime: Option<(i64, u32)>,
    /// The mount's device number.
    pub dev: (u32, u32),
}

/// What a deferred descriptor is; all zeroes (a null path) for none, so that the table's
/// array is zero-initialised memory (`.bss`), not 4 MB of the library's file.
struct Deferred {
    /// Its path, NUL-terminated, in a slot of [`Table`]'s arena; null for no entry.
    path: *mut u8,
    /// The path's length without the NUL.
    len: usize,
    /// The rest of [`Made`]: the birth time is `born` (seconds, nanoseconds) if `has_born`.
    ino: u64,
    born: (i64, u32),
    has_born: bool,
    dev: (u32, u32),
    /// The flags to open it with (the program's, without `O_CREAT`, `O_EXCL`, `O_TRUNC` and
    /// `O_CLOEXEC`).
    flags: c_int,
    /// Whether the program asked for `O_CLOEXEC` (or set it since, `close_range`).
    cloexec: bool,
}

impl Deferred {
    const NONE: Deferred = Deferred {
        path: std::ptr::null_mut(),
        len: 0,
        ino: 0,
        born: (0, 0),
        has_born: false,
        dev: (0, 0),
        flags: 0,
        cloexec: false,
    };

    fn made(&self) -> Made<'_> {
        Made {
            // SAFETY: `path` holds `len` bytes written by `defer` and lives until the entry
            // is taken out of the table (`Table::take`), which `&self` outlives.
            path: unsafe { std::slice::from_raw_parts(self.path, self.len) },
            ino: self.ino,
            btime: self.has_born.then_some(self.born),
            dev: self.dev,
        }
    }
}

/// The deferred descriptors' details, by number, and the memory their paths live in. No
/// call here allocates with `malloc`: a program may create or use a file from a signal
/// handler that interrupted `malloc` (`open` and `write` are async-signal-safe), so the
/// table is a fixed array and paths live in slots carved from pages of its own (`mmap`),
/// kept on free lists, never given back.
struct Table {
    slots: [Deferred; MAX_FD],
    /// Free path slots of [`SMALL`] and [`PATH_ROOM`] bytes: each holds the next's address.
    free: [*mut u8; 2],
}

/// The smaller path slot (most paths fit).
const SMALL: usize = 256;
/// The larger: a path through the kernel longer than this (NUL included) is not deferred.
pub(crate) const PATH_ROOM: usize = 4096;
/// Pages mapped at a time for path slots.
const CHUNK: usize = 64 * 1024;

impl Table {
    fn get(&self, fd: c_int) -> Option<&Deferred> {
        let d = self.slots.get(usize::try_from(fd).ok()?)?;
        (!d.path.is_null()).then_some(d)
    }

    fn get_mut(&mut self, fd: c_int) -> Option<&mut Deferred> {
        let d = self.slots.get_mut(usize::try_from(fd).ok()?)?;
        (!d.path.is_null()).then_some(d)
    }

    /// Takes `fd`'s entry out, its path slot back on its free list.
    fn take(&mut self, fd: c_int) {
        let Some(d) = usize::try_from(fd)
            .ok()
            .and_then(|i| self.slots.get_mut(i))
            .filter(|d| !d.path.is_null())
            .map(|d| std::mem::replace(d, Deferred::NONE))
        else {
            return;
        };
        let class = usize::from(d.len + 1 > SMALL);
        // SAFETY: the slot came from `alloc` of this class and nothing else refers to it
        // now that its entry is gone; its first bytes hold the free list's link.
        unsafe { d.path.cast::<*mut u8>().write_unaligned(self.free[class]) };
        self.free[class] = d.path;
    }

    /// A slot for a path of `len` bytes (its NUL included), or None.
    fn alloc(&mut self, len: usize) -> Option<*mut u8> {
        let (class, size) = match len {
            0..=SMALL => (0, SMALL),
            _ if len <= PATH_ROOM => (1, PATH_ROOM),
            _ => return None,
        };
        if self.free[class].is_null() {
            // SAFETY: an anonymous private mapping of CHUNK bytes; checked below.
            let p = unsafe {
                libc::syscall(
                    libc::SYS_mmap,
                    std::ptr::null_mut::<u8>(),
                    CHUNK,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if p < 0 {
                return None;
            }
            let base = p as *mut u8;
            for i in (0..CHUNK / size).rev() {
                // SAFETY: slot `i` lies inside the fresh mapping; its first bytes hold the
                // free list's link.
                unsafe {
                    let slot = base.add(i * size);
                    slot.cast::<*mut u8>().write_unaligned(self.free[class]);
                    self.free[class] = slot;
                }
            }
        }
        let slot = self.free[class];
        // SAFETY: a slot on the free list holds the next one's address in its first bytes.
        self.free[class] = unsafe { slot.cast::<*mut u8>().read_unaligned() };
        Some(slot)
    }
}

/// The deferred descriptors' details, behind [`Lock`] (an entry of a number no longer
/// deferred may linger until the number is deferred again; the bit says which are live).
static TABLE: Lock = Lock {
    held: AtomicBool::new(false),
    entries: UnsafeCell::new(Table {
        slots: [Deferred::NONE; MAX_FD],
        free: [std::ptr::null_mut(); 2],
    }),
};

/// The process that owns [`TABLE`]: one that shares this memory without being it (a
/// `vfork` child, a raw `clone`) settles descriptors in its own descriptor table but
/// leaves the owner's bookkeeping alone.
static OWNER: AtomicI32 = AtomicI32::new(0);

/// A spin lock around the table. Not `std::sync::Mutex`: the fork handlers must hold it
/// across `fork` (so that no other thread is changing the table when the child's copy is
/// made) and release it in both parent and child, which a guard-based mutex cannot; it is
/// held only for a table change, one settle, or one `close`.
struct Lock {
    held: AtomicBool,
    entries: UnsafeCell<Table>,
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
    type Target = Table;
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

thread_local! {
    /// This thread is inside this module (it may hold the table's lock).
    static IN: Cell<bool> = const { Cell::new(false) };
}

/// The thread is inside this module: a signal handler that interrupts it here must not wait
/// for the table's lock, which the thread may hold.
struct InTable(());

impl InTable {
    fn enter() -> Option<InTable> {
        IN.with(|b| (!b.replace(true)).then(|| InTable(())))
    }
}

impl Drop for InTable {
    fn drop(&mut self) {
        IN.with(|b| b.set(false));
    }
}

/// This process's id, from the kernel.
fn own_pid() -> i32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::syscall(libc::SYS_getpid) as i32 }
}

/// Whether this process owns the table (module doc: not a `vfork` child).
fn owner() -> bool {
    OWNER.load(Acquire) == own_pid()
}

/// Before `fork` (the `pthread_atfork` prepare handler): every deferred descriptor is
/// settled, so that parent and child share its open file description, and the table stays
/// locked until [`after_fork`], so that no deferral starts meanwhile. Until then the thread
/// also counts as inside this module (its [`InTable`] is kept) and has every signal
/// blocked: a signal handler, or another library's prepare handler (those registered
/// earlier run after this one), that creates or uses a file meanwhile goes through the
/// kernel instead of waiting for the lock this thread holds.
pub(crate) fn before_fork() {
    let Some(inside) = InTable::enter() else {
        return;
    };
    // SAFETY: sigset_t is plain data; sigfillset initialises it.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid sigset pointers; blocking signals has no other effect.
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
    }
    let mut t = TABLE.lock();
    settle_all_locked(&mut t);
    std::mem::forget(t);
    std::mem::forget(inside);
    // SAFETY: the lock is held (by this thread, until `after_fork`): the only writer.
    unsafe { *FORK_MASK.0.get() = old };
    FORK_HELD.store(true, Release);
}

/// Whether [`before_fork`] left the table locked.
static FORK_HELD: AtomicBool = AtomicBool::new(false);

/// The signal mask [`before_fork`] replaced, which [`after_fork`] puts back.
// SAFETY: sigset_t is plain data, for which all zeroes is a valid (empty) value.
static FORK_MASK: ForkMask = ForkMask(UnsafeCell::new(unsafe { std::mem::zeroed() }));

struct ForkMask(UnsafeCell<libc::sigset_t>);

// SAFETY: written by `before_fork` and read by `after_fork` only while the table's lock is
// held for the fork (`FORK_HELD`), by the thread that forks.
unsafe impl Sync for ForkMask {}

/// After `fork`, in the parent and in the child: the table is unlocked; the child owns its
/// copy. Also called in the child of a fork that ran no handler, where no other thread is
/// left to hold the lock.
pub(crate) fn after_fork(child: bool) {
    if child {
        OWNER.store(own_pid(), Release);
    }
    if FORK_HELD.swap(false, AcqRel) {
        // SAFETY: `before_fork` saved the mask, under the lock this thread still holds.
        let old = unsafe { *FORK_MASK.0.get() };
        TABLE.held.store(false, Release);
        IN.with(|b| b.set(false));
        // SAFETY: restoring the mask `before_fork` saved.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    } else if child {
        TABLE.held.store(false, Release);
    }
}

/// Whether this process has taken a POSIX record lock (`fcntl`, `lockf`): from then on no
/// descriptor is deferred. A process's record locks on a file go when it closes *any*
/// descriptor of the file, so settling (which closes the descriptor it opened, after
/// `dup3`) would drop them, and closing a never-settled placeholder would not.
static LOCKS_USED: AtomicBool = AtomicBool::new(false);

/// The process is about to take a POSIX record lock: every deferred descriptor is settled
/// first, and none is deferred from now on ([`LOCKS_USED`]).
pub(crate) fn record_locks() {
    if !LOCKS_USED.swap(true, AcqRel) {
        settle_all();
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

type OpenAt = unsafe extern "C" fn(c_int, *const libc::c_char, c_int, ...) -> c_int;

/// A placeholder for `made`, opened with `flags`: the descriptor to return to the program,
/// or None (deferral off, no `/dev/null`, a number too low or too high, re-entered, a
/// process that does not own the table): then the caller opens the file through the
/// kernel.
pub(crate) fn defer(made: Made<'_>, flags: c_int) -> Option<c_int> {
    if !on() || LOCKS_USED.load(Acquire) || made.path.is_empty() || made.path.len() >= PATH_ROOM {
        return None;
    }
    let _in = InTable::enter()?;
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
    let Some((w, m)) = bit(fd).filter(|_| fd > 2) else {
        close_raw(fd);
        return None;
    };
    let mut t = TABLE.lock();
    let pid = own_pid();
    let path = match OWNER.load(Acquire) {
        0 => {
            OWNER.store(pid, Release);
            t.alloc(made.path.len() + 1)
        }
        o if o != pid => None,
        _ => t.alloc(made.path.len() + 1),
    };
    let Some(path) = path else {
        drop(t);
        close_raw(fd);
        return None;
    };
    // SAFETY: the slot holds at least `len + 1` bytes (`alloc`) and is this entry's alone.
    unsafe {
        std::ptr::copy_nonoverlapping(made.path.as_ptr(), path, made.path.len());
        path.add(made.path.len()).write(0);
    }
    t.take(fd); // a lingering entry of the number
    t.slots[fd as usize] = Deferred {
        path,
        len: made.path.len(),
        ino: made.ino,
        born: made.btime.unwrap_or_default(),
        has_born: made.btime.is_some(),
        dev: made.dev,
        flags: flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_CLOEXEC),
        cloexec: flags & libc::O_CLOEXEC != 0,
    };
    COUNT.fetch_add(1, AcqRel);
    w.fetch_or(m, AcqRel);
    Some(fd)
}

/// Runs `call`, which closes `fd` (`close`, `dup2` onto it) and succeeded if `ok` says so:
/// if `fd` is deferred, under the table's lock, and it is deferred no longer once closed.
#[inline]
pub(crate) fn closing<R>(fd: c_int, call: impl FnOnce() -> R, ok: impl Fn(&R) -> bool) -> R {
    if COUNT.load(Acquire) == 0 || !is(fd) {
        return call();
    }
    closing_slow(fd, call, ok)
}

#[cold]
fn closing_slow<R>(fd: c_int, call: impl FnOnce() -> R, ok: impl Fn(&R) -> bool) -> R {
    if !owner() {
        return call(); // a vfork child closes its own copy
    }
    match InTable::enter() {
        Some(_in) => {
            let mut t = TABLE.lock();
            let r = call();
            if ok(&r) && clear(fd) {
                t.take(fd);
            }
            r
        }
        // A signal handler that interrupted this thread inside this module (which may hold
        // the lock): the bit alone; the details stay until the number is deferred again.
        None => {
            let r = call();
            if ok(&r) {
                clear(fd);
            }
            r
        }
    }
}

/// Runs `call`, which closes descriptors `first..=last` (`close_range`, `closefrom`), or
/// with `cloexec` marks them close-on-exec, and succeeded if `ok` says so.
pub(crate) fn closing_range<R>(
    first: u32,
    last: u32,
    cloexec: bool,
    call: impl FnOnce() -> R,
    ok: impl Fn(&R) -> bool,
) -> R {
    if COUNT.load(Acquire) == 0 || !owner() {
        return call();
    }
    let Some(_in) = InTable::enter() else {
        return call();
    };
    let mut t = TABLE.lock();
    let r = call();
    if ok(&r) {
        let last = (last as usize).min(MAX_FD - 1);
        for fd in (first as usize)..=last {
            let fd = fd as c_int;
            if !is(fd) {
                continue;
            }
            if cloexec {
                if let Some(d) = t.get_mut(fd) {
                    d.cloexec = true;
                }
            } else if clear(fd) {
                t.take(fd);
            }
        }
    }
    r
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

/// Settles every deferred descriptor (before an `exec`, a credential change, the change of
/// a directory by this process). One that cannot be settled stays deferred.
pub(crate) fn settle_all() {
    if COUNT.load(Acquire) == 0 {
        return;
    }
    let Some(_in) = InTable::enter() else { return };
    unsignalled(|| settle_all_locked(&mut TABLE.lock()));
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

/// Settles the deferred descriptors of inode `ino` (before this process removes or changes
/// a name of it).
pub(crate) fn settle_ino(ino: u64) {
    if COUNT.load(Acquire) == 0 {
        return;
    }
    let Some(_in) = InTable::enter() else { return };
    unsignalled(|| settle_ino_locked(ino));
}

fn settle_ino_locked(ino: u64) {
    let mut t = TABLE.lock();
    for (i, w) in BITS.iter().enumerate() {
        let mut bits = w.load(Acquire);
        while bits != 0 {
            let fd = (i * 64 + bits.trailing_zeros() as usize) as c_int;
            bits &= bits - 1;
            if t.get(fd).is_some_and(|d| d.ino == ino) {
                let _ = settle_locked(&mut t, fd);
            }
        }
    }
}

/// The file `fd` stands for, if it is deferred, its path copied into `buf`.
pub(crate) fn deferred<'b>(fd: c_int, buf: &'b mut [u8; PATH_ROOM]) -> Option<Made<'b>> {
    if COUNT.load(Acquire) == 0 || !is(fd) {
        return None;
    }
    let _in = InTable::enter()?;
    let t = TABLE.lock();
    let m = t.get(fd)?.made();
    let path = buf.get_mut(..m.path.len())?;
    path.copy_from_slice(m.path);
    Some(Made { path, ..m })
}

/// Whether this process has deferred descriptors.
#[inline]
pub(crate) fn any() -> bool {
    COUNT.load(Acquire) != 0
}

/// Settles descriptor N if `path` is `/proc/self/fd/N`, `/proc/PID/fd/N` of this process or
/// `/dev/fd/N` (whose opening or `stat` would otherwise reach the placeholder).
pub(crate) fn settle_proc_path(path: &[u8]) -> Result<(), i32> {
    if COUNT.load(Acquire) == 0 {
        return Ok(());
    }
    let rest = if let Some(r) = path.strip_prefix(b"/dev/fd/") {
        r
    } else if let Some(r) = path.strip_prefix(b"/proc/") {
        let (who, r) = match r.iter().position(|&b| b == b'/') {
            Some(i) => (&r[..i], &r[i..]),
            None => return Ok(()),
        };
        let me = who == b"self" || who == b"thread-self" || who == own_pid().to_string().as_bytes();
        match r.strip_prefix(b"/fd/") {
            Some(r) if me => r,
            _ => return Ok(()),
        }
    } else {
        return Ok(());
    };
    let n = std::str::from_utf8(rest)
        .ok()
        .and_then(|s| s.parse::<c_int>().ok());
    match n {
        Some(fd) => settle(fd),
        None => Ok(()),
    }
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

/// Whether descriptor `k` is the file `m` (module doc): a regular file on the mount's
/// device, with its inode number and, where both have one, its birth time.
fn is_made(k: c_int, m: &Made) -> bool {
    // SAFETY: a zeroed statx is a valid out-buffer.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: statx of a descriptor (AT_EMPTY_PATH) into our buffer.
    let r = unsafe {
        libc::syscall(
            libc::SYS_statx,
            k,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_TYPE | libc::STATX_INO | libc::STATX_BTIME,
            &mut sx as *mut libc::statx,
        )
    };
    if r != 0 {
        return false;
    }
    let born = match (m.btime, sx.stx_mask & libc::STATX_BTIME != 0) {
        (Some((s, ns)), true) => sx.stx_btime.tv_sec == s && sx.stx_btime.tv_nsec == ns,
        _ => true,
    };
    u32::from(sx.stx_mode) & libc::S_IFMT == libc::S_IFREG
        && sx.stx_ino == m.ino
        && (sx.stx_dev_major, sx.stx_dev_minor) == m.dev
        && born
}

/// Runs `f` with every signal blocked on this thread: a settle holds the table's lock across
/// a kernel `open`, and a signal handler that used a deferred descriptor meanwhile could
/// neither wait for the lock nor settle without it.
fn unsignalled<R>(f: impl FnOnce() -> R) -> R {
    // SAFETY: sigset_t is plain data; sigfillset initialises it.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid sigset pointers; blocking signals has no other effect.
    let blocked = unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old) == 0
    };
    let r = f();
    if blocked {
        // SAFETY: restoring the mask saved above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    }
    r
}

#[cold]
fn settle_slow(fd: c_int) -> Result<(), i32> {
    match InTable::enter() {
        Some(_in) => unsignalled(|| settle_locked(&mut TABLE.lock(), fd)),
        // A signal handler that interrupted this thread inside this module (settles block
        // signals; a defer or a close holds the lock for a moment): it cannot wait for the
        // lock, which the thread may hold, but may take it if it is free.
        None => match TABLE.try_lock() {
            Some(mut t) => settle_locked(&mut t, fd),
            None => Err(libc::EINTR),
        },
    }
}

fn settle_locked(t: &mut Guard, fd: c_int) -> Result<(), i32> {
    if !is(fd) {
        return Ok(()); // settled or closed meanwhile
    }
    let owner = owner();
    let Some(d) = t.get(fd) else {
        if owner {
            clear(fd);
        }
        return Ok(());
    };
    if !placeholder(fd) {
        // Closed behind this library's back (or settled by this vfork child already), and
        // the number reused: not ours to replace.
        if owner {
            clear(fd);
            t.take(fd);
        }
        return Ok(());
    }
    // Not waiting for a FIFO's reader, not taking a terminal: the path may name something
    // else by now, which the check below refuses. (Not O_NOFOLLOW: the kernel would keep
    // it in the flags `F_GETFL` reports; a link's target is refused by the check too.)
    let how = d.flags | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY;
    // SAFETY: the C library's own `openat` of a NUL-terminated path (`defer` wrote it).
    let k = unsafe { real!(c"openat", OpenAt)(libc::AT_FDCWD, d.path.cast(), how) };
    if k < 0 {
        return Err(match errno() {
            libc::EMFILE
            | libc::ENFILE
            | libc::ENOMEM
            | libc::EACCES
            | libc::EPERM
            | libc::EINTR => errno(),
            _ => libc::ESTALE,
        });
    }
    if !is_made(k, &d.made()) {
        close_raw(k);
        return Err(libc::ESTALE);
    }
    if d.flags & libc::O_NONBLOCK == 0 {
        // SAFETY: F_SETFL of a descriptor this function opened, to the program's flags.
        unsafe { libc::syscall(libc::SYS_fcntl, k, libc::F_SETFL, d.flags) };
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
        t.take(fd);
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
            entries: UnsafeCell::new(Table {
                slots: [Deferred::NONE; MAX_FD],
                free: [std::ptr::null_mut(); 2],
            }),
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
