//! A namespace loaded as it is needed: the miss path (the seed-000 patches' subject).
//!
//! A filesystem recovered with [`Filesystem::recover_lazy`] starts with the root and what
//! its store's records after its checkpoint touch; every other inode stays in the store
//! until something asks for it by number. The inode table's miss goes to
//! [`Filesystem::load_missing`], which asks the store ([`Store::load_inode`]) and publishes
//! what it gets.
//!
//! # What is loaded, and when
//! - **An inode is loaded whole**: attributes, link count (as the store kept it, not
//!   counted from names), xattrs and ACLs, inode flags, birth time, and a file's pages (each
//!   one left in the store, read when asked for, as for a checkpoint loaded whole) and runs
//!   of zeros.
//! - **A directory is loaded with its entries**, and with the inodes of those that are not
//!   directories, before it is published: a directory in the table has every entry of it in
//!   the dirent map, and every entry names an inode in the table or a directory the store
//!   holds. So a lookup that misses in the map means the name does not exist, as before, and
//!   nothing but the table's miss path changes: `dget` and the ordered index are untouched.
//!   A subdirectory's entries load when the subdirectory is first reached by number (a path
//!   walk, a handle, `..`).
//! - **The store's copy of a number is read at most once** in a filesystem's life: once a
//!   number was loaded, made, or freed here, its bit in `seen` is set and a miss on it is a
//!   miss (a freed inode is never brought back from an older checkpoint). The store's
//!   records made after the open only ever concern loaded inodes (a change reaches an inode
//!   through the table, which loads it first), so whatever checkpoint the store reads at
//!   the time of a load holds the inode as it was at the open.
//! - **Fresh numbers come from above the store's highest** (`InoAlloc::observe`); numbers
//!   freed since the open are recycled as usual, and the store's holes below its highest are
//!   not, while this filesystem lives.
//!
//! # The miss path and its locks
//! Threads missing on different numbers load in parallel and share nothing but one shard of
//! the `loading` map (64 shards, held only to find or add a number's cell, never during a
//! load); threads missing on one number meet at its `OnceLock` and all get the one copy that
//! the first published (a slot is written only by `InodeTable::install_loaded`, which
//! asserts it was empty). A directory's load loads its files through the same cells, never
//! another directory, so loads never wait in a cycle. A load takes no engine lock but the
//! dirent map's and the index's shards while it inserts a directory's entries, as a create
//! does; a store's read is a leaf (`locking.rs`).
//!
//! Under `dirlock` and `coarse` (the benchmarks' "before"), a miss takes one global lock,
//! `inode_hash`, around its look at the table and again around its insert: what the kernel
//! did before the seed's patch (its reads in between run in parallel, as the kernel's did;
//! `coarse` itself lets one operation run at a time).
//!
//! # What is not done yet
//! Loaded inodes stay loaded (no eviction, so memory still grows with what was touched), and
//! a directory is loaded whole with its files (docs/STORE.md, "Not built yet").
//!
//! # Limits
//! The store says at the start what it holds (`recover_lazy`'s counts), and that is counted
//! against the size and inode limits then; a load counts nothing, and freeing a loaded inode
//! gives back what it holds, as for any other.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::{Arc, OnceLock};

use crossbeam_epoch::{Guard, Owned};
use crossbeam_utils::CachePadded;
use parking_lot::Mutex;

use super::Filesystem;
use crate::acl::{ACL_ACCESS_NAME, ACL_DEFAULT_NAME};
use crate::attr::{AttrCell, AttrVals, FileType, flags};
use crate::dir::DirBody;
use crate::errno::{Errno, Result};
use crate::id::Ino;
use crate::inode::{Body, Inode};
use crate::record::{LoadedEntry, LoadedInode};
use crate::stats::LockClass;

/// Shards of the map of loads under way.
const LOADING: usize = 64;

type Cell = Arc<OnceLock<Result<()>>>;

/// One shard of the loads under way: each number's cell.
type LoadingShard = CachePadded<Mutex<HashMap<u64, Cell>>>;

