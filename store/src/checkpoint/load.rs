//! Loading a checkpoint into a filesystem being recovered: the keys become records that
//! the engine's recovery applies like any other (so a loaded filesystem passes the same
//! checks as a replayed one), in an order that gives every inode exactly its kept state:
//!
//! 1. the root (`Root`);
//! 2. the tree, directory by directory from the root: each entry is a `Create` of its inode
//!    the first time the inode is met, a `Link` after that; then the orphans
//!    (`Recovery::orphan`: made and unnamed again, after the tree so that the fresh cookie
//!    of their passing name cannot be one a live entry holds);
//! 3. every inode in number order: its pages (each one left in the checkpoint, which the
//!    engine reads when asked for it: `Recovery::kept_page`; the size is set after the
//!    pages within it and before those beyond it; then its runs of allocated zeros,
//!    `Recovery::kept_zeros`, which cost no memory: the `zeros` table's, and its empty
//!    pages), its xattrs and ACLs (`SetXattr`, `SetAcl`), its mode, owner and times (`SetAttr`),
//!    its birth time (`Recovery::birth`: the create gave it the kept ctime), and last its
//!    inode flags (`SetFlags`), since the creates, links and writes before moved its times
//!    and an immutable flag would refuse them.
//!
//! Keys are read in runs, not one lookup each (a lookup descends the tree from its root):
//! the tree's entries a window at a time and the inodes they name in key order (`inodes`),
//! on a thread of its own (`walk`) while the caller's thread applies the windows before,
//! and the xattrs, pages and runs of every inode with one cursor each alongside step 3's walk of
//! all inodes (`ByInode`). The load counts the bytes of the keys and values it reads, each
//! once ([`Loaded::bytes`]): the opening uses it to tell whether compaction could be due.
//!
//! Nothing loaded is appended to the store (recovery appends nothing).

use std::collections::{HashSet, VecDeque};

use lanefs::{AttrChange, InodeId, NewInode, Record, Recovery, ReplayError, Timespec};
use redb::ReadTransaction;

use super::apply::PAGE;
use super::kv::{self, ACL_ACCESS, ACL_DEFAULT, EntryVal, InodeVal, Superblock};
use super::{DATA, META, ZEROS};

/// Where loading failed: the key and what is wrong.
type R<T> = Result<T, String>;

fn db(e: impl std::fmt::Display) -> String {
    format!("reading the checkpoint: {e}")
}

fn applied(r: Result<(), ReplayError>, what: impl FnOnce() -> String) -> R<()> {
    r.map_err(|e| format!("{}: {e}", what()))
}

fn new_inode(id: InodeId, v: &InodeVal) -> NewInode<'_> {
    NewInode {
        id,
        mode: v.mode,
        uid: v.uid,
        gid: v.gid,
        rdev: v.rdev,
        target: &v.target,
        time: v.ctime,
        access_acl: b"",
        default_acl: b"",
    }
}

/// Gives inode `id` the birth time `v` kept: the create that made it gave it the kept ctime.
fn born(rec: &mut Recovery, id: InodeId, v: &InodeVal) -> R<()> {
    if v.btime == Some(v.ctime) {
        return Ok(());
    }
    applied(rec.birth(id, v.btime), || format!("inode {id}"))
}

/// What [`load`] read.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Loaded {
    /// Inodes loaded.
    pub inodes: u64,
    /// Bytes of the keys and values read, each key once: at most what the database's pages
    /// hold.
    pub bytes: u64,
}

fn len(k: &Guard, v: &Guard) -> u64 {
    (k.value().len() + v.value().len()) as u64
}

