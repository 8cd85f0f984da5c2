-- Workflows as general dependency graphs (ojs-http-binding.md §14.1: `steps` with `id` and
-- `depends_on`, as the Python SDK sends them). A graph that is a chain, a group or a batch is
-- still stored as one; any other acyclic graph is a `graph`:
--   * a step whose dependencies have all completed starts, with the results of everything
--     upstream of it (`parent_results`, an object by step id);
--   * a step that fails for good skips everything downstream of it (cancelled unrun, with
--     `last_error` type `rebound.upstream_failed` naming the step), while the branches that
--     do not depend on it go on, as a group's jobs do;
--   * the graph finishes when every step has completed, failed or been skipped: `completed` if
--     all completed, `failed` otherwise.
-- As for the other kinds, the trigger on the jobs' state does all of it inside the statement
-- that finished the step.
ALTER TABLE workflows DROP CONSTRAINT workflows_type_check;
ALTER TABLE workflows ADD CONSTRAINT workflows_type_check CHECK (type IN ('chain', 'group', 'batch', 'graph'));
-- Steps a failure upstream cancelled: with the completed and failed ones, they tell when a
-- graph is done without reading its jobs.
ALTER TABLE workflows ADD COLUMN skipped_count integer NOT NULL DEFAULT 0;

-- A graph's steps (chains, groups and batches have none: their shape is their type). Both
-- directions are kept so that a finish reads its own row for what may start next, and each of
-- those rows for what it waits on: no walk over the whole graph per finish.
CREATE TABLE workflow_steps (
    workflow_id uuid NOT NULL REFERENCES workflows (id) ON DELETE CASCADE,
    step        integer NOT NULL,
    -- The client's step id, unique within the workflow.
    name        text NOT NULL,
    depends_on  integer[] NOT NULL,
    dependents  integer[] NOT NULL,
    PRIMARY KEY (workflow_id, step)
);

-- A member's id as the API and the events name it: a graph step's own, else `step-N` or the
-- callback's name.
CREATE FUNCTION rebound_workflow_step_name(wf uuid, member integer) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT COALESCE((SELECT name FROM workflow_steps WHERE workflow_id = wf AND step = member), rebound_workflow_step_id(member))
$$;

-- The results of every step upstream of `member` (its dependencies, theirs, …), by step id:
-- all of them completed, or it would not be starting.
CREATE FUNCTION rebound_workflow_upstream_results(wf uuid, member integer) RETURNS jsonb LANGUAGE sql STABLE AS $$
    WITH RECURSIVE up(step) AS (
        SELECT unnest(depends_on) FROM workflow_steps WHERE workflow_id = wf AND step = member
        UNION
        SELECT unnest(s.depends_on) FROM workflow_steps s JOIN up ON s.workflow_id = wf AND s.step = up.step
    )
    SELECT COALESCE(jsonb_object_agg(s.name, COALESCE(j.result, 'null'::jsonb)), '{}'::jsonb)
    FROM up
    JOIN workflow_steps s ON s.workflow_id = wf AND s.step = up.step
    JOIN jobs j ON j.workflow_id = wf AND j.workflow_step = up.step
$$;

-- A graph's step finished (completed, or failed for good). The caller holds the workflow's row
-- lock, so concurrent finishes of two dependencies of one step take turns, and the second sees
-- the first: the step starts once.
CREATE FUNCTION rebound_workflow_graph_moved(w workflows, j rebound_workflow_move, failed boolean, error jsonb) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    skipped integer := 0;
    completed integer;
    failures integer;
    done boolean;
    ready integer;
BEGIN
    -- Failed for good and then re-driven by hand (a dead letter retried): counted already. Its
    -- dependents stay skipped, as a failed chain stays failed.
    IF w.errors @> jsonb_build_array(jsonb_build_object('job_id', j.id)) THEN
        IF NOT failed THEN
            UPDATE workflows
            SET failed_count = failed_count - 1, completed_count = completed_count + 1,
                errors = (SELECT COALESCE(jsonb_agg(e), '[]'::jsonb) FROM jsonb_array_elements(errors) e WHERE e->>'job_id' <> j.id::text)
            WHERE id = w.id;
        END IF;
        RETURN;
    END IF;
    IF failed THEN
        -- Everything downstream can never run. Their cancellation comes back through the
        -- trigger, which passes over them by their error type.
        WITH RECURSIVE down(step) AS (
            SELECT unnest(dependents) FROM workflow_steps WHERE workflow_id = w.id AND step = j.workflow_step
            UNION
            SELECT unnest(s.dependents) FROM workflow_steps s JOIN down ON s.workflow_id = w.id AND s.step = down.step
        )
        UPDATE jobs
        SET state = 'cancelled', cancelled_at = now(), updated_at = now(),
            last_error = jsonb_build_object('type', 'rebound.upstream_failed',
                'message', format('step %s failed', rebound_workflow_step_name(w.id, j.workflow_step)))
        WHERE workflow_id = w.id AND workflow_step IN (SELECT step FROM down) AND state = 'pending';
        GET DIAGNOSTICS skipped = ROW_COUNT;
    END IF;
    completed := w.completed_count + CASE WHEN failed THEN 0 ELSE 1 END;
    failures := w.failed_count + CASE WHEN failed THEN 1 ELSE 0 END;
    done := completed + failures + w.skipped_count + skipped >= w.job_count;
    UPDATE workflows
    SET completed_count = completed, failed_count = failures, skipped_count = skipped_count + skipped,
        errors = CASE WHEN failed THEN errors || jsonb_build_array(error) ELSE errors END,
        state = CASE WHEN NOT done THEN state WHEN completed >= job_count THEN 'completed' ELSE 'failed' END,
        finished_at = CASE WHEN done THEN now() END
    WHERE id = w.id;
    IF NOT failed THEN
        -- Its dependents whose every dependency has now completed.
        FOR ready IN
            SELECT d FROM workflow_steps s CROSS JOIN LATERAL unnest(s.dependents) AS d
            WHERE s.workflow_id = w.id AND s.step = j.workflow_step
              AND NOT EXISTS (
                  SELECT 1 FROM workflow_steps t JOIN jobs p ON p.workflow_id = w.id AND p.workflow_step = ANY(t.depends_on)
                  WHERE t.workflow_id = w.id AND t.step = d AND p.state <> 'completed')
            ORDER BY d
        LOOP
            PERFORM rebound_workflow_release(w.id, ARRAY[ready], rebound_workflow_upstream_results(w.id, ready));
        END LOOP;
    END IF;
