//! The adapters every workload runs on: the engine's inode API in-process, the engine's path
//! API (`Client`) in-process, and system calls on a directory of any mounted filesystem (a
//! lanefs mount, tmpfs, ext4). The inode API and the system calls resolve names relative to
//! an already-open directory (an inode number, or a directory fd with `*at()` calls), so
//! neither pays for a path walk the other does not; the path API walks every path from the
//! root, as a program using it would.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lanefs::{Client, Config, Ctx, Errno, Filesystem, Ino, Locking, OpenOptions};

/// A directory the workload works in.
#[derive(Clone, Copy, Debug)]
pub enum Dir {
    /// An engine inode.
    Ino(Ino),
    /// An open directory file descriptor.
    Fd(i32),
    /// An absolute path (the path API; leaked, so that a `Dir` stays `Copy`: a run makes a
    /// few hundred at most).
    Path(&'static str),
}

/// Operations the workloads need, on one of the two adapters.
pub trait Adapter: Send + Sync {
    /// The base directory of this run.
    fn base(&self) -> Dir;
    /// Creates a subdirectory and returns it.
    fn mkdir(&self, parent: Dir, name: &str) -> Result<Dir, Errno>;
    /// create + close.
    fn create(&self, dir: Dir, name: &str) -> Result<(), Errno>;
    /// create, write `data`, close.
    fn create_with(&self, dir: Dir, name: &str, data: &[u8]) -> Result<(), Errno>;
    /// create + fsync + close.
    fn create_fsync(&self, dir: Dir, name: &str) -> Result<(), Errno>;
    /// unlink.
    fn unlink(&self, dir: Dir, name: &str) -> Result<(), Errno>;
    /// rename within one directory.
    fn rename(&self, dir: Dir, from: &str, to: &str) -> Result<(), Errno>;
    /// stat (lookup + getattr).
    fn stat(&self, dir: Dir, name: &str) -> Result<(), Errno>;
    /// open + read up to `buf.len()` bytes + close; returns the bytes read.
    fn open_read(&self, dir: Dir, name: &str, buf: &mut [u8]) -> Result<usize, Errno>;
    /// Lists `dir` (open, read to the end, close) into `names` (replaced), `.` and `..` left
    /// out.
    fn list(&self, dir: Dir, names: &mut Vec<String>) -> Result<(), Errno>;
    /// The engine's statistics, for in-process runs.
    fn engine(&self) -> Option<&Filesystem> {
        None
    }
    /// What the disk store's committer has done, for runs on one.
    fn store_counters(&self) -> Option<lanefs_store::Counters> {
        None
    }
}

/// In-process adapter: a fresh lanefs filesystem with the given locking mode, on the memory
/// store or on a fresh disk store.
pub struct Engine {
    pub fs: Arc<Filesystem>,
    ctx: Ctx,
    /// The disk store and its directory (removed when the adapter is dropped).
    store: Option<(lanefs_store::StoreHandle, PathBuf)>,
    cfg: Config,
}

/// What [`Engine::reopen`] measured.
#[derive(Clone, Copy, Debug)]
pub struct Reopened {
    /// Seconds `lanefs_store::open` took.
    pub secs: f64,
    /// Inodes it read from the checkpoint (a lazy opening: the root and its files; the run
    /// reads the rest as it reaches them).
    pub inodes: u64,
    /// Records it replayed from the journal.
    pub replayed: u64,
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Some((store, dir)) = self.store.take() {
            drop(store);
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl Engine {
    /// A new filesystem, with `prefill` empty files in a directory of their own so that the
    /// global tables are not measured empty (the prefill note in docs/results/HISTORY.md, "crunl").
    pub fn new(locking: Locking, prefill: usize) -> Engine {
        Engine::with_store(locking, prefill, None).expect("a memory store")
    }

    /// [`Engine::new`], on a fresh disk store in a new directory under `store` if given.
    pub fn with_store(
        locking: Locking,
        prefill: usize,
        store: Option<&Path>,
    ) -> Result<Engine, String> {
        // As many inodes as the table holds: fsmark creates about a million files a second.
        let cfg = Config {
            locking,
            max_inodes: Some(1 << 27),
            ..Config::default()
        };
        let (fs, store) = match store {
            None => (Filesystem::new(cfg.clone()), None),
            Some(parent) => {
                static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
                let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let dir = parent.join(format!("lanefs-bench-store-{}-{n}", std::process::id()));
                let _ = std::fs::remove_dir_all(&dir);
                let o = lanefs_store::open(&dir, cfg.clone(), lanefs_store::Options::default())
                    .map_err(|e| e.to_string())?;
                (o.fs, Some((o.store, dir)))
            }
        };
        let ctx = Ctx::root();
        let e = Engine {
            fs: Arc::new(fs),
            ctx,
            store,
            cfg,
        };
        if prefill > 0 {
            let d = e.mkdir(e.base(), "prefill").expect("prefill dir");
            for i in 0..prefill {
                e.create(d, &format!("p{i:08}")).expect("prefill");
            }
        }
        // The prefill is set-up: on a disk store it is checkpointed before the run, as a
        // filesystem would have written it back long before, so that the run measures the
        // workload's own costs (docs/results/HISTORY.md, "The disk store: fsync, journaling cost, recovery").
        if let Some((s, _)) = &e.store {
            s.checkpoint().map_err(|e| e.to_string())?;
        }
        Ok(e)
    }

    /// Checkpoints, closes and opens the disk store again (timed): the filesystem a remount
    /// or a restarted program gets, whose namespace is read from the disk. Inode numbers
    /// are kept, so the directories a workload prepared are the same after it.
    pub fn reopen(mut self, inode_cache: Option<u64>) -> Result<(Engine, Reopened), String> {
        let (store, dir) = self.store.take().ok_or("not on a disk store")?;
        let cfg = Config {
            inode_cache: inode_cache.or(self.cfg.inode_cache),
            ..self.cfg.clone()
        };
        let closed = store
            .checkpoint()
            .map_err(|e| e.to_string())
            .and_then(|_| store.close().map_err(|e| e.to_string()));
        drop(self);
        if let Err(e) = closed {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        let t = std::time::Instant::now();
        let o = match lanefs_store::open(&dir, cfg.clone(), lanefs_store::Options::default()) {
            Ok(o) => o,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e.to_string());
            }
        };
        let secs = t.elapsed().as_secs_f64();
        let figures = Reopened {
            secs,
            inodes: o.report.loaded + o.fs.loaded_inodes(),
            replayed: o.report.replayed,
        };
        Ok((
            Engine {
                fs: Arc::new(o.fs),
                ctx: Ctx::root(),
                store: Some((o.store, dir)),
                cfg,
            },
            figures,
        ))
    }

    fn ino(d: Dir) -> Ino {
        match d {
            Dir::Ino(i) => i,
            _ => unreachable!("engine dirs are inodes"),
        }
    }

    /// Creates `name`, runs `f` on its handle, and closes it.
    fn with_new_file(
        &self,
        dir: Dir,
        name: &str,
        f: impl FnOnce(lanefs::Fh) -> Result<(), Errno>,
    ) -> Result<(), Errno> {
        let (_, fh) = self.fs.create(
            &self.ctx,
            Self::ino(dir),
            name.as_bytes(),
            0o644,
            libc::O_WRONLY,
        )?;
        let r = f(fh);
        self.fs.release(fh)?;
        r
    }
}

impl Adapter for Engine {
    fn base(&self) -> Dir {
        Dir::Ino(self.fs.root())
    }
    fn mkdir(&self, parent: Dir, name: &str) -> Result<Dir, Errno> {
        Ok(Dir::Ino(
            self.fs
                .mkdir(&self.ctx, Self::ino(parent), name.as_bytes(), 0o755)?
                .ino,
        ))
    }
    fn create(&self, dir: Dir, name: &str) -> Result<(), Errno> {
        self.with_new_file(dir, name, |_| Ok(()))
    }
    fn create_with(&self, dir: Dir, name: &str, data: &[u8]) -> Result<(), Errno> {
        self.with_new_file(dir, name, |fh| {
            self.fs.write(&self.ctx, fh, 0, data).map(drop)
        })
    }
    fn create_fsync(&self, dir: Dir, name: &str) -> Result<(), Errno> {
        self.with_new_file(dir, name, |fh| self.fs.fsync(fh, false))
    }
    fn unlink(&self, dir: Dir, name: &str) -> Result<(), Errno> {
        self.fs.unlink(&self.ctx, Self::ino(dir), name.as_bytes())
    }
    fn rename(&self, dir: Dir, from: &str, to: &str) -> Result<(), Errno> {
        let d = Self::ino(dir);
        self.fs
            .rename(&self.ctx, d, from.as_bytes(), d, to.as_bytes(), 0)
    }
    fn stat(&self, dir: Dir, name: &str) -> Result<(), Errno> {
        self.fs
            .lookup(&self.ctx, Self::ino(dir), name.as_bytes())
            .map(drop)
    }
    fn open_read(&self, dir: Dir, name: &str, buf: &mut [u8]) -> Result<usize, Errno> {
        let a = self.fs.lookup(&self.ctx, Self::ino(dir), name.as_bytes())?;
        let fh = self.fs.open(&self.ctx, a.ino, libc::O_RDONLY)?;
        let n = self.fs.read(fh, 0, buf);
        self.fs.release(fh)?;
        n
    }
    fn list(&self, dir: Dir, names: &mut Vec<String>) -> Result<(), Errno> {
        names.clear();
        let fh = self.fs.opendir(&self.ctx, Self::ino(dir))?;
        let r = self.fs.readdir(&self.ctx, fh, 0, false, |e, _| {
            if e.name != b"." && e.name != b".." {
                names.push(String::from_utf8_lossy(e.name).into_owned());
            }
            true
        });
        self.fs.releasedir(fh)?;
        r
    }
    fn engine(&self) -> Option<&Filesystem> {
        Some(&self.fs)
    }
    fn store_counters(&self) -> Option<lanefs_store::Counters> {
        self.store.as_ref().map(|(s, _)| s.counters())
    }
}

fn last_errno() -> Errno {
    Errno(
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO),
    )
}

fn cname(s: &str) -> CString {
    CString::new(s).expect("benchmark names have no NUL")
}

fn rc(r: i32) -> Result<i32, Errno> {
    if r < 0 { Err(last_errno()) } else { Ok(r) }
}

fn fd(d: Dir) -> i32 {
    match d {
        Dir::Fd(f) => f,
        _ => unreachable!("path dirs are fds"),
    }
}

/// In-process adapter on the path API: a fresh filesystem (as [`Engine`]'s), used through a
/// root [`Client`] with absolute paths, as `std::fs` is used.
pub struct Paths {
    engine: Engine,
    client: Client,
}

thread_local! {
    static PATH: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

impl Paths {
    /// A new filesystem with `prefill` files, as [`Engine::new`].
    pub fn new(locking: Locking, prefill: usize) -> Paths {
        let engine = Engine::new(locking, prefill);
        let client = Client::root(engine.fs.clone());
        Paths { engine, client }
    }

    fn dir(d: Dir) -> &'static str {
        match d {
            Dir::Path(p) => p,
            _ => unreachable!("path-API dirs are paths"),
        }
    }

    /// Runs `f` on `dir/name`, built in a per-thread buffer (no allocation per call).
    fn at<T>(dir: Dir, name: &str, f: impl FnOnce(&str) -> T) -> T {
        PATH.with(|b| {
            let mut b = b.borrow_mut();
            b.clear();
            b.push_str(Self::dir(dir));
            b.push('/');
            b.push_str(name);
            f(&b)
        })
    }
}

fn io(e: std::io::Error) -> Errno {
    Errno(e.raw_os_error().unwrap_or(libc::EIO))
}

impl Adapter for Paths {
    fn base(&self) -> Dir {
        Dir::Path("")
    }
    fn mkdir(&self, parent: Dir, name: &str) -> Result<Dir, Errno> {
        let p = format!("{}/{name}", Self::dir(parent));
        self.client.create_dir(&p).map_err(io)?;
        Ok(Dir::Path(Box::leak(p.into_boxed_str())))
    }
    fn create(&self, dir: Dir, name: &str) -> Result<(), Errno> {
        Self::at(dir, name, |p| {
            self.client
                .open(p, OpenOptions::new().write(true).create(true))
                .map(drop)
                .map_err(io)
        })
    }
    fn create_with(&self, dir: Dir, name: &str, data: &[u8]) -> Result<(), Errno> {
        Self::at(dir, name, |p| self.client.write(p, data).map_err(io))
    }
    fn create_fsync(&self, dir: Dir, name: &str) -> Result<(), Errno> {
        Self::at(dir, name, |p| {
            self.client
                .open(p, OpenOptions::new().write(true).create(true))
                .and_then(|f| f.sync_all())
                .map_err(io)
        })
    }
    fn unlink(&self, dir: Dir, name: &str) -> Result<(), Errno> {
        Self::at(dir, name, |p| self.client.remove_file(p).map_err(io))
    }
    fn rename(&self, dir: Dir, from: &str, to: &str) -> Result<(), Errno> {
        let to = format!("{}/{to}", Self::dir(dir));
        Self::at(dir, from, |p| self.client.rename(p, &to).map_err(io))
    }
    fn stat(&self, dir: Dir, name: &str) -> Result<(), Errno> {
        Self::at(dir, name, |p| {
            self.client.symlink_metadata(p).map(drop).map_err(io)
        })
    }
    fn open_read(&self, dir: Dir, name: &str, buf: &mut [u8]) -> Result<usize, Errno> {
        Self::at(dir, name, |p| {
            use std::io::Read;
            self.client
                .open(p, OpenOptions::new().read(true))
                .and_then(|mut f| f.read(buf))
                .map_err(io)
        })
    }
    fn list(&self, dir: Dir, names: &mut Vec<String>) -> Result<(), Errno> {
        let path = match Self::dir(dir) {
            "" => "/",
            p => p,
        };
        let entries = self.client.read_dir(path).map_err(io)?;
        names.clear();
        names.extend(
            entries
                .into_iter()
                .map(|e| String::from_utf8_lossy(&e.name).into_owned()),
        );
        Ok(())
    }
    fn engine(&self) -> Option<&Filesystem> {
        Some(&self.engine.fs)
    }
}

/// Creates `name` in `dir` (`openat(O_CREAT|O_WRONLY)`), runs `f` on the descriptor, closes it.
fn with_new_fd(
    dir: Dir,
    name: &str,
    f: impl FnOnce(i32) -> Result<(), Errno>,
) -> Result<(), Errno> {
    let n = cname(name);
    let flags = libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC;
    // SAFETY: `n` is a valid C string and the directory fd stays open for the adapter's life.
    let fd = rc(unsafe { libc::openat(fd(dir), n.as_ptr(), flags, 0o644) })?;
    let r = f(fd);
    // SAFETY: `fd` was opened above and is closed once.
    unsafe { libc::close(fd) };
    r
}

/// Syscall adapter: a fresh directory under a path of any filesystem.
pub struct Syscalls {
    root: PathBuf,
    base: i32,
    dirs: std::sync::Mutex<Vec<i32>>,
}

impl Syscalls {
    /// Creates a fresh working directory under `path`.
    pub fn new(path: &Path, tag: &str) -> std::io::Result<Syscalls> {
        let root = path.join(format!(
            "lanefs-bench-{tag}-{}-{:x}",
            std::process::id(),
            nanos()
        ));
        std::fs::create_dir(&root)?;
        let c = CString::new(root.as_os_str().as_bytes()).expect("no NUL");
        // SAFETY: valid C string; the fd is owned by this struct and closed in Drop.
        let base = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY) };
        if base < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Syscalls {
            root,
            base,
            dirs: Default::default(),
        })
    }
}

