//! The dashboard against hostile input (issue 13): every bad request is a 4xx (or the page's
//! error), never a 5xx, and writes nothing; cross-site and token-less mutations are refused
//! first; `next` never leaves the site; password guessing is slowed; changed credentials end
//! sessions; internal errors show only a request id; every response carries the security
//! headers; a link cannot make a page show an error the server did not produce.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use rebound_queue::outcome::{HandlerError, Outcome};
use rebound_queue::store::{AuditFilter, ClaimRequest, Failure, Role};
use rebound_queue::{Job, JobState, NewJob, PolicyPatch};
use rebound_server::auth::hash_token;
use rebound_server::config::{ApiAuth, ServerConfig};
use rebound_server::dashboard_auth::SESSION_COOKIE;
use serde_json::json;
use tower::ServiceExt;

mod dashboard_support;
use dashboard_support::{Browser, Dashboard, Reply, form};

impl Dashboard {
    /// A POST with a raw body and extra headers; `html` makes it a browser form without JS.
    async fn post(&self, path: &str, browser: Option<&Browser>, body: String, html: bool, extra: &[(&str, &str)]) -> Reply {
        let mut req = Request::post(path).header("content-type", "application/x-www-form-urlencoded").header("content-length", body.len());
        if let Some(b) = browser {
            req = req.header("cookie", format!("{SESSION_COOKIE}={}", b.cookie));
        }
        req = if html {
            req.header("accept", "text/html,application/xhtml+xml").header("referer", "http://localhost/queues")
        } else {
            req.header("accept", "application/json")
        };
        for (k, v) in extra {
            req = req.header(*k, *v);
        }
        self.send(req.body(Body::from(body)).expect("request")).await
    }

    async fn get(&self, path: &str, cookies: &[String]) -> Reply {
        let mut req = Request::get(path);
        if !cookies.is_empty() {
            req = req.header("cookie", cookies.join("; "));
        }
        self.send(req.body(Body::empty()).expect("request")).await
    }

    async fn login(&self, name: &str, password: &str, next: &str, extra: &[(&str, &str)]) -> Reply {
        self.post("/auth/login", None, form(&[("username", name), ("password", password), ("next", next)]), true, extra).await
    }

    async fn sign_in(&self, name: &str, password: &str) -> Browser {
        let r = self.login(name, password, "/", &[]).await;
        assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
        let cookie = r
            .header("set-cookie")
            .and_then(|c| c.split(';').next())
            .and_then(|kv| kv.strip_prefix(&format!("{SESSION_COOKIE}=")))
            .expect("the session cookie")
            .to_string();
        let session = self.db.store.session(&hash_token(&cookie)).await.expect("db").expect("a live session");
        Browser { cookie, csrf: session.csrf_token }
    }

    fn cookie(b: &Browser) -> String {
        format!("{SESSION_COOKIE}={}", b.cookie)
    }

    async fn dead_letter(&self, job_type: &str) -> Job {
        let patch = PolicyPatch::from_json(&json!({"max_attempts": 1, "on_exhaustion": "dead_letter"})).expect("patch");
        let job = self.db.store.enqueue(NewJob::new(job_type, json!([1])).retry(patch)).await.expect("enqueue").job;
        let claim = ClaimRequest { worker_id: "w1".into(), queues: vec!["default".into()], limit: 1, visibility_timeout: Duration::from_secs(60) };
        assert_eq!(self.db.store.claim(&claim).await.expect("claim").len(), 1);
        let failure = Failure {
            id: job.id,
            attempt: None,
            worker_id: Some("w1".into()),
            outcome: Outcome::Retry(HandlerError::new("http.5xx", "503")),
            error_code: None,
        };
        self.db.store.fail(&failure).await.expect("fail").job
    }

    async fn audit_count(&self) -> usize {
        self.db.store.audit_log(&AuditFilter { limit: 1000, ..AuditFilter::default() }).await.expect("audit").len()
    }

    async fn count(&self, sql: &'static str) -> i64 {
        sqlx::query_scalar::<_, i64>(sql).fetch_one(self.db.store.pool()).await.expect("count")
    }
}

