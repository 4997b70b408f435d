//! lanefs's FUSE session layer: INIT negotiation, request decoding, replies, notifications,
//! and the two transports that carry requests and replies between the kernel and
//! [`Server::dispatch`].
//!
//! No Rust FUSE crate serves requests through io_uring (fuser's issue 380), and fuser's
//! request decoding and reply types are private, so lanefs has its own session layer; the
//! structures of the protocol come from a crate (`abi.rs`), the ring from `io-uring`.
//! `fuser` is used only to mount through `fusermount3` when not root (`server.rs`).
//!
//! ## Requests and replies
//! A request is its `fuse_in_header`, its opcode's fixed-size argument structure (`arg`,
//! which may be empty) and what follows (`data`: names, written bytes). The kernel lays a
//! request out that way on both transports: through `/dev/fuse` in one buffer, through
//! io_uring with the argument structure in the entry's `op_in` and the rest in its payload
//! buffer ([`arg_size`] says where the structure ends). [`Server::dispatch`] makes exactly
//! one engine call per request and writes the reply body into an [`Out`] (the transport's
//! own buffer: the bytes after the out header of `/dev/fuse`'s reply buffer, or the ring
//! entry's payload), returning [`Answer::Reply`] with an errno (0: the body is the answer),
//! [`Answer::None`] for requests that take no reply (FORGET, BATCH_FORGET, INTERRUPT), or
//! [`Answer::Later`] when it handed a [`Pending`] to someone who answers later (FSYNC and
//! FSYNCDIR wait for the store's group commit on the committer's thread, not the request
//! thread's). A [`Pending`] is answered exactly once: dropped unanswered, it answers EIO.
//! Kernel input that does not decode (a short argument, a name without its NUL) is answered
//! EINVAL; nothing the kernel sends can panic the server.
//!
//! ## Transports
//! - **`/dev/fuse`** ([`serve_dev`]): [`MountConfig::threads`](crate::MountConfig) threads,
//!   each with its own descriptor cloned onto the session (`FUSE_DEV_IOC_CLONE`, so each has
//!   its own processing queue in the kernel), each reading a request, answering it with one
//!   `write`, and reading the next. A [`Pending`] writes its reply to the descriptor its
//!   request came from (the kernel looks the request up in that descriptor's queue).
//! - **io_uring** (`uring.rs`), when the kernel offers `FUSE_OVER_IO_URING` (Linux 6.14 on,
//!   with `fuse.enable_uring=1`), the mount does not say `uring=off`, and this process can
//!   set up an io_uring ([`init`] tries one first). `uring=on` without it fails the mount
//!   (INIT refused, with the reason); `uring=auto` serves through `/dev/fuse`, saying why.
//!
//! Notifications (`FUSE_NOTIFY_INVAL_ENTRY` / `_INODE`, [`Notifier`]) are written to the
//! session's first `/dev/fuse` descriptor on either transport: the kernel takes them only
//! there. FORGET, BATCH_FORGET and INTERRUPT also come through `/dev/fuse` on either
//! transport (the kernel queues them outside the ring), so an io_uring session keeps one
//! `/dev/fuse` thread for them.
//!
//! **Interrupts** are read and not acted on: every request lanefs answers finishes on its own
//! without waiting for anything a caller could give up on, except FSYNC, which waits at most
//! one group commit of the store. The kernel allows a server to ignore an interrupt; the
//! original request is answered as usual (once: an early EINTR would have to race the
//! committer's answer).
//!
//! ## End of a session
//! The kernel ends a session when the filesystem is unmounted (a lazily detached mount: when
//! its last open file is closed) or aborted (`/sys/fs/fuse/connections/N/abort`): reads of
//! `/dev/fuse` then fail with ENODEV, ring entries complete with ENOTCONN, and each thread
//! exits; [`serve`] returns once every thread has. A reply written after that is dropped by
//! the kernel (ENOENT / ENODEV, ignored). A server that is killed leaves nothing behind: the
//! kernel aborts the session when the last `/dev/fuse` descriptor and ring are closed.
//!
//! ## Locks of the FUSE crate, and their order
//! Every lock the server takes, in the only order any thread takes them (a lock is never
//! taken while one after it in this list is held):
//! 1. `Server::read_ends` shards (`server.rs`): one shard at a time; held across the engine's
//!    `read_end` (so engine locks come after it) and nothing else.
//! 2. the engine's own locks (`engine/src/locking.rs`), taken inside engine calls only.
//! 3. a ring queue's mailbox (`uring.rs`, `Mailbox::done`): a leaf, held only to push or
//!    take completed [`Pending`] answers; never across an engine call or a system call.
//! 4. a `/dev/fuse` descriptor's kernel side: a reply or notification is one `write`, so
//!    replies from several threads never interleave.
//!
//! The kernel's locks matter too: an entry invalidation takes the directory's `i_rwsem`, so
//! none is ever sent from a request thread (which may be serving a request the kernel made
//! under that lock); inode invalidations take no inode lock and may be (`server.rs`,
//! `moved_dirs`). Per-thread state (the credentials cache, `creds.rs`; each transport's
//! buffers) takes no lock; the request counters of [`SessionInfo`] are atomics.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

