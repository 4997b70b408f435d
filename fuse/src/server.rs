//! Request translation.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use lanefs::{
    Attr, Ctx, DirEnd, Errno, FileType, Filesystem, Ino, SetAttr, TimeSet, Timespec, TruncateBy,
};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

use crate::abi::*;
use crate::dispatch::{Caller, Dispatch};
use crate::notify::{KernelCache, Notifier};
use crate::wire::{Answer, Out, Pending, Request, cstr};

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
}

/// How long a request refused with ENOSPC waits, in all, for FORGETs that may give room back
/// before it is answered (see [`Server::dispatch`]).
const ENOSPC_WAIT: Duration = Duration::from_millis(5);

/// A count of the FORGETs handled, and a way to wait for the next one.
///
/// The kernel holds a file it unlinked until its last user is gone, then sends a FORGET,
/// and only then can lanefs free the inode and its pages: a create or write right after an
/// unlink that needed that room would fail with ENOSPC where tmpfs (which frees at the last
/// `iput`) succeeds. Over io_uring that is the common case: the FORGET comes through
/// `/dev/fuse` and the next request through the ring, served by another thread. So a request
/// refused with ENOSPC waits (at most [`ENOSPC_WAIT`] in all) for FORGETs and is tried again
/// after each. The count is bumped after the FORGET is applied; the lock and condition
/// variable are touched only while someone waits.
#[derive(Default)]
struct Forgets {
    count: std::sync::atomic::AtomicU64,
    waiters: AtomicUsize,
    lock: Mutex<()>,
    cv: std::sync::Condvar,
}

impl Forgets {
    fn done(&self) {
        self.count.fetch_add(1, SeqCst);
        if self.waiters.load(SeqCst) > 0 {
            let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.cv.notify_all();
        }
    }

