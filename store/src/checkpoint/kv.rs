//! The checkpoint's keys and values (docs/STORE.md, "The checkpoint", is the specification).
//!
//! Every key starts with a one-byte tag and numbers are big-endian, so that one inode, one
//! entry, one directory's entries, one inode's xattrs and one file's pages are each a key
//! or a key range, in the order a scan wants them, and the same keys could live in any
//! ordered key-value store (a distributed one included) unchanged:
//!
//! | key | value | table |
//! |---|---|---|
//! | `s` | the superblock ([`Superblock`]) | `meta` |
//! | `i` ino | an inode ([`InodeVal`]) | `meta` |
//! | `d` parent name | an entry ([`EntryVal`]) | `meta` |
//! | `x` ino name | an xattr's value (ACLs are the xattrs `system.posix_acl_*`) | `meta` |
//! | `o` ino | empty: the inode has no name but was not freed (an orphan: open when its last name went, or an `O_TMPFILE` file not named yet) | `meta` |
//! | `c` lane | the highest readdir cookie of that lane (its top 16 bits) ever handed out | `meta` |
//! | `b` ino chunk | pages `chunk * 15 ..` of the file ([`Chunk`]) | `data` |
//! | `z` ino first | a run of allocated pages of zeros from page `first`: the page after its last (u64) | `zeros` |
//!
//! Values are little-endian and fixed-layout; a value that does not decode is damage, which
//! the caller reports with the key it was found under.

use lanefs::{Generation, Ino, InodeId, Timespec};

use crate::layout::{U16, U32, U64, put, store_id_at, u32_at, u64_at};

/// The superblock key.
pub(crate) const SUPER: &[u8] = b"s";
/// Tags.
pub(crate) const INODE: u8 = b'i';
pub(crate) const ENTRY: u8 = b'd';
pub(crate) const XATTR: u8 = b'x';
pub(crate) const ORPHAN: u8 = b'o';
pub(crate) const PAGE_TAG: u8 = b'b';
pub(crate) const COOKIE: u8 = b'c';
pub(crate) const ZEROS_TAG: u8 = b'z';

/// The xattr names POSIX ACLs are kept under.
pub(crate) const ACL_ACCESS: &[u8] = b"system.posix_acl_access";
pub(crate) const ACL_DEFAULT: &[u8] = b"system.posix_acl_default";

const SUPER_MAGIC: [u8; 8] = *b"LFSCKPT1";

/// Where a superblock's fields are (docs/STORE.md, "Checkpoints"; `layout.rs`).
mod super_at {
    use crate::layout::{STORE_ID as ID, U32, U64};

    pub(super) const MAGIC: usize = 0;
    pub(super) const VERSION: usize = MAGIC + super::SUPER_MAGIC.len();
    pub(super) const STORE_ID: usize = VERSION + U32;
    pub(super) const LSN: usize = STORE_ID + ID;
    pub(super) const MAX_GENERATION: usize = LSN + U64;
    pub(super) const RECORDS: usize = MAX_GENERATION + U64;
    /// The superblock's length up to format 4.
    pub(super) const END_4: usize = RECORDS + U64;
    /// From format 5: inodes and pages in use ([`super::Counts`]; all ones: unknown).
    pub(super) const INODES: usize = END_4;
    pub(super) const PAGES: usize = INODES + U64;
    /// The superblock's length.
    pub(super) const END: usize = PAGES + U64;
}

/// Length of an encoded superblock.
const SUPER_LEN: usize = super_at::END;
/// The checkpoint format version: 3 added the `zeros` table (runs of allocated zeros), 4 the
/// birth time of an inode value (flagged by `HAS_BTIME`, so values with and without one
/// mix), 5 the counts of inodes and pages in the superblock. A checkpoint of version 2 has no
/// runs, and reads as one of version 3 that has none; one of version 3 reads as one of
/// version 4 whose inodes have no birth time kept; one of version 4 or older has no counts
/// (such a store opens whole, and its next checkpoint writes them); the first checkpoint
/// written over any of them makes it version 5 (an older lanefs refuses it then).
pub(crate) const VERSION: u32 = 5;
/// The oldest checkpoint format this lanefs reads.
const OLDEST: u32 = 2;

