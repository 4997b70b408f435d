//! What a running session reports (`lanefs stats`, [`crate::stats_json`]): its transport,
//! and how many requests it has received. Written by the transports, read by anyone.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

/// What a running session tells `lanefs stats`: its transport and how many requests it has
/// answered.
#[derive(Debug, Default)]
pub struct SessionInfo {
    /// 0: INIT not answered yet; 1: `/dev/fuse`; 2: io_uring.
    transport: AtomicU8,
    /// io_uring queues (0 on `/dev/fuse`).
    queues: AtomicU64,
    /// Requests read, per serving thread (a slot each, on its own cache line).
    counts: Counters,
    /// The io_uring queue threads run SCHED_IDLE under a guard (`handoff.rs`).
    sched_idle: AtomicBool,
    /// Times the guard gave a starving queue thread the normal policy.
    boosts: AtomicU64,
    /// Requests served over the channel of `lanefs run`, per connection (slot by
    /// connection number).
    channel_counts: Counters,
    /// Connections the channel accepted.
    channel_connections: AtomicU64,
    /// Entry invalidations sent for library callers' changes (`server/sink.rs`).
    report_entries: AtomicU64,
    /// New names library callers made that were reported without one.
    report_names_unlocked: AtomicU64,
}

#[derive(Debug, Default)]
#[repr(align(64))]
struct Slot(AtomicU64);

#[derive(Debug)]
struct Counters(Box<[Slot]>);

impl Default for Counters {
    fn default() -> Self {
        Counters((0..COUNTER_SLOTS).map(|_| Slot::default()).collect())
    }
}

/// Counter slots; the `/dev/fuse` thread of an io_uring session counts in the last.
pub(crate) const COUNTER_SLOTS: usize = 64;

impl SessionInfo {
    /// `"io_uring"`, `"/dev/fuse"`, or `"starting"` before INIT is answered.
    pub fn transport(&self) -> &'static str {
        match self.transport.load(Ordering::Relaxed) {
            1 => "/dev/fuse",
            2 => "io_uring",
            _ => "starting",
        }
    }

    /// Whether requests are served through io_uring.
    pub fn is_uring(&self) -> bool {
        self.transport.load(Ordering::Relaxed) == 2
    }

    /// The io_uring queues (one per possible CPU), 0 on `/dev/fuse`.
    pub fn queues(&self) -> u64 {
        self.queues.load(Ordering::Relaxed)
    }

    /// Requests received so far (FORGETs included), on both transports.
    pub fn requests(&self) -> u64 {
        self.counts
            .0
            .iter()
            .map(|s| s.0.load(Ordering::Relaxed))
            .sum()
    }

    /// Requests served over the channel of `lanefs run`.
    pub fn channel_requests(&self) -> u64 {
        self.channel_counts
            .0
            .iter()
            .map(|s| s.0.load(Ordering::Relaxed))
            .sum()
    }

    /// Connections the channel has accepted (one per client thread and mount).
    pub fn channel_connections(&self) -> u64 {
        self.channel_connections.load(Ordering::Relaxed)
    }

    /// Entry invalidations sent for the changes library callers (the channel of `lanefs
    /// run` among them) made: each takes the directory's lock in the kernel.
    pub fn report_entry_invalidations(&self) -> u64 {
        self.report_entries.load(Ordering::Relaxed)
    }

    /// Names library callers made, removed or renamed that were reported with the directory's
    /// attributes only, no entry invalidation (`server/kernel_names.rs`).
    pub fn report_names_unlocked(&self) -> u64 {
        self.report_names_unlocked.load(Ordering::Relaxed)
    }

    pub(crate) fn count_report(&self, entry_invalidation: bool) {
        let c = match entry_invalidation {
            true => &self.report_entries,
            false => &self.report_names_unlocked,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// A new channel connection: its counter slot.
    pub(crate) fn channel_connected(&self) -> usize {
        self.channel_connections.fetch_add(1, Ordering::Relaxed) as usize % COUNTER_SLOTS
    }

    pub(crate) fn count_channel(&self, slot: usize) {
        self.channel_counts.0[slot % COUNTER_SLOTS]
            .0
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count(&self, slot: usize) {
        self.counts.0[slot % COUNTER_SLOTS]
            .0
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn set_transport(&self, uring: bool, queues: usize) {
        self.queues.store(queues as u64, Ordering::Relaxed);
        self.transport
            .store(if uring { 2 } else { 1 }, Ordering::Relaxed);
    }

    /// Whether the io_uring queue threads run SCHED_IDLE under a guard (`handoff.rs`).
    pub fn sched_idle(&self) -> bool {
        self.sched_idle.load(Ordering::Relaxed)
    }

    /// Times a starving queue thread was given the normal policy (`handoff.rs`).
    pub fn boosts(&self) -> u64 {
        self.boosts.load(Ordering::Relaxed)
    }

    pub(crate) fn set_sched_idle(&self) {
        self.sched_idle.store(true, Ordering::Relaxed);
    }

    pub(crate) fn count_boost(&self) {
        self.boosts.fetch_add(1, Ordering::Relaxed);
    }

    /// One line saying how the mount is served.
    pub fn describe(&self) -> String {
        if self.is_uring() {
            let idle = if self.sched_idle() {
                ", SCHED_IDLE"
            } else {
                ""
            };
            format!("io_uring ({} queues, one per CPU{idle})", self.queues())
        } else {
            self.transport().to_string()
        }
    }
}
