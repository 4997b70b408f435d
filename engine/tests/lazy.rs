//! A lazily loaded namespace (`fs/lazy.rs`, `Filesystem::recover_lazy`).
//!
//! A model store ([`ModelStore`]) serves a snapshot of a real filesystem, taken through the
//! public API ([`export`]): every inode as `load_inode` gives it, every directory's entries
//! as `load_entries` gives them (each with its inode unless it is a directory), and file
//! bytes through `read_pages`. It counts its loads per number, so that the tests can hold
//! the engine to its promises: the open loads the root alone; an inode is loaded the first
//! time it is reached, a directory with its entries and their files; the store's copy of a
//! number is loaded at most once (however many threads miss on it at once); a freed inode is
//! never loaded again; fresh numbers come from above the store's highest; and the tree served
//! is the tree exported, names, cookies, numbers, generations, attributes, data, xattrs,
//! ACLs and flags included, in every locking mode; and records made after the snapshot
//! replay onto it.
//!
//! The last tests reproduce engine bugs found here (a directory load that fails halfway
//! leaves its first entries in the dirent map, so the next load panics; a name twice in a
//! directory panics instead of EIO; a directory listing itself as a file hangs its load);
//! each one's doc says what goes wrong and where.
//!
//! Seeds are printed; `LANEFS_SEED=<n>` replays a run's random choices.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::{Arc, Barrier, Mutex, mpsc};
use std::time::Duration;

use common::{Tree, assert_same_tree, dump, named_user_acl};
use lanefs::*;
use rand::{Rng, SeedableRng, rngs::StdRng};

const ACCESS: &[u8] = b"system.posix_acl_access";
const DEFAULT: &[u8] = b"system.posix_acl_default";
/// Numbers above the snapshot's highest that the store still claims (holes at the top).
const SLACK: u64 = 9;

fn root() -> Ctx {
    Ctx::root()
}

fn cfg(locking: Locking) -> Config {
    Config {
        locking,
        max_bytes: Some(256 << 20),
        ..Config::default()
    }
}

fn errno(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

/// Runs `f` on a thread of its own and fails if it takes longer than `secs` (a deadlock).
fn deadline<T: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::Builder::new()
        .name(what.into())
        .spawn(move || {
            let r = f();
            let _ = tx.send(());
            r
        })
        .unwrap();
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(()) => h.join().unwrap(),
        Err(mpsc::RecvTimeoutError::Disconnected) => match h.join() {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what}: not done after {secs} s (a deadlock?)")
        }
    }
}

// ----- the snapshot and the store ---------------------------------------------------------------

/// A filesystem as a store that loads lazily holds it.
#[derive(Clone, Debug, Default)]
struct Snapshot {
    inodes: HashMap<u64, LoadedInode>,
    entries: HashMap<u64, Vec<LoadedEntry>>,
    /// Regular files' bytes (their size), by number.
    data: HashMap<u64, Vec<u8>>,
    /// Every path (`/` first), with the inode it names.
    paths: BTreeMap<String, InodeId>,
    /// Each directory's parent, by number.
    parents: HashMap<u64, InodeId>,
    highest: u64,
    max_gen: u64,
    cookies: Vec<u64>,
}

impl Snapshot {
    fn id(&self, path: &str) -> InodeId {
        *self
            .paths
            .get(path)
            .unwrap_or_else(|| panic!("{path} not in the snapshot"))
    }
    fn has(&self, id: InodeId) -> bool {
        self.inodes.get(&id.ino.0).is_some_and(|l| l.id == id)
    }
    fn is_dir(&self, ino: u64) -> bool {
        self.inodes
            .get(&ino)
            .is_some_and(|l| l.mode & libc::S_IFMT == libc::S_IFDIR)
    }
    fn max_ino(&self) -> u64 {
        self.highest + SLACK
    }
    /// What `recover_lazy` is told the store holds: inodes, and pages of file data.
    fn counts(&self) -> (u64, u64) {
        let pages = self
            .inodes
            .values()
            .map(|l| l.pages.len() as u64 + l.zeros.iter().map(|z| z.1 - z.0).sum::<u64>())
            .sum();
        (self.inodes.len() as u64, pages)
    }
}

/// Serves a [`Snapshot`] and counts what it is asked.
struct ModelStore {
    snap: Arc<Snapshot>,
    delay: Duration,
    inode_loads: Mutex<HashMap<u64, u64>>,
    entry_loads: Mutex<HashMap<u64, u64>>,
    page_reads: AtomicU64,
    appends: AtomicU64,
    /// Loads running now, and the most that ran at once.
    running: AtomicU64,
    most_at_once: AtomicU64,
    /// What no engine should ask.
    faults: Mutex<Vec<String>>,
    /// A number whose next `load_inode` fails (EIO), once directory `fail_after` was served
    /// (0: none); `failing` is set while that load runs.
    fail_ino: AtomicU64,
    fail_after: AtomicU64,
    failing: AtomicBool,
    served: Mutex<HashSet<u64>>,
}

impl ModelStore {
    fn new(snap: Arc<Snapshot>, delay: Duration) -> ModelStore {
        ModelStore {
            snap,
            delay,
            inode_loads: Default::default(),
            entry_loads: Default::default(),
            page_reads: AtomicU64::new(0),
            appends: AtomicU64::new(0),
            running: AtomicU64::new(0),
            most_at_once: AtomicU64::new(0),
            faults: Default::default(),
            fail_ino: AtomicU64::new(0),
            fail_after: AtomicU64::new(0),
            failing: AtomicBool::new(false),
            served: Default::default(),
        }
    }

    fn fault(&self, s: String) {
        eprintln!("store fault: {s}");
        self.faults.lock().unwrap().push(s);
    }

    /// A load's time in the store, during which other threads may miss on the same number.
    fn pause(&self) {
        let now = self.running.fetch_add(1, SeqCst) + 1;
        self.most_at_once.fetch_max(now, SeqCst);
        if self.delay.is_zero() {
            std::thread::yield_now();
        } else {
            std::thread::sleep(self.delay);
        }
        self.running.fetch_sub(1, SeqCst);
    }

    fn inode_counts(&self) -> HashMap<u64, u64> {
        self.inode_loads.lock().unwrap().clone()
    }
    fn entry_counts(&self) -> HashMap<u64, u64> {
        self.entry_loads.lock().unwrap().clone()
    }

    /// Every number's inode and every directory's entries were asked for at most once, and
    /// nothing was asked that no engine should ask.
    #[track_caller]
    fn assert_each_loaded_once(&self, what: &str) {
        let twice: Vec<_> = self
            .inode_counts()
            .into_iter()
            .filter(|&(_, n)| n > 1)
            .collect();
        assert!(
            twice.is_empty(),
            "{what}: load_inode more than once: {twice:?}"
        );
        let twice: Vec<_> = self
            .entry_counts()
            .into_iter()
            .filter(|&(_, n)| n > 1)
            .collect();
        assert!(
            twice.is_empty(),
            "{what}: load_entries more than once: {twice:?}"
        );
        let f = self.faults.lock().unwrap();
        assert!(
            f.is_empty(),
            "{what}: the store was asked what it should not be: {f:?}"
        );
    }
}

