//! The filesystem: every operation on inode numbers, with Linux tmpfs semantics and the
//! locking of `locking.rs`.
//!
//! Each public method counts itself in the statistics, takes the `coarse` lock when that
//! locking mode is selected, pins an epoch guard, and calls internal helpers that never take
//! `coarse` again (the lock is not reentrant). A mutation checks what it may do (policy),
//! describes the change as a [`Record`], and makes it through the apply function of that
//! record kind (`apply.rs`), which hands the record to the store at the right moment; recovery
//! replays records through the same functions (`recovery.rs`).
//!
//! Every inode found by number goes through [`Filesystem::iget`], every inode an entry names
//! through [`Filesystem::iget_named`], and every entry through [`Filesystem::dget`]: a miss
//! means what those three functions say, in one place.

mod apply;
mod cache;
mod check;
mod file;
mod inode_flags;
mod lazy;
pub use lazy::{ENTRY_BYTES, EvictionHold, INODE_BYTES};
mod namespace;
mod readdir;
mod recovery;
mod unlinked;
mod xattr_ops;

use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crossbeam_epoch::{self as epoch, Guard};
use crossbeam_utils::CachePadded;
use parking_lot::{Mutex, MutexGuard};

pub use check::CheckReport;
pub use file::{FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, TruncateBy};
pub use namespace::{RENAME_EXCHANGE, RENAME_NOREPLACE, RENAME_WHITEOUT, SYMLINK_MAX};
pub use readdir::{DirEnd, DirEntry};
pub use recovery::{Recovery, ReplayError};

use crate::acl::{ACL_ACCESS_NAME, Acl};
use crate::attr::{Attr, AttrVals, flags};
use crate::data::PageEpochs;
use crate::dir::DirBody;
use crate::dir::{Dirent, Dirents, NAME_MAX};
use crate::errno::{Errno, Result};
use crate::handle::HandleTable;
use crate::id::{Ino, InoAlloc, InoGen, InodeId};
use crate::inode::{Body, Inode};
use crate::notify::{Invalidate, Watch};
use crate::perm::{self, Ctx, MAY_EXEC};
use crate::quota::Quota;
use crate::record::{MemoryStore, Record, Store};
use crate::revoke::{Counted, Revocations};
use crate::stats::{LockClass, Op, Stats, StatsSnapshot};
use crate::table::InodeTable;
use crate::xattr::XattrTable;

/// How directory mutations are locked. `Lanes` is the product; the other two reproduce the
/// "before" of the kernel patch series lanefs comes from, for the benchmarks.
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

/// When reads move an access time: the `atime` mount options.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Atime {
    /// `relatime`, Linux's default: when the access time is not after the modification or
    /// change time, or is a day old.
    #[default]
    Relative,
    /// `strictatime`: on every read.
    Strict,
    /// `noatime`: never.
    Never,
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

/// How an operation names an existing inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InodeRef {
    /// By number: whichever inode holds it now. FUSE names inodes so (the kernel's lookup
    /// reference keeps a number from being reused while it uses it); [`Ino`] converts to it.
    Num(Ino),
    /// By number and generation: that inode only, ENOENT once it is gone even if its number
    /// names another inode now. The path API names the directories it resolved so;
    /// [`InodeId`] converts to it.
    Exact(InodeId),
}

impl InodeRef {
    /// The inode number.
    pub fn ino(self) -> Ino {
        match self {
            InodeRef::Num(i) => i,
            InodeRef::Exact(id) => id.ino,
        }
    }
}

impl From<Ino> for InodeRef {
    fn from(i: Ino) -> Self {
        InodeRef::Num(i)
    }
}

