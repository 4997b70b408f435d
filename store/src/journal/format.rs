//! The journal's bytes (docs/STORE.md, "Segments" and "Batches"): a segment's header, a
//! batch's header, and a batch's payload of length-prefixed records.

use super::blocks::Blocks;
use crate::layout::{U32, put, store_id_at, u32_at, u64_at};

/// Magic bytes of a segment header.
pub(crate) const SEGMENT_MAGIC: [u8; 8] = *b"LFSJRNL\x01";
/// Magic bytes of a batch header.
pub(crate) const BATCH_MAGIC: [u8; 4] = *b"LFB1";
/// Size of a segment header.
pub(crate) const SEGMENT_HEADER: usize = 64;
/// Size of a batch header.
pub(crate) const BATCH_HEADER: usize = 48;
/// The journal format version.
pub(crate) const VERSION: u32 = 1;
/// The batch format version.
pub(crate) const BATCH_VERSION: u32 = 1;
/// Bytes of the length before each record of a payload.
pub(crate) const RECORD_LEN: usize = U32;

/// Where a segment header's fields are (docs/STORE.md, "Segments"; `layout.rs`).
pub(crate) mod segment_at {
    use crate::layout::{STORE_ID as ID, U32, U64};

    pub(crate) const MAGIC: usize = 0;
    pub(crate) const VERSION: usize = MAGIC + super::SEGMENT_MAGIC.len();
    pub(crate) const HEADER_LEN: usize = VERSION + U32;
    pub(crate) const STORE_ID: usize = HEADER_LEN + U32;
    pub(crate) const SEQ: usize = STORE_ID + ID;
    pub(crate) const FIRST_LSN: usize = SEQ + U64;
    /// Written as zeros.
    pub(crate) const RESERVED: usize = FIRST_LSN + U64;
    /// The CRC of the bytes before it.
    pub(crate) const CRC: usize = RESERVED + 12;
    const _: () = assert!(CRC + U32 == super::SEGMENT_HEADER);
}

/// Where a batch header's fields are (docs/STORE.md, "Batches"; `layout.rs`).
pub(crate) mod batch_at {
    use crate::layout::{U32, U64};

    pub(crate) const MAGIC: usize = 0;
    pub(crate) const VERSION: usize = MAGIC + super::BATCH_MAGIC.len();
    pub(crate) const SEGMENT: usize = VERSION + U32;
    pub(crate) const FIRST_LSN: usize = SEGMENT + U64;
    pub(crate) const COUNT: usize = FIRST_LSN + U64;
    pub(crate) const LEN: usize = COUNT + U32;
    pub(crate) const PAYLOAD_CRC: usize = LEN + U32;
    pub(crate) const FLUSHED: usize = PAYLOAD_CRC + U32;
    /// The CRC of the bytes before it, seeded with the store id.
    pub(crate) const CRC: usize = FLUSHED + U64;
    const _: () = assert!(CRC + U32 == super::BATCH_HEADER);
}

/// A segment's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegmentHeader {
    pub uuid: [u8; 16],
    pub seq: u64,
    /// LSN of its first record; 0 in a spare header (a recycled segment not yet started).
    pub first_lsn: u64,
}

/// Whether `b` (the first bytes of segment `seq`) says the segment holds no record: zeros,
/// or a spare header of this store and number.
pub(super) fn unused_header(b: &[u8], uuid: &[u8; 16], seq: u64) -> bool {
    match SegmentHeader::decode(b) {
        Ok(None) => true,
        Ok(Some(h)) => h.first_lsn == 0 && h.uuid == *uuid && h.seq == seq,
        Err(_) => false,
    }
}

impl SegmentHeader {
    pub(crate) fn encode(&self) -> [u8; SEGMENT_HEADER] {
        use segment_at as at;
        let mut b = [0u8; SEGMENT_HEADER];
        put(&mut b, at::MAGIC, &SEGMENT_MAGIC);
        put(&mut b, at::VERSION, &VERSION.to_le_bytes());
        put(
            &mut b,
            at::HEADER_LEN,
            &(SEGMENT_HEADER as u32).to_le_bytes(),
        );
        put(&mut b, at::STORE_ID, &self.uuid);
        put(&mut b, at::SEQ, &self.seq.to_le_bytes());
        put(&mut b, at::FIRST_LSN, &self.first_lsn.to_le_bytes());
        let crc = crc32c::crc32c(&b[..at::CRC]);
        put(&mut b, at::CRC, &crc.to_le_bytes());
        b
    }

    /// `Ok(None)`: all zeros (a segment made but never used).
    pub(crate) fn decode(b: &[u8]) -> Result<Option<SegmentHeader>, &'static str> {
        if b.len() < SEGMENT_HEADER {
            return match b.iter().all(|&x| x == 0) {
                true => Ok(None),
                false => Err("segment header cut short"),
            };
        }
        let b = &b[..SEGMENT_HEADER];
        if b.iter().all(|&x| x == 0) {
            return Ok(None);
        }
        use segment_at as at;
        if b[at::MAGIC..at::VERSION] != SEGMENT_MAGIC {
            return Err("not a journal segment (bad magic)");
        }
        if crc32c::crc32c(&b[..at::CRC]) != u32_at(b, at::CRC) {
            return Err("segment header checksum mismatch");
        }
        if u32_at(b, at::VERSION) != VERSION {
            return Err("unknown journal format version");
        }
        Ok(Some(SegmentHeader {
            uuid: store_id_at(b, at::STORE_ID),
            seq: u64_at(b, at::SEQ),
            first_lsn: u64_at(b, at::FIRST_LSN),
        }))
    }
}