impl Store for ModelStore {
    fn append(&self, _rec: &Record<'_>) -> Result<()> {
        self.appends.fetch_add(1, Relaxed);
        Ok(())
    }
    fn sync(&self) -> Result<()> {
        Ok(())
    }
    fn durable(&self) -> bool {
        false
    }
    fn read_pages(&self, inode: InodeId, first: u64, buf: &mut [u8]) -> Result<()> {
        self.page_reads.fetch_add(1, Relaxed);
        let n = buf.len() as u64 / PAGE;
        let ok = buf.len() as u64 % PAGE == 0
            && self.snap.has(inode)
            && (first..first + n).all(|p| self.snap.inodes[&inode.ino.0].pages.contains(&p));
        if !ok {
            self.fault(format!("read_pages({inode}, {first}, {n} pages): not kept"));
            return Err(Errno::EIO);
        }
        let data = &self.snap.data[&inode.ino.0];
        let at = (first * PAGE) as usize;
        for (i, b) in buf.iter_mut().enumerate() {
            *b = data.get(at + i).copied().unwrap_or(0);
        }
        Ok(())
    }
    fn load_inode(&self, ino: Ino) -> Result<Option<LoadedInode>> {
        *self.inode_loads.lock().unwrap().entry(ino.0).or_default() += 1;
        if ino.0 > self.snap.max_ino() || ino.0 == 0 {
            self.fault(format!("load_inode({ino}): beyond the store's numbers"));
        }
        if ino.0 != 0
            && self
                .fail_ino
                .compare_exchange(ino.0, 0, SeqCst, SeqCst)
                .is_ok()
        {
            // A read error, met while the directory holding it is being loaded.
            self.failing.store(true, SeqCst);
            let dir = self.fail_after.load(SeqCst);
            for _ in 0..500 {
                if self.served.lock().unwrap().contains(&dir) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            std::thread::sleep(Duration::from_millis(200));
            return Err(Errno::EIO);
        }
        self.pause();
        Ok(self.snap.inodes.get(&ino.0).cloned())
    }
    fn load_entries(&self, dir: Ino, files: u64) -> Result<Vec<LoadedEntry>> {
        *self.entry_loads.lock().unwrap().entry(dir.0).or_default() += 1;
        if !self.snap.is_dir(dir.0) {
            self.fault(format!("load_entries({dir}): not a directory"));
        }
        self.pause();
        self.served.lock().unwrap().insert(dir.0);
        let mut entries = self.snap.entries.get(&dir.0).cloned().unwrap_or_default();
        if entries.len() as u64 <= files {
            for e in &mut entries {
                if e.kind != FileType::Directory && e.inode.is_none() {
                    e.inode = self.snap.inodes.get(&e.target.ino.0).cloned();
                }
            }
        }
        Ok(entries)
    }
}

/// A filesystem recovered lazily from `snap`, as a store that holds it would open it: its
/// highest generation and its cookies are observed, nothing else is loaded.
fn open_lazy(
    snap: &Arc<Snapshot>,
    cfg: Config,
    delay: Duration,
) -> (Arc<Filesystem>, Arc<ModelStore>) {
    let store = Arc::new(ModelStore::new(snap.clone(), delay));
    let mut r =
        Filesystem::recover_lazy(cfg, store.clone(), snap.max_ino(), snap.counts()).unwrap();
    r.observe_generation(Generation(snap.max_gen));
    for &c in &snap.cookies {
        r.observe_cookie(c).unwrap();
    }
    (Arc::new(r.finish().unwrap()), store)
}

// ----- exporting a filesystem ---------------------------------------------------------------------

fn join(dir: &str, name: &[u8]) -> String {
    let name = String::from_utf8(name.to_vec()).unwrap();
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

fn read_all(fs: &Filesystem, ino: Ino, size: u64) -> Vec<u8> {
    let fh = fs
        .open(&root(), ino, libc::O_RDONLY | libc::O_NOATIME)
        .unwrap();
    let mut buf = vec![0u8; size as usize];
    let n = fs.read(fh, 0, &mut buf).unwrap();
    fs.release(fh).unwrap();
    buf.truncate(n);
    assert_eq!(n as u64, size);
    buf
}

/// Inode `a` as the store keeps it (a file's bytes go to `data`).
fn loaded_of(
    fs: &Filesystem,
    a: &Attr,
    parent: InodeId,
    data: &mut HashMap<u64, Vec<u8>>,
) -> LoadedInode {
    let c = root();
    let ino = a.ino;
    let (mut xattrs, mut access_acl, mut default_acl) = (Vec::new(), Vec::new(), Vec::new());
    let names = fs.listxattr(&c, ino).unwrap();
    for n in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let v = fs.getxattr(&c, ino, n).unwrap();
        match n {
            ACCESS => access_acl = v,
            DEFAULT => default_acl = v,
            _ => xattrs.push((n.to_vec(), v)),
        }
    }
    let target = match a.kind() {
        FileType::Symlink => fs.readlink(ino).unwrap(),
        _ => Vec::new(),
    };
    let (mut pages, mut zeros) = (Vec::new(), Vec::<(u64, u64)>::new());
    if a.kind() == FileType::RegularFile {
        let bytes = read_all(fs, ino, a.size);
        let mut allocated = Vec::new();
        let mut off = 0;
        while off < a.size {
            match fs.seek_data_hole(ino, off, libc::SEEK_DATA) {
                Ok(d) => {
                    let h = fs.seek_data_hole(ino, d, libc::SEEK_HOLE).unwrap();
                    allocated.extend(d / PAGE..h.div_ceil(PAGE));
                    off = h;
                }
                Err(Errno::ENXIO) => break,
                Err(e) => panic!("seek_data {ino}: {e:?}"),
            }
        }
        for p in allocated {
            let from = (p * PAGE) as usize;
            let to = ((p + 1) * PAGE).min(a.size) as usize;
            if bytes[from..to].iter().all(|&b| b == 0) {
                match zeros.last_mut() {
                    Some(r) if r.1 == p => r.1 = p + 1,
                    _ => zeros.push((p, p + 1)),
                }
            } else {
                pages.push(p);
            }
        }
        let counted = pages.len() as u64 + zeros.iter().map(|r| r.1 - r.0).sum::<u64>();
        assert_eq!(
            counted * (PAGE / 512),
            a.blocks,
            "export of file {ino}: the allocated pages found are not its blocks"
        );
        data.insert(ino.0, bytes);
    }
    LoadedInode {
        id: InodeId {
            ino,
            generation: a.generation,
        },
        mode: a.mode,
        uid: a.uid,
        gid: a.gid,
        nlink: a.nlink,
        rdev: a.rdev,
        size: a.size,
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        btime: a.btime,
        flags: a.flags,
        target,
        // A directory's (a file's is not kept: it may have several).
        parent: if a.kind() == FileType::Directory {
            parent
        } else {
            InodeId::ROOT
        },
        xattrs,
        access_acl,
        default_acl,
        pages,
        zeros,
    }
}

/// The whole of `fs` as a lazily loading store keeps it (`fs` must be quiescent).
fn export(fs: &Filesystem) -> Snapshot {
    let c = root();
    let mut s = Snapshot::default();
    let ra = fs.getattr(ROOT_INO).unwrap();
    let root_l = loaded_of(fs, &ra, InodeId::ROOT, &mut s.data);
    s.inodes.insert(ROOT_INO.0, root_l);
    s.paths.insert("/".into(), InodeId::ROOT);
    s.parents.insert(ROOT_INO.0, InodeId::ROOT);
    let mut queue = vec![("/".to_string(), InodeId::ROOT)];
    while let Some((path, id)) = queue.pop() {
        let fh = fs.opendir_flags(&c, id.ino, libc::O_NOATIME).unwrap();
        let mut list = Vec::new();
        fs.readdir(&c, fh, 0, false, |e, _| {
            if e.name != b"." && e.name != b".." {
                list.push((e.name.to_vec(), e.offset, e.ino));
            }
            true
        })
        .unwrap();
        fs.releasedir(fh).unwrap();
        let dotdot = fs.lookup(&c, id.ino, b"..").unwrap();
        assert_eq!(dotdot.ino, s.parents[&id.ino.0].ino, "{path}/..");
        let mut entries = Vec::new();
        for (name, cookie, cino) in list {
            let a = fs.getattr(cino).unwrap();
            let cid = InodeId {
                ino: a.ino,
                generation: a.generation,
            };
            let is_dir = a.kind() == FileType::Directory;
            let l = loaded_of(fs, &a, id, &mut s.data);
            let p = join(&path, &name);
            s.paths.insert(p.clone(), cid);
            s.cookies.push(cookie);
            if is_dir {
                s.parents.insert(a.ino.0, id);
                queue.push((p.clone(), cid));
            }
            if let Some(old) = s.inodes.insert(a.ino.0, l.clone()) {
                assert_eq!(old, l, "{p}: a hard link exported twice differently");
            }
            entries.push(LoadedEntry {
                name,
                cookie,
                target: cid,
                kind: a.kind(),
                inode: None,
            });
        }
        s.entries.insert(id.ino.0, entries);
    }
    s.highest = *s.inodes.keys().max().unwrap();
    s.max_gen = s.inodes.values().map(|l| l.id.generation.0).max().unwrap();
    s
}

// ----- the tree ---------------------------------------------------------------------------------

/// Workers of `changes_racing_the_loads_keep_the_invariants`, each with an area of its own.
const AREAS: usize = 4;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
        .collect()
}

