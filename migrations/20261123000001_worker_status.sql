-- A worker's readiness as it last reported it, so operators can see a worker that is up but
-- cannot do its work: `ready`; `degraded` (claims or result writes are failing, typically
-- while the database is unreachable: status_detail says which); `stopping` (draining after
-- SIGTERM). The row can only say so once the database is reachable again; until then the
-- worker's log shows each wait and the next try.
ALTER TABLE workers
    ADD COLUMN status text NOT NULL DEFAULT 'ready' CHECK (status IN ('ready', 'degraded', 'stopping')),
    ADD COLUMN status_detail text,
    ADD COLUMN status_since timestamptz NOT NULL DEFAULT now();
UPDATE workers SET status = 'stopping' WHERE stopping;
