-- OJS `job.heartbeat` (a Level 1 MUST): every extension of a job's visibility timeout, the
-- worker's own heartbeats and the HTTP API's alike. A heartbeat is not a transition (the job
-- stays active), so it has a log of its own, shaped like `job_transitions`: one row per
-- statement, queue and holder, naming the jobs, the attempt each was on and the deadline each
-- got (a heartbeat may carry its own visibility timeout, so deadlines differ within a row).
-- A worker beats every few seconds for all it holds, so rows are few and arrays long.
CREATE TABLE job_heartbeats (
    id            bigserial PRIMARY KEY,
    at            timestamptz NOT NULL DEFAULT now(),
    queue         text NOT NULL,
    worker_id     text,
    job_ids       uuid[] NOT NULL,
    attempts      int[] NOT NULL,
    visible_until timestamptz[] NOT NULL
);
-- Random UUIDs do not compress (see job_transitions).
ALTER TABLE job_heartbeats ALTER COLUMN job_ids SET STORAGE EXTERNAL;
-- Events over every queue read by time; a queue's, or one job's (within its queue, from its
-- creation), by queue and time. The pruner ages rows out by time.
CREATE INDEX job_heartbeats_at ON job_heartbeats (at);
CREATE INDEX job_heartbeats_queue_at ON job_heartbeats (queue, at);

CREATE OR REPLACE FUNCTION job_counts_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM job_count_deltas;
    DELETE FROM job_counts;
    DELETE FROM job_transitions;
    DELETE FROM job_heartbeats;
    RETURN NULL;
END $$;
