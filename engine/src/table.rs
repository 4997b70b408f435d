//! The inode table: inode number → inode, read without locks or reference counts.
//!
//! Inode numbers are dense (allocated in per-thread batches and recycled, `ids.rs`), so the
//! table is a two-level array of atomic pointers rather than a hash map: `lookup` of a parent
//! directory, `getattr` and every path-walk step are two dependent loads, and write nothing
//! (docs/DESIGN.md §3: no reference-count bump on a shared parent). Leaf chunks are allocated
//! on first use and live as long as the table.
//!
//! # Reclamation
//! Slots hold `crossbeam_epoch::Atomic<Inode>`. Readers load under an epoch guard; removal swaps
//! the slot to null (so the number can be reused at once) and defers the inode's memory until
//! every guard that could have loaded it is gone. A reader may therefore hold a pointer to an
//! inode that is no longer in the table: callers compare generations ([`InodeTable::get_gen`])
//! or check the inode's lifecycle word, and never resurrect a dead inode (`inode.rs`).
//!
//! The eviction pass of a lazily loaded filesystem (`fs/lazy.rs`) also takes live inodes out
//! ([`InodeTable::detach`]) and either puts them back ([`InodeTable::reinstall`]) or destroys
//! them after the same grace period.

use std::sync::atomic::{AtomicPtr, Ordering::*};

use crossbeam_epoch::{Atomic, Guard, Owned, Shared};

use crate::id::{INO_BITS, Ino, InoGen, MAX_INO};
use crate::inode::Inode;

const LEAF_BITS: u32 = 14;
const LEAF: usize = 1 << LEAF_BITS;
const TOP: usize = 1 << (INO_BITS - LEAF_BITS);
const _: () = assert!((TOP * LEAF - 1) as u64 == MAX_INO);

type Leaf = [Atomic<Inode>; LEAF];

pub(crate) struct InodeTable {
    top: Box<[AtomicPtr<Leaf>]>,
}

impl InodeTable {
    pub fn new() -> Self {
        InodeTable {
            top: (0..TOP)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
        }
    }

    #[inline]
    fn leaf(&self, ino: Ino) -> Option<&Leaf> {
        let p = self.top.get((ino.0 >> LEAF_BITS) as usize)?.load(Acquire);
        // SAFETY: a non-null top entry points to a leaf leaked from a Box in `leaf_or_alloc`;
        // leaves are freed only in `Drop`, which has `&mut self`, so it outlives `&self`.
        unsafe { p.as_ref() }
    }

    fn leaf_or_alloc(&self, ino: Ino) -> &Leaf {
        if let Some(l) = self.leaf(ino) {
            return l;
        }
        let fresh: Box<Leaf> = (0..LEAF)
            .map(|_| Atomic::null())
            .collect::<Vec<_>>()
            .into_boxed_slice()
            .try_into()
            .unwrap_or_else(|_| unreachable!("LEAF elements"));
        let fresh = Box::into_raw(fresh);
        let entry = &self.top[(ino.0 >> LEAF_BITS) as usize];
        if let Err(_winner) = entry.compare_exchange(std::ptr::null_mut(), fresh, AcqRel, Acquire) {
            // SAFETY: `fresh` came from Box::into_raw above and was never published.
            drop(unsafe { Box::from_raw(fresh) });
        }
        self.leaf(ino).expect("leaf installed")
    }

