-- OJS workflows (ojs-workflows.md): chains, groups and batches of jobs.
--
-- Every job of a workflow is inserted when the workflow is created, so each is validated and
-- given its defaults once, by the ordinary enqueue: the chain's later steps and the batch's
-- callbacks wait in `pending` (the OJS step state `waiting`), which nothing claims. What moves a
-- workflow on is a row trigger on its jobs' state, in the transaction of the write that
-- finished the job: a chain's next step is activated, with the results before it, by the very
-- statement that completed the step, so a crash or a lost connection can never complete a
-- step without starting the next (or start it twice).
CREATE TABLE workflows (
    id               uuid PRIMARY KEY,
    type             text NOT NULL CHECK (type IN ('chain', 'group', 'batch')),
    name             text,
    -- `running` from its creation, which enqueues its first jobs (ojs-workflows.md §8.1:
    -- running while a job is enqueued or active); `pending` is never used.
    state            text NOT NULL DEFAULT 'running'
                     CHECK (state IN ('pending', 'running', 'completed', 'failed', 'cancelled')),
    -- Steps of a chain, or jobs of a group or batch; callbacks are not counted.
    job_count        integer NOT NULL CHECK (job_count > 0),
    completed_count  integer NOT NULL DEFAULT 0,
    failed_count     integer NOT NULL DEFAULT 0,
    -- A batch's callbacks activated and not yet finished.
    callbacks_running integer NOT NULL DEFAULT 0,
    failed_step_index integer,
    -- {job_id, code, message, attempt, role} of every job that failed for good.
    errors           jsonb NOT NULL DEFAULT '[]',
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    cancelled_at     timestamptz
);
-- The dashboard's list, newest first (ids are UUIDv7), all or by state.
CREATE INDEX workflows_state ON workflows (state, id DESC);
-- The pruner's: finished workflows by age.
CREATE INDEX workflows_finished ON workflows (finished_at) WHERE finished_at IS NOT NULL;

-- A job's place in its workflow: its step (chain) or index (group, batch), from 0; a batch's
-- callbacks are -1 on_complete, -2 on_success, -3 on_failure.
ALTER TABLE jobs ADD COLUMN workflow_id uuid, ADD COLUMN workflow_step integer;
CREATE INDEX jobs_workflow ON jobs (workflow_id, workflow_step) WHERE workflow_id IS NOT NULL;

-- A workflow job's step id as the API and the events name it: `step-N`, or the callback's name.
CREATE FUNCTION rebound_workflow_step_id(step integer) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE step WHEN -1 THEN 'on_complete' WHEN -2 THEN 'on_success' WHEN -3 THEN 'on_failure' ELSE 'step-' || step END
$$;
-- Its role in an error entry: `job` for a step or job, else the callback's name.
CREATE FUNCTION rebound_workflow_role(step integer) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN step >= 0 THEN 'job' ELSE rebound_workflow_step_id(step) END
$$;

-- The results of the workflow's members before `below`, as an array by index (`parent_results`,
-- ojs-workflows.md §7: "keyed by the step's index"; an array, as the reference backend sends
-- it, so `parent_results[0]` reads the first in every language): every step before a chain's
-- next, or every job of a batch for its callbacks, null where a job did not complete.
CREATE FUNCTION rebound_workflow_results(wf uuid, below integer) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT COALESCE(jsonb_agg(CASE WHEN state = 'completed' THEN COALESCE(result, 'null'::jsonb) ELSE 'null'::jsonb END
                              ORDER BY workflow_step), '[]'::jsonb)
    FROM jobs WHERE workflow_id = wf AND workflow_step >= 0 AND workflow_step < below
$$;

-- Hands waiting jobs of a workflow to the workers, with the results they are owed.
CREATE FUNCTION rebound_workflow_release(wf uuid, steps integer[], results jsonb) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    q text;
BEGIN
    FOR q IN
        UPDATE jobs
        SET state = CASE WHEN scheduled_at > now() THEN 'scheduled'::job_state ELSE 'available'::job_state END,
            enqueued_at = CASE WHEN scheduled_at > now() THEN NULL ELSE now() END,
            extra = extra || jsonb_build_object('parent_results', results),
            updated_at = now()
        WHERE workflow_id = wf AND workflow_step = ANY(steps) AND state = 'pending'
        RETURNING queue
    LOOP
        PERFORM pg_notify('rebound_jobs', q);
    END LOOP;
END $$;

