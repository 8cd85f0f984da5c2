-- Per-job keyed concurrency limits (ojs-rate-limiting RL-001..RL-006): a job enqueued with
-- `rate_limit: {key, concurrency}` shares its key's limit with every job of that key, in any
-- queue. At most `concurrency` of them hold a slot at once, where holding is being `active`
-- or being `available` and admitted.
--
-- Admission, not a check at claim time. A keyed job entering `available` (enqueued, promoted,
-- retried, re-driven) holds a slot at once if its key has room; otherwise the statement that
-- moved it parks it (`rate_limited`): still `available`, as the spec asks, but out of
-- `jobs_claimable`, so a claim never walks past a saturated key's waiting jobs and unkeyed
-- claims read the index they always read. Whenever a keyed job stops holding (finished,
-- failed into a retry, cancelled, deleted), the statement that did it admits the key's next
-- waiting jobs, highest priority first. Both happen in statement triggers, so the count moves
-- in the same transaction as the state (no counter to drift: the slots are counted from the
-- rows under the key's row lock, with a fresh snapshot, as the queue limit counts its
-- active jobs). A claim moves a job from one holding state to the other and takes no lock.
--
-- A limit lowered below what holds already (an operator's override, or one ending) parks
-- admitted jobs not yet claimed; jobs already running finish. A key with no row, or with no
-- limit, admits all. An admitted job keeps its slot until it runs or leaves `available`, in a
-- paused queue too: pausing a queue does not hand its slots to another queue's jobs.
ALTER TABLE jobs
    ADD COLUMN rate_limit_key text,
    ADD COLUMN rate_limited boolean NOT NULL DEFAULT false;

DROP INDEX jobs_claimable;
CREATE INDEX jobs_claimable ON jobs (queue, priority DESC, scheduled_at, id)
    WHERE state = 'available' AND NOT rate_limited;
-- A key's waiting jobs, in admission order (also the sweep's list of keys with waiting jobs).
CREATE INDEX jobs_rate_waiting ON jobs (rate_limit_key, priority DESC, scheduled_at, id)
    WHERE state = 'available' AND rate_limited;
-- A key's jobs holding a slot, counted under the key's lock. Unkeyed jobs have no entry.
CREATE INDEX jobs_rate_holding ON jobs (rate_limit_key)
    WHERE rate_limit_key IS NOT NULL AND state IN ('available', 'active') AND NOT rate_limited;

-- A key's limit: `concurrency` as the newest enqueue that named one set it (NULL: no limit),
-- and an operator's override (`PUT /ojs/v1/rate-limits/{key}`), until it expires.
CREATE TABLE rate_limit_keys (
    key                  text PRIMARY KEY,
    concurrency          integer CHECK (concurrency >= 0),
    override_concurrency integer CHECK (override_concurrency >= 0),
    override_expires_at  timestamptz,
    -- A handler said the resource behind the key refuses calls until then (a failure whose
    -- error carries `rate_limit_until`, ojs-rate-limiting §9): nothing is admitted meanwhile.
    held_until           timestamptz,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now()
);

-- `rate_limit.exceeded` (a statement parked jobs: one row per statement and key) and
-- `rate_limit.released` (a waiting job admitted: one row per job), written by the statements
-- that park and admit. Aged out with the completed jobs, like the other event logs.
CREATE TABLE rate_limit_events (
    id    bigserial PRIMARY KEY,
    at    timestamptz NOT NULL DEFAULT now(),
    key   text NOT NULL,
    type  text NOT NULL CHECK (type IN ('rate_limit.exceeded', 'rate_limit.released', 'rate_limit.dynamic_adjusted')),
    data  jsonb NOT NULL
);
CREATE INDEX rate_limit_events_at ON rate_limit_events (at);

-- The limit in force for a key row: none while a handler's hold lasts, else the override
-- while it lasts, else the enqueued one.
CREATE FUNCTION rebound_rate_limit_in_force(r rate_limit_keys) RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN r.held_until > now() THEN 0
                WHEN r.override_concurrency IS NOT NULL AND (r.override_expires_at IS NULL OR r.override_expires_at > now())
                THEN r.override_concurrency ELSE r.concurrency END
$$;

