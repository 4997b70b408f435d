use std::path::Path;
use std::sync::Arc;

use super::scan::segment_is_used;
use super::*;
use crate::disk::{BLOCK, Disk, SimDisk, Unflushed};
use crate::error::StoreError;

const UUID: [u8; 16] = [7; 16];

fn scan_all(disk: &SimDisk) -> Result<(Vec<Vec<u8>>, End), StoreError> {
    let mut v = Vec::new();
    let end = scan(disk, Path::new("/s"), UUID, 1, |_, r| {
        v.push(r.to_vec());
        Ok(())
    })?;
    Ok((v, end))
}

fn writer(disk: &SimDisk) -> Writer {
    let store = Path::new("/s");
    disk.create_dir_all(&dir(store)).unwrap();
    let end = scan(disk, store, UUID, 1, |_, _| Ok(())).unwrap();
    Writer::new(Arc::new(disk.clone()), store, UUID, 1 << 20, end).unwrap()
}

/// A crash can lose the sector holding a batch's header while a later batch, written
/// without a flush between, survives whole. The scan ends cleanly at the zeros; the
/// later batch must not come back as the continuation of batches written after the
/// reopen that happen to end exactly where it starts.
#[test]
fn a_batch_left_after_a_clean_end_is_not_read_after_later_writes() {
    let d = SimDisk::new();
    let path = segment_path(Path::new("/s"), 1);
    let mut w = writer(&d);
    // Batch A, flushed: ends at 64 + 48 + 4 + 100.
    w.write(&[&[1u8; 100][..]]).unwrap();
    w.flush().unwrap();
    let b_at = SEGMENT_HEADER + BATCH_HEADER + 4 + 100;
    // Batch B (two records) ends exactly at a block boundary; batch C follows it.
    let b_len = BLOCK - b_at - BATCH_HEADER - 8;
    w.write(&[&[2u8; 10][..], &vec![2u8; b_len - 10]]).unwrap();
    w.write(&[&[3u8; 50][..]]).unwrap();
    drop(w);
    let (_, mut bytes) = d.files().into_iter().find(|(p, _)| *p == path).unwrap();
    // The crash: B's header never reached the disk (its bytes read as zeros); C did.
    bytes[b_at..b_at + BATCH_HEADER].fill(0);
    d.put(&path, bytes);
    let (got, end) = scan_all(&d).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(end.offset as usize, b_at);
    // Reopened: two new records of B's sizes end exactly where C starts.
    let mut w = writer(&d);
    w.write(&[&[4u8; 10][..], &vec![4u8; b_len - 10]]).unwrap();
    w.flush().unwrap();
    drop(w);
    let (got, _) = scan_all(&d).unwrap();
    assert_eq!(
        got.len(),
        3,
        "C, never acknowledged, came back after the new batch"
    );
    assert_eq!(got[2], vec![4u8; b_len - 10]);
}

/// Segment numbers never have a gap: a removed segment is damage, even when it was the
/// last one in use (its spare left behind) or the first one.
#[test]
fn a_removed_segment_is_damage_wherever_it_was() {
    let store = Path::new("/s");
    let make = || {
        let d = SimDisk::new();
        let mut w = Writer::new(Arc::new(d.clone()), store, UUID, 4096, {
            d.create_dir_all(&dir(store)).unwrap();
            scan(&d, store, UUID, 1, |_, _| Ok(())).unwrap()
        })
        .unwrap();
        for k in 0..40u8 {
            w.write(&[&[k; 300][..]]).unwrap();
        }
        w.flush().unwrap();
        drop(w);
        d
    };
    let d = make();
    let seqs = segments(&d, store).unwrap();
    assert!(seqs.len() >= 4, "{seqs:?}");
    let last = *seqs.last().unwrap();
    // The spare is unused; the one before it is the last in use.
    assert!(!segment_is_used(&d, store, &UUID, last).unwrap());
    for gone in [1, last - 1, last / 2] {
        let d = make();
        d.remove(&segment_path(store, gone)).unwrap();
        match scan_all(&d) {
            Err(StoreError::Damaged {
                path,
                offset: 0,
                what,
            }) => {
                assert!(what.contains("missing"), "{what}");
                assert_eq!(path, segment_path(store, gone + 1));
            }
            r => panic!("segment {gone} removed: {:?}", r.map(|(v, e)| (v.len(), e))),
        }
    }
}

