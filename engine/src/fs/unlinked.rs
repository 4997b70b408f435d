//! Unlinked files that only the kernel's lookup references hold: their contents go when the
//! kernel no longer holds them, not at their FORGET (issue 35, item 2).
//!
//! Through a FUSE mount in no-open mode (docs/DESIGN.md §7) the kernel opens files without
//! telling the server: a file a process has open and one the kernel merely caches both hold
//! one thing here, the kernel's lookup reference, dropped by the FORGET that follows the
//! inode's eviction. The kernel evicts an unlinked file that nothing holds (no open file, no
//! `O_PATH` descriptor, no path walk in progress) within the `unlink(2)` itself, after the
//! UNLINK's answer and before the call returns, and queues its FORGET; the server reads that
//! FORGET on another thread, so a request that follows the unlink (`df`, an `fallocate` that
//! needs the room, `lanefs stats`) could come first, and found the space and the inode still
//! taken: xfstests generic/213 (`fallocate -l 1g a; fallocate -l 1g b; rm a b; fallocate
//! -l 1g c` on 2 GiB) failed with ENOSPC, where tmpfs frees an unlinked file nobody holds as
//! `unlink` returns.
//!
//! So a regular file whose last name goes, or whose last open handle or operation lets go
//! after that, while the kernel's lookups still hold it, is noted here ([`Unlinked::note`]).
//! Where its room matters, [`Filesystem::reap_unlinked`] asks the kernel whether it still
//! holds each noted inode: an attributes-only inode invalidation through the installed sink,
//! which the kernel answers ENOENT for an inode it does not hold (its lookup of the inode
//! then fails) and, for one it does, only marks the attributes stale. An inode the kernel
//! no longer holds can never be held by it again (it has no name, and a LOOKUP of `.` by
//! number is refused for an unlinked inode), and a file the kernel holds open is one it
//! holds; so when the answer is ENOENT the remaining references are lookups whose FORGET is
//! on its way, and the file is **emptied** (`inode.rs`, `EMPTIED`): its pages, their space,
//! its xattrs and its count against the inode limit are given back, and the store is told
//! it is gone (`Free`). The inode itself stays in the table until the FORGET (a GETATTR
//! still answers: link count 0, no blocks; anything else is ESTALE, on which the kernel
//! walks a path again). A library handle on the file keeps it: [`Inode::empty`] takes only
//! an inode whose references are all the kernel's lookups.
//!
//! The engine asks at [`Filesystem::statfs`] (`df`, `lanefs stats`), and the FUSE server
//! asks before it answers a request ENOSPC. Any request made after an `unlink` returned
//! finds the file emptied if nothing held it then: the eviction was part of that `unlink`.
//! The pages of a file not asked about go at its FORGET, a moment later, as before.
//!
//! **Asking races the FORGET.** The FORGET the eviction queued may be served on another
//! thread while the question is asked, and then its effects are half made: its count
//! lowered but not yet the inode's references (so the check of [`Inode::empty`] fails), or
//! the inode dead but its pages, space and inode count not yet given back. A `df` read then
//! showed a removed file's space or inode still taken, at random (about once in 4 on a store
//! mount). So a noted file leaves the set only when whoever gives its contents back is done
//! (the end of `Filesystem::free_inode`, or of the emptying), a FORGET of a noted file
//! marks its entry for its length ([`Unlinked::begin_forget`]), and the asker waits for
//! either before it moves on ([`Unlinked::wait_while`]): once it is done asking, every file
//! the kernel no longer held has been given back, by it or by the FORGET.
//!
//! Costs: a noted file is one set entry (sharded by inode number) until it is emptied or
//! freed; a filesystem with nothing noted pays one atomic load per `statfs` and per free
//! (no set is touched); asking sends one invalidation per noted file, only where room is
//! wanted or counted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::*};

use crossbeam_epoch as epoch;
use parking_lot::{Condvar, Mutex};

use super::Filesystem;
use crate::attr::flags;
use crate::id::Ino;
use crate::inode::{Body, Fate, Inode};
use crate::record::Record;
use crate::stats::LockClass;

/// Shards of the set.
const SHARDS: usize = 64;

