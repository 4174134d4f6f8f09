//! The checks a request's values pass before the engine decides anything: canonical amounts
//! within 10^20, user ids, req_ids; and the one credit rule (a balance never above 10^20).

use rust_decimal::Decimal;

use crate::assets::MAX_PRECISION;
use crate::protocol::RefusalCode;
use crate::ulid;

/// 10^20: no amount and no balance may exceed it.
pub fn max_amount() -> Decimal {
    Decimal::from_i128_with_scale(100_000_000_000_000_000_000, 0)
}

const MAX_AMOUNT_INT: &str = "100000000000000000000";

/// How far ahead of spot-core's clock a req_id's ULID time may be: a key further in the future
/// would stay above any horizon for that long, i.e. could not expire in time.
pub const MAX_REQ_ID_FUTURE_MS: u64 = 24 * 3600 * 1000;

pub(super) fn credit(balance: Decimal, amount: Decimal) -> Result<Decimal, RefusalCode> {
    match balance.checked_add(amount) {
        Some(v) if v <= max_amount() => Ok(v.normalize()),
        _ => Err(RefusalCode::Overflow),
    }
}

/// A req_id is a canonical ULID (see `ulid::parse`).
pub fn valid_req_id(req_id: &str) -> bool {
    ulid::parse(req_id).is_some()
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
