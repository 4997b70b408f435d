//! Where a caller runs when its reply comes: the io_uring queue threads' scheduling policy.
//!
//! ## Why the queue threads are SCHED_IDLE
//! The kernel puts a FUSE request on the ring queue of the CPU its caller runs on, and that
//! queue's thread is pinned to the CPU (`uring.rs`). When the thread commits the reply the
//! kernel wakes the caller, and the scheduler places a woken task on an idle CPU when it
//! finds one rather than beside its running waker. So a caller that ran on CPU 0 is woken on
//! an idle CPU 1, its next request goes to queue 1, whose reply moves it back to CPU 0:
//! every reply wakes a sleeping CPU with an inter-processor interrupt, which on a virtual
//! machine is an exit to the host and, measured on a 2-vCPU VM, was most of a round trip
//! (crunl at T=1 through the mount: 8.3k ops/s). A CPU that runs only SCHED_IDLE tasks
//! counts as idle for that choice, so with the queue threads SCHED_IDLE the caller is woken
//! on its queue's CPU, preempts the queue thread at once (a normal task always preempts an
//! idle one), and its next request goes to the same queue: a round trip never leaves its
//! CPU (21.2k ops/s in the same run; docs/results/HISTORY.md).
//!
//! ## The guard
//! The price of SCHED_IDLE is starvation: a SCHED_IDLE thread gets almost no CPU while a
//! normal task of its own task group (this process, or its session's autogroup) is runnable
//! on its CPU, and the requests of its queue then wait (measured: 133 creates/s instead of
//! 12.5k beside a busy loop started in the same session). The guard thread, of the normal
//! policy and not pinned, bounds that. While the queues are busy it reads every
//! [`PERIOD`] how long each queue thread has waited runnable without running
//! (`/proc/self/task/TID/schedstat`, second field, which counts a wait only once it has
//! ended) and whether it is runnable now (`/proc/self/task/TID/stat`); a thread that waited
//! more than half of the period, or was runnable at two samples in a row without running
//! between them (still waiting, unseen by `schedstat`), is given the normal policy for a
//! hold time (1 s, doubled each time it is
//! needed again, at most [`HOLD_MAX`]), then made SCHED_IDLE again. A queue thread waits
//! at most about one period before it is made normal. When no queue thread has run or
//! waited for [`QUIET`], the guard makes them all normal (nothing can starve unwatched) and
//! sleeps until a queue thread, running at the normal policy, finds work and wakes it
//! ([`Guard::touch`]: one relaxed load per batch of requests while the guard is awake).
//!
//! A queue thread uses SCHED_IDLE only where the guard can undo it: `/proc` has
//! `schedstat`, and a thread of this process may leave SCHED_IDLE (an unprivileged process
//! needs `RLIMIT_NICE` of at least 20 for that; root has `CAP_SYS_NICE`). Elsewhere the queue
//! threads keep the normal policy and the guard does not run.
//!
//! ## Locks
//! `Guard::threads` (a leaf: held only to add or remove a queue thread or to sample them,
//! never across anything that waits) is the only lock; a queue thread takes it only when it
//! starts and when it exits ([`Enrolment`]).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use crate::info::SessionInfo;

/// How often the guard samples the queue threads while they are busy.
pub(crate) const PERIOD: Duration = Duration::from_millis(10);
/// A queue thread that has waited runnable longer than this in one [`PERIOD`] is starving.
const STARVING: Duration = Duration::from_millis(5);
/// How long the guard waits with nothing happening before it makes the queue threads normal
/// and sleeps.
pub(crate) const QUIET: Duration = Duration::from_millis(200);
/// The first hold time of the normal policy after starving; doubled on each repeat.
const HOLD_MIN: Duration = Duration::from_secs(1);
/// The longest hold time.
pub(crate) const HOLD_MAX: Duration = Duration::from_secs(64);

