//! Appending records and group commit.
//!
//! **Appending** ([`Committer::append`]) is on the engine's hot path, inside the engine's locks, so
//! it shares nothing between threads: each thread encodes its records into a buffer of its
//! own, each stamped with [`StampClock::now`] (`stamp.rs` says why stamps order records the way
//! the engine's locks do). The only shared write is to that buffer's mutex, which nothing
//! but the committer ever contends for.
//!
//! **Committing** is one thread's job (the committer). A round: read a stamp `t`; take from
//! every thread's buffer each record stamped below `t` (records stamped later stay for the
//! next round); merge them by stamp (a heap over the buffers, each already in stamp order);
//! write them to the journal as batches (`journal/writer.rs`); and, if anyone waits, flush: then
//! every record stamped below `t` is durable. Every record stamped below `t` has been
//! appended before its buffer is taken: its thread read the stamp while holding the
//! buffer's mutex, which the committer takes after reading `t`.
//!
//! **Group commit**: [`Committer::sync`] reads the highest stamp any thread has appended (each
//! buffer keeps its thread's last, written after the record is in it) and waits until the
//! durable stamp passes it; when it already has, nothing was appended since a flush covered
//! it, and the sync returns at once: an `fsync` with nothing to commit costs no flush (and
//! one pass over the threads' last stamps, a load each). The committer starts a round as soon
//! as anyone waits, so every thread waiting when a round starts is served by that round's
//! one flush, and those arriving during it by the next. [`Committer::sync_then`] is the same
//! without a waiting thread: its callback is queued, and the committer calls it (outside its
//! state mutex) once a flush covers it, as the FUSE server answers FSYNC without holding a
//! server thread; [`Committer::sync`] is a
//! `sync_then` whose callback unparks its thread, so the committer wakes each thread a flush
//! served itself and they run at once (a condition variable shared by the waiters woke them
//! one after another, each taking the state mutex in turn). An fsync costs the records
//! written since the last round, whatever the number of files. A round that flushes waits,
//! at most the last flush's duration (and 200 µs) from the first sync that asks for it, for
//! as many syncs as were waiting when the last flush ended (those it served are likely
//! coming back); only the first and the last of them wake the committer. Otherwise threads
//! that fsync in turn each get a flush of their own, each arriving just after the next
//! round has begun. A lone thread never waits. Without waiters a round runs every commit
//! interval, or when a buffer grows past 2 MiB, and writes without flushing, so that records
//! do not pile up in memory and a killed process loses at most an interval; and once records
//! have waited written but unflushed for the flush interval (5 s by default, ext4's commit
//! interval), a round flushes with no one waiting, so that a power cut loses at most that
//! much of what no one synced (`sync(1)` through a mount never reaches the store).
//! The buffers the committer takes are given back to the threads, so their memory is
//! reused rather than faulted in afresh.
//!
//! **Backpressure**: a thread whose buffer reaches 16 MiB waits until the committer takes
//! it, so a writer that outruns the disk is slowed to the disk's pace instead of buffering
//! without bound (a round writes what it took in bounded pieces, so the committer holds at
//! most one buffer's worth per thread besides). The wait happens inside `append`, with the
//! engine's locks of that change held: the committer takes none of them, so it cannot
//! deadlock; operations that need those locks wait too, as they would for the disk.
//! The journal itself is bounded the same way: while it holds more than its most segments
//! ([`Committer::set_max_segments`]), buffers are full at `WAKE_BYTES`, and while the checkpointer
//! works through it ([`Committer::set_checkpointing`]: from the look that finds a checkpoint due
//! until one finds none due, or one fails; and while a checkpoint asked for runs) the
//! committer runs no round but for the checkpoint's own syncs ([`Committer::sync_for_checkpoint`]),
//! so buffers fill and their writers, and other syncs, wait until a checkpoint's segments go
//! (as a full journal waits for its checkpoint in jbd2). The wait spans the checkpointer's
//! gaps between checkpoints too: on a fast host (tmpfs) writers fill segments faster than a
//! few milliseconds' gap. It lasts only while some record written is not in the checkpoint
//! yet ([`Committer::set_checkpointed`]): with every record in it no checkpoint can shorten the
//! journal, whose newest segment goes only once the next one has started. A stopped, low or
//! closing store never waits, nor does one whose checkpointer waits after a failure
//! (nothing would end the wait).
//! Buffers are full at `WAKE_BYTES` too while the host has room for few more segments
//! ([`journal::Writer::host_short`]): what they hold when the host fills must be written
//! before any removal appended after it.
//!
//! **Errors**: the host's errors are of two kinds (`journal::out_of_space` tells them apart).
//!
//! *Out of space* (ENOSPC or EDQUOT writing a batch or making a segment) is not fatal, and
//! no change is lost to it:
//! - Records the committer could not write are **held** in memory, in order, and written
//!   again, first, by every later round: every [`RETRY`] while nothing asks, at once for a
//!   `sync` and at shutdown. When space is back they are written and the store goes on as if
//!   nothing happened; a reopen finds them (the journal stays a prefix of the record order).
//! - While records are held, appends are refused with ENOSPC, *before* the engine makes the
//!   change visible (`Store::append`), so that nothing new piles up; a `sync` that asks for a
//!   round which fails for lack of space returns ENOSPC (as `fsync` does on ext4 or xfs when
//!   writeback fails), and a later one succeeds once the held records are written (unlike
//!   those hosts, nothing is dropped in between: the records stay held). What a `sync` waits
//!   for is durable when it returns `Ok`, never otherwise.
//! - Space runs short before writes fail: segments are made ahead of need (`journal/spare.rs`),
//!   and when the next one cannot be made the store is **low** on space (the committer
//!   learns it after a round, and waits for the segment being made once the one being
//!   written has less than twice the reserve left). The room left in
//!   the segment being written is then a budget: ordinary records may take all of it but
//!   a **reserve** (an eighth of a segment, at most 4 MiB), and once they have, appends are
//!   refused with ENOSPC. Records that give space back ([`frees_space`]: unlink and rmdir,
//!   the freeing of an inode, truncate, hole punching) are never refused for space, so that
//!   a user can clean up a full lanefs (as ext4's reserved blocks keep root working); while
//!   the reserve lasts they are written and durable as ever. The committer tries to make the
//!   segment again every round; once one is made, the store is no longer low.
//! - The reserve is a bound, not a promise: records appended before the committer notices
//!   the shortage are not metered, and records larger than what is left fail their round
//!   and are held (above). When a round fails for lack of space, what was written before
//!   is flushed, so that a checkpoint can take it and give its segments back.
//! - At shutdown held records get one last try; if it fails for lack of space they are
//!   lost (none was acknowledged by a `sync`), and `close` returns ENOSPC.
//!
//! *Anything else* (EIO, and any failed flush of the journal, which may have lost pages the
//! host could not write back) **stops** the store, as ext4's errors=remount-ro does: EIO is
//! kept, every waiting and later `sync` returns it, and every later append is refused with
//! it, so that no change the store could not keep becomes visible after it. (The engine made
//! the changes appended before; they stay in memory, and what survives a restart is the
//! journal's prefix, which holds every change a `sync` acknowledged.)
//!
//! Lock order: a thread's buffer mutex ([`ThreadBuffer`]), then nothing; the committer's state
//! mutex, then nothing; the free-chunk pool's mutex, then nothing. The committer never holds the
//! state mutex while taking buffers or writing. The room hold's mutex (`journal::RoomHold`) is
//! taken by whoever makes a segment (the committer, or the spare maker's thread), then
//! nothing, and by the checkpointer, under its checkpoint's mutex, to turn the hold on, then
//! nothing; no one holding it waits for the committer or the checkpointer.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU32, AtomicU64, Ordering::*};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use lanefs::{Errno, Record, SyncDone};
use parking_lot::{Condvar, Mutex};
use thread_local::ThreadLocal;