    /// Waits until the count passes `seen` or `deadline` comes; true if it passed.
    fn wait_past(&self, seen: u64, deadline: Instant) -> bool {
        self.waiters.fetch_add(1, SeqCst);
        let mut g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if self.count.load(SeqCst) != seen {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            g = self
                .cv
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        drop(g);
        self.waiters.fetch_sub(1, SeqCst);
        self.count.load(SeqCst) != seen
    }
}

const READ_END_SHARDS: usize = 16;

/// Per directory: where its latest read from offset 0 ends, and when that read was made while
/// its listing has not been dropped since.
type ReadEnds = [EndShard; READ_END_SHARDS];

#[derive(Default)]
struct EndShard {
    ends: Mutex<HashMap<u64, (DirEnd, Option<Instant>)>>,
    /// How many of `ends` have a time (changed only under `ends`' lock): while 0, a change of
    /// a directory in this shard has no listing to drop, and takes no lock to find that out.
    listed: AtomicUsize,
}

impl EndShard {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (DirEnd, Option<Instant>)>> {
        self.ends.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets when `ino`'s listing was read (its entry stays, for reads under way); true if
    /// it had a time.
    fn unlist(
        ends: &mut HashMap<u64, (DirEnd, Option<Instant>)>,
        listed: &AtomicUsize,
        ino: u64,
    ) -> bool {
        match ends.get_mut(&ino) {
            Some((_, at @ Some(_))) => {
                *at = None;
                listed.fetch_sub(1, Release);
                true
            }
            _ => false,
        }
    }
}

/// Drops the kernel's cached listing of each directory read from offset 0 more than `ttl`
/// ago, every `ttl / 4`, until the server is gone (`stop` disconnects when it drops; the
/// thread holds nothing of the server's meanwhile, so the session's descriptor closes with
/// it). A listing served from the cache comes
/// without attributes, so once the entries it names have expired (the entry timeout is
/// `ttl`), a walk through it would revalidate each with a LOOKUP; read again, the directory
/// comes with READDIRPLUS, which refreshes every entry in one request per page. Only speed
/// depends on this: a listing is right however old it is (module doc, "Directory listings").
fn expire_listings(
    ends: std::sync::Weak<ReadEnds>,
    kc: std::sync::Weak<OnceLock<KernelCache>>,
    ttl: Duration,
    stop: std::sync::mpsc::Receiver<()>,
) {
    let period = (ttl / 4).max(Duration::from_millis(100));
    loop {
        if stop.recv_timeout(period) != Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
            return;
        }
        let (Some(ends), Some(kc)) = (ends.upgrade(), kc.upgrade()) else {
            return;
        };
        let Some(kc) = kc.get() else {
            continue;
        };
        let mut old = Vec::new();
        for shard in ends.iter() {
            let mut map = shard.lock();
            for (ino, (_, at)) in map.iter_mut() {
                if at.is_some_and(|t| t.elapsed() >= ttl) {
                    *at = None; // until the directory is read from offset 0 again
                    shard.listed.fetch_sub(1, Release);
                    old.push(*ino);
                }
            }
        }
        for ino in old {
            kc.drop_listing(Ino(ino));
        }
    }
}

/// The engine's inode number for a FUSE node id (they are the same numbers).
fn node(n: u64) -> Ino {
    Ino(n)
}

/// `d_type` of a file type, as `fuse_dirent.type` carries it.
fn dtype(k: FileType) -> u32 {
    match k {
        FileType::RegularFile => libc::DT_REG,
        FileType::Directory => libc::DT_DIR,
        FileType::Symlink => libc::DT_LNK,
        FileType::CharDevice => libc::DT_CHR,
        FileType::BlockDevice => libc::DT_BLK,
        FileType::NamedPipe => libc::DT_FIFO,
        FileType::Socket => libc::DT_SOCK,
    }
    .into()
}

fn fattr(a: &Attr) -> fuse_attr {
    fuse_attr {
        ino: a.ino.get(),
        size: a.size,
        blocks: a.blocks,
        // Seconds before 1970 are negative; the kernel reads the field as signed.
        atime: a.atime.sec as u64,
        mtime: a.mtime.sec as u64,
        ctime: a.ctime.sec as u64,
        atimensec: a.atime.nsec,
        mtimensec: a.mtime.nsec,
        ctimensec: a.ctime.nsec,
        mode: a.mode,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev as u32,
        blksize: a.blksize,
        padding: 0,
    }
}

/// A time a SETATTR carries: now, or the seconds and nanoseconds given.
fn tset(now: bool, sec: u64, nsec: u32) -> TimeSet {
    if now {
        TimeSet::Now
    } else {
        TimeSet::At(Timespec::new(sec as i64, nsec))
    }
}

/// Attributes sent with a negative entry (the kernel ignores them).
const NEGATIVE: Attr = Attr {
    ino: Ino(0),
    generation: lanefs::Generation(0),
    mode: libc::S_IFREG,
    nlink: 0,
    uid: 0,
    gid: 0,
    rdev: 0,
    size: 0,
    blocks: 0,
    blksize: 4096,
    atime: Timespec::new(0, 0),
    mtime: Timespec::new(0, 0),
    ctime: Timespec::new(0, 0),
};

/// The ioctls of inode flags, and how `FS_XFLAG_*` map to `FS_*_FL` (`fileattr_fill_xflags`).
mod ioctl {
    /// `FS_IOC_GETFLAGS`, `FS_IOC_SETFLAGS` (`_IOR/_IOW('f', 1/2, long)`), and their 32-bit
    /// forms (`int`).
    pub const GETFLAGS: u32 = 0x8008_6601;
    pub const SETFLAGS: u32 = 0x4008_6602;
    pub const GETFLAGS32: u32 = 0x8004_6601;
    pub const SETFLAGS32: u32 = 0x4004_6602;
    /// `FS_IOC_FSGETXATTR`, `FS_IOC_FSSETXATTR` (`_IOR/_IOW('X', 31/32, struct fsxattr)`).
    pub const FSGETXATTR: u32 = 0x801c_581f;
    pub const FSSETXATTR: u32 = 0x401c_5820;
    /// `sizeof(struct fsxattr)`: five `u32`s and 8 bytes of padding.
    pub const FSXATTR_SIZE: usize = 28;
    /// `FS_XFLAG_COMMON`: the xflags that have an inode flag (sync, immutable, append,
    /// nodump, noatime, dax, projinherit).
    pub const XFLAG_COMMON: u32 = 0x20 | 0x8 | 0x10 | 0x80 | 0x40 | 0x8000 | 0x200;
    /// `(FS_*_FL, FS_XFLAG_*)`.
    const MAP: [(u32, u32); 7] = [
        (lanefs::FS_IMMUTABLE_FL, 0x8),
        (lanefs::FS_APPEND_FL, 0x10),
        (lanefs::FS_NODUMP_FL, 0x80),
        (lanefs::FS_NOATIME_FL, 0x40),
        (0x8, 0x20),           // FS_SYNC_FL
        (0x0200_0000, 0x8000), // FS_DAX_FL
        (0x2000_0000, 0x200),  // FS_PROJINHERIT_FL
    ];

    pub fn xflags_of(flags: u32) -> u32 {
        MAP.iter()
            .filter(|(f, _)| flags & f != 0)
            .map(|(_, x)| x)
            .sum()
    }

