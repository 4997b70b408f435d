//! Building a filesystem from a store's records.
//!
//! [`Filesystem::recover`] starts from a bare root; the store feeds every record it kept, in
//! its order, to [`Recovery::apply`], which checks that the record fits the state so far (the
//! inodes and names it refers to exist and are what it says) and makes it through the apply
//! function the live operation used (`apply.rs`). [`Recovery::finish`] then ends recovery:
//! - a store that had no records gets its first, the root's [`Record::Root`];
//! - every inode was held by recovery while records were replayed (so that a link and an
//!   unlink replayed in the other order than they ran, see `Inode::relink`, cannot free it
//!   in between), and those holds are dropped now: an inode with no name left (a file that
//!   was unlinked while open, or an `O_TMPFILE` file never linked, whose `Free` record the
//!   crash prevented) is freed, and the store told;
//! - inode numbers no restored inode holds go back to the allocator.
//!
//! Nothing else runs while records are replayed: the filesystem is handed out by `finish`.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use crossbeam_epoch as epoch;

use super::Filesystem;
use super::apply::new_root;
use crate::dir::DirBody;
use crate::dir::valid_cookie;
use crate::id::{Generation, Ino, InodeId};
use crate::inode::Inode;
use crate::record::{NewInode, Record, Store};
use crate::time::Timespec;

/// A filesystem being rebuilt from records (see the module doc).
pub struct Recovery {
    fs: Filesystem,
    root_seen: bool,
    records: u64,
    /// Orphans made so far ([`Recovery::orphan`]).
    orphans: u64,
}

/// Why a record does not fit the state the records before it built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayError(pub String);

impl std::fmt::Display for ReplayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ReplayError {}

fn err<T>(what: String) -> Result<T, ReplayError> {
    Err(ReplayError(what))
}

impl Filesystem {
    /// Starts rebuilding a filesystem that keeps its records in `store` (see the module doc).
    /// `cfg` gives the limits, the locking mode, and the root's attributes for a new store.
    pub fn recover(cfg: crate::Config, store: Arc<dyn Store>) -> Recovery {
        let fs = Filesystem::empty(cfg, store);
        let g = epoch::pin();
        fs.inode_quota.take(1).expect("room for the root");
        let root = new_root(fs.cfg.root_mode, fs.cfg.root_uid, fs.cfg.root_gid, 1);
        fs.table.install(root, &g);
        Recovery {
            fs,
            root_seen: false,
            records: 0,
            orphans: 0,
        }
    }
}

impl Filesystem {
    /// Starts rebuilding a filesystem whose store loads inodes as they are needed
    /// (`lazy.rs`): the store holds inodes numbered up to `max_ino`, its root among them,
    /// which is loaded now; the records after them are then applied as by
    /// [`Filesystem::recover`], each loading what it touches. What the store's load already
    /// holds (its highest generation, its cookie lanes, its orphans) is given through the
    /// same [`Recovery`] calls as for a store loaded whole.
    ///
    /// `inodes` and `pages` are what the store holds, less its orphans (which records make):
    /// counted against the filesystem's limits now, since loads count nothing.
    pub fn recover_lazy(
        cfg: crate::Config,
        store: Arc<dyn Store>,
        max_ino: u64,
        (inodes, pages): (u64, u64),
    ) -> Result<Recovery, ReplayError> {
        let mut fs = Filesystem::empty(cfg, store);
        if let Err(e) = fs.inode_quota.take(inodes) {
            return err(format!("{inodes} inodes, over the inode limit: {e}"));
        }
        if let Err(e) = fs.space.take(pages) {
            return err(format!("{pages} pages of data, over the size limit: {e}"));
        }
        let max_ino = max_ino.max(Ino::ROOT.0);
        if max_ino > crate::id::MAX_INO {
            return err(format!("inode number {max_ino} beyond the table"));
        }
        let cache = fs.cfg.inode_cache_bytes();
        fs.lazy = Some(super::lazy::Lazy::new(max_ino, inodes, Some(cache)));
        fs.ids.observe(InodeId {
            ino: Ino(max_ino),
            generation: Generation(0),
        });
        let g = epoch::pin();
        match fs.tget(Ino::ROOT, &g) {
            Ok(Some(r)) if r.is_dir() => {}
            Ok(_) => return err("the store holds no root directory".into()),
            Err(e) => return err(format!("loading the root: {e}")),
        }
        drop(g);
        Ok(Recovery {
            fs,
            root_seen: true,
            records: 0,
            orphans: 0,
        })
    }
}

