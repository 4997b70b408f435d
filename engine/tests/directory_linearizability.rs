//! Linearizability of directory operations, through the public API only: every test races
//! operations on names against each other and checks that each answer is one that some
//! serial order of the same operations gives, with Linux tmpfs as the reference for what a
//! serial order answers:
//! - the rmdir/create protocol: an rmdir (or a rename over the directory) and a racing add of
//!   an entry of each kind agree with one order; a removed directory shows nothing to
//!   lookups, listings or getattr; a directory whose only entry moves inside it is never
//!   removed; rmdir racing many removals and one create;
//! - listings return each entry that exists throughout exactly once under churn;
//! - directories moved and exchanged (within and across parents, at random): link counts,
//!   `..`, names and creates inside stay right, and the tree stays one connected tree;
//! - a file's link count follows its names under link, rename and exchange.
//!
//! The harness (races beside CPU burners, bounded by rounds and by `LINEARIZABILITY_SECS`,
//! seconds per race phase, default 0.7) is `common/linearizability.rs`. Randomized tests print
//! their seed; `LANEFS_SEED` repeats one. A failing check reports how many of how many checks
//! failed, with examples. The permission path's races are in `permission_linearizability.rs`.
//!
//! Defects these tests found, each fixed, its test kept (and no longer ignored):
//! - `exchanging_directories_across_parents_keeps_the_parents_link_counts`: RENAME_EXCHANGE
//!   of two directories in different parents let getattr see each parent's link count one
//!   too low or one too high.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicI64;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use common::linearizability::*;
use common::seed::seed;
use lanefs::{
    Ctx, Errno, FileType, Filesystem, InodeId, InodeRef, RENAME_EXCHANGE, RENAME_NOREPLACE,
    RENAME_WHITEOUT,
};

// ----- small operation helpers --------------------------------------------------------------

/// The names in directory `d` (not `.` and `..`), read through a handle in batches of 7, each
/// with its cookie.
fn list(fs: &Filesystem, ctx: &Ctx, d: impl Into<InodeRef>) -> R<Vec<Vec<u8>>> {
    let fh = fs.opendir(ctx, d)?;
    let mut out = Vec::new();
    let mut off = 0;
    let r = loop {
        let mut got = 0;
        let r = fs.readdir(ctx, fh, off, false, |e, _| {
            if got == 7 {
                return false;
            }
            got += 1;
            off = e.offset;
            if e.name != b"." && e.name != b".." {
                out.push(e.name.to_vec());
            }
            true
        });
        if let Err(e) = r {
            break Err(e);
        }
        if got == 0 {
            break Ok(out);
        }
    };
    fs.releasedir(fh).unwrap();
    r
}

fn lookup_id(fs: &Filesystem, d: impl Into<InodeRef>, name: &[u8]) -> Option<InodeId> {
    fs.lookup(&root(), d, name).ok().map(|a| id(&a))
}

/// A new filesystem with two directories P and Q in the root, mode 0777.
fn with_parents() -> (Arc<Filesystem>, [InodeId; 2]) {
    let fs = new_fs();
    let pq = [b"p", b"q"].map(|n| mkdir_id(&fs, lanefs::ROOT_INO, n, 0o777));
    (fs, pq)
}

// ----- the rmdir/create protocol ----------------------------------------------------------------

/// How a racing operation adds entry `x` to the directory being removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Add {
    Create,
    Mknod,
    Mkdir,
    Symlink,
    Link,
    RenameFile,
    RenameDir,
    RenameNoreplace,
    TmpfileLink,
    /// Not an add: `x` exists and is unlinked.
    UnlinkLast,
    /// Not an add: directory `x` exists and is moved out to P/mo.
    MoveOutLast,
}

const ADDS: [Add; 11] = [
    Add::Create,
    Add::Mknod,
    Add::Mkdir,
    Add::Symlink,
    Add::Link,
    Add::RenameFile,
    Add::RenameDir,
    Add::RenameNoreplace,
    Add::TmpfileLink,
    Add::UnlinkLast,
    Add::MoveOutLast,
];

/// How the directory is removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Removal {
    Rmdir,
    /// rename of an empty directory `e` over it.
    RenameOver,
}

/// A parent P (in the root) for one round harness, with a file `lf` to link.
struct Arena {
    p: InodeId,
    lf: InodeId,
}

fn arena(fs: &Filesystem, name: &str) -> Arena {
    let rt = root();
    let p = mkdir_id(fs, lanefs::ROOT_INO, name.as_bytes(), 0o777);
    let lf = id(&mkfile(fs, &rt, p, b"lf", 0o644).unwrap());
    Arena { p, lf }
}

