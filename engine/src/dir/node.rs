//! One directory entry in memory: a single heap allocation holding what the entry names (the
//! inode and its type), its cookie, and its key (`parent` ++ `name`), shared by the dirent
//! map (which owns it) and the ordered index (which refers to it by address).
//!
//! The type is kept so that readdir tells each entry's `d_type` without the inode, which a
//! lazily loaded store would otherwise read for every entry listed (`fs/lazy.rs`).
//!
//! Why by hand: no crate offers a concurrent map and an ordered index that share entries, and
//! keeping each name twice (a `BTreeMap` of names beside the hash map) costs about 250 bytes a
//! file where one node of `16 + 8 + name + 1` bytes costs about 66 (docs/BENCHMARKS.md, "Memory
//! per file").
//!
//! # A node's life
//! A node is created by the creating thread (`Entry::new`), enters the index under its shard
//! lock, then the map; it leaves the map first (the removal's visible moment), then the index,
//! and is freed only then. So a node is alive while it is in either table: readers of the map
//! touch nodes only under their shard lock, readers of the index only under theirs, and the
//! remover frees the node after taking both out. Nothing else holds a pointer to a node.
//! A whiteout's node (an heir, `Dirents::heir`) enters the map first, in a rename's visible
//! moment, and the index just after, in place of the node it replaces, which the renaming
//! thread frees only then; its removal, which needs the name's stripe, waits for the rename
//! to end.

use std::alloc::{Layout, alloc, dealloc, handle_alloc_error};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::*};

use crate::attr::FileType;
use crate::id::InoGen;

/// Longest name (`NAME_MAX`).
pub const NAME_MAX: usize = 255;

/// A name as handed out by readdir (inline up to 16 bytes).
pub(crate) type Name = smallvec::SmallVec<[u8; 16]>;

/// The header of a node; the key bytes (the parent's `InoGen` little-endian, then the name)
/// follow it in the same allocation, at `KEY_OFFSET`, and then one byte, the target's type
/// (its `d_type`, an `AtomicU8`). 16 bytes: a 16-byte name makes a 41-byte node.
///
/// `target` and the type change together, only in a rename, under the write lock of the
/// map shard that holds the node; readers of either take that shard's lock (`mod.rs`), so
/// they always see a pair a rename wrote.
#[repr(C)]
pub(super) struct Node {
    /// The inode the entry names (an `InoGen`); changed in place by a rename over it.
    target: AtomicU64,
    /// The cookie (readdir offset, below `COOKIE_BITS`) and, above it, the key length; fixed
    /// for the node's life.
    cookie_len: u64,
}

const COOKIE_BITS: u32 = 55;
const _: () = assert!((crate::slots::NSLOTS as u64 + 1) << 48 <= 1 << COOKIE_BITS);
const _: () = assert!(8 + NAME_MAX < 1 << (64 - COOKIE_BITS));
const KEY_OFFSET: usize = std::mem::size_of::<Node>();

impl Node {
    #[inline]
    pub(super) fn cookie(&self) -> u64 {
        self.cookie_len & ((1 << COOKIE_BITS) - 1)
    }

    /// The inode the entry names, read without the map shard's lock: a rename may change
    /// it at any moment (for a caller that needs only a recent value).
    #[inline]
    pub(super) fn target_racy(&self) -> InoGen {
        InoGen::from_raw(self.target.load(Acquire))
    }

    #[inline]
    fn key_len(&self) -> usize {
        (self.cookie_len >> COOKIE_BITS) as usize
    }
}

fn node_layout(key_len: usize) -> Layout {
    Layout::from_size_align(KEY_OFFSET + key_len + 1, std::mem::align_of::<Node>())
        .expect("small layout")
}

/// The owner of one node: it lives in the dirent map, or with the thread publishing or
/// removing the entry. Dropping it frees the node (see "A node's life").
pub(crate) struct Entry(NonNull<Node>);

// SAFETY: a node is immutable after creation except `target`, an atomic; an `Entry` is its
// only owner, so moving it to another thread moves the node's ownership with it.
unsafe impl Send for Entry {}
// SAFETY: shared access reads immutable fields and an atomic.
unsafe impl Sync for Entry {}

/// What an entry says: the inode it names, that inode's type, and its cookie.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Dirent {
    pub target: InoGen,
    pub kind: FileType,
    pub cookie: u64,
}

impl Entry {
    pub(super) fn new(
        parent: InoGen,
        name: &[u8],
        (target, kind): (InoGen, FileType),
        cookie: u64,
    ) -> Entry {
        let len = 8 + name.len();
        assert!(cookie < 1 << COOKIE_BITS && name.len() <= NAME_MAX);
        let layout = node_layout(len);
        // SAFETY: the layout has a non-zero size (the header).
        let raw = unsafe { alloc(layout) } as *mut Node;
        let Some(ptr) = NonNull::new(raw) else {
            handle_alloc_error(layout)
        };
        // SAFETY: `raw` is a fresh allocation of `layout`: the header fits at its start
        // (aligned for `Node`), and `len` bytes and the type byte fit at `KEY_OFFSET`.
        unsafe {
            raw.write(Node {
                target: AtomicU64::new(target.raw()),
                cookie_len: (len as u64) << COOKIE_BITS | cookie,
            });
            let key = (raw as *mut u8).add(KEY_OFFSET);
            std::ptr::copy_nonoverlapping(parent.raw().to_le_bytes().as_ptr(), key, 8);
            std::ptr::copy_nonoverlapping(name.as_ptr(), key.add(8), name.len());
            key.add(len).write(kind.dirent_type());
        }
        Entry(ptr)
    }

