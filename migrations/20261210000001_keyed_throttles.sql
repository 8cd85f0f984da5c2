-- Per-key throttles (ojs-rate-limiting RL-R002): a job enqueued with
-- `rate_limit: {key, throttle: {limit, period}}` spaces the admissions (so the starts) of its
-- key's jobs evenly, at least `period / limit` apart, across queues and processes, beside the
-- key's concurrency and rate window.
--
-- A throttle is a second fixed window of one start whose period is that spacing, counted as
-- the rate window is (…_keyed_rate_windows.sql): at admission, under the key's row lock, a job
-- counting again each time it becomes claimable again, an admitted job nobody claimed counting
-- in the window after its own. The jobs it leaves waiting are admitted when the window ends,
-- by the next statement that settles the key or by the scheduler, which wakes at the earliest
-- end of a window that keeps jobs waiting.
--
-- For both kinds of window, a window now begins only when a job is admitted or enters in it:
-- admitted jobs nobody claimed (a paused queue) fill a window that has ended without beginning
-- another, which would end with them still unclaimed, and wake the scheduler, to no end.
ALTER TABLE rate_limit_keys
    ADD COLUMN throttle_max integer CHECK (throttle_max >= 1),
    ADD COLUMN throttle_period_ms bigint CHECK (throttle_period_ms > 0),
    ADD COLUMN throttle_window_start timestamptz,
    ADD COLUMN throttle_window_used integer NOT NULL DEFAULT 0,
    -- The end of the train of start times handed to jobs rescheduled by the throttle
    -- (`on_limit: reschedule`): the next one rescheduled starts there, not on top of them.
    ADD COLUMN throttle_reserved_until timestamptz,
    ADD CONSTRAINT rate_limit_keys_throttle_whole CHECK ((throttle_max IS NULL) = (throttle_period_ms IS NULL));

-- The least time between two starts of a key's jobs (NULL: no throttle).
CREATE FUNCTION rebound_rate_limit_spacing(r rate_limit_keys) RETURNS interval LANGUAGE sql IMMUTABLE AS $$
    SELECT r.throttle_period_ms * interval '1 millisecond' / r.throttle_max
$$;

-- The starts a key's throttle allows now: 1 or 0 (NULL: no throttle).
CREATE FUNCTION rebound_rate_limit_throttle_room(r rate_limit_keys) RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN r.throttle_max IS NULL THEN NULL
                WHEN r.throttle_window_start IS NULL OR r.throttle_window_start <= statement_timestamp() - rebound_rate_limit_spacing(r) THEN 1
                ELSE GREATEST(1 - r.throttle_window_used, 0) END
$$;

-- When a key's waiting jobs can next be admitted by its windows: the end of every window of
-- it that has no room left, if that is still to come (NULL: none is spent, so only a slot can
-- free them, or nothing holds them; or a rate of 0 holds them for good).
-- (One expression, so that Postgres inlines it: a past or no end, or the present, is NULL.)
CREATE FUNCTION rebound_rate_limit_windows_end(r rate_limit_keys) RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT NULLIF(GREATEST(
              CASE WHEN rebound_rate_limit_window_room(r) = 0 THEN r.rate_window_start + r.rate_period_ms * interval '1 millisecond' END,
              CASE WHEN rebound_rate_limit_throttle_room(r) = 0 THEN r.throttle_window_start + rebound_rate_limit_spacing(r) END,
              statement_timestamp()), statement_timestamp())
$$;

-- Whether a key's windows leave room for one more admission, given `admitted`, its admitted
-- jobs no worker has claimed yet: a window that has ended begins again counting them (see
-- the admission), so while they are unclaimed they fill it. (The sweep's test: a key whose
-- queue is paused is not settled pass after pass for nothing.)
CREATE FUNCTION rebound_rate_limit_window_admits(r rate_limit_keys, admitted bigint) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT (r.rate_max IS NULL
            OR CASE WHEN r.rate_window_start IS NULL OR r.rate_window_start <= statement_timestamp() - r.rate_period_ms * interval '1 millisecond'
                    THEN r.rate_max - admitted ELSE rebound_rate_limit_window_room(r) END > 0)
       AND (r.throttle_max IS NULL
            OR CASE WHEN r.throttle_window_start IS NULL OR r.throttle_window_start <= statement_timestamp() - rebound_rate_limit_spacing(r)
                    THEN 1 - admitted ELSE rebound_rate_limit_throttle_room(r) END > 0)
