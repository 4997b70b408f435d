//! The checkpointer: the thread of an open store that takes a checkpoint when one is due,
//! and the checkpoints asked for (`StoreHandle::checkpoint`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::time::Duration;

use lanefs::PageEpochs;
use parking_lot::{Condvar, Mutex};

use super::{Checkpoint, journal};
use crate::clock::Clock;
use crate::commit::Committer;
use crate::disk::Disk;
use crate::error::CheckpointError;

/// When the checkpointer takes a checkpoint.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Policy {
    /// Records in the journal after the checkpoint.
    pub records: u64,
    /// Segments in the journal.
    pub segments: usize,
    /// Segments in the journal beyond which the committer holds off until a checkpoint
    /// lets some go, and a checkpoint is due ([`Committer::set_checkpointing`]; commit.rs,
    /// "Backpressure").
    pub journal_segments: usize,
    /// Pages of file data changed since the last checkpoint began that make one due, and
    /// changed since the last one committed began that make writers wait
    /// ([`PageEpochs::set_budget`]).
    pub changed_due: u64,
    pub changed_limit: u64,
    /// How often it looks.
    pub poll: Duration,
    /// The wait after the first failure in a row ([`Backoff`]).
    pub retry: Duration,
    /// The longest wait.
    pub retry_max: Duration,
}

/// What the checkpointer has done ([`crate::StoreHandle::checkpoint_status`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckpointStatus {
    /// Times the checkpointer's thread has looked whether a checkpoint is due
    /// ([`crate::Options::checkpoint_poll`]), each counted once it has done what it found to do.
    pub polls: u64,
    /// Checkpoints begun, by the checkpointer or on demand.
    pub attempts: u64,
    /// Failed tries (checkpoints, or reopens of the checkpoint's database) since the last
    /// checkpoint that succeeded.
    pub failures: u32,
    /// While there are failures: when the checkpointer tries again, by the store's clock
    /// ([`crate::Options::clock`]).
    pub retry_at: Option<Duration>,
}

/// The checkpointer's thread and how to stop it.
/// What the checkpointer's thread is woken for.
#[derive(Default)]
struct Wake {
    /// The store is closing.
    stop: bool,
    /// A checkpoint may be due before the next poll ([`PageEpochs::set_budget`]).
    nudged: bool,
}

pub(crate) struct Checkpointer {
    stop: Arc<(Mutex<Wake>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
    ck: Arc<Mutex<Checkpoint>>,
    committer: Arc<Committer>,
    disk: Arc<dyn Disk>,
    epochs: Arc<PageEpochs>,
    policy: Policy,
    clock: Arc<dyn Clock>,
    /// [`CheckpointStatus::polls`].
    polls: Arc<AtomicU64>,
}

/// Takes a checkpoint of every record appended so far: makes them durable in the journal,
/// then applies them to the checkpoint and commits it ([`Checkpoint::apply_journal`]); returns
/// the records it applied. It begins a page epoch first and declares it kept once the
/// checkpoint is committed, so that the engine may drop the pages it holds (engine `data.rs`,
/// "Pages the store keeps"). If the journal cannot make its records durable for lack of room,
/// it applies those already durable, and fails.
fn sync_and_apply(
    ck: &mut Checkpoint,
    committer: &Committer,
    disk: &dyn Disk,
    epochs: &PageEpochs,
    stop: &dyn Fn() -> bool,
) -> Result<u64, CheckpointError> {
    let epoch = epochs.begin();
    // Every record appended before the first sync (so every change labelled with `epoch` or
    // before) is written when it returns; the second makes every record written by then
    // durable.
    let synced = committer.sync_for_checkpoint().and_then(|()| {
        let written = committer.counters().lsn;
        committer.sync_for_checkpoint().map(|()| written)
    });
    match synced {
        Ok(written) => {
            let applied = ck.apply_journal(disk, written, stop)?;
            epochs.kept(epoch);
            ck.keep_reserve(disk);
            Ok(applied)
        }
        Err(e) if e == lanefs::Errno::ENOSPC => {
            // Records are held for lack of room (commit.rs, "Errors"), perhaps the removals
            // that would give it back: the records already durable are taken, and the
            // segments they fill removed, so that the held ones can be written. Not every
            // change labelled `epoch` is in it: the epoch is not declared kept, and the
            // attempt counts as failed (the next one takes everything), and the reserve is
            // left to the journal until one succeeds.
            ck.careful = true;
            let durable = committer.flushed_lsn();
            let applied = ck.apply_journal(disk, durable, stop)?;
            ck.careful = true;
            Err(CheckpointError::DurableTaken {
                errno: e,
                applied,
                durable,
            })
        }
        Err(e) => Err(CheckpointError::JournalCommit(e)),
    }
}

/// What [`sync_and_apply`] needs besides the checkpoint.
struct Ctx<'a> {
    committer: &'a Committer,
    disk: &'a dyn Disk,
    epochs: &'a PageEpochs,
    policy: &'a Policy,
    clock: &'a dyn Clock,
}