/// Builds the tree every test exports: every kind of inode, data with holes and allocated
/// zeros, hard links across directories, xattrs, ACLs, flags, set times, a whiteout, holes
/// in the inode numbers, and areas for the tests' threads.
fn build_tree(c: &Client) {
    let fs = c.fs().clone();
    let ctx = root();
    for d in [
        "/a",
        "/a/b",
        "/a/b/c",
        "/x",
        "/x/y",
        "/empty",
        "/acl",
        "/wide",
        "/d1",
        "/d1/emptydir",
        "/d1/full",
        "/hl",
        "/hl2",
        "/n",
    ] {
        c.create_dir(d).unwrap();
    }
    // Holes in the inode numbers: made and removed.
    for i in 0..7 {
        c.write(format!("/gone{i}"), b"x").unwrap();
    }
    c.write("/a/b/c/deep.txt", b"deep").unwrap();
    c.write("/a/b/big", pattern(3 * PAGE as usize + 123, 1))
        .unwrap();
    {
        let f = c
            .open("/a/sparse", OpenOptions::new().write(true).create(true))
            .unwrap();
        f.write_at(b"tail", 5 * PAGE + 100).unwrap();
        f.write_at(b"head", 10).unwrap();
    }
    {
        let f = c
            .open("/a/zeros", OpenOptions::new().write(true).create(true))
            .unwrap();
        fs.fallocate(&ctx, f.handle(), 0, 0, 3 * PAGE).unwrap();
        f.write_at(b"mid", PAGE + 7).unwrap();
    }
    c.write("/a/b/hard", b"shared bytes").unwrap();
    c.hard_link("/a/b/hard", "/x/y/hard2").unwrap();
    c.hard_link("/a/b/hard", "/hard3").unwrap();
    c.symlink("a/b/big", "/sym").unwrap();
    c.symlink("/nowhere/at/all", "/a/b/c/dangling").unwrap();
    c.mknod("/fifo", libc::S_IFIFO | 0o640, 0).unwrap();
    c.mknod("/x/chr", libc::S_IFCHR | 0o600, libc::makedev(1, 3))
        .unwrap();
    c.mknod("/x/blk", libc::S_IFBLK | 0o660, libc::makedev(8, 1))
        .unwrap();
    c.mknod("/x/sock", libc::S_IFSOCK | 0o644, 0).unwrap();
    let ino = |p: &str| c.symlink_metadata(p).unwrap().ino();
    fs.setxattr(&ctx, ino("/a/b/big"), b"user.color", b"blue", 0)
        .unwrap();
    fs.setxattr(&ctx, ino("/a/b/big"), b"user.size", &[7u8; 300], 0)
        .unwrap();
    fs.setxattr(&ctx, ino("/x"), b"user.empty", b"", 0).unwrap();
    fs.setxattr(&ctx, ino("/a"), b"user.k", b"dir value", 0)
        .unwrap();
    fs.setxattr(
        &ctx,
        ino("/a/b/big"),
        ACCESS,
        &named_user_acl(1000, 6, 6),
        0,
    )
    .unwrap();
    fs.setxattr(&ctx, ino("/acl"), DEFAULT, &named_user_acl(1000, 7, 7), 0)
        .unwrap();
    fs.setxattr(&ctx, ino("/acl"), ACCESS, &named_user_acl(1001, 5, 5), 0)
        .unwrap();
    // Made under a default ACL: inherits one.
    c.write("/acl/inherits", b"i").unwrap();
    c.create_dir("/acl/sub").unwrap();
    c.set_permissions("/a/b/c/deep.txt", 0o4755).unwrap();
    c.chown("/x/y", Some(1000), Some(1000)).unwrap();
    c.chown("/a/b/c/deep.txt", Some(7), Some(8)).unwrap();
    c.set_times(
        "/a/b/c/deep.txt",
        Some(TimeSet::At(Timespec::new(1_234_567, 89))),
        Some(TimeSet::At(Timespec::new(7_654_321, 0))),
    )
    .unwrap();
    c.set_flags("/a/b/c/deep.txt", FS_NODUMP_FL).unwrap();
    c.set_flags("/x", FS_NOATIME_FL | FS_NODUMP_FL).unwrap();
    c.write("/x/inherited", b"flags from /x").unwrap();
    c.write("/frozen", b"ice").unwrap();
    c.set_flags("/frozen", FS_IMMUTABLE_FL).unwrap();
    c.write("/appendonly", b"log\n").unwrap();
    c.set_flags("/appendonly", FS_APPEND_FL).unwrap();
    c.write("/wsrc", b"w").unwrap();
    c.rename_with_flags("/wsrc", "/x/wdst", RENAME_WHITEOUT)
        .unwrap();
    // Many names in a few directories (the miss storms').
    for i in 0..80 {
        c.write(format!("/wide/w{i}"), format!("w{i}")).unwrap();
    }
    for j in 0..6 {
        c.create_dir(format!("/wide/s{j}")).unwrap();
        for i in 0..15 {
            c.write(format!("/wide/s{j}/f{i}"), pattern(i * 700, j as u8))
                .unwrap();
        }
        c.hard_link(format!("/wide/w{j}"), format!("/wide/s{j}/link"))
            .unwrap();
    }
    let mut p = "/n".to_string();
    for i in 0..8 {
        p = format!("{p}/{i}");
        c.create_dir(&p).unwrap();
        c.write(format!("{p}/leaf"), format!("level {i}")).unwrap();
    }
    // The freed-inode test's.
    c.write("/d1/victim", b"victim").unwrap();
    c.write("/d1/victim2", b"victim2").unwrap();
    c.write("/d1/openme", pattern(2 * PAGE as usize, 9))
        .unwrap();
    c.write("/d1/full/x", b"x").unwrap();
    c.write("/hl/a", b"two names").unwrap();
    c.hard_link("/hl/a", "/hl2/b").unwrap();
    // The racing test's areas.
    for k in 0..AREAS {
        let t = format!("/t{k}");
        for d in [
            "",
            "/a",
            "/a/sub",
            "/a/sub/inner",
            "/b",
            "/c",
            "/d",
            "/e",
            "/g",
            "/g/h",
            "/g/h/deep",
        ] {
            c.create_dir(format!("{t}{d}")).unwrap();
        }
        for i in 0..10 {
            c.write(format!("{t}/a/f{i}"), format!("{t}/a/f{i} ").repeat(i + 1))
                .unwrap();
        }
        for i in 0..5 {
            c.write(format!("{t}/a/sub/g{i}"), format!("g{i}")).unwrap();
            c.write(format!("{t}/b/f{i}"), format!("{t}/b/f{i}"))
                .unwrap();
        }
        for i in 0..3 {
            c.write(format!("{t}/a/sub/inner/h{i}"), format!("h{i}"))
                .unwrap();
        }
        c.write(format!("{t}/d/x"), b"x").unwrap();
        c.write(format!("{t}/g/h/deep/leaf"), b"leaf").unwrap();
        c.write(format!("{t}/g/other"), b"other").unwrap();
    }
    for k in 0..AREAS {
        c.hard_link(
            format!("/t{k}/a/f9"),
            format!("/t{}/b/peer{k}", (k + 1) % AREAS),
        )
        .unwrap();
    }
    // Last, so that no later inode takes their numbers.
    for i in 0..7 {
        c.remove_file(format!("/gone{i}")).unwrap();
    }
}

/// A filesystem with the tree, and its snapshot.
fn original(locking: Locking) -> (Arc<Filesystem>, Arc<Snapshot>) {
    let fs = Arc::new(Filesystem::new(cfg(locking)));
    build_tree(&Client::root(fs.clone()));
    fs.check_invariants().unwrap();
    let snap = export(&fs);
    (fs, Arc::new(snap))
}

/// A tree with the numbers, generations and cookies of inodes the snapshot does not hold
/// left out (new inodes get other numbers in each filesystem), and every cookie left out
/// (names made or renamed get new ones).
fn projection(t: &Tree, snap: &Snapshot) -> Tree {
    t.iter()
        .map(|(p, n)| {
            let mut n = n.clone();
            let id = InodeId {
                ino: n.ino,
                generation: n.generation,
            };
            if !snap.has(id) {
                n.ino = Ino(0);
                n.generation = Generation(0);
            }
            n.cookie = 0;
            (p.clone(), n)
        })
        .collect()
}

/// Every directory's `..` names the directory it was found in.
fn check_dotdot(fs: &Filesystem) {
    let c = root();
    let mut stack = vec![(ROOT_INO, ROOT_INO, "/".to_string())];
    while let Some((ino, parent, path)) = stack.pop() {
        let dd = fs.lookup(&c, ino, b"..").unwrap();
        assert_eq!(dd.ino, parent, "{path}/.. is {} not {parent}", dd.ino);
        let fh = fs.opendir_flags(&c, ino, libc::O_NOATIME).unwrap();
        fs.readdir(&c, fh, 0, false, |e, _| {
            if e.name != b"." && e.name != b".." && e.kind == FileType::Directory {
                stack.push((e.ino, ino, join(&path, e.name)));
            }
            true
        })
        .unwrap();
        fs.releasedir(fh).unwrap();
    }
}

// ----- a: the tree --------------------------------------------------------------------------------