/// Loads the checkpoint read by `txn` (with superblock `sb`) into `rec`.
pub(crate) fn load(txn: &ReadTransaction, sb: &Superblock, rec: &mut Recovery) -> R<Loaded> {
    let mut held = 0;
    let meta = txn.open_table(META).map_err(db)?;
    let data = txn.open_table(DATA).map_err(db)?;
    // A checkpoint of format 2 has no `zeros` table (nor a later one that no checkpoint has
    // written to yet).
    let zeros = match txn.open_table(ZEROS) {
        Ok(t) => Some(t),
        Err(redb::TableError::TableDoesNotExist(_)) => None,
        Err(e) => return Err(db(e)),
    };
    held += marks(&meta, sb, rec)?;
    let inode = |ino: u64| named_inode(&meta, ino);
    // 1. The root.
    let root = inode(1)?;
    applied(
        rec.apply(&Record::Root {
            inode: new_inode(InodeId::ROOT, &root),
        }),
        || "the root".into(),
    )?;
    born(rec, InodeId::ROOT, &root)?;
    // 2. The tree, breadth first: read on a thread of its own (`walk`), a window at a time,
    // while this one applies the windows read before, in the order they were read.
    let (tx, rx) = std::sync::mpsc::sync_channel::<R<Vec<Named>>>(2);
    let walked = std::thread::scope(|s| -> R<u64> {
        let reader = std::thread::Builder::new()
            .name("lanefs-load".into())
            .spawn_scoped(s, || walk(txn, tx))
            .map_err(|e| format!("starting the checkpoint's reader: {e}"))?;
        let applying = (|| -> R<()> {
            for window in rx.iter() {
                for n in window? {
                    let name = &n.name[..];
                    let what = || format!("entry {}/{}", n.dir, String::from_utf8_lossy(name));
                    let r = match &n.inode {
                        Some(v) => rec.apply(&Record::Create {
                            dir: n.dir,
                            name,
                            cookie: n.entry.cookie,
                            inode: new_inode(n.entry.target, v),
                            // Step 3's SetFlags gives the inode its flags.
                            flags: 0,
                        }),
                        None => rec.apply(&Record::Link {
                            dir: n.dir,
                            name,
                            cookie: n.entry.cookie,
                            inode: n.entry.target,
                            time: Timespec::default(),
                        }),
                    };
                    applied(r, what)?;
                }
            }
            Ok(())
        })();
        // The reader stops at its next window once the receiver is gone.
        drop(rx);
        let read = reader
            .join()
            .map_err(|p| format!("reading the tree panicked: {}", super::panic_text(p)))?;
        applying.map(|()| read)
    })?;
    held += walked;
    // The orphans, once every live entry's cookie is known (an orphan's passing name takes
    // a fresh cookie).
    held += orphans(&meta, rec, false)?;
    // 3. Every inode's contents, xattrs, attributes and flags.
    let mut count = 0;
    let mut xattrs = ByInode::new(&meta, kv::XATTR)?;
    let mut chunks = ByInode::new(&data, kv::PAGE_TAG)?;
    let mut runs = match &zeros {
        Some(t) => Some(ByInode::new(t, kv::ZEROS_TAG)?),
        None => None,
    };
    let (i1, i2) = (kv::ino_key(kv::INODE, 0), kv::ino_key(kv::INODE, u64::MAX));
    for kvp in meta.range::<&[u8]>(&i1[..]..=&i2[..]).map_err(db)? {
        let (k, v) = kvp.map_err(db)?;
        held += len(&k, &v);
        let (ino, _) = kv::split_key(k.value()).ok_or("inode key too short")?;
        let v = InodeVal::decode(v.value()).map_err(|e| format!("inode {ino}: {e}"))?;
        let id = v.id(ino);
        let what = || format!("inode {id}");
        // A `Create` left an inode's mode, owner and times as kept (all three times its
        // ctime), unless it is a directory (creates inside moved its times), has more than
        // one name (links moved its ctime), has other times, or got records since.
        let mut moved = v.is_dir() || v.nlink > 1 || v.atime != v.ctime || v.mtime != v.ctime;
        if v.is_file() {
            moved |= load_pages(&mut chunks, runs.as_mut(), rec, id, &v, &mut held)?;
        }
        while let Some((k, val)) = xattrs.next(ino)? {
            held += len(&k, &val);
            let (_, name) = kv::split_key(k.value()).ok_or("xattr key too short")?;
            let r = if name == ACL_ACCESS || name == ACL_DEFAULT {
                rec.apply(&Record::SetAcl {
                    inode: id,
                    default: name == ACL_DEFAULT,
                    acl: val.value(),
                    mode: v.mode,
                    time: v.ctime,
                })
            } else {
                rec.apply(&Record::SetXattr {
                    inode: id,
                    name,
                    value: val.value(),
                    time: v.ctime,
                })
            };
            applied(r, what)?;
            moved = true;
        }
        let change = AttrChange {
            mode: Some(v.mode),
            uid: Some(v.uid),
            gid: Some(v.gid),
            size: None,
            atime: Some(v.atime),
            mtime: Some(v.mtime),
            ctime: Some(v.ctime),
        };
        if moved {
            applied(rec.apply(&Record::SetAttr { inode: id, change }), what)?;
        }
        born(rec, id, &v)?;
        if v.flags != 0 {
            applied(
                rec.apply(&Record::SetFlags {
                    inode: id,
                    flags: v.flags,
                    time: v.ctime,
                }),
                what,
            )?;
        }
        count += 1;
    }
    Ok(Loaded {
        inodes: count,
        bytes: held,
    })
}