    #[inline]
    pub(super) fn node(&self) -> &Node {
        // SAFETY: the node lives as long as its owner.
        unsafe { self.0.as_ref() }
    }

    #[inline]
    fn key(&self) -> &[u8] {
        // SAFETY: as `node`, plus: `len` initialised bytes follow the header (`Entry::new`).
        unsafe { node_key(self.0) }
    }

    pub(super) fn parent(&self) -> InoGen {
        InoGen::from_raw(u64::from_le_bytes(
            self.key()[..8].try_into().expect("8-byte prefix"),
        ))
    }

    pub(super) fn name(&self) -> &[u8] {
        &self.key()[8..]
    }

    /// Whether this is the entry `name` in `parent`.
    #[inline]
    pub(super) fn is(&self, parent: InoGen, name: &[u8]) -> bool {
        let k = self.key();
        k.len() == 8 + name.len() && k[..8] == parent.raw().to_le_bytes() && k[8..] == *name
    }

    /// The type byte after the key.
    #[inline]
    fn kind_cell(&self) -> &AtomicU8 {
        let len = self.node().key_len();
        // SAFETY: the node lives as long as its owner, and its byte after the key was
        // initialised in `Entry::new`; it is only ever accessed as this atomic from then on
        // (an `AtomicU8` has the size and alignment of a `u8`).
        unsafe { AtomicU8::from_ptr((self.0.as_ptr() as *mut u8).add(KEY_OFFSET + len)) }
    }

    /// What the entry says. The caller holds the lock of the map shard that holds it (or
    /// owns it), so the target and its type are a pair a rename wrote (`Node`).
    pub(super) fn dirent(&self) -> Dirent {
        let t = self.kind_cell().load(Relaxed);
        Dirent {
            target: InoGen::from_raw(self.node().target.load(Acquire)),
            kind: FileType::from_mode(u32::from(t) << 12).expect("a type written by `new`"),
            cookie: self.node().cookie(),
        }
    }

    /// Points the entry at another inode, of type `kind`; returns the one it named, with its
    /// type. The caller holds the write lock of the map shard that holds it.
    pub(super) fn retarget(&self, (to, kind): (InoGen, FileType)) -> (InoGen, FileType) {
        let old = self.dirent();
        self.node().target.store(to.raw(), Release);
        self.kind_cell().store(kind.dirent_type(), Relaxed);
        (old.target, old.kind)
    }

    /// The index's word for this node: its address (even: nodes are 8-aligned).
    pub(super) fn word(&self) -> u64 {
        self.0.as_ptr() as u64
    }
}

/// The key bytes of a live node.
///
/// # Safety
/// `p` points at a live node.
#[inline]
pub(super) unsafe fn node_key<'a>(p: NonNull<Node>) -> &'a [u8] {
    // SAFETY: per the contract, `p` is live; its key follows the header (`Entry::new`).
    unsafe {
        let len = p.as_ref().key_len();
        std::slice::from_raw_parts((p.as_ptr() as *const u8).add(KEY_OFFSET), len)
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        let layout = node_layout(self.node().key_len());
        // SAFETY: allocated in `Entry::new` with this layout; the entry is the node's only
        // owner and no table refers to it any more ("A node's life").
        unsafe { dealloc(self.0.as_ptr() as *mut u8, layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_layout() {
        let p = InoGen::from_raw(0x0102);
        let reg = FileType::RegularFile;
        let k = Entry::new(p, b"abc", (InoGen::from_raw(5), reg), 1 << 48);
        assert_eq!(k.parent(), p);
        assert_eq!(k.name(), b"abc");
        assert!(k.is(p, b"abc") && !k.is(p, b"ab") && !k.is(InoGen::from_raw(0x0103), b"abc"));
        assert_eq!(
            k.dirent(),
            Dirent {
                target: InoGen::from_raw(5),
                kind: reg,
                cookie: 1 << 48
            }
        );
        let link = (InoGen::from_raw(9), FileType::Symlink);
        assert_eq!(k.retarget(link), (InoGen::from_raw(5), reg));
        assert_eq!((k.dirent().target, k.dirent().kind), link);
        assert_eq!(k.name(), b"abc", "the type byte is not part of the key");
        let sock = (InoGen::from_raw(1), FileType::Socket);
        let long = Entry::new(p, &[b'x'; NAME_MAX], sock, (1 << 55) - 1);
        assert_eq!(long.dirent().kind, FileType::Socket);
        assert_eq!(long.name().len(), NAME_MAX);
        assert_eq!(long.node().cookie(), (1 << 55) - 1);
    }
}