/// One try of a checkpoint: [`sync_and_apply`], counted in the checkpoint's attempts and its
/// [`Backoff`] (a failure that a stop caused is not counted as one), with the committer told
/// that a checkpoint works through the journal (commit.rs, "Backpressure").
fn try_checkpoint(
    ck: &mut Checkpoint,
    c: &Ctx<'_>,
    stop: &dyn Fn() -> bool,
) -> Result<u64, CheckpointError> {
    ck.attempts += 1;
    // From now until a look finds none due, a journal over its size takes only syncs, so
    // that writers wait for this checkpoint and the next rather than grow the journal in
    // between, or while a checkpoint asked for runs (commit.rs, "Backpressure").
    let first = |ck: &Checkpoint| {
        journal::segments(c.disk, &ck.store)
            .ok()
            .and_then(|s| s.first().copied())
    };
    c.committer.set_checkpointing(true, first(ck));
    let r = sync_and_apply(ck, c.committer, c.disk, c.epochs, stop);
    c.committer.set_checkpointed(ck.lsn());
    // After a failure nothing ends a wait until the next try.
    c.committer.set_checkpointing(r.is_ok(), first(ck));
    match &r {
        Ok(_) => ck.backoff.succeeded(),
        Err(_) if stop() => {}
        Err(_) => {
            ck.backoff.failed(c.clock.now(), c.policy);
        }
    }
    // Writers over the budget of changed pages wait for checkpoints only while they succeed,
    // and not once the store is closing (`Checkpointer::stop`).
    if !stop() {
        c.epochs.set_stalled(r.is_err());
    }
    r
}

impl Checkpointer {
    fn ctx(&self) -> Ctx<'_> {
        Ctx {
            committer: &self.committer,
            disk: &*self.disk,
            epochs: &self.epochs,
            policy: &self.policy,
            clock: &*self.clock,
        }
    }

    /// Takes a checkpoint of every record appended so far, now (whatever the [`Backoff`]
    /// says; its outcome counts there); returns the records it applied.
    pub(crate) fn checkpoint_now(&self) -> Result<u64, CheckpointError> {
        try_checkpoint(&mut self.ck.lock(), &self.ctx(), &|| false)
    }

    /// Every record up to this LSN is in the checkpoint.
    pub(crate) fn lsn(&self) -> u64 {
        self.ck.lock().lsn()
    }

    /// What the checkpointer has done.
    pub(crate) fn status(&self) -> CheckpointStatus {
        let ck = self.ck.lock();
        CheckpointStatus {
            polls: self.polls.load(SeqCst),
            attempts: ck.attempts,
            failures: ck.backoff.failures,
            retry_at: ck.backoff.until,
        }
    }

    /// Stops the thread (a checkpoint in progress is abandoned) and waits for it.
    pub(crate) fn stop(&mut self) {
        self.epochs.set_stalled(true);
        if let Some(t) = self.thread.take() {
            self.stop.0.lock().stop = true;
            self.stop.1.notify_all();
            let _ = t.join();
        }
        // No checkpoint will come: the journal's writers wait for none.
        self.committer.set_checkpointing(false, None);
        // Again: an attempt that was running when the first call came may have cleared it.
        self.epochs.set_stalled(true);
    }
}

