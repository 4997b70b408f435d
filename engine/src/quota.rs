//! A space counter without a global hot spot: the size and inode limits (ENOSPC).
//!
//! Like the kernel's `percpu_counter`, each thread slot keeps a private reserve taken from the
//! global pool in batches, so a write or create touches the shared pool once per batch. Near
//! the limit (less than `NSLOTS` batches left) batching stops and every request goes to the
//! pool directly; a request the pool cannot satisfy first pulls every slot's reserve back, so
//! ENOSPC is reported only when the space is really gone (up to requests racing the drain).

use std::sync::atomic::{AtomicU64, Ordering::*};

use crate::errno::{Errno, Result};
use crate::slots::{NSLOTS, PerSlot};

pub(crate) struct Quota {
    limit: u64,
    batch: u64,
    pool: AtomicU64,
    reserve: PerSlot<AtomicU64>,
}

impl Quota {
    pub fn new(limit: u64, batch: u64) -> Self {
        Quota {
            limit,
            batch,
            pool: AtomicU64::new(limit),
            reserve: PerSlot::new(|_| AtomicU64::new(0)),
        }
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    fn low_water(&self) -> u64 {
        self.batch.saturating_mul(2 * NSLOTS as u64)
    }

    /// Takes `n` units, or fails with ENOSPC.
    pub fn take(&self, n: u64) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let local = self.reserve.local();
        if local
            .fetch_update(Relaxed, Relaxed, |r| r.checked_sub(n))
            .is_ok()
        {
            return Ok(());
        }
        for attempt in 0..2 {
            let got = self.pool.fetch_update(AcqRel, Acquire, |p| {
                if p < n {
                    None
                } else if p >= self.low_water() {
                    Some(p - (n + self.batch).min(p))
                } else {
                    Some(p - n)
                }
            });
            if let Ok(p) = got {
                let extra = if p >= self.low_water() {
                    (n + self.batch).min(p) - n
                } else {
                    0
                };
                if extra > 0 {
                    local.fetch_add(extra, Relaxed);
                }
                return Ok(());
            }
            if attempt == 0 {
                self.drain();
            }
        }
        Err(Errno::ENOSPC)
    }

    /// Returns `n` units.
    pub fn give(&self, n: u64) {
        if n == 0 {
            return;
        }
        if self.pool.load(Relaxed) < self.low_water() {
            self.pool.fetch_add(n, AcqRel);
            return;
        }
        let local = self.reserve.local();
        let r = local.fetch_add(n, Relaxed) + n;
        if r > 2 * self.batch {
            let back = local.swap(0, Relaxed);
            self.pool.fetch_add(back, AcqRel);
        }
    }

    fn drain(&self) {
        for r in self.reserve.iter() {
            let v = r.swap(0, Relaxed);
            if v > 0 {
                self.pool.fetch_add(v, AcqRel);
            }
        }
    }

    /// Units in use (exact when no request is in flight).
    pub fn used(&self) -> u64 {
        let free: u64 =
            self.pool.load(Acquire) + self.reserve.iter().map(|r| r.load(Relaxed)).sum::<u64>();
        self.limit.saturating_sub(free)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_limit_single_thread() {
        let q = Quota::new(1000, 16);
        for _ in 0..1000 {
            q.take(1).unwrap();
        }
        assert_eq!(q.take(1), Err(Errno::ENOSPC));
        assert_eq!(q.used(), 1000);
        q.give(10);
        assert_eq!(q.used(), 990);
        q.take(10).unwrap();
        assert_eq!(q.take(1), Err(Errno::ENOSPC));
    }

    #[test]
    fn reserves_of_other_threads_are_reclaimed() {
        // Thread A leaves a batch in its reserve; B must still get the last units.
        let q = Quota::new(1_000_000, 1000);
        std::thread::scope(|s| {
            s.spawn(|| q.take(1).unwrap()).join().unwrap();
        });
        assert!(
            q.reserve.iter().any(|r| r.load(Relaxed) == 1000),
            "A kept a batch"
        );
        let mut taken = 1;
        while q.take(1).is_ok() {
            taken += 1;
        }
        assert_eq!(taken, 1_000_000);
        assert_eq!(q.used(), 1_000_000);
    }

    #[test]
    fn concurrent_take_give_conserves_units() {
        let q = Quota::new(1 << 20, 64);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for i in 0..20_000u64 {
                        q.take(1 + i % 3).unwrap();
                        q.give(1 + i % 3);
                    }
                });
            }
        });
        assert_eq!(q.used(), 0);
    }
}
