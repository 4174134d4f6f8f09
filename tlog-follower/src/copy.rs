//! COPY's text format, read: tab-separated fields, `\N` for NULL, backslash escapes.

use std::borrow::Cow;

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
    use super::field;

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
