//! How each record changes the filesystem: one function per record kind, called by the live
//! operation once its checks pass (`namespace.rs`, `file.rs`, `xattr_ops.rs`) and by recovery
//! for a record read back from a store (`recovery.rs`). Each function hands its record to the
//! store ([`Filesystem::commit`]) at the one moment the order of records must match the order
//! of changes, and before anything of the change is visible:
//!
//! - a create, link, or rename to a free name: after the new entry is admitted into the
//!   directory's index (so a failed admission, in a directory being removed, leaves no
//!   record) and before the inode is installed or the name revealed;
//! - a tmpfile: before its inode is installed (it has no name, so no lock orders it: no
//!   other change can reach the inode before it is installed);
//! - an unlink: before the name leaves the map;
//! - an rmdir, or a rename over a directory: inside the removal protocol's decision, after the
//!   directory was found empty and before its name goes and it is declared dead (a refused
//!   record leaves it alive);
//! - a rename that leaves a whiteout: as a rename, with the whiteout's entry admitted into
//!   the source directory before the record too, its inode installed after the record, and
//!   the entry put in the source's place within the rename's visible moment;
//! - attribute (SetAttr, SetFlags), data and xattr changes: under the inode's attribute
//!   seqlock, data lock or xattr shard lock, which order every change of that state.
//!
//! Timestamps come from the record, never from the clock, so a replay stamps what the live
//! change stamped.
//!
//! # Link counts
//! A directory's link count moves while the entry that causes the move is in its index: a
//! new subdirectory's `+1` when its name is revealed, a removed or moved-out subdirectory's
//! `-1` while its name is still there. A parent whose count is about to drop therefore still
//! holds an entry, so no removal of the parent can find it empty in between (the parent's
//! count is never changed after it is dead).

use std::ptr;

use crossbeam_epoch::Guard;

use super::Filesystem;
use crate::acl::{ACL_ACCESS_NAME, ACL_DEFAULT_NAME};
use crate::attr::{AttrCell, AttrVals, FileType, flags};
use crate::data::{FileData, PAGE};
use crate::dir::DirBody;
use crate::dir::{Pending, RenameMap};
use crate::errno::{Errno, Result};
use crate::id::InoGen;
use crate::inode::{Body, Fate, Inode};
use crate::record::{AttrChange, NewInode, Record, effect};
use crate::time::Timespec;
use crate::xattr::Shard as XattrShard;

