//! Applying journal records to the checkpoint's keys (`kv.rs`), inside the checkpoint's
//! write transaction: [`Tables::apply`] gives each record kind to one function here.
//!
//! Each function makes in the keys exactly the change that the engine's apply function for
//! that record kind makes in memory (engine/src/fs/apply.rs and data.rs: link counts, a
//! directory's `..`, page arithmetic of writes, holes, punches and truncation), so that
//! loading the keys gives the filesystem that replaying the records would have given. What a
//! record does to an inode's attributes (its times, size, mode, flags) is not written here
//! but taken from the engine (`lanefs::effect`, applied to [`kv::InodeVal`]), which applies
//! the same functions to a live inode. `store/tests/checkpoint.rs` holds the two to that: random
//! workloads checkpointed and reloaded must dump the same tree, attributes, contents and
//! xattrs as the live filesystem. A record that does not fit the keys (an inode or entry
//! that is missing or has another generation) is an error: the checkpoint is abandoned and
//! the journal keeps the records. Errors say which of the two they are ([`ApplyError`]):
//! redb's own failure (the host's error underneath) leaves the database to be reopened
//! (mod.rs), a record that does not fit leaves it as it is.

use lanefs::{InodeId, Record, RecordSummary, Timespec, effect};
use redb::{ReadableTable, Table};

use super::kv::{self, ACL_ACCESS, ACL_DEFAULT, EntryVal, InodeVal, USER_FLAGS};

/// Page size of file data (the engine's).
pub(crate) const PAGE: u64 = 4096;

pub(crate) type KvTable<'t> = Table<'t, &'static [u8], &'static [u8]>;

/// The tables of a checkpoint being written, the high-water mark of generations, and
/// the files whose records cancel out within the records being applied.
pub(crate) struct Tables<'t> {
    pub meta: KvTable<'t>,
    pub data: KvTable<'t>,
    /// Runs of allocated zeros (`z` keys): disjoint, not adjacent, and disjoint from the
    /// pages `data` holds, as the engine's runs are (engine `data.rs`, "Allocated zeros").
    pub zeros: KvTable<'t>,
    pub max_generation: u64,
    pub absorption: Absorption,
    /// Files whose pages this checkpoint absorbs: a later record of it frees them, so their
    /// writes, allocations and punches change their inode's key but write no page (the Free
    /// deletes every page, so the keys end the same). Empty unless the checkpoint looked ahead
    /// (mod.rs, "Out of room": a retry after a failure).
    pub pages_absorbed: &'t PagesAbsorbed,
    /// The chunk of pages ([`kv::Chunk`]) that page reads and changes go through: read from
    /// `data` once, written back once ([`Tables::flush`]) when another chunk is wanted,
    /// before pages are removed by range, and before the transaction commits, so that a
    /// file written page by page costs one read and one write of each chunk.
    pub open: Option<OpenChunk>,
    /// Inodes changed and not written yet ([`Changed`]).
    pub changed: Changed,
    /// The highest cookie of each lane seen by this transaction, and whether it is to be
    /// written ([`Tables::saw_cookie`]; written by [`Tables::end`]).
    pub cookies: std::collections::HashMap<u64, (u64, bool), foldhash::fast::FixedState>,
    /// Inode keys made less those deleted by this transaction (the superblock's counts).
    pub inodes: i64,
    /// Pages (chunk pages and pages in runs) made less those removed.
    pub pages: i64,
}

/// Inode values changed by a checkpoint's records and not written to `meta` yet: a
/// directory that a run of creates, removes or renames changes (its times, its link count)
/// is written once, when its slot is wanted by another inode or the transaction ends
/// ([`Tables::end`]), instead of read and written again for every record. Direct-mapped by
/// inode number: [`Tables::inode`] looks here before `meta`, [`Tables::put_inode`] writes
/// here, and the Free of an inode drops its slot, so no key of `meta` is read while a newer
/// value waits here.
pub(crate) struct Changed {
    slots: Vec<Option<(u64, InodeVal)>>,
}

/// Slots of [`Changed`].
const CHANGED_SLOTS: u64 = 256;

impl Default for Changed {
    fn default() -> Changed {
        Changed {
            slots: (0..CHANGED_SLOTS).map(|_| None).collect(),
        }
    }
}

impl Changed {
    fn slot(ino: u64) -> usize {
        (ino % CHANGED_SLOTS) as usize
    }

    fn get(&self, ino: u64) -> Option<&InodeVal> {
        match &self.slots[Self::slot(ino)] {
            Some((i, v)) if *i == ino => Some(v),
            _ => None,
        }
    }

    /// Drops inode `ino`'s waiting value, if any (another inode in its slot stays).
    fn forget(&mut self, ino: u64) {
        let slot = &mut self.slots[Self::slot(ino)];
        if matches!(slot, Some((i, _)) if *i == ino) {
            *slot = None;
        }
    }
}

/// [`Tables::open`].
pub(crate) struct OpenChunk {
    ino: u64,
    chunk: u64,
    pages: kv::Chunk,
    dirty: bool,
}

/// The inodes a checkpoint's records free, whose pages it therefore does not write: their
/// Free absorbs them ([`Tables::pages_absorbed`]).
pub(crate) type PagesAbsorbed = std::collections::HashSet<InodeId, foldhash::fast::FixedState>;

