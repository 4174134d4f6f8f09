//! libFuzzer target: the properties of `fuzz_props::amount`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_props::amount::check(data));
