//! COPY's text format, read: tab-separated fields, `\N` for NULL, backslash escapes; lines
//! streamed from `copy_out_raw` ([`for_each_line`]) and an entry's fields ([`CopyEntry`]),
//! borrowed from the line wherever COPY wrote no escape. The follower and `verify` read the log
//! this way: no row decoder, no allocation per field.

use std::borrow::Cow;

use futures_util::{Stream, StreamExt};
use tlog::Entry;

use crate::leaf_time::LeafTime;

/// Calls `each` with every line of a COPY text stream, without its newline, in order. Once
/// `each` answers `Ok(false)` (enough) or an error, the rest of the stream is drained unread,
/// so the connection ends the COPY cleanly; that error is returned inside `Ok`.
pub(crate) async fn for_each_line<S, B, E>(
    mut stream: S,
    mut each: impl FnMut(&[u8]) -> Result<bool, E>,
) -> Result<Result<(), E>, sqlx::Error>
where
    S: Stream<Item = Result<B, sqlx::Error>> + Unpin,
    B: AsRef<[u8]>,
{
    let mut outcome = Ok(());
    let mut going = true;
    // A line split across chunks waits in `carry` for the rest of it.
    let mut carry: Vec<u8> = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        if !going {
            continue;
        }
        let mut rest = chunk.as_ref();
        while let Some(end) = memchr::memchr(b'\n', rest) {
            let line = if carry.is_empty() {
                &rest[..end]
            } else {
                carry.extend_from_slice(&rest[..end]);
                &carry[..]
            };
            rest = &rest[end + 1..];
            match each(line) {
                Ok(true) => carry.clear(),
                Ok(false) => going = false,
                Err(e) => {
                    outcome = Err(e);
                    going = false;
                }
            }
            if !going {
                break;
            }
        }
        if going {
            carry.extend_from_slice(rest);
        }
    }
    Ok(outcome)
}

/// The next field of a COPY line (see [`field`]), named for the message when it is missing or
/// malformed.
pub(crate) fn next_field<'a>(
    fields: &mut impl Iterator<Item = &'a [u8]>,
    name: &str,
) -> Result<Option<Cow<'a, str>>, String> {
    let raw = fields.next().ok_or_else(|| format!("no {name}"))?;
    field(raw).map_err(|()| format!("bad {name}"))
}

/// The next field, which must not be NULL.
pub(crate) fn next_text<'a>(
    fields: &mut impl Iterator<Item = &'a [u8]>,
    name: &str,
) -> Result<Cow<'a, str>, String> {
    next_field(fields, name)?.ok_or_else(|| format!("null {name}"))
}

/// The next field as an integer, or NULL.
pub(crate) fn next_int<'a>(
    fields: &mut impl Iterator<Item = &'a [u8]>,
    name: &str,
) -> Result<Option<i64>, String> {
    next_field(fields, name)?
        .map(|s| s.parse::<i64>().map_err(|_| format!("bad {name}")))
        .transpose()
}

/// An entry as a COPY line of `ENTRY_COLUMNS` gives it.
#[derive(Debug)]
pub(crate) struct CopyEntry<'a> {
    pub position: i64,
    pub aggregate_type: Cow<'a, str>,
    pub aggregate_id: Cow<'a, str>,
    pub sequence: i64,
    pub event_type: Cow<'a, str>,
    pub event_version: Cow<'a, str>,
    pub occurred_at: LeafTime,
    pub user_id: Option<i64>,
    pub payload: Cow<'a, str>,
}

impl<'a> CopyEntry<'a> {
    /// Reads `ENTRY_COLUMNS`' fields, in their order, from `fields`.
    pub(crate) fn read(fields: &mut impl Iterator<Item = &'a [u8]>) -> Result<Self, String> {
        let position = next_int(fields, "position")?.ok_or("null position")?;
        let aggregate_type = next_text(fields, "aggregate_type")?;
        let aggregate_id = next_text(fields, "aggregate_id")?;
        let sequence = next_int(fields, "sequence")?.ok_or("null sequence")?;
        Ok(Self {
            position,
            aggregate_type,
            aggregate_id,
            sequence,
            event_type: next_text(fields, "event_type")?,
            event_version: next_text(fields, "event_version")?,
            occurred_at: LeafTime::from_db(&next_text(fields, "occurred_at")?)?,
            user_id: next_int(fields, "user_id")?,
            payload: next_text(fields, "payload")?,
        })
    }

