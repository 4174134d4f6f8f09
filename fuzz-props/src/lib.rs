//! The properties the fuzz targets assert, one module a target, shared by the libFuzzer
//! targets in `fuzz/` and by `tests/replay.rs`, which runs them over the kept corpora and
//! crashes as ordinary tests on the stable toolchain. Each `check` takes the fuzzer's bytes and
//! panics when a property fails; refusing an input is never a failure.

pub mod amount;
mod assets;
pub mod graphql;
pub mod jwt;
pub mod protocol_line;
pub mod snapshot;
pub mod transfer_body;
pub mod wal_segment;

/// Every target's name, as `fuzz/fuzz_targets/<name>.rs` and `fuzz/corpus/<name>/` spell it.
pub const TARGETS: [&str; 7] = [
    "amount",
    "transfer_body",
    "jwt",
    "graphql",
    "protocol_line",
    "wal_segment",
    "snapshot",
];

/// Runs target `name`'s check on `data`; `false` for an unknown name.
pub fn run(name: &str, data: &[u8]) -> bool {
    let check: fn(&[u8]) = match name {
        "amount" => amount::check,
        "transfer_body" => transfer_body::check,
        "jwt" => jwt::check,
        "graphql" => graphql::check,
        "protocol_line" => protocol_line::check,
        "wal_segment" => wal_segment::check,
        "snapshot" => snapshot::check,
        _ => return false,
    };
    check(data);
    true
}
