//! The records a checkpoint has read from the journal and not yet applied, a window of
//! about [`RECORD_WINDOW`] bytes at a time.

use lanefs::{Record, RecordSummary};

use super::abandoned::Abandoned;
use super::apply;
use crate::error::CheckpointError;

/// Bytes of records a checkpoint reads before it applies them ([`RecordWindow`]). Not the
/// size of the journal's reads (`journal::follow`, `SEGMENT_READ`).
pub(super) const RECORD_WINDOW: usize = 4 << 20;

/// A window of records: records read from the journal and not yet applied, their bytes one
/// after another, each one's place, and what absorption needs of those that may belong to an
/// absorbed file ([`apply::Absorbable`]). Kept by the [`Checkpoint`] between checkpoints, so
/// that its memory is reused.
#[derive(Default)]
pub(super) struct RecordWindow {
    pub(super) bytes: Vec<u8>,
    /// The LSN of the first record (the others follow on).
    first: u64,
    /// Where each record's bytes are, and the index of what absorption needs of it in
    /// `absorbables` (`NOT_ABSORBABLE`: none).
    recs: Vec<(u32, u32, u32)>,
    absorbables: Vec<apply::Absorbable>,
}

const NOT_ABSORBABLE: u32 = u32::MAX;

impl RecordWindow {
    /// Adds the records `recs` of one batch (first LSN `first`), slices of `span`
    /// (`journal::follow`), which is copied at once. Each is decoded, seen by `absorption`, and
    /// what absorption needs of it kept; a record that does not decode is an error naming it by its
    /// index.
    pub(super) fn push(
        &mut self,
        first: u64,
        span: &[u8],
        recs: &[&[u8]],
        absorption: &mut apply::Absorption,
    ) -> Result<(), (usize, String)> {
        if self.recs.is_empty() {
            self.first = first;
        }
        debug_assert_eq!(self.first + self.recs.len() as u64, first);
        let start = span.as_ptr() as usize;
        let base = self.bytes.len();
        self.bytes.extend_from_slice(span);
        for (k, r) in recs.iter().enumerate() {
            let at = base + (r.as_ptr() as usize - start);
            // A Create, Remove, Free or plain Rename is decoded only as far as absorption
            // needs (every field is checked all the same); a record of another kind whole.
            let summary = match RecordSummary::decode(r) {
                Ok(RecordSummary::Other) => match Record::decode(r) {
                    Ok(rec) => {
                        absorption.see_other(&rec);
                        RecordSummary::Other
                    }
                    Err(e) => return Err((k, e.to_string())),
                },
                Ok(g) => g,
                Err(e) => return Err((k, e.to_string())),
            };
            let slot = absorption.see(&summary);
            let g = match apply::Absorbable::of(&summary, slot) {
                Some(g) => {
                    self.absorbables.push(g);
                    (self.absorbables.len() - 1) as u32
                }
                None => NOT_ABSORBABLE,
            };
            self.recs.push((at as u32, (at + r.len()) as u32, g));
        }
        Ok(())
    }

    /// Empties the window, keeping its memory unless a window of unusually large batches
    /// made it grow past three windows' worth.
    pub(super) fn clear(&mut self) {
        if self.bytes.capacity() > 3 * RECORD_WINDOW {
            *self = RecordWindow::default();
        }
        self.bytes.clear();
        self.recs.clear();
        self.absorbables.clear();
    }

    /// Applies the records (those of absorbed files found as they were read, and absorbed
    /// from their [`apply::Absorbable`] without a second decoding), writes what the absorbed
    /// files left to write, and empties the window; returns how many records it applied.
    pub(super) fn apply(&mut self, t: &mut apply::Tables<'_>) -> Result<u64, Abandoned> {
        t.absorption.settle();
        for (k, &(a, b, g)) in self.recs.iter().enumerate() {
            let lsn = self.first + k as u64;
            if g != NOT_ABSORBABLE
                && let Some(r) = t.absorb(&self.absorbables[g as usize])
            {
                r.map_err(|e| {
                    Abandoned::applying(e, |what| CheckpointError::Record { lsn, what })
                })?;
                continue;
            }
            let bytes = &self.bytes[a as usize..b as usize];
            let r = Record::decode(bytes)
                .map_err(|e| Abandoned::other(CheckpointError::Decode(e.to_string())))?;
            t.apply(&r).map_err(|e| {
                Abandoned::applying(e, |what| CheckpointError::Record { lsn, what })
            })?;
        }
        let n = self.recs.len() as u64;
        if n > 0 {
            let (first, last) = (self.first, self.first + n - 1);
            t.finish().map_err(|e| {
                Abandoned::applying(e, |what| CheckpointError::Records { first, last, what })
            })?;
        }
        t.absorption.clear();
        self.clear();
        Ok(n)
    }
}
