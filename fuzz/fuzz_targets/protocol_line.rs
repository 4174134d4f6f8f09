//! libFuzzer target: the properties of `fuzz_props::protocol_line`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_props::protocol_line::check(data));
