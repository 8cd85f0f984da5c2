-- Per-key rate windows (ojs-rate-limiting RL-R001): a job enqueued with
-- `rate_limit: {key, rate: {limit, period}}` lets at most `limit` jobs of its key start per
-- `period`, across queues and processes, beside (or instead of) the key's concurrency.
--
-- Counted at admission, as the key's slots are (see …_keyed_rate_limits.sql): an admitted job
-- is claimable at once, so it is counted as a start when it is admitted, in the same statement
-- and under the key's row lock, never at claim time (claims take no key lock). A job counts
-- again each time it becomes claimable again (a retry, immediate or not, a re-drive, a job
-- handed back); one held back again before any worker claimed it (a lowered limit) gives its
-- count back, and a window that begins counts the admitted jobs no worker has claimed yet, so
-- admissions never pile up across windows. Windows are fixed windows, as a queue's are: a
-- window begins at the first admission after the last one ended, and the jobs it left waiting
-- are admitted by the maintenance sweep within a tick of its end.
ALTER TABLE rate_limit_keys
    ADD COLUMN rate_max integer CHECK (rate_max >= 0),
    ADD COLUMN rate_period_ms bigint CHECK (rate_period_ms > 0),
    ADD COLUMN rate_window_start timestamptz,
    ADD COLUMN rate_window_used integer NOT NULL DEFAULT 0,
    ADD CONSTRAINT rate_limit_keys_rate_whole CHECK ((rate_max IS NULL) = (rate_period_ms IS NULL));

-- The starts a key's rate window still allows (NULL: no window); a window whose period has
-- passed allows them all again.
CREATE FUNCTION rebound_rate_limit_window_room(r rate_limit_keys) RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN r.rate_max IS NULL THEN NULL
                WHEN r.rate_window_start IS NULL OR r.rate_window_start <= statement_timestamp() - r.rate_period_ms * interval '1 millisecond' THEN r.rate_max
                ELSE GREATEST(r.rate_max - r.rate_window_used, 0) END
$$;

-- A key's admitted jobs no worker has claimed yet, in line order: the lowest of them is what
-- parking holds back, and what a job outranking it displaces.
CREATE INDEX jobs_rate_admitted ON jobs (rate_limit_key, priority DESC, scheduled_at, id)
    WHERE state = 'available' AND NOT rate_limited AND rate_limit_key IS NOT NULL;

