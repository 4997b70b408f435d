//! redb's storage through the store's storage seam ([`crate::disk::Disk`]), so that the
//! checkpoint's writes and flushes are the host's, or a simulated disk's in crash tests.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::disk::DiskFile;

/// A checkpoint file as redb's backend.
pub(crate) struct Backend {
    file: Arc<dyn DiskFile>,
    path: PathBuf,
}

impl Backend {
    pub(crate) fn new(file: Arc<dyn DiskFile>, path: &Path) -> Backend {
        Backend {
            file,
            path: path.to_path_buf(),
        }
    }
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend").field("path", &self.path).finish()
    }
}

impl redb::StorageBackend for Backend {
    fn len(&self) -> io::Result<u64> {
        self.file.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.file.read_exact_at(out, offset)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.file.write_at(data, offset)
    }
}