/// Absorption: files made and freed within the records of one window of a checkpoint (the
/// records it reads before applying them, about 4 MiB: `window.rs`, `RecordWindow`) are
/// absorbed (as a journal that logs whole blocks absorbs a block written twice, hence the
/// name; such a file is an *absorbed file* here): nothing of them reaches the keys,
/// only what their records did to others (the directories' times, the highest cookie and
/// generation). A file whose create, remove and free fall in one checkpoint (crunl's every
/// file, rndrename's, a build's temporary files) costs the checkpoint a few updates of its
/// directories' inodes instead of eleven key changes or more.
///
/// Found as the records are read ([`Absorption::see`]), before any of the window is applied:
/// a file (not a directory: a directory's entries, `..` and link count would have to be
/// followed too) that a Create makes and a Free ends, and that no record
/// names in any other way than as the subject of its data and attribute records, as the
/// file a Rename moves when that Rename replaces nothing and exchanges nothing, and as the
/// victim of a Remove. A Link, a Rename that replaces or exchanges (on either side), a
/// RenameWhiteout, Tmpfile or Root naming it makes it an ordinary inode. Such a file has
/// had one name at a time, from its create to its remove: the create's, then each plain
/// rename's target; the Remove of the last precedes its Free; and no other record names it
/// or its entries (a record that replaced its entry would name it). So skipping its records
/// leaves exactly the keys that applying them would have: its inode key, entries, orphan
/// mark, xattrs and pages are put and deleted again within the checkpoint; what stays is
/// each record's change of its directories' times and the cookies it used, gathered and
/// written before the next record of anything else (a directory's own removal among them).
/// A number reused by another inode in the same checkpoint is another `InodeId` (the
/// generations differ).
pub(crate) struct Absorption {
    /// The state of every file (not directory) a Create of the window made, by generation
    /// (unique over a filesystem's life): bit 0 made here, bit 1 freed here, bit 2 named
    /// otherwise (not absorbed). Kept in blocks of [`BLOCK`] generations, found by the
    /// generation's block number in `blocks` (so that most lookups are of a few blocks that
    /// stay in cache, not of a hash table as large as the window's files: threads take
    /// generations in consecutive runs, `engine/src/id.rs`).
    blocks: std::collections::HashMap<u64, u32, foldhash::fast::FixedState>,
    /// `BLOCK` states per block, in the order the blocks were first seen.
    states: Vec<u8>,
    /// The last two blocks looked up, and where their states start (`u32::MAX`: none).
    recent: [(u64, u32); 2],
    /// Files made and freed here, counted by [`Absorption::settle`].
    found: usize,
    /// Directories whose times absorbed files changed, with the latest time, and the highest
    /// cookie of each lane absorbed files used, not yet written ([`Tables::finish`]): a run
    /// of absorbed files in a few directories costs one update of each at its end.
    times: Vec<(InodeId, Timespec)>,
    cookies: Vec<u64>,
}

impl Default for Absorption {
    fn default() -> Absorption {
        Absorption {
            blocks: Default::default(),
            states: Vec::new(),
            recent: [(0, u32::MAX); 2],
            found: 0,
            times: Vec::new(),
            cookies: Vec::new(),
        }
    }
}

/// Generations per block of [`Absorption::states`].
const BLOCK: u64 = 1024;
/// A window whose blocks took more memory than this gives it back when it ends.
const STATES_KEPT: usize = 1 << 20;

/// Directories and cookie lanes gathered at most ([`Absorption::later`]).
const GATHERED: usize = 16;

const MADE: u8 = 1;
const FREED: u8 = 2;
const OTHER: u8 = 4;

/// Where a file's state is in [`Absorption::states`]; `NO_SLOT` when it has none (not made in
/// the window, or a directory).
pub(crate) type Slot = u32;
pub(crate) const NO_SLOT: Slot = u32::MAX;

impl Absorption {
    /// Where the states of generation `g`'s block start; with `make`, a block is added
    /// when there is none.
    #[inline]
    fn block(&mut self, g: u64, make: bool) -> Option<u32> {
        let b = g / BLOCK;
        for &(k, at) in &self.recent {
            if k == b && at != u32::MAX {
                return Some(at);
            }
        }
        let at = match self.blocks.get(&b) {
            Some(&at) => at,
            None if make => {
                let at = self.states.len() as u32;
                self.states.resize(self.states.len() + BLOCK as usize, 0);
                self.blocks.insert(b, at);
                at
            }
            None => return None,
        };
        self.recent = [(b, at), self.recent[0]];
        Some(at)
    }

    /// The slot of `id` if a Create of this window made it.
    #[inline]
    fn slot(&mut self, id: InodeId) -> Slot {
        let g = id.generation.0;
        match self.block(g, false) {
            Some(at) if self.states[(at + (g % BLOCK) as u32) as usize] & MADE != 0 => {
                at + (g % BLOCK) as u32
            }
            _ => NO_SLOT,
        }
    }

    /// Adds `bit` to the state of `id` if this window made it; returns its slot.
    #[inline]
    fn mark(&mut self, id: InodeId, bit: u8) -> Slot {
        let s = self.slot(id);
        if s != NO_SLOT {
            self.states[s as usize] |= bit;
        }
        s
    }

    /// Takes note of a Create, Remove, Free or plain Rename of the window
    /// (module doc of [`Absorption`]); returns the slot of the file it is about if this window
    /// made it (for its [`Absorbable`]).
    pub(crate) fn see(&mut self, g: &RecordSummary) -> Slot {
        match *g {
            RecordSummary::Create { inode, mode, .. } => {
                if mode & libc::S_IFMT == libc::S_IFDIR {
                    return NO_SLOT;
                }
                let g = inode.generation.0;
                let at = self.block(g, true).expect("a block is made") + (g % BLOCK) as u32;
                // A generation is given once: a second Create of it is a damaged journal,
                // which applying reports; it is not absorbed.
                let st = &mut self.states[at as usize];
                *st = if *st == 0 { MADE } else { MADE | OTHER };
                at
            }
            RecordSummary::Free { inode } => self.mark(inode, FREED),
            RecordSummary::Remove { inode, .. } | RecordSummary::Rename { inode, .. } => {
                self.slot(inode)
            }
            RecordSummary::Other => NO_SLOT,
        }
    }

    /// Takes note of a record of another kind ([`RecordSummary::Other`]): one that names a file in
    /// another way than absorbed files are named makes it an ordinary file.
    pub(crate) fn see_other(&mut self, rec: &Record<'_>) {
        match *rec {
            Record::Link { inode, .. } => {
                self.mark(inode, OTHER);
            }
            Record::Rename {
                inode, replaced, ..
            } => {
                self.mark(inode, OTHER);
                if let Some(r) = replaced {
                    self.mark(r, OTHER);
                }
            }
            Record::RenameWhiteout {
                inode,
                replaced,
                whiteout,
                ..
            } => {
                self.mark(inode, OTHER);
                self.mark(whiteout.id, OTHER);
                if let Some(r) = replaced {
                    self.mark(r, OTHER);
                }
            }
            Record::Tmpfile { inode, .. } | Record::Root { inode } => {
                self.mark(inode.id, OTHER);
            }
            // The kinds `see` takes (a Create, Remove or Free decoded here anyway is taken
            // by `see`; a Rename comes here only if it replaces or exchanges), and data and
            // attribute records, which do not name files otherwise.
            Record::Create { .. }
            | Record::Remove { .. }
            | Record::Free { .. }
            | Record::SetAttr { .. }
            | Record::Write { .. }
            | Record::Allocate { .. }
            | Record::Punch { .. }
            | Record::SetXattr { .. }
            | Record::RemoveXattr { .. }
            | Record::SetAcl { .. }
            | Record::SetFlags { .. } => {}
        }
    }

