//! The dashboard through the whole server router, on a fresh database: signing in and out,
//! sessions stored hashed, server-rendered pages, and the rules on every mutation (a live
//! session, the CSRF token, the operator role, the audit entry).

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use rebound_queue::outcome::{HandlerError, Outcome};
use rebound_queue::store::{AuditFilter, ClaimRequest, Failure, ProgressReport, Role};
use rebound_queue::job::OnLimit;
use rebound_queue::{Job, JobState, NewJob, PolicyPatch};
use rebound_server::auth::hash_token;
use rebound_server::dashboard_auth::SESSION_COOKIE;
use serde_json::json;

mod dashboard_support;
use dashboard_support::{Browser, Dashboard, Reply};

impl Dashboard {
    async fn get(&self, path: &str, browser: Option<&Browser>) -> Reply {
        let mut req = Request::get(path);
        if let Some(b) = browser {
            req = req.header("cookie", format!("{SESSION_COOKIE}={}", b.cookie));
        }
        self.send(req.body(Body::empty()).expect("request")).await
    }

    /// A form post; `html` makes it look like a browser without JavaScript.
    async fn post_form(&self, path: &str, browser: Option<&Browser>, form: &[(&str, &str)], html: bool) -> Reply {
        let body = dashboard_support::form(form);
        let mut req = Request::post(path).header("content-type", "application/x-www-form-urlencoded");
        if let Some(b) = browser {
            req = req.header("cookie", format!("{SESSION_COOKIE}={}", b.cookie));
        }
        if html {
            req = req.header("accept", "text/html,application/xhtml+xml").header("referer", "http://localhost/dead-letters");
        } else {
            req = req.header("accept", "application/json");
        }
        self.send(req.body(Body::from(body)).expect("request")).await
    }