use crate::error::StoreError;
use crate::journal::{Payload, Spare, Writer, out_of_space};
use crate::layout::{put, u32_at, u64_at};
use crate::stamp::StampClock;

/// The longest a committer holding off for a checkpoint sleeps before it looks again
/// (module doc, "Backpressure"); the checkpointer wakes it sooner.
const BEHIND_WAIT: Duration = Duration::from_millis(50);
/// How often held records are written again while no one asks (module doc, "Errors"); a
/// shorter commit interval is used instead.
pub(crate) const RETRY: Duration = Duration::from_millis(50);
/// The bit of [`Committer::mode`] that says the store is low on space (the other bits are the
/// errno of a stopped store).
const LOW: u32 = 1 << 31;

/// The reserve kept for records that free space when segments cannot be made (module doc).
fn reserve(segment_size: u64) -> u64 {
    (segment_size / 8).min(4 << 20)
}

/// Whether `rec` is one the reserve is kept for: a change that gives space back, which a
/// store low on space still takes (module doc, "Errors").
pub(crate) fn frees_space(rec: &Record<'_>) -> bool {
    match rec {
        Record::Remove { .. } | Record::Free { .. } | Record::Punch { .. } => true,
        Record::SetAttr { change, .. } => change.size.is_some(),
        _ => false,
    }
}

/// A buffer wakes the committer early once it holds this many bytes.
const WAKE_BYTES: usize = 2 << 20;
/// A thread whose buffer holds this many bytes waits for the committer to take it.
const FULL_BYTES: usize = 8 * WAKE_BYTES;
/// Records are buffered in chunks of this size, which are never reallocated: a full chunk is
/// followed by another, and the committer gives them back for reuse.
const CHUNK: usize = 256 << 10;
/// Chunks kept for reuse.
const POOL_CHUNKS: usize = 64;
/// A record is encoded straight into its thread's chunk when the chunk has this much room.
const ROOM: usize = 4 << 10;
/// The longest a flush waits for one more `sync` when syncs overlap.
const GATHER_MAX: Duration = Duration::from_micros(200);
/// A round is written in pieces of about this many bytes.
const PIECE: usize = 4 << 20;

/// A thread's buffer of records, and the stamp of the last record it appended (read without the
/// buffer's mutex by [`Committer::sync_then`]; written only by the thread, after the record is in
/// the buffer).
#[derive(Default)]
struct ThreadBuffer {
    records: Mutex<Buffered>,
    last: AtomicU64,
}

/// Where a buffered record's parts are (`layout.rs`): its stamp, its length, then the
/// record.
mod entry_at {
    use crate::layout::{U32, U64};

    pub(super) const STAMP: usize = 0;
    pub(super) const LEN: usize = STAMP + U64;
    pub(super) const RECORD: usize = LEN + U32;
}

/// The records buffered by one thread: `[stamp u64][len u32][record]` each ([`entry_at`]), in stamp
/// order, across its chunks in order.
#[derive(Default)]
struct Buffered {
    chunks: Vec<Vec<u8>>,
    /// Bytes in `chunks`.
    bytes: usize,
    /// The committer was woken for this buffer and has not taken it yet.
    kicked: bool,
}