impl Filesystem {
    /// [`Record::Create`]: makes the inode and its name in `dir` (body `d`). `refs` is the
    /// references the new inode starts with (open handles, lookups, recovery's hold).
    pub(super) fn apply_create<'g>(
        &self,
        rec: &Record<'_>,
        (dir, d): (&'g Inode, &DirBody),
        refs: u32,
        g: &'g Guard,
    ) -> Result<&'g Inode> {
        let Record::Create {
            name,
            cookie,
            inode: n,
            flags: inherited,
            ..
        } = *rec
        else {
            unreachable!("apply_create of {rec:?}")
        };
        let give_back = || {
            if !self.replaying() {
                self.ids.free(n.id.ino, &self.stats);
            }
        };
        if let Err(e) = self.inode_quota.take(1) {
            give_back();
            return Err(e);
        }
        let undo = |e| {
            self.inode_quota.give(1);
            give_back();
            Err(e)
        };
        let pending =
            match self
                .dirents
                .admit((dir.key(), d), name, named_as(&n), cookie, g, &self.stats)
            {
                Ok(p) => p,
                Err(e) => return undo(e),
            };
        if let Err(e) = self.commit(rec) {
            self.dirents.cancel(pending, d, g, &self.stats);
            return undo(e);
        }
        let inode = self.install_new(&n, inherited, Named(dir.key()), refs, g);
        let is_dir = inode.is_dir();
        self.dirents.reveal(pending, &self.stats, || {
            if is_dir {
                // Safe while the new entry is in `dir`'s index: `dir` cannot die meanwhile.
                dir.inc_nlink()
                    .expect("link limit above the inode table's capacity");
            }
        });
        dir.attr.set_mc(n.time, &self.stats);
        Ok(inode)
    }

    /// [`Record::Tmpfile`]: makes a regular file with no name and `refs` references (its
    /// open handle and kernel lookup, or recovery's hold); `linkable`: a link may give it its
    /// first name (`O_TMPFILE` without `O_EXCL`; never in recovery, which frees every inode
    /// left without a name at its end). The inode is counted in the inode quota from now on,
    /// and freed, like an unlinked open file, when its last reference goes.
    pub(super) fn apply_tmpfile<'g>(
        &self,
        rec: &Record<'_>,
        refs: u32,
        linkable: bool,
        g: &'g Guard,
    ) -> Result<&'g Inode> {
        let Record::Tmpfile { inode: n, flags } = *rec else {
            unreachable!("apply_tmpfile of {rec:?}")
        };
        let give_back = || {
            if !self.replaying() {
                self.ids.free(n.id.ino, &self.stats);
            }
        };
        if let Err(e) = self.inode_quota.take(1) {
            give_back();
            return Err(e);
        }
        if let Err(e) = self.commit(rec) {
            self.inode_quota.give(1);
            give_back();
            return Err(e);
        }
        Ok(self.install_new(&n, flags, Unnamed { linkable }, refs, g))
    }

    /// Installs the inode a create's record describes, with its inherited ACLs (stored
    /// before the inode is in the table, so that no one sees its ACL flags without the ACLs;
    /// a freed inode's entry goes before its number is recycled) and inode flags.
    fn install_new<'g>(
        &self,
        n: &NewInode<'_>,
        inherited: u32,
        place: Place,
        refs: u32,
        g: &'g Guard,
    ) -> &'g Inode {
        if !n.access_acl.is_empty() || !n.default_acl.is_empty() {
            let mut shard = self.xattrs.lock(n.id.ino, &self.stats);
            let x = shard.entry(n.id.ino).or_default();
            for (name, v) in [
                (ACL_ACCESS_NAME, n.access_acl),
                (ACL_DEFAULT_NAME, n.default_acl),
            ] {
                if !v.is_empty() {
                    x.set(name, v, 0).expect("ACLs fit the xattr limits");
                }
            }
        }
        let i = self.table.install(new_inode(n, inherited, place, refs), g);
        self.label_new(i);
        i
    }

    /// [`Record::Root`]: a new filesystem's root attributes.
    pub(super) fn apply_root(&self, rec: &Record<'_>, root: &Inode) -> Result<()> {
        let Record::Root { inode: n } = *rec else {
            unreachable!("apply_root of {rec:?}")
        };
        self.commit(rec)?;
        let _ = root.attr.update::<(), ()>(&self.stats, |v| {
            *v = new_vals(&n, 0, 0);
            Ok(())
        });
        // Made again as the record says, born at its time (as its replay makes it).
        root.set_birth(Some(n.time));
        Ok(())
    }

    /// [`Record::Link`]: a new name in `dir` for `inode`.
    pub(super) fn apply_link(
        &self,
        rec: &Record<'_>,
        (dir, d): (&Inode, &DirBody),
        inode: &Inode,
        g: &Guard,
    ) -> Result<()> {
        let Record::Link {
            name, cookie, time, ..
        } = *rec
        else {
            unreachable!("apply_link of {rec:?}")
        };
        // A tmpfile's first link raises its count from 0 (`link_existing` lets only a
        // linkable one do so; replay lets any, `Inode::relink`).
        let was_linkable = if self.replaying() {
            inode.relink()?;
            false
        } else {
            inode.link_existing()?
        };
        let unlink = |e| {
            self.settle(inode, inode.unlink_failed(was_linkable), g);
            Err(e)
        };
        let pending = match self.dirents.admit(
            (dir.key(), d),
            name,
            inode.named_as(),
            cookie,
            g,
            &self.stats,
        ) {
            Ok(p) => p,
            Err(e) => return unlink(e),
        };
        if let Err(e) = self.commit(rec) {
            self.dirents.cancel(pending, d, g, &self.stats);
            return unlink(e);
        }
        self.dirents.reveal(pending, &self.stats, || {});
        inode.attr.set_c(time, &self.stats);
        dir.attr.set_mc(time, &self.stats);
        Ok(())
    }

    /// [`Record::Remove`]: `name` in `dir`, which names `victim`, goes (an rmdir when the
    /// victim is a directory: ENOTEMPTY unless it is empty). Returns the victim when this
    /// removal was its last hold, or its last link: the caller settles it (frees it, or notes
    /// it as an unlinked file: [`Filesystem::settle`]) once it has dropped its locks, which
    /// neither needs.
    pub(super) fn apply_remove<'g>(
        &self,
        rec: &Record<'_>,
        (dir, d): (&Inode, &DirBody),
        victim: &'g Inode,
        g: &Guard,
    ) -> Result<Option<(&'g Inode, Fate)>> {
        let Record::Remove { name, time, .. } = *rec else {
            unreachable!("apply_remove of {rec:?}")
        };
        let mut fate = Fate::Lives;
        match victim.dir() {
            Some(vd) => {
                let removal =
                    self.dirents
                        .decide_removal((victim.key(), vd), g, &self.stats, || self.commit(rec))?;
                self.dirents
                    .remove(dir.key(), d, name, g, &self.stats, |_| {
                        assert_eq!(dir.dec_nlink(), Fate::Lives, "a parent keeps its links");
                        fate = victim.clear_nlink();
                    })
                    .expect("entry present under its stripe");
                drop(removal); // dead only now that its name is gone (`dir/life.rs`)
            }
            None => {
                self.commit(rec)?;
                self.dirents
                    .remove(dir.key(), d, name, g, &self.stats, |_| {
                        fate = victim.dec_nlink();
                    })
                    .expect("entry present under its stripe");
            }
        }
        victim.attr.set_c(time, &self.stats);
        dir.attr.set_mc(time, &self.stats);
        Ok((fate != Fate::Lives).then_some((victim, fate)))
    }

    /// [`Record::Rename`]: `src` moves from `d1` to `d2` (replacing or exchanging with `dst`
    /// when the target name exists). Every map change, link count and `..` change is made in
    /// one window in which lookups of either name wait (`Dirents::rename_visible`). Returns a
    /// replaced inode whose last hold or last link this was, for the caller to settle as
    /// `apply_remove`'s.
    #[allow(clippy::too_many_arguments)] // two directories, two inodes, the record, the guard
    pub(super) fn apply_rename<'g>(
        &self,
        rec: &Record<'_>,
        (d1, dd1): (&Inode, &DirBody),
        (d2, dd2): (&Inode, &DirBody),
        src: &Inode,
        dst: Option<&'g Inode>,
        g: &Guard,
    ) -> Result<Option<(&'g Inode, Fate)>> {
        let (from_name, to_name, exchange, cookie, time, whiteout) = match *rec {
            Record::Rename {
                from_name,
                to_name,
                exchange,
                cookie,
                time,
                ..
            } => (from_name, to_name, exchange, cookie, time, None),
            Record::RenameWhiteout {
                from_name,
                to_name,
                cookie,
                time,
                whiteout,
                whiteout_cookie,
                whiteout_flags,
                ..
            } => (
                from_name,
                to_name,
                false,
                cookie,
                time,
                Some((whiteout, whiteout_cookie, whiteout_flags)),
            ),
            _ => unreachable!("apply_rename of {rec:?}"),
        };
        let cross = !ptr::eq(d1, d2);
        let (k1, k2) = ((d1.key(), from_name), (d2.key(), to_name));
        // A directory moved to another parent: its `..`.
        let moves_parent = |i: &Inode, to: &Inode| {
            if let (true, Some(id)) = (cross, i.dir()) {
                id.parent
                    .store(to.key().raw(), std::sync::atomic::Ordering::Release);
            }
        };
        // ... and the parents' link counts.
        let moves_dir = |i: &Inode, from: &Inode, to: &Inode| {
            if let (true, Some(_)) = (cross, i.dir()) {
                moves_parent(i, to);
                to.inc_nlink()
                    .expect("link limit above the inode table's capacity");
                assert_eq!(from.dec_nlink(), Fate::Lives, "a parent keeps its links");
            }
        };
        // A whiteout is made ready (its inode counted, its number taken) before the record,
        // installed after it, and takes the source's place in the map in the rename's visible
        // moment, and its cookie and index place with it (`Dirents::heir`). A record from
        // before heirs gives the whiteout a cookie of its own: it is admitted beside the
        // source's entry instead.
        let give_back = |w: &NewInode<'_>| {
            if !self.replaying() {
                self.ids.free(w.id.ino, &self.stats);
            }
        };
        let mut wo = match whiteout {
            None => None,
            Some((w, wcookie, wflags)) => {
                if let Err(e) = self.inode_quota.take(1) {
                    give_back(&w);
                    return Err(e);
                }
                let source = self.dirents.get(d1.key(), from_name, &self.stats);
                let made = match source {
                    Some(de) if de.cookie == wcookie => {
                        Ok(self
                            .dirents
                            .heir(d1.key(), from_name, named_as(&w), wcookie))
                    }
                    _ => self.dirents.admit(
                        (d1.key(), dd1),
                        from_name,
                        named_as(&w),
                        wcookie,
                        g,
                        &self.stats,
                    ),
                };
                match made {
                    Ok(p) => Some((w, wflags, p)),
                    Err(e) => {
                        self.inode_quota.give(1);
                        give_back(&w);
                        return Err(e);
                    }
                }
            }
        };
        let undo = |wo: &mut Option<(NewInode<'_>, u32, Pending)>| {
            if let Some((w, _, p)) = wo.take() {
                self.dirents.cancel(p, dd1, g, &self.stats);
                self.inode_quota.give(1);
                give_back(&w);
            }
        };
        let commit = |wo: &mut Option<(NewInode<'_>, u32, Pending)>| {
            self.commit(rec).inspect_err(|_| undo(wo))
        };
        // The whiteout's inode, in the table once the record is committed, and its entry.
        let install = |wo: Option<(NewInode<'_>, u32, Pending)>| {
            wo.map(|(w, wflags, p)| {
                self.install_new(&w, wflags, Named(d1.key()), u32::from(self.replaying()), g);
                p
            })
        };
        let mut freed = None;
        match dst {
            Some(t) if exchange => {
                debug_assert!(wo.is_none(), "no whiteout with an exchange");
                commit(&mut wo)?;
                self.dirents.rename_visible(
                    k1,
                    dd1,
                    k2,
                    RenameMap::Exchange,
                    None,
                    g,
                    &self.stats,
                    || {
                        if src.is_dir() && t.is_dir() {
                            // Each parent loses one subdirectory and gains one: its link
                            // count does not move (tmpfs leaves both alone), so a racing
                            // getattr never sees it one off.
                            moves_parent(src, d2);
                            moves_parent(t, d1);
                        } else {
                            moves_dir(src, d1, d2);
                            moves_dir(t, d2, d1);
                        }
                    },
                );
                t.attr.set_c(time, &self.stats);
            }
            Some(t) => {
                let r = match t.dir() {
                    Some(td) => self
                        .dirents
                        .decide_removal((t.key(), td), g, &self.stats, || commit(&mut wo))
                        .map(Some),
                    None => commit(&mut wo).map(|()| None),
                };
                let removal = match r {
                    Ok(removal) => removal,
                    Err(e) => {
                        undo(&mut wo);
                        return Err(e);
                    }
                };
                let wp = install(wo);
                self.dirents.rename_visible(
                    k1,
                    dd1,
                    k2,
                    RenameMap::Replace,
                    wp,
                    g,
                    &self.stats,
                    || {
                        moves_dir(src, d1, d2);
                        let fate = if t.is_dir() {
                            assert_eq!(d2.dec_nlink(), Fate::Lives, "a parent keeps its links");
                            t.clear_nlink()
                        } else {
                            t.dec_nlink()
                        };
                        if fate != Fate::Lives {
                            freed = Some((t, fate));
                        }
                    },
                );
                drop(removal); // a replaced directory is dead only now (`dir/life.rs`)
                t.attr.set_c(time, &self.stats);
            }
            None => {
                let pending = match self.dirents.admit(
                    (k2.0, dd2),
                    to_name,
                    src.named_as(),
                    cookie,
                    g,
                    &self.stats,
                ) {
                    Ok(p) => p,
                    Err(e) => {
                        undo(&mut wo);
                        return Err(e);
                    }
                };
                if let Err(e) = commit(&mut wo) {
                    self.dirents.cancel(pending, dd2, g, &self.stats);
                    return Err(e);
                }
                let wp = install(wo);
                let how = RenameMap::Move(pending);
                self.dirents
                    .rename_visible(k1, dd1, k2, how, wp, g, &self.stats, || {
                        moves_dir(src, d1, d2)
                    });
            }
        }
        src.attr.set_c(time, &self.stats);
        d1.attr.set_mc(time, &self.stats);
        if cross {
            d2.attr.set_mc(time, &self.stats);
        }
        Ok(freed)
    }

    /// [`Record::SetAttr`] on the values of `inode`, inside its attribute seqlock; `pages` is
    /// how many pages the file keeps when the size changes. The caller holds the data lock
    /// when the size changes and frees the pages beyond it after. Its times are set exactly,
    /// not advanced ([`Timespec::advance`]): a `SetAttr` carries times chosen under the
    /// seqlock, and loading a checkpoint restores an inode's times with one.
    pub(super) fn apply_attr(v: &mut AttrVals, c: &AttrChange, pages: u64) {
        c.apply(v);
        if c.size.is_some() {
            v.blocks = pages * (PAGE / 512);
        }
    }

    /// [`Record::SetAttr`] as recovery applies it (the live path wraps its checks around
    /// [`Filesystem::apply_attr`] inside the seqlock instead).
    pub(super) fn replay_setattr(&self, rec: &Record<'_>, i: &Inode) -> Result<()> {
        let Record::SetAttr { change, .. } = *rec else {
            unreachable!("replay_setattr of {rec:?}")
        };
        self.commit(rec)?;
        match (change.size, &i.body) {
            (Some(size), Body::File(data)) => {
                let mut d = self.stats.write(crate::stats::LockClass::FileData, data);
                let fetch = |f, b: &mut [u8]| self.fetch_pages(i, f, b);
                let old_size = i.attr.size();
                d.prepare_truncate(size, old_size, &fetch, &self.page_epochs)?;
                let kept = d.pages_after_truncate(size, old_size);
                let _ = i.attr.update::<(), ()>(&self.stats, |v| {
                    Self::apply_attr(v, &change, kept);
                    Ok(())
                });
                let label = self.page_epochs.label();
                self.space
                    .give(d.truncate(size, old_size, label, &self.page_epochs));
            }
            (Some(_), _) => return Err(Errno::EINVAL),
            (None, _) => {
                let _ = i.attr.update::<(), ()>(&self.stats, |v| {
                    Self::apply_attr(v, &change, 0);
                    Ok(())
                });
            }
        }
        Ok(())
    }

    /// [`Record::SetFlags`] on the values `v` of an inode, inside its attribute seqlock (the
    /// live path makes its checks there first; [`Filesystem::replay_flags`] does not).
    pub(super) fn apply_flags(v: &mut AttrVals, rec: &Record<'_>) {
        let Record::SetFlags { flags: f, time, .. } = *rec else {
            unreachable!("apply_flags of {rec:?}")
        };
        effect::flags_set(v, f, time);
    }

    /// [`Record::SetFlags`] as recovery applies it.
    pub(super) fn replay_flags(&self, rec: &Record<'_>, i: &Inode) -> Result<()> {
        i.attr.update(&self.stats, |v| {
            self.commit(rec)?;
            Self::apply_flags(v, rec);
            Ok(())
        })
    }

    /// [`Record::Write`] into the locked data `d` of file `i`, whose pages the caller has
    /// reserved in the space quota.
    pub(super) fn apply_write(&self, i: &Inode, d: &mut FileData, rec: &Record<'_>) {
        let Record::Write {
            offset, data, time, ..
        } = *rec
        else {
            unreachable!("apply_write of {rec:?}")
        };
        d.write(offset, data, self.page_epochs.label(), &self.page_epochs);
        let pages = d.pages();
        let _ = i.attr.update::<(), ()>(&self.stats, |v| {
            effect::contents_changed(v, time, Some(offset + data.len() as u64));
            v.blocks = pages * (PAGE / 512);
            Ok(())
        });
    }

    /// [`Record::Allocate`] and [`Record::Punch`] on the locked data `d` of file `i`; an
    /// allocation's pages are reserved by the caller, a punch gives its freed pages back.
    pub(super) fn apply_fallocate(&self, i: &Inode, d: &mut FileData, rec: &Record<'_>) {
        let (time, size_to) = match *rec {
            Record::Allocate {
                offset,
                len,
                keep_size,
                time,
                ..
            } => {
                d.allocate(offset, len, &self.page_epochs);
                (time, (!keep_size).then_some(offset + len))
            }
            Record::Punch {
                offset, len, time, ..
            } => {
                self.space
                    .give(d.punch(offset, len, self.page_epochs.label(), &self.page_epochs));
                (time, None)
            }
            _ => unreachable!("apply_fallocate of {rec:?}"),
        };
        let pages = d.pages();
        let _ = i.attr.update::<(), ()>(&self.stats, |v| {
            effect::contents_changed(v, time, size_to);
            v.blocks = pages * (PAGE / 512);
            Ok(())
        });
    }

    /// [`Record::SetAcl`] on inode `i`: `change` computes the record from the inode's current
    /// attributes (the live `setxattr` or `removexattr` makes its checks there; `None`:
    /// nothing to do), inside the attribute seqlock, itself inside the xattr shard lock, so
    /// that this record is ordered with every other record that changes the mode (SetAttr,
    /// appended inside the seqlock) and with every other xattr record.
    pub(super) fn apply_acl(
        &self,
        i: &Inode,
        change: impl FnOnce(&AttrVals, Option<&crate::xattr::Xattrs>) -> Result<Option<OwnedAcl>>,
    ) -> Result<()> {
        let mut shard = self.xattrs.lock(i.ino, &self.stats);
        i.attr.update(&self.stats, |v| {
            let Some(a) = change(v, shard.get(&i.ino))? else {
                return Ok(());
            };
            self.commit_acl(i, &mut shard, v, &a)
        })
    }

    /// Commits and applies ACL change `a` to inode `i`, whose xattr shard (`shard`) and
    /// attribute seqlock (`v`: its values) the caller holds.
    pub(super) fn commit_acl(
        &self,
        i: &Inode,
        shard: &mut XattrShard,
        v: &mut AttrVals,
        a: &OwnedAcl,
    ) -> Result<()> {
        self.commit(&Record::SetAcl {
            inode: i.id(),
            default: a.default,
            acl: &a.acl,
            mode: a.mode,
            time: a.time,
        })?;
        let (name, flag) = if a.default {
            (ACL_DEFAULT_NAME, flags::DEFAULT_ACL)
        } else {
            (ACL_ACCESS_NAME, flags::ACL)
        };
        let x = shard.entry(i.ino).or_default();
        if a.acl.is_empty() {
            let _ = x.remove(name);
            v.flags &= !flag;
        } else {
            x.set(name, &a.acl, 0).expect("ACLs fit the xattr limits");
            v.flags |= flag;
        }
        if x.is_empty() {
            shard.remove(&i.ino);
            v.flags &= !flags::XATTRS;
        } else {
            v.flags |= flags::XATTRS;
        }
        effect::acl_set(v, a.mode, a.time);
        Ok(())
    }

    /// [`Record::SetAcl`] as recovery applies it.
    pub(super) fn replay_acl(&self, rec: &Record<'_>, i: &Inode) -> Result<()> {
        let Record::SetAcl {
            default,
            acl,
            mode,
            time,
            ..
        } = *rec
        else {
            unreachable!("replay_acl of {rec:?}")
        };
        self.apply_acl(i, |_, _| {
            Ok(Some(OwnedAcl {
                default,
                acl: acl.to_vec(),
                mode,
                time,
            }))
        })
    }

    /// [`Record::SetXattr`] and [`Record::RemoveXattr`] on inode `i`: `check` sees the
    /// inode's current attributes and extended attributes and may refuse before anything is
    /// committed. The check, the record and the change are made inside the attribute seqlock,
    /// itself inside the xattr shard lock that orders the inode's xattr changes (as
    /// [`Filesystem::apply_acl`]), so that they are one step to a chmod, chown or `chattr`
    /// (which change the attributes inside the seqlock) and to an ACL change (under the
    /// shard): a change checked against attributes a racing change then replaced is refused
    /// or made before that change.
    pub(super) fn apply_xattr(
        &self,
        rec: &Record<'_>,
        i: &Inode,
        check: impl FnOnce(&AttrVals, Option<&crate::xattr::Xattrs>) -> Result<()>,
    ) -> Result<()> {
        let mut shard = self.xattrs.lock(i.ino, &self.stats);
        i.attr.update(&self.stats, |v| {
            check(v, shard.get(&i.ino))?;
            self.commit(rec)?;
            let time = match *rec {
                Record::SetXattr {
                    name, value, time, ..
                } => {
                    shard
                        .entry(i.ino)
                        .or_default()
                        .set(name, value, 0)
                        .expect("checked before the commit");
                    time
                }
                Record::RemoveXattr { name, time, .. } => {
                    let x = shard.get_mut(&i.ino).expect("checked before the commit");
                    x.remove(name).expect("checked before the commit");
                    if x.is_empty() {
                        shard.remove(&i.ino);
                    }
                    time
                }
                _ => unreachable!("apply_xattr of {rec:?}"),
            };
            if shard.contains_key(&i.ino) {
                v.flags |= flags::XATTRS;
            } else {
                v.flags &= !flags::XATTRS;
            }
            effect::status_changed(v, time);
            Ok(())
        })
    }
}