/// The marks a checkpoint keeps of what was handed out before it: the highest generation,
/// and each cookie lane's highest cookie. Returns the bytes read.
fn marks(meta: &Meta, sb: &Superblock, rec: &mut Recovery) -> R<u64> {
    let mut held = 0;
    rec.observe_generation(lanefs::Generation(sb.max_generation));
    let (c1, c2) = (
        kv::ino_key(kv::COOKIE, 0),
        kv::ino_key(kv::COOKIE, u64::MAX),
    );
    for kvp in meta.range::<&[u8]>(&c1[..]..=&c2[..]).map_err(db)? {
        let (k, v) = kvp.map_err(db)?;
        held += len(&k, &v);
        let c: [u8; 8] = v
            .value()
            .try_into()
            .map_err(|_| "cookie value not 8 bytes")?;
        let c = u64::from_le_bytes(c);
        applied(rec.observe_cookie(c), || {
            format!("cookie key of lane {}", c >> 48)
        })?;
    }
    Ok(held)
}

/// Inode `ino`, which an entry or an orphan mark names.
fn named_inode(meta: &Meta, ino: u64) -> R<InodeVal> {
    let k = kv::ino_key(kv::INODE, ino);
    let v = meta
        .get(&k[..])
        .map_err(db)?
        .ok_or_else(|| format!("inode {ino} is named but missing"))?;
    InodeVal::decode(v.value()).map_err(|e| format!("inode {ino}: {e}"))
}

/// Makes every orphan the checkpoint keeps ([`Recovery::orphan`]); with `lazy`, loads those
/// that are not directories instead ([`Recovery::load_orphan`]: a record may name them again,
/// with their contents). Returns the bytes read.
fn orphans(meta: &Meta, rec: &mut Recovery, lazy: bool) -> R<u64> {
    let mut held = 0;
    let (o1, o2) = (
        kv::ino_key(kv::ORPHAN, 0),
        kv::ino_key(kv::ORPHAN, u64::MAX),
    );
    for kvp in meta.range::<&[u8]>(&o1[..]..=&o2[..]).map_err(db)? {
        let (k, v) = kvp.map_err(db)?;
        held += len(&k, &v);
        let (ino, _) = kv::split_key(k.value()).ok_or("orphan key too short")?;
        let v = named_inode(meta, ino)?;
        if v.nlink != 0 {
            return Err(format!("orphan {ino} has {} links", v.nlink));
        }
        let id = v.id(ino);
        if lazy && !v.is_dir() {
            applied(rec.load_orphan(id), || format!("orphan {id}"))?;
            continue;
        }
        rec.not_loaded(id.ino);
        applied(rec.orphan(&new_inode(id, &v)), || format!("orphan {id}"))?;
    }
    Ok(held)
}

/// What a lazily loaded store gives recovery before its records (engine `fs/lazy.rs`): the
/// marks and the orphans; the root, and everything else, the engine asks for.
pub(crate) fn begin_lazy(txn: &ReadTransaction, sb: &Superblock, rec: &mut Recovery) -> R<()> {
    let meta = txn.open_table(META).map_err(db)?;
    marks(&meta, sb, rec)?;
    if orphans(&meta, rec, true)? > 0 {
        // The orphans' passing names moved the root's times: back to the kept ones.
        let root = named_inode(&meta, 1)?;
        let change = AttrChange {
            atime: Some(root.atime),
            mtime: Some(root.mtime),
            ctime: Some(root.ctime),
            ..AttrChange::default()
        };
        applied(
            rec.apply(&Record::SetAttr {
                inode: InodeId::ROOT,
                change,
            }),
            || "the root".into(),
        )?;
    }
    Ok(())
}

/// An entry of the tree as [`walk`] read it: a `Create` of the inode it names (with its
/// kept value), or a `Link` to an inode created before.
struct Named {
    dir: InodeId,
    name: Vec<u8>,
    entry: EntryVal,
    inode: Option<InodeVal>,
}