#[derive(Default)]
struct State {
    /// The highest stamp someone waits for.
    requested: u64,
    /// Every record stamped below this is durable.
    durable: u64,
    /// A buffer asked for a round.
    kicked: bool,
    shutdown: bool,
    /// Why the store stopped.
    error: Option<Errno>,
    /// Records are held: the last round failed for lack of space (module doc, "Errors").
    held: bool,
    /// Rounds that failed for lack of space so far.
    failures: u64,
    /// Calls of `sync` so far (each one asks for a round, even while records are held).
    asks: u64,
    /// Syncs no flush has served yet: `sync_then` calls, and `sync` calls waiting.
    callbacks: Vec<Callback>,
    /// Syncs that were waiting when the last flush ended: a round that flushes waits for as
    /// many before it begins (module doc, "Group commit"); the sync that makes them as many
    /// wakes the committer.
    gather: usize,
    /// The highest stamp a checkpoint's sync waits for ([`Committer::sync_for_checkpoint`]): those
    /// are served while the journal is held off (module doc, "Backpressure").
    urgent: u64,
}

/// A thread in [`Committer::sync`]: its result (an errno, 0 for success, or [`PENDING`]), set
/// before the thread is unparked.
struct Waiting {
    result: AtomicI32,
    thread: std::thread::Thread,
}

const PENDING: i32 = -1;

/// A `sync_then` waiting: its stamp, the failed rounds when it was made, what to call.
struct Callback {
    t: u64,
    failures: u64,
    done: SyncDone,
}

/// Takes the callbacks whose outcome `s` decides, with their results, as `sync` would give
/// them: the store's error; Ok once a flush covers them; ENOSPC if a round failed for lack of
/// space since they were made. Called under the state mutex; the caller calls them after
/// dropping it.
fn settle(s: &mut State) -> Vec<(SyncDone, lanefs::Result<()>)> {
    let mut ready = Vec::new();
    let mut i = 0;
    while i < s.callbacks.len() {
        let c = &s.callbacks[i];
        let r = match s.error {
            Some(e) => Some(Err(e)),
            None if s.durable > c.t => Some(Ok(())),
            None if s.failures != c.failures => Some(Err(Errno::ENOSPC)),
            None => None,
        };
        match r {
            Some(r) => ready.push((s.callbacks.swap_remove(i).done, r)),
            None => i += 1,
        }
    }
    ready
}

/// A store's appending and group commit (see the module doc): each thread's buffer of
/// records, and the state the committer's thread ([`spawn`]) works from. Appends, syncs and
/// the checkpointer go through it.
pub(crate) struct Committer {
    clock: StampClock,
    buffers: ThreadLocal<CachePadded<ThreadBuffer>>,
    state: Mutex<State>,
    /// The committer waits here for work.
    work: Condvar,
    /// Appenders whose buffer is full wait here for the committer to take it.
    drained: Condvar,
    /// The errno of a stopped store, or [`LOW`] (0: neither), read by every append.
    mode: AtomicU32,
    /// While the store is low on space: bytes that records other than those that free space
    /// may still take (module doc, "Errors").
    budget: AtomicI64,
    interval: Duration,
    /// How long written records may wait unflushed (module doc, "Group commit").
    flush_interval: Duration,
    /// Set while the committer runs.
    running: AtomicBool,
    /// Chunks given back by the committer (threads take one per `CHUNK` bytes appended).
    free: Mutex<Vec<Vec<u8>>>,
    /// Journal flushes made (each serving every `sync` waiting when its round began).
    flushes: AtomicU64,
    /// The LSN of the last record written.
    written: AtomicU64,
    /// The LSN of the last record a flush made durable.
    flushed: AtomicU64,
    /// Set by the checkpointer while it works through the journal: from the look that finds
    /// a checkpoint due until one finds none due, one fails, or it stops (module doc,
    /// "Backpressure").
    checkpointing: AtomicBool,
    /// The oldest segment of the journal, as the checkpointer last saw it (0: not known).
    first_segment: AtomicU64,
    /// The LSN of the last record the checkpoint holds, as the checkpointer last said.
    checkpointed: AtomicU64,
    /// The most segments the journal holds before rounds that serve no sync wait for a
    /// checkpoint (0: no bound).
    max_segments: AtomicU64,
    /// Set by the committer while the journal is over that bound: buffers are full at
    /// `WAKE_BYTES` instead of `FULL_BYTES`.
    tight: AtomicBool,
}

/// What a store's committer has done since it started ([`crate::StoreHandle::counters`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Journal flushes (device cache flushes, each serving every sync waiting for it).
    pub flushes: u64,
    /// The LSN of the last record written (records are numbered from 1 over the store's
    /// life, so differences count records).
    pub lsn: u64,
}

impl Committer {
    pub(crate) fn new(interval: Duration, flush_interval: Duration) -> Committer {
        Committer {
            clock: StampClock::new(),
            buffers: ThreadLocal::new(),
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            drained: Condvar::new(),
            mode: AtomicU32::new(0),
            budget: AtomicI64::new(0),
            flushes: AtomicU64::new(0),
            written: AtomicU64::new(0),
            flushed: AtomicU64::new(0),
            interval,
            flush_interval,
            running: AtomicBool::new(false),
            free: Mutex::new(Vec::new()),
            checkpointing: AtomicBool::new(false),
            first_segment: AtomicU64::new(0),
            checkpointed: AtomicU64::new(0),
            max_segments: AtomicU64::new(0),
            tight: AtomicBool::new(false),
        }
    }

    /// Bounds the journal to `max` segments while checkpoints run (module doc,
    /// "Backpressure").
    pub(crate) fn set_max_segments(&self, max: u64) {
        self.max_segments.store(max, SeqCst);
    }

