//! # lanefs-fuse: the FUSE server
//!
//! Serves a lanefs [`Filesystem`](lanefs::Filesystem) through a FUSE mount, so that every
//! program on the machine can use it ([`mount`], [`mount_background`], as [`MountConfig`]
//! says). A thin translation layer (docs/DESIGN.md §2); what it negotiates with the kernel,
//! and why, is docs/DESIGN.md §7.
//!
//! ## Contract
//! - **One engine call per request.** Each request is turned into exactly one call on the
//!   engine's inode API with the caller's credentials (for the kernel's requests a
//!   [`lanefs::Via::Kernel`] context: every entry returned carries one lookup reference,
//!   which FORGET drops), and the result or errno is encoded back. The server keeps no
//!   state a file needs: lookup counts, handles, generations and readdir cookies are the
//!   engine's.
//! - **Every request is answered once** (FORGET, BATCH_FORGET and INTERRUPT not at all), by
//!   the request thread or, for FSYNC and FSYNCDIR, by whichever thread sees the store's
//!   flush; a pending answer that is dropped answers EIO. Nothing a request holds can panic
//!   the server: what does not decode is answered EINVAL, an opcode not served ENOSYS.
//! - **One seam.** Every transport (`/dev/fuse`, io_uring, next the channel of `lanefs run`)
//!   serves requests through the `Dispatch` trait (`dispatch.rs`, which says how a transport
//!   uses it) and knows nothing else of the server. The server imports no transport; its
//!   notifications go through `notify.rs` (which writes with `devfuse.rs`'s one-`write`
//!   helper) to the session's first `/dev/fuse` descriptor, the only place the kernel takes
//!   them, whichever transport carries the requests.
//! - **The kernel's caches stay right.** Changes through the mount are the kernel's own; a
//!   change a program makes through the library while the filesystem is mounted is sent to
//!   the kernel as an invalidation before the library call returns (`notify.rs`,
//!   [`lanefs::notify`]).
//! - **A session ends cleanly.** It ends when the filesystem is unmounted or the session
//!   aborted; a server that is killed leaves nothing behind (`session.rs`).
//!
//! ## Module map
//! From the wire up (no module imports one below it, except that `notify.rs` writes through
//! `devfuse.rs`'s one-`write` helper):
//! - `abi.rs`: the kernel ABI's structures (`polyfuse-kernel`, and what it lacks);
//! - `wire.rs`: a request (`Request`), the reply body being written (`Out`), how a request is answered (`Answer`, `Pending`), the reply's out header;
//! - `creds.rs`: the caller's credentials, its supplementary groups read from `/proc`;
//! - `dispatch.rs`: **the seam**: `Dispatch` and `Caller`;
//! - `info.rs`: [`SessionInfo`], what a running session tells `lanefs stats`;
//! - `devfuse.rs`: the `/dev/fuse` transport;
//! - `notify.rs`: kernel cache invalidations (`Notifier`, `KernelCache`);
//! - `server/`: the dispatcher, [`Server`]: the opcode table (`mod.rs`) and the handlers, by
//!   what they serve (`names.rs`, `files.rs`, `dirs.rs`, `xattrs.rs`, `ioctl.rs`);
//! - `handoff.rs`, `uring.rs`: the io_uring transport and its queue threads' scheduling;
//! - `session.rs`: INIT negotiation, the choice of transport ([`Uring`]), serving a session
//!   until it ends;
//! - `mount/`: mounting and unmounting ([`mount`], [`Mount`], [`MountConfig`]; `mount(2)` or
//!   `fusermount3` in `attach.rs`; the kernel mount flags, [`MOUNT_FLAGS`], in `flags.rs`);
//! - `control.rs`: the control socket that `lanefs stats` reads.
//!
//! ## Locks of the FUSE crate, and their order
//! Every lock the server takes, in the only order any thread takes them (a lock is never
//! taken while one after it in this list is held):
//! 1. the `ReadEnds` shards (`server/listings.rs`): one shard at a time; held across the
//!    engine's `read_end` (`Server::dir_end`, so engine locks come after it) and nothing
//!    else.
//! 2. the engine's own locks (`engine/src/locking.rs`), taken inside engine calls only.
//! 3. leaves, each taken with no other lock of this list held and never across an engine
//!    call: a ring queue's mailbox (`uring.rs`, `Mailbox::done`), held only to push or take
//!    completed answers, never across a system call; the FORGET count's lock
//!    (`server/forgets.rs`), held only to wait for a FORGET (the wait lets it go) or to wake
//!    those waiting; a `KernelNames` shard (`server/kernel_names.rs`), held only to mark a
//!    name or count a READDIR before the engine call, or to read and take them out when a
//!    new name is reported; the guard's list of queue threads (`handoff.rs`, `Guard::threads`), held
//!    to add or remove a thread or to sample them, never across anything that waits.
//! 4. a `/dev/fuse` descriptor's kernel side: a reply or notification is one `write`, so
//!    replies from several threads never interleave.
//!
//! The kernel's locks matter too: an entry invalidation takes the directory's `i_rwsem`, so
//! none is ever sent from a request thread (which may be serving a request the kernel made
//! under that lock); inode invalidations take no inode lock and may be (`server/dirs.rs`,
//! `moved_dirs` and `names_changed`). A prune (`FUSE_NOTIFY_PRUNE`) takes no inode lock, but
//! the inodes the kernel drops for it may wait for their pages' writeback, which request
//! threads serve: the engine's eviction passes ask for prunes, and a thread of their own
//! sends them (`server/sink.rs`, `Pruner`). Per-thread state (the credentials cache, `creds.rs`;
//! each transport's buffers) takes no lock; the request counters of [`SessionInfo`] are
//! atomics.

mod abi;
mod channel;
mod control;
mod creds;
mod devfuse;
mod dispatch;
mod handoff;
mod info;
mod mount;
mod named_socket;
mod notify;
mod server;
mod session;
mod uring;
mod wire;

pub use control::{
    SocketGuard, serve as serve_control, socket_path, stats as read_stats, stats_json,
};
pub use info::SessionInfo;
pub use mount::{
    FS_TYPE, MOUNT_FLAGS, Mount, MountConfig, MountFlag, MountOption, Mounted, mount,
    mount_background, mount_dev_at, mount_flag, mount_flags_at, mount_id_at,
};
pub use server::Server;
pub use session::Uring;