impl From<InodeId> for InodeRef {
    fn from(id: InodeId) -> Self {
        InodeRef::Exact(id)
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
    /// Apply the `fs.protected_hardlinks` rule to library callers: only the owner may link a
    /// file they could not read and write, or a set-id or special file. Defaults to the
    /// running kernel's setting (`/proc/sys/fs/protected_hardlinks`; on if unreadable).
    /// Through a mount the kernel applies its own setting and lanefs does not check again.
    pub protected_hardlinks: bool,
    /// Apply the `fs.protected_symlinks` rule to library callers: a symlink in a sticky,
    /// world-writable directory is followed only by its owner, or when the directory's owner
    /// owns it too (EACCES otherwise, root included). Defaults to the running kernel's
    /// setting (`/proc/sys/fs/protected_symlinks`; on if unreadable). Through a mount the
    /// kernel applies its own setting and follows symlinks itself.
    pub protected_symlinks: bool,
    /// File data kept in memory beyond what changed since the store's last checkpoint, with
    /// a store that holds pages (`fs/cache.rs`); `None`: a sixteenth of physical memory, at
    /// least 64 MiB. Ignored by the memory store, where every page lives in memory.
    pub cache_bytes: Option<u64>,
    /// Inodes and directory entries kept in memory by a lazily opened store, in bytes (each
    /// inode counted as [`INODE_BYTES`](crate::INODE_BYTES), each entry read from the store
    /// as [`ENTRY_BYTES`](crate::ENTRY_BYTES)): past it, inodes that only names hold and
    /// whose changes the store's checkpoint keeps are evicted, directories with their
    /// entries, read again when next needed (`fs/lazy.rs`, "Eviction"); `None`: an eighth
    /// of physical memory, at least 64 MiB. A bound under 64 inodes' worth is taken as 64
    /// ([`Filesystem::inode_budget`] says the bound in force), and the entries of
    /// directories something holds (a handle, the kernel) stay beyond it
    /// ([`Filesystem::held_entries`]).
    /// Ignored by the memory store and by a store opened whole, which keep every inode.
    pub inode_cache: Option<u64>,
    /// When reads of files and directories move their access time (an inode's
    /// `FS_NOATIME_FL` and an `O_NOATIME` open keep it whatever this says).
    pub atime: Atime,
    /// `nodiratime`: listing a directory leaves its access time alone.
    pub no_dir_atime: bool,
}

/// The running kernel's `fs.protected_hardlinks`, on if it cannot be read.
fn kernel_protects_hardlinks() -> bool {
    kernel_protects("/proc/sys/fs/protected_hardlinks")
}

/// A `fs.protected_*` setting of the running kernel, on if it cannot be read.
fn kernel_protects(path: &str) -> bool {
    std::fs::read_to_string(path)
        .map(|s| s.trim() != "0")
        .unwrap_or(true)
}

impl Config {
    /// [`Config::inode_cache`], its default filled in.
    pub fn inode_cache_bytes(&self) -> u64 {
        self.inode_cache
            .unwrap_or((physical_memory() / 8).max(64 << 20))
    }

    /// [`Config::cache_bytes`] in pages, its default filled in.
    pub fn cache_pages(&self) -> u64 {
        self.cache_bytes
            .unwrap_or((physical_memory() / 16).max(64 << 20))
            .div_ceil(crate::data::PAGE)
    }
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
            protected_hardlinks: kernel_protects_hardlinks(),
            protected_symlinks: kernel_protects("/proc/sys/fs/protected_symlinks"),
            cache_bytes: None,
            inode_cache: None,
            atime: Atime::Relative,
            no_dir_atime: false,
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

/// Number of per-name stripe locks (many more than cores). Measured on 2 cores
/// with 32 threads (`bench crunl`): 4096 stripes let a preempted holder make waiters sleep
/// 3.6x as often as 16384 do; each stripe is cache-padded, so this costs 2 MiB per filesystem.
pub(crate) const NSTRIPES: usize = 16384;
const _: () = assert!(NSTRIPES.is_power_of_two() && NSTRIPES >= 1024);

/// Largest file size (as tmpfs on 64-bit: `MAX_LFS_FILESIZE`).
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;

/// Bytes `stat` reports per directory entry, `.` and `..` included (tmpfs `BOGO_DIRENT_SIZE`).
const BOGO_DIRENT_SIZE: u64 = 20;

/// A POSIX filesystem. All methods take `&self` and may be called from any number of
/// threads at once.
pub struct Filesystem {
    cfg: Config,
    table: InodeTable,
    ids: InoAlloc,
    dirents: Dirents,
    xattrs: XattrTable,
    /// Its side of the revocation grace period (`revoke.rs`): entry changes in flight, on
    /// their threads' lanes, are waited for by a change of a directory's permission.
    revocations: Revocations,
    stripes: Box<[CachePadded<Mutex<()>>]>,
    stripe_hasher: foldhash::fast::RandomState,
    rename_lock: Mutex<()>,
    coarse: Mutex<()>,
    handles: HandleTable,
    space: Quota,
    inode_quota: Quota,
    stats: Stats,
    watch: Watch,
    store: Arc<dyn Store>,
    /// `store.durable()`, read once: a store that keeps nothing is not called per change.
    durable: bool,
    /// Which pages the store holds (`data.rs`; the store's own with a store that keeps
    /// pages, else one no checkpoint advances).
    page_epochs: Arc<PageEpochs>,
    /// Pages of file data the eviction pass keeps in memory (`Config::cache_bytes`).
    cache_pages: u64,
    /// The eviction pass's clock hand: the inode number it goes on from (`fs/cache.rs`).
    evictor: Mutex<Ino>,
    /// Set while recovery replays records (single-threaded, before any caller): records are
    /// then applied, not appended, and inode numbers are not recycled (`recovery.rs`).
    replaying: AtomicBool,
    /// Lookup references a FORGET dropped beyond those held ([`Filesystem::forget`]).
    over_forgets: std::sync::atomic::AtomicU64,
    /// Unlinked files only the kernel's lookups hold, whose contents may go before their
    /// FORGET (`unlinked.rs`).
    unlinked: unlinked::Unlinked,
    /// The miss path of a filesystem whose store loads inodes as they are needed
    /// (`lazy.rs`); `None`: every inode is in the table.
    lazy: Option<lazy::Lazy>,
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
    /// A new, empty filesystem in memory (the memory store: nothing outlives the process).
    pub fn new(cfg: Config) -> Self {
        Filesystem::recover(cfg, Arc::new(MemoryStore))
            .finish()
            .expect("an empty memory filesystem")
    }

