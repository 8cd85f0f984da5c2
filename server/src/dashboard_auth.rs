//! Dashboard sign-in: the login and logout handlers and the session middleware.
//!
//! A session is a random token in an `HttpOnly`, `SameSite=Lax` cookie; the store keeps only
//! its SHA-256 (like API tokens: random, so a plain hash is enough), the operator, a per-session
//! CSRF token and the expiry. The middleware resolves the cookie once per request and hands the
//! session to the app as a request extension; pages without one redirect to the login page.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{ACCEPT, CONTENT_TYPE, COOKIE, LOCATION, SET_COOKIE};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Form;
use rebound_queue::store::Actor;
use serde::Deserialize;
use serde_json::json;

use app::auth::SignedIn;

use crate::AppState;
use crate::auth::hash_token;
use crate::passwords::verify_password;

/// The session cookie's name.
pub const SESSION_COOKIE: &str = "rebound_session";

/// How long a session lasts without logging in again.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);

/// A hash no password matches: checked against when the username is unknown, so the response
/// takes as long as for a wrong password and does not reveal which usernames exist.
const DUMMY_HASH: &str = "$argon2id$v=19$m=19456,t=2,p=1$c29tZXNhbHRzb21lc2FsdA$N4M3cW8Ji2cL8XJl0nO1Q0P8lK2m1y9QG3d0r1kB2e8";

/// 32 random bytes from the OS, in hex.
fn random_secret() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(hex::encode(bytes))
}

/// The value of cookie `name`, if the request sent it.
pub fn cookie_value(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
        .filter(|v| !v.is_empty())
}

/// Only same-site paths: a `next` of `//evil.example` or `https://…` would make the login an
/// open redirect.
fn safe_next(next: Option<&str>) -> &str {
    match next {
        Some(n) if n.starts_with('/') && !n.starts_with("//") && !n.starts_with("/\\") => n,
        _ => "/",
    }
}

fn percent_encode(s: &str) -> String {
    app::filters::urlencode(s)
}

fn see_other(location: &str) -> Response {
    let mut res = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(location) {
        res.headers_mut().insert(LOCATION, v);
    }
    res
}

/// `Secure` only when the request reached us over HTTPS (directly or through a proxy that says
/// so): browsers drop `Secure` cookies sent over plain HTTP to anything but localhost.
fn session_cookie(headers: &HeaderMap, value: &str, max_age: Duration) -> String {
    let https = headers.get("x-forwarded-proto").and_then(|v| v.to_str().ok()) == Some("https");
    format!(
        "{SESSION_COOKIE}={value}; Path=/; HttpOnly; SameSite=Lax; Max-Age={}{}",
        max_age.as_secs(),
        if https { "; Secure" } else { "" }
    )
}

#[derive(Debug, Deserialize)]
pub struct LoginForm {
    pub username: String,
    pub password: String,
    #[serde(default)]
    pub next: Option<String>,
}

/// `POST /auth/login`: checks the password, starts a session, and goes to `next`.
pub async fn login(State(state): State<AppState>, headers: HeaderMap, Form(form): Form<LoginForm>) -> Response {
    let next = safe_next(form.next.as_deref()).to_string();
    let operator = match state.store.operator(form.username.trim()).await {
        Ok(op) => op.filter(|op| !op.disabled),
        Err(e) => {
            tracing::error!(error = %e, "login: looking up the operator failed");
            return (StatusCode::SERVICE_UNAVAILABLE, "the database is unavailable; try again shortly").into_response();
        }
    };
    let hash = operator.as_ref().map(|op| op.password_hash.clone()).unwrap_or_else(|| DUMMY_HASH.to_string());
    let password = form.password;
    // argon2 is deliberately slow: keep it off the async workers.
    let matches = tokio::task::spawn_blocking(move || verify_password(&password, &hash)).await.unwrap_or(false);
    let Some(operator) = operator.filter(|_| matches) else {
        tracing::info!(username = %form.username, "dashboard login refused");
        return see_other(&format!("/login?error=1&next={}", percent_encode(&next)));
    };
    let (Ok(token), Ok(csrf)) = (random_secret(), random_secret()) else {
        tracing::error!("login: the OS gave no randomness for the session token");
        return (StatusCode::SERVICE_UNAVAILABLE, "could not start a session; try again shortly").into_response();
    };
    if let Err(e) = state.store.create_session(operator.id, &hash_token(&token), &csrf, SESSION_TTL).await {
        tracing::error!(error = %e, "login: creating the session failed");
        return (StatusCode::SERVICE_UNAVAILABLE, "could not start a session; try again shortly").into_response();
    }
    let actor = Actor::new(operator.username.clone());
    if let Err(e) = state.store.audit(&actor, "operator.login", Some(&operator.username), json!({})).await {
        tracing::warn!(error = %e, "login: writing the audit entry failed");
    }
    let mut res = see_other(&next);
    if let Ok(v) = HeaderValue::from_str(&session_cookie(&headers, &token, SESSION_TTL)) {
        res.headers_mut().insert(SET_COOKIE, v);
    }
    res
}

#[derive(Debug, Deserialize)]
pub struct LogoutForm {
    #[serde(default)]
    pub csrf: String,
}