use lanefs::Errno;
use zerocopy::{FromBytes, Immutable, IntoBytes};

use crate::abi::*;
use crate::server::Server;

/// The largest write (and read) lanefs accepts in one request: 1 MiB, the kernel's default
/// request size limit (`fs.fuse.max_pages_limit`, 256 pages).
pub(crate) const MAX_WRITE: usize = 1 << 20;
/// Pages per request asked for in INIT.
const MAX_PAGES: u16 = 256;
/// The newest ABI minor version whose structures this layer uses; the kernel's if older.
const MINOR: u32 = 40;

/// Which transport a mount uses (`-o uring=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Uring {
    /// io_uring when the kernel offers it, `/dev/fuse` otherwise.
    #[default]
    Auto,
    /// io_uring, or the mount fails.
    On,
    /// `/dev/fuse` only.
    Off,
}

impl std::str::FromStr for Uring {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Uring::Auto),
            "on" => Ok(Uring::On),
            "off" => Ok(Uring::Off),
            _ => Err(format!("bad uring '{s}' (on, off or auto)")),
        }
    }
}

impl Uring {
    /// The default: `auto`, or what the environment variable `LANEFS_URING` says (`on`,
    /// `off`, `auto`), so that a test run can put every mount it makes on one transport.
    pub fn from_env() -> Uring {
        std::env::var("LANEFS_URING")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_default()
    }
}

/// What a running session tells `lanefs stats`: its transport and how many requests it has
/// answered.
#[derive(Debug, Default)]
pub struct SessionInfo {
    /// 0: INIT not answered yet; 1: `/dev/fuse`; 2: io_uring.
    transport: AtomicU8,
    /// io_uring queues (0 on `/dev/fuse`).
    queues: AtomicU64,
    /// Requests read, per serving thread (a slot each, on its own cache line).
    counts: Counters,
    /// The io_uring queue threads run SCHED_IDLE under a guard (`handoff.rs`).
    sched_idle: AtomicBool,
    /// Times the guard gave a starving queue thread the normal policy.
    boosts: AtomicU64,
}

#[derive(Debug, Default)]
#[repr(align(64))]
struct Slot(AtomicU64);

#[derive(Debug)]
struct Counters(Box<[Slot]>);

impl Default for Counters {
    fn default() -> Self {
        Counters((0..COUNTER_SLOTS).map(|_| Slot::default()).collect())
    }
}

const COUNTER_SLOTS: usize = 64;

