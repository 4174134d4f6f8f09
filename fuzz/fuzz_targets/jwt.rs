//! libFuzzer target: the properties of `fuzz_props::jwt`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_props::jwt::check(data));
