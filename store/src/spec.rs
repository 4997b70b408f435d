//! Keeps docs/STORE.md and the code in step: the document's hex examples are parsed and
//! checked against the encoders and decoders, its field tables against the bytes the
//! encoders write, and the constants it quotes against the code's.

use std::path::Path;
use std::sync::Arc;

use lanefs::{Generation, Ino, InodeId, Record};

use crate::disk::{BLOCK, Disk, SimDisk};
use crate::identity::{
    IDENTITY, IDENTITY_LEN, IDENTITY_MAGIC, decode_identity, encode_identity, identity_at,
};
use crate::journal::{
    BATCH_HEADER, BATCH_MAGIC, BATCH_VERSION, BatchHeader, SEGMENT_HEADER, SEGMENT_MAGIC,
    SegmentHeader, VERSION, batch_at, encode_segment, records, scan, segment_at, segment_path,
};
use crate::{FORMAT_VERSION, LOCK};

const DOC: &str = include_str!("../../docs/STORE.md");

/// The store id of the examples: 00 01 .. 0f.
fn example_uuid() -> [u8; 16] {
    std::array::from_fn(|i| i as u8)
}

/// The text of the section under `heading` (a line starting with `#`s and this title).
fn section(heading: &str) -> &'static str {
    let start = DOC
        .lines()
        .position(|l| l.trim_start_matches('#').trim() == heading && l.starts_with('#'))
        .unwrap_or_else(|| panic!("no heading {heading:?} in STORE.md"));
    let rest: Vec<&str> = DOC.lines().skip(start + 1).collect();
    let end = rest
        .iter()
        .position(|l| l.starts_with('#'))
        .unwrap_or(rest.len());
    let first = rest[0];
    let last = rest[end - 1];
    let from = first.as_ptr() as usize - DOC.as_ptr() as usize;
    let to = last.as_ptr() as usize - DOC.as_ptr() as usize + last.len();
    &DOC[from..to]
}

