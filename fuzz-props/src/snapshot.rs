//! spot-core's snapshot decoder (`snapshot::decode`, what start-up reads). Properties: a file
//! that decodes has a header whose checksum, length and seq hold for its body, re-encodes to
//! exactly its own bytes (one state, one file: nothing in it was ignored), and holds a state
//! the engine can reach (no negative balance or total); decoding never panics.
//!
//! Input: byte 0 the mode. Bit 0 clear: the rest is the whole file. Bit 0 set: the rest is the
//! body, given a correct header (magic, version, checksum, seq, length) so the fuzzer reaches
//! the body decoder past the checksum; bits 1-2 pick the header's format (0: 1; 1: 2, with a map
//! version; 2 or 3: 3, with the moves of partitions).

use rust_decimal::Decimal;
use spot_core::engine::Engine;
use spot_core::snapshot::{
    self, FORMAT_VERSION, FORMAT_VERSION_MOVES, FORMAT_VERSION_NO_MAP, HEADER_BYTES, MAGIC,
};

use crate::assets::assets;

pub fn check(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let bytes = if mode & 1 == 0 {
        rest.to_vec()
    } else {
        let format = match (mode >> 1) & 3 {
            0 => FORMAT_VERSION_NO_MAP,
            1 => FORMAT_VERSION,
            _ => FORMAT_VERSION_MOVES,
        };
        with_header(rest, format)
    };
    let Ok((engine, pos)) = snapshot::decode(&bytes, assets()) else {
        return;
    };
    let crc = u32::from_le_bytes(bytes[12..16].try_into().expect("4"));
    assert_eq!(crc32fast::hash(&bytes[HEADER_BYTES..]), crc, "checksum");
    assert_eq!(snapshot::header_seq(&bytes), Some(engine.last_seq()));
    assert_eq!(
        snapshot::encode(&engine, pos),
        bytes,
        "a decoded snapshot re-encodes to its own bytes"
    );
    reachable(&engine);
}

/// The header a writer would give `body`.
fn with_header(body: &[u8], format: u32) -> Vec<u8> {
    let seq = body
        .get(..8)
        .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8")));
    let mut out = Vec::with_capacity(HEADER_BYTES + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&format.to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(body);
    out
}

fn reachable(engine: &Engine) {
    for total in engine.totals() {
        assert!(total.sum >= Decimal::ZERO, "negative total {total:?}");
    }
}
