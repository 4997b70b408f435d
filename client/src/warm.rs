//! Which names the kernel holds: with `LANEFS_RUN_WARM_STAT=1` (`lanefs run --warm-stat`;
//! off by default), a `stat` of one goes through the kernel, which answers it
//! from its own caches without asking the server, faster than a round trip over the channel
//! (on the 2-CPU test machine, 2-9x for a warm `stat` loop: docs/BENCHMARKS.md). A name the
//! kernel does not hold costs it a LOOKUP round trip through FUSE, and the channel answers
//! it faster (a cold scan, seed 000's): those stay on the channel.
//!
//! The server says, with each `stat` it serves, whether the kernel holds the inode
//! ([`lanefs_channel::HELD`]); this table keeps a hash of each such path (mount, path from
//! its root, whether the last symlink is followed), and a later `stat` of a path found here
//! goes to the kernel. The table is lossy (a fixed array, a slot overwritten by the next
//! path that hashes to it) and only ever a hint: the kernel's answer is right for every path
//! whatever this table says (every change made over the channel has invalidated what the
//! kernel cached of it before it returned), so a wrong guess costs time. A name removed or
//! renamed over the channel is dropped from it.
//!
//! Why it is not the default: a change over the channel is visible to the channel's readers
//! from the moment the engine makes it, and to the kernel's from the moment its
//! invalidation lands, a few microseconds later. A program whose `stat`s all go over the
//! channel never sees the two apart; one that asks the kernel for some of them can see a
//! change, then the state before it (another process changing the file at that moment). And
//! a thread's own change was found missing from its next `stat` through the kernel, about
//! once in 2,000 to 10,000 tries while other threads stat the file through the kernel, for
//! up to about 40 µs, on both transports (`scripts/repro/stale_attr_after_channel_change.c`;
//! cause not found: the kernel's attribute cache, whose invalidation was written before the
//! change's call returned).
//! `statx` with `AT_STATX_DONT_SYNC` (the kernel's cached attributes, even stale) always goes
//! over the channel.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::mounts::Mount;

/// Slots (a power of two), in buckets of [`WAYS`] (32 bytes: one cache line's half): 512 KiB
/// of address space, of which a process touches the pages its paths hash to.
const SLOTS: usize = 1 << 16;
/// Slots a path may take, side by side: with 32,000 paths (seed 000's scan at T=32) one in
/// ten thousand finds its bucket full.
const WAYS: usize = 4;

static TABLE: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];

/// The path's hash (FNV-1a over the mount's device number, the flag and the path, mixed),
/// never 0 (an empty slot).
fn hash(m: &Mount, rel: &[u8], nofollow: bool) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let dev = (u64::from(m.dev.0) << 32) | u64::from(m.dev.1);
    for b in dev
        .to_le_bytes()
        .iter()
        .chain(&[u8::from(nofollow)])
        .chain(rel)
    {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    // FNV-1a spreads the last bytes into the low bits only (paths that differ at their end
    // would share slots): the finaliser of MurmurHash3 mixes every bit into every other.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h | 1
}

/// The bucket of the path whose hash is `h`.
fn bucket(h: u64) -> &'static [AtomicU64] {
    let i = (h >> 32) as usize & (SLOTS - 1) & !(WAYS - 1);
    &TABLE[i..i + WAYS]
}

/// Whether `LANEFS_RUN_WARM_STAT=1`: whether this module is used at all.
pub(crate) fn on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("LANEFS_RUN_WARM_STAT").is_some_and(|v| v == "1"))
}

/// Whether the kernel held the inode at `rel` when the server last said.
pub(crate) fn held(m: &Mount, rel: &[u8], nofollow: bool) -> bool {
    let h = hash(m, rel, nofollow);
    bucket(h).iter().any(|s| s.load(Relaxed) == h)
}

/// Notes what the server said of `rel` with its `stat`: a held path takes an empty slot of
/// its bucket, or one chosen by its hash when none is empty.
pub(crate) fn note(m: &Mount, rel: &[u8], nofollow: bool, held: bool) {
    let h = hash(m, rel, nofollow);
    let b = bucket(h);
    if held {
        if b.iter().any(|s| s.load(Relaxed) == h) {
            return;
        }
        let s = b
            .iter()
            .find(|s| s.load(Relaxed) == 0)
            .unwrap_or(&b[h as usize % WAYS]);
        s.store(h, Relaxed);
    } else {
        for s in b {
            let _ = s.compare_exchange(h, 0, Relaxed, Relaxed);
        }
    }
}

/// Forgets `rel` (both forms): removed or renamed over the channel.
pub(crate) fn forget(m: &Mount, rel: &[u8]) {
    note(m, rel, false, false);
    note(m, rel, true, false);
}
