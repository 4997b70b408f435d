//! Mounting and unmounting, and keeping the kernel's caches in step with library callers.
//!
//! As root, lanefs calls `mount(2)` itself with the filesystem type `fuse.lanefs`, so that
//! `/proc/mounts`, `findmnt` and `df -T` show what is mounted and test harnesses that look a
//! mount up by its type (xfstests' `FSTYP=fuse` with `FUSE_SUBTYP=.lanefs`) find it. When the
//! direct mount is refused (not root, or no `CAP_SYS_ADMIN`), lanefs runs the setuid
//! `fusermount3`, which names the subtype itself and passes the `/dev/fuse` descriptor back
//! over a socket (`_FUSE_COMMFD`, [`mount_fusermount`]).
//!
//! A mount root makes with `mount(2)` is `suid,dev` unless its flags say `nosuid` / `nodev`,
//! as a kernel tmpfs and `mount -t fuse.lanefs` (whose `mount.fuse3` passes `suid,dev`) are;
//! `fusermount3` makes a user's mount `nosuid,nodev` whatever is asked.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fuser::MountOption;
use lanefs::Filesystem;
use lanefs::notify::Invalidate;

use crate::server::MountConfig;
use crate::session::Notifier;

/// The filesystem type lanefs mounts under (`-t fuse.lanefs`).
pub const FS_TYPE: &str = "fuse.lanefs";

/// Sends the engine's invalidations to the kernel. Errors are ignored: ENOENT means the kernel
/// holds nothing for that name or inode (reported back to the engine, which may try an
/// inode's again while the kernel is being handed it: `lanefs::notify`), and ENODEV that the
/// mount is gone.
///
/// A directory's listing is cached by the kernel (`FOPEN_CACHE_DIR`, see `server.rs`) in the
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

/// Tells `fs` to report library-side changes to the kernel through `notifier`.
pub(crate) fn install_invalidator(fs: &Filesystem, notifier: Notifier) {
    fs.set_invalidator(Some(Arc::new(KernelCache(notifier))));
}

/// A mount option that is a kernel mount flag: the `MS_*` bits it sets and those it clears.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MountFlag {
    /// The option as `mount -o` and `/proc/self/mountinfo` spell it.
    pub name: &'static str,
    /// Bits turned on.
    pub set: libc::c_ulong,
    /// Bits turned off.
    pub clear: libc::c_ulong,
}

impl MountFlag {
    /// `flags` with this option applied.
    pub fn apply(&self, flags: libc::c_ulong) -> libc::c_ulong {
        (flags & !self.clear) | self.set
    }

    /// The bits this option decides: a later option deciding any of them overrides it.
    pub fn mask(&self) -> libc::c_ulong {
        self.set | self.clear
    }

    /// The option as [`MountOption`] names it (the type `fuser` defines, which lanefs keeps
    /// for its mount options): its own variant where it has one, a custom option otherwise.
    pub fn option(&self) -> MountOption {
        match self.name {
            "ro" => MountOption::RO,
            "rw" => MountOption::RW,
            "suid" => MountOption::Suid,
            "nosuid" => MountOption::NoSuid,
            "dev" => MountOption::Dev,
            "nodev" => MountOption::NoDev,
            "exec" => MountOption::Exec,
            "noexec" => MountOption::NoExec,
            "atime" => MountOption::Atime,
            "noatime" => MountOption::NoAtime,
            "sync" => MountOption::Sync,
            "async" => MountOption::Async,
            "dirsync" => MountOption::DirSync,
            other => MountOption::CUSTOM(other.to_string()),
        }
    }
}

const fn flag(name: &'static str, set: libc::c_ulong, clear: libc::c_ulong) -> MountFlag {
    MountFlag { name, set, clear }
}

