//! File data out of memory: reading pages the store keeps, and the eviction pass.
//!
//! With a store that holds file pages (the disk store's checkpoint), a page the store holds
//! may leave memory (`data.rs`, "Pages the store keeps", says when). Pages come into memory
//! only when changed (a read of a kept page copies it from the store into the caller's
//! buffer and keeps nothing; the store has a page cache of its own), so what memory holds
//! is what changed since the last checkpoint, and a cache of pages changed before it.
//!
//! **The eviction pass** bounds that cache: after the store declares an epoch kept, the next
//! read or write that notices (one atomic comparison) runs a pass, if no other thread is
//! running one: when more than [`Config::cache_bytes`](crate::Config::cache_bytes) of file
//! data is in memory, it walks the inode table from where the last pass stopped (a clock
//! hand, so that successive passes go round the files), sends out of memory every page of
//! each file that the store holds, and stops once three quarters of the budget are left.
//! A file whose data lock is taken is skipped (the pass try-locks, so it never waits for, or
//! delays, an operation). Pages changed since the last checkpoint stay whatever the budget:
//! the store bounds them by taking checkpoints as they grow, and a writer past its bound
//! waits for one after its operation (`data.rs`, "Changed pages").
//!
//! Locks: the pass holds `evictor` (one per filesystem, try-locked: a thread that finds it
//! held leaves the pass to its holder) and, inside it, one file's `file_data` at a time.

use std::sync::atomic::Ordering::Relaxed;

use crossbeam_epoch as epoch;

use super::Filesystem;
use crate::errno::Result;
use crate::inode::{Body, Inode};

impl Filesystem {
    /// Reads pages `first..` of file `i` from the store into `buf` (`data.rs`'s `Fetch`).
    pub(super) fn fetch_pages(&self, i: &Inode, first: u64, buf: &mut [u8]) -> Result<()> {
        self.store.read_pages(i.id(), first, buf)
    }

    /// Pages of file data in memory (the rest the store keeps, or are runs of allocated
    /// zeros, which cost no page: `data.rs`, "Allocated zeros").
    pub fn resident_pages(&self) -> u64 {
        self.space
            .used()
            .saturating_sub(self.page_epochs.out())
            .saturating_sub(self.page_epochs.zero_pages())
    }

    /// Allocated pages of file data that hold zeros and cost no memory (runs: `data.rs`,
    /// "Allocated zeros"), counted in the space used and `st_blocks` like any page.
    pub fn zero_pages(&self) -> u64 {
        self.page_epochs.zero_pages()
    }

    /// The bound on file data in memory, in bytes (docs/STORE.md, "Memory"): with a store
    /// that keeps pages and has set its budget, the cache ([`crate::Config::cache_bytes`])
    /// and twice the changed pages at which writers wait (what changed since the last kept
    /// checkpoint, and what changed since the one being taken began); otherwise (the memory
    /// store) the size limit, every page written being in memory. Runs of allocated zeros
    /// cost no page whatever their length (`data.rs`, "Allocated zeros"), so `fallocate`,
    /// a `truncate` up and a write far past the end never take memory beyond it.
    pub fn data_memory_bound(&self) -> u64 {
        let pages = match self.page_epochs.limit() {
            Some(limit) => self.cache_pages.saturating_add(limit.saturating_mul(2)),
            None => self.space.limit(),
        };
        pages.saturating_mul(crate::data::PAGE)
    }

    /// Pages of file data out of memory, which the store keeps.
    pub fn pages_out(&self) -> u64 {
        self.page_epochs.out()
    }

    /// After a change of file data (`changed`) waits if more pages changed than the store's
    /// budget allows; then runs an eviction pass if the store declared an epoch kept since
    /// the last one (module doc). Called after an operation on file data released its locks.
    #[inline]
    pub(super) fn after_data_op(&self, changed: bool) {
        let e = &self.page_epochs;
        if changed {
            e.throttle();
        }
        if e.passed.load(Relaxed) != e.kept_epoch() {
            self.evict_pass(Some(self.cache_pages));
        }
    }

    /// Sends out of memory every page of file data the store holds, whatever the budget;
    /// returns how many went (0 with a store that keeps no pages, or when another thread's
    /// pass is running).
    pub fn evict(&self) -> u64 {
        self.evict_pass(None)
    }

    /// One pass (module doc): with `budget`, only when more pages than it are in memory, and
    /// down to three quarters of it; without, every page the store holds.
    fn evict_pass(&self, budget: Option<u64>) -> u64 {
        let Some(mut hand) = self.evictor.try_lock() else {
            return 0;
        };
        let kept = self.page_epochs.kept_epoch();
        self.page_epochs.passed.store(kept, Relaxed);
        let mut resident = self.resident_pages();
        let target = match budget {
            Some(b) if resident <= b => return 0,
            Some(b) => b - b / 4,
            None => 0,
        };
        let mut evicted = 0;
        let mut g = epoch::pin();
        let stopped = self.table.for_each_from(*hand, &mut g, |i| {
            if let Body::File(data) = &i.body {
                if let Some(mut d) = data.try_write() {
                    let n = d.evict(kept, &self.page_epochs);
                    evicted += n;
                    resident = resident.saturating_sub(n);
                }
            }
            budget.is_none() || resident > target
        });
        *hand = stopped.map_or(*hand, |i| crate::id::Ino(i.0 + 1));
        evicted
    }
}
