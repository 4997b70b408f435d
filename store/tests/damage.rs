//! Random damage to a closed store: opening it either succeeds with a tree the filesystem
//! was in after some prefix of its operations (and that passes the invariant check), or
//! fails with a `Damaged` error naming a file of the store and a byte offset (or `NotAStore`
//! for a wrecked identity file). Never a panic, never another tree. `fsck::check` fails
//! whenever open does and passes whenever open does; where it fails in a segment,
//! `fsck::repair` leaves a store that opens to a prefix state.
//!
//! The damage: bytes flipped or overwritten anywhere in a segment or the identity file, a
//! segment cut short, a segment removed, the identity file removed, a block zeroed; one to
//! three of them at a time. The seed is printed; `LANEFS_SEED=<n>` replays a run.

mod common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::{HOUR, Tree, dump, opts, seed, tree_diff};
use lanefs::{Client, Config, OpenOptions};
use lanefs_store::disk::{Disk, SimDisk};
use lanefs_store::{Options, StoreError, fsck, open};
use rand::{Rng, SeedableRng, rngs::StdRng};

const DIR: &str = "/store";

/// A store on `disk` with small segments, committing only when it syncs.
fn options(disk: &SimDisk) -> Options {
    opts(disk, 16 << 10, HOUR)
}

/// A store built by a random workload, closed; the trees after each call that changes
/// anything (a cut between two records of one call, rename then free of the inode it
/// replaced, builds the tree after the call: recovery frees the orphan).
fn build(rng: &mut StdRng) -> (SimDisk, Vec<Tree>) {
    let disk = SimDisk::new();
    let o = open(Path::new(DIR), Config::default(), options(&disk)).unwrap();
    let fs = Arc::new(o.fs);
    let c = Client::root(fs.clone());
    let mut states = vec![dump(&fs, true)];
    for d in ["/a", "/b"] {
        c.create_dir(d).unwrap();
        states.push(dump(&fs, true));
    }
    let name = |rng: &mut StdRng| {
        format!(
            "/{}/f{}",
            ["a", "b"][rng.random_range(0..2)],
            rng.random_range(0..8)
        )
    };
    for _ in 0..120 {
        let (p, q) = (name(rng), name(rng));
        let _ = match rng.random_range(0..10) {
            0..=1 => c
                .open(&p, OpenOptions::new().write(true).create(true))
                .map(drop),
            2..=4 => {
                let n = rng.random_range(1..3000);
                let off = rng.random_range(0..4000);
                let b = rng.random::<u8>();
                // Two calls, two states: the file may be created by the first.
                let f = c.open(&p, OpenOptions::new().write(true).create(true));
                states.push(dump(&fs, true));
                f.and_then(|f| f.write_at(&vec![b; n], off).map(drop))
            }
            5..=6 => c.rename(&p, &q),
            7 => c.remove_file(&p),
            8 => c.hard_link(&p, &q),
            _ => c.truncate(&p, rng.random_range(0..5000)),
        };
        states.push(dump(&fs, true));
        if rng.random_bool(0.5) {
            fs.sync_all().unwrap();
        }
    }
    fs.sync_all().unwrap();
    drop(c);
    drop(fs);
    o.store.close().unwrap();
    (disk, states)
}

/// A copy of a disk's files (durable), on a new disk.
fn copy(files: &[(PathBuf, Vec<u8>)]) -> SimDisk {
    let d = SimDisk::new();
    d.create_dir_all(&Path::new(DIR).join("journal")).unwrap();
    for (p, b) in files {
        d.put(p, b.clone());
    }
    d
}