/// Item 2 and 3: each bad server-function call is answered with the expected 4xx (never 5xx)
/// and leaves the job, the policies, the queues and the audit log as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_server_function_input_is_a_4xx_that_writes_nothing() {
    let d = Dashboard::new().await;
    d.user("olivia", "correct horse", Role::Operator).await;
    let job = d.dead_letter("payment.charge").await;
    let b = d.sign_in("olivia", "correct horse").await;
    d.db.store
        .put_policy("payment.charge", &PolicyPatch::from_json(&json!({"max_attempts": 4})).expect("patch"), &rebound_queue::store::Actor::system("t"), None)
        .await
        .expect("policy");
    let id = job.id.to_string();
    let unknown = "01a203c3-1a5d-733f-b465-1a65fa697edd";
    let csrf = b.csrf.as_str();
    let audit_before = d.audit_count().await;
    let queues_before = d.count("SELECT count(*) FROM queues").await;
    let versions_before = d.count("SELECT count(*) FROM retry_policy_versions").await;

    type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, u16);
    let table: &[Case] = &[
        // CSRF first: a missing or wrong token is 403 whatever else the form holds.
        ("/api/act_on_job", vec![("id", id.as_str()), ("action", "redrive")], 403),
        ("/api/act_on_job", vec![("csrf", "forged"), ("id", id.as_str()), ("action", "redrive")], 403),
        ("/api/act_on_job", vec![("action", "nonsense")], 403),
        ("/api/set_queue_paused", vec![("queue", "q\u{0}"), ("paused", "true")], 403),
        // Then the arguments.
        ("/api/act_on_job", vec![("csrf", csrf), ("action", "redrive")], 400),
        ("/api/act_on_job", vec![("csrf", csrf), ("id", "not-a-job-id"), ("action", "redrive")], 422),
        ("/api/act_on_job", vec![("csrf", csrf), ("id", unknown), ("action", "redrive")], 404),
        ("/api/act_on_job", vec![("csrf", csrf), ("id", unknown), ("action", "cancel")], 404),
        ("/api/act_on_job", vec![("csrf", csrf), ("id", id.as_str()), ("action", "explode")], 422),
        ("/api/redrive_dead_letters", vec![("csrf", csrf), ("scope", "selected"), ("ids[]", unknown)], 409),
        ("/api/redrive_dead_letters", vec![("csrf", csrf), ("scope", "selected"), ("ids[]", "x")], 422),
        ("/api/redrive_dead_letters", vec![("csrf", csrf), ("scope", "filter"), ("how[stagger]", "5000000000000")], 422),
        ("/api/save_policy", vec![("csrf", csrf), ("job_type", "Not A Type"), ("policy[max_attempts]", "3"), ("intent", "save")], 422),
        ("/api/save_policy", vec![("csrf", csrf), ("job_type", "payment.charge"), ("policy[max_attempts]", "many"), ("intent", "save")], 422),
        ("/api/restore_policy", vec![("csrf", csrf), ("job_type", "payment.charge"), ("version", "two")], 400),
        ("/api/restore_policy", vec![("csrf", csrf), ("job_type", "payment.charge"), ("version", "99")], 404),
        ("/api/restore_policy", vec![("csrf", csrf), ("job_type", "payment.charge"), ("version", "-1")], 422),
        ("/api/restore_policy", vec![("csrf", csrf), ("job_type", "payment.charge")], 400),
        ("/api/reset_policy", vec![("csrf", csrf), ("job_type", "bad type")], 422),
        ("/api/set_queue_paused", vec![("csrf", csrf), ("queue", "two words"), ("paused", "true")], 422),
        ("/api/set_queue_paused", vec![("csrf", csrf), ("queue", "nul\u{0}queue"), ("paused", "true")], 400),
        ("/api/set_queue_paused", vec![("csrf", csrf), ("queue", "emails"), ("paused", "maybe")], 422),
        ("/api/set_queue_rate_limit", vec![("csrf", csrf), ("queue", "Emails!"), ("limit[concurrency]", "2"), ("limit[rate_limit]", ""), ("limit[rate_period]", ""), ("limit[throttle_limit]", ""), ("limit[throttle_period]", "")], 422),
        ("/api/bulk_jobs", vec![("csrf", csrf), ("action", "cancel"), ("scope", "everything"), ("confirm", "yes")], 422),
        ("/api/act_on_cron", vec![("csrf", csrf), ("name", "nightly"), ("action", "pause")], 404),
        ("/api/request_worker_state", vec![("worker", "w"), ("state", "quiet")], 403),
        ("/api/set_maintenance", vec![("enabled", "true")], 403),
        ("/api/set_maintenance", vec![("csrf", csrf), ("enabled", "maybe")], 422),
        ("/api/set_maintenance", vec![("csrf", csrf), ("enabled", "true"), ("reason", "bell\u{7}")], 422),
        ("/api/request_worker_state", vec![("csrf", csrf), ("worker", "nobody"), ("state", "quiet")], 404),
        ("/api/request_worker_state", vec![("csrf", csrf), ("worker", "nobody"), ("state", "explode")], 422),
        ("/api/request_worker_state", vec![("csrf", csrf), ("worker", ""), ("state", "terminate")], 422),
        ("/api/request_worker_state", vec![("csrf", csrf), ("worker", "bell\u{7}"), ("state", "quiet")], 422),
        ("/api/request_worker_state", vec![("csrf", csrf), ("state", "quiet")], 400),
        // Reads.
        ("/api/audit_log", vec![("query[before]", "yesterday")], 422),
        ("/api/audit_log", vec![], 400),
        ("/api/load_job", vec![("id", "../../etc/passwd")], 422),
        ("/api/load_job", vec![("id", unknown)], 404),
        ("/api/load_policy_editor", vec![("job_type", "DROP TABLE")], 422),
        ("/api/list_jobs", vec![("after", "not-a-cursor")], 422),
        ("/api/list_jobs", vec![("query[queue]", "a\u{0}")], 400),
        ("/api/no_such_function", vec![("csrf", csrf)], 404),
    ];
    for (path, fields, expected) in table {
        let r = d.post(path, Some(&b), form(fields), false, &[]).await;
        assert_eq!(r.status.as_u16(), *expected, "{path} {fields:?}: {}", r.text);
        assert!(r.text.len() > 2 || *path == "/api/no_such_function", "{path} {fields:?}: the refusal says why");
    }

    for page in ["/jobs?queue=a%00", "/audit?before=1%00", "/dead-letters?type=%00"] {
        let r = d.get(page, &[Dashboard::cookie(&b)]).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{page}: {}", r.text);
    }

    let after = d.db.store.job(job.id).await.expect("job");
    assert_eq!((after.state, after.dead_letter), (JobState::Discarded, true), "the dead letter is untouched");
    let audit = d.db.store.audit_log(&AuditFilter { limit: 1000, ..AuditFilter::default() }).await.expect("audit");
    assert_eq!(audit.len(), audit_before, "nothing audited, so nothing done: {audit:?}");
    assert_eq!(d.count("SELECT count(*) FROM queues").await, queues_before, "no queue created");
    assert_eq!(d.count("SELECT count(*) FROM retry_policy_versions").await, versions_before, "no policy version written");
}

