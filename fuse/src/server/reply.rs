//! Reply bodies: what a handler returns ([`Handled`]) and the encoding of the engine's
//! attributes and file types in the kernel's structures.

use lanefs::{Attr, Errno, FileType, Ino, TimeSet, Timespec};
use zerocopy::IntoBytes;

use crate::abi::*;
use crate::wire::{Answer, Out};

/// A handler's result: how the request is answered, or the errno it is answered with.
pub(super) type Handled = Result<Answer, Errno>;

pub(super) const OK: Handled = Ok(Answer::Reply(0));

/// The answer to a request whose reply has no body.
pub(super) fn done(r: lanefs::Result<()>) -> Handled {
    r.map(|()| Answer::Reply(0))
}

/// Writes `t` as the reply body; ERANGE (never expected) if the buffer cannot hold it.
pub(super) fn put<T: IntoBytes + zerocopy::Immutable>(out: &mut Out, t: &T) -> Handled {
    if out.push_obj(t) {
        OK
    } else {
        Err(Errno::ERANGE)
    }
}

/// The engine's inode number for a FUSE node id (they are the same numbers).
pub(super) fn node(n: u64) -> Ino {
    Ino(n)
}

/// `d_type` of a file type, as `fuse_dirent.type` carries it.
pub(super) fn dtype(k: FileType) -> u32 {
    match k {
        FileType::RegularFile => libc::DT_REG,
        FileType::Directory => libc::DT_DIR,
        FileType::Symlink => libc::DT_LNK,
        FileType::CharDevice => libc::DT_CHR,
        FileType::BlockDevice => libc::DT_BLK,
        FileType::NamedPipe => libc::DT_FIFO,
        FileType::Socket => libc::DT_SOCK,
    }
    .into()
}

/// The attributes as `fuse_attr` carries them.
pub(super) fn fattr(a: &Attr) -> fuse_attr {
    fuse_attr {
        ino: a.ino.get(),
        size: a.size,
        blocks: a.blocks,
        // Seconds before 1970 are negative; the kernel reads the field as signed.
        atime: a.atime.sec as u64,
        mtime: a.mtime.sec as u64,
        ctime: a.ctime.sec as u64,
        atimensec: a.atime.nsec,
        mtimensec: a.mtime.nsec,
        ctimensec: a.ctime.nsec,
        mode: a.mode,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev as u32,
        blksize: a.blksize,
        padding: 0,
    }
}

/// The attributes as `fuse_statx` carries them: the basic fields, the birth time where the
/// inode has one (`STATX_BTIME`), and the `STATX_ATTR_*` bits of the inode flags with the
/// mask of those lanefs supports.
pub(super) fn statx(a: &Attr) -> fuse_statx {
    let t = |t: Timespec| fuse_sx_time {
        tv_sec: t.sec,
        tv_nsec: t.nsec,
        reserved: 0,
    };
    // The engine keeps a device number as the kernel's MKNOD sent it (`new_encode_dev`).
    let rdev = lanefs_channel::decode_dev(a.rdev as u32);
    let (btime_mask, btime) = match a.btime {
        Some(b) => (libc::STATX_BTIME, t(b)),
        None => (0, fuse_sx_time::default()),
    };
    fuse_statx {
        mask: libc::STATX_BASIC_STATS | btime_mask,
        blksize: a.blksize,
        attributes: a.statx_attributes(),
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        mode: a.mode as u16,
        ino: a.ino.get(),
        size: a.size,
        blocks: a.blocks,
        attributes_mask: lanefs::STATX_ATTRS,
        atime: t(a.atime),
        ctime: t(a.ctime),
        mtime: t(a.mtime),
        btime,
        rdev_major: libc::major(rdev),
        rdev_minor: libc::minor(rdev),
        ..fuse_statx::default()
    }
}

/// A time a SETATTR carries: now, or the seconds and nanoseconds given.
pub(super) fn tset(now: bool, sec: u64, nsec: u32) -> TimeSet {
    if now {
        TimeSet::Now
    } else {
        TimeSet::At(Timespec::new(sec as i64, nsec))
    }
}

/// Attributes sent with a negative entry (the kernel ignores them).
pub(super) const NEGATIVE: Attr = Attr {
    ino: Ino(0),
    generation: lanefs::Generation(0),
    mode: libc::S_IFREG,
    nlink: 0,
    uid: 0,
    gid: 0,
    rdev: 0,
    size: 0,
    blocks: 0,
    blksize: 4096,
    atime: Timespec::new(0, 0),
    mtime: Timespec::new(0, 0),
    ctime: Timespec::new(0, 0),
    btime: None,
    flags: 0,
};

#[cfg(test)]
mod tests {
    use super::*;

    /// FUSE_STATX's reply: the basic fields as GETATTR's `fuse_attr` has them (the device
    /// number split as `statx` splits it), the birth time if the inode has one, and the inode flags' `STATX_ATTR_*`
    /// bits with the mask of the three lanefs supports.
    #[test]
    fn statx_carries_the_basic_fields_and_the_flags() {
        // new_encode_dev(makedev(259, 300)), as the kernel's MKNOD sends it.
        let (major, minor) = (259u32, 300u32);
        let rdev = (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12);
        let a = Attr {
            ino: Ino(42),
            mode: libc::S_IFCHR | 0o640,
            nlink: 3,
            uid: 7,
            gid: 8,
            rdev: rdev.into(),
            size: 5,
            blocks: 8,
            atime: Timespec::new(-1, 5),
            mtime: Timespec::new(100, 6),
            ctime: Timespec::new(200, 999_999_999),
            flags: lanefs::FS_IMMUTABLE_FL | lanefs::FS_NODUMP_FL | lanefs::FS_NOATIME_FL,
            ..NEGATIVE
        };
        let sx = statx(&a);
        let fa = fattr(&a);
        assert_eq!(
            sx.mask,
            libc::STATX_BASIC_STATS,
            "no birth time, no STATX_BTIME"
        );
        assert_eq!(
            (
                sx.ino,
                sx.mode as u32,
                sx.nlink,
                sx.uid,
                sx.gid,
                sx.size,
                sx.blocks
            ),
            (
                fa.ino, fa.mode, fa.nlink, fa.uid, fa.gid, fa.size, fa.blocks
            )
        );
        assert_eq!((sx.rdev_major, sx.rdev_minor), (major, minor));
        assert_eq!(sx.blksize, 4096);
        let t = |t: fuse_sx_time| (t.tv_sec, t.tv_nsec);
        assert_eq!(t(sx.atime), (-1, 5));
        assert_eq!(t(sx.mtime), (100, 6));
        assert_eq!(t(sx.ctime), (200, 999_999_999));
        assert_eq!(t(sx.btime), (0, 0));
        assert_eq!(
            sx.attributes,
            lanefs::STATX_ATTR_IMMUTABLE | lanefs::STATX_ATTR_NODUMP
        );
        assert_eq!(sx.attributes_mask, lanefs::STATX_ATTRS);
        let born = statx(&Attr {
            btime: Some(Timespec::new(150, 7)),
            ..a
        });
        assert_eq!(born.mask, libc::STATX_BASIC_STATS | libc::STATX_BTIME);
        assert_eq!(t(born.btime), (150, 7));
    }
}
