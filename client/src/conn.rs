//! A thread's channels: one per lanefs mount it has called on, made at its first call
//! there, and the call itself (the protocol is `lanefs-channel`'s).
//!
//! **What invalidates a channel.** A channel carries the credentials its process had when
//! it connected (the server read them from the socket), so a change of credentials
//! (`setuid` and its family, `setgroups`, `capset`, which this library wraps and counts in
//! [`CRED_GEN`]) makes every thread connect again before its next call. A thread that
//! connected able to change its credentials (a uid of 0 among its real, effective and saved
//! ones, any capability, or ids among which it may switch) also compares its ids, groups
//! and effective capabilities with those it connected with before each call
//! ([`Privileges`], four system calls), so that credentials changed by a raw system call,
//! or by a library that makes its own (`libcap`), are not kept over the channel: the server
//! reads them again, the connecting thread's own, at the new connection. (A thread that
//! cannot change them pays nothing.) A forked child
//! shares no channel with its parent: the mapping is not inherited (`MADV_DONTFORK`) and a
//! `pthread_atfork` handler counts the fork in [`FORK_GEN`], so the child connects anew
//! (its credentials are its own: the parent's may change meanwhile). A fork that runs no
//! `pthread_atfork` handler (glibc's `_Fork`, a raw `fork` system call) is seen at the
//! child's next call: a page of this library's is wiped in a child (`MADV_WIPEONFORK`),
//! and a call that finds its mark gone counts the fork then ([`check_fork`]).
//!
//! **Late calls.** A call made after this thread's channels were dropped (an `atexit`
//! handler, a thread-local destructor of the program's) goes through the kernel.
//!
//! **Re-entry.** A signal handler that makes a call while its thread is inside a call of
//! this library finds the thread's channels busy and goes through the kernel ([`Busy`]).
//!
//! **A server that goes.** A stopping server marks each channel closed and wakes its
//! client; a killed one is noticed by the waiting client every 100 ms (`kill(pid, 0)`). The
//! call in flight then fails with ENOTCONN, as a call on a dead FUSE mount does.

use std::cell::{Cell, UnsafeCell};
use std::ffi::CString;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::*};
use std::time::Duration;

use lanefs_channel::{
    BUF_LEN, BUF_OFFSET, Hello, MAGIC, MAP_LEN, REPLY, REQUEST, Shared, VERSION, fuse_in_header,
    fuse_out_header, futex_wait, futex_wake, socket_name,
};
use zerocopy::{FromBytes, IntoBytes};

use crate::mounts::{Mount, now_ns};
use crate::real::{close_raw, fd_ino};

/// Credential changes of this process ([`note_cred_change`]).
static CRED_GEN: AtomicU64 = AtomicU64::new(0);
/// Forks (counted in the child).
static FORK_GEN: AtomicU64 = AtomicU64::new(0);
/// Request ids (per process; only for the reader of a trace).
static UNIQUE: AtomicU64 = AtomicU64::new(1);

/// Channels a thread keeps at once (one per mount it uses).
const CHANNELS_MAX: usize = 4;
/// How often a sleeping client looks whether its server still lives.
const LIVENESS: Duration = Duration::from_millis(100);
/// After a failed connection, how long before trying that mount again.
const RETRY_NS: i64 = 1_000_000_000;

/// The process's credentials changed: every channel reconnects before its next call.
pub(crate) fn note_cred_change() {
    CRED_GEN.fetch_add(1, SeqCst);
}

extern "C" fn after_fork_in_child() {
    crate::fds::after_fork(true);
    crate::real::forget_pid();
    crate::mounts::forget_watch();
    FORK_GEN.fetch_add(1, SeqCst);
    if let Some(m) = fork_mark() {
        m.store(1, SeqCst);
    }
}