END $$;

CREATE OR REPLACE FUNCTION rebound_workflow_job_moved(j rebound_workflow_move, old_state job_state) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    w workflows%ROWTYPE;
    failed boolean := j.state IN ('discarded', 'cancelled');
    error jsonb;
    was_failed boolean;
    members_done boolean;
    fire integer[];
BEGIN
    IF j.state = 'active' THEN
        UPDATE workflows SET started_at = now() WHERE id = j.workflow_id AND started_at IS NULL;
        RETURN;
    END IF;
    -- A callback that does not apply is cancelled unrun: that is no failure. Nor is a graph's
    -- step skipped because one upstream of it failed (counted by the failure).
    IF NOT (j.state = 'completed' OR failed) OR (j.workflow_step < 0 AND old_state = 'pending')
       OR (j.state = 'cancelled' AND old_state = 'pending' AND j.last_error->>'type' = 'rebound.upstream_failed') THEN
        RETURN;
    END IF;
    -- Concurrent finishes of one workflow's jobs take turns here, so each sees the others'
    -- counts: the last one is the one that fires what follows, exactly once.
    SELECT * INTO w FROM workflows WHERE id = j.workflow_id FOR UPDATE;
    IF NOT FOUND OR w.state IN ('completed', 'failed', 'cancelled') THEN
        RETURN;
    END IF;
    IF NOT failed THEN
        INSERT INTO workflow_events (workflow_id, type, data)
        VALUES (w.id, 'workflow.step_completed', jsonb_build_object(
            'workflow_id', w.id, 'workflow_name', COALESCE(w.name, ''),
            'step_id', rebound_workflow_step_name(w.id, j.workflow_step),
            'step_type', j.type, 'job_id', j.id,
            'duration_ms', COALESCE((EXTRACT(EPOCH FROM (j.completed_at - j.started_at)) * 1000)::bigint, 0),
            'steps_remaining', CASE WHEN j.workflow_step < 0 THEN GREATEST(w.callbacks_running - 1, 0)
                                    ELSE GREATEST(w.job_count - w.completed_count - w.failed_count - w.skipped_count - 1, 0) END));
    END IF;
    IF failed THEN
        error := jsonb_build_object(
            'job_id', j.id, 'attempt', j.attempt,
            'role', rebound_workflow_role(j.workflow_step),
            'code', CASE WHEN j.state = 'cancelled' THEN 'cancelled' ELSE COALESCE(j.last_error->>'type', 'failed') END,
            'message', CASE WHEN j.state = 'cancelled' THEN 'the job was cancelled' ELSE COALESCE(j.last_error->>'message', '') END);
    END IF;

    IF w.type = 'graph' THEN
        PERFORM rebound_workflow_graph_moved(w, j, failed, error);
        RETURN;
    END IF;

    IF j.workflow_step < 0 THEN
        -- A batch's callback: the batch is done when its callbacks are, failed if one failed.
        UPDATE workflows
        SET callbacks_running = callbacks_running - 1,
            errors = CASE WHEN failed THEN errors || jsonb_build_array(error) ELSE errors END,
            state = CASE WHEN failed THEN 'failed' WHEN callbacks_running > 1 THEN state ELSE 'completed' END,
            finished_at = CASE WHEN failed OR callbacks_running <= 1 THEN now() END
        WHERE id = w.id;
        IF failed THEN
            UPDATE jobs SET state = 'cancelled', cancelled_at = now(), updated_at = now()
            WHERE workflow_id = w.id AND state = 'pending';
        END IF;
        RETURN;
    END IF;

    IF w.type = 'chain' THEN
        IF failed THEN
            UPDATE workflows
            SET failed_count = failed_count + 1, failed_step_index = j.workflow_step,
                errors = errors || jsonb_build_array(error), state = 'failed', finished_at = now()
            WHERE id = w.id;
            -- The steps after it never run.
            UPDATE jobs SET state = 'cancelled', cancelled_at = now(), updated_at = now()
            WHERE workflow_id = w.id AND state = 'pending';
        ELSIF j.workflow_step + 1 >= w.job_count THEN
            UPDATE workflows SET completed_count = completed_count + 1, state = 'completed', finished_at = now() WHERE id = w.id;
        ELSE
            UPDATE workflows SET completed_count = completed_count + 1 WHERE id = w.id;
            PERFORM rebound_workflow_release(w.id, ARRAY[j.workflow_step + 1],
                                             rebound_workflow_results(w.id, j.workflow_step + 1));
        END IF;
        RETURN;
    END IF;

    -- A group's or a batch's job. One that failed for good and was then re-driven by hand
    -- (a dead letter retried) was counted already: it moves from failed to completed, or
    -- stays failed, and finishes nothing.
    was_failed := w.errors @> jsonb_build_array(jsonb_build_object('job_id', j.id));
    IF was_failed THEN
        IF NOT failed THEN
            UPDATE workflows
            SET failed_count = failed_count - 1, completed_count = completed_count + 1,
                errors = (SELECT COALESCE(jsonb_agg(e), '[]'::jsonb) FROM jsonb_array_elements(errors) e WHERE e->>'job_id' <> j.id::text)
            WHERE id = w.id;
        END IF;
        RETURN;
    END IF;
    members_done := w.completed_count + w.failed_count + 1 >= w.job_count;
    IF members_done AND w.type = 'batch' THEN
        -- on_complete always; on_success when nothing failed; on_failure when anything did.
        SELECT array_agg(workflow_step) INTO fire FROM jobs
        WHERE workflow_id = w.id AND state = 'pending'
          AND workflow_step = ANY(ARRAY[-1, CASE WHEN failed OR w.failed_count > 0 THEN -3 ELSE -2 END]);
    END IF;
    UPDATE workflows
    SET completed_count = completed_count + CASE WHEN failed THEN 0 ELSE 1 END,
        failed_count = failed_count + CASE WHEN failed THEN 1 ELSE 0 END,
        errors = CASE WHEN failed THEN errors || jsonb_build_array(error) ELSE errors END,
        callbacks_running = COALESCE(cardinality(fire), 0),
        state = CASE WHEN NOT members_done OR COALESCE(cardinality(fire), 0) > 0 THEN state
                     WHEN failed OR failed_count > 0 THEN 'failed'
                     ELSE 'completed' END,
        finished_at = CASE WHEN members_done AND COALESCE(cardinality(fire), 0) = 0 THEN now() END
    WHERE id = w.id;
    IF members_done AND w.type = 'batch' THEN
        IF COALESCE(cardinality(fire), 0) > 0 THEN
            PERFORM rebound_workflow_release(w.id, fire, rebound_workflow_results(w.id, 2147483647));
        END IF;
        -- The callbacks that do not apply never run.
        UPDATE jobs SET state = 'cancelled', cancelled_at = now(), updated_at = now()
        WHERE workflow_id = w.id AND state = 'pending';
    END IF;
    RETURN;