/// Where a key's parts are (`layout.rs`): its tag, then an inode number (big-endian, so
/// that keys sort by it), then the rest (a name, or a number of pages).
pub(crate) mod key_at {
    use crate::layout::U64;

    pub(crate) const TAG: usize = 0;
    pub(crate) const INO: usize = TAG + 1;
    pub(crate) const REST: usize = INO + U64;
}

/// The length of a key of a tag and an inode number.
const INO_KEY: usize = key_at::REST;
/// The length of a key of a tag, an inode number and a page number.
const PAGE_KEY: usize = key_at::REST + U64;

/// `tag ++ ino`.
pub(crate) fn ino_key(tag: u8, ino: u64) -> [u8; INO_KEY] {
    let mut k = [0u8; INO_KEY];
    k[key_at::TAG] = tag;
    put(&mut k, key_at::INO, &ino.to_be_bytes());
    k
}

/// `tag ++ ino ++ name` (an entry of directory `ino`, or an xattr of inode `ino`).
pub(crate) fn named_key(tag: u8, ino: u64, name: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(INO_KEY + name.len());
    k.extend_from_slice(&ino_key(tag, ino));
    k.extend_from_slice(name);
    k
}

/// Pages of file data per value of the `data` table. A value of one 4 KiB page does not fit
/// a 4 KiB redb page beside its key and the page's header, so redb gives each such value an
/// 8 KiB page, half of it empty; fifteen pages and their lengths fit one 64 KiB page with
/// 4 KiB to spare (docs/STORE.md, "Checkpoints").
pub(crate) const CHUNK: u64 = 15;

/// `b ++ ino ++ chunk`: pages `chunk * CHUNK .. (chunk + 1) * CHUNK` of file `ino`.
pub(crate) fn chunk_key(ino: u64, chunk: u64) -> [u8; PAGE_KEY] {
    let mut k = [0u8; PAGE_KEY];
    k[key_at::TAG] = PAGE_TAG;
    put(&mut k, key_at::INO, &ino.to_be_bytes());
    put(&mut k, key_at::REST, &chunk.to_be_bytes());
    k
}

/// The chunk of page `page`, and the page's place in it.
pub(crate) fn chunk_at(page: u64) -> (u64, usize) {
    (page / CHUNK, (page % CHUNK) as usize)
}

/// The pages of one chunk as the `data` table keeps them: a 16-bit mask (little-endian; bit
/// `i` set: page `i` of the chunk exists, bit 15 never set), then, for each page that exists
/// in order, its length (u16 LE, at most 4096) and its bytes with trailing zeros cut (none:
/// an allocated page of zeros). A page that does not exist is a hole; a chunk with no page
/// is not stored.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Chunk {
    pages: [Option<Vec<u8>>; CHUNK as usize],
}

