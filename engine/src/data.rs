//! File contents: sparse 4 KiB pages in a B-tree keyed by page index.
//!
//! Holes (pages never written, or punched) are absent from the map, read as zeros and cost no
//! memory, as in tmpfs. The caller holds the file's data lock (`Inode::data`), reserves space
//! for new pages before calling a function that adds them, and credits the space of pages a
//! function reports as freed.
//!
//! # Allocated zeros
//!
//! An allocated page that holds only zeros is not a page: it is part of a **run** (a range
//! map beside the pages, `start → end`, disjoint from them and merged with its neighbours).
//! `fallocate` makes runs of the pages it allocates that are neither pages nor in a run, so a
//! fallocated range costs one map entry whatever its length, not a zeroed page per 4 KiB
//! (generic/103 fallocated 64 GB and the server grew to 23 GB, issue 35). A write turns the
//! pages it puts bytes in into pages (cutting them out of their run) and the pages it leaves
//! holding only zeros (a whole page of zeros, or zeros written into a hole or a run) into
//! runs, so writing zeros (`dd if=/dev/zero`, a `copy_file_range` the kernel does as reads
//! and writes of a sparse file) costs no page either. A punch or a truncation cuts runs as it
//! cuts pages. Runs count as allocated everywhere pages do: the space limit, `st_blocks`,
//! `SEEK_DATA` / `SEEK_HOLE` (data, as tmpfs reports fallocated pages). The store never holds
//! a run's pages for the engine to read back: they read as zeros, in memory.
//!
//! # Pages the store keeps
//!
//! With a store that keeps file data (the disk store, whose checkpoint holds every page), a
//! page is either **in memory** ([`Slot::Mem`], labelled with the epoch of its last change) or
//! **kept** ([`Slot::Kept`]: not in memory; [`Store::read_pages`](crate::Store::read_pages)
//! reads it). Opening a store makes every page kept; a change brings the page into memory;
//! an eviction pass (`fs/cache.rs`) sends pages back once the store holds them, so memory
//! holds the pages changed since the store's last checkpoint plus a bounded cache, not the
//! whole filesystem's data.
//!
//! When a page may leave memory is decided by epochs ([`PageEpochs`]), which tie the engine's
//! changes to the store's checkpoints without a lock between them:
//! - every change to a page appends its record first, then, still under the data lock, labels
//!   the page with the current epoch, read *after* the append;
//! - a checkpoint first advances the epoch ([`PageEpochs::begin`] returns the old one, `e`),
//!   then makes every record appended so far durable and applies them all; once committed it
//!   declares `e` kept ([`PageEpochs::kept`]);
//! - a page labelled `<= e` may then be dropped: its label was read before the epoch moved
//!   (the atomics are sequentially consistent), so its last record was appended before the
//!   checkpoint's sync and is in the checkpoint, and no later change touched it (a change
//!   would have relabelled it). A page faulted in from the store, unchanged, is labelled 0.
//!
//! # Changed pages
//!
//! Pages changed since the last checkpoint began cannot leave memory; the store bounds them
//! ([`PageEpochs::set_budget`], docs/STORE.md "Memory"). A change counts each page it labels
//! with an epoch the page did not have, in the counter of its thread slot (`slots.rs`), so
//! counting shares no cache line; each [`CHECK_EVERY`] pages a thread adds up the slots: past
//! the budget's `due` it wakes the store's checkpointer, past its `limit` it sets a flag on
//! which writers wait ([`PageEpochs::throttle`], after their operation, with no lock held)
//! until the store declares a checkpoint kept. Before the store sets a budget (a memory
//! store, or a disk store during recovery) nothing is due and nobody waits.
//!
//! Changes that keep part of a kept page (a partial write, the zeroing of a truncated or
//! punched page's edge) read it back first: the caller calls `prepare_*` before the change's
//! record is appended, so a read error refuses the change instead of losing bytes. Bytes of a
//! file's last page beyond its size are always zero (truncation zeroes them), so growing a
//! file never needs its kept last page.
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
use std::ops::Range;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::errno::Result;
use crate::slots::{NSLOTS, PerSlot};

/// Page size of file data.
pub const PAGE: u64 = 4096;

type Page = Box<[u8; PAGE as usize]>;

fn new_page() -> Page {
    vec![0u8; PAGE as usize]
        .into_boxed_slice()
        .try_into()
        .expect("PAGE-sized vec")
}

/// Reads pages `first..` of the file from its store into the buffer (a whole number of pages).
pub(crate) type Fetch<'a> = &'a dyn Fn(u64, &mut [u8]) -> Result<()>;

/// A thread checks the changed-page count against the budget (a sum over the slots) each
/// time its own slot's count passes a multiple of this.
const CHECK_EVERY: u64 = 64;

/// The epochs that decide when a page the store keeps may leave memory (module doc), the
/// count of pages out of memory, and the budget of changed pages ("Changed pages" in the
/// module doc). Shared by the engine and the store that checkpoints it.
pub struct PageEpochs {
    /// The label a change gives the page it changes.
    current: AtomicU64,
    /// Pages labelled at or below this are held by the store.
    kept: AtomicU64,
    /// Pages of all files that are kept, not in memory.
    out: AtomicU64,
    /// Pages of all files in runs of allocated zeros, not in memory either.
    zeros: AtomicU64,
    /// The `kept` value the last eviction pass started from (`fs/cache.rs`).
    pub(crate) passed: AtomicU64,
    /// Pages changed so far (given a label they did not have), counted per thread slot.
    changed: PerSlot<AtomicU64>,
    /// The changed-page count when the last checkpoint began.
    begun_at: AtomicU64,
    /// The changed-page count when the last checkpoint that the store holds began.
    kept_at: AtomicU64,
    /// Pages changed since the last checkpoint began above which one is due.
    due: AtomicU64,
    /// Pages changed since the last kept checkpoint began above which writers wait.
    limit: AtomicU64,
    /// Set once a check found the count at `limit`; writers then wait in
    /// [`PageEpochs::throttle`].
    over: AtomicBool,
    /// The store cannot take checkpoints now (they fail, or it is stopping): nobody waits.
    stalled: AtomicBool,
    /// Writers over the limit wait here for a checkpoint to be kept.
    wait: (Mutex<()>, Condvar),
    /// Tells the store's checkpointer that a checkpoint is due.
    nudge: OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// A checkpoint was asked for ([`PageEpochs::want_checkpoint`]) and has not begun.
    wanted: AtomicBool,
}

