//! Telling an outside cache what a library caller changed.
//!
//! When lanefs is mounted, the kernel caches names, attributes and file pages for as long as
//! the mount's timeouts allow. Changes that come through the mount keep those caches right by
//! themselves (the kernel updates what it changed). A program that embeds lanefs and also
//! changes the tree through this library while it is mounted needs the kernel told: the FUSE
//! server installs an [`Invalidate`] sink, and every successful mutation made by a library
//! caller ([`Via::Library`], anyone but the kernel) reports the names and inodes it changed to
//! it, and the directories whose listing changed without a name in them changing (a directory
//! moved to another parent lists another `..`).
//!
//! A report is made after the operation has released every engine lock, including the
//! `coarse` one: the kernel's handling of an invalidation may wait for requests in flight in
//! the same directory, and those requests may need engine locks. The sink is called on the
//! caller's thread, so when the call returns the kernel has dropped the stale entries.
//!
//! **Inodes on their way into the kernel.** An invalidation finds nothing for an inode the
//! kernel does not hold yet. But a LOOKUP or READDIRPLUS that read the inode's attributes
//! before the change may have answered already, and the kernel, handling that answer after
//! the invalidation, would keep the old attributes for the whole timeout. So the engine
//! counts the lookup references a kernel caller takes, per inode ([`KernelHeld`]), apart
//! from open handles: taken before the attributes the answer carries are read, dropped by
//! FORGET. When an invalidation of an inode's attributes finds nothing while that count is
//! above 0, the kernel is about to hold the inode (or has just let it go and its FORGET is
//! on the way): the report tries again, after 50 µs and then at doubling intervals up to
//! 1 ms, until the invalidation lands or the count drops to 0, for at most [`SETTLE`]. It
//! waits parked on the inode's count, and the FORGET that takes the count to 0 wakes it at
//! once: the common case, an inode the kernel has just evicted (a library caller's unlink or
//! rename of a name the kernel had looked up), costs the FORGET's latency, not a sleep; and
//! a FUSE transport that holds FORGETs back to batch them reads on at once while a report
//! waits ([`crate::Filesystem::forget_pause`]). If
//! the count read after the change is 0, any lookup that takes a reference later reads the
//! attributes after the change.
//!
//! The wait ends when the kernel's caller is scheduled and applies its answer, which on a
//! loaded machine can take many milliseconds (100 ms is not always enough with 60 threads
//! on 2 CPUs). A report that still finds nothing after [`SETTLE`]
//! gives up, is counted ([`crate::Filesystem::invalidations_given_up`]) and said once on
//! stderr: the kernel may then keep the old attributes for the mount's attribute timeout.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering, fence};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::RwLock;

use crate::{Ctx, Ino, Via};

/// How long a report waits at most for the kernel to take an inode it is being handed (see
/// the module doc).
pub const SETTLE: Duration = Duration::from_secs(1);