    async fn sign_in(&self, name: &str, password: &str) -> Browser {
        let r = self.post_form("/auth/login", None, &[("username", name), ("password", password), ("next", "/jobs")], true).await;
        assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text);
        assert_eq!(r.header("location"), Some("/jobs"));
        let set_cookie = r.header("set-cookie").expect("a session cookie");
        let cookie = set_cookie
            .split(';')
            .next()
            .and_then(|kv| kv.strip_prefix(&format!("{SESSION_COOKIE}=")))
            .expect("the session cookie")
            .to_string();
        let session = self.db.store.session(&hash_token(&cookie)).await.expect("db").expect("a live session");
        Browser { cookie, csrf: session.csrf_token }
    }

    /// A dead letter of `job_type`: one attempt, failed.
    async fn dead_letter(&self, job_type: &str) -> Job {
        let patch = PolicyPatch::from_json(&json!({"max_attempts": 1, "on_exhaustion": "dead_letter"})).expect("patch");
        let job = self.db.store.enqueue(NewJob::new(job_type, json!([{"order": 1}])).retry(patch)).await.expect("enqueue").job;
        let claimed = self
            .db
            .store
            .claim(&ClaimRequest { worker_id: "w1".into(), queues: vec!["default".into()], limit: 1, visibility_timeout: Duration::from_secs(60) })
            .await
            .expect("claim");
        assert_eq!(claimed.len(), 1);
        let failure = Failure {
            id: job.id,
            attempt: None,
            worker_id: Some("w1".into()),
            outcome: Outcome::Retry(HandlerError::new("http.5xx", "gateway returned 503 after 31s")),
            error_code: None,
        };
        let result = self.db.store.fail(&failure).await.expect("fail");
        assert!(result.job.dead_letter);
        result.job
    }

    async fn audit_actions(&self) -> Vec<(String, String, Option<String>)> {
        self.db
            .store
            .audit_log(&AuditFilter { limit: 100, ..AuditFilter::default() })
            .await
            .expect("audit")
            .into_iter()
            .map(|e| (e.actor, e.action, e.target))
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_out_pages_send_you_to_the_login_page() {
    let d = Dashboard::new().await;
    let r = d.get("/jobs?state=retryable", None).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert_eq!(r.header("location"), Some("/login?next=%2Fjobs%3Fstate%3Dretryable"));
    let login = d.get("/login", None).await;
    assert_eq!(login.status, StatusCode::OK);
    assert!(login.text.contains("Sign in to Rebound"), "{}", login.text);
    assert!(login.text.contains(r#"action="/auth/login""#));
    // Server functions answer 401, not a redirect.
    let api = d.post_form("/api/list_jobs", None, &[("dead_letters_only", "false")], false).await;
    assert_eq!(api.status, StatusCode::UNAUTHORIZED, "{}", api.text);
    // The OJS API is not the dashboard's business.
    assert_eq!(d.get("/healthz", None).await.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn login_starts_a_hashed_session_in_an_http_only_cookie() {
    let d = Dashboard::new().await;
    d.user("olivia", "correct horse", Role::Operator).await;

    let wrong = d.post_form("/auth/login", None, &[("username", "olivia"), ("password", "wrong horse"), ("next", "/jobs")], true).await;
    assert_eq!(wrong.status, StatusCode::SEE_OTHER);
    assert_eq!(wrong.header("location"), Some("/login?error=1&next=%2Fjobs"));
    assert!(wrong.header("set-cookie").is_none());
    let unknown = d.post_form("/auth/login", None, &[("username", "nobody"), ("password", "correct horse")], true).await;
    assert_eq!(unknown.header("location"), Some("/login?error=1&next=%2F"));

    let r = d.post_form("/auth/login", None, &[("username", "olivia"), ("password", "correct horse"), ("next", "//evil.example")], true).await;
    assert_eq!(r.header("location"), Some("/"), "an off-site next is ignored");
    let cookie = r.header("set-cookie").expect("cookie");
    assert!(cookie.contains("; HttpOnly") && cookie.contains("; SameSite=Lax") && cookie.contains("; Path=/"), "{cookie}");

    let b = d.sign_in("olivia", "correct horse").await;
    assert_eq!(b.cookie.len(), 64);
    // Only the SHA-256 of the token is stored.
    assert!(d.db.store.session(&b.cookie).await.expect("db").is_none());
    let session = d.db.store.session(&hash_token(&b.cookie)).await.expect("db").expect("session");
    assert_eq!(session.operator.username, "olivia");
    assert_ne!(session.csrf_token, b.cookie);
    assert!(d.audit_actions().await.contains(&("olivia".into(), "operator.login".into(), Some("olivia".into()))));

    // A signed-in page renders its data on the server.
    let page = d.get("/jobs", Some(&b)).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.text.contains("olivia"), "the header names who is signed in");
    assert!(page.text.contains(&format!(r#"name="csrf" value="{}""#, b.csrf)), "forms carry the CSRF token");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_render_without_javascript() {
    let d = Dashboard::new().await;
    d.user("olivia", "correct horse", Role::Operator).await;
    let job = d.dead_letter("payment.charge").await;
    let b = d.sign_in("olivia", "correct horse").await;

    let detail = d.get(&format!("/jobs/{}", job.id), Some(&b)).await;
    assert_eq!(detail.status, StatusCode::OK);
    for expected in ["payment.charge", "dead letter", "gateway returned 503 after 31s", "exhausted", r#"value="redrive""#] {
        assert!(detail.text.contains(expected), "job page lacks {expected:?}");
    }
    let dead = d.get("/dead-letters", Some(&b)).await;
    assert!(dead.text.contains("http.5xx: gateway returned # after #s"), "grouped by signature");
    for path in ["/", "/jobs", "/policies", "/policies/edit?type=payment.charge", "/queues", "/workers", "/audit"] {
        let r = d.get(path, Some(&b)).await;
        assert_eq!(r.status, StatusCode::OK, "{path}");
        assert!(!r.text.contains("Loading…"), "{path} must render its data, not a fallback");
    }
    let missing = d.get("/jobs/01a203c3-1a5d-733f-b465-1a65fa697edd", Some(&b)).await;
    assert!(missing.text.contains("not found"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_job_shows_its_latest_progress() {
    let d = Dashboard::new().await;
    d.user("olivia", "correct horse", Role::Viewer).await;
    let job = d.db.store.enqueue(NewJob::new("report.build", json!([]))).await.expect("enqueue").job;
    let claim = ClaimRequest { worker_id: "w1".into(), queues: vec!["default".into()], limit: 1, visibility_timeout: Duration::from_secs(60) };
    assert_eq!(d.db.store.claim(&claim).await.expect("claim").len(), 1);
    let b = d.sign_in("olivia", "correct horse").await;
    assert!(!d.get(&format!("/jobs/{}", job.id), Some(&b)).await.text.contains("Progress"), "no report yet");
    for (pct, msg) in [(10.0, "started"), (62.5, "rows <6 250> of 10 000")] {
        let report = ProgressReport { job_id: job.id, attempt: None, worker_id: None, percentage: pct, message: Some(msg.into()), data: None };
        d.db.store.report_progress(&report).await.expect("progress");
    }
    let page = d.get(&format!("/jobs/{}", job.id), Some(&b)).await;
    assert!(page.text.contains("62.5%: rows &lt;6 250&gt; of 10 000 (attempt 1,"), "the latest report, escaped: {}", page.text);
    assert!(!page.text.contains("started"));
}

/// A keyed job's page says what it does when its key holds it; one its key dropped shows the
/// `dropped` row without an attempt number (it never ran).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_dropped_by_its_rate_limit_key_says_so_and_numbers_no_attempt() {
    let d = Dashboard::new().await;
    d.user("olivia", "correct horse", Role::Viewer).await;
    let dropped = NewJob::new("feed.refresh", json!([])).rate_limit("feed:x", Some(0)).on_limit(OnLimit::Drop);
    let dropped = d.db.store.enqueue(dropped).await.expect("enqueue").job;
    assert_eq!(dropped.state, JobState::Discarded, "a key of 0 drops it at once");
    let waits = d.db.store.enqueue(NewJob::new("feed.refresh", json!([1])).rate_limit("feed:x", None)).await.expect("enqueue").job;
    let b = d.sign_in("olivia", "correct horse").await;
    let page = d.get(&format!("/jobs/{}", dropped.id), Some(&b)).await;
    assert!(page.text.contains("drop (discard without running)"), "{}", page.text);
    assert!(page.text.contains("outcome-dropped"), "{}", page.text);
    // (A hydrating build marks each text node's end with `<!>`.)
    assert!(page.text.contains(r#"<td class="num">–<"#), "no attempt number: {}", page.text);
    assert!(!page.text.contains(r#"<td class="num">0<"#), "{}", page.text);
    let page = d.get(&format!("/jobs/{}", waits.id), Some(&b)).await;
    assert!(page.text.contains("wait for the key"), "{}", page.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workers_page_shows_what_a_degraded_worker_reports() {
    use rebound_queue::store::{ProcessUsage, WorkerBeat, WorkerRegistration, WorkerStatus};
    let d = Dashboard::new().await;
    d.user("victor", "viewer password", Role::Viewer).await;
    let registration = |id: &str| WorkerRegistration {
        id: id.into(),
        host: "db-less-host".into(),
        pid: 42,
        queues: vec!["default".into()],
        concurrency: 8,
        version: "t".into(),
    };
    for id in ["healthy-worker", "cut-off-worker"] {
        d.db.store.register_worker(&registration(id)).await.expect("register");
    }
    let beat = WorkerBeat {
        worker_id: "cut-off-worker",
        held: &[],
        known: &[],
        running: 0,
        status: WorkerStatus::Degraded,
        detail: Some("12 job results waiting to be written: connection refused"),
        usage: ProcessUsage { memory_mb: Some(83.4), cpu_percent: Some(12.5) },
    };
    d.db.store.worker_beat(&beat).await.expect("beat");
    let b = d.sign_in("victor", "viewer password").await;
    let page = d.get("/workers", Some(&b)).await;
    assert_eq!(page.status, StatusCode::OK);
    // A table row, not the serialized data after the table.
    let row = |id: &str| {
        let row = page.text.split("<tr").find(|r| r.contains(id)).unwrap_or_default();
        row.split("</tr>").next().unwrap_or_default().to_string()
    };
    assert!(row("cut-off-worker").contains("degraded") && row("cut-off-worker").contains("12 job results waiting to be written"), "{}", page.text);
    assert!(!row("healthy-worker").contains("degraded") && row("healthy-worker").contains("live"), "{}", row("healthy-worker"));
    // What each said it uses: the one that never beat has nothing to show.
    assert!(row("cut-off-worker").contains("83.4 MiB") && row("cut-off-worker").contains("12.5 %"), "{}", row("cut-off-worker"));
    assert!(!row("healthy-worker").contains("MiB") && row("healthy-worker").contains("—"), "{}", row("healthy-worker"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_quiets_and_stops_a_worker_from_its_page() {
    use rebound_queue::store::WorkerRegistration;
    let d = Dashboard::new().await;
    d.user("olivia", "correct horse", Role::Operator).await;
    d.user("victor", "viewer password", Role::Viewer).await;
    let registration = WorkerRegistration {
        id: "busy-worker".into(),
        host: "h".into(),
        pid: 7,
        queues: vec!["default".into()],
        concurrency: 4,
        version: "t".into(),
    };
    d.db.store.register_worker(&registration).await.expect("register");
    let row = |page: &str| {
        let row = page.split("<tr").find(|r| r.contains("busy-worker")).unwrap_or_default();
        row.split("</tr>").next().unwrap_or_default().to_string()
    };

    let viewer = d.sign_in("victor", "viewer password").await;
    let r = d.post_form("/api/request_worker_state", Some(&viewer), &[("csrf", &viewer.csrf), ("worker", "busy-worker"), ("state", "quiet")], false).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);
    assert_eq!(d.db.store.requested_worker_state("busy-worker").await.expect("db"), None);

    let b = d.sign_in("olivia", "correct horse").await;
    let before = row(&d.get("/workers", Some(&b)).await.text);
    assert!(before.contains(">Quiet<") && before.contains(">Stop<"), "{before}");
    // Without JavaScript: a plain form post, answered with a page.
    let r = d.post_form("/api/request_worker_state", Some(&b), &[("csrf", &b.csrf), ("worker", "busy-worker"), ("state", "quiet")], false).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(r.text.contains("will claim nothing more"), "{}", r.text);
    assert_eq!(d.db.store.requested_worker_state("busy-worker").await.expect("db").as_deref(), Some("quiet"));
    let quiet = row(&d.get("/workers", Some(&b)).await.text);
    assert!(quiet.contains("quiet") && !quiet.contains(">Quiet<") && quiet.contains(">Stop<"), "{quiet}");

    let r = d.post_form("/api/request_worker_state", Some(&b), &[("csrf", &b.csrf), ("worker", "busy-worker"), ("state", "terminate")], false).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(d.db.store.requested_worker_state("busy-worker").await.expect("db").as_deref(), Some("terminate"));
    assert!(row(&d.get("/workers", Some(&b)).await.text).contains("terminating"));
    let audit = d.audit_actions().await;
    for action in ["worker.quiet", "worker.terminate"] {
        assert!(audit.iter().any(|(_, a, target)| a == action && target.as_deref() == Some("busy-worker")), "{action} in {audit:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_held_up_by_a_lock_gives_up_at_the_lock_timeout_and_says_so() {
    let d = Dashboard::with_lock_timeout(Duration::from_secs(1)).await;
    d.user("olivia", "operator password", Role::Operator).await;
    let job = d.dead_letter("payment.charge").await;
    let b = d.sign_in("olivia", "operator password").await;
    let id = job.id.to_string();
    // Somebody's open transaction holds the job's row.
    // (Its own connection: the store's end a transaction left idle for 10 s.)
    let mut holder = <sqlx::PgConnection as sqlx::Connection>::connect(&d.db.url).await.expect("connect");
    sqlx::query("BEGIN").execute(&mut holder).await.expect("begin");
    sqlx::query("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE").bind(job.id).execute(&mut holder).await.expect("lock the row");
    // The server function answers the error itself, which the page words ("… gave up waiting
    // for a lock …, so nothing was done"); without JavaScript, the form post is sent back to
    // its page with the error to show.
    let r = d.post_form("/api/act_on_job", Some(&b), &[("csrf", &b.csrf), ("id", &id), ("action", "redrive")], false).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text);
    assert!(r.text.contains("\"LockTimeout\""), "{}", r.text);
    let r = d
        .send(
            Request::post("/api/act_on_job")
                .header("content-type", "application/x-www-form-urlencoded")
                .header("cookie", format!("{SESSION_COOKIE}={}", b.cookie))
                .header("accept", "text/html")
                .header("referer", format!("http://localhost/jobs/{id}"))
                .body(Body::from(dashboard_support::form(&[("csrf", &b.csrf), ("id", &id), ("action", "redrive")])))
                .expect("request"),
        )
        .await;
    assert_eq!(r.status, StatusCode::FOUND, "{}", r.text);
    let location = r.header("location").expect("back to the page").trim_start_matches("http://localhost").to_string();
    let flash = r.header("set-cookie").and_then(|c| c.split(';').next()).expect("the flash cookie").to_string();
    let shown = d.send(Request::get(&location).header("cookie", format!("{SESSION_COOKIE}={}; {flash}", b.cookie)).body(Body::empty()).expect("request")).await;
    assert_eq!(shown.status, StatusCode::SERVICE_UNAVAILABLE, "{}", shown.text);
    assert!(shown.text.contains("waiting for a lock") && shown.text.contains("nothing was done"), "{}", shown.text);
    sqlx::query("ROLLBACK").execute(&mut holder).await.expect("release the row");
    assert!(d.db.store.job(job.id).await.expect("job").dead_letter, "the re-drives that gave up changed nothing");
    let r = d.post_form("/api/act_on_job", Some(&b), &[("csrf", &b.csrf), ("id", &id), ("action", "redrive")], false).await;
    assert!(r.status.is_success(), "{}: {}", r.status, r.text);
    assert_eq!(d.db.store.job(job.id).await.expect("job").state, JobState::Available);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_cannot_act_and_nothing_changes() {
    let d = Dashboard::new().await;
    d.user("victor", "viewer password", Role::Viewer).await;
    let job = d.dead_letter("payment.charge").await;
    let b = d.sign_in("victor", "viewer password").await;
    let id = job.id.to_string();
    let before = d.audit_actions().await;

    let r = d.post_form("/api/act_on_job", Some(&b), &[("csrf", &b.csrf), ("id", &id), ("action", "redrive")], false).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);
    assert!(r.text.contains("viewer"), "{}", r.text);
    // Without JavaScript the refusal is a page, still a 403.
    let html = d.post_form("/api/redrive_dead_letters", Some(&b), &[("csrf", &b.csrf), ("scope", "filter")], true).await;
    assert_eq!(html.status, StatusCode::FORBIDDEN);
    assert!(html.text.contains("<h1>Not allowed</h1>"), "{}", html.text);
    let policy = d.post_form("/api/save_policy", Some(&b), &[("csrf", &b.csrf), ("job_type", "payment.charge"), ("policy[max_attempts]", "9"), ("intent", "save")], false).await;
    assert_eq!(policy.status, StatusCode::FORBIDDEN);

    let after = d.db.store.job(job.id).await.expect("job");
    assert_eq!(after.state, JobState::Discarded);
    assert!(after.dead_letter);
    assert!(d.db.store.policy("payment.charge").await.expect("db").is_none());
    assert_eq!(d.audit_actions().await, before, "a refused action writes nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_acts_with_the_csrf_token_and_is_audited() {
    let d = Dashboard::new().await;
    d.user("olivia", "correct horse", Role::Operator).await;
    let job = d.dead_letter("payment.charge").await;
    let b = d.sign_in("olivia", "correct horse").await;
    let id = job.id.to_string();

    for csrf in ["", "forged"] {
        let r = d.post_form("/api/act_on_job", Some(&b), &[("csrf", csrf), ("id", &id), ("action", "redrive")], false).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "csrf {csrf:?}: {}", r.text);
    }
    assert!(d.db.store.job(job.id).await.expect("job").dead_letter, "a forged request changes nothing");

    // Without JavaScript: the form post redirects back to the page it came from.
    let r = d.post_form("/api/act_on_job", Some(&b), &[("csrf", &b.csrf), ("id", &id), ("action", "redrive"), ("budget", "one_more")], true).await;
    assert_eq!(r.status, StatusCode::FOUND, "{}", r.text);
    assert_eq!(r.header("location"), Some("http://localhost/dead-letters"));
    let after = d.db.store.job(job.id).await.expect("job");
    assert_eq!(after.state, JobState::Available);
    assert!(!after.dead_letter);
    assert_eq!(after.max_attempts, 2, "one more attempt");
    let audit = d.audit_actions().await;
    assert!(audit.contains(&("olivia".into(), "dead_letter.redrive".into(), Some(id.clone()))), "{audit:?}");

    // The same action again is a conflict the page can show, not a silent no-op.
    let again = d.post_form("/api/act_on_job", Some(&b), &[("csrf", &b.csrf), ("id", &id), ("action", "redrive")], false).await;
    assert!(again.status.is_server_error() || again.status.is_client_error(), "{}", again.status);
    assert!(again.text.contains("nothing done"), "{}", again.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_edits_are_validated_by_field_and_saved_with_history() {
    let d = Dashboard::new().await;
    d.user("olivia", "correct horse", Role::Operator).await;
    let b = d.sign_in("olivia", "correct horse").await;

    let bad = d
        .post_form("/api/save_policy", Some(&b), &[("csrf", &b.csrf), ("job_type", "invoice.render"), ("policy[backoff_coefficient]", "0.5"), ("intent", "save")], false)
        .await;
    assert!(bad.text.contains("backoff_coefficient"), "{}", bad.text);
    assert!(d.db.store.policy_history("invoice.render").await.expect("db").is_empty());

    let preview = d.post_form("/api/preview_policy", Some(&b), &[("job_type", "invoice.render"), ("policy[max_attempts]", "3"), ("policy[initial_interval]", "PT2M"), ("policy[jitter]", "false")], false).await;
    assert_eq!(preview.status, StatusCode::OK, "{}", preview.text);
    let v: serde_json::Value = serde_json::from_str(&preview.text).expect("json");
    assert_eq!(v["rows"].as_array().map(Vec::len), Some(2));
    assert_eq!(v["rows"][1]["delay"], "4m");
    assert_eq!(v["total_wait"], "6m");
    // Layers that are fine alone but not together: the default max_interval is PT5M.
    let clash = d.post_form("/api/preview_policy", Some(&b), &[("job_type", "invoice.render"), ("policy[initial_interval]", "PT10M")], false).await;
    let v: serde_json::Value = serde_json::from_str(&clash.text).expect("json");
    assert_eq!(v["problem"]["field"], "max_interval", "{}", clash.text);
    // Its dry run counts one type's waiting jobs: a prefix is not a type.
    let prefix = d.post_form("/api/preview_policy", Some(&b), &[("job_type", "invoice.*"), ("policy[max_attempts]", "3")], false).await;
    assert_eq!(prefix.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", prefix.text);
    assert!(prefix.text.contains("job_type"), "names the field: {}", prefix.text);

    let ok = d
        .post_form("/api/save_policy", Some(&b), &[("csrf", &b.csrf), ("job_type", "invoice.render"), ("policy[initial_interval]", "PT2M"), ("intent", "save"), ("note", "faster")], false)
        .await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.text);
    let history = d.db.store.policy_history("invoice.render").await.expect("db");
    assert_eq!(history.len(), 1);
    assert_eq!(history[0].created_by.as_deref(), Some("olivia"));
    assert_eq!(history[0].note.as_deref(), Some("faster"));
    assert!(d.audit_actions().await.contains(&("olivia".into(), "policy.update".into(), Some("invoice.render".into()))));

    // The no-JavaScript Preview button sends the browser back to the editor with the values.
    let r = d
        .post_form("/api/save_policy", Some(&b), &[("csrf", &b.csrf), ("job_type", "invoice.render"), ("policy[max_attempts]", "7"), ("intent", "preview")], true)
        .await;
    assert_eq!(r.status, StatusCode::FOUND, "{}", r.text);
    let location = r.header("location").unwrap_or_default();
    assert!(location.starts_with("/policies/edit?type=invoice.render&preview=1&max_attempts=7"), "{location}");
    assert_eq!(d.db.store.policy_history("invoice.render").await.expect("db").len(), 1, "a preview saves nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logout_needs_the_csrf_token_and_ends_the_session() {
    let d = Dashboard::new().await;
    d.user("olivia", "correct horse", Role::Operator).await;
    let b = d.sign_in("olivia", "correct horse").await;

    let forged = d.post_form("/auth/logout", Some(&b), &[("csrf", "forged")], true).await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    assert!(d.db.store.session(&hash_token(&b.cookie)).await.expect("db").is_some());

    let r = d.post_form("/auth/logout", Some(&b), &[("csrf", &b.csrf)], true).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert_eq!(r.header("location"), Some("/login?logged_out=1"));
    assert!(r.header("set-cookie").is_some_and(|c| c.contains("Max-Age=0")));
    assert!(d.db.store.session(&hash_token(&b.cookie)).await.expect("db").is_none());
    assert_eq!(d.get("/jobs", Some(&b)).await.status, StatusCode::SEE_OTHER);
    // Signing out is audited like signing in; the forged attempt was not.
    let logouts: Vec<_> = d.audit_actions().await.into_iter().filter(|(_, action, _)| action == "operator.logout").collect();
    assert_eq!(logouts, vec![("olivia".to_owned(), "operator.logout".to_owned(), Some("olivia".to_owned()))]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_actions_need_a_confirmation_and_act_on_the_filter() {
    let d = Dashboard::new().await;
    d.user("olivia", "correct horse", Role::Operator).await;
    let b = d.sign_in("olivia", "correct horse").await;
    let mut ids = Vec::new();
    for i in 0..3 {
        let job = d.db.store.enqueue(NewJob::new("email.send", json!([{"n": i}])).queue("emails")).await.expect("enqueue").job;
        ids.push(job.id);
    }
    let other = d.db.store.enqueue(NewJob::new("report.build", json!([]))).await.expect("enqueue").job;

    let unconfirmed = d
        .post_form("/api/bulk_jobs", Some(&b), &[("csrf", &b.csrf), ("action", "cancel"), ("scope", "filter"), ("filter[queue]", "emails")], false)
        .await;
    assert!(unconfirmed.text.contains("confirm"), "{}", unconfirmed.text);
    assert_eq!(d.db.store.job(ids[0]).await.expect("job").state, JobState::Available);

    // Ticked rows: just those.
    let first = ids[0].to_string();
    let r = d
        .post_form("/api/bulk_jobs", Some(&b), &[("csrf", &b.csrf), ("action", "discard"), ("scope", "selected"), ("ids[]", &first), ("confirm", "yes")], false)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(r.text.contains("Discarded 1 job."), "{}", r.text);
    // Everything matching the filter: the other two emails, not the report.
    let r = d
        .post_form("/api/bulk_jobs", Some(&b), &[("csrf", &b.csrf), ("action", "cancel"), ("scope", "filter"), ("filter[queue]", "emails"), ("confirm", "yes")], false)
        .await;
    assert!(r.text.contains("Cancelled 2 jobs."), "{}", r.text);
    assert_eq!(d.db.store.job(ids[0]).await.expect("job").state, JobState::Discarded);
    assert_eq!(d.db.store.job(ids[2]).await.expect("job").state, JobState::Cancelled);
    assert_eq!(d.db.store.job(other.id).await.expect("job").state, JobState::Available);
    let audit = d.audit_actions().await;
    assert!(audit.iter().any(|(who, what, _)| who == "olivia" && what == "job.bulk_cancel"));
    assert!(audit.iter().any(|(who, what, _)| who == "olivia" && what == "job.bulk_discard"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purging_dead_letters_needs_the_typed_confirmation() {
    let d = Dashboard::new().await;
    d.user("olivia", "correct horse", Role::Operator).await;
    let b = d.sign_in("olivia", "correct horse").await;
    let charge = d.dead_letter("payment.charge").await;
    let refund = d.dead_letter("payment.refund").await;

    let r = d.post_form("/api/purge_dead_letters", Some(&b), &[("csrf", &b.csrf), ("filter[job_type]", "payment.charge"), ("confirmation", "yes")], false).await;
    assert!(r.text.contains("type the word purge"), "{}", r.text);
    assert!(d.db.store.get_job(charge.id).await.expect("db").is_some());

    let r = d.post_form("/api/purge_dead_letters", Some(&b), &[("csrf", &b.csrf), ("filter[job_type]", "payment.charge"), ("confirmation", "purge")], false).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(r.text.contains("Purged 1 dead letter."), "{}", r.text);
    assert!(d.db.store.get_job(charge.id).await.expect("db").is_none());
    assert!(d.db.store.get_job(refund.id).await.expect("db").is_some(), "outside the filter");
    assert!(d.audit_actions().await.iter().any(|(who, what, _)| who == "olivia" && what == "dead_letter.purge"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staggered_redrive_of_a_selection() {
    let d = Dashboard::new().await;
    d.user("olivia", "correct horse", Role::Operator).await;
    let b = d.sign_in("olivia", "correct horse").await;
    let a = d.dead_letter("payment.charge").await.id.to_string();
    let c = d.dead_letter("payment.charge").await.id.to_string();
    let untouched = d.dead_letter("payment.charge").await;

    let r = d
        .post_form(
            "/api/redrive_dead_letters",
            Some(&b),
            &[("csrf", &b.csrf), ("scope", "selected"), ("ids[]", &a), ("ids[]", &c), ("how[budget]", "fresh"), ("how[stagger]", "600"), ("how[reason]", "fixed")],
            false,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(r.text.contains("Re-drove 2 dead letters, spread over 10m."), "{}", r.text);
    let mut states = Vec::new();
    for id in [&a, &c] {
        let job = d.db.store.job(id.parse().expect("uuid")).await.expect("job");
        assert!(!job.dead_letter);
        assert_eq!(job.attempt, 0, "a fresh budget");
        states.push(job.state);
    }
    states.sort_by_key(|s| s.as_str());
    assert_eq!(states, [JobState::Available, JobState::Scheduled], "spread: one now, one later");
    assert!(d.db.store.job(untouched.id).await.expect("job").dead_letter);

    // A row's own button re-drives just that row, whatever else is ticked.
    let one = untouched.id.to_string();
    let r = d.post_form("/api/redrive_dead_letters", Some(&b), &[("csrf", &b.csrf), ("scope", "filter"), ("one", &one)], false).await;
    assert!(r.text.contains("Re-drove 1 dead letter."), "{}", r.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_mode_is_switched_from_the_queues_page() {
    let d = Dashboard::new().await;
    d.user("olivia", "correct horse", Role::Operator).await;
    let b = d.sign_in("olivia", "correct horse").await;
    assert!(d.get("/queues", Some(&b)).await.text.contains("Turn maintenance on"));

    // Without JavaScript: plain form posts.
    let r = d.post_form("/api/set_maintenance", Some(&b), &[("csrf", &b.csrf), ("enabled", "true"), ("reason", "disk swap")], false).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(r.text.contains("Maintenance mode is on"), "{}", r.text);
    let on = d.db.store.maintenance().await.expect("db").expect("on");
    assert_eq!((on.reason.as_deref(), on.enabled_by.as_str()), (Some("disk swap"), "olivia"));
    let page = d.get("/queues", Some(&b)).await.text;
    assert!(page.contains("Maintenance mode is on") && page.contains("disk swap") && page.contains("Turn maintenance off"), "{page}");

    let r = d.post_form("/api/set_maintenance", Some(&b), &[("csrf", &b.csrf), ("enabled", "false")], false).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(d.db.store.maintenance().await.expect("db"), None);
    let actions: Vec<String> = d.audit_actions().await.into_iter().map(|(_, a, _)| a).collect();
    assert!(actions.contains(&"system.maintenance_on".to_string()) && actions.contains(&"system.maintenance_off".to_string()), "{actions:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_pause_and_resume_and_policies_restore() {
    let d = Dashboard::new().await;
    d.user("olivia", "correct horse", Role::Operator).await;
    let b = d.sign_in("olivia", "correct horse").await;

    let r = d.post_form("/api/set_queue_paused", Some(&b), &[("csrf", &b.csrf), ("queue", "emails"), ("paused", "true")], false).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(d.db.store.queue("emails").await.expect("queue").paused);
    let page = d.get("/queues", Some(&b)).await;
    assert!(page.text.contains("paused") && page.text.contains("Resume"), "the queues page shows it");
    d.post_form("/api/set_queue_paused", Some(&b), &[("csrf", &b.csrf), ("queue", "emails"), ("paused", "false")], false).await;
    assert!(!d.db.store.queue("emails").await.expect("queue").paused);

    for attempts in ["4", "9"] {
        let r = d
            .post_form("/api/save_policy", Some(&b), &[("csrf", &b.csrf), ("job_type", "email.send"), ("policy[max_attempts]", attempts), ("intent", "save")], false)
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    }
    let editor = d.get("/policies/edit?type=email.send", Some(&b)).await;
    assert!(editor.text.contains("max_attempts: 4 → 9"), "the history shows what changed");
    let r = d.post_form("/api/restore_policy", Some(&b), &[("csrf", &b.csrf), ("job_type", "email.send"), ("version", "1")], false).await;
    assert!(r.text.contains("Restored version 1 as version 3."), "{}", r.text);
    let stored = d.db.store.policy("email.send").await.expect("db").expect("policy");
    assert_eq!(stored.policy, json!({"max_attempts": 4}));
    let audit = d.audit_actions().await;
    assert!(audit.contains(&("olivia".into(), "queue.pause".into(), Some("emails".into()))));
    assert!(audit.contains(&("olivia".into(), "queue.resume".into(), Some("emails".into()))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflow_s_page_shows_each_step_and_an_operator_cancels_it() {
    use rebound_queue::store::{BatchCallbacks, ClaimRequest, Completion, NewWorkflow, WorkflowType};
    let d = Dashboard::new().await;
    d.user("olivia", "correct horse", Role::Operator).await;
    d.user("victor", "viewer password", Role::Viewer).await;
    let steps = ["order.validate", "order.charge", "order.ship"].iter().map(|t| rebound_queue::NewJob::new(*t, serde_json::json!([]))).collect();
    let wf = d
        .db
        .store
        .create_workflow(NewWorkflow { id: None, kind: WorkflowType::Chain, name: Some("order-42".into()), jobs: steps, callbacks: BatchCallbacks::default(), graph: Vec::new(), nested: Default::default() })
        .await
        .expect("workflow");
    let claim = ClaimRequest { worker_id: "w1".into(), queues: vec!["default".into()], limit: 1, visibility_timeout: std::time::Duration::from_secs(60) };
    let first = d.db.store.claim(&claim).await.expect("claim").remove(0);
    let done = Completion { id: first.id, attempt: Some(first.attempt), worker_id: None, started_at: None, result: Some(serde_json::json!({"valid": true})) };
    d.db.store.complete_batch(&[done]).await.expect("complete");
    let url = format!("/workflows/{}", wf.id);

    let viewer = d.sign_in("victor", "viewer password").await;
    let page = d.get(&url, Some(&viewer)).await;
    assert_eq!(page.status, StatusCode::OK);
    let row = |text: &str, job_type: &str| {
        let row = text.split("<tr").find(|r| r.contains(job_type)).unwrap_or_default();
        row.split("</tr>").next().unwrap_or_default().to_string()
    };
    assert!(page.text.contains("order-42") && page.text.contains("1 of 3 steps completed"), "{}", page.text);
    assert!(row(&page.text, "order.validate").contains("completed") && row(&page.text, "order.validate").contains("valid"), "{}", row(&page.text, "order.validate"));
    assert!(row(&page.text, "order.charge").contains("available"), "{}", row(&page.text, "order.charge"));
    assert!(row(&page.text, "order.ship").contains("waiting"), "{}", row(&page.text, "order.ship"));
    // The step's job page links back to its workflow.
    let job_page = d.get(&format!("/jobs/{}", first.id), Some(&viewer)).await;
    assert!(job_page.text.contains(&format!("href=\"{url}\"")), "{}", job_page.text);
    let r = d.post_form("/api/cancel_workflow", Some(&viewer), &[("csrf", &viewer.csrf), ("id", &wf.id.to_string())], false).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text);

    // Without JavaScript: a plain form post, answered with a page.
    let b = d.sign_in("olivia", "correct horse").await;
    assert!(d.get(&url, Some(&b)).await.text.contains(">Cancel workflow<"));
    let r = d.post_form("/api/cancel_workflow", Some(&b), &[("csrf", &b.csrf), ("id", &wf.id.to_string())], false).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(r.text.contains("is cancelled"), "{}", r.text);
    let after = d.get(&url, Some(&b)).await.text;
    assert!(row(&after, "order.ship").contains("cancelled") && !after.contains(">Cancel workflow<"), "{after}");
    // The list finds it by its state, linked to its page.
    let listed = d.get("/workflows?state=cancelled", Some(&viewer)).await.text;
    assert!(row(&listed, "order-42").contains(&format!("href=\"{url}\"")) && row(&listed, "order-42").contains("1 / 3 steps"), "{listed}");
    assert!(!d.get("/workflows?state=running", Some(&viewer)).await.text.contains("order-42"));
    assert!(d.get("/workflows?state=bogus", Some(&viewer)).await.text.contains("must be one of"));
    let again = d.post_form("/api/cancel_workflow", Some(&b), &[("csrf", &b.csrf), ("id", &wf.id.to_string())], false).await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{}", again.text);
    let audit = d.audit_actions().await;
    assert!(audit.iter().any(|(actor, a, target)| actor == "olivia" && a == "workflow.cancel" && target.as_deref() == Some(wf.id.to_string().as_str())), "{audit:?}");
    let unknown = d.get("/workflows/019539a4-bbbb-7000-8000-000000000001", Some(&b)).await;
    assert!(unknown.text.contains("workflow 019539a4-bbbb-7000-8000-000000000001"), "the page says what is missing: {}", unknown.text);
}

#[tokio::test]
async fn a_graph_s_page_names_each_step_with_what_it_waits_for_and_what_was_skipped() {
    use rebound_queue::outcome::{HandlerError, Outcome};
    use rebound_queue::store::{BatchCallbacks, ClaimRequest, Failure, GraphStep, NewWorkflow, WorkflowType};
    let d = Dashboard::new().await;
    d.user("victor", "viewer password", Role::Viewer).await;
    let steps = [("fetch", vec![]), ("parse", vec!["fetch"]), ("index", vec!["parse"]), ("notify", vec!["fetch", "index"])];
    let wf = NewWorkflow {
        id: None,
        kind: WorkflowType::Graph,
        name: Some("crawl-7".into()),
        jobs: steps.iter().map(|(id, _)| rebound_queue::NewJob::new(format!("crawl.{id}"), serde_json::json!([]))).collect(),
        callbacks: BatchCallbacks::default(),
        graph: steps.iter().map(|(id, after)| GraphStep { id: id.to_string(), depends_on: after.iter().map(|a| a.to_string()).collect() }).collect(),
        nested: Default::default(),
    };
    let wf = d.db.store.create_workflow(wf).await.expect("workflow");
    let claim = ClaimRequest { worker_id: "w1".into(), queues: vec!["default".into()], limit: 1, visibility_timeout: std::time::Duration::from_secs(60) };
    let first = d.db.store.claim(&claim).await.expect("claim").remove(0);
    let failure = Failure {
        id: first.id,
        attempt: Some(first.attempt),
        worker_id: Some("w1".into()),
        outcome: Outcome::Discard(HandlerError::new("net.dns", "no such host")),
        error_code: None,
    };
    d.db.store.fail(&failure).await.expect("fail");

    let viewer = d.sign_in("victor", "viewer password").await;
    let page = d.get(&format!("/workflows/{}", wf.id), Some(&viewer)).await.text;
    let row = |job_type: &str| page.split("<tr").find(|r| r.contains(job_type)).unwrap_or_default().split("</tr>").next().unwrap_or_default().to_string();
    assert!(page.contains("crawl-7") && page.contains("1 failed") && page.contains("3 skipped"), "{page}");
    assert!(row("crawl.notify").contains("notify (after fetch, index)") && row("crawl.notify").contains("cancelled"), "{}", row("crawl.notify"));
    assert!(row("crawl.fetch").contains("discarded"), "{}", row("crawl.fetch"));
    assert!(page.contains("net.dns"), "the failure is listed with its error: {page}");
    let listed = d.get("/workflows?state=failed", Some(&viewer)).await.text;
    assert!(listed.contains("crawl-7") && listed.contains("graph") && listed.contains("3 skipped"), "{listed}");
}

#[tokio::test]
async fn a_nested_workflow_is_a_row_of_its_parent_s_page_linked_both_ways() {
    use rebound_queue::store::{BatchCallbacks, NewWorkflow, WorkflowType};
    let d = Dashboard::new().await;
    d.user("victor", "viewer password", Role::Viewer).await;
    let plain = |kind, name: &str, jobs: Vec<rebound_queue::NewJob>| NewWorkflow {
        id: None,
        kind,
        name: Some(name.into()),
        jobs,
        callbacks: BatchCallbacks::default(),
        graph: Vec::new(),
        nested: Default::default(),
    };
    let group = plain(WorkflowType::Group, "thumbnails", vec![rebound_queue::NewJob::new("img.small", serde_json::json!([]))]);
    let mut chain = plain(WorkflowType::Chain, "upload-9", vec![rebound_queue::NewJob::new("img.store", serde_json::json!([]))]);
    chain.jobs.push(NewWorkflow::standing_job(WorkflowType::Group));
    chain.nested.insert(1, group);
    let wf = d.db.store.create_workflow(chain).await.expect("workflow");
    let inner = wf.members[1].nested.clone().expect("nested");

    let viewer = d.sign_in("victor", "viewer password").await;
    let page = d.get(&format!("/workflows/{}", wf.id), Some(&viewer)).await.text;
    let row = page.split("<tr").find(|r| r.contains("group workflow thumbnails")).unwrap_or_default().to_string();
    assert!(row.contains(&format!("href=\"/workflows/{}\"", inner.id)) && row.contains("waiting"), "{row}");
    let inner_page = d.get(&format!("/workflows/{}", inner.id), Some(&viewer)).await.text;
    assert!(inner_page.contains("Nested in workflow") && inner_page.contains(&format!("href=\"/workflows/{}\"", wf.id)), "{inner_page}");
    let listed = d.get("/workflows", Some(&viewer)).await.text;
    assert!(listed.contains("upload-9") && !listed.contains("thumbnails"), "only outermost workflows are listed: {listed}");
}

/// A cron job's type links to the jobs list filtered by that type: the link's key is the one
/// the filter reads (`job_type`), so it lists that type's jobs and no others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cron_job_links_to_the_jobs_of_its_type() {
    use rebound_queue::cron_schedule::CronSchedule;
    use rebound_queue::store::{Actor, CronSpec, CronTemplate, OverlapPolicy};
    let d = Dashboard::new().await;
    d.user("victor", "viewer password", Role::Viewer).await;
    let spec = CronSpec {
        name: "nightly-report".into(),
        schedule: CronSchedule::new("0 3 * * *", "UTC").expect("schedule"),
        template: CronTemplate::from_job(&NewJob::new("report.build", json!([])), json!({})),
        overlap_policy: OverlapPolicy::Skip,
        enabled: true,
        description: None,
    };
    d.db.store.register_cron(&spec, &Actor::new("t")).await.expect("cron");
    let report = d.db.store.enqueue(NewJob::new("report.build", json!([]))).await.expect("enqueue").job;
    let other = d.db.store.enqueue(NewJob::new("email.send", json!([]))).await.expect("enqueue").job;
    let b = d.sign_in("victor", "viewer password").await;

    let page = d.get("/cron", Some(&b)).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.text);
    let href = "/jobs?job_type=report.build";
    assert!(page.text.contains(&format!("href=\"{href}\"")), "{}", page.text);
    assert!(!page.text.contains("/jobs?type="), "{}", page.text);
    let jobs = d.get(href, Some(&b)).await;
    assert_eq!(jobs.status, StatusCode::OK, "{}", jobs.text);
    assert!(jobs.text.contains(&report.id.to_string()), "the type's job is listed: {}", jobs.text);
    assert!(!jobs.text.contains(&other.id.to_string()), "another type's is not: {}", jobs.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_filter_by_when_they_died() {
    let d = Dashboard::new().await;
    d.user("olivia", "correct horse", Role::Viewer).await;
    let old = d.dead_letter("died.old").await;
    let recent = d.dead_letter("died.recent").await;
    sqlx::query("UPDATE jobs SET dead_lettered_at = now() - interval '2 days' WHERE id = $1").bind(old.id).execute(d.db.store.pool()).await.expect("age");
    let b = d.sign_in("olivia", "correct horse").await;
    let all = d.get("/dead-letters", Some(&b)).await;
    assert_eq!(all.status, StatusCode::OK);
    assert!(all.text.contains(r#"name="died""#), "the dead-letter page offers the filter");
    assert!(all.text.contains(&old.id.to_string()) && all.text.contains(&recent.id.to_string()));
    let day = d.get("/dead-letters?died=24h", Some(&b)).await;
    assert_eq!(day.status, StatusCode::OK);
    assert!(day.text.contains(&recent.id.to_string()), "died within the day");
    assert!(!day.text.contains(&old.id.to_string()), "died two days ago");
    assert!(day.text.contains(r#"name="filter[died]" value="24h""#), "bulk actions act on the same view");
    assert!(!d.get("/jobs", Some(&b)).await.text.contains(r#"name="died""#), "the jobs list has no deaths to filter by");
    let bad = d.get("/dead-letters?died=forever", Some(&b)).await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(bad.text.contains("died"), "names the field");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_shown_most_recently_dead_first_on_request() {
    let d = Dashboard::new().await;
    d.user("olivia", "correct horse", Role::Viewer).await;
    let first = d.dead_letter("order.first").await;
    let second = d.dead_letter("order.second").await;
    // The job created first died last.
    sqlx::query("UPDATE jobs SET dead_lettered_at = now() - interval '1 hour' WHERE id = $1").bind(second.id).execute(d.db.store.pool()).await.expect("age");
    let b = d.sign_in("olivia", "correct horse").await;
    let position = |text: &str, id: uuid::Uuid| text.find(&id.to_string()).unwrap_or_else(|| panic!("{id} not listed"));
    let created = d.get("/dead-letters", Some(&b)).await;
    assert!(created.text.contains(r#"name="sort""#), "the page offers the order");
    assert!(position(&created.text, second.id) < position(&created.text, first.id), "newest created first by default");
    let died = d.get("/dead-letters?sort=died", Some(&b)).await;
    assert_eq!(died.status, StatusCode::OK);
    assert!(position(&died.text, first.id) < position(&died.text, second.id), "most recently died first");
    let bad = d.get("/dead-letters?sort=sideways", Some(&b)).await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(bad.text.contains("sort"), "names the field");
    let bad_cursor = d.get("/dead-letters?sort=died&after=not-a-cursor", Some(&b)).await;
    assert_eq!(bad_cursor.status, StatusCode::UNPROCESSABLE_ENTITY);

    // Oldest created first, here and on the jobs page, where a type prefix selects both.
    for page in ["/dead-letters?sort=oldest", "/jobs?sort=oldest&job_type=order.*"] {
        let oldest = d.get(page, Some(&b)).await;
        assert_eq!(oldest.status, StatusCode::OK, "{page}");
        assert!(position(&oldest.text, first.id) < position(&oldest.text, second.id), "{page}: oldest created first");
    }
    let newest = d.get("/jobs?job_type=order.*", Some(&b)).await;
    assert!(position(&newest.text, second.id) < position(&newest.text, first.id), "newest created first by default");
    let search = d.get("/jobs?sort=oldest&text=anything", Some(&b)).await;
    assert_eq!(search.status, StatusCode::UNPROCESSABLE_ENTITY, "a search lists newest first");
    assert!(search.text.contains("newest first"), "and says so");
}

/// The jobs list in the order jobs run: by priority ("highest priority") or by scheduled time
/// ("soonest scheduled").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_are_listed_in_the_order_they_run_on_request() {
    let d = Dashboard::new().await;
    d.user("olivia", "correct horse", Role::Viewer).await;
    let later = jiff::Timestamp::now().checked_add(jiff::SignedDuration::from_hours(1)).expect("an hour on");
    let mut ids = Vec::new();
    for (priority, scheduled_at) in [(0, None), (5, None), (-5, None), (10, Some(later))] {
        let job = NewJob { priority, scheduled_at, ..NewJob::new("run.order", json!([])).queue("runq") };
        ids.push(d.db.store.enqueue(job).await.expect("enqueue").job.id);
    }
    let b = d.sign_in("olivia", "correct horse").await;
    let listed = |text: &str| {
        let mut at: Vec<(usize, usize)> = ids.iter().enumerate().filter_map(|(i, id)| text.find(&id.to_string()).map(|p| (p, i))).collect();
        at.sort();
        at.into_iter().map(|(_, i)| i).collect::<Vec<_>>()
    };
    let page = d.get("/jobs?queue=runq&sort=priority", Some(&b)).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.text);
    assert!(page.text.contains(r#"value="priority" selected"#), "the order is kept in the form");
    assert_eq!(listed(&page.text), [3, 1, 0, 2], "highest priority first");
    let page = d.get("/jobs?queue=runq&state=available&sort=priority", Some(&b)).await;
    assert_eq!(listed(&page.text), [1, 0, 2], "the available ones in the order a claim takes them");
    let page = d.get("/jobs?queue=runq&sort=scheduled", Some(&b)).await;
    assert_eq!(listed(&page.text), [0, 1, 2, 3], "soonest scheduled first");
    let bad = d.get("/jobs?queue=runq&sort=scheduled&after=-3", Some(&b)).await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY, "not a page of this order");
    let search = d.get("/jobs?sort=priority&text=anything", Some(&b)).await;
    assert_eq!(search.status, StatusCode::UNPROCESSABLE_ENTITY, "a search lists newest first");
}