    /// Forgets the window's files (after [`Tables::finish`] wrote what was gathered),
    /// keeping the memory for the next window (up to [`STATES_KEPT`]).
    pub(crate) fn clear(&mut self) {
        debug_assert!(self.is_settled());
        self.blocks.clear();
        self.states.clear();
        if self.states.capacity() > STATES_KEPT {
            self.states.shrink_to(STATES_KEPT);
            self.blocks.shrink_to(STATES_KEPT / BLOCK as usize);
        }
        self.recent = [(0, u32::MAX); 2];
        self.found = 0;
    }

    /// Counts the absorbed files (after every record of the window was seen); returns how
    /// many.
    pub(crate) fn settle(&mut self) -> usize {
        self.found = self.states.iter().filter(|&&s| s == MADE | FREED).count();
        self.found
    }

    /// Whether `slot` is an absorbed file's (after [`Absorption::settle`]).
    #[inline]
    fn is_absorbed(&self, slot: Slot) -> bool {
        slot != NO_SLOT && self.states[slot as usize] == MADE | FREED
    }

    /// Gathers an absorbed file's change of `dir`'s times to `t` and its `cookie` (0: none); false
    /// when as many directories or lanes are gathered as are kept: then they are to be
    /// written ([`Tables::finish`]), this one with them.
    fn later(&mut self, dir: InodeId, t: Timespec, cookie: u64) -> bool {
        match self.times.iter_mut().find(|(d, _)| *d == dir) {
            Some((_, old)) => *old = old.advance(t),
            None => self.times.push((dir, t)),
        }
        if cookie != 0 {
            match self.cookies.iter_mut().find(|c| **c >> 48 == cookie >> 48) {
                Some(c) => *c = (*c).max(cookie),
                None => self.cookies.push(cookie),
            }
        }
        self.times.len() < GATHERED && self.cookies.len() < GATHERED
    }

    /// Nothing gathered is waiting to be written.
    fn is_settled(&self) -> bool {
        self.times.is_empty() && self.cookies.is_empty()
    }
}

/// What absorption needs of a record that can belong to an absorbed file, taken when the
/// record is first read ([`Absorbable::of`]), so that a window absorbs such records without
/// decoding them again ([`Tables::absorb`]): the inode the record is about and, for a Create
/// or Remove, the change it makes to its directory. Records of other kinds have none (an
/// absorbed file's data and attribute records are rare, and are found when they are
/// decoded).
#[derive(Clone, Copy)]
pub(crate) struct Absorbable {
    /// Where the file's state is in [`Absorption`].
    slot: Slot,
    /// A Create's generation (the highest given yet); 0 otherwise (the
    /// root's, never absorbed).
    made: u64,
    /// The directory (number 0: none, a Free), its new time, and the new entry's cookie (0:
    /// a Remove).
    dir: InodeId,
    time: Timespec,
    cookie: u64,
    /// A Rename's target directory when it is not the source (number 0: none); its new
    /// time is `time` too.
    to: InodeId,
}

impl Absorbable {
    /// What absorption needs of a Create, Remove or Free of a file whose
    /// state is at `slot` ([`Absorption::see`]); `None` for other records and files with no
    /// slot (they are not absorbed).
    pub(crate) fn of(g: &RecordSummary, slot: Slot) -> Option<Absorbable> {
        if slot == NO_SLOT {
            return None;
        }
        let none = InodeId {
            ino: lanefs::Ino(0),
            generation: lanefs::Generation(0),
        };
        let (made, dir, time, cookie, to) = match *g {
            RecordSummary::Create {
                dir,
                cookie,
                inode,
                time,
                ..
            } => (inode.generation.0, dir, time, cookie, none),
            RecordSummary::Remove { dir, time, .. } => (0, dir, time, 0, none),
            RecordSummary::Rename {
                from,
                to,
                cookie,
                time,
                ..
            } => (0, from, time, cookie, if to == from { none } else { to }),
            RecordSummary::Free { .. } => (0, none, Timespec::new(0, 0), 0, none),
            RecordSummary::Other => return None,
        };
        Some(Absorbable {
            slot,
            made,
            dir,
            time,
            cookie,
            to,
        })
    }
}

/// Why a record could not be applied.
#[derive(Debug)]
pub(crate) enum ApplyError {
    /// redb failed (the host refused a read, write or flush, or redb itself): the write
    /// transaction is lost, and the database may refuse every later one until reopened.
    Db(String),
    /// The record does not fit the keys; redb is unharmed.
    Misfit(String),
}

impl From<String> for ApplyError {
    fn from(s: String) -> ApplyError {
        ApplyError::Misfit(s)
    }
}

impl std::fmt::Display for ApplyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApplyError::Db(s) | ApplyError::Misfit(s) => f.write_str(s),
        }
    }
}

type R<T> = Result<T, ApplyError>;

fn db(e: impl std::fmt::Display) -> ApplyError {
    ApplyError::Db(format!("checkpoint: {e}"))
}