/// Item 2 (body limit) and 3: a 3 MiB body is refused before the session is looked at; a plain
/// form post without the token is a 403 page; cross-site requests are refused even with the
/// token; logout cannot be forced from another site.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_bodies_cross_site_posts_and_forced_logouts_are_refused() {
    let d = Dashboard::new().await;
    d.user("olivia", "correct horse", Role::Operator).await;
    let b = d.sign_in("olivia", "correct horse").await;
    let audit_before = d.audit_count().await;
    let big = format!("csrf=x&queue={}", "a".repeat(3 * 1024 * 1024));
    for (path, browser) in [("/api/set_queue_paused", None), ("/api/set_queue_paused", Some(&b)), ("/api/list_jobs", None), ("/auth/login", None), ("/auth/logout", Some(&b))] {
        let r = d.post(path, browser, big.clone(), false, &[]).await;
        assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{path} signed in: {}", browser.is_some());
    }
    // No Content-Length (a streamed body): still refused once it passes the limit.
    let req = Request::post("/api/set_queue_paused")
        .header("content-type", "application/x-www-form-urlencoded")
        .header("cookie", format!("{SESSION_COOKIE}={}", b.cookie))
        .body(Body::from_stream(futures::stream::iter(big.as_bytes().chunks(64 * 1024).map(|c| Ok::<_, std::io::Error>(c.to_vec())).collect::<Vec<_>>())))
        .expect("request");
    assert_eq!(d.send(req).await.status, StatusCode::PAYLOAD_TOO_LARGE);
    // Signed out, a mutation is refused before its body is read: one that never ends gets
    // its 403 at once instead of holding the connection.
    let never = futures::stream::pending::<Result<Vec<u8>, std::io::Error>>();
    let req = Request::post("/api/set_queue_paused").header("content-type", "application/x-www-form-urlencoded").body(Body::from_stream(never)).expect("request");
    let refused = tokio::time::timeout(Duration::from_secs(10), d.send(req)).await.expect("answered without reading the body");
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.text);

    let no_token = d.post("/api/set_queue_paused", Some(&b), form(&[("queue", "emails"), ("paused", "true")]), true, &[]).await;
    assert_eq!(no_token.status, StatusCode::FORBIDDEN);
    assert!(no_token.text.contains("<h1>Not allowed</h1>") && no_token.text.contains("reload the page"), "{}", no_token.text);

    let with_token = form(&[("csrf", &b.csrf), ("queue", "emails"), ("paused", "true")]);
    for headers in [
        vec![("sec-fetch-site", "cross-site")],
        vec![("sec-fetch-site", "same-site")],
        vec![("origin", "https://evil.example"), ("host", "localhost")],
        vec![("origin", "null"), ("host", "localhost")],
    ] {
        let r = d.post("/api/set_queue_paused", Some(&b), with_token.clone(), false, &headers).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{headers:?}: {}", r.text);
        let r = d.post("/auth/logout", Some(&b), form(&[("csrf", &b.csrf)]), true, &headers).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "logout {headers:?}");
    }
    let r = d.post("/auth/logout", Some(&b), String::new(), true, &[]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "logout without the token");
    assert!(d.db.store.session(&hash_token(&b.cookie)).await.expect("db").is_some(), "still signed in");
    assert_eq!(d.count("SELECT count(*) FROM queues WHERE paused").await, 0, "no queue paused");
    assert_eq!(d.audit_count().await, audit_before);

    // The dashboard's own pages pass: same-origin by either header.
    for headers in [vec![("sec-fetch-site", "same-origin")], vec![("origin", "http://localhost"), ("host", "localhost")]] {
        let r = d.post("/api/set_queue_paused", Some(&b), with_token.clone(), false, &headers).await;
        assert_eq!(r.status, StatusCode::OK, "{headers:?}: {}", r.text);
    }
    // Reads need no token: the queues page refreshes the maintenance state on its own.
    for read in ["/api/maintenance_state", "/api/queues"] {
        let r = d.post(read, Some(&b), String::new(), false, &[("sec-fetch-site", "same-origin")]).await;
        assert_eq!(r.status, StatusCode::OK, "{read}: {}", r.text);
    }
}

