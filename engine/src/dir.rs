//! Directory entries: two filesystem-wide tables, no per-directory container.
//!
//! 1. The **dirent map** (`scc::HashMap`), keyed by `(parent ino, name)`, gives `(ino_gen,
//!    cookie)`. Lookups read it under a per-bucket read lock, the only lock a lookup takes
//!    (DESIGN §3). `scc::HashMap` frees a removed entry in place (unlike `scc::HashIndex`,
//!    whose epoch-deferred removal piles dead copies of a re-used name into one bucket:
//!    `notes/prototype-crunl.md`).
//! 2. The **ordered index**: 256 mutex-protected shards of `BTreeMap<(parent, cookie), name>`
//!    plus a per-`(parent, slot)` entry count. It gives readdir its stable order and resumable
//!    offsets, rmdir its emptiness test and `stat` a directory's size.
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
//! Readdir walks the slots in order, each slot's range in cookie order, which is cookie order.
//! A directory records in `slot_mask` which slots ever inserted in it, so readdir and the
//! emptiness test visit only those shards.

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::*, fence};

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;
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
const _: () = assert!(NSHARDS >= NSLOTS && NSHARDS.is_power_of_two());

/// A name as kept in the ordered index (inline up to 16 bytes).
pub(crate) type Name = SmallVec<[u8; 16]>;

/// Key of the dirent map: the parent's inode number (8 bytes, little-endian), then the name.
/// Inline up to 16-byte names.
#[derive(PartialEq, Eq, Hash)]
pub(crate) struct Key(SmallVec<[u8; 24]>);

impl Borrow<[u8]> for Key {
    fn borrow(&self) -> &[u8] {
        &self.0
    }
}

impl Key {
    pub fn parent(&self) -> Ino {
        u64::from_le_bytes(self.0[..8].try_into().expect("8-byte prefix"))
    }

    pub fn name(&self) -> &[u8] {
        &self.0[8..]
    }
}

/// The bytes of a key, built on the stack (inline up to 40-byte names) for lookups.
type KeyBuf = SmallVec<[u8; 48]>;

#[inline]
fn key_buf(parent: Ino, name: &[u8]) -> KeyBuf {
    debug_assert!(name.len() <= NAME_MAX);
    let mut k = KeyBuf::new();
    k.extend_from_slice(&parent.to_le_bytes());
    k.extend_from_slice(name);
    k
}

/// A directory entry's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Dirent {
    pub ino_gen: u64,
    pub cookie: u64,
}

#[derive(Default)]
struct Shard {
    index: BTreeMap<(Ino, u64), Name>,
    counts: HashMap<(Ino, u8), u32, foldhash::fast::RandomState>,
}