/// Receives invalidations. Implementations must not call back into the filesystem.
///
/// `entry`, `inode` and `listing` return whether the cache held the inode whose attributes
/// they drop (`parent`, `ino`, `dir`): false only when it held nothing of it (the kernel
/// answers ENOENT), which the engine may follow with [`Invalidate::inode`] calls of the same
/// inode (module doc, "Inodes on their way into the kernel").
pub trait Invalidate: Send + Sync {
    /// The name `name` in directory `parent` was created, removed or now names another inode
    /// (the directory's own attributes changed with it).
    fn entry(&self, parent: Ino, name: &[u8]) -> bool;
    /// The name `name` in directory `parent` was made (by a create, `mknod`, `mkdir`,
    /// `symlink` or `link`; an `open` with `O_CREAT` that found the name reports it too): a
    /// cache that can tell it holds nothing under the name (no entry saying it is absent)
    /// and no listing of `parent` may drop `parent`'s attributes only. By default, as
    /// [`Invalidate::entry`].
    fn new_entry(&self, parent: Ino, name: &[u8]) -> bool {
        self.entry(parent, name)
    }
    /// Whether the cache may hold, or be about to get, an entry or a listing of directory
    /// `dir` that a removal just made there has to drop, apart from an entry of the removed
    /// inode itself (which the engine tells from its kernel-held count, read after this).
    /// Asked after the removal. A cache that cannot tell says true (the default); false
    /// lets the report drop `dir`'s attributes alone ([`Invalidate::removed_unseen`]).
    fn may_see_removal(&self, dir: Ino) -> bool {
        let _ = dir;
        true
    }
    /// A library caller is about to remove `name` from `parent` (an unlink, an rmdir, a
    /// rename of it away or over it); [`Invalidate::removal_reported`] follows once the
    /// change was reported, or failed. Until then the cache may still hold the name's old
    /// entry, which a report of a new name made there meanwhile must not take as absent.
    fn removing(&self, parent: Ino, name: &[u8]) {
        let _ = (parent, name);
    }
    /// The removal [`Invalidate::removing`] announced was reported (or failed).
    fn removal_reported(&self, parent: Ino, name: &[u8]) {
        let _ = (parent, name);
    }
    /// Whether a name just made (or renamed to) in `dir` may have something the cache holds
    /// under it (an entry saying it is absent): asked, after the change, only for a rename
    /// whose report may then drop the directories' attributes alone. Takes out what it
    /// found. By default true.
    fn may_hold_new_name(&self, dir: Ino, name: &[u8]) -> bool {
        let _ = (dir, name);
        true
    }
    /// A name in `dir` was removed, and the cache held nothing of it
    /// ([`Invalidate::may_see_removal`] false, and no lookup reference on the inode it named):
    /// only `dir`'s attributes changed. By default, as [`Invalidate::inode`] of `dir`.
    fn removed_unseen(&self, dir: Ino) -> bool {
        self.inode(dir, None)
    }
    /// The attributes of `ino` changed; `data` is `Some((offset, len))` when the file's
    /// contents in that byte range changed too (`len` 0: to the end of the file).
    fn inode(&self, ino: Ino, data: Option<(u64, u64)>) -> bool;
    /// What a read of directory `dir` returns changed without a name in `dir` changing: its
    /// `..` names another directory (it was moved to another parent). Every name created,
    /// removed or replaced in `dir` is reported by [`Invalidate::entry`] instead, which a
    /// cache of `dir`'s listing must take as a change of that listing too.
    fn listing(&self, dir: Ino) -> bool;
    /// A hint, not a report of a change: the bounded inode cache (`fs/lazy.rs`, "Eviction")
    /// would have the cache let go of the inodes `inos` (files, then directories), which it
    /// holds by a lookup, so that they can be evicted (a directory with its entries). A cache that
    /// drops what nothing of its own uses, and tells the filesystem (FUSE's FORGET), does,
    /// and says true; by default nothing is done (false). Called with no engine lock held.
    fn prune(&self, inos: &[Ino]) -> bool {
        let _ = inos;
        false
    }
}

/// Inode numbers per [`KernelHeld`] chunk.
const HELD_CHUNK: usize = 1 << 16;

/// The counts of [`HELD_CHUNK`] inode numbers, made at the first count among them.
type Chunk = OnceLock<Box<[AtomicU32]>>;

/// Lookup references kernel callers hold, per inode number (the FUSE node id): counted
/// apart from the inode's own reference count, which open handles share. One atomic counter
/// per inode number, in chunks of 256 KiB made on first use (the first counts in a new chunk
/// wait for it to be made; after that no lock is taken). A count stays below the inode's
/// own references, which are capped. Cleared when a mount installs or removes its sink
/// ([`Watch::set`]).
///
/// Ordering: a kernel caller counts its reference, then a SeqCst fence, then reads the
/// attributes its answer carries; a report makes its change, then a SeqCst fence, then reads
/// the count. By the fences, either the report sees the count, or the caller reads the
/// attributes after the change.
#[derive(Default)]
pub(crate) struct KernelHeld {
    /// Made at the first count (a filesystem never mounted has none).
    chunks: OnceLock<Box<[Chunk]>>,
    /// Reports parked on a count ([`KernelHeld::wait_for_zero`]): a FORGET that takes a count
    /// to 0 wakes them only while this is above 0, so that FORGETs pay nothing while no
    /// report waits.
    parked: AtomicU32,
}

