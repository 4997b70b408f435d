//! # lanefs-fuse: the FUSE server
//!
//! A thin translation layer (docs/DESIGN.md §2): each FUSE request is decoded by lanefs's own
//! session layer (`session.rs`: INIT, decoding, replies, notifications; the kernel ABI's
//! structures from `polyfuse-kernel`, `abi.rs`), turned into exactly one call on the engine's
//! inode API with the caller's credentials (`creds.rs`), and the result or errno is encoded
//! back. Requests travel through io_uring (`uring.rs`: one queue per CPU, each served by a
//! thread pinned to it) when the kernel offers `FUSE_OVER_IO_URING` and the mount allows it
//! ([`MountConfig::uring`], `-o uring=auto|on|off`), through `/dev/fuse` otherwise; the
//! session layer's module doc lists every lock of this crate and their order. The server keeps no state of its
//! own: lookup counts, handles, generations and readdir cookies are the engine's (a
//! `Via::Kernel` context makes every entry the engine returns carry one lookup reference,
//! which FORGET drops).
//!
//! ## What is negotiated with the kernel, and why
//! - `FUSE_PARALLEL_DIROPS`: lookups and readdir in one directory run in parallel in the
//!   kernel (without it the kernel serialises them per directory, and lanefs's lock-free
//!   lookups would be wasted). Creates, unlinks and renames are still serialised per
//!   directory by the kernel's own `i_rwsem` before the request reaches lanefs: through a
//!   mount, one directory's mutations cannot run in parallel whatever the server does.
//! - `FUSE_DO_READDIRPLUS` + `FUSE_READDIRPLUS_AUTO`: `ls -l` gets names and attributes in one
//!   round trip, except for a file that has had two names or more at once: its entry comes
//!   with node id 0 (the name only), and the kernel looks it up when it needs it. A
//!   directory's entry comes with its attributes but no attribute timeout: the kernel does
//!   not version a directory's attributes against the changes made inside it (it only marks
//!   them stale), so a listing of its parent read before a mkdir in it and applied after
//!   would bring its old link count and times back for the whole timeout; a `stat` after a
//!   listing asks for them again (a GETATTR per directory). The kernel
//!   lowers its cached link count by itself when an unlink or a rename over a name returns;
//!   attributes another request read after lanefs removed the name, applied before that
//!   return, are counted down twice, and a count of 0 makes `link(2)` of a live file fail
//!   with ENOENT until the attributes are read again. A readdirplus refreshes every entry of
//!   a directory the kernel knows, so it is the request most likely to fall in that window;
//!   a GETATTR or LOOKUP of another name of the same file, racing its unlink from another
//!   thread, still can (the kernel's attribute versions cannot tell; any FUSE server has it).
//! - **no-open mode** for regular files: OPEN and CREATE are answered ENOSYS, which tells the
//!   kernel (once each) to create files with MKNOD and to open files by itself from then on,
//!   keeping their page cache (`FOPEN_KEEP_CACHE` is its default there), with no OPEN, FLUSH
//!   (also answered ENOSYS) or RELEASE requests. Reads, writes, `fsync`, `fallocate` and
//!   `ftruncate` arrive with handle 0 and go to the engine by inode
//!   ([`lanefs::Filesystem::read_inode`] and its siblings). lanefs keeps no per-open state a
//!   file needs: the kernel checks access at open (`default_permissions`; a file created by
//!   the open itself is exempt, as POSIX wants), applies `O_APPEND` to the offset, and its
//!   lookup reference keeps an unlinked open file alive in the engine. `open(O_CREAT)` is
//!   still one system call, with `O_EXCL` still exclusive (MKNOD fails with EEXIST); inside
//!   the kernel the create and the open are two steps, as with any FUSE server that has no
//!   CREATE.
//!   `FUSE_ATOMIC_O_TRUNC` is not asked for: with it the kernel would expect OPEN to truncate;
//!   without it `open(O_TRUNC)` of an existing file sends a SETATTR after the kernel's own
//!   checks (a running program is `ETXTBSY`). That SETATTR cannot be told from a
//!   `truncate(path, 0)`; the server takes it for the O_TRUNC it usually is and stamps mtime
//!   and ctime even on an empty file, so `truncate(path, 0)` of an empty file stamps them
//!   too, where tmpfs leaves them alone.
//! - `FUSE_CACHE_SYMLINKS`: symlink targets are cached in the page cache.
//! - `FUSE_HANDLE_KILLPRIV_V2`: lanefs takes away set-id bits and file capabilities on write,
//!   truncate and chown itself, as Linux does (`engine/src/fs/file.rs`). Without it the kernel
//!   asks for that with a SETATTR of the mode on the writer's credentials, which a writer who
//!   does not own the file may not make (EPERM, and the write refused). A write's
//!   `FUSE_WRITE_KILL_SUIDGID` flag tells whether the writer lacks `CAP_FSETID`.
//! - `FUSE_POSIX_ACL` and `FUSE_DONT_MASK`: the engine stores POSIX ACLs
//!   (`system.posix_acl_access`, `system.posix_acl_default`) and applies them as tmpfs does:
//!   the kernel reads an inode's access ACL with a GETXATTR for its own permission checks and
//!   caches it; setting one, and a chmod, updates the mode and the ACL in one engine change.
//!   A MKNOD or MKDIR carries the mode unmasked with the caller's umask, which the engine
//!   applies unless the parent has a default ACL (then the default ACL masks the mode).
//! - `FUSE_EXPORT_SUPPORT`: exported file handles (`name_to_handle_at` /
//!   `open_by_handle_at`, NFS export, fanotify) keep working after the inode has left the
//!   kernel's cache, as on tmpfs. The kernel then finds the inode again with a LOOKUP of `.`
//!   in its node id, for any type of inode, answered with
//!   [`lanefs::Filesystem::lookup_inode`] (which takes the lookup reference the kernel
//!   expects); a directory's parent is a LOOKUP of `..`, answered by
//!   [`lanefs::Filesystem::lookup`]. A handle holds the node id and the generation truncated
//!   to 32 bits; the kernel answers ESTALE when the inode is gone (ENOENT here, also for an
//!   unlinked inode whose FORGET has not arrived yet) or its number now belongs to another
//!   inode (another generation: lanefs's 64-bit generations are never reused, so their low
//!   32 bits repeat only after 2^32 more inodes). Without it the kernel answered ESTALE for
//!   every inode it had forgotten.
//! - `FUSE_OVER_IO_URING` (when the kernel offers it, `uring` is not `off`, and this process
//!   can set up an io_uring: `session.rs`, `init`): requests come
//!   through per-CPU ring queues, saving the `read` and `write` of `/dev/fuse` per request
//!   and batching the answers of a queue into one system call; otherwise one request thread
//!   per CPU ([`MountConfig::threads`]), each with its own cloned `/dev/fuse` descriptor.
//! - `FUSE_ASYNC_READ`, `FUSE_BIG_WRITES`, `FUSE_MAX_PAGES` (256 pages: reads and writes of up
//!   to 1 MiB per request), and `FUSE_INIT_EXT` (the upper 32 flags, where io_uring's is).
//! - `O_TMPFILE` (FUSE_TMPFILE, 7.37) is answered as a CREATE without a name: the engine
//!   makes a regular file with link count 0 ([`lanefs::Filesystem::tmpfile`]); the reply's
//!   entry carries the lookup reference that keeps it alive until the kernel forgets it
//!   after the last close, and its open handle is 0, since the file is then served by inode
//!   like every regular file (no-open mode, above). `linkat` of it (through
//!   `/proc/self/fd/N` with `AT_SYMLINK_FOLLOW`, or `AT_EMPTY_PATH`) arrives as a LINK of its
//!   node id, which the engine accepts for a file that never had a name unless it was made
//!   with `O_EXCL` (the kernel checks that too, `I_LINKABLE`).
//!
//! ## Inode flags (`chattr`, `lsattr`) and whiteouts
//! The kernel turns `FS_IOC_GETFLAGS`, `FS_IOC_SETFLAGS`, `FS_IOC_FSGETXATTR` and
//! `FS_IOC_FSSETXATTR` on a regular file or directory into FUSE_IOCTL requests
//! (`fuse_fileattr_get` / `fuse_fileattr_set`, which open the file for the request: in no-open
//! mode that sends no OPEN, and an OPEN answered ENOSYS only switches no-open mode on), after
//! its own owner and `CAP_LINUX_IMMUTABLE` checks; a `chattr` first reads the old flags with
//! `FS_IOC_FSGETXATTR`. The server answers those four from the engine's flags and every other
//! ioctl with ENOTTY, as tmpfs does. The kernel never learns that a FUSE inode is immutable or
//! append-only (it does not set `S_IMMUTABLE` / `S_APPEND` on one), so the engine refuses
//! every request such an inode forbids: namespace changes, SETATTR (a truncate, and an
//! `open(O_TRUNC)`, which arrives as one), xattrs, fallocate, and a WRITE to an immutable file
//! or, without `O_APPEND` among the open flags the WRITE carries, to an append-only one. What
//! never reaches the server cannot be refused there: `open(O_WRONLY)` of an immutable file,
//! or without `O_APPEND` of an append-only one, succeeds through the mount (its writes are
//! then refused, EPERM, where tmpfs refuses the open), `access(W_OK)` of an immutable file is
//! answered by the kernel's permission check (0 where tmpfs says EPERM), a writable shared
//! mapping of such a file can be made (its write-back is refused), and `fcntl(F_SETFL)` may
//! drop `O_APPEND`. The kernel's own checks come before the request too: its type checks
//! (`unlink` of an immutable directory, or a `rename` of a file over one, is EISDIR, `rmdir`
//! of an immutable file ENOTDIR, where tmpfs says EPERM), and removing the default ACL of a
//! non-directory succeeds without a request. Conversely a file opened for writing before it
//! became immutable is written to on tmpfs but refused here. `RENAME_WHITEOUT` arrives in RENAME2 and is the engine's
//! (overlayfs on a lanefs upper directory uses it).
//!
//! ## Round trips saved (every change goes through this mount, so caches stay valid)
//! - a missing name is answered with a negative entry cached for the entry timeout, so
//!   creating a new name costs no LOOKUP;
//! - opening, reading (from the page cache) and closing a file sends nothing (no-open mode,
//!   above), and neither does closing a file an `open(O_CREAT)` made;
//! - opening, listing (from the cached listing) and closing a directory sends nothing
//!   (no-opendir mode, "Directory listings" above);
//! - on a store that keeps nothing (the memory store: [`lanefs::Filesystem::durable`])
//!   FSYNC and FSYNCDIR are answered ENOSYS, once each: the kernel
//!   then sends neither again, still writes dirty pages back at `fsync` and returns 0, as
//!   tmpfs does. A durable store keeps them.
//!
//! What remains per create + close + unlink of one name is six requests: LOOKUP (the kernel
//! drops the negative dentry an unlink leaves), MKNOD, UNLINK, a FORGET, and two GETATTRs of
//! the directory: a create or unlink invalidates the directory's cached attributes, and
//! `default_permissions` fetches them again for the next permission check.
//! - `default_permissions`: the kernel checks permissions too, with the caller's full group
//!   list, on every step of a path walk, including cached dentries that never reach lanefs.
//!   lanefs checks again on every namespace and attribute request that reaches it (so the
//!   library is safe on its own); the two use the same POSIX rules. File data requests come
//!   only for files the kernel has opened, its access check done.
//!
//! ## Directory listings
//! **no-opendir mode** for directories: OPENDIR is answered ENOSYS (the kernel says it
//! understands that with `FUSE_NO_OPENDIR_SUPPORT`), which tells the kernel, once, to open
//! directories by itself from then on, with no OPENDIR or RELEASEDIR, and to keep their
//! listings: `FOPEN_CACHE_DIR | FOPEN_KEEP_CACHE` is its default for such opens. The kernel
//! keeps what a full read of a directory returned (names, inode numbers, types and cookies,
//! not attributes) in the directory inode's page cache and serves later reads from there, for
//! any open, with no request at all (a walk still needs the entries' attributes cached, as
//! READDIRPLUS and LOOKUP leave them). READDIR(PLUS) comes with handle 0 and is read by inode
//! ([`lanefs::Filesystem::readdir_inode`]); where a read ends is kept per directory by the
//! server (`Server::dir_end`), so every read ends, as through a handle. The kernel checks
//! read permission at the open itself (`default_permissions`) and `O_NOATIME` ownership; the
//! directory's atime is touched by every read that reaches lanefs (whatever `O_NOATIME`
//! says), and not by a read served from the cache, which with relatime semantics (lanefs's)
//! would mostly not change it either. A kernel without no-opendir support gets an engine
//! handle from OPENDIR, with those two flags set.
//!
//! The first read of an uncached directory still uses READDIRPLUS when the kernel asks for
//! it; only its entries go into the cache, so a listing served from the cache refreshes no
//! entry or attribute. Once the entries have expired (the entry timeout, [`MountConfig::ttl`]),
//! a walk through a cached listing would revalidate every name with a LOOKUP; so the server
//! drops each directory's cached listing once the read that filled it is older than the
//! timeout (checked every quarter of it), and the next read is a READDIRPLUS again. The
//! kernel checks the cache at every read from offset 0 (`fuse_readdir_cached`) and starts
//! over when the directory's `i_version` or its mtime changed, or when a page of it is gone.
//! Each change of a listing reaches it so:
//! - a name created, removed, linked or renamed through this mount: the kernel bumps the
//!   `i_version` of each directory whose names it changed (`fuse_dir_changed`, on MKNOD,
//!   MKDIR, SYMLINK, LINK, UNLINK, RMDIR and RENAME of both parents). That alone misses one
//!   case: the kernel fills its cache across the `getdents` calls of one stream, so a change
//!   between two of them leaves a complete cache holding the old names, and another stream
//!   that got its first page from lanefs and goes on at a later offset is served the rest
//!   from it (a name removed before that stream began shows up in it, one made before it
//!   began is missing). So the server also drops the directory's cached pages before it
//!   answers such a change, when a read from offset 0 reached it since it last dropped them
//!   (`Server::names_changed`): a workload that never lists pays nothing;
//! - a directory moved to another parent through this mount: its own `..` changed, which the
//!   kernel does not count as a change of it; the server drops its cached pages before it
//!   answers the RENAME (`Server::moved_dirs`);
//! - a change made through the library while mounted: the engine reports the names (and the
//!   directories moved to another parent, [`lanefs::notify::Invalidate::listing`]) and the
//!   server drops the directory's pages after an entry invalidation that waits out every
//!   listing in flight (`mnt.rs`, `KernelCache`).
//!
//! Nothing else changes a listing: attributes are not in it, and a directory's inode number
//! and type never change.
//!
//! ## Timeouts
//! Entries and attributes are cached by the kernel for [`MountConfig::ttl`] (default 60 s).
//! That is safe because lanefs is the only writer: changes through the mount are made by the
//! kernel, which updates or invalidates its own caches, and changes a program makes through
//! the library while the filesystem is mounted ([`mount_background`]) are reported by the
//! engine ([`lanefs::notify`]) and sent to the kernel as `FUSE_NOTIFY_INVAL_ENTRY` (a name
//! created, removed or replaced) and `FUSE_NOTIFY_INVAL_INODE` (attributes, and the page-cache
//! range a write or truncate changed) before the library call returns; an inode the kernel
//! is being handed by a LOOKUP or READDIRPLUS that read it before the change is invalidated
//! again once the kernel holds it (`lanefs::notify`).
//!
//! ## Write-back that fails
//! Pages a program dirties through `mmap` reach lanefs as write-back WRITEs
//! (`FUSE_WRITE_CACHE`); the kernel asks nothing when a mapped page is first written, so a
//! full filesystem cannot refuse the store with SIGBUS as tmpfs does. When such a WRITE stores
//! less than it carried (ENOSPC, EIO), the program hears of it from `msync`, `fsync` or
//! `close`, and the server drops those pages from the kernel's cache (a thread of its own,
//! after the reply: `Server::drop_pages_later`), so that reads show what lanefs holds and not
//! bytes it refused.
//!
//! ## Mounting
//! As root lanefs mounts with `mount(2)` itself, with type `fuse.lanefs`, and like tmpfs
//! honours set-user-id bits and device files unless the flags say `nosuid` / `nodev`;
//! otherwise it mounts through `fusermount3`, which always makes a user's mount
//! `nosuid,nodev` (see `mnt.rs`). [`MOUNT_FLAGS`] is the one table of kernel mount flags.
//! `fuser` is kept only for its [`MountOption`] type, the option list of [`MountConfig`].

mod abi;
mod control;
mod creds;
mod handoff;
mod mnt;
mod server;
mod session;
mod uring;

pub use control::{
    SocketGuard, serve as serve_control, socket_path, stats as read_stats, stats_json,
};
pub use mnt::{
    FS_TYPE, MOUNT_FLAGS, MountFlag, mount_dev_at, mount_flag, mount_flags_at, mount_id_at,
};
pub use server::{Mount, MountConfig, MountOption, Mounted, Server, mount, mount_background};
pub use session::{SessionInfo, Uring};