/// `POST /auth/logout`: ends the session (the form's CSRF token must match it) and clears the
/// cookie.
pub async fn logout(State(state): State<AppState>, headers: HeaderMap, Form(form): Form<LogoutForm>) -> Response {
    if let Some(token) = cookie_value(&headers, SESSION_COOKIE) {
        let hash = hash_token(&token);
        match state.store.session(&hash).await {
            Ok(Some(session)) if session.csrf_token == form.csrf => {
                if let Err(e) = state.store.delete_session(&hash).await {
                    tracing::error!(error = %e, "logout: deleting the session failed");
                    return (StatusCode::SERVICE_UNAVAILABLE, "could not end the session; try again").into_response();
                }
            }
            Ok(Some(_)) => return (StatusCode::FORBIDDEN, "the logout form did not come from this dashboard").into_response(),
            Ok(None) => {}
            Err(e) => {
                tracing::error!(error = %e, "logout: looking up the session failed");
                return (StatusCode::SERVICE_UNAVAILABLE, "the database is unavailable; try again shortly").into_response();
            }
        }
    }
    let mut res = see_other("/login?logged_out=1");
    if let Ok(v) = HeaderValue::from_str(&session_cookie(&headers, "", Duration::ZERO)) {
        res.headers_mut().insert(SET_COOKIE, v);
    }
    res
}

/// Paths anyone may load: the login page and its form handlers.
fn is_public(path: &str) -> bool {
    path == "/login" || path.starts_with("/auth/")
}

/// Resolves the session cookie into a [`SignedIn`] request extension, sends signed-out page
/// loads to the login page, and words refusals of plain form posts as a page a person can read.
pub async fn session_middleware(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    if let Some(token) = cookie_value(req.headers(), SESSION_COOKIE) {
        match state.store.session(&hash_token(&token)).await {
            Ok(Some(session)) => {
                req.extensions_mut().insert(SignedIn(session));
            }
            Ok(None) => {}
            Err(e) => {
                tracing::error!(error = %e, "resolving the dashboard session failed");
                return (StatusCode::SERVICE_UNAVAILABLE, "the database is unavailable; try again shortly").into_response();
            }
        }
    }
    let path = req.uri().path().to_string();
    let signed_in = req.extensions().get::<SignedIn>().is_some();
    let is_page = req.method() == Method::GET && !path.starts_with("/api/");
    if is_page && !signed_in && !is_public(&path) {
        let target = req.uri().path_and_query().map(|p| p.as_str().to_string()).unwrap_or_else(|| "/".into());
        return see_other(&format!("/login?next={}", percent_encode(&target)));
    }
    let form_post = req.method() == Method::POST
        && req.headers().get(ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|a| a.contains("text/html"));
    let mut res = next.run(req).await;
    // A form post redirected back to a page whose error parameters were stripped leaves a
    // bare `?` behind.
    if let Some(trimmed) = res.headers().get(LOCATION).and_then(|l| l.to_str().ok()).and_then(|l| l.strip_suffix('?')).map(str::to_string)
        && let Ok(v) = HeaderValue::from_str(&trimmed)
    {
        res.headers_mut().insert(LOCATION, v);
    }
    let status = res.status();
    if form_post && (status == StatusCode::FORBIDDEN || status == StatusCode::UNAUTHORIZED) {
        return refusal_page(res).await;
    }
    res
}

/// A refused form post (JavaScript off) as a small HTML page instead of the JSON error.
async fn refusal_page(res: Response) -> Response {
    let status = res.status();
    let bytes = axum::body::to_bytes(res.into_body(), 64 * 1024).await.unwrap_or_default();
    let message = serde_json::from_slice::<app::error::AppError>(&bytes)
        .map(|e| e.to_string())
        .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
    let escaped = message.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    let title = if status == StatusCode::UNAUTHORIZED { "Not signed in" } else { "Not allowed" };
    let html = format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>\
         <link rel=\"stylesheet\" href=\"/pkg/rebound.css\"></head><body><main>\
         <h1>{title}</h1><div class=\"alert error\" role=\"alert\">{escaped}</div>\
         <p><a href=\"javascript:history.back()\">Go back</a> · <a href=\"/\">Overview</a> · <a href=\"/login\">Log in</a></p>\
         </main></body></html>"
    );
    let mut out = Response::new(Body::from(html));
    *out.status_mut() = status;
    out.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_session_cookie_among_others() {
        let mut h = HeaderMap::new();
        h.insert(COOKIE, HeaderValue::from_static("a=1; rebound_session=abc; b=2"));
        assert_eq!(cookie_value(&h, SESSION_COOKIE).as_deref(), Some("abc"));
        assert_eq!(cookie_value(&h, "missing"), None);
        h.insert(COOKIE, HeaderValue::from_static("rebound_session="));
        assert_eq!(cookie_value(&h, SESSION_COOKIE), None);
    }

    #[test]
    fn next_stays_on_this_site() {
        assert_eq!(safe_next(Some("/jobs?state=retryable")), "/jobs?state=retryable");
        assert_eq!(safe_next(Some("//evil.example/")), "/");
        assert_eq!(safe_next(Some("https://evil.example/")), "/");
        assert_eq!(safe_next(Some("/\\evil.example")), "/");
        assert_eq!(safe_next(None), "/");
    }

    #[test]
    fn the_cookie_is_http_only_and_same_site() {
        let c = session_cookie(&HeaderMap::new(), "tok", SESSION_TTL);
        assert!(c.starts_with("rebound_session=tok; Path=/; HttpOnly; SameSite=Lax; Max-Age=43200"), "{c}");
        assert!(!c.contains("Secure"));
        let mut h = HeaderMap::new();
        h.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        assert!(session_cookie(&h, "tok", SESSION_TTL).ends_with("; Secure"));
    }

    #[test]
    fn the_dummy_hash_parses_and_matches_nothing() {
        assert!(argon2::password_hash::PasswordHash::new(DUMMY_HASH).is_ok());
        assert!(!verify_password("", DUMMY_HASH));
        assert!(!verify_password("password", DUMMY_HASH));
    }
}