/// Item 4 and 8 (login CSRF): `next` is kept only as a path on this site; a login form posted
/// from another site is refused and starts no session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_redirects_stay_on_the_site_and_other_sites_cannot_sign_you_in() {
    let d = Dashboard::new().await;
    d.user("olivia", "correct horse", Role::Operator).await;
    let table = [
        ("/jobs?state=retryable", "/jobs?state=retryable"),
        ("/\t/evil.example", "/"),
        ("/\t\\evil.example", "/"),
        ("/\\evil.example", "/"),
        ("//evil.example", "/"),
        ("/\n/evil.example", "/"),
        ("https://evil.example/", "/"),
        ("javascript:alert(1)", "/"),
        ("/%2F%2Fevil.example", "/%2F%2Fevil.example"),
        ("/./../..//evil.example", "/"),
    ];
    for (next, expected) in table {
        let r = d.login("olivia", "correct horse", next, &[]).await;
        assert_eq!(r.status, StatusCode::SEE_OTHER, "{next:?}");
        assert_eq!(r.header("location"), Some(expected), "next = {next:?}");
    }
    // A wrong password keeps only the cleaned `next` in the login page's URL.
    let r = d.login("olivia", "wrong horse", "/\t/evil.example", &[]).await;
    assert_eq!(r.header("location"), Some("/login?error=1&next=%2F"));

    let sessions = d.count("SELECT count(*) FROM sessions").await;
    for headers in [vec![("sec-fetch-site", "cross-site")], vec![("origin", "https://evil.example"), ("host", "localhost")]] {
        let r = d.login("olivia", "correct horse", "/", &headers).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{headers:?}");
        assert!(r.header("set-cookie").is_none());
    }
    assert_eq!(d.count("SELECT count(*) FROM sessions").await, sessions, "no session started from another site");
}

/// Item 5: after a few wrong passwords the account must wait (429 with Retry-After, even
/// with the right password, and logged as failures); the wait is short, so the real
/// operator gets in a moment later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn password_guessing_is_slowed_but_the_operator_is_not_locked_out() {
    let d = Dashboard::new().await;
    d.user("olivia", "correct horse", Role::Operator).await;
    for i in 0..4 {
        let r = d.login("olivia", &format!("guess {i}"), "/", &[]).await;
        assert_eq!(r.header("location"), Some("/login?error=1&next=%2F"), "guess {i}");
    }
    let failures = "SELECT failures::bigint FROM login_failures WHERE key = 'account:olivia'";
    assert_eq!(d.count(failures).await, 4);
    // Four more guesses just now (set directly: argon2 in a debug build is too slow to time).
    let failed = std::time::Instant::now();
    sqlx::query("UPDATE login_failures SET failures = 8, last_failed_at = now() WHERE key = 'account:olivia'")
        .execute(d.db.store.pool())
        .await
        .expect("update");
    let r = d.login("olivia", "correct horse", "/", &[]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text);
    let retry: u64 = r.header("retry-after").and_then(|s| s.parse().ok()).expect("Retry-After");
    // Less whatever time went by since the failure was set (a loaded machine can take seconds).
    let since = failed.elapsed().as_secs();
    assert!((15_u64.saturating_sub(since)..=16).contains(&retry), "{retry}: 16 s after the 8th failure, {since} s ago");
    assert!(r.header("set-cookie").is_none());
    assert!(r.text.contains("Too many failed sign-ins"), "{}", r.text);
    // Case and spaces do not make a new account to guess at; refused attempts are not counted.
    assert_eq!(d.login(" OLIVIA ", "guess", "/", &[]).await.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(d.count(failures).await, 8);

    // Sixteen seconds later the operator signs in: waits are capped, nobody is locked out.
    sqlx::query("UPDATE login_failures SET last_failed_at = now() - interval '17 seconds' WHERE key = 'account:olivia'")
        .execute(d.db.store.pool())
        .await
        .expect("update");
    let r = d.login("olivia", "correct horse", "/", &[]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
    assert!(r.header("set-cookie").is_some_and(|c| c.starts_with(SESSION_COOKIE)));
    assert_eq!(d.count("SELECT count(*) FROM login_failures WHERE key = 'account:olivia'").await, 0, "a success forgets the account's failures");
    // The cap: however many failures, an account waits at most 30 s.
    sqlx::query("INSERT INTO login_failures (key, failures, last_failed_at) VALUES ('account:olivia', 1000000, now() - interval '31 seconds')")
        .execute(d.db.store.pool())
        .await
        .expect("insert");
    assert_eq!(d.login("olivia", "correct horse", "/", &[]).await.status, StatusCode::SEE_OTHER);
}

/// A username no operator can have (longer than any is allowed to be, here far longer than an
/// index key) is a 400, not a database error, and touches neither the throttle nor a session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_username_longer_than_any_operator_s_is_refused() {
    let d = Dashboard::new().await;
    d.user("olivia", "correct horse", Role::Operator).await;
    // Letters that do not repeat in a pattern, so Postgres could not compress the key small.
    let mut x: u64 = 3;
    let varied: String = (0..200_000)
        .map(|_| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            char::from(b'a' + ((x >> 33) % 26) as u8)
        })
        .collect();
    for name in [varied, "o".repeat(65)] {
        let r = d.login(&name, "correct horse", "/", &[]).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
        assert!(r.text.contains("too long"), "{}", r.text);
        assert!(r.header("set-cookie").is_none());
    }
    assert_eq!(d.count("SELECT count(*) FROM login_failures").await, 0, "not counted: it was never checked");
    // The longest allowed name still signs in.
    let longest = "o".repeat(64);
    d.user(&longest, "correct horse", Role::Operator).await;
    assert_eq!(d.login(&longest, "correct horse", "/", &[]).await.status, StatusCode::SEE_OTHER);
}

