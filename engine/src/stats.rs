//! Statistics: operation counts and per-lock-class contention, kept per thread slot.
//!
//! Every lock class counts acquisitions, contended acquisitions and wait time (docs/DESIGN.md
//! §3) without a shared counter (which would itself be the hot spot). Each thread slot owns one
//! [`SlotStats`] on its own cache lines; a snapshot ([`Stats::snapshot`]) sums the slots.
//!
//! Wait time is measured only on the contended path (a failed `try_lock` first), so an
//! uncontended acquisition costs one counter increment and no clock read.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use parking_lot::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::slots::PerSlot;

macro_rules! named_enum {
    ($(#[$m:meta])* $vis:vis enum $name:ident { $($(#[$vm:meta])* $v:ident => $s:literal,)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        $vis enum $name { $($(#[$vm])* $v,)* }
        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$v,)*];
            /// Number of variants.
            pub const COUNT: usize = [$($name::$v,)*].len();
            /// Stable lower-case name, used in `lanefs stats` and JSON output.
            pub fn name(self) -> &'static str {
                match self { $($name::$v => $s,)* }
            }
        }
    };
}

named_enum! {
    /// The lock classes of the engine; `locking.rs` says what each protects and how they nest.
    pub enum LockClass {
        /// Global lock around every operation, `coarse` locking mode only.
        Coarse => "coarse",
        /// Per-directory mutation lock, `dirlock` locking mode only.
        DirLock => "dirlock",
        /// Filesystem-wide lock taken by renames that move a directory to another parent.
        Rename => "rename",
        /// Per-name stripe lock (hash of parent and name).
        Stripe => "stripe",
        /// Dirent-map shard (read shared by lookups, write exclusive by inserts and removals).
        DirentShard => "dirent_shard",
        /// Ordered-index shard (readdir order, directory entry counts).
        IndexShard => "index_shard",
        /// Seqlock writer side of an inode's attributes.
        Attr => "attr",
        /// File data (read shared, write exclusive).
        FileData => "file_data",
        /// Per-slot inode-number allocator.
        InoAlloc => "ino_alloc",
        /// Per-slot open-file table shard.
        Handles => "handles",
        /// Per-inode extended attributes.
        Xattr => "xattr",
        /// The lazily loaded table's miss path in the "before" modes (`fs/lazy.rs`).
        InodeHash => "inode_hash",
    }
}

named_enum! {
    /// Engine operations, counted per slot; each variant is the `Filesystem` method of the
    /// same name.
    #[allow(missing_docs)]
    pub enum Op {
        Lookup => "lookup",
        Forget => "forget",
        Getattr => "getattr",
        Setattr => "setattr",
        Mknod => "mknod",
        Mkdir => "mkdir",
        Create => "create",
        Tmpfile => "tmpfile",
        Symlink => "symlink",
        Link => "link",
        Unlink => "unlink",
        Rmdir => "rmdir",
        Rename => "rename",
        Readlink => "readlink",
        Open => "open",
        Read => "read",
        Write => "write",
        Flush => "flush",
        Fsync => "fsync",
        Release => "release",
        Fallocate => "fallocate",
        Lseek => "lseek",
        Opendir => "opendir",
        Readdir => "readdir",
        Releasedir => "releasedir",
        Statfs => "statfs",
        Getxattr => "getxattr",
        Setxattr => "setxattr",
        Listxattr => "listxattr",
        Removexattr => "removexattr",
        Access => "access",
        GetFlags => "get_flags",
        SetFlags => "set_flags",
    }
}

#[derive(Default)]
struct LockCounters {
    acquired: AtomicU64,
    contended: AtomicU64,
    wait_ns: AtomicU64,
}

/// One slot's counters.
struct SlotStats {
    locks: [LockCounters; LockClass::COUNT],
    ops: [AtomicU64; Op::COUNT],
}

/// Adds `n` to a per-slot counter.
///
/// The counter belongs to the calling thread's slot, so its line stays in this core's cache and
/// the atomic add is uncontended (about 20 cycles). It is an atomic read-modify-write rather than
/// a load and a store so that two threads sharing a slot (more than `NSLOTS` alive) lose nothing.
#[inline]
fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Relaxed);
}

/// The engine's statistics.
pub struct Stats {
    slots: PerSlot<SlotStats>,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            slots: PerSlot::new(|_| SlotStats {
                locks: std::array::from_fn(|_| LockCounters::default()),
                ops: std::array::from_fn(|_| AtomicU64::new(0)),
            }),
        }
    }
}

impl Stats {
    /// Counts one operation.
    #[inline]
    pub(crate) fn op(&self, op: Op) {
        bump(&self.slots.local().ops[op as usize], 1);
    }

    #[inline]
    fn acquired(&self, class: LockClass) {
        bump(&self.slots.local().locks[class as usize].acquired, 1);
    }

    #[cold]
    fn waited(&self, class: LockClass, since: Instant) {
        let c = &self.slots.local().locks[class as usize];
        bump(&c.acquired, 1);
        bump(&c.contended, 1);
        bump(&c.wait_ns, since.elapsed().as_nanos() as u64);
    }

    /// Counts a contended acquisition that the caller timed itself (spin locks).
    #[cold]
    pub(crate) fn waited_ns(&self, class: LockClass, ns: u64) {
        let c = &self.slots.local().locks[class as usize];
        bump(&c.contended, 1);
        bump(&c.wait_ns, ns);
    }

    /// Counts an uncontended acquisition of a lock the caller manages itself.
    #[inline]
    pub(crate) fn acquired_uncounted(&self, class: LockClass) {
        self.acquired(class);
    }

