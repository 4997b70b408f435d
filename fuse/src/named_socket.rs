//! A server's Unix socket under a name that other servers may take next: the control socket
//! (`control.rs`) and the channel's (`channel.rs`) are named after the mount's device
//! number, which the kernel gives to a new mount once the old one is gone, possibly while the
//! old mount's server is still stopping.
//!
//! A socket is bound under a name of the binding process's, then renamed over the shared
//! name: clients never find the name missing, and a socket a killed server left there is
//! replaced in the same step. A stopping server removes the name only if it still holds the
//! socket it put there, told by device, inode number and change time ([`FileId`]): a socket
//! renamed over another never has that one's inode number (both exist at the rename), and
//! the change time tells it from a later socket that reuses the number (ext4 reuses freed
//! inode numbers at once).
//!
//! The look and the removal are one step without a lock: the stopping server renames the
//! name to a private one (atomic: whatever socket is there moves), then looks at what it
//! moved; its own is removed, another server's is linked back under the name (`link` fails
//! if a still newer socket took the name meanwhile, which then stays) and the private name
//! removed. No lock between processes is taken: a server stopped by a signal while holding
//! one would hold up every other server's start. A client that connects during the moment
//! the name is away finds nothing, as between two servers (the channel's client then goes
//! through the kernel).

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// What tells one socket file from another under the same name: device, inode number and
/// change time (seconds, nanoseconds).
type FileId = (u64, u64, i64, i64);

/// The [`FileId`] of the file at `path` (not following a symlink).
fn file_id(path: &Path) -> Option<FileId> {
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}

/// A name beside `path` that no other process or call uses: `.NAME.PID.N.WHAT`.
fn private_name(path: &Path, what: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("/"));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let n = N.fetch_add(1, Relaxed);
    dir.join(format!(".{name}.{}.{n}.{what}", std::process::id()))
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
        let tmp = private_name(path, "new");
        let t = bind(&tmp)?;
        // The change time moves with the rename: the id is read under the name. A socket
        // renamed over this one between the two steps would be taken for this one; its
        // server then finds its own name removed when this one stops, as before names were
        // put in place by renames (two servers of one device number starting at once).
        if let Err(e) = std::fs::rename(&tmp, path) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
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

/// Removes the socket at `path` if it is still the file `id` (module doc: moved aside, looked
/// at, put back when it is another).
fn remove_if_same(path: &Path, id: FileId) {
    if file_id(path) != Some(id) {
        return; // Another's already: nothing to move.
    }
    let aside = private_name(path, "gone");
    if std::fs::rename(path, &aside).is_ok() {
        settle_aside(path, &aside, id);
    }
}

/// Removes `aside`, what was moved from `path`, after putting it back under `path` if it is
/// not the socket `id` (another server's socket came under the name between the look and
/// the move), unless a newer one took the name meanwhile.
fn settle_aside(path: &Path, aside: &Path, id: FileId) {
    // By device and inode number only: the rename moved the change time. (The look before
    // the move told this socket from a later one that reuses its number.)
    let moved = file_id(aside).map(|(dev, ino, _, _)| (dev, ino));
    if moved != Some((id.0, id.1)) {
        let _ = std::fs::hard_link(aside, path);
    }
    let _ = std::fs::remove_file(aside);
}

/// Removes the socket at `path`, which a server that is gone left (its owner has just found
/// nobody listening), unless it was replaced since it was seen (`md`).
pub(crate) fn remove_stale(path: &Path, md: &std::fs::Metadata) {
    remove_if_same(path, (md.dev(), md.ino(), md.ctime(), md.ctime_nsec()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::{UnixListener, UnixStream};

    fn listen(p: &Path) -> io::Result<UnixListener> {
        UnixListener::bind(p)
    }

    /// A socket replaced under its name by a newer server's is not removed when its own
    /// server stops; the newer one's is, when it stops; a stale one is replaced at a bind.
    #[test]
    fn a_stopping_server_removes_only_its_own_socket() {
        let dir = tempfile::tempdir().unwrap();
        let name = dir.path().join("dev-0-99.sock");
        let (_a, old) = Placed::bind(&name, listen).unwrap();
        let (_b, new) = Placed::bind(&name, listen).unwrap();
        drop(old);
        assert!(
            UnixStream::connect(&name).is_ok(),
            "the newer socket is in place"
        );
        drop(new);
        assert!(!name.exists(), "the newer server removed its own");
        // A name a killed server left (its socket not listening) is replaced.
        drop(UnixListener::bind(&name).unwrap());
        let (_c, placed) = Placed::bind(&name, listen).unwrap();
        assert!(UnixStream::connect(&name).is_ok());
        let stale = std::fs::symlink_metadata(&name).unwrap();
        // The name is this server's now: removing the stale one seen earlier leaves it...
        remove_stale(&name, &std::fs::symlink_metadata(dir.path()).unwrap());
        assert!(UnixStream::connect(&name).is_ok());
        // ...and removing what is there goes.
        remove_stale(&name, &stale);
        assert!(!name.exists());
        drop(placed);
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(left.is_empty(), "private names left: {left:?}");
    }

    /// What the move aside took is put back under the name when it is another server's
    /// socket, unless a newer one took the name meanwhile, and removed when it is ours.
    #[test]
    fn a_socket_moved_aside_that_is_not_ours_goes_back() {
        let dir = tempfile::tempdir().unwrap();
        let name = dir.path().join("dev-0-98.chan");
        let (_l1, mine) = Placed::bind(&name, listen).unwrap();
        let my_id = file_id(&name).unwrap();
        let (_l2, other) = Placed::bind(&name, listen).unwrap();
        // Another's socket moved aside (it came between the look and the move): back.
        let aside = private_name(&name, "gone");
        std::fs::rename(&name, &aside).unwrap();
        settle_aside(&name, &aside, my_id);
        assert!(
            UnixStream::connect(&name).is_ok(),
            "the other's socket is back"
        );
        assert!(!aside.exists());
        // The same, but a newer socket took the name meanwhile: it stays.
        std::fs::rename(&name, &aside).unwrap();
        let (_l3, newest) = Placed::bind(&name, listen).unwrap();
        let newest_id = file_id(&name).unwrap();
        settle_aside(&name, &aside, my_id);
        assert_eq!(file_id(&name), Some(newest_id), "the newest stays");
        assert!(!aside.exists());
        // Our own moved aside: gone.
        drop((mine, other));
        let ours = file_id(&name).unwrap();
        std::fs::rename(&name, &aside).unwrap();
        settle_aside(&name, &aside, ours);
        assert!(!name.exists() && !aside.exists());
        drop(newest);
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(left.is_empty(), "private names left: {left:?}");
    }
}