/// An ACL change for [`Filesystem::apply_acl`]: the record's fields, owned.
pub(super) struct OwnedAcl {
    pub default: bool,
    /// Empty removes the ACL.
    pub acl: Vec<u8>,
    pub mode: u32,
    pub time: Timespec,
}

/// The attribute values of a new inode with inode flags `inherited`.
fn new_vals(n: &NewInode<'_>, size: u64, inherited: u32) -> AttrVals {
    let mut f = inherited;
    if !n.access_acl.is_empty() {
        f |= flags::ACL | flags::XATTRS;
    }
    if !n.default_acl.is_empty() {
        f |= flags::DEFAULT_ACL | flags::XATTRS;
    }
    AttrVals {
        mode: n.mode,
        flags: f,
        uid: n.uid,
        gid: n.gid,
        size,
        blocks: 0,
        atime: n.time,
        mtime: n.time,
        ctime: n.time,
    }
}

/// Where a new inode is made.
#[derive(Clone, Copy)]
enum Place {
    /// Named in the directory with this key (a directory's `..`).
    Named(InoGen),
    /// Nowhere (a tmpfile, always a regular file): link count 0.
    Unnamed { linkable: bool },
}
use Place::{Named, Unnamed};

/// The inode a [`NewInode`] describes, with inode flags `inherited`, made at `place` with
/// `refs` references.
/// What an entry naming the inode `n` makes holds: its number and generation, and its type.
fn named_as(n: &NewInode<'_>) -> (InoGen, FileType) {
    let kind = FileType::from_mode(n.mode).expect("records carry valid types");
    (n.id.key(), kind)
}

