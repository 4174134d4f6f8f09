//! The SPOT account state machine: pure, deterministic, no I/O.
//!
//! `Engine::apply` turns a request into a response plus, for anything that changes durable
//! state, the WAL record to persist. Every state change, whether live or during replay, goes
//! through `Engine::apply_record`, so replaying the WAL rebuilds exactly the state that
//! produced it.

use std::collections::{BTreeMap, HashMap};

use rust_decimal::Decimal;

use crate::assets::{Assets, MAX_PRECISION};
use crate::protocol::{
    AccountStatus, BalanceEntry, JournalRecord, LookupOp, MovementOp, MovementRecord,
    MovementRequest, Outcome, RefusalCode, Request, Response, StatusRecord, TotalEntry,
    MAX_JOURNAL_LIMIT,
};

/// 10^20: no amount and no balance may exceed it.
pub fn max_amount() -> Decimal {
    Decimal::from_i128_with_scale(100_000_000_000_000_000_000, 0)
}

const MAX_AMOUNT_INT: &str = "100000000000000000000";

/// What the engine decided for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Effect {
    pub response: Response,
    /// The record to make durable before `response` may be sent; `None` for reads and for
    /// refusals that are not recorded.
    pub record: Option<JournalRecord>,
}

impl Effect {
    fn reply(response: Response) -> Effect {
        Effect {
            response,
            record: None,
        }
    }

    fn refuse(code: RefusalCode) -> Effect {
        Effect::reply(Response::refused(code, false, None))
    }
}