fn lazily_loaded_tree_is_the_tree(locking: Locking) {
    let (orig, snap) = original(locking);
    let want = dump(&orig, true);
    let (fs, store) = open_lazy(&snap, cfg(locking), Duration::ZERO);
    let c = Client::root(fs.clone());

    // The open loaded the root and its files, nothing else.
    assert_eq!(
        store.inode_counts(),
        HashMap::from([(1, 1)]),
        "open: load_inode"
    );
    assert_eq!(
        store.entry_counts(),
        HashMap::from([(1, 1)]),
        "open: load_entries"
    );
    let root_files = snap.entries[&1]
        .iter()
        .filter(|e| e.kind != FileType::Directory)
        .count() as u64;
    assert_eq!(fs.loaded_inodes(), 1 + root_files, "open: inodes loaded");
    // What the store holds is counted from the start.
    assert_eq!(
        orig.statfs().ffree,
        fs.statfs().ffree,
        "open: inodes counted"
    );
    assert_eq!(
        orig.statfs().bfree,
        fs.statfs().bfree,
        "open: space counted"
    );

    // A path walk loads the directories on its way (with their files), nothing beside.
    let m = c.metadata("/n/0/1/2").unwrap();
    assert_eq!(m.ino(), snap.id("/n/0/1/2").ino);
    let on_the_way: HashSet<u64> = ["/", "/n", "/n/0", "/n/0/1", "/n/0/1/2"]
        .iter()
        .map(|p| snap.id(p).ino.0)
        .collect();
    let loaded: HashSet<u64> = store.entry_counts().into_keys().collect();
    assert_eq!(loaded, on_the_way, "directories a walk of /n/0/1/2 loaded");
    assert_eq!(
        store.inode_counts().into_keys().collect::<HashSet<u64>>(),
        on_the_way,
        "inodes a walk of /n/0/1/2 loaded"
    );

    // A file reached by number is loaded alone, its directory not.
    let id = snap.id("/wide/s3/f4");
    let a = fs.getattr(id.ino).unwrap();
    assert_eq!((a.ino, a.generation), (id.ino, id.generation));
    assert_eq!(a.size, 4 * 700);
    assert_eq!(store.inode_counts().get(&id.ino.0), Some(&1));
    assert!(
        !store
            .entry_counts()
            .contains_key(&snap.id("/wide/s3").ino.0)
    );
    // A directory reached by number is loaded with its entries, its parent not.
    let s2 = snap.id("/wide/s2");
    let a = fs.lookup(&root(), s2, b"f3").unwrap();
    assert_eq!(a.ino, snap.id("/wide/s2/f3").ino);
    assert_eq!(store.entry_counts().get(&s2.ino.0), Some(&1));
    assert!(!store.entry_counts().contains_key(&snap.id("/wide").ino.0));
    // A number the store holds no inode for: ENOENT, and never asked again.
    let hole = (2..snap.highest)
        .find(|n| !snap.inodes.contains_key(n))
        .expect("holes in the numbers");
    assert_eq!(fs.getattr(Ino(hole)).err(), Some(Errno::ENOENT));
    assert_eq!(fs.getattr(Ino(hole)).err(), Some(Errno::ENOENT));
    assert_eq!(store.inode_counts().get(&hole), Some(&1));
    // Beyond the store's numbers: never asked.
    assert_eq!(
        fs.getattr(Ino(snap.max_ino() + 1)).err(),
        Some(Errno::ENOENT)
    );

    let got = dump(&fs, true);
    assert_same_tree("the lazily loaded tree", &want, &got);
    // The data came from the store, page by page.
    assert!(
        store.page_reads.load(Relaxed) > 0,
        "no page read from the store"
    );
    fs.check_invariants()
        .unwrap_or_else(|e| panic!("lazily loaded: {e}"));
    store.assert_each_loaded_once("the whole tree");
    assert_eq!(
        fs.loaded_inodes(),
        snap.inodes.len() as u64,
        "every inode loaded once"
    );
    assert_eq!(orig.statfs().ffree, fs.statfs().ffree, "inodes counted");
    assert_eq!(orig.statfs().bfree, fs.statfs().bfree, "space counted");
    check_dotdot(&fs);
    // And the loaded tree is a working one: a change on top of loaded data.
    c.write("/a/b/c/new", b"fresh").unwrap();
    let f = c.open("/a/b/big", OpenOptions::new().write(true)).unwrap();
    f.write_at(b"XY", PAGE - 1).unwrap();
    drop(f);
    let mut want_big = snap.data[&snap.id("/a/b/big").ino.0].clone();
    want_big[PAGE as usize - 1..PAGE as usize + 1].copy_from_slice(b"XY");
    assert_eq!(c.read("/a/b/big").unwrap(), want_big);
    assert!(c.metadata("/a/b/c/new").unwrap().ino().0 > snap.max_ino());
    fs.check_invariants().unwrap();
}

/// A plain listing tells each entry's type from the entry: it loads the directory listed,
/// never a subdirectory it names; and with no room in the inode cache for the directory's
/// files, none of those either (what made a cold scan of a store with a bounded cache load
/// every file of every directory it listed, and evict them again before their turn).
#[test]
fn a_listing_reads_no_inode_it_names() {
    deadline(60, "listing", || {
        let (_orig, snap) = original(Locking::Lanes);
        let wide = snap.id("/wide").ino.0;
        let want: Vec<(Vec<u8>, Ino, FileType)> = snap.entries[&wide]
            .iter()
            .map(|e| {
                let l = &snap.inodes[&e.target.ino.0];
                let kind = FileType::from_mode(l.mode).unwrap();
                (e.name.clone(), e.target.ino, kind)
            })
            .collect();
        let dirs: Vec<u64> = want
            .iter()
            .filter(|w| w.2 == FileType::Directory)
            .map(|w| w.1.0)
            .collect();
        assert!(
            dirs.len() > 1 && want.len() > 64,
            "/wide: {} entries",
            want.len()
        );
        let small = Config {
            inode_cache: Some(64 * INODE_BYTES),
            ..cfg(Locking::Lanes)
        };
        for config in [cfg(Locking::Lanes), small] {
            let bounded = config.inode_cache.is_some();
            let (fs, store) = open_lazy(&snap, config, Duration::ZERO);
            let c = Client::root(fs.clone());
            c.metadata("/wide").unwrap();
            let loaded = fs.loaded_inodes();
            let got: Vec<_> = c
                .read_dir("/wide")
                .unwrap()
                .into_iter()
                .map(|e| (e.name, e.ino, e.kind))
                .collect();
            assert_eq!(got, want, "a listing of /wide (bounded: {bounded})");
            assert_eq!(
                fs.loaded_inodes(),
                loaded,
                "the listing loaded (bounded: {bounded})"
            );
            for d in &dirs {
                assert!(
                    !store.entry_counts().contains_key(d),
                    "directory {d} loaded"
                );
                assert!(
                    !store.inode_counts().contains_key(d),
                    "directory {d} loaded"
                );
            }
            if bounded {
                // No room for /wide's files: it loaded alone, and a file loads when reached.
                let w = want.iter().find(|w| w.2 == FileType::RegularFile).unwrap();
                let path = format!("/wide/{}", String::from_utf8_lossy(&w.0));
                assert_eq!(c.metadata(&path).unwrap().ino(), w.1);
                assert_eq!(fs.loaded_inodes(), loaded + 1, "a stat of {path}");
                assert_eq!(store.inode_counts().get(&w.1.0), Some(&1));
            }
            fs.check_invariants()
                .unwrap_or_else(|e| panic!("after the listing (bounded: {bounded}): {e}"));
        }
    });
}

#[test]
fn a_lazily_loaded_tree_is_the_tree() {
    deadline(120, "tree", || {
        lazily_loaded_tree_is_the_tree(Locking::Lanes)
    });
}

// ----- b: threads missing on one directory ------------------------------------------------------

