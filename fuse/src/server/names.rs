//! Names and entries: LOOKUP, FORGET, the requests that make, remove, link and rename
//! names, and O_TMPFILE; the entries their replies carry (each with one lookup reference,
//! [`lanefs::Via::Kernel`]).

use std::sync::atomic::Ordering::Release;

use lanefs::{Attr, Errno};
use zerocopy::FromBytes;

use super::reply::{Handled, NEGATIVE, OK, fattr, node, put};
use super::{Call, Server};
use crate::abi::*;
use crate::wire::{Answer, Out, cstr};

impl Server {
    pub(super) fn entry_out(&self, a: &Attr) -> fuse_entry_out {
        fuse_entry_out {
            nodeid: a.ino.get(),
            generation: a.generation.0,
            entry_valid: self.ttl.as_secs(),
            attr_valid: self.ttl.as_secs(),
            entry_valid_nsec: self.ttl.subsec_nanos(),
            attr_valid_nsec: self.ttl.subsec_nanos(),
            attr: fattr(a),
        }
    }

    fn entry(&self, r: lanefs::Result<Attr>, out: &mut Out) -> Handled {
        put(out, &self.entry_out(&r?))
    }

    /// The reply to a request that made a name in directory `dir`.
    fn changed(&self, dir: u64, r: lanefs::Result<Attr>, out: &mut Out) -> Handled {
        if r.is_ok() {
            self.names_changed(dir);
        }
        self.entry(r, out)
    }

    pub(super) fn lookup(&self, req: &Call, out: &mut Out) -> Handled {
        let (name, _) = req.name()?;
        let parent = req.h.nodeid;
        if name == b"." {
            return self.lookup_dot(req, parent, out);
        }
        let _handing = self.names.handing(parent);
        let mut r = self.fs.lookup(&req.ctx(), node(parent), name);
        if r == Err(Errno::ENOENT) && !self.ttl.is_zero() {
            // The kernel will keep the absence: marked first, then looked at again, so that
            // a library caller's create of the name either finds the mark or is found here
            // (`kernel_names.rs`).
            self.names.negative(parent, name);
            r = self.fs.lookup(&req.ctx(), node(parent), name);
        }
        match r {
            // A negative entry (node id 0) with the entry timeout: the kernel caches the
            // absence, so `open(O_CREAT)` of a new name skips a LOOKUP. Safe because every
            // creation through this mount replaces the negative dentry, and one around it
            // (the channel, a library caller) finds the name marked and invalidates it.
            Err(Errno::ENOENT) if !self.ttl.is_zero() => {
                let mut e = self.entry_out(&NEGATIVE);
                e.nodeid = 0;
                e.attr_valid = 0;
                e.attr_valid_nsec = 0;
                put(out, &e)
            }
            r => self.entry(r, out),
        }
    }

    /// LOOKUP of `.` in node `ino`: the kernel never sends one for a path (the VFS resolves
    /// `.` itself); it sends it, with FUSE_EXPORT_SUPPORT, to find an inode of any type again
    /// by its node id when an exported file handle (`open_by_handle_at`, NFS) names an inode
    /// that has left its cache. The kernel then compares the reply's generation, truncated to
    /// 32 bits, with the handle's: a number freed and reused gives ESTALE. lanefs generations
    /// are 64-bit and never reused, so a stale handle could be taken for a live one only
    /// after 2^32 more inodes were created.
    ///
    /// An unlinked inode (link count 0) is gone for the kernel: it forgot it when its last
    /// use ended, and the FORGET may still be on its way here. It is answered ENOENT (the
    /// kernel's ESTALE), as tmpfs answers for a removed file, and the reference just taken
    /// is dropped again. (An unlinked file that is still open is in the kernel's cache and
    /// is opened from there, without a LOOKUP.)
    fn lookup_dot(&self, req: &Call, ino: u64, out: &mut Out) -> Handled {
        match self.fs.lookup_inode(&req.ctx(), node(ino)) {
            Ok(a) if a.nlink == 0 => {
                self.fs.forget(node(ino), 1);
                Err(Errno::ENOENT)
            }
            r => self.entry(r, out),
        }
    }

    /// FORGET: the kernel drops `nlookup` lookup references of the node.
    pub(super) fn forget_one(&self, req: &Call) -> Handled {
        let f: fuse_forget_in = req.arg()?;
        self.forget(req.h.nodeid, f.nlookup);
        Ok(Answer::None)
    }

    /// BATCH_FORGET: FORGETs of several nodes in one request.
    pub(super) fn batch_forget(&self, req: &Call) -> Handled {
        let b: fuse_batch_forget_in = req.arg()?;
        let mut rest = req.data;
        for _ in 0..b.count {
            let Ok((f, r)) = fuse_forget_one::read_from_prefix(rest) else {
                break;
            };
            self.forget(f.nodeid, f.nlookup);
            rest = r;
        }
        Ok(Answer::None)
    }

    fn forget(&self, ino: u64, nlookup: u64) {
        // The kernel forgets an inode once, when it evicts it: no read of it is running.
        let shard = self.end_shard(ino);
        if let Some((_, Some(_))) = shard.lock().remove(&ino) {
            shard.listed.fetch_sub(1, Release);
        }
        self.fs.forget(node(ino), nlookup);
        // A directory the kernel let go of has no cached listing left (`kernel_names.rs`).
        self.names
            .forgotten(ino, || self.fs.held_by_kernel(lanefs::Ino(ino)));
        self.forgets.done();
    }

