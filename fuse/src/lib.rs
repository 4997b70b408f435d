//! # lanefs-fuse: the FUSE server
//!
//! A thin translation layer (DESIGN §2): each FUSE request is decoded by `fuser`, turned into
//! exactly one call on the engine's inode API with the caller's credentials, and the result or
//! errno is encoded back. The server keeps no state of its own: lookup counts, handles,
//! generations and readdir cookies are the engine's (`Ctx::count_lookups` makes every entry
//! the engine returns carry one lookup reference, which FORGET drops).
//!
//! ## What is negotiated with the kernel, and why
//! - `FUSE_PARALLEL_DIROPS`: lookups and readdir in one directory run in parallel in the
//!   kernel (without it the kernel serialises them per directory, and lanefs's lock-free
//!   lookups would be wasted). Creates, unlinks and renames are still serialised per
//!   directory by the kernel's own `i_rwsem` before the request reaches lanefs: through a
//!   mount, one directory's mutations cannot run in parallel whatever the server does.
//! - `FUSE_DO_READDIRPLUS` + `FUSE_READDIRPLUS_AUTO`: `ls -l` gets names and attributes in one
//!   round trip.
//! - `FUSE_ATOMIC_O_TRUNC`: `open(O_TRUNC)` is one request, not open + setattr. The kernel
//!   sends `open(O_RDONLY|O_TRUNC)` before its own check that the file is not a running
//!   program, so the server makes that check (`ETXTBSY`) from the exec opens it has seen.
//! - `FUSE_CACHE_SYMLINKS`: symlink targets are cached in the page cache.
//! - one request thread per CPU, each with its own cloned `/dev/fuse` descriptor.
//!
//! ## Round trips saved (every change goes through this mount, so caches stay valid)
//! - a missing name is answered with a negative entry cached for the entry timeout, so
//!   creating a new name costs no LOOKUP;
//! - files are opened with `FOPEN_KEEP_CACHE`: reading a file again after reopening it is
//!   served from the page cache;
//! - files are opened with `FOPEN_NOFLUSH`: a close sends no FLUSH (there is nothing to write
//!   back at close).
//!
//! What remains per create + close + unlink of one name is LOOKUP (the kernel drops the
//! negative dentry an unlink leaves), CREATE, RELEASE, UNLINK, a FORGET, and two GETATTRs of
//! the directory: a create or unlink invalidates the directory's cached attributes, and
//! `default_permissions` fetches them again for the next permission check.
//! - `default_permissions`: the kernel checks permissions too, with the caller's full group
//!   list, on every step of a path walk, including cached dentries that never reach lanefs.
//!   lanefs checks again on every request that does reach it (so the library is safe on its
//!   own); the two use the same POSIX rules.
//!
//! ## Timeouts
//! Entries and attributes are cached by the kernel for [`MountConfig::ttl`] (default 60 s).
//! That is safe because lanefs is the only writer: changes through the mount are made by the
//! kernel, which updates or invalidates its own caches, and changes a program makes through
//! the library while the filesystem is mounted ([`mount_background`]) are reported by the
//! engine ([`lanefs::notify`]) and sent to the kernel as `FUSE_NOTIFY_INVAL_ENTRY` (a name
//! created, removed or replaced) and `FUSE_NOTIFY_INVAL_INODE` (attributes, and the page-cache
//! range a write or truncate changed) before the library call returns.
//!
//! ## Mounting
//! As root lanefs mounts with `mount(2)` itself, with type `fuse.lanefs`; otherwise through
//! `fusermount3` (see `mnt.rs`).

mod control;
mod mnt;
mod server;

pub use control::{
    SocketGuard, serve as serve_control, socket_path, stats as read_stats, stats_json,
};
pub use fuser::MountOption;
pub use mnt::{FS_TYPE, mount_id_at};
pub use server::{Mount, MountConfig, Server, mount, mount_background};