/// A lazily loaded filesystem's side of the miss path (see the module doc).
pub(crate) struct Lazy {
    /// Numbers up to this one may be held by the store and not loaded.
    max: u64,
    /// One bit per number up to `max`: its store copy must not be loaded (see the module doc).
    seen: Box<[AtomicU64]>,
    /// Loads under way, by number.
    loading: Box<[LoadingShard]>,
    /// The "before" modes' global lock (see the module doc).
    inode_hash: Mutex<()>,
    /// Inodes loaded so far.
    pub loaded: AtomicU64,
}

impl Lazy {
    pub fn new(max: u64) -> Lazy {
        Lazy {
            max,
            seen: (0..max / 64 + 1).map(|_| AtomicU64::new(0)).collect(),
            loading: (0..LOADING)
                .map(|_| CachePadded::new(Mutex::new(HashMap::new())))
                .collect(),
            inode_hash: Mutex::new(()),
            loaded: AtomicU64::new(0),
        }
    }

    /// The highest number the store may hold.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// Whether the store's copy of `ino` may still be loaded.
    #[inline]
    fn unseen(&self, ino: Ino) -> bool {
        ino.0 <= self.max && self.seen[(ino.0 / 64) as usize].load(Acquire) & bit(ino) == 0
    }

    /// Marks `ino` as one whose store copy must never be loaded (loaded, made or freed).
    #[inline]
    pub fn see(&self, ino: Ino) {
        if ino.0 <= self.max {
            self.seen[(ino.0 / 64) as usize].fetch_or(bit(ino), Release);
        }
    }

    fn shard(&self, ino: Ino) -> &Mutex<HashMap<u64, Cell>> {
        &self.loading[(ino.0 as usize).wrapping_mul(0x9E37_79B9) % LOADING]
    }
}

fn bit(ino: Ino) -> u64 {
    1 << (ino.0 % 64)
}

