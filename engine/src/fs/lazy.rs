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
//! - **A directory is loaded with its entries**, before it is published: a directory in the
//!   table has every entry of it in the dirent map, and every entry names an inode in the
//!   table or one the store holds. So a lookup that misses in the map means the name does
//!   not exist, as before, and nothing but the table's miss path changes: `dget` and the
//!   ordered index are untouched. An entry holds its target's type
//!   ([`LoadedEntry::kind`]), which is all a plain readdir needs, so a listing loads none of
//!   the inodes it names. While the inode cache's budget has room for them and their
//!   entries, a directory's files come with it, read by the store in one go
//!   ([`Store::load_entries`]); otherwise a file loads when it is first reached by number
//!   (a lookup, a handle), one read each. A subdirectory loads, with its entries, when it
//!   is first reached.
//! - **The store's copy of a number is read only when it is the inode**: once a number was
//!   loaded, made, or freed here, its bit in `seen` is set and a miss on it is a miss (a
//!   freed inode is never brought back from an older checkpoint), until the inode is evicted
//!   ("Eviction", below), which the store then holds as it was. The store's
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
//! # Eviction
//! [`crate::Config::inode_cache`] bounds the inodes in memory ([`INODE_BYTES`] each; the
//! count is the inode quota's, less the store's inodes not in memory) and the directory
//! entries ([`ENTRY_BYTES`] each; counted by each pass over the dirent map's shards, and
//! between passes kept up by directories' loads and drops, not by creates and removals,
//! which would all write one counter). The entries of directories something holds (a handle,
//! the kernel's lookup; the root), which no pass can free, are left out of what a pass works
//! to (counted by the pass that begins over the budget, `Lazy::held_entries`; a directory
//! let go leaves the count at once and makes a pass due if that puts the cache over): a
//! scan through the mount keeps every directory it walked in the kernel, and counted, their
//! entries would put every pass's goal out of reach. When they are a quarter of the budget or
//! more, the pass that counted them asks the kernel, through the installed sink
//! ([`crate::notify::Invalidate::prune`]: FUSE's `FUSE_NOTIFY_PRUNE`), to let go of the
//! inodes it holds by a lookup (at most [`PRUNE_MAX`], files first, then directories; the
//! same when the inodes it holds are that much): it drops those it does not use, and its
//! FORGETs make them evictable (the first makes a pass due). Past the budget, a pass
//! ([`Filesystem::evict_inodes`], run at the start of an operation once one is due: every
//! 64 loads or new inodes over the budget (every load for a budget under 4096 inodes), when
//! a directory's load takes the cache over it, when parked inodes are ready or one went
//! back in the table, or when the store keeps a new checkpoint after a pass that could not
//! get under; a pass that went round the table short of its goal makes growth wait for
//! another quarter of the budget before the next, so that a table of held inodes is not
//! walked every 64 loads, unless the pass gave some inodes their second chance, when the
//! next operation runs another; the cache under its budget clears both waits) walks the
//! table from a clock hand, in steps of at most [`STEP`] inodes that the operations
//! starting meanwhile take in turn, and evicts, until a quarter of the budget is free,
//! inodes that the hand
//! passed once already since they were loaded or made (a second chance, as the kernel's
//! `I_REFERENCED`: a file stat'd once just after its load would otherwise go before it is
//! asked for again), and that are:
//! - not the root, and, a directory, one none of whose entries names an inode in the table
//!   (its files and subdirectories go first: what is in memory stays reachable from what
//!   is in memory, and a directory whose files are being asked for is not read again for
//!   each); its entries go with it ("Directories", below);
//! - **held by names only** ([`Inode::only_named`]): no open handle, no kernel lookup, no
//!   operation holding a reference, not unlinked (a kernel's lookup lasts until it forgets
//!   the inode, under its own memory pressure, so while the cache is three quarters full
//!   or more, a kernel's READDIRPLUS gets names without attributes, which take no lookup:
//!   `readdir.rs`);
//! - **clean**: the epoch an inode is labelled with after each record that changes it (a
//!   directory's entries among it: a create, link, removal or rename labels the directories
//!   whose entries it changes; `label_changed`, from `commit`, read after the append; a new
//!   inode when installed) is
//!   one the store has kept ([`crate::PageEpochs`], as for file pages: `data.rs`), and
//!   none of its pages is only in memory. Nothing is evicted before the store keeps a
//!   checkpoint begun after recovery, which holds the journal the opening replayed (if it
//!   replayed any). A pass that finds only changed inodes to evict asks the store for a
//!   checkpoint ([`crate::PageEpochs::want_checkpoint`]): a store that is mostly read
//!   appends too few records to make one due.
//!
//! Readers hold no reference, so an inode cannot simply be freed: the pass **parks** it
//! (out of the table, into its shard's `parked` map, under the shard's lock) and defers the
//! rest to the end of an epoch grace period, after every guard pinned at the parking is
//! dropped, that is after every operation that could have found the inode in the table.
//! What those did to it they did to the one copy: a miss on a parked number takes it back
//! into the table (under the same lock), a change labels it where it is, a free takes it
//! out of the map. At the end of the grace period the next pass looks again: still only
//! named and clean, it is dropped and its `seen` bit cleared (so the next miss reads the
//! store's copy, which is this inode); otherwise it goes back in the table. So there is
//! never more than one copy of an inode, and a copy read from the store is never older
//! than one dropped: the store is read for a number under its cell, once its `seen` bit is
//! clear, and the bit is cleared only after the drop; a directory's load, which reads its
//! files with its entries, uses a file's copy only if no eviction of that file's shard
//! finished since the read began (else it reads the file again), and an eviction raises
//! its shard's count.
//!
//! ## Directories
//! A directory's entries are reached only through the directory's inode, taken from the
//! table by the operation that reads or changes them, within its epoch guard (a lookup, a
//! path walk, a listing, a rename's walk up `..`: each `tget`s the directory first, as a
//! directory not loaded yet has no entry in the map). So once a parked directory's grace
//! period is over, nothing reads or changes its entries but the thread that ends the
//! parking, and the invariant above ("a directory in the table has every entry") holds
//! with a directory out of the table having none: the ending (`finish_dir_parking`)
//! marks the parked directory `dropping`, checks it again, takes its entries out of the
//! dirent map (without their stripes, since no one else can reach them; the index goes
//! with the directory's body), and
//! only then clears its `seen` bit, so a load that follows finds the map without them. The
//! entries leave without the loads shard's lock (that lock is a leaf), so a miss on the
//! number meanwhile finds it parked and `dropping`, and waits for the end on its shard's
//! condition variable ([`Lazy::unpark`]), after which it finds the directory in the table
//! again (checked again and kept) or reads the store's copy. The wait holds no lock but
//! what the missing operation holds, which ranks above everything the ending takes
//! (`locking.rs`). An open directory handle, or the kernel's lookup, holds the directory,
//! so a listing under way keeps it; a listing resumed by cookie after the directory went
//! meets the same cookies, which the store keeps.
//!
//! # What is not done yet
//! A directory is loaded whole with its entries, and its entries cannot go apart from it
//! (docs/STORE.md, "Not built yet").
//!
//! # Limits
//! The store says at the start what it holds (`recover_lazy`'s counts), and that is counted
//! against the size and inode limits then; a load counts nothing, and freeing a loaded inode
//! gives back what it holds, as for any other.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
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

