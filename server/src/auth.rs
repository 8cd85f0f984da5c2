//! API authentication with bearer tokens. A token is shown once when created; the store keeps
//! only its SHA-256, so a database leak does not leak usable tokens (they are random, so a
//! plain hash is enough, unlike passwords).

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::{ConnectInfo, FromRequestParts, Request, State};
use axum::http::header::{AUTHORIZATION, RETRY_AFTER, WWW_AUTHENTICATE};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rebound_queue::store::Actor;
use sha2::{Digest, Sha256};

use crate::AppState;
use crate::config::ApiAuth;
use crate::login_throttle::{address_key, client_address};
use crate::ojs::error::ApiError;

/// Every token starts with this, so leaked tokens are easy to recognise (and to scan for).
pub const TOKEN_PREFIX: &str = "rbt_";

/// A new random token: the prefix and 32 random bytes from the OS, in hex.
pub fn generate_token() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(format!("{TOKEN_PREFIX}{}", hex::encode(bytes)))
}

/// The form a token is stored and looked up in.
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Whether `token` has the shape [`generate_token`] gives every token. One that has not cannot
/// be live, so it is refused without a look-up: a flood of junk costs the database nothing.
pub fn well_formed(token: &str) -> bool {
    token.strip_prefix(TOKEN_PREFIX).is_some_and(is_secret_hex)
}

/// Whether `s` is 32 random bytes as [`generate_token`] and the dashboard's session tokens
/// write them: 64 lowercase hex digits.
pub fn is_secret_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Who is calling the API, for the audit log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The token's name, or `anonymous` with `--api-auth none`.
    pub name: String,
}

impl Caller {
    /// The audit-log actor for this caller.
    pub fn actor(&self) -> Actor {
        Actor::new(format!("api:{}", self.name))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(parts.extensions.get::<Caller>().cloned().unwrap_or_else(|| Caller { name: "anonymous".into() }))
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim()).filter(|t| !t.is_empty())
}

fn unauthenticated(reason: &str) -> Response {
    let mut res = ApiError::unauthenticated(reason).into_response();
    res.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"rebound\""));
    res
}

/// 429 for an address that sent too many unknown tokens (see [`crate::unknown_credentials`]).
fn too_many_unknown(wait: Duration) -> Response {
    let mut res = ApiError::rate_limited(
        format!(
            "too many unknown bearer tokens from this address: at most {} in {} s",
            crate::unknown_credentials::UNKNOWN_PER_WINDOW,
            crate::unknown_credentials::WINDOW.as_secs()
        ),
        "check the token (rebound-server token list), then retry after the Retry-After header's seconds",
    )
    .detail("retry_after_seconds", wait.as_secs_f64())
    .into_response();
    res.headers_mut().insert(RETRY_AFTER, HeaderValue::from((wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)));
    res
}

/// Middleware for the protected API routes: lets the request through with its [`Caller`], or
/// answers 401 with an OJS error body.
pub async fn require_token(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let caller = match state.config.api_auth {
        ApiAuth::None => Caller { name: "anonymous".into() },
        ApiAuth::Token => {
            let Some(token) = bearer(req.headers()) else {
                return unauthenticated("this endpoint needs an Authorization: Bearer token");
            };
            if !well_formed(token) {
                return unauthenticated("the bearer token is unknown or revoked");
            }
            let peer = req.extensions().get::<ConnectInfo<SocketAddr>>();
            let address = format!("api {}", address_key(client_address(req.headers(), peer, state.config.behind_proxy)));
            let hash = hash_token(token);
            if let Some(wait) = state.unknown_credentials.wait(&address, &hash) {
                return too_many_unknown(wait);
            }
            match state.store.verify_token(&hash).await {
                Ok(Some(t)) => {
                    state.unknown_credentials.live(&hash);
                    Caller { name: t.name }
                }
                Ok(None) => {
                    state.unknown_credentials.unknown(&address);
                    return unauthenticated("the bearer token is unknown or revoked");
                }
                // Only the token was looked up: the request itself has not run.
                Err(e) => return ApiError::from(e).retry_safe().into_response(),
            }
        }
    };
    req.extensions_mut().insert(caller);
    next.run(req).await
}

/// Middleware for the API routes: refuses (403) a request that writes and that a browser sent
/// from another site's page. API clients are programs, not pages: a page could only ever send
/// such a request to make a visitor's browser act on an API it can reach (one left without
/// authentication on loopback, say), and it cannot read the answer, but the write would land.
/// The dashboard's own requests are checked the same way (see [`crate::dashboard_guard`]).
pub async fn refuse_cross_site(req: Request, next: Next) -> Response {
    if crate::dashboard_guard::is_unsafe(req.method())
        && let Some(reason) = crate::dashboard_guard::cross_site(req.headers())
    {
        tracing::warn!(path = %req.uri().path(), reason, "API: cross-site request from a browser refused");
        return ApiError::new(
            axum::http::StatusCode::FORBIDDEN,
            "forbidden",
            "authorization_error",
            format!("{reason}: the API does not take writes from other sites' pages"),
            "call the API from a program, not from a web page",
        )
        .into_response();
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_and_hash_stably() {
        let a = generate_token().expect("os randomness");
        assert!(a.starts_with(TOKEN_PREFIX));
        assert!(well_formed(&a));
        for junk in ["", "rbt_", &a[..a.len() - 1], &format!("{a}0"), &a.to_uppercase(), &a.replacen("rbt_", "rbx_", 1), &hash_token(&a)] {
            assert!(!well_formed(junk), "{junk:?}");
        }
        assert_eq!(a.len(), TOKEN_PREFIX.len() + 64);
        assert_ne!(a, generate_token().expect("os randomness"));
        assert_eq!(hash_token(&a), hash_token(&a));
        assert_eq!(hash_token("x"), "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881");
    }

    #[test]
    fn bearer_header_parsing() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert(AUTHORIZATION, HeaderValue::from_static("Bearer abc"));
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(AUTHORIZATION, HeaderValue::from_static("bearer  abc "));
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(AUTHORIZATION, HeaderValue::from_static("Basic abc"));
        assert_eq!(bearer(&h), None);
        h.insert(AUTHORIZATION, HeaderValue::from_static("Bearer "));
        assert_eq!(bearer(&h), None);
    }
}
