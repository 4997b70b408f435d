use std::path::Path;
use std::sync::Arc;

use super::*;
use crate::disk::{Disk, SimDisk, Unflushed};
use crate::error::StoreError;

const UUID: [u8; 16] = [7; 16];

fn writer(disk: &SimDisk, seg: u64) -> Writer {
    let store = Path::new("/s");
    disk.create_dir_all(&dir(store)).unwrap();
    let end = scan(disk, store, UUID, 1, |_, _| Ok(())).unwrap();
    Writer::new(Arc::new(disk.clone()), store, UUID, seg, end).unwrap()
}

fn all(disk: &SimDisk) -> Result<(Vec<Vec<u8>>, End), StoreError> {
    let mut v = Vec::new();
    let end = scan(disk, Path::new("/s"), UUID, 1, |lsn, r| {
        assert_eq!(lsn, v.len() as u64 + 1);
        v.push(r.to_vec());
        Ok(())
    })?;
    Ok((v, end))
}

fn recs(n: usize, size: usize) -> Vec<Vec<u8>> {
    (0..n).map(|i| vec![i as u8; size + i % 7]).collect()
}

#[test]
fn records_come_back_in_order_across_segments_and_reopens() {
    let d = SimDisk::new();
    let mut w = writer(&d, 4096);
    let rs = recs(300, 40);
    for chunk in rs.chunks(17) {
        let refs: Vec<&[u8]> = chunk.iter().map(|r| &r[..]).collect();
        w.write(&refs).unwrap();
    }
    // Closed before the journal is scanned or opened again, as the store's lock ensures:
    // the next segment its writer makes ahead on a thread of its own is finished then (a
    // scan beside that thread, on a loaded machine, met the segment half made).
    drop(w);
    let (got, end) = all(&d).unwrap();
    assert_eq!(got, rs);
    assert_eq!(end.next_lsn, 301);
    assert!(!end.torn);
    assert!(segments(&d, Path::new("/s")).unwrap().len() > 3);
    // Reopened, the journal continues where it ended.
    let mut w = writer(&d, 4096);
    w.write(&[b"after".as_slice()]).unwrap();
    let (got, _) = all(&d).unwrap();
    assert_eq!(got.len(), 301);
    assert_eq!(got[300], b"after");
}

/// What the checkpointer reads: `follow`, from a cursor or from nothing, hands over
/// exactly records `from..=upto`, across segments, a reopen, a record larger than a
/// segment, and segments removed as a checkpoint removes them.
#[test]
fn follow_reads_exactly_the_records_asked_for_from_a_cursor_or_from_nothing() {
    use rand::{Rng, SeedableRng, rngs::StdRng};
    let seed: u64 = rand::random();
    let mut rng = StdRng::seed_from_u64(seed);
    let d = SimDisk::new();
    let store = Path::new("/s");
    let mut w = writer(&d, 4096);
    let mut rs = recs(300, 40);
    rs.insert(150, vec![5u8; 9000]);
    for chunk in rs[..200].chunks(17) {
        let refs: Vec<&[u8]> = chunk.iter().map(|r| &r[..]).collect();
        w.write(&refs).unwrap();
    }
    drop(w);
    let mut w = writer(&d, 4096);
    for chunk in rs[200..].chunks(5) {
        let refs: Vec<&[u8]> = chunk.iter().map(|r| &r[..]).collect();
        w.write(&refs).unwrap();
    }
    let last = rs.len() as u64;
    let (mut from, mut cursor) = (1u64, None);
    while from <= last {
        let upto = rng.random_range(from..=last.min(from + 60));
        for at in [None, cursor] {
            let mut got = Vec::new();
            let next = follow(&d, store, UUID, at, from, upto, |first, _, rs| {
                for (k, r) in rs.iter().enumerate() {
                    got.push((first + k as u64, r.to_vec()));
                }
                Ok(())
            })
            .unwrap_or_else(|e| panic!("seed {seed}: {from}..={upto} from {at:?}: {e}"));
            let want: Vec<_> = (from..=upto)
                .map(|l| (l, rs[l as usize - 1].clone()))
                .collect();
            assert!(got == want, "seed {seed}: {from}..={upto} from {at:?}");
            assert!(next.lsn <= upto + 1, "seed {seed}: {next:?}");
            cursor = Some(next);
        }
        from = upto + 1;
        // As a checkpoint up to `upto` does: segment k goes once k + 1 starts at or
        // below `upto + 1`.
        let seqs = segments(&d, store).unwrap();
        for pair in seqs.windows(2) {
            match first_lsn(&d, store, pair[1]).unwrap() {
                Some(l) if l <= from => d.remove(&segment_path(store, pair[0])).unwrap(),
                _ => break,
            }
        }
    }
    // A record that is not there is an error, not a wait or a panic.
    let e = follow(
        &d,
        store,
        UUID,
        cursor,
        last + 1,
        last + 1,
        |_, _, _| Ok(()),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains(&format!("record {}", last + 1)),
        "{e}"
    );
}

