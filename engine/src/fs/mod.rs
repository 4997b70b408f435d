//! The filesystem: every operation of DESIGN §4 on inode numbers, with Linux tmpfs semantics
//! and the locking of `locking.rs`.
//!
//! Each public method counts itself in the statistics, takes the `coarse` lock when that
//! locking mode is selected, pins an epoch guard, and calls internal helpers that never take
//! `coarse` again (the lock is not reentrant).

mod check;
mod file;
mod namespace;
mod readdir;
mod xattr_ops;

use std::hash::BuildHasher;
use std::sync::Arc;

use crossbeam_epoch::{self as epoch, Guard};
use crossbeam_utils::CachePadded;
use parking_lot::{Mutex, MutexGuard};

pub use check::CheckReport;
pub use file::{FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FILE_TRACKED_BY_CALLER};
pub use namespace::{RENAME_EXCHANGE, RENAME_NOREPLACE, SYMLINK_MAX};
pub use readdir::DirEntry;

use crate::attr::{Attr, AttrCell, AttrVals, Ino, ROOT_INO};
use crate::dir::{Dirents, NAME_MAX};
use crate::errno::{Errno, Result};
use crate::handle::HandleTable;
use crate::ids::InoAlloc;
use crate::inode::{Body, DirBody, Inode, gen_of};
use crate::notify::{Invalidate, Watch};
use crate::perm::{self, Ctx, MAY_EXEC};
use crate::quota::Quota;
use crate::stats::{LockClass, Op, Stats, StatsSnapshot};
use crate::table::InodeTable;
use crate::time::Timespec;

/// How directory mutations are locked (DESIGN §3). `Lanes` is the product; the other two
/// reproduce the seeds' "before" for the benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Locking {
    /// Per-name stripe locks; lookups take no lock.
    #[default]
    Lanes,
    /// One exclusive lock per directory around every mutation in it (the kernel before
    /// pdirops).
    DirLock,
    /// One global lock around every operation (as in-process VFS libraries do).
    Coarse,
}

impl Locking {
    /// Every mode, product first.
    pub const ALL: [Locking; 3] = [Locking::Lanes, Locking::DirLock, Locking::Coarse];

    /// The mode's name as the CLI spells it.
    pub fn name(self) -> &'static str {
        match self {
            Locking::Lanes => "lanes",
            Locking::DirLock => "dirlock",
            Locking::Coarse => "coarse",
        }
    }
}

impl std::str::FromStr for Locking {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Locking::ALL
            .into_iter()
            .find(|l| l.name() == s)
            .ok_or_else(|| {
                format!("unknown locking mode '{s}' (expected lanes, dirlock or coarse)")
            })
    }
}

/// Settings fixed when a filesystem is created.
#[derive(Clone, Debug)]
pub struct Config {
    /// Locking mode.
    pub locking: Locking,
    /// Size limit in bytes of file data (ENOSPC beyond); `None`: half of physical memory, the
    /// tmpfs default.
    pub max_bytes: Option<u64>,
    /// Inode limit (ENOSPC beyond); `None`: one per 4 KiB page of the size limit (the tmpfs
    /// default), capped by the inode table's capacity.
    pub max_inodes: Option<u64>,
    /// Refuse every change with EROFS.
    pub read_only: bool,
    /// Permission bits of the root directory (tmpfs: 1777).
    pub root_mode: u32,
    /// Owner of the root directory.
    pub root_uid: u32,
    /// Group of the root directory.
    pub root_gid: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            locking: Locking::Lanes,
            max_bytes: None,
            max_inodes: None,
            read_only: false,
            root_mode: 0o1777,
            root_uid: 0,
            root_gid: 0,
        }
    }
}

/// Filesystem statistics, as `statfs(2)` reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatFs {
    /// Total data blocks (of `bsize` bytes).
    pub blocks: u64,
    /// Free blocks.
    pub bfree: u64,
    /// Free blocks available to unprivileged users.
    pub bavail: u64,
    /// Total inodes.
    pub files: u64,
    /// Free inodes.
    pub ffree: u64,
    /// Block size.
    pub bsize: u32,
    /// Longest name.
    pub namelen: u32,
    /// Fragment size.
    pub frsize: u32,
}

