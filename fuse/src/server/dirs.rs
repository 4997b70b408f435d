//! Directories: OPENDIR, READDIR(PLUS), RELEASEDIR, FSYNCDIR, and keeping the kernel's
//! cached listings right (where a handle-free read ends, and the listings a change drops;
//! docs/DESIGN.md §7, "Directory listings").

use std::sync::atomic::Ordering::{Acquire, Release};
use std::time::Instant;

use lanefs::{Attr, DirEnd, Errno, FileType, Ino};
use zerocopy::FromZeros;

use super::listings::{EndShard, READ_END_SHARDS, ReadEnds};
use super::reply::{Handled, OK, done, dtype, node, put};
use super::{Call, Server};
use crate::abi::*;
use crate::notify::KernelCache;
use crate::wire::{Answer, Out, Pending};

impl Server {
    /// With `FUSE_NO_OPENDIR_SUPPORT` (Linux 5.1 on): ENOSYS, once, and the kernel opens
    /// directories by itself from then on, with no OPENDIR or RELEASEDIR, and keeps their
    /// listings (`FOPEN_CACHE_DIR | FOPEN_KEEP_CACHE` is its default for such opens); READDIR
    /// then comes with handle 0. An older kernel gets an engine handle and those two flags.
    pub(super) fn opendir(&self, req: &Call, out: &mut Out) -> Handled {
        if self.no_opendir {
            return Err(Errno::ENOSYS);
        }
        let a: fuse_open_in = req.arg()?;
        let fh = self
            .fs
            .opendir_flags(&req.ctx(), node(req.h.nodeid), a.flags as i32)?;
        // The kernel keeps the listing it reads in the directory's page cache, and keeps it
        // across opens (docs/DESIGN.md §7, "Directory listings").
        put(
            out,
            &fuse_open_out {
                fh,
                open_flags: FOPEN_CACHE_DIR | FOPEN_KEEP_CACHE,
                padding: 0,
            },
        )
    }

    /// READDIR and READDIRPLUS: entries as `fuse_dirent` (`fuse_direntplus` with attributes),
    /// each padded to 8 bytes, as many as fit in the size asked for.
    pub(super) fn readdir(&self, req: &Call, out: &mut Out, plus: bool) -> Handled {
        let a: fuse_read_in = req.arg()?;
        let size = a.size as usize;
        self.read_dir(req, req.h.nodeid, a.fh, a.offset, plus, |e, attr| {
            let d = fuse_dirent {
                ino: e.ino.get(),
                off: e.offset,
                namelen: e.name.len() as u32,
                typ: dtype(e.kind),
                name: [],
            };
            let head =
                if plus { size_of::<fuse_entry_out>() } else { 0 } + size_of::<fuse_dirent>();
            let len = head + e.name.len();
            let padded = len.next_multiple_of(8);
            if out.len() + padded > size {
                return false;
            }
            let start = out.len();
            let ok = match (plus, attr) {
                (true, Some(attr)) => out.push_obj(&self.entry_out(attr)),
                // Node id 0: the kernel takes the name only, no inode or attributes (and no
                // lookup reference); the engine withholds a directory's attributes, and a
                // file's that has had several names, so ([`lanefs::Filesystem::readdir`]).
                (true, None) => out.push_obj(&fuse_entry_out::new_zeroed()),
                (false, _) => true,
            } && out.push_obj(&d)
                && out.push(e.name)
                && out.push(&[0u8; 8][..padded - len]);
            if !ok {
                // Never expected (the size fits the buffer): end the read before this entry.
                out.truncate(start);
            }
            ok
        })?;
        OK
    }

    pub(super) fn releasedir(&self, req: &Call) -> Handled {
        let a: fuse_release_in = req.arg()?;
        done(self.fs.releasedir(a.fh))
    }

    /// FSYNCDIR: by inode and answered later, as FSYNC, for a directory the kernel opened by
    /// itself (no-opendir mode); through the handle OPENDIR made otherwise.
    pub(super) fn fsyncdir(&self, req: &Call, later: &dyn Fn() -> Pending) -> Handled {
        if self.volatile_store {
            // As FSYNC: the kernel sends no FSYNCDIR again.
            return Err(Errno::ENOSYS);
        }
        let a: fuse_fsync_in = req.arg()?;
        let datasync = a.fsync_flags & FUSE_FSYNC_FDATASYNC != 0;
        if a.fh == 0 {
            // A directory the kernel opened by itself (no-opendir mode); answered as
            // FSYNC.
            let p = later();
            self.fs
                .fsync_inode_then(node(req.h.nodeid), datasync, Box::new(move |r| p.answer(r)));
            return Ok(Answer::Later);
        }
        done(self.fs.fsync(a.fh, datasync))
    }

    pub(super) fn end_shard(&self, ino: u64) -> &EndShard {
        &self.read_ends[ino as usize % READ_END_SHARDS]
    }