$$;

-- The keys that have jobs waiting, read by skipping along `jobs_rate_waiting`, one probe per
-- key (the sweep's keys to settle, and the keys whose windows the scheduler waits for).
CREATE FUNCTION rebound_rate_limit_waiting_keys() RETURNS SETOF text LANGUAGE sql STABLE AS $$
    WITH RECURSIVE waiting AS (
        (SELECT rate_limit_key AS key FROM jobs WHERE state = 'available' AND rate_limited ORDER BY rate_limit_key LIMIT 1)
        UNION ALL
        SELECT (SELECT j.rate_limit_key FROM jobs j
                WHERE j.state = 'available' AND j.rate_limited AND j.rate_limit_key > w.key
                ORDER BY j.rate_limit_key LIMIT 1)
        FROM waiting w WHERE w.key IS NOT NULL
    )
    SELECT key FROM waiting WHERE key IS NOT NULL
$$;

-- The admission of …_keyed_rate_windows.sql (renamed in …_rate_limit_on_limit.sql), restated
-- with the throttle's window beside the rate window: a job is admitted only while both have
-- room, and held back again when either is over.
CREATE OR REPLACE FUNCTION rebound_rate_limit_admit(k text, entered uuid[] DEFAULT '{}', reorder boolean DEFAULT false)
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    r rate_limit_keys;
    lim integer;
    held bigint;
    moved bigint := 0;
    queued bigint := 0;
    queues bigint;
    ts timestamptz;
    fresh boolean;
    used bigint;
    t_fresh boolean;
    t_used bigint;
    over_slots bigint;
    over_rate bigint;
    over_throttle bigint;
    windowed boolean;
    started bigint := 0;
    waiting boolean;
    left_waiting bigint;
    displaced bigint := 0;
    locked bigint;
    best record;
    worst record;
BEGIN
    entered := COALESCE(entered, '{}');
    -- No row: no limit (r stays all NULL).
    SELECT * INTO r FROM rate_limit_keys WHERE key = k FOR UPDATE;
    ts := clock_timestamp();
    lim := rebound_rate_limit_in_force(r);
    windowed := r.rate_max IS NOT NULL OR r.throttle_max IS NOT NULL;
    waiting := EXISTS (SELECT 1 FROM jobs WHERE rate_limit_key = k AND state = 'available' AND rate_limited);
    -- (The entered rows are this statement's own: locked by it already.)
    IF waiting AND cardinality(entered) > 0 AND (lim IS NOT NULL OR windowed) THEN
        UPDATE jobs SET rate_limited = true WHERE id = ANY(entered) AND state = 'available' AND NOT rate_limited;
        GET DIAGNOSTICS queued = ROW_COUNT;
    END IF;
    -- Counted after the lock, with this statement's fresh snapshot (VOLATILE): every other
    -- settling of the key has committed or not started. (READ COMMITTED, as every
    -- transaction of the store is: a REPEATABLE READ snapshot would not see them.)
    IF lim IS NOT NULL THEN
        SELECT count(*) INTO held FROM jobs
        WHERE rate_limit_key = k AND state IN ('available', 'active') AND NOT rate_limited;
    END IF;
    IF r.rate_max IS NOT NULL THEN
        fresh := r.rate_window_start IS NULL OR r.rate_window_start <= ts - r.rate_period_ms * interval '1 millisecond';
        IF fresh THEN
            -- Admitted and not yet claimed (the entered ones among them): they start in this one.
            SELECT count(*) INTO used FROM jobs WHERE rate_limit_key = k AND state = 'available' AND NOT rate_limited;
        ELSE
            used := r.rate_window_used + cardinality(entered) - queued;
        END IF;
    END IF;
    IF r.throttle_max IS NOT NULL THEN
        t_fresh := r.throttle_window_start IS NULL OR r.throttle_window_start <= ts - rebound_rate_limit_spacing(r);
        IF t_fresh THEN
            SELECT count(*) INTO t_used FROM jobs WHERE rate_limit_key = k AND state = 'available' AND NOT rate_limited;
        ELSE
            t_used := r.throttle_window_used + cardinality(entered) - queued;
        END IF;
    END IF;
    over_slots := COALESCE(held - lim, 0);
    over_rate := COALESCE(used - r.rate_max, 0);
    over_throttle := COALESCE(t_used - 1, 0);
    IF over_slots > 0 OR over_rate > 0 OR over_throttle > 0 THEN
        WITH parked AS (
            UPDATE jobs SET rate_limited = true
            WHERE id = ANY(ARRAY(
                SELECT id FROM jobs
                WHERE rate_limit_key = k AND state = 'available' AND NOT rate_limited
                ORDER BY priority, scheduled_at DESC, id DESC
                LIMIT GREATEST(over_slots, over_rate, over_throttle)
                FOR UPDATE SKIP LOCKED))
            RETURNING id
        )
        SELECT count(*) INTO moved FROM parked;
        IF moved > 0 THEN
            INSERT INTO rate_limit_events (key, type, data)
            VALUES (k, 'rate_limit.exceeded',
                    -- (The throttle only when it alone parked the most: it implies a throttle.)
                    CASE WHEN over_throttle > over_rate AND over_throttle > over_slots
                         THEN jsonb_build_object('key', k, 'strategy', 'throttle', 'limit', r.throttle_max,
                                                 'period_ms', r.throttle_period_ms, 'parked', moved, 'next_allowed_at',
                                                 CASE WHEN t_fresh THEN ts ELSE r.throttle_window_start END + rebound_rate_limit_spacing(r))
                         WHEN over_rate >= over_slots
                         THEN jsonb_build_object('key', k, 'strategy', 'rate', 'limit', r.rate_max, 'current', used - moved,
                                                 'parked', moved, 'window_resets_at',
                                                 CASE WHEN fresh THEN ts ELSE r.rate_window_start END + r.rate_period_ms * interval '1 millisecond')
                         ELSE jsonb_build_object('key', k, 'strategy', 'concurrency', 'limit', lim, 'current', held - moved, 'parked', moved) END);
        END IF;
        -- Held back before any worker claimed them: they did not start.
        -- (A key without such a window keeps NULL: GREATEST would make it 0.)
        used := CASE WHEN used IS NOT NULL THEN GREATEST(used - moved, 0) END;
        t_used := CASE WHEN t_used IS NOT NULL THEN GREATEST(t_used - moved, 0) END;
        held := held - moved;
        moved := 0;
    ELSIF (waiting OR queued > 0) AND (lim IS NULL OR held < lim) AND (r.rate_max IS NULL OR used < r.rate_max)
          AND (r.throttle_max IS NULL OR t_used < 1) THEN
        WITH admitted AS (
            UPDATE jobs SET rate_limited = false
            WHERE id = ANY(ARRAY(
                SELECT id FROM jobs
                WHERE rate_limit_key = k AND state = 'available' AND rate_limited
                ORDER BY priority DESC, scheduled_at, id
                -- LEAST passes over a NULL: no limit of that kind.
                LIMIT LEAST(lim - held, r.rate_max - used, 1 - t_used)
                FOR UPDATE SKIP LOCKED))
            RETURNING id, queue, type
        ), logged AS (
            INSERT INTO rate_limit_events (key, type, data)
            SELECT k, 'rate_limit.released',
                   jsonb_build_object('key', k, 'strategy', CASE WHEN r.rate_max IS NOT NULL AND lim IS NULL THEN 'rate'
                                                                  WHEN r.throttle_max IS NOT NULL AND lim IS NULL THEN 'throttle'
                                                                  ELSE 'concurrency' END,
                                      'job_id', a.id, 'queue', a.queue, 'job_type', a.type)
            FROM admitted a
            -- An entered job put in line and admitted at once never waited.
            WHERE NOT a.id = ANY(entered)
        ), notified AS (
            -- Wakes the workers of the queues that got claimable work.
            SELECT pg_notify('rebound_jobs', q.queue) FROM (SELECT DISTINCT queue FROM admitted) q
        )
        SELECT (SELECT count(*) FROM admitted), (SELECT count(*) FROM notified) INTO moved, queues;
        started := moved;
        used := used + moved;
        t_used := t_used + moved;
        held := held + moved;
    END IF;
    -- A job in line that outranks an admitted one no worker has claimed takes its place, one
    -- pair at a time (usually none: admission goes in line order). Read without locks first,
    -- both rows locked only to change places (a row another transaction holds ends the pass).
    IF (queued > 0 OR reorder) AND (lim IS NOT NULL OR windowed) THEN
        FOR i IN 1..1000 LOOP
            SELECT id, priority, scheduled_at, queue, type INTO best FROM jobs
            WHERE rate_limit_key = k AND state = 'available' AND rate_limited
            ORDER BY priority DESC, scheduled_at, id LIMIT 1;
            EXIT WHEN NOT FOUND;
            SELECT id, priority, scheduled_at INTO worst FROM jobs
            WHERE rate_limit_key = k AND state = 'available' AND NOT rate_limited
            ORDER BY priority, scheduled_at DESC, id DESC LIMIT 1;
            -- (ROW(...) <= ROW(...): the best in line does not outrank the worst admitted.)
            EXIT WHEN NOT FOUND OR ROW(best.priority, worst.scheduled_at, worst.id) <= ROW(worst.priority, best.scheduled_at, best.id);
            SELECT count(*) INTO locked FROM (
                SELECT id FROM jobs
                WHERE (id = best.id AND state = 'available' AND rate_limited) OR (id = worst.id AND state = 'available' AND NOT rate_limited)
                FOR UPDATE SKIP LOCKED) l;
            EXIT WHEN locked < 2;
            UPDATE jobs SET rate_limited = (id = worst.id) WHERE id IN (best.id, worst.id);
            PERFORM pg_notify('rebound_jobs', best.queue);
            IF NOT best.id = ANY(entered) THEN
                INSERT INTO rate_limit_events (key, type, data)
                VALUES (k, 'rate_limit.released', jsonb_build_object('key', k, 'strategy', 'priority', 'job_id', best.id,
                                                                     'queue', best.queue, 'job_type', best.type));
            END IF;
            IF NOT worst.id = ANY(entered) THEN
                displaced := displaced + 1;
            END IF;
        END LOOP;
    END IF;
    -- Entered jobs put in line and left there, and admitted ones they displaced: this
    -- statement made them wait, for a slot or for a window.
    IF queued > 0 THEN
        SELECT count(*) + displaced INTO left_waiting FROM jobs WHERE id = ANY(entered) AND rate_limited;
        IF left_waiting > 0 THEN
            INSERT INTO rate_limit_events (key, type, data)
            VALUES (k, 'rate_limit.exceeded',
                    CASE WHEN lim IS NOT NULL AND held >= lim
                         THEN jsonb_build_object('key', k, 'strategy', 'concurrency', 'limit', lim, 'current', held, 'parked', left_waiting)
                         WHEN r.throttle_max IS NOT NULL AND (r.rate_max IS NULL OR used < r.rate_max)
                         THEN jsonb_build_object('key', k, 'strategy', 'throttle', 'limit', r.throttle_max,
                                                 'period_ms', r.throttle_period_ms, 'parked', left_waiting)
                         ELSE jsonb_build_object('key', k, 'strategy', 'rate', 'limit', r.rate_max, 'current', used, 'parked', left_waiting) END);
        END IF;
    END IF;
    -- A window begins at the first start counted after the last one ended, when this call
    -- started a job in it (entered or admitted). Admitted jobs no worker has claimed yet (a
    -- paused queue) count in a window that has ended, but begin none: it would end with them
    -- still unclaimed, and begin again, to no end. (One write for both windows: the key's
    -- row is written at most once here.)
    started := started + cardinality(entered) - queued;
    IF (r.rate_max IS NOT NULL AND (CASE WHEN fresh THEN started > 0 AND used > 0 ELSE used <> r.rate_window_used END))
       OR (r.throttle_max IS NOT NULL AND (CASE WHEN t_fresh THEN started > 0 AND t_used > 0 ELSE t_used <> r.throttle_window_used END)) THEN
        UPDATE rate_limit_keys
        SET rate_window_used = CASE WHEN used IS NULL THEN rate_window_used WHEN fresh AND started = 0 THEN 0 ELSE used END,
            rate_window_start = CASE WHEN used IS NULL OR NOT fresh THEN rate_window_start WHEN started > 0 AND used > 0 THEN ts END,
            throttle_window_used = CASE WHEN t_used IS NULL THEN throttle_window_used WHEN t_fresh AND started = 0 THEN 0 ELSE t_used END,
            throttle_window_start = CASE WHEN t_used IS NULL OR NOT t_fresh THEN throttle_window_start WHEN started > 0 AND t_used > 0 THEN ts END
        WHERE key = k;
    END IF;
END $$;

-- The settle of …_rate_limit_on_limit_mends.sql, restated (CREATE OR REPLACE must) for the
-- throttle: a job that would rather not wait is rescheduled to the end of every spent window
-- of its key (the throttle's among them), or of a hold; and with a throttle, the jobs
-- rescheduled are spread one spacing (and a little) apart, in line order, after those
-- rescheduled before them that are still to come, so that they do not all come back at one
-- time only for all but one to be rescheduled again; the first in line, if its wait ends
-- within that little, waits instead. (A rate window's jobs still all come back at its end,
-- as before.)
CREATE OR REPLACE FUNCTION rebound_rate_limit_settle(k text, entered uuid[] DEFAULT '{}', reorder boolean DEFAULT false)
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    r rate_limit_keys;
    until timestamptz;
    at timestamptz;
    slot interval;
    slack interval;
    train_end timestamptz;
    first integer := 0;
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
        rebound_rate_limit_windows_end(r));
    IF until > now() THEN
        -- (The key's row is locked: the admission took it.) One spacing apart and a little
        -- more (a tenth, at most 50 ms): a job promoted a few ms before the one ahead of it
        -- had its spacing would be held back again.
        slack := LEAST(rebound_rate_limit_spacing(r) / 10, interval '50 milliseconds');
        slot := rebound_rate_limit_spacing(r) + slack;
        IF r.throttle_max IS NOT NULL THEN
            -- The first in line, whose wait ends within that little (it came back a little
            -- early, at the head of the line), waits for it instead of going to the end.
            IF until <= clock_timestamp() + slack THEN
                first := 1;
            END IF;
            -- The rest after the jobs rescheduled before that are still to come; the
            -- reservation only bounds them (a job scheduled later by its client is not in the
            -- line), and is forgotten once they are gone (run, cancelled, replaced).
            SELECT max(scheduled_at) + slot INTO train_end FROM jobs
            WHERE rate_limit_key = k AND state = 'scheduled' AND rate_limit_on_limit = 'reschedule'
              AND scheduled_at < r.throttle_reserved_until;
            until := GREATEST(until, train_end);
        END IF;
        WITH picked AS (
            SELECT id, row_number() OVER (ORDER BY priority DESC, scheduled_at, id) - 1 AS ahead
            FROM jobs
            WHERE id = ANY(ARRAY(
                SELECT id FROM jobs
                WHERE rate_limit_key = k AND state = 'available' AND rate_limited AND rate_limit_on_limit = 'reschedule'
                  AND workflow_id IS NULL
                FOR UPDATE SKIP LOCKED))
        ), moved AS (
            UPDATE jobs j SET state = 'scheduled', rate_limited = false, enqueued_at = NULL, updated_at = at,
                              scheduled_at = until + COALESCE(p.ahead * slot, interval '0')
            FROM picked p
            WHERE j.id = p.id AND p.ahead >= first
            RETURNING j.id, j.queue, p.ahead
        ), reserved AS (
            UPDATE rate_limit_keys SET throttle_reserved_until = until + (SELECT max(ahead) + 1 FROM moved) * slot
            WHERE key = k AND r.throttle_max IS NOT NULL AND EXISTS (SELECT 1 FROM moved)
        )
        INSERT INTO job_transitions (at, queue, state, job_ids)
        SELECT at, queue, 'scheduled', array_agg(id) FROM moved GROUP BY queue;
    END IF;
END $$;
