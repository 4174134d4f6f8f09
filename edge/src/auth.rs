//! Bearer-token authentication: HS256 JWTs with a required `exp` at most [`TOKEN_LIFETIME_MAX`]
//! ahead, an honoured `nbf`, no `crit` header, `sub` as the decimal user id and `role: "admin"` for
//! admin routes, exposed as the `AuthUser` and `AdminUser` extractors. [`bearer_token`] is the one
//! parser of `Authorization: Bearer` values, for REST, GraphQL and the websocket alike.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::sync::Arc;

use axum::extract::{FromRef, FromRequestParts};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use domain::UserId;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use crate::error::ApiError;

/// Clock skew tolerated on `exp` and `nbf`; small, so an expired token dies quickly.
pub const LEEWAY_SECS: u64 = 5;

/// The longest a token may still be valid for when it is presented: a token whose `exp` lies
/// further ahead is refused, so a leaked token cannot live for ever (`exp = 2^64 - 1`).
pub const TOKEN_LIFETIME_MAX: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// The role claim that opens admin routes.
pub const ADMIN_ROLE: &str = "admin";

#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    sub: String,
    exp: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nbf: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    iat: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    role: Option<String>,
}

/// Who a verified token speaks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    pub user_id: UserId,
    pub admin: bool,
}

impl Identity {
    /// The caller as the core's access rule takes it (`application::access`).
    pub fn access(&self) -> application::access::Caller {
        application::access::Caller {
            user: self.user_id,
            admin: self.admin,
        }
    }
}

/// A verified token: who it speaks for, and until when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Session {
    pub identity: Identity,
    /// The token's `exp`: a stream opened with it must end then.
    pub expires_at: SystemTime,
}

/// The verifying side of the configured secret.
#[derive(Clone)]
pub struct JwtKeys {
    decoding: DecodingKey,
    validation: Validation,
}

impl std::fmt::Debug for JwtKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key is a secret: never print it, not even in a debug dump.
        f.write_str("JwtKeys(..)")
    }
}

impl JwtKeys {
    pub fn new(secret: &[u8]) -> Self {
        // One algorithm only: a token naming any other (or `none`) is refused before its
        // signature is looked at, which closes algorithm-confusion attacks.
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = LEEWAY_SECS;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp", "sub"]);
        Self {
            decoding: DecodingKey::from_secret(secret),
            validation,
        }
    }

    /// Verifies a compact JWT. Every failure is UNAUTHORIZED; the reason goes to the debug log.
    pub fn verify(&self, token: &str) -> Result<Identity, ApiError> {
        self.verify_session(token).map(|s| s.identity)
    }

    /// [`Self::verify`], keeping the token's expiry for callers that hold a stream open.
    pub fn verify_session(&self, token: &str) -> Result<Session, ApiError> {
        let refused = |why: &str| {
            tracing::debug!(why, "token refused");
            ApiError::Unauthorized
        };
        // RFC 7515 section 4.1.11: a `crit` header names extensions the recipient must
        // understand or reject the token; this verifier understands none. jsonwebtoken's
        // `Header` drops unknown members, so the raw header is read here.
        if header_has_crit(token) {
            return Err(refused("crit header"));
        }
        let data = jsonwebtoken::decode::<Claims>(token, &self.decoding, &self.validation)
            .map_err(|e| {
                tracing::debug!(error = %e, "token refused");
                ApiError::Unauthorized
            })?;
        let lifetime_max = now_secs().saturating_add(TOKEN_LIFETIME_MAX.as_secs() + LEEWAY_SECS);
        if data.claims.exp > lifetime_max {
            return Err(refused("exp beyond the longest token lifetime"));
        }
        let user_id: UserId = data
            .claims
            .sub
            .parse()
            .map_err(|_| refused("sub is not a user id"))?;
        Ok(Session {
            identity: Identity {
                user_id,
                admin: data.claims.role.as_deref() == Some(ADMIN_ROLE),
            },
            expires_at: UNIX_EPOCH + Duration::from_secs(data.claims.exp),
        })
    }
}

