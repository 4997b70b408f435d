//! The dispatcher: [`Server`] serves each request ([`Dispatch`], `dispatch.rs`) with exactly
//! one call on the engine's inode API, with the caller's credentials, and encodes the result
//! or errno back. What it asks of the kernel, and why, is in docs/DESIGN.md §7.
//!
//! The server keeps no state a file needs: lookup counts, handles, generations and readdir
//! cookies are the engine's (a [`lanefs::Via::Kernel`] context makes every entry the engine
//! returns carry one lookup reference, which FORGET drops). It keeps only what serves the
//! kernel's caches and its own retries: where each directory's handle-free read ends and
//! when it was listed (`listings.rs`), the page ranges whose write-back failed (`files.rs`),
//! the names the kernel may hold negative and the listings it may be reading, which tell a
//! library caller's new name whether it must take the directory's lock in the kernel
//! (`kernel_names.rs`), and a count of FORGETs for requests refused with ENOSPC to wait on
//! (`forgets.rs`; such a
//! request first has the engine give back the room of unlinked files the kernel no longer
//! holds, `lanefs::Filesystem::reap_unlinked`).
//!
//! `Server::handle` is the opcode table, one line per opcode; the handlers are grouped by
//! what they serve: `names.rs`, `files.rs`, `dirs.rs`, `xattrs.rs`, `ioctl.rs`, and the
//! channel's path requests (`paths.rs`); `reply.rs`
//! encodes attributes and entries.

mod dirs;
mod files;
mod forgets;
mod ioctl;
mod kernel_names;
mod listings;
mod names;
mod paths;
mod reply;
mod sink;
mod xattrs;

use std::io;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use lanefs::{Ctx, Errno, Filesystem};

use crate::abi::*;
use crate::dispatch::{Caller, Dispatch};
use crate::notify::{KernelCache, Notifier};
use crate::wire::{Answer, Out, Pending, Request};
use forgets::{ENOSPC_WAIT, Forgets};
use kernel_names::KernelNames;
use listings::{ReadEnds, expire_listings};
use reply::{Handled, OK};

/// The FUSE server of one lanefs filesystem.
pub struct Server {
    fs: Arc<Filesystem>,
    ttl: Duration,
    /// The filesystem's store keeps nothing (the memory store): an `fsync` has nothing to
    /// make durable, so FSYNC and FSYNCDIR are answered ENOSYS, which tells the kernel to
    /// stop sending them (it still writes dirty pages back first, and `fsync` returns 0).
    volatile_store: bool,
    /// The session's notifier, once the session exists: a RENAME that moves a directory to
    /// another parent drops that directory's cached listing (its `..` changed).
    notifier: Arc<OnceLock<KernelCache>>,
    /// The kernel opens directories by itself (`FUSE_NO_OPENDIR_SUPPORT`, so OPENDIR is
    /// answered ENOSYS): READDIR comes with handle 0 and is read by inode. Set by INIT.
    no_opendir: bool,
    /// Where the latest read from offset 0 of each directory (by node id) ends, for the reads
    /// from later offsets that follow it without a handle, and when it was made (see
    /// [`expire_listings`]). Sharded by node id; an entry goes when the kernel forgets the
    /// directory.
    read_ends: Arc<ReadEnds>,
    /// Dropped with the server, which ends the [`expire_listings`] thread at once.
    listings_stop: Option<std::sync::mpsc::Sender<()>>,
    /// Page-cache ranges whose write-back failed, for the `lanefs-pages` thread to drop
    /// (see [`Server::write`]); the thread is started at the first one and ends when this
    /// drops with the server.
    failed_pages: OnceLock<std::sync::mpsc::Sender<(u64, u64, u64)>>,
    /// FORGETs handled, for requests refused with ENOSPC to wait on (see [`Forgets`]).
    forgets: Forgets,
    /// The names the kernel may hold negative and the listings it may be reading, which a
    /// library caller's new name must drop (`kernel_names.rs`).
    names: Arc<KernelNames>,
}

