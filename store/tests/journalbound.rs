//! The journal stays bounded when records come faster than checkpoints apply them (docs/
//! STORE.md, "Backpressure"): with every flush of `checkpoint.redb` slowed down, writers that
//! journal far more than a checkpoint takes in its time find the journal held to its
//! `journal_segments` while checkpoints run; the same writers without the bound grow it far
//! past that (so the test can tell). Everything written reads back after a reopen.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::time::{Duration, Instant};

use lanefs::{Client, Config, OpenOptions};
use lanefs_store::{Options, open};

mod ckhost;
use ckhost::{Host, Knobs};

const SEGMENT: u64 = 1 << 20;
const BOUND: usize = 4;
/// Segments past the bound that the journal may hold (see the test).
const SLACK: usize = 16;

fn opts(bound: usize) -> Options {
    Options {
        // Every flush of `checkpoint.redb` 300 ms late.
        disk: Arc::new(Host {
            k: Arc::new(Knobs {
                delay_ms: AtomicU64::new(300),
                ..Knobs::default()
            }),
        }),
        segment_size: SEGMENT,
        commit_interval: Duration::from_millis(2),
        checkpoint_segments: 2,
        journal_segments: bound,
        checkpoint_poll: Duration::from_millis(2),
        ..Options::default()
    }
}

/// The longest a run waits for what it watches for (below): far past what it takes on a
/// loaded 2-CPU machine (the start's checkpoints took 5 s there), only so that a journal that
/// never behaves fails the test instead of running on.
const LIMIT: Duration = Duration::from_secs(300);
/// Checkpoints (each letting segments go) watched in the steady state.
const STEADY_CHECKPOINTS: u32 = 3;

/// What a run watches the journal for.
#[derive(Clone, Copy)]
enum Watch {
    /// Until it holds this many segments (or [`LIMIT`]).
    Reach(usize),
    /// Its steady state: from the first time after a checkpoint let segments go that it
    /// holds no more than this many segments, until [`STEADY_CHECKPOINTS`] more have (or
    /// [`LIMIT`]). The start is not steady: the first checkpoints (the database made, the
    /// reserve written) are slower, and the buffers full at 16 MiB until the journal is
    /// first over, so it overshoots then (to 92 segments beside `stress-ng --cpu 4`, whose
    /// first checkpoint took 5 s: a steady state taken to begin at 4 s failed the test).
    Steady(usize),
}

