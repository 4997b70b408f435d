//! The open-file table, sharded by thread slot (docs/DESIGN.md §3: no global lock for open files).
//!
//! A handle is created in the shard of the opening thread's slot and looked up in the shard its
//! number names, so a thread that opens, reads and closes its own files (the `orc` workload)
//! only ever takes its own shard's lock. Handle numbers carry a per-entry generation: a stale
//! or forged number is answered with EBADF, never with another file's handle.
//!
//! ```text
//!   fh:  bits 63..56 shard   bits 55..32 generation (never 0)   bits 31..0 index
//! ```

use parking_lot::Mutex;

use crate::dir::ReadEnd;
use crate::errno::{Errno, Result};
use crate::id::InoGen;
use crate::slots::{NSLOTS, PerSlot, current};
use crate::stats::{LockClass, Stats};

/// An open-file handle number (FUSE's `fh`).
pub type Fh = u64;

/// What a handle refers to. Holding a handle holds a reference on the inode (`inode.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Handle {
    pub inode: InoGen,
    /// `open(2)` flags (access mode, `O_APPEND`, ...).
    pub flags: i32,
    pub is_dir: bool,
}

impl Handle {
    pub fn readable(&self) -> bool {
        matches!(self.flags & libc::O_ACCMODE, libc::O_RDONLY | libc::O_RDWR)
    }

    pub fn writable(&self) -> bool {
        matches!(self.flags & libc::O_ACCMODE, libc::O_WRONLY | libc::O_RDWR)
    }
}

const GEN_MASK: u32 = (1 << 24) - 1;

#[derive(Default)]
struct Entry {
    generation: u32,
    handle: Option<Handle>,
    /// Where the current read of a directory handle ends (`dir/mod.rs`); boxed, so that the
    /// entries of file handles stay small.
    end: Option<Box<ReadEnd>>,
}

#[derive(Default)]
struct Shard {
    entries: Vec<Entry>,
    free: Vec<u32>,
}

pub(crate) struct HandleTable {
    shards: PerSlot<Mutex<Shard>>,
}

const _: () = assert!(NSLOTS <= 256, "shard index has 8 bits");

impl HandleTable {
    pub fn new() -> Self {
        HandleTable {
            shards: PerSlot::new(|_| Mutex::new(Shard::default())),
        }
    }

    pub fn insert(&self, h: Handle, stats: &Stats) -> Fh {
        let shard = current();
        let mut s = stats.lock(LockClass::Handles, self.shards.get(shard));
        let idx = match s.free.pop() {
            Some(i) => i,
            None => {
                s.entries.push(Entry::default());
                (s.entries.len() - 1) as u32
            }
        };
        let e = &mut s.entries[idx as usize];
        e.generation = (e.generation % GEN_MASK) + 1;
        e.handle = Some(h);
        // The generation is never 0, so no handle is 0.
        ((shard as u64) << 56) | ((e.generation as u64) << 32) | idx as u64
    }

    fn locate(fh: Fh) -> Result<(usize, u32, usize)> {
        let shard = (fh >> 56) as usize;
        if shard >= NSLOTS {
            return Err(Errno::EBADF);
        }
        Ok((
            shard,
            ((fh >> 32) as u32) & GEN_MASK,
            (fh & 0xFFFF_FFFF) as usize,
        ))
    }

    /// Runs `f` on the live entry `fh` names (EBADF if none) under its shard lock.
    fn with<R>(&self, fh: Fh, stats: &Stats, f: impl FnOnce(&mut Entry) -> R) -> Result<R> {
        let (shard, generation, idx) = Self::locate(fh)?;
        let mut s = stats.lock(LockClass::Handles, self.shards.get(shard));
        match s.entries.get_mut(idx) {
            Some(e) if e.generation == generation && e.handle.is_some() => Ok(f(e)),
            _ => Err(Errno::EBADF),
        }
    }

    pub fn get(&self, fh: Fh, stats: &Stats) -> Result<Handle> {
        self.with(fh, stats, |e| e.handle.expect("live entry"))
    }

    /// Where the current read of directory handle `fh` ends, if one was started.
    pub fn read_end(&self, fh: Fh, stats: &Stats) -> Result<Option<ReadEnd>> {
        self.with(fh, stats, |e| e.end.as_deref().cloned())
    }

    /// Starts a new read of directory handle `fh`, ending at `end`.
    pub fn set_read_end(&self, fh: Fh, end: ReadEnd, stats: &Stats) -> Result<()> {
        self.with(fh, stats, |e| e.end = Some(Box::new(end)))
    }

    pub fn remove(&self, fh: Fh, stats: &Stats) -> Result<Handle> {
        let (shard, generation, idx) = Self::locate(fh)?;
        let mut s = stats.lock(LockClass::Handles, self.shards.get(shard));
        match s.entries.get_mut(idx) {
            Some(e) if e.generation == generation && e.handle.is_some() => {
                let h = e.handle.take().expect("matched Some");
                e.end = None;
                s.free.push(idx as u32);
                Ok(h)
            }
            _ => Err(Errno::EBADF),
        }
    }

    /// Handles still open (for leak checks in tests and `stats`).
    pub fn open_count(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                s.lock()
                    .entries
                    .iter()
                    .filter(|e| e.handle.is_some())
                    .count()
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_and_forged_handles_are_ebadf() {
        let t = HandleTable::new();
        let stats = Stats::default();
        let h = Handle {
            inode: InoGen::from_raw(9),
            flags: libc::O_RDWR,
            is_dir: false,
        };
        let fh = t.insert(h, &stats);
        assert_eq!(t.get(fh, &stats), Ok(h));
        assert_eq!(t.remove(fh, &stats), Ok(h));
        assert_eq!(t.get(fh, &stats), Err(Errno::EBADF), "closed");
        assert_eq!(t.remove(fh, &stats), Err(Errno::EBADF), "double close");
        // The slot is reused with a new generation: the old number stays dead.
        let fh2 = t.insert(h, &stats);
        assert_ne!(fh, fh2);
        assert_eq!(t.get(fh, &stats), Err(Errno::EBADF));
        assert_eq!(t.get(u64::MAX, &stats), Err(Errno::EBADF));
        assert_eq!(t.get(0, &stats), Err(Errno::EBADF));
        assert_eq!(t.open_count(), 1);
    }

    #[test]
    fn access_modes() {
        let r = Handle {
            inode: InoGen::from_raw(1),
            flags: libc::O_RDONLY,
            is_dir: false,
        };
        let w = Handle {
            flags: libc::O_WRONLY | libc::O_APPEND,
            ..r
        };
        assert!(r.readable() && !r.writable());
        assert!(!w.readable() && w.writable());
    }
}
