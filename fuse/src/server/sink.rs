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
    pruner: Pruner,
    read_ends: Arc<ReadEnds>,
    names: Arc<KernelNames>,
    info: Arc<SessionInfo>,
}

impl Server {
    /// The sink for the engine's reports, sending through `notifier`.
    pub(crate) fn engine_sink(&self, notifier: Notifier, info: Arc<SessionInfo>) -> EngineSink {
        EngineSink {
            pruner: Pruner::new(notifier.clone()),
            kc: KernelCache(notifier),
            read_ends: self.read_ends.clone(),
            names: self.names.clone(),
            info,
        }
    }
}

impl Invalidate for EngineSink {
    fn prune(&self, inos: &[Ino]) -> bool {
        self.pruner.ask(inos)
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

/// Sends the engine's prunes (`FUSE_NOTIFY_PRUNE`) from a thread of its own, started at the
/// first: the kernel drops what it let go of on the writer's thread, and dropping an inode
/// may wait for its pages' writeback, which needs the server's request threads, so a request
/// thread (which runs the eviction pass that asks) must not write it. A prune is a hint:
/// one asked while two are waiting is dropped. The thread ends with the sink (its sender).
struct Pruner {
    notifier: Notifier,
    tx: std::sync::OnceLock<std::sync::mpsc::SyncSender<Vec<u64>>>,
    /// The kernel refused a prune (before FUSE 7.45): none is sent again.
    refused: Arc<std::sync::atomic::AtomicBool>,
}

impl Pruner {
    fn new(notifier: Notifier) -> Pruner {
        Pruner {
            notifier,
            tx: std::sync::OnceLock::new(),
            refused: Arc::default(),
        }
    }

    /// Queues a prune of `inos`; false if the kernel refuses prunes or two are waiting.
    fn ask(&self, inos: &[Ino]) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        if self.refused.load(Relaxed) {
            return false;
        }
        let tx = self.tx.get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u64>>(2);
            let (notifier, refused) = (self.notifier.clone(), self.refused.clone());
            let started = std::thread::Builder::new()
                .name("lanefs-prune".into())
                .spawn(move || {
                    for inos in rx {
                        // The kernel copies the node ids in batches; 4096 are 32 KiB.
                        for chunk in inos.chunks(4096) {
                            match notifier.prune(chunk) {
                                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                                    refused.store(true, Relaxed);
                                    eprintln!(
                                        "lanefs: this kernel does not take FUSE_NOTIFY_PRUNE \
                                         (FUSE 7.45, Linux 6.18): what it holds stays in memory \
                                         (directories with their entries) until it forgets it"
                                    );
                                    return;
                                }
                                // ENODEV: the mount is gone; the sink goes soon.
                                _ => {}
                            }
                        }
                    }
                });
            if started.is_err() {
                self.refused.store(true, Relaxed);
            }
            tx
        });
        tx.try_send(inos.iter().map(|i| i.get()).collect()).is_ok()
    }
}
