//! The channel's own requests (`lanefs-channel`: `OP_STAT` to `OP_FSYNC`): a path from the
//! filesystem's root and the call to make on it, served by the engine's path resolution
//! ([`lanefs::At`], confined: a path that leaves the filesystem is answered EXDEV, and the
//! client makes that call through the kernel). Every directory on the way is checked for
//! search permission and the call itself as the library checks it, with the credentials
//! the channel learned from its socket; the engine tells the kernel what changed before the
//! call returns (a library caller's report, `lanefs::Invalidate`), so that the kernel's
//! caches agree with the channel at once.

use lanefs::{At, Attr, Errno, ROOT_INO, SetAttr};
use lanefs_channel::{
    ASK_HELD, BORN, FOLLOW, FsyncIn, HELD, LinkIn, NOFOLLOW, OP_FSYNC, OP_LINK, OP_MKDIR, OP_MKNOD,
    OP_READLINK, OP_RENAME, OP_RMDIR, OP_SETATTR, OP_STAT, OP_SYMLINK, OP_UNLINK, RenameIn,
    SetattrIn, StatIn, StatOut,
};

use super::reply::{Handled, OK, done, fattr, put, tset};
use super::{Call, Server};
use crate::abi::*;
use crate::wire::{Out, cstr};

impl Server {
    /// One channel request (the opcode table's entry for all of them).
    pub(super) fn path_call(&self, req: &Call, out: &mut Out) -> Handled {
        // A create applies the caller's umask (or the parent's default ACL instead).
        let umask = match req.h.opcode {
            OP_MKNOD => Some(req.arg::<fuse_mknod_in>()?.umask),
            OP_MKDIR => Some(req.arg::<fuse_mkdir_in>()?.umask),
            _ => None,
        };
        let ctx = match umask {
            Some(u) => req.ctx().with_umask(u),
            None => req.ctx(),
        };
        let at = At::new(&self.fs, &ctx, ROOT_INO).confined();
        let (path, rest) = cstr(req.data)?;
        match req.h.opcode {
            OP_STAT => {
                let f: StatIn = req.arg()?;
                let a = at.stat(path, f.flags & NOFOLLOW == 0)?;
                let held = f.flags & ASK_HELD != 0 && self.fs.held_by_kernel(a.ino);
                let mut reply = stat_reply(&a);
                reply.flags |= if held { HELD } else { 0 };
                put(out, &reply)
            }
            OP_MKNOD => {
                let m: fuse_mknod_in = req.arg()?;
                stat_out(at.mknod(path, m.mode, m.rdev.into()), out)
            }
            OP_MKDIR => {
                let m: fuse_mkdir_in = req.arg()?;
                stat_out(at.mkdir(path, m.mode), out)
            }
            OP_UNLINK => done(at.unlink(path)),
            OP_RMDIR => done(at.rmdir(path)),
            OP_RENAME => {
                let r: RenameIn = req.arg()?;
                let (to, _) = cstr(rest)?;
                let moved = |p: &[u8]| {
                    at.stat(p, false).is_ok_and(|a| {
                        a.mode & libc::S_IFMT == libc::S_IFDIR && self.fs.held_by_kernel(a.ino)
                    })
                };
                // A directory the kernel holds is moved by the kernel, which moves its dentry:
                // over the channel its dentry could only be dropped, and a working directory
                // or descriptor in it would then have no path (`getcwd` fails, `/proc` shows
                // it deleted) or an old one. EXDEV: the client renames through the kernel.
                if moved(path) || r.flags & libc::RENAME_EXCHANGE != 0 && moved(to) {
                    return Err(Errno::EXDEV);
                }
                done(at.rename(path, &at, to, r.flags))
            }
            OP_LINK => {
                let l: LinkIn = req.arg()?;
                let (to, _) = cstr(rest)?;
                stat_out(at.link(path, l.flags & FOLLOW != 0, &at, to), out)
            }
            OP_SYMLINK => {
                // The target first, then the link's path.
                let (link, _) = cstr(rest)?;
                stat_out(at.symlink(path, link), out)
            }
            OP_READLINK => {
                let t = at.readlink(path)?;
                if out.push(&t) { OK } else { Err(Errno::ERANGE) }
            }
            OP_SETATTR => {
                let s: SetattrIn = req.arg()?;
                stat_out(at.setattr(path, s.flags & NOFOLLOW == 0, &set_of(&s)), out)
            }
            OP_FSYNC => {
                // A file the client made and has not opened through the kernel: its path
                // must still name it. The sync is the store's, as for the kernel's FSYNC
                // (a memory store has nothing to make durable).
                let f: FsyncIn = req.arg()?;
                let a = at.stat(path, false)?;
                if a.ino.get() != f.ino {
                    return Err(Errno::ESTALE);
                }
                if self.fs.held_by_kernel(a.ino) {
                    // The kernel may hold dirty pages of it (another descriptor, a shared
                    // mapping), which only its own FSYNC writes back first: the client
                    // settles the descriptor and fsyncs through the kernel.
                    return Err(Errno::EXDEV);
                }
                if self.volatile_store {
                    return OK;
                }
                done(self.fs.fsync_inode(a.ino, f.datasync != 0))
            }
            _ => Err(Errno::ENOSYS),
        }
    }
}

fn stat_out(r: lanefs::Result<Attr>, out: &mut Out) -> Handled {
    put(out, &stat_reply(&r?))
}

/// The attributes of `a` as a channel reply has them: `fuse_attr`'s fields and the birth time.
fn stat_reply(a: &Attr) -> StatOut {
    let (flags, (btime, btimensec)) = match a.btime {
        Some(t) => (BORN, (t.sec, t.nsec)),
        None => (0, (0, 0)),
    };
    StatOut {
        attr: fattr(a),
        flags,
        btime,
        btimensec,
        ..StatOut::default()
    }
}

/// What a channel SETATTR asks for. `chown(path, -1, -1)` arrives as an owner change with
/// both ids `u32::MAX` (it takes set-id bits away, as on the kernel's side).
fn set_of(s: &SetattrIn) -> SetAttr {
    let has = |bit: u32| s.valid & bit != 0;
    let id = |bit: u32, v: u32| (has(bit) && v != u32::MAX).then_some(v);
    SetAttr {
        mode: has(FATTR_MODE).then_some(s.mode),
        uid: id(FATTR_UID, s.uid),
        gid: id(FATTR_GID, s.gid),
        size: has(FATTR_SIZE).then_some(s.size),
        atime: has(FATTR_ATIME).then(|| tset(has(FATTR_ATIME_NOW), s.atime, s.atimensec)),
        mtime: has(FATTR_MTIME).then(|| tset(has(FATTR_MTIME_NOW), s.mtime, s.mtimensec)),
        chown: has(FATTR_UID) || has(FATTR_GID),
        ..SetAttr::default()
    }
}
