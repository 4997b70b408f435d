//! A directory's life, and the protocol that keeps entries out of removed directories
//! without a per-directory lock.
//!
//! A create in directory D holds the stripe of `(D, name)`; an rmdir of D (or a rename over
//! it) holds the stripe of D's own name: two different locks. They exclude each other
//! through D's life word and D's entry counts, as in Dekker's algorithm, with one SeqCst
//! fence on each side:
//!
//! ```text
//! creator (`admit`)                         remover (`decide`)
//!   C1 register this slot's run in D          R1 life: ALIVE -> DYING
//!      (once per slot; an RMW)                R2 fence(SeqCst)
//!   C2 count the entry in the run             R3 look at D's entries: their counts, then,
//!   C3 fence(SeqCst)                             if some are counted, whether one is visible
//!   C4 read life                              R4 none counted: commit; the caller removes
//!      DYING: wait until it changes              D's name, then life -> DEAD (`Removal`)
//!      DEAD:  uncount the entry, ENOENT          one visible: life -> ALIVE (ENOTEMPTY)
//!      ALIVE: the entry may become visible       only some being published: life -> ALIVE,
//!                                                wait until they are out, start again at R1
//! ```
//!
//! **Claim**: no entry becomes visible in a DEAD directory, and a remover never finds a
//! directory empty while an entry in it is admitted. The two fences are ordered in the single
//! total order S of SeqCst fences.
//! - If C3 precedes R2 in S: C1 and C2 happen before C3, so R3 (after R2) reads them or later
//!   values (C++20 \[atomics.order\]: a read that happens after a SeqCst fence Y cannot read a
//!   value coherence-ordered before a write that happens before a fence X preceding Y). This
//!   holds even when C1 was made by another thread of the same slot: that registration
//!   happens before our C2 through the index-shard lock both take. So R3 counts the entry
//!   and the remover does not remove the directory in this round.
//! - If R2 precedes C3 in S: by the same rule C4 reads DYING or a later value. The creator
//!   waits for R4 and admits on ALIVE (the removal failed or starts again; it may have
//!   counted this very entry) or backs out on DEAD (the removal succeeded without it).
//!
//! A creator that read ALIVE at C4 is therefore ordered before every removal that could miss
//! it, and its entry stays counted until it is removed, so every later removal sees it. The
//! window from R1 to R4 takes no lock a creator could hold (the stripes of D's entries are
//! not the stripe of D's own name; see `locking.rs`), so a waiting creator always sees R4.
//!
//! **What callers see is a serial order.** Two more rules make the outcomes linearizable,
//! not only safe:
//! - *ENOTEMPTY means an entry was visible.* An entry is counted (C2) before it is visible
//!   (revealed in the dirent map), so counts alone would let a removal fail on an entry
//!   nobody can see yet, and a listing made after that failure find the directory empty.
//!   R3 therefore answers ENOTEMPTY only when it finds a counted entry that is visible
//!   ([`Found::Visible`]); when every counted entry is still being published
//!   ([`Found::OnlyPending`]: their creators are between admission and reveal, backing out,
//!   or waiting at C4 for this very removal), it declares the directory alive again, waits
//!   without deciding until a look finds an entry visible or none counted, and starts again
//!   at R1. The creators it waits for hold no lock it holds and wait for nothing it does
//!   once the directory is alive, so the wait ends.
//! - *ENOENT means the name is gone.* A creator told ENOENT must not find the directory by
//!   its name afterwards. So a successful decision leaves the directory DYING (creators in
//!   it keep waiting) while the caller takes its name out of the dirent map; only then does
//!   [`Removal`] declare it DEAD and let the waiting creators fail.
//!
//! Only fences are SeqCst; the RMWs and loads are AcqRel/Acquire/Relaxed. That is all the
//! argument needs, and it is what loom models exactly (loom treats SeqCst loads and stores as
//! AcqRel but implements SeqCst fences): the model at the end of this file runs the protocol
//! under every interleaving with up to two preemptions (`RUSTFLAGS="--cfg loom"
//! CARGO_TARGET_DIR=target/loom cargo test --release -p lanefs --lib dir::life`; CI runs it),
//! with both rules above among its assertions.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};

use crate::errno::{Errno, Result};
use crate::sync::{AtomicU8, fence, wait_round};

const ALIVE: u8 = 0;
const DYING: u8 = 1;
const DEAD: u8 = 2;

