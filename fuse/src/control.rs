//! The control channel of a running mount, read by `lanefs stats MOUNTPOINT`.
//!
//! The server listens on a Unix socket named after its mount's device number, the
//! `major:minor` that `/proc/self/mountinfo` shows for the mount and `stat(2)` reports as
//! `st_dev` for every file in it: `/run/lanefs/dev-MAJOR-MINOR.sock` for root's mounts,
//! `$XDG_RUNTIME_DIR/lanefs/` (or `$TMPDIR/lanefs-<uid>/`) for a user's; `lanefs stats` stats
//! the path it is given and looks where its own user's socket for that device would be. The
//! kernel gives each mounted filesystem its own device number, so two mounts of one path in
//! different mount namespaces have different sockets, and any path inside a mount finds it.
//! A client connects and reads one JSON document (the engine's operation counts and lock
//! statistics, see [`stats_json`]) until end of file; nothing is written to the socket. The
//! socket is created with mode 0600, so only the mounting user (and root) can read the
//! statistics.
//!
//! A server removes its socket when it stops, unless another server has taken the name
//! since (`named_socket.rs`). A server that was killed leaves its socket behind; the next server to start
//! removes sockets that nothing has answered on for a second (none can be live: a live
//! server listens from the moment it binds).

use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use lanefs::{Filesystem, LockClass, Op};

use crate::SessionInfo;
use crate::named_socket::{self, Placed};

fn dir() -> PathBuf {
    if current_uid() == 0 {
        let run = PathBuf::from("/run/lanefs");
        if std::fs::create_dir_all(&run).is_ok() {
            return run;
        }
    } else if let Some(xdg) = std::env::var_os("XDG_RUNTIME_DIR") {
        return PathBuf::from(xdg).join("lanefs");
    }
    std::env::temp_dir().join(format!("lanefs-{}", current_uid()))
}

fn current_uid() -> u32 {
    // SAFETY: getuid cannot fail and has no preconditions.
    unsafe { libc::getuid() }
}

/// The control socket of the mount whose device number is `major:minor`.
fn socket_for(major: u32, minor: u32) -> PathBuf {
    dir().join(format!("dev-{major}-{minor}.sock"))
}

/// The control socket of the lanefs mount holding `path` (its mountpoint or any file in it).
/// This stats `path`, which asks the mount's server.
pub fn socket_path(path: &Path) -> std::io::Result<PathBuf> {
    let dev = std::fs::metadata(path)?.dev();
    Ok(socket_for(libc::major(dev), libc::minor(dev)))
}

/// Removes the sockets in `dir` that no server has answered on for a second: left by a
/// server that was killed. A live server listens from the moment it binds its socket, so
/// a refused connection to a socket older than that means nobody is there.
fn remove_stale_sockets(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let now = SystemTime::now();
    for e in entries.flatten() {
        let path = e.path();
        let Ok(md) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let old = md
            .modified()
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .is_some_and(|age| age >= Duration::from_secs(1));
        if !md.file_type().is_socket() || !old {
            continue;
        }
        if let Err(err) = UnixStream::connect(&path) {
            if err.raw_os_error() == Some(libc::ECONNREFUSED) {
                named_socket::remove_stale(&path, &md);
            }
        }
    }
}

