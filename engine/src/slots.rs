//! Thread slots: the engine's stand-in for per-CPU data.
//!
//! Each OS thread that calls into the engine is given a *slot*, a small integer below
//! [`NSLOTS`], on its first call; the slot is returned to a pool when the thread exits, so a
//! pool of threads that comes and goes reuses a few slots. Per-slot state ([`PerSlot`]) is the
//! engine's way to keep hot counters and allocators off shared cache lines: inode-number batches,
//! readdir-cookie sequences, open-file table shards and statistics all live in the slot of the
//! thread that uses them, each padded to its own cache line.
//!
//! When more than [`NSLOTS`] threads are alive at once, later threads share the least-used slot.
//! Everything kept per slot stays correct when shared (it is behind a lock or an atomic
//! read-modify-write), and only gets slower.

use std::cell::Cell;
use std::sync::Mutex;

use crossbeam_utils::CachePadded;

/// Number of thread slots. Directories keep one bit per slot (a `u64` mask), so this is 64.
pub const NSLOTS: usize = 64;
const _: () = assert!(NSLOTS == 64, "dir slot masks are u64");

struct Pool {
    /// How many live threads hold each slot.
    users: [u32; NSLOTS],
}

impl Pool {
    /// Takes the least-used slot, lowest index first: unshared while fewer than NSLOTS threads
    /// hold one.
    fn take(&mut self) -> usize {
        let (slot, _) = self
            .users
            .iter()
            .enumerate()
            .min_by_key(|&(i, &n)| (n, i))
            .expect("NSLOTS > 0");
        self.users[slot] += 1;
        slot
    }

    fn give(&mut self, slot: usize) {
        debug_assert!(self.users[slot] > 0);
        self.users[slot] -= 1;
    }
}

static POOL: Mutex<Pool> = Mutex::new(Pool { users: [0; NSLOTS] });

/// The calling thread's slot, released to the pool when the thread exits.
struct SlotLease(usize);

impl SlotLease {
    fn acquire() -> Self {
        SlotLease(POOL.lock().unwrap_or_else(|e| e.into_inner()).take())
    }
}

impl Drop for SlotLease {
    fn drop(&mut self) {
        POOL.lock().unwrap_or_else(|e| e.into_inner()).give(self.0);
    }
}

thread_local! {
    static LEASE: SlotLease = SlotLease::acquire();
    static CACHED: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// The calling thread's slot in `0..NSLOTS`.
#[inline]
pub fn current() -> usize {
    let s = CACHED.with(Cell::get);
    if s != usize::MAX {
        return s;
    }
    let s = LEASE.try_with(|l| l.0).unwrap_or(0);
    CACHED.with(|c| c.set(s));
    s
}

/// One `T` per thread slot, each on its own cache line.
pub struct PerSlot<T> {
    slots: Box<[CachePadded<T>]>,
}

impl<T> PerSlot<T> {
    /// Builds every slot's value with `f(slot)`.
    pub fn new(mut f: impl FnMut(usize) -> T) -> Self {
        PerSlot {
            slots: (0..NSLOTS).map(|i| CachePadded::new(f(i))).collect(),
        }
    }

    /// The calling thread's value.
    #[inline]
    pub fn local(&self) -> &T {
        &self.slots[current()]
    }

    /// Slot `i`'s value.
    #[inline]
    pub fn get(&self, i: usize) -> &T {
        &self.slots[i]
    }

    /// All slots' values, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().map(|c| &**c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_hands_out_distinct_slots_then_shares_the_least_used() {
        let mut pool = Pool { users: [0; NSLOTS] };
        let first: Vec<usize> = (0..NSLOTS).map(|_| pool.take()).collect();
        let mut sorted = first.clone();
        sorted.sort();
        assert_eq!(
            sorted,
            (0..NSLOTS).collect::<Vec<_>>(),
            "first NSLOTS takes are distinct"
        );
        // Past NSLOTS, slots are shared, one more user each in turn.
        assert_eq!(pool.take(), 0);
        assert_eq!(pool.take(), 1);
        // A released slot is handed out again before any shared one gets a third user.
        pool.give(5);
        assert_eq!(pool.take(), 5);
        pool.give(7);
        pool.give(1);
        pool.give(1);
        assert_eq!(pool.take(), 1, "slot 1 has no user left");
    }

    #[test]
    fn slot_is_stable_within_a_thread() {
        let s = current();
        assert!(s < NSLOTS);
        assert_eq!(current(), s);
    }
}
