//! The invariant checker: a whole-namespace consistency check for tests (and, later, fsck).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering::Acquire;

use crossbeam_epoch as epoch;

use super::Filesystem;
use crate::attr::{Ino, ROOT_INO};
use crate::dir::FIRST_COOKIE;
use crate::inode::{Body, DIR_ALIVE, Inode};

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

impl Filesystem {
    /// Checks every invariant of the namespace and returns counts, or a list of violations.
    /// Meant for quiescent moments (no operation running): concurrent changes show up as
    /// false violations.
    ///
    /// Checked: every entry names a live inode of the right generation from a live directory,
    /// and has its twin in the ordered index (same cookie, same name) and vice versa; entry
    /// counts per directory; every inode's link count equals the names it has (directories:
    /// 2 + subdirectories); every directory but the root has exactly one name, in the
    /// directory its `..` points to; every linked inode is reachable from the root and the
    /// tree has no cycle; unlinked inodes are kept only by references; the inode and space
    /// counters match the inodes and pages that exist.
    pub fn check_invariants(&self) -> Result<CheckReport, String> {
        let g = epoch::pin();
        let mut errs: Vec<String> = Vec::new();
        let mut inodes: HashMap<Ino, &Inode> = HashMap::new();
        self.table.for_each(&g, |i| {
            inodes.insert(i.ino(), i);
        });
        let mut entries: Vec<(Ino, Vec<u8>, u64, u64)> = Vec::new();
        self.dirents
            .for_each(|p, n, de| entries.push((p, n.to_vec(), de.ino_gen, de.cookie)));
        let mut indexed: HashMap<(Ino, u64), Vec<u8>> = HashMap::new();
        self.dirents.for_each_indexed(|p, c, n| {
            indexed.insert((p, c), n.to_vec());
        });

        let mut names_of: HashMap<Ino, Vec<(Ino, Vec<u8>)>> = HashMap::new();
        let mut per_dir: HashMap<Ino, u64> = HashMap::new();
        let mut subdirs: HashMap<Ino, u64> = HashMap::new();
        for (p, n, ino_gen, cookie) in &entries {
            let shown = String::from_utf8_lossy(n);
            match inodes.get(p) {
                Some(d) if d.is_dir() => {
                    let dd = d.dir().expect("dir");
                    if dd.life.load(Acquire) != DIR_ALIVE {
                        errs.push(format!("entry {p}/{shown} in a removed directory"));
                    }
                    if *cookie < FIRST_COOKIE
                        || dd.slot_mask.load(Acquire) & (1 << ((cookie >> 48) - 1)) == 0
                    {
                        errs.push(format!(
                            "entry {p}/{shown}: cookie {cookie:#x} outside the slot mask"
                        ));
                    }
                }
                _ => errs.push(format!("entry {p}/{shown}: parent is not a live directory")),
            }
            match self.table.get_gen(*ino_gen, &g) {
                Some(c) if !c.is_dead() => {
                    names_of.entry(c.ino()).or_default().push((*p, n.clone()));
                    if c.is_dir() {
                        *subdirs.entry(*p).or_default() += 1;
                    }
                }
                _ => errs.push(format!(
                    "entry {p}/{shown}: inode {ino_gen:#x} missing or dead"
                )),
            }
            match indexed.get(&(*p, *cookie)) {
                Some(iname) if iname == n => {}
                other => errs.push(format!(
                    "entry {p}/{shown}: index holds {other:?} at its cookie"
                )),
            }
            *per_dir.entry(*p).or_default() += 1;
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
        for (&ino, &i) in &inodes {
            if i.is_dead() {
                errs.push(format!("inode {ino} dead but still in the table"));
                continue;
            }
            let names = names_of.get(&ino).map_or(0, Vec::len) as u32;
            match &i.body {
                Body::Dir(d) => {
                    dirs += 1;
                    let alive = d.life.load(Acquire) == DIR_ALIVE;
                    let want = if alive {
                        2 + *subdirs.get(&ino).unwrap_or(&0) as u32
                    } else {
                        0
                    };
                    if i.nlink() != want {
                        errs.push(format!(
                            "dir {ino}: nlink {} but {} expected",
                            i.nlink(),
                            want
                        ));
                    }
                    let counted = self.dirents.count(ino, d, &self.stats);
                    if counted != *per_dir.get(&ino).unwrap_or(&0) {
                        errs.push(format!(
                            "dir {ino}: count {counted} but {} entries",
                            per_dir.get(&ino).unwrap_or(&0)
                        ));
                    }
                    if ino != ROOT_INO && alive {
                        match names_of.get(&ino).map(Vec::as_slice) {
                            Some([(p, _)]) => {
                                let pp = d.parent.load(Acquire);
                                if crate::inode::ino_of(pp) != *p {
                                    errs.push(format!(
                                        "dir {ino}: '..' is {} but it lives in {p}",
                                        crate::inode::ino_of(pp)
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
        let mut seen: HashSet<Ino> = HashSet::from([ROOT_INO]);
        let mut children: HashMap<Ino, Vec<Ino>> = HashMap::new();
        for (p, _, ino_gen, _) in &entries {
            children
                .entry(*p)
                .or_default()
                .push(crate::inode::ino_of(*ino_gen));
        }
        let mut stack = vec![ROOT_INO];
        while let Some(d) = stack.pop() {
            for &c in children.get(&d).map(Vec::as_slice).unwrap_or(&[]) {
                let is_dir = inodes.get(&c).is_some_and(|i| i.is_dir());
                if seen.insert(c) {
                    if is_dir {
                        stack.push(c);
                    }
                } else if is_dir {
                    errs.push(format!("dir {c} reached twice: a cycle or a second name"));
                }
            }
        }
        for (&ino, &i) in &inodes {
            if !i.is_dead() && i.nlink() > 0 && !seen.contains(&ino) {
                errs.push(format!("inode {ino} linked but unreachable from the root"));
            }
        }

        let live = inodes.values().filter(|i| !i.is_dead()).count() as u64;
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
