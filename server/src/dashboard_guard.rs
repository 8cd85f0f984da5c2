//! What every dashboard request passes before a page or server function sees it:
//!
//! * a body limit ([`MAX_FORM_BYTES`]; 413 even signed out, the body is never parsed);
//! * for every request that can change something (any method but GET/HEAD/OPTIONS): the
//!   browser must say it is same-origin ([`cross_site`]), the body must hold no NUL, and a
//!   mutation must carry the session's CSRF token in its `csrf` field ([`needs_csrf`]), all
//!   checked before the form is parsed into arguments;
//! * server-function errors get the status their error names ([`AppError::status`]);
//! * the error a no-JavaScript form post carries back in the URL (`__err`) is shown only to the
//!   browser it was made for ([`FLASH_COOKIE`], [`SECURE_FLASH_COOKIE`] over HTTPS).

use axum::body::{Body, Bytes};
use axum::http::header::{CONTENT_TYPE, HOST, LOCATION, ORIGIN, SET_COOKIE};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use app::error::AppError;
use leptos::server_fn::error::SERVER_FN_ERROR_HEADER;

use crate::dashboard_auth::cookie_value;

/// The largest body a dashboard form or server function may send. The biggest real form (a
/// bulk action on a page of ticked rows, or a policy with a long custom schedule) is a few KiB.
pub const MAX_FORM_BYTES: usize = 256 * 1024;

/// Server functions that only read: everything else under `/api/` changes something and must
/// carry the CSRF token. A new function is therefore guarded until it is listed here.
const READ_ONLY_FUNCTIONS: &[&str] = &[
    "whoami",
    "audit_log",
    "cron_jobs",
    "dead_letter_groups",
    "load_job",
    "list_jobs",
    "overview",
    "policies_overview",
    "load_policy_editor",
    "preview_policy",
    "queues",
    "workers",
    "load_workflow",
    "list_workflows",
    "maintenance_state",
    "rate_limit_keys",
    "replay_rules",
    "replay_rule_form",
];

/// Holds a hash of the one error a no-JavaScript form post was just answered with, so that the
/// page it redirects to may show it; a `__err` in any other link is dropped.
pub const FLASH_COOKIE: &str = "rebound_flash";

/// The flash cookie's name when cookies are `Secure`: like the session cookie's, a `__Host-`
/// name no sibling subdomain or plain-HTTP page can set, so none can vouch for a forged error.
pub const SECURE_FLASH_COOKIE: &str = "__Host-rebound_flash";

fn flash_cookie_name(secure: bool) -> &'static str {
    if secure { SECURE_FLASH_COOKIE } else { FLASH_COOKIE }
}

/// Whether `method` can change something, so the request is checked as a mutation.
pub fn is_unsafe(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Whether a request to `path` must carry the session's CSRF token in its form. `/auth/logout`
/// checks its token itself (it must also work for a session that already ended) and
/// `/auth/login` has no session yet: both rely on [`cross_site`].
pub fn needs_csrf(path: &str) -> bool {
    path.strip_prefix("/api/").is_some_and(|name| !READ_ONLY_FUNCTIONS.contains(&name))
}

/// Why a state-changing request looks like it came from another site, if it does.
///
/// Browsers send `Sec-Fetch-Site` (all current ones) and `Origin` (on every POST); a page on
/// another site cannot forge either. `same-origin` passes, and so does `none` (the user's own
/// action, such as a bookmark). Without `Sec-Fetch-Site`, `Origin` must name this host (the
/// `Host` header, or `X-Forwarded-Host` from a proxy). A request with neither header comes from
/// a program, not a browser page, and still needs the CSRF token for any mutation.
pub fn cross_site(headers: &HeaderMap) -> Option<&'static str> {
    if let Some(site) = headers.get("sec-fetch-site") {
        return match site.as_bytes() {
            b"same-origin" | b"none" => None,
            _ => Some("the request came from another site (Sec-Fetch-Site)"),
        };
    }
    let origin = headers.get(ORIGIN)?;
    let authority = origin.to_str().ok().and_then(|o| o.strip_prefix("https://").or_else(|| o.strip_prefix("http://")));
    let Some(authority) = authority else {
        return Some("the request came from a page without an origin");
    };
    let matches = |value: Option<&HeaderValue>| value.and_then(|h| h.to_str().ok()).is_some_and(|h| h.eq_ignore_ascii_case(authority));
    if matches(headers.get(HOST)) || matches(headers.get("x-forwarded-host")) {
        None
    } else {
        Some("the request came from another site (Origin)")
    }
}