impl KernelHeld {
    fn count(&self, ino: Ino, make: bool) -> Option<&AtomicU32> {
        let i = ino.get() as usize;
        let chunks = if make {
            self.chunks.get_or_init(|| {
                let n = (crate::id::MAX_INO as usize + 1).div_ceil(HELD_CHUNK);
                (0..n).map(|_| OnceLock::new()).collect()
            })
        } else {
            self.chunks.get()?
        };
        let chunk = chunks.get(i / HELD_CHUNK)?;
        let c = if make {
            chunk.get_or_init(|| (0..HELD_CHUNK).map(|_| AtomicU32::new(0)).collect())
        } else {
            chunk.get()?
        };
        Some(&c[i % HELD_CHUNK])
    }

    /// A kernel caller took a lookup reference on `ino` (followed by a SeqCst fence).
    pub(crate) fn add(&self, ino: Ino) {
        if let Some(c) = self.count(ino, true) {
            c.fetch_add(1, Ordering::SeqCst);
        }
        fence(Ordering::SeqCst);
    }

    /// Kernel callers dropped `n` lookup references on `ino` (or never took them).
    pub(crate) fn sub(&self, ino: Ino, n: u64) {
        if let Some(c) = self.count(ino, false) {
            let n = u32::try_from(n).unwrap_or(u32::MAX);
            let was = c
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                    Some(v.saturating_sub(n))
                })
                .unwrap_or(0);
            // A report parked on this count while it was above 0 raised `parked` first (both
            // SeqCst): if it saw the count above 0, this load sees it parked.
            if was > 0 && was <= n && self.parked.load(Ordering::SeqCst) > 0 {
                // SAFETY: `unpark_all` only wakes threads parked on the key (the count's
                // address, used as a key by `wait_for_zero` alone) and has no requirement
                // of its own.
                unsafe {
                    parking_lot_core::unpark_all(
                        std::ptr::from_ref(c) as usize,
                        parking_lot_core::DEFAULT_UNPARK_TOKEN,
                    );
                }
            }
        }
    }

    /// Waits until `ino`'s count is 0 or `until` passes, whichever comes first.
    fn wait_for_zero(&self, ino: Ino, until: Instant) {
        let Some(c) = self.count(ino, false) else {
            return;
        };
        self.parked.fetch_add(1, Ordering::SeqCst);
        // A FORGET reader pausing to batch FORGETs ([`KernelHeld::forget_pause`]) reads on
        // at once: this report waits for one.
        // SAFETY: `unpark_all` only wakes threads parked on the key (`parked`'s address,
        // used as a key by `forget_pause` alone) and has no requirement of its own.
        unsafe {
            parking_lot_core::unpark_all(
                std::ptr::from_ref(&self.parked) as usize,
                parking_lot_core::DEFAULT_UNPARK_TOKEN,
            );
        }
        // SAFETY: the key is the count's address, which lives as long as the filesystem
        // (chunks are never freed) and which only `sub` unparks; the validate closure only
        // loads an atomic, and neither closure parks, unparks or panics.
        unsafe {
            parking_lot_core::park(
                std::ptr::from_ref(c) as usize,
                || c.load(Ordering::SeqCst) > 0,
                || {},
                |_, _| {},
                parking_lot_core::DEFAULT_PARK_TOKEN,
                Some(until),
            );
        }
        self.parked.fetch_sub(1, Ordering::SeqCst);
    }

    /// Waits until `until`, or less while a report waits for a FORGET: a FORGET reader
    /// pauses here between reads so that the kernel's FORGETs queue up and come as one
    /// BATCH_FORGET, but not while that delays a report ([`KernelHeld::wait_for_zero`]).
    pub(crate) fn forget_pause(&self, until: Instant) {
        // SAFETY: the key is `parked`'s address, which lives as long as `self` and which
        // only `wait_for_zero` unparks; the validate closure only loads an atomic, and
        // neither closure parks, unparks or panics.
        unsafe {
            parking_lot_core::park(
                std::ptr::from_ref(&self.parked) as usize,
                || self.parked.load(Ordering::SeqCst) == 0,
                || {},
                |_, _| {},
                parking_lot_core::DEFAULT_PARK_TOKEN,
                Some(until),
            );
        }
    }

    /// Forgets every count: the kernel sends no FORGET when it unmounts, so counts of the
    /// mount that ended would stay above 0.
    pub(crate) fn clear(&self) {
        for chunk in self.chunks.get().into_iter().flatten() {
            for c in chunk.get().into_iter().flatten() {
                c.store(0, Ordering::SeqCst);
            }
        }
    }

    /// The lookup references kernel callers hold on `ino` (never more than the inode's own
    /// reference count holds for them: a lookup counts here after it took its reference, a
    /// FORGET uncounts here before it drops it; and counts cleared by [`KernelHeld::clear`]
    /// only err low).
    pub(crate) fn get(&self, ino: Ino) -> u64 {
        self.count(ino, false)
            .map_or(0, |c| u64::from(c.load(Ordering::SeqCst)))
    }

    /// Whether a kernel caller holds a lookup reference on `ino` (after a SeqCst fence).
    pub(crate) fn holds(&self, ino: Ino) -> bool {
        fence(Ordering::SeqCst);
        self.count(ino, false)
            .is_some_and(|c| c.load(Ordering::SeqCst) > 0)
    }
}

