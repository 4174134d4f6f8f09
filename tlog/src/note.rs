//! C2SP signed notes (`c2sp.org/signed-note`) with Ed25519, and their key strings.
//!
//! A note is its text (UTF-8, ending in a newline), a blank line, then one signature line per
//! signer: `— <key name> <base64(key id ‖ signature)>`, the key id being the first four bytes
//! of SHA-256(key name ‖ "\n" ‖ 0x01 ‖ public key) and the signature Ed25519's over the text.
//! A verifier key reads `<name>+<key id, 8 hex digits>+<base64(0x01 ‖ public key)>`; a signer
//! key `PRIVATE+KEY+<name>+<key id>+<base64(0x01 ‖ seed)>` (the form Go's `note` package reads).

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use ed25519_dalek::{Signature, Signer as _, SigningKey, Verifier as _, VerifyingKey};

use crate::invariant;
use sha2::{Digest, Sha256};

/// The algorithm byte of Ed25519 keys.
const ALG_ED25519: u8 = 0x01;

/// What a signature line starts with: an em dash and a space.
const SIG_PREFIX: &str = "\u{2014} ";

/// Why a key or a note was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoteError {
    /// A key name that is empty, holds a `+` or a space.
    BadName,
    /// A key string that does not parse, or whose id does not match its name and key.
    BadKey,
    /// A text that does not end in a newline or holds a blank line.
    BadText,
    /// A note without the blank line and signature block, or with a malformed signature line.
    Malformed,
    /// A signature by this verifier's key that does not verify: the text or the signature was
    /// changed.
    BadSignature,
    /// No signature by this verifier's name and key id.
    NoSignature,
}

impl std::fmt::Display for NoteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::BadName => "a key name must be non-empty, without '+' or spaces",
            Self::BadKey => "malformed key, or its id does not match its name and key",
            Self::BadText => "a note's text must end in a newline and hold no blank line",
            Self::Malformed => "malformed signed note",
            Self::BadSignature => "the signature does not verify",
            Self::NoSignature => "no signature by the expected key",
        })
    }
}

impl std::error::Error for NoteError {}

fn check_name(name: &str) -> Result<(), NoteError> {
    if name.is_empty() || name.contains('+') || name.chars().any(char::is_whitespace) {
        return Err(NoteError::BadName);
    }
    Ok(())
}

/// The key id: the first four bytes of SHA-256(name ‖ "\n" ‖ 0x01 ‖ public key).
fn key_id(name: &str, public: &VerifyingKey) -> u32 {
    let mut h = Sha256::new();
    h.update(name.as_bytes());
    h.update(b"\n");
    h.update([ALG_ED25519]);
    h.update(public.as_bytes());
    let d = h.finalize();
    u32::from_be_bytes([d[0], d[1], d[2], d[3]])
}

/// `0x01 ‖ key` in base64 back to the 32 key bytes.
fn decode_key(b64: &str) -> Result<[u8; 32], NoteError> {
    let raw = STANDARD.decode(b64).map_err(|_| NoteError::BadKey)?;
    match raw.split_first() {
        Some((&ALG_ED25519, key)) => key.try_into().map_err(|_| NoteError::BadKey),
        _ => Err(NoteError::BadKey),
    }
}

fn encode_key(key: &[u8; 32]) -> String {
    let mut raw = Vec::with_capacity(33);
    raw.push(ALG_ED25519);
    raw.extend_from_slice(key);
    STANDARD.encode(raw)
}

/// A signing identity: a key name (the log's origin) and an Ed25519 key.
#[derive(Clone)]
pub struct Signer {
    name: String,
    id: u32,
    key: SigningKey,
}

impl std::fmt::Debug for Signer {
    /// Never prints the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Signer({}+{:08x})", self.name, self.id)
    }
}

/// Two signers are the same identity when their names and keys are.
impl PartialEq for Signer {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.key.verifying_key() == other.key.verifying_key()
    }
}

impl Eq for Signer {}

impl Signer {
    /// The signer of `name` with the Ed25519 key of this 32-byte seed.
    pub fn from_seed(name: &str, seed: [u8; 32]) -> Result<Self, NoteError> {
        check_name(name)?;
        let key = SigningKey::from_bytes(&seed);
        let id = key_id(name, &key.verifying_key());
        Ok(Self {
            name: name.to_owned(),
            id,
            key,
        })
    }

