//! A server's Unix socket under a name that other servers may take next: the control socket
//! (`control.rs`) and the channel's (`channel.rs`) are named after the mount's device
//! number, which the kernel gives to a new mount once the old one is gone, possibly while the
//! old mount's server is still stopping.
//!
//! A socket is bound under a name of the binding process's, then renamed over the shared
//! name (clients never find the name missing, and a socket left there by a killed server is
//! replaced). A stopping server removes the name only if it still holds the socket it put
//! there, told by device, inode number and change time ([`FileId`]): a socket renamed over
//! another never has that one's inode number (both exist at the rename), and the change
//! time tells it from a later socket that reuses the number (ext4 reuses freed inode numbers
//! at once). Putting a socket in place, and looking and removing, are each one step under
//! the directory's lock ([`DirLock`], `flock` of `DIR/.lock`, taken by servers only, briefly,
//! with no other lock held): otherwise a stopping server could find its socket, and remove
//! the next server's renamed there in between.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// What tells one socket file from another under the same name: device, inode number and
/// change time (seconds, nanoseconds).
type FileId = (u64, u64, i64, i64);

/// The [`FileId`] of the file at `path` (not following a symlink).
fn file_id(path: &Path) -> Option<FileId> {
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}

/// The lock of a socket directory, released when dropped (the file is closed; the field
/// is held only for that).
struct DirLock(#[allow(dead_code)] Option<std::fs::File>);

impl DirLock {
    /// Waits for the lock of `dir`. Where its file cannot be made, the steps go unlocked.
    fn take(dir: &Path) -> DirLock {
        use std::os::unix::fs::OpenOptionsExt;
        let Ok(f) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(dir.join(".lock"))
        else {
            return DirLock(None);
        };
        loop {
            // SAFETY: flock of a descriptor we own.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return DirLock(Some(f));
            }
            if io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                return DirLock(None);
            }
        }
    }
}

/// A socket this server put under a shared name: the name is removed when dropped, if it is
/// still this socket.
pub(crate) struct Placed {
    path: PathBuf,
    id: Option<FileId>,
}

impl Placed {
    /// Binds with `bind` (given the path to bind at) and puts the socket under `path`.
    pub(crate) fn bind<T>(
        path: &Path,
        bind: impl FnOnce(&Path) -> io::Result<T>,
    ) -> io::Result<(T, Placed)> {
        let dir = path.parent().unwrap_or(Path::new("/"));
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let tmp = dir.join(format!(".{name}.{}", std::process::id()));
        let _lock = DirLock::take(dir);
        let _ = std::fs::remove_file(&tmp);
        let t = bind(&tmp)?;
        if let Err(e) = std::fs::rename(&tmp, path) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        // After the rename, which changes the change time.
        let id = file_id(path);
        Ok((
            t,
            Placed {
                path: path.to_path_buf(),
                id,
            },
        ))
    }

    /// Where the socket is.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Placed {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            remove_if_same(&self.path, id);
        }
    }
}

/// Removes the socket at `path` if it is still the file `id`, as one step under its
/// directory's lock.
fn remove_if_same(path: &Path, id: FileId) {
    let _lock = DirLock::take(path.parent().unwrap_or(Path::new("/")));
    if file_id(path) == Some(id) {
        let _ = std::fs::remove_file(path);
    }
}

/// Removes the socket at `path`, which a server that is gone left (its owner has just found
/// nobody listening), unless it was replaced since it was seen (`md`).
pub(crate) fn remove_stale(path: &Path, md: &std::fs::Metadata) {
    remove_if_same(path, (md.dev(), md.ino(), md.ctime(), md.ctime_nsec()));
}