/// The installed sink, with its attribute invalidations tried again while the kernel is
/// being handed the inode (module doc).
pub(crate) struct Settled<'a> {
    pub(crate) sink: &'a dyn Invalidate,
    /// Its kernel-held counts and count of reports that gave up.
    pub(crate) watch: &'a Watch,
}

impl Settled<'_> {
    /// Whether `found` (the first invalidation's answer) or a later try landed.
    fn settle(&self, ino: Ino, found: bool) -> bool {
        if found {
            return true;
        }
        let deadline = Instant::now() + SETTLE;
        let mut pause = Duration::from_micros(50);
        while self.watch.held.holds(ino) {
            if Instant::now() >= deadline {
                if self.watch.given_up.fetch_add(1, Ordering::Relaxed) == 0 {
                    eprintln!(
                        "lanefs: the kernel did not take inode {} within {SETTLE:?} of a \
                         library change to it; it may show the old attributes until its \
                         attribute timeout (counted from now on in invalidations_given_up)",
                        ino.get()
                    );
                }
                return false;
            }
            self.watch
                .held
                .wait_for_zero(ino, (Instant::now() + pause).min(deadline));
            pause = (pause * 2).min(Duration::from_millis(1));
            if self.sink.inode(ino, None) {
                return true;
            }
        }
        false
    }
}

impl Invalidate for Settled<'_> {
    fn entry(&self, parent: Ino, name: &[u8]) -> bool {
        let found = self.sink.entry(parent, name);
        self.settle(parent, found)
    }

    fn new_entry(&self, parent: Ino, name: &[u8]) -> bool {
        let found = self.sink.new_entry(parent, name);
        self.settle(parent, found)
    }

    fn may_see_removal(&self, dir: Ino) -> bool {
        self.sink.may_see_removal(dir)
    }

    fn removing(&self, parent: Ino, name: &[u8]) {
        self.sink.removing(parent, name)
    }

    fn removal_reported(&self, parent: Ino, name: &[u8]) {
        self.sink.removal_reported(parent, name)
    }

    fn may_hold_new_name(&self, dir: Ino, name: &[u8]) -> bool {
        self.sink.may_hold_new_name(dir, name)
    }

    fn removed_unseen(&self, dir: Ino) -> bool {
        let found = self.sink.removed_unseen(dir);
        self.settle(dir, found)
    }

    fn inode(&self, ino: Ino, data: Option<(u64, u64)>) -> bool {
        let found = self.sink.inode(ino, data);
        self.settle(ino, found)
    }

    fn listing(&self, dir: Ino) -> bool {
        let found = self.sink.listing(dir);
        self.settle(dir, found)
    }

    fn prune(&self, inos: &[Ino]) -> bool {
        self.sink.prune(inos)
    }
}

