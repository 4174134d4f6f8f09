//! libFuzzer target: the properties of `fuzz_props::graphql`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_props::graphql::check(data));
