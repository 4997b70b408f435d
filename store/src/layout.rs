//! Fixed binary layouts: the identity file (`identity.rs`), segment and batch headers
//! (`journal/format.rs`), the checkpoint's values (`checkpoint/kv.rs`) and the committer's
//! buffered records (`commit.rs`).
//!
//! Each layout names the offsets of its fields in a chain, each the one before plus that
//! field's length (as redb's `header.rs` does), so that no offset is written as a number and
//! a field's place follows from the fields before it; a constant assertion ties the end of
//! the chain to the layout's length. Fields are read and written at those offsets with the
//! functions here. docs/STORE.md gives the same offsets in its tables, and `spec.rs` checks
//! the two against each other.

/// Bytes of a `u16` field.
pub(crate) const U16: usize = size_of::<u16>();
/// Bytes of a `u32` field.
pub(crate) const U32: usize = size_of::<u32>();
/// Bytes of a `u64` field.
pub(crate) const U64: usize = size_of::<u64>();
/// Bytes of a store id.
pub(crate) const STORE_ID: usize = 16;

/// Writes `field` into `b` at `at`.
pub(crate) fn put(b: &mut [u8], at: usize, field: &[u8]) {
    b[at..at + field.len()].copy_from_slice(field);
}

/// The little-endian `u32` at `at`.
pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + U32].try_into().expect("4 bytes"))
}

/// The little-endian `u64` at `at`.
pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + U64].try_into().expect("8 bytes"))
}

/// The store id at `at`.
pub(crate) fn store_id_at(b: &[u8], at: usize) -> [u8; STORE_ID] {
    b[at..at + STORE_ID].try_into().expect("16 bytes")
}