/// A byte on a page of its own that a forked child sees as 0 (`MADV_WIPEONFORK`, Linux
/// 4.14); 1 in the process that set it up. None where the page could not be had.
fn fork_mark() -> Option<&'static AtomicU8> {
    static MARK: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let p = *MARK.get_or_init(|| {
        // SAFETY: a fresh private anonymous page; checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return 0;
        }
        // SAFETY: advice on the page just mapped.
        if unsafe { libc::madvise(p, 4096, libc::MADV_WIPEONFORK) } != 0 {
            // SAFETY: unmapping the page just mapped, which nothing else refers to.
            unsafe { libc::munmap(p, 4096) };
            return 0;
        }
        // SAFETY: the page is mapped, writable and ours; an AtomicU8 has no alignment
        // requirement beyond a byte's.
        unsafe { (*(p as *const AtomicU8)).store(1, SeqCst) };
        p as usize
    });
    // SAFETY: the page stays mapped for the life of the process (a child's is wiped, not
    // unmapped).
    (p != 0).then(|| unsafe { &*(p as *const AtomicU8) })
}

/// Counts a fork that ran no `pthread_atfork` handler, if this is the child of one.
pub(crate) fn check_fork() {
    if let Some(m) = fork_mark() {
        if m.load(Relaxed) == 0 && m.swap(1, SeqCst) == 0 {
            after_fork_in_child();
        }
    }
}

/// One connection to one mount's server.
struct Chan {
    map: *mut u8,
    sock: i32,
    /// The socket's inode number, to tell whether `sock` is still ours before closing it
    /// (the program may have closed it, and the number been reused).
    sock_ino: u64,
    server_pid: i32,
    dev: (u32, u32),
    cred_gen: u64,
    fork_gen: u64,
    /// What the thread's privileges were at connection, if it had any.
    privileged: Option<Privileges>,
}

/// A thread's ids, groups and effective capabilities, as the kernel tells them.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Privileges {
    uids: [libc::uid_t; 3],
    gids: [libc::gid_t; 3],
    caps: u64,
    /// The supplementary groups: how many, and a hash of them.
    groups: (i64, u64),
}

impl Privileges {
    /// This thread's, by system calls of this library's own.
    fn now() -> Privileges {
        let (mut uids, mut gids) = ([0; 3], [0; 3]);
        // SAFETY: each call writes three ids into our arrays.
        unsafe {
            let [r, e, s] = &mut uids;
            libc::syscall(libc::SYS_getresuid, r as *mut _, e as *mut _, s as *mut _);
            let [r, e, s] = &mut gids;
            libc::syscall(libc::SYS_getresgid, r as *mut _, e as *mut _, s as *mut _);
        }
        // _LINUX_CAPABILITY_VERSION_3: two 32-bit halves.
        let mut hdr = [0x2008_0522u32, 0];
        let mut data = [[0u32; 3]; 2];
        // SAFETY: capget of this thread (pid 0) into two data structs, as version 3 asks.
        let r = unsafe { libc::syscall(libc::SYS_capget, hdr.as_mut_ptr(), data.as_mut_ptr()) };
        // A failed read counts as "some": the thread is then watched.
        let caps = if r == 0 {
            u64::from(data[0][0]) | u64::from(data[1][0]) << 32
        } else {
            u64::MAX
        };
        let mut list = [0 as libc::gid_t; 64];
        // SAFETY: getgroups writes at most 64 ids into `list` (more: EINVAL, -1).
        let n = unsafe { libc::syscall(libc::SYS_getgroups, list.len(), list.as_mut_ptr()) };
        let hash = list[..n.clamp(0, 64) as usize]
            .iter()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, &g| {
                (h ^ u64::from(g)).wrapping_mul(0x100_0000_01b3)
            });
        Privileges {
            uids,
            gids,
            caps,
            groups: (n, hash),
        }
    }

    /// Whether the thread can change its credentials (by a raw system call, unseen): it has
    /// a capability, a uid of 0, or ids among which it may switch.
    fn can_change(&self) -> bool {
        let mixed = |ids: &[u32; 3]| ids.iter().any(|&i| i != ids[0]);
        self.uids.contains(&0) || self.caps != 0 || mixed(&self.uids) || mixed(&self.gids)
    }
}