/// Whether the token's header is a JSON object with a `crit` member. A header that does not
/// decode is left to `jsonwebtoken`, which refuses it.
fn header_has_crit(token: &str) -> bool {
    use base64::Engine;
    let Some(header) = token.split('.').next() else {
        return false;
    };
    let Ok(bytes) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(header) else {
        return false;
    };
    serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&bytes)
        .is_ok_and(|members| members.contains_key("crit"))
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Mints an HS256 token for `user`, valid for `ttl` from now; `admin` adds `role: "admin"`.
pub fn mint(secret: &[u8], user: UserId, admin: bool, ttl: Duration) -> String {
    let now = now_secs();
    let claims = Claims {
        sub: user.to_string(),
        exp: now.saturating_add(ttl.as_secs()),
        nbf: None,
        iat: Some(now),
        role: admin.then(|| ADMIN_ROLE.to_owned()),
    };
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret),
    )
    .expect("HS256 signing with an HMAC key cannot fail")
}

/// The token of an `Authorization` value `Bearer <token>`; the one parser for every route.
pub fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    // The scheme name is case-insensitive (RFC 9110 section 11.1).
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = token.trim();
    (!token.is_empty()).then_some(token)
}

/// The bearer token of a request, if the header is well formed.
fn bearer(parts: &Parts) -> Option<&str> {
    bearer_token(parts.headers.get(AUTHORIZATION)?.to_str().ok()?)
}

fn identify(parts: &Parts, keys: &JwtKeys) -> Result<Session, ApiError> {
    let token = bearer(parts).ok_or(ApiError::Unauthorized)?;
    keys.verify_session(token)
}

/// Any authenticated caller. Rejects with 401 UNAUTHORIZED.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthUser {
    pub user_id: UserId,
    pub admin: bool,
}

impl AuthUser {
    /// The caller as the core's access rule takes it (`application::access`).
    pub fn access(&self) -> application::access::Caller {
        application::access::Caller {
            user: self.user_id,
            admin: self.admin,
        }
    }
}

/// From any state that holds the keys (`AppState` does).
impl<S> FromRequestParts<S> for AuthUser
where
    S: Send + Sync,
    Arc<JwtKeys>: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let id = identify(parts, &Arc::<JwtKeys>::from_ref(state))?.identity;
        Ok(Self {
            user_id: id.user_id,
            admin: id.admin,
        })
    }
}

/// An authenticated admin. Rejects with 401 UNAUTHORIZED without a valid token and with 403
/// FORBIDDEN for a valid token without the admin role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdminUser {
    pub user_id: UserId,
    /// The token's expiry: a stream it opened ends then.
    pub expires_at: SystemTime,
}

