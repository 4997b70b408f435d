//! Revocation grace periods: an entry change in a directory is never seen to land after a
//! change of the directory's attributes that it checked (a chmod, chown, chgrp, ACL change or
//! `chattr`) has returned, without a per-directory lock on the entry change's path.
//!
//! Linux checks `may_create` and `may_delete` (write and search permission, the immutable and
//! append-only flags, the sticky rule) under the directory's inode lock, which
//! `notify_change`, `set_posix_acl` and `vfs_fileattr_set` also take: an entry change that
//! passed its checks is visible before a chmod that takes the permission away returns. lanefs
//! has no such lock (creates of different names in one directory must not share a write), so
//! the rare *revoker* pays instead, with a grace period: after making its change it waits
//! until no entry change that may have checked the old attributes is still in flight.
//!
//! Each thread that makes entry changes owns a **lane**: one cache line of [`NBUCKETS`]
//! sequence numbers, one per bucket of directories (a hash of the inode number, salted per
//! filesystem). Only the lane's owner writes it, with plain stores; a lane is owned by one
//! thread at a time and handed to another thread only after its owner exits (the lanes are
//! a process-wide list that only grows, to the most threads that were ever alive at once). A
//! bucket's number is odd while the owner has an entry change in flight in a directory of
//! the bucket:
//!
//! ```text
//! entry change in D (`enter`, `Counted`)         revoker of D (`revoked`)
//!   E2 seq[bucket(D)] += 1: odd (Release store)    R1 change D's attributes (inside the
//!   E3 fence(SeqCst)                                  seqlock; every lock released before R2)
//!   E4 read D's attributes: the checks             R2 fence(SeqCst)
//!   E5 the change becomes visible (or a refusal)   R3 for each lane: read seq[bucket(D)]
//!   E6 seq[bucket(D)] += 1: even (Release store)      (Acquire); odd: wait until it changes
//!                                                  R4 return
//! ```
//!
//! **Claim**: an entry change whose checks (E4) read D's attributes from before R1 is visible
//! (E5) before the revoker returns (R4). The two fences are ordered in the single total
//! order S of SeqCst fences.
//! - If R2 precedes E3 in S: R1 happens before R2, so E4's loads, after E3, read R1's stores
//!   or later ones (C++20 \[atomics.order\]: a load that happens after a SeqCst fence Y
//!   cannot read a value coherence-ordered before a store that happens before a fence X
//!   preceding Y). The checks see the revoked attributes.
//! - If E3 precedes R2 in S: E2 happens before E3, so R3's loads of the lane's number (after
//!   R2) read E2's value or a later one, and so does its read of the list of lanes (the lane
//!   was published before E2). The lane's stores are its owners' alone, in program order
//!   (and, across a hand-over, ordered by the hand-over), and E2 and E6 are consecutive:
//!   so R3 reads E2's odd value, and waits until it reads E6's value or a later one, or reads
//!   such a value at once (an even one, or the odd one of a later entry change, which it
//!   waits out too). Every one of those stores is a Release store made after E5, so R3's
//!   Acquire load synchronizes with it: E5 happens before R4, and a lookup the revoker
//!   makes after it returns sees the change.
//!
//! The wait ends: R3 waits on a lane only until the entry change in flight when it looked
//! ends, and a counted entry change ends without any revoker: it waits only for stripes, map,
//! index and xattr shards and attribute seqlocks (held briefly, by operations that wait for
//! no revoker), for a removal's decision (`dir/life.rs`: removers wait only for creators),
//! and for the store. The revoker holds none of those locks while it waits, and no operation
//! revokes while it is counted. Directories that share a bucket share the wait, which only
//! makes it longer. The revoker writes nothing shared: its wait is a pass of loads over the
//! lanes.
//!
//! **What callers see is a serial order**: a revoker is ordered after every entry change
//! whose checks read the attributes before its change (each is visible before it returns),
//! and before every other (their checks saw its change, and decided on it).
//!
//! The entry change's cost: two plain stores to a line only its thread writes, and the one
//! fence Dekker's argument needs (on x86-64 a locked instruction on the stack).
//!
//! Entry changes: create, mknod, mkdir, symlink, link, unlink, rmdir, rename (counted in both
//! directories; once when they share a bucket). Revokers: a change of a directory's mode,
//! owner or group (`setattr`), its inode flags (`set_flags`), or its access or default ACL:
//! everything an entry change reads of its directory (the default ACL and the inherited flags
//! and group decide what a new inode gets). Not covered, as in Linux, which checks them
//! before it locks the victim: `may_delete`'s look at the victim (its flags, its owner for
//! the sticky rule), and the write permission a directory moving to another parent needs on
//! itself. An entry change made while its thread is already counted in the bucket (none
//! does so today) is covered by the outer count, which starts before it and ends after it.
//!
//! Only fences are SeqCst; the stores and loads are Relaxed, Acquire or Release, which is
//! what the argument needs and what loom models exactly. The model at the end of this file
//! runs the protocol on lanes it makes itself (the process-wide list of lanes is plain code
//! around it) under every interleaving with up to two preemptions
//! (`RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release -p lanefs --lib
//! revoke::`).

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64};

