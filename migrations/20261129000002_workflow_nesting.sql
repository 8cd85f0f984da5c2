-- Nested workflows (ojs-workflows.md §10): a chain's step, or a group's or batch's job, may be a
-- workflow itself, down to three levels.
--
-- A nested workflow is a workflow row of its own (`parent_id`), tracked independently, and it
-- stands in its parent as a job (`parent_job`): a `pending` job that no worker claims, which
-- the nested workflow's end finishes (`completed` with its results as an array by index,
-- `discarded` naming its failure, or `cancelled`). Everything that moves a parent therefore
-- works on it unchanged (a chain's next step, a group's counts, a batch's callbacks, a graph's
-- dependents), in the same transaction as the job that finished the nested workflow. Releasing
-- that standing job starts the nested workflow instead (`pending` -> `running`, its first jobs
-- given the parent's results); cancelling or skipping it cancels the nested workflow.
ALTER TABLE workflows
    ADD COLUMN parent_id uuid REFERENCES workflows (id) ON DELETE CASCADE,
    ADD COLUMN parent_job uuid;
CREATE INDEX workflows_parent ON workflows (parent_id) WHERE parent_id IS NOT NULL;
CREATE UNIQUE INDEX workflows_parent_job ON workflows (parent_job) WHERE parent_job IS NOT NULL;

-- Starts a nested workflow that was waiting: its first members (a chain's first step, every
-- job of a group or batch, a graph's steps without dependencies) are released with `results`.
CREATE FUNCTION rebound_workflow_start(wf uuid, results jsonb) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    kind text;
    initial integer[];
BEGIN
    UPDATE workflows SET state = 'running' WHERE id = wf AND state = 'pending' RETURNING type INTO kind;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT array_agg(j.workflow_step) INTO initial FROM jobs j
    WHERE j.workflow_id = wf AND j.state = 'pending' AND j.workflow_step >= 0
      AND CASE kind
              WHEN 'chain' THEN j.workflow_step = 0
              WHEN 'graph' THEN NOT EXISTS (SELECT 1 FROM workflow_steps s
                                            WHERE s.workflow_id = wf AND s.step = j.workflow_step AND cardinality(s.depends_on) > 0)
              ELSE true
          END;
    PERFORM rebound_workflow_release(wf, initial, results);
END $$;

-- Hands waiting members of a workflow on, with the results they are owed: jobs to the workers,
-- nested workflows started (their standing jobs wait on for them).
CREATE OR REPLACE FUNCTION rebound_workflow_release(wf uuid, steps integer[], results jsonb) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    q text;
    nested uuid;
BEGIN
    FOR nested IN
        SELECT c.id FROM jobs j JOIN workflows c ON c.parent_job = j.id
        WHERE j.workflow_id = wf AND j.workflow_step = ANY(steps) AND j.state = 'pending'
        ORDER BY j.workflow_step
    LOOP
        PERFORM rebound_workflow_start(nested, results);
    END LOOP;
    FOR q IN
        UPDATE jobs
        SET state = CASE WHEN scheduled_at > now() THEN 'scheduled'::job_state ELSE 'available'::job_state END,
            enqueued_at = CASE WHEN scheduled_at > now() THEN NULL ELSE now() END,
            extra = extra || jsonb_build_object('parent_results', results),
            updated_at = now()
        WHERE workflow_id = wf AND workflow_step = ANY(steps) AND state = 'pending'
          AND NOT EXISTS (SELECT 1 FROM workflows c WHERE c.parent_job = jobs.id)
        RETURNING queue
    LOOP
        PERFORM pg_notify('rebound_jobs', q);
    END LOOP;
END $$;

-- Cancels the workflow a standing job stands for, if it has not finished, and what of it has
-- not run (its own standing jobs carry it further down).
CREATE FUNCTION rebound_workflow_cancel_nested(standing uuid) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    nested uuid;
BEGIN
    FOR nested IN
        UPDATE workflows SET state = 'cancelled', cancelled_at = now(), finished_at = now()
        WHERE parent_job = standing AND state IN ('pending', 'running')
        RETURNING id
    LOOP
        UPDATE jobs SET state = 'cancelled', cancelled_at = now(), locked_by = NULL, lock_expires_at = NULL, updated_at = now()
        WHERE workflow_id = nested AND state IN ('pending', 'scheduled', 'available', 'retryable');
    END LOOP;
END $$;

-- A nested workflow's end finishes the job standing for it, which moves the parent on.
CREATE FUNCTION rebound_workflow_nested_finished() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    failure jsonb := NEW.errors -> -1;
BEGIN
    UPDATE jobs
    SET state = CASE NEW.state WHEN 'completed' THEN 'completed'::job_state WHEN 'failed' THEN 'discarded'::job_state ELSE 'cancelled'::job_state END,
        started_at = NEW.started_at,
        completed_at = CASE WHEN NEW.state = 'completed' THEN now() END,
        discarded_at = CASE WHEN NEW.state = 'failed' THEN now() END,
        cancelled_at = CASE WHEN NEW.state = 'cancelled' THEN now() END,
        result = CASE WHEN NEW.state = 'completed' THEN rebound_workflow_results(NEW.id, 2147483647) END,
        last_error = CASE WHEN NEW.state = 'failed' THEN jsonb_build_object(
            'type', 'rebound.workflow_failed',
            'message', format('the nested %s %s failed: %s', NEW.type, COALESCE(NEW.name, NEW.id::text),
                              COALESCE(NULLIF(failure->>'message', ''), failure->>'code', 'a job failed'))) END,
        updated_at = now()
    WHERE id = NEW.parent_job AND state = 'pending';
    RETURN NULL;
END $$;

CREATE TRIGGER workflows_nested_finished AFTER UPDATE OF state ON workflows FOR EACH ROW
    WHEN (NEW.parent_job IS NOT NULL AND NEW.state IN ('completed', 'failed', 'cancelled') AND OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION rebound_workflow_nested_finished();

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
        -- A job's first claim starts its workflow and every workflow it is nested in.
        WITH RECURSIVE up(id) AS (
            SELECT j.workflow_id
            UNION
            SELECT p.parent_id FROM workflows p JOIN up ON p.id = up.id WHERE p.parent_id IS NOT NULL
        )
        UPDATE workflows SET started_at = now() WHERE id IN (SELECT id FROM up) AND started_at IS NULL;
        RETURN;
    END IF;
    -- A job standing for a nested workflow that is cancelled, skipped or discarded by hand
    -- takes the nested workflow with it (one that finished already is left as it is).
    IF failed THEN
        PERFORM rebound_workflow_cancel_nested(j.id);
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

-- A standing job deleted takes its nested workflow with it, as a deleted job fails its own.
CREATE OR REPLACE FUNCTION rebound_workflow_job_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM rebound_workflow_cancel_nested(OLD.id);
    UPDATE workflows
    SET state = 'failed', finished_at = now(), failed_count = failed_count + 1,
        errors = errors || jsonb_build_array(jsonb_build_object(
            'job_id', OLD.id, 'attempt', OLD.attempt,
            'role', rebound_workflow_role(OLD.workflow_step),
            'code', 'deleted', 'message', 'the job was deleted before it finished'))
    WHERE id = OLD.workflow_id AND state IN ('pending', 'running');
    IF FOUND THEN
        UPDATE jobs SET state = 'cancelled', cancelled_at = now(), updated_at = now()
        WHERE workflow_id = OLD.workflow_id AND state = 'pending';
    END IF;
    RETURN NULL;
END $$;