    pub fn flags_of(xflags: u32) -> u32 {
        MAP.iter()
            .filter(|(_, x)| xflags & x != 0)
            .map(|(f, _)| f)
            .sum()
    }
}

/// A request and who made it: what every handler gets.
struct Call<'r, 'a> {
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
    fn ctx(&self) -> Ctx {
        self.from.ctx(&self.req.h)
    }
}

/// A handler's result: how the request is answered, or the errno it is answered with.
type Handled = Result<Answer, Errno>;

const OK: Handled = Ok(Answer::Reply(0));

fn done(r: lanefs::Result<()>) -> Handled {
    r.map(|()| Answer::Reply(0))
}

/// Writes `t` as the reply body; ERANGE (never expected) if the buffer cannot hold it.
fn put<T: IntoBytes + zerocopy::Immutable>(out: &mut Out, t: &T) -> Handled {
    if out.push_obj(t) {
        OK
    } else {
        Err(Errno::ERANGE)
    }
}

impl Dispatch for Server {
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
            let seen = self.forgets.count.load(SeqCst);
            match self.handle(req, out, later) {
                Ok(a) => return a,
                // A refusal changed nothing: the request can be made again once a FORGET may
                // have given room back ([`Forgets`]).
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

    fn entry_out(&self, a: &Attr) -> fuse_entry_out {
        fuse_entry_out {
            nodeid: a.ino.get(),
            generation: a.generation.0,
            entry_valid: self.ttl.as_secs(),
            attr_valid: self.ttl.as_secs(),
            entry_valid_nsec: self.ttl.subsec_nanos(),
            attr_valid_nsec: self.ttl.subsec_nanos(),
            attr: fattr(a),
        }
    }

    /// A READDIRPLUS entry: as a LOOKUP's, except that a directory's attributes come with
    /// no attribute timeout (the entry keeps its own). The kernel does not version a
    /// directory's attributes against changes inside it: a create, unlink, mkdir or rmdir
    /// in the directory only marks its cached attributes stale, so a listing of its parent
    /// that read them before such a change, and is applied after it, would put back the old
    /// link count and times for the whole timeout. With no timeout, its attributes are read
    /// again (GETATTR) the next time they are needed. Files need no such care: the kernel
    /// versions their attributes against writes, truncates and links.
    fn listed_entry_out(&self, a: &Attr) -> fuse_entry_out {
        let mut e = self.entry_out(a);
        if a.mode & libc::S_IFMT == libc::S_IFDIR {
            e.attr_valid = 0;
            e.attr_valid_nsec = 0;
        }
        e
    }

    fn entry(&self, r: lanefs::Result<Attr>, out: &mut Out) -> Handled {
        put(out, &self.entry_out(&r?))
    }

    /// The reply to a request that made a name in directory `dir`.
    fn changed(&self, dir: u64, r: lanefs::Result<Attr>, out: &mut Out) -> Handled {
        if r.is_ok() {
            self.names_changed(dir);
        }
        self.entry(r, out)
    }

    fn attr(&self, r: lanefs::Result<Attr>, out: &mut Out) -> Handled {
        let a = r?;
        put(
            out,
            &fuse_attr_out {
                attr_valid: self.ttl.as_secs(),
                attr_valid_nsec: self.ttl.subsec_nanos(),
                dummy: 0,
                attr: fattr(&a),
            },
        )
    }

    fn handle(&self, req: &Call, out: &mut Out, later: &dyn Fn() -> Pending) -> Handled {
        let ino = req.h.nodeid;
        match req.h.opcode {
            FUSE_LOOKUP => self.lookup(req, out),
            FUSE_FORGET => {
                let f: fuse_forget_in = req.arg()?;
                self.forget(ino, f.nlookup);
                Ok(Answer::None)
            }
            FUSE_BATCH_FORGET => {
                let b: fuse_batch_forget_in = req.arg()?;
                let mut rest = req.data;
                for _ in 0..b.count {
                    let Ok((f, r)) = fuse_forget_one::read_from_prefix(rest) else {
                        break;
                    };
                    self.forget(f.nodeid, f.nlookup);
                    rest = r;
                }
                Ok(Answer::None)
            }
            FUSE_GETATTR => self.attr(self.fs.getattr(node(ino)), out),
            FUSE_SETATTR => self.setattr(req, out),
            FUSE_READLINK => {
                let t = self.fs.readlink(node(ino))?;
                if out.push(&t) { OK } else { Err(Errno::ERANGE) }
            }
            FUSE_MKNOD => {
                let a: fuse_mknod_in = req.arg()?;
                let (name, _) = req.name()?;
                let c = req.ctx().with_umask(a.umask);
                let r = self
                    .fs
                    .mknod(&c, node(ino), name, a.mode, u64::from(a.rdev));
                self.changed(ino, r, out)
            }
            FUSE_MKDIR => {
                let a: fuse_mkdir_in = req.arg()?;
                let (name, _) = req.name()?;
                let c = req.ctx().with_umask(a.umask);
                self.changed(ino, self.fs.mkdir(&c, node(ino), name, a.mode), out)
            }
            FUSE_UNLINK => {
                let (name, _) = req.name()?;
                self.fs.unlink(&req.ctx(), node(ino), name)?;
                self.names_changed(ino);
                OK
            }
            FUSE_RMDIR => {
                let (name, _) = req.name()?;
                self.fs.rmdir(&req.ctx(), node(ino), name)?;
                self.names_changed(ino);
                OK
            }
            FUSE_SYMLINK => {
                let (name, rest) = req.name()?;
                let (target, _) = cstr(rest)?;
                self.changed(
                    ino,
                    self.fs.symlink(&req.ctx(), node(ino), name, target),
                    out,
                )
            }
            FUSE_RENAME => {
                let a: fuse_rename_in = req.arg()?;
                self.rename(req, a.newdir, 0)
            }
            FUSE_RENAME2 => {
                let a: fuse_rename2_in = req.arg()?;
                self.rename(req, a.newdir, a.flags)
            }
            FUSE_LINK => {
                let a: fuse_link_in = req.arg()?;
                let (name, _) = req.name()?;
                let r = self.fs.link(&req.ctx(), node(a.oldnodeid), node(ino), name);
                self.changed(ino, r, out)
            }
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
            FUSE_READ => {
                let a: fuse_read_in = req.arg()?;
                let buf = out.room(a.size as usize);
                // `flags` are the file's open(2) flags: `O_NOATIME` keeps the access time.
                let n = self
                    .fs
                    .read_inode_flags(node(ino), a.offset, buf, a.flags as i32)?;
                out.grow(n);
                OK
            }
            FUSE_WRITE => self.write(req, out),
            FUSE_STATFS => {
                let s = self.fs.statfs();
                put(
                    out,
                    &fuse_statfs_out {
                        st: fuse_kstatfs {
                            blocks: s.blocks,
                            bfree: s.bfree,
                            bavail: s.bavail,
                            files: s.files,
                            ffree: s.ffree,
                            bsize: s.bsize,
                            namelen: s.namelen,
                            frsize: s.frsize,
                            padding: 0,
                            spare: [0; 6],
                        },
                    },
                )
            }
            // Only a file `O_TMPFILE` made is released (no-open mode), and only before any
            // OPEN has switched no-open mode on: its handle is 0 (`Server::tmpfile`).
            FUSE_RELEASE => OK,
            FUSE_FSYNC => {
                if self.volatile_store {
                    // Nothing to make durable: ENOSYS, and the kernel sends no FSYNC again.
                    return Err(Errno::ENOSYS);
                }
                let a: fuse_fsync_in = req.arg()?;
                // Answered when the store's flush covers it, by the thread that sees that:
                // the request thread goes back to other requests instead of waiting for
                // group commit.
                let p = later();
                self.fs.fsync_inode_then(
                    node(ino),
                    a.fsync_flags & FUSE_FSYNC_FDATASYNC != 0,
                    Box::new(move |r| p.answer(r)),
                );
                Ok(Answer::Later)
            }
            FUSE_SETXATTR => {
                let a: fuse_setxattr_in = req.arg()?;
                let (name, value) = req.name()?;
                let value = value.get(..a.size as usize).ok_or(Errno::EINVAL)?;
                done(
                    self.fs
                        .setxattr(&req.ctx(), node(ino), name, value, a.flags as i32),
                )
            }
            FUSE_GETXATTR => {
                let a: fuse_getxattr_in = req.arg()?;
                let (name, _) = req.name()?;
                Self::xattr(self.fs.getxattr(&req.ctx(), node(ino), name), a.size, out)
            }
            FUSE_LISTXATTR => {
                let a: fuse_getxattr_in = req.arg()?;
                Self::xattr(self.fs.listxattr(&req.ctx(), node(ino)), a.size, out)
            }
            FUSE_REMOVEXATTR => {
                let (name, _) = req.name()?;
                done(self.fs.removexattr(&req.ctx(), node(ino), name))
            }
            FUSE_OPENDIR => self.opendir(req, out),
            FUSE_READDIR => self.readdir(req, out, false),
            FUSE_READDIRPLUS => self.readdir(req, out, true),
            FUSE_RELEASEDIR => {
                let a: fuse_release_in = req.arg()?;
                done(self.fs.releasedir(a.fh))
            }
            FUSE_FSYNCDIR => {
                if self.volatile_store {
                    // As FSYNC: the kernel sends no FSYNCDIR again.
                    return Err(Errno::ENOSYS);
                }
                let a: fuse_fsync_in = req.arg()?;
                let datasync = a.fsync_flags & FUSE_FSYNC_FDATASYNC != 0;
                if a.fh == 0 {
                    // A directory the kernel opened by itself (no-opendir mode); answered as
                    // FSYNC.
                    let p = later();
                    self.fs
                        .fsync_inode_then(node(ino), datasync, Box::new(move |r| p.answer(r)));
                    return Ok(Answer::Later);
                }
                done(self.fs.fsync(a.fh, datasync))
            }
            FUSE_ACCESS => {
                let a: fuse_access_in = req.arg()?;
                done(self.fs.access(&req.ctx(), node(ino), a.mask))
            }
            FUSE_IOCTL => self.ioctl(req, out),
            // The kernel sends only `SEEK_DATA` and `SEEK_HOLE` here (it moves offsets
            // itself).
            FUSE_LSEEK => {
                let a: fuse_lseek_in = req.arg()?;
                // Before any data and after no hole: ENXIO, as tmpfs (`shmem_file_llseek`).
                let off = i64::try_from(a.offset)
                    .ok()
                    .and_then(|o| u64::try_from(o).ok())
                    .ok_or(Errno::ENXIO)?;
                let o = self.fs.seek_data_hole(node(ino), off, a.whence as i32)?;
                put(out, &fuse_lseek_out { offset: o })
            }
            FUSE_FALLOCATE => {
                let a: fuse_fallocate_in = req.arg()?;
                done(self.fs.fallocate_inode(
                    &req.ctx(),
                    node(ino),
                    a.mode as i32,
                    a.offset,
                    a.length,
                ))
            }
            FUSE_TMPFILE => self.tmpfile(req, out),
            // Interrupts are not acted on (`dispatch.rs`).
            FUSE_INTERRUPT => Ok(Answer::None),
            FUSE_DESTROY => OK,
            // A second INIT, locks (the kernel then keeps them itself), BMAP, POLL,
            // COPY_FILE_RANGE, SYNCFS, STATX and anything newer: not implemented.
            _ => Err(Errno::ENOSYS),
        }
    }

    fn lookup(&self, req: &Call, out: &mut Out) -> Handled {
        let (name, _) = req.name()?;
        let parent = req.h.nodeid;
        if name == b"." {
            return self.lookup_dot(req, parent, out);
        }
        match self.fs.lookup(&req.ctx(), node(parent), name) {
            // A negative entry (node id 0) with the entry timeout: the kernel caches the
            // absence, so `open(O_CREAT)` of a new name skips a LOOKUP. Safe because every
            // creation goes through this mount, which replaces the negative dentry.
            Err(Errno::ENOENT) if !self.ttl.is_zero() => {
                let mut e = self.entry_out(&NEGATIVE);
                e.nodeid = 0;
                e.attr_valid = 0;
                e.attr_valid_nsec = 0;
                put(out, &e)
            }
            r => self.entry(r, out),
        }
    }

    /// LOOKUP of `.` in node `ino`: the kernel never sends one for a path (the VFS resolves
    /// `.` itself); it sends it, with FUSE_EXPORT_SUPPORT, to find an inode of any type again
    /// by its node id when an exported file handle (`open_by_handle_at`, NFS) names an inode
    /// that has left its cache. The kernel then compares the reply's generation, truncated to
    /// 32 bits, with the handle's: a number freed and reused gives ESTALE. lanefs generations
    /// are 64-bit and never reused, so a stale handle could be taken for a live one only
    /// after 2^32 more inodes were created.
    ///
    /// An unlinked inode (link count 0) is gone for the kernel: it forgot it when its last
    /// use ended, and the FORGET may still be on its way here. It is answered ENOENT (the
    /// kernel's ESTALE), as tmpfs answers for a removed file, and the reference just taken
    /// is dropped again. (An unlinked file that is still open is in the kernel's cache and
    /// is opened from there, without a LOOKUP.)
    fn lookup_dot(&self, req: &Call, ino: u64, out: &mut Out) -> Handled {
        match self.fs.lookup_inode(&req.ctx(), node(ino)) {
            Ok(a) if a.nlink == 0 => {
                self.fs.forget(node(ino), 1);
                Err(Errno::ENOENT)
            }
            r => self.entry(r, out),
        }
    }

    fn forget(&self, ino: u64, nlookup: u64) {
        // The kernel forgets an inode once, when it evicts it: no read of it is running.
        let shard = self.end_shard(ino);
        if let Some((_, Some(_))) = shard.lock().remove(&ino) {
            shard.listed.fetch_sub(1, Release);
        }
        self.fs.forget(node(ino), nlookup);
        self.forgets.done();
    }

    fn setattr(&self, req: &Call, out: &mut Out) -> Handled {
        let a: fuse_setattr_in = req.arg()?;
        let has = |bit: u32| a.valid & bit != 0;
        let mut set = SetAttr {
            mode: has(FATTR_MODE).then_some(a.mode),
            uid: has(FATTR_UID).then_some(a.uid),
            gid: has(FATTR_GID).then_some(a.gid),
            size: has(FATTR_SIZE).then_some(a.size),
            atime: has(FATTR_ATIME).then(|| tset(has(FATTR_ATIME_NOW), a.atime, a.atimensec)),
            mtime: has(FATTR_MTIME).then(|| tset(has(FATTR_MTIME_NOW), a.mtime, a.mtimensec)),
            ctime: has(FATTR_CTIME).then(|| Timespec::new(a.ctime as i64, a.ctimensec)),
            // A SETATTR that asks for nothing takes set-id bits away, as a chown does: it is
            // a `chown(path, -1, -1)` (the kernel sends no ctime without a writeback cache,
            // and leaves the bits a chown takes to the server, FUSE_HANDLE_KILLPRIV_V2,
            // flagging that only when an owner or group is given), or the kernel's own
            // removal of them before a write by someone without CAP_FSETID (whose WRITE
            // then says so too). Every other change sets a field.
            chown: a.valid & !(FATTR_FH | FATTR_LOCKOWNER) == 0,
        };
        let fh = has(FATTR_FH);
        // Without FUSE_ATOMIC_O_TRUNC, `open(O_TRUNC)` of an existing file arrives as this:
        // size 0, no handle, nothing else, exactly as a `truncate(path, 0)`. An O_TRUNC stamps
        // mtime and ctime even on an empty file (tmpfs); a truncate to an unchanged size does
        // not. Taken as the O_TRUNC it far more often is (so `truncate(path, 0)` of an empty
        // file stamps the times here, unlike on tmpfs).
        let truncate_to_zero = SetAttr {
            size: Some(0),
            ..SetAttr::default()
        };
        if !fh && set == truncate_to_zero {
            set.mtime = Some(lanefs::TimeSet::Now);
        }
        // A handle means an `ftruncate` of a file the kernel holds open for writing.
        let by = fh.then_some(TruncateBy::OpenFile);
        // A truncate says whether its caller may keep set-id bits (root without CAP_FSETID
        // may not), as a WRITE does.
        let mut c = req.ctx();
        if set.size.is_some() {
            c.keeps_setid = !has(FATTR_KILL_SUIDGID);
        }
        self.attr(self.fs.setattr(&c, node(req.h.nodeid), &set, by), out)
    }

    fn rename(&self, req: &Call, newparent: u64, flags: u32) -> Handled {
        let (name, rest) = req.name()?;
        let (newname, _) = cstr(rest)?;
        let parent = req.h.nodeid;
        let r = self.fs.rename(
            &req.ctx(),
            node(parent),
            name,
            node(newparent),
            newname,
            flags,
        );
        r?;
        self.names_changed(parent);
        if parent != newparent {
            self.names_changed(newparent);
            self.moved_dirs(req, newparent, newname, parent, name, flags);
        }
        OK
    }

    fn write(&self, req: &Call, out: &mut Out) -> Handled {
        let a: fuse_write_in = req.arg()?;
        let data = req.data.get(..a.size as usize).ok_or(Errno::EINVAL)?;
        // With FUSE_HANDLE_KILLPRIV_V2 the kernel flags a write whose writer lacks
        // CAP_FSETID on a file with set-id bits to take away; without the flag there is
        // nothing the writer must lose.
        let mut c = req.ctx();
        c.keeps_setid = a.write_flags & FUSE_WRITE_KILL_SUIDGID == 0;
        // The file's open flags come along: the engine refuses a write the open would have
        // been refused for had the kernel known the inode flags (immutable, or append-only
        // without O_APPEND).
        let r = self
            .fs
            .write_inode_flags(&c, node(req.h.nodeid), a.offset, data, a.flags as i32);
        if a.write_flags & FUSE_WRITE_CACHE != 0 {
            let done = *r.as_ref().unwrap_or(&0) as u64;
            if done < data.len() as u64 {
                self.drop_pages_later(req.h.nodeid, a.offset + done, data.len() as u64 - done);
            }
        }
        let n = r?;
        put(
            out,
            &fuse_write_out {
                size: n as u32,
                padding: 0,
            },
        )
    }

    /// With `FUSE_NO_OPENDIR_SUPPORT` (Linux 5.1 on): ENOSYS, once, and the kernel opens
    /// directories by itself from then on, with no OPENDIR or RELEASEDIR, and keeps their
    /// listings (`FOPEN_CACHE_DIR | FOPEN_KEEP_CACHE` is its default for such opens); READDIR
    /// then comes with handle 0. An older kernel gets an engine handle and those two flags.
    fn opendir(&self, req: &Call, out: &mut Out) -> Handled {
        if self.no_opendir {
            return Err(Errno::ENOSYS);
        }
        let a: fuse_open_in = req.arg()?;
        let fh = self
            .fs
            .opendir_flags(&req.ctx(), node(req.h.nodeid), a.flags as i32)?;
        // The kernel keeps the listing it reads in the directory's page cache, and keeps it
        // across opens (module doc, "Directory listings").
        put(
            out,
            &fuse_open_out {
                fh,
                open_flags: FOPEN_CACHE_DIR | FOPEN_KEEP_CACHE,
                padding: 0,
            },
        )
    }

    /// READDIR and READDIRPLUS: entries as `fuse_dirent` (`fuse_direntplus` with attributes),
    /// each padded to 8 bytes, as many as fit in the size asked for.
    fn readdir(&self, req: &Call, out: &mut Out, plus: bool) -> Handled {
        let a: fuse_read_in = req.arg()?;
        let size = a.size as usize;
        self.read_dir(req, req.h.nodeid, a.fh, a.offset, plus, |e, attr| {
            let d = fuse_dirent {
                ino: e.ino.get(),
                off: e.offset,
                namelen: e.name.len() as u32,
                typ: dtype(e.kind),
                name: [],
            };
            let head =
                if plus { size_of::<fuse_entry_out>() } else { 0 } + size_of::<fuse_dirent>();
            let len = head + e.name.len();
            let padded = len.next_multiple_of(8);
            if out.len() + padded > size {
                return false;
            }
            let start = out.len();
            let ok = match (plus, attr) {
                (true, Some(attr)) => out.push_obj(&self.listed_entry_out(attr)),
                // Node id 0: the kernel takes the name only, no inode or attributes (and no
                // lookup reference); the engine withholds a file's attributes so
                // ([`lanefs::Filesystem::readdir`]).
                (true, None) => out.push_obj(&fuse_entry_out::new_zeroed()),
                (false, _) => true,
            } && out.push_obj(&d)
                && out.push(e.name)
                && out.push(&[0u8; 8][..padded - len]);
            if !ok {
                // Never expected (the size fits the buffer): end the read before this entry.
                out.truncate(start);
            }
            ok
        })?;
        OK
    }

    fn xattr(r: lanefs::Result<Vec<u8>>, size: u32, out: &mut Out) -> Handled {
        let v = r?;
        if size == 0 {
            return put(
                out,
                &fuse_getxattr_out {
                    size: v.len() as u32,
                    padding: 0,
                },
            );
        }
        if v.len() > size as usize || !out.push(&v) {
            return Err(Errno::ERANGE);
        }
        OK
    }

    /// Inode flags: the kernel turns `FS_IOC_GETFLAGS` / `FS_IOC_SETFLAGS` and
    /// `FS_IOC_FSGETXATTR` / `FS_IOC_FSSETXATTR` on a regular file or directory into these
    /// (`fuse_fileattr_get` / `fuse_fileattr_set`, after its own owner and
    /// `CAP_LINUX_IMMUTABLE` checks, and after fetching the old flags with
    /// `FS_IOC_FSGETXATTR`, which a `chattr` therefore needs too). Every other ioctl is
    /// ENOTTY, as on tmpfs.
    fn ioctl(&self, req: &Call, out: &mut Out) -> Handled {
        let a: fuse_ioctl_in = req.arg()?;
        let ino = node(req.h.nodeid);
        let in_data = req.data;
        let out_size = a.out_size as usize;
        // The kernel keeps the attributes it cached across an ioctl, and a flag change
        // stamps the ctime: made as a library caller's change, it is reported to the kernel
        // as an attribute invalidation (an inode's, never an entry's, which is safe from a
        // request thread), before this reply.
        let setter = || {
            let mut c = req.ctx();
            c.via = lanefs::Via::Library;
            c
        };
        let word = |b: &[u8], i: usize| {
            b.get(i * 4..i * 4 + 4)
                .map(|w| u32::from_ne_bytes(w.try_into().expect("4 bytes")))
        };
        let reply = |out: &mut Out, data: &[u8]| -> Handled {
            let o = fuse_ioctl_out {
                result: 0,
                flags: 0,
                in_iovs: 0,
                out_iovs: 0,
            };
            if out.push_obj(&o) && out.push(&data[..out_size.min(data.len())]) {
                OK
            } else {
                Err(Errno::ERANGE)
            }
        };
        match a.cmd {
            ioctl::GETFLAGS | ioctl::GETFLAGS32 => {
                let f = self.fs.get_flags(ino)?;
                reply(out, &f.to_ne_bytes())
            }
            ioctl::SETFLAGS | ioctl::SETFLAGS32 => {
                let f = word(in_data, 0).ok_or(Errno::EINVAL)?;
                self.fs.set_flags(&setter(), ino, f)?;
                reply(out, &[])
            }
            ioctl::FSGETXATTR => {
                let f = self.fs.get_flags(ino)?;
                let mut b = [0u8; ioctl::FSXATTR_SIZE];
                b[..4].copy_from_slice(&ioctl::xflags_of(f).to_ne_bytes());
                reply(out, &b)
            }
            ioctl::FSSETXATTR => {
                // tmpfs keeps no extent sizes or project ids, and of the xflags only the
                // common ones, which map to inode flags (`fileattr_has_fsx`).
                let x: Vec<u32> = (0..5)
                    .map(|i| word(in_data, i))
                    .collect::<Option<_>>()
                    .ok_or(Errno::EINVAL)?;
                let (xflags, extsize, projid, cowextsize) = (x[0], x[1], x[3], x[4]);
                if xflags & !ioctl::XFLAG_COMMON != 0 || extsize | projid | cowextsize != 0 {
                    return Err(Errno::EOPNOTSUPP);
                }
                self.fs.set_flags(&setter(), ino, ioctl::flags_of(xflags))?;
                reply(out, &[])
            }
            _ => Err(Errno::ENOTTY),
        }
    }

    /// `O_TMPFILE` (FUSE_TMPFILE: CREATE's arguments, with the name "/", and CREATE's
    /// reply): a regular file with no name, made by the engine as the directory allows
    /// ([`lanefs::Filesystem::tmpfile`]; the mode comes unmasked with the umask, as MKNOD's,
    /// and the open flags carry `O_EXCL` when the file may never be linked). The kernel gets
    /// its entry (one lookup reference, which FORGET drops after the last close: until then
    /// it keeps the nameless file alive) and an open reply. Regular files are served by
    /// inode (no-open mode), so the engine's handle is released at once and the reply's
    /// handle is 0: reads and writes come by inode, and a RELEASE (sent for it when no OPEN
    /// has switched no-open mode on yet) is answered OK. A LINK of its node id then gives it
    /// a name (`linkat` through `/proc/self/fd` or `AT_EMPTY_PATH`).
    fn tmpfile(&self, req: &Call, out: &mut Out) -> Handled {
        let a: fuse_create_in = req.arg()?;
        let c = req.ctx().with_umask(a.umask);
        let (attr, fh) = self
            .fs
            .tmpfile(&c, node(req.h.nodeid), a.mode, a.flags as i32)?;
        // The lookup reference the entry carries keeps the file; the handle is not needed.
        if let Err(e) = self.fs.release(fh) {
            self.fs.forget(attr.ino, 1); // never expected: a handle just made
            return Err(e);
        }
        let open = fuse_open_out {
            fh: 0,
            open_flags: FOPEN_KEEP_CACHE,
            padding: 0,
        };
        if out.push_obj(&self.entry_out(&attr)) && out.push_obj(&open) {
            OK
        } else {
            // Never expected (the reply is small): the kernel will not hold the reference.
            self.fs.forget(attr.ino, 1);
            Err(Errno::ERANGE)
        }
    }

    fn end_shard(&self, ino: u64) -> &EndShard {
        &self.read_ends[ino as usize % READ_END_SHARDS]
    }

    /// After a request changed the names of directory `dir` (made, removed, linked or
    /// renamed one), before its reply: drops the kernel's cached listing of `dir` if a read
    /// from offset 0 reached lanefs since it was last dropped. The kernel's own check of a
    /// cached listing (its `i_version`, at a read from offset 0) misses one case: a listing
    /// read in several `getdents` calls is filled into the cache across them, and a change
    /// between two calls leaves a cache that, once complete, holds names from before the
    /// change; a later read from offset 0 starts over, but a read that got its first page
    /// from lanefs and continues at a later offset is served the rest from that cache, so it
    /// can show a name removed before it began. Dropped here, the cache's pages are gone,
    /// and the kernel starts the cache over at the next read. Safe from a request thread: the
    /// kernel holds `dir`'s `i_rwsem` exclusively for the change, so no `getdents` of it is
    /// in flight, and an inode invalidation takes no inode lock.
    fn names_changed(&self, dir: u64) {
        let shard = self.end_shard(dir);
        if shard.listed.load(Acquire) == 0 {
            return;
        }
        if !EndShard::unlist(&mut shard.lock(), &shard.listed, dir) {
            return;
        }
        if let Some(kc) = self.notifier.get() {
            kc.drop_listing(Ino(dir));
        }
    }

    /// After a write-back WRITE (`FUSE_WRITE_CACHE`: the kernel writing pages a program
    /// dirtied through `mmap`) that stored less than it carried (ENOSPC, EIO): the kernel
    /// keeps those pages, clean and up to date, once the WRITE ends, so reads would go on
    /// showing bytes the filesystem does not hold until the pages leave the cache. They are
    /// dropped instead, so that every read shows what is stored (the program learns of the
    /// failure from `msync`, `fsync` or `close`, as with any failed write-back; tmpfs
    /// refuses the store itself with SIGBUS, which FUSE cannot, since the kernel asks the
    /// server nothing when a mapped page is first written). Not from this thread, and not
    /// before the reply: the invalidation waits for each page's write-back to end, which
    /// is this request's reply, and lays dirty pages down with WRITEs that a request thread
    /// must be free to answer. So a thread of its own does it, in the order they came.
    fn drop_pages_later(&self, ino: u64, off: u64, len: u64) {
        let tx = self.failed_pages.get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel::<(u64, u64, u64)>();
            let kc = Arc::downgrade(&self.notifier);
            let started = std::thread::Builder::new()
                .name("lanefs-pages".into())
                .spawn(move || {
                    while let Ok((ino, off, len)) = rx.recv() {
                        let Some(kc) = kc.upgrade() else { return };
                        if let Some(kc) = kc.get() {
                            kc.drop_pages(Ino(ino), off, len);
                        }
                    }
                });
            if let Err(e) = started {
                // The pages stay until they leave the cache; nothing else is lost.
                eprintln!("lanefs: cannot start the thread that drops failed pages: {e}");
            }
            tx
        });
        let _ = tx.send((ino, off, len));
    }

