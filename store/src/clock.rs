//! The time seam: where the store reads the time that decides when it tries again after
//! failed checkpoints (`checkpoint/mod.rs`, "Errors"), so that a test can move time itself
//! ([`SimClock`]) and count what the store does at each moment, instead of sleeping.
//!
//! Only those delays go through it; the commit interval, the checkpointer's polling and
//! every timeout of the store's threads are real time.

use std::sync::Arc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// A monotonic clock, real or simulated.
pub trait Clock: Send + Sync + 'static {
    /// The time since an origin of the clock's own (never going back).
    fn now(&self) -> Duration;
}

/// The host's monotonic clock (its origin: the first time any `RealClock` is read).
#[derive(Debug, Default, Clone, Copy)]
pub struct RealClock;

impl Clock for RealClock {
    fn now(&self) -> Duration {
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        ORIGIN.get_or_init(Instant::now).elapsed()
    }
}

/// A clock that moves only when told ([`SimClock::advance`]); it starts at zero. Cloning
/// shares it.
#[derive(Debug, Default, Clone)]
pub struct SimClock {
    now: Arc<Mutex<Duration>>,
}

impl SimClock {
    /// A clock at zero.
    pub fn new() -> SimClock {
        SimClock::default()
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock();
        *now = now.saturating_add(by);
    }
}

impl Clock for SimClock {
    fn now(&self) -> Duration {
        *self.now.lock()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sim_clock_moves_only_when_told_and_clones_share_it() {
        let c = SimClock::new();
        let d = c.clone();
        assert_eq!(c.now(), Duration::ZERO);
        c.advance(Duration::from_millis(1500));
        assert_eq!(d.now(), Duration::from_millis(1500));
        d.advance(Duration::MAX);
        assert_eq!(c.now(), Duration::MAX, "saturates, never wraps");
        let r = RealClock;
        let a = r.now();
        assert!(r.now() >= a);
    }
}