fn new_inode(n: &NewInode<'_>, inherited: u32, place: Place, refs: u32) -> Inode {
    let kind = FileType::from_mode(n.mode).expect("records carry valid types");
    let parent = match place {
        Named(dir) => dir,
        Unnamed { .. } => InoGen::ROOT, // never read: a tmpfile is no directory
    };
    let (body, size, nlink) = match kind {
        FileType::RegularFile => (Body::File(Default::default()), 0, 1),
        FileType::Directory => (Body::Dir(DirBody::new(parent)), 0, 2),
        FileType::Symlink => (Body::Symlink(n.target.into()), n.target.len() as u64, 1),
        _ => (Body::Special { rdev: n.rdev }, 0, 1),
    };
    let attr = AttrCell::new(new_vals(n, size, inherited));
    match place {
        Named(_) => Inode::new(n.id, nlink, refs, attr, body),
        Unnamed { linkable } => {
            debug_assert_eq!(
                kind,
                FileType::RegularFile,
                "records make tmpfiles plain files"
            );
            Inode::new_unnamed(n.id, refs, linkable, attr, body)
        }
    }
}

/// The root directory a new filesystem starts with, before any record.
pub(super) fn new_root(mode: u32, uid: u32, gid: u32, refs: u32) -> Inode {
    let n = NewInode {
        id: crate::id::InodeId::ROOT,
        mode: libc::S_IFDIR | (mode & 0o7777),
        uid,
        gid,
        rdev: 0,
        target: b"",
        time: Timespec::now(),
        access_acl: b"",
        default_acl: b"",
    };
    Inode::new(
        n.id,
        2,
        refs,
        AttrCell::new(new_vals(&n, 0, 0)),
        Body::Dir(DirBody::new(crate::id::InoGen::ROOT)),
    )
}
