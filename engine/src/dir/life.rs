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
//!   C2 count the entry in the run             R3 read D's runs and add up their counts
//!   C3 fence(SeqCst)                          R4 empty: commit, life -> DEAD
//!   C4 read life                                 else:  life -> ALIVE (ENOTEMPTY)
//!      DYING: wait until it changes
//!      DEAD:  uncount the entry, ENOENT
//!      ALIVE: the entry may become visible
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
//!   and the remover answers ENOTEMPTY.
//! - If R2 precedes C3 in S: by the same rule C4 reads DYING or a later value. The creator
//!   waits for R4 and admits on ALIVE (the removal failed; it may have counted this very
//!   entry) or backs out on DEAD (the removal succeeded without it).
//!
//! A creator that read ALIVE at C4 is therefore ordered before every removal that could miss
//! it, and its entry stays counted until it is removed, so every later removal sees it. The
//! window from R1 to R4 takes no lock a creator could hold (the stripes of D's entries are
//! not the stripe of D's own name; see `locking.rs`), so a waiting creator always sees R4.
//!
//! Only fences are SeqCst; the RMWs and loads are AcqRel/Acquire/Relaxed. That is all the
//! argument needs, and it is what loom models exactly (loom treats SeqCst loads and stores as
//! AcqRel but implements SeqCst fences): the model at the end of this file runs the protocol
//! under every interleaving with up to two preemptions (`RUSTFLAGS="--cfg loom"
//! CARGO_TARGET_DIR=target/loom cargo test --release -p lanefs --lib dir::life`; CI runs it).

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

/// The removing half. `is_empty` reads the directory's counts (R3); when it is empty,
/// `commit` runs before the directory is declared DEAD (the record of the removal is
/// appended there, so a failure to append leaves the directory alive) and its error is
/// returned. ENOTEMPTY when an entry was counted.
pub(crate) fn decide(
    life: &DirLife,
    is_empty: impl FnOnce() -> bool,
    commit: impl FnOnce() -> Result<()>,
) -> Result<()> {
    life.begin_deciding();
    fence(SeqCst); // R2
    let r = if is_empty() {
        commit()
    } else {
        Err(Errno::ENOTEMPTY)
    };
    life.settle(r.is_ok());
    r
}

#[cfg(all(test, loom))]
mod loom_model {
    //! The protocol under loom: one creator and one remover (or two creators sharing a slot's
    //! registration), every interleaving, with the claim of the module doc as the assertion.

    use super::*;
    use loom::sync::atomic::{AtomicBool, AtomicU32};
    use loom::sync::{Arc, Mutex};
    use std::sync::atomic::Ordering::AcqRel;

    /// A directory as the protocol sees it: a life word, a registration flag (C1; the run
    /// set), and one run's entry count under its shard lock (C2).
    struct Dir {
        life: DirLife,
        registered: AtomicBool,
        shard: Mutex<()>,
        count: AtomicU32,
        visible: AtomicU32,
    }

    impl Dir {
        fn new() -> Arc<Dir> {
            Arc::new(Dir {
                life: DirLife::new(),
                registered: AtomicBool::new(false),
                shard: Mutex::new(()),
                count: AtomicU32::new(0),
                visible: AtomicU32::new(0),
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
            if r.is_ok() {
                self.visible.fetch_add(1, Release);
            }
            r.is_ok()
        }

        fn remove(&self) -> bool {
            decide(
                &self.life,
                || !self.registered.load(Acquire) || self.count.load(Relaxed) == 0,
                || Ok(()),
            )
            .is_ok()
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