/// Item 5: guesses sent in parallel do not slip past the count (each attempt is counted
/// before its password is checked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_guesses_are_counted_before_they_are_checked() {
    let d = Dashboard::new().await;
    d.user("olivia", "correct horse", Role::Operator).await;
    // Eight failures, the last one long enough ago that one more attempt may go ahead; after
    // it the wait is 30 s, so the timing of the parallel requests cannot matter.
    sqlx::query("INSERT INTO login_failures (key, failures, last_failed_at) VALUES ('account:olivia', 8, now() - interval '17 seconds')")
        .execute(d.db.store.pool())
        .await
        .expect("insert");
    let mut handles = Vec::new();
    for i in 0..8 {
        let app = d.app.clone();
        handles.push(tokio::spawn(async move {
            let body = form(&[("username", "olivia"), ("password", &format!("parallel guess {i}"))]);
            let req = Request::post("/auth/login").header("content-type", "application/x-www-form-urlencoded").body(Body::from(body)).expect("request");
            app.oneshot(req).await.expect("infallible").status()
        }));
    }
    let mut statuses = Vec::new();
    for h in handles {
        statuses.push(h.await.expect("task"));
    }
    let checked = statuses.iter().filter(|s| **s == StatusCode::SEE_OTHER).count();
    let throttled = statuses.iter().filter(|s| **s == StatusCode::TOO_MANY_REQUESTS).count();
    assert_eq!((checked, throttled), (1, 7), "{statuses:?}");
    assert_eq!(d.count("SELECT failures::bigint FROM login_failures WHERE key = 'account:olivia'").await, 9);
}

/// Item 8: many wrong logins at once are all answered (a bounded number hash at a time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_logins_are_queued_not_failed() {
    let d = Dashboard::new().await;
    d.user("olivia", "correct horse", Role::Operator).await;
    let mut handles = Vec::new();
    for i in 0..12 {
        let app = d.app.clone();
        handles.push(tokio::spawn(async move {
            let body = form(&[("username", &format!("user{i}")), ("password", "wrong password")]);
            let req = Request::post("/auth/login").header("content-type", "application/x-www-form-urlencoded").body(Body::from(body)).expect("request");
            app.oneshot(req).await.expect("infallible").status()
        }));
    }
    for h in handles {
        let status = h.await.expect("task");
        // Refused, throttled (they all come from one address) or asked to retry; never a 5xx
        // other than that 503.
        let expected = [StatusCode::SEE_OTHER, StatusCode::TOO_MANY_REQUESTS, StatusCode::SERVICE_UNAVAILABLE];
        assert!(expected.contains(&status), "{status}");
    }
}

/// Item 6: a new password (`rebound-server user add` on an existing name), disabling or
/// removing the user ends their live sessions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credential_changes_end_live_sessions() {
    let d = Dashboard::new().await;
    d.user("olivia", "correct horse", Role::Operator).await;
    d.user("victor", "viewer password", Role::Viewer).await;
    d.user("rita", "reader password", Role::Viewer).await;
    let olivia = d.sign_in("olivia", "correct horse").await;
    let victor = d.sign_in("victor", "viewer password").await;
    let rita = d.sign_in("rita", "reader password").await;
    assert_eq!(d.get("/jobs", &[Dashboard::cookie(&olivia)]).await.status, StatusCode::OK);

    // What `rebound-server user add olivia` runs, through the command itself.
    // SAFETY: nextest runs each test in its own process; nothing else reads the variable.
    unsafe { std::env::set_var("REBOUND_PASSWORD", "a brand new password") };
    let cli = <rebound_server::config::Cli as clap::Parser>::try_parse_from([
        "rebound-server",
        "--database-url",
        d.db.url.as_str(),
        "user",
        "add",
        "olivia",
        "--role",
        "operator",
    ])
    .expect("cli");
    rebound_server::commands::run(cli).await.expect("user add");
    let r = d.get("/jobs", &[Dashboard::cookie(&olivia)]).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "the old session is over");
    assert!(r.header("location").is_some_and(|l| l.starts_with("/login")));
    let r = d.post("/api/set_queue_paused", Some(&olivia), form(&[("csrf", &olivia.csrf), ("queue", "emails"), ("paused", "true")]), false, &[]).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);

    // `user disable` and `user remove`.
    for (name, session, command) in [("victor", &victor, "disable"), ("rita", &rita, "remove")] {
        assert_eq!(d.get("/jobs", &[Dashboard::cookie(session)]).await.status, StatusCode::OK);
        let cli = <rebound_server::config::Cli as clap::Parser>::try_parse_from(["rebound-server", "--database-url", d.db.url.as_str(), "user", command, name])
            .expect("cli");
        rebound_server::commands::run(cli).await.expect(command);
        assert_eq!(d.get("/jobs", &[Dashboard::cookie(session)]).await.status, StatusCode::SEE_OTHER, "{command}");
    }
    assert_eq!(d.count("SELECT count(*) FROM sessions").await, 0);
    assert!(d.db.store.operator("rita").await.expect("db").is_none());
}