/// As a checkpoint of every record up to `upto` does (`checkpoint::recycle`): segment
/// `k` leaves the journal once `k + 1` starts at or below `upto + 1`, kept for reuse
/// while fewer than `FREE_MAX` are.
fn retire(d: &SimDisk, store: &Path, upto: u64) {
    let seqs = segments(d, store).unwrap();
    let mut free = free_segments(d, store).unwrap().len();
    for pair in seqs.windows(2) {
        match first_lsn(d, store, pair[1]).unwrap() {
            Some(l) if l <= upto + 1 => {
                let p = segment_path(store, pair[0]);
                if free < FREE_MAX {
                    d.rename(&p, &free_path(store, pair[0])).unwrap();
                    free += 1;
                } else {
                    d.remove(&p).unwrap();
                }
            }
            _ => break,
        }
    }
    d.sync_dir(&dir(store)).unwrap();
}

/// The records of `img` from `from` on, and where its journal ends.
fn from_lsn(img: &SimDisk, from: u64) -> Result<(Vec<Vec<u8>>, End), StoreError> {
    let mut v = Vec::new();
    let end = scan(img, Path::new("/s"), UUID, from, |lsn, r| {
        assert_eq!(lsn, from + v.len() as u64);
        v.push(r.to_vec());
        Ok(())
    })?;
    Ok((v, end))
}

/// Segments recycled as spares hold an earlier life's batches after the end: a power cut
/// at any flush (of a batch, a switch, a spare's header or a rename), with unflushed
/// writes lost, kept or torn, leaves a journal that opens to a prefix of the records
/// with every flushed one, never with a stale batch in it; a writer continuing such a
/// journal (after a torn end, or stale bytes after a clean one) adds records that read
/// back after that prefix, across further reopens.
#[test]
fn recycled_segments_come_back_as_a_prefix_after_power_cuts() {
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
    let store = Path::new("/s");
    let d = SimDisk::new();
    let images = Arc::new(parking_lot::Mutex::new(Vec::new()));
    // Records flushed, and the checkpoint's LSN (its records are no longer needed).
    let flushed = Arc::new(AtomicUsize::new(0));
    let ck = Arc::new(AtomicU64::new(0));
    d.create_dir_all(&dir(store)).unwrap();
    let end = scan(&d, store, UUID, 1, |_, _| Ok(())).unwrap();
    let mut w = Writer::new(Arc::new(d.clone()), store, UUID, 8192, end).unwrap();
    {
        let (images, flushed, ck) = (images.clone(), flushed.clone(), ck.clone());
        let mut n = 0u64;
        d.on_sync(move |disk, _| {
            n += 1;
            let f = flushed.load(SeqCst);
            let c = ck.load(SeqCst);
            let u = match n % 3 {
                0 => Unflushed::Lost,
                1 => Unflushed::Kept,
                _ => Unflushed::Torn(n),
            };
            images.lock().push((f, c, disk.crash(u)));
        });
    }
    let rs: Vec<Vec<u8>> = (0..900)
        .map(|i| vec![(i % 251) as u8; 60 + i % 300])
        .collect();
    for (k, chunk) in rs.chunks(7).enumerate() {
        let refs: Vec<&[u8]> = chunk.iter().map(|r| &r[..]).collect();
        w.write(&refs).unwrap();
        if k % 4 == 3 {
            w.flush().unwrap();
            flushed.store((k + 1) * 7, SeqCst);
        }
        if k % 9 == 8 {
            // A checkpoint of everything flushed: its segments leave the journal.
            let upto = flushed.load(SeqCst) as u64;
            ck.store(upto, SeqCst);
            retire(&d, store, upto);
        }
    }
    w.flush().unwrap();
    drop(w);
    d.clear_hook();
    let images = std::mem::take(&mut *images.lock());
    assert!(images.len() > 100, "{} images", images.len());
    // Spares were made from recycled segments (else this tests nothing new).
    let recycled = images
        .iter()
        .filter(|(_, _, img)| {
            img.files().iter().any(|(p, b)| {
                p.extension().is_some_and(|e| e == "seg")
                    && SegmentHeader::decode(b).is_ok_and(|h| h.is_some())
                    && b[SEGMENT_HEADER..].iter().any(|&x| x != 0)
                    && b.windows(4).filter(|w| *w == BATCH_MAGIC).count() > 0
            })
        })
        .count();
    assert!(recycled > 0);
    for (i, (f, c, img)) in images.into_iter().enumerate() {
        let want = |got: &[Vec<u8>]| {
            assert!(
                c as usize + got.len() >= f,
                "image {i}: {} records back after {c}, {f} were flushed",
                got.len()
            );
            assert!(
                got[..] == rs[c as usize..c as usize + got.len()],
                "image {i}: records after {c} differ"
            );
        };
        let (got, end) = from_lsn(&img, c + 1).unwrap_or_else(|e| panic!("image {i}: {e}"));
        want(&got);
        // Continued twice, reopened in between: what was there, then the new records.
        let mut more = Vec::new();
        for round in 0..2u8 {
            let end = from_lsn(&img, c + 1)
                .unwrap_or_else(|e| panic!("image {i}, reopen {round}: {e}"))
                .1;
            let mut w = Writer::new(Arc::new(img.clone()), store, UUID, 8192, end).unwrap();
            for j in 0..25u8 {
                let r = vec![200 + round, j, 0xee];
                w.write(&[&r[..]]).unwrap();
                more.push(r);
            }
            w.flush().unwrap();
        }
        let (again, _) = from_lsn(&img, c + 1).unwrap_or_else(|e| panic!("image {i}: {e}"));
        assert_eq!(again.len(), got.len() + more.len(), "image {i} ({end:?})");
        assert!(again[..got.len()] == got[..], "image {i}");
        assert!(again[got.len()..] == more[..], "image {i}");
    }
}

