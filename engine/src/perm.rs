//! Caller identity and POSIX permission checks.
//!
//! lanefs checks permissions itself, so the library is safe to embed in a multi-user program
//! and the FUSE mount does not depend on the kernel's `default_permissions`. Root (uid 0)
//! stands for a caller with every capability, as for a root process on tmpfs. The engine
//! never reads anything about the caller from the system: a caller's supplementary groups
//! are given with its credentials (the FUSE server reads them before calling).

use smallvec::SmallVec;

use crate::attr::AttrVals;
use crate::errno::{Errno, Result};

/// Read permission (`R_OK`).
pub const MAY_READ: u32 = 4;
/// Write permission (`W_OK`).
pub const MAY_WRITE: u32 = 2;
/// Execute / search permission (`X_OK`).
pub const MAY_EXEC: u32 = 1;

/// How a caller reaches the engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Via {
    /// A program calling the library directly (the default).
    #[default]
    Library,
    /// The kernel, serving a process through a FUSE mount. Four things follow, each part of
    /// the FUSE protocol or of the kernel's own checks (docs/DESIGN.md §2.2):
    /// - every inode an operation returns (lookup, `lookup_inode`, create, mkdir, mknod,
    ///   symlink, link, tmpfile, readdirplus) carries one lookup reference that the kernel
    ///   drops with `forget`, and an inode is freed only once those are gone too;
    /// - a readdirplus gives a file that has had two names or more no attributes and no
    ///   reference (the kernel would count its links down twice; `Filesystem::readdir`);
    /// - changes are not reported to the invalidation sink ([`crate::notify`]: the kernel
    ///   made them and updates its own caches);
    /// - the checks the kernel applies by its own policy before it sends a request are left
    ///   to it: `fs.protected_hardlinks`, and the capabilities that writing `security.*`
    ///   attributes needs (the kernel itself sends the removal of a file's capabilities, on
    ///   the credentials of the writer whose change takes them away); and a SETATTR that
    ///   changes nothing, which the kernel sends to take set-id bits away before a write, is
    ///   allowed to a caller who may write the file, not only to its owner.
    Kernel,
}

/// Who is calling: the credentials a process would present to the kernel.
#[derive(Clone, Debug)]
pub struct Ctx {
    /// Filesystem user id.
    pub uid: u32,
    /// Filesystem group id.
    pub gid: u32,
    /// File-mode creation mask applied to new inodes.
    pub umask: u32,
    /// Whether the caller may keep set-user-ID and set-group-ID bits when it writes to,
    /// truncates or changes the owner of a file (`CAP_FSETID`). True for root.
    pub keeps_setid: bool,
    /// How the caller reaches the engine.
    pub via: Via,
    groups: SmallVec<[u32; 8]>,
}

impl Ctx {
    /// Root, umask 0.
    pub fn root() -> Self {
        Ctx::user(0, 0)
    }

    /// A user with no supplementary groups, umask 0.
    pub fn user(uid: u32, gid: u32) -> Self {
        Ctx {
            uid,
            gid,
            umask: 0,
            keeps_setid: uid == 0,
            via: Via::Library,
            groups: SmallVec::new(),
        }
    }

    /// Sets the supplementary groups.
    pub fn with_groups(mut self, groups: &[u32]) -> Self {
        self.groups = groups.into();
        self
    }

    /// Sets the umask.
    pub fn with_umask(mut self, umask: u32) -> Self {
        self.umask = umask & 0o777;
        self
    }

    /// Marks the caller as the kernel serving a process through a mount ([`Via::Kernel`]).
    pub fn via_kernel(mut self) -> Self {
        self.via = Via::Kernel;
        self
    }

    /// Whether the caller is root (has every capability).
    #[inline]
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// Whether returned inodes carry a lookup reference ([`Via::Kernel`]).
    #[inline]
    pub(crate) fn counts_lookups(&self) -> bool {
        self.via == Via::Kernel
    }

    /// The supplementary groups.
    pub fn groups(&self) -> &[u32] {
        &self.groups
    }

