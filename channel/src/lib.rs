//! # The channel of `lanefs run`: layout and protocol
//!
//! A program run under `lanefs run` carries a preloaded client (`client/`) that sends some
//! of its calls on paths inside a lanefs mount to the mount's server directly, over shared
//! memory, instead of through the kernel, whose VFS locks a directory exclusively around
//! every create, unlink and rename in it. This crate is what both ends agree on; it has no
//! logic beyond the futex calls.
//!
//! ## Connecting
//! The server of a mount listens on a Unix socket (`SOCK_SEQPACKET`) named after the mount's
//! device number ([`socket_name`]), in `/run/lanefs/` for a mount made by root, else in the
//! mounting user's runtime directory. One connection serves one client thread, which first
//! sends its thread id (a `u32`): credentials are a thread's own (`setfsuid`, raw
//! `setresuid`). On accept the server learns the caller from the socket itself
//! (`SO_PEERCRED`'s process, and `/proc/PID/task/TID` of it for the thread's ids, groups,
//! capabilities and user namespace, checked against the peer's pidfd), never from anything
//! else the client writes (a thread id names only a thread of the connecting process, whose
//! credentials that process has anyway); it refuses a caller in another user namespace than
//! the server's (its ids and capabilities are not the server's to map) and users the mount
//! does not serve (no `allow_other`: only its owner), makes a
//! sealed memfd of [`MAP_LEN`] bytes (the client can neither shrink nor grow it, so nothing
//! it does makes the server fault), and sends a [`Hello`] with the memfd attached
//! (`SCM_RIGHTS`), or a [`Hello`] carrying an errno. The client maps it (`MAP_SHARED`),
//! closes the memfd and keeps the socket only so that the server sees it go (a client that
//! exits or closes it ends the connection).
//!
//! ## One call
//! The mapping starts with a [`Shared`] header; the request and reply buffer is the
//! [`BUF_LEN`] bytes at [`BUF_OFFSET`]. A call:
//! 1. the client writes the request into the buffer, in the FUSE wire layout (a
//!    `fuse_in_header` whose `len` is the request's length, the opcode's argument
//!    structure, then NUL-terminated paths), stores [`REQUEST`] into `state` (Release) and,
//!    if `server_sleeping` is set, wakes the futex on `state`;
//! 2. the server copies the request out of shared memory before reading any of it (the
//!    client could change it meanwhile), serves it, writes the reply (a `fuse_out_header`
//!    and, on success, the body) into the buffer, stores [`REPLY`] (SeqCst) and, if
//!    `client_sleeping` is set, wakes the futex;
//! 3. the client reads the reply.
//!
//! Each side waits for the other by spinning for a moment (only while the busy channels'
//! clients and servers do not outnumber the CPUs: the server says how long in `spin_ns`),
//! then announcing that it sleeps
//! (`*_sleeping` = 1, SeqCst), reading `state` again and `FUTEX_WAIT`ing on it with the
//! value it saw. Either the waker reads the announcement after its own `state` store
//! (both SeqCst) and wakes, or the sleeper reads the new state and does not sleep: no
//! wake-up is lost. Waits have a timeout: the client checks that the server lives (a
//! killed server makes the call fail with ENOTCONN, never hang), the server that the
//! client's socket is still open. A server that stops sets `closed` and wakes the client.
//!
//! ## What is served
//! Only the opcodes below, all of them paths resolved from the filesystem's root (the
//! client strips the mountpoint; relative paths are made absolute with `getcwd` first), so
//! every directory on the way is checked for search permission as the kernel checks it.
//! The server answers the kernel's own opcodes on a channel with ENOSYS: those trust the
//! kernel's checks (a READ by inode number, say) and are never for a client to send. An
//! answer of EXDEV means "not for the channel": the path leaves the filesystem (an
//! absolute symlink, `..` from its root) and the client makes the call through the kernel.

#![deny(missing_docs)]

