//! Reading one inode, or one directory's entries, from the checkpoint when the engine first
//! needs it: the store's side of a lazily loaded namespace (engine `fs/lazy.rs`; opening with
//! [`crate::Options::lazy`]).
//!
//! Each call reads in a read transaction of its own, through the page readers' slot of the
//! database (`pages.rs`: a read that meets a checkpoint reopening the file waits for the new
//! one), so it runs beside the checkpointer's writes and beside other threads' reads. What
//! it reads is the state the store was opened with: the engine loads an inode only if no
//! record since the opening touched it (a record reaches an inode through the engine's table,
//! which loads it first), so no later checkpoint changed it either.
//!
//! - An inode is its `i` key, its `x` range (xattrs, the two ACLs among them), and for a
//!   regular file its pages (`b` chunks of the `data` table: each page with bytes is one the
//!   engine reads when asked; an empty page is allocated zeros, as `load.rs` reads it) and its
//!   runs of zeros (`zeros` table). A directory's parent is read for its generation.
//! - A directory is its `d` range; the inodes its entries name are read in key order with
//!   one range over numbers close together (`load::inodes`), and those that are not
//!   directories are read whole, as above.

use lanefs::{FileType, Ino, InodeId, LoadedEntry, LoadedInode};
use redb::ReadTransaction;

use super::kv::{self, ACL_ACCESS, ACL_DEFAULT, EntryVal, InodeVal};
use super::load::inodes;
use super::{DATA, META, ZEROS};

/// Why a read of the checkpoint (an inode, a directory, pages: `pages.rs`) failed.
pub(super) enum ReadFailed {
    /// redb's error (the host's, or a panic): the database is to be reopened.
    Db(String),
    /// What was read is wrong (damage): reopening would read the same.
    Damaged(String),
}

type R<T> = Result<T, ReadFailed>;

fn db(e: impl std::fmt::Display) -> ReadFailed {
    ReadFailed::Db(e.to_string())
}

fn damaged(e: impl Into<String>) -> ReadFailed {
    ReadFailed::Damaged(e.into())
}

type Meta = redb::ReadOnlyTable<&'static [u8], &'static [u8]>;

/// The tables a read uses.
struct Tables {
    meta: Meta,
    data: Meta,
    /// `None`: a checkpoint of format 2, which has no `zeros` table.
    zeros: Option<Meta>,
}

impl Tables {
    fn open(txn: &ReadTransaction) -> R<Tables> {
        let zeros = match txn.open_table(ZEROS) {
            Ok(t) => Some(t),
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(db(e)),
        };
        Ok(Tables {
            meta: txn.open_table(META).map_err(db)?,
            data: txn.open_table(DATA).map_err(db)?,
            zeros,
        })
    }

    fn inode_val(&self, ino: u64) -> R<Option<InodeVal>> {
        let k = kv::ino_key(kv::INODE, ino);
        match self.meta.get(&k[..]).map_err(db)? {
            Some(v) => Ok(Some(
                InodeVal::decode(v.value()).map_err(|e| damaged(format!("inode {ino}: {e}")))?,
            )),
            None => Ok(None),
        }
    }

