//! Inodes: attributes, kind-specific body, and the lifecycle word.
//!
//! # The lifecycle word (`Inode::life`)
//! One `AtomicU64` packs three things so that "is this inode still reachable, and may it be
//! freed" is decided by single atomic transitions, never by reading two fields apart:
//!
//! ```text
//!   bit 63   bit 62     bit 61   bits 60..32        bit 31    bit 30     bits 29..0
//!   DEAD     LINKABLE   SHARED   nlink (29 bits)    EMPTIED   CHECKING   refs (30 bits)
//! ```
//!
//! - `nlink` counts directory entries naming the inode (directories: 2 + subdirectories, and 0
//!   once removed). It changes only under the stripe lock of a name that is being added or
//!   removed.
//! - `refs` counts open handles and, for FUSE, kernel lookups not yet forgotten.
//! - `LINKABLE` marks an `O_TMPFILE` file that has never had a name and was not made with
//!   `O_EXCL` (Linux's `I_LINKABLE`): the one kind of inode whose link count may go up from 0
//!   ([`Inode::link_existing`]). The link that does so clears it in the same transition, so
//!   of two links racing, one finds it and the other finds a count of 1; once the file has
//!   had a name and lost it again, it is an unlinked open file like any other.
//! - `SHARED` marks a file (not a directory) that has had two names or more at once since it
//!   was made or loaded: set by the link that gives it a second name and never cleared. A
//!   kernel caller's readdirplus withholds such a file's attributes
//!   ([`crate::Filesystem::readdir`]).
//! - `EMPTIED` marks a regular file whose contents went before the inode itself: it has no
//!   name, the only references left are the kernel's lookup references (no open handle, no
//!   operation holding it) and the kernel no longer holds the inode (`fs/unlinked.rs`), so
//!   its pages, space, inode count and xattrs were given back without waiting for the
//!   FORGET, as tmpfs frees an unlinked file nobody holds, and its `Free` record appended.
//!   The inode stays in the table, answering `getattr` with link count 0, until the
//!   FORGET drops the last reference. No reference can be taken on it any more
//!   ([`Inode::get_ref`] fails, ESTALE), so nothing reads or changes what is gone. Set by
//!   [`Inode::empty`], kept in the `DEAD` word, so the free after it knows.
//! - `CHECKING` is set by [`Inode::empty`] while it compares the references with the
//!   kernel's lookup count, which is kept apart (`notify.rs`, `KernelHeld`); every other
//!   transition clears it, so the check's final compare-and-swap succeeds only if nothing
//!   changed the word since the check began (`Inode::empty` explains why that is enough).
//! - `DEAD` is set exactly once, by the transition that sees `nlink == 0 && refs == 0`
//!   (whatever `LINKABLE` says); its winner frees the inode (removes it from the inode table,
//!   which defers the memory to epoch reclamation, and recycles the number). Once set, no
//!   transition succeeds: a lookup that raced the last unlink and still holds a pointer to
//!   the inode fails to take a reference ([`Inode::get_ref`]) instead of resurrecting it.
//!
//! All transitions are compare-and-swap loops on the one word, so they have a single
//! modification order; each returns what the caller must do ([`Fate`]).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::*};

use parking_lot::RwLock;

use crate::attr::{AttrCell, FileType};
use crate::data::FileData;
use crate::dir::DirBody;
use crate::errno::{Errno, Result};
use crate::id::{Generation, Ino, InoGen, InodeId};
use crate::time::Timespec;

const REFS_MASK: u64 = (1 << 30) - 1;
const CHECKING: u64 = 1 << 30;
const EMPTIED: u64 = 1 << 31;
const NLINK_ONE: u64 = 1 << 32;
const NLINK_MASK: u64 = ((1 << 29) - 1) << 32;
const SHARED: u64 = 1 << 61;
const LINKABLE: u64 = 1 << 62;
const DEAD: u64 = 1 << 63;

/// Largest link count (directories: subdirectories + 2); above the inode table's capacity
/// (`id::MAX_INO`), so only a file's hard links can reach it.
pub(crate) const NLINK_MAX: u32 = (1 << 29) - 1;
const _: () = assert!(NLINK_MAX as u64 > crate::id::MAX_INO + 2);

/// Whether a word has neither links nor references (and is not dead): the inode may be freed.
#[inline]
fn idle(w: u64) -> bool {
    w & (DEAD | NLINK_MASK | REFS_MASK) == 0
}