    /// The bare structure (a root directory, nothing else) for `recovery.rs` to fill.
    fn empty(cfg: Config, store: Arc<dyn Store>) -> Self {
        let max_bytes = cfg.max_bytes.unwrap_or(physical_memory() / 2);
        let pages = max_bytes.div_ceil(crate::data::PAGE);
        // tmpfs's default: one inode per page of the size limit (half of RAM).
        let max_inodes = cfg
            .max_inodes
            .unwrap_or((max_bytes / 4096).max(1024))
            .min(crate::id::MAX_INO - 1);
        Filesystem {
            table: InodeTable::new(),
            ids: InoAlloc::new(),
            dirents: Dirents::new(),
            xattrs: XattrTable::new(),
            revocations: Revocations::new(),
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
            durable: store.durable(),
            page_epochs: store.page_epochs().unwrap_or_default(),
            cache_pages: cfg.cache_pages(),
            evictor: Mutex::new(Ino::ROOT),
            store,
            replaying: AtomicBool::new(true),
            over_forgets: std::sync::atomic::AtomicU64::new(0),
            unlinked: Default::default(),
            lazy: None,
            cfg,
        }
    }

    /// The settings this filesystem was created with.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The root directory's inode number.
    pub fn root(&self) -> Ino {
        Ino::ROOT
    }

    /// Operation counts and lock statistics so far.
    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    /// Installs (or, with `None`, removes) the sink told about every change made by a library
    /// caller ([`crate::Via::Library`]): the FUSE server installs one so that the kernel's
    /// caches follow changes made through the library while the filesystem is mounted. See
    /// [`crate::notify`].
    pub fn set_invalidator(&self, sink: Option<Arc<dyn Invalidate>>) {
        self.watch.set(sink);
    }

    /// Whether a kernel caller (`Via::Kernel`) holds a lookup reference on `ino`: the
    /// kernel has a dentry of it (a name it looked up and still caches, someone's working
    /// directory, an open descriptor), as far as the FORGETs it sent tell.
    pub fn held_by_kernel(&self, ino: Ino) -> bool {
        self.watch.held.holds(ino)
    }

    /// Waits `max`, or less while a library change's report waits for a FORGET: the FUSE
    /// transport that reads the kernel's FORGETs pauses here after each, so that those the
    /// kernel queues meanwhile come as one BATCH_FORGET, without holding back a report that
    /// waits for one (see [`crate::notify`]).
    pub fn forget_pause(&self, max: std::time::Duration) {
        self.watch
            .held
            .forget_pause(std::time::Instant::now() + max);
    }

    /// Reports a change to the installed sink, if `ctx` is a library caller. Called only after
    /// the operation has released its locks.
    #[inline]
    fn report<R>(&self, ctx: &Ctx, f: impl FnOnce(&dyn Invalidate) -> R) {
        if let Some(s) = self.watch.sink(ctx) {
            f(&crate::notify::Settled {
                sink: &*s,
                watch: &self.watch,
            });
        }
    }

    /// Takes a kernel caller's lookup reference on `i`, counted in [`crate::notify`]'s table
    /// before the caller reads the attributes its answer carries.
    #[inline]
    fn kernel_ref(&self, i: &Inode) -> Result<()> {
        i.get_ref()?;
        self.watch.held.add(i.ino);
        Ok(())
    }

    /// Gives back `n` lookup references a kernel caller took on `i` and will not hand over.
    fn kernel_unref(&self, i: &Inode, n: u64, g: &Guard) {
        self.watch.held.sub(i.ino, n);
        self.put_refs(i, n, g);
    }

    /// Runs `f`, which removes the names `names` (an unlink, an rmdir, a rename) and reports
    /// it, between [`Invalidate::removing`] and [`Invalidate::removal_reported`] of each.
    fn removing<R>(&self, ctx: &Ctx, names: &[(Ino, &[u8])], f: impl FnOnce() -> R) -> R {
        self.report(ctx, |s| {
            for &(p, n) in names {
                s.removing(p, n);
            }
        });
        let r = f();
        self.report(ctx, |s| {
            for &(p, n) in names {
                s.removal_reported(p, n);
            }
        });
        r
    }

