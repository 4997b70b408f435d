//! The third transport: the shared-memory channel of `lanefs run` (the layout and protocol
//! are `lanefs-channel`'s; the client is `client/`).
//!
//! A mount's server listens on a Unix socket named after the mount's device number. Each
//! connection is one client thread: this module learns its caller from the socket
//! (`SO_PEERCRED`, `/proc/PID/status` for the fs ids, groups and effective capabilities,
//! checked against the peer's pidfd so that a recycled pid cannot lend its credentials),
//! refuses a user the mount does not serve (without `allow_other`, anyone but the mounting
//! user, as the kernel does), hands the client a sealed memfd, and serves the connection
//! from a thread of its own: wait for a request, copy it out of shared memory, hand it to
//! the dispatcher with the caller's credentials ([`Caller::Known`]), copy the reply back,
//! wake the client.
//!
//! A thread per connection keeps a call to one round trip between two threads. Each spins
//! briefly for the other before it sleeps on the futex, but only while the busy channels'
//! clients and servers do not outnumber the CPUs ([`spin_now`]; the server tells its client
//! with every reply): on a machine with more of them than CPUs, spinning keeps a peer from
//! running, and sleeping at once hands it the CPU. A connection ends when its client closes its socket or exits
//! (seen at the next wait's timeout, [`IDLE_CHECK`]), when the client breaks the protocol,
//! or when the mount stops ([`ChannelServer`] dropped: every connection is marked closed and
//! its client woken, so no call waits on a server that is gone).
//!
//! Locks: the list of connections (`Conns`, a leaf, taken on connect, on a connection's end
//! and at stop); nothing else of this module's is shared between threads. Between
//! processes, `named_socket.rs` keeps a stopping server from removing the next mount's
//! socket, without a lock.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lanefs::{Ctx, Errno};
use lanefs_channel::{
    BUF_LEN, BUF_OFFSET, Hello, MAGIC, MAP_LEN, REPLY, REQUEST, Shared, VERSION, futex_wait,
    futex_wake, socket_name,
};
use zerocopy::IntoBytes;

use crate::abi::fuse_out_header;
use crate::dispatch::{Caller, Dispatch};
use crate::info::SessionInfo;
use crate::named_socket::Placed;
use crate::wire::{Answer, Out, Pending, Request, out_header};

/// How long a side spins for the other before it sleeps, while the busy channels' clients
/// and servers do not outnumber the CPUs; `LANEFS_CHANNEL_SPIN_US` sets it (measurements).
fn spin() -> Duration {
    static SPIN: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *SPIN.get_or_init(|| {
        let us = std::env::var("LANEFS_CHANNEL_SPIN_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20);
        Duration::from_micros(us)
    })
}

/// Server threads of all channels not asleep on their futex: with their clients, the
/// threads that want a CPU.
static AWAKE: AtomicUsize = AtomicUsize::new(0);

/// How long to spin now: [`spin`] while every awake server and its client can have a CPU,
/// nothing otherwise (spinning then keeps a peer from running; sleeping hands it the CPU).
fn spin_now() -> Duration {
    static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cpus = *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if AWAKE.load(Relaxed) * 2 <= cpus {
        spin()
    } else {
        Duration::ZERO
    }
}

/// How often an idle connection's thread looks whether its client is still there, and
/// whether the mount stopped.
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// A mapping of the channel's memfd, unmapped when dropped.
struct Mapping(*mut u8);

// SAFETY: the mapping is shared memory that both the server thread and the stop path touch
// only through the atomics of its `Shared` header, or (the buffer) from the one serving
// thread.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn shared(&self) -> &Shared {
        // SAFETY: the mapping is MAP_LEN bytes, page-aligned, initialised with a `Shared` at
        // its start before any other thread sees it, and lives as long as `self`.
        unsafe { &*(self.0 as *const Shared) }
    }

    fn buf(&self) -> *mut u8 {
        // SAFETY: BUF_OFFSET + BUF_LEN == MAP_LEN: the buffer lies within the mapping.
        unsafe { self.0.add(BUF_OFFSET) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `self.0` is a mapping of MAP_LEN bytes made by `mmap` and not unmapped yet.
        unsafe { libc::munmap(self.0.cast(), MAP_LEN) };
    }
}