-- Brings key `k` to its limit: parks the lowest-priority admitted jobs not yet claimed while
-- more hold than the limit allows, or admits the highest-priority waiting ones while fewer
-- do. Rows another transaction holds are passed over (SKIP LOCKED): whoever holds one
-- settles the key again if it moves the job, and the maintenance sweep catches the rest.
-- Holding the key's row while waiting for no job row is what keeps this deadlock-free.
CREATE FUNCTION rebound_rate_limit_settle(k text) RETURNS void LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    lim integer;
    held bigint;
    moved bigint;
BEGIN
    SELECT rebound_rate_limit_in_force(r) INTO lim FROM rate_limit_keys r WHERE r.key = k FOR UPDATE;
    -- Counted after the lock, with this statement's fresh snapshot (VOLATILE): every other
    -- settling of the key has committed or not started. (READ COMMITTED, as every
    -- transaction of the store is: a REPEATABLE READ snapshot would not see them.)
    IF lim IS NOT NULL THEN
        SELECT count(*) INTO held FROM jobs
        WHERE rate_limit_key = k AND state IN ('available', 'active') AND NOT rate_limited;
    END IF;
    IF lim IS NOT NULL AND held > lim THEN
        WITH parked AS (
            UPDATE jobs SET rate_limited = true
            WHERE id = ANY(ARRAY(
                SELECT id FROM jobs
                WHERE rate_limit_key = k AND state = 'available' AND NOT rate_limited
                ORDER BY priority, scheduled_at DESC, id DESC
                LIMIT held - lim
                FOR UPDATE SKIP LOCKED))
            RETURNING id
        )
        SELECT count(*) INTO moved FROM parked;
        IF moved > 0 THEN
            INSERT INTO rate_limit_events (key, type, data)
            VALUES (k, 'rate_limit.exceeded', jsonb_build_object('key', k, 'strategy', 'concurrency', 'limit', lim,
                                                                 'current', held - moved, 'parked', moved));
        END IF;
    ELSIF lim IS NULL OR held < lim THEN
        WITH admitted AS (
            UPDATE jobs SET rate_limited = false
            WHERE id = ANY(ARRAY(
                SELECT id FROM jobs
                WHERE rate_limit_key = k AND state = 'available' AND rate_limited
                ORDER BY priority DESC, scheduled_at, id
                LIMIT CASE WHEN lim IS NULL THEN NULL ELSE lim - held END
                FOR UPDATE SKIP LOCKED))
            RETURNING id, queue, type
        ), logged AS (
            INSERT INTO rate_limit_events (key, type, data)
            SELECT k, 'rate_limit.released', jsonb_build_object('key', k, 'strategy', 'concurrency', 'job_id', a.id,
                                                                'queue', a.queue, 'job_type', a.type)
            FROM admitted a
        )
        -- Wakes the workers of the queues that got claimable work.
        SELECT count(*) INTO moved FROM (SELECT DISTINCT queue FROM admitted) q CROSS JOIN LATERAL (SELECT pg_notify('rebound_jobs', q.queue)) n;
    END IF;
END $$;

-- Ends the overrides and handlers' holds whose time is up and brings their keys to the limit
-- in force again (a raise that ended holds back what it admitted and no worker has claimed
-- yet; a hold that ended admits), all in one transaction, keys in order. Returns how many
-- keys changed. Run by the maintenance sweep.
CREATE FUNCTION rebound_rate_limit_end_overrides() RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    ended text[];
    k text;
BEGIN
    ended := ARRAY(SELECT key FROM rate_limit_keys WHERE override_expires_at <= now() OR held_until <= now() ORDER BY key FOR UPDATE);
    UPDATE rate_limit_keys
    SET override_concurrency = CASE WHEN override_expires_at <= now() THEN NULL ELSE override_concurrency END,
        override_expires_at = CASE WHEN override_expires_at <= now() THEN NULL ELSE override_expires_at END,
        held_until = CASE WHEN held_until <= now() THEN NULL ELSE held_until END,
        updated_at = now()
    WHERE key = ANY(ended);
    FOREACH k IN ARRAY ended LOOP
        PERFORM rebound_rate_limit_settle(k);
    END LOOP;
    RETURN cardinality(ended);
END $$;

-- The statement triggers: the keys whose holding changed, in key order (so two statements
-- settling the same keys take their rows in the same order). A statement with no keyed job
-- pays one pass over its transition table.
CREATE FUNCTION rebound_rate_limits_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    k text;
BEGIN
    -- Every keyed row, not only available ones: an enqueue may have lowered its key's limit.
    FOR k IN SELECT DISTINCT rate_limit_key FROM rl_new WHERE rate_limit_key IS NOT NULL ORDER BY 1 LOOP
        PERFORM rebound_rate_limit_settle(k);
    END LOOP;
    RETURN NULL;
