//! Directory handles and reading.

use crossbeam_epoch as epoch;

use super::Filesystem;
use crate::attr::{Attr, FileType, Ino};
use crate::dir::Name;
use crate::errno::{Errno, Result};
use crate::handle::{Fh, Handle};
use crate::inode::{DIR_DEAD, ino_of};
use crate::perm::{self, Ctx, MAY_READ};
use crate::stats::Op;

/// One directory entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirEntry<'a> {
    /// Inode number.
    pub ino: Ino,
    /// The entry's cookie: pass it as `offset` to continue after this entry. Stable for the
    /// entry's lifetime, never reused.
    pub offset: u64,
    /// Type.
    pub kind: FileType,
    /// Name.
    pub name: &'a [u8],
}

const BATCH: usize = 64;

impl Filesystem {
    /// Opens directory `ino` for reading (read permission required).
    pub fn opendir(&self, ctx: &Ctx, ino: Ino) -> Result<Fh> {
        let _c = self.begin(Op::Opendir);
        let g = epoch::pin();
        let i = self.inode(ino, &g)?;
        if !i.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        perm::check(ctx, &i.attr.load(), MAY_READ)?;
        i.get_ref()?;
        let h = Handle {
            ino_gen: i.ino_gen,
            flags: libc::O_RDONLY | libc::O_DIRECTORY,
            is_dir: true,
        };
        Ok(self.handles.insert(h, &self.stats))
    }

    /// Reads entries after `offset` (0 to start) and passes each to `f`, with its attributes
    /// when `plus` is set (readdirplus); `f` returns false to stop, and the entry it refused is
    /// not consumed. `.` and `..` come first (offsets 1 and 2). Entries that exist for the whole
    /// read are returned exactly once, whatever is created or removed meanwhile. With
    /// `ctx.count_lookups`, every accepted entry of readdirplus except `.` and `..` takes a
    /// lookup reference.
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
            .table
            .get_gen(h.ino_gen, &g)
            .expect("an open handle keeps its inode");
        let d = i.dir().expect("directory handle");
        if d.life.load(std::sync::atomic::Ordering::Acquire) == DIR_DEAD {
            return Err(Errno::ENOENT);
        }
        let ino = i.ino();
        let mut off = offset;
        if off < 1 {
            let a = plus.then(|| self.attr_of(i));
            if !f(
                DirEntry {
                    ino,
                    offset: 1,
                    kind: FileType::Directory,
                    name: b".",
                },
                a.as_ref(),
            ) {
                return Ok(());
            }
            off = 1;
        }
        if off < 2 {
            let parent = self
                .table
                .get_gen(d.parent.load(std::sync::atomic::Ordering::Acquire), &g);
            let pino = parent.map_or(
                ino_of(d.parent.load(std::sync::atomic::Ordering::Acquire)),
                |p| p.ino(),
            );
            let a = if plus {
                parent.map(|p| self.attr_of(p))
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
                return Ok(());
            }
            off = 2;
        }
        let mut batch: Vec<(u64, Name)> = Vec::with_capacity(BATCH);
        loop {
            batch.clear();
            self.dirents
                .read_batch(ino, d, off, BATCH, &self.stats, &mut batch);
            if batch.is_empty() {
                break;
            }
            for (cookie, name) in &batch {
                off = *cookie;
                // The index gives order and names; the map says whether the entry is (still)
                // published and what it names now.
                let Some(de) = self.dirents.get(ino, name, &self.stats) else {
                    continue;
                };
                if de.cookie != *cookie {
                    continue; // re-created under a new cookie: reported at that cookie
                }
                let Some(child) = self.table.get_gen(de.ino_gen, &g) else {
                    continue;
                };
                let attr = plus.then(|| self.attr_of(child));
                let pinned = plus && ctx.count_lookups;
                if pinned && child.get_ref().is_err() {
                    continue; // freed since
                }
                let e = DirEntry {
                    ino: child.ino(),
                    offset: *cookie,
                    kind: child.kind(),
                    name: &name[..],
                };
                if !f(e, attr.as_ref()) {
                    if pinned && child.put_refs(1) == crate::inode::Fate::Free {
                        self.free_inode(child, &g);
                    }
                    return Ok(());
                }
            }
        }
        self.touch_atime(i);
        Ok(())
    }
}
