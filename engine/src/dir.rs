//! Directory entries: two filesystem-wide tables over one allocation per entry, no
//! per-directory container.
//!
//! Each entry is one heap **node** (`Node`: inode, cookie, and the key `parent ino ++ name`),
//! allocated once and shared by both tables, so a name is stored once:
//!
//! 1. The **dirent map**, keyed by the node's key bytes, owns the node. It is `NMAP` shards,
//!    each a `hashbrown::HashTable` (8 bytes a slot) under a read-write lock, picked by bits
//!    32..44 of the key's hash (the table itself uses the low bits and the top seven). A
//!    lookup read-locks one shard, the only lock it takes (DESIGN §3); with 4096 shards,
//!    threads working on different names rarely share one. A removed entry is freed at once
//!    (no epoch-deferred slots: `notes/prototype-crunl.md` on `scc::HashIndex`).
//! 2. The **ordered index**: 256 mutex-protected shards, each mapping `(parent, slot)` to a
//!    **run**: the nodes that thread slot inserted in that directory, as one word each in a
//!    vector sorted by cookie (appends at the end, since a slot's cookies only grow; a removal
//!    leaves a tombstone word, and a run with more tombstones than entries is compacted). It
//!    gives readdir its stable order and resumable offsets, rmdir its emptiness test and
//!    `stat` a directory's size.
//!
//! Why by hand: no crate offers a concurrent map and an ordered index sharing entries, and
//! keeping each name twice (a `BTreeMap` of names beside the hash map) cost about 250 bytes a
//! file where this costs about 66 (docs/BENCHMARKS.md, "Memory per file"). The map was an
//! `scc::HashMap` first; its bucket locks spin for 32 µs on a holder that was preempted, and
//! with 32 threads on 2 cores crunl lost 12% of its CPU to that spinning (perf). In a one-off
//! side-by-side run of an isolated insert/lookup/remove loop (string keys, 100k prefilled,
//! 2026-11-22), these sharded tables kept their T=2 rate at T=32 (12.8M iterations/s, against
//! 12.8–13.2M at T=2) where `scc::HashMap` fell from 13.0–13.4M to 9.3–11.0M, with the same
//! T=1 speed.
//!
//! # A node's life
//! A node is created by `publish`, enters the index (under the shard lock), then the map; it
//! leaves the map first (`remove`, the removal's visible moment), then the index, and is freed
//! only then. So a node is alive while it is in either table: readers of the map touch nodes
//! only under a bucket lock, readers of the index only under the shard lock, and the remover
//! frees the node after taking both out. Nothing else holds a pointer to a node.
//!
//! # Cookies
//! An entry's cookie is its readdir offset: `((slot + 1) << 48) | seq`, where `seq` comes from
//! a per-slot counter of the inserting thread, so no counter is shared by threads creating in
//! one directory, and a cookie is never reused while the filesystem lives (Linux tmpfs gives
//! the same guarantee since 6.6). Offsets 1 and 2 are `.` and `..`.
//!
//! # Sharding
//! Index shard = `(hash(parent) + slot) mod 256`: the entries one thread inserts in one
//! directory share a shard, and 64 threads inserting in one directory use 64 different shards.
//! Readdir walks the slots in order, each slot's run in cookie order, which is cookie order.
//! A directory records in `slot_mask` which slots ever inserted in it, so readdir and the
//! emptiness test visit only those shards.

use std::alloc::{Layout, alloc, dealloc, handle_alloc_error};
use std::collections::HashMap;
use std::hash::Hasher;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering::*, fence};

use std::hash::BuildHasher;

use crossbeam_utils::CachePadded;
use hashbrown::HashTable;
use parking_lot::{Mutex, RwLock};
use smallvec::SmallVec;

use crate::attr::Ino;
use crate::errno::{Errno, Result};
use crate::inode::{DIR_ALIVE, DIR_DYING, DirBody};
use crate::slots::{NSLOTS, PerSlot, current};
use crate::stats::{LockClass, Stats};

/// Longest name (`NAME_MAX`).
pub const NAME_MAX: usize = 255;