/// Number of per-name stripe locks (DESIGN §3: many more than cores). Measured on 2 cores
/// with 32 threads (`bench crunl`): 4096 stripes let a preempted holder make waiters sleep
/// 3.6x as often as 16384 do; each stripe is cache-padded, so this costs 2 MiB per filesystem.
pub(crate) const NSTRIPES: usize = 16384;
const _: () = assert!(NSTRIPES.is_power_of_two() && NSTRIPES >= 1024);

/// Largest file size (as tmpfs on 64-bit: `MAX_LFS_FILESIZE`).
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;

/// Bytes `stat` reports per directory entry, `.` and `..` included (tmpfs `BOGO_DIRENT_SIZE`).
const BOGO_DIRENT_SIZE: u64 = 20;

/// A POSIX filesystem in memory. All methods take `&self` and may be called from any number of
/// threads at once.
pub struct Filesystem {
    cfg: Config,
    table: InodeTable,
    ids: InoAlloc,
    dirents: Dirents,
    stripes: Box<[CachePadded<Mutex<()>>]>,
    stripe_hasher: foldhash::fast::RandomState,
    rename_lock: Mutex<()>,
    coarse: Mutex<()>,
    handles: HandleTable,
    space: Quota,
    inode_quota: Quota,
    stats: Stats,
    watch: Watch,
}

fn physical_memory() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages > 0 && size > 0 {
        pages as u64 * size as u64
    } else {
        1 << 32
    }
}