    /// The checkpointer tells whether it works through the journal (a checkpoint is due or
    /// under way, and none failed since), and the journal's oldest segment (after a
    /// checkpoint, the segments it let go are gone); either may end a committer's wait.
    pub(crate) fn set_checkpointing(&self, on: bool, first_segment: Option<u64>) {
        self.checkpointing.store(on, SeqCst);
        if let Some(f) = first_segment {
            self.first_segment.store(f, SeqCst);
        }
        let _s = self.state.lock();
        self.work.notify_one();
    }

    /// Whether the journal, whose newest segment is `seq`, is over its bound.
    fn over(&self, seq: u64) -> bool {
        let (max, first) = (
            self.max_segments.load(SeqCst),
            self.first_segment.load(SeqCst),
        );
        max > 0 && first > 0 && seq >= first.saturating_add(max)
    }

    /// Whether the journal, whose newest segment is `seq`, is over its bound while the
    /// checkpointer works through it, with records written that the checkpoint does not hold
    /// yet (module doc, "Backpressure"). With every record in the checkpoint, no checkpoint
    /// can make the journal shorter: its newest segment goes only once the next one has
    /// started, which takes a round.
    fn held_off(&self, seq: u64) -> bool {
        self.checkpointing.load(SeqCst)
            && self.over(seq)
            && self.written.load(Acquire) > self.checkpointed.load(SeqCst)
    }

    /// The checkpoint holds every record up to `lsn` (what ends a wait for it when the
    /// journal cannot be made shorter; [`Committer::held_off`]).
    pub(crate) fn set_checkpointed(&self, lsn: u64) {
        self.checkpointed.fetch_max(lsn, SeqCst);
        let _s = self.state.lock();
        self.work.notify_one();
    }

    /// The size at which a thread's buffer is full: smaller while the journal is over its
    /// bound, so that what the buffers hold adds little to it (module doc, "Backpressure").
    fn full_bytes(&self) -> usize {
        match self.tight.load(Relaxed) {
            true => WAKE_BYTES,
            false => FULL_BYTES,
        }
    }

    /// What the committer has done so far.
    pub(crate) fn counters(&self) -> Counters {
        Counters {
            flushes: self.flushes.load(Relaxed),
            // Acquire, paired with the committer's Release: a sync after this call sees the
            // `last` stamps of every record up to `lsn` (the checkpointer syncs the records it
            // read the LSN of; `checkpoint/mod.rs`, `take`).
            lsn: self.written.load(Acquire),
        }
    }

    /// Whether the journal is short of room (the next segment cannot be made, or records
    /// are held): changes that do not free space are refused.
    pub(crate) fn low(&self) -> bool {
        self.mode.load(Relaxed) & LOW != 0
    }

    /// The LSN of the last record known durable: what a checkpoint may take while a sync
    /// cannot be had (records held for lack of space; `checkpoint/mod.rs`, `take`).
    pub(crate) fn flushed_lsn(&self) -> u64 {
        self.flushed.load(Acquire)
    }

    /// A chunk with room for `need` bytes.
    fn chunk(&self, need: usize) -> Vec<u8> {
        if need <= CHUNK
            && let Some(c) = self.free.lock().pop()
        {
            return c;
        }
        Vec::with_capacity(need.max(CHUNK))
    }

    /// Whether stamps come from the time-stamp counter (else a shared counter).
    pub(crate) fn uses_tsc(&self) -> bool {
        self.clock.uses_tsc()
    }

    /// Buffers `rec` (see the module doc). Refused once the store has stopped, and for lack
    /// of space while it is low (module doc, "Errors").
    #[inline]
    pub(crate) fn append(&self, rec: &Record<'_>) -> lanefs::Result<()> {
        let buffer = match self.buffers.get() {
            Some(b) => b,
            None => self.new_buffer(),
        };
        let cell = &buffer.records;
        let mut guard = cell.lock();
        // Read under the buffer's lock: `shutdown` sets the mode before the committer's last
        // round takes the buffers (under this lock), so a record that finds the store open
        // here is in the buffer before that take and is committed; read before the lock, a
        // writer could find it open, be overtaken by the last round, and have its record
        // acknowledged but never written. (A buffer that round did not see is covered by
        // `new_buffer`.)
        let mode = self.mode.load(Relaxed);
        if mode & !LOW != 0 {
            return Err(Errno((mode & !LOW) as i32));
        }
        let b = &mut *guard;
        let stamp = self.clock.now();
        // Encoded in place: a chunk with less than `ROOM` bytes left is followed by a new
        // one first; a larger record grows its chunk (which then leaves the pool).
        if b.chunks
            .last()
            .is_none_or(|c| c.capacity() - c.len() < ROOM)
        {
            b.chunks.push(self.chunk(ROOM));
        }
        let c = b.chunks.last_mut().expect("a chunk with room");
        let start = c.len();
        c.resize(start + entry_at::RECORD, 0);
        put(c, start + entry_at::STAMP, &stamp.to_le_bytes());
        rec.encode(c);
        let len = c.len() - start - entry_at::RECORD;
        if mode & LOW != 0 && !frees_space(rec) {
            // Charged to the budget the committer set; refused (and taken back out of the
            // buffer) if it does not fit.
            let size = (entry_at::RECORD + len) as i64;
            if self.budget.fetch_sub(size, Relaxed) < size {
                self.budget.fetch_add(size, Relaxed);
                c.truncate(start);
                return Err(Errno::ENOSPC);
            }
        }
        put(c, start + entry_at::LEN, &(len as u32).to_le_bytes());
        b.bytes += entry_at::RECORD + len;
        // Read by `sync_then` (Acquire) to learn how far a sync must reach.
        buffer.last.store(stamp, Release);
        let kick = b.bytes >= WAKE_BYTES && !b.kicked;
        if kick {
            b.kicked = true;
        }
        let full = b.bytes >= self.full_bytes();
        drop(guard);
        if kick {
            self.state.lock().kicked = true;
            self.work.notify_one();
        }
        if full {
            self.throttle(cell);
        }
        Ok(())
    }