/// First cookie of a real entry; 1 and 2 are `.` and `..`.
pub const FIRST_COOKIE: u64 = 1 << 48;
const SEQ_MASK: u64 = FIRST_COOKIE - 1;
const NSHARDS: usize = 256;
/// Shards of the dirent map.
const NMAP: usize = 4096;
const _: () = assert!(NSHARDS >= NSLOTS && NSHARDS.is_power_of_two());

/// A name as handed out by readdir (inline up to 16 bytes).
pub(crate) type Name = SmallVec<[u8; 16]>;

/// The header of a directory entry's node; the key bytes (`parent` little-endian, then the
/// name) follow it in the same allocation, at `KEY_OFFSET`. 16 bytes: a 16-byte name makes a
/// 40-byte node.
#[repr(C)]
struct Node {
    /// The inode the entry names; changed in place by a rename over it (`repoint`).
    ino_gen: AtomicU64,
    /// The cookie (readdir offset, below `COOKIE_BITS`) and, above it, the key length; fixed
    /// for the node's life.
    cookie_len: u64,
}

const COOKIE_BITS: u32 = 55;
const _: () = assert!((NSLOTS as u64 + 1) << 48 <= 1 << COOKIE_BITS);
const _: () = assert!(8 + NAME_MAX < 1 << (64 - COOKIE_BITS));
const KEY_OFFSET: usize = std::mem::size_of::<Node>();

impl Node {
    #[inline]
    fn cookie(&self) -> u64 {
        self.cookie_len & ((1 << COOKIE_BITS) - 1)
    }

    #[inline]
    fn key_len(&self) -> usize {
        (self.cookie_len >> COOKIE_BITS) as usize
    }
}

fn node_layout(key_len: usize) -> Layout {
    Layout::from_size_align(KEY_OFFSET + key_len, std::mem::align_of::<Node>())
        .expect("small layout")
}

/// The owner of one node: it lives in the dirent map, or with the thread publishing or
/// removing the entry. Dropping it frees the node (see "A node's life").
pub(crate) struct Entry(NonNull<Node>);

// SAFETY: a node is immutable after creation except `ino_gen`, an atomic; an `Entry` is its
// only owner, so moving it to another thread moves the node's ownership with it.
unsafe impl Send for Entry {}
// SAFETY: shared access reads immutable fields and an atomic.
unsafe impl Sync for Entry {}

type MapShard = CachePadded<RwLock<HashTable<Entry>>>;

impl Entry {
    fn new(parent: Ino, name: &[u8], ino_gen: u64, cookie: u64) -> Entry {
        let len = 8 + name.len();
        debug_assert!(cookie < 1 << COOKIE_BITS);
        let layout = node_layout(len);
        // SAFETY: the layout has a non-zero size (the header).
        let raw = unsafe { alloc(layout) } as *mut Node;
        let Some(ptr) = NonNull::new(raw) else {
            handle_alloc_error(layout)
        };
        // SAFETY: `raw` is a fresh allocation of `layout`: the header fits at its start
        // (aligned for `Node`), and `len` bytes fit at `KEY_OFFSET`.
        unsafe {
            raw.write(Node {
                ino_gen: AtomicU64::new(ino_gen),
                cookie_len: (len as u64) << COOKIE_BITS | cookie,
            });
            let key = (raw as *mut u8).add(KEY_OFFSET);
            std::ptr::copy_nonoverlapping(parent.to_le_bytes().as_ptr(), key, 8);
            std::ptr::copy_nonoverlapping(name.as_ptr(), key.add(8), name.len());
        }
        Entry(ptr)
    }

    #[inline]
    fn node(&self) -> &Node {
        // SAFETY: the node lives as long as its owner.
        unsafe { self.0.as_ref() }
    }

    #[inline]
    fn key(&self) -> &[u8] {
        // SAFETY: as `node`, plus: `len` initialised bytes follow the header (`Entry::new`).
        unsafe { node_key(self.0) }
    }

    pub fn parent(&self) -> Ino {
        u64::from_le_bytes(self.key()[..8].try_into().expect("8-byte prefix"))
    }