/// Runs rounds: a fresh directory P/d, then one thread adds `x` to it by `add` while
/// another removes it by `rem` (and, with `observe`, a third looks into it by lookup,
/// listing and getattr). Checks, per round:
/// - the removal and the add never both succeed; exactly one of them does;
/// - ENOTEMPTY: `x` is visible right after (found by lookup and listed once), since nobody
///   removes it;
/// - the add's ENOENT: the directory is not found by its name afterwards;
/// - with `observe`: once the removal has returned, no lookup, listing or getattr made
///   after sees `x` in it or shows it alive;
/// - after cleanup, P's link count is 2, and `check_invariants` passes every 128 rounds.
fn rmdir_rounds(label: &str, adds: &[Add], rems: &[Removal], observe: bool) {
    let seed = seed(label);
    let fs = new_fs();
    let rt = root();
    let ar = arena(&fs, "p");
    let p = ar.p;
    let tally = Tally::new(format!(
        "{label}: rmdir and creates agree with a serial order"
    ));
    let parties = if observe { 3 } else { 2 };
    let round = AtomicU64::new(0);
    let cur_d: Mutex<Option<InodeId>> = Mutex::new(None);
    let tmp: Mutex<Option<(InodeId, lanefs::Fh)>> = Mutex::new(None);
    let add_res: Mutex<Option<(R<()>, bool)>> = Mutex::new(None);
    let removed = AtomicBool::new(false);
    let done = AtomicUsize::new(0);
    let outcomes: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());
    let bias: Vec<AtomicI64> = (0..adds.len() * rems.len())
        .map(|_| AtomicI64::new(0))
        .collect();
    let add_delay = AtomicU64::new(0);
    let _burn = Burn::new(BURNERS);
    let rounds = Rounds::new(parties, phase());
    let case = |r: u64| {
        (
            adds[r as usize % adds.len()],
            rems[(r as usize / adds.len()) % rems.len()],
        )
    };
    std::thread::scope(|s| {
        // The adder.
        s.spawn(|| {
            let mut rng = Rng::new(seed ^ 1);
            rounds.racer(|| {
                let r = round.load(Acquire);
                let (add, _) = case(r);
                let d = cur_d.lock().unwrap().unwrap();
                let t = tmp.lock().unwrap().map(|t| t.0);
                spin(add_delay.load(Acquire) + rng.below(JITTER));
                let x: &[u8] = b"x";
                let res = match add {
                    Add::Create => mkfile(&fs, &rt, d, x, 0o644).map(|_| ()),
                    Add::Mknod => fs.mknod(&rt, d, x, libc::S_IFIFO | 0o644, 0).map(|_| ()),
                    Add::Mkdir => fs.mkdir(&rt, d, x, 0o755).map(|_| ()),
                    Add::Symlink => fs.symlink(&rt, d, x, b"t").map(|_| ()),
                    Add::Link => fs.link(&rt, ar.lf, d, x).map(|_| ()),
                    Add::RenameFile => fs.rename(&rt, p, b"mf", d, x, 0),
                    Add::RenameDir => fs.rename(&rt, p, b"md", d, x, 0),
                    Add::RenameNoreplace => fs.rename(&rt, p, b"mn", d, x, RENAME_NOREPLACE),
                    Add::TmpfileLink => fs.link(&rt, t.unwrap(), d, x).map(|_| ()),
                    Add::UnlinkLast => fs.unlink(&rt, d, x),
                    Add::MoveOutLast => fs.rename(&rt, d, x, p, b"mo", 0),
                };
                // Told ENOENT: the directory must be gone from its name already.
                let gone = res == Err(Errno::ENOENT) && lookup_id(&fs, p, b"d") != Some(d);
                *add_res.lock().unwrap() = Some((res, gone));
                done.fetch_add(1, Release);
            });
        });
        if observe {
            s.spawn(|| {
                rounds.racer(|| {
                    let d = cur_d.lock().unwrap().unwrap();
                    let mut k = 0u64;
                    loop {
                        let last = done.load(Acquire) == 2;
                        let after = removed.load(Acquire);
                        match k % 3 {
                            0 => {
                                let r = fs.lookup(&rt, d, b"x");
                                if after {
                                    tally.check(r.is_err(), || {
                                        format!("lookup found x in a directory whose removal had returned: {r:?}")
                                    });
                                }
                            }
                            1 => {
                                let r = list(&fs, &rt, d);
                                if after {
                                    tally.check(r.as_ref().map_or(true, |v| v.is_empty()), || {
                                        format!("listing of a directory whose removal had returned: {r:?}")
                                    });
                                }
                            }
                            _ => {
                                let r = fs.getattr(d);
                                if after {
                                    tally.check(r.as_ref().map_or(true, |a| a.nlink == 0), || {
                                        format!("getattr of a directory whose removal had returned: {r:?}")
                                    });
                                } else if let Ok(a) = &r {
                                    tally.check(a.nlink == 2 || a.nlink == 3 || a.nlink == 0, || {
                                        format!("getattr of the directory: nlink {}", a.nlink)
                                    });
                                }
                            }
                        }
                        k += 1;
                        if last {
                            break;
                        }
                    }
                })
            });
        }
        let mut rng = Rng::new(seed);
        let mut r = 0u64;
        loop {
            let (add, rem) = case(r);
            let d = mkdir_id(&fs, p, b"d", 0o777);
            *cur_d.lock().unwrap() = Some(d);
            match add {
                Add::RenameFile => drop(mkfile(&fs, &rt, p, b"mf", 0o644).unwrap()),
                Add::RenameDir => drop(fs.mkdir(&rt, p, b"md", 0o755).unwrap()),
                Add::RenameNoreplace => drop(mkfile(&fs, &rt, p, b"mn", 0o644).unwrap()),
                Add::TmpfileLink => {
                    let (a, fh) = fs.tmpfile(&rt, p, 0o644, libc::O_RDWR).unwrap();
                    *tmp.lock().unwrap() = Some((id(&a), fh));
                }
                Add::UnlinkLast => drop(mkfile(&fs, &rt, d, b"x", 0o644).unwrap()),
                Add::MoveOutLast => drop(fs.mkdir(&rt, d, b"x", 0o755).unwrap()),
                _ => {}
            }
            if rem == Removal::RenameOver {
                fs.mkdir(&rt, p, b"e", 0o755).unwrap();
            }
            removed.store(false, Relaxed);
            done.store(0, Relaxed);
            round.store(r, Release);
            let bi = r as usize % bias.len();
            let b = bias[bi].load(Relaxed);
            add_delay.store((-b).max(0) as u64, Release);
            rounds.wait();
            spin(b.max(0) as u64 + rng.below(JITTER));
            let rr = match rem {
                Removal::Rmdir => fs.rmdir(&rt, p, b"d"),
                Removal::RenameOver => fs.rename(&rt, p, b"e", p, b"d", 0),
            };
            if rr.is_ok() {
                removed.store(true, Release);
            }
            // ENOTEMPTY: an entry was visible, and the only one, x, is never removed.
            let visible = rr == Err(Errno::ENOTEMPTY)
                && fs.lookup(&rt, d, b"x").is_ok()
                && list(&fs, &rt, d).unwrap() == vec![b"x".to_vec()];
            done.fetch_add(1, Release);
            rounds.wait();
            let (ar_res, gone) = add_res.lock().unwrap().take().unwrap();
            let what = format!("round {r} {add:?} vs {rem:?}: add {ar_res:?}, removal {rr:?}");
            *outcomes
                .lock()
                .unwrap()
                .entry(format!(
                    "{add:?}/{rem:?} add {:?} rm {:?}",
                    ar_res.map_err(|e| e.name()),
                    rr.map_err(|e| e.name())
                ))
                .or_default() += 1;
            let takes_out = matches!(add, Add::UnlinkLast | Add::MoveOutLast);
            match (&ar_res, &rr) {
                // Taking the last entry out: it always succeeds, and the removal may come
                // before it (ENOTEMPTY) or after it (success).
                (Ok(()), Ok(()) | Err(Errno::ENOTEMPTY)) if takes_out => {
                    if add == Add::MoveOutLast {
                        let mo = fs
                            .lookup(&rt, p, b"mo")
                            .map(|a| lookup_id(&fs, id(&a), b".."));
                        tally.check(mo == Ok(Some(p)), || format!("{what}: P/mo is {mo:?}"));
                    }
                }
                (Ok(()), Err(Errno::ENOTEMPTY)) => {
                    tally.check(visible, || {
                        format!("{what}: x not visible right after ENOTEMPTY")
                    });
                }
                (Err(Errno::ENOENT), Ok(())) => {
                    tally.check(gone, || {
                        format!(
                            "{what}: told ENOENT while the directory was still found by its name"
                        )
                    });
                }
                _ => tally.fail(|| format!("{what}: no serial order gives this")),
            }
            // The directory's fate is final.
            let now = lookup_id(&fs, p, b"d");
            if rr.is_ok() {
                tally.check(now != Some(d), || {
                    format!("{what}: removed directory still named")
                });
                tally.check(fs.lookup(&rt, d, b"x").is_err(), || {
                    format!("{what}: x found in a removed directory")
                });
            }
            // Clean up.
            // A removal that succeeded came after an add, but before an add of the kind
            // that takes the last entry out.
            bi_update(&bias[bi], rr.is_ok() != takes_out);
            if now == Some(d) {
                if let Ok(a) = fs.lookup(&rt, d, b"x") {
                    if a.kind() == FileType::Directory {
                        fs.rmdir(&rt, d, b"x").unwrap();
                    } else {
                        fs.unlink(&rt, d, b"x").unwrap();
                    }
                }
                fs.rmdir(&rt, p, b"d").unwrap();
            } else if now.is_some() {
                fs.rmdir(&rt, p, b"d").unwrap();
            }
            for (n, dir) in [
                (&b"mf"[..], false),
                (b"md", true),
                (b"mn", false),
                (b"e", true),
                (b"mo", true),
            ] {
                if fs.lookup(&rt, p, n).is_ok() {
                    if dir {
                        fs.rmdir(&rt, p, n).unwrap();
                    } else {
                        fs.unlink(&rt, p, n).unwrap();
                    }
                }
            }
            if let Some((_, fh)) = tmp.lock().unwrap().take() {
                fs.release(fh).unwrap();
            }
            let pa = fs.getattr(p).unwrap();
            tally.check(pa.nlink == 2, || {
                format!("{what}: P's nlink {} after cleanup, not 2", pa.nlink)
            });
            let ents = list(&fs, &rt, p).unwrap();
            tally.check(ents == vec![b"lf".to_vec()], || {
                format!("{what}: P holds {ents:?} after cleanup")
            });
            if r % 1024 == 0 {
                let c = fs.check_invariants();
                tally.check(c.is_ok(), || format!("{what}: check_invariants: {c:?}"));
            }
            r += 1;
            if rounds.over(r) {
                break;
            }
        }
        eprintln!("{label}: {r} rounds");
    });
    eprintln!("{label}: outcomes {:?}", outcomes.lock().unwrap());
    tally.finish();
    let c = fs.check_invariants();
    assert!(c.is_ok(), "{c:?}");
}

