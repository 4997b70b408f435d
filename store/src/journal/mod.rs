//! The journal: segments of checksummed, sequence-numbered batches of records
//! (docs/STORE.md, "The journal", is the specification; `spec.rs` keeps the two in step).
//!
//! A segment is a file `journal/<seq as 16 hex digits>.seg`, allocated at its full size
//! and written with zeros before it is used, by a thread of its own, so that writing into it
//! never grows it. It starts with a 64-byte header; batches follow back to back. A batch is
//! a 48-byte header (its segment, the LSN of its first record, the record count, the
//! payload's length and CRC-32C, the LSN below which everything was flushed when it was
//! written, and the header's own CRC-32C) and its payload: each
//! record as a `u32` length and the record's bytes. Records are numbered from 1 without gap
//! across batches and segments; that number is the record's LSN.
//!
//! The committer writes batches as records come, and flushes (`fdatasync`) only when someone
//! waits for durability (`commit.rs`); each batch header carries the LSN below which every
//! record was flushed when the batch was written. A crash can therefore tear any batch
//! written after the last flush, and leave later ones whole: [`scan`] tells such a torn tail
//! from damage (`scan.rs`).
//!
//! Before a batch goes into a new segment the previous segment is flushed, so that a flush
//! of the newest segment covers every earlier one. Segment numbers start at 1 and have no
//! gap, and a segment after the journal's end is a spare: zeros throughout, or a **spare
//! header** (a segment header whose first LSN is 0) followed by anything; anything else is
//! damage.
//!
//! One concept to a file:
//! - `format.rs`: the bytes of segment headers, batch headers and payloads;
//! - `segments.rs`: the journal's directory: segment names, the listing, first bytes;
//! - `scan.rs`: reading the journal back when the store opens (a torn tail or damage);
//! - `follow.rs`: the checkpointer's reading forward of the records it applies;
//! - `writer.rs`: writing batches at the journal's end, and what a failed write leaves;
//! - `spare.rs`: the next segment, made ahead of need;
//! - `recycle.rs`: segments a checkpoint covers, kept and made into spares;
//! - `room.rs`: the checkpointer's hold on the host's room;
//! - `blocks.rs`: memory aligned to blocks, for block reads and writes.

mod blocks;
mod follow;
mod format;
mod recycle;
mod room;
mod scan;
mod segments;
mod spare;
mod writer;

pub(crate) use follow::{Cursor, follow};
pub(crate) use format::{
    BATCH_HEADER, BATCH_MAGIC, BatchHeader, SEGMENT_HEADER, SEGMENT_MAGIC, SegmentHeader, VERSION,
    batch_at, encode_segment, segment_at,
};
#[cfg(test)]
pub(crate) use format::{BATCH_VERSION, records};
pub(crate) use recycle::{FREE_MAX, drop_free, free_path, free_segments};
pub(crate) use room::{RoomHold, checkpoint_room};
#[cfg(test)]
pub(crate) use scan::End;
pub(crate) use scan::scan;
pub(crate) use segments::{dir, first_lsn, segment_len, segment_path, segments};
pub(crate) use spare::Spare;
pub(crate) use writer::{Payload, Writer, out_of_space};

#[cfg(test)]
mod tests;

#[cfg(test)]
mod regressions;
