//! Where the engine reports the changes library callers make (the channel of `lanefs run`
//! among them) while the filesystem is mounted: [`EngineSink`], which tells the kernel's
//! caches through the session's notifier (`notify.rs`, [`KernelCache`]).
//!
//! A changed name's dentry is invalidated (which drops its directory's attributes too when
//! the kernel had the dentry), then, when the kernel had none, the directory's attributes,
//! and with them its cached listing (its pages) only when one was read since it was last
//! dropped ([`drop_if_listed`], as a change through the kernel does,
//! `Server::names_changed`): the entry invalidation comes first, and the
//! kernel handles it with the directory's `i_rwsem` held exclusively, which every
//! `getdents` holds shared until its reply is in the cache, so when it returns every read
//! that could leave a listing from before the change has been counted as one.

use std::sync::Arc;

use lanefs::Ino;
use lanefs::notify::Invalidate;

use super::Server;
use super::dirs::drop_if_listed;
use super::listings::ReadEnds;
use crate::notify::{KernelCache, Notifier};

/// The engine's invalidation sink for one mounted session.
pub(crate) struct EngineSink {
    kc: KernelCache,
    read_ends: Arc<ReadEnds>,
}

impl Server {
    /// The sink for the engine's reports, sending through `notifier`.
    pub(crate) fn engine_sink(&self, notifier: Notifier) -> EngineSink {
        EngineSink {
            kc: KernelCache(notifier),
            read_ends: self.read_ends.clone(),
        }
    }
}

impl Invalidate for EngineSink {
    fn entry(&self, parent: Ino, name: &[u8]) -> bool {
        // With a dentry for the name, the kernel drops the parent's attributes with it
        // (`fuse_dir_changed`); it answers ENOENT when it has none, and then leaves the
        // parent alone, whose attributes are dropped apart. The listing, when one was read,
        // goes either way.
        let had_dentry = self.kc.0.inval_entry(parent.get(), name).is_ok();
        if drop_if_listed(&self.read_ends, &self.kc, parent.get()) || had_dentry {
            return true;
        }
        self.kc.inode(parent, None)
    }

    fn inode(&self, ino: Ino, data: Option<(u64, u64)>) -> bool {
        self.kc.inode(ino, data)
    }

    fn listing(&self, dir: Ino) -> bool {
        self.kc.listing(dir)
    }
}