/// A batch's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BatchHeader {
    pub segment: u64,
    pub first_lsn: u64,
    pub count: u32,
    pub len: u32,
    pub crc: u32,
    /// Every record with a lower LSN had been flushed when this batch was written.
    pub flushed: u64,
}

impl BatchHeader {
    /// Its bytes. The header's checksum is seeded with the store's id, so bytes stored
    /// inside a record (a file's data) cannot pass for a batch header of this store.
    pub(crate) fn encode(&self, uuid: &[u8; 16]) -> [u8; BATCH_HEADER] {
        use batch_at as at;
        let mut b = [0u8; BATCH_HEADER];
        put(&mut b, at::MAGIC, &BATCH_MAGIC);
        put(&mut b, at::VERSION, &BATCH_VERSION.to_le_bytes());
        put(&mut b, at::SEGMENT, &self.segment.to_le_bytes());
        put(&mut b, at::FIRST_LSN, &self.first_lsn.to_le_bytes());
        put(&mut b, at::COUNT, &self.count.to_le_bytes());
        put(&mut b, at::LEN, &self.len.to_le_bytes());
        put(&mut b, at::PAYLOAD_CRC, &self.crc.to_le_bytes());
        put(&mut b, at::FLUSHED, &self.flushed.to_le_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c(uuid), &b[..at::CRC]);
        put(&mut b, at::CRC, &crc.to_le_bytes());
        b
    }

    /// `None` unless the bytes are a batch header of store `uuid` whose checksum holds.
    pub(crate) fn decode(b: &[u8], uuid: &[u8; 16]) -> Option<BatchHeader> {
        use batch_at as at;
        if b.len() < BATCH_HEADER
            || b[at::MAGIC..at::VERSION] != BATCH_MAGIC
            || u32_at(b, at::VERSION) != BATCH_VERSION
        {
            return None;
        }
        if crc32c::crc32c_append(crc32c::crc32c(uuid), &b[..at::CRC]) != u32_at(b, at::CRC) {
            return None;
        }
        Some(BatchHeader {
            segment: u64_at(b, at::SEGMENT),
            first_lsn: u64_at(b, at::FIRST_LSN),
            count: u32_at(b, at::COUNT),
            len: u32_at(b, at::LEN),
            crc: u32_at(b, at::PAYLOAD_CRC),
            flushed: u64_at(b, at::FLUSHED),
        })
    }
}

/// Appends one record (length and bytes) to a batch payload.
pub(crate) fn push_record(payload: &mut Vec<u8>, rec: &[u8]) {
    payload.extend_from_slice(&(rec.len() as u32).to_le_bytes());
    payload.extend_from_slice(rec);
}

/// Splits a payload into its records; `None` if it does not hold exactly `count` of them.
pub(crate) fn records(payload: &[u8], count: u32) -> Option<Vec<&[u8]>> {
    // At most one record per length's bytes, however large a count a header claims.
    let mut out = Vec::with_capacity((count as usize).min(payload.len() / RECORD_LEN));
    let mut at = 0usize;
    while at < payload.len() {
        let len = u32_at(payload.get(at..at + RECORD_LEN)?, 0) as usize;
        at += RECORD_LEN;
        out.push(payload.get(at..at + len)?);
        at += len;
    }
    (out.len() == count as usize).then_some(out)
}

/// A whole segment holding `records` (LSNs from `first_lsn`) in one batch (what repair
/// writes).
pub(crate) fn encode_segment(
    uuid: [u8; 16],
    seq: u64,
    first_lsn: u64,
    records: &[&[u8]],
) -> Vec<u8> {
    let mut b = SegmentHeader {
        uuid,
        seq,
        first_lsn,
    }
    .encode()
    .to_vec();
    let mut payload = Vec::new();
    for r in records {
        push_record(&mut payload, r);
    }
    let h = BatchHeader {
        segment: seq,
        first_lsn,
        count: records.len() as u32,
        len: payload.len() as u32,
        crc: crc32c::crc32c(&payload),
        flushed: first_lsn,
    };
    b.extend_from_slice(&h.encode(&uuid));
    b.extend_from_slice(&payload);
    b
}

/// The first block of a spare made from a recycled segment: a spare header (first LSN 0)
/// of number `seq`, then zeros.
pub(super) fn spare_block(uuid: [u8; 16], seq: u64) -> Blocks {
    let mut b = Blocks::default();
    let header = SegmentHeader {
        uuid,
        seq,
        first_lsn: 0,
    }
    .encode();
    b.bytes(1)[..SEGMENT_HEADER].copy_from_slice(&header);
    b
}