impl Chan {
    fn shared(&self) -> &Shared {
        // SAFETY: `map` is a live MAP_LEN mapping starting with a `Shared` the server wrote.
        unsafe { &*(self.map as *const Shared) }
    }

    fn buf(&self) -> *mut u8 {
        // SAFETY: the buffer lies inside the mapping.
        unsafe { self.map.add(BUF_OFFSET) }
    }

    fn current(&self) -> bool {
        self.cred_gen == CRED_GEN.load(Relaxed)
            && self.fork_gen == FORK_GEN.load(Relaxed)
            && self.privileged.is_none_or(|p| p == Privileges::now())
    }

    /// Lets the channel go: unmaps it and closes the socket if it is still ours. In a
    /// forked child the mapping was not inherited and the unmap finds nothing.
    fn close(self) {
        // SAFETY: unmapping this channel's own mapping (or nothing, in a child).
        unsafe { libc::munmap(self.map.cast(), MAP_LEN) };
        if fd_ino(self.sock) == self.sock_ino {
            close_raw(self.sock);
        }
    }
}

/// A thread's channels.
struct Chans {
    slots: [Option<Chan>; CHANNELS_MAX],
}

impl Drop for Chans {
    fn drop(&mut self) {
        for c in self.slots.iter_mut().filter_map(Option::take) {
            c.close();
        }
    }
}

thread_local! {
    static CHANS: UnsafeCell<Chans> = const {
        UnsafeCell::new(Chans { slots: [const { None }; CHANNELS_MAX] })
    };
    static BUSY: Cell<bool> = const { Cell::new(false) };
}

/// The thread is inside a call of this library: a re-entering call (a signal handler's)
/// goes through the kernel. Held for the length of a call.
pub(crate) struct Busy(());

impl Busy {
    /// None if the thread is busy already.
    pub(crate) fn enter() -> Option<Busy> {
        check_fork();
        // `then`, not `then_some`: a Busy made and dropped for a thread already busy would
        // mark it idle while its interrupted call is still in flight.
        BUSY.with(|b| (!b.replace(true)).then(|| Busy(())))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        BUSY.with(|b| b.set(false));
    }
}

/// The outcome of a call.
pub(crate) enum Outcome {
    /// The server answered: 0 and the reply body's length, or an errno.
    Done(Result<usize, i32>),
    /// Not for the channel: make the call through the kernel (no server, a path that leaves
    /// the filesystem, a request too large).
    Kernel,
}

