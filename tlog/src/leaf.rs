//! A log entry's exact bytes: RFC 8785 (JCS) canonical JSON of a fixed list of fields, frozen in
//! `docs/contract.md`. Every value is a string (or `null` for an event without an owner): 64-bit
//! integers are written as decimal strings, because JCS numbers are doubles, and the payload is
//! the stored JSON text itself, as a string, so the leaf is of what was stored (an upcast or a
//! re-serialisation can never change it) and no number inside it is ever re-read as a double.
//!
//! With every value a string and the keys fixed, JCS reduces to: keys sorted by UTF-16 code
//! units (here plain ASCII order), no whitespace, and strings escaped as ECMAScript's
//! `JSON.stringify` does (`"` and `\`, control characters below U+0020, nothing else).

/// One entry of the log, as stored: the event at feed position `position`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<'a> {
    /// The feed position, from 1.
    pub position: i64,
    pub aggregate_type: &'a str,
    pub aggregate_id: &'a str,
    pub sequence: i64,
    pub event_type: &'a str,
    pub event_version: &'a str,
    /// The domain time, RFC 3339 in UTC with exactly six fractional digits and `Z`
    /// (`2026-11-27T05:38:43.123456Z`), as the feed shows it.
    pub occurred_at: &'a str,
    /// The owner, when the event has one.
    pub user_id: Option<i64>,
    /// The payload's JSON text exactly as stored.
    pub payload: &'a str,
}

impl Entry<'_> {
    /// The leaf bytes: the canonical JSON object, keys in order.
    pub fn leaf(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_leaf(&mut out);
        out
    }

    /// Writes the leaf bytes into `out` (cleared first): the follower and `verify` reuse one
    /// buffer for every entry. No allocation beyond `out`'s growth.
    pub fn write_leaf(&self, out: &mut Vec<u8>) {
        out.clear();
        out.reserve(200 + self.payload.len() * 11 / 10);
        let mut digits = Digits::default();
        out.push(b'{');
        field(out, "aggregate_id", Some(self.aggregate_id));
        field(out, "aggregate_type", Some(self.aggregate_type));
        // `event_id` is `type:id:sequence`; ':' and digits need no escape, so its JCS string is
        // the concatenation of its parts' escapes.
        out.extend_from_slice(b"\"event_id\":\"");
        jcs_content(out, self.aggregate_type);
        out.push(b':');
        jcs_content(out, self.aggregate_id);
        out.push(b':');
        out.extend_from_slice(digits.of(self.sequence));
        out.extend_from_slice(b"\",");
        field(out, "event_type", Some(self.event_type));
        field(out, "event_version", Some(self.event_version));
        field(out, "occurred_at", Some(self.occurred_at));
        field(out, "payload", Some(self.payload));
        number(out, "position", self.position, &mut digits);
        number(out, "sequence", self.sequence, &mut digits);
        match self.user_id {
            Some(u) => number(out, "user_id", u, &mut digits),
            None => field(out, "user_id", None),
        }
        out.pop(); // the last field's comma
        out.push(b'}');
    }
}

/// A 64-bit integer's decimal digits, written without allocating.
#[derive(Default)]
struct Digits([u8; 20]);

impl Digits {
    fn of(&mut self, n: i64) -> &[u8] {
        let mut v = n.unsigned_abs();
        let mut at = self.0.len();
        loop {
            at -= 1;
            self.0[at] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        if n < 0 {
            // 20 digits hold u64::MAX; a negative i64 has at most 19, so there is room.
            at -= 1;
            self.0[at] = b'-';
        }
        &self.0[at..]
    }
}

/// `"key":"digits",`: an integer as a decimal string.
fn number(out: &mut Vec<u8>, key: &str, value: i64, digits: &mut Digits) {
    out.push(b'"');
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"\":\"");
    out.extend_from_slice(digits.of(value));
    out.extend_from_slice(b"\",");
}

/// `"key":value,` with the value a JCS string or `null`.
fn field(out: &mut Vec<u8>, key: &str, value: Option<&str>) {
    out.push(b'"');
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"\":");
    match value {
        Some(v) => {
            out.push(b'"');
            jcs_content(out, v);
            out.push(b'"');
        }
        None => out.extend_from_slice(b"null"),
    }
    out.push(b',');
}

/// A string as RFC 8785 section 3.2.2.2 writes it, with its quotes.
#[cfg(test)]
fn jcs_string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    jcs_content(out, s);
    out.push(b'"');
}