    /// Reports the removal of `name` from `parent`, which named `ino`.
    fn report_removal(&self, ctx: &Ctx, parent: Ino, name: &[u8], ino: Ino) {
        self.report(ctx, |s| {
            // Nothing of the name in the kernel: no request handing it an entry of `parent`
            // runs or listing of it is kept (asked first), and it holds no reference on the
            // inode (read after, with a fence: a request that ended before the first question
            // has counted its reference). Only `parent`'s attributes change for it.
            if !s.may_see_removal(parent) && !self.watch.held.holds(ino) {
                s.removed_unseen(parent);
                return;
            }
            // The inode first, while the kernel's entry for the name still holds it:
            // dropping the entry can make the kernel let go of the inode, and an
            // invalidation that then finds nothing would wait for the FORGET
            // ([`crate::notify`]).
            s.inode(ino, None);
            s.entry(parent, name);
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
        self.evict_if_due();
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
    fn stripe_of(&self, parent: InoGen, name: &[u8]) -> usize {
        (self.stripe_hasher.hash_one((parent.raw(), name)) as usize) & (NSTRIPES - 1)
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

    #[inline]
    fn replaying(&self) -> bool {
        self.replaying.load(Relaxed)
    }

    /// Hands `rec` to the store (live), or notes the ids and cookie it carries so that later
    /// ones are fresh (replay). See `apply.rs` for where each kind is committed.
    fn commit(&self, rec: &Record<'_>) -> Result<()> {
        if self.replaying() {
            recovery::observe(self, rec);
            Ok(())
        } else if self.durable {
            self.store.append(rec)?;
            self.label_changed(rec);
            Ok(())
        } else {
            Ok(())
        }
    }

    /// The live inode `r` names: ENOENT if there is none (every lookup by number goes
    /// through here).
    #[inline]
    pub(crate) fn iget<'g>(&self, r: impl Into<InodeRef>, g: &'g Guard) -> Result<&'g Inode> {
        let i = self.iget_emptied(r, g)?;
        if i.is_emptied() {
            return Err(Errno::ESTALE);
        }
        Ok(i)
    }

    /// [`Filesystem::iget`] answers ESTALE for an inode whose contents went before its
    /// FORGET (`inode.rs`, `EMPTIED`; `unlinked.rs`): it has no name, and a kernel request
    /// that still names it comes from a path walk that found it before it went, which the
    /// kernel makes again on ESTALE, finding what the name names now. This one finds such an
    /// inode too (`getattr`: link count 0, no blocks).
    fn iget_emptied<'g>(&self, r: impl Into<InodeRef>, g: &'g Guard) -> Result<&'g Inode> {
        let r = r.into();
        match self.tget(r.ino(), g)? {
            Some(i) if !i.is_dead() => match r {
                InodeRef::Exact(id) if i.generation != id.generation => Err(Errno::ENOENT),
                _ => Ok(i),
            },
            _ => Err(Errno::ENOENT),
        }
    }

    /// The inode an entry names, found without locks: `None` if it was freed since the entry
    /// was read (the entry changed meanwhile).
    #[inline]
    fn iget_racy<'g>(&self, key: InoGen, g: &'g Guard) -> Option<&'g Inode> {
        match self.table.get_gen(key, g) {
            Some(i) => Some(i),
            // Not loaded yet (`lazy.rs`); a store that fails is met again under the stripe
            // (`iget_named`), which says EIO.
            None => self
                .load_missing(key.ino(), None, g)
                .ok()
                .flatten()
                .filter(|i| i.key() == key),
        }
    }

