//! IOCTL: inode flags (`chattr`, `lsattr`) through `FS_IOC_GETFLAGS` / `FS_IOC_SETFLAGS`
//! and `FS_IOC_FSGETXATTR` / `FS_IOC_FSSETXATTR`; every other ioctl is ENOTTY.
//!
//! Below: the ioctl numbers, and how `FS_XFLAG_*` map to `FS_*_FL` (`fileattr_fill_xflags`).

use lanefs::Errno;

use super::reply::{Handled, OK, node};
use super::{Call, Server};
use crate::abi::*;
use crate::wire::Out;

/// `FS_IOC_GETFLAGS`, `FS_IOC_SETFLAGS` (`_IOR/_IOW('f', 1/2, long)`), and their 32-bit
/// forms (`int`).
const GETFLAGS: u32 = 0x8008_6601;
const SETFLAGS: u32 = 0x4008_6602;
const GETFLAGS32: u32 = 0x8004_6601;
const SETFLAGS32: u32 = 0x4004_6602;
/// `FS_IOC_FSGETXATTR`, `FS_IOC_FSSETXATTR` (`_IOR/_IOW('X', 31/32, struct fsxattr)`).
const FSGETXATTR: u32 = 0x801c_581f;
const FSSETXATTR: u32 = 0x401c_5820;
/// `sizeof(struct fsxattr)`: five `u32`s and 8 bytes of padding.
const FSXATTR_SIZE: usize = 28;
/// `FS_XFLAG_COMMON`: the xflags that have an inode flag (sync, immutable, append,
/// nodump, noatime, dax, projinherit).
const XFLAG_COMMON: u32 = 0x20 | 0x8 | 0x10 | 0x80 | 0x40 | 0x8000 | 0x200;
/// `(FS_*_FL, FS_XFLAG_*)`.
const MAP: [(u32, u32); 7] = [
    (lanefs::FS_IMMUTABLE_FL, 0x8),
    (lanefs::FS_APPEND_FL, 0x10),
    (lanefs::FS_NODUMP_FL, 0x80),
    (lanefs::FS_NOATIME_FL, 0x40),
    (0x8, 0x20),           // FS_SYNC_FL
    (0x0200_0000, 0x8000), // FS_DAX_FL
    (0x2000_0000, 0x200),  // FS_PROJINHERIT_FL
];

fn xflags_of(flags: u32) -> u32 {
    MAP.iter()
        .filter(|(f, _)| flags & f != 0)
        .map(|(_, x)| x)
        .sum()
}

fn flags_of(xflags: u32) -> u32 {
    MAP.iter()
        .filter(|(_, x)| xflags & x != 0)
        .map(|(f, _)| f)
        .sum()
}

impl Server {
    /// Inode flags: the kernel turns `FS_IOC_GETFLAGS` / `FS_IOC_SETFLAGS` and
    /// `FS_IOC_FSGETXATTR` / `FS_IOC_FSSETXATTR` on a regular file or directory into these
    /// (`fuse_fileattr_get` / `fuse_fileattr_set`, after its own owner and
    /// `CAP_LINUX_IMMUTABLE` checks, and after fetching the old flags with
    /// `FS_IOC_FSGETXATTR`, which a `chattr` therefore needs too). Every other ioctl is
    /// ENOTTY, as on tmpfs.
    pub(super) fn ioctl(&self, req: &Call, out: &mut Out) -> Handled {
        let a: fuse_ioctl_in = req.arg()?;
        let ino = node(req.h.nodeid);
        let in_data = req.data;
        let out_size = a.out_size as usize;
        // The kernel keeps the attributes it cached across an ioctl, and a flag change
        // stamps the ctime: made as a library caller's change, it is reported to the kernel
        // as an attribute invalidation (an inode's, never an entry's, which is safe from a
        // request thread), before this reply.
        let setter = || {
            let mut c = req.ctx();
            c.via = lanefs::Via::Library;
            c
        };
        let word = |b: &[u8], i: usize| {
            b.get(i * 4..i * 4 + 4)
                .map(|w| u32::from_ne_bytes(w.try_into().expect("4 bytes")))
        };
        let reply = |out: &mut Out, data: &[u8]| -> Handled {
            let o = fuse_ioctl_out {
                result: 0,
                flags: 0,
                in_iovs: 0,
                out_iovs: 0,
            };
            if out.push_obj(&o) && out.push(&data[..out_size.min(data.len())]) {
                OK
            } else {
                Err(Errno::ERANGE)
            }
        };
        match a.cmd {
            GETFLAGS | GETFLAGS32 => {
                let f = self.fs.get_flags(ino)?;
                reply(out, &f.to_ne_bytes())
            }
            SETFLAGS | SETFLAGS32 => {
                let f = word(in_data, 0).ok_or(Errno::EINVAL)?;
                self.fs.set_flags(&setter(), ino, f)?;
                reply(out, &[])
            }
            FSGETXATTR => {
                let f = self.fs.get_flags(ino)?;
                let mut b = [0u8; FSXATTR_SIZE];
                b[..4].copy_from_slice(&xflags_of(f).to_ne_bytes());
                reply(out, &b)
            }
            FSSETXATTR => {
                // tmpfs keeps no extent sizes or project ids, and of the xflags only the
                // common ones, which map to inode flags (`fileattr_has_fsx`).
                let x: Vec<u32> = (0..5)
                    .map(|i| word(in_data, i))
                    .collect::<Option<_>>()
                    .ok_or(Errno::EINVAL)?;
                let (xflags, extsize, projid, cowextsize) = (x[0], x[1], x[3], x[4]);
                if xflags & !XFLAG_COMMON != 0 || extsize | projid | cowextsize != 0 {
                    return Err(Errno::EOPNOTSUPP);
                }
                self.fs.set_flags(&setter(), ino, flags_of(xflags))?;
                reply(out, &[])
            }
            _ => Err(Errno::ENOTTY),
        }
    }
}