/// From any state that holds the keys (`AppState` does).
impl<S> FromRequestParts<S> for AdminUser
where
    S: Send + Sync,
    Arc<JwtKeys>: FromRef<S>,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let session = identify(parts, &Arc::<JwtKeys>::from_ref(state))?;
        if !session.identity.admin {
            return Err(ApiError::Forbidden);
        }
        Ok(Self {
            user_id: session.identity.user_id,
            expires_at: session.expires_at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    use serde_json::json;

    const SECRET: &[u8] = b"unit-test-secret-unit-test-secret";

    fn user(n: u64) -> UserId {
        UserId::new(n).unwrap()
    }

    fn keys() -> JwtKeys {
        JwtKeys::new(SECRET)
    }

    fn signed(alg: Algorithm, claims: &serde_json::Value, secret: &[u8]) -> String {
        jsonwebtoken::encode(&Header::new(alg), claims, &EncodingKey::from_secret(secret)).unwrap()
    }

    #[test]
    fn a_minted_token_verifies_with_its_user_and_role() {
        let token = mint(SECRET, user(7), false, Duration::from_secs(60));
        assert_eq!(
            keys().verify(&token),
            Ok(Identity {
                user_id: user(7),
                admin: false
            })
        );
        let admin = mint(SECRET, user(1), true, Duration::from_secs(60));
        assert_eq!(
            keys().verify(&admin),
            Ok(Identity {
                user_id: user(1),
                admin: true
            })
        );
    }

    #[test]
    fn atk_012_an_expired_token_is_unauthorized() {
        let exp = now_secs() - LEEWAY_SECS - 60;
        let token = signed(Algorithm::HS256, &json!({"sub": "7", "exp": exp}), SECRET);
        assert_eq!(keys().verify(&token), Err(ApiError::Unauthorized));
    }

    #[test]
    fn atk_013_a_token_signed_with_another_secret_is_unauthorized() {
        let token = mint(
            b"another-secret-another-secret-xx",
            user(7),
            true,
            Duration::from_secs(60),
        );
        assert_eq!(keys().verify(&token), Err(ApiError::Unauthorized));
    }

    #[test]
    fn a_tampered_payload_is_unauthorized() {
        let token = mint(SECRET, user(7), false, Duration::from_secs(60));
        let mut parts: Vec<&str> = token.split('.').collect();
        let forged = URL_SAFE_NO_PAD
            .encode(json!({"sub": "7", "exp": now_secs() + 60, "role": "admin"}).to_string());
        parts[1] = &forged;
        assert_eq!(keys().verify(&parts.join(".")), Err(ApiError::Unauthorized));
    }

    #[test]
    fn alg_none_is_unauthorized() {
        let header = URL_SAFE_NO_PAD.encode(r#"{"alg":"none","typ":"JWT"}"#);
        let claims = URL_SAFE_NO_PAD
            .encode(json!({"sub": "7", "exp": now_secs() + 60, "role": "admin"}).to_string());
        for token in [format!("{header}.{claims}."), format!("{header}.{claims}")] {
            assert_eq!(
                keys().verify(&token),
                Err(ApiError::Unauthorized),
                "{token}"
            );
        }
    }

    #[test]
    fn hs512_is_unauthorized_even_with_the_right_secret() {
        let token = signed(
            Algorithm::HS512,
            &json!({"sub": "7", "exp": now_secs() + 60}),
            SECRET,
        );
        assert_eq!(keys().verify(&token), Err(ApiError::Unauthorized));
    }

    #[test]
    fn a_token_without_exp_is_unauthorized() {
        let token = signed(Algorithm::HS256, &json!({"sub": "7"}), SECRET);
        assert_eq!(keys().verify(&token), Err(ApiError::Unauthorized));
    }

    #[test]
    fn a_string_exp_is_unauthorized() {
        let exp = (now_secs() + 60).to_string();
        let token = signed(Algorithm::HS256, &json!({"sub": "7", "exp": exp}), SECRET);
        assert_eq!(keys().verify(&token), Err(ApiError::Unauthorized));
    }

    #[test]
    fn a_token_not_yet_valid_is_unauthorized() {
        let now = now_secs();
        let token = signed(
            Algorithm::HS256,
            &json!({"sub": "7", "exp": now + 3600, "nbf": now + 600}),
            SECRET,
        );
        assert_eq!(keys().verify(&token), Err(ApiError::Unauthorized));
        let valid_now = signed(
            Algorithm::HS256,
            &json!({"sub": "7", "exp": now + 3600, "nbf": now - 1}),
            SECRET,
        );
        assert!(keys().verify(&valid_now).is_ok());
    }

    #[test]
    fn a_sub_that_is_not_a_user_id_is_unauthorized() {
        let exp = now_secs() + 60;
        for sub in [
            json!("0"),
            json!("-1"),
            json!("alice"),
            json!("007"),
            json!(7),
        ] {
            let token = signed(Algorithm::HS256, &json!({"sub": sub, "exp": exp}), SECRET);
            assert_eq!(keys().verify(&token), Err(ApiError::Unauthorized), "{sub}");
        }
    }

    #[test]
    fn garbage_is_unauthorized() {
        for token in ["", "a.b.c", "not-a-token", "..."] {
            assert_eq!(
                keys().verify(token),
                Err(ApiError::Unauthorized),
                "{token:?}"
            );
        }
    }

    #[test]
    fn only_the_admin_role_is_admin() {
        let exp = now_secs() + 60;
        let token = signed(
            Algorithm::HS256,
            &json!({"sub": "7", "exp": exp, "role": "Admin"}),
            SECRET,
        );
        assert_eq!(keys().verify(&token).map(|i| i.admin), Ok(false));
    }

    #[test]
    fn the_bearer_header_is_parsed_strictly() {
        let parts_with = |value: &str| {
            let request = axum::http::Request::builder()
                .header(AUTHORIZATION, value)
                .body(())
                .unwrap();
            request.into_parts().0
        };
        assert_eq!(bearer(&parts_with("Bearer abc")), Some("abc"));
        assert_eq!(bearer(&parts_with("bearer abc")), Some("abc"));
        assert_eq!(bearer(&parts_with("Basic abc")), None);
        assert_eq!(bearer(&parts_with("Bearer ")), None);
        assert_eq!(bearer(&parts_with("abc")), None);
        assert_eq!(bearer(&parts_with("BEARER abc")), Some("abc"));
    }

    /// A token with a hand-written header (jsonwebtoken cannot write `crit`), signed as the
    /// library would sign it.
    fn signed_with_header(header: &str, claims: &serde_json::Value) -> String {
        let message = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let signature = jsonwebtoken::crypto::sign(
            message.as_bytes(),
            &EncodingKey::from_secret(SECRET),
            Algorithm::HS256,
        )
        .unwrap();
        format!("{message}.{signature}")
    }

    #[test]
    fn a_token_with_a_crit_header_is_unauthorized() {
        let claims = json!({"sub": "7", "exp": now_secs() + 60});
        let token = signed(Algorithm::HS256, &claims, SECRET);
        let raw = r#"{"alg":"HS256","typ":"JWT","crit":["x-bound-to"],"x-bound-to":"device-1"}"#;
        let forged = signed_with_header(raw, &claims);
        assert!(!header_has_crit(&token));
        assert!(header_has_crit(&forged));
        assert_eq!(keys().verify(&forged), Err(ApiError::Unauthorized));
        // The same token without `crit`, signed the same way, is accepted: only `crit` refuses.
        let plain = signed_with_header(r#"{"alg":"HS256","typ":"JWT","x-bound-to":"d"}"#, &claims);
        assert!(keys().verify(&plain).is_ok());
    }

    #[test]
    fn a_token_valid_for_longer_than_the_lifetime_max_is_unauthorized() {
        for exp in [
            u64::MAX,
            i64::MAX as u64,
            now_secs() + TOKEN_LIFETIME_MAX.as_secs() + 3600,
        ] {
            let token = signed(Algorithm::HS256, &json!({"sub": "7", "exp": exp}), SECRET);
            assert_eq!(keys().verify(&token), Err(ApiError::Unauthorized), "{exp}");
        }
        let long = mint(SECRET, user(7), false, TOKEN_LIFETIME_MAX);
        assert!(
            keys().verify(&long).is_ok(),
            "the longest lifetime itself is fine"
        );
    }

    #[test]
    fn a_session_carries_the_token_expiry() {
        let token = mint(SECRET, user(7), true, Duration::from_secs(60));
        let session = keys().verify_session(&token).unwrap();
        let left = session
            .expires_at
            .duration_since(SystemTime::now())
            .unwrap();
        assert!(left <= Duration::from_secs(60) && left > Duration::from_secs(50));
        assert!(session.identity.admin);
    }
}