/// Moves an alignment bias toward the point where the removal and the add each go first as
/// often as the other (a positive bias delays the removal, a negative one the add): an add
/// that came late starts earlier next time.
fn bi_update(b: &AtomicI64, add_was_late: bool) {
    let nb = (b.load(Relaxed) + if add_was_late { BIAS_STEP } else { -BIAS_STEP })
        .clamp(-BIAS_MAX, BIAS_MAX);
    b.store(nb, Relaxed);
}

/// rmdir, and rename of an empty directory over it, race one add of each kind (create,
/// mknod, mkdir, symlink, link, rename of a file or a directory into it, RENAME_NOREPLACE
/// into it, link of an O_TMPFILE file): exactly one of them succeeds; ENOTEMPTY comes
/// with the entry visible (lookup and listing find it right after); an add told ENOENT
/// finds the directory gone from its name; link counts and invariants hold. They also race
/// the removal of the directory's last entry (unlink, or a move of a subdirectory out to
/// the parent, whose `..` must then be the parent), which always succeeds.
#[test]
fn rmdir_and_a_racing_add_of_each_kind_agree_with_a_serial_order() {
    let _one = exclusive();
    rmdir_rounds(
        "rmdir vs adds",
        &ADDS,
        &[Removal::Rmdir, Removal::RenameOver],
        false,
    );
}

/// As above (create and mkdir against rmdir and rename-over), with a third thread looking
/// into the directory throughout: once the removal has returned, no lookup finds `x` in it,
/// no listing shows an entry, and getattr finds it gone or with link count 0; before, its
/// link count is 2 or 3.
#[test]
fn a_removed_directory_shows_nothing_to_lookups_listings_or_getattr() {
    let _one = exclusive();
    rmdir_rounds(
        "rmdir vs adds, observed",
        &[Add::Create, Add::Mkdir, Add::RenameDir],
        &[Removal::Rmdir, Removal::RenameOver],
        true,
    );
}