use crossbeam_utils::CachePadded;

use crate::sync::{AtomicU32, fence, wait_round};

/// Buckets of directories per lane: a lane fills one cache line.
pub(crate) const NBUCKETS: usize = 16;

/// One thread's sequence numbers, one per bucket (see the module doc).
pub(crate) struct Lane(CachePadded<[AtomicU32; NBUCKETS]>);

impl Lane {
    pub fn new() -> Self {
        Lane(CachePadded::new(std::array::from_fn(|_| AtomicU32::new(0))))
    }

    /// E2 and E3 by the lane's owner: counts an entry change in buckets `a` and `b` (the
    /// same twice counts once; a bucket already counted, by an entry change this one is
    /// nested in, is left to that one).
    #[inline]
    pub fn enter(&self, a: usize, b: Option<usize>) -> Counted<'_> {
        self.enter_leased(a, b, None)
    }

    /// [`Lane::enter`], on a lane taken for this change alone (`lease`), given back after it.
    #[inline]
    fn enter_leased(
        &self,
        a: usize,
        b: Option<usize>,
        lease: Option<&'static Node>,
    ) -> Counted<'_> {
        let count = |b: usize| {
            let seq = &self.0[b];
            let s = seq.load(Relaxed); // the owner's own last store
            if s & 1 != 0 {
                return None;
            }
            seq.store(s.wrapping_add(1), Release); // E2
            Some(b as u8)
        };
        let held = [count(a), b.filter(|&b| b != a).and_then(count)];
        fence(SeqCst); // E3
        Counted {
            lane: self,
            held,
            lease,
        }
    }

    /// R3 on this lane, for bucket `b`: returns once the entry change in flight (if any)
    /// when it looked has ended.
    fn wait_out(&self, b: usize) {
        let seq = &self.0[b];
        let s = seq.load(Acquire);
        let mut round = 0;
        while s & 1 != 0 && seq.load(Acquire) == s {
            wait_round(round);
            round += 1;
        }
    }
}

/// R2 and R3, by a revoker, after its change of the attributes of a directory of bucket `b`
/// (R1), holding no lock, over `lanes` (every lane, read after the fence).
fn wait_for<'a, I: Iterator<Item = &'a Lane>>(lanes: impl FnOnce() -> I, b: usize) {
    fence(SeqCst); // R2
    for lane in lanes() {
        lane.wait_out(b);
    }
}

/// An entry change counted in one or two buckets of its thread's lane: uncounted (E6) when
/// dropped, which the holder does once its change is visible or refused.
#[must_use = "the entry change is uncounted when this is dropped"]
pub(crate) struct Counted<'a> {
    lane: &'a Lane,
    held: [Option<u8>; 2],
    /// A lane taken for this one change (by a thread whose own is gone: it is exiting), given
    /// back after E6.
    lease: Option<&'static Node>,
}

impl Drop for Counted<'_> {
    #[inline]
    fn drop(&mut self) {
        for &b in self.held.iter().flatten() {
            let seq = &self.lane.0[b as usize];
            // E6: Release, so that a revoker reading it (or any later store) sees the change.
            seq.store(seq.load(Relaxed).wrapping_add(1), Release);
        }
        if let Some(n) = self.lease {
            n.give();
        }
    }
}

// ----- the process-wide list of lanes ------------------------------------------------------

/// A lane in the list. Nodes are leaked: never freed, so a pointer read from the list is
/// valid for the life of the process.
pub(crate) struct Node {
    lane: Lane,
    /// Owned by a thread (or by one entry change of an exiting thread).
    taken: AtomicBool,
    /// The next node; set before the node is published, never changed after.
    next: *const Node,
}

