//! COPY's text format, for the projector's bulk reads and writes: decoding the event log's rows
//! and encoding whole transfer rows, which the encoder sends with one `COPY ... FROM STDIN`.

use std::borrow::Cow;

use chrono::{DateTime, Utc};
use sqlx::{Postgres, Transaction};

use crate::error::ProjectionError;
use crate::log::BatchEvent;
use crate::rows::TransferRow;

/// Decodes one line of `eventlog::batches::copy_events`'s stream: `eventlog::batches::EventRow`'s
/// columns in COPY's text format.
pub(crate) fn event_from_copy_line(line: &[u8]) -> Result<BatchEvent, ProjectionError> {
    let bad = |column: &str| {
        ProjectionError::Bulk(format!("unreadable {column} in an event row from COPY"))
    };
    let mut fields = line.split(|b| *b == b'\t');
    let mut next = |name: &str| {
        let raw = fields.next().ok_or_else(|| bad(name))?;
        copy_unescape(raw).ok_or_else(|| bad(name))
    };
    let int = |text: Cow<'_, str>, name: &str| text.parse::<i64>().map_err(|_| bad(name));
    let tx_id = int(next("tx_id")?, "tx_id")?;
    let global_position = int(next("global_position")?, "global_position")?;
    let aggregate_type = next("aggregate_type")?;
    let aggregate_id = next("aggregate_id")?;
    let sequence = int(next("sequence")?, "sequence")?;
    let event_version = next("event_version")?;
    let payload = next("payload")?;
    let event = BatchEvent::transfer_event(
        &aggregate_type,
        &aggregate_id,
        sequence,
        &event_version,
        &payload,
    )?;
    Ok(BatchEvent {
        tx_id,
        global_position,
        aggregate_type: aggregate_type.into_owned(),
        aggregate_id: aggregate_id.into_owned(),
        sequence,
        event,
    })
}

/// One value of COPY's text format, unescaped (borrowed when it holds no backslash). `None` for
/// bytes that are not UTF-8 or an escape this reader does not expect (every column read here is
/// NOT NULL text or a number).
fn copy_unescape(raw: &[u8]) -> Option<Cow<'_, str>> {
    if !raw.contains(&b'\\') {
        return std::str::from_utf8(raw).ok().map(Cow::Borrowed);
    }
    let mut out = Vec::with_capacity(raw.len());
    let mut bytes = raw.iter();
    while let Some(&b) = bytes.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        out.push(match bytes.next()? {
            b'\\' => b'\\',
            b't' => b'\t',
            b'n' => b'\n',
            b'r' => b'\r',
            b'b' => 0x08,
            b'f' => 0x0c,
            b'v' => 0x0b,
            _ => return None,
        });
    }
    String::from_utf8(out).ok().map(Cow::Owned)
}

/// Whole transfer rows, as [`CopyText::transfer`] writes them.
pub(crate) const COPY_TRANSFERS: &str =
    "COPY transfers_view (req_id, user_id, from_account, to_account, asset,
    amount, cid, state, state_id, failure_code, failure_message, created_at, updated_at,
    last_sequence) FROM STDIN";

/// Rows in COPY's text format: tab-separated, escaped, `\N` for NULL, one line per row.
pub(crate) struct CopyText {
    data: Vec<u8>,
}

impl CopyText {
    pub fn with_capacity(bytes: usize) -> Self {
        Self {
            data: Vec::with_capacity(bytes),
        }
    }

    fn text(&mut self, value: &str) {
        for b in value.bytes() {
            match b {
                b'\\' => self.data.extend_from_slice(b"\\\\"),
                b'\t' => self.data.extend_from_slice(b"\\t"),
                b'\n' => self.data.extend_from_slice(b"\\n"),
                b'\r' => self.data.extend_from_slice(b"\\r"),
                _ => self.data.push(b),
            }
        }
        self.data.push(b'\t');
    }

    fn opt_text(&mut self, value: Option<&str>) {
        match value {
            Some(v) => self.text(v),
            None => self.data.extend_from_slice(b"\\N\t"),
        }
    }

    /// A value whose text needs no escaping (numbers).
    fn display(&mut self, value: impl std::fmt::Display) {
        use std::io::Write;
        // write! into a Vec cannot fail.
        let _ = write!(self.data, "{value}\t");
    }

    fn int(&mut self, value: i64) {
        self.display(value);
    }

    /// Microseconds, cut as sqlx cuts a bound time (PostgreSQL would round more digits), so a
    /// row written here equals the live projector's.
    fn time(&mut self, at: DateTime<Utc>) {
        self.display(at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true));
    }

    /// One whole transfer row, in [`COPY_TRANSFERS`]'s columns.
    pub fn transfer(&mut self, r: &TransferRow) {
        self.text(&r.req_id);
        self.int(r.user_id);
        self.text(&r.from_account);
        self.text(&r.to_account);
        self.text(&r.asset);
        self.display(r.amount);
        self.opt_text(r.cid.as_deref());
        self.text(&r.state);
        self.int(i64::from(r.state_id));
        self.opt_text(r.failure_code.as_deref());
        self.opt_text(r.failure_message.as_deref());
        self.time(r.created_at);
        self.time(r.updated_at);
        self.int(r.last_sequence);
        self.end_row();
    }

    /// Ends a row: the last value's tab becomes the line's end.
    fn end_row(&mut self) {
        if let Some(last) = self.data.last_mut() {
            *last = b'\n';
        }
    }

    pub async fn send(
        self,
        tx: &mut Transaction<'static, Postgres>,
        statement: &str,
    ) -> Result<(), sqlx::Error> {
        if self.data.is_empty() {
            return Ok(());
        }
        let mut copy = tx.copy_in_raw(statement).await?;
        // A failed send drops `copy`, which aborts the COPY; the transaction then rolls back.
        copy.send(self.data).await?;
        copy.finish().await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::copy_unescape;

    #[test]
    fn copy_text_values_are_unescaped_as_postgres_escapes_them() {
        assert_eq!(copy_unescape(b"plain").as_deref(), Some("plain"));
        // A JSON payload holding a quote, a backslash and a tab inside a string.
        assert_eq!(
            copy_unescape(br#"{"m":"a \\"q\\" \\\\ \\t"}"#).as_deref(),
            Some(r#"{"m":"a \"q\" \\ \t"}"#)
        );
        assert_eq!(copy_unescape(b"a\\tb\\nc").as_deref(), Some("a\tb\nc"));
        // NULL (\N) or an unknown escape is not a value this reader accepts.
        assert_eq!(copy_unescape(b"\\N"), None);
        assert_eq!(copy_unescape(b"x\\"), None);
        assert_eq!(copy_unescape(b"\xff"), None);
    }
}
