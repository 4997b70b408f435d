//! Extended attribute operations, with the permission rules of Linux `xattr_permission`.

use crossbeam_epoch as epoch;

use super::Filesystem;
use crate::attr::Ino;
use crate::errno::{Errno, Result};
use crate::inode::Inode;
use crate::perm::{self, Ctx, MAY_READ, MAY_WRITE};
use crate::stats::{LockClass, Op};
use crate::xattr::{Namespace, XATTR_CREATE, XATTR_REPLACE, namespace};

impl Filesystem {
    fn xattr_permission(&self, ctx: &Ctx, i: &Inode, name: &[u8], write: bool) -> Result<()> {
        let denied = if write { Errno::EPERM } else { Errno::ENODATA };
        let v = i.attr.load();
        match namespace(name)? {
            Namespace::Security => {
                if write && !ctx.is_root() {
                    return Err(Errno::EPERM);
                }
                Ok(())
            }
            Namespace::Trusted => {
                if ctx.is_root() {
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
                    && !perm::owner_or_root(ctx, &v)
                {
                    return Err(Errno::EPERM);
                }
                perm::check(ctx, &v, if write { MAY_WRITE } else { MAY_READ })
            }
        }
    }

    /// The value of attribute `name`.
    pub fn getxattr(&self, ctx: &Ctx, ino: Ino, name: &[u8]) -> Result<Vec<u8>> {
        let _c = self.begin(Op::Getxattr);
        let g = epoch::pin();
        let i = self.inode(ino, &g)?;
        self.xattr_permission(ctx, i, name, false)?;
        let m = i.xattrs.get().ok_or(Errno::ENODATA)?;
        let x = self.stats.lock(LockClass::Xattr, m);
        x.get(name).map(<[u8]>::to_vec).ok_or(Errno::ENODATA)
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
        let _c = self.begin(Op::Setxattr);
        if flags & !(XATTR_CREATE | XATTR_REPLACE) != 0 {
            return Err(Errno::EINVAL);
        }
        let g = epoch::pin();
        let i = self.inode(ino, &g)?;
        self.writable()?;
        self.xattr_permission(ctx, i, name, true)?;
        {
            let m = i.xattrs.get_or_init(Default::default);
            self.stats
                .lock(LockClass::Xattr, m)
                .set(name, value, flags)?;
        }
        i.attr.touch_c(&self.stats);
        drop(_c);
        self.report(ctx, |s| s.inode(ino, None));
        Ok(())
    }

    /// Names of all attributes the caller may see, each followed by NUL.
    pub fn listxattr(&self, ctx: &Ctx, ino: Ino) -> Result<Vec<u8>> {
        let _c = self.begin(Op::Listxattr);
        let g = epoch::pin();
        let i = self.inode(ino, &g)?;
        let Some(m) = i.xattrs.get() else {
            return Ok(Vec::new());
        };
        let x = self.stats.lock(LockClass::Xattr, m);
        Ok(x.list(|n| ctx.is_root() || !n.starts_with(b"trusted.")))
    }

    /// Removes attribute `name`.
    pub fn removexattr(&self, ctx: &Ctx, ino: Ino, name: &[u8]) -> Result<()> {
        let _c = self.begin(Op::Removexattr);
        let g = epoch::pin();
        let i = self.inode(ino, &g)?;
        self.writable()?;
        self.xattr_permission(ctx, i, name, true)?;
        {
            let m = i.xattrs.get().ok_or(Errno::ENODATA)?;
            self.stats.lock(LockClass::Xattr, m).remove(name)?;
        }
        i.attr.touch_c(&self.stats);
        drop(_c);
        self.report(ctx, |s| s.inode(ino, None));
        Ok(())
    }
}
