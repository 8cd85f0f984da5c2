//! The harness the dashboard's HTTP tests share: the whole server router on a fresh database,
//! operators, and requests answered in full. Each test file adds the requests it needs.
// Each test binary uses a different part of it.
#![allow(dead_code)]

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use rebound_queue::store::Role;
use rebound_queue::testing::TestDb;
use rebound_server::config::{ApiAuth, ServerConfig};
use rebound_server::passwords::hash_password;
use rebound_server::{AppState, router};
use tower::ServiceExt;

pub struct Dashboard {
    pub db: TestDb,
    pub app: Router,
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub text: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// A signed-in browser: its session cookie and the session's CSRF token.
pub struct Browser {
    pub cookie: String,
    pub csrf: String,
}

/// A urlencoded form body.
pub fn form(pairs: &[(&str, &str)]) -> String {
    pairs.iter().map(|(k, v)| format!("{}={}", app::filters::urlencode(k), app::filters::urlencode(v))).collect::<Vec<_>>().join("&")
}

impl Dashboard {
    pub async fn new() -> Dashboard {
        Dashboard::with_config(ServerConfig { api_auth: ApiAuth::None, ..ServerConfig::default() }).await
    }

    pub async fn with_config(config: ServerConfig) -> Dashboard {
        let db = TestDb::new().await;
        let state = AppState::new(db.store.clone(), config);
        Dashboard { app: router(state), db }
    }

    /// A dashboard whose statements give up waiting for a lock after `lock_timeout` (the
    /// server's `--lock-timeout`).
    pub async fn with_lock_timeout(lock_timeout: Duration) -> Dashboard {
        let db = TestDb::new().await;
        let store = rebound_queue::Store::connect_lazy_bounded(&db.url, 4, lock_timeout).expect("store");
        let state = AppState::new(store, ServerConfig { api_auth: ApiAuth::None, ..ServerConfig::default() });
        Dashboard { app: router(state), db }
    }

    pub async fn user(&self, name: &str, password: &str, role: Role) {
        let hash = hash_password(password).expect("hash");
        self.db.store.upsert_operator(name, &hash, role, &rebound_queue::store::Actor::system("test")).await.expect("operator");
    }

    pub async fn send(&self, req: Request<Body>) -> Reply {
        // A hung request fails the test instead of hanging the run.
        let res = tokio::time::timeout(Duration::from_secs(60), self.app.clone().oneshot(req))
            .await
            .expect("the dashboard answered within a minute")
            .expect("the router is infallible");
        let status = res.status();
        let headers = res.headers().clone();
        let bytes = axum::body::to_bytes(res.into_body(), usize::MAX).await.expect("body");
        Reply { status, headers, text: String::from_utf8_lossy(&bytes).into_owned() }
    }
}