/// An inode the eviction pass took out of the table, waiting for its grace period, and the
/// pass's token for this parking (an inode parked again is parked with another).
struct Parked {
    inode: *mut Inode,
    token: u64,
    /// A directory whose parking is ending in a drop: its entries are leaving the dirent
    /// map, which its shard's lock is not held for. A miss waits for the end
    /// ([`Lazy::dropped`]) and then finds it in the table again or reads the store's copy.
    dropping: bool,
}

// SAFETY: a parked inode is reachable only through its shard's map, behind the shard's
// mutex: whoever holds it may reinstall or destroy the inode, from any thread (an `Inode`
// is `Send` and `Sync`).
unsafe impl Send for Parked {}

/// One shard of the loads under way and of the parked inodes, by number.
#[derive(Default)]
struct Shard {
    cells: HashMap<u64, Cell>,
    parked: HashMap<u64, Parked>,
    /// Numbers above the store's highest at the opening (made since) that were evicted:
    /// the `seen` bitmap's clear bits, for numbers it does not cover.
    above: std::collections::HashSet<u64>,
}

type LoadingShard = CachePadded<Mutex<Shard>>;

/// What one inode is taken to cost in memory, for [`crate::Config::inode_cache`]: the inode
/// (128 bytes, `inode.rs`), its slot in the table, the allocator's share and a small file's
/// page map.
pub const INODE_BYTES: u64 = 256;

/// What one directory entry loaded from the store is taken to cost, for the same bound: its
/// node in the dirent map (key, name, target, type, cookie), its slot there and its word in
/// the directory's ordered index. About 150 bytes were measured for 10-byte names
/// (docs/BENCHMARKS.md, seed 000).
pub const ENTRY_BYTES: u64 = 128;

/// The eviction pass's own state (see "Eviction" in the module doc), behind its try-lock.
struct Evictor {
    /// Where the last pass stopped (a clock hand over the table).
    hand: u64,
    /// The last parking's token.
    token: u64,
    /// What the pass under way still has to free, in inodes (0: none under way). A pass
    /// runs in steps of at most [`STEP`], one per operation that finds one due, so that
    /// the threads share its work instead of one thread doing all of it.
    goal: u64,
    /// Slots the pass under way has looked at, over its steps: one that has looked at as
    /// many as there are inodes in memory went round the table.
    seen: u64,
    /// Inodes the pass under way gave their second chance.
    young: u64,
}

/// The most inodes a pass asks the kernel to let go of at once.
const PRUNE_MAX: usize = 4096;

/// What a pass found held ([`Filesystem::count_held`]).
#[derive(Default)]
struct Held {
    /// Entries of held directories (the root's among them).
    entries: u64,
    /// Inodes the kernel holds by a lookup, the root aside (counted with a kernel attached).
    kernel_inodes: u64,
    /// What to ask the kernel to let go of: files, then directories with entries.
    prune: Vec<Ino>,
}

/// The most a step of an eviction pass parks, in inodes (a directory's entries included),
/// and the most parkings whose grace period ended that it finishes.
const STEP: u64 = 1024;

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
    /// Inodes evicted so far.
    evicted: AtomicU64,
    /// Of those, directories (with their entries).
    evicted_dirs: AtomicU64,
    /// Evictions so far, by shard: a directory's files read before one of theirs was evicted
    /// are read again (`load_entries`).
    evictions: Box<[AtomicU64]>,
    /// Inodes the store held at the opening.
    store_inodes: u64,
    /// Inodes in memory above which a pass evicts (`u64::MAX`: never).
    budget: u64,
    /// The first epoch whose checkpoint holds the journal replayed at the opening
    /// (`u64::MAX` until recovery ends): nothing is evicted before the store keeps it.
    evict_from: AtomicU64,
    /// The pass's state; try-locked.
    evictor: Mutex<Evictor>,
    /// Parked inodes whose grace period ended: (number, token).
    ready: Arc<Mutex<Vec<(u64, u64)>>>,
    /// A pass is due: the cache is over its budget, or parked inodes are ready.
    due: Arc<AtomicBool>,
    /// The kept epoch a pass that left the cache over its budget saw (`u64::MAX`: none
    /// did): a pass is due again once the store keeps a later one.
    retry_after: AtomicU64,
    /// Inodes in memory below which growth makes no pass due (0: none): set by a pass that
    /// went round the table short of its goal to a quarter of the budget above what it
    /// left, so that a table of inodes held (by handles, or by the kernel) is walked again
    /// once per quarter of the budget loaded or made, not every 64.
    quiet_below: AtomicU64,
    /// Holds of [`Filesystem::hold_eviction`]: no pass parks anything while one is held.
    held_off: AtomicU64,
    /// Directory entries in memory, counted against the budget: the dirent map's length as
    /// the last pass counted it, plus the entries loaded since, less those dropped since.
    entries: AtomicU64,
    /// Of `entries`, those of directories no pass can evict because something holds them (a
    /// handle, the kernel's lookup count; the root), as the last pass counted them: left out
    /// of the load a pass works to, since it cannot free them.
    held_entries: AtomicU64,
    /// Inodes the passes asked the kernel to let go of (`Invalidate::prune`).
    prunes: AtomicU64,
    /// A prune was sent and no FORGET has made a pass due since (`let_go`).
    pruned: AtomicBool,
    /// One per shard of `loading`: notified when a parked directory's drop ends (a miss on
    /// it waits, with the shard's lock).
    dropped: Box<[parking_lot::Condvar]>,
}

