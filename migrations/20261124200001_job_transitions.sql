-- The log of finished jobs becomes the log of the transitions events are read from and the
-- job rows cannot tell afterwards: OJS events want a job's every start (`job.started`), its
-- scheduling at enqueue (`job.scheduled`) and its expiry (`job.expired`) as well.
--
-- Each statement appends one row per queue and transition naming its jobs, as before:
--   completed  completed_at = now()   (any writer)
--   cancelled  cancelled_at = now()
--   active     started_at = now()     (a claim: a batch of 500 is one row)
--   discarded  discarded_at = now() and the expirer's error type (failures that discard are
--              attempt rows already)
--   scheduled  inserted with a start in the future
-- A claim's rows are read as far as `last_error` now (to tell an expiry), which the trigger
-- does for rows in the four states only.
ALTER TABLE job_finishes RENAME TO job_transitions;
ALTER SEQUENCE job_finishes_id_seq RENAME TO job_transitions_id_seq;
ALTER INDEX job_finishes_pkey RENAME TO job_transitions_pkey;
ALTER INDEX job_finishes_at RENAME TO job_transitions_at;
ALTER INDEX job_finishes_queue_at RENAME TO job_transitions_queue_at;
-- Random UUIDs do not compress: a claim's array (8 KB at 500 jobs) goes out of line without
-- pglz trying first.
ALTER TABLE job_transitions ALTER COLUMN job_ids SET STORAGE EXTERNAL;
-- A start names the attempt of each job (in `job_ids`' order) and the claiming worker: the job
-- rows move on to later attempts.
ALTER TABLE job_transitions ADD COLUMN attempts int[], ADD COLUMN worker_id text;

CREATE OR REPLACE FUNCTION job_counts_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_count_deltas (queue, type, state, dead_letter, signature, n)
    SELECT queue, type, state, dead_letter, COALESCE(error_signature, ''), count(*) FROM counted_new GROUP BY 1, 2, 3, 4, 5;
    INSERT INTO job_transitions (queue, state, job_ids)
    SELECT queue, state, array_agg(id) FROM counted_new WHERE state = 'scheduled' GROUP BY queue, state;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION job_counts_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_count_deltas (queue, type, state, dead_letter, signature, n)
    SELECT queue, type, state, dead_letter, signature, sum(n) FROM (
        SELECT queue, type, state, dead_letter, COALESCE(error_signature, '') AS signature, 1 AS n FROM counted_new
        UNION ALL
        SELECT queue, type, state, dead_letter, COALESCE(error_signature, '') AS signature, -1 AS n FROM counted_old
    ) d GROUP BY 1, 2, 3, 4, 5 HAVING sum(n) <> 0;
    -- The state is checked on its own first (OFFSET 0 keeps the sub-select apart): a failure's
    -- rows are then read only as far as their state, not up to the time columns.
    INSERT INTO job_transitions (queue, state, job_ids, attempts, worker_id)
    SELECT queue, state, array_agg(id), CASE WHEN state = 'active' THEN array_agg(attempt) END,
           CASE WHEN state = 'active' THEN min(locked_by) END
    FROM (SELECT queue, state, id, attempt, locked_by, started_at, completed_at, cancelled_at, discarded_at, last_error FROM counted_new
          WHERE state IN ('active', 'completed', 'cancelled', 'discarded') OFFSET 0) f
    WHERE (state = 'active' AND started_at = now())
       OR (state = 'completed' AND completed_at = now())
       OR (state = 'cancelled' AND cancelled_at = now())
       OR (state = 'discarded' AND discarded_at = now() AND last_error->>'type' = 'rebound.expired')
    GROUP BY queue, state;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION job_counts_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM job_count_deltas;
    DELETE FROM job_counts;
    DELETE FROM job_transitions;
    RETURN NULL;
END $$;
