//! `lanefs fsck`: checking a store, and cutting a damaged one back to its last consistent
//! prefix.
//!
//! [`check`] does what opening does without changing anything: it reads the identity file,
//! loads the checkpoint (redb's own checksums, then every key through the engine's
//! recovery), scans the journal after it (checksums, sequence numbers, segment order) and
//! replays every record into the scratch filesystem, which must accept each one and end in a state that passes the
//! engine's invariant check. The first finding is returned as an error naming the file and
//! byte offset.
//!
//! [`repair`] keeps the records up to the first one that is damaged or does not fit the state
//! before it (a damaged checkpoint cannot be cut back: the records it holds are no longer in
//! the journal, so repair refuses it): it removes the segments after the finding's, and rewrites the finding's
//! segment with the records kept from it (written whole under another name, flushed, then
//! renamed over it), so that a crash during repair leaves the store either still damaged at
//! the same place or repaired (docs/STORE.md, "fsck"). It reports what it dropped.

use std::path::Path;
use std::sync::Arc;

use lanefs::{Config, Filesystem, InodeId, Record, Store};

use crate::checkpoint::{Checkpoint, Compact, PageReader};
use crate::error::StoreError;
use crate::identity::{existing_store, identity};
use crate::{Options, journal};

/// What a check found in a store that is consistent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckReport {
    /// Journal segments.
    pub segments: usize,
    /// The LSN the checkpoint holds every record up to (0: none).
    pub checkpoint_lsn: u64,
    /// Records replayed.
    pub records: u64,
    /// Whether the journal ends with a torn tail (a batch cut by a crash, never
    /// acknowledged), which opening drops.
    pub torn_tail: bool,
    /// Inodes in the filesystem the records build.
    pub inodes: u64,
}

/// What a repair kept and dropped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RepairReport {
    /// Records kept.
    pub kept: u64,
    /// The finding the journal was cut at (`None`: it was consistent; nothing was changed).
    pub cut_at: Option<String>,
    /// Bytes of journal after the cut that were dropped.
    pub dropped_bytes: u64,
}

/// Replays the journal into a scratch filesystem; returns the records that fit, in order,
/// and the first finding, if any.
type Replayed = (
    Vec<(u64, Vec<u8>)>,
    Result<(CheckReport, Filesystem), StoreError>,
);

/// The store under fsck's replay: it keeps nothing, and reads the pages a loaded checkpoint
/// left in place from it.
struct Reading {
    pages: Option<PageReader>,
}

impl Store for Reading {
    fn append(&self, _: &Record<'_>) -> lanefs::Result<()> {
        Ok(())
    }

    fn sync(&self) -> lanefs::Result<()> {
        Ok(())
    }

    fn durable(&self) -> bool {
        false
    }

    fn read_pages(&self, inode: InodeId, first: u64, buf: &mut [u8]) -> lanefs::Result<()> {
        match &self.pages {
            Some(p) => p.read(inode, first, buf),
            None => Err(lanefs::Errno::EIO),
        }
    }
}

fn replay(dir: &Path, opts: &Options, keep: bool) -> Result<Replayed, StoreError> {
    let disk = &*opts.disk;
    let (uuid, created) = identity(disk, dir, false)?;
    debug_assert!(!created);
    let segments = journal::segments(disk, dir)?.len();
    let mut ck = checkpoint(disk, dir, uuid, opts)?;
    let store = Arc::new(Reading {
        pages: ck.as_ref().map(Checkpoint::pages),
    });
    let cfg = Config {
        // No limit of the host's memory: a store is as large as its disk.
        max_bytes: Some(lanefs::MAX_FILE_SIZE),
        ..Config::default()
    };
    let mut rec = Filesystem::recover(cfg, store);
    if let Some(ck) = &mut ck {
        ck.load(&mut rec)?;
        // The counts a lazy opening trusts (docs/STORE.md, "Loading on demand"): wrong ones
        // fail a check; a repair leaves them to the next whole opening (`-o load=whole`),
        // which corrects them, since no journal cut would.
        if let Some(wrong) = ck.check_counts(rec.usage())
            && !keep
        {
            return Err(StoreError::damaged(ck.path().to_path_buf(), 0, wrong));
        }
    }
    let checkpoint_lsn = ck.as_ref().map_or(0, Checkpoint::lsn);
    let loaded = rec.records();
    let mut kept = Vec::new();
    let scanned = journal::scan(disk, dir, uuid, checkpoint_lsn + 1, |lsn, bytes| {
        let r = Record::decode(bytes).map_err(|e| e.to_string())?;
        rec.apply(&r).map_err(|e| e.to_string())?;
        if keep {
            kept.push((lsn, bytes.to_vec()));
        }
        Ok(())
    });
    let records = rec.records() - loaded;
    let outcome = scanned.and_then(|end| {
        let fs = rec.finish().map_err(|e| {
            StoreError::damaged(
                journal::segment_path(dir, end.segment.max(1)),
                end.offset,
                format!("the records do not end in a consistent state: {e}"),
            )
        })?;
        fs.check_invariants().map_err(|e| {
            StoreError::damaged(
                journal::dir(dir),
                0,
                format!("the records build a filesystem that fails its invariant check: {e}"),
            )
        })?;
        let inodes = fs.statfs().files - fs.statfs().ffree;
        Ok((
            CheckReport {
                segments,
                checkpoint_lsn,
                records,
                torn_tail: end.torn,
                inodes,
            },
            fs,
        ))
    });
    Ok((kept, outcome))
}