use std::sync::atomic::AtomicU32;
use std::time::Duration;

pub use polyfuse_kernel::{
    FATTR_ATIME, FATTR_ATIME_NOW, FATTR_GID, FATTR_MODE, FATTR_MTIME, FATTR_MTIME_NOW, FATTR_SIZE,
    FATTR_UID, fuse_attr, fuse_in_header, fuse_mkdir_in, fuse_mknod_in, fuse_out_header,
};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// [`Hello::magic`] and [`Shared::magic`]: "LFCH".
pub const MAGIC: u32 = 0x4C46_4348;
/// The protocol's version; a client and a server of different versions do not connect.
pub const VERSION: u32 = 5;

/// Where the request and reply buffer starts in the mapping (the header has a page).
pub const BUF_OFFSET: usize = 4096;
/// The buffer's length: a request's header and two paths of `PATH_MAX` fit.
pub const BUF_LEN: usize = 12288;
/// The mapping's length.
pub const MAP_LEN: usize = BUF_OFFSET + BUF_LEN;

/// `state`: nothing asked yet.
pub const IDLE: u32 = 0;
/// `state`: a request is in the buffer.
pub const REQUEST: u32 = 1;
/// `state`: the reply is in the buffer.
pub const REPLY: u32 = 2;

/// The first opcode of the channel's own, far above the kernel's (which stop below 100, and
/// CUSE's at 4096).
pub const OP_BASE: u32 = 0x4C46_0000;
/// `stat`/`lstat`: [`StatIn`] and a path; replies [`StatOut`].
pub const OP_STAT: u32 = OP_BASE + 1;
/// `mknod`, and the create of `open(O_CREAT)`: `fuse_mknod_in` and a path; replies
/// [`StatOut`].
pub const OP_MKNOD: u32 = OP_BASE + 2;
/// `mkdir`: `fuse_mkdir_in` and a path; replies [`StatOut`].
pub const OP_MKDIR: u32 = OP_BASE + 3;
/// `unlink`: a path.
pub const OP_UNLINK: u32 = OP_BASE + 4;
/// `rmdir`: a path.
pub const OP_RMDIR: u32 = OP_BASE + 5;
/// `renameat2`: [`RenameIn`], the source path and the target path.
pub const OP_RENAME: u32 = OP_BASE + 6;
/// `linkat`: [`LinkIn`], the existing path and the new one; replies [`StatOut`].
pub const OP_LINK: u32 = OP_BASE + 7;
/// `symlink`: the target and the link's path; replies [`StatOut`].
pub const OP_SYMLINK: u32 = OP_BASE + 8;
/// `readlink`: a path; replies the target's bytes.
pub const OP_READLINK: u32 = OP_BASE + 9;
/// `chmod`, `chown`, `truncate`, `utimensat` on a path: [`SetattrIn`] and a path; replies
/// [`StatOut`].
pub const OP_SETATTR: u32 = OP_BASE + 10;

/// `fsync`/`fdatasync` of a file the client created and has not opened through the kernel
/// (a deferred descriptor): [`FsyncIn`] and the file's path. The server checks that the path
/// names the inode, then waits for the store to make every change so far durable, as the
/// kernel's FSYNC does; EXDEV (the kernel's to do) when the kernel holds the inode, whose
/// dirty pages only the kernel's own FSYNC writes back.
pub const OP_FSYNC: u32 = OP_BASE + 11;

/// Whether `op` is one of the channel's opcodes.
pub fn is_channel_op(op: u32) -> bool {
    (OP_STAT..=OP_FSYNC).contains(&op)
}

/// The argument of [`OP_FSYNC`].
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct FsyncIn {
    /// The inode the path must name (else ESTALE).
    pub ino: u64,
    /// 1 for `fdatasync`, else 0.
    pub datasync: u32,
    /// Zero.
    pub padding: u32,
}