/// Item 7: a database failure inside a server function reaches the browser as a request id
/// (the one in `X-Request-Id`, logged with the error), never as the database's text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn internal_errors_show_a_request_id_not_the_database_text() {
    let d = Dashboard::new().await;
    d.user("olivia", "correct horse", Role::Operator).await;
    let b = d.sign_in("olivia", "correct horse").await;
    sqlx::query("ALTER TABLE audit_log RENAME TO audit_log_gone").execute(d.db.store.pool()).await.expect("break the audit log");
    let r = d.post("/api/audit_log", Some(&b), form(&[("query[actor]", "x")]), false, &[]).await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    let id = r.header("x-request-id").expect("a request id").to_string();
    assert!(r.text.contains(&id), "{}", r.text);
    for leak in ["audit_log", "relation", "does not exist", "sqlx", "postgres"] {
        assert!(!r.text.to_lowercase().contains(leak), "{leak:?} leaked: {}", r.text);
    }
    let page = d.get("/audit", &[Dashboard::cookie(&b)]).await;
    assert!(page.text.contains("request id req_") && !page.text.contains("does not exist"), "{}", page.text);
    assert_eq!(page.status, StatusCode::INTERNAL_SERVER_ERROR, "the page that shows the failure is not a 200");
}

/// Item 8: security headers on every response; the page's CSP carries the nonce its inline
/// scripts have; `--secure-cookies` marks the session cookie `Secure`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_response_has_the_security_headers() {
    let d = Dashboard::new().await;
    d.user("olivia", "correct horse", Role::Operator).await;
    let b = d.sign_in("olivia", "correct horse").await;
    let page = d.get("/queues", &[Dashboard::cookie(&b)]).await;
    let csp = page.header("content-security-policy").expect("a CSP").to_string();
    let nonce = csp.split("'nonce-").nth(1).and_then(|s| s.split('\'').next()).expect("a nonce");
    assert!(csp.contains("'wasm-unsafe-eval'") && csp.contains("frame-ancestors 'none'") && !csp.contains("unsafe-inline"), "{csp}");
    assert!(page.text.contains(&format!("nonce=\"{nonce}\"")), "the inline scripts carry the nonce");
    let scripts = page.text.matches("<script").count();
    assert_eq!(page.text.matches(&format!("<script nonce=\"{nonce}\"")).count() + page.text.matches(&format!("<script type=\"module\" nonce=\"{nonce}\"")).count(), scripts, "every inline script is allowed by nonce");
    let other = d.get("/queues", &[Dashboard::cookie(&b)]).await;
    assert_ne!(other.header("content-security-policy"), Some(csp.as_str()), "a fresh nonce per response");

    let replies = [
        page,
        d.get("/login", &[]).await,
        d.get("/jobs", &[]).await,
        d.get("/healthz", &[]).await,
        d.get("/ojs/v1/jobs/nope", &[]).await,
        d.get("/no/such/page", &[Dashboard::cookie(&b)]).await,
        d.post("/api/whoami", Some(&b), String::new(), false, &[]).await,
        d.post("/api/set_queue_paused", None, String::new(), false, &[]).await,
    ];
    for r in &replies {
        assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
        assert_eq!(r.header("x-frame-options"), Some("DENY"));
        assert_eq!(r.header("referrer-policy"), Some("same-origin"));
        assert!(r.header("content-security-policy").is_some_and(|c| c.contains("frame-ancestors 'none'")));
        assert!(r.status.as_u16() < 500, "{}", r.status);
    }

    let secure = Dashboard::with_config(ServerConfig { api_auth: ApiAuth::None, secure_cookies: true, ..ServerConfig::default() }).await;
    secure.user("olivia", "correct horse", Role::Operator).await;
    let r = secure.login("olivia", "correct horse", "/", &[]).await;
    let cookie = r.header("set-cookie").expect("cookie");
    assert!(cookie.contains("; Secure") && cookie.contains("; HttpOnly") && cookie.contains("SameSite=Lax"), "{cookie}");
}

