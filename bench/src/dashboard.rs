//! Dashboard speed: seeds a large database (by default 10 000 000 jobs, 1 000 000 of them dead
//! letters with attempt histories, a million workflows and audit entries) and measures how
//! long the server takes to render every page and every kind of filter and search an operator
//! can type, as percentiles over many requests. The budget is a p95 of 100 ms per page,
//! server-side.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sqlx::PgPool;
use uuid::Uuid;

/// Inserts `jobs` jobs, `dead` of them dead letters with three attempts each, in bounded
/// statements. Job types, queues and errors vary so filters and groups have something to do.
pub async fn seed(pool: &PgPool, jobs: i64, dead: i64) -> anyhow::Result<()> {
    // Ten million rows through thirteen indexes one by one would take hours on 2 cores: the
    // seed drops the secondary indexes and the count triggers, inserts, then rebuilds both
    // (the same definitions, read back from the catalog) and counts once.
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT indexdef FROM pg_indexes WHERE tablename = 'jobs' AND indexname <> 'jobs_pkey'",
    )
    .fetch_all(pool)
    .await?;
    for def in &indexes {
        let name = def
            .split_whitespace()
            .skip_while(|w| *w != "INDEX")
            .nth(1)
            .context("an index definition without a name")?;
        // Names and definitions come from the catalog, not from input.
        sqlx::query(sqlx::AssertSqlSafe(format!("DROP INDEX {name}"))).execute(pool).await?;
    }
    sqlx::query("ALTER TABLE jobs DISABLE TRIGGER USER").execute(pool).await?;
    // Seeded workflows log no events of their own (workflow_events), as seeded jobs log none.
    sqlx::query("ALTER TABLE workflows DISABLE TRIGGER USER").execute(pool).await?;
    seed_rows(pool, jobs, dead).await?;
    for def in &indexes {
        sqlx::query(sqlx::AssertSqlSafe(def.as_str())).execute(pool).await.with_context(|| format!("rebuilding {def}"))?;
    }
    sqlx::query("ALTER TABLE jobs ENABLE TRIGGER USER").execute(pool).await?;
    sqlx::query("ALTER TABLE workflows ENABLE TRIGGER USER").execute(pool).await?;
    // In one transaction holding the counters: a server already running folds deltas into
    // them at any moment, and a fold between the delete and the insert duplicated its keys.
    let mut tx = pool.begin().await?;
    sqlx::query("LOCK TABLE job_counts, job_count_deltas IN EXCLUSIVE MODE").execute(&mut *tx).await?;
    sqlx::query("DELETE FROM job_count_deltas").execute(&mut *tx).await?;
    sqlx::query("DELETE FROM job_counts").execute(&mut *tx).await?;
    sqlx::query(
        "INSERT INTO job_counts (queue, type, state, dead_letter, signature, n)
         SELECT queue, type, state, dead_letter, COALESCE(error_signature, ''), count(*) FROM jobs GROUP BY 1, 2, 3, 4, 5",
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    sqlx::query("VACUUM ANALYZE jobs").execute(pool).await?;
    sqlx::query("VACUUM ANALYZE job_attempts").execute(pool).await?;
    sqlx::query("VACUUM ANALYZE workflows").execute(pool).await?;
    Ok(())
}

