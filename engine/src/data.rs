//! File contents: sparse 4 KiB pages in a B-tree keyed by page index.
//!
//! Holes (pages never written, or punched) are absent from the map, read as zeros and cost no
//! memory, as in tmpfs. The caller holds the file's data lock (`Inode::data`), reserves space
//! for new pages before calling a function that adds them, and credits the space of pages a
//! function reports as freed.
//!
//! # Freeing
//!
//! A file's pages are freed when the file is: `Filesystem::free_inode` takes them out under the
//! data lock and drops them, instead of leaving them to the inode's own drop, which epoch
//! reclamation defers: crossbeam-epoch runs deferred frees only in later pins, once a thread's
//! batch of them (64) is full and the epoch has moved on, so on a filesystem left idle after
//! `rm` the pages of the removed files stayed allocated for good (issue 10, item 8). Nothing
//! reads a freed file's pages: writes hold a reference, reads come through an open handle or,
//! by inode number, from a caller that keeps the file open (FUSE's no-open mode, where the
//! kernel's lookup reference keeps the inode); a caller breaking that contract would read
//! zeros, not freed memory.
//!
//! Pages come from the global allocator, which decides when freed memory goes back to the
//! system: the `lanefs` binary runs mimalloc and has a thread make it purge (`cli/src/main.rs`,
//! `start_purging`). A page allocator of this module's own (chunks mapped here, handed back with
//! `madvise` when freed) would make that independent of the program's allocator, but would pay a
//! system call per freed run and a page fault per reused page unless it delayed and batched
//! them, as mimalloc already does, and would put a shared free list on every writer's path.

use std::collections::BTreeMap;

/// Page size of file data.
pub const PAGE: u64 = 4096;

type Page = Box<[u8; PAGE as usize]>;

fn new_page() -> Page {
    vec![0u8; PAGE as usize]
        .into_boxed_slice()
        .try_into()
        .expect("PAGE-sized vec")
}

/// The pages of one regular file. The map is allocated at the first page, so an empty file
/// costs one pointer here, not a map's three words (the inode's size matters at millions of
/// files: see the size assertion in `inode.rs`).
#[derive(Default)]
pub(crate) struct FileData {
    #[allow(clippy::box_collection)]
    pages: Option<Box<BTreeMap<u64, Page>>>,
}

static NO_PAGES: BTreeMap<u64, Page> = BTreeMap::new();

/// Page indexes covering bytes `off..off+len` (empty if `len == 0`).
fn page_span(off: u64, len: u64) -> std::ops::Range<u64> {
    if len == 0 {
        return 0..0;
    }
    off / PAGE..(off + len - 1) / PAGE + 1
}

impl FileData {
    fn map(&self) -> &BTreeMap<u64, Page> {
        self.pages.as_deref().unwrap_or(&NO_PAGES)
    }

    fn map_mut(&mut self) -> &mut BTreeMap<u64, Page> {
        self.pages.get_or_insert_with(Default::default)
    }

    fn page_mut(&mut self, idx: u64) -> Option<&mut Page> {
        self.pages.as_mut().and_then(|m| m.get_mut(&idx))
    }

    /// Frees the map once it holds no page.
    fn tidy(&mut self) {
        if self.pages.as_ref().is_some_and(|m| m.is_empty()) {
            self.pages = None;
        }
    }

    /// Pages currently allocated.
    pub fn pages(&self) -> u64 {
        self.map().len() as u64
    }

    /// Pages that writing `off..off+len` would add.
    pub fn missing_pages(&self, off: u64, len: u64) -> u64 {
        let span = page_span(off, len);
        let present = self.map().range(span.clone()).count() as u64;
        (span.end - span.start) - present
    }

    /// Copies bytes `off..off+buf.len()` into `buf`, holes as zeros. The caller clamps the range
    /// to the file size.
    pub fn read(&self, off: u64, buf: &mut [u8]) {
        buf.fill(0);
        let len = buf.len() as u64;
        for (&idx, page) in self.map().range(page_span(off, len)) {
            let page_start = idx * PAGE;
            let from = off.max(page_start);
            let to = (off + len).min(page_start + PAGE);
            buf[(from - off) as usize..(to - off) as usize]
                .copy_from_slice(&page[(from - page_start) as usize..(to - page_start) as usize]);
        }
    }

    /// Writes `data` at `off`, allocating pages as needed; returns the pages added (which the
    /// caller reserved beforehand, see [`FileData::missing_pages`]).
    pub fn write(&mut self, off: u64, data: &[u8]) -> u64 {
        let mut added = 0;
        let len = data.len() as u64;
        for idx in page_span(off, len) {
            let page_start = idx * PAGE;
            let from = off.max(page_start);
            let to = (off + len).min(page_start + PAGE);
            let page = self.map_mut().entry(idx).or_insert_with(|| {
                added += 1;
                new_page()
            });
            page[(from - page_start) as usize..(to - page_start) as usize]
                .copy_from_slice(&data[(from - off) as usize..(to - off) as usize]);
        }
        added
    }

    /// Zeroes bytes `off..off+len` inside existing pages and frees pages wholly inside the
    /// range; returns the pages freed.
    pub fn punch(&mut self, off: u64, len: u64) -> u64 {
        if len == 0 {
            return 0;
        }
        let end = off.saturating_add(len);
        let first_full = off.div_ceil(PAGE);
        let end_full = end / PAGE;
        let mut freed = 0;
        if first_full < end_full {
            let doomed: Vec<u64> = self
                .map()
                .range(first_full..end_full)
                .map(|(&k, _)| k)
                .collect();
            freed = doomed.len() as u64;
            for k in doomed {
                self.map_mut().remove(&k);
            }
        }
        // Partial pages at either end keep their other bytes.
        for idx in [off / PAGE, end.saturating_sub(1) / PAGE] {
            if let Some(page) = self.page_mut(idx) {
                let page_start = idx * PAGE;
                let from = off.max(page_start);
                let to = end.min(page_start + PAGE);
                if from < to {
                    page[(from - page_start) as usize..(to - page_start) as usize].fill(0);
                }
            }
        }
        self.tidy();
        freed
    }