    pub fn name(&self) -> &[u8] {
        &self.key()[8..]
    }

    /// Whether this is the entry `name` in `parent`.
    #[inline]
    fn is(&self, parent: Ino, name: &[u8]) -> bool {
        let k = self.key();
        k.len() == 8 + name.len() && k[..8] == parent.to_le_bytes() && k[8..] == *name
    }

    fn dirent(&self) -> Dirent {
        Dirent {
            ino_gen: self.node().ino_gen.load(Acquire),
            cookie: self.node().cookie(),
        }
    }

    /// The index's word for this node.
    fn word(&self) -> u64 {
        self.0.as_ptr() as u64
    }
}

/// The key bytes of a live node.
///
/// # Safety
/// `p` points at a live node.
#[inline]
unsafe fn node_key<'a>(p: NonNull<Node>) -> &'a [u8] {
    // SAFETY: per the contract, `p` is live; its key follows the header (`Entry::new`).
    unsafe {
        let len = p.as_ref().key_len();
        std::slice::from_raw_parts((p.as_ptr() as *const u8).add(KEY_OFFSET), len)
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        let layout = node_layout(self.node().key_len());
        // SAFETY: allocated in `Entry::new` with this layout; the entry is the node's only
        // owner and no table refers to it any more ("A node's life").
        unsafe { dealloc(self.0.as_ptr() as *mut u8, layout) }
    }
}

/// A directory entry's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Dirent {
    pub ino_gen: u64,
    pub cookie: u64,
}

/// One slot's entries in one directory, in cookie order. A word is a node's address (even) or
/// a tombstone, `cookie << 1 | 1`.
#[derive(Default)]
struct Run {
    words: Vec<u64>,
    live: u32,
}

#[inline]
fn is_tomb(w: u64) -> bool {
    w & 1 == 1
}

/// The node of a live word.
///
/// # Safety
/// The caller holds the lock of the shard whose run holds `w`, and `w` is not a tombstone.
#[inline]
unsafe fn word_node(w: u64) -> NonNull<Node> {
    debug_assert!(!is_tomb(w));
    // SAFETY: a live word is the address of a node (`Entry::word`), never null.
    unsafe { NonNull::new_unchecked(w as *mut Node) }
}

/// The cookie of a word, live or tombstone.
///
/// # Safety
/// As [`word_node`], without the tombstone condition.
#[inline]
unsafe fn word_cookie(w: u64) -> u64 {
    if is_tomb(w) {
        w >> 1
    } else {
        // SAFETY: a live word's node stays alive while it is in the run, and the run is read
        // under its shard lock, which the node's remover takes before freeing it.
        unsafe { word_node(w).as_ref().cookie() }
    }
}

impl Run {
    /// Position of `cookie` (Ok) or where it would go (Err).
    fn find(&self, cookie: u64) -> std::result::Result<usize, usize> {
        // SAFETY: runs are only reached under their shard lock (callers hold it).
        self.words
            .binary_search_by_key(&cookie, |&w| unsafe { word_cookie(w) })
    }

    fn insert(&mut self, e: &Entry) {
        let cookie = e.node().cookie();
        // Cookies of one slot only grow, but two threads may share a slot and reach the shard
        // lock out of cookie order.
        // SAFETY: the run is under its shard lock (the caller holds it).
        let at_end = self
            .words
            .last()
            .is_none_or(|&w| unsafe { word_cookie(w) } < cookie);
        if at_end {
            self.words.push(e.word());
        } else {
            let i = self.find(cookie).expect_err("cookie inserted twice");
            self.words.insert(i, e.word());
        }
        self.live += 1;
    }

    /// Tombstones `cookie`; compacts when tombstones outnumber entries.
    fn remove(&mut self, cookie: u64) {
        let i = match self.find(cookie) {
            Ok(i) if !is_tomb(self.words[i]) => i,
            _ => panic!("index entry with cookie {cookie:#x} missing"),
        };
        self.words[i] = cookie << 1 | 1;
        self.live -= 1;
        let dead = self.words.len() - self.live as usize;
        if dead > self.live as usize && dead >= 16 {
            self.words.retain(|&w| !is_tomb(w));
            if self.words.capacity() > 2 * self.words.len() + 16 {
                self.words.shrink_to_fit();
            }
        }
    }
}

