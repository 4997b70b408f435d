//! The invariant checker: a whole-namespace consistency check, for tests and `lanefs fsck`.

use std::collections::{HashMap, HashSet};

use crossbeam_epoch as epoch;

use super::Filesystem;
use crate::attr::{FileType, flags};
use crate::dir::FIRST_COOKIE;
use crate::id::{Ino, InoGen};
use crate::inode::{Body, Inode};

/// What [`Filesystem::check_invariants`] counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CheckReport {
    /// Inodes in the table.
    pub inodes: u64,
    /// Directories among them.
    pub dirs: u64,
    /// Directory entries.
    pub entries: u64,
}

/// One entry of the dirent map.
struct MapEntry {
    parent: InoGen,
    name: Vec<u8>,
    target: InoGen,
    kind: FileType,
    cookie: u64,
}

impl Filesystem {
    /// Checks every invariant of the namespace and returns counts, or a list of violations.
    /// Meant for quiescent moments (no operation running): concurrent changes show up as
    /// false violations.
    ///
    /// Checked: every entry names a live inode of the right generation and type from a live
    /// directory, and has its twin in that directory's ordered index (same cookie, same name)
    /// and vice versa; entry counts per directory; every inode's link count equals the names it has
    /// (directories: 2 + subdirectories); every directory but the root has exactly one name,
    /// in the directory its `..` names; no entry lives in a removed directory; every linked
    /// inode is reachable from the root and the tree has no cycle; unlinked inodes are kept
    /// only by references, and only a nameless regular file (a tmpfile) may be linkable; the
    /// inode, space and xattr bookkeeping matches what exists; the flags word holds known
    /// flags only, and 'i' or 'a' only on a regular file or directory.
    ///
    /// A lazily loaded filesystem (`lazy.rs`) is loaded whole first.
    pub fn check_invariants(&self) -> Result<CheckReport, String> {
        // The whole namespace in the table while it is walked.
        let _hold = self.hold_eviction();
        self.load_all()
            .map_err(|e| format!("loading the whole namespace: {e}"))?;
        let g = epoch::pin();
        let mut errs: Vec<String> = Vec::new();
        let mut inodes: HashMap<InoGen, &Inode> = HashMap::new();
        self.table.for_each(&g, |i| {
            inodes.insert(i.key(), i);
        });
        let mut entries: Vec<MapEntry> = Vec::new();
        self.dirents.for_each(|parent, name, de| {
            entries.push(MapEntry {
                parent,
                name: name.to_vec(),
                target: de.target,
                kind: de.kind,
                cookie: de.cookie,
            })
        });
        let mut indexed: HashMap<(InoGen, u64), Vec<u8>> = HashMap::new();
        for (&k, i) in &inodes {
            if let Some(d) = i.dir() {
                self.dirents.for_each_indexed(k, d, &g, |c, n| {
                    indexed.insert((k, c), n.to_vec());
                });
            }
        }

        let mut names_of: HashMap<InoGen, Vec<(InoGen, Vec<u8>)>> = HashMap::new();
        let mut per_dir: HashMap<InoGen, u64> = HashMap::new();
        let mut subdirs: HashMap<InoGen, u64> = HashMap::new();
        for e in &entries {
            let (p, shown) = (e.parent.ino(), String::from_utf8_lossy(&e.name));
            match inodes.get(&e.parent).and_then(|d| d.dir()) {
                Some(dd) => {
                    if dd.life.is_dead() {
                        errs.push(format!("entry {p}/{shown} in a removed directory"));
                    }
                    if e.cookie < FIRST_COOKIE {
                        errs.push(format!("entry {p}/{shown}: cookie {:#x}", e.cookie));
                    }
                }
                None => errs.push(format!("entry {p}/{shown}: parent is not a live directory")),
            }
            match inodes.get(&e.target) {
                Some(c) if !c.is_dead() => {
                    if c.kind() != e.kind {
                        errs.push(format!(
                            "entry {p}/{shown}: says {:?}, inode {:?} is a {:?}",
                            e.kind,
                            e.target,
                            c.kind()
                        ));
                    }
                    names_of
                        .entry(e.target)
                        .or_default()
                        .push((e.parent, e.name.clone()));
                    if c.is_dir() {
                        *subdirs.entry(e.parent).or_default() += 1;
                    }
                }
                _ => errs.push(format!(
                    "entry {p}/{shown}: inode {:?} missing or dead",
                    e.target
                )),
            }
            match indexed.get(&(e.parent, e.cookie)) {
                Some(iname) if *iname == e.name => {}
                other => errs.push(format!(
                    "entry {p}/{shown}: index holds {other:?} at its cookie"
                )),
            }
            *per_dir.entry(e.parent).or_default() += 1;
        }
        if indexed.len() != entries.len() {
            errs.push(format!(
                "{} index entries for {} map entries",
                indexed.len(),
                entries.len()
            ));
        }

        let mut pages = 0u64;
        let mut dirs = 0u64;
        let mut with_xattrs = 0usize;
        for (&k, &i) in &inodes {
            let ino = i.ino;
            if i.is_dead() {
                errs.push(format!("inode {ino} dead but still in the table"));
                continue;
            }
            let v = i.attr.load();
            let f = v.flags;
            let known = flags::XATTRS | flags::ACL | flags::DEFAULT_ACL | flags::USER;
            if f & !known != 0 {
                errs.push(format!("inode {ino}: unknown flag bits {:#x}", f & !known));
            }
            // 'i' and 'a' are set only by `set_flags`, which takes regular files and
            // directories; other inodes inherit only 'd' and 'A'.
            if f & flags::FROZEN != 0 && !matches!(i.body, Body::File(_) | Body::Dir(_)) {
                errs.push(format!("inode {ino}: 'i' or 'a' on a {:?}", i.kind()));
            }
            if f & flags::XATTRS != 0 {
                with_xattrs += 1;
                if !self.xattrs.lock(ino, &self.stats).contains_key(&ino) {
                    errs.push(format!("inode {ino} flagged with xattrs it does not have"));
                }
            }
            for (flag, name) in [
                (flags::ACL, crate::acl::ACL_ACCESS_NAME),
                (flags::DEFAULT_ACL, crate::acl::ACL_DEFAULT_NAME),
            ] {
                let shard = self.xattrs.lock(ino, &self.stats);
                let stored = shard.get(&ino).and_then(|x| x.get(name));
                if (f & flag != 0) != stored.is_some() {
                    errs.push(format!(
                        "inode {ino}: ACL flag {} but {} stored",
                        f & flag != 0,
                        String::from_utf8_lossy(name)
                    ));
                }
                match stored.map(crate::acl::Acl::parse) {
                    Some(Err(_)) => errs.push(format!("inode {ino}: invalid ACL stored")),
                    // The owner, group-class and other entries of an access ACL are the
                    // mode's permission bits.
                    Some(Ok(a)) if flag == flags::ACL && a.mode_bits() != v.mode & 0o777 => {
                        errs.push(format!("inode {ino}: access ACL {a} but mode {:o}", v.mode))
                    }
                    _ => {}
                }
            }
            // Only a tmpfile that never had a name may get its first one.
            if i.is_linkable() && (i.nlink() != 0 || !matches!(i.body, Body::File(_))) {
                errs.push(format!(
                    "inode {ino}: linkable as a tmpfile but a {:?} with {} links",
                    i.kind(),
                    i.nlink()
                ));
            }
            let names = names_of.get(&k).map_or(0, Vec::len) as u32;
            match &i.body {
                Body::Dir(d) => {
                    dirs += 1;
                    let alive = !d.life.is_dead();
                    let want = if alive {
                        2 + *subdirs.get(&k).unwrap_or(&0) as u32
                    } else {
                        0
                    };
                    if i.nlink() != want {
                        errs.push(format!(
                            "dir {ino}: nlink {} but {want} expected",
                            i.nlink()
                        ));
                    }
                    let counted = self.dirents.count(d, &g);
                    if counted != *per_dir.get(&k).unwrap_or(&0) {
                        errs.push(format!(
                            "dir {ino}: count {counted} but {} entries",
                            per_dir.get(&k).unwrap_or(&0)
                        ));
                    }
                    if ino != Ino::ROOT && alive {
                        match names_of.get(&k).map(Vec::as_slice) {
                            Some([(p, _)]) => {
                                if d.parent() != *p {
                                    errs.push(format!(
                                        "dir {ino}: '..' is {:?} but it lives in {p:?}",
                                        d.parent()
                                    ));
                                }
                            }
                            other => errs
                                .push(format!("dir {ino}: names {other:?}, expected exactly one")),
                        }
                    }
                    if !alive && names > 0 {
                        errs.push(format!("removed dir {ino} still has {names} names"));
                    }
                }
                body => {
                    if i.nlink() != names {
                        errs.push(format!(
                            "inode {ino}: nlink {} but {names} names",
                            i.nlink()
                        ));
                    }
                    if let Body::File(data) = body {
                        pages += data.read().pages();
                    }
                }
            }
        }

        // Reachability and acyclicity: a walk from the root over entries.
        let mut seen: HashSet<InoGen> = HashSet::from([InoGen::ROOT]);
        let mut children: HashMap<InoGen, Vec<InoGen>> = HashMap::new();
        for e in &entries {
            children.entry(e.parent).or_default().push(e.target);
        }
        let mut stack = vec![InoGen::ROOT];
        while let Some(d) = stack.pop() {
            for &c in children.get(&d).map(Vec::as_slice).unwrap_or(&[]) {
                let is_dir = inodes.get(&c).is_some_and(|i| i.is_dir());
                if seen.insert(c) {
                    if is_dir {
                        stack.push(c);
                    }
                } else if is_dir {
                    errs.push(format!("dir {c:?} reached twice: a cycle or a second name"));
                }
            }
        }
        for (k, &i) in &inodes {
            if !i.is_dead() && i.nlink() > 0 && !seen.contains(k) {
                errs.push(format!(
                    "inode {} linked but unreachable from the root",
                    i.ino
                ));
            }
        }

        // An emptied inode (`inode.rs`, `EMPTIED`) gave its count back already.
        let live = inodes
            .values()
            .filter(|i| !i.is_dead() && !i.is_emptied())
            .count() as u64;
        if self.inode_quota.used() != live {
            errs.push(format!(
                "inode counter {} but {live} inodes",
                self.inode_quota.used()
            ));
        }
        if self.space.used() != pages {
            errs.push(format!(
                "space counter {} pages but files hold {pages}",
                self.space.used()
            ));
        }
        if self.xattrs.len() != with_xattrs {
            errs.push(format!(
                "xattr table holds {} inodes but {with_xattrs} are flagged",
                self.xattrs.len()
            ));
        }
        if errs.is_empty() {
            Ok(CheckReport {
                inodes: live,
                dirs,
                entries: entries.len() as u64,
            })
        } else {
            errs.truncate(20);
            Err(errs.join("\n"))
        }
    }
}
