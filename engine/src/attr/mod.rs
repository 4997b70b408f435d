//! Inode attributes: the public [`Attr`] snapshot, and the seqlock ([`AttrCell`]) that stores
//! them inside an inode so that `getattr` and permission checks read them without writing any
//! shared cache line (docs/DESIGN.md §3: lookups take no shared lock).

use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering::*, fence};
use std::time::Instant;

use crate::id::{Generation, Ino};
use crate::record::effect;
use crate::stats::{LockClass, Stats};
use crate::time::Timespec;

/// Type of a file, from the `S_IFMT` bits of its mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileType {
    /// `S_IFREG`
    RegularFile,
    /// `S_IFDIR`
    Directory,
    /// `S_IFLNK`
    Symlink,
    /// `S_IFCHR`
    CharDevice,
    /// `S_IFBLK`
    BlockDevice,
    /// `S_IFIFO`
    NamedPipe,
    /// `S_IFSOCK`
    Socket,
}

impl FileType {
    /// The type encoded in `mode`'s `S_IFMT` bits, if it is one.
    pub fn from_mode(mode: u32) -> Option<FileType> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG => FileType::RegularFile,
            libc::S_IFDIR => FileType::Directory,
            libc::S_IFLNK => FileType::Symlink,
            libc::S_IFCHR => FileType::CharDevice,
            libc::S_IFBLK => FileType::BlockDevice,
            libc::S_IFIFO => FileType::NamedPipe,
            libc::S_IFSOCK => FileType::Socket,
            _ => return None,
        })
    }

    /// The `S_IFMT` bits of this type.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileType::RegularFile => libc::S_IFREG,
            FileType::Directory => libc::S_IFDIR,
            FileType::Symlink => libc::S_IFLNK,
            FileType::CharDevice => libc::S_IFCHR,
            FileType::BlockDevice => libc::S_IFBLK,
            FileType::NamedPipe => libc::S_IFIFO,
            FileType::Socket => libc::S_IFSOCK,
        }
    }

    /// The `d_type` value `readdir` reports (`DT_REG`, ...).
    pub fn dirent_type(self) -> u8 {
        (self.mode_bits() >> 12) as u8
    }
}

/// A snapshot of an inode's attributes, as `stat(2)` reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    /// Inode number.
    pub ino: Ino,
    /// Generation: `(ino, generation)` is unique over the life of the filesystem even though
    /// inode numbers are reused (`id.rs`).
    pub generation: Generation,
    /// Type and permission bits, as `st_mode`.
    pub mode: u32,
    /// Hard links (directories: 2 + subdirectories).
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device number of a character or block device node.
    pub rdev: u64,
    /// Size in bytes (directories: 20 bytes per entry, counting `.` and `..`, as tmpfs).
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    /// Preferred I/O size.
    pub blksize: u32,
    /// Last access.
    pub atime: Timespec,
    /// Last data modification.
    pub mtime: Timespec,
    /// Last status change.
    pub ctime: Timespec,
    /// Creation (`statx`'s `stx_btime`): when the inode was made; `None` for an inode a disk
    /// store kept from before it kept birth times (checkpoint format 3 and older).
    pub btime: Option<Timespec>,
    /// The inode flags `chattr` sets ([`FS_IMMUTABLE_FL`], [`FS_APPEND_FL`],
    /// [`FS_NODUMP_FL`], [`FS_NOATIME_FL`]), as `FS_IOC_GETFLAGS` reports them for a regular
    /// file or directory; other inodes have the ones they inherited from their directory.
    pub flags: u32,
}

impl Attr {
    /// The file's type.
    pub fn kind(&self) -> FileType {
        FileType::from_mode(self.mode).expect("engine inodes always have a valid type")
    }

    /// Permission bits (`mode & 07777`).
    pub fn perm(&self) -> u32 {
        self.mode & 0o7777
    }

    /// The `STATX_ATTR_*` bits `statx(2)` reports in `stx_attributes` for this inode, as
    /// tmpfs reports them: [`STATX_ATTR_IMMUTABLE`], [`STATX_ATTR_APPEND`] and
    /// [`STATX_ATTR_NODUMP`] for the inode flags 'i', 'a' and 'd' ([`Attr::flags`]), on every
    /// kind of inode. The bits this filesystem can report at all are [`STATX_ATTRS`]
    /// (`stx_attributes_mask`).
    pub fn statx_attributes(&self) -> u64 {
        STATX_OF_FLAGS
            .iter()
            .filter(|(f, _)| self.flags & f != 0)
            .map(|(_, s)| s)
            .sum()
    }
}