/// The statistics document: `locking`, `ops` (count per operation), `locks` (acquired,
/// contended and wait time per lock class), `open_handles`, `inodes_used`, `blocks_used`,
/// `data_bytes` (file data stored: blocks used times the block size), of which
/// `data_memory_bytes` in memory, `data_zero_bytes` allocated zeros (fallocated or written
/// as zeros: no memory) and `data_store_bytes` held by the store only, `data_memory_bound`
/// (what file data in memory stays under), `inodes_loaded` (inodes a lazily opened store
/// has read so far), `inodes_evicted` (of those, evicted since), `directories_evicted` (of those, directories),
/// `inodes_in_memory`, `entries_in_memory` (directory entries read from the store, as the
/// bounded cache counts them), `entries_held` (of those, entries of directories held by a
/// handle or the kernel, which no eviction pass can free), `inodes_pruned` (inodes the
/// kernel held that the passes asked it to let go of: `FUSE_NOTIFY_PRUNE`),
/// `inode_cache_bytes` (what the bounded cache counts as held:
/// `lanefs::INODE_BYTES` an inode, `lanefs::ENTRY_BYTES` an entry) and `inode_cache_bound`
/// (the `inode_cache=` bound, null when inodes are not evicted), `pid` (the serving process), `resident_bytes`
/// (the serving process's resident memory), `server_cpu_ns` (CPU time the serving process
/// has used, user and system), and, given the mount's session, `transport` (`io_uring` or
/// `/dev/fuse`), `uring_queues`, `requests` (FUSE requests received, FORGETs included),
/// `uring_sched_idle` (the queue threads run SCHED_IDLE under a guard) and `uring_boosts`
/// (times the guard gave a starving queue thread the normal policy), `channel_connections`
/// and `channel_requests` (the channel of `lanefs run`: connections accepted, requests
/// served), `report_entry_invalidations` (entry invalidations sent for changes library
/// callers made, the channel's among them: each takes the directory's lock in the kernel)
/// and `report_names_unlocked` (their names made, removed or renamed reported without one).
pub fn stats_json(fs: &Filesystem, session: Option<&SessionInfo>) -> serde_json::Value {
    let s = fs.stats();
    let ops: serde_json::Map<String, serde_json::Value> = Op::ALL
        .iter()
        .map(|&o| (o.name().to_string(), s.op(o).into()))
        .collect();
    let locks: serde_json::Map<String, serde_json::Value> = LockClass::ALL
        .iter()
        .map(|&c| {
            let l = s.lock(c);
            (c.name().to_string(), serde_json::json!({"acquired": l.acquired, "contended": l.contended, "wait_ns": l.wait_ns}))
        })
        .collect();
    let st = fs.statfs();
    let blocks_used = st.blocks - st.bfree;
    serde_json::json!({
        "locking": fs.config().locking.name(),
        "ops": ops,
        "locks": locks,
        "open_handles": fs.open_handles(),
        "inodes_used": st.files - st.ffree,
        // Read from the store as they were reached (a store opened lazily; 0 otherwise).
        "inodes_loaded": fs.loaded_inodes(),
        "inodes_evicted": fs.inodes_evicted(),
        "directories_evicted": fs.directories_evicted(),
        "inodes_in_memory": fs.inodes_in_memory(),
        "entries_in_memory": fs.entries_in_memory(),
        "entries_held": fs.held_entries(),
        "inodes_pruned": fs.inodes_pruned(),
        "inode_cache_bytes": fs.inode_cache_bytes(),
        "inode_cache_bound": fs.inode_budget().map(|b| b * lanefs::INODE_BYTES),
        "blocks_used": blocks_used,
        // File data stored, as `df` counts it: blocks in use times the block size.
        "data_bytes": blocks_used * u64::from(st.bsize),
        "data_memory_bytes": fs.resident_pages() * lanefs::PAGE,
        "data_zero_bytes": fs.zero_pages() * lanefs::PAGE,
        "data_store_bytes": fs.pages_out() * lanefs::PAGE,
        "data_memory_bound": fs.data_memory_bound(),
        // The serving process's resident memory (every filesystem it serves, and the
        // program's own).
        "pid": std::process::id(),
        "resident_bytes": resident_bytes(),
        "server_cpu_ns": cpu_ns(),
        "transport": session.map(|s| s.transport()),
        "uring_queues": session.map(|s| s.queues()),
        "requests": session.map(|s| s.requests()),
        "uring_sched_idle": session.map(|s| s.sched_idle()),
        "uring_boosts": session.map(|s| s.boosts()),
        "channel_connections": session.map(|s| s.channel_connections()),
        "channel_requests": session.map(|s| s.channel_requests()),
        "report_entry_invalidations": session.map(|s| s.report_entry_invalidations()),
        "report_names_unlocked": session.map(|s| s.report_names_unlocked()),
    })
}

/// CPU time (user and system) this process has used, in nanoseconds.
fn cpu_ns() -> Option<u64> {
    // SAFETY: a zeroed rusage is a valid out-buffer.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid out-buffer.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return None;
    }
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    Some(ns(ru.ru_utime) + ns(ru.ru_stime))
}

/// This process's resident set size in bytes (`/proc/self/statm`, second field, in pages),
/// or `null` where it cannot be read.
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

/// Serves the control socket for `fs` mounted at `mountpoint` from a background thread;
/// the socket is removed when the returned guard drops. The mount must be in place: its
/// device number, which names the socket, is read from this process's mount table (not with
/// `stat(2)`, which would wait for the server to answer).
pub fn serve(
    fs: Arc<Filesystem>,
    session: Option<Arc<SessionInfo>>,
    mountpoint: &Path,
) -> std::io::Result<SocketGuard> {
    let canon = crate::mount::canonical(mountpoint);
    let (major, minor) = crate::mount::mount_dev_at_canonical(&canon).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{}: not in the mount table", canon.display()),
        )
    })?;
    let path = socket_for(major, minor);
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
        remove_stale_sockets(d);
    }
    // A socket already under this name is a killed or stopping server's: the device number
    // is this mount's alone while it is mounted.
    let (listener, placed) = Placed::bind(&path, |p| {
        let l = UnixListener::bind(p)?;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600))?;
        Ok(l)
    })?;
    std::thread::Builder::new()
        .name("lanefs-control".into())
        .spawn(move || {
            for mut conn in listener.incoming().flatten() {
                let doc = stats_json(&fs, session.as_deref()).to_string();
                let _ = conn.write_all(doc.as_bytes());
            }
        })?;
    Ok(SocketGuard(placed))
}

/// Removes the control socket when dropped, unless another server has put its own under the
/// name since (once this mount is gone its device number can be given to a new one).
pub struct SocketGuard(Placed);

impl SocketGuard {
    /// Where the socket is.
    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

/// Reads the statistics of the lanefs mount holding `path` (its mountpoint, or any file in
/// it).
pub fn stats(path: &Path) -> Result<serde_json::Value, String> {
    let sock = socket_path(path).map_err(|e| {
        format!(
            "{}: no running lanefs mount answers there ({e})",
            path.display()
        )
    })?;
    let mut s = UnixStream::connect(&sock).map_err(|e| {
        format!(
            "{}: no running lanefs mount answers there ({}: {e})",
            path.display(),
            sock.display()
        )
    })?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).map_err(|e| e.to_string())?;
    if buf.is_empty() {
        // Connected in the instant a server was exiting: it closed without answering.
        return Err(format!(
            "{}: no running lanefs mount answers there ({} closed without an answer)",
            path.display(),
            sock.display()
        ));
    }
    serde_json::from_str(&buf).map_err(|e| format!("bad answer from {}: {e}", sock.display()))
}
