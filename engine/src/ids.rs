//! Inode-number allocation without a global lock (DESIGN §3).
//!
//! Each thread slot owns a range of fresh numbers, taken from a global atomic 1024 at a time,
//! and a free list of numbers it recycled (LIFO, so a create/unlink loop keeps reusing the same
//! few slots of the inode table). A number is recycled with its generation incremented, so an
//! `(ino, generation)` pair is never handed out twice until the 24-bit generation wraps. Free
//! lists that grow long spill half their numbers to a shared overflow list, which slots drain
//! before taking fresh ranges.
//!
//! Batches are multiples of 8 numbers, so two slots never allocate inodes whose table entries
//! share a cache line.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;

use crate::attr::{Ino, ROOT_INO};
use crate::errno::{Errno, Result};
use crate::inode::{INO_BITS, INO_MASK};
use crate::slots::PerSlot;
use crate::stats::{LockClass, Stats};
use crate::table::MAX_INO;

const BATCH: u64 = 1024;
const SPILL: usize = 4096;
const GEN_MASK: u64 = (1 << (64 - INO_BITS)) - 1;
const _: () = assert!(BATCH % 8 == 0);

#[derive(Default)]
struct SlotIds {
    fresh: Range<u64>,
    free: Vec<u64>,
}

pub(crate) struct InoAlloc {
    next: AtomicU64,
    slots: PerSlot<Mutex<SlotIds>>,
    spill: Mutex<Vec<Vec<u64>>>,
}

impl InoAlloc {
    pub fn new() -> Self {
        InoAlloc {
            // The first batch starts above the root (1); 0 is never an inode number.
            next: AtomicU64::new(BATCH),
            slots: PerSlot::new(|_| Mutex::new(SlotIds::default())),
            spill: Mutex::new(Vec::new()),
        }
    }

    /// The root's `ino_gen`.
    pub fn root(&self) -> u64 {
        ROOT_INO
    }

    /// A free `ino_gen`.
    pub fn alloc(&self, stats: &Stats) -> Result<u64> {
        let mut s = stats.lock(LockClass::InoAlloc, self.slots.local());
        if let Some(x) = s.free.pop() {
            return Ok(x);
        }
        if s.fresh.is_empty() {
            if let Some(batch) = self.spill.lock().pop() {
                s.free = batch;
                return Ok(s.free.pop().expect("spilled batches are non-empty"));
            }
            let start = self.next.fetch_add(BATCH, Relaxed);
            if start + BATCH - 1 > MAX_INO {
                return Err(Errno::ENOSPC);
            }
            s.fresh = start..start + BATCH;
        }
        Ok(s.fresh.next().expect("non-empty range"))
    }

    /// Recycles a freed `ino_gen`: its number comes back with the next generation.
    pub fn free(&self, ino_gen: u64, stats: &Stats) {
        let ino: Ino = ino_gen & INO_MASK;
        if ino == ROOT_INO {
            return;
        }
        let next_gen = ((ino_gen >> INO_BITS) + 1) & GEN_MASK;
        let mut s = stats.lock(LockClass::InoAlloc, self.slots.local());
        s.free.push((next_gen << INO_BITS) | ino);
        if s.free.len() >= 2 * SPILL {
            let half = s.free.split_off(SPILL);
            drop(s);
            self.spill.lock().push(half);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn unique_across_threads_and_recycled_with_new_generation() {
        let a = InoAlloc::new();
        let stats = Stats::default();
        let all: Vec<u64> = std::thread::scope(|s| {
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
        let set: HashSet<u64> = all.iter().copied().collect();
        assert_eq!(set.len(), all.len(), "no number handed out twice");
        assert!(!set.contains(&0) && !set.contains(&ROOT_INO));
        let x = all[0];
        a.free(x, &stats);
        let y = a.alloc(&stats).unwrap();
        assert_eq!(y & INO_MASK, x & INO_MASK, "LIFO reuse of the number");
        assert_eq!(
            y >> INO_BITS,
            (x >> INO_BITS) + 1,
            "with the next generation"
        );
    }

    #[test]
    fn long_free_lists_spill_and_are_reused() {
        let a = InoAlloc::new();
        let stats = Stats::default();
        let got: Vec<u64> = (0..2 * SPILL as u64)
            .map(|_| a.alloc(&stats).unwrap())
            .collect();
        for &x in &got {
            a.free(x, &stats);
        }
        assert_eq!(a.spill.lock().len(), 1);
        // Another thread drains the spill before taking fresh numbers.
        let from_other =
            std::thread::scope(|s| s.spawn(|| a.alloc(&stats).unwrap()).join().unwrap());
        assert!(
            from_other >> INO_BITS == 1,
            "a recycled number, generation 1"
        );
    }
}