/// A writer reopening a journal whose last segment was grown past the segment size for
/// one large record, with bytes a crash left after its end, closes that segment with
/// zeros after the end (the file's length, not the segment size, bounds them), so that
/// the segment still ends cleanly once later segments follow it.
#[test]
fn a_grown_segment_with_bytes_after_its_end_is_closed_cleanly() {
    let store = Path::new("/s");
    let d = SimDisk::new();
    let mut w = writer(&d);
    // Its batch ends exactly at a block's end (header 64, batch header 48, frame 4).
    let big = vec![3u8; (1 << 20) + 2 * BLOCK - SEGMENT_HEADER - BATCH_HEADER - 4];
    w.write(&[&big[..]]).unwrap();
    w.flush().unwrap();
    drop(w);
    // The grown segment: garbage after its last batch, as a torn later batch leaves.
    let seqs = segments(&d, store).unwrap();
    let grown = seqs
        .iter()
        .map(|&s| segment_path(store, s))
        .find(|p| d.files().iter().any(|(q, b)| q == p && b.len() > 1 << 20))
        .expect("a grown segment");
    let (_, mut bytes) = d.files().into_iter().find(|(q, _)| *q == grown).unwrap();
    let end = batch_end(&bytes);
    assert_eq!(end % BLOCK, 0);
    bytes.resize(end + 700, 0);
    bytes[end..].fill(0x5a);
    d.put(&grown, bytes);
    let (got, e) = scan_all(&d).unwrap();
    assert_eq!(got, vec![big.clone()]);
    assert!(e.dirty && e.torn, "{e:?}");
    let mut w = writer(&d);
    w.write(&[b"after".as_slice()]).unwrap();
    w.flush().unwrap();
    drop(w);
    let (got, e) = scan_all(&d).unwrap();
    assert_eq!(got, vec![big, b"after".to_vec()]);
    assert!(!e.torn, "{e:?}");
}

/// The end of the batches of a segment's bytes.
fn batch_end(b: &[u8]) -> usize {
    let mut at = SEGMENT_HEADER;
    while let Some(h) = BatchHeader::decode(&b[at..], &UUID) {
        at += BATCH_HEADER + h.len as usize;
    }
    at
}

/// A payload whose header claims billions of records is refused without allocating
/// for them.
#[test]
fn a_huge_record_count_allocates_nothing() {
    assert_eq!(records(&[1, 0, 0, 0, 9], u32::MAX), None);
    assert_eq!(records(&[1, 0, 0, 0, 9], 1), Some(vec![&[9u8][..]]));
}

/// A zeroed header does not make a segment that holds batches pass for an unused one
/// (which would drop every record in it, acknowledged or not); found by the fuzzer.
#[test]
fn a_zeroed_header_of_the_last_segment_in_use_is_damage() {
    let d = SimDisk::new();
    let store = Path::new("/s");
    d.create_dir_all(&dir(store)).unwrap();
    let end = scan(&d, store, UUID, 1, |_, _| Ok(())).unwrap();
    let mut w = Writer::new(Arc::new(d.clone()), store, UUID, 4096, end).unwrap();
    for k in 0..30u8 {
        w.write(&[&[k; 300][..]]).unwrap();
        w.flush().unwrap();
    }
    drop(w);
    let seqs = segments(&d, store).unwrap();
    let last = seqs[seqs.len() - 2];
    assert!(segment_is_used(&d, store, &UUID, last).unwrap());
    let p = segment_path(store, last);
    let (_, mut bytes) = d.files().into_iter().find(|(q, _)| *q == p).unwrap();
    bytes[..SEGMENT_HEADER].fill(0);
    d.put(&p, bytes);
    match scan_all(&d) {
        Err(StoreError::Damaged {
            path, offset: 0, ..
        }) => assert_eq!(path, p),
        r => panic!("{:?}", r.map(|(v, e)| (v.len(), e))),
    }
}