impl Chunk {
    /// Page `i`'s bytes (trailing zeros cut), or `None` for a hole.
    /// The pages this chunk (number `chunk`) holds, in order: each page's number and bytes
    /// (empty: a page of zeros, which a file holds as allocated zeros).
    pub(crate) fn pages(&self, chunk: u64) -> impl Iterator<Item = (u64, &[u8])> + '_ {
        (0..CHUNK).filter_map(move |i| self.get(i as usize).map(|b| (chunk * CHUNK + i, b)))
    }

    pub(crate) fn get(&self, i: usize) -> Option<&[u8]> {
        self.pages[i].as_deref()
    }

    /// Makes page `i` hold `bytes` (stored with its trailing zeros cut).
    pub(crate) fn put(&mut self, i: usize, bytes: &[u8]) {
        let t = trim(bytes);
        match &mut self.pages[i] {
            Some(p) => {
                p.clear();
                p.extend_from_slice(t);
            }
            none => *none = Some(t.to_vec()),
        }
    }

    /// Makes page `i` a hole.
    pub(crate) fn remove(&mut self, i: usize) {
        self.pages[i] = None;
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.pages.iter().all(Option::is_none)
    }

    /// The mask of an encoded chunk (bit `i`: page `i` exists), without its pages.
    pub(crate) fn mask_of(b: &[u8]) -> Result<u16, String> {
        let m = b
            .get(..U16)
            .map(|x| u16::from_le_bytes([x[0], x[1]]))
            .ok_or("a chunk of pages cut short")?;
        if m >> CHUNK != 0 {
            return Err(format!("a chunk of pages with mask {m:#06x}"));
        }
        Ok(m)
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let len: usize = self.pages.iter().flatten().map(|p| U16 + p.len()).sum();
        let mut b = Vec::with_capacity(U16 + len);
        let mask = (0..CHUNK as usize)
            .filter(|&i| self.pages[i].is_some())
            .fold(0u16, |m, i| m | 1 << i);
        b.extend_from_slice(&mask.to_le_bytes());
        for p in self.pages.iter().flatten() {
            b.extend_from_slice(&(p.len() as u16).to_le_bytes());
            b.extend_from_slice(p);
        }
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Chunk, String> {
        let u16_at = |at: usize| -> Result<usize, String> {
            b.get(at..at + U16)
                .map(|x| u16::from_le_bytes([x[0], x[1]]) as usize)
                .ok_or_else(|| format!("a chunk of pages cut short at byte {at} of {}", b.len()))
        };
        let mask = u16_at(0)?;
        if mask >> CHUNK != 0 {
            return Err(format!("a chunk of pages with mask {mask:#06x}"));
        }
        let mut c = Chunk::default();
        let mut at = U16;
        for i in (0..CHUNK as usize).filter(|i| mask & 1 << i != 0) {
            let len = u16_at(at)?;
            if len > 4096 {
                return Err(format!("page {i} of a chunk holds {len} bytes"));
            }
            let bytes = b.get(at + U16..at + U16 + len).ok_or_else(|| {
                format!(
                    "a chunk of pages cut short at byte {} of {}",
                    at + U16,
                    b.len()
                )
            })?;
            c.pages[i] = Some(bytes.to_vec());
            at += U16 + len;
        }
        if at != b.len() {
            return Err(format!(
                "a chunk of pages with {} bytes after its last page",
                b.len() - at
            ));
        }
        Ok(c)
    }
}

/// `z ++ ino ++ first`: the run of allocated pages of zeros of file `ino` that starts at
/// page `first` (docs/STORE.md, "Checkpoints"). Its value is the page after its last.
pub(crate) fn zeros_key(ino: u64, first: u64) -> [u8; PAGE_KEY] {
    let mut k = chunk_key(ino, first);
    k[key_at::TAG] = ZEROS_TAG;
    k
}

/// The run a `zeros` key and value hold: its first page and the page after its last.
pub(crate) fn run_of(k: &[u8], v: &[u8]) -> Result<(u64, u64), String> {
    let first = chunk_of(k).ok_or("a run key too short")?;
    let end: [u8; 8] = v
        .try_into()
        .map_err(|_| format!("a run value of {} bytes, 8 expected", v.len()))?;
    let end = u64::from_le_bytes(end);
    if end <= first {
        return Err(format!("a run of zeros from page {first} to {end}"));
    }
    Ok((first, end))
}

/// Adds page `page`, past every page in `runs`, to those runs of zeros: the last run grows
/// if the page follows it.
pub(crate) fn push_zero_page(runs: &mut Vec<(u64, u64)>, page: u64) {
    match runs.last_mut() {
        Some((_, end)) if *end == page => *end += 1,
        _ => runs.push((page, page + 1)),
    }
}

/// The inode number and the rest of a key `tag ++ ino ++ rest`.
pub(crate) fn split_key(k: &[u8]) -> Option<(u64, &[u8])> {
    let ino = u64::from_be_bytes(k.get(key_at::INO..key_at::REST)?.try_into().ok()?);
    Some((ino, &k[key_at::REST..]))
}

/// The chunk number of a `data` key.
pub(crate) fn chunk_of(k: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(
        k.get(key_at::REST..PAGE_KEY)?.try_into().ok()?,
    ))
}

/// The checkpoint's own record: which journal records it holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Superblock {
    /// The store's id (the identity file's).
    pub uuid: [u8; 16],
    /// Every journal record up to this LSN is in the checkpoint (0: none).
    pub lsn: u64,
    /// The highest generation any inode had, freed ones included.
    pub max_generation: u64,
    /// Records applied over the checkpoint's life.
    pub records: u64,
    /// What the checkpoint holds, counted (`None`: not known, a checkpoint of format 4 or
    /// older, or one whose counts went wrong).
    pub counts: Option<Counts>,
}

