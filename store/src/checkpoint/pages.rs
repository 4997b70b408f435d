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

use lanefs::{Errno, InodeId};
use parking_lot::RwLock;
use redb::{Database, ReadableDatabase};

use super::apply::PAGE;
use super::{DATA, guarded, kv};

/// The checkpoint's open database as the page readers see it: `None` while the checkpoint
/// reopens it after an error (`mod.rs`, "Locking").
pub(crate) type Shared = Arc<RwLock<Option<Arc<Database>>>>;

/// Reads pages of the checkpoint (cloned into the store the engine calls).
#[derive(Clone)]
pub(crate) struct PageReader {
    db: Shared,
    path: PathBuf,
}

impl PageReader {
    pub(crate) fn new(db: Shared, path: PathBuf) -> Self {
        PageReader { db, path }
    }

    /// Fills `buf` (a whole number of pages) with pages `first..` of file `inode`. A page the
    /// checkpoint lacks, or one longer than a page, is damage: EIO, said on stderr with the
    /// file it was read from (the engine asks only for pages it was told are there).
    pub(crate) fn read(&self, inode: InodeId, first: u64, buf: &mut [u8]) -> lanefs::Result<()> {
        let n = buf.len() as u64 / PAGE;
        let ino = inode.ino.0;
        let r = guarded(
            || -> Result<(), String> {
                let db = self
                    .db
                    .read()
                    .clone()
                    .ok_or("the checkpoint is closed, being reopened after an error")?;
                let txn = db.begin_read().map_err(|e| e.to_string())?;
                let t = txn.open_table(DATA).map_err(|e| e.to_string())?;
                let (a, b) = (kv::page_key(ino, first), kv::page_key(ino, first + n));
                let mut want = first;
                for kvp in t
                    .range::<&[u8]>(&a[..]..&b[..])
                    .map_err(|e| e.to_string())?
                {
                    let (k, v) = kvp.map_err(|e| e.to_string())?;
                    let page = kv::page_of(k.value()).ok_or("a page key too short")?;
                    if page != want {
                        break;
                    }
                    let bytes = v.value();
                    if bytes.len() > PAGE as usize {
                        return Err(format!("page {page} holds {} bytes", bytes.len()));
                    }
                    let at = ((page - first) * PAGE) as usize;
                    buf[at..at + bytes.len()].copy_from_slice(bytes);
                    buf[at + bytes.len()..at + PAGE as usize].fill(0);
                    want += 1;
                }
                if want < first + n {
                    return Err(format!("page {want} is missing"));
                }
                Ok(())
            },
            |e| e,
        );
        r.map_err(|e| {
            eprintln!(
                "lanefs: reading file {inode}'s pages {first}..{} from {}: {e}",
                first + n,
                self.path.display()
            );
            Errno::EIO
        })
    }
}
