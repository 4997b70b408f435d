//! # lanefs: the engine
//!
//! An in-memory POSIX namespace where operations on different names never wait for each
//! other: a lookup takes no directory lock and no reference count (only a read lock on one of
//! 4096 shards of the name table, chosen by the name's hash), directory mutations lock a
//! stripe chosen by a hash of the name,
//! and no counter, allocator or table is shared by every operation. It is the core of the
//! lanefs filesystem; the FUSE server (`lanefs-fuse`) and the benchmarks (`lanefs-bench`) are
//! thin layers on top.
//!
//! The engine has no FUSE code, but it serves one kind of caller differently: the kernel,
//! serving a process through a mount, which the FUSE server names on every call it makes
//! ([`Via::Kernel`], [`Ctx::via_kernel`]). For such a caller every inode an operation returns
//! carries a lookup reference that [`Filesystem::forget`] drops (the kernel keeps an inode,
//! and names it by number, until its FORGET), and an inode is freed only once those are gone
//! too; a readdirplus leaves out the attributes of a file that has had several names (the
//! kernel would count its links down twice); the checks the kernel makes before it sends a
//! request are left to it (`fs.protected_hardlinks` and `fs.protected_symlinks`, writing
//! `security.*` attributes, the
//! removal of set-id bits before a write); and its changes are not reported to the
//! invalidation sink ([`notify`]), since the kernel made them. [`Via`] lists each;
//! docs/DESIGN.md §2.2 says why.
//!
//! Two APIs:
//! - the **inode API** on [`Filesystem`] (lookup, getattr, setattr, create, mkdir, unlink,
//!   rename, open, read, write, readdir, xattrs, ...), each call taking the caller's
//!   credentials ([`Ctx`]) and returning Linux errnos ([`Errno`]) — what the FUSE server
//!   speaks;
//! - the **path API** on [`Client`], in the spirit of `std::fs`, for programs that embed a
//!   filesystem.
//!
//! ```
//! use lanefs::{Client, Config, Filesystem};
//! use std::sync::Arc;
//!
//! let fs = Arc::new(Filesystem::new(Config::default()));
//! let c = Client::root(fs.clone());
//! c.create_dir_all("/spool/in")?;
//! c.write("/spool/in/msg-1", b"hello")?;
//! c.rename("/spool/in/msg-1", "/spool/done")?;
//! assert_eq!(c.read("/spool/done")?, b"hello");
//! assert_eq!(c.read_dir("/spool")?.len(), 2);
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! Semantics follow Linux tmpfs; the locking rules are in [`locking`]; durability goes
//! through [`Store`], which takes a [`Record`] of every change (docs/RECORDS.md).
//!
//! Module map: `fs/` (the operations: policy in `namespace.rs` and `file.rs`, the change
//! itself in `apply.rs`, recovery in `recovery.rs`), [`locking`] (every lock class and its
//! order), `dir/` (directory entry tables and the removal protocol), `revoke` (the grace
//! period that orders entry changes before a change of their directory's permission),
//! `table` (inode table),
//! `inode` (inode lifecycle), `id` (inode numbers and generations), `record` (records and the
//! store interface), `attr` (attributes), `data` (file pages), `perm` (credentials and
//! permissions), `handle` (open files), `xattr` (extended attributes), `quota` (limits),
//! `slots` (per-thread state), `stats` (counters), `path` (the path API), `sync` (the atomics
//! loom checks).

#![deny(missing_docs)]

mod acl;
mod attr;
mod data;
mod dir;
mod errno;
mod fs;
mod handle;
mod id;
mod inode;
mod limits;
pub mod locking;
pub mod notify;
mod path;
mod perm;
mod quota;
mod record;
mod revoke;
mod slots;
mod stats;
mod sync;
mod table;
mod time;
mod xattr;

pub use attr::{
    Attr, FS_APPEND_FL, FS_IMMUTABLE_FL, FS_NOATIME_FL, FS_NODUMP_FL, FileType, STATX_ATTR_APPEND,
    STATX_ATTR_IMMUTABLE, STATX_ATTR_NODUMP, STATX_ATTRS, SetAttr, TimeSet,
};
pub use data::{PAGE, PageEpochs};
pub use dir::NAME_MAX;
pub use errno::{Errno, Result};
pub use fs::{
    Atime, CheckReport, Config, DirEnd, DirEntry, ENTRY_BYTES, EvictionHold, FALLOC_FL_KEEP_SIZE,
    FALLOC_FL_PUNCH_HOLE, Filesystem, INODE_BYTES, InodeRef, Locking, MAX_FILE_SIZE,
    RENAME_EXCHANGE, RENAME_NOREPLACE, RENAME_WHITEOUT, Recovery, ReplayError, SYMLINK_MAX, StatFs,
    TruncateBy,
};
pub use handle::Fh;
pub use id::{Generation, Ino, InodeId, ROOT_INO};
pub use path::{At, Client, DirEntryInfo, File, Metadata, OpenOptions};
pub use perm::{Ctx, MAY_EXEC, MAY_READ, MAY_WRITE, Via, caps};
pub use record::{
    AttrChange, Attributes, DecodeError, LoadedEntry, LoadedInode, MemoryStore, NewInode, Record,
    RecordSummary, Store, SyncDone, effect,
};
pub use stats::{LockClass, LockStat, Op, StatsSnapshot};
pub use time::Timespec;
pub use xattr::{XATTR_CREATE, XATTR_REPLACE};