END $$;

-- Dynamic limits (ojs-rate-limiting §9, RL-R003) are applied here too: a keyed job whose
-- failure this statement recorded with `rate_limit_until` in its error's details (an
-- upstream's 429 said when to come back; from the API's nack or a Rust handler's
-- `HandlerError`) holds its key until then, at most a day ahead: nothing more of the key is
-- admitted, admitted jobs not yet claimed are held back, and `rate_limit.dynamic_adjusted`
-- says so. In the same pass as the slots, so each key is locked once, in key order.
CREATE FUNCTION rebound_rate_limits_updated() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM rl_new WHERE rate_limit_key IS NOT NULL) THEN
        RETURN NULL;
    END IF;
    -- The keys of rows that took or gave up a slot, or entered `available` (a row parked
    -- before, cancelled and retried, comes back still marked waiting), or failed with a
    -- `rate_limit_until`. A claim (available to active) holds its slot throughout, and parking
    -- and admitting change no state: neither comes back here. A job leaving one non-holding
    -- state for another (pending to cancelled, say) takes no key lock.
    FOR r IN
        SELECT n.rate_limit_key AS key,
               -- (LEAST skips a NULL: with no time given it would hold the key for a day.)
               CASE WHEN max(rebound_rate_limit_until(n.last_error->'details')) FILTER (WHERE n.last_error IS DISTINCT FROM o.last_error) IS NOT NULL
                    THEN LEAST(max(rebound_rate_limit_until(n.last_error->'details')) FILTER (WHERE n.last_error IS DISTINCT FROM o.last_error),
                               now() + interval '1 day') END AS until,
               (array_agg(n.last_error->>'type') FILTER (WHERE n.last_error->'details' ? 'rate_limit_until'))[1] AS reason
        FROM rl_new n JOIN rl_old o ON o.id = n.id
        WHERE n.rate_limit_key IS NOT NULL
          AND ((n.state IS DISTINCT FROM o.state
                AND ((n.state = 'available' AND o.state <> 'active')
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
        PERFORM rebound_rate_limit_settle(r.key);
    END LOOP;
    RETURN NULL;
END $$;

CREATE FUNCTION rebound_rate_limits_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    k text;
BEGIN
    FOR k IN
        SELECT DISTINCT rate_limit_key FROM rl_old
        WHERE rate_limit_key IS NOT NULL AND state IN ('available', 'active') AND NOT rate_limited
        ORDER BY 1
    LOOP
        PERFORM rebound_rate_limit_settle(k);
    END LOOP;
    RETURN NULL;
END $$;

-- Named to fire after every other trigger on `jobs` (they fire in name order): a statement
-- that moves a workflow takes its workflow locks (…_workflow_lock_order.sql) before any key.
CREATE TRIGGER jobs_zz_rate_limits_inserted AFTER INSERT ON jobs
    REFERENCING NEW TABLE AS rl_new FOR EACH STATEMENT EXECUTE FUNCTION rebound_rate_limits_inserted();
CREATE TRIGGER jobs_zz_rate_limits_updated AFTER UPDATE ON jobs
    REFERENCING OLD TABLE AS rl_old NEW TABLE AS rl_new FOR EACH STATEMENT EXECUTE FUNCTION rebound_rate_limits_updated();
CREATE TRIGGER jobs_zz_rate_limits_deleted AFTER DELETE ON jobs
    REFERENCING OLD TABLE AS rl_old FOR EACH STATEMENT EXECUTE FUNCTION rebound_rate_limits_deleted();

-- A `rate_limit_until` as a time, or NULL for a value that is not one: a handler's odd value
-- must not fail the write that records its failure.
CREATE FUNCTION rebound_rate_limit_until(details jsonb) RETURNS timestamptz LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (details->>'rate_limit_until')::timestamptz;
EXCEPTION WHEN others THEN
    RETURN NULL;
END $$;

-- Emptying `jobs` empties its logs (as in …_dead_letter_events.sql), this one too.
CREATE OR REPLACE FUNCTION job_counts_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM job_count_deltas;
    DELETE FROM job_counts;
    DELETE FROM job_transitions;
    DELETE FROM job_heartbeats;
    DELETE FROM job_progress;
    DELETE FROM dead_letter_log;
    DELETE FROM rate_limit_events;
    RETURN NULL;
END $$;
