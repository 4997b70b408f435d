//! Records: one per change to the filesystem, the seam between the engine and a store.
//!
//! Every mutation the engine makes is first described by a [`Record`] that carries everything
//! needed to make it again: inode numbers with generations, readdir cookies, timestamps, and
//! the after-image of what changes (a new inode's attributes, the bytes written, the
//! attributes set). The engine hands the record to its [`Store`] while holding the locks
//! that order the change, before the change becomes visible, and then makes the change
//! through one apply function per record kind (`fs/apply.rs`). Recovery replays a store's
//! records through the same functions, so what is replayed is what was served.
//!
//! - `mod.rs` (here): the kinds, and the [`Store`] trait records are handed to;
//! - [`effect`]: what each kind does to an inode's attributes, written once for the engine
//!   and for a store's checkpoint ([`Attributes`]);
//! - `codec.rs`: the bytes ([`Record::encode`], [`Record::decode`]), the logical body of a
//!   journal entry (framing, sequence numbers and checksums are the store's); its tests keep
//!   docs/RECORDS.md (the format, and why records replay in the order the store keeps them)
//!   and the code in step;
//! - `loaded.rs`: [`LoadedInode`], [`LoadedEntry`], what a store that loads its namespace as
//!   it is needed gives ([`Store::load_inode`], [`Store::load_entries`]);
//! - `summary.rs`: [`RecordSummary`], what a checkpoint reads of a record before it decides
//!   whether to apply it.

mod codec;
pub mod effect;
mod loaded;
mod summary;

use std::sync::Arc;

use crate::data::PageEpochs;
use crate::errno::{Errno, Result};
use crate::id::{Ino, InodeId};
use crate::time::Timespec;

pub use codec::DecodeError;
pub use effect::Attributes;
pub use loaded::{LoadedEntry, LoadedInode};
pub use summary::RecordSummary;

/// The after-image of a new inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NewInode<'a> {
    /// Number and generation.
    pub id: InodeId,
    /// Type and permission bits.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device number (character and block devices; 0 otherwise).
    pub rdev: u64,
    /// Symlink target (empty otherwise).
    pub target: &'a [u8],
    /// Its atime, mtime and ctime, and the parent directory's new mtime and ctime.
    pub time: Timespec,
    /// The access ACL it inherits (`system.posix_acl_access` bytes; empty: none).
    pub access_acl: &'a [u8],
    /// The default ACL a new directory inherits (empty: none).
    pub default_acl: &'a [u8],
}

/// Attributes set on an inode; `None` leaves a field alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttrChange {
    /// Type and permission bits (the type never changes).
    pub mode: Option<u32>,
    /// Owner.
    pub uid: Option<u32>,
    /// Group.
    pub gid: Option<u32>,
    /// Size (a truncate: pages beyond it are freed).
    pub size: Option<u64>,
    /// Access time.
    pub atime: Option<Timespec>,
    /// Modification time.
    pub mtime: Option<Timespec>,
    /// Change time.
    pub ctime: Option<Timespec>,
}