/// Reads the tree breadth first from the root, in windows of about [`WALK_WINDOW`] entries: a
/// window's entries, then the inodes they name, in key order ([`inodes`]); sends each window
/// on `tx` (an error ends the walk, sent as the last window), and stops when the receiver is
/// gone. Returns the bytes of the entries read.
fn walk(txn: &ReadTransaction, tx: std::sync::mpsc::SyncSender<R<Vec<Named>>>) -> u64 {
    let mut held = 0;
    if let Err(e) = walk_into(txn, &tx, &mut held) {
        let _ = tx.send(Err(e));
    }
    held
}

fn walk_into(
    txn: &ReadTransaction,
    tx: &std::sync::mpsc::SyncSender<R<Vec<Named>>>,
    held: &mut u64,
) -> R<()> {
    let meta = txn.open_table(META).map_err(db)?;
    let mut linked: HashSet<u64> = HashSet::new();
    let mut queue = VecDeque::from([(InodeId::ROOT, 1u64)]);
    let mut window: Vec<(InodeId, Vec<u8>, EntryVal)> = Vec::new();
    loop {
        while window.len() < WALK_WINDOW {
            let Some((dir, ino)) = queue.pop_front() else {
                break;
            };
            let (a, b) = (kv::ino_key(kv::ENTRY, ino), kv::ino_key(kv::ENTRY, ino + 1));
            for kvp in meta.range::<&[u8]>(&a[..]..&b[..]).map_err(db)? {
                let (k, v) = kvp.map_err(db)?;
                *held += len(&k, &v);
                let (_, name) = kv::split_key(k.value()).ok_or("entry key too short")?;
                let e = EntryVal::decode(v.value())
                    .map_err(|e| format!("entry {dir}/{}: {e}", String::from_utf8_lossy(name)))?;
                window.push((dir, name.to_vec(), e));
            }
        }
        if window.is_empty() {
            return Ok(());
        }
        let mut want: Vec<u64> = window
            .iter()
            .map(|(_, _, e)| e.target.ino.0)
            .filter(|c| !linked.contains(c))
            .collect();
        want.sort_unstable();
        want.dedup();
        let found = inodes(&meta, &want)?;
        let mut out = Vec::with_capacity(window.len());
        for (dir, name, e) in window.drain(..) {
            let child = e.target.ino.0;
            if linked.contains(&child) {
                out.push(Named {
                    dir,
                    name,
                    entry: e,
                    inode: None,
                });
                continue;
            }
            let cv = match found.binary_search_by_key(&child, |(ino, _)| *ino) {
                Ok(i) => found[i].1.clone(),
                Err(_) => return Err(format!("inode {child} is named but missing")),
            };
            if cv.generation != e.target.generation.0 {
                return Err(format!(
                    "entry {dir}/{}: names generation {}, the inode has {}",
                    String::from_utf8_lossy(&name),
                    e.target.generation,
                    cv.generation
                ));
            }
            if cv.is_dir() {
                queue.push_back((e.target, child));
            } else if cv.nlink > 1 {
                linked.insert(child);
            }
            out.push(Named {
                dir,
                name,
                entry: e,
                inode: Some(cv),
            });
        }
        if tx.send(Ok(out)).is_err() {
            return Ok(());
        }
    }
}

/// Entries read before the inodes they name are: a window of the tree's walk (small in the
/// crate's own tests, so that a small tree spans many windows).
const WALK_WINDOW: usize = if cfg!(test) { 64 } else { 1 << 16 };

/// Inode numbers this close together are read with one range of keys instead of one lookup
/// each (a lookup descends the tree from its root; a range reads each leaf once).
const GAP: u64 = 32;

/// The inodes `want` (sorted, no repeats) names that the checkpoint holds, in `want`'s
/// order (an inode missing is left out; the caller says what named it).
pub(super) fn inodes(meta: &Meta, want: &[u64]) -> R<Vec<(u64, InodeVal)>> {
    let mut found = Vec::with_capacity(want.len());
    let mut i = 0;
    while i < want.len() {
        let mut j = i;
        while j + 1 < want.len() && want[j + 1] - want[j] <= GAP {
            j += 1;
        }
        let (a, b) = (
            kv::ino_key(kv::INODE, want[i]),
            kv::ino_key(kv::INODE, want[j]),
        );
        let mut next = i;
        for kvp in meta.range::<&[u8]>(&a[..]..=&b[..]).map_err(db)? {
            let (k, v) = kvp.map_err(db)?;
            let (ino, _) = kv::split_key(k.value()).ok_or("inode key too short")?;
            while next <= j && want[next] < ino {
                next += 1;
            }
            if next <= j && want[next] == ino {
                let v = InodeVal::decode(v.value()).map_err(|e| format!("inode {ino}: {e}"))?;
                found.push((ino, v));
                next += 1;
            }
        }
        i = j + 1;
    }
    Ok(found)
}

