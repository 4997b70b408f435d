//! Appending records and group commit.
//!
//! **Appending** ([`Log::append`]) is on the engine's hot path, inside the engine's locks, so
//! it shares nothing between threads: each thread encodes its records into a buffer of its
//! own, each stamped with [`Clock::now`] (`stamp.rs` says why stamps order records the way
//! the engine's locks do). The only shared write is to that buffer's mutex, which nothing
//! but the committer ever contends for.
//!
//! **Committing** is one thread's job (the committer). A round: read a stamp `t`; take from
//! every thread's buffer each record stamped below `t` (records stamped later stay for the
//! next round); merge them by stamp; write them to the journal as batches and flush
//! (`journal.rs`); then every record stamped below `t` is durable. Every record stamped
//! below `t` has been appended before its buffer is taken: its thread read the stamp while
//! holding the buffer's mutex, which the committer takes after reading `t`.
//!
//! **Group commit**: [`Log::sync`] reads a stamp `s` and waits until the durable stamp
//! passes it; the committer starts a round as soon as anyone waits (or every commit
//! interval, or when a buffer grows large), so every thread waiting when a round starts is
//! served by that round's one flush, and those arriving during it by the next. An fsync
//! costs the records written since the last round, whatever the number of files.
//!
//! **Errors**: a journal write or flush that fails stops the store: the error is kept, every
//! waiting and later `sync` returns it, and every later append is refused with it, so that
//! no change the store could not keep becomes visible after it. (The engine already made the
//! changes appended before; they stay in memory, and what survives a restart is the journal's
//! prefix.)
//!
//! Lock order: a thread's buffer mutex, then nothing; the committer's state mutex, then
//! nothing. The committer never holds the state mutex while taking buffers or writing.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::*};
use std::time::Duration;

use crossbeam_utils::CachePadded;
use lanefs::{Errno, Record};
use parking_lot::{Condvar, Mutex};
use thread_local::ThreadLocal;

use crate::error::StoreError;
use crate::journal::Writer;
use crate::stamp::Clock;

/// A buffer wakes the committer early once it holds this many bytes.
const WAKE_BYTES: usize = 1 << 20;

/// One thread's records: `[stamp u64][len u32][record]` each, in stamp order.
#[derive(Default)]
struct Buf {
    bytes: Vec<u8>,
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
}

/// The record log of a store (see the module doc).
pub(crate) struct Log {
    clock: Clock,
    bufs: ThreadLocal<CachePadded<Mutex<Buf>>>,
    state: Mutex<State>,
    /// The committer waits here for work.
    work: Condvar,
    /// Waiters in `sync` wait here for rounds.
    done: Condvar,
    /// The errno of a stopped store (0: running), read by every append.
    stopped: AtomicU32,
    interval: Duration,
    /// Set while the committer runs.
    running: AtomicBool,
}

impl Log {
    pub(crate) fn new(interval: Duration) -> Log {
        Log {
            clock: Clock::new(),
            bufs: ThreadLocal::new(),
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            done: Condvar::new(),
            stopped: AtomicU32::new(0),
            interval,
            running: AtomicBool::new(false),
        }
    }

    /// Whether stamps come from the time-stamp counter (else a shared counter).
    pub(crate) fn uses_tsc(&self) -> bool {
        self.clock.uses_tsc()
    }

    /// Buffers `rec` (see the module doc). Refused once the store has stopped.
    #[inline]
    pub(crate) fn append(&self, rec: &Record<'_>) -> lanefs::Result<()> {
        let stopped = self.stopped.load(Relaxed);
        if stopped != 0 {
            return Err(Errno(stopped as i32));
        }
        let cell = self.bufs.get_or(Default::default);
        let mut b = cell.lock();
        let stamp = self.clock.now();
        let start = b.bytes.len();
        b.bytes.extend_from_slice(&stamp.to_le_bytes());
        b.bytes.extend_from_slice(&[0; 4]);
        rec.encode(&mut b.bytes);
        let len = (b.bytes.len() - start - 12) as u32;
        b.bytes[start + 8..start + 12].copy_from_slice(&len.to_le_bytes());
        let kick = b.bytes.len() >= WAKE_BYTES && !b.kicked;
        if kick {
            b.kicked = true;
        }
        drop(b);
        if kick {
            self.state.lock().kicked = true;
            self.work.notify_one();
        }
        Ok(())
    }

    /// Waits until every record appended before the call is durable (see the module doc).
    pub(crate) fn sync(&self) -> lanefs::Result<()> {
        let t = self.clock.now();
        let mut s = self.state.lock();
        loop {
            if let Some(e) = s.error {
                return Err(e);
            }
            if s.durable > t {
                return Ok(());
            }
            if !self.running.load(Relaxed) {
                // No committer (not started yet, or shut down): nothing can become durable.
                return Err(Errno::EIO);
            }
            if s.requested <= t {
                s.requested = t + 1;
                self.work.notify_one();
            }
            self.done.wait(&mut s);
        }
    }