    /// The inode in slot `ino`, if any.
    #[inline]
    pub fn get<'g>(&self, ino: Ino, g: &'g Guard) -> Option<&'g Inode> {
        let slot = &self.leaf(ino)?[(ino.0 as usize) & (LEAF - 1)];
        // SAFETY: inodes leave the table through `try_remove`, which defers their
        // destruction until every guard pinned before the removal is dropped, or through
        // `detach`, whose caller destroys them only after such a grace period
        // (`fs/lazy.rs`, "Eviction"); `g` is such a guard or newer, so the pointer stays valid
        // for `'g`.
        unsafe { slot.load(Acquire, g).as_ref() }
    }

    /// The inode `key` names (not another that held or holds its number).
    #[inline]
    pub fn get_gen<'g>(&self, key: InoGen, g: &'g Guard) -> Option<&'g Inode> {
        self.get(key.ino(), g).filter(|i| i.key() == key)
    }

    /// Publishes a new inode in its (empty) slot and returns it.
    pub fn install<'g>(&self, inode: Inode, g: &'g Guard) -> &'g Inode {
        let ino = inode.ino;
        assert!(ino.0 <= MAX_INO, "ino {ino} beyond table");
        let slot = &self.leaf_or_alloc(ino)[(ino.0 as usize) & (LEAF - 1)];
        let new = Owned::new(inode).into_shared(g);
        // Release: the inode's fields are visible to whoever loads the pointer with Acquire.
        let prev = slot.swap(new, AcqRel, g);
        assert!(prev.is_null(), "slot {ino} reused while occupied");
        // SAFETY: `new` was just published and is destroyed only through `try_remove` (see `get`).
        unsafe { new.deref() }
    }

    /// Publishes an inode a store loaded (`fs/lazy.rs`), built in place (a directory's
    /// entries point into its body before it is published), in its slot, which must be
    /// empty: a number the store holds is never handed out while its inode is not loaded.
    pub fn install_loaded<'g>(&self, inode: Owned<Inode>, g: &'g Guard) -> &'g Inode {
        let ino = inode.ino;
        assert!(ino.0 <= MAX_INO, "ino {ino} beyond table");
        let slot = &self.leaf_or_alloc(ino)[(ino.0 as usize) & (LEAF - 1)];
        let new = inode.into_shared(g);
        // Release: as `install`.
        let prev = slot.swap(new, AcqRel, g);
        assert!(prev.is_null(), "slot {ino} loaded while occupied");
        // SAFETY: as `install`.
        unsafe { new.deref() }
    }

    /// Takes `inode` out of its slot without destroying it, if the slot holds it (the
    /// eviction pass parks it: `fs/lazy.rs`, "Eviction"); the caller owns the pointer
    /// returned until it gives it back with [`InodeTable::reinstall`] or destroys it after a
    /// grace period.
    pub fn detach(&self, inode: &Inode, g: &Guard) -> Option<*mut Inode> {
        let slot = self.slot_of(inode)?;
        let cur = Shared::from(inode as *const Inode);
        // (On success, crossbeam returns the pointer written, not the one replaced.)
        slot.compare_exchange(cur, Shared::null(), AcqRel, Acquire, g)
            .ok()
            .map(|_| cur.as_raw() as *mut Inode)
    }

    /// Empties the slot of `inode`, if it holds it (false: the eviction pass has it parked,
    /// `fs/lazy.rs`), and schedules the inode's destruction after every current guard. The
    /// caller owns the inode's `DEAD` transition, so nothing can reach it any more except
    /// readers already holding a pointer.
    pub fn try_remove(&self, inode: &Inode, g: &Guard) -> bool {
        let Some(slot) = self.slot_of(inode) else {
            return false;
        };
        let cur = Shared::from(inode as *const Inode);
        match slot.compare_exchange(cur, Shared::null(), AcqRel, Acquire, g) {
            Ok(_) => {
                // SAFETY: `cur` is unreachable from the table now; readers that loaded it
                // hold guards pinned no later than this one, and `defer_destroy` waits for
                // all of them.
                unsafe { g.defer_destroy(cur) };
                true
            }
            Err(_) => false,
        }
    }

    fn slot_of(&self, inode: &Inode) -> Option<&Atomic<Inode>> {
        Some(&self.leaf(inode.ino)?[(inode.ino.0 as usize) & (LEAF - 1)])
    }

    /// Puts an inode [`InodeTable::detach`] took out back in its slot, which must be empty.
    ///
    /// # Safety
    /// `inode` came from `detach` and was neither destroyed nor reinstalled since.
    pub unsafe fn reinstall<'g>(&self, inode: *mut Inode, g: &'g Guard) -> &'g Inode {
        // SAFETY: the caller says `inode` is a live detached inode, owned by no slot.
        let ino = unsafe { (*inode).ino };
        let slot = &self.leaf_or_alloc(ino)[(ino.0 as usize) & (LEAF - 1)];
        let new = Shared::from(inode as *const Inode);
        let prev = slot.swap(new, AcqRel, g);
        assert!(prev.is_null(), "slot {ino} reinstalled while occupied");
        // SAFETY: as `install`: published again, destroyed only through `try_remove`.
        unsafe { new.deref() }
    }
}