/// A WAL record that cannot have been produced by this engine from the preceding records.
#[derive(Debug, thiserror::Error)]
#[error("WAL record seq {seq} is inconsistent with the records before it: {reason}")]
pub struct ReplayError {
    pub seq: u64,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Account {
    available: Decimal,
    status: AccountStatus,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Engine {
    assets: Assets,
    accounts: BTreeMap<(u64, String), Account>,
    /// Sum of `available` per asset, kept up to date so `totals` is cheap.
    totals: BTreeMap<String, Decimal>,
    /// Every record ever accepted; `records[i].seq() == i + 1`.
    records: Vec<JournalRecord>,
    /// req_id → indices into `records` of its movements (at most one per op).
    by_req: HashMap<String, Vec<usize>>,
}

impl Engine {
    pub fn new(assets: Assets) -> Engine {
        Engine {
            assets,
            accounts: BTreeMap::new(),
            totals: BTreeMap::new(),
            records: Vec::new(),
            by_req: HashMap::new(),
        }
    }

    /// Seq of the newest record (0 when empty).
    pub fn last_seq(&self) -> u64 {
        self.records.len() as u64
    }

    /// Available balance and status of one account, if it exists.
    pub fn account(&self, user_id: u64, asset: &str) -> Option<(Decimal, AccountStatus)> {
        self.accounts
            .get(&(user_id, asset.to_string()))
            .map(|a| (a.available, a.status))
    }

    /// Decide a request. State changes only through the returned record, which is already
    /// applied to memory; the caller must make it durable before sending the response.
    pub fn apply(&mut self, req: &Request) -> Effect {
        match req {
            Request::Withdraw(m) => self.movement(MovementOp::Withdraw, m),
            Request::Deposit(m) => self.movement(MovementOp::Deposit, m),
            Request::Refund(m) => self.movement(MovementOp::Refund, m),
            Request::SetStatus {
                user_id,
                asset,
                status,
            } => self.set_status(*user_id, asset, *status),
            Request::Lookup { req_id } => self.lookup(req_id),
            Request::Balances { user_id } => Effect::reply(Response::Ok {
                ops: None,
                balances: Some(self.balances(*user_id)),
                totals: None,
                records: None,
                core: None,
            }),
            Request::Totals {} => Effect::reply(Response::Ok {
                ops: None,
                balances: None,
                totals: Some(self.totals()),
                records: None,
                core: None,
            }),
            Request::Journal { after_seq, limit } => Effect::reply(Response::Ok {
                ops: None,
                balances: None,
                totals: None,
                records: Some(self.journal(*after_seq, *limit)),
                core: None,
            }),
            Request::Cancel {
                req_id,
                movement,
                user_id,
                asset,
                amount,
            } => self.cancel(
                *movement,
                &MovementRequest {
                    req_id: req_id.clone(),
                    user_id: *user_id,
                    asset: asset.clone(),
                    amount: amount.clone(),
                },
            ),
            // The server answers `hello` itself; a token check has no meaning here.
            Request::Ping {} | Request::Hello { .. } => Effect::reply(Response::ok()),
            // Issue 15: snapshots, segments and the horizon (spot-core helper implements these).
            Request::AdvanceHorizon { .. } | Request::Retain { .. } | Request::Status {} => {
                Effect::reply(Response::bad_request("not implemented yet"))
            }
        }
    }

    /// Settle `(req_id, op)`: when nothing is recorded under that key, record a `CANCELLED`
    /// refusal so every later copy of the movement is refused as a duplicate. Either way the
    /// answer is the one record now standing for the key, shaped like a `lookup` entry, and
    /// left for the caller to compare with the movement it meant (like `lookup`, a record with
    /// other details is reported, not refused).
    fn cancel(&mut self, op: MovementOp, m: &MovementRequest) -> Effect {
        if !valid_req_id(&m.req_id) {
            return Effect::refuse(RefusalCode::InvalidReqId);
        }
        if let Some(first) = self.find_movement(&m.req_id, op) {
            return Effect::reply(ops_response(vec![lookup_op(op, first)]));
        }
        // The same validations as the movement itself: the record must be one the movement
        // could have produced, and replay checks the amount.
        if !valid_user_id(m.user_id) {
            return Effect::refuse(RefusalCode::InvalidUserId);
        }
        let Some(precision) = self.assets.precision(&m.asset) else {
            return Effect::refuse(RefusalCode::InvalidAsset);
        };
        let amount = match parse_amount(&m.amount, precision) {
            Ok(a) => a,
            Err(code) => return Effect::refuse(code),
        };
        let rec = MovementRecord {
            seq: self.last_seq() + 1,
            req_id: m.req_id.clone(),
            user_id: m.user_id,
            asset: m.asset.clone(),
            amount,
            outcome: Outcome::Refused,
            code: Some(RefusalCode::Cancelled),
            balance: None,
        };
        let response = ops_response(vec![lookup_op(op, &rec)]);
        let record = JournalRecord::from_movement(op, rec);
        self.apply_record(record.clone())
            .expect("a record produced by the engine is consistent with its state");
        Effect {
            response,
            record: Some(record),
        }
    }

    fn movement(&mut self, op: MovementOp, m: &MovementRequest) -> Effect {
        if !valid_req_id(&m.req_id) {
            return Effect::refuse(RefusalCode::InvalidReqId);
        }
        // The idempotency check comes before the other validations on purpose: a retry of
        // something already recorded must get the recorded answer even if the asset config
        // changed since, otherwise a caller could mistake an applied movement for a refusal.
        if let Some(first) = self.find_movement(&m.req_id, op) {
            let same = first.user_id == m.user_id
                && first.asset == m.asset
                && parse_amount(&m.amount, MAX_PRECISION).is_ok_and(|a| a == first.amount);
            return Effect::reply(if same {
                movement_response(first, true)
            } else {
                Response::refused(RefusalCode::ReqIdConflict, false, None)
            });
        }
        if !valid_user_id(m.user_id) {
            return Effect::refuse(RefusalCode::InvalidUserId);
        }
        let Some(precision) = self.assets.precision(&m.asset) else {
            return Effect::refuse(RefusalCode::InvalidAsset);
        };
        let amount = match parse_amount(&m.amount, precision) {
            Ok(a) => a,
            Err(code) => return Effect::refuse(code),
        };

        let decision = self.decide(op, m, amount);
        let (outcome, code, balance) = match decision {
            Ok(new_balance) => (Outcome::Applied, None, Some(new_balance)),
            Err(code) => (Outcome::Refused, Some(code), None),
        };
        let rec = MovementRecord {
            seq: self.last_seq() + 1,
            req_id: m.req_id.clone(),
            user_id: m.user_id,
            asset: m.asset.clone(),
            amount,
            outcome,
            code,
            balance,
        };
        let response = movement_response(&rec, false);
        let record = JournalRecord::from_movement(op, rec);
        self.apply_record(record.clone())
            .expect("a record produced by the engine is consistent with its state");
        Effect {
            response,
            record: Some(record),
        }
    }

    /// Business rules: the new available balance, or the refusal to record.
    fn decide(
        &self,
        op: MovementOp,
        m: &MovementRequest,
        amount: Decimal,
    ) -> Result<Decimal, RefusalCode> {
        let account = self.accounts.get(&(m.user_id, m.asset.clone()));
        match op {
            MovementOp::Withdraw => {
                let a = account.ok_or(RefusalCode::SourceAccountNotFound)?;
                match a.status {
                    AccountStatus::Frozen => return Err(RefusalCode::AccountFrozen),
                    AccountStatus::Disabled => return Err(RefusalCode::AccountDisabled),
                    AccountStatus::Active => {}
                }
                if a.available < amount {
                    return Err(RefusalCode::InsufficientBalance);
                }
                Ok((a.available - amount).normalize())
            }
            MovementOp::Deposit => {
                if account.is_some_and(|a| a.status == AccountStatus::Disabled) {
                    return Err(RefusalCode::AccountDisabled);
                }
                credit(account.map_or(Decimal::ZERO, |a| a.available), amount)
            }
            MovementOp::Refund => {
                // Status is ignored: a refund puts money back where it was taken from.
                let matching = self
                    .find_movement(&m.req_id, MovementOp::Withdraw)
                    .is_some_and(|w| {
                        w.outcome == Outcome::Applied
                            && w.user_id == m.user_id
                            && w.asset == m.asset
                            && w.amount == amount
                    });
                if !matching {
                    return Err(RefusalCode::NoMatchingWithdraw);
                }
                credit(account.map_or(Decimal::ZERO, |a| a.available), amount)
            }
        }
    }

    fn set_status(&mut self, user_id: u64, asset: &str, status: AccountStatus) -> Effect {
        if !valid_user_id(user_id) {
            return Effect::refuse(RefusalCode::InvalidUserId);
        }
        if self.assets.precision(asset).is_none() {
            return Effect::refuse(RefusalCode::InvalidAsset);
        }
        let record = JournalRecord::SetStatus(StatusRecord {
            seq: self.last_seq() + 1,
            user_id,
            asset: asset.to_string(),
            status,
        });
        self.apply_record(record.clone())
            .expect("a record produced by the engine is consistent with its state");
        Effect {
            response: Response::ok(),
            record: Some(record),
        }
    }

    fn lookup(&self, req_id: &str) -> Effect {
        if !valid_req_id(req_id) {
            return Effect::refuse(RefusalCode::InvalidReqId);
        }
        let ops = self
            .by_req
            .get(req_id)
            .into_iter()
            .flatten()
            .filter_map(|&i| self.records[i].as_movement())
            .map(|(op, r)| lookup_op(op, r))
            .collect();
        Effect::reply(ops_response(ops))
    }

    pub fn balances(&self, user_id: u64) -> Vec<BalanceEntry> {
        self.accounts
            .range((user_id, String::new())..)
            .take_while(|((u, _), _)| *u == user_id)
            .map(|((_, asset), a)| BalanceEntry {
                asset: asset.clone(),
                available: a.available,
                status: a.status,
            })
            .collect()
    }

    /// Per-asset sum of balances, listing every configured asset even at zero.
    pub fn totals(&self) -> Vec<TotalEntry> {
        let mut all: BTreeMap<&str, Decimal> =
            self.assets.symbols().map(|s| (s, Decimal::ZERO)).collect();
        for (asset, sum) in &self.totals {
            all.insert(asset, *sum);
        }
        all.into_iter()
            .map(|(asset, sum)| TotalEntry {
                asset: asset.to_string(),
                sum: sum.normalize(),
            })
            .collect()
    }

    pub fn journal(&self, after_seq: u64, limit: u32) -> Vec<JournalRecord> {
        let start = usize::try_from(after_seq)
            .unwrap_or(usize::MAX)
            .min(self.records.len());
        let limit = limit.min(MAX_JOURNAL_LIMIT) as usize;
        self.records[start..].iter().take(limit).cloned().collect()
    }

    fn find_movement(&self, req_id: &str, op: MovementOp) -> Option<&MovementRecord> {
        self.by_req
            .get(req_id)?
            .iter()
            .filter_map(|&i| self.records[i].as_movement())
            .find(|(o, _)| *o == op)
            .map(|(_, r)| r)
    }

    /// The only way state changes. Checks that `record` follows from the current state
    /// (contiguous seq, arithmetic matches the recorded balance) before touching anything.
    pub fn apply_record(&mut self, record: JournalRecord) -> Result<(), ReplayError> {
        let seq = record.seq();
        let fail = |reason: String| Err(ReplayError { seq, reason });
        if seq != self.last_seq() + 1 {
            return fail(format!("expected seq {}", self.last_seq() + 1));
        }
        match &record {
            JournalRecord::Horizon(_) | JournalRecord::Retain(_) => {
                return fail("horizon and retain records are not implemented yet".into());
            }
            JournalRecord::SetStatus(s) => {
                self.accounts
                    .entry((s.user_id, s.asset.clone()))
                    .or_insert(Account {
                        available: Decimal::ZERO,
                        status: AccountStatus::Active,
                    })
                    .status = s.status;
            }
            JournalRecord::Withdraw(m) | JournalRecord::Deposit(m) | JournalRecord::Refund(m) => {
                let (op, _) = record.as_movement().expect("movement");
                if self.find_movement(&m.req_id, op).is_some() {
                    return fail(format!("second {} for req_id {}", op.as_str(), m.req_id));
                }
                if !valid_req_id(&m.req_id) || m.amount <= Decimal::ZERO || m.amount > max_amount()
                {
                    return fail("invalid req_id or amount".into());
                }
                match (m.outcome, m.code, m.balance) {
                    (Outcome::Refused, Some(_), None) => {}
                    (Outcome::Applied, None, Some(recorded)) => {
                        let key = (m.user_id, m.asset.clone());
                        let current = self.accounts.get(&key).map(|a| a.available);
                        let new = match (op, current) {
                            (MovementOp::Withdraw, Some(cur)) if cur >= m.amount => cur - m.amount,
                            (MovementOp::Withdraw, _) => {
                                return fail("withdraw exceeds the balance".into())
                            }
                            (MovementOp::Refund, None) => {
                                return fail("refund into a missing account".into())
                            }
                            (_, cur) => match credit(cur.unwrap_or(Decimal::ZERO), m.amount) {
                                Ok(v) => v,
                                Err(_) => return fail("credit exceeds 10^20".into()),
                            },
                        };
                        if new != recorded {
                            return fail(format!("computed balance {new} but recorded {recorded}"));
                        }
                        let total = self.totals.entry(m.asset.clone()).or_insert(Decimal::ZERO);
                        *total = if op == MovementOp::Withdraw {
                            *total - m.amount
                        } else {
                            *total + m.amount
                        };
                        self.accounts
                            .entry(key)
                            .or_insert(Account {
                                available: Decimal::ZERO,
                                status: AccountStatus::Active,
                            })
                            .available = new.normalize();
                    }
                    _ => return fail("outcome, code and balance disagree".into()),
                }
                self.by_req
                    .entry(m.req_id.clone())
                    .or_default()
                    .push(self.records.len());
            }
        }
        self.records.push(record);
        Ok(())
    }
}

fn lookup_op(op: MovementOp, r: &MovementRecord) -> LookupOp {
    LookupOp {
        op,
        user_id: r.user_id,
        asset: r.asset.clone(),
        amount: r.amount,
        outcome: r.outcome,
        code: r.code,
        seq: r.seq,
    }
}

fn ops_response(ops: Vec<LookupOp>) -> Response {
    Response::Ok {
        ops: Some(ops),
        balances: None,
        totals: None,
        records: None,
        core: None,
    }
}

fn movement_response(rec: &MovementRecord, duplicate: bool) -> Response {
    match (rec.outcome, rec.code) {
        (Outcome::Applied, _) => Response::Applied {
            balance: rec.balance.expect("applied records carry a balance"),
            duplicate,
            seq: rec.seq,
        },
        (Outcome::Refused, code) => Response::refused(
            code.expect("refused records carry a code"),
            duplicate,
            Some(rec.seq),
        ),
    }
}

fn credit(balance: Decimal, amount: Decimal) -> Result<Decimal, RefusalCode> {
    match balance.checked_add(amount) {
        Some(v) if v <= max_amount() => Ok(v.normalize()),
        _ => Err(RefusalCode::Overflow),
    }
}

pub fn valid_req_id(req_id: &str) -> bool {
    (1..=64).contains(&req_id.len())
        && req_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

pub fn valid_user_id(user_id: u64) -> bool {
    user_id != 0 && user_id <= i64::MAX as u64
}

/// Parse a canonical plain decimal string: digits, optionally `.` and digits; no sign,
/// exponent, whitespace or redundant leading zeros. Trailing fractional zeros are allowed
/// and do not count against `precision`.
pub fn parse_amount(s: &str, precision: u32) -> Result<Decimal, RefusalCode> {
    let (int, frac) = match s.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (s, None),
    };
    let all_digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(int) || (int.len() > 1 && int.starts_with('0')) {
        return Err(RefusalCode::InvalidAmount);
    }
    let frac = match frac {
        Some(f) if all_digits(f) => f.trim_end_matches('0'),
        Some(_) => return Err(RefusalCode::InvalidAmount),
        None => "",
    };
    if int == "0" && frac.is_empty() {
        return Err(RefusalCode::InvalidAmount);
    }
    if frac.len() > precision.min(MAX_PRECISION) as usize {
        return Err(RefusalCode::PrecisionOverflow);
    }
    if int.len() > MAX_AMOUNT_INT.len()
        || (int.len() == MAX_AMOUNT_INT.len() && (int != MAX_AMOUNT_INT || !frac.is_empty()))
    {
        return Err(RefusalCode::Overflow);
    }
    // At most 21 + 8 digits here, which fits an i128 and Decimal's 96-bit mantissa.
    let mantissa = int
        .bytes()
        .chain(frac.bytes())
        .fold(0i128, |acc, b| acc * 10 + i128::from(b - b'0'));
    Decimal::try_from_i128_with_scale(mantissa, frac.len() as u32)
        .map_err(|_| RefusalCode::Overflow)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    fn d(s: &str) -> Decimal {
        Decimal::from_str(s).unwrap()
    }

    fn engine() -> Engine {
        Engine::new(Assets::builtin())
    }

    fn mv(op: MovementOp, req_id: &str, user_id: u64, asset: &str, amount: &str) -> Request {
        let body = MovementRequest {
            req_id: req_id.into(),
            user_id,
            asset: asset.into(),
            amount: amount.into(),
        };
        match op {
            MovementOp::Withdraw => Request::Withdraw(body),
            MovementOp::Deposit => Request::Deposit(body),
            MovementOp::Refund => Request::Refund(body),
        }
    }

    fn deposit(e: &mut Engine, req_id: &str, user: u64, asset: &str, amount: &str) -> Effect {
        e.apply(&mv(MovementOp::Deposit, req_id, user, asset, amount))
    }

    fn withdraw(e: &mut Engine, req_id: &str, user: u64, asset: &str, amount: &str) -> Effect {
        e.apply(&mv(MovementOp::Withdraw, req_id, user, asset, amount))
    }

    fn refund(e: &mut Engine, req_id: &str, user: u64, asset: &str, amount: &str) -> Effect {
        e.apply(&mv(MovementOp::Refund, req_id, user, asset, amount))
    }

    fn set_status(e: &mut Engine, user: u64, asset: &str, status: AccountStatus) -> Effect {
        e.apply(&Request::SetStatus {
            user_id: user,
            asset: asset.into(),
            status,
        })
    }

    fn code(effect: &Effect) -> Option<RefusalCode> {
        match &effect.response {
            Response::Refused { code, .. } => Some(*code),
            _ => None,
        }
    }

    fn applied_balance(effect: &Effect) -> Decimal {
        match &effect.response {
            Response::Applied { balance, .. } => *balance,
            other => panic!("expected applied, got {other:?}"),
        }
    }

    fn balance(e: &Engine, user: u64, asset: &str) -> Option<Decimal> {
        e.account(user, asset).map(|(b, _)| b)
    }

    /// A validation refusal: the right code, nothing recorded, nothing changed.
    fn assert_unrecorded(e: &mut Engine, req: Request, expected: RefusalCode) {
        let before = e.clone();
        let effect = e.apply(&req);
        assert_eq!(code(&effect), Some(expected), "{req:?} → {effect:?}");
        assert!(effect.record.is_none(), "{req:?} must not be recorded");
        assert_eq!(*e, before, "{req:?} must not change state");
    }

    /// A business refusal: the right code, recorded with a seq, balances unchanged.
    fn assert_recorded_refusal(e: &mut Engine, req: Request, expected: RefusalCode) {
        let balances_before = e.accounts.clone();
        let effect = e.apply(&req);
        assert_eq!(code(&effect), Some(expected), "{req:?} → {effect:?}");
        let rec = effect.record.expect("business refusals are recorded");
        let (_, m) = rec.as_movement().unwrap();
        assert_eq!((m.outcome, m.code), (Outcome::Refused, Some(expected)));
        assert!(
            matches!(effect.response, Response::Refused { seq: Some(s), duplicate: false, .. } if s == m.seq)
        );
        assert_eq!(e.accounts, balances_before);
    }

    #[test]
    fn amount_parsing_accepts_only_canonical_plain_decimals() {
        assert_eq!(parse_amount("10.5", 8), Ok(d("10.5")));
        assert_eq!(parse_amount("10.50", 8), Ok(d("10.5")));
        assert_eq!(parse_amount("0.00000001", 8), Ok(d("0.00000001")));
        assert_eq!(parse_amount("1.000000000000", 2), Ok(d("1")));
        assert_eq!(parse_amount("100000000000000000000", 8), Ok(max_amount()));
        assert_eq!(
            parse_amount("99999999999999999999.99999999", 8),
            Ok(d("99999999999999999999.99999999"))
        );
        for bad in [
            "", "0", "0.0", "00.5", "01", "-1", "+1", "1e5", "1E5", " 1", "1 ", "1.", ".5",
            "1.2.3", "abc", "1,5", "٣", "0x10", "-0.5", "NaN", "inf",
        ] {
            assert_eq!(
                parse_amount(bad, 8),
                Err(RefusalCode::InvalidAmount),
                "{bad:?}"
            );
        }
        assert_eq!(
            parse_amount("0.000000001", 8),
            Err(RefusalCode::PrecisionOverflow)
        );
        assert_eq!(parse_amount("1.5", 0), Err(RefusalCode::PrecisionOverflow));
        assert_eq!(
            parse_amount("100000000000000000000.00000001", 8),
            Err(RefusalCode::Overflow)
        );
        assert_eq!(
            parse_amount("100000000000000000001", 8),
            Err(RefusalCode::Overflow)
        );
        assert_eq!(
            parse_amount("999999999999999999999999999999999999", 8),
            Err(RefusalCode::Overflow)
        );
    }

    #[test]
    fn validation_refusals_are_not_recorded() {
        let mut e = engine();
        deposit(&mut e, "seed", 1, "USDT", "100");
        let w = MovementOp::Withdraw;
        assert_unrecorded(&mut e, mv(w, "", 1, "USDT", "1"), RefusalCode::InvalidReqId);
        assert_unrecorded(
            &mut e,
            mv(w, &"a".repeat(65), 1, "USDT", "1"),
            RefusalCode::InvalidReqId,
        );
        assert_unrecorded(
            &mut e,
            mv(w, "bad id", 1, "USDT", "1"),
            RefusalCode::InvalidReqId,
        );
        assert_unrecorded(
            &mut e,
            mv(w, "é", 1, "USDT", "1"),
            RefusalCode::InvalidReqId,
        );
        assert_unrecorded(
            &mut e,
            mv(w, "r1", 0, "USDT", "1"),
            RefusalCode::InvalidUserId,
        );
        assert_unrecorded(
            &mut e,
            mv(w, "r1", i64::MAX as u64 + 1, "USDT", "1"),
            RefusalCode::InvalidUserId,
        );
        assert_unrecorded(
            &mut e,
            mv(w, "r1", 1, "DOGE", "1"),
            RefusalCode::InvalidAsset,
        );
        assert_unrecorded(
            &mut e,
            mv(w, "r1", 1, "usdt", "1"),
            RefusalCode::InvalidAsset,
        );
        assert_unrecorded(
            &mut e,
            mv(w, "r1", 1, "USDT", "-1"),
            RefusalCode::InvalidAmount,
        );
        assert_unrecorded(
            &mut e,
            mv(w, "r1", 1, "USDT", "0"),
            RefusalCode::InvalidAmount,
        );
        assert_unrecorded(
            &mut e,
            mv(w, "r1", 1, "USDT", "1e2"),
            RefusalCode::InvalidAmount,
        );
        assert_unrecorded(
            &mut e,
            mv(w, "r1", 1, "USDT", "0.123456789"),
            RefusalCode::PrecisionOverflow,
        );
        assert_unrecorded(
            &mut e,
            mv(w, "r1", 1, "USDT", "100000000000000000001"),
            RefusalCode::Overflow,
        );
        assert_unrecorded(
            &mut e,
            mv(
                MovementOp::Deposit,
                "r1",
                1,
                "USDT",
                "100000000000000000001",
            ),
            RefusalCode::Overflow,
        );
        assert_unrecorded(
            &mut e,
            Request::SetStatus {
                user_id: 0,
                asset: "USDT".into(),
                status: AccountStatus::Frozen,
            },
            RefusalCode::InvalidUserId,
        );
        assert_unrecorded(
            &mut e,
            Request::SetStatus {
                user_id: 1,
                asset: "DOGE".into(),
                status: AccountStatus::Frozen,
            },
            RefusalCode::InvalidAsset,
        );
        assert_unrecorded(
            &mut e,
            Request::Lookup {
                req_id: "no good".into(),
            },
            RefusalCode::InvalidReqId,
        );
        // The req_id stays free after a validation refusal.
        assert_eq!(
            applied_balance(&withdraw(&mut e, "r1", 1, "USDT", "1")),
            d("99")
        );
    }

    #[test]
    fn deposit_creates_the_account_lazily() {
        let mut e = engine();
        assert_eq!(e.balances(5), vec![]);
        let eff = deposit(&mut e, "d1", 5, "BTC", "1.25");
        assert_eq!(
            eff.response,
            Response::Applied {
                balance: d("1.25"),
                duplicate: false,
                seq: 1
            }
        );
        assert!(matches!(eff.record, Some(JournalRecord::Deposit(_))));
        assert_eq!(
            e.balances(5),
            vec![BalanceEntry {
                asset: "BTC".into(),
                available: d("1.25"),
                status: AccountStatus::Active
            }]
        );
    }

    #[test]
    fn withdraw_refusals_in_order() {
        let mut e = engine();
        let w = |id: &str, amount: &str| mv(MovementOp::Withdraw, id, 1, "USDT", amount);
        assert_recorded_refusal(&mut e, w("w1", "1"), RefusalCode::SourceAccountNotFound);
        // A refused withdraw does not create the account.
        assert_eq!(e.account(1, "USDT"), None);
        deposit(&mut e, "d1", 1, "USDT", "10");
        set_status(&mut e, 1, "USDT", AccountStatus::Frozen);
        assert_recorded_refusal(&mut e, w("w2", "100"), RefusalCode::AccountFrozen);
        set_status(&mut e, 1, "USDT", AccountStatus::Disabled);
        assert_recorded_refusal(&mut e, w("w3", "100"), RefusalCode::AccountDisabled);
        set_status(&mut e, 1, "USDT", AccountStatus::Active);
        assert_recorded_refusal(
            &mut e,
            w("w4", "10.00000001"),
            RefusalCode::InsufficientBalance,
        );
        assert_eq!(applied_balance(&e.apply(&w("w5", "10"))), Decimal::ZERO);
        assert_eq!(balance(&e, 1, "USDT"), Some(Decimal::ZERO));
    }

    #[test]
    fn deposit_status_rules() {
        let mut e = engine();
        set_status(&mut e, 2, "ETH", AccountStatus::Frozen);
        assert_eq!(
            e.account(2, "ETH"),
            Some((Decimal::ZERO, AccountStatus::Frozen))
        );
        // A frozen account may still receive.
        assert_eq!(
            applied_balance(&deposit(&mut e, "d1", 2, "ETH", "3")),
            d("3")
        );
        set_status(&mut e, 2, "ETH", AccountStatus::Disabled);
        assert_recorded_refusal(
            &mut e,
            mv(MovementOp::Deposit, "d2", 2, "ETH", "1"),
            RefusalCode::AccountDisabled,
        );
        assert_eq!(balance(&e, 2, "ETH"), Some(d("3")));
    }

    #[test]
    fn resulting_balance_overflow_is_a_recorded_refusal() {
        let mut e = engine();
        assert_eq!(
            applied_balance(&deposit(&mut e, "d1", 3, "BTC", "100000000000000000000")),
            max_amount()
        );
        assert_recorded_refusal(
            &mut e,
            mv(MovementOp::Deposit, "d2", 3, "BTC", "0.00000001"),
            RefusalCode::Overflow,
        );
        withdraw(&mut e, "w1", 3, "BTC", "1");
        // The recorded refusal sticks even though the deposit would fit now.
        let again = deposit(&mut e, "d2", 3, "BTC", "0.00000001");
        assert!(matches!(
            again.response,
            Response::Refused {
                code: RefusalCode::Overflow,
                duplicate: true,
                ..
            }
        ));
    }

    #[test]
    fn duplicate_withdraw_returns_first_result_and_debits_once() {
        let mut e = engine();
        deposit(&mut e, "d1", 1, "USDT", "100");
        let first = withdraw(&mut e, "t1", 1, "USDT", "30");
        assert_eq!(
            first.response,
            Response::Applied {
                balance: d("70"),
                duplicate: false,
                seq: 2
            }
        );
        withdraw(&mut e, "t2", 1, "USDT", "5");
        let before = e.clone();
        // Same request, and an equal amount spelled differently.
        for amount in ["30", "30.000"] {
            let dup = withdraw(&mut e, "t1", 1, "USDT", amount);
            assert_eq!(
                dup.response,
                Response::Applied {
                    balance: d("70"),
                    duplicate: true,
                    seq: 2
                }
            );
            assert!(dup.record.is_none());
        }
        assert_eq!(e, before);
        assert_eq!(balance(&e, 1, "USDT"), Some(d("65")));
    }

    #[test]
    fn duplicate_deposit_credits_once() {
        let mut e = engine();
        let first = deposit(&mut e, "d1", 1, "ETH", "2.5");
        let dup = deposit(&mut e, "d1", 1, "ETH", "2.5");
        assert_eq!(
            dup.response,
            Response::Applied {
                balance: d("2.5"),
                duplicate: true,
                seq: 1
            }
        );
        assert!(matches!(
            first.response,
            Response::Applied {
                duplicate: false,
                ..
            }
        ));
        assert_eq!(balance(&e, 1, "ETH"), Some(d("2.5")));
        assert_eq!(e.last_seq(), 1);
    }

    #[test]
    fn duplicate_refusal_is_returned_even_when_it_would_now_succeed() {
        let mut e = engine();
        deposit(&mut e, "d1", 1, "USDT", "5");
        let first = withdraw(&mut e, "w1", 1, "USDT", "10");
        assert_eq!(code(&first), Some(RefusalCode::InsufficientBalance));
        deposit(&mut e, "d2", 1, "USDT", "100");
        let dup = withdraw(&mut e, "w1", 1, "USDT", "10");
        assert_eq!(
            dup.response,
            Response::refused(RefusalCode::InsufficientBalance, true, Some(2))
        );
        assert!(dup.record.is_none());
        assert_eq!(balance(&e, 1, "USDT"), Some(d("105")));
    }

    #[test]
    fn req_id_conflict_changes_nothing() {
        let mut e = engine();
        deposit(&mut e, "d0", 1, "USDT", "100");
        withdraw(&mut e, "t1", 1, "USDT", "10");
        let w = MovementOp::Withdraw;
        assert_unrecorded(
            &mut e,
            mv(w, "t1", 1, "USDT", "11"),
            RefusalCode::ReqIdConflict,
        );
        assert_unrecorded(
            &mut e,
            mv(w, "t1", 2, "USDT", "10"),
            RefusalCode::ReqIdConflict,
        );
        assert_unrecorded(
            &mut e,
            mv(w, "t1", 1, "BTC", "10"),
            RefusalCode::ReqIdConflict,
        );
        assert_unrecorded(
            &mut e,
            mv(w, "t1", 1, "USDT", "1e1"),
            RefusalCode::ReqIdConflict,
        );
        assert_unrecorded(
            &mut e,
            mv(MovementOp::Deposit, "d0", 2, "USDT", "100"),
            RefusalCode::ReqIdConflict,
        );
        assert_eq!(e.account(2, "USDT"), None);
        // Another op with the same req_id is a different key.
        assert!(matches!(
            refund(&mut e, "t1", 1, "USDT", "10").response,
            Response::Applied { .. }
        ));
    }

    #[test]
    fn refund_rules() {
        let mut e = engine();
        deposit(&mut e, "d1", 1, "USDT", "100");
        // No withdraw at all.
        assert_recorded_refusal(
            &mut e,
            mv(MovementOp::Refund, "x1", 1, "USDT", "1"),
            RefusalCode::NoMatchingWithdraw,
        );
        // A refused withdraw cannot be refunded.
        withdraw(&mut e, "big", 1, "USDT", "1000");
        assert_recorded_refusal(
            &mut e,
            mv(MovementOp::Refund, "big", 1, "USDT", "1000"),
            RefusalCode::NoMatchingWithdraw,
        );
        // Mismatched user, asset or amount.
        withdraw(&mut e, "t1", 1, "USDT", "40");
        assert_recorded_refusal(
            &mut e,
            mv(MovementOp::Refund, "t2", 1, "USDT", "40"),
            RefusalCode::NoMatchingWithdraw,
        );
        let mut probe = e.clone();
        assert_recorded_refusal(
            &mut probe,
            mv(MovementOp::Refund, "t1", 1, "USDT", "39"),
            RefusalCode::NoMatchingWithdraw,
        );
        let mut probe = e.clone();
        assert_recorded_refusal(
            &mut probe,
            mv(MovementOp::Refund, "t1", 2, "USDT", "40"),
            RefusalCode::NoMatchingWithdraw,
        );
        let mut probe = e.clone();
        assert_recorded_refusal(
            &mut probe,
            mv(MovementOp::Refund, "t1", 1, "BTC", "40"),
            RefusalCode::NoMatchingWithdraw,
        );
        // A refund ignores account status.
        set_status(&mut e, 1, "USDT", AccountStatus::Disabled);
        let r = refund(&mut e, "t1", 1, "USDT", "40");
        assert!(matches!(
            r.response,
            Response::Applied {
                duplicate: false,
                ..
            }
        ));
        assert_eq!(applied_balance(&r), d("100"));
        // And it is idempotent: the second refund gives nothing more back.
        let dup = refund(&mut e, "t1", 1, "USDT", "40");
        assert!(matches!(
            dup.response,
            Response::Applied {
                duplicate: true,
                ..
            }
        ));
        assert_eq!(applied_balance(&dup), d("100"));
        assert_eq!(balance(&e, 1, "USDT"), Some(d("100")));
    }

    #[test]
    fn lookup_reports_every_op_of_a_req_id() {
        let mut e = engine();
        deposit(&mut e, "d1", 7, "USDT", "20");
        withdraw(&mut e, "t1", 7, "USDT", "10.5");
        refund(&mut e, "t1", 7, "USDT", "10.5");
        withdraw(&mut e, "t2", 7, "USDT", "999");
        let Response::Ok { ops: Some(ops), .. } = e
            .apply(&Request::Lookup {
                req_id: "t1".into(),
            })
            .response
        else {
            panic!("lookup failed")
        };
        assert_eq!(ops.len(), 2);
        assert_eq!(
            (ops[0].op, ops[0].outcome, ops[0].seq, ops[0].amount),
            (MovementOp::Withdraw, Outcome::Applied, 2, d("10.5"))
        );
        assert_eq!(
            (ops[1].op, ops[1].outcome, ops[1].seq),
            (MovementOp::Refund, Outcome::Applied, 3)
        );
        let Response::Ok { ops: Some(ops), .. } = e
            .apply(&Request::Lookup {
                req_id: "t2".into(),
            })
            .response
        else {
            panic!("lookup failed")
        };
        assert_eq!(
            (ops[0].outcome, ops[0].code),
            (Outcome::Refused, Some(RefusalCode::InsufficientBalance))
        );
        let Response::Ok { ops: Some(ops), .. } = e
            .apply(&Request::Lookup {
                req_id: "never".into(),
            })
            .response
        else {
            panic!("lookup failed")
        };
        assert!(ops.is_empty());
    }

    #[test]
    fn balances_totals_and_journal() {
        let mut e = engine();
        deposit(&mut e, "a", 1, "USDT", "1.5");
        deposit(&mut e, "b", 1, "BTC", "2");
        deposit(&mut e, "c", 2, "USDT", "3.5");
        withdraw(&mut e, "d", 2, "USDT", "1");
        set_status(&mut e, 3, "ETH", AccountStatus::Frozen);
        let assets: Vec<_> = e.balances(1).into_iter().map(|b| b.asset).collect();
        assert_eq!(assets, vec!["BTC", "USDT"]);
        assert_eq!(e.balances(4), vec![]);
        assert_eq!(
            e.totals(),
            vec![
                TotalEntry {
                    asset: "BTC".into(),
                    sum: d("2")
                },
                TotalEntry {
                    asset: "ETH".into(),
                    sum: Decimal::ZERO
                },
                TotalEntry {
                    asset: "USDT".into(),
                    sum: d("4")
                },
            ]
        );
        let all = e.journal(0, 1000);
        assert_eq!(
            all.iter().map(JournalRecord::seq).collect::<Vec<_>>(),
            vec![1, 2, 3, 4, 5]
        );
        assert_eq!(
            e.journal(3, 1)
                .iter()
                .map(JournalRecord::seq)
                .collect::<Vec<_>>(),
            vec![4]
        );
        assert!(e.journal(5, 10).is_empty());
        assert!(e.journal(u64::MAX, 10).is_empty());
        for _ in 0..(MAX_JOURNAL_LIMIT + 10) {
            e.apply(&Request::SetStatus {
                user_id: 9,
                asset: "BTC".into(),
                status: AccountStatus::Active,
            });
        }
        assert_eq!(e.journal(0, u32::MAX).len(), MAX_JOURNAL_LIMIT as usize);
    }

    #[test]
    fn replaying_the_records_rebuilds_the_same_engine() {
        let mut e = engine();
        deposit(&mut e, "a", 1, "USDT", "10");
        withdraw(&mut e, "b", 1, "USDT", "4");
        withdraw(&mut e, "c", 1, "USDT", "40");
        refund(&mut e, "b", 1, "USDT", "4");
        set_status(&mut e, 1, "USDT", AccountStatus::Frozen);
        let mut r = engine();
        for rec in e.journal(0, 1000) {
            r.apply_record(rec).unwrap();
        }
        assert_eq!(r, e);
    }

    #[test]
    fn inconsistent_records_are_rejected() {
        let mut e = engine();
        let rec = deposit(&mut e, "a", 1, "USDT", "10").record.unwrap();
        let mut fresh = engine();
        // Gap in seq.
        let JournalRecord::Deposit(mut m) = rec.clone() else {
            unreachable!()
        };
        m.seq = 2;
        assert!(fresh
            .apply_record(JournalRecord::Deposit(m.clone()))
            .is_err());
        // Wrong balance.
        m.seq = 1;
        m.balance = Some(d("11"));
        assert!(fresh.apply_record(JournalRecord::Deposit(m)).is_err());
        // Withdraw more than there is.
        let JournalRecord::Deposit(m) = rec.clone() else {
            unreachable!()
        };
        assert!(fresh
            .apply_record(JournalRecord::Withdraw(MovementRecord {
                balance: Some(d("-10")),
                ..m
            }))
            .is_err());
        assert_eq!(fresh, engine());
        fresh.apply_record(rec.clone()).unwrap();
        // The same (req_id, op) twice.
        let JournalRecord::Deposit(mut m) = rec else {
            unreachable!()
        };
        m.seq = 2;
        m.balance = Some(d("20"));
        assert!(fresh.apply_record(JournalRecord::Deposit(m)).is_err());
    }

    fn cancel(
        e: &mut Engine,
        op: MovementOp,
        req_id: &str,
        user: u64,
        asset: &str,
        amount: &str,
    ) -> Effect {
        e.apply(&Request::Cancel {
            req_id: req_id.into(),
            movement: op,
            user_id: user,
            asset: asset.into(),
            amount: amount.into(),
        })
    }

    fn single_op(effect: &Effect) -> LookupOp {
        match &effect.response {
            Response::Ok { ops: Some(ops), .. } if ops.len() == 1 => ops[0].clone(),
            other => panic!("expected one lookup entry, got {other:?}"),
        }
    }

    #[test]
    fn cancel_records_a_refusal_that_every_later_copy_gets() {
        let mut e = engine();
        deposit(&mut e, "seed", 1, "USDT", "100");
        for op in [
            MovementOp::Withdraw,
            MovementOp::Deposit,
            MovementOp::Refund,
        ] {
            let req_id = format!("c-{}", op.as_str());
            let before = e.accounts.clone();
            let effect = cancel(&mut e, op, &req_id, 1, "USDT", "10.50");
            let rec = effect
                .record
                .clone()
                .expect("a cancel of nothing is recorded");
            let (rec_op, m) = rec.as_movement().unwrap();
            assert_eq!(rec_op, op);
            assert_eq!(
                (m.outcome, m.code, m.balance, m.amount),
                (
                    Outcome::Refused,
                    Some(RefusalCode::Cancelled),
                    None,
                    d("10.5")
                )
            );
            let entry = single_op(&effect);
            assert_eq!(
                entry,
                LookupOp {
                    op,
                    user_id: 1,
                    asset: "USDT".into(),
                    amount: d("10.5"),
                    outcome: Outcome::Refused,
                    code: Some(RefusalCode::Cancelled),
                    seq: m.seq,
                }
            );
            assert_eq!(e.accounts, before);
            // A late copy of the movement gets the recorded refusal, not a fresh decision.
            let late = e.apply(&mv(op, &req_id, 1, "USDT", "10.5"));
            assert!(late.record.is_none());
            assert_eq!(
                late.response,
                Response::refused(RefusalCode::Cancelled, true, Some(m.seq))
            );
            assert_eq!(e.accounts, before);
            // Cancelling again reports the same record and records nothing.
            let again = cancel(&mut e, op, &req_id, 1, "USDT", "10.5");
            assert!(again.record.is_none());
            assert_eq!(single_op(&again), entry);
            // And lookup shows it.
            assert_eq!(
                single_op(&e.apply(&Request::Lookup {
                    req_id: req_id.clone()
                })),
                entry
            );
        }
        // A cancelled withdraw was never applied, so there is nothing to refund.
        assert_eq!(
            code(&refund(&mut e, "c-withdraw", 1, "USDT", "10.5")),
            Some(RefusalCode::NoMatchingWithdraw)
        );
        assert_eq!(balance(&e, 1, "USDT"), Some(d("100")));
        let mut r = engine();
        for rec in e.journal(0, 1000) {
            r.apply_record(rec).unwrap();
        }
        assert_eq!(r, e);
    }

    #[test]
    fn cancel_of_a_recorded_movement_reports_it_unchanged() {
        let mut e = engine();
        deposit(&mut e, "d", 1, "USDT", "100");
        withdraw(&mut e, "w", 1, "USDT", "30");
        withdraw(&mut e, "poor", 1, "USDT", "1000");
        let state = e.clone();
        let applied = single_op(&cancel(&mut e, MovementOp::Withdraw, "w", 1, "USDT", "30"));
        assert_eq!(
            (applied.outcome, applied.code, applied.seq),
            (Outcome::Applied, None, 2)
        );
        let refused = single_op(&cancel(
            &mut e,
            MovementOp::Withdraw,
            "poor",
            1,
            "USDT",
            "1000",
        ));
        assert_eq!(
            (refused.outcome, refused.code, refused.seq),
            (Outcome::Refused, Some(RefusalCode::InsufficientBalance), 3)
        );
        // Other details: the record is reported as it is, for the caller to compare.
        let other = cancel(&mut e, MovementOp::Withdraw, "w", 2, "BTC", "1");
        assert!(other.record.is_none());
        let other = single_op(&other);
        assert_eq!(
            (other.user_id, other.asset.as_str(), other.amount),
            (1, "USDT", d("30"))
        );
        assert_eq!(e, state);
        // The withdraw stays refundable: cancel settled only (w, withdraw).
        assert_eq!(
            applied_balance(&refund(&mut e, "w", 1, "USDT", "30")),
            d("100")
        );
    }

    #[test]
    fn invalid_cancels_are_refused_and_not_recorded() {
        let mut e = engine();
        let w = MovementOp::Withdraw;
        for (req_id, user, asset, amount, expected) in [
            ("", 1, "USDT", "1", RefusalCode::InvalidReqId),
            ("a b", 1, "USDT", "1", RefusalCode::InvalidReqId),
            ("ok", 0, "USDT", "1", RefusalCode::InvalidUserId),
            ("ok", 1, "DOGE", "1", RefusalCode::InvalidAsset),
            ("ok", 1, "USDT", "0", RefusalCode::InvalidAmount),
            ("ok", 1, "USDT", "1e3", RefusalCode::InvalidAmount),
            (
                "ok",
                1,
                "USDT",
                "0.000000001",
                RefusalCode::PrecisionOverflow,
            ),
            (
                "ok",
                1,
                "USDT",
                "100000000000000000001",
                RefusalCode::Overflow,
            ),
        ] {
            let req = Request::Cancel {
                req_id: req_id.into(),
                movement: w,
                user_id: user,
                asset: asset.into(),
                amount: amount.into(),
            };
            assert_unrecorded(&mut e, req, expected);
        }
    }
}