-- OJS workflow events (ojs-events.md: workflow.started, .step_completed, .completed, .failed),
-- written in the transactions that made them happen: a step's completion by the statement
-- that completed it, the workflow's start and end by a trigger on its row.
CREATE TABLE workflow_events (
    id          bigserial PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    workflow_id uuid NOT NULL,
    type        text NOT NULL CHECK (type IN ('workflow.started', 'workflow.step_completed', 'workflow.completed', 'workflow.failed')),
    data        jsonb NOT NULL
);
CREATE INDEX workflow_events_at ON workflow_events (at);

CREATE FUNCTION workflow_events_logged() RETURNS trigger LANGUAGE plpgsql AS $$
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
                'failed_step_id', CASE WHEN failure->>'role' = 'job' THEN rebound_workflow_step_id(j.workflow_step) ELSE failure->>'role' END,
                'failed_step_type', j.type, 'failed_job_id', failure->'job_id',
                'error', jsonb_build_object('code', failure->>'code', 'message', failure->>'message'))
        FROM (SELECT NULL) AS one LEFT JOIN jobs j ON j.id = (failure->>'job_id')::uuid;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER workflows_logged AFTER UPDATE OF state, started_at ON workflows FOR EACH ROW EXECUTE FUNCTION workflow_events_logged();

-- What moving a workflow on needs of a job whose state changed.
CREATE TYPE rebound_workflow_move AS (
    id uuid, state job_state, attempt integer, workflow_id uuid, workflow_step integer, last_error jsonb,
    type text, started_at timestamptz, completed_at timestamptz
);

CREATE FUNCTION rebound_workflow_job_moved(j rebound_workflow_move, old_state job_state) RETURNS void LANGUAGE plpgsql AS $$
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
    -- A callback that does not apply is cancelled unrun: that is no failure.
    IF NOT (j.state = 'completed' OR failed) OR (j.workflow_step < 0 AND old_state = 'pending') THEN
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
            'step_id', rebound_workflow_step_id(j.workflow_step),
            'step_type', j.type, 'job_id', j.id,
            'duration_ms', COALESCE((EXTRACT(EPOCH FROM (j.completed_at - j.started_at)) * 1000)::bigint, 0),
            'steps_remaining', CASE WHEN j.workflow_step < 0 THEN GREATEST(w.callbacks_running - 1, 0)
                                    ELSE GREATEST(w.job_count - w.completed_count - w.failed_count - 1, 0) END));
    END IF;
    IF failed THEN
        error := jsonb_build_object(
            'job_id', j.id, 'attempt', j.attempt,
            'role', rebound_workflow_role(j.workflow_step),
            'code', CASE WHEN j.state = 'cancelled' THEN 'cancelled' ELSE COALESCE(j.last_error->>'type', 'failed') END,
            'message', CASE WHEN j.state = 'cancelled' THEN 'the job was cancelled' ELSE COALESCE(j.last_error->>'message', '') END);
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

-- One statement's jobs whose state changed, workflow by workflow in id order: every statement
-- takes the workflows' row locks in the same order, so two completion batches finishing jobs
-- of the same two workflows never deadlock. Statements that touch no workflow's job (every
-- claim and completion of ordinary jobs) stop at the first test, one scan of their rows.
CREATE FUNCTION rebound_workflows_moved() RETURNS trigger LANGUAGE plpgsql AS $$
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
        ORDER BY n.workflow_id, n.workflow_step
    LOOP
        PERFORM rebound_workflow_job_moved(r.j, r.old_state);
    END LOOP;
    RETURN NULL;
END $$;

CREATE TRIGGER jobs_workflows_moved AFTER UPDATE ON jobs
    REFERENCING OLD TABLE AS moved_old NEW TABLE AS moved_new
    FOR EACH STATEMENT EXECUTE FUNCTION rebound_workflows_moved();

-- A job deleted before it finished (a queue purged, say) can never let its workflow complete:
-- the workflow fails, naming it, and its waiting jobs are cancelled. (Row triggers run after
-- the statement's rows are gone, so a purge of every job of the workflow leaves none.)
CREATE FUNCTION rebound_workflow_job_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
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

CREATE TRIGGER jobs_workflow_deleted AFTER DELETE ON jobs FOR EACH ROW
    WHEN (OLD.workflow_id IS NOT NULL AND OLD.state NOT IN ('completed', 'discarded', 'cancelled'))
    EXECUTE FUNCTION rebound_workflow_job_deleted();

-- Workflows go with everything else when `jobs` is emptied (tests, an operator's reset).
CREATE FUNCTION workflows_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM workflows;
    DELETE FROM workflow_events;
    RETURN NULL;
END $$;
CREATE TRIGGER jobs_truncate_workflows AFTER TRUNCATE ON jobs
    FOR EACH STATEMENT EXECUTE FUNCTION workflows_truncated();
