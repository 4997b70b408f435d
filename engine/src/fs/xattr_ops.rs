//! Extended attribute operations, with the permission rules of Linux `xattr_permission`
//! (no change at all to an immutable or append-only inode); the two POSIX ACL names follow
//! the rules of `acl.rs` beyond that.
//!
//! A change is checked twice: first without a lock (so that errors come in Linux's order),
//! then again where it is made, inside the inode's attribute seqlock and under its xattr
//! shard (`apply.rs`, [`Filesystem::apply_xattr`] and [`Filesystem::apply_acl`]). A chmod,
//! chown, chgrp or `chattr` changes the attributes inside the same seqlock, and an ACL change
//! holds the same shard, so the check and the change are one step to each of them, as under
//! Linux's inode lock: no setxattr lands after the change that took its permission away has
//! returned.

use crossbeam_epoch as epoch;

use super::Filesystem;
use super::apply::OwnedAcl;
use crate::acl::{self, AclKind, SetOutcome};
use crate::attr::{AttrVals, flags};
use crate::errno::{Errno, Result};
use crate::id::Ino;
use crate::inode::Inode;
use crate::limits::XATTR_SIZE_MAX;
use crate::perm::{self, Ctx, MAY_READ, MAY_WRITE, Via};
use crate::record::Record;
use crate::stats::Op;
use crate::time::Timespec;
use crate::xattr::{Namespace, XATTR_CREATE, XATTR_REPLACE, Xattrs, namespace};

/// The rules of `xattr_permission` for reading or writing (`write`) attribute `name` of an
/// inode whose attributes are `v`; `perm(v, mask)` is the inode's permission check.
fn xattr_rules(
    ctx: &Ctx,
    v: &AttrVals,
    name: &[u8],
    write: bool,
    perm: impl FnOnce(&AttrVals, u32) -> Result<()>,
) -> Result<()> {
    let denied = if write { Errno::EPERM } else { Errno::ENODATA };
    // No attribute of an immutable or append-only inode changes, ACLs included.
    if write && v.flags & flags::FROZEN != 0 {
        return Err(Errno::EPERM);
    }
    match namespace(name)? {
        Namespace::Security => {
            // Through a mount the kernel has checked already (CAP_SETFCAP for file
            // capabilities, CAP_SYS_ADMIN for the rest), and removes a file's
            // capabilities on the writer's credentials when a write takes them away.
            let cap = if name == b"security.capability" {
                perm::caps::SETFCAP
            } else {
                perm::caps::SYS_ADMIN
            };
            if write && !ctx.has(cap) && ctx.via != Via::Kernel {
                return Err(Errno::EPERM);
            }
            Ok(())
        }
        Namespace::Trusted => {
            if ctx.has(perm::caps::SYS_ADMIN) {
                Ok(())
            } else {
                Err(denied)
            }
        }
        Namespace::User => {
            let fmt = v.mode & libc::S_IFMT;
            if fmt != libc::S_IFREG && fmt != libc::S_IFDIR {
                return Err(denied);
            }
            if fmt == libc::S_IFDIR
                && v.mode & libc::S_ISVTX != 0
                && write
                && !perm::owner_or_root(ctx, v)
            {
                return Err(Errno::EPERM);
            }
            perm(v, if write { MAY_WRITE } else { MAY_READ })
        }
        // Checked by the ACL rules themselves (`acl::set_xattr`); anyone who reaches the
        // inode may read its ACLs.
        Namespace::Acl(_) => Ok(()),
    }
}

/// The rules of `xattr_permission` for changing attribute `name`, inside the inode's
/// attribute seqlock (`v`: its values) and under its xattr shard (`x`: its attributes, the
/// access ACL among them).
fn may_change_xattr(ctx: &Ctx, v: &AttrVals, x: Option<&Xattrs>, name: &[u8]) -> Result<()> {
    xattr_rules(ctx, v, name, true, |v, mask| {
        let acl = (v.flags & flags::ACL != 0 && !perm::overrides(ctx, v, mask))
            .then(|| x.and_then(|x| x.get(acl::ACL_ACCESS_NAME)))
            .flatten()
            .map(|bytes| acl::Acl::parse(bytes).expect("stored ACLs are valid"));
        super::permission_with(ctx, v, acl.as_ref(), mask)
    })
}

impl Filesystem {
    /// The rules of `xattr_permission`, on the inode's attributes as they are now (without a
    /// lock: a change checks again where it is made).
    fn xattr_permission(&self, ctx: &Ctx, i: &Inode, name: &[u8], write: bool) -> Result<()> {
        xattr_rules(ctx, &i.attr.load(), name, write, |v, mask| {
            self.permission(ctx, i, v, mask)
        })
    }

    /// `setxattr` (`value`) or `removexattr` (`None`) of an ACL name.
    fn set_acl_xattr(
        &self,
        ctx: &Ctx,
        i: &Inode,
        kind: AclKind,
        value: Option<&[u8]>,
    ) -> Result<()> {
        let time = Timespec::now();
        self.apply_acl(i, |v, _| {
            // Checked again on the attributes the change is made on.
            if v.flags & flags::FROZEN != 0 {
                return Err(Errno::EPERM);
            }
            let outcome = match value {
                Some(value) => acl::set_xattr(ctx, v, kind, value)?,
                None => acl::remove_xattr(ctx, v, kind)?,
            };
            Ok(match outcome {
                SetOutcome::Nothing => None,
                SetOutcome::Apply { mode, acl } => Some(OwnedAcl {
                    default: kind == AclKind::Default,
                    acl: acl.as_ref().map(acl::Acl::to_xattr).unwrap_or_default(),
                    mode,
                    time,
                }),
            })
        })?;
        // A directory's ACLs decide which entry changes it allows and what new inodes in
        // it inherit (`revoke.rs`); the shard and the seqlock are released by now.
        self.revoked(i);
        Ok(())
    }

