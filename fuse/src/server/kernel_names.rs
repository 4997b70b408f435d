//! What the kernel may hold that a name made by a library caller (the channel of `lanefs
//! run`, a program that embeds lanefs) has to drop: [`KernelNames`].
//!
//! A new name made through the kernel needs no report: the kernel made it. A new name made
//! around the kernel is reported (`sink.rs`), and the full report costs an entry
//! invalidation, which Linux (6.18) handles with the directory's `i_rwsem` held exclusively
//! whether or not it holds a dentry for the name: every create over the channel would take
//! the lock the channel exists to avoid. The entry invalidation is needed for three things
//! only, and this table tells when none can be there, so that the report drops the
//! directory's attributes alone (an inode invalidation, which takes no inode lock):
//!
//! 1. **A negative dentry** for the name, which would hide the new file from the kernel for
//!    the entry timeout. The kernel keeps one only from a LOOKUP answered with a negative
//!    entry (node id 0 with the entry timeout, `names.rs`) or from its own UNLINK, RMDIR or
//!    RENAME (the removed name's dentry turns negative and keeps its time). Those handlers
//!    mark the name here ([`KernelNames::negative`]) before the engine call can remove or
//!    miss it; a LOOKUP that found nothing looks again after marking. A report of a new name
//!    runs after the engine made it visible. So either the report finds the mark, or the
//!    LOOKUP's second look finds the name; and a removal the kernel made (which precedes
//!    the new name) was marked before it. A mark found is taken out and the full report
//!    made; the invalidation drops what the mark stood for, and a LOOKUP in flight meanwhile
//!    holds the directory's lock shared, so the invalidation waits for its dentry and
//!    drops it.
//! 2. **A listing read in flight**: a READDIR answered before the name existed whose reply
//!    the kernel has not yet put in its cache (docs/DESIGN.md §7, "Directory listings": the
//!    entry invalidation waits for every `getdents` of the directory). Each READDIR is
//!    counted here ([`KernelNames::reading`]) before it reads the directory; a report that
//!    finds a count makes the full report (entry invalidation, then the listing dropped)
//!    and then takes out the count it saw, unless a READDIR counted since.
//!
//! 3. **An old entry whose removal is being reported.** A library caller's removal of a name
//!    (an unlink, an rmdir, a rename of it away or over it) is visible in the engine before
//!    its report has dropped the kernel's entry of the old inode; a new name made there
//!    meanwhile (by another process over the channel) must not be reported as one the
//!    kernel holds nothing under, or the kernel would keep serving the old, removed inode.
//!    Each such removal is counted ([`KernelNames::removing`], by a hash of directory and
//!    name) before its engine call and until its report is made; a report of a new name that
//!    finds its slot counted makes the full report, whose entry invalidation drops the old
//!    entry. The count comes before the removal and the new name after it, so the new name's
//!    report (after a fence) either sees the count or comes after the old entry was dropped.
//!
//! A name *removed* around the kernel (an unlink or rmdir over the channel) needs the entry
//! invalidation only if the kernel may hold a dentry for it, or a listing with it. A dentry
//! for it points to the removed inode, so the kernel holds a lookup reference on that inode
//! (the engine's kernel-held count, read after the removal), unless a request that hands
//! the kernel an entry of the directory is still running: a LOOKUP, MKNOD, MKDIR, SYMLINK or
//! LINK in it may have found or made the name before the removal and not yet counted its
//! reference. Each of those runs inside [`KernelNames::handing`], which counts it per shard
//! before the engine call and stops counting after the call (its reference is counted by
//! then); a removal reads these counts ([`KernelNames::removal_unseen`]) after its engine
//! call and before it reads the inode's kernel-held count. Either it sees a request
//! counted, or that request's engine call came after the removal (and found nothing), or
//! it ended before, and then its reference is counted. A listing is the READDIR count of 2.
//! When none of these can be there, the removal drops the directory's attributes alone.
//!
//! The mark and the count are taken under a shard's lock, and the report reads them under
//! the same lock after the engine call returned (a lock's release and acquire order them);
//! while a shard holds nothing, a report reads only its population, after a `SeqCst`
//! fence that pairs with the one each marking call makes before its engine call.
//!
//! **Bounds.** A kernel negative dentry lives at most the entry timeout after it was made
//! (an unlinked name's keeps the time of the LOOKUP that found it, before the unlink); a mark
//! is kept [`SLACK`] longer, for the kernel's delay between the reply and stamping the
//! dentry. A shard holds at most [`NEGATIVES_MAX`] marks: past that, expired marks are
//! dropped, and if it is still full every report of a name in the shard's directories makes
//! the full report until the entry timeout and the slack have passed (marks it could not keep
//! have expired by then). A cached listing has no such bound (it lives until the kernel
//! drops the directory's pages or the directory), so a count goes only when a full report
//! takes it out or when the kernel has forgotten the directory
//! ([`KernelNames::forgotten`]: the FORGET that leaves the kernel no lookup reference on
//! it, checked under the shard's lock, which a READDIR, sent only for a directory the kernel
//! holds, takes after its LOOKUP counted). A shard holds at most [`READS_MAX`] counts; a
//! READDIR that finds no room leaves the shard making full reports for as long as the
//! server runs.
//!
//! Lock: each shard's mutex is a leaf (fuse/src/lib.rs, "Locks"): held only to read or
//! change the shard, never across an engine call or a notification.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst, fence};
use std::time::{Duration, Instant};

