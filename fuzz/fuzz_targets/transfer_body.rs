//! libFuzzer target: the properties of `fuzz_props::transfer_body`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_props::transfer_body::check(data));