    /// Where a handle-free read of `ino` at `offset` ends: a read from offset 0 takes the
    /// directory's end now and records it (under the shard's lock, so the recorded end is
    /// always the latest taken); a read from a later offset continues to the recorded one.
    /// The kernel reads a directory from offset 0 whenever it has no valid cached listing,
    /// so the recorded end is never older than the latest change of the directory the
    /// kernel knew of when the read began; a read that started earlier may end later than
    /// where it started (names created meanwhile may be returned, as POSIX allows), but a
    /// name renamed away and back while one read runs is not returned twice, so every read
    /// ends.
    fn dir_end(&self, ino: u64, offset: u64) -> lanefs::Result<DirEnd> {
        let shard = self.end_shard(ino);
        let mut ends = shard.lock();
        match ends.get(&ino) {
            Some((end, _)) if offset != 0 => Ok(end.clone()),
            _ => {
                let end = self.fs.read_end(node(ino))?;
                let at = Some(Instant::now());
                if !matches!(ends.insert(ino, (end.clone(), at)), Some((_, Some(_)))) {
                    shard.listed.fetch_add(1, Release);
                }
                Ok(end)
            }
        }
    }

    /// READDIR and READDIRPLUS: by inode without a handle (`fh` 0, no-opendir mode), or
    /// through the engine handle OPENDIR made.
    fn read_dir(
        &self,
        req: &Call,
        ino: u64,
        fh: u64,
        offset: u64,
        plus: bool,
        f: impl FnMut(lanefs::DirEntry<'_>, Option<&Attr>) -> bool,
    ) -> lanefs::Result<()> {
        if fh == 0 {
            let end = self.dir_end(ino, offset)?;
            self.fs
                .readdir_inode(&req.ctx(), node(ino), offset, &end, plus, f)
        } else {
            if offset == 0 {
                // The handle keeps where its read ends; this records that the kernel may be
                // filling its cache of the listing (`names_changed`).
                self.dir_end(ino, 0)?;
            }
            self.fs.readdir(&req.ctx(), fh, offset, plus, f)
        }
    }

    /// After a RENAME between two directories: drops the cached listing of each directory it
    /// moved (now `newname` in `newparent`, and with `RENAME_EXCHANGE` also `name` in
    /// `parent`), whose `..` changed, a change the kernel does not see as one of that
    /// directory. Sent before the reply, while the kernel holds the moved directories'
    /// `i_rwsem` (`vfs_rename` locks a directory it moves to another parent), so no `getdents`
    /// of them is in flight to put the old `..` back. An inode invalidation takes no inode
    /// lock, so it is safe from a request thread.
    fn moved_dirs(
        &self,
        req: &Call,
        newparent: u64,
        newname: &[u8],
        parent: u64,
        name: &[u8],
        flags: u32,
    ) {
        let Some(kc) = self.notifier.get() else {
            return;
        };
        // A library caller's lookup: it takes no lookup reference for the kernel.
        let mut c = req.ctx();
        c.via = lanefs::Via::Library;
        let mut at = vec![(newparent, newname)];
        if flags & lanefs::RENAME_EXCHANGE != 0 {
            at.push((parent, name));
        }
        for (dir, n) in at {
            if let Ok(a) = self.fs.lookup(&c, node(dir), n)
                && a.kind() == FileType::Directory
            {
                kc.drop_listing(a.ino);
            }
        }
    }
}
