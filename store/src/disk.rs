//! The storage seam: every byte the store reads or writes, and every flush it asks for, goes
//! through [`Disk`], so that a test can keep what was written apart from what was made
//! durable and cut the power anywhere.
//!
//! - [`RealDisk`]: the host filesystem (`std::fs`, `pwrite`, `fdatasync`).
//! - [`SimDisk`]: in memory. Each file keeps its contents as written and as last made durable
//!   (`sync_data`); each directory keeps its names as they are and as last made durable
//!   (`sync_dir`). [`SimDisk::crash`] builds the disk a power cut would leave: durable state,
//!   plus any subset of the writes and name changes not yet flushed (writes torn at 512-byte
//!   sectors, name changes applied as a prefix, as a journaling host filesystem orders
//!   them). A hook ([`SimDisk::on_sync`]) runs around every flush, where a test takes its
//!   crash images.
//!
//! Contract the store relies on (POSIX, and what ext4, xfs and btrfs give): `sync_data` of a
//! file makes its contents (and its size) durable; a new name, a removal or a rename is
//! durable once its directory is synced; nothing else is promised.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

/// A host filesystem, real or simulated (see the module doc).
pub trait Disk: Send + Sync + 'static {
    /// Creates a directory and its parents (made durable with [`Disk::sync_dir`]).
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Opens a file for reading and writing; `create` makes it if missing.
    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn DiskFile>>;
    /// Removes a file.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Renames a file, replacing `to`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// The names in a directory.
    fn list(&self, dir: &Path) -> io::Result<Vec<OsString>>;
    /// Makes the names in `dir` durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Whether `path` exists.
    fn exists(&self, path: &Path) -> bool;
    /// Takes the exclusive lock of `path` (creating the file), held until the returned guard
    /// is dropped; `WouldBlock` if someone holds it.
    fn lock(&self, path: &Path) -> io::Result<Box<dyn Send + Sync>>;
    /// Writes, into the lock file `path` this process holds, who holds it (this process's id)
    /// and `note`, what it is doing, for whoever finds the lock held ([`Disk::lock_holder`]).
    /// Nothing by default (a simulated disk keeps no lock file).
    fn note_lock(&self, path: &Path, note: &str) -> io::Result<()> {
        let _ = (path, note);
        Ok(())
    }
    /// Who holds the lock of `path`, as far as the host can tell (`None`: it cannot).
    fn lock_holder(&self, path: &Path) -> Option<Holder> {
        let _ = path;
        None
    }
    /// The size in bytes of the filesystem holding `dir`, if known (a store's default size
    /// limit: it may hold as much as its disk, not as much as the host's memory).
    fn capacity(&self, dir: &Path) -> Option<u64> {
        let _ = dir;
        None
    }
    /// The bytes the filesystem holding `dir` can still take, if known (what `statfs`
    /// reports as available through a store: no more than its host has).
    fn available(&self, dir: &Path) -> Option<u64> {
        let _ = dir;
        None
    }
}

/// Who holds a store's lock (docs/STORE.md, "The lock file").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// The holding process's id: the host's lock table says (`/proc/locks`), or else the
    /// lock file.
    pub pid: Option<u32>,
    /// What the holder wrote it is doing ([`Disk::note_lock`]); empty if the lock file does
    /// not name that process.
    pub note: String,
}

/// The lock file's text: the holder's process id on the first line, then its note.
fn lock_text(pid: u32, note: &str) -> String {
    format!("{pid}\n{note}")
}

/// The process id and note in a lock file's text ([`lock_text`]).
fn parse_lock_text(text: &str) -> Option<(u32, String)> {
    let (pid, note) = text.split_once('\n').unwrap_or((text, ""));
    Some((pid.trim().parse().ok()?, note.to_string()))
}

/// The process holding a `flock` on the file with device `dev` and inode `ino`, from
/// `/proc/locks` (lines such as `1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF`; the
/// device's major and minor in hex; waiters' lines have `->` and are skipped).
fn flock_holder(locks: &str, dev: u64, ino: u64) -> Option<u32> {
    let want = format!("{:02x}:{:02x}:{ino}", libc::major(dev), libc::minor(dev));
    locks.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(1) == Some(&"FLOCK") && f.get(5) == Some(&want.as_str()))
            .then(|| f.get(4)?.parse().ok())
            .flatten()
    })
}

/// `statvfs(2)` of `dir`.
fn statvfs(dir: &Path) -> Option<libc::statvfs> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path and `st` points to writable memory of the
    // struct's size, which statvfs fills when it returns 0.
    if unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled `st`.
    Some(unsafe { st.assume_init() })
}