    /// This thread's buffer, made on its first append. The state lock taken once it is in
    /// `buffers` orders it against `shutdown`: either the committer's last round (which
    /// reads `shutdown` under that lock) comes after and takes this buffer too, or the mode
    /// `shutdown` set before it is seen by the append's check.
    #[cold]
    fn new_buffer(&self) -> &CachePadded<ThreadBuffer> {
        let b = self.buffers.get_or(Default::default);
        drop(self.state.lock());
        b
    }

    /// Waits until the committer has taken the buffer `cell` (module doc, "Backpressure"),
    /// or the store stopped.
    #[cold]
    fn throttle(&self, cell: &Mutex<Buffered>) {
        while cell.lock().bytes >= self.full_bytes() && self.mode.load(Relaxed) & !LOW == 0 {
            let mut s = self.state.lock();
            if s.shutdown {
                return;
            }
            s.kicked = true;
            self.work.notify_one();
            // Bounded: the committer notifies after taking the buffers, outside this lock's
            // hold by the waiter, so a wake-up can fall between the check and the wait.
            self.drained.wait_for(&mut s, Duration::from_millis(5));
        }
    }

    /// Waits until every record appended before the call is durable (see the module doc).
    /// ENOSPC if a round fails for lack of space meanwhile (module doc, "Errors").
    /// A [`Committer::sync_then`] whose callback unparks this thread (module doc, "Group commit").
    /// It uses the thread's park token (`std::thread::park`): other code on the thread that
    /// parks must loop on its own condition, as `std` requires of every parker (an unpark
    /// meant for one wait may end another early).
    pub(crate) fn sync(&self) -> lanefs::Result<()> {
        self.sync_as(false)
    }

    /// [`Committer::sync`] for a checkpoint: served even while the journal is over its bound and
    /// other syncs wait for the checkpoint (module doc, "Backpressure").
    pub(crate) fn sync_for_checkpoint(&self) -> lanefs::Result<()> {
        self.sync_as(true)
    }

    fn sync_as(&self, urgent: bool) -> lanefs::Result<()> {
        let me = Arc::new(Waiting {
            result: AtomicI32::new(PENDING),
            thread: std::thread::current(),
        });
        let w = me.clone();
        let done: SyncDone = Box::new(move |r| {
            w.result.store(r.err().map_or(0, |e| e.0), Release);
            w.thread.unpark();
        });
        self.sync_then_as(done, urgent);
        loop {
            match me.result.load(Acquire) {
                // Parking may end early (an unpark meant for an earlier wait): look again.
                PENDING => std::thread::park(),
                0 => return Ok(()),
                e => return Err(Errno(e)),
            }
        }
    }

