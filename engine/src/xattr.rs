//! Extended attributes: the attributes of one inode ([`Xattrs`]), and the filesystem's table
//! of them ([`XattrTable`]).
//!
//! Names carry their namespace prefix (`user.`, `trusted.`, `security.`, and in `system.` only
//! the two POSIX ACL names, `acl.rs`; other `system.` names answer EOPNOTSUPP, as on tmpfs).
//! Limits follow Linux: names up to 255 bytes (ERANGE beyond), values up to 64 KiB (E2BIG
//! beyond). ACLs are kept here under their names too, as the bytes `getxattr` returns.
//!
//! Most inodes have no extended attributes, so an inode holds none of its own: they live in
//! a table keyed by inode number, sharded 256 ways, and the inode's `flags::XATTRS` bit says
//! whether it has an entry there, so a `getxattr` of an inode without attributes (the kernel
//! asks for `security.capability` before writes) takes no lock. The table's entry is removed
//! when the inode is freed, before its number can be reused.

use std::collections::{BTreeMap, HashMap};

use crossbeam_utils::CachePadded;
use parking_lot::{Mutex, MutexGuard};

use crate::errno::{Errno, Result};
use crate::id::Ino;
use crate::stats::{LockClass, Stats};

use crate::limits::{XATTR_NAME_MAX, XATTR_SIZE_MAX};

/// `setxattr` flag: fail with EEXIST if the attribute exists.
pub const XATTR_CREATE: i32 = libc::XATTR_CREATE;
/// `setxattr` flag: fail with ENODATA if the attribute does not exist.
pub const XATTR_REPLACE: i32 = libc::XATTR_REPLACE;

/// Namespace of an attribute name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Namespace {
    User,
    Trusted,
    Security,
    /// `system.posix_acl_access` or `system.posix_acl_default`.
    Acl(crate::acl::AclKind),
}

/// Checks a name and returns its namespace.
pub(crate) fn namespace(name: &[u8]) -> Result<Namespace> {
    if name.is_empty() || name.len() > XATTR_NAME_MAX {
        return Err(Errno::ERANGE);
    }
    let (ns, rest) = if let Some(r) = name.strip_prefix(b"user.") {
        (Namespace::User, r)
    } else if let Some(r) = name.strip_prefix(b"trusted.") {
        (Namespace::Trusted, r)
    } else if let Some(r) = name.strip_prefix(b"security.") {
        (Namespace::Security, r)
    } else if let Some(kind) = crate::acl::AclKind::from_name(name) {
        return Ok(Namespace::Acl(kind));
    } else {
        return Err(Errno::EOPNOTSUPP);
    };
    if rest.is_empty() {
        return Err(Errno::EINVAL);
    }
    Ok(ns)
}

/// An inode's attributes (allocated on first `setxattr`).
#[derive(Default)]
pub(crate) struct Xattrs {
    map: BTreeMap<Box<[u8]>, Box<[u8]>>,
}

impl Xattrs {
    pub fn get(&self, name: &[u8]) -> Option<&[u8]> {
        self.map.get(name).map(|v| &**v)
    }

    pub fn set(&mut self, name: &[u8], value: &[u8], flags: i32) -> Result<()> {
        if value.len() > XATTR_SIZE_MAX {
            return Err(Errno::E2BIG);
        }
        let exists = self.map.contains_key(name);
        if flags & XATTR_CREATE != 0 && exists {
            return Err(Errno::EEXIST);
        }
        if flags & XATTR_REPLACE != 0 && !exists {
            return Err(Errno::ENODATA);
        }
        self.map.insert(name.into(), value.into());
        Ok(())
    }

    pub fn remove(&mut self, name: &[u8]) -> Result<()> {
        self.map.remove(name).map(|_| ()).ok_or(Errno::ENODATA)
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Names, each followed by NUL, as `listxattr` returns them.
    pub fn list(&self, mut visible: impl FnMut(&[u8]) -> bool) -> Vec<u8> {
        let mut out = Vec::new();
        for k in self.map.keys().filter(|k| visible(k)) {
            out.extend_from_slice(k);
            out.push(0);
        }
        out
    }
}

const NSHARDS: usize = 256;

/// One shard of the table: the extended attributes of the inodes hashing to it.
pub(crate) type Shard = HashMap<Ino, Xattrs, foldhash::fast::RandomState>;

/// Every inode's extended attributes (see the module doc).
pub(crate) struct XattrTable {
    shards: Box<[CachePadded<Mutex<Shard>>]>,
}

impl XattrTable {
    pub fn new() -> Self {
        XattrTable {
            shards: (0..NSHARDS)
                .map(|_| CachePadded::new(Mutex::new(Shard::default())))
                .collect(),
        }
    }

    /// Inodes with attributes (for the invariant checker).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// The shard holding `ino`'s attributes, locked (class `xattr`, a leaf).
    pub fn lock(&self, ino: Ino, stats: &Stats) -> MutexGuard<'_, Shard> {
        let i = (ino.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize % NSHARDS;
        stats.lock(LockClass::Xattr, &self.shards[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_limits() {
        let mut x = Xattrs::default();
        assert_eq!(x.set(b"user.a", b"1", XATTR_REPLACE), Err(Errno::ENODATA));
        x.set(b"user.a", b"1", XATTR_CREATE).unwrap();
        assert_eq!(x.set(b"user.a", b"2", XATTR_CREATE), Err(Errno::EEXIST));
        x.set(b"user.a", b"2", XATTR_REPLACE).unwrap();
        assert_eq!(x.get(b"user.a"), Some(&b"2"[..]));
        assert_eq!(
            x.set(b"user.big", &vec![0; XATTR_SIZE_MAX + 1], 0),
            Err(Errno::E2BIG)
        );
        x.set(b"trusted.t", b"", 0).unwrap();
        assert_eq!(x.list(|_| true), b"trusted.t\0user.a\0");
        assert_eq!(x.list(|n| n.starts_with(b"user.")), b"user.a\0");
        x.remove(b"user.a").unwrap();
        assert_eq!(x.remove(b"user.a"), Err(Errno::ENODATA));
    }

    #[test]
    fn namespaces() {
        assert_eq!(namespace(b"user.x"), Ok(Namespace::User));
        assert_eq!(
            namespace(b"system.posix_acl_access"),
            Ok(Namespace::Acl(crate::acl::AclKind::Access))
        );
        assert_eq!(namespace(b"system.other"), Err(Errno::EOPNOTSUPP));
        assert_eq!(namespace(b"bogus"), Err(Errno::EOPNOTSUPP));
        assert_eq!(namespace(b"user."), Err(Errno::EINVAL));
        assert_eq!(namespace(&[b'u'; 256]), Err(Errno::ERANGE));
    }
}