    /// Inode `ino`, whose value is `v`, whole.
    fn inode(&self, ino: u64, v: InodeVal) -> R<LoadedInode> {
        let mut l = LoadedInode {
            id: v.id(ino),
            mode: v.mode,
            uid: v.uid,
            gid: v.gid,
            nlink: v.nlink,
            rdev: v.rdev,
            size: v.size,
            atime: v.atime,
            mtime: v.mtime,
            ctime: v.ctime,
            btime: v.btime,
            flags: v.flags,
            target: Vec::new(),
            parent: InodeId::ROOT,
            xattrs: Vec::new(),
            access_acl: Vec::new(),
            default_acl: Vec::new(),
            pages: Vec::new(),
            zeros: Vec::new(),
        };
        if v.is_dir() && v.parent != ino {
            let p = self
                .inode_val(v.parent)?
                .ok_or_else(|| damaged(format!("directory {ino}: parent {} missing", v.parent)))?;
            l.parent = p.id(v.parent);
        } else if v.is_dir() {
            l.parent = l.id;
        }
        let (a, b) = (kv::ino_key(kv::XATTR, ino), kv::ino_key(kv::XATTR, ino + 1));
        for kvp in self.meta.range::<&[u8]>(&a[..]..&b[..]).map_err(db)? {
            let (k, val) = kvp.map_err(db)?;
            let (_, name) =
                kv::split_key(k.value()).ok_or_else(|| damaged("xattr key too short"))?;
            let val = val.value().to_vec();
            match name {
                ACL_ACCESS => l.access_acl = val,
                ACL_DEFAULT => l.default_acl = val,
                _ => l.xattrs.push((name.to_vec(), val)),
            }
        }
        if v.is_file() {
            self.pages(&mut l)?;
        }
        l.target = v.target;
        Ok(l)
    }

    /// File `l`'s pages and runs of zeros (as `load::load_pages` reads them).
    fn pages(&self, l: &mut LoadedInode) -> R<()> {
        let ino = l.id.ino.0;
        let (a, b) = (kv::chunk_key(ino, 0), kv::ino_key(kv::PAGE_TAG, ino + 1));
        for kvp in self.data.range::<&[u8]>(&a[..]..&b[..]).map_err(db)? {
            let (k, c) = kvp.map_err(db)?;
            let chunk = kv::chunk_of(k.value()).ok_or_else(|| damaged("page key too short"))?;
            let c = kv::Chunk::decode(c.value()).map_err(|e| {
                damaged(format!(
                    "file {}: pages from {}: {e}",
                    l.id,
                    chunk * kv::CHUNK
                ))
            })?;
            for (page, bytes) in c.pages(chunk) {
                if bytes.is_empty() {
                    kv::push_zero_page(&mut l.zeros, page);
                } else {
                    l.pages.push(page);
                }
            }
        }
        if let Some(z) = &self.zeros {
            let (a, b) = (kv::zeros_key(ino, 0), kv::ino_key(kv::ZEROS_TAG, ino + 1));
            for kvp in z.range::<&[u8]>(&a[..]..&b[..]).map_err(db)? {
                let (k, r) = kvp.map_err(db)?;
                let run = kv::run_of(k.value(), r.value())
                    .map_err(|e| damaged(format!("file {}: {e}", l.id)))?;
                l.zeros.push(run);
            }
        }
        Ok(())
    }
}

/// Inode `ino` as the checkpoint read by `txn` holds it (`None`: it holds none).
pub(super) fn inode(txn: &ReadTransaction, ino: Ino) -> R<Option<LoadedInode>> {
    let t = Tables::open(txn)?;
    match t.inode_val(ino.0)? {
        Some(v) => t.inode(ino.0, v).map(Some),
        None => Ok(None),
    }
}

