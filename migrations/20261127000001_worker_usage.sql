-- What each worker process uses, as its latest heartbeat reported it: resident memory in MiB
-- and CPU in percent of one core since its previous beat (OJS `worker.heartbeat`'s optional
-- `memory_mb` and `cpu_percent`). NULL when the worker does not say (an OJS client that
-- sends neither, or a platform where the worker cannot read them).
ALTER TABLE workers ADD COLUMN memory_mb float8, ADD COLUMN cpu_percent float8;
