//! Mounting and unmounting, and keeping the kernel's caches in step with library callers.
//!
//! As root, lanefs calls `mount(2)` itself with the filesystem type `fuse.lanefs`, so that
//! `/proc/mounts`, `findmnt` and `df -T` show what is mounted and test harnesses that look a
//! mount up by its type (xfstests' `FSTYP=fuse` with `FUSE_SUBTYP=.lanefs`) find it. `fuser`'s
//! own direct mount always says `fuse`; when the direct mount is refused (not root, or no
//! `CAP_SYS_ADMIN`), lanefs lets `fuser` go through the setuid `fusermount3`, which names the
//! subtype itself.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fuser::{INodeNo, MountOption, Notifier};
use lanefs::Filesystem;
use lanefs::notify::Invalidate;

use crate::server::MountConfig;

/// The filesystem type lanefs mounts under (`-t fuse.lanefs`).
pub const FS_TYPE: &str = "fuse.lanefs";

/// Sends the engine's invalidations to the kernel. Errors are ignored: ENOENT means the kernel
/// holds nothing for that name or inode, and ENODEV that the mount is gone.
struct KernelCache(Notifier);

impl Invalidate for KernelCache {
    fn entry(&self, parent: lanefs::Ino, name: &[u8]) {
        let _ = self
            .0
            .inval_entry(INodeNo(parent.get()), OsStr::from_bytes(name));
    }

    fn inode(&self, ino: lanefs::Ino, data: Option<(u64, u64)>) {
        // A negative offset drops the attributes only; otherwise the page-cache range too.
        let (off, len) = data.map_or((-1, 0), |(o, l)| {
            (o.min(i64::MAX as u64) as i64, l.min(i64::MAX as u64) as i64)
        });
        let _ = self.0.inval_inode(INodeNo(ino.get()), off, len);
    }
}

/// Tells `fs` to report library-side changes to the kernel through `notifier`.
pub(crate) fn install_invalidator(fs: &Filesystem, notifier: Notifier) {
    fs.set_invalidator(Some(Arc::new(KernelCache(notifier))));
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
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().rev().find_map(|l| {
        let mut f = l.split(' ');
        let id = f.next()?.parse().ok()?;
        // Field 5 is the mount point, with spaces and such escaped as octal.
        let mp = f.nth(3)?;
        let mp = mp
            .replace("\\040", " ")
            .replace("\\011", "\t")
            .replace("\\012", "\n")
            .replace("\\134", "\\");
        (Path::new(&mp) == canon).then_some(id)
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
    // fuser's defaults for a FUSE mount: nosuid and nodev unless asked otherwise.
    let mut flags: libc::c_ulong = libc::MS_NOSUID | libc::MS_NODEV;
    if cfg.read_only {
        flags |= libc::MS_RDONLY;
    }
    for f in &cfg.flags {
        match f {
            MountOption::Suid => flags &= !libc::MS_NOSUID,
            MountOption::Dev => flags &= !libc::MS_NODEV,
            MountOption::NoSuid => flags |= libc::MS_NOSUID,
            MountOption::NoDev => flags |= libc::MS_NODEV,
            MountOption::RO => flags |= libc::MS_RDONLY,
            MountOption::NoExec => flags |= libc::MS_NOEXEC,
            MountOption::NoAtime => flags |= libc::MS_NOATIME,
            MountOption::Sync => flags |= libc::MS_SYNCHRONOUS,
            MountOption::DirSync => flags |= libc::MS_DIRSYNC,
            MountOption::RW | MountOption::Exec | MountOption::Atime | MountOption::Async => {}
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("mount option {other:?} is not a kernel flag"),
                ));
            }
        }
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