/// Damages `files` at random; says what it did.
fn damage(rng: &mut StdRng, files: &mut Vec<(PathBuf, Vec<u8>)>) -> String {
    let segs: Vec<usize> = (0..files.len())
        .filter(|&i| files[i].0.extension().is_some_and(|e| e == "seg"))
        .collect();
    let identity = files.iter().position(|(p, _)| p.ends_with("lanefs.store"));
    // Where a file's bytes end (its zeros after are mostly uninteresting).
    let used = |b: &[u8]| b.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1);
    let pick_seg = |rng: &mut StdRng| segs[rng.random_range(0..segs.len())];
    let name = |files: &Vec<(PathBuf, Vec<u8>)>, i: usize| {
        files[i]
            .0
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned()
    };
    let kind = rng.random_range(0..100);
    if kind < 70 && (segs.is_empty() || segs.iter().all(|&i| files[i].1.is_empty())) {
        return "nothing (no segment bytes left)".into();
    }
    let pick_seg = |rng: &mut StdRng| loop {
        let i = pick_seg(rng);
        if kind >= 45 || !files[i].1.is_empty() {
            break i;
        }
    };
    match kind {
        // Bytes flipped in a segment, within its used part (or just after it).
        0..=34 => {
            let i = pick_seg(rng);
            let b = &mut files[i].1;
            let at = rng.random_range(0..(used(b) + 64).min(b.len()));
            let bit = 1 << rng.random_range(0..8);
            b[at] ^= bit;
            format!("flip {bit:#x} at {at} of {}", name(files, i))
        }
        // A run of random bytes.
        35..=44 => {
            let i = pick_seg(rng);
            let b = &mut files[i].1;
            let at = rng.random_range(0..(used(b) + 1).min(b.len()));
            let n = rng.random_range(1..200).min(b.len() - at);
            rng.fill(&mut b[at..at + n]);
            format!("{n} random bytes at {at} of {}", name(files, i))
        }
        // Cut short.
        45..=59 => {
            let i = pick_seg(rng);
            let at = rng.random_range(0..=used(&files[i].1));
            files[i].1.truncate(at);
            format!("{} cut to {at} bytes", name(files, i))
        }
        // A block zeroed.
        60..=69 => {
            let i = pick_seg(rng);
            let b = &mut files[i].1;
            let blk = rng.random_range(0..used(b).div_ceil(4096).max(1));
            let end = ((blk + 1) * 4096).min(b.len());
            b[(blk * 4096).min(end)..end].fill(0);
            format!("block {blk} of {} zeroed", name(files, i))
        }
        // A segment removed.
        70..=79 => {
            let i = pick_seg(rng);
            let n = name(files, i);
            files.remove(i);
            format!("{n} removed")
        }
        // The identity file: removed, or a byte flipped.
        80..=84 => match identity {
            Some(i) => {
                files.remove(i);
                "identity removed".into()
            }
            None => "nothing (identity already removed)".into(),
        },
        _ => match identity {
            Some(i) => {
                let at = rng.random_range(0..files[i].1.len());
                files[i].1[at] ^= 1 << rng.random_range(0..8);
                format!("identity byte {at} flipped")
            }
            None => "nothing (identity already removed)".into(),
        },
    }
}

/// What opening found, without a panic.
enum Outcome {
    Tree(Tree),
    Refused(StoreError),
}

