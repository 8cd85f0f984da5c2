-- Review mends to …_rate_limit_on_limit.sql's settle (restated: CREATE OR REPLACE must):
-- * a rescheduled job no longer keeps the `enqueued_at` of its time in `available` (a
--   scheduled job has none, as everywhere else), and its row's `updated_at` is the time its
--   `job.scheduled` is logged at, which the per-job event lookup bounds by it;
-- * what it does to an admitted job held back again, and how the sweep picks up a job to drop
--   that a settle passed over, are said here.
--
-- After the admission, under the key's row lock it took, the key's waiting jobs that asked
-- not to wait:
-- * `drop`: discarded, their `last_error` saying why, with an attempt row `dropped` (no
--   execution: the attempt number is not counted) from which events read `job.discarded`,
--   and a `rate_limit.dropped` event each.
-- * `reschedule`: moved to `scheduled` at the time the limit is expected to let them start:
--   the end of a handler's hold, of an override of 0 that has an end, or of the spent rate
--   window, whichever is latest. Held by the concurrency alone, no such time can be named:
--   they wait, and are admitted when a slot frees. Each is a `job.scheduled` event.
-- This applies as well to a job admitted but not yet claimed that the key held back again (a
-- lowered override, a handler's hold, a job of higher priority taking its place): it cannot
-- start because of the limit. Rows another transaction holds are passed over: they are
-- handled at the key's next settling (the sweep settles a key with such a job to drop).
-- Workflow members are refused `on_limit` at enqueue, and never touched here: discarding one
-- would take workflow locks after the key's, against the order every other writer keeps.
CREATE OR REPLACE FUNCTION rebound_rate_limit_settle(k text, entered uuid[] DEFAULT '{}', reorder boolean DEFAULT false)
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    r rate_limit_keys;
    until timestamptz;
    at timestamptz;
BEGIN
    PERFORM rebound_rate_limit_admit(k, entered, reorder);
    IF NOT EXISTS (SELECT 1 FROM jobs WHERE rate_limit_key = k AND state = 'available' AND rate_limited AND rate_limit_on_limit IS NOT NULL) THEN
        RETURN;
    END IF;
    -- The clock, not the transaction's start: an enqueue's own drop must come after the job's
    -- `job.enqueued`, positioned at the time in its id, which Rebound takes after the
    -- transaction began. (An id a client chose, or one from a host whose clock is ahead, can
    -- still sort after it: events say as much of such ids.)
    at := clock_timestamp();
    WITH dropped AS (
        UPDATE jobs j
        SET state = 'discarded', discarded_at = at, completed_at = at, updated_at = now(),
            last_error = jsonb_build_object('type', 'rate_limit.dropped', 'code', 'rate_limit.dropped',
                'message', 'the rate limit of key ' || k || ' was reached and the job asked to be dropped (on_limit: drop)',
                'retryable', false, 'attempt', j.attempt,
                'occurred_at', to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
        WHERE j.id = ANY(ARRAY(
            SELECT id FROM jobs
            WHERE rate_limit_key = k AND state = 'available' AND rate_limited AND rate_limit_on_limit = 'drop'
              AND workflow_id IS NULL
            FOR UPDATE SKIP LOCKED))
        RETURNING j.id, j.type, j.queue, j.attempt
    ), recorded AS (
        INSERT INTO job_attempts (job_id, attempt, finished_at, outcome, error_type, error_code, error_message)
        SELECT id, attempt, at, 'dropped', 'rate_limit.dropped', 'rate_limit.dropped',
               'the rate limit of key ' || k || ' was reached and the job asked to be dropped (on_limit: drop)'
        FROM dropped
    )
    INSERT INTO rate_limit_events (key, type, data)
    SELECT k, 'rate_limit.dropped', jsonb_build_object('key', k, 'job_id', d.id, 'job_type', d.type, 'queue', d.queue)
    FROM dropped d;

    SELECT * INTO r FROM rate_limit_keys WHERE key = k;
    until := GREATEST(
        CASE WHEN r.held_until > now() THEN r.held_until END,
        CASE WHEN r.override_concurrency = 0 AND r.override_expires_at > now() THEN r.override_expires_at END,
        CASE WHEN rebound_rate_limit_window_room(r) = 0 THEN r.rate_window_start + r.rate_period_ms * interval '1 millisecond' END);
    IF until > now() THEN
        WITH moved AS (
            UPDATE jobs SET state = 'scheduled', rate_limited = false, scheduled_at = until, enqueued_at = NULL, updated_at = at
            WHERE id = ANY(ARRAY(
                SELECT id FROM jobs
                WHERE rate_limit_key = k AND state = 'available' AND rate_limited AND rate_limit_on_limit = 'reschedule'
                  AND workflow_id IS NULL
                FOR UPDATE SKIP LOCKED))
            RETURNING id, queue
        )
        INSERT INTO job_transitions (at, queue, state, job_ids)
        SELECT at, queue, 'scheduled', array_agg(id) FROM moved GROUP BY queue;
    END IF;
END $$;
