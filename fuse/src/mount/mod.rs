//! Mounting: [`mount`] (serve until unmounted) and [`mount_background`] (a [`Mount`] served
//! from background threads), as [`MountConfig`] says; the unmounter that undoes either.
//!
//! A mount is made (`attach.rs`: `mount(2)` as root, `fusermount3` for a user), its session
//! initialised and its transport chosen (`session.rs`), and the session served by a
//! [`Server`] (`server/`) until the kernel ends it. The mount options that are kernel mount
//! flags are in one table, [`MOUNT_FLAGS`] (`flags.rs`).

mod attach;
mod config;
mod flags;

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use lanefs::Filesystem;

use crate::info::SessionInfo;
use crate::notify::{self, Notifier};
use crate::server::Server;
use crate::session;
use attach::{DirectMount, fusermount_unmount, mount_direct, mount_fusermount};

pub(crate) use attach::mount_dev_at_canonical;
pub use attach::{FS_TYPE, mount_dev_at, mount_flags_at, mount_id_at};
pub use config::MountConfig;
pub use flags::{MOUNT_FLAGS, MountFlag, mount_flag};
pub use fuser::MountOption;

impl Server {
    /// A server for `fs` mounted as `cfg` says.
    pub fn with_config(fs: Arc<Filesystem>, cfg: &MountConfig) -> Server {
        Server::new(fs, cfg.ttl)
    }
}

/// How a mount is undone: lanefs's own `mount(2)` as root, or `fusermount3` for a user.
enum Unmounter {
    Direct(DirectMount),
    Fusermount(PathBuf),
}

impl Unmounter {
    /// Unmounts; `lazy` detaches a busy mount (as `umount -l`) instead of failing with EBUSY.
    fn unmount(&self, lazy: bool) -> io::Result<()> {
        match self {
            Unmounter::Direct(d) => d.unmount(lazy),
            Unmounter::Fusermount(p) => fusermount_unmount(p, lazy),
        }
    }
}

/// Starts the channel of `lanefs run` for the mount at `mountpoint`, when `cfg` asks for
/// it; a channel that cannot start is said on stderr and the mount goes on without it
/// (programs under `lanefs run` then go through the kernel).
fn start_channel(
    server: &Arc<Server>,
    info: &Arc<SessionInfo>,
    mountpoint: &Path,
    cfg: &MountConfig,
) -> Option<crate::channel::ChannelServer> {
    if !cfg.channel {
        return None;
    }
    let dev = mount_dev_at_canonical(&canonical(mountpoint))?;
    // SAFETY: geteuid has no preconditions.
    let owner = unsafe { libc::geteuid() };
    let dispatch: Arc<dyn crate::dispatch::Dispatch> = server.clone();
    crate::channel::serve(dispatch, info.clone(), dev, owner, cfg.allow_other)
        .inspect_err(|e| {
            eprintln!(
                "lanefs: {}: no channel for `lanefs run`: {e}",
                mountpoint.display()
            )
        })
        .ok()
}

/// A mounted, initialised session, not yet served.
struct Started {
    server: Arc<Server>,
    dev: Arc<File>,
    neg: session::Negotiated,
    info: Arc<SessionInfo>,
    unmounter: Unmounter,
}

impl Started {
    /// Reports library callers' changes to the kernel (the engine's invalidation sink) and
    /// starts the channel of `lanefs run` when `cfg` asks for it.
    fn serve_library_callers(
        &self,
        fs: &Filesystem,
        mountpoint: &Path,
        cfg: &MountConfig,
    ) -> Option<crate::channel::ChannelServer> {
        let sink = self
            .server
            .engine_sink(Notifier(self.dev.clone()), self.info.clone());
        notify::install_invalidator(fs, sink);
        start_channel(&self.server, &self.info, mountpoint, cfg)
    }
}

/// Mounts `fs` (with `mount(2)` as root, through `fusermount3` otherwise) and answers INIT.
fn new_session(fs: &Arc<Filesystem>, mountpoint: &Path, cfg: &MountConfig) -> io::Result<Started> {
    let mut server = Server::with_config(fs.clone(), cfg);
    let (dev, unmounter) = match mount_direct(mountpoint, cfg)? {
        Some((fd, direct)) => (File::from(fd), Unmounter::Direct(direct)),
        None => {
            let fd = mount_fusermount(mountpoint, cfg)?;
            (File::from(fd), Unmounter::Fusermount(canonical(mountpoint)))
        }
    };
    let neg = match session::init(&dev, cfg.uring) {
        Ok(n) => n,
        Err(e) => {
            drop(dev);
            let _ = unmounter.unmount(true);
            return Err(e);
        }
    };
    let dev = Arc::new(dev);
    server.connect(Notifier(dev.clone()), neg.no_opendir)?;
    Ok(Started {
        server: Arc::new(server),
        dev,
        neg,
        info: Arc::default(),
        unmounter,
    })
}

impl Started {
    /// Serves the session until it ends (in the calling thread, and the transport's).
    fn serve(
        server: Arc<Server>,
        dev: Arc<File>,
        info: Arc<SessionInfo>,
        neg: session::Negotiated,
        cfg: &MountConfig,
    ) -> io::Result<()> {
        session::serve(dev, server, info, neg, cfg.threads, cfg.uring)
    }
}

/// What [`mount`] tells its caller once the mount is in place.
pub struct Mounted {
    /// Unmounts, for signal handlers (a busy mount is detached lazily, and served until its
    /// last open file is closed).
    pub unmount: Box<dyn FnMut() -> io::Result<()> + Send>,
    /// The session's transport and request count, for `lanefs stats`.
    pub info: Arc<SessionInfo>,
}