/// Makes one call on `m`'s server: `op` with argument `arg` and the NUL-terminated `paths`
/// after it; the reply body is copied into `reply`. The caller holds [`Busy`].
pub(crate) fn call(
    m: &Mount,
    op: u32,
    arg: &[u8],
    paths: &[&[u8]],
    reply: &mut [u8],
    _busy: &Busy,
) -> Outcome {
    let hlen = size_of::<fuse_in_header>();
    let len = hlen + arg.len() + paths.iter().map(|p| p.len() + 1).sum::<usize>();
    if len > BUF_LEN {
        return Outcome::Kernel;
    }
    // A call that succeeds leaves errno as it was (a connection's tries may set it).
    let saved = crate::real::errno();
    // Err: the thread's channels are gone (the thread, or the process, is ending).
    let r = CHANS.try_with(|c| {
        // SAFETY: only this thread touches its channels, and not re-entrantly (Busy).
        let chans = unsafe { &mut *c.get() };
        let Some(ch) = channel(chans, m) else {
            return Outcome::Kernel;
        };
        let h = fuse_in_header {
            len: len as u32,
            opcode: op,
            unique: UNIQUE.fetch_add(1, Relaxed),
            nodeid: 1,
            ..Default::default()
        };
        // SAFETY: `len` <= BUF_LEN bytes into the channel's buffer, which is the client's
        // between calls.
        unsafe {
            let mut at = ch.buf();
            for part in [h.as_bytes(), arg] {
                std::ptr::copy_nonoverlapping(part.as_ptr(), at, part.len());
                at = at.add(part.len());
            }
            for p in paths {
                std::ptr::copy_nonoverlapping(p.as_ptr(), at, p.len());
                at = at.add(p.len());
                *at = 0;
                at = at.add(1);
            }
        }
        let s = ch.shared();
        s.req_len.store(len as u32, Relaxed);
        s.state.store(REQUEST, SeqCst);
        if s.server_sleeping.load(SeqCst) != 0 {
            futex_wake(&s.state);
        }
        let spin = i64::from(s.spin_ns.load(Relaxed));
        if !wait_for_reply(ch, spin) {
            drop_channel(chans, m);
            return Outcome::Done(Err(libc::ENOTCONN));
        }
        let rlen = (s.reply_len.load(Acquire) as usize).clamp(0, BUF_LEN);
        let mut hb = [0u8; size_of::<fuse_out_header>()];
        // SAFETY: the reply is in the buffer, the server's writes to it before its REPLY
        // store seen through the Acquire/SeqCst load of `state`.
        unsafe { std::ptr::copy_nonoverlapping(ch.buf(), hb.as_mut_ptr(), hb.len()) };
        let Ok(oh) = fuse_out_header::read_from_bytes(&hb) else {
            return Outcome::Kernel;
        };
        if oh.error != 0 {
            return match -oh.error {
                libc::EXDEV | libc::ENOSYS => Outcome::Kernel,
                e => Outcome::Done(Err(e)),
            };
        }
        let body = rlen.saturating_sub(hb.len()).min(reply.len());
        // SAFETY: `body` bytes after the out header, within the buffer and `reply`.
        unsafe { std::ptr::copy_nonoverlapping(ch.buf().add(hb.len()), reply.as_mut_ptr(), body) };
        Outcome::Done(Ok(body))
    });
    let o = r.unwrap_or(Outcome::Kernel);
    if !matches!(o, Outcome::Done(Err(_))) {
        crate::real::set_errno(saved);
    }
    o
}

/// Waits for the reply: spins for `spin` nanoseconds (the server's `spin_ns`; yielding the
/// CPU now and then, in case the server waits for it), then sleeps on the futex, looking every [`LIVENESS`]
/// whether the server still lives. False if the channel closed or the server died.
fn wait_for_reply(ch: &Chan, spin: i64) -> bool {
    let s = ch.shared();
    let spin_end = now_ns() + spin;
    let mut spins = 0u32;
    loop {
        if s.state.load(Acquire) == REPLY {
            return true;
        }
        if s.closed.load(Relaxed) != 0 {
            return false;
        }
        spins += 1;
        // The clock is read, and the CPU offered, every 64 rounds.
        if spins % 64 != 0 {
            std::hint::spin_loop();
            continue;
        }
        if now_ns() < spin_end {
            // SAFETY: sched_yield has no preconditions.
            unsafe { libc::sched_yield() };
            continue;
        }
        s.client_sleeping.store(1, SeqCst);
        if s.state.load(SeqCst) == REPLY {
            s.client_sleeping.store(0, Relaxed);
            return true;
        }
        let woken = futex_wait(&s.state, REQUEST, LIVENESS);
        s.client_sleeping.store(0, Relaxed);
        // SAFETY: kill with signal 0 only checks that the process exists.
        if !woken && unsafe { libc::kill(ch.server_pid, 0) } != 0 {
            return false;
        }
    }
}