/// `STATX_ATTR_IMMUTABLE`: `stx_attributes` bit of an immutable inode (`chattr +i`).
pub const STATX_ATTR_IMMUTABLE: u64 = 0x10;
/// `STATX_ATTR_APPEND`: `stx_attributes` bit of an append-only inode (`chattr +a`).
pub const STATX_ATTR_APPEND: u64 = 0x20;
/// `STATX_ATTR_NODUMP`: `stx_attributes` bit of an inode `dump` skips (`chattr +d`).
pub const STATX_ATTR_NODUMP: u64 = 0x40;
/// The `STATX_ATTR_*` bits the engine reports ([`Attr::statx_attributes`]): what a
/// filesystem adds to `stx_attributes_mask` (tmpfs adds these three).
pub const STATX_ATTRS: u64 = STATX_ATTR_IMMUTABLE | STATX_ATTR_APPEND | STATX_ATTR_NODUMP;

/// `(FS_*_FL, STATX_ATTR_*)`: the inode flags `statx` shows.
const STATX_OF_FLAGS: [(u32, u64); 3] = [
    (FS_IMMUTABLE_FL, STATX_ATTR_IMMUTABLE),
    (FS_APPEND_FL, STATX_ATTR_APPEND),
    (FS_NODUMP_FL, STATX_ATTR_NODUMP),
];

/// A time to set with [`SetAttr`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeSet {
    /// The current time (`UTIME_NOW`): allowed to the owner and to anyone with write permission.
    Now,
    /// An explicit time: allowed to the owner only (and root).
    At(Timespec),
}

/// Attributes to change with `setattr`; `None` leaves a field as it is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// New permission bits (the type bits are ignored).
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size (truncate or extend with a hole).
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<TimeSet>,
    /// New modification time.
    pub mtime: Option<TimeSet>,
    /// New change time (FUSE can send one; otherwise the engine sets it to now on any change).
    pub ctime: Option<Timespec>,
    /// A `chown(2)`, also when `uid` and `gid` are both `None` (`chown(path, -1, -1)`): a
    /// file that is not a directory loses its set-user-ID bit, and its set-group-ID bit when
    /// group-executable (or the caller is outside its group and not root), as a change of
    /// owner or group takes them. A `SetAttr` with `uid` or `gid` set is a chown anyway.
    pub chown: bool,
}

/// The mutable attribute values of an inode, copied out of or into an [`AttrCell`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AttrVals {
    /// Type and permission bits (`st_mode`, 16 bits).
    pub mode: u32,
    /// Inode flags ([`flags`]), 16 bits.
    pub flags: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub blocks: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
}

crate::impl_attributes!(AttrVals);

pub(crate) mod flag_bits;

pub(crate) use flag_bits::flags;
pub use flag_bits::{FS_APPEND_FL, FS_IMMUTABLE_FL, FS_NOATIME_FL, FS_NODUMP_FL};

const BLOCKS_PER_PAGE: u64 = crate::data::PAGE / 512;

fn pages_of(blocks: u64) -> u32 {
    debug_assert_eq!(blocks % BLOCKS_PER_PAGE, 0, "blocks count whole pages");
    u32::try_from(blocks / BLOCKS_PER_PAGE).unwrap_or(u32::MAX)
}

/// An inode's attributes behind a sequence lock.
///
/// Readers ([`AttrCell::load`]) never write: they read the sequence number, the fields and the
/// sequence number again, and retry if a writer was active. Writers serialise among themselves
/// by moving the sequence number from even to odd with a compare-and-swap, and make it even
/// again when done; a writer never blocks inside (the closure it runs is plain computation), so
/// the spin is short. The fields are atomics so that a reader racing a writer reads torn values
/// (which it then discards) without undefined behaviour.
pub(crate) struct AttrCell {
    seq: AtomicU32,
    /// `flags << 16 | mode`.
    mode: AtomicU32,
    uid: AtomicU32,
    gid: AtomicU32,
    atime_ns: AtomicU32,
    mtime_ns: AtomicU32,
    ctime_ns: AtomicU32,
    /// `blocks / 8`: blocks count whole 4 KiB pages, and a page count fits 32 bits (16 TiB
    /// in memory), which keeps the cell at 64 bytes.
    pages: AtomicU32,
    size: AtomicU64,
    atime_s: AtomicI64,
    mtime_s: AtomicI64,
    ctime_s: AtomicI64,
}