/// Shards, by directory node id.
const SHARDS: usize = 64;

/// Marks of negative names a shard keeps at most.
pub(super) const NEGATIVES_MAX: usize = 1024;

/// Directories with READDIRs counted that a shard keeps at most.
pub(super) const READS_MAX: usize = 4096;

/// Slots of [`KernelNames::removing`]: names that share one count each other as in flight,
/// which costs an entry invalidation, never a stale entry.
const REMOVING_SLOTS: usize = 4096;

/// The slot of (`dir`, `name`) in [`KernelNames::removing`] (FNV-1a).
fn removing_slot(dir: u64, name: &[u8]) -> usize {
    let h = dir
        .to_le_bytes()
        .iter()
        .chain(name)
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
    (h % REMOVING_SLOTS as u64) as usize
}

/// How long past the entry timeout a mark is kept (see the module doc): far longer than the
/// kernel takes between reading a LOOKUP's reply and stamping its dentry, even on a loaded
/// machine (the engine waits at most a second for the kernel to take an inode it is handed,
/// `lanefs::notify::SETTLE`).
pub(super) const SLACK: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Shard {
    /// READDIRs served per directory since a report last made the full invalidation.
    reads: HashMap<u64, u64>,
    /// Names (directory, name) whose dentry the kernel may hold negative, and when marked.
    negatives: HashMap<(u64, Box<[u8]>), Instant>,
    /// Until when every name in this shard's directories is taken as marked (a mark that did
    /// not fit).
    full_until: Option<Instant>,
    /// A READDIR found no room for its count: every new name in this shard's directories
    /// makes the full report from now on.
    reads_lost: bool,
}

impl Shard {
    fn population(&self) -> usize {
        self.reads.len()
            + self.negatives.len()
            + usize::from(self.full_until.is_some())
            + usize::from(self.reads_lost)
    }
}

/// What a report of a new name has to invalidate ([`KernelNames::new_name`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Needs {
    /// The directory's attributes only.
    Attributes,
    /// The entry (a negative dentry may be cached) and, with `Some(reads)`, the listing,
    /// after which [`KernelNames::listing_dropped`] is told `reads`.
    Entry(Option<u64>),
}

/// See the module doc.
pub(super) struct KernelNames {
    shards: Box<[(AtomicUsize, Mutex<Shard>)]>,
    /// Per shard: kernel requests running that may hand the kernel an entry of one of its
    /// directories ([`KernelNames::handing`]).
    handing: Box<[AtomicUsize]>,
    /// Removals by library callers in flight, by a hash of (directory, name)
    /// ([`KernelNames::removing`]).
    removing: Box<[AtomicUsize]>,
    /// The entry timeout and [`SLACK`]: how long a mark is kept.
    keep: Duration,
}