    /// The value of attribute `name`.
    pub fn getxattr(&self, ctx: &Ctx, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        let _c = self.begin(Op::Getxattr);
        let g = epoch::pin();
        let i = self.iget(ino, &g)?;
        self.xattr_permission(ctx, i, name, false)?;
        let v = i.attr.load();
        if matches!(namespace(name)?, Namespace::Acl(_)) && v.mode & libc::S_IFMT == libc::S_IFLNK {
            return Err(Errno::EOPNOTSUPP);
        }
        // An emptied inode (`inode.rs`, `EMPTIED`) lost its xattrs after its flags, which
        // were cleared after the mark: ESTALE, not the absence of what it had.
        if v.flags & flags::XATTRS == 0 {
            return Err(if i.is_emptied() {
                Errno::ESTALE
            } else {
                Errno::ENODATA
            });
        }
        let shard = self.xattrs.lock(i.ino, &self.stats);
        if i.is_emptied() {
            return Err(Errno::ESTALE);
        }
        shard
            .get(&i.ino)
            .and_then(|x| x.get(name))
            .map(<[u8]>::to_vec)
            .ok_or(Errno::ENODATA)
    }

    /// Sets attribute `name`; `flags` may hold `XATTR_CREATE` or `XATTR_REPLACE`.
    pub fn setxattr(
        &self,
        ctx: &Ctx,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        flags: i32,
    ) -> Result<()> {
        {
            let _c = self.begin(Op::Setxattr);
            if flags & !(XATTR_CREATE | XATTR_REPLACE) != 0 {
                return Err(Errno::EINVAL);
            }
            let g = epoch::pin();
            let i = self.iget(ino, &g)?;
            self.writable()?;
            self.xattr_permission(ctx, i, name, true)?;
            let _held = self.hold(i, &g)?;
            if let Namespace::Acl(kind) = namespace(name)? {
                self.set_acl_xattr(ctx, i, kind, Some(value))?;
                drop(_held);
                drop(_c);
                drop(g);
                self.report(ctx, |s| s.inode(ino, None));
                return Ok(());
            }
            if value.len() > XATTR_SIZE_MAX {
                return Err(Errno::E2BIG);
            }
            let rec = Record::SetXattr {
                inode: i.id(),
                name,
                value,
                time: Timespec::now(),
            };
            self.apply_xattr(&rec, i, |v, x| {
                may_change_xattr(ctx, v, x, name)?;
                let exists = x.is_some_and(|x| x.get(name).is_some());
                if flags & XATTR_CREATE != 0 && exists {
                    return Err(Errno::EEXIST);
                }
                if flags & XATTR_REPLACE != 0 && !exists {
                    return Err(Errno::ENODATA);
                }
                Ok(())
            })?;
        }
        self.report(ctx, |s| s.inode(ino, None));
        Ok(())
    }

    /// Names of all attributes the caller may see, each followed by NUL.
    pub fn listxattr(&self, ctx: &Ctx, ino: Ino) -> Result<Vec<u8>> {
        let _c = self.begin(Op::Listxattr);
        let g = epoch::pin();
        let i = self.iget(ino, &g)?;
        // As in `getxattr`: an emptied inode's list is not empty, it is gone.
        if i.attr.load().flags & flags::XATTRS == 0 {
            return if i.is_emptied() {
                Err(Errno::ESTALE)
            } else {
                Ok(Vec::new())
            };
        }
        let shard = self.xattrs.lock(i.ino, &self.stats);
        if i.is_emptied() {
            return Err(Errno::ESTALE);
        }
        Ok(shard.get(&i.ino).map_or_else(Vec::new, |x| {
            x.list(|n| ctx.has(perm::caps::SYS_ADMIN) || !n.starts_with(b"trusted."))
        }))
    }

    /// Removes attribute `name`.
    pub fn removexattr(&self, ctx: &Ctx, ino: Ino, name: &[u8]) -> Result<()> {
        {
            let _c = self.begin(Op::Removexattr);
            let g = epoch::pin();
            let i = self.iget(ino, &g)?;
            self.writable()?;
            self.xattr_permission(ctx, i, name, true)?;
            let _held = self.hold(i, &g)?;
            if let Namespace::Acl(kind) = namespace(name)? {
                self.set_acl_xattr(ctx, i, kind, None)?;
                drop(_held);
                drop(_c);
                drop(g);
                self.report(ctx, |s| s.inode(ino, None));
                return Ok(());
            }
            let rec = Record::RemoveXattr {
                inode: i.id(),
                name,
                time: Timespec::now(),
            };
            self.apply_xattr(&rec, i, |v, x| {
                may_change_xattr(ctx, v, x, name)?;
                x.and_then(|x| x.get(name)).map(drop).ok_or(Errno::ENODATA)
            })?;
        }
        self.report(ctx, |s| s.inode(ino, None));
        Ok(())
    }

    /// An xattr record as recovery applies it.
    pub(super) fn replay_xattr(&self, rec: &Record<'_>, i: &Inode) -> Result<()> {
        self.apply_xattr(rec, i, |_, x| match *rec {
            Record::RemoveXattr { name, .. } => {
                x.and_then(|x| x.get(name)).map(drop).ok_or(Errno::ENODATA)
            }
            _ => Ok(()),
        })
    }
}