impl AttrCell {
    pub fn new(v: AttrVals) -> Self {
        AttrCell {
            seq: AtomicU32::new(0),
            mode: AtomicU32::new(pack_mode(&v)),
            uid: AtomicU32::new(v.uid),
            gid: AtomicU32::new(v.gid),
            atime_ns: AtomicU32::new(v.atime.nsec),
            mtime_ns: AtomicU32::new(v.mtime.nsec),
            ctime_ns: AtomicU32::new(v.ctime.nsec),
            pages: AtomicU32::new(pages_of(v.blocks)),
            size: AtomicU64::new(v.size),
            atime_s: AtomicI64::new(v.atime.sec),
            mtime_s: AtomicI64::new(v.mtime.sec),
            ctime_s: AtomicI64::new(v.ctime.sec),
        }
    }

    fn read_fields(&self) -> AttrVals {
        let mode = self.mode.load(Relaxed);
        AttrVals {
            mode: mode & 0xFFFF,
            flags: mode >> 16,
            uid: self.uid.load(Relaxed),
            gid: self.gid.load(Relaxed),
            size: self.size.load(Relaxed),
            blocks: self.pages.load(Relaxed) as u64 * BLOCKS_PER_PAGE,
            atime: Timespec::new(self.atime_s.load(Relaxed), self.atime_ns.load(Relaxed)),
            mtime: Timespec::new(self.mtime_s.load(Relaxed), self.mtime_ns.load(Relaxed)),
            ctime: Timespec::new(self.ctime_s.load(Relaxed), self.ctime_ns.load(Relaxed)),
        }
    }

    fn write_fields(&self, v: &AttrVals) {
        self.mode.store(pack_mode(v), Relaxed);
        self.uid.store(v.uid, Relaxed);
        self.gid.store(v.gid, Relaxed);
        self.size.store(v.size, Relaxed);
        self.pages.store(pages_of(v.blocks), Relaxed);
        self.atime_s.store(v.atime.sec, Relaxed);
        self.atime_ns.store(v.atime.nsec, Relaxed);
        self.mtime_s.store(v.mtime.sec, Relaxed);
        self.mtime_ns.store(v.mtime.nsec, Relaxed);
        self.ctime_s.store(v.ctime.sec, Relaxed);
        self.ctime_ns.store(v.ctime.nsec, Relaxed);
    }