/// A noted file's entry: the FORGETs of it under way, and how many have ended.
#[derive(Clone, Copy, Default, PartialEq, Debug)]
struct Entry {
    forgets: u32,
    ended: u32,
}

/// The unlinked files the kernel's lookups alone may hold (module doc).
pub(crate) struct Unlinked {
    shards: Box<[Mutex<HashMap<Ino, Entry>>]>,
    /// Entries in all shards (an upper bound while one is being added or taken out).
    len: AtomicUsize,
    /// Askers waiting for an entry to change ([`Unlinked::wait_while`]); the lock and the
    /// condition variable are touched only while one waits. Lock order: `wait` before a
    /// shard (a changer releases its shard before it takes `wait`).
    waiters: AtomicUsize,
    wait: Mutex<()>,
    changed: Condvar,
}

impl Default for Unlinked {
    fn default() -> Unlinked {
        Unlinked {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            len: AtomicUsize::new(0),
            waiters: AtomicUsize::new(0),
            wait: Mutex::new(()),
            changed: Condvar::new(),
        }
    }
}

impl Unlinked {
    fn shard(&self, ino: Ino) -> &Mutex<HashMap<Ino, Entry>> {
        &self.shards[ino.get() as usize % SHARDS]
    }

    /// Notes `ino`.
    fn note(&self, ino: Ino) {
        let mut s = self.shard(ino).lock();
        if let std::collections::hash_map::Entry::Vacant(e) = s.entry(ino) {
            e.insert(Entry::default());
            self.len.fetch_add(1, SeqCst);
        }
    }

    /// Forgets inode `i` (freed, or emptied), once its contents are given back.
    pub(crate) fn forget(&self, i: &Inode) {
        if self.len.load(SeqCst) == 0 || !matches!(i.body, Body::File(_)) {
            return;
        }
        self.remove(i.ino);
    }

    fn remove(&self, ino: Ino) {
        let removed = self.shard(ino).lock().remove(&ino).is_some();
        if removed {
            self.len.fetch_sub(1, SeqCst);
            self.wake();
        }
    }

    /// Marks the start of a FORGET of `ino`, before it lowers any count, if `ino` is noted;
    /// returns whether it is (then [`Unlinked::end_forget`] follows).
    pub(crate) fn begin_forget(&self, ino: Ino) -> bool {
        if self.len.load(SeqCst) == 0 {
            return false;
        }
        match self.shard(ino).lock().get_mut(&ino) {
            Some(e) => {
                e.forgets += 1;
                true
            }
            None => false,
        }
    }

    /// Marks the end of a FORGET [`Unlinked::begin_forget`] marked (the entry may be gone:
    /// the FORGET freed the file).
    pub(crate) fn end_forget(&self, ino: Ino) {
        if let Some(e) = self.shard(ino).lock().get_mut(&ino) {
            // An entry noted afresh during the FORGET holds no mark of it.
            e.forgets = e.forgets.saturating_sub(1);
            e.ended = e.ended.wrapping_add(1);
        }
        self.wake();
    }

    fn entry(&self, ino: Ino) -> Option<Entry> {
        self.shard(ino).lock().get(&ino).copied()
    }

    /// Wakes the askers waiting for an entry to change. Called with no shard held, after
    /// the change.
    fn wake(&self) {
        if self.waiters.load(SeqCst) > 0 {
            let _g = self.wait.lock();
            self.changed.notify_all();
        }
    }

    /// Waits, holding no engine lock, while `ino`'s entry (`None` once it is gone) is as
    /// `busy` says. Every change of an entry wakes the waiters (`wake`), after it, under
    /// `wait`, which the waiter holds from its check to its sleep: no change is missed.
    fn wait_while(&self, ino: Ino, busy: impl Fn(Option<Entry>) -> bool) {
        self.waiters.fetch_add(1, SeqCst);
        let mut g = self.wait.lock();
        while busy(self.entry(ino)) {
            self.changed.wait(&mut g);
        }
        drop(g);
        self.waiters.fetch_sub(1, SeqCst);
    }

    /// The inodes noted now.
    fn noted(&self) -> Vec<Ino> {
        if self.len.load(SeqCst) == 0 {
            return Vec::new();
        }
        self.shards
            .iter()
            .flat_map(|s| s.lock().keys().copied().collect::<Vec<_>>())
            .collect()
    }
}

