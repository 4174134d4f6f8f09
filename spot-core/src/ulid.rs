//! Canonical ULIDs as spot-core keys: 26 characters of uppercase Crockford base32 (as
//! `domain::ReqId` prints them), decoded to a `u128` whose top 48 bits are the creation time in
//! Unix milliseconds. Keys ordered as integers are ordered by creation time, which is what lets
//! the engine forget everything older than the idempotency horizon with one split.

const ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// Length of a ULID's text form.
pub const ULID_LEN: usize = 26;

/// The value of a canonical ULID, or `None` for anything else (lowercase, the Crockford
/// aliases I, L, O, U, a first character above 7, a wrong length).
pub fn parse(text: &str) -> Option<u128> {
    let bytes = text.as_bytes();
    if bytes.len() != ULID_LEN || bytes[0] > b'7' {
        return None;
    }
    let mut value = 0u128;
    for &b in bytes {
        value = (value << 5) | u128::from(digit(b)?);
    }
    Some(value)
}

fn digit(b: u8) -> Option<u8> {
    Some(match b {
        b'0'..=b'9' => b - b'0',
        b'A'..=b'H' => b - b'A' + 10,
        b'J' | b'K' => b - b'J' + 18,
        b'M' | b'N' => b - b'M' + 20,
        b'P'..=b'T' => b - b'P' + 22,
        b'V'..=b'Z' => b - b'V' + 27,
        _ => return None,
    })
}

/// The canonical text of a ULID value.
pub fn format(value: u128) -> String {
    let mut out = [0u8; ULID_LEN];
    for (i, slot) in out.iter_mut().enumerate() {
        let shift = 5 * (ULID_LEN - 1 - i);
        *slot = ALPHABET[((value >> shift) & 31) as usize];
    }
    String::from_utf8(out.to_vec()).expect("the alphabet is ASCII")
}

/// Creation time (Unix milliseconds) of a ULID value.
pub fn time_ms(value: u128) -> u64 {
    (value >> 80) as u64
}

/// The smallest ULID value created at `ms`: every key below it was created earlier.
pub fn lower_bound(ms: u64) -> u128 {
    u128::from(ms) << 80
}

/// A canonical ULID standing for a label (its FNV-1a hash as the random bits, created at a fixed
/// past time): tests name their req_ids with it.
pub fn for_label(label: impl AsRef<str>) -> String {
    let h = label
        .as_ref()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    format(from_parts(1_700_000_000_000, u128::from(h)))
}

/// A ULID created at `ms` with the given 80 random bits (tests and benchmarks make
/// deterministic keys with it).
pub fn from_parts(ms: u64, random: u128) -> u128 {
    lower_bound(ms & ((1 << 48) - 1)) | (random & ((1u128 << 80) - 1))
}

/// Unix milliseconds now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_orders_by_time() {
        for v in [
            0u128,
            1,
            u128::MAX >> 2,
            from_parts(1_700_000_000_000, 12345),
        ] {
            assert_eq!(parse(&format(v)), Some(v));
        }
        let a = from_parts(1000, u128::MAX);
        let b = from_parts(1001, 0);
        assert!(a < b && format(a) < format(b));
        assert_eq!(
            time_ms(from_parts(1_700_000_000_123, 99)),
            1_700_000_000_123
        );
    }

    #[test]
    fn only_canonical_text_is_accepted() {
        let good = "01ARZ3NDEKTSV4RRFFQ69G5FAV";
        assert!(parse(good).is_some());
        assert!(parse(&good.to_lowercase()).is_none());
        assert!(parse("01ARZ3NDEKTSV4RRFFQ69G5FA").is_none());
        assert!(parse("01ARZ3NDEKTSV4RRFFQ69G5FAVX").is_none());
        assert!(parse("01ARZ3NDEKTSV4RRFFQ69G5FAI").is_none());
        assert!(parse("01ARZ3NDEKTSV4RRFFQ69G5FAO").is_none());
        assert!(parse("81ARZ3NDEKTSV4RRFFQ69G5FAV").is_none());
        assert!(parse("").is_none());
        assert_eq!(format(parse(good).unwrap()), good);
    }
}