/// What the caller of a lifecycle transition must do next.
#[must_use]
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Fate {
    /// The inode is still linked or referenced.
    Lives,
    /// This call set `DEAD`: the caller must free the inode.
    Free,
    /// The inode lives on references alone (no link, not emptied): if they are only the
    /// kernel's lookup references, its contents may go before its FORGET
    /// ([`Inode::empty`], `fs/unlinked.rs`).
    Unnamed,
}

/// What a transition that left word `new` means for the caller (the reap of an idle word
/// included).
fn fate_of(i: &Inode, new: u64) -> Fate {
    if idle(new) {
        i.reap()
    } else if new & (NLINK_MASK | DEAD | EMPTIED) == 0 {
        Fate::Unnamed
    } else {
        Fate::Lives
    }
}

// An inode is allocated per file: keep it in mimalloc's 128-byte size class
// (docs/BENCHMARKS.md, "Memory per file"; the birth time took it past 112, the
// eviction label to 128).
// (Not under loom, whose atomics are larger.)
#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<Body>() == 24);
#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<Inode>() == 128);

/// Kind-specific contents.
pub(crate) enum Body {
    File(RwLock<FileData>),
    Dir(DirBody),
    Symlink(Box<[u8]>),
    Special { rdev: u64 },
}

/// An inode. Reached through the inode table under an epoch guard; never moved.
pub(crate) struct Inode {
    pub ino: Ino,
    pub generation: Generation,
    life: AtomicU64,
    pub attr: AttrCell,
    pub body: Body,
    /// The birth time (`statx`'s `stx_btime`), in nanoseconds from the epoch ([`born`]); set
    /// when the inode is made and never changed after, but by recovery.
    born: AtomicI64,
    /// The epoch of the store's checkpoints (`data.rs`, [`crate::PageEpochs`]) read after
    /// the last record that changed this inode was appended: once the store keeps that
    /// epoch, the store's copy is this inode and the eviction pass may drop it
    /// (`fs/lazy.rs`, "Eviction"). Only ever raised. Its top bit, [`YOUNG`], is the
    /// eviction clock's second chance.
    label: AtomicU64,
}

/// The top bit of [`Inode::label`]: not passed by the eviction clock yet (epochs never
/// reach it).
const YOUNG: u64 = 1 << 63;

/// An unknown birth time (an inode a checkpoint kept before birth times were kept).
const UNBORN: i64 = i64::MIN;

/// A birth time as [`Inode::born`] keeps it: nanoseconds from the epoch, clamped to the
/// range of an `i64` (years 1678 to 2262; a creation time comes from the clock, so only a
/// crafted record reaches the ends).
fn born(t: Option<Timespec>) -> i64 {
    match t {
        None => UNBORN,
        Some(t) => (t.sec as i128 * 1_000_000_000 + t.nsec as i128)
            .clamp(UNBORN as i128 + 1, i64::MAX as i128) as i64,
    }
}

impl Inode {
    /// A new inode, born at its attributes' ctime.
    pub fn new(id: InodeId, nlink: u32, refs: u32, attr: AttrCell, body: Body) -> Self {
        debug_assert!(nlink <= NLINK_MAX);
        let shared = if nlink > 1 && !matches!(body, Body::Dir(_)) {
            SHARED
        } else {
            0
        };
        Inode {
            ino: id.ino,
            generation: id.generation,
            life: AtomicU64::new(shared | ((nlink as u64) << 32) | refs as u64),
            born: AtomicI64::new(born(Some(attr.load().ctime))),
            attr,
            body,
            label: AtomicU64::new(YOUNG),
        }
    }

    /// The epoch of this inode's last change (see [`Inode::label`]'s field).
    #[inline]
    pub fn label(&self) -> u64 {
        self.label.load(SeqCst) & !YOUNG
    }

    /// Whether the eviction pass has not passed this inode since it was made or loaded,
    /// and marks it passed: a new inode gets one turn of the clock before it may go, so a
    /// directory's files loaded with it are not evicted before they are asked for.
    #[inline]
    pub fn pass_young(&self) -> bool {
        self.label.load(Relaxed) & YOUNG != 0 && self.label.fetch_and(!YOUNG, SeqCst) & YOUNG != 0
    }

    /// Whether only names hold the inode: links, no reference (no open handle, no kernel
    /// lookup, no operation holding it), not dead, emptied or being checked (the eviction
    /// pass's test of the lifecycle word: `fs/lazy.rs`).
    #[inline]
    pub fn only_named(&self) -> bool {
        let w = self.life.load(Acquire);
        w & NLINK_MASK != 0 && w & (DEAD | LINKABLE | EMPTIED | CHECKING | REFS_MASK) == 0
    }