/// Item 9: a page shows a server-function error from its URL only when this browser's own
/// form post just produced it; a link with `__err` is sent to the page without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_errors_the_server_produced_for_this_browser_are_shown() {
    let d = Dashboard::new().await;
    d.user("olivia", "correct horse", Role::Operator).await;
    let b = d.sign_in("olivia", "correct horse").await;
    let session = Dashboard::cookie(&b);

    let forged = "eyJGb3JiaWRkZW4iOiJZb3VyIHNlc3Npb24gZXhwaXJlZDogc2lnbiBpbiBhZ2FpbiBhdCBodHRwczovL2V2aWwuZXhhbXBsZS9sb2dpbiJ9";
    let r = d.get(&format!("/queues?x=1&__path=%2Fapi%2Fset_queue_paused&__err={forged}"), std::slice::from_ref(&session)).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert_eq!(r.header("location"), Some("/queues?x=1"));

    // A no-JS form post that fails: the redirect carries the error and a cookie for it.
    let r = d.post("/api/set_queue_paused", Some(&b), form(&[("csrf", &b.csrf), ("queue", "two words"), ("paused", "true")]), true, &[]).await;
    assert_eq!(r.status, StatusCode::FOUND, "{}", r.text);
    let location = r.header("location").expect("back to the page").to_string();
    assert!(location.contains("__err="), "{location}");
    let flash = r.header("set-cookie").and_then(|c| c.split(';').next()).expect("the flash cookie").to_string();
    assert!(flash.starts_with("rebound_flash="), "{flash}");
    let path = location.trim_start_matches("http://localhost");
    let shown = d.get(path, &[session.clone(), flash.clone()]).await;
    // The page a refused action lands on answers with the refusal's status, as the post would
    // have with JavaScript.
    assert_eq!(shown.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", shown.text);
    assert!(shown.text.contains("is not a valid queue name"), "the genuine error shows");
    assert!(shown.header("set-cookie").is_some_and(|c| c.starts_with("rebound_flash=;") && c.contains("Max-Age=0")));
    // Someone else (no cookie) following the same link sees the page without it.
    assert_eq!(d.get(path, std::slice::from_ref(&session)).await.status, StatusCode::SEE_OTHER);
    // The cookie does not vouch for a different error.
    let other = path.replace("__err=", "__err=AAAA");
    assert_eq!(d.get(&other, &[session, flash]).await.status, StatusCode::SEE_OTHER);
}

/// Letters that do not repeat within 26, so any 41 of them in a row are found only where the
/// whole value was echoed.
fn varied(n: usize) -> String {
    (0..n).map(|i| char::from(b'a' + (i % 26) as u8)).collect()
}