/// One connection's state shared with the stop path.
struct Conn {
    map: Mapping,
}

type Conns = Mutex<Vec<Arc<Conn>>>;

/// The channel of one mount, served until dropped.
pub(crate) struct ChannelServer {
    listener: OwnedFd,
    stop: Arc<AtomicBool>,
    conns: Arc<Conns>,
    /// The socket's name, removed (if still this server's) after `drop` has shut the
    /// listener down.
    _placed: Placed,
}

impl Drop for ChannelServer {
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
        // Wakes the accept loop (accept fails on a shut-down listener).
        // SAFETY: shutting down a socket we own.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        for c in self.conns.lock().unwrap().drain(..) {
            let s = c.map.shared();
            s.closed.store(1, SeqCst);
            // Either side may be asleep on `state`: wake both.
            futex_wake(&s.state);
            futex_wake(&s.state);
        }
    }
}

/// Where a mount made by `owner` keeps its channel socket: `/run/lanefs` for root, the
/// user's runtime directory otherwise (as the control socket, `control.rs`).
pub(crate) fn socket_dir(owner: u32) -> PathBuf {
    if owner == 0 {
        return PathBuf::from("/run/lanefs");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(x) => PathBuf::from(x).join("lanefs"),
        None => std::env::temp_dir().join(format!("lanefs-{owner}")),
    }
}

/// Starts serving the channel of the mount with device number `dev`, made by user `owner`,
/// through `dispatch`. `allow_other`: other users may connect.
pub(crate) fn serve(
    dispatch: Arc<dyn Dispatch>,
    info: Arc<SessionInfo>,
    dev: (u32, u32),
    owner: u32,
    allow_other: bool,
) -> io::Result<ChannelServer> {
    let dir = socket_dir(owner);
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(socket_name(dev.0, dev.1));
    // A socket already under this name is a killed or stopping server's: the device number
    // is this mount's alone while it is mounted.
    let mode = if allow_other { 0o666 } else { 0o600 };
    let (listener, placed) = Placed::bind(&path, |p| listen(p, mode))?;
    let stop = Arc::new(AtomicBool::new(false));
    let conns: Arc<Conns> = Arc::default();
    let (lfd, stop2, conns2) = (listener.as_raw_fd(), stop.clone(), conns.clone());
    std::thread::Builder::new()
        .name("lanefs-channel".into())
        .spawn(move || {
            accept_loop(
                lfd,
                &stop2,
                &conns2,
                &dispatch,
                &info,
                dev,
                owner,
                allow_other,
            );
        })?;
    Ok(ChannelServer {
        listener,
        stop,
        conns,
        _placed: placed,
    })
}

