//! Many threads through one mount, on the transport `LANEFS_URING` selects (`scripts/test.sh`
//! runs this file once on `/dev/fuse` and once on io_uring): every request gets exactly one
//! answer (a lost one hangs a thread, caught by the watchdog; a duplicated or misrouted one
//! gives a caller another request's result, caught by the content and invariant checks), the
//! deferred FSYNC answers of a disk store among them, and a session ended while requests are
//! in flight shuts down without a hang. Root and /dev/fuse needed, as in mount.rs.

use std::collections::HashMap;
use std::ffi::CString;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lanefs::Config;
use lanefs_fuse::{MountConfig, Uring};
use rand::{Rng, SeedableRng};

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Runs `f` on a thread and panics if it has not returned within `limit` (a lost reply).
fn within<T: Send + 'static>(
    what: &str,
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("{what}: no answer within {limit:?} (a lost reply or a hang)"))
}

fn mount(fs: Arc<lanefs::Filesystem>, dir: &Path) -> lanefs_fuse::Mount {
    let cfg = MountConfig {
        allow_other: true,
        ..MountConfig::default()
    };
    let m = lanefs_fuse::mount_background(fs, dir, &cfg)
        .unwrap_or_else(|e| panic!("mount on {}: {e}", dir.display()));
    if cfg.uring == Uring::On {
        assert!(
            m.info().is_uring(),
            "uring=on but served through {}",
            m.info().transport()
        );
    }
    eprintln!("stress: served through {}", m.info().describe());
    m
}

/// Names per directory: few, so threads collide on them.
const NAMES: usize = 24;
const DIRS: usize = 3;

fn name(d: usize, n: usize) -> PathBuf {
    PathBuf::from(format!("d{d}/n{n}"))
}

/// One worker: random namespace changes among shared names, and private files written,
/// fsynced and read back (their content names the worker and the round, so a reply routed to
/// the wrong request shows).
fn worker(root: PathBuf, id: usize, rounds: usize, ops: Arc<AtomicU64>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed + id as u64);
    let own = root.join(format!("own{id}"));
    for round in 0..rounds {
        let d = rng.random_range(0..DIRS);
        let a = root.join(name(d, rng.random_range(0..NAMES)));
        let b = root.join(name(rng.random_range(0..DIRS), rng.random_range(0..NAMES)));
        // Errors are expected (another thread got there first); answers are what counts.
        let _ = match rng.random_range(0..8) {
            0 => std::fs::File::options()
                .write(true)
                .create_new(true)
                .open(&a)
                .map(drop),
            1 => std::fs::hard_link(&a, &b),
            2 => std::fs::remove_file(&a),
            3 => std::fs::rename(&a, &b),
            4 => std::fs::metadata(&a).map(drop),
            5 => std::fs::read_dir(root.join(format!("d{d}"))).map(|r| {
                let _ = r.count();
            }),
            _ => {
                let body = format!("worker {id} round {round} {}", "x".repeat(round % 300));
                let mut f = std::fs::File::create(&own).expect("create own file");
                f.write_all(body.as_bytes()).expect("write own file");
                if round % 4 == 0 {
                    f.sync_all().expect("fsync own file");
                }
                drop(f);
                let mut got = String::new();
                std::fs::File::open(&own)
                    .and_then(|mut f| f.read_to_string(&mut got))
                    .expect("read own file");
                assert_eq!(got, body, "worker {id} read another answer");
                Ok(())
            }
        };
        ops.fetch_add(1, Ordering::Relaxed);
    }
}

/// Every regular file's link count equals the names it has; each listing (maybe from the
/// kernel's cache) equals a fresh one read after the caches are dropped.
fn check_invariants(root: &Path) {
    let mut names: HashMap<u64, (u64, usize)> = HashMap::new();
    let mut listings = Vec::new();
    for d in 0..DIRS {
        let dir = root.join(format!("d{d}"));
        let mut l: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        l.sort();
        for n in &l {
            let md = std::fs::symlink_metadata(dir.join(n)).unwrap();
            let e = names.entry(md.ino()).or_insert((md.nlink(), 0));
            e.1 += 1;
        }
        listings.push(l);
    }
    for (ino, (nlink, found)) in &names {
        assert_eq!(
            *nlink as usize, *found,
            "inode {ino}: nlink {nlink}, {found} names"
        );
    }
    std::fs::write("/proc/sys/vm/drop_caches", "2").unwrap();
    for (d, before) in listings.iter().enumerate() {
        let mut l: Vec<String> = std::fs::read_dir(root.join(format!("d{d}")))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        l.sort();
        assert_eq!(
            &l, before,
            "d{d}: the listing changed after the caches were dropped"
        );
    }
}

