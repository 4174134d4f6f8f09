//! An entry's domain time as the leaf writes it (`YYYY-MM-DDTHH:MM:SS.ffffffZ`, exactly six
//! digits, `docs/contract.md`), made from PostgreSQL's own text of the UTC timestamp
//! (`(occurred_at AT TIME ZONE 'UTC')::text`, ISO date style, which every sqlx connection sets):
//! `YYYY-MM-DD HH:MM:SS`, then a fraction of one to six digits unless it is zero.
//!
//! The database used to format the leaf's form itself with `to_char`; that took about 0.5 µs of
//! PostgreSQL's CPU per entry read, some 40% of its whole cost of a follower's or `verify`'s
//! read (`docs/perf-log.md`), where the plain text costs next to nothing. Any other text (another
//! date style, a year past 9999, BC) is refused, never guessed at: a leaf is never written
//! from a time read another way.

/// The leaf's form of a domain time: 27 ASCII bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeafTime([u8; LEN]);

const LEN: usize = 27;

impl LeafTime {
    /// From PostgreSQL's ISO text of a `timestamp` (see the module's comment).
    pub(crate) fn from_db(text: &str) -> Result<Self, String> {
        let bad = || format!("occurred_at {text:?} is not an ISO timestamp of the UTC domain time");
        let b = text.as_bytes();
        if b.len() < 19 || b.len() == 20 || b.len() > 26 {
            return Err(bad());
        }
        let mut out = *b"0000-00-00T00:00:00.000000Z";
        for (i, &c) in b[..19].iter().enumerate() {
            let ok = match i {
                4 | 7 => c == b'-',
                10 => c == b' ',
                13 | 16 => c == b':',
                _ => c.is_ascii_digit(),
            };
            if !ok {
                return Err(bad());
            }
            if i != 10 {
                out[i] = c;
            }
        }
        if b.len() > 19 {
            if b[19] != b'.' || !b[20..].iter().all(u8::is_ascii_digit) {
                return Err(bad());
            }
            out[20..20 + b.len() - 20].copy_from_slice(&b[20..]);
        }
        Ok(Self(out))
    }

    pub(crate) fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("ASCII by construction")
    }
}

#[cfg(test)]
mod tests {
    use super::LeafTime;

    #[test]
    fn the_database_text_becomes_the_leaf_form_with_six_digits() {
        for (db, leaf) in [
            ("2026-11-27 05:38:43.123456", "2026-11-27T05:38:43.123456Z"),
            ("2026-11-27 05:38:43.12", "2026-11-27T05:38:43.120000Z"),
            ("2026-11-27 05:38:43.000001", "2026-11-27T05:38:43.000001Z"),
            ("2026-11-27 05:38:43", "2026-11-27T05:38:43.000000Z"),
            ("0001-01-01 00:00:00.5", "0001-01-01T00:00:00.500000Z"),
        ] {
            assert_eq!(LeafTime::from_db(db).unwrap().as_str(), leaf, "{db}");
        }
    }

    #[test]
    fn any_other_text_is_refused() {
        for db in [
            "",
            "2026-11-27T05:38:43.123456Z",
            "2026-11-27 05:38:43.",
            "2026-11-27 05:38:43.1234567",
            "2026-11-27 05:38:43+00",
            "2026-11-27 05:38:43.12+00",
            "27.11.2026 05:38:43",
            "Fri Nov 27 05:38:43 2026",
            "12026-11-27 05:38:43",
            "0044-03-15 12:00:00 BC",
            "2026-11-27 05:38:4x",
        ] {
            assert!(LeafTime::from_db(db).is_err(), "{db:?}");
        }
    }
}
