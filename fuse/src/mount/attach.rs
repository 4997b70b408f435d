//! Making and undoing the kernel's mount, and reading the mount table.
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

use super::config::MountConfig;
use super::flags::{mount_flag, option_name};

/// The filesystem type lanefs mounts under (`-t fuse.lanefs`).
pub const FS_TYPE: &str = "fuse.lanefs";

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