    /// Notes a change made in epoch `e` (read after its record was appended).
    #[inline]
    pub fn relabel(&self, e: u64) {
        // Read first: most changes find the label current, and write no shared line.
        if self.label.load(SeqCst) & !YOUNG < e {
            let _ = self.label.fetch_update(SeqCst, SeqCst, |w| {
                (w & !YOUNG < e).then_some(w & YOUNG | e)
            });
        }
    }

    /// The birth time, if known.
    pub fn birth(&self) -> Option<Timespec> {
        match self.born.load(Relaxed) {
            UNBORN => None,
            ns => Some(Timespec::new(
                ns.div_euclid(1_000_000_000),
                ns.rem_euclid(1_000_000_000) as u32,
            )),
        }
    }

    /// Sets the birth time kept for this inode (recovery: what the checkpoint kept).
    pub fn set_birth(&self, t: Option<Timespec>) {
        self.born.store(born(t), Relaxed);
    }

    /// An inode with no name (an `O_TMPFILE` file) and `refs` references; `linkable`: a link
    /// may give it its first name ([`Inode::link_existing`]).
    pub fn new_unnamed(id: InodeId, refs: u32, linkable: bool, attr: AttrCell, body: Body) -> Self {
        let mark = if linkable { LINKABLE } else { 0 };
        Inode {
            life: AtomicU64::new(mark | refs as u64),
            ..Inode::new(id, 0, refs, attr, body)
        }
    }

    #[inline]
    pub fn id(&self) -> InodeId {
        InodeId {
            ino: self.ino,
            generation: self.generation,
        }
    }

    /// The packed word entries use to name this inode.
    #[inline]
    pub fn key(&self) -> InoGen {
        InoGen::new(self.ino, self.generation)
    }

    /// What an entry naming this inode holds: its packed number and generation, and its type.
    #[inline]
    pub(crate) fn named_as(&self) -> (InoGen, FileType) {
        (self.key(), self.kind())
    }

    #[inline]
    pub fn kind(&self) -> FileType {
        FileType::from_mode(self.attr.mode()).expect("valid type bits")
    }

    #[inline]
    pub fn dir(&self) -> Option<&DirBody> {
        match &self.body {
            Body::Dir(d) => Some(d),
            _ => None,
        }
    }

    #[inline]
    pub fn is_dir(&self) -> bool {
        matches!(self.body, Body::Dir(_))
    }

    #[inline]
    pub fn nlink(&self) -> u32 {
        ((self.life.load(Acquire) & NLINK_MASK) >> 32) as u32
    }

    #[cfg(test)]
    pub fn refs(&self) -> u32 {
        (self.life.load(Acquire) & REFS_MASK) as u32
    }

    /// Whether a link may still give this nameless inode its first name (`O_TMPFILE` without
    /// `O_EXCL`, never linked yet).
    #[inline]
    pub fn is_linkable(&self) -> bool {
        self.life.load(Acquire) & LINKABLE != 0
    }

    /// Whether this file has had two names or more at once since it was made or loaded
    /// (`SHARED`, module doc). Never true of a directory.
    #[inline]
    pub fn was_shared(&self) -> bool {
        self.life.load(Acquire) & SHARED != 0
    }

    #[inline]
    pub fn is_dead(&self) -> bool {
        self.life.load(Acquire) & DEAD != 0
    }

    /// Whether the inode's contents went before it ([`Inode::empty`]).
    #[inline]
    pub fn is_emptied(&self) -> bool {
        self.life.load(Acquire) & EMPTIED != 0
    }

