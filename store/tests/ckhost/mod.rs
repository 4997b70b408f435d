//! A host for tests: the real one, with the checkpoint's database (`checkpoint.redb`) slowed
//! down or failing on demand ([`Knobs`]), shared by the tests of the journal's bound.
#![allow(dead_code)]

use std::ffi::OsString;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::time::Duration;

use lanefs_store::disk::{Disk, DiskFile, RealDisk};

/// How the wrapped checkpoint database behaves now.
#[derive(Default)]
pub struct Knobs {
    /// Every flush is this late.
    pub delay_ms: AtomicU64,
    /// Flushes fail.
    pub fail_sync: AtomicBool,
    /// Writes fail.
    pub fail_write: AtomicBool,
    /// Flushes asked for.
    pub syncs: AtomicU64,
    /// Failures injected.
    pub failed: AtomicU64,
}

/// The real host, with `checkpoint.redb` behaving as `k` says.
pub struct Host {
    pub k: Arc<Knobs>,
}

struct CkFile {
    inner: Arc<dyn DiskFile>,
    k: Arc<Knobs>,
}

fn injected() -> io::Error {
    io::Error::other("injected checkpoint failure")
}

impl DiskFile for CkFile {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        self.inner.read_at(buf, off)
    }
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        if self.k.fail_write.load(SeqCst) {
            self.k.failed.fetch_add(1, SeqCst);
            return Err(injected());
        }
        self.inner.write_at(buf, off)
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        let d = self.k.delay_ms.load(SeqCst);
        if d > 0 {
            std::thread::sleep(Duration::from_millis(d));
        }
        self.k.syncs.fetch_add(1, SeqCst);
        if self.k.fail_sync.load(SeqCst) {
            self.k.failed.fetch_add(1, SeqCst);
            return Err(injected());
        }
        self.inner.sync_data()
    }
    fn write_blocks(&self, buf: &[u8], off: u64) -> io::Result<()> {
        if self.k.fail_write.load(SeqCst) {
            self.k.failed.fetch_add(1, SeqCst);
            return Err(injected());
        }
        self.inner.write_blocks(buf, off)
    }
    fn read_blocks(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        self.inner.read_blocks(buf, off)
    }
    fn allocate(&self, len: u64) -> io::Result<()> {
        self.inner.allocate(len)
    }
}

impl Disk for Host {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        RealDisk.create_dir_all(path)
    }
    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn DiskFile>> {
        let f = RealDisk.open(path, create)?;
        Ok(
            match path.file_name().is_some_and(|n| n == "checkpoint.redb") {
                true => Arc::new(CkFile {
                    inner: f,
                    k: self.k.clone(),
                }),
                false => f,
            },
        )
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        RealDisk.remove(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        RealDisk.rename(from, to)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<OsString>> {
        RealDisk.list(dir)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        RealDisk.sync_dir(dir)
    }
    fn exists(&self, path: &Path) -> bool {
        RealDisk.exists(path)
    }
    fn lock(&self, path: &Path) -> io::Result<Box<dyn Send + Sync>> {
        RealDisk.lock(path)
    }
}
