//! What every OJS response carries: `Content-Type: application/openjobspec+json` (exactly,
//! without a charset: the suites compare it literally), `OJS-Version: 1.0`, and on errors the
//! OJS error body with the request id. Framework answers that no handler built (unknown route,
//! wrong method, body too large, timeout) are rewritten into that body here.

use axum::body::Body;
use axum::extract::{OriginalUri, Request};
use axum::http::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;

/// The OJS media type.
pub const OJS_MEDIA_TYPE: &str = "application/openjobspec+json";

const OJS_VERSION: HeaderName = HeaderName::from_static("ojs-version");

/// Largest framework error body read back when rewriting it (they are a line of text).
const BARE_ERROR_BODY_LIMIT: usize = 64 * 1024;

/// Marks an error-status response whose body is deliberately not the OJS error shape (the
/// health endpoint's `503 {"status": "degraded"}`), so the middleware leaves it alone.
#[derive(Clone, Copy, Debug)]
pub struct OwnBody;

/// The media type of the answer: OJS' own, unless the client accepts only its
/// `application/json` alias. Some clients parse bodies only under that exact type (the Python
/// SDK); they can ask for it with `Accept: application/json`. Everyone else, including clients
/// that send no `Accept`, gets `application/openjobspec+json`.
fn response_media_type(accept: Option<&str>) -> &'static str {
    match accept {
        Some(a) if a.contains("application/json") && !a.contains(OJS_MEDIA_TYPE) => "application/json",
        _ => OJS_MEDIA_TYPE,
    }
}

/// Middleware for the `/ojs` routes.
pub async fn ojs_response(req: Request, next: Next) -> Response {
    let request_id = req.headers().get("x-request-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let content_type = response_media_type(req.headers().get(ACCEPT).and_then(|v| v.to_str().ok()));
    let method = req.method().to_string();
    // Inside the nested `/ojs` router the URI has the prefix stripped; report the real one.
    let path = req.extensions().get::<OriginalUri>().map_or_else(|| req.uri().path().to_owned(), |u| u.path().to_owned());
    let mut res = next.run(req).await;
    let status = res.status();
    // Not to be sent again blindly, so no `Retry-After` invites it.
    let mut outcome_unknown = false;
    let is_error = status.is_client_error() || status.is_server_error();
    if is_error && res.extensions().get::<OwnBody>().is_none() {
        let error = match res.extensions().get::<ApiError>() {
            // A read can always be sent again; a write that may have landed cannot.
            Some(e) if e.may_have_landed && !matches!(method.as_str(), "GET" | "HEAD" | "OPTIONS") => {
                outcome_unknown = true;
                ApiError::outcome_unknown()
            }
            Some(e) => e.clone(),
            None => {
                let (parts, body) = res.into_parts();
                let text = axum::body::to_bytes(body, BARE_ERROR_BODY_LIMIT).await.unwrap_or_default();
                res = Response::from_parts(parts, Body::empty());
                ApiError::from_status(status, &method, &path, &String::from_utf8_lossy(&text))
            }
        };
        let body = serde_json::to_vec(&error.body(request_id.as_deref())).unwrap_or_default();
        res.headers_mut().remove(CONTENT_LENGTH);
        *res.body_mut() = Body::from(body);
    }
    let headers = res.headers_mut();
    // Event streams keep theirs (`text/event-stream`).
    if is_error || !headers.get(CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream")) {
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    }
    headers.insert(OJS_VERSION, HeaderValue::from_static("1.0"));
    // ojs-errors ERR-006: a 429 or 503 says when to come back. Handlers that know (the login
    // throttle, a rate limit) set their own; the rest are outages worth retrying soon.
    if matches!(status, StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE) && !headers.contains_key(RETRY_AFTER) && !outcome_unknown {
        headers.insert(RETRY_AFTER, HeaderValue::from_static(DEFAULT_RETRY_AFTER_SECS));
    }
    res
}

/// For a route whose request can be sent again whatever became of it (a heartbeat extends
/// locks, a preview reads): its errors stay retryable though it is a POST.
pub async fn safe_to_resend(req: Request, next: Next) -> Response {
    let mut res = next.run(req).await;
    if let Some(e) = res.extensions_mut().get_mut::<ApiError>() {
        e.may_have_landed = false;
    }
    res
}

/// `Retry-After` of a 429 or 503 whose handler named no time: seconds, a short outage's worth.
const DEFAULT_RETRY_AFTER_SECS: &str = "2";

/// The fallback of the `/ojs` routes: `422 unsupported` for spec endpoints of features this
/// server lacks, else `404`.
pub async fn no_route(method: Method, OriginalUri(uri): OriginalUri) -> Response {
    if let Some(feature) = super::unsupported::feature_of(uri.path()) {
        return super::unsupported::unsupported(feature).detail("path", uri.path()).into_response();
    }
    ApiError::no_route(method.as_str(), uri.path()).into_response()
}
