//! Inode flags: the `chattr` flags at their `FS_*_FL` values, and the engine's own bits kept
//! beside them. A leaf of the engine: what a record does to flags (`record/effect.rs`) and
//! the attribute cell (`attr/mod.rs`) both read it.

/// `chattr +i`: the inode is immutable (`FS_IMMUTABLE_FL`, as `FS_IOC_GETFLAGS` reports it).
pub const FS_IMMUTABLE_FL: u32 = 0x10;
/// `chattr +a`: append only (`FS_APPEND_FL`).
pub const FS_APPEND_FL: u32 = 0x20;
/// `chattr +d`: no dump (`FS_NODUMP_FL`).
pub const FS_NODUMP_FL: u32 = 0x40;
/// `chattr +A`: no access-time updates (`FS_NOATIME_FL`).
pub const FS_NOATIME_FL: u32 = 0x80;

/// Inode flags kept beside the mode (`AttrVals::flags`, 16 bits): three of the engine's own,
/// and the `chattr` flags tmpfs keeps, at their `FS_*_FL` values (which fit below 16 bits
/// and miss the engine's).
pub(crate) mod flags {
    /// The inode has extended attributes in the filesystem's xattr table.
    pub const XATTRS: u32 = 1;
    /// It has an access ACL (`system.posix_acl_access`), which permission checks consult.
    pub const ACL: u32 = 2;
    /// It (a directory) has a default ACL, which new inodes in it inherit.
    pub const DEFAULT_ACL: u32 = 4;
    /// `FS_IMMUTABLE_FL` ('i'): nothing about the inode changes but its flags and atime.
    pub const IMMUTABLE: u32 = super::FS_IMMUTABLE_FL;
    /// `FS_APPEND_FL` ('a'): a file is only appended to; a directory only gains entries.
    pub const APPEND: u32 = super::FS_APPEND_FL;
    /// `FS_NODUMP_FL` ('d'): kept for `dump` to read; no effect here.
    pub const NODUMP: u32 = super::FS_NODUMP_FL;
    /// `FS_NOATIME_FL` ('A'): reads do not update the access time.
    pub const NOATIME: u32 = super::FS_NOATIME_FL;
    /// The `chattr` flags (the ones `get_flags` reports and `set_flags` accepts).
    pub const USER: u32 = IMMUTABLE | APPEND | NODUMP | NOATIME;
    /// The ones a new inode inherits from its directory (tmpfs's `SHMEM_FL_INHERITED`).
    pub const INHERITED: u32 = NODUMP | NOATIME;
    /// The ones that stop a change (`IS_IMMUTABLE` or `IS_APPEND`).
    pub const FROZEN: u32 = IMMUTABLE | APPEND;
    const _: () = assert!(USER <= 0xFFFF && USER & (XATTRS | ACL | DEFAULT_ACL) == 0);
}
