//! A mount gives the memory of deleted files back to the system, as tmpfs does (issue 10,
//! item 8: 4 GiB written and removed stayed resident in the server). Its own test binary: the
//! server is measured while nothing else runs in it, and the other mount tests (cli.rs) do not
//! write gigabytes beside it. Mounting needs /dev/fuse and root or fusermount3, as in cli.rs.

mod common;

use common::{can_mount, is_root, lanefs, umount2};

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// A mount made by the test, unmounted when it ends, passed or failed (lazily, so that a
/// failure leaves no mount behind; the server then exits).
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        if is_root() {
            umount2(&self.0, libc::MNT_DETACH);
        } else {
            let _ = Command::new("fusermount3").arg("-uz").arg(&self.0).output();
        }
    }
}

/// The server's resident set, as `lanefs stats` reports it.
fn resident(mp: &Path) -> u64 {
    let st = lanefs(&["stats", "--json", mp.to_str().unwrap()]);
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    v["resident_bytes"].as_u64().expect("resident_bytes")
}

#[test]
fn deleted_files_give_their_memory_back() {
    if !can_mount("deleted_files_give_their_memory_back") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mp = dir.path();
    let out = lanefs(&["mount", "--background", mp.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _mounted = Mounted(mp.to_path_buf());
    let base = resident(mp);

    // 512 MiB in four files, written by four writers (the server's threads share them out).
    let chunk = vec![0x5au8; MIB as usize];
    std::thread::scope(|s| {
        for i in 0..4 {
            let (path, chunk) = (mp.join(format!("f{i}")), &chunk);
            s.spawn(move || {
                let mut f = std::fs::File::create(path).unwrap();
                for _ in 0..128 {
                    std::io::Write::write_all(&mut f, chunk).unwrap();
                }
            });
        }
    });
    let full = resident(mp);
    assert!(
        full >= base + 448 * MIB,
        "512 MiB written, resident {} MiB from {} MiB",
        full / MIB,
        base / MIB
    );

    for i in 0..4 {
        std::fs::remove_file(mp.join(format!("f{i}"))).unwrap();
    }
    // Back within 64 MiB of where it started, in a few seconds (2 s are expected: mimalloc's
    // purge delay and the purging thread's period, 1 s each; 20 s for a loaded machine).
    let t = Instant::now();
    let mut now = resident(mp);
    while now > base + 64 * MIB && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(250));
        now = resident(mp);
    }
    assert!(
        now <= base + 64 * MIB,
        "{} MiB resident {:?} after removing 512 MiB (from {} MiB before writing, {} MiB \
         after)",
        now / MIB,
        t.elapsed(),
        base / MIB,
        full / MIB
    );
    eprintln!(
        "resident: {} MiB empty, {} MiB with 512 MiB written, {} MiB {:?} after removing it",
        base / MIB,
        full / MIB,
        now / MIB,
        t.elapsed()
    );
}