    /// Reads `PRIVATE+KEY+<name>+<id>+<base64(0x01 ‖ seed)>` (surrounding whitespace ignored).
    pub fn parse(skey: &str) -> Result<Self, NoteError> {
        let rest = skey
            .trim()
            .strip_prefix("PRIVATE+KEY+")
            .ok_or(NoteError::BadKey)?;
        // The base64 key may itself hold a '+': it is everything after the second one.
        let mut parts = rest.splitn(3, '+');
        let (Some(name), Some(id), Some(key)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(NoteError::BadKey);
        };
        let signer = Self::from_seed(name, decode_key(key)?)?;
        if u32::from_str_radix(id, 16).ok() != Some(signer.id) || id.len() != 8 {
            return Err(NoteError::BadKey);
        }
        Ok(signer)
    }

    /// The signer key string [`Signer::parse`] reads.
    pub fn to_skey(&self) -> String {
        format!(
            "PRIVATE+KEY+{}+{:08x}+{}",
            self.name,
            self.id,
            encode_key(&self.key.to_bytes())
        )
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The signing identity of cell `cell` of a ledger whose key this is (a cell map, ADR 0017):
    /// named [`crate::origin`]`(name, cell)`, with its own Ed25519 key derived from this one's
    /// seed (SHA-256 of a fixed label, the seed and the cell), so each cell's log has an origin
    /// and a key of its own while an operator keeps one key file.
    pub fn for_cell(&self, cell: u16) -> Result<Self, NoteError> {
        let mut h = Sha256::new();
        h.update(b"ledger tamper-evident log cell key\0");
        h.update(self.key.to_bytes());
        h.update(cell.to_be_bytes());
        let seed: [u8; 32] = h.finalize().into();
        Self::from_seed(&crate::origin(&self.name, Some(&cell.to_string())), seed)
    }

    /// The matching verifier.
    pub fn verifier(&self) -> Verifier {
        Verifier {
            name: self.name.clone(),
            id: self.id,
            key: self.key.verifying_key(),
        }
    }

    /// The signed note of `text` (which must end in a newline and hold no blank line).
    pub fn sign(&self, text: &str) -> Result<String, NoteError> {
        if !text.ends_with('\n') || text.contains("\n\n") {
            return Err(NoteError::BadText);
        }
        let signature = self.key.sign(text.as_bytes());
        let mut blob = Vec::with_capacity(68);
        blob.extend_from_slice(&self.id.to_be_bytes());
        blob.extend_from_slice(&signature.to_bytes());
        let note = format!(
            "{text}\n{SIG_PREFIX}{} {}\n",
            self.name,
            STANDARD.encode(blob)
        );
        // Postcondition: the note opens with this signer's own verifier, to exactly `text`. A
        // checkpoint nobody can verify must never be published (one verification per signed
        // checkpoint, not per entry).
        let opened = self.verifier().open(&note);
        invariant!(
            opened == Ok(text),
            "a note signed by {} does not open with its own key: {opened:?}",
            self.name
        );
        Ok(note)
    }
}

/// A verifying identity: a key name, its id and the Ed25519 public key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verifier {
    name: String,
    id: u32,
    key: VerifyingKey,
}

impl Verifier {
    /// Reads `<name>+<id>+<base64(0x01 ‖ public key)>` (surrounding whitespace ignored).
    pub fn parse(vkey: &str) -> Result<Self, NoteError> {
        let mut parts = vkey.trim().splitn(3, '+');
        let (Some(name), Some(id), Some(key)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(NoteError::BadKey);
        };
        check_name(name)?;
        let key = VerifyingKey::from_bytes(&decode_key(key)?).map_err(|_| NoteError::BadKey)?;
        if id.len() != 8 || u32::from_str_radix(id, 16).ok() != Some(key_id(name, &key)) {
            return Err(NoteError::BadKey);
        }
        Ok(Self {
            name: name.to_owned(),
            id: key_id(name, &key),
            key,
        })
    }