impl InodeTable {
    /// Calls `f` on every inode in the table (for the invariant checker).
    pub fn for_each<'g>(&self, g: &'g Guard, mut f: impl FnMut(&'g Inode)) {
        for entry in self.top.iter() {
            // SAFETY: as in `leaf`: leaves live as long as the table.
            let Some(leaf) = (unsafe { entry.load(Acquire).as_ref() }) else {
                continue;
            };
            for slot in leaf.iter() {
                // SAFETY: as in `get`: the guard keeps loaded inodes alive.
                if let Some(i) = unsafe { slot.load(Acquire, g).as_ref() } {
                    f(i);
                }
            }
        }
    }
}

impl InodeTable {
    /// Calls `f` on the inodes numbered `start` and up, then on those below `start`, until
    /// `f` returns false; returns the number of the inode it stopped at (`None`: it went
    /// round). The eviction pass's clock hand (`fs/cache.rs`). Re-pins `g` between leaves, so
    /// `f` must not keep an inode past its call.
    pub fn for_each_from(
        &self,
        start: Ino,
        g: &mut Guard,
        mut f: impl FnMut(&Inode) -> bool,
    ) -> Option<Ino> {
        let first = (start.0 as usize).min(TOP * LEAF - 1);
        // Leaves from the start's, round to it again (its slots below `first` last).
        for k in 0..=TOP {
            let top = ((first >> LEAF_BITS) + k) % TOP;
            let slots = match k {
                0 => first & (LEAF - 1)..LEAF,
                k if k == TOP => 0..first & (LEAF - 1),
                _ => 0..LEAF,
            };
            g.repin();
            // SAFETY: as in `leaf`: leaves live as long as the table.
            let Some(leaf) = (unsafe { self.top[top].load(Acquire).as_ref() }) else {
                continue;
            };
            for n in slots {
                // SAFETY: as in `get`: the guard keeps loaded inodes alive until it is
                // re-pinned, which happens only between leaves, after `f` returned.
                if let Some(i) = unsafe { leaf[n].load(Acquire, g).as_ref() } {
                    if !f(i) {
                        return Some(Ino(((top << LEAF_BITS) + n) as u64));
                    }
                }
            }
        }
        None
    }
}

impl Drop for InodeTable {
    fn drop(&mut self) {
        for entry in self.top.iter() {
            let p = entry.load(Acquire);
            if p.is_null() {
                continue;
            }
            // SAFETY: `p` came from Box::into_raw in `leaf_or_alloc`; `&mut self` means no reader.
            let leaf = unsafe { Box::from_raw(p) };
            for slot in leaf.iter() {
                // SAFETY: no other thread can access the table during drop.
                let g = unsafe { crossbeam_epoch::unprotected() };
                let s = slot.load(Acquire, g);
                if !s.is_null() {
                    // SAFETY: the slot owns the inode, and nothing else references it any more.
                    drop(unsafe { s.into_owned() });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attr::{AttrCell, AttrVals};
    use crate::id::{Generation, InodeId};
    use crate::inode::Body;
    use crate::time::Timespec;

    fn id(ino: u64, generation: u64) -> InodeId {
        InodeId {
            ino: Ino(ino),
            generation: Generation(generation),
        }
    }

    fn inode(id: InodeId) -> Inode {
        let t = Timespec::default();
        let attr = AttrCell::new(AttrVals {
            mode: libc::S_IFREG,
            flags: 0,
            uid: 0,
            gid: 0,
            size: 0,
            blocks: 0,
            atime: t,
            mtime: t,
            ctime: t,
        });
        Inode::new(id, 1, 0, attr, Body::Special { rdev: 0 })
    }

    #[test]
    fn install_get_remove_reuse_with_generation() {
        let t = InodeTable::new();
        let g = crossbeam_epoch::pin();
        assert!(t.get(Ino(77), &g).is_none());
        let a = t.install(inode(id(77, 1)), &g);
        assert_eq!(t.get(Ino(77), &g).unwrap().id(), id(77, 1));
        assert!(t.try_remove(a, &g));
        assert!(!t.try_remove(a, &g), "removed once");
        assert!(t.get(Ino(77), &g).is_none());
        // The number is reusable at once; the old generation no longer matches.
        t.install(inode(id(77, 2)), &g);
        assert!(t.get_gen(id(77, 1).key(), &g).is_none());
        assert!(t.get_gen(id(77, 2).key(), &g).is_some());
        assert!(
            t.get(Ino(MAX_INO + 1), &g).is_none(),
            "beyond the table is simply absent"
        );
        // Far leaves are allocated on demand.
        t.install(inode(id(MAX_INO, 3)), &g);
        assert!(t.get(Ino(MAX_INO), &g).is_some());
    }
}