/// Inodes and pages a checkpoint holds: what `statfs` and the filesystem's limits count, so
/// that a store opened lazily knows them without reading every inode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Inodes (`i` keys), orphans included.
    pub inodes: u64,
    /// Pages of file data: pages the `data` table's chunks hold (empty ones too) and pages
    /// in runs of zeros.
    pub pages: u64,
}

impl Counts {
    /// These counts changed by `inodes` and `pages`; `None` if that goes below zero (they
    /// were wrong).
    pub(crate) fn plus(self, inodes: i64, pages: i64) -> Option<Counts> {
        Some(Counts {
            inodes: self.inodes.checked_add_signed(inodes)?,
            pages: self.pages.checked_add_signed(pages)?,
        })
    }
}

impl Superblock {
    pub(crate) fn encode(&self) -> Vec<u8> {
        use super_at as at;
        let mut b = vec![0; SUPER_LEN];
        put(&mut b, at::MAGIC, &SUPER_MAGIC);
        put(&mut b, at::VERSION, &VERSION.to_le_bytes());
        put(&mut b, at::STORE_ID, &self.uuid);
        put(&mut b, at::LSN, &self.lsn.to_le_bytes());
        put(
            &mut b,
            at::MAX_GENERATION,
            &self.max_generation.to_le_bytes(),
        );
        put(&mut b, at::RECORDS, &self.records.to_le_bytes());
        let c = self.counts.unwrap_or(Counts {
            inodes: u64::MAX,
            pages: u64::MAX,
        });
        put(&mut b, at::INODES, &c.inodes.to_le_bytes());
        put(&mut b, at::PAGES, &c.pages.to_le_bytes());
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Superblock, String> {
        use super_at as at;
        if b.len() < at::END_4 || b[at::MAGIC..at::VERSION] != SUPER_MAGIC {
            return Err("not a lanefs checkpoint superblock".into());
        }
        let version = u32_at(b, at::VERSION);
        if !(OLDEST..=VERSION).contains(&version) {
            return Err(format!(
                "checkpoint format {version}, this lanefs reads {OLDEST} to {VERSION}"
            ));
        }
        let len = if version < 5 { at::END_4 } else { SUPER_LEN };
        if b.len() != len {
            return Err(format!(
                "a superblock of format {version} of {} bytes, not {len}",
                b.len()
            ));
        }
        let counts = (version >= 5)
            .then(|| Counts {
                inodes: u64_at(b, at::INODES),
                pages: u64_at(b, at::PAGES),
            })
            .filter(|c| c.inodes != u64::MAX);
        Ok(Superblock {
            uuid: store_id_at(b, at::STORE_ID),
            lsn: u64_at(b, at::LSN),
            max_generation: u64_at(b, at::MAX_GENERATION),
            records: u64_at(b, at::RECORDS),
            counts,
        })
    }
}

/// An inode as the checkpoint keeps it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct InodeVal {
    pub generation: u64,
    /// Type and permission bits.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub rdev: u64,
    pub size: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    /// The inode flags a user sets (`FS_IMMUTABLE_FL` and the others of `SetFlags`).
    pub flags: u32,
    /// A directory's parent (0 for other inodes).
    pub parent: u64,
    /// When the inode was made (`None`: an inode kept by a checkpoint of format 3 or older).
    pub btime: Option<Timespec>,
    /// A symlink's target.
    pub target: Vec<u8>,
}

/// The inode flags a user sets (what `SetFlags` carries), the ones an inode value keeps.
pub(crate) const USER_FLAGS: u32 =
    lanefs::FS_IMMUTABLE_FL | lanefs::FS_APPEND_FL | lanefs::FS_NODUMP_FL | lanefs::FS_NOATIME_FL;

/// The bit of an inode value's flags that says a birth time follows the parent (no inode
/// flag a user sets has it).
const HAS_BTIME: u32 = 1 << 31;
const _: () = assert!(USER_FLAGS & HAS_BTIME == 0);

/// Bytes of a time: seconds (i64) and nanoseconds (u32).
const TIME: usize = U64 + U32;

/// Where an inode value's fields are (docs/STORE.md, "Checkpoints"; `layout.rs`).
mod inode_at {
    use super::TIME;
    use crate::layout::{U32, U64};