/// The store's checkpoint, as fsck reads it: never made, never compacted.
fn checkpoint(
    disk: &dyn crate::disk::Disk,
    dir: &Path,
    uuid: [u8; 16],
    opts: &Options,
) -> Result<Option<Checkpoint>, StoreError> {
    Checkpoint::open(
        disk,
        dir,
        uuid,
        false,
        true,
        Compact::Never,
        opts.checkpoint_cache,
    )
}

/// Checks the store in `dir` (see the module doc); the store must not be open elsewhere.
pub fn check(dir: &Path, opts: &Options) -> Result<CheckReport, StoreError> {
    existing_store(&*opts.disk, dir)?;
    let _lock = crate::lock(&*opts.disk, dir, "fsck")?;
    let (_, outcome) = replay(dir, opts, false)?;
    outcome.map(|(r, _)| r)
}

/// Cuts the store in `dir` back to its last consistent prefix (see the module doc).
pub fn repair(dir: &Path, opts: &Options) -> Result<RepairReport, StoreError> {
    let disk = &*opts.disk;
    existing_store(disk, dir)?;
    let _lock = crate::lock(disk, dir, "fsck --repair")?;
    let (kept, outcome) = replay(dir, opts, true)?;
    let (path, finding) = match outcome {
        Ok(_) => {
            return Ok(RepairReport {
                kept: kept.len() as u64,
                cut_at: None,
                dropped_bytes: 0,
            });
        }
        Err(e @ StoreError::Damaged { .. }) => {
            let StoreError::Damaged { path, .. } = &e else {
                unreachable!()
            };
            (path.clone(), e.to_string())
        }
        Err(e) => return Err(e),
    };
    let (uuid, _) = identity(disk, dir, false)?;
    let seqs = journal::segments(disk, dir)?;
    let Some(&cut) = seqs
        .iter()
        .find(|&&s| journal::segment_path(dir, s) == path)
    else {
        return Err(StoreError::NotAStore {
            path: dir.to_path_buf(),
            what: format!("cannot repair: the finding is not in a journal segment ({finding})"),
        });
    };
    // The segment the finding is in keeps the records before it; later segments go.
    let seg_path = journal::segment_path(dir, cut);
    let seg = disk
        .open(&seg_path, false)
        .map_err(StoreError::io(&seg_path, "open"))?;
    let mut head = [0u8; journal::SEGMENT_HEADER];
    let n = seg
        .read_at(&mut head, 0)
        .map_err(StoreError::io(&seg_path, "read"))?;
    let base = match checkpoint(disk, dir, uuid, opts)? {
        Some(ck) => ck.lsn(),
        None => 0,
    };
    let first_lsn = match journal::SegmentHeader::decode(&head[..n]) {
        Ok(Some(h)) => h.first_lsn,
        _ => kept.last().map_or(base, |k| k.0) + 1,
    };
    let mut dropped = 0;
    let jd = journal::dir(dir);
    // A cut segment that starts inside the checkpoint is rewritten to start after it, and
    // the segments before it, all inside the checkpoint, go.
    let first_lsn = if first_lsn <= base {
        for &s in seqs.iter().filter(|&&s| s < cut) {
            let p = journal::segment_path(dir, s);
            dropped += disk.open(&p, false).and_then(|f| f.len()).unwrap_or(0);
            disk.remove(&p).map_err(StoreError::io(&p, "remove"))?;
        }
        base + 1
    } else {
        first_lsn
    };
    for &s in seqs.iter().filter(|&&s| s > cut) {
        let p = journal::segment_path(dir, s);
        dropped += disk.open(&p, false).and_then(|f| f.len()).unwrap_or(0);
        disk.remove(&p).map_err(StoreError::io(&p, "remove"))?;
    }
    disk.sync_dir(&jd)
        .map_err(StoreError::io(&jd, "flush directory"))?;
    let in_cut: Vec<&[u8]> = kept
        .iter()
        .filter(|(lsn, _)| *lsn >= first_lsn)
        .map(|(_, r)| &r[..])
        .collect();
    let old_len = seg.len().map_err(StoreError::io(&seg_path, "size"))?;
    if in_cut.is_empty() {
        dropped += old_len;
        disk.remove(&seg_path)
            .map_err(StoreError::io(&seg_path, "remove"))?;
    } else {
        let bytes = journal::encode_segment(uuid, cut, first_lsn, &in_cut);
        dropped += old_len.saturating_sub(bytes.len() as u64);
        // Written whole under another name, then renamed over the damaged segment.
        let tmp = dir.join("repair.tmp");
        let f = disk
            .open(&tmp, true)
            .map_err(StoreError::io(&tmp, "create"))?;
        f.set_len(0)
            .and_then(|()| f.write_at(&bytes, 0))
            .and_then(|()| f.sync_data())
            .map_err(StoreError::io(&tmp, "write"))?;
        disk.rename(&tmp, &seg_path)
            .map_err(StoreError::io(&seg_path, "rename"))?;
    }
    disk.sync_dir(&jd)
        .map_err(StoreError::io(&jd, "flush directory"))?;
    disk.sync_dir(dir)
        .map_err(StoreError::io(dir, "flush directory"))?;
    Ok(RepairReport {
        kept: kept.len() as u64,
        cut_at: Some(finding),
        dropped_bytes: dropped,
    })
}
