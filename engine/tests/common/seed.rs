//! Seeds of the randomised tests: one environment variable, `LANEFS_SEED`, for every test of
//! the workspace (the engine's, the store's and the mount's, and the store's unit tests), so
//! that a failure can be repeated with the seed its output printed.
//!
//! A test that draws a fresh seed prints it when it starts (the output of a failing test is
//! shown); `LANEFS_SEED=<n>` gives every test of the run that seed (a test that runs several
//! seeds runs only that one). What the seed repeats is the test's random choices, not the
//! scheduler's interleaving of its threads.

#![allow(dead_code)]

use rand::SeedableRng;
use rand::rngs::StdRng;

/// The environment variable that holds the seed.
pub const VAR: &str = "LANEFS_SEED";

/// `LANEFS_SEED`, if it is set (a test fails at once if it is not a number).
pub fn from_env() -> Option<u64> {
    let v = std::env::var(VAR).ok()?;
    Some(
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{VAR}={v}: not a number")),
    )
}

/// The seed of `what`'s random run: `LANEFS_SEED` if set, else a fresh one; printed either
/// way.
pub fn seed(what: &str) -> u64 {
    let s = from_env().unwrap_or_else(rand::random);
    eprintln!("{what}: seed {s} ({VAR}={s} replays it)");
    s
}

/// The seed of `what`'s run with a fixed seed: `LANEFS_SEED` if set, else `default`;
/// printed either way.
pub fn fixed(what: &str, default: u64) -> u64 {
    let s = from_env().unwrap_or(default);
    eprintln!("{what}: seed {s} ({VAR}={s} replays it)");
    s
}

/// The seeds of a test that runs several: `LANEFS_SEED` alone if set, else `default` (fixed
/// seeds, or fresh ones); printed.
pub fn seeds(what: &str, default: impl IntoIterator<Item = u64>) -> Vec<u64> {
    let v: Vec<u64> = match from_env() {
        Some(s) => vec![s],
        None => default.into_iter().collect(),
    };
    eprintln!("{what}: seeds {v:?} ({VAR}=<one of them> replays it alone)");
    v
}

/// `n` fresh seeds (for [`seeds`]' default).
pub fn fresh(n: usize) -> impl Iterator<Item = u64> {
    (0..n).map(|_| rand::random())
}

/// The random choices of a run with seed `seed`.
pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// How many seeds a test that runs several runs: `LANEFS_ROUNDS` if set, else `default`.
pub fn rounds(default: u64) -> u64 {
    match std::env::var("LANEFS_ROUNDS") {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("LANEFS_ROUNDS={v}: not a number")),
        Err(_) => default,
    }
}

/// Fixed seeds for [`seeds`]: `base`, `base + 1`, ..., [`rounds`]`(default_rounds)` of them.
pub fn counting(base: u64, default_rounds: u64) -> std::ops::Range<u64> {
    base..base + rounds(default_rounds)
}
