//! Reading file pages back from the checkpoint: the pages the engine sent out of memory
//! (engine `data.rs`, "Pages the store keeps"). The engine may drop a page only once a
//! checkpoint holding its last change has committed (the checkpointer declares the epoch it
//! began with kept only then), so a read transaction begun now sees every such page as the
//! engine last had it.
//!
//! Reads run beside the checkpointer's write transaction (redb readers never wait for its
//! writer) and share redb's page cache with it.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

use lanefs::{Errno, InodeId};
use parking_lot::{Condvar, Mutex, RwLock};
use redb::{Database, ReadableDatabase};

use super::apply::PAGE;
use super::on_demand::ReadFailed;
use super::{DATA, guarded, kv};

/// The checkpoint's open database as the page readers see it (`mod.rs`, "Locking").
pub(crate) type Shared = Arc<SharedDb>;

/// The checkpoint's database shared with the page readers: a slot they take it from, empty
/// while the checkpoint drops and reopens it, marked broken when a read of it failed, and
/// busy while a checkpoint writes or reopens it (readers then wait for its replacement).
#[derive(Default)]
pub(crate) struct SharedDb {
    /// The database (`None` while the checkpoint reopens it after an error), and the number
    /// of the [`SharedDb::put`] that put it there: a reader that waits for a replacement names
    /// the one it failed on by that number, so that it holds no `Arc` of it while it waits
    /// (the reopen waits for every holder to let go: `Checkpoint::close_db`), and a new
    /// `Database` allocated where the old one was is never taken for it.
    db: RwLock<(u64, Option<Arc<Database>>)>,
    /// A read of the database in the slot failed in redb (the host's error): redb refuses
    /// every later transaction of it, reads included, so the checkpointer reopens it.
    broken: AtomicBool,
    /// A checkpoint is writing, or dropping the database to open it again: a reader that
    /// finds the slot empty, or meets redb's error (a failed write transaction makes redb
    /// refuse every later one, reads included), waits for the database that replaces it,
    /// or for the checkpoint to end without one, instead of failing. Changed under `db`'s
    /// write lock; `changed` wakes the waiters.
    busy: AtomicBool,
    /// Signalled, under [`SharedDb::waiting`], when `db` or `busy` changes.
    changed: Condvar,
    waiting: Mutex<()>,
}

impl SharedDb {
    pub(crate) fn new(db: Option<Arc<Database>>) -> Shared {
        Arc::new(SharedDb {
            db: RwLock::new((0, db)),
            broken: AtomicBool::new(false),
            busy: AtomicBool::new(false),
            changed: Condvar::new(),
            waiting: Mutex::new(()),
        })
    }

    /// The database now in the slot, with the number of the put that put it there.
    fn get(&self) -> (u64, Option<Arc<Database>>) {
        self.db.read().clone()
    }

    /// The database in the slot other than the one put by put number `old` (any, without
    /// it), waiting while a checkpoint is busy, however long it takes (a checkpoint on a
    /// loaded host can take seconds to fail and reopen its file, and a read of data the
    /// checkpoint holds must not fail for that); `None` if there is none once it is done.
    /// The caller holds no `Arc` of the old one: the reopen it waits for waits for that.
    fn replacing(&self, old: Option<u64>) -> Option<(u64, Arc<Database>)> {
        let mut w = self.waiting.lock();
        loop {
            if let (n, Some(db)) = self.get()
                && old != Some(n)
            {
                return Some((n, db));
            }
            if !self.busy.load(SeqCst) {
                return None;
            }
            // `busy` and `db` change under `waiting` too, so no change is missed between
            // the checks above and the wait.
            self.changed.wait(&mut w);
        }
    }

    /// Says that a checkpoint is writing or reopening the database (`true`), or is done.
    pub(crate) fn busy(&self, on: bool) {
        let _w = self.waiting.lock();
        self.busy.store(on, SeqCst);
        self.changed.notify_all();
    }

    /// Puts `db` in the slot (`None`: empties it), which is not broken.
    pub(crate) fn put(&self, db: Option<Arc<Database>>) {
        let _w = self.waiting.lock();
        let mut g = self.db.write();
        *g = (g.0 + 1, db);
        self.broken.store(false, SeqCst);
        drop(g);
        self.changed.notify_all();
    }

    /// Says that redb failed reading the database put by put number `n`, if it is still
    /// the one in the slot (a reader of a database already replaced says nothing).
    fn broke(&self, n: u64) {
        let g = self.db.read();
        if g.0 == n && g.1.is_some() {
            self.broken.store(true, SeqCst);
        }
    }

    /// Whether a read found the database in the slot failing.
    pub(crate) fn broken(&self) -> bool {
        self.broken.load(SeqCst)
    }
}

/// Reads pages of the checkpoint (cloned into the store the engine calls).
#[derive(Clone)]
pub(crate) struct PageReader {
    slot: Shared,
    path: PathBuf,
}

impl PageReader {
    pub(crate) fn new(slot: Shared, path: PathBuf) -> Self {
        PageReader { slot, path }
    }

