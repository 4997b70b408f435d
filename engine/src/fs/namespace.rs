//! Namespace mutations: mknod, mkdir, symlink, create (the creating half), the nameless file
//! of `O_TMPFILE` (the creating half), link, unlink, rmdir, rename (with `RENAME_WHITEOUT`
//! too). Each resolves its directories, takes the stripe of every name it changes
//! (`locking.rs`; a tmpfile changes none), re-reads the names under the stripes, checks what
//! Linux checks in the order Linux checks it (so errnos match tmpfs), describes the change as
//! a record and makes it through `apply.rs`. Each counts itself as an entry change in its
//! directories (`revoke.rs`) before its first look at their attributes and until its change
//! is visible, so that a chmod, chown, ACL change or `chattr` of a directory never returns
//! while an entry change that checked the old attributes is still to land.
//!
//! Inode flags, as the VFS applies them: an immutable directory refuses every new or removed
//! name (its write permission check fails, EPERM), an append-only one every removed name
//! (`may_delete`); an immutable or append-only inode is not removed, renamed, replaced or
//! given another name (`may_delete`, `vfs_link`); a new inode inherits its directory's 'd' and
//! 'A' (a Create record carries them). A whiteout is made as `shmem_whiteout` makes it, by a
//! `mknod(S_IFCHR, 0)` in the source directory on the caller's behalf, in the rename's own
//! record, so the source name never names nothing.
//!
//! Directories are resolved by number before their stripes are taken, so one may be removed,
//! and its number taken by a new directory, before the stripes are held. That cannot mix two
//! directories up: entries are keyed by the directory's generation too, so everything done
//! under the stripes reads and changes the entries of the directory that was resolved (a
//! removed one has none, and admits none: ENOENT).

use crossbeam_epoch::{self as epoch, Guard};
use parking_lot::MutexGuard;

use super::{Filesystem, InodeRef, check_name, is_dot_or_dotdot};
use crate::acl;
use crate::attr::{Attr, AttrVals, FileType, flags};
use crate::dir::DirBody;
use crate::errno::{Errno, Result};
use crate::id::{Ino, MAX_INO};
use crate::inode::{Fate, Inode};
use crate::perm::{self, Ctx, MAY_EXEC, MAY_READ, MAY_WRITE, Via};
use crate::record::{NewInode, Record};
use crate::revoke::Counted;
use crate::stats::{LockClass, Op};
use crate::time::Timespec;

pub use crate::limits::SYMLINK_MAX;

/// `rename` flag: fail with EEXIST if the target exists.
pub const RENAME_NOREPLACE: u32 = libc::RENAME_NOREPLACE;
/// `rename` flag: atomically exchange source and target (both must exist).
pub const RENAME_EXCHANGE: u32 = libc::RENAME_EXCHANGE;
/// `rename` flag: leave a whiteout (a character device 0/0) at the source name, in the same
/// change (overlayfs's way of hiding a lower file). Not with [`RENAME_EXCHANGE`].
pub const RENAME_WHITEOUT: u32 = libc::RENAME_WHITEOUT;

/// What kind of inode to create.
pub(crate) enum NewNode<'a> {
    File,
    Dir,
    Symlink(&'a [u8]),
    Special(FileType, u64),
}

/// What a new inode gets from its directory ([`Filesystem::inherit`]).
struct Inherited {
    /// Permission bits.
    bits: u32,
    /// Group.
    gid: u32,
    /// The access and default ACLs it inherits (`system.posix_acl_*` bytes; empty: none).
    access_acl: Vec<u8>,
    default_acl: Vec<u8>,
}

/// A directory and its body, the name's inode, the locks that keep the name stable, and the
/// count of the removal as an entry change in the directory (`revoke.rs`).
struct Victim<'a> {
    dir: (&'a Inode, &'a DirBody),
    inode: &'a Inode,
    _locks: [Option<MutexGuard<'a, ()>>; 2],
    _counted: Counted<'a>,
}

/// The device number of a whiteout (`WHITEOUT_DEV`): a character device 0/0.
pub(crate) const WHITEOUT_DEV: u64 = 0;

