//! File operations: open, create, tmpfile (`O_TMPFILE`), read, write, setattr (chmod, chown,
//! truncate, utimes), fallocate, flush, fsync, release.
//!
//! A change to a file's data or attributes is committed while the lock that orders such
//! changes is held: the data lock for writes, truncates and fallocate, the attribute seqlock
//! for attribute changes (the record is built inside it, from the values it replaces).
//!
//! # Inode flags
//! As the VFS: an immutable file is not opened for writing (its write permission check fails,
//! EPERM), an append-only one only with `O_APPEND` and never with `O_TRUNC` (`may_open`);
//! neither has its mode, owner or times set (a touch to "now" is allowed on an append-only
//! file), its size changed, nor is punched (`may_setattr`, `vfs_truncate`, `vfs_fallocate`).
//! A file opened for writing before it became immutable or append-only may still be written
//! through that handle, as on Linux; one the caller opened itself ([`Filesystem::write_inode_flags`])
//! is checked at each write instead. 'A' stops reads' access-time updates.
//!
//! # Privileges a change takes away
//! As Linux's `file_remove_privs` and `chown`: a write, truncate or fallocate by a caller
//! without `CAP_FSETID` ([`Ctx::keeps_setid`]) clears set-user-ID, and set-group-ID when the
//! file is group-executable or the caller is not in its group; any of them, and a `chown`,
//! removes the file's capabilities (`security.capability`) whoever the caller is; a `chown`
//! clears both set-id bits as `chown(2)` does. The privileges go first, each with its own
//! record, so a crash between them and the data change can only leave the file with fewer
//! privileges, never the new contents with the old ones.

use crossbeam_epoch::{self as epoch, Guard};

use super::apply::OwnedAcl;
use super::namespace::NewNode;
use super::{Atime, Filesystem, InodeRef, MAX_FILE_SIZE};
use crate::acl::{ACL_ACCESS_NAME, Acl};
use crate::attr::flags::{self as attr_flags};
use crate::attr::{Attr, AttrVals, SetAttr, TimeSet, flags};
use crate::data::PAGE;
use crate::errno::{Errno, Result};
use crate::handle::{Fh, Handle};
use crate::id::Ino;
use crate::inode::{Body, Inode};
use crate::perm::{self, Ctx, MAY_READ, MAY_WRITE};
use crate::record::{AttrChange, Record};
use crate::stats::{LockClass, Op};
use crate::time::Timespec;

/// `fallocate` mode: do not change the file size.
pub const FALLOC_FL_KEEP_SIZE: i32 = libc::FALLOC_FL_KEEP_SIZE;
/// `fallocate` mode: deallocate the range (with `FALLOC_FL_KEEP_SIZE`).
pub const FALLOC_FL_PUNCH_HOLE: i32 = libc::FALLOC_FL_PUNCH_HOLE;

/// The name of a file's capabilities.
const CAPS: &[u8] = b"security.capability";

/// Who asks for a size change in [`Filesystem::setattr`], which decides what it must be
/// allowed to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TruncateBy {
    /// `truncate(path)`: needs write permission on the file.
    Path,
    /// `ftruncate` of an engine handle, which must be open for writing.
    Handle(Fh),
    /// `ftruncate` of a file the caller keeps open itself and has checked is open for
    /// writing (the FUSE server in no-open mode, where the kernel holds open files).
    OpenFile,
}

/// The set-id bits a change by `ctx` clears from values `v` (`setattr_should_drop_suidgid`).
fn setid_killed(ctx: &Ctx, v: &AttrVals) -> u32 {
    if ctx.keeps_setid || v.mode & libc::S_IFMT != libc::S_IFREG {
        return 0;
    }
    let mut kill = v.mode & libc::S_ISUID;
    let sgid = v.mode & libc::S_ISGID != 0;
    if sgid && (v.mode & libc::S_IXGRP != 0 || !ctx.in_group(v.gid)) {
        kill |= libc::S_ISGID;
    }
    kill
}

/// How a data operation names its file.
#[derive(Clone, Copy)]
enum FileRef {
    /// An open handle from `open` or `create`: its access mode and `O_APPEND` apply.
    Handle(Fh),
    /// The inode, for a caller that keeps open files itself and has checked the access;
    /// with the `open(2)` flags of the file, where they matter (a write: `O_APPEND`).
    Inode(Ino, i32),
}