/// This thread's channel to `m`, connecting if it has none (or an outdated one).
fn channel<'c>(chans: &'c mut Chans, m: &Mount) -> Option<&'c Chan> {
    let i = chans
        .slots
        .iter()
        .position(|c| c.as_ref().is_some_and(|c| c.dev == m.dev));
    if let Some(i) = i {
        if chans.slots[i].as_ref().is_some_and(Chan::current) {
            return chans.slots[i].as_ref();
        }
        if let Some(c) = chans.slots[i].take() {
            c.close();
        }
    }
    if now_ns() < m.retry_at.load(Relaxed) {
        return None;
    }
    let Some(ch) = connect(m) else {
        m.retry_at.store(now_ns() + RETRY_NS, Relaxed);
        crate::mounts::reload(false);
        return None;
    };
    let free = match chans.slots.iter().position(Option::is_none) {
        Some(f) => f,
        None => {
            if let Some(c) = chans.slots[0].take() {
                c.close();
            }
            0
        }
    };
    chans.slots[free] = Some(ch);
    chans.slots[free].as_ref()
}

fn drop_channel(chans: &mut Chans, m: &Mount) {
    for slot in chans.slots.iter_mut() {
        if slot.as_ref().is_some_and(|c| c.dev == m.dev) {
            if let Some(c) = slot.take() {
                c.close();
            }
        }
    }
}

/// Where `m`'s server may listen, most likely first.
fn socket_paths(m: &Mount) -> Vec<CString> {
    let name = socket_name(m.dev.0, m.dev.1);
    let mut dirs = Vec::new();
    if m.owner == 0 {
        dirs.push("/run/lanefs".to_string());
    } else {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == m.owner {
            if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR") {
                dirs.push(format!("{}/lanefs", x.to_string_lossy()));
            }
        }
        let tmp = std::env::var_os("TMPDIR").map_or("/tmp".into(), |t| {
            t.to_string_lossy().trim_end_matches('/').to_string()
        });
        dirs.push(format!("{tmp}/lanefs-{}", m.owner));
        dirs.push(format!("/run/user/{}/lanefs", m.owner));
    }
    dirs.into_iter()
        .filter_map(|d| CString::new(format!("{d}/{name}")).ok())
        .collect()
}

/// Connects to `m`'s server and maps the channel it hands over.
fn connect(m: &Mount) -> Option<Chan> {
    let cred_gen = CRED_GEN.load(SeqCst);
    let fork_gen = FORK_GEN.load(SeqCst);
    // Read before connecting: a change after it is caught at the next call.
    let privileges = Privileges::now();
    for path in socket_paths(m) {
        if let Some(mut c) = connect_at(m, &path, cred_gen, fork_gen) {
            c.privileged = privileges.can_change().then_some(privileges);
            return Some(c);
        }
    }
    None
}

/// Before a fork: every deferred descriptor becomes a kernel one (`fds.rs`).
extern "C" fn before_fork() {
    crate::fds::before_fork();
}

/// After a fork, in the parent.
extern "C" fn after_fork_in_parent() {
    crate::fds::after_fork(false);
}

/// Registers the `pthread_atfork` prepare and child handlers (once; `lib.rs` calls it when the library
/// is loaded, before the program can fork).
pub(crate) fn register_fork_handler() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Set up before any fork: a child tells it was forked from its wiped mark.
        let _ = fork_mark();
        // SAFETY: registering a prepare handler that settles deferred descriptors (parent
        // and child must share their open file descriptions) and a child handler that only
        // resets this library's caches.
        unsafe {
            libc::pthread_atfork(
                Some(before_fork),
                Some(after_fork_in_parent),
                Some(after_fork_in_child),
            )
        };
    });
}

