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
//!
//! A new name (`Invalidate::new_entry`) skips the entry invalidation, and the directory's
//! lock it takes in the kernel, when the kernel can hold no negative dentry for the name and
//! no listing of the directory is being read (`kernel_names.rs`): then only the
//! directory's attributes are dropped. A removal or a rename (`Invalidate::removed_unseen`)
//! does the same when the kernel holds nothing of the inodes it changed, no request handing
//! it entries of the directories runs, and (a rename) it keeps no entry saying the new name
//! is absent. This keeps creates and removals over the channel from
//! serialising on the kernel's directory lock.

use std::sync::Arc;

use lanefs::Ino;
use lanefs::notify::Invalidate;

use super::Server;
use super::dirs::drop_if_listed;
use super::kernel_names::{KernelNames, Needs};
use super::listings::ReadEnds;
use crate::info::SessionInfo;
use crate::notify::{KernelCache, Notifier};

/// The engine's invalidation sink for one mounted session.
pub(crate) struct EngineSink {
    kc: KernelCache,
    /// The kernel refused a `FUSE_NOTIFY_PRUNE` (before 7.45): none is sent again.
    no_prune: std::sync::atomic::AtomicBool,
    read_ends: Arc<ReadEnds>,
    names: Arc<KernelNames>,
    info: Arc<SessionInfo>,
}

impl Server {
    /// The sink for the engine's reports, sending through `notifier`.
    pub(crate) fn engine_sink(&self, notifier: Notifier, info: Arc<SessionInfo>) -> EngineSink {
        EngineSink {
            kc: KernelCache(notifier),
            no_prune: Default::default(),
            read_ends: self.read_ends.clone(),
            names: self.names.clone(),
            info,
        }
    }
}

impl Invalidate for EngineSink {
    fn prune(&self, inos: &[Ino]) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        if self.no_prune.load(Relaxed) {
            return false;
        }
        let inos: Vec<u64> = inos.iter().map(|i| i.get()).collect();
        // The kernel copies at most its whole write buffer; 4096 node ids are 32 KiB.
        for chunk in inos.chunks(4096) {
            if let Err(e) = self.kc.0.prune(chunk) {
                if e.raw_os_error() == Some(libc::EINVAL) {
                    self.no_prune.store(true, Relaxed);
                    eprintln!(
                        "lanefs: this kernel does not take FUSE_NOTIFY_PRUNE (FUSE 7.45, Linux \
                         6.18): what it holds stays in memory (directories with their \
                         entries) until it forgets it"
                    );
                }
                return false;
            }
        }
        true
    }

    fn entry(&self, parent: Ino, name: &[u8]) -> bool {
        // With a dentry for the name, the kernel drops the parent's attributes with it
        // (`fuse_dir_changed`); it answers ENOENT when it has none, and then leaves the
        // parent alone, whose attributes are dropped apart. The listing, when one was read,
        // goes either way.
        self.info.count_report(true);
        let had_dentry = self.kc.0.inval_entry(parent.get(), name).is_ok();
        if drop_if_listed(&self.read_ends, &self.kc, parent.get()) || had_dentry {
            return true;
        }
        self.kc.inode(parent, None)
    }

    fn new_entry(&self, parent: Ino, name: &[u8]) -> bool {
        match self.names.new_name(parent.get(), name) {
            Needs::Attributes => {
                self.info.count_report(false);
                self.kc.inode(parent, None)
            }
            Needs::Entry(None) => self.entry(parent, name),
            Needs::Entry(Some(reads)) => {
                // The entry invalidation has waited for every read in flight; the listing
                // goes whether or not a read from offset 0 was recorded.
                self.info.count_report(true);
                let _ = self.kc.0.inval_entry(parent.get(), name);
                let found = drop_if_listed(&self.read_ends, &self.kc, parent.get())
                    || self.kc.drop_listing(parent);
                self.names.listing_dropped(parent.get(), reads);
                found
            }
        }
    }

    fn may_see_removal(&self, dir: Ino) -> bool {
        !self.names.removal_unseen(dir.get())
    }

    fn removing(&self, parent: Ino, name: &[u8]) {
        self.names.removing(parent.get(), name);
    }

    fn removal_reported(&self, parent: Ino, name: &[u8]) {
        self.names.removal_reported(parent.get(), name);
    }

    fn may_hold_new_name(&self, dir: Ino, name: &[u8]) -> bool {
        self.names.new_name(dir.get(), name) != Needs::Attributes
    }

    fn removed_unseen(&self, dir: Ino) -> bool {
        self.info.count_report(false);
        self.kc.inode(dir, None)
    }

    fn inode(&self, ino: Ino, data: Option<(u64, u64)>) -> bool {
        self.kc.inode(ino, data)
    }

    fn listing(&self, dir: Ino) -> bool {
        self.info.count_report(true);
        self.kc.listing(dir)
    }
}