impl Filesystem {
    /// Opens inode `i` (after a lookup) with `open(2)` flags, taking a handle reference.
    fn open_inode(&self, ctx: &Ctx, i: &Inode, flags: i32, g: &Guard) -> Result<Fh> {
        let acc = flags & libc::O_ACCMODE;
        if acc == libc::O_ACCMODE {
            return Err(Errno::EINVAL);
        }
        let wants_write = acc != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        match &i.body {
            Body::Dir(_) if wants_write => return Err(Errno::EISDIR),
            Body::Symlink(_) => return Err(Errno::ELOOP),
            _ => {}
        }
        if flags & libc::O_DIRECTORY != 0 && !i.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        let mut mask = 0;
        if acc != libc::O_WRONLY {
            mask |= MAY_READ;
        }
        if wants_write {
            mask |= MAY_WRITE;
        }
        let v = i.attr.load();
        self.permission(ctx, i, &v, mask)?;
        // `may_open`: an append-only file is written only through O_APPEND, never truncated.
        if v.flags & attr_flags::APPEND != 0
            && (acc != libc::O_RDONLY && flags & libc::O_APPEND == 0 || flags & libc::O_TRUNC != 0)
        {
            return Err(Errno::EPERM);
        }
        if flags & libc::O_NOATIME != 0 && !perm::owner_or_root(ctx, &v) {
            return Err(Errno::EPERM);
        }
        if wants_write {
            self.writable()?;
        }
        i.get_ref()?;
        if flags & libc::O_TRUNC != 0 && matches!(i.body, Body::File(_)) {
            // An open(O_TRUNC) stamps mtime and ctime even when the size does not change.
            let set = SetAttr {
                size: Some(0),
                mtime: Some(TimeSet::Now),
                ..SetAttr::default()
            };
            if let Err(e) = self.set_attributes(ctx, i, &set, Some(TruncateBy::OpenFile), g) {
                self.put_refs(i, 1, g);
                return Err(e);
            }
        }
        let h = Handle {
            inode: i.key(),
            flags,
            is_dir: i.is_dir(),
        };
        Ok(self.handles.insert(h, &self.stats))
    }

    /// Opens inode `ino`; `flags` are `open(2)` flags (`O_RDONLY`, `O_WRONLY`, `O_RDWR`,
    /// `O_APPEND`, `O_TRUNC`, `O_DIRECTORY`...).
    pub fn open(&self, ctx: &Ctx, ino: impl Into<InodeRef>, flags: i32) -> Result<Fh> {
        let ino = ino.into();
        let fh = {
            let _c = self.begin(Op::Open);
            let g = epoch::pin();
            self.open_inode(ctx, self.iget(ino, &g)?, flags, &g)?
        };
        if flags & libc::O_TRUNC != 0 {
            self.report(ctx, |s| s.inode(ino.ino(), Some((0, 0))));
        }
        Ok(fh)
    }

    /// Creates and opens a regular file (`open` with `O_CREAT`): with `O_EXCL` an existing name
    /// fails with EEXIST, without it the existing file is opened.
    pub fn create(
        &self,
        ctx: &Ctx,
        parent: impl Into<InodeRef>,
        name: &[u8],
        mode: u32,
        flags: i32,
    ) -> Result<(Attr, Fh)> {
        let parent = parent.into();
        let (a, fh) = self.create_inner(ctx, parent, name, mode, flags)?;
        self.report(ctx, |s| {
            s.new_entry(parent.ino(), name);
            if flags & libc::O_TRUNC != 0 {
                s.inode(a.ino, Some((0, 0)));
            }
        });
        Ok((a, fh))
    }

