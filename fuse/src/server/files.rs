//! Attributes and file data: GETATTR, SETATTR, ACCESS, STATFS, READLINK, and the requests
//! on regular files, which reach the server by inode with handle 0 (no-open mode, docs/DESIGN.md
//! §7): READ, WRITE, FSYNC, FALLOCATE, LSEEK.

use std::sync::Arc;

use lanefs::{Attr, Errno, Ino, SetAttr, Timespec, TruncateBy};

use super::reply::{Handled, OK, done, fattr, node, put, statx, tset};
use super::{Call, Server};
use crate::abi::*;
use crate::wire::{Answer, Out, Pending};

impl Server {
    pub(super) fn getattr(&self, req: &Call, out: &mut Out) -> Handled {
        self.attr(self.fs.getattr(node(req.h.nodeid)), out)
    }

    pub(super) fn attr(&self, r: lanefs::Result<Attr>, out: &mut Out) -> Handled {
        let a = r?;
        put(
            out,
            &fuse_attr_out {
                attr_valid: self.ttl.as_secs(),
                attr_valid_nsec: self.ttl.subsec_nanos(),
                dummy: 0,
                attr: fattr(&a),
            },
        )
    }

    /// STATX (7.39): the attributes as `statx(2)` has them, with the inode flags' `STATX_ATTR_*`
    /// bits and the mask of those this filesystem supports. The kernel sends it instead of a
    /// GETATTR when a `statx` asks for more than the basic fields (the birth time) and its
    /// attributes are stale or the birth time was never asked; the request's mask and flags
    /// change nothing here. An inode a store kept without a birth time is answered without
    /// `STATX_BTIME`, which the kernel then remembers until the attributes expire.
    pub(super) fn statx(&self, req: &Call, out: &mut Out) -> Handled {
        let _: fuse_statx_in = req.arg()?;
        let a = self.fs.getattr(node(req.h.nodeid))?;
        put(
            out,
            &fuse_statx_out {
                attr_valid: self.ttl.as_secs(),
                attr_valid_nsec: self.ttl.subsec_nanos(),
                stat: statx(&a),
                ..fuse_statx_out::default()
            },
        )
    }

    pub(super) fn setattr(&self, req: &Call, out: &mut Out) -> Handled {
        let a: fuse_setattr_in = req.arg()?;
        let has = |bit: u32| a.valid & bit != 0;
        let mut set = SetAttr {
            mode: has(FATTR_MODE).then_some(a.mode),
            uid: has(FATTR_UID).then_some(a.uid),
            gid: has(FATTR_GID).then_some(a.gid),
            size: has(FATTR_SIZE).then_some(a.size),
            atime: has(FATTR_ATIME).then(|| tset(has(FATTR_ATIME_NOW), a.atime, a.atimensec)),
            mtime: has(FATTR_MTIME).then(|| tset(has(FATTR_MTIME_NOW), a.mtime, a.mtimensec)),
            ctime: has(FATTR_CTIME).then(|| Timespec::new(a.ctime as i64, a.ctimensec)),
            // A SETATTR that asks for nothing takes set-id bits away, as a chown does: it is
            // a `chown(path, -1, -1)` (the kernel sends no ctime without a writeback cache,
            // and leaves the bits a chown takes to the server, FUSE_HANDLE_KILLPRIV_V2,
            // flagging that only when an owner or group is given), or the kernel's own
            // removal of them before a write by someone without CAP_FSETID (whose WRITE
            // then says so too). Every other change sets a field.
            chown: a.valid & !(FATTR_FH | FATTR_LOCKOWNER) == 0,
        };
        let fh = has(FATTR_FH);
        // Without FUSE_ATOMIC_O_TRUNC, `open(O_TRUNC)` of an existing file arrives as this:
        // size 0, no handle, nothing else, exactly as a `truncate(path, 0)`. An O_TRUNC stamps
        // mtime and ctime even on an empty file (tmpfs); a truncate to an unchanged size does
        // not. Taken as the O_TRUNC it far more often is (so `truncate(path, 0)` of an empty
        // file stamps the times here, unlike on tmpfs).
        let truncate_to_zero = SetAttr {
            size: Some(0),
            ..SetAttr::default()
        };
        if !fh && set == truncate_to_zero {
            set.mtime = Some(lanefs::TimeSet::Now);
        }
        // A handle means an `ftruncate` of a file the kernel holds open for writing.
        let by = fh.then_some(TruncateBy::OpenFile);
        // A truncate says whether its caller may keep set-id bits (root without CAP_FSETID
        // may not), as a WRITE does.
        let mut c = req.ctx();
        if set.size.is_some() {
            c.keeps_setid = !has(FATTR_KILL_SUIDGID);
        }
        self.attr(self.fs.setattr(&c, node(req.h.nodeid), &set, by), out)
    }

    pub(super) fn readlink(&self, req: &Call, out: &mut Out) -> Handled {
        let t = self.fs.readlink(node(req.h.nodeid))?;
        if out.push(&t) { OK } else { Err(Errno::ERANGE) }
    }

    /// READ, by inode: the handle is 0 (no-open mode).
    pub(super) fn read(&self, req: &Call, out: &mut Out) -> Handled {
        let a: fuse_read_in = req.arg()?;
        let buf = out.room(a.size as usize);
        // `flags` are the file's open(2) flags: `O_NOATIME` keeps the access time.
        let n = self
            .fs
            .read_inode_flags(node(req.h.nodeid), a.offset, buf, a.flags as i32)?;
        out.grow(n);
        OK
    }

