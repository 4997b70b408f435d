//! Harnesses for the fuzz targets in `fuzz/` (cargo-fuzz), also run by the tests below on
//! seeds and random mutations of them, so that they build and hold on stable. Not an API.
//!
//! - [`decode_record`]: any bytes given to the record decoder either fail to decode or
//!   decode to a record that encodes and decodes back to itself; never a panic. A summary
//!   (`RecordSummary::decode`) of the same bytes agrees: for the kinds it reads (Create,
//!   Remove, Free, Rename: docs/RECORDS.md tags 2, 4, 5, 12, 15) it gives
//!   what decoding gives, or the same error; for the others, nothing.
//! - [`scan_image`]: any bytes, cut into one to three segment files of a store, either scan
//!   to an error or to an end from which a writer continues the journal: the records read
//!   come in LSN order from 1, and scanning again after one more record is written returns
//!   the same records and the new one. Never a panic. The first byte chooses the segment
//!   count and whether checksums are fixed up first (so that the fuzzer reaches the scan's
//!   rules past the checksums).

use std::path::Path;
use std::sync::Arc;

use lanefs::{Record, RecordSummary};

use crate::disk::{Disk, SimDisk};
use crate::journal::{
    BATCH_HEADER, BATCH_MAGIC, BatchHeader, SEGMENT_HEADER, SEGMENT_MAGIC, VERSION, Writer,
    batch_at, dir, scan, segment_at, segment_path,
};

/// The store id of the images.
pub const UUID: [u8; 16] = *b"lanefs-fuzz-uuid";

/// Decodes `data` as a record (see the module doc).
pub fn decode_record(data: &[u8]) {
    let decoded = Record::decode(data);
    if let Ok(r) = &decoded {
        let again = r.to_bytes();
        assert_eq!(Record::decode(&again).as_ref(), Ok(r), "{r:?}");
    }
    let summary = RecordSummary::decode(data);
    if matches!(data.first(), Some(2 | 4 | 5 | 12 | 15)) {
        assert_eq!(
            summary,
            decoded.map(|r| RecordSummary::of(&r)),
            "{data:02x?}"
        );
    } else {
        assert_eq!(summary, Ok(RecordSummary::Other), "{data:02x?}");
    }
}

/// Fixes the checksums of the segment header and of each batch header found where the
/// previous batch ends, and sets their store id, segment and version fields.
fn fix_up(seg: &mut [u8], seq: u64) {
    use crate::layout::{put, u32_at, u64_at};
    if seg.len() < SEGMENT_HEADER || seg[segment_at::MAGIC..segment_at::VERSION] != SEGMENT_MAGIC {
        return;
    }
    put(seg, segment_at::VERSION, &VERSION.to_le_bytes());
    put(seg, segment_at::STORE_ID, &UUID);
    put(seg, segment_at::SEQ, &seq.to_le_bytes());
    let crc = crc32c::crc32c(&seg[..segment_at::CRC]);
    put(seg, segment_at::CRC, &crc.to_le_bytes());
    let mut at = SEGMENT_HEADER;
    while at + BATCH_HEADER <= seg.len() && seg[at..at + batch_at::VERSION] == BATCH_MAGIC {
        let len = u32_at(seg, at + batch_at::LEN);
        let len = (len as usize).min(seg.len() - at - BATCH_HEADER);
        let payload = crc32c::crc32c(&seg[at + BATCH_HEADER..at + BATCH_HEADER + len]);
        let h = BatchHeader {
            segment: seq,
            first_lsn: u64_at(seg, at + batch_at::FIRST_LSN),
            count: u32_at(seg, at + batch_at::COUNT),
            len: len as u32,
            crc: payload,
            flushed: u64_at(seg, at + batch_at::FLUSHED),
        };
        seg[at..at + BATCH_HEADER].copy_from_slice(&h.encode(&UUID));
        at += BATCH_HEADER + len;
    }
}

/// The disk `data` describes (see the module doc).
pub fn image(data: &[u8]) -> SimDisk {
    let d = SimDisk::new();
    let store = Path::new("/s");
    d.create_dir_all(&dir(store)).expect("a directory");
    let Some((&flags, rest)) = data.split_first() else {
        return d;
    };
    let n = 1 + (flags >> 1) as usize % 3;
    let piece = rest.len().div_ceil(n).max(1);
    for (k, chunk) in rest.chunks(piece).enumerate() {
        let seq = k as u64 + 1;
        let mut seg = chunk.to_vec();
        if flags & 1 != 0 {
            fix_up(&mut seg, seq);
        }
        d.put(&segment_path(store, seq), seg);
    }
    d
}

