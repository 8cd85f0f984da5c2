//! The `http` handler: POSTs the job as JSON to a configured URL.
//!
//! 2xx completes the job (a JSON response body becomes its result). 408, 429 and 5xx are
//! retried as `http.5xx`; other 4xx are non-retryable `http.4xx` (the request itself is wrong,
//! sending it again will not help). Connection failures and timeouts are retried as
//! `http.timeout`. A `Retry-After` header on a retryable answer (seconds or an HTTP date)
//! snoozes the job until then without spending an attempt. On a 429 it also says the upstream
//! takes no calls until then (`rate_limit_until` in the error's details, ojs-rate-limiting §9):
//! a job with a rate-limit key holds the key that long, so its other jobs wait too instead of
//! each collecting a 429 of its own.
//!
//! The job id is sent as `Idempotency-Key` so a receiver can ignore a repeated delivery
//! (delivery is at least once).

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use rebound_queue::{HandlerError, Outcome};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use serde_json::{Value, json};

use crate::handler::{Handler, HandlerFuture, HandlerResult, JobContext};

/// How much of a failed response's body is kept for the error message.
const BODY_TAIL_BYTES: usize = 1_000;

/// An `http` handler's configuration.
#[derive(Clone, Debug)]
pub struct HttpConfig {
    pub url: reqwest::Url,
    pub headers: HeaderMap,
    /// Limit for one request (connect, send, answer).
    pub request_timeout: Duration,
}

impl HttpConfig {
    pub fn new(url: reqwest::Url) -> Self {
        HttpConfig { url, headers: HeaderMap::new(), request_timeout: Duration::from_secs(30) }
    }

    /// Adds a header given as config text; the error says what is wrong with it.
    pub fn add_header(&mut self, name: &str, value: &str) -> Result<(), String> {
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| format!("{name:?} is not a valid header name"))?;
        let value = HeaderValue::from_str(value).map_err(|_| "the value contains characters not allowed in a header".to_string())?;
        self.headers.insert(name, value);
        Ok(())
    }
}

pub struct HttpHandler {
    client: reqwest::Client,
    config: HttpConfig,
}

impl HttpHandler {
    /// `client` is shared by every `http` handler of the worker (one connection pool).
    pub fn new(client: reqwest::Client, config: HttpConfig) -> Self {
        HttpHandler { client, config }
    }

    async fn run(&self, job: JobContext) -> HandlerResult {
        let j = job.job();
        let body = json!({
            "id": j.id,
            "type": j.job_type,
            "queue": j.queue,
            "args": j.args,
            "meta": j.meta,
            "attempt": j.attempt,
            "max_attempts": j.max_attempts,
        });
        let sent = self
            .client
            .post(self.config.url.clone())
            .headers(self.config.headers.clone())
            .header("Idempotency-Key", j.id.to_string())
            .header("X-Rebound-Job-Type", &j.job_type)
            .header("X-Rebound-Attempt", j.attempt.to_string())
            .timeout(self.config.request_timeout)
            .json(&body)
            .send()
            .await;
        let response = sent.map_err(|e| request_failure(&self.config.url, e))?;
        let status = response.status().as_u16();
        let retry_after = response.headers().get(RETRY_AFTER).and_then(|v| v.to_str().ok()).map(str::to_string);
        let bytes = response.bytes().await.map_err(|e| request_failure(&self.config.url, e))?;
        outcome_for_response(status, retry_after.as_deref(), &bytes, Timestamp::now())
    }
}

impl Handler for HttpHandler {
    fn handle(&self, job: JobContext) -> HandlerFuture<'_> {
        Box::pin(self.run(job))
    }
}

/// The error of a request that got no answer. Its text reaches the dashboard's viewers and
/// every API token holder, while the configured URL may carry credentials in its path, query
/// or user info (`?api_key=…`): only the scheme, host and port are named, reqwest's error is
/// stripped of its URL, and any remaining mention of the configured URL is cut out.
fn request_failure(url: &reqwest::Url, e: reqwest::Error) -> Outcome {
    let what = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else {
        "failed"
    };
    let target = format!("{}://{}{}", url.scheme(), url.host_str().unwrap_or("?"), url.port().map(|p| format!(":{p}")).unwrap_or_default());
    let e = e.without_url();
    // The causes say why (refused, DNS, TLS); reqwest's own text only says what failed.
    let mut reason = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(cause) = source {
        reason.push_str(": ");
        reason.push_str(&cause.to_string());
        source = cause.source();
    }
    let reason = scrub_url(&reason, url);
    Outcome::Retry(HandlerError::new("http.timeout", format!("request to {target} {what}: {reason}")).with_details(json!({ "url": target })))
}

/// `text` without the configured URL or its secret-bearing parts (path and query, user info).
fn scrub_url(text: &str, url: &reqwest::Url) -> String {
    let mut out = text.replace(url.as_str(), "<url>");
    let query = url.query().unwrap_or("");
    let path_and_query = if query.is_empty() { url.path().to_owned() } else { format!("{}?{query}", url.path()) };
    for secret in [path_and_query.as_str(), query, url.path(), url.password().unwrap_or(""), url.username()] {
        // One-character paths ("/") are everywhere in error text and secret to nobody.
        if secret.len() > 1 {
            out = out.replace(secret, "<redacted>");
        }
    }
    out
}