impl KernelNames {
    /// A table for a mount whose entry timeout is `ttl`.
    pub(super) fn new(ttl: Duration) -> KernelNames {
        KernelNames {
            shards: (0..SHARDS).map(|_| Default::default()).collect(),
            handing: (0..SHARDS).map(|_| AtomicUsize::new(0)).collect(),
            removing: (0..REMOVING_SLOTS).map(|_| AtomicUsize::new(0)).collect(),
            keep: ttl + SLACK,
        }
    }

    fn shard(&self, dir: u64) -> &(AtomicUsize, Mutex<Shard>) {
        &self.shards[dir as usize % SHARDS]
    }

    /// Runs `f` on `dir`'s shard and keeps its population count, then fences (module doc).
    fn change<R>(&self, dir: u64, f: impl FnOnce(&mut Shard) -> R) -> R {
        let (pop, lock) = self.shard(dir);
        let r = {
            let mut s = lock.lock().unwrap_or_else(|e| e.into_inner());
            let r = f(&mut s);
            pop.store(s.population(), SeqCst);
            r
        };
        fence(SeqCst);
        r
    }

    /// The kernel may keep `name` in `dir` as a negative dentry (module doc, 1): called
    /// before the engine call that removes the name, or, for a LOOKUP that found nothing,
    /// before it looks again.
    pub(super) fn negative(&self, dir: u64, name: &[u8]) {
        if self.keep == SLACK {
            return; // an entry timeout of 0: the kernel trusts no negative dentry
        }
        let keep = self.keep;
        self.change(dir, |s| {
            let now = Instant::now();
            if s.negatives.len() >= NEGATIVES_MAX {
                s.negatives.retain(|_, at| now.duration_since(*at) < keep);
            }
            if s.negatives.len() >= NEGATIVES_MAX {
                s.full_until = Some(now + keep);
            } else {
                s.negatives.insert((dir, name.into()), now);
            }
        });
    }

    /// A READDIR of `dir` is about to read it (module doc, 2).
    pub(super) fn reading(&self, dir: u64) {
        self.change(dir, |s| {
            if s.reads.len() >= READS_MAX && !s.reads.contains_key(&dir) {
                // No room for a count, and a cached listing has no time bound.
                s.reads_lost = true;
            } else {
                *s.reads.entry(dir).or_default() += 1;
            }
        })
    }

    /// What a report of `name`, just made in `dir` by a library caller, has to invalidate;
    /// takes the name's mark out.
    pub(super) fn new_name(&self, dir: u64, name: &[u8]) -> Needs {
        let (pop, _) = self.shard(dir);
        fence(SeqCst);
        if self.removing[removing_slot(dir, name)].load(SeqCst) != 0 {
            // The name's old entry may still be in the kernel (module doc, 3).
            return Needs::Entry(None);
        }
        if pop.load(SeqCst) == 0 {
            return Needs::Attributes;
        }
        let keep = self.keep;
        self.change(dir, |s| {
            let now = Instant::now();
            let full = match s.full_until {
                Some(t) if now < t => true,
                Some(_) => {
                    s.full_until = None;
                    false
                }
                None => false,
            };
            let marked = s
                .negatives
                .remove(&(dir, Box::<[u8]>::from(name)))
                .is_some_and(|at| now.duration_since(at) < keep);
            let reads = s.reads.get(&dir).copied();
            if full || marked || reads.is_some() || s.reads_lost {
                Needs::Entry(reads)
            } else {
                Needs::Attributes
            }
        })
    }

    /// A library caller is about to remove `name` from `dir` (module doc, 3); counted until
    /// [`KernelNames::removal_reported`].
    pub(super) fn removing(&self, dir: u64, name: &[u8]) {
        self.removing[removing_slot(dir, name)].fetch_add(1, SeqCst);
        fence(SeqCst);
    }

    /// The removal [`KernelNames::removing`] counted was reported (or failed).
    pub(super) fn removal_reported(&self, dir: u64, name: &[u8]) {
        self.removing[removing_slot(dir, name)].fetch_sub(1, SeqCst);
    }