/// A thread's scheduling policy, set by its thread id (Linux takes a thread id where
/// `sched_setscheduler(2)` says pid).
fn set_policy(tid: libc::pid_t, idle: bool) -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    let policy = if idle {
        libc::SCHED_IDLE
    } else {
        libc::SCHED_OTHER
    };
    // SAFETY: `param` is a valid sched_param for the call's duration.
    if unsafe { libc::sched_setscheduler(tid, policy, &param) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn gettid() -> libc::pid_t {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// Whether this process can use SCHED_IDLE queue threads: `schedstat` can be read and a
/// thread can go from SCHED_IDLE back to normal (tried once, on a thread made for it).
fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        std::thread::Builder::new()
            .name("lanefs-probe".into())
            .spawn(|| {
                let tid = gettid();
                Sample::open(tid).is_ok()
                    && set_policy(tid, true).is_ok()
                    && set_policy(tid, false).is_ok()
            })
            .ok()
            .and_then(|h| h.join().ok())
            .unwrap_or(false)
    })
}

/// One queue thread's `schedstat` (nanoseconds run, nanoseconds waited runnable) and
/// `stat` (whether it is runnable now).
///
/// The kernel adds a wait to `schedstat` only when it ends, as the thread gets the CPU
/// (`sched_info_arrive`): a SCHED_IDLE thread that a busy normal task keeps off its CPU shows
/// no change at all while it waits (seconds beside four busy threads), so its state is read
/// too.
struct Sample {
    file: File,
    stat: File,
}

impl Sample {
    fn open(tid: libc::pid_t) -> io::Result<Sample> {
        let file = File::open(format!("/proc/self/task/{tid}/schedstat"))?;
        let stat = File::open(format!("/proc/self/task/{tid}/stat"))?;
        let s = Sample { file, stat };
        s.read()?;
        s.runnable()?;
        Ok(s)
    }

    fn read(&self) -> io::Result<(u64, u64)> {
        let mut buf = [0u8; 96];
        let n = self.file.read_at(&mut buf, 0)?;
        let s = std::str::from_utf8(&buf[..n]).unwrap_or("");
        let mut it = s.split_ascii_whitespace().map(|w| w.parse::<u64>());
        match (it.next(), it.next()) {
            (Some(Ok(run)), Some(Ok(wait))) => Ok((run, wait)),
            _ => Err(io::Error::other("unexpected schedstat")),
        }
    }

    /// Whether the thread is runnable (running, or waiting for a CPU): state `R` in `stat`,
    /// the field after the name in parentheses.
    fn runnable(&self) -> io::Result<bool> {
        let mut buf = [0u8; 512];
        let n = self.stat.read_at(&mut buf, 0)?;
        let after = buf[..n]
            .iter()
            .rposition(|&b| b == b')')
            .ok_or_else(|| io::Error::other("unexpected stat"))?;
        Ok(buf[after + 1..n].iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'R'))
    }
}

/// What the guard knows of one queue thread.
struct Watched {
    tid: libc::pid_t,
    stat: Sample,
    /// (run, wait) at the last sample.
    last: (u64, u64),
    /// Runnable at the last sample.
    runnable: bool,
    idle: bool,
    /// While normal after starving: until when.
    until: Option<Instant>,
    hold: Duration,
}

/// A queue thread under the guard; dropped by the thread itself before it exits (while its
/// thread id is still its own), which takes it out of the guard's sight.
pub(crate) struct Enrolment {
    guard: Arc<Guard>,
    tid: libc::pid_t,
}

impl Enrolment {
    pub(crate) fn guard(&self) -> &Guard {
        &self.guard
    }
}

impl Drop for Enrolment {
    fn drop(&mut self) {
        debug_assert_eq!(self.tid, gettid(), "dropped by its own thread");
        self.guard
            .threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|w| w.tid != self.tid);
    }
}

/// The guard of one session's queue threads.
pub(crate) struct Guard {
    threads: Mutex<Vec<Watched>>,
    /// The guard sleeps until a queue thread finds work.
    asleep: AtomicBool,
    stop: AtomicBool,
    thread: OnceLock<Thread>,
    /// Counts the times a starving queue thread was made normal (`lanefs stats`).
    info: Arc<SessionInfo>,
}

impl Guard {
    /// A guard, or `None` where SCHED_IDLE queue threads cannot be guarded (module doc).
    pub(crate) fn new(info: &Arc<SessionInfo>) -> Option<Arc<Guard>> {
        available().then(|| {
            Arc::new(Guard {
                threads: Mutex::new(Vec::new()),
                asleep: AtomicBool::new(true),
                stop: AtomicBool::new(false),
                thread: OnceLock::new(),
                info: info.clone(),
            })
        })
    }