/// The value of form field `name` in an `application/x-www-form-urlencoded` body.
pub fn form_field(body: &[u8], name: &str) -> Option<String> {
    url::form_urlencoded::parse(body).find(|(k, _)| k == name).map(|(_, v)| v.into_owned())
}

/// Whether the request's query or body holds a NUL (raw or `%00`), which Postgres refuses in
/// text: such a request is refused whole rather than failing deep inside.
pub fn has_nul(query: &str, body: &[u8]) -> bool {
    let encoded = |s: &[u8]| s.contains(&0) || s.windows(3).any(|w| w == b"%00");
    encoded(query.as_bytes()) || encoded(body)
}

/// Compares without an early exit, so the time taken says nothing about the token.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A refusal as the caller can read it: the app's JSON error for a server function called from
/// the page's code, a small HTML page for a plain form post.
pub fn refusal(status: StatusCode, error: &AppError, form_post: bool) -> Response {
    if form_post {
        return refusal_page(status, &error.to_string());
    }
    let body = serde_json::to_string(error).unwrap_or_else(|_| "\"Unauthorized\"".into());
    let mut res = (status, body).into_response();
    res.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    res.headers_mut().insert(SERVER_FN_ERROR_HEADER, HeaderValue::from_static("1"));
    res
}

/// A refused form post (JavaScript off) as a page a person can read.
pub fn refusal_page(status: StatusCode, message: &str) -> Response {
    let escaped = message.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;");
    let title = match status {
        StatusCode::UNAUTHORIZED => "Not signed in",
        StatusCode::PAYLOAD_TOO_LARGE => "Too large",
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => "Try again shortly",
        s if s.is_client_error() && s != StatusCode::FORBIDDEN => "Not accepted",
        _ => "Not allowed",
    };
    let html = format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>\
         <link rel=\"stylesheet\" href=\"/pkg/rebound.css\"></head><body><main>\
         <h1>{title}</h1><div class=\"alert error\" role=\"alert\">{escaped}</div>\
         <p><a href=\"/\">Overview</a> · <a href=\"/login\">Log in</a></p>\
         </main></body></html>"
    );
    let mut out = Response::new(Body::from(html));
    *out.status_mut() = status;
    out.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    out
}

/// The raw (still percent-encoded) value of `name` in a query string.
fn raw_query_value<'q>(query: &'q str, name: &str) -> Option<&'q str> {
    query.split('&').filter_map(|pair| pair.split_once('=')).find(|(k, _)| *k == name).map(|(_, v)| v)
}

fn flash_digest(raw_err: &str) -> String {
    hex::encode(Sha256::digest(raw_err.as_bytes()))
}

/// For a no-JavaScript form post answered with an error in the redirect's URL: the cookie
/// that lets the next page show that error (and no other). `SameSite=Strict`: only a page of
/// this site can carry it back.
pub fn flash_cookie_for(location: &str, secure: bool) -> Option<HeaderValue> {
    let query = location.split_once('?').map(|(_, q)| q)?;
    let err = raw_query_value(query.split('#').next().unwrap_or(query), "__err")?;
    HeaderValue::from_str(&format!(
        "{}={}; Path=/; HttpOnly; SameSite=Strict; Max-Age=120{}",
        flash_cookie_name(secure),
        flash_digest(err),
        if secure { "; Secure" } else { "" }
    ))
    .ok()
}

/// What to do with a page load whose URL carries a server-function error.
pub enum FlashCheck {
    /// No `__err` in the URL.
    Absent,
    /// This browser's own form post produced it: show it once (the cookie is cleared).
    Genuine,
    /// Someone else's link: load the same page without it (this is where to go).
    Forged(String),
}

