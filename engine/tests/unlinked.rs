//! The space and inode of an unlinked file come back as soon as the kernel no longer holds
//! it, not at its FORGET (issue 35, item 2: xfstests generic/213, `fallocate -l 1g a;
//! fallocate -l 1g b; rm a b; fallocate -l 1g c` on a 2 GiB filesystem failed with ENOSPC
//! until the FORGETs arrived). The kernel is played by a sink that says which inodes it
//! still holds (`fs/unlinked.rs`: the engine asks it); a file it holds (open through the
//! mount) and one a library handle holds keep their data.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use lanefs::notify::Invalidate;
use lanefs::*;

const GIB: u64 = 1 << 30;

/// The kernel's inode cache: it holds every inode but those it evicted.
#[derive(Default)]
struct KernelCache {
    evicted: Mutex<HashSet<Ino>>,
    asked: Mutex<Vec<Ino>>,
}

impl KernelCache {
    fn evict(&self, ino: Ino) {
        self.evicted.lock().unwrap().insert(ino);
    }
}

impl Invalidate for KernelCache {
    fn entry(&self, _: Ino, _: &[u8]) -> bool {
        true
    }

    fn inode(&self, ino: Ino, data: Option<(u64, u64)>) -> bool {
        if data.is_none() {
            self.asked.lock().unwrap().push(ino);
        }
        !self.evicted.lock().unwrap().contains(&ino)
    }

    fn listing(&self, _: Ino) -> bool {
        true
    }
}

fn used(fs: &Filesystem) -> (u64, u64) {
    let s = fs.statfs();
    (s.blocks - s.bfree, s.files - s.ffree)
}

#[test]
fn unlinked_files_the_kernel_let_go_give_their_room_back_before_their_forget() {
    let fs = Filesystem::new(Config {
        max_bytes: Some(2 * GIB),
        ..Config::default()
    });
    let kernel = Arc::new(KernelCache::default());
    fs.set_invalidator(Some(kernel.clone()));
    let k = Ctx::root().via_kernel();
    let pages = GIB / PAGE;
    let (base_blocks, base_files) = used(&fs);
    // As the mount makes them: MKNOD (a lookup reference), a FALLOCATE by inode.
    let mut made = Vec::new();
    for name in [&b"a"[..], b"b"] {
        let a = fs
            .mknod(&k, ROOT_INO, name, libc::S_IFREG | 0o644, 0)
            .unwrap();
        fs.fallocate_inode(&k, a.ino, 0, 0, GIB).unwrap();
        fs.setxattr(&k, a.ino, b"user.x", b"1", 0).unwrap();
        made.push(a.ino);
    }
    assert_eq!(used(&fs), (base_blocks + 2 * pages, base_files + 2));
    let c = fs
        .mknod(&k, ROOT_INO, b"c", libc::S_IFREG | 0o644, 0)
        .unwrap();
    assert_eq!(
        fs.fallocate_inode(&k, c.ino, 0, 0, GIB),
        Err(Errno::ENOSPC),
        "the filesystem is full"
    );
    assert_eq!(fs.reap_unlinked(), 0, "nothing unlinked");
    // `rm a b`: the kernel evicts each inode before its unlink returns, and its FORGET
    // comes later.
    for (name, &ino) in [&b"a"[..], b"b"].into_iter().zip(&made) {
        fs.unlink(&k, ROOT_INO, name).unwrap();
        kernel.evict(ino);
    }
    // The FUSE server, given ENOSPC, has the engine ask the kernel, then tries again.
    assert_eq!(fs.fallocate_inode(&k, c.ino, 0, 0, GIB), Err(Errno::ENOSPC));
    assert_eq!(fs.reap_unlinked(), 2);
    fs.fallocate_inode(&k, c.ino, 0, 0, GIB).unwrap();
    // The inodes stay for the kernel until it forgets them: link count 0, no blocks;
    // anything else is ESTALE (the kernel walks a path again).
    for &ino in &made {
        let a = fs.getattr(ino).unwrap();
        assert_eq!((a.nlink, a.blocks), (0, 0));
        assert_eq!(fs.open(&k, ino, libc::O_RDONLY), Err(Errno::ESTALE));
        assert_eq!(fs.getxattr(&k, ino, b"user.x"), Err(Errno::ESTALE));
        assert_eq!(fs.listxattr(&k, ino), Err(Errno::ESTALE));
    }
    assert_eq!(used(&fs), (base_blocks + pages, base_files + 1));
    fs.check_invariants().unwrap();
    for ino in made {
        fs.forget(ino, 1);
        assert_eq!(fs.getattr(ino), Err(Errno::ENOENT));
    }
    assert_eq!(used(&fs), (base_blocks + pages, base_files + 1));
    fs.check_invariants().unwrap();

    // A file the kernel still holds (open through the mount) keeps its data, and so does
    // one a library handle holds; `statfs` (`df`) asks, and finds them held.
    let d = fs
        .mknod(&k, ROOT_INO, b"d", libc::S_IFREG | 0o644, 0)
        .unwrap();
    fs.write_inode(&k, d.ino, 0, b"still here").unwrap();
    let lfh = fs.open(&Ctx::root(), d.ino, libc::O_RDONLY).unwrap();
    let before = used(&fs);
    fs.unlink(&k, ROOT_INO, b"d").unwrap();
    assert_eq!(used(&fs), before, "held by the kernel: still there");
    let mut buf = [0u8; 10];
    assert_eq!(fs.read_inode(d.ino, 0, &mut buf), Ok(10));
    assert_eq!(&buf, b"still here");
    kernel.evict(d.ino); // its last close
    assert_eq!(used(&fs), before, "the library's handle keeps it");
    assert_eq!(fs.read(lfh, 0, &mut buf), Ok(10));
    fs.release(lfh).unwrap();
    assert_eq!(
        used(&fs),
        (before.0 - 1, before.1 - 1),
        "gone at its last handle"
    );
    assert_eq!(
        fs.getattr(d.ino).map(|a| a.nlink),
        Ok(0),
        "until the FORGET"
    );
    fs.forget(d.ino, 1);
    fs.check_invariants().unwrap();

    // Nothing is asked when nothing is unlinked.
    kernel.asked.lock().unwrap().clear();
    used(&fs);
    assert!(kernel.asked.lock().unwrap().is_empty());
}

/// Without a sink (no mount), nothing is asked and the kernel's references keep a file until
/// its FORGET, as before.
#[test]
fn without_a_mount_lookups_keep_an_unlinked_file_until_its_forget() {
    let fs = Filesystem::new(Config::default());
    let k = Ctx::root().via_kernel();
    let a = fs
        .mknod(&k, ROOT_INO, b"a", libc::S_IFREG | 0o644, 0)
        .unwrap();
    fs.write_inode(&k, a.ino, 0, b"x").unwrap();
    fs.unlink(&k, ROOT_INO, b"a").unwrap();
    assert_eq!(fs.reap_unlinked(), 0);
    assert_eq!(used(&fs), (1, 2));
    fs.forget(a.ino, 1);
    assert_eq!(used(&fs), (0, 1));
}