    /// Runs the committer until [`Committer::shutdown`]; then commits what is left and returns.
    pub(crate) fn run(&self, mut writer: Writer) {
        // Records stamped at or after a round's `t`, kept for the next round, each source
        // still in stamp order.
        let mut carry: Vec<Src> = Vec::new();
        // Records of a round that failed for lack of space (held), then those of this round.
        let mut payload = Payload::new();
        // How long the last flush took.
        let mut last_flush = Duration::ZERO;
        let reserve = reserve(writer.segment_size());
        // `sync` calls seen, and whether the next segment could not be made.
        let mut asks = 0;
        let mut short = false;
        // Since when records written have waited for a flush (none: every one is flushed).
        let mut unflushed: Option<Instant> = None;
        loop {
            // Records written and unflushed for the flush interval are flushed by this round.
            let flush_in = unflushed.map(|t| self.flush_interval.saturating_sub(t.elapsed()));
            let (flush, shutdown, urgent) = {
                let mut s = self.state.lock();
                if s.held {
                    // Written again every `RETRY`, or at once when someone asks.
                    if s.asks == asks && !s.shutdown {
                        self.work.wait_for(&mut s, self.interval.min(RETRY));
                    }
                } else if !(s.requested > s.durable || s.kicked || s.shutdown) {
                    let wait = flush_in.map_or(self.interval, |f| self.interval.min(f));
                    self.work.wait_for(&mut s, wait);
                }
                let flush = s.requested > s.durable || s.shutdown;
                if flush && !s.held && s.callbacks.len() < s.gather && !s.shutdown {
                    // The threads the last flush served are likely coming back with syncs of
                    // their own: wait for as many as waited then (at most a flush's time), so
                    // that one flush serves them all rather than each a round of its own.
                    let until = Instant::now() + last_flush.min(GATHER_MAX);
                    while s.callbacks.len() < s.gather && !s.shutdown {
                        if self.work.wait_until(&mut s, until).timed_out() {
                            break;
                        }
                    }
                }
                asks = s.asks;
                s.kicked = false;
                let due = unflushed.is_some_and(|t| t.elapsed() >= self.flush_interval);
                (flush || due, s.shutdown, s.urgent > s.durable)
            };
            if !urgent && !shutdown && self.mode.load(Relaxed) == 0 && self.held_off(writer.seq()) {
                // The journal is over its size and the checkpointer works through it: nothing
                // is written but for the checkpoint's own syncs until its segments go.
                let mut s = self.state.lock();
                if !(s.urgent > s.durable || s.shutdown || s.held) && self.held_off(writer.seq()) {
                    self.work.wait_for(&mut s, BEHIND_WAIT);
                }
                continue;
            }
            let t = self.clock.now();
            let mut srcs = std::mem::take(&mut carry);
            for buffer in self.buffers.iter() {
                let mut b = buffer.records.lock();
                if b.bytes == 0 {
                    continue;
                }
                srcs.push(Src::new(std::mem::take(&mut b.chunks)));
                b.bytes = 0;
                b.kicked = false;
            }
            self.drained.notify_all();
            // Written in pieces of at most `PIECE` bytes, so that the memory a round touches
            // stays bounded (and warm) however far the committer fell behind.
            let began = Instant::now();
            let done = loop {
                let finished = merge(&mut srcs, t, &mut payload, PIECE);
                match writer.write_payload(&mut payload) {
                    Ok(lsn) => self.written.store(lsn, Release),
                    Err(e) => break Err(e),
                }
                if finished {
                    break match flush {
                        true => writer.flush().inspect(|()| {
                            self.flushes.fetch_add(1, Relaxed);
                            self.flushed.store(self.written.load(Relaxed), Release);
                            unflushed = None;
                        }),
                        false => Ok(()),
                    };
                }
            };
            if unflushed.is_none() && self.written.load(Relaxed) > self.flushed.load(Relaxed) {
                unflushed = Some(began);
            }
            // What is left of each source (stamped at or after `t`) waits for the next
            // round; the chunks consumed go back to the threads.
            let mut spent = Vec::new();
            for src in srcs {
                if let Some(rest) = src.rest(|n| self.chunk(n), &mut spent) {
                    carry.push(rest);
                }
            }
            {
                let mut free = self.free.lock();
                for mut c in spent {
                    if free.len() < POOL_CHUNKS && c.capacity() == CHUNK {
                        c.clear();
                        free.push(c);
                    }
                }
            }
            let held = match done {
                Ok(()) => {
                    let mut s = self.state.lock();
                    if s.held {
                        eprintln!("lanefs: the journal has room again; held records written");
                    }
                    s.held = false;
                    if flush {
                        s.durable = s.durable.max(t);
                        // Every sync present now: those served will likely sync again.
                        s.gather = s.callbacks.len();
                        last_flush = began.elapsed();
                        let ready = settle(&mut s);
                        drop(s);
                        ready.into_iter().for_each(|(f, r)| f(r));
                    }
                    false
                }
                Err(e) if out_of_space(&e) && !shutdown => {
                    // Appends are refused before anyone hears of the failure.
                    self.budget.store(i64::MIN / 2, Relaxed);
                    self.mode.fetch_or(LOW, Relaxed);
                    // What was written before the failure is made durable, so that a
                    // checkpoint can take it: the segments it gives back make room for the
                    // held records (a round that served no sync flushed nothing).
                    if let Err(fe) = writer.flush() {
                        self.stop(&fe, Errno::EIO);
                        break;
                    }
                    if self.written.load(Relaxed) > self.flushed.load(Relaxed) {
                        self.flushes.fetch_add(1, Relaxed);
                        self.flushed.store(self.written.load(Relaxed), Release);
                    }
                    unflushed = None;
                    let mut s = self.state.lock();
                    if !s.held {
                        eprintln!(
                            "lanefs: the journal is out of space, records are held and \
                             changes refused until there is room: {e}"
                        );
                    }
                    s.held = true;
                    s.failures += 1;
                    let ready = settle(&mut s);
                    drop(s);
                    ready.into_iter().for_each(|(f, r)| f(r));
                    true
                }
                Err(e) => {
                    let errno = match out_of_space(&e) {
                        true => Errno::ENOSPC,
                        false => Errno::EIO,
                    };
                    self.stop(&e, errno);
                    break;
                }
            };
            // Whether the next segment can be made decides whether the store is low. Near the
            // end of the segment, the committer waits to know.
            let near_end = writer.room() < 2 * reserve + payload.len() as u64;
            match writer.poll_spare(near_end) {
                Spare::Ready => short = false,
                Spare::Making => {}
                Spare::Missing => writer.prepare_spare(),
                Spare::Failed(e) if out_of_space(&e) => {
                    if !short {
                        eprintln!("lanefs: no room for the next journal segment: {e}");
                    }
                    short = true;
                    writer.prepare_spare();
                }
                Spare::Failed(e) => {
                    self.stop(&e, Errno::EIO);
                    break;
                }
            }
            self.tight
                .store(self.over(writer.seq()) || writer.host_short(), Relaxed);
            if held || short {
                self.set_low(held, &writer, reserve, &payload, &carry);
            } else {
                self.mode.fetch_and(!LOW, Relaxed);
            }
            if shutdown && carry.is_empty() {
                break;
            }
        }
        self.running.store(false, Relaxed);
        // Callbacks still waiting get what a `sync` would: nothing more becomes durable.
        let mut s = self.state.lock();
        let mut ready = settle(&mut s);
        let e = s.error.unwrap_or(Errno::EIO);
        ready.extend(s.callbacks.drain(..).map(|c| (c.done, Err(e))));
        drop(s);
        ready.into_iter().for_each(|(f, r)| f(r));
    }

    /// [`Committer::sync`] without waiting (`Store::sync_then`): `done` is called by the committer
    /// once a flush covers the call (or the round fails), or at once if that is known now.
    /// The committer calls the callbacks one after another on its own thread, blocking
    /// syncs' among them: one that blocks delays every waiting sync and the next round.
    pub(crate) fn sync_then(&self, done: SyncDone) {
        self.sync_then_as(done, false)
    }

