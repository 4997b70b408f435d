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
    ///   to it: `fs.protected_hardlinks`, `fs.protected_symlinks` (the kernel walks paths
    ///   itself), and the capabilities that writing `security.*`
    ///   attributes needs (the kernel itself sends the removal of a file's capabilities, on
    ///   the credentials of the writer whose change takes them away); and a SETATTR that
    ///   changes nothing, which the kernel sends to take set-id bits away before a write, is
    ///   allowed to a caller who may write the file, not only to its owner.
    Kernel,
}

/// The capabilities (`capabilities(7)`) that decide what a caller may do to files, at
/// their bits in `/proc/PID/status`'s `CapEff`. A [`Ctx`] made for a uid has all of them
/// for root and none otherwise; [`Ctx::with_caps`] sets them as a process has them (a root
/// that dropped some, a user granted some).
pub mod caps {
    /// Change any file's owner and group (`chown`).
    pub const CHOWN: u64 = 1 << 0;
    /// Read, write and search any inode (execute one with an x bit somewhere).
    pub const DAC_OVERRIDE: u64 = 1 << 1;
    /// Read any file, read and search any directory.
    pub const DAC_READ_SEARCH: u64 = 1 << 2;
    /// What only an owner may (chmod, utimes, ACLs, `chattr`, a sticky directory's entries).
    pub const FOWNER: u64 = 1 << 3;
    /// Keep set-user-ID and set-group-ID bits the change would take away.
    pub const FSETID: u64 = 1 << 4;
    /// Set and clear the immutable and append-only flags.
    pub const LINUX_IMMUTABLE: u64 = 1 << 9;
    /// `trusted.*` and `security.*` extended attributes.
    pub const SYS_ADMIN: u64 = 1 << 21;
    /// Make device nodes.
    pub const MKNOD: u64 = 1 << 27;
    /// Set file capabilities (`security.capability`).
    pub const SETFCAP: u64 = 1 << 31;
    /// All of the above: root's.
    pub const ALL: u64 = CHOWN
        | DAC_OVERRIDE
        | DAC_READ_SEARCH
        | FOWNER
        | FSETID
        | LINUX_IMMUTABLE
        | SYS_ADMIN
        | MKNOD
        | SETFCAP;
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
    /// Its [`caps`].
    caps: u64,
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
            caps: if uid == 0 { caps::ALL } else { 0 },
        }
    }

    /// Sets the capabilities ([`caps`] bits; others are ignored), as the process has them:
    /// `CapEff` of `/proc/PID/status`. `keeps_setid` follows `CAP_FSETID`.
    pub fn with_caps(mut self, caps: u64) -> Self {
        self.caps = caps & caps::ALL;
        self.keeps_setid = caps & caps::FSETID != 0;
        self
    }

    /// Whether the caller has capability `cap` (a [`caps`] bit).
    #[inline]
    pub fn has(&self, cap: u64) -> bool {
        self.caps & cap != 0
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

    /// Whether the caller has every capability of [`caps`] (root, unless it dropped some).
    #[inline]
    pub fn is_root(&self) -> bool {
        self.caps & caps::ALL == caps::ALL
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

/// Whether `ctx`'s capabilities grant `mask` on an inode with attributes `a` whatever its
/// mode and ACL say (`generic_permission`'s last step): `CAP_DAC_READ_SEARCH` reading a
/// file or reading and searching a directory, `CAP_DAC_OVERRIDE` anything but executing a
/// non-directory with no x bit at all.
pub(crate) fn overrides(ctx: &Ctx, a: &AttrVals, mask: u32) -> bool {
    let mask = mask & (MAY_READ | MAY_WRITE | MAY_EXEC);
    if a.mode & libc::S_IFMT == libc::S_IFDIR {
        return mask & MAY_WRITE == 0 && ctx.has(caps::DAC_READ_SEARCH)
            || ctx.has(caps::DAC_OVERRIDE);
    }
    mask == MAY_READ && ctx.has(caps::DAC_READ_SEARCH)
        || (mask & MAY_EXEC == 0 || a.mode & 0o111 != 0) && ctx.has(caps::DAC_OVERRIDE)
}

/// `generic_permission`: may `ctx` access an inode with attributes `a` for `mask`?
pub(crate) fn check(ctx: &Ctx, a: &AttrVals, mask: u32) -> Result<()> {
    if overrides(ctx, a, mask) {
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

/// Whether `ctx` is the owner or has `CAP_FOWNER` (`inode_owner_or_capable`).
pub(crate) fn owner_or_root(ctx: &Ctx, a: &AttrVals) -> bool {
    ctx.uid == a.uid || ctx.has(caps::FOWNER)
}

/// Whether `ctx` is in group `gid` or has `CAP_FSETID` (`in_group_or_capable`): whether a
/// set-group-ID bit it sets or keeps stays.
pub(crate) fn in_group_or_fsetid(ctx: &Ctx, gid: u32) -> bool {
    ctx.in_group(gid) || ctx.has(caps::FSETID)
}

/// The sticky-directory rule: in a sticky directory, only the owner of an entry, the owner of
/// the directory or root may remove or rename it.
pub(crate) fn check_sticky(ctx: &Ctx, dir: &AttrVals, victim: &AttrVals) -> Result<()> {
    if dir.mode & libc::S_ISVTX != 0
        && !ctx.has(caps::FOWNER)
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
    fn capabilities_decide_not_the_uid() {
        let f = attr(libc::S_IFREG | 0o600, 10, 20);
        let d = attr(libc::S_IFDIR | 0o700, 10, 20);
        let user = |c| Ctx::user(500, 500).with_caps(c);
        // A user granted CAP_DAC_OVERRIDE reads and writes someone else's file.
        assert!(check(&user(caps::DAC_OVERRIDE), &f, MAY_READ | MAY_WRITE).is_ok());
        assert!(check(&user(caps::DAC_OVERRIDE), &d, MAY_WRITE | MAY_EXEC).is_ok());
        // CAP_DAC_READ_SEARCH: read a file, read and search a directory, nothing else.
        let rs = user(caps::DAC_READ_SEARCH);
        assert!(check(&rs, &f, MAY_READ).is_ok());
        assert_eq!(check(&rs, &f, MAY_WRITE), Err(Errno::EACCES));
        assert!(check(&rs, &d, MAY_READ | MAY_EXEC).is_ok());
        assert_eq!(check(&rs, &d, MAY_WRITE | MAY_EXEC), Err(Errno::EACCES));
        // Root that dropped them is an ordinary user of another's file.
        let root = Ctx::root().with_caps(caps::ALL & !(caps::DAC_OVERRIDE | caps::DAC_READ_SEARCH));
        assert_eq!(check(&root, &f, MAY_READ), Err(Errno::EACCES));
        assert!(!root.is_root());
        assert!(owner_or_root(&user(caps::FOWNER), &f));
        assert!(!owner_or_root(&Ctx::root().with_caps(0), &f));
        assert!(!Ctx::root().with_caps(0).keeps_setid);
        assert!(in_group_or_fsetid(&user(caps::FSETID), 20));
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