    pub(super) fn mknod(&self, req: &Call, out: &mut Out) -> Handled {
        let ino = req.h.nodeid;
        let a: fuse_mknod_in = req.arg()?;
        let (name, _) = req.name()?;
        let c = req.ctx().with_umask(a.umask);
        let r = {
            let _handing = self.names.handing(ino);
            self.fs
                .mknod(&c, node(ino), name, a.mode, u64::from(a.rdev))
        };
        self.changed(ino, r, out)
    }

    pub(super) fn mkdir(&self, req: &Call, out: &mut Out) -> Handled {
        let ino = req.h.nodeid;
        let a: fuse_mkdir_in = req.arg()?;
        let (name, _) = req.name()?;
        let c = req.ctx().with_umask(a.umask);
        let r = {
            let _handing = self.names.handing(ino);
            self.fs.mkdir(&c, node(ino), name, a.mode)
        };
        self.changed(ino, r, out)
    }

    pub(super) fn unlink(&self, req: &Call) -> Handled {
        let ino = req.h.nodeid;
        let (name, _) = req.name()?;
        // The kernel turns the name's dentry negative after a removal (`kernel_names.rs`).
        self.names.negative(ino, name);
        self.fs.unlink(&req.ctx(), node(ino), name)?;
        self.names_changed(ino);
        OK
    }

    pub(super) fn rmdir(&self, req: &Call) -> Handled {
        let ino = req.h.nodeid;
        let (name, _) = req.name()?;
        self.names.negative(ino, name);
        self.fs.rmdir(&req.ctx(), node(ino), name)?;
        self.names_changed(ino);
        OK
    }

    pub(super) fn symlink(&self, req: &Call, out: &mut Out) -> Handled {
        let ino = req.h.nodeid;
        let (name, rest) = req.name()?;
        let (target, _) = cstr(rest)?;
        let r = {
            let _handing = self.names.handing(ino);
            self.fs.symlink(&req.ctx(), node(ino), name, target)
        };
        self.changed(ino, r, out)
    }

    pub(super) fn link(&self, req: &Call, out: &mut Out) -> Handled {
        let ino = req.h.nodeid;
        let a: fuse_link_in = req.arg()?;
        let (name, _) = req.name()?;
        let r = {
            let _handing = self.names.handing(ino);
            self.fs.link(&req.ctx(), node(a.oldnodeid), node(ino), name)
        };
        self.changed(ino, r, out)
    }

    pub(super) fn rename(&self, req: &Call) -> Handled {
        let a: fuse_rename_in = req.arg()?;
        self.rename_to(req, a.newdir, 0)
    }

    pub(super) fn rename2(&self, req: &Call) -> Handled {
        let a: fuse_rename2_in = req.arg()?;
        self.rename_to(req, a.newdir, a.flags)
    }

    /// RENAME and RENAME2 of the name in `req` to the one after it, in `newparent`.
    fn rename_to(&self, req: &Call, newparent: u64, flags: u32) -> Handled {
        let (name, rest) = req.name()?;
        let (newname, _) = cstr(rest)?;
        let parent = req.h.nodeid;
        // The source name, which may be left with a negative dentry (`kernel_names.rs`).
        self.names.negative(parent, name);
        let r = self.fs.rename(
            &req.ctx(),
            node(parent),
            name,
            node(newparent),
            newname,
            flags,
        );
        r?;
        self.names_changed(parent);
        if parent != newparent {
            self.names_changed(newparent);
            self.moved_dirs(req, newparent, newname, parent, name, flags);
        }
        OK
    }

    /// `O_TMPFILE` (FUSE_TMPFILE: CREATE's arguments, with the name "/", and CREATE's
    /// reply): a regular file with no name, made by the engine as the directory allows
    /// ([`lanefs::Filesystem::tmpfile`]; the mode comes unmasked with the umask, as MKNOD's,
    /// and the open flags carry `O_EXCL` when the file may never be linked). The kernel gets
    /// its entry (one lookup reference, which FORGET drops after the last close: until then
    /// it keeps the nameless file alive) and an open reply. Regular files are served by
    /// inode (no-open mode), so the engine's handle is released at once and the reply's
    /// handle is 0: reads and writes come by inode, and a RELEASE (sent for it when no OPEN
    /// has switched no-open mode on yet) is answered OK. A LINK of its node id then gives it
    /// a name (`linkat` through `/proc/self/fd` or `AT_EMPTY_PATH`).
    pub(super) fn tmpfile(&self, req: &Call, out: &mut Out) -> Handled {
        let a: fuse_create_in = req.arg()?;
        let c = req.ctx().with_umask(a.umask);
        let (attr, fh) = self
            .fs
            .tmpfile(&c, node(req.h.nodeid), a.mode, a.flags as i32)?;
        // The lookup reference the entry carries keeps the file; the handle is not needed.
        if let Err(e) = self.fs.release(fh) {
            self.fs.forget(attr.ino, 1); // never expected: a handle just made
            return Err(e);
        }
        let open = fuse_open_out {
            fh: 0,
            open_flags: FOPEN_KEEP_CACHE,
            padding: 0,
        };
        if out.push_obj(&self.entry_out(&attr)) && out.push_obj(&open) {
            OK
        } else {
            // Never expected (the reply is small): the kernel will not hold the reference.
            self.fs.forget(attr.ino, 1);
            Err(Errno::ERANGE)
        }
    }
}