/// The installed sink. The flag keeps the common case (nothing installed, or a kernel caller)
/// to one read of a line that is never written on a hot path; the lock is taken only to report
/// a library-side change while a sink is installed, and is a leaf (see [`crate::locking`]).
#[derive(Default)]
pub(crate) struct Watch {
    on: AtomicBool,
    sink: RwLock<Option<Arc<dyn Invalidate>>>,
    /// Kernel callers' lookup references, per inode (module doc).
    pub(crate) held: KernelHeld,
    /// Reports whose invalidation gave up waiting for the kernel (module doc).
    pub(crate) given_up: AtomicU64,
}

impl Watch {
    /// Installs or removes the sink. Either way the kernel-held counts start afresh: a mount
    /// begins with the kernel holding nothing, and an unmount sends no FORGET.
    pub(crate) fn set(&self, sink: Option<Arc<dyn Invalidate>>) {
        let mut s = self.sink.write();
        self.on.store(sink.is_some(), Ordering::Release);
        *s = sink;
        self.held.clear();
    }

    /// The sink to report `ctx`'s changes to, if any.
    #[inline]
    pub(crate) fn sink(&self, ctx: &Ctx) -> Option<Arc<dyn Invalidate>> {
        if ctx.via == Via::Kernel || !self.on.load(Ordering::Acquire) {
            return None;
        }
        self.sink.read().clone()
    }

    /// The installed sink, whoever asks (the kernel's cache, asked whether it still holds an
    /// inode: `fs/unlinked.rs`).
    pub(crate) fn installed(&self) -> Option<Arc<dyn Invalidate>> {
        if !self.on.load(Ordering::Acquire) {
            return None;
        }
        self.sink.read().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// Runs `f` on a thread and fails if it has not returned within a minute: the waits
    /// under test end on an event, and their own deadlines are an hour away.
    fn returns(f: impl FnOnce() + Send + 'static) -> mpsc::Receiver<()> {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            f();
            let _ = tx.send(());
        });
        rx
    }

    fn hour() -> Instant {
        Instant::now() + Duration::from_secs(3600)
    }

    #[test]
    fn the_forget_that_takes_a_count_to_zero_wakes_a_report() {
        let held = Arc::new(KernelHeld::default());
        let ino = Ino(77);
        held.add(ino);
        held.add(ino);
        let h = held.clone();
        let report = returns(move || h.wait_for_zero(ino, hour()));
        held.sub(ino, 1);
        // One reference is left: the report is still waiting (or not yet parked).
        assert_eq!(held.get(ino), 1);
        held.sub(ino, 1);
        report
            .recv_timeout(Duration::from_secs(60))
            .expect("the report was not woken when the count reached 0");
        assert!(!held.holds(ino));
    }

    #[test]
    fn a_waiting_report_cuts_the_forget_pause_short() {
        let held = Arc::new(KernelHeld::default());
        let ino = Ino(78);
        held.add(ino);
        let h = held.clone();
        let report = returns(move || h.wait_for_zero(ino, hour()));
        // Whether the pause starts before the report parks (the report wakes it) or after
        // (it sees the report waiting), it ends while the report waits.
        let h = held.clone();
        returns(move || h.forget_pause(hour()))
            .recv_timeout(Duration::from_secs(60))
            .expect("the FORGET pause went on while a report waited for a FORGET");
        held.sub(ino, 1);
        report
            .recv_timeout(Duration::from_secs(60))
            .expect("the report was not woken when the count reached 0");
    }
}
