//! Why a store cannot be opened or checked: one line that names the file, and for damage the
//! byte offset, so that a person can look.

use std::io;
use std::path::PathBuf;

/// An error opening, recovering or checking a store.
#[derive(Debug)]
pub enum StoreError {
    /// The host refused an operation.
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The host's error.
        source: io::Error,
    },
    /// Bytes that are not what the format says, somewhere other than a torn tail.
    Damaged {
        /// The file.
        path: PathBuf,
        /// The byte offset in it.
        offset: u64,
        /// What is wrong there.
        what: String,
    },
    /// Another server (or `fsck`, or `compact`) has the store open.
    Locked {
        /// The lock file.
        path: PathBuf,
        /// Who holds it, where the host can tell.
        holder: Option<crate::Holder>,
    },
    /// The directory holds something that is not a lanefs store.
    NotAStore {
        /// The directory.
        path: PathBuf,
        /// What was found.
        what: String,
    },
}

impl StoreError {
    pub(crate) fn io(path: impl Into<PathBuf>, op: &'static str) -> impl FnOnce(io::Error) -> Self {
        let path = path.into();
        move |source| StoreError::Io { path, op, source }
    }

    pub(crate) fn damaged(path: impl Into<PathBuf>, offset: u64, what: impl Into<String>) -> Self {
        StoreError::Damaged {
            path: path.into(),
            offset,
            what: what.into(),
        }
    }
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Io { path, op, source } => {
                write!(f, "{}: {op}: {source}", path.display())
            }
            StoreError::Damaged { path, offset, what } => {
                write!(f, "{}: damaged at byte {offset}: {what}", path.display())
            }
            StoreError::Locked { path, holder } => {
                write!(f, "{}: the store is in use", path.display())?;
                match holder {
                    Some(crate::Holder {
                        pid: Some(pid),
                        note,
                    }) if !note.is_empty() => {
                        write!(f, " by process {pid} ({})", note.replace('\n', " "))
                    }
                    Some(crate::Holder { pid: Some(pid), .. }) => write!(f, " by process {pid}"),
                    _ => write!(f, " by another process"),
                }
            }
            StoreError::NotAStore { path, what } => {
                write!(f, "{}: not a lanefs store: {what}", path.display())
            }
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StoreError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