impl Checkpointer {
    /// Stops the checkpointer and closes the checkpoint's database (the store is being
    /// closed): a filesystem that outlives its store reads no page from it any more (EIO),
    /// and never writes to a file another opening of the store may be using.
    pub(crate) fn close(&mut self) {
        self.stop();
        self.ck.lock().close_db();
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One look of the checkpointer's thread (`mod.rs`, "Errors" and "Retrying"): unless
/// it is waiting after failures, it reopens a database that a page read found failing or a
/// failed checkpoint left closed, and tries a checkpoint if one is due ([`try_checkpoint`]).
/// `said`: a failure of the current run was said on stderr. Returns false if it was stopped.
fn checkpoint_if_due(
    ck: &mut Checkpoint,
    c: &Ctx<'_>,
    stopped: &dyn Fn() -> bool,
    said: &mut bool,
) -> bool {
    if !ck.backoff.ready(c.clock.now()) {
        return true;
    }
    if ck.needs_reopen() {
        // Cheap (no integrity check), and reads of pages out of memory fail until it is done:
        // not left for a checkpoint to become due.
        if let Err(e) = ck.reopen(c.disk) {
            // Nothing ends a wait for checkpoints until the next try.
            c.committer.set_checkpointing(false, None);
            let wait = ck.backoff.failed(c.clock.now(), c.policy);
            if !*said {
                eprintln!(
                    "lanefs: {e} (pages out of memory cannot be read until it reopens; will try \
                     again in {wait:?}, then less often)"
                );
                *said = true;
            }
            return true;
        }
    }
    let written = c.committer.counters().lsn;
    let mut seqs = journal::segments(c.disk, &ck.store).unwrap_or_default();
    if c.committer.low() && written <= ck.lsn() && seqs.len() > 1 {
        // Short of room with every record in the checkpoint: a segment it covers can go once
        // the one after it has started (perhaps since the last commit), kept for reuse as the
        // journal's next spare.
        if ck.recycle(c.disk).is_ok() {
            seqs = journal::segments(c.disk, &ck.store).unwrap_or_default();
        }
    }
    if let [only] = seqs[..]
        && c.committer.low()
        && journal::free_segments(c.disk, &ck.store).is_ok_and(|f| f.is_empty())
    {
        // Short of room, with one segment in the journal (no checkpoint can give one back
        // before the next has started) and none kept to make the next from: only the
        // checkpoint's own free space can give the journal room (docs/STORE.md, known bug
        // C). Once while the journal is in that segment.
        if let Err(e) = ck.compact_for_room(c.disk, only) {
            eprintln!("lanefs: {e}");
        }
    }
    let segments = seqs.len();
    // Changed pages due even with every record already in the checkpoint (they were appended
    // while the last one synced): a checkpoint with nothing to apply still declares their
    // epoch kept, which writers waiting for it need.
    let due = written.saturating_sub(ck.lsn()) >= c.policy.records
        || (segments >= c.policy.segments && written > ck.lsn())
        || c.epochs.due()
        // Short of room: only a checkpoint gives the journal's segments back.
        || (c.committer.low() && written > ck.lsn())
        // Over its bound: writers wait for this checkpoint (commit.rs, "Backpressure").
        || (segments > c.policy.journal_segments && written > ck.lsn());
    if !due {
        // No wait for a checkpoint while none is due: none would end it.
        c.committer.set_checkpointing(false, seqs.first().copied());
        return true;
    }
    let failures = ck.backoff.failures;
    let r = try_checkpoint(ck, c, stopped);
    match r {
        Ok(_) => {
            if *said {
                eprintln!(
                    "lanefs: checkpoint of {} succeeded after {failures} failed tries",
                    ck.path().display()
                );
            }
            *said = false;
        }
        Err(_) if stopped() => return false,
        Err(e) => {
            if !*said {
                eprintln!(
                    "lanefs: checkpoint of {} failed (the journal keeps every record; will try \
                     again in {:?}, then less often): {e}",
                    ck.path().display(),
                    ck.backoff
                        .until
                        .unwrap_or_default()
                        .saturating_sub(c.clock.now()),
                );
                *said = true;
            }
        }
    }
    true
}

/// Starts the checkpointer of an open store (see `mod.rs`).
pub(crate) fn spawn(
    ck: Checkpoint,
    committer: Arc<Committer>,
    disk: Arc<dyn Disk>,
    epochs: Arc<PageEpochs>,
    policy: Policy,
    clock: Arc<dyn Clock>,
) -> Checkpointer {
    let stop = Arc::new((Mutex::new(Wake::default()), Condvar::new()));
    let polls = Arc::new(AtomicU64::new(0));
    let ck = Arc::new(Mutex::new(ck));
    let wake = stop.clone();
    epochs.set_budget(
        policy.changed_due,
        policy.changed_limit,
        Box::new(move || {
            wake.0.lock().nudged = true;
            wake.1.notify_all();
        }),
    );
    let mut c = Checkpointer {
        stop,
        thread: None,
        ck,
        committer,
        disk,
        epochs,
        policy,
        clock,
        polls,
    };
    let (s, ck, committer, disk, epochs, clock, polls) = (
        c.stop.clone(),
        c.ck.clone(),
        c.committer.clone(),
        c.disk.clone(),
        c.epochs.clone(),
        c.clock.clone(),
        c.polls.clone(),
    );
    let thread = std::thread::Builder::new()
        .name("lanefs-checkpoint".into())
        .spawn(move || {
            let stopped = || s.0.lock().stop;
            let ctx = Ctx {
                committer: &committer,
                disk: &*disk,
                epochs: &epochs,
                policy: &policy,
                clock: &*clock,
            };
            let mut said = false;
            loop {
                {
                    let mut g = s.0.lock();
                    if !g.stop && !g.nudged {
                        s.1.wait_for(&mut g, policy.poll);
                    }
                    if g.stop {
                        return;
                    }
                    g.nudged = false;
                }
                if !checkpoint_if_due(&mut ck.lock(), &ctx, &stopped, &mut said) {
                    return;
                }
                polls.fetch_add(1, SeqCst);
            }
        })
        .expect("spawn the checkpointer");
    c.thread = Some(thread);
    c
}
