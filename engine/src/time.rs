//! Timestamps.
//!
//! Like the kernel's `current_time()`, the engine stamps inodes with the *coarse* real-time
//! clock (`CLOCK_REALTIME_COARSE`, one scheduler tick of resolution, read from the vDSO without
//! a system call). A directory's mtime/ctime is stored only when the coarse value differs from
//! the stored one, so a burst of creates in one directory writes the directory's attribute line
//! once per tick instead of once per create (docs/DESIGN.md §3).
//!
//! **Times that changes stamp** ([`Timespec::advance`]). A change reads the clock before it
//! takes effect, and changes of one inode that share no lock (creates of different names in
//! one directory, links of one file from two directories) take effect in any order: the last
//! to store its time may hold the earlier one, and the journal's order (which recovery and
//! checkpoints follow) may differ from the order of the stores. So a directory's mtime and
//! every ctime are not simply overwritten: a change's time replaces the stored one unless the
//! stored one is later by less than [`LAG`] (a `SetAttr`, which chooses its times under the
//! inode's seqlock, sets them exactly). Within that lag the result is the latest time,
//! whatever the order (a maximum), so the times never go backwards under concurrent changes
//! and recovery rebuilds the very times the live filesystem had. A stored time more than
//! [`LAG`] ahead (an mtime set into the future with `utimensat`, a clock stepped back) is
//! replaced, as the kernel does.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How far, in seconds, a stored mtime or ctime may be ahead of a change's time and still be
/// kept ([`Timespec::advance`]): far longer than a thread waits for a CPU between reading the
/// clock and storing the time, short enough that a time set ahead by hand soon yields.
pub const LAG: i64 = 10;

/// Seconds and nanoseconds since the Unix epoch, as in `struct timespec`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timespec {
    /// Seconds since 1970-01-01T00:00:00Z (negative before).
    pub sec: i64,
    /// Nanoseconds, `0..1_000_000_000`.
    pub nsec: u32,
}

impl Timespec {
    /// Builds a timespec; `nsec` must be below one billion.
    pub const fn new(sec: i64, nsec: u32) -> Self {
        Timespec { sec, nsec }
    }

    /// The coarse real-time clock (see the module doc).
    #[inline]
    pub fn now() -> Self {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; clock_gettime only writes it.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
        if rc != 0 {
            return SystemTime::now().into();
        }
        Timespec {
            sec: ts.tv_sec,
            nsec: ts.tv_nsec as u32,
        }
    }

    /// The time a field holding `self` takes when a change stamped `t` sets it: `t`, unless
    /// `self` is later than `t` by less than [`LAG`] (see the module doc). Applied in any
    /// order to times within [`LAG`] of each other, the result is their maximum.
    #[inline]
    pub fn advance(self, t: Timespec) -> Timespec {
        let ahead = self > t
            && self
                < Timespec {
                    sec: t.sec.saturating_add(LAG),
                    nsec: t.nsec,
                };
        if ahead { self } else { t }
    }

    /// Whether `nsec` is in range.
    pub fn is_valid(self) -> bool {
        self.nsec < 1_000_000_000
    }
}

impl From<SystemTime> for Timespec {
    fn from(t: SystemTime) -> Self {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Timespec {
                sec: d.as_secs() as i64,
                nsec: d.subsec_nanos(),
            },
            Err(e) => {
                let d = e.duration();
                if d.subsec_nanos() == 0 {
                    Timespec {
                        sec: -(d.as_secs() as i64),
                        nsec: 0,
                    }
                } else {
                    Timespec {
                        sec: -(d.as_secs() as i64) - 1,
                        nsec: 1_000_000_000 - d.subsec_nanos(),
                    }
                }
            }
        }
    }
}

impl From<Timespec> for SystemTime {
    fn from(t: Timespec) -> Self {
        if t.sec >= 0 {
            UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec)
        } else {
            UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs())
                + Duration::from_nanos(t.nsec as u64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advance_keeps_the_latest_of_near_times_in_any_order_and_yields_to_far_ones() {
        let t = |sec, nsec| Timespec::new(sec, nsec);
        let near = [t(100, 5), t(100, 4_000_005), t(99, 996_000_000), t(103, 0)];
        let max = *near.iter().max().unwrap();
        // Every order of four near times ends at their maximum.
        for perm in 0..24usize {
            let (mut left, mut p) = (near.to_vec(), perm);
            let mut cur = t(0, 0);
            while !left.is_empty() {
                cur = cur.advance(left.remove(p % left.len()));
                p /= left.len() + 1;
            }
            assert_eq!(cur, max, "order {perm}");
        }
        // A stored time more than LAG ahead is replaced; one exactly LAG ahead too.
        assert_eq!(t(100 + LAG + 1, 0).advance(t(100, 0)), t(100, 0));
        assert_eq!(t(100 + LAG, 0).advance(t(100, 0)), t(100, 0));
        assert_eq!(t(100 + LAG - 1, 0).advance(t(100, 0)), t(100 + LAG - 1, 0));
        // Later times always replace.
        assert_eq!(t(100, 0).advance(t(100, 1)), t(100, 1));
        assert_eq!(t(i64::MAX, 0).advance(t(i64::MAX, 1)), t(i64::MAX, 1));
    }

    #[test]
    fn systemtime_round_trip_including_before_epoch() {
        for ts in [
            Timespec::new(0, 0),
            Timespec::new(1_700_000_000, 123),
            Timespec::new(-1, 500),
            Timespec::new(-86400, 0),
        ] {
            let st: SystemTime = ts.into();
            assert_eq!(Timespec::from(st), ts);
        }
    }

    #[test]
    fn coarse_clock_is_close_to_system_time() {
        let a = Timespec::now();
        let b: Timespec = SystemTime::now().into();
        assert!(a.is_valid());
        assert!((b.sec - a.sec).abs() <= 1, "{a:?} vs {b:?}");
    }
}