    pub(super) fn write(&self, req: &Call, out: &mut Out) -> Handled {
        let a: fuse_write_in = req.arg()?;
        let data = req.data.get(..a.size as usize).ok_or(Errno::EINVAL)?;
        // With FUSE_HANDLE_KILLPRIV_V2 the kernel flags a write whose writer lacks
        // CAP_FSETID on a file with set-id bits to take away; without the flag there is
        // nothing the writer must lose.
        let mut c = req.ctx();
        c.keeps_setid = a.write_flags & FUSE_WRITE_KILL_SUIDGID == 0;
        // The file's open flags come along: the engine refuses a write the open would have
        // been refused for had the kernel known the inode flags (immutable, or append-only
        // without O_APPEND).
        let r = self
            .fs
            .write_inode_flags(&c, node(req.h.nodeid), a.offset, data, a.flags as i32);
        if a.write_flags & FUSE_WRITE_CACHE != 0 {
            let done = *r.as_ref().unwrap_or(&0) as u64;
            if done < data.len() as u64 {
                self.drop_pages_later(req.h.nodeid, a.offset + done, data.len() as u64 - done);
            }
        }
        let n = r?;
        put(
            out,
            &fuse_write_out {
                size: n as u32,
                padding: 0,
            },
        )
    }

    /// After a write-back WRITE (`FUSE_WRITE_CACHE`: the kernel writing pages a program
    /// dirtied through `mmap`) that stored less than it carried (ENOSPC, EIO): the kernel
    /// keeps those pages, clean and up to date, once the WRITE ends, so reads would go on
    /// showing bytes the filesystem does not hold until the pages leave the cache. They are
    /// dropped instead, so that every read shows what is stored (the program learns of the
    /// failure from `msync`, `fsync` or `close`, as with any failed write-back; tmpfs
    /// refuses the store itself with SIGBUS, which FUSE cannot, since the kernel asks the
    /// server nothing when a mapped page is first written). Not from this thread, and not
    /// before the reply: the invalidation waits for each page's write-back to end, which
    /// is this request's reply, and lays dirty pages down with WRITEs that a request thread
    /// must be free to answer. So a thread of its own does it, in the order they came.
    pub(super) fn drop_pages_later(&self, ino: u64, off: u64, len: u64) {
        let tx = self.failed_pages.get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel::<(u64, u64, u64)>();
            let kc = Arc::downgrade(&self.notifier);
            let started = std::thread::Builder::new()
                .name("lanefs-pages".into())
                .spawn(move || {
                    while let Ok((ino, off, len)) = rx.recv() {
                        let Some(kc) = kc.upgrade() else { return };
                        if let Some(kc) = kc.get() {
                            kc.drop_pages(Ino(ino), off, len);
                        }
                    }
                });
            if let Err(e) = started {
                // The pages stay until they leave the cache; nothing else is lost.
                eprintln!("lanefs: cannot start the thread that drops failed pages: {e}");
            }
            tx
        });
        let _ = tx.send((ino, off, len));
    }

    pub(super) fn statfs(&self, out: &mut Out) -> Handled {
        let s = self.fs.statfs();
        put(
            out,
            &fuse_statfs_out {
                st: fuse_kstatfs {
                    blocks: s.blocks,
                    bfree: s.bfree,
                    bavail: s.bavail,
                    files: s.files,
                    ffree: s.ffree,
                    bsize: s.bsize,
                    namelen: s.namelen,
                    frsize: s.frsize,
                    padding: 0,
                    spare: [0; 6],
                },
            },
        )
    }

    /// FSYNC, by inode, answered later.
    pub(super) fn fsync(&self, req: &Call, later: &dyn Fn() -> Pending) -> Handled {
        if self.volatile_store {
            // Nothing to make durable: ENOSYS, and the kernel sends no FSYNC again.
            return Err(Errno::ENOSYS);
        }
        let a: fuse_fsync_in = req.arg()?;
        // Answered when the store's flush covers it, by the thread that sees that: the
        // request thread goes back to other requests instead of waiting for group commit.
        let p = later();
        self.fs.fsync_inode_then(
            node(req.h.nodeid),
            a.fsync_flags & FUSE_FSYNC_FDATASYNC != 0,
            Box::new(move |r| p.answer(r)),
        );
        Ok(Answer::Later)
    }

    pub(super) fn access(&self, req: &Call) -> Handled {
        let a: fuse_access_in = req.arg()?;
        done(self.fs.access(&req.ctx(), node(req.h.nodeid), a.mask))
    }

    /// LSEEK: the kernel sends only `SEEK_DATA` and `SEEK_HOLE` here (it moves offsets
    /// itself).
    pub(super) fn lseek(&self, req: &Call, out: &mut Out) -> Handled {
        let a: fuse_lseek_in = req.arg()?;
        // Before any data and after no hole: ENXIO, as tmpfs (`shmem_file_llseek`).
        let off = i64::try_from(a.offset)
            .ok()
            .and_then(|o| u64::try_from(o).ok())
            .ok_or(Errno::ENXIO)?;
        let o = self
            .fs
            .seek_data_hole(node(req.h.nodeid), off, a.whence as i32)?;
        put(out, &fuse_lseek_out { offset: o })
    }

    pub(super) fn fallocate(&self, req: &Call) -> Handled {
        let a: fuse_fallocate_in = req.arg()?;
        done(self.fs.fallocate_inode(
            &req.ctx(),
            node(req.h.nodeid),
            a.mode as i32,
            a.offset,
            a.length,
        ))
    }
}