// SAFETY: `next` is written only before the node is published (then read-only), and points
// to a leaked node, itself Sync; everything else is atomics.
unsafe impl Sync for Node {}

/// The newest node; each links to the one published before it.
static LANES: AtomicPtr<Node> = AtomicPtr::new(std::ptr::null_mut());

/// Every lane ever made (the list read with Acquire: a node's lane and link are complete).
fn nodes() -> impl Iterator<Item = &'static Node> {
    let mut p = LANES.load(Acquire).cast_const();
    std::iter::from_fn(move || {
        // SAFETY: nodes are leaked, never freed, and published complete (Release CAS).
        let n = unsafe { p.as_ref() }?;
        p = n.next;
        Some(n)
    })
}

impl Node {
    /// A free lane, or a new one: owned by the caller until [`Node::give`].
    fn take() -> &'static Node {
        if let Some(n) = nodes().find(|n| {
            n.taken
                .compare_exchange(false, true, Acquire, Relaxed)
                .is_ok()
        }) {
            return n;
        }
        let n = Box::leak(Box::new(Node {
            lane: Lane::new(),
            taken: AtomicBool::new(true),
            next: std::ptr::null(),
        }));
        let mut head = LANES.load(Relaxed);
        loop {
            n.next = head;
            match LANES.compare_exchange_weak(head, n, Release, Relaxed) {
                Ok(_) => return n,
                Err(h) => head = h,
            }
        }
    }

    /// Gives the lane back (its numbers are all even: no entry change in flight).
    fn give(&self) {
        // Release: the next owner's stores come after ours.
        self.taken.store(false, Release);
    }
}

/// The calling thread's lane, given back when it exits.
struct Lease(&'static Node);

impl Drop for Lease {
    fn drop(&mut self) {
        self.0.give();
    }
}

thread_local! {
    static LEASE: Lease = Lease(Node::take());
}

/// A filesystem's side of the protocol: the salt of its buckets.
pub(crate) struct Revocations {
    salt: u64,
}

/// The bucket of directory `key` (an inode number) in a filesystem salted with `salt`.
#[inline]
fn bucket(salt: u64, key: u64) -> usize {
    ((key ^ salt).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 60) as usize
}

impl Revocations {
    pub fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        Revocations {
            salt: NEXT
                .fetch_add(1, Relaxed)
                .wrapping_mul(0xD1B5_4A32_D192_ED03),
        }
    }

    /// Counts an entry change by the calling thread in directory `a`, and in `b` too (a
    /// rename's other directory), before the caller reads their attributes.
    #[inline]
    pub fn enter(&self, a: u64, b: Option<u64>) -> Counted<'static> {
        let (a, b) = (bucket(self.salt, a), b.map(|b| bucket(self.salt, b)));
        match LEASE.try_with(|l| l.0) {
            Ok(n) => n.lane.enter(a, b),
            Err(_) => {
                // The thread is exiting and its lane is gone: a lane for this change alone.
                let n = Node::take();
                n.lane.enter_leased(a, b, Some(n))
            }
        }
    }

    /// Called by a revoker after its change of directory `key`'s attributes, holding no
    /// lock: returns once every entry change in the directory that may have read the
    /// attributes from before the change is visible.
    pub fn revoked(&self, key: u64) {
        wait_for(|| nodes().map(|n| &n.lane), bucket(self.salt, key));
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_revoker_waits_for_a_counted_change_and_not_for_others() {
        let r = Revocations::new();
        let c = r.enter(10, Some(11));
        // Another bucket: no wait.
        let other = (100..).find(|&k| {
            bucket(r.salt, k) != bucket(r.salt, 10) && bucket(r.salt, k) != bucket(r.salt, 11)
        });
        r.revoked(other.unwrap());
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                r.revoked(11);
                done.store(true, SeqCst);
            });
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert!(!done.load(SeqCst), "returned while a change was in flight");
            drop(c);
        });
        assert!(done.load(SeqCst));
    }

    #[test]
    fn nested_and_repeated_counts_leave_every_number_even() {
        let r = Revocations::new();
        let outer = r.enter(5, Some(5));
        let inner = r.enter(5, None);
        assert_eq!(inner.held, [None, None], "covered by the outer count");
        drop(inner);
        drop(outer);
        let lane = LEASE.with(|l| l.0);
        assert!(lane.lane.0.iter().all(|s| s.load(Relaxed) & 1 == 0));
    }

    /// A revoker finishes while threads keep entering and leaving the same bucket, and
    /// lanes of exited threads are reused.
    #[test]
    fn a_revoker_is_not_starved_by_a_stream_of_entry_changes() {
        let r = Revocations::new();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            for _ in 0..2 {
                let (r, stop) = (&r, &stop);
                s.spawn(move || {
                    while !stop.load(Relaxed) {
                        let c = r.enter(7, None);
                        std::hint::black_box(&c);
                        drop(c);
                    }
                });
            }
            for _ in 0..1000 {
                r.revoked(7);
            }
            stop.store(true, Relaxed);
        });
        let before = nodes().count();
        for _ in 0..4 {
            std::thread::spawn(|| drop(Revocations::new().enter(1, None)))
                .join()
                .unwrap();
        }
        assert!(
            nodes().count() <= before + 1,
            "exited threads' lanes are reused"
        );
    }
}

