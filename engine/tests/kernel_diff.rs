//! Differential tests against the Linux kernel: each case runs the same operations on a kernel
//! tmpfs directory (plain syscalls) and on lanefs (the path API), as root and as plain users,
//! and requires the same result or errno at every step (docs/DESIGN.md §4: tmpfs is the reference).
//!
//! Needs root (to act as other users) and a tmpfs (/dev/shm, or one it mounts).

mod common;

use common::cases::{self, Case, root, u1, u2};
use common::{Executor, Kernel, Lanes, Op::*, compare};
use lanefs::{Config, Filesystem, Locking};
use std::sync::Arc;

fn s(x: &str) -> String {
    x.to_string()
}

fn run(c: Case) {
    for locking in Locking::ALL {
        let mut k = Kernel::new(c.name, c.umask);
        let fs = Arc::new(Filesystem::new(Config {
            locking,
            ..Config::default()
        }));
        let mut l = Lanes::new(fs.clone(), c.umask);
        compare(
            &format!("{} [{}]", c.name, locking.name()),
            &mut k,
            &mut l,
            &c.steps,
        );
        fs.check_invariants()
            .unwrap_or_else(|e| panic!("case {}: invariants: {e}", c.name));
        assert_eq!(fs.open_handles(), 0, "case {}: handles leaked", c.name);
    }
}

#[test]
fn o_tmpfile() {
    run(cases::o_tmpfile());
}

#[test]
fn basics_nlink_sizes_and_readdir() {
    run(cases::basics_nlink_sizes_and_readdir());
}

#[test]
fn error_codes() {
    run(cases::error_codes());
}

#[test]
fn rename_edge_cases() {
    run(cases::rename_edge_cases());
}

#[test]
fn permissions_as_plain_users() {
    run(cases::permissions_as_plain_users());
}

#[test]
fn setgid_directories() {
    run(cases::setgid_directories());
}

#[test]
fn umask_applies_to_new_inodes() {
    run(cases::umask_applies_to_new_inodes());
}

#[test]
fn data_and_sizes() {
    run(cases::data_and_sizes());
}

#[test]
fn timestamps_follow_posix() {
    run(cases::timestamps_follow_posix());
}

#[test]
fn inode_flags() {
    run(cases::inode_flags());
}

#[test]
fn inode_flags_at_open() {
    run(cases::inode_flags_at_open());
}

#[test]
fn flags_before_types() {
    run(cases::flags_before_types());
}

#[test]
fn rename_whiteout() {
    run(cases::rename_whiteout());
}

#[test]
fn extended_attributes() {
    run(cases::extended_attributes());
}

#[test]
fn posix_acls() {
    run(cases::posix_acls());
}

/// Random operations over a handful of names, as root and as two users, on both sides.
/// Prints its seed; `LANEFS_SEED=<n>` replays one.
#[test]
fn randomized_against_the_kernel() {
    use rand::{Rng, rngs::StdRng};
    let seeds = common::seed::seeds("randomized_against_the_kernel", common::seed::fresh(4));
    for seed in seeds {
        eprintln!(
            "randomized_against_the_kernel: seed {seed} (LANEFS_SEED={seed} replays it alone)"
        );
        let mut rng = common::seed::rng(seed);
        let names = [
            "a", "b", "c", "d", "a/x", "a/y", "a/w", "b/x", "b/a", "b/y", "a/x/z", "c/q", "c/..",
        ];
        let who = [root(), u1(), u2()];
        let mut steps = vec![
            (root(), Mkdir(s("a"), 0o777)),
            (root(), Mkdir(s("b"), 0o1777)),
        ];
        for _ in 0..1500 {
            let n = |rng: &mut StdRng| s(names[rng.random_range(0..names.len())]);
            let mode = |rng: &mut StdRng| {
                [0o777, 0o777, 0o666, 0o755, 0o700, 0o644, 0o1777, 0o2775][rng.random_range(0..8)]
            };
            let op = match rng.random_range(0..26) {
                0 | 1 | 22 => Create(n(&mut rng), mode(&mut rng)),
                2 | 3 | 23 => Mkdir(n(&mut rng), mode(&mut rng)),
                24 | 25 => Stat(n(&mut rng)),
                4 => Unlink(n(&mut rng)),
                5 => Rmdir(n(&mut rng)),
                6 | 7 => Rename(
                    n(&mut rng),
                    n(&mut rng),
                    [0, 0, libc::RENAME_NOREPLACE, libc::RENAME_EXCHANGE][rng.random_range(0..4)],
                ),
                8 => Link(n(&mut rng), n(&mut rng)),
                9 => Symlink(n(&mut rng), n(&mut rng)),
                10 => Stat(n(&mut rng)),
                11 => Lstat(n(&mut rng)),
                12 => ReadDir(n(&mut rng)),
                13 => Chmod(n(&mut rng), mode(&mut rng)),
                14 => Write(
                    n(&mut rng),
                    rng.random_range(0..9000),
                    vec![7; rng.random_range(0..300)],
                ),
                15 => Read(n(&mut rng)),
                16 => Truncate(n(&mut rng), rng.random_range(0..10_000)),
                17 => Chown(
                    n(&mut rng),
                    Some([0, 1000, 2000][rng.random_range(0..3)]),
                    None,
                ),
                18 => Access(n(&mut rng), rng.random_range(0..8)),
                19 => SetXattr(n(&mut rng), s("user.r"), vec![1, 2], 0),
                20 => Readlink(n(&mut rng)),
                _ => Open(
                    n(&mut rng),
                    [
                        libc::O_RDONLY,
                        libc::O_WRONLY | libc::O_TRUNC,
                        libc::O_RDWR | libc::O_CREAT,
                    ][rng.random_range(0..3)],
                    0o644,
                ),
            };
            // Mostly root, so that most steps succeed; users meet the permission checks.
            steps.push((who[[0, 0, 0, 1, 1, 2][rng.random_range(0..6)]].clone(), op));
        }
        let mut k = Kernel::new("random", 0o022);
        let fs = Arc::new(Filesystem::new(Config::default()));
        let mut l = Lanes::new(fs.clone(), 0o022);
        let ok = compare(&format!("random seed {seed}"), &mut k, &mut l, &steps);
        eprintln!("  {ok} of {} steps succeeded", steps.len());
        assert!(
            ok * 8 > steps.len(),
            "seed {seed}: only {ok} steps succeeded; the mix is too error-heavy"
        );
        fs.check_invariants()
            .unwrap_or_else(|e| panic!("seed {seed}: invariants: {e}"));
        // Both trees end the same: compare a final listing of every name.
        for name in names {
            let a = k.run(&root(), &Lstat(s(name)));
            let b = l.run(&root(), &Lstat(s(name)));
            assert_eq!(
                common::fmt_outcome(&a),
                common::fmt_outcome(&b),
                "seed {seed}: final {name}"
            );
        }
    }
}