impl Tables<'_> {
    fn get(&self, key: &[u8]) -> R<Option<Vec<u8>>> {
        Ok(self.meta.get(key).map_err(db)?.map(|v| v.value().to_vec()))
    }

    fn put(&mut self, key: &[u8], val: &[u8]) -> R<()> {
        self.meta.insert(key, val).map_err(db)?;
        Ok(())
    }

    fn del(&mut self, key: &[u8]) -> R<bool> {
        Ok(self.meta.remove(key).map_err(db)?.is_some())
    }

    /// Inode `ino` as the records so far left it, if it exists ([`Changed`], else `meta`).
    fn inode_val(&self, ino: u64) -> R<Option<InodeVal>> {
        if let Some(v) = self.changed.get(ino) {
            return Ok(Some(v.clone()));
        }
        match self.get(&kv::ino_key(kv::INODE, ino))? {
            Some(v) => Ok(Some(
                InodeVal::decode(&v).map_err(|e| format!("inode {ino}: {e}"))?,
            )),
            None => Ok(None),
        }
    }

    /// The inode `id`, which must exist with that generation.
    fn inode(&self, id: InodeId) -> R<InodeVal> {
        let v = self
            .inode_val(id.ino.0)?
            .ok_or_else(|| format!("inode {id} is not in the checkpoint"))?;
        if v.generation != id.generation.0 {
            return Err(
                format!("inode {id}: the checkpoint has generation {}", v.generation).into(),
            );
        }
        Ok(v)
    }

    /// Sets inode `ino` to `v` ([`Changed`]: written when its slot is wanted, or at the end).
    fn put_inode(&mut self, ino: u64, v: InodeVal) -> R<()> {
        let slot = Changed::slot(ino);
        if let Some((i, old)) = self.changed.slots[slot].take()
            && i != ino
        {
            self.put(&kv::ino_key(kv::INODE, i), &old.encode())?;
        }
        self.changed.slots[slot] = Some((ino, v));
        Ok(())
    }

    /// Forgets inode `ino` (freed): its key is deleted, and no value of it is written.
    fn drop_inode(&mut self, ino: u64) -> R<()> {
        self.changed.forget(ino);
        if self.del(&kv::ino_key(kv::INODE, ino))? {
            self.inodes -= 1;
        }
        Ok(())
    }

    /// Writes what waits to be written: the open chunk of pages, the inodes changed, the
    /// lanes' highest cookies. Before the transaction commits.
    pub(crate) fn end(&mut self) -> R<()> {
        self.flush()?;
        for slot in 0..self.changed.slots.len() {
            if let Some((ino, v)) = self.changed.slots[slot].take() {
                self.put(&kv::ino_key(kv::INODE, ino), &v.encode())?;
            }
        }
        let mut lanes: Vec<(u64, u64)> = self
            .cookies
            .iter()
            .filter(|(_, (_, dirty))| *dirty)
            .map(|(&lane, &(c, _))| (lane, c))
            .collect();
        lanes.sort_unstable();
        for (lane, c) in lanes {
            self.put(&kv::ino_key(kv::COOKIE, lane), &c.to_le_bytes())?;
        }
        self.cookies.clear();
        Ok(())
    }

    /// Changes inode `id` with `f`, keeping the orphan mark in step with its link count.
    fn update(&mut self, id: InodeId, f: impl FnOnce(&mut InodeVal)) -> R<()> {
        let mut v = self.inode(id)?;
        let was = v.nlink;
        f(&mut v);
        let now = v.nlink;
        self.put_inode(id.ino.0, v)?;
        let orphan = kv::ino_key(kv::ORPHAN, id.ino.0);
        match (was == 0, now == 0) {
            (false, true) => self.put(&orphan, b""),
            (true, false) => self.del(&orphan).map(drop),
            _ => Ok(()),
        }
    }

    fn entry(&self, dir: InodeId, name: &[u8]) -> R<EntryVal> {
        let v = self
            .get(&kv::named_key(kv::ENTRY, dir.ino.0, name))?
            .ok_or_else(|| {
                format!(
                    "{dir}/{} is not in the checkpoint",
                    String::from_utf8_lossy(name)
                )
            })?;
        Ok(EntryVal::decode(&v)?)
    }

    fn put_entry(&mut self, dir: InodeId, name: &[u8], e: EntryVal) -> R<()> {
        self.put(&kv::named_key(kv::ENTRY, dir.ino.0, name), &e.encode())
    }

    fn del_entry(&mut self, dir: InodeId, name: &[u8]) -> R<()> {
        if !self.del(&kv::named_key(kv::ENTRY, dir.ino.0, name))? {
            return Err(format!(
                "{dir}/{} is not in the checkpoint",
                String::from_utf8_lossy(name)
            )
            .into());
        }
        Ok(())
    }

    /// A directory whose entries changed at `t`: its mtime and ctime advance to it as the
    /// engine's do ([`Timespec::advance`]), so that a checkpoint holds the times the live
    /// filesystem had whatever the order of changes that shared no lock.
    fn set_mc(&mut self, dir: InodeId, t: Timespec) -> R<()> {
        self.update(dir, |v| effect::entries_changed(v, t))
    }

    /// A status change at `t`: ctime advances to it ([`Timespec::advance`]).
    fn set_c(&mut self, id: InodeId, t: Timespec) -> R<()> {
        self.update(id, |v| effect::status_changed(v, t))
    }

    fn set_xattr(&mut self, ino: u64, name: &[u8], value: Option<&[u8]>) -> R<()> {
        let k = kv::named_key(kv::XATTR, ino, name);
        match value {
            Some(v) => self.put(&k, v),
            None => self.del(&k).map(drop),
        }
    }

    /// Makes the inode a [`lanefs::NewInode`] describes, with user flags `flags`; returns
    /// whether it is a directory.
    fn new_inode(&mut self, n: &lanefs::NewInode<'_>, flags: u32, parent: u64) -> R<bool> {
        let dir = n.mode & libc::S_IFMT == libc::S_IFDIR;
        let v = InodeVal {
            generation: n.id.generation.0,
            mode: n.mode,
            uid: n.uid,
            gid: n.gid,
            nlink: if dir { 2 } else { 1 },
            rdev: n.rdev,
            size: n.target.len() as u64,
            atime: n.time,
            mtime: n.time,
            ctime: n.time,
            flags: flags & USER_FLAGS,
            parent: if dir { parent } else { 0 },
            btime: Some(n.time),
            target: n.target.to_vec(),
        };
        let ino = n.id.ino.0;
        let root = ino == 1;
        if !root && self.changed.get(ino).is_some() {
            return Err(format!("inode number {} is in use", n.id.ino).into());
        }
        // The insert says whether the number was in use (an error abandons the transaction,
        // so what it replaced does not matter then).
        let k = kv::ino_key(kv::INODE, ino);
        let was = self
            .meta
            .insert(&k[..], &v.encode()[..])
            .map_err(db)?
            .is_some();
        if was && !root {
            return Err(format!("inode number {} is in use", n.id.ino).into());
        }
        if !was {
            self.inodes += 1;
        }
        if root {
            // Made anew over the old one: a value of the old waiting here must not be written.
            self.changed.forget(ino);
        }
        // A number not in use has no xattrs (a Free deletes them): only the root, made
        // again over the old one, may have ACLs to drop.
        for (name, acl) in [(ACL_ACCESS, n.access_acl), (ACL_DEFAULT, n.default_acl)] {
            if root || !acl.is_empty() {
                self.set_xattr(ino, name, Some(acl).filter(|a| !a.is_empty()))?;
            }
        }
        self.max_generation = self.max_generation.max(n.id.generation.0);
        Ok(dir)
    }

    /// Keeps the highest cookie of `cookie`'s lane (its top 16 bits: the engine's slot), so
    /// that cookies of removed entries are not handed out again after a reopen.
    fn saw_cookie(&mut self, cookie: u64) -> R<()> {
        if cookie == 0 {
            return Ok(());
        }
        let lane = cookie >> 48;
        let old = match self.cookies.get(&lane) {
            Some(&(c, _)) => c,
            None => {
                let c = self
                    .get(&kv::ino_key(kv::COOKIE, lane))?
                    .and_then(|v| v.try_into().ok().map(u64::from_le_bytes))
                    .unwrap_or(0);
                self.cookies.insert(lane, (c, false));
                c
            }
        };
        if cookie > old {
            self.cookies.insert(lane, (cookie, true));
        }
        Ok(())
    }

    /// A new entry `name` in `dir` for a new inode.
    fn create(
        &mut self,
        dir: InodeId,
        name: &[u8],
        cookie: u64,
        n: &lanefs::NewInode<'_>,
        flags: u32,
    ) -> R<()> {
        self.inode(dir)?;
        let is_dir = self.new_inode(n, flags, dir.ino.0)?;
        self.saw_cookie(cookie)?;
        self.put_entry(
            dir,
            name,
            EntryVal {
                target: n.id,
                cookie,
            },
        )?;
        self.update(dir, |v| {
            if is_dir {
                v.nlink += 1;
            }
            effect::entries_changed(v, n.time);
        })
    }

    /// The target of a removed name, or of a name a rename replaced, loses that name.
    fn drop_name(&mut self, dir: InodeId, victim: InodeId) -> R<()> {
        let is_dir = self.inode(victim)?.is_dir();
        if is_dir {
            self.update(dir, |v| v.nlink = v.nlink.saturating_sub(1))?;
        }
        self.update(victim, |v| {
            v.nlink = if is_dir { 0 } else { v.nlink.saturating_sub(1) };
        })
    }

    /// A directory `i` moved from `from` to `to` (nothing when it is not a directory or
    /// stays in its directory).
    fn moved(&mut self, i: InodeId, from: InodeId, to: InodeId) -> R<()> {
        if from == to || !self.inode(i)?.is_dir() {
            return Ok(());
        }
        self.update(i, |v| v.parent = to.ino.0)?;
        self.update(to, |v| v.nlink += 1)?;
        self.update(from, |v| v.nlink = v.nlink.saturating_sub(1))
    }

    /// Removes every key of `table` from `from` up to (not including) `to`.
    fn clear(table: &mut KvTable<'_>, from: &[u8], to: &[u8]) -> R<()> {
        table
            .retain_in::<&[u8], _>(from..to, |_, _| false)
            .map_err(db)
    }

    /// Removes the chunks of pages `from..to` (keys of `data`), counting their pages.
    fn clear_chunks(&mut self, from: &[u8], to: &[u8]) -> R<()> {
        let mut gone = 0i64;
        let mut bad = None;
        self.data
            .retain_in::<&[u8], _>(from..to, |k, v| {
                match kv::Chunk::mask_of(v) {
                    Ok(m) => gone += i64::from(m.count_ones()),
                    Err(e) => bad = Some(format!("{k:?}: {e}")),
                }
                false
            })
            .map_err(db)?;
        if let Some(e) = bad {
            return Err(format!("a chunk of pages removed: {e}").into());
        }
        self.pages -= gone;
        Ok(())
    }

    /// The chunk holding page `page` of file `ino`, opened ([`Tables::open`]).
    fn chunk(&mut self, ino: u64, page: u64) -> R<(&mut OpenChunk, usize)> {
        let (chunk, i) = kv::chunk_at(page);
        if !matches!(&self.open, Some(o) if o.ino == ino && o.chunk == chunk) {
            self.flush()?;
            let pages = match self.data.get(&kv::chunk_key(ino, chunk)[..]).map_err(db)? {
                Some(v) => kv::Chunk::decode(v.value())
                    .map_err(|e| format!("file {ino}'s pages from {}: {e}", chunk * kv::CHUNK))?,
                None => kv::Chunk::default(),
            };
            self.open = Some(OpenChunk {
                ino,
                chunk,
                pages,
                dirty: false,
            });
        }
        Ok((self.open.as_mut().expect("opened above"), i))
    }

    /// Writes the open chunk back if it changed (removes its key if it holds no page).
    pub(crate) fn flush(&mut self) -> R<()> {
        if let Some(o) = self.open.take()
            && o.dirty
        {
            let k = kv::chunk_key(o.ino, o.chunk);
            if o.pages.is_empty() {
                self.data.remove(&k[..]).map_err(db)?;
            } else {
                self.data
                    .insert(&k[..], &o.pages.encode()[..])
                    .map_err(db)?;
            }
        }
        Ok(())
    }

    fn page(&mut self, ino: u64, page: u64) -> R<Option<Vec<u8>>> {
        let (o, i) = self.chunk(ino, page)?;
        Ok(o.pages.get(i).map(<[u8]>::to_vec))
    }

    fn put_page(&mut self, ino: u64, page: u64, bytes: &[u8]) -> R<()> {
        let (o, i) = self.chunk(ino, page)?;
        let new = o.pages.get(i).is_none();
        o.pages.put(i, bytes);
        o.dirty = true;
        self.pages += i64::from(new);
        Ok(())
    }

    /// File `ino`'s runs of zeros that overlap pages `first..end` (non-empty), in order;
    /// with `adjacent`, also those that end at `first` or start at `end`.
    fn runs_meeting(&self, ino: u64, first: u64, end: u64, adjacent: bool) -> R<Vec<(u64, u64)>> {
        let a = u64::from(adjacent);
        let run = |k: &[u8], v: &[u8]| {
            kv::run_of(k, v).map_err(|e| ApplyError::from(format!("file {ino}: {e}")))
        };
        let mut out = Vec::new();
        let (lo, at) = (kv::zeros_key(ino, 0), kv::zeros_key(ino, first));
        if let Some(kvp) = self
            .zeros
            .range::<&[u8]>(&lo[..]..&at[..])
            .map_err(db)?
            .next_back()
        {
            let (k, v) = kvp.map_err(db)?;
            let (s, e) = run(k.value(), v.value())?;
            if e + a > first {
                out.push((s, e));
            }
        }
        let hi = kv::zeros_key(ino, end.saturating_add(a));
        for kvp in self.zeros.range::<&[u8]>(&at[..]..&hi[..]).map_err(db)? {
            let (k, v) = kvp.map_err(db)?;
            out.push(run(k.value(), v.value())?);
        }
        Ok(out)
    }

    fn put_run(&mut self, ino: u64, first: u64, end: u64) -> R<()> {
        self.zeros
            .insert(&kv::zeros_key(ino, first)[..], &end.to_le_bytes()[..])
            .map_err(db)?;
        self.pages += end.saturating_sub(first) as i64;
        Ok(())
    }

    /// Removes run `first..end` of file `ino`.
    fn del_run(&mut self, ino: u64, first: u64, end: u64) -> R<()> {
        self.zeros
            .remove(&kv::zeros_key(ino, first)[..])
            .map_err(db)?;
        self.pages -= end.saturating_sub(first) as i64;
        Ok(())
    }

    /// Takes pages `first..end` of file `ino` out of its runs of zeros.
    fn cut_runs(&mut self, ino: u64, first: u64, end: u64) -> R<()> {
        if first >= end {
            return Ok(());
        }
        for (s, e) in self.runs_meeting(ino, first, end, false)? {
            self.del_run(ino, s, e)?;
            if s < first {
                self.put_run(ino, s, first)?;
            }
            if e > end {
                self.put_run(ino, end, e)?;
            }
        }
        Ok(())
    }

    /// Makes the pages `first..end` of file `ino` that are neither pages nor in a run part
    /// of a run (merged with the runs that meet them), as `FileData::allocate` does: one key
    /// per run, however many pages it holds.
    fn fill_runs(&mut self, ino: u64, first: u64, end: u64) -> R<()> {
        if first >= end {
            return Ok(());
        }
        // The open chunk's pages are read from `data` below.
        self.flush()?;
        let (mut lo, mut hi) = (first, end);
        for (s, e) in self.runs_meeting(ino, first, end, true)? {
            self.del_run(ino, s, e)?;
            (lo, hi) = (lo.min(s), hi.max(e));
        }
        // The runs met hold no page: the pages in `lo..hi` are those of `first..end`.
        let (a, b) = (
            kv::chunk_key(ino, first / kv::CHUNK),
            kv::chunk_key(ino, (end - 1) / kv::CHUNK + 1),
        );
        let mut at = lo;
        let mut runs = Vec::new();
        for kvp in self.data.range::<&[u8]>(&a[..]..&b[..]).map_err(db)? {
            let (k, v) = kvp.map_err(db)?;
            let chunk = kv::chunk_of(k.value())
                .ok_or_else(|| format!("file {ino}: a page key too short"))?;
            let mask = kv::Chunk::mask_of(v.value())
                .map_err(|e| format!("file {ino}'s pages from {}: {e}", chunk * kv::CHUNK))?;
            for i in (0..kv::CHUNK).filter(|&i| mask & 1 << i != 0) {
                let page = chunk * kv::CHUNK + i;
                if page < first || page >= end {
                    continue;
                }
                if page > at {
                    runs.push((at, page));
                }
                at = page + 1;
            }
        }
        if at < hi {
            runs.push((at, hi));
        }
        for (s, e) in runs {
            self.put_run(ino, s, e)?;
        }
        Ok(())
    }

    /// Makes pages `first..end` of file `ino` holes (`end` `None`: every page from `first`
    /// on): the chunks wholly inside go by key range, the others page by page; runs of
    /// zeros are cut.
    fn remove_pages(&mut self, ino: u64, first: u64, end: Option<u64>) -> R<()> {
        let end = end.unwrap_or(u64::MAX);
        if first >= end {
            return Ok(());
        }
        self.cut_runs(ino, first, end)?;
        let (a, b) = (first.div_ceil(kv::CHUNK), end / kv::CHUNK);
        // The pages of a partial chunk at either end.
        let edge = |from: u64, to: u64, t: &mut Self| -> R<()> {
            for page in from..to {
                let (o, i) = t.chunk(ino, page)?;
                if o.pages.get(i).is_some() {
                    o.pages.remove(i);
                    o.dirty = true;
                    t.pages -= 1;
                }
            }
            Ok(())
        };
        if a > b {
            // Within one chunk.
            return edge(first, end, self);
        }
        edge(first, a * kv::CHUNK, self)?;
        if b * kv::CHUNK < end && end != u64::MAX {
            edge(b * kv::CHUNK, end, self)?;
        }
        self.flush()?;
        let from = kv::chunk_key(ino, a);
        if end == u64::MAX {
            self.clear_chunks(&from, &kv::ino_key(kv::PAGE_TAG, ino + 1))
        } else if a < b {
            self.clear_chunks(&from, &kv::chunk_key(ino, b))
        } else {
            Ok(())
        }
    }

    /// Drops file `ino`'s pages from `first` on.
    fn drop_pages(&mut self, ino: u64, first: u64) -> R<()> {
        self.remove_pages(ino, first, None)
    }

    /// Zeroes bytes `from..to` of page `page` if it exists (`from`, `to` within the page).
    fn zero_in_page(&mut self, ino: u64, page: u64, from: usize, to: usize) -> R<()> {
        if let Some(mut p) = self.page(ino, page)?
            && from < p.len()
        {
            let end = to.min(p.len());
            p[from..end].fill(0);
            self.put_page(ino, page, &p)?;
        }
        Ok(())
    }

    /// Whether a later record of this checkpoint frees `id` ([`Tables::pages_absorbed`]).
    fn absorbs_pages(&self, id: InodeId) -> bool {
        !self.pages_absorbed.is_empty() && self.pages_absorbed.contains(&id)
    }

    fn write(&mut self, ino: u64, offset: u64, data: &[u8]) -> R<()> {
        let len = data.len() as u64;
        if len == 0 {
            return Ok(());
        }
        // The pages written are pages now, not part of a run (a page of zeros is stored
        // empty: the engine's run of it loads back as a run).
        self.cut_runs(ino, offset / PAGE, (offset + len - 1) / PAGE + 1)?;
        for idx in offset / PAGE..(offset + len - 1) / PAGE + 1 {
            let start = idx * PAGE;
            let from = offset.max(start);
            let to = (offset + len).min(start + PAGE);
            // A write of the whole page keeps nothing of it: not read.
            let whole = from == start && to == start + PAGE;
            let mut p = if whole {
                Vec::new()
            } else {
                self.page(ino, idx)?.unwrap_or_default()
            };
            let need = (to - start) as usize;
            if p.len() < need {
                p.resize(need, 0);
            }
            p[(from - start) as usize..need]
                .copy_from_slice(&data[(from - offset) as usize..(to - offset) as usize]);
            self.put_page(ino, idx, &p)?;
        }
        Ok(())
    }

    fn allocate(&mut self, ino: u64, offset: u64, len: u64) -> R<()> {
        if len == 0 {
            return Ok(());
        }
        self.fill_runs(ino, offset / PAGE, (offset + len - 1) / PAGE + 1)
    }

    fn punch(&mut self, ino: u64, offset: u64, len: u64) -> R<()> {
        if len == 0 {
            return Ok(());
        }
        let end = offset.saturating_add(len);
        let (first_full, end_full) = (offset.div_ceil(PAGE), end / PAGE);
        if first_full < end_full {
            self.remove_pages(ino, first_full, Some(end_full))?;
        }
        for idx in [offset / PAGE, end.saturating_sub(1) / PAGE] {
            let start = idx * PAGE;
            let (from, to) = (offset.max(start), end.min(start + PAGE));
            if from < to {
                self.zero_in_page(ino, idx, (from - start) as usize, (to - start) as usize)?;
            }
        }
        Ok(())
    }

    fn truncate(&mut self, ino: u64, size: u64) -> R<()> {
        self.drop_pages(ino, size.div_ceil(PAGE))?;
        if !size.is_multiple_of(PAGE) {
            self.zero_in_page(ino, size / PAGE, (size % PAGE) as usize, PAGE as usize)?;
        }
        Ok(())
    }

    /// What a record of an absorbed file ([`Absorption`]) does to the keys: the create's and the
    /// remove's change of the directory's times, the cookie and generation it used; nothing
    /// else. Those are gathered ([`Absorption::later`]) and written before the next record of
    /// anything else, or at the end ([`Tables::finish`]). None for a record of anything else.
    fn absorb_record(&mut self, rec: &Record<'_>) -> Option<R<()>> {
        if self.absorption.found == 0 {
            return None;
        }
        let id = match *rec {
            Record::Create { inode, .. } => inode.id,
            Record::Remove { inode, .. }
            | Record::Free { inode }
            | Record::Rename {
                inode,
                replaced: None,
                exchange: false,
                ..
            }
            | Record::SetAttr { inode, .. }
            | Record::Write { inode, .. }
            | Record::Allocate { inode, .. }
            | Record::Punch { inode, .. }
            | Record::SetXattr { inode, .. }
            | Record::RemoveXattr { inode, .. }
            | Record::SetAcl { inode, .. }
            | Record::SetFlags { inode, .. } => inode,
            _ => return None,
        };
        let slot = self.absorption.slot(id);
        if !self.absorption.is_absorbed(slot) {
            return None;
        }
        match Absorbable::of(&RecordSummary::of(rec), slot) {
            Some(g) => self.absorb(&g),
            None => Some(Ok(())),
        }
    }

    /// An absorbed file's Create, Remove or Free, from its [`Absorbable`]: gathers what it did to
    /// its directory (written once too many directories or lanes are gathered); `None` when the
    /// record is not an absorbed file's (it is to be applied).
    pub(crate) fn absorb(&mut self, g: &Absorbable) -> Option<R<()>> {
        if !self.absorption.is_absorbed(g.slot) {
            return None;
        }
        self.max_generation = self.max_generation.max(g.made);
        // Both gathered before any is written (a rename's two directories).
        let mut r = g.dir.ino.0 == 0 || self.absorption.later(g.dir, g.time, g.cookie);
        if g.to.ino.0 != 0 {
            r &= self.absorption.later(g.to, g.time, 0);
        }
        Some(if r { Ok(()) } else { self.finish() })
    }

    /// Writes what the absorbed files' records did to others and is not written yet (directory
    /// times, cookies): before a record of anything else, and at the end of the records.
    pub(crate) fn finish(&mut self) -> R<()> {
        for (dir, t) in std::mem::take(&mut self.absorption.times) {
            self.set_mc(dir, t)?;
        }
        for cookie in std::mem::take(&mut self.absorption.cookies) {
            self.saw_cookie(cookie)?;
        }
        Ok(())
    }

    /// Applies one record (see the module doc), or what is left of it for an absorbed file.
    pub(crate) fn apply(&mut self, rec: &Record<'_>) -> R<()> {
        if let Some(r) = self.absorb_record(rec) {
            return r;
        }
        if !self.absorption.is_settled() {
            self.finish()?;
        }
        match *rec {
            Record::Root { inode } => self.root(&inode),
            Record::Create {
                dir,
                name,
                cookie,
                inode,
                flags,
            } => self.create(dir, name, cookie, &inode, flags),
            Record::Link {
                dir,
                name,
                cookie,
                inode,
                time,
            } => self.link(dir, name, cookie, inode, time),
            Record::Remove {
                dir,
                name,
                inode,
                time,
            } => self.remove(dir, name, inode, time),
            Record::Rename {
                from,
                from_name,
                to,
                to_name,
                inode,
                replaced,
                exchange,
                cookie,
                time,
            } => self.rename(
                (from, from_name),
                (to, to_name),
                inode,
                replaced,
                exchange,
                cookie,
                time,
            ),
            Record::RenameWhiteout { .. } => self.rename_whiteout(rec),
            Record::Tmpfile { inode, flags } => self.tmpfile(&inode, flags),
            Record::SetAttr { inode, change } => self.set_attr(inode, &change),
            Record::Write {
                inode,
                offset,
                data,
                time,
            } => self.data_changed(inode, time, Some(offset + data.len() as u64), |t| {
                t.write(inode.ino.0, offset, data)
            }),
            Record::Allocate {
                inode,
                offset,
                len,
                keep_size,
                time,
            } => self.data_changed(inode, time, (!keep_size).then_some(offset + len), |t| {
                t.allocate(inode.ino.0, offset, len)
            }),
            Record::Punch {
                inode,
                offset,
                len,
                time,
            } => self.data_changed(inode, time, None, |t| t.punch(inode.ino.0, offset, len)),
            Record::SetXattr {
                inode,
                name,
                value,
                time,
            } => {
                self.set_xattr(inode.ino.0, name, Some(value))?;
                self.set_c(inode, time)
            }
            Record::RemoveXattr { inode, name, time } => {
                self.set_xattr(inode.ino.0, name, None)?;
                self.set_c(inode, time)
            }
            Record::SetAcl {
                inode,
                default,
                acl,
                mode,
                time,
            } => {
                let name = if default { ACL_DEFAULT } else { ACL_ACCESS };
                self.set_xattr(inode.ino.0, name, Some(acl).filter(|a| !a.is_empty()))?;
                self.update(inode, |v| effect::acl_set(v, mode, time))
            }
            Record::SetFlags { inode, flags, time } => {
                self.update(inode, |v| effect::flags_set(v, flags, time))
            }
            Record::Free { inode } => self.free(inode),
        }
    }

    /// A Root: the root's attributes, its link count kept (the tree below it may be loaded
    /// already).
    fn root(&mut self, n: &lanefs::NewInode<'_>) -> R<()> {
        let nlink = match self.inode_val(1)? {
            Some(v) => v.nlink,
            None => 2,
        };
        self.new_inode(n, 0, 1)?;
        self.update(n.id, |v| v.nlink = nlink)
    }

    /// A Link: the entry, a link more and the inode's ctime, the directory's times.
    fn link(
        &mut self,
        dir: InodeId,
        name: &[u8],
        cookie: u64,
        inode: InodeId,
        time: Timespec,
    ) -> R<()> {
        self.inode(dir)?;
        self.saw_cookie(cookie)?;
        self.put_entry(
            dir,
            name,
            EntryVal {
                target: inode,
                cookie,
            },
        )?;
        self.update(inode, |v| {
            v.nlink += 1;
            effect::status_changed(v, time);
        })?;
        self.set_mc(dir, time)
    }

    /// A Remove: the entry, a link of the inode and its ctime, the directory's times.
    fn remove(&mut self, dir: InodeId, name: &[u8], inode: InodeId, time: Timespec) -> R<()> {
        self.del_entry(dir, name)?;
        self.drop_name(dir, inode)?;
        self.set_c(inode, time)?;
        self.set_mc(dir, time)
    }

    /// A RenameWhiteout: the whiteout made, the rename (never an exchange), and the source
    /// name naming the whiteout with its cookie.
    fn rename_whiteout(&mut self, rec: &Record<'_>) -> R<()> {
        let Record::RenameWhiteout {
            from,
            from_name,
            to,
            to_name,
            inode,
            replaced,
            cookie,
            time,
            whiteout,
            whiteout_cookie,
            whiteout_flags,
        } = *rec
        else {
            unreachable!("rename_whiteout of {rec:?}")
        };
        self.new_inode(&whiteout, whiteout_flags, 0)?;
        self.saw_cookie(cookie)?;
        self.saw_cookie(whiteout_cookie)?;
        self.rename(
            (from, from_name),
            (to, to_name),
            inode,
            replaced,
            false,
            cookie,
            time,
        )?;
        self.put_entry(
            from,
            from_name,
            EntryVal {
                target: whiteout.id,
                cookie: whiteout_cookie,
            },
        )
    }

    /// A Tmpfile: a regular file with no name, an orphan (`update` keeps the mark in step)
    /// until a Link names it or a Free ends it.
    fn tmpfile(&mut self, inode: &lanefs::NewInode<'_>, flags: u32) -> R<()> {
        if inode.mode & libc::S_IFMT != libc::S_IFREG {
            return Err(format!("tmpfile {} is not a regular file", inode.id).into());
        }
        self.new_inode(inode, flags, 0)?;
        self.update(inode.id, |v| v.nlink = 0)
    }

    /// A SetAttr: a shrink cuts the pages beyond the new size (as `FileData::truncate`; a
    /// growth keeps those allocated past the old end); then the attributes.
    fn set_attr(&mut self, inode: InodeId, change: &lanefs::AttrChange) -> R<()> {
        let v = self.inode(inode)?;
        if let Some(size) = change.size {
            if !v.is_file() {
                return Err(format!("size set on inode {inode}, not a file").into());
            }
            if size < v.size {
                self.truncate(inode.ino.0, size)?;
            }
        }
        self.update(inode, |v| change.apply(v))
    }

    /// A Write, Allocate or Punch of file `inode`: `pages` changes its pages (unless the
    /// file's pages are absorbed), then its size and times ([`effect::contents_changed`]).
    fn data_changed(
        &mut self,
        inode: InodeId,
        time: Timespec,
        end: Option<u64>,
        pages: impl FnOnce(&mut Self) -> R<()>,
    ) -> R<()> {
        self.file(inode)?;
        if !self.absorbs_pages(inode) {
            pages(self)?;
        }
        self.update(inode, |v| effect::contents_changed(v, time, end))
    }

    /// A Free: the inode, which must have no link left, its orphan mark, xattrs and pages.
    fn free(&mut self, inode: InodeId) -> R<()> {
        let v = self.inode(inode)?;
        if v.nlink != 0 {
            return Err(format!("free of inode {inode}, which has {} links", v.nlink).into());
        }
        let ino = inode.ino.0;
        self.drop_inode(ino)?;
        self.del(&kv::ino_key(kv::ORPHAN, ino))?;
        let (a, b) = (kv::ino_key(kv::XATTR, ino), kv::ino_key(kv::XATTR, ino + 1));
        Self::clear(&mut self.meta, &a, &b)?;
        self.drop_pages(ino, 0)
    }

    fn file(&self, id: InodeId) -> R<()> {
        if self.inode(id)?.is_file() {
            Ok(())
        } else {
            Err(format!("data record for inode {id}, not a file").into())
        }
    }

    #[allow(clippy::too_many_arguments)] // a rename's two names and what it carries
    fn rename(
        &mut self,
        (from, from_name): (InodeId, &[u8]),
        (to, to_name): (InodeId, &[u8]),
        inode: InodeId,
        replaced: Option<InodeId>,
        exchange: bool,
        cookie: u64,
        time: Timespec,
    ) -> R<()> {
        let src = self.entry(from, from_name)?;
        if src.target != inode {
            return Err(format!(
                "{from}/{} does not name inode {inode}",
                String::from_utf8_lossy(from_name)
            )
            .into());
        }
        match replaced {
            Some(t) if exchange => {
                let dst = self.entry(to, to_name)?;
                self.put_entry(
                    from,
                    from_name,
                    EntryVal {
                        target: t,
                        cookie: src.cookie,
                    },
                )?;
                self.put_entry(
                    to,
                    to_name,
                    EntryVal {
                        target: inode,
                        cookie: dst.cookie,
                    },
                )?;
                self.moved(inode, from, to)?;
                self.moved(t, to, from)?;
                self.set_c(t, time)?;
            }
            Some(t) => {
                let dst = self.entry(to, to_name)?;
                self.del_entry(from, from_name)?;
                self.put_entry(
                    to,
                    to_name,
                    EntryVal {
                        target: inode,
                        cookie: dst.cookie,
                    },
                )?;
                self.moved(inode, from, to)?;
                self.drop_name(to, t)?;
                self.set_c(t, time)?;
            }
            None => {
                self.saw_cookie(cookie)?;
                self.del_entry(from, from_name)?;
                self.put_entry(
                    to,
                    to_name,
                    EntryVal {
                        target: inode,
                        cookie,
                    },
                )?;
                self.moved(inode, from, to)?;
            }
        }
        self.set_c(inode, time)?;
        self.set_mc(from, time)?;
        if from != to {
            self.set_mc(to, time)?;
        }
        Ok(())
    }
}
