//! Keeping the kernel's caches in step: the notifications (`FUSE_NOTIFY_INVAL_ENTRY` /
//! `_INODE`, [`Notifier`]) the server sends, and [`KernelCache`], through which the server
//! drops the listings and pages it must and the engine's reports of the changes library
//! callers make while the filesystem is mounted ([`lanefs::notify`], `server/sink.rs`) reach
//! the kernel.
//!
//! Notifications are written to the session's first `/dev/fuse` descriptor on either
//! transport: the kernel takes them only there. Which may be sent from a request thread, and
//! which may not: the crate doc, "Locks".

use std::fs::File;
use std::io;
use std::sync::Arc;

use lanefs::Filesystem;
use lanefs::notify::Invalidate;
use zerocopy::IntoBytes;

use crate::abi::*;
use crate::devfuse::write_all_once;

/// Sends the kernel cache invalidations (`FUSE_NOTIFY_*`) through the session's first
/// `/dev/fuse` descriptor.
#[derive(Clone)]
pub(crate) struct Notifier(pub(crate) Arc<File>);

impl Notifier {
    fn send(&self, code: u32, parts: &[&[u8]]) -> io::Result<()> {
        let len = size_of::<fuse_out_header>() + parts.iter().map(|p| p.len()).sum::<usize>();
        // A notification is an out header with no request (`unique` 0) and the notification
        // code where a reply's errno goes.
        let h = fuse_out_header {
            len: len as u32,
            error: code as i32,
            unique: 0,
        };
        let mut b = Vec::with_capacity(len);
        b.extend_from_slice(h.as_bytes());
        for p in parts {
            b.extend_from_slice(p);
        }
        write_all_once(&self.0, &b)
    }

    /// `FUSE_NOTIFY_INVAL_ENTRY`: the kernel forgets `name` in `parent`.
    pub(crate) fn inval_entry(&self, parent: u64, name: &[u8]) -> io::Result<()> {
        let o = fuse_notify_inval_entry_out {
            parent,
            namelen: name.len() as u32,
            padding: 0,
        };
        self.send(FUSE_NOTIFY_INVAL_ENTRY, &[o.as_bytes(), name, b"\0"])
    }

    /// `FUSE_NOTIFY_PRUNE`: the kernel drops the dentries nothing uses of each inode of
    /// `inos`, and the inodes that then nothing holds (each FORGET follows). It takes no
    /// inode lock (`fuse_try_prune_one_inode`: `d_prune_aliases`, `iput`), but dropping an
    /// inode may wait for its pages' writeback: never sent from a request thread (the crate
    /// doc, "Locks"). EINVAL from a kernel before 7.45.
    pub(crate) fn prune(&self, inos: &[u64]) -> io::Result<()> {
        let o = fuse_notify_prune_out {
            count: inos.len() as u32,
            padding: 0,
            spare: 0,
        };
        self.send(FUSE_NOTIFY_PRUNE, &[o.as_bytes(), inos.as_bytes()])
    }

    /// `FUSE_NOTIFY_INVAL_INODE`: the kernel drops `ino`'s attributes and, for `off >= 0`,
    /// its cached pages in `off..off + len` (`len` 0: to the end).
    pub(crate) fn inval_inode(&self, ino: u64, off: i64, len: i64) -> io::Result<()> {
        let o = fuse_notify_inval_inode_out { ino, off, len };
        self.send(FUSE_NOTIFY_INVAL_INODE, &[o.as_bytes()])
    }
}

/// Sends the engine's invalidations to the kernel. Errors are ignored: ENOENT means the kernel
/// holds nothing for that name or inode (reported back to the engine, which may try an
/// inode's again while the kernel is being handed it: `lanefs::notify`), and ENODEV that the
/// mount is gone.
///
/// A directory's listing is cached by the kernel (`FOPEN_CACHE_DIR`, see `server/`) in the
/// directory inode's page cache, so a library change of a name also drops those pages. The
/// `FUSE_NOTIFY_INVAL_ENTRY` goes first: the kernel handles it with the directory's `i_rwsem`
/// held exclusively (Linux 6.18, `fuse_reverse_inval_entry`, whether or not it holds a dentry
/// for the name), and every `getdents` holds that lock shared from before its READDIR is sent
/// until the reply is in the cache. So when the entry invalidation returns, no listing read
/// before the change is still on its way into the cache, and the `FUSE_NOTIFY_INVAL_INODE`
/// that follows drops every page such a read left; the next read of the directory finds a
/// page missing and reads the directory again. (Kernels after 6.18 look the name up without
/// the lock first and return at once when they hold no dentry for it; there a listing read
/// before the change and put into the cache after the pages were dropped is caught only by
/// the kernel's mtime check, which misses it when the change left the directory's mtime
/// where it was, within one tick of the coarse clock.)
pub(crate) struct KernelCache(pub(crate) Notifier);

/// Whether an inode invalidation found the inode: false only for ENOENT.
fn found(r: io::Result<()>) -> bool {
    !matches!(r, Err(e) if e.raw_os_error() == Some(libc::ENOENT))
}

impl KernelCache {
    /// Drops `dir`'s cached listing (its pages) and attributes; false if the kernel holds
    /// no inode `dir`.
    pub(crate) fn drop_listing(&self, dir: lanefs::Ino) -> bool {
        found(self.0.inval_inode(dir.get(), 0, 0))
    }

    /// Drops the cached pages of `ino` from `off` for `len` bytes, and its attributes; false
    /// if the kernel holds no inode `ino`.
    pub(crate) fn drop_pages(&self, ino: lanefs::Ino, off: u64, len: u64) -> bool {
        let off = off.min(i64::MAX as u64) as i64;
        let len = len.min(i64::MAX as u64) as i64;
        found(self.0.inval_inode(ino.get(), off, len))
    }
}

impl Invalidate for KernelCache {
    fn entry(&self, parent: lanefs::Ino, name: &[u8]) -> bool {
        let _ = self.0.inval_entry(parent.get(), name);
        self.drop_listing(parent)
    }

    fn inode(&self, ino: lanefs::Ino, data: Option<(u64, u64)>) -> bool {
        match data {
            Some((off, len)) => self.drop_pages(ino, off, len),
            // A negative offset drops the attributes only.
            None => found(self.0.inval_inode(ino.get(), -1, 0)),
        }
    }

    fn listing(&self, dir: lanefs::Ino) -> bool {
        // `..` names no dentry: the entry invalidation only waits out the reads in flight
        // (above), and drops nothing.
        let _ = self.0.inval_entry(dir.get(), b"..");
        self.drop_listing(dir)
    }
}

/// Tells `fs` to report library-side changes to the kernel through `sink`.
pub(crate) fn install_invalidator(fs: &Filesystem, sink: impl Invalidate + 'static) {
    fs.set_invalidator(Some(Arc::new(sink)));
}