fn miss_storm(locking: Locking, threads: usize, delay: Duration) {
    let (orig, snap) = original(locking);
    let want = dump(&orig, true);
    let (fs, store) = open_lazy(&snap, cfg(locking), delay);
    // Every name under /wide and /n, none loaded yet.
    let targets: Vec<(String, InodeId)> = snap
        .paths
        .iter()
        .filter(|(p, _)| p.starts_with("/wide/") || p.starts_with("/n/"))
        .map(|(p, id)| (p.clone(), *id))
        .collect();
    assert!(targets.len() > 150);
    for (_, id) in &targets {
        assert!(!store.inode_counts().contains_key(&id.ino.0));
    }
    let barrier = Arc::new(Barrier::new(threads));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    std::thread::scope(|s| {
        for t in 0..threads {
            let (fs, snap, targets, barrier, errors) = (
                fs.clone(),
                snap.clone(),
                &targets,
                barrier.clone(),
                errors.clone(),
            );
            s.spawn(move || {
                let c = Client::root(fs.clone());
                let n = targets.len();
                // Each starts elsewhere, half of them backwards.
                let order: Vec<usize> = (0..n)
                    .map(|i| {
                        let i = (i + t * 37) % n;
                        if t % 2 == 1 { n - 1 - i } else { i }
                    })
                    .collect();
                barrier.wait();
                for i in order {
                    let (path, id) = &targets[i];
                    let parent = path.rsplit_once('/').unwrap().0;
                    let name = path.rsplit_once('/').unwrap().1.as_bytes();
                    let got = match t % 4 {
                        // A path walk.
                        0 => c.symlink_metadata(path).map(|m| m.attr).map_err(errno),
                        // A lookup in the parent, reached by number.
                        1 => fs
                            .lookup(&root(), snap.id(parent).ino, name)
                            .map_err(|e| e.0),
                        // The inode itself by number, beside the loads of its directory.
                        2 => fs.getattr(id.ino).map_err(|e| e.0),
                        // By number and generation.
                        _ => fs.lookup_inode(&root(), *id).map_err(|e| e.0),
                    };
                    let l = &snap.inodes[&id.ino.0];
                    match got {
                        Ok(a)
                            if a.ino == id.ino
                                && a.generation == id.generation
                                && a.mode == l.mode
                                && a.nlink == l.nlink
                                && (a.size == l.size || a.kind() == FileType::Directory) => {}
                        other => errors
                            .lock()
                            .unwrap()
                            .push(format!("thread {t}: {path}: {other:?}")),
                    }
                    if t % 4 == 0 && l.mode & libc::S_IFMT == libc::S_IFREG {
                        // O_NOATIME: the trees are compared with their times after.
                        let read = c
                            .open(
                                path,
                                OpenOptions::new().read(true).custom_flags(libc::O_NOATIME),
                            )
                            .and_then(|mut f| {
                                let mut b = Vec::new();
                                std::io::Read::read_to_end(&mut f, &mut b).map(|_| b)
                            });
                        match read {
                            Ok(b) if b == snap.data[&id.ino.0] => {}
                            other => errors
                                .lock()
                                .unwrap()
                                .push(format!("thread {t}: read {path}: {other:?}")),
                        }
                    }
                }
            });
        }
    });
    let errors = errors.lock().unwrap();
    assert!(
        errors.is_empty(),
        "{} wrong answers: {:?}",
        errors.len(),
        &errors[..errors.len().min(10)]
    );
    store.assert_each_loaded_once("the miss storm");
    eprintln!(
        "  {locking:?}: {} inode loads, {} directory loads, at most {} at once",
        store.inode_counts().len(),
        store.entry_counts().len(),
        store.most_at_once.load(SeqCst)
    );
    let got = dump(&fs, true);
    assert_same_tree("after the miss storm", &want, &got);
    fs.check_invariants().unwrap();
    store.assert_each_loaded_once("the miss storm and the dump");
}

#[test]
fn threads_missing_on_one_directory_load_it_once() {
    deadline(300, "storm", || {
        miss_storm(Locking::Lanes, 16, Duration::from_micros(300));
        miss_storm(Locking::Lanes, 16, Duration::ZERO);
    });
}

// ----- c: changes racing the loads --------------------------------------------------------------

/// One change (or look) by a worker, with paths relative to its area.
#[derive(Clone, Debug)]
enum WOp {
    Write(String, Vec<u8>),
    Mkdir(String),
    Rmdir(String),
    Unlink(String),
    Rename(String, String, u32),
    Link(String, String),
    Chmod(String, u32),
    Stat(String),
    ReadDir(String),
}

type Outcome = std::result::Result<String, i32>;

fn run_op(c: &Client, area: &str, op: &WOp) -> Outcome {
    let p = |r: &str| {
        if r.is_empty() {
            area.to_string()
        } else {
            format!("{area}/{r}")
        }
    };
    let unit = |r: std::io::Result<()>| r.map(|()| String::new()).map_err(errno);
    match op {
        WOp::Write(a, d) => unit(c.write(p(a), d)),
        WOp::Mkdir(a) => unit(c.create_dir(p(a))),
        WOp::Rmdir(a) => unit(c.remove_dir(p(a))),
        WOp::Unlink(a) => unit(c.remove_file(p(a))),
        WOp::Rename(a, b, f) => unit(c.rename_with_flags(p(a), p(b), *f)),
        WOp::Link(a, b) => unit(c.hard_link(p(a), p(b))),
        WOp::Chmod(a, m) => unit(c.set_permissions(p(a), *m)),
        WOp::Stat(a) => c
            .symlink_metadata(p(a))
            .map(|m| format!("{:o} {}", m.mode(), if m.is_dir() { 0 } else { m.len() }))
            .map_err(errno),
        WOp::ReadDir(a) => c
            .read_dir(p(a))
            .map(|v| {
                let mut n: Vec<String> = v
                    .into_iter()
                    .map(|e| String::from_utf8(e.name).unwrap())
                    .collect();
                n.sort();
                n.join(",")
            })
            .map_err(errno),
    }
}

