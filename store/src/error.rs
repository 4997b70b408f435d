//! Why a store cannot be opened or checked ([`StoreError`]): one line that names the file,
//! and for damage the byte offset, so that a person can look. Why a checkpoint was abandoned
//! ([`CheckpointError`]).

use std::io;
use std::path::PathBuf;

use lanefs::Errno;

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

/// Why a checkpoint was abandoned ([`crate::StoreHandle::checkpoint`]). The journal keeps
/// every record: nothing is lost, and the next checkpoint starts from the same place.
#[derive(Debug)]
#[non_exhaustive]
pub enum CheckpointError {
    /// The journal could not make the records durable before the checkpoint took them (the
    /// errno of its commit); none was taken.
    JournalCommit(Errno),
    /// The journal could not make every record durable for lack of room: the records that
    /// were durable were taken instead.
    DurableTaken {
        /// The errno of the journal's commit.
        errno: Errno,
        /// Records applied.
        applied: u64,
        /// The LSN of the last record that was durable.
        durable: u64,
    },
    /// The store's files refused: reading the journal (damage in it included), or taking
    /// the segments a commit covered out of it.
    Store(StoreError),
    /// The checkpoint was committed, but the segments it covers could not be taken out of the
    /// journal (a later checkpoint does).
    Recycle(StoreError),
    /// A record could not be applied to the checkpoint's keys: it does not fit them, or redb
    /// failed.
    Record {
        /// The record's LSN.
        lsn: u64,
        /// What went wrong.
        what: String,
    },
    /// What records `first..=last` did to other inodes (directories' times, cookies) could
    /// not be written.
    Records {
        /// The LSN of the first record.
        first: u64,
        /// The LSN of the last.
        last: u64,
        /// What went wrong.
        what: String,
    },
    /// A record read back from the journal does not decode.
    Decode(String),
    /// Writing back the pages and inodes changed, before the commit, failed.
    WriteBack(String),
    /// redb failed (or panicked) beginning, writing or committing the transaction: the
    /// database is dropped and reopened.
    Database(String),
    /// The checkpoint was stopped: the store is closing.
    Stopped,
    /// The database could not be reopened after redb failed.
    Reopen(StoreError),
    /// The reopened database holds fewer records than a commit that had succeeded.
    CommitLost {
        /// The checkpoint's file.
        path: PathBuf,
        /// The LSN the reopened database holds every record up to.
        holds: u64,
        /// The LSN of the commit that had succeeded.
        committed: u64,
    },
    /// A checkpoint failed in redb, and reopening the database after it failed too.
    ThenReopen {
        /// Why the checkpoint failed.
        failure: Box<CheckpointError>,
        /// Why the reopen failed.
        reopen: Box<CheckpointError>,
    },
}

impl std::fmt::Display for CheckpointError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CheckpointError::JournalCommit(e) => write!(f, "journal commit: {e}"),
            CheckpointError::DurableTaken {
                errno,
                applied,
                durable,
            } => write!(
                f,
                "journal commit: {errno}; the {applied} records up to {durable} that were durable \
                 were taken"
            ),
            CheckpointError::Store(e) => write!(f, "{e}"),
            CheckpointError::Recycle(e) => write!(f, "the checkpoint is committed, but: {e}"),
            CheckpointError::Record { lsn, what } => write!(f, "record {lsn}: {what}"),
            CheckpointError::Records { first, last, what } => {
                write!(f, "record {first}..={last}: {what}")
            }
            CheckpointError::Decode(what) | CheckpointError::Database(what) => f.write_str(what),
            CheckpointError::WriteBack(what) => {
                write!(f, "writing back pages and inodes: {what}")
            }
            CheckpointError::Stopped => f.write_str("stopped"),
            CheckpointError::Reopen(e) => write!(f, "reopening the checkpoint: {e}"),
            CheckpointError::CommitLost {
                path,
                holds,
                committed,
            } => write!(
                f,
                "reopening the checkpoint: {}: it holds records up to {holds}, but a commit up \
                 to {committed} had succeeded",
                path.display()
            ),
            CheckpointError::ThenReopen { failure, reopen } => {
                write!(f, "{failure}; then {reopen}")
            }
        }
    }
}

impl std::error::Error for CheckpointError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CheckpointError::JournalCommit(e) | CheckpointError::DurableTaken { errno: e, .. } => {
                Some(e)
            }
            CheckpointError::Store(e)
            | CheckpointError::Recycle(e)
            | CheckpointError::Reopen(e) => Some(e),
            CheckpointError::ThenReopen { failure, .. } => Some(&**failure),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The messages say what the strings that were returned before said, word for word.
    #[test]
    fn checkpoint_errors_say_what_they_said_as_strings() {
        let store = || StoreError::damaged("/s/journal", 7, "batch does not check out");
        let said = "/s/journal: damaged at byte 7: batch does not check out";
        let enospc = Errno::ENOSPC;
        for (e, want) in [
            (
                CheckpointError::JournalCommit(enospc),
                format!("journal commit: {enospc}"),
            ),
            (
                CheckpointError::DurableTaken {
                    errno: enospc,
                    applied: 3,
                    durable: 9,
                },
                format!(
                    "journal commit: {enospc}; the 3 records up to 9 that were durable were taken"
                ),
            ),
            (CheckpointError::Store(store()), said.to_string()),
            (
                CheckpointError::Recycle(store()),
                format!("the checkpoint is committed, but: {said}"),
            ),
            (
                CheckpointError::Record {
                    lsn: 5,
                    what: "misfit".into(),
                },
                "record 5: misfit".into(),
            ),
            (
                CheckpointError::Records {
                    first: 5,
                    last: 5,
                    what: "misfit".into(),
                },
                "record 5..=5: misfit".into(),
            ),
            (CheckpointError::Decode("bad tag".into()), "bad tag".into()),
            (
                CheckpointError::WriteBack("checkpoint: io".into()),
                "writing back pages and inodes: checkpoint: io".into(),
            ),
            (CheckpointError::Database("io".into()), "io".into()),
            (CheckpointError::Stopped, "stopped".into()),
            (
                CheckpointError::Reopen(store()),
                format!("reopening the checkpoint: {said}"),
            ),
            (
                CheckpointError::CommitLost {
                    path: "/s/checkpoint.redb".into(),
                    holds: 4,
                    committed: 6,
                },
                "reopening the checkpoint: /s/checkpoint.redb: it holds records up to 4, but a \
                 commit up to 6 had succeeded"
                    .into(),
            ),
            (
                CheckpointError::ThenReopen {
                    failure: Box::new(CheckpointError::Database("io".into())),
                    reopen: Box::new(CheckpointError::Reopen(store())),
                },
                format!("io; then reopening the checkpoint: {said}"),
            ),
        ] {
            assert_eq!(e.to_string(), want);
        }
    }
}
