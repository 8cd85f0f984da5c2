-- Review mends of graphs and nesting.
--
-- Lock order. A nested workflow's end locks it, then the job standing for it, then its parent;
-- cancelling or deleting went from the parent down, and the two could deadlock. Every finish of
-- a nested workflow's job now locks the workflows it is nested in first, outermost first, as
-- the cancels and deletes that start at the top do.
CREATE FUNCTION rebound_workflow_lock_ancestors(wf uuid) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1
    FROM workflows o
    JOIN (WITH RECURSIVE up(id, depth) AS (
              SELECT parent_id, 1 FROM workflows WHERE id = wf AND parent_id IS NOT NULL
              UNION ALL
              SELECT p.parent_id, up.depth + 1 FROM workflows p JOIN up ON p.id = up.id WHERE p.parent_id IS NOT NULL
          ) SELECT id, depth FROM up) a ON a.id = o.id
    ORDER BY a.depth DESC
    FOR UPDATE OF o;
END $$;

-- One statement's jobs whose state changed, workflow by workflow in id order (see the
-- workflows migration); a finishing job's outer workflows are locked before its own. A claim
-- locks none: it only stamps `started_at` where it is still empty.
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
        ORDER BY n.workflow_id, n.workflow_step
    LOOP
        IF (r.j).state <> 'active' THEN
            PERFORM rebound_workflow_lock_ancestors((r.j).workflow_id);
        END IF;
        PERFORM rebound_workflow_job_moved(r.j, r.old_state);
    END LOOP;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION rebound_workflow_job_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM rebound_workflow_lock_ancestors(OLD.workflow_id);
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

-- A graph step that failed for good and was re-driven stays its graph's failure: before, its
-- completion took its error out while the steps it had skipped stayed skipped, so the graph
-- could end `failed` naming no failure.
CREATE OR REPLACE FUNCTION rebound_workflow_graph_moved(w workflows, j rebound_workflow_move, failed boolean, error jsonb) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    skipped integer := 0;
    completed integer;
    failures integer;
    done boolean;
    ready integer;
BEGIN
    -- Failed for good and then re-driven by hand (a dead letter retried): counted already, and
    -- it stays counted as the failure its dependents were skipped for; a graph that failed
    -- stays failed, as a chain does.
    IF w.errors @> jsonb_build_array(jsonb_build_object('job_id', j.id)) THEN
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