/// A directory's life: ALIVE, DYING (a remover is deciding), DEAD. Changed only by the named
/// transitions below, each asserting the state it leaves. DEAD is final.
pub(crate) struct DirLife(AtomicU8);

impl DirLife {
    pub fn new() -> Self {
        DirLife(AtomicU8::new(ALIVE))
    }

    /// Whether the directory was removed.
    #[inline]
    pub fn is_dead(&self) -> bool {
        self.0.load(Acquire) == DEAD
    }

    /// R1: a remover starts deciding. The caller holds the stripe of the directory's own
    /// name, which every remover of this directory takes, so no two deciders overlap.
    fn begin_deciding(&self) {
        let prev = self.0.swap(DYING, Relaxed);
        assert_eq!(
            prev, ALIVE,
            "two removers deciding at once, or a removed directory"
        );
    }

    /// R4: the decision, seen by waiting creators.
    fn settle(&self, dead: bool) {
        let prev = self.0.swap(if dead { DEAD } else { ALIVE }, Release);
        assert_eq!(prev, DYING, "settling a directory nobody was deciding");
    }

    /// C4: whether an entry counted before the caller's fence may become visible; waits
    /// while a remover decides.
    fn admits(&self) -> bool {
        let mut round = 0;
        loop {
            match self.0.load(Acquire) {
                ALIVE => return true,
                DEAD => return false,
                _ => {
                    wait_round(round);
                    round += 1;
                }
            }
        }
    }
}

/// The creating half. `count` makes the new entry visible to the remover's count (C1 and
/// C2); `uncount` takes it back. Returns whether the entry may be published; on ENOENT it has
/// been uncounted.
pub(crate) fn admit<T>(
    life: &DirLife,
    count: impl FnOnce() -> T,
    uncount: impl FnOnce(T),
) -> Result<T> {
    let counted = count();
    fence(SeqCst); // C3
    if life.admits() {
        Ok(counted)
    } else {
        uncount(counted);
        Err(Errno::ENOENT)
    }
}

/// What a remover's look at a directory's entries (R3) found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Found {
    /// No entry is counted.
    Empty,
    /// A counted entry is visible: the directory is not empty to anyone.
    Visible,
    /// Entries are counted, but none is visible yet: each is being published (or taken
    /// back) by a creator past its admission.
    OnlyPending,
}

/// A removal decided and committed: its directory stays DYING, so creators in it wait,
/// until this is dropped (after the caller has taken the directory's name out of the map),
/// which declares it DEAD.
#[must_use = "the directory is declared dead when the removal is dropped"]
pub(crate) struct Removal<'a>(&'a DirLife);

impl Drop for Removal<'_> {
    fn drop(&mut self) {
        self.0.settle(true);
    }
}

/// The removing half. `look` reads the directory's entries (R3); when none is counted,
/// `commit` runs before anything else (the record of the removal is appended there, so a
/// failure to append leaves the directory alive) and its error is returned; on success the
/// directory is DEAD once the returned [`Removal`] is dropped. ENOTEMPTY when an entry was
/// visible; while counted entries are all still being published, looks again.
pub(crate) fn decide<'a>(
    life: &'a DirLife,
    mut look: impl FnMut() -> Found,
    commit: impl FnOnce() -> Result<()>,
) -> Result<Removal<'a>> {
    let mut round = 0;
    loop {
        life.begin_deciding();
        fence(SeqCst); // R2
        match look() {
            Found::Empty => break,
            Found::Visible => {
                life.settle(false);
                return Err(Errno::ENOTEMPTY);
            }
            Found::OnlyPending => {
                // Alive again, so that creators waiting at C4 go on; then wait, deciding
                // nothing, until the entries being published have come out (visible or taken
                // back), and start again. Flipping DYING and ALIVE in a loop instead could
                // keep a creator at C4 from ever seeing ALIVE.
                life.settle(false);
                while look() == Found::OnlyPending {
                    wait_round(round);
                    round += 1;
                }
            }
        }
    }
    match commit() {
        Ok(()) => Ok(Removal(life)),
        Err(e) => {
            life.settle(false);
            Err(e)
        }
    }
}

#[cfg(all(test, loom))]
mod loom_model {
    //! The protocol under loom: one creator and one remover (or two creators sharing a slot's
    //! registration), every interleaving, with the claim of the module doc and its two
    //! serial-order rules (ENOTEMPTY only with a visible entry; ENOENT only once the name is
    //! gone) as the assertions.

