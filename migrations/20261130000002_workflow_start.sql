-- A workflow is created with every member `pending` and started here, as a nested workflow
-- always was: which members start a workflow (a chain's first step, every job of a group or
-- batch, a graph's steps without dependencies) is decided by `rebound_workflow_start` alone.
-- An outermost workflow's first members are owed no results (`results` null): their envelopes
-- carry no `parent_results`, as before. The queues that got work are notified once each,
-- not once per job (a group of 10 000 started at its creation), and members made `scheduled`
-- are logged as such (`job.scheduled`), as when they were inserted scheduled.
CREATE OR REPLACE FUNCTION rebound_workflow_release(wf uuid, steps integer[], results jsonb) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    q text;
    queues text[];
    nested uuid;
BEGIN
    FOR nested IN
        SELECT c.id FROM jobs j JOIN workflows c ON c.parent_job = j.id
        WHERE j.workflow_id = wf AND j.workflow_step = ANY(steps) AND j.state = 'pending'
        ORDER BY j.workflow_step
    LOOP
        PERFORM rebound_workflow_start(nested, results);
    END LOOP;
    WITH released AS (
        UPDATE jobs
        SET state = CASE WHEN scheduled_at > now() THEN 'scheduled'::job_state ELSE 'available'::job_state END,
            enqueued_at = CASE WHEN scheduled_at > now() THEN NULL ELSE now() END,
            extra = CASE WHEN results IS NULL THEN extra ELSE extra || jsonb_build_object('parent_results', results) END,
            updated_at = now()
        WHERE workflow_id = wf AND workflow_step = ANY(steps) AND state = 'pending'
          AND NOT EXISTS (SELECT 1 FROM workflows c WHERE c.parent_job = jobs.id)
        RETURNING id, queue, state
    ), logged AS (
        -- `job.scheduled` events, as an insert of scheduled jobs logs them (see
        -- migrations/…_job_transitions.sql): a workflow's first members' at its creation, a
        -- later step's when the workflow gets to it.
        INSERT INTO job_transitions (queue, state, job_ids)
        SELECT queue, 'scheduled', array_agg(id) FROM released WHERE state = 'scheduled' GROUP BY queue
    )
    SELECT array_agg(DISTINCT queue) INTO queues FROM released WHERE state = 'available';
    FOREACH q IN ARRAY COALESCE(queues, '{}') LOOP
        PERFORM pg_notify('rebound_jobs', q);
    END LOOP;
END $$;

-- Only the moves `rebound_workflow_job_moved` acts on (a claim, an end) are handed to it: a
-- workflow's start makes all its first members available in one statement, and each used to
-- lock the workflow's ancestors for nothing (ten thousand times for a group that size). The
-- rest as in migrations/…_workflow_lock_order.sql.
CREATE OR REPLACE FUNCTION rebound_workflows_moved() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM moved_new WHERE workflow_id IS NOT NULL) THEN
        RETURN NULL;
    END IF;
    FOR r IN
        SELECT ROW(n.id, n.state, n.attempt, n.workflow_id, n.workflow_step, n.last_error, n.type, n.started_at, n.completed_at)::rebound_workflow_move AS j,
               o.state AS old_state
        FROM moved_new n JOIN moved_old o ON o.id = n.id
        WHERE n.workflow_id IS NOT NULL AND n.state IS DISTINCT FROM o.state
          AND n.state IN ('active', 'completed', 'discarded', 'cancelled')
        ORDER BY n.workflow_id, n.workflow_step
    LOOP
        IF (r.j).state <> 'active' THEN
            PERFORM rebound_workflow_lock_ancestors((r.j).workflow_id);
        END IF;
        PERFORM rebound_workflow_job_moved(r.j, r.old_state);
    END LOOP;
    RETURN NULL;
END $$;