impl std::fmt::Debug for PageEpochs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageEpochs")
            .field("current", &self.current)
            .field("kept", &self.kept)
            .field("out", &self.out)
            .field("zeros", &self.zeros)
            .field("changed", &self.changed_total())
            .finish_non_exhaustive()
    }
}

impl Default for PageEpochs {
    fn default() -> Self {
        PageEpochs {
            current: AtomicU64::new(1),
            kept: AtomicU64::new(0),
            out: AtomicU64::new(0),
            zeros: AtomicU64::new(0),
            passed: AtomicU64::new(0),
            changed: PerSlot::new(|_| AtomicU64::new(0)),
            begun_at: AtomicU64::new(0),
            kept_at: AtomicU64::new(0),
            due: AtomicU64::new(u64::MAX),
            limit: AtomicU64::new(u64::MAX),
            over: AtomicBool::new(false),
            stalled: AtomicBool::new(false),
            wait: (Mutex::new(()), Condvar::new()),
            nudge: OnceLock::new(),
            wanted: AtomicBool::new(false),
        }
    }
}

impl PageEpochs {
    /// Starts a checkpoint: advances the epoch and returns the one it ends. Every page whose
    /// last change was labelled with it or before had its record appended before this call.
    pub fn begin(&self) -> u64 {
        let epoch = self.current.fetch_add(1, SeqCst);
        self.begun_at.store(self.changed_total(), SeqCst);
        self.wanted.store(false, SeqCst);
        epoch
    }

    /// Tells that the store holds every record appended before [`PageEpochs::begin`] returned
    /// `epoch` (the last `begin`): pages labelled up to it may leave memory, and writers
    /// waiting for that go on.
    pub fn kept(&self, epoch: u64) {
        self.kept.fetch_max(epoch, SeqCst);
        self.kept_at.store(self.begun_at.load(SeqCst), SeqCst);
        let _g = self.wait.0.lock();
        self.over.store(false, SeqCst);
        self.wait.1.notify_all();
    }

    /// Bounds the pages changed between checkpoints ("Changed pages" in the module doc): a
    /// checkpoint is due once `due` pages changed since the last one began (`nudge` tells the
    /// store so), and writers wait once `limit` pages changed since the last one the store
    /// holds began. Set by the store once it takes checkpoints; until then nothing waits.
    pub fn set_budget(&self, due: u64, limit: u64, nudge: Box<dyn Fn() + Send + Sync>) {
        let _ = self.nudge.set(nudge);
        self.due.store(due.max(1), SeqCst);
        self.limit.store(limit.max(1), SeqCst);
    }

    /// Pages changed since the last kept checkpoint began above which writers wait (`None`
    /// until a store sets a budget: a memory store, or a disk store in recovery).
    pub(crate) fn limit(&self) -> Option<u64> {
        Some(self.limit.load(Relaxed)).filter(|&l| l != u64::MAX)
    }

    /// Whether a checkpoint is due for the pages changed since the last one began, or was
    /// asked for ([`PageEpochs::want_checkpoint`]).
    pub fn due(&self) -> bool {
        self.wanted.load(SeqCst)
            || self
                .changed_total()
                .saturating_sub(self.begun_at.load(SeqCst))
                >= self.due.load(Relaxed)
    }

    /// Asks the store for a checkpoint, whatever changed: the inode eviction pass needs one
    /// to hold what it would evict (`fs/lazy.rs`). [`PageEpochs::due`] says so until the
    /// next checkpoint begins.
    pub(crate) fn want_checkpoint(&self) {
        if !self.wanted.swap(true, SeqCst) {
            if let Some(nudge) = self.nudge.get() {
                nudge();
            }
        }
    }

    /// Pages changed since the last checkpoint that the store holds began: what memory holds
    /// that no eviction may drop (an upper bound: a page freed since is still counted).
    pub fn changed_since_kept(&self) -> u64 {
        self.changed_total()
            .saturating_sub(self.kept_at.load(SeqCst))
    }

    /// Tells whether the store can take checkpoints now; while it cannot, writers do not wait
    /// for one.
    pub fn set_stalled(&self, stalled: bool) {
        let _g = self.wait.0.lock();
        self.stalled.store(stalled, SeqCst);
        self.wait.1.notify_all();
    }

    fn changed_total(&self) -> u64 {
        (0..NSLOTS).map(|s| self.changed.get(s).load(Relaxed)).sum()
    }

    /// Counts `n` pages changed by the calling thread; every [`CHECK_EVERY`] of them, checks
    /// the total against the budget.
    fn count_changed(&self, n: u64) {
        if n == 0 {
            return;
        }
        let old = self.changed.local().fetch_add(n, Relaxed);
        if (old + n) / CHECK_EVERY != old / CHECK_EVERY {
            self.check();
        }
    }

    #[cold]
    fn check(&self) {
        if self.due() {
            if let Some(nudge) = self.nudge.get() {
                nudge();
            }
        }
        if self.changed_since_kept() >= self.limit.load(Relaxed) {
            self.over.store(true, Relaxed);
        }
    }

    /// Waits, if a check found more pages changed than the budget allows, until a checkpoint
    /// is kept or the store says it cannot take one (module doc, "Changed pages"). Called with
    /// no lock held, after a change.
    #[inline]
    pub(crate) fn throttle(&self) {
        if self.over.load(Relaxed) {
            self.wait_for_checkpoint();
        }
    }

    #[cold]
    fn wait_for_checkpoint(&self) {
        let mut g = self.wait.0.lock();
        loop {
            if self.stalled.load(SeqCst) || self.changed_since_kept() < self.limit.load(SeqCst) {
                self.over.store(false, SeqCst);
                return;
            }
            if let Some(nudge) = self.nudge.get() {
                nudge();
            }
            // Bounded, so that a nudge lost before the checkpointer waited is repeated.
            self.wait.1.wait_for(&mut g, Duration::from_millis(100));
        }
    }