/// Every mount option that is a kernel mount flag, with its `MS_*` bits: the one table that
/// `lanefs mount -o`, the mount helper's `-o remount` and lanefs's own `mount(2)` read. It
/// holds every flag the kernel reports for a mount in `/proc/self/mountinfo`, so the options
/// of a mounted lanefs can be given back to mount another.
pub const MOUNT_FLAGS: &[MountFlag] = &[
    flag("ro", libc::MS_RDONLY, 0),
    flag("rw", 0, libc::MS_RDONLY),
    flag("nosuid", libc::MS_NOSUID, 0),
    flag("suid", 0, libc::MS_NOSUID),
    flag("nodev", libc::MS_NODEV, 0),
    flag("dev", 0, libc::MS_NODEV),
    flag("noexec", libc::MS_NOEXEC, 0),
    flag("exec", 0, libc::MS_NOEXEC),
    flag("sync", libc::MS_SYNCHRONOUS, 0),
    flag("async", 0, libc::MS_SYNCHRONOUS),
    flag("dirsync", libc::MS_DIRSYNC, 0),
    flag(
        "noatime",
        libc::MS_NOATIME,
        libc::MS_RELATIME | libc::MS_STRICTATIME,
    ),
    flag("atime", 0, libc::MS_NOATIME),
    flag(
        "relatime",
        libc::MS_RELATIME,
        libc::MS_NOATIME | libc::MS_STRICTATIME,
    ),
    flag("norelatime", 0, libc::MS_RELATIME),
    flag(
        "strictatime",
        libc::MS_STRICTATIME,
        libc::MS_NOATIME | libc::MS_RELATIME,
    ),
    flag("nostrictatime", 0, libc::MS_STRICTATIME),
    flag("nodiratime", libc::MS_NODIRATIME, 0),
    flag("diratime", 0, libc::MS_NODIRATIME),
    flag("lazytime", libc::MS_LAZYTIME, 0),
    flag("nolazytime", 0, libc::MS_LAZYTIME),
    flag("nosymfollow", libc::MS_NOSYMFOLLOW, 0),
    flag("symfollow", 0, libc::MS_NOSYMFOLLOW),
];

/// The kernel mount flag named `name` (`nosuid`, `noatime`...), if it is one.
pub fn mount_flag(name: &str) -> Option<&'static MountFlag> {
    MOUNT_FLAGS.iter().find(|f| f.name == name)
}

/// The name of a mount option, for [`mount_flag`] and `fusermount3 -o`.
fn option_name(o: &MountOption) -> Option<&str> {
    Some(match o {
        MountOption::RO => "ro",
        MountOption::RW => "rw",
        MountOption::Suid => "suid",
        MountOption::NoSuid => "nosuid",
        MountOption::Dev => "dev",
        MountOption::NoDev => "nodev",
        MountOption::Exec => "exec",
        MountOption::NoExec => "noexec",
        MountOption::Atime => "atime",
        MountOption::NoAtime => "noatime",
        MountOption::Sync => "sync",
        MountOption::Async => "async",
        MountOption::DirSync => "dirsync",
        MountOption::CUSTOM(s) => s,
        _ => return None,
    })
}

/// The kernel mount flags (`MS_*`) of the mount holding `path`, as `statvfs(3)` reports them:
/// what a remount must pass again to keep them.
pub fn mount_flags_at(path: &Path) -> io::Result<libc::c_ulong> {
    /// `ST_NOSYMFOLLOW` (Linux 5.10), which the libc crate does not name.
    const ST_NOSYMFOLLOW: libc::c_ulong = 0x2000;
    let c = cstring(path)?;
    // SAFETY: zeroed statvfs is a valid out-buffer.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid C string and `st` a valid out-buffer.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let st_to_ms = [
        (libc::ST_RDONLY, libc::MS_RDONLY),
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_SYNCHRONOUS, libc::MS_SYNCHRONOUS),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
        (ST_NOSYMFOLLOW, libc::MS_NOSYMFOLLOW),
    ];
    Ok(st_to_ms
        .iter()
        .filter(|(st_flag, _)| st.f_flag & st_flag != 0)
        .fold(0, |f, (_, ms)| f | ms))
}

/// What lanefs reads of one line of `/proc/self/mountinfo`.
struct MountInfo {
    /// Field 1, the mount id.
    id: u64,
    /// Field 3, `major:minor` of the filesystem's device.
    dev: (u32, u32),
}

/// The id (`/proc/self/mountinfo`'s first field) of the topmost mount at `path`, if any.
/// Reading the mount table sends no request to any filesystem, so this is safe to call on a
/// FUSE mount whose server is not answering yet (or any more).
pub fn mount_id_at(path: &Path) -> Option<u64> {
    mount_id_at_canonical(&std::fs::canonicalize(path).ok()?)
}

/// [`mount_id_at`] for a path already in canonical form (canonicalizing a FUSE mountpoint
/// stats it, which waits for the server).
fn mount_id_at_canonical(canon: &Path) -> Option<u64> {
    mount_at_canonical(canon).map(|m| m.id)
}

/// The device number (`major`, `minor`) of the topmost mount at `path` in this process's
/// mount table (`/proc/self/mountinfo`'s third field), if any; asks no filesystem but
/// the ones on the way to `path` (canonicalizing a FUSE mountpoint stats it).
pub fn mount_dev_at(path: &Path) -> Option<(u32, u32)> {
    mount_dev_at_canonical(&std::fs::canonicalize(path).ok()?)
}

/// The device number (`major`, `minor`) of the topmost mount at the canonical path `canon`,
/// from this process's mount table (as `stat(2)` of the path would report it, without
/// asking the filesystem).
pub(crate) fn mount_dev_at_canonical(canon: &Path) -> Option<(u32, u32)> {
    mount_at_canonical(canon).map(|m| m.dev)
}

