//! Directory entries: two filesystem-wide structures over one allocation per entry, no
//! per-directory container.
//!
//! Each entry is one heap **node** (`node.rs`): what it names (an [`InoGen`]), its cookie,
//! and its key, the parent directory's [`InoGen`] followed by the name. Keying by the
//! parent's generation as well as its number means an operation that resolved a directory
//! can never touch the entries of another directory that took the number later.
//!
//! 1. The **dirent map**, keyed by the node's key, owns the node. It is `NMAP` shards, each a
//!    `hashbrown::HashTable` (8 bytes a slot) under a read-write lock, picked by bits 32..44
//!    of the key's hash (the table itself uses the low bits and the top seven). A lookup
//!    read-locks one shard, the only lock it takes; with 4096 shards, threads working on
//!    different names rarely share one. A removed entry is freed at once (no epoch-deferred
//!    slots, which pile up under create/unlink churn of one name).
//! 2. The **ordered index** (`index.rs`): per directory, one run of entries per thread slot
//!    that inserted there, in cookie order, with a lock-free count. It gives readdir its
//!    stable order and resumable offsets, the removal protocol (`life.rs`) its emptiness
//!    test, and `stat` a directory's size.
//!
//! Why by hand: see `node.rs`. The map's shards are plain `RwLock<HashTable>` rather than a
//! concurrent map crate: `scc::HashMap`'s bucket locks spin for 32 µs on a preempted holder,
//! which cost crunl 12% of its CPU with 32 threads on 2 cores (docs/results/HISTORY.md).
//!
//! # The moment a change is visible
//! Lookups see the map only. A create first **admits** its entry into the index (the
//! creating half of the removal protocol: after it, no removal of the directory can succeed
//! until the entry goes again), then **reveals** it in the map. A removal takes the entry out
//! of the map first, then out of the index. A rename makes all its map changes, and the link
//! count and `..` changes that go with them, while holding the map shards of both names
//! write-locked, so a lookup of either name sees the rename entirely or not at all.
//!
//! # Cookies
//! An entry's cookie is its readdir offset: `((slot + 1) << 48) | seq`, where `seq` comes from
//! a per-slot counter of the inserting thread, so no counter is shared by threads creating in
//! one directory, and a cookie is never reused while the filesystem lives (Linux tmpfs gives
//! the same guarantee since 6.6), with one exception: the whiteout a `RENAME_WHITEOUT` leaves
//! takes over the cookie, and the index place, of the entry it replaces ([`Dirents::heir`]),
//! so that a read which has returned that name never returns it again at a later cookie.
//! At any moment, one directory's entries have distinct cookies. Records carry cookies, so
//! recovery restores them and [`Dirents::observe_cookie`] keeps the counters above them.
//! Offsets 1 and 2 are `.` and `..`. Readdir walks the runs in slot order, each in cookie
//! order, which is cookie order.
//!
//! # The end of a directory read
//! A read that starts from offset 0 records, for every slot, the last cookie that slot has
//! handed out ([`ReadEnd`]); it then skips entries with later cookies. An entry created after
//! the read started (a name renamed away and back, say) is not returned by that read, which
//! therefore ends, and returns each entry present throughout exactly once (what tmpfs does
//! by recording the directory's end offset at the start of the read).

mod body;
mod index;
pub(crate) mod life;
mod node;

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crossbeam_epoch::Guard;
use crossbeam_utils::CachePadded;
use hashbrown::HashTable;
use parking_lot::{Mutex, RwLock};
use smallvec::SmallVec;

use crate::attr::FileType;
use crate::errno::Result;
use crate::id::InoGen;
use crate::slots::{NSLOTS, PerSlot, current};
use crate::stats::{LockClass, Stats};

pub(crate) use body::DirBody;
pub(crate) use index::{RunSet, Runs};
pub(crate) use life::{Found, Removal};
pub use node::NAME_MAX;
pub(crate) use node::{Dirent, Name};
use node::{Entry, node_key};

/// First cookie of a real entry; 1 and 2 are `.` and `..`.
pub const FIRST_COOKIE: u64 = 1 << 48;
const SEQ_MASK: u64 = FIRST_COOKIE - 1;

/// Whether `cookie` is one an entry can have: its top 16 bits name one of the [`NSLOTS`]
/// slots (1 to 64; 0 is `.` and `..`). What replay is given is checked against it, so that
/// a damaged record is refused rather than indexing past the slots.
pub fn valid_cookie(cookie: u64) -> bool {
    (1..=NSLOTS as u64).contains(&(cookie >> 48))
}
/// Shards of the ordered index's locks.
const NINDEX: usize = 256;
/// Shards of the dirent map.
const NMAP: usize = 4096;
const _: () = assert!(NINDEX >= NSLOTS && NINDEX.is_power_of_two() && NMAP.is_power_of_two());

type MapShard = CachePadded<RwLock<HashTable<Entry>>>;

/// An entry not yet visible, owned by the thread making it until it is revealed or
/// cancelled: admitted into its directory's index, or (an heir, [`Dirents::heir`]) waiting to
/// take the index place of the entry it replaces.
pub(crate) struct Pending {
    entry: Entry,
    parent: InoGen,
    indexed: bool,
}