/// Notes the ids and cookie a replayed record carries, so that fresh ones come after them.
pub(super) fn observe(fs: &Filesystem, rec: &Record<'_>) {
    match *rec {
        Record::Create { cookie, inode, .. } => {
            fs.ids.observe(inode.id);
            fs.dirents.observe_cookie(cookie);
        }
        Record::RenameWhiteout {
            cookie,
            whiteout,
            whiteout_cookie,
            ..
        } => {
            if cookie != 0 {
                fs.dirents.observe_cookie(cookie);
            }
            fs.ids.observe(whiteout.id);
            fs.dirents.observe_cookie(whiteout_cookie);
        }
        Record::Tmpfile { inode, .. } => fs.ids.observe(inode.id),
        Record::Link { cookie, .. } => fs.dirents.observe_cookie(cookie),
        Record::Rename { cookie, .. } if cookie != 0 => fs.dirents.observe_cookie(cookie),
        _ => {}
    }
}

impl Recovery {
    /// Records applied so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// The inode `id` names, which must exist.
    fn inode<'g>(&self, id: InodeId, g: &'g epoch::Guard) -> Result<&'g Inode, ReplayError> {
        match self.fs.tget(id.ino, g) {
            Ok(Some(i)) if i.id() == id && !i.is_dead() => Ok(i),
            Err(e) => err(format!("loading inode {id}: {e}")),
            _ => err(format!("inode {id} does not exist")),
        }
    }

    fn dir<'g>(
        &self,
        id: InodeId,
        g: &'g epoch::Guard,
    ) -> Result<(&'g Inode, &'g DirBody), ReplayError> {
        let i = self.inode(id, g)?;
        match i.dir() {
            Some(d) if !d.life.is_dead() => Ok((i, d)),
            Some(_) => err(format!("directory {id} was removed")),
            None => err(format!("inode {id} is not a directory")),
        }
    }

    /// Checks that `name` in `dir` names `id` (or, with `None`, that it is free).
    fn names(&self, dir: &Inode, name: &[u8], id: Option<InodeId>) -> Result<(), ReplayError> {
        let found = self.fs.dget(dir.key(), name).map(|de| de.target);
        if found == id.map(InodeId::key) {
            return Ok(());
        }
        let shown = String::from_utf8_lossy(name);
        match id {
            Some(id) => err(format!("{}/{shown} does not name inode {id}", dir.id())),
            None => err(format!("{}/{shown} exists already", dir.id())),
        }
    }

    fn new_inode_ok(&self, n: &NewInode<'_>, g: &epoch::Guard) -> Result<(), ReplayError> {
        // A lazily loaded store's copy of the number, if any, is loaded (and is then in use);
        // if it has none, the number is marked seen, never to be loaded.
        match self.fs.tget(n.id.ino, g) {
            Ok(None) => Ok(()),
            Ok(Some(_)) => err(format!("inode number {} is in use", n.id.ino)),
            Err(e) => err(format!("loading inode number {}: {e}", n.id.ino)),
        }
    }

    /// Applies one record (see the module doc); an error says what does not fit.
    pub fn apply(&mut self, rec: &Record<'_>) -> Result<(), ReplayError> {
        // Records built by a store from its own keys have not been through the decoder's
        // checks of cookies (`Record::decode`).
        let cookies = match *rec {
            Record::Create { cookie, .. } | Record::Link { cookie, .. } => [Some(cookie), None],
            Record::Rename { cookie, .. } => [(cookie != 0).then_some(cookie), None],
            Record::RenameWhiteout {
                cookie,
                whiteout_cookie,
                ..
            } => [(cookie != 0).then_some(cookie), Some(whiteout_cookie)],
            _ => [None, None],
        };
        if let Some(c) = cookies.into_iter().flatten().find(|&c| !valid_cookie(c)) {
            return err(format!("readdir cookie {c:#x} out of range"));
        }
        let fs = &self.fs;
        let g = epoch::pin();
        let r = match *rec {
            Record::Root { .. } => {
                if self.records > 0 {
                    return err("a root record after other records".into());
                }
                self.root_seen = true;
                fs.apply_root(rec, self.inode(InodeId::ROOT, &g)?)
            }
            Record::Create {
                dir, name, inode, ..
            } => {
                let (d, db) = self.dir(dir, &g)?;
                self.names(d, name, None)?;
                self.new_inode_ok(&inode, &g)?;
                fs.apply_create(rec, (d, db), 1, &g).map(drop)
            }
            Record::Tmpfile { inode, .. } => {
                self.new_inode_ok(&inode, &g)?;
                fs.apply_tmpfile(rec, 1, false, &g).map(drop)
            }
            Record::Link {
                dir, name, inode, ..
            } => {
                let (d, db) = self.dir(dir, &g)?;
                self.names(d, name, None)?;
                let i = self.inode(inode, &g)?;
                if i.is_dir() {
                    return err(format!("link of directory {inode}"));
                }
                fs.apply_link(rec, (d, db), i, &g)
            }
            Record::Remove {
                dir, name, inode, ..
            } => {
                let (d, db) = self.dir(dir, &g)?;
                self.names(d, name, Some(inode))?;
                fs.apply_remove(rec, (d, db), self.inode(inode, &g)?, &g)
                    .map(|freed| freed.into_iter().for_each(|(i, f)| fs.settle(i, f, &g)))
            }
            Record::Rename {
                from,
                from_name,
                to,
                to_name,
                inode,
                replaced,
                ..
            }
            | Record::RenameWhiteout {
                from,
                from_name,
                to,
                to_name,
                inode,
                replaced,
                ..
            } => {
                if let Record::RenameWhiteout { whiteout, .. } = rec {
                    self.new_inode_ok(whiteout, &g)?;
                    if replaced == Some(inode) {
                        return err(format!("rename of inode {inode} over itself"));
                    }
                }
                let (d1, dd1) = self.dir(from, &g)?;
                let (d2, dd2) = self.dir(to, &g)?;
                self.names(d1, from_name, Some(inode))?;
                self.names(d2, to_name, replaced)?;
                let src = self.inode(inode, &g)?;
                let dst = match replaced {
                    Some(r) => Some(self.inode(r, &g)?),
                    None => None,
                };
                fs.apply_rename(rec, (d1, dd1), (d2, dd2), src, dst, &g)
                    .map(|freed| freed.into_iter().for_each(|(i, f)| fs.settle(i, f, &g)))
            }
            Record::SetAttr { inode, .. } => fs.replay_setattr(rec, self.inode(inode, &g)?),
            Record::Write { inode, .. }
            | Record::Allocate { inode, .. }
            | Record::Punch { inode, .. } => fs.replay_data(rec, self.inode(inode, &g)?),
            Record::SetXattr { inode, .. } | Record::RemoveXattr { inode, .. } => {
                fs.replay_xattr(rec, self.inode(inode, &g)?)
            }
            Record::SetAcl { inode, .. } => fs.replay_acl(rec, self.inode(inode, &g)?),
            Record::SetFlags { inode, .. } => fs.replay_flags(rec, self.inode(inode, &g)?),
            Record::Free { inode } => {
                let i = self.inode(inode, &g)?;
                if i.nlink() != 0 {
                    return err(format!(
                        "free of inode {inode}, which has {} links",
                        i.nlink()
                    ));
                }
                fs.put_refs(i, 1, &g);
                Ok(())
            }
        };
        self.records += 1;
        r.map_err(|e| ReplayError(format!("{e}")))
    }

    /// Inodes, and pages of file data, the filesystem holds so far (what its limits count).
    pub fn usage(&self) -> (u64, u64) {
        (self.fs.inode_quota.used(), self.fs.space.used())
    }

    /// Notes that inodes up to generation `generation` existed (a checkpoint's high-water
    /// mark, which covers inodes freed before it): fresh generations come after it.
    pub fn observe_generation(&mut self, generation: Generation) {
        self.fs.ids.observe(InodeId {
            ino: Ino::ROOT,
            generation,
        });
    }

    /// Notes that readdir cookie `cookie` was handed out (a checkpoint's high-water mark of
    /// its slot, which covers entries removed before it): that slot's fresh cookies come
    /// after it.
    pub fn observe_cookie(&mut self, cookie: u64) -> Result<(), ReplayError> {
        if !valid_cookie(cookie) {
            return err(format!("readdir cookie {cookie:#x} out of range"));
        }
        self.fs.dirents.observe_cookie(cookie);
        Ok(())
    }

    /// Adds page `page` of regular file `inode` as one the store keeps: it counts as an
    /// allocated page (the size limit, `st_blocks`) but its bytes stay in the store until a
    /// read or a change asks for them (`data.rs`, "Pages the store keeps"). A store loading
    /// its checkpoint says so instead of replaying the bytes; the file's size is set after.
    pub fn kept_page(&mut self, inode: InodeId, page: u64) -> Result<(), ReplayError> {
        let g = epoch::pin();
        let i = self.inode(inode, &g)?;
        let crate::inode::Body::File(data) = &i.body else {
            return err(format!("inode {inode} is not a regular file"));
        };
        if page > crate::fs::MAX_FILE_SIZE / crate::data::PAGE {
            return err(format!(
                "file {inode}: page {page} is beyond the largest file"
            ));
        }
        let mut d = data.write();
        if d.missing_pages(page * crate::data::PAGE, 1) == 1 {
            self.fs
                .space
                .take(1)
                .map_err(|e| ReplayError(format!("file {inode}: page {page}: {e}")))?;
            d.add_kept(page, &self.fs.page_epochs);
            let pages = d.pages();
            let _ = i.attr.update::<(), ()>(&self.fs.stats, |v| {
                v.blocks = pages * (crate::data::PAGE / 512);
                Ok(())
            });
        }
        Ok(())
    }

    /// Adds pages `first..end` of regular file `inode` as allocated zeros (`data.rs`,
    /// "Allocated zeros"): they count as allocated pages (the size limit, `st_blocks`) and
    /// cost no memory whatever their number. A store loading its checkpoint says so for the
    /// runs it holds, and for pages it holds that are all zeros; pages already allocated
    /// stay as they are.
    pub fn kept_zeros(&mut self, inode: InodeId, first: u64, end: u64) -> Result<(), ReplayError> {
        let g = epoch::pin();
        let i = self.inode(inode, &g)?;
        let crate::inode::Body::File(data) = &i.body else {
            return err(format!("inode {inode} is not a regular file"));
        };
        let last = crate::fs::MAX_FILE_SIZE / crate::data::PAGE;
        if first >= end || end - 1 > last {
            return err(format!(
                "file {inode}: a run of zeros from page {first} to {end}"
            ));
        }
        let mut d = data.write();
        let need = d.missing_pages(first * crate::data::PAGE, (end - first) * crate::data::PAGE);
        self.fs
            .space
            .take(need)
            .map_err(|e| ReplayError(format!("file {inode}: pages {first}..{end}: {e}")))?;
        let added = d.add_zeros(first, end, &self.fs.page_epochs);
        debug_assert_eq!(added, need);
        let pages = d.pages();
        let _ = i.attr.update::<(), ()>(&self.fs.stats, |v| {
            v.blocks = pages * (crate::data::PAGE / 512);
            Ok(())
        });
        Ok(())
    }

    /// Sets the birth time of inode `inode` to what a checkpoint kept (`None`: it kept none).
    /// A record that makes an inode gives it its time as birth time; a loader that makes the
    /// inode with another time (the kept ctime) sets the kept one after.
    pub fn birth(&mut self, inode: InodeId, t: Option<Timespec>) -> Result<(), ReplayError> {
        let g = epoch::pin();
        self.inode(inode, &g)?.set_birth(t);
        Ok(())
    }

    /// Loads orphan `id` (an inode without links, not a directory) from a lazily loaded
    /// store (`lazy.rs`), with its contents: held by recovery like every other inode, it is
    /// freed when recovery ends unless a record after gives it a name (a linkable tmpfile's
    /// `Link`).
    pub fn load_orphan(&mut self, id: InodeId) -> Result<(), ReplayError> {
        let g = epoch::pin();
        match self.fs.tget(id.ino, &g) {
            Ok(Some(i)) if i.id() == id && i.nlink() == 0 => Ok(()),
            Ok(_) => err(format!("orphan {id} is not in the store")),
            Err(e) => err(format!("loading orphan {id}: {e}")),
        }
    }

    /// Marks number `ino` as one a lazily loaded store (`lazy.rs`) gives through records
    /// (an orphan, made by [`Recovery::orphan`]), not to be loaded from its copy.
    pub fn not_loaded(&mut self, ino: Ino) {
        if let Some(l) = &self.fs.lazy {
            l.see(ino);
        }
    }

    /// Makes inode `inode` as an **orphan**: an inode with no name, which a checkpoint keeps
    /// because it was still open when its last name went (records after the checkpoint may
    /// still change it, and its `Free` may follow). It is made by a create in the root
    /// under a name no entry can have (it holds a `/`) and the removal of that name, through
    /// the same apply functions as every record; the root's times are the caller's to set
    /// afterwards. [`Recovery::finish`] frees it unless a later record gives it a name (none
    /// can) or frees it first.
    pub fn orphan(&mut self, inode: &NewInode<'_>) -> Result<(), ReplayError> {
        const NAME: &[u8] = b"/orphan";
        // A cookie of its own (the index keeps a removed one's place a while), which spends
        // no cookie space: the slot's counter goes back after the name (`cookie_far_ahead`).
        let mark = self.fs.dirents.cookie_mark();
        let cookie = self.fs.dirents.cookie_far_ahead(self.orphans);
        self.orphans += 1;
        let r = self
            .apply(&Record::Create {
                dir: InodeId::ROOT,
                name: NAME,
                cookie,
                inode: *inode,
                flags: 0,
            })
            .and_then(|()| {
                self.apply(&Record::Remove {
                    dir: InodeId::ROOT,
                    name: NAME,
                    inode: inode.id,
                    time: inode.time,
                })
            });
        self.fs.dirents.reset_cookie(mark);
        r
    }

    /// Ends recovery and returns the filesystem (see the module doc).
    pub fn finish(self) -> Result<Filesystem, ReplayError> {
        let fs = self.fs;
        fs.replaying.store(false, Relaxed);
        let g = epoch::pin();
        if !self.root_seen {
            if self.records > 0 {
                return err("records without a root record first".into());
            }
            let root = fs.iget(Ino::ROOT, &g).expect("the root");
            let v = root.attr.load();
            let rec = Record::Root {
                inode: NewInode {
                    id: InodeId::ROOT,
                    mode: v.mode,
                    uid: v.uid,
                    gid: v.gid,
                    rdev: 0,
                    target: b"",
                    time: Timespec::now(),
                    access_acl: b"",
                    default_acl: b"",
                },
            };
            fs.apply_root(&rec, root)
                .map_err(|e| ReplayError(format!("root record refused by the store: {e}")))?;
        }
        let mut held = Vec::new();
        fs.table.for_each(&g, |i| held.push(i));
        let mut in_use = Vec::with_capacity(held.len());
        for i in held {
            // An orphan this frees gets its Free record and its number recycled by the free
            // itself (recovery is over); so every number held is left out of `reclaim`, which
            // hands out the rest.
            fs.put_refs(i, 1, &g);
            in_use.push(i.ino);
        }
        // A lazily loaded store may hold any number up to its highest: only those above are
        // handed out again (`lazy.rs`).
        let floor = fs.lazy.as_ref().map_or(Ino::ROOT, |l| Ino(l.max()));
        fs.ids.reclaim(floor, in_use, &fs.stats);
        if let Some(l) = fs.lazy.as_ref() {
            // What the journal replayed changed is in the first checkpoint begun from now;
            // with nothing replayed, the checkpoint holds every inode as it is.
            l.recovered(if self.records == 0 {
                0
            } else {
                fs.page_epochs.label()
            });
        }
        Ok(fs)
    }
}