    /// A kernel request that may hand the kernel an entry of `dir` (a LOOKUP in it, or a
    /// request that makes a name in it) is about to look at it; counted until the guard is
    /// dropped, after the engine call (module doc).
    pub(super) fn handing(&self, dir: u64) -> Handing<'_> {
        let c = &self.handing[dir as usize % SHARDS];
        c.fetch_add(1, SeqCst);
        fence(SeqCst);
        Handing(c)
    }

    /// Whether a name just removed from `dir` by a library caller can be in no entry or
    /// listing the kernel holds, but for a dentry of the removed inode, which the caller
    /// asks about next (the engine's kernel-held count): no kernel request handing entries
    /// of the shard's directories runs, and no READDIR of `dir` was counted (module doc).
    pub(super) fn removal_unseen(&self, dir: u64) -> bool {
        fence(SeqCst);
        if self.handing[dir as usize % SHARDS].load(SeqCst) != 0 {
            return false;
        }
        let (pop, lock) = self.shard(dir);
        if pop.load(SeqCst) == 0 {
            return true;
        }
        let s = lock.lock().unwrap_or_else(|e| e.into_inner());
        !s.reads_lost && !s.reads.contains_key(&dir)
    }

    /// The kernel forgot `dir` (a FORGET): its count goes if `held` says the kernel holds no
    /// lookup reference on it any more, asked under the shard's lock (module doc, "Bounds").
    pub(super) fn forgotten(&self, dir: u64, held: impl FnOnce() -> bool) {
        let (pop, _) = self.shard(dir);
        if pop.load(SeqCst) == 0 {
            return;
        }
        self.change(dir, |s| {
            if s.reads.contains_key(&dir) && !held() {
                s.reads.remove(&dir);
            }
        })
    }

    /// A full report in `dir`, made after [`KernelNames::new_name`] saw `reads` READDIRs,
    /// dropped the listing: the count goes unless a READDIR counted since.
    pub(super) fn listing_dropped(&self, dir: u64, reads: u64) {
        self.change(dir, |s| {
            if s.reads.get(&dir) == Some(&reads) {
                s.reads.remove(&dir);
            }
        })
    }
}

/// A kernel request counted by [`KernelNames::handing`] while it lives.
pub(super) struct Handing<'a>(&'a AtomicUsize);