/// A request and who made it: what every handler gets.
pub(super) struct Call<'r, 'a> {
    req: &'r Request<'a>,
    from: Caller<'r>,
}

impl<'a> std::ops::Deref for Call<'_, 'a> {
    type Target = Request<'a>;
    fn deref(&self) -> &Request<'a> {
        self.req
    }
}

impl Call<'_, '_> {
    /// The caller's credentials (`dispatch.rs`, [`Caller`]).
    pub(super) fn ctx(&self) -> Ctx {
        self.from.ctx(&self.req.h)
    }
}

impl Dispatch for Server {
    fn forget_pause(&self, max: std::time::Duration) {
        self.fs.forget_pause(max);
    }

    /// Serves one request with one engine call and writes its reply body into `out`;
    /// `later` gives a [`Pending`] for a request answered from another thread.
    fn dispatch(
        &self,
        req: &Request,
        from: Caller,
        out: &mut Out,
        later: &dyn Fn() -> Pending,
    ) -> Answer {
        let req = &Call { req, from };
        let mut deadline = None;
        loop {
            let seen = self.forgets.seen();
            match self.handle(req, out, later) {
                Ok(a) => return a,
                // A refusal changed nothing: the request can be made again once the room of
                // unlinked files the kernel no longer holds is given back (the engine asks
                // the kernel: `lanefs::Filesystem::reap_unlinked`), or once a FORGET may have
                // given room back ([`Forgets`]).
                Err(Errno::ENOSPC) if self.fs.reap_unlinked() > 0 => out.clear(),
                Err(Errno::ENOSPC)
                    if self.forgets.wait_past(
                        seen,
                        *deadline.get_or_insert_with(|| Instant::now() + ENOSPC_WAIT),
                    ) =>
                {
                    out.clear();
                }
                Err(e) => {
                    out.clear();
                    return Answer::Reply(e.code());
                }
            }
        }
    }
}

impl Server {
    /// A server for `fs`.
    pub fn new(fs: Arc<Filesystem>, ttl: Duration) -> Server {
        Server {
            volatile_store: !fs.durable(),
            fs,
            ttl,
            notifier: Arc::default(),
            no_opendir: false,
            read_ends: Default::default(),
            listings_stop: None,
            failed_pages: OnceLock::new(),
            forgets: Forgets::default(),
            names: Arc::new(KernelNames::new(ttl)),
        }
    }

    /// Connects the server to its kernel session once INIT is answered: `notifier` sends
    /// the session's cache invalidations, and `no_opendir` says the kernel opens
    /// directories by itself (`FUSE_NO_OPENDIR_SUPPORT`). Starts the thread that drops old
    /// cached listings ([`expire_listings`]) unless the timeout is 0.
    pub(crate) fn connect(&mut self, notifier: Notifier, no_opendir: bool) -> io::Result<()> {
        self.no_opendir = no_opendir;
        let _ = self.notifier.set(KernelCache(notifier));
        if !self.ttl.is_zero() {
            let (ends, kc, ttl) = (
                Arc::downgrade(&self.read_ends),
                Arc::downgrade(&self.notifier),
                self.ttl,
            );
            let (tx, rx) = std::sync::mpsc::channel();
            self.listings_stop = Some(tx);
            std::thread::Builder::new()
                .name("lanefs-listings".into())
                .spawn(move || expire_listings(ends, kc, ttl, rx))?;
        }
        Ok(())
    }