    /// The verifier key string [`Verifier::parse`] reads.
    pub fn to_vkey(&self) -> String {
        format!(
            "{}+{:08x}+{}",
            self.name,
            self.id,
            encode_key(self.key.as_bytes())
        )
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The text of `note` if it carries a valid signature by this key. Signatures by other keys
    /// are ignored; one by this key's name and id that does not verify refuses the note.
    pub fn open<'n>(&self, note: &'n str) -> Result<&'n str, NoteError> {
        if !note.ends_with('\n') {
            return Err(NoteError::Malformed);
        }
        let split = note.rfind("\n\n").ok_or(NoteError::Malformed)?;
        let (text, sigs) = (&note[..split + 1], &note[split + 2..]);
        let mut verified = false;
        for line in sigs.lines() {
            let rest = line.strip_prefix(SIG_PREFIX).ok_or(NoteError::Malformed)?;
            let (name, b64) = rest.split_once(' ').ok_or(NoteError::Malformed)?;
            let blob = STANDARD.decode(b64).map_err(|_| NoteError::Malformed)?;
            if blob.len() < 5 {
                return Err(NoteError::Malformed);
            }
            let id = u32::from_be_bytes([blob[0], blob[1], blob[2], blob[3]]);
            if name != self.name || id != self.id {
                continue;
            }
            let signature =
                Signature::from_slice(&blob[4..]).map_err(|_| NoteError::BadSignature)?;
            self.key
                .verify(text.as_bytes(), &signature)
                .map_err(|_| NoteError::BadSignature)?;
            verified = true;
        }
        if verified {
            Ok(text)
        } else {
            Err(NoteError::NoSignature)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer(name: &str, byte: u8) -> Signer {
        Signer::from_seed(name, [byte; 32]).unwrap()
    }

    #[test]
    fn a_signed_note_opens_with_its_key_only() {
        let s = signer("ledger.example/log", 7);
        let text = "ledger.example/log\n3\nAAAA\n";
        let note = s.sign(text).unwrap();
        assert!(note.starts_with(text));
        assert!(note.contains("\n\n\u{2014} ledger.example/log "));
        assert_eq!(s.verifier().open(&note), Ok(text));
        // Another key under the same name: its id differs, so the note carries none of its.
        let other = signer("ledger.example/log", 8).verifier();
        assert_eq!(other.open(&note), Err(NoteError::NoSignature));
        // The same key under another name (another origin).
        assert_eq!(
            signer("other.example/log", 7).verifier().open(&note),
            Err(NoteError::NoSignature)
        );
    }

    #[test]
    fn each_cell_has_an_origin_and_a_key_of_its_own() {
        let base = signer("ledger.example/log", 7);
        let (one, two) = (base.for_cell(1).unwrap(), base.for_cell(2).unwrap());
        assert_eq!(one.name(), "ledger.example/log/cell/1");
        assert_eq!(two.name(), "ledger.example/log/cell/2");
        assert_ne!(one.verifier().key, two.verifier().key);
        assert_ne!(one.verifier().key, base.verifier().key);
        // Derived, so the same key file gives the same identities at every start.
        assert_eq!(base.for_cell(2).unwrap(), two);
        let note = one.sign("ledger.example/log/cell/1\n1\nroot\n").unwrap();
        assert!(one.verifier().open(&note).is_ok());
        assert_eq!(two.verifier().open(&note), Err(NoteError::NoSignature));
    }

    #[test]
    fn any_flipped_bit_is_refused() {
        let s = signer("ledger.example/log", 1);
        let note = s.sign("ledger.example/log\n10\nroot\n").unwrap();
        let v = s.verifier();
        let bytes = note.as_bytes();
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut bad = bytes.to_vec();
                bad[i] ^= 1 << bit;
                let Ok(bad) = String::from_utf8(bad) else {
                    continue;
                };
                assert!(v.open(&bad).is_err(), "byte {i} bit {bit} accepted");
            }
        }
    }

    #[test]
    fn keys_round_trip_and_checked_ids() {
        let s = signer("ledger.example/log", 3);
        let skey = s.to_skey();
        assert!(skey.starts_with("PRIVATE+KEY+ledger.example/log+"));
        let back = Signer::parse(&format!("{skey}\n")).unwrap();
        assert_eq!(back.verifier(), s.verifier());
        let vkey = s.verifier().to_vkey();
        assert_eq!(Verifier::parse(&vkey).unwrap(), s.verifier());
        // A vkey whose id was altered, or whose name was, is refused.
        let (name, rest) = vkey.split_once('+').unwrap();
        let altered_id = format!("{name}+00000000{}", &rest[8..]);
        assert_eq!(Verifier::parse(&altered_id), Err(NoteError::BadKey));
        assert_eq!(Verifier::parse(&format!("x{vkey}")), Err(NoteError::BadKey));
        assert_eq!(
            Signer::from_seed("a b", [0; 32]).err(),
            Some(NoteError::BadName)
        );
        assert_eq!(
            Signer::from_seed("", [0; 32]).err(),
            Some(NoteError::BadName)
        );
    }

    /// Go's `note` package documents this example key pair and note (golang.org/x/mod/sumdb/note,
    /// `ExampleSign`); signing with it must give the same bytes, Ed25519 being deterministic.
    #[test]
    fn the_go_note_package_example_opens() {
        let vkey = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW";
        let skey = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz";
        let signer = Signer::parse(skey).unwrap();
        assert_eq!(signer.verifier().to_vkey(), vkey);
        let text = "If you think cryptography is the answer to your problem,\n\
                    then you don't know what your problem is.\n";
        let note = signer.sign(text).unwrap();
        let expected = "If you think cryptography is the answer to your problem,\n\
                        then you don't know what your problem is.\n\
                        \n\
                        \u{2014} PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n";
        assert_eq!(note, expected);
        assert_eq!(Verifier::parse(vkey).unwrap().open(&note), Ok(text));
    }
}