    /// The entry's fields for `tlog`.
    pub(crate) fn entry(&self) -> Entry<'_> {
        Entry {
            position: self.position,
            aggregate_type: &self.aggregate_type,
            aggregate_id: &self.aggregate_id,
            sequence: self.sequence,
            event_type: &self.event_type,
            event_version: &self.event_version,
            occurred_at: self.occurred_at.as_str(),
            user_id: self.user_id,
            payload: &self.payload,
        }
    }
}

/// A COPY line's fields.
pub(crate) fn fields(line: &[u8]) -> impl Iterator<Item = &[u8]> {
    line.split(|b| *b == b'\t')
}

/// One field: `None` for NULL, the unescaped text otherwise; `Err` when it is not UTF-8 or holds
/// an escape COPY never writes.
pub(crate) fn field(raw: &[u8]) -> Result<Option<Cow<'_, str>>, ()> {
    if raw == b"\\N" {
        return Ok(None);
    }
    if !raw.contains(&b'\\') {
        return std::str::from_utf8(raw)
            .map(|s| Some(Cow::Borrowed(s)))
            .map_err(|_| ());
    }
    let mut out = Vec::with_capacity(raw.len());
    let mut bytes = raw.iter();
    while let Some(&b) = bytes.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        out.push(match bytes.next().ok_or(())? {
            b'\\' => b'\\',
            b't' => b'\t',
            b'n' => b'\n',
            b'r' => b'\r',
            b'b' => 0x08,
            b'f' => 0x0c,
            b'v' => 0x0b,
            _ => return Err(()),
        });
    }
    String::from_utf8(out)
        .map(|s| Some(Cow::Owned(s)))
        .map_err(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_split_across_chunks_are_read_whole_and_the_rest_drained() {
        let chunks: Vec<Result<&[u8], sqlx::Error>> =
            vec![Ok(b"a\tb\nc"), Ok(b"d\n"), Ok(b"e\nf\ng\n"), Ok(b"h\n")];
        let mut seen = Vec::new();
        let outcome = for_each_line(futures_util::stream::iter(chunks), |line| {
            seen.push(String::from_utf8(line.to_vec()).unwrap());
            Ok::<_, ()>(seen.len() < 4)
        })
        .await
        .unwrap();
        assert_eq!(outcome, Ok(()));
        assert_eq!(seen, ["a\tb", "cd", "e", "f"]);
    }

    #[test]
    fn an_entry_borrows_its_fields_unless_copy_escaped_them() {
        let line =
            b"7\tTransfer\tR1\t2\tSourceWithdrawn\t1\t2026-11-27 00:00:00.25\t\\N\t{\"a\\\\b\": 1}";
        let e = CopyEntry::read(&mut fields(line)).unwrap();
        assert_eq!((e.position, e.sequence, e.user_id), (7, 2, None));
        assert_eq!(e.occurred_at.as_str(), "2026-11-27T00:00:00.250000Z");
        assert!(matches!(e.aggregate_id, Cow::Borrowed("R1")));
        assert_eq!(e.payload, "{\"a\\b\": 1}");
        assert!(matches!(e.payload, Cow::Owned(_)));
        assert_eq!(
            CopyEntry::read(&mut fields(b"x\tTransfer")).unwrap_err(),
            "bad position"
        );
        assert_eq!(
            CopyEntry::read(&mut fields(b"1")).unwrap_err(),
            "no aggregate_type"
        );
    }

    #[test]
    fn fields_unescape_as_copy_wrote_them() {
        assert_eq!(field(b"\\N"), Ok(None));
        assert_eq!(field(b"plain").unwrap().unwrap(), "plain");
        assert_eq!(
            field(b"a\\tb\\nc\\\\d\\r").unwrap().unwrap(),
            "a\tb\nc\\d\r"
        );
        assert_eq!(field(b"bad\\q"), Err(()));
    }
}