    fn sync_then_as(&self, done: SyncDone, urgent: bool) {
        // The last stamp each thread appended: every record appended before this call (in
        // happens-before order) stored its stamp, or a later one of its thread, before
        // the call began, so none is stamped above `t` (module doc, "Group commit").
        let t = self
            .buffers
            .iter()
            .map(|b| b.last.load(Acquire))
            .max()
            .unwrap_or(0);
        let mut s = self.state.lock();
        let now = if let Some(e) = s.error {
            Some(Err(e))
        } else if !self.running.load(Relaxed) {
            // Closed (or not started): no sync succeeds, whatever it would wait for.
            Some(Err(Errno::EIO))
        } else if s.durable > t || t == 0 {
            Some(Ok(()))
        } else {
            None
        };
        if let Some(r) = now {
            drop(s);
            return done(r);
        }
        let failures = s.failures;
        if urgent {
            s.urgent = s.urgent.max(t + 1);
        }
        s.callbacks.push(Callback { t, failures, done });
        s.asks += 1;
        // The committer waits for work while no round is asked for, and for the last of
        // `gather` syncs before a round that flushes; otherwise it will see this sync when
        // its round ends. Waking it for every sync cost a wake-up per sync.
        let waiting = s.requested <= s.durable || s.callbacks.len() == s.gather;
        s.requested = s.requested.max(t + 1);
        if s.held || waiting || urgent {
            self.work.notify_one();
        }
    }

    /// Marks the committer as running (before its thread starts, so that an early `sync`
    /// waits for it).
    pub(crate) fn started(&self) {
        self.running.store(true, Relaxed);
    }

    /// Meters appends while the store is low on space: the budget is the room left in the
    /// segment being written, less the reserve and what is buffered or held (nothing while
    /// records are held).
    fn set_low(&self, held: bool, writer: &Writer, reserve: u64, payload: &Payload, carry: &[Src]) {
        let budget = if held {
            i64::MIN / 2
        } else {
            let buffered: usize = self.buffers.iter().map(|b| b.records.lock().bytes).sum();
            let carried: usize = carry.iter().map(Src::bytes).sum();
            writer.room() as i64 - reserve as i64 - (payload.len() + buffered + carried) as i64
        };
        self.budget.store(budget, Relaxed);
        self.mode.fetch_or(LOW, Relaxed);
    }

    /// Stops the store after a journal error (see the module doc).
    fn stop(&self, e: &StoreError, errno: Errno) {
        eprintln!("lanefs: the store stopped: {e}");
        self.mode.store(errno.0 as u32, Relaxed);
        let mut s = self.state.lock();
        s.error.get_or_insert(errno);
        let ready = settle(&mut s);
        drop(s);
        ready.into_iter().for_each(|(f, r)| f(r));
    }

    /// Asks the committer to commit what is buffered and return.
    pub(crate) fn shutdown(&self) {
        // From now on appends are refused (EROFS, unless the store already stopped with an
        // error): nothing appended after this would be committed, and writers that kept
        // appending would keep the last round from ever ending.
        let _ = self.mode.fetch_update(Relaxed, Relaxed, |m| {
            (m & !LOW == 0).then_some(m | Errno::EROFS.0 as u32)
        });
        self.state.lock().shutdown = true;
        self.work.notify_one();
    }

    /// The error that stopped the store, if one did.
    pub(crate) fn error(&self) -> Option<Errno> {
        self.state.lock().error
    }
}

/// The stamp and record length of the entry at `at`.
#[inline]
fn entry(run: &[u8], at: usize) -> (u64, usize) {
    let stamp = u64_at(run, at + entry_at::STAMP);
    let len = u32_at(run, at + entry_at::LEN);
    (stamp, len as usize)
}

/// One thread's records (or those carried from a round before), in stamp order across its
/// chunks, with a cursor.
struct Src {
    chunks: Vec<Vec<u8>>,
    ci: usize,
    at: usize,
}

impl Src {
    fn new(chunks: Vec<Vec<u8>>) -> Src {
        Src {
            chunks,
            ci: 0,
            at: 0,
        }
    }

    /// The next record's stamp, if any.
    #[inline]
    fn head(&mut self) -> Option<u64> {
        while self.ci < self.chunks.len() {
            if self.at < self.chunks[self.ci].len() {
                return Some(entry(&self.chunks[self.ci], self.at).0);
            }
            self.ci += 1;
            self.at = 0;
        }
        None
    }

    /// Bytes of records not yet taken (about: the part of a chunk already taken counts).
    fn bytes(&self) -> usize {
        self.chunks[self.ci.min(self.chunks.len())..]
            .iter()
            .map(Vec::len)
            .sum()
    }

    /// Moves the next record to `out`.
    #[inline]
    fn take(&mut self, out: &mut Payload) {
        let c = &self.chunks[self.ci];
        let (_, len) = entry(c, self.at);
        let rec = self.at + entry_at::RECORD;
        out.push(&c[rec..rec + len]);
        self.at = rec + len;
    }

    /// The records not taken, as a source of their own (`chunk` gives a chunk for the rest
    /// of a partly taken one); the chunks wholly taken go to `spent`.
    fn rest(
        mut self,
        chunk: impl FnOnce(usize) -> Vec<u8>,
        spent: &mut Vec<Vec<u8>>,
    ) -> Option<Src> {
        self.head()?;
        let mut chunks = Vec::new();
        let mut it = self.chunks.into_iter().enumerate();
        for (i, c) in it.by_ref() {
            if i < self.ci {
                spent.push(c);
            } else if self.at == 0 {
                chunks.push(c);
                break;
            } else {
                let mut r = chunk(c.len() - self.at);
                r.extend_from_slice(&c[self.at..]);
                chunks.push(r);
                spent.push(c);
                break;
            }
        }
        chunks.extend(it.map(|(_, c)| c));
        Some(Src::new(chunks))
    }
}