/// Binds and listens on a `SOCK_SEQPACKET` socket at `path` with permissions `mode`.
fn listen(path: &Path, mode: u32) -> io::Result<OwnedFd> {
    // SAFETY: plain socket creation; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let (addr, len) = sockaddr(path)?;
    // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
    if unsafe { libc::bind(fd.as_raw_fd(), (&raw const addr).cast(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    // SAFETY: listening on a bound socket we own.
    if unsafe { libc::listen(fd.as_raw_fd(), 128) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// A `sockaddr_un` for `path` and its length.
pub(crate) fn sockaddr(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    use std::os::unix::ffi::OsStrExt;
    let b = path.as_os_str().as_bytes();
    // SAFETY: a zeroed sockaddr_un is valid.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if b.len() >= a.sun_path.len() {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, &s) in a.sun_path.iter_mut().zip(b) {
        *d = s as libc::c_char;
    }
    let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + b.len() + 1;
    Ok((a, len as libc::socklen_t))
}

#[allow(clippy::too_many_arguments)] // the listener, the stop flag and list, and the mount
fn accept_loop(
    lfd: RawFd,
    stop: &AtomicBool,
    conns: &Arc<Conns>,
    dispatch: &Arc<dyn Dispatch>,
    info: &Arc<SessionInfo>,
    dev: (u32, u32),
    owner: u32,
    allow_other: bool,
) {
    while !stop.load(SeqCst) {
        // SAFETY: accepting on the listener, which outlives this loop (the server closes it
        // only after shutting it down, which ends the loop).
        let fd = unsafe {
            libc::accept4(
                lfd,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if fd < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR | libc::ECONNABORTED | libc::EMFILE | libc::ENFILE) => {
                    continue;
                }
                _ => return, // shut down
            }
        }
        // SAFETY: a new descriptor we own.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        let (d, c, info) = (dispatch.clone(), conns.clone(), info.clone());
        let _ = std::thread::Builder::new()
            .name("lanefs-chan".into())
            .spawn(move || {
                if let Some((conn, ctx)) = greet(&sock, dev, owner, allow_other, &c) {
                    let slot = info.channel_connected();
                    serve_conn(&conn, &sock, &ctx, &*d, || info.count_channel(slot));
                    c.lock().unwrap().retain(|x| !Arc::ptr_eq(x, &conn));
                }
            });
    }
}

/// The caller on the other end of `sock`: its fs uid and gid, its groups and its effective
/// capabilities, read from `/proc` while its pidfd shows that the pid still names it: those
/// of its thread `tid` (the client sends it first; `/proc/PID/task/TID` exists only for a
/// thread of process PID). `Err(EPERM)`: a caller in another user namespace than this
/// server's. `Err(0)`: none to be had (the caller went, or said nothing).
fn caller(sock: &OwnedFd) -> Result<Ctx, i32> {
    // SAFETY: a zeroed ucred is a valid out-buffer of the size given.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt into `cred`, `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(0);
    }
    let tid = client_tid(sock).ok_or(0)?;
    let pidfd = peer_pidfd(sock);
    let task = format!("/proc/{}/task/{tid}", cred.pid);
    let status = std::fs::read_to_string(format!("{task}/status")).map_err(|_| 0)?;
    let userns = |path: &str| std::fs::metadata(path).map(|m| (m.dev(), m.ino())).ok();
    let same_userns = userns(&format!("{task}/ns/user")).ok_or(0)?;
    if let Some(p) = &pidfd {
        // The pid still names the process that connected: the status read was its.
        // SAFETY: signal 0 checks liveness only; `p` is a pidfd we own.
        let alive =
            unsafe { libc::syscall(libc::SYS_pidfd_send_signal, p.as_raw_fd(), 0, 0usize, 0u32) };
        if alive != 0 {
            return Err(0);
        }
    }
    if userns("/proc/self/ns/user") != Some(same_userns) {
        return Err(libc::EPERM);
    }
    let s = crate::creds::parse_status(&status);
    let ((uid, gid), caps) = s.fs_ids.zip(s.caps).ok_or(0)?;
    Ok(Ctx::user(uid, gid).with_groups(&s.groups).with_caps(caps))
}

/// The thread id the client sends first (module doc of `lanefs-channel`), waited for at
/// most a second.
fn client_tid(sock: &OwnedFd) -> Option<u32> {
    let limit = libc::timeval {
        tv_sec: 1,
        tv_usec: 0,
    };
    // SAFETY: setsockopt with a timeval of the size given.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const limit).cast(),
            size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    let mut b = [0u8; 4];
    // SAFETY: recv into `b`, 4 bytes.
    let n = unsafe { libc::recv(sock.as_raw_fd(), b.as_mut_ptr().cast(), b.len(), 0) };
    (n == 4).then(|| u32::from_ne_bytes(b)).filter(|&t| t != 0)
}

/// The peer's pidfd (`SO_PEERPIDFD`, Linux 6.5), where the kernel has it.
fn peer_pidfd(sock: &OwnedFd) -> Option<OwnedFd> {
    const SO_PEERPIDFD: libc::c_int = 77;
    let mut fd: libc::c_int = -1;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt into `fd`, `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&raw mut fd).cast(),
            &mut len,
        )
    };
    // SAFETY: on success `fd` is a new descriptor we own.
    (r == 0 && fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Admits the caller on `sock` and hands it a channel, or tells it why not.
fn greet(
    sock: &OwnedFd,
    dev: (u32, u32),
    owner: u32,
    allow_other: bool,
    conns: &Conns,
) -> Option<(Arc<Conn>, Ctx)> {
    let mut hello = Hello {
        magic: MAGIC,
        version: VERSION,
        error: 0,
        dev_major: dev.0,
        dev_minor: dev.1,
        server_pid: std::process::id(),
        map_len: MAP_LEN as u32,
        padding: 0,
    };
    let ctx = match caller(sock) {
        Ok(c) if allow_other || c.uid == owner => c,
        Ok(_) => {
            hello.error = libc::EACCES;
            send(sock, &hello, None);
            return None;
        }
        Err(0) => return None,
        Err(e) => {
            hello.error = e;
            send(sock, &hello, None);
            return None;
        }
    };
    let (memfd, map) = make_channel().ok()?;
    if !send(sock, &hello, Some(memfd.as_raw_fd())) {
        return None;
    }
    let conn = Arc::new(Conn { map });
    conns.lock().unwrap().push(conn.clone());
    Some((conn, ctx))
}

/// A sealed memfd of [`MAP_LEN`] bytes, mapped, with its header written.
fn make_channel() -> io::Result<(OwnedFd, Mapping)> {
    // SAFETY: memfd_create with a NUL-terminated name.
    let fd = unsafe {
        libc::memfd_create(
            c"lanefs-channel".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sizing the memfd we own.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), MAP_LEN as libc::off_t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: mapping MAP_LEN bytes of a memfd that long; checked for MAP_FAILED.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            MAP_LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let map = Mapping(p.cast());
    // SAFETY: the mapping is fresh (zeroed) and ours alone until the memfd is sent; the
    // header's non-atomic fields are written once, here.
    unsafe {
        let h = map.0 as *mut Shared;
        (*h).magic = MAGIC;
        (*h).version = VERSION;
    }
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: sealing the memfd we own.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((fd, map))
}

/// Sends `hello`, with `fd` attached when given.
fn send(sock: &OwnedFd, hello: &Hello, fd: Option<RawFd>) -> bool {
    let bytes = hello.as_bytes();
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // Room for one descriptor's control message (CMSG_SPACE(4) is 24 on 64-bit Linux).
    let mut cbuf = [0u64; 4];
    // SAFETY: a zeroed msghdr is valid; the pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        msg.msg_control = cbuf.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE is a pure computation.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<RawFd>() as u32) } as usize;
        // SAFETY: `msg_control` points to `cbuf`, large enough for one cmsg with an fd.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
        }
    }
    // SAFETY: sendmsg with a valid msghdr.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    n == bytes.len() as isize
}

/// Whether the client's end of `sock` is gone (or it broke the protocol by writing to it).
fn client_gone(sock: &OwnedFd) -> bool {
    let mut b = [0u8; 1];
    // SAFETY: a non-blocking peek into a one-byte buffer.
    let n = unsafe {
        libc::recv(
            sock.as_raw_fd(),
            b.as_mut_ptr().cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    n >= 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EAGAIN)
}

/// Serves one connection until its client goes or the mount stops.
fn serve_conn(conn: &Conn, sock: &OwnedFd, ctx: &Ctx, dispatch: &dyn Dispatch, counted: impl Fn()) {
    let s = conn.map.shared();
    let mut req_buf = vec![0u8; BUF_LEN];
    let mut reply = vec![0u8; BUF_LEN];
    AWAKE.fetch_add(1, Relaxed);
    loop {
        if !wait_for_request(s, sock) {
            break;
        }
        let len = (s.req_len.load(Acquire) as usize).min(BUF_LEN);
        // SAFETY: the buffer is BUF_LEN bytes inside the mapping. The client owns it while
        // it prepares a request and must not touch it between REQUEST and REPLY; one that
        // does only garbles its own request, which is copied out once here and decoded
        // from the copy, never from shared memory.
        unsafe { std::ptr::copy_nonoverlapping(conn.map.buf(), req_buf.as_mut_ptr(), len) };
        counted();
        let n = answer(&req_buf[..len], &mut reply, ctx, dispatch);
        // SAFETY: `n` <= BUF_LEN bytes into the buffer, which the client reads only once
        // it sees REPLY, stored after this copy.
        unsafe { std::ptr::copy_nonoverlapping(reply.as_ptr(), conn.map.buf(), n) };
        s.reply_len.store(n as u32, Release);
        s.spin_ns
            .store(spin_now().as_nanos().min(u32::MAX.into()) as u32, Relaxed);
        s.state.store(REPLY, SeqCst);
        if s.client_sleeping.load(SeqCst) != 0 {
            futex_wake(&s.state);
        }
    }
    AWAKE.fetch_sub(1, Relaxed);
    s.closed.store(1, SeqCst);
    futex_wake(&s.state);
}

/// Waits until the client stores REQUEST: spins ([`spin_now`], offering the CPU now and
/// then), then sleeps on the futex, looking every [`IDLE_CHECK`] whether the client is
/// still there and the channel open. False when the connection ends. The thread counts in
/// [`AWAKE`] except while it sleeps.
fn wait_for_request(s: &Shared, sock: &OwnedFd) -> bool {
    let spin_end = Instant::now() + spin_now();
    let mut spins = 0u32;
    loop {
        if s.closed.load(Relaxed) != 0 {
            return false;
        }
        let st = s.state.load(Acquire);
        if st == REQUEST {
            return true;
        }
        spins += 1;
        if spins % 64 != 0 {
            std::hint::spin_loop();
            continue;
        }
        if Instant::now() < spin_end {
            std::thread::yield_now();
            continue;
        }
        s.server_sleeping.store(1, SeqCst);
        let st = s.state.load(SeqCst);
        if st == REQUEST {
            s.server_sleeping.store(0, Relaxed);
            return true;
        }
        AWAKE.fetch_sub(1, Relaxed);
        let woken = futex_wait(&s.state, st, IDLE_CHECK);
        AWAKE.fetch_add(1, Relaxed);
        s.server_sleeping.store(0, Relaxed);
        if !woken && client_gone(sock) {
            return false;
        }
    }
}

/// Serves one request copied out of the channel; writes the reply (out header and body)
/// into `reply` and returns its length.
fn answer(req: &[u8], reply: &mut [u8], ctx: &Ctx, dispatch: &dyn Dispatch) -> usize {
    let hlen = size_of::<fuse_out_header>();
    let (errno, unique, body) = match Request::parse(req) {
        None => (Errno::EINVAL.code(), 0, 0),
        Some(r) => {
            let (tx, rx) = std::sync::mpsc::sync_channel::<i32>(1);
            let later = move || {
                let tx = tx.clone();
                Pending::new(move |e| {
                    let _ = tx.send(e);
                })
            };
            let mut out = Out::new(&mut reply[hlen..]);
            let errno = match dispatch.dispatch(&r, Caller::Known(ctx), &mut out, &later) {
                Answer::Reply(e) => e,
                Answer::Later => rx.recv().unwrap_or(libc::EIO),
                Answer::None => libc::EIO,
            };
            (errno, r.h.unique, out.len())
        }
    };
    let h = out_header(unique, errno, body);
    reply[..hlen].copy_from_slice(h.as_bytes());
    h.len as usize
}