/// Maps an answer to the handler's result. Pure, so every branch is testable.
pub fn outcome_for_response(status: u16, retry_after: Option<&str>, body: &[u8], now: Timestamp) -> HandlerResult {
    if (200..300).contains(&status) {
        let result = serde_json::from_slice::<Value>(body).ok();
        return Ok(result);
    }
    let tail = body_tail(body);
    let message = if tail.is_empty() { format!("HTTP {status}") } else { format!("HTTP {status}: {tail}") };
    let mut details = json!({ "status": status, "body_tail": tail, "retry_after": retry_after });
    let retryable = status == 408 || status == 429 || (500..600).contains(&status);
    if retryable {
        let at = retry_after.and_then(|v| parse_retry_after(v, now));
        if let (429, Some(at), Some(d)) = (status, at, details.as_object_mut()) {
            d.insert("rate_limit_until".into(), Value::String(at.to_string()));
        }
        let error = HandlerError::new("http.5xx", message).with_details(details);
        return Err(match at {
            Some(at) => Outcome::RetryAfter { at, error: Some(error) },
            None => Outcome::Retry(error),
        });
    }
    if (400..500).contains(&status) {
        return Err(Outcome::Retry(HandlerError::new("http.4xx", message).with_details(details).non_retryable()));
    }
    // 1xx/3xx that reqwest did not resolve (e.g. a redirect loop limit): odd, but may pass.
    Err(Outcome::Retry(HandlerError::new("http.unexpected", message).with_details(details)))
}

/// `Retry-After`: delay-seconds or an HTTP date (RFC 9110 §10.2.3).
pub fn parse_retry_after(value: &str, now: Timestamp) -> Option<Timestamp> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        let secs = i64::try_from(secs).unwrap_or(i64::MAX);
        return Some(now.saturating_add(SignedDuration::from_secs(secs)).unwrap_or(Timestamp::MAX));
    }
    jiff::fmt::rfc2822::DateTimeParser::new().parse_timestamp(value).ok()
}