impl Lazy {
    /// `max`: the store's highest number; `store_inodes`: the inodes it holds; `cache`: the
    /// bytes of inodes to keep in memory (`None`: no bound).
    pub fn new(max: u64, store_inodes: u64, cache: Option<u64>) -> Lazy {
        Lazy {
            max,
            seen: (0..max / 64 + 1).map(|_| AtomicU64::new(0)).collect(),
            loading: (0..LOADING)
                .map(|_| CachePadded::new(Mutex::new(Shard::default())))
                .collect(),
            inode_hash: Mutex::new(()),
            loaded: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            evicted_dirs: AtomicU64::new(0),
            evictions: (0..LOADING).map(|_| AtomicU64::new(0)).collect(),
            store_inodes,
            budget: cache.map_or(u64::MAX, |b| (b / INODE_BYTES).max(64)),
            evict_from: AtomicU64::new(u64::MAX),
            evictor: Mutex::new(Evictor {
                hand: 0,
                token: 0,
                goal: 0,
                seen: 0,
                young: 0,
            }),
            ready: Arc::default(),
            due: Arc::default(),
            retry_after: AtomicU64::new(u64::MAX),
            quiet_below: AtomicU64::new(0),
            held_off: AtomicU64::new(0),
            entries: AtomicU64::new(0),
            held_entries: AtomicU64::new(0),
            prunes: AtomicU64::new(0),
            pruned: AtomicBool::new(false),
            dropped: (0..LOADING).map(|_| parking_lot::Condvar::new()).collect(),
        }
    }

    /// Recovery is over: what the store keeps from the current epoch on holds the journal
    /// it replayed.
    pub fn recovered(&self, epoch: u64) {
        self.evict_from.store(epoch, SeqCst);
    }

    /// The highest number the store may hold.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// Whether the store's copy of `ino` may still be loaded.
    #[inline]
    fn unseen(&self, ino: Ino) -> bool {
        if ino.0 <= self.max {
            self.seen[(ino.0 / 64) as usize].load(Acquire) & bit(ino) == 0
        } else {
            self.shard(ino).lock().above.contains(&ino.0)
        }
    }

    /// [`Lazy::unseen`] with `ino`'s shard locked (`s`).
    fn unseen_in(&self, s: &Shard, ino: Ino) -> bool {
        if ino.0 <= self.max {
            self.seen[(ino.0 / 64) as usize].load(Acquire) & bit(ino) == 0
        } else {
            s.above.contains(&ino.0)
        }
    }

    /// Marks `ino` as one whose store copy must not be loaded (loaded, made or freed) until
    /// it is evicted ([`Lazy::unsee`]).
    #[inline]
    pub fn see(&self, ino: Ino) {
        if ino.0 <= self.max {
            self.seen[(ino.0 / 64) as usize].fetch_or(bit(ino), Release);
        } else {
            self.shard(ino).lock().above.remove(&ino.0);
        }
    }

    /// Marks `ino`, just evicted, as one whose store copy is to be loaded; `s`: its shard.
    fn unsee(&self, s: &mut Shard, ino: Ino) {
        if ino.0 <= self.max {
            self.seen[(ino.0 / 64) as usize].fetch_and(!bit(ino), SeqCst);
        } else {
            s.above.insert(ino.0);
        }
    }

    fn shard_index(ino: Ino) -> usize {
        (ino.0 as usize).wrapping_mul(0x9E37_79B9) % LOADING
    }

    fn shard(&self, ino: Ino) -> &Mutex<Shard> {
        &self.loading[Self::shard_index(ino)]
    }

    /// Takes `ino` out of the parked inodes of its shard (`s`, locked), if it is there:
    /// after waiting, with the lock, for the end of its drop if it is a directory being
    /// dropped (which leaves it in the table again, or gone, its store copy the one to read).
    fn unpark(&self, s: &mut parking_lot::MutexGuard<'_, Shard>, ino: Ino) -> Option<Parked> {
        while s.parked.get(&ino.0).is_some_and(|p| p.dropping) {
            self.dropped[Self::shard_index(ino)].wait(s);
        }
        s.parked.remove(&ino.0)
    }

    /// A parked inode went back in the table instead of out of memory: a pass that
    /// counted it as on its way out may have stopped short, so the next operation looks
    /// again (cheaply, if the cache is under its budget).
    fn back_in_table(&self) {
        self.due.store(true, Relaxed);
    }

