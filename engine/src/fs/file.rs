//! File operations: open, create, read, write, setattr (chmod, chown, truncate, utimes),
//! fallocate, flush, fsync, release.

use crossbeam_epoch::{self as epoch, Guard};

use super::namespace::NewNode;
use super::{Filesystem, MAX_FILE_SIZE};
use crate::attr::{Attr, AttrVals, Ino, SetAttr, TimeSet};
use crate::data::{FileData, PAGE};
use crate::errno::{Errno, Result};
use crate::handle::{Fh, Handle};
use crate::inode::{Body, Fate, Inode};
use crate::perm::{self, Ctx, MAY_READ, MAY_WRITE};
use crate::stats::{LockClass, Op};
use crate::time::Timespec;

/// `fallocate` mode: do not change the file size.
pub const FALLOC_FL_KEEP_SIZE: i32 = libc::FALLOC_FL_KEEP_SIZE;
/// `fallocate` mode: deallocate the range (with `FALLOC_FL_KEEP_SIZE`).
pub const FALLOC_FL_PUNCH_HOLE: i32 = libc::FALLOC_FL_PUNCH_HOLE;

/// Clears set-user-id, and set-group-id when group-executable, as a write or truncate by a
/// caller without `CAP_FSETID` does (`file_remove_privs`).
fn kill_privs(ctx: &Ctx, v: &mut AttrVals) {
    if ctx.is_root() || v.mode & libc::S_IFMT != libc::S_IFREG {
        return;
    }
    v.mode &= !libc::S_ISUID;
    if v.mode & (libc::S_ISGID | libc::S_IXGRP) == libc::S_ISGID | libc::S_IXGRP {
        v.mode &= !libc::S_ISGID;
    }
}

/// How a data operation names its file.
#[derive(Clone, Copy)]
enum FileRef {
    /// An open handle from `open` or `create`: its access mode and `O_APPEND` apply.
    Handle(Fh),
    /// The inode, for a caller that keeps open files itself and has checked the access.
    Inode(Ino),
}

/// The `ftruncate` handle of an open file that the caller tracks itself and has checked is
/// open for writing (the FUSE server in no-open mode, whose kernel sends `ftruncate` with
/// handle 0). No handle the engine gives out is 0.
pub const FILE_TRACKED_BY_CALLER: Fh = 0;

impl Filesystem {
    /// Opens inode `i` (after a lookup) with `open(2)` flags, taking a handle reference.
    fn open_inode(&self, ctx: &Ctx, i: &Inode, flags: i32) -> Result<Fh> {
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
        perm::check(ctx, &i.attr.load(), mask)?;
        if wants_write {
            self.writable()?;
        }
        i.get_ref()?;
        if flags & libc::O_TRUNC != 0 {
            if let Body::File(data) = &i.body {
                self.resize(ctx, i, data, 0, true);
            }
        }
        let h = Handle {
            ino_gen: i.ino_gen,
            flags,
            is_dir: i.is_dir(),
        };
        Ok(self.handles.insert(h, &self.stats))
    }

    /// Sets the size of a regular file: frees pages beyond it, updates size, blocks, and (if
    /// the size changed, or `always_times`) mtime and ctime; kills set-id bits for non-root.
    fn resize(
        &self,
        ctx: &Ctx,
        i: &Inode,
        data: &parking_lot::RwLock<FileData>,
        size: u64,
        always_times: bool,
    ) {
        let mut d = self.stats.write(LockClass::FileData, data);
        let kept = d.pages_below(size);
        let _ = i.attr.update::<(), ()>(&self.stats, |v| {
            if v.size != size || always_times {
                let now = Timespec::now();
                v.mtime = now;
                v.ctime = now;
            }
            v.size = size;
            v.blocks = kept * (PAGE / 512);
            kill_privs(ctx, v);
            Ok(())
        });
        // Outside the attribute seqlock (readers must not spin while pages are freed), still
        // under the data lock, so no reader sees bytes beyond the new size.
        let freed = d.truncate(size);
        debug_assert_eq!(d.pages(), kept);
        self.space.give(freed);
    }

    /// Opens inode `ino`; `flags` are `open(2)` flags (`O_RDONLY`, `O_WRONLY`, `O_RDWR`,
    /// `O_APPEND`, `O_TRUNC`, `O_DIRECTORY`...).
    pub fn open(&self, ctx: &Ctx, ino: Ino, flags: i32) -> Result<Fh> {
        let fh = {
            let _c = self.begin(Op::Open);
            let g = epoch::pin();
            self.open_inode(ctx, self.inode(ino, &g)?, flags)?
        };
        if flags & libc::O_TRUNC != 0 {
            self.report(ctx, |s| s.inode(ino, Some((0, 0))));
        }
        Ok(fh)
    }

