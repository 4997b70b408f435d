//! The journal scan, and a writer continuing what it accepts, on any segment images
//! (`lanefs_store::fuzzing::scan_image`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    lanefs_store::fuzzing::scan_image(data);
});