/// Checks a page load's `__err` against the flash cookie (when cookies are `secure`, only the
/// `__Host-` one counts).
pub fn check_flash(path: &str, query: Option<&str>, headers: &HeaderMap, secure: bool) -> FlashCheck {
    let Some(query) = query else { return FlashCheck::Absent };
    let Some(err) = raw_query_value(query, "__err") else { return FlashCheck::Absent };
    if cookie_value(headers, flash_cookie_name(secure)).is_some_and(|c| constant_time_eq(c.as_bytes(), flash_digest(err).as_bytes())) {
        return FlashCheck::Genuine;
    }
    let kept: Vec<&str> = query.split('&').filter(|p| !p.starts_with("__err=") && !p.starts_with("__path=") && !p.is_empty()).collect();
    FlashCheck::Forged(if kept.is_empty() { path.to_string() } else { format!("{path}?{}", kept.join("&")) })
}

/// The cookie header that forgets the flash once shown.
pub fn clear_flash_cookie(secure: bool) -> HeaderValue {
    if secure {
        HeaderValue::from_static("__Host-rebound_flash=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0; Secure")
    } else {
        HeaderValue::from_static("rebound_flash=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0")
    }
}

/// A server function's error response (status 500 from `server_fn`) with the status its
/// error names instead: 400 for arguments that do not parse, 403, 404, 422 ….
pub async fn restatus_server_fn_error(res: Response) -> Response {
    if res.status() != StatusCode::INTERNAL_SERVER_ERROR || !res.headers().contains_key(SERVER_FN_ERROR_HEADER) {
        return res;
    }
    let (mut parts, body) = res.into_parts();
    let bytes: Bytes = match axum::body::to_bytes(body, MAX_FORM_BYTES).await {
        Ok(b) => b,
        Err(e) => {
            let error = AppError::internal(format!("reading a server function's error: {e}"));
            return refusal(StatusCode::INTERNAL_SERVER_ERROR, &error, false);
        }
    };
    if let Ok(error) = serde_json::from_slice::<AppError>(&bytes)
        && let Ok(status) = StatusCode::from_u16(error.status())
    {
        parts.status = status;
    }
    Response::from_parts(parts, Body::from(bytes))
}

/// Adds `Set-Cookie` to a response.
pub fn add_cookie(res: &mut Response, cookie: HeaderValue) {
    res.headers_mut().append(SET_COOKIE, cookie);
}