fn body_tail(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.len() <= BODY_TAIL_BYTES {
        return text.to_string();
    }
    let mut start = text.len() - BODY_TAIL_BYTES;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &text[start..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::Router;
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    use axum::routing::post;

    fn now() -> Timestamp {
        Timestamp::from_second(1_700_000_000).unwrap()
    }

    fn error_of(r: HandlerResult) -> (String, bool) {
        match r {
            Err(Outcome::Retry(e)) => (e.error_type, e.retryable),
            other => panic!("expected a retry outcome, got {other:?}"),
        }
    }

    #[test]
    fn status_mapping() {
        assert_eq!(outcome_for_response(200, None, br#"{"ok":true}"#, now()).unwrap(), Some(json!({"ok": true})));
        assert_eq!(outcome_for_response(204, None, b"", now()).unwrap(), None);
        assert_eq!(outcome_for_response(201, None, b"created", now()).unwrap(), None);
        for s in [400, 401, 404, 422] {
            assert_eq!(error_of(outcome_for_response(s, None, b"nope", now())), ("http.4xx".into(), false), "{s}");
        }
        for s in [408, 429, 500, 502, 503] {
            assert_eq!(error_of(outcome_for_response(s, None, b"", now())), ("http.5xx".into(), true), "{s}");
        }
        match outcome_for_response(503, Some("120"), b"busy", now()) {
            Err(Outcome::RetryAfter { at, error: Some(e) }) => {
                assert_eq!(at, Timestamp::from_second(1_700_000_120).unwrap());
                assert_eq!(e.error_type, "http.5xx");
                assert_eq!(e.message, "HTTP 503: busy");
            }
            other => panic!("{other:?}"),
        }
        // A 429's Retry-After also says when the upstream takes calls again (its key is held).
        match outcome_for_response(429, Some("30"), b"", now()) {
            Err(Outcome::RetryAfter { at, error: Some(e) }) => {
                let until = e.details.as_ref().and_then(|d| d["rate_limit_until"].as_str()).map(str::to_owned);
                assert_eq!(until, Some(at.to_string()));
            }
            other => panic!("{other:?}"),
        }
        match outcome_for_response(503, Some("30"), b"", now()) {
            Err(Outcome::RetryAfter { error: Some(e), .. }) => assert!(e.details.as_ref().is_some_and(|d| d.get("rate_limit_until").is_none())),
            other => panic!("{other:?}"),
        }
        // Retry-After on a non-retryable answer does not make it retryable.
        assert_eq!(error_of(outcome_for_response(400, Some("5"), b"", now())), ("http.4xx".into(), false));
        // An unparseable Retry-After falls back to the policy's backoff.
        assert_eq!(error_of(outcome_for_response(429, Some("soon"), b"", now())), ("http.5xx".into(), true));
    }

    #[test]
    fn retry_after_forms() {
        assert_eq!(parse_retry_after(" 0 ", now()), Some(now()));
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now()),
            Some("1994-11-06T08:49:37Z".parse().unwrap())
        );
        assert_eq!(parse_retry_after("-5", now()), None);
        assert_eq!(parse_retry_after("tomorrow", now()), None);
    }

    async fn serve(router: Router) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        format!("http://{addr}")
    }

    fn handler(base: &str, path: &str, timeout: Duration) -> HttpHandler {
        let mut config = HttpConfig::new(format!("{base}{path}").parse().unwrap());
        config.add_header("Authorization", "Bearer test-token").unwrap();
        config.request_timeout = timeout;
        HttpHandler::new(reqwest::Client::new(), config)
    }

    #[tokio::test]
    async fn against_a_local_server() {
        let router = Router::new()
            .route(
                "/echo",
                post(|headers: axum::http::HeaderMap, axum::Json(body): axum::Json<Value>| async move {
                    let auth = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
                    let key = headers.get("idempotency-key").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
                    axum::Json(json!({ "got": body, "auth": auth, "key": key }))
                }),
            )
            .route("/missing", post(|| async { (StatusCode::NOT_FOUND, "no such hook").into_response() }))
            .route("/busy", post(|| async { (StatusCode::SERVICE_UNAVAILABLE, [("retry-after", "30")], "later").into_response() }))
            .route("/slow", post(|| async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                "too late"
            }));
        let base = serve(router).await;
        let ctx = crate::handler::test_context("hook.deliver", json!([{"n": 1}]), 1);
        let id = ctx.id();
        let result = handler(&base, "/echo", Duration::from_secs(5)).handle(ctx).await.unwrap().unwrap();
        assert_eq!(result["got"]["args"], json!([{"n": 1}]));
        assert_eq!(result["got"]["type"], "hook.deliver");
        assert_eq!(result["got"]["id"], id.to_string());
        assert_eq!(result["auth"], "Bearer test-token");
        assert_eq!(result["key"], id.to_string());

        let ctx = || crate::handler::test_context("hook.deliver", json!([]), 1);
        let missing = handler(&base, "/missing", Duration::from_secs(5)).handle(ctx()).await;
        assert_eq!(error_of(missing), ("http.4xx".into(), false));
        let before = Timestamp::now();
        match handler(&base, "/busy", Duration::from_secs(5)).handle(ctx()).await {
            Err(Outcome::RetryAfter { at, error: Some(e) }) => {
                assert_eq!(e.error_type, "http.5xx");
                assert!(at >= before + SignedDuration::from_secs(29), "{at} vs {before}");
            }
            other => panic!("{other:?}"),
        }
        let slow = handler(&base, "/slow", Duration::from_millis(200)).handle(ctx()).await;
        assert_eq!(error_of(slow), ("http.timeout".into(), true));

        // Nothing listens on a port we just released.
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let refused = handler(&format!("http://127.0.0.1:{closed}"), "/x", Duration::from_secs(5)).handle(ctx()).await;
        assert_eq!(error_of(refused), ("http.timeout".into(), true));
    }

    /// The error text of a failed request names where it went, never the secret-bearing parts
    /// of the configured URL (shown to viewers and API token holders).
    #[tokio::test]
    async fn request_errors_do_not_echo_the_configured_url() {
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let slow = Router::new().route("/hooks/secret-path", post(|| async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            "too late"
        }));
        let slow_base = serve(slow).await;
        let cases = [
            (format!("http://user:hunter2@127.0.0.1:{closed}"), Duration::from_secs(5)),
            (slow_base, Duration::from_millis(200)),
        ];
        for (base, timeout) in cases {
            let url = format!("{base}/hooks/secret-path?api_key=sk_live_123&x=1");
            let mut config = HttpConfig::new(url.parse().unwrap());
            config.request_timeout = timeout;
            let h = HttpHandler::new(reqwest::Client::new(), config);
            let ctx = crate::handler::test_context("hook.deliver", json!([]), 1);
            let Err(Outcome::Retry(e)) = h.handle(ctx).await else { panic!("expected a retryable failure for {url}") };
            let text = format!("{} {}", e.message, e.details.as_ref().map(Value::to_string).unwrap_or_default());
            for secret in ["api_key", "sk_live_123", "secret-path", "hunter2", "user:"] {
                assert!(!text.contains(secret), "{secret:?} leaked in {text:?}");
            }
            assert!(text.contains("http://127.0.0.1:"), "the target is still named: {text}");
        }
    }

    #[test]
    fn scrubbing_removes_every_part_of_the_url() {
        let url: reqwest::Url = "https://u:p4ss@example.com/a/b?token=t0k".parse().unwrap();
        let text = format!("error sending request for url ({url}): /a/b?token=t0k and token=t0k and p4ss");
        let clean = scrub_url(&text, &url);
        for secret in ["/a/b", "t0k", "p4ss"] {
            assert!(!clean.contains(secret), "{secret} in {clean}");
        }
    }
}