/// Scans the image `data` describes, and continues the journal it holds (see the module
/// doc).
pub fn scan_image(data: &[u8]) {
    let d = image(data);
    let store = Path::new("/s");
    let read = |d: &SimDisk| {
        let mut got: Vec<Vec<u8>> = Vec::new();
        let end = scan(d, store, UUID, 1, |lsn, bytes| {
            assert_eq!(
                lsn,
                got.len() as u64 + 1,
                "records come in LSN order from 1"
            );
            Record::decode(bytes).map_err(|e| e.to_string())?;
            got.push(bytes.to_vec());
            Ok(())
        });
        end.map(|e| (got, e))
    };
    let Ok((before, end)) = read(&d) else {
        return;
    };
    assert_eq!(end.next_lsn, before.len() as u64 + 1);
    let mut w = match Writer::new(Arc::new(d.clone()), store, UUID, 1 << 16, end) {
        Ok(w) => w,
        Err(e) => panic!("a journal that scans must take a writer: {e}"),
    };
    let rec = Record::Free {
        inode: lanefs::InodeId::ROOT,
    }
    .to_bytes();
    w.write(&[&rec]).expect("a write");
    w.flush().expect("a flush");
    drop(w);
    match read(&d) {
        Ok((after, end2)) => {
            assert_eq!(after.len(), before.len() + 1, "end {end:?}, then {end2:?}");
            assert_eq!(after[..before.len()], before[..]);
            assert_eq!(after[before.len()], rec);
        }
        Err(e) => panic!("the continued journal does not scan: {e} (end was {end:?})"),
    }
    let _ = d.list(&dir(store));
}

/// Seed inputs for [`scan_image`]: real journals, as the writer leaves them.
pub fn seeds() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (n, size, flushes) in [(3usize, 40usize, true), (30, 200, false), (60, 90, true)] {
        let d = SimDisk::new();
        let store = Path::new("/s");
        d.create_dir_all(&dir(store)).expect("a directory");
        let end = scan(&d, store, UUID, 1, |_, _| Ok(())).expect("an empty journal");
        let mut w = Writer::new(Arc::new(d.clone()), store, UUID, 4096, end).expect("a writer");
        for k in 0..n {
            let rec = Record::Write {
                inode: lanefs::InodeId::ROOT,
                offset: k as u64,
                time: lanefs::Timespec::new(k as i64, 0),
                data: &vec![k as u8; size],
            }
            .to_bytes();
            w.write(&[&rec]).expect("a write");
            if flushes && k % 4 == 3 {
                w.flush().expect("a flush");
            }
        }
        drop(w);
        // The first used segment (or two), trimmed of trailing zeros.
        let files = d.files();
        let segs: Vec<&Vec<u8>> = files
            .iter()
            .filter(|(p, _)| p.extension().is_some_and(|e| e == "seg"))
            .map(|(_, b)| b)
            .take(2)
            .collect();
        let trim = |b: &Vec<u8>| {
            let end = b.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1);
            b[..end].to_vec()
        };
        if segs.len() == 1 || trim(segs[1]).is_empty() {
            let mut v = vec![0u8];
            v.extend(trim(segs[0]));
            out.push(v);
        } else {
            // Two pieces of equal length (zero padded), so that `image` cuts them apart.
            let (a, b) = (trim(segs[0]), trim(segs[1]));
            let len = a.len().max(b.len());
            let mut v = vec![2u8];
            for mut s in [a, b] {
                s.resize(len, 0);
                v.extend(s);
            }
            out.push(v);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rng(seed: u64) -> impl FnMut() -> u64 {
        let mut s = seed;
        move || {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
    }

    #[test]
    fn the_seeds_scan_whole() {
        for s in seeds() {
            let d = image(&s);
            let mut n = 0;
            scan(&d, Path::new("/s"), UUID, 1, |_, _| {
                n += 1;
                Ok(())
            })
            .unwrap();
            assert!(n >= 3, "{n} records in a seed");
            scan_image(&s);
        }
    }

    /// The harnesses on random mutations of the seeds (a few thousand runs; the fuzzer runs
    /// the same functions for as long as it is given).
    #[test]
    fn the_harnesses_hold_on_mutated_seeds() {
        let seed = std::env::var("LANEFS_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| std::time::UNIX_EPOCH.elapsed().unwrap().as_nanos() as u64);
        eprintln!("fuzz harness seed {seed} (LANEFS_SEED={seed} replays)");
        let mut next = rng(seed);
        let seeds = seeds();
        for _ in 0..1500 {
            let mut s = seeds[next() as usize % seeds.len()].clone();
            for _ in 0..1 + next() % 4 {
                let at = next() as usize % s.len();
                match next() % 4 {
                    0 => s[at] ^= 1 << (next() % 8),
                    1 => s[at] = next() as u8,
                    2 => s.truncate(at.max(1)),
                    _ => s[0] = next() as u8,
                }
            }
            scan_image(&s);
            decode_record(&s[1..]);
            let from = next() as usize % s.len();
            decode_record(&s[from..]);
        }
    }

    /// Writes [`seeds`] as files into the directory `LANEFS_FUZZ_SEEDS` names (a fuzz
    /// corpus; docs/TESTING.md).
    #[test]
    #[ignore = "writes files; run by hand to seed the fuzz corpus"]
    fn write_seeds() {
        let dir = std::env::var("LANEFS_FUZZ_SEEDS").expect("LANEFS_FUZZ_SEEDS=<dir>");
        std::fs::create_dir_all(&dir).unwrap();
        for (k, s) in seeds().iter().enumerate() {
            std::fs::write(Path::new(&dir).join(format!("seed{k}")), s).unwrap();
        }
    }

    /// Inputs the fuzzer found failing, kept in `fuzz/regressions/` (named by target).
    #[test]
    fn the_fuzzers_past_findings_hold() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/regressions");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let data = std::fs::read(&p).unwrap();
            match name.split('-').next() {
                Some("journal_scan") => scan_image(&data),
                Some("record_decode") => decode_record(&data),
                _ => panic!("{name}: which target?"),
            }
            n += 1;
        }
        assert!(n > 0);
    }
}
