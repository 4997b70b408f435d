//! The ordered index of one directory: its **runs**, one per thread slot that ever inserted
//! an entry in it, each the addresses of that slot's nodes in cookie order.
//!
//! A directory's runs hang off its [`RunSet`], an immutable list replaced (copied with one
//! more run) when a new slot first inserts. Each run has:
//! - `words`: one word per entry in cookie order, a node's address or, for a removed entry, a
//!   tombstone `cookie << 1 | 1` (a run with more tombstones than entries is compacted). Read
//!   and written only under the run's **index-shard lock** (one of 256, picked by the
//!   directory and the slot), which gives readdir its stable order and resumable offsets;
//! - `live`: how many words are entries (visible or being published), changed under the
//!   shard lock and read without any lock, by `stat` (a directory's size) and by the removal
//!   protocol of `life.rs`, whose argument is about exactly these counts.
//!
//! A slot's cookies only grow (`mod.rs`, "Cookies"), so a run is appended to at its end.
//!
//! # Lifetime
//! Runs and run sets belong to their directory: a run set replaced by a larger one is retired
//! through the epoch (readers may still hold it), and the runs and the last set are freed with
//! the directory's inode, which is itself destroyed only after every epoch guard that could
//! have reached it is gone (`table.rs`). Every reader of a run set holds such a guard.

use std::cell::UnsafeCell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering::*};

use crossbeam_epoch::{Atomic, Guard, Owned, Shared};

use super::node::Node;

/// One slot's entries in one directory (see the module doc).
pub(crate) struct Run {
    words: UnsafeCell<Vec<u64>>,
    live: AtomicU32,
}

/// The runs of one directory: a bit per slot that has a run, and the runs in slot order.
pub(crate) struct RunSet {
    mask: u64,
    runs: Vec<NonNull<Run>>,
}

// SAFETY: a run set is immutable after publication; the runs it points to are shared across
// threads by design: `live` is atomic and `words` is only touched under the run's shard lock.
unsafe impl Send for RunSet {}
// SAFETY: as above.
unsafe impl Sync for RunSet {}

#[inline]
pub(crate) fn is_tomb(w: u64) -> bool {
    w & 1 == 1
}

/// The node of a live word.
///
/// # Safety
/// The caller holds the shard lock of the run that holds `w`, and `w` is not a tombstone.
#[inline]
pub(crate) unsafe fn word_node(w: u64) -> NonNull<Node> {
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
    fn new() -> Run {
        Run {
            words: UnsafeCell::new(Vec::new()),
            live: AtomicU32::new(0),
        }
    }

    /// Entries in the run, read without a lock.
    #[inline]
    pub fn live(&self) -> u32 {
        self.live.load(Relaxed)
    }

    /// The words, for reading.
    ///
    /// # Safety
    /// The caller holds this run's shard lock.
    pub unsafe fn words(&self) -> &[u64] {
        // SAFETY: per the contract, no writer runs concurrently (writers hold the lock too).
        unsafe { &*self.words.get() }
    }

    /// Position of `cookie` (Ok) or where it would go (Err).
    ///
    /// # Safety
    /// The caller holds this run's shard lock.
    pub unsafe fn find(&self, cookie: u64) -> std::result::Result<usize, usize> {
        // SAFETY: per the contract; see `word_cookie`.
        unsafe { self.words() }.binary_search_by_key(&cookie, |&w| unsafe { word_cookie(w) })
    }

    /// Adds a node's word at its cookie's place and counts it (step C2 of the protocol).
    ///
    /// # Safety
    /// The caller holds this run's shard lock, and `node` is alive.
    pub unsafe fn insert(&self, word: u64, cookie: u64) {
        // SAFETY: the shard lock excludes every other access to `words`.
        let words = unsafe { &mut *self.words.get() };
        // Cookies of one slot only grow, but two threads may share a slot and reach the shard
        // lock out of cookie order.
        // SAFETY: under the shard lock.
        let at_end = words
            .last()
            .is_none_or(|&w| unsafe { word_cookie(w) } < cookie);
        if at_end {
            words.push(word);
        } else {
            // SAFETY: under the shard lock.
            let i = unsafe { self.find(cookie) }.expect_err("cookie inserted twice");
            words.insert(i, word);
        }
        self.live.fetch_add(1, Relaxed);
    }

    /// Replaces the word of `cookie`, which must be `old`, by `new`, a node of the same
    /// cookie; the count stays.
    ///
    /// # Safety
    /// The caller holds this run's shard lock, and the node of `new` is alive.
    pub unsafe fn replace(&self, cookie: u64, old: u64, new: u64) {
        // SAFETY: under the shard lock.
        let i = match unsafe { self.find(cookie) } {
            // SAFETY: under the shard lock.
            Ok(i) if unsafe { self.words() }[i] == old => i,
            _ => panic!("index entry with cookie {cookie:#x} missing"),
        };
        // SAFETY: the shard lock excludes every other access to `words`.
        let words = unsafe { &mut *self.words.get() };
        words[i] = new;
    }

    /// Tombstones `cookie` and uncounts it; compacts when tombstones outnumber entries.
    ///
    /// # Safety
    /// The caller holds this run's shard lock.
    pub unsafe fn remove(&self, cookie: u64) {
        // SAFETY: under the shard lock.
        let i = match unsafe { self.find(cookie) } {
            // SAFETY: under the shard lock.
            Ok(i) if !is_tomb(unsafe { self.words() }[i]) => i,
            _ => panic!("index entry with cookie {cookie:#x} missing"),
        };
        // SAFETY: the shard lock excludes every other access to `words`.
        let words = unsafe { &mut *self.words.get() };
        words[i] = cookie << 1 | 1;
        let live = self.live.fetch_sub(1, Relaxed) - 1;
        let dead = words.len() - live as usize;
        if dead > live as usize && dead >= 16 {
            words.retain(|&w| !is_tomb(w));
            if words.capacity() > 2 * words.len() + 16 {
                words.shrink_to_fit();
            }
        }
    }
}