/// The bytes of the first ```text block in `text`: on each line, the hex bytes before the
/// first run of two spaces (what follows is commentary).
fn hex_block(text: &str) -> Vec<u8> {
    let block = text
        .split("```text\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("a text block");
    block
        .lines()
        .flat_map(|l| {
            let bytes = l.split("  ").next().unwrap_or("");
            bytes
                .split_whitespace()
                .map(|w| u8::from_str_radix(w, 16).unwrap_or_else(|_| panic!("{w:?} in {l:?}")))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The rows `| offset | size | field |` of the first such table in `text`.
fn table(text: &str) -> Vec<(usize, usize, &str)> {
    text.lines()
        .filter_map(|l| {
            let mut cells = l.split('|').map(str::trim).skip(1);
            let off = cells.next()?.parse().ok()?;
            let size = cells.next()?.parse().ok()?;
            Some((off, size, cells.next()?))
        })
        .collect()
}

/// The rows cover `0..len` in order, without gap or overlap.
fn check_tiles(rows: &[(usize, usize, &str)], len: usize) {
    let mut at = 0;
    for &(off, size, field) in rows {
        assert_eq!(off, at, "{field}: offset");
        at += size;
    }
    assert_eq!(at, len, "the table's length");
}

/// The row whose field text starts with `name`.
fn field<'a>(rows: &[(usize, usize, &'a str)], name: &str) -> (usize, usize, &'a str) {
    *rows
        .iter()
        .find(|r| r.2.starts_with(name))
        .unwrap_or_else(|| panic!("no field {name:?}"))
}

/// The rows named `fields` start at the offsets the code names for them (`layout.rs`).
fn offsets_match(rows: &[(usize, usize, &str)], fields: &[(&str, usize)]) {
    for &(name, at) in fields {
        assert_eq!(field(rows, name).0, at, "{name}: the code's offset");
    }
}

/// The bytes between the first pair of backquotes-and-parentheses, "(`4c 41 ..`)", in `s`.
fn quoted_hex(s: &str) -> Vec<u8> {
    let inner = s.split("(`").nth(1).and_then(|s| s.split("`)").next());
    inner
        .expect("quoted bytes")
        .split_whitespace()
        .map(|w| u8::from_str_radix(w, 16).unwrap())
        .collect()
}

fn le(b: &[u8]) -> u64 {
    let mut v = [0u8; 8];
    v[..b.len()].copy_from_slice(b);
    u64::from_le_bytes(v)
}

fn free_record() -> Vec<u8> {
    Record::Free {
        inode: InodeId {
            ino: Ino(1025),
            generation: Generation(7),
        },
    }
    .to_bytes()
}

#[test]
fn the_identity_example_and_table_match_the_code() {
    let s = section("The identity file `lanefs.store`");
    let bytes = hex_block(s);
    let uuid = example_uuid();
    assert_eq!(bytes.len(), IDENTITY_LEN);
    assert_eq!(bytes[..], encode_identity(&uuid)[..]);
    let p = Path::new("/s/lanefs.store");
    assert_eq!(decode_identity(&bytes, p).unwrap(), uuid);
    let rows = table(s);
    check_tiles(&rows, IDENTITY_LEN);
    offsets_match(
        &rows,
        &[
            ("magic", identity_at::MAGIC),
            ("store format version", identity_at::VERSION),
            ("length of this structure", identity_at::LEN),
            ("store id", identity_at::STORE_ID),
            ("reserved", identity_at::RESERVED),
            ("CRC of bytes 0..", identity_at::CRC),
        ],
    );
    let (off, size, magic) = field(&rows, "magic");
    assert_eq!(quoted_hex(magic), IDENTITY_MAGIC);
    assert_eq!(bytes[off..off + size], IDENTITY_MAGIC);
    let (off, size, v) = field(&rows, "store format version: ");
    assert_eq!(v.rsplit(' ').next().unwrap(), FORMAT_VERSION.to_string());
    assert_eq!(le(&bytes[off..off + size]), FORMAT_VERSION as u64);
    let (off, size, l) = field(&rows, "length of this structure: ");
    assert_eq!(l.rsplit(' ').next().unwrap(), IDENTITY_LEN.to_string());
    assert_eq!(le(&bytes[off..off + size]), IDENTITY_LEN as u64);
    let (off, size, _) = field(&rows, "store id");
    assert_eq!(bytes[off..off + size], uuid);
    let (off, size, _) = field(&rows, "reserved");
    assert!(bytes[off..off + size].iter().all(|&b| b == 0));
    let (off, size, crc) = field(&rows, "CRC of bytes 0..");
    assert!(crc.starts_with(&format!("CRC of bytes 0..{off} ")), "{crc}");
    assert_eq!(
        le(&bytes[off..off + size]),
        crc32c::crc32c(&bytes[..off]) as u64
    );
    // The reading rules: the offsets the document gives are the ones reported.
    let mut bad = bytes.clone();
    bad[20] ^= 1;
    assert!(s.contains("CRC mismatch: damaged at byte 60"));
    assert!(matches!(
        decode_identity(&bad, p),
        Err(crate::StoreError::Damaged { offset: 60, .. })
    ));
    let mut newer = bytes.clone();
    newer[8] = FORMAT_VERSION as u8 + 1;
    let crc = crc32c::crc32c(&newer[..60]);
    newer[60..].copy_from_slice(&crc.to_le_bytes());
    assert!(s.contains(&format!("other than {FORMAT_VERSION}: damaged at byte 8")));
    assert!(matches!(
        decode_identity(&newer, p),
        Err(crate::StoreError::Damaged { offset: 8, .. })
    ));
    assert!(matches!(
        decode_identity(&bytes[..63], p),
        Err(crate::StoreError::NotAStore { .. })
    ));
}

#[test]
fn the_segment_example_and_tables_match_the_code() {
    let bytes = hex_block(section("Batches"));
    let uuid = example_uuid();
    let rec = free_record();
    // The whole example is what the encoder writes for one record in a new segment.
    assert_eq!(bytes, encode_segment(uuid, 1, 1, &[&rec]));
    assert!(section("Batches").contains("The next batch would start at byte 120"));
    assert_eq!(bytes.len(), 120);
    // Segment header.
    let seg = SegmentHeader::decode(&bytes).unwrap().unwrap();
    assert_eq!(
        seg,
        SegmentHeader {
            uuid,
            seq: 1,
            first_lsn: 1
        }
    );
    let rows = table(section("Segments"));
    check_tiles(&rows, SEGMENT_HEADER);
    offsets_match(
        &rows,
        &[
            ("magic", segment_at::MAGIC),
            ("journal format version", segment_at::VERSION),
            ("length of this header", segment_at::HEADER_LEN),
            ("store id", segment_at::STORE_ID),
            ("sequence number", segment_at::SEQ),
            ("LSN of the segment's first record", segment_at::FIRST_LSN),
            ("reserved", segment_at::RESERVED),
            ("CRC of bytes 0..", segment_at::CRC),
        ],
    );
    let (off, size, magic) = field(&rows, "magic");
    assert_eq!(quoted_hex(magic), SEGMENT_MAGIC);
    assert_eq!(bytes[off..off + size], SEGMENT_MAGIC);
    let (off, size, v) = field(&rows, "journal format version: ");
    assert_eq!(v.rsplit(' ').next().unwrap(), VERSION.to_string());
    assert_eq!(le(&bytes[off..off + size]), VERSION as u64);
    let (off, size, _) = field(&rows, "length of this header: 64");
    assert_eq!(le(&bytes[off..off + size]), SEGMENT_HEADER as u64);
    // Fields by their documented places, in a header with distinct values.
    let h = SegmentHeader {
        uuid: [0xa5; 16],
        seq: 0x0102_0304_0506_0708,
        first_lsn: 0x1112_1314_1516_1718,
    };
    let e = h.encode();
    let (off, size, _) = field(&rows, "store id");
    assert_eq!(e[off..off + size], h.uuid);
    let (off, size, _) = field(&rows, "sequence number");
    assert_eq!(le(&e[off..off + size]), h.seq);
    let (off, size, _) = field(&rows, "LSN of the segment's first record");
    assert_eq!(le(&e[off..off + size]), h.first_lsn);
    let (off, size, _) = field(&rows, "reserved");
    assert!(e[off..off + size].iter().all(|&b| b == 0));
    let (off, size, crc) = field(&rows, "CRC of bytes 0..");
    assert!(crc.starts_with(&format!("CRC of bytes 0..{off} (not seeded)")));
    assert_eq!(le(&e[off..off + size]), crc32c::crc32c(&e[..off]) as u64);
    // Batch header.
    let b = &bytes[SEGMENT_HEADER..];
    let bh = BatchHeader::decode(b, &uuid).unwrap();
    assert_eq!(
        bh,
        BatchHeader {
            segment: 1,
            first_lsn: 1,
            count: 1,
            len: (4 + rec.len()) as u32,
            crc: crc32c::crc32c(&b[BATCH_HEADER..]),
            flushed: 1,
        }
    );
    // Seeded with the store id: another store's id does not read it.
    assert_eq!(BatchHeader::decode(b, &[0; 16]), None);
    let rows = table(section("Batches"));
    check_tiles(&rows, BATCH_HEADER);
    offsets_match(
        &rows,
        &[
            ("magic", batch_at::MAGIC),
            ("batch format version", batch_at::VERSION),
            ("the sequence number of the segment", batch_at::SEGMENT),
            ("LSN of its first record", batch_at::FIRST_LSN),
            ("`count`", batch_at::COUNT),
            ("`len`", batch_at::LEN),
            ("CRC of the payload", batch_at::PAYLOAD_CRC),
            ("`flushed`", batch_at::FLUSHED),
            ("CRC of bytes 0..", batch_at::CRC),
        ],
    );
    let (off, size, magic) = field(&rows, "magic");
    assert_eq!(quoted_hex(magic), BATCH_MAGIC);
    assert_eq!(b[off..off + size], BATCH_MAGIC);
    let (off, size, v) = field(&rows, "batch format version: ");
    assert_eq!(v.rsplit(' ').next().unwrap(), BATCH_VERSION.to_string());
    assert_eq!(le(&b[off..off + size]), BATCH_VERSION as u64);
    let h = BatchHeader {
        segment: 0x0102_0304_0506_0708,
        first_lsn: 0x1112_1314_1516_1718,
        count: 0x2122_2324,
        len: 0x3132_3334,
        crc: 0x4142_4344,
        flushed: 0x5152_5354_5556_5758,
    };
    let e = h.encode(&uuid);
    for (name, want) in [
        ("the sequence number of the segment", h.segment),
        ("LSN of its first record", h.first_lsn),
        ("`count`", h.count as u64),
        ("`len`", h.len as u64),
        ("CRC of the payload", h.crc as u64),
        ("`flushed`", h.flushed),
    ] {
        let (off, size, _) = field(&rows, name);
        assert_eq!(le(&e[off..off + size]), want, "{name}");
    }
    let (off, size, crc) = field(&rows, "CRC of bytes 0..");
    assert!(crc.starts_with(&format!(
        "CRC of bytes 0..{off} **seeded with the store id**"
    )));
    let mut seeded = uuid.to_vec();
    seeded.extend_from_slice(&e[..off]);
    assert_eq!(le(&e[off..off + size]), crc32c::crc32c(&seeded) as u64);
    // The payload: [u32 length][record].
    let payload = &b[BATCH_HEADER..];
    assert_eq!(records(payload, 1), Some(vec![&rec[..]]));
    assert_eq!(
        Record::decode(&rec).unwrap(),
        Record::decode(&payload[4..]).unwrap()
    );
}

/// The example segment, put on a disk as a store's segment 1, scans back as the document
/// says: one record, LSN 1, and the journal's end at byte 120.
#[test]
fn the_segment_example_scans_as_documented() {
    let bytes = hex_block(section("Batches"));
    let d = SimDisk::new();
    let store = Path::new("/s");
    d.create_dir_all(&crate::journal::dir(store)).unwrap();
    let mut file = bytes.clone();
    file.resize(8192, 0);
    d.put(&segment_path(store, 1), file);
    let mut got = Vec::new();
    let end = scan(&d, store, example_uuid(), 1, |lsn, r| {
        got.push((lsn, r.to_vec()));
        Ok(())
    })
    .unwrap();
    assert_eq!(got, vec![(1, free_record())]);
    assert_eq!((end.segment, end.offset, end.next_lsn), (1, 120, 2));
    assert!(!end.torn && !end.dirty);
    // And a writer continuing it puts the next batch at byte 120, LSN 2, witnessing 2.
    let mut w =
        crate::journal::Writer::new(Arc::new(d.clone()), store, example_uuid(), 8192, end).unwrap();
    w.write(&[b"x".as_slice()]).unwrap();
    drop(w);
    let (_, after) = d
        .files()
        .into_iter()
        .find(|(p, _)| *p == segment_path(store, 1))
        .unwrap();
    let h = BatchHeader::decode(&after[120..], &example_uuid()).unwrap();
    assert_eq!((h.segment, h.first_lsn, h.count, h.flushed), (1, 2, 1, 2));
}

#[test]
fn the_names_and_constants_quoted_match_the_code() {
    let dir = section("The store directory");
    assert!(dir.contains(&format!("{IDENTITY}            the identity file")));
    assert!(dir.contains(&format!("{LOCK}             the lock file")));
    let seg = segment_path(Path::new("<store>"), 1);
    let name = seg.strip_prefix("<store>").unwrap().to_str().unwrap();
    assert!(dir.contains(&format!("  {}", name.replace("journal/", ""))));
    assert!(dir.contains("  journal/"));
    assert!(DOC.contains(&format!("`BLOCK` = {BLOCK}")));
    assert!(
        section("The identity file `lanefs.store`").contains(&format!("{IDENTITY_LEN} bytes:"))
    );
    assert!(section("Segments").contains(&format!("starts with a {SEGMENT_HEADER}-byte header")));
    assert!(section("Batches").contains(&format!("A batch is a {BATCH_HEADER}-byte header")));
    assert!(DOC.contains("64 MiB by default"));
    assert_eq!(crate::Options::default().segment_size, 64 << 20);
    assert!(DOC.contains("interval (100 ms by default)"));
    assert!(DOC.contains("(`Options::flush_interval`, 5 s by default"));
    assert_eq!(
        crate::Options::default().flush_interval,
        std::time::Duration::from_secs(5)
    );
    assert_eq!(
        crate::Options::default().commit_interval,
        std::time::Duration::from_millis(100)
    );
    let ck = section("Checkpoints");
    assert!(ck.contains("1 s after the first\n  failure of a run, twice as long after each further one, at most a minute"));
    let o = crate::Options::default();
    assert_eq!(o.checkpoint_retry, std::time::Duration::from_secs(1));
    assert_eq!(o.checkpoint_retry_max, std::time::Duration::from_secs(60));
    assert!(DOC.contains("(every `Options::checkpoint_poll`, 500 ms)"));
    assert_eq!(o.checkpoint_poll, std::time::Duration::from_millis(500));
    let compaction = section("Compaction");
    assert!(compaction.contains(&format!(
        "more than {} MiB and more than\n  the pages in use (`checkpoint::COMPACT_SLACK`)",
        crate::checkpoint::COMPACT_SLACK >> 20
    )));
}
