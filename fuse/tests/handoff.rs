//! The io_uring queue threads run SCHED_IDLE so that a caller woken by its reply stays on
//! its queue's CPU (`fuse/src/handoff.rs`); a busy thread of the same task group on that
//! CPU would starve them, and the guard must then give them the normal policy. Runs only
//! on io_uring (`scripts/test.sh`'s second pass); root and /dev/fuse needed, as in mount.rs.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lanefs::Config;
use lanefs_fuse::MountConfig;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes one bit of it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
    }
}

fn policy() -> libc::c_int {
    // SAFETY: sched_getscheduler has no memory preconditions.
    unsafe { libc::sched_getscheduler(0) }
}

/// Creates and unlinks `n` files in `dir`; panics past `limit`.
fn churn(dir: &Path, n: usize, limit: Duration) -> Duration {
    let dir = dir.to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let t = Instant::now();
        for i in 0..n {
            let p = dir.join(format!("f{}", i % 16));
            std::fs::File::create(&p).expect("create");
            std::fs::remove_file(&p).expect("unlink");
        }
        let _ = tx.send(t.elapsed());
    });
    rx.recv_timeout(limit).unwrap_or_else(|_| {
        panic!("{n} creates and unlinks not done within {limit:?}: the queue threads starve")
    })
}

#[test]
fn a_busy_loop_in_the_servers_process_does_not_starve_its_queue_threads() {
    if !is_root() {
        eprintln!("skipped: mounting needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let fs = Arc::new(lanefs::Filesystem::new(Config::default()));
    let m = lanefs_fuse::mount_background(fs, dir.path(), &MountConfig::default())
        .unwrap_or_else(|e| panic!("mount: {e}"));
    if !m.info().is_uring() {
        eprintln!("skipped: served through {}", m.info().transport());
        return;
    }
    if !m.info().sched_idle() {
        eprintln!("skipped: the queue threads keep the normal policy on this machine");
        return;
    }
    // Unloaded first: the guard wakes, and the requests are served. (No boost is expected
    // here on an idle machine; other processes' load may cause some, so the check below
    // counts the boosts the busy loop causes.)
    churn(dir.path(), 200, Duration::from_secs(30));
    let before = m.info().boosts();

    // A busy normal thread on every CPU, in this process, which holds the queue threads:
    // without the guard a SCHED_IDLE queue thread gets almost no CPU beside it.
    let stop = Arc::new(AtomicBool::new(false));
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let busy: Vec<_> = (0..cpus)
        .map(|cpu| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                pin(cpu);
                assert_eq!(policy(), libc::SCHED_OTHER);
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let took = churn(dir.path(), 2000, Duration::from_secs(90));
    stop.store(true, Ordering::Relaxed);
    for b in busy {
        b.join().unwrap();
    }
    eprintln!(
        "2000 creates and unlinks beside {cpus} busy threads: {took:?}, {} boosts",
        m.info().boosts()
    );
    assert!(
        m.info().boosts() > before,
        "the guard never gave a starving queue thread the normal policy"
    );
    // Starving, they took about 20 s here (a guard that never acts); guarded, 0.2 s.
    assert!(took < Duration::from_secs(10), "{took:?}: starved for long");
    let mut m = m;
    m.unmount().expect("unmount");
}
