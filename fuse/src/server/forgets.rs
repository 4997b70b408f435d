//! Waiting for FORGETs that may give room back: a request refused with ENOSPC is tried
//! again after each FORGET, for up to 25 ms in all ([`Forgets`]).

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

/// How long a request refused with ENOSPC waits, in all, for FORGETs that may give room back
/// before it is answered (see the `Dispatch` implementation of `Server`): long enough for
/// the thread that reads the FORGET to be scheduled on a loaded machine (5 ms was not,
/// once in about 60 tries, beside `stress-ng --cpu 4` on 2 CPUs), short enough that a full
/// filesystem answers ENOSPC soon.
pub(super) const ENOSPC_WAIT: Duration = Duration::from_millis(25);

/// A count of the FORGETs handled, and a way to wait for the next one.
///
/// The kernel holds a file it unlinked until its last user is gone, then sends a FORGET.
/// A request refused with ENOSPC first has the engine give back the room of every unlinked
/// file the kernel no longer holds (`lanefs::Filesystem::reap_unlinked`, which asks the
/// kernel: engine `fs/unlinked.rs`), which covers every unlink that returned before the
/// request was made. What is left is a file whose last user let go as the request was
/// being made (a close racing it), or whose eviction the kernel finishes after the unlink
/// returned: the kernel sends its FORGET then, through `/dev/fuse` while the request may
/// come through the ring, served by another thread. So a request still refused waits (at
/// most [`ENOSPC_WAIT`] in all) for FORGETs and is tried again after each. The count is
/// bumped after the FORGET is applied; the lock and condition variable are touched only
/// while someone waits.
#[derive(Default)]
pub(super) struct Forgets {
    count: std::sync::atomic::AtomicU64,
    waiters: AtomicUsize,
    lock: Mutex<()>,
    cv: std::sync::Condvar,
}

impl Forgets {
    /// The count now, for [`Forgets::wait_past`].
    pub(super) fn seen(&self) -> u64 {
        self.count.load(SeqCst)
    }

    /// Counts a FORGET, applied, and wakes whoever waits for one.
    pub(super) fn done(&self) {
        self.count.fetch_add(1, SeqCst);
        if self.waiters.load(SeqCst) > 0 {
            let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.cv.notify_all();
        }
    }

    /// Waits until the count passes `seen` or `deadline` comes; true if it passed.
    pub(super) fn wait_past(&self, seen: u64, deadline: Instant) -> bool {
        self.waiters.fetch_add(1, SeqCst);
        let mut g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if self.count.load(SeqCst) != seen {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            g = self
                .cv
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        drop(g);
        self.waiters.fetch_sub(1, SeqCst);
        self.count.load(SeqCst) != seen
    }
}