impl Filesystem {
    /// The inode in slot `ino`, loaded from the store if it holds one not loaded yet.
    #[inline]
    pub(super) fn tget<'g>(&self, ino: Ino, g: &'g Guard) -> Result<Option<&'g Inode>> {
        match self.table.get(ino, g) {
            Some(i) => Ok(Some(i)),
            None => self.load_missing(ino, None, g),
        }
    }

    /// The table's miss (see the module doc): `None` when nothing has or had that number.
    /// `given`: the inode as the store holds it, read already (a directory's file).
    #[cold]
    pub(super) fn load_missing<'g>(
        &self,
        ino: Ino,
        given: Option<LoadedInode>,
        g: &'g Guard,
    ) -> Result<Option<&'g Inode>> {
        let Some(lazy) = self.lazy.as_ref() else {
            return Ok(None);
        };
        let before = self.cfg.locking != super::Locking::Lanes;
        {
            let _h = before.then(|| self.stats.lock(LockClass::InodeHash, &lazy.inode_hash));
            if let Some(i) = self.table.get(ino, g) {
                return Ok(Some(i));
            }
            if !lazy.unseen(ino) {
                // Loaded and published, or freed, since the look above.
                return Ok(self.table.get(ino, g));
            }
        }
        // A load that fails publishes nothing and leaves the bit clear: its waiters, which
        // did not fail themselves, try again with a cell of their own (a read error of one
        // thread's is not another's, which may hold the inode already: `given`).
        let mut given = given;
        let r = loop {
            let cell = lazy
                .shard(ino)
                .lock()
                .entry(ino.0)
                .or_insert_with(Default::default)
                .clone();
            let mut ran = false;
            let r = *cell.get_or_init(|| {
                ran = true;
                // A load that ended after this thread's look, and took its cell out of the
                // map before this one put a new one in, set the bit first.
                if !lazy.unseen(ino) {
                    return Ok(());
                }
                let l = match given.take() {
                    Some(l) => Some(l),
                    None => self.store.load_inode(ino)?,
                };
                match l {
                    Some(l) => self.publish_loaded(lazy, ino, l, before),
                    None => {
                        lazy.see(ino);
                        Ok(())
                    }
                }
            });
            {
                let mut m = lazy.shard(ino).lock();
                if m.get(&ino.0).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
                    m.remove(&ino.0);
                }
            }
            if r.is_ok() || ran {
                break r;
            }
        };
        r?;
        Ok(self.table.get(ino, g))
    }

    /// Publishes inode `l` (a directory with its entries and their files) as number `ino`,
    /// and marks the number seen; the caller holds `ino`'s cell.
    fn publish_loaded(&self, lazy: &Lazy, ino: Ino, l: LoadedInode, before: bool) -> Result<()> {
        let kind = FileType::from_mode(l.mode)
            .ok_or_else(|| self.damaged(format!("inode {}: mode {:#o}", l.id, l.mode)))?;
        // An inode without links is an orphan, which only recovery loads
        // (`Recovery::load_orphan`); never a directory (a removed directory is made bare).
        let orphan_ok = self.replaying() && kind != FileType::Directory;
        if l.id.ino != ino || (l.nlink == 0 && !orphan_ok) {
            return Err(self.damaged(format!(
                "the store gave inode {} with {} links for number {ino}",
                l.id, l.nlink
            )));
        }
        for acl in [&l.access_acl, &l.default_acl] {
            if !acl.is_empty() && crate::acl::Acl::parse(acl).is_err() {
                return Err(self.damaged(format!("inode {}: an ACL that does not parse", l.id)));
            }
        }
        let mut x = crate::xattr::Xattrs::default();
        for (name, v) in l.xattrs.iter().map(|(n, v)| (&n[..], &v[..])).chain(
            [
                (ACL_ACCESS_NAME, &l.access_acl[..]),
                (ACL_DEFAULT_NAME, &l.default_acl[..]),
            ]
            .into_iter()
            .filter(|(_, v)| !v.is_empty()),
        ) {
            x.set(name, v, 0).map_err(|_| {
                self.damaged(format!(
                    "inode {}: xattr {} beyond the limits",
                    l.id,
                    String::from_utf8_lossy(name)
                ))
            })?;
        }
        // Recovery holds every inode it has until it ends (`recovery.rs`).
        let refs = u32::from(self.replaying());
        let g = crossbeam_epoch::pin();
        let inode = Owned::new(self.build(&l, kind, refs)?);
        if let Body::Dir(d) = &inode.body {
            // A failure leaves no entry in the map (`load_entries`); the files it published
            // are sound, and the next miss on the directory starts again.
            self.load_entries(inode.key(), d, &g)?;
        }
        if !x.is_empty() {
            self.xattrs.lock(ino, &self.stats).insert(ino, x);
        }
        {
            let _h = before.then(|| self.stats.lock(LockClass::InodeHash, &lazy.inode_hash));
            self.table.install_loaded(inode, &g);
        }
        lazy.see(ino);
        lazy.loaded.fetch_add(1, Relaxed);
        Ok(())
    }

    /// The inode `l` describes, with `refs` references, not yet published.
    fn build(&self, l: &LoadedInode, kind: FileType, refs: u32) -> Result<Inode> {
        let mut f = l.flags & flags::USER;
        if !l.access_acl.is_empty() {
            f |= flags::ACL | flags::XATTRS;
        }
        if !l.default_acl.is_empty() {
            f |= flags::DEFAULT_ACL | flags::XATTRS;
        }
        if !l.xattrs.is_empty() {
            f |= flags::XATTRS;
        }
        let mut vals = AttrVals {
            mode: l.mode,
            flags: f,
            uid: l.uid,
            gid: l.gid,
            size: l.size,
            blocks: 0,
            atime: l.atime,
            mtime: l.mtime,
            ctime: l.ctime,
        };
        let body = match kind {
            FileType::RegularFile => {
                let mut d = crate::data::FileData::default();
                for &(first, end) in &l.zeros {
                    if first >= end || end - 1 > super::MAX_FILE_SIZE / crate::data::PAGE {
                        d.clear(&self.page_epochs);
                        return Err(self.damaged(format!(
                            "file {}: a run of zeros from page {first} to {end}",
                            l.id
                        )));
                    }
                    d.add_zeros(first, end, &self.page_epochs);
                }
                for &p in &l.pages {
                    if p > super::MAX_FILE_SIZE / crate::data::PAGE {
                        d.clear(&self.page_epochs);
                        return Err(self.damaged(format!("file {}: page {p}", l.id)));
                    }
                    d.add_kept(p, &self.page_epochs);
                }
                vals.blocks = d.pages() * (crate::data::PAGE / 512);
                Body::File(parking_lot::RwLock::new(d))
            }
            FileType::Directory => {
                vals.size = 0;
                Body::Dir(DirBody::new(l.parent.key()))
            }
            FileType::Symlink => {
                vals.size = l.target.len() as u64;
                Body::Symlink(l.target.clone().into_boxed_slice())
            }
            _ => Body::Special { rdev: l.rdev },
        };
        let i = match l.nlink {
            // An orphan (see `publish_loaded`): a link replayed after may name it again.
            0 => Inode::new_unnamed(l.id, refs, false, AttrCell::new(vals), body),
            n => Inode::new(l.id, n, refs, AttrCell::new(vals), body),
        };
        i.set_birth(l.btime);
        Ok(i)
    }

    /// Puts directory `dir`'s entries (body `d`, not yet published) in the dirent map and
    /// its index, after publishing the inodes of those that are not directories. Nothing is
    /// put in the map unless every entry is sound and every file loaded, so a load that
    /// fails leaves nothing behind, and the next miss tries again from the start.
    fn load_entries(&self, dir: crate::id::InoGen, d: &DirBody, g: &Guard) -> Result<()> {
        let entries = self.store.load_entries(dir.ino())?;
        let bad = |e: &LoadedEntry, what: &str| {
            self.damaged(format!(
                "directory {}: entry {} (inode {}, cookie {:#x}): {what}",
                dir.ino(),
                String::from_utf8_lossy(&e.name),
                e.target,
                e.cookie
            ))
        };
        let mut names = std::collections::HashSet::with_capacity(entries.len());
        let mut entries = entries;
        for e in &mut entries {
            if !crate::dir::valid_cookie(e.cookie) {
                return Err(bad(e, "a cookie out of range"));
            }
            if super::check_name(&e.name).is_err() || super::is_dot_or_dotdot(&e.name) {
                return Err(bad(e, "not a name"));
            }
            if !names.insert(e.name.clone()) {
                return Err(bad(e, "a name twice"));
            }
            if e.target.ino == dir.ino() {
                return Err(bad(e, "the directory itself"));
            }
            if let Some(l) = e.inode.take() {
                // Only files come with their inode: a directory's load never waits on
                // another directory's (see the module doc).
                if l.id != e.target || l.mode & libc::S_IFMT == libc::S_IFDIR {
                    return Err(bad(e, "an inode that is not the one named, or a directory"));
                }
                let ok = self
                    .load_missing(e.target.ino, Some(l), g)?
                    .is_some_and(|i| i.id() == e.target);
                if !ok {
                    return Err(bad(e, "an inode the store does not hold"));
                }
            }
        }
        for e in &entries {
            self.dirents.observe_cookie(e.cookie);
            let p = self
                .dirents
                .admit((dir, d), &e.name, e.target.key(), e.cookie, g, &self.stats)
                .map_err(|_| bad(e, "refused"))?;
            self.dirents.reveal(p, &self.stats, || {});
        }
        Ok(())
    }

    /// Loads every inode a name reaches (nothing, unless the filesystem loads lazily): for
    /// checks of the whole namespace. Each pass loads the directories the last one named.
    pub fn load_all(&self) -> Result<()> {
        if self.lazy.is_none() {
            return Ok(());
        }
        loop {
            let g = crossbeam_epoch::pin();
            let mut missing = Vec::new();
            self.dirents.for_each(|_, _, de| {
                if self.table.get_gen(de.target, &g).is_none() {
                    missing.push(de.target);
                }
            });
            if missing.is_empty() {
                return Ok(());
            }
            let mut any = false;
            for k in missing {
                any |= self.tget(k.ino(), &g)?.is_some_and(|i| i.key() == k);
            }
            if !any {
                // Entries naming inodes that neither the table nor the store has: the check
                // reports them.
                return Ok(());
            }
        }
    }

    /// Inodes loaded from the store so far (0 unless it loads lazily).
    pub fn loaded_inodes(&self) -> u64 {
        self.lazy.as_ref().map_or(0, |l| l.loaded.load(Relaxed))
    }

    /// A store that gave something no store could have written: said once on stderr, EIO.
    fn damaged(&self, what: String) -> Errno {
        eprintln!("lanefs: loading from the store: {what}");
        Errno::EIO
    }
}