    /// Runs the committer until [`Log::shutdown`]; then commits what is left and returns.
    pub(crate) fn run(&self, mut writer: Writer) {
        let mut carry: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut taken: Vec<Vec<u8>> = Vec::new();
        let mut spare_bufs: Vec<Vec<u8>> = Vec::new();
        loop {
            let pending = |s: &State| s.requested > s.durable || s.kicked || s.shutdown;
            let shutdown = {
                let mut s = self.state.lock();
                if !pending(&s) {
                    let timed_out = self.work.wait_for(&mut s, self.interval).timed_out();
                    if timed_out && !pending(&s) {
                        // A quiet interval: a commit of what may be buffered, and time to
                        // prepare the next segment.
                        drop(s);
                        if let Err(e) = writer.prepare_spare() {
                            self.stop(&e);
                            break;
                        }
                        s = self.state.lock();
                    }
                }
                s.kicked = false;
                s.shutdown
            };
            let t = self.clock.now();
            // Take every buffer (a thread's records are in stamp order; those stamped at or
            // after `t` go to `carry` for the next round).
            for cell in self.bufs.iter() {
                let mut b = cell.lock();
                if b.bytes.is_empty() {
                    continue;
                }
                let fresh = spare_bufs.pop().unwrap_or_default();
                taken.push(std::mem::replace(&mut b.bytes, fresh));
                b.kicked = false;
            }
            let mut recs: Vec<(u64, &[u8])> = Vec::new();
            let mut later: Vec<(u64, Vec<u8>)> = Vec::new();
            for (stamp, r) in &carry {
                match *stamp < t {
                    true => recs.push((*stamp, r)),
                    false => later.push((*stamp, r.clone())),
                }
            }
            for bytes in &taken {
                let mut at = 0;
                while at < bytes.len() {
                    let stamp = u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8"));
                    let len = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().expect("4"));
                    let r = &bytes[at + 12..at + 12 + len as usize];
                    match stamp < t {
                        true => recs.push((stamp, r)),
                        false => later.push((stamp, r.to_vec())),
                    }
                    at += 12 + len as usize;
                }
            }
            recs.sort_by_key(|&(stamp, _)| stamp);
            let slices: Vec<&[u8]> = recs.iter().map(|&(_, r)| r).collect();
            let written = match slices.is_empty() {
                true => Ok(()),
                false => writer.write(&slices).map(drop),
            };
            drop(slices);
            drop(recs);
            carry = later;
            for mut b in taken.drain(..) {
                b.clear();
                if b.capacity() <= 4 * WAKE_BYTES {
                    spare_bufs.push(b);
                }
            }
            match written {
                Ok(()) => {
                    let mut s = self.state.lock();
                    s.durable = s.durable.max(t);
                    self.done.notify_all();
                }
                Err(e) => {
                    self.stop(&e);
                    break;
                }
            }
            if shutdown && carry.is_empty() {
                break;
            }
        }
        self.running.store(false, Relaxed);
        self.done.notify_all();
    }

    /// Marks the committer as running (before its thread starts, so that an early `sync`
    /// waits for it).
    pub(crate) fn started(&self) {
        self.running.store(true, Relaxed);
    }

    /// Stops the store after a journal error (see the module doc).
    fn stop(&self, e: &StoreError) {
        let errno = match e {
            StoreError::Io { source, .. } => match source.raw_os_error() {
                Some(libc::ENOSPC) => Errno::ENOSPC,
                Some(libc::EDQUOT) => Errno::ENOSPC,
                _ => Errno::EIO,
            },
            _ => Errno::EIO,
        };
        eprintln!("lanefs: the store stopped: {e}");
        self.stopped.store(errno.0 as u32, Relaxed);
        let mut s = self.state.lock();
        s.error.get_or_insert(errno);
        self.done.notify_all();
    }

    /// Asks the committer to commit what is buffered and return.
    pub(crate) fn shutdown(&self) {
        self.state.lock().shutdown = true;
        self.work.notify_one();
    }

    /// The error that stopped the store, if one did.
    pub(crate) fn error(&self) -> Option<Errno> {
        self.state.lock().error
    }
}

/// Runs `log`'s committer on a thread of its own.
pub(crate) fn spawn(log: Arc<Log>, writer: Writer) -> std::thread::JoinHandle<()> {
    log.started();
    std::thread::Builder::new()
        .name("lanefs-commit".into())
        .spawn(move || log.run(writer))
        .expect("spawn the committer")
}
