//! Timestamps.
//!
//! Like the kernel's `current_time()`, the engine stamps inodes with the *coarse* real-time
//! clock (`CLOCK_REALTIME_COARSE`, one scheduler tick of resolution, read from the vDSO without
//! a system call). A directory's mtime/ctime is stored only when the coarse value differs from
//! the stored one, so a burst of creates in one directory writes the directory's attribute line
//! once per tick instead of once per create (docs/DESIGN.md §3).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