-- As before (…_keyed_rate_limits.sql), and the rate window too. `entered`: the key's jobs the
-- calling statement made claimable without this function admitting them (inserted, come back
-- to `available` from any other state, not marked waiting): they count in the window. If the
-- key has jobs waiting already, they first join the line (rate_limited), so whatever room
-- there is goes to the highest priority of all, not to whoever arrived last; and a job in line
-- that outranks an admitted one no worker has claimed takes its place (`reorder` asks for that
-- too: the statement brought back jobs still marked waiting). A job handed back or cancelled
-- before it ran still counts in its window: a window never lets more start than its limit,
-- and may let fewer. Windows are timed by the clock once the key is locked (a wait for the lock
-- or a long transaction must not shorten them).
DROP FUNCTION rebound_rate_limit_settle(text);
CREATE FUNCTION rebound_rate_limit_settle(k text, entered uuid[] DEFAULT '{}', reorder boolean DEFAULT false)
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
    over_slots bigint;
    over_rate bigint;
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
    waiting := EXISTS (SELECT 1 FROM jobs WHERE rate_limit_key = k AND state = 'available' AND rate_limited);
    -- (The entered rows are this statement's own: locked by it already.)
    IF waiting AND cardinality(entered) > 0 AND (lim IS NOT NULL OR r.rate_max IS NOT NULL) THEN
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
    over_slots := COALESCE(held - lim, 0);
    over_rate := COALESCE(used - r.rate_max, 0);
    IF over_slots > 0 OR over_rate > 0 THEN
        WITH parked AS (
            UPDATE jobs SET rate_limited = true
            WHERE id = ANY(ARRAY(
                SELECT id FROM jobs
                WHERE rate_limit_key = k AND state = 'available' AND NOT rate_limited
                ORDER BY priority, scheduled_at DESC, id DESC
                LIMIT GREATEST(over_slots, over_rate)
                FOR UPDATE SKIP LOCKED))
            RETURNING id
        )
        SELECT count(*) INTO moved FROM parked;
        IF moved > 0 THEN
            INSERT INTO rate_limit_events (key, type, data)
            VALUES (k, 'rate_limit.exceeded',
                    CASE WHEN over_rate >= over_slots
                         THEN jsonb_build_object('key', k, 'strategy', 'rate', 'limit', r.rate_max, 'current', used - moved,
                                                 'parked', moved, 'window_resets_at',
                                                 CASE WHEN fresh THEN ts ELSE r.rate_window_start END + r.rate_period_ms * interval '1 millisecond')
                         ELSE jsonb_build_object('key', k, 'strategy', 'concurrency', 'limit', lim, 'current', held - moved, 'parked', moved) END);
        END IF;
        -- Held back before any worker claimed them: they did not start.
        used := GREATEST(used - moved, 0);
        held := held - moved;
        moved := 0;
    ELSIF (waiting OR queued > 0) AND (lim IS NULL OR held < lim) AND (r.rate_max IS NULL OR used < r.rate_max) THEN
        WITH admitted AS (
            UPDATE jobs SET rate_limited = false
            WHERE id = ANY(ARRAY(
                SELECT id FROM jobs
                WHERE rate_limit_key = k AND state = 'available' AND rate_limited
                ORDER BY priority DESC, scheduled_at, id
                -- LEAST passes over a NULL: no limit of that kind.
                LIMIT LEAST(lim - held, r.rate_max - used)
                FOR UPDATE SKIP LOCKED))
            RETURNING id, queue, type
        ), logged AS (
            INSERT INTO rate_limit_events (key, type, data)
            SELECT k, 'rate_limit.released',
                   jsonb_build_object('key', k, 'strategy', CASE WHEN r.rate_max IS NOT NULL AND lim IS NULL THEN 'rate' ELSE 'concurrency' END,
                                      'job_id', a.id, 'queue', a.queue, 'job_type', a.type)
            FROM admitted a
            -- An entered job put in line and admitted at once never waited.
            WHERE NOT a.id = ANY(entered)
        ), notified AS (
            -- Wakes the workers of the queues that got claimable work.
            SELECT pg_notify('rebound_jobs', q.queue) FROM (SELECT DISTINCT queue FROM admitted) q
        )
        SELECT (SELECT count(*) FROM admitted), (SELECT count(*) FROM notified) INTO moved, queues;
        used := used + moved;
        held := held + moved;
    END IF;
    -- A job in line that outranks an admitted one no worker has claimed takes its place, one
    -- pair at a time (usually none: admission goes in line order). Read without locks first,
    -- both rows locked only to change places (a row another transaction holds ends the pass).
    IF (queued > 0 OR reorder) AND (lim IS NOT NULL OR r.rate_max IS NOT NULL) THEN
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
    -- statement made them wait, for a slot or for the window.
    IF queued > 0 THEN
        SELECT count(*) + displaced INTO left_waiting FROM jobs WHERE id = ANY(entered) AND rate_limited;
        IF left_waiting > 0 THEN
            INSERT INTO rate_limit_events (key, type, data)
            VALUES (k, 'rate_limit.exceeded',
                    CASE WHEN lim IS NOT NULL AND held >= lim
                         THEN jsonb_build_object('key', k, 'strategy', 'concurrency', 'limit', lim, 'current', held, 'parked', left_waiting)
                         ELSE jsonb_build_object('key', k, 'strategy', 'rate', 'limit', r.rate_max, 'current', used, 'parked', left_waiting) END);
        END IF;
    END IF;
    -- A window begins at the first start counted after the last one ended.
    IF r.rate_max IS NOT NULL AND (used <> r.rate_window_used OR (fresh AND used > 0)) THEN
        UPDATE rate_limit_keys
        SET rate_window_used = used,
            rate_window_start = CASE WHEN NOT fresh THEN rate_window_start WHEN used > 0 THEN ts END
        WHERE key = k;
    END IF;
END $$;

CREATE OR REPLACE FUNCTION rebound_rate_limits_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    -- Every keyed row, not only available ones: an enqueue may have lowered its key's limit.
    FOR r IN
        SELECT rate_limit_key AS key, COALESCE(array_agg(id) FILTER (WHERE state = 'available' AND NOT rate_limited), '{}') AS entered
        FROM rl_new WHERE rate_limit_key IS NOT NULL GROUP BY 1 ORDER BY 1
    LOOP
        PERFORM rebound_rate_limit_settle(r.key, r.entered);
    END LOOP;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION rebound_rate_limits_updated() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM rl_new WHERE rate_limit_key IS NOT NULL) THEN
        RETURN NULL;
    END IF;
    -- The keys of rows that took or gave up a slot, or entered `available` from any other
    -- state (a row parked before, cancelled and retried, comes back still marked waiting; an
    -- active one retried at once or handed back holds its slot throughout, but will start
    -- again: it counts in the key's rate window again), or failed with a `rate_limit_until`.
    -- A claim (available to active) holds its slot throughout, and parking and admitting
    -- change no state: neither comes back here. A job leaving one non-holding state for
    -- another (pending to cancelled, say) takes no key lock.
    FOR r IN
        SELECT n.rate_limit_key AS key,
               -- (LEAST skips a NULL: with no time given it would hold the key for a day.)
               CASE WHEN max(rebound_rate_limit_until(n.last_error->'details')) FILTER (WHERE n.last_error IS DISTINCT FROM o.last_error) IS NOT NULL
                    THEN LEAST(max(rebound_rate_limit_until(n.last_error->'details')) FILTER (WHERE n.last_error IS DISTINCT FROM o.last_error),
                               now() + interval '1 day') END AS until,
               (array_agg(n.last_error->>'type') FILTER (WHERE n.last_error->'details' ? 'rate_limit_until'))[1] AS reason,
               COALESCE(array_agg(n.id) FILTER (WHERE n.state IS DISTINCT FROM o.state AND n.state = 'available' AND NOT n.rate_limited), '{}') AS entered,
               bool_or(n.state IS DISTINCT FROM o.state AND n.state = 'available' AND n.rate_limited) AS reorder
        FROM rl_new n JOIN rl_old o ON o.id = n.id
        WHERE n.rate_limit_key IS NOT NULL
          AND ((n.state IS DISTINCT FROM o.state
                AND (n.state = 'available'
                     OR (o.state IN ('available', 'active') AND NOT o.rate_limited AND n.state NOT IN ('available', 'active'))))
               OR (n.last_error IS DISTINCT FROM o.last_error AND n.last_error->'details' ? 'rate_limit_until'))
        GROUP BY 1
        ORDER BY 1
    LOOP
        IF r.until > now() THEN
            INSERT INTO rate_limit_keys AS k (key, held_until) VALUES (r.key, r.until)
            ON CONFLICT (key) DO UPDATE SET held_until = GREATEST(k.held_until, EXCLUDED.held_until), updated_at = now();
            INSERT INTO rate_limit_events (key, type, data)
            VALUES (r.key, 'rate_limit.dynamic_adjusted', jsonb_build_object('key', r.key, 'until', r.until, 'reason', r.reason));
        END IF;
        PERFORM rebound_rate_limit_settle(r.key, r.entered, r.reorder);
    END LOOP;
    RETURN NULL;
END $$;

-- A handler's `rate_limit_until` is taken only as an RFC 3339 time with its offset, as the API
-- takes a nack's (Postgres' own reading would take `tomorrow`, `now`, or a time without an
-- offset in whatever zone the session has).
CREATE OR REPLACE FUNCTION rebound_rate_limit_until(details jsonb) RETURNS timestamptz LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT COALESCE(details->>'rate_limit_until' ~ '^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$', false) THEN
        RETURN NULL;
    END IF;
    RETURN (details->>'rate_limit_until')::timestamptz;
EXCEPTION WHEN others THEN
    RETURN NULL;
END $$;