    /// The eviction count of `ino`'s shard.
    fn evictions_of(&self, ino: Ino) -> u64 {
        self.evictions[Self::shard_index(ino)].load(SeqCst)
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
    /// `given`: the inode as the store holds it, read already (a directory's file), with
    /// the eviction count of its shard taken before the read.
    #[cold]
    pub(super) fn load_missing<'g>(
        &self,
        ino: Ino,
        given: Option<(LoadedInode, u64)>,
        g: &'g Guard,
    ) -> Result<Option<&'g Inode>> {
        let Some(lazy) = self.lazy.as_ref() else {
            return Ok(None);
        };
        let before = self.cfg.locking != super::Locking::Lanes;
        let mut given = given;
        loop {
            {
                let _h = before.then(|| self.stats.lock(LockClass::InodeHash, &lazy.inode_hash));
                if let Some(i) = self.table.get(ino, g) {
                    return Ok(Some(i));
                }
                // Parking and unparking happen under the shard's lock, so under it the
                // table and the parked map say where the inode is.
                let mut s = lazy.shard(ino).lock();
                if let Some(p) = lazy.unpark(&mut s, ino) {
                    lazy.back_in_table();
                    // SAFETY: a parked inode is live and owned by the map it was just taken
                    // out of (`Parked`).
                    return Ok(Some(unsafe { self.table.reinstall(p.inode, g) }));
                }
                if !lazy.unseen_in(&s, ino) {
                    // Loaded and in the table, or freed (or never held).
                    return Ok(self.table.get(ino, g));
                }
            }
            // A load that fails publishes nothing and leaves the bit clear: its waiters, which
            // did not fail themselves, try again with a cell of their own (a read error of one
            // thread's is not another's, which may hold the inode already: `given`).
            let cell = lazy
                .shard(ino)
                .lock()
                .cells
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
                // A copy read before an eviction of this shard may be older than the inode
                // evicted (changed, kept, then evicted): read again. Nothing evicts this
                // number while its cell loads it (it is neither in the table nor parked),
                // so the store's copy, read now, is the inode.
                let given = given
                    .take()
                    .filter(|(_, stamp)| *stamp == lazy.evictions_of(ino));
                let l = match given {
                    Some((l, _)) => Some(l),
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
                if m.cells.get(&ino.0).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
                    m.cells.remove(&ino.0);
                }
            }
            match r {
                // Loaded, by this thread or another: look again (it may be parked already).
                Ok(()) => continue,
                Err(e) if ran => return Err(e),
                Err(_) => {}
            }
        }
    }

    /// Publishes inode `l` (a directory with its entries, and its files if they came with
    /// it) as number `ino`, and marks the number seen; the caller holds `ino`'s cell.
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
        self.note_load(lazy);
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
    /// its index, after publishing the inodes of its files if they came with it (module
    /// doc). Nothing is put in the map unless every entry is sound and every file given
    /// loaded, so a load that fails leaves nothing behind, and the next miss tries again
    /// from the start. An entry that names an inode the store does not hold is found when
    /// it is reached (`iget_named`: EIO).
    fn load_entries(&self, dir: crate::id::InoGen, d: &DirBody, g: &Guard) -> Result<()> {
        let lazy = self.lazy.as_ref().expect("a lazy filesystem loads");
        // Room for files while the budget holds them as inodes; a pass leaves the cache at
        // three quarters of it, so a scan's directories come with their files until the
        // next pass is due. Entries are left out of this count: those of directories the
        // kernel holds cannot go, and counted here they would leave no room for files at
        // all, each then read alone (about twice the CPU).
        let room = lazy.budget.saturating_sub(self.inodes_in_memory());
        let stamps: Vec<u64> = lazy.evictions.iter().map(|e| e.load(SeqCst)).collect();
        let mut entries = self.store.load_entries(dir.ino(), room)?;
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
                if l.id != e.target
                    || l.mode & libc::S_IFMT == libc::S_IFDIR
                    || FileType::from_mode(l.mode) != Some(e.kind)
                {
                    return Err(bad(e, "an inode that is not the one named, or a directory"));
                }
                let stamp = stamps[Lazy::shard_index(e.target.ino)];
                let ok = self
                    .load_missing(e.target.ino, Some((l, stamp)), g)?
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
                .admit(
                    (dir, d),
                    &e.name,
                    (e.target.key(), e.kind),
                    e.cookie,
                    g,
                    &self.stats,
                )
                .map_err(|_| bad(e, "refused"))?;
            self.dirents.reveal(p, &self.stats, || {});
        }
        lazy.entries.fetch_add(entries.len() as u64, Relaxed);
        self.check_growth(lazy);
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
    pub(super) fn damaged(&self, what: String) -> Errno {
        eprintln!("lanefs: loading from the store: {what}");
        Errno::EIO
    }
}

// ----- eviction --------------------------------------------------------------------------

impl Filesystem {
    /// Notes that `rec`, just appended, changed the inodes it names (module doc,
    /// "Eviction"): they hold changes the store's checkpoint may not hold yet. New inodes are
    /// labelled when they are installed, after their record (`apply.rs`).
    pub(super) fn label_changed(&self, rec: &crate::Record<'_>) {
        use crate::Record::*;
        let Some(lazy) = self.lazy.as_ref() else {
            return;
        };
        let e = self.page_epochs.label();
        let one = |id: crate::id::InodeId| self.relabel(lazy, id, e);
        // A record that changes a directory's entries labels the directory too: its store
        // copy (entries among it) is the one to read after it is evicted only once that
        // record is kept.
        match *rec {
            Link { dir, inode, .. } | Remove { dir, inode, .. } => {
                one(dir);
                one(inode);
            }
            Create { dir, .. } => one(dir),
            Rename {
                from,
                to,
                inode,
                replaced,
                ..
            }
            | RenameWhiteout {
                from,
                to,
                inode,
                replaced,
                ..
            } => {
                one(from);
                if to != from {
                    one(to);
                }
                one(inode);
                replaced.into_iter().for_each(one);
            }
            SetAttr { inode, .. }
            | Write { inode, .. }
            | Allocate { inode, .. }
            | Punch { inode, .. }
            | SetXattr { inode, .. }
            | SetAcl { inode, .. }
            | RemoveXattr { inode, .. }
            | SetFlags { inode, .. } => one(inode),
            Root { .. } | Tmpfile { .. } | Free { .. } => {}
        }
    }

    /// Labels inode `id` with epoch `e`, in the table or parked (not found: not installed
    /// yet, labelled when it is, or freed).
    fn relabel(&self, lazy: &Lazy, id: crate::id::InodeId, e: u64) {
        let g = crossbeam_epoch::pin();
        if let Some(i) = self.table.get_gen(id.key(), &g) {
            i.relabel(e);
            return;
        }
        let s = lazy.shard(id.ino).lock();
        if let Some(p) = s.parked.get(&id.ino.0) {
            // SAFETY: a parked inode is live while it is in the map, whose lock is held.
            let i = unsafe { &*p.inode };
            if i.id() == id {
                i.relabel(e);
            }
        } else if let Some(i) = self.table.get_gen(id.key(), &g) {
            i.relabel(e);
        }
    }

    /// Labels a new inode, installed after its record was appended.
    pub(super) fn label_new(&self, i: &Inode) {
        if let Some(lazy) = self.lazy.as_ref() {
            i.relabel(self.page_epochs.label());
            // New inodes count as loads do: a pass is due once they take the cache over its
            // budget (checked for one number in 64, cheaply, as numbers come in batches).
            self.note_growth(lazy, i.ino.0);
        }
    }