impl SessionInfo {
    /// `"io_uring"`, `"/dev/fuse"`, or `"starting"` before INIT is answered.
    pub fn transport(&self) -> &'static str {
        match self.transport.load(Ordering::Relaxed) {
            1 => "/dev/fuse",
            2 => "io_uring",
            _ => "starting",
        }
    }

    /// Whether requests are served through io_uring.
    pub fn is_uring(&self) -> bool {
        self.transport.load(Ordering::Relaxed) == 2
    }

    /// The io_uring queues (one per possible CPU), 0 on `/dev/fuse`.
    pub fn queues(&self) -> u64 {
        self.queues.load(Ordering::Relaxed)
    }

    /// Requests received so far (FORGETs included), on both transports.
    pub fn requests(&self) -> u64 {
        self.counts
            .0
            .iter()
            .map(|s| s.0.load(Ordering::Relaxed))
            .sum()
    }

    pub(crate) fn count(&self, slot: usize) {
        self.counts.0[slot % COUNTER_SLOTS]
            .0
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn set_transport(&self, uring: bool, queues: usize) {
        self.queues.store(queues as u64, Ordering::Relaxed);
        self.transport
            .store(if uring { 2 } else { 1 }, Ordering::Relaxed);
    }

    /// Whether the io_uring queue threads run SCHED_IDLE under a guard (`handoff.rs`).
    pub fn sched_idle(&self) -> bool {
        self.sched_idle.load(Ordering::Relaxed)
    }

    /// Times a starving queue thread was given the normal policy (`handoff.rs`).
    pub fn boosts(&self) -> u64 {
        self.boosts.load(Ordering::Relaxed)
    }

    pub(crate) fn set_sched_idle(&self) {
        self.sched_idle.store(true, Ordering::Relaxed);
    }

    pub(crate) fn count_boost(&self) {
        self.boosts.fetch_add(1, Ordering::Relaxed);
    }

    /// One line saying how the mount is served.
    pub fn describe(&self) -> String {
        if self.is_uring() {
            let idle = if self.sched_idle() {
                ", SCHED_IDLE"
            } else {
                ""
            };
            format!("io_uring ({} queues, one per CPU{idle})", self.queues())
        } else {
            self.transport().to_string()
        }
    }
}

/// One decoded request.
pub(crate) struct Request<'a> {
    pub h: fuse_in_header,
    /// The opcode's argument structure (as many bytes of it as came).
    pub arg: &'a [u8],
    /// Everything after it.
    pub data: &'a [u8],
}

/// How many bytes of a request's arguments are its opcode's fixed structure (the first
/// argument the kernel sends, which io_uring puts in `op_in`); the rest is `data`.
pub(crate) fn arg_size(opcode: u32) -> usize {
    match opcode {
        FUSE_FORGET => size_of::<fuse_forget_in>(),
        FUSE_GETATTR => size_of::<fuse_getattr_in>(),
        FUSE_SETATTR => size_of::<fuse_setattr_in>(),
        FUSE_MKNOD => size_of::<fuse_mknod_in>(),
        FUSE_MKDIR => size_of::<fuse_mkdir_in>(),
        FUSE_RENAME => size_of::<fuse_rename_in>(),
        FUSE_RENAME2 => size_of::<fuse_rename2_in>(),
        FUSE_LINK => size_of::<fuse_link_in>(),
        FUSE_OPEN | FUSE_OPENDIR => size_of::<fuse_open_in>(),
        FUSE_READ | FUSE_READDIR | FUSE_READDIRPLUS => size_of::<fuse_read_in>(),
        FUSE_WRITE => size_of::<fuse_write_in>(),
        FUSE_RELEASE | FUSE_RELEASEDIR => size_of::<fuse_release_in>(),
        FUSE_FSYNC | FUSE_FSYNCDIR => size_of::<fuse_fsync_in>(),
        // Without FUSE_SETXATTR_EXT (not asked for) the 8-byte form.
        FUSE_SETXATTR => size_of::<fuse_setxattr_in>(),
        FUSE_GETXATTR | FUSE_LISTXATTR => size_of::<fuse_getxattr_in>(),
        FUSE_FLUSH => size_of::<fuse_flush_in>(),
        FUSE_ACCESS => size_of::<fuse_access_in>(),
        FUSE_CREATE | FUSE_TMPFILE => size_of::<fuse_create_in>(),
        FUSE_INTERRUPT => size_of::<fuse_interrupt_in>(),
        FUSE_BATCH_FORGET => size_of::<fuse_batch_forget_in>(),
        FUSE_IOCTL => size_of::<fuse_ioctl_in>(),
        FUSE_FALLOCATE => size_of::<fuse_fallocate_in>(),
        FUSE_LSEEK => size_of::<fuse_lseek_in>(),
        FUSE_INIT => size_of::<fuse_init_in_ext>(),
        // LOOKUP, UNLINK, RMDIR, SYMLINK, REMOVEXATTR (names only), READLINK, STATFS,
        // DESTROY (nothing), and opcodes lanefs answers ENOSYS without reading them.
        _ => 0,
    }
}