pub(crate) struct Dirents {
    map: scc::HashMap<Key, Dirent, foldhash::fast::RandomState>,
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
            // A floor on capacity: scc shrinks a table that empties, and a tiny table under
            // many threads makes them queue on its few buckets (notes/prototype-crunl.md).
            map: scc::HashMap::with_capacity_and_hasher(1 << 12, Default::default()),
            shards: (0..NSHARDS)
                .map(|_| CachePadded::new(Mutex::new(Shard::default())))
                .collect(),
            cookie_seq: PerSlot::new(|_| AtomicU64::new(0)),
        }
    }

    /// The entry `name` in `parent`.
    #[inline]
    pub fn get(&self, parent: Ino, name: &[u8]) -> Option<Dirent> {
        self.map.read_sync(&key_buf(parent, name)[..], |_, v| *v)
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
        {
            let mut sh = stats.lock(LockClass::IndexShard, &self.shards[shard_of(parent, slot)]);
            sh.index.insert((parent, cookie), Name::from_slice(name));
            *sh.counts.entry((parent, slot as u8)).or_insert(0) += 1;
        }
        fence(SeqCst);
        let mut life = dir.life.load(SeqCst);
        if life == DIR_DYING {
            life = wait_outcome(dir);
        }
        if life != DIR_ALIVE {
            self.index_remove(parent, cookie, stats);
            return Err(Errno::ENOENT);
        }
        let fresh = self.map.insert_sync(
            Key(SmallVec::from_slice(&key_buf(parent, name))),
            Dirent { ino_gen, cookie },
        );
        assert!(fresh.is_ok(), "name published twice under its stripe lock");
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
    /// from the index.
    pub fn remove(&self, parent: Ino, name: &[u8], stats: &Stats) -> Option<Dirent> {
        let (_, de) = self.map.remove_sync(&key_buf(parent, name)[..])?;
        self.index_remove(parent, de.cookie, stats);
        Some(de)
    }

    fn index_remove(&self, parent: Ino, cookie: u64, stats: &Stats) {
        let slot = slot_of(cookie);
        let mut sh = stats.lock(LockClass::IndexShard, &self.shards[shard_of(parent, slot)]);
        let gone = sh.index.remove(&(parent, cookie));
        assert!(
            gone.is_some(),
            "index entry ({parent}, {cookie:#x}) missing"
        );
        let key = (parent, slot as u8);
        let c = sh.counts.get_mut(&key).expect("count of a present entry");
        *c -= 1;
        if *c == 0 {
            sh.counts.remove(&key);
        }
    }

    /// Points existing entry `name` at `ino_gen` in place (the entry never disappears, so a
    /// concurrent lookup sees the old or the new inode); returns the old value.
    pub fn repoint(&self, parent: Ino, name: &[u8], ino_gen: u64) -> Option<Dirent> {
        self.map.update_sync(&key_buf(parent, name)[..], |_, v| {
            let old = *v;
            v.ino_gen = ino_gen;
            old
        })
    }

    /// Entries in directory `ino` (published or being published).
    pub fn count(&self, ino: Ino, dir: &DirBody, stats: &Stats) -> u64 {
        let mask = dir.slot_mask.load(SeqCst);
        let mut n = 0u64;
        for slot in (0..NSLOTS).filter(|s| mask & (1 << s) != 0) {
            let sh = stats.lock(LockClass::IndexShard, &self.shards[shard_of(ino, slot)]);
            n += *sh.counts.get(&(ino, slot as u8)).unwrap_or(&0) as u64;
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
            for (&(_, cookie), name) in sh.index.range((ino, lo)..=(ino, hi)) {
                out.push((cookie, name.clone()));
                if out.len() >= max {
                    return;
                }
            }
        }
    }

    /// Visits every entry of the map (for the invariant checker).
    pub fn for_each(&self, mut f: impl FnMut(Ino, &[u8], Dirent)) {
        self.map.iter_sync(|k, v| {
            f(k.parent(), k.name(), *v);
            true
        });
    }

    /// Visits every entry of the index (for the invariant checker).
    pub fn for_each_indexed(&self, mut f: impl FnMut(Ino, u64, &[u8])) {
        for sh in self.shards.iter() {
            let sh = sh.lock();
            for (&(p, c), name) in &sh.index {
                f(p, c, name);
            }
        }
    }

    /// Entries in the dirent map.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inode::DIR_DEAD;

    #[test]
    fn key_layout_and_borrowed_lookup() {
        let k = Key(SmallVec::from_slice(&key_buf(0x0102, b"abc")));
        assert_eq!(k.parent(), 0x0102);
        assert_eq!(k.name(), b"abc");
        let d = Dirents::new();
        let dir = DirBody::new(1);
        let stats = Stats::default();
        let c = d.publish(7, &dir, b"x", 42, &stats).unwrap();
        assert!(c >= FIRST_COOKIE);
        assert_eq!(
            d.get(7, b"x"),
            Some(Dirent {
                ino_gen: 42,
                cookie: c
            })
        );
        assert_eq!(d.get(8, b"x"), None, "parent is part of the key");
        assert_eq!(d.get(7, b"xx"), None);
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
        assert_eq!(d.get(5, b"b"), None);
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
