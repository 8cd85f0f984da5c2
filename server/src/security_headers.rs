//! Headers every response carries, so that no page can be framed (clickjacking), no response
//! is sniffed into a different content type, and no URL leaks to other sites in `Referer`.
//! Dashboard pages set their own Content-Security-Policy (with the nonce of their inline
//! hydration scripts, see `app::content_security_policy`); every other response gets one
//! that allows nothing to run.

use axum::http::HeaderValue;
use axum::http::header::{CONTENT_SECURITY_POLICY, REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS};
use axum::response::Response;

/// For responses that are not dashboard pages: JSON, static files, redirects, refusals.
/// Styles from this site stay allowed so that the server's small HTML refusal pages render.
pub const DEFAULT_CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// Adds the headers a response does not already set.
pub async fn add(mut res: Response) -> Response {
    let h = res.headers_mut();
    h.entry(CONTENT_SECURITY_POLICY).or_insert(HeaderValue::from_static(DEFAULT_CSP));
    h.entry(X_FRAME_OPTIONS).or_insert(HeaderValue::from_static("DENY"));
    h.entry(X_CONTENT_TYPE_OPTIONS).or_insert(HeaderValue::from_static("nosniff"));
    h.entry(REFERRER_POLICY).or_insert(HeaderValue::from_static("same-origin"));
    h.entry("cross-origin-opener-policy").or_insert(HeaderValue::from_static("same-origin"));
    res
}