/// A directory whose one entry keeps moving inside it is never empty, so it is never
/// removed: two threads rename `x` to `y` and back (in different thread slots, so the entry
/// moves between the directory's per-slot runs), a third exchanges whichever exists with a
/// file outside (RENAME_EXCHANGE), a fourth links and unlinks an extra name; meanwhile every
/// rmdir and every rename of an empty directory over it fails with ENOTEMPTY. Run once with
/// a file as the entry and once with a directory.
#[test]
fn rmdir_never_removes_a_directory_whose_only_entry_moves_inside_it() {
    let _one = exclusive();
    for entry_is_dir in [false, true] {
        let fs = new_fs();
        let rt = root();
        let p = mkdir_id(&fs, lanefs::ROOT_INO, b"p", 0o777);
        let d = mkdir_id(&fs, p, b"d", 0o777);
        if entry_is_dir {
            fs.mkdir(&rt, d, b"x", 0o755).unwrap();
            fs.mkdir(&rt, p, b"f", 0o755).unwrap();
        } else {
            mkfile(&fs, &rt, d, b"x", 0o644).unwrap();
            mkfile(&fs, &rt, p, b"f", 0o644).unwrap();
        }
        fs.mkdir(&rt, p, b"e", 0o755).unwrap();
        let tally = Tally::new(format!(
            "a directory whose {} entry moves inside it is never removed",
            if entry_is_dir { "directory" } else { "file" }
        ));
        let moves = AtomicU64::new(0);
        let tally = &tally;
        let (fs, moves) = (&fs, &moves);
        let mut w: Vec<Worker<'_>> = Vec::new();
        for _ in 0..2 {
            w.push(Box::new(move |_, stop| {
                while !stop.load(Relaxed) {
                    for (from, to) in [(b"x", b"y"), (b"y", b"x")] {
                        if fs.rename(&root(), d, from, d, to, 0).is_ok() {
                            moves.fetch_add(1, Relaxed);
                        }
                    }
                }
            }));
        }
        w.push(Box::new(move |_, stop| {
            let mut k = 0u64;
            while !stop.load(Relaxed) {
                let n: &[u8] = if k % 2 == 0 { b"x" } else { b"y" };
                let _ = fs.rename(&root(), p, b"f", d, n, RENAME_EXCHANGE);
                k += 1;
            }
        }));
        if !entry_is_dir {
            w.push(Box::new(move |_, stop| {
                while !stop.load(Relaxed) {
                    for n in [&b"x"[..], b"y"] {
                        if let Ok(a) = fs.lookup(&root(), d, n) {
                            if fs.link(&root(), id(&a), d, b"z").is_ok() {
                                fs.unlink(&root(), d, b"z").unwrap();
                            }
                        }
                    }
                }
            }));
        }
        w.push(Box::new(move |_, stop| {
            let mut k = 0u64;
            while !stop.load(Relaxed) {
                let r = if k % 2 == 0 {
                    fs.rmdir(&root(), p, b"d")
                } else {
                    fs.rename(&root(), p, b"e", p, b"d", 0)
                };
                tally.check(r == Err(Errno::ENOTEMPTY), || {
                    format!("removal #{k} of a directory that always holds x or y: {r:?}")
                });
                if r.is_ok() {
                    break;
                }
                k += 1;
            }
        }));
        race(w);
        eprintln!("{} moves inside the directory", moves.load(Relaxed));
        let names = list(fs, &rt, d).unwrap();
        tally.check(names.len() == 1, || {
            format!("the directory holds {names:?}")
        });
        tally.finish_and_check(fs);
    }
}

/// A listing returns every entry that exists throughout it exactly once, and no name twice,
/// while two threads churn other names in the directory (create, unlink, mkdir, rmdir, link,
/// rename with no flag, RENAME_NOREPLACE, RENAME_EXCHANGE and RENAME_WHITEOUT). Listings go
/// through a handle in batches of 7 entries and through `readdir_inode` with `read_end`.
#[test]
fn readdir_returns_each_stable_entry_exactly_once_under_churn() {
    let _one = exclusive();
    let seed = seed("readdir under churn");
    let fs = new_fs();
    let rt = root();
    let d = mkdir_id(&fs, lanefs::ROOT_INO, b"d", 0o777);
    let stable: BTreeSet<Vec<u8>> = (0..150).map(|i| format!("s{i:03}").into_bytes()).collect();
    for (i, n) in stable.iter().enumerate() {
        if i % 3 == 0 {
            fs.mkdir(&rt, d, n, 0o755).unwrap();
        } else {
            mkfile(&fs, &rt, d, n, 0o644).unwrap();
        }
    }
    let tally = Tally::new("readdir: stable entries exactly once, no name twice");
    let listings = AtomicU64::new(0);
    let (fs, tally, stable, listings) = (&fs, &tally, &stable, &listings);
    let mut w: Vec<Worker<'_>> = Vec::new();
    for t in 0..2u64 {
        w.push(Box::new(move |_, stop| {
            let mut rng = Rng::new(seed.wrapping_add(t));
            let rt = root();
            let name = |rng: &mut Rng| format!("c{}", rng.below(48)).into_bytes();
            while !stop.load(Relaxed) {
                let (a, b) = (name(&mut rng), name(&mut rng));
                let _ = match rng.below(9) {
                    0 | 1 => mkfile(fs, &rt, d, &a, 0o644).map(|_| ()),
                    2 => fs.unlink(&rt, d, &a),
                    3 => fs.mkdir(&rt, d, &a, 0o755).map(|_| ()),
                    4 => fs.rmdir(&rt, d, &a),
                    5 => fs
                        .lookup(&rt, d, &a)
                        .and_then(|x| fs.link(&rt, id(&x), d, &b))
                        .map(|_| ()),
                    6 => fs.rename(
                        &rt,
                        d,
                        &a,
                        d,
                        &b,
                        [0, RENAME_NOREPLACE][rng.below(2) as usize],
                    ),
                    7 => fs.rename(&rt, d, &a, d, &b, RENAME_EXCHANGE),
                    _ => fs.rename(&rt, d, &a, d, &b, RENAME_WHITEOUT),
                };
            }
        }));
    }
    for t in 0..2usize {
        w.push(Box::new(move |_, stop| {
            let rt = root();
            let mut k = 0u64;
            while !stop.load(Relaxed) {
                let names: Vec<Vec<u8>> = if (k + t as u64) % 2 == 0 {
                    list(fs, &rt, d).unwrap()
                } else {
                    let end = fs.read_end(d).unwrap();
                    let mut out = Vec::new();
                    let mut off = 0;
                    loop {
                        let mut got = 0;
                        fs.readdir_inode(&rt, d, off, &end, false, |e, _| {
                            if got == 5 {
                                return false;
                            }
                            got += 1;
                            off = e.offset;
                            if e.name != b"." && e.name != b".." {
                                out.push(e.name.to_vec());
                            }
                            true
                        })
                        .unwrap();
                        if got == 0 {
                            break out;
                        }
                    }
                };
                let mut seen: BTreeMap<&[u8], u32> = BTreeMap::new();
                for n in &names {
                    *seen.entry(n).or_default() += 1;
                }
                let twice: Vec<_> = seen
                    .iter()
                    .filter(|&(_, &c)| c > 1)
                    .map(|(n, c)| (String::from_utf8_lossy(n).into_owned(), *c))
                    .collect();
                tally.check(twice.is_empty(), || {
                    format!("listing #{k} returned names more than once: {twice:?}")
                });
                let missing: Vec<_> = stable
                    .iter()
                    .filter(|n| !seen.contains_key(n.as_slice()))
                    .map(|n| String::from_utf8_lossy(n).into_owned())
                    .collect();
                tally.check(missing.is_empty(), || {
                    format!("listing #{k} missed stable entries {missing:?}")
                });
                listings.fetch_add(1, Relaxed);
                k += 1;
            }
        }));
    }
    race(w);
    eprintln!("readdir under churn: {} listings", listings.load(Relaxed));
    tally.finish_and_check(fs);
}