    pub(super) const GENERATION: usize = 0;
    pub(super) const MODE: usize = GENERATION + U64;
    pub(super) const UID: usize = MODE + U32;
    pub(super) const GID: usize = UID + U32;
    pub(super) const NLINK: usize = GID + U32;
    pub(super) const RDEV: usize = NLINK + U32;
    pub(super) const SIZE: usize = RDEV + U64;
    pub(super) const ATIME: usize = SIZE + U64;
    pub(super) const MTIME: usize = ATIME + TIME;
    pub(super) const CTIME: usize = MTIME + TIME;
    pub(super) const FLAGS: usize = CTIME + TIME;
    pub(super) const PARENT: usize = FLAGS + U32;
    /// A symlink's target: the rest of the value, unless the flags have `HAS_BTIME`.
    pub(super) const TARGET: usize = PARENT + U64;
    /// With `HAS_BTIME`: the birth time, and the target after it.
    pub(super) const BTIME: usize = PARENT + U64;
    pub(super) const BTIME_TARGET: usize = BTIME + TIME;
}

/// The length of an inode value before its symlink target.
const INODE_FIXED: usize = inode_at::TARGET;

fn put_time(b: &mut Vec<u8>, t: Timespec) {
    b.extend_from_slice(&t.sec.to_le_bytes());
    b.extend_from_slice(&t.nsec.to_le_bytes());
}

// What records do to an inode's attributes is the engine's (`lanefs::effect`), applied to
// this value as to a live inode's.
lanefs::impl_attributes!(InodeVal);

impl InodeVal {
    pub(crate) fn id(&self, ino: u64) -> InodeId {
        InodeId {
            ino: Ino(ino),
            generation: Generation(self.generation),
        }
    }

    pub(crate) fn is_dir(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }

    pub(crate) fn is_file(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFREG
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(INODE_FIXED + self.target.len());
        b.extend_from_slice(&self.generation.to_le_bytes());
        for v in [self.mode, self.uid, self.gid, self.nlink] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&self.rdev.to_le_bytes());
        b.extend_from_slice(&self.size.to_le_bytes());
        for t in [self.atime, self.mtime, self.ctime] {
            put_time(&mut b, t);
        }
        let has_btime = match self.btime {
            Some(_) => HAS_BTIME,
            None => 0,
        };
        b.extend_from_slice(&((self.flags & !HAS_BTIME) | has_btime).to_le_bytes());
        b.extend_from_slice(&self.parent.to_le_bytes());
        if let Some(t) = self.btime {
            put_time(&mut b, t);
        }
        b.extend_from_slice(&self.target);
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Result<InodeVal, String> {
        if b.len() < INODE_FIXED {
            return Err(format!(
                "inode value of {} bytes, at least {INODE_FIXED} expected",
                b.len()
            ));
        }
        use inode_at as at;
        let time_at = |at: usize| Timespec {
            sec: u64_at(b, at) as i64,
            nsec: u32_at(b, at + U64),
        };
        let flags = u32_at(b, at::FLAGS);
        let (btime, target) = match flags & HAS_BTIME {
            0 => (None, at::TARGET),
            _ if b.len() < at::BTIME_TARGET => {
                return Err(format!(
                    "inode value of {} bytes with a birth time, at least {} expected",
                    b.len(),
                    at::BTIME_TARGET
                ));
            }
            _ => (Some(time_at(at::BTIME)), at::BTIME_TARGET),
        };
        let v = InodeVal {
            generation: u64_at(b, at::GENERATION),
            mode: u32_at(b, at::MODE),
            uid: u32_at(b, at::UID),
            gid: u32_at(b, at::GID),
            nlink: u32_at(b, at::NLINK),
            rdev: u64_at(b, at::RDEV),
            size: u64_at(b, at::SIZE),
            atime: time_at(at::ATIME),
            mtime: time_at(at::MTIME),
            ctime: time_at(at::CTIME),
            flags: flags & !HAS_BTIME,
            parent: u64_at(b, at::PARENT),
            btime,
            target: b[target..].to_vec(),
        };
        if lanefs::FileType::from_mode(v.mode).is_none() {
            return Err(format!("inode value with mode {:o}", v.mode));
        }
        Ok(v)
    }
}

/// A directory entry as the checkpoint keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EntryVal {
    pub target: InodeId,
    pub cookie: u64,
}