async fn seed_rows(pool: &PgPool, jobs: i64, dead: i64) -> anyhow::Result<()> {
    let batch = 200_000i64;
    let mut done = 0i64;
    while done < jobs {
        let k = batch.min(jobs - done);
        // Ids are UUIDv7-shaped and time-ordered by construction: the high bits are the
        // millisecond timestamp, so id order is creation order like real enqueues.
        sqlx::query(
            "INSERT INTO jobs (id, type, queue, args, state, attempt, max_attempts, created_at, scheduled_at,
                               completed_at, discarded_at, dead_letter, dead_lettered_at, last_error, error_signature,
                               workflow_id, workflow_step)
             SELECT (lpad(to_hex((extract(epoch FROM ts) * 1000)::bigint), 12, '0')
                        || '7' || substr(md5(g::text), 1, 3) || '8' || substr(md5(g::text), 4, 15))::uuid,
                    -- (One job in 100 003 is of a rare type: an operator following a cron job's
                    -- or the overview's link to a type with few jobs among millions.)
                    CASE WHEN g % 100003 = 7 THEN 'report.rare'
                         ELSE (ARRAY['mail.send', 'pay.charge', 'report.build', 'image.resize', 'sync.crm'])[1 + g % 5] END,
                    (ARRAY['default', 'mail', 'billing'])[1 + g % 3],
                    jsonb_build_array(jsonb_build_object('customer', g % 10000, 'note', 'seeded job ' || g)),
                    -- (One job in 499 is scheduled for later in the next day, so the
                    -- scheduler leaves it be: the soonest-scheduled listing has 18 000.)
                    (CASE WHEN g < $3 THEN 'discarded' WHEN g % 499 = 5 THEN 'scheduled' WHEN g % 50 = 0 THEN 'retryable'
                          WHEN g % 97 = 0 THEN 'available' ELSE 'completed' END)::job_state,
                    CASE WHEN g < $3 THEN 3 ELSE 1 END, 3, ts,
                    CASE WHEN g >= $3 AND g % 499 = 5 THEN now() + (g % 86400) * interval '1 second' ELSE ts END,
                    CASE WHEN g < $3 OR (g % 50 <> 0 AND g % 499 <> 5) THEN ts + interval '1 second' END,
                    CASE WHEN g < $3 THEN ts + interval '1 second' END,
                    g < $3, CASE WHEN g < $3 THEN ts + interval '1 second' END,
                    e.last_error, CASE WHEN g < $3 THEN rebound_error_signature(e.last_error) END,
                    -- Every tenth job starts a chain of three (it and the next two): a million
                    -- workflows at 10M jobs, each id shaped like its first job's.
                    CASE WHEN g % 10 < 3 THEN (lpad(to_hex((extract(epoch FROM wts) * 1000)::bigint), 12, '0')
                        || '7' || substr(md5('w' || g / 10), 1, 3) || '8' || substr(md5('w' || g / 10), 4, 15))::uuid END,
                    CASE WHEN g % 10 < 3 THEN (g % 10)::int END
             FROM (SELECT g, now() - interval '30 days' + g * (interval '30 days' / $4::bigint) AS ts,
                          now() - interval '30 days' + (g / 10 * 10) * (interval '30 days' / $4::bigint) AS wts
                   FROM generate_series($1::bigint, $1::bigint + $2::bigint - 1) AS g) s
             CROSS JOIN LATERAL (SELECT CASE WHEN g < $3 OR g % 50 = 0 THEN jsonb_build_object(
                        'type', (ARRAY['smtp.rejected', 'http.5xx', 'http.timeout', 'db.deadlock'])[1 + g % 4],
                        'code', 'E' || (g % 4), 'message', 'upstream said no to customer ' || (g % 10000),
                        'retryable', true, 'attempt', 3, 'occurred_at', ts) END AS last_error) e",
        )
        .bind(done)
        .bind(k)
        .bind(dead)
        .bind(jobs.max(1))
        .execute(pool)
        .await
        .context("seeding jobs")?;
        done += k;
    }
    // The chains' rows, from their first jobs: mostly completed, with rare failed, running
    // and cancelled ones, so a filter by state is not answered by reading the newest.
    sqlx::query(
        "INSERT INTO workflows (id, type, name, state, job_count, completed_count, failed_count, failed_step_index,
                                created_at, started_at, finished_at, cancelled_at)
         SELECT workflow_id, 'chain', 'seeded chain ' || w, s.state, 3,
                CASE s.state WHEN 'completed' THEN 3 WHEN 'failed' THEN 1 ELSE 0 END,
                CASE WHEN s.state = 'failed' THEN 1 ELSE 0 END, CASE WHEN s.state = 'failed' THEN 1 END,
                created_at, created_at, CASE WHEN s.state <> 'running' THEN created_at + interval '3 seconds' END,
                CASE WHEN s.state = 'cancelled' THEN created_at + interval '3 seconds' END
         FROM (SELECT workflow_id, created_at, row_number() OVER (ORDER BY workflow_id) AS w
               FROM jobs WHERE workflow_step = 0) f
         CROSS JOIN LATERAL (SELECT CASE WHEN w % 100 = 0 THEN 'failed' WHEN w % 1000 = 1 THEN 'running'
                                         WHEN w % 10000 = 2 THEN 'cancelled' ELSE 'completed' END AS state) s",
    )
    .execute(pool)
    .await
    .context("seeding workflows")?;
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
    sqlx::query(
        "INSERT INTO audit_log (at, actor, action, target, details)
         SELECT now() - g * interval '1 minute', (ARRAY['alice', 'bob', 'carol'])[1 + g % 3],
                (ARRAY['policy.update', 'queue.pause', 'jobs.redrive'])[1 + g % 3], 'mail.send', '{}'::jsonb
         FROM generate_series(1, 1000000) AS g
         UNION ALL
         -- A rare actor's few actions on one job, to be found among them.
         SELECT now() - g * interval '1 day', 'dave', 'job.cancel', 'seeded-job-7', '{}'::jsonb FROM generate_series(1, 5) AS g",
    )
    .execute(pool)
    .await
    .context("seeding the audit log")?;
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

/// The p95 budget of every page.
const BUDGET: Duration = Duration::from_millis(100);