/// An open file of a [`Disk`].
#[allow(clippy::len_without_is_empty)]
pub trait DiskFile: Send + Sync {
    /// Reads at `off`; returns the bytes read (fewer at the end of the file).
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize>;
    /// Writes all of `buf` at `off`, growing the file if needed.
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()>;
    /// Its length.
    fn len(&self) -> io::Result<u64>;
    /// Truncates or extends (with zeros).
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Makes its contents and size durable.
    fn sync_data(&self) -> io::Result<()>;
    /// [`DiskFile::write_at`] of whole blocks: `buf`'s address, its length and `off` are
    /// multiples of [`BLOCK`]. The real disk writes these around the host's page cache
    /// (`O_DIRECT`, where the host supports it), so that appending to the journal costs no
    /// copy into, and no zeroing of, cache pages that are never read again.
    fn write_blocks(&self, buf: &[u8], off: u64) -> io::Result<()> {
        self.write_at(buf, off)
    }
    /// [`DiskFile::read_at`] of whole blocks (`buf`'s address, its length and `off` are
    /// multiples of [`BLOCK`]); returns the bytes read, fewer at the end of the file. The real
    /// disk reads these around the host's page cache too, so that the checkpointer's reading
    /// of the journal back fills no cache pages (and copies nothing out of them).
    fn read_blocks(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        self.read_at(buf, off)
    }
    /// Reserves space for its first `len` bytes, reading as zeros where nothing was written
    /// (`fallocate`; where the host cannot, the same as extending it with zeros).
    fn allocate(&self, len: u64) -> io::Result<()> {
        if self.len()? < len {
            self.set_len(len)?;
        }
        Ok(())
    }
}

impl dyn DiskFile {
    /// Reads exactly `buf.len()` bytes at `off`, or fails with `UnexpectedEof`.
    pub fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            match self.read_at(&mut buf[done..], off + done as u64)? {
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                n => done += n,
            }
        }
        Ok(())
    }

    /// The whole file.
    pub fn read_all(&self) -> io::Result<Vec<u8>> {
        let mut v = vec![0u8; self.len()? as usize];
        self.read_exact_at(&mut v, 0)?;
        Ok(v)
    }
}

/// The host's filesystem.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealDisk;

impl Disk for RealDisk {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir_all(path)
    }

    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn DiskFile>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .open(path)?;
        Ok(Arc::new(RealFile {
            file,
            path: path.to_path_buf(),
            direct: std::sync::OnceLock::new(),
        }))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<OsString>> {
        std::fs::read_dir(dir)?
            .map(|e| e.map(|e| e.file_name()))
            .collect()
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn capacity(&self, dir: &Path) -> Option<u64> {
        statvfs(dir).map(|st| st.f_blocks.saturating_mul(st.f_frsize))
    }

    fn available(&self, dir: &Path) -> Option<u64> {
        statvfs(dir).map(|st| st.f_bavail.saturating_mul(st.f_frsize))
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn lock(&self, path: &Path) -> io::Result<Box<dyn Send + Sync>> {
        use std::os::fd::AsRawFd;
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        // SAFETY: `f` is an open descriptor for the duration of the call.
        let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        // The lock lives as long as the descriptor.
        Ok(Box::new(f))
    }

    fn note_lock(&self, path: &Path, note: &str) -> io::Result<()> {
        let f = OpenOptions::new().write(true).open(path)?;
        f.set_len(0)?;
        f.write_all_at(lock_text(std::process::id(), note).as_bytes(), 0)
    }

    fn lock_holder(&self, path: &Path) -> Option<Holder> {
        use std::os::unix::fs::MetadataExt;
        let md = std::fs::metadata(path).ok()?;
        let locked = std::fs::read_to_string("/proc/locks")
            .ok()
            .and_then(|l| flock_holder(&l, md.dev(), md.ino()));
        let written = std::fs::read_to_string(path)
            .ok()
            .and_then(|t| parse_lock_text(&t));
        Some(match (locked, written) {
            (Some(pid), Some((p, note))) if p == pid => Holder {
                pid: Some(pid),
                note,
            },
            (Some(pid), _) => Holder {
                pid: Some(pid),
                note: String::new(),
            },
            // The host's lock table cannot be read: the lock file says.
            (None, Some((pid, note))) => Holder {
                pid: Some(pid),
                note,
            },
            (None, None) => Holder {
                pid: None,
                note: String::new(),
            },
        })
    }
}

/// The unit of [`DiskFile::write_blocks`]: the largest logical block size of common
/// devices, so that direct writes are aligned for any of them.
pub const BLOCK: usize = 4096;

/// A file of the host, and (opened at its first block write or read) a second descriptor of
/// it that writes and reads around the page cache.
struct RealFile {
    file: File,
    path: PathBuf,
    /// `None` where the host refuses `O_DIRECT` (tmpfs, some network filesystems).
    direct: std::sync::OnceLock<Option<File>>,
}

/// Whether `buf`'s address and length and `off` are whole blocks.
fn in_blocks(buf: &[u8], off: u64) -> bool {
    (buf.as_ptr() as usize).is_multiple_of(BLOCK)
        && buf.len().is_multiple_of(BLOCK)
        && off.is_multiple_of(BLOCK as u64)
}

impl RealFile {
    /// The descriptor that bypasses the page cache, opened at first use.
    fn direct(&self) -> Option<&File> {
        use std::os::unix::fs::OpenOptionsExt;
        self.direct
            .get_or_init(|| {
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(&self.path)
                    .ok()
            })
            .as_ref()
    }
}

impl DiskFile for RealFile {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        FileExt::read_at(&self.file, buf, off)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        FileExt::write_all_at(&self.file, buf, off)
    }
    fn write_blocks(&self, buf: &[u8], off: u64) -> io::Result<()> {
        debug_assert!(in_blocks(buf, off));
        match self.direct().map(|d| FileExt::write_all_at(d, buf, off)) {
            // A host that takes O_DIRECT at open but not for this write.
            Some(Err(e)) if e.raw_os_error() == Some(libc::EINVAL) => self.write_at(buf, off),
            Some(r) => r,
            None => self.write_at(buf, off),
        }
    }
    fn read_blocks(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        debug_assert!(in_blocks(buf, off));
        match self.direct().map(|d| FileExt::read_at(d, buf, off)) {
            Some(Err(e)) if e.raw_os_error() == Some(libc::EINVAL) => self.read_at(buf, off),
            Some(r) => r,
            None => self.read_at(buf, off),
        }
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn allocate(&self, len: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        // SAFETY: a valid descriptor; fallocate with mode 0 only allocates.
        let r = unsafe { libc::fallocate(self.file.as_raw_fd(), 0, 0, len as libc::off_t) };
        match r {
            0 => Ok(()),
            _ => match io::Error::last_os_error() {
                e if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                    if self.len()? < len {
                        self.file.set_len(len)?;
                    }
                    Ok(())
                }
                e => Err(e),
            },
        }
    }
}