/// Where an entry value's fields are (docs/STORE.md, "Checkpoints"; `layout.rs`).
mod entry_at {
    use crate::layout::U64;

    pub(super) const INO: usize = 0;
    pub(super) const GENERATION: usize = INO + U64;
    pub(super) const COOKIE: usize = GENERATION + U64;
    /// The value's length.
    pub(super) const END: usize = COOKIE + U64;
}

/// The length of an entry value.
const ENTRY_LEN: usize = entry_at::END;

impl EntryVal {
    pub(crate) fn encode(&self) -> [u8; ENTRY_LEN] {
        use entry_at as at;
        let mut b = [0u8; ENTRY_LEN];
        put(&mut b, at::INO, &self.target.ino.0.to_le_bytes());
        put(
            &mut b,
            at::GENERATION,
            &self.target.generation.0.to_le_bytes(),
        );
        put(&mut b, at::COOKIE, &self.cookie.to_le_bytes());
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Result<EntryVal, String> {
        use entry_at as at;
        if b.len() != ENTRY_LEN {
            return Err(format!(
                "entry value of {} bytes, {ENTRY_LEN} expected",
                b.len()
            ));
        }
        Ok(EntryVal {
            target: InodeId {
                ino: Ino(u64_at(b, at::INO)),
                generation: Generation(u64_at(b, at::GENERATION)),
            },
            cookie: u64_at(b, at::COOKIE),
        })
    }
}

/// A page's bytes as stored: trailing zeros cut.
pub(crate) fn trim(page: &[u8]) -> &[u8] {
    // Eight bytes at a time from the end (a page of zeros is common: `dd if=/dev/zero`),
    // then the bytes of the last word that is not zero.
    let words = page.len() / 8;
    let mut end = page.len();
    if page[words * 8..].iter().all(|&b| b == 0) {
        end = words * 8;
        while end > 0 && u64::from_ne_bytes(page[end - 8..end].try_into().expect("8 bytes")) == 0 {
            end -= 8;
        }
    }
    let end = page[..end]
        .iter()
        .rposition(|&b| b != 0)
        .map_or(0, |p| p + 1);
    &page[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip() {
        let t = |s, n| Timespec { sec: s, nsec: n };
        let v = InodeVal {
            generation: 7,
            mode: libc::S_IFLNK | 0o777,
            uid: 1000,
            gid: 100,
            nlink: 1,
            rdev: 0,
            size: 3,
            atime: t(-5, 1),
            mtime: t(1_700_000_000, 999_999_999),
            ctime: t(0, 0),
            flags: lanefs::FS_NODUMP_FL,
            parent: 0,
            btime: None,
            target: b"a/b".to_vec(),
        };
        assert_eq!(InodeVal::decode(&v.encode()).unwrap(), v);
        assert!(InodeVal::decode(&v.encode()[..50]).is_err());
        // With a birth time: the target after it, the flags as they were.
        let born = InodeVal {
            btime: Some(t(1_600_000_000, 123)),
            ..v.clone()
        };
        let b = born.encode();
        assert_eq!(b.len(), v.encode().len() + TIME);
        assert_eq!(InodeVal::decode(&b).unwrap(), born);
        assert!(InodeVal::decode(&b[..inode_at::BTIME_TARGET - 1]).is_err());
        // A value of format 3 (no birth time) is read as one without.
        assert_eq!(InodeVal::decode(&v.encode()).unwrap().btime, None);
        let e = EntryVal {
            target: v.id(42),
            cookie: 9,
        };
        assert_eq!(EntryVal::decode(&e.encode()).unwrap(), e);
        let s = Superblock {
            uuid: [3; 16],
            lsn: 12,
            max_generation: 99,
            records: 5,
            counts: Some(Counts {
                inodes: 7,
                pages: 1 << 40,
            }),
        };
        assert_eq!(Superblock::decode(&s.encode()).unwrap(), s);
        let unknown = Superblock { counts: None, ..s };
        assert_eq!(Superblock::decode(&unknown.encode()).unwrap(), unknown);
        let mut bad = s.encode();
        bad[8] = 1;
        assert!(
            Superblock::decode(&bad)
                .unwrap_err()
                .contains("format 1, this lanefs reads 2 to 5")
        );
        // Formats 2 to 4: the shorter superblock, without counts.
        for v in 2..=4 {
            bad[8] = v;
            assert!(Superblock::decode(&bad).is_err(), "format {v} is shorter");
            let old = Superblock::decode(&bad[..super_at::END_4]).unwrap();
            assert_eq!(old, unknown, "format {v} is read too");
        }
        bad[8] = 5;
        assert!(Superblock::decode(&bad[..super_at::END_4]).is_err());
        bad[8] = 6;
        assert!(Superblock::decode(&bad).is_err());
        assert_eq!(run_of(&zeros_key(3, 7), &9u64.to_le_bytes()), Ok((7, 9)));
        assert!(run_of(&zeros_key(3, 7), &7u64.to_le_bytes()).is_err());
        assert!(run_of(&zeros_key(3, 7), &[1]).is_err());
        assert!(zeros_key(3, u64::MAX) < zeros_key(4, 0));
    }

    #[test]
    fn keys_sort_by_tag_then_number_then_name() {
        let a = named_key(ENTRY, 2, b"zz");
        let b = named_key(ENTRY, 10, b"a");
        assert!(a < b, "parent 2's entries come before parent 10's");
        assert_eq!(split_key(&b), Some((10, &b"a"[..])));
        assert!(chunk_key(5, 1) < chunk_key(5, 256));
        assert!(chunk_key(5, u64::MAX)[..] < ino_key(PAGE_TAG, 6)[..]);
        assert_eq!(chunk_of(&chunk_key(5, 256)), Some(256));
        assert_eq!(chunk_at(31), (2, 1));
        assert_eq!(trim(b"ab\0\0"), b"ab");
        assert_eq!(trim(b"\0\0"), b"");
    }

    #[test]
    fn chunks_round_trip_and_refuse_damage() {
        let mut c = Chunk::default();
        assert!(c.is_empty());
        assert_eq!(c.encode(), [0, 0]);
        c.put(0, &[7; 4096]);
        c.put(3, &[0; 4096]);
        c.put(14, b"ab\0\0");
        assert_eq!(c.get(3), Some(&b""[..]), "a page of zeros exists, empty");
        assert_eq!(c.get(14), Some(&b"ab"[..]));
        assert_eq!(c.get(1), None, "a hole");
        let e = c.encode();
        assert_eq!(e.len(), 2 + (2 + 4096) + 2 + (2 + 2));
        assert_eq!(e[..2], (1u16 | 1 << 3 | 1 << 14).to_le_bytes());
        assert_eq!(Chunk::decode(&e).unwrap(), c);
        // A full chunk, its key and redb's leaf header fit one 64 KiB page.
        let mut full = Chunk::default();
        (0..CHUNK as usize).for_each(|i| full.put(i, &[1; 4096]));
        assert!(full.encode().len() + 17 + 64 <= 65536);
        c.remove(0);
        c.remove(3);
        c.remove(14);
        assert!(c.is_empty());
        for cut in 0..e.len() {
            assert!(Chunk::decode(&e[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = e.clone();
        long.push(0);
        assert!(
            Chunk::decode(&long)
                .unwrap_err()
                .contains("after its last page")
        );
        let mut bits = e.clone();
        bits[1] |= 0x80;
        assert!(Chunk::decode(&bits).unwrap_err().contains("mask"));
        let mut big = vec![1, 0];
        big.extend_from_slice(&4097u16.to_le_bytes());
        big.extend_from_slice(&[1; 4097]);
        assert!(Chunk::decode(&big).unwrap_err().contains("4097 bytes"));
    }

    #[test]
    fn trim_cuts_exactly_the_trailing_zeros_at_every_length_and_position() {
        for len in [0, 1, 7, 8, 9, 15, 16, 17, 4096] {
            assert_eq!(trim(&vec![0u8; len]), b"", "{len} zeros");
            for last in 0..len.min(40) {
                let mut p = vec![0u8; len];
                p[last] = 1;
                assert_eq!(trim(&p).len(), last + 1, "len {len}, last {last}");
                let at = len - 1 - last;
                let mut p = vec![0u8; len];
                p[at] = 9;
                p[0] = 3;
                assert_eq!(trim(&p).len(), at + 1, "len {len}, last {at}");
            }
        }
    }
}