END $$;

-- workflow.failed names the failed step by its graph id too.
CREATE OR REPLACE FUNCTION workflow_events_logged() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    failure jsonb := NEW.errors -> -1;
BEGIN
    IF NEW.started_at IS NOT NULL AND OLD.started_at IS NULL THEN
        INSERT INTO workflow_events (workflow_id, type, data)
        VALUES (NEW.id, 'workflow.started', jsonb_build_object('workflow_id', NEW.id, 'workflow_name', COALESCE(NEW.name, ''),
                'workflow_type', NEW.type, 'total_steps', NEW.job_count));
    END IF;
    IF NEW.state = 'completed' AND OLD.state <> 'completed' THEN
        INSERT INTO workflow_events (workflow_id, type, data)
        VALUES (NEW.id, 'workflow.completed', jsonb_build_object('workflow_id', NEW.id, 'workflow_name', COALESCE(NEW.name, ''),
                'total_steps', NEW.job_count, 'duration_ms', (EXTRACT(EPOCH FROM (now() - NEW.created_at)) * 1000)::bigint));
    ELSIF NEW.state = 'failed' AND OLD.state <> 'failed' THEN
        INSERT INTO workflow_events (workflow_id, type, data)
        SELECT NEW.id, 'workflow.failed', jsonb_build_object('workflow_id', NEW.id, 'workflow_name', COALESCE(NEW.name, ''),
                'failed_step_id', CASE WHEN failure->>'role' = 'job' THEN rebound_workflow_step_name(NEW.id, j.workflow_step) ELSE failure->>'role' END,
                'failed_step_type', j.type, 'failed_job_id', failure->'job_id',
                'error', jsonb_build_object('code', failure->>'code', 'message', failure->>'message'))
        FROM (SELECT NULL) AS one LEFT JOIN jobs j ON j.id = (failure->>'job_id')::uuid;
    END IF;
    RETURN NULL;
END $$;