#[test]
fn a_record_larger_than_a_segment_gets_one_of_its_own() {
    let d = SimDisk::new();
    let mut w = writer(&d, 1024);
    let big = vec![9u8; 5000];
    w.write(&[b"a".as_slice(), &big, b"b"]).unwrap();
    let (got, _) = all(&d).unwrap();
    assert_eq!(got, vec![b"a".to_vec(), big, b"b".to_vec()]);
}

/// A power cut at any flush leaves a prefix of the batches written, every flushed batch
/// included, and the journal opens without error.
#[test]
fn power_cuts_leave_a_prefix_with_every_flushed_batch() {
    let d = SimDisk::new();
    let images = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let flushed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut w = writer(&d, 2048);
    {
        let images = images.clone();
        let flushed = flushed.clone();
        d.on_sync(move |disk, _| {
            let f = flushed.load(std::sync::atomic::Ordering::SeqCst);
            for u in [Unflushed::Lost, Unflushed::Kept, Unflushed::Torn(f as u64)] {
                images.lock().push((f, disk.crash(u)));
            }
        });
    }
    let rs = recs(120, 30);
    for (k, chunk) in rs.chunks(5).enumerate() {
        let refs: Vec<&[u8]> = chunk.iter().map(|r| &r[..]).collect();
        w.write(&refs).unwrap();
        // Some batches stay unflushed for a while: a power cut may tear any of them.
        if k % 3 == 2 {
            w.flush().unwrap();
            flushed.store((k + 1) * 5, std::sync::atomic::Ordering::SeqCst);
        }
    }
    d.clear_hook();
    let images = std::mem::take(&mut *images.lock());
    assert!(images.len() > 50);
    for (f, img) in images {
        let (got, _) = all(&img).unwrap_or_else(|e| panic!("after {f} records: {e}"));
        assert!(
            got.len() >= f,
            "{} records back, {f} were flushed",
            got.len()
        );
        assert_eq!(got[..], rs[..got.len()]);
    }
}

/// A write that fails for lack of space leaves the records it did not write in the
/// payload, and writing them again once there is room puts every record in the journal
/// once, in order.
#[test]
fn records_not_written_for_lack_of_space_are_written_by_a_later_try() {
    let d = SimDisk::new();
    let mut w = writer(&d, 4096);
    w.write(&[b"first".as_slice()]).unwrap();
    assert!(matches!(w.poll_spare(true), Spare::Ready));
    d.set_space(Some(d.used()));
    // More than the room left in the segment and its spare.
    let rs = recs(100, 100);
    let mut p = Payload::new();
    for r in &rs {
        p.push(r);
    }
    let e = w.write_payload(&mut p).unwrap_err();
    assert!(out_of_space(&e), "{e}");
    let left = p.count as usize;
    assert!(left > 0 && left < rs.len(), "{left} left");
    let (got, _) = all(&d).unwrap();
    assert_eq!(got[1..], rs[..rs.len() - left]);
    // Still no room: the next try fails too, and loses nothing.
    assert!(out_of_space(&w.write_payload(&mut p).unwrap_err()));
    assert_eq!(p.count as usize, left);
    assert!(matches!(w.poll_spare(false), Spare::Missing));
    d.set_space(None);
    w.write_payload(&mut p).unwrap();
    assert_eq!(p.count, 0);
    w.flush().unwrap();
    let (got, end) = all(&d).unwrap();
    assert_eq!(got.len(), rs.len() + 1);
    assert_eq!(got[1..], rs[..]);
    assert!(!end.torn);
}

/// Offsets of the batches in a segment's bytes.
fn batch_offsets(bytes: &[u8]) -> Vec<usize> {
    let mut at = SEGMENT_HEADER;
    let mut v = Vec::new();
    while let Some(h) = BatchHeader::decode(&bytes[at..], &UUID) {
        v.push(at);
        at += BATCH_HEADER + h.len as usize;
    }
    v
}

