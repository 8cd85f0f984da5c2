//! Bearer-token authentication: missing, malformed, wrong and revoked tokens get 401 with the
//! OJS error body; a live token works and is named in the audit log; `--api-auth none` needs none.

use axum::http::StatusCode;
use rebound_queue::store::Actor;
use rebound_server::auth::{generate_token, hash_token};
use rebound_server::config::{ApiAuth, ServerConfig};
use serde_json::json;

use crate::common::TestServer;

const JSON: &str = "application/openjobspec+json";

async fn token_server() -> TestServer {
    TestServer::with_config(ServerConfig { api_auth: ApiAuth::Token, ..ServerConfig::default() }).await
}

#[tokio::test]
async fn requests_without_a_valid_token_get_401() {
    let s = token_server().await;
    let body = json!({"type": "auth.test", "args": []}).to_string().into_bytes();
    let token = generate_token().expect("randomness");
    s.db.store.create_token("ci", &hash_token(&token), &Actor::new("test")).await.expect("create token");
    let other = generate_token().expect("randomness");

    for (what, auth) in [
        ("missing", None),
        ("not bearer", Some("Basic dXNlcjpwYXNz".to_owned())),
        ("empty bearer", Some("Bearer ".to_owned())),
        ("wrong token", Some(format!("Bearer {other}"))),
        ("token hash instead of token", Some(format!("Bearer {}", hash_token(&token)))),
    ] {
        let mut headers = vec![("content-type", JSON)];
        if let Some(a) = auth.as_deref() {
            headers.push(("authorization", a));
        }
        let r = s.raw("POST", "/ojs/v1/jobs", &headers, body.clone()).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{what}: {}", r.text);
        r.assert_ojs_error(what);
        assert_eq!(r.body["error"]["code"], "unauthenticated");
        assert!(r.header("www-authenticate").is_some_and(|h| h.starts_with("Bearer")), "{what}");
    }
    assert_eq!(s.job_count().await, 0, "an unauthenticated request wrote a job");

    // The live token works, and its name is the audit actor.
    let bearer = format!("Bearer {token}");
    let r = s.raw("POST", "/ojs/v1/jobs", &[("content-type", JSON), ("authorization", &bearer)], body.clone()).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let id = r.body["job"]["id"].as_str().expect("id").to_owned();
    let r = s.raw("DELETE", &format!("/ojs/v1/jobs/{id}"), &[("authorization", &bearer)], Vec::new()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let audit = s.db.store.audit_log(&Default::default()).await.expect("audit");
    assert!(audit.iter().any(|e| e.action == "job.cancel" && e.actor == "api:ci"), "{audit:?}");
    let tokens = s.db.store.tokens().await.expect("tokens");
    assert!(tokens[0].last_used_at.is_some(), "a used token records when");

    // Revoked: refused from the next request on.
    assert!(s.db.store.revoke_token("ci", &Actor::new("test")).await.expect("revoke"));
    let r = s.raw("POST", "/ojs/v1/jobs", &[("content-type", JSON), ("authorization", &bearer)], body).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text);
    assert_eq!(s.job_count().await, 1);
}

#[tokio::test]
async fn discovery_and_probes_need_no_token() {
    let s = token_server().await;
    for path in ["/ojs/manifest", "/ojs/v1/health", "/healthz", "/readyz", "/metrics"] {
        let r = s.get(path).await;
        assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.text);
    }
    let r = s.get("/ojs/manifest").await;
    assert!(r.body["extensions"].as_array().is_some_and(|e| e.contains(&json!("auth:bearer"))));
    // An unknown route is 404, not 401: authentication applies to real endpoints only.
    assert_eq!(s.get("/ojs/v1/nope").await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn api_auth_none_serves_without_tokens() {
    let s = TestServer::new().await;
    let r = s.post("/ojs/v1/jobs", json!({"type": "auth.none", "args": []})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let r = s.get("/ojs/manifest").await;
    assert!(r.body["extensions"].as_array().is_some_and(|e| !e.contains(&json!("auth:bearer"))));
}
