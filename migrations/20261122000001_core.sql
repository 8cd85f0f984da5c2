-- Rebound's schema. This file and its successors are the only schema source; both binaries
-- embed them with sqlx::migrate!.

CREATE TYPE job_state AS ENUM (
    'scheduled', 'available', 'pending', 'active',
    'completed', 'retryable', 'cancelled', 'discarded'
);

CREATE TABLE queues (
    name        text PRIMARY KEY,
    paused      boolean NOT NULL DEFAULT false,
    paused_at   timestamptz,
    paused_by   text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE jobs (
    id                    uuid PRIMARY KEY,
    type                  text NOT NULL,
    queue                 text NOT NULL DEFAULT 'default',
    args                  jsonb NOT NULL DEFAULT '[]',
    meta                  jsonb NOT NULL DEFAULT '{}',
    -- Unknown top-level envelope fields, echoed back verbatim (OJS).
    extra                 jsonb NOT NULL DEFAULT '{}',
    priority              smallint NOT NULL DEFAULT 0 CHECK (priority BETWEEN -100 AND 100),
    tags                  text[] NOT NULL DEFAULT '{}',
    state                 job_state NOT NULL,
    attempt               integer NOT NULL DEFAULT 0,
    max_attempts          integer NOT NULL DEFAULT 3,
    -- The job's own retry override (a partial policy); merged over the live per-type policy
    -- at the moment a failure is recorded.
    retry                 jsonb,
    timeout_ms            bigint,
    visibility_timeout_ms bigint,
    unique_key            text,
    unique_states         job_state[],
    unique_until          timestamptz,
    scheduled_at          timestamptz NOT NULL DEFAULT now(),
    expires_at            timestamptz,
    created_at            timestamptz NOT NULL DEFAULT now(),
    enqueued_at           timestamptz,
    started_at            timestamptz,
    completed_at          timestamptz,
    cancelled_at          timestamptz,
    discarded_at          timestamptz,
    locked_by             text,
    lock_expires_at       timestamptz,
    dead_letter           boolean NOT NULL DEFAULT false,
    dead_lettered_at      timestamptz,
    result                jsonb,
    last_error            jsonb,
    retry_delay_ms        bigint,
    updated_at            timestamptz NOT NULL DEFAULT now(),
    -- Dead letters are grouped by this on the dashboard: the error type plus the message with
    -- ids and numbers normalised, so "timeout after 31s" and "after 30s" group together.
    -- Generated so that every writer (and a hand edit) keeps it right; NULL unless dead.
    error_signature       text GENERATED ALWAYS AS (
        CASE WHEN dead_letter THEN
            coalesce(last_error->>'type', '') || ': ' ||
            regexp_replace(coalesce(last_error->>'message', ''),
                '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9]+', '#', 'g')
        END) STORED
);

-- The claim path: only the claimable set is indexed, in claim order.
CREATE INDEX jobs_claimable ON jobs (queue, priority DESC, scheduled_at, id)
    WHERE state = 'available';
-- The scheduler: due scheduled/retryable jobs.
CREATE INDEX jobs_due ON jobs (scheduled_at) WHERE state IN ('scheduled', 'retryable');
-- The rescuer: expired locks.
CREATE INDEX jobs_locked ON jobs (lock_expires_at) WHERE state = 'active';
-- TTL expiry of jobs that have not run.
CREATE INDEX jobs_expiring ON jobs (expires_at)
    WHERE expires_at IS NOT NULL AND state IN ('scheduled', 'available', 'retryable', 'pending');
-- Listing with keyset pagination (ids are UUIDv7, so id order is creation order).
CREATE INDEX jobs_state_id ON jobs (state, id DESC);
CREATE INDEX jobs_queue_state_id ON jobs (queue, state, id DESC);
CREATE INDEX jobs_type_state_id ON jobs (type, state, id DESC);
-- Dead-letter views.
CREATE INDEX jobs_dead_letters ON jobs (id DESC) WHERE dead_letter;
CREATE INDEX jobs_dead_letters_signature ON jobs (error_signature, dead_lettered_at DESC) WHERE dead_letter;
-- Unique / idempotency keys.
CREATE INDEX jobs_unique_key ON jobs (unique_key) WHERE unique_key IS NOT NULL;
-- The pruner: finished jobs by age.
CREATE INDEX jobs_finished ON jobs (state, completed_at)
    WHERE state IN ('completed', 'cancelled', 'discarded');

-- One row per execution of a job.
CREATE TABLE job_attempts (
    id             bigserial PRIMARY KEY,
    job_id         uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    attempt        integer NOT NULL,
    worker_id      text,
    started_at     timestamptz,
    finished_at    timestamptz NOT NULL DEFAULT now(),
    -- completed | retried | snoozed | discarded | dead_lettered | failed | exhausted
    -- | non_retryable | released
    outcome        text NOT NULL,
    error_type     text,
    error_code     text,
    error_message  text,
    error_details  jsonb,
    delay_ms       bigint,
    next_run_at    timestamptz,
    -- The effective policy the decision used, so history explains itself after later edits.
    policy         jsonb
);
CREATE INDEX job_attempts_job ON job_attempts (job_id, id);
CREATE INDEX job_attempts_finished ON job_attempts (finished_at);

-- Per-type retry policies, edited live. '*' is the editable global default layer.
CREATE TABLE retry_policies (
    job_type    text PRIMARY KEY,
    policy      jsonb NOT NULL,
    version     integer NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    updated_by  text
);
CREATE TABLE retry_policy_versions (
    job_type    text NOT NULL,
    version     integer NOT NULL,
    policy      jsonb,          -- NULL records a deletion
    created_at  timestamptz NOT NULL DEFAULT now(),
    created_by  text,
    note        text,
    PRIMARY KEY (job_type, version)
);

CREATE TABLE workers (
    id                text PRIMARY KEY,
    host              text NOT NULL,
    pid               integer NOT NULL,
    queues            text[] NOT NULL DEFAULT '{}',
    concurrency       integer NOT NULL DEFAULT 0,
    version           text NOT NULL DEFAULT '',
    running           integer NOT NULL DEFAULT 0,
    started_at        timestamptz NOT NULL DEFAULT now(),
    last_heartbeat_at timestamptz NOT NULL DEFAULT now(),
    stopping          boolean NOT NULL DEFAULT false
);

CREATE TABLE operators (
    id             bigserial PRIMARY KEY,
    username       text NOT NULL UNIQUE,
    password_hash  text NOT NULL,
    role           text NOT NULL CHECK (role IN ('viewer', 'operator')),
    disabled       boolean NOT NULL DEFAULT false,
    created_at     timestamptz NOT NULL DEFAULT now(),
    last_login_at  timestamptz
);

CREATE TABLE sessions (
    token_hash    text PRIMARY KEY,
    operator_id   bigint NOT NULL REFERENCES operators (id) ON DELETE CASCADE,
    csrf_token    text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL,
    last_seen_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE api_tokens (
    id            bigserial PRIMARY KEY,
    name          text NOT NULL UNIQUE,
    token_hash    text NOT NULL UNIQUE,
    created_at    timestamptz NOT NULL DEFAULT now(),
    revoked_at    timestamptz,
    last_used_at  timestamptz
);

CREATE TABLE audit_log (
    id       bigserial PRIMARY KEY,
    at       timestamptz NOT NULL DEFAULT now(),
    actor    text NOT NULL,
    action   text NOT NULL,
    target   text,
    details  jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX audit_log_at ON audit_log (at DESC, id DESC);
CREATE INDEX audit_log_actor ON audit_log (actor, id DESC);

-- Wake workers when new work is available. A statement-level trigger with a transition table
-- coalesces a batch insert into one notification per queue (NOTIFY also de-duplicates within
-- a transaction). Updates that make jobs available (scheduler, re-drive) notify explicitly,
-- so the claim/complete path pays for no trigger.
CREATE FUNCTION rebound_notify_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('rebound_jobs', q.queue)
    FROM (SELECT DISTINCT queue FROM new_jobs WHERE state = 'available') AS q;
    RETURN NULL;
END;
$$;

CREATE TRIGGER jobs_notify_inserted
    AFTER INSERT ON jobs
    REFERENCING NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION rebound_notify_inserted();
