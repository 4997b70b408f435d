//! The whole filesystem as a map of paths ([`dump`]) and the comparison of two such maps
//! ([`assert_same_tree`]): what the tests that rebuild, reopen or recover a filesystem check
//! it by. Shared by the engine's tests (`mod.rs`), the store's (`store/tests/common`) and the
//! mount's.

#![allow(dead_code)]

use std::collections::BTreeMap;

use lanefs::{Ctx, FileType, Filesystem, Generation, Ino, ROOT_INO, Timespec};

/// Everything a tree shows of one name (what `dump` returns, keyed by path): compared by
/// tests that rebuild a filesystem from its records.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub ino: Ino,
    pub generation: Generation,
    pub cookie: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub rdev: u64,
    pub blocks: u64,
    pub times: Option<[Timespec; 3]>,
    /// The birth time, with the times (and `None` where the inode has none).
    pub born: Option<Timespec>,
    /// `chattr` flags.
    pub flags: Option<u32>,
    pub content: Vec<u8>,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// The readdir cookie (offset) of `name` in directory `dir`, from a listing that leaves the
/// directory's atime alone.
pub fn cookie_of(fs: &Filesystem, dir: Ino, name: &[u8]) -> u64 {
    let ctx = Ctx::root();
    let fh = fs.opendir_flags(&ctx, dir, libc::O_NOATIME).unwrap();
    let mut found = None;
    fs.readdir(&ctx, fh, 0, false, |e, _| {
        if e.name == name {
            found = Some(e.offset);
        }
        true
    })
    .unwrap();
    fs.releasedir(fh).unwrap();
    found.unwrap_or_else(|| panic!("{} not listed in {dir}", String::from_utf8_lossy(name)))
}

pub fn dump(fs: &Filesystem, with_times: bool) -> BTreeMap<Vec<u8>, Node> {
    let ctx = Ctx::root();
    let mut out = BTreeMap::new();
    let mut stack = vec![(b"/".to_vec(), ROOT_INO, 0u64)];
    while let Some((path, ino, cookie)) = stack.pop() {
        let a = fs.getattr(ino).unwrap();
        let content = match a.kind() {
            FileType::RegularFile => {
                let fh = fs
                    .open(&ctx, ino, libc::O_RDONLY | libc::O_NOATIME)
                    .unwrap();
                let mut buf = vec![0u8; a.size as usize];
                let n = fs.read(fh, 0, &mut buf).unwrap();
                fs.release(fh).unwrap();
                buf.truncate(n);
                buf
            }
            FileType::Symlink => fs.readlink(ino).unwrap(),
            _ => Vec::new(),
        };
        let names = fs.listxattr(&ctx, ino).unwrap();
        let xattrs = names
            .split(|&b| b == 0)
            .filter(|n| !n.is_empty())
            .map(|n| (n.to_vec(), fs.getxattr(&ctx, ino, n).unwrap()))
            .collect();
        if a.kind() == FileType::Directory {
            let fh = fs.opendir_flags(&ctx, ino, libc::O_NOATIME).unwrap();
            fs.readdir(&ctx, fh, 0, false, |e, _| {
                if e.name != b"." && e.name != b".." {
                    let mut p = path.clone();
                    if p.len() > 1 {
                        p.push(b'/');
                    }
                    p.extend_from_slice(e.name);
                    stack.push((p, e.ino, e.offset));
                }
                true
            })
            .unwrap();
            fs.releasedir(fh).unwrap();
        }
        out.insert(
            path,
            Node {
                ino: a.ino,
                generation: a.generation,
                cookie,
                mode: a.mode,
                uid: a.uid,
                gid: a.gid,
                nlink: a.nlink,
                size: a.size,
                rdev: a.rdev,
                blocks: a.blocks,
                times: with_times.then_some([a.atime, a.mtime, a.ctime]),
                born: a.btime.filter(|_| with_times),
                flags: fs.get_flags(ino).ok(),
                content,
                xattrs,
            },
        );
    }
    out
}

/// A `system.posix_acl_access` value: owner rw-, user `uid` with `p`, owning group r--, mask
/// `mask`, other ---.
pub fn named_user_acl(uid: u32, p: u16, mask: u16) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (1u16, 6u16, u32::MAX),
        (2, p, uid),
        (4, 4, u32::MAX),
        (0x10, mask, u32::MAX),
        (0x20, 0, u32::MAX),
    ] {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

/// A whole tree, as [`dump`] gives it.
pub type Tree = BTreeMap<Vec<u8>, Node>;

/// How many names [`tree_diff`] shows at most.
const SHOWN: usize = 8;

/// A node for a message: its contents by length and checksum, not byte by byte.
fn show(n: &Node) -> String {
    let mut m = n.clone();
    let content = std::mem::take(&mut m.content);
    let sum = content.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    format!("{m:?}, content {} bytes, fnv {sum:016x}", content.len())
}

/// What differs between two trees, a few lines a name (the first [`SHOWN`] names): the
/// names only one has, and for the others both nodes and where their contents first differ.
pub fn tree_diff(want: &Tree, got: &Tree) -> String {
    let mut out = Vec::new();
    let mut differ = 0;
    let names: std::collections::BTreeSet<&Vec<u8>> = want.keys().chain(got.keys()).collect();
    for p in names {
        let (w, g) = (want.get(p), got.get(p));
        if w == g {
            continue;
        }
        differ += 1;
        if differ > SHOWN {
            continue;
        }
        let name = String::from_utf8_lossy(p);
        match (w, g) {
            (Some(w), Some(g)) => {
                let at = w.content.iter().zip(&g.content).position(|(a, b)| a != b);
                out.push(format!(
                    "{name}: differs (contents first differ at byte {at:?})\n  want {}\n  got  {}",
                    show(w),
                    show(g)
                ));
            }
            (Some(w), None) => out.push(format!("{name}: missing; want {}", show(w))),
            (None, Some(g)) => out.push(format!("{name}: not wanted; got {}", show(g))),
            (None, None) => unreachable!(),
        }
    }
    if differ > SHOWN {
        out.push(format!("... {} more names differ", differ - SHOWN));
    }
    out.join("\n")
}

/// Fails, saying `what` and [`tree_diff`], unless `got` is `want`.
#[track_caller]
pub fn assert_same_tree(what: &str, want: &Tree, got: &Tree) {
    if want != got {
        panic!("{what}: the trees differ:\n{}", tree_diff(want, got));
    }
}
