//! Request translation.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    AccessFlags, BsdFileFlags, Config as FuserConfig, Errno as FErrno, FileAttr, FileHandle,
    FileType as FType, FopenFlags, Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig,
    LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, SessionACL, TimeOrNow, WriteFlags,
};
use lanefs::{
    Attr, Ctx, DirEnd, Errno, FileType, Filesystem, Ino, SetAttr, TimeSet, Timespec, TruncateBy,
};

use crate::{creds, mnt};

/// How to mount.
#[derive(Clone, Debug)]
pub struct MountConfig {
    /// Entry and attribute cache timeout given to the kernel.
    pub ttl: Duration,
    /// Request threads (default: one per CPU; more only adds wake-ups on an idle machine).
    pub threads: usize,
    /// Let other users use the mount (`allow_other`).
    pub allow_other: bool,
    /// Mount read-only.
    pub read_only: bool,
    /// Shown as the mount's source (`fsname`).
    pub source: String,
    /// Kernel mount flags (nosuid, nodev, noexec, sync, ...).
    pub flags: Vec<MountOption>,
}

impl Default for MountConfig {
    fn default() -> Self {
        MountConfig {
            ttl: Duration::from_secs(60),
            threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            allow_other: false,
            read_only: false,
            source: "lanefs".into(),
            flags: Vec::new(),
        }
    }
}

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
    notifier: Arc<OnceLock<mnt::KernelCache>>,
    /// The kernel opens directories by itself (`FUSE_NO_OPENDIR_SUPPORT`, so OPENDIR is
    /// answered ENOSYS): READDIR comes with handle 0 and is read by inode.
    no_opendir: bool,
    /// Where the latest read from offset 0 of each directory (by node id) ends, for the reads
    /// from later offsets that follow it without a handle, and when it was made (see
    /// [`expire_listings`]). Sharded by node id; an entry goes when the kernel forgets the
    /// directory.
    read_ends: Arc<ReadEnds>,
}

const READ_END_SHARDS: usize = 16;

/// Per directory: where its latest read from offset 0 ends, and when that read was made while
/// its listing has not been dropped since.
type ReadEnds = [Mutex<HashMap<u64, (DirEnd, Option<Instant>)>>; READ_END_SHARDS];

/// Drops the kernel's cached listing of each directory read from offset 0 more than `ttl`
/// ago, every `ttl / 4`, until the server is gone. A listing served from the cache comes
/// without attributes, so once the entries it names have expired (the entry timeout is
/// `ttl`), a walk through it would revalidate each with a LOOKUP; read again, the directory
/// comes with READDIRPLUS, which refreshes every entry in one request per page. Only speed
/// depends on this: a listing is right however old it is (module doc, "Directory listings").
fn expire_listings(
    ends: std::sync::Weak<ReadEnds>,
    kc: Arc<OnceLock<mnt::KernelCache>>,
    ttl: Duration,
) {
    let period = (ttl / 4).max(Duration::from_millis(100));
    loop {
        std::thread::sleep(period);
        let Some(ends) = ends.upgrade() else {
            return;
        };
        let Some(kc) = kc.get() else {
            continue;
        };
        let mut old = Vec::new();
        for shard in ends.iter() {
            let mut shard = shard.lock().unwrap_or_else(|e| e.into_inner());
            for (ino, (_, at)) in shard.iter_mut() {
                if at.is_some_and(|t| t.elapsed() >= ttl) {
                    *at = None; // until the directory is read from offset 0 again
                    old.push(*ino);
                }
            }
        }
        for ino in old {
            kc.drop_listing(Ino(ino));
        }
    }
}

fn err(e: Errno) -> FErrno {
    FErrno::from_i32(e.code())
}

fn time(t: Timespec) -> SystemTime {
    t.into()
}

fn ftype(k: FileType) -> FType {
    match k {
        FileType::RegularFile => FType::RegularFile,
        FileType::Directory => FType::Directory,
        FileType::Symlink => FType::Symlink,
        FileType::CharDevice => FType::CharDevice,
        FileType::BlockDevice => FType::BlockDevice,
        FileType::NamedPipe => FType::NamedPipe,
        FileType::Socket => FType::Socket,
    }
}

/// The engine's inode number for a FUSE node id (they are the same numbers).
fn node(n: INodeNo) -> Ino {
    Ino(n.0)
}

