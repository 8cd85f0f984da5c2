-- Cron jobs (OJS cron): named schedules that enqueue a job template. Fired by the maintenance
-- leader, but exactly-once is the database's doing, not leadership's: a tick fires only by
-- moving `next_run_at` forward from the very value it read (a compare-and-set in one UPDATE),
-- and each decided tick is a row of cron_runs keyed by (cron, tick). A second firer, a leader
-- that lost its lock mid-pass, or a retry after a lost commit finds the tick taken.
CREATE TABLE cron_jobs (
    name            text PRIMARY KEY,
    expression      text NOT NULL,
    timezone        text NOT NULL DEFAULT 'UTC',
    -- The job to enqueue: type, args, meta and options, as validated at registration.
    template        jsonb NOT NULL,
    overlap_policy  text NOT NULL DEFAULT 'skip'
                    CHECK (overlap_policy IN ('skip', 'allow', 'cancel_previous', 'enqueue')),
    enabled         boolean NOT NULL DEFAULT true,
    description     text,
    -- NULL while disabled (OJS).
    next_run_at     timestamptz,
    last_run_at     timestamptz,
    last_job_id     uuid,
    -- What the latest tick did: enqueued | skipped | waiting | triggered.
    last_outcome    text,
    run_count       bigint NOT NULL DEFAULT 0,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX cron_jobs_due ON cron_jobs (next_run_at) WHERE enabled;

CREATE TABLE cron_runs (
    cron_name      text NOT NULL,
    -- The tick this row decided (for a manual trigger, when it was triggered).
    scheduled_for  timestamptz NOT NULL,
    fired_at       timestamptz NOT NULL DEFAULT now(),
    -- enqueued | skipped | waiting (enqueued pending behind a running one) | triggered
    outcome        text NOT NULL,
    job_id         uuid,
    PRIMARY KEY (cron_name, scheduled_for)
);
CREATE INDEX cron_runs_fired ON cron_runs (fired_at);
