//! Parsed value types: each one is constructed only through its checks ("parse, don't validate").

use std::fmt;
use std::str::FromStr;

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

use crate::codes::ErrorCode;

/// A user id: a positive integer that fits PostgreSQL's BIGINT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub struct UserId(u64);

impl UserId {
    pub fn new(raw: u64) -> Result<Self, ErrorCode> {
        if raw == 0 || raw > i64::MAX as u64 {
            return Err(ErrorCode::InvalidUserId);
        }
        Ok(Self(raw))
    }

    pub fn get(self) -> u64 {
        self.0
    }

    /// The id as PostgreSQL's BIGINT; lossless because `new` bounds it by `i64::MAX`.
    pub fn as_i64(self) -> i64 {
        i64::try_from(self.0).expect("UserId is bounded by i64::MAX at construction")
    }
}

impl TryFrom<u64> for UserId {
    type Error = ErrorCode;
    fn try_from(raw: u64) -> Result<Self, ErrorCode> {
        Self::new(raw)
    }
}

impl From<UserId> for u64 {
    fn from(id: UserId) -> u64 {
        id.0
    }
}

impl FromStr for UserId {
    type Err = ErrorCode;
    fn from_str(s: &str) -> Result<Self, ErrorCode> {
        if s.is_empty()
            || s.len() > 19
            || !s.bytes().all(|b| b.is_ascii_digit())
            || s.starts_with('0')
        {
            return Err(ErrorCode::InvalidUserId);
        }
        s.parse::<u64>()
            .map_err(|_| ErrorCode::InvalidUserId)
            .and_then(Self::new)
    }
}

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The server-generated id of one transfer: a ULID in its 26-character Crockford form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ReqId(ulid::Ulid);

impl ReqId {
    /// A fresh id. Only the coordinator calls this; clients never choose a `req_id`.
    pub fn generate() -> Self {
        Self(ulid::Ulid::new())
    }

    /// The id made of a ULID time (Unix ms) and 80 random bits: for a clock other than the
    /// machine's (the simulation's `Clock`, whose time and random source are seeded).
    pub fn from_parts(time_ms: u64, random: u128) -> Self {
        Self(ulid::Ulid::from_parts(time_ms, random))
    }

    pub fn parse(text: &str) -> Result<Self, ErrorCode> {
        if text.len() != 26 {
            return Err(ErrorCode::NotFound);
        }
        let id = ulid::Ulid::from_string(text).map_err(|_| ErrorCode::NotFound)?;
        // Only the canonical (upper-case) spelling names a transfer, so one id has one key.
        if id.to_string() != text {
            return Err(ErrorCode::NotFound);
        }
        Ok(Self(id))
    }
}

impl TryFrom<String> for ReqId {
    type Error = ErrorCode;
    fn try_from(text: String) -> Result<Self, ErrorCode> {
        Self::parse(&text)
    }
}

impl From<ReqId> for String {
    fn from(id: ReqId) -> String {
        id.0.to_string()
    }
}

impl fmt::Display for ReqId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// An asset symbol's shape: 1 to 16 upper-case ASCII letters or digits. Whether it is a known,
/// active asset is the registry's question, not this type's.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct AssetSymbol(String);