    /// Whether `gid` is the caller's group or one of its supplementary groups.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// `generic_permission`: may `ctx` access an inode with attributes `a` for `mask`?
pub(crate) fn check(ctx: &Ctx, a: &AttrVals, mask: u32) -> Result<()> {
    if ctx.is_root() {
        // CAP_DAC_OVERRIDE: anything, except executing a non-directory with no x bit at all.
        let is_dir = a.mode & libc::S_IFMT == libc::S_IFDIR;
        if mask & MAY_EXEC != 0 && !is_dir && a.mode & 0o111 == 0 {
            return Err(Errno::EACCES);
        }
        return Ok(());
    }
    let bits = if ctx.uid == a.uid {
        (a.mode >> 6) & 7
    } else if ctx.in_group(a.gid) {
        (a.mode >> 3) & 7
    } else {
        a.mode & 7
    };
    if mask & !bits != 0 {
        Err(Errno::EACCES)
    } else {
        Ok(())
    }
}

/// Whether `ctx` is the owner or root (`inode_owner_or_capable`).
pub(crate) fn owner_or_root(ctx: &Ctx, a: &AttrVals) -> bool {
    ctx.is_root() || ctx.uid == a.uid
}

/// The sticky-directory rule: in a sticky directory, only the owner of an entry, the owner of
/// the directory or root may remove or rename it.
pub(crate) fn check_sticky(ctx: &Ctx, dir: &AttrVals, victim: &AttrVals) -> Result<()> {
    if dir.mode & libc::S_ISVTX != 0
        && !ctx.is_root()
        && ctx.uid != victim.uid
        && ctx.uid != dir.uid
    {
        return Err(Errno::EPERM);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Timespec;

    fn attr(mode: u32, uid: u32, gid: u32) -> AttrVals {
        let t = Timespec::default();
        AttrVals {
            mode,
            flags: 0,
            uid,
            gid,
            size: 0,
            blocks: 0,
            atime: t,
            mtime: t,
            ctime: t,
        }
    }

    #[test]
    fn owner_group_other_classes() {
        let a = attr(libc::S_IFREG | 0o640, 10, 20);
        assert!(check(&Ctx::user(10, 99), &a, MAY_READ | MAY_WRITE).is_ok());
        assert_eq!(check(&Ctx::user(10, 99), &a, MAY_EXEC), Err(Errno::EACCES));
        assert!(check(&Ctx::user(11, 20), &a, MAY_READ).is_ok());
        assert_eq!(check(&Ctx::user(11, 20), &a, MAY_WRITE), Err(Errno::EACCES));
        assert!(check(&Ctx::user(11, 5).with_groups(&[20]), &a, MAY_READ).is_ok());
        assert_eq!(check(&Ctx::user(11, 5), &a, MAY_READ), Err(Errno::EACCES));
        // The owner class applies even when it grants less than the group class.
        let b = attr(libc::S_IFREG | 0o070, 10, 20);
        assert_eq!(check(&Ctx::user(10, 20), &b, MAY_READ), Err(Errno::EACCES));
    }

    #[test]
    fn root_overrides_except_exec_without_any_x_bit() {
        let f = attr(libc::S_IFREG, 10, 20);
        assert!(check(&Ctx::root(), &f, MAY_READ | MAY_WRITE).is_ok());
        assert_eq!(check(&Ctx::root(), &f, MAY_EXEC), Err(Errno::EACCES));
        let fx = attr(libc::S_IFREG | 0o001, 10, 20);
        assert!(check(&Ctx::root(), &fx, MAY_EXEC).is_ok());
        let d = attr(libc::S_IFDIR, 10, 20);
        assert!(check(&Ctx::root(), &d, MAY_EXEC).is_ok());
    }

    #[test]
    fn sticky() {
        let dir = attr(libc::S_IFDIR | 0o1777, 1, 1);
        let mine = attr(libc::S_IFREG | 0o644, 5, 5);
        assert!(check_sticky(&Ctx::user(5, 5), &dir, &mine).is_ok());
        assert_eq!(
            check_sticky(&Ctx::user(6, 5), &dir, &mine),
            Err(Errno::EPERM)
        );
        assert!(
            check_sticky(&Ctx::user(1, 1), &dir, &mine).is_ok(),
            "dir owner"
        );
        assert!(check_sticky(&Ctx::root(), &dir, &mine).is_ok());
    }
}
