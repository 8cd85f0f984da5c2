-- Events asked for by type, newest first: the workflow and cron logs were read through their
-- time index alone, filtering by type, so a type that is rare or absent walked the whole log
-- (with 3 000 000 workflow events, `types=workflow.failed&limit=10` took 0.4–1.1 s, and with
-- 2 500 000 cron runs, `types=cron.skipped` 0.3–0.5 s). Keyed by type, then time, each is a
-- walk of its own type's newest entries (3–9 ms measured). These logs take one row per
-- workflow step or cron tick, never a row per ordinary job: the hot path does not write them.
CREATE INDEX workflow_events_type_at ON workflow_events (type, at);
CREATE INDEX cron_runs_outcome_fired ON cron_runs (outcome, fired_at);