/// Where a flush of a [`SimDisk`] is, for its hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncPoint {
    /// About to make a file or directory durable (nothing of it is yet).
    Before,
    /// Just made it durable.
    After,
}

type Hook = Box<dyn FnMut(&SimDisk, SyncPoint) + Send>;

/// A simulated disk (see the module doc). Cloning shares it.
#[derive(Clone, Default)]
pub struct SimDisk {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<SimState>,
    hook: Mutex<Option<Hook>>,
}

#[derive(Clone, Default)]
struct SimState {
    next_id: u64,
    files: HashMap<u64, SimFileState>,
    /// Names as they are, and as last made durable, by full path.
    names: BTreeMap<PathBuf, u64>,
    durable_names: BTreeMap<PathBuf, u64>,
    /// Name changes since their directory was last synced, in order.
    pending_names: Vec<NameOp>,
    dirs: Vec<PathBuf>,
    /// Paths locked with `lock`.
    locked: Vec<PathBuf>,
    /// Flushes so far.
    syncs: u64,
    /// Error injection: writes and allocations fail with ENOSPC once more than this many
    /// bytes would be stored.
    space: Option<u64>,
    /// Error injection: every operation fails with EIO.
    failing: bool,
    /// Error injection: reads of the file with this name fail with EIO.
    failing_reads: Option<PathBuf>,
    /// Error injection: the file with this name cannot grow (ENOSPC).
    full_file: Option<PathBuf>,
}

#[derive(Clone, Default)]
struct SimFileState {
    data: Vec<u8>,
    durable: Vec<u8>,
    /// Changes since the last `sync_data`, in order.
    pending: Vec<Change>,
    /// Calls of `read_at` so far.
    reads: u64,
    /// Open handles ([`SimFile`]s): a removed file's space is freed after its last one.
    handles: u32,
}

#[derive(Clone)]
enum Change {
    Write { off: u64, len: usize },
    SetLen(u64),
}

#[derive(Clone)]
enum NameOp {
    Link(PathBuf, u64),
    Unlink(PathBuf),
}

impl NameOp {
    fn dir(&self) -> &Path {
        match self {
            NameOp::Link(p, _) | NameOp::Unlink(p) => p.parent().unwrap_or(Path::new("/")),
        }
    }
}

/// How [`SimDisk::crash`] treats what was written but not flushed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unflushed {
    /// None of it reached the disk.
    Lost,
    /// All of it did (as after a process crash: the host's page cache survives).
    Kept,
    /// Any sectors of it, and a prefix of the name changes, chosen by this seed.
    Torn(u64),
}

