//! The checkpointer's waits between failed checkpoints (docs/STORE.md, "Checkpoints",
//! Errors): while checkpoints keep failing (here `checkpoint.redb` cannot grow, ENOSPC, as on
//! a full host whose journal segments were allocated ahead, and each checkpoint must apply a
//! write of megabytes), it
//! tries again after `checkpoint_retry`, then twice as long after each further failure, at
//! most `checkpoint_retry_max`; a checkpoint on demand tries at once; a success ends the
//! waits. Time is a simulated clock the test moves, and the checkpointer looks every
//! millisecond, so each check is "after N more looks, exactly these tries happened", never
//! a timing.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lanefs::{Client, Config, OpenOptions};
use lanefs_store::clock::{Clock, SimClock};
use lanefs_store::disk::SimDisk;
use lanefs_store::{CheckpointStatus, Options, StoreHandle, fsck, open};

const DIR: &str = "/s";

fn ck_file() -> PathBuf {
    Path::new(DIR).join("checkpoint.redb")
}

/// A checkpoint as soon as a record follows the last one; waits of 1 s doubling up to 8 s.
fn opts(disk: &SimDisk, clock: &SimClock) -> Options {
    Options {
        checkpoint_records: 1,
        checkpoint_segments: usize::MAX,
        checkpoint_poll: Duration::from_millis(1),
        checkpoint_retry: Duration::from_secs(1),
        checkpoint_retry_max: Duration::from_secs(8),
        clock: Arc::new(clock.clone()),
        ..common::opts(disk, 1 << 20, Duration::from_millis(2))
    }
}

fn rwc() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.read(true).write(true).create(true);
    o
}

/// Waits until `f` holds; fails after 120 s (the events waited for take milliseconds: the
/// limit only ends a test that would wait for good, even on a loaded machine).
fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(120), "waited for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The status after the checkpointer has looked `n` more times, each look begun after this
/// call.
fn after_looks(store: &StoreHandle, n: u64) -> CheckpointStatus {
    let p = store.checkpoint_status().polls;
    wait_until("the checkpointer to look", || {
        store.checkpoint_status().polls > p + n
    });
    store.checkpoint_status()
}

/// Asserts that `n` looks of the checkpointer try nothing: the status stays `st` but for
/// its looks.
fn no_tries(store: &StoreHandle, st: CheckpointStatus, n: u64, what: &str) {
    let now = after_looks(store, n);
    assert_eq!(
        CheckpointStatus { polls: 0, ..now },
        CheckpointStatus { polls: 0, ..st },
        "{what}: tried while waiting"
    );
}

/// Moves the clock to the next try and waits for it: exactly one more failure, counted as
/// a checkpoint begun, then a wait of `wait`.
fn one_more_failure(store: &StoreHandle, clock: &SimClock, wait: Duration, what: &str) {
    let st = store.checkpoint_status();
    let at = st.retry_at.expect("waiting");
    // Just before the time: nothing.
    clock.advance(at - clock.now() - Duration::from_millis(1));
    no_tries(store, st, 20, what);
    clock.advance(Duration::from_millis(1));
    wait_until(what, || store.checkpoint_status().failures > st.failures);
    let now = after_looks(store, 20);
    assert_eq!(now.failures, st.failures + 1, "{what}: one try");
    assert_eq!(now.attempts, st.attempts + 1, "{what}: one checkpoint");
    assert_eq!(now.retry_at, Some(at + wait), "{what}: the next wait");
}

#[test]
fn failed_checkpoints_are_retried_after_doubling_waits_until_one_succeeds() {
    let disk = SimDisk::new();
    let clock = SimClock::new();
    let o = open(Path::new(DIR), Config::default(), opts(&disk, &clock)).unwrap();
    let fs = Arc::new(o.fs);
    let store = o.store;
    let c = Client::root(fs.clone());
    let f = c.open("/f", &rwc()).unwrap();
    f.write_at(b"first", 0).unwrap();
    f.sync_all().unwrap();
    // The checkpointer takes its checkpoints as records come.
    wait_until("a checkpoint", || {
        store.checkpoint_lsn() == store.counters().lsn
    });
    let st = after_looks(&store, 1);
    assert!(st.attempts >= 1);
    assert_eq!((st.failures, st.retry_at), (0, None));
    // The host is full: every checkpoint fails from now on (one record of 4 MiB: it never
    // fits in what the checkpoint's file has free).
    disk.set_file_full(Some(&ck_file()));
    let mut big = vec![7u8; 4 << 20];
    big[..6].copy_from_slice(b"second");
    f.write_at(&big, 0).unwrap();
    f.sync_all().unwrap();
    wait_until("a failed checkpoint", || {
        store.checkpoint_status().failures == 1
    });
    let st = after_looks(&store, 1);
    assert_eq!(st.retry_at, Some(Duration::from_secs(1)), "the first wait");
    // Nothing while the clock stands still, however often it looks.
    no_tries(&store, st, 50, "before the first wait ends");
    let s = Duration::from_secs;
    for (k, wait) in [s(2), s(4), s(8), s(8), s(8)].into_iter().enumerate() {
        one_more_failure(&store, &clock, wait, &format!("try {}", k + 2));
    }
    // On demand: at once, counted; a failure doubles the wait (here: at the longest).
    let st = store.checkpoint_status();
    let e = store
        .checkpoint()
        .expect_err("a checkpoint on a full host")
        .to_string();
    assert!(e.contains("os error 28"), "not ENOSPC: {e}");
    let now = store.checkpoint_status();
    assert_eq!(now.attempts, st.attempts + 1);
    assert_eq!(now.failures, st.failures + 1);
    assert_eq!(now.retry_at, Some(clock.now() + s(8)));
    // The host has room again, but the checkpointer waits out its wait...
    disk.set_file_full(None);
    no_tries(&store, now, 50, "room again, still waiting");
    // ...then succeeds, and the waits are over.
    clock.advance(now.retry_at.unwrap() - clock.now());
    wait_until("a checkpoint once there is room", || {
        store.checkpoint_status().failures == 0
    });
    let st = after_looks(&store, 1);
    assert_eq!(st.attempts, now.attempts + 1);
    assert_eq!(st.retry_at, None);
    assert_eq!(store.checkpoint_lsn(), store.counters().lsn);
    // A new run of failures starts again from the first wait (8 MiB more, past the first).
    disk.set_file_full(Some(&ck_file()));
    let mut more = vec![9u8; 8 << 20];
    more[..5].copy_from_slice(b"third");
    f.write_at(&more, 4 << 20).unwrap();
    f.sync_all().unwrap();
    wait_until("a failed checkpoint", || {
        store.checkpoint_status().failures == 1
    });
    let st = after_looks(&store, 1);
    assert_eq!(
        st.retry_at,
        Some(clock.now() + s(1)),
        "the first wait again"
    );
    one_more_failure(&store, &clock, s(2), "second run");
    // A success on demand ends the waits too.
    disk.set_file_full(None);
    store.checkpoint().unwrap();
    let st = store.checkpoint_status();
    assert_eq!((st.failures, st.retry_at), (0, None));
    assert_eq!(store.checkpoint_lsn(), store.counters().lsn);
    drop(f);
    drop(c);
    drop(fs);
    store.close().unwrap();
    fsck::check(Path::new(DIR), &opts(&disk, &clock)).unwrap();
    let o = open(Path::new(DIR), Config::default(), opts(&disk, &clock)).unwrap();
    let c = Client::root(Arc::new(o.fs));
    let got = c.read("/f").unwrap();
    big.extend_from_slice(&more);
    assert!(got == big, "the file differs after a reopen");
}