/// One change to the filesystem (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record<'a> {
    /// A new filesystem's root directory (the first record of a store).
    Root {
        /// Its attributes (its id is always [`InodeId::ROOT`]).
        inode: NewInode<'a>,
    },
    /// A new inode, named `name` in directory `dir` with readdir cookie `cookie`.
    Create {
        /// The directory.
        dir: InodeId,
        /// The name.
        name: &'a [u8],
        /// The new entry's readdir cookie.
        cookie: u64,
        /// The new inode.
        inode: NewInode<'a>,
        /// The inode flags it inherits from its directory (`FS_NODUMP_FL`, `FS_NOATIME_FL`;
        /// usually none).
        flags: u32,
    },
    /// A new name for an existing inode (`link(2)`).
    Link {
        /// The directory.
        dir: InodeId,
        /// The name.
        name: &'a [u8],
        /// The new entry's readdir cookie.
        cookie: u64,
        /// The inode linked.
        inode: InodeId,
        /// The inode's new ctime, the directory's new mtime and ctime.
        time: Timespec,
    },
    /// A name removed (`unlink`, or `rmdir` when `inode` is a directory).
    Remove {
        /// The directory.
        dir: InodeId,
        /// The name.
        name: &'a [u8],
        /// The inode it named.
        inode: InodeId,
        /// The inode's new ctime, the directory's new mtime and ctime.
        time: Timespec,
    },
    /// `rename(2)` and `renameat2` with `RENAME_EXCHANGE`.
    Rename {
        /// The source directory.
        from: InodeId,
        /// The source name.
        from_name: &'a [u8],
        /// The target directory.
        to: InodeId,
        /// The target name.
        to_name: &'a [u8],
        /// The inode the source name named.
        inode: InodeId,
        /// The inode the target name named, if it existed (replaced, or exchanged).
        replaced: Option<InodeId>,
        /// Whether the names swap (`RENAME_EXCHANGE`).
        exchange: bool,
        /// The target entry's new cookie when the target name did not exist (0 otherwise).
        cookie: u64,
        /// New ctime of the inodes, new mtime and ctime of the directories.
        time: Timespec,
    },
    /// Attributes set (chmod, chown, utimes, truncate, and the set-id bits a write clears).
    SetAttr {
        /// The inode.
        inode: InodeId,
        /// What is set.
        change: AttrChange,
    },
    /// Bytes written to a regular file (its size grows to cover them).
    Write {
        /// The file.
        inode: InodeId,
        /// Where.
        offset: u64,
        /// The bytes.
        data: &'a [u8],
        /// New mtime and ctime.
        time: Timespec,
    },
    /// `fallocate` without flags or with `FALLOC_FL_KEEP_SIZE`.
    Allocate {
        /// The file.
        inode: InodeId,
        /// Start.
        offset: u64,
        /// Length.
        len: u64,
        /// `FALLOC_FL_KEEP_SIZE`.
        keep_size: bool,
        /// New mtime and ctime.
        time: Timespec,
    },
    /// `fallocate` with `FALLOC_FL_PUNCH_HOLE`.
    Punch {
        /// The file.
        inode: InodeId,
        /// Start.
        offset: u64,
        /// Length.
        len: u64,
        /// New mtime and ctime.
        time: Timespec,
    },
    /// An extended attribute set.
    SetXattr {
        /// The inode.
        inode: InodeId,
        /// Its name, namespace prefix included.
        name: &'a [u8],
        /// Its value.
        value: &'a [u8],
        /// The inode's new ctime.
        time: Timespec,
    },
    /// An ACL set or removed, with the mode it implies (setting an access ACL sets the mode's
    /// permission bits; a chmod of an inode with an access ACL changes both).
    SetAcl {
        /// The inode.
        inode: InodeId,
        /// The default ACL (true) or the access ACL.
        default: bool,
        /// The ACL's bytes; empty removes it.
        acl: &'a [u8],
        /// The inode's new mode.
        mode: u32,
        /// The inode's new ctime.
        time: Timespec,
    },
    /// An extended attribute removed.
    RemoveXattr {
        /// The inode.
        inode: InodeId,
        /// Its name.
        name: &'a [u8],
        /// The inode's new ctime.
        time: Timespec,
    },
    /// An inode with no name left and no user left is gone (its number may be reused, with
    /// a new generation).
    Free {
        /// The inode.
        inode: InodeId,
    },
    /// Inode flags set (`FS_IOC_SETFLAGS`: `FS_IMMUTABLE_FL`, `FS_APPEND_FL`,
    /// `FS_NODUMP_FL`, `FS_NOATIME_FL`).
    SetFlags {
        /// The inode.
        inode: InodeId,
        /// Its flags from now on (every one of the four, set or clear).
        flags: u32,
        /// The inode's new ctime.
        time: Timespec,
    },
    /// `renameat2` with `RENAME_WHITEOUT`: a [`Record::Rename`] (never an exchange) that
    /// leaves a whiteout, a new character device 0/0, at the source name, in one change.
    RenameWhiteout {
        /// The source directory.
        from: InodeId,
        /// The source name, which names the whiteout afterwards.
        from_name: &'a [u8],
        /// The target directory.
        to: InodeId,
        /// The target name.
        to_name: &'a [u8],
        /// The inode the source name named.
        inode: InodeId,
        /// The inode the target name named, if it existed (replaced).
        replaced: Option<InodeId>,
        /// The target entry's new cookie when the target name did not exist (0 otherwise).
        cookie: u64,
        /// New ctime of the inodes, new mtime and ctime of the directories.
        time: Timespec,
        /// The whiteout.
        whiteout: NewInode<'a>,
        /// The whiteout's entry's readdir cookie.
        whiteout_cookie: u64,
        /// The whiteout's inode flags (inherited from the source directory; may be empty).
        whiteout_flags: u32,
    },
    /// `open(O_TMPFILE)`: a new regular file with no name (link count 0), open. A later
    /// [`Record::Link`] gives it its first name; without one, its [`Record::Free`] follows
    /// when it is closed, and recovery frees it if the crash came first.
    Tmpfile {
        /// The new inode (a regular file, with the group and ACL the directory it was made in
        /// gave it; the directory itself is not changed).
        inode: NewInode<'a>,
        /// Its inode flags, inherited from that directory (may be empty).
        flags: u32,
    },
}