type Meta = redb::ReadOnlyTable<&'static [u8], &'static [u8]>;

type Guard = redb::AccessGuard<'static, &'static [u8]>;

/// The keys `tag ++ ino ++ ...` of a table read alongside an ascending walk of inode
/// numbers: one cursor for the whole walk, instead of a range opened (a descent from the
/// root) for each inode.
struct ByInode {
    keys: std::iter::Peekable<redb::Range<'static, &'static [u8], &'static [u8]>>,
}

impl ByInode {
    fn new(table: &Meta, tag: u8) -> R<ByInode> {
        let (a, b) = ([tag], [tag + 1]);
        let keys = table.range::<&[u8]>(&a[..]..&b[..]).map_err(db)?;
        Ok(ByInode {
            keys: keys.peekable(),
        })
    }

    /// The next key and value of inode `ino`, which is above every inode asked for before.
    /// Keys of lower inodes are passed over: the walk found no such inode, and neither does
    /// the filesystem.
    fn next(&mut self, ino: u64) -> R<Option<(Guard, Guard)>> {
        loop {
            let at = match self.keys.peek() {
                None => return Ok(None),
                Some(Ok((k, _))) => kv::split_key(k.value()).ok_or("key too short")?.0,
                Some(Err(_)) => {
                    let e = self.keys.next().and_then(Result::err);
                    return Err(db(e.expect("peeked an error")));
                }
            };
            if at > ino {
                return Ok(None);
            }
            let kvp = self.keys.next().expect("peeked a key").map_err(db)?;
            if at == ino {
                return Ok(Some(kvp));
            }
        }
    }
}

/// File `id`'s pages, each one the store keeps (`Recovery::kept_page`: its bytes stay in
/// the checkpoint until a read or a change asks for them), then the size, then the pages
/// allocated beyond the size (which setting the size would drop), then its runs of zeros
/// (`Recovery::kept_zeros`): the `zeros` table's, and the pages a chunk holds as empty
/// (all zeros: a checkpoint of format 2 kept fallocated pages so), which the engine holds
/// as runs, costing no memory, instead of pages to read back. Returns whether it applied
/// anything (an empty file without pages needs nothing).
fn load_pages(
    chunks: &mut ByInode,
    runs: Option<&mut ByInode>,
    rec: &mut Recovery,
    id: InodeId,
    v: &InodeVal,
    held: &mut u64,
) -> R<bool> {
    let ino = id.ino.0;
    let what = || format!("file {id}");
    let mut beyond = Vec::new();
    // Empty pages, as runs (consecutive ones merged).
    let mut zeros: Vec<(u64, u64)> = Vec::new();
    let mut any = v.size != 0;
    while let Some((k, c)) = chunks.next(ino)? {
        *held += len(&k, &c);
        let chunk = kv::chunk_of(k.value()).ok_or("page key too short")?;
        let c = kv::Chunk::decode(c.value())
            .map_err(|e| format!("{}: pages from {}: {e}", what(), chunk * kv::CHUNK))?;
        for (page, bytes) in c.pages(chunk) {
            any = true;
            if bytes.is_empty() {
                kv::push_zero_page(&mut zeros, page);
                continue;
            }
            if page.saturating_mul(PAGE) >= v.size {
                beyond.push(page);
                continue;
            }
            applied(rec.kept_page(id, page), what)?;
        }
    }
    if let Some(runs) = runs {
        while let Some((k, r)) = runs.next(ino)? {
            *held += len(&k, &r);
            let run = kv::run_of(k.value(), r.value()).map_err(|e| format!("{}: {e}", what()))?;
            zeros.push(run);
            any = true;
        }
    }
    if !any {
        return Ok(false);
    }
    let size = AttrChange {
        size: Some(v.size),
        ..AttrChange::default()
    };
    applied(
        rec.apply(&Record::SetAttr {
            inode: id,
            change: size,
        }),
        what,
    )?;
    for page in beyond {
        applied(rec.kept_page(id, page), what)?;
    }
    for (first, end) in zeros {
        applied(rec.kept_zeros(id, first, end), what)?;
    }
    Ok(true)
}
