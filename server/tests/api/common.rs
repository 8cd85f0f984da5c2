//! An in-process server on a fresh database, and a small client for it.

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use rebound_queue::testing::TestDb;
use rebound_server::config::{ApiAuth, ServerConfig};
use rebound_server::{AppState, router};
use serde_json::Value;
use tower::ServiceExt;

pub struct TestServer {
    pub db: TestDb,
    pub state: AppState,
    app: Router,
}

/// An answer, with the body parsed as JSON when it is JSON (else `Value::Null`).
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Value,
    pub text: String,
}

impl Reply {
    /// The `details.field` of an OJS error body.
    pub fn error_field(&self) -> Option<&str> {
        self.body.pointer("/error/details/field").and_then(Value::as_str)
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Checks the OJS error shape: every field present, the exact content type.
    pub fn assert_ojs_error(&self, context: &str) {
        let e = self.body.get("error").unwrap_or_else(|| panic!("{context}: no error object in {}", self.text));
        for key in ["code", "message", "type", "hint", "docs_url", "request_id"] {
            assert!(e.get(key).and_then(Value::as_str).is_some_and(|s| !s.is_empty()), "{context}: error.{key} missing in {}", self.text);
        }
        assert!(e.get("retryable").and_then(Value::as_bool).is_some(), "{context}: error.retryable missing");
        assert!(e.get("details").is_some_and(Value::is_object), "{context}: error.details missing");
        assert_eq!(self.header("content-type"), Some("application/openjobspec+json"), "{context}");
        assert_eq!(self.header("ojs-version"), Some("1.0"), "{context}");
    }
}

impl TestServer {
    /// A server without API authentication.
    pub async fn new() -> TestServer {
        TestServer::with_config(ServerConfig { api_auth: ApiAuth::None, ..ServerConfig::default() }).await
    }

    pub async fn with_config(config: ServerConfig) -> TestServer {
        let db = TestDb::new().await;
        let state = AppState::new(db.store.clone(), config);
        let app = router(state.clone());
        TestServer { db, state, app }
    }

    pub async fn send(&self, req: Request<Body>) -> Reply {
        let res = self.app.clone().oneshot(req).await.expect("the router is infallible");
        let status = res.status();
        let headers = res.headers().clone();
        let bytes = axum::body::to_bytes(res.into_body(), usize::MAX).await.expect("read body");
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Reply { status, headers, body, text }
    }

    /// The response itself, its body unread (a stream).
    pub async fn open(&self, path: &str, headers: &[(&str, &str)]) -> axum::response::Response {
        let mut req = Request::builder().method("GET").uri(path);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        self.app.clone().oneshot(req.body(Body::empty()).expect("request")).await.expect("the router is infallible")
    }

    /// A request with raw body bytes and optional headers.
    pub async fn raw(&self, method: &str, path: &str, headers: &[(&str, &str)], body: Vec<u8>) -> Reply {
        let mut req = Request::builder().method(method).uri(path);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        self.send(req.body(Body::from(body)).expect("request")).await
    }

    /// A JSON request (`None`: no body).
    pub async fn call(&self, method: &str, path: &str, body: Option<Value>) -> Reply {
        match body {
            Some(b) => self.raw(method, path, &[("content-type", "application/openjobspec+json")], b.to_string().into_bytes()).await,
            None => self.raw(method, path, &[], Vec::new()).await,
        }
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.call("GET", path, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> Reply {
        self.call("POST", path, Some(body)).await
    }

    /// Enqueues and returns the job object, asserting success.
    pub async fn enqueue(&self, body: Value) -> Value {
        let r = self.post("/ojs/v1/jobs", body).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
        r.body["job"].clone()
    }

    /// Fetches one job from `queue` (`Value::Null` if none).
    pub async fn fetch(&self, queue: &str) -> Value {
        let r = self.post("/ojs/v1/workers/fetch", serde_json::json!({"queues": [queue], "worker_id": "w1"})).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        r.body["jobs"].get(0).cloned().unwrap_or(Value::Null)
    }

    /// Makes a dead letter on `queue` whose error type is `error` (enqueue with one attempt and
    /// `on_exhaustion: dead_letter`, fetch, nack); returns its id.
    pub async fn dead_letter(&self, queue: &str, error: &str) -> String {
        let job = self.enqueue(serde_json::json!({"type": "dead.job", "args": [], "options": {"queue": queue, "retry": {"max_attempts": 1, "on_exhaustion": "dead_letter"}}})).await;
        assert_eq!(self.fetch(queue).await["id"], job["id"]);
        let r = self.post("/ojs/v1/workers/nack", serde_json::json!({"job_id": job["id"], "error": {"code": "e", "type": error, "message": "broke"}})).await;
        assert_eq!(r.body["state"], "discarded", "{}", r.text);
        job["id"].as_str().expect("id").to_owned()
    }

    /// How many jobs exist at all.
    pub async fn job_count(&self) -> i64 {
        self.db.store.count_jobs(&Default::default(), 1_000_000).await.expect("count jobs")
    }
}
