//! The atomics of the engine's two fence protocols, the directory-removal protocol
//! (`dir/life.rs`) and the revocation grace period (`revoke.rs`), from `std` normally and
//! from `loom` when the crate is built with `RUSTFLAGS="--cfg loom"`, so that the loom models
//! in those two files explore the very code the engine runs. Nothing else in the engine uses
//! this module: the rest is checked by the stress and model tests and by the sanitizers
//! (`docs/TESTING.md`).

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU8, AtomicU32, fence};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU8, AtomicU32, fence};

/// One round of a wait loop: spins a little, then yields the processor to the thread it waits
/// for (under loom, always yields: loom explores only schedules where a waiter lets the
/// awaited thread run).
#[inline]
pub(crate) fn wait_round(round: u32) {
    #[cfg(loom)]
    {
        let _ = round;
        loom::thread::yield_now();
    }
    #[cfg(not(loom))]
    {
        if round < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}
