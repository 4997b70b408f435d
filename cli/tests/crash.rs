//! A real crash: `lanefs mount --store DIR` killed with SIGKILL in the middle of a
//! many-threaded workload with fsyncs, then checked (`lanefs fsck`) and mounted again: every
//! file whose fsync returned is there with its contents.

mod common;

use common::{BIN, is_root, mountinfo_line_at, umount2};

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::time::Duration;

fn mounted(p: &Path) -> bool {
    mountinfo_line_at("self", &std::fs::canonicalize(p).unwrap()).is_some()
}

fn detach(p: &Path) {
    umount2(p, libc::MNT_DETACH);
}

fn serve(store: &Path, mp: &Path) -> std::process::Child {
    #[allow(clippy::zombie_processes)] // the caller waits for it
    let child = Command::new(BIN)
        .args([
            "mount",
            "--store",
            store.to_str().unwrap(),
            mp.to_str().unwrap(),
        ])
        .spawn()
        .unwrap();
    for _ in 0..500 {
        if mounted(mp) {
            return child;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("{} did not mount", mp.display());
}

/// The contents of file `k` of thread `t`.
fn content(t: u64, k: u64) -> Vec<u8> {
    let len = (k * 7919 + t * 104_729) % 20_000;
    (0..len).map(|i| (i ^ t ^ k) as u8).collect()
}

#[test]
fn a_killed_server_keeps_every_fsynced_file() {
    if !is_root() {
        eprintln!("a_killed_server_keeps_every_fsynced_file: SKIPPED: needs root to mount");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let mp: PathBuf = dir.path().join("mnt");
    std::fs::create_dir(&mp).unwrap();
    let mut server = serve(&store, &mp);
    // name -> contents, for every file whose fsync (and its directory's, for renames)
    // returned; a name leaves the map before it is unlinked or renamed away.
    let durable = Mutex::new(HashMap::<String, Vec<u8>>::new());
    let stop = AtomicBool::new(false);
    let fsyncs = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let (mp, durable, stop, fsyncs) = (&mp, &durable, &stop, &fsyncs);
            s.spawn(move || {
                let d = mp.join(format!("d{}", t % 3));
                let _ = std::fs::create_dir(&d);
                let mut k = 0u64;
                while !stop.load(SeqCst) {
                    k += 1;
                    let name = d.join(format!("t{t}-{k}"));
                    let c = content(t, k);
                    let r = (|| -> std::io::Result<()> {
                        let mut f = std::fs::File::create(&name)?;
                        f.write_all(&c)?;
                        f.sync_all()?;
                        Ok(())
                    })();
                    if r.is_err() {
                        break; // the server is gone
                    }
                    fsyncs.fetch_add(1, SeqCst);
                    let key = name.strip_prefix(mp).unwrap().display().to_string();
                    durable.lock().unwrap().insert(key.clone(), c.clone());
                    match k % 5 {
                        0 => {
                            durable.lock().unwrap().remove(&key);
                            let _ = std::fs::remove_file(&name);
                        }
                        1 => {
                            let to = d.join(format!("r{t}-{k}"));
                            durable.lock().unwrap().remove(&key);
                            if std::fs::rename(&name, &to).is_ok()
                                && std::fs::File::open(&d).and_then(|f| f.sync_all()).is_ok()
                            {
                                let key = to.strip_prefix(mp).unwrap().display().to_string();
                                durable.lock().unwrap().insert(key, c);
                            }
                        }
                        _ => {}
                    }
                }
            });
        }
        std::thread::sleep(Duration::from_millis(1500));
        server.kill().unwrap();
        server.wait().unwrap();
        stop.store(true, SeqCst);
    });
    detach(&mp);
    let fsyncs = fsyncs.load(SeqCst);
    let durable = durable.into_inner().unwrap();
    eprintln!(
        "{fsyncs} fsyncs before the kill; {} files to find",
        durable.len()
    );
    assert!(fsyncs > 50, "the workload hardly ran");
    let fsck = Command::new(BIN)
        .args(["fsck", store.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        fsck.status.success(),
        "fsck after the kill: {}{}",
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );
    let mut server = serve(&store, &mp);
    let mut missing = Vec::new();
    for (name, c) in &durable {
        match std::fs::read(mp.join(name)) {
            Ok(got) if got == *c => {}
            Ok(got) => missing.push(format!("{name}: {} bytes, want {}", got.len(), c.len())),
            Err(e) => missing.push(format!("{name}: {e}")),
        }
    }
    detach(&mp);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    let _ = server.wait();
    assert!(missing.is_empty(), "fsynced files lost: {missing:?}");
}