    fn create_inner(
        &self,
        ctx: &Ctx,
        parent: InodeRef,
        name: &[u8],
        mode: u32,
        flags: i32,
    ) -> Result<(Attr, Fh)> {
        let _c = self.begin(Op::Create);
        let g = epoch::pin();
        loop {
            match self.make_node(ctx, parent, name, mode, NewNode::File, 1, &g) {
                Ok(i) => {
                    let h = Handle {
                        inode: i.key(),
                        flags,
                        is_dir: false,
                    };
                    let fh = self.handles.insert(h, &self.stats);
                    return Ok((self.attr_of(i, &g), fh));
                }
                Err(Errno::EEXIST) if flags & libc::O_EXCL == 0 => {
                    let (dir, d) = self.dir_inode(parent, &g)?;
                    let child = match self.child(dir, d, name, false, &g) {
                        Err(Errno::ENOENT) => continue, // removed since: create again
                        r => r?,
                    };
                    if child.is_dir() {
                        return Err(Errno::EISDIR);
                    }
                    let fh = match self.open_inode(ctx, child, flags, &g) {
                        Err(Errno::ENOENT) => continue,
                        r => r?,
                    };
                    if let Err(e) = self.pin_for(ctx, child) {
                        self.release_inner(fh, &g)?;
                        return Err(e);
                    }
                    return Ok((self.attr_of(child, &g), fh));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// `open(dir, O_TMPFILE | flags, mode)`: makes a regular file with no name, in
    /// directory `dir` as far as permissions, group, ACLs and inherited inode flags go, and
    /// opens it. The access mode must allow writing (EINVAL otherwise, as Linux);
    /// `O_EXCL` forbids it ever to get a name, otherwise a [`Filesystem::link`] gives it its
    /// first (`linkat(fd, "", dirfd, name, AT_EMPTY_PATH)`). Its link count is 0: it is in
    /// no listing, counts against the inode and space limits, and is freed, as an unlinked
    /// open file, when its last handle (and, for a [`crate::Via::Kernel`] caller, the
    /// lookup reference the call takes for it) goes. The directory is not changed.
    pub fn tmpfile(
        &self,
        ctx: &Ctx,
        dir: impl Into<InodeRef>,
        mode: u32,
        flags: i32,
    ) -> Result<(Attr, Fh)> {
        let _c = self.begin(Op::Tmpfile);
        let acc = flags & libc::O_ACCMODE;
        if acc != libc::O_WRONLY && acc != libc::O_RDWR {
            return Err(Errno::EINVAL);
        }
        let g = epoch::pin();
        let linkable = flags & libc::O_EXCL == 0;
        let i = self.make_unnamed(ctx, dir.into(), mode, linkable, 1, &g)?;
        let h = Handle {
            inode: i.key(),
            // `O_TMPFILE` holds `O_DIRECTORY`, which is the directory's, not the file's.
            flags: flags & !(libc::O_TMPFILE | libc::O_CREAT | libc::O_EXCL),
            is_dir: false,
        };
        let fh = self.handles.insert(h, &self.stats);
        Ok((self.attr_of(i, &g), fh))
    }

    /// The inode of `f`, with its handle when it names one.
    fn file_inode<'g>(&self, f: FileRef, g: &'g Guard) -> Result<(Option<Handle>, &'g Inode)> {
        match f {
            FileRef::Handle(fh) => self.handle_inode(fh, g).map(|(h, i)| (Some(h), i)),
            FileRef::Inode(ino, _) => self.iget(ino, g).map(|i| (None, i)),
        }
    }

    /// The inode behind a handle (the handle's reference keeps it alive).
    fn handle_inode<'g>(&self, fh: Fh, g: &'g Guard) -> Result<(Handle, &'g Inode)> {
        let h = self.handles.get(fh, &self.stats)?;
        let i = self
            .resident(h.inode.ino(), g)
            .filter(|i| i.key() == h.inode)
            .expect("an open handle keeps its inode");
        Ok((h, i))
    }

    /// The access time after a read, as [`crate::Config::atime`] says (under `relatime`: updated
    /// when not after mtime or ctime, or a day old); a directory's not with `nodiratime`.
    pub(super) fn touch_atime(&self, i: &Inode, g: &Guard) {
        let v = i.attr.load();
        let now = Timespec::now();
        let stale = match self.cfg.atime {
            Atime::Never => return,
            Atime::Strict => true,
            Atime::Relative => {
                v.atime <= v.mtime || v.atime <= v.ctime || now.sec - v.atime.sec >= 86_400
            }
        };
        if self.cfg.read_only
            || !stale
            || v.atime == now
            || v.flags & flags::NOATIME != 0
            || self.cfg.no_dir_atime && v.mode & libc::S_IFMT == libc::S_IFDIR
        {
            return;
        }
        let Ok(_held) = self.hold(i, g) else {
            return; // freed meanwhile: no atime to keep
        };
        let _ = i.attr.update(&self.stats, |v| {
            if v.flags & flags::NOATIME != 0 {
                return Ok(()); // set since the check above
            }
            let change = AttrChange {
                atime: Some(now),
                ..AttrChange::default()
            };
            self.commit(&Record::SetAttr {
                inode: i.id(),
                change,
            })?;
            v.atime = now;
            Ok::<(), Errno>(())
        });
    }

    /// Reads up to `buf.len()` bytes at `offset`; returns the count (0 at end of file).
    pub fn read(&self, fh: Fh, offset: u64, buf: &mut [u8]) -> Result<usize> {
        self.read_from(FileRef::Handle(fh), offset, buf)
    }

    /// `read` of an open file that the caller tracks itself and has checked is open for
    /// reading: the FUSE server in FUSE's no-open mode, where the kernel keeps open files and
    /// sends reads by inode.
    pub fn read_inode(&self, ino: Ino, offset: u64, buf: &mut [u8]) -> Result<usize> {
        self.read_inode_flags(ino, offset, buf, libc::O_RDONLY)
    }

    /// [`Filesystem::read_inode`] of a file opened with the `open(2)` flags `open_flags`:
    /// with `O_NOATIME` (which the opener checked it may use) the access time stays.
    pub fn read_inode_flags(
        &self,
        ino: Ino,
        offset: u64,
        buf: &mut [u8],
        open_flags: i32,
    ) -> Result<usize> {
        self.read_from(FileRef::Inode(ino, open_flags), offset, buf)
    }

    fn read_from(&self, f: FileRef, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let _c = self.begin(Op::Read);
        let g = epoch::pin();
        let noatime = matches!(f, FileRef::Inode(_, fl) if fl & libc::O_NOATIME != 0);
        let (h, i) = self.file_inode(f, &g)?;
        if h.is_some_and(|h| !h.readable()) {
            return Err(Errno::EBADF);
        }
        let data = match &i.body {
            Body::File(d) => d,
            Body::Dir(_) => return Err(Errno::EISDIR),
            _ => return Err(Errno::EINVAL),
        };
        let n = {
            let d = self.stats.read(LockClass::FileData, data);
            let size = i.attr.size();
            if offset >= size {
                0
            } else {
                let n = (buf.len() as u64).min(size - offset) as usize;
                d.read(offset, &mut buf[..n], &|first, b| {
                    self.fetch_pages(i, first, b)
                })?;
                n
            }
        };
        if !noatime && h.is_none_or(|h| h.flags & libc::O_NOATIME == 0) {
            self.touch_atime(i, &g);
        }
        self.after_data_op(false);
        Ok(n)
    }

    /// Writes `data` at `offset` (at the end with `O_APPEND`); returns the count, which is
    /// short only when the filesystem fills up (ENOSPC if nothing fits).
    pub fn write(&self, ctx: &Ctx, fh: Fh, offset: u64, data: &[u8]) -> Result<usize> {
        self.write_to(ctx, FileRef::Handle(fh), offset, data)
    }

    /// `write` of an open file that the caller tracks itself and has checked is open for
    /// writing (see [`Filesystem::read_inode`]), opened without `O_APPEND`; `offset` is
    /// final. [`Filesystem::write_inode_flags`] with `O_WRONLY`.
    pub fn write_inode(&self, ctx: &Ctx, ino: Ino, offset: u64, data: &[u8]) -> Result<usize> {
        self.write_inode_flags(ctx, ino, offset, data, libc::O_WRONLY)
    }

    /// [`Filesystem::write_inode`] of a file opened with the `open(2)` flags `open_flags`;
    /// `offset` is final (the caller applies `O_APPEND`). Since the engine did not see the
    /// open, this refuses what the open would have been refused for: a write to an
    /// immutable file, or to an append-only one without `O_APPEND` (EPERM). (A file opened
    /// through [`Filesystem::open`] before it became immutable or append-only may still be
    /// written, as on Linux.)
    pub fn write_inode_flags(
        &self,
        ctx: &Ctx,
        ino: Ino,
        offset: u64,
        data: &[u8],
        open_flags: i32,
    ) -> Result<usize> {
        self.write_to(ctx, FileRef::Inode(ino, open_flags), offset, data)
    }

    fn write_to(&self, ctx: &Ctx, f: FileRef, offset: u64, data: &[u8]) -> Result<usize> {
        let (ino, at, n) = self.write_inner(ctx, f, offset, data)?;
        if n > 0 {
            self.report(ctx, |s| s.inode(ino, Some((at, n as u64))));
        }
        Ok(n)
    }

    /// Takes away what a change by `ctx` takes away (module doc, "Privileges"), each with its
    /// record: the capabilities always, the set-id bits when `setid` (a data change; a chown
    /// clears them itself). The caller holds the file's data lock.
    fn remove_privs(&self, ctx: &Ctx, i: &Inode, time: Timespec, setid: bool) -> Result<()> {
        let v = i.attr.load();
        // A look under the shard first: most files with attributes have no capabilities,
        // and the removal itself is made inside the attribute seqlock.
        let caps = || {
            let shard = self.xattrs.lock(i.ino, &self.stats);
            shard.get(&i.ino).is_some_and(|x| x.get(CAPS).is_some())
        };
        if v.flags & flags::XATTRS != 0 && caps() {
            let rec = Record::RemoveXattr {
                inode: i.id(),
                name: CAPS,
                time,
            };
            match self.apply_xattr(&rec, i, |_, x| {
                x.and_then(|x| x.get(CAPS)).map(drop).ok_or(Errno::ENODATA)
            }) {
                Ok(()) | Err(Errno::ENODATA) => {}
                Err(e) => return Err(e),
            }
        }
        if !setid || setid_killed(ctx, &v) == 0 {
            return Ok(());
        }
        i.attr.update(&self.stats, |v| {
            let kill = setid_killed(ctx, v);
            if kill == 0 {
                return Ok(());
            }
            let change = AttrChange {
                mode: Some(v.mode & !kill),
                ctime: Some(time),
                ..AttrChange::default()
            };
            self.commit(&Record::SetAttr {
                inode: i.id(),
                change,
            })?;
            Self::apply_attr(v, &change, 0);
            Ok(())
        })
    }

    /// `write`, returning the inode and the offset written at too.
    fn write_inner(
        &self,
        ctx: &Ctx,
        f: FileRef,
        offset: u64,
        data: &[u8],
    ) -> Result<(Ino, u64, usize)> {
        let _c = self.begin(Op::Write);
        let g = epoch::pin();
        let (h, i) = self.file_inode(f, &g)?;
        if h.is_some_and(|h| !h.writable()) {
            return Err(Errno::EBADF);
        }
        let Body::File(fdata) = &i.body else {
            return Err(Errno::EINVAL);
        };
        self.writable()?;
        if let FileRef::Inode(_, open_flags) = f {
            let fl = i.attr.flags();
            if fl & flags::IMMUTABLE != 0
                || fl & flags::APPEND != 0 && open_flags & libc::O_APPEND == 0
            {
                return Err(Errno::EPERM);
            }
        }
        if data.is_empty() {
            return Ok((i.ino, offset, 0));
        }
        let _held = self.hold(i, &g)?;
        let mut d = self.stats.write(LockClass::FileData, fdata);
        let off = if h.is_some_and(|h| h.flags & libc::O_APPEND != 0) {
            i.attr.size()
        } else {
            offset
        };
        if off
            .checked_add(data.len() as u64)
            .is_none_or(|end| end > MAX_FILE_SIZE)
        {
            return Err(Errno::EFBIG);
        }
        // Reserve space for all of it or, near a full filesystem, for as much as fits, page
        // by page.
        let mut n = data.len();
        let mut reserved = d.missing_pages(off, n as u64);
        if self.space.take(reserved).is_err() {
            n = 0;
            reserved = 0;
            while n < data.len() {
                let at = off + n as u64;
                let chunk = ((PAGE - at % PAGE) as usize).min(data.len() - n);
                let more = d.missing_pages(at, chunk as u64);
                if self.space.take(more).is_err() {
                    break;
                }
                reserved += more;
                n += chunk;
            }
            if n == 0 {
                return Err(Errno::ENOSPC);
            }
        }
        let time = Timespec::now();
        let rec = Record::Write {
            inode: i.id(),
            offset: off,
            data: &data[..n],
            time,
        };
        if let Err(e) = d
            .prepare_edges(
                off,
                n as u64,
                &|f, b| self.fetch_pages(i, f, b),
                &self.page_epochs,
            )
            .and_then(|()| self.remove_privs(ctx, i, time, true))
            .and_then(|()| self.commit(&rec))
        {
            self.space.give(reserved);
            return Err(e);
        }
        self.apply_write(i, &mut d, &rec);
        drop(d);
        drop(_held);
        self.after_data_op(true);
        Ok((i.ino, off, n))
    }

    /// Changes attributes, with the checks of `chmod`, `chown`, `truncate` and `utimensat`.
    /// A size change says who asks for it with `by` (`None` means [`TruncateBy::Path`]).
    pub fn setattr(
        &self,
        ctx: &Ctx,
        ino: impl Into<InodeRef>,
        set: &SetAttr,
        by: Option<TruncateBy>,
    ) -> Result<Attr> {
        let ino = ino.into();
        let a = {
            let _c = self.begin(Op::Setattr);
            let g = epoch::pin();
            let i = self.iget(ino, &g)?;
            self.set_attributes(ctx, i, set, by, &g)?;
            self.attr_of(i, &g)
        };
        self.report(ctx, |s| s.inode(ino.ino(), set.size.map(|size| (size, 0))));
        Ok(a)
    }

    /// What a size change needs before anything is locked: a regular file, the right to
    /// change its size, a size within limits.
    fn check_size_change(&self, ctx: &Ctx, i: &Inode, size: u64, by: TruncateBy) -> Result<()> {
        match &i.body {
            Body::File(_) => {}
            Body::Dir(_) => return Err(Errno::EISDIR),
            _ => return Err(Errno::EINVAL),
        }
        match by {
            TruncateBy::OpenFile => {}
            TruncateBy::Handle(fh) => {
                if !self.handles.get(fh, &self.stats)?.writable() {
                    return Err(Errno::EINVAL);
                }
            }
            TruncateBy::Path => self.permission(ctx, i, &i.attr.load(), MAY_WRITE)?,
        }
        if size > MAX_FILE_SIZE {
            return Err(Errno::EFBIG);
        }
        Ok(())
    }

    /// The body of `setattr` on inode `i` (also `open(O_TRUNC)`).
    fn set_attributes(
        &self,
        ctx: &Ctx,
        i: &Inode,
        set: &SetAttr,
        by: Option<TruncateBy>,
        g: &Guard,
    ) -> Result<()> {
        self.writable()?;
        let _held = self.hold(i, g)?;
        if let Some(size) = set.size {
            self.check_size_change(ctx, i, size, by.unwrap_or(TruncateBy::Path))?;
        }
        for t in [set.atime, set.mtime] {
            if let Some(TimeSet::At(ts)) = t {
                if !ts.is_valid() {
                    return Err(Errno::EINVAL);
                }
            }
        }
        let now = Timespec::now();
        let owner_change = set.uid.is_some() || set.gid.is_some();
        let size_change = set.size.is_some();
        let mut data = match &i.body {
            Body::File(data) => Some(self.stats.write(LockClass::FileData, data)),
            _ => None,
        };
        if let (Some(d), Some(size)) = (data.as_mut(), set.size) {
            let fetch = |f, b: &mut [u8]| self.fetch_pages(i, f, b);
            d.prepare_truncate(size, i.attr.size(), &fetch, &self.page_epochs)?;
        }
        if size_change || owner_change && !i.is_dir() {
            self.remove_privs(ctx, i, now, size_change)?;
        }
        // Under the data lock, which every size change holds: the size cannot move.
        let old_size = i.attr.size();
        let kept = match (&data, set.size) {
            (Some(d), Some(s)) => d.pages_after_truncate(s, old_size),
            _ => 0,
        };
        let had_pages = data.as_ref().is_some_and(|d| d.pages() > 0);
        // A chmod rewrites the access ACL (as `posix_acl_chmod`), and a `UTIME_NOW` by a
        // non-owner may be allowed by it: then the xattr shard is held across the change, so
        // the ACL is the one the change sees. An ACL that appears after the flag was read
        // here is seen inside the seqlock, and the change starts again with the shard held.
        let acl_matters = set.mode.is_some()
            || !ctx.has(perm::caps::DAC_OVERRIDE)
                && (matches!(set.atime, Some(TimeSet::Now))
                    || matches!(set.mtime, Some(TimeSet::Now)));
        loop {
            let mut shard = (acl_matters && i.attr.access_view().flags & flags::ACL != 0)
                .then(|| self.xattrs.lock(i.ino, &self.stats));
            let mut raced = false;
            i.attr.update(&self.stats, |v| {
                let acl = match &shard {
                    _ if !acl_matters || v.flags & flags::ACL == 0 => None,
                    None => {
                        raced = true;
                        return Ok(());
                    }
                    Some(x) => {
                        let bytes = x.get(&i.ino).and_then(|x| x.get(ACL_ACCESS_NAME));
                        let bytes = bytes.expect("the ACL flag and the table agree");
                        Some(Acl::parse(bytes).expect("stored ACLs are valid"))
                    }
                };
                let mut c = attr_change(ctx, v, acl.as_ref(), set, by, had_pages, now)?;
                if let (Some(mut acl), Some(shard), Some(_)) = (acl, shard.as_mut(), set.mode) {
                    let mode = c.mode.expect("a chmod sets the mode");
                    acl.chmod(mode);
                    let a = OwnedAcl {
                        default: false,
                        acl: acl.to_xattr(),
                        mode,
                        time: c.ctime.unwrap_or(now),
                    };
                    self.commit_acl(i, shard, v, &a)?;
                    c.mode = None;
                    if c == (AttrChange {
                        ctime: c.ctime,
                        ..AttrChange::default()
                    }) {
                        return Ok(());
                    }
                }
                self.commit(&Record::SetAttr {
                    inode: i.id(),
                    change: c,
                })?;
                Self::apply_attr(v, &c, kept);
                Ok(())
            })?;
            if !raced {
                break;
            }
        }
        if let (Some(d), Some(size)) = (data.as_mut(), set.size) {
            // Outside the attribute seqlock (readers must not spin while pages are freed),
            // still under the data lock, so no reader sees bytes beyond the new size.
            let label = self.page_epochs.label();
            let freed = d.truncate(size, old_size, label, &self.page_epochs);
            self.space.give(freed);
        }
        if set.mode.is_some() || owner_change || set.chown {
            // A directory's permission may have changed: wait for the entry changes that
            // may have checked the old one (`revoke.rs`), holding no lock (a directory has no
            // data lock; `_held` is a reference).
            drop(data);
            self.revoked(i);
        }
        Ok(())
    }

    /// Allocates (mode 0 or `FALLOC_FL_KEEP_SIZE`) or punches out
    /// (`FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`) a byte range.
    pub fn fallocate(&self, ctx: &Ctx, fh: Fh, mode: i32, offset: u64, len: u64) -> Result<()> {
        self.fallocate_at(ctx, FileRef::Handle(fh), mode, offset, len)
    }

    /// `fallocate` of an open file that the caller tracks itself and has checked is open for
    /// writing (see [`Filesystem::read_inode`]).
    pub fn fallocate_inode(
        &self,
        ctx: &Ctx,
        ino: Ino,
        mode: i32,
        offset: u64,
        len: u64,
    ) -> Result<()> {
        self.fallocate_at(ctx, FileRef::Inode(ino, libc::O_WRONLY), mode, offset, len)
    }

    fn fallocate_at(&self, ctx: &Ctx, f: FileRef, mode: i32, offset: u64, len: u64) -> Result<()> {
        let ino = self.fallocate_inner(ctx, f, mode, offset, len)?;
        self.report(ctx, |s| s.inode(ino, Some((offset, len))));
        Ok(())
    }

    fn fallocate_inner(
        &self,
        ctx: &Ctx,
        f: FileRef,
        mode: i32,
        offset: u64,
        len: u64,
    ) -> Result<Ino> {
        let _c = self.begin(Op::Fallocate);
        if len == 0 || offset > i64::MAX as u64 || len > i64::MAX as u64 {
            return Err(Errno::EINVAL);
        }
        let punch = match mode {
            0 | FALLOC_FL_KEEP_SIZE => false,
            m if m == FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE => true,
            _ => return Err(Errno::EOPNOTSUPP),
        };
        let g = epoch::pin();
        let (h, i) = self.file_inode(f, &g)?;
        if h.is_some_and(|h| !h.writable()) {
            return Err(Errno::EBADF);
        }
        let data = match &i.body {
            Body::File(d) => d,
            Body::Dir(_) => return Err(Errno::EISDIR),
            _ => return Err(Errno::ENODEV),
        };
        offset
            .checked_add(len)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or(Errno::EFBIG)?;
        // `vfs_fallocate`: only a plain allocation on an append-only file, nothing on an
        // immutable one.
        let fl = i.attr.flags();
        if punch && fl & flags::APPEND != 0 || fl & flags::IMMUTABLE != 0 {
            return Err(Errno::EPERM);
        }
        self.writable()?;
        let _held = self.hold(i, &g)?;
        let mut d = self.stats.write(LockClass::FileData, data);
        if punch {
            let fetch = |f, b: &mut [u8]| self.fetch_pages(i, f, b);
            d.prepare_edges(offset, len, &fetch, &self.page_epochs)?;
        }
        let time = Timespec::now();
        let (rec, reserved) = if punch {
            let rec = Record::Punch {
                inode: i.id(),
                offset,
                len,
                time,
            };
            (rec, 0)
        } else {
            let need = d.missing_pages(offset, len);
            self.space.take(need)?;
            let rec = Record::Allocate {
                inode: i.id(),
                offset,
                len,
                keep_size: mode & FALLOC_FL_KEEP_SIZE != 0,
                time,
            };
            (rec, need)
        };
        if let Err(e) = self
            .remove_privs(ctx, i, time, true)
            .and_then(|()| self.commit(&rec))
        {
            self.space.give(reserved);
            return Err(e);
        }
        self.apply_fallocate(i, &mut d, &rec);
        drop(d);
        drop(_held);
        self.after_data_op(true);
        Ok(i.ino)
    }

    /// A data record ([`Record::Write`], [`Record::Allocate`], [`Record::Punch`]) as
    /// recovery applies it.
    pub(super) fn replay_data(&self, rec: &Record<'_>, i: &Inode) -> Result<()> {
        let Body::File(data) = &i.body else {
            return Err(Errno::EINVAL);
        };
        let mut d = self.stats.write(LockClass::FileData, data);
        let fetch = |f, b: &mut [u8]| self.fetch_pages(i, f, b);
        let e = &self.page_epochs;
        let need = match *rec {
            Record::Write { offset, data, .. } => {
                d.prepare_edges(offset, data.len() as u64, &fetch, e)?;
                d.missing_pages(offset, data.len() as u64)
            }
            Record::Allocate { offset, len, .. } => d.missing_pages(offset, len),
            Record::Punch { offset, len, .. } => {
                d.prepare_edges(offset, len, &fetch, e)?;
                0
            }
            _ => 0,
        };
        self.space.take(need)?;
        self.commit(rec)?;
        match rec {
            Record::Write { .. } => self.apply_write(i, &mut d, rec),
            _ => self.apply_fallocate(i, &mut d, rec),
        }
        Ok(())
    }

    /// `close` of one file descriptor of the handle (nothing to write back in memory).
    pub fn flush(&self, fh: Fh) -> Result<()> {
        let _c = self.begin(Op::Flush);
        self.handles.get(fh, &self.stats).map(|_| ())
    }

    /// `lseek` with `SEEK_DATA` or `SEEK_HOLE` on regular file `ino`: the next offset at or
    /// after `offset` in data (allocated pages) or in a hole (the end of the file counts as
    /// one), as tmpfs answers it; ENXIO at or past the end, or when no data follows.
    pub fn seek_data_hole(&self, ino: Ino, offset: u64, whence: i32) -> Result<u64> {
        let _c = self.begin(Op::Lseek);
        let g = epoch::pin();
        let i = self.iget(ino, &g)?;
        let data = match &i.body {
            Body::File(d) => d,
            Body::Dir(_) => return Err(Errno::EISDIR),
            _ => return Err(Errno::EINVAL),
        };
        let d = self.stats.read(LockClass::FileData, data);
        let size = i.attr.size();
        if offset >= size {
            return Err(Errno::ENXIO);
        }
        match whence {
            libc::SEEK_DATA => d
                .next_data(offset)
                .filter(|&o| o < size)
                .ok_or(Errno::ENXIO),
            libc::SEEK_HOLE => Ok(d.next_hole(offset).min(size)),
            _ => Err(Errno::EINVAL),
        }
    }

    /// Makes every change made so far durable (the store's records up to now): `fsync` of
    /// a file makes its name durable too, because everything before it is. `datasync` makes
    /// no difference: the store keeps one ordered history.
    pub fn fsync(&self, fh: Fh, datasync: bool) -> Result<()> {
        let _c = self.begin(Op::Fsync);
        let _ = datasync;
        self.handles.get(fh, &self.stats)?;
        drop(_c);
        self.store.sync()
    }

    /// `fsync` of an open file that the caller tracks itself (see
    /// [`Filesystem::read_inode`]).
    pub fn fsync_inode(&self, ino: Ino, datasync: bool) -> Result<()> {
        let _c = self.begin(Op::Fsync);
        let _ = datasync;
        self.iget(ino, &epoch::pin())?;
        drop(_c);
        self.store.sync()
    }

    /// [`Filesystem::fsync_inode`] without waiting for the store: `done` gets the result
    /// ([`Store::sync_then`](crate::Store::sync_then)), at once if the inode is unknown.
    pub fn fsync_inode_then(&self, ino: Ino, datasync: bool, done: crate::record::SyncDone) {
        let _c = self.begin(Op::Fsync);
        let _ = datasync;
        if let Err(e) = self.iget(ino, &epoch::pin()) {
            drop(_c);
            return done(Err(e));
        }
        drop(_c);
        self.store.sync_then(done)
    }

    /// `syncfs`: makes every change made so far durable.
    pub fn sync_all(&self) -> Result<()> {
        self.store.sync()
    }

    fn release_inner(&self, fh: Fh, g: &Guard) -> Result<()> {
        let h = self.handles.remove(fh, &self.stats)?;
        let i = self
            .resident(h.inode.ino(), g)
            .filter(|i| i.key() == h.inode)
            .expect("an open handle keeps its inode");
        self.put_refs(i, 1, g);
        self.let_go(i);
        Ok(())
    }

    /// Closes a file handle; an unlinked file is freed with its last handle.
    pub fn release(&self, fh: Fh) -> Result<()> {
        let _c = self.begin(Op::Release);
        self.release_inner(fh, &epoch::pin())
    }

    /// Closes a directory handle.
    pub fn releasedir(&self, fh: Fh) -> Result<()> {
        let _c = self.begin(Op::Releasedir);
        self.release_inner(fh, &epoch::pin())
    }
}

/// What `setattr` changes, computed from the current values `v` inside the attribute
/// seqlock (so the checks see the owner and mode the change applies to): the checks of
/// `chmod`, `chown`, `utimensat` and `truncate`, then the change. `had_pages`: the file has
/// pages (a same-size truncate then stamps the times, as tmpfs's truncate of pages does).
fn attr_change(
    ctx: &Ctx,
    v: &AttrVals,
    acl: Option<&Acl>,
    set: &SetAttr,
    by: Option<TruncateBy>,
    had_pages: bool,
    now: Timespec,
) -> Result<AttrChange> {
    let owner = perm::owner_or_root(ctx, v);
    // Times: both to now is a "touch" (`ATTR_TOUCH`: write permission will do); an mtime of
    // now beside a size change is the truncate's own stamp (an `open(O_TRUNC)`); anything
    // else sets times (`ATTR_TIMES_SET`: the owner only).
    let now_both = set.atime == Some(TimeSet::Now) && set.mtime == Some(TimeSet::Now);
    let stamp = set.size.is_some() && set.atime.is_none() && set.mtime == Some(TimeSet::Now);
    let explicit = (set.atime.is_some() || set.mtime.is_some()) && !now_both && !stamp;
    // `may_setattr`: no new mode, owner or explicit times for an immutable or append-only
    // inode, not even to "now" for an immutable one.
    let frozen = v.flags & flags::FROZEN != 0;
    if frozen && (set.mode.is_some() || set.uid.is_some() || set.gid.is_some() || explicit)
        || now_both && v.flags & flags::IMMUTABLE != 0
    {
        return Err(Errno::EPERM);
    }
    if let Some(uid) = set.uid {
        if !(ctx.has(perm::caps::CHOWN) || ctx.uid == v.uid && uid == v.uid) {
            return Err(Errno::EPERM);
        }
    }
    if let Some(gid) = set.gid {
        if !(ctx.has(perm::caps::CHOWN) || ctx.uid == v.uid && (gid == v.gid || ctx.in_group(gid)))
        {
            return Err(Errno::EPERM);
        }
    }
    if (set.mode.is_some() || explicit) && !owner {
        return Err(Errno::EPERM);
    }
    if now_both && !owner {
        super::permission_with(ctx, v, acl, MAY_WRITE)?;
    }
    // A size change: never of an append-only file; of an immutable one, only through a
    // file the engine saw opened for writing before the flag was set (as Linux lets an
    // `ftruncate` through such a file; a path's write permission check refused it already).
    if set.size.is_some()
        && (v.flags & flags::APPEND != 0
            || v.flags & flags::IMMUTABLE != 0 && !matches!(by, Some(TruncateBy::Handle(_))))
    {
        return Err(Errno::EPERM);
    }
    let is_reg = v.mode & libc::S_IFMT == libc::S_IFREG;
    let mut mode = v.mode;
    if let Some(m) = set.mode {
        let mut m = m & 0o7777;
        if !perm::in_group_or_fsetid(ctx, set.gid.unwrap_or(v.gid)) {
            m &= !libc::S_ISGID;
        }
        mode = (v.mode & libc::S_IFMT) | m;
    }
    if (set.uid.is_some() || set.gid.is_some() || set.chown)
        && v.mode & libc::S_IFMT != libc::S_IFDIR
    {
        mode &= !libc::S_ISUID;
        let sgid = mode & libc::S_ISGID != 0;
        let gx = mode & libc::S_IXGRP != 0;
        if sgid && (gx || !perm::in_group_or_fsetid(ctx, v.gid)) {
            mode &= !libc::S_ISGID;
        }
        // Linux turns the bits a chown takes into a mode change, which only the owner may
        // make: a `chown(path, -1, -1)` of someone else's file with such bits is EPERM.
        // Through FUSE the kernel sends the same request (a SETATTR of nothing) to take the
        // bits away before a write by someone who may not keep them, which must not fail:
        // from the kernel, a caller who may write the file may take them (its write would).
        if mode != v.mode
            && !owner
            && (ctx.via != crate::Via::Kernel
                || super::permission_with(ctx, v, acl, MAY_WRITE).is_err())
        {
            return Err(Errno::EPERM);
        }
    }
    let time = |t: Option<TimeSet>| match t {
        Some(TimeSet::Now) => Some(now),
        Some(TimeSet::At(ts)) => Some(ts),
        None => None,
    };
    let mut c = AttrChange {
        mode: (mode != v.mode || set.mode.is_some()).then_some(mode),
        uid: set.uid,
        gid: set.gid,
        size: set.size,
        atime: time(set.atime),
        mtime: time(set.mtime),
        ctime: Some(set.ctime.unwrap_or(now)),
    };
    if let Some(size) = set.size {
        debug_assert!(is_reg);
        let only_size = *set
            == SetAttr {
                size: Some(size),
                ..SetAttr::default()
            };
        // As tmpfs: an ftruncate stamps mtime and ctime always, a truncate by path when the
        // size changes or the file has pages to trim; a same-size truncate by path of an
        // empty file changes nothing.
        let ftruncate = matches!(by, Some(TruncateBy::Handle(_) | TruncateBy::OpenFile));
        let stamps = v.size != size || had_pages || ftruncate;
        if stamps {
            c.mtime = Some(c.mtime.unwrap_or(now));
        } else if only_size {
            c.ctime = None;
        }
    }
    Ok(c)
}