fn mount_at_canonical(canon: &Path) -> Option<MountInfo> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().rev().find_map(|l| {
        let mut f = l.split(' ');
        let id = f.next()?.parse().ok()?;
        let (major, minor) = f.nth(1)?.split_once(':')?;
        let dev = (major.parse().ok()?, minor.parse().ok()?);
        // Field 5 is the mount point, with spaces and such escaped as octal.
        let mp = f.nth(1)?;
        let mp = mp
            .replace("\\040", " ")
            .replace("\\011", "\t")
            .replace("\\012", "\n")
            .replace("\\134", "\\");
        (Path::new(&mp) == canon).then_some(MountInfo { id, dev })
    })
}

/// A mount that lanefs made with `mount(2)`: its mountpoint and mount id, so that an unmount
/// never hits a different filesystem mounted there later.
#[derive(Debug)]
pub(crate) struct DirectMount {
    path: PathBuf,
    id: u64,
}

impl DirectMount {
    /// Unmounts if the mountpoint still shows this mount; `lazy` detaches a busy mount (as
    /// `umount -l`) instead of failing with EBUSY.
    pub(crate) fn unmount(&self, lazy: bool) -> io::Result<()> {
        if mount_id_at_canonical(&self.path) != Some(self.id) {
            return Ok(()); // already unmounted (by fusermount3 -u or umount)
        }
        let c = cstring(&self.path)?;
        let flags = if lazy { libc::MNT_DETACH } else { 0 };
        // SAFETY: `c` is a valid NUL-terminated path; umount2 has no other preconditions.
        if unsafe { libc::umount2(c.as_ptr(), flags) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

fn cstring(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))
}

/// Mounts a FUSE filesystem of type `fuse.lanefs` at `mountpoint` and returns the open
/// `/dev/fuse` descriptor it serves, or `None` when the kernel refuses (EPERM: not root), in
/// which case the caller falls back to `fusermount3`.
pub(crate) fn mount_direct(
    mountpoint: &Path,
    cfg: &MountConfig,
) -> io::Result<Option<(OwnedFd, DirectMount)>> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let root_type = std::fs::metadata(mountpoint)?.mode() & libc::S_IFMT;
    let mountpoint = &std::fs::canonicalize(mountpoint)?;
    let dev = File::options()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(|e| io::Error::new(e.kind(), format!("/dev/fuse: {e}")))?;
    let mut data = format!(
        "fd={},rootmode={root_type:o},user_id=0,group_id=0,default_permissions",
        dev.as_raw_fd()
    );
    if cfg.allow_other {
        data.push_str(",allow_other");
    }
    // As tmpfs and `mount -t fuse.lanefs` (mount.fuse3 passes `suid,dev` unless told
    // otherwise): a mount root makes honours set-user-id bits and device files unless the
    // options say `nosuid` / `nodev`. (fusermount3 makes a user's mount nosuid,nodev always.)
    let mut flags: libc::c_ulong = 0;
    if cfg.read_only {
        flags |= libc::MS_RDONLY;
    }
    for f in &cfg.flags {
        let flag = option_name(f).and_then(mount_flag).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("mount option {f:?} is not a kernel flag"),
            )
        })?;
        flags = flag.apply(flags);
    }
    let source = CString::new(cfg.source.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "source contains NUL"))?;
    let target = cstring(mountpoint)?;
    let fstype = CString::new(FS_TYPE).expect("no NUL");
    let cdata = CString::new(data).expect("no NUL");
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
    let r = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            cdata.as_ptr().cast(),
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EPERM) {
            return Ok(None);
        }
        return Err(e);
    }
    // Not stat(2): the new mount would ask its server, which has not answered INIT yet.
    let id = mount_id_at_canonical(mountpoint).ok_or_else(|| {
        io::Error::other(format!(
            "{}: mounted but not in the mount table",
            mountpoint.display()
        ))
    })?;
    Ok(Some((
        OwnedFd::from(dev),
        DirectMount {
            path: mountpoint.to_path_buf(),
            id,
        },
    )))
}

