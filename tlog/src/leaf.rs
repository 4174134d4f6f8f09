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
        let mut out = String::with_capacity(200 + self.payload.len() * 11 / 10);
        let event_id = format!(
            "{}:{}:{}",
            self.aggregate_type, self.aggregate_id, self.sequence
        );
        out.push('{');
        field(&mut out, "aggregate_id", Some(self.aggregate_id));
        field(&mut out, "aggregate_type", Some(self.aggregate_type));
        field(&mut out, "event_id", Some(&event_id));
        field(&mut out, "event_type", Some(self.event_type));
        field(&mut out, "event_version", Some(self.event_version));
        field(&mut out, "occurred_at", Some(self.occurred_at));
        field(&mut out, "payload", Some(self.payload));
        field(&mut out, "position", Some(&self.position.to_string()));
        field(&mut out, "sequence", Some(&self.sequence.to_string()));
        let user = self.user_id.map(|u| u.to_string());
        field(&mut out, "user_id", user.as_deref());
        out.pop(); // the last field's comma
        out.push('}');
        out.into_bytes()
    }
}

/// `"key":value,` with the value a JCS string or `null`.
fn field(out: &mut String, key: &str, value: Option<&str>) {
    out.push('"');
    out.push_str(key);
    out.push_str("\":");
    match value {
        Some(v) => jcs_string(out, v),
        None => out.push_str("null"),
    }
    out.push(',');
}

/// A string as RFC 8785 section 3.2.2.2 writes it.
fn jcs_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{c}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
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
        let mut out = String::new();
        jcs_string(
            &mut out,
            "a\"b\\c\u{8}\t\n\u{c}\r\u{1}\u{1f} é€😀\u{7f}\u{2028}/",
        );
        assert_eq!(
            out,
            "\"a\\\"b\\\\c\\b\\t\\n\\f\\r\\u0001\\u001f é€😀\u{7f}\u{2028}/\""
        );
    }

    #[test]
    fn the_payload_is_kept_byte_for_byte() {
        // Two payloads equal as JSON values but not as stored text give two leaves.
        let a = entry(r#"{"a":1}"#, Some(1)).leaf();
        let b = entry(r#"{"a": 1}"#, Some(1)).leaf();
        assert_ne!(a, b);
    }
}