    use super::*;
    use loom::sync::atomic::{AtomicBool, AtomicU32};
    use loom::sync::{Arc, Mutex};
    use std::sync::atomic::Ordering::AcqRel;

    /// A directory as the protocol sees it: a life word, a registration flag (C1; the run
    /// set), one run's entry count under its shard lock (C2), how many entries were made
    /// visible (revealed), and whether the directory's own name is in its parent.
    struct Dir {
        life: DirLife,
        registered: AtomicBool,
        shard: Mutex<()>,
        count: AtomicU32,
        visible: AtomicU32,
        named: AtomicBool,
    }

    impl Dir {
        fn new() -> Arc<Dir> {
            Arc::new(Dir {
                life: DirLife::new(),
                registered: AtomicBool::new(false),
                shard: Mutex::new(()),
                count: AtomicU32::new(0),
                visible: AtomicU32::new(0),
                named: AtomicBool::new(true),
            })
        }

        fn create(&self) -> bool {
            let r = admit(
                &self.life,
                || {
                    let _g = self.shard.lock().unwrap();
                    if !self.registered.load(Relaxed) {
                        self.registered.swap(true, AcqRel);
                    }
                    self.count.fetch_add(1, Relaxed);
                },
                |()| {
                    let _g = self.shard.lock().unwrap();
                    self.count.fetch_sub(1, Relaxed);
                },
            );
            match r {
                Ok(()) => {
                    self.visible.fetch_add(1, Release);
                }
                // Told ENOENT: the directory's name must be gone already.
                Err(_) => assert!(!self.named.load(Relaxed), "ENOENT while still named"),
            };
            r.is_ok()
        }

        fn remove(&self) -> bool {
            let look = || {
                if !self.registered.load(Acquire) || self.count.load(Relaxed) == 0 {
                    Found::Empty
                } else if self.visible.load(Acquire) > 0 {
                    Found::Visible
                } else {
                    Found::OnlyPending
                }
            };
            match decide(&self.life, look, || Ok(())) {
                Ok(removal) => {
                    self.named.store(false, Relaxed);
                    drop(removal);
                    true
                }
                Err(e) => {
                    assert_eq!(e, Errno::ENOTEMPTY);
                    // Entries are never taken back here: the one seen stays visible.
                    assert!(
                        self.visible.load(Acquire) > 0,
                        "ENOTEMPTY with nothing visible"
                    );
                    false
                }
            }
        }
    }

    /// Every interleaving with up to two preemptions (loom's usual bound: the state space
    /// of three threads with a wait loop is too large to explore without one).
    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(2);
        b.max_branches = 100_000;
        b.check(f);
    }

    #[test]
    fn a_create_and_a_removal_never_both_succeed() {
        model(|| {
            let d = Dir::new();
            let d2 = d.clone();
            let creator = loom::thread::spawn(move || d2.create());
            let removed = d.remove();
            let created = creator.join().unwrap();
            assert!(
                !(created && removed),
                "entry published in a removed directory"
            );
            if removed {
                assert!(d.life.is_dead());
                assert_eq!(d.count.load(Relaxed), 0, "backed-out entry left a count");
                assert_eq!(d.visible.load(Acquire), 0);
            }
        });
    }

    /// The run was registered by another thread of the creator's slot (C1 made by someone
    /// else, racing the removal): the creator finds it under the shard lock and counts its
    /// entry there, and the removal must see that count.
    #[test]
    fn an_entry_in_a_run_registered_by_another_thread_is_counted() {
        model(|| {
            let d = Dir::new();
            let (d2, d3) = (d.clone(), d.clone());
            let registrar = loom::thread::spawn(move || {
                let _g = d2.shard.lock().unwrap();
                if !d2.registered.load(Relaxed) {
                    d2.registered.swap(true, AcqRel);
                }
            });
            let creator = loom::thread::spawn(move || d3.create());
            let removed = d.remove();
            registrar.join().unwrap();
            let created = creator.join().unwrap();
            assert!(
                !(removed && created),
                "removal succeeded with a published entry"
            );
        });
    }

    #[test]
    fn a_failed_removal_lets_the_waiting_creator_in() {
        model(|| {
            let d = Dir::new();
            // An entry that stays: every removal must fail, every create succeed.
            assert!(d.create());
            let d2 = d.clone();
            let creator = loom::thread::spawn(move || d2.create());
            assert!(!d.remove());
            assert!(
                creator.join().unwrap(),
                "a create waited out a failed removal"
            );
        });
    }
}
