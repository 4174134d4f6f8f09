//! libFuzzer target: the properties of `fuzz_props::snapshot`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_props::snapshot::check(data));