/// What `may_delete` checks once the directory's permission is granted: not from an
/// append-only directory (EPERM), and not a victim the sticky rule protects or that is
/// append-only or immutable (EPERM).
fn may_delete(ctx: &Ctx, dir: &AttrVals, victim: &AttrVals) -> Result<()> {
    if dir.flags & flags::APPEND != 0 || victim.flags & flags::FROZEN != 0 {
        return Err(Errno::EPERM);
    }
    perm::check_sticky(ctx, dir, victim)
}

/// Permission bits and group of a new inode, as `vfs_prepare_mode()`, `posix_acl_create()`
/// and `inode_init_owner()` give them: the umask applies unless the directory has a default
/// ACL (`inherited`: the bits that ACL gives, `acl.rs`); a setgid directory passes on its
/// group (and, to a subdirectory, its setgid bit); a caller outside that group does not get a
/// group-executable setgid file.
fn new_owner(
    ctx: &Ctx,
    dv: &AttrVals,
    mode: u32,
    kind: &NewNode<'_>,
    inherited: Option<u32>,
) -> (u32, u32) {
    let is_dir = matches!(kind, NewNode::Dir);
    let keep = if is_dir { 0o1777 } else { 0o7777 };
    let mut bits = match (kind, inherited) {
        (NewNode::Symlink(_), _) => 0o777,
        (_, Some(m)) => m & keep,
        _ => mode & keep & !ctx.umask,
    };
    let parent_sgid = dv.mode & libc::S_ISGID != 0;
    let gid = if parent_sgid { dv.gid } else { ctx.gid };
    if parent_sgid && is_dir {
        bits |= libc::S_ISGID;
    }
    let sgid_gx = libc::S_ISGID | libc::S_IXGRP;
    if parent_sgid && !is_dir && bits & sgid_gx == sgid_gx && !perm::in_group_or_fsetid(ctx, dv.gid)
    {
        bits &= !libc::S_ISGID;
    }
    (bits, gid)
}

