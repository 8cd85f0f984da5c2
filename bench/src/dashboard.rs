//! Dashboard speed: seeds a large database (1 000 000 jobs, 100 000 of them dead letters with
//! attempt histories) and measures how long the server takes to render the jobs list, a job's
//! detail and the dead-letter page, as percentiles over many requests.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sqlx::PgPool;
use uuid::Uuid;

/// Inserts `jobs` jobs, `dead` of them dead letters with three attempts each, in bounded
/// statements. Job types, queues and errors vary so filters and groups have something to do.
pub async fn seed(pool: &PgPool, jobs: i64, dead: i64) -> anyhow::Result<()> {
    let batch = 50_000i64;
    let mut done = 0i64;
    while done < jobs {
        let k = batch.min(jobs - done);
        // Ids are UUIDv7-shaped and time-ordered by construction: the high bits are the
        // millisecond timestamp, so id order is creation order like real enqueues.
        sqlx::query(
            "INSERT INTO jobs (id, type, queue, args, state, attempt, max_attempts, created_at, scheduled_at,
                               completed_at, discarded_at, dead_letter, dead_lettered_at, last_error)
             SELECT (lpad(to_hex((extract(epoch FROM ts) * 1000)::bigint), 12, '0')
                        || '7' || substr(md5(g::text), 1, 3) || '8' || substr(md5(g::text), 4, 15))::uuid,
                    (ARRAY['mail.send', 'pay.charge', 'report.build', 'image.resize', 'sync.crm'])[1 + g % 5],
                    (ARRAY['default', 'mail', 'billing'])[1 + g % 3],
                    jsonb_build_array(jsonb_build_object('customer', g % 10000, 'note', 'seeded job ' || g)),
                    (CASE WHEN g < $3 THEN 'discarded' WHEN g % 50 = 0 THEN 'retryable' WHEN g % 97 = 0 THEN 'available'
                          ELSE 'completed' END)::job_state,
                    CASE WHEN g < $3 THEN 3 ELSE 1 END, 3, ts, ts,
                    CASE WHEN g < $3 OR g % 50 <> 0 THEN ts + interval '1 second' END,
                    CASE WHEN g < $3 THEN ts + interval '1 second' END,
                    g < $3, CASE WHEN g < $3 THEN ts + interval '1 second' END,
                    CASE WHEN g < $3 OR g % 50 = 0 THEN jsonb_build_object(
                        'type', (ARRAY['smtp.rejected', 'http.5xx', 'http.timeout', 'db.deadlock'])[1 + g % 4],
                        'code', 'E' || (g % 4), 'message', 'upstream said no to customer ' || (g % 10000),
                        'retryable', true, 'attempt', 3, 'occurred_at', ts) END
             FROM (SELECT g, now() - interval '30 days' + g * interval '2 seconds' AS ts
                   FROM generate_series($1::bigint, $1::bigint + $2::bigint - 1) AS g) s",
        )
        .bind(done)
        .bind(k)
        .bind(dead)
        .execute(pool)
        .await
        .context("seeding jobs")?;
        done += k;
    }
    sqlx::query(
        "INSERT INTO job_attempts (job_id, attempt, worker_id, started_at, finished_at, outcome, error_type, error_message, delay_ms)
         SELECT j.id, a, 'seed-worker', j.created_at + a * interval '10 ms', j.created_at + a * interval '20 ms',
                CASE WHEN a < 3 THEN 'retried' ELSE 'exhausted' END, j.last_error->>'type', j.last_error->>'message',
                CASE WHEN a < 3 THEN 1000 * a END
         FROM jobs j CROSS JOIN generate_series(1, 3) AS a WHERE j.dead_letter",
    )
    .execute(pool)
    .await
    .context("seeding attempts")?;
    sqlx::query("ANALYZE jobs").execute(pool).await?;
    sqlx::query("ANALYZE job_attempts").execute(pool).await?;
    Ok(())
}

/// A logged-in HTTP client for the dashboard.
pub struct Dashboard {
    base: String,
    client: reqwest::Client,
    cookie: String,
}

impl Dashboard {
    /// Logs in through the login form.
    pub async fn login(base: &str, user: &str, password: &str) -> anyhow::Result<Dashboard> {
        let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build()?;
        let res = client
            .post(format!("{base}/auth/login"))
            .form(&[("username", user), ("password", password), ("next", "/")])
            .send()
            .await
            .context("posting the login form")?;
        let cookie = res
            .headers()
            .get_all(reqwest::header::SET_COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find(|v| v.starts_with("rebound_session="))
            .and_then(|v| v.split(';').next())
            .map(str::to_string)
            .context("the login did not set a session cookie: wrong user or password?")?;
        Ok(Dashboard { base: base.trim_end_matches('/').to_string(), client, cookie })
    }

    async fn render(&self, path: &str) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let res = self.client.get(format!("{}{path}", self.base)).header("cookie", &self.cookie).send().await?;
        let status = res.status();
        let body = res.text().await?;
        let took = started.elapsed();
        if !status.is_success() {
            bail!("GET {path} answered {status}");
        }
        if body.len() < 200 {
            bail!("GET {path} rendered almost nothing ({} bytes)", body.len());
        }
        Ok(took)
    }
}

/// p50 and p95 of a set of timings.
pub fn percentiles(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    let at = |p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize];
    (at(0.50), at(0.95))
}

/// Renders each page `n` times and prints the percentiles. Returns false if any p95 is over 50 ms.
pub async fn measure(pool: &PgPool, dash: &Dashboard, n: usize) -> anyhow::Result<bool> {
    let ids: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM jobs WHERE dead_letter ORDER BY random() LIMIT $1")
        .bind(n as i64)
        .fetch_all(pool)
        .await?;
    let deep: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM jobs TABLESAMPLE SYSTEM (1) LIMIT $1")
        .bind(n as i64)
        .fetch_all(pool)
        .await?;
    if ids.is_empty() || deep.is_empty() {
        bail!("no seeded jobs: run with --seed first");
    }
    let pages: Vec<(&str, Vec<String>)> = vec![
        ("jobs list, first page", (0..n).map(|_| "/jobs".to_string()).collect()),
        ("jobs list, deep page (keyset)", deep.iter().map(|id| format!("/jobs?after={id}")).collect()),
        ("jobs list, filtered by type+state", (0..n).map(|_| "/jobs?type=pay.charge&state=retryable".to_string()).collect()),
        ("job detail (dead letter, 3 attempts)", ids.iter().map(|id| format!("/jobs/{id}")).collect()),
        ("dead letters page", (0..n).map(|_| "/dead-letters".to_string()).collect()),
    ];
    let mut ok = true;
    println!("{:<40} {:>9} {:>9}", "page (server-side render)", "p50", "p95");
    for (name, paths) in pages {
        // One unmeasured request warms the connection pool and caches.
        dash.render(&paths[0]).await?;
        let mut times = Vec::with_capacity(paths.len());
        for p in &paths {
            times.push(dash.render(p).await?);
        }
        let (p50, p95) = percentiles(times);
        let mark = if p95 <= Duration::from_millis(50) { "" } else { "  over 50 ms" };
        ok &= mark.is_empty();
        println!("{name:<40} {:>7.1}ms {:>7.1}ms{mark}", p50.as_secs_f64() * 1e3, p95.as_secs_f64() * 1e3);
    }
    Ok(ok)
}
