//! Bearer-token authentication: missing, malformed, wrong and revoked tokens get 401 with the
//! OJS error body; a live token works and is named in the audit log; `--api-auth none` needs none.
//!
//! Dashboard sessions: an idle session ends, a session in use is not written on every request,
//! signing in ends the browser's previous session, the cookie is `Secure` (and `__Host-`) as
//! `X-Forwarded-Proto` says only behind a trusted proxy, dashboard answers are not cached, and
//! a throttled sign-in does not wait for a password check, and a browser its operator signed
//! in from before signs in while strangers' guesses hold every throttle and turn.

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use rebound_queue::store::{Actor, Role};
use rebound_server::CONCURRENT_PASSWORD_CHECKS;
use rebound_server::auth::{generate_token, hash_token};
use rebound_server::config::{ApiAuth, ServerConfig};
use rebound_server::dashboard_auth::{DEVICE_COOKIE, SECURE_DEVICE_COOKIE, SECURE_SESSION_COOKIE, SESSION_COOKIE};
use rebound_server::passwords::hash_password;
use serde_json::json;

use crate::common::{Reply, TestServer};

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
    for path in ["/ojs/manifest", "/ojs/v1/health", "/healthz", "/readyz"] {
        let r = s.get(path).await;
        assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.text);
    }
    let r = s.get("/ojs/manifest").await;
    assert!(r.body["extensions"].as_array().is_some_and(|e| e.contains(&json!("auth:bearer"))));
    // An unknown route is 404, not 401: authentication applies to real endpoints only.
    assert_eq!(s.get("/ojs/v1/nope").await.status, StatusCode::NOT_FOUND);
}