/// Directory `dir`'s entries as the checkpoint read by `txn` holds them, each with its
/// target's type, and, if there are at most `files` entries, with its inode unless that is
/// a directory.
pub(super) fn entries(txn: &ReadTransaction, dir: Ino, files: u64) -> R<Vec<LoadedEntry>> {
    let t = Tables::open(txn)?;
    let mut read = Vec::new();
    let (a, b) = (
        kv::ino_key(kv::ENTRY, dir.0),
        kv::ino_key(kv::ENTRY, dir.0 + 1),
    );
    for kvp in t.meta.range::<&[u8]>(&a[..]..&b[..]).map_err(db)? {
        let (k, v) = kvp.map_err(db)?;
        let (_, name) = kv::split_key(k.value()).ok_or_else(|| damaged("entry key too short"))?;
        let e = EntryVal::decode(v.value()).map_err(|e| {
            damaged(format!(
                "entry {dir}/{}: {e}",
                String::from_utf8_lossy(name)
            ))
        })?;
        read.push((name.to_vec(), e));
    }
    // Each entry's type is its inode's: the inodes' values are read in one ascending walk
    // (a directory's files mostly have neighbouring numbers); the files' xattrs, pages and
    // runs only if they are asked for.
    let with_files = read.len() as u64 <= files;
    let mut want: Vec<u64> = read.iter().map(|(_, e)| e.target.ino.0).collect();
    want.sort_unstable();
    want.dedup();
    let found = inodes(&t.meta, &want).map_err(damaged)?;
    let mut out = Vec::with_capacity(read.len());
    for (name, e) in read {
        let ino = e.target.ino.0;
        let shown = || String::from_utf8_lossy(&name).into_owned();
        let v = match found.binary_search_by_key(&ino, |(i, _)| *i) {
            Ok(i) => &found[i].1,
            Err(_) => {
                return Err(damaged(format!(
                    "entry {dir}/{}: inode {ino} is named but missing",
                    shown()
                )));
            }
        };
        if v.generation != e.target.generation.0 {
            return Err(damaged(format!(
                "entry {dir}/{}: names generation {}, the inode has {}",
                shown(),
                e.target.generation,
                v.generation
            )));
        }
        let kind = FileType::from_mode(v.mode).ok_or_else(|| {
            damaged(format!(
                "entry {dir}/{}: inode {ino} has mode {:#o}",
                shown(),
                v.mode
            ))
        })?;
        let inode = if with_files && kind != FileType::Directory {
            Some(t.inode(ino, v.clone())?)
        } else {
            None
        };
        out.push(LoadedEntry {
            name,
            cookie: e.cookie,
            target: e.target,
            kind,
            inode,
        });
    }
    Ok(out)
}

/// The highest inode number the checkpoint read by `txn` holds (1, the root's, if none).
pub(super) fn max_ino(txn: &ReadTransaction) -> Result<u64, String> {
    let meta = txn.open_table(META).map_err(|e| e.to_string())?;
    let (a, b) = (kv::ino_key(kv::INODE, 0), kv::ino_key(kv::INODE, u64::MAX));
    let last = meta
        .range::<&[u8]>(&a[..]..=&b[..])
        .map_err(|e| e.to_string())?
        .next_back();
    match last {
        None => Ok(1),
        Some(kvp) => {
            let (k, _) = kvp.map_err(|e| e.to_string())?;
            let (ino, _) = kv::split_key(k.value()).ok_or("inode key too short")?;
            Ok(ino.max(1))
        }
    }
}

/// The orphans that are directories in the checkpoint read by `txn`: a lazy opening makes
/// them again through records (`load::begin_lazy`), which count them, so the counts it gives
/// the engine leave them out. (The other orphans are loaded, which counts nothing.)
pub(super) fn orphan_dirs(txn: &ReadTransaction) -> Result<u64, String> {
    let t = Tables::open(txn).map_err(|e| match e {
        ReadFailed::Db(e) | ReadFailed::Damaged(e) => e,
    })?;
    let mut dirs = 0;
    let (a, b) = (
        kv::ino_key(kv::ORPHAN, 0),
        kv::ino_key(kv::ORPHAN, u64::MAX),
    );
    for kvp in t
        .meta
        .range::<&[u8]>(&a[..]..=&b[..])
        .map_err(|e| e.to_string())?
    {
        let (k, _) = kvp.map_err(|e| e.to_string())?;
        let (ino, _) = kv::split_key(k.value()).ok_or("orphan key too short")?;
        let v = t.inode_val(ino).map_err(|e| match e {
            ReadFailed::Db(e) | ReadFailed::Damaged(e) => e,
        })?;
        dirs += u64::from(v.is_some_and(|v| v.is_dir()));
    }
    Ok(dirs)
}