    /// Locks `m`, counting the acquisition under `class`.
    #[inline]
    pub(crate) fn lock<'a, T>(&self, class: LockClass, m: &'a Mutex<T>) -> MutexGuard<'a, T> {
        if let Some(g) = m.try_lock() {
            self.acquired(class);
            return g;
        }
        let t = Instant::now();
        let g = m.lock();
        self.waited(class, t);
        g
    }

    /// Read-locks `l`, counting the acquisition under `class`.
    #[inline]
    pub(crate) fn read<'a, T>(&self, class: LockClass, l: &'a RwLock<T>) -> RwLockReadGuard<'a, T> {
        if let Some(g) = l.try_read() {
            self.acquired(class);
            return g;
        }
        let t = Instant::now();
        let g = l.read();
        self.waited(class, t);
        g
    }

    /// Write-locks `l`, counting the acquisition under `class`.
    #[inline]
    pub(crate) fn write<'a, T>(
        &self,
        class: LockClass,
        l: &'a RwLock<T>,
    ) -> RwLockWriteGuard<'a, T> {
        if let Some(g) = l.try_write() {
            self.acquired(class);
            return g;
        }
        let t = Instant::now();
        let g = l.write();
        self.waited(class, t);
        g
    }

    /// Sums every slot.
    pub fn snapshot(&self) -> StatsSnapshot {
        let mut s = StatsSnapshot {
            ops: vec![0; Op::COUNT],
            locks: vec![LockStat::default(); LockClass::COUNT],
        };
        for slot in self.slots.iter() {
            for (i, c) in slot.ops.iter().enumerate() {
                s.ops[i] += c.load(Relaxed);
            }
            for (i, c) in slot.locks.iter().enumerate() {
                s.locks[i].acquired += c.acquired.load(Relaxed);
                s.locks[i].contended += c.contended.load(Relaxed);
                s.locks[i].wait_ns += c.wait_ns.load(Relaxed);
            }
        }
        s
    }
}

/// Counters of one lock class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LockStat {
    /// Acquisitions.
    pub acquired: u64,
    /// Acquisitions that found the lock held and waited.
    pub contended: u64,
    /// Total nanoseconds spent waiting in contended acquisitions.
    pub wait_ns: u64,
}

/// A point-in-time sum of the engine's statistics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatsSnapshot {
    ops: Vec<u64>,
    locks: Vec<LockStat>,
}

impl StatsSnapshot {
    /// Operations of kind `op`.
    pub fn op(&self, op: Op) -> u64 {
        self.ops[op as usize]
    }

    /// Counters of lock class `class`.
    pub fn lock(&self, class: LockClass) -> LockStat {
        self.locks[class as usize]
    }

    /// Acquisitions of all lock classes together.
    pub fn total_acquisitions(&self) -> u64 {
        self.locks.iter().map(|l| l.acquired).sum()
    }

    /// Counters that grew since `earlier`.
    pub fn since(&self, earlier: &StatsSnapshot) -> StatsSnapshot {
        StatsSnapshot {
            ops: self
                .ops
                .iter()
                .zip(&earlier.ops)
                .map(|(a, b)| a.wrapping_sub(*b))
                .collect(),
            locks: self
                .locks
                .iter()
                .zip(&earlier.locks)
                .map(|(a, b)| LockStat {
                    acquired: a.acquired.wrapping_sub(b.acquired),
                    contended: a.contended.wrapping_sub(b.contended),
                    wait_ns: a.wait_ns.wrapping_sub(b.wait_ns),
                })
                .collect(),
        }
    }

    /// Lock classes sorted by wait time, then contention, most first; classes never taken are
    /// left out.
    pub fn hottest_locks(&self) -> Vec<(LockClass, LockStat)> {
        let mut v: Vec<_> = LockClass::ALL
            .iter()
            .map(|&c| (c, self.lock(c)))
            .filter(|(_, l)| l.acquired > 0)
            .collect();
        v.sort_by_key(|(c, l)| {
            (
                std::cmp::Reverse(l.wait_ns),
                std::cmp::Reverse(l.contended),
                *c as usize,
            )
        });
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_uncontended_and_contended_acquisitions() {
        let stats = Stats::default();
        let m = Mutex::new(0u32);
        drop(stats.lock(LockClass::Stripe, &m));
        let before = stats.snapshot();
        assert_eq!(before.lock(LockClass::Stripe).acquired, 1);
        assert_eq!(before.lock(LockClass::Stripe).contended, 0);

        // Hold the lock in this thread while another thread waits for it.
        let g = m.lock();
        std::thread::scope(|s| {
            let h = s.spawn(|| drop(stats.lock(LockClass::Stripe, &m)));
            std::thread::sleep(std::time::Duration::from_millis(20));
            drop(g);
            h.join().unwrap();
        });
        let d = stats.snapshot().since(&before);
        assert_eq!(d.lock(LockClass::Stripe).acquired, 1);
        assert_eq!(d.lock(LockClass::Stripe).contended, 1);
        assert!(
            d.lock(LockClass::Stripe).wait_ns >= 1_000_000,
            "{:?}",
            d.lock(LockClass::Stripe)
        );
        assert_eq!(d.hottest_locks()[0].0, LockClass::Stripe);
    }

    #[test]
    fn op_counts_sum_over_threads() {
        let stats = Stats::default();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| (0..1000).for_each(|_| stats.op(Op::Lookup)));
            }
        });
        assert_eq!(stats.snapshot().op(Op::Lookup), 4000);
    }
}