/// Directories move between P and Q (mkdir in P, rename to Q, rmdir there), and P/m moves to
/// Q and back with a subdirectory made and removed inside it. Throughout, P's and Q's link
/// counts stay within what their subdirectories allow (2 + 3 stable + `e` or `f` + up to 1
/// moving + `m`), `m`'s is 2 or 3, and the `..` of `m` names P or Q. Afterwards each
/// parent's link count is 2 + its subdirectories, every `..` names the directory holding its
/// name, and `check_invariants` passes.
#[test]
fn link_counts_and_dotdot_stay_right_while_directories_move() {
    let _one = exclusive();
    let (fs, [p, q]) = with_parents();
    let rt = root();
    for i in 0..3 {
        fs.mkdir(&rt, p, format!("s{i}").as_bytes(), 0o755).unwrap();
        fs.mkdir(&rt, q, format!("t{i}").as_bytes(), 0o755).unwrap();
    }
    let e = mkdir_id(&fs, p, b"e", 0o755);
    let f = mkdir_id(&fs, q, b"f", 0o755);
    let m = mkdir_id(&fs, p, b"m", 0o755);
    let tally = Tally::new("link counts and .. under directory moves");
    let (fs, tally) = (&fs, &tally);
    let mut w: Vec<Worker<'_>> = Vec::new();
    w.push(Box::new(move |_, stop| {
        let rt = root();
        let mut i = 0u64;
        while !stop.load(Relaxed) {
            let n = format!("a{i}").into_bytes();
            fs.mkdir(&rt, p, &n, 0o755).unwrap();
            fs.rename(&rt, p, &n, q, &n, 0).unwrap();
            fs.rmdir(&rt, q, &n).unwrap();
            i += 1;
        }
    }));
    w.push(Box::new(move |_, stop| {
        let rt = root();
        while !stop.load(Relaxed) {
            fs.rename(&rt, p, b"m", q, b"m", 0).unwrap();
            fs.mkdir(&rt, m, b"sub", 0o755).unwrap();
            fs.rename(&rt, q, b"m", p, b"m", 0).unwrap();
            fs.rmdir(&rt, m, b"sub").unwrap();
        }
    }));
    w.push(Box::new(move |_, stop| {
        let rt = root();
        while !stop.load(Relaxed) {
            for (dir, tag) in [(p, "P"), (q, "Q")] {
                let n = fs.getattr(dir).unwrap().nlink;
                tally.check((6..=8).contains(&n), || {
                    format!("{tag}'s nlink {n}, not in 6..=8")
                });
            }
            for (x, tag) in [(e, "e"), (f, "f"), (m, "m")] {
                let up = lookup_id(fs, x, b"..");
                tally.check(up == Some(p) || up == Some(q), || {
                    format!("{tag}'s .. is {up:?}")
                });
            }
            let n = fs.getattr(m).unwrap().nlink;
            tally.check(n == 2 || n == 3, || format!("m's nlink {n}"));
            let _ = rt.uid;
        }
    }));
    race(w);
    for dir in [p, q] {
        let names = list(fs, &rt, dir).unwrap();
        let mut subdirs = 0;
        for n in &names {
            let a = fs.lookup(&rt, dir, n).unwrap();
            if a.kind() == FileType::Directory {
                subdirs += 1;
                tally.check(lookup_id(fs, id(&a), b"..") == Some(dir), || {
                    "a .. is wrong".into()
                });
            }
        }
        let nl = fs.getattr(dir).unwrap().nlink;
        tally.check(nl == 2 + subdirs, || {
            format!("nlink {nl} with {subdirs} subdirectories")
        });
    }
    tally.finish_and_check(fs);
}