    /// Puts the calling queue thread under the guard (it keeps the normal policy until the
    /// guard wakes) until the returned [`Enrolment`] is dropped, which the thread must do
    /// before it exits: the guard sets policies by thread id, and an exited thread's id may
    /// be given to any new thread on the machine.
    pub(crate) fn enrol(self: &Arc<Self>) -> io::Result<Enrolment> {
        let tid = gettid();
        let stat = Sample::open(tid)?;
        let last = stat.read()?;
        self.threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Watched {
                tid,
                stat,
                last,
                runnable: false,
                idle: false,
                until: None,
                hold: HOLD_MIN,
            });
        Ok(Enrolment {
            guard: self.clone(),
            tid,
        })
    }

    /// Called by a queue thread after each batch of requests: wakes the guard if it sleeps.
    #[inline]
    pub(crate) fn touch(&self) {
        if self.asleep.load(Ordering::Relaxed) && self.asleep.swap(false, Ordering::AcqRel) {
            if let Some(t) = self.thread.get() {
                t.unpark();
            }
        }
    }

    /// Starts the guard thread.
    pub(crate) fn start(self: &Arc<Self>) -> io::Result<JoinHandle<()>> {
        let g = self.clone();
        let h = std::thread::Builder::new()
            .name("lanefs-guard".into())
            .spawn(move || g.run())?;
        let _ = self.thread.set(h.thread().clone());
        Ok(h)
    }

    /// Stops the guard thread (it makes every queue thread normal first).
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }

    fn run(&self) {
        loop {
            // Asleep: every queue thread is normal; wait for one to find work.
            while self.asleep.load(Ordering::Acquire) {
                if self.stop.load(Ordering::Acquire) {
                    return;
                }
                std::thread::park();
            }
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            self.watch();
            self.set_all_normal();
        }
    }

    /// Samples the queue threads every [`PERIOD`] until they have been quiet for [`QUIET`]
    /// or the guard is stopped.
    fn watch(&self) {
        let mut quiet_since = Instant::now();
        self.each(|w| {
            w.last = w.stat.read().unwrap_or(w.last);
            w.runnable = w.stat.runnable().unwrap_or(false);
            if set_policy(w.tid, true).is_ok() {
                w.idle = true;
            }
        });
        loop {
            std::thread::park_timeout(PERIOD);
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            let now = Instant::now();
            let mut busy = false;
            self.each(|w| {
                let Ok((run, wait)) = w.stat.read() else {
                    return;
                };
                let runnable = w.stat.runnable().unwrap_or(false);
                let (dr, dw) = (run - w.last.0.min(run), wait - w.last.1.min(wait));
                // Runnable at both samples without having run between them: waiting for a
                // CPU for the whole period, a wait `schedstat` does not show yet (`Sample`).
                let unseen = runnable && w.runnable && dr == 0;
                w.last = (run, wait);
                w.runnable = runnable;
                busy |= dr > 0 || dw > 0 || runnable;
                if w.idle {
                    if (Duration::from_nanos(dw) > STARVING || unseen)
                        && set_policy(w.tid, false).is_ok()
                    {
                        w.idle = false;
                        w.until = Some(now + w.hold);
                        w.hold = (w.hold * 2).min(HOLD_MAX);
                        self.info.count_boost();
                    }
                } else if w.until.is_some_and(|t| now >= t) && set_policy(w.tid, true).is_ok() {
                    w.idle = true;
                    w.until = None;
                }
            });
            if busy {
                quiet_since = now;
            } else if now.duration_since(quiet_since) >= QUIET {
                // Sleep; a queue thread that finds work wakes the guard (`touch`). Set before
                // the threads are made normal, so that one finding work after this wakes it.
                self.asleep.store(true, Ordering::Release);
                return;
            }
        }
    }

    fn set_all_normal(&self) {
        self.each(|w| {
            if w.idle && set_policy(w.tid, false).is_ok() {
                w.idle = false;
            }
            w.until = None;
            w.hold = HOLD_MIN;
        });
    }

    fn each(&self, f: impl FnMut(&mut Watched)) {
        self.threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter_mut()
            .for_each(f);
    }
}
