//! C2SP tlog-checkpoint bodies (`c2sp.org/tlog-checkpoint`): three lines, the log's origin, the
//! tree size in decimal, the root in standard base64; then optional extension lines (this
//! ledger writes none and ignores any it reads). The body is the text of a signed note.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;

use crate::hash::Hash;

/// A checkpoint: the log's origin, its size and the root of the tree of that size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub origin: String,
    pub size: u64,
    pub root: Hash,
}

impl Checkpoint {
    /// The body, ending in a newline.
    pub fn to_text(&self) -> String {
        format!(
            "{}\n{}\n{}\n",
            self.origin,
            self.size,
            STANDARD.encode(self.root)
        )
    }

    /// Reads a body; `None` unless it has the three lines in their forms (no leading zero in the
    /// size, a 32-byte root).
    pub fn parse(text: &str) -> Option<Self> {
        let body = text.strip_suffix('\n')?;
        let mut lines = body.split('\n');
        let origin = lines.next().filter(|o| !o.is_empty())?;
        let size_text = lines.next()?;
        let canonical = size_text == "0" || !size_text.starts_with('0');
        if !canonical || !size_text.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let size = size_text.parse().ok()?;
        let root = STANDARD.decode(lines.next()?).ok()?.try_into().ok()?;
        if lines.any(str::is_empty) {
            return None;
        }
        Some(Self {
            origin: origin.to_owned(),
            size,
            root,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::note::Signer;

    #[test]
    fn a_checkpoint_round_trips_and_signs() {
        let c = Checkpoint {
            origin: "ledger.example/log".into(),
            size: 10_000,
            root: [0xab; 32],
        };
        let text = c.to_text();
        assert_eq!(
            text,
            "ledger.example/log\n10000\nq6urq6urq6urq6urq6urq6urq6urq6urq6urq6urq6s=\n"
        );
        assert_eq!(Checkpoint::parse(&text), Some(c.clone()));
        let signer = Signer::from_seed("ledger.example/log", [5; 32]).unwrap();
        let note = signer.sign(&text).unwrap();
        let opened = signer.verifier().open(&note).unwrap();
        assert_eq!(Checkpoint::parse(opened), Some(c));
    }

    #[test]
    fn malformed_bodies_are_refused() {
        for bad in [
            "o\n10\nq6urq6urq6urq6urq6urq6urq6urq6urq6urq6urq6s=",
            "\n10\nq6urq6urq6urq6urq6urq6urq6urq6urq6urq6urq6s=\n",
            "o\n010\nq6urq6urq6urq6urq6urq6urq6urq6urq6urq6urq6s=\n",
            "o\n-1\nq6urq6urq6urq6urq6urq6urq6urq6urq6urq6urq6s=\n",
            "o\n10\nq6ur\n",
            "o\n10\n",
        ] {
            assert_eq!(Checkpoint::parse(bad), None, "{bad:?}");
        }
        let with_extension = "o\n0\nq6urq6urq6urq6urq6urq6urq6urq6urq6urq6urq6s=\next\n";
        assert_eq!(Checkpoint::parse(with_extension).unwrap().size, 0);
    }
}