#[test]
fn many_threads_get_one_answer_each_and_keep_the_invariants() {
    if !is_root() {
        eprintln!("many_threads_get_one_answer_each_and_keep_the_invariants: SKIPPED: not root");
        return;
    }
    let store = tempfile::tempdir().unwrap();
    let o = lanefs_store::open(
        store.path(),
        Config::default(),
        lanefs_store::Options::default(),
    )
    .expect("open a disk store");
    let fs = Arc::new(o.fs);
    let dir = tempfile::tempdir().unwrap();
    let mut m = mount(fs.clone(), dir.path());
    let root = dir.path().to_path_buf();
    for d in 0..DIRS {
        std::fs::create_dir(root.join(format!("d{d}"))).unwrap();
    }
    let before = m.info().requests();
    let ops = Arc::new(AtomicU64::new(0));
    let threads = 32;
    let rounds = 1000;
    let (r2, ops2) = (root.clone(), ops.clone());
    within("32 workers", Duration::from_secs(240), move || {
        let hs: Vec<_> = (0..threads)
            .map(|id| {
                let (r, o) = (r2.clone(), ops2.clone());
                std::thread::spawn(move || worker(r, id, rounds, o))
            })
            .collect();
        for h in hs {
            h.join().expect("a worker failed");
        }
    });
    assert_eq!(ops.load(Ordering::Relaxed), (threads * rounds) as u64);
    assert!(
        m.info().requests() - before >= (threads * rounds) as u64,
        "fewer requests than operations were counted"
    );
    check_invariants(&root);
    within("unmount", Duration::from_secs(60), move || {
        for _ in 0..100 {
            match m.unmount() {
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                r => return r.expect("unmount"),
            }
        }
        m.unmount().expect("unmount")
    });
    fs.check_invariants()
        .unwrap_or_else(|e| panic!("engine invariants after unmount:\n{e}"));
    o.store.close().expect("close the store");
}

/// The FUSE connection number of the mount at `p` (its device's minor number).
fn connection(p: &Path) -> u64 {
    libc::minor(std::fs::metadata(p).unwrap().dev()).into()
}

#[test]
fn a_session_aborted_with_requests_in_flight_ends_without_a_hang() {
    if !is_root() {
        eprintln!(
            "a_session_aborted_with_requests_in_flight_ends_without_a_hang: SKIPPED: not root"
        );
        return;
    }
    let fs = Arc::new(lanefs::Filesystem::new(Config::default()));
    let dir = tempfile::tempdir().unwrap();
    let mut m = mount(fs, dir.path());
    let root = dir.path().to_path_buf();
    let conn = connection(&root);
    let stop = Arc::new(AtomicBool::new(false));
    let hs: Vec<_> = (0..16)
        .map(|id| {
            let (root, stop) = (root.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let p = root.join(format!("t{id}-{}", n % 8));
                    let _ = std::fs::write(&p, b"x");
                    let _ = std::fs::metadata(&p);
                    let _ = std::fs::remove_file(&p);
                    n += 1;
                }
                n
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    // Abort the session under load (as `fusectl`'s abort file does for a stuck server), then
    // unmount.
    let ctl = Path::new("/sys/fs/fuse/connections");
    if !ctl.join(conn.to_string()).exists() {
        let c = |s: &str| CString::new(s).unwrap();
        let (src, dst, ty) = (c("fusectl"), c("/sys/fs/fuse/connections"), c("fusectl"));
        // SAFETY: valid C strings; no data argument.
        unsafe { libc::mount(src.as_ptr(), dst.as_ptr(), ty.as_ptr(), 0, std::ptr::null()) };
    }
    std::fs::write(ctl.join(format!("{conn}/abort")), "1").expect("abort through fusectl");
    stop.store(true, Ordering::Relaxed);
    let done: u64 = within(
        "workers after the abort",
        Duration::from_secs(30),
        move || hs.into_iter().map(|h| h.join().unwrap()).sum(),
    );
    assert!(done > 0, "no request was served before the abort");
    let t = Instant::now();
    within(
        "unmount after the abort",
        Duration::from_secs(30),
        move || {
            let c = CString::new(dir.path().as_os_str().as_bytes()).unwrap();
            // SAFETY: a valid C string; umount2 has no other preconditions.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            m.unmount().expect("the server threads end");
            drop(dir);
        },
    );
    eprintln!("ended {:?} after the abort", t.elapsed());
}
