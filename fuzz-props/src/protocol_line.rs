//! spot-core's request lines, decoded as the server decodes them (`trim_ascii`, then
//! `serde_json::from_slice::<Request>`), one line after another on one engine, as a connection
//! sends them. Properties: a decoded request re-encodes to JSON that decodes to the same
//! request; the engine decides every decoded request (validation is total: an answer, never a
//! panic); state changes only through the record it returns, and replaying that record
//! (framed as the WAL frames it, then `apply_record` on a second engine) gives the same engine;
//! an applied movement had a canonical req_id, a valid user and an amount the asset allows, and
//! the same line again is answered as its duplicate without a new record.

use spot_core::engine::{parse_amount, valid_req_id, valid_user_id, Engine};
use spot_core::protocol::{Request, Response};

use crate::assets::assets;
use crate::wal_segment::framed_back;

/// spot-core's clock for every fuzzed line (Unix ms, 2025-06-15): req_ids up to a day later
/// are accepted.
pub const NOW_MS: u64 = 1_750_000_000_000;

/// Lines taken from one input: a connection's worth, small enough to stay fast.
const LINES_MAX: usize = 64;

pub fn check(data: &[u8]) {
    let mut live = Engine::new(assets());
    let mut replayed = Engine::new(assets());
    for line in data.split(|b| *b == b'\n').take(LINES_MAX) {
        let text = line.trim_ascii();
        if text.is_empty() {
            continue;
        }
        let Ok(request) = serde_json::from_slice::<Request>(text) else {
            continue;
        };
        round_trips(&request);
        if matches!(request, Request::Hello { .. } | Request::Journal { .. }) {
            // Answered by the server and the WAL layer, never decided by the engine.
            continue;
        }
        decide(&mut live, &mut replayed, &request);
    }
}

fn round_trips(request: &Request) {
    let json = serde_json::to_vec(request).expect("a request serializes");
    let back: Request = serde_json::from_slice(&json).expect("its JSON decodes");
    assert_eq!(&back, request, "{}", String::from_utf8_lossy(&json));
}

fn decide(live: &mut Engine, replayed: &mut Engine, request: &Request) {
    let before = live.clone();
    let effect = live.apply_at(request, NOW_MS);
    match &effect.record {
        None => assert_eq!(&before, live, "no record, no change: {request:?}"),
        Some(record) => {
            let record = framed_back(record);
            if let Err(e) = replayed.apply_record(record) {
                panic!("the engine's own record does not replay: {e:?} ({request:?})");
            }
            assert_eq!(replayed, live, "replay equals live after {request:?}");
        }
    }
    let Some((_, movement)) = request.as_movement() else {
        return;
    };
    let Response::Applied { balance, seq, .. } = effect.response else {
        return;
    };
    assert!(valid_req_id(&movement.req_id), "{movement:?}");
    assert!(valid_user_id(movement.user_id), "{movement:?}");
    let precision = assets()
        .precision(&movement.asset)
        .expect("applied to a configured asset");
    assert!(
        parse_amount(&movement.amount, precision).is_ok(),
        "{movement:?}"
    );
    let again = live.apply_at(request, NOW_MS);
    assert_eq!(again.record, None, "a duplicate is not recorded again");
    assert_eq!(
        again.response,
        Response::Applied {
            balance,
            duplicate: true,
            seq
        },
        "a duplicate repeats the first answer"
    );
}