    /// A consistent snapshot, taken without writing. A reader that finds a writer inside
    /// spins briefly, then yields (the writer may have been preempted).
    #[inline]
    pub fn load(&self) -> AttrVals {
        let mut round = 0u32;
        loop {
            // Acquire: the field loads below cannot move above this load.
            let s1 = self.seq.load(Acquire);
            if s1 & 1 == 0 {
                let v = self.read_fields();
                // Acquire fence: the field loads above cannot move below the re-check.
                fence(Acquire);
                if self.seq.load(Relaxed) == s1 {
                    return v;
                }
            }
            round += 1;
            if round < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Mode, flags, owner and group, consistent with each other: what a permission check
    /// reads (a path walk makes one per component, so it reads three words, not all of
    /// them); the other fields are zero.
    #[inline]
    pub fn access_view(&self) -> AttrVals {
        let mut round = 0u32;
        loop {
            let s1 = self.seq.load(Acquire);
            if s1 & 1 == 0 {
                let mode = self.mode.load(Relaxed);
                let uid = self.uid.load(Relaxed);
                let gid = self.gid.load(Relaxed);
                fence(Acquire);
                if self.seq.load(Relaxed) == s1 {
                    let t = Timespec::default();
                    return AttrVals {
                        mode: mode & 0xFFFF,
                        flags: mode >> 16,
                        uid,
                        gid,
                        size: 0,
                        blocks: 0,
                        atime: t,
                        mtime: t,
                        ctime: t,
                    };
                }
            }
            round += 1;
            if round < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// The mode alone (type bits never change, so this needs no consistency with other fields).
    #[inline]
    pub fn mode(&self) -> u32 {
        self.mode.load(Relaxed) & 0xFFFF
    }

    /// The inode flags alone (one load; exact when the caller holds what orders their
    /// changes, or when none can happen: a dead inode's).
    #[inline]
    pub fn flags(&self) -> u32 {
        self.mode.load(Relaxed) >> 16
    }

    /// The size alone. Exact when the caller holds the file's data lock, which every size
    /// change also holds.
    #[inline]
    pub fn size(&self) -> u64 {
        self.size.load(Relaxed)
    }

    fn lock(&self, stats: &Stats) -> u32 {
        let mut spins = 0u32;
        let mut since: Option<Instant> = None;
        loop {
            let s = self.seq.load(Relaxed);
            if s & 1 == 0
                && self
                    .seq
                    .compare_exchange_weak(s, s | 1, Acquire, Relaxed)
                    .is_ok()
            {
                // Release fence: the odd sequence number is visible before any field store.
                fence(Release);
                match since {
                    None => stats.acquired_uncounted(LockClass::Attr),
                    Some(t) => {
                        stats.acquired_uncounted(LockClass::Attr);
                        stats.waited_ns(LockClass::Attr, t.elapsed().as_nanos() as u64);
                    }
                }
                return s;
            }
            since.get_or_insert_with(Instant::now);
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                // The writer was preempted: let it run.
                std::thread::yield_now();
            }
        }
    }

    /// Runs `f` on a copy of the values with readers excluded, and stores the copy back if `f`
    /// returns `Ok`. `f` must not block or take locks.
    pub fn update<R, E>(
        &self,
        stats: &Stats,
        f: impl FnOnce(&mut AttrVals) -> Result<R, E>,
    ) -> Result<R, E> {
        let s = self.lock(stats);
        let mut v = self.read_fields();
        let r = f(&mut v);
        if r.is_ok() {
            self.write_fields(&v);
        }
        // Release: every field store above is visible before the even sequence number.
        self.seq.store(s.wrapping_add(2), Release);
        r
    }

    /// Moves mtime and ctime to `t` (a directory whose entries changed; [`Timespec::advance`],
    /// so that changes that share no lock leave the latest of their times, in memory as after
    /// recovery), writing only when that changes the stored values: a burst of creates in one
    /// directory, all stamped with one tick of the coarse clock, stores once per tick.
    #[inline]
    pub fn set_mc(&self, t: Timespec, stats: &Stats) {
        // The times, read as the seqlock's readers do: a torn pair (one field of a store that
        // is under way) could look ahead of `t` and skip a store that was needed.
        let s1 = self.seq.load(Acquire);
        let cur_m = Timespec::new(self.mtime_s.load(Relaxed), self.mtime_ns.load(Relaxed));
        let cur_c = Timespec::new(self.ctime_s.load(Relaxed), self.ctime_ns.load(Relaxed));
        // Acquire fence: the field loads above cannot move below the re-check.
        fence(Acquire);
        let whole = s1 & 1 == 0 && self.seq.load(Relaxed) == s1;
        if whole && cur_m.advance(t) == cur_m && cur_c.advance(t) == cur_c {
            return;
        }
        let _ = self.update::<(), ()>(stats, |v| {
            effect::entries_changed(v, t);
            Ok(())
        });
    }

    /// Moves ctime to `t` (a status change: link count, rename, xattr; [`Timespec::advance`]).
    pub fn set_c(&self, t: Timespec, stats: &Stats) {
        let _ = self.update::<(), ()>(stats, |v| {
            effect::status_changed(v, t);
            Ok(())
        });
    }
}

fn pack_mode(v: &AttrVals) -> u32 {
    debug_assert!(v.mode <= 0xFFFF && v.flags <= 0xFFFF);
    v.flags << 16 | v.mode
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vals(x: u64) -> AttrVals {
        AttrVals {
            mode: x as u32 & 0xFFFF,
            flags: (x as u32 >> 3) & 0xFFFF,
            uid: x as u32,
            gid: x as u32,
            size: x,
            blocks: x * 8,
            atime: Timespec::new(x as i64, x as u32),
            mtime: Timespec::new(x as i64, x as u32),
            ctime: Timespec::new(x as i64, x as u32),
        }
    }

    #[test]
    fn readers_never_see_a_torn_snapshot() {
        // Writers store values whose fields all equal one number; a reader that saw a mix of two
        // writes would find fields that differ.
        let stats = Stats::default();
        let cell = AttrCell::new(vals(0));
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            for w in 0..2u64 {
                let (cell, stats, stop) = (&cell, &stats, &stop);
                s.spawn(move || {
                    let mut i = w;
                    while !stop.load(Relaxed) {
                        i += 2;
                        let _ = cell.update::<(), ()>(stats, |v| {
                            *v = vals(i % 1_000_000);
                            Ok(())
                        });
                    }
                });
            }
            for _ in 0..200_000 {
                let v = cell.load();
                assert_eq!(v, vals(v.size), "torn read");
                assert_eq!(v.mode, v.size as u32 & 0xFFFF);
            }
            stop.store(true, Relaxed);
        });
    }

    #[test]
    fn failed_update_changes_nothing() {
        let stats = Stats::default();
        let cell = AttrCell::new(vals(7));
        let r: Result<(), &str> = cell.update(&stats, |v| {
            v.size = 99;
            Err("no")
        });
        assert_eq!(r, Err("no"));
        assert_eq!(cell.load(), vals(7));
    }
}
