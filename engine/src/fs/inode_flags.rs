//! Inode flags (`chattr`, `lsattr`): `FS_IMMUTABLE_FL`, `FS_APPEND_FL`, `FS_NODUMP_FL` and
//! `FS_NOATIME_FL`, the ones tmpfs keeps, kept in the inode's flags word beside the mode
//! (`attr.rs`) and changed inside the attribute seqlock, where their record is appended.
//!
//! Setting them follows Linux's `vfs_fileattr_set`: the owner or root may change them, only
//! root (`CAP_LINUX_IMMUTABLE`) may change 'i' or 'a', and any other flag is refused as
//! tmpfs refuses it (EOPNOTSUPP), after those two checks. Only regular files and directories
//! have them to show (tmpfs's other inodes answer ENOTTY), though every new inode inherits 'd'
//! and 'A' from its directory. What 'i' and 'a' forbid is checked where each change is
//! made (`namespace.rs`, `file.rs`, `xattr_ops.rs`, and every MAY_WRITE permission check in
//! `permission_with`); 'A' stops the access-time updates of reads and directory reads.

use crossbeam_epoch as epoch;

use super::{Filesystem, InodeRef};
use crate::attr::{Attr, flags};
use crate::errno::{Errno, Result};
use crate::inode::{Body, Inode};
use crate::perm::{self, Ctx};
use crate::record::Record;
use crate::stats::Op;
use crate::time::Timespec;

/// Regular files and directories have inode flags to show and set (tmpfs's other inodes
/// have no `fileattr` operations: ENOTTY).
fn has_fileattr(i: &Inode) -> Result<()> {
    match i.body {
        Body::File(_) | Body::Dir(_) => Ok(()),
        _ => Err(Errno::ENOTTY),
    }
}

impl Filesystem {
    /// The inode flags of `ino` (`FS_IOC_GETFLAGS`): [`crate::FS_IMMUTABLE_FL`],
    /// [`crate::FS_APPEND_FL`], [`crate::FS_NODUMP_FL`], [`crate::FS_NOATIME_FL`]. ENOTTY for
    /// an inode other than a regular file or directory.
    pub fn get_flags(&self, ino: impl Into<InodeRef>) -> Result<u32> {
        let _c = self.begin(Op::GetFlags);
        let g = epoch::pin();
        let i = self.iget(ino, &g)?;
        has_fileattr(i)?;
        Ok(i.attr.flags() & flags::USER)
    }

    /// Sets the inode flags of `ino` to `new` (`FS_IOC_SETFLAGS`; every one of the four flags
    /// is set or cleared) and stamps its ctime. EPERM unless `ctx` owns the inode or is root,
    /// EPERM if `ctx` is not root and 'i' or 'a' would change, EOPNOTSUPP for any other flag,
    /// ENOTTY for an inode other than a regular file or directory.
    pub fn set_flags(&self, ctx: &Ctx, ino: impl Into<InodeRef>, new: u32) -> Result<Attr> {
        let ino = ino.into();
        let a = {
            let _c = self.begin(Op::SetFlags);
            let g = epoch::pin();
            let i = self.iget(ino, &g)?;
            self.writable()?;
            has_fileattr(i)?;
            let _held = self.hold(i, &g)?;
            let time = Timespec::now();
            i.attr.update(&self.stats, |v| {
                if !perm::owner_or_root(ctx, v) {
                    return Err(Errno::EPERM);
                }
                if (new ^ v.flags) & flags::FROZEN != 0 && !ctx.has(perm::caps::LINUX_IMMUTABLE) {
                    return Err(Errno::EPERM);
                }
                if new & !flags::USER != 0 {
                    return Err(Errno::EOPNOTSUPP);
                }
                let rec = Record::SetFlags {
                    inode: i.id(),
                    flags: new,
                    time,
                };
                self.commit(&rec)?;
                Self::apply_flags(v, &rec);
                Ok(())
            })?;
            // 'i' and 'a' decide which entry changes a directory allows, 'd' and 'A' what its
            // new inodes inherit (`revoke.rs`).
            self.revoked(i);
            self.attr_of(i, &g)
        };
        self.report(ctx, |s| s.inode(ino.ino(), None));
        Ok(a)
    }
}

#[cfg(test)]
mod tests {
    use crate::{
        Config, Ctx, FS_APPEND_FL, FS_IMMUTABLE_FL, FS_NOATIME_FL, FS_NODUMP_FL, Filesystem,
        STATX_ATTR_APPEND, STATX_ATTR_IMMUTABLE, STATX_ATTR_NODUMP, STATX_ATTRS,
    };

    /// The attributes carry the inode flags, and `statx_attributes` gives the bits `statx`
    /// reports for them as tmpfs reports them: 'i', 'a' and 'd' (not 'A'), on files and
    /// directories, and 'd' inherited by every kind of inode made in a 'd' directory.
    #[test]
    fn attributes_carry_the_flags_statx_reports() {
        let fs = Filesystem::new(Config::default());
        let root = Ctx::root();
        let dir = fs.mkdir(&root, fs.root(), b"d", 0o755).unwrap().ino;
        let (f, _) = fs.create(&root, fs.root(), b"f", 0o644, 0).unwrap();
        assert_eq!((f.flags, f.statx_attributes()), (0, 0));
        assert_eq!(
            STATX_ATTRS,
            STATX_ATTR_IMMUTABLE | STATX_ATTR_APPEND | STATX_ATTR_NODUMP
        );
        for (flags, bits) in [
            (FS_IMMUTABLE_FL, STATX_ATTR_IMMUTABLE),
            (FS_APPEND_FL, STATX_ATTR_APPEND),
            (FS_NODUMP_FL, STATX_ATTR_NODUMP),
            (FS_NOATIME_FL, 0),
            (
                FS_IMMUTABLE_FL | FS_APPEND_FL | FS_NODUMP_FL | FS_NOATIME_FL,
                STATX_ATTRS,
            ),
            (0, 0),
        ] {
            let a = fs.set_flags(&root, f.ino, flags).unwrap();
            assert_eq!((a.flags, a.statx_attributes()), (flags, bits), "{flags:#x}");
            let a = fs.getattr(f.ino).unwrap();
            assert_eq!((a.flags, a.statx_attributes()), (flags, bits), "{flags:#x}");
        }
        fs.set_flags(&root, dir, FS_NODUMP_FL | FS_APPEND_FL)
            .unwrap();
        assert_eq!(
            fs.getattr(dir).unwrap().statx_attributes(),
            STATX_ATTR_NODUMP | STATX_ATTR_APPEND
        );
        let made = [
            fs.mknod(&root, dir, b"fifo", libc::S_IFIFO | 0o644, 0)
                .unwrap(),
            fs.symlink(&root, dir, b"link", b"t").unwrap(),
            fs.mkdir(&root, dir, b"sub", 0o755).unwrap(),
            fs.create(&root, dir, b"file", 0o644, 0).unwrap().0,
        ];
        for a in made {
            assert_eq!(
                (a.flags, a.statx_attributes()),
                (FS_NODUMP_FL, STATX_ATTR_NODUMP)
            );
            let again = fs.getattr(a.ino).unwrap();
            assert_eq!(again.statx_attributes(), STATX_ATTR_NODUMP);
        }
        let sym = fs.lookup(&root, dir, b"link").unwrap();
        assert_eq!(
            sym.statx_attributes(),
            STATX_ATTR_NODUMP,
            "a lookup's attributes too"
        );
        fs.set_flags(&root, dir, 0).unwrap();
        fs.check_invariants().unwrap();
    }
}
