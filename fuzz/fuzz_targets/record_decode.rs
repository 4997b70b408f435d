//! The record decoder on any bytes (`lanefs_store::fuzzing::decode_record`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    lanefs_store::fuzzing::decode_record(data);
});
