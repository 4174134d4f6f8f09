//! `JwtKeys::verify_session`, the one verifier of every bearer token. The fuzzer writes a
//! token's header and claims as raw JSON text (`EXP` and `NOW` in the claims stand for a time
//! relative to the clock, so accepted tokens are reachable), and the target signs them with the
//! configured secret, as a client holding it would. Properties: a token that verifies says only
//! what its signed claims say (the `sub` as the user, `role: "admin"` as the only admin, `exp`
//! as the expiry, within the longest lifetime, an `nbf` already past, an HS256 header without
//! `crit`); the same token with any one byte changed never verifies; a raw string never
//! verifies unless it carries such claims; `mint` round-trips.
//!
//! Input: byte 0 the mode; bytes 1..5 a signed offset (seconds, little endian) for `EXP`;
//! bytes 5..7 the position and byte 7 the xor of the mutation; then the header text, a 0x00
//! byte, and the claims text (mode 1); the token text itself (mode 0); user and lifetime
//! (mode 2).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use domain::UserId;
use edge::auth::{mint, JwtKeys, Session, ADMIN_ROLE, LEEWAY_SECS, TOKEN_LIFETIME_MAX};
use jsonwebtoken::{Algorithm, EncodingKey};
use serde_json::{Map, Value};

/// The configured secret of every fuzzed token.
pub const SECRET: &[u8] = b"fuzz-secret-fuzz-secret-fuzz-secret";

fn keys() -> &'static JwtKeys {
    static KEYS: std::sync::OnceLock<JwtKeys> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| JwtKeys::new(SECRET))
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub fn check(data: &[u8]) {
    if data.len() < 8 {
        return;
    }
    let offset = i64::from(i32::from_le_bytes([data[1], data[2], data[3], data[4]]));
    let at = usize::from(u16::from_le_bytes([data[5], data[6]]));
    let xor = data[7];
    let rest = &data[8..];
    match data[0] % 3 {
        0 => {
            if let Ok(token) = std::str::from_utf8(rest) {
                if let Ok(session) = keys().verify_session(token) {
                    says_what_it_signed(token, &session);
                }
            }
        }
        1 => signed(rest, offset, at, xor),
        _ => minted(rest, offset),
    }
}

/// Mode 1: sign the fuzzer's header and claims, verify, then verify a mutated copy.
fn signed(rest: &[u8], offset: i64, at: usize, xor: u8) {
    let split = rest.iter().position(|b| *b == 0).unwrap_or(rest.len());
    let header = &rest[..split];
    let claims_raw = rest.get(split + 1..).unwrap_or_default();
    let Ok(claims_text) = std::str::from_utf8(claims_raw) else {
        return;
    };
    let now = i64::try_from(now_secs()).unwrap_or(i64::MAX);
    let claims = claims_text
        .replace("EXP", &now.saturating_add(offset).to_string())
        .replace("NOW", &now.to_string());
    let message = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header),
        URL_SAFE_NO_PAD.encode(claims.as_bytes())
    );
    let signature = jsonwebtoken::crypto::sign(
        message.as_bytes(),
        &EncodingKey::from_secret(SECRET),
        Algorithm::HS256,
    )
    .expect("HMAC signing cannot fail");
    let token = format!("{message}.{signature}");
    if let Ok(session) = keys().verify_session(&token) {
        says_what_it_signed(&token, &session);
    }
    mutated_never_verifies(&token, at, xor);
}

/// Any one byte of a signed token changed: never accepted (whether the original was or not,
/// the signature no longer covers it, or the signature itself is another).
fn mutated_never_verifies(token: &str, at: usize, xor: u8) {
    if xor == 0 || token.is_empty() {
        return;
    }
    let mut bytes = token.as_bytes().to_vec();
    let i = at % bytes.len();
    bytes[i] ^= xor;
    let Ok(mutated) = String::from_utf8(bytes) else {
        return;
    };
    assert!(
        keys().verify_session(&mutated).is_err(),
        "a token changed at byte {i} verified: {mutated}"
    );
}

/// A verified token's session against its own header and claims, decoded independently.
fn says_what_it_signed(token: &str, session: &Session) {
    let parts: Vec<&str> = token.split('.').collect();
    assert_eq!(parts.len(), 3, "a verified token has three parts: {token}");
    let object = |part: &str| -> Map<String, Value> {
        let bytes = URL_SAFE_NO_PAD
            .decode(part)
            .expect("a verified part decodes");
        serde_json::from_slice(&bytes).expect("a verified part is a JSON object")
    };
    let header = object(parts[0]);
    let claims = object(parts[1]);
    assert_eq!(header.get("alg"), Some(&Value::from("HS256")), "{header:?}");
    assert!(!header.contains_key("crit"), "{header:?}");
    let sub = claims
        .get("sub")
        .and_then(Value::as_str)
        .expect("a string sub");
    assert_eq!(sub, session.identity.user_id.to_string(), "sub is the user");
    let admin = claims.get("role").and_then(Value::as_str) == Some(ADMIN_ROLE);
    assert_eq!(session.identity.admin, admin, "only role admin is admin");
    let exp = claims
        .get("exp")
        .and_then(Value::as_u64)
        .expect("a numeric exp");
    assert_eq!(session.expires_at, UNIX_EPOCH + Duration::from_secs(exp));
    let now = now_secs();
    assert!(exp + LEEWAY_SECS >= now, "expired: {exp} at {now}");
    assert!(
        exp <= now + TOKEN_LIFETIME_MAX.as_secs() + LEEWAY_SECS + 1,
        "{exp}"
    );
    if let Some(nbf) = claims.get("nbf").filter(|v| !v.is_null()) {
        let nbf = nbf.as_u64().expect("a numeric nbf");
        assert!(
            nbf <= now + LEEWAY_SECS + 1,
            "not yet valid: {nbf} at {now}"
        );
    }
}

/// Mode 2: `mint` for a valid user and a lifetime up to the longest verifies as that user.
fn minted(rest: &[u8], offset: i64) {
    let mut raw = [0u8; 8];
    let n = rest.len().min(8);
    raw[..n].copy_from_slice(&rest[..n]);
    let Ok(user) = UserId::new(u64::from_le_bytes(raw)) else {
        return;
    };
    let admin = rest.get(8).is_some_and(|b| b & 1 == 1);
    let ttl = offset.unsigned_abs() % (TOKEN_LIFETIME_MAX.as_secs() + 1);
    let token = mint(SECRET, user, admin, Duration::from_secs(ttl.max(1)));
    let session = keys()
        .verify_session(&token)
        .expect("a minted token verifies");
    assert_eq!(session.identity.user_id, user);
    assert_eq!(session.identity.admin, admin);
    says_what_it_signed(&token, &session);
}