    /// The label of a change whose record was just appended.
    pub(crate) fn label(&self) -> u64 {
        self.current.load(SeqCst)
    }

    /// The highest epoch the store holds.
    pub(crate) fn kept_epoch(&self) -> u64 {
        self.kept.load(SeqCst)
    }

    /// Pages of all files that are out of memory.
    pub(crate) fn out(&self) -> u64 {
        self.out.load(Relaxed)
    }

    /// Pages of all files in runs of allocated zeros.
    pub(crate) fn zero_pages(&self) -> u64 {
        self.zeros.load(Relaxed)
    }

    /// A file's pages in runs of zeros went from `from` to `to`.
    fn zeros_moved(&self, from: u64, to: u64) {
        if to > from {
            self.zeros.fetch_add(to - from, Relaxed);
        } else if from > to {
            self.zeros.fetch_sub(from - to, Relaxed);
        }
    }

    fn went_out(&self, n: u64) {
        if n > 0 {
            self.out.fetch_add(n, Relaxed);
        }
    }

    fn came_in(&self, n: u64) {
        if n > 0 {
            self.out.fetch_sub(n, Relaxed);
        }
    }
}

/// One page of a file.
enum Slot {
    /// In memory, labelled with the epoch of its last change (0: unchanged since read from
    /// the store).
    Mem { page: Page, epoch: u64 },
    /// Kept by the store, not in memory.
    Kept,
}

/// Runs of allocated pages that hold only zeros (module doc, "Allocated zeros"): page
/// `start` up to `end` (exclusive) for each `start → end`. Runs are disjoint, never adjacent
/// (a run that would touch another is merged with it) and disjoint from the page map.
#[derive(Default)]
struct Zeros {
    runs: BTreeMap<u64, u64>,
    /// Pages the runs cover.
    count: u64,
}

impl Zeros {
    /// The run holding page `idx`.
    fn covering(&self, idx: u64) -> Option<(u64, u64)> {
        self.runs
            .range(..=idx)
            .next_back()
            .filter(|&(_, &e)| e > idx)
            .map(|(&s, &e)| (s, e))
    }

    /// The runs that overlap `span` (non-empty), in order; with `adjacent`, also those that
    /// end where it starts or start where it ends.
    fn meeting(&self, span: &Range<u64>, adjacent: bool) -> impl Iterator<Item = (u64, u64)> {
        let a = u64::from(adjacent);
        let start = span.start;
        let before = self
            .runs
            .range(..start)
            .next_back()
            .filter(move |&(_, &e)| e + a > start);
        before
            .into_iter()
            .chain(self.runs.range(start..span.end + a))
            .map(|(&s, &e)| (s, e))
    }

    /// Pages of `span` the runs cover.
    fn count_in(&self, span: Range<u64>) -> u64 {
        if span.is_empty() {
            return 0;
        }
        self.meeting(&span, false)
            .map(|(s, e)| e.min(span.end) - s.max(span.start))
            .sum()
    }

    /// Takes the pages of `span` out of the runs; returns how many there were.
    fn cut(&mut self, span: Range<u64>) -> u64 {
        if span.is_empty() {
            return 0;
        }
        let met: Vec<_> = self.meeting(&span, false).collect();
        let mut taken = 0;
        for (s, e) in met {
            self.runs.remove(&s);
            if s < span.start {
                self.runs.insert(s, span.start);
            }
            if e > span.end {
                self.runs.insert(span.end, e);
            }
            taken += e.min(span.end) - s.max(span.start);
        }
        self.count -= taken;
        taken
    }

    /// Makes every page of `span` that is not in `pages` part of a run; returns how many
    /// pages were in neither (the pages it allocates).
    fn fill(&mut self, span: Range<u64>, pages: &BTreeMap<u64, Slot>) -> u64 {
        if span.is_empty() {
            return 0;
        }
        let (mut lo, mut hi, mut old) = (span.start, span.end, 0);
        let met: Vec<_> = self.meeting(&span, true).collect();
        for (s, e) in met {
            self.runs.remove(&s);
            (lo, hi, old) = (lo.min(s), hi.max(e), old + e - s);
        }
        // The runs met hold no page, so the pages in `lo..hi` are those of `span`.
        let mut new = 0;
        let mut at = lo;
        for &idx in pages.range(lo..hi).map(|(k, _)| k) {
            if idx > at {
                self.runs.insert(at, idx);
                new += idx - at;
            }
            at = idx + 1;
        }
        if at < hi {
            self.runs.insert(at, hi);
            new += hi - at;
        }
        self.count = self.count - old + new;
        new - old
    }
}

/// What a file holds: its pages and its runs of allocated zeros.
#[derive(Default)]
struct Inner {
    pages: BTreeMap<u64, Slot>,
    /// Made at the first run (a file never fallocated costs a pointer here).
    #[allow(clippy::box_collection)]
    zeros: Option<Box<Zeros>>,
}

impl Inner {
    fn zero_count(&self) -> u64 {
        self.zeros.as_ref().map_or(0, |z| z.count)
    }

    /// Adds the pages of `span` that are neither pages nor in a run to the runs.
    fn fill(&mut self, span: Range<u64>) -> u64 {
        if span.is_empty() {
            return 0;
        }
        let Inner { pages, zeros } = self;
        zeros.get_or_insert_with(Default::default).fill(span, pages)
    }
}

/// The pages of one regular file. Allocated at the first page or run, so an empty file costs
/// one pointer here, not a map's three words (the inode's size matters at millions of files:
/// see the size assertion in `inode.rs`).
#[derive(Default)]
pub(crate) struct FileData {
    inner: Option<Box<Inner>>,
}

static NO_PAGES: BTreeMap<u64, Slot> = BTreeMap::new();

/// Page indexes covering bytes `off..off+len` (empty if `len == 0`).
fn page_span(off: u64, len: u64) -> Range<u64> {
    if len == 0 {
        return 0..0;
    }
    off / PAGE..(off + len - 1) / PAGE + 1
}