fn fattr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino.get()),
        size: a.size,
        blocks: a.blocks,
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
        crtime: time(a.ctime),
        kind: ftype(a.kind()),
        perm: a.perm() as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev as u32,
        blksize: a.blksize,
        flags: 0,
    }
}

fn tset(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(st) => TimeSet::At(st.into()),
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

/// The caller's credentials (`creds.rs`).
fn ctx(req: &Request) -> Ctx {
    creds::ctx(req.uid(), req.gid(), req.pid())
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
        }
    }

    /// A server for `fs` mounted as `cfg` says.
    pub fn with_config(fs: Arc<Filesystem>, cfg: &MountConfig) -> Server {
        Server::new(fs, cfg.ttl)
    }

    fn entry(&self, r: lanefs::Result<Attr>, reply: ReplyEntry) {
        match r {
            Ok(a) => reply.entry(&self.ttl, &fattr(&a), Generation(a.generation.0)),
            Err(e) => reply.error(err(e)),
        }
    }

    fn attr(&self, r: lanefs::Result<Attr>, reply: ReplyAttr) {
        match r {
            Ok(a) => reply.attr(&self.ttl, &fattr(&a)),
            Err(e) => reply.error(err(e)),
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
    fn lookup_dot(&self, req: &Request, ino: INodeNo, reply: ReplyEntry) {
        match self.fs.lookup_inode(&ctx(req), node(ino)) {
            Ok(a) if a.nlink == 0 => {
                self.fs.forget(node(ino), 1);
                reply.error(FErrno::ENOENT);
            }
            r => self.entry(r, reply),
        }
    }

    fn empty(r: lanefs::Result<()>, reply: ReplyEmpty) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(err(e)),
        }
    }

    fn read_ends(
        &self,
        ino: INodeNo,
    ) -> std::sync::MutexGuard<'_, HashMap<u64, (DirEnd, Option<Instant>)>> {
        self.read_ends[ino.0 as usize % READ_END_SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
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
    fn dir_end(&self, ino: INodeNo, offset: u64) -> lanefs::Result<DirEnd> {
        let mut ends = self.read_ends(ino);
        match ends.get(&ino.0) {
            Some((end, _)) if offset != 0 => Ok(end.clone()),
            _ => {
                let end = self.fs.read_end(node(ino))?;
                ends.insert(ino.0, (end.clone(), Some(Instant::now())));
                Ok(end)
            }
        }
    }

    /// READDIR and READDIRPLUS: by inode without a handle (`fh` 0, no-opendir mode), or
    /// through the engine handle OPENDIR made.
    fn read_dir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        plus: bool,
        f: impl FnMut(lanefs::DirEntry<'_>, Option<&Attr>) -> bool,
    ) -> lanefs::Result<()> {
        if fh.0 == 0 {
            let end = self.dir_end(ino, offset)?;
            self.fs
                .readdir_inode(&ctx(req), node(ino), offset, &end, plus, f)
        } else {
            self.fs.readdir(&ctx(req), fh.0, offset, plus, f)
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
        req: &Request,
        newparent: INodeNo,
        newname: &OsStr,
        parent: INodeNo,
        name: &OsStr,
        flags: RenameFlags,
    ) {
        let Some(kc) = self.notifier.get() else {
            return;
        };
        // A library caller's lookup: it takes no lookup reference for the kernel.
        let mut c = ctx(req);
        c.via = lanefs::Via::Library;
        let mut at = vec![(newparent, newname)];
        if flags.bits() & lanefs::RENAME_EXCHANGE != 0 {
            at.push((parent, name));
        }
        for (dir, n) in at {
            if let Ok(a) = self.fs.lookup(&c, node(dir), n.as_bytes())
                && a.kind() == FileType::Directory
            {
                kc.drop_listing(a.ino);
            }
        }
    }

    fn xattr(r: lanefs::Result<Vec<u8>>, size: u32, reply: ReplyXattr) {
        match r {
            Ok(v) if size == 0 => reply.size(v.len() as u32),
            Ok(v) if v.len() > size as usize => reply.error(FErrno::ERANGE),
            Ok(v) => reply.data(&v),
            Err(e) => reply.error(err(e)),
        }
    }
}

impl fuser::Filesystem for Server {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let want = InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            | InitFlags::FUSE_CACHE_SYMLINKS
            | InitFlags::FUSE_HANDLE_KILLPRIV_V2
            | InitFlags::FUSE_POSIX_ACL
            | InitFlags::FUSE_DONT_MASK
            | InitFlags::FUSE_EXPORT_SUPPORT;
        let have = config.capabilities() & want;
        let _ = config.add_capabilities(have);
        self.no_opendir = config
            .capabilities()
            .contains(InitFlags::FUSE_NO_OPENDIR_SUPPORT);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if name.as_bytes() == b"." {
            return self.lookup_dot(req, parent, reply);
        }
        match self.fs.lookup(&ctx(req), node(parent), name.as_bytes()) {
            // A negative entry (node id 0) with the entry timeout: the kernel caches the
            // absence, so `open(O_CREAT)` of a new name skips a LOOKUP. Safe because every
            // creation goes through this mount, which replaces the negative dentry.
            Err(Errno::ENOENT) if !self.ttl.is_zero() => {
                let mut a = fattr(&NEGATIVE);
                a.ino = INodeNo(0);
                reply.entry(&self.ttl, &a, Generation(0));
            }
            r => self.entry(r, reply),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        // The kernel forgets an inode once, when it evicts it: no read of it is running.
        self.read_ends(ino).remove(&ino.0);
        self.fs.forget(node(ino), nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.attr(self.fs.getattr(node(ino)), reply);
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(tset),
            mtime: mtime.map(tset),
            ctime: ctime.map(Into::into),
        };
        // Without FUSE_ATOMIC_O_TRUNC, `open(O_TRUNC)` of an existing file arrives as this:
        // size 0, no handle, nothing else, exactly as a `truncate(path, 0)`. An O_TRUNC stamps
        // mtime and ctime even on an empty file (tmpfs); a truncate to an unchanged size does
        // not. Taken as the O_TRUNC it far more often is (so `truncate(path, 0)` of an empty
        // file stamps the times here, unlike on tmpfs).
        let truncate_to_zero = SetAttr {
            size: Some(0),
            ..SetAttr::default()
        };
        if fh.is_none() && set == truncate_to_zero {
            set.mtime = Some(lanefs::TimeSet::Now);
        }
        self.attr(
            // A handle means an `ftruncate` of a file the kernel holds open for writing.
            self.fs
                .setattr(&ctx(req), node(ino), &set, fh.map(|_| TruncateBy::OpenFile)),
            reply,
        );
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.readlink(node(ino)) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(err(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let ctx = ctx(req).with_umask(umask);
        self.entry(
            self.fs
                .mknod(&ctx, node(parent), name.as_bytes(), mode, rdev as u64),
            reply,
        );
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let ctx = ctx(req).with_umask(umask);
        self.entry(
            self.fs.mkdir(&ctx, node(parent), name.as_bytes(), mode),
            reply,
        );
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        Self::empty(
            self.fs.unlink(&ctx(req), node(parent), name.as_bytes()),
            reply,
        );
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        Self::empty(
            self.fs.rmdir(&ctx(req), node(parent), name.as_bytes()),
            reply,
        );
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let r = self.fs.symlink(
            &ctx(req),
            node(parent),
            link_name.as_bytes(),
            target.as_os_str().as_bytes(),
        );
        self.entry(r, reply);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let r = self.fs.rename(
            &ctx(req),
            node(parent),
            name.as_bytes(),
            node(newparent),
            newname.as_bytes(),
            flags.bits(),
        );
        if r.is_ok() && parent != newparent {
            self.moved_dirs(req, newparent, newname, parent, name, flags);
        }
        Self::empty(r, reply);
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.entry(
            self.fs
                .link(&ctx(req), node(ino), node(newparent), newname.as_bytes()),
            reply,
        );
    }

    /// Regular files are opened by the kernel alone (no-open mode): ENOSYS here tells it so,
    /// once, and it sends no OPEN, FLUSH or RELEASE for such files afterwards.
    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.error(FErrno::ENOSYS);
    }

    /// Regular files reach the server by inode: the kernel opened them (no-open mode), so
    /// the handle of a read, write, fsync, fallocate or ftruncate is always 0.
    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let mut buf = vec![0u8; size as usize];
        match self.fs.read_inode(node(ino), offset, &mut buf) {
            Ok(n) => reply.data(&buf[..n]),
            Err(e) => reply.error(err(e)),
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        // With FUSE_HANDLE_KILLPRIV_V2 the kernel flags a write whose writer lacks
        // CAP_FSETID on a file with set-id bits to take away; without the flag there is
        // nothing the writer must lose.
        let mut c = ctx(req);
        c.keeps_setid = !write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        // The file's open flags come along: the engine refuses a write the open would have
        // been refused for had the kernel known the inode flags (immutable, or append-only
        // without O_APPEND).
        match self
            .fs
            .write_inode_flags(&c, node(ino), offset, data, flags.0)
        {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(err(e)),
        }
    }

    /// A close has nothing to write back: ENOSYS tells the kernel to stop sending FLUSH (files
    /// it opened itself come without `FOPEN_NOFLUSH`).
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.error(FErrno::ENOSYS);
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        if self.volatile_store {
            // Nothing to make durable: ENOSYS, and the kernel sends no FSYNC again.
            return reply.error(FErrno::ENOSYS);
        }
        // Answered when the store's flush covers it, by the thread that sees that: the server
        // thread goes back to other requests instead of waiting for group commit.
        self.fs.fsync_inode_then(
            node(ino),
            datasync,
            Box::new(move |r| Self::empty(r, reply)),
        );
    }

    /// With `FUSE_NO_OPENDIR_SUPPORT` (Linux 5.1 on): ENOSYS, once, and the kernel opens
    /// directories by itself from then on, with no OPENDIR or RELEASEDIR, and keeps their
    /// listings (`FOPEN_CACHE_DIR | FOPEN_KEEP_CACHE` is its default for such opens); READDIR
    /// then comes with handle 0. An older kernel gets an engine handle and those two flags.
    fn opendir(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if self.no_opendir {
            return reply.error(FErrno::ENOSYS);
        }
        match self.fs.opendir_flags(&ctx(req), node(ino), flags.0) {
            // The kernel keeps the listing it reads in the directory's page cache, and keeps
            // it across opens (module doc, "Directory listings").
            Ok(fh) => reply.opened(
                FileHandle(fh),
                FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE,
            ),
            Err(e) => reply.error(err(e)),
        }
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = self.read_dir(req, ino, fh, offset, false, |e, _| {
            !reply.add(
                INodeNo(e.ino.get()),
                e.offset,
                ftype(e.kind),
                OsStr::from_bytes(e.name),
            )
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(err(e)),
        }
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let ttl = self.ttl;
        let r = self.read_dir(req, ino, fh, offset, true, |e, a| {
            let a = a.expect("readdirplus gives attributes");
            !reply.add(
                INodeNo(e.ino.get()),
                e.offset,
                OsStr::from_bytes(e.name),
                &ttl,
                &fattr(a),
                Generation(a.generation.0),
            )
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(err(e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        Self::empty(self.fs.releasedir(fh.0), reply);
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        if self.volatile_store {
            // As FSYNC: the kernel sends no FSYNCDIR again.
            return reply.error(FErrno::ENOSYS);
        }
        if fh.0 == 0 {
            // A directory the kernel opened by itself (no-opendir mode); answered as FSYNC.
            return self.fs.fsync_inode_then(
                node(ino),
                datasync,
                Box::new(move |r| Self::empty(r, reply)),
            );
        }
        Self::empty(self.fs.fsync(fh.0, datasync), reply);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = self.fs.statfs();
        reply.statfs(
            s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
        );
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        position: u32,
        reply: ReplyEmpty,
    ) {
        if position != 0 {
            return reply.error(FErrno::EINVAL);
        }
        Self::empty(
            self.fs
                .setxattr(&ctx(req), node(ino), name.as_bytes(), value, flags),
            reply,
        );
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        Self::xattr(
            self.fs.getxattr(&ctx(req), node(ino), name.as_bytes()),
            size,
            reply,
        );
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        Self::xattr(self.fs.listxattr(&ctx(req), node(ino)), size, reply);
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        Self::empty(
            self.fs.removexattr(&ctx(req), node(ino), name.as_bytes()),
            reply,
        );
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        Self::empty(
            self.fs.access(&ctx(req), node(ino), mask.bits() as u32),
            reply,
        );
    }

    /// ENOSYS: the kernel then creates with MKNOD and opens the new file itself (no-open
    /// mode), so a created file, like an opened one, sends no RELEASE. `open(O_CREAT)` stays
    /// one system call with the creator's access: the kernel skips the permission check on a
    /// file its open created.
    fn create(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        reply.error(FErrno::ENOSYS);
    }

    /// Inode flags: the kernel turns `FS_IOC_GETFLAGS` / `FS_IOC_SETFLAGS` and
    /// `FS_IOC_FSGETXATTR` / `FS_IOC_FSSETXATTR` on a regular file or directory into these
    /// (`fuse_fileattr_get` / `fuse_fileattr_set`, after its own owner and
    /// `CAP_LINUX_IMMUTABLE` checks, and after fetching the old flags with
    /// `FS_IOC_FSGETXATTR`, which a `chattr` therefore needs too). Every other ioctl is
    /// ENOTTY, as on tmpfs.
    fn ioctl(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        // The kernel keeps the attributes it cached across an ioctl, and a flag change
        // stamps the ctime: made as a library caller's change, it is reported to the kernel
        // as an attribute invalidation (an inode's, never an entry's, which is safe from a
        // request thread), before this reply.
        let setter = || {
            let mut c = ctx(req);
            c.via = lanefs::Via::Library;
            c
        };
        let word = |b: &[u8], i: usize| {
            b.get(i * 4..i * 4 + 4)
                .map(|w| u32::from_ne_bytes(w.try_into().expect("4 bytes")))
        };
        match cmd {
            ioctl::GETFLAGS | ioctl::GETFLAGS32 => match self.fs.get_flags(node(ino)) {
                Ok(f) => {
                    let b = f.to_ne_bytes();
                    reply.ioctl(0, &b[..(out_size as usize).min(b.len())]);
                }
                Err(e) => reply.error(err(e)),
            },
            ioctl::SETFLAGS | ioctl::SETFLAGS32 => match word(in_data, 0) {
                Some(f) => match self.fs.set_flags(&setter(), node(ino), f) {
                    Ok(_) => reply.ioctl(0, &[]),
                    Err(e) => reply.error(err(e)),
                },
                None => reply.error(FErrno::EINVAL),
            },
            ioctl::FSGETXATTR => match self.fs.get_flags(node(ino)) {
                Ok(f) => {
                    let mut b = [0u8; ioctl::FSXATTR_SIZE];
                    b[..4].copy_from_slice(&ioctl::xflags_of(f).to_ne_bytes());
                    reply.ioctl(0, &b[..(out_size as usize).min(b.len())]);
                }
                Err(e) => reply.error(err(e)),
            },
            ioctl::FSSETXATTR => {
                // tmpfs keeps no extent sizes or project ids, and of the xflags only the
                // common ones, which map to inode flags (`fileattr_has_fsx`).
                let fields: Option<Vec<u32>> = (0..5).map(|i| word(in_data, i)).collect();
                let Some(x) = fields else {
                    return reply.error(FErrno::EINVAL);
                };
                let (xflags, extsize, projid, cowextsize) = (x[0], x[1], x[3], x[4]);
                if xflags & !ioctl::XFLAG_COMMON != 0 || extsize | projid | cowextsize != 0 {
                    return reply.error(FErrno::EOPNOTSUPP);
                }
                match self
                    .fs
                    .set_flags(&setter(), node(ino), ioctl::flags_of(xflags))
                {
                    Ok(_) => reply.ioctl(0, &[]),
                    Err(e) => reply.error(err(e)),
                }
            }
            _ => reply.error(FErrno::from_i32(libc::ENOTTY)),
        }
    }

    /// The kernel sends only `SEEK_DATA` and `SEEK_HOLE` here (it moves offsets itself).
    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        // Before any data and after no hole: ENXIO, as tmpfs (`shmem_file_llseek`) answers.
        let Ok(offset) = u64::try_from(offset) else {
            return reply.error(FErrno::ENXIO);
        };
        match self.fs.seek_data_hole(node(ino), offset, whence) {
            Ok(o) => reply.offset(o as i64),
            Err(e) => reply.error(err(e)),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        Self::empty(
            self.fs
                .fallocate_inode(&ctx(req), node(ino), mode, offset, length),
            reply,
        );
    }
}

fn options(cfg: &MountConfig) -> FuserConfig {
    let mut o = FuserConfig::default();
    o.mount_options = vec![
        MountOption::FSName(cfg.source.clone()),
        MountOption::Subtype("lanefs".into()),
        MountOption::DefaultPermissions,
    ];
    if cfg.read_only {
        o.mount_options.push(MountOption::RO);
    }
    o.mount_options.extend(cfg.flags.iter().cloned());
    if cfg.allow_other {
        o.acl = SessionACL::All;
    }
    o.n_threads = Some(cfg.threads.max(1));
    o.clone_fd = true;
    o
}

/// Mounts `fs` and opens its FUSE session: with `mount(2)` as root (the returned
/// `DirectMount` then is the mount), through `fusermount3` otherwise (the session owns it).
fn new_session(
    fs: &Arc<Filesystem>,
    mountpoint: &Path,
    cfg: &MountConfig,
) -> io::Result<(fuser::Session<Server>, Option<mnt::DirectMount>)> {
    let server = Server::with_config(fs.clone(), cfg);
    let notifier = server.notifier.clone();
    if !cfg.ttl.is_zero() {
        let (ends, kc, ttl) = (Arc::downgrade(&server.read_ends), notifier.clone(), cfg.ttl);
        std::thread::Builder::new()
            .name("lanefs-listings".into())
            .spawn(move || expire_listings(ends, kc, ttl))?;
    }
    let opts = options(cfg);
    let (session, direct) = match mnt::mount_direct(mountpoint, cfg)? {
        Some((fd, direct)) => {
            let s = fuser::Session::from_fd(server, fd, opts.acl, opts.clone())
                .inspect_err(|_| drop(direct.unmount(true)))?;
            (s, Some(direct))
        }
        None => (fuser::Session::new(server, mountpoint, &opts)?, None),
    };
    let _ = notifier.set(mnt::KernelCache(session.notifier()));
    Ok((session, direct))
}

/// Mounts `fs` at `mountpoint` and serves it until unmounted. `on_mounted` runs once the
/// mount is in place, with a function that unmounts it for signal handlers (a busy mount is
/// detached lazily, and served until its last open file is closed).
pub fn mount(
    fs: Arc<Filesystem>,
    mountpoint: &Path,
    cfg: &MountConfig,
    on_mounted: impl FnOnce(Box<dyn FnMut() -> io::Result<()> + Send>),
) -> io::Result<()> {
    let (mut session, direct) = new_session(&fs, mountpoint, cfg)?;
    let unmount: Box<dyn FnMut() -> io::Result<()> + Send> = match direct {
        // As `fusermount3 -u` does for a non-root mount: detach a busy mount lazily; the
        // session ends when its last open file is closed.
        Some(direct) => Box::new(move || match direct.unmount(false) {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => direct.unmount(true),
            r => r,
        }),
        None => {
            let mut u = session.unmount_callable();
            Box::new(move || u.unmount())
        }
    };
    mnt::install_invalidator(&fs, session.notifier());
    on_mounted(unmount);
    let r = session.run();
    fs.set_invalidator(None);
    r
}

/// A lanefs filesystem mounted and served from background threads, for tests and for
/// programs that embed lanefs and keep using the library while it is mounted (their changes
/// are sent to the kernel as cache invalidations, see [`lanefs::notify`]).
///
/// [`Mount::unmount`] unmounts and waits for the server threads; dropping a `Mount` detaches
/// it lazily (as `umount -l`) without waiting.
pub struct Mount {
    fs: Arc<Filesystem>,
    session: Option<fuser::BackgroundSession>,
    direct: Option<mnt::DirectMount>,
}

impl Mount {
    /// Unmounts (EBUSY while files on it are open, as `umount`; the mount then stays and the
    /// call may be repeated) and waits until the server threads have answered their last
    /// request.
    pub fn unmount(&mut self) -> io::Result<()> {
        if let Some(d) = &self.direct {
            d.unmount(false)?;
        }
        self.fs.set_invalidator(None);
        match (self.session.take(), &self.direct) {
            (Some(s), Some(_)) => s.join(),
            (Some(s), None) => s.umount_and_join(),
            (None, _) => Ok(()),
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.fs.set_invalidator(None);
        if let (Some(d), Some(_)) = (&self.direct, &self.session) {
            let _ = d.unmount(true);
        }
        // A session mounted through fusermount3 unmounts itself when dropped.
    }
}

/// Mounts `fs` and serves it from background threads until the returned [`Mount`] is
/// unmounted or dropped.
pub fn mount_background(
    fs: Arc<Filesystem>,
    mountpoint: &Path,
    cfg: &MountConfig,
) -> io::Result<Mount> {
    let (session, direct) = new_session(&fs, mountpoint, cfg)?;
    let session = session.spawn()?;
    mnt::install_invalidator(&fs, session.notifier());
    Ok(Mount {
        fs,
        session: Some(session),
        direct,
    })
}

/// The canonical form of a mountpoint, as the control socket is named after it.
pub(crate) fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}