    /// The inode an entry read under its stripe names. Under the stripe the entry cannot
    /// change and its inode cannot be freed (an inode is installed before its entry appears
    /// and freed only after its last entry is gone), so a miss is a broken invariant: EIO,
    /// and a panic in debug builds.
    #[inline]
    fn iget_named<'g>(&self, de: Dirent, g: &'g Guard) -> Result<&'g Inode> {
        match self
            .tget(de.target.ino(), g)?
            .filter(|i| i.key() == de.target)
        {
            Some(i) => Ok(i),
            // A lazily loaded store's entry naming an inode it does not hold: damage, found
            // only now when the directory's load did not read its files (`lazy.rs`).
            None if self.lazy.is_some() => Err(self.damaged(format!(
                "an entry names inode {} ({:#x} with its generation), which the store does not hold",
                de.target.ino(),
                de.target.raw()
            ))),
            None => {
                debug_assert!(false, "entry names missing inode {:?}", de.target);
                Err(Errno::EIO)
            }
        }
    }

    /// The entry `name` in directory `dir` (every entry lookup goes through here).
    #[inline]
    fn dget(&self, dir: InoGen, name: &[u8]) -> Option<Dirent> {
        self.dirents.get(dir, name, &self.stats)
    }

    /// Counts an entry change in directory `a` (and `b`, a rename's other directory) until
    /// the returned guard is dropped, which the caller does once its change is visible or
    /// refused: a change of either directory's permission waits for it (`revoke.rs`). Called
    /// before the change reads the directories' attributes for its checks.
    #[inline]
    fn count_entry_change(&self, a: &Inode, b: Option<&Inode>) -> Counted<'_> {
        self.revocations.enter(a.ino.get(), b.map(|b| b.ino.get()))
    }

    /// Called by a change of `i`'s mode, owner, group, inode flags or ACLs once it is made
    /// and every lock it took is released: when `i` is a directory, waits until every entry
    /// change in it that may have checked the attributes from before the change is visible
    /// (`revoke.rs`).
    fn revoked(&self, i: &Inode) {
        if i.is_dir() && !self.replaying() {
            self.revocations.revoked(i.ino.get());
        }
    }

    /// A live directory (ENOTDIR for another type).
    #[inline]
    fn dir_inode<'g>(&self, r: InodeRef, g: &'g Guard) -> Result<(&'g Inode, &'g DirBody)> {
        let i = self.iget(r, g)?;
        match i.dir() {
            Some(d) => Ok((i, d)),
            None => Err(Errno::ENOTDIR),
        }
    }

    /// The inode `name` names in `dir` (`.` and `..` understood), found without locks as
    /// [`Filesystem::named`] finds it, with a reference taken when `pin` (a kernel lookup's):
    /// a name that exists throughout is found even while renames point it at other inodes.
    pub(crate) fn child<'g>(
        &self,
        dir: &'g Inode,
        d: &DirBody,
        name: &[u8],
        pin: bool,
        g: &'g Guard,
    ) -> Result<&'g Inode> {
        let take = |i: &Inode| if pin { self.kernel_ref(i) } else { Ok(()) };
        if name == b"." {
            take(dir)?;
            return Ok(dir);
        }
        if name == b".." {
            // A parent read just as its directory moves may be freed meanwhile: read again.
            for _ in 0..8 {
                if let Some(p) = self.iget_racy(d.parent(), g)
                    && take(p).is_ok()
                {
                    return Ok(p);
                }
            }
            return Err(Errno::ENOENT);
        }
        self.named(dir.key(), name, None, pin, g)
    }

    /// The inode the entry `name` in directory `key` names (ENOENT without one), found
    /// without locks: when the inode read was freed meanwhile (a rename pointed the name at
    /// another inode, or removed it, and the number may have been reused), the entry is read
    /// again, and after a few such races under the name's stripe, where entry and inode are
    /// stable. With `cookie`, only the entry with that cookie will do (ENOENT when the name
    /// has another, made again since); with `pin`, the inode is returned with a reference
    /// taken ([`Inode::get_ref`]), which is what can fail once it has been freed.
    pub(crate) fn named<'g>(
        &self,
        key: InoGen,
        name: &[u8],
        cookie: Option<u64>,
        pin: bool,
        g: &'g Guard,
    ) -> Result<&'g Inode> {
        let read = || {
            self.dget(key, name)
                .filter(|de| cookie.is_none_or(|c| de.cookie == c))
                .ok_or(Errno::ENOENT)
        };
        for _ in 0..8 {
            let de = read()?;
            if let Some(i) = self.iget_racy(de.target, g) {
                match pin.then(|| self.kernel_ref(i)) {
                    None | Some(Ok(())) => return Ok(i),
                    Some(Err(Errno::ENFILE)) => return Err(Errno::ENFILE),
                    Some(Err(_)) => {} // freed since it was read
                }
            }
        }
        let _s = self.lock_stripe(self.stripe_of(key, name));
        let i = self.iget_named(read()?, g)?;
        if pin {
            self.kernel_ref(i)?;
        }
        Ok(i)
    }

    /// One step of a path walk: `name` in `dir` (ENOTDIR if it is none), after the search
    /// permission check. Builds no attributes; takes the `coarse` lock in that mode and,
    /// otherwise, one lock: the dirent-map shard of the name. Counted as a lookup.
    pub(crate) fn step<'g>(
        &self,
        ctx: &Ctx,
        dir: &'g Inode,
        name: &[u8],
        g: &'g Guard,
    ) -> Result<&'g Inode> {
        let _c = self.begin(Op::Lookup);
        let d = dir.dir().ok_or(Errno::ENOTDIR)?;
        self.may_search(ctx, dir)?;
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        self.child(dir, d, name, false, g)
    }

    /// Whether `ctx` may search directory `dir`: a caller with `CAP_DAC_OVERRIDE` or
    /// `CAP_DAC_READ_SEARCH` (root) always may (no attribute read), anyone else by mode,
    /// owner, group and access ACL.
    #[inline]
    pub(crate) fn may_search(&self, ctx: &Ctx, dir: &Inode) -> Result<()> {
        debug_assert!(dir.is_dir());
        if ctx.has(perm::caps::DAC_OVERRIDE | perm::caps::DAC_READ_SEARCH) {
            return Ok(());
        }
        self.permission(ctx, dir, &dir.attr.access_view(), MAY_EXEC)
    }

    /// May `ctx` access inode `i`, whose attributes are `v`, for `mask` (`MAY_READ`,
    /// `MAY_WRITE`, `MAY_EXEC` bits)? Never to write an immutable inode (EPERM); otherwise
    /// mode bits, and the access ACL when the inode has one (`acl.rs`; root is decided by
    /// `perm::check` alone). Every permission check on an inode
    /// goes through here, or through [`Filesystem::permission_with`] inside the attribute
    /// seqlock.
    ///
    /// The mode and the ACL are read as one state. A chmod of an inode with an ACL rewrites
    /// both (the ACL's mask is the mode's group bits) inside the attribute seqlock while
    /// holding the inode's xattr shard, as does every change of the ACL; so when `v` says the
    /// inode has an ACL, the attributes are read again under that shard, beside the ACL. A
    /// `v` without the flag is a state of its own (the mode of an inode with no ACL), and is
    /// decided alone (the common case: no lock taken).
    pub(crate) fn permission(&self, ctx: &Ctx, i: &Inode, v: &AttrVals, mask: u32) -> Result<()> {
        if v.flags & flags::ACL == 0 || perm::overrides(ctx, v, mask) {
            return permission_with(ctx, v, None, mask);
        }
        let shard = self.xattrs.lock(i.ino, &self.stats);
        let v = i.attr.access_view();
        let acl = (v.flags & flags::ACL != 0)
            .then(|| shard.get(&i.ino).and_then(|x| x.get(ACL_ACCESS_NAME)))
            .flatten()
            .map(|bytes| Acl::parse(bytes).expect("stored ACLs are valid"));
        drop(shard);
        permission_with(ctx, &v, acl.as_ref(), mask)
    }

    /// Directory `dir`'s default ACL, if it has one.
    pub(crate) fn default_acl(&self, dir: &Inode) -> Option<Acl> {
        let shard = self.xattrs.lock(dir.ino, &self.stats);
        let bytes = shard.get(&dir.ino)?.get(crate::acl::ACL_DEFAULT_NAME)?;
        Some(Acl::parse(bytes).expect("stored ACLs are valid"))
    }

    /// A symlink's target, if `i` is one.
    pub(crate) fn symlink_target<'g>(&self, i: &'g Inode) -> Option<&'g [u8]> {
        match &i.body {
            Body::Symlink(t) => Some(t),
            _ => None,
        }
    }

    /// `fs.protected_symlinks` (`may_follow_link`): may `ctx` follow symlink `link`, found
    /// in directory `dir`? Yes unless the rule is on ([`Config::protected_symlinks`]), `dir`
    /// is sticky and world-writable, and neither the follower nor `dir`'s owner owns the
    /// link. A kernel caller's walks are the kernel's, which applied its own setting.
    pub(crate) fn may_follow(&self, ctx: &Ctx, dir: &Inode, link: &Inode) -> Result<()> {
        if !self.cfg.protected_symlinks || ctx.via == crate::Via::Kernel {
            return Ok(());
        }
        let (d, l) = (dir.attr.access_view(), link.attr.access_view());
        let shared = libc::S_ISVTX | libc::S_IWOTH;
        if l.uid == ctx.uid || d.mode & shared != shared || d.uid == l.uid {
            return Ok(());
        }
        Err(Errno::EACCES)
    }

    /// Whether the filesystem's store keeps its changes (false: the memory store, where an
    /// `fsync` has nothing to do).
    pub fn durable(&self) -> bool {
        self.durable
    }

    /// The attributes `stat` reports. A directory's size counts its entries without a lock.
    pub(crate) fn attr_of(&self, i: &Inode, g: &Guard) -> Attr {
        let v = i.attr.load();
        let (size, rdev) = match &i.body {
            Body::Dir(d) => ((2 + self.dirents.count(d, g)) * BOGO_DIRENT_SIZE, 0),
            Body::Special { rdev } => (v.size, *rdev),
            _ => (v.size, 0),
        };
        Attr {
            ino: i.ino,
            generation: i.generation,
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
            btime: i.birth(),
            flags: v.flags & flags::USER,
        }
    }

    /// Frees an inode whose `DEAD` transition the caller won. The store is told (a `Free`
    /// record) unless the inode never became visible (`announce` false) or its contents
    /// went before (`unlinked.rs`, which did all but take it out of the table).
    fn free_inode(&self, i: &Inode, g: &Guard, announce: bool) {
        debug_assert!(i.is_dead());
        if i.is_emptied() {
            self.unpublish(i, g);
            self.unlinked.forget(i);
            if !self.replaying() {
                self.ids.free(i.ino, &self.stats);
            }
            return;
        }
        if announce && self.durable && !self.replaying() {
            // The inode is already dead: a store that cannot take this record loses nothing
            // the recovery of an orphan would not also drop (`recovery.rs`).
            let _ = self.store.append(&Record::Free { inode: i.id() });
        }
        if let Body::File(data) = &i.body {
            // The pages go back now, not when the epoch drops the inode (data.rs, "Freeing").
            let pages = self
                .stats
                .write(LockClass::FileData, data)
                .clear(&self.page_epochs);
            self.space.give(pages);
        }
        if i.attr.flags() & flags::XATTRS != 0 {
            self.xattrs.lock(i.ino, &self.stats).remove(&i.ino);
        }
        self.inode_quota.give(1);
        self.unpublish(i, g);
        // After everything given back, before the number can be used again: an asker of
        // `reap_unlinked` waits for this (`unlinked.rs`).
        self.unlinked.forget(i);
        if !self.replaying() {
            self.ids.free(i.ino, &self.stats);
        }
    }

    /// Holds `i` for the length of an operation that changes it (a reference, dropped by
    /// [`Held`]): the inode cannot be freed, and its `Free` record cannot be appended, before
    /// the operation's own records. ENOENT if it is already gone. Only the inode itself is
    /// written, which the operation writes anyway; never a parent.
    fn hold<'a>(&'a self, i: &'a Inode, g: &'a Guard) -> Result<Held<'a>> {
        i.get_ref()?;
        Ok(Held { fs: self, i, g })
    }

    /// Drops references; frees the inode if they were its last hold, or its contents if
    /// only the kernel's lookups hold it now ([`Filesystem::settle`]).
    fn put_refs(&self, i: &Inode, n: u64, g: &Guard) {
        let fate = i.put_refs(n);
        self.settle(i, fate, g);
    }

    /// Takes a lookup reference for `ctx` if it counts lookups ([`crate::Via::Kernel`]).
    #[inline]
    fn pin_for(&self, ctx: &Ctx, i: &Inode) -> Result<()> {
        if ctx.counts_lookups() {
            self.kernel_ref(i)
        } else {
            Ok(())
        }
    }

    // ----- lookups and attributes ------------------------------------------------------------

    /// Finds `name` in directory `parent` (search permission on `parent` required). `.` and
    /// `..` are understood.
    pub fn lookup(&self, ctx: &Ctx, parent: impl Into<InodeRef>, name: &[u8]) -> Result<Attr> {
        let _c = self.begin(Op::Lookup);
        let g = epoch::pin();
        let (dir, d) = self.dir_inode(parent.into(), &g)?;
        self.may_search(ctx, dir)?;
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        if name.is_empty() {
            return Err(Errno::ENOENT);
        }
        if name.contains(&b'/') || name.contains(&0) {
            return Err(Errno::EINVAL);
        }
        let child = self.child(dir, d, name, ctx.counts_lookups(), &g)?;
        Ok(self.attr_of(child, &g))
    }

    /// The attributes of inode `ino`, of any type, with a lookup reference for a
    /// [`crate::Via::Kernel`] caller: the kernel's LOOKUP of `.` by node id, which it sends to
    /// find an inode again from an exported file handle (`open_by_handle_at`, NFS) once the
    /// inode has left its cache. (A lookup of `.` in a directory by a library caller is
    /// [`Filesystem::lookup`], which requires a directory.)
    pub fn lookup_inode(&self, ctx: &Ctx, ino: impl Into<InodeRef>) -> Result<Attr> {
        let _c = self.begin(Op::Lookup);
        let g = epoch::pin();
        let i = self.iget(ino, &g)?;
        self.pin_for(ctx, i)?;
        Ok(self.attr_of(i, &g))
    }

    /// Drops `n` lookup references taken by a [`crate::Via::Kernel`] caller (FUSE `FORGET`).
    /// A FORGET of more references than the inode holds drops those it holds, is counted
    /// ([`Filesystem::over_forgets`]) and said once on stderr, instead of failing: the kernel
    /// has been seen to forget an inode once more than it looked it up (a READDIRPLUS entry
    /// it could not attach, beside a directory the library moved), and a server thread that
    /// panicked would leave every request of the mount unanswered.
    pub fn forget(&self, ino: Ino, n: u64) {
        let _c = self.begin(Op::Forget);
        let g = epoch::pin();
        // Marked before the kernel's count drops, for `reap_unlinked` (`unlinked.rs`).
        let noted = self.unlinked.begin_forget(ino);
        self.watch.held.sub(ino, n);
        if let Some(i) = self.resident(ino, &g) {
            let (fate, short) = i.put_refs_at_most(n);
            if short > 0
                && self
                    .over_forgets
                    .fetch_add(short, std::sync::atomic::Ordering::Relaxed)
                    == 0
            {
                eprintln!(
                    "lanefs: the kernel forgot inode {ino} {short} more time(s) than it looked \
                     it up (counted from now on in over_forgets)"
                );
            }
            self.settle(i, fate, &g);
            self.let_go(i);
        }
        if noted {
            self.unlinked.end_forget(ino);
        }
    }

    /// Lookup references FORGETs dropped beyond those the inodes held (see
    /// [`Filesystem::forget`]).
    pub fn over_forgets(&self) -> u64 {
        self.over_forgets.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Library changes whose report to the installed sink gave up waiting for the kernel to
    /// take the inode it was being handed (see [`crate::notify`]): each may have left the
    /// mount showing old attributes until the attribute timeout.
    pub fn invalidations_given_up(&self) -> u64 {
        self.watch
            .given_up
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The attributes of `ino`.
    pub fn getattr(&self, ino: impl Into<InodeRef>) -> Result<Attr> {
        let _c = self.begin(Op::Getattr);
        let g = epoch::pin();
        Ok(self.attr_of(self.iget_emptied(ino, &g)?, &g))
    }

    /// `access(2)`: `mask` is a combination of `R_OK`, `W_OK`, `X_OK`, or `F_OK` (0).
    pub fn access(&self, ctx: &Ctx, ino: impl Into<InodeRef>, mask: u32) -> Result<()> {
        let _c = self.begin(Op::Access);
        let g = epoch::pin();
        let i = self.iget(ino, &g)?;
        if mask & perm::MAY_WRITE != 0 && self.cfg.read_only {
            return Err(Errno::EROFS);
        }
        if mask == 0 {
            Ok(())
        } else {
            self.permission(ctx, i, &i.attr.access_view(), mask & 7)
        }
    }

    /// Space and inode usage (unlinked files the kernel no longer holds not counted:
    /// `fs/unlinked.rs`).
    pub fn statfs(&self) -> StatFs {
        // Unlinked files the kernel no longer holds are not counted (`unlinked.rs`).
        self.reap_unlinked();
        let _c = self.begin(Op::Statfs);
        let blocks = self.space.limit();
        let bfree = blocks.saturating_sub(self.space.used());
        let files = self.inode_quota.limit();
        // No more available than the store's host can take (a disk store's host may hold
        // other files, and the store's own journal and checkpoint).
        let bavail = match self.store.available() {
            Some(bytes) => bfree.min(bytes / crate::data::PAGE),
            None => bfree,
        };
        StatFs {
            blocks,
            bfree,
            bavail,
            files,
            ffree: files.saturating_sub(self.inode_quota.used()),
            bsize: crate::data::PAGE as u32,
            namelen: NAME_MAX as u32,
            frsize: crate::data::PAGE as u32,
        }
    }
}

/// [`Filesystem::permission`] with the access ACL already read (`acl`: `None` if the inode has
/// none or the caller is root), for checks made inside the attribute seqlock, where the xattr
/// shard lock may not be taken.
pub(crate) fn permission_with(ctx: &Ctx, v: &AttrVals, acl: Option<&Acl>, mask: u32) -> Result<()> {
    // `inode_permission`: nobody, root included, may write to an immutable inode.
    if mask & perm::MAY_WRITE != 0 && v.flags & flags::IMMUTABLE != 0 {
        return Err(Errno::EPERM);
    }
    match acl {
        Some(a) if !perm::overrides(ctx, v, mask) => crate::acl::check(ctx, v, a, mask),
        _ => perm::check(ctx, v, mask),
    }
}

/// A reference held for one operation ([`Filesystem::hold`]); dropped last, after every lock
/// the operation took (freeing the inode may take its data lock).
struct Held<'a> {
    fs: &'a Filesystem,
    i: &'a Inode,
    g: &'a Guard,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.fs.put_refs(self.i, 1, self.g);
    }
}

impl std::fmt::Debug for Filesystem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Filesystem")
            .field("locking", &self.cfg.locking)
            .finish_non_exhaustive()
    }
}