/// What [`Store::sync_then`] calls with the sync's result.
pub type SyncDone = Box<dyn FnOnce(Result<()>) + Send>;

/// Where the engine's records go: the memory store drops them, a durable store journals
/// them. Implementations must be cheap to call from many threads at once.
pub trait Store: Send + Sync {
    /// Takes the record of a change that is about to become visible. The engine calls this
    /// with the locks that order the change held (the stripes of the names it changes, or the
    /// inode's data or attribute lock), so the store must not wait on anything an engine
    /// operation could hold; it may take locks of its own that nothing else nests under. An
    /// error refuses the change: the engine undoes what it prepared and returns the errno
    /// (ENOSPC when the journal cannot grow, EIO after an I/O error).
    fn append(&self, rec: &Record<'_>) -> Result<()>;

    /// Makes every record appended before the call durable (what `fsync`, `fdatasync`,
    /// `fsyncdir` and `syncfs` wait for). Called with no engine lock held.
    fn sync(&self) -> Result<()>;

    /// [`Store::sync`] without waiting: `done` gets its result once every record appended
    /// before the call is durable, on whatever thread finds that out (possibly this one,
    /// before the call returns). For servers that must not hold a thread per waiting fsync.
    /// `done` must not block. The default waits in `sync` and then calls `done`.
    fn sync_then(&self, done: SyncDone) {
        done(self.sync())
    }

    /// Whether this store keeps records at all (false: the memory store). The engine uses it
    /// only to skip work that serves durability alone.
    fn durable(&self) -> bool;

    /// The epochs by which this store tells the engine which file pages it holds, so that
    /// they may leave memory (`data.rs`, "Pages the store keeps"); `None` (the default): the
    /// store keeps no pages, and every page stays in memory.
    fn page_epochs(&self) -> Option<Arc<PageEpochs>> {
        None
    }

    /// The bytes this store's host can still take, if it has a bound of its own beside the
    /// filesystem's size limit (a disk store: the free space of the filesystem holding it).
    /// `statfs` reports no more than this as available. `None` (the default): no such bound.
    fn available(&self) -> Option<u64> {
        None
    }

    /// Reads pages `first..` of file `inode`, as the store holds them, into `buf` (a whole
    /// number of pages): only pages the engine sent out of memory, which the store holds
    /// because it declared their epoch kept. Called under the file's data lock; must not
    /// wait on anything an engine operation could hold. EIO if the store cannot read them.
    fn read_pages(&self, inode: InodeId, first: u64, buf: &mut [u8]) -> Result<()> {
        let _ = (inode, first, buf);
        Err(Errno::EIO)
    }

    /// The inode with number `ino` as the store holds it, for a filesystem recovered with
    /// [`crate::Filesystem::recover_lazy`] (`fs/lazy.rs`): `None` if the store holds none.
    /// Called once per number, the first time it is needed, by whatever thread needs it,
    /// with no engine lock held; many at once for different numbers. EIO if the store
    /// cannot read it (the store says why).
    fn load_inode(&self, ino: Ino) -> Result<Option<LoadedInode>> {
        let _ = ino;
        Err(Errno::EIO)
    }

    /// The entries of directory `dir` as the store holds them, each with its target's type,
    /// in any order; if the directory has at most `files` entries, each that is not a
    /// directory comes with its inode too, as [`Store::load_inode`] gives it (the engine
    /// asks for them while its inode cache has room for them: one read of the store for a
    /// directory's files instead of one for each). Called once per directory, as
    /// [`Store::load_inode`].
    fn load_entries(&self, dir: Ino, files: u64) -> Result<Vec<LoadedEntry>> {
        let _ = (dir, files);
        Err(Errno::EIO)
    }
}

/// The memory store: nothing survives the process, so records are dropped.
#[derive(Debug, Default)]
pub struct MemoryStore;

impl Store for MemoryStore {
    #[inline]
    fn append(&self, _rec: &Record<'_>) -> Result<()> {
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        Ok(())
    }

    fn durable(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_store_keeps_nothing_and_never_fails() {
        let s = MemoryStore;
        for r in codec::tests::samples() {
            s.append(&r).unwrap();
        }
        s.sync().unwrap();
        assert!(!s.durable());
    }
}
