//! Directory handles and reading.
//!
//! A read that starts at offset 0 (on a new handle, or after a rewind) fixes where it ends
//! (`dir/mod.rs`, "The end of a directory read") and keeps that end point in the handle, so
//! names created while it runs (a name renamed away and back included) are left for the next
//! read, and every read ends.

use crossbeam_epoch::{self as epoch, Guard};

use super::{Filesystem, InodeRef};
use crate::attr::{Attr, FileType};
use crate::dir::DirBody;
use crate::dir::{Name, ReadEnd};
use crate::errno::{Errno, Result};
use crate::handle::{Fh, Handle};
use crate::id::Ino;
use crate::inode::Inode;
use crate::perm::{Ctx, MAY_READ};
use crate::stats::Op;

/// One directory entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirEntry<'a> {
    /// Inode number.
    pub ino: Ino,
    /// The entry's cookie: pass it as `offset` to continue after this entry. Stable for the
    /// entry's lifetime and never reused, except by the whiteout a `RENAME_WHITEOUT` leaves
    /// under the name, which takes over the cookie of the entry it replaces.
    pub offset: u64,
    /// Type.
    pub kind: FileType,
    /// Name.
    pub name: &'a [u8],
}

const BATCH: usize = 64;

/// Where a directory read ends ([`Filesystem::read_end`]): entries created after it was taken
/// are not returned by a read that uses it.
#[derive(Clone, Debug)]
pub struct DirEnd(ReadEnd);

impl Filesystem {
    /// Opens directory `ino` for reading (read permission required).
    pub fn opendir(&self, ctx: &Ctx, ino: impl Into<InodeRef>) -> Result<Fh> {
        self.opendir_flags(ctx, ino, 0)
    }

    /// [`Filesystem::opendir`] with `open(2)` flags: `O_NOATIME` (owner or root only, EPERM
    /// otherwise) keeps reads through the handle from updating the directory's atime; other
    /// flags are ignored.
    pub fn opendir_flags(&self, ctx: &Ctx, ino: impl Into<InodeRef>, flags: i32) -> Result<Fh> {
        let _c = self.begin(Op::Opendir);
        let g = epoch::pin();
        let (i, d) = self.dir_inode(ino.into(), &g)?;
        let v = i.attr.access_view();
        self.permission(ctx, i, &v, MAY_READ)?;
        if flags & libc::O_NOATIME != 0 && !crate::perm::owner_or_root(ctx, &v) {
            return Err(Errno::EPERM);
        }
        i.get_ref()?;
        let h = Handle {
            inode: i.key(),
            flags: libc::O_RDONLY | libc::O_DIRECTORY | (flags & libc::O_NOATIME),
            is_dir: true,
        };
        let fh = self.handles.insert(h, &self.stats);
        let end = self.dirents.read_end(d, &g);
        self.handles
            .set_read_end(fh, end, &self.stats)
            .expect("handle just made");
        Ok(fh)
    }