/// A string's content as RFC 8785 section 3.2.2.2 writes it: `"` and `\` and the control
/// characters below U+0020 escaped (the short forms where ECMAScript has them, else `\u00xx`),
/// everything else as is. Every byte that needs an escape is ASCII, so the runs between them are
/// copied whole, and UTF-8 sequences are never split.
fn jcs_content(out: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    let mut run = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let short: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            b'\t' => b"\\t",
            b'\n' => b"\\n",
            0x0c => b"\\f",
            b'\r' => b"\\r",
            0x00..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[run..i]);
        run = i + 1;
        if short.is_empty() {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 0xf)]);
        } else {
            out.extend_from_slice(short);
        }
    }
    out.extend_from_slice(&bytes[run..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry<'a>(payload: &'a str, user_id: Option<i64>) -> Entry<'a> {
        Entry {
            position: 9_007_199_254_740_993, // 2^53 + 1: not a double
            aggregate_type: "Transfer",
            aggregate_id: "01JABCDEFGHJKMNPQRSTVWXYZ0",
            sequence: 3,
            event_type: "TransferCommitted",
            event_version: "1",
            occurred_at: "2026-11-27T05:38:43.123456Z",
            user_id,
            payload,
        }
    }

    #[test]
    fn the_leaf_is_canonical_json_with_integers_as_strings() {
        let leaf = entry(r#"{"TransferCommitted": {"at": "x"}}"#, Some(42)).leaf();
        assert_eq!(
            String::from_utf8(leaf).unwrap(),
            concat!(
                r#"{"aggregate_id":"01JABCDEFGHJKMNPQRSTVWXYZ0","aggregate_type":"Transfer","#,
                r#""event_id":"Transfer:01JABCDEFGHJKMNPQRSTVWXYZ0:3","#,
                r#""event_type":"TransferCommitted","event_version":"1","#,
                r#""occurred_at":"2026-11-27T05:38:43.123456Z","#,
                r#""payload":"{\"TransferCommitted\": {\"at\": \"x\"}}","#,
                r#""position":"9007199254740993","sequence":"3","user_id":"42"}"#
            )
        );
    }

    #[test]
    fn an_event_without_owner_has_a_null_user() {
        let leaf = String::from_utf8(entry("{}", None).leaf()).unwrap();
        assert!(leaf.ends_with(r#""user_id":null}"#), "{leaf}");
    }

    #[test]
    fn strings_are_escaped_as_jcs_says_and_nothing_more() {
        let mut out = Vec::new();
        jcs_string(
            &mut out,
            "a\"b\\c\u{8}\t\n\u{c}\r\u{1}\u{1f} é€😀\u{7f}\u{2028}/",
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "\"a\\\"b\\\\c\\b\\t\\n\\f\\r\\u0001\\u001f é€😀\u{7f}\u{2028}/\""
        );
    }

    #[test]
    fn strings_escape_as_an_independent_json_writer_escapes_them() {
        // serde_json escapes exactly as ECMAScript's JSON.stringify does for valid UTF-8.
        let mut every_control: String = (0u8..0x20).map(char::from).collect();
        every_control.push_str("\"\\/\u{7f}");
        for s in [
            "",
            "plain",
            "\"\"",
            "\\",
            "end\"",
            "\"start",
            "mid\ndle\ttabs\r",
            "é€😀\u{2028}\u{2029}\u{feff}",
            every_control.as_str(),
            r#"{"TransferCreated":{"amount":"1.5","note":"a \"q\" \\ b"}}"#,
        ] {
            let mut out = Vec::new();
            jcs_string(&mut out, s);
            assert_eq!(
                String::from_utf8(out).unwrap(),
                serde_json::to_string(s).unwrap()
            );
        }
    }

    #[test]
    fn integers_are_their_decimal_digits() {
        let mut digits = Digits::default();
        for n in [
            0,
            7,
            10,
            42,
            -1,
            -10,
            i64::MAX,
            i64::MIN,
            9_007_199_254_740_993,
        ] {
            assert_eq!(digits.of(n), n.to_string().as_bytes());
        }
    }

    #[test]
    fn the_leaf_is_the_same_written_into_a_used_buffer() {
        let e = entry(r#"{"a":"\n"}"#, None);
        let mut buf = b"left over from the last entry, longer than the leaf itself".repeat(9);
        e.write_leaf(&mut buf);
        assert_eq!(buf, e.leaf());
        let parsed: serde_json::Value = serde_json::from_slice(&buf).unwrap();
        assert_eq!(parsed["payload"], r#"{"a":"\n"}"#);
        assert_eq!(parsed["position"], "9007199254740993");
    }

    #[test]
    fn the_payload_is_kept_byte_for_byte() {
        // Two payloads equal as JSON values but not as stored text give two leaves.
        let a = entry(r#"{"a":1}"#, Some(1)).leaf();
        let b = entry(r#"{"a": 1}"#, Some(1)).leaf();
        assert_ne!(a, b);
    }
}
