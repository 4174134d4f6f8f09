//! Wire types of the spot-core protocol (newline-delimited JSON over TCP) and of its WAL records.
//!
//! These types are shared by the server, the WAL, the client and other crates of the workspace,
//! so everything here is plain serde data with no behaviour that depends on engine state. By
//! job: `request.rs` (the request lines and the protocol's limits and versions), `kinds.rs` (the
//! names both sides use: movement ops, account statuses, outcomes, refusal and error codes),
//! `response.rs` (the answer lines), `record.rs` (the WAL's records, which `journal` serves),
//! `moves.rs` (a partition's state as `move_out` answers it and `move_in` takes it).
//! Everything is re-exported here: callers name `protocol::X`.

mod kinds;
mod moves;
mod record;
mod request;
mod response;

pub use kinds::{AccountStatus, ErrorCode, MovementOp, Outcome, RefusalCode, UnknownMovementOp};
pub use moves::{
    valid_move_id, MoveKind, MovePayload, MoveRecord, MovedAccount, MovedRecord, MAX_MOVE_ID_BYTES,
    MAX_MOVE_LINE_BYTES,
};
pub use record::{
    HorizonRecord, JournalRecord, MapVersionRecord, MovementRecord, RetainRecord, StatusRecord,
};
pub use request::{
    canonical_amount, MovementRequest, Request, DEFAULT_JOURNAL_LIMIT, EPOCH_SINCE_VERSION,
    MAX_JOURNAL_LIMIT, MAX_LINE_BYTES, PROTOCOL_VERSION, TRACE_SINCE_VERSION,
};
pub use response::{
    BalanceEntry, CoreStatus, FollowerStatus, HelloInfo, LookupOp, MoveAnswer, ReplicationStatus,
    Response, TotalEntry,
};

#[cfg(test)]
mod tests {
    use super::*;
    use rust_decimal::Decimal;
    use std::str::FromStr;

    fn parse(line: &str) -> Result<Request, serde_json::Error> {
        serde_json::from_str(line)
    }