/// Mounts through the setuid `fusermount3` (a user's mount): it opens `/dev/fuse`, mounts,
/// and sends the descriptor back over the socket named by `_FUSE_COMMFD`.
pub(crate) fn mount_fusermount(mountpoint: &Path, cfg: &MountConfig) -> io::Result<OwnedFd> {
    let mut opts = vec![
        format!("fsname={}", cfg.source.replace(',', "_")),
        "subtype=lanefs".into(),
        "default_permissions".into(),
    ];
    if cfg.allow_other {
        opts.push("allow_other".into());
    }
    if cfg.read_only {
        opts.push("ro".into());
    }
    opts.extend(
        cfg.flags
            .iter()
            .filter_map(|f| option_name(f).map(String::from)),
    );
    let mut fds = [0i32; 2];
    // SAFETY: `fds` has room for two descriptors.
    if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, fds.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are new and owned here; ours must not leak into children.
    let (ours, theirs) = unsafe {
        libc::fcntl(fds[0], libc::F_SETFD, libc::FD_CLOEXEC);
        (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]))
    };
    let out = std::process::Command::new("fusermount3")
        .arg("-o")
        .arg(opts.join(","))
        .arg("--")
        .arg(mountpoint)
        .env("_FUSE_COMMFD", theirs.as_raw_fd().to_string())
        .stdin(std::process::Stdio::null())
        .output()?;
    drop(theirs);
    if !out.status.success() {
        let msg = String::from_utf8_lossy(&out.stderr);
        let kind = if msg.contains("ermission") {
            io::ErrorKind::PermissionDenied
        } else {
            io::ErrorKind::Other
        };
        return Err(io::Error::new(kind, format!("fusermount3: {}", msg.trim())));
    }
    recv_fd(&ours)
}

/// Receives one descriptor sent with `SCM_RIGHTS` on `sock`.
fn recv_fd(sock: &OwnedFd) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // Room for one `cmsghdr` and one int, as CMSG_SPACE(sizeof(int)) (at most 32 bytes).
    let mut cbuf = [0u64; 8];
    // SAFETY: a zeroed msghdr is valid; the pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE only computes a size.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<i32>() as u32) } as _;
    // SAFETY: `msg` describes valid buffers.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `msg` was filled by recvmsg; CMSG_FIRSTHDR returns null or a header inside
    // `cbuf`.
    let c = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    // SAFETY: `c` is checked non-null and points into `cbuf`.
    if c.is_null() || unsafe { (*c).cmsg_type } != libc::SCM_RIGHTS {
        return Err(io::Error::other("fusermount3 sent no /dev/fuse descriptor"));
    }
    // SAFETY: an SCM_RIGHTS message carries at least one int after its header.
    let fd = unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<i32>()) };
    // SAFETY: the descriptor was just received and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Unmounts a `fusermount3` mount (`fusermount3 -u`, lazily with `-z`).
pub(crate) fn fusermount_unmount(mountpoint: &Path, lazy: bool) -> io::Result<()> {
    let out = std::process::Command::new("fusermount3")
        .arg(if lazy { "-uz" } else { "-u" })
        .arg("--")
        .arg(mountpoint)
        .output()?;
    if out.status.success() {
        return Ok(());
    }
    let msg = String::from_utf8_lossy(&out.stderr);
    if msg.contains("not mounted") || msg.contains("not found in") {
        return Ok(());
    }
    if msg.contains("busy") {
        return Err(io::Error::from_raw_os_error(libc::EBUSY));
    }
    Err(io::Error::other(format!("fusermount3 -u: {}", msg.trim())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(names: &[&str]) -> libc::c_ulong {
        names
            .iter()
            .fold(0, |f, n| mount_flag(n).expect("a flag").apply(f))
    }

    #[test]
    fn every_flag_has_one_entry_and_its_fuser_option_maps_back() {
        for f in MOUNT_FLAGS {
            assert_eq!(MOUNT_FLAGS.iter().filter(|g| g.name == f.name).count(), 1);
            assert_eq!(f.set & f.clear, 0, "{}", f.name);
            let o = f.option();
            assert_eq!(option_name(&o), Some(f.name), "{o:?}");
        }
        assert!(mount_flag("size").is_none() && mount_flag("user_id").is_none());
    }

    #[test]
    fn later_flags_override_earlier_ones() {
        assert_eq!(
            apply(&["nosuid", "nodev"]),
            libc::MS_NOSUID | libc::MS_NODEV
        );
        assert_eq!(apply(&["nosuid", "suid"]), 0);
        assert_eq!(apply(&["ro", "rw", "noexec"]), libc::MS_NOEXEC);
        assert_eq!(apply(&["noatime", "relatime"]), libc::MS_RELATIME);
        assert_eq!(apply(&["relatime", "strictatime"]), libc::MS_STRICTATIME);
        assert_eq!(apply(&["strictatime", "noatime"]), libc::MS_NOATIME);
        assert_eq!(
            apply(&["nodiratime", "noatime", "sync", "dirsync"]),
            libc::MS_NODIRATIME | libc::MS_NOATIME | libc::MS_SYNCHRONOUS | libc::MS_DIRSYNC
        );
        // Conflicting options decide the same bits.
        let (a, b) = (mount_flag("noatime").unwrap(), mount_flag("atime").unwrap());
        assert_ne!(a.mask() & b.mask(), 0);
        let (a, b) = (
            mount_flag("noatime").unwrap(),
            mount_flag("nodiratime").unwrap(),
        );
        assert_eq!(a.mask() & b.mask(), 0);
    }
}