/// Checks a name for an operation that creates, removes or renames it.
pub(crate) fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() {
        return Err(Errno::ENOENT);
    }
    if name.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    if name.iter().any(|&b| b == b'/' || b == 0) {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

pub(crate) fn is_dot_or_dotdot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

impl Filesystem {
    /// A new, empty filesystem.
    pub fn new(cfg: Config) -> Self {
        let max_bytes = cfg.max_bytes.unwrap_or(physical_memory() / 2);
        let pages = max_bytes.div_ceil(crate::data::PAGE);
        // tmpfs's default: one inode per page of the size limit (half of RAM).
        let max_inodes = cfg
            .max_inodes
            .unwrap_or((max_bytes / 4096).max(1024))
            .min(crate::table::MAX_INO - 1);
        let fs = Filesystem {
            table: InodeTable::new(),
            ids: InoAlloc::new(),
            dirents: Dirents::new(),
            stripes: (0..NSTRIPES)
                .map(|_| CachePadded::new(Mutex::new(())))
                .collect(),
            stripe_hasher: Default::default(),
            rename_lock: Mutex::new(()),
            coarse: Mutex::new(()),
            handles: HandleTable::new(),
            space: Quota::new(pages, 256),
            inode_quota: Quota::new(max_inodes, 64),
            stats: Stats::default(),
            watch: Watch::default(),
            cfg,
        };
        fs.inode_quota.take(1).expect("room for the root");
        let now = Timespec::now();
        let root = Inode::new(
            fs.ids.root(),
            2,
            0,
            AttrCell::new(AttrVals {
                mode: libc::S_IFDIR | (fs.cfg.root_mode & 0o7777),
                uid: fs.cfg.root_uid,
                gid: fs.cfg.root_gid,
                size: 0,
                blocks: 0,
                atime: now,
                mtime: now,
                ctime: now,
            }),
            Body::Dir(DirBody::new(ROOT_INO)),
        );
        fs.table.install(root, &epoch::pin());
        fs
    }

    /// The settings this filesystem was created with.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The root directory's inode number.
    pub fn root(&self) -> Ino {
        ROOT_INO
    }

    /// Operation counts and lock statistics so far.
    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    /// Installs (or, with `None`, removes) the sink told about every change made by a caller
    /// whose context does not count lookups: the FUSE server installs one so that the kernel's
    /// caches follow changes made through the library while the filesystem is mounted. See
    /// [`crate::notify`].
    pub fn set_invalidator(&self, sink: Option<Arc<dyn Invalidate>>) {
        self.watch.set(sink);
    }

    /// Reports a change to the installed sink, if `ctx` is not the kernel's. Called only after
    /// the operation has released its locks.
    #[inline]
    fn report(&self, ctx: &Ctx, f: impl FnOnce(&dyn Invalidate)) {
        if let Some(s) = self.watch.sink(ctx) {
            f(&*s);
        }
    }

    /// Reports the removal of `name` from `parent`, which named `ino`.
    fn report_removal(&self, ctx: &Ctx, parent: Ino, name: &[u8], ino: Ino) {
        self.report(ctx, |s| {
            s.entry(parent, name);
            s.inode(ino, None);
        });
    }

    /// Open file and directory handles.
    pub fn open_handles(&self) -> usize {
        self.handles.open_count()
    }

    // ----- helpers shared by the operation files -------------------------------------------

    #[inline]
    fn begin(&self, op: Op) -> Option<MutexGuard<'_, ()>> {
        self.stats.op(op);
        match self.cfg.locking {
            Locking::Coarse => Some(self.stats.lock(LockClass::Coarse, &self.coarse)),
            _ => None,
        }
    }

    /// The per-directory lock of the `dirlock` mode (`None` in other modes).
    #[inline]
    fn dirlock<'a>(&self, dir: &'a Inode) -> Option<MutexGuard<'a, ()>> {
        match (self.cfg.locking, &dir.body) {
            (Locking::DirLock, Body::Dir(d)) => Some(self.stats.lock(LockClass::DirLock, &d.lock)),
            _ => None,
        }
    }

    #[inline]
    fn stripe_of(&self, parent: Ino, name: &[u8]) -> usize {
        (self.stripe_hasher.hash_one((parent, name)) as usize) & (NSTRIPES - 1)
    }

    #[inline]
    fn lock_stripe(&self, idx: usize) -> MutexGuard<'_, ()> {
        self.stats.lock(LockClass::Stripe, &self.stripes[idx])
    }

    #[inline]
    fn writable(&self) -> Result<()> {
        if self.cfg.read_only {
            Err(Errno::EROFS)
        } else {
            Ok(())
        }
    }

    /// A live inode by number.
    #[inline]
    fn inode<'g>(&self, ino: Ino, g: &'g Guard) -> Result<&'g Inode> {
        match self.table.get(ino, g) {
            Some(i) if !i.is_dead() => Ok(i),
            _ => Err(Errno::ENOENT),
        }
    }

    /// A live directory by number (ENOTDIR for another type).
    #[inline]
    fn dir_inode<'g>(&self, ino: Ino, g: &'g Guard) -> Result<(&'g Inode, &'g DirBody)> {
        let i = self.inode(ino, g)?;
        match i.dir() {
            Some(d) => Ok((i, d)),
            None => Err(Errno::ENOTDIR),
        }
    }

    /// The inode a directory entry names. Without locks: re-reads the entry if the inode it
    /// named was freed and its number reused meanwhile, and after a few such races reads it
    /// under the name's stripe, where entry and inode are stable.
    fn child<'g>(
        &self,
        dir: &'g Inode,
        d: &DirBody,
        name: &[u8],
        g: &'g Guard,
    ) -> Result<&'g Inode> {
        if name == b"." {
            return Ok(dir);
        }
        if name == b".." {
            return self
                .table
                .get_gen(d.parent.load(std::sync::atomic::Ordering::Acquire), g)
                .ok_or(Errno::ENOENT);
        }
        for _ in 0..8 {
            let de = self
                .dirents
                .get(dir.ino(), name, &self.stats)
                .ok_or(Errno::ENOENT)?;
            if let Some(i) = self.table.get_gen(de.ino_gen, g) {
                return Ok(i);
            }
        }
        let _s = self.lock_stripe(self.stripe_of(dir.ino(), name));
        let de = self
            .dirents
            .get(dir.ino(), name, &self.stats)
            .ok_or(Errno::ENOENT)?;
        Ok(self
            .table
            .get_gen(de.ino_gen, g)
            .expect("entry and inode are stable under the stripe"))
    }

    /// The attributes `stat` reports.
    fn attr_of(&self, i: &Inode) -> Attr {
        let v = i.attr.load();
        let (size, rdev) = match &i.body {
            Body::Dir(d) => (
                (2 + self.dirents.count(i.ino(), d, &self.stats)) * BOGO_DIRENT_SIZE,
                0,
            ),
            Body::Special { rdev } => (v.size, *rdev),
            _ => (v.size, 0),
        };
        Attr {
            ino: i.ino(),
            generation: gen_of(i.ino_gen),
            mode: v.mode,
            nlink: i.nlink(),
            uid: v.uid,
            gid: v.gid,
            rdev,
            size,
            blocks: v.blocks,
            blksize: crate::data::PAGE as u32,
            atime: v.atime,
            mtime: v.mtime,
            ctime: v.ctime,
        }
    }

    /// Frees an inode whose `DEAD` transition the caller won.
    fn free_inode(&self, i: &Inode, g: &Guard) {
        debug_assert!(i.is_dead());
        if let Body::File(data) = &i.body {
            self.space
                .give(self.stats.read(LockClass::FileData, data).pages());
        }
        self.inode_quota.give(1);
        self.table.remove(i, g);
        self.ids.free(i.ino_gen, &self.stats);
    }

    /// Takes a lookup reference for `ctx` if it counts lookups (FUSE).
    #[inline]
    fn pin_for(&self, ctx: &Ctx, i: &Inode) -> Result<()> {
        if ctx.count_lookups {
            i.get_ref()
        } else {
            Ok(())
        }
    }

    // ----- lookups and attributes ------------------------------------------------------------

    /// Finds `name` in directory `parent` (search permission on `parent` required). `.` and
    /// `..` are understood.
    pub fn lookup(&self, ctx: &Ctx, parent: Ino, name: &[u8]) -> Result<Attr> {
        let _c = self.begin(Op::Lookup);
        let g = epoch::pin();
        let (dir, d) = self.dir_inode(parent, &g)?;
        perm::check(ctx, &dir.attr.load(), MAY_EXEC)?;
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        if name.is_empty() {
            return Err(Errno::ENOENT);
        }
        if name.contains(&b'/') || name.contains(&0) {
            return Err(Errno::EINVAL);
        }
        let child = self.child(dir, d, name, &g)?;
        self.pin_for(ctx, child)?;
        Ok(self.attr_of(child))
    }

    /// Drops `n` lookup references taken with `Ctx::count_lookups` (FUSE `FORGET`).
    pub fn forget(&self, ino: Ino, n: u64) {
        let _c = self.begin(Op::Forget);
        let g = epoch::pin();
        if let Some(i) = self.table.get(ino, &g) {
            if i.put_refs(n) == crate::inode::Fate::Free {
                self.free_inode(i, &g);
            }
        }
    }

    /// The attributes of `ino`.
    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        let _c = self.begin(Op::Getattr);
        let g = epoch::pin();
        Ok(self.attr_of(self.inode(ino, &g)?))
    }

    /// `access(2)`: `mask` is a combination of `R_OK`, `W_OK`, `X_OK`, or `F_OK` (0).
    pub fn access(&self, ctx: &Ctx, ino: Ino, mask: u32) -> Result<()> {
        let _c = self.begin(Op::Access);
        let g = epoch::pin();
        let i = self.inode(ino, &g)?;
        if mask & perm::MAY_WRITE != 0 && self.cfg.read_only {
            return Err(Errno::EROFS);
        }
        if mask == 0 {
            Ok(())
        } else {
            perm::check(ctx, &i.attr.load(), mask & 7)
        }
    }

    /// Space and inode usage.
    pub fn statfs(&self) -> StatFs {
        let _c = self.begin(Op::Statfs);
        let blocks = self.space.limit();
        let bfree = blocks.saturating_sub(self.space.used());
        let files = self.inode_quota.limit();
        StatFs {
            blocks,
            bfree,
            bavail: bfree,
            files,
            ffree: files.saturating_sub(self.inode_quota.used()),
            bsize: crate::data::PAGE as u32,
            namelen: NAME_MAX as u32,
            frsize: crate::data::PAGE as u32,
        }
    }
}

impl std::fmt::Debug for Filesystem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Filesystem")
            .field("locking", &self.cfg.locking)
            .finish_non_exhaustive()
    }
}