    /// Applies `f` to the word until it succeeds; `f` returns the new word or an error. The
    /// new word never has `CHECKING`: a transition ends any check under way.
    fn transition(&self, mut f: impl FnMut(u64) -> Result<u64>) -> Result<(u64, u64)> {
        let mut cur = self.life.load(Acquire);
        loop {
            let new = f(cur)? & !CHECKING;
            match self.life.compare_exchange_weak(cur, new, AcqRel, Acquire) {
                Ok(_) => return Ok((cur, new)),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Sets `DEAD` if the word has neither links nor references (a `LINKABLE` mark goes
    /// with it: no one holds the file any more to link it; an `EMPTIED` mark stays).
    fn reap(&self) -> Fate {
        let mut cur = self.life.load(Acquire);
        while idle(cur) {
            match self
                .life
                .compare_exchange(cur, DEAD | (cur & EMPTIED), AcqRel, Acquire)
            {
                Ok(_) => return Fate::Free,
                Err(actual) => cur = actual,
            }
        }
        Fate::Lives
    }

    /// Takes a reference (open handle or kernel lookup). Fails on a dead inode (ENOENT) or
    /// an emptied one (ESTALE: the kernel then walks its path again).
    pub fn get_ref(&self) -> Result<()> {
        self.transition(|w| {
            if w & DEAD != 0 {
                return Err(Errno::ENOENT);
            }
            if w & EMPTIED != 0 {
                return Err(Errno::ESTALE);
            }
            if w & REFS_MASK == REFS_MASK {
                return Err(Errno::ENFILE);
            }
            Ok(w + 1)
        })
        .map(|_| ())
    }

    /// Drops `n` references, or as many as there are if fewer; returns how many were
    /// missing (a FORGET of more than the kernel looked up: `Filesystem::forget`).
    pub fn put_refs_at_most(&self, n: u64) -> (Fate, u64) {
        let mut short = 0;
        let r = self.transition(|w| {
            let drop = n.min(w & REFS_MASK);
            short = n - drop;
            Ok(w - drop)
        });
        let fate = match r {
            Ok((_, new)) => fate_of(self, new),
            _ => Fate::Lives,
        };
        (fate, short)
    }

    /// Drops `n` references.
    pub fn put_refs(&self, n: u64) -> Fate {
        let r = self.transition(|w| {
            assert!(w & REFS_MASK >= n, "dropping {n} refs of {}", w & REFS_MASK);
            Ok(w - n)
        });
        match r {
            Ok((_, new)) => fate_of(self, new),
            _ => Fate::Lives,
        }
    }

    /// Adds a link for `link(2)`: fails with ENOENT once the last link is gone (an unlinked
    /// open file cannot be linked back), unless the inode is a `LINKABLE` tmpfile, whose
    /// first name this is (the mark goes); EMLINK at the limit. Returns whether it took the
    /// mark, for [`Inode::unlink_failed`].
    pub fn link_existing(&self) -> Result<bool> {
        self.transition(|w| {
            let nlink = (w & NLINK_MASK) >> 32;
            if w & (DEAD | EMPTIED) != 0 || nlink == 0 && w & LINKABLE == 0 {
                return Err(Errno::ENOENT);
            }
            if nlink >= NLINK_MAX as u64 {
                return Err(Errno::EMLINK);
            }
            let shared = if nlink >= 1 { SHARED } else { 0 };
            Ok(((w & !LINKABLE) | shared) + NLINK_ONE)
        })
        .map(|(old, _)| old & LINKABLE != 0)
    }

    /// Takes back a link [`Inode::link_existing`] added whose name could not be made; `was_linkable`
    /// (what it returned) puts the tmpfile's mark back, so the file is as before the attempt.
    pub fn unlink_failed(&self, was_linkable: bool) -> Fate {
        let r = self.transition(|w| {
            assert!(w & NLINK_MASK != 0, "nlink underflow on ino {}", self.ino);
            let back = if was_linkable { LINKABLE } else { 0 };
            Ok((w - NLINK_ONE) | back)
        });
        match r {
            Ok((_, new)) => fate_of(self, new),
            _ => Fate::Lives,
        }
    }

    /// Adds a link during recovery, even to an inode whose count is 0: a link and the unlink
    /// of another name of the same inode take different stripes, the link raises the count
    /// before its record is committed and the unlink commits before it lowers it, so replay
    /// may apply them in the other order and pass through 0; and a tmpfile's first link
    /// raises it from 0 by design. Recovery holds every inode until its `Free` record
    /// (`fs/recovery.rs`), so the inode is still there.
    pub fn relink(&self) -> Result<()> {
        self.transition(|w| {
            if w & DEAD != 0 {
                return Err(Errno::ENOENT);
            }
            let nlink = (w & NLINK_MASK) >> 32;
            if nlink >= NLINK_MAX as u64 {
                return Err(Errno::EMLINK);
            }
            let shared = if nlink >= 1 { SHARED } else { 0 };
            Ok(((w & !LINKABLE) | shared) + NLINK_ONE)
        })
        .map(|_| ())
    }

    /// Adds a link to a live directory (a new subdirectory's `..`).
    pub fn inc_nlink(&self) -> Result<()> {
        self.transition(|w| {
            debug_assert!(w & DEAD == 0);
            if (w & NLINK_MASK) >> 32 >= NLINK_MAX as u64 {
                return Err(Errno::EMLINK);
            }
            Ok(w + NLINK_ONE)
        })
        .map(|_| ())
    }

    /// Removes a link.
    pub fn dec_nlink(&self) -> Fate {
        let r = self.transition(|w| {
            assert!(w & NLINK_MASK != 0, "nlink underflow on ino {}", self.ino);
            Ok(w - NLINK_ONE)
        });
        match r {
            Ok((_, new)) => fate_of(self, new),
            _ => Fate::Lives,
        }
    }

    /// Marks the inode `EMPTIED` if it has no link and its references are all the kernel's
    /// lookup references, `lookups()` being their count as `notify.rs` keeps it; returns
    /// whether this call marked it (the caller then gives its contents back). The caller
    /// found that the kernel no longer holds the inode (so those lookups are only waiting
    /// for their FORGET: `fs/unlinked.rs`), and holds the file's data lock, which every
    /// caller of this function takes first, so no two checks of one inode overlap.
    ///
    /// Why the count read apart from the word is enough: a kernel lookup raises the word
    /// before the count, and a FORGET lowers the count before the word, so the count never
    /// exceeds the lookups the word holds. The check sets `CHECKING`, reads the count, and
    /// sets `EMPTIED` with a compare-and-swap from the word it marked: every other
    /// transition clears `CHECKING` and only the holder of the data lock sets it, so that
    /// swap succeeds only if the word did not change between the mark and the swap. Then
    /// the references were constant all along, the lookups among them too, and at the read
    /// at least as many as the count read, which equals the references: none of them was
    /// an open handle or an operation's hold. A race makes the check give up
    /// (the inode then keeps its contents until its FORGET, or until a later check), never
    /// mark wrongly; the transition that raced it tells its own caller ([`Fate::Unnamed`]),
    /// which notes the file for a later check.
    pub fn empty(&self, lookups: impl FnOnce() -> u64) -> bool {
        let cur = self.life.load(SeqCst);
        let refs = cur & REFS_MASK;
        if cur & (DEAD | EMPTIED | CHECKING | NLINK_MASK) != 0 || refs == 0 {
            return false;
        }
        let marked = cur | CHECKING;
        if self
            .life
            .compare_exchange(cur, marked, SeqCst, SeqCst)
            .is_err()
        {
            return false;
        }
        if lookups() == refs {
            return self
                .life
                .compare_exchange(marked, cur | EMPTIED, SeqCst, SeqCst)
                .is_ok();
        }
        // Unmarked unless a transition did so already.
        let _ = self.life.compare_exchange(marked, cur, SeqCst, SeqCst);
        false
    }

    /// Removes every link (a directory being removed).
    pub fn clear_nlink(&self) -> Fate {
        let r = self.transition(|w| Ok(w & !NLINK_MASK));
        match r {
            Ok((_, new)) => fate_of(self, new),
            _ => Fate::Lives,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attr::AttrVals;

    fn file(nlink: u32, refs: u32) -> Inode {
        let t = Timespec::default();
        let attr = AttrCell::new(AttrVals {
            mode: libc::S_IFREG | 0o644,
            flags: 0,
            uid: 0,
            gid: 0,
            size: 0,
            blocks: 0,
            atime: t,
            mtime: t,
            ctime: t,
        });
        Inode::new(
            InodeId {
                ino: Ino(5),
                generation: Generation(1),
            },
            nlink,
            refs,
            attr,
            Body::File(Default::default()),
        )
    }

    #[test]
    fn last_unlink_frees_only_without_refs() {
        let i = file(1, 1);
        assert_eq!(i.dec_nlink(), Fate::Unnamed, "an open handle keeps it");
        assert_eq!(i.nlink(), 0);
        assert_eq!(
            i.link_existing(),
            Err(Errno::ENOENT),
            "cannot relink an unlinked file"
        );
        assert_eq!(i.put_refs(1), Fate::Free, "last close frees");
        assert!(i.is_dead());
        assert_eq!(i.get_ref(), Err(Errno::ENOENT), "no resurrection");
    }

    #[test]
    fn only_lookups_left_empty_the_inode_and_nothing_is_taken_after() {
        // One lookup and one open handle: not while the handle is there.
        let i = file(1, 2);
        assert_eq!(i.dec_nlink(), Fate::Unnamed);
        assert!(!i.empty(|| 1), "a handle is left");
        assert_eq!(i.put_refs(1), Fate::Unnamed);
        assert!(!i.empty(|| 0), "a lookup the count does not know of yet");
        assert!(i.empty(|| 1));
        assert!(i.is_emptied() && !i.empty(|| 1), "once");
        assert_eq!(i.get_ref(), Err(Errno::ESTALE), "nothing is taken on it");
        assert_eq!(i.link_existing(), Err(Errno::ENOENT));
        assert_eq!(i.put_refs(1), Fate::Free, "the FORGET frees it");
        assert!(
            i.is_dead() && i.is_emptied(),
            "the dead word keeps the mark"
        );
        // A named inode, or one a transition changed during the check, is not emptied.
        let i = file(1, 1);
        assert!(!i.empty(|| 1));
        assert_eq!(i.dec_nlink(), Fate::Unnamed);
        assert!(!i.empty(|| {
            i.get_ref().unwrap();
            assert_eq!(i.put_refs(1), Fate::Unnamed);
            1
        }));
        assert_eq!(i.refs(), 1);
        assert!(i.empty(|| 1), "the check that raced left no mark behind");
    }

    #[test]
    fn exactly_one_thread_frees() {
        // Many threads drop one reference each; exactly one of them must be told to free.
        for _ in 0..200 {
            let i = file(0, 8);
            let frees = std::sync::atomic::AtomicU32::new(0);
            std::thread::scope(|s| {
                for _ in 0..8 {
                    s.spawn(|| {
                        if i.put_refs(1) == Fate::Free {
                            frees.fetch_add(1, Relaxed);
                        }
                    });
                }
            });
            assert_eq!(frees.load(Relaxed), 1);
        }
    }

    fn tmpfile(refs: u32, linkable: bool) -> Inode {
        let i = file(0, refs);
        Inode::new_unnamed(i.id(), refs, linkable, AttrCell::new(i.attr.load()), i.body)
    }

    #[test]
    fn a_tmpfile_takes_one_first_name_and_is_an_unlinked_file_after() {
        let i = tmpfile(1, true);
        assert!(i.is_linkable());
        assert_eq!(i.nlink(), 0);
        assert_eq!(i.link_existing(), Ok(true), "its first name");
        assert!(!i.is_linkable(), "the mark goes with the first link");
        assert_eq!(i.nlink(), 1);
        assert_eq!(i.link_existing(), Ok(false), "a second name, as any file");
        assert_eq!(i.dec_nlink(), Fate::Lives);
        assert_eq!(i.dec_nlink(), Fate::Unnamed, "its handle keeps it");
        assert_eq!(
            i.link_existing(),
            Err(Errno::ENOENT),
            "named once and unlinked: as an unlinked open file"
        );
        assert_eq!(i.put_refs(1), Fate::Free);
    }

    #[test]
    fn an_excl_tmpfile_is_never_linked_and_a_failed_link_keeps_the_mark() {
        let i = tmpfile(1, false);
        assert!(!i.is_linkable());
        assert_eq!(i.link_existing(), Err(Errno::ENOENT));
        assert_eq!(i.put_refs(1), Fate::Free, "freed with its last reference");

        let i = tmpfile(1, true);
        assert_eq!(i.link_existing(), Ok(true));
        assert_eq!(i.unlink_failed(true), Fate::Unnamed, "the handle keeps it");
        assert!(i.is_linkable(), "as before the attempt");
        assert_eq!(i.nlink(), 0);
        assert_eq!(
            i.put_refs(1),
            Fate::Free,
            "a linkable mark does not keep an inode nobody holds"
        );
        assert!(i.is_dead());
        assert_eq!(i.link_existing(), Err(Errno::ENOENT), "dead");
    }

    #[test]
    fn racing_first_links_make_two_names() {
        for _ in 0..200 {
            let i = tmpfile(1, true);
            let firsts = std::sync::atomic::AtomicU32::new(0);
            std::thread::scope(|s| {
                for _ in 0..4 {
                    s.spawn(|| {
                        if i.link_existing() == Ok(true) {
                            firsts.fetch_add(1, Relaxed);
                        }
                    });
                }
            });
            assert_eq!(firsts.load(Relaxed), 1, "one link takes the mark");
            assert_eq!(i.nlink(), 4);
        }
    }

    #[test]
    fn link_limits() {
        let i = file(NLINK_MAX, 0);
        assert_eq!(i.link_existing(), Err(Errno::EMLINK));
        assert_eq!(i.nlink(), NLINK_MAX);
        assert_eq!(i.refs(), 0);
        assert_eq!(i.clear_nlink(), Fate::Free);
    }
}