    /// Drops everything at or beyond byte `size` (zeroing the tail of a partial last page);
    /// returns the pages freed.
    pub fn truncate(&mut self, size: u64) -> u64 {
        let keep = size.div_ceil(PAGE);
        let doomed: Vec<u64> = self.map().range(keep..).map(|(&k, _)| k).collect();
        for k in &doomed {
            self.map_mut().remove(k);
        }
        if size % PAGE != 0 {
            if let Some(page) = self.page_mut(size / PAGE) {
                page[(size % PAGE) as usize..].fill(0);
            }
        }
        self.tidy();
        doomed.len() as u64
    }

    /// Pages that remain after truncating to `size` bytes.
    pub fn pages_below(&self, size: u64) -> u64 {
        self.map().range(..size.div_ceil(PAGE)).count() as u64
    }

    /// The first byte at or after `off` that lies in an allocated page (`SEEK_DATA`, before
    /// the caller clamps it to the size).
    pub fn next_data(&self, off: u64) -> Option<u64> {
        self.map()
            .range(off / PAGE..)
            .next()
            .map(|(&idx, _)| (idx * PAGE).max(off))
    }

    /// The first byte at or after `off` that lies in a hole (`SEEK_HOLE`, before the caller
    /// clamps it to the size): pages are contiguous up to the first missing index.
    pub fn next_hole(&self, off: u64) -> u64 {
        let mut want = off / PAGE;
        for (&idx, _) in self.map().range(want..) {
            if idx != want {
                break;
            }
            want += 1;
        }
        (want * PAGE).max(off)
    }

    /// Allocates zeroed pages for `off..off+len`; returns the pages added (reserved beforehand).
    pub fn allocate(&mut self, off: u64, len: u64) -> u64 {
        let mut added = 0;
        for idx in page_span(off, len) {
            self.map_mut().entry(idx).or_insert_with(|| {
                added += 1;
                new_page()
            });
        }
        added
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(d: &FileData, off: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0xAA; len];
        d.read(off, &mut b);
        b
    }

    #[test]
    fn sparse_write_read_and_holes() {
        let mut d = FileData::default();
        assert_eq!(d.missing_pages(4090, 10), 2);
        assert_eq!(d.write(4090, b"0123456789"), 2);
        assert_eq!(d.pages(), 2);
        assert_eq!(read(&d, 4088, 14), b"\0\x000123456789\0\0");
        // A write far away adds one page and leaves the hole unallocated.
        assert_eq!(d.write(1 << 30, b"x"), 1);
        assert_eq!(d.pages(), 3);
        assert_eq!(read(&d, 1 << 20, 4), vec![0; 4]);
        assert_eq!(d.missing_pages(4090, 10), 0);
    }

    #[test]
    fn truncate_zeroes_partial_tail_and_frees_pages() {
        let mut d = FileData::default();
        d.write(0, &[1u8; 3 * PAGE as usize]);
        assert_eq!(d.truncate(PAGE + 10), 1);
        assert_eq!(d.pages(), 2);
        // Growing again must expose zeros, not the old bytes.
        assert_eq!(read(&d, PAGE + 8, 4), vec![1, 1, 0, 0]);
        assert_eq!(d.truncate(0), 2);
        assert_eq!(d.pages(), 0);
    }

    #[test]
    fn punch_frees_whole_pages_and_zeroes_edges() {
        let mut d = FileData::default();
        d.write(0, &[7u8; 4 * PAGE as usize]);
        assert_eq!(d.punch(100, 2 * PAGE), 1, "only page 1 lies wholly inside");
        assert_eq!(read(&d, 98, 4), vec![7, 7, 0, 0]);
        assert_eq!(read(&d, 2 * PAGE + 98, 4), vec![0, 0, 7, 7]);
        assert_eq!(d.pages(), 3);
        assert_eq!(d.punch(0, u64::MAX), 3);
    }

    #[test]
    fn data_and_holes_are_found_at_page_granularity() {
        let mut d = FileData::default();
        assert_eq!(d.next_data(0), None);
        assert_eq!(d.next_hole(5), 5);
        d.write(PAGE + 10, b"x");
        d.write(2 * PAGE, b"y");
        d.write(5 * PAGE, b"z");
        assert_eq!(d.next_data(0), Some(PAGE));
        assert_eq!(d.next_data(PAGE + 100), Some(PAGE + 100));
        assert_eq!(d.next_data(3 * PAGE), Some(5 * PAGE));
        assert_eq!(d.next_data(6 * PAGE), None);
        assert_eq!(d.next_hole(0), 0);
        assert_eq!(
            d.next_hole(PAGE),
            3 * PAGE,
            "pages 1 and 2 are contiguous data"
        );
        assert_eq!(d.next_hole(5 * PAGE + 7), 6 * PAGE);
    }

    #[test]
    fn allocate_counts_only_new_pages() {
        let mut d = FileData::default();
        d.write(PAGE, b"a");
        assert_eq!(d.allocate(0, 3 * PAGE), 2);
        assert_eq!(read(&d, PAGE, 2), b"a\0");
    }
}