/// Mounts `fs` at `mountpoint` and serves it until unmounted. `on_mounted` runs once the
/// mount is in place, INIT is answered and the transport settled ([`SessionInfo::transport`]);
/// when the mount fails (`uring=on` without io_uring among the reasons) it does not run, the
/// mount is undone and the error returned.
pub fn mount(
    fs: Arc<Filesystem>,
    mountpoint: &Path,
    cfg: &MountConfig,
    on_mounted: impl FnOnce(Mounted),
) -> io::Result<()> {
    let s = new_session(&fs, mountpoint, cfg)?;
    let channel = s.serve_library_callers(&fs, mountpoint, cfg);
    let unmounter = Arc::new(s.unmounter);
    let u = unmounter.clone();
    // As `fusermount3 -u` does for a non-root mount: detach a busy mount lazily; the
    // session ends when its last open file is closed.
    let unmount = Box::new(move || match u.unmount(false) {
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => u.unmount(true),
        r => r,
    });
    let info = s.info.clone();
    let r = serve_reporting(s.server, s.dev, s.info, s.neg, cfg, move || {
        on_mounted(Mounted { unmount, info })
    });
    drop(channel);
    fs.set_invalidator(None);
    if r.is_err() {
        let _ = unmounter.unmount(true);
    }
    r
}

/// Serves, calling `ready` once the transport is settled (from the calling thread).
fn serve_reporting(
    server: Arc<Server>,
    dev: Arc<File>,
    info: Arc<SessionInfo>,
    neg: session::Negotiated,
    cfg: &MountConfig,
    ready: impl FnOnce(),
) -> io::Result<()> {
    let cfg2 = cfg.clone();
    let info2 = info.clone();
    let h = std::thread::Builder::new()
        .name("lanefs-session".into())
        .spawn(move || Started::serve(server, dev, info2, neg, &cfg2))?;
    while info.transport() == "starting" && !h.is_finished() {
        std::thread::sleep(Duration::from_millis(1));
    }
    let joined = |h: std::thread::JoinHandle<io::Result<()>>| {
        h.join()
            .unwrap_or_else(|_| Err(io::Error::other("the session thread panicked")))
    };
    if info.transport() == "starting" {
        // The session ended before it settled on a transport (its io_uring registration
        // failed, with `uring=on` or without the kernel giving up on the ring): nothing is
        // served, so the mount is not reported as made; the caller unmounts.
        return joined(h).and_then(|()| Err(io::Error::other("the session ended at once")));
    }
    ready();
    joined(h)
}

/// A lanefs filesystem mounted and served from background threads, for tests and for
/// programs that embed lanefs and keep using the library while it is mounted (their changes
/// are sent to the kernel as cache invalidations, see [`lanefs::notify`]).
///
/// [`Mount::unmount`] unmounts and waits for the server threads; dropping a `Mount` detaches
/// it lazily (as `umount -l`) without waiting.
pub struct Mount {
    fs: Arc<Filesystem>,
    /// The channel of `lanefs run`, stopped at unmount.
    channel: Option<crate::channel::ChannelServer>,
    thread: Option<std::thread::JoinHandle<io::Result<()>>>,
    unmounter: Unmounter,
    info: Arc<SessionInfo>,
}

impl Mount {
    /// Unmounts (EBUSY while files on it are open, as `umount`; the mount then stays and the
    /// call may be repeated) and waits until the server threads have answered their last
    /// request.
    pub fn unmount(&mut self) -> io::Result<()> {
        if self.thread.is_some() {
            self.unmounter.unmount(false)?;
        }
        self.channel = None;
        self.fs.set_invalidator(None);
        match self.thread.take() {
            Some(h) => h
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("the session thread panicked"))),
            None => Ok(()),
        }
    }

    /// The session's transport and request count.
    pub fn info(&self) -> &Arc<SessionInfo> {
        &self.info
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.fs.set_invalidator(None);
        if self.thread.is_some() {
            let _ = self.unmounter.unmount(true);
        }
    }
}

/// Mounts `fs` and serves it from background threads until the returned [`Mount`] is
/// unmounted or dropped.
pub fn mount_background(
    fs: Arc<Filesystem>,
    mountpoint: &Path,
    cfg: &MountConfig,
) -> io::Result<Mount> {
    let s = new_session(&fs, mountpoint, cfg)?;
    let channel = s.serve_library_callers(&fs, mountpoint, cfg);
    let info = s.info.clone();
    let (server, dev, neg, cfg2, info2) = (s.server, s.dev, s.neg, cfg.clone(), info.clone());
    let thread = std::thread::Builder::new()
        .name("lanefs-session".into())
        .spawn(move || Started::serve(server, dev, info2, neg, &cfg2))?;
    while info.transport() == "starting" && !thread.is_finished() {
        std::thread::sleep(Duration::from_millis(1));
    }
    if thread.is_finished() {
        let r = thread
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the session thread panicked")));
        let _ = s.unmounter.unmount(true);
        fs.set_invalidator(None);
        return Err(r
            .err()
            .unwrap_or_else(|| io::Error::other("the session ended at once")));
    }
    Ok(Mount {
        fs,
        channel,
        thread: Some(thread),
        unmounter: s.unmounter,
        info,
    })
}

/// The canonical form of a mountpoint, as the control socket is named after it.
pub(crate) fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}