/// [`StatIn::flags`], [`SetattrIn::flags`]: do not follow a symlink in the last component.
pub const NOFOLLOW: u32 = 1;
/// [`LinkIn::flags`]: follow a symlink in the existing path (`AT_SYMLINK_FOLLOW`).
pub const FOLLOW: u32 = 2;
/// [`StatIn::flags`]: say in the reply whether the kernel holds the inode ([`HELD`]); asked
/// only by a client that uses the answer (`lanefs run --warm-stat`).
pub const ASK_HELD: u32 = 4;

/// The argument of [`OP_STAT`].
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct StatIn {
    /// [`NOFOLLOW`], [`ASK_HELD`], or 0.
    pub flags: u32,
    /// Zero.
    pub padding: u32,
}

/// The reply of [`OP_STAT`] and of the calls that make or change an inode: its attributes
/// as the kernel would have had them from a LOOKUP.
#[derive(Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct StatOut {
    /// The attributes (`rdev` in the kernel's `new_encode_dev` form).
    pub attr: fuse_attr,
    /// [`HELD`] (set by [`OP_STAT`] only, when asked: [`ASK_HELD`]) and [`BORN`], or 0.
    pub flags: u32,
    /// Zero.
    pub padding: u32,
    /// With [`BORN`]: the birth time's seconds from the epoch.
    pub btime: i64,
    /// With [`BORN`]: its nanoseconds.
    pub btimensec: u32,
    /// Zero.
    pub padding2: u32,
}

impl StatOut {
    /// The birth time, if the reply has one.
    pub fn birth(&self) -> Option<(i64, u32)> {
        (self.flags & BORN != 0).then_some((self.btime, self.btimensec))
    }
}

/// [`StatOut::flags`]: the kernel holds the inode (a lookup reference), so its own `stat` of
/// the path is answered from its caches, without a round trip to the server.
pub const HELD: u32 = 1;
/// [`StatOut::flags`]: the reply has the inode's birth time (`statx`'s `stx_btime`; an inode a
/// disk store kept from before it kept birth times has none).
pub const BORN: u32 = 2;

/// The argument of [`OP_RENAME`].
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct RenameIn {
    /// `renameat2`'s flags (`RENAME_NOREPLACE`, `RENAME_EXCHANGE`).
    pub flags: u32,
    /// Zero.
    pub padding: u32,
}

/// The argument of [`OP_LINK`].
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct LinkIn {
    /// [`FOLLOW`] or 0.
    pub flags: u32,
    /// Zero.
    pub padding: u32,
}

/// The argument of [`OP_SETATTR`]: what to change, as FUSE's SETATTR says it.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct SetattrIn {
    /// `FATTR_*` bits: which fields below apply.
    pub valid: u32,
    /// [`NOFOLLOW`] or 0.
    pub flags: u32,
    /// New size.
    pub size: u64,
    /// New access time, seconds.
    pub atime: u64,
    /// New modification time, seconds.
    pub mtime: u64,
    /// Nanoseconds of `atime`.
    pub atimensec: u32,
    /// Nanoseconds of `mtime`.
    pub mtimensec: u32,
    /// New permission bits.
    pub mode: u32,
    /// New owner (`u32::MAX`: unchanged, as `chown(-1)`).
    pub uid: u32,
    /// New group (`u32::MAX`: unchanged).
    pub gid: u32,
    /// Zero.
    pub padding: u32,
}

/// What the server sends on accept, with the memfd attached when `error` is 0.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct Hello {
    /// [`MAGIC`].
    pub magic: u32,
    /// [`VERSION`].
    pub version: u32,
    /// 0, or why the server refuses this caller (an errno: EACCES for a user the mount does
    /// not serve).
    pub error: i32,
    /// The mount's device number (`major`), which the client checks against the mount it
    /// means to reach.
    pub dev_major: u32,
    /// The mount's device number (`minor`).
    pub dev_minor: u32,
    /// The server's process id (a client whose call outlives it fails with ENOTCONN).
    pub server_pid: u32,
    /// The mapping's length ([`MAP_LEN`]).
    pub map_len: u32,
    /// Zero.
    pub padding: u32,
}