    /// Creates and opens a regular file (`open` with `O_CREAT`): with `O_EXCL` an existing name
    /// fails with EEXIST, without it the existing file is opened.
    pub fn create(
        &self,
        ctx: &Ctx,
        parent: Ino,
        name: &[u8],
        mode: u32,
        flags: i32,
    ) -> Result<(Attr, Fh)> {
        let (a, fh) = self.create_inner(ctx, parent, name, mode, flags)?;
        self.report(ctx, |s| {
            s.entry(parent, name);
            if flags & libc::O_TRUNC != 0 {
                s.inode(a.ino, Some((0, 0)));
            }
        });
        Ok((a, fh))
    }

    fn create_inner(
        &self,
        ctx: &Ctx,
        parent: Ino,
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
                        ino_gen: i.ino_gen,
                        flags,
                        is_dir: false,
                    };
                    let fh = self.handles.insert(h, &self.stats);
                    return Ok((self.attr_of(i), fh));
                }
                Err(Errno::EEXIST) if flags & libc::O_EXCL == 0 => {
                    let (dir, d) = self.dir_inode(parent, &g)?;
                    let child = match self.child(dir, d, name, &g) {
                        Err(Errno::ENOENT) => continue, // removed since: create again
                        r => r?,
                    };
                    if child.is_dir() {
                        return Err(Errno::EISDIR);
                    }
                    let fh = match self.open_inode(ctx, child, flags) {
                        Err(Errno::ENOENT) => continue,
                        r => r?,
                    };
                    if let Err(e) = self.pin_for(ctx, child) {
                        self.release_inner(fh, &g)?;
                        return Err(e);
                    }
                    return Ok((self.attr_of(child), fh));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The inode behind a handle (the handle's reference keeps it alive).
    /// The inode of `f`, with its handle when it names one.
    fn file_inode<'g>(&self, f: FileRef, g: &'g Guard) -> Result<(Option<Handle>, &'g Inode)> {
        match f {
            FileRef::Handle(fh) => self.handle_inode(fh, g).map(|(h, i)| (Some(h), i)),
            FileRef::Inode(ino) => self.inode(ino, g).map(|i| (None, i)),
        }
    }

    fn handle_inode<'g>(&self, fh: Fh, g: &'g Guard) -> Result<(Handle, &'g Inode)> {
        let h = self.handles.get(fh, &self.stats)?;
        let i = self
            .table
            .get_gen(h.ino_gen, g)
            .expect("an open handle keeps its inode");
        Ok((h, i))
    }

    /// Access time under `relatime`: updated when older than mtime or ctime, or a day old.
    pub(super) fn touch_atime(&self, i: &Inode) {
        let v = i.attr.load();
        let now = Timespec::now();
        let stale = v.atime <= v.mtime || v.atime <= v.ctime || now.sec - v.atime.sec >= 86_400;
        if stale && v.atime != now {
            let _ = i.attr.update::<(), ()>(&self.stats, |v| {
                v.atime = Timespec::now();
                Ok(())
            });
        }
    }

    /// Reads up to `buf.len()` bytes at `offset`; returns the count (0 at end of file).
    pub fn read(&self, fh: Fh, offset: u64, buf: &mut [u8]) -> Result<usize> {
        self.read_from(FileRef::Handle(fh), offset, buf)
    }

    /// `read` of an open file that the caller tracks itself and has checked is open for
    /// reading: the FUSE server in FUSE's no-open mode, where the kernel keeps open files and
    /// sends reads by inode.
    pub fn read_inode(&self, ino: Ino, offset: u64, buf: &mut [u8]) -> Result<usize> {
        self.read_from(FileRef::Inode(ino), offset, buf)
    }

    fn read_from(&self, f: FileRef, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let _c = self.begin(Op::Read);
        let g = epoch::pin();
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
                d.read(offset, &mut buf[..n]);
                n
            }
        };
        self.touch_atime(i);
        Ok(n)
    }

    /// Writes `data` at `offset` (at the end with `O_APPEND`); returns the count, which is
    /// short only when the filesystem fills up (ENOSPC if nothing fits).
    pub fn write(&self, ctx: &Ctx, fh: Fh, offset: u64, data: &[u8]) -> Result<usize> {
        self.write_to(ctx, FileRef::Handle(fh), offset, data)
    }

    /// `write` of an open file that the caller tracks itself and has checked is open for
    /// writing (see [`Filesystem::read_inode`]); `offset` is final (the caller applies
    /// `O_APPEND`).
    pub fn write_inode(&self, ctx: &Ctx, ino: Ino, offset: u64, data: &[u8]) -> Result<usize> {
        self.write_to(ctx, FileRef::Inode(ino), offset, data)
    }

    fn write_to(&self, ctx: &Ctx, f: FileRef, offset: u64, data: &[u8]) -> Result<usize> {
        let (ino, at, n) = self.write_inner(ctx, f, offset, data)?;
        if n > 0 {
            self.report(ctx, |s| s.inode(ino, Some((at, n as u64))));
        }
        Ok(n)
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
        if data.is_empty() {
            return Ok((i.ino(), offset, 0));
        }
        let mut d = self.stats.write(LockClass::FileData, fdata);
        let size = i.attr.size();
        let off = if h.is_some_and(|h| h.flags & libc::O_APPEND != 0) {
            size
        } else {
            offset
        };
        if off
            .checked_add(data.len() as u64)
            .is_none_or(|end| end > MAX_FILE_SIZE)
        {
            return Err(Errno::EFBIG);
        }
        let written = if self
            .space
            .take(d.missing_pages(off, data.len() as u64))
            .is_ok()
        {
            d.write(off, data);
            data.len()
        } else {
            // Not all of it fits: write page by page while space lasts.
            let mut done = 0usize;
            while done < data.len() {
                let at = off + done as u64;
                let chunk = ((PAGE - at % PAGE) as usize).min(data.len() - done);
                if self.space.take(d.missing_pages(at, chunk as u64)).is_err() {
                    break;
                }
                d.write(at, &data[done..done + chunk]);
                done += chunk;
            }
            if done == 0 {
                return Err(Errno::ENOSPC);
            }
            done
        };
        let pages = d.pages();
        let _ = i.attr.update::<(), ()>(&self.stats, |v| {
            v.size = v.size.max(off + written as u64);
            v.blocks = pages * (PAGE / 512);
            let now = Timespec::now();
            v.mtime = now;
            v.ctime = now;
            kill_privs(ctx, v);
            Ok(())
        });
        Ok((i.ino(), off, written))
    }

    /// Changes attributes, with the checks of `chmod`, `chown`, `truncate` and `utimensat`.
    /// `fh` is the handle of an `ftruncate` (which needs no write permission on the file), or
    /// [`FILE_TRACKED_BY_CALLER`].
    pub fn setattr(&self, ctx: &Ctx, ino: Ino, set: &SetAttr, fh: Option<Fh>) -> Result<Attr> {
        let a = self.setattr_inner(ctx, ino, set, fh)?;
        self.report(ctx, |s| s.inode(ino, set.size.map(|size| (size, 0))));
        Ok(a)
    }

    fn setattr_inner(&self, ctx: &Ctx, ino: Ino, set: &SetAttr, fh: Option<Fh>) -> Result<Attr> {
        let _c = self.begin(Op::Setattr);
        let g = epoch::pin();
        let i = self.inode(ino, &g)?;
        self.writable()?;
        ctx.resolve_groups();
        if let Some(size) = set.size {
            match &i.body {
                Body::File(_) => {}
                Body::Dir(_) => return Err(Errno::EISDIR),
                _ => return Err(Errno::EINVAL),
            }
            match fh {
                // An open file its caller tracks and has checked is writable (see
                // `FILE_TRACKED_BY_CALLER`).
                Some(FILE_TRACKED_BY_CALLER) => {}
                Some(fh) => {
                    if !self.handles.get(fh, &self.stats)?.writable() {
                        return Err(Errno::EINVAL);
                    }
                }
                None => perm::check(ctx, &i.attr.load(), MAY_WRITE)?,
            }
            if size > MAX_FILE_SIZE {
                return Err(Errno::EFBIG);
            }
        }
        let explicit =
            matches!(set.atime, Some(TimeSet::At(_))) || matches!(set.mtime, Some(TimeSet::At(_)));
        let touch =
            matches!(set.atime, Some(TimeSet::Now)) || matches!(set.mtime, Some(TimeSet::Now));
        for t in [set.atime, set.mtime] {
            if let Some(TimeSet::At(ts)) = t {
                if !ts.is_valid() {
                    return Err(Errno::EINVAL);
                }
            }
        }
        // The permission checks run inside the seqlock's critical section, so they see the
        // same owner and mode the change applies to.
        let check = |v: &AttrVals| -> Result<()> {
            let owner = perm::owner_or_root(ctx, v);
            if let Some(uid) = set.uid {
                if !(ctx.is_root() || ctx.uid == v.uid && uid == v.uid) {
                    return Err(Errno::EPERM);
                }
            }
            if let Some(gid) = set.gid {
                if !(ctx.is_root() || ctx.uid == v.uid && (gid == v.gid || ctx.in_group(gid))) {
                    return Err(Errno::EPERM);
                }
            }
            if set.mode.is_some() && !owner {
                return Err(Errno::EPERM);
            }
            if explicit && !owner {
                return Err(Errno::EPERM);
            }
            if touch && !explicit && !owner {
                perm::check(ctx, v, MAY_WRITE)?;
            }
            Ok(())
        };
        let apply = |v: &mut AttrVals, now: Timespec| {
            let is_dir = v.mode & libc::S_IFMT == libc::S_IFDIR;
            if let Some(mode) = set.mode {
                let mut m = mode & 0o7777;
                if !ctx.is_root() && !ctx.in_group(set.gid.unwrap_or(v.gid)) {
                    m &= !libc::S_ISGID;
                }
                v.mode = (v.mode & libc::S_IFMT) | m;
            }
            if set.uid.is_some() || set.gid.is_some() {
                if !is_dir {
                    v.mode &= !libc::S_ISUID;
                    let sgid = v.mode & libc::S_ISGID != 0;
                    let gx = v.mode & libc::S_IXGRP != 0;
                    if sgid && (gx || !ctx.is_root() && !ctx.in_group(v.gid)) {
                        v.mode &= !libc::S_ISGID;
                    }
                }
                v.uid = set.uid.unwrap_or(v.uid);
                v.gid = set.gid.unwrap_or(v.gid);
            }
            for (t, field) in [(set.atime, &mut v.atime), (set.mtime, &mut v.mtime)] {
                match t {
                    Some(TimeSet::Now) => *field = now,
                    Some(TimeSet::At(ts)) => *field = ts,
                    None => {}
                }
            }
            v.ctime = set.ctime.unwrap_or(now);
        };
        let size_only = set.mode.is_none()
            && set.uid.is_none()
            && set.gid.is_none()
            && set.atime.is_none()
            && set.mtime.is_none()
            && set.ctime.is_none();
        match (set.size, &i.body) {
            (Some(size), Body::File(data)) => {
                let mut d = self.stats.write(LockClass::FileData, data);
                let kept = d.pages_below(size);
                let had_pages = d.pages() > 0;
                i.attr.update(&self.stats, |v| {
                    check(v)?;
                    // As tmpfs: an ftruncate stamps mtime and ctime always, a truncate by
                    // path when the size changes or the file has pages to trim (tmpfs's
                    // truncate of allocated pages stamps them too).
                    let now = Timespec::now();
                    if v.size != size || fh.is_some() || had_pages {
                        v.mtime = now;
                        apply(v, now);
                    } else if !size_only {
                        apply(v, now);
                    }
                    v.size = size;
                    v.blocks = kept * (PAGE / 512);
                    kill_privs(ctx, v);
                    Ok(())
                })?;
                self.space.give(d.truncate(size));
            }
            _ => i.attr.update(&self.stats, |v| {
                check(v)?;
                apply(v, Timespec::now());
                Ok(())
            })?,
        }
        Ok(self.attr_of(i))
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
        self.fallocate_at(ctx, FileRef::Inode(ino), mode, offset, len)
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
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or(Errno::EFBIG)?;
        self.writable()?;
        let mut d = self.stats.write(LockClass::FileData, data);
        if punch {
            self.space.give(d.punch(offset, len));
        } else {
            self.space.take(d.missing_pages(offset, len))?;
            d.allocate(offset, len);
        }
        let pages = d.pages();
        let _ = i.attr.update::<(), ()>(&self.stats, |v| {
            if !punch && mode & FALLOC_FL_KEEP_SIZE == 0 {
                v.size = v.size.max(end);
            }
            v.blocks = pages * (PAGE / 512);
            let now = Timespec::now();
            v.mtime = now;
            v.ctime = now;
            kill_privs(ctx, v);
            Ok(())
        });
        Ok(i.ino())
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
        let i = self.inode(ino, &g)?;
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

    /// Makes the file's data (and, unless `datasync`, its metadata) durable. The memory store
    /// has nothing to write; the call validates the handle.
    pub fn fsync(&self, fh: Fh, datasync: bool) -> Result<()> {
        let _c = self.begin(Op::Fsync);
        let _ = datasync;
        self.handles.get(fh, &self.stats).map(|_| ())
    }

    /// `fsync` of an open file that the caller tracks itself (see
    /// [`Filesystem::read_inode`]).
    pub fn fsync_inode(&self, ino: Ino, datasync: bool) -> Result<()> {
        let _c = self.begin(Op::Fsync);
        let _ = datasync;
        self.inode(ino, &epoch::pin()).map(|_| ())
    }

    fn release_inner(&self, fh: Fh, g: &Guard) -> Result<()> {
        let h = self.handles.remove(fh, &self.stats)?;
        let i = self
            .table
            .get_gen(h.ino_gen, g)
            .expect("an open handle keeps its inode");
        if i.put_refs(1) == Fate::Free {
            self.free_inode(i, g);
        }
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