    #[test]
    fn requests_parse_from_the_documented_shapes() {
        let r =
            parse(r#"{"op":"withdraw","req_id":"a-1","user_id":7,"asset":"USDT","amount":"10.5"}"#)
                .unwrap();
        assert_eq!(
            r,
            Request::Withdraw(MovementRequest::new(
                "a-1",
                7,
                "USDT",
                Decimal::from_str("10.5").unwrap()
            ))
        );
        assert_eq!(parse(r#"{"op":"ping"}"#).unwrap(), Request::Ping {});
        assert_eq!(parse(r#"{"op":"totals"}"#).unwrap(), Request::Totals {});
        assert_eq!(
            parse(r#"{"op":"journal"}"#).unwrap(),
            Request::Journal {
                after_seq: 0,
                limit: DEFAULT_JOURNAL_LIMIT
            }
        );
        assert_eq!(
            parse(r#"{"op":"set_status","user_id":1,"asset":"BTC","status":"FROZEN"}"#).unwrap(),
            Request::SetStatus {
                user_id: 1,
                asset: "BTC".into(),
                status: AccountStatus::Frozen
            }
        );
    }

    #[test]
    fn unknown_ops_and_fields_are_rejected() {
        assert!(parse(r#"{"op":"steal"}"#).is_err());
        assert!(parse(r#"{"op":"ping","x":1}"#).is_err());
        assert!(parse(r#"{"op":"totals","x":1}"#).is_err());
        assert!(parse(r#"{"op":"lookup","req_id":"a","x":1}"#).is_err());
        assert!(parse(
            r#"{"op":"deposit","req_id":"a","user_id":1,"asset":"BTC","amount":"1","x":1}"#
        )
        .is_err());
        assert!(parse(r#"{"op":"deposit","req_id":"a","user_id":1,"asset":"BTC"}"#).is_err());
        // A float on the wire is not money.
        assert!(
            parse(r#"{"op":"deposit","req_id":"a","user_id":1,"asset":"BTC","amount":1.5}"#)
                .is_err()
        );
        assert!(parse(r#"{"op":"balances","user_id":-1}"#).is_err());
    }

    /// Version 2's `trace` rides on a movement, is left out when absent (a version 1 line is
    /// unchanged), and the hello answer announces the version; an old engine's bare `ok` reads
    /// as version 1.
    #[test]
    fn a_trace_is_a_version_2_field_of_movements_only() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let line = format!(
            r#"{{"op":"deposit","req_id":"a","user_id":1,"asset":"BTC","amount":"1","trace":"{tp}"}}"#
        );
        let Request::Deposit(m) = parse(&line).unwrap() else {
            panic!("a deposit");
        };
        assert_eq!(m.trace.as_deref(), Some(tp));
        let plain = Request::deposit("a", 1, "BTC", Decimal::ONE);
        assert!(!serde_json::to_string(&plain).unwrap().contains("trace"));
        assert!(parse(&format!(r#"{{"op":"lookup","req_id":"a","trace":"{tp}"}}"#)).is_err());
        let hello = serde_json::to_string(&Response::hello()).unwrap();
        assert_eq!(
            hello,
            format!(r#"{{"status":"ok","protocol":{PROTOCOL_VERSION}}}"#)
        );
        let back: Response = serde_json::from_str(&hello).unwrap();
        assert_eq!(back.protocol_version(), PROTOCOL_VERSION);
        let old: Response = serde_json::from_str(r#"{"status":"ok"}"#).unwrap();
        assert_eq!(old.protocol_version(), 1);
    }

    #[test]
    fn responses_use_strings_for_amounts() {
        let r = Response::Applied {
            balance: Decimal::from_str("10.5").unwrap(),
            duplicate: false,
            seq: 3,
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"status":"applied","balance":"10.5","duplicate":false,"seq":3}"#
        );
        assert_eq!(
            serde_json::to_string(&Response::ok()).unwrap(),
            r#"{"status":"ok"}"#
        );
        let refused = Response::refused(RefusalCode::InsufficientBalance, true, None);
        let text = serde_json::to_string(&refused).unwrap();
        assert!(
            text.starts_with(r#"{"status":"refused","code":"INSUFFICIENT_BALANCE","#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<Response>(&text).unwrap(), refused);
    }

    #[test]
    fn lookup_entries_serialize_null_code() {
        let op = LookupOp {
            op: MovementOp::Withdraw,
            user_id: 7,
            asset: "USDT".into(),
            amount: Decimal::from_str("10.5").unwrap(),
            outcome: Outcome::Applied,
            code: None,
            seq: 12,
        };
        assert_eq!(
            serde_json::to_string(&op).unwrap(),
            r#"{"op":"withdraw","user_id":7,"asset":"USDT","amount":"10.5","outcome":"applied","code":null,"seq":12}"#
        );
    }

    /// The one spelling of each op: parsed back, refused when unknown, and the same as the tag
    /// of its request and of its record (serde derives those from the variant names).
    #[test]
    fn every_movement_op_has_one_name() {
        assert_eq!("withdraw".parse(), Ok(MovementOp::Withdraw));
        assert_eq!(
            "Withdraw".parse::<MovementOp>(),
            Err(UnknownMovementOp("Withdraw".into()))
        );
        assert!("".parse::<MovementOp>().is_err());
        assert!(serde_json::from_str::<MovementOp>(r#""steal""#).is_err());
        assert!(serde_json::from_str::<MovementOp>(r#"{"withdraw":null}"#).is_err());
        for op in MovementOp::ALL {
            let name = op.as_str();
            assert_eq!(name.parse(), Ok(op));
            assert_eq!(op.to_string(), name);
            assert_eq!(serde_json::to_string(&op).unwrap(), format!("\"{name}\""));
            assert_eq!(
                serde_json::from_str::<MovementOp>(&format!("\"{name}\"")).unwrap(),
                op
            );
            let tag = |v: serde_json::Value| v["op"].as_str().map(str::to_owned);
            let request = Request::movement(op, "a", 1, "USDT", Decimal::ONE);
            assert_eq!(
                tag(serde_json::to_value(&request).unwrap()).as_deref(),
                Some(name)
            );
            let record = JournalRecord::from_movement(
                op,
                MovementRecord {
                    seq: 1,
                    req_id: "a".into(),
                    user_id: 1,
                    asset: "USDT".into(),
                    amount: Decimal::ONE,
                    outcome: Outcome::Applied,
                    code: None,
                    balance: Some(Decimal::ONE),
                },
            );
            let json = serde_json::to_value(&record).unwrap();
            assert_eq!(tag(json.clone()).as_deref(), Some(name));
            assert_eq!(
                serde_json::from_value::<JournalRecord>(json).unwrap(),
                record
            );
        }
    }

    #[test]
    fn canonical_amount_drops_trailing_zeros() {
        assert_eq!(
            canonical_amount(Decimal::from_str("10.500").unwrap()),
            "10.5"
        );
        assert_eq!(canonical_amount(Decimal::from_str("100").unwrap()), "100");
        assert_eq!(
            canonical_amount(Decimal::from_str("0.00000001").unwrap()),
            "0.00000001"
        );
    }
}