/// Renders each page `n` times and prints the percentiles. Returns false if any p95 is over
/// the budget.
pub async fn measure(pool: &PgPool, dash: &Dashboard, n: usize) -> anyhow::Result<bool> {
    let ids: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM jobs WHERE dead_letter ORDER BY random() LIMIT $1")
        .bind(n as i64)
        .fetch_all(pool)
        .await?;
    let deep: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM jobs TABLESAMPLE SYSTEM (1) LIMIT $1")
        .bind(n as i64)
        .fetch_all(pool)
        .await?;
    let chains: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM workflows TABLESAMPLE SYSTEM (1) LIMIT $1")
        .bind(n as i64)
        .fetch_all(pool)
        .await?;
    if ids.is_empty() || deep.is_empty() || chains.is_empty() {
        bail!("no seeded jobs: run with --seed first");
    }
    let same = |path: &str| (0..n).map(|_| path.to_string()).collect::<Vec<_>>();
    let pages: Vec<(&str, Vec<String>)> = vec![
        ("overview", same("/")),
        ("queues", same("/queues")),
        ("policies", same("/policies")),
        ("policy editor", same("/policies/edit?type=pay.charge")),
        ("workers", same("/workers")),
        ("workflows", same("/workflows")),
        ("workflows, failed / running / cancelled", ["failed", "running", "cancelled"].iter().cycle().take(n).map(|s| format!("/workflows?state={s}")).collect()),
        ("workflows, completed", same("/workflows?state=completed")),
        ("workflows, an older page", chains.iter().map(|id| format!("/workflows?before={id}")).collect()),
        ("workflows, an older page of failed", chains.iter().map(|id| format!("/workflows?state=failed&before={id}")).collect()),
        ("workflow detail (a chain of 3)", chains.iter().map(|id| format!("/workflows/{id}")).collect()),
        ("cron", same("/cron")),
        ("audit log", same("/audit")),
        ("audit, a rare actor / action / target", ["actor=dave", "action=job.", "target=seeded-job-7"].iter().cycle().take(n).map(|q| format!("/audit?{q}")).collect()),
        ("jobs, first page", same("/jobs")),
        ("jobs, deep page (keyset)", deep.iter().map(|id| format!("/jobs?after={id}")).collect()),
        ("jobs, state=completed", same("/jobs?state=completed")),
        ("jobs, state=available", same("/jobs?state=available")),
        ("jobs, queue+state=available", same("/jobs?queue=billing&state=available")),
        ("jobs, type+state", same("/jobs?job_type=pay.charge&state=retryable")),
        ("jobs, queue+state", same("/jobs?queue=billing&state=discarded")),
        ("jobs, queue+type+state", same("/jobs?queue=mail&job_type=sync.crm&state=completed")),
        ("jobs, error type prefix", same("/jobs?error_type=http.*")),
        ("jobs, text in args (rare)", same("/jobs?text=customer%22%3A%204242")),
        ("jobs, text in error message", same("/jobs?text=said%20no%20to%20customer%2077")),
        ("jobs, text + type + state", same("/jobs?text=seeded%20job%2012&job_type=mail.send&state=completed")),
        ("jobs, oldest created first", same("/jobs?sort=oldest")),
        ("jobs, type prefix", same("/jobs?job_type=pay.*")),
        ("jobs, a rare type, any state", same("/jobs?job_type=report.rare")),
        ("jobs, a rare type, available", same("/jobs?job_type=report.rare&state=available")),
        ("jobs, a queue by priority", same("/jobs?queue=billing&state=available&sort=priority")),
        ("jobs, soonest scheduled", same("/jobs?state=scheduled&sort=scheduled")),
        ("jobs, a rare type by priority", same("/jobs?job_type=report.rare&sort=priority")),
        ("jobs, type prefix + state, oldest first", same("/jobs?job_type=sync.*&state=completed&sort=oldest")),
        ("jobs, last 24 hours", same("/jobs?since=24h")),
        ("jobs, last 7 days + state", same("/jobs?since=7d&state=retryable")),
        ("job detail (dead letter, 3 attempts)", ids.iter().map(|id| format!("/jobs/{id}")).collect()),
        ("dead letters", same("/dead-letters")),
        ("dead letters, queue + error type", same("/dead-letters?queue=billing&error_type=smtp.rejected")),
        ("dead letters, text", same("/dead-letters?text=customer%209999")),
        ("dead letters, died in the last 24 hours", same("/dead-letters?died=24h")),
        ("dead letters, most recently died first", same("/dead-letters?sort=died")),
        ("dead letters, oldest created first", same("/dead-letters?sort=oldest")),
        ("dead letters by death, queue + error type", same("/dead-letters?sort=died&queue=billing&error_type=smtp.rejected")),
        ("dead letters by death, text", same("/dead-letters?sort=died&text=customer%209999")),
        ("replay rules", same("/dead-letters/replay-rules")),
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
        let mark = if p95 <= BUDGET { "" } else { "  over budget" };
        ok &= mark.is_empty();
        println!("{name:<40} {:>7.1}ms {:>7.1}ms{mark}", p50.as_secs_f64() * 1e3, p95.as_secs_f64() * 1e3);
    }
    Ok(ok)
}