/// The bytes `off..off+len` cover of page `idx`, as offsets in the page.
fn in_page(idx: u64, off: u64, len: u64) -> Range<usize> {
    let start = idx * PAGE;
    let from = off.max(start);
    let to = off.saturating_add(len).min(start.saturating_add(PAGE));
    (from - start) as usize..(to - start) as usize
}

/// Whether `b` holds only zeros (a block at a time, so that data stops it early).
fn all_zeros(b: &[u8]) -> bool {
    b.chunks(256).all(|c| c.iter().fold(0, |a, &x| a | x) == 0)
}

impl FileData {
    fn map(&self) -> &BTreeMap<u64, Slot> {
        self.inner.as_deref().map_or(&NO_PAGES, |i| &i.pages)
    }

    fn inner_mut(&mut self) -> &mut Inner {
        self.inner.get_or_insert_with(Default::default)
    }

    fn zeros(&self) -> Option<&Zeros> {
        self.inner.as_deref()?.zeros.as_deref()
    }

    fn zero_count(&self) -> u64 {
        self.inner.as_deref().map_or(0, Inner::zero_count)
    }

    /// Frees what holds nothing any more.
    fn tidy(&mut self) {
        if let Some(i) = self.inner.as_mut() {
            if i.zeros.as_ref().is_some_and(|z| z.runs.is_empty()) {
                i.zeros = None;
            }
            if i.pages.is_empty() && i.zeros.is_none() {
                self.inner = None;
            }
        }
    }

    /// Pages currently allocated (in memory, kept, or in runs of zeros).
    pub fn pages(&self) -> u64 {
        self.map().len() as u64 + self.zero_count()
    }

    /// Runs of allocated zeros.
    #[cfg(test)]
    fn runs(&self) -> Vec<(u64, u64)> {
        self.zeros()
            .map(|z| z.runs.iter().map(|(&s, &e)| (s, e)).collect())
            .unwrap_or_default()
    }

    /// Pages in memory.
    #[cfg(test)]
    pub fn resident(&self) -> u64 {
        self.map()
            .values()
            .filter(|s| matches!(s, Slot::Mem { .. }))
            .count() as u64
    }

    /// Pages that writing `off..off+len` would add.
    pub fn missing_pages(&self, off: u64, len: u64) -> u64 {
        let span = page_span(off, len);
        let present = self.map().range(span.clone()).count() as u64;
        let zeros = self.zeros().map_or(0, |z| z.count_in(span.clone()));
        (span.end - span.start) - present - zeros
    }

    /// Copies bytes `off..off+buf.len()` into `buf`, holes and runs of zeros as zeros, kept
    /// pages read through `fetch`. The caller clamps the range to the file size.
    pub fn read(&self, off: u64, buf: &mut [u8], fetch: Fetch<'_>) -> Result<()> {
        buf.fill(0);
        let len = buf.len() as u64;
        let mut kept: Option<(u64, u64)> = None;
        let fetch_run = |run: (u64, u64), buf: &mut [u8]| -> Result<()> {
            let mut tmp = vec![0u8; ((run.1 - run.0) * PAGE) as usize];
            fetch(run.0, &mut tmp)?;
            let (from, to) = (off.max(run.0 * PAGE), (off + len).min(run.1 * PAGE));
            buf[(from - off) as usize..(to - off) as usize].copy_from_slice(
                &tmp[(from - run.0 * PAGE) as usize..(to - run.0 * PAGE) as usize],
            );
            Ok(())
        };
        for (&idx, slot) in self.map().range(page_span(off, len)) {
            match slot {
                Slot::Mem { page, .. } => {
                    let r = in_page(idx, off, len);
                    let at = (idx * PAGE + r.start as u64 - off) as usize;
                    buf[at..at + r.len()].copy_from_slice(&page[r]);
                }
                Slot::Kept => match kept {
                    Some((a, b)) if b == idx => kept = Some((a, b + 1)),
                    _ => {
                        if let Some(run) = kept.take() {
                            fetch_run(run, buf)?;
                        }
                        kept = Some((idx, idx + 1));
                    }
                },
            }
        }
        if let Some(run) = kept {
            fetch_run(run, buf)?;
        }
        Ok(())
    }

    /// Brings kept page `idx` into memory, unchanged (label 0).
    fn fault_in(&mut self, idx: u64, fetch: Fetch<'_>, e: &PageEpochs) -> Result<()> {
        if let Some(slot @ Slot::Kept) = self.inner.as_mut().and_then(|i| i.pages.get_mut(&idx)) {
            let mut page = new_page();
            fetch(idx, &mut page[..])?;
            *slot = Slot::Mem { page, epoch: 0 };
            e.came_in(1);
        }
        Ok(())
    }

    /// Brings into memory the kept pages that a change of bytes `off..off+len` keeps part of
    /// (the pages at either end, when the range covers them partly): what a write or a punched
    /// hole needs first (module doc). A range past the largest offset is cut there.
    pub fn prepare_edges(
        &mut self,
        off: u64,
        len: u64,
        fetch: Fetch<'_>,
        e: &PageEpochs,
    ) -> Result<()> {
        let len = len.min(u64::MAX - off);
        let span = page_span(off, len);
        if span.is_empty() {
            return Ok(());
        }
        for idx in [span.start, span.end - 1] {
            if in_page(idx, off, len).len() < PAGE as usize {
                self.fault_in(idx, fetch, e)?;
            }
        }
        Ok(())
    }

    /// What [`FileData::truncate`] from `old_size` to `size` needs first: the page the new
    /// end falls in, when the file shrinks into it (its bytes beyond `size` become zeros).
    pub fn prepare_truncate(
        &mut self,
        size: u64,
        old_size: u64,
        fetch: Fetch<'_>,
        e: &PageEpochs,
    ) -> Result<()> {
        if size < old_size && size % PAGE != 0 {
            self.fault_in(size / PAGE, fetch, e)?;
        }
        Ok(())
    }

