//! Property tests for the amount parser: no input string makes it panic, nothing it accepts is in
//! a non-canonical form, and every plain decimal in range is accepted with its exact value.

use std::str::FromStr;

use domain::{Amount, AssetRegistry, ErrorCode};
use proptest::prelude::*;
use rust_decimal::Decimal;

/// What an accepted input may look like: plain digits, one optional fraction, no redundant
/// leading zero, no sign, exponent or whitespace.
fn plain_decimal(text: &str) -> bool {
    let (int, frac) = match text.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (text, None),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    digits(int) && (int == "0" || !int.starts_with('0')) && frac.is_none_or(digits)
}

/// The canonical text form: as above, and no trailing fractional zero.
fn canonical(text: &str) -> bool {
    plain_decimal(text) && !(text.contains('.') && text.ends_with('0'))
}

/// The text without trailing fractional zeros (and without a then bare `.`).
fn strip_fraction_zeros(text: &str) -> &str {
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.')
    } else {
        text
    }
}

fn check_any(text: &str) {
    let usdt = AssetRegistry::default_assets().get("USDT").unwrap().clone();
    match Amount::parse(text) {
        Ok(amount) => {
            assert!(plain_decimal(text), "accepted a non-plain form: {text:?}");
            let shown = amount.to_string();
            assert!(
                canonical(&shown),
                "non-canonical output {shown:?} for {text:?}"
            );
            assert_eq!(Amount::parse(&shown), Ok(amount), "round trip of {text:?}");
            let exact = Decimal::from_str_exact(strip_fraction_zeros(text)).unwrap();
            assert_eq!(amount.value(), exact, "value of {text:?}");
            assert!(amount.value() > Decimal::ZERO);
            // The asset checks never panic on anything the parser lets through.
            let _ = usdt.check_amount(amount);
        }
        Err(code) => assert!(
            matches!(
                code,
                ErrorCode::InvalidAmount | ErrorCode::PrecisionOverflow | ErrorCode::Overflow
            ),
            "unexpected code {code:?} for {text:?}"
        ),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn arbitrary_text_never_panics_or_sneaks_through(text in any::<String>()) {
        check_any(&text);
    }

    #[test]
    fn number_like_text_never_panics_or_sneaks_through(text in "[-+ 0-9.eExXnNaA,_\t]{0,40}") {
        check_any(&text);
    }

    #[test]
    fn every_plain_decimal_in_range_is_accepted_exactly(
        int in 0u64..100_000_000_000,
        frac in proptest::option::of("[0-9]{1,18}"),
    ) {
        let text = match &frac {
            Some(f) => format!("{int}.{f}"),
            None => int.to_string(),
        };
        let trimmed = strip_fraction_zeros(&text);
        let significant = trimmed.trim_start_matches(['0', '.']).chars().filter(char::is_ascii_digit).count();
        match Amount::parse(&text) {
            Ok(amount) => {
                prop_assert_eq!(amount.value(), Decimal::from_str_exact(trimmed).unwrap());
                prop_assert!(canonical(&amount.to_string()));
            }
            // Zero, or more digits than an exact Decimal holds (never silently rounded).
            Err(ErrorCode::InvalidAmount) => prop_assert!(Decimal::from_str(&text).unwrap().is_zero()),
            Err(ErrorCode::PrecisionOverflow) => prop_assert!(significant > 28, "{}", text),
            Err(code) => prop_assert!(false, "{:?} for {}", code, text),
        }
    }

    #[test]
    fn decorated_amounts_are_refused(
        int in 1u64..1_000_000,
        decoration in prop_oneof![
            Just(("-", "")), Just(("+", "")), Just((" ", "")), Just(("", " ")),
            Just(("", "e0")), Just(("0x", "")), Just(("0", "")), Just(("", ".")),
            Just(("", "\n")), Just(("\u{00a0}", "")),
        ],
    ) {
        let text = format!("{}{int}{}", decoration.0, decoration.1);
        prop_assert_eq!(Amount::parse(&text), Err(ErrorCode::InvalidAmount), "{}", text);
    }

    #[test]
    fn values_past_the_ceiling_are_overflow(extra in 0u128..u128::MAX / 2, frac in "[0-9]{0,8}") {
        let int = 100_000_000_000u128 + extra;
        let text = if frac.is_empty() { int.to_string() } else { format!("{int}.{frac}") };
        prop_assert_eq!(Amount::parse(&text), Err(ErrorCode::Overflow), "{}", text);
    }
}