impl Pending {
    pub fn cookie(&self) -> u64 {
        self.entry.node().cookie()
    }
}

/// Where a directory read ends: the last cookie each slot had handed out when it started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ReadEnd {
    mask: u64,
    last: SmallVec<[u64; 4]>,
}

impl ReadEnd {
    /// Whether `cookie` was handed out before the read started.
    fn covers(&self, cookie: u64) -> bool {
        let slot = slot_of(cookie);
        let bit = 1u64 << slot;
        if self.mask & bit == 0 {
            return false;
        }
        let i = (self.mask & (bit - 1)).count_ones() as usize;
        cookie <= self.last[i]
    }
}

/// How a rename changes the map (see [`Dirents::rename_visible`]).
pub(crate) enum RenameMap {
    /// The target name was free: the pending entry appears there, the source goes.
    Move(Pending),
    /// The target name is pointed at the source's inode in place, the source goes.
    Replace,
    /// The two names swap what they name.
    Exchange,
}

pub(crate) struct Dirents {
    hasher: foldhash::fast::RandomState,
    map: Box<[MapShard]>,
    index: Box<[CachePadded<Mutex<()>>]>,
    cookie_seq: PerSlot<AtomicU64>,
}

#[inline]
fn index_shard(dir: InoGen, slot: usize) -> usize {
    let h = (dir.raw().wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize;
    (h + slot) & (NINDEX - 1)
}

#[inline]
fn slot_of(cookie: u64) -> usize {
    debug_assert!(cookie >= FIRST_COOKIE);
    ((cookie >> 48) - 1) as usize
}

#[inline]
fn slot_base(slot: usize) -> u64 {
    (slot as u64 + 1) << 48
}

impl Dirents {
    pub fn new() -> Self {
        Dirents {
            hasher: Default::default(),
            map: (0..NMAP)
                .map(|_| CachePadded::new(RwLock::new(HashTable::new())))
                .collect(),
            index: (0..NINDEX)
                .map(|_| CachePadded::new(Mutex::new(())))
                .collect(),
            cookie_seq: PerSlot::new(|_| AtomicU64::new(0)),
        }
    }

    /// The hash of the key `(parent, name)`, fed to the hasher without building the key.
    #[inline]
    fn hash(&self, parent: InoGen, name: &[u8]) -> u64 {
        debug_assert!(name.len() <= NAME_MAX);
        let mut h = self.hasher.build_hasher();
        h.write(&parent.raw().to_le_bytes());
        h.write(name);
        h.finish()
    }

    #[inline]
    fn shard_index(hash: u64) -> usize {
        (hash >> 32) as usize & (NMAP - 1)
    }

    /// The entry `name` in `parent`.
    #[inline]
    pub fn get(&self, parent: InoGen, name: &[u8], stats: &Stats) -> Option<Dirent> {
        let h = self.hash(parent, name);
        let shard = stats.read(LockClass::DirentShard, &self.map[Self::shard_index(h)]);
        shard.find(h, |e| e.is(parent, name)).map(Entry::dirent)
    }

    /// A new cookie from the calling thread's slot.
    pub fn next_cookie(&self) -> u64 {
        let slot = current();
        // A read-modify-write: two threads sharing a slot must still get distinct cookies.
        let seq = self.cookie_seq.get(slot).fetch_add(1, Relaxed) + 1;
        assert!(seq <= SEQ_MASK, "cookie space of slot {slot} exhausted");
        slot_base(slot) | seq
    }

    /// Cookie `k` (0, 1, ...) of a range of the calling thread's slot far beyond any it has
    /// handed out (2^36 ahead), for the names recovery makes and removes at once (orphans',
    /// `fs/recovery.rs`): the records replayed after them cannot carry one, since they were
    /// made by a filesystem whose slots had handed out fewer cookies since the checkpoint it
    /// was loaded from. Nothing is taken: the slot's next cookie stays where it is, and
    /// [`Dirents::cookie_mark`] and [`Dirents::reset_cookie`] undo what applying the name
    /// observed of it, so that no cookie space is spent for good (a store with thousands of
    /// orphans would use a slot up).
    pub fn cookie_far_ahead(&self, k: u64) -> u64 {
        let slot = current();
        let seq = (self.cookie_seq.get(slot).load(Relaxed) + (1 << 36)).saturating_add(k);
        assert!(seq <= SEQ_MASK, "cookie space of slot {slot} exhausted");
        slot_base(slot) | seq
    }

    /// The calling thread's slot and where its cookies are (for [`Dirents::reset_cookie`]).
    pub fn cookie_mark(&self) -> (usize, u64) {
        let slot = current();
        (slot, self.cookie_seq.get(slot).load(Relaxed))
    }

    /// Puts slot `slot`'s cookies back to `seq` (recovery, after an orphan's passing name:
    /// nothing else ran meanwhile).
    pub fn reset_cookie(&self, (slot, seq): (usize, u64)) {
        self.cookie_seq.get(slot).store(seq, Relaxed);
    }

    /// Records that `cookie` exists (recovery): its slot's later cookies come after it.
    pub fn observe_cookie(&self, cookie: u64) {
        self.cookie_seq
            .get(slot_of(cookie))
            .fetch_max(cookie & SEQ_MASK, Relaxed);
    }

    /// Admits `name -> target` (an inode and its type) with `cookie` into directory
    /// `parent` (body `dir`): the creating half of the removal protocol (`life.rs`). The
    /// caller holds the stripe of `(parent, name)` and has seen the name absent. ENOENT if
    /// the directory was removed.
    pub fn admit(
        &self,
        (parent, dir): (InoGen, &DirBody),
        name: &[u8],
        target: (InoGen, FileType),
        cookie: u64,
        g: &Guard,
        stats: &Stats,
    ) -> Result<Pending> {
        let entry = Entry::new(parent, name, target, cookie);
        let slot = slot_of(cookie);
        let lock = &self.index[index_shard(parent, slot)];
        life::admit(
            &dir.life,
            || {
                let _s = stats.lock(LockClass::IndexShard, lock);
                // SAFETY: we hold the slot's index-shard lock in this directory (C1, C2).
                unsafe { dir.runs.run_for(slot, g).insert(entry.word(), cookie) };
            },
            |()| self.unindex(parent, dir, cookie, g, stats),
        )
        .map(|()| Pending {
            entry,
            parent,
            indexed: true,
        })
    }

    /// An entry `name -> target` in directory `parent` that will take the place of the
    /// entry of that name, `cookie` included, in a rename's visible moment (the whiteout of
    /// `RENAME_WHITEOUT`; [`Dirents::rename_visible`]). It is not admitted: it inherits the
    /// counted index place of the entry it replaces, so the directory's entry count never
    /// changes, and a read that has returned that name never meets it again at another
    /// cookie.
    pub fn heir(
        &self,
        parent: InoGen,
        name: &[u8],
        target: (InoGen, FileType),
        cookie: u64,
    ) -> Pending {
        Pending {
            entry: Entry::new(parent, name, target, cookie),
            parent,
            indexed: false,
        }
    }

    /// Takes a pending entry back (its operation failed before it became visible).
    pub fn cancel(&self, p: Pending, dir: &DirBody, g: &Guard, stats: &Stats) {
        if p.indexed {
            self.unindex(p.parent, dir, p.cookie(), g, stats);
        }
    }

    /// Makes an admitted entry visible; `inside` runs while its map shard is write-locked
    /// (nothing else the change implies is then visible before the name).
    pub fn reveal(&self, p: Pending, stats: &Stats, inside: impl FnOnce()) {
        debug_assert!(p.indexed, "an heir is revealed by its rename");
        let Pending { entry, parent, .. } = p;
        let h = self.hash(parent, entry.name());
        let mut shard = stats.write(LockClass::DirentShard, &self.map[Self::shard_index(h)]);
        let hasher = |e: &Entry| self.hash(e.parent(), e.name());
        match shard.entry(h, |e| e.is(parent, entry.name()), hasher) {
            hashbrown::hash_table::Entry::Vacant(v) => {
                v.insert(entry);
            }
            hashbrown::hash_table::Entry::Occupied(_) => {
                panic!("name published twice under its stripe lock")
            }
        }
        inside();
    }

    /// Removes `name` from `parent` (body `dir`): from the map first (the visible moment;
    /// `inside` runs then, with the shard still locked), then from the index.
    pub fn remove(
        &self,
        parent: InoGen,
        dir: &DirBody,
        name: &[u8],
        g: &Guard,
        stats: &Stats,
        inside: impl FnOnce(Dirent),
    ) -> Option<Dirent> {
        let h = self.hash(parent, name);
        let entry = {
            let mut shard = stats.write(LockClass::DirentShard, &self.map[Self::shard_index(h)]);
            let found = shard.find_entry(h, |e| e.is(parent, name)).ok()?;
            let e = found.remove().0;
            inside(e.dirent());
            e
        };
        let de = entry.dirent();
        self.unindex(parent, dir, de.cookie, g, stats);
        drop(entry);
        Some(de)
    }

    /// Takes the entry with `cookie` out of directory `parent`'s index.
    fn unindex(&self, parent: InoGen, dir: &DirBody, cookie: u64, g: &Guard, stats: &Stats) {
        // SAFETY: `in_run` holds the run's shard lock while this runs.
        self.in_run(parent, dir, cookie, g, stats, |run| unsafe {
            run.remove(cookie)
        });
    }

    /// Runs `f` on the run that holds `cookie` in directory `parent`, under its shard lock.
    fn in_run(
        &self,
        parent: InoGen,
        dir: &DirBody,
        cookie: u64,
        g: &Guard,
        stats: &Stats,
        f: impl FnOnce(&index::Run),
    ) {
        let slot = slot_of(cookie);
        let _s = stats.lock(
            LockClass::IndexShard,
            &self.index[index_shard(parent, slot)],
        );
        let run = dir
            .runs
            .load(g)
            .and_then(|s| s.get(slot))
            .unwrap_or_else(|| panic!("no run of slot {slot} in directory {parent:?}"));
        f(run);
    }

    /// The visible moment of a rename of `src` (in directory body `src_dir`) to `dst`. Both
    /// names' map shards are write-locked (in shard order), then the map changes as `how`
    /// says (and a `whiteout` under the source's name takes the source's place) and `inside`
    /// runs (link counts, `..`), then the locks go, and a removed source entry leaves the
    /// index: its word is handed to the whiteout when that is its heir ([`Dirents::heir`]),
    /// and tombstoned otherwise (an admitted whiteout, as replay of records from before heirs
    /// makes). Between the two steps the index still holds the source's node, of the same name
    /// and cookie, which the caller keeps alive; the whiteout cannot go meanwhile, since its
    /// removal needs the source name's stripe. The caller holds both names' stripes, and both
    /// names are as it last saw them.
    #[allow(clippy::too_many_arguments)] // two keys, two bodies, the change, and the context
    pub fn rename_visible(
        &self,
        (sp, sn): (InoGen, &[u8]),
        src_dir: &DirBody,
        (dp, dn): (InoGen, &[u8]),
        how: RenameMap,
        whiteout: Option<Pending>,
        g: &Guard,
        stats: &Stats,
        inside: impl FnOnce(),
    ) {
        let (hs, hd) = (self.hash(sp, sn), self.hash(dp, dn));
        let (is, id) = (Self::shard_index(hs), Self::shard_index(hd));
        let first = stats.write(LockClass::DirentShard, &self.map[is.min(id)]);
        let second = (is != id).then(|| stats.write(LockClass::DirentShard, &self.map[is.max(id)]));
        let (mut src_shard, mut dst_shard) = match second {
            None => (first, None),
            Some(s) if is < id => (first, Some(s)),
            Some(s) => (s, Some(first)),
        };
        let hasher = |e: &Entry| self.hash(e.parent(), e.name());
        let removed = {
            let find = |t: &HashTable<Entry>, h, p, n: &[u8]| {
                t.find(h, |e| e.is(p, n)).map(|e| e as *const Entry)
            };
            let src = find(&src_shard, hs, sp, sn).expect("source entry under its stripe");
            let src_target = {
                // SAFETY: `src` points into a table we hold write-locked and do not change
                // until the last use of `src` below.
                let de = unsafe { &*src }.dirent();
                (de.target, de.kind)
            };
            let dst_table = dst_shard.as_deref_mut().unwrap_or(&mut *src_shard);
            match how {
                RenameMap::Exchange => {
                    debug_assert!(whiteout.is_none(), "no whiteout with an exchange");
                    let dst = dst_table
                        .find(hd, |e| e.is(dp, dn))
                        .expect("target entry under its stripe");
                    let dst_target = dst.retarget(src_target);
                    // SAFETY: as above; no change to the source's table happened since.
                    unsafe { &*src }.retarget(dst_target);
                    None
                }
                RenameMap::Replace => {
                    dst_table
                        .find(hd, |e| e.is(dp, dn))
                        .expect("target entry under its stripe")
                        .retarget(src_target);
                    Some(take(&mut src_shard, hs, sp, sn))
                }
                RenameMap::Move(p) => {
                    debug_assert!(p.parent == dp && p.entry.name() == dn);
                    dst_table.insert_unique(hd, p.entry, hasher);
                    Some(take(&mut src_shard, hs, sp, sn))
                }
            }
        };
        let mut heir = None;
        if let Some(w) = whiteout {
            debug_assert!(w.parent == sp && w.entry.name() == sn);
            if !w.indexed {
                let src = removed
                    .as_ref()
                    .expect("a whiteout replaces a removed source");
                assert_eq!(
                    w.cookie(),
                    src.node().cookie(),
                    "an heir has its source's cookie"
                );
                heir = Some(w.entry.word());
            }
            src_shard.insert_unique(hs, w.entry, hasher);
        }
        inside();
        drop(src_shard);
        drop(dst_shard);
        if let Some(e) = removed {
            let cookie = e.dirent().cookie;
            match heir {
                Some(word) => self.reindex(sp, src_dir, cookie, (e.word(), word), g, stats),
                None => self.unindex(sp, src_dir, cookie, g, stats),
            }
        }
    }

    /// Replaces the index word of the entry with `cookie` in directory `parent`, `old`, by
    /// `new` (an heir's, alive); the count stays.
    fn reindex(
        &self,
        parent: InoGen,
        dir: &DirBody,
        cookie: u64,
        (old, new): (u64, u64),
        g: &Guard,
        stats: &Stats,
    ) {
        // SAFETY: `in_run` holds the run's shard lock while this runs; `new`'s node is alive
        // (the caller's contract).
        self.in_run(parent, dir, cookie, g, stats, |run| unsafe {
            run.replace(cookie, old, new)
        });
    }

    /// The removing half of the removal protocol for directory `dir` (key `key`): ENOTEMPTY
    /// if an entry of it is visible; when none is counted, `commit` runs (and may refuse)
    /// and the directory is dead once the returned [`Removal`] is dropped, which the caller
    /// does after taking the directory's name out of the map (`life.rs`). The caller holds
    /// the stripe of the directory's own name.
    pub fn decide_removal<'d>(
        &self,
        (key, dir): (InoGen, &'d DirBody),
        g: &Guard,
        stats: &Stats,
        commit: impl FnOnce() -> Result<()>,
    ) -> Result<Removal<'d>> {
        life::decide(&dir.life, || self.look(key, dir, g, stats), commit)
    }

    /// R3 of the removal protocol: whether directory `dir` (key `key`) has entries counted,
    /// and if so whether one of them is visible. Reads names from the index in batches
    /// (under each run's shard lock) and looks each up in the map with no index lock held
    /// (the index-shard lock is a leaf); an entry is visible when the map holds its name
    /// with its cookie. Stops at the first visible one.
    fn look(&self, key: InoGen, dir: &DirBody, g: &Guard, stats: &Stats) -> Found {
        if self.count(dir, g) == 0 {
            return Found::Empty;
        }
        let everything = ReadEnd {
            mask: u64::MAX,
            last: (0..NSLOTS).map(|s| slot_base(s) | SEQ_MASK).collect(),
        };
        let mut batch = Vec::new();
        let mut after = 0;
        loop {
            batch.clear();
            self.read_batch(key, dir, after, &everything, 16, g, stats, &mut batch);
            let Some(&(last, _)) = batch.last() else {
                return Found::OnlyPending;
            };
            let visible = batch.iter().any(|(cookie, name)| {
                self.get(key, name, stats)
                    .is_some_and(|de| de.cookie == *cookie)
            });
            if visible {
                return Found::Visible;
            }
            after = last;
        }
    }

    /// Entries in directory `dir` (published or being published), without a lock.
    pub fn count(&self, dir: &DirBody, g: &Guard) -> u64 {
        dir.runs.load(g).map_or(0, RunSet::live)
    }

    /// Where a read of `dir` that starts now ends.
    pub fn read_end(&self, dir: &DirBody, g: &Guard) -> ReadEnd {
        let Some(set) = dir.runs.load(g) else {
            return ReadEnd::default();
        };
        ReadEnd {
            mask: set.mask(),
            last: set
                .iter()
                .map(|(slot, _)| slot_base(slot) | self.cookie_seq.get(slot).load(Relaxed))
                .collect(),
        }
    }

    /// Appends to `out` up to `max` entries of directory `dir` (key `key`) with cookies above
    /// `after` and covered by `end`, in cookie order.
    #[allow(clippy::too_many_arguments)] // the directory, where to start and stop, and output
    pub fn read_batch(
        &self,
        key: InoGen,
        dir: &DirBody,
        after: u64,
        end: &ReadEnd,
        max: usize,
        g: &Guard,
        stats: &Stats,
        out: &mut Vec<(u64, Name)>,
    ) {
        let Some(set) = dir.runs.load(g) else { return };
        let first_slot = if after < FIRST_COOKIE {
            0
        } else {
            slot_of(after)
        };
        for (slot, run) in set.iter().filter(|&(s, _)| s >= first_slot) {
            let lo = (after + 1).max(slot_base(slot));
            let _s = stats.lock(LockClass::IndexShard, &self.index[index_shard(key, slot)]);
            // SAFETY: we hold the run's shard lock.
            let (from, words) = unsafe { (run.find(lo).unwrap_or_else(|i| i), run.words()) };
            for &w in words[from..].iter().filter(|&&w| !index::is_tomb(w)) {
                // SAFETY: a live word of a run read under its shard lock.
                let (cookie, key) = unsafe {
                    let n = index::word_node(w);
                    (n.as_ref().cookie(), node_key(n))
                };
                if !end.covers(cookie) {
                    break; // later cookies of this slot are newer still
                }
                out.push((cookie, Name::from_slice(&key[8..])));
                if out.len() >= max {
                    return;
                }
            }
        }
    }

    /// Visits every entry of the map (for the invariant checker).
    pub fn for_each(&self, mut f: impl FnMut(InoGen, &[u8], Dirent)) {
        for shard in self.map.iter() {
            for e in shard.read().iter() {
                f(e.parent(), e.name(), e.dirent());
            }
        }
    }

    /// Visits every entry of directory `dir`'s index (for the invariant checker).
    pub fn for_each_indexed(
        &self,
        key: InoGen,
        dir: &DirBody,
        g: &Guard,
        mut f: impl FnMut(u64, &[u8]),
    ) {
        let Some(set) = dir.runs.load(g) else { return };
        for (slot, run) in set.iter() {
            let _s = self.index[index_shard(key, slot)].lock();
            // SAFETY: we hold the run's shard lock.
            for &w in unsafe { run.words() }
                .iter()
                .filter(|&&w| !index::is_tomb(w))
            {
                // SAFETY: a live word of a run read under its shard lock.
                let (cookie, key) = unsafe {
                    let n = index::word_node(w);
                    (n.as_ref().cookie(), node_key(n))
                };
                f(cookie, &key[8..]);
            }
        }
    }

    /// Entries in the dirent map.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.iter().map(|s| s.read().len()).sum()
    }

    /// Entries in the dirent map, counted shard by shard (each read-locked in turn): for
    /// the bounded inode cache's pass, not for a hot path.
    pub fn total(&self) -> u64 {
        self.map.iter().map(|s| s.read().len() as u64).sum()
    }

    /// Calls `f` with the inode each entry of directory `dir` (key `key`) names, read
    /// without the map's locks (a rename may change it meanwhile), until `f` says stop.
    pub fn for_each_target(
        &self,
        key: InoGen,
        dir: &DirBody,
        g: &Guard,
        stats: &Stats,
        mut f: impl FnMut(InoGen) -> bool,
    ) {
        let Some(set) = dir.runs.load(g) else { return };
        for (slot, run) in set.iter() {
            let _s = stats.lock(LockClass::IndexShard, &self.index[index_shard(key, slot)]);
            // SAFETY: we hold the run's shard lock.
            for &w in unsafe { run.words() }
                .iter()
                .filter(|&&w| !index::is_tomb(w))
            {
                // SAFETY: a live word of a run read under its shard lock.
                let target = unsafe { index::word_node(w).as_ref().target_racy() };
                if !f(target) {
                    return;
                }
            }
        }
    }

    /// Takes every entry of directory `dir` (key `key`) out of the map and frees it, for the
    /// inode cache's eviction of the directory: the caller holds no stripe, since nothing
    /// else can reach the directory (`fs/lazy.rs`, "Eviction"). The index is left as it is,
    /// its words pointing at freed nodes. Returns how many went.
    ///
    /// # Safety
    /// Nothing reads `dir`'s index after this: the caller destroys `dir` next (dropping its
    /// run set reads no node: `index.rs`, `Runs`), and no other thread can reach it.
    pub unsafe fn forget_dir(&self, key: InoGen, dir: &DirBody, g: &Guard, stats: &Stats) -> u64 {
        let mut names = Vec::new();
        self.for_each_indexed(key, dir, g, |_, n| names.push(Name::from_slice(n)));
        let mut gone = 0;
        for n in &names {
            let h = self.hash(key, n);
            let entry = {
                let mut shard =
                    stats.write(LockClass::DirentShard, &self.map[Self::shard_index(h)]);
                let found = shard.find_entry(h, |e| e.is(key, n)).ok();
                found.map(|f| f.remove().0)
            };
            // Out of the map; the index's word for it is never read again (the contract).
            gone += u64::from(entry.is_some());
        }
        gone
    }
}

