//! The journal's bytes (docs/STORE.md, "Segments" and "Batches"): a segment's header, a
//! batch's header, and a batch's payload of length-prefixed records.

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
        let mut b = [0u8; SEGMENT_HEADER];
        b[0..8].copy_from_slice(&SEGMENT_MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(SEGMENT_HEADER as u32).to_le_bytes());
        b[16..32].copy_from_slice(&self.uuid);
        b[32..40].copy_from_slice(&self.seq.to_le_bytes());
        b[40..48].copy_from_slice(&self.first_lsn.to_le_bytes());
        let crc = crc32c::crc32c(&b[..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
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
        if b[0..8] != SEGMENT_MAGIC {
            return Err("not a journal segment (bad magic)");
        }
        if crc32c::crc32c(&b[..60]) != u32_at(b, 60) {
            return Err("segment header checksum mismatch");
        }
        if u32_at(b, 8) != VERSION {
            return Err("unknown journal format version");
        }
        Ok(Some(SegmentHeader {
            uuid: b[16..32].try_into().expect("16 bytes"),
            seq: u64_at(b, 32),
            first_lsn: u64_at(b, 40),
        }))
    }
}

pub(super) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
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
        let mut b = [0u8; BATCH_HEADER];
        b[0..4].copy_from_slice(&BATCH_MAGIC);
        b[4..8].copy_from_slice(&1u32.to_le_bytes());
        b[8..16].copy_from_slice(&self.segment.to_le_bytes());
        b[16..24].copy_from_slice(&self.first_lsn.to_le_bytes());
        b[24..28].copy_from_slice(&self.count.to_le_bytes());
        b[28..32].copy_from_slice(&self.len.to_le_bytes());
        b[32..36].copy_from_slice(&self.crc.to_le_bytes());
        b[36..44].copy_from_slice(&self.flushed.to_le_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c(uuid), &b[..44]);
        b[44..48].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// `None` unless the bytes are a batch header of store `uuid` whose checksum holds.
    pub(crate) fn decode(b: &[u8], uuid: &[u8; 16]) -> Option<BatchHeader> {
        if b.len() < BATCH_HEADER || b[0..4] != BATCH_MAGIC || u32_at(b, 4) != 1 {
            return None;
        }
        if crc32c::crc32c_append(crc32c::crc32c(uuid), &b[..44]) != u32_at(b, 44) {
            return None;
        }
        Some(BatchHeader {
            segment: u64_at(b, 8),
            first_lsn: u64_at(b, 16),
            count: u32_at(b, 24),
            len: u32_at(b, 28),
            crc: u32_at(b, 32),
            flushed: u64_at(b, 36),
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
    // At most one record per 4 bytes, however large a count a header claims.
    let mut out = Vec::with_capacity((count as usize).min(payload.len() / 4));
    let mut at = 0usize;
    while at < payload.len() {
        let len = u32_at(payload.get(at..at + 4)?, 0) as usize;
        at += 4;
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