impl Filesystem {
    /// What the caller of a lifecycle transition of `i` does next ([`Fate`]): frees the
    /// inode, or notes it as an unlinked file the kernel's lookups may alone hold (module
    /// doc), or nothing.
    pub(crate) fn settle(&self, i: &Inode, fate: Fate, g: &epoch::Guard) {
        match fate {
            Fate::Free => self.free_inode(i, g, true),
            Fate::Unnamed => {
                if matches!(i.body, Body::File(_))
                    && !self.replaying()
                    && self.watch.held.get(i.ino) > 0
                {
                    self.unlinked.note(i.ino);
                }
            }
            Fate::Lives => {}
        }
    }

    /// Empties every noted unlinked file the kernel no longer holds (module doc): gives back
    /// its pages, space, xattrs and inode count now instead of at its FORGET, or waits for
    /// the FORGET under way to have freed it. Returns how many files it emptied. Called
    /// with no lock held (it asks the kernel, through the installed sink, takes each file's
    /// data lock, and waits for FORGETs).
    pub fn reap_unlinked(&self) -> u64 {
        let noted = self.unlinked.noted();
        if noted.is_empty() {
            return 0;
        }
        let Some(kernel) = self.watch.installed() else {
            return 0;
        };
        let forgetting = |e: Option<Entry>| e.is_some_and(|e| e.forgets > 0);
        let mut emptied = 0;
        for ino in noted {
            loop {
                // A FORGET under way is waited for: it may have lowered the kernel's count
                // of the file and not yet its references.
                self.unlinked.wait_while(ino, forgetting);
                let Some(before) = self.unlinked.entry(ino) else {
                    break; // given back by whoever took it out
                };
                let g = epoch::pin();
                let Some(i) = self.resident(ino, &g) else {
                    self.unlinked.remove(ino); // freed in full
                    break;
                };
                if i.is_dead() || i.is_emptied() {
                    // Its freeing or emptying is under way; it takes the entry out when done.
                    drop(g);
                    self.unlinked.wait_while(ino, |e| e.is_some());
                    break;
                }
                // A file the kernel holds (open, or on its way) stays noted; one it does not
                // is emptied unless a handle of the library's holds it.
                if kernel.inode(ino, None) {
                    break;
                }
                // The coarse mode's lock, as every change takes it (not counted as an
                // operation).
                let c = (self.cfg.locking == crate::Locking::Coarse)
                    .then(|| self.stats.lock(LockClass::Coarse, &self.coarse));
                let done = self.empty_unlinked(i);
                drop(c);
                if done {
                    emptied += 1;
                    break;
                }
                if self.unlinked.entry(ino) != Some(before) || i.is_dead() {
                    continue; // a FORGET raced the check: look again once it is done
                }
                // A library handle or operation holds it; its release notes it again.
                self.unlinked.remove(ino);
                break;
            }
        }
        emptied
    }

    /// Gives back the contents of regular file `i`, which has no name and which the kernel
    /// does not hold, if the only references left on it are the kernel's lookups: its pages
    /// and their space, its xattrs, its count against the inode limit; tells the store it is
    /// gone (`Free`), and takes it out of the set. Takes the file's data lock.
    fn empty_unlinked(&self, i: &Inode) -> bool {
        let Body::File(data) = &i.body else {
            return false;
        };
        let mut d = self.stats.write(LockClass::FileData, data);
        if !i.empty(|| self.watch.held.get(i.ino)) {
            return false;
        }
        if self.durable {
            // As in `free_inode`: a store that cannot take it loses nothing the recovery of
            // an orphan would not drop.
            let _ = self.store.append(&Record::Free { inode: i.id() });
        }
        self.space.give(d.clear(&self.page_epochs));
        let had_xattrs = i.attr.flags() & flags::XATTRS != 0;
        let _ = i.attr.update::<(), ()>(&self.stats, |v| {
            v.blocks = 0;
            v.flags &= !(flags::XATTRS | flags::ACL | flags::DEFAULT_ACL);
            Ok(())
        });
        drop(d);
        if had_xattrs {
            self.xattrs.lock(i.ino, &self.stats).remove(&i.ino);
        }
        self.inode_quota.give(1);
        self.unlinked.forget(i);
        true
    }
}