/// Opens the store on `disk` and dumps its tree, checking its invariants.
fn open_and_dump(disk: &SimDisk) -> Result<Outcome, String> {
    let r = catch_unwind(AssertUnwindSafe(|| {
        match open(Path::new(DIR), Config::default(), options(disk)) {
            Ok(o) => {
                o.fs.check_invariants()
                    .map_err(|e| format!("invariants: {e}"))?;
                let t = dump(&o.fs, true);
                drop(o);
                Ok(Outcome::Tree(t))
            }
            Err(e) => Ok(Outcome::Refused(e)),
        }
    }));
    r.unwrap_or_else(|p| Err(format!("open panicked: {}", panic_text(&p))))
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// The state closest to `t` (fewest paths that differ), and how they differ.
fn closest(states: &[Tree], t: &Tree) -> (usize, String) {
    let differ = |s: &Tree| {
        s.keys()
            .chain(t.keys())
            .filter(|k| s.get(*k) != t.get(*k))
            .count()
    };
    let j = (0..states.len())
        .min_by_key(|&j| differ(&states[j]))
        .expect("states");
    (j, tree_diff(&states[j], t))
}

/// The error names a file of the store and (for damage) a byte offset.
fn clear_error(e: &StoreError) -> Result<(), String> {
    match e {
        StoreError::Damaged { path, .. } | StoreError::NotAStore { path, .. }
            if path.starts_with(DIR) =>
        {
            Ok(())
        }
        e => Err(format!("not a clear error: {e:?}")),
    }
}

#[test]
fn random_damage_is_refused_or_opens_to_a_prefix_state() {
    let seed = seed::seed("random_damage_is_refused_or_opens_to_a_prefix_state");
    let mut rng = StdRng::seed_from_u64(seed);
    let (disk, states) = build(&mut rng);
    let files = disk.files();
    let segments = files
        .iter()
        .filter(|(p, _)| p.extension().is_some_and(|e| e == "seg"))
        .count();
    assert!(
        segments >= 4,
        "{segments} segments: the workload should span several"
    );
    // Undamaged, the store opens to its last state.
    match open_and_dump(&copy(&files)).unwrap() {
        Outcome::Tree(t) => assert!(t == *states.last().unwrap(), "the undamaged store"),
        Outcome::Refused(e) => panic!("the undamaged store: {e}"),
    }
    // The last segment in use (the one after it is the spare): damage to its bytes may look
    // like a torn tail, and open may then drop records that were made durable; damage
    // anywhere else must not lose any.
    let last_used = files
        .iter()
        .filter(|(p, b)| {
            // Neither zeros nor a spare header (first LSN 0): a segment in use.
            p.extension().is_some_and(|e| e == "seg")
                && b.iter().take(64).any(|&x| x != 0)
                && b.get(40..48) != Some(&[0; 8][..])
        })
        .map(|(p, _)| p.file_name().unwrap().to_string_lossy().into_owned())
        .max()
        .expect("a used segment");
    let from_last: Vec<String> = files
        .iter()
        .map(|(p, _)| p.file_name().unwrap().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".seg") && *n >= last_used)
        .collect();
    let (mut opened, mut refused, mut earlier, mut repaired) = (0, 0, 0, 0);
    for trial in 0..400 {
        let mut damaged = files.clone();
        let what: Vec<String> = (0..rng.random_range(1..=3))
            .map(|_| damage(&mut rng, &mut damaged))
            .collect();
        let ctx = format!("seed {seed}, trial {trial}: {what:?}");
        // fsck first, on a copy (open writes to the store it opens).
        let checked = catch_unwind(AssertUnwindSafe(|| {
            fsck::check(Path::new(DIR), &options(&copy(&damaged)))
        }))
        .unwrap_or_else(|p| panic!("{ctx}: fsck panicked: {}", panic_text(&p)));
        let outcome = open_and_dump(&copy(&damaged)).unwrap_or_else(|e| panic!("{ctx}: {e}"));
        match outcome {
            Outcome::Tree(t) => {
                let Some(j) = states.iter().rposition(|s| *s == t) else {
                    panic!("{ctx}: opened to a tree that is no prefix state");
                };
                if let Err(e) = checked {
                    panic!("{ctx}: open accepted the store, fsck refused it: {e}");
                }
                opened += 1;
                if j + 1 < states.len() {
                    earlier += 1;
                    // Or the last segment in use and every one after it removed: that
                    // is a shorter journal, as far as anything on disk can tell
                    // (docs/STORE.md, "Recovery").
                    let tail = what
                        .iter()
                        .any(|w| w.contains(&last_used) && !w.ends_with("removed"))
                        || from_last
                            .iter()
                            .all(|n| what.contains(&format!("{n} removed")));
                    assert!(
                        tail,
                        "{ctx}: opened to state {j} of {}, dropping durable records, though \
                         the damage is not in the last segment in use ({last_used})",
                        states.len() - 1
                    );
                }
            }
            Outcome::Refused(e) => {
                clear_error(&e).unwrap_or_else(|m| panic!("{ctx}: {m}"));
                match checked {
                    Ok(r) => panic!("{ctx}: open refused the store ({e}), fsck passed it: {r:?}"),
                    Err(f) => clear_error(&f).unwrap_or_else(|m| panic!("{ctx}: fsck: {m}")),
                }
                refused += 1;
                // Repair, where the finding is in a segment, leaves a store that opens to a
                // prefix state.
                let disk = copy(&damaged);
                let r = catch_unwind(AssertUnwindSafe(|| {
                    fsck::repair(Path::new(DIR), &options(&disk))
                }))
                .unwrap_or_else(|p| panic!("{ctx}: repair panicked: {}", panic_text(&p)));
                if let Ok(r) = r {
                    match open_and_dump(&disk).unwrap_or_else(|e| panic!("{ctx}: repaired: {e}")) {
                        // Nothing kept (the first segment was lost): a new, empty store.
                        Outcome::Tree(t) if r.kept == 0 => {
                            assert_eq!(t.len(), 1, "{ctx}: repaired to nothing, got {t:?}");
                        }
                        Outcome::Tree(t) => {
                            if !states.contains(&t) {
                                let (j, diff) = closest(&states, &t);
                                panic!(
                                    "{ctx}: repaired ({r:?}) to a tree that is no prefix \
                                     state; closest is state {j}: {diff}"
                                );
                            }
                            repaired += 1;
                        }
                        // A repair cuts at the first finding; another may follow it.
                        Outcome::Refused(e) => {
                            clear_error(&e).unwrap_or_else(|m| panic!("{ctx}: repaired: {m}"))
                        }
                    }
                }
            }
        }
    }
    eprintln!(
        "{opened} opened ({earlier} to an earlier state), {refused} refused ({repaired} \
         repaired to a prefix state), of {} states",
        states.len()
    );
    assert!(refused > 0 && opened > 0);
}