impl AssetSymbol {
    pub fn parse(text: &str) -> Result<Self, ErrorCode> {
        let ok = !text.is_empty()
            && text.len() <= 16
            && text
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit());
        if !ok {
            return Err(ErrorCode::InvalidAsset);
        }
        Ok(Self(text.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for AssetSymbol {
    type Error = ErrorCode;
    fn try_from(text: String) -> Result<Self, ErrorCode> {
        Self::parse(&text)
    }
}

impl From<AssetSymbol> for String {
    fn from(a: AssetSymbol) -> String {
        a.0
    }
}

impl fmt::Display for AssetSymbol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The kinds of account a user holds. FUTURE and MARGIN are known names that are not launched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AccountType {
    Funding,
    Spot,
    Future,
    Margin,
}

impl AccountType {
    /// Parses a name; an unknown name is `INVALID_ACCOUNT_TYPE`.
    pub fn parse(text: &str) -> Result<Self, ErrorCode> {
        match text {
            "FUNDING" => Ok(Self::Funding),
            "SPOT" => Ok(Self::Spot),
            "FUTURE" => Ok(Self::Future),
            "MARGIN" => Ok(Self::Margin),
            _ => Err(ErrorCode::InvalidAccountType),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Funding => "FUNDING",
            Self::Spot => "SPOT",
            Self::Future => "FUTURE",
            Self::Margin => "MARGIN",
        }
    }

    pub fn is_supported(self) -> bool {
        matches!(self, Self::Funding | Self::Spot)
    }
}

impl fmt::Display for AccountType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The ceiling of one amount: 10^11 whole units. An amount at 8 decimals then fits u64 minor
/// units with room to spare (u64::MAX / 10^8 is about 1.8 * 10^11), the "safety factor" of seed
/// 000 section 1.5.3, and sums of many amounts stay far below `Decimal::MAX`.
pub fn amount_ceiling() -> Decimal {
    Decimal::from_i128_with_scale(100_000_000_000, 0)
}

/// Most fractional digits an amount may carry before an asset's own precision is consulted.
pub const AMOUNT_SCALE_MAX: u32 = 18;

/// A positive, exact amount of money, never a float. Its text form is canonical: plain decimal,
/// no sign, no exponent, no trailing fractional zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Amount(Decimal);

impl Amount {
    /// Parses plain decimal text: `digits[.digits]`, no sign, no exponent, no whitespace, no
    /// leading zeros in the integer part (except a lone `0`). Zero is `INVALID_AMOUNT`; more than
    /// 18 fractional digits is `PRECISION_OVERFLOW`; the ceiling (10^11) or more is `OVERFLOW`.
    pub fn parse(text: &str) -> Result<Self, ErrorCode> {
        let (int_part, frac_part) = match text.split_once('.') {
            Some((i, f)) => (i, Some(f)),
            None => (text, None),
        };
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(int_part) || (int_part.len() > 1 && int_part.starts_with('0')) {
            return Err(ErrorCode::InvalidAmount);
        }
        if let Some(f) = frac_part {
            if !digits(f) {
                return Err(ErrorCode::InvalidAmount);
            }
        }
        // With no redundant leading zero, 12 or more integer digits is at or above the ceiling
        // (10^11) whatever follows.
        if int_part.len() > 11 {
            return Err(ErrorCode::Overflow);
        }
        let frac = frac_part.unwrap_or("").trim_end_matches('0');
        if frac.len() as u32 > AMOUNT_SCALE_MAX {
            return Err(ErrorCode::PrecisionOverflow);
        }
        let canonical = if frac.is_empty() {
            int_part.to_owned()
        } else {
            format!("{int_part}.{frac}")
        };
        // Below the ceiling, the only way not to fit Decimal's 28-digit mantissa exactly is too
        // many fractional digits: more precision than can be kept, never a rounded value.
        let value =
            Decimal::from_str_exact(&canonical).map_err(|_| ErrorCode::PrecisionOverflow)?;
        Self::from_decimal(value)
    }

    /// Wraps an exact decimal after the same range checks as `parse`.
    pub fn from_decimal(value: Decimal) -> Result<Self, ErrorCode> {
        if value <= Decimal::ZERO {
            return Err(ErrorCode::InvalidAmount);
        }
        if value >= amount_ceiling() {
            return Err(ErrorCode::Overflow);
        }
        if value.normalize().scale() > AMOUNT_SCALE_MAX {
            return Err(ErrorCode::PrecisionOverflow);
        }
        Ok(Self(value.normalize()))
    }

    pub fn value(self) -> Decimal {
        self.0
    }

    /// Fractional digits after normalisation.
    pub fn scale(self) -> u32 {
        self.0.scale()
    }
}

impl TryFrom<String> for Amount {
    type Error = ErrorCode;
    fn try_from(text: String) -> Result<Self, ErrorCode> {
        Self::parse(&text)
    }
}

impl From<Amount> for String {
    fn from(a: Amount) -> String {
        a.to_string()
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amount_parses_plain_decimals_canonically() {
        assert_eq!(Amount::parse("100.50").unwrap().to_string(), "100.5");
        assert_eq!(Amount::parse("100").unwrap().to_string(), "100");
        assert_eq!(
            Amount::parse("0.00000001").unwrap().to_string(),
            "0.00000001"
        );
        assert_eq!(Amount::parse("1.000").unwrap().to_string(), "1");
    }

    #[test]
    fn amount_refuses_bad_shapes() {
        for bad in [
            "", "-1", "+1", "1e5", "0x10", " 1", "1 ", ".5", "5.", "01", "1,5", "NaN", "1.2.3",
        ] {
            assert_eq!(Amount::parse(bad), Err(ErrorCode::InvalidAmount), "{bad:?}");
        }
        assert_eq!(Amount::parse("0"), Err(ErrorCode::InvalidAmount));
        assert_eq!(Amount::parse("0.000"), Err(ErrorCode::InvalidAmount));
    }

    #[test]
    fn amount_refuses_overflow_and_precision() {
        assert_eq!(
            Amount::parse("18446744073709551616"),
            Err(ErrorCode::Overflow)
        );
        assert_eq!(Amount::parse("100000000000"), Err(ErrorCode::Overflow));
        assert!(Amount::parse("99999999999.99999999").is_ok());
        assert_eq!(
            Amount::parse("99999999999999999999999999999999"),
            Err(ErrorCode::Overflow)
        );
        assert_eq!(
            Amount::parse("0.0000000000000000001"),
            Err(ErrorCode::PrecisionOverflow)
        );
        // 29 significant digits do not fit Decimal exactly: refused, never rounded.
        assert_eq!(
            Amount::parse("79228162514.264400000000000001"),
            Err(ErrorCode::PrecisionOverflow)
        );
    }

    #[test]
    fn user_ids_are_positive_bigints() {
        assert!(UserId::new(0).is_err());
        assert!(UserId::new(i64::MAX as u64 + 1).is_err());
        assert_eq!("42".parse::<UserId>().unwrap().get(), 42);
        assert!("042".parse::<UserId>().is_err());
        assert!("-1".parse::<UserId>().is_err());
    }

    #[test]
    fn req_ids_round_trip_in_canonical_form_only() {
        let id = ReqId::generate();
        assert_eq!(ReqId::parse(&id.to_string()), Ok(id));
        assert!(ReqId::parse(&id.to_string().to_lowercase()).is_err());
        assert!(ReqId::parse("nope").is_err());
    }
}
