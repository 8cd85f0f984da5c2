-- An execution cancelled while it ran (by an operator, a bulk cancel, a cron's
-- cancel_previous, or by hand) left no trace in the job's history: a retried job then showed
-- only its later executions, and one job's events lost that execution's start and heartbeats.
-- It is now a `cancelled` row of `job_attempts`, written where every cancellation passes: the
-- statement trigger that logs transitions. Statements that cancel nothing running (every
-- completion among them) pay one look over their own new rows.
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
    IF EXISTS (SELECT 1 FROM counted_new WHERE state = 'cancelled') THEN
        INSERT INTO job_attempts (job_id, attempt, worker_id, started_at, outcome, error_message)
        SELECT o.id, o.attempt, o.locked_by, o.started_at, 'cancelled', 'cancelled while it ran; its result, if it comes, is refused'
        FROM counted_old o JOIN counted_new n ON n.id = o.id
        WHERE o.state = 'active' AND n.state = 'cancelled';
    END IF;
    RETURN NULL;
END $$;