impl Filesystem {
    /// Creates an inode named `name` in `parent` and returns it with `extra_refs` references
    /// (plus one lookup reference for a [`Via::Kernel`] caller).
    #[allow(clippy::too_many_arguments)] // the arguments of mknod(2), plus the guard
    pub(crate) fn make_node<'g>(
        &self,
        ctx: &Ctx,
        parent: InodeRef,
        name: &[u8],
        mode: u32,
        kind: NewNode<'_>,
        extra_refs: u32,
        g: &'g Guard,
    ) -> Result<&'g Inode> {
        check_name(name)?;
        let (dir, d) = self.dir_inode(parent, g)?;
        // Before any check reads the directory's attributes, until the entry is visible.
        let _counted = self.count_entry_change(dir, None);
        self.may_search(ctx, dir)?;
        if is_dot_or_dotdot(name) {
            return Err(Errno::EEXIST);
        }
        let _dl = self.dirlock(dir);
        let _s = self.lock_stripe(self.stripe_of(dir.key(), name));
        if self.dget(dir.key(), name).is_some() {
            return Err(Errno::EEXIST);
        }
        self.writable()?;
        let dv = dir.attr.load();
        self.permission(ctx, dir, &dv, MAY_WRITE | MAY_EXEC)?;
        if d.life.is_dead() {
            return Err(Errno::ENOENT);
        }
        let (ftype, rdev, target) = match kind {
            NewNode::File => (FileType::RegularFile, 0, &b""[..]),
            NewNode::Dir => (FileType::Directory, 0, &b""[..]),
            NewNode::Symlink(t) => {
                if t.is_empty() {
                    return Err(Errno::ENOENT);
                }
                if t.len() > SYMLINK_MAX {
                    return Err(Errno::ENAMETOOLONG);
                }
                (FileType::Symlink, 0, t)
            }
            NewNode::Special(t, rdev) => {
                // CAP_MKNOD, except for a whiteout (a character device 0/0), which anyone may
                // make (`vfs_mknod`).
                let whiteout = t == FileType::CharDevice && rdev == WHITEOUT_DEV;
                if matches!(t, FileType::CharDevice | FileType::BlockDevice)
                    && !whiteout
                    && !ctx.has(perm::caps::MKNOD)
                {
                    return Err(Errno::EPERM);
                }
                (t, rdev, &b""[..])
            }
        };
        let Inherited {
            bits,
            gid,
            access_acl,
            default_acl,
        } = self.inherit(ctx, dir, &dv, mode, &kind);
        let inode = NewInode {
            id: self.ids.alloc(&self.stats)?,
            mode: ftype.mode_bits() | bits,
            uid: ctx.uid,
            gid,
            rdev,
            target,
            time: Timespec::now(),
            access_acl: &access_acl,
            default_acl: &default_acl,
        };
        let (dir_id, cookie) = (dir.id(), self.dirents.next_cookie());
        let rec = Record::Create {
            dir: dir_id,
            name,
            cookie,
            inode,
            flags: dv.flags & flags::INHERITED,
        };
        self.counted_for(ctx, inode.id.ino, |refs| {
            self.apply_create(&rec, (dir, d), extra_refs + refs, g)
        })
    }

    /// Makes a new inode numbered `ino` with `make(refs)`, `refs` being the lookup reference
    /// a kernel caller takes on it (1, else 0): counted before the inode can be found
    /// ([`crate::notify`]), and the count given back if it is not made.
    fn counted_for<T>(
        &self,
        ctx: &Ctx,
        ino: Ino,
        make: impl FnOnce(u32) -> Result<T>,
    ) -> Result<T> {
        let kernel = ctx.counts_lookups();
        if kernel {
            self.watch.held.add(ino);
        }
        let r = make(u32::from(kernel));
        if kernel && r.is_err() {
            self.watch.held.sub(ino, 1);
        }
        r
    }

    /// What a new inode of `kind`, made by `ctx` with permission bits `mode` in directory
    /// `dir` (whose values are `dv`), gets from the directory: its default ACL, when it has
    /// one, decides the bits and the ACLs the inode inherits (not for symlinks, which have no
    /// ACLs); otherwise the umask applies; then the setgid rules (`new_owner`).
    fn inherit(
        &self,
        ctx: &Ctx,
        dir: &Inode,
        dv: &AttrVals,
        mode: u32,
        kind: &NewNode<'_>,
    ) -> Inherited {
        let inherited = match kind {
            NewNode::Symlink(_) => None,
            _ if dv.flags & flags::DEFAULT_ACL != 0 => self.default_acl(dir).map(|def| {
                let keep = if matches!(kind, NewNode::Dir) {
                    0o1777
                } else {
                    0o7777
                };
                acl::inherit(
                    Some(&def),
                    mode & keep,
                    ctx.umask,
                    matches!(kind, NewNode::Dir),
                )
            }),
            _ => None,
        };
        let (bits, gid) = new_owner(ctx, dv, mode, kind, inherited.as_ref().map(|i| i.mode));
        let xattr = |a: Option<&acl::Acl>| a.map(acl::Acl::to_xattr).unwrap_or_default();
        let (access_acl, default_acl) = match &inherited {
            Some(i) => (xattr(i.access.as_ref()), xattr(i.default.as_ref())),
            None => (Vec::new(), Vec::new()),
        };
        Inherited {
            bits,
            gid,
            access_acl,
            default_acl,
        }
    }

    /// Makes a regular file with no name, as `open(O_TMPFILE)` in directory `parent` makes
    /// it (`vfs_tmpfile`, `shmem_tmpfile`), and returns it with `refs` references (plus one
    /// lookup reference for a [`Via::Kernel`] caller). The directory is checked as for a
    /// create (write and search permission, alive) and gives the file what a create in it
    /// would (group, ACLs, inherited inode flags), but is not changed: no name, no times.
    /// `linkable`: a link may give the file its first name (not after `O_EXCL`).
    pub(crate) fn make_unnamed<'g>(
        &self,
        ctx: &Ctx,
        parent: InodeRef,
        mode: u32,
        linkable: bool,
        refs: u32,
        g: &'g Guard,
    ) -> Result<&'g Inode> {
        let (dir, d) = self.dir_inode(parent, g)?;
        self.writable()?;
        let dv = dir.attr.load();
        self.permission(ctx, dir, &dv, MAY_WRITE | MAY_EXEC)?;
        // Linux does not look; lanefs refuses a removed directory, as a create in it. No
        // lock orders this against an rmdir: the file takes no entry in the directory, so
        // a removal racing it changes nothing either of them does.
        if d.life.is_dead() {
            return Err(Errno::ENOENT);
        }
        let a = self.inherit(ctx, dir, &dv, mode, &NewNode::File);
        debug_assert!(a.default_acl.is_empty(), "only directories inherit one");
        let id = self.ids.alloc(&self.stats)?;
        let rec = Record::Tmpfile {
            inode: NewInode {
                id,
                mode: libc::S_IFREG | a.bits,
                uid: ctx.uid,
                gid: a.gid,
                rdev: 0,
                target: b"",
                time: Timespec::now(),
                access_acl: &a.access_acl,
                default_acl: b"",
            },
            flags: dv.flags & flags::INHERITED,
        };
        self.counted_for(ctx, id.ino, |kernel| {
            self.apply_tmpfile(&rec, refs + kernel, linkable, g)
        })
    }

    /// Creates a device node, FIFO, socket or (type bits 0 or `S_IFREG`) regular file.
    pub fn mknod(
        &self,
        ctx: &Ctx,
        parent: impl Into<InodeRef>,
        name: &[u8],
        mode: u32,
        rdev: u64,
    ) -> Result<Attr> {
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
            Ok(kind) => self.make_reported(ctx, Op::Mknod, parent.into(), name, mode, kind),
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
        parent: InodeRef,
        name: &[u8],
        mode: u32,
        kind: NewNode,
    ) -> Result<Attr> {
        let a = {
            let _c = self.begin(op);
            let g = epoch::pin();
            let i = self.make_node(ctx, parent, name, mode, kind, 0, &g)?;
            self.attr_of(i, &g)
        };
        self.report(ctx, |s| s.new_entry(parent.ino(), name));
        Ok(a)
    }

    /// Creates a directory.
    pub fn mkdir(
        &self,
        ctx: &Ctx,
        parent: impl Into<InodeRef>,
        name: &[u8],
        mode: u32,
    ) -> Result<Attr> {
        self.make_reported(ctx, Op::Mkdir, parent.into(), name, mode, NewNode::Dir)
    }

    /// Creates a symbolic link to `target`.
    pub fn symlink(
        &self,
        ctx: &Ctx,
        parent: impl Into<InodeRef>,
        name: &[u8],
        target: &[u8],
    ) -> Result<Attr> {
        self.make_reported(
            ctx,
            Op::Symlink,
            parent.into(),
            name,
            0o777,
            NewNode::Symlink(target),
        )
    }

    /// The target of symlink `ino`.
    pub fn readlink(&self, ino: impl Into<InodeRef>) -> Result<Vec<u8>> {
        let _c = self.begin(Op::Readlink);
        let g = epoch::pin();
        match &self.iget(ino, &g)?.body {
            crate::inode::Body::Symlink(t) => Ok(t.to_vec()),
            _ => Err(Errno::EINVAL),
        }
    }

    /// Adds the name `newname` in `newparent` for inode `ino` (not a directory). An inode
    /// with no name left is refused (ENOENT), unless it is an `O_TMPFILE` file that never had
    /// one and was not made with `O_EXCL` ([`Filesystem::tmpfile`]): this gives it its first
    /// name, after which it is an ordinary file (Linux's `I_LINKABLE`).
    pub fn link(
        &self,
        ctx: &Ctx,
        ino: impl Into<InodeRef>,
        newparent: impl Into<InodeRef>,
        newname: &[u8],
    ) -> Result<Attr> {
        let (ino, newparent) = (ino.into(), newparent.into());
        let a = self.link_locked(ctx, ino, newparent, newname)?;
        self.report(ctx, |s| {
            s.inode(ino.ino(), None);
            s.new_entry(newparent.ino(), newname);
        });
        Ok(a)
    }

    fn link_locked(
        &self,
        ctx: &Ctx,
        ino: InodeRef,
        newparent: InodeRef,
        newname: &[u8],
    ) -> Result<Attr> {
        let _c = self.begin(Op::Link);
        check_name(newname)?;
        let g = epoch::pin();
        let src = self.iget(ino, &g)?;
        let (dir, d) = self.dir_inode(newparent, &g)?;
        let _counted = self.count_entry_change(dir, None);
        self.may_search(ctx, dir)?;
        if is_dot_or_dotdot(newname) {
            return Err(Errno::EEXIST);
        }
        let _dl = self.dirlock(dir);
        let _s = self.lock_stripe(self.stripe_of(dir.key(), newname));
        if self.dget(dir.key(), newname).is_some() {
            return Err(Errno::EEXIST);
        }
        self.writable()?;
        // fs.protected_hardlinks: only the owner may link a file they could not read and
        // write, or a set-id or non-regular file. Through a mount the kernel has applied its
        // own setting already.
        let sv = src.attr.load();
        if self.cfg.protected_hardlinks && ctx.via == Via::Library && !perm::owner_or_root(ctx, &sv)
        {
            let sgid_gx = libc::S_ISGID | libc::S_IXGRP;
            let safe = sv.mode & libc::S_IFMT == libc::S_IFREG
                && sv.mode & libc::S_ISUID == 0
                && sv.mode & sgid_gx != sgid_gx
                && self.permission(ctx, src, &sv, MAY_READ | MAY_WRITE).is_ok();
            if !safe {
                return Err(Errno::EPERM);
            }
        }
        self.permission(ctx, dir, &dir.attr.load(), MAY_WRITE | MAY_EXEC)?;
        if d.life.is_dead() {
            return Err(Errno::ENOENT);
        }
        // `vfs_link`: no new name for an append-only or immutable inode.
        if src.attr.flags() & flags::FROZEN != 0 || src.is_dir() {
            return Err(Errno::EPERM);
        }
        let rec = Record::Link {
            dir: dir.id(),
            name: newname,
            cookie: self.dirents.next_cookie(),
            inode: src.id(),
            time: Timespec::now(),
        };
        self.apply_link(&rec, (dir, d), src, &g)?;
        self.pin_for(ctx, src)?;
        Ok(self.attr_of(src, &g))
    }

    /// Locks a directory for removing `name` from it and returns the entry's inode, after the
    /// permission checks `may_delete` makes.
    fn lock_victim<'a>(
        &'a self,
        ctx: &Ctx,
        parent: InodeRef,
        name: &[u8],
        g: &'a Guard,
    ) -> Result<Victim<'a>> {
        check_name(name)?;
        let (dir, d) = self.dir_inode(parent, g)?;
        let counted = self.count_entry_change(dir, None);
        self.may_search(ctx, dir)?;
        self.writable()?;
        let dl = self.dirlock(dir);
        let s = self.lock_stripe(self.stripe_of(dir.key(), name));
        let de = self.dget(dir.key(), name).ok_or(Errno::ENOENT)?;
        let inode = self.iget_named(de, g)?;
        let dv = dir.attr.load();
        self.permission(ctx, dir, &dv, MAY_WRITE | MAY_EXEC)?;
        may_delete(ctx, &dv, &inode.attr.load())?;
        Ok(Victim {
            dir: (dir, d),
            inode,
            _locks: [dl, Some(s)],
            _counted: counted,
        })
    }

    /// Removes a non-directory entry.
    pub fn unlink(&self, ctx: &Ctx, parent: impl Into<InodeRef>, name: &[u8]) -> Result<()> {
        let parent = parent.into();
        self.removing(ctx, &[(parent.ino(), name)], || {
            let ino = self.remove_locked(ctx, Op::Unlink, parent, name)?;
            self.report_removal(ctx, parent.ino(), name, ino);
            Ok(())
        })
    }

    /// Removes an empty directory.
    pub fn rmdir(&self, ctx: &Ctx, parent: impl Into<InodeRef>, name: &[u8]) -> Result<()> {
        let parent = parent.into();
        self.removing(ctx, &[(parent.ino(), name)], || {
            let ino = self.remove_locked(ctx, Op::Rmdir, parent, name)?;
            self.report_removal(ctx, parent.ino(), name, ino);
            Ok(())
        })
    }

    /// `unlink` or `rmdir` (`op`): removes the name and returns the inode it named.
    fn remove_locked(&self, ctx: &Ctx, op: Op, parent: InodeRef, name: &[u8]) -> Result<Ino> {
        let _c = self.begin(op);
        let rmdir = op == Op::Rmdir;
        match name {
            b"." | b".." if !rmdir => return Err(Errno::EISDIR),
            b"." => return Err(Errno::EINVAL),
            b".." => return Err(Errno::ENOTEMPTY),
            _ => {}
        }
        let g = epoch::pin();
        let v = self.lock_victim(ctx, parent, name, &g)?;
        match (rmdir, v.inode.is_dir()) {
            (false, true) => return Err(Errno::EISDIR),
            (true, false) => return Err(Errno::ENOTDIR),
            _ => {}
        }
        let rec = Record::Remove {
            dir: v.dir.0.id(),
            name,
            inode: v.inode.id(),
            time: Timespec::now(),
        };
        let freed = self.apply_remove(&rec, v.dir, v.inode, &g)?;
        let ino = v.inode.ino;
        drop(v);
        if let Some((i, fate)) = freed {
            self.settle(i, fate, &g);
        }
        Ok(ino)
    }

    /// Whether directory `a` is `d` or one of `d`'s ancestors. Parent pointers change only
    /// under the rename lock, which the caller holds, so the chain is stable; a chain that
    /// runs into a removed directory means `d` itself was removed (a directory with a
    /// subdirectory cannot be), and that is ENOENT, never a conclusion.
    fn is_ancestor(&self, a: &Inode, d: &Inode, g: &Guard) -> Result<bool> {
        let mut cur = d;
        for _ in 0..=MAX_INO {
            if std::ptr::eq(cur, a) {
                return Ok(true);
            }
            let cd = cur.dir().expect("parents are directories");
            if cd.life.is_dead() {
                return Err(Errno::ENOENT);
            }
            let p = cd.parent();
            if p == cur.key() {
                return Ok(false); // the root
            }
            cur = self.iget_racy(p, g).ok_or(Errno::ENOENT)?;
        }
        unreachable!("a chain of parents longer than the inode table: a cycle")
    }

    /// Renames `name` in `parent` to `newname` in `newparent`; `flags` may hold
    /// [`RENAME_NOREPLACE`], [`RENAME_EXCHANGE`] or [`RENAME_WHITEOUT`] (which, as on Linux
    /// since 5.8, needs no privilege: a whiteout is the one device anyone may make).
    pub fn rename(
        &self,
        ctx: &Ctx,
        parent: impl Into<InodeRef>,
        name: &[u8],
        newparent: impl Into<InodeRef>,
        newname: &[u8],
        flags: u32,
    ) -> Result<()> {
        let (parent, newparent) = (parent.into(), newparent.into());
        // Only the old name goes (the new one names the moved inode once the rename is
        // made): a name made there again meanwhile must not be taken as one the kernel
        // holds nothing under ([`Invalidate::removing`]).
        self.removing(ctx, &[(parent.ino(), name)], || {
            let [moved, changed] =
                self.rename_inner(ctx, parent, name, newparent, newname, flags)?;
            // Inodes before names, while the kernel's entries still hold them (as
            // `report_removal` does).
            self.report(ctx, |s| {
                // Nothing of either name in the kernel (as for a removal, `report_removal`: no
                // request handing it entries of either directory runs and no listing of them
                // is kept, asked first; no entry saying the new name is absent; no reference
                // on an inode the rename changed, read after): the directories' attributes
                // only. Not for a directory moved to another parent, whose listing changed.
                let (p, np) = (parent.ino(), newparent.ino());
                if moved.iter().all(Option::is_none)
                    && !s.may_see_removal(p)
                    && (np == p || !s.may_see_removal(np))
                    && !s.may_hold_new_name(np, newname)
                    && changed.iter().flatten().all(|&i| !self.watch.held.holds(i))
                {
                    s.removed_unseen(p);
                    if np != p {
                        s.removed_unseen(np);
                    }
                    return;
                }
                // The inodes whose attributes the rename changed, as another name or an open
                // descriptor sees them: the one moved (its ctime), the one replaced (its link
                // count and ctime) or exchanged (its ctime).
                for i in changed.into_iter().flatten() {
                    s.inode(i, None);
                }
                // A directory moved to another parent lists another `..`.
                for d in moved.into_iter().flatten() {
                    s.listing(d);
                }
                s.entry(parent.ino(), name);
                s.entry(newparent.ino(), newname);
            });
            Ok(())
        })
    }

    /// `rename`'s work; returns the directories it moved to another parent (their `..`
    /// changed) and the inodes whose attributes it changed (the one moved, and the one
    /// replaced or exchanged).
    fn rename_inner(
        &self,
        ctx: &Ctx,
        parent: InodeRef,
        name: &[u8],
        newparent: InodeRef,
        newname: &[u8],
        flags: u32,
    ) -> Result<[[Option<Ino>; 2]; 2]> {
        let _c = self.begin(Op::Rename);
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE | RENAME_WHITEOUT) != 0
            || flags & (RENAME_NOREPLACE | RENAME_WHITEOUT) != 0 && flags & RENAME_EXCHANGE != 0
        {
            return Err(Errno::EINVAL);
        }
        check_name(name)?;
        check_name(newname)?;
        let g = epoch::pin();
        let (d1, dd1) = self.dir_inode(parent, &g)?;
        let (d2, dd2) = self.dir_inode(newparent, &g)?;
        // Counted in both directories until the rename is visible (`revoke.rs`).
        let _counted = self.count_entry_change(d1, Some(d2));
        self.may_search(ctx, d1)?;
        self.may_search(ctx, d2)?;
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
        let (k1, k2) = (d1.key(), d2.key());
        let cross = k1 != k2;
        let (i1, i2) = (self.stripe_of(k1, name), self.stripe_of(k2, newname));
        let mut want_rename_lock = false;
        loop {
            // Lock order: rename lock, directory locks (dirlock mode), stripes by index.
            let dir_moves = |s: Option<&Inode>, t: Option<&Inode>| {
                cross
                    && (s.is_some_and(Inode::is_dir)
                        || flags & RENAME_EXCHANGE != 0 && t.is_some_and(Inode::is_dir))
            };
            let peek = |k, n| self.dget(k, n).and_then(|de| self.iget_racy(de.target, &g));
            if !want_rename_lock {
                want_rename_lock = dir_moves(peek(k1, name), peek(k2, newname));
            }
            let take_rename =
                want_rename_lock || cross && self.cfg.locking == crate::Locking::DirLock;
            let _r = take_rename.then(|| self.stats.lock(LockClass::Rename, &self.rename_lock));
            let (_dl1, _dl2) = if d1.ino <= d2.ino {
                let a = self.dirlock(d1);
                (a, if cross { self.dirlock(d2) } else { None })
            } else {
                let b = self.dirlock(d2);
                (self.dirlock(d1), b)
            };
            let _s1 = self.lock_stripe(i1.min(i2));
            let _s2 = (i1 != i2).then(|| self.lock_stripe(i1.max(i2)));
            // Both names are stable now.
            let src = match self.dget(k1, name) {
                Some(de) => Some(self.iget_named(de, &g)?),
                None => None,
            };
            let dst = match self.dget(k2, newname) {
                Some(de) => Some(self.iget_named(de, &g)?),
                None => None,
            };
            if !take_rename && dir_moves(src, dst) {
                // A file turned into a directory under the name since the peek: the rename
                // lock is needed after all, and it ranks above the stripes. Start over.
                want_rename_lock = true;
                continue;
            }
            let src = src.ok_or(Errno::ENOENT)?;
            // The directories whose parent the rename changes (their `..`).
            let moved_dir = |i: Option<&Inode>| i.filter(|i| cross && i.is_dir()).map(|i| i.ino);
            let moved = [
                moved_dir(Some(src)),
                moved_dir(dst.filter(|_| flags & RENAME_EXCHANGE != 0)),
            ];
            let changed = [Some(src.ino), dst.map(|i| i.ino)];
            let freed = self.rename_locked(
                ctx,
                (d1, dd1, name),
                (d2, dd2, newname),
                src,
                dst,
                flags,
                &g,
            )?;
            drop((_s2, _s1, _dl1, _dl2, _r));
            if let Some((i, fate)) = freed {
                self.settle(i, fate, &g);
            }
            return Ok([moved, changed]);
        }
    }

    /// The checks of `rename` with every lock it needs held and both names read, then the
    /// change; returns a replaced inode to settle once the locks are dropped.
    #[allow(clippy::too_many_arguments)] // two named directories, two inodes, flags, guard
    fn rename_locked<'g>(
        &self,
        ctx: &Ctx,
        (d1, dd1, name): (&Inode, &DirBody, &[u8]),
        (d2, dd2, newname): (&Inode, &DirBody, &[u8]),
        src: &Inode,
        dst: Option<&'g Inode>,
        flags: u32,
        g: &Guard,
    ) -> Result<Option<(&'g Inode, Fate)>> {
        let exchange = flags & RENAME_EXCHANGE != 0;
        let cross = !std::ptr::eq(d1, d2);
        if flags & RENAME_NOREPLACE != 0 && dst.is_some() {
            return Err(Errno::EEXIST);
        }
        if exchange && dst.is_none() {
            return Err(Errno::ENOENT);
        }
        let src_is_dir = src.is_dir();
        let dst_is_dir = dst.is_some_and(Inode::is_dir);
        // Loops (the rename lock is held whenever a directory changes parent).
        if cross && src_is_dir && self.is_ancestor(src, d2, g)? {
            return Err(Errno::EINVAL);
        }
        if let Some(t) = dst {
            if cross && dst_is_dir && self.is_ancestor(t, d1, g)? {
                return Err(if exchange {
                    Errno::EINVAL
                } else {
                    Errno::ENOTEMPTY
                });
            }
            if std::ptr::eq(t, src) {
                return Ok(None); // two names of one inode: POSIX says do nothing
            }
        }
        // may_delete(source), then may_delete(target) or may_create(target dir).
        let v1 = d1.attr.load();
        self.permission(ctx, d1, &v1, MAY_WRITE | MAY_EXEC)?;
        may_delete(ctx, &v1, &src.attr.load())?;
        let v2 = d2.attr.load();
        self.permission(ctx, d2, &v2, MAY_WRITE | MAY_EXEC)?;
        match dst {
            Some(t) => {
                may_delete(ctx, &v2, &t.attr.load())?;
                if !exchange {
                    if src_is_dir && !dst_is_dir {
                        return Err(Errno::ENOTDIR);
                    }
                    if !src_is_dir && dst_is_dir {
                        return Err(Errno::EISDIR);
                    }
                }
            }
            None if dd2.life.is_dead() => return Err(Errno::ENOENT),
            None => {}
        }
        // A directory changing parent rewrites its "..": write permission on it.
        if cross && src_is_dir {
            self.permission(ctx, src, &src.attr.load(), MAY_WRITE)?;
        }
        if let (true, true, Some(t)) = (cross, exchange && dst_is_dir, dst) {
            self.permission(ctx, t, &t.attr.load(), MAY_WRITE)?;
        }
        let cookie = if dst.is_none() {
            self.dirents.next_cookie()
        } else {
            0
        };
        let time = Timespec::now();
        if flags & RENAME_WHITEOUT == 0 {
            let rec = Record::Rename {
                from: d1.id(),
                from_name: name,
                to: d2.id(),
                to_name: newname,
                inode: src.id(),
                replaced: dst.map(Inode::id),
                exchange,
                cookie,
                time,
            };
            return self.apply_rename(&rec, (d1, dd1), (d2, dd2), src, dst, g);
        }
        // The whiteout, made as `shmem_whiteout` makes it: `mknod(S_IFCHR | 0, 0)` in the
        // source directory by the caller (so its group, ACL and inode flags are what such
        // a mknod would give), after the target was found removable.
        if let Some(td) = dst.and_then(Inode::dir) {
            if self.dirents.count(td, g) != 0 {
                return Err(Errno::ENOTEMPTY); // checked again, exactly, in the removal
            }
        }
        let kind = NewNode::Special(FileType::CharDevice, WHITEOUT_DEV);
        let inherited = match v1.flags & flags::DEFAULT_ACL {
            0 => None,
            _ => self
                .default_acl(d1)
                .map(|def| acl::inherit(Some(&def), 0, 0, false)),
        };
        let (bits, gid) = new_owner(ctx, &v1, 0, &kind, inherited.as_ref().map(|i| i.mode));
        let access_acl = inherited
            .as_ref()
            .and_then(|i| i.access.as_ref())
            .map(acl::Acl::to_xattr)
            .unwrap_or_default();
        let rec = Record::RenameWhiteout {
            from: d1.id(),
            from_name: name,
            to: d2.id(),
            to_name: newname,
            inode: src.id(),
            replaced: dst.map(Inode::id),
            cookie,
            time,
            whiteout: NewInode {
                id: self.ids.alloc(&self.stats)?,
                mode: libc::S_IFCHR | bits,
                uid: ctx.uid,
                gid,
                rdev: WHITEOUT_DEV,
                target: b"",
                time,
                access_acl: &access_acl,
                default_acl: b"",
            },
            // The whiteout inherits the source entry's cookie (`Dirents::heir`).
            whiteout_cookie: self
                .dget(d1.key(), name)
                .expect("the source under its stripe")
                .cookie,
            whiteout_flags: v1.flags & flags::INHERITED,
        };
        self.apply_rename(&rec, (d1, dd1), (d2, dd2), src, dst, g)
    }
}
