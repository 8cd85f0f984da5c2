-- OJS `worker.started` and `worker.stopped` events: a worker's row appearing (registration,
-- by Rebound's worker at start or an OJS client's first fetch or heartbeat) and going away.
-- Triggers, so every way a row goes is logged: a worker deregistering as it stops, an
-- operator deregistering a stale one, the pruner removing one silent for a day. Which of
-- these it was is read off the row: one removed while its heartbeat was fresh (the last
-- minute) stopped cleanly (`shutdown`), any other was lost (`heartbeat_timeout`).
CREATE TABLE worker_events (
    id         bigserial PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT now(),
    worker_id  text NOT NULL,
    type       text NOT NULL CHECK (type IN ('worker.started', 'worker.stopped')),
    data       jsonb NOT NULL
);
CREATE INDEX worker_events_at ON worker_events (at);

CREATE FUNCTION worker_events_logged() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO worker_events (worker_id, type, data)
        VALUES (NEW.id, 'worker.started', jsonb_build_object('worker_id', NEW.id, 'queues', to_jsonb(NEW.queues),
                'concurrency', NEW.concurrency, 'host', NEW.host, 'pid', NEW.pid, 'version', NEW.version));
        RETURN NEW;
    END IF;
    INSERT INTO worker_events (worker_id, type, data)
    VALUES (OLD.id, 'worker.stopped', jsonb_build_object('worker_id', OLD.id,
            'reason', CASE WHEN OLD.last_heartbeat_at > now() - interval '1 minute' THEN 'shutdown' ELSE 'heartbeat_timeout' END,
            'uptime_ms', (EXTRACT(EPOCH FROM (now() - OLD.started_at)) * 1000)::bigint,
            'active_jobs', OLD.running));
    RETURN OLD;
END $$;

CREATE TRIGGER workers_logged AFTER INSERT OR DELETE ON workers FOR EACH ROW EXECUTE FUNCTION worker_events_logged();
