//! Stamps: the order of records appended by different threads, without a shared counter.
//!
//! The engine appends a record while holding the locks that order its change (engine
//! `locking.rs`); two records whose order matters are appended under a common lock, or one's
//! operation causally follows the other's. Each thread writes its records to its own buffer,
//! stamped with the time-stamp counter, and the committer merges the buffers by stamp. For
//! that merge to be a valid order, a record appended after another (in the happens-before
//! sense) must carry a larger stamp. The time-stamp counter gives this when it is invariant
//! and synchronized across CPUs (the kernel then uses it as its clocksource): the earlier
//! record's stamp is read before its thread releases the lock (a read of the counter retires
//! before any later store becomes visible), the later one's after its thread acquired it
//! (`lfence` keeps the read from running before the acquiring load completes), and a lock
//! handoff takes many cycles, so the later stamp is strictly larger. This is the argument of
//! ScaleFS's per-core operation logs.
//!
//! Where the counter cannot be trusted (not x86-64, or the kernel does not use it as its
//! clock), stamps come from one shared atomic counter instead: correct everywhere, one shared
//! cache line per record.

use std::sync::atomic::{AtomicU64, Ordering};

/// The source of stamps (see the module doc): an order of records, not a time (the store's
/// time, for the checkpointer's waits, is [`crate::clock::Clock`]).
#[derive(Debug)]
pub(crate) struct StampClock {
    tsc: bool,
    counter: AtomicU64,
}

impl StampClock {
    /// The time-stamp counter if it can be trusted here, else a shared counter.
    pub(crate) fn new() -> StampClock {
        StampClock {
            tsc: tsc_is_trusted(),
            counter: AtomicU64::new(1),
        }
    }

    /// A shared counter, whatever the machine (for tests of the fallback).
    #[cfg(test)]
    pub(crate) fn counter() -> StampClock {
        StampClock {
            tsc: false,
            counter: AtomicU64::new(1),
        }
    }

    /// Whether stamps come from the time-stamp counter.
    pub(crate) fn uses_tsc(&self) -> bool {
        self.tsc
    }

    /// A stamp larger than every stamp read before this call began (in happens-before
    /// order), and never 0.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        #[cfg(target_arch = "x86_64")]
        if self.tsc {
            // SAFETY: `lfence` and `rdtsc` exist on every x86-64 processor; they read no
            // memory.
            let t = unsafe {
                core::arch::x86_64::_mm_lfence();
                core::arch::x86_64::_rdtsc()
            };
            return t.max(1);
        }
        self.counter.fetch_add(1, Ordering::SeqCst)
    }
}

/// Whether the time-stamp counter orders events across CPUs here: x86-64, marked constant and
/// non-stop, and chosen by the kernel as its clocksource (which it does only after checking
/// that the CPUs' counters agree).
fn tsc_is_trusted() -> bool {
    if !cfg!(target_arch = "x86_64") {
        return false;
    }
    let source =
        std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
            .unwrap_or_default();
    let flags = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let has = |f: &str| {
        flags
            .lines()
            .find(|l| l.starts_with("flags"))
            .is_some_and(|l| l.split_whitespace().any(|w| w == f))
    };
    source.trim() == "tsc" && has("constant_tsc") && has("nonstop_tsc")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Stamps taken under a lock, by threads handing it to each other, increase in the order
    /// the lock was held, with either source.
    #[test]
    fn stamps_follow_lock_handoffs() {
        for clock in [StampClock::new(), StampClock::counter()] {
            let log = Mutex::new(Vec::new());
            std::thread::scope(|s| {
                for _ in 0..4 {
                    s.spawn(|| {
                        for _ in 0..20_000 {
                            let mut l = log.lock().unwrap();
                            let t = clock.now();
                            l.push(t);
                        }
                    });
                }
            });
            let log = log.into_inner().unwrap();
            assert!(
                log.windows(2).all(|w| w[0] < w[1]),
                "tsc {}: stamps out of lock order",
                clock.uses_tsc()
            );
        }
    }
}