/// Removes the entry `(p, n)` from a locked map shard.
fn take(t: &mut HashTable<Entry>, h: u64, p: InoGen, n: &[u8]) -> Entry {
    t.find_entry(h, |e| e.is(p, n))
        .ok()
        .expect("source entry under its stripe")
        .remove()
        .0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errno::Errno;

    fn dir() -> DirBody {
        DirBody::new(InoGen::ROOT)
    }

    const FILE: (InoGen, FileType) = (InoGen::from_raw(42), FileType::RegularFile);

    fn create(d: &Dirents, key: InoGen, dir: &DirBody, name: &[u8], stats: &Stats) -> Result<u64> {
        create_as(d, key, dir, name, FILE, stats)
    }

    fn create_as(
        d: &Dirents,
        key: InoGen,
        dir: &DirBody,
        name: &[u8],
        target: (InoGen, FileType),
        stats: &Stats,
    ) -> Result<u64> {
        let g = crossbeam_epoch::pin();
        let p = d.admit((key, dir), name, target, d.next_cookie(), &g, stats)?;
        let c = p.cookie();
        d.reveal(p, stats, || {});
        Ok(c)
    }

    fn read_all(d: &Dirents, key: InoGen, dir: &DirBody, batch: usize) -> Vec<(u64, Name)> {
        let (g, stats) = (crossbeam_epoch::pin(), Stats::default());
        let end = d.read_end(dir, &g);
        let mut all = Vec::new();
        let mut after = 2;
        loop {
            let mut b = Vec::new();
            d.read_batch(key, dir, after, &end, batch, &g, &stats, &mut b);
            let Some(last) = b.last() else { break };
            after = last.0;
            all.extend(b);
        }
        all
    }

    #[test]
    fn lookups_see_revealed_entries_only_and_keys_include_the_generation() {
        let (d, dd, stats) = (Dirents::new(), dir(), Stats::default());
        let g = crossbeam_epoch::pin();
        let key = InoGen::from_raw(7 | 3 << 28);
        let p = d
            .admit((key, &dd), b"x", FILE, d.next_cookie(), &g, &stats)
            .unwrap();
        assert_eq!(d.get(key, b"x", &stats), None, "admitted, not yet visible");
        assert_eq!(d.count(&dd, &g), 1, "but counted");
        let c = p.cookie();
        d.reveal(p, &stats, || {});
        let de = d.get(key, b"x", &stats).unwrap();
        assert_eq!((de.target, de.cookie), (InoGen::from_raw(42), c));
        assert!(c >= FIRST_COOKIE);
        let same_number = InoGen::from_raw(7 | 4 << 28);
        assert_eq!(d.get(same_number, b"x", &stats), None, "another generation");
        assert_eq!(d.get(key, b"xx", &stats), None);
    }

    #[test]
    fn readdir_is_in_cookie_order_across_slots_and_resumes() {
        let (d, dd, stats) = (Dirents::new(), dir(), Stats::default());
        let key = InoGen::from_raw(9);
        std::thread::scope(|s| {
            for t in 0..4 {
                let (d, dd, stats) = (&d, &dd, &stats);
                s.spawn(move || {
                    for i in 0..50 {
                        create(d, key, dd, format!("t{t}-{i}").as_bytes(), stats).unwrap();
                    }
                });
            }
        });
        assert_eq!(d.count(&dd, &crossbeam_epoch::pin()), 200);
        let all = read_all(&d, key, &dd, 7);
        assert_eq!(all.len(), 200);
        assert!(
            all.windows(2).all(|w| w[0].0 < w[1].0),
            "increasing cookies"
        );
        // Removing an entry keeps every other cookie as it was.
        let g = crossbeam_epoch::pin();
        let victim = all[17].1.clone();
        d.remove(key, &dd, &victim, &g, &stats, |_| {}).unwrap();
        let mut again = all.clone();
        again.remove(17);
        assert_eq!(read_all(&d, key, &dd, usize::MAX), again);
    }

    #[test]
    fn a_read_ends_at_the_entries_that_existed_when_it_started() {
        let (d, dd, stats) = (Dirents::new(), dir(), Stats::default());
        let key = InoGen::from_raw(11);
        let g = crossbeam_epoch::pin();
        for i in 0..10 {
            create(&d, key, &dd, format!("n{i}").as_bytes(), &stats).unwrap();
        }
        let end = d.read_end(&dd, &g);
        // Rename-away-and-back of every entry while reading: each comes back with a newer
        // cookie and must not be returned again.
        let mut seen = 0;
        let mut after = 2;
        loop {
            let mut b = Vec::new();
            d.read_batch(key, &dd, after, &end, 1, &g, &stats, &mut b);
            let Some((c, name)) = b.pop() else { break };
            after = c;
            seen += 1;
            assert!(seen <= 10, "the read did not end");
            d.remove(key, &dd, &name, &g, &stats, |_| {}).unwrap();
            create(&d, key, &dd, &name, &stats).unwrap();
        }
        assert_eq!(seen, 10);
        assert_eq!(
            read_all(&d, key, &dd, 3).len(),
            10,
            "a new read sees them all"
        );
    }

    #[test]
    fn removal_protocol_on_the_real_tables() {
        let (d, dd, stats) = (Dirents::new(), dir(), Stats::default());
        let g = crossbeam_epoch::pin();
        let key = InoGen::from_raw(5);
        create(&d, key, &dd, b"a", &stats).unwrap();
        let decide = |commit: Result<()>| {
            d.decide_removal((key, &dd), &g, &stats, || commit)
                .map(drop)
        };
        assert_eq!(decide(Ok(())), Err(Errno::ENOTEMPTY));
        assert!(!dd.life.is_dead());
        d.remove(key, &dd, b"a", &g, &stats, |_| {}).unwrap();
        assert_eq!(
            decide(Err(Errno::ENOSPC)),
            Err(Errno::ENOSPC),
            "a refused commit leaves the directory alive"
        );
        assert!(!dd.life.is_dead());
        let removal = d.decide_removal((key, &dd), &g, &stats, || Ok(())).unwrap();
        assert!(!dd.life.is_dead(), "dead only once the removal is dropped");
        drop(removal);
        assert!(dd.life.is_dead());
        assert_eq!(create(&d, key, &dd, b"b", &stats), Err(Errno::ENOENT));
        assert_eq!(d.count(&dd, &g), 0, "the backed-out entry left no count");
        assert_eq!(d.get(key, b"b", &stats), None);
        assert_eq!(d.len(), 0);
    }

    /// An entry admitted but not yet revealed neither lets a removal through nor makes it
    /// answer ENOTEMPTY while nobody can see the entry: the removal waits for its outcome,
    /// whichever thread gets there first. Revealed: ENOTEMPTY; taken back: removed.
    #[test]
    fn a_removal_waits_for_entries_being_published() {
        for reveal in [true, false] {
            let (d, dd, stats) = (Dirents::new(), dir(), Stats::default());
            let key = InoGen::from_raw(6);
            let g = crossbeam_epoch::pin();
            let p = d
                .admit((key, &dd), b"x", FILE, d.next_cookie(), &g, &stats)
                .unwrap();
            let removed = std::thread::scope(|s| {
                let remover = s.spawn(|| {
                    let g = crossbeam_epoch::pin();
                    d.decide_removal((key, &dd), &g, &stats, || Ok(()))
                        .map(drop)
                });
                if reveal {
                    d.reveal(p, &stats, || {});
                } else {
                    d.cancel(p, &dd, &g, &stats);
                }
                remover.join().unwrap()
            });
            let want = if reveal {
                Err(Errno::ENOTEMPTY)
            } else {
                Ok(())
            };
            assert_eq!(removed, want, "entry revealed: {reveal}");
            assert_eq!(dd.life.is_dead(), !reveal);
        }
    }

    #[test]
    fn rename_changes_are_made_together() {
        let (d, dd, stats) = (Dirents::new(), dir(), Stats::default());
        let g = crossbeam_epoch::pin();
        let key = InoGen::from_raw(5);
        create(&d, key, &dd, b"a", &stats).unwrap();
        let link = (InoGen::from_raw(43), FileType::Symlink);
        create_as(&d, key, &dd, b"b", link, &stats).unwrap();
        // Exchange: targets swap with their types, cookies stay.
        let a = d.get(key, b"a", &stats).unwrap();
        d.rename_visible(
            (key, b"a"),
            &dd,
            (key, b"b"),
            RenameMap::Exchange,
            None,
            &g,
            &stats,
            || {},
        );
        assert_eq!(d.get(key, b"a", &stats).unwrap().cookie, a.cookie);
        let named = |n: &[u8]| d.get(key, n, &stats).map(|e| (e.target, e.kind));
        assert_eq!((named(b"a"), named(b"b")), (Some(link), Some(FILE)));
        let b = d.get(key, b"b", &stats).unwrap();
        // Replace: b names what a named, a is gone.
        d.rename_visible(
            (key, b"a"),
            &dd,
            (key, b"b"),
            RenameMap::Replace,
            None,
            &g,
            &stats,
            || {},
        );
        assert_eq!(d.get(key, b"a", &stats), None);
        assert_eq!(
            d.get(key, b"b", &stats).unwrap(),
            Dirent {
                target: link.0,
                kind: link.1,
                cookie: b.cookie
            }
        );
        // Move: a new name with a new cookie, the old one gone, counts follow.
        let p = d
            .admit(
                (key, &dd),
                b"c",
                (b.target, b.kind),
                d.next_cookie(),
                &g,
                &stats,
            )
            .unwrap();
        d.rename_visible(
            (key, b"b"),
            &dd,
            (key, b"c"),
            RenameMap::Move(p),
            None,
            &g,
            &stats,
            || {},
        );
        assert_eq!(d.get(key, b"b", &stats), None);
        assert!(d.get(key, b"c", &stats).is_some());
        assert_eq!(d.count(&dd, &g), 1);
        assert_eq!(read_all(&d, key, &dd, 10).len(), 1);
        // Move with a whiteout: the source name names the whiteout, with its own cookie.
        let c = d.get(key, b"c", &stats).unwrap();
        let wt = InoGen::from_raw(77);
        let w = d
            .admit(
                (key, &dd),
                b"c",
                (wt, FileType::CharDevice),
                d.next_cookie(),
                &g,
                &stats,
            )
            .unwrap();
        let wcookie = w.cookie();
        let p = d
            .admit(
                (key, &dd),
                b"e",
                (c.target, c.kind),
                d.next_cookie(),
                &g,
                &stats,
            )
            .unwrap();
        d.rename_visible(
            (key, b"c"),
            &dd,
            (key, b"e"),
            RenameMap::Move(p),
            Some(w),
            &g,
            &stats,
            || {},
        );
        let wd = d.get(key, b"c", &stats).unwrap();
        assert_eq!((wd.target, wd.cookie), (wt, wcookie));
        assert_eq!(d.get(key, b"e", &stats).unwrap().target, c.target);
        assert_eq!(d.count(&dd, &g), 2);
        assert_eq!(read_all(&d, key, &dd, 10).len(), 2);
    }

    #[test]
    fn a_whiteout_heir_takes_its_sources_place_in_a_read_under_way() {
        let (d, dd, stats) = (Dirents::new(), dir(), Stats::default());
        let g = crossbeam_epoch::pin();
        let key = InoGen::from_raw(5);
        for n in [&b"a"[..], b"b"] {
            create(&d, key, &dd, n, &stats).unwrap();
        }
        let a = d.get(key, b"a", &stats).unwrap();
        // A read returns "a", then "a" is renamed to "z" leaving a whiteout.
        let end = d.read_end(&dd, &g);
        let mut first = Vec::new();
        d.read_batch(key, &dd, 2, &end, 1, &g, &stats, &mut first);
        assert_eq!(first, [(a.cookie, Name::from_slice(b"a"))]);
        let wt = InoGen::from_raw(77);
        let w = d.heir(key, b"a", (wt, FileType::CharDevice), a.cookie);
        let p = d
            .admit(
                (key, &dd),
                b"z",
                (a.target, a.kind),
                d.next_cookie(),
                &g,
                &stats,
            )
            .unwrap();
        d.rename_visible(
            (key, b"a"),
            &dd,
            (key, b"z"),
            RenameMap::Move(p),
            Some(w),
            &g,
            &stats,
            || {},
        );
        assert_eq!(
            d.get(key, b"a", &stats).unwrap(),
            Dirent {
                target: wt,
                kind: FileType::CharDevice,
                cookie: a.cookie
            },
            "the whiteout has the source's cookie"
        );
        assert_eq!(d.count(&dd, &g), 3, "a, b and z: the whiteout counts once");
        let mut rest = Vec::new();
        d.read_batch(key, &dd, a.cookie, &end, 10, &g, &stats, &mut rest);
        let names: Vec<&[u8]> = rest.iter().map(|(_, n)| &n[..]).collect();
        assert_eq!(names, [&b"b"[..]], "the read goes on without \"a\" again");
        let all = read_all(&d, key, &dd, 10);
        assert_eq!(
            all[0],
            (a.cookie, Name::from_slice(b"a")),
            "the place is kept"
        );
        assert_eq!(all.len(), 3);
        // Removing the whiteout removes its (inherited) index word.
        d.remove(key, &dd, b"a", &g, &stats, |_| {}).unwrap();
        assert_eq!(d.count(&dd, &g), 2);
        assert_eq!(read_all(&d, key, &dd, 10).len(), 2);
    }
}
