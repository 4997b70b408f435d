//! The control channel of a running mount, read by `lanefs stats MOUNTPOINT`.
//!
//! The server listens on a Unix socket named after the canonical mountpoint:
//! `/run/lanefs/<hex of the path>.sock` for root's mounts, `$XDG_RUNTIME_DIR/lanefs/` (or
//! `$TMPDIR/lanefs-<uid>/`) for a user's; `lanefs stats` looks where its own user's would be. A client connects and reads one JSON document (the engine's
//! operation counts and lock statistics, see [`stats_json`]) until end of file; nothing is
//! written to the socket. The socket is created with mode 0600, so only the mounting user (and
//! root) can read the statistics.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lanefs::{Filesystem, LockClass, Op};

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

/// The control socket of the mount at `mountpoint`.
pub fn socket_path(mountpoint: &Path) -> PathBuf {
    let hex: String = crate::server::canonical(mountpoint)
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    // Long paths would exceed sockaddr_un's 108 bytes: keep a bounded, still unique, name.
    let name = if hex.len() > 64 {
        let h = hex.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        });
        format!("{}-{h:016x}", &hex[hex.len() - 32..])
    } else {
        hex
    };
    dir().join(format!("{name}.sock"))
}

/// The statistics document.
pub fn stats_json(fs: &Filesystem) -> serde_json::Value {
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
    serde_json::json!({
        "locking": fs.config().locking.name(),
        "ops": ops,
        "locks": locks,
        "open_handles": fs.open_handles(),
        "inodes_used": st.files - st.ffree,
        "blocks_used": st.blocks - st.bfree,
    })
}

/// Serves the control socket for `fs` mounted at `mountpoint` from a background thread;
/// the socket is removed when the returned guard drops.
pub fn serve(fs: Arc<Filesystem>, mountpoint: &Path) -> std::io::Result<SocketGuard> {
    let path = socket_path(mountpoint);
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    std::thread::Builder::new()
        .name("lanefs-control".into())
        .spawn(move || {
            for mut conn in listener.incoming().flatten() {
                let doc = stats_json(&fs).to_string();
                let _ = conn.write_all(doc.as_bytes());
            }
        })?;
    Ok(SocketGuard(path))
}

/// Removes the control socket when dropped.
pub struct SocketGuard(PathBuf);

impl Drop for SocketGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Reads the statistics of the mount at `mountpoint`.
pub fn stats(mountpoint: &Path) -> Result<serde_json::Value, String> {
    let path = socket_path(mountpoint);
    let mut s = UnixStream::connect(&path).map_err(|e| {
        format!(
            "{}: no running lanefs mount answers there ({}: {e})",
            mountpoint.display(),
            path.display()
        )
    })?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).map_err(|e| e.to_string())?;
    if buf.is_empty() {
        // Connected in the instant a server was exiting: it closed without answering.
        return Err(format!(
            "{}: no running lanefs mount answers there ({} closed without an answer)",
            mountpoint.display(),
            path.display()
        ));
    }
    serde_json::from_str(&buf).map_err(|e| format!("bad answer from {}: {e}", path.display()))
}
