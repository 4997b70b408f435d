//! Memory aligned to blocks, for the journal's block reads and writes
//! (`DiskFile::read_blocks`, `DiskFile::write_blocks`).

use crate::disk::BLOCK;

/// Memory aligned to [`BLOCK`], in whole blocks, for block writes.
#[derive(Default)]
pub(super) struct Blocks(pub(super) Vec<Block>);

#[derive(Clone, Copy)]
#[repr(C, align(4096))]
pub(super) struct Block([u8; BLOCK]);

impl Blocks {
    /// The first `n` blocks as bytes, growing the buffer if needed.
    pub(super) fn bytes(&mut self, n: usize) -> &mut [u8] {
        if self.0.len() < n {
            self.0.resize(n, Block([0; BLOCK]));
        }
        // SAFETY: `Block` is `repr(C)` over a byte array with no padding (its size equals its
        // alignment, BLOCK), so `n` consecutive blocks of the vector are `n * BLOCK`
        // initialized bytes, borrowed mutably for as long as `self` is.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast::<u8>(), n * BLOCK) }
    }
}