    /// After a request changed the names of directory `dir` (made, removed, linked or
    /// renamed one), before its reply: drops the kernel's cached listing of `dir` if a read
    /// from offset 0 reached lanefs since it was last dropped. The kernel's own check of a
    /// cached listing (its `i_version`, at a read from offset 0) misses one case: a listing
    /// read in several `getdents` calls is filled into the cache across them, and a change
    /// between two calls leaves a cache that, once complete, holds names from before the
    /// change; a later read from offset 0 starts over, but a read that got its first page
    /// from lanefs and continues at a later offset is served the rest from that cache, so it
    /// can show a name removed before it began. Dropped here, the cache's pages are gone,
    /// and the kernel starts the cache over at the next read. Safe from a request thread: the
    /// kernel holds `dir`'s `i_rwsem` exclusively for the change, so no `getdents` of it is
    /// in flight, and an inode invalidation takes no inode lock.
    pub(super) fn names_changed(&self, dir: u64) {
        if let Some(kc) = self.notifier.get() {
            let _ = drop_if_listed(&self.read_ends, kc, dir);
        }
    }

    /// Where a handle-free read of `ino` at `offset` ends: a read from offset 0 takes the
    /// directory's end now and records it (under the shard's lock, so the recorded end is
    /// always the latest taken); a read from a later offset continues to the recorded one.
    /// The kernel reads a directory from offset 0 whenever it has no valid cached listing,
    /// so the recorded end is never older than the latest change of the directory the
    /// kernel knew of when the read began; a read that started earlier may end later than
    /// where it started (names created meanwhile may be returned, as POSIX allows), but a
    /// name renamed away and back while one read runs is not returned twice, so every read
    /// ends.
    pub(super) fn dir_end(&self, ino: u64, offset: u64) -> lanefs::Result<DirEnd> {
        let shard = self.end_shard(ino);
        let mut ends = shard.lock();
        match ends.get(&ino) {
            Some((end, _)) if offset != 0 => Ok(end.clone()),
            _ => {
                let end = self.fs.read_end(node(ino))?;
                let at = Some(Instant::now());
                if !matches!(ends.insert(ino, (end.clone(), at)), Some((_, Some(_)))) {
                    shard.listed.fetch_add(1, Release);
                }
                Ok(end)
            }
        }
    }

    /// READDIR and READDIRPLUS: by inode without a handle (`fh` 0, no-opendir mode), or
    /// through the engine handle OPENDIR made.
    pub(super) fn read_dir(
        &self,
        req: &Call,
        ino: u64,
        fh: u64,
        offset: u64,
        plus: bool,
        f: impl FnMut(lanefs::DirEntry<'_>, Option<&Attr>) -> bool,
    ) -> lanefs::Result<()> {
        // Counted before the directory is read: a library caller's new name then drops the
        // listing this read may leave in the kernel's cache (`kernel_names.rs`).
        self.names.reading(ino);
        if fh == 0 {
            let end = self.dir_end(ino, offset)?;
            self.fs
                .readdir_inode(&req.ctx(), node(ino), offset, &end, plus, f)
        } else {
            if offset == 0 {
                // The handle keeps where its read ends; this records that the kernel may be
                // filling its cache of the listing (`names_changed`).
                self.dir_end(ino, 0)?;
            }
            self.fs.readdir(&req.ctx(), fh, offset, plus, f)
        }
    }

    /// After a RENAME between two directories: drops the cached listing of each directory it
    /// moved (now `newname` in `newparent`, and with `RENAME_EXCHANGE` also `name` in
    /// `parent`), whose `..` changed, a change the kernel does not see as one of that
    /// directory. Sent before the reply, while the kernel holds the moved directories'
    /// `i_rwsem` (`vfs_rename` locks a directory it moves to another parent), so no `getdents`
    /// of them is in flight to put the old `..` back. An inode invalidation takes no inode
    /// lock, so it is safe from a request thread.
    pub(super) fn moved_dirs(
        &self,
        req: &Call,
        newparent: u64,
        newname: &[u8],
        parent: u64,
        name: &[u8],
        flags: u32,
    ) {
        let Some(kc) = self.notifier.get() else {
            return;
        };
        // A library caller's lookup: it takes no lookup reference for the kernel.
        let mut c = req.ctx();
        c.via = lanefs::Via::Library;
        let mut at = vec![(newparent, newname)];
        if flags & lanefs::RENAME_EXCHANGE != 0 {
            at.push((parent, name));
        }
        for (dir, n) in at {
            if let Ok(a) = self.fs.lookup(&c, node(dir), n)
                && a.kind() == FileType::Directory
            {
                kc.drop_listing(a.ino);
            }
        }
    }
}

/// Drops the kernel's cached listing of `dir` if a read from offset 0 reached lanefs since it
/// was last dropped ([`Server::names_changed`]); false if there was none to drop.
pub(super) fn drop_if_listed(read_ends: &ReadEnds, kc: &KernelCache, dir: u64) -> bool {
    let shard = &read_ends[dir as usize % READ_END_SHARDS];
    if shard.listed.load(Acquire) == 0 {
        return false;
    }
    if !EndShard::unlist(&mut shard.lock(), &shard.listed, dir) {
        return false;
    }
    kc.drop_listing(Ino(dir));
    true
}
