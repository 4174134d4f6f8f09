//! `domain::Amount::parse` against a reference written from its documented grammar: every
//! input gets exactly the reference's answer (the same refusal code, or the same canonical
//! text); an accepted amount round-trips through its text, serde and `from_decimal`, and lies
//! in (0, 10^11) with at most 18 fractional digits.

use domain::values::{amount_ceiling, AMOUNT_SCALE_MAX};
use domain::{Amount, ErrorCode};
use rust_decimal::Decimal;

/// Decimal's largest mantissa, 2^96 - 1: more significant digits cannot be held exactly.
const MANTISSA_MAX: u128 = (1 << 96) - 1;

pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = Amount::parse(text);
    let expected = reference(text);
    match (&parsed, &expected) {
        (Ok(amount), Ok(canonical)) => accepted(*amount, canonical),
        (Err(got), Err(want)) => assert_eq!(got, want, "refusal code of {text:?}"),
        _ => panic!("{text:?}: parse gave {parsed:?}, the grammar says {expected:?}"),
    }
}

/// The properties of an accepted amount whose canonical text is `canonical`.
fn accepted(amount: Amount, canonical: &str) {
    let text = amount.to_string();
    assert_eq!(text, canonical, "canonical text");
    assert_eq!(Amount::parse(&text), Ok(amount), "re-parse of {text}");
    assert!(amount.value() > Decimal::ZERO && amount.value() < amount_ceiling());
    assert!(amount.scale() <= AMOUNT_SCALE_MAX, "scale of {text}");
    assert_eq!(Amount::from_decimal(amount.value()), Ok(amount));
    let json = serde_json::to_string(&amount).expect("an amount serializes");
    assert_eq!(json, format!("\"{text}\""));
    let back: Amount = serde_json::from_str(&json).expect("its JSON parses back");
    assert_eq!(back, amount);
}

/// The documented grammar and bounds: `digits[.digits]`, no redundant leading zero; more than
/// 11 integer digits is OVERFLOW, more than 18 significant fractional digits (or more digits
/// than an exact decimal holds) PRECISION_OVERFLOW, zero INVALID_AMOUNT. Returns the canonical
/// text (trailing fractional zeros dropped).
fn reference(text: &str) -> Result<String, ErrorCode> {
    let (int, frac) = match text.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (text, None),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let shape_ok =
        digits(int) && !(int.len() > 1 && int.starts_with('0')) && frac.is_none_or(digits);
    if !shape_ok {
        return Err(ErrorCode::InvalidAmount);
    }
    if int.len() > 11 {
        return Err(ErrorCode::Overflow);
    }
    let frac = frac.unwrap_or("").trim_end_matches('0');
    if frac.len() > AMOUNT_SCALE_MAX as usize {
        return Err(ErrorCode::PrecisionOverflow);
    }
    // At most 11 + 18 digits: fits a u128.
    let mantissa = int
        .bytes()
        .chain(frac.bytes())
        .fold(0u128, |acc, b| acc * 10 + u128::from(b - b'0'));
    if mantissa > MANTISSA_MAX {
        return Err(ErrorCode::PrecisionOverflow);
    }
    if mantissa == 0 {
        return Err(ErrorCode::InvalidAmount);
    }
    Ok(if frac.is_empty() {
        int.to_owned()
    } else {
        format!("{int}.{frac}")
    })
}
