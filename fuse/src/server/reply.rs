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
    flags: 0,
};