/// Two threads overwrite their own 256 KiB file with 32 KiB writes (each a journal record
/// of that size; the pages stay the same, so the budget of changed pages never holds them)
/// while the journal is watched (`watch`); returns the most segments seen (in the steady
/// state, for [`Watch::Steady`]), whether what was watched for came, the writes made, and
/// the files' last contents.
fn run(dir: &Path, bound: usize, watch: Watch) -> (usize, bool, u64, Vec<Vec<u8>>) {
    let o = open(dir, Config::default(), opts(bound)).unwrap();
    let fs = Arc::new(o.fs);
    let done = AtomicBool::new(false);
    let came = AtomicBool::new(false);
    let most = AtomicU64::new(0);
    let writes = AtomicU64::new(0);
    let journal = dir.join("journal");
    let files = std::thread::scope(|s| {
        s.spawn(|| {
            let start = Instant::now();
            // The oldest segment last seen, and how many times it moved on (checkpoints
            // that let segments go).
            let mut oldest = None;
            let mut commits = 0u32;
            let mut steady_from: Option<u32> = None;
            while start.elapsed() < LIMIT && !done.load(SeqCst) {
                // Segments of the journal (not those kept for reuse, `.free`).
                let segs: Vec<u64> = std::fs::read_dir(&journal).map_or(Vec::new(), |d| {
                    d.filter_map(|e| {
                        let p = e.ok()?.path();
                        if p.extension()? != "seg" {
                            return None;
                        }
                        u64::from_str_radix(p.file_stem()?.to_str()?, 16).ok()
                    })
                    .collect()
                });
                let n = segs.len();
                let first = segs.iter().min().copied();
                if let (Some(was), Some(now)) = (oldest, first)
                    && now > was
                {
                    commits += 1;
                }
                if first.is_some() {
                    oldest = first;
                }
                match watch {
                    Watch::Reach(at) => {
                        most.fetch_max(n as u64, SeqCst);
                        if n >= at {
                            came.store(true, SeqCst);
                            break;
                        }
                    }
                    Watch::Steady(within) => {
                        if steady_from.is_none() {
                            // Until the steady state: the most seen so far (replaced by the
                            // steady state's once it begins).
                            most.fetch_max(n as u64, SeqCst);
                        }
                        if steady_from.is_none() && commits > 0 && n <= within {
                            most.store(0, SeqCst);
                            steady_from = Some(commits);
                        }
                        if let Some(from) = steady_from {
                            most.fetch_max(n as u64, SeqCst);
                            if commits >= from + STEADY_CHECKPOINTS {
                                came.store(true, SeqCst);
                                break;
                            }
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            done.store(true, SeqCst);
        });
        let writers: Vec<_> = (0..2u8)
            .map(|t| {
                let (fs, done, writes) = (fs.clone(), &done, &writes);
                s.spawn(move || {
                    let c = Client::root(fs);
                    let open = *OpenOptions::new().read(true).write(true).create(true);
                    let f = c.open(format!("/w{t}"), &open).unwrap();
                    let mut body = vec![0u8; 256 << 10];
                    let mut n = 0u64;
                    while !done.load(SeqCst) {
                        let at = (n % 8) as usize * (32 << 10);
                        let b = (n as u8).wrapping_mul(7) ^ t | 1;
                        body[at..at + (32 << 10)].fill(b);
                        f.write_at(&body[at..at + (32 << 10)], at as u64).unwrap();
                        n += 1;
                    }
                    writes.fetch_add(n, SeqCst);
                    body
                })
            })
            .collect();
        writers
            .into_iter()
            .map(|w| w.join().unwrap())
            .collect::<Vec<_>>()
    });
    drop(Arc::try_unwrap(fs).unwrap_or_else(|_| panic!("no other reference")));
    o.store.close().unwrap();
    (
        most.load(SeqCst) as usize,
        came.load(SeqCst),
        writes.load(SeqCst),
        files,
    )
}

#[test]
fn the_journal_is_held_to_its_bound_while_checkpoints_are_slow() {
    // Without the bound (`journal_segments` past any count), the journal outgrows it by
    // far: the test can tell. Stopped once it shows, to keep the disk it takes small.
    let free = tempfile::tempdir().unwrap();
    let (most, came, writes, _) = run(free.path(), usize::MAX, Watch::Reach(SLACK * 2));
    assert!(
        came,
        "without a bound the journal reached only {most} segments in {writes} writes: the \
         checkpoints were not slow enough for this test to tell"
    );
    // With it: segments `first..=current` at most BOUND while checkpoints run, plus the
    // spare made ahead, what the two syncs that begin a checkpoint write (the buffers, 2 MiB
    // each while the journal is over), and the segments a checkpoint covers until it
    // removes them; in the steady state (`Watch::Steady`), over several checkpoints.
    let tmp = tempfile::tempdir().unwrap();
    let (most, came, writes, files) = run(tmp.path(), BOUND, Watch::Steady(BOUND + SLACK));
    assert!(
        came,
        "the journal never came back to {BOUND} + {SLACK} segments or fewer after a \
         checkpoint let segments go, for {STEADY_CHECKPOINTS} more (most: {most}; {writes} \
         writes)"
    );
    eprintln!("with the bound: at most {most} segments in the steady state, {writes} writes");
    assert!(writes > 100, "only {writes} writes were made");
    assert!(
        most <= BOUND + SLACK,
        "the journal reached {most} segments, bound {BOUND} ({writes} writes)"
    );
    // Nothing was lost to the waits.
    let o = open(tmp.path(), Config::default(), opts(BOUND)).unwrap();
    let c = Client::root(Arc::new(o.fs));
    for (t, body) in files.iter().enumerate() {
        assert!(c.read(format!("/w{t}")).unwrap() == *body, "file {t}");
    }
}