fn nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

impl Drop for Syscalls {
    fn drop(&mut self) {
        for &d in self
            .dirs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .chain([&self.base])
        {
            // SAFETY: fds opened by this adapter and not closed elsewhere.
            unsafe { libc::close(d) };
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

// SAFETY for every block below: the C strings and buffers live for the duration of the call;
// directory fds stay open until the adapter is dropped.
impl Adapter for Syscalls {
    fn base(&self) -> Dir {
        Dir::Fd(self.base)
    }
    fn mkdir(&self, parent: Dir, name: &str) -> Result<Dir, Errno> {
        let n = cname(name);
        // SAFETY: see the impl comment.
        let d = unsafe {
            rc(libc::mkdirat(fd(parent), n.as_ptr(), 0o755))?;
            rc(libc::openat(
                fd(parent),
                n.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY,
            ))?
        };
        self.dirs.lock().unwrap_or_else(|e| e.into_inner()).push(d);
        Ok(Dir::Fd(d))
    }
    fn create(&self, dir: Dir, name: &str) -> Result<(), Errno> {
        with_new_fd(dir, name, |_| Ok(()))
    }
    fn create_with(&self, dir: Dir, name: &str, data: &[u8]) -> Result<(), Errno> {
        with_new_fd(dir, name, |f| {
            // SAFETY: `data` is valid for reads of its length; `f` is open.
            let n = unsafe { libc::write(f, data.as_ptr().cast(), data.len()) };
            if n < 0 { Err(last_errno()) } else { Ok(()) }
        })
    }
    fn create_fsync(&self, dir: Dir, name: &str) -> Result<(), Errno> {
        // SAFETY: `f` is open.
        with_new_fd(dir, name, |f| rc(unsafe { libc::fsync(f) }).map(drop))
    }
    fn unlink(&self, dir: Dir, name: &str) -> Result<(), Errno> {
        let n = cname(name);
        // SAFETY: see the impl comment.
        unsafe { rc(libc::unlinkat(fd(dir), n.as_ptr(), 0)).map(drop) }
    }
    fn rename(&self, dir: Dir, from: &str, to: &str) -> Result<(), Errno> {
        let (a, b) = (cname(from), cname(to));
        // SAFETY: see the impl comment.
        unsafe { rc(libc::renameat(fd(dir), a.as_ptr(), fd(dir), b.as_ptr())).map(drop) }
    }
    fn stat(&self, dir: Dir, name: &str) -> Result<(), Errno> {
        let n = cname(name);
        // SAFETY: see the impl comment; `st` is a valid out-buffer.
        unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            rc(libc::fstatat(
                fd(dir),
                n.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            ))
            .map(drop)
        }
    }
    fn open_read(&self, dir: Dir, name: &str, buf: &mut [u8]) -> Result<usize, Errno> {
        let n = cname(name);
        // SAFETY: see the impl comment.
        unsafe {
            let f = rc(libc::openat(
                fd(dir),
                n.as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            ))?;
            let r = libc::read(f, buf.as_mut_ptr().cast(), buf.len());
            libc::close(f);
            if r < 0 {
                Err(last_errno())
            } else {
                Ok(r as usize)
            }
        }
    }
    fn list(&self, dir: Dir, names: &mut Vec<String>) -> Result<(), Errno> {
        names.clear();
        // SAFETY: see the impl comment; `d` is the stream fdopendir made of `f`, read by this
        // thread only and closed once (closing `f` with it), and each entry readdir returns
        // is read before the next call.
        unsafe {
            let f = rc(libc::openat(
                fd(dir),
                c".".as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            ))?;
            let d = libc::fdopendir(f);
            if d.is_null() {
                let e = last_errno();
                libc::close(f);
                return Err(e);
            }
            loop {
                let e = libc::readdir(d);
                if e.is_null() {
                    break;
                }
                let n = std::ffi::CStr::from_ptr((*e).d_name.as_ptr()).to_bytes();
                if n != b"." && n != b".." {
                    names.push(String::from_utf8_lossy(n).into_owned());
                }
            }
            libc::closedir(d);
        }
        Ok(())
    }
}
