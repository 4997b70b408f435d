//! Namespace mutations: mknod, mkdir, symlink, create (the creating half), link, unlink, rmdir,
//! rename. Each takes the stripe lock of every name it changes (see `locking.rs`), and checks
//! errors in the order Linux does, so that errnos match tmpfs.

use std::sync::atomic::Ordering::*;

use crossbeam_epoch::{self as epoch, Guard};
use parking_lot::MutexGuard;

use super::{Filesystem, check_name, is_dot_or_dotdot};
use crate::attr::{Attr, AttrCell, AttrVals, FileType, Ino};
use crate::errno::{Errno, Result};
use crate::inode::{Body, DirBody, Fate, Inode};
use crate::perm::{self, Ctx, MAY_EXEC, MAY_READ, MAY_WRITE};
use crate::stats::{LockClass, Op};
use crate::time::Timespec;

/// Longest symlink target (`PATH_MAX` less the NUL).
pub const SYMLINK_MAX: usize = 4095;

/// `rename` flag: fail with EEXIST if the target exists.
pub const RENAME_NOREPLACE: u32 = libc::RENAME_NOREPLACE;
/// `rename` flag: atomically exchange source and target (both must exist).
pub const RENAME_EXCHANGE: u32 = libc::RENAME_EXCHANGE;

/// A directory, the entry's inode, and the locks that keep the entry stable.
type Victim<'a> = (&'a Inode, &'a Inode, [Option<MutexGuard<'a, ()>>; 2]);

/// What kind of inode to create.
pub(crate) enum NewNode<'a> {
    File,
    Dir,
    Symlink(&'a [u8]),
    Special(FileType, u64),
}