/// The header at the start of the mapping. Only atomics are written by both sides.
#[repr(C, align(64))]
pub struct Shared {
    /// [`MAGIC`], written by the server before it sends the memfd.
    pub magic: u32,
    /// [`VERSION`].
    pub version: u32,
    /// [`IDLE`], [`REQUEST`] or [`REPLY`]; the futex both sides wait on.
    pub state: AtomicU32,
    /// 1 while the client waits (or is about to wait) on `state`.
    pub client_sleeping: AtomicU32,
    /// 1 while the server waits (or is about to wait) on `state`.
    pub server_sleeping: AtomicU32,
    /// 1 once the server has stopped serving this channel.
    pub closed: AtomicU32,
    /// The request's length (the client's; the server trusts only its own copy).
    pub req_len: AtomicU32,
    /// The reply's length.
    pub reply_len: AtomicU32,
    /// Nanoseconds the client may spin for a reply before it sleeps, set by the server with
    /// each reply: a few microseconds while every busy channel's client and server can each
    /// have a CPU, 0 when they outnumber the CPUs (a spinning client would then keep its
    /// server, or another pair, from running).
    pub spin_ns: AtomicU32,
}

const _: () = assert!(size_of::<Shared>() <= BUF_OFFSET);
const _: () = assert!(BUF_LEN >= 2 * 4096 + 512, "two paths and a header fit");

/// The socket of the mount with device number `major:minor`, inside the server's socket
/// directory.
pub fn socket_name(major: u32, minor: u32) -> String {
    format!("dev-{major}-{minor}.chan")
}

/// `FUTEX_WAIT` on `word` (a shared mapping: not the private futex) while it holds
/// `expected`, for at most `timeout`. Returns false on a timeout, true otherwise (woken,
/// the value changed, or a signal: the caller reads the word again in every case).
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) -> bool {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a valid, aligned u32 for the duration of the call, and `ts` a
    // valid timespec; FUTEX_WAIT only reads them.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        )
    };
    // SAFETY: reading errno is always sound.
    !(r == -1 && unsafe { *libc::__errno_location() } == libc::ETIMEDOUT)
}

/// `FUTEX_WAKE` of one waiter on `word`.
pub fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a valid, aligned u32; FUTEX_WAKE does not access it.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, 1);
    }
}

/// The kernel's `new_decode_dev`: the device number `st_rdev` shows for a FUSE attribute's
/// `rdev`.
pub fn decode_dev(rdev: u32) -> u64 {
    let major = (rdev & 0xfff00) >> 8;
    let minor = (rdev & 0xff) | ((rdev >> 12) & 0xfff00);
    libc::makedev(major, minor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcodes_are_far_from_the_kernels() {
        assert!(!is_channel_op(polyfuse_kernel::FUSE_LOOKUP));
        assert!(!is_channel_op(4096));
        assert!(is_channel_op(OP_STAT) && is_channel_op(OP_FSYNC));
        assert!(!is_channel_op(OP_FSYNC + 1));
    }

    #[test]
    fn device_numbers_decode_as_the_kernel_does() {
        // new_encode_dev(makedev(8, 1)) == 0x801; a large minor spills into the top bits.
        assert_eq!(decode_dev(0x801), libc::makedev(8, 1));
        let (major, minor) = (259u32, 300u32);
        let enc = (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12);
        assert_eq!(decode_dev(enc), libc::makedev(major, minor));
    }

    #[test]
    fn a_futex_wait_times_out_and_a_changed_word_returns_at_once() {
        let w = AtomicU32::new(5);
        assert!(!futex_wait(&w, 5, Duration::from_millis(1)));
        assert!(futex_wait(&w, 6, Duration::from_secs(60)));
    }
}