/// Moves records stamped below `t` from `srcs` (each in stamp order) to `out`, in one
/// stamp order: the smallest head first (the first source's of equal ones), found by a scan
/// over a few sources or a heap over many. The source found goes on giving records while
/// they are stamped below the smallest of the others' heads (a thread's records come in
/// runs). Stops once `out` holds `limit` bytes; returns whether
/// every such record was moved.
fn merge(srcs: &mut [Src], t: u64, out: &mut Payload, limit: usize) -> bool {
    let below = |s: Option<u64>| s.filter(|&x| x < t);
    if srcs.len() <= 8 {
        loop {
            if out.len() >= limit {
                return false;
            }
            // The smallest head, and the smallest of the others' heads (or `t`).
            let mut best: Option<(u64, usize)> = None;
            let mut others = t;
            for (i, s) in srcs.iter_mut().enumerate() {
                let Some(x) = below(s.head()) else { continue };
                match best {
                    Some((b, _)) if x >= b => others = others.min(x),
                    _ => {
                        if let Some((b, _)) = best {
                            others = others.min(b);
                        }
                        best = Some((x, i));
                    }
                }
            }
            let Some((_, i)) = best else { return true };
            loop {
                srcs[i].take(out);
                if out.len() >= limit {
                    return false;
                }
                // Strictly below: on a tie, the scan decides (the first source's first).
                if srcs[i].head().is_none_or(|x| x >= others) {
                    break;
                }
            }
        }
    }
    let mut heap = std::collections::BinaryHeap::with_capacity(srcs.len());
    for (i, s) in srcs.iter_mut().enumerate() {
        if let Some(x) = below(s.head()) {
            heap.push(std::cmp::Reverse((x, i)));
        }
    }
    while let Some(std::cmp::Reverse((_, i))) = heap.pop() {
        // The smallest of the others' heads (or `t`): source `i` goes on below it.
        let others = heap.peek().map_or(t, |std::cmp::Reverse((x, _))| *x);
        loop {
            if out.len() >= limit {
                return false;
            }
            srcs[i].take(out);
            match below(srcs[i].head()) {
                Some(x) if x < others => {}
                Some(x) => {
                    heap.push(std::cmp::Reverse((x, i)));
                    break;
                }
                None => break,
            }
        }
    }
    true
}

/// Runs `committer`'s rounds on a thread of its own (the committer's thread).
pub(crate) fn spawn(committer: Arc<Committer>, writer: Writer) -> std::thread::JoinHandle<()> {
    // What the journal held at open counts as written: a sync with nothing appended since
    // makes no round that would say so (the checkpointer reads it after one).
    committer.written.store(writer.last_lsn(), Relaxed);
    // Opening flushed it.
    committer.flushed.store(writer.last_lsn(), Relaxed);
    committer.started();
    std::thread::Builder::new()
        .name("lanefs-commit".into())
        .spawn(move || committer.run(writer))
        .expect("spawn the committer")
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng, rngs::StdRng};

    /// The merge gives every record stamped below `t` in the order of (stamp, source, place in
    /// its source), whether the sources come in runs or interleave, with ties, and however
    /// often a limit stops it; it leaves the others.
    #[test]
    fn merging_gives_stamp_order_in_runs_and_ties() {
        for seed in 0..300u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let n = rng.random_range(1..=10);
            let run = rng.random_range(1..6u64);
            let mut all = Vec::new();
            let mut srcs: Vec<Src> = (0..n)
                .map(|s| {
                    let mut stamp = rng.random_range(0..4u64);
                    let mut chunks = vec![Vec::new()];
                    for k in 0..rng.random_range(0..40) {
                        if k % run == 0 {
                            stamp += rng.random_range(0..3 * n as u64);
                        }
                        let rec = format!("{s}.{k}").into_bytes();
                        if rng.random_bool(0.1) {
                            chunks.push(Vec::new());
                        }
                        let c = chunks.last_mut().unwrap();
                        c.extend_from_slice(&stamp.to_le_bytes());
                        c.extend_from_slice(&(rec.len() as u32).to_le_bytes());
                        c.extend_from_slice(&rec);
                        all.push((stamp, s, k, rec));
                    }
                    Src::new(chunks)
                })
                .collect();
            let t = rng.random_range(0..6 * n as u64 * 10);
            all.sort();
            let want: Vec<Vec<u8>> = all
                .iter()
                .filter(|r| r.0 < t)
                .map(|r| r.3.clone())
                .collect();
            let mut got = Vec::new();
            let limit = Payload::new().len() + rng.random_range(1..150);
            loop {
                let mut out = Payload::new();
                let done = merge(&mut srcs, t, &mut out, limit);
                got.extend(out.records().into_iter().map(<[u8]>::to_vec));
                if done {
                    break;
                }
            }
            assert_eq!(got, want, "seed {seed}");
            let left: usize = srcs
                .iter_mut()
                .map(|s| {
                    let mut k = 0;
                    while s.head().is_some() {
                        let mut out = Payload::new();
                        s.take(&mut out);
                        k += 1;
                    }
                    k
                })
                .sum();
            assert_eq!(left, all.len() - want.len(), "seed {seed}");
        }
    }
}
