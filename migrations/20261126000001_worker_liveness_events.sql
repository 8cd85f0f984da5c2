-- OJS `worker.heartbeat` and `worker.quiet` events, beside `worker.started` / `worker.stopped`.
--
-- A heartbeat event is written by the heartbeat statement itself (Rebound's worker beat and
-- the OJS API's `POST /workers/heartbeat`), as `job.heartbeat` events are: a lost beat leaves
-- none, a committed one always has one, and a registration (which also stamps
-- `last_heartbeat_at`) is not mistaken for one.
--
-- `worker.quiet` is the row's status entering `quiet` (SIGTSTP or an operator's request, heard
-- at a heartbeat: the worker claims nothing more and its running jobs finish) or `stopping`
-- (draining after SIGTERM) from anything else: a trigger, so every way a status is written is
-- covered. Going from quiet to stopping is still one quiet spell, so no second event.
ALTER TABLE workers DROP CONSTRAINT workers_status_check;
ALTER TABLE workers ADD CONSTRAINT workers_status_check CHECK (status IN ('ready', 'degraded', 'quiet', 'stopping'));

ALTER TABLE worker_events DROP CONSTRAINT worker_events_type_check;
ALTER TABLE worker_events ADD CONSTRAINT worker_events_type_check
    CHECK (type IN ('worker.started', 'worker.stopped', 'worker.heartbeat', 'worker.quiet'));

CREATE FUNCTION worker_events_quiet() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO worker_events (worker_id, type, data)
    VALUES (NEW.id, 'worker.quiet', jsonb_build_object('worker_id', NEW.id, 'active_jobs', NEW.running,
            'reason', CASE WHEN NEW.status = 'stopping' THEN 'shutdown' ELSE 'quiet' END));
    RETURN NULL;
END $$;

CREATE TRIGGER workers_quiet AFTER UPDATE OF status ON workers FOR EACH ROW
    WHEN (NEW.status IN ('quiet', 'stopping') AND OLD.status NOT IN ('quiet', 'stopping'))
    EXECUTE FUNCTION worker_events_quiet();
