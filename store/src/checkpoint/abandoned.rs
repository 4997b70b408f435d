//! Why a checkpoint was abandoned, and whether the database is to be reopened for it (`mod.rs`,
//! "Errors").

use super::apply;
use crate::error::CheckpointError;

/// Why a checkpoint was abandoned ([`super::Checkpoint::apply_in_transactions`]), and whether the
/// database is to be reopened for it.
pub(super) struct Abandoned {
    pub(super) error: CheckpointError,
    /// redb failed (or panicked): the database may refuse every later transaction, so it is
    /// dropped and reopened.
    pub(super) reopen: bool,
}

impl Abandoned {
    /// redb's failure ([`CheckpointError::Database`]).
    pub(super) fn db(e: impl std::fmt::Display) -> Abandoned {
        Abandoned {
            error: CheckpointError::Database(e.to_string()),
            reopen: true,
        }
    }

    /// A failure that leaves redb as it is.
    pub(super) fn other(error: CheckpointError) -> Abandoned {
        Abandoned {
            error,
            reopen: false,
        }
    }

    /// A record that could not be applied: redb's failure ([`apply::ApplyError::Db`]), or
    /// one that leaves redb as it is.
    pub(super) fn applying(
        e: apply::ApplyError,
        error: impl FnOnce(String) -> CheckpointError,
    ) -> Abandoned {
        Abandoned {
            reopen: matches!(e, apply::ApplyError::Db(_)),
            error: error(e.to_string()),
        }
    }
}