    /// The opcode table: one handler per opcode. Handlers are grouped by what they serve:
    /// names and entries (`names.rs`), attributes and file data (`files.rs`), directories
    /// (`dirs.rs`), extended attributes (`xattrs.rs`), inode flags (`ioctl.rs`).
    fn handle(&self, req: &Call, out: &mut Out, later: &dyn Fn() -> Pending) -> Handled {
        // The kernel's opcodes trust checks the kernel made (a READ by inode number after
        // its own open, say): never served to a channel, whose caller made none. The
        // channel's opcodes are paths, checked here component by component (`paths.rs`).
        match (req.from, lanefs_channel::is_channel_op(req.h.opcode)) {
            (Caller::Known(_), true) => return self.path_call(req, out),
            (Caller::Known(_), false) | (Caller::Kernel, true) => return Err(Errno::ENOSYS),
            (Caller::Kernel, false) => {}
        }
        match req.h.opcode {
            FUSE_LOOKUP => self.lookup(req, out),
            FUSE_FORGET => self.forget_one(req),
            FUSE_BATCH_FORGET => self.batch_forget(req),
            FUSE_GETATTR => self.getattr(req, out),
            FUSE_SETATTR => self.setattr(req, out),
            FUSE_READLINK => self.readlink(req, out),
            FUSE_MKNOD => self.mknod(req, out),
            FUSE_MKDIR => self.mkdir(req, out),
            FUSE_UNLINK => self.unlink(req),
            FUSE_RMDIR => self.rmdir(req),
            FUSE_SYMLINK => self.symlink(req, out),
            FUSE_RENAME => self.rename(req),
            FUSE_RENAME2 => self.rename2(req),
            FUSE_LINK => self.link(req, out),
            // Regular files are opened by the kernel alone (no-open mode): ENOSYS tells it
            // so, once, and it sends no OPEN, FLUSH or RELEASE for such files afterwards.
            FUSE_OPEN => Err(Errno::ENOSYS),
            // ENOSYS: the kernel then creates with MKNOD and opens the new file itself
            // (no-open mode), so a created file, like an opened one, sends no RELEASE.
            // `open(O_CREAT)` stays one system call with the creator's access: the kernel
            // skips the permission check on a file its open created.
            FUSE_CREATE => Err(Errno::ENOSYS),
            // A close has nothing to write back: ENOSYS tells the kernel to stop sending
            // FLUSH (files it opened itself come without `FOPEN_NOFLUSH`).
            FUSE_FLUSH => Err(Errno::ENOSYS),
            // Regular files reach the server by inode (no-open mode): the handle of a read,
            // write, fsync, fallocate or ftruncate is always 0.
            FUSE_READ => self.read(req, out),
            FUSE_WRITE => self.write(req, out),
            FUSE_STATFS => self.statfs(out),
            // Only a file `O_TMPFILE` made is released (no-open mode), and only before any
            // OPEN has switched no-open mode on: its handle is 0 (`Server::tmpfile`).
            FUSE_RELEASE => OK,
            FUSE_FSYNC => self.fsync(req, later),
            FUSE_SETXATTR => self.setxattr(req),
            FUSE_GETXATTR => self.getxattr(req, out),
            FUSE_LISTXATTR => self.listxattr(req, out),
            FUSE_REMOVEXATTR => self.removexattr(req),
            FUSE_OPENDIR => self.opendir(req, out),
            FUSE_READDIR => self.readdir(req, out, false),
            FUSE_READDIRPLUS => self.readdir(req, out, true),
            FUSE_RELEASEDIR => self.releasedir(req),
            FUSE_FSYNCDIR => self.fsyncdir(req, later),
            FUSE_ACCESS => self.access(req),
            FUSE_IOCTL => self.ioctl(req, out),
            FUSE_LSEEK => self.lseek(req, out),
            FUSE_FALLOCATE => self.fallocate(req),
            FUSE_TMPFILE => self.tmpfile(req, out),
            FUSE_STATX => self.statx(req, out),
            // Interrupts are not acted on (`dispatch.rs`).
            FUSE_INTERRUPT => Ok(Answer::None),
            FUSE_DESTROY => OK,
            // A second INIT, locks (the kernel then keeps them itself), BMAP, POLL,
            // COPY_FILE_RANGE, SYNCFS and anything newer: not implemented.
            _ => Err(Errno::ENOSYS),
        }
    }
}