#[derive(Default)]
struct Shard {
    runs: HashMap<(Ino, u8), Run, foldhash::fast::RandomState>,
}

pub(crate) struct Dirents {
    hasher: foldhash::fast::RandomState,
    map: Box<[MapShard]>,
    shards: Box<[CachePadded<Mutex<Shard>>]>,
    cookie_seq: PerSlot<AtomicU64>,
}

#[inline]
fn shard_of(parent: Ino, slot: usize) -> usize {
    let h = (parent.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as usize;
    (h + slot) & (NSHARDS - 1)
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

/// Waits while an rmdir (or a rename over the directory) decides, and returns its outcome.
/// The decision window holds no lock that a waiter may hold (see `locking.rs`), so it ends.
#[cold]
fn wait_outcome(dir: &DirBody) -> u8 {
    let mut spins = 0u32;
    loop {
        let life = dir.life.load(SeqCst);
        if life != DIR_DYING {
            return life;
        }
        spins += 1;
        if spins < 100 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

impl Dirents {
    pub fn new() -> Self {
        Dirents {
            hasher: Default::default(),
            map: (0..NMAP)
                .map(|_| CachePadded::new(RwLock::new(HashTable::new())))
                .collect(),
            shards: (0..NSHARDS)
                .map(|_| CachePadded::new(Mutex::new(Shard::default())))
                .collect(),
            cookie_seq: PerSlot::new(|_| AtomicU64::new(0)),
        }
    }

    /// The hash of the key `(parent, name)`, fed to the hasher without building the key.
    #[inline]
    fn hash(&self, parent: Ino, name: &[u8]) -> u64 {
        debug_assert!(name.len() <= NAME_MAX);
        let mut h = self.hasher.build_hasher();
        h.write(&parent.to_le_bytes());
        h.write(name);
        h.finish()
    }

    #[inline]
    fn entry_hash(&self, e: &Entry) -> u64 {
        self.hash(e.parent(), e.name())
    }

    #[inline]
    fn map_shard(&self, hash: u64) -> &RwLock<HashTable<Entry>> {
        &self.map[(hash >> 32) as usize & (NMAP - 1)]
    }

    /// The entry `name` in `parent`.
    #[inline]
    pub fn get(&self, parent: Ino, name: &[u8], stats: &Stats) -> Option<Dirent> {
        let h = self.hash(parent, name);
        let shard = stats.read(LockClass::DirentShard, self.map_shard(h));
        shard.find(h, |e| e.is(parent, name)).map(Entry::dirent)
    }

    fn next_cookie(&self, slot: usize) -> u64 {
        // A read-modify-write: two threads sharing a slot must still get distinct cookies.
        let seq = self.cookie_seq.get(slot).fetch_add(1, Relaxed) + 1;
        assert!(seq <= SEQ_MASK, "cookie space of slot {slot} exhausted");
        slot_base(slot) | seq
    }

    /// Adds `name -> ino_gen` to directory `parent` (body `dir`) and returns its cookie.
    ///
    /// The caller holds the stripe of `(parent, name)` and has seen the name absent. This is
    /// the creating half of the rmdir protocol in `locking.rs`: the entry enters the ordered
    /// index (which rmdir's emptiness test reads) *before* a SeqCst fence and the check of the
    /// directory's life, and becomes visible to lookups only after the check. On a directory
    /// that was removed meanwhile it backs out and fails with ENOENT.
    pub fn publish(
        &self,
        parent: Ino,
        dir: &DirBody,
        name: &[u8],
        ino_gen: u64,
        stats: &Stats,
    ) -> Result<u64> {
        let slot = current();
        let bit = 1u64 << slot;
        if dir.slot_mask.load(Relaxed) & bit == 0 {
            // SeqCst: ordered before the fence below, so rmdir's mask read after its own fence
            // sees it whenever it must see the index entry.
            dir.slot_mask.fetch_or(bit, SeqCst);
        }
        let cookie = self.next_cookie(slot);
        let entry = Entry::new(parent, name, ino_gen, cookie);
        {
            let mut sh = stats.lock(LockClass::IndexShard, &self.shards[shard_of(parent, slot)]);
            sh.runs
                .entry((parent, slot as u8))
                .or_default()
                .insert(&entry);
        }
        fence(SeqCst);
        let mut life = dir.life.load(SeqCst);
        if life == DIR_DYING {
            life = wait_outcome(dir);
        }
        if life != DIR_ALIVE {
            self.index_remove(parent, cookie, stats);
            drop(entry);
            return Err(Errno::ENOENT);
        }
        let h = self.hash(parent, name);
        let mut shard = stats.write(LockClass::DirentShard, self.map_shard(h));
        match shard.entry(h, |e| e.is(parent, name), |e| self.entry_hash(e)) {
            hashbrown::hash_table::Entry::Vacant(v) => {
                v.insert(entry);
            }
            hashbrown::hash_table::Entry::Occupied(_) => {
                panic!("name published twice under its stripe lock")
            }
        }
        Ok(cookie)
    }

    /// The removing half of the rmdir protocol: marks the directory DYING, fences, tests
    /// emptiness, and settles on DEAD (empty, returns Ok) or back to ALIVE (ENOTEMPTY). The
    /// caller holds the stripe of the directory's own name, which every rmdir or rename of the
    /// directory also takes, so no two deciders overlap.
    pub fn kill_if_empty(&self, ino: Ino, dir: &DirBody, stats: &Stats) -> Result<()> {
        let prev = dir.life.swap(DIR_DYING, SeqCst);
        assert_eq!(prev, DIR_ALIVE, "two deciders on directory {ino}");
        fence(SeqCst);
        let empty = self.count(ino, dir, stats) == 0;
        dir.life.store(
            if empty {
                crate::inode::DIR_DEAD
            } else {
                DIR_ALIVE
            },
            SeqCst,
        );
        if empty { Ok(()) } else { Err(Errno::ENOTEMPTY) }
    }

    /// Removes `name` from `parent`: from the map first (the removal's visible moment), then
    /// from the index; then frees the node.
    pub fn remove(&self, parent: Ino, name: &[u8], stats: &Stats) -> Option<Dirent> {
        let h = self.hash(parent, name);
        let entry = {
            let mut shard = stats.write(LockClass::DirentShard, self.map_shard(h));
            let found = shard.find_entry(h, |e| e.is(parent, name)).ok()?;
            found.remove().0
        };
        let de = entry.dirent();
        self.index_remove(parent, de.cookie, stats);
        drop(entry);
        Some(de)
    }

    fn index_remove(&self, parent: Ino, cookie: u64, stats: &Stats) {
        let slot = slot_of(cookie);
        let mut sh = stats.lock(LockClass::IndexShard, &self.shards[shard_of(parent, slot)]);
        let key = (parent, slot as u8);
        let run = sh
            .runs
            .get_mut(&key)
            .unwrap_or_else(|| panic!("index run ({parent}, {slot}) missing"));
        run.remove(cookie);
        if run.live == 0 {
            sh.runs.remove(&key);
        }
    }

    /// Points existing entry `name` at `ino_gen` in place (the entry never disappears, so a
    /// concurrent lookup sees the old or the new inode); returns the old value.
    pub fn repoint(&self, parent: Ino, name: &[u8], ino_gen: u64, stats: &Stats) -> Option<Dirent> {
        // The caller holds the name's stripe: no other writer of this entry. Readers see the
        // old or the new inode.
        let h = self.hash(parent, name);
        let shard = stats.read(LockClass::DirentShard, self.map_shard(h));
        shard.find(h, |e| e.is(parent, name)).map(|e| Dirent {
            ino_gen: e.node().ino_gen.swap(ino_gen, AcqRel),
            cookie: e.node().cookie(),
        })
    }

    /// Entries in directory `ino` (published or being published).
    pub fn count(&self, ino: Ino, dir: &DirBody, stats: &Stats) -> u64 {
        let mask = dir.slot_mask.load(SeqCst);
        let mut n = 0u64;
        for slot in (0..NSLOTS).filter(|s| mask & (1 << s) != 0) {
            let sh = stats.lock(LockClass::IndexShard, &self.shards[shard_of(ino, slot)]);
            n += sh.runs.get(&(ino, slot as u8)).map_or(0, |r| r.live) as u64;
        }
        n
    }

    /// Appends to `out` up to `max` entries of directory `ino` with cookies above `after`, in
    /// cookie order.
    pub fn read_batch(
        &self,
        ino: Ino,
        dir: &DirBody,
        after: u64,
        max: usize,
        stats: &Stats,
        out: &mut Vec<(u64, Name)>,
    ) {
        let mask = dir.slot_mask.load(Acquire);
        let first_slot = if after < FIRST_COOKIE {
            0
        } else {
            slot_of(after)
        };
        for slot in (first_slot..NSLOTS).filter(|s| mask & (1 << s) != 0) {
            let lo = (after + 1).max(slot_base(slot));
            let hi = slot_base(slot + 1) - 1;
            let sh = stats.lock(LockClass::IndexShard, &self.shards[shard_of(ino, slot)]);
            let Some(run) = sh.runs.get(&(ino, slot as u8)) else {
                continue;
            };
            let from = match run.find(lo) {
                Ok(i) | Err(i) => i,
            };
            for &w in run.words[from..].iter().filter(|&&w| !is_tomb(w)) {
                // SAFETY: a live word of a run read under its shard lock.
                let (cookie, key) = unsafe {
                    let n = word_node(w);
                    (n.as_ref().cookie(), node_key(n))
                };
                if cookie > hi {
                    break;
                }
                out.push((cookie, Name::from_slice(&key[8..])));
                if out.len() >= max {
                    return;
                }
            }
        }
    }

    /// Visits every entry of the map (for the invariant checker).
    pub fn for_each(&self, mut f: impl FnMut(Ino, &[u8], Dirent)) {
        for shard in self.map.iter() {
            for e in shard.read().iter() {
                f(e.parent(), e.name(), e.dirent());
            }
        }
    }

    /// Visits every entry of the index (for the invariant checker).
    pub fn for_each_indexed(&self, mut f: impl FnMut(Ino, u64, &[u8])) {
        for sh in self.shards.iter() {
            let sh = sh.lock();
            for (&(p, _), run) in &sh.runs {
                for &w in run.words.iter().filter(|&&w| !is_tomb(w)) {
                    // SAFETY: a live word of a run read under its shard lock.
                    let (cookie, key) = unsafe {
                        let n = word_node(w);
                        (n.as_ref().cookie(), node_key(n))
                    };
                    f(p, cookie, &key[8..]);
                }
            }
        }
    }

    /// Entries in the dirent map.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.iter().map(|s| s.read().len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inode::DIR_DEAD;

    #[test]
    fn key_layout_and_borrowed_lookup() {
        let k = Entry::new(0x0102, b"abc", 5, FIRST_COOKIE);
        assert_eq!(k.parent(), 0x0102);
        assert_eq!(k.name(), b"abc");
        assert!(k.is(0x0102, b"abc") && !k.is(0x0102, b"ab") && !k.is(0x0103, b"abc"));
        assert_eq!(
            k.dirent(),
            Dirent {
                ino_gen: 5,
                cookie: FIRST_COOKIE
            }
        );
        let d = Dirents::new();
        let dir = DirBody::new(1);
        let stats = Stats::default();
        let c = d.publish(7, &dir, b"x", 42, &stats).unwrap();
        assert!(c >= FIRST_COOKIE);
        assert_eq!(
            d.get(7, b"x", &stats),
            Some(Dirent {
                ino_gen: 42,
                cookie: c
            })
        );
        assert_eq!(d.get(8, b"x", &stats), None, "parent is part of the key");
        assert_eq!(d.get(7, b"xx", &stats), None);
    }

    #[test]
    fn readdir_is_in_cookie_order_across_slots_and_resumes() {
        let d = Dirents::new();
        let dir = DirBody::new(1);
        let stats = Stats::default();
        // Entries from several threads (slots), interleaved.
        std::thread::scope(|s| {
            for t in 0..4 {
                let (d, dir, stats) = (&d, &dir, &stats);
                s.spawn(move || {
                    for i in 0..50 {
                        d.publish(9, dir, format!("t{t}-{i}").as_bytes(), 100 + i, stats)
                            .unwrap();
                    }
                });
            }
        });
        assert_eq!(d.count(9, &dir, &stats), 200);
        let mut all = Vec::new();
        let mut after = 2;
        loop {
            let mut batch = Vec::new();
            d.read_batch(9, &dir, after, 7, &stats, &mut batch);
            if batch.is_empty() {
                break;
            }
            after = batch.last().unwrap().0;
            all.extend(batch);
        }
        assert_eq!(all.len(), 200);
        assert!(
            all.windows(2).all(|w| w[0].0 < w[1].0),
            "strictly increasing cookies"
        );
        // Removing an entry keeps every other cookie as it was.
        let victim = all[17].1.clone();
        d.remove(9, &victim, &stats).unwrap();
        let mut again = Vec::new();
        d.read_batch(9, &dir, 2, usize::MAX, &stats, &mut again);
        all.remove(17);
        assert_eq!(again, all);
    }

    #[test]
    fn kill_if_empty_and_publish_into_dead_directory() {
        let d = Dirents::new();
        let dir = DirBody::new(1);
        let stats = Stats::default();
        d.publish(5, &dir, b"a", 1, &stats).unwrap();
        assert_eq!(d.kill_if_empty(5, &dir, &stats), Err(Errno::ENOTEMPTY));
        assert_eq!(dir.life.load(Relaxed), DIR_ALIVE);
        d.remove(5, b"a", &stats).unwrap();
        assert_eq!(d.kill_if_empty(5, &dir, &stats), Ok(()));
        assert_eq!(dir.life.load(Relaxed), DIR_DEAD);
        assert_eq!(d.publish(5, &dir, b"b", 2, &stats), Err(Errno::ENOENT));
        assert_eq!(
            d.count(5, &dir, &stats),
            0,
            "the backed-out entry left no trace"
        );
        assert_eq!(d.get(5, b"b", &stats), None);
    }

    #[test]
    fn rmdir_and_create_race_never_lose_an_entry() {
        // One thread repeatedly tries to kill a directory while another creates and removes
        // an entry in it. Invariant: a publish that succeeded happened in a directory that was
        // alive at that moment, and a directory declared dead has no entry in either table.
        for _ in 0..300 {
            let d = Dirents::new();
            let dir = DirBody::new(1);
            let stats = Stats::default();
            let (published, killed) = std::thread::scope(|s| {
                let creator = s.spawn(|| {
                    let mut ok = 0;
                    for i in 0..20u64 {
                        let name = format!("n{i}");
                        match d.publish(3, &dir, name.as_bytes(), i, &stats) {
                            Ok(_) => {
                                ok += 1;
                                if i % 2 == 0 {
                                    d.remove(3, name.as_bytes(), &stats).unwrap();
                                    ok -= 1;
                                }
                            }
                            Err(e) => {
                                assert_eq!(e, Errno::ENOENT);
                                break;
                            }
                        }
                    }
                    ok
                });
                let killer = s.spawn(|| {
                    loop {
                        match d.kill_if_empty(3, &dir, &stats) {
                            Ok(()) => return true,
                            Err(_) => {
                                if dir.slot_mask.load(Relaxed) != 0 && d.count(3, &dir, &stats) > 5
                                {
                                    return false;
                                }
                                std::thread::yield_now();
                            }
                        }
                    }
                });
                (creator.join().unwrap(), killer.join().unwrap())
            });
            let remaining = d.count(3, &dir, &stats);
            assert_eq!(
                remaining, published,
                "index count matches the creator's view"
            );
            assert_eq!(d.len() as u64, published, "map matches the index");
            if killed {
                assert_eq!(published, 0, "a dead directory holds nothing");
            }
        }
    }
}
