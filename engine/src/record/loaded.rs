//! What a store gives a filesystem that loads its namespace as it is needed (engine
//! `fs/lazy.rs`): an inode, and a directory's entries, as the store keeps them.

use crate::attr::FileType;
use crate::id::InodeId;
use crate::time::Timespec;

/// An inode as a store keeps it, for [`crate::Store::load_inode`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadedInode {
    /// Number and generation.
    pub id: InodeId,
    /// Type and permission bits.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Link count (a directory's counts its `.` and its subdirectories' `..`).
    pub nlink: u32,
    /// Device number (character and block devices).
    pub rdev: u64,
    /// Size in bytes (regular files; a symlink's is its target's length).
    pub size: u64,
    /// Access time.
    pub atime: Timespec,
    /// Modification time.
    pub mtime: Timespec,
    /// Change time.
    pub ctime: Timespec,
    /// Birth time, if kept.
    pub btime: Option<Timespec>,
    /// Inode flags (`FS_*_FL`, the `chattr` ones).
    pub flags: u32,
    /// A symlink's target.
    pub target: Vec<u8>,
    /// A directory's parent (the root's is itself).
    pub parent: InodeId,
    /// Extended attributes other than ACLs, name (with its namespace) and value.
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// The access ACL (`system.posix_acl_access` bytes; empty: none).
    pub access_acl: Vec<u8>,
    /// The default ACL (empty: none).
    pub default_acl: Vec<u8>,
    /// A regular file's pages whose bytes the store holds (read when asked for).
    pub pages: Vec<u64>,
    /// A regular file's runs of allocated zeros, `(first, end)` in pages.
    pub zeros: Vec<(u64, u64)>,
}

/// An entry of a directory as a store keeps it, for [`crate::Store::load_entries`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadedEntry {
    /// The name.
    pub name: Vec<u8>,
    /// Its readdir cookie.
    pub cookie: u64,
    /// The inode it names.
    pub target: InodeId,
    /// That inode's type, which readdir reports without loading the inode.
    pub kind: FileType,
    /// That inode, when [`crate::Store::load_entries`] was asked for the directory's files
    /// and it is not a directory.
    pub inode: Option<LoadedInode>,
}
