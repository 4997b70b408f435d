//! What a directory inode holds beyond its attributes ([`DirBody`]): its entries live in the
//! filesystem-wide tables of this module, so an empty directory costs only this.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Acquire;

use parking_lot::Mutex;

use super::Runs;
use super::life::DirLife;
use crate::id::InoGen;

/// State a directory keeps beyond its attributes. Its entries live in the filesystem-wide
/// tables (`dir/`), so an empty directory costs only this.
pub(crate) struct DirBody {
    /// ALIVE, DYING or DEAD: the removal protocol of `dir/life.rs`.
    pub life: DirLife,
    /// The parent directory (an `InoGen`; the root's is itself). Changed only under the
    /// `rename` lock, by a rename that moves this directory.
    pub parent: AtomicU64,
    /// The ordered index of the directory's entries (`dir/index.rs`).
    pub runs: Runs,
    /// The per-directory lock of the `dirlock` locking mode; unused under `lanes`.
    pub lock: Mutex<()>,
    /// A byte with one valid value: its 255 invalid values hold [`Body`]'s variant tag (the
    /// other variants fit beside it), so `Body` costs 24 bytes, not 32.
    _niche: DirNiche,
}

#[derive(Clone, Copy)]
#[repr(u8)]
enum DirNiche {
    Dir = 0,
}

impl DirBody {
    pub fn new(parent: InoGen) -> Self {
        DirBody {
            life: DirLife::new(),
            parent: AtomicU64::new(parent.raw()),
            runs: Runs::new(),
            lock: Mutex::new(()),
            _niche: DirNiche::Dir,
        }
    }

    /// The parent directory's word.
    #[inline]
    pub fn parent(&self) -> InoGen {
        InoGen::from_raw(self.parent.load(Acquire))
    }
}