fn connect_at(m: &Mount, path: &CString, cred_gen: u64, fork_gen: u64) -> Option<Chan> {
    // SAFETY: socket creation; checked.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // Out of the way of the small numbers programs use by themselves (a shell's 10, say).
    // SAFETY: duplicating our own descriptor.
    let high = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 512) };
    let sock = if high >= 0 {
        close_raw(fd);
        high
    } else {
        fd
    };
    let fail = |sock| {
        close_raw(sock);
        None
    };
    let bytes = path.as_bytes();
    // SAFETY: a zeroed sockaddr_un is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() {
        return fail(sock);
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, &s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = s as libc::c_char;
    }
    let alen = std::mem::offset_of!(libc::sockaddr_un, sun_path) + bytes.len() + 1;
    // SAFETY: connect with a valid address of `alen` bytes.
    if unsafe { libc::connect(sock, (&raw const addr).cast(), alen as libc::socklen_t) } != 0 {
        return fail(sock);
    }
    // This thread's id: the server reads its credentials, which are a thread's own.
    // SAFETY: gettid has no preconditions; send of 4 bytes of ours.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
    let b = tid.to_ne_bytes();
    // SAFETY: as above.
    if unsafe { libc::send(sock, b.as_ptr().cast(), b.len(), libc::MSG_NOSIGNAL) } != 4 {
        return fail(sock);
    }
    // The server must be the mount's owner (or root): a socket planted by someone else is
    // not talked to.
    // SAFETY: a zeroed ucred is a valid out-buffer.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut clen = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt into `cred`.
    let r = unsafe {
        libc::getsockopt(
            sock,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut clen,
        )
    };
    if r != 0 || cred.uid != 0 && cred.uid != m.owner {
        return fail(sock);
    }
    let Some((hello, memfd)) = receive_hello(sock) else {
        return fail(sock);
    };
    let ok = hello.magic == MAGIC
        && hello.version == VERSION
        && hello.error == 0
        && (hello.dev_major, hello.dev_minor) == m.dev
        && hello.map_len as usize == MAP_LEN
        && memfd >= 0;
    if !ok {
        if memfd >= 0 {
            close_raw(memfd);
        }
        return fail(sock);
    }
    // SAFETY: mapping the memfd the server sent, MAP_LEN bytes (sealed at that size).
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            MAP_LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            memfd,
            0,
        )
    };
    close_raw(memfd);
    if p == libc::MAP_FAILED {
        return fail(sock);
    }
    // SAFETY: advice on our own mapping: a forked child does not inherit it.
    unsafe { libc::madvise(p, MAP_LEN, libc::MADV_DONTFORK) };
    let ch = Chan {
        map: p.cast(),
        sock,
        sock_ino: fd_ino(sock),
        server_pid: cred.pid,
        dev: m.dev,
        cred_gen,
        fork_gen,
        privileged: None,
    };
    if ch.shared().magic != MAGIC {
        ch.close();
        return None;
    }
    Some(ch)
}

/// Receives the server's [`Hello`] and the memfd attached to it (-1 if none).
fn receive_hello(sock: i32) -> Option<(Hello, i32)> {
    let mut hello = Hello::default();
    let bytes = hello.as_mut_bytes();
    let mut iov = libc::iovec {
        iov_base: bytes.as_mut_ptr().cast(),
        iov_len: bytes.len(),
    };
    let mut cbuf = [0u64; 4];
    // SAFETY: a zeroed msghdr is valid; its pointers outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = size_of_val(&cbuf);
    // SAFETY: recvmsg into `msg`'s buffers.
    let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n != size_of::<Hello>() as isize {
        return None;
    }
    let mut fd = -1;
    // SAFETY: walking the control messages the kernel wrote into `cbuf`.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        if !c.is_null() && (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS
        {
            fd = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<i32>());
        }
    }
    Some((hello, fd))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call re-entered from a signal handler finds the thread busy, and stays refused as
    /// long as the interrupted call is in flight, however many times it asks.
    #[test]
    fn a_busy_thread_stays_busy_until_its_call_ends() {
        let outer = Busy::enter().expect("idle at first");
        assert!(Busy::enter().is_none());
        assert!(
            Busy::enter().is_none(),
            "a refused entry does not free the thread"
        );
        drop(outer);
        assert!(Busy::enter().is_some());
    }
}