impl Filesystem {
    /// Creates an inode named `name` in `parent` and returns it with `extra_refs` references
    /// (plus one lookup reference if `ctx` counts lookups).
    #[allow(clippy::too_many_arguments)] // the arguments of mknod(2), plus the guard
    pub(crate) fn make_node<'g>(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        mode: u32,
        kind: NewNode<'_>,
        extra_refs: u32,
        g: &'g Guard,
    ) -> Result<&'g Inode> {
        check_name(name)?;
        let (dir, d) = self.dir_inode(parent, g)?;
        perm::check(ctx, &dir.attr.load(), MAY_EXEC)?;
        if is_dot_or_dotdot(name) {
            return Err(Errno::EEXIST);
        }
        let _dl = self.dirlock(dir);
        let _s = self.lock_stripe(self.stripe_of(parent, name));
        if self.dirents.get(parent, name, &self.stats).is_some() {
            return Err(Errno::EEXIST);
        }
        self.writable()?;
        let dv = dir.attr.load();
        perm::check(ctx, &dv, MAY_WRITE | MAY_EXEC)?;
        if !d.is_alive() {
            return Err(Errno::ENOENT);
        }
        if let NewNode::Special(FileType::CharDevice | FileType::BlockDevice, _) = kind {
            if !ctx.is_root() {
                return Err(Errno::EPERM);
            }
        }
        if let NewNode::Symlink(target) = kind {
            if target.is_empty() {
                return Err(Errno::ENOENT);
            }
            if target.len() > SYMLINK_MAX {
                return Err(Errno::ENAMETOOLONG);
            }
        }
        self.inode_quota.take(1)?;
        let ino_gen = match self.ids.alloc(&self.stats) {
            Ok(x) => x,
            Err(e) => {
                self.inode_quota.give(1);
                return Err(e);
            }
        };

        // Mode and ownership as inode_init_owner() and vfs_prepare_mode() give them.
        let is_dir = matches!(kind, NewNode::Dir);
        let mut perm_bits = match kind {
            NewNode::Symlink(_) => 0o777,
            NewNode::Dir => mode & 0o1777 & !ctx.umask,
            _ => mode & 0o7777 & !ctx.umask,
        };
        let parent_sgid = dv.mode & libc::S_ISGID != 0;
        let gid = if parent_sgid { dv.gid } else { ctx.gid };
        if parent_sgid && is_dir {
            perm_bits |= libc::S_ISGID;
        }
        if parent_sgid
            && !is_dir
            && perm_bits & (libc::S_ISGID | libc::S_IXGRP) == libc::S_ISGID | libc::S_IXGRP
            && !ctx.is_root()
            && !ctx.in_group(dv.gid)
        {
            perm_bits &= !libc::S_ISGID;
        }
        let (ftype, body, size) = match kind {
            NewNode::File => (FileType::RegularFile, Body::File(Default::default()), 0),
            NewNode::Dir => (FileType::Directory, Body::Dir(DirBody::new(dir.ino_gen)), 0),
            NewNode::Symlink(t) => (FileType::Symlink, Body::Symlink(t.into()), t.len() as u64),
            NewNode::Special(t, rdev) => (t, Body::Special { rdev }, 0),
        };
        let now = Timespec::now();
        let attr = AttrCell::new(AttrVals {
            mode: ftype.mode_bits() | perm_bits,
            uid: ctx.uid,
            gid,
            size,
            blocks: 0,
            atime: now,
            mtime: now,
            ctime: now,
        });
        let refs = extra_refs + ctx.count_lookups as u32;
        let nlink = if is_dir { 2 } else { 1 };
        let inode = self
            .table
            .install(Inode::new(ino_gen, nlink, refs, attr, body), g);
        if let Err(e) = self.dirents.publish(parent, d, name, ino_gen, &self.stats) {
            // The directory was removed while we created: undo.
            if inode.clear_nlink() == Fate::Free
                || (refs > 0 && inode.put_refs(refs as u64) == Fate::Free)
            {
                self.free_inode(inode, g);
            }
            return Err(e);
        }
        if is_dir {
            // After publishing: a directory with an entry cannot be removed, so its nlink can
            // no longer be cleared under us.
            dir.inc_nlink()
                .expect("nlink limit far above any directory size");
        }
        dir.attr.touch_mc(&self.stats);
        Ok(inode)
    }

    /// Creates a device node, FIFO, socket or (type bits 0 or `S_IFREG`) regular file.
    pub fn mknod(&self, ctx: &Ctx, parent: Ino, name: &[u8], mode: u32, rdev: u64) -> Result<Attr> {
        let kind = match mode & libc::S_IFMT {
            0 | libc::S_IFREG => Ok(NewNode::File),
            libc::S_IFDIR => Err(Errno::EPERM),
            libc::S_IFCHR => Ok(NewNode::Special(FileType::CharDevice, rdev)),
            libc::S_IFBLK => Ok(NewNode::Special(FileType::BlockDevice, rdev)),
            libc::S_IFIFO => Ok(NewNode::Special(FileType::NamedPipe, 0)),
            libc::S_IFSOCK => Ok(NewNode::Special(FileType::Socket, 0)),
            _ => Err(Errno::EINVAL),
        };
        match kind {
            Ok(kind) => self.make_reported(ctx, Op::Mknod, parent, name, mode, kind),
            Err(e) => {
                self.begin(Op::Mknod); // counted like any other refused call
                Err(e)
            }
        }
    }

    /// One node-creating operation (`mknod`, `mkdir`, `symlink`): creates the node and, once
    /// every lock is released, reports the new name.
    fn make_reported(
        &self,
        ctx: &Ctx,
        op: Op,
        parent: Ino,
        name: &[u8],
        mode: u32,
        kind: NewNode,
    ) -> Result<Attr> {
        let a = {
            let _c = self.begin(op);
            let g = epoch::pin();
            let i = self.make_node(ctx, parent, name, mode, kind, 0, &g)?;
            self.attr_of(i)
        };
        self.report(ctx, |s| s.entry(parent, name));
        Ok(a)
    }

    /// Creates a directory.
    pub fn mkdir(&self, ctx: &Ctx, parent: Ino, name: &[u8], mode: u32) -> Result<Attr> {
        self.make_reported(ctx, Op::Mkdir, parent, name, mode, NewNode::Dir)
    }

    /// Creates a symbolic link to `target`.
    pub fn symlink(&self, ctx: &Ctx, parent: Ino, name: &[u8], target: &[u8]) -> Result<Attr> {
        self.make_reported(
            ctx,
            Op::Symlink,
            parent,
            name,
            0o777,
            NewNode::Symlink(target),
        )
    }

    /// The target of symlink `ino`.
    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        let _c = self.begin(Op::Readlink);
        let g = epoch::pin();
        match &self.inode(ino, &g)?.body {
            Body::Symlink(t) => Ok(t.to_vec()),
            _ => Err(Errno::EINVAL),
        }
    }

    /// Adds the name `newname` in `newparent` for inode `ino` (not a directory).
    pub fn link(&self, ctx: &Ctx, ino: Ino, newparent: Ino, newname: &[u8]) -> Result<Attr> {
        let a = self.link_locked(ctx, ino, newparent, newname)?;
        self.report(ctx, |s| {
            s.entry(newparent, newname);
            s.inode(ino, None);
        });
        Ok(a)
    }

    fn link_locked(&self, ctx: &Ctx, ino: Ino, newparent: Ino, newname: &[u8]) -> Result<Attr> {
        let _c = self.begin(Op::Link);
        check_name(newname)?;
        let g = epoch::pin();
        let src = self.inode(ino, &g)?;
        let (dir, d) = self.dir_inode(newparent, &g)?;
        perm::check(ctx, &dir.attr.load(), MAY_EXEC)?;
        if is_dot_or_dotdot(newname) {
            return Err(Errno::EEXIST);
        }
        let _dl = self.dirlock(dir);
        let _s = self.lock_stripe(self.stripe_of(newparent, newname));
        if self.dirents.get(newparent, newname, &self.stats).is_some() {
            return Err(Errno::EEXIST);
        }
        self.writable()?;
        // fs.protected_hardlinks (on by default): only the owner may link a file they could
        // not read and write, or a set-id or non-regular file.
        let sv = src.attr.load();
        if !perm::owner_or_root(ctx, &sv) {
            let safe = sv.mode & libc::S_IFMT == libc::S_IFREG
                && sv.mode & libc::S_ISUID == 0
                && sv.mode & (libc::S_ISGID | libc::S_IXGRP) != libc::S_ISGID | libc::S_IXGRP
                && perm::check(ctx, &sv, MAY_READ | MAY_WRITE).is_ok();
            if !safe {
                return Err(Errno::EPERM);
            }
        }
        perm::check(ctx, &dir.attr.load(), MAY_WRITE | MAY_EXEC)?;
        if !d.is_alive() {
            return Err(Errno::ENOENT);
        }
        if src.is_dir() {
            return Err(Errno::EPERM);
        }
        src.link_existing()?;
        if let Err(e) = self
            .dirents
            .publish(newparent, d, newname, src.ino_gen, &self.stats)
        {
            if src.dec_nlink() == Fate::Free {
                self.free_inode(src, &g);
            }
            return Err(e);
        }
        src.attr.touch_c(&self.stats);
        dir.attr.touch_mc(&self.stats);
        self.pin_for(ctx, src)?;
        Ok(self.attr_of(src))
    }

    /// Locks a directory for removing `name` from it and returns the entry's inode, after the
    /// permission checks `may_delete` makes.
    fn lock_victim<'a>(
        &'a self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        g: &'a Guard,
    ) -> Result<Victim<'a>> {
        check_name(name)?;
        let (dir, _) = self.dir_inode(parent, g)?;
        perm::check(ctx, &dir.attr.load(), MAY_EXEC)?;
        self.writable()?;
        let dl = self.dirlock(dir);
        let s = self.lock_stripe(self.stripe_of(parent, name));
        let de = self
            .dirents
            .get(parent, name, &self.stats)
            .ok_or(Errno::ENOENT)?;
        let victim = self
            .table
            .get_gen(de.ino_gen, g)
            .expect("entry's inode is live under its stripe");
        let dv = dir.attr.load();
        perm::check(ctx, &dv, MAY_WRITE | MAY_EXEC)?;
        perm::check_sticky(ctx, &dv, &victim.attr.load())?;
        Ok((dir, victim, [dl, Some(s)]))
    }

    /// Removes a non-directory entry.
    pub fn unlink(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<()> {
        let ino = self.unlink_locked(ctx, parent, name)?;
        self.report_removal(ctx, parent, name, ino);
        Ok(())
    }

    fn unlink_locked(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<Ino> {
        let _c = self.begin(Op::Unlink);
        if is_dot_or_dotdot(name) {
            return Err(Errno::EISDIR);
        }
        let g = epoch::pin();
        let (dir, victim, _locks) = self.lock_victim(ctx, parent, name, &g)?;
        if victim.is_dir() {
            return Err(Errno::EISDIR);
        }
        self.dirents
            .remove(parent, name, &self.stats)
            .expect("entry present under its stripe");
        victim.attr.touch_c(&self.stats);
        dir.attr.touch_mc(&self.stats);
        let ino = victim.ino();
        if victim.dec_nlink() == Fate::Free {
            self.free_inode(victim, &g);
        }
        Ok(ino)
    }

    /// Removes an empty directory.
    pub fn rmdir(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<()> {
        let ino = self.rmdir_locked(ctx, parent, name)?;
        self.report_removal(ctx, parent, name, ino);
        Ok(())
    }

    fn rmdir_locked(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<Ino> {
        let _c = self.begin(Op::Rmdir);
        match name {
            b"." => return Err(Errno::EINVAL),
            b".." => return Err(Errno::ENOTEMPTY),
            _ => {}
        }
        let g = epoch::pin();
        let (dir, victim, _locks) = self.lock_victim(ctx, parent, name, &g)?;
        let Some(vd) = victim.dir() else {
            return Err(Errno::ENOTDIR);
        };
        self.dirents.kill_if_empty(victim.ino(), vd, &self.stats)?;
        self.dirents
            .remove(parent, name, &self.stats)
            .expect("entry present under its stripe");
        assert_eq!(dir.dec_nlink(), Fate::Lives, "a parent keeps its own links");
        dir.attr.touch_mc(&self.stats);
        victim.attr.touch_c(&self.stats);
        let ino = victim.ino();
        if victim.clear_nlink() == Fate::Free {
            self.free_inode(victim, &g);
        }
        Ok(ino)
    }

    /// Whether directory `a` is `d` or one of `d`'s ancestors. Parent pointers change only
    /// under the rename lock, which the caller holds.
    fn is_ancestor(&self, a: &Inode, d: &Inode, g: &Guard) -> bool {
        let mut cur = d;
        for _ in 0..(1 << 24) {
            if std::ptr::eq(cur, a) {
                return true;
            }
            let Some(cd) = cur.dir() else { return false };
            let p = cd.parent.load(Acquire);
            if p == cur.ino_gen {
                return false; // the root
            }
            match self.table.get_gen(p, g) {
                Some(next) => cur = next,
                None => return false, // a removed directory's old parent
            }
        }
        unreachable!("directory chain longer than 2^24: a cycle")
    }

    /// Renames `name` in `parent` to `newname` in `newparent`; `flags` may hold
    /// [`RENAME_NOREPLACE`] or [`RENAME_EXCHANGE`].
    pub fn rename(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        newparent: Ino,
        newname: &[u8],
        flags: u32,
    ) -> Result<()> {
        self.rename_inner(ctx, parent, name, newparent, newname, flags)?;
        self.report(ctx, |s| {
            s.entry(parent, name);
            s.entry(newparent, newname);
        });
        Ok(())
    }

    fn rename_inner(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        newparent: Ino,
        newname: &[u8],
        flags: u32,
    ) -> Result<()> {
        let _c = self.begin(Op::Rename);
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0
            || flags & RENAME_NOREPLACE != 0 && flags & RENAME_EXCHANGE != 0
        {
            return Err(Errno::EINVAL);
        }
        check_name(name)?;
        check_name(newname)?;
        let g = epoch::pin();
        let (d1, _) = self.dir_inode(parent, &g)?;
        let (d2, dd2) = self.dir_inode(newparent, &g)?;
        perm::check(ctx, &d1.attr.load(), MAY_EXEC)?;
        perm::check(ctx, &d2.attr.load(), MAY_EXEC)?;
        if is_dot_or_dotdot(name) {
            return Err(Errno::EBUSY);
        }
        if is_dot_or_dotdot(newname) {
            return Err(if flags & RENAME_NOREPLACE != 0 {
                Errno::EEXIST
            } else {
                Errno::EBUSY
            });
        }
        self.writable()?;
        let cross = parent != newparent;
        let (i1, i2) = (
            self.stripe_of(parent, name),
            self.stripe_of(newparent, newname),
        );
        let mut want_rename_lock = false;
        loop {
            // Lock order: rename lock, directory locks (dirlock mode), stripes by index.
            let dir_moves = |s: Option<u64>, t: Option<u64>| {
                let is_dir = |x: Option<u64>| {
                    x.and_then(|ig| self.table.get_gen(ig, &g))
                        .is_some_and(Inode::is_dir)
                };
                cross && (is_dir(s) || flags & RENAME_EXCHANGE != 0 && is_dir(t))
            };
            if !want_rename_lock {
                let peek_s = self
                    .dirents
                    .get(parent, name, &self.stats)
                    .map(|d| d.ino_gen);
                let peek_t = self
                    .dirents
                    .get(newparent, newname, &self.stats)
                    .map(|d| d.ino_gen);
                want_rename_lock = dir_moves(peek_s, peek_t);
            }
            let take_rename =
                want_rename_lock || cross && self.cfg.locking == crate::Locking::DirLock;
            let _r = take_rename.then(|| self.stats.lock(LockClass::Rename, &self.rename_lock));
            let (_dl1, _dl2) = if d1.ino() <= d2.ino() {
                let a = self.dirlock(d1);
                (a, if cross { self.dirlock(d2) } else { None })
            } else {
                let b = self.dirlock(d2);
                (self.dirlock(d1), b)
            };
            let _s1 = self.lock_stripe(i1.min(i2));
            let _s2 = (i1 != i2).then(|| self.lock_stripe(i1.max(i2)));
            // Now both names are stable.
            let src = self.dirents.get(parent, name, &self.stats);
            let dst = self.dirents.get(newparent, newname, &self.stats);
            if !take_rename && dir_moves(src.map(|d| d.ino_gen), dst.map(|d| d.ino_gen)) {
                // A file turned into a directory under the name since the peek: the rename lock
                // is needed after all, and it ranks above the stripes. Start over.
                want_rename_lock = true;
                continue;
            }
            return self.rename_locked(
                ctx,
                (d1, parent, name),
                (d2, dd2, newparent, newname),
                flags,
                &g,
            );
        }
    }

    /// The body of `rename`, with every lock it needs held.
    fn rename_locked(
        &self,
        ctx: &Ctx,
        (d1, parent, name): (&Inode, Ino, &[u8]),
        (d2, dd2, newparent, newname): (&Inode, &DirBody, Ino, &[u8]),
        flags: u32,
        g: &Guard,
    ) -> Result<()> {
        let exchange = flags & RENAME_EXCHANGE != 0;
        let cross = parent != newparent;
        let src_de = self
            .dirents
            .get(parent, name, &self.stats)
            .ok_or(Errno::ENOENT)?;
        let dst_de = self.dirents.get(newparent, newname, &self.stats);
        let src = self
            .table
            .get_gen(src_de.ino_gen, g)
            .expect("live under stripe");
        let dst = dst_de.map(|d| self.table.get_gen(d.ino_gen, g).expect("live under stripe"));
        if flags & RENAME_NOREPLACE != 0 && dst.is_some() {
            return Err(Errno::EEXIST);
        }
        if exchange && dst.is_none() {
            return Err(Errno::ENOENT);
        }
        let src_is_dir = src.is_dir();
        let dst_is_dir = dst.is_some_and(Inode::is_dir);
        // Loops (the rename lock is held whenever a directory changes parent).
        if cross && src_is_dir && self.is_ancestor(src, d2, g) {
            return Err(Errno::EINVAL);
        }
        if let Some(t) = dst {
            if cross && dst_is_dir && self.is_ancestor(t, d1, g) {
                return Err(if exchange {
                    Errno::EINVAL
                } else {
                    Errno::ENOTEMPTY
                });
            }
            if std::ptr::eq(t, src) {
                return Ok(()); // two names of one inode: POSIX says do nothing
            }
        }
        // may_delete(source), then may_delete(target) or may_create(target dir).
        let v1 = d1.attr.load();
        perm::check(ctx, &v1, MAY_WRITE | MAY_EXEC)?;
        perm::check_sticky(ctx, &v1, &src.attr.load())?;
        let v2 = d2.attr.load();
        match dst {
            Some(t) => {
                perm::check(ctx, &v2, MAY_WRITE | MAY_EXEC)?;
                perm::check_sticky(ctx, &v2, &t.attr.load())?;
                if !exchange {
                    if src_is_dir && !dst_is_dir {
                        return Err(Errno::ENOTDIR);
                    }
                    if !src_is_dir && dst_is_dir {
                        return Err(Errno::EISDIR);
                    }
                }
            }
            None => {
                perm::check(ctx, &v2, MAY_WRITE | MAY_EXEC)?;
                if !dd2.is_alive() {
                    return Err(Errno::ENOENT);
                }
            }
        }
        // A directory changing parent rewrites its "..": write permission on it.
        if cross && src_is_dir {
            perm::check(ctx, &src.attr.load(), MAY_WRITE)?;
        }
        if cross && exchange && dst_is_dir {
            perm::check(
                ctx,
                &dst.expect("exchange has a target").attr.load(),
                MAY_WRITE,
            )?;
        }

        if exchange {
            let t = dst.expect("checked");
            self.dirents.repoint(parent, name, t.ino_gen, &self.stats);
            self.dirents
                .repoint(newparent, newname, src.ino_gen, &self.stats);
            if cross {
                self.reparent(src, d1, d2);
                self.reparent(t, d2, d1);
            }
            t.attr.touch_c(&self.stats);
        } else if let Some(t) = dst {
            if let Some(td) = t.dir() {
                self.dirents.kill_if_empty(t.ino(), td, &self.stats)?;
            }
            // The target name never disappears: it is pointed at the source in place.
            self.dirents
                .repoint(newparent, newname, src.ino_gen, &self.stats);
            self.dirents
                .remove(parent, name, &self.stats)
                .expect("source present under stripe");
            if cross {
                self.reparent(src, d1, d2);
            }
            t.attr.touch_c(&self.stats);
            let fate = if dst_is_dir {
                assert_eq!(d2.dec_nlink(), Fate::Lives);
                t.clear_nlink()
            } else {
                t.dec_nlink()
            };
            if fate == Fate::Free {
                self.free_inode(t, g);
            }
        } else {
            self.dirents
                .publish(newparent, dd2, newname, src.ino_gen, &self.stats)?;
            self.dirents
                .remove(parent, name, &self.stats)
                .expect("source present under stripe");
            if cross {
                self.reparent(src, d1, d2);
            }
        }
        src.attr.touch_c(&self.stats);
        d1.attr.touch_mc(&self.stats);
        if cross {
            d2.attr.touch_mc(&self.stats);
        }
        Ok(())
    }

    /// Moves directory `i`'s `..` from `from` to `to` (no-op for a non-directory).
    fn reparent(&self, i: &Inode, from: &Inode, to: &Inode) {
        if let Some(d) = i.dir() {
            d.parent.store(to.ino_gen, Release);
            to.inc_nlink()
                .expect("nlink limit far above any directory size");
            assert_eq!(from.dec_nlink(), Fate::Lives);
        }
    }
}