#[test]
fn damage_before_the_tail_names_the_file_and_offset() {
    let d = SimDisk::new();
    let mut w = writer(&d, 1 << 16);
    for r in recs(10, 100) {
        w.write(&[&r]).unwrap();
        w.flush().unwrap();
    }
    let path = segment_path(Path::new("/s"), 1);
    let (_, bytes) = d.files().into_iter().find(|(p, _)| *p == path).unwrap();
    let batches = batch_offsets(&bytes);
    assert_eq!(batches.len(), 10);
    // A flipped byte in the third batch's payload: damage, reported there.
    let mut bad = bytes.clone();
    bad[batches[2] + BATCH_HEADER + 10] ^= 1;
    d.put(&path, bad);
    match all(&d) {
        Err(StoreError::Damaged {
            path: p, offset, ..
        }) => {
            assert_eq!(p, path);
            assert_eq!(offset, batches[2] as u64);
        }
        r => panic!("{r:?}"),
    }
    // The same flip in the last batch is a torn tail: dropped.
    let mut tail = bytes.clone();
    tail[batches[9] + BATCH_HEADER + 10] ^= 1;
    d.put(&path, tail);
    let (got, e) = all(&d).unwrap();
    assert_eq!(got.len(), 9);
    assert!(e.torn);
    assert_eq!(e.offset as usize, batches[9]);
    // A damaged segment header, with records after it: damage at byte 0.
    let mut head = bytes.clone();
    head[20] ^= 1;
    d.put(&path, head);
    match all(&d) {
        Err(StoreError::Damaged { offset: 0, .. }) => {}
        r => panic!("{r:?}"),
    }
}

/// A scan reads a segment a chunk at a time (`scan.rs`): batches that cross a chunk's end
/// come back whole, and damage, a torn tail and bytes after the end are found as far into
/// the segment as they are, past the first chunk.
#[test]
fn a_segment_larger_than_a_read_is_scanned_whole() {
    let d = SimDisk::new();
    let mut w = writer(&d, 4 << 20);
    // About 2.6 MiB of batches of odd lengths, so that they straddle the 1 MiB chunks.
    let rs: Vec<Vec<u8>> = (0..500).map(|i| vec![i as u8; 5000 + i * 3]).collect();
    for r in &rs {
        w.write(&[r]).unwrap();
        w.flush().unwrap();
    }
    drop(w);
    let (got, end) = all(&d).unwrap();
    assert_eq!(got, rs);
    assert!(!end.torn && !end.dirty && !end.later);
    let path = segment_path(Path::new("/s"), 1);
    let (_, bytes) = d.files().into_iter().find(|(p, _)| *p == path).unwrap();
    let batches = batch_offsets(&bytes);
    assert_eq!(batches.len(), 500);
    let past = |at: usize| batches.iter().position(|&b| b > at).unwrap();
    // A flipped byte in a batch of the second chunk: damage there (later batches, in the
    // third chunk, were written after it was flushed).
    let second = past(1 << 20);
    let mut bad = bytes.clone();
    bad[batches[second] + BATCH_HEADER + 10] ^= 1;
    d.put(&path, bad);
    match all(&d) {
        Err(StoreError::Damaged { offset, .. }) => assert_eq!(offset, batches[second] as u64),
        r => panic!("{r:?}"),
    }
    // The same in the last batch, in the third chunk: a torn tail, dropped.
    let mut tail = bytes.clone();
    tail[batches[499] + BATCH_HEADER + 10] ^= 1;
    d.put(&path, tail);
    let (got, e) = all(&d).unwrap();
    assert_eq!(got.len(), 499);
    assert!(e.torn && e.dirty);
    assert_eq!(e.offset as usize, batches[499]);
    // A byte far after the clean end (in the last chunk): the end is dirty.
    let mut stray = bytes.clone();
    let last = stray.len() - 1;
    stray[last] = 1;
    d.put(&path, stray);
    let (got, e) = all(&d).unwrap();
    assert_eq!(got.len(), 500);
    assert!(!e.torn && e.dirty && !e.later);
    // A batch of this segment left far after the end (straddling the end of the first chunk
    // read after it): the next
    // batch goes to a new segment.
    let mut left = bytes.clone();
    let at = end.offset as usize + (1 << 20) - 2;
    left[at..at + BATCH_HEADER + 16].copy_from_slice(&bytes[batches[499]..][..BATCH_HEADER + 16]);
    let h = BatchHeader {
        first_lsn: 501,
        ..BatchHeader::decode(&bytes[batches[499]..], &UUID).unwrap()
    };
    left[at..at + BATCH_HEADER].copy_from_slice(&h.encode(&UUID));
    d.put(&path, left);
    let (got, e) = all(&d).unwrap();
    assert_eq!(got.len(), 500);
    assert!(e.dirty && e.later);
}