/// Pages answer input they refuse with the refusal's status, not a 200 that says so: a filter,
/// id or cursor no request can mean is a 422, a well-formed id of nothing a 404. The page
/// still says why, naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_answer_bad_input_with_its_status() {
    let d = Dashboard::new().await;
    d.user("victor", "viewer password", Role::Viewer).await;
    let b = d.sign_in("victor", "viewer password").await;
    let session = [Dashboard::cookie(&b)];
    let unknown = "01a203c3-1a5d-733f-b465-1a65fa697edd";

    let table: Vec<(String, u16, &str)> = vec![
        ("/jobs?state=bogus".into(), 422, "state: unknown job state"),
        ("/jobs?since=forever".into(), 422, "is not 1h, 24h or 7d"),
        ("/jobs?after=x".into(), 422, "after: "),
        ("/jobs?queue=Two%20Words".into(), 422, "is not a valid queue name"),
        ("/jobs?job_type=Not%20A%20Type".into(), 422, "is not a valid job type"),
        ("/dead-letters?after=x".into(), 422, "after: "),
        // A cursor in order of death at a time Postgres cannot hold (it was a 500).
        (format!("/dead-letters?sort=died&after=-300000000000000000_{unknown}"), 422, "after: "),
        ("/dead-letters?queue=Two%20Words".into(), 422, "is not a valid queue name"),
        ("/jobs/not-a-uuid".into(), 422, "is not a job id"),
        (format!("/jobs/{unknown}"), 404, "not found"),
        ("/workflows/x".into(), 422, "is not a workflow id"),
        (format!("/workflows/{unknown}"), 404, "not found"),
        ("/workflows?state=zzz".into(), 422, "state: must be one of"),
        ("/workflows?before=x".into(), 422, "before: "),
        ("/audit?before=yesterday".into(), 422, "before: "),
        ("/policies/edit?type=Bad%20Type".into(), 422, "is not a valid job type"),
    ];
    for (path, expected, says) in &table {
        let r = d.get(path, &session).await;
        assert_eq!(r.status.as_u16(), *expected, "{path}: {}", r.text);
        assert!(r.text.contains(r#"class="alert error""#) && r.text.contains(says), "{path} says {says:?}: {}", r.text);
    }
    // The same pages with input they take are a 200 without an error.
    for path in ["/jobs?state=retryable&since=24h", "/jobs?queue=emails&job_type=email.send", "/dead-letters?queue=default", "/workflows?state=running", "/audit?before=5", "/policies/edit?type=payment.charge"] {
        let r = d.get(path, &session).await;
        assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.text);
        assert!(!r.text.contains(r#"class="alert error""#), "{path}: {}", r.text);
    }
}

/// A search's `text` is at most 200 characters and its `error_type` at most 255, on the
/// pages and through their server functions, refused naming the field before the search
/// reaches the database; the longest allowed still searches. An audit filter field is
/// bounded the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_longer_than_a_search_can_be_is_refused_naming_the_field() {
    let d = Dashboard::new().await;
    d.user("victor", "viewer password", Role::Viewer).await;
    let longest = varied(200);
    let job = d.db.store.enqueue(NewJob::new("search.me", json!([longest]))).await.expect("enqueue").job;
    let b = d.sign_in("victor", "viewer password").await;
    let session = [Dashboard::cookie(&b)];
    let too_long = format!("{longest}z");

    let found = d.get(&format!("/jobs?text={longest}"), &session).await;
    assert_eq!(found.status, StatusCode::OK, "{}", found.text);
    assert!(found.text.contains(&job.id.to_string()) && !found.text.contains(r#"class="alert error""#), "200 characters search: {}", found.text);
    for page in ["/jobs", "/dead-letters"] {
        let r = d.get(&format!("{page}?text={too_long}"), &session).await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{page}: {}", r.text);
        assert!(r.text.contains("text: must be at most 200 characters"), "{page}: {}", r.text);
        assert!(!r.text.contains(&job.id.to_string()), "{page}: nothing listed");
    }
    for function in ["/api/list_jobs", "/api/dead_letter_groups"] {
        let r = d.post(function, Some(&b), form(&[("query[text]", &too_long)]), false, &[]).await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{function}: {}", r.text);
        assert!(r.text.contains(r#""field":"text""#), "{function}: {}", r.text);
        let r = d.post(function, Some(&b), form(&[("query[text]", &longest)]), false, &[]).await;
        assert_eq!(r.status, StatusCode::OK, "{function}: {}", r.text);
    }

    let error_type = varied(255);
    let r = d.get(&format!("/dead-letters?error_type={error_type}"), &session).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = d.get(&format!("/dead-letters?error_type={error_type}z"), &session).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert!(r.text.contains("error_type: must be at most 255 characters"), "{}", r.text);

    let r = d.get(&format!("/audit?action={}", varied(256)), &session).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert!(r.text.contains("action: must be at most 255 characters"), "{}", r.text);
}

/// A refusal names the field and quotes at most the first 40 characters of what was sent,
/// however long: a page does not reflect a URL's value back at length. (Values the page
/// keeps in a form field, such as a filter's queue or text, are the form's, not the error's.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_quotes_only_the_start_of_the_value() {
    let d = Dashboard::new().await;
    d.user("victor", "viewer password", Role::Viewer).await;
    let b = d.sign_in("victor", "viewer password").await;
    let session = [Dashboard::cookie(&b)];
    let long = varied(1000);
    let cut = format!("{}…", &long[..40]);

    for (path, field) in [
        (format!("/jobs?since={long}"), "since: "),
        (format!("/jobs?state={long}"), "state: "),
        (format!("/jobs/{long}"), "id: "),
        (format!("/workflows/{long}"), "id: "),
        (format!("/audit?before={long}"), "before: "),
        (format!("/policies/edit?type={long}"), "type: "),
    ] {
        let r = d.get(&path, &session).await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{field}: {}", r.text);
        assert!(r.text.contains(field) && r.text.contains(&cut), "{field} quotes the start: {}", r.text);
        assert!(!r.text.contains(&long[..41]), "{field} quotes no more than 40 characters: {}", r.text);
    }
    // Through a server function too, for a reason the store's validator words.
    let r = d.post("/api/list_jobs", Some(&b), form(&[("query[queue]", &long)]), false, &[]).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    assert!(r.text.contains(r#""field":"queue""#) && r.text.contains(&cut) && !r.text.contains(&long[..41]), "{}", r.text);
}

/// The audit log's action filter is a literal prefix: `_` and `%` are not wildcards that
/// match every action.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_action_filter_is_not_a_pattern() {
    let d = Dashboard::new().await;
    d.user("victor", "viewer password", Role::Viewer).await;
    for action in ["queue.pause", "dead_letter.redrive", "deadxletter.redrive"] {
        d.db.store.audit(&rebound_queue::store::Actor::new("olivia"), action, Some("t"), json!({})).await.expect("audit");
    }
    let b = d.sign_in("victor", "viewer password").await;
    let session = [Dashboard::cookie(&b)];

    let all = d.get("/audit", &session).await;
    assert!(["queue.pause", "dead_letter.redrive", "deadxletter.redrive"].iter().all(|a| all.text.contains(a)), "{}", all.text);
    for wildcard in ["_", "%25", "%25zz", "_ueue.pause"] {
        let r = d.get(&format!("/audit?action={wildcard}"), &session).await;
        assert_eq!(r.status, StatusCode::OK, "{wildcard}: {}", r.text);
        assert!(r.text.contains("No entries."), "{wildcard} matches nothing: {}", r.text);
        assert!(!r.text.contains("queue.pause") && !r.text.contains("deadxletter.redrive"), "{wildcard}: {}", r.text);
    }
    let r = d.get("/audit?action=dead_letter.", &session).await;
    assert!(r.text.contains("dead_letter.redrive") && !r.text.contains("deadxletter.redrive"), "`_` is an underscore: {}", r.text);
}

#[test]
fn a_database_blip_says_whether_the_action_may_have_happened() {
    use app::error::AppError;
    use rebound_queue::StoreError;
    // Nothing was sent (no connection to be had): nothing happened, try again.
    let not_sent = AppError::from(StoreError::from(sqlx::Error::PoolTimedOut));
    assert!(matches!(not_sent, AppError::Unavailable(_)), "{not_sent:?}");
    // The connection broke while the statement was out: it may have committed.
    let lost = AppError::from(StoreError::from(sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::UnexpectedEof))));
    assert!(matches!(lost, AppError::OutcomeUnknown(_)), "{lost:?}");
    assert!(lost.to_string().contains("may or may not have taken effect"), "{lost}");
    assert_eq!((not_sent.status(), lost.status()), (503, 503));
    // A refusal the database answered is neither.
    assert!(matches!(AppError::from(StoreError::Missing { what: "x".into() }), AppError::NotFound(_)));
}