/// Metrics name every job type and queue: a token, as for the API, unless `--public-metrics`.
#[tokio::test]
async fn metrics_need_a_token_unless_made_public() {
    let s = token_server().await;
    s.db.store.enqueue(rebound_queue::NewJob::new("secret.payroll", json!([])).queue("hr")).await.expect("enqueue");
    let r = s.get("/metrics").await;
    assert_eq!((r.status, r.header("www-authenticate").is_some()), (StatusCode::UNAUTHORIZED, true), "{}", r.text);
    let token = generate_token().expect("randomness");
    s.db.store.create_token("prometheus", &hash_token(&token), &Actor::new("test")).await.expect("create token");
    let r = s.raw("GET", "/metrics", &[("authorization", &format!("Bearer {token}"))], Vec::new()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(r.text.contains("queue=\"hr\""), "{}", r.text);

    let public = TestServer::with_config(ServerConfig { api_auth: ApiAuth::Token, public_metrics: true, ..ServerConfig::default() }).await;
    assert_eq!(public.get("/metrics").await.status, StatusCode::OK);
    assert_eq!(public.get("/ojs/v1/queues").await.status, StatusCode::UNAUTHORIZED, "the API still needs its token");
}

#[tokio::test]
async fn api_auth_none_serves_without_tokens() {
    let s = TestServer::new().await;
    let r = s.post("/ojs/v1/jobs", json!({"type": "auth.none", "args": []})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    let r = s.get("/ojs/manifest").await;
    assert!(r.body["extensions"].as_array().is_some_and(|e| !e.contains(&json!("auth:bearer"))));
}

/// The dashboard operator `olivia`, password `correct horse`.
async fn operator(s: &TestServer) {
    let hash = hash_password("correct horse").expect("hash");
    s.db.store.upsert_operator("olivia", &hash, Role::Operator, &Actor::system("test")).await.expect("operator");
}

/// Olivia signs in through the login form, the request carrying `headers` too.
async fn sign_in(s: &TestServer, headers: &[(&str, &str)]) -> Reply {
    let mut all = vec![("content-type", "application/x-www-form-urlencoded"), ("accept", "text/html")];
    all.extend_from_slice(headers);
    s.raw("POST", "/auth/login", &all, b"username=olivia&password=correct+horse&next=%2Fjobs".to_vec()).await
}

/// The token of the session cookie named `name` a sign-in set (its first `Set-Cookie`).
fn session_token(r: &Reply, name: &str) -> String {
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    let cookie = r.header("set-cookie").expect("a session cookie");
    let prefix = format!("{name}=");
    cookie.split(';').next().and_then(|kv| kv.strip_prefix(prefix.as_str())).unwrap_or_else(|| panic!("not a {name} cookie: {cookie}")).to_owned()
}

/// A dashboard page loaded with `cookie`.
async fn page(s: &TestServer, path: &str, cookie: &str) -> Reply {
    s.raw("GET", path, &[("cookie", cookie)], Vec::new()).await
}

/// Marks the session of `token` last used `secs` seconds ago.
async fn last_used(s: &TestServer, token: &str, secs: i64) {
    let n = sqlx::query("UPDATE sessions SET last_seen_at = now() - $2 * interval '1 second' WHERE token_hash = $1")
        .bind(hash_token(token))
        .bind(secs)
        .execute(s.db.store.pool())
        .await
        .expect("age the session")
        .rows_affected();
    assert_eq!(n, 1, "no session row to age");
}

/// How many whole seconds ago the session of `token` was last marked used; `None`: it has no row.
async fn seen_secs_ago(s: &TestServer, token: &str) -> Option<i64> {
    sqlx::query_scalar::<_, i64>("SELECT extract(epoch FROM now() - last_seen_at)::bigint FROM sessions WHERE token_hash = $1")
        .bind(hash_token(token))
        .fetch_optional(s.db.store.pool())
        .await
        .expect("read the session")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_unused_for_the_idle_timeout_is_refused_and_deleted() {
    let s = TestServer::new().await;
    operator(&s).await;
    let token = session_token(&sign_in(&s, &[]).await, SESSION_COOKIE);
    let cookie = format!("{SESSION_COOKIE}={token}");
    assert_eq!(page(&s, "/jobs", &cookie).await.status, StatusCode::OK);

    // The default limit is 30 minutes.
    last_used(&s, &token, 29 * 60).await;
    assert_eq!(page(&s, "/jobs", &cookie).await.status, StatusCode::OK, "29 minutes unused is within the limit");
    last_used(&s, &token, 31 * 60).await;
    let r = page(&s, "/jobs", &cookie).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    assert_eq!(r.header("location"), Some("/login?next=%2Fjobs"));
    assert_eq!(seen_secs_ago(&s, &token).await, None, "the idle session is deleted");
    let r = s.raw("POST", "/api/whoami", &[("cookie", &cookie), ("accept", "application/json"), ("content-type", "application/x-www-form-urlencoded")], Vec::new()).await;
    assert_eq!((r.status, r.text.trim()), (StatusCode::OK, "null"), "nobody is signed in");

    // `--session-idle-timeout` sets the limit.
    let s = TestServer::with_config(ServerConfig { api_auth: ApiAuth::None, session_idle_timeout: Duration::from_secs(5 * 60), ..ServerConfig::default() }).await;
    operator(&s).await;
    let token = session_token(&sign_in(&s, &[]).await, SESSION_COOKIE);
    let cookie = format!("{SESSION_COOKIE}={token}");
    last_used(&s, &token, 4 * 60).await;
    assert_eq!(page(&s, "/jobs", &cookie).await.status, StatusCode::OK);
    last_used(&s, &token, 6 * 60).await;
    assert_eq!(page(&s, "/jobs", &cookie).await.status, StatusCode::SEE_OTHER);
    assert_eq!(seen_secs_ago(&s, &token).await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_in_use_is_marked_used_at_most_once_a_minute() {
    let s = TestServer::new().await;
    operator(&s).await;
    let token = session_token(&sign_in(&s, &[]).await, SESSION_COOKIE);
    let cookie = format!("{SESSION_COOKIE}={token}");

    last_used(&s, &token, 30).await;
    for _ in 0..3 {
        assert_eq!(page(&s, "/jobs", &cookie).await.status, StatusCode::OK);
    }
    let ago = seen_secs_ago(&s, &token).await.expect("the session");
    assert!(ago >= 30, "marked used {ago} s ago: the row was written again within the minute");

    last_used(&s, &token, 120).await;
    assert_eq!(page(&s, "/jobs", &cookie).await.status, StatusCode::OK);
    let ago = seen_secs_ago(&s, &token).await.expect("the session");
    assert!(ago < 30, "marked used {ago} s ago: a session unmarked for two minutes is marked again when used");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signing_in_again_ends_the_browsers_previous_session() {
    let s = TestServer::new().await;
    operator(&s).await;
    let old = session_token(&sign_in(&s, &[]).await, SESSION_COOKIE);
    let elsewhere = session_token(&sign_in(&s, &[]).await, SESSION_COOKIE);
    let old_cookie = format!("{SESSION_COOKIE}={old}");

    let new = session_token(&sign_in(&s, &[("cookie", &old_cookie)]).await, SESSION_COOKIE);
    assert_ne!(new, old);
    assert_eq!(seen_secs_ago(&s, &old).await, None, "the session the browser sent is deleted");
    assert!(seen_secs_ago(&s, &new).await.is_some());
    assert!(seen_secs_ago(&s, &elsewhere).await.is_some(), "another browser's session stays");
    assert_eq!(page(&s, "/jobs", &old_cookie).await.status, StatusCode::SEE_OTHER, "the old cookie no longer signs in");
    assert_eq!(page(&s, "/jobs", &format!("{SESSION_COOKIE}={new}")).await.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_proto_makes_the_cookie_secure_only_as_a_trusted_proxy_says() {
    // (behind a trusted proxy, X-Forwarded-Proto, Secure); more values in the unit tests.
    let table = [
        (false, "https", true),
        (false, "HTTPS", false),
        (false, "https,http", false),
        (true, "HTTPS", true),
        (true, "https,http", true),
        (true, "http,https", false),
    ];
    for behind_proxy in [false, true] {
        let s = TestServer::with_config(ServerConfig { api_auth: ApiAuth::None, behind_proxy, ..ServerConfig::default() }).await;
        operator(&s).await;
        for (trusted, proto, secure) in table.iter().copied().filter(|(trusted, _, _)| *trusted == behind_proxy) {
            let r = sign_in(&s, &[("x-forwarded-proto", proto)]).await;
            let cookie = r.header("set-cookie").expect("a session cookie").to_owned();
            let case = format!("behind a proxy: {trusted}, X-Forwarded-Proto: {proto:?}: {cookie}");
            assert_eq!(cookie.contains("; Secure"), secure, "{case}");
            let name = if secure { SECURE_SESSION_COOKIE } else { SESSION_COOKIE };
            let token = session_token(&r, name);
            // The cookie signs in under its name, through the same proxy; over HTTPS a
            // plain-named cookie does not (it could have been planted).
            let cookie = format!("{name}={token}");
            assert_eq!(s.raw("GET", "/jobs", &[("cookie", &cookie), ("x-forwarded-proto", proto)], Vec::new()).await.status, StatusCode::OK, "{case}");
            if secure {
                let planted = format!("{SESSION_COOKIE}={token}");
                let r = s.raw("GET", "/jobs", &[("cookie", &planted), ("x-forwarded-proto", proto)], Vec::new()).await;
                assert_eq!(r.status, StatusCode::SEE_OTHER, "{case}");
            }
        }
        let r = sign_in(&s, &[]).await;
        assert!(!r.header("set-cookie").expect("a session cookie").contains("Secure"), "no header, no --secure-cookies: not Secure");
    }

    // Moving to the `__Host-` cookie ends the plain one's session (from before the server was
    // told it is behind HTTPS) and clears that cookie.
    let s = TestServer::with_config(ServerConfig { api_auth: ApiAuth::None, secure_cookies: true, ..ServerConfig::default() }).await;
    operator(&s).await;
    let olivia = s.db.store.operator("olivia").await.expect("db").expect("olivia");
    let plain = "0a".repeat(32);
    s.db.store.create_session(olivia.id, &hash_token(&plain), "csrf", Duration::from_secs(3600)).await.expect("a plain session");
    assert_eq!(page(&s, "/jobs", &format!("{SESSION_COOKIE}={plain}")).await.status, StatusCode::SEE_OTHER, "over HTTPS a plain cookie does not sign in");
    let r = sign_in(&s, &[("cookie", &format!("{SESSION_COOKIE}={plain}"))]).await;
    let cookies: Vec<&str> = r.headers.get_all("set-cookie").iter().filter_map(|v| v.to_str().ok()).collect();
    assert!(cookies[0].starts_with(&format!("{SECURE_SESSION_COOKIE}=")) && cookies[0].contains("; Secure"), "{cookies:?}");
    assert!(cookies.iter().any(|c| c.starts_with(&format!("{SESSION_COOKIE}=;")) && c.contains("Max-Age=0")), "{cookies:?}");
    assert_eq!(seen_secs_ago(&s, &plain).await, None);
    // The device cookie is `__Host-` too, and over HTTPS only that name marks a known browser.
    let device = set_cookie_value(&r, SECURE_DEVICE_COOKIE).expect("a __Host- device cookie");
    assert!(cookies.iter().any(|c| c.starts_with(SECURE_DEVICE_COOKIE) && c.contains("; Secure") && c.contains("Path=/")), "{cookies:?}");
    assert_eq!(set_cookie_value(&r, DEVICE_COOKIE), None, "{cookies:?}");
    sqlx::query("INSERT INTO login_failures (key, failures, last_failed_at) VALUES ('account:olivia', 9, now())").execute(s.db.store.pool()).await.expect("failures");
    let r = sign_in(&s, &[("cookie", &format!("{DEVICE_COOKIE}={device}"))]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "a plain-named device cookie is a stranger's over HTTPS: {}", r.text);
    let r = sign_in(&s, &[("cookie", &format!("{SECURE_DEVICE_COOKIE}={device}"))]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_answers_are_not_cached_but_static_files_may_be() {
    let s = TestServer::new().await;
    operator(&s).await;
    let token = session_token(&sign_in(&s, &[]).await, SESSION_COOKIE);
    let cookie = format!("{SESSION_COOKIE}={token}");

    let r = page(&s, "/jobs", &cookie).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.text.contains("name=\"csrf\""), "the page carries the CSRF token");
    assert_eq!(r.header("cache-control"), Some("no-store"), "a page");
    assert_eq!(s.get("/login").await.header("cache-control"), Some("no-store"), "the login page");
    let r = s.raw("POST", "/api/whoami", &[("cookie", &cookie), ("accept", "application/json"), ("content-type", "application/x-www-form-urlencoded")], Vec::new()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["username"], "olivia", "{}", r.text);
    assert_eq!(r.header("cache-control"), Some("no-store"), "a server function's answer");

    // The front end's files are not dashboard answers (whether or not the site is built here).
    for path in ["/pkg/rebound.css", "/pkg/rebound.wasm"] {
        let r = s.raw("GET", path, &[("cookie", &cookie)], Vec::new()).await;
        assert!(r.status == StatusCode::OK || r.status == StatusCode::NOT_FOUND, "{path}: {}", r.status);
        assert_ne!(r.header("cache-control"), Some("no-store"), "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_sign_in_is_refused_without_waiting_for_a_password_check() {
    let s = TestServer::new().await;
    operator(&s).await;
    // Enough recent failures for the account to wait half a minute.
    sqlx::query("INSERT INTO login_failures (key, failures, last_failed_at) VALUES ('account:olivia', 9, now())")
        .execute(s.db.store.pool())
        .await
        .expect("failures");
    // Every turn at a password check is taken, as by a flood of sign-ins.
    let turns = u32::try_from(CONCURRENT_PASSWORD_CHECKS).expect("a few");
    let held = s.state.password_checks.clone().acquire_many_owned(turns).await.expect("the turns");

    let started = Instant::now();
    let r = sign_in(&s, &[]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text);
    assert!(r.header("retry-after").is_some_and(|secs| secs.parse::<u64>().is_ok_and(|n| n > 20)), "{:?}", r.header("retry-after"));
    assert!(started.elapsed() < Duration::from_secs(5), "the throttled sign-in waited {:?}", started.elapsed());
    let failures: i32 = sqlx::query_scalar("SELECT failures FROM login_failures WHERE key = 'account:olivia'")
        .fetch_one(s.db.store.pool())
        .await
        .expect("failures");
    assert_eq!(failures, 9, "a refused attempt is not counted");
    drop(held);
}

/// The value of cookie `name` among the `Set-Cookie` headers of `r`.
fn set_cookie_value(r: &Reply, name: &str) -> Option<String> {
    let prefix = format!("{name}=");
    r.headers.get_all("set-cookie").iter().filter_map(|v| v.to_str().ok()).find_map(|c| c.split(';').next()?.strip_prefix(prefix.as_str()).map(str::to_owned))
}

/// How many failures `key` has on record.
async fn failures_of(s: &TestServer, key: &str) -> Option<i32> {
    sqlx::query_scalar("SELECT failures FROM login_failures WHERE key = $1").bind(key).fetch_optional(s.db.store.pool()).await.expect("failures")
}

/// A browser Olivia signed in from keeps a device cookie. While guesses have her account
/// throttled and hold every turn at a password check that strangers share, a sign-in from
/// that browser still goes through (throttled only by the device's own failures, with its own
/// turn); without the cookie, with a cookie no sign-in issued, or with hers under another
/// name, the same sign-in is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_its_operator_signed_in_from_signs_in_while_guessers_hold_every_throttle_and_turn() {
    let s = TestServer::new().await;
    operator(&s).await;
    s.db.store.upsert_operator("bob", &hash_password("bob's own").expect("hash"), Role::Viewer, &Actor::system("test")).await.expect("bob");
    let first = sign_in(&s, &[]).await;
    assert_eq!(first.status, StatusCode::SEE_OTHER, "{}", first.text);
    let device = set_cookie_value(&first, DEVICE_COOKIE).expect("a device cookie");
    let set = first.headers.get_all("set-cookie").iter().filter_map(|v| v.to_str().ok()).find(|c| c.starts_with(DEVICE_COOKIE)).expect("the header");
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=2592000"] {
        assert!(set.contains(attribute), "{attribute} in {set}");
    }

    // Guessers have the account waiting half a minute and hold every shared turn.
    sqlx::query("INSERT INTO login_failures (key, failures, last_failed_at) VALUES ('account:olivia', 9, now()), ('account:bob', 9, now())")
        .execute(s.db.store.pool())
        .await
        .expect("failures");
    let turns = u32::try_from(CONCURRENT_PASSWORD_CHECKS).expect("a few");
    let held = s.state.password_checks.clone().acquire_many_owned(turns).await.expect("the turns");

    let s = &s;
    let with = |cookie: String| async move { sign_in(s, &[("cookie", cookie.as_str())]).await };
    let started = Instant::now();
    let r = with(format!("{DEVICE_COOKIE}={device}")).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    assert_eq!(r.header("location"), Some("/jobs"));
    assert!(set_cookie_value(&r, SESSION_COOKIE).is_some_and(|v| !v.is_empty()), "a session: {:?}", r.headers);
    assert_eq!(set_cookie_value(&r, DEVICE_COOKIE).as_deref(), Some(device.as_str()), "the same device, renewed");
    // Far below the 10 s a sign-in waits for a turn before a 503, with room for a slow
    // password check in a debug build on a busy machine.
    assert!(started.elapsed() < Duration::from_secs(9), "the known browser waited {:?}", started.elapsed());
    assert_eq!(failures_of(s, "account:olivia").await, Some(9), "the guessers' count is not reset by the known browser");

    // Without it, with a token no sign-in issued, or with Olivia's under Bob's name: refused.
    let stranger = generate_token().expect("randomness");
    let stranger = stranger.rsplit('_').next().expect("hex");
    for cookie in [String::new(), format!("{DEVICE_COOKIE}={stranger}")] {
        let r = with(cookie.clone()).await;
        assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{cookie:?}: {}", r.text);
    }
    let r = s
        .raw(
            "POST",
            "/auth/login",
            &[("content-type", "application/x-www-form-urlencoded"), ("accept", "text/html"), ("cookie", &format!("{DEVICE_COOKIE}={device}"))],
            b"username=bob&password=bob%27s+own&next=%2Fjobs".to_vec(),
        )
        .await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "Olivia's browser is not Bob's: {}", r.text);
    drop(held);

    // A wrong password from the known browser counts against the device, not the account;
    // it waits for Olivia's own turn (held here as by another sign-in of hers), while Bob's
    // known browser is not held up by it.
    let bob_device = {
        let headers = [("content-type", "application/x-www-form-urlencoded"), ("accept", "text/html")];
        sqlx::query("DELETE FROM login_failures WHERE key = 'account:bob'").execute(s.db.store.pool()).await.expect("failures");
        let r = s.raw("POST", "/auth/login", &headers, b"username=bob&password=bob%27s+own&next=%2Fjobs".to_vec()).await;
        set_cookie_value(&r, DEVICE_COOKIE).expect("Bob's device")
    };
    let device_turn = s.state.known_browser_turns.take("olivia").await.expect("Olivia's turn");
    let bob_cookie = format!("{DEVICE_COOKIE}={bob_device}");
    let headers = [("content-type", "application/x-www-form-urlencoded"), ("accept", "text/html"), ("cookie", bob_cookie.as_str())];
    let r = tokio::time::timeout(Duration::from_secs(30), s.raw("POST", "/auth/login", &headers, b"username=bob&password=bob%27s+own&next=%2Fjobs".to_vec()))
        .await
        .expect("Bob's known browser waited for Olivia's turn");
    assert_eq!(r.header("location"), Some("/jobs"), "{}", r.text);
    let cookie = format!("{DEVICE_COOKIE}={device}");
    let started = Instant::now();
    let headers = [("content-type", "application/x-www-form-urlencoded"), ("accept", "text/html"), ("cookie", cookie.as_str())];
    let attempt = s.raw("POST", "/auth/login", &headers, b"username=olivia&password=wrong&next=%2Fjobs".to_vec());
    let release = async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        drop(device_turn);
    };
    let (r, ()) = tokio::join!(attempt, release);
    assert!(started.elapsed() >= Duration::from_millis(500), "the known browser's attempt waited for Olivia's turn");
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    assert!(r.header("location").is_some_and(|l| l.starts_with("/login?error=1")), "{:?}", r.header("location"));
    let device_key = format!("device:{}", hash_token(&device));
    assert_eq!(failures_of(s, &device_key).await, Some(1));
    assert_eq!(failures_of(s, "account:olivia").await, Some(9), "the account's count is untouched");

    // The fifth failure in a row forgets the browser: with the right password it is now a
    // stranger, held by the account's wait.
    sqlx::query("UPDATE login_failures SET failures = 4, last_failed_at = now() - interval '10 seconds' WHERE key = $1")
        .bind(&device_key)
        .execute(s.db.store.pool())
        .await
        .expect("failures");
    let r = s.raw("POST", "/auth/login", &headers, b"username=olivia&password=wrong&next=%2Fjobs".to_vec()).await;
    assert!(r.header("location").is_some_and(|l| l.starts_with("/login?error=1")), "{}: {:?}", r.status, r.header("location"));
    let known: i64 = sqlx::query_scalar("SELECT count(*) FROM sign_in_devices WHERE token_hash = $1").bind(hash_token(&device)).fetch_one(s.db.store.pool()).await.expect("count");
    assert_eq!(known, 0, "forgotten after five failures");
    let r = with(format!("{DEVICE_COOKIE}={device}")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text);
}

/// Behind a proxy, every /64 of one IPv6 /48 counts toward the /48's failures: once it has
/// had its 30 free ones, a sign-in from a /64 that never failed waits too, while another
/// network signs in. A success takes its attempt back from the address and the network.
#[tokio::test]
async fn many_addresses_of_one_network_share_its_failures() {
    let s = TestServer::with_config(ServerConfig { behind_proxy: true, ..ServerConfig::default() }).await;
    operator(&s).await;
    sqlx::query("INSERT INTO login_failures (key, failures, last_failed_at) VALUES ('network:2001:db8:1::/48', 31, now())")
        .execute(s.db.store.pool())
        .await
        .expect("failures");
    let r = sign_in(&s, &[("x-forwarded-for", "2001:db8:1:99::5")]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text);
    let r = sign_in(&s, &[("x-forwarded-for", "2001:db8:2:99::5")]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    assert_eq!(failures_of(&s, "network:2001:db8:2::/48").await, Some(0), "taken back");
    assert_eq!(failures_of(&s, "address:2001:db8:2:99::/64").await, Some(0), "taken back");
}

/// ojs-rate-limiting §10.4: each API token has its own bucket of requests. Every answer says
/// where the caller stands (`X-RateLimit-Limit`, `-Remaining`, `-Reset`); past the burst a
/// request is a 429 `rate_limited` with a decimal `Retry-After`, and runs nothing; another
/// token is not held back, and the bucket refills at the rate.
#[tokio::test]
async fn each_token_has_a_bucket_of_requests_and_past_it_gets_429_with_the_headers() {
    let s = TestServer::with_config(ServerConfig { api_auth: ApiAuth::Token, api_rate_limit: 1, api_rate_burst: 3, ..ServerConfig::default() }).await;
    let (a, b) = (generate_token().expect("randomness"), generate_token().expect("randomness"));
    s.db.store.create_token("svc-a", &hash_token(&a), &Actor::new("test")).await.expect("create token");
    s.db.store.create_token("svc-b", &hash_token(&b), &Actor::new("test")).await.expect("create token");
    let s = &s;
    let enqueue = |token: &str| {
        let auth = format!("Bearer {token}");
        let body = json!({"type": "limited.job", "args": []}).to_string().into_bytes();
        async move { s.raw("POST", "/ojs/v1/jobs", &[("authorization", auth.as_str()), ("content-type", JSON)], body).await }
    };
    let now = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs();
    // The bucket drips one request in a second while these run, so on a loaded machine (one
    // request can take a second or more) more may be let in and more may remain: each figure
    // is checked against what the time taken so far allows, and requests go on until refused.
    let began = std::time::Instant::now();
    let mut created = 0_u64;
    let r = loop {
        let sent = now();
        let r = enqueue(&a).await;
        let answered = now();
        if r.status == StatusCode::TOO_MANY_REQUESTS {
            break r;
        }
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
        created += 1;
        assert!(created < 20, "never refused");
        let dripped = began.elapsed().as_secs() + 1;
        assert!(created <= 3 + dripped, "{created} let in after {:?}", began.elapsed());
        assert_eq!(r.header("x-ratelimit-limit"), Some("3"), "{:?}", r.headers);
        let remaining: u64 = r.header("x-ratelimit-remaining").and_then(|v| v.parse().ok()).expect("remaining");
        let least = 3_u64.saturating_sub(created);
        assert!((least..=(least + dripped).min(2)).contains(&remaining), "{remaining} left after {created} in {:?}", began.elapsed());
        let reset: u64 = r.header("x-ratelimit-reset").and_then(|v| v.parse().ok()).expect("a reset time");
        assert!((sent..=answered + 2).contains(&reset), "{reset} vs sent {sent}, answered {answered}");
    };
    assert!(created >= 3, "the burst is let in: {created}");
    r.assert_ojs_error("rate limited");
    assert_eq!((r.body["error"]["code"].as_str(), r.body["error"]["retryable"].as_bool()), (Some("rate_limited"), Some(true)), "{}", r.text);
    let wait: f64 = r.header("retry-after").and_then(|v| v.parse().ok()).expect("a decimal Retry-After");
    assert!(wait > 0.0 && wait <= 1.0, "one request drips in every second: {wait}");
    assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(s.job_count().await, created as i64, "the refused request ran nothing");
    let r = enqueue(&b).await;
    assert_eq!((r.status, r.header("x-ratelimit-remaining")), (StatusCode::CREATED, Some("2")), "another token has its own bucket: {}", r.text);
    tokio::time::sleep(Duration::from_secs_f64(wait) + Duration::from_millis(10)).await;
    let r = enqueue(&a).await;
    assert_eq!(r.status, StatusCode::CREATED, "refilled: {}", r.text);
    // A request that is not let in is not counted: strangers cannot empty a token's bucket.
    let r = s.raw("GET", "/ojs/v1/queues", &[("authorization", "Bearer nope")], Vec::new()).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text);
    assert_eq!(r.header("x-ratelimit-limit"), None);
}

/// Credentials no sign-in or `token create` could have written are refused without a look-up,
/// so a flood of junk costs the database nothing; well-formed ones are looked up as before.
#[tokio::test]
async fn junk_tokens_and_session_cookies_are_refused_without_a_look_up() {
    use axum::body::Body;
    use axum::http::Request;
    use rebound_queue::testing::{Fault, FaultPoint, FaultProxy, TestDb};
    use tower::ServiceExt;

    let db = TestDb::new().await;
    let proxy = FaultProxy::in_front_of(&db.url).await;
    let store = rebound_queue::Store::connect(&proxy.url(&db.name), 2).await.expect("connect through the proxy");
    let app = rebound_server::router(rebound_server::AppState::new(store, ServerConfig { api_auth: ApiAuth::Token, ..ServerConfig::default() }));
    // Armed only to count: each statement naming the table is let through untouched.
    let counted = |sql: &str| proxy.inject(Fault { sql: sql.into(), point: FaultPoint::Delay(Duration::ZERO), times: u32::MAX });
    let (token_reads, session_reads) = (counted("FROM api_tokens"), counted("FROM sessions"));
    let send = |header: (&'static str, String), path: &'static str| {
        let app = app.clone();
        async move {
            let req = Request::builder().uri(path).header(header.0, header.1).body(Body::empty()).expect("request");
            app.oneshot(req).await.expect("infallible").status()
        }
    };

    let token = generate_token().expect("randomness");
    let secret = &token[4..];
    for (bearer, cookie) in [
        ("x".to_owned(), "x".to_owned()),
        (format!("{token}0"), format!("{secret}0")),
        (token.to_uppercase(), secret.to_uppercase()),
        (secret.to_owned(), token.clone()),
    ] {
        assert_eq!(send(("authorization", format!("Bearer {bearer}")), "/ojs/v1/queues").await, StatusCode::UNAUTHORIZED, "{bearer}");
        assert_eq!(send(("cookie", format!("{SESSION_COOKIE}={cookie}")), "/jobs").await, StatusCode::SEE_OTHER, "{cookie}");
    }
    assert_eq!((token_reads.count(), session_reads.count()), (0, 0), "junk was looked up");

    assert_eq!(send(("authorization", format!("Bearer {token}")), "/ojs/v1/queues").await, StatusCode::UNAUTHORIZED);
    assert_eq!(send(("cookie", format!("{SESSION_COOKIE}={secret}")), "/jobs").await, StatusCode::SEE_OTHER);
    assert_eq!((token_reads.count(), session_reads.count()), (1, 1), "a well-formed unknown token is looked up");
}

/// Well-formed credentials have to be looked up to be told from live ones, before any
/// per-caller limit applies; an address that keeps sending unknown ones is stopped looking
/// (the API and the dashboard counted apart): the API answers 429, the dashboard treats it as
/// signed out. Other addresses are not held back, nor credentials found live lately.
#[tokio::test]
async fn an_address_sending_unknown_credentials_is_stopped_looking_and_others_are_not() {
    use axum::body::Body;
    use axum::extract::ConnectInfo;
    use axum::http::Request;
    use rebound_server::unknown_credentials::UNKNOWN_PER_WINDOW;
    use std::net::SocketAddr;

    let s = token_server().await;
    operator(&s).await;
    let live = generate_token().expect("randomness");
    s.db.store.create_token("ci", &hash_token(&live), &Actor::new("test")).await.expect("create token");
    let (guesser, other) = (SocketAddr::from(([192, 0, 2, 1], 40000)), SocketAddr::from(([192, 0, 2, 2], 40000)));
    let from = |address: SocketAddr, path: &str, header: (&str, String)| {
        let mut req = Request::builder().uri(path).header(header.0, header.1).body(Body::empty()).expect("request");
        req.extensions_mut().insert(ConnectInfo(address));
        req
    };
    let bearer = |t: &str| ("authorization", format!("Bearer {t}"));

    for _ in 0..UNKNOWN_PER_WINDOW {
        let guess = generate_token().expect("randomness");
        assert_eq!(s.send(from(guesser, "/ojs/v1/queues", bearer(&guess))).await.status, StatusCode::UNAUTHORIZED);
    }
    // Past the limit, not even the live token is looked up from that address.
    let r = s.send(from(guesser, "/ojs/v1/queues", bearer(&live))).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text);
    r.assert_ojs_error("unknown credentials");
    let retry_after: u64 = r.header("retry-after").and_then(|v| v.parse().ok()).expect("Retry-After in seconds");
    assert!((1..=10).contains(&retry_after), "{retry_after}");
    // The dashboard counts apart: the address's session cookies are still looked up.
    let session = session_token(&sign_in(&s, &[]).await, SESSION_COOKIE);
    let cookie = format!("{SESSION_COOKIE}={session}");
    assert_eq!(s.send(from(guesser, "/jobs", ("cookie", cookie.clone()))).await.status, StatusCode::OK);
    for _ in 0..UNKNOWN_PER_WINDOW {
        let guess = &generate_token().expect("randomness")[4..];
        let r = s.send(from(guesser, "/jobs", ("cookie", format!("{SESSION_COOKIE}={guess}")))).await;
        assert_eq!(r.status, StatusCode::SEE_OTHER);
        // A cookie that names no session is cleared: a stale tab stops sending it.
        assert!(r.headers.get_all("set-cookie").iter().any(|c| c.to_str().is_ok_and(|c| c.starts_with(&format!("{SESSION_COOKIE}=;")))), "{:?}", r.headers);
    }
    let fresh = session_token(&sign_in(&s, &[]).await, SESSION_COOKIE);
    let fresh_cookie = format!("{SESSION_COOKIE}={fresh}");
    let r = s.send(from(guesser, "/jobs", ("cookie", fresh_cookie.clone()))).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "a session not yet seen live is not looked up from there");
    assert!(r.header("set-cookie").is_none(), "a cookie not looked up is not cleared");

    // Another address is not held back, and its live credentials work; once found live, they
    // are looked up from the held-back address too.
    assert_eq!(s.send(from(other, "/ojs/v1/queues", bearer(&live))).await.status, StatusCode::OK);
    assert_eq!(s.send(from(other, "/jobs", ("cookie", fresh_cookie.clone()))).await.status, StatusCode::OK);
    assert_eq!(s.send(from(guesser, "/ojs/v1/queues", bearer(&live))).await.status, StatusCode::OK);
    assert_eq!(s.send(from(guesser, "/jobs", ("cookie", fresh_cookie))).await.status, StatusCode::OK);
}

/// A HEAD of a dashboard page is a page load: signed out, it is sent to sign in, not rendered.
#[tokio::test]
async fn a_signed_out_head_of_a_page_is_sent_to_sign_in() {
    let s = TestServer::new().await;
    let r = s.raw("HEAD", "/jobs", &[], Vec::new()).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert_eq!(r.header("location"), Some("/login?next=%2Fjobs"));
}