/// Exchanging directory D (holding an entry) with directories elsewhere, across parents and
/// within one, never makes D look removed or its names look free: creates in D (named by
/// its exact id) never fail, lookups of the exchanged names never fail, rmdir of them is
/// always ENOTEMPTY, a RENAME_NOREPLACE onto them is always EEXIST, and D's `..` always
/// names one of the parents.
#[test]
fn exchanging_directories_never_hides_a_name_or_refuses_a_create() {
    let _one = exclusive();
    let (fs, [p, q]) = with_parents();
    let rt = root();
    let mut dirs = Vec::new();
    for (parent, n) in [(p, &b"d"[..]), (q, b"e"), (p, b"w")] {
        let x = mkdir_id(&fs, parent, n, 0o777);
        mkfile(&fs, &rt, x, b"keep", 0o644).unwrap();
        dirs.push(x);
    }
    fs.mkdir(&rt, p, b"z", 0o755).unwrap();
    let names = [(p, &b"d"[..]), (q, &b"e"[..]), (p, &b"w"[..])];
    let tally = Tally::new("exchanged directories stay alive and named");
    let (fs, tally, dirs) = (&fs, &tally, &dirs);
    let mut w: Vec<Worker<'_>> = Vec::new();
    w.push(Box::new(move |_, stop| {
        let mut k = 0u64;
        while !stop.load(Relaxed) {
            let (a, b) = if k % 2 == 0 {
                (names[0], names[1])
            } else {
                (names[0], names[2])
            };
            let r = fs.rename(&root(), a.0, a.1, b.0, b.1, RENAME_EXCHANGE);
            tally.check(r.is_ok(), || format!("exchange: {r:?}"));
            k += 1;
        }
    }));
    w.push(Box::new(move |_, stop| {
        let rt = root();
        let mut k = 0u64;
        while !stop.load(Relaxed) {
            let x = dirs[k as usize % dirs.len()];
            let n = format!("n{k}").into_bytes();
            let r = mkfile(fs, &rt, x, &n, 0o644);
            tally.check(r.is_ok(), || {
                format!("create in an exchanged directory: {r:?}")
            });
            if r.is_ok() {
                fs.unlink(&rt, x, &n).unwrap();
            }
            k += 1;
        }
    }));
    w.push(Box::new(move |_, stop| {
        let rt = root();
        while !stop.load(Relaxed) {
            for (parent, n) in names {
                let r = fs.lookup(&rt, parent, n);
                tally.check(r.is_ok(), || {
                    format!("lookup {:?}: {r:?}", String::from_utf8_lossy(n))
                });
                let r = fs.rmdir(&rt, parent, n);
                tally.check(r == Err(Errno::ENOTEMPTY), || format!("rmdir: {r:?}"));
            }
            let r = fs.rename(&rt, p, b"z", p, b"d", RENAME_NOREPLACE);
            tally.check(r == Err(Errno::EEXIST), || {
                format!("RENAME_NOREPLACE onto d: {r:?}")
            });
            for &x in dirs {
                let up = lookup_id(fs, x, b"..");
                tally.check(up == Some(p) || up == Some(q), || format!(".. is {up:?}"));
            }
        }
    }));
    race(w);
    for (parent, n) in names {
        let x = fs.lookup(&rt, parent, n).unwrap();
        tally.check(lookup_id(fs, id(&x), b"..") == Some(parent), || {
            "final .. wrong".into()
        });
    }
    tally.finish_and_check(fs);
}

/// Three threads move ten directories at random (into another one, with and without
/// RENAME_NOREPLACE, or back to the root; a move into a descendant must fail with EINVAL)
/// and remove and recreate empty ones, beside a thread that walks paths; every 200 rounds
/// of each, `check_invariants` (one connected tree, no cycle, link counts, `..`) must pass.
#[test]
fn random_directory_renames_keep_one_connected_tree() {
    let _one = exclusive();
    let seed = seed("random directory renames");
    let fs = new_fs();
    let n = 10usize;
    let ids: Mutex<Vec<InodeId>> = Mutex::new(
        (0..n)
            .map(|i| mkdir_id(&fs, lanefs::ROOT_INO, format!("n{i}").as_bytes(), 0o777))
            .collect(),
    );
    let remaking: Vec<Mutex<()>> = (0..n).map(|_| Mutex::new(())).collect();
    let tally = Tally::new("random directory renames keep one tree");
    let bar = SpinBarrier::new(3);
    let stop = AtomicBool::new(false);
    let counts: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());
    let _burn = Burn::new(BURNERS);
    let end = Instant::now() + phase();
    std::thread::scope(|s| {
        for t in 0..3u64 {
            let (fs, ids, bar, stop, tally, counts) = (&fs, &ids, &bar, &stop, &tally, &counts);
            let remaking = &remaking;
            s.spawn(move || {
                let mut rng = Rng::new(seed.wrapping_add(t));
                let rt = root();
                let mut epoch = 0u64;
                loop {
                    for _ in 0..200 {
                        let (i, j) = (rng.below(n as u64) as usize, rng.below(n as u64) as usize);
                        let (a, b) = {
                            let v = ids.lock().unwrap();
                            (v[i], v[j])
                        };
                        let na = format!("n{i}").into_bytes();
                        let Some(pa) = lookup_id(fs, a, b"..") else {
                            continue;
                        };
                        let (what, r) = match rng.below(5) {
                            0 | 1 => ("into", fs.rename(&rt, pa, &na, b, &na, 0)),
                            2 => (
                                "into noreplace",
                                fs.rename(&rt, pa, &na, b, &na, RENAME_NOREPLACE),
                            ),
                            3 => ("to root", fs.rename(&rt, pa, &na, lanefs::ROOT_INO, &na, 0)),
                            _ => {
                                // One removal and recreation of a name at a time: else a
                                // second one could remove the first one's new directory
                                // before the first records it, leaving a dead one recorded.
                                let _one = remaking[i].lock().unwrap();
                                let r = fs.rmdir(&rt, pa, &na);
                                if r.is_ok() {
                                    let x = mkdir_id(fs, lanefs::ROOT_INO, &na, 0o777);
                                    ids.lock().unwrap()[i] = x;
                                }
                                ("rmdir", r)
                            }
                        };
                        *counts
                            .lock()
                            .unwrap()
                            .entry(format!("{what} {:?}", r.map_err(|e| e.name())))
                            .or_default() += 1;
                        tally.check(
                            matches!(
                                r,
                                Ok(())
                                    | Err(Errno::ENOENT
                                        | Errno::EINVAL
                                        | Errno::ENOTEMPTY
                                        | Errno::EEXIST)
                            ),
                            || format!("{what}: {r:?}"),
                        );
                    }
                    bar.wait();
                    if t == 0 {
                        let c = fs.check_invariants();
                        tally.check(c.is_ok(), || format!("epoch {epoch}: {c:?}"));
                        let v = ids.lock().unwrap();
                        for (i, &x) in v.iter().enumerate() {
                            let up = lookup_id(fs, x, b"..");
                            let named =
                                up.and_then(|u| lookup_id(fs, u, format!("n{i}").as_bytes()));
                            tally.check(named == Some(x), || {
                                format!("epoch {epoch}: n{i} not found under its ..")
                            });
                        }
                        if Instant::now() >= end || epoch >= MAX_ROUNDS {
                            stop.store(true, Release);
                        }
                    }
                    bar.wait();
                    if stop.load(Acquire) {
                        break;
                    }
                    epoch += 1;
                }
            });
        }
    });
    eprintln!("random directory renames: {:?}", counts.lock().unwrap());
    tally.finish_and_check(&fs);
}

