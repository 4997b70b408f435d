//! Telling an outside cache what a library caller changed.
//!
//! When lanefs is mounted, the kernel caches names, attributes and file pages for as long as
//! the mount's timeouts allow. Changes that come through the mount keep those caches right by
//! themselves (the kernel updates what it changed). A program that embeds lanefs and also
//! changes the tree through this library while it is mounted needs the kernel told: the FUSE
//! server installs an [`Invalidate`] sink, and every successful mutation made by a library
//! caller ([`Via::Library`], anyone but the kernel) reports the names and inodes it changed to
//! it, and the directories whose listing changed without a name in them changing (a directory
//! moved to another parent lists another `..`).
//!
//! A report is made after the operation has released every engine lock, including the
//! `coarse` one: the kernel's handling of an invalidation may wait for requests in flight in
//! the same directory, and those requests may need engine locks. The sink is called on the
//! caller's thread, so when the call returns the kernel has dropped the stale entries.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::RwLock;

use crate::{Ctx, Ino, Via};

/// Receives invalidations. Implementations must not call back into the filesystem.
pub trait Invalidate: Send + Sync {
    /// The name `name` in directory `parent` was created, removed or now names another inode
    /// (the directory's own attributes changed with it).
    fn entry(&self, parent: Ino, name: &[u8]);
    /// The attributes of `ino` changed; `data` is `Some((offset, len))` when the file's
    /// contents in that byte range changed too (`len` 0: to the end of the file).
    fn inode(&self, ino: Ino, data: Option<(u64, u64)>);
    /// What a read of directory `dir` returns changed without a name in `dir` changing: its
    /// `..` names another directory (it was moved to another parent). Every name created,
    /// removed or replaced in `dir` is reported by [`Invalidate::entry`] instead, which a
    /// cache of `dir`'s listing must take as a change of that listing too.
    fn listing(&self, dir: Ino);
}

/// The installed sink. The flag keeps the common case (nothing installed, or a kernel caller)
/// to one read of a line that is never written on a hot path; the lock is taken only to report
/// a library-side change while a sink is installed, and is a leaf (see [`crate::locking`]).
#[derive(Default)]
pub(crate) struct Watch {
    on: AtomicBool,
    sink: RwLock<Option<Arc<dyn Invalidate>>>,
}

impl Watch {
    pub(crate) fn set(&self, sink: Option<Arc<dyn Invalidate>>) {
        let mut s = self.sink.write();
        self.on.store(sink.is_some(), Ordering::Release);
        *s = sink;
    }

    /// The sink to report `ctx`'s changes to, if any.
    #[inline]
    pub(crate) fn sink(&self, ctx: &Ctx) -> Option<Arc<dyn Invalidate>> {
        if ctx.via == Via::Kernel || !self.on.load(Ordering::Acquire) {
            return None;
        }
        self.sink.read().clone()
    }
}
