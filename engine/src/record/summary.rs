//! What a checkpoint reads of a record before it decides whether to apply it.

use super::Record;
use crate::id::InodeId;
use crate::time::Timespec;

/// What a checkpoint needs of a record before it knows whether the record is to be applied
/// ([`RecordSummary::decode`] reads it from the bytes without building the record): of a
/// Create, Remove, Free or plain Rename, the inodes, directories, time and cookie; of any
/// other kind, nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordSummary {
    /// A Create.
    Create {
        /// The directory.
        dir: InodeId,
        /// The new entry's cookie.
        cookie: u64,
        /// The new inode.
        inode: InodeId,
        /// The new inode's mode.
        mode: u32,
        /// The new inode's times, and the directory's new mtime and ctime.
        time: Timespec,
    },
    /// A Remove.
    Remove {
        /// The directory.
        dir: InodeId,
        /// The inode that loses the link.
        inode: InodeId,
        /// The inode's new ctime, and the directory's new mtime and ctime.
        time: Timespec,
    },
    /// A Rename that replaces nothing and exchanges nothing (one with a target inode, and
    /// every RenameWhiteout, is [`RecordSummary::Other`]).
    Rename {
        /// The source directory.
        from: InodeId,
        /// The target directory.
        to: InodeId,
        /// The inode moved.
        inode: InodeId,
        /// The new entry's cookie.
        cookie: u64,
        /// The inode's new ctime, and both directories' new mtime and ctime.
        time: Timespec,
    },
    /// A Free.
    Free {
        /// The inode freed.
        inode: InodeId,
    },
    /// A record of another kind (decode it with [`Record::decode`]).
    Other,
}

impl RecordSummary {
    /// The summary of a record already decoded: what [`RecordSummary::decode`] gives for its
    /// bytes.
    pub fn of(rec: &Record<'_>) -> RecordSummary {
        match *rec {
            Record::Create {
                dir, cookie, inode, ..
            } => RecordSummary::Create {
                dir,
                cookie,
                inode: inode.id,
                mode: inode.mode,
                time: inode.time,
            },
            Record::Remove {
                dir, inode, time, ..
            } => RecordSummary::Remove { dir, inode, time },
            Record::Rename {
                from,
                to,
                inode,
                replaced: None,
                exchange: false,
                cookie,
                time,
                ..
            } => RecordSummary::Rename {
                from,
                to,
                inode,
                cookie,
                time,
            },
            Record::Free { inode } => RecordSummary::Free { inode },
            _ => RecordSummary::Other,
        }
    }
}