impl RunSet {
    /// Slots that have a run.
    #[inline]
    pub fn mask(&self) -> u64 {
        self.mask
    }

    /// The run of `slot`, if it has one.
    #[inline]
    pub fn get(&self, slot: usize) -> Option<&Run> {
        let bit = 1u64 << slot;
        if self.mask & bit == 0 {
            return None;
        }
        let i = (self.mask & (bit - 1)).count_ones() as usize;
        // SAFETY: runs live as long as their directory, which outlives every reader of its
        // run set (module doc, "Lifetime").
        Some(unsafe { self.runs[i].as_ref() })
    }

    /// Every run, in slot order, with its slot.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &Run)> + '_ {
        let mut mask = self.mask;
        self.runs.iter().map(move |r| {
            let slot = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            // SAFETY: as in `get`.
            (slot, unsafe { r.as_ref() })
        })
    }

    /// Entries in all runs, without a lock.
    pub fn live(&self) -> u64 {
        self.iter().map(|(_, r)| r.live() as u64).sum()
    }
}

/// A directory's pointer to its current run set (null until the first entry).
pub(crate) struct Runs(Atomic<RunSet>);

impl Runs {
    pub fn new() -> Self {
        Runs(Atomic::null())
    }

    /// The current run set, if any.
    #[inline]
    pub fn load<'g>(&self, g: &'g Guard) -> Option<&'g RunSet> {
        // SAFETY: a run set is destroyed only through the epoch after it is replaced (in
        // `run_for`) or with the directory (`Drop`), after every guard that could have loaded
        // it; `g` is such a guard.
        unsafe { self.0.load(Acquire, g).as_ref() }
    }

    /// The run of `slot`, created and published if the slot has none (step C1 of the
    /// protocol, an AcqRel RMW).
    ///
    /// # Safety
    /// The caller holds the index-shard lock of `slot` in this directory, so no other thread
    /// registers the same slot meanwhile.
    pub unsafe fn run_for<'g>(&self, slot: usize, g: &'g Guard) -> &'g Run {
        loop {
            let cur = self.0.load(Acquire, g);
            // SAFETY: as in `load`.
            let set = unsafe { cur.as_ref() };
            if let Some(r) = set.and_then(|s| s.get(slot)) {
                return r;
            }
            let bit = 1u64 << slot;
            let (mask, mut runs) = set.map_or((0, Vec::new()), |s| (s.mask, s.runs.clone()));
            let run = NonNull::from(Box::leak(Box::new(Run::new())));
            let at = (mask & (bit - 1)).count_ones() as usize;
            runs.insert(at, run);
            let new = Owned::new(RunSet {
                mask: mask | bit,
                runs,
            });
            match self.0.compare_exchange(cur, new, AcqRel, Acquire, g) {
                Ok(published) => {
                    if !cur.is_null() {
                        // SAFETY: `cur` is unreachable from now on; guards that loaded it are
                        // waited for by the epoch. Its runs live on in the new set.
                        unsafe { g.defer_destroy(cur) };
                    }
                    // SAFETY: just published; freed only with the directory.
                    return unsafe { published.deref() }.get(slot).expect("just added");
                }
                Err(e) => {
                    // Another slot registered first: drop our copy and its new run, retry.
                    // SAFETY: `run` was leaked above and never published.
                    drop(unsafe { Box::from_raw(run.as_ptr()) });
                    drop(e.new);
                }
            }
        }
    }
}

impl Drop for Runs {
    fn drop(&mut self) {
        // SAFETY: the directory is being destroyed: no reader can reach its run set any more
        // (module doc, "Lifetime").
        let g = unsafe { crossbeam_epoch::unprotected() };
        let cur: Shared<RunSet> = self.0.load(Acquire, g);
        if cur.is_null() {
            return;
        }
        // SAFETY: as above; the set and its runs were leaked for this directory alone.
        let set = unsafe { cur.into_owned() };
        for r in &set.runs {
            // SAFETY: each run was leaked in `run_for` and belongs to this directory only.
            drop(unsafe { Box::from_raw(r.as_ptr()) });
        }
    }
}
