//! Inode identity: numbers, generations, and their allocation without a global lock.
//!
//! An inode is named by its **number** ([`Ino`], what `stat` shows and FUSE calls the node
//! id) and its **generation** ([`Generation`]). Numbers are reused once an inode is freed (so
//! the inode table stays dense); generations never are: every inode ever created gets a
//! generation no other inode had, so `(number, generation)` ([`InodeId`]) is unique over the
//! life of the filesystem, across restarts of a durable store too (the store keeps the
//! highest generation it has seen, and [`InoAlloc::observe`] starts above it).
//!
//! Inside the engine, directory entries and the keys of directory entries name an inode by a
//! packed word ([`InoGen`]): the number in the low 28 bits and the low 36 bits of the
//! generation above them. The packed word tells an inode from any other that held its number
//! before or after it (their generations differ in the low bits unless 2^36 inodes were
//! created in between, which takes hours at the engine's fastest rate, while the word is only
//! ever compared within one operation or against a live entry). Records and everything
//! outside the engine use the full [`InodeId`].
//!
//! # Allocation
//! Each thread slot owns a range of fresh numbers, taken from a global atomic 1024 at a time,
//! a range of generations taken the same way, and a free list of numbers it recycled (last in,
//! first out, so a create/unlink loop keeps reusing a few slots of the inode table). Free lists
//! that grow long spill half their numbers to a shared overflow list, which slots drain before
//! taking fresh ranges. Batches are multiples of 8 numbers, so two slots never allocate inodes
//! whose table entries share a cache line.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;

use crate::errno::{Errno, Result};
use crate::slots::PerSlot;
use crate::stats::{LockClass, Stats};

/// An inode number: what `stat` reports as `st_ino`, and the FUSE node id. Numbers are reused
/// after an inode is freed; with its [`Generation`] it names one inode forever.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ino(pub u64);

impl Ino {
    /// The root directory (FUSE's `FUSE_ROOT_ID`).
    pub const ROOT: Ino = Ino(1);

    /// The number as an integer.
    #[inline]
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Ino {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The root directory's inode number.
pub const ROOT_INO: Ino = Ino::ROOT;

/// An inode's generation: never given to two inodes of one filesystem.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Generation(pub u64);

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// An inode over the life of the filesystem: its number and generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct InodeId {
    /// Number.
    pub ino: Ino,
    /// Generation.
    pub generation: Generation,
}

impl InodeId {
    /// The root directory (generation 0).
    pub const ROOT: InodeId = InodeId {
        ino: Ino::ROOT,
        generation: Generation(0),
    };

    #[inline]
    pub(crate) fn key(self) -> InoGen {
        InoGen::new(self.ino, self.generation)
    }
}

impl fmt::Display for InodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.ino, self.generation)
    }
}

/// Bits of an inode number (the inode table holds `2^INO_BITS - 1` numbers).
pub(crate) const INO_BITS: u32 = 28;
/// Largest inode number.
pub(crate) const MAX_INO: u64 = (1 << INO_BITS) - 1;
const GEN_BITS: u32 = 64 - INO_BITS;

/// The packed `(number, low generation bits)` word that names an inode inside the engine
/// (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct InoGen(u64);

impl InoGen {
    /// The root directory's word.
    pub const ROOT: InoGen = InoGen(1);

    #[inline]
    pub fn new(ino: Ino, generation: Generation) -> InoGen {
        debug_assert!(ino.0 <= MAX_INO);
        InoGen(ino.0 | generation.0 << INO_BITS)
    }

    #[inline]
    pub const fn from_raw(raw: u64) -> InoGen {
        InoGen(raw)
    }

    #[inline]
    pub fn raw(self) -> u64 {
        self.0
    }

    #[inline]
    pub fn ino(self) -> Ino {
        Ino(self.0 & MAX_INO)
    }
}