/// Worker `k`'s changes: first the ones that meet directories not loaded yet, then random
/// ones among its own names (never touching another area's, so that its results do not
/// depend on the others').
fn worker_ops(k: usize, seed: u64, random: usize) -> Vec<WOp> {
    use WOp::*;
    let s = |x: &str| x.to_string();
    let mut ops = vec![
        // A directory nothing loaded yet, moved to another directory.
        Rename(s("a/sub"), s("b/sub"), 0),
        // Directories not loaded yet, not empty: refused.
        Rmdir(s("d")),
        Rename(s("c"), s("d"), 0),
        Rmdir(s("g")),
        // Over an empty directory not loaded yet.
        Rename(s("b/sub/inner"), s("e"), 0),
        Rmdir(s("c")),
        // A deep directory not loaded yet, moved up.
        Rename(s("g/h"), s("a/h"), 0),
        Stat(s("a/h/deep/leaf")),
        Stat(s("a/h/..")),
        // One name of a file with another in the next area.
        Unlink(s("a/f9")),
        Link(s("a/f0"), s("b/f0link")),
        Link(s("b/f1"), s("a/f1link")),
        Rename(s("a/f2"), s("b/f2moved"), 0),
        Rename(s("a/f3"), s("b/f3"), 0),
        Rename(s("a"), s("b"), RENAME_EXCHANGE),
        ReadDir(s("a")),
        ReadDir(s("b")),
    ];
    if k % 2 == 0 {
        // The other name of the previous area's f9: freed once both are gone.
        ops.push(Unlink(format!("b/peer{}", (k + AREAS - 1) % AREAS)));
    }
    let mut rng = StdRng::seed_from_u64(seed ^ (k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let dirs = [
        "", "a", "b", "b/sub", "a/sub", "a/h", "nd0", "nd1", "nd0/nd2", "e",
    ];
    let leaves = [
        "n0", "n1", "n2", "n3", "n4", "n5", "f0", "f1", "f2", "f3", "f4", "f5", "f6", "g0", "g1",
        "f0link",
    ];
    let pick = |rng: &mut StdRng, v: &[&str]| v[rng.random_range(0..v.len())].to_string();
    let leaf = |rng: &mut StdRng| {
        let d = pick(rng, &dirs);
        let l = pick(rng, &leaves);
        if d.is_empty() { l } else { format!("{d}/{l}") }
    };
    let sub = |rng: &mut StdRng| {
        let d = pick(rng, &dirs[1..]);
        let l = pick(rng, &["nd0", "nd1", "nd2", "nd3"]);
        format!("{d}/{l}")
    };
    for _ in 0..random {
        let op = match rng.random_range(0..16) {
            0..=2 => Write(
                leaf(&mut rng),
                vec![b'a' + k as u8; rng.random_range(0..9000)],
            ),
            3 => Mkdir(if rng.random_bool(0.3) {
                pick(&mut rng, &["nd0", "nd1"])
            } else {
                sub(&mut rng)
            }),
            4 => Rmdir(pick(&mut rng, &dirs[1..])),
            5 | 6 => Unlink(leaf(&mut rng)),
            7..=9 => {
                let f = [0, 0, 0, RENAME_NOREPLACE, RENAME_EXCHANGE][rng.random_range(0..5)];
                Rename(leaf(&mut rng), leaf(&mut rng), f)
            }
            10 => Rename(pick(&mut rng, &dirs[1..]), sub(&mut rng), 0),
            11 => Link(leaf(&mut rng), leaf(&mut rng)),
            12 => Chmod(leaf(&mut rng), rng.random_range(0o400..=0o777)),
            13 => Stat(leaf(&mut rng)),
            _ => ReadDir(pick(&mut rng, &dirs)),
        };
        ops.push(op);
    }
    ops
}

/// Errnos a walk racing changes may meet.
fn benign(e: i32) -> bool {
    [libc::ENOENT, libc::ENOTDIR, libc::ESTALE, libc::EISDIR].contains(&e)
}

/// Walks the tree from the root, loading it, until `stop`; what should never happen goes to
/// `bad`.
fn walker(fs: &Arc<Filesystem>, seed: u64, stop: &AtomicBool, bad: &Mutex<Vec<String>>) -> u64 {
    let c = Client::root(fs.clone());
    let mut rng = StdRng::seed_from_u64(seed);
    let mut steps = 0u64;
    let note = |what: String| bad.lock().unwrap().push(what);
    while !stop.load(Relaxed) {
        let mut stack = vec!["/".to_string()];
        while let Some(d) = stack.pop() {
            if stop.load(Relaxed) {
                break;
            }
            let list = match c.read_dir(&d) {
                Ok(l) => l,
                Err(e) if benign(e.raw_os_error().unwrap_or(-1)) => continue,
                Err(e) => {
                    note(format!("read_dir {d}: {e}"));
                    continue;
                }
            };
            match c.metadata(format!("{d}/..")) {
                Ok(m) if m.is_dir() => {}
                Ok(m) => note(format!("{d}/.. is not a directory: {m:?}")),
                Err(e) if benign(e.raw_os_error().unwrap_or(-1)) => {}
                Err(e) => note(format!("stat {d}/..: {e}")),
            }
            for e in list {
                steps += 1;
                let p = join(&d, &e.name);
                match c.symlink_metadata(&p) {
                    Ok(m) if m.is_dir() => {
                        if rng.random_bool(0.8) {
                            stack.push(p);
                        }
                    }
                    Ok(m) if m.is_file() && rng.random_bool(0.2) => match c.read(&p) {
                        Ok(_) => {}
                        Err(e) if benign(e.raw_os_error().unwrap_or(-1)) => {}
                        Err(e) => note(format!("read {p}: {e}")),
                    },
                    Ok(_) => {}
                    Err(e) if benign(e.raw_os_error().unwrap_or(-1)) => {}
                    Err(e) => note(format!("stat {p}: {e}")),
                }
            }
        }
    }
    steps
}

/// Looks inodes up by number, loading them beside the walks.
fn prober(
    fs: &Filesystem,
    snap: &Snapshot,
    seed: u64,
    stop: &AtomicBool,
    bad: &Mutex<Vec<String>>,
) -> u64 {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut n = 0;
    while !stop.load(Relaxed) {
        let ino = Ino(rng.random_range(1..=snap.max_ino() + 3));
        n += 1;
        match fs.getattr(ino) {
            Ok(a) if a.kind() == FileType::Directory => match fs.lookup(&root(), ino, b"..") {
                Ok(p) if p.kind() == FileType::Directory => {}
                Ok(p) => bad.lock().unwrap().push(format!("{ino}/..: {p:?}")),
                Err(e) if benign(e.0) => {}
                Err(e) => bad.lock().unwrap().push(format!("lookup {ino}/..: {e:?}")),
            },
            Ok(_) => {}
            Err(e) if benign(e.0) => {}
            Err(e) => bad.lock().unwrap().push(format!("getattr {ino}: {e:?}")),
        }
    }
    n
}

/// Worker `k`'s changes on `orig` (the filesystem the snapshot was taken of), one worker
/// after the other: what every lazily loaded run must give.
struct Reference {
    ops: Vec<Vec<WOp>>,
    results: Vec<Vec<Outcome>>,
    tree: Tree,
}

fn reference(orig: &Arc<Filesystem>, snap: &Snapshot, seed: u64, random: usize) -> Reference {
    let ops: Vec<Vec<WOp>> = (0..AREAS).map(|k| worker_ops(k, seed, random)).collect();
    let oc = Client::root(orig.clone());
    let results: Vec<Vec<Outcome>> = ops
        .iter()
        .enumerate()
        .map(|(k, ops)| {
            let area = format!("/t{k}");
            ops.iter().map(|op| run_op(&oc, &area, op)).collect()
        })
        .collect();
    let scripted = &results[0];
    assert_eq!(
        scripted[1],
        Err(libc::ENOTEMPTY),
        "rmdir of a full directory"
    );
    assert_eq!(
        scripted[2],
        Err(libc::ENOTEMPTY),
        "rename over a full directory"
    );
    assert_eq!(
        scripted[4],
        Ok(String::new()),
        "rename over an empty directory"
    );
    orig.check_invariants().unwrap();
    Reference {
        ops,
        results,
        tree: projection(&dump(orig, false), snap),
    }
}

/// One run of the workers' changes on a filesystem loaded lazily from `snap`, beside two
/// walkers and a prober that load it; compared with `want`.
fn racing_round(
    locking: Locking,
    snap: &Arc<Snapshot>,
    want: &Reference,
    seed: u64,
    delay: Duration,
) -> (u64, u64) {
    let (fs, store) = open_lazy(snap, cfg(locking), delay);
    let stop = AtomicBool::new(false);
    let bad = Mutex::new(Vec::new());
    let barrier = Barrier::new(AREAS + 3);
    let (results, steps, probes) = std::thread::scope(|s| {
        let walkers: Vec<_> = (0..2)
            .map(|w| {
                let (fs, stop, bad, barrier) = (&fs, &stop, &bad, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    walker(fs, seed.wrapping_add(100 + w), stop, bad)
                })
            })
            .collect();
        let probe = {
            let (fs, stop, bad, barrier) = (&fs, &stop, &bad, &barrier);
            s.spawn(move || {
                barrier.wait();
                prober(fs, snap, seed.wrapping_add(200), stop, bad)
            })
        };
        let workers: Vec<_> = want
            .ops
            .iter()
            .enumerate()
            .map(|(k, ops)| {
                let (fs, barrier) = (fs.clone(), &barrier);
                s.spawn(move || {
                    let c = Client::root(fs);
                    let area = format!("/t{k}");
                    barrier.wait();
                    ops.iter()
                        .map(|op| run_op(&c, &area, op))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let results: Vec<Vec<Outcome>> = workers.into_iter().map(|h| h.join().unwrap()).collect();
        stop.store(true, Relaxed);
        let steps: u64 = walkers.into_iter().map(|h| h.join().unwrap()).sum();
        let probes = probe.join().unwrap();
        (results, steps, probes)
    });
    let what = format!("{locking:?} seed {seed} delay {delay:?}");
    let bad = bad.into_inner().unwrap();
    assert!(
        bad.is_empty(),
        "{what}: {} wrong answers: {:?}",
        bad.len(),
        &bad[..bad.len().min(10)]
    );
    store.assert_each_loaded_once(&what);
    for (k, ops) in want.ops.iter().enumerate() {
        for (i, op) in ops.iter().enumerate() {
            assert_eq!(
                results[k][i], want.results[k][i],
                "{what}: worker {k}, step {i}: {op:?}"
            );
        }
    }
    fs.check_invariants()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    check_dotdot(&fs);
    let got = dump(&fs, false);
    assert_same_tree(
        &format!("{what}: the racing changes' tree"),
        &want.tree,
        &projection(&got, snap),
    );
    store.assert_each_loaded_once(&format!("{what}, then the dump"));
    // Fresh numbers: above the store's, or numbers of its inodes freed since the open;
    // fresh generations above its highest.
    let present: HashSet<(Ino, Generation)> = got.values().map(|n| (n.ino, n.generation)).collect();
    let mut fresh = 0;
    for (p, n) in &got {
        let id = InodeId {
            ino: n.ino,
            generation: n.generation,
        };
        if snap.has(id) {
            continue;
        }
        fresh += 1;
        let p = String::from_utf8_lossy(p);
        assert!(
            n.generation.0 > snap.max_gen,
            "{what}: {p}: generation {} reused",
            n.generation
        );
        if n.ino.0 <= snap.max_ino() {
            let old = snap.inodes.get(&n.ino.0).unwrap_or_else(|| {
                panic!("{what}: {p}: number {} was a hole of the store's", n.ino)
            });
            assert!(
                !present.contains(&(old.id.ino, old.id.generation)),
                "{what}: {p}: number {} given while the store's inode {} lives",
                n.ino,
                old.id
            );
        }
    }
    assert!(fresh > 10, "{what}: the workload made few inodes ({fresh})");
    (steps, probes)
}

fn changes_racing_loads(locking: Locking, seed: u64, random: usize, rounds: usize) {
    let (orig, snap) = original(locking);
    let want = reference(&orig, &snap, seed, random);
    let (mut steps, mut probes) = (0, 0);
    for r in 0..rounds {
        let delay = [
            Duration::ZERO,
            Duration::from_micros(50),
            Duration::from_micros(400),
        ][r % 3];
        let (s, p) = racing_round(locking, &snap, &want, seed.wrapping_add(r as u64), delay);
        steps += s;
        probes += p;
    }
    eprintln!(
        "  {locking:?} seed {seed}: {rounds} rounds, walkers took {steps} steps, the prober {probes} looks"
    );
}

#[test]
fn changes_racing_the_loads_keep_the_invariants() {
    let seeds = common::seed::seeds("racing", common::seed::fresh(3));
    for seed in seeds {
        // LANEFS_LAZY_ROUNDS: more rounds (fresh opens), for a longer hunt.
        let rounds = std::env::var("LANEFS_LAZY_ROUNDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(15);
        deadline(600, "racing", move || {
            changes_racing_loads(Locking::Lanes, seed, 300, rounds)
        });
    }
}

// ----- d: freed inodes ----------------------------------------------------------------------------

#[test]
fn a_freed_inode_is_never_loaded_again() {
    deadline(120, "freed", || {
        let (_orig, snap) = original(Locking::Lanes);
        let (fs, store) = open_lazy(&snap, cfg(Locking::Lanes), Duration::ZERO);
        let c = Client::root(fs.clone());
        let ctx = root();
        let gone = |id: InodeId, what: &str| {
            assert_eq!(
                fs.lookup_inode(&ctx, id).err(),
                Some(Errno::ENOENT),
                "{what}: lookup_inode"
            );
            assert_eq!(
                fs.getattr(id).err(),
                Some(Errno::ENOENT),
                "{what}: getattr by id"
            );
        };

        // Loaded by number (before its directory), unlinked, freed.
        let v2 = snap.id("/d1/victim2");
        assert_eq!(fs.getattr(v2.ino).unwrap().generation, v2.generation);
        assert!(!store.entry_counts().contains_key(&snap.id("/d1").ino.0));
        c.remove_file("/d1/victim2").unwrap();
        gone(v2, "victim2");
        assert_eq!(fs.getattr(v2.ino).err(), Some(Errno::ENOENT));
        assert_eq!(
            store.inode_counts().get(&v2.ino.0),
            Some(&1),
            "victim2: loaded again"
        );

        // Loaded with its directory, unlinked, freed.
        let v = snap.id("/d1/victim");
        assert_eq!(
            c.metadata("/d1/victim").unwrap().attr.generation,
            v.generation
        );
        c.remove_file("/d1/victim").unwrap();
        gone(v, "victim");
        assert_eq!(
            fs.getattr(v.ino).err(),
            Some(Errno::ENOENT),
            "victim by number"
        );
        assert_eq!(
            store.inode_counts().get(&v.ino.0),
            None,
            "victim: loaded again"
        );

        // Unlinked while open: lives until closed, then is gone for good.
        let o = snap.id("/d1/openme");
        let f = c.open("/d1/openme", OpenOptions::new().read(true)).unwrap();
        c.remove_file("/d1/openme").unwrap();
        let mut b = vec![0u8; 2 * PAGE as usize];
        assert_eq!(f.read_at(&mut b, 0).unwrap(), b.len());
        assert_eq!(b, snap.data[&o.ino.0]);
        drop(f);
        gone(o, "openme");
        assert_eq!(store.inode_counts().get(&o.ino.0), None);

        // A directory not loaded yet, removed: its number and entries are never asked again.
        let e = snap.id("/d1/emptydir");
        c.remove_dir("/d1/emptydir").unwrap();
        gone(e, "emptydir");
        assert_eq!(fs.lookup(&ctx, e.ino, b"..").err(), Some(Errno::ENOENT));
        assert!(store.inode_counts().get(&e.ino.0).copied().unwrap_or(0) <= 1);
        assert_eq!(store.entry_counts().get(&e.ino.0), Some(&1));
        assert_eq!(
            c.remove_dir("/d1/full").map_err(errno),
            Err(libc::ENOTEMPTY),
            "a full directory not loaded yet"
        );

        // Two names in two directories: the second directory's load brings the store's copy
        // (link count 2) again, which must not replace the live inode (link count 1).
        let h = snap.id("/hl/a");
        assert_eq!(c.metadata("/hl/a").unwrap().attr.nlink, 2);
        c.remove_file("/hl/a").unwrap();
        assert_eq!(
            fs.getattr(h).unwrap().nlink,
            1,
            "by id, before /hl2 is loaded"
        );
        assert!(!store.entry_counts().contains_key(&snap.id("/hl2").ino.0));
        assert_eq!(
            c.metadata("/hl2/b").unwrap().attr.nlink,
            1,
            "after /hl2 is loaded"
        );
        c.remove_file("/hl2/b").unwrap();
        gone(h, "hard-linked");
        assert_eq!(store.inode_counts().get(&h.ino.0), None);

        // New inodes may take the freed numbers, with new generations; the old ids stay gone.
        let freed: HashSet<u64> = [v, v2, o, e, h].iter().map(|i| i.ino.0).collect();
        let mut reused = 0;
        for i in 0..64 {
            c.write(format!("/d1/new{i}"), b"n").unwrap();
            let a = c.metadata(format!("/d1/new{i}")).unwrap().attr;
            assert!(a.generation.0 > snap.max_gen);
            if a.ino.0 <= snap.max_ino() {
                assert!(
                    freed.contains(&a.ino.0),
                    "new{i}: number {} not freed",
                    a.ino
                );
                reused += 1;
            }
        }
        eprintln!("  {reused} freed numbers reused");
        for (id, what) in [
            (v, "victim"),
            (v2, "victim2"),
            (o, "openme"),
            (e, "emptydir"),
            (h, "hl"),
        ] {
            gone(id, what);
        }
        fs.check_invariants().unwrap();
        store.assert_each_loaded_once("freed");
        for id in [v, o, h] {
            assert_eq!(
                store.inode_counts().get(&id.ino.0),
                None,
                "{id} asked of the store"
            );
        }
        assert_eq!(store.inode_counts().get(&v2.ino.0), Some(&1));
    });
}

// ----- e: the "before" modes ------------------------------------------------------------------------

#[test]
fn the_before_modes_load_the_same_tree() {
    for locking in [Locking::DirLock, Locking::Coarse] {
        deadline(300, "before", move || {
            lazily_loaded_tree_is_the_tree(locking);
            miss_storm(locking, 16, Duration::from_micros(100));
            let seed = common::seed::fixed("before-modes racing", 7);
            changes_racing_loads(locking, seed, 200, 6);
        });
    }
}

// ----- reproductions ----------------------------------------------------------------------------

/// `f`'s result, or the message it panicked with.
fn no_panic<T>(f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    })
}

/// A snapshot of a root holding directory `/big` with files `a0`, `a1` and `a2`.
fn three_files() -> Snapshot {
    let orig = Filesystem::new(cfg(Locking::Lanes));
    let c = Client::root(Arc::new(orig));
    c.create_dir("/big").unwrap();
    for n in ["a0", "a1", "a2"] {
        c.write(format!("/big/{n}"), n).unwrap();
    }
    c.write("/other", b"o").unwrap();
    export(c.fs())
}

/// A store whose directory `/big` holds, after two good entries, one it cannot have written
/// (a cookie out of range): every walk into `/big` is refused with EIO, the first and the
/// next (the path walk's own retry, `Filesystem::named` tries 8 times through `iget_racy`,
/// or the next call), and none panics: a load puts no entry in the dirent map before it has
/// checked them all (`lazy.rs`, `load_entries`), so a second load never meets a name the
/// first published (`Dirents::reveal` would panic: "name published twice under its stripe
/// lock").
#[test]
fn a_directory_load_that_fails_halfway_fails_the_same_way_again() {
    deadline(60, "halfway", || {
        let mut snap = three_files();
        let big = snap.id("/big").ino.0;
        let order: Vec<_> = snap.entries[&big].iter().map(|e| e.name.clone()).collect();
        assert_eq!(order, [b"a0".to_vec(), b"a1".to_vec(), b"a2".to_vec()]);
        // The third entry: damaged.
        snap.entries.get_mut(&big).unwrap()[2].cookie = 1;
        let snap = Arc::new(snap);
        let (fs, _store) = open_lazy(&snap, cfg(Locking::Lanes), Duration::ZERO);
        let c = Client::root(fs.clone());
        for attempt in 1..=2 {
            let r = no_panic(|| c.metadata("/big/a0").map(|m| m.ino()).map_err(errno));
            assert_eq!(
                r,
                Ok(Err(libc::EIO)),
                "walk {attempt} into a directory the store cannot load"
            );
        }
        assert_eq!(
            no_panic(|| fs.getattr(Ino(big)).err()),
            Ok(Some(Errno::EIO))
        );
        // The rest of the tree is unharmed.
        assert_eq!(c.read("/other").unwrap(), b"o");
    });
}

/// A store whose directory `/big` names, among sound files, one it cannot have written (a
/// file with no link), loaded by a filesystem whose inode cache has no room for the
/// directory's files: the directory loads and lists (its entries are sound, and a listing
/// reads no file), the damaged file is refused with EIO each time it is reached, and its
/// neighbours are unharmed. Its files not read with it, the damage is found only when the
/// file is reached (`Filesystem::iget_named`); a debug build must not panic there either.
#[test]
fn a_damaged_file_is_refused_where_it_is_reached() {
    deadline(60, "damaged file", || {
        // More files than a 64-inode cache has room for.
        let orig = Filesystem::new(cfg(Locking::Lanes));
        let c = Client::root(Arc::new(orig));
        c.create_dir("/big").unwrap();
        for n in 0..100 {
            c.write(format!("/big/a{n}"), format!("a{n}")).unwrap();
        }
        c.write("/other", b"o").unwrap();
        let mut snap = export(c.fs());
        let big = snap.id("/big").ino.0;
        let a2 = snap.id("/big/a2").ino.0;
        snap.inodes.get_mut(&a2).unwrap().nlink = 0;
        let snap = Arc::new(snap);
        let small = Config {
            inode_cache: Some(64 * lanefs::INODE_BYTES),
            ..cfg(Locking::Lanes)
        };
        let (fs, store) = open_lazy(&snap, small, Duration::ZERO);
        let c = Client::root(fs.clone());
        let names = c.read_dir("/big").unwrap().len();
        assert_eq!(names, 100);
        assert_eq!(
            store.inode_counts().get(&a2),
            None,
            "no file loaded by the listing"
        );
        for attempt in 1..=2 {
            let r = no_panic(|| c.metadata("/big/a2").map(|m| m.ino()).map_err(errno));
            assert_eq!(r, Ok(Err(libc::EIO)), "walk {attempt} to the damaged file");
            let r = no_panic(|| c.read("/big/a2").map_err(errno));
            assert_eq!(r, Ok(Err(libc::EIO)), "read {attempt} of the damaged file");
        }
        assert_eq!(no_panic(|| fs.getattr(Ino(a2)).err()), Ok(Some(Errno::EIO)));
        assert_eq!(c.read("/big/a0").unwrap(), b"a0");
        assert_eq!(c.read("/big/a1").unwrap(), b"a1");
        assert_eq!(fs.getattr(Ino(big)).unwrap().ino, Ino(big));
    });
}

/// A store whose directory holds one name twice (two cookies) is damaged: the load says so
/// (EIO; `load_entries` maps an `admit` failure to "directory {}: {} twice"). But `admit`
/// never refuses a name already in the map (it inserts into the directory's index only); the
/// second copy reaches `Dirents::reveal`, which panics ("name published twice under its
/// stripe lock").
#[test]
fn a_store_naming_one_name_twice_is_damaged_not_a_panic() {
    deadline(60, "twice", || {
        let mut snap = three_files();
        let big = snap.id("/big").ino.0;
        let mut dup = snap.entries[&big][0].clone();
        dup.cookie = snap.entries[&big][2].cookie + 1;
        snap.entries.get_mut(&big).unwrap().push(dup);
        let snap = Arc::new(snap);
        let (fs, _store) = open_lazy(&snap, cfg(Locking::Lanes), Duration::ZERO);
        let c = Client::root(fs.clone());
        let r = no_panic(|| c.metadata("/big/a1").map(|m| m.ino()).map_err(errno));
        assert_eq!(
            r,
            Ok(Err(libc::EIO)),
            "a walk into a directory with a name twice"
        );
        assert_eq!(c.read("/other").unwrap(), b"o");
    });
}

/// A store's read error (EIO) on one file, loaded by number, while its directory is being
/// loaded by another thread: the error is that file's alone. The directory's load reads no
/// file, so the walk beside it succeeds (or, had it reached the file, fails with EIO), never
/// panics, and once the error is gone the file loads. (When a directory loaded its files, a
/// transient error on one made its whole directory unreachable: the load failed after
/// admitting the first entries, and its retry panicked in `Dirents::reveal`.)
#[test]
fn a_read_error_on_a_file_during_its_directorys_load_is_not_a_panic() {
    deadline(60, "read error", || {
        let snap = Arc::new(three_files());
        let (fs, store) = open_lazy(&snap, cfg(Locking::Lanes), Duration::ZERO);
        let (big, a1) = (snap.id("/big"), snap.id("/big/a1"));
        store.fail_after.store(big.ino.0, SeqCst);
        store.fail_ino.store(a1.ino.0, SeqCst);
        let by_number = {
            let fs = fs.clone();
            std::thread::spawn(move || fs.getattr(a1.ino).map(|a| a.ino))
        };
        while !store.failing.load(SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let c = Client::root(fs.clone());
        let walk = no_panic(|| c.metadata("/big/a0").map(|m| m.ino()).map_err(errno));
        let mine = by_number.join().unwrap();
        assert!(matches!(mine, Err(Errno::EIO) | Ok(_)), "{mine:?}");
        assert!(
            matches!(walk, Ok(Ok(_)) | Ok(Err(libc::EIO))),
            "the walk beside the read error: {walk:?}"
        );
        // The error is gone: the directory loads.
        let again = no_panic(|| c.metadata("/big/a0").map(|m| m.ino()).map_err(errno));
        assert_eq!(
            again,
            Ok(Ok(snap.id("/big/a0").ino)),
            "a walk after the read error"
        );
        assert_eq!(
            no_panic(|| c.read("/big/a1").map_err(errno)),
            Ok(Ok(b"a1".to_vec()))
        );
        no_panic(|| fs.check_invariants()).unwrap().unwrap();
    });
}

// ----- f: records after the snapshot ------------------------------------------------------------

/// Keeps the records appended while `on`, encoded.
#[derive(Default)]
struct Recorder {
    on: AtomicBool,
    records: Mutex<Vec<Vec<u8>>>,
}

impl Store for Recorder {
    fn append(&self, rec: &Record<'_>) -> Result<()> {
        if self.on.load(SeqCst) {
            self.records.lock().unwrap().push(rec.to_bytes());
        }
        Ok(())
    }
    fn sync(&self) -> Result<()> {
        Ok(())
    }
    fn durable(&self) -> bool {
        true
    }
}

/// A store's open: the snapshot loaded lazily, then the records made after it replayed onto
/// it (each loading what it touches), gives the filesystem that made them.
#[test]
fn records_after_the_snapshot_replay_onto_the_lazy_tree() {
    deadline(120, "records", || {
        let seed = common::seed::seed("records");
        let rec = Arc::new(Recorder::default());
        let orig = Arc::new(
            Filesystem::recover(cfg(Locking::Lanes), rec.clone())
                .finish()
                .unwrap(),
        );
        build_tree(&Client::root(orig.clone()));
        let snap = Arc::new(export(&orig));
        rec.on.store(true, SeqCst);
        let c = Client::root(orig.clone());
        for k in 0..AREAS {
            let area = format!("/t{k}");
            for op in worker_ops(k, seed, 250) {
                let _ = run_op(&c, &area, &op);
            }
        }
        // And some outside the areas: xattrs, flags, data, a directory moved by number.
        c.write("/wide/s1/f3", b"rewritten").unwrap();
        c.set_flags("/frozen", 0).unwrap();
        c.remove_file("/frozen").unwrap();
        orig.setxattr(&root(), snap.id("/wide/s4/f1").ino, b"user.late", b"v", 0)
            .unwrap();
        orig.rename(
            &root(),
            snap.id("/n/0/1"),
            b"2",
            snap.id("/x/y"),
            b"moved",
            0,
        )
        .unwrap();
        let records = std::mem::take(&mut *rec.records.lock().unwrap());
        eprintln!("  {} records after the snapshot", records.len());
        assert!(records.len() > 100, "few records");

        let store = Arc::new(ModelStore::new(snap.clone(), Duration::ZERO));
        let mut r = Filesystem::recover_lazy(
            cfg(Locking::Lanes),
            store.clone(),
            snap.max_ino(),
            snap.counts(),
        )
        .unwrap();
        r.observe_generation(Generation(snap.max_gen));
        for &ck in &snap.cookies {
            r.observe_cookie(ck).unwrap();
        }
        for (i, b) in records.iter().enumerate() {
            let record = Record::decode(b).unwrap();
            r.apply(&record)
                .unwrap_or_else(|e| panic!("record {i} ({record:?}): {e}"));
        }
        let fs = r.finish().unwrap();
        store.assert_each_loaded_once("replay");
        let loaded_by_replay = fs.loaded_inodes();
        assert!(
            loaded_by_replay < snap.inodes.len() as u64,
            "the replay loaded everything"
        );
        let want = dump(&orig, true);
        let got = dump(&fs, true);
        assert_same_tree("the snapshot and the records after it", &want, &got);
        fs.check_invariants().unwrap();
        check_dotdot(&fs);
        store.assert_each_loaded_once("replay, then the dump");
        assert_eq!(orig.statfs().ffree, fs.statfs().ffree, "inodes counted");
        assert_eq!(orig.statfs().bfree, fs.statfs().bfree, "space counted");
    });
}

/// A store whose directory lists itself as one of its entries (damaged) must get EIO, and
/// not hang: a load that reached the directory's own number would wait on the cell
/// (`OnceLock`) its own thread is initializing (`load_entries` refuses such an entry).
#[test]
fn a_store_listing_a_directory_in_itself_is_damaged_not_a_hang() {
    let mut snap = three_files();
    let big = snap.id("/big");
    let cookie = snap.entries[&big.ino.0][2].cookie + 1;
    snap.entries.get_mut(&big.ino.0).unwrap().push(LoadedEntry {
        name: b"me".to_vec(),
        cookie,
        target: big,
        kind: FileType::RegularFile,
        inode: None,
    });
    let snap = Arc::new(snap);
    let r = deadline(60, "self", move || {
        let (fs, _store) = open_lazy(&snap, cfg(Locking::Lanes), Duration::ZERO);
        let c = Client::root(fs);
        no_panic(|| c.metadata("/big/a0").map(|m| m.ino()).map_err(errno))
    });
    assert_eq!(r, Ok(Err(libc::EIO)));
}