/// The `Location` of a redirect, if the response is one.
pub fn location(res: &Response) -> Option<String> {
    res.headers().get(LOCATION).and_then(|l| l.to_str().ok()).map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn same_origin_passes_and_other_sites_do_not() {
        assert_eq!(cross_site(&headers(&[("sec-fetch-site", "same-origin"), ("origin", "https://evil.example")])), None);
        assert!(cross_site(&headers(&[("sec-fetch-site", "cross-site")])).is_some());
        assert!(cross_site(&headers(&[("sec-fetch-site", "same-site")])).is_some());
        assert_eq!(cross_site(&headers(&[("origin", "http://rebound.local:3000"), ("host", "rebound.local:3000")])), None);
        assert_eq!(cross_site(&headers(&[("origin", "https://jobs.example"), ("host", "127.0.0.1:3000"), ("x-forwarded-host", "jobs.example")])), None);
        assert!(cross_site(&headers(&[("origin", "https://evil.example"), ("host", "rebound.local")])).is_some());
        assert!(cross_site(&headers(&[("origin", "null"), ("host", "rebound.local")])).is_some());
        assert_eq!(cross_site(&HeaderMap::new()), None, "a program, not a page: the CSRF token decides");
    }

    #[test]
    fn mutations_are_every_function_not_listed_as_a_read() {
        assert!(needs_csrf("/api/act_on_job"));
        assert!(needs_csrf("/api/some_new_function"));
        assert!(!needs_csrf("/api/list_jobs"));
        assert!(!needs_csrf("/auth/login"));
    }

    /// Every server function that takes no `csrf` argument is a read and must be listed (an
    /// unlisted one is refused 403 when a hydrated page calls it), and none that takes one
    /// may be (its token must be checked before its form is parsed). Read from the functions'
    /// source, since the list and the functions live in different crates.
    #[test]
    fn the_read_only_list_is_exactly_the_functions_without_a_token() {
        fn sources(dir: &std::path::Path, out: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).expect("read app/src") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    sources(&path, out);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    out.push(std::fs::read_to_string(&path).expect("read a source file"));
                }
            }
        }
        let mut files = Vec::new();
        sources(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../app/src"), &mut files);
        let marker = "#[server(endpoint = \"";
        let mut reads = Vec::new();
        let mut writes = Vec::new();
        for text in &files {
            for (at, _) in text.match_indices(marker) {
                let rest = &text[at + marker.len()..];
                let name = &rest[..rest.find('"').expect("the endpoint's closing quote")];
                let signature = &rest[rest.find("async fn").expect("the function")..];
                let signature = &signature[..signature.find(") ->").expect("the function's arguments")];
                if signature.contains("csrf:") { writes.push(name) } else { reads.push(name) }
            }
        }
        assert!(writes.len() > 10 && reads.len() > 10, "found {writes:?} and {reads:?}");
        // Every server function was read: one declared any other way (a bare `#[server]`, an
        // attribute spelled differently) would be missed above, not failed.
        let declared: usize = files.iter().map(|t| t.matches("#[server").count() - t.matches("#[server(default)]").count()).sum();
        assert_eq!(declared, reads.len() + writes.len(), "a server function is declared other than as #[server(endpoint = \"…\")]");
        let mut listed: Vec<&str> = READ_ONLY_FUNCTIONS.to_vec();
        listed.sort_unstable();
        reads.sort_unstable();
        assert_eq!(listed, reads, "READ_ONLY_FUNCTIONS against the server functions that take no csrf token");
        assert!(writes.iter().all(|w| needs_csrf(&format!("/api/{w}"))));
    }

    #[test]
    fn nul_in_any_form() {
        assert!(has_nul("queue=a%00b", b""));
        assert!(has_nul("", b"csrf=x&queue=a\0"));
        assert!(!has_nul("q=100%25", b"a=b"));
    }

    #[test]
    fn only_the_flashed_error_is_shown() {
        let cookie = flash_cookie_for("http://localhost/queues?__path=%2Fapi%2Fx&__err=abc%3D", false).expect("a cookie");
        let value = cookie.to_str().expect("ascii").split(';').next().expect("pair").to_string();
        let mut h = HeaderMap::new();
        h.insert("cookie", HeaderValue::from_str(&value).expect("header"));
        assert!(matches!(check_flash("/queues", Some("__path=%2Fapi%2Fx&__err=abc%3D"), &h, false), FlashCheck::Genuine));
        match check_flash("/queues", Some("state=1&__path=%2Fapi%2Fx&__err=evil"), &h, false) {
            FlashCheck::Forged(to) => assert_eq!(to, "/queues?state=1"),
            _ => panic!("a different error must not show"),
        }
        assert!(matches!(check_flash("/queues", Some("__err=abc%3D"), &HeaderMap::new(), false), FlashCheck::Forged(_)));
        assert!(matches!(check_flash("/queues", Some("a=1"), &h, false), FlashCheck::Absent));
        assert!(flash_cookie_for("/queues?x=1", false).is_none());

        // With Secure cookies, only the `__Host-` cookie vouches for an error: a plain one may
        // have been planted by a sibling subdomain.
        assert!(matches!(check_flash("/queues", Some("__path=%2Fapi%2Fx&__err=abc%3D"), &h, true), FlashCheck::Forged(_)));
        let secure = flash_cookie_for("/queues?__path=%2Fapi%2Fx&__err=abc%3D", true).expect("a cookie");
        let secure = secure.to_str().expect("ascii");
        assert!(secure.starts_with("__Host-rebound_flash=") && secure.ends_with("; Secure") && !secure.contains("Domain"), "{secure}");
        let mut h = HeaderMap::new();
        h.insert("cookie", HeaderValue::from_str(secure.split(';').next().expect("pair")).expect("header"));
        assert!(matches!(check_flash("/queues", Some("__path=%2Fapi%2Fx&__err=abc%3D"), &h, true), FlashCheck::Genuine));
        assert!(clear_flash_cookie(true).to_str().expect("ascii").starts_with("__Host-rebound_flash=;"));
    }
}