const BATCH: u64 = 1024;
const SPILL: usize = 4096;
const _: () = assert!(BATCH % 8 == 0 && GEN_BITS >= 32);

#[derive(Default)]
struct SlotIds {
    fresh: Range<u64>,
    free: Vec<u64>,
    generations: Range<u64>,
}

/// Allocates inode numbers and generations (see the module doc).
pub(crate) struct InoAlloc {
    next_ino: AtomicU64,
    next_gen: AtomicU64,
    slots: PerSlot<Mutex<SlotIds>>,
    spill: Mutex<Vec<Vec<u64>>>,
}

impl InoAlloc {
    pub fn new() -> Self {
        InoAlloc {
            // The first batch starts above the root (1); 0 is never an inode number. The root
            // has generation 0, every other inode a later one.
            next_ino: AtomicU64::new(BATCH),
            next_gen: AtomicU64::new(1),
            slots: PerSlot::new(|_| Mutex::new(SlotIds::default())),
            spill: Mutex::new(Vec::new()),
        }
    }

    /// A free number with a generation never used before.
    pub fn alloc(&self, stats: &Stats) -> Result<InodeId> {
        let mut s = stats.lock(LockClass::InoAlloc, self.slots.local());
        if s.generations.is_empty() {
            let start = self.next_gen.fetch_add(BATCH, Relaxed);
            s.generations = start..start + BATCH;
        }
        let generation = Generation(s.generations.next().expect("non-empty range"));
        let ino = match s.free.pop() {
            Some(x) => x,
            None => {
                if s.fresh.is_empty() {
                    if let Some(batch) = self.spill.lock().pop() {
                        s.free = batch;
                    } else {
                        let start = self.next_ino.fetch_add(BATCH, Relaxed);
                        if start + BATCH - 1 > MAX_INO {
                            return Err(Errno::ENOSPC);
                        }
                        s.fresh = start..start + BATCH;
                    }
                }
                match s.free.pop() {
                    Some(x) => x,
                    None => s.fresh.next().expect("non-empty range"),
                }
            }
        };
        Ok(InodeId {
            ino: Ino(ino),
            generation,
        })
    }

    /// Recycles a freed number (its next inode gets a new generation).
    pub fn free(&self, ino: Ino, stats: &Stats) {
        if ino == Ino::ROOT {
            return;
        }
        let mut s = stats.lock(LockClass::InoAlloc, self.slots.local());
        s.free.push(ino.0);
        if s.free.len() >= 2 * SPILL {
            let half = s.free.split_off(SPILL);
            drop(s);
            self.spill.lock().push(half);
        }
    }

    /// Records that `id` exists or existed (an inode named by a record that recovery
    /// replays): fresh numbers are taken above its number and fresh generations above its
    /// generation. Numbers that recovery frees go back to the free lists like any other.
    pub fn observe(&self, id: InodeId) {
        let above = (id.ino.0 / BATCH + 1) * BATCH;
        self.next_ino.fetch_max(above, Relaxed);
        self.next_gen.fetch_max(id.generation.0 + 1, Relaxed);
    }
}

