//! The checkpointer's waits between failed tries (`mod.rs`, "Retrying").

use std::time::Duration;

use super::Policy;

/// The waits between failed tries (`mod.rs`, "Retrying"): after the `n`th failure in a row
/// the checkpointer waits `retry * 2^(n-1)`, at most `retry_max`, by the store's clock; a
/// checkpoint that succeeds ends the run. Kept with the [`Checkpoint`], under its mutex, so
/// that a checkpoint on demand counts too.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Backoff {
    /// Failures since the last checkpoint that succeeded.
    pub(super) failures: u32,
    /// When the checkpointer may try again (`None`: whenever a checkpoint is due).
    pub(super) until: Option<Duration>,
}

impl Backoff {
    /// Whether the checkpointer may try at `now`.
    pub(crate) fn ready(&self, now: Duration) -> bool {
        self.until.is_none_or(|t| now >= t)
    }

    /// Counts a failure that ended at `now`; returns the wait before the next try.
    pub(crate) fn failed(&mut self, now: Duration, p: &Policy) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let wait = delay(self.failures, p.retry, p.retry_max);
        self.until = Some(now.saturating_add(wait));
        wait
    }

    /// A checkpoint succeeded: the next one is taken as soon as it is due.
    pub(crate) fn succeeded(&mut self) {
        *self = Backoff::default();
    }
}

/// The wait after the `n`th failure in a row (`n >= 1`): `first` doubled `n - 1` times, at
/// most `max`.
fn delay(n: u32, first: Duration, max: Duration) -> Duration {
    let doubled = 2u32.saturating_pow(n.saturating_sub(1));
    first.saturating_mul(doubled).min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(retry: u64, max: u64) -> Policy {
        Policy {
            records: 1,
            segments: 1,
            journal_segments: 3,
            changed_due: 1,
            changed_limit: 1,
            poll: Duration::from_millis(1),
            retry: Duration::from_secs(retry),
            retry_max: Duration::from_secs(max),
        }
    }

    #[test]
    fn waits_double_from_the_first_up_to_the_longest_and_a_success_ends_them() {
        let p = policy(1, 60);
        let mut b = Backoff::default();
        let s = Duration::from_secs;
        assert!(b.ready(s(0)));
        let mut now = s(100);
        let mut waits = Vec::new();
        for _ in 0..9 {
            let w = b.failed(now, &p);
            waits.push(w.as_secs());
            assert!(!b.ready(now + w - Duration::from_nanos(1)));
            assert!(b.ready(now + w));
            now += w;
        }
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(b.failures, 9);
        b.succeeded();
        assert_eq!(b, Backoff::default());
        assert!(b.ready(now));
        assert_eq!(
            b.failed(now, &p),
            s(1),
            "a new run starts from the first wait"
        );
    }

    #[test]
    fn a_long_run_of_failures_never_overflows() {
        let p = policy(1, 60);
        assert_eq!(delay(1, p.retry, p.retry_max), Duration::from_secs(1));
        assert_eq!(delay(u32::MAX, p.retry, p.retry_max), p.retry_max);
        assert_eq!(
            delay(40, Duration::MAX, Duration::MAX),
            Duration::MAX,
            "saturates"
        );
        let mut b = Backoff {
            failures: u32::MAX,
            until: None,
        };
        assert_eq!(b.failed(Duration::MAX, &p), p.retry_max);
        assert_eq!(b.failures, u32::MAX);
        assert_eq!(b.until, Some(Duration::MAX));
        // A first wait longer than the longest is cut to it.
        assert_eq!(delay(1, Duration::from_secs(90), p.retry_max), p.retry_max);
    }
}
