//! Inodes: attributes, kind-specific body, and the lifecycle word.
//!
//! # The lifecycle word (`Inode::life`)
//! One `AtomicU64` packs three things so that "is this inode still reachable, and may it be
//! freed" is decided by single atomic transitions, never by reading two fields apart:
//!
//! ```text
//!   bit 63   bit 62     bit 61   bits 60..32        bits 31..0
//!   DEAD     LINKABLE   SHARED   nlink (29 bits)    refs (32 bits)
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
//! - `DEAD` is set exactly once, by the transition that sees `nlink == 0 && refs == 0`
//!   (whatever `LINKABLE` says); its winner frees the inode (removes it from the inode table,
//!   which defers the memory to epoch reclamation, and recycles the number). Once set, no
//!   transition succeeds: a lookup that raced the last unlink and still holds a pointer to
//!   the inode fails to take a reference ([`Inode::get_ref`]) instead of resurrecting it.
//!
//! All transitions are compare-and-swap loops on the one word, so they have a single
//! modification order; each returns what the caller must do ([`Fate`]).

use std::sync::atomic::{AtomicU64, Ordering::*};

use parking_lot::{Mutex, RwLock};

use crate::attr::{AttrCell, FileType};
use crate::data::FileData;
use crate::dir::Runs;
use crate::dir::life::DirLife;
use crate::errno::{Errno, Result};
use crate::id::{Generation, Ino, InoGen, InodeId};

const REFS_MASK: u64 = (1 << 32) - 1;
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
}

/// State a directory keeps beyond its attributes. Its entries live in the filesystem-wide
/// tables (`dir/`), so an empty directory costs only this.
pub(crate) struct DirBody {
    /// ALIVE, DYING or DEAD: the removal protocol of `dir/life.rs`.
    pub life: DirLife,
    /// The parent directory (an `InoGen`; the root's is itself). Changed only under the
    /// `rename` lock, by a rename that moves this directory.
    pub parent: AtomicU64,
    /// The ordered index of the directory's entries (`dir/index.rs`).
    pub runs: Runs,
    /// The per-directory lock of the `dirlock` locking mode; unused under `lanes`.
    pub lock: Mutex<()>,
    /// A byte with one valid value: its 255 invalid values hold [`Body`]'s variant tag (the
    /// other variants fit beside it), so `Body` costs 24 bytes, not 32.
    _niche: DirNiche,
}

#[derive(Clone, Copy)]
#[repr(u8)]
enum DirNiche {
    Dir = 0,
}

// An inode is allocated per file: keep it in mimalloc's 112-byte size class
// (docs/BENCHMARKS.md, "Memory per file").
// (Not under loom, whose atomics are larger.)
#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<Body>() == 24);
#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<Inode>() == 112);

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
}

impl Inode {
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
            attr,
            body,
        }
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

    /// Applies `f` to the word until it succeeds; `f` returns the new word or an error.
    fn transition(&self, mut f: impl FnMut(u64) -> Result<u64>) -> Result<(u64, u64)> {
        let mut cur = self.life.load(Acquire);
        loop {
            let new = f(cur)?;
            match self.life.compare_exchange_weak(cur, new, AcqRel, Acquire) {
                Ok(_) => return Ok((cur, new)),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Sets `DEAD` if the word has neither links nor references (a `LINKABLE` mark goes
    /// with it: no one holds the file any more to link it).
    fn reap(&self) -> Fate {
        let mut cur = self.life.load(Acquire);
        while idle(cur) {
            match self.life.compare_exchange(cur, DEAD, AcqRel, Acquire) {
                Ok(_) => return Fate::Free,
                Err(actual) => cur = actual,
            }
        }
        Fate::Lives
    }

    /// Takes a reference (open handle or kernel lookup). Fails on a dead inode.
    pub fn get_ref(&self) -> Result<()> {
        self.transition(|w| {
            if w & DEAD != 0 {
                return Err(Errno::ENOENT);
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
            Ok((_, new)) if idle(new) => self.reap(),
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
            Ok((_, new)) if idle(new) => self.reap(),
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
            if w & DEAD != 0 || nlink == 0 && w & LINKABLE == 0 {
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
            Ok((_, new)) if idle(new) => self.reap(),
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
            Ok((_, new)) if idle(new) => self.reap(),
            _ => Fate::Lives,
        }
    }

    /// Removes every link (a directory being removed).
    pub fn clear_nlink(&self) -> Fate {
        let r = self.transition(|w| Ok(w & !NLINK_MASK));
        match r {
            Ok((_, new)) if idle(new) => self.reap(),
            _ => Fate::Lives,
        }
    }
}

impl DirBody {
    pub fn new(parent: InoGen) -> Self {
        DirBody {
            life: DirLife::new(),
            parent: AtomicU64::new(parent.raw()),
            runs: Runs::new(),
            lock: Mutex::new(()),
            _niche: DirNiche::Dir,
        }
    }

    /// The parent directory's word.
    #[inline]
    pub fn parent(&self) -> InoGen {
        InoGen::from_raw(self.parent.load(Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attr::AttrVals;
    use crate::time::Timespec;

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
        assert_eq!(i.dec_nlink(), Fate::Lives, "an open handle keeps it");
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
        assert_eq!(i.dec_nlink(), Fate::Lives, "its handle keeps it");
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
        assert_eq!(i.unlink_failed(true), Fate::Lives, "the handle keeps it");
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
