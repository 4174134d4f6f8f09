//! libFuzzer target: the properties of `fuzz_props::wal_segment`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_props::wal_segment::check(data));