    /// Writes `data` at `off`, allocating pages as needed, labelling them `epoch`; returns the
    /// pages added (which the caller reserved beforehand, see [`FileData::missing_pages`]).
    /// Kept pages it covers partly were brought in by [`FileData::prepare_edges`]. A page
    /// that holds only zeros once written joins a run instead (module doc, "Allocated
    /// zeros"): a whole page of zeros, or zeros written into a hole or a run.
    pub fn write(&mut self, off: u64, data: &[u8], epoch: u64, e: &PageEpochs) -> u64 {
        let before = (self.pages(), self.zero_count());
        let mut changed = 0;
        let len = data.len() as u64;
        let span = page_span(off, len);
        let inner = self.inner_mut();
        // Zeros to add to the runs: a span of pages, added when it ends.
        let mut zero_span: Option<Range<u64>> = None;
        for idx in span {
            let r = in_page(idx, off, len);
            let whole = r.len() == PAGE as usize;
            let src = &data[(idx * PAGE + r.start as u64 - off) as usize..][..r.len()];
            let zero = all_zeros(src);
            let stays_zero = zero
                && match inner.pages.get(&idx) {
                    None => true,
                    Some(_) => whole,
                };
            if stays_zero {
                if let Some(Slot::Kept) = inner.pages.remove(&idx) {
                    e.came_in(1);
                }
                match &mut zero_span {
                    Some(z) if z.end == idx => z.end += 1,
                    z => {
                        if let Some(done) = z.take() {
                            inner.fill(done);
                        }
                        *z = Some(idx..idx + 1);
                    }
                }
                continue;
            }
            if !inner.pages.contains_key(&idx)
                && let Some(z) = inner.zeros.as_deref_mut()
            {
                z.cut(idx..idx + 1);
            }
            let slot = inner.pages.entry(idx).or_insert_with(|| {
                changed += 1;
                Slot::Mem {
                    page: new_page(),
                    epoch,
                }
            });
            if let Slot::Kept = slot {
                assert!(
                    whole,
                    "page {idx}: a partial write of a kept page must be prepared"
                );
                e.came_in(1);
                changed += 1;
                *slot = Slot::Mem {
                    page: new_page(),
                    epoch,
                };
            }
            let Slot::Mem { page, epoch: label } = slot else {
                unreachable!("made resident above")
            };
            page[r].copy_from_slice(src);
            changed += u64::from(*label != epoch);
            *label = epoch;
        }
        if let Some(done) = zero_span {
            inner.fill(done);
        }
        self.tidy();
        e.count_changed(changed);
        e.zeros_moved(before.1, self.zero_count());
        self.pages() - before.0
    }

    /// Zeroes bytes `r` of page `idx` if it is in memory, labelling it `epoch`. (A kept page
    /// whose bytes there must become zeros was brought in by a `prepare_*` call; a page in a
    /// run holds zeros already.)
    fn zero_in(&mut self, idx: u64, r: Range<usize>, epoch: u64, e: &PageEpochs) {
        if r.is_empty() {
            return;
        }
        if let Some(Slot::Mem { page, epoch: label }) =
            self.inner.as_mut().and_then(|i| i.pages.get_mut(&idx))
        {
            page[r].fill(0);
            e.count_changed(u64::from(*label != epoch));
            *label = epoch;
        }
    }

    /// Removes the pages and runs from page `start` up to `end` (`None`: to the last);
    /// returns how many pages there were.
    fn remove_pages(&mut self, start: u64, end: Option<u64>, e: &PageEpochs) -> u64 {
        let Some(inner) = self.inner.as_mut() else {
            return 0;
        };
        let mut tail = inner.pages.split_off(&start);
        if let Some(end) = end {
            let mut rest = tail.split_off(&end);
            inner.pages.append(&mut rest);
        }
        e.came_in(tail.values().filter(|s| matches!(s, Slot::Kept)).count() as u64);
        let zeros = match inner.zeros.as_deref_mut() {
            Some(z) => z.cut(start..end.unwrap_or(u64::MAX)),
            None => 0,
        };
        e.zeros_moved(zeros, 0);
        tail.len() as u64 + zeros
    }

    /// Zeroes bytes `off..off+len` inside existing pages and frees pages wholly inside the
    /// range; returns the pages freed.
    pub fn punch(&mut self, off: u64, len: u64, epoch: u64, e: &PageEpochs) -> u64 {
        if len == 0 {
            return 0;
        }
        let end = off.saturating_add(len);
        let first_full = off.div_ceil(PAGE);
        let end_full = end / PAGE;
        let mut freed = 0;
        if first_full < end_full {
            freed = self.remove_pages(first_full, Some(end_full), e);
        }
        // Partial pages at either end keep their other bytes.
        for idx in [off / PAGE, end.saturating_sub(1) / PAGE] {
            let r = in_page(idx, off, end - off);
            if r.len() < PAGE as usize {
                self.zero_in(idx, r, epoch, e);
            }
        }
        self.tidy();
        freed
    }

    /// A size change from `old_size` to `size`: a shrink drops everything at or beyond byte
    /// `size` (zeroing the tail of a partial last page, labelled `epoch`), pages allocated
    /// past the old end included; a growth (or no change) cuts nothing, so pages
    /// `fallocate(FALLOC_FL_KEEP_SIZE)` gave past the end stay, as on tmpfs (they hold
    /// zeros: bytes past the end are never written without moving it). Returns the pages
    /// freed.
    pub fn truncate(&mut self, size: u64, old_size: u64, epoch: u64, e: &PageEpochs) -> u64 {
        if size >= old_size {
            return 0;
        }
        let freed = self.remove_pages(size.div_ceil(PAGE), None, e);
        if size % PAGE != 0 {
            self.zero_in(size / PAGE, (size % PAGE) as usize..PAGE as usize, epoch, e);
        }
        self.tidy();
        freed
    }

    /// Drops every page and run (the file is freed); returns how many pages there were.
    pub fn clear(&mut self, e: &PageEpochs) -> u64 {
        let n = self.remove_pages(0, None, e);
        self.inner = None;
        n
    }

    /// Pages that remain after [`FileData::truncate`] from `old_size` to `size` bytes.
    pub fn pages_after_truncate(&self, size: u64, old_size: u64) -> u64 {
        if size >= old_size {
            return self.pages();
        }
        let end = size.div_ceil(PAGE);
        self.map().range(..end).count() as u64 + self.zeros().map_or(0, |z| z.count_in(0..end))
    }