#[cfg(all(test, loom))]
mod loom_model {
    //! The protocol under loom: entry changes and revokers of one bucket on lanes made here,
    //! every interleaving with up to two preemptions, with the claim of the module doc as the
    //! assertion: an entry change that passed its check is visible when the revoker that took
    //! the permission away returns.

    use super::*;
    use loom::sync::Arc;

    const B: usize = 3;

    /// A directory as the protocol sees it: its "attributes" (1: the caller may add entries,
    /// 0: revoked), stored and loaded with the seqlock's orderings, and how many entry
    /// changes landed.
    struct Dir {
        writable: AtomicU32,
        landed: AtomicU32,
    }

    impl Dir {
        fn new() -> Dir {
            Dir {
                writable: AtomicU32::new(1),
                landed: AtomicU32::new(0),
            }
        }
    }

    /// An entry change on `lane`: true if it passed its check (and landed).
    fn change(lane: &Lane, d: &Dir) -> bool {
        let counted = lane.enter(B, None);
        let ok = d.writable.load(Acquire) == 1; // E4
        if ok {
            d.landed.fetch_add(1, Release); // E5
        }
        drop(counted);
        ok
    }

    /// A revoker over `lanes`: takes the permission away, waits, and returns how many entry
    /// changes it saw.
    fn revoke(lanes: &[Arc<Lane>], d: &Dir) -> u32 {
        d.writable.store(0, Release); // R1
        wait_for(|| lanes.iter().map(|l| &**l), B);
        d.landed.load(Acquire)
    }

    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(2);
        b.max_branches = 100_000;
        b.check(f);
    }

    #[test]
    fn a_change_that_passed_its_check_is_seen_when_the_revoker_returns() {
        model(|| {
            let lanes = [Arc::new(Lane::new())];
            let d = Arc::new(Dir::new());
            let (l, d2) = (lanes[0].clone(), d.clone());
            let t = loom::thread::spawn(move || change(&l, &d2));
            let seen = revoke(&lanes, &d);
            let landed = t.join().unwrap();
            assert!(!landed || seen == 1, "landed after the revocation returned");
        });
    }

    /// The lane's owner makes a second entry change right after the first: the revoker may
    /// read the second one's odd number, and still sees the first.
    #[test]
    fn back_to_back_changes_on_one_lane_are_each_waited_for() {
        model(|| {
            let lanes = [Arc::new(Lane::new())];
            let d = Arc::new(Dir::new());
            let (l, d2) = (lanes[0].clone(), d.clone());
            let t = loom::thread::spawn(move || change(&l, &d2) as u32 + change(&l, &d2) as u32);
            let seen = revoke(&lanes, &d);
            let landed = t.join().unwrap();
            assert!(seen >= landed, "landed after the revocation returned");
        });
    }

    /// Two lanes, one entry change on each: both are waited for.
    #[test]
    fn every_lane_is_waited_for() {
        model(|| {
            let lanes = [Arc::new(Lane::new()), Arc::new(Lane::new())];
            let d = Arc::new(Dir::new());
            let ts: Vec<_> = lanes
                .iter()
                .map(|l| {
                    let (l, d2) = (l.clone(), d.clone());
                    loom::thread::spawn(move || change(&l, &d2) as u32)
                })
                .collect();
            let seen = revoke(&lanes, &d);
            let landed: u32 = ts.into_iter().map(|t| t.join().unwrap()).sum();
            assert!(seen >= landed, "landed after the revocation returned");
        });
    }
}