impl<'a> Request<'a> {
    /// Splits what one read of `/dev/fuse` returned.
    pub(crate) fn from_dev(buf: &'a [u8]) -> Option<Request<'a>> {
        let (h, rest) = fuse_in_header::read_from_prefix(buf).ok()?;
        let rest = rest.get(..(h.len as usize).checked_sub(size_of::<fuse_in_header>())?)?;
        let (arg, data) = rest.split_at(arg_size(h.opcode).min(rest.len()));
        Some(Request { h, arg, data })
    }

    /// The argument structure; EINVAL when the kernel sent less of it.
    pub(crate) fn arg<T: FromBytes>(&self) -> Result<T, Errno> {
        T::read_from_prefix(self.arg)
            .map(|(t, _)| t)
            .map_err(|_| Errno::EINVAL)
    }

    /// `data` as NUL-terminated strings: the first and what follows its NUL.
    pub(crate) fn name(&self) -> Result<(&'a [u8], &'a [u8]), Errno> {
        cstr(self.data)
    }
}

/// The string up to the first NUL of `b`, and what follows the NUL.
pub(crate) fn cstr(b: &[u8]) -> Result<(&[u8], &[u8]), Errno> {
    let n = b.iter().position(|&c| c == 0).ok_or(Errno::EINVAL)?;
    Ok((&b[..n], &b[n + 1..]))
}

/// A reply body being written into a transport's buffer.
pub(crate) struct Out<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl<'a> Out<'a> {
    pub(crate) fn new(buf: &'a mut [u8]) -> Out<'a> {
        Out { buf, len: 0 }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Appends `b`; false (and nothing appended) when it does not fit.
    pub(crate) fn push(&mut self, b: &[u8]) -> bool {
        match self.buf.get_mut(self.len..self.len + b.len()) {
            Some(d) => {
                d.copy_from_slice(b);
                self.len += b.len();
                true
            }
            None => false,
        }
    }

    pub(crate) fn push_obj<T: IntoBytes + Immutable>(&mut self, t: &T) -> bool {
        self.push(t.as_bytes())
    }

    /// Up to `n` bytes of room after what was written, for [`Out::grow`] to keep.
    pub(crate) fn room(&mut self, n: usize) -> &mut [u8] {
        let end = (self.len + n).min(self.buf.len());
        &mut self.buf[self.len..end]
    }

    /// Keeps `n` bytes written into [`Out::room`].
    pub(crate) fn grow(&mut self, n: usize) {
        self.len = (self.len + n).min(self.buf.len());
    }

    /// Drops everything written.
    pub(crate) fn clear(&mut self) {
        self.len = 0;
    }

    /// Drops what was written after the first `len` bytes.
    pub(crate) fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
}

/// What [`Server::dispatch`] did with a request.
pub(crate) enum Answer {
    /// Answer now: 0 with the body written, or an errno (the body is not sent).
    Reply(i32),
    /// A [`Pending`] answers it.
    Later,
    /// The opcode takes no answer.
    None,
}

/// A request answered later, from another thread (an empty reply with an errno, the only
/// kind lanefs defers). Answered exactly once: dropped without [`Pending::answer`], it
/// answers EIO, so no request is ever left without a reply.
pub(crate) struct Pending(Option<Box<dyn FnOnce(i32) + Send>>);

impl Pending {
    pub(crate) fn new(f: impl FnOnce(i32) + Send + 'static) -> Pending {
        Pending(Some(Box::new(f)))
    }

    /// Sends the answer: 0, or `e`'s errno.
    pub(crate) fn answer(mut self, r: lanefs::Result<()>) {
        if let Some(f) = self.0.take() {
            f(r.err().map_or(0, |e| e.code()));
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f(libc::EIO);
        }
    }
}

/// Writes `b` to `fd` in one `write`.
fn write_all_once(fd: &File, b: &[u8]) -> io::Result<()> {
    // SAFETY: `b` is valid for `b.len()` bytes; the descriptor is open while `fd` lives.
    let n = unsafe { libc::write(fd.as_raw_fd(), b.as_ptr().cast(), b.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sends a reply with no body and `errno` (0: success) for request `unique` to `fd`.
pub(crate) fn write_status(fd: &File, unique: u64, errno: i32) {
    let h = fuse_out_header {
        len: size_of::<fuse_out_header>() as u32,
        error: -errno,
        unique,
    };
    // ENOENT: the request was interrupted and is gone; ENODEV: the session is.
    let _ = write_all_once(fd, h.as_bytes());
}

/// Sends the kernel cache invalidations (`FUSE_NOTIFY_*`) through the session's first
/// `/dev/fuse` descriptor.
#[derive(Clone)]
pub(crate) struct Notifier(pub(crate) Arc<File>);

impl Notifier {
    fn send(&self, code: u32, parts: &[&[u8]]) -> io::Result<()> {
        let len = size_of::<fuse_out_header>() + parts.iter().map(|p| p.len()).sum::<usize>();
        let h = fuse_out_header {
            len: len as u32,
            error: code as i32,
            unique: 0,
        };
        let mut b = Vec::with_capacity(len);
        b.extend_from_slice(h.as_bytes());
        for p in parts {
            b.extend_from_slice(p);
        }
        write_all_once(&self.0, &b)
    }

    /// `FUSE_NOTIFY_INVAL_ENTRY`: the kernel forgets `name` in `parent`.
    pub(crate) fn inval_entry(&self, parent: u64, name: &[u8]) -> io::Result<()> {
        let o = fuse_notify_inval_entry_out {
            parent,
            namelen: name.len() as u32,
            padding: 0,
        };
        self.send(FUSE_NOTIFY_INVAL_ENTRY, &[o.as_bytes(), name, b"\0"])
    }

    /// `FUSE_NOTIFY_INVAL_INODE`: the kernel drops `ino`'s attributes and, for `off >= 0`,
    /// its cached pages in `off..off + len` (`len` 0: to the end).
    pub(crate) fn inval_inode(&self, ino: u64, off: i64, len: i64) -> io::Result<()> {
        let o = fuse_notify_inval_inode_out { ino, off, len };
        self.send(FUSE_NOTIFY_INVAL_INODE, &[o.as_bytes()])
    }
}

/// What INIT settled.
#[derive(Debug)]
pub(crate) struct Negotiated {
    /// The kernel will take io_uring registrations.
    pub uring: bool,
    /// With `uring=auto`: the kernel offered io_uring, but this process cannot set up a ring
    /// (why), so it was not asked for.
    pub no_ring: Option<String>,
}

/// Reads INIT from `dev` and answers it: the capabilities the server needs (module doc of
/// `lib.rs`, "What is negotiated"), and io_uring if `mode` allows, the kernel offers it and
/// this process can set up a ring. With `Uring::On` and no io_uring, INIT is refused and the
/// error says why.
///
/// The ring is tried before io_uring is asked for because a session that settled on
/// io_uring has no way back to `/dev/fuse` short of a registration the kernel refuses:
/// until every queue has registered, Linux holds each new request of the session back
/// instead of sending it through `/dev/fuse` (`fuse_block_alloc`), and a server whose
/// `io_uring_setup(2)` is refused (`kernel.io_uring_disabled`, a container's seccomp
/// profile) could register nothing, leaving every request waiting.
pub(crate) fn init(dev: &File, server: &mut Server, mode: Uring) -> io::Result<Negotiated> {
    let mut buf = vec![0u8; MAX_WRITE + 4096];
    loop {
        let n = match read(dev, &mut buf) {
            Ok(n) => n,
            Err(e) if retry(&e) => continue,
            Err(e) => return Err(e),
        };
        let Some(req) = Request::from_dev(&buf[..n]) else {
            continue;
        };
        if req.h.opcode != FUSE_INIT {
            // Nothing comes before INIT; answer whatever does and wait for it.
            write_status(dev, req.h.unique, libc::EIO);
            continue;
        }
        let (major, minor, max_readahead, offered) =
            match fuse_init_in_ext::read_from_prefix(req.arg) {
                Ok((i, _)) => {
                    let high = if u64::from(i.flags) & FUSE_INIT_EXT != 0 {
                        u64::from(i.flags2) << 32
                    } else {
                        0
                    };
                    (i.major, i.minor, i.max_readahead, u64::from(i.flags) | high)
                }
                Err(_) => match req.arg::<fuse_init_in>() {
                    Ok(i) => (i.major, i.minor, i.max_readahead, u64::from(i.flags)),
                    Err(_) => {
                        write_status(dev, req.h.unique, libc::EINVAL);
                        continue;
                    }
                },
            };
        let mut out = fuse_init_out_ext {
            major: FUSE_KERNEL_VERSION,
            minor: MINOR.min(minor),
            ..Default::default()
        };
        if major > FUSE_KERNEL_VERSION {
            // The kernel sends INIT again with major 7.
            reply_bytes(
                dev,
                req.h.unique,
                &out.as_bytes()[..FUSE_COMPAT_22_INIT_OUT_SIZE],
            );
            continue;
        }
        if major < FUSE_KERNEL_VERSION || minor < 12 {
            write_status(dev, req.h.unique, libc::EPROTO);
            return Err(io::Error::other(format!(
                "the kernel speaks FUSE {major}.{minor}; lanefs needs 7.12 or newer"
            )));
        }
        let uring_offered = offered & FUSE_OVER_IO_URING != 0;
        if mode == Uring::On && !uring_offered {
            write_status(dev, req.h.unique, libc::EPROTO);
            return Err(io::Error::other(format!("uring=on: {}", why_no_uring())));
        }
        let no_ring = match mode {
            Uring::Off => None,
            _ if !uring_offered => None,
            _ => crate::uring::probe()
                .err()
                .map(|e| why_registration_failed(&e)),
        };
        if let (Uring::On, Some(why)) = (mode, &no_ring) {
            write_status(dev, req.h.unique, libc::EPROTO);
            return Err(io::Error::other(format!(
                "uring=on: the kernel offers FUSE over io_uring, but this process cannot set \
                 up an io_uring: {why}"
            )));
        }
        let mut want = u64::from(
            FUSE_ASYNC_READ
                | FUSE_BIG_WRITES
                | FUSE_MAX_PAGES
                | FUSE_PARALLEL_DIROPS
                | FUSE_DO_READDIRPLUS
                | FUSE_READDIRPLUS_AUTO
                | FUSE_CACHE_SYMLINKS
                | FUSE_POSIX_ACL
                | FUSE_DONT_MASK
                | FUSE_EXPORT_SUPPORT,
        ) | FUSE_HANDLE_KILLPRIV_V2;
        if mode != Uring::Off && no_ring.is_none() {
            want |= FUSE_OVER_IO_URING;
        }
        let flags = (want & offered) | FUSE_INIT_EXT;
        server.no_opendir = offered & u64::from(FUSE_NO_OPENDIR_SUPPORT) != 0;
        out.max_readahead = max_readahead;
        out.flags = flags as u32;
        out.flags2 = (flags >> 32) as u32;
        out.max_background = 16;
        out.congestion_threshold = 12;
        out.max_write = MAX_WRITE as u32;
        out.time_gran = 1;
        out.max_pages = MAX_PAGES;
        let body = if minor < 23 {
            &out.as_bytes()[..FUSE_COMPAT_22_INIT_OUT_SIZE]
        } else {
            out.as_bytes()
        };
        reply_bytes(dev, req.h.unique, body);
        return Ok(Negotiated {
            uring: flags & FUSE_OVER_IO_URING != 0,
            no_ring,
        });
    }
}

/// The kernel's switch for FUSE over io_uring (present where it was built with
/// `CONFIG_FUSE_IO_URING`, Linux 6.14 on).
const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Why the kernel did not offer `FUSE_OVER_IO_URING` in INIT, for the error of `uring=on`.
fn why_no_uring() -> String {
    match std::fs::read_to_string(ENABLE_URING) {
        Err(_) => "this kernel has no FUSE over io_uring (Linux 6.14 or newer built with \
                   CONFIG_FUSE_IO_URING is needed; or mount with uring=auto or uring=off)"
            .into(),
        Ok(v) if v.trim() == "N" => format!(
            "FUSE over io_uring is turned off in this kernel (fuse.enable_uring is N; as \
             root: echo Y > {ENABLE_URING}; or mount with uring=auto or uring=off)"
        ),
        // Turned on since the kernel sent INIT.
        Ok(_) => "the kernel did not offer FUSE over io_uring for this mount \
                  (fuse.enable_uring was off when it was made)"
            .into(),
    }
}

/// `e`, an error setting up or registering an io_uring, with the kernel setting that explains
/// it.
fn why_registration_failed(e: &io::Error) -> String {
    const DISABLED: &str = "/proc/sys/kernel/io_uring_disabled";
    let setting = |p: &str| std::fs::read_to_string(p).map(|v| v.trim().to_string());
    match e.raw_os_error() {
        // io_uring_setup(2) refused: io_uring is disabled (2) or limited to a group (1).
        Some(libc::EPERM) => match setting(DISABLED) {
            Ok(v) if v != "0" => format!("{e}: kernel.io_uring_disabled is {v}"),
            _ => format!(
                "{e}: io_uring_setup(2) is refused to this process (a seccomp filter, as \
                 container runtimes install, or a security module)"
            ),
        },
        // The kernel's FUSE refuses ring commands on a connection made without io_uring.
        Some(libc::EOPNOTSUPP) if setting(ENABLE_URING).is_ok_and(|v| v == "N") => {
            format!("{e}: fuse.enable_uring is N")
        }
        _ => e.to_string(),
    }
}

fn reply_bytes(dev: &File, unique: u64, body: &[u8]) {
    let h = fuse_out_header {
        len: (size_of::<fuse_out_header>() + body.len()) as u32,
        error: 0,
        unique,
    };
    let mut b = h.as_bytes().to_vec();
    b.extend_from_slice(body);
    let _ = write_all_once(dev, &b);
}

fn read(fd: &File, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes; the descriptor is open.
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// A read of `/dev/fuse` that should just be made again: interrupted by a signal, or the
/// request it would have returned was interrupted and is gone (ENOENT).
fn retry(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINTR | libc::EAGAIN | libc::ENOENT)
    )
}

/// A new descriptor for the session of `master`, with its own processing queue; `master`
/// itself where cloning fails.
pub(crate) fn clone_dev(master: &Arc<File>) -> Arc<File> {
    let Ok(f) = File::options().read(true).write(true).open("/dev/fuse") else {
        return master.clone();
    };
    let id = master.as_raw_fd() as u32;
    // SAFETY: FUSE_DEV_IOC_CLONE reads one u32 (the session's descriptor) from the pointer.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), FUSE_DEV_IOC_CLONE, &id as *const u32) };
    if r != 0 {
        return master.clone();
    }
    Arc::new(f)
}

/// How long the `/dev/fuse` thread of an io_uring session waits after a FORGET before it
/// reads again (see [`dev_worker`]).
const FORGET_BATCH_WAIT: std::time::Duration = std::time::Duration::from_millis(1);

/// Serves requests from one `/dev/fuse` descriptor until the session ends.
///
/// `side` marks the one `/dev/fuse` thread of an io_uring session, which gets only FORGET,
/// BATCH_FORGET and INTERRUPT. The kernel queues a FORGET for every inode it evicts (each
/// unlinked file's, in the caller's `unlink`) and wakes a reader blocked on the descriptor,
/// often on the other CPU: that wake-up cost the caller more than its whole FUSE request
/// did. So after a FORGET this thread waits [`FORGET_BATCH_WAIT`] before its next read:
/// forgets queued meanwhile wake nobody, and the next read takes them all as one
/// BATCH_FORGET. A FORGET only returns lookup references (an unlinked inode's number is
/// freed a millisecond later); an INTERRUPT is read and not acted on (module doc), so
/// neither is delayed at a cost to any caller.
pub(crate) fn dev_worker(
    fd: Arc<File>,
    server: &Server,
    info: &SessionInfo,
    slot: usize,
    side: bool,
) {
    let mut inbuf = vec![0u8; MAX_WRITE + 4096];
    let hsz = size_of::<fuse_out_header>();
    let mut outbuf = vec![0u8; hsz + MAX_WRITE + 4096];
    loop {
        let n = match read(&fd, &mut inbuf) {
            Ok(n) => n,
            Err(e) if retry(&e) => continue,
            // ENODEV: unmounted or aborted.
            Err(_) => return,
        };
        info.count(slot);
        let Some(req) = Request::from_dev(&inbuf[..n]) else {
            continue;
        };
        let unique = req.h.unique;
        let (hbuf, body) = outbuf.split_at_mut(hsz);
        let mut out = Out::new(body);
        let later = || {
            let fd = fd.clone();
            Pending::new(move |e| write_status(&fd, unique, e))
        };
        match server.dispatch(&req, &mut out, &later) {
            Answer::Reply(e) => {
                let len = if e == 0 { out.len() } else { 0 };
                let h = fuse_out_header {
                    len: (hsz + len) as u32,
                    error: -e,
                    unique,
                };
                hbuf.copy_from_slice(h.as_bytes());
                if let Err(e) = write_all_once(&fd, &outbuf[..hsz + len])
                    && e.raw_os_error() == Some(libc::ENODEV)
                {
                    return;
                }
            }
            Answer::Later | Answer::None => {
                if side && matches!(req.h.opcode, FUSE_FORGET | FUSE_BATCH_FORGET) {
                    std::thread::sleep(FORGET_BATCH_WAIT);
                }
            }
        }
    }
}

/// Serves the session of `dev` (INIT answered) on `threads` `/dev/fuse` threads (or io_uring,
/// `uring.rs`) until it ends.
pub(crate) fn serve(
    dev: Arc<File>,
    server: Arc<Server>,
    info: Arc<SessionInfo>,
    neg: Negotiated,
    threads: usize,
    mode: Uring,
) -> io::Result<()> {
    let ended = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    let spawn_dev =
        |slot: usize, fd: Arc<File>, side: bool, handles: &mut Vec<_>| -> io::Result<()> {
            let (server, info, ended) = (server.clone(), info.clone(), ended.clone());
            handles.push(
                std::thread::Builder::new()
                    .name(format!("lanefs-dev{slot}"))
                    .spawn(move || {
                        dev_worker(fd, &server, &info, slot, side);
                        ended.store(true, Ordering::Release);
                    })?,
            );
            Ok(())
        };
    if let Some(why) = &neg.no_ring {
        eprintln!("lanefs: io_uring cannot be set up ({why}); serving through /dev/fuse");
    }
    if neg.uring {
        match crate::uring::start(&dev, &server, &info, &ended) {
            Ok(ring) => {
                info.set_transport(true, ring.queues());
                // FORGET and INTERRUPT still come through /dev/fuse.
                spawn_dev(COUNTER_SLOTS - 1, dev.clone(), true, &mut handles)?;
                for h in handles {
                    let _ = h.join();
                }
                ring.stop_and_join();
                return Ok(());
            }
            Err(e) if mode == Uring::On || !e.fell_back => {
                // Serve what reaches /dev/fuse while the caller unmounts: with the kernel
                // fallen back, what is in flight; otherwise nothing (new requests wait for a
                // ring that will not come, and fail when the session ends).
                spawn_dev(0, dev.clone(), false, &mut handles)?;
                std::mem::forget(handles);
                let why = why_registration_failed(&e.error);
                return Err(io::Error::other(if mode == Uring::On {
                    format!("uring=on: io_uring registration failed: {why}")
                } else {
                    format!(
                        "io_uring registration failed ({why}), and the kernel still waits for \
                         it: the mount cannot be served"
                    )
                }));
            }
            Err(e) => {
                eprintln!(
                    "lanefs: io_uring registration failed ({}); serving through /dev/fuse",
                    why_registration_failed(&e.error)
                );
            }
        }
    }
    info.set_transport(false, 0);
    for slot in 0..threads.max(1) {
        let fd = if slot == 0 {
            dev.clone()
        } else {
            clone_dev(&dev)
        };
        spawn_dev(slot, fd, false, &mut handles)?;
    }
    for h in handles {
        let _ = h.join();
    }
    Ok(())
}