    /// Fills `buf` (a whole number of pages) with pages `first..` of file `inode`. A page the
    /// checkpoint lacks, or one longer than a page, is damage: EIO, said on stderr with the
    /// file it was read from (the engine asks only for pages it was told are there). redb's
    /// error (the host failed a read) is EIO too, and marks the database for the checkpointer
    /// to reopen ([`SharedDb::broken`]): redb fails every later read of it. A read that finds
    /// the database gone, or failing, while a checkpoint is busy waits for the database that
    /// replaces it and reads that ([`SharedDb::busy`]).
    pub(crate) fn read(&self, inode: InodeId, first: u64, buf: &mut [u8]) -> lanefs::Result<()> {
        let n = buf.len() as u64 / PAGE;
        self.with_db(
            |d| read_pages(d, inode, first, buf),
            || format!("file {inode}'s pages {first}..{}", first + n),
        )
    }

    /// Inode `ino` as the checkpoint holds it (`on_demand.rs`), read as [`PageReader::read`]
    /// reads pages: EIO on damage or redb's error, said on stderr.
    pub(crate) fn inode(&self, ino: lanefs::Ino) -> lanefs::Result<Option<lanefs::LoadedInode>> {
        self.with_db(
            |d| {
                let txn = d.begin_read().map_err(db_err)?;
                super::on_demand::inode(&txn, ino)
            },
            || format!("inode {ino}"),
        )
    }

    /// Directory `dir`'s entries as the checkpoint holds them (`on_demand.rs`), as
    /// [`PageReader::inode`].
    pub(crate) fn entries(
        &self,
        dir: lanefs::Ino,
        files: u64,
    ) -> lanefs::Result<Vec<lanefs::LoadedEntry>> {
        self.with_db(
            |d| {
                let txn = d.begin_read().map_err(db_err)?;
                super::on_demand::entries(&txn, dir, files)
            },
            || format!("directory {dir}'s entries"),
        )
    }

    /// Runs `read` on the database in the slot, retrying on the one that replaces it (see
    /// [`PageReader::read`]); `what` names what was read, for the message of a failure.
    fn with_db<T>(
        &self,
        mut read: impl FnMut(&Database) -> Result<T, ReadFailed>,
        what: impl FnOnce() -> String,
    ) -> lanefs::Result<T> {
        let mut db = match self.slot.get() {
            (n, Some(d)) => Some((n, d)),
            (_, None) => self.slot.replacing(None),
        };
        let r = loop {
            let Some((n, d)) = db else {
                break Err("the checkpoint is closed, being reopened after an error".to_string());
            };
            match guarded(|| read(&d), ReadFailed::Db) {
                Ok(v) => break Ok(v),
                Err(ReadFailed::Db(e)) => {
                    // A checkpoint that failed may be reopening it: read that one (once).
                    // Let go of this one first: the reopen waits until no reader holds it.
                    drop(d);
                    if let Some(new) = self.slot.replacing(Some(n)) {
                        db = Some(new);
                        continue;
                    }
                    self.slot.broke(n);
                    break Err(e);
                }
                Err(ReadFailed::Damaged(e)) => break Err(e),
            }
        };
        r.map_err(|e| {
            eprintln!(
                "lanefs: reading {} from {}: {e}",
                what(),
                self.path.display()
            );
            Errno::EIO
        })
    }
}

/// [`PageReader::read`] from `db`.
fn read_pages(db: &Database, inode: InodeId, first: u64, buf: &mut [u8]) -> Result<(), ReadFailed> {
    let n = buf.len() as u64 / PAGE;
    if n == 0 {
        return Ok(());
    }
    let ino = inode.ino.0;
    let txn = db.begin_read().map_err(db_err)?;
    let t = txn.open_table(DATA).map_err(db_err)?;
    let end = first + n;
    let (a, b) = (
        kv::chunk_key(ino, first / kv::CHUNK),
        kv::chunk_key(ino, (end - 1) / kv::CHUNK + 1),
    );
    let mut want = first;
    'chunks: for kvp in t.range::<&[u8]>(&a[..]..&b[..]).map_err(db_err)? {
        let (k, v) = kvp.map_err(db_err)?;
        let chunk = kv::chunk_of(k.value())
            .ok_or_else(|| ReadFailed::Damaged("a page key too short".into()))?;
        if chunk != kv::chunk_at(want).0 {
            break; // The chunk holding `want` is missing.
        }
        let c = kv::Chunk::decode(v.value())
            .map_err(|e| ReadFailed::Damaged(format!("pages from {}: {e}", chunk * kv::CHUNK)))?;
        while want < end && kv::chunk_at(want).0 == chunk {
            let Some(bytes) = c.get(kv::chunk_at(want).1) else {
                break 'chunks;
            };
            let at = ((want - first) * PAGE) as usize;
            buf[at..at + bytes.len()].copy_from_slice(bytes);
            buf[at + bytes.len()..at + PAGE as usize].fill(0);
            want += 1;
        }
    }
    if want < end {
        return Err(ReadFailed::Damaged(format!("page {want} is missing")));
    }
    Ok(())
}

fn db_err(e: impl std::fmt::Display) -> ReadFailed {
    ReadFailed::Db(e.to_string())
}