/// RENAME_EXCHANGE of two directories in different parents changes neither parent's link
/// count (each loses one subdirectory and gains one; tmpfs's `shmem_exchange` leaves both
/// alone), so getattr must always find P at 2 + 2 (`e` and `m`) and Q at 2 + 1 (`f`); and
/// an exchange of a directory with a file across the parents moves P's and Q's counts by
/// one only, between two values each.
#[test]
fn exchanging_directories_across_parents_keeps_the_parents_link_counts() {
    let _one = exclusive();
    for dir_with_file in [true, false] {
        let (fs, [p, q]) = with_parents();
        let rt = root();
        fs.mkdir(&rt, p, b"e", 0o755).unwrap();
        fs.mkdir(&rt, p, b"m", 0o755).unwrap();
        if dir_with_file {
            mkfile(&fs, &rt, q, b"f", 0o644).unwrap();
        } else {
            fs.mkdir(&rt, q, b"f", 0o755).unwrap();
        }
        // Serial states: directory<->directory: P 4, Q 3 always; directory<->file: P 4 or
        // 3 and Q 3 or 2 (never both moved the same way at once, but read separately).
        let (p_ok, q_ok): (&[u32], &[u32]) = if dir_with_file {
            (&[3, 4], &[2, 3])
        } else {
            (&[4], &[3])
        };
        let label = if dir_with_file {
            "directory<->file"
        } else {
            "directory<->directory"
        };
        let tally = Tally::new(format!(
            "{label} exchange across parents: parents' link counts"
        ));
        let seen: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());
        let (fsr, tally_r, seen_r) = (&fs, &tally, &seen);
        let mut w: Vec<Worker<'_>> = Vec::new();
        w.push(Box::new(move |_, stop| {
            while !stop.load(Relaxed) {
                fsr.rename(&root(), p, b"e", q, b"f", RENAME_EXCHANGE)
                    .unwrap();
            }
        }));
        w.push(Box::new(move |_, stop| {
            let mut local: BTreeMap<String, u64> = BTreeMap::new();
            while !stop.load(Relaxed) {
                for (dir, ok, tag) in [(p, p_ok, "P"), (q, q_ok, "Q")] {
                    let n = fsr.getattr(dir).unwrap().nlink;
                    *local.entry(format!("{tag}={n}")).or_default() += 1;
                    tally_r.check(ok.contains(&n), || {
                        format!("{tag}'s nlink {n}, serial states give {ok:?}")
                    });
                }
            }
            *seen_r.lock().unwrap() = local;
        }));
        race(w);
        eprintln!("{label}: link counts seen {:?}", seen.lock().unwrap());
        tally.finish_and_check(&fs);
    }
}