    /// The inode in slot `ino` if it is in memory (in the table, or parked: taken back),
    /// without loading it: for the kernel's FORGET and the unlinked files' reaper, which
    /// only concern inodes in memory.
    pub(super) fn resident<'g>(&self, ino: Ino, g: &'g Guard) -> Option<&'g Inode> {
        if let Some(i) = self.table.get(ino, g) {
            return Some(i);
        }
        let lazy = self.lazy.as_ref()?;
        let mut s = lazy.shard(ino).lock();
        match lazy.unpark(&mut s, ino) {
            Some(p) => {
                lazy.back_in_table();
                // SAFETY: as in `load_missing`.
                Some(unsafe { self.table.reinstall(p.inode, g) })
            }
            None => self.table.get(ino, g),
        }
    }

    /// Takes inode `i`, whose `DEAD` transition the caller won, out of the table (or out of
    /// the parked ones) and schedules its destruction.
    pub(super) fn unpublish(&self, i: &Inode, g: &Guard) {
        if self.table.try_remove(i, g) {
            return;
        }
        let lazy = self
            .lazy
            .as_ref()
            .expect("only an evicting filesystem takes inodes out of the table");
        let mut s = lazy.shard(i.ino).lock();
        match s.parked.get(&i.ino.0) {
            Some(p) if std::ptr::eq(p.inode, i) => {
                let p = s.parked.remove(&i.ino.0).expect("just seen");
                // SAFETY: the inode is out of the table and now out of the map: nothing
                // reaches it but threads holding guards pinned before, which
                // `defer_destroy` waits for.
                unsafe { g.defer_destroy(crossbeam_epoch::Shared::from(p.inode as *const Inode)) };
            }
            // Unparked since the look above; under the lock it stays in the table.
            _ => assert!(self.table.try_remove(i, g), "inode {} lost", i.ino),
        }
    }

    /// Inodes in memory: those made here and those loaded, less those evicted (the store's
    /// inodes not loaded are counted in the inode quota too).
    pub fn inodes_in_memory(&self) -> u64 {
        let used = self.inode_quota.used();
        match self.lazy.as_ref() {
            None => used,
            Some(l) => {
                // Loads count reloads too, which evictions balance.
                let out = (l.store_inodes + l.evicted.load(Relaxed))
                    .saturating_sub(l.loaded.load(Relaxed));
                used.saturating_sub(out)
            }
        }
    }

    /// Directory entries in memory, as the bounded cache counts them (see `Lazy::entries`;
    /// 0 unless the filesystem loads lazily).
    pub fn entries_in_memory(&self) -> u64 {
        self.lazy.as_ref().map_or(0, |l| l.entries.load(Relaxed))
    }

    /// What the bounded cache holds, in inodes: the inodes in memory and the entries, each
    /// [`ENTRY_BYTES`] of an inode's [`INODE_BYTES`].
    fn cache_load(&self, lazy: &Lazy) -> u64 {
        let entries = lazy.entries.load(Relaxed) * ENTRY_BYTES;
        self.inodes_in_memory() + entries.div_ceil(INODE_BYTES)
    }

    /// What a pass can work on, in inodes: [`Filesystem::cache_load`] less the entries of
    /// held directories (`Lazy::held_entries`). A process that keeps every directory it
    /// walked open in the kernel (`lanefs run` leaves directories to the kernel, and the
    /// kernel keeps its dentries until its own memory pressure) holds more entries than
    /// the budget: counted, they would put every pass's goal out of reach, and each pass
    /// would evict every file it may, the ones a directory's load just brought and the
    /// scan is about to ask for among them.
    fn pass_load(&self, lazy: &Lazy) -> u64 {
        let held = lazy.held_entries.load(Relaxed) * ENTRY_BYTES / INODE_BYTES;
        self.cache_load(lazy).saturating_sub(held)
    }

    /// What no pass may evict for being held, counted over the table: the entries of held
    /// directories, and, while a kernel is attached (`want_prune`), the inodes it holds by a
    /// lookup (the root aside), files first, then directories with entries, at most
    /// [`PRUNE_MAX`] (a directory's dentry is in use while its children's are cached, so
    /// the kernel lets go of the children first: `Filesystem::ask_kernel_to_let_go`).
    fn count_held(&self, want_prune: bool) -> Held {
        let mut g = crossbeam_epoch::pin();
        let mut h = Held::default();
        let mut dirs = Vec::new();
        self.table.for_each_from(Ino(0), &mut g, |i| {
            if i.only_named() && i.ino != Ino::ROOT {
                return true;
            }
            let n = i
                .dir()
                .map_or(0, |d| self.dirents.count(d, &crossbeam_epoch::pin()));
            h.entries += n;
            if want_prune && i.ino != Ino::ROOT && self.watch.held.get(i.ino) > 0 {
                h.kernel_inodes += 1;
                match i.dir() {
                    Some(_) if n > 0 => dirs.push(i.ino),
                    Some(_) => {}
                    None => h.prune.push(i.ino),
                }
            }
            true
        });
        h.prune.truncate(PRUNE_MAX);
        let room = PRUNE_MAX - h.prune.len();
        h.prune.extend(dirs.into_iter().take(room));
        h
    }

    /// Asks the kernel, through `sink`, to let go of what it holds that the last count
    /// found (`h.prune`) when that is a quarter of the budget or more: the entries of
    /// directories it holds, and the inodes it holds. It drops the dentries nothing uses;
    /// its FORGETs make the inodes evictable (`let_go` makes the next pass due).
    fn ask_kernel_to_let_go(&self, lazy: &Lazy, sink: &dyn crate::notify::Invalidate, h: &Held) {
        let held = h.entries * ENTRY_BYTES / INODE_BYTES + h.kernel_inodes;
        if held >= lazy.budget / 4 && !h.prune.is_empty() && sink.prune(&h.prune) {
            lazy.prunes.fetch_add(h.prune.len() as u64, Relaxed);
            lazy.pruned.store(true, Relaxed);
        }
    }

    /// After a handle's close or a FORGET dropped references of `i`: a directory no longer
    /// held leaves `Lazy::held_entries` (its entries as it holds them now; the next pass
    /// counts again), and makes a pass due if what a pass can work on is over the budget,
    /// so that a cache that is only read gets under its budget once the holders let go.
    pub(super) fn let_go(&self, i: &Inode) {
        let Some(lazy) = self.lazy.as_ref() else {
            return;
        };
        // The first FORGET after a prune makes a pass due: what the kernel let go of is
        // evictable now.
        if lazy.pruned.load(Relaxed) && lazy.pruned.swap(false, Relaxed) {
            lazy.quiet_below.store(0, Relaxed);
            lazy.due.store(true, Relaxed);
        }
        let Some(d) = i.dir() else {
            return;
        };
        if lazy.held_entries.load(Relaxed) == 0 || !i.only_named() {
            return;
        }
        let n = self.dirents.count(d, &crossbeam_epoch::pin());
        let _ = lazy
            .held_entries
            .fetch_update(Relaxed, Relaxed, |h| Some(h.saturating_sub(n)));
        if self.pass_load(lazy) > lazy.budget {
            lazy.quiet_below.store(0, Relaxed);
            lazy.due.store(true, Relaxed);
        }
    }

    /// Inodes (files, and directories with their entries) the eviction passes asked the
    /// kernel to let go of (a prune: see [`crate::notify::Invalidate::prune`]).
    pub fn inodes_pruned(&self) -> u64 {
        self.lazy.as_ref().map_or(0, |l| l.prunes.load(Relaxed))
    }

    /// Entries of held directories, as the last pass counted them
    /// (`Lazy::held_entries`): in [`Filesystem::entries_in_memory`], but no pass works to
    /// free them.
    pub fn held_entries(&self) -> u64 {
        self.lazy
            .as_ref()
            .map_or(0, |l| l.held_entries.load(Relaxed))
    }

    /// The bytes the bounded cache counts as held: inodes and directory entries.
    pub fn inode_cache_bytes(&self) -> u64 {
        self.inodes_in_memory() * INODE_BYTES + self.entries_in_memory() * ENTRY_BYTES
    }

    /// Inodes evicted so far.
    pub fn inodes_evicted(&self) -> u64 {
        self.lazy.as_ref().map_or(0, |l| l.evicted.load(Relaxed))
    }

    /// Of [`Filesystem::inodes_evicted`], directories, each with its entries.
    pub fn directories_evicted(&self) -> u64 {
        self.lazy
            .as_ref()
            .map_or(0, |l| l.evicted_dirs.load(Relaxed))
    }

    /// The bound on inodes in memory ([`crate::Config::inode_cache`]), if this filesystem
    /// evicts (a lazily opened store).
    pub fn inode_budget(&self) -> Option<u64> {
        self.lazy
            .as_ref()
            .map(|l| l.budget)
            .filter(|&b| b != u64::MAX)
    }

    /// After a load: a pass is due if the cache is over its budget (checked every 64 loads).
    fn note_load(&self, lazy: &Lazy) {
        self.note_growth(lazy, lazy.loaded.load(Relaxed));
    }

    /// One more inode in memory, `n` a number that changes with each (a load count, an inode
    /// number): a pass is due if the cache is over its budget, looked at for one `n` in 64.
    fn note_growth(&self, lazy: &Lazy, n: u64) {
        // One in 64 (at most a sixty-fourth of the budget over it before a pass is due).
        if n % (lazy.budget / 64).clamp(1, 64) == 0 {
            self.check_growth(lazy);
        }
    }

    /// A pass is due if the cache is over its budget (and past `quiet_below`).
    fn check_growth(&self, lazy: &Lazy) {
        if lazy.budget != u64::MAX {
            let m = self.cache_load(lazy);
            if m > lazy.budget && m >= lazy.quiet_below.load(Relaxed) {
                lazy.due.store(true, Relaxed);
            }
        }
    }

    /// Whether the inode cache is bounded and at least three quarters full, entries counted
    /// (where a pass leaves it): a kernel caller's `READDIRPLUS` then gets entries without attributes,
    /// which take no lookup reference (`readdir.rs`), since every inode the kernel holds
    /// stays in memory until it forgets it, which it does only under its own memory
    /// pressure.
    pub(super) fn cache_tight(&self) -> bool {
        self.lazy
            .as_ref()
            .is_some_and(|l| l.budget != u64::MAX && self.cache_load(l) >= l.budget - l.budget / 4)
    }

    /// Runs an eviction pass if one is due: called at the start of an operation, with no
    /// lock held.
    #[inline]
    pub(super) fn evict_if_due(&self) {
        if let Some(l) = self.lazy.as_ref() {
            let r = l.retry_after.load(Relaxed);
            if l.due.load(Relaxed) || r != u64::MAX && r != self.page_epochs.kept_epoch() {
                self.evict_inodes(false);
            }
        }
    }

    /// One eviction pass (module doc, "Eviction"): finishes the parkings whose grace period
    /// ended, then, over the budget (or, with `all`, whatever the budget), parks inodes
    /// until a quarter of the budget is free. Returns the inodes evicted. A thread that
    /// finds another's pass running leaves it the work.
    pub fn evict_inodes(&self, all: bool) -> u64 {
        let Some(lazy) = self.lazy.as_ref() else {
            return 0;
        };
        let Some(mut ev) = lazy.evictor.try_lock() else {
            return 0;
        };
        lazy.due.store(false, Relaxed);
        // Hands this thread's deferred work (a grace period's end among it) to the epoch
        // collector, and collects what is due.
        crossbeam_epoch::pin().flush();
        let kept = self.page_epochs.kept_epoch();
        let before = lazy.evicted.load(Relaxed);
        let ready = {
            let mut r = lazy.ready.lock();
            let keep = if all {
                0
            } else {
                r.len().saturating_sub(STEP as usize)
            };
            let ready = r.split_off(keep);
            if !r.is_empty() {
                lazy.due.store(true, Relaxed);
            }
            ready
        };
        for (ino, token) in ready {
            self.finish_parking(lazy, Ino(ino), token, kept);
        }
        if lazy.held_off.load(SeqCst) > 0 {
            ev.goal = 0;
        }
        if ev.goal > 0 && !all {
            // The next step of the pass under way.
            return self.evict_step(lazy, &mut ev, kept, false, before);
        }
        // Parked inodes still count as in memory until their grace period ends; they are
        // on their way out, so a pass parks only what goes beyond them (one that goes back
        // in the table makes a pass due again: `Lazy::back_in_table`).
        let pending: u64 = lazy
            .loading
            .iter()
            .map(|s| s.lock().parked.len() as u64)
            .sum();
        // Under the budget: nothing to do, and nothing to wait for. Under it once the
        // parked inodes go: their grace period's end makes the next pass due (and one that
        // goes back in the table makes one due too), so what the last pass said to wait
        // for (`retry_after`, `quiet_below`) still holds.
        let under = |fs: &Self| {
            let load = fs.cache_load(lazy);
            if load <= lazy.budget {
                lazy.retry_after.store(u64::MAX, Relaxed);
                lazy.quiet_below.store(0, Relaxed);
            }
            load.saturating_sub(pending) <= lazy.budget
        };
        if !all && under(self) {
            return lazy.evicted.load(Relaxed) - before;
        }
        // Over, as far as the count says: the entries as the map holds them now. Loads add
        // to the count and drops take from it, but creates and removals in loaded
        // directories do not (they would all write one shared counter), so a pass counts
        // again.
        lazy.entries.store(self.dirents.total(), Relaxed);
        if !all && under(self) {
            return lazy.evicted.load(Relaxed) - before;
        }
        // Over, but perhaps only by entries of held directories, which no pass can free
        // (`Filesystem::pass_load`): then nothing to do until another quarter of the budget
        // comes in (growth is checked against everything counted, so that a directory let
        // go since is counted again at the next pass).
        let sink = self.watch.installed();
        let held = self.count_held(sink.is_some());
        lazy.held_entries.store(held.entries, Relaxed);
        if let Some(sink) = sink {
            self.ask_kernel_to_let_go(lazy, &*sink, &held);
        }
        let load = self.pass_load(lazy);
        if !all && load.saturating_sub(pending) <= lazy.budget {
            if load <= lazy.budget {
                lazy.retry_after.store(u64::MAX, Relaxed);
                lazy.quiet_below
                    .store(self.cache_load(lazy) + lazy.budget / 4, Relaxed);
            }
            return lazy.evicted.load(Relaxed) - before;
        }
        let resident = load.saturating_sub(pending);
        lazy.retry_after.store(u64::MAX, Relaxed);
        if lazy.held_off.load(SeqCst) > 0 {
            lazy.retry_after.store(kept, Relaxed);
            return lazy.evicted.load(Relaxed) - before;
        }
        if kept < lazy.evict_from.load(SeqCst) {
            // Again once the store keeps a checkpoint, which may not come of itself (a
            // store that is only read appends few records).
            lazy.retry_after.store(kept, Relaxed);
            self.page_epochs.want_checkpoint();
            return lazy.evicted.load(Relaxed) - before;
        }
        let target = if all {
            0
        } else {
            lazy.budget - lazy.budget / 4
        };
        ev.goal = resident.saturating_sub(target);
        (ev.seen, ev.young) = (0, 0);
        self.evict_step(lazy, &mut ev, kept, all, before)
    }

    /// One step of the pass under way (all of it with `all`): parks up to [`STEP`] inodes'
    /// worth of what `ev.goal` asks for; returns the inodes evicted since `before`.
    fn evict_step(&self, lazy: &Lazy, ev: &mut Evictor, kept: u64, all: bool, before: u64) -> u64 {
        let step = if all { ev.goal } else { ev.goal.min(STEP) };
        let mut want = step;
        // A step looks at a bounded number of slots, so that it never holds up the
        // operation that runs it for long; the next due step goes on from the hand.
        let look0 = if all { u64::MAX } else { want * 4 + 4096 };
        let mut look = look0;
        let mut parked = Vec::new();
        let mut dirty = false;
        // Inodes given their second chance by this step.
        let mut young = 0u64;
        let mut g = crossbeam_epoch::pin();
        let stopped = self.table.for_each_from(Ino(ev.hand), &mut g, |i| {
            if want == 0 || look == 0 {
                return false;
            }
            look -= 1;
            dirty |= i.label() > kept && i.only_named();
            // A second chance for what came in since the hand last passed (`all`: none).
            if i.pass_young() && !all {
                young += 1;
                return true;
            }
            if self.evictable(i, kept) {
                // What it frees: itself, and a directory its entries.
                let frees = 1 + i.dir().map_or(0, |d| {
                    self.dirents.count(d, &crossbeam_epoch::pin()) * ENTRY_BYTES / INODE_BYTES
                });
                let mut s = lazy.shard(i.ino).lock();
                // SAFETY of the pointer: `detach` gives it to the map, which owns it now.
                // The guard is `for_each_from`'s, which is pinned here.
                let g = crossbeam_epoch::pin();
                if let Some(p) = self.table.detach(i, &g) {
                    ev.token += 1;
                    s.parked.insert(
                        i.ino.0,
                        Parked {
                            inode: p,
                            token: ev.token,
                            dropping: false,
                        },
                    );
                    parked.push((i.ino.0, ev.token));
                    want = want.saturating_sub(frees);
                }
            }
            true
        });
        ev.hand = stopped.map_or(ev.hand, |i| i.0 + 1);
        ev.goal -= step - want;
        ev.seen = ev.seen.saturating_add(look0 - look);
        ev.young += young;
        // Round the whole table: in this step, or over the pass's steps.
        let round = want > 0 && look > 0 || ev.seen >= self.inodes_in_memory();
        if ev.goal == 0 {
            lazy.quiet_below.store(0, Relaxed);
        } else if !round {
            // More to do: the next step, run by the next operation to start.
            lazy.due.store(true, Relaxed);
        } else if ev.young >= ev.goal {
            // Round the table and still over, but the inodes given their second chance by
            // this pass would do: the next pass may take them, and nothing else would make
            // one due in a store that is only read (no checkpoint comes, no growth).
            ev.goal = 0;
            lazy.due.store(true, Relaxed);
        } else {
            ev.goal = 0;
            // Round the whole table and still over: what is left is held (by handles, by
            // the kernel: a directory it holds keeps its entries), or changed since the
            // kept checkpoint; again once the store keeps another, asked for if that would
            // let some go, or once another quarter of the budget came in.
            lazy.retry_after.store(kept, Relaxed);
            lazy.quiet_below
                .store(self.cache_load(lazy) + lazy.budget / 4, Relaxed);
            if dirty {
                self.page_epochs.want_checkpoint();
            }
        }
        if !parked.is_empty() {
            // The grace period: every guard pinned now (each operation that may hold a
            // parked inode) is dropped before this runs.
            let (ready, due) = (lazy.ready.clone(), lazy.due.clone());
            g.defer(move || {
                ready.lock().extend(parked);
                due.store(true, Relaxed);
            });
            g.flush();
        }
        lazy.evicted.load(Relaxed) - before
    }

    /// Whether `i` may be parked: an inode other than the root that only names hold, whose
    /// last change the store keeps, with no page in memory that the store does not hold
    /// (those that it holds are sent out first), and, a directory, none of whose entries
    /// names an inode in the table (directories go after what they name, so that what is
    /// in memory stays reachable from what is in memory, and a directory whose files are
    /// asked for is not read again for each).
    fn evictable(&self, i: &Inode, kept: u64) -> bool {
        if i.ino == Ino::ROOT || !i.only_named() || i.label() > kept {
            return false;
        }
        match &i.body {
            Body::Dir(d) => {
                let g = crossbeam_epoch::pin();
                let mut any = false;
                self.dirents
                    .for_each_target(i.key(), d, &g, &self.stats, |target| {
                        any = self.table.get(target.ino(), &g).is_some();
                        !any
                    });
                !any
            }
            Body::File(data) => match data.try_write() {
                Some(mut d) => {
                    d.evict(kept, &self.page_epochs);
                    d.all_kept()
                }
                None => false,
            },
            _ => true,
        }
    }

    /// Ends the parking `token` of inode `ino` once its grace period is over: no operation
    /// that found the inode in the table before it was parked is still running, so what
    /// they did to it is done. If it is still only named, unchanged since the store's kept
    /// epoch and without pages in memory, it goes (the store's copy is it); otherwise it
    /// goes back in the table. A parking already ended (a miss took the inode back, or a
    /// free took it) is skipped.
    fn finish_parking(&self, lazy: &Lazy, ino: Ino, token: u64, kept: u64) {
        let g = crossbeam_epoch::pin();
        // The xattr shard first: a change holds it when it labels an inode, which may take
        // the loads shard (`relabel`).
        let mut xattrs = self.xattrs.lock(ino, &self.stats);
        let mut s = lazy.shard(ino).lock();
        if s.parked.get(&ino.0).is_none_or(|p| p.token != token) {
            return;
        }
        let p = s.parked.get_mut(&ino.0).expect("just seen");
        // SAFETY: a parked inode is live while it is in the map, whose lock is held.
        if unsafe { &*p.inode }.is_dir() {
            // Marked under the lock that found it parked: from here a miss waits for the
            // end instead of taking it back.
            p.dropping = true;
            let ptr = p.inode;
            drop((s, xattrs));
            return self.finish_dir_parking(lazy, ino, ptr, kept);
        }
        let p = s.parked.remove(&ino.0).expect("just seen");
        // SAFETY: live and owned by this thread since it left the map (`Parked`).
        let i = unsafe { &*p.inode };
        if !self.evictable(i, kept) {
            lazy.back_in_table();
            // SAFETY: as above; its slot is empty (a miss would have taken it out of the map).
            unsafe { self.table.reinstall(p.inode, &g) };
            return;
        }
        if i.attr.flags() & flags::XATTRS != 0 {
            xattrs.remove(&ino);
        }
        if let Body::File(data) = &i.body {
            // Every page is the store's or a run of zeros: nothing to give back but the
            // counts of pages out of memory. Try-locked, as `file_data` ranks above the
            // `xattr` shard held here; nothing else can hold it, as nothing reaches the inode.
            data.try_write()
                .expect("an unreachable inode's data lock is free")
                .clear(&self.page_epochs);
        }
        // The number's store copy is this inode from now on: the next miss reads it.
        lazy.unsee(&mut s, ino);
        lazy.evictions[Lazy::shard_index(ino)].fetch_add(1, SeqCst);
        lazy.evicted.fetch_add(1, Relaxed);
        drop((s, xattrs));
        // SAFETY: out of the table and the map for longer than the grace period: nothing
        // else holds it.
        drop(unsafe { Owned::from_raw(p.inode) });
    }

    /// [`Filesystem::finish_parking`] for a directory (`ptr`), whose parking is still
    /// current and which the caller marked `dropping` under the shard's lock that found it
    /// parked: its entries leave the dirent map before its store copy may be read, without
    /// the shard's lock (they take the map's and the index's), so the directory stays
    /// parked, and a miss on it waits for the end ([`Lazy::unpark`]).
    fn finish_dir_parking(&self, lazy: &Lazy, ino: Ino, ptr: *mut Inode, kept: u64) {
        let g = crossbeam_epoch::pin();
        let end = |s: &mut parking_lot::MutexGuard<'_, Shard>| {
            s.parked
                .remove(&ino.0)
                .expect("nothing unparks a dropping inode");
            lazy.dropped[Lazy::shard_index(ino)].notify_all();
        };
        // SAFETY: parked, so live, and nothing but this thread takes it out of the map
        // while it is dropping (`Parked`).
        let i = unsafe { &*ptr };
        if !self.evictable(i, kept) {
            lazy.back_in_table();
            let mut s = lazy.shard(ino).lock();
            end(&mut s);
            // SAFETY: as above; its slot is empty (a miss waits while it is dropping).
            unsafe { self.table.reinstall(ptr, &g) };
            return;
        }
        // Nothing reaches the directory (its grace period is over, and a miss waits), so no
        // other thread reads or changes its entries: they go without their stripes.
        let d = i.dir().expect("a directory");
        // SAFETY: nothing else reaches the directory (above), and this thread destroys it
        // below without reading its index.
        let gone = unsafe { self.dirents.forget_dir(i.key(), d, &g, &self.stats) };
        let mut xattrs = self.xattrs.lock(ino, &self.stats);
        let mut s = lazy.shard(ino).lock();
        if i.attr.flags() & flags::XATTRS != 0 {
            xattrs.remove(&ino);
        }
        lazy.unsee(&mut s, ino);
        lazy.evictions[Lazy::shard_index(ino)].fetch_add(1, SeqCst);
        lazy.evicted.fetch_add(1, Relaxed);
        lazy.evicted_dirs.fetch_add(1, Relaxed);
        let _ = lazy
            .entries
            .fetch_update(Relaxed, Relaxed, |e| Some(e.saturating_sub(gone)));
        end(&mut s);
        drop((s, xattrs));
        // SAFETY: out of the table and the map for longer than the grace period: nothing
        // else holds it.
        drop(unsafe { Owned::from_raw(ptr) });
    }

    /// Holds eviction off until the returned hold is dropped, with every parked inode back
    /// in the table: for checks that walk the whole table ([`Filesystem::check_invariants`]).
    pub fn hold_eviction(&self) -> EvictionHold<'_> {
        if let Some(lazy) = self.lazy.as_ref() {
            let _ev = lazy.evictor.lock();
            lazy.held_off.fetch_add(1, SeqCst);
            let g = crossbeam_epoch::pin();
            for shard in lazy.loading.iter() {
                let mut s = shard.lock();
                for (_, p) in s.parked.drain() {
                    // SAFETY: as in `load_missing`.
                    unsafe { self.table.reinstall(p.inode, &g) };
                }
            }
        }
        EvictionHold { fs: self }
    }
}

impl Drop for Lazy {
    fn drop(&mut self) {
        for shard in self.loading.iter() {
            for (_, p) in shard.lock().parked.drain() {
                // SAFETY: the filesystem is being dropped, so no operation runs and nothing
                // but this map holds a parked inode (`Parked`).
                drop(unsafe { Owned::from_raw(p.inode) });
            }
        }
    }
}

/// Eviction held off ([`Filesystem::hold_eviction`]) while it lives.
pub struct EvictionHold<'a> {
    fs: &'a Filesystem,
}

impl Drop for EvictionHold<'_> {
    fn drop(&mut self) {
        if let Some(lazy) = self.fs.lazy.as_ref() {
            lazy.held_off.fetch_sub(1, SeqCst);
        }
    }
}