impl InoAlloc {
    /// After recovery: numbers above `floor` and below the fresh range that no inode holds
    /// (`in_use`) become free, in batches on the shared overflow list.
    pub fn reclaim(&self, floor: Ino, mut in_use: Vec<Ino>, stats: &Stats) {
        in_use.sort_unstable();
        let end = self.next_ino.load(Relaxed);
        let mut used = in_use.iter().map(|i| i.0).peekable();
        let mut batch = Vec::new();
        let mut spill = Vec::new();
        for n in (floor.0.max(Ino::ROOT.0) + 1)..end {
            while used.next_if(|&u| u < n).is_some() {}
            if used.peek() == Some(&n) {
                continue;
            }
            batch.push(n);
            if batch.len() == SPILL {
                spill.push(std::mem::take(&mut batch));
            }
        }
        if !batch.is_empty() {
            spill.push(batch);
        }
        let _ = stats;
        // Reversed, so that a slot pops the lowest numbers first.
        for b in &mut spill {
            b.reverse();
        }
        spill.reverse();
        self.spill.lock().extend(spill);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn numbers_unique_across_threads_and_generations_never_repeat() {
        let a = InoAlloc::new();
        let stats = Stats::default();
        let all: Vec<InodeId> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        (0..3000)
                            .map(|_| a.alloc(&stats).unwrap())
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        let inos: HashSet<Ino> = all.iter().map(|i| i.ino).collect();
        assert_eq!(inos.len(), all.len(), "no number handed out twice");
        assert!(!inos.contains(&Ino(0)) && !inos.contains(&Ino::ROOT));
        let gens: HashSet<Generation> = all.iter().map(|i| i.generation).collect();
        assert_eq!(gens.len(), all.len(), "no generation handed out twice");
        assert!(!gens.contains(&Generation(0)), "0 is the root's");
        // A recycled number comes back first, with a generation never seen before.
        let x = all[0];
        a.free(x.ino, &stats);
        let y = a.alloc(&stats).unwrap();
        assert_eq!(y.ino, x.ino, "last in, first out");
        assert!(!gens.contains(&y.generation));
        assert_ne!(y.key(), x.key(), "the packed words differ too");
    }

    #[test]
    fn long_free_lists_spill_and_are_reused() {
        let a = InoAlloc::new();
        let stats = Stats::default();
        let got: Vec<InodeId> = (0..2 * SPILL).map(|_| a.alloc(&stats).unwrap()).collect();
        for x in &got {
            a.free(x.ino, &stats);
        }
        assert_eq!(a.spill.lock().len(), 1);
        // Another thread drains the spill before taking fresh numbers.
        let from_other =
            std::thread::scope(|s| s.spawn(|| a.alloc(&stats).unwrap()).join().unwrap());
        assert!(
            got.iter().any(|g| g.ino == from_other.ino),
            "a recycled number"
        );
    }

    #[test]
    fn observed_ids_are_never_handed_out_again() {
        let a = InoAlloc::new();
        let stats = Stats::default();
        let restored = InodeId {
            ino: Ino(5000),
            generation: Generation(1 << 40),
        };
        a.observe(restored);
        let fresh: Vec<InodeId> = (0..3000).map(|_| a.alloc(&stats).unwrap()).collect();
        assert!(fresh.iter().all(|f| f.ino.0 > 5000));
        assert!(fresh.iter().all(|f| f.generation.0 > 1 << 40));
    }

    #[test]
    fn reclaimed_numbers_are_the_holes() {
        let a = InoAlloc::new();
        let stats = Stats::default();
        a.observe(InodeId {
            ino: Ino(2000),
            generation: Generation(9),
        });
        let used = vec![Ino(2), Ino(5), Ino(2000), Ino(1500)];
        a.reclaim(Ino::ROOT, used.clone(), &stats);
        let got: Vec<u64> = (0..3000).map(|_| a.alloc(&stats).unwrap().ino.0).collect();
        assert!(
            got.iter().all(|n| !used.iter().any(|u| u.0 == *n)),
            "in use"
        );
        assert_eq!(&got[..3], &[3, 4, 6], "holes first, lowest first");
        let set: HashSet<u64> = got.iter().copied().collect();
        assert_eq!(set.len(), got.len());
    }

    #[test]
    fn packed_words_keep_number_and_low_generation() {
        let id = InodeId {
            ino: Ino(MAX_INO),
            generation: Generation((1 << GEN_BITS) + 7),
        };
        let k = id.key();
        assert_eq!(k.ino(), Ino(MAX_INO));
        assert_eq!(k, id.key());
        let other = InodeId {
            generation: Generation(8),
            ..id
        };
        assert_ne!(k, other.key());
        assert_eq!(InodeId::ROOT.key(), InoGen::ROOT);
    }
}