    /// Reads entries after `offset` (0 to start) and passes each to `f`, with its attributes
    /// when `plus` is set (readdirplus); `f` returns false to stop, and the entry it refused is
    /// not consumed. `.` and `..` come first (offsets 1 and 2). Entries that exist for the whole
    /// read are returned exactly once, whatever is created or removed meanwhile, and entries
    /// created after the read started (at offset 0) are not returned (module doc). A
    /// `RENAME_WHITEOUT`'s whiteout takes the offset of the entry it replaces, so a read never
    /// returns one name twice. For a
    /// [`crate::Via::Kernel`] caller, every accepted entry of readdirplus except `.` and `..`
    /// takes a lookup reference, and comes with its attributes, except a directory and a
    /// file that has had two names or more at once since it was made or loaded: their
    /// attributes are `None` and they take no reference; the kernel looks them up by itself
    /// when it needs them. (A file's: the kernel lowers its cached link count by itself when
    /// an unlink or a rename over a name returns; attributes read by another request after
    /// lanefs removed the name but applied before that return are counted down twice, and a
    /// count of 0 makes `link(2)` of a live file fail with ENOENT. Any request can race so,
    /// but a readdirplus refreshes every entry of a directory the kernel knows. A
    /// directory's: the kernel does not order a listing's attributes against a change
    /// inside the directory (a mkdir in it), and keeps what a listing read before the change
    /// brought, even with no attribute timeout, until its clock ticks.) Nor do any entries
    /// of it while a bounded inode cache is three quarters full or more (`lazy.rs`): every
    /// inode the kernel holds stays in memory until it forgets it.
    pub fn readdir(
        &self,
        ctx: &Ctx,
        fh: Fh,
        offset: u64,
        plus: bool,
        mut f: impl FnMut(DirEntry<'_>, Option<&Attr>) -> bool,
    ) -> Result<()> {
        let _c = self.begin(Op::Readdir);
        let g = epoch::pin();
        let h = self.handles.get(fh, &self.stats)?;
        if !h.is_dir {
            return Err(Errno::ENOTDIR);
        }
        let i = self
            .resident(h.inode.ino(), &g)
            .filter(|i| i.key() == h.inode)
            .expect("an open handle keeps its inode");
        let d = i.dir().expect("directory handle");
        if d.life.is_dead() {
            return Err(Errno::ENOENT);
        }
        let end = match self.handles.read_end(fh, &self.stats)? {
            Some(end) if offset != 0 => end,
            _ => {
                let end = self.dirents.read_end(d, &g);
                self.handles.set_read_end(fh, end.clone(), &self.stats)?;
                end
            }
        };
        if !self.read_entries(ctx, i, d, offset, &end, plus, &g, &mut f)? {
            return Ok(());
        }
        if h.flags & libc::O_NOATIME == 0 {
            self.touch_atime(i, &g);
        }
        Ok(())
    }

    /// Where a read of directory `ino` that starts now ends, for [`Filesystem::readdir_inode`].
    pub fn read_end(&self, ino: impl Into<InodeRef>) -> Result<DirEnd> {
        let g = epoch::pin();
        let (_, d) = self.dir_inode(ino.into(), &g)?;
        Ok(DirEnd(self.dirents.read_end(d, &g)))
    }

    /// [`Filesystem::readdir`] of directory `ino` without a handle, for a caller that keeps
    /// its own open directories (the FUSE server, whose kernel opens directories by itself):
    /// entries after `offset` up to `end` (from [`Filesystem::read_end`] when the read
    /// started), and no permission check (the caller checked read permission at its open).
    /// The directory's atime is touched as by a handle without `O_NOATIME`.
    pub fn readdir_inode(
        &self,
        ctx: &Ctx,
        ino: impl Into<InodeRef>,
        offset: u64,
        end: &DirEnd,
        plus: bool,
        mut f: impl FnMut(DirEntry<'_>, Option<&Attr>) -> bool,
    ) -> Result<()> {
        let _c = self.begin(Op::Readdir);
        let g = epoch::pin();
        let (i, d) = self.dir_inode(ino.into(), &g)?;
        if d.life.is_dead() {
            return Err(Errno::ENOENT);
        }
        if self.read_entries(ctx, i, d, offset, &end.0, plus, &g, &mut f)? {
            self.touch_atime(i, &g);
        }
        Ok(())
    }

    /// The entries of `i` after `offset` up to `end`, to `f`; true when the directory's end
    /// was reached (`f` never refused an entry).
    #[allow(clippy::too_many_arguments)] // the directory twice, where to start and end, guard
    fn read_entries(
        &self,
        ctx: &Ctx,
        i: &Inode,
        d: &DirBody,
        offset: u64,
        end: &ReadEnd,
        plus: bool,
        g: &Guard,
        f: &mut impl FnMut(DirEntry<'_>, Option<&Attr>) -> bool,
    ) -> Result<bool> {
        let ino = i.ino;
        let mut off = offset;
        if off < 1 {
            let a = plus.then(|| self.attr_of(i, g));
            if !f(
                DirEntry {
                    ino,
                    offset: 1,
                    kind: FileType::Directory,
                    name: b".",
                },
                a.as_ref(),
            ) {
                return Ok(false);
            }
            off = 1;
        }
        if off < 2 {
            let parent = self.iget_racy(d.parent(), g);
            let pino = parent.map_or(d.parent().ino(), |p| p.ino);
            let a = if plus {
                parent.map(|p| self.attr_of(p, g))
            } else {
                None
            };
            if !f(
                DirEntry {
                    ino: pino,
                    offset: 2,
                    kind: FileType::Directory,
                    name: b"..",
                },
                a.as_ref(),
            ) {
                return Ok(false);
            }
            off = 2;
        }
        // A kernel caller's READDIRPLUS takes a lookup reference on each entry it gets
        // attributes for, which keeps the inode in memory until the kernel forgets it; with
        // a bounded inode cache nearly full, it gets names only (`Filesystem::cache_tight`).
        let names_only = !plus || ctx.counts_lookups() && self.cache_tight();
        let mut batch: Vec<(u64, Name)> = Vec::with_capacity(BATCH);
        loop {
            batch.clear();
            self.dirents
                .read_batch(i.key(), d, off, end, BATCH, g, &self.stats, &mut batch);
            if batch.is_empty() {
                break;
            }
            for (cookie, name) in &batch {
                off = *cookie;
                if names_only {
                    // The entry is all a plain read needs: the inode it names and that
                    // inode's type, a pair read under the entry's map shard lock, which no
                    // rename changes halfway (`dir/node.rs`). The inode is not reached, so
                    // a lazily loaded store reads no file to list a directory. Gone, or made
                    // again at another cookie, since the index gave it: not listed.
                    let Some(de) = self.dget(i.key(), name).filter(|de| de.cookie == *cookie)
                    else {
                        continue;
                    };
                    let e = DirEntry {
                        ino: de.target.ino(),
                        offset: *cookie,
                        kind: de.kind,
                        name: &name[..],
                    };
                    if !f(e, None) {
                        return Ok(false);
                    }
                    continue;
                }
                // The index gives order and names; the map says whether the entry is (still)
                // published, with this cookie (a name made again has a new one and is
                // reported at that), and what it names now: a name pointed at another inode
                // while it is read is read again (`named`), so that none present throughout
                // the read is missed. A kernel caller gets no attributes (and takes no
                // reference) for a file that has had several names (method doc).
                // Gone since the index gave it: not listed. A store that cannot read the
                // inode (EIO, `lazy.rs`) ends the read.
                let mut child = match self.named(i.key(), name, Some(*cookie), false, g) {
                    Ok(c) => c,
                    Err(Errno::EIO) => return Err(Errno::EIO),
                    Err(_) => continue,
                };
                let withhold = |c: &Inode| c.was_shared() || c.is_dir();
                let mut withheld = ctx.counts_lookups() && withhold(child);
                let mut pinned = plus && !withheld && ctx.counts_lookups();
                if pinned && self.kernel_ref(child).is_err() {
                    // Freed since it was read: read the name again, with a reference.
                    let c = match self.named(i.key(), name, Some(*cookie), true, g) {
                        Ok(c) => c,
                        Err(Errno::EIO) => return Err(Errno::EIO),
                        Err(_) => continue,
                    };
                    child = c;
                    if withhold(child) {
                        self.kernel_unref(child, 1, g);
                        (withheld, pinned) = (true, false);
                    }
                }
                let attr = (plus && !withheld).then(|| self.attr_of(child, g));
                let e = DirEntry {
                    ino: child.ino,
                    offset: *cookie,
                    kind: child.kind(),
                    name: &name[..],
                };
                if !f(e, attr.as_ref()) {
                    if pinned {
                        self.kernel_unref(child, 1, g);
                    }
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }
}