    /// The first byte at or after `off` that lies in an allocated page (`SEEK_DATA`, before
    /// the caller clamps it to the size). Runs of zeros are allocated: data, as tmpfs says of
    /// fallocated pages.
    pub fn next_data(&self, off: u64) -> Option<u64> {
        let idx = off / PAGE;
        let page = self.map().range(idx..).next().map(|(&i, _)| i);
        let run = self.zeros().and_then(|z| {
            z.covering(idx)
                .map(|_| idx)
                .or_else(|| z.runs.range(idx..).next().map(|(&s, _)| s))
        });
        let first = match (page, run) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b)?,
        };
        Some((first * PAGE).max(off))
    }

    /// The first byte at or after `off` that lies in a hole (`SEEK_HOLE`, before the caller
    /// clamps it to the size): allocated pages and runs are contiguous up to the first page
    /// in neither.
    pub fn next_hole(&self, off: u64) -> u64 {
        let mut want = off / PAGE;
        loop {
            if let Some((_, end)) = self.zeros().and_then(|z| z.covering(want)) {
                want = end;
                continue;
            }
            let from = want;
            for (&idx, _) in self.map().range(want..) {
                if idx != want {
                    break;
                }
                want += 1;
            }
            if want == from {
                break;
            }
        }
        (want * PAGE).max(off)
    }

    /// Allocates `off..off+len`: the pages in it that are neither pages nor in a run join
    /// the runs of zeros, which cost no page of memory (module doc, "Allocated zeros");
    /// returns the pages added (reserved beforehand).
    pub fn allocate(&mut self, off: u64, len: u64, e: &PageEpochs) -> u64 {
        let added = self.inner_mut().fill(page_span(off, len));
        e.zeros_moved(0, added);
        self.tidy();
        added
    }

    /// Adds pages `first..end` as allocated zeros (loading a store that holds them as a run,
    /// or as pages of zeros); returns how many are new.
    pub fn add_zeros(&mut self, first: u64, end: u64, e: &PageEpochs) -> u64 {
        let added = self.inner_mut().fill(first..end.max(first));
        e.zeros_moved(0, added);
        self.tidy();
        added
    }

    /// Adds page `idx` as kept by the store (loading a store); returns whether it is new.
    pub fn add_kept(&mut self, idx: u64, e: &PageEpochs) -> bool {
        let inner = self.inner_mut();
        // A page inside a run is allocated already; the store's bytes for it win.
        let in_run = inner
            .zeros
            .as_deref_mut()
            .map_or(0, |z| z.cut(idx..idx + 1));
        e.zeros_moved(in_run, 0);
        let new = match inner.pages.entry(idx) {
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(Slot::Kept);
                true
            }
            std::collections::btree_map::Entry::Occupied(_) => false,
        };
        e.went_out(u64::from(new));
        self.tidy();
        new && in_run == 0
    }

    /// Whether no page is in memory (every page the store's or a run of zeros).
    pub fn all_kept(&self) -> bool {
        self.inner
            .as_ref()
            .is_none_or(|i| i.pages.values().all(|s| matches!(s, Slot::Kept)))
    }

    /// Sends out of memory every page labelled at or below `kept` (the store holds them);
    /// returns how many went.
    pub fn evict(&mut self, kept: u64, e: &PageEpochs) -> u64 {
        let Some(inner) = self.inner.as_mut() else {
            return 0;
        };
        let mut n = 0;
        for slot in inner.pages.values_mut() {
            if matches!(slot, Slot::Mem { epoch, .. } if *epoch <= kept) {
                *slot = Slot::Kept;
                n += 1;
            }
        }
        e.went_out(n);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errno::Errno;
    use std::cell::RefCell;
    use std::collections::HashMap;

    fn no_store(_: u64, _: &mut [u8]) -> Result<()> {
        panic!("nothing is kept")
    }

    fn read(d: &FileData, off: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0xAA; len];
        d.read(off, &mut b, &no_store).unwrap();
        b
    }

    #[test]
    fn sparse_write_read_and_holes() {
        let e = PageEpochs::default();
        let mut d = FileData::default();
        assert_eq!(d.missing_pages(4090, 10), 2);
        assert_eq!(d.write(4090, b"0123456789", 1, &e), 2);
        assert_eq!(d.pages(), 2);
        assert_eq!(read(&d, 4088, 14), b"\0\x000123456789\0\0");
        // A write far away adds one page and leaves the hole unallocated.
        assert_eq!(d.write(1 << 30, b"x", 1, &e), 1);
        assert_eq!(d.pages(), 3);
        assert_eq!(read(&d, 1 << 20, 4), vec![0; 4]);
        assert_eq!(d.missing_pages(4090, 10), 0);
    }

    #[test]
    fn truncate_zeroes_partial_tail_and_frees_pages() {
        let e = PageEpochs::default();
        let mut d = FileData::default();
        d.write(0, &[1u8; 3 * PAGE as usize], 1, &e);
        assert_eq!(d.truncate(PAGE + 10, 3 * PAGE, 1, &e), 1);
        assert_eq!(d.pages(), 2);
        // Growing again must expose zeros, not the old bytes.
        assert_eq!(read(&d, PAGE + 8, 4), vec![1, 1, 0, 0]);
        assert_eq!(
            d.truncate(5 * PAGE, PAGE + 10, 1, &e),
            0,
            "a growth cuts nothing"
        );
        assert_eq!(d.pages(), 2);
        assert_eq!(d.truncate(0, 5 * PAGE, 1, &e), 2);
        assert_eq!(d.pages(), 0);
    }

    #[test]
    fn punch_frees_whole_pages_and_zeroes_edges() {
        let e = PageEpochs::default();
        let mut d = FileData::default();
        d.write(0, &[7u8; 4 * PAGE as usize], 1, &e);
        assert_eq!(
            d.punch(100, 2 * PAGE, 1, &e),
            1,
            "only page 1 lies wholly inside"
        );
        assert_eq!(read(&d, 98, 4), vec![7, 7, 0, 0]);
        assert_eq!(read(&d, 2 * PAGE + 98, 4), vec![0, 0, 7, 7]);
        assert_eq!(d.pages(), 3);
        assert_eq!(d.punch(0, u64::MAX, 1, &e), 3);
    }

    #[test]
    fn data_and_holes_are_found_at_page_granularity() {
        let e = PageEpochs::default();
        let mut d = FileData::default();
        assert_eq!(d.next_data(0), None);
        assert_eq!(d.next_hole(5), 5);
        d.write(PAGE + 10, b"x", 1, &e);
        d.write(2 * PAGE, b"y", 1, &e);
        d.write(5 * PAGE, b"z", 1, &e);
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
        let e = PageEpochs::default();
        let mut d = FileData::default();
        d.write(PAGE, b"a", 1, &e);
        assert_eq!(d.allocate(0, 3 * PAGE, &e), 2);
        assert_eq!(read(&d, PAGE, 2), b"a\0");
    }

    #[test]
    fn allocated_ranges_are_runs_not_pages() {
        let e = PageEpochs::default();
        let mut d = FileData::default();
        // A terabyte allocated: one run, no page.
        let tb = 1u64 << 40;
        assert_eq!(d.missing_pages(0, tb), tb / PAGE);
        assert_eq!(d.allocate(0, tb, &e), tb / PAGE);
        assert_eq!(
            (d.pages(), d.resident(), d.runs()),
            (tb / PAGE, 0, vec![(0, tb / PAGE)])
        );
        assert_eq!(e.zero_pages(), tb / PAGE);
        assert_eq!(d.missing_pages(PAGE, 10 * PAGE), 0);
        assert_eq!(read(&d, 5 * PAGE - 2, 4), vec![0; 4]);
        // Allocating again adds nothing.
        assert_eq!(d.allocate(PAGE, 3 * PAGE, &e), 0);
        // A write into the run turns its pages into pages, nothing more is allocated.
        assert_eq!(d.write(PAGE + 1, b"ab", 1, &e), 0);
        assert_eq!(d.runs(), vec![(0, 1), (2, tb / PAGE)]);
        assert_eq!((d.pages(), d.resident()), (tb / PAGE, 1));
        assert_eq!(read(&d, PAGE, 4), b"\0ab\0");
        // A punch frees the run's pages it covers wholly, and splits it.
        assert_eq!(d.punch(10 * PAGE + 5, 10 * PAGE, 1, &e), 9);
        assert_eq!(d.runs(), vec![(0, 1), (2, 11), (20, tb / PAGE)]);
        assert_eq!(d.next_hole(0), 11 * PAGE);
        assert_eq!(d.next_data(11 * PAGE), Some(20 * PAGE));
        assert_eq!(
            d.next_data(3 * PAGE + 7),
            Some(3 * PAGE + 7),
            "a run is data"
        );
        // Allocating across the hole merges the runs (the page stays a page).
        assert_eq!(d.allocate(0, 30 * PAGE, &e), 9);
        assert_eq!(d.runs(), vec![(0, 1), (2, tb / PAGE)]);
        assert_eq!(d.next_hole(0), tb);
        // A truncation cuts the run.
        assert_eq!(d.pages_after_truncate(5 * PAGE + 1, tb), 6);
        assert_eq!(d.truncate(5 * PAGE + 1, tb, 1, &e), tb / PAGE - 6);
        assert_eq!(d.runs(), vec![(0, 1), (2, 6)]);
        assert_eq!(e.zero_pages(), 5);
        assert_eq!(d.clear(&e), 6);
        assert_eq!((d.pages(), e.zero_pages()), (0, 0));
        assert!(d.inner.is_none(), "nothing left allocated");
    }

    #[test]
    fn pages_of_zeros_written_are_runs() {
        let e = PageEpochs::default();
        let mut d = FileData::default();
        // Zeros into a hole: allocated, no page.
        assert_eq!(d.write(0, &vec![0; 3 * PAGE as usize], 1, &e), 3);
        assert_eq!((d.pages(), d.resident(), d.runs()), (3, 0, vec![(0, 3)]));
        // A few zero bytes in a hole allocate their page, as a run.
        assert_eq!(d.write(3 * PAGE + 9, &[0; 9], 1, &e), 1);
        assert_eq!(d.runs(), vec![(0, 4)]);
        // Data in a page, then the page rewritten with zeros: back to the run.
        d.write(PAGE, &[5; 100], 1, &e);
        assert_eq!((d.runs(), d.resident()), (vec![(0, 1), (2, 4)], 1));
        d.write(PAGE + 50, &[0; 10], 1, &e);
        assert_eq!(d.resident(), 1, "a partial write of zeros keeps the page");
        d.write(PAGE, &vec![0; PAGE as usize], 1, &e);
        assert_eq!((d.runs(), d.resident(), d.pages()), (vec![(0, 4)], 0, 4));
        assert_eq!(e.zero_pages(), 4);
        // A write that mixes data and zeros.
        let mut buf = vec![0u8; 4 * PAGE as usize];
        buf[(2 * PAGE) as usize] = 1;
        assert_eq!(d.write(2 * PAGE, &buf, 1, &e), 2);
        assert_eq!(d.runs(), vec![(0, 4), (5, 6)]);
        assert_eq!(d.resident(), 1);
        assert_eq!(read(&d, 4 * PAGE - 1, 3), vec![0, 1, 0]);
    }

    /// A store of pages: what was evicted is written here first, as a checkpoint would.
    struct Kept(RefCell<HashMap<u64, Vec<u8>>>, RefCell<u32>);

    impl Kept {
        fn fetch(&self, first: u64, buf: &mut [u8]) -> Result<()> {
            *self.1.borrow_mut() += 1;
            for (k, chunk) in buf.chunks_mut(PAGE as usize).enumerate() {
                let p = self.0.borrow();
                let page = p.get(&(first + k as u64)).ok_or(Errno::EIO)?;
                chunk.copy_from_slice(page);
            }
            Ok(())
        }

        /// What a checkpoint does: copies the file's bytes, then the engine evicts.
        fn checkpoint(&self, d: &mut FileData, e: &PageEpochs) -> u64 {
            let ep = e.begin();
            for idx in 0..64 {
                if d.map().contains_key(&idx) {
                    let mut b = vec![0u8; PAGE as usize];
                    d.read(idx * PAGE, &mut b, &|f, b| self.fetch(f, b))
                        .unwrap();
                    self.0.borrow_mut().insert(idx, b);
                }
            }
            e.kept(ep);
            d.evict(e.kept_epoch(), e)
        }
    }

    #[test]
    fn kept_pages_read_back_and_partial_changes_fault_them_in() {
        let e = PageEpochs::default();
        let s = Kept(Default::default(), Default::default());
        let fetch = |f: u64, b: &mut [u8]| s.fetch(f, b);
        let mut d = FileData::default();
        let mut model = vec![0u8; 4 * PAGE as usize];
        for (i, b) in model.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        d.write(0, &model, e.label(), &e);
        // Not yet kept: a page changed after the checkpoint began stays in memory.
        let ep = e.begin();
        d.write(PAGE, b"late", e.label(), &e);
        model[PAGE as usize..PAGE as usize + 4].copy_from_slice(b"late");
        e.kept(ep);
        // Only the store's view of pages 0, 2, 3 is current: a checkpoint copies them all.
        assert_eq!(s.checkpoint(&mut d, &e), 4);
        assert_eq!(d.resident(), 0);
        assert_eq!(e.out(), 4);
        let mut got = vec![0u8; model.len()];
        d.read(0, &mut got, &fetch).unwrap();
        assert_eq!(got, model);
        // A partial write brings the page in first; a whole-page write does not read it.
        let before = *s.1.borrow();
        d.prepare_edges(10, 5, &fetch, &e).unwrap();
        d.write(10, b"hello", e.label(), &e);
        model[10..15].copy_from_slice(b"hello");
        assert_eq!(*s.1.borrow(), before + 1);
        d.prepare_edges(2 * PAGE, PAGE, &fetch, &e).unwrap();
        d.write(2 * PAGE, &[9u8; PAGE as usize], e.label(), &e);
        model[2 * PAGE as usize..3 * PAGE as usize].fill(9);
        assert_eq!(*s.1.borrow(), before + 1, "a whole page is not read");
        assert_eq!((d.resident(), e.out()), (2, 2));
        // Punch and truncate keep edges right through kept pages.
        d.prepare_edges(PAGE + 100, 200, &fetch, &e).unwrap();
        d.punch(PAGE + 100, 200, e.label(), &e);
        model[PAGE as usize + 100..PAGE as usize + 300].fill(0);
        d.prepare_truncate(3 * PAGE + 7, 4 * PAGE, &fetch, &e)
            .unwrap();
        d.truncate(3 * PAGE + 7, 4 * PAGE, e.label(), &e);
        model.truncate(3 * PAGE as usize + 7);
        let mut got = vec![0u8; model.len()];
        d.read(0, &mut got, &fetch).unwrap();
        assert_eq!(got, model);
        assert_eq!(d.clear(&e), 4);
        assert_eq!(e.out(), 0, "the kept pages' count follows them out");
    }

    #[test]
    fn a_failed_fetch_is_an_error_not_zeros() {
        let e = PageEpochs::default();
        let mut d = FileData::default();
        assert!(d.add_kept(3, &e));
        assert!(!d.add_kept(3, &e));
        let fail = |_: u64, _: &mut [u8]| Err(Errno::EIO);
        let mut b = [0u8; 10];
        assert_eq!(d.read(3 * PAGE, &mut b, &fail), Err(Errno::EIO));
        assert_eq!(d.prepare_edges(3 * PAGE + 1, 1, &fail, &e), Err(Errno::EIO));
        // Growing the file past a kept last page needs nothing from the store.
        assert_eq!(
            d.prepare_truncate(5 * PAGE, 3 * PAGE + 9, &fail, &e),
            Ok(())
        );
        assert_eq!(
            d.prepare_truncate(3 * PAGE + 1, 3 * PAGE + 9, &fail, &e),
            Err(Errno::EIO)
        );
    }

    #[test]
    fn changed_pages_count_once_per_epoch_and_writers_wait_past_the_limit() {
        use std::sync::Arc;
        let e = Arc::new(PageEpochs::default());
        let mut d = FileData::default();
        let pages = |b: u8| vec![b; (CHECK_EVERY * PAGE) as usize];
        // No budget yet (a memory store, or recovery): nothing is due, nobody waits.
        d.write(0, &pages(1), e.label(), &e);
        assert!(!e.due() && !e.over.load(SeqCst));
        let nudges = Arc::new(AtomicU64::new(0));
        let n = nudges.clone();
        let limit = 3 * CHECK_EVERY;
        e.set_budget(
            CHECK_EVERY,
            limit,
            Box::new(move || {
                n.fetch_add(1, SeqCst);
            }),
        );
        // Rewriting the same pages in the same epoch counts nothing more.
        d.write(0, &pages(2), e.label(), &e);
        assert_eq!(e.changed_since_kept(), CHECK_EVERY);
        // New pages count; the check finds a checkpoint due and says so.
        d.write(CHECK_EVERY * PAGE, &pages(3), e.label(), &e);
        assert!(e.due());
        assert_eq!(nudges.load(SeqCst), 1);
        let epoch = e.begin();
        assert!(!e.due(), "due counts from the checkpoint's beginning");
        // Pages changed before the checkpoint began count again when changed after it.
        d.write(0, &pages(4), e.label(), &e);
        assert_eq!(e.changed_since_kept(), limit);
        assert!(e.over.load(SeqCst));
        let waiter = {
            let e = e.clone();
            std::thread::spawn(move || e.throttle())
        };
        std::thread::sleep(Duration::from_millis(150));
        assert!(!waiter.is_finished(), "a writer past the limit waits");
        e.kept(epoch);
        waiter.join().unwrap();
        assert_eq!(
            e.changed_since_kept(),
            CHECK_EVERY,
            "from the kept one's beginning"
        );
        // A store that cannot take checkpoints lets writers go.
        let epoch = e.begin();
        d.write(2 * CHECK_EVERY * PAGE, &pages(5), e.label(), &e);
        d.write(0, &pages(6), e.label(), &e);
        assert!(e.over.load(SeqCst));
        e.set_stalled(true);
        e.throttle();
        e.set_stalled(false);
        e.kept(epoch);
        assert!(!e.over.load(SeqCst));
    }
}
