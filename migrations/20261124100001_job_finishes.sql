-- `GET /ojs/v1/events` read completions and cancellations by sorting every completed (or
-- cancelled) job by the time it finished: no index orders jobs by that time, so each poll was a
-- sequential scan of the table (3.4 s at 10M jobs). An index on `completed_at` would add an
-- entry to every completion, the hot path's last write; a BRIN minmax-multi one, the cheapest
-- kind, measured 59 -> 69 µs of Postgres CPU per worked job once its ranges were summarised.
--
-- Instead, each statement that finishes jobs appends one row per queue naming the jobs it
-- completed or cancelled: a completer batch of 500 is one row. A statement-level trigger does
-- it, so every writer is logged alike (a hand edit too, if it stamps the
-- time as they do). Events read it newest first; the pruner ages it out with the jobs.
CREATE TABLE job_finishes (
    id      bigserial PRIMARY KEY,
    at      timestamptz NOT NULL DEFAULT now(),
    queue   text NOT NULL,
    -- 'completed' or 'cancelled'.
    state   job_state NOT NULL,
    job_ids uuid[] NOT NULL
);
CREATE INDEX job_finishes_at ON job_finishes (state, at DESC);
CREATE INDEX job_finishes_queue_at ON job_finishes (queue, state, at DESC);

-- The counters' update trigger, which already reads every statement's changed rows, appends
-- the log (a second trigger of its own measured several µs of Postgres CPU per job more; as it
-- is, the fail path measured 0-13 µs per job more, about 4 %, in alternating runs, and the
-- complete path nothing the noise would show).
-- A job that became completed (or cancelled) in this transaction carries its `now()`: every
-- writer stamps `completed_at` / `cancelled_at` with it, and a later edit of a finished job
-- leaves the older stamp. Telling the same by joining the old rows to the new was a nested
-- loop over the transition tables (the plan is made once per session, for the first, small,
-- statement): 30 µs of Postgres CPU per completed job.
CREATE OR REPLACE FUNCTION job_counts_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_count_deltas (queue, type, state, dead_letter, signature, n)
    SELECT queue, type, state, dead_letter, signature, sum(n) FROM (
        SELECT queue, type, state, dead_letter, COALESCE(error_signature, '') AS signature, 1 AS n FROM counted_new
        UNION ALL
        SELECT queue, type, state, dead_letter, COALESCE(error_signature, '') AS signature, -1 AS n FROM counted_old
    ) d GROUP BY 1, 2, 3, 4, 5 HAVING sum(n) <> 0;
    -- The state is checked on its own first (OFFSET 0 keeps the sub-select apart): a claim's or
    -- a failure's rows are then read only as far as their state, not up to the time columns.
    INSERT INTO job_finishes (queue, state, job_ids)
    SELECT queue, state, array_agg(id)
    FROM (SELECT queue, state, id, completed_at, cancelled_at FROM counted_new
          WHERE state IN ('completed', 'cancelled') OFFSET 0) f
    WHERE (state = 'completed' AND completed_at = now()) OR (state = 'cancelled' AND cancelled_at = now())
    GROUP BY queue, state;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION job_counts_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM job_count_deltas;
    DELETE FROM job_counts;
    DELETE FROM job_finishes;
    RETURN NULL;
END $$;

-- The last day's finishes, so events do not start empty after the upgrade (one row per queue
-- and finishing time: jobs finished by one statement share it).
INSERT INTO job_finishes (at, queue, state, job_ids)
SELECT at, queue, state, array_agg(id ORDER BY id)
FROM (
    SELECT completed_at AS at, queue, state, id FROM jobs
    WHERE state = 'completed' AND completed_at >= now() - interval '1 day'
    UNION ALL
    SELECT cancelled_at, queue, state, id FROM jobs
    WHERE state = 'cancelled' AND cancelled_at >= now() - interval '1 day'
) f
GROUP BY at, queue, state
ORDER BY at;