/// Rounds: directory P/d holds 24 entries (made by two threads, so in two per-slot runs); one
/// thread unlinks them all, another creates `x` in it after a random delay, and a third
/// calls rmdir until it succeeds or both others are done. `x` is never removed, so rmdir
/// and the create never both succeed, and a create told ENOENT finds the directory gone
/// from its name; afterwards the directory holds exactly `x` or is gone.
#[test]
fn rmdir_racing_many_removals_and_one_create_agrees_with_a_serial_order() {
    let _one = exclusive();
    let seed = seed("rmdir vs many removals and one create");
    let fs = new_fs();
    let rt = root();
    let p = mkdir_id(&fs, lanefs::ROOT_INO, b"p", 0o777);
    let tally = Tally::new("rmdir vs many removals and one create");
    let cur: Mutex<Option<InodeId>> = Mutex::new(None);
    let created: Mutex<Option<(R<()>, bool)>> = Mutex::new(None);
    let done = AtomicUsize::new(0);
    let outcomes: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());
    let _burn = Burn::new(BURNERS);
    let rounds = Rounds::new(3, phase());
    const N: usize = 24;
    std::thread::scope(|s| {
        // Remover of the 24 entries (makes half of them).
        s.spawn(|| {
            let mut rng = Rng::new(seed ^ 3);
            rounds.racer(|| {
                let d = cur.lock().unwrap().unwrap();
                for i in 0..N / 2 {
                    mkfile(&fs, &rt, d, format!("a{i}").as_bytes(), 0o644).unwrap();
                }
                rounds.wait();
                let mut order: Vec<usize> = (0..N).collect();
                for i in (1..N).rev() {
                    order.swap(i, rng.below(i as u64 + 1) as usize);
                }
                for i in order {
                    let n = if i < N / 2 {
                        format!("a{i}")
                    } else {
                        format!("b{i}")
                    };
                    fs.unlink(&rt, d, n.as_bytes()).unwrap();
                }
                done.fetch_add(1, Release);
            });
        });
        // Creator of x (makes the other half).
        s.spawn(|| {
            let mut rng = Rng::new(seed ^ 4);
            rounds.racer(|| {
                let d = cur.lock().unwrap().unwrap();
                for i in N / 2..N {
                    mkfile(&fs, &rt, d, format!("b{i}").as_bytes(), 0o644).unwrap();
                }
                rounds.wait();
                spin(rng.below(40 * JITTER));
                let r = mkfile(&fs, &rt, d, b"x", 0o644).map(|_| ());
                let gone = r == Err(Errno::ENOENT) && lookup_id(&fs, p, b"d") != Some(d);
                *created.lock().unwrap() = Some((r, gone));
                done.fetch_add(1, Release);
            });
        });
        let mut r = 0u64;
        loop {
            let d = mkdir_id(&fs, p, b"d", 0o777);
            *cur.lock().unwrap() = Some(d);
            done.store(0, Relaxed);
            rounds.wait();
            rounds.wait();
            let mut removed = false;
            let mut tries = 0u64;
            loop {
                let last = done.load(Acquire) == 2;
                match fs.rmdir(&rt, p, b"d") {
                    Ok(()) => {
                        removed = true;
                        break;
                    }
                    Err(Errno::ENOTEMPTY) => {}
                    Err(e) => {
                        tally.fail(|| format!("round {r}: rmdir {e:?}"));
                        break;
                    }
                }
                tries += 1;
                if last {
                    break;
                }
            }
            rounds.wait();
            let (cr, gone) = created.lock().unwrap().take().unwrap();
            *outcomes
                .lock()
                .unwrap()
                .entry(format!(
                    "create {:?} removed {removed}",
                    cr.map_err(|e| e.name())
                ))
                .or_default() += 1;
            let what =
                format!("round {r}: create {cr:?}, rmdir succeeded: {removed} after {tries} tries");
            match cr {
                Ok(()) => {
                    tally.check(!removed, || format!("{what}: both succeeded"));
                    let names = list(&fs, &rt, d);
                    tally.check(names == Ok(vec![b"x".to_vec()]), || {
                        format!("{what}: holds {names:?}")
                    });
                    fs.unlink(&rt, d, b"x").unwrap();
                    fs.rmdir(&rt, p, b"d").unwrap();
                }
                Err(Errno::ENOENT) => {
                    tally.check(removed && gone, || format!("{what}: ENOENT (gone: {gone})"));
                }
                Err(e) => tally.fail(|| format!("{what}: create {e:?}")),
            }
            if r % 256 == 0 {
                let c = fs.check_invariants();
                tally.check(c.is_ok(), || format!("{what}: {c:?}"));
            }
            r += 1;
            if rounds.over(r) {
                break;
            }
        }
        eprintln!(
            "rmdir vs many removals: {r} rounds, {:?}",
            outcomes.lock().unwrap()
        );
    });
    tally.finish_and_check(&fs);
}

/// A file's link count stays the number of its names while threads add and remove names:
/// link and unlink in its directory; link in another directory, rename into the first and
/// unlink; link, rename within the other directory and unlink; and RENAME_EXCHANGE of its
/// permanent name with another file's across the directories (which changes neither
/// file's count). getattr always finds F at 1 to 4 and G at 1; afterwards each count equals
/// the names found, and `check_invariants` passes.
#[test]
fn file_link_counts_follow_their_names_under_link_rename_and_exchange() {
    let _one = exclusive();
    let fs = new_fs();
    let rt = root();
    let d1 = mkdir_id(&fs, lanefs::ROOT_INO, b"d1", 0o777);
    let d2 = mkdir_id(&fs, lanefs::ROOT_INO, b"d2", 0o777);
    let f = id(&mkfile(&fs, &rt, d1, b"a", 0o644).unwrap());
    let g = id(&mkfile(&fs, &rt, d2, b"z", 0o644).unwrap());
    let tally = Tally::new("file link counts follow names");
    let (fs, tally) = (&fs, &tally);
    let mut w: Vec<Worker<'_>> = Vec::new();
    w.push(Box::new(move |_, stop| {
        while !stop.load(Relaxed) {
            fs.link(&root(), f, d1, b"b").unwrap();
            fs.unlink(&root(), d1, b"b").unwrap();
        }
    }));
    w.push(Box::new(move |_, stop| {
        while !stop.load(Relaxed) {
            fs.link(&root(), f, d2, b"c").unwrap();
            fs.rename(&root(), d2, b"c", d1, b"e", 0).unwrap();
            fs.unlink(&root(), d1, b"e").unwrap();
        }
    }));
    w.push(Box::new(move |_, stop| {
        while !stop.load(Relaxed) {
            fs.link(&root(), f, d2, b"h").unwrap();
            fs.rename(&root(), d2, b"h", d2, b"h2", 0).unwrap();
            fs.unlink(&root(), d2, b"h2").unwrap();
        }
    }));
    w.push(Box::new(move |_, stop| {
        let mut k = 0u64;
        while !stop.load(Relaxed) {
            // F is at d1/a and G at d2/z after an even number of exchanges.
            let r = fs.rename(&root(), d1, b"a", d2, b"z", RENAME_EXCHANGE);
            tally.check(r.is_ok(), || format!("exchange #{k}: {r:?}"));
            k += 1;
        }
    }));
    w.push(Box::new(move |_, stop| {
        while !stop.load(Relaxed) {
            let n = fs.getattr(f).unwrap().nlink;
            tally.check((1..=4).contains(&n), || format!("F's nlink {n}"));
            let n = fs.getattr(g).unwrap().nlink;
            tally.check(n == 1, || format!("G's nlink {n}"));
        }
    }));
    race(w);
    for x in [f, g] {
        let mut names = 0;
        for d in [d1, d2] {
            for n in list(fs, &rt, d).unwrap() {
                if fs.lookup(&rt, d, &n).unwrap().ino == x.ino {
                    names += 1;
                }
            }
        }
        let nl = fs.getattr(x).unwrap().nlink;
        tally.check(nl == names, || format!("nlink {nl} with {names} names"));
    }
    tally.finish_and_check(fs);
}
