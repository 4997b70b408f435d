//! Extended attributes (ACLs among them: `FUSE_POSIX_ACL`, docs/DESIGN.md §7).

use lanefs::Errno;

use super::reply::{Handled, OK, done, node, put};
use super::{Call, Server};
use crate::abi::*;
use crate::wire::Out;

impl Server {
    pub(super) fn setxattr(&self, req: &Call) -> Handled {
        let a: fuse_setxattr_in = req.arg()?;
        let (name, value) = req.name()?;
        let value = value.get(..a.size as usize).ok_or(Errno::EINVAL)?;
        done(
            self.fs
                .setxattr(&req.ctx(), node(req.h.nodeid), name, value, a.flags as i32),
        )
    }

    pub(super) fn getxattr(&self, req: &Call, out: &mut Out) -> Handled {
        let a: fuse_getxattr_in = req.arg()?;
        let (name, _) = req.name()?;
        let r = self.fs.getxattr(&req.ctx(), node(req.h.nodeid), name);
        Self::xattr(r, a.size, out)
    }

    pub(super) fn listxattr(&self, req: &Call, out: &mut Out) -> Handled {
        let a: fuse_getxattr_in = req.arg()?;
        Self::xattr(
            self.fs.listxattr(&req.ctx(), node(req.h.nodeid)),
            a.size,
            out,
        )
    }

    pub(super) fn removexattr(&self, req: &Call) -> Handled {
        let (name, _) = req.name()?;
        done(self.fs.removexattr(&req.ctx(), node(req.h.nodeid), name))
    }

    pub(super) fn xattr(r: lanefs::Result<Vec<u8>>, size: u32, out: &mut Out) -> Handled {
        let v = r?;
        if size == 0 {
            return put(
                out,
                &fuse_getxattr_out {
                    size: v.len() as u32,
                    padding: 0,
                },
            );
        }
        if v.len() > size as usize || !out.push(&v) {
            return Err(Errno::ERANGE);
        }
        OK
    }
}