impl Drop for Handing<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_name_while_its_removal_is_reported_takes_the_entry_invalidation() {
        let k = KernelNames::new(Duration::from_secs(1));
        k.removing(1, b"a");
        assert_eq!(k.new_name(1, b"a"), Needs::Entry(None));
        assert_eq!(k.new_name(1, b"b"), Needs::Attributes, "another name");
        assert_eq!(k.new_name(2, b"a"), Needs::Attributes, "another directory");
        k.removal_reported(1, b"a");
        assert_eq!(k.new_name(1, b"a"), Needs::Attributes);
    }

    #[test]
    fn a_removal_is_unseen_only_without_kernel_requests_or_listings() {
        let k = KernelNames::new(Duration::from_secs(1));
        assert!(k.removal_unseen(1));
        {
            let _g = k.handing(1);
            assert!(!k.removal_unseen(1), "a LOOKUP in the directory runs");
            assert!(
                !k.removal_unseen(1 + SHARDS as u64),
                "one in the same shard"
            );
            assert!(k.removal_unseen(2), "another shard");
        }
        assert!(k.removal_unseen(1), "the request ended");
        k.negative(1, b"x");
        assert!(
            k.removal_unseen(1),
            "a negative dentry is what a removal leaves"
        );
        k.reading(1);
        assert!(!k.removal_unseen(1), "a listing was read");
        assert!(k.removal_unseen(1 + SHARDS as u64), "of another directory");
        k.listing_dropped(1, 1);
        assert!(k.removal_unseen(1));
    }

    #[test]
    fn without_an_entry_timeout_nothing_is_marked() {
        let k = KernelNames::new(Duration::ZERO);
        k.negative(1, b"a");
        assert_eq!(k.new_name(1, b"a"), Needs::Attributes);
    }

    #[test]
    fn an_empty_table_asks_for_attributes_only() {
        let k = KernelNames::new(Duration::from_secs(1));
        assert_eq!(k.new_name(1, b"a"), Needs::Attributes);
    }

    #[test]
    fn a_mark_asks_for_the_entry_once() {
        let k = KernelNames::new(Duration::from_secs(1));
        k.negative(1, b"a");
        assert_eq!(k.new_name(1, b"b"), Needs::Attributes, "another name");
        assert_eq!(k.new_name(65, b"a"), Needs::Attributes, "another directory");
        assert_eq!(k.new_name(1, b"a"), Needs::Entry(None));
        assert_eq!(k.new_name(1, b"a"), Needs::Attributes, "the mark was taken");
    }

    #[test]
    fn a_read_asks_for_the_listing_until_dropped_with_no_read_since() {
        let k = KernelNames::new(Duration::from_secs(1));
        k.reading(7);
        assert_eq!(k.new_name(7, b"a"), Needs::Entry(Some(1)));
        k.reading(7);
        k.listing_dropped(7, 1);
        assert_eq!(
            k.new_name(7, b"b"),
            Needs::Entry(Some(2)),
            "a read counted after the report looked stays"
        );
        k.listing_dropped(7, 2);
        assert_eq!(k.new_name(7, b"c"), Needs::Attributes);
    }

    #[test]
    fn a_full_shard_asks_for_the_entry_of_every_name() {
        let k = KernelNames::new(Duration::from_secs(3600));
        for n in 0..NEGATIVES_MAX {
            k.negative(3, n.to_string().as_bytes());
        }
        k.negative(3, b"one too many");
        assert_eq!(k.new_name(3, b"never marked"), Needs::Entry(None));
        assert_eq!(k.new_name(3 + SHARDS as u64, b"x"), Needs::Entry(None));
        assert_eq!(k.new_name(4, b"x"), Needs::Attributes, "another shard");
    }

    #[test]
    fn a_read_is_counted_in_a_shard_full_of_marks() {
        let k = KernelNames::new(Duration::from_secs(1));
        for n in 0..NEGATIVES_MAX + 1 {
            k.negative(9, n.to_string().as_bytes());
        }
        k.reading(9);
        assert_eq!(k.new_name(9, b"x"), Needs::Entry(Some(1)));
    }

    #[test]
    fn a_read_with_no_room_for_its_count_keeps_the_shard_on_full_reports() {
        let k = KernelNames::new(Duration::from_secs(1));
        for d in 0..READS_MAX as u64 {
            k.reading(2 + d * SHARDS as u64);
        }
        let late = 2 + READS_MAX as u64 * SHARDS as u64;
        k.reading(late);
        assert_eq!(k.new_name(late, b"x"), Needs::Entry(None));
        k.listing_dropped(2, 1);
        assert_eq!(
            k.new_name(late, b"y"),
            Needs::Entry(None),
            "room made later does not bring the lost count back"
        );
        assert_eq!(k.new_name(3, b"x"), Needs::Attributes, "another shard");
    }

    #[test]
    fn a_forgotten_directory_loses_its_count_only_when_the_kernel_holds_it_no_more() {
        let k = KernelNames::new(Duration::from_secs(1));
        k.reading(4);
        k.forgotten(4, || true);
        assert_eq!(k.new_name(4, b"x"), Needs::Entry(Some(1)), "still held");
        k.forgotten(4, || false);
        assert_eq!(k.new_name(4, b"y"), Needs::Attributes);
    }

    #[test]
    fn expired_marks_make_room() {
        let k = KernelNames::new(Duration::from_secs(1));
        let (_, lock) = k.shard(5);
        {
            // Marks older than the timeout and the slack.
            let Some(old) = Instant::now().checked_sub(SLACK + Duration::from_secs(2)) else {
                return; // a clock that started less than that ago
            };
            let mut s = lock.lock().unwrap();
            for n in 0..NEGATIVES_MAX {
                s.negatives
                    .insert((5, n.to_string().into_bytes().into()), old);
            }
        }
        k.negative(5, b"fresh");
        assert_eq!(k.new_name(5, b"0"), Needs::Attributes, "expired, dropped");
        assert_eq!(k.new_name(5, b"fresh"), Needs::Entry(None));
    }
}