impl std::fmt::Debug for SimDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.shared.state.lock();
        f.debug_struct("SimDisk")
            .field("files", &s.names.len())
            .field("syncs", &s.syncs)
            .finish()
    }
}

fn not_found() -> io::Error {
    io::ErrorKind::NotFound.into()
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

/// A tiny deterministic generator for crash images (no dependency needed for this).
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

impl SimDisk {
    /// An empty disk.
    pub fn new() -> SimDisk {
        SimDisk::default()
    }

    /// Runs `hook` before and after every flush (replacing any hook set before). The hook must
    /// not flush this disk itself; it may take crash images.
    pub fn on_sync(&self, hook: impl FnMut(&SimDisk, SyncPoint) + Send + 'static) {
        *self.shared.hook.lock() = Some(Box::new(hook));
    }

    /// Removes the hook.
    pub fn clear_hook(&self) {
        *self.shared.hook.lock() = None;
    }

    /// Flushes so far.
    pub fn syncs(&self) -> u64 {
        self.shared.state.lock().syncs
    }

    /// From now on, writes, allocations and growing `set_len`s that would store more than
    /// `bytes` in all fail with ENOSPC (`None`: no limit).
    pub fn set_space(&self, bytes: Option<u64>) {
        self.shared.state.lock().space = bytes;
    }

    /// From now on every operation fails with EIO (or works again).
    pub fn set_failing(&self, failing: bool) {
        self.shared.state.lock().failing = failing;
    }

    /// From now on every read of the file named `path` fails with EIO (`None`: reads work
    /// again): a host that cannot read some of a file's blocks. Writes, flushes and every
    /// other file are untouched. The name is looked up at each read, so the file is the one
    /// that has the name then (through any open descriptor, as after a rename into place).
    pub fn set_read_failing(&self, path: Option<&Path>) {
        self.shared.state.lock().failing_reads = path.map(Path::to_path_buf);
    }

    /// From now on the file named `path` cannot grow (`None`: it can again): a write past its
    /// end, or a `set_len` or an allocation that would lengthen it, fails with ENOSPC, while
    /// writes within it go on, as on a full host whose other files (the journal's segments)
    /// were allocated ahead. Every other file is untouched; the name is looked up at each
    /// call, as for [`SimDisk::set_read_failing`].
    pub fn set_file_full(&self, path: Option<&Path>) {
        self.shared.state.lock().full_file = path.map(Path::to_path_buf);
    }

    /// Reads (calls of `read_at`, failed ones included) of the file named `path` since it
    /// was made or the disk was built by [`SimDisk::crash`] (0 if there is no such file).
    pub fn reads(&self, path: &Path) -> u64 {
        let s = self.shared.state.lock();
        s.names.get(path).map_or(0, |id| s.files[id].reads)
    }

    /// Bytes stored in files that have a name or an open handle.
    pub fn used(&self) -> u64 {
        self.shared.state.lock().used()
    }

    /// The disk a power cut now would leave (see [`Unflushed`]); this one is unchanged.
    pub fn crash(&self, unflushed: Unflushed) -> SimDisk {
        let s = self.shared.state.lock();
        let mut rng = SplitMix(match unflushed {
            Unflushed::Torn(seed) => seed,
            _ => 0,
        });
        let mut names = s.durable_names.clone();
        let kept_names = match unflushed {
            Unflushed::Lost => 0,
            Unflushed::Kept => s.pending_names.len(),
            Unflushed::Torn(_) => (rng.next() % (s.pending_names.len() as u64 + 1)) as usize,
        };
        for op in &s.pending_names[..kept_names] {
            match op {
                NameOp::Link(p, id) => {
                    names.insert(p.clone(), *id);
                }
                NameOp::Unlink(p) => {
                    names.remove(p);
                }
            }
        }
        let mut files = HashMap::new();
        for id in names.values() {
            let f = &s.files[id];
            let mut data = f.durable.clone();
            for c in &f.pending {
                match (unflushed, c) {
                    (Unflushed::Lost, _) => {}
                    (_, Change::SetLen(len)) => {
                        if unflushed == Unflushed::Kept || rng.next().is_multiple_of(2) {
                            data.resize(*len as usize, 0);
                        }
                    }
                    (_, &Change::Write { off, len }) => {
                        // The bytes this write left are in `f.data` unless a later change
                        // replaced them; taking them from there is what the page cache
                        // would have written back.
                        for sector in (off..off + len as u64).step_by(512) {
                            let end = (sector + 512).min(off + len as u64);
                            if unflushed == Unflushed::Kept || rng.next().is_multiple_of(2) {
                                let (a, b) = (sector as usize, end as usize);
                                if b > f.data.len() {
                                    continue;
                                }
                                if data.len() < b {
                                    data.resize(b, 0);
                                }
                                data[a..b].copy_from_slice(&f.data[a..b]);
                            }
                        }
                    }
                }
            }
            files.insert(
                *id,
                SimFileState {
                    durable: data.clone(),
                    data,
                    pending: Vec::new(),
                    reads: 0,
                    handles: 0,
                },
            );
        }
        let state = SimState {
            next_id: s.next_id,
            files,
            durable_names: names.clone(),
            names,
            pending_names: Vec::new(),
            dirs: s.dirs.clone(),
            locked: Vec::new(),
            syncs: 0,
            space: None,
            failing: false,
            failing_reads: None,
            full_file: None,
        };
        SimDisk {
            shared: Arc::new(Shared {
                state: Mutex::new(state),
                hook: Mutex::new(None),
            }),
        }
    }

    /// Every file's path and contents as they are now (for tests that damage a store).
    pub fn files(&self) -> Vec<(PathBuf, Vec<u8>)> {
        let s = self.shared.state.lock();
        s.names
            .iter()
            .map(|(p, id)| (p.clone(), s.files[id].data.clone()))
            .collect()
    }

    /// Replaces a file's contents, durably (for tests that damage a store).
    pub fn put(&self, path: &Path, data: Vec<u8>) {
        let mut s = self.shared.state.lock();
        let id = match s.names.get(path) {
            Some(id) => *id,
            None => {
                s.next_id += 1;
                let id = s.next_id;
                s.names.insert(path.to_path_buf(), id);
                s.durable_names.insert(path.to_path_buf(), id);
                id
            }
        };
        let handles = s.files.get(&id).map_or(0, |f| f.handles);
        s.files.insert(
            id,
            SimFileState {
                durable: data.clone(),
                data,
                pending: Vec::new(),
                reads: 0,
                handles,
            },
        );
    }

    fn flush(&self, f: impl FnOnce(&mut SimState)) -> io::Result<()> {
        if self.shared.state.lock().failing {
            return Err(eio());
        }
        self.hook(SyncPoint::Before);
        {
            let mut s = self.shared.state.lock();
            s.syncs += 1;
            f(&mut s);
        }
        self.hook(SyncPoint::After);
        Ok(())
    }

    fn hook(&self, at: SyncPoint) {
        let mut h = self.shared.hook.lock();
        if let Some(h) = h.as_mut() {
            h(self, at);
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut SimState) -> io::Result<T>) -> io::Result<T> {
        let mut s = self.shared.state.lock();
        if s.failing {
            return Err(eio());
        }
        f(&mut s)
    }
}

impl SimState {
    /// Bytes held by files that still have a name or an open handle (as a host filesystem
    /// frees a removed file's blocks after its last close).
    fn used(&self) -> u64 {
        let named: std::collections::HashSet<u64> = self.names.values().copied().collect();
        self.files
            .iter()
            .filter(|(id, f)| f.handles > 0 || named.contains(id))
            .map(|(_, f)| f.data.len() as u64)
            .sum()
    }

    fn has_dir(&self, dir: &Path) -> bool {
        self.dirs.iter().any(|d| d == dir)
    }

    /// ENOSPC if file `id` would grow by `grow` bytes and cannot ([`SimDisk::set_space`],
    /// [`SimDisk::set_file_full`]). What does not grow a file never fails, even with more
    /// stored than the limit (a limit set below what is stored, as another program filling
    /// the host leaves it): a host filesystem does not refuse a write into blocks a file
    /// has (redb rewrites its header in place when it opens a file).
    fn room(&self, id: u64, grow: u64) -> io::Result<()> {
        if grow == 0 {
            return Ok(());
        }
        let full = self
            .full_file
            .as_ref()
            .is_some_and(|p| self.names.get(p) == Some(&id));
        let over = self.space.is_some_and(|space| self.used() + grow > space);
        if full || over {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        Ok(())
    }
}

impl Disk for SimDisk {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.with(|s| {
            for a in path.ancestors() {
                if !s.has_dir(a) {
                    s.dirs.push(a.to_path_buf());
                }
            }
            Ok(())
        })
    }

    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn DiskFile>> {
        let id = self.with(|s| {
            if let Some(id) = s.names.get(path) {
                return Ok(*id);
            }
            if !create || !s.has_dir(path.parent().unwrap_or(Path::new("/"))) {
                return Err(not_found());
            }
            s.next_id += 1;
            let id = s.next_id;
            s.files.insert(id, SimFileState::default());
            s.names.insert(path.to_path_buf(), id);
            s.pending_names.push(NameOp::Link(path.to_path_buf(), id));
            Ok(id)
        })?;
        if let Some(f) = self.shared.state.lock().files.get_mut(&id) {
            f.handles += 1;
        }
        Ok(Arc::new(SimFile {
            disk: self.clone(),
            id,
        }))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        self.with(|s| {
            s.names.remove(path).ok_or_else(not_found)?;
            s.pending_names.push(NameOp::Unlink(path.to_path_buf()));
            Ok(())
        })
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.with(|s| {
            let id = s.names.remove(from).ok_or_else(not_found)?;
            s.names.insert(to.to_path_buf(), id);
            // As one journaled host operation: the target appears before the source goes.
            s.pending_names.push(NameOp::Link(to.to_path_buf(), id));
            s.pending_names.push(NameOp::Unlink(from.to_path_buf()));
            Ok(())
        })
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<OsString>> {
        self.with(|s| {
            if !s.has_dir(dir) {
                return Err(not_found());
            }
            Ok(s.names
                .keys()
                .filter(|p| p.parent() == Some(dir))
                .filter_map(|p| p.file_name().map(|n| n.to_os_string()))
                .collect())
        })
    }

    fn available(&self, _dir: &Path) -> Option<u64> {
        let s = self.shared.state.lock();
        s.space.map(|room| room.saturating_sub(s.used()))
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let dir = dir.to_path_buf();
        self.flush(|s| {
            let SimState {
                names,
                durable_names,
                pending_names,
                ..
            } = s;
            durable_names.retain(|p, _| p.parent() != Some(&dir));
            for (p, id) in names.iter() {
                if p.parent() == Some(&dir) {
                    durable_names.insert(p.clone(), *id);
                }
            }
            pending_names.retain(|op| op.dir() != dir);
        })
    }

    fn exists(&self, path: &Path) -> bool {
        let s = self.shared.state.lock();
        s.names.contains_key(path) || s.has_dir(path)
    }

    fn lock(&self, path: &Path) -> io::Result<Box<dyn Send + Sync>> {
        let mut s = self.shared.state.lock();
        if s.locked.iter().any(|p| p == path) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        s.locked.push(path.to_path_buf());
        Ok(Box::new(SimLock {
            disk: self.clone(),
            path: path.to_path_buf(),
        }))
    }
}

/// A lock of a [`SimDisk`] path, released on drop.
struct SimLock {
    disk: SimDisk,
    path: PathBuf,
}

impl Drop for SimLock {
    fn drop(&mut self) {
        self.disk
            .shared
            .state
            .lock()
            .locked
            .retain(|p| *p != self.path);
    }
}

/// An open file of a [`SimDisk`].
struct SimFile {
    disk: SimDisk,
    id: u64,
}

impl Drop for SimFile {
    fn drop(&mut self) {
        if let Some(f) = self.disk.shared.state.lock().files.get_mut(&self.id) {
            f.handles = f.handles.saturating_sub(1);
        }
    }
}

impl DiskFile for SimFile {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        self.disk.with(|s| {
            let f = s.files.get_mut(&self.id).expect("open file");
            f.reads += 1;
            if let Some(p) = &s.failing_reads
                && s.names.get(p) == Some(&self.id)
            {
                return Err(eio());
            }
            let d = &s.files[&self.id].data;
            let off = (off as usize).min(d.len());
            let n = buf.len().min(d.len() - off);
            buf[..n].copy_from_slice(&d[off..off + n]);
            Ok(n)
        })
    }

    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        self.disk.with(|s| {
            let end = off as usize + buf.len();
            let grow = end.saturating_sub(s.files[&self.id].data.len()) as u64;
            s.room(self.id, grow)?;
            let f = s.files.get_mut(&self.id).expect("open file");
            if f.data.len() < end {
                f.data.resize(end, 0);
            }
            f.data[off as usize..end].copy_from_slice(buf);
            f.pending.push(Change::Write {
                off,
                len: buf.len(),
            });
            Ok(())
        })
    }

    fn len(&self) -> io::Result<u64> {
        self.disk.with(|s| Ok(s.files[&self.id].data.len() as u64))
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.disk.with(|s| {
            // Growing stores more bytes (this disk counts a file's length as its usage), so
            // it is refused past the space limit like a write or an allocation; else a file
            // grown past the limit would leave every later write failing, even those into
            // space already allocated.
            let grow = len.saturating_sub(s.files[&self.id].data.len() as u64);
            if grow > 0 {
                s.room(self.id, grow)?;
            }
            let f = s.files.get_mut(&self.id).expect("open file");
            f.data.resize(len as usize, 0);
            f.pending.push(Change::SetLen(len));
            Ok(())
        })
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        self.disk.with(|s| {
            let grow = len.saturating_sub(s.files[&self.id].data.len() as u64);
            if grow == 0 {
                return Ok(());
            }
            s.room(self.id, grow)?;
            let f = s.files.get_mut(&self.id).expect("open file");
            f.data.resize(len as usize, 0);
            f.pending.push(Change::SetLen(len));
            Ok(())
        })
    }

    fn sync_data(&self) -> io::Result<()> {
        self.disk.flush(|s| {
            let f = s.files.get_mut(&self.id).expect("open file");
            f.durable = f.data.clone();
            f.pending.clear();
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The holder of a `flock` is found in `/proc/locks` by device and inode; waiters and
    /// other kinds of lock are not it.
    #[test]
    fn a_flock_holder_is_read_from_the_hosts_lock_table() {
        let locks = "1: POSIX  ADVISORY  WRITE 99 fd:01:5678 0 EOF\n\
                     2: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF\n\
                     2: -> FLOCK  ADVISORY  WRITE 77 fd:01:5678 0 EOF\n\
                     3: FLOCK  ADVISORY  WRITE 4321 00:2d:5678 0 EOF\n";
        assert_eq!(
            flock_holder(locks, libc::makedev(0xfd, 1), 5678),
            Some(1234)
        );
        assert_eq!(
            flock_holder(locks, libc::makedev(0, 0x2d), 5678),
            Some(4321)
        );
        assert_eq!(flock_holder(locks, libc::makedev(0, 0x2d), 5679), None);
        assert_eq!(
            parse_lock_text(&lock_text(42, "mounted 0:53 /mnt\nx")),
            Some((42, "mounted 0:53 /mnt\nx".to_string()))
        );
        assert_eq!(parse_lock_text(""), None);
    }

    /// A real lock file names the process holding it and what that process said it does.
    #[test]
    fn a_held_lock_names_its_holder() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("lock");
        let d = RealDisk;
        let held = d.lock(&p).unwrap();
        d.note_lock(&p, "checking").unwrap();
        let me = Some(std::process::id());
        assert_eq!(
            d.lock_holder(&p),
            Some(Holder {
                pid: me,
                note: "checking".into()
            })
        );
        assert_eq!(
            d.lock(&p).err().map(|e| e.kind()),
            Some(io::ErrorKind::WouldBlock)
        );
        drop(held);
        // Someone else's lock, with the file left as it was: the host's lock table names the
        // process, the note is not taken for its.
        std::fs::write(&p, "1\nsomeone else").unwrap();
        let f = File::open(&p).unwrap();
        use std::os::fd::AsRawFd;
        // SAFETY: an open descriptor.
        assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0);
        assert_eq!(
            d.lock_holder(&p),
            Some(Holder {
                pid: me,
                note: String::new()
            })
        );
    }

    #[test]
    fn a_power_cut_keeps_what_was_flushed_and_may_keep_the_rest() {
        let d = SimDisk::new();
        let dir = Path::new("/s");
        d.create_dir_all(dir).unwrap();
        let f = d.open(&dir.join("a"), true).unwrap();
        f.write_at(b"durable", 0).unwrap();
        f.sync_data().unwrap();
        // The name is not durable yet: a power cut loses the file.
        assert!(!d.crash(Unflushed::Lost).exists(&dir.join("a")));
        d.sync_dir(dir).unwrap();
        f.write_at(b"DUR", 0).unwrap();
        let lost = d.crash(Unflushed::Lost);
        let g = lost.open(&dir.join("a"), false).unwrap();
        assert_eq!(g.read_all().unwrap(), b"durable");
        let kept = d.crash(Unflushed::Kept);
        let g = kept.open(&dir.join("a"), false).unwrap();
        assert_eq!(g.read_all().unwrap(), b"DURable");
        // Torn images hold either version of the unflushed sector.
        for seed in 0..20 {
            let t = d.crash(Unflushed::Torn(seed));
            let got = t.open(&dir.join("a"), false).unwrap().read_all().unwrap();
            assert!(got == b"durable" || got == b"DURable", "{got:?}");
        }
    }

    #[test]
    fn renames_and_removals_need_a_directory_sync() {
        let d = SimDisk::new();
        let dir = Path::new("/s");
        d.create_dir_all(dir).unwrap();
        d.open(&dir.join("a"), true).unwrap().sync_data().unwrap();
        d.sync_dir(dir).unwrap();
        d.rename(&dir.join("a"), &dir.join("b")).unwrap();
        let c = d.crash(Unflushed::Lost);
        assert!(c.exists(&dir.join("a")) && !c.exists(&dir.join("b")));
        let c = d.crash(Unflushed::Kept);
        assert!(!c.exists(&dir.join("a")) && c.exists(&dir.join("b")));
        // A torn image never loses both names of a renamed file.
        for seed in 0..20 {
            let c = d.crash(Unflushed::Torn(seed));
            assert!(c.exists(&dir.join("a")) || c.exists(&dir.join("b")));
        }
        d.sync_dir(dir).unwrap();
        let c = d.crash(Unflushed::Lost);
        assert!(!c.exists(&dir.join("a")) && c.exists(&dir.join("b")));
    }

    #[test]
    fn a_limit_below_what_is_stored_refuses_only_growth() {
        let d = SimDisk::new();
        d.create_dir_all(Path::new("/s")).unwrap();
        let f = d.open(Path::new("/s/a"), true).unwrap();
        f.write_at(&[1; 8], 0).unwrap();
        d.set_space(Some(4));
        // Into the bytes the file has: as a host writes into blocks a file holds.
        f.write_at(&[2; 8], 0).unwrap();
        f.set_len(6).unwrap();
        f.allocate(6).unwrap();
        f.sync_data().unwrap();
        for r in [f.write_at(&[3], 6), f.set_len(7), f.allocate(7)] {
            assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::ENOSPC));
        }
        let mut b = [0u8; 8];
        assert_eq!(f.read_at(&mut b, 0).unwrap(), 6);
        assert_eq!(&b[..6], &[2; 6]);
    }

    #[test]
    fn a_removed_files_space_is_freed_after_its_last_handle() {
        let d = SimDisk::new();
        d.create_dir_all(Path::new("/s")).unwrap();
        let f = d.open(Path::new("/s/a"), true).unwrap();
        f.write_at(&[1; 8], 0).unwrap();
        let g = d.open(Path::new("/s/b"), true).unwrap();
        d.set_space(Some(10));
        assert_eq!(
            g.write_at(&[2; 4], 0).unwrap_err().raw_os_error(),
            Some(libc::ENOSPC)
        );
        // Removed but open: still holds its space.
        d.remove(Path::new("/s/a")).unwrap();
        assert_eq!(d.used(), 8);
        assert!(g.write_at(&[2; 4], 0).is_err());
        // A second handle of a named file keeps nothing extra; the last close frees it.
        drop(f);
        assert_eq!(d.used(), 0);
        g.write_at(&[2; 4], 0).unwrap();
        assert_eq!(d.used(), 4);
        // A crash image counts what it names.
        let c = d.crash(Unflushed::Kept);
        assert_eq!(c.used(), 4);
    }

    #[test]
    fn injected_errors_reach_the_caller() {
        let d = SimDisk::new();
        d.create_dir_all(Path::new("/s")).unwrap();
        let f = d.open(Path::new("/s/a"), true).unwrap();
        d.set_space(Some(10));
        assert_eq!(
            f.write_at(&[0; 11], 0).unwrap_err().raw_os_error(),
            Some(libc::ENOSPC)
        );
        f.write_at(&[0; 10], 0).unwrap();
        d.set_failing(true);
        assert_eq!(f.sync_data().unwrap_err().raw_os_error(), Some(libc::EIO));
        d.set_failing(false);
        d.set_space(None);
        // Failing reads of one file: its reads fail (and are counted), its writes and flushes
        // and the other files' reads go on; a rename carries the failure to the new name.
        let g = d.open(Path::new("/s/b"), true).unwrap();
        g.write_at(b"bb", 0).unwrap();
        d.set_read_failing(Some(Path::new("/s/a")));
        let mut b = [0u8; 2];
        assert_eq!(
            f.read_at(&mut b, 0).unwrap_err().raw_os_error(),
            Some(libc::EIO)
        );
        assert_eq!(d.reads(Path::new("/s/a")), 1);
        f.write_at(b"x", 0).unwrap();
        f.sync_data().unwrap();
        assert_eq!(g.read_at(&mut b, 0).unwrap(), 2);
        d.rename(Path::new("/s/b"), Path::new("/s/a")).unwrap();
        assert_eq!(
            g.read_at(&mut b, 0).unwrap_err().raw_os_error(),
            Some(libc::EIO)
        );
        assert_eq!(f.read_at(&mut b, 0).unwrap(), 2, "no longer named /s/a");
        d.set_read_failing(None);
        assert_eq!(g.read_at(&mut b, 0).unwrap(), 2);
        assert_eq!(d.reads(Path::new("/s/a")), 3);
        // A full file: what would lengthen it fails with ENOSPC; writes within it, shrinking,
        // its reads and flushes, and the other files, go on.
        d.set_file_full(Some(Path::new("/s/a")));
        for r in [g.write_at(b"zzz", 0), g.set_len(3), g.allocate(100)] {
            assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::ENOSPC));
        }
        g.write_at(b"z", 1).unwrap();
        g.set_len(1).unwrap();
        g.sync_data().unwrap();
        assert_eq!(g.read_at(&mut b, 0).unwrap(), 1);
        assert_eq!(&b[..1], b"b");
        f.write_at(&[1; 20], 0).unwrap();
        d.set_file_full(None);
        g.write_at(b"zzz", 0).unwrap();
    }
}
